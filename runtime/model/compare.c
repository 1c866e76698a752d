/* Whether two model descriptions have the same architecture, field by field, so a hot reload
 * can refuse a folder whose config.json describes another model (its tensors could still have
 * the right shapes: a different RoPE base or norm epsilon would silently change every logit).
 * The quantization a checkpoint was published in (quant) and its dtype may differ. */
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "ferry/model.h"

/* SAME_INT(f), SAME_REAL(f): where x (the model serving) and y (the candidate) differ in field f, fail
 * naming it. */
#define SAME_INT(f)                                                                                                 \
  if (x->f != y->f)                                                                                                 \
    return ferry__fail(FERRY_ERR_FORMAT, "%s has %s %lld where the model serving has %lld: not the same architecture", \
                       y->name, #f, (long long)y->f, (long long)x->f);
#define SAME_REAL(f)                                                                                                \
  if (x->f != y->f)                                                                                                 \
    return ferry__fail(FERRY_ERR_FORMAT, "%s has %s %g where the model serving has %g: not the same architecture",  \
                       y->name, #f, y->f, x->f);

/* Their RoPE scaling, field by field. */
static ferry_status same_rope_scaling(const struct ferry_model_config *x, const struct ferry_model_config *y) {
  SAME_INT(rope_scaling.type)
  SAME_REAL(rope_scaling.factor)
  SAME_INT(rope_scaling.original_max_position)
  SAME_REAL(rope_scaling.low_freq_factor)
  SAME_REAL(rope_scaling.high_freq_factor)
  SAME_REAL(rope_scaling.beta_fast)
  SAME_REAL(rope_scaling.beta_slow)
  SAME_REAL(rope_scaling.mscale)
  SAME_REAL(rope_scaling.mscale_all_dim)
  SAME_REAL(rope_scaling.attention_factor)
  SAME_INT(rope_scaling.no_truncate)
  SAME_INT(rope_scaling.n_factors)
  SAME_REAL(rope_scaling.short_mscale)
  SAME_REAL(rope_scaling.long_mscale)
  /* field by field, never the struct's bytes: padding is not part of the value */
  const int32_t nf = x->rope_scaling.n_factors > 0 && x->rope_scaling.n_factors <= FERRY_ROPE_MAX_FACTORS
                         ? x->rope_scaling.n_factors
                         : 0;
  for (int32_t i = 0; i < nf; i++)
    if (x->rope_scaling.short_factor[i] != y->rope_scaling.short_factor[i] ||
        x->rope_scaling.long_factor[i] != y->rope_scaling.long_factor[i])
      return ferry__fail(FERRY_ERR_FORMAT, "%s has other LongRoPE factors than the model serving: not the same architecture",
                         y->name);
  return FERRY_OK;
}

ferry_status ferry_model_same_architecture(const ferry_model *serving, const ferry_model *candidate) {
  if (!serving || !candidate) return ferry__fail(FERRY_ERR_INVALID, "model_same_architecture: NULL model");
  const struct ferry_model_config *x = ferry_model_get_config(serving), *y = ferry_model_get_config(candidate);
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
  SAME_INT(first_dense_layers)
  SAME_INT(moe_layer_step)
  SAME_INT(sliding_pattern)
  SAME_INT(rotary_dim)
  SAME_INT(rope_interleaved)
  SAME_INT(norm_unit_offset)
  SAME_INT(sandwich_norms)
  SAME_INT(scale_embeddings)
  SAME_INT(parallel_residual)
  SAME_INT(parallel_shared_norm)
  SAME_INT(fused_qkv)
  SAME_INT(embed_norm)
  SAME_INT(alibi)
  SAME_INT(attn_sinks)
  SAME_INT(attn_chunk)
  SAME_INT(nope_layer_step)
  SAME_INT(lm_head_bias)
  SAME_INT(q_lora_rank)
  SAME_INT(kv_lora_rank)
  SAME_INT(qk_nope_dim)
  SAME_INT(qk_rope_dim)
  SAME_INT(v_head_dim)
  SAME_INT(router)
  SAME_INT(router_bias)
  SAME_INT(router_score_bias)
  SAME_INT(n_group)
  SAME_INT(topk_group)
  SAME_INT(expert_scale_input)
  SAME_INT(expert_layout)
  SAME_INT(multimodal_names)
  SAME_REAL(norm_eps)
  SAME_REAL(rope_theta)
  SAME_REAL(rope_local_theta)
  SAME_REAL(query_pre_attn_scalar)
  SAME_REAL(attn_softcap)
  SAME_REAL(final_softcap)
  SAME_REAL(attn_temp_floor)
  SAME_REAL(attn_temp_scale)
  SAME_REAL(routed_scaling)
  SAME_REAL(router_jitter)
  SAME_REAL(swiglu_limit)
  return same_rope_scaling(x, y);
}

#undef SAME_INT
#undef SAME_REAL
