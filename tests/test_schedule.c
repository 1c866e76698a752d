/* Step scheduling: prefill-first (vLLM without chunked prefill, FlexGen's block schedule, a
 * static batch) against the default mixed steps. While an admitted prompt has tokens left, a
 * prefill-first step carries prompt tokens only; every request's logits are the same either way
 * up to fp32 rounding (each token's logits depend on its sequence alone), only when they come
 * changes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/model.h"
#include "ferry/store.h"
#include "testutil.h"

static char *dir, *dense_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("schedule");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 5};
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

/* Four requests at once, each prompt one step's worth of tokens: mixed steps start decoding the
 * first as the second prefills; prefill-first prefills all four first. */
static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 16, .output_tokens = 5},
    {.id = 1, .prompt_tokens = 16, .output_tokens = 3},
    {.id = 2, .prompt_tokens = 16, .output_tokens = 6},
    {.id = 3, .prompt_tokens = 16, .output_tokens = 4},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

/* Logits of each request, in its own token order (the callback's order differs by schedule). */
struct per_req {
  struct tu_logit_log log[N_REQ];
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                      int64_t vocab) {
  struct per_req *p = user;
  assert_true(req >= 0 && req < N_REQ);
  tu_on_logits(&p->log[req], req, tok, tokens, n_tokens, l, vocab);
}

struct step_shape {
  int64_t n, mixed_steps, prefill_steps, decode_steps;
};

/* Count the steps of each kind: a step of prompt tokens only holds whole 16-token chunks; of
 * decode tokens, one a sequence. */
static void shape_of(struct ferry_engine *e, void *user) {
  struct step_shape *sh = user;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &sh->n);
  for (int64_t i = 0; i < sh->n; i++) {
    if (sm[i].tokens == sm[i].batch) sh->decode_steps++;
    else if (sm[i].tokens == 16 * sm[i].batch) sh->prefill_steps++;
    else sh->mixed_steps++;
  }
}

static struct step_shape run(int prefill_first, struct per_req *out) {
  struct ferry_engine_config c = {.max_batch = 4, .max_step_tokens = 16, .max_seq_tokens = 32, .seed = 9,
                                  .prefill_first = prefill_first, .on_logits = on_logits, .logits_user = out};
  struct step_shape sh = {0};
  tu_run_host(dense_dir, &c, requests, N_REQ, shape_of, &sh);
  return sh;
}

static void test_prefill_first_same_logits_no_mixed_steps(void **state) {
  (void)state;
  struct per_req mixed = {0}, first = {0};
  const struct step_shape a = run(0, &mixed), b = run(1, &first);
  /* mixed: the first sequence decodes while the others prefill */
  assert_true(a.mixed_steps > 0);
  /* prefill-first: four prompt steps, then decode steps only */
  assert_int_equal(b.mixed_steps, 0);
  assert_int_equal(b.prefill_steps, 4);
  assert_int_equal(b.decode_steps, 6 - 1); /* the longest output: 6 tokens, its first from its prompt step */
  assert_int_equal(b.n, 4 + 5);
  for (int64_t r = 0; r < N_REQ; r++) {
    assert_int_equal(first.log[r].n, mixed.log[r].n);
    assert_true(first.log[r].n > 0);
    /* the same rows and kernels; a product over another number of rows may round differently
     * (BLAS picks its kernels by shape), so within fp32 rounding, not to the bit */
    for (size_t i = 0; i < mixed.log[r].n; i++) {
      const float x = first.log[r].v[i], y = mixed.log[r].v[i];
      if (fabsf(x - y) > 1e-4f * (1.0f + fabsf(y))) fail_msg("request %lld logit %zu: %g against %g", (long long)r, i, x, y);
    }
    free(mixed.log[r].v);
    free(first.log[r].v);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefill_first_same_logits_no_mixed_steps),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
