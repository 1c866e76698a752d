/* The expert cache's victim choice against a plain reference (a scan of every slot, as the
 * policy is defined: the first empty slot (none when it is protected), else the unprotected
 * slot with the least recent use (LRU) or the fewest uses of its expert then the least recent
 * use (LFU), lowest index on a tie): long random sequences of lookups, inserts, touches and
 * protections must leave both with the same slots, in both policies, with and without inserts
 * that are never touched. */
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "runtime/policy/policy.h"
#include "testutil.h"

enum { L = 5, E = 7, MAX_SLOTS = 24 };

struct ref {
  int lfu, n_slots;
  int32_t slot_of[L * E], layer[MAX_SLOTS], expert[MAX_SLOTS];
  uint64_t stamp[MAX_SLOTS], uses[L * E], clock;
  int protect[MAX_SLOTS];
};

static int32_t ref_insert(struct ref *r, int32_t l, int32_t x) {
  int32_t v = -1;
  for (int32_t s = 0; s < r->n_slots && v < 0; s++)
    if (r->layer[s] < 0) v = s;
  if (v >= 0 && r->protect[v]) return -1; /* the first empty slot is in use: no room (cache.c) */
  if (v < 0) {
    for (int32_t s = 0; s < r->n_slots; s++) {
      if (r->protect[s]) continue;
      if (v < 0) {
        v = s;
        continue;
      }
      uint64_t us = r->uses[r->layer[s] * E + r->expert[s]], uv = r->uses[r->layer[v] * E + r->expert[v]];
      if (r->lfu ? (us < uv || (us == uv && r->stamp[s] < r->stamp[v])) : r->stamp[s] < r->stamp[v]) v = s;
    }
  }
  if (v < 0) return -1;
  if (r->layer[v] >= 0) r->slot_of[r->layer[v] * E + r->expert[v]] = -1;
  r->layer[v] = l;
  r->expert[v] = x;
  r->slot_of[l * E + x] = v;
  return v;
}

static void ref_touch(struct ref *r, int32_t s) {
  r->stamp[s] = ++r->clock;
  r->uses[r->layer[s] * E + r->expert[s]]++;
}

static void run(int lfu, int n_slots, uint64_t seed, int touch_percent) {
  struct ferry_expert_cache c;
  assert_int_equal(ferry__cache_init(&c, ferry__cache_policy_find(lfu ? "lfu" : "lru"), n_slots, 0, L, E, NULL), FERRY_OK);
  struct ref r;
  memset(&r, 0, sizeof r);
  r.lfu = lfu;
  r.n_slots = n_slots;
  for (int i = 0; i < L * E; i++) r.slot_of[i] = -1;
  for (int i = 0; i < MAX_SLOTS; i++) r.layer[i] = r.expert[i] = -1;
  struct ferry_rng rng;
  ferry__rng_seed(&rng, seed);
  int64_t evictions = 0;
  for (int step = 0; step < 20000; step++) {
    const int32_t l = (int32_t)ferry__rng_below(&rng, L), x = (int32_t)ferry__rng_below(&rng, E);
    const uint64_t what = ferry__rng_below(&rng, 100);
    if (what < 5) { /* protect or release a few slots, as the predictor evaluation does */
      const int32_t s = (int32_t)ferry__rng_below(&rng, (uint64_t)n_slots);
      const int on = (int)ferry__rng_below(&rng, 2);
      ferry__cache_protect(&c, s, on);
      r.protect[s] = on;
      continue;
    }
    if (what < 7) {
      ferry__cache_unprotect_all(&c);
      memset(r.protect, 0, sizeof r.protect);
      continue;
    }
    int32_t got = ferry__cache_lookup(&c, l, x);
    assert_int_equal(got, r.slot_of[l * E + x]);
    if (got < 0) {
      int32_t el = -2, ex = -2;
      got = ferry__cache_insert(&c, l, x, &el, &ex);
      int32_t want = ref_insert(&r, l, x);
      assert_int_equal(got, want);
      if (got < 0) continue;
      evictions += el >= 0;
    }
    if ((int)ferry__rng_below(&rng, 100) < touch_percent) {
      ferry__cache_touch(&c, got);
      ref_touch(&r, got);
    }
  }
  for (int s = 0; s < n_slots; s++) {
    assert_int_equal(c.slot_unit[s] < 0 ? -1 : c.slot_unit[s] / E, r.layer[s]);
    assert_int_equal(c.slot_unit[s] < 0 ? -1 : c.slot_unit[s] % E, r.expert[s]);
  }
  assert_true(evictions > 1000); /* the sequences exercise eviction, not just filling */
  ferry__cache_free(&c);
}

static void test_lru_matches_reference(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 4; seed++) {
    run(0, 6, seed, 100);
    run(0, 17, seed, 90);
  }
}

static void test_lfu_matches_reference(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 4; seed++) {
    run(1, 6, seed, 100);
    run(1, 17, seed, 90);
  }
}

static void test_every_slot_protected(void **state) {
  (void)state;
  for (int lfu = 0; lfu < 2; lfu++) {
    struct ferry_expert_cache c;
    assert_int_equal(ferry__cache_init(&c, ferry__cache_policy_find(lfu ? "lfu" : "lru"), 2, 0, L, E, NULL), FERRY_OK);
    int32_t el, ex;
    for (int i = 0; i < 2; i++) {
      int32_t s = ferry__cache_insert(&c, 0, i, &el, &ex);
      assert_int_equal(s, i);
      assert_int_equal(el, -1);
      ferry__cache_touch(&c, s);
      ferry__cache_protect(&c, s, 1);
    }
    assert_int_equal(ferry__cache_insert(&c, 1, 0, &el, &ex), -1);
    ferry__cache_protect(&c, 0, 0);
    assert_int_equal(ferry__cache_insert(&c, 1, 0, &el, &ex), 0);
    assert_int_equal(el, 0);
    assert_int_equal(ex, 0);
    assert_int_equal(ferry__cache_lookup(&c, 0, 0), -1);
    ferry__cache_free(&c);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lru_matches_reference),
      cmocka_unit_test(test_lfu_matches_reference),
      cmocka_unit_test(test_every_slot_protected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
