/* Offline evaluation of an expert predictor: replays recorded routing through the expert
 * cache of policy.h, prefetching what the predictor names `depth` layers ahead, and counts
 * recall, prefetch precision, wasted loads and demand misses (the stall proxy). Pure: the
 * routing arrives as arrays, so the same code serves the CLI and the tests. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "ferry/predict.h"
#include "runtime/policy/policy.h"

void ferry_predict_eval_result_free(struct ferry_predict_eval_result *r) {
  if (!r) return;
  ferry_free(r->layer_recall);
  ferry_free(r->per_request);
  r->layer_recall = NULL;
  r->per_request = NULL;
}

struct eval_state {
  const struct ferry_predict_eval_config *cfg;
  int32_t K, L, E, max;
  struct ferry_expert_cache cache;
  uint8_t *pf;             /* [slot] loaded by a prefetch and not used yet */
  int32_t *pending;        /* [layer][max] predicted ids for the current token */
  int32_t *pending_n;      /* [layer] */
  int32_t *pending_tok;    /* [layer] token the prediction is for, -1 none */
  int64_t *layer_correct, *layer_total;
  float *logits;           /* [E] */
  struct ferry_predict_eval_result *out;
  int64_t predicted_ids, predicted_hits;
};

static int contains(const int32_t *s, int32_t k, int32_t e) {
  for (int32_t i = 0; i < k; i++)
    if (s[i] == e) return 1;
  return 0;
}

/* Place (layer, expert) in a slot; a prefetched expert evicted before use is wasted. */
static int32_t load(struct eval_state *st, int32_t layer, int32_t e) {
  int32_t el, ee;
  int32_t slot = ferry__cache_insert(&st->cache, layer, e, &el, &ee);
  if (slot < 0) return -1;
  if (el >= 0 && st->pf[slot]) st->out->prefetch_unused++;
  st->pf[slot] = 0;
  ferry__cache_touch(&st->cache, slot);
  ferry__cache_protect(&st->cache, slot, 1);
  return slot;
}

static void demand(struct eval_state *st, int32_t l, const int32_t *s) {
  struct ferry_predict_eval_result *o = st->out;
  o->uses += st->K;
  if (st->cfg->cache_slots <= 0) { /* `none`: every use is fetched on demand */
    o->misses += st->K;
    return;
  }
  ferry__cache_unprotect_all(&st->cache);
  for (int32_t j = 0; j < st->K; j++) {
    int32_t slot = ferry__cache_lookup(&st->cache, l, s[j]);
    if (slot >= 0) {
      o->hits++;
      if (st->pf[slot]) o->prefetch_useful++;
      st->pf[slot] = 0;
      ferry__cache_touch(&st->cache, slot);
      ferry__cache_protect(&st->cache, slot, 1);
    } else {
      o->misses++;
      load(st, l, s[j]);
    }
  }
}

static void prefetch(struct eval_state *st, int32_t target, const int32_t *ids, int32_t n) {
  struct ferry_predict_eval_result *o = st->out;
  for (int32_t i = 0; i < n; i++) {
    int32_t slot = ferry__cache_lookup(&st->cache, target, ids[i]);
    if (slot >= 0) {
      ferry__cache_touch(&st->cache, slot);
      ferry__cache_protect(&st->cache, slot, 1);
      continue;
    }
    slot = load(st, target, ids[i]);
    if (slot < 0) {
      o->prefetch_dropped++;
      continue;
    }
    st->pf[slot] = 1;
    o->prefetch_loads++;
  }
}

static ferry_status run_request(struct eval_state *st, ferry_predictor *p, const struct ferry_predict_eval_request *rq,
                                int64_t req_index) {
  const struct ferry_predict_eval_config *cfg = st->cfg;
  int32_t K = st->K, L = st->L, E = st->E, D = cfg->prefetch_depth;
  enum ferry_predictor_kind kind = ferry_predictor_kind_of(p);
  int predicts = kind != FERRY_PREDICTOR_NONE && kind != FERRY_PREDICTOR_LRU;
  int32_t n_in = kind == FERRY_PREDICTOR_MLP7 ? FERRY_MLP7_FEATURES : FERRY_MLP3_FEATURES;
  float feat[FERRY_MLP7_FEATURES];
  for (int32_t l = 0; l < L; l++) st->pending_tok[l] = -1;
  for (int32_t t = 0; t < rq->n_tokens; t++) {
    int any = 0;
    const int32_t *tok = rq->ids + (size_t)t * (size_t)L * (size_t)K;
    for (int32_t l = 0; l < L; l++) {
      const int32_t *s = tok + (size_t)l * (size_t)K;
      if (s[0] < 0) continue;
      any = 1;
      if (st->pending_tok[l] == t) {
        const int32_t *pred = st->pending + (size_t)l * (size_t)st->max;
        int32_t correct = 0;
        for (int32_t i = 0; i < st->pending_n[l]; i++) correct += contains(s, K, pred[i]);
        st->layer_correct[l] += correct;
        st->layer_total[l] += K;
        st->predicted_ids += st->pending_n[l];
        st->predicted_hits += correct;
        st->out->predictions++;
      }
      demand(st, l, s);
      ferry_predictor_observe(p, req_index, t, l, K, s);
      int32_t target = l + D;
      if (!predicts || target >= L) continue;
      const int32_t *future = tok + (size_t)target * (size_t)K;
      if (future[0] < 0) continue;
      struct ferry_predict_context ctx = {.req_id = req_index, .token_index = t, .layer = l};
      if (kind == FERRY_PREDICTOR_GATE_LOOKAHEAD) {
        /* what the real run chose, when it recorded it; else the current choice as a proxy */
        const int32_t *la = rq->lookahead && D <= rq->lookahead_max
                                ? rq->lookahead + ((((size_t)t * (size_t)L + (size_t)l) * (size_t)rq->lookahead_max +
                                                    (size_t)(D - 1)) *
                                                   (size_t)K)
                                : NULL;
        for (int32_t e = 0; e < E; e++) st->logits[e] = -INFINITY;
        if (la && la[0] >= 0) {
          for (int32_t j = 0; j < K; j++)
            if (la[j] >= 0 && la[j] < E) st->logits[la[j]] = (float)(K - j);
          st->out->recorded_lookahead++;
        } else {
          const float *w = rq->weights + ((size_t)t * (size_t)L + (size_t)l) * (size_t)K;
          for (int32_t j = 0; j < K; j++) st->logits[s[j]] = w[j];
        }
        ctx.gate_logits = st->logits;
        ctx.n_gate_logits = E;
      } else if (kind == FERRY_PREDICTOR_MLP3 || kind == FERRY_PREDICTOR_MLP7) {
        if (rq->features && rq->has_features && rq->has_features[t] && cfg->n_features == n_in)
          memcpy(feat, rq->features + (size_t)t * (size_t)cfg->n_features, (size_t)n_in * sizeof *feat);
        else
          ferry_predictor_features_derived(kind, t, rq->n_tokens, feat);
        ctx.features = feat;
        ctx.n_features = n_in;
      } else if (kind == FERRY_PREDICTOR_ORACLE) {
        ctx.future_ids = future;
        ctx.n_future_ids = K;
      }
      int32_t *pred = st->pending + (size_t)target * (size_t)st->max;
      ferry_status s2 = ferry_predictor_predict(p, &ctx, D, pred, st->max, &st->pending_n[target]);
      if (s2 != FERRY_OK) return s2;
      st->pending_tok[target] = t;
      if (cfg->cache_slots > 0) prefetch(st, target, pred, st->pending_n[target]);
    }
    st->out->tokens += any;
  }
  return FERRY_OK;
}

/* The running totals, so each request's share is the difference before and after it. */
static struct ferry_predict_eval_counts totals(const struct eval_state *st) {
  const struct ferry_predict_eval_result *o = st->out;
  return (struct ferry_predict_eval_counts){.tokens = o->tokens, .predictions = o->predictions,
                                            .predicted_ids = st->predicted_ids, .correct_ids = st->predicted_hits,
                                            .uses = o->uses, .hits = o->hits, .misses = o->misses,
                                            .prefetch_loads = o->prefetch_loads, .prefetch_unused = o->prefetch_unused};
}

static struct ferry_predict_eval_counts difference(struct ferry_predict_eval_counts a, struct ferry_predict_eval_counts b) {
  return (struct ferry_predict_eval_counts){.tokens = a.tokens - b.tokens, .predictions = a.predictions - b.predictions,
                                            .predicted_ids = a.predicted_ids - b.predicted_ids,
                                            .correct_ids = a.correct_ids - b.correct_ids, .uses = a.uses - b.uses,
                                            .hits = a.hits - b.hits, .misses = a.misses - b.misses,
                                            .prefetch_loads = a.prefetch_loads - b.prefetch_loads,
                                            .prefetch_unused = a.prefetch_unused - b.prefetch_unused};
}

ferry_status ferry_predict_eval(ferry_predictor *p, const struct ferry_predict_eval_request *reqs, size_t n_reqs,
                                const struct ferry_predict_eval_config *cfg, struct ferry_predict_eval_result *out) {
  if (!p || !cfg || !out || (n_reqs && !reqs)) return ferry__fail(FERRY_ERR_INVALID, "ferry_predict_eval: NULL argument");
  memset(out, 0, sizeof *out);
  int none = ferry_predictor_kind_of(p) == FERRY_PREDICTOR_NONE;
  if (cfg->n_layers < 1 || cfg->n_experts < 1 || cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
    return ferry__fail(FERRY_ERR_INVALID, "predictor eval: layers=%d experts=%d k=%d", cfg->n_layers, cfg->n_experts,
                       cfg->top_k);
  if (!none && cfg->cache_slots < cfg->top_k)
    return ferry__fail(FERRY_ERR_INVALID, "predictor eval: %d cache slots cannot hold the %d experts of one layer",
                       cfg->cache_slots, cfg->top_k);
  if (cfg->prefetch_depth < 1 || cfg->prefetch_depth >= cfg->n_layers + (cfg->n_layers == 1))
    return ferry__fail(FERRY_ERR_INVALID, "predictor eval: prefetch depth %d is outside [1, %d)", cfg->prefetch_depth,
                       cfg->n_layers);
  struct eval_state st = {.cfg = cfg, .K = cfg->top_k, .L = cfg->n_layers, .E = cfg->n_experts, .out = out};
  st.max = cfg->prefetch_max > 0 ? cfg->prefetch_max : cfg->top_k;
  if (st.max > st.E) st.max = st.E;
  struct ferry_predict_eval_config local = *cfg;
  if (none) local.cache_slots = 0;
  st.cfg = &local;
  ferry_status rc = FERRY_ERR_NOMEM;
  int cache_ok = 0;
  if (!none) {
    if (ferry__cache_init(&st.cache, ferry__cache_policy_find(cfg->lfu ? "lfu" : "lru"), cfg->cache_slots, 0, st.L,
                          st.E, NULL) != FERRY_OK)
      return ferry__fail(FERRY_ERR_NOMEM, "predictor eval: out of memory for the cache");
    cache_ok = 1;
  }
  st.pf = ferry__calloc(cfg->cache_slots > 0 ? (size_t)cfg->cache_slots : 1, 1);
  st.pending = ferry__calloc((size_t)st.L * (size_t)st.max, sizeof *st.pending);
  st.pending_n = ferry__calloc((size_t)st.L, sizeof *st.pending_n);
  st.pending_tok = ferry__calloc((size_t)st.L, sizeof *st.pending_tok);
  st.layer_correct = ferry__calloc((size_t)st.L, sizeof *st.layer_correct);
  st.layer_total = ferry__calloc((size_t)st.L, sizeof *st.layer_total);
  st.logits = ferry__calloc((size_t)st.E, sizeof *st.logits);
  out->layer_recall = ferry__calloc((size_t)st.L, sizeof *out->layer_recall);
  if (!st.pf || !st.pending || !st.pending_n || !st.pending_tok || !st.layer_correct || !st.layer_total || !st.logits ||
      !out->layer_recall) {
    ferry__fail(FERRY_ERR_NOMEM, "predictor eval: out of memory");
    goto out_free;
  }
  out->n_layers = st.L;
  out->top_k = st.K;
  out->per_request = ferry__calloc(n_reqs ? n_reqs : 1, sizeof *out->per_request);
  if (!out->per_request) {
    rc = ferry__fail(FERRY_ERR_NOMEM, "predictor eval: out of memory");
    goto out_free;
  }
  out->n_requests = n_reqs;
  for (size_t i = 0; i < n_reqs; i++) {
    if (reqs[i].n_tokens < 0 || (reqs[i].n_tokens > 0 && (!reqs[i].ids || !reqs[i].weights))) {
      rc = ferry__fail(FERRY_ERR_INVALID, "predictor eval: request %zu has no routing arrays", i);
      goto out_free;
    }
    struct ferry_predict_eval_counts before = totals(&st);
    if ((rc = run_request(&st, p, &reqs[i], (int64_t)i)) != FERRY_OK) goto out_free;
    if (i + 1 == n_reqs)
      for (int32_t s = 0; s < cfg->cache_slots && !none; s++) out->prefetch_unused += st.pf[s];
    out->per_request[i] = difference(totals(&st), before);
  }
  for (int32_t l = 0; l < st.L; l++)
    out->layer_recall[l] = st.layer_total[l] ? (double)st.layer_correct[l] / (double)st.layer_total[l] : NAN;
  out->recall = out->predictions ? (double)st.predicted_hits / ((double)out->predictions * st.K) : NAN;
  out->precision = st.predicted_ids ? (double)st.predicted_hits / (double)st.predicted_ids : NAN;
  out->bytes_loaded = (uint64_t)(out->misses + out->prefetch_loads) * cfg->expert_bytes;
  out->bytes_unused = (uint64_t)out->prefetch_unused * cfg->expert_bytes;
  rc = FERRY_OK;
out_free:
  if (rc != FERRY_OK) ferry_predict_eval_result_free(out);
  if (cache_ok) ferry__cache_free(&st.cache);
  ferry_free(st.pf);
  ferry_free(st.pending);
  ferry_free(st.pending_n);
  ferry_free(st.pending_tok);
  ferry_free(st.layer_correct);
  ferry_free(st.layer_total);
  ferry_free(st.logits);
  return rc;
}
