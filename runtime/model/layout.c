/* The tensor layout of every family: Hugging Face names and shapes in file order (embeddings,
 * per layer its dense part then each routed expert's tensors, final norm and head), with the
 * bytes each tensor has as published (its dtype, or the checkpoint's quantized format). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "runtime/model/model_impl.h"

struct builder {
  ferry_model *m;
  size_t cap;
  int32_t layer, expert;
  char prefix[64]; /* "model.layers.3." etc. */
};

static int div_up(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

uint64_t ferry__quant_bytes(const struct ferry_ckpt_quant_config *q, int64_t rows, int64_t cols) {
  const uint64_t n = (uint64_t)rows, k = (uint64_t)cols, numel = n * k;
  const uint64_t g = q->group_size > 0 ? (uint64_t)q->group_size : k;
  const uint64_t groups = (k + g - 1) / g, bits = q->bits > 0 ? (uint64_t)q->bits : 4;
  switch (q->kind) {
    case FERRY_CKPT_FP8_BLOCK:
      /* fp8 values + one fp32 inverse scale per block */
      return numel + (uint64_t)div_up(rows, q->block[0] ? q->block[0] : 128) *
                         (uint64_t)div_up(cols, q->block[1] ? q->block[1] : 128) * 4;
    case FERRY_CKPT_MXFP4: return numel / 2 + n * ((k + 31) / 32); /* e2m1 pairs + e8m0 per 32 */
    case FERRY_CKPT_GPTQ:
      /* qweight [k*b/32, n] int32, qzeros [groups, n*b/32] int32, scales [groups, n] fp16, g_idx [k] int32 */
      return numel * bits / 8 + groups * ((n * bits + 31) / 32) * 4 + groups * n * 2 + k * 4;
    case FERRY_CKPT_AWQ: return numel * bits / 8 + groups * ((n * bits + 31) / 32) * 4 + groups * n * 2;
    case FERRY_CKPT_COMPRESSED:
      /* weight_packed [n, k*b/32] int32, weight_scale [n, groups] bf16, weight_shape [2] int64,
       * weight_zero_point [n*b/32, groups] int32 when asymmetric */
      return n * ((k * bits + 31) / 32) * 4 + n * groups * 2 + 16 + (q->symmetric ? 0 : ((n * bits + 31) / 32) * groups * 4);
    case FERRY_CKPT_NONE: break;
  }
  return numel * 2;
}

/* Whether a 2-D tensor of this role is stored quantized when the checkpoint is. Routers,
 * embeddings and the head stay in the model dtype in every published format ferry reads. */
static int quantized_role(const struct ferry_model_config *c, enum ferry_tensor_role r) {
  if (c->quant.kind == FERRY_CKPT_NONE) return 0;
  switch (r) {
    case FERRY_ROLE_EXPERT_GATE:
    case FERRY_ROLE_EXPERT_UP:
    case FERRY_ROLE_EXPERT_DOWN:
    case FERRY_ROLE_EXPERT_GATE_UP: return 1;
    case FERRY_ROLE_ATTN_Q:
    case FERRY_ROLE_ATTN_K:
    case FERRY_ROLE_ATTN_V:
    case FERRY_ROLE_ATTN_O:
    case FERRY_ROLE_ATTN_QKV:
    case FERRY_ROLE_FFN_GATE:
    case FERRY_ROLE_FFN_UP:
    case FERRY_ROLE_FFN_DOWN:
    case FERRY_ROLE_SHARED_GATE:
    case FERRY_ROLE_SHARED_UP:
    case FERRY_ROLE_SHARED_DOWN:
    case FERRY_ROLE_MLA_Q_A:
    case FERRY_ROLE_MLA_Q_B:
    case FERRY_ROLE_MLA_KV_A:
    case FERRY_ROLE_MLA_KV_B: return !c->quant.experts_only;
    default: return 0;
  }
}

/* Adds one tensor; s1 == 0 makes it 1-D. slice >= 0 makes it slice `slice` of a checkpoint
 * tensor with n_slices entries along a new leading dimension. */
static ferry_status add_ex(struct builder *b, enum ferry_tensor_role role, int64_t s0, int64_t s1, int32_t slice,
                           int32_t n_slices, int transposed, const char *fmt, va_list ap) {
  ferry_model *m = b->m;
  if (m->n_tensors >= b->cap) return ferry__fail(FERRY_ERR_INTERNAL, "model layout: tensor table overflow");
  struct ferry_tensor_desc *t = &m->tensors[m->n_tensors];
  memset(t, 0, sizeof *t);
  int n = snprintf(t->name, sizeof t->name, "%s", b->prefix);
  int k = n >= 0 && (size_t)n < sizeof t->name ? vsnprintf(t->name + n, sizeof t->name - (size_t)n, fmt, ap) : -1;
  if (k < 0 || (size_t)(n + k) >= sizeof t->name)
    return ferry__fail(FERRY_ERR_INTERNAL, "model layout: tensor name longer than %zu bytes", sizeof t->name - 1);
  const struct ferry_model_config *c = &m->cfg;
  t->role = role;
  t->layer = b->layer;
  t->expert = b->expert;
  t->ndim = s1 > 0 ? 2 : 1;
  t->shape[0] = s0;
  t->shape[1] = s1 > 0 ? s1 : 0;
  t->numel = (uint64_t)s0 * (uint64_t)(s1 > 0 ? s1 : 1);
  t->slice = slice;
  t->n_slices = slice >= 0 ? n_slices : 0;
  t->transposed = transposed;
  t->quantized = t->ndim == 2 && quantized_role(c, role);
  if (t->quantized) {
    /* quantized formats pack [out, in] rows: a transposed bf16 layout is [out, in] once quantized */
    t->bytes = ferry__quant_bytes(&c->quant, transposed ? s1 : s0, transposed ? s0 : s1);
  } else {
    t->bytes = t->numel * ferry_dtype_size(c->dtype);
  }
  m->n_tensors++;
  return FERRY_OK;
}

static ferry_status add(struct builder *b, enum ferry_tensor_role role, int64_t s0, int64_t s1, const char *fmt, ...)
    FERRY_PRINTF(5, 6);
static ferry_status add(struct builder *b, enum ferry_tensor_role role, int64_t s0, int64_t s1, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ferry_status st = add_ex(b, role, s0, s1, -1, 0, 0, fmt, ap);
  va_end(ap);
  return st;
}

/* One expert's slice of a fused [E, ...] checkpoint tensor. */
static ferry_status add_slice(struct builder *b, enum ferry_tensor_role role, int64_t s0, int64_t s1, int transposed,
                              const char *fmt, ...) FERRY_PRINTF(6, 7);
static ferry_status add_slice(struct builder *b, enum ferry_tensor_role role, int64_t s0, int64_t s1, int transposed,
                              const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ferry_status st = add_ex(b, role, s0, s1, b->expert, (int32_t)b->m->cfg.n_experts, transposed, fmt, ap);
  va_end(ap);
  return st;
}

#define TRY(call)                      \
  do {                                 \
    ferry_status st_ = (call);         \
    if (st_ != FERRY_OK) return st_;   \
  } while (0)

static void set_prefix(struct builder *b, const char *fmt, int32_t l) {
  const char *mm = b->m->cfg.multimodal_names ? "language_model." : "";
  char tail[48];
  snprintf(tail, sizeof tail, fmt, l);
  snprintf(b->prefix, sizeof b->prefix, "%s%s", mm, tail);
}

/* ---- attention ---------------------------------------------------------------------------- */

static ferry_status add_mla(struct builder *b, const struct ferry_model_config *c) {
  const int64_t h = c->hidden, H = c->n_heads, qk = c->qk_nope_dim + c->qk_rope_dim;
  if (c->q_lora_rank) {
    TRY(add(b, FERRY_ROLE_MLA_Q_A, c->q_lora_rank, h, "self_attn.q_a_proj.weight"));
    TRY(add(b, FERRY_ROLE_MLA_Q_A_NORM, c->q_lora_rank, 0, "self_attn.q_a_layernorm.weight"));
    TRY(add(b, FERRY_ROLE_MLA_Q_B, H * qk, c->q_lora_rank, "self_attn.q_b_proj.weight"));
  } else {
    TRY(add(b, FERRY_ROLE_MLA_Q_B, H * qk, h, "self_attn.q_proj.weight"));
  }
  TRY(add(b, FERRY_ROLE_MLA_KV_A, c->kv_lora_rank + c->qk_rope_dim, h, "self_attn.kv_a_proj_with_mqa.weight"));
  TRY(add(b, FERRY_ROLE_MLA_KV_A_NORM, c->kv_lora_rank, 0, "self_attn.kv_a_layernorm.weight"));
  TRY(add(b, FERRY_ROLE_MLA_KV_B, H * (c->qk_nope_dim + c->v_head_dim), c->kv_lora_rank, "self_attn.kv_b_proj.weight"));
  return add(b, FERRY_ROLE_ATTN_O, h, H * c->v_head_dim, "self_attn.o_proj.weight");
}

static ferry_status add_attention(struct builder *b, const struct ferry_model_config *c) {
  if (c->kv_lora_rank) return add_mla(b, c);
  const int opt = c->family == FERRY_FAMILY_OPT;
  const int64_t h = c->hidden, q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
  TRY(add(b, FERRY_ROLE_ATTN_Q, q, h, "self_attn.q_proj.weight"));
  if (c->qkv_bias) TRY(add(b, FERRY_ROLE_ATTN_Q_BIAS, q, 0, "self_attn.q_proj.bias"));
  TRY(add(b, FERRY_ROLE_ATTN_K, kv, h, "self_attn.k_proj.weight"));
  if (c->qkv_bias) TRY(add(b, FERRY_ROLE_ATTN_K_BIAS, kv, 0, "self_attn.k_proj.bias"));
  TRY(add(b, FERRY_ROLE_ATTN_V, kv, h, "self_attn.v_proj.weight"));
  if (c->qkv_bias) TRY(add(b, FERRY_ROLE_ATTN_V_BIAS, kv, 0, "self_attn.v_proj.bias"));
  const char *o = opt ? "out_proj" : "o_proj";
  TRY(add(b, FERRY_ROLE_ATTN_O, h, q, "self_attn.%s.weight", o));
  if (c->attn_out_bias) TRY(add(b, FERRY_ROLE_ATTN_O_BIAS, h, 0, "self_attn.%s.bias", o));
  if (c->qk_norm == FERRY_QK_NORM_FULL) {
    TRY(add(b, FERRY_ROLE_Q_NORM, q, 0, "self_attn.q_norm.weight"));
    TRY(add(b, FERRY_ROLE_K_NORM, kv, 0, "self_attn.k_norm.weight"));
  } else if (c->qk_norm == FERRY_QK_NORM_HEAD) {
    TRY(add(b, FERRY_ROLE_Q_NORM, c->head_dim, 0, "self_attn.q_norm.weight"));
    TRY(add(b, FERRY_ROLE_K_NORM, c->head_dim, 0, "self_attn.k_norm.weight"));
  }
  if (c->attn_sinks) TRY(add(b, FERRY_ROLE_ATTN_SINKS, c->n_heads, 0, "self_attn.sinks"));
  return FERRY_OK;
}

/* ---- feed-forward ------------------------------------------------------------------------- */

static const char *ffn_module(const struct ferry_model_config *c, int moe) {
  if (c->family == FERRY_FAMILY_LLAMA4) return "feed_forward";
  if (moe && (c->family == FERRY_FAMILY_MIXTRAL || c->family == FERRY_FAMILY_PHIMOE)) return "block_sparse_moe";
  return "mlp";
}

static ferry_status add_dense_ffn(struct builder *b, const struct ferry_model_config *c, const char *mod) {
  const int64_t h = c->hidden, i = c->intermediate;
  TRY(add(b, FERRY_ROLE_FFN_GATE, i, h, "%s.gate_proj.weight", mod));
  TRY(add(b, FERRY_ROLE_FFN_UP, i, h, "%s.up_proj.weight", mod));
  return add(b, FERRY_ROLE_FFN_DOWN, h, i, "%s.down_proj.weight", mod);
}

/* The router and the shared expert: the dense part of an MoE layer after its norms. */
static ferry_status add_moe_dense_part(struct builder *b, const struct ferry_model_config *c, const char *mod) {
  const int64_t h = c->hidden, E = c->n_experts;
  const char *router = c->family == FERRY_FAMILY_LLAMA4 || c->family == FERRY_FAMILY_GPT_OSS ? "router" : "gate";
  TRY(add(b, FERRY_ROLE_ROUTER, E, h, "%s.%s.weight", mod, router));
  if (c->router_bias) TRY(add(b, FERRY_ROLE_ROUTER_BIAS, E, 0, "%s.%s.bias", mod, router));
  if (c->router_score_bias) TRY(add(b, FERRY_ROLE_ROUTER_SCORE_BIAS, E, 0, "%s.gate.e_score_correction_bias", mod));
  if (c->n_shared_experts > 0) {
    const int64_t si = c->shared_intermediate;
    const char *sh = c->family == FERRY_FAMILY_QWEN2_MOE ? "shared_expert"
                     : c->family == FERRY_FAMILY_LLAMA4  ? "shared_expert"
                                                         : "shared_experts";
    TRY(add(b, FERRY_ROLE_SHARED_GATE, si, h, "%s.%s.gate_proj.weight", mod, sh));
    TRY(add(b, FERRY_ROLE_SHARED_UP, si, h, "%s.%s.up_proj.weight", mod, sh));
    TRY(add(b, FERRY_ROLE_SHARED_DOWN, h, si, "%s.%s.down_proj.weight", mod, sh));
    if (c->shared_expert_gate) TRY(add(b, FERRY_ROLE_SHARED_EXPERT_GATE, 1, h, "%s.shared_expert_gate.weight", mod));
  }
  return FERRY_OK;
}

static ferry_status add_expert(struct builder *b, const struct ferry_model_config *c, const char *mod, int32_t e) {
  const int64_t h = c->hidden, ei = c->expert_intermediate;
  switch (c->expert_layout) {
    case FERRY_EXPERTS_SPLIT: {
      const int w123 = c->family == FERRY_FAMILY_MIXTRAL || c->family == FERRY_FAMILY_PHIMOE;
      TRY(add(b, FERRY_ROLE_EXPERT_GATE, ei, h, "%s.experts.%d.%s.weight", mod, e, w123 ? "w1" : "gate_proj"));
      TRY(add(b, FERRY_ROLE_EXPERT_UP, ei, h, "%s.experts.%d.%s.weight", mod, e, w123 ? "w3" : "up_proj"));
      return add(b, FERRY_ROLE_EXPERT_DOWN, h, ei, "%s.experts.%d.%s.weight", mod, e, w123 ? "w2" : "down_proj");
    }
    case FERRY_EXPERTS_FUSED_HALVES:
    case FERRY_EXPERTS_FUSED_INTERLEAVED: {
      /* bf16 checkpoints store x . W ([in, out]); quantized ones pack [out, in] rows */
      const int q = c->quant.kind != FERRY_CKPT_NONE;
      const int bias = c->expert_layout == FERRY_EXPERTS_FUSED_INTERLEAVED;
      if (q)
        TRY(add_slice(b, FERRY_ROLE_EXPERT_GATE_UP, 2 * ei, h, 0, "%s.experts.gate_up_proj", mod));
      else
        TRY(add_slice(b, FERRY_ROLE_EXPERT_GATE_UP, h, 2 * ei, 1, "%s.experts.gate_up_proj", mod));
      if (bias) TRY(add_slice(b, FERRY_ROLE_EXPERT_GATE_UP_BIAS, 2 * ei, 0, 0, "%s.experts.gate_up_proj_bias", mod));
      if (q)
        TRY(add_slice(b, FERRY_ROLE_EXPERT_DOWN, h, ei, 0, "%s.experts.down_proj", mod));
      else
        TRY(add_slice(b, FERRY_ROLE_EXPERT_DOWN, ei, h, 1, "%s.experts.down_proj", mod));
      if (bias) TRY(add_slice(b, FERRY_ROLE_EXPERT_DOWN_BIAS, h, 0, 0, "%s.experts.down_proj_bias", mod));
      return FERRY_OK;
    }
  }
  return ferry__fail(FERRY_ERR_INTERNAL, "model layout: unknown expert layout %d", (int)c->expert_layout);
}

/* ---- layers ------------------------------------------------------------------------------- */

static ferry_status add_norm(struct builder *b, const struct ferry_model_config *c, enum ferry_tensor_role w,
                             enum ferry_tensor_role bias, const char *name) {
  TRY(add(b, w, c->hidden, 0, "%s.weight", name));
  if (c->norm == FERRY_NORM_LAYER) TRY(add(b, bias, c->hidden, 0, "%s.bias", name));
  return FERRY_OK;
}

static ferry_status layer_opt(struct builder *b, const struct ferry_model_config *c) {
  const int64_t h = c->hidden;
  TRY(add_norm(b, c, FERRY_ROLE_ATTN_NORM, FERRY_ROLE_ATTN_NORM_BIAS, "self_attn_layer_norm"));
  TRY(add_attention(b, c));
  TRY(add_norm(b, c, FERRY_ROLE_FFN_NORM, FERRY_ROLE_FFN_NORM_BIAS, "final_layer_norm"));
  TRY(add(b, FERRY_ROLE_FFN_UP, c->intermediate, h, "fc1.weight"));
  if (c->ffn_bias) TRY(add(b, FERRY_ROLE_FFN_UP_BIAS, c->intermediate, 0, "fc1.bias"));
  TRY(add(b, FERRY_ROLE_FFN_DOWN, h, c->intermediate, "fc2.weight"));
  if (c->ffn_bias) TRY(add(b, FERRY_ROLE_FFN_DOWN_BIAS, h, 0, "fc2.bias"));
  return FERRY_OK;
}

/* GPT-NeoX and BLOOM: fused query_key_value, LayerNorms, plain GELU MLP, biases everywhere. */
static ferry_status layer_fused_qkv(struct builder *b, const struct ferry_model_config *c) {
  const int64_t h = c->hidden, q = c->n_heads * c->head_dim, i = c->intermediate;
  const int neox = c->family == FERRY_FAMILY_GPT_NEOX;
  const char *attn = neox ? "attention" : "self_attention";
  TRY(add_norm(b, c, FERRY_ROLE_ATTN_NORM, FERRY_ROLE_ATTN_NORM_BIAS, "input_layernorm"));
  TRY(add(b, FERRY_ROLE_ATTN_QKV, 3 * q, h, "%s.query_key_value.weight", attn));
  if (c->qkv_bias) TRY(add(b, FERRY_ROLE_ATTN_QKV_BIAS, 3 * q, 0, "%s.query_key_value.bias", attn));
  TRY(add(b, FERRY_ROLE_ATTN_O, h, q, "%s.dense.weight", attn));
  if (c->attn_out_bias) TRY(add(b, FERRY_ROLE_ATTN_O_BIAS, h, 0, "%s.dense.bias", attn));
  TRY(add_norm(b, c, FERRY_ROLE_FFN_NORM, FERRY_ROLE_FFN_NORM_BIAS, "post_attention_layernorm"));
  TRY(add(b, FERRY_ROLE_FFN_UP, i, h, "mlp.dense_h_to_4h.weight"));
  if (c->ffn_bias) TRY(add(b, FERRY_ROLE_FFN_UP_BIAS, i, 0, "mlp.dense_h_to_4h.bias"));
  TRY(add(b, FERRY_ROLE_FFN_DOWN, h, i, "mlp.dense_4h_to_h.weight"));
  if (c->ffn_bias) TRY(add(b, FERRY_ROLE_FFN_DOWN_BIAS, h, 0, "mlp.dense_4h_to_h.bias"));
  return FERRY_OK;
}

/* GPT-J: ln_1 alone feeds the attention and the MLP (parallel residual), no attention biases. */
static ferry_status layer_gptj(struct builder *b, const struct ferry_model_config *c) {
  const int64_t h = c->hidden, q = c->n_heads * c->head_dim, i = c->intermediate;
  TRY(add_norm(b, c, FERRY_ROLE_ATTN_NORM, FERRY_ROLE_ATTN_NORM_BIAS, "ln_1"));
  TRY(add(b, FERRY_ROLE_ATTN_Q, q, h, "attn.q_proj.weight"));
  TRY(add(b, FERRY_ROLE_ATTN_K, q, h, "attn.k_proj.weight"));
  TRY(add(b, FERRY_ROLE_ATTN_V, q, h, "attn.v_proj.weight"));
  TRY(add(b, FERRY_ROLE_ATTN_O, h, q, "attn.out_proj.weight"));
  TRY(add(b, FERRY_ROLE_FFN_UP, i, h, "mlp.fc_in.weight"));
  TRY(add(b, FERRY_ROLE_FFN_UP_BIAS, i, 0, "mlp.fc_in.bias"));
  TRY(add(b, FERRY_ROLE_FFN_DOWN, h, i, "mlp.fc_out.weight"));
  TRY(add(b, FERRY_ROLE_FFN_DOWN_BIAS, h, 0, "mlp.fc_out.bias"));
  return FERRY_OK;
}

static ferry_status layer_llama_like(struct builder *b, const struct ferry_model_config *c, int32_t l,
                                     int *experts) {
  const int moe = ferry__layer_is_moe(c, l);
  TRY(add_norm(b, c, FERRY_ROLE_ATTN_NORM, FERRY_ROLE_ATTN_NORM_BIAS, "input_layernorm"));
  TRY(add_attention(b, c));
  if (c->sandwich_norms) {
    TRY(add(b, FERRY_ROLE_POST_ATTN_NORM, c->hidden, 0, "post_attention_layernorm.weight"));
    TRY(add(b, FERRY_ROLE_FFN_NORM, c->hidden, 0, "pre_feedforward_layernorm.weight"));
    TRY(add(b, FERRY_ROLE_POST_FFN_NORM, c->hidden, 0, "post_feedforward_layernorm.weight"));
  } else {
    TRY(add_norm(b, c, FERRY_ROLE_FFN_NORM, FERRY_ROLE_FFN_NORM_BIAS, "post_attention_layernorm"));
  }
  const char *mod = ffn_module(c, moe);
  *experts = moe;
  return moe ? add_moe_dense_part(b, c, mod) : add_dense_ffn(b, c, mod);
}

static ferry_status add_layer(struct builder *b, const struct ferry_model_config *c, int32_t l) {
  ferry_model *m = b->m;
  const enum ferry__names names = ferry__family(c->family)->names;
  set_prefix(b, names == FERRY__NAMES_OPT    ? "model.decoder.layers.%d."
                : names == FERRY__NAMES_NEOX ? "gpt_neox.layers.%d."
                : names == FERRY__NAMES_BLOOM ? "h.%d."
                : names == FERRY__NAMES_GPTJ  ? "transformer.h.%d."
                                              : "model.layers.%d.",
             l);
  b->layer = l;
  b->expert = -1;
  m->layer_first[l] = m->n_tensors;
  int experts = 0;
  if (names == FERRY__NAMES_OPT)
    TRY(layer_opt(b, c));
  else if (names == FERRY__NAMES_NEOX || names == FERRY__NAMES_BLOOM)
    TRY(layer_fused_qkv(b, c));
  else if (names == FERRY__NAMES_GPTJ)
    TRY(layer_gptj(b, c));
  else
    TRY(layer_llama_like(b, c, l, &experts));
  m->layer_count[l] = m->n_tensors - m->layer_first[l];
  if (!experts) return FERRY_OK;
  const char *mod = ffn_module(c, 1);
  for (int32_t e = 0; e < (int32_t)c->n_experts; e++) {
    b->expert = e;
    size_t before = m->n_tensors;
    m->expert_first[(size_t)l * (size_t)c->n_experts + (size_t)e] = m->n_tensors;
    TRY(add_expert(b, c, mod, e));
    m->expert_tensors = m->n_tensors - before;
  }
  b->expert = -1;
  return FERRY_OK;
}

size_t ferry__model_tensor_cap(const struct ferry_model_config *c) {
  return 8 + (size_t)c->n_layers * (24 + 4 * (size_t)c->n_experts);
}

ferry_status ferry__model_build_layout(ferry_model *m) {
  const struct ferry_model_config *c = &m->cfg;
  struct builder bb = {.m = m, .cap = ferry__model_tensor_cap(c), .layer = -1, .expert = -1};
  struct builder *b = &bb;
  m->tensors = ferry__reallocarray(NULL, bb.cap, sizeof *m->tensors);
  m->layer_first = ferry__calloc((size_t)c->n_layers, sizeof *m->layer_first);
  m->layer_count = ferry__calloc((size_t)c->n_layers, sizeof *m->layer_count);
  m->expert_first = ferry__calloc((size_t)c->n_layers * (size_t)(c->n_experts ? c->n_experts : 1),
                                  sizeof *m->expert_first);
  if (!m->tensors || !m->layer_first || !m->layer_count || !m->expert_first)
    return ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory for the tensor layout", c->name);
  m->expert_tensors = 0;
  const int64_t h = c->hidden;
  const enum ferry__names names = ferry__family(c->family)->names;
  switch (names) {
    case FERRY__NAMES_OPT:
      TRY(add(b, FERRY_ROLE_EMBED, c->vocab, h, "model.decoder.embed_tokens.weight"));
      break;
    case FERRY__NAMES_NEOX: TRY(add(b, FERRY_ROLE_EMBED, c->vocab, h, "gpt_neox.embed_in.weight")); break;
    case FERRY__NAMES_BLOOM: TRY(add(b, FERRY_ROLE_EMBED, c->vocab, h, "word_embeddings.weight")); break;
    case FERRY__NAMES_GPTJ: TRY(add(b, FERRY_ROLE_EMBED, c->vocab, h, "transformer.wte.weight")); break;
    case FERRY__NAMES_LLAMA:
      set_prefix(b, "model.", 0);
      TRY(add(b, FERRY_ROLE_EMBED, c->vocab, h, "embed_tokens.weight"));
      b->prefix[0] = '\0';
      break;
  }
  if (c->learned_positions)
    TRY(add(b, FERRY_ROLE_POS_EMBED, c->max_position + 2, h, "model.decoder.embed_positions.weight"));
  if (c->embed_norm) {
    TRY(add(b, FERRY_ROLE_EMBED_NORM, h, 0, "word_embeddings_layernorm.weight"));
    TRY(add(b, FERRY_ROLE_EMBED_NORM_BIAS, h, 0, "word_embeddings_layernorm.bias"));
  }
  for (int32_t l = 0; l < (int32_t)c->n_layers; l++) TRY(add_layer(b, c, l));
  b->prefix[0] = '\0';
  b->layer = -1;
  b->expert = -1;
  switch (names) {
    case FERRY__NAMES_OPT:
      TRY(add_norm(b, c, FERRY_ROLE_FINAL_NORM, FERRY_ROLE_FINAL_NORM_BIAS, "model.decoder.final_layer_norm"));
      break;
    case FERRY__NAMES_NEOX:
      TRY(add_norm(b, c, FERRY_ROLE_FINAL_NORM, FERRY_ROLE_FINAL_NORM_BIAS, "gpt_neox.final_layer_norm"));
      break;
    case FERRY__NAMES_BLOOM: TRY(add_norm(b, c, FERRY_ROLE_FINAL_NORM, FERRY_ROLE_FINAL_NORM_BIAS, "ln_f")); break;
    case FERRY__NAMES_GPTJ:
      TRY(add_norm(b, c, FERRY_ROLE_FINAL_NORM, FERRY_ROLE_FINAL_NORM_BIAS, "transformer.ln_f"));
      break;
    case FERRY__NAMES_LLAMA:
      set_prefix(b, "model.", 0);
      TRY(add_norm(b, c, FERRY_ROLE_FINAL_NORM, FERRY_ROLE_FINAL_NORM_BIAS, "norm"));
      b->prefix[0] = '\0';
      break;
  }
  if (!c->tied_embeddings) {
    const char *head = names == FERRY__NAMES_NEOX ? "embed_out" : "lm_head";
    if (c->multimodal_names) set_prefix(b, "", 0);
    TRY(add(b, FERRY_ROLE_LM_HEAD, c->vocab, h, "%s.weight", head));
    if (c->lm_head_bias) TRY(add(b, FERRY_ROLE_LM_HEAD_BIAS, c->vocab, 0, "%s.bias", head));
  }
  return FERRY_OK;
}
