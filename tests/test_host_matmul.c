/* The host executor's matrix products (runtime/exec/host_kernels.c) at every row count around
 * the point where they change method: up to 8 rows of fp16 weights (16 of fp32) go through one
 * matrix-vector product per row over a cache-sized panel of the weight, more through sgemm. Each
 * shape checks the result against a double-precision product, for fp32 and fp16 weights, both
 * weight layouts, with and without accumulation, over weights that span several panels; and checks
 * that a row computed among up to that many others is bit-identical to the same row alone (what
 * lets the simulator price a product of m rows as m times one, and keeps a token's logits
 * independent of the batch it decodes in). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "ferry/hw.h"
#include "runtime/exec/host_kernels.h"
#include "testutil.h"

enum { K = 700, N = 900, M_MAX = 20 }; /* 700 x 4 bytes: 374 rows a 1 MiB panel, 3 panels of N */

struct weights {
  float f32[N * K];    /* W [N, K] (row-major) */
  uint16_t f16[N * K]; /* the same in fp16 */
  float f16_as_f32[N * K];
  float t32[K * N]; /* W^T [K, N] for the input-major product */
  uint16_t t16[K * N];
  float t16_as_f32[K * N];
};

static struct weights *make_weights(void) {
  struct weights *w = malloc(sizeof *w);
  assert_non_null(w);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) {
      float v = (float)((n * 31 + k * 17) % 97) / 97.0f - 0.5f;
      w->f32[n * K + k] = w->t32[k * N + n] = v;
      uint16_t h = ferry__f32_to_f16(v);
      w->f16[n * K + k] = w->t16[k * N + n] = h;
      w->f16_as_f32[n * K + k] = w->t16_as_f32[k * N + n] = ferry__f16_to_f32(h);
    }
  return w;
}

/* y[m, N] (+)= x . W^T (transposed = 0: W is [N, K]) or x . W (transposed = 1: W is [K, N]) */
static void product(int transposed, const float *x, int64_t m, const void *w, enum ferry_dtype dt, float *y,
                    int accumulate, struct ferry_host_scratch *s) {
  ferry_status st = transposed ? ferry__host_matmul_t(x, m, K, w, dt, N, y, N, accumulate, s)
                               : ferry__host_matmul(x, m, K, w, dt, N, NULL, 0, y, N, accumulate, s);
  assert_int_equal(st, FERRY_OK);
}

static void check_shapes(int transposed, enum ferry_dtype dt) {
  struct weights *w = make_weights();
  const void *wp = transposed ? (dt == FERRY_DTYPE_F16 ? (const void *)w->t16 : w->t32)
                              : (dt == FERRY_DTYPE_F16 ? (const void *)w->f16 : w->f32);
  const float *wref = dt == FERRY_DTYPE_F16 ? w->f16_as_f32 : w->f32; /* [N, K] whichever the layout */
  static float x[M_MAX * K], y[M_MAX * N], alone[N];
  static double dot[M_MAX * N];
  for (int64_t j = 0; j < M_MAX * K; j++) x[j] = (float)((j * 13) % 29) / 29.0f - 0.5f;
  for (int64_t r = 0; r < M_MAX; r++)
    for (int64_t c = 0; c < N; c++) {
      dot[r * N + c] = 0;
      for (int64_t k = 0; k < K; k++) dot[r * N + c] += (double)x[r * K + k] * wref[c * K + k];
    }
  const int64_t gemv_rows = ferry__host_gemv_rows_max(dt);
  /* the last row count the simulator's calibration prices as a matrix-vector product: 2 flops a
   * weight element per row, at most FERRY_HW_GEMM_INTENSITY flops a byte of weight */
  const double es = (double)ferry_dtype_size(dt);
  assert_true(2.0 * (double)gemv_rows / es <= FERRY_HW_GEMM_INTENSITY);
  assert_true(2.0 * (double)(gemv_rows + 1) / es > FERRY_HW_GEMM_INTENSITY);
  struct ferry_host_scratch s = {0};
  for (int64_t m = 1; m <= M_MAX; m++) {
    for (int accumulate = 0; accumulate <= 1; accumulate++) {
      for (int64_t j = 0; j < m * N; j++) y[j] = accumulate ? 0.25f : NAN; /* NAN: must be overwritten */
      product(transposed, x, m, wp, dt, y, accumulate, &s);
      for (int64_t r = 0; r < m; r++) {
        for (int64_t c = 0; c < N; c++) {
          const double ref = (accumulate ? 0.25 : 0.0) + dot[r * N + c];
          if (!(fabs(y[r * N + c] - ref) < 1e-3)) {
            print_error("m %lld row %lld col %lld: %g, want %g (transposed %d, dtype %d, accumulate %d)\n",
                        (long long)m, (long long)r, (long long)c, (double)y[r * N + c], ref, transposed, (int)dt,
                        accumulate);
            fail();
          }
        }
        if (m <= gemv_rows) { /* row r on its own gives the same bits */
          for (int64_t j = 0; j < N; j++) alone[j] = accumulate ? 0.25f : NAN;
          product(transposed, x + r * K, 1, wp, dt, alone, accumulate, &s);
          assert_memory_equal(alone, y + r * N, sizeof alone);
        }
      }
    }
  }
  ferry__host_scratch_free(&s);
  free(w);
}

static void test_fp32_weights(void **state) {
  (void)state;
  check_shapes(0, FERRY_DTYPE_F32);
}

static void test_fp16_weights(void **state) {
  (void)state;
  check_shapes(0, FERRY_DTYPE_F16);
}

static void test_fp32_weights_input_major(void **state) {
  (void)state;
  check_shapes(1, FERRY_DTYPE_F32);
}

static void test_fp16_weights_input_major(void **state) {
  (void)state;
  check_shapes(1, FERRY_DTYPE_F16);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp32_weights),
      cmocka_unit_test(test_fp16_weights),
      cmocka_unit_test(test_fp32_weights_input_major),
      cmocka_unit_test(test_fp16_weights_input_major),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
