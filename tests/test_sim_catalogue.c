/* Every catalogue model simulated for a few steps through `ferry sim`, with uniform and with
 * skewed synthetic routing for the MoE ones: under the asan preset this is the check that no
 * model shape (top-k of 2, 4 or 8, 8 to 64 experts) walks off an array in the engine, the
 * simulator or the synthetic routing model (a top-k >= 3 draw once read perm[-1]), with plain
 * skewed routing and with a calibrated profile. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/model.h"
#include "testutil.h"

static void sim_one(const char *model, const char *extra) {
  char args[512], *out = NULL;
  snprintf(args, sizeof args,
           "sim --model %s --hw h100-pcie --synthetic rate=50,n=2,prompt=12,output=3 --max-batch 2 --quiet %s", model,
           extra);
  int rc = tu_run_ferry(args, &out);
  if (rc != 0 || !tu_contains(out, "requests: 2 done"))
    fprintf(stderr, "ferry %s\nexit %d:\n%s\n", args, rc, out ? out : "(no output)");
  int done = out && tu_contains(out, "requests: 2 done, 0 rejected");
  free(out);
  assert_int_equal(rc, 0);
  assert_true(done);
}

static void test_every_preset(void **state) {
  (void)state;
  size_t n = ferry_model_preset_count(), moe = 0;
  assert_true(n >= 10);
  for (size_t i = 0; i < n; i++) {
    const char *name = ferry_model_preset_name(i);
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_open(&m, name), FERRY_OK);
    const struct ferry_model_config *c = ferry_model_get_config(m);
    int is_moe = c->n_experts > 0;
    int64_t k = c->experts_per_token;
    ferry_model_close(m);
    sim_one(name, "");
    if (!is_moe) continue;
    moe++;
    /* skewed popularity makes repeated draws (and the top-k >= 3 redraw path) common */
    char spec[128];
    snprintf(spec, sizeof spec, "--routing-synth zipf=3,temporal=0.3,layer=0.4,seed=%lld", (long long)(k + 7));
    sim_one(name, spec);
    /* a calibrated profile on another shape: domains, co-activation pairs, sticky choices */
    sim_one(name, "--routing-synth profile=olmoe,seed=3");
  }
  assert_true(moe >= 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_preset)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
