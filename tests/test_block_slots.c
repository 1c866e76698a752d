/* --block-slots on the `sim` executor: a spare block slot lets a copy from pageable memory run
 * under the compute before it. With prefetch_depth + 1 slots the next block lands in the slot of
 * the block that is still computing, so its copy waits for that compute, and a pageable copy
 * holds the host meanwhile (the driver stages it before the call returns): nothing else is
 * issued, and copies and compute take turns. One slot more and the copy starts at once; the host
 * waits for it while the GPU computes. From pinned memory the host never waits for a copy, so the
 * spare slot changes nothing where the copy is the longer part. */
#include <stdio.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "testutil.h"

/* Four 1024-token prompts prefilled in one step, then one decode step: llama-2-7b streams its 32
 * layers (386 MiB each) a block at a time beside a 4096-token prefill's compute. */
static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 1024, .output_tokens = 2},
    {.id = 1, .prompt_tokens = 1024, .output_tokens = 2},
    {.id = 2, .prompt_tokens = 1024, .output_tokens = 2},
    {.id = 3, .prompt_tokens = 1024, .output_tokens = 2},
};

static double ttft_ms(int pinned, int32_t block_slots, uint64_t *peak, uint64_t budget) {
  const struct ferry_engine_config c = {.max_batch = 4, .max_step_tokens = 4096, .max_seq_tokens = 1026, .seed = 1,
                                        .block_layers = 1, .prefetch_depth = 1, .block_slots = block_slots,
                                        .device_budget_bytes = budget, .plan_elem_bytes = {2, 0}};
  const struct tu_sim_setup setup = {.hw = "rtx-3090", .exec = {.device_budget_bytes = budget, .lock_host_memory = pinned}};
  struct tu_sim_result r;
  ferry_status st = tu_sim_serve(&setup, &c, requests, 4, &r);
  if (st != FERRY_OK) fail_msg("pinned %d, %d slots: %s", pinned, block_slots, ferry_last_error());
  assert_int_equal(r.sum.requests_done, 4);
  *peak = r.sum.peak_bytes[FERRY_TIER_DEVICE];
  return r.sum.ttft.mean / 1e6;
}

static void test_spare_slot_overlaps_pageable_copies(void **state) {
  (void)state;
  const uint64_t budget = 6ull << 30;
  uint64_t peak2 = 0, peak3 = 0;
  const double pageable2 = ttft_ms(0, 0, &peak2, budget), pageable3 = ttft_ms(0, 3, &peak3, budget);
  /* each layer's copy (386 MiB at 12.0 GB/s: 33.7 ms) and its 4096-token compute took turns;
   * now the copies run under the compute: less than 70 % of the time (about half when written) */
  if (!(pageable3 < 0.7 * pageable2)) fail_msg("pageable: %.1f ms with 3 slots, %.1f with 2", pageable3, pageable2);
  /* no faster than the 32 copies alone */
  assert_true(pageable3 > 32 * 33.7);
  /* the spare slot is in the device's memory: one more block, within the budget */
  assert_true(peak3 > peak2 && peak3 <= budget);
  const double pinned2 = ttft_ms(1, 0, &peak2, budget), pinned3 = ttft_ms(1, 3, &peak3, budget);
  if (pinned3 > pinned2 * 1.01 || pinned3 < pinned2 * 0.99)
    fail_msg("pinned: %.1f ms with 3 slots, %.1f with 2", pinned3, pinned2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spare_slot_overlaps_pageable_copies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
