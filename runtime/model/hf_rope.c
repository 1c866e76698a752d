/* The parts of a config.json that are small languages of their own: RoPE scaling (the
 * transformers v4 `rope_scaling` dict, the v5 `rope_parameters` dict, flat or per layer type)
 * and `quantization_config` (fp8 blocks, MXFP4, GPTQ, AWQ, compressed-tensors). A key this
 * reader does not understand is an error: each one changes the numbers a model computes. */
#include <stdio.h>
#include <string.h>

#include "runtime/model/hf_impl.h"

static int one_of(const char *s, const char *const *list) {
  for (; *list; list++)
    if (!strcmp(s, *list)) return 1;
  return 0;
}

static ferry_status num(const struct reader *r, const cJSON *o, const char *dict, const char *key, double *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!it || cJSON_IsNull(it)) return FERRY_OK;
  if (!cJSON_IsNumber(it))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s.%s\" must be a number", r->what, dict, key);
  *out = it->valuedouble;
  return FERRY_OK;
}

static ferry_status factors(const struct reader *r, const cJSON *o, const char *dict, const char *key, float *out,
                            int32_t *n) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsArray(a))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s.%s\" must be an array of numbers", r->what, dict, key);
  int k = cJSON_GetArraySize(a);
  if (k > FERRY_ROPE_MAX_FACTORS)
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: %s.%s has %d entries, at most %d are supported", r->what, dict, key,
                       k, FERRY_ROPE_MAX_FACTORS);
  if (*n >= 0 && *n != k)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s.short_factor and long_factor differ in length", r->what, dict);
  int i = 0;
  for (const cJSON *it = a->child; it; it = it->next, i++) {
    if (!cJSON_IsNumber(it))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: %s.%s[%d] is not a number", r->what, dict, key, i);
    out[i] = (float)it->valuedouble;
  }
  *n = k;
  return FERRY_OK;
}

static ferry_status parse_rope_dict(const struct reader *r, const cJSON *d, const char *dict, double *theta,
                                    struct ferry_rope_scaling *out) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(d, "rope_type");
  if (!t) t = cJSON_GetObjectItemCaseSensitive(d, "type");
  const char *type = t && cJSON_IsString(t) ? t->valuestring : "default";
  if (t && !cJSON_IsString(t))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s.rope_type\" must be a string", r->what, dict);
  static const char *const common[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", NULL};
  static const char *const k_linear[] = {"factor", NULL};
  static const char *const k_dynamic[] = {"factor", "original_max_position_embeddings", NULL};
  static const char *const k_yarn[] = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                                       "mscale_all_dim", "attention_factor", "truncate", NULL};
  static const char *const k_llama3[] = {"factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings", NULL};
  static const char *const k_longrope[] = {"factor", "short_factor", "long_factor", "short_mscale", "long_mscale",
                                           "original_max_position_embeddings", "attention_factor", NULL};
  static const char *const k_none[] = {NULL};
  const char *const *keys;
  if (!strcmp(type, "default")) {
    out->type = FERRY_ROPE_DEFAULT, keys = k_none;
  } else if (!strcmp(type, "linear")) {
    out->type = FERRY_ROPE_LINEAR, keys = k_linear;
  } else if (!strcmp(type, "dynamic")) {
    out->type = FERRY_ROPE_DYNAMIC, keys = k_dynamic;
  } else if (!strcmp(type, "yarn")) {
    out->type = FERRY_ROPE_YARN, keys = k_yarn;
  } else if (!strcmp(type, "llama3")) {
    out->type = FERRY_ROPE_LLAMA3, keys = k_llama3;
  } else if (!strcmp(type, "longrope") || !strcmp(type, "su")) {
    out->type = FERRY_ROPE_LONGROPE, keys = k_longrope;
  } else {
    return ferry__fail(FERRY_ERR_UNSUPPORTED,
                       "%s: %s rope type \"%.32s\" is not supported (supported: default, linear, dynamic, yarn, "
                       "llama3, longrope)",
                       r->what, dict, type);
  }
  for (const cJSON *it = d->child; it; it = it->next)
    if (!one_of(it->string, common) && !one_of(it->string, keys))
      return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: field \"%s.%.48s\" is not understood for rope type %s", r->what,
                         dict, it->string, type);
  TRY(num(r, d, dict, "rope_theta", theta));
  double orig = 0, truncate = 1;
  TRY(num(r, d, dict, "factor", &out->factor));
  TRY(num(r, d, dict, "original_max_position_embeddings", &orig));
  TRY(num(r, d, dict, "low_freq_factor", &out->low_freq_factor));
  TRY(num(r, d, dict, "high_freq_factor", &out->high_freq_factor));
  TRY(num(r, d, dict, "beta_fast", &out->beta_fast));
  TRY(num(r, d, dict, "beta_slow", &out->beta_slow));
  TRY(num(r, d, dict, "mscale", &out->mscale));
  TRY(num(r, d, dict, "mscale_all_dim", &out->mscale_all_dim));
  TRY(num(r, d, dict, "attention_factor", &out->attention_factor));
  TRY(num(r, d, dict, "short_mscale", &out->short_mscale));
  TRY(num(r, d, dict, "long_mscale", &out->long_mscale));
  const cJSON *tr = cJSON_GetObjectItemCaseSensitive(d, "truncate");
  if (tr && !cJSON_IsNull(tr)) {
    if (!cJSON_IsBool(tr)) return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s.truncate\" must be true or false", r->what, dict);
    truncate = cJSON_IsTrue(tr);
  }
  out->no_truncate = !(int)truncate;
  if (orig < 0 || orig > FERRY__MODEL_MAX_POSITION || orig != (double)(int64_t)orig)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s.original_max_position_embeddings = %g is not a valid length", r->what,
                       dict, orig);
  out->original_max_position = (int64_t)orig;
  if (out->type == FERRY_ROPE_LONGROPE) {
    out->n_factors = -1;
    TRY(factors(r, d, dict, "short_factor", out->short_factor, &out->n_factors));
    TRY(factors(r, d, dict, "long_factor", out->long_factor, &out->n_factors));
  }
  if (out->type != FERRY_ROPE_DEFAULT && out->type != FERRY_ROPE_LONGROPE && !(out->factor > 0))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s.factor must be a positive number for rope type %s", r->what, dict, type);
  return FERRY_OK;
}

ferry_status ferry__hf_read_rope(const struct reader *r, const char *layer_type, double theta_def, double *theta,
                                 struct ferry_rope_scaling *out) {
  memset(out, 0, sizeof *out);
  *theta = theta_def;
  TRY(ferry__hf_positive(r, "rope_theta", theta_def, theta));
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(r->root, "rope_parameters");
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r->root, "rope_scaling");
  const char *dict = "rope_scaling";
  const cJSON *d = rs;
  if (rp && !cJSON_IsNull(rp)) {
    if (!cJSON_IsObject(rp)) return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"rope_parameters\" must be an object", r->what);
    dict = "rope_parameters";
    d = rp;
    /* v5 per-layer-type form: {"full_attention": {...}, "sliding_attention": {...}} */
    const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
    if (full && cJSON_IsObject(full)) {
      const cJSON *pick = layer_type ? cJSON_GetObjectItemCaseSensitive(rp, layer_type) : full;
      if (!pick || !cJSON_IsObject(pick))
        return ferry__fail(FERRY_ERR_FORMAT, "%s: rope_parameters has no \"%s\" entry", r->what, layer_type);
      d = pick;
    }
    if (rs && !cJSON_IsNull(rs))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: both rope_scaling and rope_parameters are given", r->what);
  }
  if (!d || cJSON_IsNull(d)) return FERRY_OK;
  if (!cJSON_IsObject(d)) return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s\" must be an object or null", r->what, dict);
  TRY(parse_rope_dict(r, d, dict, theta, out));
  if (!(*theta > 0)) return ferry__fail(FERRY_ERR_FORMAT, "%s: %s.rope_theta must be positive", r->what, dict);
  return FERRY_OK;
}

/* ---- quantization_config ------------------------------------------------------------------ */

static ferry_status q_int(const struct reader *r, const cJSON *o, const char *key, int64_t def, int64_t *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!it || cJSON_IsNull(it)) {
    *out = def;
    return FERRY_OK;
  }
  if (!ferry__json_is_int(it, -1, 1 << 20))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"quantization_config.%s\" must be an integer", r->what, key);
  *out = (int64_t)it->valuedouble;
  return FERRY_OK;
}

static ferry_status q_bool(const struct reader *r, const cJSON *o, const char *key, int def, int *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!it || cJSON_IsNull(it)) {
    *out = def;
    return FERRY_OK;
  }
  if (!cJSON_IsBool(it))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"quantization_config.%s\" must be true or false", r->what, key);
  *out = cJSON_IsTrue(it);
  return FERRY_OK;
}

static const char *q_str(const cJSON *o, const char *key) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
  return it && cJSON_IsString(it) ? it->valuestring : NULL;
}

/* compressed-tensors: one config group of int weights packed into int32, by group. */
static ferry_status q_compressed(const struct reader *r, const cJSON *q, struct ferry_ckpt_quant_config *out) {
  const char *fmt = q_str(q, "format");
  if (!fmt || strcmp(fmt, "pack-quantized"))
    return ferry__fail(FERRY_ERR_UNSUPPORTED,
                       "%s: compressed-tensors format \"%.32s\" is not supported (supported: pack-quantized)", r->what,
                       fmt ? fmt : "?");
  const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
  if (!cJSON_IsObject(groups) || cJSON_GetArraySize(groups) != 1)
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: compressed-tensors needs exactly one entry in config_groups", r->what);
  const cJSON *w = cJSON_GetObjectItemCaseSensitive(groups->child, "weights");
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(groups->child, "input_activations");
  if (!cJSON_IsObject(w)) return ferry__fail(FERRY_ERR_FORMAT, "%s: compressed-tensors group has no weights", r->what);
  if (in && !cJSON_IsNull(in))
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: compressed-tensors with quantized activations is not supported", r->what);
  const char *type = q_str(w, "type"), *strategy = q_str(w, "strategy");
  if (!type || strcmp(type, "int") || !strategy || strcmp(strategy, "group"))
    return ferry__fail(FERRY_ERR_UNSUPPORTED,
                       "%s: compressed-tensors weights must be type \"int\" with strategy \"group\"", r->what);
  int64_t bits = 0, group = 0; /* set by q_int/q_bool; initialised for -O3's flow analysis */
  int sym = 0;
  TRY(q_int(r, w, "num_bits", 4, &bits));
  TRY(q_int(r, w, "group_size", 128, &group));
  TRY(q_bool(r, w, "symmetric", 1, &sym));
  if (bits != 4 && bits != 8)
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: compressed-tensors num_bits = %lld (supported: 4, 8)", r->what,
                       (long long)bits);
  out->kind = FERRY_CKPT_COMPRESSED;
  out->bits = (int32_t)bits;
  out->group_size = group;
  out->symmetric = sym;
  return FERRY_OK;
}

ferry_status ferry__hf_read_quant(const struct reader *r, struct ferry_model_config *c) {
  struct ferry_ckpt_quant_config *out = &c->quant;
  memset(out, 0, sizeof *out);
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(r->top, "quantization_config");
  if (!q) q = cJSON_GetObjectItemCaseSensitive(r->root, "quantization_config");
  if (!q || cJSON_IsNull(q)) return FERRY_OK;
  if (!cJSON_IsObject(q)) return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"quantization_config\" must be an object", r->what);
  const char *m = q_str(q, "quant_method");
  if (!m) return ferry__fail(FERRY_ERR_FORMAT, "%s: quantization_config has no quant_method", r->what);
  if (!strcmp(m, "fp8")) {
    const char *fmt = q_str(q, "fmt");
    const cJSON *blk = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    if ((fmt && strcmp(fmt, "e4m3")) || !cJSON_IsArray(blk) || cJSON_GetArraySize(blk) != 2 ||
        !ferry__json_is_int(blk->child, 1, 65536) || !ferry__json_is_int(blk->child->next, 1, 65536))
      return ferry__fail(FERRY_ERR_UNSUPPORTED,
                         "%s: fp8 quantization needs fmt \"e4m3\" and a weight_block_size [rows, cols] (per-tensor fp8 "
                         "is not supported)",
                         r->what);
    out->kind = FERRY_CKPT_FP8_BLOCK;
    out->bits = 8;
    out->block[0] = (int64_t)blk->child->valuedouble;
    out->block[1] = (int64_t)blk->child->next->valuedouble;
  } else if (!strcmp(m, "mxfp4")) {
    if (c->family != FERRY_FAMILY_GPT_OSS)
      return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: mxfp4 checkpoints are read for gpt_oss only", r->what);
    out->kind = FERRY_CKPT_MXFP4;
    out->bits = 4;
    out->group_size = 32;
    out->experts_only = 1; /* attention, router, embeddings and head stay bf16 (modules_to_not_convert) */
  } else if (!strcmp(m, "gptq")) {
    int64_t bits = 0, group = 0;
    TRY(q_int(r, q, "bits", 4, &bits));
    TRY(q_int(r, q, "group_size", 128, &group));
    TRY(q_bool(r, q, "desc_act", 0, &out->desc_act));
    TRY(q_bool(r, q, "sym", 1, &out->symmetric));
    const char *fmt = q_str(q, "checkpoint_format");
    if (bits != 4 && bits != 8)
      return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: GPTQ bits = %lld (supported: 4, 8)", r->what, (long long)bits);
    if (fmt && strcmp(fmt, "gptq"))
      return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: GPTQ checkpoint_format \"%.16s\" (supported: gptq)", r->what, fmt);
    if (group < 0) group = 0; /* -1: one group over the whole input */
    out->kind = FERRY_CKPT_GPTQ;
    out->bits = (int32_t)bits;
    out->group_size = group;
  } else if (!strcmp(m, "awq")) {
    int64_t bits = 0, group = 0;
    int zero = 0;
    TRY(q_int(r, q, "bits", 4, &bits));
    TRY(q_int(r, q, "group_size", 128, &group));
    TRY(q_bool(r, q, "zero_point", 1, &zero));
    const char *ver = q_str(q, "version");
    if (bits != 4 || !zero || (ver && strcmp(ver, "gemm") && strcmp(ver, "GEMM")))
      return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: AWQ needs bits 4, zero_point true and version \"gemm\"", r->what);
    out->kind = FERRY_CKPT_AWQ;
    out->bits = 4;
    out->group_size = group;
  } else if (!strcmp(m, "compressed-tensors")) {
    TRY(q_compressed(r, q, out));
  } else {
    return ferry__fail(FERRY_ERR_UNSUPPORTED,
                       "%s: quant_method \"%.32s\" is not supported (supported: fp8, mxfp4, gptq, awq, "
                       "compressed-tensors)",
                       r->what, m);
  }
  return FERRY_OK;
}
