/* Expert predictors behind one interface: the registry of op tables (one line per predictor
 * built in, ferry_predictor_register() for a test's or a plugin's), the wrapper that checks
 * every call, and the top-k selection the predictors share. Pure: the caller supplies
 * features, logits or future choices; nothing here reads files or clocks. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/registry.h"
#include "ferry/predict.h"
#include "policy.h"

/* One line per predictor built in, in the order help texts list them (and the order of enum
 * ferry_predictor_kind). */
#define FERRY_PREDICTORS(X)                  \
  X(none, FERRY_PREDICTOR_NONE)              \
  X(lru, FERRY_PREDICTOR_LRU)                \
  X(frequency, FERRY_PREDICTOR_FREQUENCY)    \
  X(gate_lookahead, FERRY_PREDICTOR_GATE_LOOKAHEAD) \
  X(mlp3, FERRY_PREDICTOR_MLP3)              \
  X(mlp7, FERRY_PREDICTOR_MLP7)              \
  X(oracle, FERRY_PREDICTOR_ORACLE)

#define DECLARE_(name, kind) extern const struct ferry_predictor_ops ferry__predictor_##name;
FERRY_PREDICTORS(DECLARE_)
#undef DECLARE_

static const struct ferry_predictor_ops *const builtin[] = {
#define ENTRY_(name, kind) [kind] = &ferry__predictor_##name,
    FERRY_PREDICTORS(ENTRY_)
#undef ENTRY_
};
_Static_assert(sizeof builtin / sizeof builtin[0] == FERRY_PREDICTOR_ORACLE + 1, "one built-in per kind");

static struct ferry__registry registry = {.what = "predictor",
                                          .builtin = (const void *const *)builtin,
                                          .n_builtin = sizeof builtin / sizeof builtin[0],
                                          .name_offset = offsetof(struct ferry_predictor_ops, name)};

size_t ferry_predictor_registry_count(void) { return ferry__registry_count(&registry); }
const struct ferry_predictor_ops *ferry_predictor_registry_at(size_t i) { return ferry__registry_at(&registry, i); }
const struct ferry_predictor_ops *ferry_predictor_registry_find(const char *name) {
  return ferry__registry_find(&registry, name);
}

ferry_status ferry_predictor_register(const struct ferry_predictor_ops *ops) {
  if (!ops || ops->version != FERRY_PREDICTOR_OPS_VERSION || !ops->create || !ops->free || !ops->predict)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_predictor_register: needs version %d, create(), free() and predict()",
                       FERRY_PREDICTOR_OPS_VERSION);
  if ((ops->needs & FERRY_PREDICT_NEEDS_FEATURES) && (ops->n_features < 1 || ops->n_features > FERRY_MLP7_FEATURES))
    return ferry__fail(FERRY_ERR_INVALID, "ferry_predictor_register: %s needs 1 to %d features", ops->name,
                       FERRY_MLP7_FEATURES);
  return ferry__registry_add(&registry, ops);
}

ferry_status ferry_predictor_lookup(const char *name, const struct ferry_predictor_ops **out) {
  *out = ferry_predictor_registry_find(name);
  return *out ? FERRY_OK : ferry__registry_unknown(&registry, name);
}

ferry_status ferry_predictor_kind_parse(const char *name, enum ferry_predictor_kind *out) {
  for (size_t i = 0; name && i < sizeof builtin / sizeof builtin[0]; i++)
    if (!strcmp(name, builtin[i]->name)) {
      *out = (enum ferry_predictor_kind)i;
      return FERRY_OK;
    }
  return ferry__fail(FERRY_ERR_INVALID,
                     "unknown predictor '%s' (expected none, lru, frequency, gate-lookahead, mlp3, mlp7 or oracle)",
                     name ? name : "(null)");
}

const char *ferry_predictor_kind_name(enum ferry_predictor_kind kind) {
  return (unsigned)kind < sizeof builtin / sizeof builtin[0] ? builtin[kind]->name : "?";
}

struct ferry_predictor {
  const struct ferry_predictor_ops *ops;
  void *state;
  struct ferry_predictor_config cfg;
};

ferry_status ferry_predictor_create(ferry_predictor **out, const struct ferry_predictor_config *cfg) {
  if (!out || !cfg) return ferry__fail(FERRY_ERR_INVALID, "ferry_predictor_create: NULL argument");
  *out = NULL;
  const struct ferry_predictor_ops *ops;
  if (cfg->name) {
    ferry_status st = ferry_predictor_lookup(cfg->name, &ops);
    if (st != FERRY_OK) return st;
  } else if ((unsigned)cfg->kind > FERRY_PREDICTOR_ORACLE) {
    return ferry__fail(FERRY_ERR_INVALID, "predictor: unknown variant %d", (int)cfg->kind);
  } else {
    ops = builtin[cfg->kind];
  }
  if (cfg->n_layers < 1 || cfg->n_experts < 1 || cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
    return ferry__fail(FERRY_ERR_INVALID, "predictor: layers=%d experts=%d k=%d: need 1 <= k <= experts, layers >= 1",
                       cfg->n_layers, cfg->n_experts, cfg->top_k);
  ferry_predictor *p = ferry__calloc(1, sizeof *p);
  if (!p) return ferry__fail(FERRY_ERR_NOMEM, "predictor: out of memory");
  p->ops = ops;
  p->cfg = *cfg;
  p->cfg.name = ops->name; /* static: the config is kept */
  ferry_status st = ops->create(&p->state, &p->cfg);
  if (st != FERRY_OK) {
    ferry_free(p);
    return st;
  }
  *out = p;
  return FERRY_OK;
}

void ferry_predictor_free(ferry_predictor *p) {
  if (!p) return;
  p->ops->free(p->state);
  ferry_free(p);
}

const struct ferry_predictor_ops *ferry_predictor_ops_of(const ferry_predictor *p) { return p ? p->ops : NULL; }

enum ferry_predictor_kind ferry_predictor_kind_of(const ferry_predictor *p) {
  for (size_t i = 0; p && i < sizeof builtin / sizeof builtin[0]; i++)
    if (p->ops == builtin[i]) return (enum ferry_predictor_kind)i;
  return FERRY_PREDICTOR_NONE;
}

ferry_status ferry_predictor_set_popularity(ferry_predictor *p, int32_t layer, const int64_t *counts) {
  if (!p || !counts || layer < 0 || layer >= p->cfg.n_layers)
    return ferry__fail(FERRY_ERR_INVALID, "predictor: popularity for layer %d outside [0, %d)", layer,
                       p ? p->cfg.n_layers : 0);
  if (!p->ops->set_popularity) return ferry__fail(FERRY_ERR_INVALID, "predictor %s takes no popularity", p->ops->name);
  return p->ops->set_popularity(p->state, layer, counts);
}

ferry_status ferry_predictor_set_mlp(ferry_predictor *p, const struct ferry_mlp *m) {
  if (!p || !m) return ferry__fail(FERRY_ERR_INVALID, "ferry_predictor_set_mlp: NULL argument");
  if (!p->ops->set_mlp) return ferry__fail(FERRY_ERR_INVALID, "predictor %s takes no weights", p->ops->name);
  return p->ops->set_mlp(p->state, m);
}

ferry_status ferry_predictor_predict(ferry_predictor *p, const struct ferry_predict_context *ctx, int32_t layer_ahead,
                                     int32_t *out_ids, int32_t max, int32_t *n_out) {
  if (!p || !ctx || !n_out || (max > 0 && !out_ids))
    return ferry__fail(FERRY_ERR_INVALID, "ferry_predictor_predict: NULL argument");
  *n_out = 0;
  const int32_t target = ctx->layer + layer_ahead;
  if (layer_ahead < 0 || target < 0 || target >= p->cfg.n_layers)
    return ferry__fail(FERRY_ERR_INVALID, "predictor: target layer %d + %d is outside [0, %d)", ctx->layer,
                       layer_ahead, p->cfg.n_layers);
  if (max <= 0 || !(p->ops->needs & FERRY_PREDICT_PREDICTS)) return FERRY_OK;
  if (max > p->cfg.n_experts) max = p->cfg.n_experts;
  ferry_status st = p->ops->predict(p->state, ctx, layer_ahead, out_ids, max, n_out);
  /* whatever a predictor answers, the caller gets experts that exist, no more than it asked */
  int32_t kept = 0;
  for (int32_t i = 0; st == FERRY_OK && i < *n_out && i < max; i++)
    if (out_ids[i] >= 0 && out_ids[i] < p->cfg.n_experts) out_ids[kept++] = out_ids[i];
  *n_out = st == FERRY_OK ? kept : 0;
  return st;
}

void ferry_predictor_observe(ferry_predictor *p, int64_t req_id, int32_t token_index, int32_t layer, int32_t k,
                             const int32_t *ids) {
  if (!p || !ids || layer < 0 || layer >= p->cfg.n_layers || !p->ops->observe) return;
  const struct ferry_predict_context ctx = {.req_id = req_id, .token_index = token_index, .layer = layer};
  p->ops->observe(p->state, &ctx, k, ids);
}

int32_t ferry__top_keys(const void *v, int32_t n, int32_t max, double (*key)(const void *v, int32_t i), int32_t *out) {
  int32_t got = 0;
  for (int32_t i = 0; i < n; i++) {
    const double ki = key(v, i);
    if (isnan(ki)) continue;
    int32_t pos = got;
    while (pos > 0 && key(v, out[pos - 1]) < ki) pos--;
    if (pos >= max) continue;
    int32_t end = got < max ? got : max - 1;
    memmove(out + pos + 1, out + pos, (size_t)(end - pos) * sizeof *out);
    out[pos] = i;
    if (got < max) got++;
  }
  return got;
}

double ferry__logit_key(const void *v, int32_t i) {
  const float x = ((const float *)v)[i];
  return isfinite(x) ? (double)x : NAN;
}
