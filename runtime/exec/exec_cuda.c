/* Entry point of the `cuda` executor. Without CUDA in the build it explains that; with CUDA it
 * reports a missing driver or device cleanly (as on machines without a GPU). */
#include "common/error.h"
#include "ferry/exec.h"

#ifdef FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>

ferry_status ferry_exec_create_cuda(ferry_exec **out, const struct ferry_exec_config *config) {
  (void)config;
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "exec_create_cuda: out is NULL");
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return ferry__fail(FERRY_ERR_NO_DEVICE, "no CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
  return ferry__fail(FERRY_ERR_UNSUPPORTED, "the cuda executor is not implemented in this build yet");
}
#else
ferry_status ferry_exec_create_cuda(ferry_exec **out, const struct ferry_exec_config *config) {
  (void)out;
  (void)config;
  return ferry__fail(FERRY_ERR_UNSUPPORTED, "this build of ferry has no CUDA support (configure with FERRY_CUDA=ON)");
}
#endif /* FERRY_HAVE_CUDA */
