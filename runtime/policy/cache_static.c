/* static: the most frequently routed experts are pinned and the rest stream through what slots
 * are left (Fiddler, llama.cpp's per-expert overrides). The hot set comes from a routing trace's
 * counts (--predictor-routing), placed before serving, or from a warm-up window: the first
 * 4 x units uses, counted, then frozen. A reserve of one layer's experts (at most half the
 * cache) streams the others, so a layer's misses never evict one another. */
#include <stdlib.h>

#include "common/alloc.h"
#include "policy.h"

struct ranked {
  uint64_t count;
  int32_t unit;
};

struct stat_state {
  int32_t n_units, n_slots, n_hot;
  uint8_t *hot;     /* per unit: pinned */
  uint64_t *count;  /* per unit: uses (the warm-up's, or the trace's) */
  uint64_t *stamp;  /* per slot: last use */
  int32_t *order;   /* units, most popular first (once frozen) */
  struct ranked *rank; /* scratch for ranking them */
  uint64_t clock, warmup;
  int frozen;
};

static int by_count(const void *a, const void *b) {
  const struct ranked *x = a, *y = b;
  if (x->count != y->count) return x->count > y->count ? -1 : 1;
  return x->unit < y->unit ? -1 : x->unit > y->unit; /* ties: the lower unit, always the same */
}

/* The hot set: the n_hot units used most (rank: scratch of n_units entries). */
static void freeze(struct stat_state *s, struct ranked *rank) {
  for (int32_t u = 0; u < s->n_units; u++) rank[u] = (struct ranked){s->count[u], u};
  qsort(rank, (size_t)s->n_units, sizeof *rank, by_count);
  for (int32_t u = 0; u < s->n_units; u++) s->order[u] = rank[u].unit;
  for (int32_t i = 0; i < s->n_hot && i < s->n_units; i++) s->hot[s->order[i]] = s->count[s->order[i]] > 0;
  s->frozen = 1;
}

static ferry_status static_create(void **state, const struct ferry_cache_geometry *g) {
  struct stat_state *s = ferry__calloc(1, sizeof *s);
  const int32_t units = g->n_layers * g->n_experts > 0 ? g->n_layers * g->n_experts : 1;
  if (!s) return FERRY_ERR_NOMEM;
  s->n_units = units;
  s->n_slots = g->n_slots;
  s->hot = ferry__calloc((size_t)units, 1);
  s->count = ferry__calloc((size_t)units, sizeof *s->count);
  s->order = ferry__calloc((size_t)units, sizeof *s->order);
  s->stamp = ferry__calloc((size_t)g->n_slots, sizeof *s->stamp);
  s->rank = ferry__calloc((size_t)units, sizeof *s->rank);
  if (!s->hot || !s->count || !s->order || !s->stamp || !s->rank) {
    ferry_free(s->rank);
    ferry_free(s->hot);
    ferry_free(s->count);
    ferry_free(s->order);
    ferry_free(s->stamp);
    ferry_free(s);
    return FERRY_ERR_NOMEM;
  }
  int32_t reserve = g->n_experts > 0 ? g->n_experts : 1;
  if (reserve > g->n_slots / 2) reserve = g->n_slots / 2 > 0 ? g->n_slots / 2 : 1;
  s->n_hot = g->n_slots - reserve > 0 ? g->n_slots - reserve : 0;
  s->warmup = 4 * (uint64_t)units;
  if (g->popularity) {
    for (int32_t u = 0; u < units; u++) s->count[u] = g->popularity[u] > 0 ? (uint64_t)g->popularity[u] : 0;
    freeze(s, s->rank);
  }
  *state = s;
  return FERRY_OK;
}

static void static_free(void *state) {
  struct stat_state *s = state;
  if (!s) return;
  ferry_free(s->hot);
  ferry_free(s->count);
  ferry_free(s->order);
  ferry_free(s->stamp);
  ferry_free(s->rank);
  ferry_free(s);
}

static void static_touch(void *state, int32_t slot, int32_t unit) {
  struct stat_state *s = state;
  s->stamp[slot] = ++s->clock;
  if (s->frozen) return;
  s->count[unit]++;
  if (s->clock >= s->warmup) freeze(s, s->rank);
}

/* the least recent of the streamed experts; only when every slot is pinned, of the pinned */
static int32_t static_victim(void *state, const int32_t *slot_unit, const uint8_t *prot, int32_t n) {
  const struct stat_state *s = state;
  int32_t v = -1, any = -1;
  for (int32_t i = 0; i < n; i++) {
    if (slot_unit[i] < 0 || prot[i]) continue;
    if (any < 0 || s->stamp[i] < s->stamp[any]) any = i;
    if (s->hot[slot_unit[i]]) continue;
    if (v < 0 || s->stamp[i] < s->stamp[v]) v = i;
  }
  return v >= 0 ? v : any;
}

static int32_t static_preload(void *state, int32_t *units, int32_t max) {
  const struct stat_state *s = state;
  int32_t n = 0;
  if (!s->frozen) return 0; /* a warm-up finds them while serving */
  for (int32_t i = 0; i < s->n_units && n < max && n < s->n_hot; i++)
    if (s->hot[s->order[i]]) units[n++] = s->order[i];
  return n;
}

const struct ferry_cache_policy_ops ferry__cache_policy_static = {
    .version = FERRY_CACHE_POLICY_VERSION,
    .name = "static",
    .description = "most routed experts pinned (--predictor-routing, else a warm-up)",
    .create = static_create,
    .free = static_free,
    .touch = static_touch,
    .victim = static_victim,
    .preload = static_preload,
};
