/* Expert predictors: metrics on constructed routing with known answers (layer l+1 repeats
 * layer l: gate-lookahead and oracle reach recall 1; uniform routing: frequency recall k/E),
 * cache accounting (none, lru, wasted prefetches), top-k selection rules and argument
 * errors, MLP training (loss falls, bit-identical for a seed), dtype rounding, features, and
 * `ferry predictor train/eval` (byte-identical files, int8 weights load). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/rng.h"
#include "ferry/predict.h"
#include "ferry/prefetch.h"
#include "ferry/routing.h"
#include "testutil.h"

enum { L = 6, E = 16, K = 2, T = 200 };

/* One request whose layer l+1 always repeats layer l; layer 0 is uniform per token. */
static void repeat_trace(int32_t *ids, float *w, uint64_t seed) {
  struct ferry_rng rng;
  ferry__rng_seed(&rng, seed);
  for (int t = 0; t < T; t++) {
    int32_t a = (int32_t)ferry__rng_below(&rng, E), b;
    do b = (int32_t)ferry__rng_below(&rng, E);
    while (b == a);
    for (int l = 0; l < L; l++) {
      ids[(t * L + l) * K] = a;
      ids[(t * L + l) * K + 1] = b;
      w[(t * L + l) * K] = 0.6f;
      w[(t * L + l) * K + 1] = 0.4f;
    }
  }
}

static ferry_predictor *make(enum ferry_predictor_kind kind) {
  struct ferry_predictor_config c = {.kind = kind, .n_layers = L, .n_experts = E, .top_k = K};
  ferry_predictor *p = NULL;
  assert_int_equal(ferry_predictor_create(&p, &c), FERRY_OK);
  return p;
}

static struct ferry_predict_eval_config eval_cfg(int32_t slots, int32_t depth) {
  return (struct ferry_predict_eval_config){
      .n_layers = L, .n_experts = E, .top_k = K, .cache_slots = slots, .prefetch_depth = depth, .expert_bytes = 1000};
}

static void test_repeat_trace_recall(void **state) {
  (void)state;
  static int32_t ids[T * L * K];
  static float w[T * L * K];
  repeat_trace(ids, w, 1);
  struct ferry_predict_eval_request rq = {.n_tokens = T, .ids = ids, .weights = w};
  enum ferry_predictor_kind kinds[] = {FERRY_PREDICTOR_GATE_LOOKAHEAD, FERRY_PREDICTOR_ORACLE};
  for (int depth = 1; depth <= 2; depth++)
    for (int i = 0; i < 2; i++) {
      ferry_predictor *p = make(kinds[i]);
      struct ferry_predict_eval_config c = eval_cfg(K * 4, depth);
      struct ferry_predict_eval_result r;
      assert_int_equal(ferry_predict_eval(p, &rq, 1, &c, &r), FERRY_OK);
      assert_int_equal(r.predictions, (int64_t)T * (L - depth));
      assert_true(r.recall == 1.0);
      assert_true(r.precision == 1.0);
      for (int l = 0; l < depth; l++) assert_true(isnan(r.layer_recall[l]));
      for (int l = depth; l < L; l++) assert_true(r.layer_recall[l] == 1.0);
      assert_int_equal(r.uses, (int64_t)T * L * K);
      assert_int_equal(r.hits + r.misses, r.uses);
      assert_int_equal(r.tokens, T);
      /* Only the first `depth` layers of a token are never predicted: every other use hits a
       * prefetched expert, and no prefetch is wasted. */
      assert_int_equal(r.prefetch_unused, 0);
      assert_int_equal(r.prefetch_useful, r.prefetch_loads);
      assert_true(r.misses <= (int64_t)T * K * depth);
      assert_true(r.hits >= (int64_t)T * K * (L - depth));
      ferry_predict_eval_result_free(&r);
      ferry_predictor_free(p);
    }
}

static void test_cache_accounting(void **state) {
  (void)state;
  /* Uniform routing, no layer agreement. */
  struct ferry_routing_synth_config sc = {.n_layers = L, .n_experts = E, .top_k = K, .seed = 9};
  ferry_routing_synth *s;
  assert_int_equal(ferry_routing_synth_create(&s, &sc), FERRY_OK);
  ferry_routing *tr;
  assert_int_equal(ferry_routing_synth_trace(s, 4, 500, &tr), FERRY_OK);
  struct ferry_predict_eval_request rqs[4];
  for (size_t i = 0; i < 4; i++) {
    struct ferry_routing_request q;
    assert_int_equal(ferry_routing_request_at(tr, i, &q), FERRY_OK);
    rqs[i] = (struct ferry_predict_eval_request){.n_tokens = q.n_tokens, .ids = q.ids, .weights = q.weights};
  }
  struct ferry_predict_eval_config c = eval_cfg(24, 1);
  struct ferry_predict_eval_result r;

  ferry_predictor *p = make(FERRY_PREDICTOR_NONE);
  assert_int_equal(ferry_predict_eval(p, rqs, 4, &c, &r), FERRY_OK);
  assert_int_equal(r.misses, r.uses);
  assert_int_equal(r.hits, 0);
  assert_int_equal(r.predictions, 0);
  assert_true(isnan(r.recall));
  assert_int_equal(r.bytes_loaded, (uint64_t)r.uses * 1000);
  ferry_predict_eval_result_free(&r);
  ferry_predictor_free(p);

  /* LRU: 24 slots over 6 x 16 experts with uniform routing: hit rate near 24/96. */
  p = make(FERRY_PREDICTOR_LRU);
  assert_int_equal(ferry_predict_eval(p, rqs, 4, &c, &r), FERRY_OK);
  assert_int_equal(r.prefetch_loads, 0);
  double hit = (double)r.hits / (double)r.uses;
  assert_true(hit > 0.15 && hit < 0.35);
  int64_t lru_misses = r.misses;
  ferry_predict_eval_result_free(&r);
  ferry_predictor_free(p);

  /* frequency with popularity counted on the trace: recall near k/E on uniform routing. */
  p = make(FERRY_PREDICTOR_FREQUENCY);
  int64_t counts[E];
  for (int l = 0; l < L; l++) {
    memset(counts, 0, sizeof counts);
    for (size_t i = 0; i < 4; i++)
      for (int t = 0; t < rqs[i].n_tokens; t++)
        for (int j = 0; j < K; j++) counts[rqs[i].ids[(t * L + l) * K + j]]++;
    assert_int_equal(ferry_predictor_set_popularity(p, l, counts), FERRY_OK);
  }
  assert_int_equal(ferry_predict_eval(p, rqs, 4, &c, &r), FERRY_OK);
  assert_true(fabs(r.recall - (double)K / E) < 0.03);
  ferry_predict_eval_result_free(&r);
  ferry_predictor_free(p);

  /* gate-lookahead's proxy ("repeat this layer") on uncorrelated layers: recall near k/E,
   * and its wrong guesses are loads fetched but never used. */
  p = make(FERRY_PREDICTOR_GATE_LOOKAHEAD);
  assert_int_equal(ferry_predict_eval(p, rqs, 4, &c, &r), FERRY_OK);
  assert_true(fabs(r.recall - (double)K / E) < 0.03);
  assert_true(r.prefetch_unused > r.prefetch_loads / 2);
  assert_int_equal(r.bytes_unused, (uint64_t)r.prefetch_unused * 1000);
  assert_int_equal(r.prefetch_useful + r.prefetch_unused, r.prefetch_loads);
  assert_int_equal(r.bytes_loaded, (uint64_t)(r.misses + r.prefetch_loads) * 1000);
  ferry_predict_eval_result_free(&r);
  ferry_predictor_free(p);

  /* oracle: strictly fewer demand misses than LRU. */
  p = make(FERRY_PREDICTOR_ORACLE);
  assert_int_equal(ferry_predict_eval(p, rqs, 4, &c, &r), FERRY_OK);
  assert_true(r.recall == 1.0);
  assert_true(r.misses < lru_misses / 2);
  assert_int_equal(r.prefetch_unused, 0);
  ferry_predict_eval_result_free(&r);

  /* Too few slots for one layer. */
  c.cache_slots = 1;
  assert_int_equal(ferry_predict_eval(p, rqs, 4, &c, &r), FERRY_ERR_INVALID);
  c.cache_slots = 8;
  c.prefetch_depth = L;
  assert_int_equal(ferry_predict_eval(p, rqs, 4, &c, &r), FERRY_ERR_INVALID);
  ferry_predictor_free(p);
  ferry_routing_free(tr);
  ferry_routing_synth_free(s);
}

static void test_predict_rules(void **state) {
  (void)state;
  ferry_predictor *p = make(FERRY_PREDICTOR_GATE_LOOKAHEAD);
  float logits[E];
  for (int e = 0; e < E; e++) logits[e] = -INFINITY;
  logits[9] = 2;
  logits[4] = 2; /* tie with 9: lower id first */
  logits[7] = 5;
  logits[1] = NAN;
  struct ferry_predict_context ctx = {.layer = 0, .gate_logits = logits, .n_gate_logits = E};
  int32_t out[8];
  int32_t n;
  assert_int_equal(ferry_predictor_predict(p, &ctx, 1, out, 8, &n), FERRY_OK);
  assert_int_equal(n, 3); /* -inf and NaN are never chosen */
  assert_int_equal(out[0], 7);
  assert_int_equal(out[1], 4);
  assert_int_equal(out[2], 9);
  assert_int_equal(ferry_predictor_predict(p, &ctx, 1, out, 2, &n), FERRY_OK);
  assert_int_equal(n, 2); /* capacity respected */
  assert_int_equal(ferry_predictor_predict(p, &ctx, L, out, 2, &n), FERRY_ERR_INVALID);
  ctx.gate_logits = NULL;
  assert_int_equal(ferry_predictor_predict(p, &ctx, 1, out, 2, &n), FERRY_ERR_INVALID);
  ferry_predictor_free(p);

  p = make(FERRY_PREDICTOR_FREQUENCY); /* learns online from observe() */
  struct ferry_predict_context c0 = {.layer = 0};
  assert_int_equal(ferry_predictor_predict(p, &c0, 1, out, 2, &n), FERRY_OK);
  assert_int_equal(n, 0);
  int32_t a[K] = {5, 3}, b[K] = {5, 12};
  ferry_predictor_observe(p, 0, 0, 1, K, a);
  ferry_predictor_observe(p, 0, 1, 1, K, b);
  assert_int_equal(ferry_predictor_predict(p, &c0, 1, out, 2, &n), FERRY_OK);
  assert_int_equal(n, 2);
  assert_int_equal(out[0], 5);
  assert_int_equal(out[1], 3);
  ferry_predictor_free(p);

  p = make(FERRY_PREDICTOR_MLP3); /* no weights yet: predicts nothing */
  float f[3] = {1, 2, 3};
  struct ferry_predict_context cm = {.layer = 0, .features = f, .n_features = 3};
  assert_int_equal(ferry_predictor_predict(p, &cm, 1, out, 2, &n), FERRY_OK);
  assert_int_equal(n, 0);
  struct ferry_mlp m7;
  assert_int_equal(ferry_mlp_init(&m7, FERRY_PREDICTOR_MLP7, L, E, 1), FERRY_OK);
  assert_int_equal(ferry_predictor_set_mlp(p, &m7), FERRY_ERR_INVALID);
  ferry_mlp_free(&m7);
  ferry_predictor_free(p);

  enum ferry_predictor_kind k;
  for (int i = 0; i <= FERRY_PREDICTOR_ORACLE; i++) {
    assert_int_equal(ferry_predictor_kind_parse(ferry_predictor_kind_name((enum ferry_predictor_kind)i), &k), FERRY_OK);
    assert_int_equal(k, i);
  }
  assert_int_equal(ferry_predictor_kind_parse("psychic", &k), FERRY_ERR_INVALID);
  struct ferry_predictor_config bad = {.kind = FERRY_PREDICTOR_MLP3, .n_layers = L, .n_experts = E, .top_k = K,
                                       .mlp_dtype = FERRY_DTYPE_BF16, .mlp_dtype_set = 1};
  assert_int_equal(ferry_predictor_create(&p, &bad), FERRY_ERR_UNSUPPORTED);
}

/* Routing that depends on position: the first half of each request picks {0, 1} at every
 * layer, the second half {2 + l, 3 + l}; position is a derived feature, so the MLP can learn it. */
static void positional_data(struct ferry_mlp_dataset *d, float *x, int32_t *y, int32_t n_tok,
                            enum ferry_predictor_kind v) {
  int32_t nf = v == FERRY_PREDICTOR_MLP7 ? FERRY_MLP7_FEATURES : FERRY_MLP3_FEATURES;
  int64_t s = 0;
  for (int q = 0; q < 2; q++)
    for (int32_t t = 0; t < n_tok; t++, s++) {
      ferry_predictor_features_derived(v, t, n_tok, x + s * nf);
      for (int l = 0; l < L; l++) {
        y[(s * L + l) * K] = t < n_tok / 2 ? 0 : 2 + l;
        y[(s * L + l) * K + 1] = t < n_tok / 2 ? 1 : 3 + l;
      }
    }
  *d = (struct ferry_mlp_dataset){.n = s, .n_features = nf, .x = x, .n_layers = L, .top_k = K, .y = y};
}

static void test_mlp_training(void **state) {
  (void)state;
  enum { N = 64 };
  static float x[2 * N * FERRY_MLP7_FEATURES];
  static int32_t y[2 * N * L * K];
  struct ferry_mlp_dataset d;
  positional_data(&d, x, y, N, FERRY_PREDICTOR_MLP3);
  struct ferry_mlp a, b, c;
  assert_int_equal(ferry_mlp_init(&a, FERRY_PREDICTOR_MLP3, L, E, 7), FERRY_OK);
  assert_int_equal(ferry_mlp_init(&b, FERRY_PREDICTOR_MLP3, L, E, 7), FERRY_OK);
  assert_int_equal(ferry_mlp_init(&c, FERRY_PREDICTOR_MLP3, L, E, 8), FERRY_OK);
  double before = ferry_mlp_loss(&a, &d);
  struct ferry_mlp_train_config tc = {.epochs = 30, .batch = 16, .lr = 0.01, .seed = 3};
  double loss[30];
  assert_int_equal(ferry_mlp_train(&a, &d, &tc, loss), FERRY_OK);
  assert_int_equal(ferry_mlp_train(&b, &d, &tc, NULL), FERRY_OK);
  assert_int_equal(ferry_mlp_train(&c, &d, &tc, NULL), FERRY_OK);
  assert_true(loss[29] < 0.25 * before);
  assert_true(loss[29] < loss[0]);
  assert_true(fabs(ferry_mlp_loss(&a, &d) - loss[29]) < 1e-12);
  /* Bit-identical for the same seed, different for another. */
  size_t n3 = (size_t)L * E * FERRY_MLP_H2;
  assert_memory_equal(a.w1, b.w1, FERRY_MLP_H1 * FERRY_MLP3_FEATURES * sizeof(float));
  assert_memory_equal(a.w3, b.w3, n3 * sizeof(float));
  assert_memory_equal(a.b3, b.b3, (size_t)L * E * sizeof(float));
  assert_memory_equal(a.in_mean, b.in_mean, 3 * sizeof(float));
  assert_true(memcmp(a.w3, c.w3, n3 * sizeof(float)) != 0);

  /* The trained MLP predicts the positional routing: recall 1 in both halves. */
  ferry_predictor *p = make(FERRY_PREDICTOR_MLP3);
  assert_int_equal(ferry_predictor_set_mlp(p, &a), FERRY_OK);
  int32_t out[K], n;
  for (int32_t t = 0; t < N; t += N / 2) {
    float f[3];
    ferry_predictor_features_derived(FERRY_PREDICTOR_MLP3, t + 3, N, f);
    struct ferry_predict_context ctx = {.layer = 1, .features = f, .n_features = 3};
    assert_int_equal(ferry_predictor_predict(p, &ctx, 2, out, K, &n), FERRY_OK);
    assert_int_equal(n, K);
    int32_t lo = t < N / 2 ? 0 : 2 + 3;
    assert_true((out[0] == lo && out[1] == lo + 1) || (out[0] == lo + 1 && out[1] == lo));
  }
  ferry_predictor_free(p);

  /* mlp7 learns too. */
  struct ferry_mlp m7;
  positional_data(&d, x, y, N, FERRY_PREDICTOR_MLP7);
  assert_int_equal(ferry_mlp_init(&m7, FERRY_PREDICTOR_MLP7, L, E, 7), FERRY_OK);
  before = ferry_mlp_loss(&m7, &d);
  assert_int_equal(ferry_mlp_train(&m7, &d, &tc, loss), FERRY_OK);
  assert_true(loss[29] < 0.25 * before);
  /* Shape mismatch. */
  assert_int_equal(ferry_mlp_train(&a, &d, &tc, NULL), FERRY_ERR_INVALID);
  assert_true(isnan(ferry_mlp_loss(&a, &d)));
  ferry_mlp_free(&m7);

  /* dtype rounding: fp16 within half an fp16 ulp, int8 on a 255-level grid per row. */
  struct ferry_mlp h, q;
  assert_int_equal(ferry_mlp_copy(&h, &a), FERRY_OK);
  assert_int_equal(ferry_mlp_copy(&q, &a), FERRY_OK);
  assert_int_equal(ferry_mlp_quantize(&h, FERRY_DTYPE_F16), FERRY_OK);
  assert_int_equal(ferry_mlp_quantize(&q, FERRY_DTYPE_I8), FERRY_OK);
  int changed = 0;
  for (size_t i = 0; i < n3; i++) {
    assert_true(fabsf(h.w3[i] - a.w3[i]) <= fabsf(a.w3[i]) * (1.0f / 1024) + 1e-7f);
    changed |= q.w3[i] != a.w3[i];
  }
  assert_true(changed);
  for (size_t r = 0; r < (size_t)L * E; r++) {
    float mx = 0;
    for (int i = 0; i < FERRY_MLP_H2; i++) mx = fmaxf(mx, fabsf(a.w3[r * FERRY_MLP_H2 + i]));
    for (int i = 0; i < FERRY_MLP_H2; i++) {
      float v = q.w3[r * FERRY_MLP_H2 + i] / (mx / 127);
      assert_true(fabsf(v - nearbyintf(v)) < 1e-3f);
      assert_true(fabsf(q.w3[r * FERRY_MLP_H2 + i] - a.w3[r * FERRY_MLP_H2 + i]) <= mx / 127 / 2 * 1.001f);
    }
  }
  assert_int_equal(ferry_mlp_quantize(&q, FERRY_DTYPE_BF16), FERRY_ERR_UNSUPPORTED);
  ferry_mlp_free(&h);
  ferry_mlp_free(&q);
  ferry_mlp_free(&a);
  ferry_mlp_free(&b);
  ferry_mlp_free(&c);
}

/* A weight file reports the type its weights are stored in, and metadata that names another
 * (tests/fuzz/predictor/crash-dtype-metadata: "ferry.dtype": "BOOL" over fp16 weights, which
 * the loader once passed through) is refused. */
static void test_weights_dtype(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("mlpdtype");
  char *path = ferry__asprintf("%s/m.safetensors", dir);
  struct ferry_mlp m, back;
  assert_int_equal(ferry_mlp_init(&m, FERRY_PREDICTOR_MLP7, 2, 4, 5), FERRY_OK);
  enum ferry_dtype dt = FERRY_DTYPE_F32;
  assert_int_equal(ferry_mlp_save(&m, FERRY_DTYPE_F16, 2, path), FERRY_OK);
  assert_int_equal(ferry_mlp_load(path, FERRY_PREDICTOR_MLP7, 2, 4, &back, &dt), FERRY_OK);
  assert_int_equal(dt, FERRY_DTYPE_F16);
  ferry_mlp_free(&back);
  assert_int_equal(ferry_mlp_save(&m, FERRY_DTYPE_I8, 2, path), FERRY_OK);
  assert_int_equal(ferry_mlp_load(path, FERRY_PREDICTOR_MLP7, 2, 4, &back, &dt), FERRY_OK);
  assert_int_equal(dt, FERRY_DTYPE_I8);
  ferry_mlp_free(&back);
  ferry_mlp_free(&m);
  char *bad = ferry__asprintf("%s/tests/fuzz/predictor/crash-dtype-metadata", getenv("FERRY_SOURCE_DIR"));
  assert_int_equal(ferry_mlp_load(bad, FERRY_PREDICTOR_MLP7, 2, 4, &back, &dt), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "metadata ferry.dtype is BOOL but the weights (w1) are stored as"));
  ferry_free(bad);
  tu_rmtree(dir);
  ferry_free(path);
  free(dir);
}

static void test_features(void **state) {
  (void)state;
  float f3[3];
  ferry_predictor_features_mlp3(12.5f, 0.25f, FERRY_MLP_MAX_SEQ, f3);
  assert_true(f3[0] == 12.5f && f3[1] == 0.25f && fabsf(f3[2] - 1) < 1e-6f);
  float norms[4] = {1, 3, 1, 3}, vars[4] = {2, 2, 2, 2}, f7[7];
  ferry_predictor_features_mlp7(norms, vars, 4, 1000, 515, f7);
  assert_true(f7[0] == 2 && f7[1] == 1 && f7[2] == 2 && f7[3] == 0);
  assert_true(fabsf(f7[5] - (float)(log(2.0) / log(1.0 + FERRY_MLP_MAX_SEQ))) < 1e-6f);
  assert_true(fabsf(f7[6] - 3.0f / 512) < 1e-7f);
  ferry_predictor_features_derived(FERRY_PREDICTOR_MLP3, 0, 100, f3);
  assert_true(f3[1] == 0 && f3[0] > 0 && f3[2] > f3[0]);
}

static void test_cli(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("predict");
  char args[2048], *out = NULL;
  snprintf(args, sizeof args,
           "trace routing --synth layers=4,experts=16,k=2,zipf=1.2,temporal=0.3,layer=0.5,seed=5 --requests 4 "
           "--tokens 64 --out '%s/r.jsonl'",
           dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args,
             "predictor train --routing '%s/r.jsonl' --variant mlp3 --out '%s/p%d.safetensors' --epochs 3 --seed 4",
             dir, dir, i);
    assert_int_equal(tu_run_ferry(args, &out), 0);
    assert_true(tu_contains(out, "only token position and sequence length"));
    assert_true(tu_contains(out, "epoch 3"));
    free(out);
  }
  char *p0 = ferry__asprintf("%s/p0.safetensors", dir), *p1 = ferry__asprintf("%s/p1.safetensors", dir);
  char *b0, *b1;
  size_t l0, l1;
  assert_int_equal(ferry__read_file(p0, 1 << 24, &b0, &l0, NULL), FERRY_OK);
  assert_int_equal(ferry__read_file(p1, 1 << 24, &b1, &l1, NULL), FERRY_OK);
  assert_int_equal(l0, l1);
  assert_memory_equal(b0, b1, l0);
  ferry_free(b0);
  ferry_free(b1);
  snprintf(args, sizeof args, "predictor eval --routing '%s/r.jsonl' --variant mlp3 --model '%s' --cache-slots 12",
           dir, p0);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "recall") && tu_contains(out, "weights        fp16"));
  free(out);
  snprintf(args, sizeof args,
           "predictor train --routing '%s/r.jsonl' --variant mlp7 --out '%s/q.safetensors' --epochs 2 "
           "--predictor-dtype int8",
           dir, dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "predictor eval --routing '%s/r.jsonl' --variant mlp7 --model '%s/q.safetensors'", dir,
           dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "weights        int8"));
  free(out);
  /* Wrong variant for the file. */
  snprintf(args, sizeof args, "predictor eval --routing '%s/r.jsonl' --variant mlp7 --model '%s'", dir, p0);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "not a mlp7 predictor"));
  free(out);
  snprintf(args, sizeof args, "predictor eval --routing '%s/r.jsonl' --variant oracle --prefetch-depth 2", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "recall         1.0000"));
  free(out);
  snprintf(args, sizeof args, "predictor train --routing '%s/r.jsonl' --variant lru --out x", dir);
  assert_int_equal(tu_run_ferry(args, &out), 2);
  free(out);
  ferry_free(p0);
  ferry_free(p1);
  tu_rmtree(dir);
  free(dir);
}

/* `ferry run --record-routing --record-features`: the trace carries each token's features, a
 * predictor trained on it uses them, and run and sim accept that predictor. */
static void test_record_features_cli(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("features");
  char args[2048], *out = NULL;
  snprintf(args, sizeof args, "model gen --preset tiny-moe --dtype fp32 --out '%s/m'", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args,
           "run --model '%s/m' --synthetic rate=50,n=3,prompt=8,output=4 --record-routing '%s/r.jsonl' "
           "--record-features mlp3 --quiet",
           dir, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  free(out);
  snprintf(args, sizeof args, "%s/r.jsonl", dir);
  ferry_routing *r = NULL;
  assert_int_equal(ferry_routing_open(&r, args, NULL), FERRY_OK);
  assert_int_equal(ferry_routing_n_features(r), FERRY_MLP3_FEATURES);
  const float *f = ferry_routing_token_features(r, 0, 0);
  assert_non_null(f);
  assert_true(f[0] > 0 && f[1] >= 0 && f[2] > 0);
  ferry_routing_free(r);
  snprintf(args, sizeof args, "predictor train --routing '%s/r.jsonl' --variant mlp3 --out '%s/p.safetensors' --epochs 2",
           dir, dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_false(tu_contains(out, "have no recorded"));
  free(out);
  snprintf(args, sizeof args,
           "run --model '%s/m' --synthetic rate=50,n=3,prompt=8,output=4 --predictor mlp3 --predictor-model "
           "'%s/p.safetensors' --block-layers 1 --device-budget 4MiB --quiet",
           dir, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  assert_true(tu_contains(out, "requests: 3 done"));
  free(out);
  snprintf(args, sizeof args,
           "sim --model '%s/m' --hw h100-pcie --synthetic rate=50,n=3,prompt=8,output=4 --routing '%s/r.jsonl' "
           "--predictor mlp3 --predictor-model '%s/p.safetensors' --predictor-routing '%s/r.jsonl' --device-budget 4MiB "
           "--quiet",
           dir, dir, dir, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  assert_true(tu_contains(out, "requests: 3 done"));
  free(out);
  /* a variant that does not exist, and features without a trace to put them in */
  snprintf(args, sizeof args, "run --model '%s/m' --synthetic rate=50,n=1,prompt=4,output=2 --record-features mlp4 "
           "--record-routing '%s/x.jsonl'", dir, dir);
  assert_int_equal(tu_run_ferry(args, &out), 2); /* a usage error, found before anything opens */
  assert_true(tu_contains(out, "mlp4"));
  free(out);
  snprintf(args, sizeof args, "run --model '%s/m' --synthetic rate=50,n=1,prompt=4,output=2 --record-features mlp3", dir);
  assert_int_equal(tu_run_ferry(args, &out), 2);
  assert_true(tu_contains(out, "--record-features"));
  assert_true(tu_contains(out, "--record-routing"));
  free(out);
  tu_rmtree(dir);
  free(dir);
}

/* The line of ferry's summary that starts with `prefix` (copied into out), or fail. */
static void summary_line(const char *text, const char *prefix, char *out, size_t len) {
  const char *p = strstr(text, prefix);
  if (!p) fail_msg("no '%s' in: %s", prefix, text);
  size_t n = strcspn(p, "\n");
  snprintf(out, len, "%.*s", (int)n, p);
}

/* Gate lookahead recorded by a real run and replayed by the simulator: with every request in
 * the first step (so both build the same batches) the simulated expert cache makes exactly the
 * real run's hits, misses and prefetches; the current-layer proxy does not. */
static void test_lookahead_replay_cli(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("replay");
  char args[2048], *out = NULL;
  snprintf(args, sizeof args, "model gen --preset tiny-moe --dtype fp32 --out '%s/m'", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  char common[1024];
  snprintf(common, sizeof common,
           "--model '%s/m' --synthetic rate=50,n=3,prompt=8,output=6 --as-fast-as-possible --block-layers 1 "
           "--prefetch-depth 1 --device-budget 3MiB --quiet --predictor gate-lookahead",
           dir);
  snprintf(args, sizeof args, "run %s --record-routing '%s/r.jsonl'", common, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  char real_cache[256], real_prefetch[256];
  summary_line(out, "expert cache:", real_cache, sizeof real_cache);
  summary_line(out, "expert prefetch:", real_prefetch, sizeof real_prefetch);
  free(out);
  snprintf(args, sizeof args, "%s/r.jsonl", dir);
  ferry_routing *r = NULL;
  assert_int_equal(ferry_routing_open(&r, args, NULL), FERRY_OK);
  assert_non_null(ferry_routing_lookahead(r, 0, 0, 0, 1));
  assert_null(ferry_routing_lookahead(r, 0, 0, ferry_routing_n_layers(r) - 1, 1));
  ferry_routing_free(r);
  snprintf(args, sizeof args, "sim %s --hw h100-pcie --routing '%s/r.jsonl' --predictor-routing '%s/r.jsonl'", common,
           dir, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  char sim_cache[256], sim_prefetch[256];
  summary_line(out, "expert cache:", sim_cache, sizeof sim_cache);
  summary_line(out, "expert prefetch:", sim_prefetch, sizeof sim_prefetch);
  free(out);
  assert_string_equal(sim_cache, real_cache);
  assert_string_equal(sim_prefetch, real_prefetch);
  snprintf(args, sizeof args, "sim %s --hw h100-pcie --routing '%s/r.jsonl'", common, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
  summary_line(out, "expert prefetch:", sim_prefetch, sizeof sim_prefetch);
  free(out);
  assert_string_not_equal(sim_prefetch, real_prefetch);
  /* ferry predictor eval replays the recorded choices too: every prediction, and recall differs
   * from the proxy's on a trace without them */
  snprintf(args, sizeof args, "predictor eval --routing '%s/r.jsonl' --variant gate-lookahead --cache-slots 8", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  char recall_line[256], look_line[256];
  summary_line(out, "recall ", recall_line, sizeof recall_line);
  summary_line(out, "lookahead ", look_line, sizeof look_line);
  long long replayed = -1, predictions = -2;
  assert_int_equal(sscanf(look_line, "lookahead %lld of %lld", &replayed, &predictions), 2);
  assert_true(replayed > 0);
  assert_int_equal(replayed, predictions);
  free(out);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_repeat_trace_recall), cmocka_unit_test(test_cache_accounting),
      cmocka_unit_test(test_predict_rules),       cmocka_unit_test(test_mlp_training),
      cmocka_unit_test(test_features),            cmocka_unit_test(test_cli),
      cmocka_unit_test(test_weights_dtype),
      cmocka_unit_test(test_record_features_cli),
      cmocka_unit_test(test_lookahead_replay_cli),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
