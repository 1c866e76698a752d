/* --kv-prefill device: with the KV cache in host memory, the tokens that start a sequence attend
 * on the device over a scratch of the step's K and V, and their rows are then appended to the
 * host cache on the CPU. On the host executor the logits (so the greedy tokens) are those of the
 * cache on the device and of the CPU attending everything, to the bit, for a GQA model and
 * BLOOM's ALiBi, several sequences a step, micro-batches and steps that mix decode tokens with
 * new prompts. In the simulator the prompt's attention is on the device's queue and decode's on
 * the CPU's, only k and v cross for a prompt, the first token comes sooner and the decode steps
 * cost the same. The scratch is device memory inside the budget. */
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

static char *dir, *dense_dir, *bloom_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("kvprefill");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 3};
  dense_dir = tu_gen_model(dir, "tiny-dense", "dense", &go); /* 4 heads over 2 KV heads */
  bloom_dir = tu_gen_tiny(dir, "bloom", &go);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(dense_dir);
  free(bloom_dir);
  return 0;
}

/* Prompts of several lengths: with 16 tokens a step, the first step prefills whole prompts and
 * the first chunk of another, later steps mix decode tokens, a continued prompt (on the CPU) and
 * new prompts (on the device). */
static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 5, .output_tokens = 6},  {.id = 1, .prompt_tokens = 7, .output_tokens = 5},
    {.id = 2, .prompt_tokens = 13, .output_tokens = 4}, {.id = 3, .prompt_tokens = 3, .output_tokens = 7},
    {.id = 4, .prompt_tokens = 9, .output_tokens = 3},  {.id = 5, .prompt_tokens = 4, .output_tokens = 5},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

static struct ferry_engine_config config(int gpu_batches) {
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 24, .seed = 9,
                                  .block_layers = 1, .prefetch_depth = 1, .greedy = 1, .gpu_batches = gpu_batches};
  return c;
}

/* The activation bytes crossed in all steps. */
static void sum_bytes_act(struct ferry_engine *e, void *user) {
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  uint64_t *act = user;
  *act = 0;
  for (int64_t i = 0; i < n; i++) *act += sm[i].bytes_act;
}

/* A run on the host executor; the logits rows in *log, the activation bytes crossed. */
static void run_host(const char *model_dir, struct ferry_engine_config c, struct tu_logit_log *log, uint64_t *act) {
  c.on_logits = tu_on_logits;
  c.logits_user = log;
  tu_run_host(model_dir, &c, requests, N_REQ, sum_bytes_act, act);
}

/* The cache on the device, in host memory with every token attending on the CPU, and with the
 * prompts attending on the device: the same logits to the bit (the same fp32 kernels over the
 * same rows), for one batch and for two micro-batches. Fewer activation bytes cross when the
 * prompts attend on the device (their q and attention output stay there). */
static void test_same_logits(void **state) {
  (void)state;
  const char *dirs[2] = {dense_dir, bloom_dir};
  for (int d = 0; d < 2; d++)
    for (int gb = 1; gb <= 2; gb++) {
      struct tu_logit_log ref = {0}, host = {0}, dev = {0};
      uint64_t act_ref, act_host, act_dev;
      struct ferry_engine_config c = config(gb);
      run_host(dirs[d], c, &ref, &act_ref);
      c.kv_home_host = 1;
      run_host(dirs[d], c, &host, &act_host);
      c.kv_prefill_device = 1;
      run_host(dirs[d], c, &dev, &act_dev);
      assert_true(ref.n > 0);
      assert_int_equal(host.n, ref.n);
      assert_int_equal(dev.n, ref.n);
      assert_memory_equal(host.v, ref.v, ref.n * sizeof(float));
      assert_memory_equal(dev.v, ref.v, ref.n * sizeof(float));
      assert_int_equal(act_ref, 0);
      if (!(act_dev > 0 && act_dev < act_host))
        fail_msg("activation bytes: %llu with prompts on the device, %llu on the CPU", (unsigned long long)act_dev,
                 (unsigned long long)act_host);
      free(ref.v);
      free(host.v);
      free(dev.v);
    }
}

/* The attention kernels the simulator ran: per step, on the compute queue (the matmuls') or not.
 * Ops are reported as the engine issues them, a step's after the previous one's head (lm_head). */
struct placement {
  int32_t compute_queue, step;
  int64_t attn_dev[64], attn_cpu[64], append_cpu[64], append_dev[64];
};

static void on_activity(void *user, const struct ferry_activity *a) {
  struct placement *p = user;
  if (a->kind != FERRY_ACT_KERNEL || !a->kind_name || p->step >= 64) return;
  if (!strcmp(a->kind_name, "matmul")) p->compute_queue = a->queue;
  const int on_dev = a->queue == p->compute_queue, s = p->step;
  if (!strcmp(a->kind_name, "attention")) (on_dev ? p->attn_dev : p->attn_cpu)[s]++;
  if (!strcmp(a->kind_name, "kv_append")) (on_dev ? p->append_dev : p->append_cpu)[s]++;
  if (a->name && !strcmp(a->name, "lm_head")) p->step++;
}

struct sim_result {
  struct ferry_serve_summary sum;
  uint64_t act0, d2h0; /* the first (prompt) step's activation and device-to-host bytes */
  int64_t steps;
};

/* llama-2-7b on h100-pcie, four 1024-token prompts prefilled in one step, then 8 decode steps. */
/* h100-pcie has no runtime section: the simulator holds activations in fp16 and no dequantized
 * copies (ferry_hw_profile_elem_bytes()), and plans without an executor are told so. */
static struct ferry_engine_config sim_config(int prefill_device, uint64_t budget) {
  struct ferry_engine_config c = {.max_batch = 4, .max_step_tokens = 4096, .max_seq_tokens = 1040, .seed = 1,
                                  .resident_all = 1, .kv_home_host = 1, .kv_prefill_device = prefill_device,
                                  .device_budget_bytes = budget, .plan_elem_bytes = {2, 0}};
  return c;
}

static ferry_status run_sim(int prefill_device, uint64_t budget, struct placement *p, struct sim_result *r) {
  ferry_hw *hw = NULL;
  ferry_model *m = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.device_budget_bytes = budget}), FERRY_OK);
  if (p) ferry_exec_set_sink(ex, on_activity, p);
  const struct ferry_engine_config c = sim_config(prefill_device, budget);
  struct ferry_engine_request req[4];
  for (int i = 0; i < 4; i++) req[i] = (struct ferry_engine_request){.id = i, .prompt_tokens = 1024, .output_tokens = 9};
  ferry_status st = ferry_engine_create(&e, m, NULL, ex, &c);
  if (st == FERRY_OK) {
    if (ferry_engine_run(e, req, 4, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
      fail_msg("engine_run: %s", ferry_last_error());
    ferry_engine_summary(e, &r->sum);
    const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &r->steps);
    r->act0 = sm[0].bytes_act;
    r->d2h0 = sm[0].bytes_d2h;
    assert_int_equal(sm[0].tokens, 4096);
  }
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_model_close(m);
  ferry_hw_close(hw);
  return st;
}

/* The prompt step: attention on the device and k, v appended on the CPU; decode steps: attention
 * on the CPU. Only k and v cross down for the prompt (T x kv row x 2 a layer, nothing back),
 * the first token comes sooner and decode costs the same. */
static void test_sim_placement(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const int64_t L = mc->n_layers, kvd = mc->n_kv_heads * mc->head_dim, qd = mc->n_heads * mc->head_dim;
  ferry_model_close(m);
  struct placement *p = calloc(2, sizeof *p);
  assert_non_null(p);
  struct sim_result r[2];
  for (int dev = 0; dev < 2; dev++) {
    p[dev].compute_queue = -1;
    assert_int_equal(run_sim(dev, 0, &p[dev], &r[dev]), FERRY_OK);
    assert_int_equal(r[dev].steps, 9);
    assert_int_equal(p[dev].step, 9);
    for (int64_t s = 0; s < r[dev].steps; s++) {
      const int prompt_on_dev = dev && s == 0;
      assert_int_equal(p[dev].attn_dev[s], prompt_on_dev ? L : 0);
      assert_int_equal(p[dev].attn_cpu[s], prompt_on_dev ? 0 : L);
      assert_int_equal(p[dev].append_cpu[s], prompt_on_dev ? L : 0);
      assert_int_equal(p[dev].append_dev[s], 0);
    }
  }
  /* activations cross at the simulated runtime's fp16 (2 bytes an element) */
  const uint64_t T = 4096, kv_rows = (uint64_t)L * T * (uint64_t)kvd * 2 * 2;
  assert_int_equal(r[1].act0, kv_rows);                         /* k and v down, no q, nothing up */
  assert_true(r[1].d2h0 >= kv_rows);                            /* and the logits read back */
  /* on the CPU: q down and the attention output up too */
  assert_int_equal(r[0].act0, kv_rows + (uint64_t)L * T * (uint64_t)qd * 2 * 2);
  if (!(r[1].sum.ttft.mean < r[0].sum.ttft.mean))
    fail_msg("TTFT %g s with the prompt on the device, %g s on the CPU", r[1].sum.ttft.mean, r[0].sum.ttft.mean);
  const double d = r[1].sum.tpot.mean - r[0].sum.tpot.mean;
  if (!(d < 1e-9 * r[0].sum.tpot.mean && -d < 1e-9 * r[0].sum.tpot.mean))
    fail_msg("TPOT %.9g s with the prompt on the device, %.9g s on the CPU", r[1].sum.tpot.mean, r[0].sum.tpot.mean);
  free(p);
}

/* The scratch (4 sequences x 1040 tokens, the capacity, x 8 KiB, llama-2-7b's fp16 K or V row, x 2) is device
 * memory: the peak grows by it and stays within the budget; a budget with room for everything
 * but the scratch refuses the run and says so. */
static void test_scratch_budget(void **state) {
  (void)state;
  struct sim_result host, dev;
  assert_int_equal(run_sim(0, 0, NULL, &host), FERRY_OK);
  assert_int_equal(run_sim(1, 0, NULL, &dev), FERRY_OK);
  const uint64_t scratch = 4ull * 1040 * 8192 * 2;
  assert_int_equal(dev.sum.peak_bytes[FERRY_TIER_DEVICE] - host.sum.peak_bytes[FERRY_TIER_DEVICE], scratch);
  /* the plan's working set counts it too */
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  uint64_t need_host, need, hmin;
  const struct ferry_engine_config ch = sim_config(0, 0), cd = sim_config(1, 0);
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &ch, &need_host, &hmin), FERRY_OK);
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &cd, &need, &hmin), FERRY_OK);
  ferry_model_close(m);
  assert_int_equal(need - need_host, scratch);
  /* exactly enough: the run fits */
  if (run_sim(1, need, NULL, &dev) != FERRY_OK) fail_msg("budget %llu: %s", (unsigned long long)need, ferry_last_error());
  assert_true(dev.sum.peak_bytes[FERRY_TIER_DEVICE] <= need);
  /* room for all but half the scratch: refused, naming it */
  assert_int_equal(run_sim(1, need - scratch / 2, NULL, &dev), FERRY_ERR_BUDGET);
  const char *msg = ferry_last_error();
  if (!tu_contains(msg, "prefill scratch on the device 65.00 MiB: 4 sequences x 1040 tokens x 8192 bytes x 2"))
    fail_msg("budget error: %s", msg);
}

/* The option needs the cache in host memory: refused otherwise, as is an unknown value. */
static void test_refusals(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --kv-prefill device"), 1);
  if (!tu_contains(out, "--kv-prefill device attends prompts on the device beside a KV cache in host memory; it needs "
                        "--kv-home host"))
    fail_msg("%s", out);
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --kv-home host "
                                       "--kv-prefill gpu"),
                   2);
  if (!tu_contains(out, "--kv-prefill: expected 'device' or 'host', got 'gpu'")) fail_msg("%s", out);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_logits),
      cmocka_unit_test(test_sim_placement),
      cmocka_unit_test(test_scratch_budget),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
