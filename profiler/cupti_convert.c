/* The device-free half of the CUPTI collector: the fixed buffer pool CUPTI fills, and the
 * conversion of CUPTI activity records into ferry activities. Kept apart from cupti.c so that
 * it is built and tested on machines without a GPU (records are filled in by the tests). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/units.h"
#include "profiler/cupti_convert.h"

int64_t ferry_cupti_clock_ns(void) { return ferry__mono_ns(); }

/* ---- buffer pool ------------------------------------------------------------------------- */

ferry_status ferry__cupti_pool_init(struct ferry__cupti_pool *p, size_t buffer_bytes, uint32_t count) {
  memset(p, 0, sizeof *p);
  if (buffer_bytes < FERRY__CUPTI_ALIGN || count == 0 || buffer_bytes > SIZE_MAX / count)
    return ferry__fail(FERRY_ERR_INVALID, "cupti: buffer pool of %u buffers of %zu bytes (expected >= 1 buffer "
                       "of >= %d bytes)", count, buffer_bytes, FERRY__CUPTI_ALIGN);
  buffer_bytes -= buffer_bytes % FERRY__CUPTI_ALIGN;
  p->mem = ferry__aligned_alloc(FERRY__CUPTI_ALIGN, buffer_bytes * count);
  if (!p->mem) goto out_nomem;
  p->free = ferry__calloc(count, sizeof *p->free);
  if (!p->free) goto out_free_mem;
  if (pthread_mutex_init(&p->mu, NULL)) goto out_free_list;
  p->buffer_bytes = buffer_bytes;
  p->count = p->nfree = count;
  /* Hand out buffer 0 first: the stack's top is the last element. */
  for (uint32_t i = 0; i < count; i++) p->free[i] = count - 1 - i;
  return FERRY_OK;

out_free_list:
  ferry_free(p->free);
out_free_mem:
  ferry_free(p->mem);
out_nomem:
  memset(p, 0, sizeof *p);
  return ferry__fail(FERRY_ERR_NOMEM, "cupti: cannot allocate %u activity buffers of %zu bytes", count, buffer_bytes);
}

void ferry__cupti_pool_fini(struct ferry__cupti_pool *p) {
  if (!p->mem) return;
  pthread_mutex_destroy(&p->mu);
  ferry_free(p->free);
  ferry_free(p->mem);
  memset(p, 0, sizeof *p);
}

uint8_t *ferry__cupti_pool_get(struct ferry__cupti_pool *p, size_t *bytes) {
  uint8_t *buf = NULL;
  pthread_mutex_lock(&p->mu);
  if (p->nfree)
    buf = p->mem + (size_t)p->free[--p->nfree] * p->buffer_bytes;
  else
    p->exhausted++;
  pthread_mutex_unlock(&p->mu);
  *bytes = buf ? p->buffer_bytes : 0;
  return buf;
}

int ferry__cupti_pool_put(struct ferry__cupti_pool *p, uint8_t *buf) {
  if (!buf || buf < p->mem) return -1;
  size_t off = (size_t)(buf - p->mem);
  if (off % p->buffer_bytes || off / p->buffer_bytes >= p->count) return -1;
  int rc = 0;
  pthread_mutex_lock(&p->mu);
  if (p->nfree < p->count)
    p->free[p->nfree++] = (uint32_t)(off / p->buffer_bytes);
  else
    rc = -1; /* more puts than gets: a bug in the caller, never a corrupted stack */
  pthread_mutex_unlock(&p->mu);
  return rc;
}

uint64_t ferry__cupti_pool_exhausted(struct ferry__cupti_pool *p) {
  pthread_mutex_lock(&p->mu);
  uint64_t n = p->exhausted;
  pthread_mutex_unlock(&p->mu);
  return n;
}

/* ---- value mappings ------------------------------------------------------------------------ */

enum { NSYS_MEM_KIND_UNKNOWN = 7, CUPTI_MEMCPY_KIND_LAST = 10 };

int ferry__cupti_nsys_mem_kind(uint32_t cupti_kind) {
  return cupti_kind == 0 || cupti_kind > NSYS_MEM_KIND_UNKNOWN ? NSYS_MEM_KIND_UNKNOWN : (int)cupti_kind - 1;
}

enum ferry_copy_kind ferry__cupti_copy_kind(uint32_t cupti_kind) {
  return cupti_kind <= CUPTI_MEMCPY_KIND_LAST ? (enum ferry_copy_kind)cupti_kind : FERRY_COPY_UNKNOWN;
}

int64_t ferry__cupti_run_ns(uint64_t ts, int64_t t0_ns) { return (int64_t)ts - t0_ns; }

void ferry__cupti_short_name(const char *demangled, char *out, size_t cap) {
  if (!cap) return;
  out[0] = '\0';
  if (!demangled) return;
  /* Copy the name up to its parameter list, leaving out template arguments; "(anonymous
   * namespace)" is a scope, not a parameter list. */
  size_t n = 0, start = 0;
  int depth = 0;
  for (const char *p = demangled; *p; p++) {
    if (*p == '(' && depth == 0) {
      static const char anon[] = "(anonymous namespace)";
      if (!strncmp(p, anon, sizeof anon - 1)) {
        p += sizeof anon - 2;
        continue;
      }
      break;
    }
    if (*p == '<') depth++;
    else if (*p == '>' && depth > 0) depth--;
    else if (depth == 0) {
      if (*p == ':' || *p == ' ') start = n + 1; /* the name starts after a scope or return type */
      if (n + 1 < cap) out[n] = *p;
      n++;
    }
  }
  if (n >= cap) n = cap - 1;
  if (start >= n) start = 0; /* nothing after the last separator: keep it all */
  out[n] = '\0';
  if (start) memmove(out, out + start, n - start + 1);
  if (!out[0]) snprintf(out, cap, "%s", demangled);
}

/* __cxa_demangle from the C++ runtime when the process has one (CUDA's libraries usually pull
 * it in), else from libstdc++ if installed; without it kernels keep their mangled names. */
typedef char *(*cxa_demangle_fn)(const char *, char *, size_t *, int *);
static cxa_demangle_fn g_cxa_demangle;
static pthread_once_t g_demangle_once = PTHREAD_ONCE_INIT;

static void find_demangler(void) {
  void *sym = dlsym(RTLD_DEFAULT, "__cxa_demangle");
  if (!sym) {
    void *lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL); /* kept open for the process */
    if (lib) sym = dlsym(lib, "__cxa_demangle");
  }
  memcpy(&g_cxa_demangle, &sym, sizeof sym); /* object to function pointer without a cast warning */
}

char *ferry__cupti_demangle(const char *mangled) {
  if (!mangled || strncmp(mangled, "_Z", 2)) return NULL;
  pthread_once(&g_demangle_once, find_demangler);
  if (!g_cxa_demangle) return NULL;
  int status = 0;
  char *out = g_cxa_demangle(mangled, NULL, NULL, &status);
  if (status != 0) {
    free(out);
    return NULL;
  }
  return out;
}

/* ---- record conversion --------------------------------------------------------------------- */

void ferry__cupti_conv_init(struct ferry__cupti_conv *cv, ferry_activity_fn sink, void *user, int64_t t0_ns) {
  memset(cv, 0, sizeof *cv);
  cv->sink = sink;
  cv->user = user;
  cv->t0_ns = t0_ns;
}

void ferry__cupti_conv_fini(struct ferry__cupti_conv *cv) {
  ferry_free(cv->ext_corr);
  ferry_free(cv->ext_tag);
  cv->ext_corr = NULL;
  cv->ext_tag = NULL;
  for (size_t i = 0; i < cv->nopen; i++) ferry_free(cv->open[i].name);
  cv->stats.unpaired_markers += cv->nopen;
  cv->nopen = 0;
  for (size_t i = 0; i < FERRY__CUPTI_NAME_CACHE; i++) {
    struct ferry__cupti_name *e = &cv->names[i];
    ferry_free(e->mangled);
    ferry_free(e->demangled);
    ferry_free(e->short_name);
    memset(e, 0, sizeof *e);
  }
}

#ifdef FERRY_HAVE_CUDA

static void deliver(struct ferry__cupti_conv *cv, const struct ferry_activity *a) {
  cv->stats.delivered++;
  if (cv->sink) cv->sink(cv->user, a);
}

/* CUPTI correlation id -> the tag of the ferry op that made the call (pushed as an external
 * correlation id by ferry_cupti_launch_begin()). */
static void conv_external(struct ferry__cupti_conv *cv, const CUpti_ActivityExternalCorrelation *x) {
  if (x->externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0 || !x->correlationId) {
    cv->stats.ignored++;
    return;
  }
  if (!cv->ext_corr) {
    cv->ext_corr = ferry__calloc(FERRY__CUPTI_EXT_SLOTS, sizeof *cv->ext_corr);
    cv->ext_tag = ferry__calloc(FERRY__CUPTI_EXT_SLOTS, sizeof *cv->ext_tag);
    if (!cv->ext_corr || !cv->ext_tag) {
      ferry_free(cv->ext_corr);
      ferry_free(cv->ext_tag);
      cv->ext_corr = NULL;
      cv->ext_tag = NULL;
      cv->stats.ignored++;
      return;
    }
  }
  const uint32_t slot = x->correlationId % FERRY__CUPTI_EXT_SLOTS;
  cv->ext_corr[slot] = x->correlationId;
  cv->ext_tag[slot] = x->externalId;
}

/* Layer and expert of the op behind a CUPTI record, when its call was tagged. */
static void attribute(struct ferry__cupti_conv *cv, uint32_t correlation_id, struct ferry_activity *a) {
  if (!cv->ext_corr || !correlation_id) return;
  const uint32_t slot = correlation_id % FERRY__CUPTI_EXT_SLOTS;
  if (cv->ext_corr[slot] != correlation_id) return;
  ferry_op_tag_split(cv->ext_tag[slot], &a->layer, &a->expert, NULL);
  cv->stats.attributed++;
}

static struct ferry_activity base_activity(enum ferry_activity_kind kind, int32_t queue, int64_t start_ns,
                                           int64_t end_ns, uint64_t correlation_id,
                                           const struct ferry_activity_cuda *cuda) {
  return (struct ferry_activity){.kind = kind, .queue = queue, .start_ns = start_ns, .end_ns = end_ns,
                                 .correlation_id = correlation_id, .step = -1, .layer = -1, .expert = -1,
                                 .cuda = cuda};
}

/* A duration record CUPTI could not time has 0 in start or end: skipped and counted. */
static int untimed(struct ferry__cupti_conv *cv, uint64_t start, uint64_t end) {
  if (start && end) return 0;
  cv->stats.zero_timestamp++;
  return 1;
}

/* The cached names of a kernel (NULL fields when an allocation failed: the caller falls back
 * to the mangled name). */
static const struct ferry__cupti_name *kernel_name(struct ferry__cupti_conv *cv, const char *mangled) {
  static const struct ferry__cupti_name none = {0};
  if (!mangled) return &none;
  struct ferry__cupti_name *e = &cv->names[((uintptr_t)mangled >> 4) % FERRY__CUPTI_NAME_CACHE];
  if (e->mangled && !strcmp(e->mangled, mangled)) return e;
  ferry_free(e->mangled);
  ferry_free(e->demangled);
  ferry_free(e->short_name);
  memset(e, 0, sizeof *e);
  char *dem = cv->demangle ? cv->demangle(mangled) : NULL;
  e->mangled = ferry__strdup(mangled);
  e->demangled = ferry__strdup(dem ? dem : mangled);
  free(dem); /* from the C++ runtime's malloc, not ferry's hook */
  size_t cap = strlen(mangled) + 1 > 256 ? strlen(mangled) + 1 : 256;
  if (e->demangled && (e->short_name = ferry_malloc(cap)) != NULL)
    ferry__cupti_short_name(e->demangled, e->short_name, cap);
  if (!e->mangled || !e->demangled || !e->short_name) {
    ferry_free(e->mangled);
    ferry_free(e->demangled);
    ferry_free(e->short_name);
    memset(e, 0, sizeof *e);
  }
  return e;
}

static void conv_kernel(struct ferry__cupti_conv *cv, const CUpti_ActivityKernel10 *k) {
  if (untimed(cv, k->start, k->end)) return;
  struct ferry_activity_cuda d = {
      .device_id = k->deviceId, .context_id = k->contextId, .mangled_name = k->name,
      .grid = {k->gridX, k->gridY, k->gridZ}, .block = {k->blockX, k->blockY, k->blockZ},
      .registers_per_thread = k->registersPerThread, .static_shared_bytes = k->staticSharedMemory,
      .dynamic_shared_bytes = k->dynamicSharedMemory};
  struct ferry_activity a = base_activity(FERRY_ACT_KERNEL, (int32_t)k->streamId, ferry__cupti_run_ns(k->start, cv->t0_ns),
                                          ferry__cupti_run_ns(k->end, cv->t0_ns), k->correlationId, &d);
  const struct ferry__cupti_name *n = kernel_name(cv, k->name);
  a.name = n->demangled ? n->demangled : k->name;
  a.kind_name = n->short_name;
  attribute(cv, k->correlationId, &a);
  deliver(cv, &a);
}

static void conv_memcpy(struct ferry__cupti_conv *cv, const CUpti_ActivityMemcpy6 *m) {
  if (untimed(cv, m->start, m->end)) return;
  struct ferry_activity_cuda d = {.device_id = m->deviceId, .context_id = m->contextId,
                                  .src_kind = ferry__cupti_nsys_mem_kind(m->srcKind),
                                  .dst_kind = ferry__cupti_nsys_mem_kind(m->dstKind)};
  struct ferry_activity a = base_activity(FERRY_ACT_MEMCPY, (int32_t)m->streamId, ferry__cupti_run_ns(m->start, cv->t0_ns),
                                          ferry__cupti_run_ns(m->end, cv->t0_ns), m->correlationId, &d);
  a.bytes = m->bytes;
  a.copy_kind = ferry__cupti_copy_kind(m->copyKind);
  attribute(cv, m->correlationId, &a);
  deliver(cv, &a);
}

static void conv_memset(struct ferry__cupti_conv *cv, const CUpti_ActivityMemset4 *m) {
  if (untimed(cv, m->start, m->end)) return;
  struct ferry_activity_cuda d = {.device_id = m->deviceId, .context_id = m->contextId,
                                  .mem_kind = ferry__cupti_nsys_mem_kind(m->memoryKind), .value = m->value};
  struct ferry_activity a = base_activity(FERRY_ACT_MEMSET, (int32_t)m->streamId, ferry__cupti_run_ns(m->start, cv->t0_ns),
                                          ferry__cupti_run_ns(m->end, cv->t0_ns), m->correlationId, &d);
  a.bytes = m->bytes;
  attribute(cv, m->correlationId, &a);
  deliver(cv, &a);
}

static void conv_runtime(struct ferry__cupti_conv *cv, const CUpti_ActivityAPI *r) {
  if (untimed(cv, r->start, r->end)) return;
  char fallback[40];
  const char *name = cv->api_name ? cv->api_name(r->cbid) : NULL;
  if (!name) {
    snprintf(fallback, sizeof fallback, "cudaRuntimeApi#%u", (unsigned)r->cbid);
    name = fallback;
  }
  struct ferry_activity_cuda d = {.thread_id = r->threadId, .return_value = (int32_t)r->returnValue};
  struct ferry_activity a = base_activity(FERRY_ACT_RUNTIME, -1, ferry__cupti_run_ns(r->start, cv->t0_ns),
                                          ferry__cupti_run_ns(r->end, cv->t0_ns), r->correlationId, &d);
  a.name = name;
  deliver(cv, &a);
}

static void conv_sync(struct ferry__cupti_conv *cv, const CUpti_ActivitySynchronization2 *s) {
  static const char *const names[] = {"sync", "event sync", "stream wait event", "stream sync", "context sync"};
  if (untimed(cv, s->start, s->end)) return;
  uint32_t type = (uint32_t)s->type <= 4 ? (uint32_t)s->type : 0;
  struct ferry_activity_cuda d = {.context_id = s->contextId, .sync_type = (int32_t)type, .event_id = s->cudaEventId};
  struct ferry_activity a = base_activity(FERRY_ACT_SYNC, (int32_t)s->streamId, ferry__cupti_run_ns(s->start, cv->t0_ns),
                                          ferry__cupti_run_ns(s->end, cv->t0_ns), s->correlationId, &d);
  a.name = names[type];
  deliver(cv, &a);
}

static void emit_range(struct ferry__cupti_conv *cv, const char *name, int64_t start_ns, int64_t end_ns,
                       uint32_t thread_id, uint32_t id) {
  struct ferry_activity_cuda d = {.thread_id = thread_id};
  struct ferry_activity a = base_activity(FERRY_ACT_RANGE, -1, start_ns, end_ns, id, &d);
  a.name = name;
  deliver(cv, &a);
}

/* NVTX ranges arrive as a START marker (with the name) and an END marker with the same id,
 * possibly in different buffers; an instantaneous marker becomes an empty range. */
static void conv_marker(struct ferry__cupti_conv *cv, const CUpti_ActivityMarker2 *m) {
  uint32_t tid = m->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD ? m->objectId.pt.threadId : 0;
  if (!(m->flags & (CUPTI_ACTIVITY_FLAG_MARKER_START | CUPTI_ACTIVITY_FLAG_MARKER_END |
                    CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS))) {
    cv->stats.ignored++; /* nvtxDomainSync* acquire/release markers */
    return;
  }
  if (!m->timestamp) {
    cv->stats.zero_timestamp++;
    return;
  }
  int64_t t = ferry__cupti_run_ns(m->timestamp, cv->t0_ns);
  /* ferry's own ranges reach the timeline from the executor, attributed to step and layer */
  const int own = m->domain && !strcmp(m->domain, FERRY_NVTX_DOMAIN);
  if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) {
    if (own) cv->stats.own_ranges++;
    else emit_range(cv, m->name, t, t, tid, m->id);
    return;
  }
  if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) {
    char *name = m->name && !own ? ferry__strdup(m->name) : NULL;
    if (cv->nopen == FERRY__CUPTI_MAX_OPEN_MARKERS || (m->name && !own && !name)) {
      ferry_free(name);
      cv->stats.unpaired_markers++;
      return;
    }
    cv->open[cv->nopen++] =
        (struct ferry__cupti_open_marker){.id = m->id, .start_ns = t, .thread_id = tid, .name = name, .own = own};
    return;
  }
  /* END: the most recent open range with this id (ids are unique while open). */
  for (size_t i = cv->nopen; i-- > 0;) {
    if (cv->open[i].id != m->id) continue;
    struct ferry__cupti_open_marker o = cv->open[i];
    cv->open[i] = cv->open[--cv->nopen];
    if (o.own) cv->stats.own_ranges++;
    else emit_range(cv, o.name, o.start_ns, t, o.thread_id, o.id);
    ferry_free(o.name);
    return;
  }
  cv->stats.unpaired_markers++;
}

void ferry__cupti_conv_record(struct ferry__cupti_conv *cv, const CUpti_Activity *rec) {
  cv->stats.records++;
  switch (rec->kind) {
  case CUPTI_ACTIVITY_KIND_KERNEL:
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: conv_kernel(cv, (const CUpti_ActivityKernel10 *)rec); break;
  case CUPTI_ACTIVITY_KIND_MEMCPY: conv_memcpy(cv, (const CUpti_ActivityMemcpy6 *)rec); break;
  case CUPTI_ACTIVITY_KIND_MEMSET: conv_memset(cv, (const CUpti_ActivityMemset4 *)rec); break;
  case CUPTI_ACTIVITY_KIND_RUNTIME: conv_runtime(cv, (const CUpti_ActivityAPI *)rec); break;
  case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: conv_sync(cv, (const CUpti_ActivitySynchronization2 *)rec); break;
  case CUPTI_ACTIVITY_KIND_MARKER: conv_marker(cv, (const CUpti_ActivityMarker2 *)rec); break;
  case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
    conv_external(cv, (const CUpti_ActivityExternalCorrelation *)rec);
    break;
  default: cv->stats.ignored++; break;
  }
}

#endif /* FERRY_HAVE_CUDA */
