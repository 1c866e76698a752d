/* Routing traces: the in-memory index by (request, token, layer), strict JSONL reading with
 * line-numbered errors and bounds-checked ids, JSONL writing, and the engine's record hook.
 * Reading takes two passes over the rows so layer and expert counts can be inferred. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strbuf.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "traces/routing_impl.h"
#include "traces/trace_impl.h"

#define EXACT_INT_D 9007199254740992.0

/* ---- handle and index ------------------------------------------------------------------- */

ferry_status ferry_routing_create(ferry_routing **out, int32_t n_layers, int32_t n_experts, int32_t top_k) {
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_create: NULL out");
  *out = NULL;
  if (n_layers < 1 || n_layers > FERRY_ROUTING_MAX_LAYERS)
    return ferry__fail(FERRY_ERR_INVALID, "routing: %d layers is outside [1, %d]", n_layers, FERRY_ROUTING_MAX_LAYERS);
  if (n_experts < 1 || n_experts > FERRY_ROUTING_MAX_EXPERTS)
    return ferry__fail(FERRY_ERR_INVALID, "routing: %d experts is outside [1, %d]", n_experts,
                       FERRY_ROUTING_MAX_EXPERTS);
  if (top_k < 1 || top_k > n_experts || top_k > FERRY_ROUTING_MAX_TOPK)
    return ferry__fail(FERRY_ERR_INVALID, "routing: top-k %d is outside [1, %d]", top_k,
                       n_experts < FERRY_ROUTING_MAX_TOPK ? n_experts : FERRY_ROUTING_MAX_TOPK);
  ferry_routing *r = ferry__calloc(1, sizeof *r);
  if (!r) return ferry__fail(FERRY_ERR_NOMEM, "routing: out of memory");
  r->n_layers = n_layers;
  r->n_experts = n_experts;
  r->top_k = top_k;
  *out = r;
  return FERRY_OK;
}

void ferry_routing_free(ferry_routing *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_reqs; i++) {
    ferry_free(r->reqs[i].ids);
    ferry_free(r->reqs[i].weights);
    ferry_free(r->reqs[i].features);
    ferry_free(r->reqs[i].has_features);
    ferry_free(r->reqs[i].look);
  }
  ferry_free(r->reqs);
  ferry_free(r);
}

const char *ferry_routing_errmsg(const ferry_routing *r) { return r ? r->err.msg : ""; }
ferry_status ferry_routing_check_shape(const ferry_routing *r, int32_t n_layers, int32_t n_experts, int32_t top_k,
                                       const char *what) {
  if (!r) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_check_shape: NULL trace");
  char why[512] = "";
  size_t n = 0;
  if (r->n_layers != n_layers && n < sizeof why)
    n += (size_t)snprintf(why + n, sizeof why - n, "%s%d layers (the model has %d)", n ? ", " : "", r->n_layers, n_layers);
  if (r->top_k != top_k && n < sizeof why)
    n += (size_t)snprintf(why + n, sizeof why - n, "%s%d experts per token (the model routes %d)", n ? ", " : "",
                          r->top_k, top_k);
  if (r->n_experts > n_experts && n < sizeof why)
    n += (size_t)snprintf(why + n, sizeof why - n, "%sexpert ids up to %d (the model has %d experts)", n ? ", " : "",
                          r->n_experts - 1, n_experts);
  if (!n) return FERRY_OK;
  return ferry__fail(FERRY_ERR_INVALID, "%s: the routing trace does not match the model: it has %s", what ? what : "routing",
                     why);
}

int32_t ferry_routing_n_layers(const ferry_routing *r) { return r ? r->n_layers : 0; }
int32_t ferry_routing_n_experts(const ferry_routing *r) { return r ? r->n_experts : 0; }
int32_t ferry_routing_top_k(const ferry_routing *r) { return r ? r->top_k : 0; }
int32_t ferry_routing_n_features(const ferry_routing *r) { return r ? r->n_features : 0; }
size_t ferry_routing_n_requests(const ferry_routing *r) { return r ? r->n_reqs : 0; }
int64_t ferry_routing_n_rows(const ferry_routing *r) { return r ? r->n_rows : 0; }

/* Index of the first request with id >= req_id. */
static size_t lower_bound(const ferry_routing *r, int64_t req_id) {
  size_t lo = 0, hi = r->n_reqs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->reqs[mid].req_id < req_id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

const struct ferry__routing_req *ferry__routing_find(const ferry_routing *r, int64_t req_id) {
  size_t i = lower_bound(r, req_id);
  return i < r->n_reqs && r->reqs[i].req_id == req_id ? &r->reqs[i] : NULL;
}

static struct ferry__routing_req *get_req(ferry_routing *r, int64_t req_id) {
  size_t i = lower_bound(r, req_id);
  if (i < r->n_reqs && r->reqs[i].req_id == req_id) return &r->reqs[i];
  if (r->n_reqs == r->cap_reqs) {
    size_t cap = r->cap_reqs ? r->cap_reqs * 2 : 16;
    struct ferry__routing_req *n = ferry__reallocarray(r->reqs, cap, sizeof *n);
    if (!n) return NULL;
    r->reqs = n;
    r->cap_reqs = cap;
  }
  memmove(&r->reqs[i + 1], &r->reqs[i], (r->n_reqs - i) * sizeof *r->reqs);
  memset(&r->reqs[i], 0, sizeof r->reqs[i]);
  r->reqs[i].req_id = req_id;
  r->n_reqs++;
  return &r->reqs[i];
}

/* Make room for token index tok (cells of new tokens are absent). */
static ferry_status grow_tokens(ferry_routing *r, struct ferry__routing_req *q, int32_t tok) {
  if (tok < q->cap_tokens) {
    if (tok >= q->n_tokens) q->n_tokens = tok + 1;
    return FERRY_OK;
  }
  int64_t cap = q->cap_tokens ? (int64_t)q->cap_tokens * 2 : 64;
  if (cap < (int64_t)tok + 1) cap = (int64_t)tok + 1;
  size_t cells = (size_t)r->n_layers * (size_t)r->top_k;
  int32_t *ids = ferry__reallocarray(q->ids, (size_t)cap * cells, sizeof *ids);
  if (!ids) return FERRY_ERR_NOMEM;
  q->ids = ids;
  float *w = ferry__reallocarray(q->weights, (size_t)cap * cells, sizeof *w);
  if (!w) return FERRY_ERR_NOMEM;
  q->weights = w;
  uint8_t *hf = ferry__realloc(q->has_features, (size_t)cap);
  if (!hf) return FERRY_ERR_NOMEM;
  q->has_features = hf;
  if (q->features) {
    float *f = ferry__reallocarray(q->features, (size_t)cap * (size_t)r->n_features, sizeof *f);
    if (!f) return FERRY_ERR_NOMEM;
    q->features = f;
  }
  for (size_t i = (size_t)q->cap_tokens * cells; i < (size_t)cap * cells; i++) {
    ids[i] = -1;
    w[i] = 0;
  }
  if (q->look) {
    const size_t lc = cells * FERRY_ROUTING_MAX_LOOKAHEAD;
    int32_t *look = ferry__reallocarray(q->look, (size_t)cap * lc, sizeof *look);
    if (!look) return FERRY_ERR_NOMEM;
    q->look = look;
    for (size_t i = (size_t)q->cap_tokens * lc; i < (size_t)cap * lc; i++) look[i] = -1;
  }
  memset(hf + q->cap_tokens, 0, (size_t)(cap - q->cap_tokens));
  q->cap_tokens = (int32_t)cap;
  if (tok >= q->n_tokens) q->n_tokens = tok + 1;
  return FERRY_OK;
}

ferry_status ferry_routing_add(ferry_routing *r, int64_t req_id, int32_t token_idx, int32_t layer, int32_t k,
                               const int32_t *ids, const float *weights, int32_t n_features, const float *features) {
  if (!r || !ids) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_add: NULL argument");
  if (k != r->top_k)
    return ferry__err_set(&r->err, FERRY_ERR_INVALID, "routing: %d experts given, the trace has top-k %d", k, r->top_k);
  if (layer < 0 || layer >= r->n_layers)
    return ferry__err_set(&r->err, FERRY_ERR_RANGE, "routing: layer %d is outside [0, %d)", layer, r->n_layers);
  if (token_idx < 0 || token_idx > FERRY_ROUTING_MAX_TOKEN_IDX)
    return ferry__err_set(&r->err, FERRY_ERR_RANGE, "routing: token index %d is outside [0, %d]", token_idx,
                          FERRY_ROUTING_MAX_TOKEN_IDX);
  for (int32_t i = 0; i < k; i++) {
    if (ids[i] < 0 || ids[i] >= r->n_experts)
      return ferry__err_set(&r->err, FERRY_ERR_RANGE, "routing: expert %d is outside [0, %d)", ids[i], r->n_experts);
    for (int32_t j = 0; j < i; j++)
      if (ids[j] == ids[i])
        return ferry__err_set(&r->err, FERRY_ERR_INVALID, "routing: expert %d chosen twice", ids[i]);
  }
  if (n_features < 0 || n_features > FERRY_ROUTING_MAX_FEATURES || (n_features && !features))
    return ferry__err_set(&r->err, FERRY_ERR_INVALID, "routing: %d features is outside [0, %d]", n_features,
                          FERRY_ROUTING_MAX_FEATURES);
  if (n_features && r->n_features && n_features != r->n_features)
    return ferry__err_set(&r->err, FERRY_ERR_INVALID, "routing: %d features given, the trace has %d", n_features,
                          r->n_features);
  struct ferry__routing_req *q = get_req(r, req_id);
  if (!q || grow_tokens(r, q, token_idx) != FERRY_OK)
    return ferry__err_set(&r->err, FERRY_ERR_NOMEM, "routing: out of memory for request %" PRId64, req_id);
  size_t cell = ((size_t)token_idx * (size_t)r->n_layers + (size_t)layer) * (size_t)k;
  if (q->ids[cell] < 0) r->n_rows++;
  for (int32_t i = 0; i < k; i++) {
    q->ids[cell + (size_t)i] = ids[i];
    q->weights[cell + (size_t)i] = weights ? weights[i] : 1.0f / (float)k;
  }
  if (n_features && !q->has_features[token_idx]) {
    if (!r->n_features) r->n_features = n_features;
    if (!q->features) {
      q->features = ferry__calloc((size_t)q->cap_tokens * (size_t)n_features, sizeof(float));
      if (!q->features) return ferry__err_set(&r->err, FERRY_ERR_NOMEM, "routing: out of memory for features");
    }
    memcpy(q->features + (size_t)token_idx * (size_t)n_features, features, (size_t)n_features * sizeof(float));
    q->has_features[token_idx] = 1;
  }
  return FERRY_OK;
}

ferry_status ferry_routing_counts(const ferry_routing *r, int32_t n_experts, int64_t *counts) {
  if (!r || !counts || r->n_experts > n_experts)
    return ferry__fail(FERRY_ERR_INVALID, "routing counts: the trace saw %d experts per layer, the model has %d",
                       r ? r->n_experts : 0, n_experts);
  const int32_t L = r->n_layers, K = r->top_k;
  memset(counts, 0, (size_t)L * (size_t)n_experts * sizeof *counts);
  for (size_t i = 0; i < r->n_reqs; i++) {
    const struct ferry__routing_req *q = &r->reqs[i];
    for (int64_t j = 0; j < (int64_t)q->n_tokens * L * K; j++) {
      const int32_t x = q->ids[j];
      if (x >= 0 && x < n_experts) counts[(j / K) % L * n_experts + x]++;
    }
  }
  return FERRY_OK;
}

ferry_status ferry_routing_request_at(const ferry_routing *r, size_t i, struct ferry_routing_request *out) {
  if (!r || !out || i >= r->n_reqs) return FERRY_ERR_RANGE;
  const struct ferry__routing_req *q = &r->reqs[i];
  *out = (struct ferry_routing_request){.req_id = q->req_id,
                                        .n_tokens = q->n_tokens,
                                        .ids = q->ids,
                                        .weights = q->weights,
                                        .features = r->n_features ? q->features : NULL,
                                        .has_features = q->has_features,
                                        .lookahead = q->look};
  return FERRY_OK;
}

int ferry_routing_lookup(const ferry_routing *r, int64_t req_id, int32_t token_idx, int32_t layer,
                         const int32_t **ids, const float **weights) {
  if (!r || layer < 0 || layer >= r->n_layers || token_idx < 0) return 0;
  const struct ferry__routing_req *q = ferry__routing_find(r, req_id);
  if (!q || token_idx >= q->n_tokens) return 0;
  size_t cell = ((size_t)token_idx * (size_t)r->n_layers + (size_t)layer) * (size_t)r->top_k;
  if (q->ids[cell] < 0) return 0;
  if (ids) *ids = q->ids + cell;
  if (weights) *weights = q->weights + cell;
  return 1;
}

/* Index of (token, layer, ahead) in a request's lookahead block. */
static size_t look_cell(const ferry_routing *r, int32_t token_idx, int32_t layer, int32_t ahead) {
  return (((size_t)token_idx * (size_t)r->n_layers + (size_t)layer) * FERRY_ROUTING_MAX_LOOKAHEAD + (size_t)(ahead - 1)) *
         (size_t)r->top_k;
}

ferry_status ferry_routing_set_lookahead(ferry_routing *r, int64_t req_id, int32_t token_idx, int32_t layer,
                                         int32_t ahead, int32_t k, const int32_t *ids) {
  if (!r || !ids) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_set_lookahead: NULL argument");
  if (k != r->top_k)
    return ferry__err_set(&r->err, FERRY_ERR_INVALID, "routing: lookahead of %d experts, the trace has top-k %d", k,
                          r->top_k);
  if (ahead < 1 || ahead > FERRY_ROUTING_MAX_LOOKAHEAD)
    return ferry__err_set(&r->err, FERRY_ERR_RANGE, "routing: lookahead %d layers ahead is outside [1, %d]", ahead,
                          FERRY_ROUTING_MAX_LOOKAHEAD);
  if (layer < 0 || layer + ahead >= r->n_layers)
    return ferry__err_set(&r->err, FERRY_ERR_RANGE, "routing: lookahead from layer %d to layer %d: the trace has %d layers",
                          layer, layer + ahead, r->n_layers);
  for (int32_t i = 0; i < k; i++) {
    if (ids[i] < 0 || ids[i] >= r->n_experts)
      return ferry__err_set(&r->err, FERRY_ERR_RANGE, "routing: lookahead expert %d is outside [0, %d)", ids[i],
                            r->n_experts);
    for (int32_t j = 0; j < i; j++)
      if (ids[j] == ids[i])
        return ferry__err_set(&r->err, FERRY_ERR_INVALID, "routing: lookahead expert %d chosen twice", ids[i]);
  }
  struct ferry__routing_req *q = (struct ferry__routing_req *)ferry__routing_find(r, req_id);
  if (!q || token_idx < 0 || token_idx >= q->n_tokens ||
      q->ids[((size_t)token_idx * (size_t)r->n_layers + (size_t)layer) * (size_t)r->top_k] < 0)
    return ferry__err_set(&r->err, FERRY_ERR_NOT_FOUND,
                          "routing: no row for req_id %" PRId64 " token_idx %d layer %d to attach a lookahead to",
                          req_id, token_idx, layer);
  if (!q->look) {
    const size_t n = (size_t)q->cap_tokens * (size_t)r->n_layers * FERRY_ROUTING_MAX_LOOKAHEAD * (size_t)r->top_k;
    q->look = ferry__reallocarray(NULL, n, sizeof *q->look);
    if (!q->look) return ferry__err_set(&r->err, FERRY_ERR_NOMEM, "routing: out of memory for lookahead choices");
    for (size_t i = 0; i < n; i++) q->look[i] = -1;
  }
  memcpy(q->look + look_cell(r, token_idx, layer, ahead), ids, (size_t)k * sizeof *ids);
  return FERRY_OK;
}

const int32_t *ferry_routing_lookahead(const ferry_routing *r, int64_t req_id, int32_t token_idx, int32_t layer,
                                       int32_t ahead) {
  if (!r || ahead < 1 || ahead > FERRY_ROUTING_MAX_LOOKAHEAD || layer < 0 || layer >= r->n_layers || token_idx < 0)
    return NULL;
  const struct ferry__routing_req *q = ferry__routing_find(r, req_id);
  if (!q || !q->look || token_idx >= q->n_tokens) return NULL;
  const int32_t *ids = q->look + look_cell(r, token_idx, layer, ahead);
  return ids[0] >= 0 ? ids : NULL;
}

const float *ferry_routing_token_features(const ferry_routing *r, int64_t req_id, int32_t token_idx) {
  if (!r || r->n_features <= 0 || token_idx < 0) return NULL;
  const struct ferry__routing_req *q = ferry__routing_find(r, req_id);
  if (!q || token_idx >= q->n_tokens || !q->features || !q->has_features || !q->has_features[token_idx]) return NULL;
  return q->features + (size_t)token_idx * (size_t)r->n_features;
}

void ferry_routing_record(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                          const int32_t *ids, const float *weights, int32_t n_features, const float *features) {
  ferry_routing *r = user;
  if (!r || r->record_status != FERRY_OK) return;
  r->record_status = ferry_routing_add(r, req_id, token_index, layer, top_k, ids, weights, features ? n_features : 0,
                                       features);
}

ferry_status ferry_routing_record_status(const ferry_routing *r) {
  return r ? r->record_status : FERRY_ERR_INVALID;
}

/* ---- JSONL reading ---------------------------------------------------------------------- */

/* A parsed row; its ids, weights and features live in the reader's pools. */
struct row {
  int64_t req, line;
  int32_t tok, layer, nf, nlook;
  size_t off, foff, loff;
};

struct reader {
  struct ferry__lines lines;
  struct ferry_err *err;
  struct row *rows;
  size_t n, cap;
  int32_t *ids;
  float *w;
  size_t pool_n, pool_cap, wpool_cap;
  float *feat;
  size_t feat_n, feat_cap;
  int32_t *look; /* lookahead ids of every row, nlook * k per row */
  size_t look_n, look_cap;
  int32_t k, nf, max_layer, max_expert;
  int64_t nf_line, k_line;
};

static ferry_status bad(struct reader *rd, int64_t line, const char *fmt, ...) FERRY_PRINTF(3, 4);
static ferry_status bad(struct reader *rd, int64_t line, const char *fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return ferry__err_set(rd->err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": %s", rd->lines.path, line, what);
}

static ferry_status oom(struct reader *rd) {
  return ferry__err_set(rd->err, FERRY_ERR_NOMEM, "%s:%" PRId64 ": out of memory", rd->lines.path, rd->lines.lineno);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  void *n = ferry__reallocarray(*p, c, elem);
  if (!n) return -1;
  *p = n;
  *cap = c;
  return 0;
}

/* k expert ids from the JSON array `arr` into out: each an integer in [0, max_expert), none twice;
 * `what` names the array in the message ("\"topk_ids\"", "\"lookahead\"[2]"). */
static ferry_status read_expert_ids(struct reader *rd, int64_t line, const cJSON *arr, int k, int32_t max_expert,
                                    const char *what, int32_t *out) {
  for (int i = 0; i < k; i++) {
    const cJSON *it = cJSON_GetArrayItem(arr, i);
    if (!ferry__json_is_int(it, 0, max_expert - 1))
      return bad(rd, line, "%s[%d] is not an expert id in [0, %d)", what, i, max_expert);
    out[i] = (int32_t)it->valuedouble;
    for (int j = 0; j < i; j++)
      if (out[j] == out[i]) return bad(rd, line, "%s[%d]: expert %d is chosen twice", what, i, out[i]);
  }
  return FERRY_OK;
}

/* "topk_ids" and "topk_weights" into the reader's pools at pool_n; *k their length. */
static ferry_status parse_topk(struct reader *rd, int64_t line, const cJSON *obj, int32_t max_expert, int *k_out) {
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(obj, "topk_ids");
  const cJSON *ws = cJSON_GetObjectItemCaseSensitive(obj, "topk_weights");
  if (!ids || !cJSON_IsArray(ids)) return bad(rd, line, ids ? "\"topk_ids\" is not an array" : "missing \"topk_ids\"");
  int k = cJSON_GetArraySize(ids);
  if (k < 1 || k > FERRY_ROUTING_MAX_TOPK)
    return bad(rd, line, "\"topk_ids\" has %d entries, expected 1 to %d", k, FERRY_ROUTING_MAX_TOPK);
  if (rd->k && k != rd->k)
    return bad(rd, line, "\"topk_ids\" has %d entries, expected %d as on line %" PRId64, k, rd->k, rd->k_line);
  if (!ws || !cJSON_IsArray(ws))
    return bad(rd, line, ws ? "\"topk_weights\" is not an array" : "missing \"topk_weights\"");
  if (cJSON_GetArraySize(ws) != k)
    return bad(rd, line, "\"topk_weights\" has %d entries, expected %d like \"topk_ids\"", cJSON_GetArraySize(ws), k);
  if (grow((void **)&rd->ids, &rd->pool_cap, rd->pool_n + (size_t)k, sizeof(int32_t)) ||
      grow((void **)&rd->w, &rd->wpool_cap, rd->pool_n + (size_t)k, sizeof(float)))
    return oom(rd);
  ferry_status st = read_expert_ids(rd, line, ids, k, max_expert, "\"topk_ids\"", rd->ids + rd->pool_n);
  if (st != FERRY_OK) return st;
  float *out_w = rd->w + rd->pool_n;
  for (int i = 0; i < k; i++) {
    const cJSON *wv = cJSON_GetArrayItem(ws, i);
    if (!cJSON_IsNumber(wv) || !isfinite(wv->valuedouble) || fabs(wv->valuedouble) > 3.0e38)
      return bad(rd, line, "\"topk_weights\"[%d] is not a finite number", i);
    out_w[i] = (float)wv->valuedouble;
  }
  *k_out = k;
  return FERRY_OK;
}

/* Optional "features" into the reader's feature pool at feat_n; *nf their count (0: none). */
static ferry_status parse_features(struct reader *rd, int64_t line, const cJSON *obj, int32_t *nf_out) {
  *nf_out = 0;
  const cJSON *fs = cJSON_GetObjectItemCaseSensitive(obj, "features");
  if (!fs || cJSON_IsNull(fs)) return FERRY_OK;
  if (!cJSON_IsArray(fs)) return bad(rd, line, "\"features\" is not an array");
  int32_t nf = cJSON_GetArraySize(fs);
  if (nf < 1 || nf > FERRY_ROUTING_MAX_FEATURES)
    return bad(rd, line, "\"features\" has %d entries, expected 1 to %d", nf, FERRY_ROUTING_MAX_FEATURES);
  if (rd->nf && nf != rd->nf)
    return bad(rd, line, "\"features\" has %d entries, expected %d as on line %" PRId64, nf, rd->nf, rd->nf_line);
  if (grow((void **)&rd->feat, &rd->feat_cap, rd->feat_n + (size_t)nf, sizeof(float))) return oom(rd);
  for (int i = 0; i < nf; i++) {
    const cJSON *fv = cJSON_GetArrayItem(fs, i);
    if (!cJSON_IsNumber(fv) || !isfinite(fv->valuedouble) || fabs(fv->valuedouble) > 3.0e38)
      return bad(rd, line, "\"features\"[%d] is not a finite number", i);
    rd->feat[rd->feat_n + (size_t)i] = (float)fv->valuedouble;
  }
  *nf_out = nf;
  return FERRY_OK;
}

/* Optional "lookahead" (an array of k expert ids per layer ahead) into the reader's pool at
 * look_n; *nlook their count (0: none). */
static ferry_status parse_lookahead(struct reader *rd, int64_t line, const cJSON *obj, int k, int32_t max_expert,
                                    int32_t *nlook_out) {
  *nlook_out = 0;
  const cJSON *la = cJSON_GetObjectItemCaseSensitive(obj, "lookahead");
  if (!la || cJSON_IsNull(la)) return FERRY_OK;
  if (!cJSON_IsArray(la)) return bad(rd, line, "\"lookahead\" is not an array of expert-id arrays");
  int32_t nlook = cJSON_GetArraySize(la);
  if (nlook < 1 || nlook > FERRY_ROUTING_MAX_LOOKAHEAD)
    return bad(rd, line, "\"lookahead\" has %d entries, expected 1 to %d (layers ahead)", nlook,
               FERRY_ROUTING_MAX_LOOKAHEAD);
  if (grow((void **)&rd->look, &rd->look_cap, rd->look_n + (size_t)nlook * (size_t)k, sizeof(int32_t)))
    return oom(rd);
  for (int a = 0; a < nlook; a++) {
    const cJSON *ids_a = cJSON_GetArrayItem(la, a);
    if (!cJSON_IsArray(ids_a) || cJSON_GetArraySize(ids_a) != k)
      return bad(rd, line, "\"lookahead\"[%d] is not an array of %d expert ids like \"topk_ids\"", a, k);
    int32_t *dst = rd->look + rd->look_n + (size_t)a * (size_t)k;
    char what[32];
    snprintf(what, sizeof what, "\"lookahead\"[%d]", a);
    ferry_status st = read_expert_ids(rd, line, ids_a, k, max_expert, what, dst);
    if (st != FERRY_OK) return st;
    for (int i = 0; i < k; i++)
      if (dst[i] > rd->max_expert) rd->max_expert = dst[i];
  }
  *nlook_out = nlook;
  return FERRY_OK;
}

/* The JSON object of the reader's current line, or NULL with *st set: invalid JSON, data after
 * it, or not an object. */
static cJSON *parse_object(struct reader *rd, int64_t line, ferry_status *st) {
  ferry__json_init();
  const char *end = NULL;
  const char *buf = rd->lines.buf;
  cJSON *obj = cJSON_ParseWithLengthOpts(buf, rd->lines.len, &end, 0);
  if (!obj) {
    const char *e = cJSON_GetErrorPtr();
    size_t col = e && e >= buf && e <= buf + rd->lines.len ? (size_t)(e - buf) + 1 : 1;
    *st = bad(rd, line, "invalid JSON near column %zu", col);
    return NULL;
  }
  *st = FERRY_OK;
  for (const char *p = end; p < buf + rd->lines.len; p++)
    if (*p != ' ' && *p != '\t' && *p != '\r') {
      *st = bad(rd, line, "unexpected data after the JSON object at column %zu", (size_t)(p - buf) + 1);
      break;
    }
  if (*st == FERRY_OK && !cJSON_IsObject(obj)) *st = bad(rd, line, "not a JSON object");
  if (*st == FERRY_OK) return obj;
  cJSON_Delete(obj);
  return NULL;
}

/* One routing row: request, token, layer, its top-k, and optional features and lookahead. */
static ferry_status parse_row(struct reader *rd, const struct ferry_routing_options *o) {
  int64_t line = rd->lines.lineno;
  ferry_status st;
  cJSON *obj = parse_object(rd, line, &st);
  if (!obj) return st;
  int32_t max_layer = o && o->n_layers ? o->n_layers : FERRY_ROUTING_MAX_LAYERS;
  int32_t max_expert = o && o->n_experts ? o->n_experts : FERRY_ROUTING_MAX_EXPERTS;
  int64_t req = 0, tok = 0, layer = 0;
  int r, k = 0;
  int32_t nf = 0, nlook = 0;
  if ((r = ferry__jl_int(obj, "req_id", -EXACT_INT_D, EXACT_INT_D, &req)) != 0)
    st = bad(rd, line, r == 1 ? "missing \"req_id\"" : "\"req_id\" is not an integer in [-2^53, 2^53]");
  else if ((r = ferry__jl_int(obj, "token_idx", 0, FERRY_ROUTING_MAX_TOKEN_IDX, &tok)) != 0)
    st = bad(rd, line, r == 1 ? "missing \"token_idx\"" : "\"token_idx\" is not an integer in [0, %d]",
             FERRY_ROUTING_MAX_TOKEN_IDX);
  else if ((r = ferry__jl_int(obj, "layer", 0, max_layer - 1, &layer)) != 0)
    st = bad(rd, line, r == 1 ? "missing \"layer\"" : "\"layer\" is not an integer in [0, %d)", max_layer);
  else if ((st = parse_topk(rd, line, obj, max_expert, &k)) == FERRY_OK &&
           (st = parse_features(rd, line, obj, &nf)) == FERRY_OK &&
           (st = parse_lookahead(rd, line, obj, k, max_expert, &nlook)) == FERRY_OK &&
           grow((void **)&rd->rows, &rd->cap, rd->n + 1, sizeof *rd->rows))
    st = oom(rd);
  cJSON_Delete(obj);
  if (st != FERRY_OK) return st;
  const int32_t *out_ids = rd->ids + rd->pool_n;
  rd->rows[rd->n++] = (struct row){.req = req, .line = line, .tok = (int32_t)tok, .layer = (int32_t)layer,
                                   .nf = nf, .nlook = nlook, .off = rd->pool_n, .foff = rd->feat_n,
                                   .loff = rd->look_n};
  rd->look_n += (size_t)nlook * (size_t)k;
  rd->pool_n += (size_t)k;
  rd->feat_n += (size_t)nf;
  if (!rd->k) {
    rd->k = k;
    rd->k_line = line;
  }
  if (nf && !rd->nf) {
    rd->nf = nf;
    rd->nf_line = line;
  }
  if (layer > rd->max_layer) rd->max_layer = (int32_t)layer;
  for (int i = 0; i < k; i++)
    if (out_ids[i] > rd->max_expert) rd->max_expert = out_ids[i];
  return FERRY_OK;
}

static int cmp_row(const void *a, const void *b) {
  const struct row *x = a, *y = b;
  if (x->req != y->req) return x->req < y->req ? -1 : 1;
  if (x->tok != y->tok) return x->tok < y->tok ? -1 : 1;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  return x->line < y->line ? -1 : x->line > y->line;
}

/* Cross-row checks on rows sorted by (req, token, layer, line): duplicates and features that
 * disagree within a token. Reports the later line. */
static ferry_status check_sorted(struct reader *rd) {
  for (size_t i = 1; i < rd->n; i++) {
    const struct row *a = &rd->rows[i - 1], *b = &rd->rows[i];
    if (a->req == b->req && a->tok == b->tok && a->layer == b->layer)
      return bad(rd, b->line, "second row for req_id %" PRId64 " token_idx %d layer %d (first on line %" PRId64 ")",
                 b->req, b->tok, b->layer, a->line);
  }
  /* Within a token, every row with features must carry the earliest such row's values. */
  for (size_t i = 0; i < rd->n;) {
    size_t j = i;
    while (j < rd->n && rd->rows[j].req == rd->rows[i].req && rd->rows[j].tok == rd->rows[i].tok) j++;
    const struct row *ref = NULL;
    for (size_t x = i; x < j; x++)
      if (rd->rows[x].nf && (!ref || rd->rows[x].line < ref->line)) ref = &rd->rows[x];
    const struct row *worst = NULL;
    for (size_t x = i; ref && x < j; x++) {
      const struct row *y = &rd->rows[x];
      if (y->nf && memcmp(rd->feat + ref->foff, rd->feat + y->foff, (size_t)y->nf * sizeof(float)) &&
          (!worst || y->line < worst->line))
        worst = y;
    }
    if (worst)
      return bad(rd, worst->line, "\"features\" differ from those of the same token on line %" PRId64, ref->line);
    i = j;
  }
  return FERRY_OK;
}

/* Line number of the first non-blank line (the reader has parsed no row before it). */
static int64_t first_line(const struct reader *rd) { return rd->n ? -1 : rd->lines.lineno; }

ferry_status ferry_routing_open(ferry_routing **out, const char *path, const struct ferry_routing_options *opts) {
  if (!out || !path) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_open: NULL argument");
  *out = NULL;
  if (opts && (opts->n_layers < 0 || opts->n_layers > FERRY_ROUTING_MAX_LAYERS || opts->n_experts < 0 ||
               opts->n_experts > FERRY_ROUTING_MAX_EXPERTS))
    return ferry__fail(FERRY_ERR_INVALID, "%s: layer or expert bound out of range", path);
  struct ferry_err err = {0};
  struct reader rd = {.err = &err, .max_layer = -1, .max_expert = -1};
  ferry_status st = ferry__lines_open(&rd.lines, path, &err);
  if (st != FERRY_OK) return st;
  for (;;) {
    st = ferry__lines_next(&rd.lines, &err);
    if (st != FERRY_OK) goto out_free_rows;
    if (rd.lines.eof) break;
    if (rd.lines.lineno == first_line(&rd) && ferry__routing_looks_vllm(rd.lines.buf)) {
      ferry__lines_close(&rd.lines); /* vLLM's routed-experts responses: their own reader */
      st = ferry__routing_open_vllm(out, path, opts, &err);
      return st;
    }
    st = parse_row(&rd, opts);
    if (st != FERRY_OK) goto out_free_rows;
  }
  if (!rd.n) {
    st = ferry__err_set(&err, FERRY_ERR_FORMAT, "%s: no routing rows", path);
    goto out_free_rows;
  }
  qsort(rd.rows, rd.n, sizeof *rd.rows, cmp_row);
  if ((st = check_sorted(&rd)) != FERRY_OK) goto out_free_rows;
  int32_t L = opts && opts->n_layers ? opts->n_layers : rd.max_layer + 1;
  int32_t E = opts && opts->n_experts ? opts->n_experts : rd.max_expert + 1;
  if (E < rd.k) E = rd.k;
  /* Tokens are indexed densely per request: refuse traces so sparse that the index would
   * dwarf the file (a single row with token_idx 10^6 would otherwise cost gigabytes). */
  uint64_t cells = 0;
  for (size_t i = 0; i < rd.n; i++)
    if (i + 1 == rd.n || rd.rows[i + 1].req != rd.rows[i].req) cells += (uint64_t)rd.rows[i].tok + 1;
  if (cells * (uint64_t)L > 64u * (uint64_t)rd.n + (1u << 20)) {
    st = ferry__err_set(&err, FERRY_ERR_FORMAT,
                        "%s: token indices too sparse: %" PRIu64 " (token, layer) cells for %zu rows", path,
                        cells * (uint64_t)L, rd.n);
    goto out_free_rows;
  }
  ferry_routing *r;
  if ((st = ferry_routing_create(&r, L, E, rd.k)) != FERRY_OK) goto out_free_rows;
  for (size_t i = 0; i < rd.n; i++) {
    const struct row *x = &rd.rows[i];
    st = ferry_routing_add(r, x->req, x->tok, x->layer, rd.k, rd.ids + x->off, rd.w + x->off, x->nf,
                           x->nf ? rd.feat + x->foff : NULL);
    for (int32_t a = 0; st == FERRY_OK && a < x->nlook; a++)
      st = ferry_routing_set_lookahead(r, x->req, x->tok, x->layer, a + 1, rd.k,
                                       rd.look + x->loff + (size_t)a * (size_t)rd.k);
    if (st != FERRY_OK) {
      if (st != FERRY_ERR_NOMEM) st = FERRY_ERR_FORMAT; /* a row the trace cannot hold is a malformed file */
      ferry__err_set(&err, st, "%s:%" PRId64 ": %s", path, x->line, r->err.msg);
      ferry_routing_free(r);
      goto out_free_rows;
    }
  }
  *out = r;
out_free_rows:
  ferry_free(rd.rows);
  ferry_free(rd.ids);
  ferry_free(rd.w);
  ferry_free(rd.feat);
  ferry_free(rd.look);
  ferry__lines_close(&rd.lines);
  return st;
}

/* ---- JSONL writing ---------------------------------------------------------------------- */


ferry_status ferry_routing_write_jsonl(const ferry_routing *r, const char *path) {
  if (!r || !path) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_write_jsonl: NULL argument");
  struct ferry_strbuf b = {0};
  int32_t L = r->n_layers, K = r->top_k;
  for (size_t i = 0; i < r->n_reqs; i++) {
    const struct ferry__routing_req *q = &r->reqs[i];
    for (int32_t t = 0; t < q->n_tokens; t++) {
      int features_done = !r->n_features || !q->has_features[t];
      for (int32_t l = 0; l < L; l++) {
        size_t cell = ((size_t)t * (size_t)L + (size_t)l) * (size_t)K;
        if (q->ids[cell] < 0) continue;
        ferry__sb_printf(&b, "{\"req_id\":%" PRId64 ",\"token_idx\":%d,\"layer\":%d,\"topk_ids\":[", q->req_id, t, l);
        for (int32_t j = 0; j < K; j++) ferry__sb_printf(&b, j ? ",%d" : "%d", q->ids[cell + (size_t)j]);
        ferry__sb_printf(&b, "],\"topk_weights\":[");
        /* %.9g round-trips every float exactly. */
        for (int32_t j = 0; j < K; j++) ferry__sb_printf(&b, j ? ",%.9g" : "%.9g", (double)q->weights[cell + (size_t)j]);
        ferry__sb_printf(&b, "]");
        /* lookahead choices, ahead 1, 2, ... up to the first one missing */
        for (int32_t a = 1; q->look && a <= FERRY_ROUTING_MAX_LOOKAHEAD; a++) {
          const int32_t *la = q->look + look_cell(r, t, l, a);
          if (la[0] < 0) {
            if (a > 1) ferry__sb_printf(&b, "]");
            break;
          }
          ferry__sb_printf(&b, a == 1 ? ",\"lookahead\":[[" : ",[");
          for (int32_t j = 0; j < K; j++) ferry__sb_printf(&b, j ? ",%d" : "%d", la[j]);
          ferry__sb_printf(&b, "]");
          if (a == FERRY_ROUTING_MAX_LOOKAHEAD) ferry__sb_printf(&b, "]");
        }
        if (!features_done) {
          const float *f = q->features + (size_t)t * (size_t)r->n_features;
          ferry__sb_printf(&b, ",\"features\":[");
          for (int32_t j = 0; j < r->n_features; j++) ferry__sb_printf(&b, j ? ",%.9g" : "%.9g", (double)f[j]);
          ferry__sb_printf(&b, "]");
          features_done = 1;
        }
        ferry__sb_printf(&b, "}\n");
      }
    }
  }
  ferry_status st;
  if (b.oom) {
    st = ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory formatting %" PRId64 " routing rows", path, r->n_rows);
  } else {
    st = ferry__write_output(path, b.p, b.len);
  }
  ferry_free(b.p);
  return st;
}
