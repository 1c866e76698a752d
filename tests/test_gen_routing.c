/* Router weights of `ferry model gen --routing-profile`: a real host run of the generated model
 * routes with a trained router's gate spread and a balanced load, layer l's first choice
 * predicts layer l+1's under the mixtral profile (through a permutation, not equal ids) and not
 * under uniform, and the token clusters make the mlp3 features worth more than popularity. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "ferry/routing.h"
#include "testutil.h"

/* Generate tiny-moe with the profile, serve a few requests on the host executor, return the
 * recorded routing's statistics and the path of the trace (owned). */
static char *run_profile(const char *dir, const char *profile, struct ferry_routing_stats *s) {
  char args[1024], *out = NULL;
  snprintf(args, sizeof args, "model gen --preset tiny-moe --routing-profile %s --quiet --out '%s/%s'", profile, dir,
           profile);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  free(out);
  char *trace = ferry__asprintf("%s/%s.jsonl", dir, profile);
  snprintf(args, sizeof args,
           "run --model '%s/%s' --synthetic rate=50,n=6,prompt=48,output=32 --quiet --record-routing '%s' "
           "--record-features mlp3",
           dir, profile, trace);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  free(out);
  ferry_routing *r = NULL;
  assert_int_equal(ferry_routing_open(&r, trace, NULL), FERRY_OK);
  assert_int_equal(ferry_routing_stats_compute(r, s), FERRY_OK);
  ferry_routing_free(r);
  return trace;
}

/* Recall of a predictor in the table of `ferry predictor eval --variant a,b`. */
static double table_recall(const char *out, const char *name) {
  char key[32];
  snprintf(key, sizeof key, "\n%s ", name);
  const char *p = strstr(out, key);
  if (!p) fail_msg("no row for %s in: %s", name, out);
  double v = NAN;
  assert_int_equal(sscanf(p + strlen(key), " %lf", &v), 1);
  return v;
}

static void test_profiles(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("genrouting");
  struct ferry_routing_stats mix, uni;
  char *mix_trace = run_profile(dir, "mixtral", &mix), *uni_trace = run_profile(dir, "uniform", &uni);
  fprintf(stderr, "mixtral: gate %.3f busiest %.3f next-first %.3f (base %.3f); uniform: gate %.3f busiest %.3f "
                  "next-first %.3f (base %.3f)\n",
          mix.gate_top1_mean, mix.busiest_share, mix.next_first_acc, mix.next_first_base, uni.gate_top1_mean,
          uni.busiest_share, uni.next_first_acc, uni.next_first_base);
  const struct ferry_routing_stats *both[2] = {&mix, &uni};
  for (int i = 0; i < 2; i++) {
    assert_true(both[i]->gate_top1_mean > 0.55 && both[i]->gate_top1_mean < 0.9); /* neither equal nor 0.998 */
    assert_true(both[i]->busiest_share < 0.25);                                   /* no expert takes over */
  }
  assert_true(mix.next_first_acc > mix.next_first_base + 0.2);
  assert_true(uni.next_first_acc < uni.next_first_base + 0.15);
  assert_true(mix.next_overlap < 0.4); /* predictable through the permutation, not by equal ids */
  char args[1024], *out = NULL;
  snprintf(args, sizeof args, "predictor eval --routing '%s' --variant frequency,mlp3 --bootstrap 200", mix_trace);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  assert_true(table_recall(out, "mlp3") > table_recall(out, "frequency") + 0.05);
  free(out);
  snprintf(args, sizeof args, "model gen --preset tiny-moe --routing-profile mixtral --router-skew 0.5 --out '%s/x'", dir);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "without --router-skew"));
  free(out);
  snprintf(args, sizeof args, "model gen --preset tiny-moe --routing-profile switch --out '%s/x'", dir);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "routing profile 'switch' is unknown"));
  free(out);
  ferry_routing_stats_free(&mix);
  ferry_routing_stats_free(&uni);
  ferry_free(mix_trace);
  ferry_free(uni_trace);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_profiles)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
