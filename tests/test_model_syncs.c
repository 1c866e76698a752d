/* Host waits the model's own code makes (runtime.model_syncs): HF transformers' GPT-J copies a
 * CPU-made RoPE table and mask value to the GPU with blocking copies before its rotary and its
 * attention, so an eager run waits there for the GPU's queue. The simulator charges those waits
 * for GPT-J only where the runtime runs that code, the same in its three modes (event-driven,
 * fast, and fast with the op graphs checked against fresh recordings), spreads the layer's host
 * time over its kernels without losing or doubling any of it, and leaves a family without such
 * copies as it was. */
#include <math.h>
#include <stdio.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "testutil.h"

/* Mean TPOT, ns, of four requests decoded one at a time by `model` on `profile`. */
static double tpot_ns(const char *profile, const char *model, enum ferry_sim_mode mode) {
  ferry_hw *hw = NULL;
  ferry_model *m = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  if (ferry_hw_open(&hw, profile) != FERRY_OK) fail_msg("%s: %s", profile, ferry_last_error());
  assert_int_equal(ferry_model_open(&m, model), FERRY_OK);
  const uint64_t budget = ferry_hw_get(hw)->gpu.memory_bytes / 10 * 9;
  struct ferry_exec_config xc = {.lock_host_memory = 1, .sim_mode = mode, .device_budget_bytes = budget};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  struct ferry_engine_config c = {.max_batch = 1, .max_step_tokens = 64, .max_seq_tokens = 64, .seed = 3,
                                  .device_budget_bytes = budget, .resident_all = 1};
  struct ferry_engine_request req[4];
  for (int i = 0; i < 4; i++) req[i] = (struct ferry_engine_request){.id = i, .prompt_tokens = 6, .output_tokens = 14};
  if (ferry_engine_create(&e, m, NULL, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, req, 4, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  struct ferry_serve_summary sum;
  ferry_engine_summary(e, &sum);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_model_close(m);
  ferry_hw_close(hw);
  return sum.tpot.mean;
}

static const struct ferry_hw_runtime *eager(ferry_hw **hw) {
  assert_int_equal(ferry_hw_open(hw, "eager"), FERRY_OK);
  return &ferry_hw_get(*hw)->runtime;
}

/* GPT-J waits twice a layer: at least the two copies' host time per layer per token, and at most
 * that plus the layer's GPU work (the most a wait can find queued). */
static void test_gptj_waits(void **state) {
  (void)state;
  ferry_hw *hw = NULL;
  const struct ferry_hw_runtime *rt = eager(&hw);
  assert_int_equal(rt->model_syncs, 1);
  const double copy_ns = (double)rt->copy_ns;
  ferry_hw_close(hw);
  const double with = tpot_ns("a100-80gb-sxm+runtime=eager", "gpt-j-6b", FERRY_SIM_FAST),
               without = tpot_ns("a100-80gb-sxm+runtime=eager+runtime.model_syncs=0", "gpt-j-6b", FERRY_SIM_FAST);
  print_message("GPT-J-6B on an A100, eager: TPOT %.3f ms with the model's waits, %.3f ms without\n", with / 1e6,
                without / 1e6);
  assert_true(with - without >= 28 * 2 * copy_ns);
  assert_true(with - without <= 28 * (2 * copy_ns + 1.0e6));
}

/* The event-driven path, the fast path and the fast path checking every op graph agree. */
static void test_modes_agree(void **state) {
  (void)state;
  const char *p = "a100-80gb-sxm+runtime=eager";
  const double fast = tpot_ns(p, "gpt-j-6b", FERRY_SIM_FAST), exact = tpot_ns(p, "gpt-j-6b", FERRY_SIM_EXACT),
               check = tpot_ns(p, "gpt-j-6b", FERRY_SIM_CHECK);
  print_message("TPOT fast %.6f ms, exact %.6f ms, check %.6f ms\n", fast / 1e6, exact / 1e6, check / 1e6);
  assert_true(fast == exact && fast == check);
}

/* A host far slower than the GPU: whether the layer's host time is paid at its start or with its
 * kernels, a token costs the layers' host time; the waits add their copies and at most the
 * kernel each finds running, not a second layer's time. */
static void test_spread_conserves(void **state) {
  (void)state;
  const double slow = tpot_ns("a100-80gb-sxm+runtime=eager+runtime.layer_ns=5000000", "gpt-j-6b", FERRY_SIM_FAST),
               lump = tpot_ns("a100-80gb-sxm+runtime=eager+runtime.layer_ns=5000000+runtime.model_syncs=0", "gpt-j-6b",
                              FERRY_SIM_FAST);
  print_message("5 ms a layer: TPOT %.3f ms spread with waits, %.3f ms in a lump\n", slow / 1e6, lump / 1e6);
  assert_true(lump >= 28 * 5e6);
  assert_true(slow > lump && slow - lump < 0.05 * lump);
}

/* GPT-NeoX copies only its mask value: it waits too, once a layer (44 layers); a family whose
 * code copies nothing (Llama's RoPE table lives on the GPU) runs as before. */
static void test_other_families(void **state) {
  (void)state;
  ferry_hw *hw = NULL;
  const double copy_ns = (double)eager(&hw)->copy_ns;
  ferry_hw_close(hw);
  const double neox = tpot_ns("a100-80gb-sxm+runtime=eager", "gpt-neox-20b", FERRY_SIM_FAST),
               neox_off = tpot_ns("a100-80gb-sxm+runtime=eager+runtime.model_syncs=0", "gpt-neox-20b", FERRY_SIM_FAST);
  print_message("GPT-NeoX-20B: TPOT %.3f ms with the model's waits, %.3f ms without\n", neox / 1e6, neox_off / 1e6);
  assert_true(neox - neox_off >= 44 * copy_ns);
  const double on = tpot_ns("a100-80gb-sxm+runtime=eager", "llama-2-7b", FERRY_SIM_FAST),
               off = tpot_ns("a100-80gb-sxm+runtime=eager+runtime.model_syncs=0", "llama-2-7b", FERRY_SIM_FAST);
  assert_true(on == off);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gptj_waits),
      cmocka_unit_test(test_modes_agree),
      cmocka_unit_test(test_spread_conserves),
      cmocka_unit_test(test_other_families),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
