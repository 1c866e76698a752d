/* The CUPTI collector's device-free half: the fixed pool of 8-byte-aligned activity buffers
 * and the conversion of CUPTI activity records into struct ferry_activity (kernel names
 * demangled, memory kinds renumbered for nsys, NVTX start/end markers paired into ranges).
 * Compiled always; the record conversion needs the CUPTI headers (FERRY_HAVE_CUDA). */
#ifndef FERRY_PROFILER_CUPTI_CONVERT_H
#define FERRY_PROFILER_CUPTI_CONVERT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/activity.h"
#include "ferry/cupti.h"

#ifdef FERRY_HAVE_CUDA
#include <cupti_activity.h>
#endif

/* CUPTI requires activity buffers aligned to 8 bytes. */
#define FERRY__CUPTI_ALIGN 8

/* A fixed set of buffers carved from one allocation; get/put are thread-safe. */
struct ferry__cupti_pool {
  pthread_mutex_t mu;
  uint8_t *mem;        /* owned, FERRY__CUPTI_ALIGN-aligned */
  size_t buffer_bytes; /* multiple of FERRY__CUPTI_ALIGN */
  uint32_t count;
  uint32_t nfree;
  uint32_t *free;      /* stack of free buffer indices */
  uint64_t exhausted;  /* get() calls that found no free buffer */
};

ferry_status ferry__cupti_pool_init(struct ferry__cupti_pool *p, size_t buffer_bytes, uint32_t count);
void ferry__cupti_pool_fini(struct ferry__cupti_pool *p);
/* A free buffer (its size in *bytes), or NULL (counted) when all are in use. */
uint8_t *ferry__cupti_pool_get(struct ferry__cupti_pool *p, size_t *bytes);
/* Return a buffer from get(); a pointer not from this pool is refused (-1). */
int ferry__cupti_pool_put(struct ferry__cupti_pool *p, uint8_t *buf);
uint64_t ferry__cupti_pool_exhausted(struct ferry__cupti_pool *p);

/* nsys ENUM_CUDA_MEM_KIND from CUPTI's CUpti_ActivityMemoryKind (0 unknown, 1 pageable, ...):
 * nsys = cupti - 1, with CUPTI's unknown (0) and anything out of range -> 7 (unknown). */
int ferry__cupti_nsys_mem_kind(uint32_t cupti_kind);
/* ferry_copy_kind from CUPTI's CUpti_ActivityMemcpyKind (same numbering 0..10; others 0). */
enum ferry_copy_kind ferry__cupti_copy_kind(uint32_t cupti_kind);
/* A CUPTI timestamp on the run clock: ts - t0_ns. */
int64_t ferry__cupti_run_ns(uint64_t ts, int64_t t0_ns);
/* nsys-style shortName of a demangled kernel name: the function's own name without
 * namespaces, template arguments, parameters or return type; writes at most cap bytes. */
void ferry__cupti_short_name(const char *demangled, char *out, size_t cap);

/* Demangles a C++ name; returns an owned (malloc) string or NULL when it is not one. */
typedef char *(*ferry__cupti_demangle_fn)(const char *mangled);
/* The C++ runtime's demangler (__cxa_demangle, found at run time); NULL when the name is not
 * a mangled C++ name or no C++ runtime is available. */
char *ferry__cupti_demangle(const char *mangled);
/* Name of a CUDA runtime API callback id, or NULL. */
typedef const char *(*ferry__cupti_api_name_fn)(uint32_t cbid);

#define FERRY__CUPTI_MAX_OPEN_MARKERS 1024
#define FERRY__CUPTI_NAME_CACHE 256

struct ferry__cupti_open_marker {
  uint32_t id;
  int64_t start_ns;
  uint32_t thread_id;
  char *name; /* owned */
  int own;    /* domain "ferry": counted at its end, not converted */
};

/* Kernel names: CUPTI shares one name string between the records of a kernel, so demangling
 * is done once per name and cached (direct-mapped on the string's address, checked by value). */
struct ferry__cupti_name {
  char *mangled, *demangled, *short_name; /* owned */
};

/* Conversion state. Not thread-safe: the collector serialises calls with its own mutex. */
struct ferry__cupti_conv {
  ferry_activity_fn sink;
  void *user;
  int64_t t0_ns;
  ferry__cupti_demangle_fn demangle;  /* NULL: names kept as given */
  ferry__cupti_api_name_fn api_name;  /* NULL: runtime calls named "cudaRuntimeApi#<cbid>" */
  struct ferry__cupti_open_marker open[FERRY__CUPTI_MAX_OPEN_MARKERS];
  size_t nopen;
  struct ferry__cupti_name names[FERRY__CUPTI_NAME_CACHE];
  /* CUPTI correlation id -> op tag (ferry_op_tag()), from EXTERNAL_CORRELATION records;
   * direct-mapped on the id, which grows by one per driver call, so recent ids never collide */
  uint32_t *ext_corr;
  uint64_t *ext_tag;
  struct ferry_cupti_stats stats; /* records, delivered, zero_timestamp, unpaired, ignored, attributed */
};

#define FERRY__CUPTI_EXT_SLOTS 65536u

void ferry__cupti_conv_init(struct ferry__cupti_conv *cv, ferry_activity_fn sink, void *user, int64_t t0_ns);
/* Counts still-open ranges as unpaired and releases names. */
void ferry__cupti_conv_fini(struct ferry__cupti_conv *cv);

#ifdef FERRY_HAVE_CUDA
/* Convert one record and deliver it to the sink (or count it as skipped). */
void ferry__cupti_conv_record(struct ferry__cupti_conv *cv, const CUpti_Activity *rec);
#endif /* FERRY_HAVE_CUDA */

#endif
