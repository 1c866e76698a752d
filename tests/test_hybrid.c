/* Hybrid execution on the host executor: experts, layers and attention computed on the CPU side
 * where their weights or KV cache live, the engine driving the device's queues and the CPU's
 * over one op stream. The logits equal the resident run's within fp32 rounding (a CPU-computed
 * expert's output is summed apart from the device's), only activations cross for what the CPU
 * computes, and the `auto` rule splits the work by the rates it is given. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/model.h"
#include "ferry/store.h"
#include "testutil.h"

static char *dir, *moe_dir, *dense_dir, *mla_dir;

static char *gen(const char *preset, const char *name, double skew) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, preset), FERRY_OK);
  size_t n = strlen(dir) + strlen(name) + 2;
  char *out = malloc(n);
  snprintf(out, n, "%s/%s", dir, name);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 7, .router_skew = skew};
  assert_int_equal(ferry_model_generate(m, &go, out, NULL), FERRY_OK);
  ferry_model_close(m);
  return out;
}

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("hybrid");
  moe_dir = gen("tiny-moe", "moe", 0.5);
  dense_dir = gen("tiny-dense", "dense", 0);
  char *cfg = tu_data_path("configs/tiny/deepseek_v3");
  mla_dir = gen(cfg, "mla", 0);
  free(cfg);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(moe_dir);
  free(dense_dir);
  free(mla_dir);
  return 0;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 11, .output_tokens = 4},
    {.id = 1, .prompt_tokens = 6, .output_tokens = 5},
    {.id = 2, .prompt_tokens = 14, .output_tokens = 3},
    {.id = 3, .prompt_tokens = 3, .output_tokens = 6},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

/* What a run gave: logits, and per-run sums of its step metrics. */
struct outcome {
  struct tu_logit_log log;
  int64_t cpu_experts, misses, hits;
  uint64_t bytes_h2d, bytes_act;
  int64_t cpu_busy_ns;
  int64_t cpu_steps; /* steps with CPU work that fetched no weight */
};

static struct ferry_engine_config config(uint64_t device_budget) {
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 32, .seed = 5,
                                  .block_layers = 1, .prefetch_depth = 1, .device_budget_bytes = device_budget};
  return c;
}

static void run(const char *model_dir, struct ferry_engine_config c, struct outcome *o) {
  memset(o, 0, sizeof *o);
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes, .compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  c.on_logits = tu_on_logits;
  c.logits_user = &o->log;
  ferry_status st = ferry_engine_create(&e, m, s, ex, &c);
  if (st != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  st = ferry_engine_run(e, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1});
  if (st != FERRY_OK) fail_msg("engine_run: %s", ferry_last_error());
  struct ferry_serve_summary sum;
  ferry_engine_summary(e, &sum);
  assert_int_equal(sum.requests_done, N_REQ);
  if (sum.budget_bytes[FERRY_TIER_DEVICE]) assert_true(sum.peak_bytes[FERRY_TIER_DEVICE] <= sum.budget_bytes[FERRY_TIER_DEVICE]);
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  for (int64_t i = 0; i < n; i++) {
    o->cpu_experts += sm[i].cpu_experts;
    o->misses += sm[i].misses;
    o->hits += sm[i].hits;
    o->bytes_h2d += sm[i].bytes_h2d;
    o->bytes_act += sm[i].bytes_act;
    o->cpu_busy_ns += sm[i].cpu_busy_ns;
    o->cpu_steps += sm[i].cpu_busy_ns > 0 && sm[i].bytes_h2d == sm[i].bytes_act / 2;
  }
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

/* Every logit within fp32 rounding of the reference's (sums taken in another order). */
static void assert_close(const struct tu_logit_log *ref, const struct tu_logit_log *got) {
  assert_int_equal(ref->n, got->n);
  assert_true(ref->n > 0);
  double worst = 0;
  for (size_t i = 0; i < ref->n; i++) {
    const double d = fabs((double)ref->v[i] - (double)got->v[i]) / (1.0 + fabs((double)ref->v[i]));
    if (d > worst) worst = d;
  }
  if (worst > 1e-5) fail_msg("logits differ by %g (relative) from the resident run's", worst);
}

static void reference(const char *model_dir, struct outcome *o) { run(model_dir, config(0), o); }

/* Rates for the auto rule that put one expert's work on the CPU below `tokens` tokens and fetch
 * it from there on: the CPU's time is n x flops_per_token / cpu_flops; fetching costs the copy. */
static struct ferry_compute_rates split_rates(double weight_bytes, double flops_per_token, double tokens) {
  struct ferry_compute_rates r = {.cpu_flops = flops_per_token, .cpu_bytes = 1e18, .device_flops = 1e18,
                                  .device_bytes = 1e18, .link_bytes = weight_bytes / tokens};
  return r;
}

static void test_experts_on_cpu(void **state) {
  (void)state;
  struct outcome ref, cpu;
  reference(moe_dir, &ref);
  struct ferry_engine_config c = config(3500 << 10);
  c.compute_experts = FERRY_COMPUTE_CPU;
  run(moe_dir, c, &cpu);
  assert_close(&ref.log, &cpu.log);
  /* every routed expert ran on the CPU: nothing fetched, nothing found */
  assert_true(cpu.cpu_experts > 0);
  assert_int_equal(cpu.misses, 0);
  assert_int_equal(cpu.hits, 0);
  assert_true(cpu.bytes_act > 0 && cpu.cpu_busy_ns > 0);
  free(ref.log.v);
  free(cpu.log.v);
}

static void test_experts_auto_split(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, moe_dir), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  /* fp32 gate, up and down of one expert; the flops the rule counts per token */
  const double wbytes = 3.0 * (double)mc->hidden * (double)mc->expert_intermediate * 4;
  const double flops = 6.0 * (double)mc->hidden * (double)mc->expert_intermediate;
  ferry_model_close(m);
  struct outcome ref, mixed;
  reference(moe_dir, &ref);
  struct ferry_engine_config c = config(3500 << 10);
  c.compute_experts = FERRY_COMPUTE_AUTO;
  c.rates = split_rates(wbytes, flops, 2.5); /* 1-2 tokens: CPU; 3 or more: fetched */
  run(moe_dir, c, &mixed);
  assert_close(&ref.log, &mixed.log);
  /* prefill chunks route several tokens to an expert (fetched), decode steps one or two (CPU) */
  assert_true(mixed.cpu_experts > 0);
  assert_true(mixed.misses > 0);
  /* a CPU that is never faster: the same as fetching everything */
  struct outcome gpu;
  c.rates = split_rates(wbytes, flops, 1e-9);
  run(moe_dir, c, &gpu);
  assert_int_equal(gpu.cpu_experts, 0);
  assert_int_equal(gpu.bytes_act, 0);
  free(ref.log.v);
  free(mixed.log.v);
  free(gpu.log.v);
}

/* Layers streamed on the device budget are computed on the CPU from host memory: no block is
 * fetched, only the hidden state crosses (down before the first, up before the head). */
static void test_layers_on_cpu(void **state) {
  (void)state;
  struct outcome ref, cpu;
  reference(dense_dir, &ref);
  struct ferry_engine_config c = config(1500 << 10);
  c.compute_layers = FERRY_COMPUTE_CPU;
  run(dense_dir, c, &cpu);
  assert_close(&ref.log, &cpu.log);
  assert_true(cpu.bytes_act > 0);
  assert_int_equal(cpu.bytes_h2d, cpu.bytes_act / 2); /* half the activations go up, nothing else */
  assert_true(cpu.cpu_busy_ns > 0);
  free(ref.log.v);
  free(cpu.log.v);
}

/* compute_layers auto: a prefill step fetches the blocks and runs them on the device, whose
 * attention then reads the layers' KV cache in host memory through the CPU; a decode step
 * computes them on the CPU. Both in one run, same logits. */
static void test_layers_auto_dense_and_mla(void **state) {
  (void)state;
  const char *dirs[2] = {dense_dir, mla_dir};
  for (int i = 0; i < 2; i++) {
    struct outcome ref, mixed;
    reference(dirs[i], &ref);
    struct ferry_engine_config c = config(0);
    { /* the minimum working set plus a little: every layer streams */
      ferry_model *m = NULL;
      ferry_store *s = NULL;
      uint64_t dmin = 0, hmin = 0;
      assert_int_equal(ferry_model_open(&m, dirs[i]), FERRY_OK);
      assert_int_equal(ferry_store_open(&s, dirs[i]), FERRY_OK);
      c.compute_layers = FERRY_COMPUTE_AUTO;
      assert_int_equal(ferry_engine_min_budgets(m, s, &c, &dmin, &hmin), FERRY_OK);
      c.device_budget_bytes = dmin + (64 << 10);
      ferry_store_close(s);
      ferry_model_close(m);
    }
    c.compute_layers = FERRY_COMPUTE_AUTO;
    /* the rule counts 2 flops per fp32 weight (4 bytes) per token: the CPU takes n x B / 2e9 s
     * for a block of B bytes, the copy B / 8e8 s; steps of 1 or 2 tokens stay on the CPU, those
     * of 3 or more (prefill, a full decode batch) go to the device */
    c.rates = (struct ferry_compute_rates){.cpu_flops = 1e9, .cpu_bytes = 1e18, .device_flops = 1e18,
                                           .device_bytes = 1e18, .link_bytes = 8e8};
    run(dirs[i], c, &mixed);
    assert_close(&ref.log, &mixed.log);
    /* both kinds of step: blocks fetched (weights dwarf the activations), and steps computed on
     * the CPU alone (no weight moved) */
    assert_true(mixed.bytes_act > 0 && mixed.bytes_h2d > 2 * mixed.bytes_act);
    assert_true(mixed.cpu_steps > 0 && mixed.cpu_busy_ns > 0);
    free(ref.log.v);
    free(mixed.log.v);
  }
}

/* Kernels on the CPU queue read host memory only: the executor refuses a device-tier operand. */
static void test_cpu_queue_refuses_device_buffers(void **state) {
  (void)state;
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.compute_threads = 1}), FERRY_OK);
  int32_t q;
  ferry_buf *dev = NULL, *host = NULL;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_CPU, &q), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4096, "dev", &dev), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 4096, "host", &host), FERRY_OK);
  struct ferry_kernel k = {.kind = FERRY_K_GATHER_ROWS, .name = "g", .layer = -1, .expert = -1, .m = 1, .n = 4};
  static const int32_t rows[1] = {0};
  k.ints = rows;
  k.n_ints = 1;
  k.x = (struct ferry_ref){host, 0, FERRY_DTYPE_F32};
  k.y = (struct ferry_ref){dev, 0, FERRY_DTYPE_F32};
  assert_int_equal(ferry_exec_compute(ex, q, &k), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "operand y is in buffer 'dev' of the device tier"));
  k.y = (struct ferry_ref){host, 64, FERRY_DTYPE_F32};
  assert_int_equal(ferry_exec_compute(ex, q, &k), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  ferry_exec_destroy(ex);
}

/* What the CPU computes must live in host memory: a plan that homes it on disk is refused. */
static void test_cpu_needs_host_copies(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dense_dir), FERRY_OK);
  struct ferry_engine_config c = config(1500 << 10);
  c.compute_layers = FERRY_COMPUTE_CPU;
  c.home_disk = 1;
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.device_budget_bytes = c.device_budget_bytes,
                                                                             .compute_threads = 1}),
                   FERRY_OK);
  assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_ERR_BUDGET);
  assert_true(tu_contains(ferry_last_error(), "need their weights in host memory"));
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_experts_on_cpu),
      cmocka_unit_test(test_experts_auto_split),
      cmocka_unit_test(test_layers_on_cpu),
      cmocka_unit_test(test_layers_auto_dense_and_mla),
      cmocka_unit_test(test_cpu_queue_refuses_device_buffers),
      cmocka_unit_test(test_cpu_needs_host_copies),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
