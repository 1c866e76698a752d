/* The `host` executor: every queue is a worker thread draining a fixed ring of ops; the
 * device tier is a budgeted arena in RAM standing in for GPU memory; reads are real disk reads
 * (pread / O_DIRECT), copies are memcpy, large ones with streaming stores as a DMA engine's
 * (host_copy.c; or pread/pwrite of a disk-tier buffer's file, disk_file.c), kernels are real
 * math (host_kernels.c). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/units.h"
#include "disk_file.h"
#include "exec_impl.h"
#include "ferry/store.h"
#include "host_copy.h"
#include "host_kernels.h"

#define RING_CAPACITY 4096
#define LARGE_BUFFER (1u << 20)

struct host_queue {
  struct ferry_exec *ex;
  int32_t index;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_space, cv_idle;
  struct ferry_op *ring;
  uint32_t head, count;
  int running_op; /* an op is executing */
  int stop;
  struct ferry_host_scratch scratch;
};

struct host_state {
  struct host_queue *queues[FERRY_EXEC_MAX_QUEUES];
  pthread_mutex_t ev_mu; /* event completion */
  pthread_cond_t ev_cv;
  int64_t t0;
  int warned_mlock;
  struct ferry__disk_dir disk; /* the files of disk-tier buffers */
};

static struct host_state *state(struct ferry_exec *ex) { return ex->backend_state; }

static int64_t host_now(struct ferry_exec *ex) { return ferry__mono_ns() - state(ex)->t0; }

static void host_sleep_until(struct ferry_exec *ex, int64_t t_ns) {
  int64_t abs_ns = state(ex)->t0 + t_ns;
  struct timespec ts = {.tv_sec = abs_ns / 1000000000LL, .tv_nsec = abs_ns % 1000000000LL};
  while (ferry__mono_ns() < abs_ns && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

static void complete_record(struct ferry_exec *ex, ferry_event *ev, uint64_t gen) {
  struct host_state *hs = state(ex);
  pthread_mutex_lock(&hs->ev_mu);
  if (atomic_load(&ev->done_gen) < gen) {
    atomic_store(&ev->done_gen, gen);
    ev->done_time_ns = host_now(ex);
  }
  pthread_cond_broadcast(&hs->ev_cv);
  pthread_mutex_unlock(&hs->ev_mu);
}

static void wait_event(struct ferry_exec *ex, ferry_event *ev, uint64_t gen) {
  struct host_state *hs = state(ex);
  pthread_mutex_lock(&hs->ev_mu);
  while (atomic_load(&ev->done_gen) < gen) pthread_cond_wait(&hs->ev_cv, &hs->ev_mu);
  pthread_mutex_unlock(&hs->ev_mu);
}

static void run_op(struct host_queue *q, const struct ferry_op *op) {
  struct ferry_exec *ex = q->ex;
  int64_t start = host_now(ex);
  char msg[FERRY_ERRMSG_MAX];
  /* after a failure the run is over: work queued behind it is skipped (its events still
   * complete, so nothing waits forever), and the first error is what the next sync reports */
  if (atomic_load(&ex->first_error) && (op->kind == FERRY_OP_READ || op->kind == FERRY_OP_COPY || op->kind == FERRY_OP_KERNEL)) {
    ferry__exec_op_done(ex, q->index, op, start, start);
    return;
  }
  const struct ferry_fault fault = ferry__exec_fault(op);
  if (fault.delay_ns) host_sleep_until(ex, start + fault.delay_ns);
  if (fault.kind == FERRY_FAULT_FAIL) {
    ferry__exec_fault_fail(ex, q->index, op, fault.attempt);
    ferry__exec_op_done(ex, q->index, op, start, host_now(ex));
    return;
  }
  switch (op->kind) {
    case FERRY_OP_READ: {
      const struct ferry_ref *d = &op->u.read.dst;
      uint64_t shift = 0;
      const uint64_t at = ferry__ref_at(*d);
      ferry_status st = ferry_store_read_range(op->u.read.store, op->u.read.file, op->u.read.offset, op->u.read.len,
                                               (char *)d->buf->ptr + at, d->buf->bytes - at, op->u.read.flags, &shift);
      if (st != FERRY_OK) ferry__exec_op_failed(ex, st, ferry_store_errmsg(op->u.read.store));
      break;
    }
    case FERRY_OP_COPY:
      if (op->u.copy.copy_kind == FERRY_COPY_DISK_TO_HOST || op->u.copy.copy_kind == FERRY_COPY_HOST_TO_DISK)
        ferry__disk_file_copy(ex, op);
      else
        ferry__host_copy((char *)op->u.copy.dst.buf->ptr + ferry__ref_at(op->u.copy.dst),
                         (const char *)op->u.copy.src.buf->ptr + ferry__ref_at(op->u.copy.src), op->u.copy.bytes);
      break;
    case FERRY_OP_KERNEL: {
      ferry_status st = ferry__host_kernel_run(&op->u.kernel, &q->scratch, msg, sizeof msg);
      if (st != FERRY_OK) ferry__exec_op_failed(ex, st, msg);
      break;
    }
    case FERRY_OP_RECORD:
      complete_record(ex, op->u.event.ev, op->u.event.gen);
      break;
    case FERRY_OP_WAIT:
      wait_event(ex, op->u.event.ev, op->u.event.gen);
      break;
  }
  int64_t end = host_now(ex);
  if (op->kind == FERRY_OP_WAIT) atomic_fetch_add(&ex->queues[q->index].stall_ns, end - start);
  ferry__exec_op_done(ex, q->index, op, start, end);
}

static void *queue_main(void *arg) {
  struct host_queue *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (!q->count && !q->stop) pthread_cond_wait(&q->cv_work, &q->mu);
    if (!q->count && q->stop) {
      pthread_mutex_unlock(&q->mu);
      break;
    }
    struct ferry_op op = q->ring[q->head];
    q->running_op = 1;
    pthread_mutex_unlock(&q->mu);

    run_op(q, &op);

    pthread_mutex_lock(&q->mu);
    q->head = (q->head + 1) % RING_CAPACITY;
    q->count--;
    q->running_op = 0;
    pthread_cond_signal(&q->cv_space);
    if (!q->count) pthread_cond_broadcast(&q->cv_idle);
    pthread_mutex_unlock(&q->mu);
  }
  return NULL;
}

static ferry_status host_queue_init(struct ferry_exec *ex, int32_t index) {
  struct host_queue *q = ferry__calloc(1, sizeof *q);
  if (!q) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "host executor: out of memory for a queue");
  q->ring = ferry__calloc(RING_CAPACITY, sizeof *q->ring);
  if (!q->ring) {
    ferry_free(q);
    return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "host executor: out of memory for a queue ring");
  }
  q->ex = ex;
  q->index = index;
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv_work, NULL);
  pthread_cond_init(&q->cv_space, NULL);
  pthread_cond_init(&q->cv_idle, NULL);
  if (pthread_create(&q->thread, NULL, queue_main, q) != 0) {
    ferry_free(q->ring);
    ferry_free(q);
    return ferry__err_set(&ex->err, FERRY_ERR_INTERNAL, "host executor: cannot start a queue thread");
  }
  state(ex)->queues[index] = q;
  return FERRY_OK;
}

static ferry_status host_submit(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op) {
  struct host_queue *q = state(ex)->queues[queue];
  pthread_mutex_lock(&q->mu);
  while (q->count == RING_CAPACITY) pthread_cond_wait(&q->cv_space, &q->mu); /* back-pressure */
  q->ring[(q->head + q->count) % RING_CAPACITY] = *op;
  q->count++;
  pthread_cond_signal(&q->cv_work);
  pthread_mutex_unlock(&q->mu);
  return FERRY_OK;
}

static ferry_status host_sync(struct ferry_exec *ex, ferry_event *ev, uint64_t gen) {
  wait_event(ex, ev, gen);
  return FERRY_OK;
}

static ferry_status host_drain(struct ferry_exec *ex) {
  for (int32_t i = 0; i < ex->n_queues; i++) {
    struct host_queue *q = state(ex)->queues[i];
    pthread_mutex_lock(&q->mu);
    while (q->count) pthread_cond_wait(&q->cv_idle, &q->mu);
    pthread_mutex_unlock(&q->mu);
  }
  return FERRY_OK;
}

static ferry_status host_buf_alloc(struct ferry_exec *ex, ferry_buf *buf) {
  if (buf->tier == FERRY_TIER_DISK) return ferry__disk_file_open(ex, &state(ex)->disk, buf);
  /* 4 KiB alignment: O_DIRECT reads may land in any host buffer. Large buffers are mappings of
   * their own, so what the engine frees (memory pressure, a reload) leaves the process. */
  buf->ptr = buf->bytes >= LARGE_BUFFER ? ferry__pages_alloc(buf->bytes)
                                        : ferry__aligned_alloc(FERRY_DIRECT_ALIGN, buf->bytes ? buf->bytes : 1);
  if (!buf->ptr)
    return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "host executor: cannot allocate %llu bytes for %s",
                          (unsigned long long)buf->bytes, buf->label);
  if (buf->tier == FERRY_TIER_HOST && buf->pinned && buf->bytes) {
    if (mlock(buf->ptr, buf->bytes) != 0) {
      if (!state(ex)->warned_mlock) {
        FERRY_WARN("host executor: cannot lock %llu bytes of host memory (%s); continuing unlocked",
                   (unsigned long long)buf->bytes, strerror(errno));
        state(ex)->warned_mlock = 1;
      }
    } else {
      buf->backend_ptr = buf->ptr; /* marks it locked */
    }
  }
  return FERRY_OK;
}

static void host_buf_free(struct ferry_exec *ex, ferry_buf *buf) {
  (void)ex;
  if (buf->tier == FERRY_TIER_DISK) {
    ferry__disk_file_close(buf);
    return;
  }
  if (buf->backend_ptr) munlock(buf->ptr, buf->bytes);
  if (buf->bytes >= LARGE_BUFFER) ferry__pages_free(buf->ptr, buf->bytes);
  else ferry_free(buf->ptr);
}

static void host_destroy(struct ferry_exec *ex) {
  struct host_state *hs = state(ex);
  if (hs) {
    for (int32_t i = 0; i < FERRY_EXEC_MAX_QUEUES; i++) {
      struct host_queue *q = hs->queues[i];
      if (!q) continue;
      pthread_mutex_lock(&q->mu);
      q->stop = 1;
      pthread_cond_signal(&q->cv_work);
      pthread_mutex_unlock(&q->mu);
      pthread_join(q->thread, NULL);
      pthread_mutex_destroy(&q->mu);
      pthread_cond_destroy(&q->cv_work);
      pthread_cond_destroy(&q->cv_space);
      pthread_cond_destroy(&q->cv_idle);
      ferry__host_scratch_free(&q->scratch);
      ferry_free(q->ring);
      ferry_free(q);
    }
    pthread_mutex_destroy(&hs->ev_mu);
    pthread_cond_destroy(&hs->ev_cv);
    ferry__disk_dir_fini(&hs->disk);
    ferry_free(hs);
  }
  ferry__exec_fini(ex);
  ferry_free(ex);
}

static const struct ferry_exec_backend host_backend = {
    .version = FERRY_EXEC_BACKEND_VERSION,
    .name = "host",
    .has_data = 1,
    .destroy = host_destroy,
    .queue_init = host_queue_init,
    .buf_alloc = host_buf_alloc,
    .buf_free = host_buf_free,
    .submit = host_submit,
    .sync = host_sync,
    .drain = host_drain,
    .now = host_now,
    .sleep_until = host_sleep_until,
};

static ferry_status host_open(ferry_exec **out, const struct ferry_exec_params *p) {
  return ferry_exec_create_host(out, p ? &p->config : NULL);
}

/* The registry's entry (runtime/backends/registry.c lists it). */
const struct ferry_exec_info ferry__exec_info_host = {
    .version = FERRY_EXEC_INFO_VERSION,
    .name = "host",
    .description = "real work on the CPU (OpenBLAS; RAM stands in for the GPU)",
    .caps = FERRY_EXEC_CAP_DATA,
    .open = host_open,
};

ferry_status ferry_exec_create_host(ferry_exec **out, const struct ferry_exec_config *config) {
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "exec_create_host: out is NULL");
  struct ferry_exec *ex = ferry__calloc(1, sizeof *ex);
  struct host_state *hs = ferry__calloc(1, sizeof *hs);
  if (!ex || !hs) {
    ferry_free(ex);
    ferry_free(hs);
    return ferry__fail(FERRY_ERR_NOMEM, "host executor: out of memory");
  }
  ferry__exec_init(ex, &host_backend, config);
  if (ferry__disk_dir_init(&hs->disk, config ? config->disk_dir : NULL) != FERRY_OK) {
    ferry__exec_fini(ex);
    ferry_free(ex);
    ferry_free(hs);
    return ferry__fail(FERRY_ERR_NOMEM, "host executor: out of memory");
  }
  ex->config.disk_dir = hs->disk.base; /* the copy, not the caller's string */
  pthread_mutex_init(&hs->ev_mu, NULL);
  pthread_cond_init(&hs->ev_cv, NULL);
  hs->t0 = ferry__mono_ns();
  ex->backend_state = hs;
  /* BLAS threads spin while they wait for work: left to take every core, they starve the copy
   * and disk queues' threads (measured here: 2-3x slower, erratic steps). By default leave two
   * cores to those queues. */
  int threads = config && config->compute_threads > 0 ? config->compute_threads : 0;
  if (!threads) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores > 3 ? (int)cores - 2 : 1;
  }
  openblas_set_num_threads(threads);
  *out = ex;
  return FERRY_OK;
}
