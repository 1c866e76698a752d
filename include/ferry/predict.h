/**
 * @file predict.h
 * @brief Expert predictors: which experts of a layer d layers ahead to prefetch into the
 *        expert cache. Variants `none`, `lru`, `frequency`, `gate-lookahead`, `mlp3`, `mlp7`
 *        and `oracle` share one interface (create, predict, observe); the small MLPs are
 *        trained in C with Adam; an evaluator replays routing through an expert cache.
 *
 * Everything here is pure computation (no I/O, no clock): the caller supplies the features,
 * the lookahead router logits or the true future choices, and reads or writes weight files
 * itself. See docs/predictors.md for the feature definitions and the metrics.
 */
#ifndef FERRY_PREDICT_H
#define FERRY_PREDICT_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Predictor variants. */
enum ferry_predictor_kind {
  FERRY_PREDICTOR_NONE,           /**< no cache reuse, no prediction: fetch on demand */
  FERRY_PREDICTOR_LRU,            /**< expert cache with LRU eviction, no prediction */
  FERRY_PREDICTOR_FREQUENCY,      /**< the most popular experts of the target layer */
  FERRY_PREDICTOR_GATE_LOOKAHEAD, /**< top of the target layer's router logits computed on the current hidden state */
  FERRY_PREDICTOR_MLP3,           /**< MLP 3 -> 32 -> 16 -> experts on three per-token features */
  FERRY_PREDICTOR_MLP7,           /**< the same MLP on seven per-512-token-segment features */
  FERRY_PREDICTOR_ORACLE          /**< the true future choice: the upper bound */
};

/** Features of the mlp3 variant. */
#define FERRY_MLP3_FEATURES 3
/** Features of the mlp7 variant. */
#define FERRY_MLP7_FEATURES 7
/** Tokens per segment of the mlp7 features. */
#define FERRY_MLP_SEGMENT_TOKENS 512
/** Sequence length that log-normalised lengths and positions are divided by (log(1+n)/log(1+this)). */
#define FERRY_MLP_MAX_SEQ 32768
/** First hidden layer width. */
#define FERRY_MLP_H1 32
/** Second hidden layer width. */
#define FERRY_MLP_H2 16

/**
 * @brief Parse a variant name: none, lru, frequency, gate-lookahead, mlp3, mlp7, oracle.
 * @return FERRY_OK or FERRY_ERR_INVALID listing the names.
 */
FERRY_API ferry_status ferry_predictor_kind_parse(const char *name, enum ferry_predictor_kind *out);

/** @brief The name of a variant ("?" outside the enum). Static string. */
FERRY_API const char *ferry_predictor_kind_name(enum ferry_predictor_kind kind);

/* ---- the MLP --------------------------------------------------------------------------- */

/**
 * A small MLP: n_in -> FERRY_MLP_H1 (ReLU) -> FERRY_MLP_H2 (ReLU) -> n_layers * n_experts
 * logits (one sigmoid per expert of each layer: "will this expert be chosen at layer l").
 * Inputs are standardised with in_mean / in_scale first. All arrays are row-major [out][in]
 * and are one allocation owned by the struct (made by ferry_mlp_init()): fill them in place,
 * never re-point them.
 */
struct ferry_mlp {
  enum ferry_predictor_kind variant; /**< FERRY_PREDICTOR_MLP3 or FERRY_PREDICTOR_MLP7 */
  int32_t n_in;      /**< input features (3 or 7) */
  int32_t n_layers;  /**< layers predicted */
  int32_t n_experts; /**< experts per layer */
  float *in_mean;    /**< [n_in] subtracted from the features */
  float *in_scale;   /**< [n_in] then multiplied */
  float *w1;         /**< [FERRY_MLP_H1][n_in] */
  float *b1;         /**< [FERRY_MLP_H1] */
  float *w2;         /**< [FERRY_MLP_H2][FERRY_MLP_H1] */
  float *b2;         /**< [FERRY_MLP_H2] */
  float *w3;         /**< [n_layers * n_experts][FERRY_MLP_H2] */
  float *b3;         /**< [n_layers * n_experts] */
};

/**
 * @brief Allocate an MLP and initialise it (He-uniform weights from @p seed, zero biases,
 *        identity standardisation).
 * @param variant FERRY_PREDICTOR_MLP3 or FERRY_PREDICTOR_MLP7.
 * @return FERRY_OK, FERRY_ERR_INVALID or FERRY_ERR_NOMEM. Free with ferry_mlp_free().
 */
FERRY_API ferry_status ferry_mlp_init(struct ferry_mlp *m, enum ferry_predictor_kind variant, int32_t n_layers,
                            int32_t n_experts, uint64_t seed);

/** @brief Free the arrays of an MLP (the struct itself is the caller's). Accepts NULL. */
FERRY_API void ferry_mlp_free(struct ferry_mlp *m);

/** @brief Deep copy of @p src into @p dst (allocated here; free with ferry_mlp_free()). */
FERRY_API ferry_status ferry_mlp_copy(struct ferry_mlp *dst, const struct ferry_mlp *src);

/**
 * @brief Logits of the n_experts experts of one layer for one feature vector.
 * @param x n_in raw features; @param layer in [0, n_layers); @param logits n_experts outputs.
 */
FERRY_API void ferry_mlp_forward(const struct ferry_mlp *m, const float *x, int32_t layer, float *logits);

/**
 * @brief Round the weights through a storage dtype, as loading them from that dtype would.
 * @param dtype FERRY_DTYPE_F32 (no change), FERRY_DTYPE_F16, or FERRY_DTYPE_I8 (symmetric per
 *        output row, scale = max|w| / 127; biases and standardisation stay fp32).
 * @return FERRY_OK or FERRY_ERR_UNSUPPORTED for other dtypes.
 */
FERRY_API ferry_status ferry_mlp_quantize(struct ferry_mlp *m, enum ferry_dtype dtype);

/** Training data: one sample per (request, token). */
struct ferry_mlp_dataset {
  int64_t n;           /**< samples */
  int32_t n_features;  /**< features per sample (the MLP's n_in) */
  const float *x;      /**< [n][n_features] */
  int32_t n_layers;    /**< layers per sample (the MLP's n_layers) */
  int32_t top_k;       /**< experts chosen per layer */
  const int32_t *y;    /**< [n][n_layers][top_k] chosen experts; -1 where unknown (not trained on) */
};

/** Training settings. */
struct ferry_mlp_train_config {
  int32_t epochs; /**< passes over the data (default 10) */
  int32_t batch;  /**< samples per Adam step (default 32) */
  double lr;      /**< Adam step size (default 1e-2) */
  uint64_t seed;  /**< shuffling seed (weights are initialised by ferry_mlp_init()) */
};

/**
 * @brief Fit the standardisation to the data, then train with Adam (beta 0.9 / 0.999) on the
 *        mean binary cross-entropy of every expert of every layer. Single-threaded with a
 *        fixed summation order: the same MLP, data and config give bit-identical weights.
 * @param epoch_loss optional, receives the mean loss of each epoch (cfg->epochs entries),
 *        measured on the data after that epoch.
 * @return FERRY_OK, FERRY_ERR_INVALID (shapes do not match the MLP), FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_mlp_train(struct ferry_mlp *m, const struct ferry_mlp_dataset *data,
                             const struct ferry_mlp_train_config *cfg, double *epoch_loss);

/** @brief Mean binary cross-entropy of the MLP on the data (NAN on a shape mismatch). */
FERRY_API double ferry_mlp_loss(const struct ferry_mlp *m, const struct ferry_mlp_dataset *data);

/**
 * @brief The three mlp3 features: L2 norm of the current token's hidden state, variance over
 *        the first 5 tokens' embeddings, and log(1 + seq_len) / log(1 + FERRY_MLP_MAX_SEQ).
 */
FERRY_API void ferry_predictor_features_mlp3(float hidden_l2, float emb_var5, int32_t seq_len, float out[FERRY_MLP3_FEATURES]);

/**
 * @brief The seven mlp7 features of the segment of FERRY_MLP_SEGMENT_TOKENS tokens holding
 *        token @p token_idx: mean and spread (standard deviation) of the hidden-state L2 norm
 *        and of the embedding variance over the segment's tokens up to this one, the
 *        log-normalised sequence length, the log-normalised segment index, and the position in
 *        the segment / FERRY_MLP_SEGMENT_TOKENS.
 * @param hidden_l2 per-token norms of the segment so far (n entries, n >= 1).
 * @param emb_var per-token embedding variances of the segment so far (n entries).
 */
FERRY_API void ferry_predictor_features_mlp7(const float *hidden_l2, const float *emb_var, int32_t n, int32_t seq_len,
                                   int32_t token_idx, float out[FERRY_MLP7_FEATURES]);

/**
 * @brief Features derivable from a routing trace without hidden states (used when the trace
 *        rows carry no "features"): the hidden-state features are 0; mlp3 gets the
 *        log-normalised token position in place of the norm, and both get the log-normalised
 *        sequence length (@p seq_len, the request's length) and, for mlp7, segment index and
 *        position in the segment.
 * @param out FERRY_MLP3_FEATURES or FERRY_MLP7_FEATURES values.
 */
FERRY_API void ferry_predictor_features_derived(enum ferry_predictor_kind variant, int32_t token_idx, int32_t seq_len,
                                      float *out);

/* ---- predictors -------------------------------------------------------------------------- */

/** Opaque predictor state. */
typedef struct ferry_predictor ferry_predictor;

/** Predictor configuration (copied). */
struct ferry_predictor_config {
  enum ferry_predictor_kind kind; /**< variant (built in), when name is NULL */
  const char *name;               /**< the predictor's registry name (ferry_predictor_register());
                                       NULL: the name of kind */
  int32_t n_layers;               /**< MoE layers */
  int32_t n_experts;              /**< experts per layer */
  int32_t top_k;                  /**< experts chosen per token and layer */
  enum ferry_dtype mlp_dtype;     /**< storage dtype of MLP weights when mlp_dtype_set: F32, F16 or I8 */
  int mlp_dtype_set;              /**< 1 when mlp_dtype was chosen explicitly (default F16) */
};

/** What the caller knows when asking for a prediction. Unused members may be 0 / NULL. */
struct ferry_predict_context {
  int64_t req_id;            /**< request */
  int32_t token_index;       /**< token being computed */
  int32_t layer;             /**< layer whose routing is known now (the prediction is for layer + ahead) */
  const float *features;     /**< mlp3 / mlp7: the variant's feature vector */
  int32_t n_features;        /**< entries of features */
  const float *gate_logits;  /**< gate-lookahead: target layer's router logits on the current hidden state */
  int32_t n_gate_logits;     /**< entries of gate_logits (n_experts) */
  const int32_t *future_ids; /**< oracle: the target layer's true choice */
  int32_t n_future_ids;      /**< entries of future_ids */
};

/** What a predictor needs and does (bits of ferry_predictor_ops::needs): the engine, the
 *  simulator and the evaluator read them to give it its inputs. */
enum ferry_predictor_need {
  FERRY_PREDICT_PREDICTS = 1u << 0,        /**< prefetches at all (none and lru do not) */
  FERRY_PREDICT_NO_REUSE = 1u << 1,        /**< the expert cache is not consulted: every use is fetched (none) */
  FERRY_PREDICT_NEEDS_LOOKAHEAD = 1u << 2, /**< the target layer's router logits on the current hidden state */
  FERRY_PREDICT_NEEDS_FEATURES = 1u << 3,  /**< n_features per-token features (mlp3 / mlp7 definitions) */
  FERRY_PREDICT_NEEDS_FUTURE = 1u << 4,    /**< the target layer's true choice (an oracle) */
  FERRY_PREDICT_NEEDS_WEIGHTS = 1u << 5,   /**< a weights file of `ferry predictor train` (set_mlp()) */
  FERRY_PREDICT_USES_POPULARITY = 1u << 6  /**< takes per-layer popularity from a routing trace (set_popularity()) */
};

/** Version of struct ferry_predictor_ops this build reads. */
#define FERRY_PREDICTOR_OPS_VERSION 1

/**
 * An expert predictor: a static const op table in its own file, listed by one line in the
 * registry (runtime/policy/predict.c) or added with ferry_predictor_register(). The engine on
 * every executor (`--predictor NAME`), the simulator and `ferry predictor eval` use it by name.
 * Pure: predict() gets what `needs` asks for in its context and allocates nothing.
 */
struct ferry_predictor_ops {
  int version;             /**< FERRY_PREDICTOR_OPS_VERSION */
  const char *name;        /**< registry name: 1-15 of a-z, 0-9, '-' */
  const char *description; /**< one line for help texts */
  unsigned needs;          /**< ferry_predictor_need bits */
  int32_t n_features;      /**< features per token, with FERRY_PREDICT_NEEDS_FEATURES */
  /** the predictor's state (released with free()) */
  ferry_status (*create)(void **state, const struct ferry_predictor_config *cfg);
  /** release the state */
  void (*free)(void *state);
  /** optional: the actual choice at ctx->layer (k ids) */
  void (*observe)(void *state, const struct ferry_predict_context *ctx, int32_t k, const int32_t *ids);
  /** experts of layer ctx->layer + layer_ahead, best first, at most max, into out_ids */
  ferry_status (*predict)(void *state, const struct ferry_predict_context *ctx, int32_t layer_ahead, int32_t *out_ids,
                          int32_t max, int32_t *n_out);
  /** optional (FERRY_PREDICT_USES_POPULARITY): add popularity counts of one layer */
  ferry_status (*set_popularity)(void *state, int32_t layer, const int64_t *counts);
  /** optional (FERRY_PREDICT_NEEDS_WEIGHTS): use these weights (copied) */
  ferry_status (*set_mlp)(void *state, const struct ferry_mlp *m);
};

/** @brief Number of registered predictors. */
FERRY_API size_t ferry_predictor_registry_count(void);
/** @brief The i-th registered predictor, or NULL past the end (borrowed, static). */
FERRY_API const struct ferry_predictor_ops *ferry_predictor_registry_at(size_t i);
/** @brief The predictor named @p name, or NULL. */
FERRY_API const struct ferry_predictor_ops *ferry_predictor_registry_find(const char *name);
/**
 * @brief Add a predictor at start-up (not thread-safe).
 * @param ops borrowed; must stay valid for the life of the process.
 * @return FERRY_OK; FERRY_ERR_INVALID (version, missing create/free/predict, bad name);
 *         FERRY_ERR_EXISTS; FERRY_ERR_RANGE when 16 have been added.
 */
FERRY_API ferry_status ferry_predictor_register(const struct ferry_predictor_ops *ops);
/**
 * @brief The predictor named @p name, or FERRY_ERR_NOT_FOUND naming the nearest.
 * @param out receives the table (borrowed, static).
 */
FERRY_API ferry_status ferry_predictor_lookup(const char *name, const struct ferry_predictor_ops **out);

/** @brief The op table of a predictor (borrowed, static). */
FERRY_API const struct ferry_predictor_ops *ferry_predictor_ops_of(const ferry_predictor *p);

/**
 * @brief Create a predictor.
 * @param out receives the predictor, owned by the caller (ferry_predictor_free()).
 * @return FERRY_OK, FERRY_ERR_INVALID, FERRY_ERR_NOMEM. mlp3/mlp7 predict nothing until
 *         ferry_predictor_set_mlp() is called.
 */
FERRY_API ferry_status ferry_predictor_create(ferry_predictor **out, const struct ferry_predictor_config *cfg);

/** @brief Free a predictor. Accepts NULL. */
FERRY_API void ferry_predictor_free(ferry_predictor *p);

/** @brief The predictor's variant; FERRY_PREDICTOR_NONE for one not built in (use
 *         ferry_predictor_ops_of()). */
FERRY_API enum ferry_predictor_kind ferry_predictor_kind_of(const ferry_predictor *p);

/**
 * @brief A predictor that takes popularity (frequency): seed the popularity of one layer (e.g.
 *        counts from a routing trace).
 * @param counts n_experts uses; added to what observe() counts.
 * @return FERRY_ERR_INVALID for a layer out of range or a predictor that takes none.
 */
FERRY_API ferry_status ferry_predictor_set_popularity(ferry_predictor *p, int32_t layer, const int64_t *counts);

/**
 * @brief A predictor of weights (mlp3 / mlp7): use these (copied, then rounded through the
 *        configured dtype).
 * @return FERRY_ERR_INVALID when the MLP's variant or shape differs from the predictor's, or the
 *         predictor takes no weights.
 */
FERRY_API ferry_status ferry_predictor_set_mlp(ferry_predictor *p, const struct ferry_mlp *m);

/**
 * @brief Experts of layer ctx->layer + layer_ahead to prefetch, best first.
 *
 * Allocates nothing. none and lru predict nothing; frequency returns the most popular; gate-
 * lookahead the largest finite logits; mlp3/mlp7 the largest MLP logits; oracle the true
 * choice. Ties go to the lower expert id.
 * @param max capacity of out_ids: at most this many are returned (the caller's slot budget).
 * @param n_out receives how many were written.
 * @return FERRY_OK; FERRY_ERR_INVALID when the context lacks what the variant needs (wrong
 *         feature count, no logits, no future ids) or the target layer is out of range.
 */
FERRY_API ferry_status ferry_predictor_predict(ferry_predictor *p, const struct ferry_predict_context *ctx, int32_t layer_ahead,
                                     int32_t *out_ids, int32_t max, int32_t *n_out);

/** @brief Tell the predictor the actual choice at a layer (frequency counts it). */
FERRY_API void ferry_predictor_observe(ferry_predictor *p, int64_t req_id, int32_t token_index, int32_t layer, int32_t k,
                             const int32_t *ids);

/* ---- evaluation ------------------------------------------------------------------------- */

/** One request's routing for the evaluator (borrowed arrays, e.g. from a ferry_routing_request). */
struct ferry_predict_eval_request {
  int32_t n_tokens;      /**< tokens */
  const int32_t *ids;    /**< [n_tokens][n_layers][top_k]; -1 where absent */
  const float *weights;  /**< same shape: gate weights */
  const float *features; /**< [n_tokens][n_features] recorded features, or NULL */
  const uint8_t *has_features; /**< [n_tokens] where features holds a row (NULL: none) */
  const int32_t *lookahead;    /**< [n_tokens][n_layers][lookahead_max][top_k] gate-lookahead
                                    choices a real run recorded (-1 absent), or NULL */
  int32_t lookahead_max;       /**< layers ahead per entry of lookahead */
};

/** Evaluator settings. */
struct ferry_predict_eval_config {
  int32_t n_layers;       /**< layers of the routing */
  int32_t n_experts;      /**< experts per layer */
  int32_t top_k;          /**< experts per token and layer */
  int32_t n_features;     /**< entries per row of the requests' features (0: none recorded) */
  int32_t cache_slots;    /**< expert cache capacity, all layers together (>= top_k) */
  int32_t prefetch_depth; /**< predict layer l + depth while at layer l (>= 1) */
  int32_t prefetch_max;   /**< experts predicted per layer (0 = top_k) */
  uint64_t expert_bytes;  /**< bytes of one expert load (0: count loads only) */
  int lfu;                /**< LFU instead of LRU eviction (when cache_policy is NULL) */
  const char *cache_policy; /**< eviction policy by registry name (ferry/cache_policy.h); NULL: lru or lfu */
};

/** One request's share of the evaluation counts (the unit ferry_predict_eval_ci() resamples). */
struct ferry_predict_eval_counts {
  int64_t tokens;          /**< tokens replayed */
  int64_t predictions;     /**< (token, layer) sets predicted */
  int64_t predicted_ids;   /**< experts predicted */
  int64_t correct_ids;     /**< of those, chosen */
  int64_t uses;            /**< (token, layer, expert) uses */
  int64_t hits;            /**< uses found in the cache */
  int64_t misses;          /**< demand loads */
  int64_t prefetch_loads;  /**< experts loaded on a prediction */
  int64_t prefetch_unused; /**< prefetched experts evicted unused while this request ran (the
                                last request also gets those left unused at the end) */
};

/** Evaluation figures. */
struct ferry_predict_eval_result {
  int32_t n_layers;          /**< entries of layer_recall */
  double *layer_recall;      /**< [n_layers] |predicted ∩ actual| / k at each layer (NAN: never predicted); owned */
  double recall;             /**< over every predicted (token, layer) (NAN when none) */
  double precision;          /**< predicted ids that were chosen / predicted ids (NAN when none) */
  int64_t predictions;       /**< (token, layer) sets predicted */
  int64_t uses;              /**< (token, layer, expert) uses */
  int64_t hits;              /**< uses found in the cache */
  int64_t misses;            /**< demand loads: the stall proxy */
  int64_t prefetch_loads;    /**< experts loaded because they were predicted */
  int64_t prefetch_useful;   /**< of those, used before eviction */
  int64_t prefetch_unused;   /**< of those, evicted (or left at the end) without a use */
  int64_t prefetch_dropped;  /**< predictions not loaded because every slot was protected */
  uint64_t bytes_loaded;     /**< (misses + prefetch_loads) * expert_bytes */
  uint64_t bytes_unused;     /**< prefetch_unused * expert_bytes */
  int64_t tokens;            /**< tokens replayed */
  int64_t recorded_lookahead; /**< gate-lookahead predictions taken from the trace's recorded
                                   choices rather than the current-layer proxy */
  int32_t top_k;             /**< experts per token and layer (for the metrics) */
  size_t n_requests;         /**< entries of per_request */
  struct ferry_predict_eval_counts *per_request; /**< [n_requests] counts per request; owned */
};

/** Metrics of an evaluation that get confidence intervals. */
enum ferry_predict_metric {
  FERRY_PREDICT_RECALL,    /**< correct predicted experts / (predicted token-layers x k): higher is better */
  FERRY_PREDICT_PRECISION, /**< correct predicted experts / predicted experts: higher is better */
  FERRY_PREDICT_STALL,     /**< demand loads per token (the stall proxy): lower is better */
  FERRY_PREDICT_WASTED,    /**< prefetched experts never used, per token (x expert bytes = wasted bytes): lower is better */
  FERRY_PREDICT_HIT_RATE,  /**< cache hits / uses: higher is better */
  FERRY_PREDICT_METRICS    /**< number of metrics */
};

/** A metric with its bootstrap confidence interval. */
struct ferry_predict_ci {
  double value; /**< on the evaluated requests (NAN when undefined, e.g. no predictions) */
  double lo;    /**< lower end of the interval */
  double hi;    /**< upper end of the interval */
};

/** @brief Name of a metric ("recall", "precision", "stall", "wasted", "hit rate"). Static string. */
FERRY_API const char *ferry_predict_metric_name(enum ferry_predict_metric m);

/** @brief Whether a larger value of the metric is better. */
FERRY_API int ferry_predict_metric_higher_is_better(enum ferry_predict_metric m);

/**
 * @brief 95% percentile-bootstrap confidence intervals of every metric, resampling requests
 *        with replacement (n_boot resamples from a seeded stream: the same inputs give the same
 *        intervals). Requests share the cache in the replay, so the interval treats them as
 *        nearly independent units: it shows sampling noise, not the cache's carry-over.
 * @param n_boot resamples (>= 10; 1000 is a good choice).
 * @param out FERRY_PREDICT_METRICS intervals, in enum order.
 * @return FERRY_OK, FERRY_ERR_INVALID (no per-request counts, n_boot < 10), FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_predict_eval_ci(const struct ferry_predict_eval_result *r, int32_t n_boot, uint64_t seed,
                                   struct ferry_predict_ci out[FERRY_PREDICT_METRICS]);

/**
 * @brief Paired bootstrap of the difference a - b of one metric between two evaluations of
 *        the same requests (the same resampled requests on both sides).
 * @param out value = the difference on all requests; [lo, hi] its 95% interval. The two
 *        predictors are tied on this metric when the interval contains 0.
 * @return FERRY_OK, FERRY_ERR_INVALID (different request counts, no per-request counts), or
 *         FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_predict_eval_diff_ci(const struct ferry_predict_eval_result *a, const struct ferry_predict_eval_result *b,
                                        enum ferry_predict_metric m, int32_t n_boot, uint64_t seed,
                                        struct ferry_predict_ci *out);

/**
 * @brief Replay routing through an expert cache with the predictor prefetching.
 *
 * Requests one after the other, tokens in order, layers in order. At each (token, layer):
 * the actual experts are looked up (hit) or loaded on demand (miss, protected for the layer);
 * the predictor observes them; then it predicts layer + prefetch_depth of the same token and
 * the predicted experts not resident are loaded into unprotected slots (LRU/LFU victims).
 * For gate-lookahead the evaluator has no hidden states: it uses the choices a real run
 * recorded (request lookahead), else approximates the target layer's logits by the current
 * layer's gate weights (the "repeat the current choice" proxy). MLP features come from the requests' recorded
 * features, else ferry_predictor_features_derived().
 * @param out free with ferry_predict_eval_result_free().
 */
FERRY_API ferry_status ferry_predict_eval(ferry_predictor *p, const struct ferry_predict_eval_request *reqs, size_t n_reqs,
                                const struct ferry_predict_eval_config *cfg, struct ferry_predict_eval_result *out);

/** @brief Free what ferry_predict_eval() allocated. Accepts NULL. */
FERRY_API void ferry_predict_eval_result_free(struct ferry_predict_eval_result *r);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_PREDICT_H */
