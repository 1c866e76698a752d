/* Hugging Face config.json reading: the file (or folder), the model_type dispatch (including
 * the text part of multimodal Gemma 3 and Llama 4 checkpoints and their vision tower's size),
 * the typed accessors the family readers share, and OPT. Family fields: hf_families.c; RoPE and
 * quantization: hf_rope.c; writing: hf_write.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/names.h"
#include "runtime/model/hf_impl.h"

/* A config.json is a few KB; anything this large is not one. */
#define CONFIG_MAX_BYTES (4u << 20)

ferry_status ferry__hf_int(const struct reader *r, const char *key, int required, int64_t def, int64_t lo, int64_t hi,
                           int64_t *out) {
  int64_t v = def;
  ferry_status st = ferry__json_i64(r->root, key, !required, &v, r->what, NULL);
  if (st == FERRY_ERR_NOT_FOUND)
    v = def;
  else if (st != FERRY_OK)
    return st;
  if (v < lo || v > hi)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s\" = %lld, expected an integer in %lld..%lld", r->what, key,
                       (long long)v, (long long)lo, (long long)hi);
  *out = v;
  return FERRY_OK;
}

ferry_status ferry__hf_int_or_null(const struct reader *r, const char *key, int64_t def, int64_t hi, int64_t *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->root, key);
  if (!item) {
    *out = def;
    return FERRY_OK;
  }
  if (cJSON_IsNull(item)) {
    *out = 0;
    return FERRY_OK;
  }
  return ferry__hf_int(r, key, 1, 0, 0, hi, out);
}

ferry_status ferry__hf_positive(const struct reader *r, const char *key, double def, double *out) {
  double v = def;
  ferry_status st = ferry__json_f64(r->root, key, 1, &v, r->what, NULL);
  if (st == FERRY_ERR_NOT_FOUND)
    v = def;
  else if (st != FERRY_OK)
    return st;
  if (!(v > 0)) return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s\" = %g, expected a positive number", r->what, key, v);
  *out = v;
  return FERRY_OK;
}

ferry_status ferry__hf_num_or_null(const struct reader *r, const char *key, double def, double *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->root, key);
  if (!item) {
    *out = def;
    return FERRY_OK;
  }
  if (cJSON_IsNull(item)) {
    *out = 0;
    return FERRY_OK;
  }
  if (!cJSON_IsNumber(item) || !(item->valuedouble >= 0))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s\" must be a number >= 0 or null", r->what, key);
  *out = item->valuedouble;
  return FERRY_OK;
}

ferry_status ferry__hf_bool(const struct reader *r, const char *key, int def, int *out) {
  ferry_status st = ferry__json_bool(r->root, key, 1, out, r->what, NULL);
  if (st == FERRY_ERR_NOT_FOUND) {
    *out = def;
    return FERRY_OK;
  }
  return st;
}

ferry_status ferry__hf_str(const struct reader *r, const char *key, const char *def, const char **out) {
  ferry_status st = ferry__json_str(r->root, key, 1, out, r->what, NULL);
  if (st == FERRY_ERR_NOT_FOUND) {
    *out = def;
    return FERRY_OK;
  }
  return st;
}

ferry_status ferry__hf_unsupported(const struct reader *r, const char *field, const char *detail) {
  return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: %s: %s", r->what, field, detail);
}

static ferry_status read_opt(const struct reader *r, struct ferry_model_config *c) {
  TRY(ferry__hf_int(r, "hidden_size", 1, 0, 1, FERRY__MODEL_MAX_DIM, &c->hidden));
  TRY(ferry__hf_int(r, "ffn_dim", 1, 0, 1, 4 * (int64_t)FERRY__MODEL_MAX_DIM, &c->intermediate));
  TRY(ferry__hf_int(r, "num_hidden_layers", 1, 0, 1, FERRY__MODEL_MAX_LAYERS, &c->n_layers));
  TRY(ferry__hf_int(r, "num_attention_heads", 1, 0, 1, FERRY__MODEL_MAX_HEADS, &c->n_heads));
  TRY(ferry__hf_int(r, "vocab_size", 1, 0, 1, FERRY__MODEL_MAX_VOCAB, &c->vocab));
  TRY(ferry__hf_int(r, "max_position_embeddings", 0, 2048, 1, FERRY__MODEL_MAX_POSITION - 2, &c->max_position));
  if (c->hidden % c->n_heads != 0)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld",
                       r->what, (long long)c->hidden, (long long)c->n_heads);
  c->n_kv_heads = c->n_heads;
  c->head_dim = c->hidden / c->n_heads;
  int64_t proj = 0;
  TRY(ferry__hf_int(r, "word_embed_proj_dim", 0, c->hidden, 1, FERRY__MODEL_MAX_DIM, &proj));
  if (proj != c->hidden)
    return ferry__hf_unsupported(r, "word_embed_proj_dim", "differs from hidden_size (project_in/out) and is not supported");
  int pre = 1, affine = 1, bias = 1;
  TRY(ferry__hf_bool(r, "do_layer_norm_before", 1, &pre));
  if (!pre) return ferry__hf_unsupported(r, "do_layer_norm_before", "false (post-norm, OPT-350m) is not supported");
  TRY(ferry__hf_bool(r, "layer_norm_elementwise_affine", 1, &affine));
  if (!affine) return ferry__hf_unsupported(r, "layer_norm_elementwise_affine", "false is not supported");
  TRY(ferry__hf_bool(r, "enable_bias", 1, &bias));
  c->qkv_bias = c->attn_out_bias = c->ffn_bias = bias;
  const char *act;
  TRY(ferry__hf_str(r, "activation_function", "relu", &act));
  if (!strcmp(act, "relu"))
    c->act = FERRY_ACT_RELU;
  else if (!strcmp(act, "gelu"))
    c->act = FERRY_ACT_GELU;
  else
    return ferry__hf_unsupported(r, "activation_function", "only \"relu\" and \"gelu\" are supported");
  TRY(ferry__hf_bool(r, "tie_word_embeddings", 1, &c->tied_embeddings));
  c->norm = FERRY_NORM_LAYER;
  c->norm_eps = 1e-5; /* nn.LayerNorm's default; OPT does not store it */
  c->rope_theta = 0;
  c->learned_positions = 1;
  return FERRY_OK;
}

/* Fields that change the numbers a model computes, understood only by some families: found in
 * another family's config they mean something ferry would silently drop. */
static ferry_status foreign_fields(const struct reader *r, const struct ferry_model_config *c) {
  static const struct {
    const char *key;
    enum ferry_family a, b;
  } keys[] = {
      {"attn_logit_softcapping", FERRY_FAMILY_GEMMA2, FERRY_FAMILY_GEMMA3},
      {"final_logit_softcapping", FERRY_FAMILY_GEMMA2, FERRY_FAMILY_GEMMA3},
      {"query_pre_attn_scalar", FERRY_FAMILY_GEMMA2, FERRY_FAMILY_GEMMA3},
      {"kv_lora_rank", FERRY_FAMILY_DEEPSEEK_V2, FERRY_FAMILY_DEEPSEEK_V3},
      {"q_lora_rank", FERRY_FAMILY_DEEPSEEK_V2, FERRY_FAMILY_DEEPSEEK_V3},
      {"attention_chunk_size", FERRY_FAMILY_LLAMA4, FERRY_FAMILY_LLAMA4},
      {"no_rope_layers", FERRY_FAMILY_LLAMA4, FERRY_FAMILY_LLAMA4},
      {"swiglu_limit", FERRY_FAMILY_GPT_OSS, FERRY_FAMILY_GPT_OSS},
      {"rotary_pct", FERRY_FAMILY_GPT_NEOX, FERRY_FAMILY_GPT_NEOX},
      {"rotary_dim", FERRY_FAMILY_GPTJ, FERRY_FAMILY_GPTJ},
  };
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r->root, keys[i].key);
    if (it && !cJSON_IsNull(it) && c->family != keys[i].a && c->family != keys[i].b)
      return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: field \"%s\" is not understood for model_type %s", r->what,
                         keys[i].key, ferry_family_name(c->family));
  }
  const cJSON *prf = cJSON_GetObjectItemCaseSensitive(r->root, "partial_rotary_factor");
  if (prf && !cJSON_IsNull(prf) && c->family != FERRY_FAMILY_GPT_NEOX &&
      !(cJSON_IsNumber(prf) && prf->valuedouble == 1.0))
    return ferry__hf_unsupported(r, "partial_rotary_factor", "partial rotary is supported for gpt_neox only");
  return FERRY_OK;
}

static ferry_status vision_int(const struct reader *r, const cJSON *v, const char *key, int64_t def, int64_t *out) {
  int64_t x = def;
  ferry_status st = ferry__json_i64(v, key, 1, &x, r->what, NULL);
  if (st != FERRY_OK && st != FERRY_ERR_NOT_FOUND) return st;
  if (x < 1 || x > (1 << 20))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: vision_config.%s = %lld out of range", r->what, key, (long long)x);
  *out = x;
  return FERRY_OK;
}

/* The vision tower's shape, with the defaults of SiglipVisionConfig / Llama4VisionConfig. */
static ferry_status read_vision(const struct reader *r, const cJSON *v, enum ferry_family f,
                                struct ferry_vision_config *out) {
  memset(out, 0, sizeof *out);
  if (!v || cJSON_IsNull(v)) return FERRY_OK;
  if (!cJSON_IsObject(v)) return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"vision_config\" must be an object", r->what);
  const int l4 = f == FERRY_FAMILY_LLAMA4;
  out->kind = l4 ? FERRY_VISION_LLAMA4 : FERRY_VISION_SIGLIP;
  TRY(vision_int(r, v, "hidden_size", 768, &out->hidden));
  TRY(vision_int(r, v, "intermediate_size", l4 ? 5632 : 3072, &out->intermediate));
  TRY(vision_int(r, v, "num_hidden_layers", l4 ? 34 : 12, &out->layers));
  TRY(vision_int(r, v, "num_attention_heads", l4 ? 16 : 12, &out->heads));
  TRY(vision_int(r, v, "patch_size", l4 ? 14 : 16, &out->patch));
  TRY(vision_int(r, v, "image_size", l4 ? 448 : 224, &out->image));
  TRY(vision_int(r, v, "num_channels", 3, &out->channels));
  if (l4) {
    TRY(vision_int(r, v, "vision_output_dim", 7680, &out->output_dim));
    TRY(vision_int(r, v, "projector_input_dim", 4096, &out->projector_in));
    TRY(vision_int(r, v, "projector_output_dim", 4096, &out->projector_out));
  }
  return FERRY_OK;
}

static void name_from_path(const char *file, char *name, size_t len) {
  /* The folder holding config.json names the model, as transformers does. */
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", file);
  char *slash = strrchr(buf, '/');
  if (slash && !strcmp(slash + 1, "config.json"))
    *slash = '\0';
  else if (!slash && !strcmp(buf, "config.json"))
    buf[0] = '\0';
  size_t n = strlen(buf);
  while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
  const char *base = strrchr(buf, '/');
  base = base ? base + 1 : buf;
  snprintf(name, len, "%s", *base ? base : "config");
}

ferry_status ferry__hf_read_root(const struct reader *r0, const char *file, struct ferry_model_config *c) {
  memset(c, 0, sizeof *c);
  if (!cJSON_IsObject(r0->top))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: expected a JSON object at the top level", r0->what);
  struct reader rr = *r0, *r = &rr;
  r->root = r->top;
  const char *mt;
  TRY(ferry__json_str(r->top, "model_type", 0, &mt, r->what, NULL));
  const cJSON *vision = NULL;
  if (!strcmp(mt, "gemma3") || !strcmp(mt, "llama4")) {
    /* a multimodal checkpoint: the text model is text_config, its weights language_model.* */
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(r->top, "text_config");
    if (!cJSON_IsObject(text))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: model_type \"%s\" needs a text_config object", r->what, mt);
    r->root = text;
    c->family = !strcmp(mt, "gemma3") ? FERRY_FAMILY_GEMMA3 : FERRY_FAMILY_LLAMA4;
    const char *tmt = NULL;
    TRY(ferry__hf_str(r, "model_type", NULL, &tmt));
    if (tmt && strcmp(tmt, ferry_family_name(c->family)))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: text_config.model_type \"%.32s\" does not belong in a %s config", r->what,
                         tmt, mt);
    c->multimodal_names = 1;
    vision = cJSON_GetObjectItemCaseSensitive(r->top, "vision_config");
  } else if (ferry_family_parse(mt, &c->family) != FERRY_OK) {
    char list[512];
    ferry__family_list(list, sizeof list);
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported (supported: %s, gemma3, llama4)",
                       r->what, mt, list);
  }
  const char *nm = NULL;
  {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(r->top, "_name_or_path");
    if (n && !cJSON_IsNull(n) && !cJSON_IsString(n))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"_name_or_path\" must be a string", r->what);
    nm = n && cJSON_IsString(n) ? n->valuestring : NULL;
  }
  if (nm && *nm)
    snprintf(c->name, sizeof c->name, "%s", nm);
  else
    name_from_path(file, c->name, sizeof c->name);
  /* dtype: newer transformers spell it "dtype"; multimodal files may keep it in text_config */
  const char *dt = NULL;
  const cJSON *objs[2] = {r->top, r->root};
  for (int k = 0; k < 2 && !dt; k++) {
    const char *keys[2] = {"torch_dtype", "dtype"};
    for (int j = 0; j < 2 && !dt; j++) {
      ferry_status st = ferry__json_str(objs[k], keys[j], 1, &dt, r->what, NULL);
      if (st != FERRY_OK && st != FERRY_ERR_NOT_FOUND) return st;
    }
  }
  /* gpt-oss publishes no dtype: its unquantized tensors are bf16 */
  if (!dt) dt = !strcmp(mt, "gpt_oss") ? "bfloat16" : "float32";
  if (ferry_dtype_parse(dt, &c->dtype) != FERRY_OK)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"torch_dtype\" = \"%.32s\" is not a known dtype", r->what, dt);
  TRY(c->family == FERRY_FAMILY_OPT ? read_opt(r, c) : ferry__hf_read_family(r, c));
  TRY(foreign_fields(r, c));
  TRY(ferry__hf_read_quant(r, c));
  TRY(read_vision(r, vision, c->family, &c->vision));
  char msg[512];
  if (ferry__model_config_check(c, msg, sizeof msg))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: inconsistent configuration: %s", r->what, msg);
  return FERRY_OK;
}

ferry_status ferry__model_read_hf_config(const char *path, struct ferry_model_config *cfg) {
  char *file = NULL;
  ferry_status st;
  if (ferry__is_dir(path)) {
    file = ferry__path_join(path, "config.json");
    if (!file) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
    if (!ferry__is_file(file)) {
      st = ferry__fail(FERRY_ERR_NOT_FOUND, "%s: folder has no config.json", path);
      goto out_free_file;
    }
  } else if (ferry__is_file(path)) {
    file = ferry__strdup(path);
    if (!file) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
  } else {
    /* the presets nearest the name (case does not matter), else every one */
    const char *all[256], *near[4];
    size_t n = 0;
    while (n < ferry_model_preset_count() && n < sizeof all / sizeof all[0]) {
      all[n] = ferry_model_preset_name(n);
      n++;
    }
    const size_t k = ferry__nearest_names(path, all, n, 1, near, sizeof near / sizeof near[0]);
    char names[2048];
    ferry__join_names(k ? near : all, k ? k : n, "", names, sizeof names);
    return ferry__fail(FERRY_ERR_NOT_FOUND,
                       "'%s' is neither a model preset (%s%s; or a preset's Hugging Face id) nor a config.json or a "
                       "folder holding one",
                       path, k ? "nearest: " : "", names);
  }
  cJSON *root = NULL;
  st = ferry__json_load(file, CONFIG_MAX_BYTES, &root, NULL);
  if (st != FERRY_OK) goto out_free_file;
  struct reader r = {.what = file, .root = root, .top = root};
  st = ferry__hf_read_root(&r, file, cfg);
  cJSON_Delete(root);
out_free_file:
  ferry_free(file);
  return st;
}
