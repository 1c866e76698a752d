/* The cuda executor's public functions, in every build: they load ferry's CUDA module on
 * first use (common/cuda_module.c), hand it the executor's functions it calls and call into
 * it, so that CUDA's libraries are loaded only by a process that asks for a GPU. Without the
 * module (a build without CUDA, or the module or the CUDA libraries missing) they fail with
 * FERRY_ERR_UNSUPPORTED saying what is missing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common/cuda_module.h"
#include "common/error.h"
#include "exec_cuda_api.h"
#include "host_kernels.h"
#include "nvtx.h"
#include "runtime/quant/quant_impl.h"

static const struct ferry__cuda_exec_host exec_host = {
    .exec_init = ferry__exec_init,
    .exec_fini = ferry__exec_fini,
    .op_done = ferry__exec_op_done,
    .op_failed = ferry__exec_op_failed,
    .fault = ferry__exec_fault,
    .fault_fail = ferry__exec_fault_fail,
    .tier_usage = ferry_exec_tier_usage,
    .kernel_kind_name = ferry_kernel_kind_name,
    .kernel_uses_ints = ferry__kernel_uses_ints,
    .kernel_uses_ints2 = ferry__kernel_uses_ints2,
    .host_kernel_run = ferry__host_kernel_run,
    .host_scratch_free = ferry__host_scratch_free,
    .nvtx_push = ferry__nvtx_push,
    .nvtx_pop = ferry__nvtx_pop,
    .kv_format_group = ferry_kv_format_group,
    .quant_spec_check = ferry_quant_spec_check,
    .quant_bits = ferry__quant_bits,
    .nf4_levels = ferry__nf4_levels,
    .dynamic_map = ferry__dynamic_map,
    .store_errmsg = ferry_store_errmsg,
    .store_read_range = ferry_store_read_range,
};

static pthread_mutex_t bind_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(const struct ferry__cuda_exec_api *) bound; /* found, checked and bound */

static const struct ferry__cuda_exec_api *api(const char *what, ferry_status *st) {
  const struct ferry__cuda_exec_api *a = atomic_load(&bound);
  *st = FERRY_OK;
  if (a) return a;
  pthread_mutex_lock(&bind_mu);
  if (!(a = atomic_load(&bound)) && (a = ferry__cuda_module_sym(FERRY_CUDA_EXEC_API_SYMBOL, what, st))) {
    if (a->version != FERRY_CUDA_EXEC_API_VERSION) {
      *st = ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: ferry's CUDA module %s is version %d, this ferry needs %d", what,
                        ferry__cuda_module_path(), a->version, FERRY_CUDA_EXEC_API_VERSION);
      a = NULL;
    } else {
      a->bind(&exec_host);
      atomic_store(&bound, a);
    }
  }
  pthread_mutex_unlock(&bind_mu);
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

/* The registry's entry (runtime/backends/registry.c lists it), in builds with and without CUDA:
 * opening it loads the module; without one, it says why it cannot be opened. */
static int cuda_available(char *why, size_t len) {
  if (ferry_exec_cuda_memory(NULL, NULL) == FERRY_OK) return 1;
  snprintf(why, len, "%s", ferry_last_error());
  return 0;
}

static ferry_status cuda_open(ferry_exec **out, const struct ferry_exec_params *p) {
  return ferry_exec_create_cuda(out, p ? &p->config : NULL);
}

const struct ferry_exec_info ferry__exec_info_cuda = {
    .version = FERRY_EXEC_INFO_VERSION,
    .name = "cuda",
    .description = "real work on CUDA device 0 (streams, kernels, cuBLAS)",
    .caps = FERRY_EXEC_CAP_DATA | FERRY_EXEC_CAP_MEMORY | FERRY_EXEC_CAP_PROFILE,
    .available = cuda_available,
    .open = cuda_open,
    .memory = ferry_exec_cuda_memory,
};
