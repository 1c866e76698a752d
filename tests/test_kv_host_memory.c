/* The host KV cache's memory kind apart from the weights' (--kv-host-memory, ferry_exec_alloc_host(),
 * ferry_engine_config::kv_host_memory). A host-tier buffer carries its kind; the host executor
 * computes the same logits whatever the kind; the simulator prices a copy to the device by its
 * source buffer's kind: on a pinned run a pageable buffer's copy holds the link for bytes / the
 * profile's pageable rate (or the staged formula of a host with host.staged_h2d_gbps) and the
 * host waits for it, while copies from pinned buffers keep the pinned rate and run as before;
 * its bytes_h2d counts each copy's own bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/activity.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

static char *dir, *dense_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("kvhostmem");
  struct ferry_gen_options go = {.seed = 5};
  dense_dir = tu_gen_model(dir, "tiny-dense", "dense", &go);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(dense_dir);
  return 0;
}

/* ferry_exec_alloc_host(): the kind asked for, the configuration's by default, on the host
 * executor and the simulator alike; an unknown kind is refused. */
static void test_alloc_kinds(void **state) {
  (void)state;
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  for (int sim = 0; sim < 2; sim++)
    for (int lock = 0; lock < 2; lock++) {
      ferry_exec *ex = NULL;
      const struct ferry_exec_config xc = {.lock_host_memory = lock, .compute_threads = 1};
      assert_int_equal(sim ? ferry_exec_create_sim(&ex, hw, &xc) : ferry_exec_create_host(&ex, &xc), FERRY_OK);
      ferry_buf *d = NULL, *pin = NULL, *page = NULL, *dflt = NULL, *plain = NULL, *bad = NULL;
      assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 4096, "plain", &plain), FERRY_OK);
      assert_int_equal(ferry_exec_alloc_host(ex, 4096, FERRY_HOST_MEMORY_PINNED, "pinned", &pin), FERRY_OK);
      assert_int_equal(ferry_exec_alloc_host(ex, 4096, FERRY_HOST_MEMORY_PAGEABLE, "pageable", &page), FERRY_OK);
      assert_int_equal(ferry_exec_alloc_host(ex, 4096, FERRY_HOST_MEMORY_DEFAULT, "default", &dflt), FERRY_OK);
      assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4096, "device", &d), FERRY_OK);
      assert_int_equal(ferry_exec_buf_pinned(plain), lock);
      assert_int_equal(ferry_exec_buf_pinned(dflt), lock);
      assert_int_equal(ferry_exec_buf_pinned(pin), 1);
      assert_int_equal(ferry_exec_buf_pinned(page), 0);
      assert_int_equal(ferry_exec_buf_pinned(d), 1);
      assert_int_equal(ferry_exec_buf_tier(page), FERRY_TIER_HOST);
      assert_int_equal(ferry_exec_alloc_host(ex, 4096, (enum ferry_host_memory)7, "bad", &bad), FERRY_ERR_INVALID);
      assert_null(bad);
      ferry_exec_destroy(ex);
    }
  assert_int_equal(ferry_exec_buf_pinned(NULL), 0);
  ferry_hw_close(hw);
}

/* The host executor on a pinned run: the logits with the KV cache pageable, pinned or of the
 * run's kind are the same to the bit, attention on the CPU or on the device. */
static void run_host(struct ferry_engine_config c, struct tu_logit_log *log) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  static const struct ferry_engine_request reqs[] = {{.id = 0, .prompt_tokens = 5, .output_tokens = 6},
                                                     {.id = 1, .prompt_tokens = 9, .output_tokens = 4},
                                                     {.id = 2, .prompt_tokens = 3, .output_tokens = 5}};
  c.on_logits = tu_on_logits;
  c.logits_user = log;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dense_dir), FERRY_OK);
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.lock_host_memory = 1, .compute_threads = 1}),
                   FERRY_OK);
  if (ferry_engine_create(&e, m, s, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, reqs, 3, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

static void test_host_same_logits(void **state) {
  (void)state;
  for (int dev = 0; dev < 2; dev++) {
    struct ferry_engine_config c = {.max_batch = 2, .max_step_tokens = 16, .max_seq_tokens = 16, .seed = 3,
                                    .greedy = 1, .resident_all = 1, .kv_home_host = 1, .kv_attention_device = dev};
    struct tu_logit_log ref = {0}, pin = {0}, page = {0};
    run_host(c, &ref);
    c.kv_host_memory = FERRY_HOST_MEMORY_PINNED;
    run_host(c, &pin);
    c.kv_host_memory = FERRY_HOST_MEMORY_PAGEABLE;
    run_host(c, &page);
    assert_true(ref.n > 0);
    if (pin.n != ref.n || memcmp(pin.v, ref.v, ref.n * sizeof(float))) fail_msg("attention device %d: pinned KV differs", dev);
    if (page.n != ref.n || memcmp(page.v, ref.v, ref.n * sizeof(float)))
      fail_msg("attention device %d: pageable KV differs", dev);
    free(ref.v);
    free(pin.v);
    free(page.v);
  }
}

/* The engine refuses a KV memory kind without a KV cache in host memory, and an unknown kind. */
static void test_engine_refusals(void **state) {
  (void)state;
  ferry_hw *hw = NULL;
  ferry_model *m = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.lock_host_memory = 1}), FERRY_OK);
  struct ferry_engine_config c = {.max_batch = 2, .max_seq_tokens = 64, .resident_all = 1,
                                  .kv_host_memory = FERRY_HOST_MEMORY_PAGEABLE};
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "it needs --kv-home host"));
  c.kv_home_host = 1;
  c.kv_host_memory = (enum ferry_host_memory)9;
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "kv_host_memory 9"));
  ferry_exec_destroy(ex);
  ferry_model_close(m);
  ferry_hw_close(hw);
}

/* Copies to the device on a pinned run, one at a time: the one from a pageable buffer takes
 * latency + bytes / the pageable rate, those from pinned buffers latency + bytes / the pinned
 * rate (the profile's figures by hand); the host waits for the pageable one only. On a host with
 * host.staged_h2d_gbps the pageable rate is the staged formula 1 / (1/link + 1/staged). */
struct copy_log {
  int n;
  int64_t ns[8];
};

static void on_copy(void *user, const struct ferry_activity *a) {
  struct copy_log *l = user;
  if (a->kind == FERRY_ACT_MEMCPY && l->n < 8) l->ns[l->n++] = a->end_ns - a->start_ns;
}

static void check_copy_rates(const char *profile) {
  ferry_hw *hw = NULL;
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_hw_open(&hw, profile), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  const double pinned = p->link.h2d_gbps;
  const double pageable = p->has_host && p->host.staged_h2d_gbps > 0
                              ? 1.0 / (1.0 / p->link.h2d_gbps + 1.0 / p->host.staged_h2d_gbps)
                              : p->link.pageable_h2d_gbps;
  assert_true(pageable > 0 && pageable < pinned);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.lock_host_memory = 1}), FERRY_OK);
  struct copy_log log = {0};
  ferry_exec_set_sink(ex, on_copy, &log);
  const uint64_t bytes = 64ull << 20;
  ferry_buf *d = NULL, *w = NULL, *kv = NULL;
  int32_t q = -1;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, bytes, "scratch", &d), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, bytes, "weights", &w), FERRY_OK);
  assert_int_equal(ferry_exec_alloc_host(ex, bytes, FERRY_HOST_MEMORY_PAGEABLE, "KV", &kv), FERRY_OK);
  const struct ferry_ref dst = {d, 0, FERRY_DTYPE_U8};
  int64_t t0 = ferry_exec_now(ex);
  assert_int_equal(ferry_exec_copy(ex, q, dst, (struct ferry_ref){w, 0, FERRY_DTYPE_U8}, bytes), FERRY_OK);
  const int64_t after_pinned = ferry_exec_now(ex) - t0;
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  t0 = ferry_exec_now(ex);
  assert_int_equal(ferry_exec_copy(ex, q, dst, (struct ferry_ref){kv, 0, FERRY_DTYPE_U8}, bytes), FERRY_OK);
  const int64_t after_pageable = ferry_exec_now(ex) - t0;
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, q, dst, (struct ferry_ref){w, 0, FERRY_DTYPE_U8}, bytes), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  assert_int_equal(log.n, 3);
  const double lat = p->link.latency_ns;
  const double want_pinned = lat + (double)bytes / pinned, want_pageable = lat + (double)bytes / pageable;
  for (int i = 0; i < 3; i++) {
    const double want = i == 1 ? want_pageable : want_pinned;
    if (fabs((double)log.ns[i] - want) > 2.0)
      fail_msg("%s: copy %d took %lld ns, %.1f expected (%s rate)", profile, i, (long long)log.ns[i], want,
               i == 1 ? "pageable" : "pinned");
  }
  /* the host returns from the pageable copy once it is done, from the pinned one at once */
  if (!(after_pageable >= log.ns[1] && after_pinned < log.ns[0]))
    fail_msg("%s: the host waited %lld ns for the pageable copy (%lld ns), %lld for the pinned one", profile,
             (long long)after_pageable, (long long)log.ns[1], (long long)after_pinned);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
}

static void test_sim_copy_rates(void **state) {
  (void)state;
  check_copy_rates("h100-pcie");      /* link.pageable_h2d_gbps */
  check_copy_rates("rtx-3090-ti-wsl"); /* host.staged_h2d_gbps */
}

/* The engine in the simulator, llama-2-7b on h100-pcie, a pinned run with --kv-attention device
 * (the cached rows of every step's sequences copied up, nothing else host to device: resident
 * weights): per step, the host-to-device copies' time is latency per copy + the cached rows'
 * bytes / the pageable rate with the cache pageable, / the pinned rate with it pinned; a cache
 * of the run's kind is the run without the option, to the nanosecond. */
struct step_copies {
  int64_t ns[64], n[64];
  uint64_t bytes[64];
  uint64_t all_bytes; /* every copy to the device, the load's included */
};

static void on_step_copy(void *user, const struct ferry_activity *a) {
  struct step_copies *s = user;
  if (a->kind != FERRY_ACT_MEMCPY || a->copy_kind != FERRY_COPY_HTOD) return;
  s->all_bytes += a->bytes;
  if (a->step < 0 || a->step >= 64) return;
  s->ns[a->step] += a->end_ns - a->start_ns;
  s->n[a->step]++;
  s->bytes[a->step] += a->bytes;
}

/* sc NULL: no activity sink; stats NULL: not read. */
static void run_sim_kv_mode(enum ferry_host_memory kind, int attention_device, struct step_copies *sc,
                            struct ferry_serve_summary *sum, uint64_t budget, enum ferry_sim_mode mode,
                            struct ferry_sim_stats *stats) {
  ferry_hw *hw = NULL;
  ferry_model *m = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  static const struct ferry_engine_request reqs[] = {{.id = 0, .prompt_tokens = 100, .output_tokens = 4},
                                                     {.id = 1, .prompt_tokens = 300, .output_tokens = 5}};
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.lock_host_memory = 1,
                                                                                .device_budget_bytes = budget,
                                                                                .sim_mode = mode}),
                   FERRY_OK);
  if (sc) {
    memset(sc, 0, sizeof *sc);
    ferry_exec_set_sink(ex, on_step_copy, sc);
  }
  const struct ferry_engine_config c = {.max_batch = 2, .max_step_tokens = 1024, .max_seq_tokens = 320, .seed = 1,
                                        .resident_all = !budget, .block_layers = 1, .kv_home_host = 1,
                                        .kv_attention_device = attention_device, .kv_host_memory = kind,
                                        .device_budget_bytes = budget, .plan_elem_bytes = {2, 0}};
  if (ferry_engine_create(&e, m, NULL, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, reqs, 2, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  ferry_engine_summary(e, sum);
  if (stats) assert_int_equal(ferry_exec_sim_stats(ex, stats), FERRY_OK);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_model_close(m);
  ferry_hw_close(hw);
}

static void run_sim_kv(enum ferry_host_memory kind, int attention_device, struct step_copies *sc,
                       struct ferry_serve_summary *sum, uint64_t budget) {
  run_sim_kv_mode(kind, attention_device, sc, sum, budget, FERRY_SIM_EXACT, NULL);
}

static void test_sim_kv_rows(void **state) {
  (void)state;
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  const double rate[2] = {p->link.pageable_h2d_gbps, p->link.h2d_gbps}, lat = p->link.latency_ns;
  ferry_hw_close(hw);
  struct step_copies *sc = calloc(3, sizeof *sc);
  assert_non_null(sc);
  struct ferry_serve_summary sum[3];
  run_sim_kv(FERRY_HOST_MEMORY_PAGEABLE, 1, &sc[0], &sum[0], 0);
  run_sim_kv(FERRY_HOST_MEMORY_PINNED, 1, &sc[1], &sum[1], 0);
  run_sim_kv(FERRY_HOST_MEMORY_DEFAULT, 1, &sc[2], &sum[2], 0);
  int decode_steps = 0;
  for (int k = 0; k < 2; k++)
    for (int s = 0; s < 64; s++) {
      if (!sc[k].n[s]) continue;
      decode_steps += k == 0;
      /* one copy at a time on the engine's up queue: each alone on the link */
      const double want = lat * (double)sc[k].n[s] + (double)sc[k].bytes[s] / rate[k];
      if (fabs((double)sc[k].ns[s] - want) > (double)sc[k].n[s])
        fail_msg("%s KV, step %d: %lld copies of %llu bytes took %lld ns, %.1f expected", k ? "pinned" : "pageable", s,
                 (long long)sc[k].n[s], (unsigned long long)sc[k].bytes[s], (long long)sc[k].ns[s], want);
    }
  assert_true(decode_steps >= 3);
  assert_true(sum[0].duration_ns > sum[1].duration_ns); /* the slower cache is seen */
  /* the run's own kind: the run without the option */
  assert_memory_equal(&sc[1], &sc[2], sizeof sc[1]);
  assert_int_equal(sum[1].duration_ns, sum[2].duration_ns);
  free(sc);
}

/* Streamed weights beside a pageable cache attended on the CPU (no KV row crosses the link):
 * every copy is a weight block or an activation from pinned memory, and the run is the one
 * without the option to the nanosecond. */
static void test_sim_weights_pinned(void **state) {
  (void)state;
  struct step_copies *sc = calloc(2, sizeof *sc);
  assert_non_null(sc);
  struct ferry_serve_summary sum[2];
  const uint64_t budget = 6ull << 30; /* llama-2-7b's 12.6 GB of fp16 weights stream */
  run_sim_kv(FERRY_HOST_MEMORY_PAGEABLE, 0, &sc[0], &sum[0], budget);
  run_sim_kv(FERRY_HOST_MEMORY_DEFAULT, 0, &sc[1], &sum[1], budget);
  uint64_t up = 0;
  for (int s = 0; s < 64; s++) up += sc[0].bytes[s];
  assert_true(up > (6ull << 30)); /* the blocks did stream */
  assert_memory_equal(&sc[0], &sc[1], sizeof sc[0]);
  assert_int_equal(sum[0].duration_ns, sum[1].duration_ns);
  free(sc);
}

/* The simulator's bytes_h2d is the bytes copied: with a pageable cache beside pinned weights
 * (--kv-attention device: every step's cached rows copied up from the pageable cache) it is the
 * sum of the copies' bytes, and the pinned cache's figure, while the link was held longer (its
 * pageable copies' time, h2d_busy_ns); the same in exact and fast mode, with an activity sink
 * and without one (the fast mode completes ops apart then). test_sim_fast compares the figure
 * of op graphs replayed with the exact mode's. */
static void test_sim_bytes_h2d(void **state) {
  (void)state;
  struct step_copies *sc = calloc(1, sizeof *sc);
  assert_non_null(sc);
  struct ferry_serve_summary sum;
  struct ferry_sim_stats pinned, pageable, quiet;
  static const enum ferry_sim_mode modes[] = {FERRY_SIM_EXACT, FERRY_SIM_FAST};
  for (int i = 0; i < 2; i++) {
    run_sim_kv_mode(FERRY_HOST_MEMORY_PINNED, 1, sc, &sum, 0, modes[i], &pinned);
    const uint64_t pinned_copies = sc->all_bytes;
    run_sim_kv_mode(FERRY_HOST_MEMORY_PAGEABLE, 1, sc, &sum, 0, modes[i], &pageable);
    uint64_t kv_rows = 0; /* the steps' copies: the cached rows, all from the pageable cache */
    for (int s = 0; s < 64; s++) kv_rows += sc->bytes[s];
    assert_true(kv_rows > 0);
    assert_int_equal(sc->all_bytes, pinned_copies); /* the same copies either way */
    if (pageable.bytes_h2d != sc->all_bytes || pinned.bytes_h2d != pinned_copies)
      fail_msg("mode %d: bytes_h2d %llu with the cache pageable, %llu pinned; the copies moved %llu", (int)modes[i],
               (unsigned long long)pageable.bytes_h2d, (unsigned long long)pinned.bytes_h2d,
               (unsigned long long)sc->all_bytes);
    assert_true(pageable.h2d_busy_ns > pinned.h2d_busy_ns); /* the pageable rows held the link longer */
    run_sim_kv_mode(FERRY_HOST_MEMORY_PAGEABLE, 1, NULL, &sum, 0, modes[i], &quiet);
    assert_int_equal(quiet.bytes_h2d, pageable.bytes_h2d);
    assert_int_equal(quiet.h2d_busy_ns, pageable.h2d_busy_ns);
  }
  free(sc);
}

/* The command line: a bad value, and the option without a host KV cache, are clear errors. */
static void test_cli(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferryf(&out, "sim --model llama-2-7b --hw h100-pcie --synthetic n=2 --kv-home host "
                                       "--kv-host-memory locked"),
                   2);
  if (!tu_contains(out, "--kv-host-memory: expected 'pinned' or 'pageable', got 'locked'")) fail_msg("%s", out);
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "sim --model llama-2-7b --hw h100-pcie --synthetic n=2 --kv-host-memory pageable"), 2);
  if (!tu_contains(out, "--kv-host-memory is the memory of a KV cache in host memory: it needs --kv-home host"))
    fail_msg("%s", out);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_kinds),     cmocka_unit_test(test_host_same_logits),
      cmocka_unit_test(test_engine_refusals), cmocka_unit_test(test_sim_copy_rates),
      cmocka_unit_test(test_sim_kv_rows),     cmocka_unit_test(test_sim_weights_pinned),
      cmocka_unit_test(test_sim_bytes_h2d),   cmocka_unit_test(test_cli),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
