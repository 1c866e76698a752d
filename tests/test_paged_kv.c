/* The paged KV cache: blocks taken as sequences grow, admission by free blocks, the latest
 * sequence preempted and recomputed when they run out. On the host executor the logits of every
 * request are those of the reserved cache (to the bit without preemption, within fp32 rounding
 * with it); in the simulator a budget that a max-batch x max-seq-tokens reservation does not fit
 * runs paged, with the blocks in use never above the pool. */
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
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  size_t n = strlen(dir) + 8;
  dense_dir = malloc(n);
  snprintf(dense_dir, n, "%s/dense", dir);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 6};
  assert_int_equal(ferry_model_generate(m, &go, dense_dir, NULL), FERRY_OK);
  ferry_model_close(m);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paged_logits),
      cmocka_unit_test(test_longer_than_pool_rejected),
      cmocka_unit_test(test_sim_paged_fits_fewer_sequences),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
