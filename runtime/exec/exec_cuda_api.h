/* What ferry's CUDA module (ferry_cuda.so) and the executor interface give each other: the
 * cuda executor's entry points, in a versioned table the module exports under one name, and
 * the executor's functions the module calls (ferry's objects hide them, so the module is handed
 * them: exec_cuda_load.c binds this table before the first call; common's functions come with
 * the module's loading, common/cuda_module.h). exec_cuda.c fills the first; exec_cuda_load.c,
 * built into ferry whether or not it has CUDA, fills the second and finds the first. */
#ifndef FERRY_EXEC_CUDA_API_H
#define FERRY_EXEC_CUDA_API_H

#include <stdint.h>

#include "exec_impl.h"
#include "ferry/exec.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/store.h"

#define FERRY_CUDA_EXEC_API_VERSION 3
#define FERRY_CUDA_EXEC_API_SYMBOL "ferry__cuda_exec_api"

struct ferry_host_scratch;

/* The executor's functions the module calls (its ferry__exec_init, ... forward here). */
struct ferry__cuda_exec_host {
  ferry_status (*exec_init)(struct ferry_exec *ex, const struct ferry_exec_backend *backend,
                            const struct ferry_exec_config *config);
  void (*exec_fini)(struct ferry_exec *ex);
  void (*op_done)(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op, int64_t start_ns, int64_t end_ns);
  void (*op_failed)(struct ferry_exec *ex, ferry_status status, const char *msg);
  struct ferry_fault (*fault)(const struct ferry_op *op);
  void (*fault_fail)(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op, uint64_t attempt);
  void (*tier_usage)(const ferry_exec *ex, enum ferry_tier tier, uint64_t *used, uint64_t *peak);
  const char *(*kernel_kind_name)(enum ferry_kernel_kind kind);
  int (*kernel_uses_ints)(const struct ferry_kernel *k);
  int (*kernel_uses_ints2)(const struct ferry_kernel *k);
  ferry_status (*host_kernel_run)(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg,
                                  size_t msg_len);
  void (*host_scratch_free)(struct ferry_host_scratch *s);
  void (*nvtx_push)(const char *name);
  void (*nvtx_pop)(void);
  int32_t (*kv_format_group)(enum ferry_kv_format format);
  ferry_status (*quant_spec_check)(const struct ferry_qspec *spec);
  int (*quant_bits)(enum ferry_qformat format);
  const float *nf4_levels;  /* [16] */
  const float *dynamic_map; /* [256] */
  const char *(*store_errmsg)(const ferry_store *store);
  ferry_status (*store_read_range)(ferry_store *store, uint32_t file, uint64_t offset, uint64_t len, void *buf,
                                   uint64_t buf_cap, unsigned flags, uint64_t *data_shift);
};

struct ferry__cuda_exec_api {
  int version; /* FERRY_CUDA_EXEC_API_VERSION */
  void (*bind)(const struct ferry__cuda_exec_host *host); /* before any other call; host is static */
  ferry_status (*create)(ferry_exec **out, const struct ferry_exec_config *config); /* ferry_exec_create_cuda() */
  ferry_status (*memory)(uint64_t *free_bytes, uint64_t *total_bytes);             /* ferry_exec_cuda_memory() */
  void (*versions)(int *driver, int *runtime); /* ferry__exec_cuda_versions(): CUDA's driver and runtime versions */
};

/* In the module: the table bound by exec_cuda_load.c (cuda_module_host.c forwards to it). */
extern const struct ferry__cuda_exec_host *ferry__cuda_exec_host;

#endif /* FERRY_EXEC_CUDA_API_H */
