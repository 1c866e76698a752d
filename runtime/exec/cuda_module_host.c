/* In ferry's CUDA module only: ferry's functions that the cuda executor, its kernels' launcher
 * and the CUPTI collector call, forwarded to the process that loaded the module through the
 * tables it binds (common/cuda_module.h, exec_cuda_api.h). ferry's objects are built with
 * hidden visibility, so the module could not resolve them by name; and forwarding, rather than
 * linking copies, keeps one error message per thread, one log threshold and one allocation
 * hook. The module exports only its three entry points (ferry_cuda.map). */
#include <stdarg.h>
#include <stdio.h>

#include "common/alloc.h"
#include "common/cuda_module.h"
#include "common/error.h"
#include "common/io.h"
#include "common/log.h"
#include "common/units.h"
#include "exec_cuda_api.h"
#include "host_kernels.h"
#include "nvtx.h"
#include "runtime/quant/quant_impl.h"

static const struct ferry__cuda_common_host *common;
#define X ferry__cuda_exec_host

__attribute__((visibility("default"))) int ferry__cuda_module_bind(const struct ferry__cuda_common_host *host) {
  if (!host || host->version != FERRY_CUDA_COMMON_HOST_VERSION) return 0;
  common = host;
  return 1;
}

/* The formatting functions format here and pass the text on. */
ferry_status ferry__fail(ferry_status status, const char *fmt, ...) {
  char msg[FERRY_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return common->fail(status, "%s", msg);
}

ferry_status ferry__err_set(struct ferry_err *err, ferry_status status, const char *fmt, ...) {
  char msg[FERRY_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return common->err_set(err, status, "%s", msg);
}

void ferry__log(enum ferry_log_level level, const char *fmt, ...) {
  char msg[FERRY_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  common->log(level, "%s", msg);
}

void *ferry_malloc(size_t size) { return common->malloc(size); }
void *ferry__calloc(size_t n, size_t size) { return common->calloc(n, size); }
void *ferry__aligned_alloc(size_t alignment, size_t size) { return common->aligned_alloc(alignment, size); }
char *ferry__strdup(const char *s) { return common->strdup(s); }
void ferry_free(void *ptr) { common->free(ptr); }
int64_t ferry__mono_ns(void) { return common->mono_ns(); }
void ferry__io_sleep_ns(int64_t ns) { common->io_sleep_ns(ns); }
const char *ferry__format_bytes(uint64_t bytes, char *buf, size_t len) { return common->format_bytes(bytes, buf, len); }
const char *ferry_dtype_name(enum ferry_dtype dtype) { return common->dtype_name(dtype); }

ferry_status ferry__exec_init(struct ferry_exec *ex, const struct ferry_exec_backend *backend,
                              const struct ferry_exec_config *config) {
  return X->exec_init(ex, backend, config);
}
void ferry__exec_fini(struct ferry_exec *ex) { X->exec_fini(ex); }
void ferry__exec_op_done(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op, int64_t start_ns,
                         int64_t end_ns) {
  X->op_done(ex, queue, op, start_ns, end_ns);
}
void ferry__exec_op_failed(struct ferry_exec *ex, ferry_status status, const char *msg) {
  X->op_failed(ex, status, msg);
}
struct ferry_fault ferry__exec_fault(const struct ferry_op *op) { return X->fault(op); }
void ferry__exec_fault_fail(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op, uint64_t attempt) {
  X->fault_fail(ex, queue, op, attempt);
}
void ferry_exec_tier_usage(const ferry_exec *ex, enum ferry_tier tier, uint64_t *used, uint64_t *peak) {
  X->tier_usage(ex, tier, used, peak);
}
const char *ferry_kernel_kind_name(enum ferry_kernel_kind kind) { return X->kernel_kind_name(kind); }
int ferry__kernel_uses_ints(const struct ferry_kernel *k) { return X->kernel_uses_ints(k); }
int ferry__kernel_uses_ints2(const struct ferry_kernel *k) { return X->kernel_uses_ints2(k); }
ferry_status ferry__host_kernel_run(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg,
                                    size_t msg_len) {
  return X->host_kernel_run(k, s, msg, msg_len);
}
void ferry__host_scratch_free(struct ferry_host_scratch *s) { X->host_scratch_free(s); }
void ferry__nvtx_push(const char *name) { X->nvtx_push(name); }
void ferry__nvtx_pop(void) { X->nvtx_pop(); }
int32_t ferry_kv_format_group(enum ferry_kv_format format) { return X->kv_format_group(format); }
ferry_status ferry_quant_spec_check(const struct ferry_qspec *spec) { return X->quant_spec_check(spec); }
int ferry__quant_bits(enum ferry_qformat format) { return X->quant_bits(format); }
const char *ferry_store_errmsg(const ferry_store *store) { return X->store_errmsg(store); }
ferry_status ferry_store_read_range(ferry_store *store, uint32_t file, uint64_t offset, uint64_t len, void *buf,
                                    uint64_t buf_cap, unsigned flags, uint64_t *data_shift) {
  return X->store_read_range(store, file, offset, len, buf, buf_cap, flags, data_shift);
}
