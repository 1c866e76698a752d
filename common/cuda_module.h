/* ferry's CUDA module (ferry_cuda.so: the cuda executor and the CUPTI collector, linked with
 * cudart, cuBLAS and CUPTI), loaded the first time something asks for it, so that a process
 * that never drives a GPU (`ferry --help`, `ferry sim`) neither loads nor needs those
 * libraries. ferry's objects are built with hidden visibility, so the module cannot resolve
 * ferry's internal functions in the process that loads it: it is handed them instead, in
 * tables of function pointers -- common's here, bound when the module is loaded, the
 * executor's in runtime/exec/exec_cuda_api.h -- and links no symbol of ferry's. */
#ifndef FERRY_COMMON_CUDA_MODULE_H
#define FERRY_COMMON_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/log.h"
#include "ferry/dtype.h"

#define FERRY_CUDA_COMMON_HOST_VERSION 1
#define FERRY_CUDA_MODULE_BIND_SYMBOL "ferry__cuda_module_bind"

/* common's functions the module calls (its own ferry__fail, ferry__calloc, ... forward here, so
 * errors, the log threshold and allocation fault injection are the loading process's). */
struct ferry__cuda_common_host {
  int version; /* FERRY_CUDA_COMMON_HOST_VERSION */
  ferry_status (*fail)(ferry_status status, const char *fmt, ...);
  ferry_status (*err_set)(struct ferry_err *err, ferry_status status, const char *fmt, ...);
  void (*log)(enum ferry_log_level level, const char *fmt, ...);
  void *(*malloc)(size_t size);
  void *(*calloc)(size_t n, size_t size);
  void *(*aligned_alloc)(size_t alignment, size_t size);
  char *(*strdup)(const char *s);
  void (*free)(void *ptr);
  int64_t (*mono_ns)(void);
  void (*io_sleep_ns)(int64_t ns);
  const char *(*format_bytes)(uint64_t bytes, char *buf, size_t len);
  const char *(*dtype_name)(enum ferry_dtype dtype);
};

/* The module's entry called once it is loaded: it keeps `host` (static) for its life. */
typedef int (*ferry__cuda_module_bind_fn)(const struct ferry__cuda_common_host *host);

/* The address of `symbol` in the module, loading it on first use (thread-safe); NULL when this
 * build has no module, it is not found, or it cannot be loaded, with a message saying which
 * and what `what` (e.g. "the cuda executor") needs: FERRY_ERR_UNSUPPORTED in *status. */
void *ferry__cuda_module_sym(const char *symbol, const char *what, ferry_status *status);

/* Where the module was loaded from, or NULL when it is not loaded. */
const char *ferry__cuda_module_path(void);

#endif /* FERRY_COMMON_CUDA_MODULE_H */
