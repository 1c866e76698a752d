/* Connects a predictor of runtime/policy (pure decisions) to the engine's expert-prefetch hook:
 * tells it every routing decision, and gives it what its variant needs — the true future
 * choice for the oracle (from the simulator's routing source, or a recorded routing trace), and
 * for gate-lookahead the target layer's router logits on the current hidden state, which the
 * engine computes (router_lookahead). The simulator computes no hidden states: there, as in
 * `ferry predictor eval` on traces, the current layer's gate weights stand in for them. */
#include <math.h>
#include <string.h>

#include "cli/predict_glue.h"
#include "common/alloc.h"
#include "common/error.h"

static int32_t glue_predict(void *user, int64_t req_id, int32_t token_index, int32_t seq_len, int32_t layer_now,
                            int32_t target_layer, const int32_t *ids_now, const float *weights_now,
                            const float *lookahead_logits, const float *token_features, int32_t k,
                            int32_t *out_ids, int32_t max) {
  struct predict_glue *g = user;
  if (layer_now != g->last_layer || token_index != g->last_token || req_id != g->last_req) {
    ferry_predictor_observe(g->p, req_id, token_index, layer_now, k, ids_now);
    g->last_layer = layer_now;
    g->last_token = token_index;
    g->last_req = req_id;
  }
  struct ferry_predict_context ctx = {.req_id = req_id, .token_index = token_index, .layer = layer_now};
  switch (g->kind) {
    case FERRY_PREDICTOR_ORACLE: {
      const int32_t *ids = NULL;
      if (g->routing) {
        g->routing(g->routing_user, req_id, token_index, target_layer, k, g->n_experts, g->future, g->future_w);
        ids = g->future;
      } else if (g->trace && ferry_routing_lookup(g->trace, req_id, token_index, target_layer, &ids, NULL)) {
        /* ids borrowed from the trace */
      } else {
        return 0;
      }
      ctx.future_ids = ids;
      ctx.n_future_ids = k;
      break;
    }
    case FERRY_PREDICTOR_GATE_LOOKAHEAD:
      if (lookahead_logits) {
        ctx.gate_logits = lookahead_logits;
        ctx.n_gate_logits = g->n_experts;
        break;
      }
      /* a replay: what the real run chose, recorded in its trace, ranked as it ranked them */
      const int32_t *chosen = g->trace ? ferry_routing_lookahead(g->trace, req_id, token_index, layer_now,
                                                                  target_layer - layer_now)
                                       : NULL;
      if (chosen && k == ferry_routing_top_k(g->trace)) {
        for (int32_t x = 0; x < g->n_experts; x++) g->logits[x] = -INFINITY;
        for (int32_t i = 0; i < k; i++)
          if (chosen[i] >= 0 && chosen[i] < g->n_experts) g->logits[chosen[i]] = (float)(k - i);
        ctx.gate_logits = g->logits;
        ctx.n_gate_logits = g->n_experts;
        break;
      }
      for (int32_t x = 0; x < g->n_experts; x++) g->logits[x] = -INFINITY;
      for (int32_t i = 0; i < k; i++)
        if (ids_now[i] >= 0 && ids_now[i] < g->n_experts) g->logits[ids_now[i]] = logf(weights_now[i] + 1e-9f);
      ctx.gate_logits = g->logits;
      ctx.n_gate_logits = g->n_experts;
      break;
    case FERRY_PREDICTOR_MLP3:
    case FERRY_PREDICTOR_MLP7:
      /* the engine's features from the activations; without them (the simulator), those a
       * real run recorded in the --predictor-routing trace; else the features derivable from
       * the request alone (position, length) */
      if (!token_features && g->trace &&
          ferry_routing_n_features(g->trace) == (g->kind == FERRY_PREDICTOR_MLP3 ? FERRY_MLP3_FEATURES : FERRY_MLP7_FEATURES))
        token_features = ferry_routing_token_features(g->trace, req_id, token_index);
      if (token_features) {
        ctx.features = token_features;
      } else {
        ferry_predictor_features_derived(g->kind, token_index, seq_len, g->features);
        ctx.features = g->features;
      }
      ctx.n_features = g->kind == FERRY_PREDICTOR_MLP3 ? FERRY_MLP3_FEATURES : FERRY_MLP7_FEATURES;
      break;
    default:
      break;
  }
  int32_t n = 0;
  if (ferry_predictor_predict(g->p, &ctx, target_layer - layer_now, out_ids, max < k ? max : k, &n) != FERRY_OK) return 0;
  if (g->kind == FERRY_PREDICTOR_GATE_LOOKAHEAD && lookahead_logits && g->record && n == k &&
      target_layer - layer_now <= FERRY_ROUTING_MAX_LOOKAHEAD && g->record_status == FERRY_OK)
    g->record_status = ferry_routing_set_lookahead(g->record, req_id, token_index, layer_now, target_layer - layer_now,
                                                   k, out_ids);
  return n;
}

ferry_status predict_glue_init(struct predict_glue *g, const char *variant, const char *mlp_path,
                               const struct ferry_model_config *mc, const ferry_routing *trace, ferry_routing_fn routing,
                               void *routing_user, struct ferry_engine_config *ec) {
  memset(g, 0, sizeof *g);
  g->last_layer = g->last_token = -1;
  g->last_req = -1;
  if (ferry_predictor_kind_parse(variant, &g->kind) != FERRY_OK) return FERRY_ERR_INVALID;
  const int mlp = g->kind == FERRY_PREDICTOR_MLP3 || g->kind == FERRY_PREDICTOR_MLP7;
  if (mlp && !mlp_path)
    return ferry__fail(FERRY_ERR_INVALID, "--predictor %s needs --predictor-model P.safetensors (ferry predictor train)",
                       variant);
  if (g->kind == FERRY_PREDICTOR_ORACLE && !routing && !trace)
    return ferry__fail(FERRY_ERR_INVALID,
                       "--predictor oracle needs the true future: give --predictor-routing FILE recorded by an "
                       "identical run (ferry run --record-routing)");
  if (g->kind == FERRY_PREDICTOR_NONE) {
    ec->expert_no_reuse = 1;
    return FERRY_OK;
  }
  if (g->kind == FERRY_PREDICTOR_LRU) return FERRY_OK; /* the cache alone */
  struct ferry_predictor_config pc = {.kind = g->kind, .n_layers = (int32_t)mc->n_layers,
                                      .n_experts = (int32_t)mc->n_experts, .top_k = (int32_t)mc->experts_per_token};
  struct ferry_mlp m;
  memset(&m, 0, sizeof m);
  ferry_status st;
  if (mlp) {
    enum ferry_dtype file_dtype;
    if ((st = cli_predictor_load_mlp(mlp_path, g->kind, (int32_t)mc->n_layers, (int32_t)mc->n_experts, &m,
                                     &file_dtype)) != FERRY_OK)
      return st;
    /* trained on a trace that saw fewer experts: it predicts among those */
    pc.n_experts = m.n_experts;
  }
  if ((st = ferry_predictor_create(&g->p, &pc)) != FERRY_OK || (mlp && (st = ferry_predictor_set_mlp(g->p, &m)) != FERRY_OK)) {
    if (mlp) ferry_mlp_free(&m);
    ferry_predictor_free(g->p);
    g->p = NULL;
    return st;
  }
  if (mlp) ferry_mlp_free(&m);
  g->n_experts = (int32_t)mc->n_experts;
  g->trace = trace;
  g->routing = routing;
  g->routing_user = routing_user;
  g->logits = ferry__calloc((size_t)mc->n_experts, sizeof *g->logits);
  g->future = ferry__calloc((size_t)mc->n_experts, sizeof *g->future);
  g->future_w = ferry__calloc((size_t)mc->n_experts, sizeof *g->future_w);
  if (!g->logits || !g->future || !g->future_w) {
    predict_glue_free(g);
    return ferry__fail(FERRY_ERR_NOMEM, "out of memory");
  }
  if (g->kind == FERRY_PREDICTOR_FREQUENCY && trace) {
    /* popularity per layer from the recorded trace */
    /* a trace knows as many experts as it saw chosen: at most the model's */
    const int32_t L = ferry_routing_n_layers(trace), E = (int32_t)mc->n_experts;
    if (L != (int32_t)mc->n_layers || ferry_routing_n_experts(trace) > E) {
      predict_glue_free(g);
      return ferry__fail(FERRY_ERR_INVALID, "--predictor-routing: the trace has %d layers x %d experts, the model %lld x %lld",
                         L, ferry_routing_n_experts(trace), (long long)mc->n_layers, (long long)mc->n_experts);
    }
    int64_t *counts = ferry__calloc((size_t)L * (size_t)E, sizeof *counts);
    if (!counts) {
      predict_glue_free(g);
      return ferry__fail(FERRY_ERR_NOMEM, "out of memory");
    }
    ferry_routing_counts(trace, E, counts); /* the shape was checked above */
    for (int32_t l = 0; l < L; l++) ferry_predictor_set_popularity(g->p, l, counts + (size_t)l * (size_t)E);
    ferry_free(counts);
  }
  ec->predict = glue_predict;
  ec->predict_user = g;
  ec->router_lookahead = g->kind == FERRY_PREDICTOR_GATE_LOOKAHEAD;
  if (mlp) ec->token_features = g->kind == FERRY_PREDICTOR_MLP3 ? FERRY_MLP3_FEATURES : FERRY_MLP7_FEATURES;
  return FERRY_OK;
}

void predict_glue_free(struct predict_glue *g) {
  ferry_predictor_free(g->p);
  ferry_free(g->logits);
  ferry_free(g->future);
  ferry_free(g->future_w);
  memset(g, 0, sizeof *g);
}
