/* Least frequently used eviction: the unprotected slot whose expert has been used the fewest
 * times over the run (ties: the one used longest ago, then the lowest slot). */
#include "common/alloc.h"
#include "ferry/cache_policy.h"

struct lfu {
  uint64_t clock;
  uint64_t *stamp; /* [slot] last use */
  uint64_t *uses;  /* [unit] uses, kept when the unit is evicted */
};

static ferry_status lfu_create(void **state, int32_t n_slots, int32_t n_units) {
  struct lfu *f = ferry__calloc(1, sizeof *f);
  if (f) {
    f->stamp = ferry__calloc((size_t)n_slots, sizeof *f->stamp);
    f->uses = ferry__calloc((size_t)n_units, sizeof *f->uses);
  }
  if (!f || !f->stamp || !f->uses) {
    if (f) ferry_free(f->stamp), ferry_free(f->uses);
    ferry_free(f);
    return FERRY_ERR_NOMEM;
  }
  *state = f;
  return FERRY_OK;
}

static void lfu_free(void *state) {
  struct lfu *f = state;
  ferry_free(f->stamp);
  ferry_free(f->uses);
  ferry_free(f);
}

static void lfu_touch(void *state, int32_t slot, int32_t unit) {
  struct lfu *f = state;
  f->stamp[slot] = ++f->clock;
  f->uses[unit]++;
}

static int32_t lfu_victim(void *state, const int32_t *slot_unit, const uint8_t *is_protected, int32_t n_slots) {
  const struct lfu *f = state;
  int32_t victim = -1;
  for (int32_t s = 0; s < n_slots; s++) {
    if (is_protected[s] || slot_unit[s] < 0) continue;
    if (victim < 0) {
      victim = s;
      continue;
    }
    const uint64_t us = f->uses[slot_unit[s]], uv = f->uses[slot_unit[victim]];
    if (us < uv || (us == uv && f->stamp[s] < f->stamp[victim])) victim = s;
  }
  return victim;
}

const struct ferry_cache_policy_ops ferry__cache_policy_lfu = {
    .version = FERRY_CACHE_POLICY_VERSION,
    .name = "lfu",
    .description = "least frequently used over the run",
    .create = lfu_create,
    .free = lfu_free,
    .touch = lfu_touch,
    .victim = lfu_victim,
};
