/* The ferry_model handle: configuration checks, the tensor layout with Hugging Face names in
 * file order (embeddings, per layer its dense part then each expert, final norm and head), and
 * the accounting derived from that layout (parameters, bytes, KV-cache bytes, FLOPs). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "runtime/model/model_impl.h"

static const char *const family_names[] = {
    [FERRY_FAMILY_LLAMA] = "llama",         [FERRY_FAMILY_MISTRAL] = "mistral",
    [FERRY_FAMILY_MIXTRAL] = "mixtral",     [FERRY_FAMILY_QWEN2] = "qwen2",
    [FERRY_FAMILY_QWEN2_MOE] = "qwen2_moe", [FERRY_FAMILY_OLMOE] = "olmoe",
    [FERRY_FAMILY_OPT] = "opt",
};
#define N_FAMILIES ((int)(sizeof family_names / sizeof family_names[0]))

const char *ferry_family_name(enum ferry_family family) {
  if ((int)family < 0 || (int)family >= N_FAMILIES) return "?";
  return family_names[family];
}

ferry_status ferry_family_parse(const char *name, enum ferry_family *out) {
  if (!name || !out) return FERRY_ERR_INVALID;
  for (int i = 0; i < N_FAMILIES; i++) {
    if (!strcmp(name, family_names[i])) {
      *out = (enum ferry_family)i;
      return FERRY_OK;
    }
  }
  return FERRY_ERR_UNSUPPORTED;
}

static int family_is_moe(enum ferry_family f) {
  return f == FERRY_FAMILY_MIXTRAL || f == FERRY_FAMILY_QWEN2_MOE || f == FERRY_FAMILY_OLMOE;
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

int ferry__model_config_check(const struct ferry_model_config *cfg, char *msg, size_t msg_len) {
  CHECK(memchr(cfg->name, '\0', sizeof cfg->name) != NULL, "name is not NUL-terminated");
  CHECK((int)cfg->family >= 0 && (int)cfg->family < N_FAMILIES, "family = %d is not a known family",
        (int)cfg->family);
  const int opt = cfg->family == FERRY_FAMILY_OPT;
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
  CHECK_RANGE(sliding_window, 0, FERRY__MODEL_MAX_POSITION);
  CHECK_FLAG(shared_expert_gate);
  CHECK_FLAG(norm_topk_prob);
  CHECK_FLAG(tied_embeddings);
  CHECK_FLAG(qkv_bias);
  CHECK_FLAG(attn_out_bias);
  CHECK_FLAG(ffn_bias);
  CHECK_FLAG(qk_norm);
  CHECK_FLAG(learned_positions);
  CHECK(ferry_dtype_size(cfg->dtype) > 0, "dtype = %d is not a known dtype", (int)cfg->dtype);
  CHECK(isfinite(cfg->norm_eps) && cfg->norm_eps > 0 && cfg->norm_eps < 1,
        "norm_eps = %g, expected a number in (0, 1)", cfg->norm_eps);
  if (moe) {
    CHECK_RANGE(n_experts, 1, FERRY__MODEL_MAX_EXPERTS);
    CHECK_RANGE(experts_per_token, 1, cfg->n_experts);
    CHECK_RANGE(expert_intermediate, 1, 4 * (int64_t)FERRY__MODEL_MAX_DIM);
    /* Only Qwen2-MoE keeps a separate dense size in its config.json; in Mixtral and OLMoE
     * intermediate_size is the expert size, so a second value would not survive a save. */
    CHECK(cfg->family == FERRY_FAMILY_QWEN2_MOE || cfg->intermediate == 0,
          "family %s has no dense FFN: intermediate must be 0 (the expert size is expert_intermediate)",
          ferry_family_name(cfg->family));
  } else {
    CHECK(cfg->n_experts == 0 && cfg->experts_per_token == 0 && cfg->expert_intermediate == 0,
          "family %s is dense: n_experts, experts_per_token and expert_intermediate must be 0",
          ferry_family_name(cfg->family));
    CHECK(cfg->intermediate >= 1, "intermediate = %lld, expected at least 1 for a dense model",
          (long long)cfg->intermediate);
  }
  if (cfg->family == FERRY_FAMILY_QWEN2_MOE) {
    CHECK_RANGE(n_shared_experts, 0, 64);
    CHECK_RANGE(shared_intermediate, 0, 4 * (int64_t)FERRY__MODEL_MAX_DIM);
    CHECK((cfg->n_shared_experts > 0) == (cfg->shared_intermediate > 0),
          "n_shared_experts = %lld and shared_intermediate = %lld must be both zero or both positive",
          (long long)cfg->n_shared_experts, (long long)cfg->shared_intermediate);
    CHECK(!cfg->shared_expert_gate || cfg->n_shared_experts > 0,
          "shared_expert_gate = 1 needs a shared expert");
  } else {
    CHECK(cfg->n_shared_experts == 0 && cfg->shared_intermediate == 0 && !cfg->shared_expert_gate,
          "family %s has no shared expert: n_shared_experts, shared_intermediate and "
          "shared_expert_gate must be 0",
          ferry_family_name(cfg->family));
  }
  if (opt) {
    CHECK(cfg->norm == FERRY_NORM_LAYER, "family opt uses LayerNorm (norm = FERRY_NORM_LAYER)");
    CHECK(cfg->learned_positions == 1, "family opt uses learned positions (learned_positions = 1)");
    CHECK(cfg->act == FERRY_ACT_RELU || cfg->act == FERRY_ACT_GELU,
          "family opt uses a plain FFN (act = FERRY_ACT_RELU or FERRY_ACT_GELU)");
    CHECK(!cfg->qk_norm, "family opt has no q/k norm (qk_norm = 0)");
    CHECK(isfinite(cfg->rope_theta) && cfg->rope_theta >= 0, "rope_theta = %g, expected >= 0",
          cfg->rope_theta);
    CHECK(cfg->max_position <= FERRY__MODEL_MAX_POSITION - 2, "max_position too large");
  } else {
    CHECK(cfg->norm == FERRY_NORM_RMS, "family %s uses RMSNorm (norm = FERRY_NORM_RMS)",
          ferry_family_name(cfg->family));
    CHECK(!cfg->learned_positions, "family %s uses RoPE (learned_positions = 0)",
          ferry_family_name(cfg->family));
    CHECK(cfg->act == FERRY_ACT_SWIGLU, "family %s uses a SwiGLU FFN (act = FERRY_ACT_SWIGLU)",
          ferry_family_name(cfg->family));
    CHECK(!cfg->ffn_bias, "family %s has no FFN biases (ffn_bias = 0)", ferry_family_name(cfg->family));
    CHECK(isfinite(cfg->rope_theta) && cfg->rope_theta > 0, "rope_theta = %g, expected > 0",
          cfg->rope_theta);
  }
  /* 20 bounds the per-layer non-expert tensors of every family. */
  CHECK(cfg->n_layers * (20 + 3 * cfg->n_experts) + 8 <= FERRY__MODEL_MAX_TENSORS,
        "n_layers x n_experts gives more than %d tensors", FERRY__MODEL_MAX_TENSORS);
  return 0;
}

/* ---- layout ------------------------------------------------------------------------------ */

struct builder {
  ferry_model *m;
  size_t cap;
  int32_t layer, expert;
  const char *prefix; /* "model.layers.3." etc. */
};

static ferry_status add(struct builder *b, enum ferry_tensor_role role, int64_t s0, int64_t s1,
                        const char *fmt, ...) FERRY_PRINTF(5, 6);

static ferry_status add(struct builder *b, enum ferry_tensor_role role, int64_t s0, int64_t s1,
                        const char *fmt, ...) {
  ferry_model *m = b->m;
  if (m->n_tensors >= b->cap) return ferry__fail(FERRY_ERR_INTERNAL, "model layout: tensor table overflow");
  struct ferry_tensor_desc *t = &m->tensors[m->n_tensors];
  memset(t, 0, sizeof *t);
  int n = snprintf(t->name, sizeof t->name, "%s", b->prefix);
  va_list ap;
  va_start(ap, fmt);
  int k = n >= 0 && (size_t)n < sizeof t->name ? vsnprintf(t->name + n, sizeof t->name - (size_t)n, fmt, ap) : -1;
  va_end(ap);
  if (k < 0 || (size_t)(n + k) >= sizeof t->name)
    return ferry__fail(FERRY_ERR_INTERNAL, "model layout: tensor name longer than %zu bytes", sizeof t->name - 1);
  t->role = role;
  t->layer = b->layer;
  t->expert = b->expert;
  t->ndim = s1 > 0 ? 2 : 1;
  t->shape[0] = s0;
  t->shape[1] = s1 > 0 ? s1 : 0;
  t->numel = (uint64_t)s0 * (uint64_t)(s1 > 0 ? s1 : 1);
  m->n_tensors++;
  return FERRY_OK;
}

#define ADD(...)                                         \
  do {                                                   \
    ferry_status st_ = add(b, __VA_ARGS__);              \
    if (st_ != FERRY_OK) return st_;                     \
  } while (0)

static ferry_status add_attention(struct builder *b, const struct ferry_model_config *c) {
  const int opt = c->family == FERRY_FAMILY_OPT;
  const int64_t h = c->hidden, q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
  ADD(FERRY_ROLE_ATTN_Q, q, h, "self_attn.q_proj.weight");
  if (c->qkv_bias) ADD(FERRY_ROLE_ATTN_Q_BIAS, q, 0, "self_attn.q_proj.bias");
  ADD(FERRY_ROLE_ATTN_K, kv, h, "self_attn.k_proj.weight");
  if (c->qkv_bias) ADD(FERRY_ROLE_ATTN_K_BIAS, kv, 0, "self_attn.k_proj.bias");
  ADD(FERRY_ROLE_ATTN_V, kv, h, "self_attn.v_proj.weight");
  if (c->qkv_bias) ADD(FERRY_ROLE_ATTN_V_BIAS, kv, 0, "self_attn.v_proj.bias");
  const char *o = opt ? "out_proj" : "o_proj";
  ADD(FERRY_ROLE_ATTN_O, h, q, "self_attn.%s.weight", o);
  if (c->attn_out_bias) ADD(FERRY_ROLE_ATTN_O_BIAS, h, 0, "self_attn.%s.bias", o);
  if (c->qk_norm) {
    ADD(FERRY_ROLE_Q_NORM, q, 0, "self_attn.q_norm.weight");
    ADD(FERRY_ROLE_K_NORM, kv, 0, "self_attn.k_norm.weight");
  }
  return FERRY_OK;
}

/* One layer: its dense part, then each routed expert's tensors adjacent. */
static ferry_status add_layer(struct builder *b, const struct ferry_model_config *c, int32_t l) {
  ferry_model *m = b->m;
  const int64_t h = c->hidden;
  char prefix[48];
  snprintf(prefix, sizeof prefix, "%s%d.", c->family == FERRY_FAMILY_OPT ? "model.decoder.layers." : "model.layers.", l);
  b->prefix = prefix;
  b->layer = l;
  b->expert = -1;
  m->layer_first[l] = m->n_tensors;
  if (c->family == FERRY_FAMILY_OPT) {
    ADD(FERRY_ROLE_ATTN_NORM, h, 0, "self_attn_layer_norm.weight");
    ADD(FERRY_ROLE_ATTN_NORM_BIAS, h, 0, "self_attn_layer_norm.bias");
    ferry_status st = add_attention(b, c);
    if (st != FERRY_OK) return st;
    ADD(FERRY_ROLE_FFN_NORM, h, 0, "final_layer_norm.weight");
    ADD(FERRY_ROLE_FFN_NORM_BIAS, h, 0, "final_layer_norm.bias");
    ADD(FERRY_ROLE_FFN_UP, c->intermediate, h, "fc1.weight");
    if (c->ffn_bias) ADD(FERRY_ROLE_FFN_UP_BIAS, c->intermediate, 0, "fc1.bias");
    ADD(FERRY_ROLE_FFN_DOWN, h, c->intermediate, "fc2.weight");
    if (c->ffn_bias) ADD(FERRY_ROLE_FFN_DOWN_BIAS, h, 0, "fc2.bias");
    m->layer_count[l] = m->n_tensors - m->layer_first[l];
    return FERRY_OK;
  }
  ADD(FERRY_ROLE_ATTN_NORM, h, 0, "input_layernorm.weight");
  ferry_status st = add_attention(b, c);
  if (st != FERRY_OK) return st;
  ADD(FERRY_ROLE_FFN_NORM, h, 0, "post_attention_layernorm.weight");
  const char *moe = c->family == FERRY_FAMILY_MIXTRAL ? "block_sparse_moe" : "mlp";
  if (c->n_experts == 0) {
    ADD(FERRY_ROLE_FFN_GATE, c->intermediate, h, "mlp.gate_proj.weight");
    ADD(FERRY_ROLE_FFN_UP, c->intermediate, h, "mlp.up_proj.weight");
    ADD(FERRY_ROLE_FFN_DOWN, h, c->intermediate, "mlp.down_proj.weight");
  } else {
    ADD(FERRY_ROLE_ROUTER, c->n_experts, h, "%s.gate.weight", moe);
    if (c->n_shared_experts > 0) {
      const int64_t si = c->shared_intermediate;
      ADD(FERRY_ROLE_SHARED_GATE, si, h, "mlp.shared_expert.gate_proj.weight");
      ADD(FERRY_ROLE_SHARED_UP, si, h, "mlp.shared_expert.up_proj.weight");
      ADD(FERRY_ROLE_SHARED_DOWN, h, si, "mlp.shared_expert.down_proj.weight");
      if (c->shared_expert_gate) ADD(FERRY_ROLE_SHARED_EXPERT_GATE, 1, h, "mlp.shared_expert_gate.weight");
    }
  }
  m->layer_count[l] = m->n_tensors - m->layer_first[l];
  const int64_t ei = c->expert_intermediate;
  const int mixtral = c->family == FERRY_FAMILY_MIXTRAL;
  for (int32_t e = 0; e < (int32_t)c->n_experts; e++) {
    b->expert = e;
    m->expert_first[(size_t)l * (size_t)c->n_experts + (size_t)e] = m->n_tensors;
    ADD(FERRY_ROLE_EXPERT_GATE, ei, h, "%s.experts.%d.%s.weight", moe, e, mixtral ? "w1" : "gate_proj");
    ADD(FERRY_ROLE_EXPERT_UP, ei, h, "%s.experts.%d.%s.weight", moe, e, mixtral ? "w3" : "up_proj");
    ADD(FERRY_ROLE_EXPERT_DOWN, h, ei, "%s.experts.%d.%s.weight", moe, e, mixtral ? "w2" : "down_proj");
  }
  b->expert = -1;
  return FERRY_OK;
}

static ferry_status build_layout(ferry_model *m) {
  const struct ferry_model_config *c = &m->cfg;
  const int opt = c->family == FERRY_FAMILY_OPT;
  struct builder bb = {.m = m, .cap = 8 + (size_t)c->n_layers * (20 + 3 * (size_t)c->n_experts),
                       .layer = -1, .expert = -1, .prefix = ""};
  struct builder *b = &bb;
  m->tensors = ferry__reallocarray(NULL, bb.cap, sizeof *m->tensors);
  m->layer_first = ferry__calloc((size_t)c->n_layers, sizeof *m->layer_first);
  m->layer_count = ferry__calloc((size_t)c->n_layers, sizeof *m->layer_count);
  m->expert_first = ferry__calloc((size_t)c->n_layers * (size_t)(c->n_experts ? c->n_experts : 1),
                                  sizeof *m->expert_first);
  if (!m->tensors || !m->layer_first || !m->layer_count || !m->expert_first)
    return ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory for the tensor layout", c->name);
  m->expert_tensors = c->n_experts ? 3 : 0;
  const int64_t h = c->hidden;
  ADD(FERRY_ROLE_EMBED, c->vocab, h, "%s", opt ? "model.decoder.embed_tokens.weight" : "model.embed_tokens.weight");
  if (c->learned_positions)
    ADD(FERRY_ROLE_POS_EMBED, c->max_position + 2, h, "model.decoder.embed_positions.weight");
  for (int32_t l = 0; l < (int32_t)c->n_layers; l++) {
    ferry_status st = add_layer(b, c, l);
    if (st != FERRY_OK) return st;
  }
  b->prefix = "";
  b->layer = -1;
  if (opt) {
    ADD(FERRY_ROLE_FINAL_NORM, h, 0, "model.decoder.final_layer_norm.weight");
    ADD(FERRY_ROLE_FINAL_NORM_BIAS, h, 0, "model.decoder.final_layer_norm.bias");
  } else {
    ADD(FERRY_ROLE_FINAL_NORM, h, 0, "model.norm.weight");
  }
  if (!c->tied_embeddings) ADD(FERRY_ROLE_LM_HEAD, c->vocab, h, "lm_head.weight");
  return FERRY_OK;
}

static int cmp_name(const void *a, const void *b, void *arg) {
  const struct ferry_tensor_desc *t = arg;
  return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static ferry_status build_index(ferry_model *m) {
  m->by_name = ferry__reallocarray(NULL, m->n_tensors, sizeof *m->by_name);
  if (!m->by_name) return ferry__fail(FERRY_ERR_NOMEM, "model %s: out of memory for the name index", m->cfg.name);
  for (size_t i = 0; i < m->n_tensors; i++) m->by_name[i] = i;
  qsort_r(m->by_name, m->n_tensors, sizeof *m->by_name, cmp_name, m->tensors);
  for (size_t i = 1; i < m->n_tensors; i++)
    if (!strcmp(m->tensors[m->by_name[i - 1]].name, m->tensors[m->by_name[i]].name))
      return ferry__fail(FERRY_ERR_INTERNAL, "model layout: duplicate tensor name %s",
                         m->tensors[m->by_name[i]].name);
  return FERRY_OK;
}

/* ---- accounting ------------------------------------------------------------------------- */

static void account(ferry_model *m) {
  const struct ferry_model_config *c = &m->cfg;
  struct ferry_model_accounting *a = &m->acc;
  memset(a, 0, sizeof *a);
  double matmul = 0;
  for (size_t i = 0; i < m->n_tensors; i++) {
    const struct ferry_tensor_desc *t = &m->tensors[i];
    a->params_total += t->numel;
    if (t->role == FERRY_ROLE_EMBED || t->role == FERRY_ROLE_POS_EMBED) {
      a->params_embed += t->numel;
      continue;
    }
    if (t->layer < 0) a->params_head += t->numel;
    if (t->layer == 0) {
      a->params_layer += t->numel;
      if (t->expert < 0) a->params_layer_dense += t->numel;
      if (t->expert == 0) a->params_expert += t->numel;
    }
    if (t->ndim == 2) {
      /* Each token goes through experts_per_token of the n_experts routed experts. */
      if (t->expert >= 0)
        matmul += (double)t->numel * (double)c->experts_per_token / (double)c->n_experts;
      else
        matmul += (double)t->numel;
    }
  }
  if (c->tied_embeddings) matmul += (double)c->vocab * (double)c->hidden;
  m->matmul_params_active = matmul;
  a->params_active = a->params_total - (uint64_t)c->n_layers *
                                           (uint64_t)(c->n_experts - c->experts_per_token) * a->params_expert;
  const uint64_t sz = ferry_dtype_size(c->dtype);
  a->bytes_total = a->params_total * sz;
  a->bytes_layer = a->params_layer * sz;
  a->bytes_layer_dense = a->params_layer_dense * sz;
  a->bytes_expert = a->params_expert * sz;
  a->bytes_embed = a->params_embed * sz;
  a->bytes_head = a->params_head * sz;
  a->kv_bytes_per_token = 2u * (uint64_t)c->n_layers *
                          ferry_kv_format_row_bytes(ferry__kv_format_default(c->dtype),
                                                    (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim);
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
  ferry_status st = build_layout(m);
  if (st == FERRY_OK) st = build_index(m);
  if (st != FERRY_OK) {
    ferry_model_close(m);
    return st;
  }
  account(m);
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
  ferry_free(model);
}

ferry_status ferry_model_open(ferry_model **out, const char *name_or_path) {
  if (!out || !name_or_path) return ferry__fail(FERRY_ERR_INVALID, "ferry_model_open: NULL argument");
  *out = NULL;
  const struct ferry_model_config *preset = ferry__model_preset_find(name_or_path);
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
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(model->tensors[model->by_name[mid]].name, name);
    if (c == 0) return (int64_t)model->by_name[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
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
  const enum ferry_kv_format f = ferry_model_kv_format(model, kv_format);
  return 2u * (uint64_t)c->n_layers * (uint64_t)tokens *
         ferry_kv_format_row_bytes(f, (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim);
}

double ferry_model_matmul_params_active(const ferry_model *model) {
  return model ? model->matmul_params_active : 0;
}

/* Attention per earlier token: q.k and p.v, each head_dim multiply-adds per head and layer. */
static double attn_flops_per_ctx(const struct ferry_model_config *c) {
  return 4.0 * (double)c->n_layers * (double)c->n_heads * (double)c->head_dim;
}

double ferry_model_flops_per_token(const ferry_model *model, int64_t context_len) {
  if (!model) return 0;
  if (context_len < 0) context_len = 0;
  return 2.0 * model->matmul_params_active + attn_flops_per_ctx(&model->cfg) * (double)context_len;
}

double ferry_model_flops_prefill(const ferry_model *model, int64_t prompt_len) {
  if (!model || prompt_len <= 0) return 0;
  const double p = (double)prompt_len;
  /* sum over positions i = 0..p-1 of flops_per_token(i) */
  return p * 2.0 * model->matmul_params_active + attn_flops_per_ctx(&model->cfg) * p * (p - 1) / 2.0;
}

int ferry_model_is_moe(const ferry_model *model) { return model && model->cfg.n_experts > 0; }
