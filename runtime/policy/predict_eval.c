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
  unsigned needs;
  int32_t n_in;            /* the predictor's features per token */
  struct ferry__expert_plan plan; /* the engine's expert cache and prefetch (expert_plan.c) */
  int32_t *count;          /* [E] the token's experts at the layer being replayed */
  int32_t *pending;        /* [layer][max] predicted ids for the current token */
  int32_t *pending_n;      /* [layer] */
  int32_t *pending_tok;    /* [layer] token the prediction is for, -1 none */
  int32_t *pred;           /* [max] one prediction */
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

/* The plan's decisions cost nothing here: it counts them itself. */
static ferry_status count_only(void *user, int32_t layer, int32_t expert, int32_t slot, int fetch) { return FERRY_OK; }

/* The prediction context of (token t, layer l) for layer l + ahead, with what the predictor
 * needs; NULL-free, or 0 when the trace cannot give what it needs (no future recorded). */
static int context_for(struct eval_state *st, const struct ferry_predict_eval_request *rq, int32_t t, int32_t l,
                       int32_t ahead, int64_t req_index, float *feat, struct ferry_predict_context *ctx) {
  const int32_t K = st->K, L = st->L, E = st->E;
  const int32_t *tok = rq->ids + (size_t)t * (size_t)L * (size_t)K, *s = tok + (size_t)l * (size_t)K;
  const int32_t *future = tok + (size_t)(l + ahead) * (size_t)K;
  if (future[0] < 0) return 0; /* the trace has no routing there: nothing to compare with */
  *ctx = (struct ferry_predict_context){.req_id = req_index, .token_index = t, .layer = l};
  if (st->needs & FERRY_PREDICT_NEEDS_LOOKAHEAD) {
    /* what the real run chose, when it recorded it; else the current choice as a proxy */
    const int32_t *la = rq->lookahead && ahead <= rq->lookahead_max
                            ? rq->lookahead + ((((size_t)t * (size_t)L + (size_t)l) * (size_t)rq->lookahead_max +
                                                (size_t)(ahead - 1)) *
                                               (size_t)K)
                            : NULL;
    for (int32_t e = 0; e < E; e++) st->logits[e] = -INFINITY;
    if (la && la[0] >= 0) {
      for (int32_t j = 0; j < K; j++)
        if (la[j] >= 0 && la[j] < E) st->logits[la[j]] = (float)(K - j);
      if (ahead == st->cfg->prefetch_depth) st->out->recorded_lookahead++;
    } else {
      const float *w = rq->weights + ((size_t)t * (size_t)L + (size_t)l) * (size_t)K;
      for (int32_t j = 0; j < K; j++) st->logits[s[j]] = w[j];
    }
    ctx->gate_logits = st->logits;
    ctx->n_gate_logits = E;
  }
  if (st->needs & FERRY_PREDICT_NEEDS_FEATURES) {
    const int32_t n_in = ctx->n_features = st->n_in;
    if (rq->features && rq->has_features && rq->has_features[t] && st->cfg->n_features == n_in)
      memcpy(feat, rq->features + (size_t)t * (size_t)st->cfg->n_features, (size_t)n_in * sizeof *feat);
    else if (n_in == FERRY_MLP3_FEATURES || n_in == FERRY_MLP7_FEATURES)
      ferry_predictor_features_derived(n_in == FERRY_MLP3_FEATURES ? FERRY_PREDICTOR_MLP3 : FERRY_PREDICTOR_MLP7, t,
                                       rq->n_tokens, feat);
    else
      memset(feat, 0, (size_t)n_in * sizeof *feat);
    ctx->features = feat;
  }
  if (st->needs & FERRY_PREDICT_NEEDS_FUTURE) {
    ctx->future_ids = future;
    ctx->n_future_ids = K;
  }
  return 1;
}

/* The prediction for layer l + D is compared with what that layer chooses when the token gets
 * there: recall and precision per predicted (token, layer). */
static void score(struct eval_state *st, int32_t t, int32_t l, const int32_t *s) {
  if (st->pending_tok[l] != t) return;
  const int32_t *pred = st->pending + (size_t)l * (size_t)st->max;
  int32_t correct = 0;
  for (int32_t i = 0; i < st->pending_n[l]; i++) correct += contains(s, st->K, pred[i]);
  st->layer_correct[l] += correct;
  st->layer_total[l] += st->K;
  st->predicted_ids += st->pending_n[l];
  st->predicted_hits += correct;
  st->out->predictions++;
}

/* One token at one layer, as the engine runs a step of one token: demand for its experts,
 * then the predictions of the next prefetch_depth layers voted and prefetched. */
static ferry_status replay_layer(struct eval_state *st, ferry_predictor *p, const struct ferry_predict_eval_request *rq,
                                 int32_t t, int32_t l, int64_t req_index) {
  const int32_t K = st->K, L = st->L, D = st->cfg->prefetch_depth;
  const int32_t *s = rq->ids + ((size_t)t * (size_t)L + (size_t)l) * (size_t)K;
  score(st, t, l, s);
  st->out->uses += K;
  for (int32_t j = 0; j < K; j++) st->count[s[j]]++;
  ferry_status rc = ferry__xplan_demand(&st->plan, l, st->count, NULL, count_only, NULL);
  for (int32_t j = 0; j < K; j++) st->count[s[j]] = 0;
  if (rc != FERRY_OK) return rc;
  ferry_predictor_observe(p, req_index, t, l, K, s);
  if (!(st->needs & FERRY_PREDICT_PREDICTS)) return FERRY_OK;
  float feat[FERRY_MLP7_FEATURES];
  for (int32_t ahead = 1; ahead <= D && l + ahead < L; ahead++) {
    struct ferry_predict_context ctx;
    if (!context_for(st, rq, t, l, ahead, req_index, feat, &ctx)) continue;
    int32_t n = 0;
    if ((rc = ferry_predictor_predict(p, &ctx, ahead, st->pred, st->max, &n)) != FERRY_OK) return rc;
    if (ahead == D) { /* the prediction D layers ahead is the one scored */
      memcpy(st->pending + (size_t)(l + D) * (size_t)st->max, st->pred, (size_t)n * sizeof *st->pred);
      st->pending_n[l + D] = n;
      st->pending_tok[l + D] = t;
    }
    ferry__xplan_vote_reset(&st->plan);
    ferry__xplan_vote(&st->plan, st->pred, n);
    if ((rc = ferry__xplan_prefetch(&st->plan, l + ahead, count_only, NULL)) != FERRY_OK) return rc;
  }
  return FERRY_OK;
}

static ferry_status run_request(struct eval_state *st, ferry_predictor *p, const struct ferry_predict_eval_request *rq,
                                int64_t req_index) {
  const int32_t K = st->K, L = st->L;
  for (int32_t l = 0; l < L; l++) st->pending_tok[l] = -1;
  for (int32_t t = 0; t < rq->n_tokens; t++) {
    int any = 0;
    const int32_t *tok = rq->ids + (size_t)t * (size_t)L * (size_t)K;
    for (int32_t l = 0; l < L; l++) {
      if (tok[(size_t)l * (size_t)K] < 0) continue;
      any = 1;
      ferry_status rc = replay_layer(st, p, rq, t, l, req_index);
      if (rc != FERRY_OK) return rc;
    }
    st->out->tokens += any;
  }
  return FERRY_OK;
}

/* The running totals (the plan counts the cache), so each request's share is the difference
 * before and after it. */
static struct ferry_predict_eval_counts totals(const struct eval_state *st) {
  const struct ferry_predict_eval_result *o = st->out;
  return (struct ferry_predict_eval_counts){.tokens = o->tokens, .predictions = o->predictions,
                                            .predicted_ids = st->predicted_ids, .correct_ids = st->predicted_hits,
                                            .uses = o->uses, .hits = st->plan.hits, .misses = st->plan.misses,
                                            .prefetch_loads = st->plan.prefetches,
                                            .prefetch_unused = st->plan.prefetches_wasted};
}

static struct ferry_predict_eval_counts difference(struct ferry_predict_eval_counts a, struct ferry_predict_eval_counts b) {
  return (struct ferry_predict_eval_counts){.tokens = a.tokens - b.tokens, .predictions = a.predictions - b.predictions,
                                            .predicted_ids = a.predicted_ids - b.predicted_ids,
                                            .correct_ids = a.correct_ids - b.correct_ids, .uses = a.uses - b.uses,
                                            .hits = a.hits - b.hits, .misses = a.misses - b.misses,
                                            .prefetch_loads = a.prefetch_loads - b.prefetch_loads,
                                            .prefetch_unused = a.prefetch_unused - b.prefetch_unused};
}

static void state_free(struct eval_state *st) {
  ferry__xplan_free(&st->plan);
  ferry_free(st->count);
  ferry_free(st->pending);
  ferry_free(st->pending_n);
  ferry_free(st->pending_tok);
  ferry_free(st->pred);
  ferry_free(st->layer_correct);
  ferry_free(st->layer_total);
  ferry_free(st->logits);
}

/* The replay's state: the engine's expert plan over the cache (none: every use fetched), and
 * the scratch of the predictions. */
static ferry_status state_init(struct eval_state *st, const struct ferry_predictor_ops *ops) {
  const struct ferry_predict_eval_config *cfg = st->cfg;
  const struct ferry_cache_policy_ops *policy;
  if (ferry_cache_policy_lookup(cfg->cache_policy ? cfg->cache_policy : cfg->lfu ? "lfu" : "lru", &policy) != FERRY_OK)
    return FERRY_ERR_NOT_FOUND;
  const int no_reuse = (ops->needs & FERRY_PREDICT_NO_REUSE) != 0;
  /* `none` keeps nothing: one slot, which every use is fetched into again */
  if (ferry__xplan_init(&st->plan, policy, no_reuse ? 1 : cfg->cache_slots, 0, st->L, st->E, NULL, cfg->prefetch_depth,
                        no_reuse) != FERRY_OK)
    return ferry__fail(FERRY_ERR_NOMEM, "predictor eval: out of memory for the cache");
  st->count = ferry__calloc((size_t)st->E, sizeof *st->count);
  st->pending = ferry__calloc((size_t)st->L * (size_t)st->max, sizeof *st->pending);
  st->pending_n = ferry__calloc((size_t)st->L, sizeof *st->pending_n);
  st->pending_tok = ferry__calloc((size_t)st->L, sizeof *st->pending_tok);
  st->pred = ferry__calloc((size_t)st->max, sizeof *st->pred);
  st->layer_correct = ferry__calloc((size_t)st->L, sizeof *st->layer_correct);
  st->layer_total = ferry__calloc((size_t)st->L, sizeof *st->layer_total);
  st->logits = ferry__calloc((size_t)st->E, sizeof *st->logits);
  if (!st->count || !st->pending || !st->pending_n || !st->pending_tok || !st->pred || !st->layer_correct ||
      !st->layer_total || !st->logits)
    return ferry__fail(FERRY_ERR_NOMEM, "predictor eval: out of memory");
  return FERRY_OK;
}

/* The figures of the whole replay from the counts. */
static void finish(struct eval_state *st, const struct ferry_predict_eval_config *cfg) {
  struct ferry_predict_eval_result *out = st->out;
  out->hits = st->plan.hits;
  out->misses = st->plan.misses;
  out->prefetch_loads = st->plan.prefetches;
  out->prefetch_useful = st->plan.prefetches_used;
  out->prefetch_unused = st->plan.prefetches_wasted;
  for (int32_t s = 0; s < st->plan.cache.n_slots; s++) out->prefetch_unused += st->plan.prefetched[s];
  for (int32_t l = 0; l < st->L; l++)
    out->layer_recall[l] = st->layer_total[l] ? (double)st->layer_correct[l] / (double)st->layer_total[l] : NAN;
  out->recall = out->predictions ? (double)st->predicted_hits / ((double)out->predictions * st->K) : NAN;
  out->precision = st->predicted_ids ? (double)st->predicted_hits / (double)st->predicted_ids : NAN;
  out->bytes_loaded = (uint64_t)(out->misses + out->prefetch_loads) * cfg->expert_bytes;
  out->bytes_unused = (uint64_t)out->prefetch_unused * cfg->expert_bytes;
}

ferry_status ferry_predict_eval(ferry_predictor *p, const struct ferry_predict_eval_request *reqs, size_t n_reqs,
                                const struct ferry_predict_eval_config *cfg, struct ferry_predict_eval_result *out) {
  if (!p || !cfg || !out || (n_reqs && !reqs)) return ferry__fail(FERRY_ERR_INVALID, "ferry_predict_eval: NULL argument");
  memset(out, 0, sizeof *out);
  const struct ferry_predictor_ops *ops = ferry_predictor_ops_of(p);
  if (cfg->n_layers < 1 || cfg->n_experts < 1 || cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
    return ferry__fail(FERRY_ERR_INVALID, "predictor eval: layers=%d experts=%d k=%d", cfg->n_layers, cfg->n_experts,
                       cfg->top_k);
  if (!(ops->needs & FERRY_PREDICT_NO_REUSE) && cfg->cache_slots < cfg->top_k)
    return ferry__fail(FERRY_ERR_INVALID, "predictor eval: %d cache slots cannot hold the %d experts of one layer",
                       cfg->cache_slots, cfg->top_k);
  if (cfg->prefetch_depth < 1 || cfg->prefetch_depth >= cfg->n_layers + (cfg->n_layers == 1))
    return ferry__fail(FERRY_ERR_INVALID, "predictor eval: prefetch depth %d is outside [1, %d)", cfg->prefetch_depth,
                       cfg->n_layers);
  struct eval_state st = {.cfg = cfg, .K = cfg->top_k, .L = cfg->n_layers, .E = cfg->n_experts, .out = out,
                          .needs = ops->needs, .n_in = ops->n_features};
  st.max = cfg->prefetch_max > 0 ? cfg->prefetch_max : cfg->top_k;
  if (st.max > st.E) st.max = st.E;
  ferry_status rc = state_init(&st, ops);
  if (rc == FERRY_OK) {
    out->layer_recall = ferry__calloc((size_t)st.L, sizeof *out->layer_recall);
    out->per_request = ferry__calloc(n_reqs ? n_reqs : 1, sizeof *out->per_request);
    if (!out->layer_recall || !out->per_request) rc = ferry__fail(FERRY_ERR_NOMEM, "predictor eval: out of memory");
  }
  out->n_layers = st.L;
  out->top_k = st.K;
  out->n_requests = n_reqs;
  for (size_t i = 0; rc == FERRY_OK && i < n_reqs; i++) {
    if (reqs[i].n_tokens < 0 || (reqs[i].n_tokens > 0 && (!reqs[i].ids || !reqs[i].weights))) {
      rc = ferry__fail(FERRY_ERR_INVALID, "predictor eval: request %zu has no routing arrays", i);
      break;
    }
    struct ferry_predict_eval_counts before = totals(&st);
    if ((rc = run_request(&st, p, &reqs[i], (int64_t)i)) != FERRY_OK) break;
    out->per_request[i] = difference(totals(&st), before);
    /* what the last request leaves prefetched and unused is its waste */
    if (i + 1 == n_reqs)
      for (int32_t s = 0; s < st.plan.cache.n_slots; s++) out->per_request[i].prefetch_unused += st.plan.prefetched[s];
  }
  if (rc == FERRY_OK) finish(&st, cfg);
  else ferry_predict_eval_result_free(out);
  state_free(&st);
  return rc;
}
