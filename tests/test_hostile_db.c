/* A result database is untrusted input. One crafted with hostile strings (backquotes, $(...),
 * quotes, newlines, system(), HTML, control characters) and extreme values (INT64_MIN/MAX
 * times and counts, 1e308 reals and text in integer columns, negative sizes, budgets of
 * "inf") goes through every reader: ferry db list/show/diff, export-trace and report, as
 * commands and through the library. Under the asan preset (ASan + UBSan, halting on the first
 * report) any overflow or bad access fails the test; in every build no command of the
 * strings runs (a canary file stays absent), db prints no control character to the terminal
 * and the exported trace is valid JSON. */
#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/db.h"
#include "ferry/report.h"
#include "testutil.h"

static char *dir;
static char db_path[600], canary[600];

static void exec_sql(sqlite3 *s, const char *sql) {
  char *err = NULL;
  if (sqlite3_exec(s, sql, NULL, NULL, &err) != SQLITE_OK) fail_msg("%s: %s", sql, err ? err : "?");
}

/* Bind a hostile text built around the canary path. */
static void bind_evil(sqlite3_stmt *q, int i, int variant) {
  char t[2048];
  switch (variant % 6) {
    case 0: snprintf(t, sizeof t, "m`touch %s`\n$(touch %s)", canary, canary); break;
    case 1: snprintf(t, sizeof t, "x'; system('touch %s'); '\"; system(\"touch %s\"); \"", canary, canary); break;
    case 2: snprintf(t, sizeof t, "a\nEOD\n!touch %s\n@m <script>alert(1)</script>", canary); break;
    case 3: snprintf(t, sizeof t, "\x1b[31mred\x1b[0m\r\x7f|*[x](javascript:alert(1))"); break;
    case 4: snprintf(t, sizeof t, "%%s%%n%%x %s", canary); break;
    default: snprintf(t, sizeof t, "price_per_hour_usd=1e308 price_per_hour_usd=-0"); break;
  }
  sqlite3_bind_text(q, i, t, -1, SQLITE_TRANSIENT);
}

#define MIN "(-9223372036854775807 - 1)"
#define MAX "9223372036854775807"

/* runs 1-3 complete with hostile text, 4 failed, 5 killed */
static void insert_runs(sqlite3 *s) {
  sqlite3_stmt *q;
  assert_int_equal(sqlite3_prepare_v2(s,
                                      "INSERT INTO runs(id, kind, started_at, finished_at, complete, model, hardware, trace,"
                                      " config_json, config_hash, error, notes, dropped_records)"
                                      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                                      -1, &q, NULL),
                   SQLITE_OK);
  for (int r = 1; r <= 5; r++) {
    char cfg[2048], key[700];
    snprintf(key, sizeof key, "k`touch %s`", canary);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "executor", r % 2 ? "sim" : "host");
    cJSON_AddNumberToObject(o, "block_layers", r == 1 ? 1e308 : r == 2 ? -1e308 : r);
    cJSON_AddNumberToObject(o, "device_budget", r == 3 ? 1.8e19 : 1e300 * (r - 2));
    cJSON_AddNumberToObject(o, key, r);
    char hw[700];
    snprintf(hw, sizeof hw, "h`touch %s`%d", canary, r % 2);
    cJSON_AddStringToObject(o, "hw", hw);
    char quant[700];
    snprintf(quant, sizeof quant, "x'`touch %s`'", canary);
    cJSON_AddStringToObject(o, "quant", r == 1 ? "int8" : quant);
    char *t = cJSON_PrintUnformatted(o);
    snprintf(cfg, sizeof cfg, "%s", t);
    free(t);
    cJSON_Delete(o);
    sqlite3_bind_int(q, 1, r);
    sqlite3_bind_text(q, 2, r % 2 ? "sim" : "host", -1, SQLITE_STATIC);
    bind_evil(q, 3, r);
    bind_evil(q, 4, r + 1);
    sqlite3_bind_int(q, 5, r <= 3);
    bind_evil(q, 6, r);
    bind_evil(q, 7, r + 2);
    bind_evil(q, 8, r + 3);
    sqlite3_bind_text(q, 9, cfg, -1, SQLITE_TRANSIENT);
    bind_evil(q, 10, r + 4);
    if (r == 4) bind_evil(q, 11, 2);
    else sqlite3_bind_null(q, 11);
    bind_evil(q, 12, 5);
    sqlite3_bind_int64(q, 13, r == 1 ? INT64_MAX : -1);
    assert_int_equal(sqlite3_step(q), SQLITE_DONE);
    sqlite3_reset(q);
  }
  sqlite3_finalize(q);
}

/* each run's requests, steps, memory and budgets: extreme times and counts, reals and text in
 * integer columns */
static void insert_run_rows(sqlite3 *s) {
  for (int r = 1; r <= 5; r++) {
    char sql[4096];
    snprintf(sql, sizeof sql,
             "INSERT INTO requests(runId, req_id, arrival_ns, first_token_ns, finish_ns, prompt_tokens, output_tokens) VALUES"
             " (%d, 0, " MIN ", " MAX ", " MAX ", " MAX ", " MAX "),"
             " (%d, 1, " MAX ", " MIN ", " MIN ", -1, " MIN "),"
             " (%d, 2, 0, 1e300, -1e300, 0, 1e300),"
             " (%d, 3, 'abc', 'def', 'ghi', 'x', 'y'),"
             " (%d, 4, 1000, 2000, 3000000, 8, 4),"
             " (%d, 5, -5, NULL, NULL, 1, 2),"
             " (%d, 6, 0, " MAX ", " MIN ", 3, 2)",
             r, r, r, r, r, r, r);
    exec_sql(s, sql);
    snprintf(sql, sizeof sql,
             "INSERT INTO steps(runId, step, start_ns, end_ns, batch, tokens, bytes_disk, bytes_h2d, bytes_d2h, hits, misses,"
             " stall_ns) VALUES"
             " (%d, 0, " MIN ", " MAX ", " MAX ", " MAX ", " MAX ", " MAX ", " MAX ", " MAX ", " MAX ", " MAX "),"
             " (%d, 1, " MAX ", " MIN ", -1, -1, -1, 1e308, -1e308, " MIN ", " MIN ", 1e308),"
             " (%d, " MAX ", 0, 10, 1, 1, 1, 1, 1, 1, 1, 'text')",
             r, r, r);
    exec_sql(s, sql);
    snprintf(sql, sizeof sql,
             "INSERT INTO memory(runId, t_ns, tier, used_bytes) VALUES (%d, " MIN ", 'device', " MAX "),"
             " (%d, " MAX ", 'device', -1), (%d, 0, 'host', 1e308), (%d, 5, 'disk', " MIN "), (%d, 7, 'host', 'x')",
             r, r, r, r, r);
    exec_sql(s, sql);
    snprintf(sql, sizeof sql,
             "INSERT INTO META_DATA_EXPORT(runId, name, value) VALUES (%d, 'DEVICE_BUDGET_BYTES', '%s'),"
             " (%d, 'HOST_BUDGET_BYTES', '%s')",
             r, r == 1 ? "inf" : r == 2 ? "1e400" : "-5", r, r == 1 ? "nan" : "18446744073709551615");
    exec_sql(s, sql);
  }
}

/* strings, timeline rows, ranges and a GPU at the extremes */
static void insert_timeline(sqlite3 *s) {
  sqlite3_stmt *q;
  assert_int_equal(sqlite3_prepare_v2(s, "INSERT INTO StringIds(id, value) VALUES(?1, ?2)", -1, &q, NULL), SQLITE_OK);
  for (int i = 1; i <= 6; i++) {
    sqlite3_bind_int(q, 1, i);
    bind_evil(q, 2, i);
    assert_int_equal(sqlite3_step(q), SQLITE_DONE);
    sqlite3_reset(q);
  }
  sqlite3_finalize(q);
  for (int r = 1; r <= 3; r++) {
    char sql[4096];
    snprintf(sql, sizeof sql,
             "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL(runId, start, end, streamId, demangledName, shortName, bytes, flops,"
             " step, layer, expert, correlationId) VALUES"
             " (%d, " MIN ", " MAX ", " MAX ", 1, 1, " MAX ", 1e308, 0, " MAX ", " MIN ", " MAX "),"
             " (%d, " MAX ", " MIN ", " MIN ", 2, 2, -1, -1e308, 1, 0, 0, " MIN "),"
             " (%d, 0, 1000, 0, 3, 3, 1e300, 'x', 2, 'y', 'z', 'w'),"
             " (%d, 10, 20, 2147483648, 99, 99, 5, 5, " MAX ", 0, 0, 0)",
             r, r, r, r);
    exec_sql(s, sql);
    snprintf(sql, sizeof sql,
             "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY(runId, start, end, streamId, bytes, copyKind, step, layer, expert,"
             " nameId, correlationId) VALUES"
             " (%d, " MIN ", " MAX ", 1, " MAX ", 1, 0, 0, 0, 4, 1),"
             " (%d, " MAX ", 0, -1, " MIN ", " MAX ", 1, 0, 0, 5, 2),"
             " (%d, 3, 4, 2, -1, 100, 2, 0, 0, 999, 3),"
             " (%d, 5, 6, 4294967297, 1e300, -2147483649, 2, 0, 0, 6, 4)",
             r, r, r, r);
    exec_sql(s, sql);
    snprintf(sql, sizeof sql,
             "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET(runId, start, end, streamId, bytes, nameId) VALUES"
             " (%d, " MIN ", " MAX ", " MAX ", " MAX ", 1);"
             "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION(runId, start, end, streamId, syncType, nameId) VALUES"
             " (%d, " MAX ", " MIN ", " MIN ", 1, 2), (%d, " MIN ", " MAX ", 9, 1, 2);"
             "INSERT INTO NVTX_EVENTS(runId, start, end, eventType, text, textId, step, layer, expert) VALUES"
             " (%d, " MIN ", " MAX ", 59, 'r`touch x`\n', NULL, " MAX ", " MIN ", 0),"
             " (%d, " MAX ", NULL, 34, NULL, 3, NULL, NULL, NULL);"
             "INSERT INTO TARGET_INFO_GPU(runId, id, name, totalMemory, memoryBandwidth, clockRate, smCount, computeMajor,"
             " computeMinor, l2CacheSize) VALUES (%d, 0, 'g`touch x`', " MAX ", " MIN ", 1e308, " MAX ", " MIN ", " MAX
             ", -1)",
             r, r, r, r, r, r);
    exec_sql(s, sql);
  }
}

/* what `ferry calibrate --db` fits the runtime's host costs to: layer and host-wait ranges
 * and CUDA runtime calls at the extremes */
static void insert_calibration_rows(sqlite3 *s) {
  exec_sql(s, "INSERT INTO StringIds(id, value) VALUES (7, 'cudaLaunchKernel_v7000'), (8, 'cudaMemcpyAsync_v3020')");
  for (int r = 1; r <= 3; r++) {
    char sql[4096];
    snprintf(sql, sizeof sql,
             "INSERT INTO NVTX_EVENTS(runId, start, end, eventType, text, step, layer) VALUES"
             " (%d, " MIN ", " MAX ", 59, 'layer', 0, " MAX "), (%d, " MAX ", " MIN ", 59, 'layer', 0, 0),"
             " (%d, 0, 100, 59, 'layer', 0, 0), (%d, 100, 200, 59, 'layer', 1, 1), (%d, 0, 1e300, 59, 'layer', 1, -5),"
             " (%d, " MIN ", 50, 59, 'host wait', 0, NULL), (%d, 10, " MAX ", 59, 'host wait', 0, NULL);"
             "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME(runId, start, end, nameId) VALUES"
             " (%d, " MIN ", " MAX ", 7), (%d, " MAX ", " MIN ", 7), (%d, 0, 1e308, 7), (%d, 5, 10, 7), (%d, 5, 'x', 8),"
             " (%d, " MIN ", " MAX ", 8), (%d, 0, 3, 8)",
             r, r, r, r, r, r, r, r, r, r, r, r, r, r);
    exec_sql(s, sql);
  }
}

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("hostile");
  snprintf(db_path, sizeof db_path, "%s/hostile.db", dir);
  snprintf(canary, sizeof canary, "%s/canary", dir);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, db_path, FERRY_DB_CREATE), FERRY_OK);
  ferry_db_close(db);
  sqlite3 *s;
  assert_int_equal(sqlite3_open(db_path, &s), SQLITE_OK);
  exec_sql(s, "BEGIN");
  insert_runs(s);
  insert_run_rows(s);
  insert_timeline(s);
  insert_calibration_rows(s);
  exec_sql(s, "COMMIT");
  sqlite3_close(s);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  return 0;
}

/* A command's exit status is one of those allowed and its output has no sanitizer report. */
static char *run(int allowed_a, int allowed_b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static char *run(int allowed_a, int allowed_b, const char *fmt, ...) {
  char args[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  char *out = NULL;
  int rc = tu_run_ferry(args, &out);
  if ((rc != allowed_a && rc != allowed_b) || tu_contains(out, "runtime error") || tu_contains(out, "Sanitizer"))
    fail_msg("ferry %s: exit %d:\n%s", args, rc, out);
  if (access(canary, F_OK) == 0) fail_msg("ferry %s ran a command from the database", args);
  return out;
}

/* Database text reaches the terminal without control characters. */
static void no_controls(char *out) {
  for (const char *c = out; *c; c++)
    if (((unsigned char)*c < 0x20 && *c != '\n') || *c == 0x7f) fail_msg("control character %#x in:\n%s", *c, out);
  free(out);
}

static void test_commands(void **state) {
  (void)state;
  no_controls(run(0, 0, "db list --db '%s'", db_path));
  for (int r = 1; r <= 5; r++) no_controls(run(0, 0, "db show %d --db '%s'", r, db_path));
  /* runs of other kinds and configurations: refused, then compared with --force */
  free(run(1, 1, "db diff 1 2 --db '%s'", db_path));
  free(run(0, 3, "db diff 1 2 --force --db '%s'", db_path));
  free(run(0, 3, "db diff 3 1 --force --db '%s'", db_path));
  free(run(0, 3, "db diff 5 4 --allow-incomplete --force --db '%s'", db_path));
  for (int f = 0; f < 3; f++) {
    static const char *const formats[] = {"json", "csv", "md"};
    no_controls(run(0, 0, "db list --format %s --db '%s'", formats[f], db_path));
    for (int r = 1; r <= 5; r++) no_controls(run(0, 0, "db show %d --format %s --db '%s'", r, formats[f], db_path));
    free(run(0, 3, "db diff 1,3 2,5 --force --allow-incomplete --format %s --db '%s'", formats[f], db_path));
  }
  char *out = run(1, 1, "db diff 1 4 --db '%s'", db_path);
  assert_true(tu_contains(out, "did not complete"));
  free(out);
  for (int r = 1; r <= 3; r++) {
    char trace[700];
    snprintf(trace, sizeof trace, "%s/trace%d.json", dir, r);
    free(run(0, 0, "db export-trace --run %d --out '%s' --db '%s'", r, trace, db_path));
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(ferry__read_file(trace, 64 << 20, &text, &len, NULL), FERRY_OK);
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) fail_msg("%s is not valid JSON", trace);
    assert_true(cJSON_GetArraySize(cJSON_GetObjectItem(j, "traceEvents")) > 5);
    cJSON_Delete(j);
    free(text);
  }
  free(run(0, 0, "report --db '%s' --out '%s/report'", db_path, dir));
  free(run(0, 1, "calibrate --db '%s' --run 1 --base h100-pcie --out '%s/fitted.json'", db_path, dir));
  /* a host run: its waits (one spanning the whole range) are measured for host.event_wake_ns */
  free(run(0, 1, "calibrate --db '%s' --run 2 --base h100-pcie --out '%s/fitted.json'", db_path, dir));
  no_controls(run(0, 1, "calibrate --db '%s' --run all --base h100-pcie --out '%s/fitted.json'", db_path, dir));
  no_controls(run(0, 1, "calibrate --db '%s' --run 1,3 --base h100-pcie --out '%s/fitted.json'", db_path, dir));
  free(run(0, 0, "report --db '%s' --out '%s/report' --timeline-run 2 --steps 0:9223372036854775807", db_path, dir));
}

static void test_library(void **state) {
  (void)state;
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, db_path, FERRY_DB_READ_ONLY), FERRY_OK);
  struct ferry_run_stats s[5];
  for (int r = 1; r <= 5; r++) assert_int_equal(ferry_db_run_stats(db, r, &s[r - 1]), FERRY_OK);
  struct ferry_metric_delta d[FERRY_DB_MAX_METRICS];
  size_t n;
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++) ferry_db_compare(&s[a], &s[b], 5.0, d, &n);
  char out[700];
  snprintf(out, sizeof out, "%s/lib.json", dir);
  for (int r = 1; r <= 5; r++) assert_int_equal(ferry_db_export_trace(db, r, out), FERRY_OK);
  ferry_db_close(db);
  struct ferry_report_options o;
  ferry_report_options_init(&o);
  const char *dbs[1] = {db_path};
  o.db_paths = dbs;
  o.n_dbs = 1;
  snprintf(out, sizeof out, "%s/lib-report", dir);
  o.out_dir = out;
  o.title = "t`touch x`";
  o.timeline_run = 1;
  o.step_first = 0;
  o.step_last = INT64_MAX;
  ferry_status st = ferry_report_write(&o, NULL);
  if (st != FERRY_OK) fail_msg("report: %s", ferry_last_error());
  assert_int_equal(access(canary, F_OK), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_commands), cmocka_unit_test(test_library)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
