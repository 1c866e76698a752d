/* Finding and loading ferry's CUDA module (cuda_module.h). It is looked for where a build or
 * an install puts it: $FERRY_CUDA_MODULE, then next to the program or libferry.so that loads
 * it (and one folder up, for the tests/ and bench/ programs), then lib/ferry/ beside their
 * folder, then the folders this build was configured with. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/cuda_module.h"
#include "common/error.h"
#include "common/io.h"
#include "common/units.h"

#define MODULE_NAME "ferry_cuda.so"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *handle;
static char loaded_from[4096];
static char why_not[1536]; /* what went wrong, when handle is NULL */

#ifdef FERRY_CUDA_MODULE_BUILT
static const struct ferry__cuda_common_host common_host = {
    .version = FERRY_CUDA_COMMON_HOST_VERSION,
    .fail = ferry__fail,
    .err_set = ferry__err_set,
    .log = ferry__log,
    .malloc = ferry_malloc,
    .calloc = ferry__calloc,
    .aligned_alloc = ferry__aligned_alloc,
    .strdup = ferry__strdup,
    .free = ferry_free,
    .mono_ns = ferry__mono_ns,
    .io_sleep_ns = ferry__io_sleep_ns,
    .format_bytes = ferry__format_bytes,
    .dtype_name = ferry_dtype_name,
};

/* The folder of the object (program or libferry.so) this code is in. */
static int own_dir(char *out, size_t n) {
  Dl_info info;
  if (!dladdr((void *)&ferry__cuda_module_sym, &info) || !info.dli_fname || !strchr(info.dli_fname, '/')) {
    /* a program found through PATH: dladdr gives its name only */
    ssize_t len = readlink("/proc/self/exe", out, n - 1);
    if (len <= 0) return 0;
    out[len] = '\0';
  } else if (!realpath(info.dli_fname, out)) {
    snprintf(out, n, "%s", info.dli_fname);
  }
  char *slash = strrchr(out, '/');
  if (!slash) return 0;
  *slash = '\0';
  return 1;
}
#endif /* FERRY_CUDA_MODULE_BUILT */

static void load(void) {
#ifdef FERRY_CUDA_MODULE_BUILT
  char dir[2048], tried[1024] = "", path[4096];
  const char *candidates[8];
  char storage[8][2200];
  int n = 0;
  const char *env = getenv("FERRY_CUDA_MODULE");
  if (env && *env) candidates[n++] = env;
  if (own_dir(dir, sizeof dir)) {
    snprintf(storage[n], sizeof storage[n], "%s/" MODULE_NAME, dir);
    candidates[n] = storage[n], n++;
    snprintf(storage[n], sizeof storage[n], "%s/../" MODULE_NAME, dir);
    candidates[n] = storage[n], n++;
    snprintf(storage[n], sizeof storage[n], "%s/../lib/ferry/" MODULE_NAME, dir);
    candidates[n] = storage[n], n++;
  }
  candidates[n++] = FERRY_CUDA_MODULE_BUILD_DIR "/" MODULE_NAME;
  candidates[n++] = FERRY_CUDA_MODULE_INSTALL_DIR "/" MODULE_NAME;
  for (int i = 0; i < n; i++) {
    if (access(candidates[i], F_OK) != 0) {
      size_t len = strlen(tried);
      snprintf(tried + len, sizeof tried - len, "%s%s", len ? ", " : "", candidates[i]);
      if (i == 0 && env && *env) break; /* an explicit path is the only one tried */
      continue;
    }
    /* local: the CUDA libraries it brings stay its own; its undefined symbols are ferry's */
    handle = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char *e = dlerror();
      snprintf(why_not, sizeof why_not,
               "ferry's CUDA module %s could not be loaded: %s (it needs the CUDA runtime, cuBLAS and CUPTI "
               "libraries it was built with on the library path, e.g. LD_LIBRARY_PATH=/usr/local/cuda/lib64)",
               candidates[i], e ? e : "unknown error");
      return;
    }
    snprintf(path, sizeof path, "%s", candidates[i]);
    ferry__cuda_module_bind_fn bind = (ferry__cuda_module_bind_fn)dlsym(handle, FERRY_CUDA_MODULE_BIND_SYMBOL);
    if (!bind || !bind(&common_host)) {
      snprintf(why_not, sizeof why_not, "%.1024s is not ferry's CUDA module of this version (%s)", path,
               bind ? "it refused common's table" : "no " FERRY_CUDA_MODULE_BIND_SYMBOL);
      dlclose(handle);
      handle = NULL;
      return;
    }
    if (!realpath(candidates[i], loaded_from)) snprintf(loaded_from, sizeof loaded_from, "%s", path);
    return;
  }
  snprintf(why_not, sizeof why_not,
           "ferry's CUDA module " MODULE_NAME " was not found (looked for %s); this build makes it (target "
           "ferry_cuda): build it, or point FERRY_CUDA_MODULE at it",
           tried);
#else
  snprintf(why_not, sizeof why_not,
           "this build of ferry has no CUDA support: it was configured without CUDA (FERRY_CUDA=OFF, or no CUDA "
           "toolkit found), so there is no CUDA module (configure with FERRY_CUDA=ON)");
#endif
}

void *ferry__cuda_module_sym(const char *symbol, const char *what, ferry_status *status) {
  pthread_once(&once, load);
  *status = FERRY_OK;
  if (!handle) {
    *status = ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: %s", what, why_not);
    return NULL;
  }
  void *sym = dlsym(handle, symbol);
  if (!sym)
    *status = ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: ferry's CUDA module %s has no %s (from another ferry version?)",
                          what, loaded_from, symbol);
  return sym;
}

const char *ferry__cuda_module_path(void) { return handle ? loaded_from : NULL; }
