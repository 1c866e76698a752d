/**
 * @file gen.h
 * @brief Synthetic models: a Hugging Face `config.json` plus safetensors weights with Hugging
 *        Face tensor names, drawn from a seeded generator and scaled so activations stay
 *        bounded through every layer. Each layer and each expert is one contiguous file range.
 */
#ifndef FERRY_GEN_H
#define FERRY_GEN_H

#include "ferry/api.h"

#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/model.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Options of ferry_model_generate(). */
struct ferry_gen_options {
  enum ferry_dtype dtype;       /**< F32, F16 or BF16 */
  uint64_t seed;                /**< generator seed: same seed, same bytes */
  uint64_t max_shard_bytes;     /**< 0: one model.safetensors; else shards of at most this many bytes */
  double router_skew;           /**< 0 = plain random router; > 0 makes some experts more popular
                                     (Zipf-like exponent of the per-expert router bias) */
  double router_locality;       /**< 0..1: how strongly router rows align with the hidden-state
                                     directions that persist across tokens (temporal locality) */
  const char *routing_profile;  /**< NULL, or a routing profile (mixtral, olmoe, deepseek, uniform):
                                     router rows of equal scale (balanced load, a trained router's
                                     gate spread), correlated with the previous layer's through a
                                     permutation (cross-layer predictability without shared ids),
                                     and keyed on token clusters that also set the embedding's
                                     scale (vocabulary specialisation the predictor features see);
                                     "uniform" keeps plain random routers. Excludes router_skew
                                     and router_locality. */
  int force;                    /**< replace an existing non-empty output folder */
  int progress;                 /**< print progress lines to stderr */
};

/**
 * @brief Derive a configuration from a preset with overrides.
 * @param base the preset's configuration.
 * @param layers replace the layer count when > 0.
 * @param scale multiply the widths (hidden size, head counts, FFN sizes) when > 0 and != 1.
 * @param vocab replace the vocabulary size when > 0.
 * @param out receives the configuration.
 * @return FERRY_ERR_INVALID when the result is not a valid model; details in ferry_last_error().
 */
FERRY_API ferry_status ferry_model_config_derive(const struct ferry_model_config *base, int64_t layers, double scale,
                                       int64_t vocab, struct ferry_model_config *out);

/**
 * @brief Write a synthetic model into folder @p out_dir (created; must not exist or be empty
 *        unless options->force). Written into a temporary sibling folder and renamed at the end,
 *        so a failure leaves nothing behind.
 * @param model the shapes to generate (its dtype is replaced by options->dtype).
 * @param options generation options.
 * @param out_dir output folder.
 * @param bytes_written receives the bytes of weights written (may be NULL).
 * @return FERRY_OK; FERRY_ERR_EXISTS for a non-empty folder; FERRY_ERR_IO / NO_SPACE on write
 *         failures; details in ferry_last_error().
 */
FERRY_API ferry_status ferry_model_generate(const ferry_model *model, const struct ferry_gen_options *options,
                                  const char *out_dir, uint64_t *bytes_written);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_GEN_H */
