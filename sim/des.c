/* Discrete-event kernel: virtual clock, binary min-heap keyed by (time_ns, seq) and an event
 * pool with a free list. The heap holds keys by value (24 bytes each) so sifting touches only
 * the heap array; callbacks live in the pool, found through the entry's slot index. */
#include <limits.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "sim/des.h"

enum { SLOT_FREE, SLOT_PENDING, SLOT_CANCELLED };

struct entry {
  int64_t t_ns;
  uint64_t seq;
  uint32_t slot;
};

struct slot {
  ferry__des_fn fn;
  void *ctx;
  uint32_t gen;       /* bumped each time the slot is freed, so stale ids never match */
  uint32_t state;
  uint32_t next_free; /* free-list link while SLOT_FREE */
};

struct ferry__des {
  int64_t now_ns;
  uint64_t next_seq;
  uint64_t events_run;
  struct entry *heap;
  size_t heap_len, heap_cap;
  struct slot *slots;
  uint32_t n_slots;   /* slots ever handed out (pool high-water mark) */
  uint32_t slots_cap;
  uint32_t free_head; /* UINT32_MAX when empty */
  size_t live;        /* pending, not cancelled */
  size_t cancelled;   /* cancelled entries still in the heap */
  int stop;
};

#define NO_SLOT UINT32_MAX

static inline int before(const struct entry *a, const struct entry *b) {
  return a->t_ns < b->t_ns || (a->t_ns == b->t_ns && a->seq < b->seq);
}

/* Hole-based sifts: move the hole instead of swapping, one store per level. */
static void sift_up(struct entry *h, size_t i) {
  struct entry e = h[i];
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!before(&e, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = e;
}

static void sift_down(struct entry *h, size_t n, size_t i) {
  struct entry e = h[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && before(&h[c + 1], &h[c])) c++;
    if (!before(&h[c], &e)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = e;
}

static void heap_pop(struct ferry__des *d) {
  d->heap_len--;
  if (d->heap_len > 0) {
    d->heap[0] = d->heap[d->heap_len];
    sift_down(d->heap, d->heap_len, 0);
  }
}

static void slot_free(struct ferry__des *d, uint32_t s) {
  struct slot *sl = &d->slots[s];
  sl->state = SLOT_FREE;
  sl->fn = NULL;
  sl->ctx = NULL;
  if (++sl->gen == 0) sl->gen = 1;
  sl->next_free = d->free_head;
  d->free_head = s;
}

ferry_status ferry__des_create(struct ferry__des **out, size_t initial_events) {
  *out = NULL;
  if (initial_events == 0) initial_events = 64;
  if (initial_events > (size_t)UINT32_MAX / 2)
    return ferry__fail(FERRY_ERR_INVALID, "des: %zu initial events is too many", initial_events);
  struct ferry__des *d = ferry__calloc(1, sizeof *d);
  if (!d) goto out_nomem;
  d->heap = ferry__reallocarray(NULL, initial_events, sizeof *d->heap);
  if (!d->heap) goto out_free_des;
  d->slots = ferry__reallocarray(NULL, initial_events, sizeof *d->slots);
  if (!d->slots) goto out_free_heap;
  d->heap_cap = initial_events;
  d->slots_cap = (uint32_t)initial_events;
  d->free_head = NO_SLOT;
  *out = d;
  return FERRY_OK;

out_free_heap:
  ferry_free(d->heap);
out_free_des:
  ferry_free(d);
out_nomem:
  return ferry__fail(FERRY_ERR_NOMEM, "des: out of memory creating the event kernel");
}

void ferry__des_destroy(struct ferry__des *des) {
  if (!des) return;
  ferry_free(des->heap);
  ferry_free(des->slots);
  ferry_free(des);
}

int64_t ferry__des_now(const struct ferry__des *des) { return des->now_ns; }

/* Drop cancelled entries and rebuild the heap bottom-up; keeps memory bounded when a
 * resource keeps rescheduling far-future completions. Order is unchanged: keys are unique. */
static void compact(struct ferry__des *d) {
  size_t n = 0;
  for (size_t i = 0; i < d->heap_len; i++) {
    uint32_t s = d->heap[i].slot;
    if (d->slots[s].state == SLOT_CANCELLED)
      slot_free(d, s);
    else
      d->heap[n++] = d->heap[i];
  }
  d->heap_len = n;
  d->cancelled = 0;
  for (size_t i = n / 2; i-- > 0;) sift_down(d->heap, n, i);
}

static ferry_status grow(struct ferry__des *d) {
  if (d->heap_len == d->heap_cap) {
    if (d->cancelled > 0) {
      compact(d);
      if (d->heap_len < d->heap_cap) goto heap_ok;
    }
    size_t cap = d->heap_cap * 2;
    struct entry *h = ferry__reallocarray(d->heap, cap, sizeof *h);
    if (!h) return ferry__fail(FERRY_ERR_NOMEM, "des: out of memory growing the event heap to %zu", cap);
    d->heap = h;
    d->heap_cap = cap;
  }
heap_ok:
  if (d->free_head == NO_SLOT && d->n_slots == d->slots_cap) {
    if (d->slots_cap > UINT32_MAX / 4)
      return ferry__fail(FERRY_ERR_RANGE, "des: more than %u pending events", d->slots_cap);
    uint32_t cap = d->slots_cap * 2;
    struct slot *s = ferry__reallocarray(d->slots, cap, sizeof *s);
    if (!s) return ferry__fail(FERRY_ERR_NOMEM, "des: out of memory growing the event pool to %u", cap);
    d->slots = s;
    d->slots_cap = cap;
  }
  return FERRY_OK;
}

ferry_status ferry__des_schedule(struct ferry__des *des, int64_t at_ns, ferry__des_fn fn, void *ctx,
                                 ferry__des_id *id) {
  if (id) *id = 0;
  if (!fn) return ferry__fail(FERRY_ERR_INVALID, "des: schedule without a callback");
  if (at_ns < des->now_ns)
    return ferry__fail(FERRY_ERR_INVALID, "des: event at %lld ns is before the current time %lld ns",
                       (long long)at_ns, (long long)des->now_ns);
  if ((des->heap_len == des->heap_cap || (des->free_head == NO_SLOT && des->n_slots == des->slots_cap))) {
    ferry_status st = grow(des);
    if (st != FERRY_OK) return st;
  }
  uint32_t s;
  if (des->free_head != NO_SLOT) {
    s = des->free_head;
    des->free_head = des->slots[s].next_free;
  } else {
    s = des->n_slots++;
    des->slots[s].gen = 1;
  }
  struct slot *sl = &des->slots[s];
  sl->fn = fn;
  sl->ctx = ctx;
  sl->state = SLOT_PENDING;
  struct entry *e = &des->heap[des->heap_len];
  e->t_ns = at_ns;
  e->seq = des->next_seq++;
  e->slot = s;
  sift_up(des->heap, des->heap_len++);
  des->live++;
  if (id) *id = ((uint64_t)sl->gen << 32) | s;
  return FERRY_OK;
}

ferry_status ferry__des_schedule_in(struct ferry__des *des, int64_t delay_ns, ferry__des_fn fn, void *ctx,
                                    ferry__des_id *id) {
  if (delay_ns < 0 || delay_ns > INT64_MAX - des->now_ns) {
    if (id) *id = 0;
    return ferry__fail(FERRY_ERR_INVALID, "des: delay %lld ns is negative or overflows the clock",
                       (long long)delay_ns);
  }
  return ferry__des_schedule(des, des->now_ns + delay_ns, fn, ctx, id);
}

int ferry__des_cancel(struct ferry__des *des, ferry__des_id id) {
  uint32_t s = (uint32_t)(id & 0xffffffffu);
  uint32_t gen = (uint32_t)(id >> 32);
  if (id == 0 || s >= des->n_slots) return 0;
  struct slot *sl = &des->slots[s];
  if (sl->gen != gen || sl->state != SLOT_PENDING) return 0;
  sl->state = SLOT_CANCELLED;
  des->live--;
  des->cancelled++;
  if (des->cancelled > 1024 && des->cancelled > des->live) compact(des);
  return 1;
}

/* Drop cancelled entries from the top so heap[0] (if any) is live. */
static void skip_cancelled(struct ferry__des *d) {
  while (d->heap_len > 0) {
    uint32_t s = d->heap[0].slot;
    if (d->slots[s].state != SLOT_CANCELLED) return;
    heap_pop(d);
    slot_free(d, s);
    d->cancelled--;
  }
}

int ferry__des_run_one(struct ferry__des *des) {
  skip_cancelled(des);
  if (des->heap_len == 0) return 0;
  struct entry top = des->heap[0];
  heap_pop(des);
  struct slot *sl = &des->slots[top.slot];
  ferry__des_fn fn = sl->fn;
  void *ctx = sl->ctx;
  /* Free before calling: the callback may schedule into this very slot. */
  slot_free(des, top.slot);
  des->live--;
  des->now_ns = top.t_ns;
  des->events_run++;
  fn(des, ctx);
  return 1;
}

uint64_t ferry__des_run_until(struct ferry__des *des, int64_t t_ns) {
  uint64_t n = 0;
  des->stop = 0;
  for (;;) {
    skip_cancelled(des);
    if (des->heap_len == 0 || des->heap[0].t_ns > t_ns) break;
    ferry__des_run_one(des);
    n++;
    if (des->stop) {
      des->stop = 0;
      return n;
    }
  }
  if (t_ns > des->now_ns) des->now_ns = t_ns;
  return n;
}

int ferry__des_run_while_not(struct ferry__des *des, ferry__des_pred pred, void *arg) {
  des->stop = 0;
  for (;;) {
    if (pred(arg)) return 1;
    if (!ferry__des_run_one(des)) return 0;
    if (des->stop) {
      des->stop = 0;
      return pred(arg) ? 1 : 0;
    }
  }
}

uint64_t ferry__des_run_all(struct ferry__des *des) {
  uint64_t n = 0;
  des->stop = 0;
  while (ferry__des_run_one(des)) {
    n++;
    if (des->stop) break;
  }
  des->stop = 0;
  return n;
}

void ferry__des_stop(struct ferry__des *des) { des->stop = 1; }

size_t ferry__des_pending(const struct ferry__des *des) { return des->live; }

int ferry__des_next_time(struct ferry__des *des, int64_t *t_ns) {
  skip_cancelled(des);
  if (des->heap_len == 0) return 0;
  *t_ns = des->heap[0].t_ns;
  return 1;
}

uint64_t ferry__des_events_run(const struct ferry__des *des) { return des->events_run; }
