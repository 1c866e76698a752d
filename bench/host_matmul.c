/* The host executor's matrix product (ferry__host_matmul) per row count, beside what it did
 * before for more than one row and still does above its row-by-row limit: one OpenBLAS sgemm a
 * 1 MiB fp32 panel of the converted weight (fp16), or one sgemm over the whole weight (fp32). One
 * BLAS thread, as the host executor runs on a 2-core machine. Shows why products of up to 8 rows
 * of fp16 weights (16 of fp32) go row by row through sgemv: sgemm's edge kernels make a few rows
 * cost far more than as many sgemv, and unevenly (3 rows above 4). Prints microseconds per call,
 * best of several repetitions.
 * Usage: host_matmul [n k [reps [fp16|fp32]]]   (default 1792 512 20 fp16: the fidelity study's
 * expert projection) */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "common/units.h"
#include "runtime/exec/host_kernels.h"

enum { M_MAX = 20 };

/* what the executor did before: sgemm a converted panel (fp16), or over the whole weight (fp32) */
static void sgemm_before(const float *x, int64_t m, int64_t k, const void *w, enum ferry_dtype dt, int64_t n,
                         float *panel, int64_t panel_rows, float *y) {
  if (dt == FERRY_DTYPE_F32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w, (int)k, 0.0f, y,
                (int)n);
    return;
  }
  for (int64_t r0 = 0; r0 < n; r0 += panel_rows) {
    const int64_t rows = n - r0 < panel_rows ? n - r0 : panel_rows;
    ferry__host_to_f32(dt, (const uint16_t *)w + r0 * k, panel, (size_t)(rows * k));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)rows, (int)k, 1.0f, x, (int)k, panel, (int)k,
                0.0f, y + r0, (int)n);
  }
}

int main(int argc, char **argv) {
  const int64_t n = argc > 2 ? atoll(argv[1]) : 1792, k = argc > 2 ? atoll(argv[2]) : 512;
  const int reps = argc > 3 ? atoi(argv[3]) : 20;
  const char *type = argc > 4 ? argv[4] : "fp16";
  const enum ferry_dtype dt = !strcmp(type, "fp32") ? FERRY_DTYPE_F32 : FERRY_DTYPE_F16;
  if (n < 1 || k < 1 || reps < 1 || n * k > (int64_t)1 << 28 || (strcmp(type, "fp16") && strcmp(type, "fp32"))) {
    fprintf(stderr, "usage: host_matmul [n k [reps [fp16|fp32]]]   (n x k at most 2^28 weights)\n");
    return 2;
  }
  openblas_set_num_threads(1);
  void *w = ferry_malloc((size_t)(n * k) * ferry_dtype_size(dt));
  const int64_t panel_rows = ferry__host_panel_rows(k, n);
  float *panel = ferry_malloc((size_t)(panel_rows * k) * sizeof *panel);
  float *x = ferry_malloc((size_t)(M_MAX * k) * sizeof *x), *y = ferry_malloc((size_t)(M_MAX * n) * sizeof *y);
  if (!w || !panel || !x || !y) {
    fprintf(stderr, "host_matmul: out of memory\n");
    return 1;
  }
  for (int64_t i = 0; i < n * k; i++) {
    const float v = (float)(i % 97) / 97.0f - 0.5f;
    if (dt == FERRY_DTYPE_F32) ((float *)w)[i] = v;
    else ((uint16_t *)w)[i] = ferry__f32_to_f16(v);
  }
  for (int64_t i = 0; i < M_MAX * k; i++) x[i] = (float)(i % 13) / 13.0f - 0.5f;
  struct ferry_host_scratch s = {0};
  printf("y[m, %lld] = x[m, %lld] . W^T, W %s, 1 BLAS thread, best of %d (us per call); row by row up to %lld rows\n",
         (long long)n, (long long)k, type, reps, (long long)ferry__host_gemv_rows_max(dt));
  printf("%4s %12s %12s %16s\n", "m", "ferry", "per row", dt == FERRY_DTYPE_F32 ? "sgemm" : "sgemm a panel");
  for (int64_t m = 1; m <= M_MAX; m++) {
    int64_t best = INT64_MAX, best_gemm = INT64_MAX;
    for (int r = 0; r < reps; r++) {
      int64_t t0 = ferry__mono_ns();
      if (ferry__host_matmul(x, m, k, w, dt, n, NULL, 0, y, n, 0, &s) != FERRY_OK) {
        fprintf(stderr, "host_matmul: out of memory for the weight panel\n");
        return 1;
      }
      int64_t t1 = ferry__mono_ns();
      sgemm_before(x, m, k, w, dt, n, panel, panel_rows, y);
      int64_t t2 = ferry__mono_ns();
      if (t1 - t0 < best) best = t1 - t0;
      if (t2 - t1 < best_gemm) best_gemm = t2 - t1;
    }
    printf("%4lld %12.1f %12.1f %16.1f\n", (long long)m, best / 1e3, best / 1e3 / (double)m, best_gemm / 1e3);
  }
  ferry__host_scratch_free(&s);
  ferry_free(w);
  ferry_free(panel);
  ferry_free(x);
  ferry_free(y);
  return 0;
}
