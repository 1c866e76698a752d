/* The expert cache: a fixed number of device slots shared by all layers, keyed by
 * (layer, expert), with LRU or LFU eviction among unprotected slots. Ties are broken by the
 * lowest slot index, so the same routing always leaves the same cache contents. The victim
 * order is maintained as uses happen (a list for LRU, a heap for LFU) because a simulated
 * trace inserts hundreds of millions of experts: a scan of every slot per insert was a fifth
 * of a simulation's time. */
#include <string.h>

#include "common/alloc.h"
#include "policy.h"

static size_t unit_of(const struct ferry_expert_cache *c, int32_t slot) {
  return (size_t)c->slot_layer[slot] * (size_t)c->n_experts + (size_t)c->slot_expert[slot];
}

/* ---- LRU: every slot in a list ordered by (stamp, index); a touch moves a slot to the end ---- */

static void lru_unlink(struct ferry_expert_cache *c, int32_t s) {
  int32_t p = c->lru_prev[s], n = c->lru_next[s];
  if (p >= 0) c->lru_next[p] = n;
  else c->lru_head = n;
  if (n >= 0) c->lru_prev[n] = p;
  else c->lru_tail = p;
}

static void lru_append(struct ferry_expert_cache *c, int32_t s) {
  c->lru_prev[s] = c->lru_tail;
  c->lru_next[s] = -1;
  if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = s;
  else c->lru_head = s;
  c->lru_tail = s;
}

/* ---- LFU: a min-heap of slots by (uses of the expert held, stamp, index) ---- */

static uint64_t uses(const struct ferry_expert_cache *c, int32_t s) {
  return c->slot_layer[s] < 0 ? 0 : c->use_count[unit_of(c, s)];
}

static int lfu_before(const struct ferry_expert_cache *c, int32_t a, int32_t b) {
  uint64_t ua = uses(c, a), ub = uses(c, b);
  if (ua != ub) return ua < ub;
  if (c->slot_stamp[a] != c->slot_stamp[b]) return c->slot_stamp[a] < c->slot_stamp[b];
  return a < b;
}

static void heap_set(struct ferry_expert_cache *c, int32_t i, int32_t s) {
  c->heap[i] = s;
  c->heap_pos[s] = i;
}

/* Restore the heap around slot s after its key changed (up or down). */
static void lfu_fix(struct ferry_expert_cache *c, int32_t s) {
  int32_t i = c->heap_pos[s];
  while (i > 0) {
    int32_t p = (i - 1) / 2;
    if (!lfu_before(c, s, c->heap[p])) break;
    heap_set(c, i, c->heap[p]);
    i = p;
  }
  for (;;) {
    int32_t l = 2 * i + 1, best;
    if (l >= c->n_slots) break;
    best = l;
    if (l + 1 < c->n_slots && lfu_before(c, c->heap[l + 1], c->heap[l])) best = l + 1;
    if (!lfu_before(c, c->heap[best], s)) break;
    heap_set(c, i, c->heap[best]);
    i = best;
  }
  heap_set(c, i, s);
}

/* Smallest unprotected slot of the subtree at heap index i, or -1: an unprotected node beats
 * its whole subtree, so only protected nodes are looked through. */
static int32_t lfu_min_unprotected(const struct ferry_expert_cache *c, int32_t i) {
  if (i >= c->n_slots) return -1;
  int32_t s = c->heap[i];
  if (!c->slot_protected[s]) return s;
  int32_t a = lfu_min_unprotected(c, 2 * i + 1), b = lfu_min_unprotected(c, 2 * i + 2);
  if (a < 0) return b;
  if (b < 0) return a;
  return lfu_before(c, a, b) ? a : b;
}

ferry_status ferry__cache_init(struct ferry_expert_cache *c, enum ferry_cache_policy policy, int32_t n_slots,
                               int32_t n_layers, int32_t n_experts) {
  memset(c, 0, sizeof *c);
  c->policy = policy;
  c->n_slots = n_slots > 0 ? n_slots : 0;
  c->n_layers = n_layers;
  c->n_experts = n_experts;
  size_t units = (size_t)n_layers * (size_t)n_experts;
  size_t slots = n_slots > 0 ? (size_t)n_slots : 1;
  c->slot_of = ferry__calloc(units ? units : 1, sizeof *c->slot_of);
  c->use_count = ferry__calloc(units ? units : 1, sizeof *c->use_count);
  c->slot_layer = ferry__calloc(slots, sizeof *c->slot_layer);
  c->slot_expert = ferry__calloc(slots, sizeof *c->slot_expert);
  c->slot_stamp = ferry__calloc(slots, sizeof *c->slot_stamp);
  c->slot_protected = ferry__calloc(slots, 1);
  c->lru_prev = ferry__calloc(slots, sizeof *c->lru_prev);
  c->lru_next = ferry__calloc(slots, sizeof *c->lru_next);
  c->heap = ferry__calloc(slots, sizeof *c->heap);
  c->heap_pos = ferry__calloc(slots, sizeof *c->heap_pos);
  if (!c->slot_of || !c->use_count || !c->slot_layer || !c->slot_expert || !c->slot_stamp || !c->slot_protected ||
      !c->lru_prev || !c->lru_next || !c->heap || !c->heap_pos) {
    ferry__cache_free(c);
    return FERRY_ERR_NOMEM;
  }
  for (size_t i = 0; i < units; i++) c->slot_of[i] = -1;
  for (size_t s = 0; s < slots; s++) c->slot_layer[s] = c->slot_expert[s] = -1;
  /* every key starts equal (no uses, stamp 0): index order is both the list and a valid heap */
  c->lru_head = c->lru_tail = -1;
  for (int32_t s = 0; s < c->n_slots; s++) {
    lru_append(c, s);
    heap_set(c, s, s);
  }
  return FERRY_OK;
}

void ferry__cache_free(struct ferry_expert_cache *c) {
  ferry_free(c->slot_of);
  ferry_free(c->use_count);
  ferry_free(c->slot_layer);
  ferry_free(c->slot_expert);
  ferry_free(c->slot_stamp);
  ferry_free(c->slot_protected);
  ferry_free(c->lru_prev);
  ferry_free(c->lru_next);
  ferry_free(c->heap);
  ferry_free(c->heap_pos);
  memset(c, 0, sizeof *c);
}

int32_t ferry__cache_lookup(const struct ferry_expert_cache *c, int32_t layer, int32_t expert) {
  return c->slot_of[(size_t)layer * (size_t)c->n_experts + (size_t)expert];
}

void ferry__cache_touch(struct ferry_expert_cache *c, int32_t slot) {
  c->slot_stamp[slot] = ++c->clock;
  c->use_count[unit_of(c, slot)]++;
  if (c->policy == FERRY_CACHE_LFU) {
    lfu_fix(c, slot); /* a larger key: further down the heap */
  } else {
    lru_unlink(c, slot); /* the newest stamp: the end of the list */
    lru_append(c, slot);
  }
}

int32_t ferry__cache_insert(struct ferry_expert_cache *c, int32_t layer, int32_t expert, int32_t *evicted_layer,
                            int32_t *evicted_expert) {
  int32_t victim = -1;
  if (c->n_filled < c->n_slots) {
    victim = c->n_filled++; /* slots are never emptied: the empty ones are a suffix */
  } else if (c->policy == FERRY_CACHE_LFU) {
    victim = lfu_min_unprotected(c, 0);
  } else {
    for (int32_t s = c->lru_head; s >= 0 && victim < 0; s = c->lru_next[s])
      if (!c->slot_protected[s]) victim = s;
  }
  if (victim < 0) return -1;
  *evicted_layer = c->slot_layer[victim];
  *evicted_expert = c->slot_expert[victim];
  if (*evicted_layer >= 0) c->slot_of[unit_of(c, victim)] = -1;
  c->slot_layer[victim] = layer;
  c->slot_expert[victim] = expert;
  c->slot_of[(size_t)layer * (size_t)c->n_experts + (size_t)expert] = victim;
  if (c->policy == FERRY_CACHE_LFU) lfu_fix(c, victim); /* the uses counted are now the new expert's */
  return victim;
}

void ferry__cache_protect(struct ferry_expert_cache *c, int32_t slot, int on) { c->slot_protected[slot] = (uint8_t)on; }

void ferry__cache_unprotect_all(struct ferry_expert_cache *c) {
  memset(c->slot_protected, 0, c->n_slots > 0 ? (size_t)c->n_slots : 1);
}
