/* The report's routing sections: runs that replay a routing trace store its statistics, and
 * the report shows the trace once (however many runs and roles used it) with a per-layer
 * table; the predictor table carries 95% intervals. Damaged or hostile run metadata (invalid
 * JSON, control characters and markup in a source path) is skipped or made inert. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "testutil.h"

static void ferry_ok(const char *args) {
  char *out = NULL;
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  free(out);
}

static void test_sections(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("reportrouting");
  char args[2048];
  /* tiny-moe's shape: 6 layers, 8 experts, top-2 */
  snprintf(args, sizeof args, "trace routing --synth profile=mixtral,layers=6,seed=2 --requests 6 --tokens 64 --out '%s/r.jsonl'",
           dir);
  ferry_ok(args);
  const char *preds[2] = {"lru", "frequency"};
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args,
             "sim --model tiny-moe --hw h100-pcie --synthetic rate=20,n=6,prompt=16,output=8 --device-budget 8MiB "
             "--max-batch 2 --quiet --routing '%s/r.jsonl' --predictor %s%s%s%s --db '%s/s.db'",
             dir, preds[i], i ? " --predictor-routing '" : "", i ? dir : "", i ? "/r.jsonl'" : "", dir);
    ferry_ok(args);
  }
  /* hostile metadata: not JSON, and a source with a control character, a table separator and markup */
  char *db_path = ferry__asprintf("%s/s.db", dir);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(db_path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db,
                                "INSERT INTO META_DATA_EXPORT(runId, name, value) VALUES "
                                "(1, 'ROUTING_STATS_RECORDED', '{not json'), "
                                "(2, 'ROUTING_STATS_RECORDED', '{\"role\":\"recorded\",\"source\":\"x\x1f|<b>y\\n\","
                                "\"shape\":{\"layers\":1,\"experts\":2,\"top_k\":1,\"rows\":3},\"overall\":{},"
                                "\"layers\":[{\"layer\":0,\"busiest_share\":\"big\"}]}')",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  sqlite3_close(db);
  char *out = NULL;
  snprintf(args, sizeof args, "report --db '%s' --out '%s/rep'", db_path, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  assert_true(tu_contains(out, "predictor-intervals routing"));
  free(out);
  char *md_path = ferry__asprintf("%s/rep/report.md", dir), *md = NULL;
  size_t len = 0;
  assert_int_equal(ferry__read_file(md_path, 1 << 24, &md, &len, NULL), FERRY_OK);
  assert_true(tu_contains(md, "## Expert predictors with confidence intervals"));
  assert_true(tu_contains(md, "| frequency | 1 | ")); /* one run each, with an interval: */
  assert_true(tu_contains(strstr(md, "| frequency | 1 | "), " ["));
  assert_true(tu_contains(md, "## Routing traces"));
  assert_true(tu_contains(md, "replayed, predictor")); /* one row for the trace in both roles */
  assert_true(tu_contains(md, "| 2 | 6 x 8, top-2 |")); /* used by both runs */
  assert_true(tu_contains(md, "r.jsonl) per layer"));
  assert_false(tu_contains(md, "{not json"));
  assert_true(tu_contains(md, "x?\\|")); /* the control character never reaches a table cell, the bar is escaped */
  char *html_path = ferry__asprintf("%s/rep/index.html", dir), *html = NULL;
  assert_int_equal(ferry__read_file(html_path, 1 << 24, &html, &len, NULL), FERRY_OK);
  assert_false(tu_contains(html, "<b>y")); /* the markup in the source path is inert */
  assert_true(tu_contains(html, "&lt;b&gt;y"));
  ferry_free(html);
  ferry_free(html_path);
  char *csv_path = ferry__asprintf("%s/rep/tables/routing_1.csv", dir);
  assert_true(ferry__is_file(csv_path));
  ferry_free(csv_path);
  ferry_free(md);
  ferry_free(md_path);
  ferry_free(db_path);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sections)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
