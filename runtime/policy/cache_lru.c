/* Least recently used eviction: the unprotected slot used longest ago (ties: the lowest slot). */
#include "common/alloc.h"
#include "ferry/cache_policy.h"

struct lru {
  uint64_t clock;
  uint64_t stamp[]; /* [slot] last use */
};

static ferry_status lru_create(void **state, int32_t n_slots, int32_t n_units) {
  struct lru *l = ferry__calloc(1, sizeof *l + (size_t)n_slots * sizeof l->stamp[0]);
  *state = l;
  return l ? FERRY_OK : FERRY_ERR_NOMEM;
}

static void lru_free(void *state) { ferry_free(state); }

static void lru_touch(void *state, int32_t slot, int32_t unit) {
  struct lru *l = state;
  l->stamp[slot] = ++l->clock;
}

static int32_t lru_victim(void *state, const int32_t *slot_unit, const uint8_t *is_protected, int32_t n_slots) {
  const struct lru *l = state;
  int32_t victim = -1;
  for (int32_t s = 0; s < n_slots; s++)
    if (!is_protected[s] && slot_unit[s] >= 0 && (victim < 0 || l->stamp[s] < l->stamp[victim])) victim = s;
  return victim;
}

const struct ferry_cache_policy_ops ferry__cache_policy_lru = {
    .version = FERRY_CACHE_POLICY_VERSION,
    .name = "lru",
    .description = "least recently used (default)",
    .create = lru_create,
    .free = lru_free,
    .touch = lru_touch,
    .victim = lru_victim,
};
