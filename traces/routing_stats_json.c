/* Routing statistics as JSON (`ferry trace routing stats --json`, and the run metadata the
 * report reads): every figure of ferry_routing_stats under its C name, NAN as null. */
#include <math.h>
#include <stddef.h>

#include "common/alloc.h"
#include "common/json.h"
#include "traces/routing_stats_impl.h"

struct field {
  const char *name;
  size_t offset;
};

#define LF(f) {#f, offsetof(struct ferry_routing_layer_stats, f)}
static const struct field layer_fields[] = {
    LF(top25_share),     LF(entropy_norm),       LF(busiest_share),    LF(load_cv),         LF(first_repeat),
    LF(any_repeat),      LF(first_repeat_indep), LF(any_repeat_indep), LF(next_first_acc),  LF(next_first_base),
    LF(next_set_recall), LF(next_set_base),      LF(next_overlap),     LF(next_same),       LF(prev_token_same),
    LF(coact_max),       LF(request_spec_max),   LF(gate_top1_mean),   LF(gate_top1_p10),   LF(gate_top1_p50),
    LF(gate_top1_p90),   LF(gate_last_mean),
};
#undef LF
#define SF(f) {#f, offsetof(struct ferry_routing_stats, f)}
static const struct field overall_fields[] = {
    SF(top25_share),     SF(entropy_norm),   SF(busiest_share),   SF(load_cv),         SF(first_repeat),
    SF(any_repeat),      SF(first_repeat_uniform), SF(any_repeat_uniform), SF(next_first_acc),
    SF(next_first_base), SF(next_set_recall), SF(next_set_base),  SF(next_overlap),    SF(next_same),
    SF(prev_token_same), SF(coact_max),      SF(gate_top1_mean),  SF(gate_last_mean),  SF(reuse_mean),
};
#undef SF

/* A number, or null for NAN / infinity (JSON has neither). */
static int add_num(cJSON *o, const char *name, double v) {
  return (isfinite(v) ? cJSON_AddNumberToObject(o, name, v) : cJSON_AddNullToObject(o, name)) != NULL;
}

static int add_fields(cJSON *o, const void *base, const struct field *f, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!add_num(o, f[i].name, *(const double *)((const char *)base + f[i].offset))) return 0;
  return 1;
}

ferry_status ferry_routing_stats_json(const ferry_routing *r, const struct ferry_routing_stats *s, const char *source,
                                      char **out) {
  if (!r || !s || !out) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_stats_json: NULL argument");
  *out = NULL;
  ferry__json_init();
  cJSON *root = cJSON_CreateObject(), *shape = NULL, *overall = NULL, *layers = NULL, *reuse = NULL;
  int ok = root != NULL;
  if (ok && source) ok = cJSON_AddStringToObject(root, "source", source) != NULL;
  if (ok) ok = (shape = cJSON_AddObjectToObject(root, "shape")) != NULL;
  if (ok)
    ok = cJSON_AddNumberToObject(shape, "layers", r->n_layers) && cJSON_AddNumberToObject(shape, "experts", r->n_experts) &&
         cJSON_AddNumberToObject(shape, "top_k", r->top_k) &&
         cJSON_AddNumberToObject(shape, "requests", (double)r->n_reqs) &&
         cJSON_AddNumberToObject(shape, "rows", (double)r->n_rows) &&
         cJSON_AddNumberToObject(shape, "features", r->n_features);
  if (ok) ok = (overall = cJSON_AddObjectToObject(root, "overall")) != NULL;
  if (ok) ok = add_fields(overall, s, overall_fields, sizeof overall_fields / sizeof *overall_fields);
  if (ok) ok = (reuse = cJSON_AddObjectToObject(root, "reuse_distance")) != NULL;
  if (ok) {
    cJSON *hist = cJSON_AddArrayToObject(reuse, "histogram");
    ok = hist && cJSON_AddNumberToObject(reuse, "first_uses", (double)s->first_uses) &&
         cJSON_AddNumberToObject(reuse, "median", (double)s->reuse_p50);
    for (int b = 0; ok && b < FERRY_ROUTING_REUSE_BUCKETS; b++) {
      cJSON *bin = cJSON_CreateObject();
      ok = bin && cJSON_AddItemToArray(hist, bin) && cJSON_AddNumberToObject(bin, "from", (double)ferry_routing_reuse_bucket_lo(b)) &&
           cJSON_AddNumberToObject(bin, "count", (double)s->reuse_hist[b]);
    }
  }
  if (ok) ok = (layers = cJSON_AddArrayToObject(root, "layers")) != NULL;
  for (int32_t l = 0; ok && l < s->n_layers; l++) {
    const struct ferry_routing_layer_stats *ls = &s->layers[l];
    cJSON *o = cJSON_CreateObject(), *top = NULL;
    ok = o && cJSON_AddItemToArray(layers, o) && cJSON_AddNumberToObject(o, "layer", l) &&
         cJSON_AddNumberToObject(o, "uses", (double)ls->uses) &&
         cJSON_AddNumberToObject(o, "token_pairs", (double)ls->token_pairs) &&
         add_fields(o, ls, layer_fields, sizeof layer_fields / sizeof *layer_fields) &&
         (top = cJSON_AddArrayToObject(o, "top_experts")) != NULL;
    for (int j = 0; ok && j < 8 && ls->top_ids[j] >= 0; j++) {
      cJSON *e = cJSON_CreateObject();
      ok = e && cJSON_AddItemToArray(top, e) && cJSON_AddNumberToObject(e, "id", ls->top_ids[j]) &&
           add_num(e, "share", ls->top_share[j]);
    }
  }
  char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (!text) return ferry__fail(FERRY_ERR_NOMEM, "routing statistics: out of memory for the JSON text");
  *out = text; /* cJSON allocates through ferry's hook (ferry__json_init) */
  return FERRY_OK;
}
