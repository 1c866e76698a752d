/* The device workspace at the simulated runtime's precision: a GPU runtime holds activations in
 * fp16 (2 bytes) and, with fused low-bit kernels, no dequantized copy of a weight, so the
 * simulator plans and charges the engine's workspace at those sizes (ferry_exec_elem_bytes()),
 * while the host executor holds it in fp32. Checked against figures worked out by hand for
 * tiny-dense: the planned minimum working set, the peak a run reaches at that budget (peak <=
 * budget, and one byte less is refused), the buffer contract (only an executor without data may
 * be charged less than it addresses) and the activations a hybrid run moves to the CPU. */
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/sim.h"
#include "testutil.h"

/* tiny-dense (ferry model show tiny-dense): hidden 128, 4 query heads and 2 KV heads of 32,
 * intermediate 352, vocab 256; every workspace region below is a multiple of the engine's
 * 64-byte alignment, so the figures are plain sums. */
#define HID 128u
#define QD 128u
#define KVD 64u
#define INTER 352u
#define VOCAB 256u
#define STEP_TOKENS 64u
#define BATCH 4u
/* the largest quantized matrix: an FFN projection, 352 x 128 */
#define MAX_Q_NUMEL (INTER * HID)

/* The engine's workspace for a dense llama at these sizes: the hidden state and its norm (x, h),
 * q and the attention output, k and v, the FFN's gate and up, the batch's final rows and their
 * norm, then the logits rows (sampled in fp32: 4 bytes everywhere) and one dequantize slot. */
static uint64_t workspace_bytes(uint64_t act, uint64_t dequant, int quantized) {
  const uint64_t T = STEP_TOKENS, S = BATCH;
  const uint64_t act_elems = T * HID * 2 + T * QD * 2 + T * KVD * 2 + T * INTER * 2 + S * HID * 2;
  return act * act_elems + 4 * S * VOCAB + (quantized ? dequant * MAX_Q_NUMEL : 0);
}

static struct ferry_engine_config config(int quantized) {
  struct ferry_engine_config c;
  memset(&c, 0, sizeof c);
  c.resident_all = 1;
  c.max_batch = (int32_t)BATCH;
  c.max_step_tokens = (int32_t)STEP_TOKENS;
  c.max_seq_tokens = 128;
  c.seed = 3;
  if (quantized) {
    assert_int_equal(ferry_quant_plan_parse("int4-g64", &c.quant), FERRY_OK);
    c.quant_set = 1;
  }
  return c;
}

/* h100-pcie with the runtime preset `runtime` (NULL: none, as a library user may leave it). */
static ferry_hw *profile(const char *runtime) {
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  if (runtime) assert_int_equal(ferry_hw_set_runtime(hw, runtime), FERRY_OK);
  return hw;
}

/* The planned minimum device working set at element sizes eb ({0, 0}: fp32, as host and cuda). */
static uint64_t planned_min(const ferry_model *m, struct ferry_engine_config c, struct ferry_exec_elem_bytes eb) {
  uint64_t dmin = 0, hmin = 0;
  c.plan_elem_bytes = eb;
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &c, &dmin, &hmin), FERRY_OK);
  return dmin;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 60, .output_tokens = 6},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 17, .output_tokens = 9},
    {.id = 2, .arrival_ns = 0, .prompt_tokens = 33, .output_tokens = 4},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

/* Serve the requests on the sim executor of `hw` within `budget`; the summary, and in *act the
 * activation bytes the steps moved between device and CPU. */
static void sim_run(const ferry_model *m, const ferry_hw *hw, struct ferry_engine_config c, uint64_t budget,
                    struct ferry_serve_summary *sum, uint64_t *act) {
  ferry_exec *ex = NULL;
  ferry_engine *eng = NULL;
  c.device_budget_bytes = budget;
  struct ferry_exec_config xc = {.device_budget_bytes = budget, .lock_host_memory = 1};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  if (ferry_engine_create(&eng, m, NULL, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  struct ferry_run_options ro = {.as_fast_as_possible = 1};
  if (ferry_engine_run(eng, requests, N_REQ, &ro) != FERRY_OK) fail_msg("engine_run: %s", ferry_last_error());
  ferry_engine_summary(eng, sum);
  int64_t n = 0;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(eng, &n);
  for (int64_t i = 0; act && i < n; i++) *act += sm[i].bytes_act;
  assert_int_equal(sum->requests_done, N_REQ);
  for (int t = 0; t < 2; t++)
    if (sum->budget_bytes[t]) assert_true(sum->peak_bytes[t] <= sum->budget_bytes[t]);
  ferry_engine_destroy(eng);
  ferry_exec_destroy(ex);
}

/* What a sim executor of `hw` says its workspace elements take. */
static struct ferry_exec_elem_bytes sim_elem_bytes(const ferry_hw *hw) {
  ferry_exec *ex = NULL;
  struct ferry_exec_config xc = {.lock_host_memory = 1};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  struct ferry_exec_elem_bytes eb;
  ferry_exec_elem_bytes(ex, &eb);
  ferry_exec_destroy(ex);
  return eb;
}

/* Each runtime's element sizes, from its preset: fp16 activations for the PyTorch runtimes and
 * vLLM, fp32 for llama.cpp's ggml graphs; a dequantized copy only where kernels are not fused
 * (eager, and llama.cpp of early 2024 beyond 32 rows: fp16); none without a runtime section. */
static void test_runtime_elem_bytes(void **state) {
  (void)state;
  static const struct {
    const char *runtime;
    uint32_t act, dequant;
  } cases[] = {{"graph", 2, 0},  {"eager", 2, 2},  {"ktransformers", 2, 0}, {"deepspeed-0.7", 2, 2},
               {"native", 4, 0}, {"llama.cpp-2024q1", 4, 2}, {NULL, 2, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ferry_hw *hw = profile(cases[i].runtime);
    uint32_t act = 0, dq = 9;
    ferry_hw_profile_elem_bytes(ferry_hw_get(hw), &act, &dq);
    const struct ferry_exec_elem_bytes eb = sim_elem_bytes(hw);
    if (act != cases[i].act || dq != cases[i].dequant || eb.activation != act || eb.dequant != dq)
      fail_msg("runtime %s: profile %u/%u, executor %u/%u, expected %u/%u", cases[i].runtime ? cases[i].runtime : "(none)",
               act, dq, eb.activation, eb.dequant, cases[i].act, cases[i].dequant);
    ferry_hw_close(hw);
  }
}

/* An unquantized model on an fp16 runtime (graph): the plan's working set is the fp32 plan's less
 * half of every activation, and so is the peak of a run at exactly that budget against the same
 * run on an fp32 runtime (native); a byte less is refused naming the workspace. (The plan also
 * counts each pinned tensor's alignment slack, which the packed allocation may not use: a peak
 * is compared with a peak.) */
static void test_fp16_activations(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  const struct ferry_engine_config c = config(0);
  const uint64_t fp32 = planned_min(m, c, (struct ferry_exec_elem_bytes){0, 0});
  const uint64_t fp16 = planned_min(m, c, (struct ferry_exec_elem_bytes){2, 0});
  assert_int_equal(fp32 - fp16, workspace_bytes(4, 4, 0) - workspace_bytes(2, 0, 0));
  ferry_hw *hw = profile("graph"), *hw32 = profile("native");
  struct ferry_serve_summary sum, sum32;
  sim_run(m, hw, c, fp16, &sum, NULL);
  sim_run(m, hw32, c, fp32, &sum32, NULL);
  assert_int_equal(sum32.peak_bytes[FERRY_TIER_DEVICE] - sum.peak_bytes[FERRY_TIER_DEVICE],
                   workspace_bytes(4, 0, 0) - workspace_bytes(2, 0, 0));
  ferry_hw_close(hw32);
  /* one byte under: refused at plan time, the message giving the fp16 workspace */
  ferry_exec *ex = NULL;
  ferry_engine *eng = NULL;
  struct ferry_engine_config under = c;
  under.device_budget_bytes = fp16 - 1;
  struct ferry_exec_config xc = {.device_budget_bytes = fp16 - 1, .lock_host_memory = 1};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  assert_int_equal(ferry_engine_create(&eng, m, NULL, ex, &under), FERRY_ERR_BUDGET);
  const char *msg = ferry_last_error();
  char ws[64];
  snprintf(ws, sizeof ws, "workspace %.2f KiB", (double)workspace_bytes(2, 0, 0) / 1024.0);
  if (!tu_contains(msg, "minimum working set") || !tu_contains(msg, ws)) fail_msg("expected '%s' in: %s", ws, msg);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  ferry_model_close(m);
}

/* A quantized model: fused kernels (graph) hold no dequantized copy, eager an fp16 one, the
 * fp32 plan (host, cuda) an fp32 one; native (llama.cpp) keeps fp32 activations, no copy. Each
 * runtime's plan and, run at exactly its planned budget, its peak differ from graph's by the hand
 * figures. */
static void test_dequant_scratch(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  const struct ferry_engine_config c = config(1);
  const uint64_t base = planned_min(m, c, (struct ferry_exec_elem_bytes){0, 0}) - workspace_bytes(4, 4, 1);
  static const struct {
    const char *runtime;
    uint32_t act, dequant;
  } cases[] = {{"graph", 2, 0}, {"eager", 2, 2}, {"native", 4, 0}};
  uint64_t peak_graph = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const uint64_t want = base + workspace_bytes(cases[i].act, cases[i].dequant, 1);
    const uint64_t planned = planned_min(m, c, (struct ferry_exec_elem_bytes){cases[i].act, cases[i].dequant});
    if (planned != want)
      fail_msg("%s: planned %llu, by hand %llu", cases[i].runtime, (unsigned long long)planned, (unsigned long long)want);
    ferry_hw *hw = profile(cases[i].runtime);
    struct ferry_serve_summary sum;
    sim_run(m, hw, c, want, &sum, NULL);
    const uint64_t peak = sum.peak_bytes[FERRY_TIER_DEVICE];
    if (i == 0) peak_graph = peak;
    assert_int_equal(peak - peak_graph, workspace_bytes(cases[i].act, cases[i].dequant, 1) - workspace_bytes(2, 0, 1));
    ferry_hw_close(hw);
  }
  /* eager's copy is the largest quantized matrix at 2 bytes */
  assert_int_equal(workspace_bytes(2, 2, 1) - workspace_bytes(2, 0, 1), 2 * MAX_Q_NUMEL);
  ferry_model_close(m);
}

/* A plain FFN (OPT's ReLU) applies its activation to fc1's output in place: the workspace holds
 * one intermediate buffer per token, a gated one (llama's SwiGLU) two. Per token of a step,
 * OPT-6.7B's workspace is x, h, q, k, v, the attention output (4096 each) and fc1's output
 * (16384): 40960 elements; tiny-dense's the same regions at its sizes with the gate and the up. */
static void test_plain_ffn_workspace(void **state) {
  (void)state;
  static const struct {
    const char *model;
    uint64_t elems_per_token;
  } cases[] = {{"opt-6.7b", 6 * 4096 + 16384}, {"tiny-dense", HID * 2 + QD * 2 + KVD * 2 + INTER * 2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_open(&m, cases[i].model), FERRY_OK);
    struct ferry_engine_config c = config(0);
    c.resident_all = 0;
    c.max_seq_tokens = 256;
    c.max_step_tokens = 128;
    const uint64_t wide = planned_min(m, c, (struct ferry_exec_elem_bytes){2, 0});
    c.max_step_tokens = 64;
    const uint64_t narrow = planned_min(m, c, (struct ferry_exec_elem_bytes){2, 0});
    if (wide - narrow != 64 * cases[i].elems_per_token * 2)
      fail_msg("%s: 64 more tokens a step cost %llu bytes of workspace, by hand %llu", cases[i].model,
               (unsigned long long)(wide - narrow), (unsigned long long)(64 * cases[i].elems_per_token * 2));
    ferry_model_close(m);
  }
}

/* The buffer contract: a buffer charged less than it addresses only on an executor without
 * data; its size and bounds are the addressed bytes, the tier's usage the charged ones. */
static void test_charged_buffers(void **state) {
  (void)state;
  ferry_hw *hw = profile("graph");
  ferry_exec *sim = NULL, *host = NULL;
  struct ferry_exec_config xc = {.device_budget_bytes = 1000, .lock_host_memory = 0};
  assert_int_equal(ferry_exec_create_sim(&sim, hw, &xc), FERRY_OK);
  assert_int_equal(ferry_exec_create_host(&host, &xc), FERRY_OK);
  struct ferry_exec_elem_bytes eb;
  ferry_exec_elem_bytes(host, &eb);
  assert_true(eb.activation == 4 && eb.dequant == 4);
  ferry_buf *b = NULL;
  assert_int_equal(ferry_exec_alloc_charged(host, 0, FERRY_TIER_DEVICE, 800, 400, "w", &b), FERRY_ERR_INVALID);
  assert_int_equal(ferry_exec_alloc_charged(sim, 0, FERRY_TIER_DEVICE, 400, 800, "w", &b), FERRY_ERR_INVALID);
  /* addressed beyond the budget, charged within it */
  assert_int_equal(ferry_exec_alloc_charged(sim, 0, FERRY_TIER_DEVICE, 1600, 800, "w", &b), FERRY_OK);
  assert_int_equal(ferry_exec_buf_size(b), 1600);
  uint64_t used = 0, peak = 0;
  ferry_exec_tier_usage(sim, FERRY_TIER_DEVICE, &used, &peak);
  assert_true(used == 800 && peak == 800);
  ferry_buf *more = NULL;
  assert_int_equal(ferry_exec_alloc_charged(sim, 0, FERRY_TIER_DEVICE, 300, 300, "x", &more), FERRY_ERR_BUDGET);
  ferry_exec_free(sim, b);
  ferry_exec_tier_usage(sim, FERRY_TIER_DEVICE, &used, &peak);
  assert_true(used == 0 && peak == 800);
  ferry_exec_destroy(sim);
  ferry_exec_destroy(host);
  ferry_hw_close(hw);
}

/* --kv-home host: q, k and v go down to the CPU and the attention output comes back at the
 * runtime's element size, so an fp16 runtime moves half the activation bytes of an fp32 one over
 * the same steps: every layer, every token, 2 x q + 2 x kv elements. */
static void test_crossings(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  struct ferry_engine_config c = config(0);
  c.kv_home_host = 1;
  uint64_t act[2] = {0, 0}, tokens = 0;
  for (int64_t i = 0; i < N_REQ; i++) tokens += (uint64_t)(requests[i].prompt_tokens + requests[i].output_tokens - 1);
  const char *runtimes[2] = {"graph", "native"};
  for (int i = 0; i < 2; i++) {
    ferry_hw *hw = profile(runtimes[i]);
    struct ferry_serve_summary sum;
    sim_run(m, hw, c, 0, &sum, &act[i]);
    ferry_hw_close(hw);
  }
  const uint64_t per_token = 8 /* layers */ * (2 * QD + 2 * KVD);
  assert_int_equal(act[0], 2 * per_token * tokens);
  assert_int_equal(act[1], 4 * per_token * tokens);
  ferry_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runtime_elem_bytes), cmocka_unit_test(test_fp16_activations),
      cmocka_unit_test(test_dequant_scratch), cmocka_unit_test(test_plain_ffn_workspace),    cmocka_unit_test(test_charged_buffers),
      cmocka_unit_test(test_crossings),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
