/* Public executor wrappers: argument validation, tier budgets, op numbering and activity
 * records live here once, so every backend behaves the same at the interface. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "exec_impl.h"
#include "nvtx.h"
#include "ferry/store.h"

ferry_status ferry__exec_init(struct ferry_exec *ex, const struct ferry_exec_backend *backend,
                              const struct ferry_exec_config *config) {
  ex->backend = backend;
  if (config) ex->config = *config;
  if (ex->config.n_devices < 1) ex->config.n_devices = 1;
  if (ex->config.n_devices > FERRY_EXEC_MAX_DEVICES) ex->config.n_devices = FERRY_EXEC_MAX_DEVICES;
  pthread_mutex_init(&ex->lock, NULL);
  pthread_mutex_init(&ex->error_lock, NULL);
  atomic_store(&ex->next_correlation, 1);
  atomic_store(&ex->first_error, 0);
  ex->range_step = ex->range_layer = ex->range_expert = -1;
  return FERRY_OK;
}

void ferry__exec_fini(struct ferry_exec *ex) {
  pthread_mutex_destroy(&ex->lock);
  pthread_mutex_destroy(&ex->error_lock);
}

void ferry_exec_destroy(ferry_exec *ex) {
  if (!ex) return;
  ex->backend->drain(ex);
  while (ex->buffers) ferry_exec_free(ex, ex->buffers);
  ex->backend->destroy(ex);
}

const char *ferry_exec_name(const ferry_exec *ex) { return ex->backend->name; }
const char *ferry_exec_errmsg(const ferry_exec *ex) { return ex->err.msg; }
int ferry_exec_has_data(const ferry_exec *ex) { return ex->backend->has_data; }
int ferry_exec_half_dequant(const ferry_exec *ex) { return ex->backend->half_dequant; }

void ferry_exec_set_launch_hook(ferry_exec *ex, ferry_launch_begin_fn begin, ferry_launch_end_fn end, void *user) {
  if (!ex) return;
  ex->launch_begin = begin && end ? begin : NULL;
  ex->launch_end = begin && end ? end : NULL;
  ex->launch_user = user;
}

ferry_status ferry_exec_device_info(ferry_exec *ex, struct ferry_device_info *out) {
  if (!ex || !out) return ferry__fail(FERRY_ERR_INVALID, "exec_device_info: NULL argument");
  memset(out, 0, sizeof *out);
  if (!ex->backend->device_info)
    return ferry__err_set(&ex->err, FERRY_ERR_UNSUPPORTED, "the %s executor drives no GPU", ex->backend->name);
  return ex->backend->device_info(ex, out);
}

void ferry_exec_set_sink(ferry_exec *ex, ferry_activity_fn fn, void *user) {
  pthread_mutex_lock(&ex->lock);
  ex->sink = fn;
  ex->sink_user = user;
  pthread_mutex_unlock(&ex->lock);
}

static int valid_queue(const ferry_exec *ex, int32_t q) { return q >= 0 && q < ex->n_queues; }
static void emit_range(ferry_exec *ex, const char *name, int64_t start_ns, int64_t end_ns, int32_t step,
                       int32_t layer, int32_t expert);

ferry_status ferry_exec_queue_create(ferry_exec *ex, enum ferry_queue_role role, int32_t *out) {
  return ferry_exec_queue_create_on(ex, role, 0, out);
}

static int valid_device(const ferry_exec *ex, int32_t d) { return d >= 0 && d < ex->config.n_devices; }

int32_t ferry_exec_device_count(const ferry_exec *ex) { return ex->config.n_devices; }
int32_t ferry_exec_buf_device(const ferry_buf *buf) { return buf->device; }

ferry_status ferry_exec_queue_create_on(ferry_exec *ex, enum ferry_queue_role role, int32_t device, int32_t *out) {
  if (!ex || !out || role > FERRY_QUEUE_CPU || !valid_device(ex, device))
    return ferry__err_set(ex ? &ex->err : NULL, FERRY_ERR_INVALID, "queue_create: invalid argument");
  if (ex->n_queues >= FERRY_EXEC_MAX_QUEUES)
    return ferry__err_set(&ex->err, FERRY_ERR_RANGE, "queue_create: at most %d queues", FERRY_EXEC_MAX_QUEUES);
  int32_t q = ex->n_queues;
  memset(&ex->queues[q], 0, sizeof ex->queues[q]);
  ex->queues[q].role = role;
  ex->queues[q].device = device;
  ferry_status st = ex->backend->queue_init(ex, q);
  if (st != FERRY_OK) return st;
  ex->n_queues++;
  *out = q;
  return FERRY_OK;
}

static const char *tier_name(enum ferry_tier t) {
  return t == FERRY_TIER_DEVICE ? "device" : t == FERRY_TIER_HOST ? "host" : "disk";
}

uint64_t ferry_exec_tier_budget(const ferry_exec *ex, enum ferry_tier tier) {
  if (tier == FERRY_TIER_DEVICE) return ex->config.device_budget_bytes;
  if (tier == FERRY_TIER_HOST) return ex->config.host_budget_bytes;
  return 0;
}

ferry_status ferry_exec_set_budget(ferry_exec *ex, enum ferry_tier tier, uint64_t bytes) {
  if (!ex || (tier != FERRY_TIER_DEVICE && tier != FERRY_TIER_HOST))
    return ferry__err_set(ex ? &ex->err : NULL, FERRY_ERR_INVALID, "set_budget: the device or host tier only");
  pthread_mutex_lock(&ex->lock);
  if (tier == FERRY_TIER_DEVICE) ex->config.device_budget_bytes = bytes;
  else ex->config.host_budget_bytes = bytes;
  uint64_t used = ex->used[tier];
  if (tier == FERRY_TIER_DEVICE && ex->config.n_devices > 1) /* each device has the budget */
    for (int32_t d = used = 0; d < ex->config.n_devices; d++) used = ex->dev_used[d] > used ? ex->dev_used[d] : used;
  pthread_mutex_unlock(&ex->lock);
  if (bytes && used > bytes)
    return ferry__err_set(&ex->err, FERRY_ERR_BUDGET, "%s tier: %llu bytes in use exceed the new budget of %llu bytes",
                          tier_name(tier), (unsigned long long)used, (unsigned long long)bytes);
  return FERRY_OK;
}

void ferry__exec_emit_memory(struct ferry_exec *ex, enum ferry_tier tier, int64_t t_ns) {
  if (!ex->sink) return;
  struct ferry_activity a = {.kind = FERRY_ACT_MEMORY, .name = tier_name(tier), .queue = -1,
                             .start_ns = t_ns, .end_ns = t_ns, .tier = tier, .used_bytes = ex->used[tier],
                             .step = -1, .layer = -1, .expert = -1};
  ex->sink(ex->sink_user, &a);
}

ferry_status ferry_exec_alloc(ferry_exec *ex, enum ferry_tier tier, uint64_t bytes, const char *label,
                              ferry_buf **out) {
  return ferry_exec_alloc_on(ex, 0, tier, bytes, label, out);
}

/* Tier accounting of a buffer of `bytes` on device d (sign: +1 reserve, -1 release); the
 * device tier also per device. Called with the lock held. */
static void account(ferry_exec *ex, enum ferry_tier tier, int32_t d, uint64_t bytes, int sign) {
  ex->used[tier] = sign > 0 ? ex->used[tier] + bytes : ex->used[tier] - bytes;
  if (tier != FERRY_TIER_DEVICE) return;
  ex->dev_used[d] = sign > 0 ? ex->dev_used[d] + bytes : ex->dev_used[d] - bytes;
  if (ex->dev_used[d] > ex->dev_peak[d]) ex->dev_peak[d] = ex->dev_used[d];
}

void ferry_exec_device_usage(const ferry_exec *ex, int32_t device, uint64_t *used, uint64_t *peak) {
  const int ok = valid_device(ex, device);
  pthread_mutex_lock((pthread_mutex_t *)&ex->lock);
  if (used) *used = ok ? ex->dev_used[device] : 0;
  if (peak) *peak = ok ? ex->dev_peak[device] : 0;
  pthread_mutex_unlock((pthread_mutex_t *)&ex->lock);
}

void ferry_exec_elem_bytes(const ferry_exec *ex, struct ferry_exec_elem_bytes *out) {
  *out = (struct ferry_exec_elem_bytes){4, 4};
  if (ex && ex->backend->elem_bytes) ex->backend->elem_bytes(ex, out);
}

ferry_status ferry_exec_alloc_on(ferry_exec *ex, int32_t device, enum ferry_tier tier, uint64_t bytes,
                                 const char *label, ferry_buf **out) {
  return ferry_exec_alloc_charged(ex, device, tier, bytes, bytes, label, out);
}

/* The tier is charged `charged` of the `bytes` the buffer addresses. Only the simulator may be
 * charged less: its buffers hold nothing, and what it charges is what the runtime it simulates
 * would hold (an fp16 copy of the engine's fp32 workspace); a real executor holds every byte. */
static ferry_status alloc_kind(ferry_exec *ex, int32_t device, enum ferry_tier tier, uint64_t base, uint64_t bytes,
                               uint64_t charged, int pinned, const char *label, ferry_buf **out);

ferry_status ferry_exec_alloc_charged(ferry_exec *ex, int32_t device, enum ferry_tier tier, uint64_t bytes,
                                      uint64_t charged, const char *label, ferry_buf **out) {
  return ferry_exec_alloc_window(ex, device, tier, 0, bytes, charged, label, out);
}

ferry_status ferry_exec_alloc_window(ferry_exec *ex, int32_t device, enum ferry_tier tier, uint64_t base,
                                     uint64_t bytes, uint64_t charged, const char *label, ferry_buf **out) {
  return alloc_kind(ex, device, tier, base, bytes, charged, ex ? ex->config.lock_host_memory != 0 : 1, label, out);
}

ferry_status ferry_exec_alloc_host(ferry_exec *ex, uint64_t bytes, enum ferry_host_memory kind, const char *label,
                                   ferry_buf **out) {
  if (kind != FERRY_HOST_MEMORY_DEFAULT && kind != FERRY_HOST_MEMORY_PINNED && kind != FERRY_HOST_MEMORY_PAGEABLE)
    return ferry__err_set(ex ? &ex->err : NULL, FERRY_ERR_INVALID, "alloc: unknown host memory kind %d", (int)kind);
  const int pinned = kind == FERRY_HOST_MEMORY_DEFAULT ? (ex ? ex->config.lock_host_memory != 0 : 1)
                                                       : kind == FERRY_HOST_MEMORY_PINNED;
  return alloc_kind(ex, 0, FERRY_TIER_HOST, 0, bytes, bytes, pinned, label, out);
}

int ferry_exec_buf_pinned(const ferry_buf *buf) { return buf ? buf->pinned : 0; }

/* The allocation behind every variant: `pinned` is the host-tier buffer's kind (the device
 * tier ignores it). */
static ferry_status alloc_kind(ferry_exec *ex, int32_t device, enum ferry_tier tier, uint64_t base, uint64_t bytes,
                               uint64_t charged, int pinned, const char *label, ferry_buf **out) {
  if (!ex || !out || (unsigned)tier >= FERRY_TIER_COUNT || !valid_device(ex, device) ||
      base > UINT64_MAX - bytes)
    return ferry__err_set(ex ? &ex->err : NULL, FERRY_ERR_INVALID, "alloc: invalid argument");
  if (!label) label = "buffer";
  if (charged > bytes || (charged < bytes && ex->backend->has_data))
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID,
                          "alloc: %s charged %llu of its %llu bytes: only an executor without data (sim) may be "
                          "charged less than it addresses, never more",
                          label, (unsigned long long)charged, (unsigned long long)bytes);
  const uint64_t addressed = bytes;
  bytes = charged; /* from here on: the tier's figure */
  if (tier != FERRY_TIER_DEVICE) device = 0;
  uint64_t budget = ferry_exec_tier_budget(ex, tier);
  pthread_mutex_lock(&ex->lock);
  const uint64_t in_use = tier == FERRY_TIER_DEVICE ? ex->dev_used[device] : ex->used[tier];
  if (budget && (bytes > budget || in_use > budget - bytes)) {
    pthread_mutex_unlock(&ex->lock);
    char dev[32] = "";
    if (ex->config.n_devices > 1 && tier == FERRY_TIER_DEVICE) snprintf(dev, sizeof dev, " (device %d)", device);
    return ferry__err_set(&ex->err, FERRY_ERR_BUDGET,
                          "%s tier%s: allocating %llu bytes for %s would exceed the budget (%llu of %llu bytes in use)",
                          tier_name(tier), dev, (unsigned long long)bytes, label, (unsigned long long)in_use,
                          (unsigned long long)budget);
  }
  account(ex, tier, device, bytes, +1); /* reserve before the backend allocates, release on failure */
  pthread_mutex_unlock(&ex->lock);

  ferry_buf *buf = ferry__calloc(1, sizeof *buf);
  ferry_status st = FERRY_OK;
  if (!buf) {
    st = ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "alloc: out of memory for %s", label);
    goto out_unreserve;
  }
  buf->tier = tier;
  buf->base = base;
  buf->bytes = addressed;
  buf->charged = charged;
  buf->label = label;
  buf->device = device;
  buf->pinned = tier == FERRY_TIER_HOST ? pinned : tier == FERRY_TIER_DEVICE;
  st = ex->backend->buf_alloc(ex, buf);
  if (st != FERRY_OK) {
    ferry_free(buf);
    goto out_unreserve;
  }
  pthread_mutex_lock(&ex->lock);
  buf->next = ex->buffers;
  if (ex->buffers) ex->buffers->prev = buf;
  ex->buffers = buf;
  if (tier == FERRY_TIER_DISK) ex->disk_bufs++;
  if (ex->used[tier] > ex->peak[tier]) ex->peak[tier] = ex->used[tier];
  ferry__exec_emit_memory(ex, tier, ex->backend->now(ex));
  pthread_mutex_unlock(&ex->lock);
  *out = buf;
  return FERRY_OK;
out_unreserve:
  pthread_mutex_lock(&ex->lock);
  account(ex, tier, device, bytes, -1);
  pthread_mutex_unlock(&ex->lock);
  return st;
}

void ferry_exec_free(ferry_exec *ex, ferry_buf *buf) {
  if (!buf) return;
  ex->backend->buf_free(ex, buf);
  pthread_mutex_lock(&ex->lock);
  if (buf->prev) buf->prev->next = buf->next;
  else ex->buffers = buf->next;
  if (buf->next) buf->next->prev = buf->prev;
  account(ex, buf->tier, buf->device, buf->charged, -1);
  if (buf->tier == FERRY_TIER_DISK) ex->disk_bufs--;
  ferry__exec_emit_memory(ex, buf->tier, ex->backend->now(ex));
  pthread_mutex_unlock(&ex->lock);
  ferry_free(buf);
}

uint64_t ferry_exec_buf_size(const ferry_buf *buf) { return buf->bytes; }
const char *ferry_exec_buf_file(const ferry_buf *buf) { return buf ? buf->file : NULL; }
uint64_t ferry_exec_buf_base(const ferry_buf *buf) { return buf->base; }
enum ferry_tier ferry_exec_buf_tier(const ferry_buf *buf) { return buf->tier; }

void *ferry_exec_buf_host_ptr(ferry_exec *ex, ferry_buf *buf) {
  (void)ex;
  return buf ? buf->ptr : NULL;
}

void ferry_exec_tier_usage(const ferry_exec *ex, enum ferry_tier tier, uint64_t *used, uint64_t *peak) {
  pthread_mutex_lock((pthread_mutex_t *)&ex->lock);
  if (used) *used = ex->used[tier];
  if (peak) *peak = ex->peak[tier];
  pthread_mutex_unlock((pthread_mutex_t *)&ex->lock);
}

void ferry__buf_window(const struct ferry_buf *buf, char *out, size_t len) {
  if (!len) return;
  out[0] = 0;
  if (buf->base)
    snprintf(out, len, " at offsets %llu to %llu", (unsigned long long)buf->base,
             (unsigned long long)(buf->base + buf->bytes));
}

/* A reference must name a buffer and leave room for `need` bytes from its offset, inside the
 * buffer's window (a window's lower offsets are another buffer's: ferry_exec_alloc_window()). */
static ferry_status check_ref(ferry_exec *ex, const char *what, struct ferry_ref r, uint64_t need) {
  if (!r.buf) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "%s: no buffer", what);
  if (!ferry__ref_fits(r, need)) {
    char window[80] = "";
    ferry__buf_window(r.buf, window, sizeof window);
    return ferry__err_set(&ex->err, FERRY_ERR_RANGE,
                          "%s: %llu bytes at offset %llu overrun buffer '%s' of %llu bytes%s", what,
                          (unsigned long long)need, (unsigned long long)r.offset, r.buf->label,
                          (unsigned long long)r.buf->bytes, window);
  }
  return FERRY_OK;
}

/* Only the header is initialised here and each wrapper sets every field of the member it
 * uses: zero-initialising the whole op (400-odd bytes, for its kernel member) cost more than
 * the rest of enqueueing a record or a copy on the simulator. */
static inline void op_init(struct ferry_op *op, enum ferry_op_kind kind) {
  op->kind = kind;
  op->correlation_id = 0;
}

static ferry_status submit(ferry_exec *ex, int32_t queue, struct ferry_op *op) {
  op->correlation_id = atomic_fetch_add(&ex->next_correlation, 1);
  op->step = ex->range_step;
  op->layer = ex->range_layer;
  op->expert = ex->range_expert;
  return ex->backend->submit(ex, queue, op);
}

ferry_status ferry_exec_read(ferry_exec *ex, int32_t queue, struct ferry_store *store, uint32_t file,
                             uint64_t offset, uint64_t len, struct ferry_ref dst, unsigned flags) {
  if (!valid_queue(ex, queue)) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "read: bad queue %d", queue);
  uint64_t need = (flags & FERRY_READ_DIRECT) ? ferry_store_direct_span(offset, len) : len;
  ferry_status st = check_ref(ex, "read", dst, need);
  if (st != FERRY_OK) return st;
  if (dst.buf->tier != FERRY_TIER_HOST)
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "read: destination '%s' is not in the host tier",
                          dst.buf->label);
  struct ferry_op op;
  op_init(&op, FERRY_OP_READ);
  op.u.read.store = store;
  op.u.read.file = file;
  op.u.read.offset = offset;
  op.u.read.len = len;
  op.u.read.dst = dst;
  op.u.read.flags = flags;
  return submit(ex, queue, &op);
}

static enum ferry_copy_kind copy_kind(const ferry_buf *dst, const ferry_buf *src) {
  if (src->tier == FERRY_TIER_DISK) return FERRY_COPY_DISK_TO_HOST; /* the other side is host (copy_op()) */
  if (dst->tier == FERRY_TIER_DISK) return FERRY_COPY_HOST_TO_DISK;
  if (src->tier == FERRY_TIER_HOST && dst->tier == FERRY_TIER_DEVICE) return FERRY_COPY_HTOD;
  if (src->tier == FERRY_TIER_DEVICE && dst->tier == FERRY_TIER_HOST) return FERRY_COPY_DTOH;
  if (src->tier == FERRY_TIER_DEVICE && dst->tier == FERRY_TIER_DEVICE)
    return src->device == dst->device ? FERRY_COPY_DTOD : FERRY_COPY_PTOP;
  return FERRY_COPY_HTOH;
}

static ferry_status copy_op(ferry_exec *ex, int32_t queue, struct ferry_ref dst, struct ferry_ref src, uint64_t bytes,
                            int peers) {
  if (!valid_queue(ex, queue)) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "copy: bad queue %d", queue);
  ferry_status st = check_ref(ex, "copy destination", dst, bytes);
  if (st == FERRY_OK) st = check_ref(ex, "copy source", src, bytes);
  if (st != FERRY_OK) return st;
  /* a disk-tier buffer is a file: read into host memory or written from it, nothing else */
  if ((dst.buf->tier == FERRY_TIER_DISK || src.buf->tier == FERRY_TIER_DISK) &&
      (peers || (dst.buf->tier == FERRY_TIER_DISK ? src.buf : dst.buf)->tier != FERRY_TIER_HOST))
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID,
                          "copy: '%s' (%s tier) to '%s' (%s tier): a disk-tier buffer is copied to or from a host-tier "
                          "buffer only",
                          src.buf->label, tier_name(src.buf->tier), dst.buf->label, tier_name(dst.buf->tier));
  struct ferry_op op;
  op_init(&op, FERRY_OP_COPY);
  op.u.copy.dst = dst;
  op.u.copy.src = src;
  op.u.copy.bytes = bytes;
  op.u.copy.copy_kind = peers ? FERRY_COPY_PTOP : copy_kind(dst.buf, src.buf);
  op.u.copy.peers = peers;
  return submit(ex, queue, &op);
}

ferry_status ferry_exec_copy(ferry_exec *ex, int32_t queue, struct ferry_ref dst, struct ferry_ref src,
                             uint64_t bytes) {
  return copy_op(ex, queue, dst, src, bytes, 0);
}

ferry_status ferry_exec_copy_peers(ferry_exec *ex, int32_t queue, struct ferry_ref dst, struct ferry_ref src,
                                   uint64_t bytes) {
  if (dst.buf && dst.buf->tier != FERRY_TIER_DEVICE)
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "copy from peers: destination '%s' is not in the device tier",
                          dst.buf->label);
  return copy_op(ex, queue, dst, src, bytes, 1);
}

/* A kernel on a CPU queue reads and writes host memory only: a device-tier operand would be a
 * device pointer on a GPU (and, on the host executor, traffic the run never accounted). No
 * kernel reads a disk-tier buffer, whose bytes are a file's (cpu 0: only that is checked). */
static ferry_status check_operands(ferry_exec *ex, const struct ferry_kernel *k, int cpu) {
  const struct ferry_ref *refs[4 + 8] = {&k->x, &k->y, &k->w, &k->b};
  const char *names[4 + 8] = {"x", "y", "w", "b", "aux[0]", "aux[1]", "aux[2]", "aux[3]",
                              "aux[4]", "aux[5]", "aux[6]", "aux[7]"};
  for (int i = 0; i < 8; i++) refs[4 + i] = &k->aux[i];
  for (int i = 0; i < 12; i++)
    if (refs[i]->buf && refs[i]->buf->tier == FERRY_TIER_DISK)
      return ferry__err_set(&ex->err, FERRY_ERR_INVALID,
                            "compute %s: operand %s is in buffer '%s' of the disk tier (a file: copy it into host "
                            "memory first)",
                            k->name ? k->name : ferry_kernel_kind_name(k->kind), names[i], refs[i]->buf->label);
    else if (cpu && refs[i]->buf && refs[i]->buf->tier != FERRY_TIER_HOST)
      return ferry__err_set(&ex->err, FERRY_ERR_INVALID,
                            "compute %s on a CPU queue: operand %s is in buffer '%s' of the %s tier (CPU kernels "
                            "read and write host memory only)",
                            k->name ? k->name : ferry_kernel_kind_name(k->kind), names[i], refs[i]->buf->label,
                            tier_name(refs[i]->buf->tier));
  return FERRY_OK;
}

ferry_status ferry_exec_compute(ferry_exec *ex, int32_t queue, const struct ferry_kernel *kernel) {
  if (!valid_queue(ex, queue)) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "compute: bad queue %d", queue);
  if (!kernel) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "compute: invalid kernel");
  /* the contract, once for every executor: the same bad op gets the same status everywhere */
  const ferry_status st = ferry__kernel_check(ex, kernel);
  if (st != FERRY_OK) return st;
  const int cpu = ex->queues[queue].role == FERRY_QUEUE_CPU;
  if (cpu || ex->disk_bufs) {
    const ferry_status cst = check_operands(ex, kernel, cpu);
    if (cst != FERRY_OK) return cst;
  }
  struct ferry_op op;
  op_init(&op, FERRY_OP_KERNEL);
  op.u.kernel = *kernel;
  if (!op.u.kernel.name) op.u.kernel.name = ferry_kernel_kind_name(kernel->kind);
  return submit(ex, queue, &op);
}

ferry_status ferry_exec_event_create(ferry_exec *ex, ferry_event **out) {
  ferry_event *ev = ferry__calloc(1, sizeof *ev);
  if (!ev) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "event_create: out of memory");
  if (ex->backend->event_init) {
    ferry_status st = ex->backend->event_init(ex, ev);
    if (st != FERRY_OK) {
      ferry_free(ev);
      return st;
    }
  }
  *out = ev;
  return FERRY_OK;
}

void ferry_exec_event_destroy(ferry_exec *ex, ferry_event *ev) {
  if (!ev) return;
  if (ex->backend->event_fini) ex->backend->event_fini(ex, ev);
  ferry_free(ev);
}

ferry_status ferry_exec_record(ferry_exec *ex, int32_t queue, ferry_event *ev) {
  if (!valid_queue(ex, queue) || !ev) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "record: invalid argument");
  struct ferry_op op;
  op_init(&op, FERRY_OP_RECORD);
  op.u.event.ev = ev;
  op.u.event.gen = ferry__event_record_gen(ev);
  return submit(ex, queue, &op);
}

ferry_status ferry_exec_queue_wait(ferry_exec *ex, int32_t queue, ferry_event *ev) {
  if (!valid_queue(ex, queue) || !ev) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "queue_wait: invalid argument");
  uint64_t gen = ferry__event_wait_gen(ev);
  if (!gen) { /* nothing to wait for; a graph replaying this wait decides again when launched */
    if (ex->capturing) ex->backend->graph_skipped_wait(ex, queue, ev);
    return FERRY_OK;
  }
  struct ferry_op op;
  op_init(&op, FERRY_OP_WAIT);
  op.u.event.ev = ev;
  op.u.event.gen = gen;
  return submit(ex, queue, &op);
}

static ferry_status async_error(ferry_exec *ex) {
  int e = atomic_load(&ex->first_error);
  if (!e) return FERRY_OK;
  pthread_mutex_lock(&ex->error_lock);
  ferry_status st = ferry__err_set(&ex->err, (ferry_status)e, "%s", ex->first_error_msg);
  pthread_mutex_unlock(&ex->error_lock);
  return st;
}

ferry_status ferry_exec_sync(ferry_exec *ex, ferry_event *ev) {
  if (!ev) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "sync: no event");
  uint64_t gen = atomic_load(&ev->recorded_gen);
  if (gen && atomic_load(&ev->done_gen) < gen) {
    /* the host blocked: a range on the timeline, so calibration can tell the host's own work
     * from its waiting (ferry calibrate --db fits runtime.layer_ns from it) */
    const int64_t t0 = ex->sink ? ex->backend->now(ex) : 0;
    ferry_status st = ex->backend->sync(ex, ev, gen);
    if (st != FERRY_OK) return st;
    if (ex->sink) emit_range(ex, "host wait", t0, ex->backend->now(ex), -1, -1, -1);
  }
  return async_error(ex);
}

int ferry_exec_query(ferry_exec *ex, ferry_event *ev) {
  (void)ex;
  return atomic_load(&ev->done_gen) >= atomic_load(&ev->recorded_gen);
}

ferry_status ferry_exec_drain(ferry_exec *ex) {
  ferry_status st = ex->backend->drain(ex);
  if (st != FERRY_OK) return st;
  return async_error(ex);
}

int64_t ferry_exec_now(ferry_exec *ex) { return ex->backend->now(ex); }
void ferry_exec_sleep_until(ferry_exec *ex, int64_t t_ns) { ex->backend->sleep_until(ex, t_ns); }

int64_t ferry_exec_queue_stall_ns(const ferry_exec *ex, int32_t queue) {
  return valid_queue(ex, queue) ? atomic_load(&ex->queues[queue].stall_ns) : 0;
}

int64_t ferry_exec_queue_busy_ns(const ferry_exec *ex, int32_t queue) {
  return valid_queue(ex, queue) ? atomic_load(&ex->queues[queue].busy_ns) : 0;
}

struct ferry_fault ferry__exec_fault(const struct ferry_op *op) {
  struct ferry_fault none = {FERRY_FAULT_NONE, 0, 0};
  if (op->kind == FERRY_OP_COPY) return ferry_fault_draw(FERRY_FAULT_COPY);
  if (op->kind == FERRY_OP_KERNEL) return ferry_fault_draw(FERRY_FAULT_KERNEL);
  return none;
}

void ferry__exec_fault_fail(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op, uint64_t attempt) {
  char msg[FERRY_ERRMSG_MAX];
  const int kernel = op->kind == FERRY_OP_KERNEL;
  snprintf(msg, sizeof msg, "%s executor: device failed (injected fault %s:fail at attempt %llu) in %s '%s' on queue %d",
           ex->backend->name, kernel ? "kernel" : "copy", (unsigned long long)attempt, kernel ? "kernel" : "copy",
           kernel ? op->u.kernel.name : "h2d/d2h", queue);
  ferry__exec_op_failed(ex, FERRY_ERR_DEVICE, msg);
}

void ferry__exec_op_failed(struct ferry_exec *ex, ferry_status status, const char *msg) {
  pthread_mutex_lock(&ex->error_lock);
  if (!atomic_load(&ex->first_error)) {
    snprintf(ex->first_error_msg, sizeof ex->first_error_msg, "%s", msg);
    atomic_store(&ex->first_error, (int)status);
  }
  pthread_mutex_unlock(&ex->error_lock);
}

void ferry__exec_op_done(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op, int64_t start_ns,
                         int64_t end_ns) {
  if (op->kind != FERRY_OP_WAIT && op->kind != FERRY_OP_RECORD)
    atomic_fetch_add(&ex->queues[queue].busy_ns, end_ns - start_ns);
  ferry_activity_fn sink = ex->sink;
  if (!sink) return;
  struct ferry_activity a = {.queue = queue, .start_ns = start_ns, .end_ns = end_ns,
                             .correlation_id = op->correlation_id, .step = -1, .layer = -1, .expert = -1};
  switch (op->kind) {
    case FERRY_OP_READ:
      a.kind = FERRY_ACT_MEMCPY;
      a.name = "disk_read";
      a.step = op->step;
      a.layer = op->layer;
      a.expert = op->expert;
      a.bytes = op->u.read.len;
      a.copy_kind = FERRY_COPY_DISK_TO_HOST;
      break;
    case FERRY_OP_COPY:
      a.kind = FERRY_ACT_MEMCPY;
      a.name = op->u.copy.peers                                   ? "all-gather"
               : op->u.copy.copy_kind == FERRY_COPY_HTOD         ? "h2d"
               : op->u.copy.copy_kind == FERRY_COPY_DTOH         ? "d2h"
               : op->u.copy.copy_kind == FERRY_COPY_DISK_TO_HOST ? "disk_read"
               : op->u.copy.copy_kind == FERRY_COPY_HOST_TO_DISK ? "disk_write"
                                                                 : "copy";
      a.bytes = op->u.copy.bytes;
      a.copy_kind = op->u.copy.copy_kind;
      a.step = op->step;
      a.layer = op->layer;
      a.expert = op->expert;
      break;
    case FERRY_OP_KERNEL:
      a.kind = FERRY_ACT_KERNEL;
      a.name = op->u.kernel.name;
      a.kind_name = ferry_kernel_kind_name(op->u.kernel.kind);
      ferry_kernel_cost(&op->u.kernel, &a.flops, &a.bytes);
      a.layer = op->u.kernel.layer;
      a.expert = op->u.kernel.expert;
      break;
    case FERRY_OP_WAIT:
      if (end_ns <= start_ns) return; /* only waits that blocked are interesting */
      a.kind = FERRY_ACT_SYNC;
      a.name = "queue_wait";
      break;
    case FERRY_OP_RECORD:
      return;
  }
  sink(ex->sink_user, &a);
}

static void emit_range(ferry_exec *ex, const char *name, int64_t start_ns, int64_t end_ns, int32_t step,
                       int32_t layer, int32_t expert) {
  ferry_activity_fn sink = ex->sink;
  if (!sink) return;
  struct ferry_activity a = {.kind = FERRY_ACT_RANGE, .name = name, .queue = -1, .start_ns = start_ns,
                             .end_ns = end_ns, .step = step, .layer = layer, .expert = expert};
  sink(ex->sink_user, &a);
}

void ferry_exec_emit_range(ferry_exec *ex, const char *name, int64_t start_ns, int64_t end_ns, int32_t step,
                           int32_t layer) {
  emit_range(ex, name, start_ns, end_ns, step, layer, -1);
}

struct ferry_exec_range ferry_exec_range_begin(ferry_exec *ex, const char *name, int32_t step, int32_t layer,
                                               int32_t expert) {
  struct ferry_exec_range r = {.name = name, .start_ns = ex->backend->now(ex), .step = step, .layer = layer,
                               .expert = expert, .outer_step = ex->range_step, .outer_layer = ex->range_layer,
                               .outer_expert = ex->range_expert};
  if (!ex->backend->virtual_clock) r.nvtx_id = ferry__nvtx_start(name, step, layer, expert);
  ex->range_step = step;
  ex->range_layer = layer;
  ex->range_expert = expert;
  if (ex->backend->range_begin) ex->backend->range_begin(ex, name);
  return r;
}

void ferry_exec_range_end(ferry_exec *ex, struct ferry_exec_range *range) {
  if (!range->name) return;
  if (range->nvtx_id) ferry__nvtx_end(range->nvtx_id);
  ex->range_step = range->outer_step;
  ex->range_layer = range->outer_layer;
  ex->range_expert = range->outer_expert;
  emit_range(ex, range->name, range->start_ns, ex->backend->now(ex), range->step, range->layer, range->expert);
  range->name = NULL;
  range->nvtx_id = 0;
}

void ferry_exec_sample_memory(ferry_exec *ex) {
  int64_t now = ex->backend->now(ex);
  pthread_mutex_lock(&ex->lock);
  for (int t = 0; t < FERRY_TIER_COUNT; t++) ferry__exec_emit_memory(ex, (enum ferry_tier)t, now);
  pthread_mutex_unlock(&ex->lock);
}
