/* Whether two model descriptions have the same architecture, field by field, so a hot reload
 * can refuse a folder whose config.json describes another model (its tensors could still have
 * the right shapes: a different RoPE base or norm epsilon would silently change every logit). */
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "ferry/model.h"

ferry_status ferry_model_same_architecture(const ferry_model *serving, const ferry_model *candidate) {
  if (!serving || !candidate) return ferry__fail(FERRY_ERR_INVALID, "model_same_architecture: NULL model");
  const struct ferry_model_config *x = ferry_model_get_config(serving), *y = ferry_model_get_config(candidate);
#define SAME_INT(f)                                                                                                 \
  if (x->f != y->f)                                                                                                 \
    return ferry__fail(FERRY_ERR_FORMAT, "%s has %s %lld where the model serving has %lld: not the same architecture", \
                       y->name, #f, (long long)y->f, (long long)x->f);
#define SAME_REAL(f)                                                                                                \
  if (x->f != y->f)                                                                                                 \
    return ferry__fail(FERRY_ERR_FORMAT, "%s has %s %g where the model serving has %g: not the same architecture",  \
                       y->name, #f, y->f, x->f);
  SAME_INT(family)
  SAME_INT(n_layers)
  SAME_INT(hidden)
  SAME_INT(intermediate)
  SAME_INT(n_heads)
  SAME_INT(n_kv_heads)
  SAME_INT(head_dim)
  SAME_INT(vocab)
  SAME_INT(max_position)
  SAME_INT(n_experts)
  SAME_INT(experts_per_token)
  SAME_INT(expert_intermediate)
  SAME_INT(n_shared_experts)
  SAME_INT(shared_intermediate)
  SAME_INT(shared_expert_gate)
  SAME_INT(norm_topk_prob)
  SAME_INT(tied_embeddings)
  SAME_INT(qkv_bias)
  SAME_INT(attn_out_bias)
  SAME_INT(ffn_bias)
  SAME_INT(qk_norm)
  SAME_INT(learned_positions)
  SAME_INT(norm)
  SAME_INT(act)
  SAME_INT(sliding_window)
  SAME_REAL(norm_eps)
  SAME_REAL(rope_theta)
#undef SAME_INT
#undef SAME_REAL
  return FERRY_OK;
}
