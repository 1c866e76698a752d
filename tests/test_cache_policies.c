/* Expert placement policies: LRU thrashes on a sweep longer than the cache, auto and static keep
 * a fixed part of it (scan resistance), static pins what a trace's counts say, auto follows a
 * shift in popularity, per-layer:K evicts within a layer only; and on the host executor every
 * policy leaves the logits of the resident run untouched (they only decide placement). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/model.h"
#include "ferry/store.h"
#include "runtime/policy/policy.h"
#include "testutil.h"

/* Use `unit` through the cache as the engine does: a hit is touched, a miss inserted and touched. */
static int use(struct ferry_expert_cache *c, int32_t unit) {
  const int32_t l = unit / c->n_experts, x = unit % c->n_experts;
  int32_t slot = ferry__cache_lookup(c, l, x);
  const int hit = slot >= 0;
  if (!hit) {
    int32_t el, ex;
    slot = ferry__cache_insert(c, l, x, &el, &ex);
    assert_true(slot >= 0);
  }
  ferry__cache_touch(c, slot);
  return hit;
}

/* Hit rate of `passes` sweeps over every unit of a layers x experts model in order. */
static double sweep(const char *policy, int32_t slots, int32_t layers, int32_t experts, int passes,
                    const int64_t *popularity) {
  struct ferry_expert_cache c;
  assert_int_equal(ferry__cache_init(&c, ferry__cache_policy_find(policy), slots, 0, layers, experts, popularity), FERRY_OK);
  int64_t hits = 0, uses = 0;
  for (int p = 0; p < passes; p++)
    for (int32_t u = 0; u < layers * experts; u++, uses++) hits += use(&c, u);
  ferry__cache_free(&c);
  return (double)hits / (double)uses;
}

/* 8 layers x 8 experts swept in order through 40 slots (a step of a batch touching every
 * expert): LRU never hits, LFU rotates the cache, auto and static keep 32 (40 less a layer's 8). */
static void test_scan_resistance(void **state) {
  (void)state;
  const double lru = sweep("lru", 40, 8, 8, 40, NULL), lfu = sweep("lfu", 40, 8, 8, 40, NULL),
               stat = sweep("static", 40, 8, 8, 40, NULL), aut = sweep("auto", 40, 8, 8, 40, NULL);
  assert_true(lru == 0.0);
  assert_true(aut > 0.45 && aut <= 32.0 / 64.0 + 1e-9); /* 32 of 64 after the first passes */
  assert_true(stat > 0.4 && stat <= 32.0 / 64.0 + 1e-9); /* its warm-up (4 sweeps) hits nothing */
  assert_true(aut > lfu); /* equal counts: LFU's least recent among equals is LRU's victim */
}

/* A trace's counts: static pins the most routed before serving (best first) and never evicts
 * them; the rest stream through the reserve. */
static void test_static_from_counts(void **state) {
  (void)state;
  const int32_t L = 4, E = 8, slots = 16; /* reserve 8: 8 pinned */
  int64_t pop[32];
  for (int32_t u = 0; u < L * E; u++) pop[u] = u % 3 == 0 ? 1000 - u : u; /* units 0, 3, 6, ... hot */
  struct ferry_expert_cache c;
  assert_int_equal(ferry__cache_init(&c, ferry__cache_policy_find("static"), slots, 0, L, E, pop), FERRY_OK);
  int32_t units[16];
  const int32_t n = ferry__cache_preload(&c, units, 16);
  assert_int_equal(n, 8);
  for (int32_t i = 0; i < n; i++) assert_int_equal(units[i], 3 * i); /* 1000, 997, 994, ... */
  for (int32_t i = 0; i < n; i++) use(&c, units[i]);
  for (int r = 0; r < 50; r++)
    for (int32_t u = 0; u < L * E; u++) use(&c, u);
  for (int32_t i = 0; i < n; i++) assert_true(ferry__cache_lookup(&c, units[i] / E, units[i] % E) >= 0);
  ferry__cache_free(&c);
  /* without counts there is nothing to place before serving */
  assert_int_equal(ferry__cache_init(&c, ferry__cache_policy_find("static"), slots, 0, L, E, NULL), FERRY_OK);
  assert_int_equal(ferry__cache_preload(&c, units, 16), 0);
  ferry__cache_free(&c);
}

/* auto: when the routing moves to other experts, they win the main area within a few epochs
 * (counts halve every 8 x units uses); static keeps what its warm-up chose. */
static void test_auto_follows_a_shift(void **state) {
  (void)state;
  const int32_t L = 2, E = 16, slots = 12; /* probation 6, main 6 */
  struct ferry_expert_cache a, s;
  assert_int_equal(ferry__cache_init(&a, ferry__cache_policy_find("auto"), slots, 0, L, E, NULL), FERRY_OK);
  assert_int_equal(ferry__cache_init(&s, ferry__cache_policy_find("static"), slots, 0, L, E, NULL), FERRY_OK);
  /* phase 1: units 0-5 hot (4 sweeps of them per round), the others once per round */
  for (int r = 0; r < 60; r++)
    for (int k = 0; k < 4; k++)
      for (int32_t u = 0; u < L * E; u++)
        if (k == 0 || u < 6) use(&a, u), use(&s, u);
  /* phase 2: units 20-25 hot */
  int64_t hits_a = 0, hits_s = 0;
  for (int r = 0; r < 200; r++)
    for (int k = 0; k < 4; k++)
      for (int32_t u = 0; u < L * E; u++) {
        if (k && (u < 20 || u >= 26)) continue;
        const int ha = use(&a, u), hs = use(&s, u);
        if (r >= 150) hits_a += ha, hits_s += hs;
      }
  for (int32_t u = 20; u < 26; u++) assert_true(ferry__cache_lookup(&a, u / E, u % E) >= 0);
  assert_true(hits_a > hits_s);
  ferry__cache_free(&a);
  ferry__cache_free(&s);
}

/* per-layer:K: each layer evicts only its own K slots. */
static void test_per_layer(void **state) {
  (void)state;
  const int32_t L = 3, E = 8, K = 2;
  struct ferry_expert_cache c;
  assert_int_equal(ferry__cache_init(&c, ferry__cache_policy_find("lru"), K * L, K, L, E, NULL), FERRY_OK);
  for (int r = 0; r < 3; r++)
    for (int32_t l = 0; l < L; l++)
      for (int32_t x = 0; x < 5; x++) use(&c, l * E + x);
  for (int32_t l = 0; l < L; l++) {
    int resident = 0;
    for (int32_t x = 0; x < E; x++) {
      const int32_t slot = ferry__cache_lookup(&c, l, x);
      if (slot < 0) continue;
      resident++;
      assert_true(slot >= l * K && slot < (l + 1) * K); /* in its own slots */
    }
    assert_int_equal(resident, K);
    /* LRU within the layer: its last two */
    assert_true(ferry__cache_lookup(&c, l, 4) >= 0 && ferry__cache_lookup(&c, l, 3) >= 0);
  }
  ferry__cache_free(&c);
}

/* ---- the engine on the host executor ---- */

static char *dir, *moe_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("cache_policies");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 3, .router_skew = 0.8};
  moe_dir = tu_gen_model(dir, "tiny-moe", "moe", &go);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(moe_dir);
  return 0;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 12, .output_tokens = 6}, {.id = 1, .prompt_tokens = 5, .output_tokens = 8},
    {.id = 2, .prompt_tokens = 9, .output_tokens = 5},
};

static void run(struct ferry_engine_config c, uint64_t extra, struct tu_logit_log *log, int64_t *hits) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, moe_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, moe_dir), FERRY_OK);
  if (extra) {
    uint64_t dmin = 0, hmin = 0;
    assert_int_equal(ferry_engine_min_budgets(m, s, &c, &dmin, &hmin), FERRY_OK);
    c.device_budget_bytes = dmin + extra;
  }
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.device_budget_bytes = c.device_budget_bytes,
                                                                             .compute_threads = 1}),
                   FERRY_OK);
  c.on_logits = tu_on_logits;
  c.logits_user = log;
  if (ferry_engine_create(&e, m, s, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, requests, 3, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  struct ferry_serve_summary sum;
  ferry_engine_summary(e, &sum);
  *hits = sum.hits;
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

static void test_engine_policies_keep_logits(void **state) {
  (void)state;
  struct ferry_engine_config base = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 32, .seed = 4,
                                     .block_layers = 1, .prefetch_depth = 1, .resident_attention = 1};
  struct tu_logit_log ref = {0};
  int64_t hits;
  run(base, 0, &ref, &hits);
  int64_t pop[6 * 8];
  for (int i = 0; i < 48; i++) pop[i] = i % 8 < 3 ? 100 : 1;
  const char *names[5] = {"lru", "lfu", "static", "auto", NULL};
  for (int i = 0; i < 6; i++) {
    struct ferry_engine_config c = base;
    c.expert_cache = i < 4 ? names[i] : i == 4 ? "static" : NULL;
    if (i == 4) c.expert_popularity = pop; /* pinned before serving */
    if (i == 5) c.expert_cache_per_layer = 2;
    struct tu_logit_log got = {0};
    run(c, i == 5 ? 13 << 20 : 2 << 20, &got, &hits);
    assert_int_equal(got.n, ref.n);
    assert_memory_equal(got.v, ref.v, ref.n * sizeof(float));
    if (i == 4) assert_true(hits > 0); /* the pinned experts are found from the first step */
    free(got.v);
  }
  free(ref.v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scan_resistance),   cmocka_unit_test(test_static_from_counts),
      cmocka_unit_test(test_auto_follows_a_shift), cmocka_unit_test(test_per_layer),
      cmocka_unit_test(test_engine_policies_keep_logits),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
