/* Op graphs of the `sim` executor's fast path (runtime/exec/graph.h): the ops submitted while
 * recording are kept with what timing them needed (a kernel's duration and issue cost, a
 * transfer's channel and bytes, an event as itself or as a parameter), and a launch enqueues
 * them again through the fast path's enqueue_timed(), exactly as submitting them would. What
 * can differ from one launch to the next is worked out again: an attention kernel's time from
 * this step's context, a disk read's source from the page cache, a wait skipped or not. Kernels
 * recorded back to back on one queue become one entry when the host time between their issues
 * is all launch cost (no submit cost, no queue wake-up): their chain of starts is worked out at
 * launch in a loop, without an entry each. Identical recordings share one graph. */
#include <stddef.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "runtime/exec/graph.h"
#include "sim/exec_sim_impl.h"

#define GRAPH_MAX_PARAMS 8

/* A kernel of a graph: what issuing and running it costs. */
struct graph_item {
  int64_t issue_ns;    /* host time the runtime spends issuing it, less its launches' */
  int64_t duration_ns; /* recorded */
  int32_t kernel;      /* timed again at launch (its cost depends on the step's context): index in kernels, else -1 */
  uint32_t shape_id;   /* its kernel's shape_id (kept here: the launch's memo reads no graph_kernel) */
  int64_t launches;    /* launches it issues, priced at launch: a CUDA-graph runtime's differ between a
                          prefilling step and a decode step, and the key does not tell them apart */
};

/* The host time issuing item it costs in the current step. */
static int64_t item_issue(const struct sim_exec *s, const struct graph_item *it) {
  return it->issue_ns + it->launches * ferry__sim_launch_ns(s);
}

/* An op as a graph keeps it. */
struct graph_op {
  uint8_t kind;        /* enum ferry_op_kind */
  int8_t queue;
  int8_t chan;
  int8_t param;        /* events: parameter index, or -1 for ev */
  uint8_t host_waits;  /* copies: the host waits for it (sim_cost.host_waits); kernels: the first's
                          ferry_kernel.host_syncs (a kernel with some starts an op) */
  uint32_t n;          /* kernels: how many, back to back on the queue (items item .. item + n - 1) */
  int32_t item;        /* kernels: index of the first in items */
  int32_t read;        /* reads: index in reads (routed again at launch: the page cache moves) */
  int64_t duration_ns; /* transfers: time alone on the channel */
  int64_t flow_ns;     /* transfers: the part with bytes flowing */
  int64_t issue_ns;    /* transfers: host time issuing it */
  uint64_t flow_bytes; /* transfers: bytes the channel serves */
  uint64_t bytes;      /* transfers: bytes they move (flow_bytes differs for a copy the link serves scaled) */
  ferry_event *ev;     /* events without a parameter */
};

/* A kernel timed again at launch, with the packed weights behind it when recorded. Its cost
 * reads the engine's per-step arrays it points at (token positions): the current step's. */
struct graph_kernel {
  struct ferry_kernel k;
  /* what its time depends on, compared byte for byte between graph kernels: k without its
   * names, layer and buffer places (the same shape in every layer), and the packed weights */
  struct graph_shape {
    struct ferry_kernel k;
    struct ferry__packed packed[3];
    uint8_t has_packed[3];
  } key; /* numbered at recording (shape_id(): the same number for equal keys, 0 when none could be
            kept), the number kept in the kernel's graph_item */
};

/* A disk read, routed again at launch (ferry__sim_route_read()). */
struct graph_read {
  const struct ferry_store *store;
  uint32_t file;
  uint64_t offset, len;
  unsigned flags;
};

struct ferry_exec_graph {
  int32_t n_ops, n_items, n_kernels, n_reads;
  uint64_t n_submits; /* ops it stands for: what submitting them one by one would number */
  struct graph_op *ops;
  struct graph_item *items;
  struct graph_kernel *kernels;
  struct graph_read *reads;
  uint64_t hash;
  int shared; /* one of the executor's shared graphs (freed with it) */
};

/* Graphs recorded under different keys are often the same ops (every layer's experts have the
 * same shapes): one copy of each, shared, keeps the graphs a step launches few and in cache. */
struct sim_graph_pool {
  struct ferry_exec_graph **slots; /* open addressing by content hash */
  size_t cap, n;
};

struct sim_graph_capture {
  struct graph_op *ops;
  int32_t n_ops, cap_ops;
  struct graph_item *items;
  int32_t n_items, cap_items;
  struct graph_kernel *kernels;
  int32_t n_kernels, cap_kernels;
  struct graph_read *reads;
  int32_t n_reads, cap_reads;
  ferry_event *params[GRAPH_MAX_PARAMS];
  int32_t n_params;
  int failed; /* out of memory while recording */
  int active;
  struct sim_graph_pool pool;
  /* every distinct kernel shape recorded, numbered from 1, so that a launch compares numbers
   * instead of shapes: open addressing by the shape's hash into shapes[] */
  struct graph_shape **shapes;
  uint32_t n_shapes, cap_shapes;
  uint32_t *shape_slots; /* 1 + index into shapes, 0: empty */
  uint64_t *shape_hash;  /* by slot */
  uint32_t cap_slots;
};

int ferry__sim_graph_mode(struct ferry_exec *ex) {
  const struct sim_exec *s = ex->backend_state;
  return s->mode == FERRY_SIM_FAST ? FERRY__GRAPH_LAUNCH : s->mode == FERRY_SIM_CHECK ? FERRY__GRAPH_CHECK : FERRY__GRAPH_NONE;
}

void ferry__sim_graph_state_free(struct sim_exec *s) {
  struct sim_graph_capture *c = s->capture;
  if (!c) return;
  for (uint32_t i = 0; i < c->n_shapes; i++) ferry_free(c->shapes[i]);
  ferry_free(c->shapes);
  ferry_free(c->shape_slots);
  ferry_free(c->shape_hash);
  for (size_t i = 0; i < c->pool.cap; i++) ferry_free(c->pool.slots[i]);
  ferry_free(c->pool.slots);
  ferry_free(c->ops);
  ferry_free(c->items);
  ferry_free(c->kernels);
  ferry_free(c->reads);
  ferry_free(c);
  s->capture = NULL;
}

/* ---- recording ---------------------------------------------------------------------------------- */

ferry_status ferry__sim_graph_begin(struct ferry_exec *ex, ferry_event *const *params, int32_t n_params) {
  struct sim_exec *s = ex->backend_state;
  if (s->mode == FERRY_SIM_EXACT)
    return ferry__err_set(&ex->err, FERRY_ERR_UNSUPPORTED, "sim executor: no op graphs in the exact mode");
  if (n_params > GRAPH_MAX_PARAMS)
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: %d parameters (at most %d)", n_params, GRAPH_MAX_PARAMS);
  if (!s->capture && !(s->capture = ferry__calloc(1, sizeof *s->capture)))
    return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for an op graph");
  struct sim_graph_capture *c = s->capture; /* kept between recordings: its arrays are reused */
  c->n_ops = c->n_items = c->n_kernels = c->n_reads = 0;
  c->failed = 0;
  c->active = 1;
  c->n_params = n_params;
  for (int32_t i = 0; i < n_params; i++) c->params[i] = params[i];
  return FERRY_OK;
}

static uint64_t shape_hash(const struct graph_shape *k) {
  const unsigned char *b = (const unsigned char *)k;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

/* Double the shape table (rehashing); 0 when memory is short. */
static int shapes_grow(struct sim_graph_capture *c) {
  const uint32_t cap = c->cap_slots ? 2 * c->cap_slots : 256;
  uint32_t *slots = ferry__calloc(cap, sizeof *slots);
  uint64_t *hash = ferry__calloc(cap, sizeof *hash);
  if (!slots || !hash) {
    ferry_free(slots);
    ferry_free(hash);
    return 0;
  }
  for (uint32_t i = 0; i < c->cap_slots; i++) {
    if (!c->shape_slots[i]) continue;
    uint32_t j = (uint32_t)c->shape_hash[i] & (cap - 1);
    while (slots[j]) j = (j + 1) & (cap - 1);
    slots[j] = c->shape_slots[i];
    hash[j] = c->shape_hash[i];
  }
  ferry_free(c->shape_slots);
  ferry_free(c->shape_hash);
  c->shape_slots = slots;
  c->shape_hash = hash;
  c->cap_slots = cap;
  return 1;
}

/* The number of a kernel shape (byte for byte, as the launch's comparison was), 0 when memory
 * is short (the launch then times the kernel without its memo). */
static uint32_t shape_id(struct sim_graph_capture *c, const struct graph_shape *k) {
  if (2 * (c->n_shapes + 1) > c->cap_slots && !shapes_grow(c)) return 0;
  const uint64_t h = shape_hash(k);
  uint32_t j = (uint32_t)h & (c->cap_slots - 1);
  for (; c->shape_slots[j]; j = (j + 1) & (c->cap_slots - 1))
    if (c->shape_hash[j] == h && !memcmp(c->shapes[c->shape_slots[j] - 1], k, sizeof *k)) return c->shape_slots[j];
  if (c->n_shapes == c->cap_shapes) {
    const uint32_t cap = c->cap_shapes ? 2 * c->cap_shapes : 64;
    struct graph_shape **v = ferry__reallocarray(c->shapes, cap, sizeof *v);
    if (!v) return 0;
    c->shapes = v;
    c->cap_shapes = cap;
  }
  struct graph_shape *copy = ferry__calloc(1, sizeof *copy);
  if (!copy) return 0;
  memcpy(copy, k, sizeof *copy);
  c->shapes[c->n_shapes++] = copy;
  c->shape_slots[j] = c->n_shapes;
  c->shape_hash[j] = h;
  return c->n_shapes;
}

/* Room for one more of n entries of size bytes in *v (capacity doubling); NULL and the
 * recording marked failed when memory is short. */
static void *one_more(struct sim_graph_capture *c, void **v, int32_t n, int32_t *cap, size_t size) {
  if (n == *cap) {
    const int32_t want = *cap ? 2 * *cap : 16;
    void *r = ferry__reallocarray(*v, (size_t)want, size);
    if (!r) {
      c->failed = 1;
      return NULL;
    }
    *v = r;
    *cap = want;
  }
  return (char *)*v + (size_t)n * size;
}

static void capture_event(struct sim_graph_capture *c, struct graph_op *g, ferry_event *ev) {
  g->param = -1;
  g->ev = ev;
  for (int32_t i = 0; i < c->n_params; i++)
    if (c->params[i] == ev) {
      g->param = (int8_t)i;
      g->ev = NULL;
    }
}

/* k as its time sees it: without names, layer, expert and where its buffers are (whether a
 * reference is there is kept), its context left to the launch. The bytes are compared, so the
 * copy starts from zeroes (padding included). */
static void shape_of(struct ferry_kernel *key, const struct ferry_kernel *k) {
  memcpy(key, k, sizeof *key);
  key->name = NULL;
  key->layer = key->expert = -1;
  key->context_tokens = 0;
  struct ferry_ref *refs[] = {&key->x, &key->y, &key->w, &key->b};
  for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++)
    refs[i]->buf = refs[i]->buf ? (ferry_buf *)1 : NULL, refs[i]->offset = 0;
  for (int i = 0; i < 8; i++) key->aux[i].buf = key->aux[i].buf ? (ferry_buf *)1 : NULL, key->aux[i].offset = 0;
}

static struct graph_op *capture_push(struct sim_graph_capture *c, enum ferry_op_kind kind, int32_t queue) {
  struct graph_op *g = one_more(c, (void **)&c->ops, c->n_ops, &c->cap_ops, sizeof *g);
  if (!g) return NULL;
  c->n_ops++;
  *g = (struct graph_op){.kind = (uint8_t)kind, .queue = (int8_t)queue, .chan = CHAN_NONE, .param = -1, .item = -1,
                         .read = -1};
  return g;
}

void ferry__sim_graph_capture_op(struct sim_exec *s, int32_t queue, const struct sim_cost *cost, int64_t flow_ns,
                                 int64_t issue_ns, const struct ferry_op *op) {
  struct sim_graph_capture *c = s->capture;
  if (!c->active) return;
  struct graph_op *g = capture_push(c, op->kind, queue);
  if (!g) return;
  switch (op->kind) {
    case FERRY_OP_RECORD:
    case FERRY_OP_WAIT: capture_event(c, g, op->u.event.ev); return;
    case FERRY_OP_COPY:
    case FERRY_OP_READ:
      g->chan = (int8_t)cost->chan;
      g->duration_ns = cost->duration_ns;
      g->flow_ns = flow_ns;
      g->issue_ns = issue_ns;
      g->flow_bytes = cost->flow_bytes;
      g->bytes = op->kind == FERRY_OP_COPY ? op->u.copy.bytes : op->u.read.len;
      g->host_waits = (uint8_t)cost->host_waits;
      if (op->kind == FERRY_OP_READ) {
        struct graph_read *r = one_more(c, (void **)&c->reads, c->n_reads, &c->cap_reads, sizeof *r);
        if (!r) return;
        *r = (struct graph_read){op->u.read.store, op->u.read.file, op->u.read.offset, op->u.read.len, op->u.read.flags};
        g->read = c->n_reads++;
      }
      return;
    case FERRY_OP_KERNEL: {
      struct graph_item *it = one_more(c, (void **)&c->items, c->n_items, &c->cap_items, sizeof *it);
      if (!it) return;
      const int64_t launches = ferry__sim_issue_launches(s, cost, op);
      *it = (struct graph_item){issue_ns - launches * ferry__sim_launch_ns(s), cost->duration_ns, -1, 0, launches};
      g->item = c->n_items++;
      g->n = 1;
      const struct ferry_kernel *k = &op->u.kernel;
      g->host_waits = (uint8_t)(k->host_syncs > 255 ? 255 : k->host_syncs > 0 ? k->host_syncs : 0);
      if (k->context_tokens <= 0) return;
      /* its time depends on the context the launch gives: keep the kernel, and the packed
       * weights its cost read, to time it again */
      struct graph_kernel *gk = one_more(c, (void **)&c->kernels, c->n_kernels, &c->cap_kernels, sizeof *gk);
      if (!gk) return;
      memset(gk, 0, sizeof *gk);
      gk->k = *k;
      shape_of(&gk->key.k, k);
      const struct ferry__packed *packed[3] = {NULL, NULL, NULL};
      if (k->kind == FERRY_K_MATMUL || k->kind == FERRY_K_EXPERT || k->kind == FERRY_K_MLA_ATTENTION ||
          k->kind == FERRY_K_EMBED) {
        packed[0] = ferry__sim_packed_at(s, k->w);
        if (k->kind == FERRY_K_EXPERT) packed[1] = ferry__sim_packed_at(s, k->aux[0]), packed[2] = ferry__sim_packed_at(s, k->aux[1]);
      }
      for (int i = 0; i < 3; i++)
        if (packed[i]) gk->key.packed[i] = *packed[i], gk->key.has_packed[i] = 1;
      it->shape_id = shape_id(c, &gk->key);
      it->kernel = c->n_kernels++;
      return;
    }
  }
}

void ferry__sim_graph_skipped_wait(struct ferry_exec *ex, int32_t queue, ferry_event *ev) {
  struct sim_exec *s = ex->backend_state;
  struct sim_graph_capture *c = s->capture;
  if (!c || !c->active) return;
  struct graph_op *g = capture_push(c, FERRY_OP_WAIT, queue);
  if (g) capture_event(c, g, ev);
}

/* Kernels recorded back to back on one queue, when nothing but their launch costs passes on the
 * host between them (no submit cost, no queue wake-up, no copy the model's code waits for before
 * the later one), run as a chain worked out at launch: one op for them all. Their items are
 * consecutive already. */
static void merge_kernels(const struct sim_exec *s, struct sim_graph_capture *c) {
  if (s->submit_ns > 0 || s->wake_ns > 0) return;
  int32_t out = 0;
  for (int32_t i = 0; i < c->n_ops; i++) {
    struct graph_op *prev = out > 0 ? &c->ops[out - 1] : NULL;
    const struct graph_op *o = &c->ops[i];
    if (prev && prev->kind == FERRY_OP_KERNEL && o->kind == FERRY_OP_KERNEL && prev->queue == o->queue &&
        !o->host_waits) {
      prev->n += o->n;
      continue;
    }
    c->ops[out++] = *o;
  }
  c->n_ops = out;
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL; }

static uint64_t content_hash(const struct graph_op *ops, int32_t n, const struct graph_item *items, int32_t n_items) {
  uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)n;
  for (int32_t i = 0; i < n; i++) {
    const struct graph_op *o = &ops[i];
    h = mix(h, (uint64_t)o->kind | (uint64_t)(uint8_t)o->queue << 8 | (uint64_t)(uint8_t)o->chan << 16 |
                   (uint64_t)(uint8_t)o->param << 24 | (uint64_t)o->n << 32);
    h = mix(mix(mix(h, (uint64_t)o->duration_ns), o->flow_bytes), (uint64_t)(uintptr_t)o->ev);
  }
  for (int32_t i = 0; i < n_items; i++)
    h = mix(mix(mix(h, (uint64_t)items[i].issue_ns), (uint64_t)items[i].duration_ns), (uint64_t)items[i].launches);
  return h;
}

static int same_ops(const struct ferry_exec_graph *g, const struct sim_graph_capture *c) {
  if (g->n_ops != c->n_ops || g->n_items != c->n_items) return 0;
  for (int32_t i = 0; i < c->n_ops; i++) {
    const struct graph_op *x = &g->ops[i], *y = &c->ops[i];
    if (x->kind != y->kind || x->queue != y->queue || x->chan != y->chan || x->param != y->param || x->n != y->n ||
        x->item != y->item || x->duration_ns != y->duration_ns || x->flow_ns != y->flow_ns ||
        x->issue_ns != y->issue_ns || x->flow_bytes != y->flow_bytes || x->ev != y->ev ||
        x->host_waits != y->host_waits)
      return 0;
  }
  for (int32_t i = 0; i < c->n_items; i++)
    if (g->items[i].issue_ns != c->items[i].issue_ns || g->items[i].duration_ns != c->items[i].duration_ns ||
        g->items[i].launches != c->items[i].launches)
      return 0;
  return 1;
}

static struct ferry_exec_graph **pool_find(struct sim_graph_pool *p, const struct sim_graph_capture *c, uint64_t h) {
  for (size_t i = (size_t)h & (p->cap - 1);; i = (i + 1) & (p->cap - 1)) {
    struct ferry_exec_graph *g = p->slots[i];
    if (!g || (g->hash == h && same_ops(g, c))) return &p->slots[i];
  }
}

/* Rehash into a table twice as large (the graphs compare against themselves: a capture view). */
static int pool_grow(struct sim_graph_pool *p) {
  const size_t cap = p->cap ? 2 * p->cap : 256;
  struct ferry_exec_graph **slots = ferry__calloc(cap, sizeof *slots);
  if (!slots) return 0;
  for (size_t i = 0; i < p->cap; i++) {
    struct ferry_exec_graph *g = p->slots[i];
    if (!g) continue;
    size_t j = (size_t)g->hash & (cap - 1);
    while (slots[j]) j = (j + 1) & (cap - 1);
    slots[j] = g;
  }
  ferry_free(p->slots);
  p->slots = slots;
  p->cap = cap;
  return 1;
}

ferry_status ferry__sim_graph_end(struct ferry_exec *ex, struct ferry_exec_graph **out) {
  struct sim_exec *s = ex->backend_state;
  struct sim_graph_capture *c = s->capture;
  *out = NULL;
  if (!c || !c->active) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: not recording");
  c->active = 0;
  if (c->failed) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory recording an op graph");
  merge_kernels(s, c);
  const uint64_t h = content_hash(c->ops, c->n_ops, c->items, c->n_items);
  struct ferry_exec_graph **slot = NULL;
  /* shared only when nothing in it is worked out again from what it points at */
  if (!c->n_kernels && !c->n_reads && (2 * (c->pool.n + 1) <= c->pool.cap || pool_grow(&c->pool))) {
    slot = pool_find(&c->pool, c, h);
    if (*slot) { /* recorded before under another key */
      *out = *slot;
      return FERRY_OK;
    }
  }
  const size_t ops = (size_t)c->n_ops * sizeof *c->ops, items = (size_t)c->n_items * sizeof *c->items,
               kernels = (size_t)c->n_kernels * sizeof *c->kernels, reads = (size_t)c->n_reads * sizeof *c->reads;
  struct ferry_exec_graph *g = ferry__calloc(1, sizeof *g + ops + items + kernels + reads);
  if (!g) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for an op graph");
  g->n_ops = c->n_ops;
  g->n_items = c->n_items;
  g->n_kernels = c->n_kernels;
  g->n_reads = c->n_reads;
  g->n_submits = (uint64_t)c->n_items;
  for (int32_t i = 0; i < c->n_ops; i++) g->n_submits += c->ops[i].kind != FERRY_OP_KERNEL;
  g->ops = (struct graph_op *)(g + 1);
  g->items = (struct graph_item *)((char *)g->ops + ops);
  g->kernels = (struct graph_kernel *)((char *)g->items + items);
  g->reads = (struct graph_read *)((char *)g->kernels + kernels);
  g->hash = h;
  if (ops) memcpy(g->ops, c->ops, ops);
  if (items) memcpy(g->items, c->items, items);
  if (kernels) memcpy(g->kernels, c->kernels, kernels);
  if (reads) memcpy(g->reads, c->reads, reads);
  if (slot) {
    *slot = g;
    g->shared = 1;
    c->pool.n++;
  }
  *out = g;
  return FERRY_OK;
}

/* ---- launching ---------------------------------------------------------------------------------- */

/* An item's duration at launch: recorded, or timed again with the launch's context. */
static int64_t item_ns(struct sim_exec *s, const struct graph_kernel *kernels, const struct graph_item *it,
                       int64_t context_tokens) {
  if (it->kernel < 0 || context_tokens < 0) return it->duration_ns;
  /* the same shape and context timed already in this step (another layer's) */
  const uint64_t epoch = it->shape_id ? s->ex->graph_epoch : 0;
  if (epoch)
    for (int i = 0; i < 4; i++) {
      const struct sim_reprice *r = &s->reprice[i];
      if (r->epoch == epoch && r->context_tokens == context_tokens && r->shape_id == it->shape_id) return r->ns;
    }
  const struct graph_kernel *gk = &kernels[it->kernel];
  struct ferry_kernel k = gk->k;
  k.context_tokens = context_tokens;
  const struct ferry__packed *packed[3];
  for (int i = 0; i < 3; i++) packed[i] = gk->key.has_packed[i] ? &gk->key.packed[i] : NULL;
  int folded;
  struct ferry__gpu_work w;
  const int64_t ns = ferry__sim_kernel_ns(s, &k, packed, &folded, &w); /* timed once already with this shape: cannot fail */
  if (epoch) {
    struct sim_reprice *r = &s->reprice[s->reprice_next++ % 4];
    r->shape_id = it->shape_id, r->epoch = epoch, r->context_tokens = context_tokens, r->ns = ns;
  }
  return ns;
}

/* A recorded read, routed again (the page cache may hold it now, or no longer). */
static ferry_status reroute(struct sim_exec *s, const struct graph_read *r, struct sim_cost *c, int64_t *flow_ns) {
  struct ferry_op op;
  memset(&op, 0, offsetof(struct ferry_op, u) + sizeof op.u.read);
  op.kind = FERRY_OP_READ;
  op.u.read.store = (struct ferry_store *)r->store;
  op.u.read.file = r->file;
  op.u.read.offset = r->offset;
  op.u.read.len = r->len;
  op.u.read.flags = r->flags;
  c->duration_ns = 0;
  c->folded = 0;
  ferry_status st = ferry__sim_route_read(s, c, &op);
  if (st == FERRY_OK) c->duration_ns = ferry__fluid_alone_ns(s->chan[c->chan], c->flow_bytes, flow_ns);
  return st;
}

/* A run of n > 1 kernels on q (merge_kernels()): each issued after the host's launch time,
 * started when both it is issued and the one before ended; one entry for the run, whose busy
 * time is the kernels' own. */
static ferry_status launch_run(struct sim_exec *s, struct sim_queue *q, const struct ferry_exec_graph *g,
                               const struct graph_op *o, int64_t context_tokens) {
  const struct graph_item *it = &g->items[o->item];
  /* the first's share of the layer's host time and the model's copies before it, as at submit */
  ferry__sim_fast_kernel_host(s, q, ferry__sim_syncs_paid(s, o->host_waits), item_issue(s, &it[0]));
  int64_t host = s->now_ns, end = q->fcount ? q->tail_ns : INT64_MIN, start = 0, busy = 0;
  const int contend = s->hw.link.contention > 0 && s->ex->queues[q->index].role != FERRY_QUEUE_CPU;
  for (uint32_t j = 0; j < o->n; j++) {
    const int64_t issue = item_issue(s, &it[j]);
    host += issue + (j ? ferry__sim_layer_share(s, issue) : 0);
    const int64_t begin = end > host ? end : host,
                  d = it[j].kernel < 0 ? it[j].duration_ns : item_ns(s, g->kernels, &it[j], context_tokens);
    if (j == 0) start = begin;
    end = contend ? ferry__sim_contended_end(s, begin, d, UINT64_MAX) : begin + d;
    busy += end - begin;
  }
  /* the host's time first: ops that end meanwhile complete, and an emptied ring starts again
   * at its first entry, where the run's entry then goes */
  ferry__sim_fast_host_busy(s, host - s->now_ns);
  struct fast_op *fo;
  ferry_status st = ferry__sim_fring_tail(s, q, &fo);
  if (st != FERRY_OK) return st;
  *fo = (struct fast_op){.start_ns = start, .end_ns = end, .flow_ns = busy, .kind = FERRY_OP_KERNEL, .chan = CHAN_NONE,
                         .n = o->n};
  ferry__sim_enqueue_placed(s, q, fo);
  return FERRY_OK;
}

ferry_status ferry__sim_graph_launch(struct ferry_exec *ex, const struct ferry_exec_graph *g, ferry_event *const *args,
                                     int64_t context_tokens) {
  struct sim_exec *s = ex->backend_state;
  /* every op gets a correlation id, as if submitted one by one (nobody sees them: no sink);
   * only this thread issues ops */
  atomic_store_explicit(&ex->next_correlation,
                        atomic_load_explicit(&ex->next_correlation, memory_order_relaxed) + g->n_submits,
                        memory_order_relaxed);
  uint64_t launched = 0;
  ferry_status st = FERRY_OK;
  for (int32_t i = 0; i < g->n_ops; i++) {
    const struct graph_op *o = &g->ops[i];
    struct sim_queue *q = &s->queues[o->queue];
    if (o->kind == FERRY_OP_KERNEL && o->n > 1) {
      launched += o->n;
      if ((st = launch_run(s, q, g, o, context_tokens)) != FERRY_OK) break;
      continue;
    }
    ferry_event *ev = o->param >= 0 ? args[o->param] : o->ev;
    if (o->kind == FERRY_OP_WAIT && !ferry__event_wait_gen(ev)) continue; /* as the wrapper decides */
    launched++;
    int64_t d = o->duration_ns, flow_ns = o->flow_ns, issue = o->issue_ns;
    uint64_t gen = o->flow_bytes;
    int chan = o->chan;
    if (o->kind == FERRY_OP_KERNEL) {
      const struct graph_item *it = &g->items[o->item];
      issue = item_issue(s, it);
      ferry__sim_fast_kernel_host(s, q, ferry__sim_syncs_paid(s, o->host_waits), issue);
      d = flow_ns = it->kernel < 0 ? it->duration_ns : item_ns(s, g->kernels, it, context_tokens);
    } else if (o->read >= 0) { /* the page cache decides where it reads from, as at submit */
      struct sim_cost c;
      if ((st = reroute(s, &g->reads[o->read], &c, &flow_ns)) != FERRY_OK) break;
      d = c.duration_ns;
      chan = c.chan;
      gen = c.flow_bytes;
    }
    ferry__sim_fast_host_busy(s, issue);
    /* a record behind a running op goes with that op's entry: no entry of its own to fill */
    if (o->kind == FERRY_OP_RECORD && ferry__sim_record_behind(s, q, ev, gen = ferry__event_record_gen(ev))) continue;
    struct fast_op *fo;
    if ((st = ferry__sim_fring_tail(s, q, &fo)) != FERRY_OK) break;
    *fo = (struct fast_op){.ev = ev, .gen = gen, .bytes = o->bytes, .flow_ns = flow_ns, .kind = o->kind,
                           .chan = (int8_t)chan, .host_waits = o->kind == FERRY_OP_KERNEL ? 0 : o->host_waits,
                           .n = 1};
    if ((st = ferry__sim_enqueue_timed(s, q, fo, d)) != FERRY_OK) break;
  }
  s->graph_ops += launched;
  return st;
}

/* ---- checking (FERRY_SIM_CHECK) ------------------------------------------------------------------ */

ferry_status ferry__sim_graph_check(struct ferry_exec *ex, const struct ferry_exec_graph *g, int64_t context_tokens,
                                    int *same) {
  struct sim_exec *s = ex->backend_state;
  struct sim_graph_capture *c = s->capture;
  *same = 0;
  if (!c || !c->active) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: not recording");
  c->active = 0;
  if (c->failed) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory recording an op graph");
  merge_kernels(s, c);
  if (c->n_ops != g->n_ops || c->n_items != g->n_items) return FERRY_OK;
  for (int32_t i = 0; i < g->n_ops; i++) {
    const struct graph_op *x = &g->ops[i], *y = &c->ops[i];
    if (x->kind != y->kind || x->queue != y->queue || x->param != y->param || x->ev != y->ev || x->n != y->n ||
        x->issue_ns != y->issue_ns || (x->read < 0) != (y->read < 0))
      return FERRY_OK;
    if (x->read >= 0) { /* routed at launch: the same read is what must match */
      const struct graph_read *a = &g->reads[x->read], *b = &c->reads[y->read];
      if (a->store != b->store || a->file != b->file || a->offset != b->offset || a->len != b->len || a->flags != b->flags)
        return FERRY_OK;
    } else if (x->chan != y->chan || x->flow_bytes != y->flow_bytes || x->bytes != y->bytes ||
               x->duration_ns != y->duration_ns || x->host_waits != y->host_waits) {
      return FERRY_OK;
    }
  }
  /* the kernels, as the launch would time them against what was just built */
  for (int32_t i = 0; i < g->n_items; i++) {
    const struct graph_item *x = &g->items[i], *y = &c->items[i];
    if (x->issue_ns != y->issue_ns || x->launches != y->launches || (x->kernel < 0) != (y->kernel < 0) ||
        item_ns(s, g->kernels, x, context_tokens) != y->duration_ns)
      return FERRY_OK;
    if (y->kernel >= 0 && context_tokens >= 0 && c->kernels[y->kernel].k.context_tokens != context_tokens) return FERRY_OK;
  }
  *same = 1;
  return FERRY_OK;
}

size_t ferry__sim_graph_bytes(const struct ferry_exec_graph *g) {
  return g->shared ? 0
                   : sizeof *g + (size_t)g->n_ops * sizeof *g->ops + (size_t)g->n_items * sizeof *g->items +
                         (size_t)g->n_kernels * sizeof *g->kernels + (size_t)g->n_reads * sizeof *g->reads;
}

void ferry__sim_graph_free(struct ferry_exec *ex, struct ferry_exec_graph *g) {
  (void)ex;
  if (!g->shared) ferry_free(g); /* shared ones go with the executor */
}
