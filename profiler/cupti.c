/* The CUPTI collector (in ferry's CUDA module, ferry_cuda.so): registers CUPTI's Activity API
 * buffer callbacks on a fixed pool of pre-allocated buffers and a timestamp callback on
 * ferry's clock, enables the activity kinds a ferry timeline needs, and hands every completed
 * buffer's records to the converter (cupti_convert.c), which delivers them to the caller's
 * activity sink. ferry's public ferry_cupti_* functions (cupti_load.c) call it through the
 * table at the end. */
#include <dlfcn.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cupti.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/units.h"
#include "profiler/cupti_api.h"
#include "profiler/cupti_convert.h"

#define DEFAULT_BUFFER_BYTES (4u << 20)
#define DEFAULT_BUFFERS 16
#define MIN_BUFFER_BYTES (64u << 10)

static const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, CUPTI_ACTIVITY_KIND_MARKER,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

struct ferry_cupti {
  struct ferry__cupti_pool pool;
  pthread_mutex_t conv_mu; /* serialises conversion (CUPTI may complete buffers on several threads) */
  struct ferry__cupti_conv conv;
  _Atomic uint64_t dropped;
  int enabled[NKINDS];
};

/* CUPTI's callbacks carry no user pointer, and CUPTI takes one subscriber per process: the
 * running collector is a global. Callbacks announce themselves in g_inflight before reading
 * g_active, so ferry_cupti_stop() can wait for the last one before freeing the collector. */
static pthread_mutex_t g_start_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct ferry_cupti *) g_active;
static _Atomic int g_inflight;

static const char *cupti_str(CUptiResult rc) {
  const char *s = NULL;
  if (cuptiGetResultString(rc, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
  return s;
}

static uint64_t CUPTIAPI clock_cb(void) { return (uint64_t)ferry__mono_ns(); }

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  atomic_fetch_add(&g_inflight, 1);
  struct ferry_cupti *c = atomic_load(&g_active);
  *buffer = c ? ferry__cupti_pool_get(&c->pool, size) : NULL;
  if (!*buffer) *size = 0; /* CUPTI drops records and counts them; pool_get counted the refusal */
  *max_records = 0;        /* as many as fit */
  atomic_fetch_sub(&g_inflight, 1);
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)size;
  atomic_fetch_add(&g_inflight, 1);
  struct ferry_cupti *c = atomic_load(&g_active);
  if (c && buffer) {
    pthread_mutex_lock(&c->conv_mu);
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) ferry__cupti_conv_record(&c->conv, rec);
    pthread_mutex_unlock(&c->conv_mu);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
      atomic_fetch_add(&c->dropped, (uint64_t)dropped);
    ferry__cupti_pool_put(&c->pool, buffer);
  }
  atomic_fetch_sub(&g_inflight, 1);
}

static const char *runtime_api_name(uint32_t cbid) {
  const char *name = NULL;
  return cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) == CUPTI_SUCCESS ? name : NULL;
}

/* CUPTI sees NVTX ranges only through NVTX's injection hook, read by NVTX at its first call. */
static void point_nvtx_at_cupti(void) {
  Dl_info info;
  void *sym;
  CUptiResult (*fn)(CUpti_ActivityKind) = cuptiActivityEnable;
  memcpy(&sym, &fn, sizeof sym);
  if (!getenv("NVTX_INJECTION64_PATH") && dladdr(sym, &info) && info.dli_fname)
    setenv("NVTX_INJECTION64_PATH", info.dli_fname, 0);
}

static void disable_all(struct ferry_cupti *c, CUptiResult *first_err) {
  for (size_t i = 0; i < NKINDS; i++) {
    if (!c->enabled[i]) continue;
    CUptiResult rc = cuptiActivityDisable(kinds[i]);
    if (rc != CUPTI_SUCCESS && first_err && *first_err == CUPTI_SUCCESS) *first_err = rc;
    c->enabled[i] = 0;
  }
}

/* Unpublish the collector and wait until no callback still uses it. */
static void unpublish(void) {
  atomic_store(&g_active, NULL);
  while (atomic_load(&g_inflight) > 0) sched_yield();
}

static void destroy(struct ferry_cupti *c) {
  pthread_mutex_destroy(&c->conv_mu);
  ferry__cupti_pool_fini(&c->pool);
  ferry_free(c);
}

static ferry_status cupti_start_config(ferry_cupti **out, ferry_activity_fn sink, void *user, int64_t t0_ns,
                                       const struct ferry_cupti_config *config) {
  if (!out || !sink) return ferry__fail(FERRY_ERR_INVALID, "ferry_cupti_start: %s is NULL", out ? "sink" : "out");
  *out = NULL;
  struct ferry_cupti_config cfg = config ? *config : (struct ferry_cupti_config){0};
  if (!cfg.buffer_bytes) cfg.buffer_bytes = DEFAULT_BUFFER_BYTES;
  if (!cfg.buffers) cfg.buffers = DEFAULT_BUFFERS;
  if (cfg.buffer_bytes < MIN_BUFFER_BYTES || cfg.buffer_bytes > ((uint64_t)1 << 32))
    return ferry__fail(FERRY_ERR_INVALID, "ferry_cupti_start: buffer_bytes %llu out of range (expected 64 KiB to 4 GiB)",
                       (unsigned long long)cfg.buffer_bytes);

  ferry_status st = FERRY_OK;
  pthread_mutex_lock(&g_start_mu);
  if (atomic_load(&g_active)) {
    st = ferry__fail(FERRY_ERR_BUSY, "ferry_cupti_start: a CUPTI collector already runs in this process "
                     "(CUPTI takes one subscriber)");
    goto out_unlock;
  }
  /* Without a driver or device CUPTI fails late and vaguely (CUPTI_ERROR_UNKNOWN from
   * cuptiActivityEnable): ask the CUDA runtime first. */
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess || ndev <= 0) {
    if (ce != cudaSuccess) cudaGetLastError(); /* leave no error behind for the caller's CUDA calls */
    st = ferry__fail(FERRY_ERR_NO_DEVICE, "cupti: no CUDA device to trace (cudaGetDeviceCount: %s%s%s); "
                     "profiling is off and the run continues untraced",
                     ce != cudaSuccess ? cudaGetErrorName(ce) : "0 devices", ce != cudaSuccess ? ", " : "",
                     ce != cudaSuccess ? cudaGetErrorString(ce) : "");
    goto out_unlock;
  }

  struct ferry_cupti *c = ferry__calloc(1, sizeof *c);
  if (!c) {
    st = ferry__fail(FERRY_ERR_NOMEM, "cupti: out of memory for the collector");
    goto out_unlock;
  }
  if ((st = ferry__cupti_pool_init(&c->pool, (size_t)cfg.buffer_bytes, cfg.buffers)) != FERRY_OK) goto out_free;
  if (pthread_mutex_init(&c->conv_mu, NULL)) {
    st = ferry__fail(FERRY_ERR_NOMEM, "cupti: cannot create a mutex");
    goto out_pool;
  }
  ferry__cupti_conv_init(&c->conv, sink, user, t0_ns);
  c->conv.demangle = ferry__cupti_demangle;
  c->conv.api_name = runtime_api_name;
  point_nvtx_at_cupti();

  const char *what = "cuptiActivityRegisterTimestampCallback";
  CUptiResult rc = cuptiActivityRegisterTimestampCallback(clock_cb);
  if (rc == CUPTI_SUCCESS) {
    what = "cuptiActivityRegisterCallbacks";
    rc = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  }
  if (rc != CUPTI_SUCCESS) goto out_cupti_error;
  atomic_store(&g_active, c);
  what = "cuptiActivityEnable";
  for (size_t i = 0; i < NKINDS; i++) {
    if ((rc = cuptiActivityEnable(kinds[i])) != CUPTI_SUCCESS) goto out_disable;
    c->enabled[i] = 1;
  }
  if (cfg.flush_period_ms && (rc = cuptiActivityFlushPeriod(cfg.flush_period_ms)) != CUPTI_SUCCESS) {
    what = "cuptiActivityFlushPeriod";
    goto out_disable;
  }
  *out = c;
  goto out_unlock;

out_disable:
  disable_all(c, NULL);
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  unpublish();
out_cupti_error:
  st = ferry__fail(FERRY_ERR_CUDA, "cupti: %s failed: %s (CUptiResult %d); profiling is off", what, cupti_str(rc),
                   (int)rc);
  ferry__cupti_conv_fini(&c->conv);
  pthread_mutex_destroy(&c->conv_mu);
out_pool:
  ferry__cupti_pool_fini(&c->pool);
out_free:
  ferry_free(c);
out_unlock:
  pthread_mutex_unlock(&g_start_mu);
  return st;
}

static ferry_status cupti_flush(ferry_cupti *c) {
  if (!c) return ferry__fail(FERRY_ERR_INVALID, "ferry_cupti_flush: c is NULL");
  CUptiResult rc = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (rc != CUPTI_SUCCESS)
    return ferry__fail(FERRY_ERR_CUDA, "cupti: cuptiActivityFlushAll failed: %s (CUptiResult %d)", cupti_str(rc), (int)rc);
  return FERRY_OK;
}

static void cupti_get_stats(const ferry_cupti *c, struct ferry_cupti_stats *stats) {
  if (!stats) return;
  memset(stats, 0, sizeof *stats);
  if (!c) return;
  struct ferry_cupti *m = (struct ferry_cupti *)c; /* the mutexes are not part of the value */
  pthread_mutex_lock(&m->conv_mu);
  *stats = m->conv.stats;
  pthread_mutex_unlock(&m->conv_mu);
  stats->dropped_records = atomic_load(&m->dropped);
  stats->pool_exhausted = ferry__cupti_pool_exhausted(&m->pool);
}

static void cupti_launch_begin(void *user, uint64_t tag) {
  if (user) cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, tag);
}

static void cupti_launch_end(void *user) {
  uint64_t last = 0;
  if (user) cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

static ferry_status cupti_stop(ferry_cupti *c, struct ferry_cupti_stats *stats) {
  if (stats) memset(stats, 0, sizeof *stats);
  if (!c) return FERRY_OK;
  pthread_mutex_lock(&g_start_mu);
  /* Flush before disabling (records of work already done), and after (those in flight). */
  CUptiResult err = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char *what = "cuptiActivityFlushAll";
  CUptiResult dis = CUPTI_SUCCESS;
  disable_all(c, &dis);
  if (err == CUPTI_SUCCESS && dis != CUPTI_SUCCESS) {
    err = dis;
    what = "cuptiActivityDisable";
  }
  CUptiResult again = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (err == CUPTI_SUCCESS) err = again;
  unpublish();
  pthread_mutex_lock(&c->conv_mu);
  ferry__cupti_conv_fini(&c->conv); /* ranges still open count as unpaired */
  pthread_mutex_unlock(&c->conv_mu);
  cupti_get_stats(c, stats);
  destroy(c);
  pthread_mutex_unlock(&g_start_mu);
  if (err != CUPTI_SUCCESS)
    return ferry__fail(FERRY_ERR_CUDA, "cupti: %s at stop failed: %s (CUptiResult %d); some records may be missing",
                       what, cupti_str(err), (int)err);
  return FERRY_OK;
}

/* What the module offers ferry (cupti_load.c finds it by name). */
__attribute__((visibility("default"))) const struct ferry__cupti_api ferry__cupti_api = {
    .version = FERRY_CUPTI_API_VERSION,
    .start_config = cupti_start_config,
    .flush = cupti_flush,
    .get_stats = cupti_get_stats,
    .launch_begin = cupti_launch_begin,
    .launch_end = cupti_launch_end,
    .stop = cupti_stop,
};
