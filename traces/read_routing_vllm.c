/* Routing as vLLM returns it with --enable-return-routed-experts (routed experts replay, R3):
 * one JSON response per line, with "prompt_routed_experts" [prompt_len][moe_layers][top_k] at
 * the response level and "routed_experts" [gen_len][moe_layers][top_k] per entry of "choices"
 * (or at the top level for a single completion). Each (response, choice) becomes a request
 * whose tokens are the prompt's then the generated ones; vLLM gives expert ids only, so the
 * gate weights are 1/k each. ferry_routing_open() reads these files when it sees the keys. */
#include <inttypes.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "traces/routing_impl.h"
#include "traces/trace_impl.h"

struct vreader {
  struct ferry__lines lines;
  struct ferry_err *err;
  int32_t L, K, max_expert;
  int64_t L_line;
  int32_t *ids;       /* [tokens][L][K] of every request, in order */
  size_t n_ids, cap_ids;
  int64_t *req_tokens; /* tokens of each request */
  int64_t *req_line;
  size_t n_reqs, cap_reqs;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *n = ferry__reallocarray(*p, c, elem);
  if (!n) return -1;
  *p = n;
  *cap = c;
  return 0;
}

static ferry_status bad(struct vreader *v, const char *what, const char *key, int64_t a, int64_t b) {
  return ferry__err_set(v->err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": \"%s\"%s (at [%" PRId64 "][%" PRId64 "])",
                        v->lines.path, v->lines.lineno, key, what, a, b);
}

/* Append the [tokens][L][K] array `a` (named key) to the current request. */
static ferry_status add_array(struct vreader *v, const cJSON *a, const char *key, int64_t *tokens) {
  if (!cJSON_IsArray(a)) return bad(v, " is not an array of tokens", key, -1, -1);
  const cJSON *tok;
  int64_t t = 0;
  cJSON_ArrayForEach(tok, a) {
    int32_t l = 0;
    if (!cJSON_IsArray(tok)) return bad(v, " is not an array of layers", key, t, -1);
    const int n_layers = cJSON_GetArraySize(tok);
    if (v->L < 0) {
      if (n_layers < 1 || n_layers > FERRY_ROUTING_MAX_LAYERS) return bad(v, " has no layers or too many", key, t, -1);
      v->L = n_layers;
      v->L_line = v->lines.lineno;
    } else if (n_layers != v->L) {
      return ferry__err_set(v->err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": \"%s\"[%" PRId64 "] has %d layers, expected %d as "
                            "on line %" PRId64, v->lines.path, v->lines.lineno, key, t, n_layers, v->L, v->L_line);
    }
    if (grow((void **)&v->ids, &v->cap_ids, v->n_ids + (size_t)v->L * (size_t)(v->K > 0 ? v->K : FERRY_ROUTING_MAX_TOPK),
             sizeof *v->ids))
      return ferry__err_set(v->err, FERRY_ERR_NOMEM, "%s: out of memory", v->lines.path);
    const cJSON *layer;
    cJSON_ArrayForEach(layer, tok) {
      const int k = cJSON_IsArray(layer) ? cJSON_GetArraySize(layer) : -1;
      if (k < 1 || k > FERRY_ROUTING_MAX_TOPK) return bad(v, " is not an array of 1 to 64 expert ids", key, t, l);
      if (v->K < 0) v->K = k;
      if (k != v->K) return bad(v, ": a different top-k than the first token's", key, t, l);
      const cJSON *id;
      cJSON_ArrayForEach(id, layer) {
        if (!ferry__json_is_int(id, 0, FERRY_ROUTING_MAX_EXPERTS - 1))
          return bad(v, ": an expert id is not an integer in [0, 4096)", key, t, l);
        int32_t e = (int32_t)id->valuedouble;
        if (e > v->max_expert) v->max_expert = e;
        v->ids[v->n_ids++] = e;
      }
      l++;
    }
    t++;
  }
  *tokens += t;
  return FERRY_OK;
}

static ferry_status push_request(struct vreader *v, const cJSON *prompt, const cJSON *gen) {
  size_t cap_line = v->cap_reqs;
  if (grow((void **)&v->req_tokens, &v->cap_reqs, v->n_reqs + 1, sizeof *v->req_tokens) ||
      grow((void **)&v->req_line, &cap_line, v->n_reqs + 1, sizeof *v->req_line))
    return ferry__err_set(v->err, FERRY_ERR_NOMEM, "%s: out of memory", v->lines.path);
  int64_t tokens = 0;
  ferry_status st = FERRY_OK;
  if (prompt) st = add_array(v, prompt, "prompt_routed_experts", &tokens);
  if (st == FERRY_OK && gen) st = add_array(v, gen, "routed_experts", &tokens);
  if (st != FERRY_OK) return st;
  if (!tokens) return ferry__err_set(v->err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": a response with no routed tokens",
                                     v->lines.path, v->lines.lineno);
  v->req_line[v->n_reqs] = v->lines.lineno;
  v->req_tokens[v->n_reqs++] = tokens;
  return FERRY_OK;
}

static ferry_status parse_response(struct vreader *v) {
  cJSON *o = NULL;
  ferry_status st = ferry__json_parse(v->lines.buf, v->lines.len, v->lines.path, &o, v->err);
  if (st != FERRY_OK) return st;
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    return ferry__err_set(v->err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": not a JSON object", v->lines.path, v->lines.lineno);
  }
  const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(o, "prompt_routed_experts");
  const cJSON *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
  const cJSON *top = cJSON_GetObjectItemCaseSensitive(o, "routed_experts");
  if (cJSON_IsNull(prompt)) prompt = NULL;
  int pushed = 0;
  const cJSON *c;
  if (cJSON_IsArray(choices))
    cJSON_ArrayForEach(c, choices) {
      const cJSON *gen = cJSON_GetObjectItemCaseSensitive(c, "routed_experts");
      if (st == FERRY_OK && gen && !cJSON_IsNull(gen)) {
        st = push_request(v, prompt, gen);
        pushed++;
      }
    }
  if (st == FERRY_OK && !pushed && (top || prompt)) st = push_request(v, prompt, top && !cJSON_IsNull(top) ? top : NULL);
  else if (st == FERRY_OK && !pushed)
    st = ferry__err_set(v->err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": no \"routed_experts\" or \"prompt_routed_experts\"",
                        v->lines.path, v->lines.lineno);
  cJSON_Delete(o);
  return st;
}

int ferry__routing_looks_vllm(const char *line) {
  /* a routing row always names req_id; a vLLM response never does */
  return !strstr(line, "\"req_id\"") &&
         (strstr(line, "\"routed_experts\"") || strstr(line, "\"prompt_routed_experts\""));
}

ferry_status ferry__routing_open_vllm(ferry_routing **out, const char *path, const struct ferry_routing_options *opts,
                                      struct ferry_err *err) {
  struct vreader v = {.err = err, .L = -1, .K = -1, .max_expert = -1};
  ferry__json_init();
  ferry_status st = ferry__lines_open(&v.lines, path, err);
  if (st != FERRY_OK) return st;
  for (;;) {
    if ((st = ferry__lines_next(&v.lines, err)) != FERRY_OK) goto out_free;
    if (v.lines.eof) break;
    if ((st = parse_response(&v)) != FERRY_OK) goto out_free;
  }
  if (!v.n_reqs) {
    st = ferry__err_set(err, FERRY_ERR_FORMAT, "%s: no routed tokens", path);
    goto out_free;
  }
  int32_t L = opts && opts->n_layers ? opts->n_layers : v.L, E = opts && opts->n_experts ? opts->n_experts : v.max_expert + 1;
  if (E < v.K) E = v.K;
  if (L < v.L || E <= v.max_expert) {
    st = ferry__err_set(err, FERRY_ERR_FORMAT, "%s: %d layers and expert ids up to %d do not fit --layers %d / --experts %d",
                        path, v.L, v.max_expert, L, E);
    goto out_free;
  }
  ferry_routing *r = NULL;
  if ((st = ferry_routing_create(&r, L, E, v.K)) != FERRY_OK) goto out_free;
  size_t off = 0;
  for (size_t q = 0; q < v.n_reqs && st == FERRY_OK; q++)
    for (int64_t t = 0; t < v.req_tokens[q] && st == FERRY_OK; t++)
      for (int32_t l = 0; l < v.L && st == FERRY_OK; l++, off += (size_t)v.K) {
        if (t > FERRY_ROUTING_MAX_TOKEN_IDX) {
          st = ferry__err_set(err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": more than %d tokens in one request", path,
                              v.req_line[q], FERRY_ROUTING_MAX_TOKEN_IDX);
          break;
        }
        st = ferry_routing_add(r, (int64_t)q, (int32_t)t, l, v.K, v.ids + off, NULL, 0, NULL);
        if (st != FERRY_OK) {
          if (st != FERRY_ERR_NOMEM) st = FERRY_ERR_FORMAT;
          ferry__err_set(err, st, "%s:%" PRId64 ": token %" PRId64 ", layer %d: %s", path, v.req_line[q], t, l,
                         r->err.msg);
        }
      }
  if (st == FERRY_OK) *out = r;
  else ferry_routing_free(r);
out_free:
  ferry_free(v.ids);
  ferry_free(v.req_tokens);
  ferry_free(v.req_line);
  ferry__lines_close(&v.lines);
  return st;
}
