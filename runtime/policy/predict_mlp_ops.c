/* The mlp3 and mlp7 predictors: the small MLP of predict_mlp.c on per-token features, its
 * weights rounded through their storage dtype as loading them would. */
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "ferry/predict.h"
#include "policy.h"

struct mlp_predictor {
  struct ferry_predictor_config cfg;
  struct ferry_mlp mlp;
  int has_mlp;
  float logits[]; /* [n_experts] scratch */
};

static ferry_status mlp_create(void **state, const struct ferry_predictor_config *cfg) {
  if (cfg->mlp_dtype_set && cfg->mlp_dtype != FERRY_DTYPE_F32 && cfg->mlp_dtype != FERRY_DTYPE_F16 &&
      cfg->mlp_dtype != FERRY_DTYPE_I8)
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "predictor: MLP weights in %s are not supported (fp32, fp16 or int8)",
                       ferry_dtype_name(cfg->mlp_dtype));
  struct mlp_predictor *p = ferry__calloc(1, sizeof *p + (size_t)cfg->n_experts * sizeof p->logits[0]);
  if (!p) return ferry__fail(FERRY_ERR_NOMEM, "predictor: out of memory");
  p->cfg = *cfg;
  if (!cfg->mlp_dtype_set) p->cfg.mlp_dtype = FERRY_DTYPE_F16;
  *state = p;
  return FERRY_OK;
}

static void mlp_free_state(void *state) {
  struct mlp_predictor *p = state;
  ferry_mlp_free(&p->mlp);
  ferry_free(p);
}

static ferry_status mlp_set(void *state, const struct ferry_mlp *m) {
  struct mlp_predictor *p = state;
  const enum ferry_predictor_kind kind = strcmp(p->cfg.name, "mlp3") ? FERRY_PREDICTOR_MLP7 : FERRY_PREDICTOR_MLP3;
  if (m->variant != kind || m->n_layers != p->cfg.n_layers || m->n_experts != p->cfg.n_experts)
    return ferry__fail(FERRY_ERR_INVALID,
                       "predictor %s (%d layers, %d experts): the MLP is %s for %d layers and %d experts", p->cfg.name,
                       p->cfg.n_layers, p->cfg.n_experts, ferry_predictor_kind_name(m->variant), m->n_layers,
                       m->n_experts);
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

static ferry_status mlp_predict(void *state, const struct ferry_predict_context *ctx, int32_t ahead, int32_t *out,
                                int32_t max, int32_t *n) {
  struct mlp_predictor *p = state;
  *n = 0;
  if (!p->has_mlp) return FERRY_OK; /* no weights yet: nothing to say */
  if (!ctx->features || ctx->n_features != p->mlp.n_in)
    return ferry__fail(FERRY_ERR_INVALID, "predictor %s: needs %d features, got %d", p->cfg.name, p->mlp.n_in,
                       ctx->features ? ctx->n_features : 0);
  ferry_mlp_forward(&p->mlp, ctx->features, ctx->layer + ahead, p->logits);
  *n = ferry__top_keys(p->logits, p->cfg.n_experts, max, ferry__logit_key, out);
  return FERRY_OK;
}

const struct ferry_predictor_ops ferry__predictor_mlp3 = {
    .version = FERRY_PREDICTOR_OPS_VERSION, .name = "mlp3",
    .description = "an MLP 3 -> 32 -> 16 -> experts on three per-token features",
    .needs = FERRY_PREDICT_PREDICTS | FERRY_PREDICT_NEEDS_FEATURES | FERRY_PREDICT_NEEDS_WEIGHTS,
    .n_features = FERRY_MLP3_FEATURES, .create = mlp_create, .free = mlp_free_state, .predict = mlp_predict,
    .set_mlp = mlp_set};

const struct ferry_predictor_ops ferry__predictor_mlp7 = {
    .version = FERRY_PREDICTOR_OPS_VERSION, .name = "mlp7",
    .description = "the same MLP on seven features of 512-token segments",
    .needs = FERRY_PREDICT_PREDICTS | FERRY_PREDICT_NEEDS_FEATURES | FERRY_PREDICT_NEEDS_WEIGHTS,
    .n_features = FERRY_MLP7_FEATURES, .create = mlp_create, .free = mlp_free_state, .predict = mlp_predict,
    .set_mlp = mlp_set};
