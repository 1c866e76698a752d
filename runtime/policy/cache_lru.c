/* lru: evict the least recently used expert. The textbook policy, and the worst one when a step
 * sweeps more experts than the cache holds in the same order every time (each is evicted just
 * before it is needed again). */
#include "common/alloc.h"
#include "policy.h"

struct lru {
  uint64_t *stamp; /* per slot: last use */
  uint64_t clock;
};

static ferry_status lru_create(void **state, const struct ferry_cache_geometry *g) {
  struct lru *s = ferry__calloc(1, sizeof *s);
  if (!s || !(s->stamp = ferry__calloc((size_t)g->n_slots, sizeof *s->stamp))) {
    ferry_free(s);
    return FERRY_ERR_NOMEM;
  }
  *state = s;
  return FERRY_OK;
}

static void lru_free(void *state) {
  struct lru *s = state;
  if (s) ferry_free(s->stamp);
  ferry_free(s);
}

static void lru_touch(void *state, int32_t slot, int32_t unit) {
  (void)unit;
  struct lru *s = state;
  s->stamp[slot] = ++s->clock;
}

static int32_t lru_victim(void *state, const int32_t *slot_unit, const uint8_t *prot, int32_t n) {
  const struct lru *s = state;
  int32_t v = -1;
  for (int32_t i = 0; i < n; i++)
    if (slot_unit[i] >= 0 && !prot[i] && (v < 0 || s->stamp[i] < s->stamp[v])) v = i;
  return v;
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
