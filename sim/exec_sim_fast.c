/* The `sim` executor's fast path (FERRY_SIM_FAST, FERRY_SIM_CHECK): each op's start and end are
 * worked out when it is enqueued, from its queue's last op, the event it waits for and the host
 * clock, instead of by running events. That is exact when no two queues share a channel at
 * once (a lone transfer's time is known when it starts), which is how the engine uses its
 * queues; an op that would share one is refused. Ops stay in their queue's ring until the host
 * clock passes their end, and complete then in time order with the code the event-driven path
 * uses, so counters, stalls, busy times, event generations and activities are the same.
 * Plus op graphs (runtime/exec/graph.h): recorded ops replayed without the engine building them. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "runtime/exec/graph.h"
#include "sim/exec_sim_impl.h"

/* When an event's latest recorded generation completes (kept in the event: one line less to
 * fetch per op than a separate record). */
static int64_t record_end(const ferry_event *ev) { return ev->record_end_ns; }

static void graph_state_free(struct sim_exec *s);

/* ---- the ring ---------------------------------------------------------------------------------- */

#define FRING_INITIAL 64u

static ferry_status fring_grow(struct sim_exec *s, struct sim_queue *q) {
  const uint32_t cap = q->fcap ? 2 * q->fcap : FRING_INITIAL;
  if (cap < q->fcap) return ferry__err_set(&s->ex->err, FERRY_ERR_RANGE, "sim executor: queue %d is full", q->index);
  struct fast_op *r = ferry__reallocarray(NULL, cap, sizeof *r);
  struct ferry_op *full = q->ffull ? ferry__reallocarray(NULL, cap, sizeof *full) : NULL;
  if (!r || (q->ffull && !full)) {
    ferry_free(r);
    ferry_free(full);
    return ferry__err_set(&s->ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for %u ops on queue %d", cap,
                          q->index);
  }
  /* unwrap into the new ring so the head is at 0 */
  for (uint32_t i = 0; i < q->fcount; i++) {
    r[i] = q->fring[(q->fhead + i) & (q->fcap - 1)];
    if (full) full[i] = q->ffull[(q->fhead + i) & (q->fcap - 1)];
  }
  ferry_free(q->fring);
  ferry_free(q->ffull);
  q->fring = r;
  q->ffull = full;
  q->fcap = cap;
  q->fhead = 0;
  return FERRY_OK;
}

/* The entry after q's last op, the ring grown when full. */
static inline ferry_status fring_tail(struct sim_exec *s, struct sim_queue *q, struct fast_op **out) {
  ferry_status st;
  if (q->fcount == q->fcap && (st = fring_grow(s, q)) != FERRY_OK) return st;
  *out = &q->fring[(q->fhead + q->fcount) & (q->fcap - 1)];
  return FERRY_OK;
}

void ferry__sim_fast_free(struct sim_exec *s) {
  for (int32_t i = 0; i < FERRY_EXEC_MAX_QUEUES; i++) {
    ferry_free(s->queues[i].fring);
    ferry_free(s->queues[i].ffull);
  }
  graph_state_free(s);
}

/* ---- timing and completion --------------------------------------------------------------------- */

static const char *chan_name(int c) {
  static const char *names[CHAN_COUNT] = {"the link's host-to-device direction", "the link's device-to-host direction",
                                          "the disk", "host memory", "device memory"};
  return c >= 0 && c < CHAN_COUNT ? names[c] : "?";
}

static void raise_event(ferry_event *ev, uint64_t gen, int64_t t_ns) {
  if (atomic_load_explicit(&ev->done_gen, memory_order_relaxed) < gen) {
    atomic_store(&ev->done_gen, gen);
    ev->done_time_ns = t_ns;
  }
}

/* The head op of q ended by the host clock, with an activity sink: account for it and report
 * it as the event-driven path does (ferry__sim_op_complete()). */
static void complete_reported(struct sim_exec *s, struct sim_queue *q) {
  const uint32_t at = q->fhead;
  const struct fast_op *fo = &q->fring[at];
  struct ferry_op stub, *op = fo->full ? &q->ffull[at] : &stub;
  if (!fo->full) { /* a sink installed while the op was queued: reported without its shape */
    memset(&stub, 0, sizeof stub);
    stub.kind = (enum ferry_op_kind)fo->kind;
    if (fo->kind == FERRY_OP_KERNEL) {
      stub.u.kernel.name = "kernel";
      stub.u.kernel.layer = stub.u.kernel.expert = -1;
    }
  }
  switch (fo->kind) {
    case FERRY_OP_KERNEL:
      s->kernels += fo->n;
      ferry__compute_account_many(q->unit, fo->n, fo->end_ns - fo->start_ns);
      break;
    case FERRY_OP_COPY:
    case FERRY_OP_READ:
      if (fo->kind == FERRY_OP_COPY) s->copies++;
      else s->reads++;
      ferry__fluid_account(s->chan[fo->chan], fo->gen, fo->flow_ns);
      break;
    case FERRY_OP_WAIT:
      if (fo->end_ns > fo->start_ns) atomic_fetch_add(&s->ex->queues[q->index].stall_ns, fo->end_ns - fo->start_ns);
      break;
    case FERRY_OP_RECORD: raise_event(fo->ev, fo->gen, fo->end_ns); break;
  }
  ferry__exec_op_done(s->ex, q->index, op, fo->start_ns, fo->end_ns);
  q->last_done_ns = fo->end_ns;
  q->fhead = (q->fhead + 1) & (q->fcap - 1);
  q->fcount--;
  s->pending_ops -= fo->n;
  s->ops_done += fo->n;
}

/* The same accounting without an activity sink, for every op of q that ended by now: the
 * common case, kept lean. Only this thread issues and completes ops here, so the shared
 * counters are read and stored rather than updated atomically. */
static void complete_quiet(struct sim_exec *s, struct sim_queue *q) {
  struct ferry_exec_queue *xq = &s->ex->queues[q->index];
  int64_t busy = atomic_load_explicit(&xq->busy_ns, memory_order_relaxed);
  int64_t stall = atomic_load_explicit(&xq->stall_ns, memory_order_relaxed);
  int64_t compute = 0;
  uint64_t kernels = 0, ops = 0;
  const uint32_t mask = q->fcap - 1;
  uint32_t done = 0;
  while (done < q->fcount) {
    const struct fast_op *fo = &q->fring[(q->fhead + done) & mask];
    if (fo->end_ns > s->now_ns) break;
    const int64_t span = fo->end_ns - fo->start_ns;
    ops += fo->n;
    switch (fo->kind) {
      case FERRY_OP_KERNEL:
        kernels += fo->n;
        compute += span;
        busy += span;
        break;
      case FERRY_OP_COPY:
      case FERRY_OP_READ:
        if (fo->kind == FERRY_OP_COPY) s->copies++;
        else s->reads++;
        ferry__fluid_account(s->chan[fo->chan], fo->gen, fo->flow_ns);
        busy += span;
        break;
      case FERRY_OP_WAIT: stall += span; break;
      case FERRY_OP_RECORD: raise_event(fo->ev, fo->gen, fo->end_ns); break;
    }
    q->last_done_ns = fo->end_ns;
    done++;
  }
  if (kernels) ferry__compute_account_many(q->unit, kernels, compute);
  s->kernels += kernels;
  atomic_store_explicit(&xq->busy_ns, busy, memory_order_relaxed);
  atomic_store_explicit(&xq->stall_ns, stall, memory_order_relaxed);
  q->fhead = (q->fhead + done) & mask;
  q->fcount -= done;
  s->pending_ops -= ops;
  s->ops_done += ops;
}

/* Complete every op that ended by the host clock. With an activity sink, earliest first (ties
 * by queue index) so activities come in time order; without one the order cannot be seen. */
static void catch_up(struct sim_exec *s) {
  const int32_t n = s->ex->n_queues;
  if (s->now_ns < s->next_end_ns) return; /* nothing ends before the earliest queued end */
  if (!s->ex->sink) {
    int64_t next = INT64_MAX;
    for (int32_t i = 0; i < n; i++) {
      struct sim_queue *q = &s->queues[i];
      if (q->fcount && q->fring[q->fhead].end_ns <= s->now_ns) complete_quiet(s, q);
      if (q->fcount && q->fring[q->fhead].end_ns < next) next = q->fring[q->fhead].end_ns;
    }
    s->next_end_ns = next;
    return;
  }
  s->next_end_ns = INT64_MIN; /* with a sink: no shortcut (completions go one by one) */
  for (;;) {
    struct sim_queue *best = NULL;
    for (int32_t i = 0; i < n; i++) {
      struct sim_queue *q = &s->queues[i];
      if (q->fcount && q->fring[q->fhead].end_ns <= s->now_ns &&
          (!best || q->fring[q->fhead].end_ns < best->fring[best->fhead].end_ns))
        best = q;
    }
    if (!best) return;
    complete_reported(s, best);
  }
}

/* Time the op in q's tail entry (kind, event, bytes and flow time filled in) that lasts
 * duration_ns once started (a kernel's roofline, a transfer's time alone on its channel),
 * count it, and move the host clock past issuing it. A queue whose ops have all ended before now has gone idle: its next
 * op waits for the queue's wake-up latency, as in the event-driven path. */
static ferry_status enqueue_timed(struct sim_exec *s, struct sim_queue *q, struct fast_op *fo, int64_t duration_ns) {
  int64_t now = s->now_ns;
  const int64_t start = q->fcount ? q->tail_ns : (s->wake_ns > 0 && q->last_done_ns < now ? now + s->wake_ns : now);
  int64_t end = start;
  switch (fo->kind) {
    case FERRY_OP_KERNEL: end = start + duration_ns; break;
    case FERRY_OP_COPY:
    case FERRY_OP_READ: {
      struct sim_chan_use *u = &s->chan_use[fo->chan];
      if (u->queue >= 0 && u->queue != q->index && u->until_ns > start)
        return ferry__err_set(&s->ex->err, FERRY_ERR_UNSUPPORTED,
                              "sim executor (fast mode): at t=%lld ns queue %d would share %s with queue %d's "
                              "transfer (until t=%lld ns); the fast mode times transfers alone on their channel: "
                              "simulate with the exact mode (ferry sim --exact, FERRY_SIM_EXACT)",
                              (long long)start, q->index, chan_name(fo->chan), u->queue, (long long)u->until_ns);
      end = start + duration_ns; /* the transfer alone on its channel (ferry__fluid_alone_ns()) */
      u->until_ns = end;
      u->queue = q->index;
      break;
    }
    case FERRY_OP_RECORD: fo->ev->record_end_ns = start; break;
    case FERRY_OP_WAIT: {
      const int64_t r = record_end(fo->ev); /* the generation waited for is the latest */
      if (r > start) end = r;
      break;
    }
  }
  fo->start_ns = start;
  fo->end_ns = end;
  q->tail_ns = end;
  if (!q->fcount && end < s->next_end_ns) s->next_end_ns = end; /* a new head */
  q->fcount++;
  s->pending_ops += fo->n;
  if (end <= now) { /* only the head can end by now: the ops before it ended */
    if (s->ex->sink) complete_reported(s, q);
    else complete_quiet(s, q);
  }
  /* queueing takes host time too (the host executor's threads) */
  ferry__sim_fast_host_busy(s, s->submit_ns);
  /* a runtime that fetches weights synchronously issues compute only once they are there; a
   * copy from pageable memory returns once done (see sim_submit()) */
  now = s->now_ns;
  if (s->rt.sync_fetch && fo->kind == FERRY_OP_WAIT && s->ex->queues[q->index].role == FERRY_QUEUE_COMPUTE && end > now)
    ferry__sim_fast_host_busy(s, end - now);
  else if (s->pageable && fo->kind == FERRY_OP_COPY && fo->chan == CHAN_H2D && end > now)
    ferry__sim_fast_host_busy(s, end - now);
  return FERRY_OK;
}

void ferry__sim_fast_host_busy(struct sim_exec *s, int64_t ns) {
  if (ns <= 0) return;
  s->now_ns += ns;
  catch_up(s);
}

static void capture_op(struct sim_exec *s, int32_t queue, const struct sim_cost *c, int64_t flow_ns, int64_t issue_ns,
                       const struct ferry_op *op);

ferry_status ferry__sim_fast_submit(struct sim_exec *s, int32_t queue, const struct ferry_op *op) {
  struct sim_queue *q = &s->queues[queue];
  struct sim_cost c;
  struct fast_op *fo;
  ferry_status st;
  if ((st = ferry__sim_prepare(s, &c, op)) != FERRY_OK) return st;
  const int64_t issue = ferry__sim_issue_ns(s, &c, op);
  ferry__sim_fast_host_busy(s, issue); /* the runtime issues it before it reaches the queue */
  if ((st = fring_tail(s, q, &fo)) != FERRY_OK) return st;
  fo->kind = (uint8_t)op->kind;
  fo->chan = (int8_t)c.chan;
  fo->ev = op->kind == FERRY_OP_RECORD || op->kind == FERRY_OP_WAIT ? op->u.event.ev : NULL;
  fo->gen = op->kind == FERRY_OP_RECORD ? op->u.event.gen : c.flow_bytes;
  fo->flow_ns = 0;
  fo->full = 0;
  fo->n = 1;
  if (c.chan != CHAN_NONE) c.duration_ns = ferry__fluid_alone_ns(s->chan[c.chan], c.flow_bytes, &fo->flow_ns);
  if (s->ex->sink) { /* keep the whole op for its activity */
    if (!q->ffull && !(q->ffull = ferry__reallocarray(NULL, q->fcap, sizeof *q->ffull)))
      return ferry__err_set(&s->ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for queue %d's ops", queue);
    q->ffull[(q->fhead + q->fcount) & (q->fcap - 1)] = *op;
    fo->full = 1;
  }
  const int64_t flow_ns = fo->flow_ns;
  if ((st = enqueue_timed(s, q, fo, c.duration_ns)) != FERRY_OK) return st;
  if (s->capture) capture_op(s, queue, &c, flow_ns, issue, op);
  return FERRY_OK;
}

ferry_status ferry__sim_fast_sync(struct sim_exec *s, ferry_event *ev, uint64_t gen) {
  (void)gen; /* the latest generation (the wrapper's): its record ends at record_end() */
  const int64_t r = record_end(ev);
  if (r > s->now_ns) s->now_ns = r;
  catch_up(s);
  /* the host notices the event only after its wake-up latency */
  ferry__sim_fast_host_busy(s, s->sync_ns);
  return FERRY_OK;
}

void ferry__sim_fast_sleep_until(struct sim_exec *s, int64_t t_ns) {
  if (t_ns > s->now_ns) s->now_ns = t_ns;
  catch_up(s);
}

ferry_status ferry__sim_fast_drain(struct sim_exec *s) {
  for (int32_t i = 0; i < s->ex->n_queues; i++) {
    const struct sim_queue *q = &s->queues[i];
    if (q->fcount && q->tail_ns > s->now_ns) s->now_ns = q->tail_ns;
  }
  catch_up(s);
  return FERRY_OK;
}

/* ---- op graphs --------------------------------------------------------------------------------- */

#define GRAPH_MAX_PARAMS 8

/* An op as a graph keeps it: what timing it needs, its event as a parameter or itself. */
struct graph_op {
  uint8_t kind;        /* enum ferry_op_kind */
  int8_t queue;
  int8_t chan;
  int8_t param;        /* events: parameter index, or -1 for ev */
  int32_t kernel;      /* a kernel timed again at launch (a context): index in kernels, else -1 */
  int64_t duration_ns; /* kernels: recorded (all of them, when several run back to back); transfers: alone */
  uint64_t flow_bytes; /* copies and reads */
  ferry_event *ev;     /* events without a parameter */
  int64_t aux_ns;      /* kernels: the recorded time of the kernel timed again, part of duration_ns;
                          transfers: the part of duration_ns with bytes flowing */
  int64_t issue_ns;    /* host time issuing it (the runtime's launch or copy cost) */
  uint32_t n;          /* ops it stands for (kernels run back to back) */
  int32_t read;        /* reads: index in reads (routed again at launch: the page cache moves) */
};

/* A kernel timed again at launch, with the packed weights behind it when recorded. */
struct graph_kernel {
  struct ferry_kernel k;
  struct ferry__packed packed[3];
  uint8_t has_packed[3];
};

/* A disk read, routed again at launch (ferry__sim_route_read()). */
struct graph_read {
  const struct ferry_store *store;
  uint32_t file;
  uint64_t offset, len;
  unsigned flags;
};

struct ferry_exec_graph {
  int32_t n_ops, n_kernels, n_reads;
  struct graph_op *ops;
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
  struct graph_kernel *kernels;
  int32_t n_kernels, cap_kernels;
  struct graph_read *reads;
  int32_t n_reads, cap_reads;
  ferry_event *params[GRAPH_MAX_PARAMS];
  int32_t n_params;
  int failed; /* out of memory while recording */
  int active;
  struct sim_graph_pool pool;
};

int ferry__sim_graph_mode(struct ferry_exec *ex) {
  const struct sim_exec *s = ex->backend_state;
  return s->mode == FERRY_SIM_FAST ? FERRY__GRAPH_LAUNCH : s->mode == FERRY_SIM_CHECK ? FERRY__GRAPH_CHECK : FERRY__GRAPH_NONE;
}

static void graph_state_free(struct sim_exec *s) {
  struct sim_graph_capture *c = s->capture;
  if (!c) return;
  for (size_t i = 0; i < c->pool.cap; i++) ferry_free(c->pool.slots[i]);
  ferry_free(c->pool.slots);
  ferry_free(c->ops);
  ferry_free(c->kernels);
  ferry_free(c->reads);
  ferry_free(c);
  s->capture = NULL;
}

ferry_status ferry__sim_graph_begin(struct ferry_exec *ex, ferry_event *const *params, int32_t n_params) {
  struct sim_exec *s = ex->backend_state;
  if (s->mode == FERRY_SIM_EXACT)
    return ferry__err_set(&ex->err, FERRY_ERR_UNSUPPORTED, "sim executor: no op graphs in the exact mode");
  if (n_params > GRAPH_MAX_PARAMS)
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: %d parameters (at most %d)", n_params, GRAPH_MAX_PARAMS);
  if (!s->capture && !(s->capture = ferry__calloc(1, sizeof *s->capture)))
    return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for an op graph");
  struct sim_graph_capture *c = s->capture; /* kept between recordings: its arrays are reused */
  c->n_ops = c->n_kernels = c->n_reads = 0;
  c->failed = 0;
  c->active = 1;
  c->n_params = n_params;
  for (int32_t i = 0; i < n_params; i++) c->params[i] = params[i];
  return FERRY_OK;
}

static struct graph_op *capture_push(struct sim_graph_capture *c) {
  if (c->n_ops == c->cap_ops) {
    int32_t cap = c->cap_ops ? 2 * c->cap_ops : 32;
    struct graph_op *ops = ferry__reallocarray(c->ops, (size_t)cap, sizeof *ops);
    if (!ops) {
      c->failed = 1;
      return NULL;
    }
    c->ops = ops;
    c->cap_ops = cap;
  }
  return &c->ops[c->n_ops++];
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

/* Grow an array of n used entries of size bytes to hold one more (cap doubling). */
static void *grow_for_one(void *v, int32_t n, int32_t *cap, size_t size) {
  if (n < *cap) return v;
  const int32_t c = *cap ? 2 * *cap : 4;
  void *r = ferry__reallocarray(v, (size_t)c, size);
  if (r) *cap = c;
  return r;
}

static void capture_op(struct sim_exec *s, int32_t queue, const struct sim_cost *c_op, int64_t flow_ns, int64_t issue_ns,
                       const struct ferry_op *op) {
  struct sim_graph_capture *c = s->capture;
  if (!c->active) return;
  struct graph_op *g = capture_push(c);
  if (!g) return;
  *g = (struct graph_op){.kind = (uint8_t)op->kind, .queue = (int8_t)queue, .chan = (int8_t)c_op->chan, .param = -1,
                         .kernel = -1, .duration_ns = c_op->duration_ns, .flow_bytes = c_op->flow_bytes,
                         .aux_ns = flow_ns, .issue_ns = issue_ns, .n = 1, .read = -1};
  if (op->kind == FERRY_OP_RECORD || op->kind == FERRY_OP_WAIT) capture_event(c, g, op->u.event.ev);
  if (op->kind == FERRY_OP_READ) {
    struct graph_read *r = grow_for_one(c->reads, c->n_reads, &c->cap_reads, sizeof *r);
    if (!r) {
      c->failed = 1;
      return;
    }
    c->reads = r;
    c->reads[c->n_reads] = (struct graph_read){op->u.read.store, op->u.read.file, op->u.read.offset, op->u.read.len,
                                               op->u.read.flags};
    g->read = c->n_reads++;
  }
  if (op->kind == FERRY_OP_KERNEL && op->u.kernel.context_tokens > 0) {
    /* its time depends on the context the launch gives: keep the kernel, and the packed weights
     * its cost read, to time it again */
    struct graph_kernel *k = grow_for_one(c->kernels, c->n_kernels, &c->cap_kernels, sizeof *k);
    if (!k) {
      c->failed = 1;
      return;
    }
    c->kernels = k;
    struct graph_kernel *gk = &c->kernels[c->n_kernels];
    memset(gk, 0, sizeof *gk);
    gk->k = op->u.kernel;
    const struct ferry__packed *packed[3] = {NULL, NULL, NULL};
    const struct ferry_kernel *kk = &op->u.kernel;
    if (kk->kind == FERRY_K_MATMUL || kk->kind == FERRY_K_EXPERT || kk->kind == FERRY_K_MLA_ATTENTION ||
        kk->kind == FERRY_K_EMBED) {
      packed[0] = ferry__sim_packed_at(s, kk->w);
      if (kk->kind == FERRY_K_EXPERT) packed[1] = ferry__sim_packed_at(s, kk->aux[0]), packed[2] = ferry__sim_packed_at(s, kk->aux[1]);
    }
    for (int i = 0; i < 3; i++)
      if (packed[i]) gk->packed[i] = *packed[i], gk->has_packed[i] = 1;
    g->kernel = c->n_kernels++;
    g->aux_ns = c_op->duration_ns;
  }
}

void ferry__sim_graph_skipped_wait(struct ferry_exec *ex, int32_t queue, ferry_event *ev) {
  struct sim_exec *s = ex->backend_state;
  struct sim_graph_capture *c = s->capture;
  if (!c || !c->active) return;
  struct graph_op *g = capture_push(c);
  if (!g) return;
  *g = (struct graph_op){.kind = FERRY_OP_WAIT, .queue = (int8_t)queue, .chan = CHAN_NONE, .kernel = -1, .n = 1, .read = -1};
  capture_event(c, g, ev);
}

static int op_equal(const struct graph_op *x, const struct graph_op *y) {
  return x->kind == y->kind && x->queue == y->queue && x->chan == y->chan && x->param == y->param && x->ev == y->ev &&
         x->flow_bytes == y->flow_bytes && x->duration_ns == y->duration_ns && x->kernel == y->kernel &&
         x->aux_ns == y->aux_ns && x->n == y->n && x->issue_ns == y->issue_ns && x->read == y->read;
}

/* Kernels recorded back to back on one queue run back to back at every launch when issuing
 * takes no host time and no queue sleeps (no launch cost, host.submit_ns = host.queue_wake_ns
 * = 0): one op
 * for them all, as long as duration, with at most one kernel timed again by the context. The
 * ops in between, on other queues, keep their order on theirs. Only the moments inside such a
 * run are lost, and nothing looks at them: no event is recorded there and the host does not
 * wait in a graph. */
static void merge_kernels(const struct sim_exec *s, struct graph_op *ops, int32_t *n) {
  if (s->submit_ns > 0 || s->wake_ns > 0) return;
  int32_t out = 0;
  for (int32_t i = 0; i < *n; i++) {
    struct graph_op *prev = out > 0 ? &ops[out - 1] : NULL;
    const struct graph_op *o = &ops[i];
    if (prev && prev->kind == FERRY_OP_KERNEL && o->kind == FERRY_OP_KERNEL && prev->queue == o->queue &&
        (prev->kernel < 0 || o->kernel < 0) && !prev->issue_ns && !o->issue_ns) {
      prev->duration_ns += o->duration_ns;
      prev->n += o->n;
      if (o->kernel >= 0) {
        prev->kernel = o->kernel;
        prev->aux_ns = o->aux_ns;
      }
      continue;
    }
    ops[out++] = *o;
  }
  *n = out;
}

static uint64_t ops_hash(const struct graph_op *ops, int32_t n) {
  uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)n;
  for (int32_t i = 0; i < n; i++) {
    const struct graph_op *o = &ops[i];
    const uint64_t v[4] = {(uint64_t)o->kind | (uint64_t)(uint8_t)o->queue << 8 | (uint64_t)(uint8_t)o->chan << 16 |
                               (uint64_t)(uint8_t)o->param << 24,
                           (uint64_t)o->duration_ns, o->flow_bytes, (uint64_t)(uintptr_t)o->ev};
    for (int j = 0; j < 4; j++) h = (h ^ v[j]) * 0x100000001b3ULL;
  }
  return h;
}

/* The pool's graph equal to the recording (n ops, no kernel to time again), or the empty slot
 * where it goes. */
static struct ferry_exec_graph **pool_find(struct sim_graph_pool *p, const struct graph_op *ops, int32_t n, uint64_t h) {
  size_t i = (size_t)h & (p->cap - 1);
  for (;; i = (i + 1) & (p->cap - 1)) {
    struct ferry_exec_graph *g = p->slots[i];
    if (!g) return &p->slots[i];
    if (g->hash != h || g->n_ops != n) continue;
    int32_t k = 0;
    while (k < n && op_equal(&g->ops[k], &ops[k])) k++;
    if (k == n) return &p->slots[i];
  }
}

static int pool_grow(struct sim_graph_pool *p) {
  const size_t cap = p->cap ? 2 * p->cap : 256;
  struct sim_graph_pool q = {ferry__calloc(cap, sizeof *q.slots), cap, p->n};
  if (!q.slots) return 0;
  for (size_t i = 0; i < p->cap; i++)
    if (p->slots[i]) *pool_find(&q, p->slots[i]->ops, p->slots[i]->n_ops, p->slots[i]->hash) = p->slots[i];
  ferry_free(p->slots);
  *p = q;
  return 1;
}

ferry_status ferry__sim_graph_end(struct ferry_exec *ex, struct ferry_exec_graph **out) {
  struct sim_exec *s = ex->backend_state;
  struct sim_graph_capture *c = s->capture;
  *out = NULL;
  if (!c || !c->active) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: not recording");
  c->active = 0;
  if (c->failed) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory recording an op graph");
  merge_kernels(s, c->ops, &c->n_ops);
  const uint64_t h = ops_hash(c->ops, c->n_ops);
  struct ferry_exec_graph **slot = NULL;
  if (!c->n_kernels && !c->n_reads && (2 * (c->pool.n + 1) <= c->pool.cap || pool_grow(&c->pool))) {
    slot = pool_find(&c->pool, c->ops, c->n_ops, h);
    if (*slot) { /* recorded before under another key */
      *out = *slot;
      return FERRY_OK;
    }
  }
  const size_t ops = (size_t)c->n_ops * sizeof *c->ops, kernels = (size_t)c->n_kernels * sizeof *c->kernels,
               reads = (size_t)c->n_reads * sizeof *c->reads;
  struct ferry_exec_graph *g = ferry__calloc(1, sizeof *g + ops + kernels + reads);
  if (!g) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for an op graph");
  g->n_ops = c->n_ops;
  g->n_kernels = c->n_kernels;
  g->n_reads = c->n_reads;
  g->ops = (struct graph_op *)(g + 1);
  g->kernels = (struct graph_kernel *)((char *)g->ops + ops);
  g->reads = (struct graph_read *)((char *)g->kernels + kernels);
  g->hash = h;
  if (ops) memcpy(g->ops, c->ops, ops);
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

/* A graph op's duration at launch: recorded, or timed again with the launch's context. */
static int64_t op_duration(struct sim_exec *s, const struct ferry_exec_graph *g, const struct graph_op *o,
                           int64_t context_tokens) {
  if (o->kernel < 0 || context_tokens < 0) return o->duration_ns;
  const struct graph_kernel *gk = &g->kernels[o->kernel];
  struct ferry_kernel k = gk->k;
  k.context_tokens = context_tokens;
  const struct ferry__packed *packed[3];
  for (int i = 0; i < 3; i++) packed[i] = gk->has_packed[i] ? &gk->packed[i] : NULL;
  int folded;
  struct ferry__gpu_work w;
  return o->duration_ns - o->aux_ns + ferry__sim_kernel_ns(s, &k, packed, &folded, &w); /* timed once already: cannot fail */
}

/* A recorded read, routed again (the page cache may hold it now, or no longer): its channel,
 * bytes and time alone on the channel. */
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

ferry_status ferry__sim_graph_launch(struct ferry_exec *ex, const struct ferry_exec_graph *g, ferry_event *const *args,
                                     int64_t context_tokens) {
  struct sim_exec *s = ex->backend_state;
  /* every op gets a correlation id, as if submitted one by one (nobody sees them: no sink);
   * only this thread issues ops */
  atomic_store_explicit(&ex->next_correlation,
                        atomic_load_explicit(&ex->next_correlation, memory_order_relaxed) + (uint64_t)g->n_ops,
                        memory_order_relaxed);
  for (int32_t i = 0; i < g->n_ops; i++) {
    const struct graph_op *o = &g->ops[i];
    ferry_event *ev = o->param >= 0 ? args[o->param] : o->ev;
    uint64_t gen = o->flow_bytes;
    if (o->kind == FERRY_OP_WAIT && !ferry__event_wait_gen(ev)) continue; /* as the wrapper decides */
    int64_t d = o->duration_ns, flow_ns = o->aux_ns;
    int chan = o->chan;
    ferry_status st;
    if (o->read >= 0) { /* the page cache decides where it reads from, as at submit */
      struct sim_cost c;
      if ((st = reroute(s, &g->reads[o->read], &c, &flow_ns)) != FERRY_OK) return st;
      d = c.duration_ns;
      chan = c.chan;
      gen = c.flow_bytes;
    }
    ferry__sim_fast_host_busy(s, o->issue_ns);
    if (o->kind == FERRY_OP_RECORD) gen = ferry__event_record_gen(ev);
    struct sim_queue *q = &s->queues[o->queue];
    struct fast_op *fo;
    if ((st = fring_tail(s, q, &fo)) != FERRY_OK) return st;
    fo->kind = o->kind;
    fo->chan = (int8_t)chan;
    fo->ev = ev;
    fo->gen = gen;
    fo->full = 0;
    fo->n = o->n;
    s->graph_ops += o->n;
    if (o->kind == FERRY_OP_KERNEL) {
      fo->flow_ns = 0;
      if (o->kernel >= 0) d = op_duration(s, g, o, context_tokens);
    } else {
      fo->flow_ns = flow_ns;
    }
    if ((st = enqueue_timed(s, q, fo, d)) != FERRY_OK) return st;
  }
  return FERRY_OK;
}

ferry_status ferry__sim_graph_check(struct ferry_exec *ex, const struct ferry_exec_graph *g, int64_t context_tokens,
                                    int *same) {
  struct sim_exec *s = ex->backend_state;
  struct sim_graph_capture *c = s->capture;
  *same = 0;
  if (!c || !c->active) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: not recording");
  c->active = 0;
  if (c->failed) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory recording an op graph");
  merge_kernels(s, c->ops, &c->n_ops);
  if (c->n_ops != g->n_ops) return FERRY_OK;
  for (int32_t i = 0; i < g->n_ops; i++) {
    const struct graph_op *x = &g->ops[i], *y = &c->ops[i];
    if (x->kind != y->kind || x->queue != y->queue || x->param != y->param || x->ev != y->ev ||
        (x->kernel < 0) != (y->kernel < 0) || x->n != y->n || x->issue_ns != y->issue_ns || (x->read < 0) != (y->read < 0))
      return FERRY_OK;
    if (x->read >= 0) { /* routed at launch: the same read is what must match */
      const struct graph_read *a = &g->reads[x->read], *b = &c->reads[y->read];
      if (a->store != b->store || a->file != b->file || a->offset != b->offset || a->len != b->len || a->flags != b->flags)
        return FERRY_OK;
      continue;
    }
    if (x->chan != y->chan || x->flow_bytes != y->flow_bytes) return FERRY_OK;
    if (x->kind == FERRY_OP_KERNEL && op_duration(s, g, x, context_tokens) != y->duration_ns) return FERRY_OK;
    if (y->kernel >= 0 && context_tokens >= 0 && c->kernels[y->kernel].k.context_tokens != context_tokens) return FERRY_OK;
  }
  *same = 1;
  return FERRY_OK;
}

size_t ferry__sim_graph_bytes(const struct ferry_exec_graph *g) {
  return g->shared ? 0
                   : sizeof *g + (size_t)g->n_ops * sizeof *g->ops + (size_t)g->n_kernels * sizeof *g->kernels +
                         (size_t)g->n_reads * sizeof *g->reads;
}

void ferry__sim_graph_free(struct ferry_exec *ex, struct ferry_exec_graph *g) {
  (void)ex;
  if (!g->shared) ferry_free(g); /* shared ones go with the executor */
}
