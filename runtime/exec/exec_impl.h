/* The executor backend table and the state every executor shares. Backends (exec_host.c,
 * exec_cuda.c, sim/exec_sim.c) fill a static const ferry_exec_backend; the public wrappers in
 * exec.c validate, account tiers, number ops and emit activity, then call the table. */
#ifndef FERRY_EXEC_IMPL_H
#define FERRY_EXEC_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/error.h"
#include "ferry/exec.h"
#include "ferry/fault.h"

#define FERRY_EXEC_BACKEND_VERSION 1
#define FERRY_EXEC_MAX_QUEUES 16

enum ferry_op_kind { FERRY_OP_READ, FERRY_OP_COPY, FERRY_OP_KERNEL, FERRY_OP_RECORD, FERRY_OP_WAIT };

/* One enqueued operation, copied into the backend's queue. */
struct ferry_op {
  enum ferry_op_kind kind;
  uint64_t correlation_id;
  /* The engine work a copy or read serves: the innermost range open when it was submitted
   * ("block fetch" of layer 3, ...), -1 when none. Kernels carry their own in u.kernel. */
  int32_t step, layer, expert;
  union {
    struct {
      struct ferry_store *store;
      uint32_t file;
      uint64_t offset, len;
      struct ferry_ref dst;
      unsigned flags;
    } read;
    struct {
      struct ferry_ref dst, src;
      uint64_t bytes;
      enum ferry_copy_kind copy_kind;
      int peers; /* ferry_exec_copy_peers(): the bytes stand for the data-parallel peers' part */
    } copy;
    struct ferry_kernel kernel;
    struct {
      ferry_event *ev;
      uint64_t gen; /* record: the generation this record completes; wait: generation awaited */
    } event;
  } u;
};

struct ferry_buf {
  enum ferry_tier tier;
  uint64_t base;       /* the offset of its first byte: a window (ferry_exec_alloc_window()) holds
                          offsets [base, base + bytes) of a layout whose lower ones another buffer
                          holds; 0 for every other buffer */
  uint64_t bytes;      /* held, and addressable from base */
  uint64_t charged;    /* what the tier is charged (ferry_exec_alloc_charged(); = bytes on an
                          executor with data) */
  const char *label;
  int32_t device;     /* its device (device tier of a multi-device executor), else 0 */
  int pinned;         /* host tier: page-locked (ferry_exec_alloc_host(); by default the
                         configuration's lock_host_memory); device tier: 1 */
  void *ptr;          /* host-visible bytes (host tier; device tier of the host executor) */
  void *backend_ptr;  /* backend handle (device pointer, a disk-tier buffer's open file, ...) */
  const char *file;   /* disk tier: the file behind it (owned by the backend), else NULL */
  struct ferry_buf *prev, *next; /* the executor's live buffers, freed at destroy */
};

/* Whether `need` bytes from reference r lie inside its buffer's window [base, base + bytes). */
static inline int ferry__ref_fits(struct ferry_ref r, uint64_t need) {
  const uint64_t at = r.offset - r.buf->base;
  return r.offset >= r.buf->base && at <= r.buf->bytes && need <= r.buf->bytes - at;
}

/* A window's offsets for a message (" at offsets A to B" of a buffer with a base; "" for others). */
void ferry__buf_window(const struct ferry_buf *buf, char *out, size_t len);

/* The byte of its buffer's memory a reference starts at (its offset less the window's base):
 * what a backend adds to the buffer's pointer. */
static inline uint64_t ferry__ref_at(struct ferry_ref r) { return r.offset - r.buf->base; }

/* Events complete by generation: record() bumps recorded_gen and enqueues a RECORD op with it;
 * running that op raises done_gen. A wait for generation g is satisfied once done_gen >= g. */
struct ferry_event {
  _Atomic uint64_t recorded_gen;
  _Atomic uint64_t done_gen;
  int64_t done_time_ns; /* executor time at which done_gen was last raised */
  int64_t record_end_ns; /* when the latest generation recorded will complete, for a backend that
                            knows at enqueue time (the sim executor's fast path) */
  void *backend;        /* backend per-event state */
};

struct ferry_exec_queue {
  enum ferry_queue_role role;
  int32_t device; /* the device whose engines and link run its ops */
  _Atomic int64_t stall_ns;
  _Atomic int64_t busy_ns;
  void *backend; /* backend per-queue state */
};

/* The generation a record of ev completes (the record is enqueued with it). Only the thread
 * issuing ops records, so a plain load and store suffice (an atomic add costs a locked
 * instruction per record, a measurable share of a simulation). */
static inline uint64_t ferry__event_record_gen(ferry_event *ev) {
  const uint64_t gen = atomic_load_explicit(&ev->recorded_gen, memory_order_relaxed) + 1;
  atomic_store_explicit(&ev->recorded_gen, gen, memory_order_release);
  return gen;
}

/* The generation a wait on ev must wait for, or 0 when there is nothing to wait for (never
 * recorded, or done already): such a wait is not enqueued at all. */
static inline uint64_t ferry__event_wait_gen(ferry_event *ev) {
  uint64_t gen = atomic_load(&ev->recorded_gen);
  return gen == 0 || atomic_load(&ev->done_gen) >= gen ? 0 : gen;
}

struct ferry_exec;
struct ferry_exec_graph; /* defined by the backends that have op graphs (runtime/exec/graph.h) */

struct ferry_exec_backend {
  int version;
  const char *name;
  int has_data;      /* computes on real bytes */
  int virtual_clock; /* now() is simulated time: no NVTX ranges (they would be wall time) */
  int half_dequant;  /* DEQUANTIZE into fp16 is its fast path (ferry_exec_half_dequant) */
  /* required */
  void (*destroy)(struct ferry_exec *ex);
  ferry_status (*queue_init)(struct ferry_exec *ex, int32_t queue);
  ferry_status (*buf_alloc)(struct ferry_exec *ex, ferry_buf *buf);
  void (*buf_free)(struct ferry_exec *ex, ferry_buf *buf);
  ferry_status (*submit)(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op);
  ferry_status (*sync)(struct ferry_exec *ex, ferry_event *ev, uint64_t gen);
  ferry_status (*drain)(struct ferry_exec *ex);
  int64_t (*now)(struct ferry_exec *ex);
  void (*sleep_until)(struct ferry_exec *ex, int64_t t_ns);
  /* optional */
  ferry_status (*event_init)(struct ferry_exec *ex, ferry_event *ev);
  void (*event_fini)(struct ferry_exec *ex, ferry_event *ev);
  ferry_status (*device_info)(struct ferry_exec *ex, struct ferry_device_info *out); /* NULL: no GPU */
  /* the engine opens a range of work ("step", "layer", ...; ferry_exec_range_begin()): a
   * simulated runtime charges its host work there */
  void (*range_begin)(struct ferry_exec *ex, const char *name);
  /* optional, all or none: op graphs (runtime/exec/graph.h); graph_mode says whether they are
   * worth using now (an enum ferry__graph_mode) */
  int (*graph_mode)(struct ferry_exec *ex);
  ferry_status (*graph_begin)(struct ferry_exec *ex, ferry_event *const *params, int32_t n_params);
  void (*graph_skipped_wait)(struct ferry_exec *ex, int32_t queue, ferry_event *ev); /* a wait not enqueued */
  ferry_status (*graph_end)(struct ferry_exec *ex, struct ferry_exec_graph **out);
  ferry_status (*graph_launch)(struct ferry_exec *ex, const struct ferry_exec_graph *g, ferry_event *const *args,
                               int64_t context_tokens);
  ferry_status (*graph_check)(struct ferry_exec *ex, const struct ferry_exec_graph *g, int64_t context_tokens,
                              int *same); /* ends the recording */
  size_t (*graph_bytes)(const struct ferry_exec_graph *g);
  void (*graph_free)(struct ferry_exec *ex, struct ferry_exec_graph *g);
  /* optional: the element sizes its device holds the engine's workspace at (NULL: fp32, {4, 4}) */
  void (*elem_bytes)(const struct ferry_exec *ex, struct ferry_exec_elem_bytes *out);
};

struct ferry_exec {
  const struct ferry_exec_backend *backend;
  struct ferry_exec_config config;
  struct ferry_err err;
  pthread_mutex_t lock; /* tier accounting and sink */
  uint64_t used[FERRY_TIER_COUNT], peak[FERRY_TIER_COUNT];
  uint64_t dev_used[FERRY_EXEC_MAX_DEVICES], dev_peak[FERRY_EXEC_MAX_DEVICES]; /* device tier, per device */
  ferry_buf *buffers; /* live buffers */
  int32_t disk_bufs;  /* live disk-tier buffers: kernels are checked for operands in them only
                         while there are some (the check costs a simulation's hot path) */
  ferry_activity_fn sink;
  void *sink_user;
  ferry_launch_begin_fn launch_begin; /* optional: brackets a backend's driver calls per op */
  ferry_launch_end_fn launch_end;
  void *launch_user;
  _Atomic uint64_t next_correlation;
  struct ferry_exec_queue queues[FERRY_EXEC_MAX_QUEUES];
  int32_t n_queues;
  /* First failure of an asynchronous op; reported by the next sync/drain. */
  _Atomic int first_error;
  char first_error_msg[FERRY_ERRMSG_MAX];
  pthread_mutex_t error_lock;
  int capturing; /* an op graph is being recorded (graph_begin .. graph_end) */
  uint64_t graph_epoch; /* ferry__exec_graph_step() calls: 0 until the first */
  void *backend_state;
  /* The innermost open range's step, layer and expert (ferry_exec_range_begin), stamped on the
   * ops submitted meanwhile; touched only by the thread that submits, as ranges are. */
  int32_t range_step, range_layer, range_expert;
};

/* The kernel contract every executor shares (kernel_check.c): shapes, element types, buffer
 * bounds and immediate ints, checked by ferry_exec_compute before the backend sees the op. */
ferry_status ferry__kernel_check(struct ferry_exec *ex, const struct ferry_kernel *k);
/* Whether a kernel kind reads ints (m of them) and ints2. */
int ferry__kernel_uses_ints(const struct ferry_kernel *k);
int ferry__kernel_uses_ints2(const struct ferry_kernel *k);

/* Common initialisation of the shared part; the backend allocates the struct. */
ferry_status ferry__exec_init(struct ferry_exec *ex, const struct ferry_exec_backend *backend,
                              const struct ferry_exec_config *config);
void ferry__exec_fini(struct ferry_exec *ex);

/* Called by backends when an op ran (start/end on the executor's clock): emits the activity. */
void ferry__exec_op_done(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op, int64_t start_ns,
                         int64_t end_ns);
/* Called by backends for an asynchronous failure (first one wins). */
void ferry__exec_op_failed(struct ferry_exec *ex, ferry_status status, const char *msg);
/* Injected faults of a copy or kernel about to run (ferry/fault.h; nothing for other ops):
 * backends call it once per op before running it, wait delay_ns (real or virtual time) and,
 * for FERRY_FAULT_FAIL, report the op failed with ferry__exec_fault_fail() instead of running
 * it, so every executor loses its device the same way. */
struct ferry_fault ferry__exec_fault(const struct ferry_op *op);
void ferry__exec_fault_fail(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op, uint64_t attempt);
/* Emit a memory sample of a tier at time t. */
void ferry__exec_emit_memory(struct ferry_exec *ex, enum ferry_tier tier, int64_t t_ns);

/* exec_cuda.c: the CUDA driver API and runtime versions (1000 * major + 10 * minor), 0 when
 * unknown or in a build without CUDA (provenance.c records them). */
void ferry__exec_cuda_versions(int *driver, int *runtime);

#endif
