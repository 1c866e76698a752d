/* NVTX ranges in the domain "ferry", shared by every executor that runs in real time (the
 * engine's phases through ferry_exec_range_begin/end, the cuda executor's kernels). */
#ifndef FERRY_EXEC_NVTX_H
#define FERRY_EXEC_NVTX_H

#include <stdint.h>

/* Open a range now on this thread; any thread may end it. Returns its id, 0 when NVTX is not
 * built in. The message is the name with the step, layer and expert that apply. */
uint64_t ferry__nvtx_start(const char *name, int32_t step, int32_t layer, int32_t expert);
void ferry__nvtx_end(uint64_t id);

/* A nested range on this thread (a kernel launch and what it calls). */
void ferry__nvtx_push(const char *name);
void ferry__nvtx_pop(void);

#endif
