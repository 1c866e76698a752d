/* Strategies of offloading systems beside the hybrid ones (test_hybrid.c, test_kv.c): whole-layer
 * MoE streaming (a layer's experts move together, only the routed ones are computed) and
 * FlexGen's block schedule (micro-batches share each loaded layer), on the host executor with
 * the resident run's logits, and in the simulator with their traffic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/routing.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

static char *dir, *moe_dir, *dense_dir;

static char *gen(const char *preset, const char *name) {
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 11, .router_skew = 0.5};
  return tu_gen_model(dir, preset, name, &go);
}

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("strategies");
  moe_dir = gen("tiny-moe", "moe");
  dense_dir = gen("tiny-dense", "dense");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(moe_dir);
  free(dense_dir);
  return 0;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 13, .output_tokens = 5}, {.id = 1, .prompt_tokens = 6, .output_tokens = 7},
    {.id = 2, .prompt_tokens = 9, .output_tokens = 4},  {.id = 3, .prompt_tokens = 4, .output_tokens = 6},
    {.id = 4, .prompt_tokens = 17, .output_tokens = 3},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

static struct ferry_engine_config config(void) {
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 32, .seed = 5,
                                  .block_layers = 1, .prefetch_depth = 1};
  return c;
}

/* Serve on the host executor with the minimum device budget plus `extra` (0: resident), the
 * logits handed to on_logits(user, ...); *sum receives the summary. */
static void serve_host(const char *model_dir, struct ferry_engine_config c, uint64_t extra, ferry_logits_fn on_logits,
                       void *user, struct ferry_serve_summary *sum) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  if (extra) {
    uint64_t dmin = 0, hmin = 0;
    assert_int_equal(ferry_engine_min_budgets(m, s, &c, &dmin, &hmin), FERRY_OK);
    c.device_budget_bytes = dmin + extra;
  }
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.device_budget_bytes = c.device_budget_bytes,
                                                                             .compute_threads = 1}),
                   FERRY_OK);
  c.on_logits = on_logits;
  c.logits_user = user;
  if (ferry_engine_create(&e, m, s, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  ferry_engine_summary(e, sum);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

/* Serve on the host executor with the minimum device budget plus `extra` (0: resident). */
static void run_host(const char *model_dir, struct ferry_engine_config c, uint64_t extra, struct tu_logit_log *log) {
  struct ferry_serve_summary sum;
  serve_host(model_dir, c, extra, tu_on_logits, log, &sum);
  assert_int_equal(sum.requests_done, N_REQ);
  assert_true(!sum.budget_bytes[0] || sum.peak_bytes[0] <= sum.budget_bytes[0]);
}

static void assert_same(const struct tu_logit_log *a, const struct tu_logit_log *b) {
  assert_int_equal(a->n, b->n);
  assert_true(a->n > 0);
  assert_memory_equal(a->v, b->v, a->n * sizeof(float));
}

/* A simulated run: per-step metrics copied out. */
struct sim_run {
  struct ferry_step_metrics *steps;
  int64_t n_steps;
  struct ferry_serve_summary sum;
};

static void run_sim(const char *preset, struct ferry_engine_config c, uint64_t extra, uint64_t routing_seed,
                    struct sim_run *out) {
  ferry_hw *hw = NULL;
  ferry_model *m = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  ferry_routing_synth *synth = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  assert_int_equal(ferry_model_open(&m, preset), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  if (mc->n_experts) {
    struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                            .top_k = (int32_t)mc->experts_per_token, .seed = routing_seed};
    assert_int_equal(ferry_routing_synth_create(&synth, &sc), FERRY_OK);
    c.routing = ferry_routing_synth_fn;
    c.routing_user = synth;
  }
  uint64_t dmin = 0, hmin = 0;
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &c, &dmin, &hmin), FERRY_OK);
  c.device_budget_bytes = dmin + extra;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.device_budget_bytes = c.device_budget_bytes,
                                                                                .lock_host_memory = 1}),
                   FERRY_OK);
  if (ferry_engine_create(&e, m, NULL, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &out->n_steps);
  out->steps = malloc((size_t)out->n_steps * sizeof *sm);
  memcpy(out->steps, sm, (size_t)out->n_steps * sizeof *sm);
  ferry_engine_summary(e, &out->sum);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_routing_synth_free(synth);
  ferry_model_close(m);
  ferry_hw_close(hw);
}

/* Whole-layer MoE streaming: the logits of the resident run; every streamed layer's experts
 * arrive each step whatever the routing (two routings, the same bytes), and no expert cache is
 * consulted. */
static void test_expert_granularity_layer(void **state) {
  (void)state;
  struct tu_logit_log ref = {0}, got = {0};
  run_host(moe_dir, config(), 0, &ref);
  struct ferry_engine_config c = config();
  c.expert_granularity_layer = 1;
  run_host(moe_dir, c, 64 << 10, &got);
  assert_same(&ref, &got);
  free(ref.v);
  free(got.v);

  struct sim_run a, b;
  run_sim("tiny-moe", c, 0, 1, &a);
  run_sim("tiny-moe", c, 0, 99, &b);
  assert_int_equal(a.n_steps, b.n_steps);
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-moe"), FERRY_OK);
  struct ferry_model_accounting acc;
  ferry_model_get_accounting(m, &acc);
  const uint64_t all_experts = (uint64_t)(ferry_model_get_config(m)->n_layers * ferry_model_get_config(m)->n_experts) *
                               acc.bytes_expert;
  ferry_model_close(m);
  for (int64_t s = 0; s < a.n_steps; s++) {
    assert_int_equal(a.steps[s].bytes_h2d, b.steps[s].bytes_h2d);
    assert_int_equal(a.steps[s].hits + a.steps[s].misses, 0);
  }
  /* per step every layer streams with all its experts (the blocks are fetched in a cycle) */
  assert_true(a.sum.bytes_h2d / (uint64_t)a.n_steps >= all_experts * 9 / 10);
  free(a.steps);
  free(b.steps);
}

static void assert_close(const struct tu_logit_log *a, const struct tu_logit_log *b) {
  assert_int_equal(a->n, b->n);
  double worst = 0;
  for (size_t i = 0; i < a->n; i++) {
    const double d = fabs((double)a->v[i] - (double)b->v[i]) / (1.0 + fabs((double)a->v[i]));
    if (d > worst) worst = d;
  }
  if (worst > 1e-5) fail_msg("logits differ by %g (relative)", worst);
}

/* The logits of request r's tokens in the order they came (micro-batches reorder the rows). */
struct per_req {
  struct tu_logit_log req[N_REQ];
};

static void on_req_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                          int64_t vocab) {
  struct per_req *p = user;
  tu_on_logits(&p->req[req], req, tok, tokens, n_tokens, l, vocab);
}

static void run_host_per_req(const char *model_dir, struct ferry_engine_config c, uint64_t extra, struct per_req *out) {
  memset(out, 0, sizeof *out);
  struct ferry_serve_summary sum;
  serve_host(model_dir, c, extra, on_req_logits, out, &sum);
}

/* FlexGen's block schedule: N micro-batches of B sequences go through each loaded layer. The
 * logits of each request are the resident run's (within fp32 rounding: batches of another size
 * block the products differently); a step moves the weights once for all N x B sequences, so
 * per step the bytes are those of one batch, and the run takes fewer steps than B alone. */
static void test_gpu_batches(void **state) {
  (void)state;
  struct per_req ref, got;
  struct ferry_engine_config c = config();
  run_host_per_req(dense_dir, c, 0, &ref);
  c.gpu_batches = 2;
  c.max_batch = 2;
  run_host_per_req(dense_dir, c, 64 << 10, &got);
  for (int64_t r = 0; r < N_REQ; r++) {
    assert_true(ref.req[r].n > 0);
    assert_close(&ref.req[r], &got.req[r]);
    free(ref.req[r].v);
    free(got.req[r].v);
  }
  struct sim_run one, two;
  struct ferry_engine_config s1 = config();
  s1.max_batch = 2;
  struct ferry_engine_config s2 = s1;
  s2.gpu_batches = 2;
  run_sim("tiny-dense", s1, 0, 1, &one);
  run_sim("tiny-dense", s2, 0, 1, &two);
  assert_int_equal(two.sum.requests_done, N_REQ);
  assert_true(two.n_steps < one.n_steps);
  assert_true(two.sum.bytes_h2d < one.sum.bytes_h2d);
  /* steps in the middle of the run fetch every block once, whatever the micro-batches */
  assert_int_equal(one.steps[2].bytes_h2d, two.steps[2].bytes_h2d);
  int32_t most = 0;
  for (int64_t s = 0; s < two.n_steps; s++)
    if (two.steps[s].batch > most) most = two.steps[s].batch;
  assert_int_equal(most, 4); /* 2 x 2 sequences in one step */
  free(one.steps);
  free(two.steps);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expert_granularity_layer),
      cmocka_unit_test(test_gpu_batches),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
