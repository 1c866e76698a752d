/* profiler/: the result database. Schema and migrations, activity mapping onto the nsys tables,
 * the thread-safe sink, crash consistency (SIGKILL mid-run), unwritable files and folders, a
 * full database, statistics and comparison, Chrome-trace export and nsys import. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/alloc.h"
#include "ferry/db.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h"
#include "testutil.h"

struct fixture {
  char *dir;
  char path[512];
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  f->dir = tu_mkdtemp("db");
  snprintf(f->path, sizeof f->path, "%s/study.db", f->dir);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  tu_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

/* First column of the first row as an integer (-1 if no row). */
static int64_t q1(sqlite3 *s, const char *sql_text) {
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(s, sql_text, -1, &q, NULL) != SQLITE_OK) fail_msg("%s: %s", sql_text, sqlite3_errmsg(s));
  int64_t v = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
  sqlite3_finalize(q);
  return v;
}

/* First column of the first row as text, copied into buf. */
static const char *qs(sqlite3 *s, const char *sql_text, char *buf, size_t len) {
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(s, sql_text, -1, &q, NULL) != SQLITE_OK) fail_msg("%s: %s", sql_text, sqlite3_errmsg(s));
  buf[0] = '\0';
  if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0))
    snprintf(buf, len, "%s", (const char *)sqlite3_column_text(q, 0));
  sqlite3_finalize(q);
  return buf;
}

static sqlite3 *raw_open(const char *path) {
  sqlite3 *s;
  assert_int_equal(sqlite3_open(path, &s), SQLITE_OK);
  return s;
}

static struct ferry_activity act(enum ferry_activity_kind kind, const char *name, int32_t queue, int64_t start,
                                 int64_t end) {
  struct ferry_activity a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.name = name;
  a.queue = queue;
  a.start_ns = start;
  a.end_ns = end;
  a.step = a.layer = a.expert = -1;
  return a;
}

static ferry_db *open_rw(const char *path) {
  ferry_db *db = NULL;
  ferry_status st = ferry_db_open(&db, path, FERRY_DB_CREATE);
  if (st != FERRY_OK) fail_msg("open %s: %s", path, ferry_last_error());
  return db;
}

static int64_t begin(ferry_db *db, const char *hash) {
  struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = "tiny-moe", .hardware = "h100-pcie4",
                                .trace = "synthetic", .config_json = "{\"block\":4}", .config_hash = hash};
  int64_t id = 0;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_OK);
  assert_true(id > 0);
  return id;
}

/* --- schema ------------------------------------------------------------------------------- */

static void test_create_schema(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  sqlite3 *s = ferry__db_sqlite(db);
  char buf[128];
  assert_int_equal(q1(s, "PRAGMA user_version"), FERRY_DB_SCHEMA_VERSION);
  assert_int_equal(q1(s, "PRAGMA application_id"), FERRY_DB_APPLICATION_ID);
  assert_string_equal(qs(s, "PRAGMA journal_mode", buf, sizeof buf), "wal");
  assert_int_equal(q1(s, "PRAGMA synchronous"), 1); /* NORMAL */
  assert_string_equal(qs(s, "SELECT name FROM ENUM_NSYS_EVENT_TYPE WHERE id=59", buf, sizeof buf), "NvtxPushPopRange");
  assert_string_equal(qs(s, "SELECT name FROM ENUM_CUDA_MEM_KIND WHERE id=2", buf, sizeof buf),
                      "CUDA_MEMOPR_MEMORY_KIND_DEVICE");
  assert_string_equal(qs(s, "SELECT label FROM ENUM_CUDA_MEM_KIND WHERE id=1", buf, sizeof buf), "Pinned");
  assert_string_equal(qs(s, "SELECT name FROM ENUM_CUDA_MEMCPY_OPER WHERE id=1", buf, sizeof buf),
                      "CUDA_MEMCPY_KIND_HTOD");
  assert_string_equal(qs(s, "SELECT label FROM ENUM_CUDA_MEMCPY_OPER WHERE id=100", buf, sizeof buf), "Disk-to-Host");
  assert_int_equal(q1(s, "SELECT count(*) FROM ENUM_CUPTI_SYNC_TYPE"), 5);
  /* runs.kind is any executor's name (the writer checks it against the registry's form); the
   * schema keeps it non-empty and short */
  assert_int_not_equal(sqlite3_exec(s, "INSERT INTO runs(kind,started_at) VALUES('','x')", NULL, NULL, NULL), SQLITE_OK);
  assert_int_not_equal(sqlite3_exec(s, "INSERT INTO runs(kind,started_at) VALUES('a-name-of-sixteen','x')", NULL, NULL,
                                    NULL),
                       SQLITE_OK);
  /* TARGET_INFO_GPU rows: known figures stored, unknown ones NULL, unknown runs refused */
  int64_t run = begin(db, "gpu0");
  struct ferry_device_info gpu = {.name = "NVIDIA H200", .sm_count = 132, .compute_major = 9, .compute_minor = 0,
                                  .is_discrete = 1, .total_memory_bytes = 150754820096ull,
                                  .memory_bandwidth_bytes_per_s = 4800000000000ull, .clock_rate_hz = 1980000000ull};
  assert_int_equal(ferry_db_add_gpu(db, run, 0, &gpu), FERRY_OK);
  assert_string_equal(qs(s, "SELECT name FROM TARGET_INFO_GPU", buf, sizeof buf), "NVIDIA H200");
  assert_int_equal(q1(s, "SELECT smCount * 100 + computeMajor * 10 + computeMinor FROM TARGET_INFO_GPU"), 13290);
  assert_int_equal(q1(s, "SELECT totalMemory = 150754820096 AND clockRate = 1980000000 FROM TARGET_INFO_GPU"), 1);
  assert_int_equal(q1(s, "SELECT (l2CacheSize IS NULL) + (uuid IS NULL) + (busLocation IS NULL) FROM TARGET_INFO_GPU"), 3);
  struct ferry_device_info back;
  assert_int_equal(ferry_db_get_gpu(db, run, 0, &back), FERRY_OK);
  assert_memory_equal(&back, &gpu, sizeof gpu);
  assert_int_equal(ferry_db_get_gpu(db, run, 1, &back), FERRY_ERR_NOT_FOUND);
  assert_int_equal(ferry_db_add_gpu(db, run + 100, 0, &gpu), FERRY_ERR_NOT_FOUND);
  assert_int_equal(ferry_db_add_gpu(db, run, -1, &gpu), FERRY_ERR_INVALID);
  assert_int_equal(q1(s, "SELECT count(*) FROM TARGET_INFO_GPU"), 1);
  ferry_db_close(db);
  /* Reopening an up-to-date database changes nothing; read-only works too. */
  db = open_rw(f->path);
  ferry_db_close(db);
  assert_int_equal(ferry_db_open(&db, f->path, FERRY_DB_READ_ONLY), FERRY_OK);
  ferry_db_close(db);
}

static void test_migration_from_v1(void **state) {
  struct fixture *f = *state;
  sqlite3 *s = raw_open(f->path);
  assert_int_equal(ferry__db_migrate(s, f->path, 1, NULL), FERRY_OK);
  assert_int_equal(q1(s, "PRAGMA user_version"), 1);
  assert_int_equal(q1(s, "SELECT count(*) FROM sqlite_master WHERE name='requests_run'"), 0);
  sqlite3_close(s);
  ferry_db *db = open_rw(f->path);
  s = ferry__db_sqlite(db);
  assert_int_equal(q1(s, "PRAGMA user_version"), FERRY_DB_SCHEMA_VERSION);
  assert_int_equal(q1(s, "SELECT count(*) FROM sqlite_master WHERE name='requests_run'"), 1);
  ferry_db_close(db);
  int count;
  const struct ferry__migration *m = ferry__db_migrations(&count);
  assert_int_equal(count, FERRY_DB_SCHEMA_VERSION);
  for (int i = 0; i < count; i++) assert_int_equal(m[i].version, i + 1);
}

/* A sweep combination is complete at most once, by a rule of the database: a second finish
 * is recorded as a failed duplicate; plain runs of one configuration may still repeat. */
static void test_one_complete_run_per_sweep_combination(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  sqlite3 *s = ferry__db_sqlite(db);
  struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = "m", .config_hash = "c0ffee", .sweep_key = "c0ffee"};
  int64_t a, b, c;
  assert_int_equal(ferry_db_run_begin(db, &info, &a), FERRY_OK);
  assert_int_equal(ferry_db_run_begin(db, &info, &b), FERRY_OK); /* an orphan of a killed sweep, say */
  assert_int_equal(ferry_db_run_finish(db, a, NULL), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, b, NULL), FERRY_ERR_EXISTS);
  assert_true(tu_contains(ferry_db_errmsg(db), "already complete in run 1"));
  char buf[256], sql[128];
  snprintf(sql, sizeof sql, "SELECT error FROM runs WHERE id = %lld AND complete = 0 AND finished_at IS NOT NULL",
           (long long)b);
  assert_true(tu_contains(qs(s, sql, buf, sizeof buf), "duplicate"));
  /* the rule is the database's, whoever writes */
  snprintf(sql, sizeof sql, "UPDATE runs SET complete = 1 WHERE id = %lld", (long long)b);
  assert_int_equal(sqlite3_exec(s, sql, NULL, NULL, NULL) & 0xff, SQLITE_CONSTRAINT);
  /* a failed run of the combination is fine, and so are repeats outside sweeps */
  assert_int_equal(ferry_db_run_begin(db, &info, &c), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, c, "budget exceeded"), FERRY_OK);
  info.sweep_key = NULL;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(ferry_db_run_begin(db, &info, &c), FERRY_OK);
    assert_int_equal(ferry_db_run_finish(db, c, NULL), FERRY_OK);
  }
  assert_int_equal(q1(s, "SELECT count(*) FROM runs WHERE config_hash = 'c0ffee' AND complete = 1"), 3);
  assert_int_equal(q1(s, "SELECT count(*) FROM runs WHERE sweep_key = 'c0ffee' AND complete = 1"), 1);
  ferry_db_close(db);
}

/* Version 7 to 8 rebuilds runs without its CHECK of three kinds: every row and column survives,
 * the indexes are back, and a run of any registered executor can be written. */
static void test_migration_free_kind(void **state) {
  struct fixture *f = *state;
  sqlite3 *s = raw_open(f->path);
  assert_int_equal(ferry__db_migrate(s, f->path, 7, NULL), FERRY_OK);
  assert_int_equal(sqlite3_exec(s,
                                "INSERT INTO runs(id, kind, started_at, finished_at, complete, model, config_hash, "
                                "dropped_records, sweep_key, repeat_group, repeat_index, source_sha256) "
                                "VALUES(7, 'cuda', 'a', 'b', 1, 'm', 'h', 3, 'k', 'g', 2, 'ab12');"
                                "INSERT INTO runs(id, kind, started_at) VALUES(9, 'nsys-import', 'c');"
                                "INSERT INTO requests(runId, req_id, arrival_ns) VALUES(7, 1, 5);"
                                "INSERT INTO engine_events(runId, t_ns, kind, action) VALUES(7, 9, 'io', 'retry');",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  assert_int_not_equal(sqlite3_exec(s, "INSERT INTO runs(kind, started_at) VALUES('recorder', 'x')", NULL, NULL, NULL),
                       SQLITE_OK); /* version 7 knows three kinds */
  sqlite3_close(s);
  ferry_db *db = open_rw(f->path);
  s = ferry__db_sqlite(db);
  assert_int_equal(q1(s, "PRAGMA user_version"), FERRY_DB_SCHEMA_VERSION);
  assert_int_equal(q1(s, "SELECT count(*) FROM runs"), 2);
  assert_int_equal(q1(s, "SELECT count(*) FROM runs WHERE id = 7 AND kind = 'cuda' AND finished_at = 'b' AND complete = 1 "
                         "AND model = 'm' AND config_hash = 'h' AND dropped_records = 3 AND sweep_key = 'k' "
                         "AND repeat_group = 'g' AND repeat_index = 2 AND source_sha256 = 'ab12'"),
                   1);
  assert_int_equal(q1(s, "SELECT count(*) FROM requests JOIN runs ON runs.id = requests.runId"), 1);
  assert_int_equal(q1(s, "SELECT count(*) FROM engine_events JOIN runs ON runs.id = engine_events.runId"), 1);
  assert_int_equal(q1(s, "SELECT count(*) FROM sqlite_master WHERE name IN ('runs_config_hash', 'runs_sweep_complete', "
                         "'runs_repeat_group', 'runs_source')"),
                   4);
  assert_int_equal(q1(s, "SELECT count(*) FROM sqlite_master WHERE name = 'runs_v8'"), 0);
  struct ferry_run_info info = {.executor = "recorder", .model = "m"};
  int64_t id;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_OK);
  assert_int_equal(id, 10);
  char buf[64], sql[64];
  snprintf(sql, sizeof sql, "SELECT kind FROM runs WHERE id = %lld", (long long)id);
  assert_string_equal(qs(s, sql, buf, sizeof buf), "recorder");
  info.executor = "Not A Name";
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_db_errmsg(db), "not an executor name"));
  ferry_db_close(db);
}

/* Version 3 to 4 keeps every row, repeated complete configurations included. */
static void test_migration_keeps_repeats(void **state) {
  struct fixture *f = *state;
  sqlite3 *s = raw_open(f->path);
  assert_int_equal(ferry__db_migrate(s, f->path, 3, NULL), FERRY_OK);
  for (int i = 0; i < 3; i++)
    assert_int_equal(sqlite3_exec(s, "INSERT INTO runs(kind, started_at, complete, config_hash) VALUES('sim', 'x', 1, 'h')",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
  sqlite3_close(s);
  ferry_db *db = open_rw(f->path);
  s = ferry__db_sqlite(db);
  assert_int_equal(q1(s, "PRAGMA user_version"), FERRY_DB_SCHEMA_VERSION);
  assert_int_equal(q1(s, "SELECT count(*) FROM runs WHERE complete = 1 AND config_hash = 'h' AND sweep_key IS NULL"), 3);
  assert_int_equal(q1(s, "SELECT count(*) FROM sqlite_master WHERE name = 'runs_sweep_complete'"), 1);
  ferry_db_close(db);
}

static void test_newer_schema_refused(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  int64_t run = begin(db, "h");
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  ferry_db_close(db);
  sqlite3 *s = raw_open(f->path);
  assert_int_equal(sqlite3_exec(s, "PRAGMA user_version=99", NULL, NULL, NULL), SQLITE_OK);
  int64_t runs = q1(s, "SELECT count(*) FROM runs");
  sqlite3_close(s);
  struct stat before, after;
  assert_int_equal(stat(f->path, &before), 0);
  for (int flags = 0; flags < 2; flags++) {
    db = (ferry_db *)1;
    assert_int_equal(ferry_db_open(&db, f->path, flags ? FERRY_DB_CREATE : FERRY_DB_READ_ONLY), FERRY_ERR_SCHEMA);
    assert_null(db);
    assert_true(tu_contains(ferry_last_error(), f->path));
    assert_true(tu_contains(ferry_last_error(), "newer"));
  }
  assert_int_equal(stat(f->path, &after), 0);
  assert_int_equal(before.st_size, after.st_size);
  s = raw_open(f->path);
  assert_int_equal(q1(s, "PRAGMA user_version"), 99);
  assert_int_equal(q1(s, "SELECT count(*) FROM runs"), runs);
  sqlite3_close(s);
}

static void test_not_a_ferry_database(void **state) {
  struct fixture *f = *state;
  static const char text[] = "this is a CSV file,not a database\n1,2\n";
  tu_write_file(f->path, text, strlen(text));
  ferry_db *db;
  for (int flags = 0; flags < 2; flags++) {
    assert_int_equal(ferry_db_open(&db, f->path, flags ? FERRY_DB_CREATE : FERRY_DB_READ_ONLY), FERRY_ERR_FORMAT);
    assert_true(tu_contains(ferry_last_error(), "not a ferry database"));
    assert_true(tu_contains(ferry_last_error(), f->path));
  }
  char *back;
  size_t len;
  assert_int_equal(ferry__read_file(f->path, 1 << 20, &back, &len, NULL), FERRY_OK);
  assert_int_equal(len, strlen(text));
  assert_memory_equal(back, text, len);
  free(back);

  /* An SQLite file of someone else's (e.g. an nsys export) is not touched either. */
  char other[600];
  snprintf(other, sizeof other, "%s/other.sqlite", f->dir);
  sqlite3 *s = raw_open(other);
  assert_int_equal(sqlite3_exec(s, "CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT)", NULL, NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(s);
  assert_int_equal(ferry_db_open(&db, other, FERRY_DB_CREATE), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "not a ferry database"));
  s = raw_open(other);
  assert_int_equal(q1(s, "PRAGMA user_version"), 0);
  assert_int_equal(q1(s, "SELECT count(*) FROM sqlite_master"), 1);
  sqlite3_close(s);
  /* Read-only open of a missing file is an error, not a new file. */
  char missing[600];
  snprintf(missing, sizeof missing, "%s/missing.db", f->dir);
  assert_int_equal(ferry_db_open(&db, missing, FERRY_DB_READ_ONLY), FERRY_ERR_NOT_FOUND);
  assert_int_not_equal(access(missing, F_OK), 0);
}

/* --- writing ------------------------------------------------------------------------------ */

/* One complete run with an activity of every kind, a request, a step and memory samples; the
 * last activity written is left in *last. */
static int64_t write_activity_run(ferry_db *db, struct ferry_activity *last) {
  int64_t run = begin(db, "cfg-1");
  struct ferry_activity a = act(FERRY_ACT_KERNEL, "matmul", 0, 1000, 3000);
  a.flops = 2.5e9;
  a.bytes = 4096;
  a.correlation_id = 7;
  a.step = 3;
  a.layer = 11;
  a.expert = 5;
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_MEMCPY, "layer.11.weights", 1, 500, 900);
  a.copy_kind = FERRY_COPY_HTOD;
  a.bytes = 1 << 20;
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_MEMCPY, "disk read", 3, 100, 400);
  a.copy_kind = FERRY_COPY_DISK_TO_HOST;
  a.bytes = 2 << 20;
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_MEMSET, "kv clear", 0, 50, 60);
  a.bytes = 64;
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_RANGE, "step", -1, 0, 5000);
  a.step = 3;
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_SYNC, "wait weights", 0, 950, 1000);
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_MEMORY, NULL, -1, 1200, 1200);
  a.tier = FERRY_TIER_HOST;
  a.used_bytes = 123456;
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_KERNEL, "matmul", 0, 3000, 4000); /* same name: same StringIds row */
  ferry_db_activity_sink(db, &a);
  struct ferry_request_row rq = {1, 0, 100, 900, 16, 8, 0};
  assert_int_equal(ferry_db_add_request(db, run, &rq), FERRY_OK);
  struct ferry_step_row sr = {0, 0, 5000, 1, 16, 2 << 20, 1 << 20, 0, 3, 1, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  assert_int_equal(ferry_db_add_step(db, run, &sr), FERRY_OK);
  assert_int_equal(ferry_db_add_memory(db, run, 0, FERRY_TIER_DEVICE, 1 << 30), FERRY_OK);
  assert_int_equal(ferry_db_add_memory(db, run, 0, (enum ferry_tier)7, 1), FERRY_ERR_INVALID);
  assert_int_equal(ferry_db_flush(db), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  *last = a;
  return run;
}

/* The Nsight Systems tables and ferry's own as write_activity_run() left them. */
static void check_activity_tables(sqlite3 *s) {
  char buf[256];
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"), 2);
  assert_string_equal(qs(s, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id=k.shortName"
                            " WHERE k.start=1000", buf, sizeof buf), "matmul");
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE demangledName=shortName"), 2);
  assert_int_equal(q1(s, "SELECT count(*) FROM StringIds WHERE value='matmul'"), 1);
  assert_int_equal(q1(s, "SELECT flops = 2.5e9 AND bytes=4096 AND step=3 AND layer=11 AND expert=5 AND"
                         " correlationId=7 AND streamId=0 FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start=1000"), 1);
  assert_int_equal(q1(s, "SELECT step IS NULL FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start=3000"), 1);
  assert_int_equal(q1(s, "SELECT copyKind*10000+srcKind*100+dstKind FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE streamId=1"),
                   1 * 10000 + 1 * 100 + 2);
  assert_int_equal(q1(s, "SELECT copyKind*10000+srcKind*100+dstKind FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE streamId=3"),
                   100 * 10000 + 100 * 100 + 1);
  assert_string_equal(qs(s, "SELECT e.label FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER e"
                            " ON e.id=m.copyKind WHERE m.streamId=1", buf, sizeof buf), "Host-to-Device");
  assert_int_equal(q1(s, "SELECT bytes FROM CUPTI_ACTIVITY_KIND_MEMSET"), 64);
  assert_string_equal(qs(s, "SELECT text FROM NVTX_EVENTS WHERE eventType=59", buf, sizeof buf), "step");
  assert_int_equal(q1(s, "SELECT end FROM NVTX_EVENTS"), 5000);
  assert_int_equal(q1(s, "SELECT syncType FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"), 1);
  assert_int_equal(q1(s, "SELECT used_bytes FROM memory WHERE tier='host'"), 123456);
  assert_int_equal(q1(s, "SELECT used_bytes FROM memory WHERE tier='device'"), 1 << 30);
  assert_int_equal(q1(s, "SELECT output_tokens FROM requests"), 8);
  assert_int_equal(q1(s, "SELECT stall_ns FROM steps"), 50);
  assert_int_equal(q1(s, "SELECT count(*) FROM runs WHERE complete=1 AND finished_at IS NOT NULL AND error IS NULL"), 1);
  assert_int_equal(q1(s, "SELECT count(*) FROM TARGET_INFO_SESSION_START_TIME WHERE utcEpochNs > 0"), 1);
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId <> 1"), 0);

}

static void test_activity_mapping(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  struct ferry_activity a;
  int64_t run = write_activity_run(db, &a);
  sqlite3 *s = ferry__db_sqlite(db);
  char buf[256];
  check_activity_tables(s);
  /* A failed run keeps its error and stays incomplete; records after finish are dropped. */
  int64_t run2 = begin(db, "cfg-2");
  assert_int_equal(ferry_db_run_finish(db, run2, "out of device memory"), FERRY_OK);
  ferry_db_activity_sink(db, &a);
  assert_int_equal(ferry_db_flush(db), FERRY_OK);
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"), 2);
  assert_string_equal(qs(s, "SELECT error FROM runs WHERE id=2", buf, sizeof buf), "out of device memory");
  assert_int_equal(q1(s, "SELECT complete FROM runs WHERE id=2"), 0);
  assert_int_equal(ferry_db_run_finish(db, 99, NULL), FERRY_ERR_NOT_FOUND);

  int64_t found = 0;
  assert_int_equal(ferry_db_find_complete_run(db, "cfg-1", &found), FERRY_OK);
  assert_int_equal(found, run);
  assert_int_equal(ferry_db_find_complete_run(db, "cfg-2", &found), FERRY_ERR_NOT_FOUND);
  assert_int_equal(ferry_db_find_complete_run(db, "nope", &found), FERRY_ERR_NOT_FOUND);

  struct ferry_run_summary *runs;
  size_t n;
  assert_int_equal(ferry_db_list_runs(db, &runs, &n), FERRY_OK);
  assert_int_equal(n, 2);
  assert_string_equal(runs[0].kind, "sim");
  assert_string_equal(runs[0].model, "tiny-moe");
  assert_int_equal(runs[0].requests, 1);
  assert_int_equal(runs[0].complete, 1);
  assert_string_equal(runs[1].error, "out of device memory");
  ferry_db_runs_free(runs, n);
  ferry_db_close(db);

  /* Read-only handles refuse writes. */
  assert_int_equal(ferry_db_open(&db, f->path, FERRY_DB_READ_ONLY), FERRY_OK);
  struct ferry_run_info info = {.kind = FERRY_RUN_HOST};
  int64_t id;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_ERR_INVALID);
  ferry_db_close(db);
}

struct thread_arg {
  ferry_db *db;
  int index, count;
};

static void *sink_thread(void *p) {
  struct thread_arg *t = p;
  char name[32];
  for (int i = 0; i < t->count; i++) {
    snprintf(name, sizeof name, "op%d", i % 50);
    struct ferry_activity a = act(FERRY_ACT_KERNEL, name, t->index, i, i + 1);
    a.correlation_id = (uint64_t)t->index * 1000000 + (uint64_t)i;
    ferry_db_activity_sink(t->db, &a);
  }
  return NULL;
}

static void test_sink_threads(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  int64_t run = begin(db, NULL);
  enum { THREADS = 4, PER = 10000 };
  pthread_t th[THREADS];
  struct thread_arg args[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (struct thread_arg){db, i, PER};
    assert_int_equal(pthread_create(&th[i], NULL, sink_thread, &args[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  sqlite3 *s = ferry__db_sqlite(db);
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"), THREADS * PER);
  assert_int_equal(q1(s, "SELECT count(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_KERNEL"), THREADS * PER);
  assert_int_equal(q1(s, "SELECT count(*) FROM StringIds"), 50);
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s"
                         " ON s.id=k.shortName WHERE s.value IS NULL"), 0);
  for (int i = 0; i < THREADS; i++) {
    char sql_text[128];
    snprintf(sql_text, sizeof sql_text, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE streamId=%d", i);
    assert_int_equal(q1(s, sql_text), PER);
  }
  assert_int_equal(q1(s, "SELECT dropped_records FROM runs"), 0);
  ferry_db_close(db);
}

/* --- robustness --------------------------------------------------------------------------- */

enum { KILL_AFTER_BATCHES = 5 };

static void child_writer(const char *path, int notify_fd) {
  ferry_db *db;
  if (ferry_db_open(&db, path, FERRY_DB_CREATE) != FERRY_OK) _exit(10);
  struct ferry_run_info info = {.kind = FERRY_RUN_HOST, .model = "victim"};
  int64_t run;
  if (ferry_db_run_begin(db, &info, &run) != FERRY_OK) _exit(11);
  uint64_t corr = 0;
  for (int batch = 0;; batch++) {
    for (int i = 0; i < FERRY_DB_BATCH_ROWS; i++) {
      struct ferry_activity a = act(FERRY_ACT_KERNEL, i % 2 ? "matmul" : "attention", 0, (int64_t)corr,
                                    (int64_t)corr + 1);
      a.correlation_id = corr++;
      ferry_db_activity_sink(db, &a);
    }
    if (ferry_db_flush(db) != FERRY_OK) _exit(12);
    if (batch + 1 == KILL_AFTER_BATCHES) {
      char c = 'k';
      if (write(notify_fd, &c, 1) != 1) _exit(13);
    }
  }
}

static void test_sigkill_mid_run(void **state) {
  struct fixture *f = *state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    child_writer(f->path, fds[1]);
    _exit(0);
  }
  close(fds[1]);
  char c;
  assert_int_equal(read(fds[0], &c, 1), 1); /* N batches committed */
  close(fds[0]);
  assert_int_equal(kill(pid, SIGKILL), 0);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  ferry_db *db = open_rw(f->path);
  sqlite3 *s = ferry__db_sqlite(db);
  char buf[64];
  assert_string_equal(qs(s, "PRAGMA integrity_check", buf, sizeof buf), "ok");
  assert_int_equal(q1(s, "SELECT count(*) FROM runs"), 1);
  assert_int_equal(q1(s, "SELECT complete FROM runs"), 0);
  assert_int_equal(q1(s, "SELECT finished_at IS NULL FROM runs"), 1);
  int64_t rows = q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId=1");
  assert_true(rows >= (int64_t)KILL_AFTER_BATCHES * FERRY_DB_BATCH_ROWS);
  assert_int_equal(rows % FERRY_DB_BATCH_ROWS, 0); /* whole batches only */
  /* Every committed batch is intact: correlation ids 0..rows-1, each once. */
  assert_int_equal(q1(s, "SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_KERNEL"), rows - 1);
  assert_int_equal(q1(s, "SELECT count(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_KERNEL"), rows);
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s"
                         " ON s.id=k.shortName WHERE s.value IS NULL"), 0);
  /* The database keeps working: a sweep would rerun the configuration. */
  int64_t run = begin(db, "again");
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  struct ferry_run_summary *r;
  assert_int_equal(ferry_db_get_run(db, 1, &r), FERRY_OK);
  assert_int_equal(r->complete, 0);
  assert_null(r->finished_at);
  ferry_db_runs_free(r, 1);
  ferry_db_close(db);
}

/* Run fn in a child process without root's override of file permissions. */
static int as_unprivileged(void (*fn)(struct fixture *), struct fixture *f) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(77);
    fn(f);
    _exit(0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

static void ro_file_child(struct fixture *f) {
  ferry_db *db;
  ferry_status st = ferry_db_open(&db, f->path, FERRY_DB_CREATE);
  if (st != FERRY_ERR_IO) _exit(1);
  if (!tu_contains(ferry_last_error(), f->path) || !tu_contains(ferry_last_error(), "read-only")) _exit(2);
  /* Reading still works. */
  if (ferry_db_open(&db, f->path, FERRY_DB_READ_ONLY) != FERRY_OK) {
    fprintf(stderr, "read-only open: %s\n", ferry_last_error());
    _exit(3);
  }
  struct ferry_run_summary *runs;
  size_t n;
  if (ferry_db_list_runs(db, &runs, &n) != FERRY_OK || n != 1) _exit(4);
  ferry_db_runs_free(runs, n);
  ferry_db_close(db);
}

static void ro_dir_child(struct fixture *f) {
  char path[700];
  snprintf(path, sizeof path, "%s/locked/new.db", f->dir);
  ferry_db *db;
  ferry_status st = ferry_db_open(&db, path, FERRY_DB_CREATE);
  if (st != FERRY_ERR_IO) _exit(1);
  if (!tu_contains(ferry_last_error(), path)) _exit(2);
  if (access(path, F_OK) == 0) _exit(3);
}

/* Plan and sweep workers open one new study database together: every process must get it, WAL
 * and the current schema, however their opens interleave (the switch to WAL of a new file cannot
 * wait in SQLite's busy handler; ferry_db_open() waits for it). */
static void test_concurrent_create(void **state) {
  struct fixture *f = *state;
  enum { ROUNDS = 15, PROCS = 6 };
  for (int round = 0; round < ROUNDS; round++) {
    char path[600];
    snprintf(path, sizeof path, "%s/together-%d.db", f->dir, round);
    pid_t pid[PROCS];
    for (int i = 0; i < PROCS; i++) {
      pid[i] = fork();
      assert_true(pid[i] >= 0);
      if (pid[i] == 0) {
        ferry_db *db = NULL;
        ferry_status st = ferry_db_open(&db, path, FERRY_DB_CREATE);
        int64_t id = 0;
        struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = "m", .hardware = "h", .trace = "t",
                                      .config_json = "{}", .config_hash = NULL};
        if (st == FERRY_OK) st = ferry_db_run_begin(db, &info, &id);
        if (st == FERRY_OK) st = ferry_db_run_finish(db, id, NULL);
        if (st != FERRY_OK)
          fprintf(stderr, "process %d, round %d: %s\n", i, round, db ? ferry_db_errmsg(db) : ferry_last_error());
        ferry_db_close(db);
        _exit(st == FERRY_OK ? 0 : 1);
      }
    }
    for (int i = 0; i < PROCS; i++) {
      int ws = 0;
      assert_int_equal(waitpid(pid[i], &ws, 0), pid[i]);
      assert_true(WIFEXITED(ws));
      assert_int_equal(WEXITSTATUS(ws), 0);
    }
    sqlite3 *s = raw_open(path);
    assert_int_equal(q1(s, "SELECT count(*) FROM runs WHERE complete = 1"), PROCS);
    assert_int_equal(q1(s, "PRAGMA user_version"), FERRY_DB_SCHEMA_VERSION);
    char mode[16];
    assert_string_equal(qs(s, "PRAGMA journal_mode", mode, sizeof mode), "wal");
    sqlite3_close(s);
  }
}

static void test_read_only_places(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  int64_t run = begin(db, "x");
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  ferry_db_close(db);
  assert_int_equal(chmod(f->dir, 0755), 0);
  assert_int_equal(chmod(f->path, 0444), 0);
  assert_int_equal(as_unprivileged(ro_file_child, f), 0);

  char locked[600];
  snprintf(locked, sizeof locked, "%s/locked", f->dir);
  assert_int_equal(mkdir(locked, 0555), 0);
  assert_int_equal(chmod(locked, 0555), 0);
  assert_int_equal(as_unprivileged(ro_dir_child, f), 0);
  chmod(locked, 0755);

  /* Nothing was corrupted. */
  chmod(f->path, 0644);
  db = open_rw(f->path);
  char buf[32];
  assert_string_equal(qs(ferry__db_sqlite(db), "PRAGMA integrity_check", buf, sizeof buf), "ok");
  assert_int_equal(q1(ferry__db_sqlite(db), "SELECT count(*) FROM runs WHERE complete=1"), 1);
  ferry_db_close(db);

  /* A folder where the file should be. */
  assert_int_equal(ferry_db_open(&db, f->dir, FERRY_DB_CREATE), FERRY_ERR_IO);
  assert_true(tu_contains(ferry_last_error(), "folder"));
}

static void test_full_database(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  int64_t run = begin(db, "full");
  for (int i = 0; i < FERRY_DB_BATCH_ROWS; i++) {
    struct ferry_activity a = act(FERRY_ACT_KERNEL, "matmul", 0, i, i + 1);
    a.correlation_id = (uint64_t)i;
    ferry_db_activity_sink(db, &a);
  }
  assert_int_equal(ferry_db_flush(db), FERRY_OK);
  sqlite3 *s = ferry__db_sqlite(db);
  int64_t pages = q1(s, "PRAGMA page_count");
  char pragma[64];
  snprintf(pragma, sizeof pragma, "PRAGMA max_page_count=%lld", (long long)pages + 2);
  assert_int_equal(sqlite3_exec(s, pragma, NULL, NULL, NULL), SQLITE_OK);
  /* The sink's automatic flush fails first; the failure is reported by the next flush. */
  for (int i = 0; i < 3 * FERRY_DB_BATCH_ROWS; i++) {
    struct ferry_activity a = act(FERRY_ACT_KERNEL, i % 2 ? "big kernel name one" : "big kernel name two", 0, i, i);
    a.correlation_id = 100000 + (uint64_t)i;
    ferry_db_activity_sink(db, &a);
  }
  assert_int_equal(ferry_db_flush(db), FERRY_ERR_NO_SPACE);
  assert_true(tu_contains(ferry_db_errmsg(db), "full"));
  assert_true(tu_contains(ferry_db_errmsg(db), f->path));
  /* Direct flush of API rows reports it too. */
  struct ferry_step_row sr = {0};
  for (int i = 0; i < FERRY_DB_BATCH_ROWS - 1; i++) {
    sr.step = i;
    assert_int_equal(ferry_db_add_step(db, run, &sr), FERRY_OK);
  }
  assert_int_equal(ferry_db_add_step(db, run, &sr), FERRY_ERR_NO_SPACE); /* the batch-full flush */
  assert_true(tu_contains(ferry_db_errmsg(db), "step rows"));
  char buf[32];
  assert_string_equal(qs(s, "PRAGMA integrity_check", buf, sizeof buf), "ok");
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"), FERRY_DB_BATCH_ROWS);
  assert_int_equal(q1(s, "SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_KERNEL"), FERRY_DB_BATCH_ROWS - 1);
  /* Once space is back the run can be closed, recording what was lost. */
  assert_int_equal(sqlite3_exec(s, "PRAGMA max_page_count=1073741823", NULL, NULL, NULL), SQLITE_OK);
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  assert_true(q1(s, "SELECT dropped_records FROM runs") >= 3 * FERRY_DB_BATCH_ROWS - FERRY_DB_BATCH_ROWS);
  ferry_db_close(db);
}

/* --- statistics and comparison --------------------------------------------------------------- */

/* Run with 100 requests: TTFT = (i+1) ms, e2e = TTFT + 10 ms * scale, 11 tokens each. */
static int64_t make_run(ferry_db *db, double scale, uint64_t peak_device) {
  int64_t run = begin(db, NULL);
  for (int i = 0; i < 100; i++) {
    int64_t arr = (int64_t)i * 1000000;
    int64_t ft = arr + (int64_t)(i + 1) * 1000000;
    struct ferry_request_row r = {i, arr, ft, ft + (int64_t)(10e6 * scale), 32, 11, 0};
    assert_int_equal(ferry_db_add_request(db, run, &r), FERRY_OK);
  }
  for (int i = 0; i < 10; i++) {
    struct ferry_step_row st = {i, i * 1000, i * 1000 + 900, 4, 4, 100, 200, 300, 1, 1, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(ferry_db_add_step(db, run, &st), FERRY_OK);
    assert_int_equal(ferry_db_add_memory(db, run, i * 1000, FERRY_TIER_DEVICE, peak_device / 10 * (uint64_t)(i + 1)),
                     FERRY_OK);
  }
  assert_int_equal(ferry_db_add_memory(db, run, 0, FERRY_TIER_HOST, 5000), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  return run;
}

static void test_stats_and_compare(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  int64_t a = make_run(db, 1.0, 1000);
  int64_t b = make_run(db, 1.2, 1000); /* 20% slower decode */
  int64_t c = make_run(db, 1.0, 1000);
  struct ferry_run_stats sa, sb, sc;
  assert_int_equal(ferry_db_run_stats(db, a, &sa), FERRY_OK);
  assert_int_equal(ferry_db_run_stats(db, b, &sb), FERRY_OK);
  assert_int_equal(ferry_db_run_stats(db, c, &sc), FERRY_OK);
  assert_int_equal(sa.requests, 100);
  assert_int_equal(sa.ttft_ns.count, 100);
  assert_true(fabs(sa.ttft_ns.mean - 50.5e6) < 1);
  assert_true(fabs(sa.ttft_ns.p50 - 50.5e6) < 1);  /* between 50 and 51 ms */
  assert_true(fabs(sa.ttft_ns.p90 - 90.1e6) < 1);  /* 0.9*99 = 89.1 -> 90 + 0.1 */
  assert_true(fabs(sa.ttft_ns.p99 - 99.01e6) < 1);
  assert_true(fabs(sa.tpot_ns.p50 - 1e6) < 1);     /* 10 ms over 10 tokens */
  assert_true(fabs(sa.e2e_ns.p50 - 60.5e6) < 1);
  assert_int_equal(sa.output_tokens, 1100);
  /* last finish = 99 ms + 100 ms + 10 ms */
  assert_true(fabs(sa.throughput_tok_s - 1100.0 / 0.209) < 1e-6);
  assert_int_equal(sa.peak_bytes[FERRY_TIER_DEVICE], 1000);
  assert_int_equal(sa.peak_bytes[FERRY_TIER_HOST], 5000);
  assert_int_equal(sa.bytes_disk, 1000);
  assert_int_equal(sa.bytes_h2d, 2000);
  assert_int_equal(sa.stall_ns, 100);
  struct ferry_metric_delta d[FERRY_DB_MAX_METRICS];
  size_t n;
  assert_int_equal(ferry_db_compare(&sa, &sc, 5.0, d, &n), 0);
  assert_true(n >= 17);
  int regressed = ferry_db_compare(&sa, &sb, 5.0, d, &n);
  assert_true(regressed > 0);
  int saw_tpot = 0;
  for (size_t i = 0; i < n; i++) {
    if (!strcmp(d[i].name, "tpot_p50_ms")) {
      saw_tpot = 1;
      assert_true(d[i].regressed);
      assert_true(fabs(d[i].change_pct - 20.0) < 1e-6);
    }
    if (!strcmp(d[i].name, "ttft_p50_ms")) assert_false(d[i].regressed);
  }
  assert_true(saw_tpot);
  /* B faster than A is not a regression; a 25% tolerance absorbs the 20% slowdown. */
  assert_int_equal(ferry_db_compare(&sb, &sa, 5.0, d, &n), 0);
  assert_int_equal(ferry_db_compare(&sa, &sb, 25.0, d, &n), 0);
  assert_int_equal(ferry_db_run_stats(db, 42, &sa), FERRY_ERR_NOT_FOUND);
  ferry_db_close(db);
}

/* --- export and import -------------------------------------------------------------------- */

static void test_export_trace(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  int64_t other = begin(db, NULL); /* rows of another run must not leak in */
  struct ferry_activity a = act(FERRY_ACT_KERNEL, "other-run", 9, 0, 1);
  ferry_db_activity_sink(db, &a);
  assert_int_equal(ferry_db_run_finish(db, other, NULL), FERRY_OK);
  int64_t run = begin(db, NULL);
  a = act(FERRY_ACT_KERNEL, "matmul \"q\"", 0, 1000000, 1002000);
  a.flops = 1e9;
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_MEMCPY, NULL, 1, 1000500, 1001500);
  a.copy_kind = FERRY_COPY_HTOD;
  a.bytes = 4096;
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_RANGE, "step", -1, 1000000, 1003000);
  ferry_db_activity_sink(db, &a);
  a = act(FERRY_ACT_MEMORY, NULL, -1, 1001000, 1001000);
  a.tier = FERRY_TIER_DEVICE;
  a.used_bytes = 777;
  ferry_db_activity_sink(db, &a);
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  char out[600];
  snprintf(out, sizeof out, "%s/trace.json", f->dir);
  assert_int_equal(ferry_db_export_trace(db, run, out), FERRY_OK);
  assert_int_equal(ferry_db_export_trace(db, 77, out), FERRY_ERR_NOT_FOUND);
  ferry_db_close(db);

  char *text;
  size_t len;
  assert_int_equal(ferry__read_file(out, 1 << 24, &text, &len, NULL), FERRY_OK);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  assert_string_equal(cJSON_GetObjectItem(root, "displayTimeUnit")->valuestring, "ns");
  cJSON *events = cJSON_GetObjectItem(root, "traceEvents");
  assert_true(cJSON_IsArray(events));
  int kernels = 0, copies = 0, ranges = 0, counters = 0, meta = 0, process_name = 0;
  int nvtx_tid = -1, kernel_tid = -1, copy_tid = -1;
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
    const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
    assert_non_null(cJSON_GetObjectItem(e, "pid"));
    if (!strcmp(ph, "M")) {
      meta++;
      if (!strcmp(name, "process_name")) process_name++;
      continue;
    }
    assert_false(!strcmp(name, "other-run"));
    double ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
    assert_true(ts >= 0);
    if (!strcmp(ph, "X")) {
      const char *cat = cJSON_GetObjectItem(e, "cat")->valuestring;
      double dur = cJSON_GetObjectItem(e, "dur")->valuedouble;
      int tid = cJSON_GetObjectItem(e, "tid")->valueint;
      if (!strcmp(cat, "kernel")) {
        kernels++;
        kernel_tid = tid;
        assert_string_equal(name, "matmul \"q\"");
        assert_true(fabs(ts - 0.0) < 1e-9);
        assert_true(fabs(dur - 2.0) < 1e-9); /* 2000 ns = 2 us */
        assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "flops")->valuedouble == 1e9);
      } else if (!strcmp(cat, "memcpy")) {
        copies++;
        copy_tid = tid;
        assert_true(fabs(ts - 0.5) < 1e-9);
        assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "bytes")->valueint, 4096);
        assert_true(tu_contains(name, "Host-to-Device"));
      } else if (!strcmp(cat, "nvtx")) {
        ranges++;
        nvtx_tid = tid;
        assert_string_equal(name, "step");
        assert_true(fabs(dur - 3.0) < 1e-9);
      }
    } else if (!strcmp(ph, "C")) {
      counters++;
      assert_string_equal(name, "memory device");
      assert_true(fabs(ts - 1.0) < 1e-9);
      assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "bytes")->valueint, 777);
    }
  }
  assert_int_equal(kernels, 1);
  assert_int_equal(copies, 1);
  assert_int_equal(ranges, 1);
  assert_int_equal(counters, 1);
  assert_int_equal(process_name, 2); /* the run, and its requests */
  assert_true(meta >= 4); /* process, NVTX track, two queues */
  assert_int_equal(kernel_tid, 0);
  assert_int_equal(copy_tid, 1);
  assert_true(nvtx_tid != kernel_tid && nvtx_tid != copy_tid);
  cJSON_Delete(root);
}

/* Build a small database in the layout of `nsys export --type sqlite`. variant 0: current
 * columns (demangledName/shortName, NVTX textId); 1: older ones (kernel `name`, NVTX `text`). */
static void build_nsys_fixture(const char *path, int variant, const char *omit_table) {
  sqlite3 *s;
  assert_int_equal(sqlite3_open(path, &s), SQLITE_OK);
  char sql_text[4096];
  const char *kernel_names = variant == 0 ? "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,"
                                            " mangledName INTEGER,"
                                          : "name INTEGER NOT NULL,";
  snprintf(sql_text, sizeof sql_text,
           "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);"
           "INSERT INTO StringIds VALUES (1,'ampere_sgemm_128x64_nn'),(2,'sgemm'),(3,'forward'),(4,'cudaMemcpyAsync');"
           "CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);"
           "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION','3.16.1'),"
           " ('EXPORT_PRODUCT_VERSION','2024.6.2.225');"
           "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,"
           " deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,"
           " correlationId INTEGER, globalPid INTEGER, %s registersPerThread INTEGER NOT NULL,"
           " gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL,"
           " blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL,"
           " dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER NOT NULL,"
           " localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, weirdNewColumn TEXT);"
           "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,"
           " deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,"
           " globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER);"
           "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (100,300,0,1,14,11,5,1048576,1,1,2);"
           "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,"
           " eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,"
           " returnValue INTEGER NOT NULL);"
           "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (90,110,0,5,11,4,0);"
           "CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,"
           " text TEXT, globalTid INTEGER %s);"
           "CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT,"
           " totalMemory INTEGER, smCount INTEGER, computeMajor INTEGER, computeMinor INTEGER);"
           "INSERT INTO TARGET_INFO_GPU VALUES (0,0,'NVIDIA H100 PCIe',85000000000,114,9,0);",
           kernel_names, variant == 0 ? ", textId INTEGER, domainId INTEGER" : "");
  assert_int_equal(sqlite3_exec(s, sql_text, NULL, NULL, NULL), SQLITE_OK);
  if (variant == 0) {
    assert_int_equal(sqlite3_exec(s,
                                  "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES"
                                  " (1000,2000,0,1,7,12,5,1,2,NULL,32,128,1,1,256,1,1,0,0,0,0,1,'x'),"
                                  " (3000,3500,0,1,7,13,5,1,2,NULL,32,128,1,1,256,1,1,0,0,0,0,2,'y');"
                                  "INSERT INTO NVTX_EVENTS VALUES (900,4000,59,NULL,5,3,0);",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
  } else {
    assert_int_equal(sqlite3_exec(s,
                                  "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES"
                                  " (1000,2000,0,1,7,12,5,1,32,128,1,1,256,1,1,0,0,0,0,1,'x'),"
                                  " (3000,3500,0,1,7,13,5,1,32,128,1,1,256,1,1,0,0,0,0,2,'y');"
                                  "INSERT INTO NVTX_EVENTS VALUES (900,4000,59,'forward',5);",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
  }
  if (omit_table) {
    snprintf(sql_text, sizeof sql_text, "DROP TABLE %s", omit_table);
    assert_int_equal(sqlite3_exec(s, sql_text, NULL, NULL, NULL), SQLITE_OK);
  }
  sqlite3_close(s);
}

/* An nsys export of variant `variant` (build_nsys_fixture) imported as one complete run. */
static void check_import_variant(const struct fixture *f, ferry_db *db, sqlite3 *s, int variant) {
  char buf[256];
  char exp[600];
  snprintf(exp, sizeof exp, "%s/export%d.sqlite", f->dir, variant);
  build_nsys_fixture(exp, variant, NULL);
  int64_t run = 0;
  assert_int_equal(ferry_db_import_nsys(db, exp, NULL, &run), FERRY_OK);
  char sql_text[512];
  snprintf(sql_text, sizeof sql_text, "SELECT kind || '|' || complete || '|' || hardware FROM runs WHERE id=%lld",
           (long long)run);
  assert_string_equal(qs(s, sql_text, buf, sizeof buf), "nsys-import|1|NVIDIA H100 PCIe");
  snprintf(sql_text, sizeof sql_text, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId=%lld", (long long)run);
  assert_int_equal(q1(s, sql_text), 2);
  snprintf(sql_text, sizeof sql_text,
           "SELECT group_concat(s.value, ',') FROM (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId=%lld"
           " ORDER BY start) k JOIN StringIds s ON s.id = k.shortName", (long long)run);
  assert_string_equal(qs(s, sql_text, buf, sizeof buf),
                      variant == 0 ? "sgemm,sgemm" : "ampere_sgemm_128x64_nn,ampere_sgemm_128x64_nn");
  snprintf(sql_text, sizeof sql_text,
           "SELECT gridX*1000+blockX FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId=%lld AND start=1000", (long long)run);
  assert_int_equal(q1(s, sql_text), 128 * 1000 + 256);
  snprintf(sql_text, sizeof sql_text,
           "SELECT coalesce(n.text, v.value) FROM NVTX_EVENTS n LEFT JOIN StringIds v ON v.id = n.textId"
           " WHERE n.runId=%lld AND n.eventType=59", (long long)run);
  assert_string_equal(qs(s, sql_text, buf, sizeof buf), "forward");
  snprintf(sql_text, sizeof sql_text, "SELECT bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId=%lld AND copyKind=1",
           (long long)run);
  assert_int_equal(q1(s, sql_text), 1048576);
  snprintf(sql_text, sizeof sql_text,
           "SELECT v.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds v ON v.id=r.nameId WHERE r.runId=%lld",
           (long long)run);
  assert_string_equal(qs(s, sql_text, buf, sizeof buf), "cudaMemcpyAsync");
  snprintf(sql_text, sizeof sql_text, "SELECT value FROM META_DATA_EXPORT WHERE runId=%lld AND name='EXPORT_SCHEMA_VERSION'",
           (long long)run);
  assert_string_equal(qs(s, sql_text, buf, sizeof buf), "3.16.1");
}

/* ferry's own NVTX ranges in an nsys export (domain "ferry", step as int64 payload) get
 * their step, layer and expert back; another domain's and payload-less ranges do not */
static void check_import_ferry_ranges(const struct fixture *f, ferry_db *db, sqlite3 *s) {
  char buf[256];
  char exp[600];
  snprintf(exp, sizeof exp, "%s/export-ferry.sqlite", f->dir);
  build_nsys_fixture(exp, 0, NULL);
  sqlite3 *x;
  assert_int_equal(sqlite3_open(exp, &x), SQLITE_OK);
  assert_int_equal(sqlite3_exec(x,
                                "ALTER TABLE NVTX_EVENTS ADD COLUMN int64Value INTEGER;"
                                "INSERT INTO StringIds VALUES (10,'ferry'),(11,'layer L3');"
                                "INSERT INTO NVTX_EVENTS VALUES"
                                " (10,NULL,75,NULL,5,10,1,NULL), (11,NULL,75,'user',5,NULL,2,NULL),"
                                " (100,900,60,'step 4',5,NULL,1,4),"
                                " (110,300,60,NULL,5,11,1,4),"
                                " (120,200,60,'block fetch L7',5,NULL,1,4),"
                                " (130,250,60,'expert fetch L12 E5',5,NULL,1,4),"
                                " (140,150,59,'matmul',6,NULL,1,NULL),"
                                " (160,170,60,'layer L9',5,NULL,2,4);",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(x);
  int64_t run = 0;
  assert_int_equal(ferry_db_import_nsys(db, exp, NULL, &run), FERRY_OK);
  char sql_text[512];
  static const struct {
    int64_t start;
    const char *want;
  } rows[] = {{100, "4|-|-"}, {110, "4|3|-"}, {120, "4|7|-"}, {130, "4|12|5"}, {140, "-|-|-"}, {160, "-|-|-"}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    snprintf(sql_text, sizeof sql_text,
             "SELECT coalesce(step,'-') || '|' || coalesce(layer,'-') || '|' || coalesce(expert,'-')"
             " FROM NVTX_EVENTS WHERE runId=%lld AND start=%lld",
             (long long)run, (long long)rows[i].start);
    assert_string_equal(qs(s, sql_text, buf, sizeof buf), rows[i].want);
  }
}

/* Bad inputs: one error naming file (and table), nothing written. */
static void check_import_bad_inputs(const struct fixture *f, ferry_db *db, sqlite3 *s) {
  int64_t runs_before = q1(s, "SELECT count(*) FROM runs");
  int64_t kernels_before = q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL");
  static const char *const required[] = {"META_DATA_EXPORT", "StringIds", "CUPTI_ACTIVITY_KIND_KERNEL"};
  for (int i = 0; i < 3; i++) {
    char exp[600];
    snprintf(exp, sizeof exp, "%s/missing%d.sqlite", f->dir, i);
    build_nsys_fixture(exp, 0, required[i]);
    int64_t run;
    assert_int_equal(ferry_db_import_nsys(db, exp, NULL, &run), FERRY_ERR_FORMAT);
    assert_true(tu_contains(ferry_db_errmsg(db), exp));
    assert_true(tu_contains(ferry_db_errmsg(db), required[i]));
  }
  char junk[600];
  snprintf(junk, sizeof junk, "%s/junk.sqlite", f->dir);
  tu_write_file(junk, "not sqlite at all, just some bytes that are long enough to matter....", 70);
  int64_t run;
  assert_int_equal(ferry_db_import_nsys(db, junk, NULL, &run), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_db_errmsg(db), junk));
  snprintf(junk, sizeof junk, "%s/absent.sqlite", f->dir);
  assert_int_equal(ferry_db_import_nsys(db, junk, NULL, &run), FERRY_ERR_NOT_FOUND);
  assert_int_not_equal(access(junk, F_OK), 0);
  assert_int_equal(q1(s, "SELECT count(*) FROM runs"), runs_before);
  assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL"), kernels_before);
  assert_int_equal(q1(s, "SELECT count(*) FROM pragma_database_list"), 2); /* main + temp: export detached */
}

static void test_import_nsys(void **state) {
  struct fixture *f = *state;
  ferry_db *db = open_rw(f->path);
  sqlite3 *s = ferry__db_sqlite(db);
  /* A string already present must keep one id. */
  int64_t own = begin(db, NULL);
  struct ferry_activity a = act(FERRY_ACT_KERNEL, "sgemm", 0, 0, 1);
  ferry_db_activity_sink(db, &a);
  assert_int_equal(ferry_db_run_finish(db, own, NULL), FERRY_OK);
  for (int variant = 0; variant < 2; variant++) check_import_variant(f, db, s, variant);
  assert_int_equal(q1(s, "SELECT count(*) FROM StringIds WHERE value='sgemm'"), 1);
  check_import_ferry_ranges(f, db, s);
  check_import_bad_inputs(f, db, s);
  ferry_db_close(db);
}

/* Every allocation failure on the write path is an error or a counted drop, never a crash or
 * a leak (ASan checks the latter). */
static void test_allocation_failures(void **state) {
  struct fixture *f = *state;
  for (int64_t n = 0; n < 150; n++) {
    unlink(f->path);
    ferry_alloc_fail_after(n);
    ferry_db *db = NULL;
    ferry_status st = ferry_db_open(&db, f->path, FERRY_DB_CREATE);
    if (st == FERRY_OK) {
      struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = "m"};
      int64_t run;
      if (ferry_db_run_begin(db, &info, &run) == FERRY_OK) {
        char name[16];
        for (int i = 0; i < 40; i++) {
          snprintf(name, sizeof name, "op%d", i);
          struct ferry_activity a = act(FERRY_ACT_KERNEL, name, 0, i, i + 1);
          ferry_db_activity_sink(db, &a);
        }
        struct ferry_request_row r = {1, 0, 1, 2, 3, 4, 0};
        ferry_db_add_request(db, run, &r);
        ferry_db_run_finish(db, run, NULL);
        sqlite3 *s = ferry__db_sqlite(db);
        /* Whatever was lost is accounted for. */
        assert_int_equal(q1(s, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL") +
                             q1(s, "SELECT dropped_records FROM runs"), 40);
      }
    } else {
      if (st != FERRY_ERR_NOMEM) fail_msg("n=%lld: %s", (long long)n, ferry_last_error());
      assert_null(db);
    }
    ferry_db_close(db);
  }
  ferry_alloc_fail_after(-1);
}

/* Version 8 to 9 adds requests.replica and steps.replica: older rows read NULL, new rows carry
 * the replica given (a negative one is NULL), and the read-only readers still see every run. */
static void test_migration_replica(void **state) {
  struct fixture *f = *state;
  sqlite3 *s = raw_open(f->path);
  assert_int_equal(ferry__db_migrate(s, f->path, 8, NULL), FERRY_OK);
  assert_int_equal(sqlite3_exec(s,
                                "INSERT INTO runs(id, kind, started_at, complete) VALUES(3, 'sim', 'a', 1);"
                                "INSERT INTO requests(runId, req_id, arrival_ns) VALUES(3, 1, 5), (3, 2, 6);"
                                "INSERT INTO steps(runId, step, start_ns, end_ns) VALUES(3, 0, 0, 9);",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  assert_int_not_equal(sqlite3_exec(s, "SELECT replica FROM requests", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(s);
  ferry_db *db = open_rw(f->path);
  s = ferry__db_sqlite(db);
  assert_int_equal(q1(s, "PRAGMA user_version"), FERRY_DB_SCHEMA_VERSION);
  assert_int_equal(q1(s, "SELECT count(*) FROM requests WHERE runId = 3 AND replica IS NULL"), 2);
  assert_int_equal(q1(s, "SELECT count(*) FROM steps WHERE runId = 3 AND replica IS NULL"), 1);
  struct ferry_run_info info = {.executor = "host", .model = "m"};
  int64_t id;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_OK);
  for (int i = 0; i < 5; i++) {
    const struct ferry_request_row r = {.req_id = i, .arrival_ns = i, .replica = i < 4 ? i % 2 : -1};
    const struct ferry_step_row st = {.step = i, .end_ns = 1, .replica = i % 2};
    assert_int_equal(ferry_db_add_request(db, id, &r), FERRY_OK);
    assert_int_equal(ferry_db_add_step(db, id, &st), FERRY_OK);
  }
  assert_int_equal(ferry_db_run_finish(db, id, NULL), FERRY_OK);
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM requests WHERE runId = %lld AND replica = 1", (long long)id);
  assert_int_equal(q1(s, sql), 2);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM requests WHERE runId = %lld AND replica IS NULL", (long long)id);
  assert_int_equal(q1(s, sql), 1);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE runId = %lld AND replica = 0", (long long)id);
  assert_int_equal(q1(s, sql), 3);
  /* per replica: the rows with a replica, in order, with their steps; none for the old run */
  struct ferry_replica_stats *reps = NULL;
  size_t n_reps = 9;
  assert_int_equal(ferry_db_run_replicas(db, id, &reps, &n_reps), FERRY_OK);
  assert_int_equal(n_reps, 2);
  assert_int_equal(reps[0].replica, 0);
  assert_int_equal(reps[1].replica, 1);
  assert_int_equal(reps[0].requests, 2);
  assert_int_equal(reps[1].requests, 2);
  assert_int_equal(reps[0].steps, 3);
  assert_int_equal(reps[1].steps, 2);
  ferry_db_replicas_free(reps);
  assert_int_equal(ferry_db_run_replicas(db, 3, &reps, &n_reps), FERRY_OK);
  assert_int_equal(n_reps, 0);
  assert_null(reps);
  ferry_db_close(db);
}

static void set_disk_write(struct ferry_step_row *st, uint64_t v) { st->bytes_disk_write = v; }
static void set_peers(struct ferry_step_row *st, uint64_t v) { st->bytes_peers = v; }

/* What every migration test of a new steps column checks once its old file was read: merged into
 * a current database, the old run's step (where `old_row`) copies with `column` NULL; opened to
 * write, the file is migrated, its row keeps NULL (not recorded), and a new run's three steps
 * carry 1, 2 and 3 MiB in it (set() writes the field). Returns the migrated database, open, and
 * the new run's id. */
static ferry_db *merge_then_migrate(struct fixture *f, const char *old_row, const char *column,
                                    void (*set)(struct ferry_step_row *, uint64_t), int64_t *id) {
  char merged[600], sql[256];
  snprintf(merged, sizeof merged, "%s/merged.db", f->dir);
  ferry_db *db = open_rw(merged);
  struct ferry_db_merge_stats ms;
  assert_int_equal(ferry_db_merge(db, f->path, &ms), FERRY_OK);
  assert_int_equal(ms.runs_added, 1);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE %s AND %s IS NULL", old_row, column);
  assert_int_equal(q1(ferry__db_sqlite(db), sql), 1);
  ferry_db_close(db);
  db = open_rw(f->path);
  sqlite3 *s = ferry__db_sqlite(db);
  assert_int_equal(q1(s, "PRAGMA user_version"), FERRY_DB_SCHEMA_VERSION);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE runId = 4 AND %s IS NULL", column);
  assert_int_equal(q1(s, sql), 1);
  struct ferry_run_info info = {.executor = "sim", .model = "m"};
  assert_int_equal(ferry_db_run_begin(db, &info, id), FERRY_OK);
  for (int i = 0; i < 3; i++) {
    struct ferry_step_row st = {.step = i, .end_ns = 1};
    set(&st, (uint64_t)(i + 1) << 20);
    assert_int_equal(ferry_db_add_step(db, *id, &st), FERRY_OK);
  }
  assert_int_equal(ferry_db_run_finish(db, *id, NULL), FERRY_OK);
  snprintf(sql, sizeof sql, "SELECT sum(%s) FROM steps WHERE runId = %lld", column, (long long)*id);
  assert_int_equal(q1(s, sql), 6 << 20);
  return db;
}

/* Version 9 to 10 adds steps.bytes_disk_write. A version-9 file opened read-only is read as it
 * is (its run's figures, no migration); merged into a current database its steps copy with the
 * column NULL; opened to write it is migrated, its rows keep NULL (not recorded) and new rows
 * carry the bytes given. */
static void test_migration_disk_write(void **state) {
  struct fixture *f = *state;
  sqlite3 *s = raw_open(f->path);
  assert_int_equal(ferry__db_migrate(s, f->path, 9, NULL), FERRY_OK);
  assert_int_equal(sqlite3_exec(s,
                                "INSERT INTO runs(id, kind, started_at, complete) VALUES(4, 'sim', 'a', 1);"
                                "INSERT INTO steps(runId, step, start_ns, end_ns, bytes_disk) VALUES(4, 0, 0, 9, 77);",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  assert_int_not_equal(sqlite3_exec(s, "SELECT bytes_disk_write FROM steps", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(s);
  ferry_db *db = NULL;
  assert_int_equal(ferry_db_open(&db, f->path, FERRY_DB_READ_ONLY), FERRY_OK);
  struct ferry_run_stats rs;
  assert_int_equal(ferry_db_run_stats(db, 4, &rs), FERRY_OK);
  assert_int_equal(rs.steps, 1);
  assert_int_equal(rs.bytes_disk, 77);
  assert_int_equal(rs.bytes_disk_write, 0); /* no such column before schema 10: none recorded */
  ferry_db_close(db);
  s = raw_open(f->path);
  assert_int_equal(q1(s, "PRAGMA user_version"), 9); /* read-only: not migrated */
  sqlite3_close(s);
  int64_t id;
  ferry_db_close(merge_then_migrate(f, "bytes_disk = 77", "bytes_disk_write", set_disk_write, &id));
}

/* The value of the metric `name` that ferry_db_compare() finds in a run (compared with itself),
 * or -1 when the run does not have it. */
static double metric_of(const struct ferry_run_stats *rs, const char *name) {
  struct ferry_metric_delta d[FERRY_DB_MAX_METRICS];
  size_t n = 0;
  ferry_db_compare(rs, rs, 5.0, d, &n);
  for (size_t i = 0; i < n; i++)
    if (!strcmp(d[i].name, name)) return d[i].a;
  return -1;
}

/* Version 10 to 11 adds steps.bytes_peers, as 10 added bytes_disk_write: a version-10 file opened
 * read-only is read as it is (its disk writes, no peers, no bytes_peers metric; not migrated);
 * merged into a current database its steps copy with the column NULL; opened to write it is
 * migrated, its rows keep NULL (not recorded) and new rows carry the bytes given, which the
 * run's stats sum and ferry_db_compare() names bytes_peers. */
static void test_migration_peers(void **state) {
  struct fixture *f = *state;
  sqlite3 *s = raw_open(f->path);
  assert_int_equal(ferry__db_migrate(s, f->path, 10, NULL), FERRY_OK);
  assert_int_equal(sqlite3_exec(s,
                                "INSERT INTO runs(id, kind, started_at, complete) VALUES(4, 'sim', 'a', 1);"
                                "INSERT INTO steps(runId, step, start_ns, end_ns, bytes_disk, bytes_disk_write) "
                                "VALUES(4, 0, 0, 9, 77, 55);",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  assert_int_not_equal(sqlite3_exec(s, "SELECT bytes_peers FROM steps", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(s);
  ferry_db *db = NULL;
  assert_int_equal(ferry_db_open(&db, f->path, FERRY_DB_READ_ONLY), FERRY_OK);
  struct ferry_run_stats rs;
  assert_int_equal(ferry_db_run_stats(db, 4, &rs), FERRY_OK);
  assert_int_equal(rs.steps, 1);
  assert_int_equal(rs.bytes_disk, 77);
  assert_int_equal(rs.bytes_disk_write, 55);
  assert_int_equal(rs.bytes_peers, 0); /* no such column before schema 11: none recorded */
  assert_true(metric_of(&rs, "bytes_disk_write") == 55);
  assert_true(metric_of(&rs, "bytes_peers") == -1);
  ferry_db_close(db);
  s = raw_open(f->path);
  assert_int_equal(q1(s, "PRAGMA user_version"), 10); /* read-only: not migrated */
  sqlite3_close(s);
  int64_t id;
  db = merge_then_migrate(f, "bytes_disk_write = 55", "bytes_peers", set_peers, &id);
  assert_int_equal(ferry_db_run_stats(db, id, &rs), FERRY_OK);
  assert_int_equal(rs.bytes_peers, 6 << 20);
  assert_true(metric_of(&rs, "bytes_peers") == 6 << 20);
  assert_true(metric_of(&rs, "bytes_disk_write") == -1); /* it wrote nothing to disk */
  ferry_db_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_create_schema, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migration_from_v1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_one_complete_run_per_sweep_combination, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migration_keeps_repeats, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migration_free_kind, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migration_replica, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migration_disk_write, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migration_peers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_not_a_ferry_database, setup, teardown),
      cmocka_unit_test_setup_teardown(test_activity_mapping, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sink_threads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigkill_mid_run, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_create, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_only_places, setup, teardown),
      cmocka_unit_test_setup_teardown(test_full_database, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stats_and_compare, setup, teardown),
      cmocka_unit_test_setup_teardown(test_export_trace, setup, teardown),
      cmocka_unit_test_setup_teardown(test_import_nsys, setup, teardown),
      cmocka_unit_test_setup_teardown(test_allocation_failures, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
