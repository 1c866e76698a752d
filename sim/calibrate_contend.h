/* The contention probe of `ferry calibrate --probe` (sim/calibrate_contend.c). Internal to sim/. */
#ifndef FERRY_SIM_CALIBRATE_CONTEND_H
#define FERRY_SIM_CALIBRATE_CONTEND_H

#include "ferry/exec.h"

/* Time kernel k on q_compute alone and beside a copy of copy_bytes from host to dev issued first
 * on q_copy, in turn; *contention receives the median of (its time beside the copy - its time
 * alone just before and after) / the time the copy overlapped it. Replaces ex's activity sink
 * (the caller installs its own again). ev is unused (the queues are drained). */
ferry_status ferry__calibrate_probe_contention(ferry_exec *ex, int32_t q_compute, int32_t q_copy, ferry_event *ev,
                                               const struct ferry_kernel *k, ferry_buf *host, ferry_buf *dev,
                                               uint64_t copy_bytes, double *contention);

#endif /* FERRY_SIM_CALIBRATE_CONTEND_H */
