/* `ferry db` end to end: list, show, diff exit codes, export-trace output parsed as JSON,
 * import-nsys of a fixture built here with the nsys layout, and one-line errors for bad input
 * (not SQLite, newer schema, missing nsys tables, unknown runs, usage mistakes). */
#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "ferry/db.h"
#include "testutil.h"

static char *dir;
static char dbpath[512];

static int64_t add_run(ferry_db *db, const char *model, double decode_scale) {
  struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = model, .hardware = "a100-pcie4",
                                .config_json = "{\"prefetch\":2}", .config_hash = "abc"};
  int64_t run;
  assert_int_equal(ferry_db_run_begin(db, &info, &run), FERRY_OK);
  for (int i = 0; i < 50; i++) {
    int64_t arr = (int64_t)i * 1000000, ft = arr + 5000000;
    struct ferry_request_row r = {i, arr, ft, ft + (int64_t)(20e6 * decode_scale), 64, 21, 0};
    assert_int_equal(ferry_db_add_request(db, run, &r), FERRY_OK);
    struct ferry_step_row s = {i, arr, arr + 900000, 1, 21, 1 << 20, 2 << 20, 0, 5, 1, 1000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(ferry_db_add_step(db, run, &s), FERRY_OK);
    assert_int_equal(ferry_db_add_memory(db, run, arr, FERRY_TIER_DEVICE, (uint64_t)(i + 1) << 20), FERRY_OK);
    struct ferry_activity a = {.kind = FERRY_ACT_KERNEL, .name = "matmul", .queue = 0, .start_ns = arr,
                               .end_ns = arr + 500000, .step = i, .layer = -1, .expert = -1};
    ferry_db_activity_sink(db, &a);
    a = (struct ferry_activity){.kind = FERRY_ACT_MEMCPY, .queue = 1, .start_ns = arr, .end_ns = arr + 300000,
                                .bytes = 2 << 20, .copy_kind = FERRY_COPY_HTOD, .step = i, .layer = -1, .expert = -1};
    ferry_db_activity_sink(db, &a);
  }
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  return run;
}

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("dbcli");
  snprintf(dbpath, sizeof dbpath, "%s/study.db", dir);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, dbpath, FERRY_DB_CREATE), FERRY_OK);
  assert_int_equal(add_run(db, "tiny-dense", 1.0), 1);
  assert_int_equal(add_run(db, "tiny-dense", 1.5), 2); /* slower decode */
  assert_int_equal(add_run(db, "tiny-dense", 1.0), 3);
  ferry_db_close(db);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  return 0;
}

/* A failure prints exactly one line starting "ferry: ". */
static void assert_one_line_error(const char *out) {
  assert_true(strncmp(out, "ferry: ", 7) == 0);
  const char *nl = strchr(out, '\n');
  assert_non_null(nl);
  assert_int_equal(nl[1], '\0');
}

static void test_help_and_usage(void **state) {
  (void)state;
  char *out;
  assert_int_equal(tu_run_ferryf(&out, "db --help"), 0);
  assert_true(tu_contains(out, "export-trace"));
  assert_true(tu_contains(out, "import-nsys"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db list"), 2); /* no --db */
  assert_true(tu_contains(out, "--db"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 --db '%s'", dbpath), 2);
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db frobnicate --db '%s'", dbpath), 2);
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db show x --db '%s'", dbpath), 2);
  free(out);
}

static void test_list_show(void **state) {
  (void)state;
  char *out;
  assert_int_equal(tu_run_ferryf(&out, "db list --db '%s'", dbpath), 0);
  assert_true(tu_contains(out, "tiny-dense"));
  assert_true(tu_contains(out, "a100-pcie4"));
  assert_true(tu_contains(out, "yes"));
  assert_true(tu_contains(out, "      50"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db show 2 --db '%s'", dbpath), 0);
  assert_true(tu_contains(out, "run 2 (sim)"));
  assert_true(tu_contains(out, "{\"prefetch\":2}"));
  assert_true(tu_contains(out, "TTFT"));
  assert_true(tu_contains(out, "p99"));
  assert_true(tu_contains(out, "throughput"));
  assert_true(tu_contains(out, "device 50.00 MiB"));
  assert_true(tu_contains(out, "host->device 100.00 MiB"));
  assert_true(tu_contains(out, "stall time   0.050 ms"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db show 99 --db '%s'", dbpath), 1);
  assert_one_line_error(out);
  assert_true(tu_contains(out, "no run 99"));
  free(out);
}

static void test_diff_exit_codes(void **state) {
  (void)state;
  char *out;
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 3 --db '%s'", dbpath), 0);
  assert_true(tu_contains(out, "no regression"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 2 --db '%s'", dbpath), 3);
  assert_true(tu_contains(out, "REGRESSION"));
  assert_true(tu_contains(out, "tpot_p50_ms"));
  assert_true(tu_contains(out, "+50.00%"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff 2 1 --db '%s'", dbpath), 0); /* an improvement */
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 2 --tolerance 60%% --db '%s'", dbpath), 0);
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 2 --tolerance=lots --db '%s'", dbpath), 2);
  free(out);
}

/* A run that failed or was killed measured part of the work only (here its fast first
 * requests): diff refuses it, unless --allow-incomplete, instead of reporting no regression. */
static void test_diff_incomplete(void **state) {
  (void)state;
  char path[600], *out;
  snprintf(path, sizeof path, "%s/partial.db", dir);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, path, FERRY_DB_CREATE), FERRY_OK);
  assert_int_equal(add_run(db, "tiny-dense", 1.0), 1);
  struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = "tiny-dense", .config_hash = "abc"};
  int64_t killed, failed;
  assert_int_equal(ferry_db_run_begin(db, &info, &killed), FERRY_OK);
  for (int i = 0; i < 5; i++) {
    struct ferry_request_row r = {i, i * 1000000LL, i * 1000000LL + 4000000, i * 1000000LL + 8000000, 64, 21, 0};
    assert_int_equal(ferry_db_add_request(db, killed, &r), FERRY_OK);
  }
  assert_int_equal(ferry_db_run_begin(db, &info, &failed), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, failed, "device budget exceeded"), FERRY_OK);
  ferry_db_close(db); /* the killed run never finishes */
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 %lld --db '%s'", (long long)killed, path), 1);
  assert_one_line_error(out);
  assert_true(tu_contains(out, "did not complete (killed, or still running)"));
  assert_true(tu_contains(out, "--allow-incomplete"));
  assert_false(tu_contains(out, "no regression"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff %lld 1 --db '%s'", (long long)failed, path), 1);
  assert_true(tu_contains(out, "failed: device budget exceeded"));
  free(out);
  /* asked for explicitly: compared, with a warning */
  int rc = tu_run_ferryf(&out, "db diff 1 %lld --allow-incomplete --db '%s'", (long long)killed, path);
  assert_true(rc == 0 || rc == 3);
  assert_true(tu_contains(out, "warning: run 2 did not complete"));
  assert_true(tu_contains(out, "ttft_p50_ms"));
  free(out);
}

static void test_export_trace(void **state) {
  (void)state;
  char trace[600], *out;
  snprintf(trace, sizeof trace, "%s/trace.json", dir);
  assert_int_equal(tu_run_ferryf(&out, "db export-trace --run 1 --out '%s' --db '%s'", trace, dbpath), 0);
  free(out);
  char *text;
  size_t len;
  assert_int_equal(ferry__read_file(trace, 1 << 24, &text, &len, NULL), FERRY_OK);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  assert_string_equal(cJSON_GetObjectItem(root, "displayTimeUnit")->valuestring, "ns");
  const cJSON *events = cJSON_GetObjectItem(root, "traceEvents"), *e;
  int x = 0, c = 0, m = 0;
  cJSON_ArrayForEach(e, events) {
    const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
    x += !strcmp(ph, "X");
    c += !strcmp(ph, "C") && !strncmp(cJSON_GetObjectItem(e, "name")->valuestring, "memory ", 7);
    m += !strcmp(ph, "M");
  }
  assert_int_equal(x, 100); /* 50 kernels + 50 copies */
  assert_int_equal(c, 50);
  assert_true(m >= 3);
  cJSON_Delete(root);
  assert_int_equal(tu_run_ferryf(&out, "db export-trace --run 9 --out '%s' --db '%s'", trace, dbpath), 1);
  assert_one_line_error(out);
  free(out);
}

static void make_export(const char *path, const char *drop) {
  sqlite3 *s;
  assert_int_equal(sqlite3_open(path, &s), SQLITE_OK);
  assert_int_equal(sqlite3_exec(s,
                                "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);"
                                "INSERT INTO StringIds VALUES (1,'void gemm<128>(float*)'),(2,'gemm');"
                                "CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);"
                                "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION','3.16.1');"
                                "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,"
                                " deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,"
                                " correlationId INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,"
                                " gridX INTEGER NOT NULL, blockX INTEGER NOT NULL);"
                                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (10,20,0,1,7,1,1,2,64,128);",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  if (drop) {
    char text[128];
    snprintf(text, sizeof text, "DROP TABLE %s", drop);
    assert_int_equal(sqlite3_exec(s, text, NULL, NULL, NULL), SQLITE_OK);
  }
  sqlite3_close(s);
}

static void test_import_nsys(void **state) {
  (void)state;
  char exp[600], *out;
  snprintf(exp, sizeof exp, "%s/report1.sqlite", dir);
  make_export(exp, NULL);
  assert_int_equal(tu_run_ferryf(&out, "db import-nsys '%s' --into '%s' --model llama-8b", exp, dbpath), 0);
  assert_true(tu_contains(out, "as run 4"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db list --db '%s'", dbpath), 0);
  assert_true(tu_contains(out, "nsys-import"));
  assert_true(tu_contains(out, "llama-8b"));
  free(out);
  snprintf(exp, sizeof exp, "%s/broken.sqlite", dir);
  make_export(exp, "CUPTI_ACTIVITY_KIND_KERNEL");
  assert_int_equal(tu_run_ferryf(&out, "db import-nsys '%s' --db '%s'", exp, dbpath), 1);
  assert_one_line_error(out);
  assert_true(tu_contains(out, exp));
  assert_true(tu_contains(out, "CUPTI_ACTIVITY_KIND_KERNEL"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db list --db '%s'", dbpath), 0);
  assert_false(tu_contains(out, "\n5 "));
  free(out);
}

static void test_bad_databases(void **state) {
  (void)state;
  char path[600], *out;
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  tu_write_file(path, "hello, I am plain text and not a database at all\n", 49);
  assert_int_equal(tu_run_ferryf(&out, "db list --db '%s'", path), 1);
  assert_one_line_error(out);
  assert_true(tu_contains(out, "not a ferry database"));
  assert_true(tu_contains(out, path));
  free(out);
  /* import-nsys into a non-database must not overwrite it either */
  assert_int_equal(tu_run_ferryf(&out, "db import-nsys '%s' --db '%s'", path, path), 2);
  assert_true(tu_contains(out, "must not overwrite"));
  free(out);

  snprintf(path, sizeof path, "%s/future.db", dir);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, path, FERRY_DB_CREATE), FERRY_OK);
  ferry_db_close(db);
  sqlite3 *s;
  assert_int_equal(sqlite3_open(path, &s), SQLITE_OK);
  assert_int_equal(sqlite3_exec(s, "PRAGMA user_version=1000", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(s);
  assert_int_equal(tu_run_ferryf(&out, "db list --db '%s'", path), 1);
  assert_one_line_error(out);
  assert_true(tu_contains(out, "newer"));
  free(out);
  snprintf(path, sizeof path, "%s/none.db", dir);
  assert_int_equal(tu_run_ferryf(&out, "db list --db '%s'", path), 1);
  assert_one_line_error(out);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_and_usage), cmocka_unit_test(test_list_show),
      cmocka_unit_test(test_diff_exit_codes), cmocka_unit_test(test_diff_incomplete),
      cmocka_unit_test(test_export_trace),
      cmocka_unit_test(test_import_nsys),    cmocka_unit_test(test_bad_databases),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
