/* Real math for the host executor's kernels (OpenBLAS for matrix products, own code for the
 * rest), following the Hugging Face reference implementations of the families it computes. */
#ifndef FERRY_HOST_KERNELS_H
#define FERRY_HOST_KERNELS_H

#include <stddef.h>

#include "ferry/exec.h"

/* Per-queue temporary space: weight conversion panels and attention scores. It grows to the
 * largest need seen and is then reused, so steady-state decoding allocates nothing. */
struct ferry_host_scratch {
  float *buf;
  size_t floats;
};

void ferry__host_scratch_free(struct ferry_host_scratch *s);

/* Run one kernel on host memory. On failure writes a message into msg. */
ferry_status ferry__host_kernel_run(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg,
                                    size_t msg_len);

#endif
