/**
 * @file prefetch.h
 * @brief Expert prefetching for the engine: a registered predictor (ferry/predict.h) connected
 *        to the engine's prefetch hook with what it needs (ferry_predictor_ops::needs): the
 *        engine's router lookahead and token features on executors that compute, and where
 *        they do not (the simulator) a routing trace's recorded choices and features or the
 *        simulated routing itself; popularity from a trace; weight files of `ferry predictor
 *        train`. The command line's `--predictor`, `ferry sim` and any program use it alike.
 */
#ifndef FERRY_PREFETCH_H
#define FERRY_PREFETCH_H

#include "ferry/api.h"

#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/engine.h"
#include "ferry/model.h"
#include "ferry/predict.h"
#include "ferry/routing.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Opaque prefetcher: a predictor and what feeds it. */
typedef struct ferry_prefetcher ferry_prefetcher;

/** What a prefetcher is made of (borrowed for the call; the traces and routing source must
 *  outlive the prefetcher). */
struct ferry_prefetcher_config {
  const char *predictor;         /**< registry name ("frequency", "mlp3", a registered one) */
  const char *weights;           /**< predictors with FERRY_PREDICT_NEEDS_WEIGHTS: a file of
                                      `ferry predictor train` (ferry_mlp_load()) */
  const ferry_routing *trace;    /**< optional: popularity (FERRY_PREDICT_USES_POPULARITY), the true
                                      future (FERRY_PREDICT_NEEDS_FUTURE on a real run), and in the
                                      simulator a real run's recorded lookahead choices and features */
  ferry_routing_fn routing;      /**< optional: the simulator's routing source, the oracle's future */
  void *routing_user;            /**< passed to routing */
  ferry_routing *record;         /**< optional: a trace being recorded, which gets the gate-lookahead
                                      choices made from real router logits */
};

/**
 * @brief Create a prefetcher and hook it into an engine configuration: sets config->predict and
 *        predict_user, and what the predictor needs the engine to compute (router_lookahead,
 *        token_features) or not to do (expert_no_reuse).
 * @param mc the model (layers, experts, top-k).
 * @param out receives the prefetcher, owned by the caller (ferry_prefetcher_free() after the
 *        engine is destroyed).
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND for an unknown predictor (the nearest named);
 *         FERRY_ERR_INVALID when something it needs is missing (weights, a future); the weight
 *         file's errors (FERRY_ERR_FORMAT, ...).
 */
FERRY_API ferry_status ferry_prefetcher_create(ferry_prefetcher **out, const struct ferry_prefetcher_config *cfg,
                                     const struct ferry_model_config *mc, struct ferry_engine_config *config);

/**
 * @brief Set in a configuration what a predictor will change in the engine's plan, before the
 *        prefetcher exists: predict_planned when it prefetches (its expert cache then exists even
 *        with every routed expert on the CPU), router_lookahead (every router resident),
 *        token_features (their read-back buffers) and expert_no_reuse, as
 *        ferry_prefetcher_create() will. A caller that plans first (ferry_engine_plan_budgets(),
 *        ferry_engine_plan_only(); `ferry run` and `ferry sim` do, so a plan needs no weight
 *        file) calls this before planning, so that the plan is the run's.
 * @param predictor registry name.
 * @param config updated in place.
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND for an unknown predictor (the nearest named).
 */
FERRY_API ferry_status ferry_prefetcher_plan(const char *predictor, struct ferry_engine_config *config);

/** @brief The first failure recording lookahead choices into the config's record (FERRY_OK). */
FERRY_API ferry_status ferry_prefetcher_record_status(const ferry_prefetcher *pf);

/** @brief Free a prefetcher. Accepts NULL. */
FERRY_API void ferry_prefetcher_free(ferry_prefetcher *pf);

/**
 * @brief Add the popularity of every layer of a routing trace to a predictor that takes it.
 * @return FERRY_OK (also for a predictor that takes none); FERRY_ERR_INVALID when the trace
 *         has other layers or more experts than the predictor; FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_predictor_seed_popularity(ferry_predictor *p, const ferry_routing *trace, int32_t n_layers,
                                             int32_t n_experts);

/**
 * @brief Write MLP predictor weights as safetensors (metadata ferry.predictor, ferry.dtype,
 *        ferry.n_layers, ferry.n_experts, ferry.top_k), atomically.
 * @param dtype FERRY_DTYPE_F32, F16 (biases too) or I8 (weights with fp32 per-row scales).
 */
FERRY_API ferry_status ferry_mlp_save(const struct ferry_mlp *m, enum ferry_dtype dtype, int32_t top_k, const char *path);

/**
 * @brief Read MLP predictor weights written by ferry_mlp_save().
 * @param variant FERRY_PREDICTOR_MLP3 or FERRY_PREDICTOR_MLP7: the file must be one.
 * @param n_layers the model's layers (the file's must be equal).
 * @param n_experts the model's experts (the file may know fewer: a trace that saw fewer).
 * @param m receives the MLP (ferry_mlp_free()).
 * @param file_dtype receives the weights' storage dtype, w1's (may be NULL).
 * @return FERRY_OK; FERRY_ERR_FORMAT naming what is wrong (among them metadata ferry.dtype
 *         naming a type the weights are not stored in); the store's errors.
 */
FERRY_API ferry_status ferry_mlp_load(const char *path, enum ferry_predictor_kind variant, int32_t n_layers, int32_t n_experts,
                            struct ferry_mlp *m, enum ferry_dtype *file_dtype);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_PREFETCH_H */
