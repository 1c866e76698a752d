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
 * least recent first. The admission compares with the main area's least routed expert, kept first
 * in buckets by count (below) instead of found by a scan of every slot per touch. */
#include "common/alloc.h"
#include "policy.h"

struct bucket { /* the main slots of one aged count, least recent first */
  uint32_t count;
  int32_t prev, next; /* the neighbouring buckets, counts ascending (-1: none; next: the free list) */
  int32_t head, tail; /* slots */
};

struct rebuild_key { /* a main slot's place when the buckets are rebuilt */
  uint32_t count;
  int32_t slot;
  uint64_t stamp;
};

struct autoc {
  int32_t n_slots, main_cap, main_size;
  uint32_t *count;    /* per unit, as of its epoch */
  uint32_t *epoch;    /* per unit: epoch of its count */
  uint64_t *stamp;    /* per slot: last use */
  int32_t *seen;      /* per slot: the unit last touched there (-1: none) */
  uint8_t *in_main;   /* per slot */
  uint64_t clock, epoch_len;
  uint64_t epoch_now, epoch_end; /* clock / epoch_len, and the clock that starts the next epoch
                                    (kept as the clock moves: no division per touch) */
  /* The victim is looked for among the probation slots (not in_main), about one layer's experts,
   * and the main ones that changed expert since their last touch, which only a victim returned
   * by this policy can be: both kept as sets instead of every slot scanned per miss. */
  int32_t *prob_next, *prob_prev; /* the probation slots, least recent first (stamp, then slot) */
  int32_t prob_head, prob_tail;
  int32_t *stale;          /* main slots returned as victims, maybe holding another expert now */
  uint8_t *is_stale;
  int32_t n_stale;
  /* The main slots in buckets of their aged count (of the unit seen there), each in order of last
   * use, the buckets in ascending count: the first bucket's first slot is the admission scan's
   * choice (least routed, least recent among equals; stamps of touched slots differ). A touch only
   * raises keys: its slot moves to the next count's tail (its stamp is the newest) in O(1), any
   * other slot of its unit to its place there. Ageing halves every count at an epoch change, which
   * keeps their order but can make two counts equal, so the stamps decide between them: the
   * buckets are rebuilt then (every 8 x units touches). */
  struct bucket *bk;         /* n_slots of them: the used list from first, the rest from free */
  int32_t first, free;
  int32_t *bk_of;            /* per slot: its bucket (-1: not in main) */
  int32_t *bs_next, *bs_prev; /* per slot: its neighbours in its bucket */
  uint64_t main_now;         /* the epoch the buckets are ordered at */
  struct rebuild_key *rkeys; /* n_slots: scratch of main_rebuild() */
  int32_t *unit_head;      /* per unit: first slot whose seen is it (-1: none) */
  int32_t *seen_next, *seen_prev; /* per slot: the list of slots seeing the same unit */
};

/* unit's count as of epoch now (= clock / epoch_len: worked out once per scan, a division
 * per slot was a tenth of a simulation) */
static uint32_t aged_at(const struct autoc *s, uint64_t now, int32_t unit) {
  const uint64_t d = now - s->epoch[unit];
  return d >= 32 ? 0 : s->count[unit] >> d;
}

/* a bucket of count k placed after bucket after (-1: first) */
static int32_t bucket_new(struct autoc *s, int32_t after, uint32_t k) {
  const int32_t b = s->free, n = after >= 0 ? s->bk[after].next : s->first;
  s->free = s->bk[b].next;
  s->bk[b] = (struct bucket){.count = k, .prev = after, .next = n, .head = -1, .tail = -1};
  if (after >= 0) s->bk[after].next = b;
  else s->first = b;
  if (n >= 0) s->bk[n].prev = b;
  return b;
}

/* the bucket of count k, made if missing, looked for from bucket from (-1: the first; its count
 * at most k) */
static int32_t bucket_find(struct autoc *s, int32_t from, uint32_t k) {
  int32_t after = -1, b = from >= 0 ? from : s->first;
  if (from >= 0) after = s->bk[from].prev;
  while (b >= 0 && s->bk[b].count < k) after = b, b = s->bk[b].next;
  return b >= 0 && s->bk[b].count == k ? b : bucket_new(s, after, k);
}

static void bucket_drop_if_empty(struct autoc *s, int32_t b) {
  struct bucket *x = &s->bk[b];
  if (x->head >= 0) return;
  if (x->prev >= 0) s->bk[x->prev].next = x->next;
  else s->first = x->next;
  if (x->next >= 0) s->bk[x->next].prev = x->prev;
  x->next = s->free;
  s->free = b;
}

/* slot out of its bucket's list (the bucket kept, maybe empty) */
static int32_t bslot_unlink(struct autoc *s, int32_t slot) {
  const int32_t b = s->bk_of[slot], p = s->bs_prev[slot], n = s->bs_next[slot];
  if (p >= 0) s->bs_next[p] = n;
  else s->bk[b].head = n;
  if (n >= 0) s->bs_prev[n] = p;
  else s->bk[b].tail = p;
  s->bk_of[slot] = -1;
  return b;
}

/* slot into bucket b at its place by stamp (from the tail: a touched slot is the newest) */
static void bslot_insert(struct autoc *s, int32_t slot, int32_t b) {
  int32_t p = s->bk[b].tail;
  while (p >= 0 && s->stamp[p] > s->stamp[slot]) p = s->bs_prev[p];
  const int32_t n = p >= 0 ? s->bs_next[p] : s->bk[b].head;
  s->bs_prev[slot] = p;
  s->bs_next[slot] = n;
  if (p >= 0) s->bs_next[p] = slot;
  else s->bk[b].head = slot;
  if (n >= 0) s->bs_prev[n] = slot;
  else s->bk[b].tail = slot;
  s->bk_of[slot] = b;
}

/* slot (in main) to its place for its key now */
static void bslot_raise(struct autoc *s, int32_t slot) {
  const int32_t b = s->bk_of[slot];
  const int32_t t = bucket_find(s, b, aged_at(s, s->main_now, s->seen[slot]));
  bslot_unlink(s, slot);
  bslot_insert(s, slot, t);
  if (t != b) bucket_drop_if_empty(s, b);
}

static void main_push(struct autoc *s, int32_t slot) {
  bslot_insert(s, slot, bucket_find(s, -1, aged_at(s, s->main_now, s->seen[slot])));
}

static void main_remove(struct autoc *s, int32_t slot) { bucket_drop_if_empty(s, bslot_unlink(s, slot)); }

/* x before y in the buckets: aged count, then last use (then slot, as pushing in slot order did) */
static int rebuild_before(const struct rebuild_key *x, const struct rebuild_key *y) {
  if (x->count != y->count) return x->count < y->count;
  if (x->stamp != y->stamp) return x->stamp < y->stamp;
  return x->slot < y->slot;
}

/* every bucket again at epoch main_now: the main slots sorted by key and appended in that order
 * (pushing them one by one in slot order walked each bucket from its tail: quadratic in a
 * bucket's size, a tenth of a simulation). Taken in the old buckets' order they are nearly
 * sorted already: ageing shifts every count alike, which keeps their order (only counts made
 * equal and the unit just touched move), so an insertion sort has little to do. */
static void main_rebuild(struct autoc *s) {
  int32_t n = 0;
  for (int32_t b = s->first; b >= 0; b = s->bk[b].next)
    for (int32_t i = s->bk[b].head; i >= 0; i = s->bs_next[i]) {
      struct rebuild_key k = {aged_at(s, s->main_now, s->seen[i]), i, s->stamp[i]};
      int32_t j = n++;
      for (; j > 0 && rebuild_before(&k, &s->rkeys[j - 1]); j--) s->rkeys[j] = s->rkeys[j - 1];
      s->rkeys[j] = k;
    }
  for (int32_t j = 0; j < n; j++) s->bk_of[s->rkeys[j].slot] = -1;
  s->first = -1;
  s->free = 0;
  for (int32_t b = 0; b < s->n_slots; b++) s->bk[b].next = b + 1 < s->n_slots ? b + 1 : -1;
  int32_t b = -1;
  for (int32_t j = 0; j < n; j++) {
    const int32_t slot = s->rkeys[j].slot;
    if (b < 0 || s->bk[b].count != s->rkeys[j].count) b = bucket_new(s, b, s->rkeys[j].count);
    const int32_t t = s->bk[b].tail; /* the newest so far: slot goes after it */
    s->bs_prev[slot] = t;
    s->bs_next[slot] = -1;
    if (t >= 0) s->bs_next[t] = slot;
    else s->bk[b].head = slot;
    s->bk[b].tail = slot;
    s->bk_of[slot] = b;
  }
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

/* slot i before slot v in the victim order: least recent use, the lower slot on a tie */
static int older(const struct autoc *s, int32_t i, int32_t v) {
  return v < 0 || s->stamp[i] < s->stamp[v] || (s->stamp[i] == s->stamp[v] && i < v);
}

/* slot into the probation list at its place in the victim order (from the tail: a touched slot
 * is the newest) */
static void prob_add(struct autoc *s, int32_t slot) {
  int32_t p = s->prob_tail;
  while (p >= 0 && older(s, slot, p)) p = s->prob_prev[p];
  const int32_t n = p >= 0 ? s->prob_next[p] : s->prob_head;
  s->prob_prev[slot] = p;
  s->prob_next[slot] = n;
  if (p >= 0) s->prob_next[p] = slot;
  else s->prob_head = slot;
  if (n >= 0) s->prob_prev[n] = slot;
  else s->prob_tail = slot;
}

static void prob_remove(struct autoc *s, int32_t slot) {
  const int32_t p = s->prob_prev[slot], n = s->prob_next[slot];
  if (p >= 0) s->prob_next[p] = n;
  else s->prob_head = n;
  if (n >= 0) s->prob_prev[n] = p;
  else s->prob_tail = p;
}

/* in_main[slot] = on, and the probation set with it */
static void set_main(struct autoc *s, int32_t slot, int on) {
  if (s->in_main[slot] == on) return;
  s->in_main[slot] = (uint8_t)on;
  if (on) prob_remove(s, slot), main_push(s, slot);
  else prob_add(s, slot), main_remove(s, slot);
}


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
  s->prob_next = ferry__calloc((size_t)g->n_slots, sizeof *s->prob_next);
  s->prob_prev = ferry__calloc((size_t)g->n_slots, sizeof *s->prob_prev);
  s->stale = ferry__calloc((size_t)g->n_slots, sizeof *s->stale);
  s->is_stale = ferry__calloc((size_t)g->n_slots, 1);
  s->bk = ferry__calloc((size_t)g->n_slots, sizeof *s->bk);
  s->bk_of = ferry__calloc((size_t)g->n_slots, sizeof *s->bk_of);
  s->bs_next = ferry__calloc((size_t)g->n_slots, sizeof *s->bs_next);
  s->bs_prev = ferry__calloc((size_t)g->n_slots, sizeof *s->bs_prev);
  s->seen_next = ferry__calloc((size_t)g->n_slots, sizeof *s->seen_next);
  s->seen_prev = ferry__calloc((size_t)g->n_slots, sizeof *s->seen_prev);
  s->rkeys = ferry__calloc((size_t)g->n_slots, sizeof *s->rkeys);
  if (!s->count || !s->epoch || !s->unit_head || !s->stamp || !s->seen || !s->in_main || !s->prob_next || !s->prob_prev ||
      !s->stale || !s->is_stale || !s->bk || !s->bk_of || !s->bs_next || !s->bs_prev || !s->seen_next || !s->seen_prev ||
      !s->rkeys) {
    auto_free(s);
    return FERRY_ERR_NOMEM;
  }
  for (int32_t u = 0; u < units; u++) s->unit_head[u] = -1;
  s->prob_head = s->prob_tail = -1;
  for (int32_t i = 0; i < g->n_slots; i++) s->seen[i] = -1, s->bk_of[i] = -1, prob_add(s, i);
  s->first = -1; /* no buckets yet: the rebuild makes the free list */
  main_rebuild(s);
  int32_t probation = g->n_experts > 0 ? g->n_experts : 1;
  if (probation > g->n_slots / 2) probation = g->n_slots / 2 > 0 ? g->n_slots / 2 : 1;
  s->main_cap = g->n_slots - probation > 0 ? g->n_slots - probation : 0;
  s->epoch_len = 8 * (uint64_t)units;
  s->epoch_end = s->epoch_len;
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
  ferry_free(s->prob_next);
  ferry_free(s->prob_prev);
  ferry_free(s->stale);
  ferry_free(s->is_stale);
  ferry_free(s->bk);
  ferry_free(s->bk_of);
  ferry_free(s->bs_next);
  ferry_free(s->bs_prev);
  ferry_free(s->seen_next);
  ferry_free(s->seen_prev);
  ferry_free(s->rkeys);
  ferry_free(s);
}

/* After a touch of unit at slot raised their keys: the buckets in order again at epoch now. */
static void main_settle(struct autoc *s, int32_t slot, int32_t unit, uint64_t now) {
  if (now != s->main_now) { /* ageing: ties may have formed */
    s->main_now = now;
    main_rebuild(s);
    return;
  }
  if (s->bk_of[slot] >= 0) bslot_raise(s, slot);
  for (int32_t i = s->unit_head[unit]; i >= 0; i = s->seen_next[i])
    if (i != slot && s->bk_of[i] >= 0) bslot_raise(s, i);
}

static void auto_touch(void *state, int32_t slot, int32_t unit) {
  struct autoc *s = state;
  const uint32_t c = aged_at(s, s->epoch_now, unit); /* as of the clock before this touch */
  s->stamp[slot] = ++s->clock;
  if (!s->in_main[slot]) prob_remove(s, slot), prob_add(s, slot); /* the newest: to the tail */
  if (s->clock == s->epoch_end) s->epoch_now++, s->epoch_end += s->epoch_len;
  s->count[unit] = c < UINT32_MAX ? c + 1 : c;
  s->epoch[unit] = (uint32_t)s->epoch_now;
  main_settle(s, slot, unit, s->epoch_now);
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
  if (s->first >= 0 && s->count[unit] > s->bk[s->first].count) {
    set_main(s, s->bk[s->first].head, 0);
    set_main(s, slot, 1);
  }
}

static int32_t auto_victim(void *state, const int32_t *slot_unit, const uint8_t *prot, int32_t n) {
  struct autoc *s = state;
  /* the least recent probation slot: a probation one, or a main one holding another expert than
   * at its last touch (the stale set, pruned of those no longer so) */
  int32_t v = s->prob_head;
  while (v >= 0 && (slot_unit[v] < 0 || prot[v])) v = s->prob_next[v];
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
