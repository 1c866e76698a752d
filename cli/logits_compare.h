/* The logits of a model on a fixed token set (host executor, everything resident), and how far
 * a variant's are from a reference's: shared by `ferry model quantize --report` (quantized
 * weights) and `ferry model kv-error` (quantized KV caches). */
#ifndef FERRY_CLI_LOGITS_COMPARE_H
#define FERRY_CLI_LOGITS_COMPARE_H

#include "ferry/model.h"
#include "ferry/status.h"

/* Cosine similarity, KL divergence (reference || variant, nats) and top-1 agreement per token. */
struct logits_error {
  size_t tokens;
  double cos_mean, cos_min, kl_mean, kl_max, top1_share;
};

/* Run both folders (each with its KV format; FERRY_KV_AUTO: the model's) on the same 4 requests
 * and seeded token ids, and compare every generated token's logits. On failure the message is
 * in ferry_last_error(). */
ferry_status logits_compare(const char *ref_dir, enum ferry_kv_format ref_kv, const char *dir, enum ferry_kv_format kv,
                            struct logits_error *out);

#endif
