/* The kernel cases every executor is checked on: one or more per kernel kind and variant (42),
 * each a kernel with shapes, typed random inputs and the region of its output. Shared by the
 * conformance suite (tests/test_exec.c, every registered executor) and the GPU check
 * (bench/gpu_check.c, cuda against host), so both run the same table. */
#ifndef FERRY_TESTS_KERNEL_CASES_H
#define FERRY_TESTS_KERNEL_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/exec.h"
#include "ferry/quant.h"

struct kc_region {
  uint64_t off, n;
  enum ferry_dtype dt;
};

struct kcase {
  const char *name;
  struct ferry_kernel k; /* refs carry offsets; buf is set to the device buffer when non-NULL */
  uint64_t bytes;
  struct kc_region fill[8]; /* typed random contents (everything else: fp32 in [-1, 1]) */
  int n_fill;
  uint64_t out_off, out_floats; /* compared as floats */
  enum ferry_dtype out_dt;       /* the output's elements: FERRY_DTYPE_F32 (0) or FERRY_DTYPE_F16 */
  uint64_t ids_off, ids_n;      /* compared exactly as int32 (router ids) */
  double tol;
  int32_t ints[64], ints2[64];
  int quant; /* DEQUANTIZE: a packed weight of qspec at blob_off, quantized from random floats */
  struct ferry_qspec qspec;
  struct ferry_qlayout qlayout;
  uint64_t blob_off;
};

/* The table (built at the first call; static): *n receives its length. */
const struct kcase *kc_cases(size_t *n);

/* Run one case on an executor, through copies as an engine would: fill a host buffer, copy it
 * into a device buffer of device_bytes (c->bytes for the case; fewer: an undersized kernel),
 * compute, copy back, sync. *result receives the case's bytes as read back (owned, free();
 * zeros where the executor computes nothing). Returns the first failure, the compute's included. */
ferry_status kc_run(ferry_exec *ex, const struct kcase *c, uint64_t device_bytes, char **result);

/* The largest error of the case's output in b relative to a's largest magnitude; *ids_ok says
 * whether router ids agree exactly, *nonfinite whether b has a NaN or Inf where a has none. */
double kc_max_rel_error(const struct kcase *c, const char *a, const char *b, int *ids_ok, int *nonfinite);

#endif
