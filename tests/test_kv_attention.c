/* --kv-attention device: with the KV cache in host memory every token attends on the device, over
 * a scratch into which its sequence's cached rows of the layer were copied up from the host cache
 * (FlexGen without --cpu). On the host executor the logits are those of the cache on the device
 * and of the CPU attending everything, to the bit, for a GQA model, BLOOM's ALiBi and Gemma 2's
 * sliding window (ring caches), streamed layers with prefetch 0-2, micro-batches, a paged cache,
 * and steps that mix decode tokens with new prompts. In the simulator every attention is on the
 * device's queue, host-to-device bytes are exactly the cached rows of the step's sequences,
 * device-to-host the new rows; the scratch is device memory inside the budget and the plan names
 * it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/activity.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

static char *dir, *dense_dir, *bloom_dir, *gemma2_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("kvattn");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 5};
  dense_dir = tu_gen_model(dir, "tiny-dense", "dense", &go); /* 4 heads over 2 KV heads */
  bloom_dir = tu_gen_tiny(dir, "bloom", &go);
  gemma2_dir = tu_gen_tiny(dir, "gemma2", &go); /* a window of 4: its layers' caches are rings */
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(dense_dir);
  free(bloom_dir);
  free(gemma2_dir);
  return 0;
}

/* With 16 tokens a step and 3 sequences a batch: the first step prefills whole prompts and the
 * first chunk of another, later steps mix decode tokens, continued prompts and new prompts. */
static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 5, .output_tokens = 6},  {.id = 1, .prompt_tokens = 7, .output_tokens = 5},
    {.id = 2, .prompt_tokens = 13, .output_tokens = 4}, {.id = 3, .prompt_tokens = 3, .output_tokens = 7},
    {.id = 4, .prompt_tokens = 9, .output_tokens = 3},  {.id = 5, .prompt_tokens = 4, .output_tokens = 5},
    {.id = 6, .prompt_tokens = 14, .output_tokens = 10}, /* to position 23: past Gemma 2's 20-row rings */
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

struct host_stats {
  uint64_t act, blocks;
};

static void sum_bytes(struct ferry_engine *e, void *user) {
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  struct host_stats *h = user;
  *h = (struct host_stats){0};
  for (int64_t i = 0; i < n; i++) {
    h->act += sm[i].bytes_act;
    h->blocks += sm[i].bytes_blocks;
  }
}

static void run_host(const char *model_dir, struct ferry_engine_config c, struct tu_logit_log *log, struct host_stats *h) {
  c.on_logits = tu_on_logits;
  c.logits_user = log;
  tu_run_host(model_dir, &c, requests, N_REQ, sum_bytes, h);
}

static void expect_same(const struct tu_logit_log *a, const struct tu_logit_log *ref, const char *what) {
  if (a->n != ref->n || memcmp(a->v, ref->v, ref->n * sizeof(float)))
    fail_msg("%s: logits differ from the cache on the device (%zu values, %zu there)", what, a->n, ref->n);
}

/* The cache on the device, in host memory with the CPU attending, and in host memory with the
 * device attending: the same logits to the bit (the same fp32 kernels over the same rows, a
 * windowed layer's ring copied up as it is), with
 * resident and streamed layers (prefetch 0, 1, 2), one batch or two micro-batches, a contiguous
 * or a paged cache. Only k and v cross (no q, no attention output), so fewer activation bytes
 * than with the CPU attending. */
static void test_same_logits(void **state) {
  (void)state;
  const char *dirs[3] = {dense_dir, bloom_dir, gemma2_dir};
  for (int d = 0; d < 3; d++)
    for (int v = 0; v < 5; v++) {
      struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 24, .seed = 9,
                                      .greedy = 1, .block_layers = 1};
      const int stream = v >= 1 && v <= 3;
      c.resident_all = !stream;
      c.prefetch_depth = stream ? v - 1 : 0;
      c.gpu_batches = v == 4 ? 2 : 1;
      if (stream) c.device_budget_bytes = tu_min_device_budget(dirs[d], &c); /* every layer streams */
      c.kv_block_tokens = v == 0 ? 4 : 0;
      c.greedy = v != 0; /* a paged cache recomputes preempted sequences from a seeded draw */
      struct tu_logit_log ref = {0}, cpu = {0}, dev = {0};
      struct host_stats h_ref, h_cpu, h_dev;
      run_host(dirs[d], c, &ref, &h_ref);
      c.kv_home_host = 1;
      run_host(dirs[d], c, &cpu, &h_cpu);
      c.kv_attention_device = 1;
      run_host(dirs[d], c, &dev, &h_dev);
      assert_true(ref.n > 0);
      expect_same(&cpu, &ref, "attention on the CPU");
      expect_same(&dev, &ref, "attention on the device");
      if (stream) assert_true(h_dev.blocks > 0);
      if (!(h_dev.act > 0 && h_dev.act < h_cpu.act))
        fail_msg("variant %d: activation bytes %llu with attention on the device, %llu on the CPU", v,
                 (unsigned long long)h_dev.act, (unsigned long long)h_cpu.act);
      free(ref.v);
      free(cpu.v);
      free(dev.v);
    }
}

/* The attention kernels the simulator ran, per step, on the compute queue (the matmuls') or not.
 * Ops are reported as the engine issues them, a step's after the previous one's head (lm_head). */
struct placement {
  int32_t compute_queue, step;
  int64_t attn_dev[64], attn_cpu[64], append_cpu[64];
};

static void on_activity(void *user, const struct ferry_activity *a) {
  struct placement *p = user;
  if (a->kind != FERRY_ACT_KERNEL || !a->kind_name || p->step >= 64) return;
  if (!strcmp(a->kind_name, "matmul")) p->compute_queue = a->queue;
  const int on_dev = a->queue == p->compute_queue, s = p->step;
  if (!strcmp(a->kind_name, "attention")) (on_dev ? p->attn_dev : p->attn_cpu)[s]++;
  if (!strcmp(a->kind_name, "kv_append") && !on_dev) p->append_cpu[s]++;
  if (a->name && !strcmp(a->name, "lm_head")) p->step++;
}

/* llama-2-7b on h100-pcie (fp16 activations and cache: a K or V row is 32 x 128 x 2 = 8 KiB). */
static struct ferry_engine_config sim_config(int attention_device, uint64_t budget) {
  struct ferry_engine_config c = {.max_batch = 2, .max_step_tokens = 1024, .max_seq_tokens = 520, .seed = 1,
                                  .resident_all = 1, .kv_home_host = 1, .kv_attention_device = attention_device,
                                  .device_budget_bytes = budget, .plan_elem_bytes = {2, 0}};
  return c;
}

/* A (prompt 100, 3 tokens out) and B (prompt 300, 6 out) prefill together; A decodes twice and
 * ends, C (prompt 40, 3 out) then prefills beside B's decode token. */
static ferry_status run_sim(int attention_device, uint64_t budget, struct placement *p, struct tu_sim_result *r) {
  const struct tu_sim_setup setup = {.hw = "h100-pcie", .exec = {.device_budget_bytes = budget},
                                     .sink = p ? on_activity : NULL, .sink_user = p};
  const struct ferry_engine_config c = sim_config(attention_device, budget);
  return tu_sim_serve(&setup, &c, tu_kv_sim_requests(), TU_KV_SIM_N, r);
}

/* Every step's attention on the device's queue, none on the CPU's (which only appends the new
 * rows); host to device exactly the cached rows of the step's sequences, each layer (K and V, in
 * the cache's fp16); the activations that cross are only the new k and v rows, down. */
static void test_sim_bytes(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const uint64_t L = (uint64_t)mc->n_layers, kvd = (uint64_t)(mc->n_kv_heads * mc->head_dim);
  ferry_model_close(m);
  const uint64_t row = kvd * 2; /* an fp16 K or V row */
  struct placement *p = calloc(1, sizeof *p);
  struct tu_sim_result *r = calloc(1, sizeof *r);
  assert_non_null(p);
  assert_non_null(r);
  p->compute_queue = -1;
  assert_int_equal(run_sim(1, 0, p, r), FERRY_OK);
  assert_int_equal(r->steps, TU_KV_SIM_STEPS);
  for (int64_t s = 0; s < r->steps; s++) {
    const struct ferry_step_metrics *sm = &r->sm[s];
    uint64_t cached = 0, tokens = 0;
    for (int i = 0; i < 2; i++) {
      cached += (uint64_t)tu_kv_sim_schedule[s][i].cached;
      tokens += (uint64_t)tu_kv_sim_schedule[s][i].tokens;
    }
    assert_int_equal(sm->tokens, tokens);
    const uint64_t up = L * cached * row * 2, down = L * tokens * row * 2;
    if (sm->bytes_h2d != up)
      fail_msg("step %lld: %llu bytes host to device, %llu cached rows' expected", (long long)s,
               (unsigned long long)sm->bytes_h2d, (unsigned long long)up);
    assert_int_equal(sm->bytes_act, down); /* k and v down, nothing up */
    assert_true(sm->bytes_d2h >= down && sm->bytes_d2h - down < (1u << 20)); /* and the logits */
    assert_int_equal(p->attn_dev[s], L);
    assert_int_equal(p->attn_cpu[s], 0);
    assert_int_equal(p->append_cpu[s], L);
  }
  free(p);
  free(r);
}

/* The scratch (2 sequences x 520 tokens x 8 KiB x 2, one micro-batch) is device memory: the peak
 * grows by it, the plan counts it, a budget with all but half of it refuses the run naming it. */
static void test_scratch_budget(void **state) {
  (void)state;
  struct tu_sim_result *cpu = calloc(1, sizeof *cpu), *dev = calloc(1, sizeof *dev);
  assert_non_null(cpu);
  assert_non_null(dev);
  assert_int_equal(run_sim(0, 0, NULL, cpu), FERRY_OK);
  assert_int_equal(run_sim(1, 0, NULL, dev), FERRY_OK);
  const uint64_t scratch = 2ull * 520 * 8192 * 2;
  assert_int_equal(dev->sum.peak_bytes[FERRY_TIER_DEVICE] - cpu->sum.peak_bytes[FERRY_TIER_DEVICE], scratch);
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  uint64_t need_cpu, need, hmin;
  const struct ferry_engine_config cc = sim_config(0, 0), cd = sim_config(1, 0);
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &cc, &need_cpu, &hmin), FERRY_OK);
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &cd, &need, &hmin), FERRY_OK);
  ferry_model_close(m);
  assert_int_equal(need - need_cpu, scratch);
  if (run_sim(1, need, NULL, dev) != FERRY_OK) fail_msg("budget %llu: %s", (unsigned long long)need, ferry_last_error());
  assert_true(dev->sum.peak_bytes[FERRY_TIER_DEVICE] <= need);
  assert_int_equal(run_sim(1, need - scratch / 2, NULL, dev), FERRY_ERR_BUDGET);
  const char *msg = ferry_last_error();
  if (!tu_contains(msg, "attention scratch on the device 16.25 MiB: 1 micro-batches x 2 sequences x 520 tokens x 8192 "
                        "bytes x 2 (K and V; --kv-attention device"))
    fail_msg("budget error: %s", msg);
  free(cpu);
  free(dev);
}

/* The plan prints the scratch's shape and the options that size it; two micro-batches hold two. */
static void test_plan_shows_scratch(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferryf(&out, "sim --model llama-2-7b --hw h100-pcie --synthetic n=4,prompt=100,output=4 "
                                       "--plan-only --max-batch 2 --gpu-batches 2 --max-seq-tokens 520 --kv-home host "
                                       "--kv-attention device --resident all"),
                   0);
  if (!tu_contains(out, "attention scratch on the device 32.50 MiB: 2 micro-batches x 2 sequences x 520 tokens x 8192 "
                        "bytes x 2 (K and V; --kv-attention device, --gpu-batches, --max-batch, --max-seq-tokens)"))
    fail_msg("%s", out);
  free(out);
}

/* It needs the cache in host memory; --kv-prefill host contradicts it; unknown values refused. */
static void test_refusals(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --kv-attention device"), 1);
  if (!tu_contains(out, "--kv-attention device attends on the device over rows copied up from a KV cache in host "
                        "memory; it needs --kv-home host"))
    fail_msg("%s", out);
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --kv-home host "
                                       "--kv-attention device --kv-prefill host"),
                   2);
  if (!tu_contains(out, "--kv-attention device attends prompts on the device too; --kv-prefill host contradicts it"))
    fail_msg("%s", out);
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --kv-home host "
                                       "--kv-attention gpu"),
                   2);
  if (!tu_contains(out, "--kv-attention: expected 'device' or 'cpu', got 'gpu'")) fail_msg("%s", out);
  free(out);
  /* redundant, not contradictory: --kv-prefill device with it runs */
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --kv-home host "
                                       "--kv-attention device --kv-prefill device"),
                   0);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_logits),    cmocka_unit_test(test_sim_bytes),
      cmocka_unit_test(test_scratch_budget), cmocka_unit_test(test_plan_shows_scratch),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
