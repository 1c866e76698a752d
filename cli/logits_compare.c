/* Logits of a model on a fixed token set and their distance from a reference's (cosine, KL,
 * top-1), for quantized weights and quantized KV caches alike. */
#include <stdlib.h>
#include <string.h>

#include "cli/logits_compare.h"
#include "common/error.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/quant.h"
#include "ferry/store.h"

struct logits {
  float *v;
  size_t n, cap;
  int64_t vocab;
  int nomem;
};

static void collect(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                    int64_t vocab) {
  (void)req;
  (void)tok;
  (void)tokens;
  (void)n_tokens;
  struct logits *c = user;
  c->vocab = vocab;
  if (c->n + (size_t)vocab > c->cap) {
    size_t cap = (c->cap + (size_t)vocab) * 2;
    float *v = realloc(c->v, cap * sizeof *v);
    if (!v) {
      c->nomem = 1;
      return;
    }
    c->v = v;
    c->cap = cap;
  }
  memcpy(c->v + c->n, l, (size_t)vocab * sizeof *l);
  c->n += (size_t)vocab;
}

/* Same requests, same token ids, everything resident: only the weights or the cache differ. */
static ferry_status logits_of(const char *dir, enum ferry_kv_format kv, struct logits *out) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  ferry_status st;
  struct ferry_engine_config c = {.max_batch = 4, .max_step_tokens = 64, .max_seq_tokens = 64, .seed = 1234,
                                  .resident_all = 1, .kv_format = kv, .on_logits = collect, .logits_user = out};
  static const struct ferry_engine_request reqs[] = {
      {.id = 0, .prompt_tokens = 24, .output_tokens = 8}, {.id = 1, .prompt_tokens = 16, .output_tokens = 8},
      {.id = 2, .prompt_tokens = 32, .output_tokens = 8}, {.id = 3, .prompt_tokens = 8, .output_tokens = 8}};
  if ((st = ferry_model_open(&m, dir)) == FERRY_OK && (st = ferry_store_open(&s, dir)) == FERRY_OK &&
      (st = ferry_exec_create_host(&ex, NULL)) == FERRY_OK && (st = ferry_engine_create(&e, m, s, ex, &c)) == FERRY_OK)
    st = ferry_engine_run(e, reqs, 4, &(struct ferry_run_options){.as_fast_as_possible = 1});
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
  if (st == FERRY_OK && out->nomem) st = ferry__fail(FERRY_ERR_NOMEM, "out of memory for the logits of %s", dir);
  return st;
}

ferry_status logits_compare(const char *ref_dir, enum ferry_kv_format ref_kv, const char *dir, enum ferry_kv_format kv,
                            struct logits_error *out) {
  ferry_status st;
  struct logits ref = {0}, q = {0};
  memset(out, 0, sizeof *out);
  if ((st = logits_of(ref_dir, ref_kv, &ref)) != FERRY_OK || (st = logits_of(dir, kv, &q)) != FERRY_OK) goto out;
  if (ref.n != q.n || !ref.vocab || ref.vocab != q.vocab) {
    st = ferry__fail(FERRY_ERR_INTERNAL, "logits: the two runs produced different numbers of tokens");
    goto out;
  }
  const size_t V = (size_t)ref.vocab, tokens = ref.n / V;
  double cos_sum = 0, cos_min = 1, kl_sum = 0, kl_max = 0;
  size_t top1 = 0;
  for (size_t t = 0; t < tokens; t++) {
    const float *a = ref.v + t * V, *b = q.v + t * V;
    const double cs = ferry_quant_cosine(a, b, V), kl = ferry_quant_kl_logits(a, b, V);
    cos_sum += cs;
    kl_sum += kl;
    if (cs < cos_min) cos_min = cs;
    if (kl > kl_max) kl_max = kl;
    size_t ia = 0, ib = 0;
    for (size_t i = 1; i < V; i++) {
      if (a[i] > a[ia]) ia = i;
      if (b[i] > b[ib]) ib = i;
    }
    top1 += ia == ib;
  }
  out->tokens = tokens;
  out->cos_mean = cos_sum / (double)tokens;
  out->cos_min = cos_min;
  out->kl_mean = kl_sum / (double)tokens;
  out->kl_max = kl_max;
  out->top1_share = (double)top1 / (double)tokens;
out:
  free(ref.v);
  free(q.v);
  return st;
}
