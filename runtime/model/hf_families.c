/* The family-specific part of reading a config.json: for each model_type the fields that
 * change shapes, bytes or numerics, with the defaults of its transformers configuration
 * class, and an error for values ferry cannot reproduce (rather than a silent difference). */
#include <stdio.h>
#include <string.h>

#include "runtime/model/hf_impl.h"

/* Defaults of the common dimensions; 0 in a dimension makes it required. */
struct dims {
  int64_t hidden, inter, layers, heads, head_dim, vocab, maxpos;
  int kv_is_heads;  /* num_key_value_heads defaults to num_attention_heads (else kv) */
  int64_t kv;
  double eps, theta;
  int tie;
  const char *eps_key;
};

static ferry_status read_dims(const struct reader *r, struct ferry_model_config *c, const struct dims *d,
                              int64_t *inter) {
  const int64_t dim_max = 4 * (int64_t)FERRY__MODEL_MAX_DIM;
  TRY(ferry__hf_int(r, "hidden_size", !d->hidden, d->hidden, 1, FERRY__MODEL_MAX_DIM, &c->hidden));
  TRY(ferry__hf_int(r, "intermediate_size", !d->inter, d->inter, 1, dim_max, inter));
  TRY(ferry__hf_int(r, "num_hidden_layers", !d->layers, d->layers, 1, FERRY__MODEL_MAX_LAYERS, &c->n_layers));
  TRY(ferry__hf_int(r, "num_attention_heads", !d->heads, d->heads, 1, FERRY__MODEL_MAX_HEADS, &c->n_heads));
  TRY(ferry__hf_int(r, "num_key_value_heads", 0, d->kv_is_heads ? c->n_heads : d->kv, 1, FERRY__MODEL_MAX_HEADS,
                    &c->n_kv_heads));
  if (c->n_heads % c->n_kv_heads != 0)
    return ferry__fail(FERRY_ERR_FORMAT,
                       "%s: field \"num_key_value_heads\" = %lld does not divide num_attention_heads = %lld", r->what,
                       (long long)c->n_kv_heads, (long long)c->n_heads);
  int64_t hd_def = d->head_dim;
  if (!hd_def) {
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(r->root, "head_dim");
    if ((!hd || cJSON_IsNull(hd)) && c->hidden % c->n_heads != 0)
      return ferry__fail(FERRY_ERR_FORMAT,
                         "%s: hidden_size %lld is not a multiple of num_attention_heads %lld and head_dim is absent",
                         r->what, (long long)c->hidden, (long long)c->n_heads);
    hd_def = c->hidden / c->n_heads;
  }
  TRY(ferry__hf_int(r, "head_dim", 0, hd_def, 1, FERRY__MODEL_MAX_DIM, &c->head_dim));
  TRY(ferry__hf_int(r, "vocab_size", !d->vocab, d->vocab, 1, FERRY__MODEL_MAX_VOCAB, &c->vocab));
  TRY(ferry__hf_int(r, "max_position_embeddings", 0, d->maxpos, 1, FERRY__MODEL_MAX_POSITION, &c->max_position));
  TRY(ferry__hf_positive(r, d->eps_key ? d->eps_key : "rms_norm_eps", d->eps, &c->norm_eps));
  TRY(ferry__hf_read_rope(r, NULL, d->theta, &c->rope_theta, &c->rope_scaling));
  TRY(ferry__hf_bool(r, "tie_word_embeddings", d->tie, &c->tied_embeddings));
  return FERRY_OK;
}

static ferry_status need_act(const struct reader *r, const char *key, const char *def, const char *const *ok,
                             const char *want) {
  const char *act;
  TRY(ferry__hf_str(r, key, def, &act));
  for (; *ok; ok++)
    if (!strcmp(act, *ok)) return FERRY_OK;
  char detail[160];
  snprintf(detail, sizeof detail, "\"%.32s\" is not supported for this model_type (expected %s)", act, want);
  return ferry__hf_unsupported(r, key, detail);
}

static const char *const silu[] = {"silu", "swish", NULL};
static const char *const gelu_tanh[] = {"gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu_fast", NULL};

static ferry_status need_false(const struct reader *r, const char *key, const char *why) {
  int v;
  TRY(ferry__hf_bool(r, key, 0, &v));
  return v ? ferry__hf_unsupported(r, key, why) : FERRY_OK;
}

/* Qwen-style sliding window: use_sliding_window windows layers l >= max_window_layers. */
static ferry_status qwen_window(const struct reader *r, struct ferry_model_config *c, int64_t mwl_def) {
  int use;
  TRY(ferry__hf_bool(r, "use_sliding_window", 0, &use));
  if (!use) return FERRY_OK;
  int64_t mwl;
  TRY(ferry__hf_int(r, "max_window_layers", 0, mwl_def, 0, FERRY__MODEL_MAX_LAYERS, &mwl));
  if (mwl >= c->n_layers) return FERRY_OK;
  if (mwl != 0)
    return ferry__fail(FERRY_ERR_UNSUPPORTED,
                       "%s: max_window_layers = %lld: windowing only the layers from %lld on is not supported "
                       "(0 or >= num_hidden_layers)",
                       r->what, (long long)mwl, (long long)mwl);
  return ferry__hf_int_or_null(r, "sliding_window", 4096, FERRY__MODEL_MAX_POSITION, &c->sliding_window);
}

/* Qwen MoE placement: decoder_sparse_step and mlp_only_layers (a leading run of dense layers). */
static ferry_status qwen_moe_layers(const struct reader *r, struct ferry_model_config *c) {
  int64_t step;
  TRY(ferry__hf_int(r, "decoder_sparse_step", 0, 1, 1, FERRY__MODEL_MAX_LAYERS, &step));
  c->moe_layer_step = step > 1 ? step : 0;
  const cJSON *mol = cJSON_GetObjectItemCaseSensitive(r->root, "mlp_only_layers");
  if (mol && !cJSON_IsNull(mol) && !cJSON_IsArray(mol))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"mlp_only_layers\" must be an array of layer indices", r->what);
  int64_t i = 0;
  for (const cJSON *it = mol ? mol->child : NULL; it; it = it->next, i++)
    if (!ferry__json_is_int(it, i, i))
      return ferry__fail(FERRY_ERR_UNSUPPORTED,
                         "%s: mlp_only_layers must list the first layers in order (0, 1, ...): dense layers elsewhere "
                         "in an MoE model are not supported",
                         r->what);
  c->first_dense_layers = i;
  return FERRY_OK;
}

/* Derive the sliding pattern from a layer_types array, or check one against the pattern. */
static const char *expected_type(const struct ferry_model_config *c, int64_t l) {
  if (ferry__layer_window(c, l)) return "sliding_attention";
  if (ferry__layer_chunk(c, l)) return "chunked_attention";
  return "full_attention";
}

static ferry_status layer_types(const struct reader *r, struct ferry_model_config *c, int derive) {
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(r->root, "layer_types");
  if (!lt || cJSON_IsNull(lt)) return FERRY_OK;
  if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"layer_types\" must be an array of %lld strings", r->what,
                       (long long)c->n_layers);
  int same = 1;
  int64_t l0 = 0;
  for (const cJSON *it = lt->child; it && same; it = it->next, l0++)
    same = cJSON_IsString(it) && !strcmp(it->valuestring, expected_type(c, l0));
  if (derive && !same) {
    /* the first global layer gives the period; all sliding: period 0; all global: no window */
    int64_t first_full = -1, l = 0;
    for (const cJSON *it = lt->child; it; it = it->next, l++)
      if (cJSON_IsString(it) && !strcmp(it->valuestring, "full_attention") && first_full < 0) first_full = l;
    if (first_full < 0)
      c->sliding_pattern = 0;
    else if (first_full == 0)
      c->sliding_window = 0;
    else
      c->sliding_pattern = first_full + 1;
  }
  int64_t l = 0;
  for (const cJSON *it = lt->child; it; it = it->next, l++) {
    if (!cJSON_IsString(it))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: layer_types[%lld] is not a string", r->what, (long long)l);
    const char *want = expected_type(c, l);
    if (strcmp(it->valuestring, want))
      return ferry__fail(FERRY_ERR_UNSUPPORTED,
                         "%s: layer_types[%lld] = \"%.32s\" but the layer pattern gives \"%s\" (irregular layer "
                         "patterns are not supported)",
                         r->what, (long long)l, it->valuestring, want);
  }
  return FERRY_OK;
}

/* An integer array that must equal f(l) for every layer (Llama 4's moe_layers / no_rope_layers). */
static ferry_status check_int_list(const struct reader *r, const char *key, const struct ferry_model_config *c,
                                   int as_indices, int (*f)(const struct ferry_model_config *, int64_t)) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(r->root, key);
  if (!a || cJSON_IsNull(a)) return FERRY_OK;
  if (!cJSON_IsArray(a)) return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s\" must be an array", r->what, key);
  int64_t n = 0;
  if (as_indices) { /* the layers where f holds, ascending */
    const cJSON *it = a->child;
    for (int64_t l = 0; l < c->n_layers; l++) {
      if (!f(c, l)) continue;
      if (!it || !ferry__json_is_int(it, (double)l, (double)l)) goto mismatch;
      it = it->next;
    }
    if (it) goto mismatch;
    return FERRY_OK;
  }
  for (const cJSON *it = a->child; it; it = it->next, n++)
    if (n >= c->n_layers || !ferry__json_is_int(it, f(c, n), f(c, n))) goto mismatch;
  if (n != c->n_layers) goto mismatch;
  return FERRY_OK;
mismatch:
  return ferry__fail(FERRY_ERR_UNSUPPORTED,
                     "%s: field \"%s\" does not follow the regular layer pattern ferry derives (irregular patterns are "
                     "not supported)",
                     r->what, key);
}

/* ---- the Llama-shaped families of 2023-24 ------------------------------------------------ */

static ferry_status read_classic(const struct reader *r, struct ferry_model_config *c) {
  const enum ferry_family f = c->family;
  const int64_t dim_max = 4 * (int64_t)FERRY__MODEL_MAX_DIM;
  struct dims d = {.kv_is_heads = 1, .maxpos = 2048, .eps = 1e-6, .theta = 10000.0};
  switch (f) {
    case FERRY_FAMILY_MISTRAL: d.maxpos = 4096 * 32, d.kv_is_heads = 0, d.kv = 8; break;
    case FERRY_FAMILY_MIXTRAL: d.maxpos = 4096 * 32, d.eps = 1e-5, d.theta = 1e6, d.kv_is_heads = 0, d.kv = 8; break;
    case FERRY_FAMILY_QWEN2:
    case FERRY_FAMILY_QWEN2_MOE: d.maxpos = 32768; break;
    case FERRY_FAMILY_OLMOE: d.maxpos = 4096, d.eps = 1e-5; break;
    default: break;
  }
  int64_t inter = 0;
  TRY(read_dims(r, c, &d, &inter));
  TRY(need_act(r, "hidden_act", "silu", silu, "\"silu\" (SwiGLU)"));
  c->norm = FERRY_NORM_RMS;
  c->act = FERRY_ACT_SWIGLU;
  int bias = 0;
  switch (f) {
    case FERRY_FAMILY_LLAMA: {
      TRY(ferry__hf_bool(r, "attention_bias", 0, &bias));
      TRY(need_false(r, "mlp_bias", "true is not supported (no gate/up/down biases)"));
      c->qkv_bias = c->attn_out_bias = bias;
      c->intermediate = inter;
      break;
    }
    case FERRY_FAMILY_MISTRAL:
      TRY(ferry__hf_int_or_null(r, "sliding_window", 4096, FERRY__MODEL_MAX_POSITION, &c->sliding_window));
      c->intermediate = inter;
      break;
    case FERRY_FAMILY_MIXTRAL:
      TRY(ferry__hf_int_or_null(r, "sliding_window", 0, FERRY__MODEL_MAX_POSITION, &c->sliding_window));
      TRY(ferry__hf_int(r, "num_local_experts", 0, 8, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
      TRY(ferry__hf_int(r, "num_experts_per_tok", 0, 2, 1, c->n_experts, &c->experts_per_token));
      c->expert_intermediate = inter;
      c->norm_topk_prob = 1; /* Mixtral always renormalises its top-k weights */
      break;
    case FERRY_FAMILY_QWEN2:
    case FERRY_FAMILY_QWEN2_MOE:
      c->qkv_bias = 1; /* Qwen2 attention always has q/k/v biases */
      c->intermediate = inter;
      TRY(qwen_window(r, c, 28));
      if (f == FERRY_FAMILY_QWEN2) break;
      TRY(qwen_moe_layers(r, c));
      TRY(ferry__hf_int(r, "num_experts", 0, 60, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
      TRY(ferry__hf_int(r, "num_experts_per_tok", 0, 4, 1, c->n_experts, &c->experts_per_token));
      TRY(ferry__hf_int(r, "moe_intermediate_size", 0, 1408, 1, dim_max, &c->expert_intermediate));
      TRY(ferry__hf_int(r, "shared_expert_intermediate_size", 0, 5632, 0, dim_max, &c->shared_intermediate));
      TRY(ferry__hf_bool(r, "norm_topk_prob", 0, &c->norm_topk_prob));
      c->n_shared_experts = c->shared_intermediate > 0;
      c->shared_expert_gate = c->shared_intermediate > 0;
      break;
    case FERRY_FAMILY_OLMOE:
      TRY(ferry__hf_bool(r, "attention_bias", 0, &bias));
      c->qkv_bias = c->attn_out_bias = bias;
      c->qk_norm = FERRY_QK_NORM_FULL;
      TRY(ferry__hf_int(r, "num_experts", 0, 64, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
      TRY(ferry__hf_int(r, "num_experts_per_tok", 0, 8, 1, c->n_experts, &c->experts_per_token));
      TRY(ferry__hf_bool(r, "norm_topk_prob", 0, &c->norm_topk_prob));
      c->expert_intermediate = inter;
      break;
    default: break;
  }
  return FERRY_OK;
}

/* ---- Qwen3 / Qwen3-MoE --------------------------------------------------------------------- */

static ferry_status read_qwen3(const struct reader *r, struct ferry_model_config *c) {
  struct dims d = {.kv_is_heads = 1, .head_dim = 128, .maxpos = 32768, .eps = 1e-6, .theta = 10000.0};
  int64_t inter = 0;
  TRY(read_dims(r, c, &d, &inter));
  TRY(need_act(r, "hidden_act", "silu", silu, "\"silu\" (SwiGLU)"));
  int bias;
  TRY(ferry__hf_bool(r, "attention_bias", 0, &bias));
  c->qkv_bias = c->attn_out_bias = bias;
  c->qk_norm = FERRY_QK_NORM_HEAD;
  c->intermediate = inter;
  TRY(qwen_window(r, c, 28));
  TRY(layer_types(r, c, 0));
  if (c->family == FERRY_FAMILY_QWEN3) return FERRY_OK;
  const int64_t dim_max = 4 * (int64_t)FERRY__MODEL_MAX_DIM;
  TRY(qwen_moe_layers(r, c));
  TRY(ferry__hf_int(r, "num_experts", 0, 128, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
  TRY(ferry__hf_int(r, "num_experts_per_tok", 0, 8, 1, c->n_experts, &c->experts_per_token));
  TRY(ferry__hf_int(r, "moe_intermediate_size", 0, 768, 1, dim_max, &c->expert_intermediate));
  TRY(ferry__hf_bool(r, "norm_topk_prob", 0, &c->norm_topk_prob));
  return FERRY_OK;
}

/* ---- Gemma 2 / Gemma 3 ---------------------------------------------------------------------- */

static ferry_status read_gemma(const struct reader *r, struct ferry_model_config *c) {
  const int g3 = c->family == FERRY_FAMILY_GEMMA3;
  struct dims d = {.hidden = 2304, .inter = 9216, .layers = 26, .heads = 8, .kv = 4, .head_dim = 256,
                   .vocab = g3 ? 262208 : 256000, .maxpos = g3 ? 131072 : 8192, .eps = 1e-6,
                   .theta = g3 ? 1e6 : 10000.0, .tie = 1};
  int64_t inter = 0;
  TRY(read_dims(r, c, &d, &inter));
  const cJSON *ha = cJSON_GetObjectItemCaseSensitive(r->root, "hidden_activation");
  TRY(need_act(r, ha && !cJSON_IsNull(ha) ? "hidden_activation" : "hidden_act", "gelu_pytorch_tanh", gelu_tanh,
               "\"gelu_pytorch_tanh\" (GeGLU)"));
  c->norm = FERRY_NORM_RMS;
  c->act = FERRY_ACT_GEGLU;
  c->intermediate = inter;
  c->norm_unit_offset = c->sandwich_norms = c->scale_embeddings = 1;
  int bias;
  TRY(ferry__hf_bool(r, "attention_bias", 0, &bias));
  c->qkv_bias = c->attn_out_bias = bias;
  TRY(ferry__hf_num_or_null(r, "query_pre_attn_scalar", 256, &c->query_pre_attn_scalar));
  TRY(ferry__hf_num_or_null(r, "attn_logit_softcapping", g3 ? 0 : 50.0, &c->attn_softcap));
  TRY(ferry__hf_num_or_null(r, "final_logit_softcapping", g3 ? 0 : 30.0, &c->final_softcap));
  TRY(ferry__hf_int_or_null(r, "sliding_window", 4096, FERRY__MODEL_MAX_POSITION, &c->sliding_window));
  if (g3) {
    c->qk_norm = FERRY_QK_NORM_HEAD;
    TRY(need_false(r, "use_bidirectional_attention", "true (bidirectional attention) is not supported"));
    int64_t pattern;
    TRY(ferry__hf_int(r, "sliding_window_pattern", 0, 6, 1, FERRY__MODEL_MAX_LAYERS, &pattern));
    c->sliding_pattern = pattern;
    /* windowed layers: their own base (rope_local_base_freq, or rope_parameters.sliding_attention) */
    TRY(ferry__hf_positive(r, "rope_local_base_freq", 10000.0, &c->rope_local_theta));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(r->root, "rope_parameters");
    if (rp && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention"))) {
      struct ferry_rope_scaling local;
      TRY(ferry__hf_read_rope(r, "sliding_attention", 10000.0, &c->rope_local_theta, &local));
      if (local.type != FERRY_ROPE_DEFAULT)
        return ferry__hf_unsupported(r, "rope_parameters.sliding_attention", "scaling of windowed layers is not supported");
      TRY(ferry__hf_read_rope(r, "full_attention", 1e6, &c->rope_theta, &c->rope_scaling));
    }
  } else {
    c->sliding_pattern = 2;
  }
  return layer_types(r, c, 1);
}

/* ---- Phi-3.5-MoE ---------------------------------------------------------------------------- */

static ferry_status read_phimoe(const struct reader *r, struct ferry_model_config *c) {
  struct dims d = {.hidden = 4096, .inter = 6400, .layers = 32, .heads = 32, .kv = 8, .vocab = 32064,
                   .maxpos = 4096 * 32, .eps = 1e-5, .theta = 1e6};
  int64_t inter = 0;
  TRY(read_dims(r, c, &d, &inter));
  TRY(need_act(r, "hidden_act", "silu", silu, "\"silu\" (SwiGLU)"));
  c->norm = FERRY_NORM_LAYER;
  c->act = FERRY_ACT_SWIGLU;
  c->expert_intermediate = inter;
  int bias;
  TRY(ferry__hf_bool(r, "attention_bias", 0, &bias));
  c->qkv_bias = c->attn_out_bias = bias;
  TRY(ferry__hf_bool(r, "lm_head_bias", 0, &c->lm_head_bias));
  TRY(ferry__hf_int_or_null(r, "sliding_window", 0, FERRY__MODEL_MAX_POSITION, &c->sliding_window));
  TRY(ferry__hf_int(r, "num_local_experts", 0, 16, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
  TRY(ferry__hf_int(r, "num_experts_per_tok", 0, 2, 1, c->n_experts, &c->experts_per_token));
  TRY(ferry__hf_num_or_null(r, "router_jitter_noise", 0.01, &c->router_jitter));
  c->router = FERRY_ROUTER_SPARSEMIXER;
  if (c->rope_scaling.type == FERRY_ROPE_LONGROPE && !c->rope_scaling.original_max_position)
    TRY(ferry__hf_int(r, "original_max_position_embeddings", 0, 4096, 1, FERRY__MODEL_MAX_POSITION,
                      &c->rope_scaling.original_max_position));
  return FERRY_OK;
}

/* ---- GPT-NeoX and BLOOM --------------------------------------------------------------------- */

static ferry_status read_neox(const struct reader *r, struct ferry_model_config *c) {
  struct dims d = {.kv_is_heads = 1, .maxpos = 2048, .eps = 1e-5, .theta = 10000.0, .eps_key = "layer_norm_eps"};
  int64_t inter = 0;
  /* rotary_emb_base is the old spelling of rope_theta */
  double base;
  TRY(ferry__hf_positive(r, "rotary_emb_base", 10000.0, &base));
  d.theta = base;
  TRY(read_dims(r, c, &d, &inter));
  if (c->n_kv_heads != c->n_heads) return ferry__hf_unsupported(r, "num_key_value_heads", "GPT-NeoX has no grouped-query attention");
  const char *act;
  TRY(ferry__hf_str(r, "hidden_act", "gelu", &act));
  if (!strcmp(act, "gelu"))
    c->act = FERRY_ACT_GELU;
  else if (!strcmp(act, "gelu_fast") || !strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh"))
    c->act = FERRY_ACT_GELU_TANH;
  else
    return ferry__hf_unsupported(r, "hidden_act", "expected gelu, gelu_fast, gelu_new or gelu_pytorch_tanh");
  c->norm = FERRY_NORM_LAYER;
  c->intermediate = inter;
  c->fused_qkv = 1;
  c->ffn_bias = 1;
  int bias;
  TRY(ferry__hf_bool(r, "attention_bias", 1, &bias));
  c->qkv_bias = c->attn_out_bias = bias;
  TRY(ferry__hf_bool(r, "use_parallel_residual", 1, &c->parallel_residual));
  double pct = 0.25;
  TRY(ferry__hf_positive(r, "rotary_pct", 0.25, &pct));
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(r->root, "rope_parameters");
  const cJSON *prf = cJSON_GetObjectItemCaseSensitive(r->root, "partial_rotary_factor");
  if (!prf && rp) prf = cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor");
  if (prf && cJSON_IsNumber(prf)) pct = prf->valuedouble;
  if (!(pct > 0 && pct <= 1)) return ferry__hf_unsupported(r, "rotary_pct", "must be in (0, 1]");
  int64_t rd = (int64_t)((double)c->head_dim * pct);
  c->rotary_dim = rd == c->head_dim ? 0 : rd;
  return FERRY_OK;
}

/* GPT-J (GPTJConfig: n_embd, n_layer, n_head, n_inner, n_positions; modeling_gptj.py): one
 * LayerNorm (ln_1) feeds both the attention and the MLP of a parallel residual, q/k/v/out
 * without biases, RoPE on the first rotary_dim dimensions of each head in interleaved pairs
 * (rotate_every_two), an fc_in/fc_out MLP with biases and gelu_new, an untied head with a bias. */
static ferry_status read_gptj(const struct reader *r, struct ferry_model_config *c) {
  TRY(ferry__hf_int(r, "n_embd", 0, 4096, 1, FERRY__MODEL_MAX_DIM, &c->hidden));
  TRY(ferry__hf_int(r, "n_layer", 0, 28, 1, FERRY__MODEL_MAX_LAYERS, &c->n_layers));
  TRY(ferry__hf_int(r, "n_head", 0, 16, 1, FERRY__MODEL_MAX_HEADS, &c->n_heads));
  TRY(ferry__hf_int(r, "vocab_size", 0, 50400, 1, FERRY__MODEL_MAX_VOCAB, &c->vocab));
  TRY(ferry__hf_int(r, "n_positions", 0, 2048, 1, FERRY__MODEL_MAX_POSITION, &c->max_position));
  TRY(ferry__hf_positive(r, "layer_norm_epsilon", 1e-5, &c->norm_eps));
  TRY(ferry__hf_bool(r, "tie_word_embeddings", 0, &c->tied_embeddings));
  if (c->tied_embeddings) return ferry__hf_unsupported(r, "tie_word_embeddings", "GPT-J's head is its own, with a bias");
  if (c->hidden % c->n_heads)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: n_embd %lld is not a multiple of n_head %lld", r->what,
                       (long long)c->hidden, (long long)c->n_heads);
  c->n_kv_heads = c->n_heads;
  c->head_dim = c->hidden / c->n_heads;
  /* n_inner: null (or absent) is 4 x n_embd */
  TRY(ferry__hf_int_or_null(r, "n_inner", 0, 4 * (int64_t)FERRY__MODEL_MAX_DIM, &c->intermediate));
  if (c->intermediate == 0) c->intermediate = 4 * c->hidden;
  /* rotary_dim: null rotates whole heads */
  int64_t rd = 0;
  TRY(ferry__hf_int_or_null(r, "rotary_dim", 64, FERRY__MODEL_MAX_DIM, &rd));
  if (rd < 0 || rd > c->head_dim || rd % 2)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: rotary_dim %lld must be even and at most the head's %lld", r->what,
                       (long long)rd, (long long)c->head_dim);
  c->rotary_dim = rd == c->head_dim ? 0 : rd;
  c->rope_interleaved = 1;
  c->rope_theta = 10000.0;
  const char *act;
  TRY(ferry__hf_str(r, "activation_function", "gelu_new", &act));
  c->act = FERRY_ACT_GELU;
  if (strcmp(act, "gelu")) {
    TRY(need_act(r, "activation_function", "gelu_new", gelu_tanh, "gelu or a tanh GELU (gelu_new)"));
    c->act = FERRY_ACT_GELU_TANH;
  }
  c->norm = FERRY_NORM_LAYER;
  c->ffn_bias = 1;
  c->lm_head_bias = 1;
  c->parallel_residual = c->parallel_shared_norm = 1;
  return FERRY_OK;
}

static ferry_status alias_int(const struct reader *r, const char *a, const char *b, int64_t hi, int64_t *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(r->root, a);
  return ferry__hf_int(r, x && !cJSON_IsNull(x) ? a : b, 1, 0, 1, hi, out);
}

static ferry_status read_bloom(const struct reader *r, struct ferry_model_config *c) {
  TRY(alias_int(r, "hidden_size", "n_embed", FERRY__MODEL_MAX_DIM, &c->hidden));
  TRY(alias_int(r, "n_layer", "num_hidden_layers", FERRY__MODEL_MAX_LAYERS, &c->n_layers));
  TRY(alias_int(r, "n_head", "num_attention_heads", FERRY__MODEL_MAX_HEADS, &c->n_heads));
  TRY(ferry__hf_int(r, "vocab_size", 1, 0, 1, FERRY__MODEL_MAX_VOCAB, &c->vocab));
  TRY(ferry__hf_int(r, "seq_length", 0, 2048, 1, FERRY__MODEL_MAX_POSITION, &c->max_position));
  TRY(ferry__hf_positive(r, "layer_norm_epsilon", 1e-5, &c->norm_eps));
  TRY(ferry__hf_bool(r, "tie_word_embeddings", 1, &c->tied_embeddings));
  TRY(need_false(r, "apply_residual_connection_post_layernorm", "true is not supported"));
  if (c->hidden % c->n_heads)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: hidden size %lld is not a multiple of %lld heads", r->what,
                       (long long)c->hidden, (long long)c->n_heads);
  c->n_kv_heads = c->n_heads;
  c->head_dim = c->hidden / c->n_heads;
  c->intermediate = 4 * c->hidden;
  c->norm = FERRY_NORM_LAYER;
  c->act = FERRY_ACT_GELU_TANH;
  c->fused_qkv = c->qkv_bias = c->attn_out_bias = c->ffn_bias = 1;
  c->alibi = c->embed_norm = 1;
  c->rope_theta = 0;
  return FERRY_OK;
}

/* ---- Llama 4 (text) --------------------------------------------------------------------------- */

static int l4_moe(const struct ferry_model_config *c, int64_t l) { return ferry__layer_is_moe(c, l); }
static int l4_rope(const struct ferry_model_config *c, int64_t l) { return ferry__layer_rope(c, l); }

static ferry_status read_llama4(const struct reader *r, struct ferry_model_config *c) {
  struct dims d = {.hidden = 5120, .inter = 8192, .layers = 48, .heads = 40, .kv = 8, .head_dim = 128,
                   .vocab = 202048, .maxpos = 4096 * 32, .eps = 1e-5, .theta = 500000.0};
  const int64_t dim_max = 4 * (int64_t)FERRY__MODEL_MAX_DIM;
  int64_t inter = 0;
  TRY(read_dims(r, c, &d, &inter));
  TRY(need_act(r, "hidden_act", "silu", silu, "\"silu\" (SwiGLU)"));
  int bias, qk;
  TRY(ferry__hf_bool(r, "attention_bias", 0, &bias));
  c->qkv_bias = c->attn_out_bias = bias;
  c->norm = FERRY_NORM_RMS;
  c->act = FERRY_ACT_SWIGLU;
  c->rope_interleaved = 1;
  TRY(ferry__hf_bool(r, "use_qk_norm", 1, &qk));
  c->qk_norm = qk ? FERRY_QK_NORM_L2 : FERRY_QK_NORM_NONE;
  TRY(ferry__hf_int(r, "intermediate_size_mlp", 0, 16384, 1, dim_max, &c->intermediate));
  TRY(ferry__hf_int(r, "num_local_experts", 0, 16, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
  TRY(ferry__hf_int(r, "num_experts_per_tok", 0, 1, 1, c->n_experts, &c->experts_per_token));
  int64_t step;
  TRY(ferry__hf_int(r, "interleave_moe_layer_step", 0, 1, 1, FERRY__MODEL_MAX_LAYERS, &step));
  c->moe_layer_step = step > 1 ? step : 0;
  c->expert_intermediate = inter;
  c->n_shared_experts = 1;
  c->shared_intermediate = inter;
  c->router = FERRY_ROUTER_SIGMOID_TOP1;
  c->expert_scale_input = 1;
  c->expert_layout = FERRY_EXPERTS_FUSED_HALVES;
  TRY(ferry__hf_int_or_null(r, "attention_chunk_size", 8192, FERRY__MODEL_MAX_POSITION, &c->attn_chunk));
  TRY(ferry__hf_int(r, "no_rope_layer_interval", 0, 4, 0, FERRY__MODEL_MAX_LAYERS, &c->nope_layer_step));
  /* attn_temperature_tuning was an int (4) in the first configs, a bool since */
  const cJSON *tt = cJSON_GetObjectItemCaseSensitive(r->root, "attn_temperature_tuning");
  int tuning = !tt || cJSON_IsNull(tt) || cJSON_IsTrue(tt) || (cJSON_IsNumber(tt) && tt->valuedouble != 0);
  if (tuning) {
    TRY(ferry__hf_positive(r, "floor_scale", 8192, &c->attn_temp_floor));
    TRY(ferry__hf_positive(r, "attn_scale", 0.1, &c->attn_temp_scale));
  }
  TRY(check_int_list(r, "moe_layers", c, 1, l4_moe));
  TRY(check_int_list(r, "no_rope_layers", c, 0, l4_rope));
  return layer_types(r, c, 0);
}

/* ---- DeepSeek-V2 / V3 ------------------------------------------------------------------------ */

static ferry_status read_deepseek(const struct reader *r, struct ferry_model_config *c) {
  const int v3 = c->family == FERRY_FAMILY_DEEPSEEK_V3;
  const int64_t dim_max = 4 * (int64_t)FERRY__MODEL_MAX_DIM;
  struct dims d = {.kv_is_heads = 1, .maxpos = v3 ? 4096 : 2048, .eps = 1e-6, .theta = 10000.0};
  int64_t inter = 0;
  TRY(read_dims(r, c, &d, &inter));
  TRY(need_act(r, "hidden_act", "silu", silu, "\"silu\" (SwiGLU)"));
  TRY(need_false(r, "attention_bias", "true is not supported for MLA"));
  if (c->n_kv_heads != c->n_heads) return ferry__hf_unsupported(r, "num_key_value_heads", "MLA needs as many as heads");
  c->norm = FERRY_NORM_RMS;
  c->act = FERRY_ACT_SWIGLU;
  c->intermediate = inter;
  TRY(ferry__hf_int_or_null(r, "q_lora_rank", 0, FERRY__MODEL_MAX_DIM, &c->q_lora_rank));
  TRY(ferry__hf_int(r, "kv_lora_rank", 1, 0, 1, FERRY__MODEL_MAX_DIM, &c->kv_lora_rank));
  TRY(ferry__hf_int(r, "qk_nope_head_dim", 1, 0, 1, FERRY__MODEL_MAX_DIM, &c->qk_nope_dim));
  TRY(ferry__hf_int(r, "qk_rope_head_dim", 1, 0, 2, FERRY__MODEL_MAX_DIM, &c->qk_rope_dim));
  TRY(ferry__hf_int(r, "v_head_dim", 1, 0, 1, FERRY__MODEL_MAX_DIM, &c->v_head_dim));
  c->head_dim = c->qk_nope_dim + c->qk_rope_dim;
  TRY(ferry__hf_bool(r, "rope_interleave", 1, &c->rope_interleaved));
  TRY(ferry__hf_int(r, "n_routed_experts", 1, 0, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
  TRY(ferry__hf_int(r, "num_experts_per_tok", 1, 0, 1, c->n_experts, &c->experts_per_token));
  TRY(ferry__hf_int(r, "moe_intermediate_size", 1, 0, 1, dim_max, &c->expert_intermediate));
  TRY(ferry__hf_int_or_null(r, "n_shared_experts", 0, 64, &c->n_shared_experts));
  c->shared_intermediate = c->n_shared_experts * c->expert_intermediate;
  TRY(ferry__hf_int(r, "first_k_dense_replace", 0, 0, 0, c->n_layers, &c->first_dense_layers));
  int64_t freq;
  TRY(ferry__hf_int(r, "moe_layer_freq", 0, 1, 1, FERRY__MODEL_MAX_LAYERS, &freq));
  if (freq != 1) return ferry__hf_unsupported(r, "moe_layer_freq", "only 1 (every layer past first_k_dense_replace) is supported");
  TRY(ferry__hf_bool(r, "norm_topk_prob", 0, &c->norm_topk_prob));
  TRY(ferry__hf_positive(r, "routed_scaling_factor", 1.0, &c->routed_scaling));
  const char *scoring, *method;
  TRY(ferry__hf_str(r, "scoring_func", v3 ? "sigmoid" : "softmax", &scoring));
  TRY(ferry__hf_str(r, "topk_method", v3 ? "noaux_tc" : "greedy", &method));
  int64_t groups = 1, topk_groups = 1;
  TRY(ferry__hf_int_or_null(r, "n_group", 1, FERRY__MODEL_MAX_EXPERTS, &groups));
  TRY(ferry__hf_int_or_null(r, "topk_group", 1, FERRY__MODEL_MAX_EXPERTS, &topk_groups));
  if (v3 && !strcmp(scoring, "sigmoid") && !strcmp(method, "noaux_tc")) {
    c->router = FERRY_ROUTER_SIGMOID_GROUP;
    c->router_score_bias = 1;
  } else if (!v3 && !strcmp(scoring, "softmax") && (!strcmp(method, "greedy") || !strcmp(method, "group_limited_greedy"))) {
    c->router = FERRY_ROUTER_SOFTMAX_GROUP;
    if (!strcmp(method, "greedy")) groups = topk_groups = 1;
  } else {
    char detail[128];
    snprintf(detail, sizeof detail, "scoring_func \"%.16s\" with topk_method \"%.24s\" is not supported for %s", scoring,
             method, ferry_family_name(c->family));
    return ferry__hf_unsupported(r, "topk_method", detail);
  }
  c->n_group = groups;
  c->topk_group = topk_groups;
  return FERRY_OK;
}

/* ---- gpt-oss --------------------------------------------------------------------------------- */

static ferry_status read_gpt_oss(const struct reader *r, struct ferry_model_config *c) {
  struct dims d = {.hidden = 2880, .inter = 2880, .layers = 36, .heads = 64, .kv = 8, .head_dim = 64,
                   .vocab = 201088, .maxpos = 131072, .eps = 1e-5, .theta = 150000.0};
  int64_t inter = 0;
  TRY(read_dims(r, c, &d, &inter));
  TRY(need_act(r, "hidden_act", "silu", silu, "\"silu\" (clamped SwiGLU)"));
  int bias;
  TRY(ferry__hf_bool(r, "attention_bias", 1, &bias));
  c->qkv_bias = c->attn_out_bias = bias;
  c->norm = FERRY_NORM_RMS;
  c->act = FERRY_ACT_SWIGLU;
  c->attn_sinks = 1;
  c->expert_intermediate = inter;
  TRY(ferry__hf_int(r, "num_local_experts", 0, 128, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(r->root, "num_experts_per_tok");
  TRY(ferry__hf_int(r, k && !cJSON_IsNull(k) ? "num_experts_per_tok" : "experts_per_token", 0, 4, 1, c->n_experts,
                    &c->experts_per_token));
  TRY(ferry__hf_num_or_null(r, "swiglu_limit", 7.0, &c->swiglu_limit));
  TRY(ferry__hf_int_or_null(r, "sliding_window", 128, FERRY__MODEL_MAX_POSITION, &c->sliding_window));
  c->sliding_pattern = 2;
  c->router = FERRY_ROUTER_TOPK_SOFTMAX;
  c->router_bias = 1;
  c->expert_layout = FERRY_EXPERTS_FUSED_INTERLEAVED;
  return layer_types(r, c, 1);
}

ferry_status ferry__hf_read_family(const struct reader *r, struct ferry_model_config *c) {
  switch (c->family) {
    case FERRY_FAMILY_QWEN3:
    case FERRY_FAMILY_QWEN3_MOE: return read_qwen3(r, c);
    case FERRY_FAMILY_GEMMA2:
    case FERRY_FAMILY_GEMMA3: return read_gemma(r, c);
    case FERRY_FAMILY_PHIMOE: return read_phimoe(r, c);
    case FERRY_FAMILY_GPT_NEOX: return read_neox(r, c);
    case FERRY_FAMILY_BLOOM: return read_bloom(r, c);
    case FERRY_FAMILY_GPTJ: return read_gptj(r, c);
    case FERRY_FAMILY_LLAMA4: return read_llama4(r, c);
    case FERRY_FAMILY_DEEPSEEK_V2:
    case FERRY_FAMILY_DEEPSEEK_V3: return read_deepseek(r, c);
    case FERRY_FAMILY_GPT_OSS: return read_gpt_oss(r, c);
    case FERRY_FAMILY_OPT: return FERRY_ERR_INTERNAL; /* hf_config.c reads OPT */
    default: return read_classic(r, c);
  }
}
