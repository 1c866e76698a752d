/* Strategies are observable: a run records its CPU time, bytes by class, evictions and CPU
 * experts per step and its expert-cache activity per layer (schema 6), and `ferry report`
 * compares runs that offload differently side by side. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "testutil.h"

static char *dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("strategy_report");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  return 0;
}

static double q1(sqlite3 *db, const char *sql) {
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  double v = sqlite3_column_double(q, 0);
  sqlite3_finalize(q);
  return v;
}

static void test_recorded_and_reported(void **state) {
  (void)state;
  char db[512], out[512], cmd[2048];
  snprintf(db, sizeof db, "%s/study.db", dir);
  snprintf(out, sizeof out, "%s/report", dir);
  const char *variants[3] = {"--expert-cache lru", "--expert-cache lfu", "--offload-compute experts=cpu"};
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd,
             "sim --model tiny-moe --hw h100-pcie --synthetic n=6,prompt=32,output=8 --as-fast-as-possible "
             "--max-batch 4 --max-step-tokens 64 --device-budget 4MiB --quiet --db '%s' %s",
             db, variants[i]);
    char *o = NULL;
    if (tu_run_ferry(cmd, &o) != 0) fail_msg("ferry %s: %s", cmd, o);
    free(o);
  }
  sqlite3 *s = NULL;
  assert_int_equal(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  /* LRU streams experts and evicts them; the CPU run moves activations, fetches no expert */
  assert_true(q1(s, "SELECT total(bytes_experts) FROM steps WHERE runId = 1") > 0);
  assert_true(q1(s, "SELECT total(evictions) FROM steps WHERE runId = 1") > 0);
  assert_true(q1(s, "SELECT total(bytes_blocks) FROM steps WHERE runId = 1") > 0);
  assert_true(q1(s, "SELECT total(compute_busy_ns) FROM steps WHERE runId = 1") > 0);
  assert_true(q1(s, "SELECT total(cpu_busy_ns) FROM steps WHERE runId = 3") > 0);
  assert_true(q1(s, "SELECT total(bytes_act) FROM steps WHERE runId = 3") > 0);
  assert_true(q1(s, "SELECT total(cpu_experts) FROM steps WHERE runId = 3") > 0);
  assert_true(q1(s, "SELECT total(bytes_experts) FROM steps WHERE runId = 3") == 0);
  /* the per-layer counts add up to the per-step ones */
  for (int r = 1; r <= 3; r++) {
    char a[256], b[256];
    static const char *const cols[3] = {"hits", "misses", "evictions"};
    for (int c = 0; c < 3; c++) {
      snprintf(a, sizeof a, "SELECT total(%s) FROM steps WHERE runId = %d", cols[c], r);
      snprintf(b, sizeof b, "SELECT total(%s) FROM layer_stats WHERE runId = %d", cols[c], r);
      assert_true(q1(s, a) == q1(s, b));
    }
    snprintf(a, sizeof a, "SELECT total(bytes_blocks) + total(bytes_experts) FROM steps WHERE runId = %d", r);
    snprintf(b, sizeof b, "SELECT total(bytes_h2d) FROM layer_stats WHERE runId = %d", r);
    assert_true(q1(s, a) == q1(s, b));
  }
  assert_true(q1(s, "SELECT count(*) FROM layer_stats WHERE runId = 2") == 6); /* tiny-moe's layers */
  sqlite3_close(s);

  snprintf(cmd, sizeof cmd, "report --db '%s' --out '%s'", db, out);
  char *o = NULL;
  if (tu_run_ferry(cmd, &o) != 0) fail_msg("ferry %s: %s", cmd, o);
  assert_true(tu_contains(o, " strategies"));
  free(o);
  char path[1024];
  snprintf(path, sizeof path, "%s/tables/strategies.csv", out);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  int rows = 0, lfu = 0, cpu = 0;
  while (fgets(line, sizeof line, f)) {
    rows++;
    lfu += strstr(line, "expert_cache=lfu") != NULL;
    cpu += strstr(line, "offload_compute=experts=cpu") != NULL;
  }
  fclose(f);
  assert_int_equal(rows, 4); /* header and three runs */
  assert_int_equal(lfu, 1);
  assert_int_equal(cpu, 1);
  snprintf(path, sizeof path, "%s/plots/strategies.gp", out);
  f = fopen(path, "r");
  assert_non_null(f);
  fclose(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_recorded_and_reported)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
