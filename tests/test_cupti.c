/* profiler/cupti*: the CUPTI collector without a device. The buffer pool (alignment,
 * exhaustion, threads), the value mappings (memory kinds to nsys numbering, copy kinds, run
 * clock, short kernel names), the conversion of CUPTI records filled in here into activities
 * and into nsys-layout rows of a result database, and what ferry_cupti_start() says on a
 * machine without a GPU (or in a build without CUDA). */
#include <pthread.h>
#include <sched.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/alloc.h"
#include "ferry/cupti.h"
#include "ferry/db.h"
#include "ferry/exec.h"
#include "profiler/cupti_convert.h"
#include "testutil.h"

/* ---- start / stop ---------------------------------------------------------------------------- */

static void null_sink(void *user, const struct ferry_activity *a) {
  (void)user, (void)a;
}

static void test_start_without_device(void **state) {
  (void)state;
  ferry_cupti *c = (ferry_cupti *)(uintptr_t)1;
  ferry_status st = ferry_cupti_start(&c, null_sink, NULL, ferry_cupti_clock_ns());
#ifdef FERRY_HAVE_CUDA
  if (st == FERRY_OK) { /* a machine with a GPU: the collector runs and stops cleanly */
    struct ferry_cupti_stats s;
    assert_non_null(c);
    ferry_cupti *second = NULL;
    assert_int_equal(ferry_cupti_start(&second, null_sink, NULL, 0), FERRY_ERR_BUSY);
    assert_null(second);
    assert_int_equal(ferry_cupti_flush(c), FERRY_OK);
    assert_int_equal(ferry_cupti_stop(c, &s), FERRY_OK);
    assert_true(s.delivered <= s.records);
    return;
  }
  /* no device, or ferry's CUDA module (or CUDA's libraries) not to be found: said which */
  assert_true(st == FERRY_ERR_NO_DEVICE || st == FERRY_ERR_UNSUPPORTED);
  assert_true(tu_contains(ferry_last_error(), st == FERRY_ERR_NO_DEVICE ? "no CUDA device" : "CUDA module"));
#else
  assert_int_equal(st, FERRY_ERR_UNSUPPORTED);
  assert_true(tu_contains(ferry_last_error(), "without CUDA"));
#endif
  assert_null(c);
  assert_true(tu_contains(ferry_last_error(), "untraced"));
  /* A collector that never started: everything is a no-op on NULL. */
  struct ferry_cupti_stats s = {.records = 7};
  assert_int_equal(ferry_cupti_stop(NULL, &s), FERRY_OK);
  assert_int_equal(s.records, 0);
  assert_int_equal(ferry_cupti_dropped(NULL), 0);
}

static void test_start_bad_arguments(void **state) {
  (void)state;
  ferry_cupti *c = NULL;
#ifdef FERRY_HAVE_CUDA
  assert_int_equal(ferry_cupti_start(NULL, null_sink, NULL, 0), FERRY_ERR_INVALID);
  assert_int_equal(ferry_cupti_start(&c, NULL, NULL, 0), FERRY_ERR_INVALID);
  struct ferry_cupti_config tiny = {.buffer_bytes = 1024};
  assert_int_equal(ferry_cupti_start_config(&c, null_sink, NULL, 0, &tiny), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "buffer_bytes"));
#else
  assert_int_equal(ferry_cupti_start(&c, null_sink, NULL, 0), FERRY_ERR_UNSUPPORTED);
  assert_int_equal(ferry_cupti_flush(NULL), FERRY_ERR_UNSUPPORTED);
#endif
  assert_null(c);
}

static void test_clock_is_monotonic_ns(void **state) {
  (void)state;
  int64_t a = ferry_cupti_clock_ns(), b = ferry_cupti_clock_ns();
  assert_true(a > 0);
  assert_true(b >= a);
}

/* ---- buffer pool ------------------------------------------------------------------------------- */

static void test_pool_alignment_and_exhaustion(void **state) {
  (void)state;
  struct ferry__cupti_pool p;
  assert_int_equal(ferry__cupti_pool_init(&p, 1001, 3), FERRY_OK); /* rounded down to 1000 */
  uint8_t *got[3];
  for (int i = 0; i < 3; i++) {
    size_t bytes = 0;
    got[i] = ferry__cupti_pool_get(&p, &bytes);
    assert_non_null(got[i]);
    assert_int_equal((uintptr_t)got[i] % FERRY__CUPTI_ALIGN, 0);
    assert_int_equal(bytes, 1000);
    for (int j = 0; j < i; j++) assert_true(got[i] >= got[j] + 1000 || got[j] >= got[i] + 1000);
  }
  size_t bytes = 99;
  assert_null(ferry__cupti_pool_get(&p, &bytes));
  assert_int_equal(bytes, 0);
  assert_null(ferry__cupti_pool_get(&p, &bytes));
  assert_int_equal(ferry__cupti_pool_exhausted(&p), 2);
  /* Foreign and misaligned pointers are refused; a real one comes back once. */
  uint8_t other[16];
  assert_int_equal(ferry__cupti_pool_put(&p, other), -1);
  assert_int_equal(ferry__cupti_pool_put(&p, got[1] + 8), -1);
  assert_int_equal(ferry__cupti_pool_put(&p, NULL), -1);
  assert_int_equal(ferry__cupti_pool_put(&p, got[1]), 0);
  assert_ptr_equal(ferry__cupti_pool_get(&p, &bytes), got[1]);
  for (int i = 0; i < 3; i++) assert_int_equal(ferry__cupti_pool_put(&p, got[i]), 0);
  assert_int_equal(ferry__cupti_pool_put(&p, got[0]), -1); /* more puts than gets */
  ferry__cupti_pool_fini(&p);
  ferry__cupti_pool_fini(&p); /* twice is harmless */

  assert_int_equal(ferry__cupti_pool_init(&p, 4, 2), FERRY_ERR_INVALID);
  assert_int_equal(ferry__cupti_pool_init(&p, 64, 0), FERRY_ERR_INVALID);
  ferry_alloc_fail_after(0);
  assert_int_equal(ferry__cupti_pool_init(&p, 64, 2), FERRY_ERR_NOMEM);
  ferry_alloc_fail_after(1);
  assert_int_equal(ferry__cupti_pool_init(&p, 64, 2), FERRY_ERR_NOMEM);
  ferry_alloc_fail_after(-1);
}

struct pool_thread {
  struct ferry__cupti_pool *pool;
  int tag;
  int failures;
};

/* CUPTI requests and completes buffers from several threads: each thread stamps the buffers
 * it holds and checks nobody else wrote them meanwhile. */
static void *pool_worker(void *arg) {
  struct pool_thread *t = arg;
  for (int i = 0; i < 5000; i++) {
    size_t bytes;
    uint8_t *b = ferry__cupti_pool_get(t->pool, &bytes);
    if (!b) continue;
    memset(b, t->tag, 64);
    sched_yield(); /* let the others run while this thread holds the buffer */
    for (int k = 0; k < 64; k++)
      if (b[k] != t->tag) t->failures++;
    if (ferry__cupti_pool_put(t->pool, b)) t->failures++;
  }
  return NULL;
}

static void test_pool_threads(void **state) {
  (void)state;
  struct ferry__cupti_pool p;
  assert_int_equal(ferry__cupti_pool_init(&p, 64, 2), FERRY_OK);
  pthread_t th[4];
  struct pool_thread t[4];
  for (int i = 0; i < 4; i++) {
    t[i] = (struct pool_thread){.pool = &p, .tag = i + 1};
    assert_int_equal(pthread_create(&th[i], NULL, pool_worker, &t[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(t[i].failures, 0);
  }
  assert_int_equal(p.nfree, 2); /* every buffer came back */
  ferry__cupti_pool_fini(&p);
}

/* ---- value mappings ---------------------------------------------------------------------------- */

static void test_mem_kind_to_nsys(void **state) {
  (void)state;
  /* CUPTI: 0 unknown, 1 pageable, 2 pinned, 3 device, 4 array, 5 managed, 6 device static,
   * 7 managed static.  nsys: 0 pageable, 1 pinned, 2 device, 3 array, 4 managed, 5 device
   * static, 6 managed static, 7 unknown. */
  static const int expect[] = {7, 0, 1, 2, 3, 4, 5, 6};
  for (uint32_t k = 0; k < 8; k++) assert_int_equal(ferry__cupti_nsys_mem_kind(k), expect[k]);
  assert_int_equal(ferry__cupti_nsys_mem_kind(8), 7);
  assert_int_equal(ferry__cupti_nsys_mem_kind(0x7fffffff), 7);
}

static void test_copy_kind(void **state) {
  (void)state;
  assert_int_equal(ferry__cupti_copy_kind(1), FERRY_COPY_HTOD);
  assert_int_equal(ferry__cupti_copy_kind(2), FERRY_COPY_DTOH);
  assert_int_equal(ferry__cupti_copy_kind(8), FERRY_COPY_DTOD);
  assert_int_equal(ferry__cupti_copy_kind(9), FERRY_COPY_HTOH);
  assert_int_equal(ferry__cupti_copy_kind(10), FERRY_COPY_PTOP);
  for (uint32_t k = 0; k <= 10; k++) assert_int_equal(ferry__cupti_copy_kind(k), (int)k);
  assert_int_equal(ferry__cupti_copy_kind(11), FERRY_COPY_UNKNOWN);
  assert_int_equal(ferry__cupti_copy_kind(100), FERRY_COPY_UNKNOWN); /* never ferry's disk kind */
}

static void test_run_clock(void **state) {
  (void)state;
  assert_int_equal(ferry__cupti_run_ns(5000000123ull, 5000000000LL), 123);
  assert_int_equal(ferry__cupti_run_ns(4999999000ull, 5000000000LL), -1000); /* before t0 */
  int64_t big = (int64_t)1 << 62;
  assert_int_equal(ferry__cupti_run_ns((uint64_t)big + 7, big), 7);
}

static void test_short_name(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"void at::native::vectorized_elementwise_kernel<4, at::native::Foo<float>>(int, float*)",
       "vectorized_elementwise_kernel"},
      {"gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>(float*)",
       "gemv2T_kernel_val"},
      {"my_c_kernel", "my_c_kernel"},
      {"(anonymous namespace)::dequant_int4(unsigned char const*, __half*)", "dequant_int4"},
      {"ferry::matmul(float const*, float*, int)", "matmul"},
      {"void k<(char)40>(int)", "k"},
      {"", ""},
  };
  char out[128];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ferry__cupti_short_name(cases[i][0], out, sizeof out);
    assert_string_equal(out, cases[i][1]);
  }
  ferry__cupti_short_name("ferry::a_rather_long_kernel_name(int)", out, 8); /* truncated, terminated */
  assert_int_equal(strlen(out), 7);
  ferry__cupti_short_name(NULL, out, sizeof out);
  assert_string_equal(out, "");
}

static void test_demangle(void **state) {
  (void)state;
  assert_null(ferry__cupti_demangle("plain_c_kernel"));
  assert_null(ferry__cupti_demangle(NULL));
  assert_null(ferry__cupti_demangle("_Z!!not a name"));
  char *d = ferry__cupti_demangle("_ZN5ferry6matmulILi4EEEvPKfPfi");
  if (!d) skip(); /* no C++ runtime on this machine: names stay mangled */
  assert_string_equal(d, "void ferry::matmul<4>(float const*, float*, int)");
  free(d);
}

/* ---- database helpers (no CUDA needed) --------------------------------------------------------- */

struct dbfix {
  char *dir;
  char path[512];
  ferry_db *db;
  int64_t run;
};

static int db_setup(void **state) {
  struct dbfix *f = calloc(1, sizeof *f);
  f->dir = tu_mkdtemp("cupti");
  snprintf(f->path, sizeof f->path, "%s/study.db", f->dir);
  if (ferry_db_open(&f->db, f->path, FERRY_DB_CREATE) != FERRY_OK) return -1;
  struct ferry_run_info info = {.kind = FERRY_RUN_CUDA, .model = "test"};
  if (ferry_db_run_begin(f->db, &info, &f->run) != FERRY_OK) return -1;
  *state = f;
  return 0;
}

static int db_teardown(void **state) {
  struct dbfix *f = *state;
  ferry_db_close(f->db);
  tu_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

static int64_t q1(sqlite3 *s, const char *sql) {
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(s, sql, -1, &q, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(s));
  int64_t v = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
  sqlite3_finalize(q);
  return v;
}

static const char *qs(sqlite3 *s, const char *sql, char *buf, size_t len) {
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(s, sql, -1, &q, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(s));
  buf[0] = '\0';
  if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0))
    snprintf(buf, len, "%s", (const char *)sqlite3_column_text(q, 0));
  sqlite3_finalize(q);
  return buf;
}

/* What the run command stores after a profiled run: lost records and the collector's counts. */
static void test_db_run_dropped_and_meta(void **state) {
  struct dbfix *f = *state;
  assert_int_equal(ferry_db_run_add_dropped(f->db, f->run, 5), FERRY_OK);
  assert_int_equal(ferry_db_run_add_dropped(f->db, f->run, 0), FERRY_OK);
  assert_int_equal(ferry_db_run_meta(f->db, f->run, "CUPTI_STATUS", "off: no CUDA device"), FERRY_OK);
  assert_int_equal(ferry_db_run_meta(f->db, f->run, "CUPTI_ZERO_TIMESTAMP_RECORDS", "2"), FERRY_OK);
  assert_int_equal(ferry_db_run_meta(f->db, f->run + 100, "X", "1"), FERRY_ERR_NOT_FOUND);
  assert_int_equal(ferry_db_run_meta(f->db, f->run, "", "1"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_db_run_finish(f->db, f->run, NULL), FERRY_OK);
  /* After the run finished, an addition goes straight to the row. */
  assert_int_equal(ferry_db_run_add_dropped(f->db, f->run, 3), FERRY_OK);
  assert_int_equal(ferry_db_run_add_dropped(f->db, f->run + 100, 3), FERRY_ERR_NOT_FOUND);
  struct ferry_run_summary *r = NULL;
  assert_int_equal(ferry_db_get_run(f->db, f->run, &r), FERRY_OK);
  assert_int_equal(r->dropped_records, 8);
  ferry_db_runs_free(r, 1);
  sqlite3 *s;
  assert_int_equal(sqlite3_open_v2(f->path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  char buf[128], sql[256];
  snprintf(sql, sizeof sql, "SELECT value FROM META_DATA_EXPORT WHERE runId=%lld AND name='CUPTI_STATUS'",
           (long long)f->run);
  assert_string_equal(qs(s, sql, buf, sizeof buf), "off: no CUDA device");
  snprintf(sql, sizeof sql, "SELECT count(*) FROM META_DATA_EXPORT WHERE runId=%lld", (long long)f->run);
  assert_int_equal(q1(s, sql), 2);
  sqlite3_close(s);
}

#ifdef FERRY_HAVE_CUDA
/* ---- record conversion (CUPTI records filled in by the test) ---------------------------------- */

#define T0 1000000000LL /* the run's t0 on the absolute clock */
#define MAX_GOT 64

/* Deep copies of what the sink received. */
struct got {
  int n;
  struct ferry_activity a[MAX_GOT];
  struct ferry_activity_cuda d[MAX_GOT];
  char name[MAX_GOT][128], kind_name[MAX_GOT][64], mangled[MAX_GOT][128];
};

static void collect(void *user, const struct ferry_activity *act) {
  struct got *g = user;
  if (g->n == MAX_GOT) fail_msg("too many activities");
  int i = g->n++;
  g->a[i] = *act;
  snprintf(g->name[i], sizeof g->name[i], "%s", act->name ? act->name : "(null)");
  snprintf(g->kind_name[i], sizeof g->kind_name[i], "%s", act->kind_name ? act->kind_name : "(null)");
  if (act->cuda) {
    g->d[i] = *act->cuda;
    snprintf(g->mangled[i], sizeof g->mangled[i], "%s", act->cuda->mangled_name ? act->cuda->mangled_name : "(null)");
  }
  g->a[i].name = g->name[i];
  g->a[i].kind_name = g->kind_name[i];
  g->a[i].cuda = act->cuda ? &g->d[i] : NULL;
}

static int demangle_calls;

/* A stand-in for __cxa_demangle, so the expected names do not depend on the C++ runtime. */
static char *fake_demangle(const char *mangled) {
  demangle_calls++;
  if (strcmp(mangled, "_ZN5ferry6matmulILi4EEEvPKfPfi")) return NULL;
  static const char dem[] = "void ferry::matmul<4>(float const*, float*, int)";
  char *out = malloc(sizeof dem);
  memcpy(out, dem, sizeof dem);
  return out;
}

static const char *fake_api_name(uint32_t cbid) { return cbid == 211 ? "cudaLaunchKernel_v7000" : NULL; }

static struct ferry__cupti_conv *new_conv(void *user) {
  struct ferry__cupti_conv *cv = calloc(1, sizeof *cv);
  ferry__cupti_conv_init(cv, collect, user, T0);
  cv->demangle = fake_demangle;
  cv->api_name = fake_api_name;
  return cv;
}

static const char kMangled[] = "_ZN5ferry6matmulILi4EEEvPKfPfi";

static CUpti_ActivityKernel10 kernel_rec(uint64_t start, uint64_t end) {
  CUpti_ActivityKernel10 k;
  memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = start;
  k.end = end;
  k.deviceId = 1;
  k.contextId = 3;
  k.streamId = 13;
  k.gridX = 64, k.gridY = 2, k.gridZ = 1;
  k.blockX = 256, k.blockY = 1, k.blockZ = 1;
  k.registersPerThread = 40;
  k.staticSharedMemory = 1024;
  k.dynamicSharedMemory = 4096;
  k.correlationId = 77;
  k.name = kMangled;
  return k;
}

static CUpti_ActivityMemcpy6 memcpy_rec(uint8_t copy_kind, uint8_t src, uint8_t dst, uint64_t start, uint64_t end) {
  CUpti_ActivityMemcpy6 m;
  memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = copy_kind;
  m.srcKind = src;
  m.dstKind = dst;
  m.bytes = 1 << 20;
  m.start = start;
  m.end = end;
  m.deviceId = 0;
  m.contextId = 1;
  m.streamId = 14;
  m.correlationId = 100 + copy_kind;
  return m;
}

static CUpti_ActivityMarker2 marker_rec(CUpti_ActivityFlag flags, uint32_t id, uint64_t ts, const char *name) {
  CUpti_ActivityMarker2 m;
  memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MARKER;
  m.flags = flags;
  m.id = id;
  m.timestamp = ts;
  m.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
  m.objectId.pt.processId = 1;
  m.objectId.pt.threadId = 4242;
  m.name = name;
  return m;
}

static void test_convert_kernel(void **state) {
  (void)state;
  struct got *g = calloc(1, sizeof *g);
  struct ferry__cupti_conv *cv = new_conv(g);
  demangle_calls = 0;
  CUpti_ActivityKernel10 k = kernel_rec(T0 + 500, T0 + 1500);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&k);
  k.start = T0 + 2000, k.end = T0 + 2600;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&k);
  assert_int_equal(demangle_calls, 1); /* the name is demangled once per kernel */
  assert_int_equal(g->n, 2);
  const struct ferry_activity *a = &g->a[0];
  assert_int_equal(a->kind, FERRY_ACT_KERNEL);
  assert_string_equal(a->name, "void ferry::matmul<4>(float const*, float*, int)");
  assert_string_equal(a->kind_name, "matmul");
  assert_int_equal(a->queue, 13);
  assert_int_equal(a->start_ns, 500);
  assert_int_equal(a->end_ns, 1500);
  assert_int_equal(a->correlation_id, 77);
  assert_int_equal(a->step, -1);
  assert_int_equal(a->layer, -1);
  assert_int_equal(a->expert, -1);
  assert_non_null(a->cuda);
  assert_string_equal(g->mangled[0], kMangled);
  assert_int_equal(a->cuda->device_id, 1);
  assert_int_equal(a->cuda->context_id, 3);
  assert_int_equal(a->cuda->grid[0], 64);
  assert_int_equal(a->cuda->grid[1], 2);
  assert_int_equal(a->cuda->block[0], 256);
  assert_int_equal(a->cuda->registers_per_thread, 40);
  assert_int_equal(a->cuda->static_shared_bytes, 1024);
  assert_int_equal(a->cuda->dynamic_shared_bytes, 4096);
  assert_int_equal(g->a[1].start_ns, 2000);

  /* A kernel whose name does not demangle (extern "C") keeps it; so does a kernel without a
   * demangler at all. */
  CUpti_ActivityKernel10 c = kernel_rec(T0 + 1, T0 + 2);
  c.name = "plain_c_kernel";
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&c);
  assert_string_equal(g->name[2], "plain_c_kernel");
  assert_string_equal(g->kind_name[2], "plain_c_kernel");
  assert_int_equal(cv->stats.records, 3);
  assert_int_equal(cv->stats.delivered, 3);
  ferry__cupti_conv_fini(cv);
  free(cv);
  free(g);
}

/* External correlation: a kernel or copy whose driver call was made under a pushed op tag gets
 * that op's layer and expert; other records keep -1, and so does a tag from another kind. */
static void test_convert_external_correlation(void **state) {
  (void)state;
  /* tags round-trip, and out-of-range fields become "none" */
  int32_t l, x, k;
  ferry_op_tag_split(ferry_op_tag(0x123456789ull, 31, 7, FERRY_K_EXPERT), &l, &x, &k);
  assert_int_equal(l, 31);
  assert_int_equal(x, 7);
  assert_int_equal(k, FERRY_K_EXPERT);
  ferry_op_tag_split(ferry_op_tag(5, -1, 5000, -1), &l, &x, &k);
  assert_int_equal(l, -1);
  assert_int_equal(x, -1);
  assert_int_equal(k, -1);
  assert_int_equal(ferry_op_tag(0x1ffffffffull, -1, -1, -1), 0xffffffffull);

  struct got *g = calloc(1, sizeof *g);
  struct ferry__cupti_conv *cv = new_conv(g);
  CUpti_ActivityExternalCorrelation ext;
  memset(&ext, 0, sizeof ext);
  ext.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  ext.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
  ext.externalId = ferry_op_tag(9, 3, 2, FERRY_K_EXPERT);
  ext.correlationId = 77; /* kernel_rec's */
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&ext);
  ext.externalId = ferry_op_tag(10, -1, -1, -1);
  ext.correlationId = 100 + CUPTI_ACTIVITY_MEMCPY_KIND_HTOD; /* memcpy_rec's */
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&ext);
  ext.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1; /* not ours */
  ext.externalId = ferry_op_tag(11, 5, 5, 0);
  ext.correlationId = 500;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&ext);
  assert_int_equal(g->n, 0); /* correlation records are not activities */

  CUpti_ActivityKernel10 kr = kernel_rec(T0 + 10, T0 + 20);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&kr);
  CUpti_ActivityMemcpy6 m = memcpy_rec(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMORY_KIND_PINNED,
                                       CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, T0 + 30, T0 + 40);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  kr.correlationId = 500; /* tagged under another kind */
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&kr);
  kr.correlationId = 78; /* never tagged */
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&kr);
  kr.correlationId = 77 + FERRY__CUPTI_EXT_SLOTS; /* same slot as 77, another call */
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&kr);
  assert_int_equal(g->n, 5);
  assert_int_equal(g->a[0].layer, 3);
  assert_int_equal(g->a[0].expert, 2);
  assert_int_equal(g->a[1].kind, FERRY_ACT_MEMCPY);
  assert_int_equal(g->a[1].layer, -1); /* copies carry no layer, but are matched */
  for (int i = 2; i < 5; i++) {
    assert_int_equal(g->a[i].layer, -1);
    assert_int_equal(g->a[i].expert, -1);
  }
  assert_int_equal(cv->stats.attributed, 2);
  assert_int_equal(cv->stats.ignored, 1);
  ferry__cupti_conv_fini(cv);
  free(cv);
  free(g);
}

static void test_convert_memcpy_each_kind(void **state) {
  (void)state;
  struct got *g = calloc(1, sizeof *g);
  struct ferry__cupti_conv *cv = new_conv(g);
  /* CUPTI memory kinds: 1 pageable, 2 pinned, 3 device. */
  for (uint8_t k = 0; k <= 11; k++) {
    CUpti_ActivityMemcpy6 m = memcpy_rec(k, k == 1 ? 1 : 2, 3, T0 + 10 * k, T0 + 10 * k + 5);
    ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  }
  assert_int_equal(g->n, 12);
  for (int k = 0; k <= 11; k++) {
    const struct ferry_activity *a = &g->a[k];
    assert_int_equal(a->kind, FERRY_ACT_MEMCPY);
    assert_int_equal(a->copy_kind, k <= 10 ? k : FERRY_COPY_UNKNOWN);
    assert_int_equal(a->bytes, 1 << 20);
    assert_int_equal(a->queue, 14);
    assert_int_equal(a->start_ns, 10 * k);
    assert_int_equal(a->end_ns, 10 * k + 5);
    assert_int_equal(a->correlation_id, 100 + k);
    assert_int_equal(a->cuda->src_kind, k == 1 ? 0 : 1); /* nsys: 0 pageable, 1 pinned */
    assert_int_equal(a->cuda->dst_kind, 2);              /* nsys: 2 device */
    assert_int_equal(a->cuda->context_id, 1);
  }
  assert_int_equal(g->a[1].copy_kind, FERRY_COPY_HTOD);
  assert_int_equal(g->a[2].copy_kind, FERRY_COPY_DTOH);
  assert_int_equal(g->a[10].copy_kind, FERRY_COPY_PTOP);
  ferry__cupti_conv_fini(cv);
  free(cv);
  free(g);
}

static void test_convert_memset_runtime_sync(void **state) {
  (void)state;
  struct got *g = calloc(1, sizeof *g);
  struct ferry__cupti_conv *cv = new_conv(g);
  CUpti_ActivityMemset4 ms;
  memset(&ms, 0, sizeof ms);
  ms.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  ms.value = 0xab;
  ms.bytes = 4096;
  ms.start = T0 + 10, ms.end = T0 + 20;
  ms.deviceId = 2, ms.contextId = 5, ms.streamId = 7, ms.correlationId = 9;
  ms.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&ms);

  CUpti_ActivityAPI api;
  memset(&api, 0, sizeof api);
  api.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  api.cbid = 211;
  api.start = T0 + 30, api.end = T0 + 35;
  api.processId = 1, api.threadId = 555, api.correlationId = 77, api.returnValue = 0;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&api);
  api.cbid = 9999, api.returnValue = 2;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&api);

  for (int t = 1; t <= 4; t++) {
    CUpti_ActivitySynchronization2 s;
    memset(&s, 0, sizeof s);
    s.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    s.type = (CUpti_ActivitySynchronizationType)t;
    s.start = T0 + 100 * t, s.end = T0 + 100 * t + 50;
    s.correlationId = 300 + t, s.contextId = 5, s.streamId = 7, s.cudaEventId = t == 1 ? 17 : 0;
    ferry__cupti_conv_record(cv, (const CUpti_Activity *)&s);
  }
  assert_int_equal(g->n, 7);
  assert_int_equal(g->a[0].kind, FERRY_ACT_MEMSET);
  assert_int_equal(g->a[0].bytes, 4096);
  assert_int_equal(g->a[0].queue, 7);
  assert_int_equal(g->a[0].start_ns, 10);
  assert_int_equal(g->a[0].cuda->mem_kind, 2); /* CUPTI device (3) is nsys device (2) */
  assert_int_equal(g->a[0].cuda->value, 0xab);
  assert_int_equal(g->a[0].cuda->device_id, 2);

  assert_int_equal(g->a[1].kind, FERRY_ACT_RUNTIME);
  assert_string_equal(g->a[1].name, "cudaLaunchKernel_v7000");
  assert_int_equal(g->a[1].queue, -1);
  assert_int_equal(g->a[1].correlation_id, 77);
  assert_int_equal(g->a[1].start_ns, 30);
  assert_int_equal(g->a[1].end_ns, 35);
  assert_int_equal(g->a[1].cuda->thread_id, 555);
  assert_string_equal(g->a[2].name, "cudaRuntimeApi#9999"); /* unknown callback id */
  assert_int_equal(g->a[2].cuda->return_value, 2);

  static const char *const names[] = {"", "event sync", "stream wait event", "stream sync", "context sync"};
  for (int t = 1; t <= 4; t++) {
    const struct ferry_activity *a = &g->a[2 + t];
    assert_int_equal(a->kind, FERRY_ACT_SYNC);
    assert_int_equal(a->cuda->sync_type, t); /* same numbering as nsys ENUM_CUPTI_SYNC_TYPE */
    assert_string_equal(a->name, names[t]);
    assert_int_equal(a->start_ns, 100 * t);
    assert_int_equal(a->correlation_id, 300 + t);
  }
  assert_int_equal(g->a[3].cuda->event_id, 17);
  ferry__cupti_conv_fini(cv);
  free(cv);
  free(g);
}

static void test_convert_markers(void **state) {
  (void)state;
  struct got *g = calloc(1, sizeof *g);
  struct ferry__cupti_conv *cv = new_conv(g);
  /* Nested ranges whose ends arrive in a later buffer, in the other order. */
  CUpti_ActivityMarker2 m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_START, 1, T0 + 100, "step");
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  char layer[] = "layer";
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_START, 2, T0 + 150, layer);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  layer[0] = 'X'; /* CUPTI's buffer is reused after completion: the name must have been copied */
  assert_int_equal(g->n, 0);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_END, 2, T0 + 180, NULL);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_END, 1, T0 + 300, NULL);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  assert_int_equal(g->n, 2);
  assert_int_equal(g->a[0].kind, FERRY_ACT_RANGE);
  assert_string_equal(g->a[0].name, "layer");
  assert_int_equal(g->a[0].start_ns, 150);
  assert_int_equal(g->a[0].end_ns, 180);
  assert_int_equal(g->a[0].queue, -1);
  assert_int_equal(g->a[0].cuda->thread_id, 4242);
  assert_string_equal(g->a[1].name, "step");
  assert_int_equal(g->a[1].start_ns, 100);
  assert_int_equal(g->a[1].end_ns, 300);

  /* An instantaneous mark is an empty range; an end without a start and a sync marker are not. */
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS, 3, T0 + 400, "mark");
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  assert_int_equal(g->n, 3);
  assert_int_equal(g->a[2].start_ns, 400);
  assert_int_equal(g->a[2].end_ns, 400);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_END, 99, T0 + 500, NULL);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_SYNC_ACQUIRE, 5, T0 + 500, NULL);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  assert_int_equal(g->n, 3);
  assert_int_equal(cv->stats.unpaired_markers, 1);
  assert_int_equal(cv->stats.ignored, 1);

  /* A range still open at the end counts as unpaired. */
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_START, 6, T0 + 600, "open");
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  ferry__cupti_conv_fini(cv);
  assert_int_equal(cv->stats.unpaired_markers, 2);
  assert_int_equal(g->n, 3);

  /* ferry's own domain is reported by the executor: counted, never converted (an instant
   * mark, and a range whose end comes without a domain, as CUPTI's END records do) */
  ferry__cupti_conv_init(cv, collect, g, T0);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_START, 7, T0 + 700, "layer L3");
  m.domain = FERRY_NVTX_DOMAIN;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS, 8, T0 + 710, "mark");
  m.domain = FERRY_NVTX_DOMAIN;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_START, 9, T0 + 720, "user range");
  m.domain = "someone-else";
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_END, 7, T0 + 800, NULL);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_END, 9, T0 + 900, NULL);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  assert_int_equal(cv->stats.own_ranges, 2);
  assert_int_equal(cv->stats.unpaired_markers, 0);
  assert_int_equal(g->n, 4);
  assert_string_equal(g->a[3].name, "user range");
  assert_int_equal(g->a[3].start_ns, 720);
  assert_int_equal(g->a[3].end_ns, 900);
  ferry__cupti_conv_fini(cv);
  g->n = 3;

  /* More open ranges than the table holds: the excess is counted, nothing is overwritten. */
  ferry__cupti_conv_init(cv, collect, g, T0);
  for (uint32_t i = 0; i < FERRY__CUPTI_MAX_OPEN_MARKERS + 3; i++) {
    m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_START, 1000 + i, T0 + 1, "deep");
    ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  }
  assert_int_equal(cv->stats.unpaired_markers, 3);
  m = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_END, 1000, T0 + 2, NULL);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  assert_int_equal(g->n, 4);
  assert_string_equal(g->a[3].name, "deep");
  ferry__cupti_conv_fini(cv);
  assert_int_equal(cv->stats.unpaired_markers, 3 + FERRY__CUPTI_MAX_OPEN_MARKERS - 1);
  free(cv);
  free(g);
}

static void test_convert_zero_timestamps(void **state) {
  (void)state;
  struct got *g = calloc(1, sizeof *g);
  struct ferry__cupti_conv *cv = new_conv(g);
  CUpti_ActivityKernel10 k = kernel_rec(0, 0);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&k);
  k = kernel_rec(T0 + 5, 0);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&k);
  CUpti_ActivityMemcpy6 m = memcpy_rec(1, 2, 3, 0, T0 + 9);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  CUpti_ActivityMarker2 mk = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS, 1, 0, "m");
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&mk);
  m = memcpy_rec(1, 2, 3, T0 + 1, T0 + 9); /* a good one among them */
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  CUpti_Activity other = {.kind = CUPTI_ACTIVITY_KIND_DEVICE};
  ferry__cupti_conv_record(cv, &other);
  assert_int_equal(cv->stats.zero_timestamp, 4);
  assert_int_equal(cv->stats.ignored, 1);
  assert_int_equal(cv->stats.records, 6);
  assert_int_equal(cv->stats.delivered, 1);
  assert_int_equal(g->n, 1);
  assert_int_equal(g->a[0].start_ns, 1);
  ferry__cupti_conv_fini(cv);
  free(cv);
  free(g);
}

/* Converted records through ferry_db_activity_sink into the nsys-layout tables. */
static void test_convert_into_database(void **state) {
  struct dbfix *f = *state;
  struct ferry__cupti_conv *cv = calloc(1, sizeof *cv);
  ferry__cupti_conv_init(cv, ferry_db_activity_sink, f->db, T0);
  cv->demangle = fake_demangle;
  cv->api_name = fake_api_name;
  CUpti_ActivityKernel10 k = kernel_rec(T0 + 500, T0 + 1500);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&k);
  CUpti_ActivityMemcpy6 m = memcpy_rec(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
                                       CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, T0 + 100, T0 + 400);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  m = memcpy_rec(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
                 CUPTI_ACTIVITY_MEMORY_KIND_PINNED, T0 + 1600, T0 + 1700);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&m);
  CUpti_ActivityMemset4 ms;
  memset(&ms, 0, sizeof ms);
  ms.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  ms.value = 7, ms.bytes = 256, ms.start = T0 + 50, ms.end = T0 + 60, ms.streamId = 13, ms.correlationId = 5;
  ms.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_MANAGED;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&ms);
  CUpti_ActivityAPI api;
  memset(&api, 0, sizeof api);
  api.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  api.cbid = 211, api.start = T0 + 400, api.end = T0 + 450, api.threadId = 0x123, api.correlationId = 77;
  api.returnValue = 0;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&api);
  CUpti_ActivitySynchronization2 s;
  memset(&s, 0, sizeof s);
  s.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
  s.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
  s.start = T0 + 1500, s.end = T0 + 1800, s.streamId = 14, s.correlationId = 90, s.contextId = 1;
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&s);
  CUpti_ActivityMarker2 mk = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_START, 1, T0 + 0, "step");
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&mk);
  mk = marker_rec(CUPTI_ACTIVITY_FLAG_MARKER_END, 1, T0 + 2000, NULL);
  ferry__cupti_conv_record(cv, (const CUpti_Activity *)&mk);
  ferry__cupti_conv_fini(cv);
  assert_int_equal(cv->stats.delivered, 7);
  free(cv);
  assert_int_equal(ferry_db_run_finish(f->db, f->run, NULL), FERRY_OK);

  sqlite3 *db;
  assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  char buf[256];
  assert_int_equal(q1(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"), 1);
  assert_string_equal(qs(db, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id=k.demangledName",
                         buf, sizeof buf), "void ferry::matmul<4>(float const*, float*, int)");
  assert_string_equal(qs(db, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id=k.shortName",
                         buf, sizeof buf), "matmul");
  assert_string_equal(qs(db, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id=k.mangledName",
                         buf, sizeof buf), kMangled);
  assert_string_equal(qs(db, "SELECT start||','||end||','||streamId||','||correlationId||','||deviceId||','||contextId"
                             "||','||gridX||','||gridY||','||gridZ||','||blockX||','||registersPerThread||','||"
                             "staticSharedMemory||','||dynamicSharedMemory FROM CUPTI_ACTIVITY_KIND_KERNEL",
                         buf, sizeof buf), "500,1500,13,77,1,3,64,2,1,256,40,1024,4096");
  /* Memory kinds in nsys numbering: the pageable source (CUPTI 1) is 0, not derived from the
   * copy direction; pinned (CUPTI 2) is 1; device (CUPTI 3) is 2. */
  assert_string_equal(qs(db, "SELECT group_concat(copyKind||':'||srcKind||'>'||dstKind||'@'||start, ' ') FROM "
                             "(SELECT * FROM CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY start)", buf, sizeof buf),
                      "1:0>2@100 2:2>1@1600");
  assert_int_equal(q1(db, "SELECT sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY"), 2 << 20);
  assert_string_equal(qs(db, "SELECT memKind||','||value||','||bytes||','||streamId FROM CUPTI_ACTIVITY_KIND_MEMSET",
                         buf, sizeof buf), "4,7,256,13"); /* managed: CUPTI 5, nsys 4 */
  assert_string_equal(qs(db, "SELECT s.value||','||r.start||','||r.end||','||r.correlationId||','||r.returnValue||','||"
                             "(r.globalTid & 16777215) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON "
                             "s.id=r.nameId", buf, sizeof buf), "cudaLaunchKernel_v7000,400,450,77,0,291");
  assert_int_equal(q1(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
                          "ON k.correlationId = r.correlationId"), 1); /* the nsys launch-latency join works */
  assert_string_equal(qs(db, "SELECT syncType||','||streamId||','||start||','||end FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
                         buf, sizeof buf), "3,14,1500,1800");
  assert_string_equal(qs(db, "SELECT text||','||start||','||end||','||eventType FROM NVTX_EVENTS", buf, sizeof buf),
                      "step,0,2000,59");
  sqlite3_close(db);
}
#endif /* FERRY_HAVE_CUDA */

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_start_without_device),
      cmocka_unit_test(test_start_bad_arguments),
      cmocka_unit_test(test_clock_is_monotonic_ns),
      cmocka_unit_test(test_pool_alignment_and_exhaustion),
      cmocka_unit_test(test_pool_threads),
      cmocka_unit_test(test_mem_kind_to_nsys),
      cmocka_unit_test(test_copy_kind),
      cmocka_unit_test(test_run_clock),
      cmocka_unit_test(test_short_name),
      cmocka_unit_test(test_demangle),
      cmocka_unit_test_setup_teardown(test_db_run_dropped_and_meta, db_setup, db_teardown),
#ifdef FERRY_HAVE_CUDA
      cmocka_unit_test(test_convert_kernel),
      cmocka_unit_test(test_convert_external_correlation),
      cmocka_unit_test(test_convert_memcpy_each_kind),
      cmocka_unit_test(test_convert_memset_runtime_sync),
      cmocka_unit_test(test_convert_markers),
      cmocka_unit_test(test_convert_zero_timestamps),
      cmocka_unit_test_setup_teardown(test_convert_into_database, db_setup, db_teardown),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
