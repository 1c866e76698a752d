/* `ferry db list/show/diff --format json|csv|md` and the regression diff of repeated runs:
 * documents parsed back and checked against the figures the fixture wrote (and against the
 * JSON Schemas in docs/schemas/, tu_check_schema()), tolerances written in
 * percent or as a fraction, diffs across two databases, like-with-like refusals, and the
 * Mann-Whitney verdicts on repeat groups (noise within the tolerance, a real slowdown). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/db.h"
#include "testutil.h"

static char *dir;
static char db_a[512], db_b[512];

/* A run whose TPOT is `tpot_ms` (20 requests of 11 tokens), tagged as asked. */
static int64_t add_run(ferry_db *db, enum ferry_run_kind kind, const char *cfg, double tpot_ms, const char *group,
                       int index) {
  char hash[32];
  snprintf(hash, sizeof hash, "h%zu", strlen(cfg) * 7919 + (size_t)cfg[strlen(cfg) - 2]);
  struct ferry_run_info info = {.kind = kind, .model = "tiny-dense", .hardware = "l4", .config_json = cfg,
                                .config_hash = hash, .repeat_group = group, .repeat_index = index,
                                .git_rev = "v0.1-3-gabcdef"};
  int64_t run;
  assert_int_equal(ferry_db_run_begin(db, &info, &run), FERRY_OK);
  for (int i = 0; i < 20; i++) {
    int64_t arr = (int64_t)i * 1000000, ft = arr + 4000000;
    struct ferry_request_row r = {i, arr, ft, ft + (int64_t)(tpot_ms * 10e6), 32, 11, 0};
    assert_int_equal(ferry_db_add_request(db, run, &r), FERRY_OK);
    struct ferry_step_row s = {i, arr, arr + 900000, 1, 11, 0, 1 << 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(ferry_db_add_step(db, run, &s), FERRY_OK);
    assert_int_equal(ferry_db_add_memory(db, run, arr, FERRY_TIER_DEVICE, 8u << 20), FERRY_OK);
  }
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  return run;
}

#define CFG "{\"model\":\"tiny-dense\",\"prefetch_depth\":2}"
#define CFG1 "{\"model\":\"tiny-dense\",\"prefetch_depth\":1}"

/* Noise of a loaded machine: +-4 % around the base, in an order that interleaves the sides. */
static const double noise[5] = {1.00, 1.04, 0.97, 1.02, 0.96};

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("dbfmt");
  snprintf(db_a, sizeof db_a, "%s/base.db", dir);
  snprintf(db_b, sizeof db_b, "%s/cand.db", dir);
  ferry_db *a, *b;
  assert_int_equal(ferry_db_open(&a, db_a, FERRY_DB_CREATE), FERRY_OK);
  assert_int_equal(ferry_db_open(&b, db_b, FERRY_DB_CREATE), FERRY_OK);
  /* base.db: runs 1-5 group "base" (TPOT 10 ms), run 6 a single run, run 7 a sim run */
  for (int i = 0; i < 5; i++) add_run(a, FERRY_RUN_HOST, CFG, 10.0 * noise[i], "base", i);
  add_run(a, FERRY_RUN_HOST, CFG, 10.0, NULL, 0);
  add_run(a, FERRY_RUN_SIM, CFG, 10.0, NULL, 0);
  /* cand.db: runs 1-5 group "same" (the same within noise), runs 6-10 group "slow" (+40 %),
   * runs 11-15 another configuration */
  for (int i = 0; i < 5; i++) add_run(b, FERRY_RUN_HOST, CFG, 10.0 * noise[4 - i] * 1.01, "same", i);
  for (int i = 0; i < 5; i++) add_run(b, FERRY_RUN_HOST, CFG, 14.0 * noise[i], "slow", i);
  for (int i = 0; i < 5; i++) add_run(b, FERRY_RUN_HOST, CFG1, 14.0 * noise[i], "other", i);
  ferry_db_close(a);
  ferry_db_close(b);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  return 0;
}

/* The output of `ferry ARGS` parsed as JSON, after checking its exit status. tu_run_ferry()
 * captures stdout and stderr together (2>&1), so anything the command writes to stderr before
 * its document makes the parse fail (text after the document is ignored by cJSON_Parse()): the
 * JSON commands are expected to say nothing else. */
static cJSON *json_of(int want_rc, const char *args) {
  char *out;
  int rc = tu_run_ferry(args, &out);
  if (rc != want_rc) fail_msg("ferry %s: exit %d, expected %d:\n%s", args, rc, want_rc, out);
  cJSON *j = cJSON_Parse(out);
  if (!j) fail_msg("ferry %s: not JSON:\n%s", args, out);
  free(out);
  return j;
}

static const cJSON *get(const cJSON *o, const char *path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *tok = strtok(buf, "."); tok && o; tok = strtok(NULL, ".")) {
    if (cJSON_IsArray(o)) o = cJSON_GetArrayItem(o, atoi(tok));
    else o = cJSON_GetObjectItemCaseSensitive(o, tok);
  }
  if (!o) fail_msg("no member %s", path);
  return o;
}

static void test_list_formats(void **state) {
  (void)state;
  char args[700], *out;
  snprintf(args, sizeof args, "db list --format json --db '%s'", db_a);
  cJSON *j = json_of(0, args);
  assert_string_equal(get(j, "schema")->valuestring, "ferry.db.list.v1");
  assert_int_equal(cJSON_GetArraySize(get(j, "runs")), 7);
  assert_string_equal(get(j, "runs.0.status")->valuestring, "complete");
  assert_string_equal(get(j, "runs.0.repeat_group")->valuestring, "base");
  assert_int_equal(get(j, "runs.4.repeat_index")->valueint, 4);
  assert_true(cJSON_IsNull(get(j, "runs.5.repeat_group")));
  assert_string_equal(get(j, "runs.6.kind")->valuestring, "sim");
  assert_int_equal(get(j, "runs.0.requests")->valueint, 20);
  tu_check_schema(j, "db-list");
  cJSON_Delete(j);
  assert_int_equal(tu_run_ferryf(&out, "db list --format csv --db '%s'", db_a), 0);
  assert_true(strncmp(out, "id,kind,model,hardware,trace,status,", 36) == 0);
  assert_true(tu_contains(out, "\n7,sim,tiny-dense,l4,"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db list --format md --db '%s'", db_a), 0);
  assert_true(strncmp(out, "| id | kind | model |", 21) == 0);
  assert_true(tu_contains(out, "|---:|---|"));
  assert_true(tu_contains(out, "| 7 | sim | tiny-dense |"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db list --format yaml --db '%s'", db_a), 2);
  assert_true(tu_contains(out, "expected text, json, csv or md"));
  free(out);
}

static void test_show_formats(void **state) {
  (void)state;
  char args[700], *out;
  snprintf(args, sizeof args, "db show 7 --format json --db '%s'", db_b);
  cJSON *j = json_of(0, args);
  assert_string_equal(get(j, "schema")->valuestring, "ferry.db.show.v1");
  /* run 7 of cand.db: the "slow" group's second run, TPOT 14 * 1.04 ms */
  assert_true(fabs(get(j, "metrics.tpot_p50_ms")->valuedouble - 14.56) < 1e-9);
  assert_true(fabs(get(j, "metrics.ttft_p50_ms")->valuedouble - 4.0) < 1e-9);
  assert_int_equal(get(j, "metrics.requests")->valueint, 20);
  assert_int_equal(get(j, "metrics.peak_device_bytes")->valueint, 8 << 20);
  assert_int_equal(get(j, "run.config.prefetch_depth")->valueint, 2);
  assert_string_equal(get(j, "run.git_rev")->valuestring, "v0.1-3-gabcdef");
  tu_check_schema(j, "db-show");
  cJSON_Delete(j);
  assert_int_equal(tu_run_ferryf(&out, "db show 7 --format csv --db '%s'", db_b), 0);
  assert_true(strncmp(out, "key,value\n", 10) == 0);
  const char *row = strstr(out, "\nmetrics.tpot_p50_ms,");
  assert_non_null(row);
  assert_true(fabs(strtod(row + 21, NULL) - 14.56) < 1e-9);
  assert_true(tu_contains(out, "\nrun.config.prefetch_depth,2\n"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db show 7 --format md --db '%s'", db_b), 0);
  assert_true(tu_contains(out, "| metrics.tpot\\_p50\\_ms | 14.5"));
  free(out);
}

static void test_tolerance(void **state) {
  (void)state;
  char *out;
  /* run 6 of base.db against run 6 of cand.db: one run each, TPOT 10 -> 14 ms (+40 %) */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:6' '%s:6'", db_a, db_b), 3);
  assert_true(tu_contains(out, "tpot_p50_ms"));
  assert_true(tu_contains(out, "+40.00%  REGRESSION"));
  assert_true(tu_contains(out, "verdict: regression"));
  free(out);
  /* 0.5 and 50% both mean fifty percent: +40 % is within */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:6' '%s:6' --tolerance 0.5", db_a, db_b), 0);
  assert_true(tu_contains(out, "no regression beyond 50.00%"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:6' '%s:6' --tolerance 50%%", db_a, db_b), 0);
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:6' '%s:6' --tolerance 0.3", db_a, db_b), 3);
  free(out);
  /* a bare 5 is ambiguous (5 % or 500 %?): refused with the way to write it */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:6' '%s:6' --tolerance 5", db_a, db_b), 2);
  assert_true(tu_contains(out, "write 5% for 5 percent"));
  free(out);
}

static void test_diff_groups(void **state) {
  (void)state;
  char args[1400], *out;
  /* the same configuration within noise: one run of a group stands for the group */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:3' '%s:1'", db_a, db_b), 0);
  assert_true(tu_contains(out, "runs 1-5 (host"));
  assert_true(tu_contains(out, "Mann-Whitney"));
  assert_true(tu_contains(out, "verdict: no significant change"));
  free(out);
  /* 40 % slower with 4 % noise: every candidate run is worse than every baseline run */
  snprintf(args, sizeof args, "db diff '%s:1' '%s:6' --format json", db_a, db_b);
  cJSON *j = json_of(3, args);
  assert_string_equal(get(j, "verdict")->valuestring, "regression");
  assert_string_equal(get(j, "method")->valuestring, "mann-whitney-u");
  assert_int_equal(cJSON_GetArraySize(get(j, "a.runs")), 5);
  const cJSON *m;
  int seen = 0;
  cJSON_ArrayForEach(m, get(j, "metrics")) {
    if (strcmp(get(m, "name")->valuestring, "tpot_p50_ms")) continue;
    seen = 1;
    assert_string_equal(get(m, "verdict")->valuestring, "regression");
    assert_true(get(m, "p_value")->valuedouble < 0.01); /* 1/252: complete separation */
    assert_true(fabs(get(m, "effect")->valuedouble - 1.0) < 1e-9);
    assert_true(fabs(get(m, "change_pct")->valuedouble - 40.0) < 1e-6);
  }
  assert_true(seen);
  tu_check_schema(j, "db-diff");
  cJSON_Delete(j);
  /* the other way round it is an improvement, exit 0 */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:6' '%s:1'", db_b, db_a), 0);
  assert_true(tu_contains(out, "verdict: improvement"));
  free(out);
  /* the same 40 % within a 50 % tolerance: the test asks for worse beyond the tolerance */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:1' '%s:6' --tolerance 50%%", db_a, db_b), 0);
  assert_true(tu_contains(out, "verdict: no significant change"));
  free(out);
  /* explicit lists and ranges, --db for a side without DB: */
  assert_int_equal(tu_run_ferryf(&out, "db diff 1,2,3 4-5 --db '%s'", db_a), 0);
  assert_true(tu_contains(out, "runs 1-3 (host"));
  assert_true(tu_contains(out, "runs 4-5 (host"));
  free(out);
  /* two runs of one group: the runs themselves */
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 2 --db '%s'", db_a), 0);
  assert_true(tu_contains(out, "of one repeat group"));
  assert_true(tu_contains(out, "run 1 (host"));
  free(out);
  /* CSV: one row per metric */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:1' '%s:6' --format csv 2>/dev/null", db_a, db_b), 3);
  assert_true(strncmp(out, "name,a,b,change_pct,higher_is_better,n_a,n_b,p_value,effect,verdict,gated\n", 74) == 0);
  assert_true(tu_contains(out, "\ntpot_p50_ms,10,14,40"));
  free(out);
}

static void test_like_with_like(void **state) {
  (void)state;
  char *out;
  /* another kind: refused, named */
  assert_int_equal(tu_run_ferryf(&out, "db diff 6 7 --db '%s'", db_a), 1);
  assert_true(tu_contains(out, "A is a host run and B a sim run"));
  assert_true(tu_contains(out, "--force"));
  free(out);
  /* another configuration: refused with the key that differs */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:1' '%s:11'", db_a, db_b), 1);
  assert_true(tu_contains(out, "prefetch_depth 2 -> 1"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s:1' '%s:11' --force", db_a, db_b), 3);
  assert_true(tu_contains(out, "warning: A and B ran different configurations"));
  free(out);
  /* runs pooled on one side must be repeats of one configuration */
  assert_int_equal(tu_run_ferryf(&out, "db diff 6,7 1 --db '%s'", db_a), 1);
  assert_true(tu_contains(out, "not repeats of one measurement"));
  free(out);
  /* malformed sides */
  assert_int_equal(tu_run_ferryf(&out, "db diff '%s' 1 --db '%s'", db_b, db_a), 2);
  assert_true(tu_contains(out, "expected [DB:]RUNS"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 2"), 2);
  assert_true(tu_contains(out, "--db FILE"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "db diff 1 99 --db '%s'", db_a), 1);
  assert_true(tu_contains(out, "no run 99"));
  free(out);
}

/* The run/sim summary: one row per repetition, each its own run of one group in --db. */
static void test_run_summary_formats(void **state) {
  (void)state;
  char args[1400], *out;
  snprintf(args, sizeof args,
           "sim --model tiny-dense --hw l4 --synthetic rate=100,n=4,prompt=16,output=8 --repeat 3 --format json "
           "--db '%s/sim.db' --quiet",
           dir);
  cJSON *j = json_of(0, args);
  assert_string_equal(get(j, "schema")->valuestring, "ferry.run.v1");
  assert_string_equal(get(j, "command")->valuestring, "sim");
  assert_int_equal(cJSON_GetArraySize(get(j, "runs")), 3);
  assert_int_equal(get(j, "runs.2.run_id")->valueint, 3);
  assert_int_equal(get(j, "runs.2.repetition")->valueint, 2);
  assert_int_equal(get(j, "runs.0.requests_done")->valueint, 4);
  assert_int_equal(get(j, "runs.0.tokens_generated")->valueint, 32);
  assert_true(get(j, "runs.0.tpot_ms.p50")->valuedouble > 0);
  /* the simulator is deterministic: every repetition the same */
  assert_true(get(j, "runs.0.e2e_ms.p99")->valuedouble == get(j, "runs.2.e2e_ms.p99")->valuedouble);
  const char *group = get(j, "repeat_group")->valuestring;
  assert_true(strncmp(group, "repeat-", 7) == 0);
  tu_check_schema(j, "run");
  snprintf(args, sizeof args, "db list --format json --db '%s/sim.db'", dir);
  cJSON *l = json_of(0, args);
  for (int i = 0; i < 3; i++) {
    char path[64];
    snprintf(path, sizeof path, "runs.%d.repeat_group", i);
    assert_string_equal(get(l, path)->valuestring, group);
  }
  cJSON_Delete(l);
  cJSON_Delete(j);
  /* provenance: the build's git describe in runs.git_rev and in the facts, the machine's */
  snprintf(args, sizeof args, "db show 2 --format json --db '%s/sim.db'", dir);
  j = json_of(0, args);
  const char *describe = get(j, "provenance.BUILD_GIT_DESCRIBE")->valuestring;
  assert_string_equal(get(j, "run.git_rev")->valuestring, describe);
  char git[600];
  const char *src = getenv("FERRY_SOURCE_DIR");
  snprintf(git, sizeof git, "git -C '%s' rev-parse --short=7 HEAD >/dev/null 2>&1", src ? src : ".");
  if (system(git) == 0) assert_true(strlen(describe) >= 7); /* a git build names its commit */
  assert_true(strncmp(get(j, "provenance.BUILD_BLAS")->valuestring, "OpenBLAS", 8) == 0);
  assert_true(strlen(get(j, "provenance.BUILD_COMPILER")->valuestring) > 2);
  assert_int_equal(atol(get(j, "provenance.MACHINE_CPU_CORES")->valuestring), sysconf(_SC_NPROCESSORS_ONLN));
  assert_true(strtoull(get(j, "provenance.MACHINE_MEMORY_BYTES")->valuestring, NULL, 10) > (1ull << 26));
  assert_true(strncmp(get(j, "provenance.MACHINE_KERNEL")->valuestring, "Linux ", 6) == 0);
  tu_check_schema(j, "db-show");
  cJSON_Delete(j);
  snprintf(args, sizeof args, "db show 2 --db '%s/sim.db'", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "\n  build      "));
  assert_true(tu_contains(out, "\n  machine    "));
  assert_true(tu_contains(out, "repeat     2 of group repeat-"));
  free(out);
  snprintf(args, sizeof args,
           "sim --model tiny-dense --hw l4 --synthetic rate=100,n=4,prompt=16,output=8 --repeat 2 --format csv --quiet");
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(strncmp(out, "repetition,run_id,requests_done,", 32) == 0);
  assert_true(tu_contains(out, "\n1,,4,0,"));
  free(out);
  /* text: the spread over repetitions */
  snprintf(args, sizeof args, "sim --model tiny-dense --hw l4 --synthetic rate=100,n=4,prompt=16,output=8 --repeat 2 --quiet");
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "repetition 2 of 2"));
  assert_true(tu_contains(out, "over 2 repetitions: mean +- standard deviation"));
  free(out);
  /* refused: a group without a database, repeats writing one file over */
  assert_int_equal(tu_run_ferry("sim --model tiny-dense --hw l4 --synthetic n=4 --repeat-group x", &out), 2);
  assert_true(tu_contains(out, "--repeat-group tags runs in --db FILE"));
  free(out);
  assert_int_equal(tu_run_ferry("sim --model tiny-dense --hw l4 --synthetic n=4 --plan-only --format json", &out), 2);
  assert_true(tu_contains(out, "--format does nothing with --plan-only"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_list_formats), cmocka_unit_test(test_show_formats), cmocka_unit_test(test_tolerance),
      cmocka_unit_test(test_diff_groups),  cmocka_unit_test(test_like_with_like),
      cmocka_unit_test(test_run_summary_formats),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
