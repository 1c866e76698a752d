/* The host executor's matrix product (ferry__host_matmul, fp16 weights converted in 1 MiB fp32
 * panels) per row count, beside the same panels multiplied by one OpenBLAS sgemm each (what it
 * does above 8 rows, and did for every count above 1 before), on one BLAS thread as the host
 * executor runs on a 2-core machine. Shows why products of up to 8 rows go row by row through
 * sgemv: sgemm's edge kernels make 2-7 rows cost far more than as many sgemv, and unevenly (3
 * rows above 4). Prints microseconds per call, best of several repetitions.
 * Usage: host_matmul [n k [reps]]   (default 1792 512: the fidelity study's expert projection) */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/half.h"
#include "common/units.h"
#include "runtime/exec/host_kernels.h"

enum { M_MAX = 16 };

int main(int argc, char **argv) {
  const int64_t n = argc > 2 ? atoll(argv[1]) : 1792, k = argc > 2 ? atoll(argv[2]) : 512;
  const int reps = argc > 3 ? atoi(argv[3]) : 20;
  if (n < 1 || k < 1 || reps < 1 || n * k > (int64_t)1 << 28) {
    fprintf(stderr, "usage: host_matmul [n k [reps]]   (n x k at most 2^28 weights)\n");
    return 2;
  }
  openblas_set_num_threads(1);
  uint16_t *w16 = ferry_malloc((size_t)(n * k) * sizeof *w16);
  const int64_t panel_rows = n < (1 << 18) / k ? n : (1 << 18) / k > 0 ? (1 << 18) / k : 1; /* as the executor's */
  float *panel = ferry_malloc((size_t)(panel_rows * k) * sizeof *panel);
  float *x = ferry_malloc((size_t)(M_MAX * k) * sizeof *x), *y = ferry_malloc((size_t)(M_MAX * n) * sizeof *y);
  if (!w16 || !panel || !x || !y) {
    fprintf(stderr, "host_matmul: out of memory\n");
    return 1;
  }
  for (int64_t i = 0; i < n * k; i++) w16[i] = ferry__f32_to_f16((float)(i % 97) / 97.0f - 0.5f);
  for (int64_t i = 0; i < M_MAX * k; i++) x[i] = (float)(i % 13) / 13.0f - 0.5f;
  struct ferry_host_scratch s = {0};
  printf("y[m, %lld] = x[m, %lld] . W^T, 1 BLAS thread, best of %d (us per call)\n", (long long)n, (long long)k, reps);
  printf("%4s %16s %12s %16s\n", "m", "ferry fp16 W", "per row", "sgemm a panel");
  for (int64_t m = 1; m <= M_MAX; m++) {
    int64_t best = INT64_MAX, best_gemm = INT64_MAX;
    for (int r = 0; r < reps; r++) {
      int64_t t0 = ferry__mono_ns();
      if (ferry__host_matmul(x, m, k, w16, FERRY_DTYPE_F16, n, NULL, 0, y, n, 0, &s) != FERRY_OK) {
        fprintf(stderr, "host_matmul: out of memory for the weight panel\n");
        return 1;
      }
      int64_t t1 = ferry__mono_ns();
      for (int64_t r0 = 0; r0 < n; r0 += panel_rows) {
        const int64_t rows = n - r0 < panel_rows ? n - r0 : panel_rows;
        ferry__host_to_f32(FERRY_DTYPE_F16, w16 + r0 * k, panel, (size_t)(rows * k));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)rows, (int)k, 1.0f, x, (int)k, panel, (int)k,
                    0.0f, y + r0, (int)n);
      }
      int64_t t2 = ferry__mono_ns();
      if (t1 - t0 < best) best = t1 - t0;
      if (t2 - t1 < best_gemm) best_gemm = t2 - t1;
    }
    printf("%4lld %16.1f %12.1f %16.1f\n", (long long)m, best / 1e3, best / 1e3 / (double)m, best_gemm / 1e3);
  }
  ferry__host_scratch_free(&s);
  ferry_free(w16);
  ferry_free(panel);
  ferry_free(x);
  ferry_free(y);
  return 0;
}
