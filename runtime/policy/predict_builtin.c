/* The predictors with no model of their own: none (no reuse at all), lru (the cache alone),
 * frequency (the most popular experts of the target layer), gate-lookahead (the target layer's
 * router on the current hidden state) and oracle (the true future: the upper bound). */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "ferry/predict.h"
#include "policy.h"

/* --- none and lru: they predict nothing; none also turns the cache off --------------------- */

static ferry_status nothing_create(void **state, const struct ferry_predictor_config *cfg) {
  *state = NULL;
  return FERRY_OK;
}
static void nothing_free(void *state) {}
static ferry_status nothing_predict(void *state, const struct ferry_predict_context *ctx, int32_t ahead, int32_t *out,
                                    int32_t max, int32_t *n) {
  *n = 0;
  return FERRY_OK;
}

const struct ferry_predictor_ops ferry__predictor_none = {
    .version = FERRY_PREDICTOR_OPS_VERSION, .name = "none",
    .description = "no cache reuse, no prediction: every expert fetched on demand",
    .needs = FERRY_PREDICT_NO_REUSE, .create = nothing_create, .free = nothing_free, .predict = nothing_predict};

const struct ferry_predictor_ops ferry__predictor_lru = {
    .version = FERRY_PREDICTOR_OPS_VERSION, .name = "lru",
    .description = "the expert cache alone, no prediction (default)",
    .create = nothing_create, .free = nothing_free, .predict = nothing_predict};

/* --- frequency --------------------------------------------------------------------------- */

struct frequency {
  int32_t n_layers, n_experts;
  int64_t pop[]; /* [layer][expert] uses */
};

static ferry_status frequency_create(void **state, const struct ferry_predictor_config *cfg) {
  struct frequency *f =
      ferry__calloc(1, sizeof *f + (size_t)cfg->n_layers * (size_t)cfg->n_experts * sizeof f->pop[0]);
  if (!f) return ferry__fail(FERRY_ERR_NOMEM, "predictor: out of memory");
  f->n_layers = cfg->n_layers;
  f->n_experts = cfg->n_experts;
  *state = f;
  return FERRY_OK;
}

static void frequency_free(void *state) { ferry_free(state); }

static ferry_status frequency_seed(void *state, int32_t layer, const int64_t *counts) {
  struct frequency *f = state;
  int64_t *dst = f->pop + (size_t)layer * (size_t)f->n_experts;
  for (int32_t e = 0; e < f->n_experts; e++) dst[e] += counts[e] > 0 ? counts[e] : 0;
  return FERRY_OK;
}

static void frequency_observe(void *state, const struct ferry_predict_context *ctx, int32_t k, const int32_t *ids) {
  struct frequency *f = state;
  int64_t *row = f->pop + (size_t)ctx->layer * (size_t)f->n_experts;
  for (int32_t i = 0; i < k; i++)
    if (ids[i] >= 0 && ids[i] < f->n_experts) row[ids[i]]++;
}

/* popularity counts: the experts seen at least once */
static double count_key(const void *v, int32_t i) {
  const int64_t c = ((const int64_t *)v)[i];
  return c > 0 ? (double)c : (double)NAN;
}

static ferry_status frequency_predict(void *state, const struct ferry_predict_context *ctx, int32_t ahead, int32_t *out,
                                      int32_t max, int32_t *n) {
  const struct frequency *f = state;
  *n = ferry__top_keys(f->pop + (size_t)(ctx->layer + ahead) * (size_t)f->n_experts, f->n_experts, max, count_key, out);
  return FERRY_OK;
}

const struct ferry_predictor_ops ferry__predictor_frequency = {
    .version = FERRY_PREDICTOR_OPS_VERSION, .name = "frequency",
    .description = "the most popular experts of the target layer",
    .needs = FERRY_PREDICT_PREDICTS | FERRY_PREDICT_USES_POPULARITY, .create = frequency_create,
    .free = frequency_free, .observe = frequency_observe, .predict = frequency_predict,
    .set_popularity = frequency_seed};

/* --- gate-lookahead ---------------------------------------------------------------------- */

static ferry_status experts_create(void **state, const struct ferry_predictor_config *cfg) {
  int32_t *n_experts = ferry__calloc(1, sizeof *n_experts);
  if (!n_experts) return ferry__fail(FERRY_ERR_NOMEM, "predictor: out of memory");
  *n_experts = cfg->n_experts;
  *state = n_experts;
  return FERRY_OK;
}

static void experts_free(void *state) { ferry_free(state); }

static ferry_status lookahead_predict(void *state, const struct ferry_predict_context *ctx, int32_t ahead, int32_t *out,
                                      int32_t max, int32_t *n) {
  const int32_t E = *(const int32_t *)state;
  if (!ctx->gate_logits || ctx->n_gate_logits != E)
    return ferry__fail(FERRY_ERR_INVALID, "predictor gate-lookahead: needs %d router logits, got %d", E,
                       ctx->gate_logits ? ctx->n_gate_logits : 0);
  *n = ferry__top_keys(ctx->gate_logits, E, max, ferry__logit_key, out);
  return FERRY_OK;
}

const struct ferry_predictor_ops ferry__predictor_gate_lookahead = {
    .version = FERRY_PREDICTOR_OPS_VERSION, .name = "gate-lookahead",
    .description = "the target layer's router on the current hidden state",
    .needs = FERRY_PREDICT_PREDICTS | FERRY_PREDICT_NEEDS_LOOKAHEAD, .create = experts_create, .free = experts_free,
    .predict = lookahead_predict};

/* --- oracle ------------------------------------------------------------------------------ */

static ferry_status oracle_predict(void *state, const struct ferry_predict_context *ctx, int32_t ahead, int32_t *out,
                                   int32_t max, int32_t *n) {
  const int32_t E = *(const int32_t *)state;
  if (!ctx->future_ids || ctx->n_future_ids < 0)
    return ferry__fail(FERRY_ERR_INVALID, "predictor oracle: needs the true future choice");
  *n = 0;
  for (int32_t i = 0; i < ctx->n_future_ids && *n < max; i++)
    if (ctx->future_ids[i] >= 0 && ctx->future_ids[i] < E) out[(*n)++] = ctx->future_ids[i];
  return FERRY_OK;
}

const struct ferry_predictor_ops ferry__predictor_oracle = {
    .version = FERRY_PREDICTOR_OPS_VERSION, .name = "oracle",
    .description = "the true future choice: the upper bound",
    .needs = FERRY_PREDICT_PREDICTS | FERRY_PREDICT_NEEDS_FUTURE, .create = experts_create, .free = experts_free,
    .predict = oracle_predict};
