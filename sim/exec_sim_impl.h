/* State of the `sim` executor shared by its two ways of timing ops: the discrete-event path
 * (exec_sim.c: every op is events on resource models) and the fast path (exec_sim_fast.c:
 * each op's start and end worked out when it is enqueued, plus op graphs). Internal to sim/. */
#ifndef FERRY_SIM_EXEC_SIM_IMPL_H
#define FERRY_SIM_EXEC_SIM_IMPL_H

#include "ferry/sim.h"
#include "runtime/exec/exec_impl.h"
#include "sim/des.h"
#include "sim/gpu_cost.h"
#include "sim/resource.h"

#define PACKED_SLOTS 8 /* DEQUANTIZE outputs remembered for their consumers (the engine uses 3) */

/* The channels bytes flow through (index of a sim_op's channel). */
enum sim_chan {
  CHAN_NONE = -1,
  CHAN_H2D,
  CHAN_D2H,
  CHAN_DISK,
  CHAN_DRAM,
  CHAN_DMEM,
  CHAN_PEER,
  CHAN_GATHER,
  CHAN_DISK_WRITE,
  CHAN_COUNT
};
/* CHAN_PEER: GPU-to-GPU copies of a multi-device run (sim/interconnect.h); CHAN_GATHER: the
 * peers' parts of a ZeRO-3 gathered weight arriving at the one rank simulated (its NVLink ports'
 * receive side, ferry_exec_copy_peers()); CHAN_DISK_WRITE: copies into disk-tier buffers, at
 * disk.write_gbps (reads of them share CHAN_DISK with the stores' reads) */

/* What the resource models need of an op, worked out once when it is enqueued so that
 * starting it cannot fail for a reason the caller could have been told about. */
struct sim_cost {
  int64_t duration_ns; /* kernels: duration from the cost model (launch overhead included) */
  uint64_t flow_bytes; /* copies and reads: bytes the channel serves (a copy within one memory: read + write) */
  int chan;            /* copies and reads: the channel the bytes flow through (enum sim_chan) */
  int folded;          /* kernels: folded into the op that reads its output (no work, no launch) */
  int extra_ops;       /* kernels: framework ops issued beyond the first (ferry__gpu_work.ops) */
  int host_waits;      /* copies to the device: the host waits for it (from pageable memory, or the
                          runtime's copies block) */
};

/* The OS page cache as buffered disk reads see it: whole read ranges, least recently used out
 * first, in the host memory the host budget leaves free. A read of a cached range is a copy
 * within host memory; a buffered read from disk is cached unless it drops its pages after
 * itself (FERRY_READ_DROP_CACHE); O_DIRECT reads bypass it. A range counts as cached from the
 * moment its read is enqueued. */
struct cached_range {
  const struct ferry_store *store;
  uint64_t file, offset, len;
  uint64_t stamp; /* last use; 0 = empty entry */
};

struct page_cache {
  struct cached_range *v;
  size_t n, cap;
  uint64_t capacity_bytes, used_bytes, clock;
  uint64_t hits, misses, hit_bytes;
};

/* An op enqueued on the discrete-event path. */
struct sim_op {
  struct ferry_op op;  /* kernels: only the header unless a sink wanted the whole op */
  int full;            /* op.u holds the whole kernel */
  struct sim_cost cost;
  enum ferry_fault_kind fault; /* reads: the injected fault of the attempt in flight */
  int32_t attempt;             /* reads: attempts made (the I/O layer's retries, in virtual time) */
  int32_t failures;            /* reads: failed attempts */
  int read_failed;             /* reads: failed for good */
  int64_t first_start_ns;      /* start of the first attempt (-1 until one failed) */
  uint64_t seq;                /* issue order (link.contention: a kernel is slowed by the transfers issued before it) */
};

/* An op enqueued on the fast path: its times are known, so little is kept (the ring is walked
 * for every op of a simulation, and small entries keep it in cache). */
struct fast_op {
  int64_t start_ns, end_ns;
  ferry_event *ev;   /* records */
  uint64_t gen;      /* records: the generation completed; copies and reads: the bytes the channel serves */
  uint64_t bytes;    /* copies and reads: the bytes they move (gen differs for a copy the link serves scaled) */
  int64_t flow_ns;   /* copies and reads: the part with bytes flowing; kernels: their own time (a run
                        of kernels can have gaps between them) */
  uint8_t kind;      /* enum ferry_op_kind */
  int8_t chan;
  uint8_t full;      /* the whole op is in the queue's full[] at the same index (an activity sink) */
  uint8_t host_waits; /* sim_cost.host_waits */
  uint32_t n;        /* ops it stands for: kernels of a graph that run back to back are one entry */
  /* a record enqueued right behind it, which completes when it does: kept here rather than as
   * an entry of its own (half the ops of an expert's fetch and FFN are records) */
  ferry_event *rec_ev;
  uint64_t rec_gen;
};

struct sim_exec;

struct sim_queue {
  struct sim_exec *s;
  int32_t index;
  struct sim_op *ring; /* power-of-two capacity; the head op stays in place while it runs */
  uint32_t cap, head, count;
  int busy;            /* the head op is in flight on a resource */
  int waking;          /* idle when an op arrived: starts after the wake-up latency */
  int blocked;         /* the head op is a WAIT whose generation is not done yet */
  int64_t blocked_since;
  int64_t last_done_ns; /* when its last op completed (INT64_MIN: none yet) */
  /* fast path: its own ring (ring, cap, head and count above belong to the event path) */
  struct fast_op *fring;
  struct ferry_op *ffull; /* allocated with fring once an activity sink wants whole ops */
  uint32_t fcap, fhead, fcount;
  int64_t tail_ns;        /* when the last op enqueued ends */
  struct ferry__compute *unit; /* runs this queue's kernels */
  uint64_t completed;          /* ops completed on this queue since creation */
  uint64_t copies_through;     /* event path: completed reaches it once the last copy issued is done */
  struct ferry__res_job job;   /* the head op's job (one in flight per queue) */
};

/* A channel's last transfer in the fast path, which times a transfer alone on its channel and
 * refuses one that would share it with another queue's. */
struct sim_chan_use {
  int64_t until_ns;
  int32_t queue;
};

/* A link transfer's span with bytes flowing, kept while a kernel may still overlap it (sim/contend.c). */
struct sim_flow {
  int64_t start_ns, end_ns;
  uint64_t seq; /* the transfer's issue order (the discrete-event path; 0 in the fast path) */
};

struct sim_graph_capture;

struct sim_exec {
  struct ferry_exec *ex;
  struct ferry__des *des;
  struct ferry_hw_profile hw; /* figures only: sources, fitted and path are not kept */
  struct ferry__fluid *chan[CHAN_COUNT];
  const struct ferry_hw_cost *fitted[FERRY_K_COUNT][2]; /* per kernel kind and regime (GEMM), or NULL: roofline */
  struct sim_queue queues[FERRY_EXEC_MAX_QUEUES];
  uint32_t runnable; /* bit per queue that may be able to start its head op */
  int pumping;
  uint64_t pending_ops; /* ops enqueued and not completed, every queue */
  uint64_t ops_done, kernels, copies, reads, graph_ops;
  /* bytes copied host to device by the copies done: the link's channel serves a copy from the
   * other memory kind than the run's at a scaled size (ferry__sim_prepare()), which times it but
   * is not what it copied */
  uint64_t bytes_h2d;
  uint64_t allreduces;  /* FERRY_K_ALLREDUCE kernels priced, and their time */
  int64_t allreduce_ns;
  int64_t submit_ns, sync_ns; /* the host thread's own costs (profile host.submit_ns, host.sync_ns) */
  int64_t wake_ns;            /* an idle queue's latency to start a newly submitted op (host.queue_wake_ns) */
  int64_t event_wake_ns;      /* a queue blocked in a WAIT runs on this long after the event (host.event_wake_ns) */
  struct ferry_hw_runtime rt; /* the software issuing the work: host costs, fused low-bit kernels */
  int prefill_step;           /* the engine's step under way prefills ("prefill" range): a runtime
                                 with prefill_launch_ns issues its kernels at that cost, one with
                                 prefill_layer_ns spends that per layer */
  int pinned;                 /* the configuration's host memory (lock_host_memory): the link channel's
                                 rate is this kind's */
  double h2d_gbps[2];         /* the link's rate to the device from pageable [0] and pinned [1] host
                                 memory (make_resources(): one formula); a copy from a buffer of the
                                 other kind serves bytes scaled by their ratio (ferry__sim_prepare()) */
  /* the last DEQUANTIZE outputs: (buffer, offset) -> the packed weight behind them */
  const ferry_buf *packed_buf[PACKED_SLOTS];
  uint64_t packed_off[PACKED_SLOTS];
  struct ferry__packed packed[PACKED_SLOTS];
  uint64_t packed_next;
  struct page_cache cache; /* the OS page cache over buffered disk reads */
  /* link.contention > 0: the link transfers' flowing spans, in order of start (sim/contend.c) */
  struct sim_flow *flows;
  uint32_t n_flows, cap_flows;
  uint64_t issue_seq; /* ops submitted so far (the discrete-event path's sim_op.seq) */
  /* fast path */
  int mode;                   /* enum ferry_sim_mode */
  int submitted;              /* an op has been submitted: the mode can no longer change */
  int64_t now_ns;             /* its clock (the discrete-event path's is the event kernel's) */
  int64_t next_end_ns;        /* no queue's head op ends before this (INT64_MIN: unknown) */
  struct sim_chan_use chan_use[CHAN_COUNT];
  struct sim_graph_capture *capture; /* an op graph being recorded, or NULL */
  /* attention kernels timed again at graph launch: the last few (shape, context) -> duration
   * within one step (ferry_exec's graph_epoch; the kernels' token arrays hold that step's
   * positions); every layer of a step asks the same */
  struct sim_reprice {
    uint64_t epoch; /* 0: empty */
    int64_t context_tokens, ns;
    uint32_t shape_id; /* the kernel's shape, numbered at recording (exec_sim_graph.c) */
  } reprice[4];
  uint32_t reprice_next;
  /* runtime.model_syncs: where the model's code makes the host wait for the device, a layer's
   * host time (runtime.layer_ns) goes with its kernels' issue, in proportion to it, rather than
   * at the layer's start (ferry__sim_layer_share()) */
  struct sim_layer_host {
    int in_layer;     /* a "layer" range is open, and no kernel of no layer (the head) came since */
    int spread;       /* this layer's host time goes with its kernels */
    int syncs_seen;   /* a kernel the model's code waits before was issued */
    int64_t issue_ns; /* issue time of the open layer's kernels so far */
    int64_t ref_ns;   /* the same for the layer before it in this step (0: none yet) */
  } layer_host;
};

/* exec_sim.c, used by both paths */
ferry_status ferry__sim_prepare(struct sim_exec *s, struct sim_cost *c, const struct ferry_op *op, int cpu);
/* Where a read's bytes come from (page cache or disk), updating the page cache. */
ferry_status ferry__sim_route_read(struct sim_exec *s, struct sim_cost *c, const struct ferry_op *op);
/* The packed weights behind kernel k's references (noting k itself when it is a DEQUANTIZE). */
void ferry__sim_packed_of(struct sim_exec *s, const struct ferry_kernel *k, const struct ferry__packed *packed[3]);
const struct ferry__packed *ferry__sim_packed_at(const struct sim_exec *s, struct ferry_ref ref);
/* A kernel's duration with the given packed weights (-1: the profile cannot time it). */
int64_t ferry__sim_kernel_ns(struct sim_exec *s, const struct ferry_kernel *k, const struct ferry__packed *const packed[3],
                             int *folded, struct ferry__gpu_work *work);
/* Host time the runtime spends issuing an op, before the op reaches its queue. */
int64_t ferry__sim_issue_ns(const struct sim_exec *s, const struct sim_cost *c, const struct ferry_op *op);
/* The host time of one kernel launch now: a CUDA-graph runtime issues a prefilling step's
 * kernels one by one (runtime.prefill_launch_ns), a decode step's from its graph. */
int64_t ferry__sim_launch_ns(const struct sim_exec *s);
/* How many launches ferry__sim_issue_ns() counts for op (0 for a transfer or a folded kernel):
 * an op graph recorded in one kind of step and replayed in the other re-prices them. */
int64_t ferry__sim_issue_launches(const struct sim_exec *s, const struct sim_cost *c, const struct ferry_op *op);
/* Of host_syncs blocking copies of CPU-made tensors the model's code makes before a kernel
 * (ferry_kernel.host_syncs), those the runtime pays: all where it runs that code
 * (runtime.model_syncs), else 0. */
int ferry__sim_syncs_paid(struct sim_exec *s, int32_t host_syncs);
/* The same for kernel k as submitted; a kernel of no layer closes the layer. */
int ferry__sim_kernel_syncs(struct sim_exec *s, const struct ferry_kernel *k);
/* Host time of one such copy once the host has waited for the queue to drain: issuing it, its
 * crossing of the link, the host noticing its end. */
int64_t ferry__sim_sync_copy_ns(const struct sim_exec *s);
/* A kernel of the open layer issued at issue_ns: its share of the layer's host time (0 unless
 * the layer's time is spread), its issue time counted for the next layer's shares. */
int64_t ferry__sim_layer_share(struct sim_exec *s, int64_t issue_ns);
/* Bytes of op worth keeping in a ring entry (a kernel's shape only for an activity sink). */
size_t ferry__sim_op_bytes(const struct ferry_op *op, int sink);
ferry_status ferry__sim_ring_slot(struct sim_exec *s, struct sim_queue *q, struct sim_op **out);
/* The head op of q completed over [start, end]: counters, activity, the queue moves on. */
void ferry__sim_op_complete(struct sim_queue *q, int64_t start_ns, int64_t end_ns);
/* Generation gen of ev completed at t_ns: raise done_gen, release queues blocked on it. */
void ferry__sim_event_complete(struct sim_exec *s, ferry_event *ev, uint64_t gen, int64_t t_ns);

/* contend.c: link copies and kernels sharing one memory system (hw.link.contention > 0) */
/* A transfer issued seq-th flows over [start, end): noted for the kernels it slows; spans that
 * ended by keep_from (no kernel starts earlier) are dropped. */
ferry_status ferry__sim_flow_note(struct sim_exec *s, int64_t start_ns, int64_t end_ns, uint64_t seq, int64_t keep_from);
/* The transfer issued seq-th ended at end_ns (the discrete-event path, when it shared its channel). */
void ferry__sim_flow_ended(struct sim_exec *s, uint64_t seq, int64_t end_ns);
/* When a kernel of work_ns started at start_ns ends, slowed while the noted transfers issued
 * before it (seq < before_seq) flow. */
int64_t ferry__sim_contended_end(const struct sim_exec *s, int64_t start_ns, int64_t work_ns, uint64_t before_seq);
/* The link's two directions: their transfers slow kernels. */
static inline int ferry__sim_link_chan(int chan) { return chan == CHAN_H2D || chan == CHAN_D2H; }

/* exec_sim_fast.c */
ferry_status ferry__sim_fring_grow(struct sim_exec *s, struct sim_queue *q);
/* Complete every op that ended by the host clock. */
void ferry__sim_catch_up(struct sim_exec *s);

/* The entry after q's last op, the ring grown when full (inline: once per op simulated). Only
 * valid until the host clock next moves: a queue emptied by the completions starts again at
 * its first entry. */
static inline ferry_status ferry__sim_fring_tail(struct sim_exec *s, struct sim_queue *q, struct fast_op **out) {
  if (q->fcount == q->fcap) {
    ferry_status st = ferry__sim_fring_grow(s, q);
    if (st != FERRY_OK) return st;
  }
  *out = &q->fring[(q->fhead + q->fcount) & (q->fcap - 1)];
  return FERRY_OK;
}

/* The host works for ns: the ops that end meanwhile complete. */
static inline void ferry__sim_fast_host_busy(struct sim_exec *s, int64_t ns) {
  if (ns <= 0) return;
  s->now_ns += ns;
  if (s->now_ns >= s->next_end_ns) ferry__sim_catch_up(s);
}
/* n blocking copies before the next kernel on q (ferry__sim_kernel_syncs()): the host waits for
 * q's ops to end, then for each copy. */
static inline void ferry__sim_fast_syncs(struct sim_exec *s, const struct sim_queue *q, int n) {
  if (n <= 0) return;
  if (q->fcount && q->tail_ns > s->now_ns) ferry__sim_fast_host_busy(s, q->tail_ns - s->now_ns);
  ferry__sim_fast_host_busy(s, n * ferry__sim_sync_copy_ns(s));
}
/* The host's work before a kernel issued at issue_ns reaches q, beyond that issue time: its share
 * of the layer's host time, then `syncs` copies the model's code makes (ferry__sim_fast_syncs()). */
static inline void ferry__sim_fast_kernel_host(struct sim_exec *s, const struct sim_queue *q, int syncs,
                                               int64_t issue_ns) {
  ferry__sim_fast_host_busy(s, ferry__sim_layer_share(s, issue_ns));
  ferry__sim_fast_syncs(s, q, syncs);
}
/* A record of generation gen of ev enqueued on q behind an op still running (and no record
 * kept with it yet, no activity sink): it completes with that op, kept in its entry; the host
 * pays the submit cost. 0 when it needs an entry of its own (enqueue_timed()). */
static inline int ferry__sim_record_behind(struct sim_exec *s, struct sim_queue *q, ferry_event *ev, uint64_t gen) {
  if (!q->fcount || s->ex->sink) return 0;
  struct fast_op *tail = &q->fring[(q->fhead + q->fcount - 1) & (q->fcap - 1)];
  if (tail->rec_ev) return 0;
  ev->record_end_ns = q->tail_ns; /* where it starts: when the op before it ends */
  tail->rec_ev = ev;
  tail->rec_gen = gen;
  s->pending_ops++;
  ferry__sim_fast_host_busy(s, s->submit_ns);
  return 1;
}

/* Time the op in q's tail entry (kind, event, bytes, flow time filled in) lasting duration_ns
 * once started, count it, and move the host clock past queueing it (and past what the runtime
 * waits for: a synchronous fetch, a pageable copy). */
ferry_status ferry__sim_enqueue_timed(struct sim_exec *s, struct sim_queue *q, struct fast_op *fo, int64_t duration_ns);
/* Count q's tail entry whose start and end are set already. */
void ferry__sim_enqueue_placed(struct sim_exec *s, struct sim_queue *q, struct fast_op *fo);

ferry_status ferry__sim_fast_submit(struct sim_exec *s, int32_t queue, const struct ferry_op *op);
ferry_status ferry__sim_fast_sync(struct sim_exec *s, ferry_event *ev, uint64_t gen);
void ferry__sim_fast_sleep_until(struct sim_exec *s, int64_t t_ns);
ferry_status ferry__sim_fast_drain(struct sim_exec *s);
void ferry__sim_fast_free(struct sim_exec *s); /* the fast path's rings and graph recording state */

/* exec_sim_graph.c */
void ferry__sim_graph_state_free(struct sim_exec *s);
/* While recording: keep op as submitted to queue with its cost, flow time and issue cost. */
void ferry__sim_graph_capture_op(struct sim_exec *s, int32_t queue, const struct sim_cost *cost, int64_t flow_ns,
                                 int64_t issue_ns, const struct ferry_op *op);
/* the op-graph members of the backend table */
int ferry__sim_graph_mode(struct ferry_exec *ex);
ferry_status ferry__sim_graph_begin(struct ferry_exec *ex, ferry_event *const *params, int32_t n_params);
void ferry__sim_graph_skipped_wait(struct ferry_exec *ex, int32_t queue, ferry_event *ev);
ferry_status ferry__sim_graph_end(struct ferry_exec *ex, struct ferry_exec_graph **out);
ferry_status ferry__sim_graph_launch(struct ferry_exec *ex, const struct ferry_exec_graph *g, ferry_event *const *args,
                                     int64_t context_tokens);
ferry_status ferry__sim_graph_check(struct ferry_exec *ex, const struct ferry_exec_graph *g, int64_t context_tokens,
                                    int *same);
size_t ferry__sim_graph_bytes(const struct ferry_exec_graph *g);
void ferry__sim_graph_free(struct ferry_exec *ex, struct ferry_exec_graph *g);

#endif /* FERRY_SIM_EXEC_SIM_IMPL_H */
