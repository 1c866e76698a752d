/* The paged KV cache: blocks taken as sequences grow, admission by free blocks, the latest
 * sequence preempted and recomputed (or swapped to host memory and back) when they run out. On
 * the host executor the logits of every request are those of the reserved cache (to the bit
 * without preemption, within fp32 rounding with it); in the simulator a budget that a max-batch x
 * max-seq-tokens reservation does not fit runs paged, with the blocks in use never above the
 * pool, and swapped blocks cross the link both ways, within the host budget. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

#define N_REQ 6

static char *dir, *dense_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("paged_kv");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 6};
  dense_dir = tu_gen_model(dir, "tiny-dense", "dense", &go);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(dense_dir);
  return 0;
}

/* each request's logits in token order */
struct per_req {
  float *v[N_REQ];
  size_t n[N_REQ], cap[N_REQ];
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                      int64_t vocab) {
  (void)tok;
  (void)tokens;
  (void)n_tokens;
  struct per_req *p = user;
  assert_true(req >= 0 && req < N_REQ);
  if (p->n[req] + (size_t)vocab > p->cap[req]) {
    p->cap[req] = (p->cap[req] + (size_t)vocab) * 2;
    p->v[req] = realloc(p->v[req], p->cap[req] * sizeof(float));
    assert_non_null(p->v[req]);
  }
  memcpy(p->v[req] + p->n[req], l, (size_t)vocab * sizeof *l);
  p->n[req] += (size_t)vocab;
}

static const struct ferry_engine_request requests[N_REQ] = {
    {.id = 0, .prompt_tokens = 9, .output_tokens = 5},  {.id = 1, .prompt_tokens = 13, .output_tokens = 4},
    {.id = 2, .prompt_tokens = 4, .output_tokens = 9},  {.id = 3, .prompt_tokens = 7, .output_tokens = 6},
    {.id = 4, .prompt_tokens = 11, .output_tokens = 3}, {.id = 5, .prompt_tokens = 6, .output_tokens = 7},
};

struct outcome {
  struct per_req logits;
  struct ferry_serve_summary sum;
  int64_t max_blocks;
};

static struct ferry_engine_config config(void) {
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 17, .seed = 8};
  return c;
}

static void run_host(struct ferry_engine_config c, struct outcome *o) {
  memset(o, 0, sizeof *o);
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dense_dir), FERRY_OK);
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.compute_threads = 1}), FERRY_OK);
  c.on_logits = on_logits;
  c.logits_user = &o->logits;
  if (ferry_engine_create(&e, m, s, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  ferry_engine_summary(e, &o->sum);
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  for (int64_t i = 0; i < n; i++)
    if (sm[i].kv_blocks > o->max_blocks) o->max_blocks = sm[i].kv_blocks;
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

static void free_outcome(struct outcome *o) {
  for (int r = 0; r < N_REQ; r++) free(o->logits.v[r]);
}

static double worst(const struct outcome *a, const struct outcome *b) {
  double w = 0;
  for (int r = 0; r < N_REQ; r++) {
    assert_int_equal(a->logits.n[r], b->logits.n[r]);
    for (size_t i = 0; i < a->logits.n[r]; i++) {
      const double x = a->logits.v[r][i], y = b->logits.v[r][i];
      w = fmax(w, fabs(x - y) / (1.0 + fabs(x)));
    }
  }
  return w;
}

static void test_paged_logits(void **state) {
  (void)state;
  struct outcome ref, paged, tight;
  run_host(config(), &ref);
  assert_int_equal(ref.sum.kv_pool_blocks, 0);
  /* a pool as large as the reservation: the same steps, the same logits to the bit */
  struct ferry_engine_config c = config();
  c.kv_block_tokens = 4;
  run_host(c, &paged);
  assert_int_equal(paged.sum.requests_done, N_REQ);
  assert_int_equal(paged.sum.kv_pool_blocks, 3 * 5); /* 3 sequences x ceil(17 / 4) */
  assert_int_equal(paged.sum.preemptions, 0);
  assert_true(worst(&ref, &paged) == 0.0);
  /* 6 blocks (24 tokens: one longest request and a bit): admission waits, sequences are
   * preempted and recomputed, and every token's logits stay those of the reserved cache */
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  const uint64_t per_token = ferry_model_kv_bytes(m, 1, FERRY_KV_AUTO);
  ferry_model_close(m);
  c.kv_pool_bytes = 6 * 4 * per_token;
  run_host(c, &tight);
  assert_int_equal(tight.sum.requests_done, N_REQ);
  assert_int_equal(tight.sum.kv_pool_blocks, 6);
  assert_true(tight.sum.preemptions > 0);
  assert_true(tight.max_blocks > 0 && tight.max_blocks <= 6);
  const double w = worst(&ref, &tight);
  if (w > 1e-5) fail_msg("a recomputed sequence's logits differ by %g", w);
  /* swapped to host memory and back instead: the same logits, and its rows cross the link */
  struct outcome swapped;
  c.kv_preempt_swap = 1;
  run_host(c, &swapped);
  assert_int_equal(swapped.sum.requests_done, N_REQ);
  assert_int_equal(swapped.sum.kv_pool_blocks, 6);
  assert_true(swapped.sum.swaps > 0 && swapped.sum.swaps <= swapped.sum.preemptions);
  assert_true(swapped.max_blocks > 0 && swapped.max_blocks <= 6);
  /* whole blocks went out, as many came back, both counted in the run's traffic */
  assert_true(swapped.sum.swap_bytes > 0 && swapped.sum.swap_bytes % (4 * per_token) == 0);
  assert_true(swapped.sum.bytes_d2h >= swapped.sum.swap_bytes && swapped.sum.bytes_h2d >= swapped.sum.swap_bytes);
  /* its rows were kept, not recomputed: each token's logits are the reserved cache's */
  const double ws = worst(&ref, &swapped);
  if (ws > 1e-5) fail_msg("a swapped sequence's logits differ by %g", ws);
  free_outcome(&swapped);
  free_outcome(&ref);
  free_outcome(&paged);
  free_outcome(&tight);
}

/* A request longer than the whole pool can never run: rejected, the others served. */
static void test_longer_than_pool_rejected(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  const uint64_t per_token = ferry_model_kv_bytes(m, 1, FERRY_KV_AUTO);
  ferry_model_close(m);
  struct ferry_engine_config c = config();
  c.kv_block_tokens = 4;
  c.kv_pool_bytes = 4 * 4 * per_token; /* 16 tokens: request 1 needs 17 */
  struct outcome o;
  run_host(c, &o);
  assert_int_equal(o.sum.requests_rejected, 1);
  assert_int_equal(o.sum.requests_done, N_REQ - 1);
  assert_int_equal(o.logits.n[1], 0);
  free_outcome(&o);
}

/* In the simulator, a budget a reservation of 3 x 2048 tokens (24 MiB) does not fit: refused unpaged;
 * paged, the model stays resident and the pool takes what is left, reported by the plan. */
static void test_sim_paged_fits_fewer_sequences(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  struct ferry_engine_config c = config();
  c.max_seq_tokens = 2048;
  c.resident_all = 1;
  uint64_t dmin = 0, hmin = 0;
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &c, &dmin, &hmin), FERRY_OK);
  const uint64_t kv = ferry_model_kv_bytes(m, 3 * 2048, FERRY_KV_AUTO);
  c.device_budget_bytes = 16u << 20; /* weights, workspace and one sequence of 2048 tokens, not three */
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.device_budget_bytes = c.device_budget_bytes,
                                                                                .lock_host_memory = 1}),
                   FERRY_OK);
  assert_true(kv > (16u << 20));
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_ERR_BUDGET);
  c.kv_block_tokens = 16;
  char path[512];
  snprintf(path, sizeof path, "%s/plan.txt", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(ferry_engine_plan_only(m, NULL, &c, f), FERRY_OK);
  fclose(f);
  f = fopen(path, "r");
  assert_non_null(f);
  char line[512];
  int pool_line = 0;
  while (fgets(line, sizeof line, f)) pool_line |= tu_contains(line, "KV pool") && tu_contains(line, "sequences of 2048");
  fclose(f);
  assert_true(pool_line);
  if (ferry_engine_create(&e, m, NULL, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  static const struct ferry_engine_request reqs[4] = {{.id = 0, .prompt_tokens = 600, .output_tokens = 40},
                                                      {.id = 1, .prompt_tokens = 900, .output_tokens = 30},
                                                      {.id = 2, .prompt_tokens = 700, .output_tokens = 50},
                                                      {.id = 3, .prompt_tokens = 300, .output_tokens = 20}};
  assert_int_equal(ferry_engine_run(e, reqs, 4, &(struct ferry_run_options){.as_fast_as_possible = 1}), FERRY_OK);
  struct ferry_serve_summary sum;
  ferry_engine_summary(e, &sum);
  assert_int_equal(sum.requests_done, 4);
  assert_true(sum.kv_pool_blocks > 0 && sum.kv_pool_blocks < 3 * 128);
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  for (int64_t i = 0; i < n; i++) assert_true(sm[i].kv_blocks <= sum.kv_pool_blocks);
  assert_true(sum.peak_bytes[FERRY_TIER_DEVICE] <= c.device_budget_bytes);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  ferry_model_close(m);
}

/* Swap preemption is for a paged cache. */
static void test_swap_needs_paging(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_hw *hw = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){0}), FERRY_OK);
  struct ferry_engine_config c = config();
  c.kv_preempt_swap = 1;
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "--kv-preempt swap"));
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  ferry_model_close(m);
}

/* One simulated run of long decodes through a pool of 40 blocks of 16 tokens; host_budget 0 is
 * unlimited. */
static void sim_swap_run(uint64_t host_budget, uint64_t swap_bytes, int swap, struct ferry_serve_summary *sum,
                         struct ferry_sim_stats *link, int64_t *max_blocks) {
  ferry_model *m = NULL;
  ferry_hw *hw = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  struct ferry_engine_config c = config();
  c.max_seq_tokens = 512;
  c.kv_block_tokens = 16;
  c.kv_pool_bytes = 40 * ferry_model_kv_bytes(m, 16, FERRY_KV_AUTO);
  c.kv_preempt_swap = swap;
  c.kv_swap_bytes = swap_bytes;
  c.host_budget_bytes = host_budget;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.host_budget_bytes = host_budget,
                                                                                .lock_host_memory = 1}),
                   FERRY_OK);
  if (ferry_engine_create(&e, m, NULL, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  /* three sequences of 100 + 300 tokens want 75 blocks */
  static const struct ferry_engine_request reqs[4] = {{.id = 0, .prompt_tokens = 100, .output_tokens = 300},
                                                      {.id = 1, .prompt_tokens = 90, .output_tokens = 280},
                                                      {.id = 2, .prompt_tokens = 120, .output_tokens = 260},
                                                      {.id = 3, .prompt_tokens = 60, .output_tokens = 200}};
  assert_int_equal(ferry_engine_run(e, reqs, 4, &(struct ferry_run_options){.as_fast_as_possible = 1}), FERRY_OK);
  ferry_engine_summary(e, sum);
  assert_int_equal(sum->requests_done, 4);
  assert_int_equal(sum->kv_pool_blocks, 40);
  assert_true(sum->peak_bytes[FERRY_TIER_HOST] <= host_budget || !host_budget);
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  uint64_t d2h = 0, h2d = 0;
  *max_blocks = 0;
  for (int64_t i = 0; i < n; i++) {
    d2h += sm[i].bytes_d2h;
    h2d += sm[i].bytes_h2d;
    if (sm[i].kv_blocks > *max_blocks) *max_blocks = sm[i].kv_blocks;
  }
  /* every byte the steps count crossed the simulated link: the swaps are priced there */
  assert_int_equal(ferry_exec_sim_stats(ex, link), FERRY_OK);
  assert_int_equal(link->bytes_d2h, d2h);
  assert_true(link->bytes_h2d >= h2d); /* and the resident weights' load */
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  ferry_model_close(m);
}

/* In the simulator a small pool preempts; swapped, the blocks go down and come back over the
 * link (priced there), and a host budget the swap space does not fit shrinks it, the rest
 * recomputed. */
static void test_sim_swap(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  const uint64_t block = ferry_model_kv_bytes(m, 16, FERRY_KV_AUTO);
  ferry_model_close(m);
  struct ferry_serve_summary rec, sw, small;
  struct ferry_sim_stats lrec, lsw, lsmall;
  int64_t mb;
  sim_swap_run(0, 0, 0, &rec, &lrec, &mb);
  assert_true(rec.preemptions > 0);
  assert_int_equal(rec.swaps, 0);
  assert_int_equal(rec.swap_bytes, 0);
  sim_swap_run(0, 0, 1, &sw, &lsw, &mb);
  assert_true(mb <= 40);
  assert_true(sw.preemptions > 0);
  assert_int_equal(sw.swaps, sw.preemptions); /* a swap slot per pool block: every one fits */
  assert_true(sw.swap_bytes >= block && sw.swap_bytes % block == 0);
  /* the swapped rows are the difference in device-to-host traffic (the logits of each new token
   * come back either way), and they come back up */
  assert_int_equal(lsw.bytes_d2h, lrec.bytes_d2h + sw.swap_bytes);
  assert_true(lsw.bytes_h2d >= sw.swap_bytes);
  /* swapping back what was computed is less work than prefilling it again */
  assert_true(sw.steps < rec.steps);
  /* a host budget with room for part of the pool: fewer slots, the other preemptions recomputed */
  uint64_t dmin = 0, hmin = 0;
  ferry_model *m2 = NULL;
  assert_int_equal(ferry_model_open(&m2, "tiny-dense"), FERRY_OK);
  struct ferry_engine_config c = config();
  c.max_seq_tokens = 512;
  c.kv_block_tokens = 16;
  assert_int_equal(ferry_engine_min_budgets(m2, NULL, &c, &dmin, &hmin), FERRY_OK);
  ferry_model_close(m2);
  sim_swap_run(hmin + 20 * block, 0, 1, &small, &lsmall, &mb);
  assert_true(small.preemptions > 0);
  assert_true(small.swaps < small.preemptions);
  /* --kv-swap: swap space of 5 blocks and a half (whole blocks: 5), the host budget unlimited;
   * fewer swaps than with a slot per pool block, never more blocks out at once than 5 */
  struct ferry_serve_summary sized;
  struct ferry_sim_stats lsized;
  sim_swap_run(0, 5 * block + block / 2, 1, &sized, &lsized, &mb);
  assert_true(sized.preemptions > 0);
  assert_true(sized.swaps < sized.preemptions);
  assert_true(sized.swaps > 0);
  assert_true(sized.peak_bytes[FERRY_TIER_HOST] < sw.peak_bytes[FERRY_TIER_HOST]);
  assert_int_equal(sw.peak_bytes[FERRY_TIER_HOST] - sized.peak_bytes[FERRY_TIER_HOST], (40 - 5) * block);
}

/* --kv-swap sizes swap preemption's host copy: without --kv-preempt swap it is refused. */
static void test_swap_size_needs_swap(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_host(&ex, NULL), FERRY_OK);
  struct ferry_engine_config c = config();
  c.kv_block_tokens = 16;
  c.kv_swap_bytes = 1 << 20;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "--kv-preempt swap"));
  ferry_exec_destroy(ex);
  ferry_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paged_logits),
      cmocka_unit_test(test_longer_than_pool_rejected),
      cmocka_unit_test(test_swap_size_needs_swap),
      cmocka_unit_test(test_sim_paged_fits_fewer_sequences),
      cmocka_unit_test(test_swap_needs_paging),
      cmocka_unit_test(test_sim_swap),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
