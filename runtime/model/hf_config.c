/* Hugging Face config.json: reading the model types ferry knows (with the defaults that
 * transformers applies to absent fields) and writing a config.json for a configuration, so
 * presets and synthetic models can be saved next to their weights and read back unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/names.h"
#include "runtime/model/model_impl.h"

/* A config.json is a few KB; anything this large is not one. */
#define CONFIG_MAX_BYTES (4u << 20)

struct reader {
  const char *what; /* file name for messages */
  const cJSON *root;
};

/* Integer field with a default (when absent or null) and an allowed range. */
static ferry_status get_int(const struct reader *r, const char *key, int required, int64_t def, int64_t lo,
                            int64_t hi, int64_t *out) {
  int64_t v = def;
  ferry_status st = ferry__json_i64(r->root, key, !required, &v, r->what, NULL);
  if (st == FERRY_ERR_NOT_FOUND)
    v = def;
  else if (st != FERRY_OK)
    return st;
  if (v < lo || v > hi)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s\" = %lld, expected an integer in %lld..%lld", r->what,
                       key, (long long)v, (long long)lo, (long long)hi);
  *out = v;
  return FERRY_OK;
}

/* Integer field that may be null (meaning 0 here) with a default when absent. */
static ferry_status get_int_or_null(const struct reader *r, const char *key, int64_t def, int64_t hi,
                                    int64_t *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->root, key);
  if (!item) {
    *out = def;
    return FERRY_OK;
  }
  if (cJSON_IsNull(item)) {
    *out = 0;
    return FERRY_OK;
  }
  return get_int(r, key, 1, 0, 0, hi, out);
}

static ferry_status get_positive(const struct reader *r, const char *key, double def, double *out) {
  double v = def;
  ferry_status st = ferry__json_f64(r->root, key, 1, &v, r->what, NULL);
  if (st == FERRY_ERR_NOT_FOUND)
    v = def;
  else if (st != FERRY_OK)
    return st;
  if (!(v > 0))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"%s\" = %g, expected a positive number", r->what, key, v);
  *out = v;
  return FERRY_OK;
}

static ferry_status get_bool(const struct reader *r, const char *key, int def, int *out) {
  ferry_status st = ferry__json_bool(r->root, key, 1, out, r->what, NULL);
  if (st == FERRY_ERR_NOT_FOUND) {
    *out = def;
    return FERRY_OK;
  }
  return st;
}

static ferry_status get_str(const struct reader *r, const char *key, const char *def, const char **out) {
  ferry_status st = ferry__json_str(r->root, key, 1, out, r->what, NULL);
  if (st == FERRY_ERR_NOT_FOUND) {
    *out = def;
    return FERRY_OK;
  }
  return st;
}

#define TRY(expr)                             \
  do {                                        \
    ferry_status st_ = (expr);                \
    if (st_ != FERRY_OK) return st_;          \
  } while (0)

static ferry_status unsupported(const struct reader *r, const char *field, const char *detail) {
  return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: %s: %s", r->what, field, detail);
}

/* Fields of the Llama-shaped families (everything but OPT). HF defaults per family follow
 * the transformers configuration classes (LlamaConfig, MistralConfig, ...). */
static ferry_status read_llama_like(const struct reader *r, struct ferry_model_config *c) {
  const enum ferry_family f = c->family;
  const int64_t dim_max = 4 * (int64_t)FERRY__MODEL_MAX_DIM;
  int64_t inter = 0;
  TRY(get_int(r, "hidden_size", 1, 0, 1, FERRY__MODEL_MAX_DIM, &c->hidden));
  TRY(get_int(r, "intermediate_size", 1, 0, 1, dim_max, &inter));
  TRY(get_int(r, "num_hidden_layers", 1, 0, 1, FERRY__MODEL_MAX_LAYERS, &c->n_layers));
  TRY(get_int(r, "num_attention_heads", 1, 0, 1, FERRY__MODEL_MAX_HEADS, &c->n_heads));
  /* Mistral and Mixtral default to 8 KV heads; the others to one per attention head. */
  int64_t kv_def = (f == FERRY_FAMILY_MISTRAL || f == FERRY_FAMILY_MIXTRAL) ? 8 : c->n_heads;
  TRY(get_int(r, "num_key_value_heads", 0, kv_def, 1, FERRY__MODEL_MAX_HEADS, &c->n_kv_heads));
  if (c->n_heads % c->n_kv_heads != 0)
    return ferry__fail(FERRY_ERR_FORMAT,
                       "%s: field \"num_key_value_heads\" = %lld does not divide num_attention_heads = %lld",
                       r->what, (long long)c->n_kv_heads, (long long)c->n_heads);
  const cJSON *hd = cJSON_GetObjectItemCaseSensitive(r->root, "head_dim");
  if ((!hd || cJSON_IsNull(hd)) && c->hidden % c->n_heads != 0)
    return ferry__fail(FERRY_ERR_FORMAT,
                       "%s: hidden_size %lld is not a multiple of num_attention_heads %lld and head_dim is absent",
                       r->what, (long long)c->hidden, (long long)c->n_heads);
  TRY(get_int(r, "head_dim", 0, c->hidden / c->n_heads, 1, FERRY__MODEL_MAX_DIM, &c->head_dim));
  TRY(get_int(r, "vocab_size", 1, 0, 1, FERRY__MODEL_MAX_VOCAB, &c->vocab));
  int64_t maxpos_def = 2048;
  double eps_def = 1e-6, theta_def = 10000.0;
  switch (f) {
  case FERRY_FAMILY_MISTRAL: maxpos_def = 4096 * 32; break;
  case FERRY_FAMILY_MIXTRAL: maxpos_def = 4096 * 32, eps_def = 1e-5, theta_def = 1e6; break;
  case FERRY_FAMILY_QWEN2:
  case FERRY_FAMILY_QWEN2_MOE: maxpos_def = 32768; break;
  case FERRY_FAMILY_OLMOE: maxpos_def = 4096, eps_def = 1e-5; break;
  default: break;
  }
  TRY(get_int(r, "max_position_embeddings", 0, maxpos_def, 1, FERRY__MODEL_MAX_POSITION, &c->max_position));
  TRY(get_positive(r, "rms_norm_eps", eps_def, &c->norm_eps));
  TRY(get_positive(r, "rope_theta", theta_def, &c->rope_theta));
  TRY(get_bool(r, "tie_word_embeddings", 0, &c->tied_embeddings));
  const char *act;
  TRY(get_str(r, "hidden_act", "silu", &act));
  if (strcmp(act, "silu") && strcmp(act, "swish"))
    return unsupported(r, "hidden_act", "only \"silu\" (SwiGLU) is supported for this model_type");
  c->norm = FERRY_NORM_RMS;
  c->act = FERRY_ACT_SWIGLU;

  int bias = 0, use_sw = 0;
  switch (f) {
  case FERRY_FAMILY_LLAMA: {
    int mlp_bias;
    TRY(get_bool(r, "attention_bias", 0, &bias));
    TRY(get_bool(r, "mlp_bias", 0, &mlp_bias));
    if (mlp_bias) return unsupported(r, "mlp_bias", "true is not supported (no gate/up/down biases)");
    c->qkv_bias = c->attn_out_bias = bias;
    c->intermediate = inter;
    break;
  }
  case FERRY_FAMILY_MISTRAL:
    TRY(get_int_or_null(r, "sliding_window", 4096, FERRY__MODEL_MAX_POSITION, &c->sliding_window));
    c->intermediate = inter;
    break;
  case FERRY_FAMILY_MIXTRAL:
    TRY(get_int_or_null(r, "sliding_window", 0, FERRY__MODEL_MAX_POSITION, &c->sliding_window));
    TRY(get_int(r, "num_local_experts", 0, 8, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
    TRY(get_int(r, "num_experts_per_tok", 0, 2, 1, c->n_experts, &c->experts_per_token));
    c->expert_intermediate = inter;
    c->norm_topk_prob = 1; /* Mixtral always renormalises its top-k weights */
    break;
  case FERRY_FAMILY_QWEN2:
  case FERRY_FAMILY_QWEN2_MOE:
    c->qkv_bias = 1; /* Qwen2 attention always has q/k/v biases */
    c->intermediate = inter;
    TRY(get_bool(r, "use_sliding_window", 0, &use_sw));
    if (use_sw) TRY(get_int_or_null(r, "sliding_window", 4096, FERRY__MODEL_MAX_POSITION, &c->sliding_window));
    if (f == FERRY_FAMILY_QWEN2) break;
    {
      int64_t step;
      TRY(get_int(r, "decoder_sparse_step", 0, 1, 1, FERRY__MODEL_MAX_LAYERS, &step));
      if (step != 1)
        return ferry__fail(FERRY_ERR_UNSUPPORTED,
                           "%s: decoder_sparse_step = %lld: only 1 (every layer sparse) is supported", r->what,
                           (long long)step);
      const cJSON *mol = cJSON_GetObjectItemCaseSensitive(r->root, "mlp_only_layers");
      if (mol && !cJSON_IsNull(mol) && !cJSON_IsArray(mol))
        return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"mlp_only_layers\" must be an array of layer indices",
                           r->what);
      if (mol && cJSON_GetArraySize(mol) > 0)
        return ferry__fail(FERRY_ERR_UNSUPPORTED,
                           "%s: mlp_only_layers has %d entries: dense layers inside a Qwen2-MoE model are not "
                           "supported (expected [])",
                           r->what, cJSON_GetArraySize(mol));
      TRY(get_int(r, "num_experts", 0, 60, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
      TRY(get_int(r, "num_experts_per_tok", 0, 4, 1, c->n_experts, &c->experts_per_token));
      TRY(get_int(r, "moe_intermediate_size", 0, 1408, 1, dim_max, &c->expert_intermediate));
      TRY(get_int(r, "shared_expert_intermediate_size", 0, 5632, 0, dim_max, &c->shared_intermediate));
      TRY(get_bool(r, "norm_topk_prob", 0, &c->norm_topk_prob));
      c->n_shared_experts = c->shared_intermediate > 0;
      c->shared_expert_gate = c->shared_intermediate > 0;
    }
    break;
  case FERRY_FAMILY_OLMOE:
    TRY(get_bool(r, "attention_bias", 0, &bias));
    c->qkv_bias = c->attn_out_bias = bias;
    c->qk_norm = 1;
    TRY(get_int(r, "num_experts", 0, 64, 1, FERRY__MODEL_MAX_EXPERTS, &c->n_experts));
    TRY(get_int(r, "num_experts_per_tok", 0, 8, 1, c->n_experts, &c->experts_per_token));
    TRY(get_bool(r, "norm_topk_prob", 0, &c->norm_topk_prob));
    c->expert_intermediate = inter;
    break;
  default:
    break;
  }
  return FERRY_OK;
}

static ferry_status read_opt(const struct reader *r, struct ferry_model_config *c) {
  TRY(get_int(r, "hidden_size", 1, 0, 1, FERRY__MODEL_MAX_DIM, &c->hidden));
  TRY(get_int(r, "ffn_dim", 1, 0, 1, 4 * (int64_t)FERRY__MODEL_MAX_DIM, &c->intermediate));
  TRY(get_int(r, "num_hidden_layers", 1, 0, 1, FERRY__MODEL_MAX_LAYERS, &c->n_layers));
  TRY(get_int(r, "num_attention_heads", 1, 0, 1, FERRY__MODEL_MAX_HEADS, &c->n_heads));
  TRY(get_int(r, "vocab_size", 1, 0, 1, FERRY__MODEL_MAX_VOCAB, &c->vocab));
  TRY(get_int(r, "max_position_embeddings", 0, 2048, 1, FERRY__MODEL_MAX_POSITION - 2, &c->max_position));
  if (c->hidden % c->n_heads != 0)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld",
                       r->what, (long long)c->hidden, (long long)c->n_heads);
  c->n_kv_heads = c->n_heads;
  c->head_dim = c->hidden / c->n_heads;
  int64_t proj = 0;
  TRY(get_int(r, "word_embed_proj_dim", 0, c->hidden, 1, FERRY__MODEL_MAX_DIM, &proj));
  if (proj != c->hidden)
    return unsupported(r, "word_embed_proj_dim", "differs from hidden_size (project_in/out) and is not supported");
  int pre = 1, affine = 1, bias = 1;
  TRY(get_bool(r, "do_layer_norm_before", 1, &pre));
  if (!pre) return unsupported(r, "do_layer_norm_before", "false (post-norm, OPT-350m) is not supported");
  TRY(get_bool(r, "layer_norm_elementwise_affine", 1, &affine));
  if (!affine) return unsupported(r, "layer_norm_elementwise_affine", "false is not supported");
  TRY(get_bool(r, "enable_bias", 1, &bias));
  c->qkv_bias = c->attn_out_bias = c->ffn_bias = bias;
  const char *act;
  TRY(get_str(r, "activation_function", "relu", &act));
  if (!strcmp(act, "relu"))
    c->act = FERRY_ACT_RELU;
  else if (!strcmp(act, "gelu"))
    c->act = FERRY_ACT_GELU;
  else
    return unsupported(r, "activation_function", "only \"relu\" and \"gelu\" are supported");
  TRY(get_bool(r, "tie_word_embeddings", 1, &c->tied_embeddings));
  c->norm = FERRY_NORM_LAYER;
  c->norm_eps = 1e-5; /* nn.LayerNorm's default; OPT does not store it */
  c->rope_theta = 0;
  c->learned_positions = 1;
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

static ferry_status read_root(const struct reader *r, const char *file, struct ferry_model_config *c) {
  memset(c, 0, sizeof *c);
  if (!cJSON_IsObject(r->root)) return ferry__fail(FERRY_ERR_FORMAT, "%s: expected a JSON object at the top level", r->what);
  const char *mt;
  TRY(ferry__json_str(r->root, "model_type", 0, &mt, r->what, NULL));
  if (ferry_family_parse(mt, &c->family) != FERRY_OK)
    return ferry__fail(FERRY_ERR_UNSUPPORTED,
                       "%s: model_type \"%.64s\" is not supported (supported: llama, mistral, mixtral, qwen2, "
                       "qwen2_moe, olmoe, opt)",
                       r->what, mt);
  const char *nm = NULL;
  TRY(get_str(r, "_name_or_path", NULL, &nm));
  if (nm && *nm)
    snprintf(c->name, sizeof c->name, "%s", nm);
  else
    name_from_path(file, c->name, sizeof c->name);
  const char *dt = NULL;
  TRY(get_str(r, "torch_dtype", NULL, &dt));
  if (!dt) TRY(get_str(r, "dtype", "float32", &dt)); /* newer transformers spell it "dtype" */
  if (ferry_dtype_parse(dt, &c->dtype) != FERRY_OK)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: field \"torch_dtype\" = \"%.32s\" is not a known dtype", r->what, dt);
  TRY(c->family == FERRY_FAMILY_OPT ? read_opt(r, c) : read_llama_like(r, c));
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
    const char *all[64], *near[4];
    size_t n = 0;
    while (n < ferry_model_preset_count() && n < sizeof all / sizeof all[0]) {
      all[n] = ferry_model_preset_name(n);
      n++;
    }
    const size_t k = ferry__nearest_names(path, all, n, 1, near, sizeof near / sizeof near[0]);
    char names[768];
    ferry__join_names(k ? near : all, k ? k : n, "", names, sizeof names);
    return ferry__fail(FERRY_ERR_NOT_FOUND,
                       "'%s' is neither a model preset (%s%s) nor a config.json or a folder holding one", path,
                       k ? "nearest: " : "", names);
  }
  cJSON *root = NULL;
  st = ferry__json_load(file, CONFIG_MAX_BYTES, &root, NULL);
  if (st != FERRY_OK) goto out_free_file;
  struct reader r = {.what = file, .root = root};
  st = read_root(&r, file, cfg);
  cJSON_Delete(root);
out_free_file:
  ferry_free(file);
  return st;
}

/* ---- writer ------------------------------------------------------------------------------ */

static const char *architecture(enum ferry_family f) {
  switch (f) {
  case FERRY_FAMILY_LLAMA: return "LlamaForCausalLM";
  case FERRY_FAMILY_MISTRAL: return "MistralForCausalLM";
  case FERRY_FAMILY_MIXTRAL: return "MixtralForCausalLM";
  case FERRY_FAMILY_QWEN2: return "Qwen2ForCausalLM";
  case FERRY_FAMILY_QWEN2_MOE: return "Qwen2MoeForCausalLM";
  case FERRY_FAMILY_OLMOE: return "OlmoeForCausalLM";
  case FERRY_FAMILY_OPT: return "OPTForCausalLM";
  }
  return "?";
}

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
static void w_int_or_null(struct writer *w, const char *k, int64_t v) {
  if (v > 0)
    w_int(w, k, v);
  else if (!cJSON_AddNullToObject(w->o, k))
    w->ok = 0;
}

static void write_fields(struct writer *w, const struct ferry_model_config *c) {
  const enum ferry_family f = c->family;
  w_str(w, "_name_or_path", c->name);
  cJSON *arch = cJSON_AddArrayToObject(w->o, "architectures");
  cJSON *an = cJSON_CreateString(architecture(f));
  if (!arch || !an || !cJSON_AddItemToArray(arch, an)) {
    cJSON_Delete(an); /* not attached */
    w->ok = 0;
  }
  w_str(w, "model_type", ferry_family_name(f));
  if (f == FERRY_FAMILY_OPT) {
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
    w_str(w, "torch_dtype", torch_dtype(c->dtype));
    return;
  }
  const int expert_sized = f == FERRY_FAMILY_MIXTRAL || f == FERRY_FAMILY_OLMOE;
  w_int(w, "hidden_size", c->hidden);
  w_int(w, "intermediate_size", expert_sized ? c->expert_intermediate : c->intermediate);
  w_int(w, "num_hidden_layers", c->n_layers);
  w_int(w, "num_attention_heads", c->n_heads);
  w_int(w, "num_key_value_heads", c->n_kv_heads);
  w_int(w, "head_dim", c->head_dim);
  w_int(w, "vocab_size", c->vocab);
  w_int(w, "max_position_embeddings", c->max_position);
  w_num(w, "rms_norm_eps", c->norm_eps);
  w_num(w, "rope_theta", c->rope_theta);
  w_str(w, "hidden_act", "silu");
  w_bool(w, "tie_word_embeddings", c->tied_embeddings);
  w_str(w, "torch_dtype", torch_dtype(c->dtype));
  switch (f) {
  case FERRY_FAMILY_LLAMA:
    w_bool(w, "attention_bias", c->qkv_bias);
    w_bool(w, "mlp_bias", 0);
    break;
  case FERRY_FAMILY_MISTRAL:
    w_int_or_null(w, "sliding_window", c->sliding_window);
    break;
  case FERRY_FAMILY_MIXTRAL:
    w_int_or_null(w, "sliding_window", c->sliding_window);
    w_int(w, "num_local_experts", c->n_experts);
    w_int(w, "num_experts_per_tok", c->experts_per_token);
    break;
  case FERRY_FAMILY_QWEN2:
  case FERRY_FAMILY_QWEN2_MOE:
    w_bool(w, "use_sliding_window", c->sliding_window > 0);
    w_int_or_null(w, "sliding_window", c->sliding_window);
    if (f == FERRY_FAMILY_QWEN2) break;
    w_int(w, "decoder_sparse_step", 1);
    if (!cJSON_AddArrayToObject(w->o, "mlp_only_layers")) w->ok = 0;
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
  default:
    break;
  }
}

/* The first shape field in which two configurations differ, or NULL (the name is a label, not
 * a shape, and an empty one cannot survive the trip). */
static const char *config_diff(const struct ferry_model_config *a, const struct ferry_model_config *b) {
#define SAME(field) \
  if (a->field != b->field) return #field
  SAME(family); SAME(n_layers); SAME(hidden); SAME(intermediate); SAME(n_heads); SAME(n_kv_heads);
  SAME(head_dim); SAME(vocab); SAME(max_position); SAME(n_experts); SAME(experts_per_token);
  SAME(expert_intermediate); SAME(n_shared_experts); SAME(shared_intermediate); SAME(shared_expert_gate);
  SAME(norm_topk_prob); SAME(tied_embeddings); SAME(qkv_bias); SAME(attn_out_bias); SAME(ffn_bias);
  SAME(qk_norm); SAME(learned_positions); SAME(norm); SAME(act); SAME(norm_eps); SAME(rope_theta);
  SAME(sliding_window); SAME(dtype);
#undef SAME
  return NULL;
}

ferry_status ferry_model_config_json(const ferry_model *model, char **out) {
  if (!model || !out) return ferry__fail(FERRY_ERR_INVALID, "ferry_model_config_json: NULL argument");
  *out = NULL;
  ferry__json_init();
  const struct ferry_model_config *c = &model->cfg;
  struct writer w = {.o = cJSON_CreateObject(), .ok = 1};
  if (!w.o) return ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory writing config.json", c->name);
  write_fields(&w, c);
  ferry_status st = FERRY_OK;
  if (!w.ok) {
    st = ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory writing config.json", c->name);
    goto out_delete;
  }
  /* Not every configuration has a config.json spelling (e.g. Qwen2 without q/k/v biases):
   * read the text back and refuse rather than write a file that means something else. */
  struct ferry_model_config back;
  struct reader r = {.what = "config.json", .root = w.o};
  st = read_root(&r, "config.json", &back);
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
