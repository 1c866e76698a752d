/* What ferry's CUDA module (ferry_cuda.so) offers the executor interface: the cuda executor's
 * entry points, in a versioned table the module exports under one name. exec_cuda.c fills it;
 * exec_cuda_load.c, built into ferry whether or not it has CUDA, finds it. */
#ifndef FERRY_EXEC_CUDA_API_H
#define FERRY_EXEC_CUDA_API_H

#include <stdint.h>

#include "ferry/exec.h"

#define FERRY_CUDA_EXEC_API_VERSION 2
#define FERRY_CUDA_EXEC_API_SYMBOL "ferry__cuda_exec_api"

struct ferry__cuda_exec_api {
  int version; /* FERRY_CUDA_EXEC_API_VERSION */
  ferry_status (*create)(ferry_exec **out, const struct ferry_exec_config *config); /* ferry_exec_create_cuda() */
  ferry_status (*memory)(uint64_t *free_bytes, uint64_t *total_bytes);             /* ferry_exec_cuda_memory() */
  void (*versions)(int *driver, int *runtime); /* ferry__exec_cuda_versions(): CUDA's driver and runtime versions */
};

extern const struct ferry__cuda_exec_api ferry__cuda_exec_api;

#endif /* FERRY_EXEC_CUDA_API_H */
