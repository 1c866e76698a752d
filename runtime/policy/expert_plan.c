/* The expert cache as the engine drives it, in one place: which routed experts of a layer are
 * hits and which are fetched into which slot (hits first, then misses, experts in index
 * order, so the same routing gives the same ops), and which predicted experts are prefetched
 * (the most voted over the step's tokens, at most a share of the cache per target layer so
 * guesses cannot flush it). The engine turns the answers into executor ops; `ferry predictor
 * eval` replays a routing trace through the same code and counts them, so its figures are the
 * engine's decisions, not a simplified copy of them. Pure: no I/O, no clock. */
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "policy.h"

ferry_status ferry__xplan_init(struct ferry__expert_plan *p, const struct ferry_cache_policy_ops *policy, int32_t n_slots,
                               int32_t per_layer, int32_t n_layers, int32_t n_experts, const int64_t *popularity,
                               int32_t prefetch_depth, int no_reuse) {
  memset(p, 0, sizeof *p);
  p->n_experts = n_experts;
  p->no_reuse = no_reuse;
  /* a share of the cache per target layer: the layers predicted ahead and the running one */
  p->budget = n_slots / ((prefetch_depth > 0 ? prefetch_depth : 1) + 1);
  if (p->budget < 1) p->budget = 1;
  p->prefetched = ferry__calloc(n_slots > 0 ? (size_t)n_slots : 1, 1);
  p->votes = ferry__calloc(n_experts > 0 ? (size_t)n_experts : 1, sizeof *p->votes);
  p->evicted_layer = -1;
  ferry_status st = FERRY_ERR_NOMEM;
  if (!p->prefetched || !p->votes ||
      (st = ferry__cache_init(&p->cache, policy, n_slots, per_layer, n_layers, n_experts, popularity)) != FERRY_OK) {
    ferry__xplan_free(p);
    return st;
  }
  return FERRY_OK;
}

void ferry__xplan_free(struct ferry__expert_plan *p) {
  ferry__cache_free(&p->cache);
  ferry_free(p->prefetched);
  ferry_free(p->votes);
  memset(p, 0, sizeof *p);
}

/* A slot for (layer, expert) chosen by the policy; an evicted expert that was prefetched and
 * never used is a wasted prefetch. */
static int32_t insert(struct ferry__expert_plan *p, int32_t layer, int32_t expert) {
  int32_t el, ee;
  const int32_t slot = ferry__cache_insert(&p->cache, layer, expert, &el, &ee);
  p->evicted_layer = slot >= 0 ? el : -1;
  if (slot >= 0) {
    p->prefetches_wasted += el >= 0 && p->prefetched[slot];
    p->evictions += el >= 0;
    p->prefetched[slot] = 0;
  }
  return slot;
}

ferry_status ferry__xplan_demand(struct ferry__expert_plan *p, int32_t layer, const int32_t *count, const uint8_t *skip,
                                 ferry__xplan_fn fn, void *user) {
  ferry_status st;
  for (int32_t x = 0; !p->no_reuse && x < p->n_experts; x++) {
    if (!count[x]) continue;
    const int32_t slot = ferry__cache_lookup(&p->cache, layer, x);
    if (slot < 0) continue;
    p->hits++;
    if (p->prefetched[slot]) {
      p->prefetched[slot] = 0;
      p->prefetches_used++;
    }
    ferry__cache_touch(&p->cache, slot);
    if ((st = fn(user, layer, x, slot, 0)) != FERRY_OK) return st;
  }
  for (int32_t x = 0; x < p->n_experts; x++) {
    if (!count[x] || (skip && skip[x])) continue;
    int32_t slot = ferry__cache_lookup(&p->cache, layer, x);
    if (slot >= 0 && !p->no_reuse) continue; /* a hit, done above */
    p->evicted_layer = -1;
    if (slot < 0 && (slot = insert(p, layer, x)) < 0)
      return ferry__fail(FERRY_ERR_INTERNAL, "expert cache: every slot is protected");
    p->misses++;
    ferry__cache_touch(&p->cache, slot);
    if ((st = fn(user, layer, x, slot, 1)) != FERRY_OK) return st;
  }
  return FERRY_OK;
}

void ferry__xplan_vote_reset(struct ferry__expert_plan *p) {
  memset(p->votes, 0, (size_t)p->n_experts * sizeof *p->votes);
}

void ferry__xplan_vote(struct ferry__expert_plan *p, const int32_t *ids, int32_t n) {
  for (int32_t i = 0; i < n; i++)
    if (ids[i] >= 0 && ids[i] < p->n_experts) p->votes[ids[i]]++;
}

ferry_status ferry__xplan_prefetch(struct ferry__expert_plan *p, int32_t target, ferry__xplan_fn fn, void *user) {
  for (int32_t issued = 0; issued < p->budget; issued++) {
    int32_t best = -1;
    for (int32_t x = 0; x < p->n_experts; x++)
      if (p->votes[x] > 0 && (best < 0 || p->votes[x] > p->votes[best])) best = x;
    if (best < 0) break;
    p->votes[best] = 0;
    if (ferry__cache_lookup(&p->cache, target, best) >= 0) continue;
    const int32_t slot = insert(p, target, best);
    if (slot < 0) break;
    ferry__cache_touch(&p->cache, slot);
    ferry_status st = fn(user, target, best, slot, 1);
    if (st != FERRY_OK) return st;
    p->prefetched[slot] = 1;
    p->prefetches++;
  }
  return FERRY_OK;
}
