/* auto (the default): a frequency-admitted main area beside a small LRU probation area, with
 * ageing (W-TinyLFU's idea: Einziger, Friedman, Manes, "TinyLFU: A Highly Efficient Cache
 * Admission Policy", ACM TOS 2017). A step of an MoE model sweeps its layers' experts in the
 * same order every time; when they outnumber the slots, recency (LRU) evicts each one just before
 * it is needed again, and plain counting (LFU) keeps rotating experts of equal popularity through
 * the cache. Here an expert enters the main area only when it has been routed more often than the
 * main area's least routed one, so a sweep streams through probation and leaves the main area
 * alone (a static placement when popularity is steady), while a shift in popularity still wins
 * its way in: counts halve every 8 x units uses. Probation holds one layer's experts (at most
 * half the cache), so a layer's misses never evict one another; victims come from probation,
 * least recent first. The admission compares with the main area's least routed expert, kept at the
 * top of a heap (below) instead of found by a scan of every slot per touch. */
#include "common/alloc.h"
#include "policy.h"

struct heap_entry {
  uint64_t stamp; /* the slot's last use */
  uint32_t count; /* the aged count, at heap_now, of the unit seen there */
  int32_t slot;
};

struct autoc {
  int32_t n_slots, main_cap, main_size;
  uint32_t *count;    /* per unit, as of its epoch */
  uint32_t *epoch;    /* per unit: epoch of its count */
  uint64_t *stamp;    /* per slot: last use */
  int32_t *seen;      /* per slot: the unit last touched there (-1: none) */
  uint8_t *in_main;   /* per slot */
  uint64_t clock, epoch_len;
  /* The victim is looked for among the probation slots (not in_main), about one layer's experts,
   * and the main ones that changed expert since their last touch, which only a victim returned
   * by this policy can be: both kept as sets instead of every slot scanned per miss. */
  int32_t *prob, *prob_at; /* the probation slots, and each slot's index there (-1: in main) */
  int32_t n_prob;
  int32_t *stale;          /* main slots returned as victims, maybe holding another expert now */
  uint8_t *is_stale;
  int32_t n_stale;
  /* The main slots in a binary heap on (aged count of the unit seen there, stamp): its top is the
   * admission scan's choice (least routed, least recent among equals; stamps of touched slots
   * differ, so the order is total). A touch only raises keys (its unit's count, its slot's stamp):
   * those slots sift down. Ageing halves every count at an epoch change, which keeps their order
   * but can make two counts equal, so the stamps decide between them: the heap is rebuilt then
   * (every 8 x units touches). */
  struct heap_entry *heap; /* the main slots with their keys (kept here: compared without lookups) */
  int32_t *heap_at;         /* each slot's index in heap (-1: not in main) */
  int32_t n_heap;
  uint64_t heap_now;       /* the epoch the heap is ordered at */
  int32_t *unit_head;      /* per unit: first slot whose seen is it (-1: none) */
  int32_t *seen_next, *seen_prev; /* per slot: the list of slots seeing the same unit */
};

/* unit's count as of epoch now (= clock / epoch_len: worked out once per scan, a division
 * per slot was a tenth of a simulation) */
static uint32_t aged_at(const struct autoc *s, uint64_t now, int32_t unit) {
  const uint64_t d = now - s->epoch[unit];
  return d >= 32 ? 0 : s->count[unit] >> d;
}

/* entry a before entry b: a lower aged count, or the same and an earlier use */
static int heap_less(const struct heap_entry *a, const struct heap_entry *b) {
  return a->count < b->count || (a->count == b->count && a->stamp < b->stamp);
}

/* slot's entry with its key at heap_now */
static struct heap_entry heap_key(const struct autoc *s, int32_t slot) {
  return (struct heap_entry){.stamp = s->stamp[slot], .count = aged_at(s, s->heap_now, s->seen[slot]), .slot = slot};
}

static void heap_place(struct autoc *s, int32_t k, struct heap_entry e) {
  s->heap[k] = e;
  s->heap_at[e.slot] = k;
}

static void heap_down(struct autoc *s, int32_t k) {
  const struct heap_entry e = s->heap[k];
  for (;;) {
    int32_t c = 2 * k + 1;
    if (c >= s->n_heap) break;
    if (c + 1 < s->n_heap && heap_less(&s->heap[c + 1], &s->heap[c])) c++;
    if (!heap_less(&s->heap[c], &e)) break;
    heap_place(s, k, s->heap[c]);
    k = c;
  }
  heap_place(s, k, e);
}

static void heap_up(struct autoc *s, int32_t k) {
  const struct heap_entry e = s->heap[k];
  while (k > 0) {
    const int32_t p = (k - 1) / 2;
    if (!heap_less(&e, &s->heap[p])) break;
    heap_place(s, k, s->heap[p]);
    k = p;
  }
  heap_place(s, k, e);
}

static void heap_build(struct autoc *s) {
  for (int32_t k = s->n_heap / 2 - 1; k >= 0; k--) heap_down(s, k);
}

static void heap_push(struct autoc *s, int32_t slot) {
  heap_place(s, s->n_heap++, heap_key(s, slot));
  heap_up(s, s->n_heap - 1);
}

static void heap_remove(struct autoc *s, int32_t slot) {
  const int32_t k = s->heap_at[slot];
  const struct heap_entry last = s->heap[--s->n_heap];
  s->heap_at[slot] = -1;
  if (k == s->n_heap) return;
  heap_place(s, k, last);
  heap_up(s, k);
  heap_down(s, s->heap_at[last.slot]);
}

/* the list of slots whose seen is unit */
static void seen_link(struct autoc *s, int32_t slot, int32_t unit) {
  s->seen_prev[slot] = -1;
  s->seen_next[slot] = s->unit_head[unit];
  if (s->unit_head[unit] >= 0) s->seen_prev[s->unit_head[unit]] = slot;
  s->unit_head[unit] = slot;
}

static void seen_unlink(struct autoc *s, int32_t slot, int32_t unit) {
  const int32_t p = s->seen_prev[slot], n = s->seen_next[slot];
  if (p >= 0) s->seen_next[p] = n;
  else s->unit_head[unit] = n;
  if (n >= 0) s->seen_prev[n] = p;
}

static void prob_add(struct autoc *s, int32_t slot) {
  s->prob_at[slot] = s->n_prob;
  s->prob[s->n_prob++] = slot;
}

static void prob_remove(struct autoc *s, int32_t slot) {
  const int32_t i = s->prob_at[slot], last = s->prob[--s->n_prob];
  s->prob[i] = last;
  s->prob_at[last] = i;
  s->prob_at[slot] = -1;
}

/* in_main[slot] = on, and the probation set with it */
static void set_main(struct autoc *s, int32_t slot, int on) {
  if (s->in_main[slot] == on) return;
  s->in_main[slot] = (uint8_t)on;
  if (on) prob_remove(s, slot), heap_push(s, slot);
  else prob_add(s, slot), heap_remove(s, slot);
}

static uint32_t aged(const struct autoc *s, int32_t unit) { return aged_at(s, s->clock / s->epoch_len, unit); }

static void auto_free(void *state);

static ferry_status auto_create(void **state, const struct ferry_cache_geometry *g) {
  struct autoc *s = ferry__calloc(1, sizeof *s);
  const int32_t units = g->n_layers * g->n_experts > 0 ? g->n_layers * g->n_experts : 1;
  if (!s) return FERRY_ERR_NOMEM;
  s->n_slots = g->n_slots;
  s->count = ferry__calloc((size_t)units, sizeof *s->count);
  s->epoch = ferry__calloc((size_t)units, sizeof *s->epoch);
  s->unit_head = ferry__calloc((size_t)units, sizeof *s->unit_head);
  s->stamp = ferry__calloc((size_t)g->n_slots, sizeof *s->stamp);
  s->seen = ferry__calloc((size_t)g->n_slots, sizeof *s->seen);
  s->in_main = ferry__calloc((size_t)g->n_slots, 1);
  s->prob = ferry__calloc((size_t)g->n_slots, sizeof *s->prob);
  s->prob_at = ferry__calloc((size_t)g->n_slots, sizeof *s->prob_at);
  s->stale = ferry__calloc((size_t)g->n_slots, sizeof *s->stale);
  s->is_stale = ferry__calloc((size_t)g->n_slots, 1);
  s->heap = ferry__calloc((size_t)g->n_slots, sizeof *s->heap);
  s->heap_at = ferry__calloc((size_t)g->n_slots, sizeof *s->heap_at);
  s->seen_next = ferry__calloc((size_t)g->n_slots, sizeof *s->seen_next);
  s->seen_prev = ferry__calloc((size_t)g->n_slots, sizeof *s->seen_prev);
  if (!s->count || !s->epoch || !s->unit_head || !s->stamp || !s->seen || !s->in_main || !s->prob || !s->prob_at ||
      !s->stale || !s->is_stale || !s->heap || !s->heap_at || !s->seen_next || !s->seen_prev) {
    auto_free(s);
    return FERRY_ERR_NOMEM;
  }
  for (int32_t u = 0; u < units; u++) s->unit_head[u] = -1;
  for (int32_t i = 0; i < g->n_slots; i++) s->seen[i] = -1, s->heap_at[i] = -1, prob_add(s, i);
  int32_t probation = g->n_experts > 0 ? g->n_experts : 1;
  if (probation > g->n_slots / 2) probation = g->n_slots / 2 > 0 ? g->n_slots / 2 : 1;
  s->main_cap = g->n_slots - probation > 0 ? g->n_slots - probation : 0;
  s->epoch_len = 8 * (uint64_t)units;
  *state = s;
  return FERRY_OK;
}

static void auto_free(void *state) {
  struct autoc *s = state;
  if (!s) return;
  ferry_free(s->count);
  ferry_free(s->epoch);
  ferry_free(s->unit_head);
  ferry_free(s->stamp);
  ferry_free(s->seen);
  ferry_free(s->in_main);
  ferry_free(s->prob);
  ferry_free(s->prob_at);
  ferry_free(s->stale);
  ferry_free(s->is_stale);
  ferry_free(s->heap);
  ferry_free(s->heap_at);
  ferry_free(s->seen_next);
  ferry_free(s->seen_prev);
  ferry_free(s);
}

/* After a touch of unit at slot raised their keys: the heap in order again at epoch now. */
static void heap_settle(struct autoc *s, int32_t slot, int32_t unit, uint64_t now) {
  if (now != s->heap_now) { /* ageing: ties may have formed */
    s->heap_now = now;
    for (int32_t k = 0; k < s->n_heap; k++) s->heap[k] = heap_key(s, s->heap[k].slot);
    heap_build(s);
    return;
  }
  int32_t raised = -1, n = 0;
  if (s->heap_at[slot] >= 0) raised = slot, n++, s->heap[s->heap_at[slot]] = heap_key(s, slot);
  for (int32_t i = s->unit_head[unit]; i >= 0; i = s->seen_next[i])
    if (i != slot && s->heap_at[i] >= 0) raised = i, n++, s->heap[s->heap_at[i]] = heap_key(s, i);
  if (n == 1) heap_down(s, s->heap_at[raised]);
  else if (n > 1) heap_build(s); /* one unit in several main slots: rare */
}

static void auto_touch(void *state, int32_t slot, int32_t unit) {
  struct autoc *s = state;
  const uint32_t c = aged(s, unit);
  s->stamp[slot] = ++s->clock;
  s->count[unit] = c < UINT32_MAX ? c + 1 : c;
  s->epoch[unit] = (uint32_t)(s->clock / s->epoch_len);
  heap_settle(s, slot, unit, s->clock / s->epoch_len);
  if (s->seen[slot] != unit) { /* a new expert in this slot: it starts in probation */
    if (s->in_main[slot]) s->main_size--;
    set_main(s, slot, 0);
    if (s->seen[slot] >= 0) seen_unlink(s, slot, s->seen[slot]);
    seen_link(s, slot, unit);
    s->seen[slot] = unit;
  }
  if (s->in_main[slot]) return;
  if (s->main_size < s->main_cap) { /* room in the main area */
    set_main(s, slot, 1);
    s->main_size++;
    return;
  }
  /* admission: only past the main area's least routed expert (the least recent among equals) */
  if (s->n_heap > 0 && s->count[unit] > s->heap[0].count) {
    set_main(s, s->heap[0].slot, 0);
    set_main(s, slot, 1);
  }
}

/* slot i before slot v in the victim order: least recent use, the lower slot on a tie */
static int older(const struct autoc *s, int32_t i, int32_t v) {
  return v < 0 || s->stamp[i] < s->stamp[v] || (s->stamp[i] == s->stamp[v] && i < v);
}

static int32_t auto_victim(void *state, const int32_t *slot_unit, const uint8_t *prot, int32_t n) {
  struct autoc *s = state;
  /* the least recent probation slot: a probation one, or a main one holding another expert than
   * at its last touch (the stale set, pruned of those no longer so) */
  int32_t v = -1;
  for (int32_t j = 0; j < s->n_prob; j++) {
    const int32_t i = s->prob[j];
    if (slot_unit[i] >= 0 && !prot[i] && older(s, i, v)) v = i;
  }
  for (int32_t j = 0; j < s->n_stale;) {
    const int32_t i = s->stale[j];
    if (!s->in_main[i] || s->seen[i] == slot_unit[i]) { /* touched since, or not taken */
      s->is_stale[i] = 0;
      s->stale[j] = s->stale[--s->n_stale];
      continue;
    }
    if (slot_unit[i] >= 0 && !prot[i] && older(s, i, v)) v = i;
    j++;
  }
  if (v < 0) /* every probation slot protected: the least recent of all */
    for (int32_t i = 0; i < n; i++)
      if (slot_unit[i] >= 0 && !prot[i] && older(s, i, v)) v = i;
  /* a main slot given away holds another expert once the cache has filled it */
  if (v >= 0 && s->in_main[v] && !s->is_stale[v]) {
    s->is_stale[v] = 1;
    s->stale[s->n_stale++] = v;
  }
  return v;
}
const struct ferry_cache_policy_ops ferry__cache_policy_auto = {
    .version = FERRY_CACHE_POLICY_VERSION,
    .name = "auto",
    .description = "frequency-admitted main area, LRU probation, ageing (default)",
    .create = auto_create,
    .free = auto_free,
    .touch = auto_touch,
    .victim = auto_victim,
};
