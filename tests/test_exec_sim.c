/* The `sim` executor on its own, against closed forms on a profile with round numbers: a copy
 * takes latency + bytes / bandwidth, a kernel its roofline, concurrent transfers share the link,
 * ops on a queue run in order, waits stall a queue until the awaited record, sync and sleep
 * move the virtual clock; plus budgets, missing figures, deadlock reports and determinism. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/alloc.h"
#include "ferry/exec.h"
#include "ferry/fault.h"
#include "ferry/quant.h"
#include "ferry/hw.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "runtime/exec/exec_impl.h"
#include "testutil.h"

/* GPU: 1000 B/ns memory, fp32 100 TFLOP/s (1e5 flop/ns), fp16 1000 TFLOP/s, launch 1000 ns,
 * gemm efficiency 0.5, gemv 0.8, others 1. Link: h2d 10 B/ns, d2h 5 B/ns, pageable 2.5 B/ns,
 * latency 2000 ns, COPY_ENGINES engines. Host DRAM 100 B/ns. Disk 1 B/ns, 50 us, depth 1. */
#define GPU_JSON                                                                                         \
  "\"gpu\": {\"name\": \"G\", \"memory_bytes\": 1073741824, \"mem_bw_gbps\": 1000,"                      \
  " \"peak_tflops\": {\"fp32\": 100, \"fp16\": 1000}, \"launch_overhead_ns\": 1000,"                     \
  " \"efficiency\": {\"gemm\": 0.5, \"gemv\": 0.8, \"attention\": 1, \"elementwise\": 1, \"dequantize\": 1}}"
#define LINK_JSON(engines)                                                                               \
  "\"link\": {\"name\": \"L\", \"h2d_gbps\": 10, \"d2h_gbps\": 5, \"pageable_h2d_gbps\": 2.5,"            \
  " \"latency_ns\": 2000, \"copy_engines\": " #engines "}"
#define HOST_JSON "\"host\": {\"name\": \"H\", \"dram_gbps\": 100, \"cpu_gflops\": 1, \"memory_bytes\": 1073741824}"
#define DISK_JSON "\"disk\": {\"name\": \"D\", \"read_gbps\": 1, \"latency_ns\": 50000, \"queue_depth\": 1}"

static char *tmp;

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("exec_sim");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

static ferry_hw *profile(const char *name, const char *sections) {
  char path[512], text[4096];
  snprintf(path, sizeof path, "%s/%s.json", tmp, name);
  const int n = snprintf(text, sizeof text, "{\"name\": \"%s\", \"kind\": \"gpu\", %s}", name, sections);
  assert_true(n > 0 && (size_t)n < sizeof text);
  tu_write_file(path, text, strlen(text));
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  return hw;
}

/* A sim executor of hw, which it closes (the executor keeps its own copy of the figures). */
static ferry_exec *make_sim_of(ferry_hw *hw, const struct ferry_exec_config *cfg) {
  struct ferry_exec_config def = {.lock_host_memory = 1};
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, cfg ? cfg : &def), FERRY_OK);
  ferry_hw_close(hw);
  return ex;
}

static ferry_exec *make_sim(int engines, const struct ferry_exec_config *cfg) {
  return make_sim_of(engines == 1 ? profile("round1", GPU_JSON ", " LINK_JSON(1) ", " HOST_JSON ", " DISK_JSON)
                                  : profile("round2", GPU_JSON ", " LINK_JSON(2) ", " HOST_JSON ", " DISK_JSON),
                     cfg);
}

/* Activities recorded by the sink. */
struct log {
  struct ferry_activity a[256];
  int n;
};

static void sink(void *user, const struct ferry_activity *act) {
  struct log *l = user;
  if (act->kind == FERRY_ACT_MEMORY) return;
  assert_true(l->n < 256);
  l->a[l->n++] = *act;
}

static const struct ferry_activity *find(const struct log *l, enum ferry_activity_kind kind, int32_t queue, int nth) {
  for (int i = 0; i < l->n; i++)
    if (l->a[i].kind == kind && l->a[i].queue == queue && nth-- == 0) return &l->a[i];
  fail_msg("no activity %d of kind %d on queue %d", nth, kind, queue);
  return NULL;
}

static struct ferry_ref ref(ferry_buf *b) { return (struct ferry_ref){b, 0, FERRY_DTYPE_U8}; }

static void test_copy_closed_form(void **state) {
  (void)state;
  ferry_exec *ex = make_sim(2, NULL);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  assert_string_equal(ferry_exec_name(ex), "sim");
  assert_int_equal(ferry_exec_has_data(ex), 0);
  int32_t qh, qd;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd), FERRY_OK);
  ferry_buf *host, *dev;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1000000, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1000000, "d", &dev), FERRY_OK);
  assert_null(ferry_exec_buf_host_ptr(ex, host)); /* accounting only */
  ferry_event *ev;
  assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
  /* h2d: 2000 + 1e6 / 10 */
  assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qh, ev), FERRY_OK);
  assert_int_equal(ferry_exec_query(ex, ev), 0);
  assert_int_equal(ferry_exec_now(ex), 0); /* enqueueing takes no virtual time */
  assert_int_equal(ferry_exec_sync(ex, ev), FERRY_OK);
  assert_int_equal(ferry_exec_query(ex, ev), 1);
  assert_int_equal(ferry_exec_now(ex), 102000);
  const struct ferry_activity *a = find(&log, FERRY_ACT_MEMCPY, qh, 0);
  assert_int_equal(a->start_ns, 0);
  assert_int_equal(a->end_ns, 102000);
  assert_int_equal(a->bytes, 1000000);
  assert_int_equal(a->copy_kind, FERRY_COPY_HTOD);
  /* d2h from t=102000: 2000 + 1e6 / 5 */
  assert_int_equal(ferry_exec_copy(ex, qd, ref(host), ref(dev), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  assert_int_equal(ferry_exec_now(ex), 102000 + 202000);
  a = find(&log, FERRY_ACT_MEMCPY, qd, 0);
  assert_int_equal(a->start_ns, 102000);
  assert_int_equal(a->end_ns, 304000);
  assert_int_equal(ferry_exec_queue_busy_ns(ex, qd), 202000);
  struct ferry_sim_stats ss;
  assert_int_equal(ferry_exec_sim_stats(ex, &ss), FERRY_OK);
  assert_int_equal(ss.copies, 2);
  assert_int_equal(ss.bytes_h2d, 1000000);
  assert_int_equal(ss.bytes_d2h, 1000000);
  assert_int_equal(ss.h2d_busy_ns, 100000); /* bytes flowing, latency excluded */
  assert_int_equal(ss.now_ns, 304000);
  assert_true(ss.events_run >= 4);
  /* copies inside one memory read and write their bytes: 2 x 1e6 / 1000 and 2 x 1e5 / 100 */
  int64_t t0 = ferry_exec_now(ex);
  assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(dev), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  assert_int_equal(ferry_exec_now(ex) - t0, 2000);
  t0 = ferry_exec_now(ex);
  assert_int_equal(ferry_exec_copy(ex, qh, ref(host), ref(host), 100000), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  assert_int_equal(ferry_exec_now(ex) - t0, 2000);
  ferry_exec_event_destroy(ex, ev);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);
}

static void test_pageable_and_disk(void **state) {
  (void)state;
  struct ferry_exec_config cfg = {.lock_host_memory = 0};
  ferry_exec *ex = make_sim(1, &cfg);
  int32_t qh, qk1, qk2;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &qk1), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &qk2), FERRY_OK);
  ferry_buf *host, *dev;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 2000000, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1000000, "d", &dev), FERRY_OK);
  /* pageable host memory: 2000 + 1e6 / 2.5 */
  assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  assert_int_equal(ferry_exec_now(ex), 402000);
  /* disk, queue depth 1: two reads on two queues run one after the other, 50000 + 1e6 each */
  int64_t t0 = ferry_exec_now(ex);
  ferry_event *e1, *e2;
  assert_int_equal(ferry_exec_event_create(ex, &e1), FERRY_OK);
  assert_int_equal(ferry_exec_event_create(ex, &e2), FERRY_OK);
  assert_int_equal(ferry_exec_read(ex, qk1, NULL, 0, 0, 1000000, ref(host), 0), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qk1, e1), FERRY_OK);
  assert_int_equal(ferry_exec_read(ex, qk2, NULL, 0, 1000000, 1000000, (struct ferry_ref){host, 1000000, FERRY_DTYPE_U8}, 0),
                   FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qk2, e2), FERRY_OK);
  assert_int_equal(ferry_exec_sync(ex, e2), FERRY_OK);
  assert_int_equal(ferry_exec_now(ex) - t0, 2 * 1050000);
  assert_int_equal(e1->done_time_ns - t0, 1050000);
  struct ferry_sim_stats ss;
  assert_int_equal(ferry_exec_sim_stats(ex, &ss), FERRY_OK);
  assert_int_equal(ss.reads, 2);
  assert_int_equal(ss.bytes_disk, 2000000);
  ferry_exec_event_destroy(ex, e1);
  ferry_exec_event_destroy(ex, e2);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);
}

/* The page cache: in the 600 MB of host memory a 424 MB budget leaves, a buffered read of a
 * range read before is a copy within host memory (2 x bytes at 100 GB/s) instead of a disk read
 * (50 us + bytes at 1 GB/s); least recently used ranges leave first; O_DIRECT reads bypass it
 * and a read that drops its pages leaves nothing behind. */
static void test_page_cache(void **state) {
  (void)state;
  struct ferry_exec_config cfg = {.lock_host_memory = 1, .host_budget_bytes = 1073741824 - 600000000};
  ferry_exec *ex = make_sim(1, &cfg);
  int32_t qk;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &qk), FERRY_OK);
  ferry_buf *host;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 300000000 + 2 * FERRY_DIRECT_ALIGN, "h", &host), FERRY_OK);
  const uint64_t MB300 = 300000000;
  struct {
    uint64_t offset;
    unsigned flags;
    int64_t ns; /* expected duration */
  } reads[] = {
      {0, 0, 50000 + 300000000},                         /* A: from disk, cached */
      {0, 0, 6000000},                                   /* A again: 600 MB at 100 GB/s */
      {MB300, 0, 50000 + 300000000},                     /* B: from disk, cached (A and B fill 600 MB) */
      {2 * MB300, 0, 50000 + 300000000},                 /* C: from disk; A, least recently used, leaves */
      {0, 0, 50000 + 300000000},                         /* A: from disk again (B leaves) */
      {2 * MB300, FERRY_READ_DIRECT, 50000 + 300000000}, /* C, O_DIRECT: the disk, though cached */
      {2 * MB300, FERRY_READ_DROP_CACHE, 6000000},       /* C, dropping: served, then dropped */
      {2 * MB300, 0, 50000 + 300000000},                 /* C: gone */
  };
  for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
    int64_t t0 = ferry_exec_now(ex);
    assert_int_equal(ferry_exec_read(ex, qk, NULL, 0, reads[i].offset, MB300, ref(host), reads[i].flags), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    if (ferry_exec_now(ex) - t0 != reads[i].ns)
      fail_msg("read %zu took %lld ns, expected %lld", i, (long long)(ferry_exec_now(ex) - t0), (long long)reads[i].ns);
  }
  struct ferry_sim_stats ss;
  assert_int_equal(ferry_exec_sim_stats(ex, &ss), FERRY_OK);
  assert_int_equal(ss.cache_hits, 2);
  assert_int_equal(ss.cache_misses, 5);
  assert_true(ss.bytes_cache == 2 * MB300);
  ferry_exec_free(ex, host);
  ferry_exec_destroy(ex);
}

/* The activations of the cost-model kernels below, in one device buffer the simulator never
 * touches: every executor checks that a kernel's buffers hold its shape (the contract of
 * kernel_check.c), the simulator included. x at 0, y at 16 MiB. */
static ferry_buf *acts(ferry_exec *ex) {
  ferry_buf *b = NULL;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 32u << 20, "acts", &b), FERRY_OK);
  return b;
}

static struct ferry_kernel matmul(int64_t m, int64_t n, int64_t k, ferry_buf *w, enum ferry_dtype dt, ferry_buf *a) {
  struct ferry_kernel kk;
  memset(&kk, 0, sizeof kk);
  kk.kind = FERRY_K_MATMUL;
  kk.name = "mm";
  kk.layer = kk.expert = -1;
  kk.m = m;
  kk.n = n;
  kk.k = k;
  kk.w = (struct ferry_ref){w, 0, dt};
  kk.x = (struct ferry_ref){a, 0, FERRY_DTYPE_F32};
  kk.y = (struct ferry_ref){a, 16u << 20, FERRY_DTYPE_F32};
  return kk;
}

static void test_compute_roofline_and_order(void **state) {
  (void)state;
  ferry_exec *ex = make_sim(2, NULL);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  int32_t qc;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  ferry_buf *w;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4000000, "w", &w), FERRY_OK);
  ferry_buf *a = acts(ex);
  /* memory-bound gemm (m=4, fp16): bytes 1000*1000*2 + 4*1000*4 + 4*1000*4 = 2032000 streamed at
   * 1000 B/ns x 0.8 (gemv) = 2540 ns, flops 8e6 at 1e6 flop/ns x 0.5 (gemm) = 16 ns;
   * sqrt(16^2 + 2540^2) = 2540.05 -> 2541 + 1000 launch */
  struct ferry_kernel k1 = matmul(4, 1000, 1000, w, FERRY_DTYPE_F16, a);
  /* gemv (m=1, fp16): bytes 2000000 + 4000 + 4000 = 2008000 -> 2510 ns, flops 4 ns: 2511 + 1000 */
  struct ferry_kernel k2 = matmul(1, 1000, 1000, w, FERRY_DTYPE_F16, a);
  /* compute-bound gemm (m=1000, fp32): flops 2e9 at 1e5 x 0.5 = 40000 ns, bytes 12e6 at 800
   * B/ns = 15000 ns: sqrt(40000^2 + 15000^2) = 42720.02 -> 42721 + 1000 */
  struct ferry_kernel k3 = matmul(1000, 1000, 1000, w, FERRY_DTYPE_F32, a);
  assert_int_equal(ferry_exec_compute(ex, qc, &k1), FERRY_OK);
  assert_int_equal(ferry_exec_compute(ex, qc, &k2), FERRY_OK);
  assert_int_equal(ferry_exec_compute(ex, qc, &k3), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  const struct ferry_activity *a1 = find(&log, FERRY_ACT_KERNEL, qc, 0), *a2 = find(&log, FERRY_ACT_KERNEL, qc, 1),
                              *a3 = find(&log, FERRY_ACT_KERNEL, qc, 2);
  assert_int_equal(a1->start_ns, 0);
  assert_int_equal(a1->end_ns, 3541);
  assert_int_equal(a2->start_ns, 3541); /* in order: each starts when the one before ends */
  assert_int_equal(a2->end_ns, 3541 + 3511);
  assert_int_equal(a3->start_ns, 7052);
  assert_int_equal(a3->end_ns, 7052 + 43721);
  assert_true(a3->flops == 2e9);
  assert_int_equal(ferry_exec_queue_busy_ns(ex, qc), 3541 + 3511 + 43721);
  assert_int_equal(ferry_exec_now(ex), 50773);
  struct ferry_sim_stats ss;
  assert_int_equal(ferry_exec_sim_stats(ex, &ss), FERRY_OK);
  assert_int_equal(ss.kernels, 3);
  assert_int_equal(ss.compute_busy_ns, 50773);
  ferry_exec_free(ex, w);
  ferry_exec_destroy(ex);
}

/* link.contention: while a link copy's bytes flow, a kernel issued after the copy advances at
 * (1 - contention) of its speed, the same in the exact and the fast mode. Contention 0.25; the
 * copy of 100000 bytes pays 2000 ns of latency then flows over [2000, 12000) at 10 B/ns. */
static void test_link_contention(void **state) {
  (void)state;
  const int modes[2] = {FERRY_SIM_EXACT, FERRY_SIM_FAST};
  for (int mi = 0; mi < 2; mi++) {
    ferry_hw *hw = profile("contended", GPU_JSON ", \"link\": {\"name\": \"L\", \"h2d_gbps\": 10, \"d2h_gbps\": 5,"
                                        " \"latency_ns\": 2000, \"copy_engines\": 1, \"contention\": 0.25}");
    assert_true(ferry_hw_get(hw)->link.contention == 0.25);
    struct ferry_exec_config cfg = {.lock_host_memory = 1, .sim_mode = modes[mi]};
    ferry_exec *ex = NULL;
    assert_int_equal(ferry_exec_create_sim(&ex, hw, &cfg), FERRY_OK);
    ferry_hw_close(hw);
    struct log log = {0};
    ferry_exec_set_sink(ex, sink, &log);
    int32_t qc, qh;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
    ferry_buf *w, *host, *dev;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4000000, "w", &w), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 100000, "h", &host), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 100000, "d", &dev), FERRY_OK);
    ferry_buf *a = acts(ex);
    /* 1. a gemv of 3511 ns alone (test_compute_roofline_and_order) issued after the copy: 2000 ns
     * of its work before the copy flows, the other 1511 at 0.75: 2015 ns -> ends at 4015 */
    struct ferry_kernel gemv = matmul(1, 1000, 1000, w, FERRY_DTYPE_F16, a);
    assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 100000), FERRY_OK);
    assert_int_equal(ferry_exec_compute(ex, qc, &gemv), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    const struct ferry_activity *k = find(&log, FERRY_ACT_KERNEL, qc, 0), *c = find(&log, FERRY_ACT_MEMCPY, qh, 0);
    assert_int_equal(c->start_ns, 0);
    assert_int_equal(c->end_ns, 12000); /* the copy itself is not slowed */
    assert_int_equal(k->start_ns, 0);
    assert_int_equal(k->end_ns, 4015);
    /* 2. a gemm of 43721 ns alone issued after a copy: the copy flows for 10000 ns of it, which
     * cost 0.25 x 10000 = 2500 ns more */
    const int64_t t0 = ferry_exec_now(ex);
    struct ferry_kernel gemm = matmul(1000, 1000, 1000, w, FERRY_DTYPE_F32, a);
    assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 100000), FERRY_OK);
    assert_int_equal(ferry_exec_compute(ex, qc, &gemm), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    k = find(&log, FERRY_ACT_KERNEL, qc, 1);
    assert_int_equal(k->start_ns, t0);
    assert_int_equal(k->end_ns - k->start_ns, 43721 + 2500);
    /* 3. a kernel issued before the copy is not slowed by it (the fast mode times a kernel when
     * it is issued, knowing only the copies issued before) */
    const int64_t t1 = ferry_exec_now(ex);
    assert_int_equal(ferry_exec_compute(ex, qc, &gemv), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 100000), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    k = find(&log, FERRY_ACT_KERNEL, qc, 2);
    assert_int_equal(k->start_ns, t1);
    assert_int_equal(k->end_ns - k->start_ns, 3511);
    assert_int_equal(ferry_exec_queue_busy_ns(ex, qc), 4015 + 43721 + 2500 + 3511);
    ferry_exec_destroy(ex);
  }
}

/* A fitted cost for a kind replaces the roofline for that kind only. */
static void test_fitted_cost(void **state) {
  (void)state;
  ferry_hw *hw = profile("fitted", GPU_JSON ", " LINK_JSON(1)
                         ", \"cost\": {\"matmul\": {\"overhead_ns\": 700, \"ns_per_byte\": 0.001, \"ns_per_flop\": 0.0005, \"roofline\": 1}}");
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
  ferry_hw_close(hw);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  int32_t qc;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  ferry_buf *w;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 6000000, "w", &w), FERRY_OK);
  ferry_buf *a = acts(ex);
  /* matmul m=4 fp16: 2032000 bytes, 8e6 flops: 700 + max(2032, 4000) */
  struct ferry_kernel k1 = matmul(4, 1000, 1000, w, FERRY_DTYPE_F16, a);
  assert_int_equal(ferry_exec_compute(ex, qc, &k1), FERRY_OK);
  /* an expert over the same shape has no fitted cost: the roofline: bytes 3 x 1000 x 1000 x 2 +
   * 4 x 1000 x 8 + 4 x 1000 x 8 = 6064000 at 800 B/ns = 7580 ns, flops 2.4e7 at 5e5 = 48 ns:
   * sqrt(48^2 + 7580^2) = 7580.15 -> 7581 + 1000 */
  struct ferry_kernel k2 = k1;
  k2.kind = FERRY_K_EXPERT;
  /* its gate, up and down weights, and four (token, rank) pairs with their scratch */
  static const int32_t tok[4] = {0, 1, 2, 3}, rank[4] = {0, 0, 0, 0};
  k2.aux[0] = (struct ferry_ref){w, 2000000, FERRY_DTYPE_F16};
  k2.aux[1] = (struct ferry_ref){w, 4000000, FERRY_DTYPE_F16};
  k2.aux[2] = (struct ferry_ref){a, 8u << 20, FERRY_DTYPE_F32};
  k2.aux[3] = (struct ferry_ref){a, 10u << 20, FERRY_DTYPE_F32};
  k2.aux[4] = (struct ferry_ref){a, 12u << 20, FERRY_DTYPE_F32};
  k2.top_k = 1;
  k2.ints = tok;
  k2.ints2 = rank;
  k2.n_ints = 4;
  assert_int_equal(ferry_exec_compute(ex, qc, &k2), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  const struct ferry_activity *a1 = find(&log, FERRY_ACT_KERNEL, qc, 0), *a2 = find(&log, FERRY_ACT_KERNEL, qc, 1);
  assert_int_equal(a1->end_ns - a1->start_ns, 4700);
  assert_int_equal(a2->end_ns - a2->start_ns, 8581);
  ferry_exec_free(ex, w);
  ferry_exec_destroy(ex);
}

/* The runtime's host costs: each kernel is issued launch_ns after the host is free (a fast GPU
 * waits for the host), copies cost copy_ns, a step and a layer cost their own host time, the
 * sampled rows row_ns each, and a folded dequantize op nothing at all. */
static void test_runtime_host_costs(void **state) {
  (void)state;
  ferry_hw *hw = profile("runtime", GPU_JSON ", " LINK_JSON(1) ", " HOST_JSON
                         ", \"runtime\": {\"name\": \"R\", \"launch_ns\": 10000, \"copy_ns\": 3000, \"layer_ns\": 7000,"
                         " \"step_ns\": 50000, \"row_ns\": 500, \"fused_dequant\": 1}");
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
  ferry_hw_close(hw);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  int32_t qc, qh;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  ferry_buf *w, *host;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4000000, "w", &w), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1000000, "h", &host), FERRY_OK);
  ferry_buf *a = acts(ex);
  /* a step opens: 50 us of host work; a layer: 7 us more */
  struct ferry_exec_range step = ferry_exec_range_begin(ex, "step", 0, -1, -1);
  assert_int_equal(ferry_exec_now(ex), 50000);
  struct ferry_exec_range layer = ferry_exec_range_begin(ex, "layer", 0, 0, -1);
  assert_int_equal(ferry_exec_now(ex), 57000);
  /* two tiny kernels (1000 ns launch overhead on the GPU, no work): each issued 10 us after the
   * host was free, so the GPU idles between them */
  struct ferry_kernel tiny = matmul(0, 0, 0, w, FERRY_DTYPE_F16, a);
  assert_int_equal(ferry_exec_compute(ex, qc, &tiny), FERRY_OK);
  assert_int_equal(ferry_exec_compute(ex, qc, &tiny), FERRY_OK);
  /* a dequantize op folded into its consumer: no host time, no GPU time */
  struct ferry_kernel dq;
  memset(&dq, 0, sizeof dq);
  dq.kind = FERRY_K_DEQUANTIZE;
  dq.m = 1000, dq.n = 100, dq.k = 100;
  dq.qformat = 4; /* int4, groups of 64: its packed parts in w, as large as the layout says */
  dq.qgroup = 64;
  dq.y = (struct ferry_ref){w, 0, FERRY_DTYPE_F32};
  struct ferry_qlayout lay;
  assert_int_equal(ferry_quant_layout(&(struct ferry_qspec){FERRY_QFORMAT_INT4, 64}, 100, 100, &lay), FERRY_OK);
  for (int p = 0; p < FERRY_QPART_COUNT; p++)
    if (lay.part[p].bytes) dq.aux[p] = (struct ferry_ref){w, 1000000 + (uint64_t)p * 100000, FERRY_DTYPE_U8};
  assert_int_equal(ferry_exec_compute(ex, qc, &dq), FERRY_OK);
  /* the rows of a step's logits: 4 rows x 500 ns on top of the launch */
  struct ferry_kernel rows;
  memset(&rows, 0, sizeof rows);
  rows.kind = FERRY_K_GATHER_ROWS;
  rows.layer = -1; /* the head's gather, of no layer (a layer's gathers of expert rows sample nothing) */
  rows.m = 4;
  static const int32_t row_ids[4] = {0, 1, 2, 3};
  rows.ints = row_ids;
  rows.n_ints = 4;
  rows.x = rows.y = (struct ferry_ref){a, 0, FERRY_DTYPE_F32};
  assert_int_equal(ferry_exec_compute(ex, qc, &rows), FERRY_OK);
  /* a copy: 3 us to issue, then 2000 ns latency + 1000 bytes at 10 B/ns */
  assert_int_equal(ferry_exec_copy(ex, qh, ref(w), ref(host), 1000), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  ferry_exec_range_end(ex, &layer);
  ferry_exec_range_end(ex, &step);
  const struct ferry_activity *k1 = find(&log, FERRY_ACT_KERNEL, qc, 0), *k2 = find(&log, FERRY_ACT_KERNEL, qc, 1),
                              *k3 = find(&log, FERRY_ACT_KERNEL, qc, 2), *k4 = find(&log, FERRY_ACT_KERNEL, qc, 3);
  assert_int_equal(k1->start_ns, 67000);
  assert_int_equal(k1->end_ns, 68000);
  assert_int_equal(k2->start_ns, 77000);
  assert_int_equal(k3->start_ns, 78000); /* the folded op: at once, for nothing */
  assert_int_equal(k3->end_ns, 78000);
  assert_int_equal(k4->start_ns, 77000 + 10000 + 2000);
  const struct ferry_activity *c = find(&log, FERRY_ACT_MEMCPY, qh, 0);
  assert_int_equal(c->start_ns, 89000 + 3000);
  assert_int_equal(c->end_ns, 92000 + 2000 + 100);
  ferry_exec_free(ex, w);
  ferry_exec_free(ex, host);
  ferry_exec_destroy(ex);
}

/* DeepSpeed ZeRO-3's 2022 parameter path (runtime gather_copy, read_after_copy, blocking_copy):
 * a copy to the device also pays its bytes' copy within device memory (the one-rank all-gather,
 * read and written): 2000 + 1e6 x (1/10 + 2/1000) = 104000 ns, and the host waits for it; a
 * disk read is issued only once the copies to the device issued before it are done, not the
 * waits queued behind them; and an executor asked for the fast path runs exact once it has a
 * disk queue. */
static void test_zero3_parameter_path(void **state) {
  (void)state;
  ferry_hw *hw = profile("zero3", GPU_JSON ", " LINK_JSON(1) ", " HOST_JSON ", " DISK_JSON
                         ", \"runtime\": {\"name\": \"Z\", \"fused_dequant\": 1, \"gather_copy\": 1,"
                         " \"read_after_copy\": 1, \"blocking_copy\": 1}");
  struct ferry_exec_config cfg = {.lock_host_memory = 1, .sim_mode = FERRY_SIM_FAST};
  ferry_exec *ex = make_sim_of(hw, &cfg);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  int32_t qh, qd, qk;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &qk), FERRY_OK);
  ferry_buf *host, *dev;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 3000000, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1000000, "d", &dev), FERRY_OK);
  ferry_event *ev;
  assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
  /* d2h 2000 + 1e6 / 5 = 202000 ns, then its record; the h2d queue copies, then waits for it */
  assert_int_equal(ferry_exec_copy(ex, qd, ref(host), ref(dev), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qd, ev), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), (struct ferry_ref){host, 1000000, FERRY_DTYPE_U8}, 1000000),
                   FERRY_OK);
  assert_int_equal(ferry_exec_now(ex), 104000); /* the copy blocks the host (pinned memory too) */
  assert_int_equal(ferry_exec_queue_wait(ex, qh, ev), FERRY_OK);
  /* the read waits for the copy (104000 ns), not for the wait behind it (202000 ns) */
  assert_int_equal(ferry_exec_read(ex, qk, NULL, 0, 0, 1000000, (struct ferry_ref){host, 2000000, FERRY_DTYPE_U8}, 0),
                   FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  const struct ferry_activity *c = find(&log, FERRY_ACT_MEMCPY, qh, 0), *r = find(&log, FERRY_ACT_MEMCPY, qk, 0);
  assert_int_equal(c->start_ns, 0);
  assert_int_equal(c->end_ns, 104000);
  assert_int_equal(r->start_ns, 104000);
  assert_int_equal(r->end_ns, 104000 + 1050000);
  struct ferry_sim_stats ss;
  assert_int_equal(ferry_exec_sim_stats(ex, &ss), FERRY_OK);
  assert_int_equal(ss.mode, FERRY_SIM_EXACT);
  ferry_exec_event_destroy(ex, ev);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);
}

/* One 1 MB copy host to device on a simulated executor of profile hw (closed here): the copy
 * record's start and end and the executor's clock after it. */
static void time_one_h2d_copy(ferry_hw *hw, int pinned, int64_t *start_ns, int64_t *end_ns, int64_t *now_ns) {
  struct ferry_exec_config cfg = {.lock_host_memory = pinned};
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &cfg), FERRY_OK);
  ferry_hw_close(hw);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  int32_t qh;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  ferry_buf *host, *dev;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1000000, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1000000, "d", &dev), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  const struct ferry_activity *c = find(&log, FERRY_ACT_MEMCPY, qh, 0);
  *start_ns = c->start_ns, *end_ns = c->end_ns, *now_ns = ferry_exec_now(ex);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);
}

/* ZeRO-3's split copy (runtime.split_copy): a coalesced fetch's parameters are copied out of the
 * gathered flat buffer once more within device memory, so beside gather_copy each byte pays the
 * link and two device copies (each read and written): 2000 + 1e6 x (1/10 + 4/1000) = 106000 ns;
 * either copy alone 2000 + 1e6 x (1/10 + 2/1000) = 104000 ns; neither 2000 + 1e6 / 10. */
static void test_zero3_split_copy(void **state) {
  (void)state;
  static const struct {
    int gather, split;
    int64_t end_ns;
  } cases[] = {{0, 0, 102000}, {1, 0, 104000}, {0, 1, 104000}, {1, 1, 106000}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char rt[160];
    snprintf(rt, sizeof rt, ", \"runtime\": {\"name\": \"Z\", \"gather_copy\": %d, \"split_copy\": %d}",
             cases[i].gather, cases[i].split);
    char json[1024];
    snprintf(json, sizeof json, "%s%s", GPU_JSON ", " LINK_JSON(1), rt);
    int64_t start, end, now;
    time_one_h2d_copy(profile("split", json), 1, &start, &end, &now);
    assert_int_equal(start, 0);
    assert_int_equal(end, cases[i].end_ns);
  }
}

/* A host whose driver stages each pageable copy with the CPU before its DMA (CUDA under WSL2,
 * host.staged_h2d_gbps): a copy from pageable memory moves at 1 / (1/10 + 1/4) B/ns instead of
 * the link's pageable 2.5: 2000 + 1e6 x (1/10 + 1/4) = 352000 ns; from pinned memory the link's
 * own 10 B/ns: 2000 + 1e6 / 10. */
static void test_staged_pageable_copy(void **state) {
  (void)state;
  for (int pinned = 0; pinned <= 1; pinned++) {
    ferry_hw *hw = profile("wsl", GPU_JSON ", " LINK_JSON(1)
                           ", \"host\": {\"name\": \"H\", \"dram_gbps\": 100, \"cpu_gflops\": 1,"
                           " \"memory_bytes\": 1073741824, \"staged_h2d_gbps\": 4}");
    int64_t start, end, now;
    time_one_h2d_copy(hw, pinned, &start, &end, &now);
    assert_int_equal(now, pinned ? 102000 : 352000);
  }
}

/* Reads of 1 MB by the runtime's disk reader (runtime.read_*), each on a queue of its own, started
 * together on a profile (sim_mode exact or fast); returns when the last ended. */
static int64_t time_reads(ferry_hw *hw, int mode, int n_reads) {
  struct ferry_exec_config cfg = {.lock_host_memory = 1, .sim_mode = mode};
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &cfg), FERRY_OK);
  ferry_hw_close(hw);
  ferry_buf *host;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 2000000, "h", &host), FERRY_OK);
  for (int i = 0; i < n_reads; i++) {
    int32_t qk;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &qk), FERRY_OK);
    assert_int_equal(ferry_exec_read(ex, qk, NULL, 0, (uint64_t)i * 1000000, 1000000,
                                     (struct ferry_ref){host, (uint64_t)i * 1000000, FERRY_DTYPE_U8}, 0),
                     FERRY_OK);
  }
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  const int64_t now = ferry_exec_now(ex);
  ferry_exec_free(ex, host);
  ferry_exec_destroy(ex);
  return now;
}

/* The runtime's disk reader bounds a read's rate: with Q requests of R bytes in flight, each taking
 * the disk's 50 us plus R at 1 B/ns, a read flows at min(1, Q R / (50000 + R)) B/ns after its
 * latency. The disk: depth 3, read-ahead 20000 B; the host: 2 cores.
 * - aio-like (1 thread, 2 requests of 10000 B): 20000 / 60000 = 1/3 B/ns: 50000 + 3e6 ns, on both
 *   timing paths; two such reads at once each keep 1/3 (under their share of 1/2): together 3050000;
 * - page-cache reader (a thread per core, 2 windows each: 4 requests, of which the disk's depth
 *   takes 3, of its 20000-B read-ahead): 60000 / 70000 = 6/7 B/ns: 50000 + 1166667 ns (1e6 x 7/6
 *   rounded up); on a host that gives no cores it is not described: the disk's 50000 + 1e6 ns;
 * - no reader: 50000 + 1e6 ns. */
static void test_disk_reader(void **state) {
  (void)state;
#define HOST_CORES                                                                                    \
  "\"host\": {\"name\": \"H\", \"dram_gbps\": 100, \"cpu_gflops\": 1, \"memory_bytes\": 1073741824,"   \
  " \"cores\": 2}"
#define DISK_RA                                                                                       \
  "\"disk\": {\"name\": \"D\", \"read_gbps\": 1, \"latency_ns\": 50000, \"queue_depth\": 3,"           \
  " \"read_ahead_bytes\": 20000}"
  static const char *const aio = ", \"runtime\": {\"name\": \"A\", \"read_threads\": 1, \"read_depth\": 2,"
                                 " \"read_request_bytes\": 10000}";
  static const char *const paged = ", \"runtime\": {\"name\": \"P\", \"read_threads\": 0, \"read_depth\": 2}";
  const char *machine = GPU_JSON ", " LINK_JSON(1) ", " HOST_CORES ", " DISK_RA;
  const char *coreless = GPU_JSON ", " LINK_JSON(1) ", " HOST_JSON ", " DISK_RA;
  char json[2048];
  /* by hand, then through the profile's own figure */
  const double aio_gbps = 2.0 * 10000 / (50000 + 10000 / 1.0), paged_gbps = 3.0 * 20000 / (50000 + 20000 / 1.0);
  snprintf(json, sizeof json, "%s%s", machine, aio);
  ferry_hw *hw = profile("aio", json);
  assert_true(ferry_hw_disk_read_gbps(ferry_hw_get(hw)) == aio_gbps);
  assert_int_equal(time_reads(hw, FERRY_SIM_EXACT, 1), 50000 + 3000000);
  assert_int_equal(time_reads(profile("aio", json), FERRY_SIM_FAST, 1), 50000 + 3000000);
  assert_int_equal(time_reads(profile("aio", json), FERRY_SIM_EXACT, 2), 50000 + 3000000);
  snprintf(json, sizeof json, "%s%s", machine, paged);
  hw = profile("paged", json);
  assert_true(fabs(ferry_hw_disk_read_gbps(ferry_hw_get(hw)) - paged_gbps) < 1e-12);
  assert_int_equal(time_reads(hw, FERRY_SIM_EXACT, 1), 50000 + 1166667);
  assert_int_equal(time_reads(profile("paged", json), FERRY_SIM_FAST, 1), 50000 + 1166667);
  snprintf(json, sizeof json, "%s%s", coreless, paged);
  hw = profile("coreless", json);
  assert_true(ferry_hw_disk_read_gbps(ferry_hw_get(hw)) == 1.0);
  assert_int_equal(time_reads(hw, FERRY_SIM_EXACT, 1), 50000 + 1000000);
  assert_int_equal(time_reads(profile("plain", machine), FERRY_SIM_EXACT, 1), 50000 + 1000000);
#undef HOST_CORES
#undef DISK_RA
}

/* A runtime that gathers a routed expert's rows one copy at a time (runtime.moe_row_copy,
 * llama.cpp's early-2024 mul_mat_id): an expert over 4 rows is issued 10000 + 6 x 4 x 3000 =
 * 82000 ns after the host is free (a copy in and out per row for each of gate, up and down);
 * without the flag 10000 ns; an expert of one row (a decode step's) copies nothing. */
static void test_moe_row_copy(void **state) {
  (void)state;
  for (int rows = 0; rows <= 1; rows++) {
    ferry_hw *hw = profile("rowcopy", GPU_JSON ", " LINK_JSON(1) ", " HOST_JSON
                           ", \"runtime\": {\"name\": \"R\", \"launch_ns\": 10000, \"copy_ns\": 3000,"
                           " \"fused_dequant\": 1, \"moe_row_copy\": 1}");
    ferry_exec *ex = NULL;
    assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
    ferry_hw_close(hw);
    struct log log = {0};
    ferry_exec_set_sink(ex, sink, &log);
    int32_t qc;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
    ferry_buf *w;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 6000000, "w", &w), FERRY_OK);
    ferry_buf *a = acts(ex);
    const int64_t m = rows ? 4 : 1;
    struct ferry_kernel e = matmul(m, 1000, 1000, w, FERRY_DTYPE_F16, a);
    e.kind = FERRY_K_EXPERT;
    static const int32_t tok[4] = {0, 1, 2, 3}, rank[4] = {0, 0, 0, 0};
    e.aux[0] = (struct ferry_ref){w, 2000000, FERRY_DTYPE_F16};
    e.aux[1] = (struct ferry_ref){w, 4000000, FERRY_DTYPE_F16};
    e.aux[2] = (struct ferry_ref){a, 8u << 20, FERRY_DTYPE_F32};
    e.aux[3] = (struct ferry_ref){a, 10u << 20, FERRY_DTYPE_F32};
    e.aux[4] = (struct ferry_ref){a, 12u << 20, FERRY_DTYPE_F32};
    e.top_k = 1;
    e.ints = tok;
    e.ints2 = rank;
    e.n_ints = m;
    assert_int_equal(ferry_exec_compute(ex, qc, &e), FERRY_OK);
    assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
    assert_int_equal(find(&log, FERRY_ACT_KERNEL, qc, 0)->start_ns, rows ? 10000 + 6 * 4 * 3000 : 10000);
    ferry_exec_free(ex, w);
    ferry_exec_destroy(ex);
  }
}

/* A runtime whose fused low-bit kernels take at most 32 rows (runtime.fused_max_rows, llama.cpp's
 * cuBLAS path for prompt batches in early 2024): a dequantize op told its product reads 16 rows
 * is folded into it (no time); told 64 rows it expands the 1000 x 1000 int4 weight to fp16:
 * 600000 packed + 2e6 fp16 bytes at 1000 B/ns (2600 ns) beside 1.5e6 unpack instructions at
 * 50000 per ns (30 ns): 1000 + ceil(sqrt(2600^2 + 30^2)) = 3601 ns. */
static void test_fused_max_rows(void **state) {
  (void)state;
  ferry_hw *hw = profile("fusedrows", GPU_JSON ", " LINK_JSON(1) ", " HOST_JSON
                         ", \"runtime\": {\"name\": \"R\", \"fused_dequant\": 1, \"fused_max_rows\": 32}");
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
  ferry_hw_close(hw);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  int32_t qc;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  ferry_buf *w;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 8000000, "w", &w), FERRY_OK);
  struct ferry_kernel dq;
  memset(&dq, 0, sizeof dq);
  dq.kind = FERRY_K_DEQUANTIZE;
  dq.layer = dq.expert = -1;
  dq.m = 600000, dq.n = 1000, dq.k = 1000;
  dq.qformat = FERRY_QFORMAT_INT4;
  dq.qgroup = 64;
  dq.y = (struct ferry_ref){w, 0, FERRY_DTYPE_F32};
  struct ferry_qlayout lay;
  assert_int_equal(ferry_quant_layout(&(struct ferry_qspec){FERRY_QFORMAT_INT4, 64}, 1000, 1000, &lay), FERRY_OK);
  for (int p = 0; p < FERRY_QPART_COUNT; p++)
    if (lay.part[p].bytes) dq.aux[p] = (struct ferry_ref){w, 4000000 + (uint64_t)p * 1000000, FERRY_DTYPE_U8};
  dq.dq_rows = 16;
  assert_int_equal(ferry_exec_compute(ex, qc, &dq), FERRY_OK);
  dq.dq_rows = 64;
  assert_int_equal(ferry_exec_compute(ex, qc, &dq), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  const struct ferry_activity *a1 = find(&log, FERRY_ACT_KERNEL, qc, 0), *a2 = find(&log, FERRY_ACT_KERNEL, qc, 1);
  assert_int_equal(a1->end_ns - a1->start_ns, 0);
  assert_int_equal(a2->end_ns - a2->start_ns, 3601);
  ferry_exec_free(ex, w);
  ferry_exec_destroy(ex);
}

static void test_link_sharing(void **state) {
  (void)state;
  /* two copy engines: both transfers flow at once and split 10 B/ns */
  ferry_exec *ex = make_sim(2, NULL);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  int32_t q1, q2;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q1), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q2), FERRY_OK);
  ferry_buf *host, *dev;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1000000, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1000000, "d", &dev), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, q1, ref(dev), ref(host), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, q2, ref(dev), ref(host), 500000), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  /* both at 5 B/ns: the small one ends at 2000 + 500000/5; the big one has 500000 left and
   * then the whole link: + 500000/10 */
  assert_int_equal(find(&log, FERRY_ACT_MEMCPY, q2, 0)->end_ns, 102000);
  assert_int_equal(find(&log, FERRY_ACT_MEMCPY, q1, 0)->end_ns, 152000);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);

  /* one copy engine: the second waits for the first */
  ex = make_sim(1, NULL);
  log.n = 0;
  ferry_exec_set_sink(ex, sink, &log);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q1), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q2), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1000000, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1000000, "d", &dev), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, q1, ref(dev), ref(host), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, q2, ref(dev), ref(host), 500000), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  assert_int_equal(find(&log, FERRY_ACT_MEMCPY, q1, 0)->end_ns, 102000);
  const struct ferry_activity *a = find(&log, FERRY_ACT_MEMCPY, q2, 0);
  assert_int_equal(a->start_ns, 102000); /* got the engine when the first released it */
  assert_int_equal(a->end_ns, 102000 + 52000);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);
}

/* A compute and a copy queue on ex, a 1 MB host buffer and a 4 MB device one. */
static void two_queues(ferry_exec *ex, int32_t *qc, int32_t *qh, ferry_buf **host, ferry_buf **dev) {
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, qc), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, qh), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1000000, "h", host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4000000, "d", dev), FERRY_OK);
}

/* On an idle executor: compute runs kernel A (3541 ns), waits for a copy of host into dev
 * (ending at 102000, recorded as copied), runs kernel B and records computed. */
static void kernel_wait_kernel(ferry_exec *ex, int32_t qc, int32_t qh, ferry_buf *host, ferry_buf *dev,
                               ferry_event *copied, ferry_event *computed) {
  struct ferry_kernel k = matmul(4, 1000, 1000, dev, FERRY_DTYPE_F16, acts(ex));
  assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qh, copied), FERRY_OK);
  assert_int_equal(ferry_exec_queue_wait(ex, qc, copied), FERRY_OK);
  assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qc, computed), FERRY_OK);
}

static void test_wait_orders_queues(void **state) {
  (void)state;
  ferry_exec *ex = make_sim(2, NULL);
  struct log log = {0};
  ferry_exec_set_sink(ex, sink, &log);
  int32_t qc, qh;
  ferry_buf *host, *dev;
  two_queues(ex, &qc, &qh, &host, &dev);
  ferry_event *copied, *computed, *never;
  assert_int_equal(ferry_exec_event_create(ex, &copied), FERRY_OK);
  assert_int_equal(ferry_exec_event_create(ex, &computed), FERRY_OK);
  assert_int_equal(ferry_exec_event_create(ex, &never), FERRY_OK);
  /* waiting for an event never recorded is a no-op */
  assert_int_equal(ferry_exec_queue_wait(ex, qc, never), FERRY_OK);
  assert_int_equal(ferry_exec_sync(ex, never), FERRY_OK);
  kernel_wait_kernel(ex, qc, qh, host, dev, copied, computed);
  /* the copy queue then waits for the compute before its next copy */
  assert_int_equal(ferry_exec_queue_wait(ex, qh, computed), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 1000), FERRY_OK);
  assert_int_equal(ferry_exec_sync(ex, computed), FERRY_OK);
  assert_int_equal(ferry_exec_now(ex), 102000 + 3541);
  assert_int_equal(computed->done_time_ns, 105541);
  assert_int_equal(copied->done_time_ns, 102000);
  const struct ferry_activity *b = find(&log, FERRY_ACT_KERNEL, qc, 1);
  assert_int_equal(b->start_ns, 102000);
  const struct ferry_activity *w = find(&log, FERRY_ACT_SYNC, qc, 0);
  assert_int_equal(w->start_ns, 3541); /* blocked once kernel A was done */
  assert_int_equal(w->end_ns, 102000);
  assert_int_equal(ferry_exec_queue_stall_ns(ex, qc), 102000 - 3541);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  const struct ferry_activity *c = find(&log, FERRY_ACT_MEMCPY, qh, 1);
  assert_int_equal(c->start_ns, 105541);
  assert_int_equal(c->end_ns, 105541 + 2000 + 100);
  assert_int_equal(ferry_exec_queue_stall_ns(ex, qh), 105541 - 102000);
  /* sleep_until moves the clock forward only */
  ferry_exec_sleep_until(ex, 500000);
  assert_int_equal(ferry_exec_now(ex), 500000);
  ferry_exec_sleep_until(ex, 10);
  assert_int_equal(ferry_exec_now(ex), 500000);
  /* sleep_until runs what is due on the way: a copy started at 500000 ends at 602000 */
  assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 1000000), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qh, copied), FERRY_OK);
  ferry_exec_sleep_until(ex, 601999);
  assert_int_equal(ferry_exec_query(ex, copied), 0);
  ferry_exec_sleep_until(ex, 700000);
  assert_int_equal(ferry_exec_query(ex, copied), 1);
  assert_int_equal(copied->done_time_ns, 602000);
  assert_int_equal(ferry_exec_now(ex), 700000);
  ferry_exec_event_destroy(ex, copied);
  ferry_exec_event_destroy(ex, computed);
  ferry_exec_event_destroy(ex, never);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);
}

/* A queue that slept in a wait runs on host.event_wake_ns after the event (the host executor's
 * thread woken by the one that completed it), in both modes; a wait for an event already done
 * costs nothing. */
static void test_event_wake(void **state) {
  (void)state;
  for (int mode = FERRY_SIM_EXACT; mode <= FERRY_SIM_FAST; mode++) {
    ferry_hw *hw = profile("wake", GPU_JSON ", " LINK_JSON(2) ", \"host\": {\"name\": \"H\", \"dram_gbps\": 100, "
                                   "\"cpu_gflops\": 1, \"memory_bytes\": 1073741824, \"event_wake_ns\": 7000}");
    struct ferry_exec_config cfg = {.lock_host_memory = 1, .sim_mode = mode};
    ferry_exec *ex = make_sim_of(hw, &cfg);
    struct log log = {0};
    ferry_exec_set_sink(ex, sink, &log);
    int32_t qc, qh;
    ferry_buf *host, *dev;
    two_queues(ex, &qc, &qh, &host, &dev);
    ferry_event *copied, *computed;
    assert_int_equal(ferry_exec_event_create(ex, &copied), FERRY_OK);
    assert_int_equal(ferry_exec_event_create(ex, &computed), FERRY_OK);
    kernel_wait_kernel(ex, qc, qh, host, dev, copied, computed);
    assert_int_equal(ferry_exec_sync(ex, computed), FERRY_OK);
    assert_int_equal(copied->done_time_ns, 102000);
    assert_int_equal(computed->done_time_ns, 102000 + 7000 + 3541);
    assert_int_equal(find(&log, FERRY_ACT_KERNEL, qc, 1)->start_ns, 109000);
    const struct ferry_activity *w = find(&log, FERRY_ACT_SYNC, qc, 0);
    assert_int_equal(w->start_ns, 3541);
    assert_int_equal(w->end_ns, 109000);
    assert_int_equal(ferry_exec_queue_stall_ns(ex, qc), 109000 - 3541);
    /* the copy is long done when the queue reaches this wait: no sleep, no wake-up */
    struct ferry_kernel k = matmul(4, 1000, 1000, dev, FERRY_DTYPE_F16, acts(ex));
    assert_int_equal(ferry_exec_queue_wait(ex, qc, copied), FERRY_OK);
    assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qc, computed), FERRY_OK);
    assert_int_equal(ferry_exec_sync(ex, computed), FERRY_OK);
    assert_int_equal(find(&log, FERRY_ACT_KERNEL, qc, 2)->start_ns, 112541);
    assert_int_equal(ferry_exec_queue_stall_ns(ex, qc), 109000 - 3541);
    ferry_exec_event_destroy(ex, copied);
    ferry_exec_event_destroy(ex, computed);
    ferry_exec_free(ex, host);
    ferry_exec_free(ex, dev);
    ferry_exec_destroy(ex);
  }
}

static void test_budgets_and_errors(void **state) {
  (void)state;
  struct ferry_exec_config cfg = {.device_budget_bytes = 1000, .host_budget_bytes = 500, .lock_host_memory = 1};
  ferry_exec *ex = make_sim(1, &cfg);
  ferry_buf *a, *b;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 600, "a", &a), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 401, "b", &b), FERRY_ERR_BUDGET);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 400, "b", &b), FERRY_OK);
  uint64_t used, peak;
  ferry_exec_tier_usage(ex, FERRY_TIER_DEVICE, &used, &peak);
  assert_int_equal(used, 1000);
  ferry_exec_free(ex, a);
  ferry_exec_tier_usage(ex, FERRY_TIER_DEVICE, &used, &peak);
  assert_int_equal(used, 400);
  assert_int_equal(peak, 1000);
  ferry_exec_free(ex, b);
  ferry_exec_destroy(ex);

  /* a profile without a disk refuses reads when they are enqueued, naming the figure */
  ferry_hw *hw = profile("nodisk", GPU_JSON ", " LINK_JSON(1));
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
  int32_t qk, qh;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &qk), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 100, "h", &a), FERRY_OK);
  assert_int_equal(ferry_exec_read(ex, qk, NULL, 0, 0, 100, ref(a), 0), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "nodisk has no disk section"));
  assert_int_equal(ferry_exec_copy(ex, qh, ref(a), ref(a), 10), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "host.dram_gbps"));
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK); /* nothing was enqueued */
  ferry_exec_free(ex, a);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);

  /* a link part alone has no GPU */
  assert_int_equal(ferry_hw_open(&hw, "pcie4-x16"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "gpu"));
  ferry_hw_close(hw);
  assert_int_equal(ferry_exec_create_sim(&ex, NULL, NULL), FERRY_ERR_INVALID);

  /* stats of another executor are refused */
  assert_int_equal(ferry_exec_create_host(&ex, NULL), FERRY_OK);
  struct ferry_sim_stats ss;
  assert_int_equal(ferry_exec_sim_stats(ex, &ss), FERRY_ERR_INVALID);
  ferry_exec_destroy(ex);
}

/* The ops whose counts test_*_count_completed check, enqueued in this order so that injected
 * faults meet them in it. */
enum counted { COPIES, KERNELS_READS };

/* COPIES: three copies of 1e6, 2e5 and 3e5 bytes to the device on one queue, then 1e5 back;
 * KERNELS_READS: three kernels and three reads. Under faults (NULL: none); returns what drain
 * said and the run's stats in *out. */
static ferry_status run_counted(int mode, const char *faults, enum counted what, struct ferry_sim_stats *out) {
  if (faults) assert_int_equal(ferry_fault_set(faults), FERRY_OK);
  struct ferry_exec_config cfg = {.lock_host_memory = 1, .sim_mode = mode};
  ferry_exec *ex = make_sim(1, &cfg);
  int32_t q1, q2;
  assert_int_equal(ferry_exec_queue_create(ex, what == COPIES ? FERRY_QUEUE_H2D : FERRY_QUEUE_COMPUTE, &q1), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, what == COPIES ? FERRY_QUEUE_D2H : FERRY_QUEUE_DISK, &q2), FERRY_OK);
  ferry_buf *host, *dev, *a = acts(ex);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1000000, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 2000000, "d", &dev), FERRY_OK);
  ferry_status st = FERRY_OK;
  if (what == COPIES) {
    const uint64_t sizes[3] = {1000000, 200000, 300000};
    for (int i = 0; i < 3; i++) assert_int_equal(ferry_exec_copy(ex, q1, ref(dev), ref(host), sizes[i]), FERRY_OK);
    st = ferry_exec_drain(ex);
    assert_int_equal(ferry_exec_copy(ex, q2, ref(host), ref(dev), 100000), FERRY_OK);
  } else {
    for (int i = 0; i < 3; i++) {
      struct ferry_kernel k = matmul(4, 1000, 1000, dev, FERRY_DTYPE_F16, a);
      assert_int_equal(ferry_exec_compute(ex, q1, &k), FERRY_OK);
      assert_int_equal(ferry_exec_read(ex, q2, NULL, 0, (uint64_t)i * 1000000, 1000000, ref(host), 0), FERRY_OK);
    }
  }
  ferry_status st2 = ferry_exec_drain(ex);
  if (st == FERRY_OK) st = st2;
  assert_int_equal(ferry_exec_sim_stats(ex, out), FERRY_OK);
  ferry_fault_clear();
  ferry_exec_free(ex, a);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);
  return st;
}

/* `copies` counts the copies that completed, as bytes_h2d counts their bytes: the same in both
 * modes, and a copy that failed (an injected device failure, which only the exact mode models)
 * is in neither. */
static void test_copies_count_completed(void **state) {
  (void)state;
  struct ferry_sim_stats exact, fast;
  assert_int_equal(run_counted(FERRY_SIM_EXACT, NULL, COPIES, &exact), FERRY_OK);
  assert_int_equal(run_counted(FERRY_SIM_FAST, NULL, COPIES, &fast), FERRY_OK);
  assert_int_equal(exact.mode, FERRY_SIM_EXACT);
  assert_int_equal(fast.mode, FERRY_SIM_FAST);
  assert_int_equal(exact.copies, 4);
  assert_int_equal(fast.copies, 4);
  assert_int_equal(exact.bytes_h2d, 1500000);
  assert_int_equal(fast.bytes_h2d, 1500000);
  assert_int_equal(fast.now_ns, exact.now_ns);

  /* the second copy's device fails: the run reports it, and three copies completed */
  struct ferry_sim_stats faulty;
  assert_int_equal(run_counted(FERRY_SIM_EXACT, "copy:fail@2", COPIES, &faulty), FERRY_ERR_DEVICE);
  assert_int_equal(faulty.copies, 3);
  assert_int_equal(faulty.bytes_h2d, 1300000);
  assert_int_equal(faulty.bytes_d2h, 100000);
  assert_int_equal(faulty.ops_done, exact.ops_done); /* the failed copy is done all the same */
}

/* `kernels` and `reads` count what completed, as `copies` does: a kernel whose device failed
 * and a read out of attempts are done (the queue goes on) but count in neither. */
static void test_kernels_reads_count_completed(void **state) {
  (void)state;
  struct ferry_sim_stats exact, fast, failed_kernel, failed_read;
  assert_int_equal(run_counted(FERRY_SIM_EXACT, NULL, KERNELS_READS, &exact), FERRY_OK);
  assert_int_equal(run_counted(FERRY_SIM_FAST, NULL, KERNELS_READS, &fast), FERRY_OK);
  assert_int_equal(exact.kernels, 3);
  assert_int_equal(fast.kernels, 3);
  assert_int_equal(exact.reads, 3);
  assert_int_equal(fast.reads, 3);
  assert_int_equal(run_counted(FERRY_SIM_EXACT, "kernel:fail@2", KERNELS_READS, &failed_kernel), FERRY_ERR_DEVICE);
  assert_int_equal(failed_kernel.kernels, 2);
  assert_int_equal(failed_kernel.reads, 3);
  assert_int_equal(run_counted(FERRY_SIM_EXACT, "read:eio@3+", KERNELS_READS, &failed_read), FERRY_ERR_IO);
  assert_int_equal(failed_read.kernels, 3);
  assert_int_equal(failed_read.reads, 2);
  assert_int_equal(failed_read.ops_done, exact.ops_done); /* the failed read is done all the same */
}

/* The public API cannot build a wait cycle (a wait names a generation already enqueued), so
 * forge a wait for a generation that will never be recorded: sync and drain must report a
 * deadlock naming the stuck queue instead of hanging or returning early. */
static void test_deadlock_reported(void **state) {
  (void)state;
  ferry_exec *ex = make_sim(1, NULL);
  int32_t qc;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  ferry_event *ev, *after;
  assert_int_equal(ferry_exec_event_create(ex, &ev), FERRY_OK);
  assert_int_equal(ferry_exec_event_create(ex, &after), FERRY_OK);
  atomic_store(&ev->recorded_gen, 1); /* "recorded" but no RECORD op exists */
  assert_int_equal(ferry_exec_queue_wait(ex, qc, ev), FERRY_OK);
  assert_int_equal(ferry_exec_record(ex, qc, after), FERRY_OK);
  assert_int_equal(ferry_exec_sync(ex, after), FERRY_ERR_INTERNAL);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "deadlock"));
  assert_true(tu_contains(ferry_exec_errmsg(ex), "queue 0 (compute) 2 op(s), waiting since t=0"));
  assert_int_equal(ferry_exec_drain(ex), FERRY_ERR_INTERNAL);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "draining"));
  /* recording the missing generation on another queue releases the stuck one */
  int32_t qh;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  atomic_store(&ev->recorded_gen, 0);
  assert_int_equal(ferry_exec_record(ex, qh, ev), FERRY_OK);
  assert_int_equal(ferry_exec_query(ex, ev), 1);
  assert_int_equal(ferry_exec_sync(ex, after), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  ferry_exec_event_destroy(ex, ev);
  ferry_exec_event_destroy(ex, after);
  ferry_exec_destroy(ex);
}

/* Same ops, same activities, bit for bit. */
static void run_mixed(struct log *log) {
  ferry_exec *ex = make_sim(2, NULL);
  ferry_exec_set_sink(ex, sink, log);
  int32_t qc, q1, q2, qd, qk;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q1), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q2), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &qk), FERRY_OK);
  ferry_buf *host, *dev;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1 << 20, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4 << 20, "d", &dev), FERRY_OK);
  ferry_buf *a = acts(ex);
  ferry_event *ev[4];
  for (int i = 0; i < 4; i++) assert_int_equal(ferry_exec_event_create(ex, &ev[i]), FERRY_OK);
  for (int round = 0; round < 20; round++) {
    uint64_t n = 1000 + (uint64_t)round * 7919;
    assert_int_equal(ferry_exec_read(ex, qk, NULL, 0, 0, n, ref(host), 0), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qk, ev[0]), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, round % 2 ? q1 : q2, ev[0]), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, round % 2 ? q1 : q2, ref(dev), ref(host), n), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, round % 2 ? q1 : q2, ev[1]), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, qc, ev[1]), FERRY_OK);
    struct ferry_kernel k = matmul(1 + round, 1000, 1000, dev, FERRY_DTYPE_F16, a);
    assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qc, ev[2]), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, qd, ev[2]), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, qd, ref(host), ref(dev), 333 * (uint64_t)round + 1), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qd, ev[3]), FERRY_OK);
    if (round % 5 == 4) assert_int_equal(ferry_exec_sync(ex, ev[3]), FERRY_OK);
  }
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  for (int i = 0; i < 4; i++) ferry_exec_event_destroy(ex, ev[i]);
  ferry_exec_free(ex, host);
  ferry_exec_free(ex, dev);
  ferry_exec_destroy(ex);
}

static void test_deterministic(void **state) {
  (void)state;
  static struct log a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  run_mixed(&a);
  run_mixed(&b);
  assert_true(a.n > 100);
  assert_int_equal(a.n, b.n);
  for (int i = 0; i < a.n; i++) {
    const struct ferry_activity *x = &a.a[i], *y = &b.a[i];
    assert_int_equal(x->kind, y->kind);
    assert_string_equal(x->name, y->name);
    assert_int_equal(x->queue, y->queue);
    assert_int_equal(x->start_ns, y->start_ns);
    assert_int_equal(x->end_ns, y->end_ns);
    assert_int_equal(x->bytes, y->bytes);
    assert_memory_equal(&x->flops, &y->flops, sizeof x->flops);
    assert_int_equal(x->correlation_id, y->correlation_id);
  }
  /* and the timeline respects queue order: activities on one queue never overlap */
  for (int32_t q = 0; q < 5; q++) {
    int64_t last_end = -1;
    for (int i = 0; i < a.n; i++) {
      if (a.a[i].queue != q) continue;
      assert_true(a.a[i].start_ns >= last_end);
      assert_true(a.a[i].end_ns >= a.a[i].start_ns);
      last_end = a.a[i].end_ns;
    }
  }
}

/* Steady state allocates nothing: op records, events and resource slots are pooled. */
static void test_no_allocation_per_op(void **state) {
  (void)state;
  ferry_exec *ex = make_sim(2, NULL);
  int32_t qc, qh, qd, qk;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd), FERRY_OK);
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &qk), FERRY_OK);
  ferry_buf *host, *dev;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1 << 20, "h", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4 << 20, "d", &dev), FERRY_OK);
  ferry_buf *a = acts(ex);
  ferry_event *ev[4];
  for (int i = 0; i < 4; i++) assert_int_equal(ferry_exec_event_create(ex, &ev[i]), FERRY_OK);
  uint64_t before = 0;
  for (int round = 0; round < 60; round++) {
    if (round == 10) before = ferry_alloc_count(); /* pools have grown to their high-water mark */
    for (int k = 0; k < 8; k++) {
      assert_int_equal(ferry_exec_read(ex, qk, NULL, 0, 0, 4096, ref(host), 0), FERRY_OK);
      assert_int_equal(ferry_exec_record(ex, qk, ev[0]), FERRY_OK);
      assert_int_equal(ferry_exec_queue_wait(ex, qh, ev[0]), FERRY_OK);
      assert_int_equal(ferry_exec_copy(ex, qh, ref(dev), ref(host), 4096), FERRY_OK);
      assert_int_equal(ferry_exec_record(ex, qh, ev[1]), FERRY_OK);
      assert_int_equal(ferry_exec_queue_wait(ex, qc, ev[1]), FERRY_OK);
      struct ferry_kernel kk = matmul(8, 1000, 1000, dev, FERRY_DTYPE_F16, a);
      assert_int_equal(ferry_exec_compute(ex, qc, &kk), FERRY_OK);
    }
    assert_int_equal(ferry_exec_record(ex, qc, ev[2]), FERRY_OK);
    assert_int_equal(ferry_exec_queue_wait(ex, qd, ev[2]), FERRY_OK);
    assert_int_equal(ferry_exec_copy(ex, qd, ref(host), ref(dev), 1024), FERRY_OK);
    assert_int_equal(ferry_exec_record(ex, qd, ev[3]), FERRY_OK);
    assert_int_equal(ferry_exec_sync(ex, ev[3]), FERRY_OK);
  }
  assert_int_equal(ferry_alloc_count() - before, 0);
  for (int i = 0; i < 4; i++) ferry_exec_event_destroy(ex, ev[i]);
  ferry_exec_destroy(ex); /* frees the buffers too */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_copy_closed_form),      cmocka_unit_test(test_pageable_and_disk),
      cmocka_unit_test(test_compute_roofline_and_order), cmocka_unit_test(test_link_sharing),
      cmocka_unit_test(test_wait_orders_queues),    cmocka_unit_test(test_event_wake),
      cmocka_unit_test(test_budgets_and_errors),
      cmocka_unit_test(test_deadlock_reported),     cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_no_allocation_per_op),  cmocka_unit_test(test_fitted_cost),
      cmocka_unit_test(test_runtime_host_costs),
      cmocka_unit_test(test_zero3_parameter_path), cmocka_unit_test(test_zero3_split_copy), cmocka_unit_test(test_staged_pageable_copy),
      cmocka_unit_test(test_disk_reader),
      cmocka_unit_test(test_moe_row_copy),           cmocka_unit_test(test_fused_max_rows),
      cmocka_unit_test(test_page_cache),
      cmocka_unit_test(test_link_contention),
      cmocka_unit_test(test_copies_count_completed),
      cmocka_unit_test(test_kernels_reads_count_completed),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
