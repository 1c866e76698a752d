/* A registered predictor behind the engine's prefetch hook: tells it every routing decision,
 * and gives it what its `needs` say — the true future (the simulator's routing source, or a
 * recorded trace), the target layer's router logits on the current hidden state (computed by
 * the engine where the executor computes; in the simulator what a real run recorded, else the
 * current layer's gate weights as a proxy), the token's features (the engine's, a trace's
 * recorded ones, or those derivable from the request alone). */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "ferry/prefetch.h"

struct ferry_prefetcher {
  ferry_predictor *p;
  const struct ferry_predictor_ops *ops;
  const ferry_routing *trace;
  ferry_routing_fn routing;
  void *routing_user;
  int32_t n_experts;
  float *logits, *future_w;
  int32_t *future;
  int64_t last_req;
  int32_t last_layer, last_token;
  float features[FERRY_MLP7_FEATURES];
  ferry_routing *record;
  ferry_status record_status;
};

/* The target layer's true choice, or NULL when nobody knows it. */
static const int32_t *future_of(ferry_prefetcher *pf, const struct ferry_expert_predict_request *rq) {
  if (pf->routing) {
    pf->routing(pf->routing_user, rq->req_id, rq->token_index, rq->target_layer, rq->k, pf->n_experts, pf->future,
                pf->future_w);
    return pf->future;
  }
  const int32_t *ids = NULL;
  return pf->trace && ferry_routing_lookup(pf->trace, rq->req_id, rq->token_index, rq->target_layer, &ids, NULL) ? ids
                                                                                                                : NULL;
}

/* Router logits of the target layer: the engine's; else a replay of what a real run chose,
 * ranked as it ranked them; else the current layer's gate weights (the "repeat" proxy). */
static const float *lookahead_of(ferry_prefetcher *pf, const struct ferry_expert_predict_request *rq) {
  if (rq->lookahead_logits) return rq->lookahead_logits;
  const int32_t ahead = rq->target_layer - rq->layer_now, k = rq->k;
  const int32_t *chosen =
      pf->trace ? ferry_routing_lookahead(pf->trace, rq->req_id, rq->token_index, rq->layer_now, ahead) : NULL;
  for (int32_t x = 0; x < pf->n_experts; x++) pf->logits[x] = -INFINITY;
  if (chosen && k == ferry_routing_top_k(pf->trace)) {
    for (int32_t i = 0; i < k; i++)
      if (chosen[i] >= 0 && chosen[i] < pf->n_experts) pf->logits[chosen[i]] = (float)(k - i);
  } else {
    for (int32_t i = 0; i < k; i++)
      if (rq->ids_now[i] >= 0 && rq->ids_now[i] < pf->n_experts) pf->logits[rq->ids_now[i]] = logf(rq->weights_now[i] + 1e-9f);
  }
  return pf->logits;
}

/* The token's features: the engine's from the activations; without them (the simulator) those
 * a real run recorded; else what the request alone gives (position, length). */
static const float *features_of(ferry_prefetcher *pf, const struct ferry_expert_predict_request *rq, int32_t n) {
  if (rq->token_features && rq->n_features == n) return rq->token_features;
  if (pf->trace && ferry_routing_n_features(pf->trace) == n) {
    const float *f = ferry_routing_token_features(pf->trace, rq->req_id, rq->token_index);
    if (f) return f;
  }
  memset(pf->features, 0, sizeof pf->features);
  if (n == FERRY_MLP3_FEATURES || n == FERRY_MLP7_FEATURES)
    ferry_predictor_features_derived(n == FERRY_MLP3_FEATURES ? FERRY_PREDICTOR_MLP3 : FERRY_PREDICTOR_MLP7,
                                     rq->token_index, rq->seq_len, pf->features);
  return pf->features;
}

static int32_t prefetch_predict(void *user, const struct ferry_expert_predict_request *rq, int32_t *out_ids, int32_t max) {
  ferry_prefetcher *pf = user;
  if (rq->layer_now != pf->last_layer || rq->token_index != pf->last_token || rq->req_id != pf->last_req) {
    ferry_predictor_observe(pf->p, rq->req_id, rq->token_index, rq->layer_now, rq->k, rq->ids_now);
    pf->last_layer = rq->layer_now;
    pf->last_token = rq->token_index;
    pf->last_req = rq->req_id;
  }
  const unsigned needs = pf->ops->needs;
  struct ferry_predict_context ctx = {.req_id = rq->req_id, .token_index = rq->token_index, .layer = rq->layer_now};
  if (needs & FERRY_PREDICT_NEEDS_FUTURE) {
    if (!(ctx.future_ids = future_of(pf, rq))) return 0;
    ctx.n_future_ids = rq->k;
  }
  if (needs & FERRY_PREDICT_NEEDS_LOOKAHEAD) {
    ctx.gate_logits = lookahead_of(pf, rq);
    ctx.n_gate_logits = pf->n_experts;
  }
  if (needs & FERRY_PREDICT_NEEDS_FEATURES) {
    ctx.n_features = pf->ops->n_features;
    ctx.features = features_of(pf, rq, ctx.n_features);
  }
  int32_t n = 0;
  const int32_t ahead = rq->target_layer - rq->layer_now;
  if (ferry_predictor_predict(pf->p, &ctx, ahead, out_ids, max < rq->k ? max : rq->k, &n) != FERRY_OK) return 0;
  /* gate-lookahead choices made from real logits go into the trace being recorded */
  if ((needs & FERRY_PREDICT_NEEDS_LOOKAHEAD) && rq->lookahead_logits && pf->record && n == rq->k &&
      ahead <= FERRY_ROUTING_MAX_LOOKAHEAD && pf->record_status == FERRY_OK)
    pf->record_status =
        ferry_routing_set_lookahead(pf->record, rq->req_id, rq->token_index, rq->layer_now, ahead, rq->k, out_ids);
  return n;
}

ferry_status ferry_predictor_seed_popularity(ferry_predictor *p, const ferry_routing *trace, int32_t n_layers,
                                             int32_t n_experts) {
  if (!p || !trace || !(ferry_predictor_ops_of(p)->needs & FERRY_PREDICT_USES_POPULARITY)) return FERRY_OK;
  /* a trace knows as many experts as it saw chosen: at most the model's */
  const int32_t L = ferry_routing_n_layers(trace), E = n_experts;
  if (L != n_layers || ferry_routing_n_experts(trace) > E)
    return ferry__fail(FERRY_ERR_INVALID, "popularity: the trace has %d layers x %d experts, the predictor %d x %d", L,
                       ferry_routing_n_experts(trace), n_layers, n_experts);
  int64_t *counts = ferry__calloc((size_t)L * (size_t)E, sizeof *counts);
  if (!counts) return ferry__fail(FERRY_ERR_NOMEM, "popularity: out of memory");
  ferry_status st = ferry_routing_counts(trace, E, counts); /* the same counts --expert-cache static pins from */
  for (int32_t l = 0; l < L && st == FERRY_OK; l++) st = ferry_predictor_set_popularity(p, l, counts + (size_t)l * (size_t)E);
  ferry_free(counts);
  return st;
}

/* The predictor, with its weights when it takes some. */
static ferry_status open_predictor(ferry_prefetcher *pf, const struct ferry_prefetcher_config *cfg,
                                   const struct ferry_model_config *mc) {
  struct ferry_predictor_config pc = {.name = cfg->predictor, .n_layers = (int32_t)mc->n_layers,
                                      .n_experts = (int32_t)mc->n_experts, .top_k = (int32_t)mc->experts_per_token};
  struct ferry_mlp m;
  memset(&m, 0, sizeof m);
  ferry_status st;
  const int weights = (pf->ops->needs & FERRY_PREDICT_NEEDS_WEIGHTS) != 0;
  if (weights) {
    enum ferry_predictor_kind kind;
    if ((st = ferry_predictor_kind_parse(cfg->predictor, &kind)) != FERRY_OK ||
        (st = ferry_mlp_load(cfg->weights, kind, pc.n_layers, pc.n_experts, &m, NULL)) != FERRY_OK)
      return st;
    pc.n_experts = m.n_experts; /* trained on a trace that saw fewer experts: it predicts among those */
  }
  if ((st = ferry_predictor_create(&pf->p, &pc)) == FERRY_OK && weights) st = ferry_predictor_set_mlp(pf->p, &m);
  ferry_mlp_free(&m);
  if (st == FERRY_OK) st = ferry_predictor_seed_popularity(pf->p, pf->trace, (int32_t)mc->n_layers, (int32_t)mc->n_experts);
  return st;
}

/* What the predictor needs the engine to compute or not to do, and whether it fills the expert
 * cache: all a plan reads of it. */
static void plan_for(const struct ferry_predictor_ops *ops, struct ferry_engine_config *ec) {
  if (ops->needs & FERRY_PREDICT_NO_REUSE) ec->expert_no_reuse = 1;
  if (!(ops->needs & FERRY_PREDICT_PREDICTS)) return; /* the cache alone (or not even that) */
  ec->predict_planned = 1;
  ec->router_lookahead = (ops->needs & FERRY_PREDICT_NEEDS_LOOKAHEAD) != 0;
  if (ops->needs & FERRY_PREDICT_NEEDS_FEATURES) ec->token_features = ops->n_features;
}

ferry_status ferry_prefetcher_plan(const char *predictor, struct ferry_engine_config *ec) {
  if (!predictor || !ec) return ferry__fail(FERRY_ERR_INVALID, "ferry_prefetcher_plan: NULL argument");
  const struct ferry_predictor_ops *ops;
  ferry_status st = ferry_predictor_lookup(predictor, &ops);
  if (st == FERRY_OK) plan_for(ops, ec);
  return st;
}

ferry_status ferry_prefetcher_create(ferry_prefetcher **out, const struct ferry_prefetcher_config *cfg,
                                     const struct ferry_model_config *mc, struct ferry_engine_config *ec) {
  if (!out || !cfg || !mc || !ec) return ferry__fail(FERRY_ERR_INVALID, "ferry_prefetcher_create: NULL argument");
  *out = NULL;
  const struct ferry_predictor_ops *ops;
  ferry_status st = ferry_predictor_lookup(cfg->predictor, &ops);
  if (st != FERRY_OK) return st;
  if ((ops->needs & FERRY_PREDICT_NEEDS_WEIGHTS) && !cfg->weights)
    return ferry__fail(FERRY_ERR_INVALID, "predictor %s needs weights (ferry predictor train writes them)", ops->name);
  if ((ops->needs & FERRY_PREDICT_NEEDS_FUTURE) && !cfg->routing && !cfg->trace)
    return ferry__fail(FERRY_ERR_INVALID,
                       "predictor %s needs the true future: a routing trace recorded by an identical run (ferry run "
                       "--record-routing)",
                       ops->name);
  plan_for(ops, ec);
  if (!(ops->needs & FERRY_PREDICT_PREDICTS)) return FERRY_OK;
  ferry_prefetcher *pf = ferry__calloc(1, sizeof *pf);
  if (!pf) return ferry__fail(FERRY_ERR_NOMEM, "prefetcher: out of memory");
  pf->ops = ops;
  pf->trace = cfg->trace;
  pf->routing = cfg->routing;
  pf->routing_user = cfg->routing_user;
  pf->record = cfg->record;
  pf->n_experts = (int32_t)mc->n_experts;
  pf->last_req = -1;
  pf->last_layer = pf->last_token = -1;
  pf->logits = ferry__calloc((size_t)mc->n_experts, sizeof *pf->logits);
  pf->future = ferry__calloc((size_t)mc->n_experts, sizeof *pf->future);
  pf->future_w = ferry__calloc((size_t)mc->n_experts, sizeof *pf->future_w);
  if (!pf->logits || !pf->future || !pf->future_w) st = ferry__fail(FERRY_ERR_NOMEM, "prefetcher: out of memory");
  if (st == FERRY_OK) st = open_predictor(pf, cfg, mc);
  if (st != FERRY_OK) {
    ferry_prefetcher_free(pf);
    return st;
  }
  ec->predict = prefetch_predict;
  ec->predict_user = pf;
  *out = pf;
  return FERRY_OK;
}

ferry_status ferry_prefetcher_record_status(const ferry_prefetcher *pf) { return pf ? pf->record_status : FERRY_OK; }

void ferry_prefetcher_free(ferry_prefetcher *pf) {
  if (!pf) return;
  ferry_predictor_free(pf->p);
  ferry_free(pf->logits);
  ferry_free(pf->future);
  ferry_free(pf->future_w);
  ferry_free(pf);
}
