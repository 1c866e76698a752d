/* Routing traces: JSONL reading of a valid file (values, features, gaps), write/read round
 * trip, the malformed-row corpus with line numbers, statistics on a trace with known reuse
 * distances, the record hook, the synthetic model's determinism and knobs (skew, temporal
 * re-use, layer repetition), the replay source, and `ferry trace routing`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "ferry/routing.h"
#include "testutil.h"

static ferry_routing *open_data(const char *name, const struct ferry_routing_options *o) {
  char *p = tu_data_path(name);
  ferry_routing *r = NULL;
  ferry_status st = ferry_routing_open(&r, p, o);
  if (st != FERRY_OK) fprintf(stderr, "open %s: %s\n", p, ferry_last_error());
  assert_int_equal(st, FERRY_OK);
  free(p);
  return r;
}

static void test_read_good(void **state) {
  (void)state;
  ferry_routing *r = open_data("routing/good.jsonl", NULL);
  assert_int_equal(ferry_routing_n_layers(r), 2);
  assert_int_equal(ferry_routing_n_experts(r), 4);
  assert_int_equal(ferry_routing_top_k(r), 2);
  assert_int_equal(ferry_routing_n_features(r), 3);
  assert_int_equal(ferry_routing_n_requests(r), 2);
  assert_int_equal(ferry_routing_n_rows(r), 6);
  const int32_t *ids;
  const float *w;
  assert_true(ferry_routing_lookup(r, 7, 1, 1, &ids, &w));
  assert_int_equal(ids[0], 3);
  assert_int_equal(ids[1], 0);
  assert_true(w[0] == 0.75f && w[1] == 0.25f);
  assert_true(ferry_routing_lookup(r, -2, 2, 1, &ids, &w));
  assert_int_equal(ids[0], 2);
  assert_true(w[0] == 0.3333333f);
  assert_false(ferry_routing_lookup(r, -2, 1, 0, NULL, NULL)); /* gap */
  assert_false(ferry_routing_lookup(r, 8, 0, 0, NULL, NULL));
  assert_false(ferry_routing_lookup(r, 7, 0, 2, NULL, NULL));
  assert_false(ferry_routing_lookup(r, 7, 5, 0, NULL, NULL));
  struct ferry_routing_request q;
  assert_int_equal(ferry_routing_request_at(r, 0, &q), FERRY_OK);
  assert_int_equal(q.req_id, -2); /* sorted by id */
  assert_int_equal(q.n_tokens, 3);
  assert_int_equal(q.ids[1 * 2 * 2], -1);
  assert_true(q.has_features[2] && !q.has_features[0]);
  assert_true(q.features[2 * 3] == 2.0f && q.features[2 * 3 + 2] == 0.1f);
  assert_int_equal(ferry_routing_request_at(r, 1, &q), FERRY_OK);
  assert_true(q.has_features[0] && !q.has_features[1]);
  assert_true(q.features[1] == 0.25f);
  assert_int_equal(ferry_routing_request_at(r, 2, &q), FERRY_ERR_RANGE);
  ferry_routing_free(r);

  /* Bounds given: a tighter expert bound than the ids fails, a looser one widens. */
  struct ferry_routing_options o = {.n_experts = 16, .n_layers = 4};
  r = open_data("routing/good.jsonl", &o);
  assert_int_equal(ferry_routing_n_experts(r), 16);
  assert_int_equal(ferry_routing_n_layers(r), 4);
  ferry_routing_free(r);
  o.n_experts = 3;
  char *p = tu_data_path("routing/good.jsonl");
  assert_int_equal(ferry_routing_open(&r, p, &o), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "good.jsonl:1:"));
  free(p);
}

/* vLLM's routed-experts responses: prompt and generated tokens of each choice become one
 * request; weights are 1/k (vLLM returns ids only). */
static void test_read_vllm(void **state) {
  (void)state;
  ferry_routing *r = open_data("routing/vllm_responses.jsonl", NULL);
  assert_int_equal(ferry_routing_n_layers(r), 2);
  assert_int_equal(ferry_routing_top_k(r), 2);
  assert_int_equal(ferry_routing_n_experts(r), 6);
  assert_int_equal(ferry_routing_n_requests(r), 3);
  assert_int_equal(ferry_routing_n_rows(r), (3 + 4 + 3) * 2);
  const int32_t *ids;
  const float *w;
  assert_true(ferry_routing_lookup(r, 1, 3, 0, &ids, &w)); /* choice 1, its second generated token */
  assert_int_equal(ids[0], 4);
  assert_int_equal(ids[1], 0);
  assert_true(w[0] == 0.5f && w[1] == 0.5f);
  assert_true(ferry_routing_lookup(r, 1, 1, 1, &ids, NULL)); /* the prompt is shared by both choices */
  assert_int_equal(ids[0], 2);
  assert_true(ferry_routing_lookup(r, 2, 2, 1, &ids, NULL));
  assert_int_equal(ids[0], 2);
  ferry_routing_free(r);
  char *p = tu_data_path("routing/vllm_ragged.jsonl");
  assert_int_equal(ferry_routing_open(&r, p, NULL), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "vllm_ragged.jsonl:2:"));
  assert_true(tu_contains(ferry_last_error(), "has 1 layers, expected 2 as on line 1"));
  free(p);
}

static void test_round_trip(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("routing");
  char *a = ferry__path_join(dir, "a.jsonl"), *b = ferry__path_join(dir, "b.jsonl");
  ferry_routing *r = open_data("routing/good.jsonl", NULL);
  assert_int_equal(ferry_routing_write_jsonl(r, a), FERRY_OK);
  ferry_routing *r2 = NULL;
  assert_int_equal(ferry_routing_open(&r2, a, NULL), FERRY_OK);
  assert_int_equal(ferry_routing_write_jsonl(r2, b), FERRY_OK);
  char *ta, *tb;
  size_t la, lb;
  assert_int_equal(ferry__read_file(a, 1 << 20, &ta, &la, NULL), FERRY_OK);
  assert_int_equal(ferry__read_file(b, 1 << 20, &tb, &lb, NULL), FERRY_OK);
  assert_int_equal(la, lb);
  assert_memory_equal(ta, tb, la);
  assert_int_equal(ferry_routing_n_rows(r2), 6);
  assert_int_equal(ferry_routing_n_features(r2), 3);
  for (size_t i = 0; i < 2; i++) {
    struct ferry_routing_request x, y;
    ferry_routing_request_at(r, i, &x);
    ferry_routing_request_at(r2, i, &y);
    assert_int_equal(x.req_id, y.req_id);
    assert_int_equal(x.n_tokens, y.n_tokens);
    assert_memory_equal(x.ids, y.ids, (size_t)x.n_tokens * 2 * 2 * sizeof(int32_t));
    assert_memory_equal(x.weights, y.weights, (size_t)x.n_tokens * 2 * 2 * sizeof(float));
    assert_memory_equal(x.has_features, y.has_features, (size_t)x.n_tokens);
    for (int32_t t = 0; t < x.n_tokens; t++)
      if (x.has_features[t]) assert_memory_equal(x.features + t * 3, y.features + t * 3, 3 * sizeof(float));
  }
  ferry_free(ta);
  ferry_free(tb);
  ferry_routing_free(r);
  ferry_routing_free(r2);
  ferry_free(a);
  ferry_free(b);
  tu_rmtree(dir);
  free(dir);
}

static void test_malformed(void **state) {
  (void)state;
  static const struct {
    const char *file, *where, *what;
  } cases[] = {
      {"bad_json.jsonl", ":2:", "invalid JSON"},
      {"missing_layer.jsonl", ":3:", "missing \"layer\""},
      {"id_out_of_range.jsonl", ":2:", "not an expert id in [0, 8)"},
      {"negative_id.jsonl", ":1:", "\"topk_ids\"[0] is not an expert id"},
      {"repeated_id.jsonl", ":2:", "chosen twice"},
      {"topk_mismatch.jsonl", ":3:", "has 3 entries, expected 2 as on line 1"},
      {"weights_length.jsonl", ":2:", "\"topk_weights\" has 1 entries"},
      {"duplicate_row.jsonl", ":4:", "first on line 2"},
      {"features_count.jsonl", ":2:", "\"features\" has 2 entries, expected 3"},
      {"features_differ.jsonl", ":3:", "differ from those of the same token on line 1"},
      {"negative_token.jsonl", ":1:", "\"token_idx\" is not an integer"},
      {"not_object.jsonl", ":2:", "not a JSON object"},
      {"weight_not_number.jsonl", ":1:", "\"topk_weights\"[0] is not a finite number"},
      {"too_sparse.jsonl", "too_sparse.jsonl:", "too sparse"},
      {"empty.jsonl", "empty.jsonl:", "no routing rows"},
      {"trailing_data.jsonl", ":1:", "unexpected data after the JSON object"},
      {"fractional_req.jsonl", ":1:", "\"req_id\" is not an integer"},
      {"empty_topk.jsonl", ":1:", "has 0 entries"},
      {"lookahead_not_nested.jsonl", ":2:", "\"lookahead\"[0] is not an array of 2 expert ids"},
      {"lookahead_length.jsonl", ":1:", "\"lookahead\"[0] is not an array of 2 expert ids"},
      {"lookahead_past_last_layer.jsonl", ":2:", "lookahead from layer 1 to layer 2: the trace has 2 layers"},
      {"lookahead_repeated_id.jsonl", ":1:", "\"lookahead\"[1][1]: expert 1 is chosen twice"},
      {"lookahead_too_far.jsonl", ":1:", "\"lookahead\" has 5 entries, expected 1 to 4"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char name[128];
    snprintf(name, sizeof name, "routing/%s", cases[i].file);
    char *p = tu_data_path(name);
    ferry_routing *r = (ferry_routing *)1;
    struct ferry_routing_options o = {.n_experts = strstr(cases[i].file, "out_of_range") ? 8 : 0};
    ferry_status st = ferry_routing_open(&r, p, &o);
    const char *msg = ferry_last_error();
    if (st != FERRY_ERR_FORMAT || !tu_contains(msg, cases[i].where) || !tu_contains(msg, cases[i].what))
      fprintf(stderr, "case %s: status %d, message '%s'\n", cases[i].file, st, msg);
    assert_int_equal(st, FERRY_ERR_FORMAT);
    assert_null(r);
    assert_true(tu_contains(msg, cases[i].file));
    assert_true(tu_contains(msg, cases[i].where));
    assert_true(tu_contains(msg, cases[i].what));
    free(p);
  }
  ferry_routing *r;
  assert_int_equal(ferry_routing_open(&r, "/nonexistent/routing.jsonl", NULL), FERRY_ERR_NOT_FOUND);
}

static void test_stats_known(void **state) {
  (void)state;
  /* One request, top-1 over 4 experts. Layer 0: 0 1 0 0 2 1 (reuse distances 2, 1, 4);
   * layer 1: 0 1 0 3 3 3 (distances 2, 1, 1). */
  ferry_routing *r;
  assert_int_equal(ferry_routing_create(&r, 2, 4, 1), FERRY_OK);
  const int32_t seq[6] = {0, 1, 0, 0, 2, 1};
  for (int32_t t = 0; t < 6; t++) {
    assert_int_equal(ferry_routing_add(r, 5, t, 0, 1, &seq[t], NULL, 0, NULL), FERRY_OK);
    int32_t next = t < 3 ? seq[t] : 3; /* layer 1 repeats layer 0 for the first 3 tokens */
    assert_int_equal(ferry_routing_add(r, 5, t, 1, 1, &next, NULL, 0, NULL), FERRY_OK);
  }
  int32_t bad = 4;
  assert_int_equal(ferry_routing_add(r, 5, 0, 0, 1, &bad, NULL, 0, NULL), FERRY_ERR_RANGE);
  assert_int_equal(ferry_routing_add(r, 5, 0, 2, 1, &seq[0], NULL, 0, NULL), FERRY_ERR_RANGE);
  struct ferry_routing_stats s;
  assert_int_equal(ferry_routing_stats_compute(r, &s), FERRY_OK);
  assert_int_equal(s.reuse_hist[0], 1 + 2); /* layer 0: one distance 1; layer 1: expert 3 at 3,4,5 */
  assert_int_equal(s.reuse_hist[1], 2); /* expert 0 at token 2, both layers */
  assert_int_equal(s.reuse_hist[2], 1);
  assert_int_equal(s.first_uses, 3 + 3);
  assert_true(fabs(s.reuse_mean - (2 + 1 + 4 + 2 + 1 + 1) / 6.0) < 1e-12);
  assert_int_equal(s.reuse_p50, 1);
  assert_int_equal(s.layers[0].uses, 6);
  assert_int_equal(s.layers[0].top_ids[0], 0);
  assert_true(fabs(s.layers[0].top_share[0] - 0.5) < 1e-12);
  assert_true(fabs(s.layers[0].top25_share - 0.5) < 1e-12);
  assert_true(fabs(s.layers[0].next_same - 0.5) < 1e-12);
  assert_true(isnan(s.layers[1].next_same));
  assert_true(fabs(s.layers[0].prev_token_same - 1 / 5.0) < 1e-12);
  assert_true(fabs(s.layers[1].prev_token_same - 2 / 5.0) < 1e-12);
  ferry_routing_stats_free(&s);
  assert_int_equal(ferry_routing_reuse_bucket_lo(2), 3);
  assert_int_equal(ferry_routing_reuse_bucket_lo(8), 129);
  ferry_routing_free(r);
}

/* The measures of published routing analyses on a hand-made trace (one request, two layers,
 * four experts, top-2, five tokens; values worked out by hand in the comments). */
static void test_stats_measures(void **state) {
  (void)state;
  ferry_routing *r;
  assert_int_equal(ferry_routing_create(&r, 2, 4, 2), FERRY_OK);
  /* layer 0 first choices 0 0 3 3 1, layer 1 first choices 2 2 1 1 0 */
  const int32_t l0[5][2] = {{0, 1}, {0, 2}, {3, 2}, {3, 1}, {1, 0}}, l1[5][2] = {{2, 3}, {2, 1}, {1, 0}, {1, 2}, {0, 3}};
  const float w[2] = {0.8f, 0.2f}, w_rev[2] = {0.2f, 0.8f};
  for (int32_t t = 0; t < 5; t++) {
    assert_int_equal(ferry_routing_add(r, 1, t, 0, 2, l0[t], w, 0, NULL), FERRY_OK);
    /* layer 1's rows list the first choice second: the first choice is the heavier weight */
    const int32_t swapped[2] = {l1[t][1], l1[t][0]};
    assert_int_equal(ferry_routing_add(r, 1, t, 1, 2, swapped, w_rev, 0, NULL), FERRY_OK);
  }
  struct ferry_routing_stats s;
  assert_int_equal(ferry_routing_stats_compute(r, &s), FERRY_OK);
  const struct ferry_routing_layer_stats *a = &s.layers[0], *b = &s.layers[1];
  assert_int_equal(a->token_pairs, 4);
  assert_true(fabs(a->first_repeat - 2 / 4.0) < 1e-12); /* t0-t1 and t2-t3 */
  assert_true(fabs(a->any_repeat - 1.0) < 1e-12);       /* every pair shares an expert */
  assert_true(fabs(a->first_repeat_indep - 0.36) < 1e-12); /* first choices 0:2, 3:2, 1:1 of 5 */
  assert_true(fabs(a->any_repeat_indep - 0.0) < 1e-12); /* tokens two apart share nothing */
  assert_true(fabs(a->busiest_share - 0.3) < 1e-12);    /* uses 3 3 2 2 */
  assert_true(fabs(a->load_cv - 0.2) < 1e-12);
  assert_true(fabs(a->next_first_acc - 1.0) < 1e-12);   /* 0 -> 2, 3 -> 1, 1 -> 0 every time */
  assert_true(fabs(a->next_first_base - 0.4) < 1e-12);
  assert_true(fabs(a->next_set_recall - 0.8) < 1e-12);
  assert_true(fabs(a->next_set_base - 0.6) < 1e-12);
  assert_true(fabs(a->coact_max - 2 / 3.0) < 1e-12);    /* experts 0 and 1 together 2 of 3 times */
  assert_true(isnan(a->request_spec_max));              /* the request is shorter than 32 tokens */
  assert_true(fabs(a->gate_top1_mean - 0.8) < 1e-6 && fabs(b->gate_top1_mean - 0.8) < 1e-6);
  assert_true(fabs(a->gate_last_mean - 0.2) < 1e-6);
  assert_true(fabs(a->gate_top1_p50 - 0.8) < 1e-3);
  assert_true(fabs(b->first_repeat - 2 / 4.0) < 1e-12); /* 2 2 1 1 0 */
  assert_true(isnan(b->next_first_acc));
  assert_true(fabs(s.first_repeat_uniform - 0.25) < 1e-12);
  assert_true(fabs(s.any_repeat_uniform - (1 - 1 / 6.0)) < 1e-12); /* 1 - C(2,2)/C(4,2) */
  char *json = NULL;
  assert_int_equal(ferry_routing_stats_json(r, &s, "hand", &json), FERRY_OK);
  assert_true(tu_contains(json, "\"source\":\"hand\""));
  assert_true(tu_contains(json, "\"next_first_acc\":null")); /* layer 1 has no next layer */
  assert_true(tu_contains(json, "\"first_repeat\":0.5"));
  ferry_free(json);
  ferry_routing_stats_free(&s);
  ferry_routing_free(r);
}

static void test_record_hook(void **state) {
  (void)state;
  ferry_routing *r;
  assert_int_equal(ferry_routing_create(&r, 2, 8, 2), FERRY_OK);
  int32_t ids[2] = {3, 5};
  float w[2] = {0.7f, 0.3f};
  const float feat[3] = {12.5f, 0.25f, 0.5f};
  ferry_routing_record(r, 1, 0, 1, 2, ids, w, 3, feat);
  assert_int_equal(ferry_routing_record_status(r), FERRY_OK);
  assert_int_equal(ferry_routing_n_rows(r), 1);
  /* the token's features are kept with it */
  assert_int_equal(ferry_routing_n_features(r), 3);
  struct ferry_routing_request rq;
  assert_int_equal(ferry_routing_request_at(r, 0, &rq), FERRY_OK);
  assert_non_null(rq.features);
  assert_true(rq.has_features[0]);
  assert_memory_equal(rq.features, feat, sizeof feat);
  const float *looked = ferry_routing_token_features(r, 1, 0);
  assert_non_null(looked);
  assert_memory_equal(looked, feat, sizeof feat);
  assert_null(ferry_routing_token_features(r, 1, 5));
  assert_null(ferry_routing_token_features(r, 2, 0));
  ids[1] = 3; /* repeated: the first failure sticks, later calls are ignored */
  ferry_routing_record(r, 1, 1, 1, 2, ids, w, 0, NULL);
  assert_int_equal(ferry_routing_record_status(r), FERRY_ERR_INVALID);
  ids[1] = 4;
  ferry_routing_record(r, 1, 2, 1, 2, ids, w, 0, NULL);
  assert_int_equal(ferry_routing_n_rows(r), 1);
  ferry_routing_free(r);
}

/* Recorded lookahead choices: the API's checks, and a write/read round trip. */
static void test_lookahead(void **state) {
  (void)state;
  ferry_routing *r;
  assert_int_equal(ferry_routing_create(&r, 3, 8, 2), FERRY_OK);
  const int32_t ids[2] = {3, 5}, look1[2] = {6, 2}, look2[2] = {1, 7}, twice[2] = {4, 4}, far[2] = {0, 8};
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 0, 1, 2, look1), FERRY_ERR_NOT_FOUND); /* no row yet */
  assert_int_equal(ferry_routing_add(r, 1, 0, 0, 2, ids, NULL, 0, NULL), FERRY_OK);
  assert_int_equal(ferry_routing_add(r, 1, 0, 2, 2, ids, NULL, 0, NULL), FERRY_OK);
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 0, 1, 2, look1), FERRY_OK);
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 0, 2, 2, look2), FERRY_OK);
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 0, 0, 2, look1), FERRY_ERR_RANGE);
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 0, 3, 2, look1), FERRY_ERR_RANGE); /* layer 3 of 3 */
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 2, 1, 2, look1), FERRY_ERR_RANGE); /* from the last layer */
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 0, 1, 2, twice), FERRY_ERR_INVALID);
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 0, 1, 2, far), FERRY_ERR_RANGE);
  assert_int_equal(ferry_routing_set_lookahead(r, 1, 0, 0, 1, 1, look1), FERRY_ERR_INVALID);
  assert_memory_equal(ferry_routing_lookahead(r, 1, 0, 0, 1), look1, sizeof look1);
  assert_memory_equal(ferry_routing_lookahead(r, 1, 0, 0, 2), look2, sizeof look2);
  assert_null(ferry_routing_lookahead(r, 1, 0, 2, 1));
  assert_null(ferry_routing_lookahead(r, 1, 0, 0, 3));
  assert_null(ferry_routing_lookahead(r, 2, 0, 0, 1));
  /* the choices survive writing and reading, and a token added later keeps them */
  assert_int_equal(ferry_routing_add(r, 1, 200, 0, 2, ids, NULL, 0, NULL), FERRY_OK);
  assert_memory_equal(ferry_routing_lookahead(r, 1, 0, 0, 2), look2, sizeof look2);
  char *dir = tu_mkdtemp("lookahead");
  char path[512];
  snprintf(path, sizeof path, "%s/l.jsonl", dir);
  assert_int_equal(ferry_routing_write_jsonl(r, path), FERRY_OK);
  ferry_routing *back = NULL;
  struct ferry_routing_options o = {.n_layers = 3, .n_experts = 8};
  assert_int_equal(ferry_routing_open(&back, path, &o), FERRY_OK);
  assert_memory_equal(ferry_routing_lookahead(back, 1, 0, 0, 1), look1, sizeof look1);
  assert_memory_equal(ferry_routing_lookahead(back, 1, 0, 0, 2), look2, sizeof look2);
  assert_null(ferry_routing_lookahead(back, 1, 0, 2, 1));
  assert_null(ferry_routing_lookahead(back, 1, 200, 0, 1));
  ferry_routing_free(back);
  ferry_routing_free(r);
  tu_rmtree(dir);
  free(dir);
}

/* ---- synthetic model ---------------------------------------------------------------------- */

static ferry_routing_synth *make_synth(int32_t L, int32_t E, int32_t K, double zipf, double temporal, double layer,
                                       uint64_t seed) {
  struct ferry_routing_synth_config c = {.n_layers = L, .n_experts = E, .top_k = K, .seed = seed, .zipf = zipf,
                                         .temporal = temporal, .layer_corr = layer};
  ferry_routing_synth *s = NULL;
  assert_int_equal(ferry_routing_synth_create(&s, &c), FERRY_OK);
  return s;
}

static void test_synth_deterministic(void **state) {
  (void)state;
  ferry_routing_synth *s = make_synth(6, 16, 2, 1.0, 0.5, 0.5, 42);
  enum { R = 3, T = 40, L = 6, K = 2 };
  static int32_t fwd[R][T][L][K], rev[R][T][L][K];
  float w[K];
  for (int r = 0; r < R; r++)
    for (int t = 0; t < T; t++)
      for (int l = 0; l < L; l++) {
        ferry_routing_synth_fn(s, r, t, l, K, 16, fwd[r][t][l], w);
        assert_true(fabsf(w[0] + w[1] - 1) < 1e-6f && w[0] >= w[1]);
        assert_true(fwd[r][t][l][0] != fwd[r][t][l][1]);
      }
  ferry_routing_synth *s2 = make_synth(6, 16, 2, 1.0, 0.5, 0.5, 42);
  for (int r = R - 1; r >= 0; r--)
    for (int t = T - 1; t >= 0; t--)
      for (int l = L - 1; l >= 0; l--) ferry_routing_synth_fn(s2, r, t, l, K, 16, rev[r][t][l], w);
  assert_memory_equal(fwd, rev, sizeof fwd);
  ferry_routing_synth *s3 = make_synth(6, 16, 2, 1.0, 0.5, 0.5, 43);
  int differ = 0;
  for (int t = 0; t < T; t++) {
    int32_t ids[K];
    ferry_routing_synth_fn(s3, 0, t, 0, K, 16, ids, w);
    differ |= ids[0] != fwd[0][t][0][0] || ids[1] != fwd[0][t][0][1];
  }
  assert_true(differ);
  /* A shape the model was not made for: a uniform choice, counted. */
  int32_t ids[3];
  float w3[3];
  ferry_routing_synth_fn(s, 0, 0, 0, 3, 16, ids, w3);
  ferry_routing_synth_fn(s, 0, 0, 9, 2, 16, ids, w3);
  assert_int_equal(ferry_routing_synth_mismatches(s), 2);
  assert_int_equal(ferry_routing_synth_mismatches(s2), 0);
  ferry_routing_synth_free(s);
  ferry_routing_synth_free(s2);
  ferry_routing_synth_free(s3);
}

/* Top-k of 3 and more under heavy skew: every redraw path runs (a repeat once read perm[-1]),
 * and the k ids stay distinct and in range. */
static void test_synth_many_choices(void **state) {
  (void)state;
  static const int32_t shapes[][2] = {{64, 8}, {60, 4}, {8, 3}, {8, 8}};
  for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
    const int32_t E = shapes[c][0], K = shapes[c][1];
    ferry_routing_synth *s = make_synth(3, E, K, 4.0, 0.2, 0.2, 77 + c);
    int32_t ids[8];
    float w[8];
    for (int t = 0; t < 300; t++)
      for (int l = 0; l < 3; l++) {
        ferry_routing_synth_fn(s, t % 5, t, l, K, E, ids, w);
        for (int32_t i = 0; i < K; i++) {
          assert_true(ids[i] >= 0 && ids[i] < E);
          for (int32_t j = 0; j < i; j++) assert_true(ids[i] != ids[j]);
        }
      }
    assert_int_equal(ferry_routing_synth_mismatches(s), 0);
    ferry_routing_synth_free(s);
  }
}

static void synth_stats(ferry_routing_synth *s, struct ferry_routing_stats *st) {
  ferry_routing *r;
  assert_int_equal(ferry_routing_synth_trace(s, 16, 256, &r), FERRY_OK);
  assert_int_equal(ferry_routing_stats_compute(r, st), FERRY_OK);
  ferry_routing_free(r);
}

/* The many-token routing source answers what the per-token one does, for every token (with the
 * repeats a top-2 over few experts draws again, a skewed popularity, several k, and the knobs
 * that copy or force choices), weights included. */
static void test_synth_many_equals_one(void **state) {
  (void)state;
  const struct {
    int32_t experts, k;
    double zipf, temporal, layer;
    int32_t domains;
  } cases[] = {{4, 2, 0, 0, 0, 0}, {8, 2, 0, 0, 0, 0}, {8, 2, 1.5, 0, 0, 0}, {16, 3, 0.8, 0, 0, 0},
               {64, 6, 1.2, 0, 0, 0}, {8, 2, 0, 0.3, 0.4, 0}, {32, 4, 1.0, 0, 0, 3}, {2, 2, 0, 0, 0, 0},
               {7, 2, 0.9, 0, 0, 0}, {16, 2, 1.1, 0, 0, 0}};
  enum { L = 5, N = 300 };
  int64_t req[N];
  int32_t tok[N];
  /* ids with high bits too (the hashes' multiplies) */
  for (int i = 0; i < N; i++)
    req[i] = 7 + i / 37 + (i % 2 ? (int64_t)1 << 41 : 0), tok[i] = (i * 13) % 211 + (i % 3 ? 0 : 1 << 20);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    struct ferry_routing_synth_config sc = {.n_layers = L, .n_experts = cases[c].experts, .top_k = cases[c].k,
                                            .zipf = cases[c].zipf, .temporal = cases[c].temporal,
                                            .layer_corr = cases[c].layer, .domains = cases[c].domains,
                                            .domain_zipf = 1.0, .domain_mix = 0.5, .seed = 11};
    ferry_routing_synth *s = NULL;
    assert_int_equal(ferry_routing_synth_create(&s, &sc), FERRY_OK);
    const int32_t k = cases[c].k;
    int32_t *many = calloc((size_t)N * k, sizeof *many), one[64];
    float *wmany = calloc((size_t)N * k, sizeof *wmany), wone[64];
    assert_non_null(many);
    assert_non_null(wmany);
    for (int32_t l = 0; l < L; l++)
      for (int with_w = 0; with_w < 2; with_w++) {
        ferry_routing_synth_many(s, N, req, tok, l, k, cases[c].experts, many, with_w ? wmany : NULL);
        for (int i = 0; i < N; i++) {
          ferry_routing_synth_fn(s, req[i], tok[i], l, k, cases[c].experts, one, with_w ? wone : NULL);
          for (int32_t j = 0; j < k; j++) {
            assert_int_equal(many[i * k + j], one[j]);
            if (with_w) assert_true(wmany[i * k + j] == wone[j]);
          }
        }
      }
    free(many);
    free(wmany);
    ferry_routing_synth_free(s);
  }
}

static void test_synth_knobs(void **state) {
  (void)state;
  struct ferry_routing_stats st;
  /* Uniform: top quarter takes a quarter, entropy near 1, little agreement. */
  ferry_routing_synth *s = make_synth(4, 32, 2, 0, 0, 0, 1);
  synth_stats(s, &st);
  assert_true(fabs(st.top25_share - 0.25) < 0.02);
  assert_true(st.entropy_norm > 0.98);
  assert_true(st.prev_token_same < 0.01 && st.next_same < 0.01);
  ferry_routing_stats_free(&st);
  ferry_routing_synth_free(s);

  /* Zipf 1.2 with k = 1: the top quarter's share is exactly the Zipf mass of ranks 1..16. */
  s = make_synth(4, 64, 1, 1.2, 0, 0, 2);
  synth_stats(s, &st);
  double top = 0, all = 0;
  for (int r = 1; r <= 64; r++) {
    all += pow(r, -1.2);
    if (r <= 16) top += pow(r, -1.2);
  }
  assert_true(fabs(st.top25_share - top / all) < 0.02);
  assert_true(st.layers[0].top_ids[0] != st.layers[1].top_ids[0] || st.layers[1].top_ids[0] != st.layers[2].top_ids[0]);
  ferry_routing_stats_free(&st);
  ferry_routing_synth_free(s);

  /* Temporal re-use 0.4 alone. */
  s = make_synth(4, 32, 2, 0, 0.4, 0, 3);
  synth_stats(s, &st);
  assert_true(fabs(st.prev_token_same - 0.4) < 0.03);
  assert_true(st.next_same < 0.01);
  ferry_routing_stats_free(&st);
  ferry_routing_synth_free(s);

  /* Layer repetition 0.6 alone. */
  s = make_synth(4, 32, 2, 0, 0, 0.6, 4);
  synth_stats(s, &st);
  assert_true(fabs(st.next_same - 0.6) < 0.03);
  assert_true(st.prev_token_same < 0.01);
  ferry_routing_stats_free(&st);
  ferry_routing_synth_free(s);
}

static void test_synth_parse(void **state) {
  (void)state;
  struct ferry_routing_synth_config c = {.n_layers = 2, .n_experts = 8, .top_k = 2};
  assert_int_equal(ferry_routing_synth_parse("layers=12,experts=64,k=4,zipf=1.5,temporal=0.2,layer=0.7,seed=9", &c),
                   FERRY_OK);
  assert_int_equal(c.n_layers, 12);
  assert_int_equal(c.n_experts, 64);
  assert_int_equal(c.top_k, 4);
  assert_true(c.zipf == 1.5 && c.temporal == 0.2 && c.layer_corr == 0.7 && c.seed == 9);
  assert_int_equal(ferry_routing_synth_parse("temporal=1.5", &c), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "temporal=1.5"));
  assert_int_equal(ferry_routing_synth_parse("colour=red", &c), FERRY_ERR_INVALID);
  assert_int_equal(ferry_routing_synth_parse("layers", &c), FERRY_ERR_INVALID);
  c.top_k = 65;
  ferry_routing_synth *s;
  assert_int_equal(ferry_routing_synth_create(&s, &c), FERRY_ERR_INVALID);
}

static void test_replay(void **state) {
  (void)state;
  ferry_routing *r = open_data("routing/good.jsonl", NULL);
  ferry_routing_synth *fb = make_synth(2, 4, 2, 0, 0, 0, 5);
  ferry_routing_replay *rp;
  assert_int_equal(ferry_routing_replay_create(&rp, r, fb), FERRY_OK);
  int32_t ids[2];
  float w[2];
  ferry_routing_replay_fn(rp, 7, 1, 1, 2, 4, ids, w);
  assert_int_equal(ids[0], 3);
  assert_int_equal(ids[1], 0);
  assert_true(w[0] == 0.75f);
  ferry_routing_replay_fn(rp, -2, 1, 0, 2, 4, ids, w); /* gap: fallback */
  int32_t expect[2];
  float ew[2];
  ferry_routing_synth_fn(fb, -2, 1, 0, 2, 4, expect, ew);
  assert_memory_equal(ids, expect, sizeof ids);
  ferry_routing_replay_fn(rp, 7, 0, 0, 2, 4, ids, w);
  assert_int_equal(ferry_routing_replay_hits(rp), 2);
  assert_int_equal(ferry_routing_replay_misses(rp), 1);
  ferry_routing_replay_free(rp);
  ferry_routing_synth_free(fb);
  ferry_routing_free(r);
}

static void test_cli(void **state) {
  (void)state;
  char *p = tu_data_path("routing/good.jsonl");
  char args[1024], *out = NULL;
  snprintf(args, sizeof args, "trace routing '%s'", p);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "2 layers, 4 experts, top-2, 2 requests, 6 rows, 3 features"));
  assert_true(tu_contains(out, "reuse distance"));
  free(out);
  free(p);
  p = tu_data_path("routing/duplicate_row.jsonl");
  snprintf(args, sizeof args, "trace routing '%s'", p);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "ferry: ") && tu_contains(out, "duplicate_row.jsonl:4:"));
  free(out);
  free(p);
  assert_int_equal(tu_run_ferry("trace routing --synth layers=4,experts=16,k=2,zipf=1,seed=3 --tokens 32", &out), 0);
  assert_true(tu_contains(out, "4 layers, 16 experts, top-2, 8 requests"));
  free(out);
  assert_int_equal(tu_run_ferry("trace routing --synth zipf=-1", &out), 2);
  free(out);
  p = tu_data_path("routing/good.jsonl");
  snprintf(args, sizeof args, "trace routing stats '%s' --json", p);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "\"shape\":{\"layers\":2,\"experts\":4,\"top_k\":2"));
  assert_true(tu_contains(out, "\"any_repeat_uniform\""));
  free(out);
  free(p);
  assert_int_equal(tu_run_ferry("trace routing stats --synth profile=mixtral,layers=4 --tokens 64 --requests 2", &out), 0);
  assert_true(tu_contains(out, "4 layers, 8 experts, top-2, 2 requests")); /* the profile's shape, layers overridden */
  assert_true(tu_contains(out, "first choice repeated"));
  free(out);
  assert_int_equal(tu_run_ferry("trace routing --synth profile=switch", &out), 2);
  assert_true(tu_contains(out, "expected mixtral, olmoe, deepseek or uniform"));
  free(out);
  assert_int_equal(tu_run_ferry("trace routing --help", &out), 0);
  assert_true(tu_contains(out, "--synth SPEC"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_good),         cmocka_unit_test(test_read_vllm),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_malformed),         cmocka_unit_test(test_lookahead),
              cmocka_unit_test(test_stats_known),
      cmocka_unit_test(test_stats_measures),    cmocka_unit_test(test_record_hook),       cmocka_unit_test(test_synth_deterministic),
      cmocka_unit_test(test_synth_knobs),       cmocka_unit_test(test_synth_many_choices),       cmocka_unit_test(test_synth_parse),
      cmocka_unit_test(test_replay),            cmocka_unit_test(test_cli),
      cmocka_unit_test(test_synth_many_equals_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
