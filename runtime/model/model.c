/* The ferry_model handle: configuration checks, the name index over the tensor layout
 * (layout.c), and the accounting derived from that layout (parameters, bytes as published,
 * cache bytes and FLOPs, per layer where layers differ). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "runtime/model/model_impl.h"

/* ---- per-layer rules ------------------------------------------------------------------------ */

int ferry__layer_is_moe(const struct ferry_model_config *c, int64_t l) {
  if (c->n_experts <= 0 || l < c->first_dense_layers) return 0;
  return c->moe_layer_step <= 1 || (l + 1) % c->moe_layer_step == 0;
}

int64_t ferry__layer_window(const struct ferry_model_config *c, int64_t l) {
  if (c->sliding_window <= 0) return 0;
  if (c->sliding_pattern > 0 && (l + 1) % c->sliding_pattern == 0) return 0;
  return c->sliding_window;
}

int ferry__layer_rope(const struct ferry_model_config *c, int64_t l) {
  if (c->learned_positions || c->alibi) return 0;
  return !(c->nope_layer_step > 0 && (l + 1) % c->nope_layer_step == 0);
}

int64_t ferry__layer_chunk(const struct ferry_model_config *c, int64_t l) {
  return c->attn_chunk > 0 && ferry__layer_rope(c, l) ? c->attn_chunk : 0;
}

static int family_is_moe(enum ferry_family f) {
  const struct ferry_family_traits *t = ferry__family(f);
  return t && t->moe;
}

/* Families whose config.json keeps a dense FFN size beside the expert size. */
static int has_dense_size(enum ferry_family f) {
  return f == FERRY_FAMILY_QWEN2_MOE || f == FERRY_FAMILY_QWEN3_MOE || f == FERRY_FAMILY_DEEPSEEK_V2 ||
         f == FERRY_FAMILY_DEEPSEEK_V3 || f == FERRY_FAMILY_LLAMA4;
}

/* ---- configuration checks ------------------------------------------------------------- */

#define CHECK(cond, ...)                      \
  do {                                        \
    if (!(cond)) {                            \
      snprintf(msg, msg_len, __VA_ARGS__);    \
      return 1;                               \
    }                                         \
  } while (0)

#define CHECK_RANGE(field, lo, hi)                                                          \
  CHECK(cfg->field >= (lo) && cfg->field <= (hi), "%s = %lld, expected %lld..%lld", #field, \
        (long long)cfg->field, (long long)(lo), (long long)(hi))

#define CHECK_FLAG(field) CHECK(cfg->field == 0 || cfg->field == 1, "%s = %d, expected 0 or 1", #field, cfg->field)

#define CHECK_NONNEG(field) \
  CHECK(isfinite(cfg->field) && cfg->field >= 0, "%s = %g, expected a number >= 0", #field, cfg->field)

static int check_rope(const struct ferry_model_config *cfg, char *msg, size_t msg_len) {
  const struct ferry_rope_scaling *r = &cfg->rope_scaling;
  CHECK((int)r->type >= FERRY_ROPE_DEFAULT && (int)r->type <= FERRY_ROPE_LONGROPE, "rope_scaling.type = %d is unknown",
        (int)r->type);
  CHECK(isfinite(r->factor) && r->factor >= 0 && isfinite(r->low_freq_factor) && isfinite(r->high_freq_factor) &&
            isfinite(r->beta_fast) && isfinite(r->beta_slow) && isfinite(r->mscale) && isfinite(r->mscale_all_dim) &&
            isfinite(r->attention_factor) && isfinite(r->short_mscale) && isfinite(r->long_mscale),
        "rope_scaling has a field that is not a finite number");
  CHECK(r->original_max_position >= 0 && r->original_max_position <= FERRY__MODEL_MAX_POSITION,
        "rope_scaling.original_max_position = %lld out of range", (long long)r->original_max_position);
  if (r->type == FERRY_ROPE_DEFAULT) return 0;
  CHECK(r->factor > 0 || r->type == FERRY_ROPE_LONGROPE, "rope_scaling.factor = %g, expected > 0 for rope type %d",
        r->factor, (int)r->type);
  if (r->type == FERRY_ROPE_LLAMA3)
    CHECK(r->low_freq_factor > 0 && r->high_freq_factor >= r->low_freq_factor && r->original_max_position > 0,
          "llama3 rope scaling needs 0 < low_freq_factor <= high_freq_factor and original_max_position_embeddings");
  if (r->type == FERRY_ROPE_LONGROPE) {
    int64_t dim = cfg->rotary_dim ? cfg->rotary_dim : cfg->head_dim;
    CHECK(r->n_factors == dim / 2 && r->n_factors <= FERRY_ROPE_MAX_FACTORS,
          "longrope needs short_factor and long_factor of %lld entries (rotary dim / 2), has %d", (long long)(dim / 2),
          r->n_factors);
    for (int i = 0; i < r->n_factors; i++)
      CHECK(isfinite(r->short_factor[i]) && r->short_factor[i] > 0 && isfinite(r->long_factor[i]) && r->long_factor[i] > 0,
            "longrope factor %d is not a positive number", i);
  }
  return 0;
}

static int check_moe(const struct ferry_model_config *cfg, char *msg, size_t msg_len) {
  const enum ferry_family f = cfg->family;
  const char *fam = ferry_family_name(f);
  CHECK_RANGE(n_experts, 1, FERRY__MODEL_MAX_EXPERTS);
  CHECK_RANGE(experts_per_token, 1, cfg->n_experts);
  CHECK_RANGE(expert_intermediate, 1, 4 * (int64_t)FERRY__MODEL_MAX_DIM);
  CHECK_RANGE(first_dense_layers, 0, cfg->n_layers);
  CHECK_RANGE(moe_layer_step, 0, FERRY__MODEL_MAX_LAYERS);
  CHECK(has_dense_size(f) || cfg->intermediate == 0,
        "family %s has no dense FFN: intermediate must be 0 (the expert size is expert_intermediate)", fam);
  int dense_layers = 0;
  for (int64_t l = 0; l < cfg->n_layers; l++) dense_layers += !ferry__layer_is_moe(cfg, l);
  CHECK(!dense_layers || cfg->intermediate >= 1,
        "%d dense layer(s) in an MoE model need intermediate >= 1 (the dense FFN size)", dense_layers);
  CHECK(dense_layers < cfg->n_layers, "an MoE model needs at least one MoE layer");
  const int shared_ok = f == FERRY_FAMILY_QWEN2_MOE || f == FERRY_FAMILY_DEEPSEEK_V2 || f == FERRY_FAMILY_DEEPSEEK_V3 ||
                        f == FERRY_FAMILY_LLAMA4;
  if (shared_ok) {
    CHECK_RANGE(n_shared_experts, 0, 64);
    CHECK_RANGE(shared_intermediate, 0, 4 * (int64_t)FERRY__MODEL_MAX_DIM);
    CHECK((cfg->n_shared_experts > 0) == (cfg->shared_intermediate > 0),
          "n_shared_experts = %lld and shared_intermediate = %lld must be both zero or both positive",
          (long long)cfg->n_shared_experts, (long long)cfg->shared_intermediate);
    CHECK(!cfg->shared_expert_gate || (cfg->n_shared_experts > 0 && f == FERRY_FAMILY_QWEN2_MOE),
          "shared_expert_gate = 1 needs a Qwen2-MoE shared expert");
  } else {
    CHECK(cfg->n_shared_experts == 0 && cfg->shared_intermediate == 0 && !cfg->shared_expert_gate,
          "family %s has no shared expert: n_shared_experts, shared_intermediate and shared_expert_gate must be 0", fam);
  }
  CHECK((int)cfg->router >= FERRY_ROUTER_SOFTMAX_TOPK && (int)cfg->router <= FERRY_ROUTER_SPARSEMIXER,
        "router = %d is unknown", (int)cfg->router);
  CHECK(cfg->router != FERRY_ROUTER_SPARSEMIXER || cfg->experts_per_token == 2, "sparsemixer routing picks 2 experts");
  CHECK_RANGE(n_group, 0, cfg->n_experts);
  if (cfg->n_group > 1) {
    CHECK(cfg->n_experts % cfg->n_group == 0, "n_group = %lld does not divide n_experts = %lld", (long long)cfg->n_group,
          (long long)cfg->n_experts);
    CHECK_RANGE(topk_group, 1, cfg->n_group);
    CHECK(cfg->topk_group * (cfg->n_experts / cfg->n_group) >= cfg->experts_per_token,
          "topk_group x experts per group is below experts_per_token");
  }
  CHECK_NONNEG(routed_scaling);
  CHECK_NONNEG(router_jitter);
  CHECK_NONNEG(swiglu_limit);
  CHECK((int)cfg->expert_layout >= FERRY_EXPERTS_SPLIT && (int)cfg->expert_layout <= FERRY_EXPERTS_FUSED_INTERLEAVED,
        "expert_layout = %d is unknown", (int)cfg->expert_layout);
  CHECK(cfg->expert_layout == FERRY_EXPERTS_SPLIT || f == FERRY_FAMILY_LLAMA4 || f == FERRY_FAMILY_GPT_OSS,
        "family %s stores each expert's gate, up and down apart (expert_layout = FERRY_EXPERTS_SPLIT)", fam);
  CHECK(cfg->swiglu_limit == 0 || cfg->expert_layout == FERRY_EXPERTS_FUSED_INTERLEAVED,
        "swiglu_limit is gpt-oss's clamped SwiGLU (expert_layout FUSED_INTERLEAVED)");
  return 0;
}

static int check_attention(const struct ferry_model_config *cfg, char *msg, size_t msg_len) {
  CHECK_RANGE(sliding_window, 0, FERRY__MODEL_MAX_POSITION);
  CHECK_RANGE(sliding_pattern, 0, FERRY__MODEL_MAX_LAYERS);
  CHECK_RANGE(attn_chunk, 0, FERRY__MODEL_MAX_POSITION);
  CHECK_RANGE(nope_layer_step, 0, FERRY__MODEL_MAX_LAYERS);
  CHECK_NONNEG(query_pre_attn_scalar);
  CHECK_NONNEG(attn_softcap);
  CHECK_NONNEG(final_softcap);
  CHECK_NONNEG(attn_temp_floor);
  CHECK_NONNEG(attn_temp_scale);
  CHECK_NONNEG(rope_local_theta);
  CHECK(cfg->qk_norm >= FERRY_QK_NORM_NONE && cfg->qk_norm <= FERRY_QK_NORM_L2, "qk_norm = %d, expected 0..3",
        cfg->qk_norm);
  CHECK_FLAG(rope_interleaved);
  CHECK_FLAG(fused_qkv);
  CHECK_FLAG(alibi);
  CHECK_FLAG(attn_sinks);
  CHECK_RANGE(rotary_dim, 0, cfg->head_dim);
  CHECK(cfg->rotary_dim % 2 == 0, "rotary_dim = %lld must be even", (long long)cfg->rotary_dim);
  CHECK(cfg->head_dim % 2 == 0 || cfg->learned_positions || cfg->alibi || cfg->rotary_dim,
        "head_dim = %lld must be even for RoPE", (long long)cfg->head_dim);
  if (cfg->kv_lora_rank) {
    CHECK_RANGE(kv_lora_rank, 1, FERRY__MODEL_MAX_DIM);
    CHECK_RANGE(q_lora_rank, 0, FERRY__MODEL_MAX_DIM);
    CHECK_RANGE(qk_nope_dim, 1, FERRY__MODEL_MAX_DIM);
    CHECK_RANGE(qk_rope_dim, 2, FERRY__MODEL_MAX_DIM);
    CHECK_RANGE(v_head_dim, 1, FERRY__MODEL_MAX_DIM);
    CHECK(cfg->qk_rope_dim % 2 == 0, "qk_rope_dim must be even");
    CHECK(cfg->head_dim == cfg->qk_nope_dim + cfg->qk_rope_dim,
          "MLA: head_dim = %lld must be qk_nope_dim + qk_rope_dim = %lld", (long long)cfg->head_dim,
          (long long)(cfg->qk_nope_dim + cfg->qk_rope_dim));
    CHECK(cfg->n_kv_heads == cfg->n_heads, "MLA: n_kv_heads must equal n_heads");
    CHECK(cfg->rotary_dim == 0 || cfg->rotary_dim == cfg->qk_rope_dim, "MLA: rotary_dim is qk_rope_dim");
    CHECK(!cfg->qkv_bias && !cfg->attn_out_bias && !cfg->qk_norm && !cfg->fused_qkv && !cfg->attn_sinks,
          "MLA has no q/k/v biases, q/k norms, fused qkv or sinks");
  } else {
    CHECK(cfg->q_lora_rank == 0 && cfg->qk_nope_dim == 0 && cfg->qk_rope_dim == 0 && cfg->v_head_dim == 0,
          "q_lora_rank, qk_nope_dim, qk_rope_dim and v_head_dim need kv_lora_rank (MLA)");
  }
  return check_rope(cfg, msg, msg_len);
}

/* What each family's math is; a configuration that claims another is not that family. */
static int check_family(const struct ferry_model_config *cfg, char *msg, size_t msg_len) {
  const enum ferry_family f = cfg->family;
  const char *fam = ferry_family_name(f);
  const int layer_norm = f == FERRY_FAMILY_OPT || f == FERRY_FAMILY_PHIMOE || f == FERRY_FAMILY_GPT_NEOX ||
                         f == FERRY_FAMILY_BLOOM || f == FERRY_FAMILY_GPTJ;
  const int gemma = f == FERRY_FAMILY_GEMMA2 || f == FERRY_FAMILY_GEMMA3;
  const int fused = f == FERRY_FAMILY_GPT_NEOX || f == FERRY_FAMILY_BLOOM;
  const int mla = f == FERRY_FAMILY_DEEPSEEK_V2 || f == FERRY_FAMILY_DEEPSEEK_V3;
  CHECK(cfg->norm == (layer_norm ? FERRY_NORM_LAYER : FERRY_NORM_RMS), "family %s uses %s", fam,
        layer_norm ? "LayerNorm (norm = FERRY_NORM_LAYER)" : "RMSNorm (norm = FERRY_NORM_RMS)");
  CHECK(cfg->learned_positions == (f == FERRY_FAMILY_OPT), "learned_positions = 1 is OPT's and only OPT's");
  CHECK(cfg->alibi == (f == FERRY_FAMILY_BLOOM), "alibi = 1 is BLOOM's and only BLOOM's");
  CHECK(cfg->embed_norm == (f == FERRY_FAMILY_BLOOM), "embed_norm = 1 is BLOOM's and only BLOOM's");
  CHECK(cfg->fused_qkv == fused, "family %s %s a fused query_key_value (fused_qkv = %d)", fam, fused ? "has" : "has no",
        fused);
  CHECK(!cfg->parallel_residual || f == FERRY_FAMILY_GPT_NEOX || f == FERRY_FAMILY_GPTJ,
        "parallel_residual is GPT-NeoX's and GPT-J's");
  CHECK(cfg->parallel_shared_norm == (f == FERRY_FAMILY_GPTJ), "parallel_shared_norm = 1 is GPT-J's and only GPT-J's");
  CHECK(!cfg->parallel_shared_norm || cfg->parallel_residual, "parallel_shared_norm needs parallel_residual");
  CHECK((cfg->kv_lora_rank > 0) == mla, "family %s %s MLA (kv_lora_rank)", fam, mla ? "needs" : "has no");
  CHECK(!cfg->norm_unit_offset == !gemma && !cfg->scale_embeddings == !gemma && !cfg->sandwich_norms == !gemma,
        "norm_unit_offset, scale_embeddings and sandwich_norms are Gemma's and set together");
  CHECK(!cfg->attn_sinks || f == FERRY_FAMILY_GPT_OSS, "attn_sinks is gpt-oss's");
  CHECK(!cfg->lm_head_bias || f == FERRY_FAMILY_PHIMOE || f == FERRY_FAMILY_GPTJ, "lm_head_bias is Phi-3.5-MoE's and GPT-J's");
  CHECK(!cfg->router_bias || f == FERRY_FAMILY_GPT_OSS, "router_bias is gpt-oss's");
  CHECK(!cfg->router_score_bias || f == FERRY_FAMILY_DEEPSEEK_V3, "router_score_bias is DeepSeek-V3's");
  CHECK(!cfg->expert_scale_input || f == FERRY_FAMILY_LLAMA4, "expert_scale_input is Llama 4's");
  CHECK((cfg->attn_chunk == 0 && cfg->nope_layer_step == 0 && cfg->attn_temp_floor == 0) || f == FERRY_FAMILY_LLAMA4,
        "attn_chunk, nope_layer_step and attention temperature tuning are Llama 4's");
  CHECK(cfg->rope_local_theta == 0 || f == FERRY_FAMILY_GEMMA3, "rope_local_theta is Gemma 3's");
  CHECK(cfg->qk_norm != FERRY_QK_NORM_FULL || f == FERRY_FAMILY_OLMOE, "qk_norm FULL is OLMoE's");
  CHECK(cfg->qk_norm != FERRY_QK_NORM_L2 || f == FERRY_FAMILY_LLAMA4, "qk_norm L2 is Llama 4's");
  CHECK(cfg->qk_norm != FERRY_QK_NORM_HEAD || f == FERRY_FAMILY_QWEN3 || f == FERRY_FAMILY_QWEN3_MOE ||
            f == FERRY_FAMILY_GEMMA3,
        "qk_norm HEAD is Qwen3's and Gemma 3's");
  switch (f) {
    case FERRY_FAMILY_OPT: CHECK(cfg->act == FERRY_ACT_RELU || cfg->act == FERRY_ACT_GELU, "family opt uses ReLU or GELU"); break;
    case FERRY_FAMILY_GEMMA2:
    case FERRY_FAMILY_GEMMA3: CHECK(cfg->act == FERRY_ACT_GEGLU, "family %s uses GeGLU (act = FERRY_ACT_GEGLU)", fam); break;
    case FERRY_FAMILY_GPT_NEOX:
    case FERRY_FAMILY_BLOOM:
    case FERRY_FAMILY_GPTJ:
      CHECK(cfg->act == FERRY_ACT_GELU || cfg->act == FERRY_ACT_GELU_TANH, "family %s uses a GELU MLP", fam);
      break;
    default: CHECK(cfg->act == FERRY_ACT_SWIGLU, "family %s uses a SwiGLU FFN (act = FERRY_ACT_SWIGLU)", fam); break;
  }
  CHECK(cfg->ffn_bias == 0 || f == FERRY_FAMILY_OPT || fused || f == FERRY_FAMILY_GPTJ,
        "family %s has no FFN biases (ffn_bias = 0)", fam);
  if (f == FERRY_FAMILY_OPT || f == FERRY_FAMILY_BLOOM) {
    CHECK(isfinite(cfg->rope_theta) && cfg->rope_theta >= 0, "rope_theta = %g, expected >= 0", cfg->rope_theta);
    CHECK(cfg->rope_scaling.type == FERRY_ROPE_DEFAULT, "family %s has no RoPE to scale", fam);
  } else {
    CHECK(isfinite(cfg->rope_theta) && cfg->rope_theta > 0, "rope_theta = %g, expected > 0", cfg->rope_theta);
  }
  if (f == FERRY_FAMILY_OPT) CHECK(cfg->max_position <= FERRY__MODEL_MAX_POSITION - 2, "max_position too large");
  CHECK(cfg->rotary_dim == 0 || f == FERRY_FAMILY_GPT_NEOX || f == FERRY_FAMILY_GPTJ || mla,
        "rotary_dim (partial rotary) is GPT-NeoX's and GPT-J's");
  CHECK(cfg->n_kv_heads == cfg->n_heads || !fused, "family %s has as many key/value heads as heads", fam);
  return 0;
}

static int check_quant(const struct ferry_model_config *cfg, char *msg, size_t msg_len) {
  const struct ferry_ckpt_quant_config *q = &cfg->quant;
  CHECK((int)q->kind >= FERRY_CKPT_NONE && (int)q->kind <= FERRY_CKPT_COMPRESSED, "quant.kind = %d is unknown",
        (int)q->kind);
  if (q->kind == FERRY_CKPT_NONE) return 0;
  CHECK(q->bits >= 2 && q->bits <= 8, "quant.bits = %d, expected 2..8", q->bits);
  CHECK(q->group_size >= 0 && q->group_size <= FERRY__MODEL_MAX_DIM, "quant.group_size = %lld out of range",
        (long long)q->group_size);
  CHECK(q->block[0] >= 0 && q->block[1] >= 0 && q->block[0] <= 65536 && q->block[1] <= 65536,
        "quant.block out of range");
  return 0;
}

int ferry__model_config_check(const struct ferry_model_config *cfg, char *msg, size_t msg_len) {
  CHECK(memchr(cfg->name, '\0', sizeof cfg->name) != NULL, "name is not NUL-terminated");
  CHECK(ferry__family(cfg->family) != NULL, "family = %d is not a known family", (int)cfg->family);
  const int moe = family_is_moe(cfg->family);
  CHECK_RANGE(n_layers, 1, FERRY__MODEL_MAX_LAYERS);
  CHECK_RANGE(hidden, 1, FERRY__MODEL_MAX_DIM);
  CHECK_RANGE(n_heads, 1, FERRY__MODEL_MAX_HEADS);
  CHECK_RANGE(n_kv_heads, 1, cfg->n_heads);
  CHECK(cfg->n_heads % cfg->n_kv_heads == 0, "n_heads = %lld is not a multiple of n_kv_heads = %lld",
        (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
  CHECK_RANGE(head_dim, 1, FERRY__MODEL_MAX_DIM);
  CHECK(cfg->n_heads * cfg->head_dim <= 4 * (int64_t)FERRY__MODEL_MAX_DIM,
        "n_heads x head_dim = %lld, expected at most %lld", (long long)(cfg->n_heads * cfg->head_dim),
        4 * (long long)FERRY__MODEL_MAX_DIM);
  CHECK_RANGE(vocab, 1, FERRY__MODEL_MAX_VOCAB);
  CHECK_RANGE(max_position, 1, FERRY__MODEL_MAX_POSITION);
  CHECK_RANGE(intermediate, 0, 4 * (int64_t)FERRY__MODEL_MAX_DIM);
  CHECK_FLAG(shared_expert_gate);
  CHECK_FLAG(norm_topk_prob);
  CHECK_FLAG(tied_embeddings);
  CHECK_FLAG(qkv_bias);
  CHECK_FLAG(attn_out_bias);
  CHECK_FLAG(ffn_bias);
  CHECK_FLAG(learned_positions);
  CHECK_FLAG(norm_unit_offset);
  CHECK_FLAG(sandwich_norms);
  CHECK_FLAG(scale_embeddings);
  CHECK_FLAG(parallel_residual);
  CHECK_FLAG(parallel_shared_norm);
  CHECK_FLAG(embed_norm);
  CHECK_FLAG(lm_head_bias);
  CHECK_FLAG(router_bias);
  CHECK_FLAG(router_score_bias);
  CHECK_FLAG(expert_scale_input);
  CHECK_FLAG(multimodal_names);
  CHECK(!cfg->lm_head_bias || !cfg->tied_embeddings, "lm_head_bias needs an untied head");
  if (ferry__vision_check(&cfg->vision, msg, msg_len)) return 1;
  CHECK(ferry_dtype_size(cfg->dtype) > 0, "dtype = %d is not a known dtype", (int)cfg->dtype);
  CHECK(isfinite(cfg->norm_eps) && cfg->norm_eps > 0 && cfg->norm_eps < 1,
        "norm_eps = %g, expected a number in (0, 1)", cfg->norm_eps);
  if (moe) {
    if (check_moe(cfg, msg, msg_len)) return 1;
  } else {
    CHECK(cfg->n_experts == 0 && cfg->experts_per_token == 0 && cfg->expert_intermediate == 0 &&
              cfg->n_shared_experts == 0 && cfg->shared_intermediate == 0 && !cfg->shared_expert_gate,
          "family %s is dense: n_experts, experts_per_token, expert_intermediate and the shared expert must be 0",
          ferry_family_name(cfg->family));
    CHECK(cfg->first_dense_layers == 0 && cfg->moe_layer_step == 0 && cfg->router == FERRY_ROUTER_SOFTMAX_TOPK &&
              cfg->expert_layout == FERRY_EXPERTS_SPLIT && cfg->n_group == 0 && cfg->routed_scaling == 0,
          "family %s is dense: routing fields must be 0", ferry_family_name(cfg->family));
    CHECK(cfg->intermediate >= 1, "intermediate = %lld, expected at least 1 for a dense model",
          (long long)cfg->intermediate);
  }
  if (check_attention(cfg, msg, msg_len) || check_family(cfg, msg, msg_len) || check_quant(cfg, msg, msg_len))
    return 1;
  CHECK(ferry__model_tensor_cap(cfg) <= FERRY__MODEL_MAX_TENSORS, "n_layers x n_experts gives more than %d tensors",
        FERRY__MODEL_MAX_TENSORS);
  return 0;
}

/* ---- name index ------------------------------------------------------------------------ */

static int cmp_name(const void *a, const void *b, void *arg) {
  const struct ferry_tensor_desc *t = arg;
  const struct ferry_tensor_desc *x = &t[*(const size_t *)a], *y = &t[*(const size_t *)b];
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return x->slice < y->slice ? -1 : x->slice > y->slice;
}

static ferry_status build_index(ferry_model *m) {
  m->by_name = ferry__reallocarray(NULL, m->n_tensors, sizeof *m->by_name);
  if (!m->by_name) return ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory for the name index", m->cfg.name);
  for (size_t i = 0; i < m->n_tensors; i++) m->by_name[i] = i;
  qsort_r(m->by_name, m->n_tensors, sizeof *m->by_name, cmp_name, m->tensors);
  for (size_t i = 1; i < m->n_tensors; i++)
    if (!cmp_name(&m->by_name[i - 1], &m->by_name[i], m->tensors))
      return ferry__fail(FERRY_ERR_INTERNAL, "model layout: duplicate tensor name %s",
                         m->tensors[m->by_name[i]].name);
  return FERRY_OK;
}

/* ---- accounting ------------------------------------------------------------------------- */

/* Cache elements one token adds to one layer: K and V, or MLA's compressed latent. */
static uint64_t layer_kv_elems_per_token(const struct ferry_model_config *c) {
  if (c->kv_lora_rank) return (uint64_t)(c->kv_lora_rank + c->qk_rope_dim);
  return 2u * (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
}

/* ... in bytes, in the model's default KV format (what a run uses without --kv-dtype). */
static uint64_t layer_kv_per_token(const struct ferry_model_config *c) {
  return ferry_kv_format_row_bytes(ferry__kv_format_default(c->dtype), layer_kv_elems_per_token(c));
}

static ferry_status account(ferry_model *m) {
  const struct ferry_model_config *c = &m->cfg;
  struct ferry_model_accounting *a = &m->acc;
  memset(a, 0, sizeof *a);
  const int64_t L = c->n_layers;
  m->layer_all = ferry__calloc((size_t)L, sizeof *m->layer_all);
  m->layer_dense = ferry__calloc((size_t)L, sizeof *m->layer_dense);
  uint64_t *bytes_all = ferry__calloc((size_t)L, sizeof *bytes_all), *bytes_dense = ferry__calloc((size_t)L, sizeof *bytes_dense);
  if (!m->layer_all || !m->layer_dense || !bytes_all || !bytes_dense) {
    ferry_free(bytes_all);
    ferry_free(bytes_dense);
    return ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory for the accounting", c->name);
  }
  double matmul = 0;
  uint64_t embed_table = 0, bytes_total = 0;
  int64_t first_moe = -1;
  for (int64_t l = 0; l < L && first_moe < 0; l++)
    if (ferry__layer_is_moe(c, l)) first_moe = l;
  for (size_t i = 0; i < m->n_tensors; i++) {
    const struct ferry_tensor_desc *t = &m->tensors[i];
    a->params_total += t->numel;
    bytes_total += t->bytes;
    if (t->role == FERRY_ROLE_EMBED || t->role == FERRY_ROLE_POS_EMBED) {
      a->params_embed += t->numel;
      a->bytes_embed += t->bytes;
      embed_table += t->numel;
      continue;
    }
    if (t->layer < 0) {
      a->params_head += t->numel;
      a->bytes_head += t->bytes;
    } else {
      m->layer_all[t->layer] += t->numel;
      bytes_all[t->layer] += t->bytes;
      if (t->expert < 0) {
        m->layer_dense[t->layer] += t->numel;
        bytes_dense[t->layer] += t->bytes;
      }
      if (t->expert == 0 && t->layer == first_moe) {
        a->params_expert += t->numel;
        a->bytes_expert += t->bytes;
      }
    }
    if (t->ndim == 2 && t->role != FERRY_ROLE_EMBED) {
      /* Each token goes through experts_per_token of the n_experts routed experts. */
      if (t->expert >= 0)
        matmul += (double)t->numel * (double)c->experts_per_token / (double)c->n_experts;
      else
        matmul += (double)t->numel;
    }
  }
  if (c->tied_embeddings) matmul += (double)c->vocab * (double)c->hidden;
  m->matmul_params_active = matmul;
  uint64_t unrouted = 0;
  for (int64_t l = 0; l < L; l++) {
    if (m->layer_all[l] > a->params_layer) a->params_layer = m->layer_all[l];
    if (m->layer_dense[l] > a->params_layer_dense) a->params_layer_dense = m->layer_dense[l];
    if (bytes_all[l] > a->bytes_layer) a->bytes_layer = bytes_all[l];
    if (bytes_dense[l] > a->bytes_layer_dense) a->bytes_layer_dense = bytes_dense[l];
    if (ferry__layer_is_moe(c, l)) {
      a->n_moe_layers++;
      unrouted += (uint64_t)(c->n_experts - c->experts_per_token) * a->params_expert;
    }
    struct ferry_layer_info li;
    ferry_model_layer_info(m, l, &li);
    a->kv_bytes_per_token += li.kv_bytes_per_token;
  }
  a->params_active = a->params_total - unrouted;
  /* The table is only looked up, one row a token; a tied table still serves as the head. */
  a->params_active_no_embed = a->params_active - (c->tied_embeddings ? 0 : embed_table);
  a->params_extra = ferry__vision_params(&c->vision, c->hidden);
  a->params_total += a->params_extra;
  a->bytes_total = bytes_total + a->params_extra * ferry_dtype_size(c->dtype);
  ferry_free(bytes_all);
  ferry_free(bytes_dense);
  return FERRY_OK;
}

/* ---- handle ------------------------------------------------------------------------------ */

ferry_status ferry_model_create(ferry_model **out, const struct ferry_model_config *config) {
  if (!out || !config) return ferry__fail(FERRY_ERR_INVALID, "ferry_model_create: NULL argument");
  *out = NULL;
  char msg[512];
  if (ferry__model_config_check(config, msg, sizeof msg))
    return ferry__fail(FERRY_ERR_INVALID, "model %.64s: %s", memchr(config->name, 0, sizeof config->name) ? config->name : "?", msg);
  ferry_model *m = ferry__calloc(1, sizeof *m);
  if (!m) return ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory", config->name);
  m->cfg = *config;
  ferry_status st = ferry__model_build_layout(m);
  if (st == FERRY_OK) st = build_index(m);
  if (st == FERRY_OK) st = account(m);
  if (st != FERRY_OK) {
    ferry_model_close(m);
    return st;
  }
  *out = m;
  return FERRY_OK;
}

void ferry_model_close(ferry_model *model) {
  if (!model) return;
  ferry_free(model->tensors);
  ferry_free(model->by_name);
  ferry_free(model->layer_first);
  ferry_free(model->layer_count);
  ferry_free(model->expert_first);
  ferry_free(model->layer_all);
  ferry_free(model->layer_dense);
  ferry_free(model);
}

ferry_status ferry_model_open(ferry_model **out, const char *name_or_path) {
  if (!out || !name_or_path) return ferry__fail(FERRY_ERR_INVALID, "ferry_model_open: NULL argument");
  *out = NULL;
  /* An exact catalogue name first; then a file or folder of that name (a downloaded
   * "Qwen3-30B-A3B" folder is the user's model); then a name or Hugging Face id in any case. */
  const struct ferry_model_config *preset = NULL;
  for (size_t i = 0; i < ferry_model_preset_count() && !preset; i++)
    if (!strcmp(ferry_model_preset_name(i), name_or_path)) preset = ferry__model_preset_find(name_or_path);
  if (!preset && !ferry__is_file(name_or_path) && !ferry__is_dir(name_or_path))
    preset = ferry__model_preset_find(name_or_path);
  if (preset) return ferry_model_create(out, preset);
  struct ferry_model_config cfg;
  ferry_status st = ferry__model_read_hf_config(name_or_path, &cfg);
  if (st != FERRY_OK) return st;
  return ferry_model_create(out, &cfg);
}

const struct ferry_model_config *ferry_model_get_config(const ferry_model *model) {
  return model ? &model->cfg : NULL;
}

size_t ferry_model_tensor_count(const ferry_model *model) { return model ? model->n_tensors : 0; }

const struct ferry_tensor_desc *ferry_model_tensor(const ferry_model *model, size_t i) {
  return model && i < model->n_tensors ? &model->tensors[i] : NULL;
}

int64_t ferry_model_find_tensor(const ferry_model *model, const char *name) {
  if (!model || !name) return -1;
  size_t lo = 0, hi = model->n_tensors;
  /* the first entry of that name: a fused checkpoint tensor answers with its slice 0 */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(model->tensors[model->by_name[mid]].name, name) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < model->n_tensors && !strcmp(model->tensors[model->by_name[lo]].name, name))
    return (int64_t)model->by_name[lo];
  return -1;
}

ferry_status ferry_model_layer_span(const ferry_model *model, int64_t layer, size_t *first, size_t *count) {
  if (!model || !first || !count) return FERRY_ERR_INVALID;
  if (layer < 0 || layer >= model->cfg.n_layers)
    return ferry__fail(FERRY_ERR_RANGE, "model %s: layer %lld out of range 0..%lld", model->cfg.name,
                       (long long)layer, (long long)model->cfg.n_layers - 1);
  *first = model->layer_first[layer];
  *count = model->layer_count[layer];
  return FERRY_OK;
}

ferry_status ferry_model_expert_span(const ferry_model *model, int64_t layer, int64_t expert, size_t *first,
                                     size_t *count) {
  if (!model || !first || !count) return FERRY_ERR_INVALID;
  const struct ferry_model_config *c = &model->cfg;
  if (layer < 0 || layer >= c->n_layers || expert < 0 || expert >= c->n_experts)
    return ferry__fail(FERRY_ERR_RANGE, "model %s: layer %lld expert %lld out of range (%lld layers, %lld experts)",
                       c->name, (long long)layer, (long long)expert, (long long)c->n_layers,
                       (long long)c->n_experts);
  if (!ferry__layer_is_moe(c, layer))
    return ferry__fail(FERRY_ERR_RANGE, "model %s: layer %lld is a dense layer without routed experts", c->name,
                       (long long)layer);
  *first = model->expert_first[(size_t)layer * (size_t)c->n_experts + (size_t)expert];
  *count = model->expert_tensors;
  return FERRY_OK;
}

void ferry_model_get_accounting(const ferry_model *model, struct ferry_model_accounting *out) {
  if (!out) return;
  if (!model) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = model->acc;
}

uint64_t ferry_model_kv_bytes(const ferry_model *model, int64_t tokens, enum ferry_kv_format kv_format) {
  if (!model || tokens <= 0) return 0;
  const struct ferry_model_config *c = &model->cfg;
  const uint64_t per = ferry_kv_format_row_bytes(ferry_model_kv_format(model, kv_format), layer_kv_elems_per_token(c));
  uint64_t sum = 0;
  for (int64_t l = 0; l < c->n_layers; l++) {
    struct ferry_layer_info li;
    ferry_model_layer_info(model, l, &li);
    /* a windowed or chunked layer never needs more than the tokens one query can see */
    int64_t rows = li.kv_visible > 0 && li.kv_visible < tokens ? li.kv_visible : tokens;
    sum += per * (uint64_t)rows;
  }
  return sum;
}

ferry_status ferry_model_layer_info(const ferry_model *model, int64_t layer, struct ferry_layer_info *out) {
  if (!model || !out) return FERRY_ERR_INVALID;
  const struct ferry_model_config *c = &model->cfg;
  if (layer < 0 || layer >= c->n_layers)
    return ferry__fail(FERRY_ERR_RANGE, "model %s: layer %lld out of range", c->name, (long long)layer);
  memset(out, 0, sizeof *out);
  out->moe = ferry__layer_is_moe(c, layer);
  out->window = ferry__layer_window(c, layer);
  out->chunk = ferry__layer_chunk(c, layer);
  out->rope = ferry__layer_rope(c, layer);
  out->rope_local = c->family == FERRY_FAMILY_GEMMA3 && out->window > 0;
  out->kv_bytes_per_token = layer_kv_per_token(c);
  out->kv_visible = out->window ? out->window : out->chunk;
  return FERRY_OK;
}

ferry_status ferry_model_layer_params(const ferry_model *model, int64_t layer, uint64_t *all, uint64_t *dense) {
  if (!model) return FERRY_ERR_INVALID;
  if (layer < 0 || layer >= model->cfg.n_layers)
    return ferry__fail(FERRY_ERR_RANGE, "model %s: layer %lld out of range", model->cfg.name, (long long)layer);
  if (all) *all = model->layer_all[layer];
  if (dense) *dense = model->layer_dense[layer];
  return FERRY_OK;
}


double ferry_model_matmul_params_active(const ferry_model *model) {
  return model ? model->matmul_params_active : 0;
}

/* Attention FLOPs per earlier token seen, in one layer: q.k and p.v. MLA attends in the
 * compressed space (queries absorbed into kv_lora_rank + rope dims, values kv_lora_rank). */
static double attn_flops_per_ctx(const struct ferry_model_config *c) {
  if (c->kv_lora_rank)
    return 2.0 * (double)c->n_heads * (double)(2 * c->kv_lora_rank + c->qk_rope_dim);
  return 4.0 * (double)c->n_heads * (double)c->head_dim;
}

/* Earlier tokens a query at position `ctx` sees in a layer that sees at most `vis` tokens
 * (itself included; 0 = unbounded), or chunked by `chunk`. */
static double seen(int64_t ctx, int64_t window, int64_t chunk) {
  if (window > 0 && ctx > window - 1) return (double)(window - 1);
  if (chunk > 0) return (double)(ctx % chunk);
  return (double)ctx;
}

/* Sum over positions 0..p-1 of seen(). */
static double seen_sum(int64_t p, int64_t window, int64_t chunk) {
  const double P = (double)p;
  if (window > 0 && p - 1 > window - 1) {
    const double w = (double)(window - 1);
    return w * (w + 1) / 2 + (P - 1 - w) * w;
  }
  if (chunk > 0) {
    const double full = (double)(p / chunk), c = (double)chunk, r = (double)(p % chunk);
    return full * c * (c - 1) / 2 + r * (r - 1) / 2;
  }
  return P * (P - 1) / 2;
}

double ferry_model_flops_per_token(const ferry_model *model, int64_t context_len) {
  if (!model) return 0;
  if (context_len < 0) context_len = 0;
  const struct ferry_model_config *c = &model->cfg;
  double attn = 0;
  for (int64_t l = 0; l < c->n_layers; l++)
    attn += seen(context_len, ferry__layer_window(c, l), ferry__layer_chunk(c, l));
  return 2.0 * model->matmul_params_active + attn_flops_per_ctx(c) * attn;
}

double ferry_model_flops_prefill(const ferry_model *model, int64_t prompt_len) {
  if (!model || prompt_len <= 0) return 0;
  const struct ferry_model_config *c = &model->cfg;
  double attn = 0;
  for (int64_t l = 0; l < c->n_layers; l++)
    attn += seen_sum(prompt_len, ferry__layer_window(c, l), ferry__layer_chunk(c, l));
  return (double)prompt_len * 2.0 * model->matmul_params_active + attn_flops_per_ctx(c) * attn;
}

int ferry_model_is_moe(const ferry_model *model) { return model && model->cfg.n_experts > 0; }
