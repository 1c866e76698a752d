/**
 * @file provenance.h
 * @brief What made a run: the build (git describe embedded at build time, compiler, build type,
 *        BLAS, CUDA toolkit), the machine (CPU model and cores, memory, kernel, OS) and, for a
 *        run on a GPU, the device, its driver and the CUDA runtime. `ferry run` and `ferry sim`
 *        store every item as a META_DATA_EXPORT row of the run (docs/schema.md, provenance) and
 *        the git description in runs.git_rev; `ferry db show` and the report print them.
 */
#ifndef FERRY_PROVENANCE_H
#define FERRY_PROVENANCE_H

#include <stddef.h>

#include "ferry/api.h"
#include "ferry/exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most items ferry_provenance_collect() writes. */
#define FERRY_PROVENANCE_MAX 24

/** One fact: a name (BUILD_*, MACHINE_*, GPU_*, CUDA_*) and its value. */
struct ferry_provenance_item {
  char name[32];   /**< e.g. "MACHINE_CPU_MODEL" */
  char value[224]; /**< e.g. "AMD EPYC 7763 64-Core Processor"; never empty */
};

/** The facts known about a run's build and machine. */
struct ferry_provenance {
  size_t count;                                              /**< items filled */
  struct ferry_provenance_item items[FERRY_PROVENANCE_MAX]; /**< in a fixed order */
};

/**
 * @brief Collect the build's and this machine's facts, and the GPU's when the executor drives
 *        one (the cuda executor). Facts that cannot be read are left out; never fails.
 * @param ex the run's executor, or NULL for the build and the machine only.
 * @param out filled.
 */
FERRY_API void ferry_provenance_collect(ferry_exec *ex, struct ferry_provenance *out);

/**
 * @brief The value of a collected item.
 * @param p collected facts.
 * @param name item name.
 * @return borrowed value, or NULL when absent.
 */
FERRY_API const char *ferry_provenance_value(const struct ferry_provenance *p, const char *name);

/**
 * @brief `git describe --always --dirty --tags` of the source tree this library was built
 *        from, read at build time.
 * @return static string; "" when built outside a git checkout.
 */
FERRY_API const char *ferry_build_git_describe(void);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_PROVENANCE_H */
