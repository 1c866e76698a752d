/* Executor conformance: the same op-level behaviour checked on every executor of the registry
 * that opens here (host and sim always; cuda where a GPU is; a registered one too). Budgets,
 * queue order, events between queues, host waits; the 33-case kernel table of
 * tests/kernel_cases.c (every kernel kind) against the host executor where an executor
 * computes; and the contract: the same undersized kernel refused with the same status and
 * message by every executor, and a window buffer's lower offsets refused like its end. Data is
 * moved through copies only, as the engine moves it, so a
 * device whose memory the host cannot see takes part. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "ferry/exec.h"
#include "ferry/exec_registry.h"
#include "ferry/hw.h"
#include "ferry/sim.h"
#include "kernel_cases.h"
#include "runtime/exec/host_copy.h"
#include "testutil.h"

static const struct ferry_exec_info *executors[32];
static size_t N_EXEC;

/* Every registered executor that can be opened here; one of a hardware profile on h100-pcie. */
static int find_executors(void **state) {
  (void)state;
  for (size_t i = 0; i < ferry_exec_registry_count(); i++) {
    const struct ferry_exec_info *x = ferry_exec_registry_at(i);
    char why[256] = "";
    if (x->available && !x->available(why, sizeof why)) {
      print_message("executor %s not here: %s\n", x->name, why);
      continue;
    }
    executors[N_EXEC++] = x;
  }
  return N_EXEC >= 2 ? 0 : -1; /* host and sim at least */
}

static ferry_exec *make(size_t i, uint64_t dev_budget, uint64_t host_budget) {
  ferry_exec *ex = NULL;
  ferry_hw *hw = NULL;
  if (executors[i]->caps & FERRY_EXEC_CAP_HW) assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  struct ferry_exec_params p = {.config = {.device_budget_bytes = dev_budget, .host_budget_bytes = host_budget},
                                .hw = hw};
  assert_int_equal(ferry_exec_open(executors[i]->name, &p, &ex), FERRY_OK);
  ferry_hw_close(hw);
  assert_string_equal(ferry_exec_name(ex), executors[i]->name);
  assert_int_equal(ferry_exec_has_data(ex), (executors[i]->caps & FERRY_EXEC_CAP_DATA) != 0);
  return ex;
}

/* Bytes into a device buffer and back, through a host buffer and copies (queue q). */
static void put(ferry_exec *ex, int32_t q, ferry_buf *dev, const void *src, uint64_t n) {
  ferry_buf *h = NULL;
  ferry_event *ev = NULL;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, n, "staging", &h), FERRY_OK);
  memcpy(ferry_exec_buf_host_ptr(ex, h), src, n);
  assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, q, (struct ferry_ref){dev, 0, FERRY_DTYPE_U8}, (struct ferry_ref){h, 0, FERRY_DTYPE_U8}, n),
                   FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, q, ev), FERRY_OK);
  assert_int_equal(ferry_exec_sync(ex, ev), FERRY_OK);
  ferry_exec_event_destroy(ex, ev);
  ferry_exec_free(ex, h);
}

static void get(ferry_exec *ex, int32_t q, ferry_buf *dev, void *dst, uint64_t n) {
  ferry_buf *h = NULL;
  ferry_event *ev = NULL;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, n, "staging", &h), FERRY_OK);
  assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, q, (struct ferry_ref){h, 0, FERRY_DTYPE_U8}, (struct ferry_ref){dev, 0, FERRY_DTYPE_U8}, n),
                   FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, q, ev), FERRY_OK);
  assert_int_equal(ferry_exec_sync(ex, ev), FERRY_OK);
  memcpy(dst, ferry_exec_buf_host_ptr(ex, h), n);
  ferry_exec_event_destroy(ex, ev);
  ferry_exec_free(ex, h);
}

static void test_budget_enforced(void **state) {
  (void)state;
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 1000, 500);
    ferry_buf *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 600, "a", &a), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 401, "b", &b), FERRY_ERR_BUDGET);
    assert_true(tu_contains(ferry_exec_errmsg(ex), "budget"));
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 400, "b", &b), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 501, "c", &c), FERRY_ERR_BUDGET);
    uint64_t used, peak;
    ferry_exec_tier_usage(ex, FERRY_TIER_DEVICE, &used, &peak);
    assert_int_equal(used, 1000);
    assert_int_equal(peak, 1000);
    ferry_exec_free(ex, a);
    ferry_exec_tier_usage(ex, FERRY_TIER_DEVICE, &used, &peak);
    assert_int_equal(used, 400);
    assert_int_equal(peak, 1000);
    ferry_exec_free(ex, b);
    /* the host executor drives no GPU; the simulator describes the one it models */
    struct ferry_device_info gpu;
    ferry_status st = ferry_exec_device_info(ex, &gpu);
    if (!strcmp(ferry_exec_name(ex), "host")) {
      assert_int_equal(st, FERRY_ERR_UNSUPPORTED);
      assert_true(tu_contains(ferry_exec_errmsg(ex), "no GPU"));
    } else {
      assert_int_equal(st, FERRY_OK);
      assert_true(gpu.name[0] != '\0');
      assert_true(gpu.total_memory_bytes > 0);
    }
    ferry_exec_destroy(ex);
  }
}

static void test_bad_refs_rejected(void **state) {
  (void)state;
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 0, 0);
    int32_t q;
    ferry_buf *h = NULL, *d = NULL;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 64, "h", &h), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 64, "d", &d), FERRY_OK);
    struct ferry_ref dst = {d, 32, FERRY_DTYPE_U8}, src = {h, 0, FERRY_DTYPE_U8};
    assert_int_equal(ferry_exec_copy(ex, q, dst, src, 33), FERRY_ERR_RANGE);
    assert_int_equal(ferry_exec_copy(ex, q + 5, dst, src, 8), FERRY_ERR_INVALID);
    assert_int_equal(ferry_exec_copy(ex, q, dst, src, 32), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    ferry_exec_destroy(ex);
  }
}

/* q1: fill A, copy A->B, record e; q2 waits e, copies B->C. Repeated with reuse of the event:
 * C must always hold the latest value (queue order + event ordering). */
static void test_queue_order_and_events(void **state) {
  (void)state;
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 0, 0);
    int has_data = ferry_exec_has_data(ex);
    int32_t q1, q2;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q1), FERRY_OK);
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &q2), FERRY_OK);
    const uint64_t N = 1 << 20;
    ferry_buf *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, N, "a", &a), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, N, "b", &b), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, N, "c", &c), FERRY_OK);
    ferry_event *ev = NULL, *done = NULL;
    assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
    assert_int_equal(ferry_exec_event_create(ex, &done), FERRY_OK);
    assert_int_equal(ferry_exec_query(ex, ev), 1); /* never recorded: complete */
    for (int round = 1; round <= 5; round++) {
      if (has_data) memset(ferry_exec_buf_host_ptr(ex, a), round, N);
      struct ferry_ref ra = {a, 0, FERRY_DTYPE_U8}, rb = {b, 0, FERRY_DTYPE_U8}, rc = {c, 0, FERRY_DTYPE_U8};
      assert_int_equal(ferry_exec_copy(ex, q1, rb, ra, N), FERRY_OK);
      assert_int_equal(ferry_exec_record(ex, q1, ev), FERRY_OK);
      assert_int_equal(ferry_exec_queue_wait(ex, q2, ev), FERRY_OK);
      assert_int_equal(ferry_exec_copy(ex, q2, rc, rb, N), FERRY_OK);
      assert_int_equal(ferry_exec_record(ex, q2, done), FERRY_OK);
      assert_int_equal(ferry_exec_sync(ex, done), FERRY_OK);
      assert_int_equal(ferry_exec_query(ex, done), 1);
      assert_int_equal(ferry_exec_query(ex, ev), 1);
      if (has_data) {
        const unsigned char *p = ferry_exec_buf_host_ptr(ex, c);
        assert_int_equal(p[0], round);
        assert_int_equal(p[N - 1], round);
      }
    }
    assert_true(ferry_exec_queue_busy_ns(ex, q1) >= 0);
    ferry_exec_event_destroy(ex, ev);
    ferry_exec_event_destroy(ex, done);
    ferry_exec_destroy(ex); /* frees buffers */
  }
}

/* A queue blocked on an event that is recorded later: the wait must hold the queue back. */
static void test_wait_blocks_queue(void **state) {
  (void)state;
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 0, 0);
    if (!ferry_exec_has_data(ex)) {
      ferry_exec_destroy(ex);
      continue;
    }
    int32_t qa, qb;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qa), FERRY_OK);
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qb), FERRY_OK);
    ferry_buf *x = NULL, *y = NULL;
    const uint64_t N = 64 << 20;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, N, "x", &x), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, N, "y", &y), FERRY_OK);
    memset(ferry_exec_buf_host_ptr(ex, x), 7, N);
    ferry_event *ev = NULL, *fin = NULL;
    assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
    assert_int_equal(ferry_exec_event_create(ex, &fin), FERRY_OK);
    struct ferry_ref rx = {x, 0, FERRY_DTYPE_U8}, ry = {y, 0, FERRY_DTYPE_U8};
    /* the big copy on qb, then qa waits for it and copies back a marker */
    assert_int_equal(ferry_exec_copy(ex, qb, ry, rx, N), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qb, ev), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, qa, ev), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, qa, rx, (struct ferry_ref){y, N - 8, FERRY_DTYPE_U8}, 8), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qa, fin), FERRY_OK);
    assert_int_equal(ferry_exec_sync(ex, fin), FERRY_OK);
    const unsigned char *p = ferry_exec_buf_host_ptr(ex, x);
    assert_int_equal(p[0], 7);
    ferry_exec_event_destroy(ex, ev);
    ferry_exec_event_destroy(ex, fin);
    ferry_exec_destroy(ex);
  }
}

/* Matmul against a naive reference, fp32 and fp16 weights, with bias and accumulate. */
static void test_matmul_reference(void **state) {
  (void)state;
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 0, 0);
    if (!ferry_exec_has_data(ex)) {
      ferry_exec_destroy(ex);
      continue;
    }
    int32_t q, qc;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &q), FERRY_OK);
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qc), FERRY_OK);
    enum { M = 3, N = 37, K = 29 };
    ferry_buf *x = NULL, *w = NULL, *y = NULL, *b = NULL;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, M * K * 4, "x", &x), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, N * K * 4, "w", &w), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, M * N * 4, "y", &y), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, N * 4, "b", &b), FERRY_OK);
    static float px[M * K], pw[N * K], py[M * N], pb[N];
    for (int64_t j = 0; j < M * K; j++) px[j] = (float)((j * 7) % 11) / 11.0f - 0.5f;
    for (int64_t j = 0; j < N * K; j++) pw[j] = (float)((j * 5) % 13) / 13.0f - 0.5f;
    for (int64_t j = 0; j < N; j++) pb[j] = (float)j / 100.0f;
    for (int64_t j = 0; j < M * N; j++) py[j] = 1.0f;
    put(ex, qc, x, px, sizeof px);
    put(ex, qc, w, pw, sizeof pw);
    put(ex, qc, b, pb, sizeof pb);
    put(ex, qc, y, py, sizeof py);
    struct ferry_kernel k = {.kind = FERRY_K_MATMUL, .name = "t", .layer = -1, .expert = -1, .m = M, .n = N, .k = K,
                             .x = {x, 0, FERRY_DTYPE_F32}, .y = {y, 0, FERRY_DTYPE_F32}, .w = {w, 0, FERRY_DTYPE_F32},
                             .b = {b, 0, FERRY_DTYPE_F32}, .accumulate = 1};
    assert_int_equal(ferry_exec_compute(ex, q, &k), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    get(ex, qc, y, py, sizeof py);
    for (int64_t r = 0; r < M; r++)
      for (int64_t c = 0; c < N; c++) {
        double ref = 1.0 + pb[c];
        for (int64_t j = 0; j < K; j++) ref += (double)px[r * K + j] * pw[c * K + j];
        assert_true(fabs(py[r * N + c] - ref) < 1e-4);
      }
    ferry_exec_destroy(ex);
  }
}

/* Attention with a KV cache against a naive softmax(qK^T/sqrt(d))V, grouped-query. */
static void test_attention_reference(void **state) {
  (void)state;
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 0, 0);
    if (!ferry_exec_has_data(ex)) {
      ferry_exec_destroy(ex);
      continue;
    }
    int32_t q, qc;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &q), FERRY_OK);
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qc), FERRY_OK);
    enum { T = 4, H = 4, KV = 2, D = 8, CAP = 8 };
    ferry_buf *bq, *bk, *bv, *bkc, *bvc, *bo;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, T * H * D * 4, "q", &bq), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, T * KV * D * 4, "k", &bk), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, T * KV * D * 4, "v", &bv), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, CAP * KV * D * 4, "kc", &bkc), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, CAP * KV * D * 4, "vc", &bvc), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, T * H * D * 4, "o", &bo), FERRY_OK);
    static float Q[T * H * D], Kn[T * KV * D], Vn[T * KV * D], O[T * H * D];
    for (int64_t j = 0; j < T * H * D; j++) Q[j] = sinf((float)j);
    for (int64_t j = 0; j < T * KV * D; j++) {
      Kn[j] = cosf((float)j * 0.7f);
      Vn[j] = sinf((float)j * 0.3f);
    }
    put(ex, qc, bq, Q, sizeof Q);
    put(ex, qc, bk, Kn, sizeof Kn);
    put(ex, qc, bv, Vn, sizeof Vn);
    const int32_t pos[] = {0, 1, 2, 3}, slot[] = {0, 0, 0, 0};
    struct ferry_kernel k = {.kind = FERRY_K_ATTENTION, .name = "attn", .layer = 0, .expert = -1, .m = T,
                             .x = {bq, 0, FERRY_DTYPE_F32}, .y = {bo, 0, FERRY_DTYPE_F32},
                             .aux = {{bk, 0, FERRY_DTYPE_F32}, {bv, 0, FERRY_DTYPE_F32}, {bkc, 0, FERRY_DTYPE_F32},
                                     {bvc, 0, FERRY_DTYPE_F32}},
                             .ints = pos, .ints2 = slot, .n_ints = T, .heads = H, .kv_heads = KV, .head_dim = D,
                             .kv_capacity = CAP, .context_tokens = 10};
    assert_int_equal(ferry_exec_compute(ex, q, &k), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    get(ex, qc, bo, O, sizeof O);
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++) {
        int64_t g = h / (H / KV);
        double s[4], mx = -1e30, sum = 0;
        for (int64_t p = 0; p <= t; p++) {
          double d = 0;
          for (int64_t j = 0; j < D; j++) d += (double)Q[(t * H + h) * D + j] * Kn[(p * KV + g) * D + j];
          s[p] = d / sqrt((double)D);
          if (s[p] > mx) mx = s[p];
        }
        for (int64_t p = 0; p <= t; p++) sum += (s[p] = exp(s[p] - mx));
        for (int64_t j = 0; j < D; j++) {
          double ref = 0;
          for (int64_t p = 0; p <= t; p++) ref += s[p] / sum * Vn[(p * KV + g) * D + j];
          assert_true(fabs(O[(t * H + h) * D + j] - ref) < 1e-5);
        }
      }
    ferry_exec_destroy(ex);
  }
}

/* The kernel table (every kernel kind) on every executor: where an executor computes, its
 * results read back through copies match the host executor's (the host itself: bit for bit;
 * cuda: within each case's tolerance). An executor may decline a kernel it does not implement
 * with FERRY_ERR_UNSUPPORTED (cuda: the newer families' features), said in the log; the host,
 * the reference, runs them all. */
static void test_kernel_table(void **state) {
  (void)state;
  size_t n;
  const struct kcase *cases = kc_cases(&n);
  int kinds[FERRY_K_COUNT] = {0};
  for (size_t c = 0; c < n; c++) kinds[cases[c].k.kind] = 1;
  kinds[FERRY_K_ALLREDUCE] = 1; /* spans several devices: tests/test_multi_gpu.c */
  for (int k = 0; k < FERRY_K_COUNT; k++)
    if (!kinds[k]) fail_msg("no case of kernel kind %s", ferry_kernel_kind_name((enum ferry_kernel_kind)k));
  for (size_t c = 0; c < n; c++) {
    /* the reference is configured as make() configures the host executor checked against it:
     * OpenBLAS partitions a product by its thread count, and the partition changes the sums'
     * rounding (1 thread against 14 on a 16-core machine differed by 2.9e-7, the GPU check of
     * 2026-12-04), so "bit for bit" holds between executors of one thread count */
    ferry_exec *host = NULL;
    struct ferry_exec_params hp = {.config = {.compute_threads = 0}};
    assert_int_equal(ferry_exec_open("host", &hp, &host), FERRY_OK);
    char *ref = NULL;
    if (kc_run(host, &cases[c], cases[c].bytes, &ref) != FERRY_OK)
      fail_msg("%s on host: %s", cases[c].name, ferry_exec_errmsg(host));
    ferry_exec_destroy(host);
    for (size_t i = 0; i < N_EXEC; i++) {
      ferry_exec *ex = make(i, 0, 0);
      char *got = NULL;
      const ferry_status st = kc_run(ex, &cases[c], cases[c].bytes, &got);
      if (st == FERRY_ERR_UNSUPPORTED) {
        print_message("%s on %s: not implemented (%s)\n", cases[c].name, executors[i]->name, ferry_exec_errmsg(ex));
      } else if (st != FERRY_OK) {
        fail_msg("%s on %s: %s", cases[c].name, executors[i]->name, ferry_exec_errmsg(ex));
      } else if (ferry_exec_has_data(ex)) {
        int ids_ok, nonfinite;
        const double rel = kc_max_rel_error(&cases[c], ref, got, &ids_ok, &nonfinite);
        const double tol = !strcmp(executors[i]->name, "host") ? 0.0 : cases[c].tol;
        if (rel > tol || !ids_ok || nonfinite)
          fail_msg("%s on %s: error %.3g (tolerance %.1g)%s%s", cases[c].name, executors[i]->name, rel, tol,
                   ids_ok ? "" : ", ids differ", nonfinite ? ", non-finite" : "");
      }
      free(got);
      ferry_exec_destroy(ex);
    }
    free(ref);
  }
}

/* A weight dequantized into fp16 is the fp32 expansion rounded once to nearest even, element
 * for element (the kernel cases then hold every other executor to the host's bits); fp16 is the
 * only narrower output, and none of the executors claims the fp16 fast path but cuda. */
static void test_dequantize_half(void **state) {
  (void)state;
  size_t n;
  const struct kcase *cases = kc_cases(&n);
  int pairs = 0;
  for (size_t h = 0; h < n; h++) {
    if (cases[h].k.kind != FERRY_K_DEQUANTIZE || cases[h].out_dt != FERRY_DTYPE_F16) continue;
    const struct kcase *f = NULL;
    for (size_t c = 0; c < n; c++)
      if (cases[c].k.kind == FERRY_K_DEQUANTIZE && cases[c].out_dt == FERRY_DTYPE_F32 &&
          !strncmp(cases[c].name, cases[h].name, strlen(cases[c].name)) && cases[h].name[strlen(cases[c].name)] == '.')
        f = &cases[c];
    if (!f) fail_msg("%s: no fp32 case of its format", cases[h].name);
    ferry_exec *host = NULL;
    struct ferry_exec_params hp = {.config = {.compute_threads = 0}};
    assert_int_equal(ferry_exec_open("host", &hp, &host), FERRY_OK);
    char *wide = NULL, *half = NULL;
    assert_int_equal(kc_run(host, f, f->bytes, &wide), FERRY_OK);
    assert_int_equal(kc_run(host, &cases[h], cases[h].bytes, &half), FERRY_OK);
    assert_int_equal(cases[h].out_floats, f->out_floats);
    int nonzero = 0;
    for (uint64_t j = 0; j < f->out_floats; j++) {
      float v;
      uint16_t got;
      memcpy(&v, wide + f->out_off + 4 * j, 4);
      memcpy(&got, half + cases[h].out_off + 2 * j, 2);
      if (got != ferry__f32_to_f16(v)) fail_msg("%s: element %llu is 0x%04x, fp16(%.9g) is 0x%04x", cases[h].name,
                                                 (unsigned long long)j, got, (double)v, ferry__f32_to_f16(v));
      nonzero += got != 0;
    }
    assert_true(nonzero > (int)(f->out_floats / 2));
    /* bf16 is not an output: the shared contract refuses it */
    struct kcase bf = cases[h];
    bf.k.y.dtype = FERRY_DTYPE_BF16;
    char *none = NULL;
    assert_int_equal(kc_run(host, &bf, bf.bytes, &none), FERRY_ERR_UNSUPPORTED);
    assert_true(tu_contains(ferry_exec_errmsg(host), "fp32 or fp16"));
    free(none);
    free(wide);
    free(half);
    ferry_exec_destroy(host);
    pairs++;
  }
  assert_true(pairs >= 3);
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 0, 0);
    assert_int_equal(ferry_exec_half_dequant(ex), !strcmp(executors[i]->name, "cuda"));
    ferry_exec_destroy(ex);
  }
}

/* The host executor's copy (streaming stores from 1 MiB on): every byte arrives, at every
 * alignment of source and destination and around the size where it switches, and not one byte
 * past the end is written. */
static void test_host_copy(void **state) {
  (void)state;
  const size_t sizes[] = {4096, FERRY_HOST_STREAM_COPY_BYTES - 1, FERRY_HOST_STREAM_COPY_BYTES,
                          FERRY_HOST_STREAM_COPY_BYTES + 1, FERRY_HOST_STREAM_COPY_BYTES + 63, 3 * 1048576 + 17};
  const size_t room = 3 * 1048576 + 17 + 64;
  unsigned char *src = malloc(room), *dst = malloc(room);
  assert_non_null(src);
  assert_non_null(dst);
  for (size_t i = 0; i < room; i++) src[i] = (unsigned char)(i * 131 + 7);
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
    for (size_t so = 0; so < 18; so += 5)
      for (size_t d0 = 0; d0 < 18; d0 += 3) {
        memset(dst, 0xa5, room);
        ferry__host_copy(dst + d0, src + so, sizes[z]);
        if (memcmp(dst + d0, src + so, sizes[z]))
          fail_msg("%zu bytes from offset %zu to offset %zu differ", sizes[z], so, d0);
        for (size_t i = 0; i < d0; i++) assert_int_equal(dst[i], 0xa5);
        for (size_t i = d0 + sizes[z]; i < d0 + sizes[z] + 40 && i < room; i++) assert_int_equal(dst[i], 0xa5);
      }
  free(src);
  free(dst);
}

/* The contract is the wrapper's: every case with a device buffer of half its size is refused
 * before it runs, with FERRY_ERR_RANGE and the same message on every executor (it was RANGE on
 * cuda, OK on sim and a heap overflow on host). */
static void test_undersized_kernel_same_error(void **state) {
  (void)state;
  size_t n;
  const struct kcase *cases = kc_cases(&n);
  for (size_t c = 0; c < n; c++) {
    char first[512] = "";
    for (size_t i = 0; i < N_EXEC; i++) {
      ferry_exec *ex = make(i, 0, 0);
      char *got = NULL;
      const ferry_status st = kc_run(ex, &cases[c], cases[c].bytes / 2, &got);
      if (st != FERRY_ERR_RANGE)
        fail_msg("%s on %s with half its buffer: %s (%s)", cases[c].name, executors[i]->name, ferry_status_name(st),
                 ferry_exec_errmsg(ex));
      assert_true(tu_contains(ferry_exec_errmsg(ex), "case device"));
      if (i == 0) snprintf(first, sizeof first, "%s", ferry_exec_errmsg(ex));
      else if (strcmp(first, ferry_exec_errmsg(ex)))
        fail_msg("%s: %s says '%s', %s '%s'", cases[c].name, executors[0]->name, first, executors[i]->name,
                 ferry_exec_errmsg(ex));
      free(got);
      ferry_exec_destroy(ex);
    }
  }
}

/* A window on a layout (ferry_exec_alloc_window()): it holds and is charged for offsets
 * [base, base + bytes) only; a copy or kernel addressing below its base is refused like one past
 * its end, with the same status and message on every executor, and an op inside it lands where
 * it is addressed (here a combine of no ranks: y += shared expert). */
static void test_window_buffer(void **state) {
  (void)state;
  enum { BASE = 4096, BYTES = 1024, M = 4, N = 16 };
  char first[512] = "";
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 2 * BYTES, 0);
    int32_t qc, qu, qd;
    ferry_buf *w = NULL, *h = NULL, *big = NULL;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qu), FERRY_OK);
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd), FERRY_OK);
    /* the budget is the window's bytes, not its last offset */
    assert_int_equal(ferry_exec_alloc_window(ex, 0, FERRY_TIER_DEVICE, BASE, BYTES, BYTES, "win", &w), FERRY_OK);
    assert_int_equal(ferry_exec_buf_base(w), BASE);
    assert_int_equal(ferry_exec_buf_size(w), BYTES);
    uint64_t used = 0;
    ferry_exec_tier_usage(ex, FERRY_TIER_DEVICE, &used, NULL);
    assert_int_equal(used, BYTES);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, BYTES + 1, "big", &big), FERRY_ERR_BUDGET);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, BASE + BYTES, "host copy", &h), FERRY_OK);
    const struct ferry_ref hy = {h, BASE, FERRY_DTYPE_F32}, wy = {w, BASE, FERRY_DTYPE_F32};
    const uint64_t rows = (uint64_t)M * N * 4;
    /* below the base, straddling it, past the end */
    assert_int_equal(ferry_exec_copy(ex, qu, (struct ferry_ref){w, 0, FERRY_DTYPE_F32}, hy, 8), FERRY_ERR_RANGE);
    assert_int_equal(ferry_exec_copy(ex, qu, (struct ferry_ref){w, BASE - 4, FERRY_DTYPE_F32}, hy, 8), FERRY_ERR_RANGE);
    assert_int_equal(ferry_exec_copy(ex, qd, hy, (struct ferry_ref){w, BASE + BYTES - 4, FERRY_DTYPE_F32}, 8),
                     FERRY_ERR_RANGE);
    struct ferry_kernel k = {.kind = FERRY_K_MOE_COMBINE, .name = "combine", .layer = -1, .expert = -1, .m = M, .n = N,
                             .top_k = 2, .y = wy, .aux = {{w, BASE - 2 * rows, FERRY_DTYPE_F32}}};
    assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_ERR_RANGE);
    if (!i) snprintf(first, sizeof first, "%s", ferry_exec_errmsg(ex));
    else if (strcmp(first, ferry_exec_errmsg(ex)))
      fail_msg("%s says '%s', %s '%s'", executors[0]->name, first, executors[i]->name, ferry_exec_errmsg(ex));
    assert_true(tu_contains(first, "at offsets 4096 to 5120"));
    /* inside: y (ones) += the shared expert's rows after it (twos), no ranks */
    float *hv = ferry_exec_buf_host_ptr(ex, h);
    for (int j = 0; hv && j < 2 * M * N; j++) hv[BASE / 4 + j] = j < M * N ? 1.0f : 2.0f;
    assert_int_equal(ferry_exec_copy(ex, qu, wy, hy, 2 * rows), FERRY_OK);
    ferry_event *ev = NULL;
    assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qu, ev), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, qc, ev), FERRY_OK);
    k.top_k = 0;
    k.aux[0] = (struct ferry_ref){0};
    k.aux[2] = (struct ferry_ref){w, BASE + rows, FERRY_DTYPE_F32};
    assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qc, ev), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, qd, ev), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, qd, hy, wy, rows), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    for (int j = 0; hv && ferry_exec_has_data(ex) && j < M * N; j++) assert_true(hv[BASE / 4 + j] == 3.0f);
    ferry_exec_event_destroy(ex, ev);
    ferry_exec_free(ex, w);
    ferry_exec_tier_usage(ex, FERRY_TIER_DEVICE, &used, NULL);
    assert_int_equal(used, 0);
    ferry_exec_destroy(ex);
  }
}

/* Aliasing a product's output onto its input is refused everywhere. */
static void test_aliased_matmul_refused(void **state) {
  (void)state;
  for (size_t i = 0; i < N_EXEC; i++) {
    ferry_exec *ex = make(i, 0, 0);
    int32_t q;
    ferry_buf *a = NULL;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &q), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1 << 16, "acts", &a), FERRY_OK);
    struct ferry_kernel k = {.kind = FERRY_K_MATMUL, .name = "mm", .layer = -1, .expert = -1, .m = 4, .n = 16, .k = 16,
                             .x = {a, 0, FERRY_DTYPE_F32}, .y = {a, 128, FERRY_DTYPE_F32}, .w = {a, 4096, FERRY_DTYPE_F32}};
    assert_int_equal(ferry_exec_compute(ex, q, &k), FERRY_ERR_INVALID);
    assert_true(tu_contains(ferry_exec_errmsg(ex), "y overlaps x"));
    k.y.offset = 256; /* right after x's 256 bytes */
    assert_int_equal(ferry_exec_compute(ex, q, &k), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    ferry_exec_destroy(ex);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_budget_enforced),        cmocka_unit_test(test_bad_refs_rejected),
      cmocka_unit_test(test_queue_order_and_events), cmocka_unit_test(test_wait_blocks_queue),
      cmocka_unit_test(test_matmul_reference),       cmocka_unit_test(test_attention_reference),
      cmocka_unit_test(test_kernel_table),           cmocka_unit_test(test_dequantize_half),
      cmocka_unit_test(test_host_copy),
      cmocka_unit_test(test_undersized_kernel_same_error),
      cmocka_unit_test(test_aliased_matmul_refused), cmocka_unit_test(test_window_buffer),
  };
  return cmocka_run_group_tests(tests, find_executors, NULL);
}
