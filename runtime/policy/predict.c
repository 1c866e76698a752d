/* Expert predictors behind one interface: the variants' decision rules (popularity, lookahead
 * logits, MLP logits, oracle) and the top-k selection they share. Pure: the caller supplies
 * features, logits or future choices; nothing here reads files or clocks. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "ferry/predict.h"

struct ferry_predictor {
  struct ferry_predictor_config cfg;
  int64_t *pop;   /* [layer][expert] popularity (frequency) */
  struct ferry_mlp mlp;
  int has_mlp;
  float *logits;  /* [n_experts] scratch */
};

static const char *const kind_names[] = {"none", "lru", "frequency", "gate-lookahead", "mlp3", "mlp7", "oracle"};

ferry_status ferry_predictor_kind_parse(const char *name, enum ferry_predictor_kind *out) {
  for (size_t i = 0; name && i < sizeof kind_names / sizeof *kind_names; i++)
    if (!strcmp(name, kind_names[i])) {
      *out = (enum ferry_predictor_kind)i;
      return FERRY_OK;
    }
  return ferry__fail(FERRY_ERR_INVALID,
                     "unknown predictor '%s' (expected none, lru, frequency, gate-lookahead, mlp3, mlp7 or oracle)",
                     name ? name : "(null)");
}

const char *ferry_predictor_kind_name(enum ferry_predictor_kind kind) {
  return (unsigned)kind < sizeof kind_names / sizeof *kind_names ? kind_names[kind] : "?";
}

ferry_status ferry_predictor_create(ferry_predictor **out, const struct ferry_predictor_config *cfg) {
  if (!out || !cfg) return ferry__fail(FERRY_ERR_INVALID, "ferry_predictor_create: NULL argument");
  *out = NULL;
  if ((unsigned)cfg->kind > FERRY_PREDICTOR_ORACLE)
    return ferry__fail(FERRY_ERR_INVALID, "predictor: unknown variant %d", (int)cfg->kind);
  if (cfg->n_layers < 1 || cfg->n_experts < 1 || cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
    return ferry__fail(FERRY_ERR_INVALID, "predictor: layers=%d experts=%d k=%d: need 1 <= k <= experts, layers >= 1",
                       cfg->n_layers, cfg->n_experts, cfg->top_k);
  if (cfg->mlp_dtype_set && cfg->mlp_dtype != FERRY_DTYPE_F32 && cfg->mlp_dtype != FERRY_DTYPE_F16 &&
      cfg->mlp_dtype != FERRY_DTYPE_I8)
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "predictor: MLP weights in %s are not supported (fp32, fp16 or int8)",
                       ferry_dtype_name(cfg->mlp_dtype));
  ferry_predictor *p = ferry__calloc(1, sizeof *p);
  if (!p) return ferry__fail(FERRY_ERR_NOMEM, "predictor: out of memory");
  p->cfg = *cfg;
  if (!cfg->mlp_dtype_set) p->cfg.mlp_dtype = FERRY_DTYPE_F16;
  p->pop = ferry__calloc((size_t)cfg->n_layers * (size_t)cfg->n_experts, sizeof *p->pop);
  p->logits = ferry__calloc((size_t)cfg->n_experts, sizeof *p->logits);
  if (!p->pop || !p->logits) {
    ferry_predictor_free(p);
    return ferry__fail(FERRY_ERR_NOMEM, "predictor: out of memory");
  }
  *out = p;
  return FERRY_OK;
}

void ferry_predictor_free(ferry_predictor *p) {
  if (!p) return;
  ferry_mlp_free(&p->mlp);
  ferry_free(p->pop);
  ferry_free(p->logits);
  ferry_free(p);
}

enum ferry_predictor_kind ferry_predictor_kind_of(const ferry_predictor *p) {
  return p ? p->cfg.kind : FERRY_PREDICTOR_NONE;
}

ferry_status ferry_predictor_set_popularity(ferry_predictor *p, int32_t layer, const int64_t *counts) {
  if (!p || !counts || layer < 0 || layer >= p->cfg.n_layers)
    return ferry__fail(FERRY_ERR_INVALID, "predictor: popularity for layer %d outside [0, %d)", layer,
                       p ? p->cfg.n_layers : 0);
  int64_t *dst = p->pop + (size_t)layer * (size_t)p->cfg.n_experts;
  for (int32_t e = 0; e < p->cfg.n_experts; e++) dst[e] += counts[e] > 0 ? counts[e] : 0;
  return FERRY_OK;
}

ferry_status ferry_predictor_set_mlp(ferry_predictor *p, const struct ferry_mlp *m) {
  if (!p || !m) return ferry__fail(FERRY_ERR_INVALID, "ferry_predictor_set_mlp: NULL argument");
  if (m->variant != p->cfg.kind || m->n_layers != p->cfg.n_layers || m->n_experts != p->cfg.n_experts)
    return ferry__fail(FERRY_ERR_INVALID,
                       "predictor %s (%d layers, %d experts): the MLP is %s for %d layers and %d experts",
                       ferry_predictor_kind_name(p->cfg.kind), p->cfg.n_layers, p->cfg.n_experts,
                       ferry_predictor_kind_name(m->variant), m->n_layers, m->n_experts);
  struct ferry_mlp copy;
  ferry_status st = ferry_mlp_copy(&copy, m);
  if (st != FERRY_OK) return st;
  if ((st = ferry_mlp_quantize(&copy, p->cfg.mlp_dtype)) != FERRY_OK) {
    ferry_mlp_free(&copy);
    return st;
  }
  ferry_mlp_free(&p->mlp);
  p->mlp = copy;
  p->has_mlp = 1;
  return FERRY_OK;
}

/* The `max` largest keys, best first, ties to the lower index; key() returns NaN for an entry
 * that must not be chosen. O(n * max), which beats sorting for the handful of experts
 * prefetched per layer. */
static int32_t top_keys(const void *v, int32_t n, int32_t max, double (*key)(const void *v, int32_t i), int32_t *out) {
  int32_t got = 0;
  for (int32_t i = 0; i < n; i++) {
    const double ki = key(v, i);
    if (isnan(ki)) continue;
    int32_t pos = got;
    while (pos > 0 && key(v, out[pos - 1]) < ki) pos--;
    if (pos >= max) continue;
    int32_t end = got < max ? got : max - 1;
    memmove(out + pos + 1, out + pos, (size_t)(end - pos) * sizeof *out);
    out[pos] = i;
    if (got < max) got++;
  }
  return got;
}

/* logits: the finite ones */
static double logit_key(const void *v, int32_t i) {
  const float x = ((const float *)v)[i];
  return isfinite(x) ? (double)x : NAN;
}

/* popularity counts: the experts seen at least once */
static double count_key(const void *v, int32_t i) {
  const int64_t c = ((const int64_t *)v)[i];
  return c > 0 ? (double)c : NAN;
}

ferry_status ferry_predictor_predict(ferry_predictor *p, const struct ferry_predict_context *ctx, int32_t layer_ahead,
                                     int32_t *out_ids, int32_t max, int32_t *n_out) {
  if (!p || !ctx || !n_out || (max > 0 && !out_ids))
    return ferry__fail(FERRY_ERR_INVALID, "ferry_predictor_predict: NULL argument");
  *n_out = 0;
  int32_t E = p->cfg.n_experts;
  int32_t target = ctx->layer + layer_ahead;
  if (layer_ahead < 0 || target < 0 || target >= p->cfg.n_layers)
    return ferry__fail(FERRY_ERR_INVALID, "predictor: target layer %d + %d is outside [0, %d)", ctx->layer,
                       layer_ahead, p->cfg.n_layers);
  if (max <= 0) return FERRY_OK;
  if (max > E) max = E;
  switch (p->cfg.kind) {
  case FERRY_PREDICTOR_NONE:
  case FERRY_PREDICTOR_LRU:
    return FERRY_OK;
  case FERRY_PREDICTOR_FREQUENCY:
    *n_out = top_keys(p->pop + (size_t)target * (size_t)E, E, max, count_key, out_ids);
    return FERRY_OK;
  case FERRY_PREDICTOR_GATE_LOOKAHEAD:
    if (!ctx->gate_logits || ctx->n_gate_logits != E)
      return ferry__fail(FERRY_ERR_INVALID, "predictor gate-lookahead: needs %d router logits, got %d", E,
                         ctx->gate_logits ? ctx->n_gate_logits : 0);
    *n_out = top_keys(ctx->gate_logits, E, max, logit_key, out_ids);
    return FERRY_OK;
  case FERRY_PREDICTOR_MLP3:
  case FERRY_PREDICTOR_MLP7:
    if (!p->has_mlp) return FERRY_OK;
    if (!ctx->features || ctx->n_features != p->mlp.n_in)
      return ferry__fail(FERRY_ERR_INVALID, "predictor %s: needs %d features, got %d",
                         ferry_predictor_kind_name(p->cfg.kind), p->mlp.n_in, ctx->features ? ctx->n_features : 0);
    ferry_mlp_forward(&p->mlp, ctx->features, target, p->logits);
    *n_out = top_keys(p->logits, E, max, logit_key, out_ids);
    return FERRY_OK;
  case FERRY_PREDICTOR_ORACLE:
    if (!ctx->future_ids || ctx->n_future_ids < 0)
      return ferry__fail(FERRY_ERR_INVALID, "predictor oracle: needs the true future choice");
    for (int32_t i = 0; i < ctx->n_future_ids && *n_out < max; i++)
      if (ctx->future_ids[i] >= 0 && ctx->future_ids[i] < E) out_ids[(*n_out)++] = ctx->future_ids[i];
    return FERRY_OK;
  }
  return FERRY_ERR_INVALID;
}

void ferry_predictor_observe(ferry_predictor *p, int64_t req_id, int32_t token_index, int32_t layer, int32_t k,
                             const int32_t *ids) {
  (void)req_id;
  (void)token_index;
  if (!p || !ids || layer < 0 || layer >= p->cfg.n_layers || p->cfg.kind != FERRY_PREDICTOR_FREQUENCY) return;
  int64_t *row = p->pop + (size_t)layer * (size_t)p->cfg.n_experts;
  for (int32_t i = 0; i < k; i++)
    if (ids[i] >= 0 && ids[i] < p->cfg.n_experts) row[ids[i]]++;
}
