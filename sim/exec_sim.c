/* The `sim` executor: the executor interface carried out in virtual time. Each queue keeps its
 * ops in a ring and hands the head op to a resource model (compute unit, link direction, disk,
 * memory bus) when the op before it completes; records and waits resolve event generations at
 * the virtual time the queue reaches them. No engine or policy logic lives here. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/io.h"
#include "common/log.h"
#include "ferry/store.h"
#include "sim/exec_sim_impl.h"
#include "sim/cpu_cost.h"
#include "sim/interconnect.h"

#define RING_INITIAL 64u /* ops per queue before the first growth (a power of two) */

static const struct ferry_exec_backend sim_backend;

static struct sim_exec *state(struct ferry_exec *ex) { return ex->backend_state; }

static const char *role_name(enum ferry_queue_role r) {
  static const char *names[] = {"compute", "h2d", "d2h", "disk", "cpu"};
  return (unsigned)r < 5 ? names[r] : "?";
}

/* ---- running ops ----------------------------------------------------------------------------- */

static void kick(struct sim_exec *s, int32_t q) { s->runnable |= 1u << q; }
static void pump(struct sim_exec *s);

void ferry__sim_op_complete(struct sim_queue *q, int64_t start_ns, int64_t end_ns) {
  struct sim_exec *s = q->s;
  struct sim_op *so = &q->ring[q->head];
  /* kernels, copies and reads are counted by job_done() when they ran: one that failed (an
   * injected device failure, a read out of attempts, a resource that refused it) completes here
   * too, but did nothing */
  if (so->op.kind == FERRY_OP_KERNEL && !so->full && s->ex->sink) {
    /* a sink installed while the kernel was queued: report it without its shape */
    memset(&so->op.u.kernel, 0, sizeof so->op.u.kernel);
    so->op.u.kernel.name = "kernel";
    so->op.u.kernel.layer = so->op.u.kernel.expert = -1;
  }
  ferry__exec_op_done(s->ex, q->index, &so->op, start_ns, end_ns);
  q->head = (q->head + 1) & (q->cap - 1);
  q->count--;
  q->completed++;
  q->last_done_ns = end_ns;
  s->pending_ops--;
  s->ops_done++;
}

/* A queue's WAIT, blocked since blocked_since, ends at now: counted as stall, as the host
 * executor counts the time its queue thread spent in the wait. */
static void end_wait(struct sim_queue *w, int64_t now) {
  atomic_fetch_add(&w->s->ex->queues[w->index].stall_ns, now - w->blocked_since);
  ferry__sim_op_complete(w, w->blocked_since, now);
  kick(w->s, w->index);
}

static void wake_from_wait(struct ferry__des *des, void *ctx) {
  struct sim_queue *w = ctx;
  w->waking = 0;
  end_wait(w, ferry__des_now(des));
  pump(w->s);
}

/* Released queues are only marked runnable; the pump starts them after the current queue, so
 * the order of everything at one instant is fixed by queue index and submission order. */
void ferry__sim_event_complete(struct sim_exec *s, ferry_event *ev, uint64_t gen, int64_t now) {
  if (atomic_load(&ev->done_gen) < gen) {
    atomic_store(&ev->done_gen, gen);
    ev->done_time_ns = now;
  }
  uint64_t done = atomic_load(&ev->done_gen);
  for (int32_t i = 0; i < s->ex->n_queues; i++) {
    struct sim_queue *w = &s->queues[i];
    if (!w->blocked) continue;
    const struct sim_op *head = &w->ring[w->head];
    if (head->op.u.event.ev != ev || head->op.u.event.gen > done) continue;
    w->blocked = 0;
    /* the queue's thread slept in its wait: it runs on once the event's thread woke it */
    if (s->event_wake_ns > 0 &&
        ferry__des_schedule(s->des, now + s->event_wake_ns, wake_from_wait, w, NULL) == FERRY_OK) {
      w->waking = 1;
      continue;
    }
    end_wait(w, now);
  }
}

static void job_done(struct ferry__res_job *job, void *ctx);
static void start_failed(struct sim_queue *q, ferry_status st);

/* ---- link copies and kernels sharing one memory system (link.contention, sim/contend.c) ---- */

/* No kernel starts before this: the clock, or a kernel running since earlier. */
static int64_t contention_horizon(const struct sim_exec *s) {
  int64_t k = ferry__des_now(s->des);
  for (int32_t i = 0; i < s->ex->n_queues; i++) {
    const struct sim_queue *q = &s->queues[i];
    if (q->busy && q->count && q->ring[q->head].op.kind == FERRY_OP_KERNEL && q->job.start_ns < k) k = q->job.start_ns;
  }
  return k;
}

/* A link transfer's bytes start to flow: noted for the kernels it slows, ending when it would alone
 * on its channel (as the fast path times it; one that shares its channel is corrected when done). */
static void transfer_flowing(struct ferry__res_job *job, void *ctx) {
  struct sim_queue *q = ctx;
  struct sim_exec *s = q->s;
  const struct sim_op *so = &q->ring[q->head];
  int64_t flow_ns;
  ferry__fluid_alone_ns(s->chan[so->cost.chan], job->bytes, &flow_ns);
  const int64_t now = ferry__des_now(s->des);
  ferry_status st = ferry__sim_flow_note(s, now, now + flow_ns, so->seq, contention_horizon(s));
  if (st != FERRY_OK) ferry__exec_op_failed(s->ex, st, s->ex->err.msg);
}

/* A kernel's end, slowed by the link transfers issued before it that flow while it runs. */
static int64_t kernel_stretch(struct ferry__res_job *job, void *ctx) {
  const struct sim_queue *q = ctx;
  return ferry__sim_contended_end(q->s, job->start_ns, job->duration_ns, q->ring[q->head].seq);
}

/* Start one attempt of the head copy or read on its channel, with its injected faults
 * (ferry/fault.h) drawn now, in virtual time: a delay holds the channel's slot longer (a
 * latency spike); a failed copy is a lost device; a failed read is charged its full time and
 * retried by job_done() as the I/O layer would, after the same backoff. */
static ferry_status start_transfer(struct sim_queue *q, struct sim_op *so, uint64_t bytes) {
  /* a read the page cache model serves never reaches the disk: no disk fault for it */
  const struct ferry_fault none = {FERRY_FAULT_NONE, 0, 0};
  struct ferry_fault f = so->op.kind != FERRY_OP_READ ? ferry__exec_fault(&so->op)
                         : so->cost.chan == CHAN_DISK  ? ferry_fault_draw(FERRY_FAULT_READ)
                                                      : none;
  so->attempt++;
  if (so->op.kind == FERRY_OP_READ) ferry__io_count(FERRY__IO_ATTEMPTS, 1);
  if (f.kind == FERRY_FAULT_FAIL) {
    int64_t now = ferry__des_now(q->s->des);
    ferry__exec_fault_fail(q->s->ex, q->index, &so->op, f.attempt);
    ferry__sim_op_complete(q, now, now);
    return FERRY_OK;
  }
  so->fault = f.kind == FERRY_FAULT_CORRUPT ? FERRY_FAULT_NONE : f.kind; /* no bytes here to corrupt */
  memset(&q->job, 0, sizeof q->job);
  q->job.bytes = so->fault == FERRY_FAULT_SHORT ? bytes / 2 : bytes;
  q->job.extra_latency_ns = f.delay_ns;
  q->job.done = job_done;
  q->job.ctx = q;
  if (q->s->hw.link.contention > 0 && ferry__sim_link_chan(so->cost.chan)) q->job.flowing = transfer_flowing;
  q->busy = 1;
  ferry_status st = ferry__fluid_submit(q->s->chan[so->cost.chan], &q->job);
  if (st != FERRY_OK) q->busy = 0;
  return st;
}

static void retry_read(struct ferry__des *des, void *ctx) {
  (void)des;
  struct sim_queue *q = ctx;
  struct sim_op *so = &q->ring[q->head];
  ferry_status st = start_transfer(q, so, so->cost.flow_bytes);
  if (st != FERRY_OK) start_failed(q, st);
  pump(q->s);
}

/* The attempt of a read that just ended had an injected fault: a short read continues with
 * the other half (another request); an error is retried after the backoff, or after the
 * policy's attempts fails the op naming the file and offset. Returns 1 when the op goes on. */
static int read_fault(struct sim_queue *q, struct sim_op *so) {
  struct sim_exec *s = q->s;
  const struct ferry_op *op = &so->op;
  const char *path = op->u.read.store ? ferry_store_file_path(op->u.read.store, op->u.read.file) : NULL;
  if (!path) path = "(simulated file)";
  if (so->first_start_ns < 0) so->first_start_ns = q->job.start_ns;
  if (so->fault == FERRY_FAULT_SHORT) {
    ferry__io_count(FERRY__IO_SHORT, 1);
    ferry_status st = start_transfer(q, so, so->cost.flow_bytes - so->cost.flow_bytes / 2);
    if (st != FERRY_OK) start_failed(q, st);
    return 1;
  }
  struct ferry_io_policy p;
  ferry_io_get_policy(&p);
  so->failures++;
  const int err = so->fault == FERRY_FAULT_EIO ? EIO : so->fault == FERRY_FAULT_EAGAIN ? EAGAIN : EINTR;
  const int permanent = so->attempt >= p.max_attempts;
  struct ferry_io_event ev = {.path = path, .offset = op->u.read.offset, .len = op->u.read.len, .attempt = so->attempt,
                              .error = err, .permanent = permanent,
                              .what = err == EIO ? "EIO" : err == EAGAIN ? "EAGAIN" : "EINTR"};
  ferry__io_notify(&ev);
  so->fault = FERRY_FAULT_NONE;
  if (permanent) {
    char msg[FERRY_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s: read of %llu bytes at offset %llu failed after %d attempt(s): %s", path,
             (unsigned long long)op->u.read.len, (unsigned long long)op->u.read.offset, so->attempt, strerror(err));
    ferry__io_count(FERRY__IO_FAILED, 1);
    ferry__exec_op_failed(s->ex, FERRY_ERR_IO, msg);
    so->read_failed = 1;
    return 0; /* the op completes (failed); the next sync reports it */
  }
  ferry__io_count(FERRY__IO_RETRIES, 1);
  const uint64_t salt = op->u.read.offset * 0x9e3779b97f4a7c15ULL ^ op->u.read.file;
  ferry_status st = ferry__des_schedule_in(s->des, ferry_io_backoff_ns(so->attempt, salt), retry_read, q, NULL);
  if (st != FERRY_OK) {
    start_failed(q, st);
    return 1;
  }
  return 1;
}

static void job_done(struct ferry__res_job *job, void *ctx) {
  struct sim_queue *q = ctx;
  struct sim_op *so = &q->ring[q->head];
  if (so->op.kind == FERRY_OP_READ && so->fault != FERRY_FAULT_NONE && read_fault(q, so)) return;
  if (job->flowing) ferry__sim_flow_ended(q->s, so->seq, job->end_ns);
  q->busy = 0;
  if (so->op.kind == FERRY_OP_READ && so->failures && !so->read_failed) ferry__io_count(FERRY__IO_RECOVERED, 1);
  switch (so->op.kind) { /* done: counted as the fast path counts them */
    case FERRY_OP_KERNEL: q->s->kernels++; break;
    case FERRY_OP_READ: q->s->reads += !so->read_failed; break;
    case FERRY_OP_COPY:
      q->s->copies++;
      if (so->cost.chan == CHAN_H2D) q->s->bytes_h2d += so->op.u.copy.bytes; /* the bytes copied, not the scaled flow */
      break;
    default: break;
  }
  ferry__sim_op_complete(q, so->op.kind == FERRY_OP_READ && so->first_start_ns >= 0 ? so->first_start_ns : job->start_ns,
                         job->end_ns);
  kick(q->s, q->index);
  pump(q->s);
}

/* A resource refused a job (its pool could not grow): the op fails and completes now, so the
 * queue does not hang; the failure is reported by the next sync or drain. */
static void start_failed(struct sim_queue *q, ferry_status st) {
  char msg[FERRY_ERRMSG_MAX];
  snprintf(msg, sizeof msg, "sim executor: queue %d (%s): cannot start an op: %s", q->index,
           role_name(q->s->ex->queues[q->index].role), ferry_last_error());
  ferry__exec_op_failed(q->s->ex, st, msg);
  int64_t now = ferry__des_now(q->s->des);
  ferry__sim_op_complete(q, now, now);
}

/* Start head ops until the queue is empty, busy on a resource, or blocked on an event. */
static void advance(struct sim_queue *q) {
  struct sim_exec *s = q->s;
  while (q->count && !q->busy && !q->blocked && !q->waking) {
    struct sim_op *so = &q->ring[q->head];
    int64_t now = ferry__des_now(s->des);
    ferry_status st;
    switch (so->op.kind) {
      case FERRY_OP_RECORD: {
        ferry_event *ev = so->op.u.event.ev;
        uint64_t gen = so->op.u.event.gen;
        ferry__sim_op_complete(q, now, now);
        ferry__sim_event_complete(s, ev, gen, now);
        break;
      }
      case FERRY_OP_WAIT:
        if (atomic_load(&so->op.u.event.ev->done_gen) >= so->op.u.event.gen) {
          ferry__sim_op_complete(q, now, now);
        } else {
          q->blocked = 1;
          q->blocked_since = now;
        }
        break;
      case FERRY_OP_KERNEL: {
        const struct ferry_fault f = ferry__exec_fault(&so->op);
        if (f.kind == FERRY_FAULT_FAIL) {
          ferry__exec_fault_fail(s->ex, q->index, &so->op, f.attempt);
          ferry__sim_op_complete(q, now, now);
          break;
        }
        memset(&q->job, 0, sizeof q->job);
        q->job.duration_ns = so->cost.duration_ns + f.delay_ns;
        q->job.done = job_done;
        q->job.ctx = q;
        if (s->hw.link.contention > 0 && s->ex->queues[q->index].role != FERRY_QUEUE_CPU) q->job.stretch = kernel_stretch;
        q->busy = 1;
        if ((st = ferry__compute_submit(q->unit, &q->job)) != FERRY_OK) {
          q->busy = 0;
          start_failed(q, st);
        }
        break;
      }
      case FERRY_OP_COPY:
      case FERRY_OP_READ:
        so->attempt = so->failures = so->read_failed = 0;
        so->first_start_ns = -1;
        if (so->op.kind == FERRY_OP_READ) ferry__io_count(FERRY__IO_READS, 1);
        if ((st = start_transfer(q, so, so->cost.flow_bytes)) != FERRY_OK) start_failed(q, st);
        break;
    }
  }
}

static void pump(struct sim_exec *s) {
  if (s->pumping) return; /* the outer pump picks up what was kicked */
  s->pumping = 1;
  while (s->runnable) {
    int32_t i = __builtin_ctz(s->runnable);
    s->runnable &= ~(1u << i);
    advance(&s->queues[i]);
  }
  s->pumping = 0;
}

/* ---- the backend ------------------------------------------------------------------------------ */

static int64_t sim_now(struct ferry_exec *ex) {
  struct sim_exec *s = state(ex);
  return s->mode != FERRY_SIM_EXACT ? s->now_ns : ferry__des_now(s->des);
}

static void sim_sleep_until(struct ferry_exec *ex, int64_t t_ns) {
  struct sim_exec *s = state(ex);
  if (s->mode != FERRY_SIM_EXACT) ferry__sim_fast_sleep_until(s, t_ns);
  else ferry__des_run_until(s->des, t_ns);
}

static ferry_status sim_queue_init(struct ferry_exec *ex, int32_t index) {
  struct sim_exec *s = state(ex);
  struct sim_queue *q = &s->queues[index];
  char name[32];
  snprintf(name, sizeof name, "queue %d", index);
  q->ring = ferry__calloc(RING_INITIAL, sizeof *q->ring);
  if (!q->ring) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for a queue");
  ferry_status st = ferry__compute_create(&q->unit, s->des, name);
  if (st != FERRY_OK) {
    ferry_free(q->ring);
    q->ring = NULL;
    return ferry__err_set(&ex->err, st, "sim executor: out of memory for a queue");
  }
  q->s = s;
  q->index = index;
  q->cap = RING_INITIAL;
  q->last_done_ns = q->tail_ns = INT64_MIN;
  /* Two host-to-device queues of one device (a hybrid run's activation uploads beside the
   * weights' stream) can share the link at once, which only the discrete-event path times; the
   * fast path would refuse the first overlap mid-run. Decided before any op, the figures then
   * come from the exact path, as with injected faults. (A multi-device run's second
   * device-to-host queue carries peer copies, on a channel of their own.) */
  const struct ferry_exec_queue *nq = &ex->queues[index];
  if (s->mode != FERRY_SIM_EXACT && !s->submitted && nq->role == FERRY_QUEUE_H2D)
    for (int32_t i = 0; i < index; i++)
      if (ex->queues[i].role == FERRY_QUEUE_H2D && ex->queues[i].device == nq->device) s->mode = FERRY_SIM_EXACT;
  /* a runtime that reads from disk only after its copies (read_after_copies()): the host's
   * wait before each read is the discrete-event path's (the fast path replays recorded op
   * sequences without the host's submits) */
  if (s->mode != FERRY_SIM_EXACT && !s->submitted && nq->role == FERRY_QUEUE_DISK && s->rt.read_after_copy)
    s->mode = FERRY_SIM_EXACT;
  return FERRY_OK;
}

static ferry_status sim_buf_alloc(struct ferry_exec *ex, ferry_buf *buf) {
  (void)ex;
  buf->ptr = NULL; /* accounting only: the wrapper has already checked the budget */
  return FERRY_OK;
}

static void sim_buf_free(struct ferry_exec *ex, ferry_buf *buf) {
  (void)ex;
  (void)buf;
}

/* The packed weight a DEQUANTIZE op expanded into ref, if one of the last few did. */
const struct ferry__packed *ferry__sim_packed_at(const struct sim_exec *s, struct ferry_ref ref) {
  for (int i = 0; i < PACKED_SLOTS; i++)
    if (s->packed_buf[i] && s->packed_buf[i] == ref.buf && s->packed_off[i] == ref.offset) return &s->packed[i];
  return NULL;
}

/* Remember what a DEQUANTIZE op expands, for the product that reads its output. */
static void note_packed(struct sim_exec *s, const struct ferry_kernel *k) {
  int slot = -1;
  for (int i = 0; i < PACKED_SLOTS && slot < 0; i++)
    if (s->packed_buf[i] == k->y.buf && s->packed_off[i] == k->y.offset) slot = i;
  if (slot < 0) slot = (int)(s->packed_next++ % PACKED_SLOTS);
  s->packed_buf[slot] = k->y.buf;
  s->packed_off[slot] = k->y.offset;
  s->packed[slot] = (struct ferry__packed){(uint64_t)k->m, (double)k->n * (double)k->k, k->qformat};
}

static ferry_status missing(struct sim_exec *s, const char *what, const char *figure) {
  return ferry__err_set(&s->ex->err, FERRY_ERR_NOT_FOUND,
                        "sim executor: hardware profile %s has no %s, needed to simulate %s", s->hw.name, figure, what);
}

static struct cached_range *cache_find(struct page_cache *c, const struct ferry_op *op) {
  for (size_t i = 0; i < c->n; i++) {
    struct cached_range *r = &c->v[i];
    if (r->stamp && r->store == op->u.read.store && r->file == op->u.read.file && r->offset == op->u.read.offset &&
        r->len == op->u.read.len)
      return r;
  }
  return NULL;
}

static void cache_drop(struct page_cache *c, struct cached_range *r) {
  c->used_bytes -= r->len;
  r->stamp = 0;
}

/* Cache a range just read, evicting the least recently used ones to make room; one larger
 * than the whole cache is not kept. */
static ferry_status cache_insert(struct sim_exec *s, const struct ferry_op *op) {
  struct page_cache *c = &s->cache;
  const uint64_t len = op->u.read.len;
  if (len > c->capacity_bytes) return FERRY_OK;
  while (c->used_bytes + len > c->capacity_bytes) {
    struct cached_range *lru = NULL;
    for (size_t i = 0; i < c->n; i++)
      if (c->v[i].stamp && (!lru || c->v[i].stamp < lru->stamp)) lru = &c->v[i];
    if (!lru) break;
    cache_drop(c, lru);
  }
  struct cached_range *slot = NULL;
  for (size_t i = 0; i < c->n && !slot; i++)
    if (!c->v[i].stamp) slot = &c->v[i];
  if (!slot) {
    if (c->n == c->cap) {
      size_t cap = c->cap ? 2 * c->cap : 64;
      struct cached_range *v = ferry__reallocarray(c->v, cap, sizeof *v);
      if (!v) return ferry__err_set(&s->ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for the page cache");
      c->v = v;
      c->cap = cap;
    }
    slot = &c->v[c->n++];
  }
  *slot = (struct cached_range){op->u.read.store, op->u.read.file, op->u.read.offset, len, ++c->clock};
  c->used_bytes += len;
  return FERRY_OK;
}

/* Where a disk read's bytes come from: the page cache (a copy within host memory) or the disk. */
ferry_status ferry__sim_route_read(struct sim_exec *s, struct sim_cost *c_out, const struct ferry_op *op) {
  const unsigned flags = op->u.read.flags;
  struct page_cache *c = &s->cache;
  struct cached_range *hit = (flags & FERRY_READ_DIRECT) ? NULL : cache_find(c, op);
  if (hit && s->chan[CHAN_DRAM]) {
    c->hits++;
    c->hit_bytes += op->u.read.len;
    c_out->chan = CHAN_DRAM;
    c_out->flow_bytes = 2 * op->u.read.len;
    if (flags & FERRY_READ_DROP_CACHE)
      cache_drop(c, hit);
    else
      hit->stamp = ++c->clock;
    return FERRY_OK;
  }
  if (!s->chan[CHAN_DISK]) return missing(s, "a disk read", "disk section (disk.read_gbps)");
  c_out->chan = CHAN_DISK;
  c_out->flow_bytes = op->u.read.len;
  if (!(flags & FERRY_READ_DIRECT)) c->misses++;
  if (flags & (FERRY_READ_DIRECT | FERRY_READ_DROP_CACHE)) return FERRY_OK;
  return cache_insert(s, op);
}

/* Whether kernel k reads quantized weights packed: the runtime's fused kernels do, except for a
 * product over more rows than its fused kernels take (runtime.fused_max_rows), which it runs on
 * a copy expanded to fp16; a dequantize op is told its product's rows, a table lookup (0) stays
 * packed. */
static int fused_for(const struct sim_exec *s, const struct ferry_kernel *k) {
  if (!s->rt.fused_dequant) return 0;
  const int64_t rows = k->kind == FERRY_K_DEQUANTIZE ? k->dq_rows : k->kind == FERRY_K_EMBED ? 0 : k->m;
  return !(s->rt.fused_max_rows > 0 && rows > s->rt.fused_max_rows);
}

/* A kernel's duration: its fitted cost when the profile is calibrated, else the GPU cost model
 * with the packed weights behind its references (packed[], ferry__sim_packed_at()); -1 when the
 * profile cannot time it. *folded: no kernel of its own (its work is its consumer's). */
int64_t ferry__sim_kernel_ns(struct sim_exec *s, const struct ferry_kernel *k, const struct ferry__packed *const packed[3],
                             int *folded, struct ferry__gpu_work *work) {
  double flops;
  uint64_t bytes;
  *folded = 0;
  ferry_kernel_cost(k, &flops, &bytes);
  const int gemm = bytes > 0 && flops / (double)bytes > FERRY_HW_GEMM_INTENSITY;
  const struct ferry_hw_cost *fit = s->fitted[k->kind][gemm];
  if (fit) /* calibrated from measurements of the op as issued: preferred to the roofline */
    return ferry__ceil_ns(fit->overhead_ns + (fit->roofline ? fmax((double)bytes * fit->ns_per_byte, flops * fit->ns_per_flop)
                                                            : (double)bytes * fit->ns_per_byte + flops * fit->ns_per_flop));
  ferry__gpu_work_of(k, packed, fused_for(s, k), work);
  ferry__runtime_work(&s->hw, k, 0, work);
  *folded = work->folded;
  return ferry__gpu_work_ns(&s->hw, work);
}

/* The packed weights behind kernel k's references, as the last DEQUANTIZE ops left them (a
 * DEQUANTIZE itself is noted for its consumer). */
void ferry__sim_packed_of(struct sim_exec *s, const struct ferry_kernel *k, const struct ferry__packed *packed[3]) {
  packed[0] = packed[1] = packed[2] = NULL;
  if (k->kind == FERRY_K_DEQUANTIZE) {
    note_packed(s, k);
  } else if (k->kind == FERRY_K_MATMUL || k->kind == FERRY_K_EXPERT || k->kind == FERRY_K_MLA_ATTENTION ||
             k->kind == FERRY_K_EMBED) {
    packed[0] = ferry__sim_packed_at(s, k->w);
    if (k->kind == FERRY_K_EXPERT) packed[1] = ferry__sim_packed_at(s, k->aux[0]), packed[2] = ferry__sim_packed_at(s, k->aux[1]);
  }
}

/* The step under way prefills and the runtime runs such a step eagerly, one PyTorch op at a time,
 * where it replays CUDA graphs for decode-only steps (runtime.prefill_launch_ns). */
static int eager_prefill(const struct sim_exec *s) { return s->prefill_step && s->rt.prefill_launch_ns > 0; }

/* A kernel on a CPU queue: the profile's CPU (cores, per-core peaks, DDR bandwidth). Fitted
 * costs describe the device's kernels, so they do not apply here. */
static ferry_status prepare_cpu_kernel(struct sim_exec *s, struct sim_cost *c, const struct ferry_kernel *k) {
  const struct ferry__packed *packed[3] = {NULL, NULL, NULL};
  if (k->kind == FERRY_K_DEQUANTIZE) {
    note_packed(s, k);
  } else if (k->kind == FERRY_K_MATMUL || k->kind == FERRY_K_EXPERT || k->kind == FERRY_K_EMBED) {
    packed[0] = ferry__sim_packed_at(s, k->w);
    if (k->kind == FERRY_K_EXPERT) packed[1] = ferry__sim_packed_at(s, k->aux[0]), packed[2] = ferry__sim_packed_at(s, k->aux[1]);
  }
  struct ferry__gpu_work w;
  ferry__cpu_work_of(k, packed, &w);
  ferry__runtime_work(&s->hw, k, 1, &w);
  c->folded = w.folded;
  const int64_t ns = ferry__cpu_work_ns(&s->hw, &w);
  if (ns < 0)
    return ferry__err_set(&s->ex->err, FERRY_ERR_NOT_FOUND,
                          "sim executor: hardware profile %s cannot time kernel %s on the CPU: it lacks the host's "
                          "CPU figures (host.cores with host.core_gflops, or host.cpu_gflops) or host.dram_gbps",
                          s->hw.name, k->name);
  c->duration_ns = ns;
  /* a prefilling step that a CUDA-graph runtime runs eagerly calls its CPU ops from the model's
   * Python code, which returns with their result (ktransformers' KExpertsCPU.forward: submit,
   * then sync), where a graph's replay runs them from a host callback: the host waits for them */
  c->host_waits = eager_prefill(s);
  return FERRY_OK;
}

/* Work out an op's channel and duration at enqueue time (cpu: on a CPU queue). */
ferry_status ferry__sim_prepare(struct sim_exec *s, struct sim_cost *c, const struct ferry_op *op, int cpu) {
  c->duration_ns = 0;
  c->folded = 0;
  c->extra_ops = 0;
  c->chan = CHAN_NONE;
  c->flow_bytes = 0;
  c->host_waits = 0;
  switch (op->kind) {
    case FERRY_OP_KERNEL: {
      const struct ferry_kernel *k = &op->u.kernel;
      if (cpu) return prepare_cpu_kernel(s, c, k);
      if (k->kind == FERRY_K_ALLREDUCE) { /* a collective: the interconnect's time, not the GPU's */
        /* the runtime's activations, which are what a tensor-parallel engine all-reduces */
        uint32_t act_bytes = 4;
        ferry_hw_profile_elem_bytes(&s->hw, &act_bytes, NULL);
        c->duration_ns = ferry__ic_allreduce_ns(&s->hw, k->m, (uint64_t)k->n * act_bytes);
        s->allreduces++;
        s->allreduce_ns += c->duration_ns;
        return FERRY_OK;
      }
      const struct ferry__packed *packed[3];
      ferry__sim_packed_of(s, k, packed);
      struct ferry__gpu_work w = {0};
      int64_t ns = ferry__sim_kernel_ns(s, k, packed, &c->folded, &w);
      if (ns < 0)
        return ferry__err_set(&s->ex->err, FERRY_ERR_NOT_FOUND,
                              "sim executor: hardware profile %s cannot time kernel %s (%s, %s): it lacks the GPU's "
                              "memory bandwidth or a usable peak",
                              s->hw.name, k->name, ferry_hw_op_name(w.op), ferry_dtype_name(w.math));
      c->duration_ns = ns;
      c->extra_ops = w.ops;
      return FERRY_OK;
    }
    case FERRY_OP_COPY:
      c->flow_bytes = op->u.copy.bytes;
      switch (op->u.copy.copy_kind) {
        case FERRY_COPY_HTOD: {
          c->chan = CHAN_H2D;
          /* a source of the other kind than the run's (a pageable KV cache beside pinned
           * weights) holds the link for its bytes at its own kind's rate */
          const int pinned = op->u.copy.src.buf ? op->u.copy.src.buf->pinned : s->pinned;
          if (pinned != s->pinned)
            c->flow_bytes = (uint64_t)((double)op->u.copy.bytes * (s->h2d_gbps[s->pinned] / s->h2d_gbps[pinned]) + 0.5);
          c->host_waits = !pinned || s->rt.blocking_copy;
          break;
        }
        case FERRY_COPY_DTOH: c->chan = CHAN_D2H; break;
        case FERRY_COPY_PTOP: c->chan = op->u.copy.peers ? CHAN_GATHER : CHAN_PEER; break;
        case FERRY_COPY_DTOD:
          c->chan = CHAN_DMEM;
          c->flow_bytes = 2 * op->u.copy.bytes;
          break;
        /* a disk-tier buffer's file, read or written whole from the disk: the page cache model
         * serves the stores' buffered reads of weights, which a run reads again; a disk-homed KV
         * cache is larger than the memory left for it (it would be in host memory otherwise)
         * and each range is read once a step after every other one, so its reads miss */
        case FERRY_COPY_DISK_TO_HOST:
          if (!s->chan[CHAN_DISK]) return missing(s, "a read of a disk-tier buffer", "disk section (disk.read_gbps)");
          c->chan = CHAN_DISK;
          break;
        case FERRY_COPY_HOST_TO_DISK:
          if (!s->chan[CHAN_DISK_WRITE]) return missing(s, "a write to a disk-tier buffer", "disk.write_gbps");
          c->chan = CHAN_DISK_WRITE;
          break;
        default:
          if (!s->chan[CHAN_DRAM]) return missing(s, "a copy within host memory", "host.dram_gbps");
          c->chan = CHAN_DRAM;
          c->flow_bytes = 2 * op->u.copy.bytes;
          break;
      }
      return FERRY_OK;
    case FERRY_OP_READ:
      return ferry__sim_route_read(s, c, op);
    case FERRY_OP_RECORD:
    case FERRY_OP_WAIT:
      return FERRY_OK;
  }
  return FERRY_OK;
}

static ferry_status ring_grow(struct ferry_exec *ex, struct sim_queue *q) {
  uint32_t cap = q->cap * 2;
  if (cap < q->cap) return ferry__err_set(&ex->err, FERRY_ERR_RANGE, "sim executor: queue %d is full", q->index);
  struct sim_op *r = ferry__reallocarray(NULL, cap, sizeof *r);
  if (!r)
    return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for %u ops on queue %d", cap,
                          q->index);
  /* unwrap into the new ring so the head is at 0 */
  for (uint32_t i = 0; i < q->count; i++) r[i] = q->ring[(q->head + i) & (q->cap - 1)];
  ferry_free(q->ring);
  q->ring = r;
  q->cap = cap;
  q->head = 0;
  return FERRY_OK;
}

/* The ring entry after q's last op (growing the ring when full); the caller fills it in and
 * then counts it. */
ferry_status ferry__sim_ring_slot(struct sim_exec *s, struct sim_queue *q, struct sim_op **out) {
  ferry_status st;
  if (q->count == q->cap && (st = ring_grow(s->ex, q)) != FERRY_OK) return st;
  *out = &q->ring[(q->head + q->count) & (q->cap - 1)];
  return FERRY_OK;
}

/* Bytes of an op worth keeping: a kernel is 400-odd bytes of which the resource model needs
 * nothing once its duration is known, so it is kept whole only for the activity sink. */
size_t ferry__sim_op_bytes(const struct ferry_op *op, int sink) {
  const size_t head = offsetof(struct ferry_op, u);
  switch (op->kind) {
    case FERRY_OP_KERNEL: return sink ? sizeof *op : head;
    case FERRY_OP_COPY: return head + sizeof op->u.copy;
    case FERRY_OP_READ: return head + sizeof op->u.read;
    default: return head + sizeof op->u.event;
  }
}

static void wake_queue(struct ferry__des *des, void *ctx) {
  (void)des;
  struct sim_queue *q = ctx;
  q->waking = 0;
  kick(q->s, q->index);
  pump(q->s);
}

/* The host thread works for ns: what is already queued runs on meanwhile. */
static void host_busy(struct sim_exec *s, int64_t ns) {
  if (ns <= 0) return;
  if (s->mode != FERRY_SIM_EXACT) ferry__sim_fast_host_busy(s, ns);
  else ferry__des_run_until(s->des, ferry__des_now(s->des) + ns);
}

int64_t ferry__sim_launch_ns(const struct sim_exec *s) {
  /* a runtime that replays CUDA graphs for decode steps only issues a prefilling step's kernels
   * one by one */
  return eager_prefill(s) ? s->rt.prefill_launch_ns : s->rt.launch_ns;
}

/* The same for the runtime's host work per layer beyond its launches. */
static int64_t layer_host_ns(const struct sim_exec *s) {
  return s->prefill_step && s->rt.prefill_layer_ns > 0 ? s->rt.prefill_layer_ns : s->rt.layer_ns;
}

/* The rows a step samples: the gather of the logits rows, of no layer. */
static int sampled_rows(const struct ferry_op *op) {
  return op->u.kernel.kind == FERRY_K_GATHER_ROWS && op->u.kernel.layer < 0;
}

/* A routed expert whose rows the runtime gathers one copy at a time. */
static int row_copied_expert(const struct sim_exec *s, const struct ferry_op *op) {
  return op->u.kernel.kind == FERRY_K_EXPERT && s->rt.moe_row_copy && op->u.kernel.m > 1;
}

int64_t ferry__sim_issue_launches(const struct sim_exec *s, const struct sim_cost *c, const struct ferry_op *op) {
  if (op->kind != FERRY_OP_KERNEL || c->folded) return 0;
  return sampled_rows(op) || row_copied_expert(s, op) ? 1 : 1 + c->extra_ops; /* a framework's op issues several */
}

int64_t ferry__sim_issue_ns(const struct sim_exec *s, const struct sim_cost *c, const struct ferry_op *op) {
  const int64_t launches = ferry__sim_issue_launches(s, c, op) * ferry__sim_launch_ns(s);
  switch (op->kind) {
    case FERRY_OP_KERNEL:
      if (c->folded) return 0;
      /* the rows a step samples: the sampler and output processing work per row */
      if (sampled_rows(op)) return launches + op->u.kernel.m * s->rt.row_ns;
      /* a runtime that gathers a routed expert's rows one copy at a time: for each of the
       * expert's three products (gate, up, down) one copy per row in and one per row out */
      if (row_copied_expert(s, op)) return launches + 6 * op->u.kernel.m * s->rt.copy_ns;
      return launches;
    case FERRY_OP_COPY:
    case FERRY_OP_READ: return s->rt.copy_ns;
    default: return 0;
  }
}

int ferry__sim_syncs_paid(struct sim_exec *s, int32_t host_syncs) {
  if (host_syncs <= 0 || !s->rt.model_syncs) return 0;
  s->layer_host.syncs_seen = 1;
  return host_syncs;
}

int ferry__sim_kernel_syncs(struct sim_exec *s, const struct ferry_kernel *k) {
  if (k->layer < 0) s->layer_host.in_layer = 0;
  return ferry__sim_syncs_paid(s, k->host_syncs);
}

int64_t ferry__sim_sync_copy_ns(const struct sim_exec *s) {
  return s->rt.copy_ns + (s->hw.link.latency_ns > 0 ? s->hw.link.latency_ns : 0) + s->sync_ns;
}

int64_t ferry__sim_layer_share(struct sim_exec *s, int64_t issue_ns) {
  struct sim_layer_host *lh = &s->layer_host;
  if (!lh->in_layer || !s->rt.model_syncs) return 0; /* nothing spread: nothing to count */
  lh->issue_ns += issue_ns;
  if (!lh->spread) return 0;
  return (int64_t)((double)layer_host_ns(s) * (double)issue_ns / (double)lh->ref_ns + 0.5);
}

static ferry_status deadlock(struct ferry_exec *ex, const char *waiting_for);

static int queue_idle(void *arg) { return ((const struct sim_queue *)arg)->count == 0; }

struct sync_arg {
  ferry_event *ev;
  uint64_t gen;
};

static int gen_done(void *arg) {
  const struct sync_arg *a = arg;
  return atomic_load(&a->ev->done_gen) >= a->gen;
}

struct copy_wait {
  const struct sim_queue *q;
  uint64_t target; /* the queue's completed count once the copy is done */
};

static int copy_done(void *arg) {
  const struct copy_wait *w = arg;
  return w->q->completed >= w->target;
}

/* The host never looks at a half-processed instant: each of its actions ends by running the
 * events due by then (zero-length ops it just enqueued included), so what it sees done is
 * exactly what ended at or before its clock, as in the fast path (exec_sim_fast.c). */
/* A runtime that reads from disk only after its copies to the device: the host waits, before
 * issuing the read, for every copy to the device issued so far. Such an executor runs exact
 * from its first disk queue on (sim_queue_init()). */
static ferry_status read_after_copies(struct ferry_exec *ex, struct sim_exec *s) {
  for (int32_t i = 0; i < ex->n_queues; i++) {
    if (ex->queues[i].role != FERRY_QUEUE_H2D || s->queues[i].completed >= s->queues[i].copies_through) continue;
    struct copy_wait w = {&s->queues[i], s->queues[i].copies_through};
    if (!ferry__des_run_while_not(s->des, copy_done, &w))
      return deadlock(ex, "the host waits for its copies to the device before a disk read");
  }
  return FERRY_OK;
}

static ferry_status sim_submit(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op) {
  struct sim_exec *s = state(ex);
  s->submitted = 1;
  if (s->rt.read_after_copy && op->kind == FERRY_OP_READ && s->mode == FERRY_SIM_EXACT) {
    ferry_status st = read_after_copies(ex, s);
    if (st != FERRY_OK) return st;
  }
  if (s->mode != FERRY_SIM_EXACT) return ferry__sim_fast_submit(s, queue, op);
  struct sim_queue *q = &s->queues[queue];
  ferry_status st;
  struct sim_cost c;
  if ((st = ferry__sim_prepare(s, &c, op, ex->queues[queue].role == FERRY_QUEUE_CPU)) != FERRY_OK) return st;
  /* the runtime issues it first (running the clock forward may complete ops of this queue,
   * never add any: its ring slot is taken after): its share of the layer's host time, the copies
   * the model's code makes just before it (each once the queue has drained), its launch */
  const int64_t issue = ferry__sim_issue_ns(s, &c, op);
  if (op->kind == FERRY_OP_KERNEL) {
    const int syncs = ferry__sim_kernel_syncs(s, &op->u.kernel);
    host_busy(s, ferry__sim_layer_share(s, issue));
    if (syncs) {
      if (!ferry__des_run_while_not(s->des, queue_idle, q))
        return deadlock(ex, "the host waits for a copy the model's code makes");
      host_busy(s, syncs * ferry__sim_sync_copy_ns(s));
    }
  }
  host_busy(s, issue);
  struct sim_op *so;
  if ((st = ferry__sim_ring_slot(s, q, &so)) != FERRY_OK) return st;
  so->cost = c;
  so->full = ex->sink != NULL;
  so->seq = ++s->issue_seq;
  memcpy(&so->op, op, ferry__sim_op_bytes(op, so->full));
  q->count++;
  s->pending_ops++;
  if (op->kind == FERRY_OP_COPY) q->copies_through = q->completed + q->count;
  const int64_t now = ferry__des_now(s->des);
  if (q->count == 1) {
    /* the queue was idle: the op starts now, or once its thread woke up; a queue whose last op
     * ended at this very instant has not gone to sleep yet */
    if (s->wake_ns > 0 && q->last_done_ns < now) {
      q->waking = 1;
      if ((st = ferry__des_schedule(s->des, now + s->wake_ns, wake_queue, q, NULL)) != FERRY_OK) return st;
    } else {
      kick(s, queue);
      pump(s);
    }
  }
  /* queueing takes host time too (the host executor's threads) */
  host_busy(s, s->submit_ns);
  /* a runtime that fetches weights synchronously issues compute only once they are there: the
   * host blocks on what the compute queue is told to wait for */
  if (s->rt.sync_fetch && op->kind == FERRY_OP_WAIT && ex->queues[queue].role == FERRY_QUEUE_COMPUTE) {
    struct sync_arg w = {op->u.event.ev, op->u.event.gen};
    if (!ferry__des_run_while_not(s->des, gen_done, &w)) return deadlock(ex, "the host waits for weights it fetched");
  }
  /* from pageable memory the driver stages the bytes through its own pinned buffer before the
   * call returns, and a runtime whose copies block returns once they are done: the host waits
   * for the copy */
  if (c.host_waits) {
    struct copy_wait w = {q, q->completed + q->count};
    if (!ferry__des_run_while_not(s->des, copy_done, &w)) return deadlock(ex, "the host waits for a copy from pageable memory");
  }
  ferry__des_run_until(s->des, ferry__des_now(s->des));
  return FERRY_OK;
}

/* Why the simulation cannot go on: what every queue is stuck on. */
static ferry_status deadlock(struct ferry_exec *ex, const char *waiting_for) {
  struct sim_exec *s = state(ex);
  char detail[FERRY_ERRMSG_MAX / 2];
  size_t len = 0;
  detail[0] = '\0';
  for (int32_t i = 0; i < ex->n_queues && len < sizeof detail; i++) {
    const struct sim_queue *q = &s->queues[i];
    int n;
    if (!q->count) {
      n = snprintf(detail + len, sizeof detail - len, "; queue %d (%s) empty", i, role_name(ex->queues[i].role));
    } else if (q->blocked) {
      const struct ferry_op *w = &q->ring[q->head].op;
      n = snprintf(detail + len, sizeof detail - len,
                   "; queue %d (%s) %u op(s), waiting since t=%lld ns for an event generation %llu (done: %llu)", i,
                   role_name(ex->queues[i].role), q->count, (long long)q->blocked_since,
                   (unsigned long long)w->u.event.gen, (unsigned long long)atomic_load(&w->u.event.ev->done_gen));
    } else {
      n = snprintf(detail + len, sizeof detail - len, "; queue %d (%s) %u op(s)", i, role_name(ex->queues[i].role),
                   q->count);
    }
    if (n < 0) break;
    len += (size_t)n;
  }
  return ferry__err_set(&ex->err, FERRY_ERR_INTERNAL,
                        "sim executor: deadlock at t=%lld ns: %s, but no op can run (a queue waits for an event "
                        "recorded behind it, or never recorded)%s",
                        (long long)ferry__des_now(s->des), waiting_for, detail);
}

static ferry_status sim_sync(struct ferry_exec *ex, ferry_event *ev, uint64_t gen) {
  struct sync_arg a = {ev, gen};
  struct sim_exec *s = state(ex);
  if (ex->capturing) return ferry__err_set(&ex->err, FERRY_ERR_INTERNAL, "sim executor: a host wait inside an op graph");
  if (s->mode != FERRY_SIM_EXACT) return ferry__sim_fast_sync(s, ev, gen);
  if (!ferry__des_run_while_not(s->des, gen_done, &a)) {
    char what[96];
    snprintf(what, sizeof what, "the host waits for an event generation %llu (done: %llu)", (unsigned long long)gen,
             (unsigned long long)atomic_load(&ev->done_gen));
    return deadlock(ex, what);
  }
  /* the host notices the event only after its wake-up latency (and never halfway through an
   * instant: the rest of it runs too) */
  ferry__des_run_until(s->des, ferry__des_now(s->des) + s->sync_ns);
  return FERRY_OK;
}

static int all_idle(void *arg) { return ((struct sim_exec *)arg)->pending_ops == 0; }

static ferry_status sim_drain(struct ferry_exec *ex) {
  struct sim_exec *s = state(ex);
  if (s->mode != FERRY_SIM_EXACT) return ferry__sim_fast_drain(s);
  if (!ferry__des_run_while_not(s->des, all_idle, s)) return deadlock(ex, "draining every queue");
  ferry__des_run_until(s->des, ferry__des_now(s->des));
  return FERRY_OK;
}

static void sim_destroy(struct ferry_exec *ex) {
  struct sim_exec *s = state(ex);
  if (s) {
    for (int32_t i = 0; i < FERRY_EXEC_MAX_QUEUES; i++) {
      ferry__compute_destroy(s->queues[i].unit);
      ferry_free(s->queues[i].ring);
    }
    for (int c = 0; c < CHAN_COUNT; c++) ferry__fluid_destroy(s->chan[c]);
    ferry__sim_fast_free(s);
    ferry_free(s->cache.v);
    ferry_free(s->flows);
    ferry__des_destroy(s->des);
    ferry_free(s);
  }
  ferry__exec_fini(ex);
  ferry_free(ex);
}

/* The simulated GPU as the profile gives it (the rest is unknown). */
static ferry_status sim_device_info(struct ferry_exec *ex, struct ferry_device_info *out) {
  const struct ferry_hw_profile *p = &state(ex)->hw;
  snprintf(out->name, sizeof out->name, "%s", p->gpu.name);
  out->is_discrete = 1;
  out->total_memory_bytes = p->gpu.memory_bytes;
  out->memory_bandwidth_bytes_per_s = (uint64_t)(p->gpu.mem_bw_gbps * 1e9);
  return FERRY_OK;
}

/* The runtime's host work at the start of an engine step or layer: a step on several GPUs also
 * drives the runtime's workers. A step that prefills says so in a range of its own, which holds
 * until the next step opens. */
static void sim_range_begin(struct ferry_exec *ex, const char *name) {
  struct sim_exec *s = state(ex);
  if (name[0] == 's' && !strcmp(name, "step")) { /* the first letter first: once per layer */
    s->prefill_step = 0;
    s->layer_host.in_layer = 0;
    host_busy(s, s->rt.step_ns + (ex->config.n_devices > 1 ? s->rt.worker_step_ns : 0));
  } else if (name[0] == 'l' && !strcmp(name, "layer")) {
    /* where the model's code waits for the device, the layer's host time goes with its kernels
     * as the framework spends it, op by op, in proportion to their issue time in the layer
     * before (the first layer of a step pays it at its start) */
    struct sim_layer_host *lh = &s->layer_host;
    lh->ref_ns = lh->in_layer ? lh->issue_ns : 0;
    lh->issue_ns = 0;
    lh->in_layer = 1;
    const int64_t layer_ns = layer_host_ns(s);
    lh->spread = s->rt.model_syncs && lh->syncs_seen && lh->ref_ns > 0 && layer_ns > 0;
    if (!lh->spread) host_busy(s, layer_ns);
  } else if (name[0] == 'p' && !strcmp(name, "prefill")) {
    s->prefill_step = 1;
  }
}

/* The simulated runtime holds the engine's workspace at its own precision (an fp16/bf16 runtime
 * at 2 bytes an activation, fused kernels with no dequantized copy): the engine charges the
 * device tier that, not the fp32 it addresses (ferry_exec_alloc_charged()). */
static void sim_elem_bytes(const struct ferry_exec *ex, struct ferry_exec_elem_bytes *out) {
  const struct sim_exec *s = ex->backend_state;
  ferry_hw_profile_elem_bytes(&s->hw, &out->activation, &out->dequant);
}

static const struct ferry_exec_backend sim_backend = {
    .version = FERRY_EXEC_BACKEND_VERSION,
    .name = "sim",
    .has_data = 0,
    .virtual_clock = 1,
    .destroy = sim_destroy,
    .queue_init = sim_queue_init,
    .buf_alloc = sim_buf_alloc,
    .buf_free = sim_buf_free,
    .submit = sim_submit,
    .sync = sim_sync,
    .drain = sim_drain,
    .now = sim_now,
    .sleep_until = sim_sleep_until,
    .device_info = sim_device_info,
    .range_begin = sim_range_begin,
    .graph_mode = ferry__sim_graph_mode,
    .graph_begin = ferry__sim_graph_begin,
    .graph_skipped_wait = ferry__sim_graph_skipped_wait,
    .graph_end = ferry__sim_graph_end,
    .graph_launch = ferry__sim_graph_launch,
    .graph_check = ferry__sim_graph_check,
    .graph_bytes = ferry__sim_graph_bytes,
    .graph_free = ferry__sim_graph_free,
    .elem_bytes = sim_elem_bytes,
};

/* The link's rate to the device from host memory of one kind, GB/s. */
static double h2d_gbps(const struct sim_exec *s, int pinned) {
  const struct ferry_hw_profile *p = &s->hw;
  double h2d = p->link.h2d_gbps;
  /* a host whose driver cannot overlap its staging copy with the DMA (CUDA under WSL2): each
   * pageable byte is copied by the CPU, then moved by the DMA */
  if (!pinned && p->has_host && p->host.staged_h2d_gbps > 0)
    h2d = 1.0 / (1.0 / h2d + 1.0 / p->host.staged_h2d_gbps);
  else if (!pinned && p->link.pageable_h2d_gbps > 0)
    h2d = p->link.pageable_h2d_gbps;
  /* a runtime that gathers each fetched parameter copies it once more within device memory
   * (read and written) on the copy's stream before the next copy starts, and once again if it
   * then splits the gathered buffer into the parameters: per byte, the link's time plus two
   * bytes of the device memory's per such copy */
  const int dev_copies = (s->rt.gather_copy != 0) + (s->rt.split_copy != 0);
  if (dev_copies) h2d = 1.0 / (1.0 / h2d + 2.0 * dev_copies / p->gpu.mem_bw_gbps);
  return h2d;
}

/* The channels of the profile: link directions and the device memory always (checked by the
 * caller), the disk and host DRAM when the profile gives them. The host-to-device channel runs
 * at the rate of the configuration's host memory (s->pinned); a copy from a buffer of the other
 * kind is scaled to its kind's rate (ferry__sim_prepare()). A copy from the device into pageable
 * memory keeps link.d2h_gbps: profiles give no pageable device-to-host rate. */
static ferry_status make_resources(struct sim_exec *s) {
  const struct ferry_hw_profile *p = &s->hw;
  s->h2d_gbps[0] = h2d_gbps(s, 0);
  s->h2d_gbps[1] = h2d_gbps(s, 1);
  const double h2d = s->h2d_gbps[s->pinned];
  uint32_t engines = p->link.copy_engines > 0 ? (uint32_t)p->link.copy_engines : 0;
  ferry_status st;
  if ((st = ferry__link_create(&s->chan[CHAN_H2D], s->des, "link h2d", h2d * 1e9, p->link.latency_ns, engines)) ||
      (st = ferry__link_create(&s->chan[CHAN_D2H], s->des, "link d2h", p->link.d2h_gbps * 1e9, p->link.latency_ns,
                               engines)) ||
      (st = ferry__fluid_create(&s->chan[CHAN_DMEM], s->des, "device memory", p->gpu.mem_bw_gbps * 1e9, 0, 0)))
    return st;
  double peer;
  int64_t peer_ns;
  int via_host;
  ferry__ic_rate(p, &peer, &peer_ns, &via_host);
  if ((st = ferry__link_create(&s->chan[CHAN_PEER], s->des, "peer", peer, peer_ns, 1))) return st;
  /* the peers' parts of a gathered weight: a runtime that splits the gathered buffer into its
   * parameters (runtime.split_copy) copies every byte of it once more within device memory, the
   * peers' bytes as the rank's own (whose copy the link's rate above counts) */
  const double gather = s->rt.split_copy && p->gpu.mem_bw_gbps > 0 ? 1.0 / (1.0 / peer + 2.0 / (p->gpu.mem_bw_gbps * 1e9)) : peer;
  if ((st = ferry__link_create(&s->chan[CHAN_GATHER], s->des, "all-gather", gather, peer_ns, 1))) return st;
  if (via_host && s->ex->config.n_devices > 1)
    FERRY_WARN("hardware profile %s has no interconnect section: GPU-to-GPU traffic of this %d-device run is priced "
               "through the host link (%.1f GB/s down then up)", p->name, s->ex->config.n_devices, peer / 1e9);
  /* each read flows at most at what the runtime's reader reaches on this disk (its requests in
   * flight and their size), reads sharing the disk at most at an equal share of it */
  if (p->has_disk && p->disk.read_gbps > 0 &&
      (st = ferry__disk_create(&s->chan[CHAN_DISK], s->des, "disk", p->disk.read_gbps * 1e9, p->disk.latency_ns,
                               p->disk.queue_depth > 0 ? (uint32_t)p->disk.queue_depth : 1,
                               ferry_hw_disk_read_gbps(p) * 1e9)))
    return st;
  if (p->has_disk && p->disk.write_gbps > 0 &&
      (st = ferry__disk_create(&s->chan[CHAN_DISK_WRITE], s->des, "disk write", p->disk.write_gbps * 1e9,
                               p->disk.latency_ns, p->disk.queue_depth > 0 ? (uint32_t)p->disk.queue_depth : 1, 0)))
    return st;
  if (p->has_host && p->host.dram_gbps > 0 &&
      (st = ferry__fluid_create(&s->chan[CHAN_DRAM], s->des, "host memory", p->host.dram_gbps * 1e9, 0, 0)))
    return st;
  return FERRY_OK;
}

static ferry_status sim_open(ferry_exec **out, const struct ferry_exec_params *p) {
  if (!p || !p->hw)
    return ferry__fail(FERRY_ERR_INVALID, "the sim executor needs a hardware profile (ferry hw list)");
  return ferry_exec_create_sim(out, p->hw, &p->config);
}

/* The registry's entry (runtime/backends/registry.c lists it). */
const struct ferry_exec_info ferry__exec_info_sim = {
    .version = FERRY_EXEC_INFO_VERSION,
    .name = "sim",
    .description = "a discrete-event simulation of a hardware profile (virtual time)",
    .caps = FERRY_EXEC_CAP_VIRTUAL | FERRY_EXEC_CAP_HW,
    .open = sim_open,
};

ferry_status ferry_exec_create_sim(ferry_exec **out, const ferry_hw *hw, const struct ferry_exec_config *config) {
  if (!out || !hw) return ferry__fail(FERRY_ERR_INVALID, "exec_create_sim: %s is NULL", out ? "hw" : "out");
  *out = NULL;
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  ferry_status st = ferry_hw_require(p, "gpu.mem_bw_gbps,gpu.peak_tflops.fp32,link.h2d_gbps,link.d2h_gbps");
  if (st != FERRY_OK) return st;
  struct ferry_exec *ex = ferry__calloc(1, sizeof *ex);
  struct sim_exec *s = ferry__calloc(1, sizeof *s);
  if (!ex || !s) {
    ferry_free(ex);
    ferry_free(s);
    return ferry__fail(FERRY_ERR_NOMEM, "sim executor: out of memory");
  }
  ferry__exec_init(ex, &sim_backend, config);
  ex->backend_state = s;
  s->ex = ex;
  s->hw = *p;
  s->mode = config ? config->sim_mode : FERRY_SIM_EXACT;
  if (s->mode != FERRY_SIM_FAST && s->mode != FERRY_SIM_EXACT && s->mode != FERRY_SIM_CHECK) {
    ferry__exec_fini(ex);
    ferry_free(ex);
    ferry_free(s);
    return ferry__fail(FERRY_ERR_INVALID, "sim executor: unknown mode %d (exact 0, fast 1, check 2)",
                       config->sim_mode);
  }
  /* injected faults are drawn as ops start (retries, delays, lost devices), which only the
   * discrete-event path models: with faults installed the figures come from it */
  if (s->mode != FERRY_SIM_EXACT && ferry_fault_active()) s->mode = FERRY_SIM_EXACT;
  for (int c = 0; c < CHAN_COUNT; c++) s->chan_use[c] = (struct sim_chan_use){INT64_MIN, -1};
  if (p->has_host) {
    s->submit_ns = p->host.submit_ns;
    s->sync_ns = p->host.sync_ns;
    s->wake_ns = p->host.queue_wake_ns;
    s->event_wake_ns = p->host.event_wake_ns;
  }
  s->hw.sources = NULL;
  s->hw.n_sources = 0;
  s->hw.fitted = NULL;
  s->hw.n_fitted = 0;
  s->hw.path = NULL;
  if (p->has_runtime) {
    s->rt = p->runtime;
  } else { /* no software costs, fused low-bit kernels: the machine alone */
    memset(&s->rt, 0, sizeof s->rt);
    s->rt.fused_dequant = 1;
  }
  for (int k = 0; k < FERRY_K_COUNT; k++)
    for (int g = 0; g < 2; g++)
      s->fitted[k][g] = ferry_hw_cost_of_regime(&s->hw, ferry_kernel_kind_name((enum ferry_kernel_kind)k), g);
  /* the host waits for its copies to the device from pageable memory, or when the runtime's
   * copies block (runtime.blocking_copy): per copy, by its source buffer (ferry__sim_prepare()) */
  s->pinned = config ? config->lock_host_memory != 0 : 1;
  ex->config.lock_host_memory = s->pinned; /* without a configuration: pinned, its buffers too */
  /* the page cache lives in the host memory the host tier's budget leaves */
  if (p->has_host && p->host.memory_bytes) {
    const uint64_t budget = config ? config->host_budget_bytes : 0;
    s->cache.capacity_bytes = budget < p->host.memory_bytes ? p->host.memory_bytes - budget : 0;
  }
  if ((st = ferry__des_create(&s->des, 256)) != FERRY_OK ||
      (st = make_resources(s)) != FERRY_OK) {
    sim_destroy(ex); /* the failing call has set the message */
    return st;
  }
  *out = ex;
  return FERRY_OK;
}

ferry_status ferry_exec_sim_stats(const ferry_exec *ex, struct ferry_sim_stats *out) {
  if (!ex || !out || ex->backend != &sim_backend)
    return ferry__fail(FERRY_ERR_INVALID, "exec_sim_stats: not a sim executor");
  const struct sim_exec *s = ex->backend_state;
  memset(out, 0, sizeof *out);
  out->events_run = ferry__des_events_run(s->des);
  out->ops_done = s->ops_done;
  out->kernels = s->kernels;
  out->copies = s->copies;
  out->reads = s->reads;
  out->graph_ops = s->graph_ops;
  out->mode = s->mode;
  struct ferry__fluid_stats fs;
  ferry__fluid_get_stats(s->chan[CHAN_H2D], &fs);
  out->bytes_h2d = s->bytes_h2d; /* fs.bytes_done counts a copy from the other memory kind at its scaled flow */
  out->h2d_busy_ns = fs.busy_ns;
  ferry__fluid_get_stats(s->chan[CHAN_D2H], &fs);
  out->bytes_d2h = fs.bytes_done;
  out->d2h_busy_ns = fs.busy_ns;
  if (s->chan[CHAN_DISK]) {
    ferry__fluid_get_stats(s->chan[CHAN_DISK], &fs);
    out->bytes_disk = fs.bytes_done;
    out->disk_busy_ns = fs.busy_ns;
  }
  if (s->chan[CHAN_DISK_WRITE]) {
    ferry__fluid_get_stats(s->chan[CHAN_DISK_WRITE], &fs);
    out->bytes_disk_write = fs.bytes_done;
    out->disk_write_busy_ns = fs.busy_ns;
  }
  ferry__fluid_get_stats(s->chan[CHAN_PEER], &fs);
  out->bytes_peer = fs.bytes_done;
  out->peer_busy_ns = fs.busy_ns;
  ferry__fluid_get_stats(s->chan[CHAN_GATHER], &fs);
  out->bytes_gather = fs.bytes_done;
  out->gather_busy_ns = fs.busy_ns;
  out->allreduces = s->allreduces;
  out->allreduce_ns = s->allreduce_ns;
  for (int32_t i = 0; i < ex->n_queues; i++) {
    struct ferry__compute_stats cs;
    ferry__compute_get_stats(s->queues[i].unit, &cs);
    out->compute_busy_ns += cs.busy_ns;
  }
  out->now_ns = sim_now((struct ferry_exec *)ex);
  out->cache_hits = s->cache.hits;
  out->cache_misses = s->cache.misses;
  out->bytes_cache = s->cache.hit_bytes;
  return FERRY_OK;
}
