/**
 * @file routing.h
 * @brief Routing traces (which experts each token chose at each MoE layer): strict JSONL
 *        reading and writing, an in-memory index by (request, token, layer), statistics
 *        (popularity, reuse distance, adjacent-layer agreement), a seeded synthetic routing
 *        model for the simulator and a routing source that replays a recorded trace.
 *
 * One JSONL row per (request, token, layer):
 * `{"req_id":3, "token_idx":17, "layer":5, "topk_ids":[12,40], "topk_weights":[0.7,0.3]}`
 * with an optional `"features":[...]` (per-token predictor features, see predict.h).
 * The synthetic model and the replay source have the signature of ::ferry_routing_fn of
 * engine.h, so either can be handed to the engine as its routing source.
 */
#ifndef FERRY_ROUTING_H
#define FERRY_ROUTING_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most experts per layer a routing trace may name (ids are in [0, this)). */
#define FERRY_ROUTING_MAX_EXPERTS 4096
/** Most layers a routing trace may name. */
#define FERRY_ROUTING_MAX_LAYERS 1024
/** Most experts chosen per token and layer. */
#define FERRY_ROUTING_MAX_TOPK 64
/** Largest token index accepted (tokens of one request are indexed densely). */
#define FERRY_ROUTING_MAX_TOKEN_IDX (1 << 20)
/** Most per-token features a row may carry. */
#define FERRY_ROUTING_MAX_FEATURES 64
/** Most layers ahead a row's recorded lookahead prediction may cover. */
#define FERRY_ROUTING_MAX_LOOKAHEAD 4
/** Buckets of the reuse-distance histogram: 1, 2, 3-4, 5-8, ..., 65-128, >128. */
#define FERRY_ROUTING_REUSE_BUCKETS 9

/** Opaque in-memory routing trace. */
typedef struct ferry_routing ferry_routing;

/** Options of ferry_routing_open(). */
struct ferry_routing_options {
  int32_t n_experts; /**< experts per layer; ids must be below it (0: inferred as max id + 1) */
  int32_t n_layers;  /**< layers; rows must be below it (0: inferred as max layer + 1) */
};

/**
 * @brief An empty routing trace to fill with ferry_routing_add().
 * @param out receives the handle, owned by the caller (ferry_routing_free()).
 * @param n_layers layers (1..FERRY_ROUTING_MAX_LAYERS).
 * @param n_experts experts per layer (1..FERRY_ROUTING_MAX_EXPERTS).
 * @param top_k experts per token and layer (1..min(n_experts, FERRY_ROUTING_MAX_TOPK)).
 * @return FERRY_OK, FERRY_ERR_INVALID or FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_routing_create(ferry_routing **out, int32_t n_layers, int32_t n_experts, int32_t top_k);

/**
 * @brief Read a routing trace from JSONL.
 *
 * Strict: every row must be an object with integer `req_id` (|v| <= 2^53), `token_idx` in
 * [0, FERRY_ROUTING_MAX_TOKEN_IDX], `layer` below the layer bound, a non-empty `topk_ids`
 * array of distinct integers below the expert bound, a `topk_weights` array of finite numbers
 * of the same length, the same top-k on every row, and optional `features` (numbers, the same
 * count on every row that has them, equal on every row of one token). A second row for the
 * same (request, token, layer) is an error naming both lines.
 * @param out receives the handle, owned by the caller (ferry_routing_free()).
 * @param path JSONL file.
 * @param opts bounds (NULL: infer both).
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND, FERRY_ERR_IO; FERRY_ERR_FORMAT with "path:line:
 *         what was expected" in ferry_last_error(); FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_routing_open(ferry_routing **out, const char *path, const struct ferry_routing_options *opts);

/** @brief Free a routing trace. Accepts NULL. */
FERRY_API void ferry_routing_free(ferry_routing *r);

/** @brief The last detailed error message of this trace ("" if none). Borrowed. */
FERRY_API const char *ferry_routing_errmsg(const ferry_routing *r);

/**
 * @brief Add (or replace) the choice of one token at one layer.
 * @param k must equal the trace's top-k; ids distinct and below n_experts.
 * @param weights k gate weights, or NULL for 1/k each.
 * @param features n_features per-token features (copied; the first call for a token that
 *        carries features sets them), or NULL with n_features 0.
 * @return FERRY_OK, FERRY_ERR_INVALID (message names the offending value), FERRY_ERR_RANGE, FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_routing_add(ferry_routing *r, int64_t req_id, int32_t token_idx, int32_t layer, int32_t k,
                               const int32_t *ids, const float *weights, int32_t n_features, const float *features);

/**
 * @brief Write the trace as JSONL (requests by id, then tokens, then layers); "-" is stdout.
 *        The file is replaced atomically.
 */
FERRY_API ferry_status ferry_routing_write_jsonl(const ferry_routing *r, const char *path);

/**
 * @brief Check that a routing trace was recorded on a model of this shape: the same layers
 *        and experts per token, and no expert id at or past @p n_experts (a trace may never
 *        have seen the highest experts chosen). Replaying a trace of another shape would answer
 *        nothing from it and fall back to synthetic routing without a word.
 * @param what names the trace in the message (its path).
 * @return FERRY_OK, or FERRY_ERR_INVALID naming every mismatch.
 */
FERRY_API ferry_status ferry_routing_check_shape(const ferry_routing *r, int32_t n_layers, int32_t n_experts, int32_t top_k,
                                       const char *what);

/** @brief Layers of the trace. */
FERRY_API int32_t ferry_routing_n_layers(const ferry_routing *r);
/** @brief Experts per layer. */
FERRY_API int32_t ferry_routing_n_experts(const ferry_routing *r);
/** @brief Experts chosen per token and layer. */
FERRY_API int32_t ferry_routing_top_k(const ferry_routing *r);
/** @brief Features per token (0 when no row carries any). */
FERRY_API int32_t ferry_routing_n_features(const ferry_routing *r);
/** @brief Number of requests. */
FERRY_API size_t ferry_routing_n_requests(const ferry_routing *r);

/**
 * @brief How often each expert was chosen at each layer over the whole trace.
 * @param r the trace.
 * @param n_experts the model's experts per layer (a trace knows those it saw chosen: at most these).
 * @param counts receives ferry_routing_n_layers(r) x n_experts counts, layer major (zeroed first).
 * @return FERRY_OK; FERRY_ERR_INVALID when the trace saw more experts than n_experts.
 */
FERRY_API ferry_status ferry_routing_counts(const ferry_routing *r, int32_t n_experts, int64_t *counts);
/** @brief Number of (request, token, layer) choices present. */
FERRY_API int64_t ferry_routing_n_rows(const ferry_routing *r);

/** One request of a routing trace (all pointers borrowed from the trace). */
struct ferry_routing_request {
  int64_t req_id;        /**< request id */
  int32_t n_tokens;      /**< tokens indexed (largest token_idx + 1) */
  const int32_t *ids;    /**< [n_tokens][n_layers][top_k] chosen experts; -1 where absent */
  const float *weights;  /**< [n_tokens][n_layers][top_k] gate weights */
  const float *features; /**< [n_tokens][n_features] features, or NULL when n_features is 0 */
  const uint8_t *has_features; /**< [n_tokens]: 1 where the trace carried features for the token */
  const int32_t *lookahead; /**< [n_tokens][n_layers][FERRY_ROUTING_MAX_LOOKAHEAD][top_k] recorded
                                 gate-lookahead choices, -1 where absent; NULL when none */
};

/**
 * @brief Request i (sorted by req_id).
 * @return FERRY_OK or FERRY_ERR_RANGE. The view stays valid until the next ferry_routing_add()
 *         or ferry_routing_free().
 */
FERRY_API ferry_status ferry_routing_request_at(const ferry_routing *r, size_t i, struct ferry_routing_request *out);

/**
 * @brief The choice of (req_id, token_idx, layer).
 * @param ids receives a borrowed pointer to top_k ids (may be NULL).
 * @param weights receives a borrowed pointer to top_k weights (may be NULL).
 * @return 1 when present, 0 when absent.
 */
FERRY_API int ferry_routing_lookup(const ferry_routing *r, int64_t req_id, int32_t token_idx, int32_t layer,
                         const int32_t **ids, const float **weights);

/**
 * @brief Record what a gate-lookahead predictor chose at (req_id, token_idx, layer) for layer
 *        layer + ahead (the top-k of that layer's router on this layer's hidden state), so a
 *        simulated replay can predict exactly as the real run did.
 * @param ahead 1..FERRY_ROUTING_MAX_LOOKAHEAD, with layer + ahead below the trace's layers.
 * @param k must equal the trace's top-k; ids distinct and below n_experts.
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND when the (req, token, layer) row is absent (add it
 *         first); FERRY_ERR_INVALID or FERRY_ERR_RANGE naming the value; FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_routing_set_lookahead(ferry_routing *r, int64_t req_id, int32_t token_idx, int32_t layer,
                                         int32_t ahead, int32_t k, const int32_t *ids);

/**
 * @brief The recorded lookahead choice of (req_id, token_idx, layer) for layer + ahead: a
 *        borrowed pointer to top_k ids, or NULL when none was recorded.
 */
FERRY_API const int32_t *ferry_routing_lookahead(const ferry_routing *r, int64_t req_id, int32_t token_idx, int32_t layer,
                                       int32_t ahead);

/**
 * @brief The recorded features of (req_id, token_idx): a borrowed pointer to
 *        ferry_routing_n_features() floats, or NULL when the trace has none for that token.
 */
FERRY_API const float *ferry_routing_token_features(const ferry_routing *r, int64_t req_id, int32_t token_idx);

/** Statistics of one layer (NAN where there was nothing to measure). */
struct ferry_routing_layer_stats {
  int64_t uses;             /**< (token, expert) uses at this layer */
  int32_t top_ids[8];       /**< most used experts, most used first (-1 past n_experts) */
  double top_share[8];      /**< share of uses of each of top_ids */
  double top25_share;       /**< share of uses going to the most used 25% of experts */
  double entropy_norm;      /**< entropy of the usage distribution / log(n_experts): 1 = uniform */
  double next_overlap;      /**< mean |S(l) ∩ S(l+1)| / k over tokens with both (NAN for the last layer) */
  double next_same;         /**< share of tokens whose set at l+1 equals the set at l (NAN for the last) */
  double prev_token_same;   /**< share of tokens (after the first) whose set equals the previous token's */
  /* load balance */
  double busiest_share;     /**< share of uses taken by the busiest expert (uniform: 1/E) */
  double load_cv;           /**< coefficient of variation of the per-expert use counts (uniform: 0) */
  /* consecutive tokens of one request (Mixtral paper, Table 5) */
  int64_t token_pairs;      /**< consecutive-token pairs measured */
  double first_repeat;      /**< share of pairs whose first choice (highest weight) is the same */
  double any_repeat;        /**< share of pairs whose sets share at least one expert */
  double first_repeat_indep; /**< first_repeat expected of independent tokens with this layer's
                                  first-choice popularity (sum of squared shares) */
  double any_repeat_indep;  /**< any_repeat of unrelated tokens (token t of the next request, or
                                 half a request away when there is one request) */
  /* cross-layer: how well layer l's choice predicts layer l+1's, for the same token */
  double next_first_acc;    /**< share of tokens whose first choice at l+1 is the one most often
                                 seen after their first choice at l (in-sample; NAN for the last layer) */
  double next_first_base;   /**< the same without knowing layer l: the busiest first choice of l+1 */
  double next_set_recall;   /**< recall of layer l+1's set from the k experts most often chosen at l+1
                                 after layer l's first choice (in-sample) */
  double next_set_base;     /**< recall of layer l+1's set from its k busiest experts */
  double coact_max;         /**< largest co-activation N(i,j) / N(i) over expert pairs of this layer
                                 (OLMoE paper, eq. 6; experts with at least 1/(4E) of the uses) */
  double request_spec_max;  /**< largest share of one request's tokens that chose one expert
                                 (OLMoE paper, eq. 7 with requests as domains; requests of >= 32 tokens) */
  /* gate weights */
  double gate_top1_mean;    /**< mean share of the largest gate weight in the k weights' sum */
  double gate_top1_p10;     /**< its 10th percentile */
  double gate_top1_p50;     /**< its median */
  double gate_top1_p90;     /**< its 90th percentile */
  double gate_last_mean;    /**< mean share of the smallest of the k weights */
};

/** Statistics of a routing trace. */
struct ferry_routing_stats {
  int32_t n_layers;                    /**< entries in layers */
  struct ferry_routing_layer_stats *layers; /**< per layer; owned (ferry_routing_stats_free()) */
  double top25_share;                  /**< mean over layers */
  double entropy_norm;                 /**< mean over layers */
  double next_overlap;                 /**< mean over layer pairs */
  double next_same;                    /**< mean over layer pairs */
  double prev_token_same;              /**< mean over layers */
  int64_t reuse_hist[FERRY_ROUTING_REUSE_BUCKETS]; /**< reuse distances (tokens between consecutive
                                                       uses of an expert at one layer in one request) */
  int64_t first_uses;                  /**< uses with no earlier use in the request (no distance) */
  double reuse_mean;                   /**< mean reuse distance */
  int64_t reuse_p50;                   /**< median reuse distance (0 when none) */
  /* means over the layers that have the figure */
  double busiest_share;                /**< mean of the layers' busiest_share */
  double load_cv;                      /**< mean of the layers' load_cv */
  double first_repeat;                 /**< mean of the layers' first_repeat */
  double any_repeat;                   /**< mean of the layers' any_repeat */
  double first_repeat_uniform;         /**< first_repeat of uniform random routing: 1/E */
  double any_repeat_uniform;           /**< any_repeat of uniform random routing: 1 - C(E-k,k)/C(E,k) */
  double next_first_acc;               /**< mean over layer pairs */
  double next_first_base;              /**< mean over layer pairs */
  double next_set_recall;              /**< mean over layer pairs */
  double next_set_base;                /**< mean over layer pairs */
  double coact_max;                    /**< mean of the layers' coact_max */
  double gate_top1_mean;               /**< mean of the layers' gate_top1_mean */
  double gate_last_mean;               /**< mean of the layers' gate_last_mean */
};

/**
 * @brief Compute load balance, consecutive-token repetition, cross-layer predictability,
 *        co-activation, gate-weight spread, reuse distance and adjacent-layer statistics.
 * @param out filled; free its layers with ferry_routing_stats_free().
 */
FERRY_API ferry_status ferry_routing_stats_compute(const ferry_routing *r, struct ferry_routing_stats *out);

/** @brief Free what ferry_routing_stats_compute() allocated. Accepts NULL. */
FERRY_API void ferry_routing_stats_free(struct ferry_routing_stats *s);

/**
 * @brief The statistics as a JSON document: shape, the overall means (with the uniform
 *        baselines), the reuse-distance histogram, and one object per layer with every field
 *        of ferry_routing_layer_stats (NAN written as null).
 * @param source written as "source" (e.g. the file name); may be NULL.
 * @param out receives a NUL-terminated string owned by the caller (ferry_free()).
 * @return FERRY_OK or FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_routing_stats_json(const ferry_routing *r, const struct ferry_routing_stats *s, const char *source,
                                      char **out);

/**
 * @brief Lower bound of reuse-distance bucket b (1, 2, 3, 5, 9, ...; the last is open).
 */
FERRY_API int64_t ferry_routing_reuse_bucket_lo(int b);

/**
 * @brief A ::ferry_routing_record_fn of engine.h that appends every decision to a trace.
 * @param user the ferry_routing to fill. The first failure is kept in its error message and
 *        later calls do nothing (check with ferry_routing_record_status()).
 * Token features, when given, go on the token's rows (ferry_routing_add()).
 */
FERRY_API void ferry_routing_record(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                          const int32_t *ids, const float *weights, int32_t n_features, const float *features);

/** @brief FERRY_OK, or the first error ferry_routing_record() met. */
FERRY_API ferry_status ferry_routing_record_status(const ferry_routing *r);

/* ---- synthetic routing ------------------------------------------------------------------ */

/** Longest routing profile name, NUL included. */
#define FERRY_ROUTING_PROFILE_NAME_MAX 16

/** Knobs of the synthetic routing model. */
struct ferry_routing_synth_config {
  int32_t n_layers;  /**< layers (1..FERRY_ROUTING_MAX_LAYERS) */
  int32_t n_experts; /**< experts per layer (1..FERRY_ROUTING_MAX_EXPERTS) */
  int32_t top_k;     /**< experts per token (1..min(n_experts, FERRY_ROUTING_MAX_TOPK)) */
  uint64_t seed;     /**< seed of every draw */
  double zipf;       /**< popularity skew: expert of popularity rank r is drawn with weight
                          1/r^zipf (0 = uniform); ranks are a per-layer random permutation */
  double temporal;   /**< probability that a token re-uses the previous token's set at a layer */
  double layer_corr; /**< probability that layer l+1 repeats layer l's set (checked first) */
  /* Knobs of the calibrated profiles (all 0: the model above, unchanged). Per-layer knobs are
   * given at the first, middle and last layer and interpolated linearly in between. */
  char profile[FERRY_ROUTING_PROFILE_NAME_MAX]; /**< profile the knobs came from ("" if none) */
  double sticky_first[3]; /**< probability that the first choice repeats the previous token's
                               first choice (the rest drawn afresh) */
  double sticky_any[3];   /**< probability that one expert of the previous token's set is kept as
                               the second choice (the rest drawn afresh) */
  double affinity;        /**< probability that the first choice is the previous layer's first
                               choice mapped through a fixed per-layer permutation: cross-layer
                               predictability without shared expert ids */
  double coact;           /**< probability that a drawn expert brings its fixed partner of the
                               layer along (co-activation pairs) */
  int32_t domains;        /**< request domains: each request belongs to one (by hash) with its
                               own per-layer popularity ranking (0 or 1: none) */
  double domain_mix;      /**< share of draws that use the request's domain ranking */
  double domain_zipf;     /**< popularity skew within a domain */
  double gate_temp;       /**< > 0: gate weights are the softmax of the chosen experts' ordered
                               logits (top order statistics of Gumbel(0, 1)) divided by this
                               temperature: smaller is more peaked; 0: weights drawn uniformly */
};

/** Opaque synthetic routing model. */
typedef struct ferry_routing_synth ferry_routing_synth;

/**
 * @brief Create a synthetic routing model.
 *
 * The choice of (request, token, layer) is a pure function of the seed and those three
 * numbers, whatever the call order: "repeat layer l-1" (probability layer_corr) and "re-use
 * token t-1" (probability temporal) are decided by hashes, and the chain they form is walked
 * back (at most 64 steps, then a fresh draw) to a fresh Zipf draw without replacement.
 * @param out receives the model, owned by the caller (ferry_routing_synth_free()).
 */
FERRY_API ferry_status ferry_routing_synth_create(ferry_routing_synth **out, const struct ferry_routing_synth_config *cfg);

/**
 * @brief Parse "profile=NAME,layers=L,experts=E,k=K,zipf=S,temporal=P,layer=P,seed=N" and the
 *        profile knobs (sticky=P, sticky_any=P, affinity=P, coact=P, domains=N, domain_mix=P,
 *        domain_zipf=S, gate_temp=T), any subset; the rest keeps the values already in cfg.
 *        profile= sets the profile's knobs (ferry_routing_profile_apply()) but not the shape;
 *        keys after it override them.
 * @return FERRY_OK or FERRY_ERR_INVALID naming the key or value.
 */
FERRY_API ferry_status ferry_routing_synth_parse(const char *spec, struct ferry_routing_synth_config *cfg);

/**
 * @brief Set the knobs of a named routing profile: "mixtral", "olmoe", "deepseek" (calibrated
 *        to the published routing statistics recorded in tests/data/routing/targets.json) or
 *        "uniform" (every choice uniform and independent). The shape and seed are kept.
 * @return FERRY_OK or FERRY_ERR_INVALID listing the names.
 */
FERRY_API ferry_status ferry_routing_profile_apply(const char *name, struct ferry_routing_synth_config *cfg);

/**
 * @brief The shape of the model a profile describes (Mixtral-8x7B: 32 layers, 8 experts, top-2;
 *        OLMoE-1B-7B: 16, 64, top-8; the DeepSeek 16B ablation model: 27, 64, top-6; uniform:
 *        8, 32, top-2).
 * @return FERRY_OK or FERRY_ERR_INVALID for an unknown name.
 */
FERRY_API ferry_status ferry_routing_profile_shape(const char *name, int32_t *n_layers, int32_t *n_experts, int32_t *top_k);

/** @brief Name of profile i (NULL past the last). Static string. */
FERRY_API const char *ferry_routing_profile_name(size_t i);

/** @brief The domain (0..domains-1) a request belongs to, or 0 without domains. */
FERRY_API int32_t ferry_routing_synth_domain(const ferry_routing_synth *s, int64_t req_id);

/** @brief Free a model. Accepts NULL. */
FERRY_API void ferry_routing_synth_free(ferry_routing_synth *s);

/**
 * @brief The ::ferry_routing_fn of the synthetic model (user = the ferry_routing_synth).
 *
 * Ids come out ordered by weight, heaviest first; weights sum to 1. A call whose top_k or
 * n_experts differs from the configuration, or whose layer is past n_layers, gets a uniform
 * hashed choice and is counted (ferry_routing_synth_mismatches()).
 */
FERRY_API void ferry_routing_synth_fn(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                            int32_t n_experts, int32_t *ids, float *weights);

/**
 * @brief The ::ferry_routing_many_fn of the synthetic model (user = the ferry_routing_synth):
 *        the answers of ferry_routing_synth_fn() for each token, drawn in one loop.
 */
FERRY_API void ferry_routing_synth_many(void *user, int64_t n, const int64_t *req_ids, const int32_t *token_index, int32_t layer,
                                        int32_t top_k, int32_t n_experts, int32_t *ids, float *weights);

/** @brief Calls that did not match the configured shape. */
FERRY_API int64_t ferry_routing_synth_mismatches(const ferry_routing_synth *s);

/**
 * @brief Fill a routing trace with n_requests requests of n_tokens tokens from the model
 *        (request ids 0..n_requests-1).
 * @param out receives a new trace, owned by the caller.
 */
FERRY_API ferry_status ferry_routing_synth_trace(ferry_routing_synth *s, int64_t n_requests, int32_t n_tokens,
                                       ferry_routing **out);

/* ---- replay ------------------------------------------------------------------------------ */

/** Opaque routing source replaying a recorded trace. */
typedef struct ferry_routing_replay ferry_routing_replay;

/**
 * @brief A routing source that answers from a trace and falls back to a synthetic model.
 * @param trace borrowed; must outlive the replay.
 * @param fallback borrowed; used for (request, token, layer) absent from the trace or of a
 *        different shape; must outlive the replay.
 * @param out receives the source, owned by the caller (ferry_routing_replay_free()).
 */
FERRY_API ferry_status ferry_routing_replay_create(ferry_routing_replay **out, const ferry_routing *trace,
                                         ferry_routing_synth *fallback);

/** @brief Free a replay source. Accepts NULL. */
FERRY_API void ferry_routing_replay_free(ferry_routing_replay *rp);

/** @brief The ::ferry_routing_fn of the replay source (user = the ferry_routing_replay). */
FERRY_API void ferry_routing_replay_fn(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                             int32_t n_experts, int32_t *ids, float *weights);

/** @brief Calls answered from the trace. */
FERRY_API int64_t ferry_routing_replay_hits(const ferry_routing_replay *rp);
/** @brief Calls answered by the fallback model. */
FERRY_API int64_t ferry_routing_replay_misses(const ferry_routing_replay *rp);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_ROUTING_H */
