/* lru: evict the least recently used expert. The textbook policy, and the worst one when a step
 * sweeps more experts than the cache holds in the same order every time (each is evicted just
 * before it is needed again).
 *
 * The slots are kept in a list from the least to the most recently used (a use moves its slot to
 * the end), so the victim is the first unprotected occupied slot from the front: the few slots
 * the running layer protects are stepped over, instead of every slot scanned per miss (a scan was
 * a fifth of a whole-trace simulation). Slots never used come first, in index order, as the scan
 * by last use with the lowest index on a tie chose them. */
#include "common/alloc.h"
#include "policy.h"

struct lru {
  int32_t *prev, *next; /* per slot: the list, -1 at its ends */
  int32_t head, tail;
};

static ferry_status lru_create(void **state, const struct ferry_cache_geometry *g) {
  struct lru *s = ferry__calloc(1, sizeof *s);
  const size_t n = g->n_slots > 0 ? (size_t)g->n_slots : 1;
  if (!s || !(s->prev = ferry__calloc(n, sizeof *s->prev)) || !(s->next = ferry__calloc(n, sizeof *s->next))) {
    if (s) ferry_free(s->prev);
    ferry_free(s);
    return FERRY_ERR_NOMEM;
  }
  for (int32_t i = 0; i < g->n_slots; i++) s->prev[i] = i - 1, s->next[i] = i + 1 < g->n_slots ? i + 1 : -1;
  s->head = g->n_slots > 0 ? 0 : -1;
  s->tail = g->n_slots - 1;
  *state = s;
  return FERRY_OK;
}

static void lru_free(void *state) {
  struct lru *s = state;
  if (s) {
    ferry_free(s->prev);
    ferry_free(s->next);
  }
  ferry_free(s);
}

static void lru_touch(void *state, int32_t slot, int32_t unit) {
  (void)unit;
  struct lru *s = state;
  if (s->tail == slot) return;
  /* unlink, then append */
  const int32_t p = s->prev[slot], n = s->next[slot];
  if (p >= 0) s->next[p] = n;
  else s->head = n;
  s->prev[n] = p; /* n >= 0: slot is not the tail */
  s->prev[slot] = s->tail;
  s->next[slot] = -1;
  s->next[s->tail] = slot;
  s->tail = slot;
}

static int32_t lru_victim(void *state, const int32_t *slot_unit, const uint8_t *prot, int32_t n) {
  (void)n;
  const struct lru *s = state;
  for (int32_t i = s->head; i >= 0; i = s->next[i])
    if (slot_unit[i] >= 0 && !prot[i]) return i;
  return -1;
}

const struct ferry_cache_policy_ops ferry__cache_policy_lru = {
    .version = FERRY_CACHE_POLICY_VERSION,
    .name = "lru",
    .description = "least recently used",
    .create = lru_create,
    .free = lru_free,
    .touch = lru_touch,
    .victim = lru_victim,
};
