/* Hybrid execution in the simulator: what crosses the link when experts or layers are computed
 * on the CPU (exactly the activations the engine moves, no weights), the CPU's time priced from
 * the profile's cores, per-core peaks and DDR bandwidth, and the device plan of experts on the
 * CPU: the budget an absent expert cache leaves pins layers, and `--plan-only` plans the expert
 * cache a predictor or a static placement will fill as the run does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/routing.h"
#include "ferry/sim.h"
#include "testutil.h"

static char *tmp;

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("sim_hybrid");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

/* A GPU with round figures and a CPU of `cores` cores at 10 GFLOP/s each (fp32) reading `dram`
 * GB/s, no fixed cost per CPU op; `runtime` is a runtime section (with its leading comma) or "". */
static ferry_hw *profile_with(const char *name, int cores, double dram, const char *runtime) {
  char path[512], text[2048];
  snprintf(path, sizeof path, "%s/%s.json", tmp, name);
  snprintf(text, sizeof text,
           "{\"name\": \"%s\", \"kind\": \"gpu\","
           " \"gpu\": {\"name\": \"G\", \"memory_bytes\": 1073741824, \"mem_bw_gbps\": 100,"
           " \"peak_tflops\": {\"fp32\": 1, \"fp16\": 10}, \"launch_overhead_ns\": 100},"
           " \"link\": {\"name\": \"L\", \"h2d_gbps\": 1, \"d2h_gbps\": 1, \"latency_ns\": 0, \"copy_engines\": 1},"
           " \"host\": {\"name\": \"H\", \"dram_gbps\": %g, \"cores\": %d, \"core_gflops\": {\"fp32\": 10},"
           " \"cpu_op_ns\": 0, \"memory_bytes\": 1073741824},"
           " \"disk\": {\"name\": \"D\", \"read_gbps\": 2, \"latency_ns\": 10000, \"queue_depth\": 4}%s}",
           name, dram, cores, runtime);
  tu_write_file(path, text, strlen(text));
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  return hw;
}

static ferry_hw *profile(const char *name, int cores, double dram) { return profile_with(name, cores, dram, ""); }

static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 40, .output_tokens = 12},
    {.id = 1, .prompt_tokens = 9, .output_tokens = 20},
    {.id = 2, .prompt_tokens = 70, .output_tokens = 8},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

struct run {
  ferry_exec *ex;
  ferry_engine *eng;
  ferry_model *model;
  ferry_routing_synth *synth;
  const struct ferry_step_metrics *steps;
  int64_t n_steps;
};

static void run(struct run *r, const char *preset, ferry_hw *hw, struct ferry_engine_config cfg, uint64_t extra) {
  memset(r, 0, sizeof *r);
  assert_int_equal(ferry_model_open(&r->model, preset), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(r->model);
  if (mc->n_experts) {
    struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                            .top_k = (int32_t)mc->experts_per_token, .seed = 3};
    assert_int_equal(ferry_routing_synth_create(&r->synth, &sc), FERRY_OK);
    cfg.routing = ferry_routing_synth_fn;
    cfg.routing_user = r->synth;
  }
  uint64_t dmin = 0, hmin = 0;
  assert_int_equal(ferry_engine_min_budgets(r->model, NULL, &cfg, &dmin, &hmin), FERRY_OK);
  cfg.device_budget_bytes = dmin + extra;
  struct ferry_exec_config xc = {.device_budget_bytes = cfg.device_budget_bytes, .lock_host_memory = 1};
  assert_int_equal(ferry_exec_create_sim(&r->ex, hw, &xc), FERRY_OK);
  ferry_status st = ferry_engine_create(&r->eng, r->model, NULL, r->ex, &cfg);
  if (st != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  st = ferry_engine_run(r->eng, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1});
  if (st != FERRY_OK) fail_msg("engine_run: %s", ferry_last_error());
  r->steps = ferry_engine_step_metrics(r->eng, &r->n_steps);
}

static void run_free(struct run *r) {
  ferry_engine_destroy(r->eng);
  ferry_exec_destroy(r->ex);
  ferry_routing_synth_free(r->synth);
  ferry_model_close(r->model);
}

static struct ferry_engine_config base(void) {
  struct ferry_engine_config c = {.block_layers = 1, .prefetch_depth = 1, .max_batch = 4, .max_step_tokens = 64,
                                  .max_seq_tokens = 128, .seed = 7};
  return c;
}

/* Experts on the CPU with attention resident: no expert is fetched; per step and MoE layer the
 * input and the gate weights go down (T x hidden and T x k elements) and the CPU's sum comes back
 * (T x hidden), and that is all the host-to-device traffic there is. */
static void test_experts_on_cpu_traffic(void **state) {
  (void)state;
  ferry_hw *hw = profile("cpu8", 8, 10);
  struct ferry_engine_config c = base();
  c.resident_attention = 1;
  c.compute_experts = FERRY_COMPUTE_CPU;
  struct run r;
  run(&r, "tiny-moe", hw, c, 1 << 20);
  const struct ferry_model_config *mc = ferry_model_get_config(r.model);
  int64_t cpu_experts = 0;
  for (int64_t s = 0; s < r.n_steps; s++) {
    const struct ferry_step_metrics *m = &r.steps[s];
    const uint64_t T = (uint64_t)m->tokens, H = (uint64_t)mc->hidden, K = (uint64_t)mc->experts_per_token;
    const uint64_t layers = (uint64_t)mc->n_layers; /* every layer of tiny-moe routes */
    assert_int_equal(m->misses, 0);
    assert_int_equal(m->hits, 0);
    /* at the simulated GPU runtime's 2 bytes an element (the profile names no runtime: fp16) */
    assert_int_equal(m->bytes_act, layers * (T * H * 2 + T * K * 2 + T * H * 2));
    assert_int_equal(m->bytes_h2d, layers * T * H * 2);
    assert_true(m->cpu_busy_ns > 0);
    cpu_experts += m->cpu_experts;
  }
  assert_true(cpu_experts > 0);
  run_free(&r);
  ferry_hw_close(hw);
}

/* Streamed layers on the CPU: the hidden state goes down before the first streamed layer and up
 * before the pinned last ones, once per step; no block moves. */
static void test_layers_on_cpu_traffic(void **state) {
  (void)state;
  ferry_hw *hw = profile("cpu8l", 8, 10);
  struct ferry_engine_config c = base();
  c.pin_last = 2;
  c.compute_layers = FERRY_COMPUTE_CPU;
  struct run r;
  run(&r, "tiny-dense", hw, c, 0);
  const struct ferry_model_config *mc = ferry_model_get_config(r.model);
  for (int64_t s = 0; s < r.n_steps; s++) {
    const struct ferry_step_metrics *m = &r.steps[s];
    const uint64_t row = (uint64_t)m->tokens * (uint64_t)mc->hidden * 2; /* fp16, as above */
    assert_int_equal(m->bytes_h2d, row);
    assert_int_equal(m->bytes_act, 2 * row);
    assert_int_equal(m->bytes_disk, 0);
    assert_true(m->cpu_busy_ns > 0);
  }
  run_free(&r);
  ferry_hw_close(hw);
}

/* The CPU's time comes from the profile: twice the cores and twice the DDR bandwidth halve every
 * CPU kernel (to the ns each is rounded up to). */
static void test_cpu_priced_from_profile(void **state) {
  (void)state;
  ferry_hw *small = profile("cpu4", 4, 10), *big = profile("cpu8b", 8, 20);
  struct ferry_engine_config c = base();
  c.resident_attention = 1;
  c.compute_experts = FERRY_COMPUTE_CPU;
  struct run a, b;
  run(&a, "tiny-moe", small, c, 1 << 20);
  run(&b, "tiny-moe", big, c, 1 << 20);
  int64_t ta = 0, tb = 0;
  assert_int_equal(a.n_steps, b.n_steps);
  for (int64_t s = 0; s < a.n_steps; s++) ta += a.steps[s].cpu_busy_ns, tb += b.steps[s].cpu_busy_ns;
  assert_true(tb > 0);
  const double ratio = (double)ta / (double)tb;
  if (ratio < 1.95 || ratio > 2.05) fail_msg("CPU time ratio %.3f, expected 2", ratio);
  run_free(&a);
  run_free(&b);
  ferry_hw_close(small);
  ferry_hw_close(big);
}

/* A prefilling step that a CUDA-graph runtime runs eagerly (ktransformers): the model's code
 * waits for its CPU experts (submit, then sync) before its next layer's host work, so each layer's
 * host time (prefill_layer_ns, far above the GPU's) adds to the CPU's instead of hiding under
 * it; a decode-only step, replayed from a graph, pays neither. */
static void test_eager_prefill_waits_for_cpu(void **state) {
  (void)state;
  const int64_t layer_ns = 2000000;
  char rt[256];
  snprintf(rt, sizeof rt,
           ", \"runtime\": {\"name\": \"R\", \"launch_ns\": 0, \"prefill_launch_ns\": 1000,"
           " \"layer_ns\": 0, \"prefill_layer_ns\": %lld, \"fused_dequant\": 1}",
           (long long)layer_ns);
  ferry_hw *hw = profile_with("eagerprefill", 8, 10, rt);
  struct ferry_engine_config c = base();
  c.resident_attention = 1;
  c.compute_experts = FERRY_COMPUTE_CPU;
  struct run r;
  run(&r, "tiny-moe", hw, c, 1 << 20);
  const int64_t layers = ferry_model_get_config(r.model)->n_layers;
  int prefills = 0, decodes = 0;
  for (int64_t s = 0; s < r.n_steps; s++) {
    const struct ferry_step_metrics *m = &r.steps[s];
    const int64_t step_ns = m->end_ns - m->start_ns;
    assert_true(m->cpu_busy_ns > 0);
    if (m->tokens > m->batch) { /* prompt tokens in the step */
      prefills++;
      if (step_ns < m->cpu_busy_ns + layers * layer_ns)
        fail_msg("step %lld: %lld ns, less than its CPU time %lld ns and %lld layers of host work", (long long)s,
                 (long long)step_ns, (long long)m->cpu_busy_ns, (long long)layers);
    } else {
      decodes++;
      assert_true(step_ns < layer_ns);
    }
  }
  assert_true(prefills > 0 && decodes > 0);
  run_free(&r);
  ferry_hw_close(hw);
}

/* A profile without CPU figures cannot price a CPU kernel: the run says which figures. */
static void test_cpu_figures_required(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/nocpu.json", tmp);
  const char *text = "{\"name\": \"nocpu\", \"kind\": \"gpu\","
                     " \"gpu\": {\"name\": \"G\", \"memory_bytes\": 1073741824, \"mem_bw_gbps\": 100,"
                     " \"peak_tflops\": {\"fp32\": 1, \"fp16\": 10}},"
                     " \"link\": {\"name\": \"L\", \"h2d_gbps\": 1, \"d2h_gbps\": 1},"
                     " \"disk\": {\"name\": \"D\", \"read_gbps\": 2}}";
  tu_write_file(path, text, strlen(text));
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  struct ferry_engine_config c = base();
  c.compute_layers = FERRY_COMPUTE_CPU;
  uint64_t dmin = 0, hmin = 0;
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &c, &dmin, &hmin), FERRY_OK);
  c.device_budget_bytes = dmin;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.device_budget_bytes = dmin}), FERRY_OK);
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_OK);
  assert_int_equal(ferry_engine_run(e, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1}),
                   FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "host.cores"));
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_model_close(m);
  ferry_hw_close(hw);
}

/* The layer lines of an engine's plan that say "pinned on device". */
static int pinned_layers(const ferry_engine *e) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  ferry_engine_print_plan(e, f);
  fclose(f);
  int n = 0;
  for (const char *at = text; (at = strstr(at, "\n    layer ")) != NULL; at++) {
    const char *eol = strchr(at + 1, '\n');
    const char *pin = strstr(at, "pinned on device");
    n += pin && (!eol || pin < eol);
  }
  free(text);
  return n;
}

/* Every routed expert on the CPU leaves no expert cache to take the device budget the working
 * set leaves: fill_budget pins the last layers in it, as a dense model's (the default budget sets
 * it: test_run_checks), so the run streams fewer bytes than at the same budget without it, its
 * peak within the budget; at the minimum nothing more is pinned. With an expert cache (a
 * predictor fills one) the budget is the cache's and fill_budget is refused. */
static void test_experts_on_cpu_fill_layers(void **state) {
  (void)state;
  ferry_hw *hw = profile("cpu8f", 8, 10);
  struct ferry_engine_config c = base();
  c.compute_experts = FERRY_COMPUTE_CPU;
  struct run streamed, filled, least;
  run(&streamed, "tiny-moe", hw, c, 1 << 19);
  c.fill_budget = 1;
  run(&filled, "tiny-moe", hw, c, 1 << 19);
  run(&least, "tiny-moe", hw, c, 0);
  const int32_t layers = (int32_t)ferry_model_get_config(filled.model)->n_layers;
  struct ferry_serve_summary a, b;
  ferry_engine_summary(streamed.eng, &a);
  ferry_engine_summary(filled.eng, &b);
  assert_int_equal(pinned_layers(streamed.eng), 0);
  assert_int_equal(pinned_layers(least.eng), 0);
  const int pinned = pinned_layers(filled.eng);
  if (pinned < 1 || pinned >= layers) fail_msg("%d of %d layers pinned with 512 KiB left", pinned, layers);
  assert_true(b.bytes_h2d < a.bytes_h2d);
  assert_true(b.peak_bytes[FERRY_TIER_DEVICE] > a.peak_bytes[FERRY_TIER_DEVICE]);
  assert_int_equal(b.budget_bytes[FERRY_TIER_DEVICE], a.budget_bytes[FERRY_TIER_DEVICE]);
  assert_true(b.peak_bytes[FERRY_TIER_DEVICE] <= b.budget_bytes[FERRY_TIER_DEVICE]);
  assert_true(a.peak_bytes[FERRY_TIER_DEVICE] <= a.budget_bytes[FERRY_TIER_DEVICE]);
  run_free(&streamed);
  run_free(&filled);
  run_free(&least);
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-moe"), FERRY_OK);
  c.predict_planned = 1;
  c.device_budget_bytes = 64 << 20;
  assert_int_equal(ferry_engine_plan_only(m, NULL, &c, stderr), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "expert cache takes it"));
  ferry_model_close(m);
  ferry_hw_close(hw);
}

/* The plan in a command's output: from "plan for" to the first line after it that is not the
 * plan's ("ferry: ..." progress, the summary's "requests: ..."), without its last line's end;
 * owned. */
static char *plan_text(const char *out) {
  const char *at = strstr(out, "plan for ");
  if (!at) fail_msg("no plan in:\n%s", out);
  size_t n = strlen(at);
  const char *stops[] = {"\nferry: ", "\nrequests: "};
  for (size_t i = 0; i < 2; i++) {
    const char *stop = strstr(at, stops[i]);
    if (stop && (size_t)(stop - at) < n) n = (size_t)(stop - at);
  }
  while (n && at[n - 1] == '\n') n--; /* the last line's end, when the output ends there */
  char *plan = strndup(at, n);
  assert_non_null(plan);
  return plan;
}

/* --plan-only prints the plan the run prints with its progress (ferry_engine_print_plan()) when
 * routed experts run on the CPU: a predictor, or a static placement's routing counts, fill an
 * expert cache the run sizes, and gate lookahead keeps every router resident, all known before
 * anything is planned; with a given budget and with the default one (whose note then gives the
 * expert cache the rest). */
static void test_plan_only_is_the_runs(void **state) {
  (void)state;
  char *out = NULL, trace[600], placed[700];
  const char *small = "sim --model tiny-moe --hw h100-pcie --synthetic n=4,prompt=16,output=4 --device-budget 8MiB "
                      "--offload-compute experts=cpu";
  snprintf(trace, sizeof trace, "%s/plan-routing.jsonl", tmp);
  assert_int_equal(tu_run_ferryf(&out, "%s --quiet --record-routing '%s'", small, trace), 0);
  free(out);
  snprintf(placed, sizeof placed, "--expert-cache static --predictor-routing '%s'", trace);
  const char *big = "sim --model mixtral-8x7b --hw l4 --synthetic n=2,prompt=16,output=4 --max-seq-tokens 2048 "
                    "--offload-compute experts=cpu";
  static const char *const cache_note = "attention resident, the expert cache takes the rest";
  const struct {
    const char *run, *more;
    int filled; /* 1: the expert cache has slots */
  } cases[] = {
      {small, "", 0},      {small, "--predictor frequency", 1}, {small, "--predictor gate-lookahead", 1},
      {small, placed, 1},  {big, "", 0},                        {big, "--predictor gate-lookahead", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *planned = NULL, *ran = NULL;
    assert_int_equal(tu_run_ferryf(&planned, "%s %s --plan-only", cases[i].run, cases[i].more), 0);
    assert_int_equal(tu_run_ferryf(&ran, "%s %s", cases[i].run, cases[i].more), 0);
    char *p = plan_text(planned), *r = plan_text(ran);
    if (strcmp(p, r)) fail_msg("%s %s:\n--plan-only:\n%s\nthe run:\n%s", cases[i].run, cases[i].more, p, r);
    const int none = tu_contains(p, "expert cache     0 x");
    if (none == cases[i].filled) fail_msg("%s %s: expert cache%s expected:\n%s", cases[i].run, cases[i].more,
                                          cases[i].filled ? "" : " of none", p);
    if (tu_contains(cases[i].more, "gate-lookahead")) assert_true(tu_contains(p, "embeddings + head + routers"));
    if (cases[i].run == big) assert_int_equal(tu_contains(planned, cache_note), cases[i].filled);
    free(p);
    free(r);
    free(planned);
    free(ran);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_experts_on_cpu_traffic),
      cmocka_unit_test(test_layers_on_cpu_traffic),
      cmocka_unit_test(test_cpu_priced_from_profile),
      cmocka_unit_test(test_cpu_figures_required),
      cmocka_unit_test(test_eager_prefill_waits_for_cpu),
      cmocka_unit_test(test_experts_on_cpu_fill_layers),
      cmocka_unit_test(test_plan_only_is_the_runs),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
