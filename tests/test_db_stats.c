/* `ferry db stats` (nsys-style summaries) on a run with known kernel, copy and range durations,
 * checked figure by figure; and an Nsight Systems export imported: its bytes moved computed
 * from its copies, its steps from ferry's NVTX ranges, its notes naming the export's schema,
 * and a second import of the same file finding the first run. */
#include <cjson/cJSON.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/db.h"
#include "testutil.h"

static char *dir;
static char db_path[512];

static void act(ferry_db *db, enum ferry_activity_kind kind, const char *name, int32_t queue, int64_t start,
                int64_t end, uint64_t bytes, enum ferry_copy_kind copy) {
  struct ferry_activity a = {.kind = kind, .name = name, .queue = queue, .start_ns = start, .end_ns = end,
                             .bytes = bytes, .copy_kind = copy, .step = -1, .layer = -1, .expert = -1};
  ferry_db_activity_sink(db, &a);
}

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("dbstats");
  snprintf(db_path, sizeof db_path, "%s/s.db", dir);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, db_path, FERRY_DB_CREATE), FERRY_OK);
  struct ferry_run_info info = {.kind = FERRY_RUN_HOST, .model = "m"};
  int64_t run;
  assert_int_equal(ferry_db_run_begin(db, &info, &run), FERRY_OK);
  /* gemm 10, 20, 30 ns; norm 5, 5 ns */
  act(db, FERRY_ACT_KERNEL, "gemm", 0, 100, 110, 0, 0);
  act(db, FERRY_ACT_KERNEL, "gemm", 0, 200, 230, 0, 0);
  act(db, FERRY_ACT_KERNEL, "gemm", 0, 300, 320, 0, 0);
  act(db, FERRY_ACT_KERNEL, "norm", 0, 400, 405, 0, 0);
  act(db, FERRY_ACT_KERNEL, "norm", 0, 500, 505, 0, 0);
  /* copies: 2 MB and 4 MB host to device, 1 MB disk read */
  act(db, FERRY_ACT_MEMCPY, "h2d", 1, 100, 140, 2000000, FERRY_COPY_HTOD);
  act(db, FERRY_ACT_MEMCPY, "h2d", 1, 200, 260, 4000000, FERRY_COPY_HTOD);
  act(db, FERRY_ACT_MEMCPY, "disk_read", 3, 50, 150, 1000000, FERRY_COPY_DISK_TO_HOST);
  act(db, FERRY_ACT_RANGE, "step", -1, 0, 300, 0, 0);
  act(db, FERRY_ACT_RANGE, "step", -1, 300, 700, 0, 0);
  /* CUDA runtime calls on the host, named as CUPTI names them (the API version appended):
   * cudaEventRecord 2, 4, 3 ns; cudaLaunchKernel 9 ns */
  act(db, FERRY_ACT_RUNTIME, "cudaEventRecord_v3020", -1, 90, 92, 0, 0);
  act(db, FERRY_ACT_RUNTIME, "cudaLaunchKernel_v7000", -1, 92, 101, 0, 0);
  act(db, FERRY_ACT_RUNTIME, "cudaEventRecord_v3020", -1, 101, 105, 0, 0);
  act(db, FERRY_ACT_RUNTIME, "cudaEventRecord_v3020", -1, 190, 193, 0, 0);
  /* two steps: a prefill (8 tokens, batch 2) of 300 ns, a decode (2 tokens, batch 2) of 400 ns */
  struct ferry_step_row s1 = {0, 0, 300, 2, 8, 1000000, 2000000, 0, 0, 0, 30, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  struct ferry_step_row s2 = {1, 300, 700, 2, 2, 0, 4000000, 0, 0, 0, 100, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  assert_int_equal(ferry_db_add_step(db, run, &s1), FERRY_OK);
  assert_int_equal(ferry_db_add_step(db, run, &s2), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  ferry_db_close(db);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  return 0;
}

static double cell(const struct ferry_stats_table *t, size_t row, const char *col) {
  for (size_t c = 0; c < t->ncols; c++)
    if (!strcmp(t->columns[c], col)) return t->num[row * t->ncols + c];
  fail_msg("no column %s", col);
  return NAN;
}

static const char *label(const struct ferry_stats_table *t, size_t row) { return t->text[row * t->ncols + t->ncols - 1]; }

static void test_library(void **state) {
  (void)state;
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, db_path, FERRY_DB_READ_ONLY), FERRY_OK);
  struct ferry_stats_table t;
  assert_int_equal(ferry_db_stats_report(db, 1, FERRY_STATS_KERN_SUM, &t), FERRY_OK);
  assert_int_equal(t.nrows, 2);
  assert_string_equal(label(&t, 0), "gemm"); /* by total time */
  assert_true(fabs(cell(&t, 0, "Time (%)") - 100.0 * 60 / 70) < 1e-9);
  assert_true(cell(&t, 0, "Total Time (ns)") == 60);
  assert_true(cell(&t, 0, "Instances") == 3);
  assert_true(cell(&t, 0, "Avg (ns)") == 20);
  assert_true(cell(&t, 0, "Med (ns)") == 20);
  assert_true(cell(&t, 0, "Min (ns)") == 10);
  assert_true(cell(&t, 0, "Max (ns)") == 30);
  assert_true(fabs(cell(&t, 0, "StdDev (ns)") - 10.0) < 1e-9); /* sample deviation */
  assert_string_equal(label(&t, 1), "norm");
  assert_true(cell(&t, 1, "StdDev (ns)") == 0);
  ferry_stats_table_free(&t);

  assert_int_equal(ferry_db_stats_report(db, 1, FERRY_STATS_MEM_SIZE_SUM, &t), FERRY_OK);
  assert_int_equal(t.nrows, 2);
  assert_string_equal(label(&t, 0), "[CUDA memcpy Host-to-Device]");
  assert_true(cell(&t, 0, "Total (MB)") == 6.0);
  assert_true(cell(&t, 0, "Count") == 2);
  assert_true(cell(&t, 0, "Med (MB)") == 3.0);
  assert_string_equal(label(&t, 1), "[ferry disk read Disk-to-Host]");
  ferry_stats_table_free(&t);

  assert_int_equal(ferry_db_stats_report(db, 1, FERRY_STATS_MEM_TIME_SUM, &t), FERRY_OK);
  assert_string_equal(label(&t, 0), "[CUDA memcpy Host-to-Device]"); /* 100 ns against 100 ns: order by label */
  assert_true(cell(&t, 0, "Total Time (ns)") == 100);
  ferry_stats_table_free(&t);

  assert_int_equal(ferry_db_stats_report(db, 1, FERRY_STATS_NVTX_SUM, &t), FERRY_OK);
  assert_int_equal(t.nrows, 1);
  assert_string_equal(label(&t, 0), "step");
  assert_true(cell(&t, 0, "Total Time (ns)") == 700);
  assert_true(cell(&t, 0, "Med (ns)") == 350);
  ferry_stats_table_free(&t);

  assert_int_equal(ferry_db_stats_report(db, 1, FERRY_STATS_STEP_SUM, &t), FERRY_OK);
  assert_int_equal(t.nrows, 2);
  assert_string_equal(label(&t, 0), "decode");
  assert_true(cell(&t, 0, "Total Time (ns)") == 400);
  assert_true(cell(&t, 0, "Avg Batch") == 2);
  assert_true(cell(&t, 0, "Stall (%)") == 25);
  assert_true(cell(&t, 0, "H2D (MB)") == 4);
  assert_string_equal(label(&t, 1), "prefill + decode");
  assert_true(cell(&t, 1, "Avg Tokens") == 8);
  assert_true(cell(&t, 1, "Disk (MB)") == 1);
  ferry_stats_table_free(&t);

  /* api_sum: the host's calls by total time, named as nsys prints them (no version suffix); the
   * three event records (2 + 4 + 3 ns) tie with cudaLaunchKernel's one 9 ns call, and equal
   * totals keep the names' order */
  assert_int_equal(ferry_db_stats_report(db, 1, FERRY_STATS_API_SUM, &t), FERRY_OK);
  assert_int_equal(t.nrows, 2);
  assert_string_equal(label(&t, 0), "cudaEventRecord");
  assert_true(cell(&t, 0, "Num Calls") == 3);
  assert_true(cell(&t, 0, "Total Time (ns)") == 9);
  assert_true(cell(&t, 0, "Med (ns)") == 3);
  assert_true(cell(&t, 0, "Time (%)") == 50);
  assert_string_equal(label(&t, 1), "cudaLaunchKernel");
  assert_true(cell(&t, 1, "Max (ns)") == 9);
  ferry_stats_table_free(&t);
  assert_int_equal(ferry_db_stats_report(db, 9, FERRY_STATS_STEP_SUM, &t), FERRY_ERR_NOT_FOUND);
  ferry_db_close(db);

  enum ferry_stats_report r;
  assert_int_equal(ferry_stats_report_parse("cuda_gpu_kern_sum", &r), FERRY_OK);
  assert_int_equal(r, FERRY_STATS_KERN_SUM);
  assert_int_equal(ferry_stats_report_parse("cuda_api_sum", &r), FERRY_OK);
  assert_int_equal(r, FERRY_STATS_API_SUM);
  assert_int_equal(ferry_stats_report_parse("osrt_sum", &r), FERRY_ERR_INVALID);
}

static void test_command(void **state) {
  (void)state;
  char args[1200], *out;
  snprintf(args, sizeof args, "db stats --report kern_sum --run 1 --db '%s'", db_path);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, " Time (%)  Total Time (ns)  Instances  Avg (ns)  Med (ns)"));
  assert_true(tu_contains(out, "gemm"));
  free(out);
  snprintf(args, sizeof args, "db stats --report cuda_gpu_mem_size_sum --run 1 --format csv --db '%s'", db_path);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(strncmp(out, "Total (MB),Count,Avg (MB),Med (MB),Min (MB),Max (MB),StdDev (MB),Operation\n", 75) == 0);
  assert_true(tu_contains(out, "\n6,2,3,3,2,4,"));
  free(out);
  snprintf(args, sizeof args, "db stats --report step_sum --run 1 --format json --db '%s' 2>/dev/null", db_path);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "schema")->valuestring, "ferry.db.stats.v1");
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "rows")), 2);
  cJSON_Delete(j);
  /* and its JSON Schema (docs/schemas), where python3-jsonschema is installed */
  char path[700], cmd[2400];
  snprintf(path, sizeof path, "%s/stats.json", dir);
  tu_write_file(path, out, strlen(out));
  free(out);
  const char *src = getenv("FERRY_SOURCE_DIR");
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c 'import jsonschema' 2>/dev/null || exit 0; /usr/bin/python3 -c 'import json,sys,jsonschema; "
           "jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2])))' '%s' "
           "'%s/docs/schemas/db-stats.schema.json'",
           path, src ? src : ".");
  if (system(cmd) != 0) fail_msg("%s does not match docs/schemas/db-stats.schema.json", path);
  snprintf(args, sizeof args, "db stats --report api_sum --run 1 --format md --db '%s'", db_path);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "Num Calls"));
  assert_true(tu_contains(out, "cudaLaunchKernel"));
  free(out);
  snprintf(args, sizeof args, "db stats --report osrt_sum --run 1 --db '%s'", db_path);
  assert_int_equal(tu_run_ferry(args, &out), 2);
  assert_true(tu_contains(out, "kern_sum, mem_sum"));
  free(out);
  snprintf(args, sizeof args, "db stats --report kern_sum --db '%s'", db_path);
  assert_int_equal(tu_run_ferry(args, &out), 2);
  free(out);
}

/* An export in the layout of `nsys export --type sqlite` of a profiled ferry run. */
static void make_export(const char *path) {
  sqlite3 *s;
  assert_int_equal(sqlite3_open(path, &s), SQLITE_OK);
  assert_int_equal(
      sqlite3_exec(s,
                   "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);"
                   "INSERT INTO StringIds VALUES (1,'gemm_kernel'),(2,'ferry'),(3,'step 0'),(4,'step 1');"
                   "CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);"
                   "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION_MAJOR','3'),"
                   " ('EXPORT_SCHEMA_VERSION_MINOR','15'),('EXPORT_SCHEMA_VERSION_MICRO','1');"
                   "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,"
                   " deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,"
                   " correlationId INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL);"
                   "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (10,20,0,1,7,1,1,1),(30,50,0,1,7,2,1,1);"
                   "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,"
                   " deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,"
                   " correlationId INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL);"
                   "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (0,9,0,1,8,3,1048576,1),(60,70,0,1,8,4,1048576,1),"
                   " (80,90,0,1,9,5,4096,2);"
                   "CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,"
                   " rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,"
                   " endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, int64Value INTEGER);"
                   "INSERT INTO NVTX_EVENTS VALUES (0,NULL,75,NULL,NULL,NULL,NULL,1,NULL,2,5,NULL),"
                   " (0,55,59,NULL,NULL,NULL,NULL,1,NULL,3,5,0),(55,100,59,NULL,NULL,NULL,NULL,1,NULL,4,5,1);",
                   NULL, NULL, NULL),
      SQLITE_OK);
  sqlite3_close(s);
}

static void test_import(void **state) {
  (void)state;
  char exp[600], into[600], args[1400], *out;
  snprintf(exp, sizeof exp, "%s/profile.sqlite", dir);
  snprintf(into, sizeof into, "%s/imp.db", dir);
  make_export(exp);
  snprintf(args, sizeof args, "db import-nsys '%s' --db '%s'", exp, into);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "as run 1"));
  free(out);
  /* the same file again: the first run, nothing added */
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "already imported as run 1"));
  free(out);
  snprintf(args, sizeof args, "db list --format csv --db '%s'", into);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_false(tu_contains(out, "\n2,"));
  free(out);
  /* bytes moved from the copies; notes with the export's schema */
  snprintf(args, sizeof args, "db show 1 --db '%s'", into);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "host->device 2.00 MiB  device->host 4.00 KiB"));
  assert_true(tu_contains(out, "from the timeline's copies"));
  assert_true(tu_contains(out, "imported from the Nsight Systems export profile.sqlite (export schema 3.15.1)"));
  assert_false(tu_contains(out, "?"));
  free(out);
  snprintf(args, sizeof args, "db show 1 --format json --db '%s' 2>/dev/null", into);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  cJSON *j = cJSON_Parse(out);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metrics"), "bytes_h2d")->valuedouble, 2097152);
  cJSON_Delete(j);
  free(out);
  /* steps from ferry's NVTX ranges "step N" */
  snprintf(args, sizeof args, "db stats --report step_sum --run 1 --db '%s'", into);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "step (NVTX ranges)"));
  assert_true(tu_contains(out, "      100 ")); /* total time */
  free(out);
  snprintf(args, sizeof args, "db stats --report kern_sum --run 1 --db '%s'", into);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "gemm_kernel"));
  free(out);
  /* the export has no runtime-call table: said, not an empty table */
  snprintf(args, sizeof args, "db stats --report api_sum --run 1 --db '%s'", into);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "nothing to summarise: the run has no CUDA runtime calls"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_library),
      cmocka_unit_test(test_command),
      cmocka_unit_test(test_import),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
