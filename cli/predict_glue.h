/* The engine's expert-predictor hook backed by runtime/policy's predictors. */
#ifndef FERRY_CLI_PREDICT_GLUE_H
#define FERRY_CLI_PREDICT_GLUE_H

#include "ferry/engine.h"
#include "ferry/predict.h"
#include "ferry/routing.h"

/* Load MLP predictor weights written by `ferry predictor train` (prints the failure). */
ferry_status cli_predictor_load_mlp(const char *path, enum ferry_predictor_kind variant, int32_t n_layers,
                                    int32_t n_experts, struct ferry_mlp *m, enum ferry_dtype *file_dtype);

struct predict_glue {
  enum ferry_predictor_kind kind;
  ferry_predictor *p;
  const ferry_routing *trace;
  ferry_routing_fn routing;
  void *routing_user;
  int32_t n_experts;
  float *logits, *future_w;
  int32_t *future;
  int64_t last_req;
  int32_t last_layer, last_token;
  float features[FERRY_MLP7_FEATURES];
  /* optional: the trace a real run records (--record-routing); gate-lookahead choices made
   * from real logits go into it, the first failure into record_status */
  ferry_routing *record;
  ferry_status record_status;
};

/* Set up variant for the engine config (ec->predict / ec->expert_no_reuse). trace: a recorded
 * routing trace (frequency popularity, oracle on real runs) or NULL; routing: the simulator's
 * routing source (oracle) or NULL. */
ferry_status predict_glue_init(struct predict_glue *g, const char *variant, const char *mlp_path,
                               const struct ferry_model_config *mc, const ferry_routing *trace, ferry_routing_fn routing,
                               void *routing_user, struct ferry_engine_config *ec);
void predict_glue_free(struct predict_glue *g);

#endif
