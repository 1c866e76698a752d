/* Writing a config.json for a configuration, in each family's Hugging Face spelling, so presets
 * and synthetic models can be saved next to their weights and read back unchanged (the text is
 * read back before it is returned: a configuration it cannot express is refused). */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "runtime/model/hf_impl.h"

static const char *torch_dtype(enum ferry_dtype d) {
  switch (d) {
  case FERRY_DTYPE_F32: return "float32";
  case FERRY_DTYPE_F16: return "float16";
  case FERRY_DTYPE_BF16: return "bfloat16";
  default: return ferry_dtype_name(d);
  }
}

/* cJSON's Add* return NULL on allocation failure; `ok` collects that so the writer checks once. */
struct writer {
  cJSON *o;
  int ok;
};

static void w_int(struct writer *w, const char *k, int64_t v) {
  if (!cJSON_AddNumberToObject(w->o, k, (double)v)) w->ok = 0;
}
static void w_num(struct writer *w, const char *k, double v) {
  if (!cJSON_AddNumberToObject(w->o, k, v)) w->ok = 0;
}
static void w_bool(struct writer *w, const char *k, int v) {
  if (!cJSON_AddBoolToObject(w->o, k, v)) w->ok = 0;
}
static void w_str(struct writer *w, const char *k, const char *v) {
  if (!cJSON_AddStringToObject(w->o, k, v)) w->ok = 0;
}
static void w_null(struct writer *w, const char *k) {
  if (!cJSON_AddNullToObject(w->o, k)) w->ok = 0;
}
static void w_int_or_null(struct writer *w, const char *k, int64_t v) {
  if (v > 0)
    w_int(w, k, v);
  else
    w_null(w, k);
}
static void w_num_or_null(struct writer *w, const char *k, double v) {
  if (v > 0)
    w_num(w, k, v);
  else
    w_null(w, k);
}
/* A child object, written into through its own writer sharing the ok flag. */
static struct writer w_obj(struct writer *w, const char *k) {
  struct writer c = {cJSON_AddObjectToObject(w->o, k), w->ok};
  if (!c.o) w->ok = c.ok = 0;
  return c;
}
static void w_strs(struct writer *w, const char *k, const char *const *v, int n) {
  cJSON *a = cJSON_AddArrayToObject(w->o, k);
  if (!a) {
    w->ok = 0;
    return;
  }
  for (int i = 0; i < n; i++) {
    cJSON *s = cJSON_CreateString(v[i]);
    if (!s || !cJSON_AddItemToArray(a, s)) {
      cJSON_Delete(s);
      w->ok = 0;
      return;
    }
  }
}
static void w_floats(struct writer *w, const char *k, const float *v, int n) {
  cJSON *a = cJSON_AddArrayToObject(w->o, k);
  if (!a) {
    w->ok = 0;
    return;
  }
  for (int i = 0; i < n; i++) {
    cJSON *x = cJSON_CreateNumber((double)v[i]);
    if (!x || !cJSON_AddItemToArray(a, x)) {
      cJSON_Delete(x);
      w->ok = 0;
      return;
    }
  }
}

static void write_rope(struct writer *w, const struct ferry_model_config *c) {
  const struct ferry_rope_scaling *s = &c->rope_scaling;
  static const char *const names[] = {"default", "linear", "dynamic", "yarn", "llama3", "longrope"};
  if (s->type == FERRY_ROPE_DEFAULT) {
    w_null(w, "rope_scaling");
    return;
  }
  struct writer r = w_obj(w, "rope_scaling");
  if (!r.o) return;
  w_str(&r, "rope_type", names[s->type]);
  if (s->factor > 0) w_num(&r, "factor", s->factor);
  if (s->original_max_position) w_int(&r, "original_max_position_embeddings", s->original_max_position);
  if (s->type == FERRY_ROPE_LLAMA3) {
    w_num(&r, "low_freq_factor", s->low_freq_factor);
    w_num(&r, "high_freq_factor", s->high_freq_factor);
  }
  if (s->type == FERRY_ROPE_YARN) {
    if (s->beta_fast > 0) w_num(&r, "beta_fast", s->beta_fast);
    if (s->beta_slow > 0) w_num(&r, "beta_slow", s->beta_slow);
    if (s->mscale > 0) w_num(&r, "mscale", s->mscale);
    if (s->mscale_all_dim > 0) w_num(&r, "mscale_all_dim", s->mscale_all_dim);
    if (s->no_truncate) w_bool(&r, "truncate", 0);
  }
  if (s->attention_factor > 0 && (s->type == FERRY_ROPE_YARN || s->type == FERRY_ROPE_LONGROPE))
    w_num(&r, "attention_factor", s->attention_factor);
  if (s->type == FERRY_ROPE_LONGROPE) {
    w_floats(&r, "short_factor", s->short_factor, s->n_factors);
    w_floats(&r, "long_factor", s->long_factor, s->n_factors);
    if (s->short_mscale > 0) w_num(&r, "short_mscale", s->short_mscale);
    if (s->long_mscale > 0) w_num(&r, "long_mscale", s->long_mscale);
  }
  w->ok &= r.ok;
}

static void write_quant(struct writer *w, const struct ferry_ckpt_quant_config *q) {
  if (q->kind == FERRY_CKPT_NONE) return;
  struct writer o = w_obj(w, "quantization_config");
  if (!o.o) return;
  switch (q->kind) {
    case FERRY_CKPT_FP8_BLOCK: {
      w_str(&o, "quant_method", "fp8");
      w_str(&o, "fmt", "e4m3");
      w_str(&o, "activation_scheme", "dynamic");
      cJSON *a = cJSON_CreateIntArray((const int[]){(int)q->block[0], (int)q->block[1]}, 2);
      if (!a || !cJSON_AddItemToObject(o.o, "weight_block_size", a)) {
        cJSON_Delete(a);
        o.ok = 0;
      }
      break;
    }
    case FERRY_CKPT_MXFP4: {
      static const char *const keep[] = {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                         "lm_head"};
      w_str(&o, "quant_method", "mxfp4");
      w_strs(&o, "modules_to_not_convert", keep, 4);
      break;
    }
    case FERRY_CKPT_GPTQ:
      w_str(&o, "quant_method", "gptq");
      w_int(&o, "bits", q->bits);
      w_int(&o, "group_size", q->group_size ? q->group_size : -1);
      w_bool(&o, "desc_act", q->desc_act);
      w_bool(&o, "sym", q->symmetric);
      w_str(&o, "checkpoint_format", "gptq");
      break;
    case FERRY_CKPT_AWQ:
      w_str(&o, "quant_method", "awq");
      w_int(&o, "bits", q->bits);
      w_int(&o, "group_size", q->group_size);
      w_bool(&o, "zero_point", 1);
      w_str(&o, "version", "gemm");
      break;
    case FERRY_CKPT_COMPRESSED: {
      w_str(&o, "quant_method", "compressed-tensors");
      w_str(&o, "format", "pack-quantized");
      struct writer groups = w_obj(&o, "config_groups");
      struct writer g0 = groups.o ? w_obj(&groups, "group_0") : groups;
      static const char *const targets[] = {"Linear"};
      if (g0.o) {
        w_strs(&g0, "targets", targets, 1);
        w_null(&g0, "input_activations");
        struct writer wt = w_obj(&g0, "weights");
        if (wt.o) {
          w_int(&wt, "num_bits", q->bits);
          w_str(&wt, "type", "int");
          w_bool(&wt, "symmetric", q->symmetric);
          w_int(&wt, "group_size", q->group_size);
          w_str(&wt, "strategy", "group");
        }
        g0.ok &= wt.ok;
      }
      o.ok &= groups.ok & g0.ok;
      static const char *const ignore[] = {"lm_head"};
      w_strs(&o, "ignore", ignore, 1);
      break;
    }
    case FERRY_CKPT_NONE: break;
  }
  w->ok &= o.ok;
}

static void write_layer_types(struct writer *w, const struct ferry_model_config *c) {
  cJSON *a = cJSON_AddArrayToObject(w->o, "layer_types");
  if (!a) {
    w->ok = 0;
    return;
  }
  for (int64_t l = 0; l < c->n_layers; l++) {
    const char *t = ferry__layer_window(c, l) ? "sliding_attention"
                    : ferry__layer_chunk(c, l) ? "chunked_attention"
                                               : "full_attention";
    cJSON *s = cJSON_CreateString(t);
    if (!s || !cJSON_AddItemToArray(a, s)) {
      cJSON_Delete(s);
      w->ok = 0;
      return;
    }
  }
}

static void write_dims(struct writer *w, const struct ferry_model_config *c, int64_t inter, const char *eps_key) {
  w_int(w, "hidden_size", c->hidden);
  w_int(w, "intermediate_size", inter);
  w_int(w, "num_hidden_layers", c->n_layers);
  w_int(w, "num_attention_heads", c->n_heads);
  w_int(w, "num_key_value_heads", c->n_kv_heads);
  w_int(w, "head_dim", c->head_dim);
  w_int(w, "vocab_size", c->vocab);
  w_int(w, "max_position_embeddings", c->max_position);
  w_num(w, eps_key, c->norm_eps);
  w_num(w, "rope_theta", c->rope_theta);
  w_bool(w, "tie_word_embeddings", c->tied_embeddings);
  write_rope(w, c);
}

static void write_qwen_moe_layers(struct writer *w, const struct ferry_model_config *c) {
  w_int(w, "decoder_sparse_step", c->moe_layer_step > 1 ? c->moe_layer_step : 1);
  cJSON *a = cJSON_AddArrayToObject(w->o, "mlp_only_layers");
  if (!a) {
    w->ok = 0;
    return;
  }
  for (int64_t l = 0; l < c->first_dense_layers; l++) {
    cJSON *x = cJSON_CreateNumber((double)l);
    if (!x || !cJSON_AddItemToArray(a, x)) {
      cJSON_Delete(x);
      w->ok = 0;
      return;
    }
  }
}

static void write_qwen_window(struct writer *w, const struct ferry_model_config *c) {
  w_bool(w, "use_sliding_window", c->sliding_window > 0);
  w_int_or_null(w, "sliding_window", c->sliding_window);
  w_int(w, "max_window_layers", c->sliding_window > 0 ? 0 : c->n_layers);
}

/* The families whose config.json names its fields in its own way (GPT-2-era spellings): whether
 * c is one of them, written. */
static int write_own_names(struct writer *w, const struct ferry_model_config *c) {
  switch (c->family) {
    case FERRY_FAMILY_OPT:
      w_int(w, "hidden_size", c->hidden);
      w_int(w, "ffn_dim", c->intermediate);
      w_int(w, "num_hidden_layers", c->n_layers);
      w_int(w, "num_attention_heads", c->n_heads);
      w_int(w, "vocab_size", c->vocab);
      w_int(w, "max_position_embeddings", c->max_position);
      w_int(w, "word_embed_proj_dim", c->hidden);
      w_bool(w, "do_layer_norm_before", 1);
      w_str(w, "activation_function", c->act == FERRY_ACT_GELU ? "gelu" : "relu");
      w_bool(w, "enable_bias", c->qkv_bias);
      w_bool(w, "layer_norm_elementwise_affine", 1);
      w_bool(w, "tie_word_embeddings", c->tied_embeddings);
      return 1;
    case FERRY_FAMILY_BLOOM:
      w_int(w, "hidden_size", c->hidden);
      w_int(w, "n_layer", c->n_layers);
      w_int(w, "n_head", c->n_heads);
      w_int(w, "vocab_size", c->vocab);
      w_int(w, "seq_length", c->max_position);
      w_num(w, "layer_norm_epsilon", c->norm_eps);
      w_bool(w, "apply_residual_connection_post_layernorm", 0);
      w_bool(w, "tie_word_embeddings", c->tied_embeddings);
      return 1;
    case FERRY_FAMILY_GPTJ:
      w_int(w, "n_embd", c->hidden);
      w_int(w, "n_layer", c->n_layers);
      w_int(w, "n_head", c->n_heads);
      w_int(w, "n_inner", c->intermediate);
      w_int(w, "vocab_size", c->vocab);
      w_int(w, "n_positions", c->max_position);
      w_int(w, "rotary_dim", c->rotary_dim ? c->rotary_dim : c->head_dim);
      w_num(w, "layer_norm_epsilon", c->norm_eps);
      w_str(w, "activation_function", c->act == FERRY_ACT_GELU ? "gelu" : "gelu_new");
      w_bool(w, "tie_word_embeddings", 0);
      return 1;
    case FERRY_FAMILY_GPT_NEOX:
      write_dims(w, c, c->intermediate, "layer_norm_eps");
      w_str(w, "hidden_act", c->act == FERRY_ACT_GELU ? "gelu" : "gelu_fast");
      w_num(w, "rotary_pct", c->rotary_dim ? (double)c->rotary_dim / (double)c->head_dim : 1.0);
      w_bool(w, "use_parallel_residual", c->parallel_residual);
      w_bool(w, "attention_bias", c->qkv_bias);
      return 1;
    default: return 0;
  }
}

static void write_llama4(struct writer *w, const struct ferry_model_config *c) {
  w_bool(w, "attention_bias", c->qkv_bias);
  w_bool(w, "use_qk_norm", c->qk_norm == FERRY_QK_NORM_L2);
  w_int(w, "intermediate_size_mlp", c->intermediate);
  w_int(w, "num_local_experts", c->n_experts);
  w_int(w, "num_experts_per_tok", c->experts_per_token);
  w_int(w, "interleave_moe_layer_step", c->moe_layer_step > 1 ? c->moe_layer_step : 1);
  w_int_or_null(w, "attention_chunk_size", c->attn_chunk);
  w_int(w, "no_rope_layer_interval", c->nope_layer_step);
  w_bool(w, "attn_temperature_tuning", c->attn_temp_floor > 0);
  if (c->attn_temp_floor > 0) {
    w_num(w, "floor_scale", c->attn_temp_floor);
    w_num(w, "attn_scale", c->attn_temp_scale);
  }
  write_layer_types(w, c);
}

static void write_deepseek(struct writer *w, const struct ferry_model_config *c) {
  w_bool(w, "attention_bias", 0);
  w_int_or_null(w, "q_lora_rank", c->q_lora_rank);
  w_int(w, "kv_lora_rank", c->kv_lora_rank);
  w_int(w, "qk_nope_head_dim", c->qk_nope_dim);
  w_int(w, "qk_rope_head_dim", c->qk_rope_dim);
  w_int(w, "v_head_dim", c->v_head_dim);
  w_bool(w, "rope_interleave", c->rope_interleaved);
  w_int(w, "n_routed_experts", c->n_experts);
  w_int(w, "num_experts_per_tok", c->experts_per_token);
  w_int(w, "moe_intermediate_size", c->expert_intermediate);
  w_int(w, "n_shared_experts", c->n_shared_experts);
  w_int(w, "first_k_dense_replace", c->first_dense_layers);
  w_int(w, "moe_layer_freq", 1);
  w_bool(w, "norm_topk_prob", c->norm_topk_prob);
  w_num(w, "routed_scaling_factor", c->routed_scaling);
  w_str(w, "scoring_func", c->router == FERRY_ROUTER_SIGMOID_GROUP ? "sigmoid" : "softmax");
  w_str(w, "topk_method", c->router == FERRY_ROUTER_SIGMOID_GROUP ? "noaux_tc"
                          : c->n_group > 1                        ? "group_limited_greedy"
                                                                  : "greedy");
  w_int(w, "n_group", c->n_group);
  w_int(w, "topk_group", c->topk_group);
}

static void write_family(struct writer *w, const struct ferry_model_config *c) {
  if (write_own_names(w, c)) return;
  const enum ferry_family f = c->family;
  const int expert_sized = f == FERRY_FAMILY_MIXTRAL || f == FERRY_FAMILY_OLMOE || f == FERRY_FAMILY_PHIMOE ||
                           f == FERRY_FAMILY_GPT_OSS || f == FERRY_FAMILY_LLAMA4;
  write_dims(w, c, expert_sized ? c->expert_intermediate : c->intermediate, "rms_norm_eps");
  const int gemma = f == FERRY_FAMILY_GEMMA2 || f == FERRY_FAMILY_GEMMA3;
  w_str(w, gemma ? "hidden_activation" : "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu");
  switch (f) {
    case FERRY_FAMILY_LLAMA:
      w_bool(w, "attention_bias", c->qkv_bias);
      w_bool(w, "mlp_bias", 0);
      break;
    case FERRY_FAMILY_MISTRAL: w_int_or_null(w, "sliding_window", c->sliding_window); break;
    case FERRY_FAMILY_MIXTRAL:
      w_int_or_null(w, "sliding_window", c->sliding_window);
      w_int(w, "num_local_experts", c->n_experts);
      w_int(w, "num_experts_per_tok", c->experts_per_token);
      break;
    case FERRY_FAMILY_QWEN2:
    case FERRY_FAMILY_QWEN2_MOE:
      write_qwen_window(w, c);
      if (f == FERRY_FAMILY_QWEN2) break;
      write_qwen_moe_layers(w, c);
      w_int(w, "num_experts", c->n_experts);
      w_int(w, "num_experts_per_tok", c->experts_per_token);
      w_int(w, "moe_intermediate_size", c->expert_intermediate);
      w_int(w, "shared_expert_intermediate_size", c->shared_intermediate);
      w_bool(w, "norm_topk_prob", c->norm_topk_prob);
      break;
    case FERRY_FAMILY_OLMOE:
      w_bool(w, "attention_bias", c->qkv_bias);
      w_int(w, "num_experts", c->n_experts);
      w_int(w, "num_experts_per_tok", c->experts_per_token);
      w_bool(w, "norm_topk_prob", c->norm_topk_prob);
      break;
    case FERRY_FAMILY_QWEN3:
    case FERRY_FAMILY_QWEN3_MOE:
      w_bool(w, "attention_bias", c->qkv_bias);
      write_qwen_window(w, c);
      if (f == FERRY_FAMILY_QWEN3) break;
      write_qwen_moe_layers(w, c);
      w_int(w, "num_experts", c->n_experts);
      w_int(w, "num_experts_per_tok", c->experts_per_token);
      w_int(w, "moe_intermediate_size", c->expert_intermediate);
      w_bool(w, "norm_topk_prob", c->norm_topk_prob);
      break;
    case FERRY_FAMILY_GEMMA2:
    case FERRY_FAMILY_GEMMA3:
      w_bool(w, "attention_bias", c->qkv_bias);
      w_num(w, "query_pre_attn_scalar", c->query_pre_attn_scalar);
      w_num_or_null(w, "attn_logit_softcapping", c->attn_softcap);
      w_num_or_null(w, "final_logit_softcapping", c->final_softcap);
      w_int_or_null(w, "sliding_window", c->sliding_window);
      if (f == FERRY_FAMILY_GEMMA3) {
        w_int(w, "sliding_window_pattern", c->sliding_pattern ? c->sliding_pattern : c->n_layers + 1);
        w_num(w, "rope_local_base_freq", c->rope_local_theta);
      }
      write_layer_types(w, c);
      break;
    case FERRY_FAMILY_PHIMOE:
      w_bool(w, "attention_bias", c->qkv_bias);
      w_bool(w, "lm_head_bias", c->lm_head_bias);
      w_int_or_null(w, "sliding_window", c->sliding_window);
      w_int(w, "num_local_experts", c->n_experts);
      w_int(w, "num_experts_per_tok", c->experts_per_token);
      w_num(w, "router_jitter_noise", c->router_jitter);
      break;
    case FERRY_FAMILY_LLAMA4: write_llama4(w, c); break;
    case FERRY_FAMILY_DEEPSEEK_V2:
    case FERRY_FAMILY_DEEPSEEK_V3: write_deepseek(w, c); break;
    case FERRY_FAMILY_GPT_OSS:
      w_bool(w, "attention_bias", c->qkv_bias);
      w_int(w, "num_local_experts", c->n_experts);
      w_int(w, "num_experts_per_tok", c->experts_per_token);
      w_num(w, "swiglu_limit", c->swiglu_limit);
      w_int_or_null(w, "sliding_window", c->sliding_window);
      write_layer_types(w, c);
      break;
    default: break;
  }
}

static void write_vision(struct writer *w, const struct ferry_vision_config *v) {
  struct writer o = w_obj(w, "vision_config");
  if (!o.o) return;
  w_str(&o, "model_type", v->kind == FERRY_VISION_LLAMA4 ? "llama4_vision_model" : "siglip_vision_model");
  w_int(&o, "hidden_size", v->hidden);
  w_int(&o, "intermediate_size", v->intermediate);
  w_int(&o, "num_hidden_layers", v->layers);
  w_int(&o, "num_attention_heads", v->heads);
  w_int(&o, "patch_size", v->patch);
  w_int(&o, "image_size", v->image);
  w_int(&o, "num_channels", v->channels);
  if (v->kind == FERRY_VISION_LLAMA4) {
    w_int(&o, "vision_output_dim", v->output_dim);
    w_int(&o, "projector_input_dim", v->projector_in);
    w_int(&o, "projector_output_dim", v->projector_out);
  }
  w->ok &= o.ok;
}

static void write_config(struct writer *w, const struct ferry_model_config *c) {
  const struct ferry_family_traits *t = ferry__family(c->family);
  w_str(w, "_name_or_path", c->name);
  static const char *const mm_arch[] = {"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration"};
  const int mm = c->multimodal_names;
  const char *arch = mm ? mm_arch[c->family == FERRY_FAMILY_LLAMA4] : t->architecture;
  w_strs(w, "architectures", &arch, 1);
  w_str(w, "torch_dtype", torch_dtype(c->dtype));
  write_quant(w, &c->quant);
  struct writer text = *w;
  if (mm) {
    w_str(w, "model_type", c->family == FERRY_FAMILY_LLAMA4 ? "llama4" : "gemma3");
    if (c->vision.kind != FERRY_VISION_NONE) write_vision(w, &c->vision);
    text = w_obj(w, "text_config");
    if (!text.o) return;
  }
  w_str(&text, "model_type", t->model_type);
  write_family(&text, c);
  w->ok &= text.ok;
}

/* The first field in which two configurations differ, or NULL (the name is a label, not a
 * shape, and an empty one cannot survive the trip). */
static const char *config_diff(const struct ferry_model_config *a, const struct ferry_model_config *b) {
#define SAME(field) \
  if (a->field != b->field) return #field
  SAME(family); SAME(n_layers); SAME(hidden); SAME(intermediate); SAME(n_heads); SAME(n_kv_heads);
  SAME(head_dim); SAME(vocab); SAME(max_position); SAME(n_experts); SAME(experts_per_token);
  SAME(expert_intermediate); SAME(n_shared_experts); SAME(shared_intermediate); SAME(shared_expert_gate);
  SAME(norm_topk_prob); SAME(tied_embeddings); SAME(qkv_bias); SAME(attn_out_bias); SAME(ffn_bias);
  SAME(qk_norm); SAME(learned_positions); SAME(norm); SAME(act); SAME(norm_eps); SAME(rope_theta);
  SAME(sliding_window); SAME(dtype); SAME(first_dense_layers); SAME(moe_layer_step); SAME(sliding_pattern);
  SAME(rope_local_theta); SAME(rotary_dim); SAME(rope_interleaved); SAME(norm_unit_offset); SAME(sandwich_norms);
  SAME(scale_embeddings); SAME(query_pre_attn_scalar); SAME(attn_softcap); SAME(final_softcap);
  SAME(parallel_residual); SAME(parallel_shared_norm); SAME(fused_qkv); SAME(embed_norm); SAME(alibi); SAME(attn_sinks); SAME(attn_chunk);
  SAME(nope_layer_step); SAME(attn_temp_floor); SAME(attn_temp_scale); SAME(lm_head_bias); SAME(q_lora_rank);
  SAME(kv_lora_rank); SAME(qk_nope_dim); SAME(qk_rope_dim); SAME(v_head_dim); SAME(router); SAME(router_bias);
  SAME(router_score_bias); SAME(n_group); SAME(topk_group); SAME(routed_scaling); SAME(router_jitter);
  SAME(expert_scale_input); SAME(expert_layout); SAME(swiglu_limit); SAME(multimodal_names);
  SAME(rope_scaling.type); SAME(rope_scaling.factor); SAME(rope_scaling.original_max_position);
  SAME(rope_scaling.low_freq_factor); SAME(rope_scaling.high_freq_factor); SAME(rope_scaling.beta_fast);
  SAME(rope_scaling.beta_slow); SAME(rope_scaling.mscale); SAME(rope_scaling.mscale_all_dim);
  SAME(rope_scaling.attention_factor); SAME(rope_scaling.no_truncate); SAME(rope_scaling.n_factors);
  SAME(rope_scaling.short_mscale); SAME(rope_scaling.long_mscale);
  SAME(quant.kind); SAME(quant.bits); SAME(quant.group_size); SAME(quant.block[0]); SAME(quant.block[1]);
  SAME(quant.symmetric); SAME(quant.desc_act); SAME(quant.experts_only);
  SAME(vision.kind); SAME(vision.hidden); SAME(vision.intermediate); SAME(vision.layers); SAME(vision.heads);
  SAME(vision.patch); SAME(vision.image); SAME(vision.channels); SAME(vision.output_dim); SAME(vision.projector_in);
  SAME(vision.projector_out);
#undef SAME
  for (int i = 0; i < a->rope_scaling.n_factors && i < FERRY_ROPE_MAX_FACTORS; i++)
    if (a->rope_scaling.short_factor[i] != b->rope_scaling.short_factor[i] ||
        a->rope_scaling.long_factor[i] != b->rope_scaling.long_factor[i])
      return "rope_scaling factors";
  return NULL;
}

ferry_status ferry_model_config_json(const ferry_model *model, char **out) {
  if (!model || !out) return ferry__fail(FERRY_ERR_INVALID, "ferry_model_config_json: NULL argument");
  *out = NULL;
  ferry__json_init();
  const struct ferry_model_config *c = &model->cfg;
  struct writer w = {.o = cJSON_CreateObject(), .ok = 1};
  if (!w.o) return ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory writing config.json", c->name);
  write_config(&w, c);
  ferry_status st = FERRY_OK;
  if (!w.ok) {
    st = ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory writing config.json", c->name);
    goto out_delete;
  }
  /* Not every configuration has a config.json spelling (e.g. Qwen2 without q/k/v biases):
   * read the text back and refuse rather than write a file that means something else. */
  struct ferry_model_config back;
  struct reader r = {.what = "config.json", .root = w.o, .top = w.o};
  st = ferry__hf_read_root(&r, "config.json", &back);
  if (st != FERRY_OK) goto out_delete;
  const char *diff = config_diff(c, &back);
  if (diff) {
    st = ferry__fail(FERRY_ERR_UNSUPPORTED,
                     "model %s: field %s of this configuration cannot be expressed in a %s config.json", c->name,
                     diff, ferry_family_name(c->family));
    goto out_delete;
  }
  char *text = cJSON_Print(w.o);
  if (!text) {
    st = ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory writing config.json", c->name);
    goto out_delete;
  }
  *out = text; /* cJSON allocates through ferry_malloc (ferry__json_init), so ferry_free works */
out_delete:
  cJSON_Delete(w.o);
  return st;
}
