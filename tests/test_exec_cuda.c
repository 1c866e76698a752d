/* The `cuda` executor: without a device (or without CUDA in the build) creation fails with a
 * clear status and message; with a device, a small conformance set runs: allocation and tier
 * accounting, a host->device->host round trip, a matmul per weight dtype against a CPU
 * reference, and event ordering between queues. GPU cases skip cleanly without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "ferry/exec.h"
#include "testutil.h"

static ferry_exec *try_create(uint64_t dev_budget, uint64_t host_budget) {
  ferry_exec *ex = NULL;
  struct ferry_exec_config c = {.device_budget_bytes = dev_budget, .host_budget_bytes = host_budget};
  ferry_status st = ferry_exec_create_cuda(&ex, &c);
  if (st != FERRY_OK) {
    assert_null(ex);
    return NULL;
  }
  return ex;
}

#define REQUIRE_DEVICE(ex, ...)                                                  \
  ferry_exec *ex = try_create(__VA_ARGS__);                                      \
  if (!ex) {                                                                     \
    fprintf(stderr, "skipped: %s\n", ferry_last_error());                         \
    skip();                                                                      \
  }

/* Runs everywhere: the status says why there is no executor, and the message says it too. */
static void test_create_status(void **state) {
  (void)state;
  ferry_exec *ex = NULL;
  ferry_status st = ferry_exec_create_cuda(&ex, NULL);
  if (st == FERRY_OK) {
    assert_non_null(ex);
    assert_string_equal(ferry_exec_name(ex), "cuda");
    assert_int_equal(ferry_exec_has_data(ex), 1);
    ferry_exec_destroy(ex);
    return;
  }
  assert_null(ex);
#ifdef FERRY_HAVE_CUDA
  /* no device, or ferry's CUDA module (or CUDA's libraries) not to be found: said which */
  assert_true(st == FERRY_ERR_NO_DEVICE || st == FERRY_ERR_CUDA || st == FERRY_ERR_UNSUPPORTED);
  if (st == FERRY_ERR_NO_DEVICE) assert_true(tu_contains(ferry_last_error(), "no CUDA device"));
  if (st == FERRY_ERR_UNSUPPORTED) assert_true(tu_contains(ferry_last_error(), "CUDA module"));
#else
  assert_int_equal(st, FERRY_ERR_UNSUPPORTED);
  assert_true(tu_contains(ferry_last_error(), "CUDA"));
#endif
  assert_true(strlen(ferry_last_error()) > 0);
  assert_int_equal(ferry_exec_create_cuda(NULL, NULL), FERRY_ERR_INVALID);
}

/* Whether a shared library whose name contains `name` is mapped into this process. */
static int mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
  fclose(f);
  return found;
}

/* CUDA's libraries are loaded only when the cuda executor is asked for: neither this program
 * nor `ferry` links them (a plain `ferry --help` or `ferry sim` never pays for loading them). */
static void test_cuda_loaded_on_demand(void **state) {
  (void)state;
  if (mapped("libcudart") < 0) skip();
  assert_int_equal(mapped("libcudart"), 0);
  assert_int_equal(mapped("libcublas"), 0);
  assert_int_equal(mapped("libcupti"), 0);
  const char *bin = getenv("FERRY_BIN");
  if (bin) {
    char cmd[1200], out[8192] = "";
    snprintf(cmd, sizeof cmd, "ldd '%s' 2>&1", bin);
    FILE *p = popen(cmd, "r");
    if (p) {
      size_t n = fread(out, 1, sizeof out - 1, p);
      out[n] = '\0';
      if (pclose(p) == 0) {
        assert_false(tu_contains(out, "libcudart"));
        assert_false(tu_contains(out, "libcublas"));
        assert_false(tu_contains(out, "libcupti"));
      }
    }
  }
  ferry_exec *ex = NULL;
  ferry_status st = ferry_exec_create_cuda(&ex, NULL);
  ferry_exec_destroy(ex);
#ifdef FERRY_HAVE_CUDA
  if (st != FERRY_ERR_UNSUPPORTED) assert_int_equal(mapped("ferry_cuda.so"), 1); /* the module, and with it CUDA */
#else
  assert_int_equal(st, FERRY_ERR_UNSUPPORTED);
  assert_int_equal(mapped("libcudart"), 0);
#endif
}

static void test_alloc_budget(void **state) {
  (void)state;
  REQUIRE_DEVICE(ex, 1 << 20, 1 << 20);
  ferry_buf *d = NULL, *h = NULL, *over = NULL;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1 << 19, "d", &d), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1 << 19, "h", &h), FERRY_OK);
  assert_null(ferry_exec_buf_host_ptr(ex, d)); /* device memory is not host visible */
  assert_non_null(ferry_exec_buf_host_ptr(ex, h));
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, (1 << 19) + 1, "over", &over), FERRY_ERR_BUDGET);
  uint64_t used = 0;
  ferry_exec_tier_usage(ex, FERRY_TIER_HOST, &used, NULL);
  assert_int_equal(used, 1 << 19);
  ferry_exec_free(ex, d);
  ferry_exec_free(ex, h);
  ferry_exec_destroy(ex);
}

/* Host -> device on H2D, device -> device and device -> host on D2H (waiting on an event). */
static void test_copy_round_trip(void **state) {
  (void)state;
  REQUIRE_DEVICE(ex, 0, 0);
  const uint64_t N = 8u << 20;
  int32_t qh, qd;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd), FERRY_OK);
  ferry_buf *src = NULL, *dst = NULL, *d1 = NULL, *d2 = NULL;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, N, "src", &src), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, N, "dst", &dst), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, N, "d1", &d1), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, N, "d2", &d2), FERRY_OK);
  unsigned char *s = ferry_exec_buf_host_ptr(ex, src), *d = ferry_exec_buf_host_ptr(ex, dst);
  for (uint64_t i = 0; i < N; i++) s[i] = (unsigned char)(i * 2654435761u >> 13);
  memset(d, 0, N);
  ferry_event *ev = NULL, *done = NULL;
  assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
  assert_int_equal(ferry_exec_event_create(ex, &done), FERRY_OK);
  struct ferry_ref r_src = {src, 0, FERRY_DTYPE_U8}, r_dst = {dst, 0, FERRY_DTYPE_U8};
  struct ferry_ref r_d1 = {d1, 0, FERRY_DTYPE_U8}, r_d2 = {d2, 0, FERRY_DTYPE_U8};
  assert_int_equal(ferry_exec_copy(ex, qh, r_d1, r_src, N), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, qh, r_d2, r_d1, N), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qh, ev), FERRY_OK);
  assert_int_equal(ferry_exec_queue_wait(ex, qd, ev), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, qd, r_dst, r_d2, N), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qd, done), FERRY_OK);
  assert_int_equal(ferry_exec_sync(ex, done), FERRY_OK);
  assert_int_equal(ferry_exec_query(ex, done), 1);
  assert_memory_equal(s, d, N);
  ferry_exec_event_destroy(ex, ev);
  ferry_exec_event_destroy(ex, done);
  ferry_exec_destroy(ex); /* frees the buffers */
}

/* With a device budget the device tier is one arena: buffers with odd sizes (padded inside it)
 * fill the whole budget, hold their own bytes (no two overlap: each gets a pattern, all are read
 * back), and space freed in the middle is reused. A budget the GPU cannot hold fails at create. */
static void test_device_arena(void **state) {
  (void)state;
  enum { NBUF = 4 };
  const uint64_t part = (1u << 20) - 3; /* padded to 1 MiB inside the arena */
  REQUIRE_DEVICE(ex, NBUF << 20, 2u << 20);
  int32_t qh, qd;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd), FERRY_OK);
  ferry_buf *d[NBUF] = {0}, *src = NULL, *dst = NULL;
  for (int i = 0; i < NBUF; i++) assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, part, "part", &d[i]), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, part, "src", &src), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, part, "dst", &dst), FERRY_OK);
  unsigned char *s = ferry_exec_buf_host_ptr(ex, src), *o = ferry_exec_buf_host_ptr(ex, dst);
  struct ferry_ref r_src = {src, 0, FERRY_DTYPE_U8}, r_dst = {dst, 0, FERRY_DTYPE_U8};
  ferry_event *ev = NULL;
  assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
  for (int i = 0; i < NBUF; i++) {
    memset(s, 0x10 + i, part);
    assert_int_equal(ferry_exec_copy(ex, qh, (struct ferry_ref){d[i], 0, FERRY_DTYPE_U8}, r_src, part), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qh, ev), FERRY_OK);
    assert_int_equal(ferry_exec_sync(ex, ev), FERRY_OK);
  }
  for (int i = 0; i < NBUF; i++) {
    memset(o, 0, part);
    assert_int_equal(ferry_exec_copy(ex, qd, r_dst, (struct ferry_ref){d[i], 0, FERRY_DTYPE_U8}, part), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qd, ev), FERRY_OK);
    assert_int_equal(ferry_exec_sync(ex, ev), FERRY_OK);
    for (uint64_t j = 0; j < part; j += 4099) assert_int_equal(o[j], 0x10 + i);
    assert_int_equal(o[part - 1], 0x10 + i);
  }
  ferry_buf *again = NULL;
  ferry_exec_free(ex, d[1]);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1u << 20, "again", &again), FERRY_OK);
  ferry_exec_event_destroy(ex, ev);
  ferry_exec_destroy(ex);
  /* a petabyte: refused at create, saying what it tried */
  ferry_exec *big = NULL;
  struct ferry_exec_config c = {.device_budget_bytes = 1ull << 50};
  assert_int_not_equal(ferry_exec_create_cuda(&big, &c), FERRY_OK);
  assert_null(big);
  assert_true(tu_contains(ferry_last_error(), "reserving the device budget"));
}

/* Event ordering under reuse: each round overwrites the source, copies it through the device
 * on one queue and back on another that waits for the first; the result is always the latest. */
static void test_event_order(void **state) {
  (void)state;
  REQUIRE_DEVICE(ex, 0, 0);
  const uint64_t N = 1u << 20;
  int32_t q1, q2;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q1), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &q2), FERRY_OK);
  ferry_buf *h = NULL, *out = NULL, *dv = NULL;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, N, "h", &h), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, N, "out", &out), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, N, "dv", &dv), FERRY_OK);
  ferry_event *copied = NULL, *back = NULL;
  assert_int_equal(ferry_exec_event_create(ex, &copied), FERRY_OK);
  assert_int_equal(ferry_exec_event_create(ex, &back), FERRY_OK);
  unsigned char *hp = ferry_exec_buf_host_ptr(ex, h), *op = ferry_exec_buf_host_ptr(ex, out);
  struct ferry_ref rh = {h, 0, FERRY_DTYPE_U8}, ro = {out, 0, FERRY_DTYPE_U8}, rd = {dv, 0, FERRY_DTYPE_U8};
  for (int round = 0; round < 40; round++) {
    memset(hp, round + 1, N);
    assert_int_equal(ferry_exec_copy(ex, q1, rd, rh, N), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, q1, copied), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, q2, copied), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, q2, ro, rd, N), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, q2, back), FERRY_OK);
    assert_int_equal(ferry_exec_sync(ex, back), FERRY_OK);
    assert_int_equal(op[0], round + 1);
    assert_int_equal(op[N - 1], round + 1);
  }
  ferry_exec_event_destroy(ex, copied);
  ferry_exec_event_destroy(ex, back);
  ferry_exec_destroy(ex);
}

/* y = x W^T + b against a double-precision reference, for fp32, fp16 and bf16 weights. */
static void test_matmul_reference(void **state) {
  (void)state;
  REQUIRE_DEVICE(ex, 0, 0);
  const int64_t M = 5, K = 96, N = 70;
  int32_t qc, qh, qd;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd), FERRY_OK);
  const enum ferry_dtype dts[] = {FERRY_DTYPE_F32, FERRY_DTYPE_F16, FERRY_DTYPE_BF16};
  for (size_t di = 0; di < 3; di++) {
    const enum ferry_dtype dt = dts[di];
    const size_t es = dt == FERRY_DTYPE_F32 ? 4 : 2;
    const uint64_t xb = (uint64_t)(M * K) * 4, wb = (uint64_t)(N * K) * es, bb = (uint64_t)N * 4,
                   yb = (uint64_t)(M * N) * 4;
    ferry_buf *h = NULL, *dv = NULL;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, xb + wb + bb + yb, "h", &h), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, xb + wb + bb + yb, "d", &dv), FERRY_OK);
    char *hp = ferry_exec_buf_host_ptr(ex, h);
    float *x = (float *)hp, *b = (float *)(hp + xb + wb), *y = (float *)(hp + xb + wb + bb);
    double *wref = malloc((size_t)(N * K) * sizeof(double));
    assert_non_null(wref);
    for (int64_t i = 0; i < M * K; i++) x[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    for (int64_t i = 0; i < N; i++) b[i] = (float)(i % 7) * 0.25f;
    for (int64_t i = 0; i < N * K; i++) {
      float v = (float)((i * 53 % 97) - 48) / 97.0f;
      if (dt == FERRY_DTYPE_F32) {
        ((float *)(hp + xb))[i] = v;
        wref[i] = v;
      } else if (dt == FERRY_DTYPE_F16) {
        uint16_t hv = ferry__f32_to_f16(v);
        ((uint16_t *)(hp + xb))[i] = hv;
        wref[i] = ferry__f16_to_f32(hv);
      } else {
        uint16_t hv = ferry__f32_to_bf16(v);
        ((uint16_t *)(hp + xb))[i] = hv;
        wref[i] = ferry__bf16_to_f32(hv);
      }
    }
    ferry_event *up = NULL, *computed = NULL, *down = NULL;
    assert_int_equal(ferry_exec_event_create(ex, &up), FERRY_OK);
    assert_int_equal(ferry_exec_event_create(ex, &computed), FERRY_OK);
    assert_int_equal(ferry_exec_event_create(ex, &down), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, qh, (struct ferry_ref){dv, 0, FERRY_DTYPE_U8}, (struct ferry_ref){h, 0, FERRY_DTYPE_U8},
                                     xb + wb + bb),
                     FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qh, up), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, qc, up), FERRY_OK);
    struct ferry_kernel k = {.kind = FERRY_K_MATMUL, .name = "matmul", .layer = -1, .expert = -1, .m = M, .n = N, .k = K};
    k.x = (struct ferry_ref){dv, 0, FERRY_DTYPE_F32};
    k.w = (struct ferry_ref){dv, xb, dt};
    k.b = (struct ferry_ref){dv, xb + wb, FERRY_DTYPE_F32};
    k.y = (struct ferry_ref){dv, xb + wb + bb, FERRY_DTYPE_F32};
    assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qc, computed), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, qd, computed), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, qd, (struct ferry_ref){h, xb + wb + bb, FERRY_DTYPE_U8},
                                     (struct ferry_ref){dv, xb + wb + bb, FERRY_DTYPE_U8}, yb),
                     FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qd, down), FERRY_OK);
    assert_int_equal(ferry_exec_sync(ex, down), FERRY_OK);
    /* fp16/bf16 weights see activations rounded to the same type: tolerance follows it */
    const double tol = dt == FERRY_DTYPE_F32 ? 1e-4 : dt == FERRY_DTYPE_F16 ? 2e-3 : 2e-2;
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double ref = b[j];
        for (int64_t kk = 0; kk < K; kk++) ref += (double)x[i * K + kk] * wref[j * K + kk];
        double got = y[i * N + j];
        if (fabs(got - ref) > tol * (1.0 + fabs(ref)))
          fail_msg("dtype %s: y[%lld,%lld] = %g, reference %g", ferry_dtype_name(dt), (long long)i, (long long)j, got, ref);
      }
    free(wref);
    ferry_exec_event_destroy(ex, up);
    ferry_exec_event_destroy(ex, computed);
    ferry_exec_event_destroy(ex, down);
    ferry_exec_free(ex, h);
    ferry_exec_free(ex, dv);
  }
  ferry_exec_destroy(ex);
}

/* Shapes the device must never see are refused at enqueue time with a message. */
static void test_bad_kernel_refused(void **state) {
  (void)state;
  REQUIRE_DEVICE(ex, 0, 0);
  int32_t qc;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  ferry_buf *dv = NULL;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4096, "small", &dv), FERRY_OK);
  struct ferry_kernel k = {.kind = FERRY_K_MATMUL, .name = "matmul", .layer = -1, .expert = -1, .m = 4, .n = 64, .k = 64};
  k.x = k.y = (struct ferry_ref){dv, 0, FERRY_DTYPE_F32};
  k.w = (struct ferry_ref){dv, 0, FERRY_DTYPE_F32};
  assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_ERR_RANGE);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "small"));
  k.w.dtype = FERRY_DTYPE_I8;
  assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_ERR_UNSUPPORTED);
  int32_t ids[2] = {0, 1000000};
  struct ferry_kernel e = {.kind = FERRY_K_EMBED, .name = "embed", .layer = -1, .expert = -1, .m = 2, .n = 8};
  e.y = (struct ferry_ref){dv, 0, FERRY_DTYPE_F32};
  e.w = (struct ferry_ref){dv, 0, FERRY_DTYPE_F32};
  e.ints = ids;
  e.n_ints = 2;
  assert_int_equal(ferry_exec_compute(ex, qc, &e), FERRY_ERR_RANGE);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "token id"));
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  ferry_exec_destroy(ex);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_loaded_on_demand),
      cmocka_unit_test(test_create_status),   cmocka_unit_test(test_alloc_budget),
      cmocka_unit_test(test_copy_round_trip), cmocka_unit_test(test_event_order),
      cmocka_unit_test(test_device_arena),
      cmocka_unit_test(test_matmul_reference), cmocka_unit_test(test_bad_kernel_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
