/* `ferry sim --sensitivity PCT` end to end: the base run is the plain run, a run bound by the
 * link moves its TPOT by what a link PCT % slower costs (1 / (1 - PCT/100) - 1) and by no more,
 * a figure the run never uses moves nothing, figures come with what they rest on, a default that
 * moves the answer is warned about, and the options it cannot go with are refused. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* OPT-30B streamed a layer at a time from pinned host memory into an 8 GiB budget, one request:
 * every decode step waits for the link (24 GB/s against 768 GB/s of GPU memory). */
#define LINK_BOUND "sim --model opt-30b --hw rtx-a6000 --synthetic n=1,prompt=8,output=4 --as-fast-as-possible " \
                   "--device-budget 8GiB --quiet"

/* The JSON document at the start of out (warnings may follow it on the merged stderr). */
static cJSON *parse_doc(const char *out) {
  const char *end = NULL;
  cJSON *doc = cJSON_ParseWithOpts(out, &end, 0);
  if (!doc) fail_msg("not JSON: %.400s", out);
  return doc;
}

static const cJSON *figure(const cJSON *doc, const char *path) {
  const cJSON *f;
  cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(doc, "figures")) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "figure");
    if (cJSON_IsString(name) && !strcmp(name->valuestring, path)) return f;
  }
  return NULL;
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v)) fail_msg("%s is not a number", key);
  return v->valuedouble;
}

static void test_link_bound(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferry(LINK_BOUND " --format json", &out), 0);
  cJSON *plain = parse_doc(out);
  free(out);
  const cJSON *run0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(plain, "runs"), 0);
  assert_non_null(run0);
  const double plain_tpot_ms = num(cJSON_GetObjectItemCaseSensitive(run0, "tpot_ms"), "mean");

  assert_int_equal(tu_run_ferry(LINK_BOUND " --sensitivity 10 --format json", &out), 0);
  cJSON *doc = parse_doc(out);
  tu_check_schema(doc, "sensitivity");
  const cJSON *schema = cJSON_GetObjectItemCaseSensitive(doc, "schema");
  assert_true(cJSON_IsString(schema) && !strcmp(schema->valuestring, "ferry.sensitivity.v1"));
  assert_true(num(doc, "step_pct") == 10);
  /* the base is the run as given */
  assert_true(fabs(num(cJSON_GetObjectItemCaseSensitive(doc, "base"), "tpot_mean_ms") - plain_tpot_ms) <=
              1e-9 * plain_tpot_ms);
  /* a link 10 % slower: the link-bound decode 1/0.9 - 1 = 11.1 % slower, and no more */
  const cJSON *link = figure(doc, "link.h2d_gbps");
  assert_non_null(link);
  const double tpot = num(link, "tpot_mean_change_pct");
  if (!(tpot > 10.0 && tpot <= 100.0 / 9.0 + 1e-6)) fail_msg("link.h2d_gbps 10 %% lower moved TPOT %+.3f %%", tpot);
  assert_true(num(link, "tokens_per_s_change_pct") < -9.0);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(link, "basis")->valuestring, "sourced");
  assert_true(strtod(cJSON_GetObjectItemCaseSensitive(link, "lowered_to")->valuestring, NULL) ==
              num(link, "value") * 0.9);
  /* nothing is read from disk: its rate moves nothing */
  const cJSON *disk = figure(doc, "disk.read_gbps");
  assert_non_null(disk);
  assert_true(num(disk, "tpot_mean_change_pct") == 0 && num(disk, "ttft_mean_change_pct") == 0);
  /* the rows come largest change first, the link's at the top */
  const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "figures"), 0);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(first, "figure")->valuestring, "link.h2d_gbps");
  /* the figures are the profile's and the native runtime's (no --runtime, the profile has none) */
  assert_non_null(figure(doc, "runtime.launch_ns"));
  assert_null(figure(doc, "host.memory_bytes"));
  cJSON_Delete(doc);
  cJSON_Delete(plain);
  free(out);

  /* text: the summary, then the table with the link's row */
  assert_int_equal(tu_run_ferry(LINK_BOUND " --sensitivity 10", &out), 0);
  assert_true(tu_contains(out, "requests: 1 done"));
  assert_true(tu_contains(out, "sensitivity: each figure 10 % lower"));
  assert_true(tu_contains(out, "link.h2d_gbps"));
  assert_true(tu_contains(out, "no change (under"));
  free(out);
}

/* With --replicas the text summary starts with a line per replica, the run's own, printed once:
 * the lowered runs print nothing of their own, one after another or in parallel. */
static void test_prints_once(void **state) {
  (void)state;
  static const char *const jobs[] = {"1", "2"};
  for (int i = 0; i < 2; i++) {
    char *out = NULL;
    assert_int_equal(tu_run_ferryf(&out,
                                   "sim --model llama-3-8b --hw l4 --synthetic rate=5,n=8,prompt=64,output=8 --replicas 2 "
                                   "--quiet --sensitivity 10 --jobs %s",
                                   jobs[i]),
                     0);
    const char *first = strstr(out, "replicas: 2"), *summary = strstr(out, "requests: 8 done");
    assert_non_null(first);
    assert_null(strstr(first + 1, "replicas: 2"));
    assert_non_null(summary);
    assert_null(strstr(summary + 1, "requests: 8 done"));
    free(out);
  }
}

/* --jobs shares the runs out over worker processes: the same document as one after another. */
static void test_jobs_same(void **state) {
  (void)state;
  char *one = NULL, *three = NULL;
  assert_int_equal(tu_run_ferry(LINK_BOUND " --sensitivity 10 --format json --jobs 1", &one), 0);
  assert_int_equal(tu_run_ferry(LINK_BOUND " --sensitivity 10 --format json --jobs 3", &three), 0);
  assert_string_equal(one, three);
  cJSON *doc = parse_doc(three);
  assert_true(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "figures")) > 10);
  cJSON_Delete(doc);
  free(one);
  free(three);
}

/* A ferry default that moves the answer is named on stderr: the prefill of a long prompt is
 * bound by the GEMM efficiency, a default of the reader (gpu.efficiency.gemm 0.7). */
static void test_warns_of_defaults(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferry("sim --model llama-3-8b --hw h100-pcie --runtime graph --synthetic n=1,prompt=4096,output=2 "
                                "--as-fast-as-possible --max-step-tokens 4096 --quiet --sensitivity 20",
                                &out),
                   0);
  assert_true(tu_contains(out, "ferry: sensitivity: TTFT mean moves"));
  assert_true(tu_contains(out, "gpu.efficiency.gemm 20 % lower, and that figure is a ferry default"));
  free(out);
}

static void test_refused(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_not_equal(tu_run_ferry(LINK_BOUND " --sensitivity 10 --db /tmp/ferry-sensitivity-never.db", &out), 0);
  assert_true(tu_contains(out, "--db does not go with --sensitivity"));
  free(out);
  assert_int_not_equal(tu_run_ferry(LINK_BOUND " --sensitivity 10 --repeat 3", &out), 0);
  assert_true(tu_contains(out, "--repeat does not go with --sensitivity"));
  free(out);
  assert_int_not_equal(tu_run_ferry(LINK_BOUND " --jobs 2", &out), 0);
  assert_true(tu_contains(out, "--jobs runs --sensitivity's simulations in parallel"));
  free(out);
  assert_int_not_equal(tu_run_ferry(LINK_BOUND " --sensitivity 0", &out), 0); /* out of [0.1, 50] */
  free(out);
  assert_int_not_equal(tu_run_ferry(LINK_BOUND " --sensitivity 80", &out), 0);
  free(out);
  assert_int_not_equal(tu_run_ferry("run --model x --synthetic n=1 --sensitivity 10", &out), 0);
  assert_true(tu_contains(out, "sensitivity"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_link_bound),
      cmocka_unit_test(test_jobs_same),
      cmocka_unit_test(test_prints_once),
      cmocka_unit_test(test_warns_of_defaults),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
