/* Fuzz target: a routing trace (JSONL, one row per request, token and layer). Invariants of an
 * accepted trace: bounds within the limits, every stored id below the expert count and distinct
 * within its set, rows counted once, lookups agree with the per-request view, statistics compute,
 * the trace reads again with its own bounds given explicitly, and the JSONL written for it reads
 * back to the same choices. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ferry/routing.h"
#include "tests/fuzz/fuzz.h"

static void check_trace(const ferry_routing *r) {
  const int32_t L = ferry_routing_n_layers(r), K = ferry_routing_top_k(r), E = ferry_routing_n_experts(r);
  FUZZ_CHECK(L >= 1 && L <= FERRY_ROUTING_MAX_LAYERS && E >= 1 && E <= FERRY_ROUTING_MAX_EXPERTS);
  FUZZ_CHECK(K >= 1 && K <= E && K <= FERRY_ROUTING_MAX_TOPK);
  const int32_t F = ferry_routing_n_features(r);
  FUZZ_CHECK(F >= 0 && F <= FERRY_ROUTING_MAX_FEATURES);
  int64_t rows = 0;
  for (size_t i = 0; i < ferry_routing_n_requests(r); i++) {
    struct ferry_routing_request q, prev;
    FUZZ_CHECK(ferry_routing_request_at(r, i, &q) == FERRY_OK);
    if (i > 0) FUZZ_CHECK(ferry_routing_request_at(r, i - 1, &prev) == FERRY_OK && prev.req_id < q.req_id);
    FUZZ_CHECK(q.n_tokens >= 1 && q.n_tokens <= FERRY_ROUTING_MAX_TOKEN_IDX + 1);
    for (int32_t t = 0; t < q.n_tokens; t++) {
      for (int32_t l = 0; l < L; l++) {
        const size_t cell = ((size_t)t * (size_t)L + (size_t)l) * (size_t)K;
        const int32_t *ids = q.ids + cell;
        const int32_t *lids;
        const float *lw;
        const int present = ids[0] != -1;
        FUZZ_CHECK(ferry_routing_lookup(r, q.req_id, t, l, &lids, &lw) == present);
        if (!present) continue;
        rows++;
        FUZZ_CHECK(lids == ids && lw == q.weights + cell);
        for (int32_t j = 0; j < K; j++) {
          FUZZ_CHECK(ids[j] >= 0 && ids[j] < E && isfinite(q.weights[cell + (size_t)j]));
          for (int32_t m = 0; m < j; m++) FUZZ_CHECK(ids[m] != ids[j]);
        }
        for (int32_t a = 1; q.lookahead && a <= FERRY_ROUTING_MAX_LOOKAHEAD; a++) {
          const int32_t *la = ferry_routing_lookahead(r, q.req_id, t, l, a);
          for (int32_t j = 0; la && j < K; j++) FUZZ_CHECK(la[j] >= 0 && la[j] < E && l + a < L);
        }
      }
      const float *f = ferry_routing_token_features(r, q.req_id, t);
      FUZZ_CHECK((f != NULL) == (F > 0 && q.has_features && q.has_features[t]));
    }
  }
  FUZZ_CHECK(rows == ferry_routing_n_rows(r));
  struct ferry_routing_request q;
  FUZZ_CHECK(ferry_routing_request_at(r, ferry_routing_n_requests(r), &q) == FERRY_ERR_RANGE);
  struct ferry_routing_stats s;
  FUZZ_CHECK(ferry_routing_stats_compute(r, &s) == FERRY_OK);
  FUZZ_CHECK(s.n_layers == L);
  int64_t uses = 0;
  for (int32_t l = 0; l < L; l++) uses += s.layers[l].uses;
  FUZZ_CHECK(uses == rows * K);
  ferry_routing_stats_free(&s);
}

/* two traces hold the same choices (ids, weights, features) */
static void check_same(const ferry_routing *a, const ferry_routing *b) {
  FUZZ_CHECK(ferry_routing_n_layers(a) == ferry_routing_n_layers(b) && ferry_routing_top_k(a) == ferry_routing_top_k(b));
  FUZZ_CHECK(ferry_routing_n_rows(a) == ferry_routing_n_rows(b) && ferry_routing_n_requests(a) == ferry_routing_n_requests(b));
  FUZZ_CHECK(ferry_routing_n_features(a) == ferry_routing_n_features(b));
  const size_t LK = (size_t)ferry_routing_n_layers(a) * (size_t)ferry_routing_top_k(a);
  for (size_t i = 0; i < ferry_routing_n_requests(a); i++) {
    struct ferry_routing_request x, y;
    FUZZ_CHECK(ferry_routing_request_at(a, i, &x) == FERRY_OK && ferry_routing_request_at(b, i, &y) == FERRY_OK);
    FUZZ_CHECK(x.req_id == y.req_id && x.n_tokens == y.n_tokens);
    FUZZ_CHECK(!memcmp(x.ids, y.ids, (size_t)x.n_tokens * LK * sizeof *x.ids));
    FUZZ_CHECK(!memcmp(x.weights, y.weights, (size_t)x.n_tokens * LK * sizeof *x.weights));
    for (int32_t t = 0; t < x.n_tokens; t++) {
      const float *fa = ferry_routing_token_features(a, x.req_id, t), *fb = ferry_routing_token_features(b, y.req_id, t);
      FUZZ_CHECK((fa == NULL) == (fb == NULL));
      FUZZ_CHECK(!fa || !memcmp(fa, fb, (size_t)ferry_routing_n_features(a) * sizeof *fa));
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *written = fuzz_write("routing.jsonl", data, size);
  if (!written) return 0;
  char path[256];
  snprintf(path, sizeof path, "%s", written);
  ferry_routing *r = NULL;
  if (ferry_routing_open(&r, path, NULL) != FERRY_OK) return 0;
  check_trace(r);
  /* the bounds it inferred, given explicitly, accept the same file */
  const struct ferry_routing_options bounds = {.n_experts = ferry_routing_n_experts(r), .n_layers = ferry_routing_n_layers(r)};
  ferry_routing *again = NULL;
  FUZZ_CHECK(ferry_routing_open(&again, path, &bounds) == FERRY_OK);
  check_same(r, again);
  ferry_routing_free(again);
  /* the JSONL written for it reads back the same */
  char out[256];
  snprintf(out, sizeof out, "%s/round-trip.jsonl", fuzz_dir());
  FUZZ_CHECK(ferry_routing_write_jsonl(r, out) == FERRY_OK);
  ferry_routing *back = NULL;
  FUZZ_CHECK(ferry_routing_open(&back, out, &bounds) == FERRY_OK);
  check_same(r, back);
  ferry_routing_free(back);
  ferry_routing_free(r);
  return 0;
}
