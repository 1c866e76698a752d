/* ferry's CUDA module (ferry_cuda.so: the cuda executor and the CUPTI collector, linked with
 * cudart, cuBLAS and CUPTI), loaded the first time something asks for it, so that a process
 * that never drives a GPU (`ferry --help`, `ferry sim`) neither loads nor needs those
 * libraries. The module's symbols resolve ferry's own (errors, allocation, the executor
 * wrappers) in the process that loads it: programs linking ferry statically export them. */
#ifndef FERRY_COMMON_CUDA_MODULE_H
#define FERRY_COMMON_CUDA_MODULE_H

#include "ferry/status.h"

/* The address of `symbol` in the module, loading it on first use (thread-safe); NULL when this
 * build has no module, it is not found, or it cannot be loaded, with a message saying which
 * and what `what` (e.g. "the cuda executor") needs: FERRY_ERR_UNSUPPORTED in *status. */
void *ferry__cuda_module_sym(const char *symbol, const char *what, ferry_status *status);

/* Where the module was loaded from, or NULL when it is not loaded. */
const char *ferry__cuda_module_path(void);

#endif /* FERRY_COMMON_CUDA_MODULE_H */
