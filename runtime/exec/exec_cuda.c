/* The `cuda` executor: device tier in cudaMalloc memory, host tier pinned (cudaHostAlloc; pageable
 * malloc memory when the configuration does not lock host memory),
 * COMPUTE/H2D/D2H queues as CUDA streams fed by an issuer thread each, the DISK queue as a CPU
 * worker reading into pinned memory; cuBLAS for matrix products, exec_cuda_kernels.cu for the
 * rest. Built into ferry's CUDA module (ferry_cuda.so), which ferry loads when the executor is
 * asked for (exec_cuda_load.c); without a driver or device, creation fails cleanly.
 *
 * Why threads around the streams: the engine makes GPU queues wait for events raised by the CPU
 * disk queue. A stream cannot wait for the CPU without blocking something, so each GPU queue
 * has an issuer thread that makes its CUDA calls in order and blocks (itself, not the engine,
 * not the stream's earlier work) until such an event is raised. GPU-to-GPU waits stay on the
 * device (cudaStreamWaitEvent). A completer thread per GPU queue waits for each op's end event,
 * converts its start/end to the executor clock, emits the activity and raises event
 * generations; host functions (cudaLaunchHostFunc) were avoided because each one stalls its
 * stream for a CPU round trip, which would leave gaps between back-to-back copies. */
#include "common/error.h"
#include "ferry/exec.h"

#include <stdio.h>

#ifdef FERRY_HAVE_CUDA
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/units.h"
#include "arena.h"
#include "exec_cuda.h"
#include "common/io.h"
#include "exec_cuda_api.h"
#include "exec_impl.h"
#include "host_kernels.h"
#include "nvtx.h"
#include "ferry/quant.h"
#include "ferry/store.h"
#include "runtime/quant/quant_impl.h"

/* Ops between submit and completion per queue (back-pressure beyond). One entry is kept
 * spare so the previous op's end event survives while the next completes (timing chain). */
#define OP_RING 512
/* Generations of one event that may be recorded on GPU queues and not yet completed. */
#define EV_RING 16
/* Immediate ints (token ids, positions, routing lists) staged per compute queue: pinned
 * staging and a device copy, reused segment by segment once the ops using a segment are done. */
#define INT_SEGMENTS 8
#define INT_SEGMENT_BYTES (512u << 10)
/* Activations converted to fp16/bf16 for a GEMM with fp16/bf16 weights, in row chunks. */
#define CONVERT_BYTES (16u << 20)
/* cuBLAS workspace (NVIDIA recommends 32 MiB on Hopper); set once so GEMMs never allocate. */
#define BLAS_WORKSPACE_BYTES (32u << 20)

struct cu_pending {
  struct ferry_op op;
  uint64_t ints_off;   /* byte offset of the staged ints (ints2 follow m ints later) */
  uint64_t ints_bytes; /* 0 when the kernel has none */
  int end_recorded;    /* the op's end event was recorded (set by the issuer) */
};

struct cu_queue {
  struct ferry_exec *ex;
  int32_t index;
  int gpu; /* a CUDA stream (COMPUTE, H2D, D2H), or a CPU worker (DISK, CPU) */
  int compute;
  int cpu_compute;                      /* a CPU queue: host kernels over pinned host buffers */
  struct ferry_host_scratch scratch;    /* its kernels' scratch */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on any change of the counters */
  /* held across a whole submit: its waits (back-pressure, ints staging) release mu, and a
   * second submitter must not take the same ring entry meanwhile */
  pthread_mutex_t submit_mu;
  struct cu_pending *ring;
  uint64_t submitted, issued, completed; /* op sequence numbers; ring index = seq % OP_RING */
  int stop;
  pthread_t issuer, completer;
  int have_issuer, have_completer;
  /* GPU queues */
  cudaStream_t stream;
  cudaEvent_t ev_start[OP_RING], ev_end[OP_RING];
  cudaEvent_t anchor;   /* recorded and waited for at creation: a known point on the clock */
  cudaEvent_t prev_end; /* end event of the last completed op, and its time */
  int64_t prev_end_ns;
  /* COMPUTE queues */
  cublasHandle_t blas;
  void *blas_ws;
  char *ints_host, *ints_dev;
  const char *ints_mapped; /* device address of ints_host (zero-copy), or NULL: copy to ints_dev */
  int int_seg;
  uint64_t int_fill;
  uint64_t int_seg_last[INT_SEGMENTS]; /* 1 + sequence number of the last op using a segment */
  void *convert;
};

struct cu_event_slot {
  uint64_t gen; /* generation reserved in this slot (recorded on a GPU queue) */
  int issued;   /* cudaEventRecord has been called for it */
  cudaEvent_t ev;
};

struct cu_event {
  struct cu_event_slot slot[EV_RING];
};

struct cu_state {
  struct cu_queue *queues[FERRY_EXEC_MAX_QUEUES];
  pthread_mutex_t ev_mu; /* event slots and done_gen raises */
  pthread_cond_t ev_cv;
  int64_t t0;
  int device;
  uint64_t internal_pinned_bytes, internal_device_bytes;
  /* With a device budget, the device tier is one cudaMalloc made at create (the budget plus
   * alignment slack), sliced by the arena: buffers never call the driver afterwards. */
  void *arena_base;
  struct ferry__arena *arena;
  pthread_mutex_t arena_mu;
};

/* Alignment of device buffers carved from the arena (cudaMalloc gives 256), and the slack
 * reserved beyond the budget for it: the most padding the arena's live blocks can take, so
 * padding never refuses a buffer the budget admits. */
#define ARENA_ALIGN 256u
#define ARENA_SLACK ((uint64_t)ARENA_ALIGN * FERRY__ARENA_MAX_RANGES) /* padding of every live block */

static struct cu_state *state(struct ferry_exec *ex) { return ex->backend_state; }

static int64_t cu_now(struct ferry_exec *ex) { return ferry__mono_ns() - state(ex)->t0; }

static void cu_sleep_until(struct ferry_exec *ex, int64_t t_ns) {
  int64_t abs_ns = state(ex)->t0 + t_ns;
  struct timespec ts = {.tv_sec = abs_ns / 1000000000LL, .tv_nsec = abs_ns % 1000000000LL};
  while (ferry__mono_ns() < abs_ns && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

/* --- errors ---------------------------------------------------------------------------------- */

static ferry_status cuda_status(cudaError_t e) {
  if (e == cudaErrorMemoryAllocation) return FERRY_ERR_NOMEM;
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return FERRY_ERR_NO_DEVICE;
  return FERRY_ERR_CUDA;
}

static ferry_status cuda_fail(struct ferry_exec *ex, cudaError_t e, const char *what) {
  return ferry__err_set(&ex->err, cuda_status(e), "cuda executor: %s: %s (%s)", what, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

static ferry_status blas_fail(struct ferry_exec *ex, cublasStatus_t s, const char *what) {
  return ferry__err_set(&ex->err, s == CUBLAS_STATUS_ALLOC_FAILED ? FERRY_ERR_NOMEM : FERRY_ERR_CUDA,
                        "cuda executor: %s: %s (cuBLAS status %d)", what, cublasGetStatusString(s), (int)s);
}

/* An asynchronous failure: reported by the next sync or drain (first one wins). */
static void async_fail(struct ferry_exec *ex, ferry_status st, const char *fmt, ...) FERRY_PRINTF(3, 4);
static void async_fail(struct ferry_exec *ex, ferry_status st, const char *fmt, ...) {
  char msg[FERRY_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ferry__exec_op_failed(ex, st, msg);
}

/* --- pointers and dtypes --------------------------------------------------------------------- */

/* Device-usable address of a reference: device memory, or pinned host memory through unified
 * addressing (cudaHostAlloc memory has the same address on both sides). */
static void *dptr(struct ferry_ref r) { return r.buf ? (char *)r.buf->backend_ptr + ferry__ref_at(r) : NULL; }

static int cudt(enum ferry_dtype dt) {
  return dt == FERRY_DTYPE_F16 ? FERRY_CU_F16 : dt == FERRY_DTYPE_BF16 ? FERRY_CU_BF16 : FERRY_CU_F32;
}

/* Bytes per element as the kernels load it (anything not fp16/bf16 reads as fp32). */
static uint64_t esize(enum ferry_dtype dt) { return dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16 ? 2 : 4; }

static int gemm_dtype(enum ferry_dtype dt) {
  return dt == FERRY_DTYPE_F32 || dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16;
}

/* --- events ---------------------------------------------------------------------------------- */

static void raise_done(struct ferry_exec *ex, ferry_event *ev, uint64_t gen, int64_t t_ns) {
  struct cu_state *cs = state(ex);
  pthread_mutex_lock(&cs->ev_mu);
  if (atomic_load(&ev->done_gen) < gen) {
    atomic_store(&ev->done_gen, gen);
    ev->done_time_ns = t_ns;
  }
  pthread_cond_broadcast(&cs->ev_cv);
  pthread_mutex_unlock(&cs->ev_mu);
}

static void wait_done(struct ferry_exec *ex, ferry_event *ev, uint64_t gen) {
  struct cu_state *cs = state(ex);
  pthread_mutex_lock(&cs->ev_mu);
  while (atomic_load(&ev->done_gen) < gen) pthread_cond_wait(&cs->ev_cv, &cs->ev_mu);
  pthread_mutex_unlock(&cs->ev_mu);
}

/* Reserve the slot of generation `gen` for a record on a GPU queue (submit time), once the
 * generation it held before has completed, so a waiter always finds its own generation. */
static void reserve_slot(struct ferry_exec *ex, ferry_event *ev, uint64_t gen) {
  struct cu_state *cs = state(ex);
  struct cu_event *ce = ev->backend;
  struct cu_event_slot *s = &ce->slot[gen % EV_RING];
  pthread_mutex_lock(&cs->ev_mu);
  while (s->gen && atomic_load(&ev->done_gen) < s->gen) pthread_cond_wait(&cs->ev_cv, &cs->ev_mu);
  s->gen = gen;
  s->issued = 0;
  pthread_mutex_unlock(&cs->ev_mu);
}

static ferry_status cu_event_init(struct ferry_exec *ex, ferry_event *ev) {
  ev->backend = ferry__calloc(1, sizeof(struct cu_event));
  if (!ev->backend) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "cuda executor: out of memory for an event");
  return FERRY_OK;
}

static ferry_status cu_drain(struct ferry_exec *ex);

static void cu_event_fini(struct ferry_exec *ex, ferry_event *ev) {
  struct cu_event *ce = ev->backend;
  if (!ce) return;
  /* Queued records and waits point at this event: let them finish first. */
  cu_drain(ex);
  for (int i = 0; i < EV_RING; i++)
    if (ce->slot[i].ev) cudaEventDestroy(ce->slot[i].ev);
  ferry_free(ce);
  ev->backend = NULL;
}

/* --- kernels --------------------------------------------------------------------------------- */

static int kernel_uses_ints(const struct ferry_kernel *k) { return ferry__kernel_uses_ints(k); }
static int kernel_uses_ints2(const struct ferry_kernel *k) { return ferry__kernel_uses_ints2(k); }

static ferry_status bad_kernel(struct ferry_exec *ex, const struct ferry_kernel *k, ferry_status st, const char *why) {
  return ferry__err_set(&ex->err, st, "cuda executor: kernel %s (%s): %s", k->name, ferry_kernel_kind_name(k->kind),
                        why);
}

/* Features of the 2024-26 families the cuda kernels do not compute yet: a clear refusal
 * rather than a silently different result. NULL when the kernel asks for none of them. */
static const char *unsupported_feature(const struct ferry_kernel *k) {
  switch (k->kind) {
    case FERRY_K_EMBED: return k->scale != 0 && k->scale != 1 ? "scaled embeddings (Gemma)" : NULL;
    case FERRY_K_NORM:
      if (k->norm_kind > FERRY_NORMFN_LAYER) return "offset or weightless RMSNorm (Gemma, Llama 4)";
      return k->accumulate || (k->ld && k->ld != k->n) ? "accumulating or strided norms" : NULL;
    case FERRY_K_ROPE:
      return k->rope || k->rot_offset || (k->rot_dim && k->rot_dim != k->head_dim)
                 ? "scaled, partial, offset or interleaved RoPE"
                 : NULL;
    case FERRY_K_KV_APPEND: /* the append half of the attention kernel, with its limits */
    case FERRY_K_ATTENTION:
      if (k->kv_format && ferry_kv_format_group((enum ferry_kv_format)k->kv_format) > 0)
        return "quantized KV caches (fp8, int8, int4 with group scales)";
      if (k->kv_blocks) return "a paged KV cache (block tables)";
      if (k->kind == FERRY_K_KV_APPEND) return k->kv_ring ? "a ring cache" : NULL;
      return k->scale != 0 || k->softcap != 0 || k->attn_chunk || k->kv_ring || k->alibi || k->temp_floor != 0 ||
                     k->aux[4].buf
                 ? "attention with a set scale, soft-capping, chunks, a ring cache, ALiBi, temperature or sinks"
                 : NULL;
    case FERRY_K_MLA_ATTENTION:
      if (k->kv_blocks) return "a paged KV cache (block tables)";
      return k->kv_format && ferry_kv_format_group((enum ferry_kv_format)k->kv_format) > 0
                 ? "quantized KV caches (fp8, int8, int4 with group scales)"
                 : NULL;
    case FERRY_K_SWIGLU: return k->fn > FERRY_FN_RELU ? "GELU-tanh, GeGLU and soft-capping activations" : NULL;
    case FERRY_K_ROUTER:
      return k->router_kind != FERRY_ROUTER_SOFTMAX_TOPK || (k->routed_scale != 0 && k->routed_scale != 1)
                 ? "routers other than softmax top-k"
                 : NULL;
    case FERRY_K_EXPERT:
      return k->expert_layout != FERRY_EXPERTS_SPLIT || k->w_trans || k->swiglu_limit != 0 || k->scale_input
                 ? "fused, transposed, clamped or input-scaled experts"
                 : NULL;
    case FERRY_K_DEQUANTIZE:
      return k->qformat >= FERRY_QFORMAT_GPTQ4 ? "formats of published checkpoints (GPTQ, AWQ, compressed-tensors, "
                                                 "MXFP4, fp8 blocks)"
                                               : NULL;
    default: return NULL;
  }
}

/* What the cuda kernels cannot do beyond the contract every executor shares (kernel_check.c,
 * already checked by ferry_exec_compute): the newer families' features, 32-bit dimensions, the
 * immediate ints one kernel stages, the activation conversion buffer, head dimensions and
 * expert counts of the kernels. */
static ferry_status validate_kernel(struct ferry_exec *ex, const struct ferry_kernel *k) {
  const char *feature = unsupported_feature(k);
  if (feature) return bad_kernel(ex, k, FERRY_ERR_UNSUPPORTED, feature);
  if (k->kind == FERRY_K_SPLIT_QKV || k->kind == FERRY_K_MLA_ATTENTION || k->kind == FERRY_K_ALLREDUCE)
    return bad_kernel(ex, k, FERRY_ERR_UNSUPPORTED, "not implemented by the cuda executor");
  const int64_t m = k->m, n = k->n, kk = k->k;
  if ((k->kind != FERRY_K_DEQUANTIZE && m > INT32_MAX) || n > INT32_MAX || kk > INT32_MAX)
    return bad_kernel(ex, k, FERRY_ERR_RANGE, "a dimension exceeds 2^31-1");
  if (kernel_uses_ints(k) && m > 0 && (uint64_t)m * 4u * (kernel_uses_ints2(k) ? 2u : 1u) > INT_SEGMENT_BYTES - 256)
    return bad_kernel(ex, k, FERRY_ERR_RANGE, "more immediate ints than the executor stages per kernel");
  /* non-fp32 weights multiply fp32 activations converted into a fixed buffer */
  const struct {
    struct ferry_ref w;
    int64_t inner;
  } gemms[3] = {{k->w, kk}, {k->aux[0], kk}, {k->aux[1], n}};
  const int n_gemms = k->kind == FERRY_K_MATMUL ? 1 : k->kind == FERRY_K_EXPERT ? 3 : 0;
  for (int i = 0; i < n_gemms; i++)
    if (gemms[i].w.dtype != FERRY_DTYPE_F32 && (uint64_t)gemms[i].inner > CONVERT_BYTES / 2)
      return bad_kernel(ex, k, FERRY_ERR_UNSUPPORTED, "inner dimension larger than the activation conversion buffer");
  if (k->kind == FERRY_K_ATTENTION && (k->heads > 65535 || k->head_dim > FERRY_CU_MAX_HEAD_DIM))
    return bad_kernel(ex, k, FERRY_ERR_UNSUPPORTED, "more than 65535 heads or a head_dim above 1024");
  if (k->kind == FERRY_K_ROUTER && n > FERRY_CU_MAX_EXPERTS)
    return bad_kernel(ex, k, FERRY_ERR_UNSUPPORTED, "needs n_experts <= 12288");
  return FERRY_OK;
}

/* The kernel's view of a DEQUANTIZE op (validated). */
static void dequant_args(const struct ferry_kernel *k, struct ferry_cu_dequant *d) {
  memset(d, 0, sizeof *d);
  switch ((enum ferry_qformat)k->qformat) {
    case FERRY_QFORMAT_FP32: d->format = FERRY_CU_Q_F32; break;
    case FERRY_QFORMAT_FP16: d->format = FERRY_CU_Q_F16; break;
    case FERRY_QFORMAT_BF16: d->format = FERRY_CU_Q_BF16; break;
    case FERRY_QFORMAT_INT8: d->format = FERRY_CU_Q_INT8; break;
    case FERRY_QFORMAT_NF4: d->format = FERRY_CU_Q_NF4; break;
    default: d->format = FERRY_CU_Q_INTN; break;
  }
  d->bits = ferry__quant_bits((enum ferry_qformat)k->qformat);
  d->rows = k->n;
  d->cols = k->k;
  d->group = k->qgroup;
  d->data = dptr(k->aux[FERRY_QPART_DATA]);
  d->scales = dptr(k->aux[FERRY_QPART_SCALES]);
  d->zeros = dptr(k->aux[FERRY_QPART_ZEROS]);
  d->scales2 = dptr(k->aux[FERRY_QPART_SCALES2]);
  d->offsets2 = dptr(k->aux[FERRY_QPART_OFFSETS2]);
  /* the tables of the process that loaded the module (exec_cuda_api.h) */
  memcpy(d->nf4_levels, ferry__cuda_exec_host->nf4_levels, sizeof d->nf4_levels);
  memcpy(d->dynamic_map, ferry__cuda_exec_host->dynamic_map, sizeof d->dynamic_map);
}

/* y[m, n] (+)= x[m, k] . W[n, k]^T on the queue's stream, fp32 accumulation. cuBLAS wants A
 * and B of one type: fp32 weights run as a plain fp32 GEMM (CUBLAS_COMPUTE_32F, no TF32);
 * fp16/bf16 weights run with the activations converted to the weight's type (fp16 saturating)
 * in row chunks of the conversion buffer, fp32 output. Row-major y = x W^T is column-major
 * y^T = W^T(as stored: k x n, transposed) x^T. */
static int gemm(struct cu_queue *q, const float *x, int64_t m, int64_t kk, const void *w, enum ferry_dtype wdt,
                int64_t n, float *y, int accumulate, char *msg, size_t len) {
  if (m == 0 || n == 0) return 0;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int ld = kk > 0 ? (int)kk : 1;
  cublasStatus_t bs;
  if (wdt == FERRY_DTYPE_F32) {
    bs = cublasGemmEx(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)kk, &alpha, w, CUDA_R_32F, ld, x,
                      CUDA_R_32F, ld, &beta, y, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (bs != CUBLAS_STATUS_SUCCESS) goto out_blas;
    return 0;
  }
  const cudaDataType t = wdt == FERRY_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
  int64_t chunk = (int64_t)(CONVERT_BYTES / 2) / (kk > 0 ? kk : 1);
  if (chunk < 1) chunk = 1;
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int64_t rows = m - r0 < chunk ? m - r0 : chunk;
    cudaError_t e = ferry__cu_to_half(q->stream, x + r0 * kk, q->convert, cudt(wdt), rows * kk);
    if (e != cudaSuccess) {
      snprintf(msg, len, "activation conversion: %s", cudaGetErrorString(e));
      return -1;
    }
    bs = cublasGemmEx(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)rows, (int)kk, &alpha, w, t, ld, q->convert, t,
                      ld, &beta, y + r0 * n, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (bs != CUBLAS_STATUS_SUCCESS) goto out_blas;
  }
  return 0;
out_blas:
  snprintf(msg, len, "cublasGemmEx (m %lld, n %lld, k %lld, %s weights): %s", (long long)m, (long long)n, (long long)kk,
           ferry_dtype_name(wdt), cublasGetStatusString(bs));
  return -1;
}

/* The most cached positions a token of an ATTENTION op attends over, from the positions the
 * host staged for it (first = pos - window + 1 under a sliding window). */
static int64_t attention_rows(const struct cu_queue *q, const struct cu_pending *p) {
  const struct ferry_kernel *k = &p->op.u.kernel;
  const int32_t *pos = (const int32_t *)(const void *)(q->ints_host + p->ints_off);
  int64_t most = 0;
  for (int64_t t = 0; t < k->m; t++) {
    int64_t rows = (int64_t)pos[t] + 1;
    if (k->sliding_window > 0 && rows > k->sliding_window) rows = k->sliding_window;
    if (rows > most) most = rows;
  }
  return most;
}

/* Launch one kernel op on the compute stream; 0 or -1 with a message. */
static int run_kernel(struct cu_queue *q, const struct cu_pending *p, char *msg, size_t len) {
  const struct ferry_kernel *k = &p->op.u.kernel;
  cudaStream_t s = q->stream;
  const int32_t *ints = NULL, *ints2 = NULL;
  /* each launcher reports cudaGetLastError(): clear what an earlier call on this thread left
   * (already reported with its own op), so it is not charged to this kernel */
  cudaGetLastError();
  cudaError_t e = cudaSuccess;
  if (p->ints_bytes) {
    if (q->ints_mapped) {
      ints = (const int32_t *)(q->ints_mapped + p->ints_off);
    } else {
      e = cudaMemcpyAsync(q->ints_dev + p->ints_off, q->ints_host + p->ints_off, p->ints_bytes, cudaMemcpyHostToDevice, s);
      if (e != cudaSuccess) {
        snprintf(msg, len, "staging immediate ints: %s", cudaGetErrorString(e));
        return -1;
      }
      ints = (const int32_t *)(q->ints_dev + p->ints_off);
    }
    ints2 = ints + k->m;
  }
  float *x = dptr(k->x), *y = dptr(k->y);
  switch (k->kind) {
    case FERRY_K_EMBED:
      e = ferry__cu_embed(s, y, dptr(k->w), cudt(k->w.dtype), ints, dptr(k->aux[0]), cudt(k->aux[0].dtype), ints2,
                          k->pos_offset, k->m, k->n);
      break;
    case FERRY_K_NORM:
      e = ferry__cu_norm(s, x, y, dptr(k->w), cudt(k->w.dtype), dptr(k->b), cudt(k->b.dtype), k->m, k->n, k->eps,
                         k->norm_kind);
      break;
    case FERRY_K_MATMUL:
      if (gemm(q, x, k->m, k->k, dptr(k->w), k->w.dtype, k->n, y, k->accumulate, msg, len)) return -1;
      if (k->b.buf) e = ferry__cu_add_bias(s, y, dptr(k->b), cudt(k->b.dtype), k->m, k->n, k->n);
      break;
    case FERRY_K_ROPE:
      e = ferry__cu_rope(s, x, dptr(k->aux[0]), ints, k->m, k->heads, k->kv_heads, k->head_dim, k->theta);
      break;
    case FERRY_K_ATTENTION:
      e = ferry__cu_kv_append(s, dptr(k->aux[0]), dptr(k->aux[1]), dptr(k->aux[2]), dptr(k->aux[3]),
                              cudt(k->aux[2].dtype), ints, ints2, k->m, k->kv_heads, k->head_dim, k->kv_capacity);
      if (e == cudaSuccess) {
        /* the convert buffer is free between products (one stream): the split partials' scratch */
        e = ferry__cu_attention(s, x, y, dptr(k->aux[2]), dptr(k->aux[3]), cudt(k->aux[2].dtype), ints, ints2, k->m,
                                k->heads, k->kv_heads, k->head_dim, k->kv_capacity, k->sliding_window,
                                attention_rows(q, p), (float *)q->convert, CONVERT_BYTES);
      }
      break;
    case FERRY_K_KV_APPEND:
      e = ferry__cu_kv_append(s, dptr(k->aux[0]), dptr(k->aux[1]), dptr(k->aux[2]), dptr(k->aux[3]),
                              cudt(k->aux[2].dtype), ints, ints2, k->m, k->kv_heads, k->head_dim, k->kv_capacity);
      break;
    case FERRY_K_SWIGLU:
      if (k->fn == FERRY_FN_SILU_MUL) e = ferry__cu_silu_mul(s, x, dptr(k->aux[0]), y, k->m * k->n);
      else if (k->fn == FERRY_FN_GELU) e = ferry__cu_gelu(s, x, k->m * k->n);
      else e = ferry__cu_relu(s, x, k->m * k->n);
      break;
    case FERRY_K_ROUTER:
      e = ferry__cu_router(s, x, y, dptr(k->aux[0]), k->m, k->n, k->top_k, k->renormalize);
      break;
    case FERRY_K_EXPERT: {
      /* gather, gate and up products, silu(gate) * up, down product, scatter to token*K+rank */
      if (k->m == 0) break;
      float *xg = dptr(k->aux[2]), *g = dptr(k->aux[3]), *u = dptr(k->aux[4]);
      e = ferry__cu_gather(s, x, xg, ints, k->m, k->k);
      if (e != cudaSuccess) break;
      if (gemm(q, xg, k->m, k->k, dptr(k->w), k->w.dtype, k->n, g, 0, msg, len) ||
          gemm(q, xg, k->m, k->k, dptr(k->aux[0]), k->aux[0].dtype, k->n, u, 0, msg, len))
        return -1;
      e = ferry__cu_silu_mul(s, g, u, g, k->m * k->n);
      if (e != cudaSuccess) break;
      if (gemm(q, g, k->m, k->n, dptr(k->aux[1]), k->aux[1].dtype, k->k, xg, 0, msg, len)) return -1;
      e = ferry__cu_scatter(s, xg, y, ints, ints2, k->m, k->k, k->top_k);
      break;
    }
    case FERRY_K_MOE_COMBINE:
      e = ferry__cu_combine(s, y, dptr(k->aux[0]), dptr(k->aux[1]), dptr(k->aux[2]), dptr(k->aux[3]), k->m, k->n,
                            k->top_k);
      break;
    case FERRY_K_GATHER_ROWS:
      e = ferry__cu_gather(s, x, y, ints, k->m, k->n);
      break;
    case FERRY_K_DEQUANTIZE: {
      struct ferry_cu_dequant d;
      dequant_args(k, &d);
      e = ferry__cu_dequantize(s, &d, y, cudt(k->y.dtype));
      break;
    }
    default:
      snprintf(msg, len, "kernel kind %s is not implemented by the cuda executor", ferry_kernel_kind_name(k->kind));
      return -1;
  }
  if (e != cudaSuccess) {
    snprintf(msg, len, "launch: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
  }
  return 0;
}

/* --- GPU queues: issuer and completer -------------------------------------------------------- */

/* Make the stream wait for generation `gen` of an event: on the device when the generation was
 * recorded on a GPU queue, else (recorded by the CPU disk queue) by holding back this queue's
 * later calls until the CPU has raised it. */
static cudaError_t gpu_wait(struct cu_queue *q, ferry_event *ev, uint64_t gen) {
  struct cu_state *cs = state(q->ex);
  struct cu_event *ce = ev->backend;
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&cs->ev_mu);
  for (;;) {
    if (atomic_load(&ev->done_gen) >= gen) break;
    struct cu_event_slot *s = &ce->slot[gen % EV_RING];
    if (s->gen == gen && s->issued) {
      e = cudaStreamWaitEvent(q->stream, s->ev, 0);
      break;
    }
    pthread_cond_wait(&cs->ev_cv, &cs->ev_mu);
  }
  pthread_mutex_unlock(&cs->ev_mu);
  return e;
}

static cudaError_t gpu_record(struct cu_queue *q, ferry_event *ev, uint64_t gen) {
  struct cu_state *cs = state(q->ex);
  struct cu_event *ce = ev->backend;
  struct cu_event_slot *s = &ce->slot[gen % EV_RING];
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&cs->ev_mu);
  if (s->gen != gen) {
    /* the slot was reserved again for a later generation (the event is recorded on several
     * queues and a later generation completed first): that record owns it now */
    pthread_mutex_unlock(&cs->ev_mu);
    return cudaSuccess;
  }
  if (!s->ev) e = cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(s->ev, q->stream);
  s->issued = 1; /* even on failure: a waiter then finds a completed (or never recorded) event */
  pthread_cond_broadcast(&cs->ev_cv);
  pthread_mutex_unlock(&cs->ev_mu);
  return e;
}

static const char *op_name(const struct ferry_op *op) {
  switch (op->kind) {
    case FERRY_OP_READ: return "read";
    case FERRY_OP_COPY: return "copy";
    case FERRY_OP_KERNEL: return op->u.kernel.name;
    case FERRY_OP_RECORD: return "record";
    case FERRY_OP_WAIT: return "wait";
  }
  return "?";
}

static void issue_op(struct cu_queue *q, struct cu_pending *p, uint64_t seq) {
  struct ferry_exec *ex = q->ex;
  const struct ferry_op *op = &p->op;
  const uint32_t i = (uint32_t)(seq % OP_RING);
  char msg[FERRY_ERRMSG_MAX - 128];
  msg[0] = '\0';
  cudaError_t e = cudaEventRecord(q->ev_start[i], q->stream);
  const int bracket = ex->launch_begin && (op->kind == FERRY_OP_COPY || op->kind == FERRY_OP_KERNEL);
  if (bracket) {
    const int kernel = op->kind == FERRY_OP_KERNEL;
    ex->launch_begin(ex->launch_user, ferry_op_tag(op->correlation_id, kernel ? op->u.kernel.layer : op->layer,
                                                   kernel ? op->u.kernel.expert : op->expert,
                                                   kernel ? (int32_t)op->u.kernel.kind : -1));
  }
  /* injected device faults (ferry/fault.h): the op fails instead of running, or starts late */
  const struct ferry_fault fault = ferry__exec_fault(op);
  if (fault.delay_ns) ferry__io_sleep_ns(fault.delay_ns);
  if (fault.kind == FERRY_FAULT_FAIL) {
    ferry__exec_fault_fail(ex, q->index, op, fault.attempt);
  } else if (e == cudaSuccess) {
    switch (op->kind) {
      case FERRY_OP_COPY:
        e = cudaMemcpyAsync(dptr(op->u.copy.dst), dptr(op->u.copy.src), op->u.copy.bytes, cudaMemcpyDefault, q->stream);
        break;
      case FERRY_OP_KERNEL:
        ferry__nvtx_push(op->u.kernel.name);
        if (run_kernel(q, p, msg, sizeof msg)) e = cudaErrorLaunchFailure;
        ferry__nvtx_pop();
        break;
      case FERRY_OP_RECORD:
        e = gpu_record(q, op->u.event.ev, op->u.event.gen);
        break;
      case FERRY_OP_WAIT:
        e = gpu_wait(q, op->u.event.ev, op->u.event.gen);
        break;
      case FERRY_OP_READ: /* refused at submit */
        break;
    }
  }
  if (bracket) ex->launch_end(ex->launch_user);
  if (e != cudaSuccess) {
    if (!msg[0]) snprintf(msg, sizeof msg, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    async_fail(ex, FERRY_ERR_CUDA, "cuda executor: queue %d, %s (op %llu): %s", q->index, op_name(op),
               (unsigned long long)op->correlation_id, msg);
  }
  /* Always close the op, so the completer (and whoever waits on it) moves on. */
  e = cudaEventRecord(q->ev_end[i], q->stream);
  p->end_recorded = e == cudaSuccess;
  if (e != cudaSuccess)
    async_fail(ex, FERRY_ERR_CUDA, "cuda executor: queue %d: recording an op's end: %s", q->index, cudaGetErrorString(e));
}

static void *issuer_main(void *arg) {
  struct cu_queue *q = arg;
  cudaSetDevice(state(q->ex)->device);
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (q->issued == q->submitted && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    if (q->issued == q->submitted) { /* stopping and nothing left */
      pthread_mutex_unlock(&q->mu);
      break;
    }
    const uint64_t seq = q->issued;
    struct cu_pending *p = &q->ring[seq % OP_RING]; /* stable until completed passes it */
    pthread_mutex_unlock(&q->mu);

    issue_op(q, p, seq);

    pthread_mutex_lock(&q->mu);
    q->issued++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
  }
  return NULL;
}

static int64_t ms_to_ns(float ms) { return (int64_t)llround((double)ms * 1e6); }

/* Start and end of op `i` on the executor clock. Each end is timed from the previous op's end
 * on the same stream (short intervals keep cudaEventElapsedTime's float precise over long runs),
 * anchored at an event whose host time was taken at queue creation. */
static void op_times(struct cu_queue *q, uint32_t i, int64_t *start_ns, int64_t *end_ns) {
  float since_prev = 0.0f, dur = 0.0f;
  if (cudaEventElapsedTime(&since_prev, q->prev_end, q->ev_end[i]) != cudaSuccess ||
      cudaEventElapsedTime(&dur, q->ev_start[i], q->ev_end[i]) != cudaSuccess) {
    cudaGetLastError(); /* not sticky: an event that could not be recorded */
    *end_ns = *start_ns = cu_now(q->ex);
    return;
  }
  *end_ns = q->prev_end_ns + (since_prev > 0.0f ? ms_to_ns(since_prev) : 0);
  *start_ns = *end_ns - (dur > 0.0f ? ms_to_ns(dur) : 0);
  q->prev_end = q->ev_end[i];
  q->prev_end_ns = *end_ns;
}

static void *completer_main(void *arg) {
  struct cu_queue *q = arg;
  struct ferry_exec *ex = q->ex;
  cudaSetDevice(state(ex)->device);
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (q->completed == q->issued && !(q->stop && q->issued == q->submitted)) pthread_cond_wait(&q->cv, &q->mu);
    if (q->completed == q->issued) {
      pthread_mutex_unlock(&q->mu);
      break;
    }
    const uint64_t seq = q->completed;
    const struct cu_pending *p = &q->ring[seq % OP_RING];
    pthread_mutex_unlock(&q->mu);

    const uint32_t i = (uint32_t)(seq % OP_RING);
    int64_t start_ns, end_ns;
    /* without its end event (the record failed, already reported) the op's slot holds an old
     * record: wait for the stream instead, and keep the timing chain off it */
    cudaError_t e = p->end_recorded ? cudaEventSynchronize(q->ev_end[i]) : cudaStreamSynchronize(q->stream);
    if (e == cudaSuccess && !p->end_recorded) {
      end_ns = start_ns = cu_now(ex);
    } else if (e == cudaSuccess) {
      op_times(q, i, &start_ns, &end_ns);
    } else {
      async_fail(ex, cuda_status(e), "cuda executor: queue %d, %s (op %llu) failed on the device: %s (%s)", q->index,
                 op_name(&p->op), (unsigned long long)p->op.correlation_id, cudaGetErrorString(e), cudaGetErrorName(e));
      end_ns = start_ns = cu_now(ex);
    }
    if (p->op.kind == FERRY_OP_WAIT) atomic_fetch_add(&ex->queues[q->index].stall_ns, end_ns - start_ns);
    ferry__exec_op_done(ex, q->index, &p->op, start_ns, end_ns);
    if (p->op.kind == FERRY_OP_RECORD) raise_done(ex, p->op.u.event.ev, p->op.u.event.gen, end_ns);

    pthread_mutex_lock(&q->mu);
    q->completed++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
  }
  return NULL;
}

/* --- the CPU disk queue ---------------------------------------------------------------------- */

static void cpu_run(struct cu_queue *q, const struct ferry_op *op) {
  struct ferry_exec *ex = q->ex;
  const int64_t start = cu_now(ex);
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
    case FERRY_OP_COPY: {
      const struct ferry_ref *dst = &op->u.copy.dst, *src = &op->u.copy.src;
      if (dst->buf->ptr && src->buf->ptr) {
        memcpy((char *)dst->buf->ptr + ferry__ref_at(*dst), (const char *)src->buf->ptr + ferry__ref_at(*src),
               op->u.copy.bytes);
      } else {
        cudaError_t e = cudaMemcpy(dptr(*dst), dptr(*src), op->u.copy.bytes, cudaMemcpyDefault);
        if (e != cudaSuccess)
          async_fail(ex, cuda_status(e), "cuda executor: queue %d, copy (op %llu): %s", q->index,
                     (unsigned long long)op->correlation_id, cudaGetErrorString(e));
      }
      break;
    }
    case FERRY_OP_RECORD:
      raise_done(ex, op->u.event.ev, op->u.event.gen, start);
      break;
    case FERRY_OP_WAIT:
      /* Raised by the completer of a GPU queue (or by this thread): never a device call here. */
      wait_done(ex, op->u.event.ev, op->u.event.gen);
      break;
    case FERRY_OP_KERNEL: { /* a CPU queue's kernel (refused at submit elsewhere) */
      char msg[FERRY_ERRMSG_MAX];
      msg[0] = '\0';
      ferry_status st = ferry__host_kernel_run(&op->u.kernel, &q->scratch, msg, sizeof msg);
      if (st != FERRY_OK) ferry__exec_op_failed(ex, st, msg);
      break;
    }
  }
  const int64_t end = cu_now(ex);
  if (op->kind == FERRY_OP_WAIT) atomic_fetch_add(&ex->queues[q->index].stall_ns, end - start);
  ferry__exec_op_done(ex, q->index, op, start, end);
}

static void *cpu_main(void *arg) {
  struct cu_queue *q = arg;
  cudaSetDevice(state(q->ex)->device);
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (q->issued == q->submitted && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    if (q->issued == q->submitted) {
      pthread_mutex_unlock(&q->mu);
      break;
    }
    const struct ferry_op op = q->ring[q->issued % OP_RING].op;
    pthread_mutex_unlock(&q->mu);

    cpu_run(q, &op);

    pthread_mutex_lock(&q->mu);
    q->issued++;
    q->completed++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
  }
  return NULL;
}

/* --- queues ---------------------------------------------------------------------------------- */

static void queue_destroy(struct cu_queue *q) {
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  q->stop = 1;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  if (q->have_issuer) pthread_join(q->issuer, NULL);
  if (q->have_completer) pthread_join(q->completer, NULL);
  if (q->stream) cudaStreamSynchronize(q->stream);
  for (int i = 0; i < OP_RING; i++) {
    if (q->ev_start[i]) cudaEventDestroy(q->ev_start[i]);
    if (q->ev_end[i]) cudaEventDestroy(q->ev_end[i]);
  }
  if (q->anchor) cudaEventDestroy(q->anchor);
  if (q->blas) cublasDestroy(q->blas);
  cudaFree(q->blas_ws);
  cudaFree(q->ints_dev);
  cudaFreeHost(q->ints_host);
  cudaFree(q->convert);
  ferry__host_scratch_free(&q->scratch);
  if (q->stream) cudaStreamDestroy(q->stream);
  pthread_mutex_destroy(&q->mu);
  pthread_mutex_destroy(&q->submit_mu);
  pthread_cond_destroy(&q->cv);
  ferry_free(q->ring);
  ferry_free(q);
}

/* cuBLAS initialises itself on a handle's first product, not at cublasCreate: measured on an
 * H200 (the GPU check, 2026-12-04), the first GemmEx of a run waited 79-107 ms and each new
 * shape after it about 2.5 ms, all charged to the first request's TTFT. So each compute queue
 * runs gemm() (the path every product takes) for every weight dtype, as a GEMM and as one row
 * (cuBLAS picks other kernels for it), while the executor is created. Operands: the zeroed tail
 * of the conversion buffer, whose head gemm() converts the activations into. */
static ferry_status blas_warm_up(struct ferry_exec *ex, struct cu_queue *q) {
  enum { DIM = 64 };
  const size_t operand = DIM * DIM * sizeof(float); /* the widest (fp32) operand */
  char *tail = (char *)q->convert + CONVERT_BYTES - 3 * operand;
  cudaError_t e = cudaMemsetAsync(tail, 0, 3 * operand, q->stream);
  if (e != cudaSuccess) return cuda_fail(ex, e, "cuBLAS warm-up");
  const int64_t t0 = ferry__mono_ns();
  const enum ferry_dtype dts[] = {FERRY_DTYPE_F16, FERRY_DTYPE_BF16, FERRY_DTYPE_F32};
  char msg[256];
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++)
    for (int64_t m = 1; m <= DIM; m += DIM - 1)
      /* a dtype this GPU's cuBLAS declines (bf16 before Ampere) is skipped: the warm-up only
       * moves time, and a real product of it fails with its own message */
      if (gemm(q, (const float *)tail, m, DIM, tail + operand, dts[i], DIM, (float *)(tail + 2 * operand), 0, msg,
               sizeof msg))
        FERRY_DEBUG("cuda executor: cuBLAS warm-up: %s", msg);
  if ((e = cudaStreamSynchronize(q->stream)) != cudaSuccess) return cuda_fail(ex, e, "cuBLAS warm-up");
  FERRY_INFO("cuda executor: cuBLAS warm-up took %.1f ms", (double)(ferry__mono_ns() - t0) / 1e6);
  return FERRY_OK;
}

static ferry_status compute_resources(struct ferry_exec *ex, struct cu_queue *q) {
  struct cu_state *cs = state(ex);
  cudaError_t e;
  ferry_status st;
  cublasStatus_t bs = cublasCreate(&q->blas);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    q->blas = NULL;
    return blas_fail(ex, bs, "cublasCreate");
  }
  if ((bs = cublasSetStream(q->blas, q->stream)) != CUBLAS_STATUS_SUCCESS) return blas_fail(ex, bs, "cublasSetStream");
  if ((e = cudaMalloc(&q->blas_ws, BLAS_WORKSPACE_BYTES)) != cudaSuccess) return cuda_fail(ex, e, "cuBLAS workspace");
  if ((bs = cublasSetWorkspace(q->blas, q->blas_ws, BLAS_WORKSPACE_BYTES)) != CUBLAS_STATUS_SUCCESS)
    return blas_fail(ex, bs, "cublasSetWorkspace");
  if ((e = cudaHostAlloc((void **)&q->ints_host, INT_SEGMENTS * INT_SEGMENT_BYTES, cudaHostAllocMapped)) != cudaSuccess)
    return cuda_fail(ex, e, "pinned staging for immediate ints");
  /* Kernels read the immediates (token ids, positions, token lists: a few KB) straight from
   * pinned host memory: a copy would queue on a copy engine behind a block prefetch and stall
   * compute. Without a mapping they are copied to a device ring first. */
  void *mapped = NULL;
  if (cudaHostGetDevicePointer(&mapped, q->ints_host, 0) == cudaSuccess && mapped) {
    q->ints_mapped = mapped;
  } else {
    cudaGetLastError();
    if ((e = cudaMalloc((void **)&q->ints_dev, INT_SEGMENTS * INT_SEGMENT_BYTES)) != cudaSuccess)
      return cuda_fail(ex, e, "device ring for immediate ints");
  }
  if ((e = cudaMalloc(&q->convert, CONVERT_BYTES)) != cudaSuccess)
    return cuda_fail(ex, e, "activation conversion buffer");
  if ((st = blas_warm_up(ex, q)) != FERRY_OK) return st;
  cs->internal_pinned_bytes += INT_SEGMENTS * INT_SEGMENT_BYTES;
  cs->internal_device_bytes += BLAS_WORKSPACE_BYTES + (q->ints_dev ? INT_SEGMENTS * INT_SEGMENT_BYTES : 0) + CONVERT_BYTES;
  return FERRY_OK;
}

static ferry_status cu_queue_init(struct ferry_exec *ex, int32_t index) {
  struct cu_state *cs = state(ex);
  const enum ferry_queue_role role = ex->queues[index].role;
  ferry_status st = FERRY_OK;
  cudaError_t e;
  struct cu_queue *q = ferry__calloc(1, sizeof *q);
  if (!q) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "cuda executor: out of memory for a queue");
  pthread_mutex_init(&q->mu, NULL);
  pthread_mutex_init(&q->submit_mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  q->ex = ex;
  q->index = index;
  q->gpu = role != FERRY_QUEUE_DISK && role != FERRY_QUEUE_CPU;
  q->compute = role == FERRY_QUEUE_COMPUTE;
  q->cpu_compute = role == FERRY_QUEUE_CPU;
  q->ring = ferry__calloc(OP_RING, sizeof *q->ring);
  if (!q->ring) {
    st = ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "cuda executor: out of memory for a queue ring");
    goto out_destroy;
  }
  if (q->gpu) {
    if ((e = cudaSetDevice(cs->device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking)) != cudaSuccess) {
      q->stream = NULL;
      st = cuda_fail(ex, e, "creating a stream");
      goto out_destroy;
    }
    for (int i = 0; i < OP_RING; i++)
      if ((e = cudaEventCreate(&q->ev_start[i])) != cudaSuccess || (e = cudaEventCreate(&q->ev_end[i])) != cudaSuccess) {
        st = cuda_fail(ex, e, "creating op timing events");
        goto out_destroy;
      }
    if ((e = cudaEventCreate(&q->anchor)) != cudaSuccess || (e = cudaEventRecord(q->anchor, q->stream)) != cudaSuccess ||
        (e = cudaEventSynchronize(q->anchor)) != cudaSuccess) {
      st = cuda_fail(ex, e, "anchoring the queue's clock");
      goto out_destroy;
    }
    q->prev_end = q->anchor;
    q->prev_end_ns = cu_now(ex);
    if (q->compute && (st = compute_resources(ex, q)) != FERRY_OK) goto out_destroy;
  }
  if (pthread_create(&q->issuer, NULL, q->gpu ? issuer_main : cpu_main, q) != 0) {
    st = ferry__err_set(&ex->err, FERRY_ERR_INTERNAL, "cuda executor: cannot start a queue thread");
    goto out_destroy;
  }
  q->have_issuer = 1;
  if (q->gpu) {
    if (pthread_create(&q->completer, NULL, completer_main, q) != 0) {
      st = ferry__err_set(&ex->err, FERRY_ERR_INTERNAL, "cuda executor: cannot start a completion thread");
      goto out_destroy;
    }
    q->have_completer = 1;
  }
  cs->queues[index] = q;
  return FERRY_OK;
out_destroy:
  queue_destroy(q);
  return st;
}

/* Copy a kernel's immediate ints into the queue's pinned staging (the issuer copies them to
 * the device ring right before the launch). Called with q->mu held. */
static void stage_ints(struct cu_queue *q, struct cu_pending *p, uint64_t seq) {
  const struct ferry_kernel *k = &p->op.u.kernel;
  p->ints_bytes = 0;
  if (!kernel_uses_ints(k) || k->m <= 0) return;
  const uint64_t one = (uint64_t)k->m * 4, bytes = one * (kernel_uses_ints2(k) ? 2 : 1);
  const uint64_t reserve = (bytes + 255) / 256 * 256;
  if (q->int_fill + reserve > INT_SEGMENT_BYTES) {
    const int next = (q->int_seg + 1) % INT_SEGMENTS;
    while (q->int_seg_last[next] > q->completed) pthread_cond_wait(&q->cv, &q->mu);
    q->int_seg = next;
    q->int_fill = 0;
  }
  p->ints_off = (uint64_t)q->int_seg * INT_SEGMENT_BYTES + q->int_fill;
  p->ints_bytes = bytes;
  q->int_fill += reserve;
  q->int_seg_last[q->int_seg] = seq + 1;
  memcpy(q->ints_host + p->ints_off, k->ints, one);
  if (kernel_uses_ints2(k)) memcpy(q->ints_host + p->ints_off + one, k->ints2, one);
}

static ferry_status cu_submit(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op) {
  struct cu_queue *q = state(ex)->queues[queue];
  ferry_status st;
  if (op->kind == FERRY_OP_READ && q->gpu)
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "cuda executor: reads run on a DISK queue, not queue %d", queue);
  if (op->kind == FERRY_OP_KERNEL && !q->cpu_compute) {
    if (!q->compute)
      return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "cuda executor: kernel %s: kernels run on a COMPUTE queue, not queue %d",
                            op->u.kernel.name, queue);
    if ((st = validate_kernel(ex, &op->u.kernel)) != FERRY_OK) return st;
  }
  if (op->kind == FERRY_OP_RECORD && q->gpu) reserve_slot(ex, op->u.event.ev, op->u.event.gen);
  pthread_mutex_lock(&q->submit_mu);
  pthread_mutex_lock(&q->mu);
  while (q->submitted - q->completed >= OP_RING - 1) pthread_cond_wait(&q->cv, &q->mu); /* back-pressure */
  const uint64_t seq = q->submitted;
  struct cu_pending *p = &q->ring[seq % OP_RING];
  p->op = *op;
  p->ints_bytes = 0;
  if (op->kind == FERRY_OP_KERNEL && q->compute) stage_ints(q, p, seq);
  q->submitted++;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  pthread_mutex_unlock(&q->submit_mu);
  return FERRY_OK;
}

static ferry_status cu_sync(struct ferry_exec *ex, ferry_event *ev, uint64_t gen) {
  wait_done(ex, ev, gen);
  return FERRY_OK;
}

static ferry_status cu_drain(struct ferry_exec *ex) {
  for (int32_t i = 0; i < FERRY_EXEC_MAX_QUEUES; i++) {
    struct cu_queue *q = state(ex)->queues[i];
    if (!q) continue;
    pthread_mutex_lock(&q->mu);
    while (q->completed < q->submitted) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
  }
  return FERRY_OK;
}

/* --- buffers --------------------------------------------------------------------------------- */

static ferry_status cu_buf_alloc(struct ferry_exec *ex, ferry_buf *buf) {
  void *p = NULL;
  const size_t bytes = buf->bytes ? (size_t)buf->bytes : 1;
  char what[160];
  cudaError_t e;
  struct cu_state *cs = state(ex);
  if (buf->tier == FERRY_TIER_DISK) /* the host and sim executors keep them */
    return ferry__err_set(&ex->err, FERRY_ERR_UNSUPPORTED,
                          "cuda executor: no disk-tier buffers (%s of %llu bytes): the host executor keeps them as "
                          "files, the simulator prices them",
                          buf->label, (unsigned long long)buf->bytes);
  if (buf->tier == FERRY_TIER_DEVICE && cs->arena) {
    uint64_t off = 0;
    pthread_mutex_lock(&cs->arena_mu);
    ferry_status st = ferry__arena_alloc(cs->arena, buf->bytes, &off);
    const uint64_t largest = ferry__arena_largest_free(cs->arena);
    pthread_mutex_unlock(&cs->arena_mu);
    if (st != FERRY_OK)
      return ferry__err_set(&ex->err, FERRY_ERR_NOMEM,
                            "cuda executor: device arena: no free range of %llu bytes for %s (largest free %llu of %llu)",
                            (unsigned long long)buf->bytes, buf->label, (unsigned long long)largest,
                            (unsigned long long)cs->arena->size);
    buf->ptr = NULL;
    buf->backend_ptr = (char *)cs->arena_base + off;
    return FERRY_OK;
  }
  if (buf->tier == FERRY_TIER_HOST && !buf->pinned) {
    /* pageable, as a framework's ordinary CPU tensors: copies from it are staged by the driver
     * through its own pinned buffers (page-aligned, so O_DIRECT reads may land anywhere in it) */
    p = ferry__aligned_alloc(4096, bytes);
    if (!p)
      return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "cuda executor: cannot allocate %llu pageable bytes for %s",
                            (unsigned long long)buf->bytes, buf->label);
    buf->ptr = buf->backend_ptr = p;
    FERRY_DEBUG("cuda executor: pageable %llu bytes for %s", (unsigned long long)buf->bytes, buf->label);
    return FERRY_OK;
  }
  if (buf->tier == FERRY_TIER_DEVICE) {
    e = cudaMalloc(&p, bytes);
    snprintf(what, sizeof what, "cudaMalloc of %llu bytes for %s", (unsigned long long)buf->bytes, buf->label);
  } else {
    /* page-aligned, so O_DIRECT reads may land anywhere in it */
    e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    snprintf(what, sizeof what, "cudaHostAlloc (pinned) of %llu bytes for %s", (unsigned long long)buf->bytes, buf->label);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda_fail(ex, e, what);
  }
  buf->ptr = buf->tier == FERRY_TIER_HOST ? p : NULL;
  buf->backend_ptr = p;
  if (buf->tier == FERRY_TIER_HOST)
    FERRY_DEBUG("cuda executor: pinned %llu bytes for %s", (unsigned long long)buf->bytes, buf->label);
  return FERRY_OK;
}

static void cu_buf_free(struct ferry_exec *ex, ferry_buf *buf) {
  struct cu_state *cs = state(ex);
  if (buf->tier == FERRY_TIER_DEVICE && cs->arena) {
    pthread_mutex_lock(&cs->arena_mu);
    ferry__arena_free(cs->arena, (uint64_t)((char *)buf->backend_ptr - (char *)cs->arena_base), buf->bytes);
    pthread_mutex_unlock(&cs->arena_mu);
    return;
  }
  if (buf->tier == FERRY_TIER_HOST && !buf->pinned) {
    ferry_free(buf->backend_ptr);
    return;
  }
  cudaError_t e = buf->tier == FERRY_TIER_DEVICE ? cudaFree(buf->backend_ptr) : cudaFreeHost(buf->backend_ptr);
  if (e != cudaSuccess) FERRY_WARN("cuda executor: freeing %s: %s", buf->label, cudaGetErrorString(e));
}

/* --- lifecycle ------------------------------------------------------------------------------- */

static void cu_destroy(struct ferry_exec *ex) {
  struct cu_state *cs = state(ex);
  if (cs) {
    cu_drain(ex);
    for (int32_t i = 0; i < FERRY_EXEC_MAX_QUEUES; i++) queue_destroy(cs->queues[i]);
    uint64_t peak = 0;
    ferry_exec_tier_usage(ex, FERRY_TIER_HOST, NULL, &peak);
    if (peak || cs->internal_pinned_bytes) {
      char a[32], b[32];
      FERRY_INFO("cuda executor: peak pinned host memory %s (plus %s of internal staging)",
                 ferry__format_bytes(peak, a, sizeof a), ferry__format_bytes(cs->internal_pinned_bytes, b, sizeof b));
    }
    if (cs->arena) {
      char a[32], b[32];
      FERRY_INFO("cuda executor: device arena %s, peak use %s", ferry__format_bytes(cs->arena->size, a, sizeof a),
                 ferry__format_bytes(cs->arena->peak, b, sizeof b));
      cudaError_t e = cudaFree(cs->arena_base);
      if (e != cudaSuccess) FERRY_WARN("cuda executor: freeing the device arena: %s", cudaGetErrorString(e));
      ferry_free(cs->arena);
    }
    pthread_mutex_destroy(&cs->arena_mu);
    pthread_mutex_destroy(&cs->ev_mu);
    pthread_cond_destroy(&cs->ev_cv);
    ferry_free(cs);
  }
  ferry__exec_fini(ex);
  ferry_free(ex);
}

/* Device properties as Nsight Systems' TARGET_INFO_GPU gives them: clocks come in kHz from the
 * runtime, memory bandwidth is the double-data-rate peak of the memory clock and bus. */
static ferry_status cu_device_info(struct ferry_exec *ex, struct ferry_device_info *out) {
  const struct cu_state *cs = ex->backend_state;
  struct cudaDeviceProp prop;
  cudaError_t rc = cudaGetDeviceProperties(&prop, cs->device);
  if (rc != cudaSuccess)
    return ferry__err_set(&ex->err, FERRY_ERR_CUDA, "cudaGetDeviceProperties: %s", cudaGetErrorString(rc));
  snprintf(out->name, sizeof out->name, "%s", prop.name);
  snprintf(out->bus_location, sizeof out->bus_location, "%04x:%02x:%02x.0", (unsigned)prop.pciDomainID,
           (unsigned)prop.pciBusID, (unsigned)prop.pciDeviceID);
  const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
  snprintf(out->uuid, sizeof out->uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
           u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  out->is_discrete = !prop.integrated;
  out->sm_count = prop.multiProcessorCount;
  out->compute_major = prop.major;
  out->compute_minor = prop.minor;
  out->total_memory_bytes = (uint64_t)prop.totalGlobalMem;
  out->l2_cache_bytes = (uint64_t)prop.l2CacheSize;
  int clock_khz = 0, mem_clock_khz = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, cs->device) == cudaSuccess)
    out->clock_rate_hz = (uint64_t)clock_khz * 1000u;
  if (cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, cs->device) == cudaSuccess)
    out->memory_bandwidth_bytes_per_s = 2u * (uint64_t)mem_clock_khz * 1000u * (uint64_t)prop.memoryBusWidth / 8u;
  return FERRY_OK;
}

static const struct ferry_exec_backend cuda_backend = {
    .version = FERRY_EXEC_BACKEND_VERSION,
    .name = "cuda",
    .has_data = 1,
    .half_dequant = 1,
    .destroy = cu_destroy,
    .queue_init = cu_queue_init,
    .buf_alloc = cu_buf_alloc,
    .buf_free = cu_buf_free,
    .submit = cu_submit,
    .sync = cu_sync,
    .drain = cu_drain,
    .now = cu_now,
    .sleep_until = cu_sleep_until,
    .event_init = cu_event_init,
    .event_fini = cu_event_fini,
    .device_info = cu_device_info,
};

static ferry_status cuda_create(ferry_exec **out, const struct ferry_exec_config *config) {
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "exec_create_cuda: out is NULL");
  *out = NULL;
  int count = 0, unified = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return ferry__fail(FERRY_ERR_NO_DEVICE, "no CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
  }
  /* Create the context now, so the first op is not charged for it. */
  if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaFree(NULL)) != cudaSuccess)
    return ferry__fail(cuda_status(e), "cuda executor: initialising device 0: %s (%s)", cudaGetErrorString(e),
                       cudaGetErrorName(e));
  if ((e = cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, 0)) != cudaSuccess || !unified)
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "cuda executor: device 0 lacks unified addressing (needed for pinned host buffers)");
  struct ferry_exec *ex = ferry__calloc(1, sizeof *ex);
  struct cu_state *cs = ferry__calloc(1, sizeof *cs);
  if (!ex || !cs) {
    ferry_free(ex);
    ferry_free(cs);
    return ferry__fail(FERRY_ERR_NOMEM, "cuda executor: out of memory");
  }
  ferry__exec_init(ex, &cuda_backend, config);
  pthread_mutex_init(&cs->ev_mu, NULL);
  pthread_cond_init(&cs->ev_cv, NULL);
  pthread_mutex_init(&cs->arena_mu, NULL);
  cs->t0 = ferry__mono_ns();
  cs->device = 0;
  ex->backend_state = cs;
  const uint64_t budget = config ? config->device_budget_bytes : 0;
  if (budget) {
    /* the whole budget up front: a budget the GPU cannot hold fails here, not mid-run */
    const uint64_t bytes = (budget + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN + ARENA_SLACK;
    cs->arena = ferry__calloc(1, sizeof *cs->arena);
    e = cs->arena ? cudaMalloc(&cs->arena_base, (size_t)bytes) : cudaErrorMemoryAllocation;
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      char want[32], have[32];
      ferry__fail(cuda_status(e), "cuda executor: reserving the device budget (%s) as one arena: %s (%s free of the GPU's memory)",
                  ferry__format_bytes(budget, want, sizeof want), cudaGetErrorString(e),
                  ferry__format_bytes((uint64_t)free_b, have, sizeof have));
      ferry_free(cs->arena);
      cs->arena = NULL;
      cu_destroy(ex);
      return cuda_status(e);
    }
    ferry__arena_init(cs->arena, bytes, ARENA_ALIGN);
    cs->internal_device_bytes += bytes - budget;
  }
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    FERRY_DEBUG("cuda executor: device 0 (%s, %llu bytes)", prop.name, (unsigned long long)prop.totalGlobalMem);
  *out = ex;
  return FERRY_OK;
}

static ferry_status cuda_memory(uint64_t *free_bytes, uint64_t *total_bytes) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return ferry__fail(FERRY_ERR_NO_DEVICE, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
  }
  size_t f = 0, t = 0;
  if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaMemGetInfo(&f, &t)) != cudaSuccess) {
    cudaGetLastError();
    return ferry__fail(cuda_status(e), "cuda: reading device 0's memory: %s", cudaGetErrorString(e));
  }
  if (free_bytes) *free_bytes = (uint64_t)f;
  if (total_bytes) *total_bytes = (uint64_t)t;
  return FERRY_OK;
}

static void cuda_versions(int *driver, int *runtime) {
  *driver = *runtime = 0;
  if (cudaDriverGetVersion(driver) != cudaSuccess) *driver = 0;
  if (cudaRuntimeGetVersion(runtime) != cudaSuccess) *runtime = 0;
  cudaGetLastError();
}

const struct ferry__cuda_exec_host *ferry__cuda_exec_host;

static void cuda_bind(const struct ferry__cuda_exec_host *host) { ferry__cuda_exec_host = host; }

/* What the module offers ferry (exec_cuda_load.c finds it by name). */
__attribute__((visibility("default"))) const struct ferry__cuda_exec_api ferry__cuda_exec_api = {
    .version = FERRY_CUDA_EXEC_API_VERSION,
    .bind = cuda_bind,
    .create = cuda_create,
    .memory = cuda_memory,
    .versions = cuda_versions,
};
#endif /* FERRY_HAVE_CUDA */
