/* Dequantization throughput per weight format: GB/s of fp32 output produced by
 * ferry_quant_dequantize_rows() over a 4096 x 4096 matrix (best of several repetitions, one
 * thread), beside single-threaded memcpy of the same output size, the ceiling for a kernel that
 * writes every output byte once. Usage: dequant [rows cols reps]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/rng.h"
#include "common/units.h"
#include "ferry/quant.h"

static double best_gbps(int64_t t_ns, size_t bytes) { return (double)bytes / (double)t_ns; }

int main(int argc, char **argv) {
  int64_t rows = argc > 2 ? atoll(argv[1]) : 4096, cols = argc > 2 ? atoll(argv[2]) : 4096;
  int reps = argc > 3 ? atoi(argv[3]) : 7;
  if (rows < 1 || cols < 1 || reps < 1) {
    fprintf(stderr, "usage: dequant [rows cols [reps]]\n");
    return 2;
  }
  const size_t n = (size_t)(rows * cols), out_bytes = n * sizeof(float);
  float *src = ferry__aligned_alloc(64, out_bytes), *dst = ferry__aligned_alloc(64, out_bytes);
  float *copy = ferry__aligned_alloc(64, out_bytes);
  if (!src || !dst || !copy) {
    fprintf(stderr, "dequant: out of memory for %zu-byte buffers\n", out_bytes);
    return 1;
  }
  struct ferry_rng r;
  ferry__rng_seed(&r, 1);
  for (size_t i = 0; i < n; i++) src[i] = (float)(ferry__rng_normal(&r) * 0.02);
  memset(dst, 0, out_bytes);
  memset(copy, 0, out_bytes);

  int64_t best = INT64_MAX;
  for (int k = 0; k < reps; k++) {
    int64_t t0 = ferry__mono_ns();
    memcpy(copy, src, out_bytes);
    int64_t t = ferry__mono_ns() - t0;
    best = t < best ? t : best;
  }
  double memcpy_gbps = best_gbps(best, out_bytes);
  printf("dequantize [%lld, %lld] -> fp32 (%.1f MiB out), 1 thread, best of %d\n", (long long)rows,
         (long long)cols, (double)out_bytes / (1 << 20), reps);
  printf("%-10s %10s %8s %12s %9s %10s %9s\n", "format", "packed_MiB", "bits/w", "out_GB/s",
         "in_GB/s", "vs_memcpy", "rel_err");
  printf("%-10s %10.1f %8.2f %12.2f %9.2f %10s %9s\n", "memcpy", (double)out_bytes / (1 << 20), 32.0,
         memcpy_gbps, memcpy_gbps, "1.00", "-");

  const char *fmts[] = {"fp32", "fp16", "bf16", "int8", "int4-g32", "int4-g64", "int4-g128",
                        "nf4", "int3-g64", "int2-g64"};
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    struct ferry_qspec spec;
    struct ferry_qlayout layout;
    if (ferry_quant_spec_parse(fmts[f], &spec) != FERRY_OK ||
        ferry_quant_layout(&spec, rows, cols, &layout) != FERRY_OK) {
      fprintf(stderr, "dequant: %s\n", ferry_last_error());
      return 1;
    }
    void *blob = ferry__aligned_alloc(64, layout.blob_bytes);
    if (!blob) return 1;
    struct ferry_qout out;
    struct ferry_qview view;
    ferry_quant_out_blob(&layout, blob, &out);
    ferry_quant_view_blob(&layout, blob, &view);
    if (ferry_quant_quantize(&spec, src, rows, cols, &out) != FERRY_OK) {
      fprintf(stderr, "dequant: %s\n", ferry_last_error());
      return 1;
    }
    best = INT64_MAX;
    for (int k = 0; k < reps; k++) {
      int64_t t0 = ferry__mono_ns();
      ferry_quant_dequantize_rows(&spec, &view, rows, cols, 0, rows, dst);
      int64_t t = ferry__mono_ns() - t0;
      best = t < best ? t : best;
    }
    double gbps = best_gbps(best, out_bytes);
    printf("%-10s %10.1f %8.2f %12.2f %9.2f %10.2f %9.5f\n", fmts[f],
           (double)layout.total_bytes / (1 << 20), 8.0 * (double)layout.total_bytes / (double)n, gbps,
           best_gbps(best, layout.total_bytes), gbps / memcpy_gbps, ferry_quant_error(src, dst, n));
    ferry_free(blob);
  }
  ferry_free(src);
  ferry_free(dst);
  ferry_free(copy);
  return 0;
}
