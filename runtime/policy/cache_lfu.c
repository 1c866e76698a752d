/* lfu: evict the least frequently used expert (uses counted over the whole run, kept while an
 * expert is out of the cache), the least recently used among equals. */
#include "common/alloc.h"
#include "policy.h"

struct lfu {
  uint64_t *count; /* per unit */
  uint64_t *stamp; /* per slot: last use */
  uint64_t clock;
};

static ferry_status lfu_create(void **state, const struct ferry_cache_geometry *g) {
  struct lfu *s = ferry__calloc(1, sizeof *s);
  const size_t units = (size_t)g->n_layers * (size_t)g->n_experts;
  if (!s || !(s->count = ferry__calloc(units ? units : 1, sizeof *s->count)) ||
      !(s->stamp = ferry__calloc((size_t)g->n_slots, sizeof *s->stamp))) {
    if (s) ferry_free(s->count);
    ferry_free(s);
    return FERRY_ERR_NOMEM;
  }
  *state = s;
  return FERRY_OK;
}

static void lfu_free(void *state) {
  struct lfu *s = state;
  if (s) {
    ferry_free(s->count);
    ferry_free(s->stamp);
  }
  ferry_free(s);
}

static void lfu_touch(void *state, int32_t slot, int32_t unit) {
  struct lfu *s = state;
  s->stamp[slot] = ++s->clock;
  s->count[unit]++;
}

static int32_t lfu_victim(void *state, const int32_t *slot_unit, const uint8_t *prot, int32_t n) {
  const struct lfu *s = state;
  int32_t v = -1;
  for (int32_t i = 0; i < n; i++) {
    if (slot_unit[i] < 0 || prot[i]) continue;
    if (v < 0) {
      v = i;
      continue;
    }
    const uint64_t ci = s->count[slot_unit[i]], cv = s->count[slot_unit[v]];
    if (ci < cv || (ci == cv && s->stamp[i] < s->stamp[v])) v = i;
  }
  return v;
}

const struct ferry_cache_policy_ops ferry__cache_policy_lfu = {
    .version = FERRY_CACHE_POLICY_VERSION,
    .name = "lfu",
    .description = "least frequently used (run-long counts), least recent among equals",
    .create = lfu_create,
    .free = lfu_free,
    .touch = lfu_touch,
    .victim = lfu_victim,
};
