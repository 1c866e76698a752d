/* Predictors that learn, judged with bootstrap confidence intervals: on synthetic routing whose
 * requests belong to domains, an mlp3 whose features carry the domain must beat `frequency`
 * (the paired interval of the stall difference excludes 0) on held-out requests; with features
 * that carry nothing, it must not. Also the intervals themselves: they contain the value,
 * shrink as requests are added, and a predictor compared with itself is tied. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "ferry/predict.h"
#include "ferry/routing.h"
#include "testutil.h"

enum { L = 4, E = 16, K = 2, TOKENS = 96, TRAIN_REQS = 40, EVAL_REQS = 24, BOOT = 400 };

/* Routing of requests [first, first + n) from a synthetic model, each token carrying three mlp3
 * features: the request's domain (plus noise) when informative, else noise alone. */
static ferry_routing *trace(ferry_routing_synth *s, int64_t first, int64_t n, int informative) {
  ferry_routing *r = NULL;
  assert_int_equal(ferry_routing_create(&r, L, E, K), FERRY_OK);
  struct ferry_rng rng;
  ferry__rng_seed(&rng, (uint64_t)first * 31 + (uint64_t)informative);
  int32_t ids[K];
  float w[K];
  for (int64_t q = first; q < first + n; q++)
    for (int32_t t = 0; t < TOKENS; t++) {
      float f[FERRY_MLP3_FEATURES];
      f[0] = (informative ? (float)ferry_routing_synth_domain(s, q) : 0.0f) + 0.1f * (float)ferry__rng_normal(&rng);
      f[1] = (float)ferry__rng_normal(&rng);
      f[2] = (float)ferry__rng_uniform(&rng);
      for (int32_t l = 0; l < L; l++) {
        ferry_routing_synth_fn(s, q, t, l, K, E, ids, w);
        assert_int_equal(ferry_routing_add(r, q, t, l, K, ids, w, FERRY_MLP3_FEATURES, f), FERRY_OK);
      }
    }
  return r;
}

/* Evaluation requests of a trace (borrowed arrays). */
static struct ferry_predict_eval_request *requests(const ferry_routing *r, size_t *n) {
  *n = ferry_routing_n_requests(r);
  struct ferry_predict_eval_request *q = calloc(*n, sizeof *q);
  assert_non_null(q);
  for (size_t i = 0; i < *n; i++) {
    struct ferry_routing_request x;
    assert_int_equal(ferry_routing_request_at(r, i, &x), FERRY_OK);
    q[i] = (struct ferry_predict_eval_request){.n_tokens = x.n_tokens, .ids = x.ids, .weights = x.weights,
                                               .features = x.features, .has_features = x.has_features};
  }
  return q;
}

static void eval(ferry_predictor *p, const ferry_routing *r, struct ferry_predict_eval_result *res) {
  size_t n;
  struct ferry_predict_eval_request *q = requests(r, &n);
  struct ferry_predict_eval_config c = {.n_layers = L, .n_experts = E, .top_k = K, .n_features = FERRY_MLP3_FEATURES,
                                        .cache_slots = 4 * K, .prefetch_depth = 1};
  assert_int_equal(ferry_predict_eval(p, q, n, &c, res), FERRY_OK);
  assert_int_equal(res->n_requests, n);
  free(q);
}

static ferry_predictor *frequency(const ferry_routing *train) {
  struct ferry_predictor_config pc = {.kind = FERRY_PREDICTOR_FREQUENCY, .n_layers = L, .n_experts = E, .top_k = K};
  ferry_predictor *p = NULL;
  assert_int_equal(ferry_predictor_create(&p, &pc), FERRY_OK);
  for (int32_t l = 0; l < L; l++) {
    int64_t counts[E] = {0};
    struct ferry_routing_request q;
    for (size_t i = 0; ferry_routing_request_at(train, i, &q) == FERRY_OK; i++)
      for (int32_t t = 0; t < q.n_tokens; t++)
        for (int32_t j = 0; j < K; j++) counts[q.ids[((size_t)t * L + (size_t)l) * K + (size_t)j]]++;
    assert_int_equal(ferry_predictor_set_popularity(p, l, counts), FERRY_OK);
  }
  return p;
}

static ferry_predictor *mlp3(const ferry_routing *train) {
  size_t n = ferry_routing_n_requests(train);
  float *x = calloc(n * TOKENS * FERRY_MLP3_FEATURES, sizeof *x);
  int32_t *y = calloc(n * TOKENS * L * K, sizeof *y);
  assert_true(x && y);
  int64_t s = 0;
  struct ferry_routing_request q;
  for (size_t i = 0; ferry_routing_request_at(train, i, &q) == FERRY_OK; i++)
    for (int32_t t = 0; t < q.n_tokens; t++, s++) {
      memcpy(x + s * FERRY_MLP3_FEATURES, q.features + (size_t)t * FERRY_MLP3_FEATURES, sizeof(float) * FERRY_MLP3_FEATURES);
      memcpy(y + s * L * K, q.ids + (size_t)t * L * K, sizeof(int32_t) * L * K);
    }
  struct ferry_mlp_dataset d = {.n = s, .n_features = FERRY_MLP3_FEATURES, .x = x, .n_layers = L, .top_k = K, .y = y};
  struct ferry_mlp m;
  assert_int_equal(ferry_mlp_init(&m, FERRY_PREDICTOR_MLP3, L, E, 5), FERRY_OK);
  struct ferry_mlp_train_config tc = {.epochs = 6, .batch = 32, .lr = 1e-2, .seed = 5};
  assert_int_equal(ferry_mlp_train(&m, &d, &tc, NULL), FERRY_OK);
  struct ferry_predictor_config pc = {.kind = FERRY_PREDICTOR_MLP3, .n_layers = L, .n_experts = E, .top_k = K,
                                      .mlp_dtype = FERRY_DTYPE_F32, .mlp_dtype_set = 1};
  ferry_predictor *p = NULL;
  assert_int_equal(ferry_predictor_create(&p, &pc), FERRY_OK);
  assert_int_equal(ferry_predictor_set_mlp(p, &m), FERRY_OK);
  ferry_mlp_free(&m);
  free(x);
  free(y);
  return p;
}

/* mlp3 minus frequency on stall (demand loads per token), with its paired interval, on
 * requests held out from training. */
static struct ferry_predict_ci mlp_minus_frequency(const char *spec, int informative, double *recall_mlp,
                                                   double *recall_freq) {
  struct ferry_routing_synth_config c = {.n_layers = L, .n_experts = E, .top_k = K, .seed = 11};
  assert_int_equal(ferry_routing_synth_parse(spec, &c), FERRY_OK);
  ferry_routing_synth *s = NULL;
  assert_int_equal(ferry_routing_synth_create(&s, &c), FERRY_OK);
  ferry_routing *train = trace(s, 0, TRAIN_REQS, informative), *test = trace(s, 1000, EVAL_REQS, informative);
  ferry_predictor *pm = mlp3(train), *pf = frequency(train);
  struct ferry_predict_eval_result rm, rf;
  eval(pm, test, &rm);
  eval(pf, test, &rf);
  struct ferry_predict_ci d;
  assert_int_equal(ferry_predict_eval_diff_ci(&rm, &rf, FERRY_PREDICT_STALL, BOOT, 3, &d), FERRY_OK);
  *recall_mlp = rm.recall;
  *recall_freq = rf.recall;
  fprintf(stderr, "%s, %s features: recall mlp3 %.3f, frequency %.3f; stall difference %.3f [%.3f, %.3f]\n", spec,
          informative ? "domain" : "noise", rm.recall, rf.recall, d.value, d.lo, d.hi);
  ferry_predict_eval_result_free(&rm);
  ferry_predict_eval_result_free(&rf);
  ferry_predictor_free(pm);
  ferry_predictor_free(pf);
  ferry_routing_free(train);
  ferry_routing_free(test);
  ferry_routing_synth_free(s);
  return d;
}

/* Each request's experts come mostly from its domain's ranking: the domain feature tells the
 * MLP which experts to expect, which global popularity cannot. */
static void test_mlp_beats_frequency_with_information(void **state) {
  (void)state;
  double rm, rf;
  struct ferry_predict_ci d = mlp_minus_frequency("domains=4,domain_mix=0.9,domain_zipf=1.5,gate_temp=1", 1, &rm, &rf);
  assert_true(d.hi < 0); /* fewer demand loads, beyond the noise */
  assert_true(rm > rf + 0.05);
}

/* The same routing with features that carry nothing, and routing with no per-request structure
 * at all: the MLP can learn only global popularity, which frequency already has. */
static void test_mlp_does_not_beat_frequency_without_information(void **state) {
  (void)state;
  double rm, rf;
  struct ferry_predict_ci d = mlp_minus_frequency("domains=4,domain_mix=0.9,domain_zipf=1.5,gate_temp=1", 0, &rm, &rf);
  assert_false(d.hi < 0);
  d = mlp_minus_frequency("zipf=0.8,gate_temp=1", 1, &rm, &rf);
  assert_false(d.hi < 0);
  assert_true(fabs(rm - rf) < 0.05);
}

static void test_intervals(void **state) {
  (void)state;
  struct ferry_routing_synth_config c = {.n_layers = L, .n_experts = E, .top_k = K, .seed = 4};
  assert_int_equal(ferry_routing_synth_parse("zipf=1", &c), FERRY_OK);
  ferry_routing_synth *s = NULL;
  assert_int_equal(ferry_routing_synth_create(&s, &c), FERRY_OK);
  double width[2];
  for (int i = 0; i < 2; i++) {
    ferry_routing *r = trace(s, 0, i ? 64 : 8, 0);
    ferry_predictor *p = frequency(r);
    struct ferry_predict_eval_result res;
    eval(p, r, &res);
    struct ferry_predict_ci ci[FERRY_PREDICT_METRICS], again[FERRY_PREDICT_METRICS];
    assert_int_equal(ferry_predict_eval_ci(&res, BOOT, 9, ci), FERRY_OK);
    assert_int_equal(ferry_predict_eval_ci(&res, BOOT, 9, again), FERRY_OK);
    assert_memory_equal(ci, again, sizeof ci); /* seeded */
    assert_true(fabs(ci[FERRY_PREDICT_RECALL].value - res.recall) < 1e-12);
    assert_true(fabs(ci[FERRY_PREDICT_STALL].value - (double)res.misses / (double)res.tokens) < 1e-12);
    for (int m = 0; m < FERRY_PREDICT_METRICS; m++)
      assert_true(ci[m].lo <= ci[m].value + 1e-12 && ci[m].value <= ci[m].hi + 1e-12);
    width[i] = ci[FERRY_PREDICT_STALL].hi - ci[FERRY_PREDICT_STALL].lo;
    struct ferry_predict_ci d;
    assert_int_equal(ferry_predict_eval_diff_ci(&res, &res, FERRY_PREDICT_RECALL, BOOT, 1, &d), FERRY_OK);
    assert_true(d.value == 0 && d.lo == 0 && d.hi == 0); /* a predictor is tied with itself */
    assert_int_equal(ferry_predict_eval_ci(&res, 5, 9, ci), FERRY_ERR_INVALID);
    ferry_predict_eval_result_free(&res);
    ferry_predictor_free(p);
    ferry_routing_free(r);
  }
  assert_true(width[1] < width[0]); /* eight times the requests: a narrower interval */
  assert_string_equal(ferry_predict_metric_name(FERRY_PREDICT_WASTED), "wasted");
  assert_false(ferry_predict_metric_higher_is_better(FERRY_PREDICT_STALL));
  ferry_routing_synth_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_mlp_beats_frequency_with_information),
                                     cmocka_unit_test(test_mlp_does_not_beat_frequency_without_information),
                                     cmocka_unit_test(test_intervals)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
