/* The cuda executor's public functions, in every build: they load ferry's CUDA module on
 * first use (common/cuda_module.c) and call into it, so that CUDA's libraries are loaded only
 * by a process that asks for a GPU. Without the module (a build without CUDA, or the module or
 * the CUDA libraries missing) they fail with FERRY_ERR_UNSUPPORTED saying what is missing. */
#include "common/cuda_module.h"
#include "common/error.h"
#include "exec_cuda_api.h"

static const struct ferry__cuda_exec_api *api(const char *what, ferry_status *st) {
  const struct ferry__cuda_exec_api *a = ferry__cuda_module_sym(FERRY_CUDA_EXEC_API_SYMBOL, what, st);
  if (a && a->version != FERRY_CUDA_EXEC_API_VERSION) {
    *st = ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: ferry's CUDA module %s is version %d, this ferry needs %d", what,
                      ferry__cuda_module_path(), a->version, FERRY_CUDA_EXEC_API_VERSION);
    return NULL;
  }
  return a;
}

ferry_status ferry_exec_create_cuda(ferry_exec **out, const struct ferry_exec_config *config) {
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "exec_create_cuda: out is NULL");
  *out = NULL;
  ferry_status st;
  const struct ferry__cuda_exec_api *a = api("the cuda executor", &st);
  return a ? a->create(out, config) : st;
}

ferry_status ferry_exec_cuda_memory(uint64_t *free_bytes, uint64_t *total_bytes) {
  ferry_status st;
  const struct ferry__cuda_exec_api *a = api("the cuda executor", &st);
  return a ? a->memory(free_bytes, total_bytes) : st;
}

void ferry__exec_cuda_versions(int *driver, int *runtime) {
  *driver = *runtime = 0;
  /* Asked only of a process with a cuda executor, which has loaded the module already; one
   * without it is not made to load CUDA for this. */
  if (!ferry__cuda_module_path()) return;
  ferry_status st;
  const struct ferry__cuda_exec_api *a = api("the cuda executor", &st);
  if (a) a->versions(driver, runtime);
}
