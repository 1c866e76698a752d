/* The `sim` executor's fast path (FERRY_SIM_FAST, FERRY_SIM_CHECK): each op's start and end are
 * worked out when it is enqueued, from its queue's last op, the event it waits for and the host
 * clock, instead of by running events. That is exact when no two queues share a channel at
 * once (a lone transfer's time is known when it starts), which is how the engine uses its
 * queues; an op that would share one is refused. Ops stay in their queue's ring until the host
 * clock passes their end, and complete then in time order with the code the event-driven path
 * uses, so counters, stalls, busy times, event generations and activities are the same.
 * Op graphs (exec_sim_graph.c) replay recorded ops through the same enqueue_timed(). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/io.h"
#include "runtime/exec/graph.h"
#include "sim/exec_sim_impl.h"

/* When an event's latest recorded generation completes (kept in the event: one line less to
 * fetch per op than a separate record). */
static int64_t record_end(const ferry_event *ev) { return ev->record_end_ns; }

/* ---- the ring ---------------------------------------------------------------------------------- */

#define FRING_INITIAL 64u

ferry_status ferry__sim_fring_grow(struct sim_exec *s, struct sim_queue *q) {
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


void ferry__sim_fast_free(struct sim_exec *s) {
  for (int32_t i = 0; i < FERRY_EXEC_MAX_QUEUES; i++) {
    ferry_free(s->queues[i].fring);
    ferry_free(s->queues[i].ffull);
  }
  ferry__sim_graph_state_free(s);
}

/* ---- timing and completion --------------------------------------------------------------------- */

static const char *chan_name(int c) {
  static const char *names[CHAN_COUNT] = {"the link's host-to-device direction", "the link's device-to-host direction",
                                          "the disk", "host memory", "device memory",
                                          "the GPU-to-GPU interconnect", "the interconnect (all-gather)",
                                          "the disk's write side"};
  return c >= 0 && c < CHAN_COUNT ? names[c] : "?";
}

/* A read done: the I/O layer's counters as the event path keeps them (one read, one attempt:
 * the fast path runs only without injected faults, see ferry__sim_fast_submit()). */
static void count_read(struct sim_exec *s) {
  s->reads++;
  ferry__io_count(FERRY__IO_READS, 1);
  ferry__io_count(FERRY__IO_ATTEMPTS, 1);
}

/* A copy or read done: its channel's time and flow, and the bytes a copy to the device really
 * copied (its flow differs for a source of the other memory kind, ferry__sim_prepare()). */
static void account_transfer(struct sim_exec *s, const struct fast_op *fo) {
  if (fo->kind == FERRY_OP_COPY) s->copies++;
  else count_read(s);
  ferry__fluid_account(s->chan[fo->chan], fo->gen, fo->flow_ns);
  if (fo->chan == CHAN_H2D) s->bytes_h2d += fo->bytes;
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
      ferry__compute_account_many(q->unit, fo->n, fo->flow_ns);
      break;
    case FERRY_OP_COPY:
    case FERRY_OP_READ:
      account_transfer(s, fo);
      break;
    case FERRY_OP_WAIT:
      if (fo->end_ns > fo->start_ns) atomic_fetch_add(&s->ex->queues[q->index].stall_ns, fo->end_ns - fo->start_ns);
      break;
    case FERRY_OP_RECORD: raise_event(fo->ev, fo->gen, fo->end_ns); break;
  }
  ferry__exec_op_done(s->ex, q->index, op, fo->start_ns, fo->end_ns);
  if (fo->rec_ev) { /* a record kept with it (enqueued before the sink was installed) */
    raise_event(fo->rec_ev, fo->rec_gen, fo->end_ns);
    s->pending_ops--;
    s->ops_done++;
  }
  q->last_done_ns = fo->end_ns;
  q->fcount--;
  q->fhead = q->fcount ? (q->fhead + 1) & (q->fcap - 1) : 0;
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
      case FERRY_OP_KERNEL: /* flow_ns: the kernels' time, without the gaps of a merged run */
        kernels += fo->n;
        compute += fo->flow_ns;
        busy += fo->flow_ns;
        break;
      case FERRY_OP_COPY:
      case FERRY_OP_READ:
        account_transfer(s, fo);
        busy += span;
        break;
      case FERRY_OP_WAIT: stall += span; break;
      case FERRY_OP_RECORD: raise_event(fo->ev, fo->gen, fo->end_ns); break;
    }
    if (fo->rec_ev) {
      raise_event(fo->rec_ev, fo->rec_gen, fo->end_ns);
      ops++;
    }
    q->last_done_ns = fo->end_ns;
    done++;
  }
  if (kernels) ferry__compute_account_many(q->unit, kernels, compute);
  s->kernels += kernels;
  atomic_store_explicit(&xq->busy_ns, busy, memory_order_relaxed);
  atomic_store_explicit(&xq->stall_ns, stall, memory_order_relaxed);
  q->fcount -= done;
  q->fhead = q->fcount ? (q->fhead + done) & mask : 0; /* emptied: start again at the ring's first lines */
  s->pending_ops -= ops;
  s->ops_done += ops;
}

/* Complete every op that ended by the host clock. With an activity sink, earliest first (ties
 * by queue index) so activities come in time order; without one the order cannot be seen. */
void ferry__sim_catch_up(struct sim_exec *s) {
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
 * count it, and move the host clock past issuing it. A queue whose ops have all ended before
 * now has gone idle: its next op waits for the queue's wake-up latency, as in the
 * event-driven path. A record behind an op still running is kept with that op's entry. */
ferry_status ferry__sim_enqueue_timed(struct sim_exec *s, struct sim_queue *q, struct fast_op *fo, int64_t duration_ns) {
  int64_t now = s->now_ns;
  const int64_t start = q->fcount ? q->tail_ns : (s->wake_ns > 0 && q->last_done_ns < now ? now + s->wake_ns : now);
  int64_t end = start;
  switch (fo->kind) {
    case FERRY_OP_KERNEL:
      end = start + duration_ns;
      if (s->hw.link.contention > 0 && s->ex->queues[q->index].role != FERRY_QUEUE_CPU) {
        end = ferry__sim_contended_end(s, start, duration_ns, UINT64_MAX); /* every transfer noted was issued before */
        fo->flow_ns = end - start;
      }
      break;
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
      if (s->hw.link.contention > 0 && ferry__sim_link_chan(fo->chan)) {
        ferry_status st = ferry__sim_flow_note(s, end - fo->flow_ns, end, 0, now);
        if (st != FERRY_OK) return st;
      }
      break;
    }
    case FERRY_OP_RECORD:
      if (ferry__sim_record_behind(s, q, fo->ev, fo->gen)) return FERRY_OK;
      fo->ev->record_end_ns = start;
      break;
    case FERRY_OP_WAIT: {
      const int64_t r = record_end(fo->ev); /* the generation waited for is the latest */
      if (r > start) end = r + s->event_wake_ns; /* the queue's thread slept in the wait: woken */
      break;
    }
  }
  fo->start_ns = start;
  fo->end_ns = end;
  ferry__sim_enqueue_placed(s, q, fo);
  /* queueing takes host time too (the host executor's threads) */
  ferry__sim_fast_host_busy(s, s->submit_ns);
  /* a runtime that fetches weights synchronously issues compute only once they are there: the
   * host blocks until the awaited record, not until the compute queue reaches the wait (kernels
   * queued before it may still run; sim_submit() waits for the event's generation alike); a copy
   * from pageable memory returns once done */
  now = s->now_ns;
  const int sync_fetch = s->rt.sync_fetch && fo->kind == FERRY_OP_WAIT && s->ex->queues[q->index].role == FERRY_QUEUE_COMPUTE;
  if (sync_fetch && record_end(fo->ev) > now)
    ferry__sim_fast_host_busy(s, record_end(fo->ev) - now);
  else if (!sync_fetch && fo->host_waits && end > now)
    ferry__sim_fast_host_busy(s, end - now);
  return FERRY_OK;
}

void ferry__sim_enqueue_placed(struct sim_exec *s, struct sim_queue *q, struct fast_op *fo) {
  q->tail_ns = fo->end_ns;
  if (!q->fcount && fo->end_ns < s->next_end_ns) s->next_end_ns = fo->end_ns; /* a new head */
  q->fcount++;
  s->pending_ops += fo->n;
  if (fo->end_ns <= s->now_ns) { /* only the head can end by now: the ops before it ended */
    if (s->ex->sink) complete_reported(s, q);
    else complete_quiet(s, q);
  }
}


ferry_status ferry__sim_fast_submit(struct sim_exec *s, int32_t queue, const struct ferry_op *op) {
  struct sim_queue *q = &s->queues[queue];
  struct sim_cost c;
  struct fast_op *fo;
  ferry_status st;
  /* injected faults (ferry/fault.h) are drawn as ops start, which only the event path models:
   * an executor created with faults installed runs exact (ferry_exec_create_sim()) */
  if (__builtin_expect(ferry_fault_active(), 0))
    return ferry__err_set(&s->ex->err, FERRY_ERR_INVALID,
                          "sim executor: faults were installed after this fast-mode executor was created; install "
                          "them first (it then runs in exact mode) or create it with sim_mode FERRY_SIM_EXACT");
  if ((st = ferry__sim_prepare(s, &c, op, s->ex->queues[queue].role == FERRY_QUEUE_CPU)) != FERRY_OK) return st;
  const int64_t issue = ferry__sim_issue_ns(s, &c, op);
  if (op->kind == FERRY_OP_KERNEL) ferry__sim_fast_kernel_host(s, q, ferry__sim_kernel_syncs(s, &op->u.kernel), issue);
  ferry__sim_fast_host_busy(s, issue); /* the runtime issues it before it reaches the queue */
  if ((st = ferry__sim_fring_tail(s, q, &fo)) != FERRY_OK) return st;
  fo->kind = (uint8_t)op->kind;
  fo->chan = (int8_t)c.chan;
  fo->ev = op->kind == FERRY_OP_RECORD || op->kind == FERRY_OP_WAIT ? op->u.event.ev : NULL;
  fo->gen = op->kind == FERRY_OP_RECORD ? op->u.event.gen : c.flow_bytes;
  fo->bytes = op->kind == FERRY_OP_COPY ? op->u.copy.bytes : op->kind == FERRY_OP_READ ? op->u.read.len : 0;
  fo->flow_ns = c.duration_ns; /* kernels: their time; transfers: set just below */
  fo->full = 0;
  fo->host_waits = (uint8_t)c.host_waits;
  fo->n = 1;
  fo->rec_ev = NULL;
  if (c.chan != CHAN_NONE) c.duration_ns = ferry__fluid_alone_ns(s->chan[c.chan], c.flow_bytes, &fo->flow_ns);
  if (s->ex->sink) { /* keep the whole op for its activity */
    if (!q->ffull && !(q->ffull = ferry__reallocarray(NULL, q->fcap, sizeof *q->ffull)))
      return ferry__err_set(&s->ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for queue %d's ops", queue);
    q->ffull[(q->fhead + q->fcount) & (q->fcap - 1)] = *op;
    fo->full = 1;
  }
  const int64_t flow_ns = fo->flow_ns;
  if ((st = ferry__sim_enqueue_timed(s, q, fo, c.duration_ns)) != FERRY_OK) return st;
  if (s->capture) ferry__sim_graph_capture_op(s, queue, &c, flow_ns, issue, op);
  return FERRY_OK;
}

ferry_status ferry__sim_fast_sync(struct sim_exec *s, ferry_event *ev, uint64_t gen) {
  (void)gen; /* the latest generation (the wrapper's): its record ends at record_end() */
  const int64_t r = record_end(ev);
  if (r > s->now_ns) s->now_ns = r;
  ferry__sim_catch_up(s);
  /* the host notices the event only after its wake-up latency */
  ferry__sim_fast_host_busy(s, s->sync_ns);
  return FERRY_OK;
}

void ferry__sim_fast_sleep_until(struct sim_exec *s, int64_t t_ns) {
  if (t_ns > s->now_ns) s->now_ns = t_ns;
  ferry__sim_catch_up(s);
}

ferry_status ferry__sim_fast_drain(struct sim_exec *s) {
  for (int32_t i = 0; i < s->ex->n_queues; i++) {
    const struct sim_queue *q = &s->queues[i];
    if (q->fcount && q->tail_ns > s->now_ns) s->now_ns = q->tail_ns;
  }
  ferry__sim_catch_up(s);
  return FERRY_OK;
}

