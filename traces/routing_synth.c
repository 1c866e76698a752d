/* The seeded synthetic routing model (Zipf popularity over a per-layer permutation, temporal
 * re-use of the previous token's set, repetition of the previous layer's set) and the routing
 * source that replays a recorded trace. Every choice is a pure function of (seed, request,
 * token, layer), so the simulator gets the same routing whatever order it asks in. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/rng.h"
#include "common/units.h"
#include "traces/routing_impl.h"

#define MAX_WALK 64

enum { SALT_LAYER = 0x4c41, SALT_TEMPORAL = 0x5445, SALT_BASE = 0x4241, SALT_MISMATCH = 0x4d49 };

struct ferry_routing_synth {
  struct ferry_routing_synth_config cfg;
  int32_t *perm; /* [layer][rank] -> expert */
  double *cdf;   /* [rank] cumulative Zipf weight, the same for every layer */
  double *alias_prob; /* Walker/Vose alias table of the Zipf ranks: O(1) draws */
  int32_t *alias_idx;
  uint64_t salt_mix[4]; /* the seed mixed with each salt, hashed once */
  int64_t mismatches;
};

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}


static double unit(uint64_t h) { return (double)(h >> 11) * (1.0 / 9007199254740992.0); }

/* One mix per (salt, request, token, layer): the seed's mix with the salt is precomputed, and
 * the three coordinates enter through odd multipliers before a single finaliser. */
static inline uint64_t key(const ferry_routing_synth *s, int which, int64_t req, int32_t tok, int32_t layer) {
  return mix64(s->salt_mix[which] ^ ((uint64_t)req * 0x9e3779b97f4a7c15ULL) ^
               ((uint64_t)(uint32_t)tok * 0xc2b2ae3d27d4eb4fULL) ^ ((uint64_t)(uint32_t)layer * 0x165667b19e3779f9ULL));
}

/* Vose's alias method over the Zipf weights of the ranks. */
static ferry_status build_alias(ferry_routing_synth *s) {
  const int32_t n = s->cfg.n_experts;
  s->alias_prob = ferry__calloc((size_t)n, sizeof *s->alias_prob);
  s->alias_idx = ferry__calloc((size_t)n, sizeof *s->alias_idx);
  double *scaled = ferry__calloc((size_t)n, sizeof *scaled);
  int32_t *small = ferry__calloc((size_t)n, sizeof *small), *large = ferry__calloc((size_t)n, sizeof *large);
  if (!s->alias_prob || !s->alias_idx || !scaled || !small || !large) {
    ferry_free(scaled);
    ferry_free(small);
    ferry_free(large);
    return FERRY_ERR_NOMEM;
  }
  const double total = s->cdf[n - 1];
  int32_t ns = 0, nl = 0;
  for (int32_t r = 0; r < n; r++) {
    double w = s->cdf[r] - (r ? s->cdf[r - 1] : 0);
    scaled[r] = w / total * n;
    if (scaled[r] < 1.0) small[ns++] = r;
    else large[nl++] = r;
  }
  while (ns && nl) {
    int32_t a = small[--ns], b = large[--nl];
    s->alias_prob[a] = scaled[a];
    s->alias_idx[a] = b;
    scaled[b] = scaled[b] + scaled[a] - 1.0;
    if (scaled[b] < 1.0) small[ns++] = b;
    else large[nl++] = b;
  }
  while (nl) {
    int32_t b = large[--nl];
    s->alias_prob[b] = 1.0;
    s->alias_idx[b] = b;
  }
  while (ns) {
    int32_t a = small[--ns];
    s->alias_prob[a] = 1.0;
    s->alias_idx[a] = a;
  }
  ferry_free(scaled);
  ferry_free(small);
  ferry_free(large);
  return FERRY_OK;
}

ferry_status ferry_routing_synth_create(ferry_routing_synth **out, const struct ferry_routing_synth_config *cfg) {
  if (!out || !cfg) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_synth_create: NULL argument");
  *out = NULL;
  const struct ferry_routing_synth_config *c = cfg;
  if (c->n_layers < 1 || c->n_layers > FERRY_ROUTING_MAX_LAYERS || c->n_experts < 1 ||
      c->n_experts > FERRY_ROUTING_MAX_EXPERTS || c->top_k < 1 || c->top_k > c->n_experts ||
      c->top_k > FERRY_ROUTING_MAX_TOPK)
    return ferry__fail(FERRY_ERR_INVALID, "synthetic routing: layers=%d experts=%d k=%d: need 1 <= k <= experts <= %d, "
                       "layers <= %d, k <= %d", c->n_layers, c->n_experts, c->top_k, FERRY_ROUTING_MAX_EXPERTS,
                       FERRY_ROUTING_MAX_LAYERS, FERRY_ROUTING_MAX_TOPK);
  if (!(c->zipf >= 0 && c->zipf <= 10) || !(c->temporal >= 0 && c->temporal <= 1) ||
      !(c->layer_corr >= 0 && c->layer_corr <= 1))
    return ferry__fail(FERRY_ERR_INVALID, "synthetic routing: zipf=%g temporal=%g layer=%g: need zipf in [0, 10] "
                       "and probabilities in [0, 1]", c->zipf, c->temporal, c->layer_corr);
  ferry_routing_synth *s = ferry__calloc(1, sizeof *s);
  if (!s) return ferry__fail(FERRY_ERR_NOMEM, "synthetic routing: out of memory");
  s->cfg = *c;
  s->perm = ferry__calloc((size_t)c->n_layers * (size_t)c->n_experts, sizeof *s->perm);
  s->cdf = ferry__calloc((size_t)c->n_experts, sizeof *s->cdf);
  if (!s->perm || !s->cdf) {
    ferry_routing_synth_free(s);
    return ferry__fail(FERRY_ERR_NOMEM, "synthetic routing: out of memory");
  }
  double acc = 0;
  for (int32_t r = 0; r < c->n_experts; r++) {
    acc += pow((double)(r + 1), -c->zipf);
    s->cdf[r] = acc;
  }
  if (build_alias(s) != FERRY_OK) {
    ferry_routing_synth_free(s);
    return ferry__fail(FERRY_ERR_NOMEM, "synthetic routing: out of memory");
  }
  static const uint64_t salts[4] = {SALT_LAYER, SALT_TEMPORAL, SALT_BASE, SALT_MISMATCH};
  for (int i = 0; i < 4; i++) s->salt_mix[i] = mix64(c->seed ^ mix64(salts[i]));
  for (int32_t l = 0; l < c->n_layers; l++) {
    int32_t *p = s->perm + (size_t)l * (size_t)c->n_experts;
    struct ferry_rng rng;
    ferry__rng_seed_stream(&rng, c->seed, 0x7065726d00000000ULL + (uint64_t)l);
    for (int32_t e = 0; e < c->n_experts; e++) p[e] = e;
    for (int32_t e = c->n_experts - 1; e > 0; e--) {
      int32_t j = (int32_t)ferry__rng_below(&rng, (uint64_t)e + 1);
      int32_t tmp = p[e];
      p[e] = p[j];
      p[j] = tmp;
    }
  }
  *out = s;
  return FERRY_OK;
}

void ferry_routing_synth_free(ferry_routing_synth *s) {
  if (!s) return;
  ferry_free(s->perm);
  ferry_free(s->cdf);
  ferry_free(s->alias_prob);
  ferry_free(s->alias_idx);
  ferry_free(s);
}

int64_t ferry_routing_synth_mismatches(const ferry_routing_synth *s) { return s ? s->mismatches : 0; }

/* Weights: k draws, sorted heaviest first, summing to 1. */
/* k weights in [0.05, 1.05) from the hash x (16 bits each, four per mix), normalised and
 * sorted descending. */
static void draw_weights(uint64_t x, int32_t k, float *w) {
  float sum = 0;
  uint64_t bits = 0;
  for (int32_t i = 0; i < k; i++) {
    if (i % 4 == 0) bits = mix64(x + 0x632be59bd9b4e019ULL * (uint64_t)(i / 4 + 1));
    w[i] = (float)((bits >> (16 * (i % 4))) & 0xffff) * (1.0f / 65536.0f) + 0.05f;
    sum += w[i];
  }
  const float inv = 1.0f / sum;
  for (int32_t i = 0; i < k; i++) w[i] *= inv;
  for (int32_t i = 1; i < k; i++) /* insertion sort, descending */
    for (int32_t j = i; j > 0 && w[j] > w[j - 1]; j--) {
      float t = w[j];
      w[j] = w[j - 1];
      w[j - 1] = t;
    }
}

/* k distinct experts from the Zipf distribution of layer l (without replacement): alias-table
 * draws, each from its own mix of the decision's hash (independent, so they pipeline), redrawn
 * on a repeat. */
static void draw_base(const ferry_routing_synth *s, int64_t req, int32_t tok, int32_t l, int32_t *ids, float *w) {
  const struct ferry_routing_synth_config *c = &s->cfg;
  const uint64_t base = key(s, 2, req, tok, l);
  const int32_t *perm = s->perm + (size_t)l * (size_t)c->n_experts;
  const uint64_t n = (uint64_t)c->n_experts;
  uint64_t draw = 0;
  for (int32_t i = 0; i < c->top_k; i++) {
    int32_t rank = -1;
    for (int attempt = 0; attempt < 64 && rank < 0; attempt++) {
      uint64_t x = mix64(base + 0x9e3779b97f4a7c15ULL * ++draw);
      int32_t idx = (int32_t)(((x >> 32) * n) >> 32);
      double coin = (double)(uint32_t)x * (1.0 / 4294967296.0);
      rank = coin < s->alias_prob[idx] ? idx : s->alias_idx[idx];
      for (int32_t j = 0; j < i && rank >= 0; j++) /* a repeat: redraw, never perm[-1] */
        if (ids[j] == perm[rank]) rank = -1;
    }
    if (rank < 0) /* heavily skewed and unlucky: the most popular rank not yet taken */
      for (int32_t r = 0; r < c->n_experts && rank < 0; r++) {
        rank = r;
        for (int32_t j = 0; j < i; j++)
          if (ids[j] == perm[r]) rank = -1;
      }
    ids[i] = perm[rank];
  }
  if (w) draw_weights(base, c->top_k, w);
}

static void uniform_choice(const ferry_routing_synth *s, int64_t req, int32_t tok, int32_t layer, int32_t k,
                           int32_t n_experts, int32_t *ids, float *w) {
  const uint64_t base = key(s, 3, req, tok, layer);
  uint64_t draw = 0;
  for (int32_t i = 0; i < k; i++) {
    int dup;
    do {
      uint64_t x = mix64(base + 0x9e3779b97f4a7c15ULL * ++draw);
      ids[i] = (int32_t)(((x >> 32) * (uint64_t)n_experts) >> 32);
      dup = 0;
      for (int32_t j = 0; j < i; j++) dup |= ids[j] == ids[i];
    } while (dup);
  }
  if (w) draw_weights(base, k, w);
}

void ferry_routing_synth_fn(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                            int32_t n_experts, int32_t *ids, float *weights) {
  ferry_routing_synth *s = user;
  const struct ferry_routing_synth_config *c = &s->cfg;
  if (top_k < 1 || top_k > n_experts) return;
  if (top_k != c->top_k || n_experts != c->n_experts || layer < 0 || layer >= c->n_layers || token_index < 0) {
    s->mismatches++;
    uniform_choice(s, req_id, token_index, layer, top_k, n_experts, ids, weights);
    return;
  }
  /* Walk the chain of "same as the layer before" / "same as the token before" back to the
   * (token, layer) that made a fresh draw. Each knob is exact when the other is 0; together,
   * layer repetition (checked first) thins the token re-use seen at deeper layers. */
  int32_t t = token_index, l = layer;
  for (int step = 0; step < MAX_WALK; step++) {
    if (l > 0 && c->layer_corr > 0 && unit(key(s, 0, req_id, t, l)) < c->layer_corr) {
      l--;
      continue;
    }
    if (t > 0 && c->temporal > 0 && unit(key(s, 1, req_id, t, l)) < c->temporal) {
      t--;
      continue;
    }
    break;
  }
  draw_base(s, req_id, t, l, ids, weights);
}

static ferry_status parse_prob(const char *key, const char *v, double lo, double hi, double *out) {
  double x;
  if (ferry__parse_double(v, &x) != FERRY_OK || !(x >= lo && x <= hi))
    return ferry__fail(FERRY_ERR_INVALID, "routing spec: %s=%s is not a number in [%g, %g]", key, v, lo, hi);
  *out = x;
  return FERRY_OK;
}

static ferry_status parse_i32(const char *key, const char *v, int64_t lo, int64_t hi, int32_t *out) {
  int64_t x;
  if (ferry__parse_i64(v, &x) != FERRY_OK || x < lo || x > hi)
    return ferry__fail(FERRY_ERR_INVALID, "routing spec: %s=%s is not an integer in [%" PRId64 ", %" PRId64 "]", key,
                       v, lo, hi);
  *out = (int32_t)x;
  return FERRY_OK;
}

ferry_status ferry_routing_synth_parse(const char *spec, struct ferry_routing_synth_config *cfg) {
  if (!spec || !cfg) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_synth_parse: NULL argument");
  char *copy = ferry__strdup(spec);
  if (!copy) return ferry__fail(FERRY_ERR_NOMEM, "routing spec: out of memory");
  ferry_status st = FERRY_OK;
  char *save = NULL;
  for (char *item = strtok_r(copy, ",", &save); item && st == FERRY_OK; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '=');
    if (!eq) {
      st = ferry__fail(FERRY_ERR_INVALID, "routing spec: '%s' is not key=value", item);
      break;
    }
    *eq = '\0';
    const char *k = item, *v = eq + 1;
    if (!strcmp(k, "layers")) st = parse_i32(k, v, 1, FERRY_ROUTING_MAX_LAYERS, &cfg->n_layers);
    else if (!strcmp(k, "experts")) st = parse_i32(k, v, 1, FERRY_ROUTING_MAX_EXPERTS, &cfg->n_experts);
    else if (!strcmp(k, "k")) st = parse_i32(k, v, 1, FERRY_ROUTING_MAX_TOPK, &cfg->top_k);
    else if (!strcmp(k, "zipf")) st = parse_prob(k, v, 0, 10, &cfg->zipf);
    else if (!strcmp(k, "temporal")) st = parse_prob(k, v, 0, 1, &cfg->temporal);
    else if (!strcmp(k, "layer")) st = parse_prob(k, v, 0, 1, &cfg->layer_corr);
    else if (!strcmp(k, "seed")) {
      int64_t x;
      if (ferry__parse_i64(v, &x) != FERRY_OK || x < 0)
        st = ferry__fail(FERRY_ERR_INVALID, "routing spec: seed=%s is not a non-negative integer", v);
      else cfg->seed = (uint64_t)x;
    } else {
      st = ferry__fail(FERRY_ERR_INVALID,
                       "routing spec: unknown key '%s' (expected layers, experts, k, zipf, temporal, layer, seed)", k);
    }
  }
  ferry_free(copy);
  return st;
}

ferry_status ferry_routing_synth_trace(ferry_routing_synth *s, int64_t n_requests, int32_t n_tokens,
                                       ferry_routing **out) {
  if (!s || !out || n_requests < 1 || n_tokens < 1 || n_tokens > FERRY_ROUTING_MAX_TOKEN_IDX)
    return ferry__fail(FERRY_ERR_INVALID, "synthetic routing trace: need requests >= 1 and tokens in [1, %d]",
                       FERRY_ROUTING_MAX_TOKEN_IDX);
  const struct ferry_routing_synth_config *c = &s->cfg;
  ferry_routing *r;
  ferry_status st = ferry_routing_create(&r, c->n_layers, c->n_experts, c->top_k);
  if (st != FERRY_OK) return st;
  int32_t ids[FERRY_ROUTING_MAX_TOPK];
  float w[FERRY_ROUTING_MAX_TOPK];
  for (int64_t q = 0; q < n_requests; q++)
    for (int32_t t = 0; t < n_tokens; t++)
      for (int32_t l = 0; l < c->n_layers; l++) {
        ferry_routing_synth_fn(s, q, t, l, c->top_k, c->n_experts, ids, w);
        if ((st = ferry_routing_add(r, q, t, l, c->top_k, ids, w, 0, NULL)) != FERRY_OK) {
          ferry_routing_free(r);
          return st;
        }
      }
  *out = r;
  return FERRY_OK;
}

/* ---- replay ------------------------------------------------------------------------------ */

struct ferry_routing_replay {
  const ferry_routing *trace;
  ferry_routing_synth *fallback;
  int64_t hits, misses;
};

ferry_status ferry_routing_replay_create(ferry_routing_replay **out, const ferry_routing *trace,
                                         ferry_routing_synth *fallback) {
  if (!out || !trace || !fallback)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_replay_create: NULL trace or fallback");
  *out = ferry__calloc(1, sizeof **out);
  if (!*out) return ferry__fail(FERRY_ERR_NOMEM, "routing replay: out of memory");
  (*out)->trace = trace;
  (*out)->fallback = fallback;
  return FERRY_OK;
}

void ferry_routing_replay_free(ferry_routing_replay *rp) { ferry_free(rp); }
int64_t ferry_routing_replay_hits(const ferry_routing_replay *rp) { return rp ? rp->hits : 0; }
int64_t ferry_routing_replay_misses(const ferry_routing_replay *rp) { return rp ? rp->misses : 0; }

void ferry_routing_replay_fn(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                             int32_t n_experts, int32_t *ids, float *weights) {
  ferry_routing_replay *rp = user;
  const int32_t *ti;
  const float *tw;
  if (top_k == rp->trace->top_k && n_experts >= rp->trace->n_experts &&
      ferry_routing_lookup(rp->trace, req_id, token_index, layer, &ti, &tw)) {
    memcpy(ids, ti, (size_t)top_k * sizeof *ids);
    if (weights) memcpy(weights, tw, (size_t)top_k * sizeof *weights);
    rp->hits++;
    return;
  }
  rp->misses++;
  ferry_routing_synth_fn(rp->fallback, req_id, token_index, layer, top_k, n_experts, ids, weights);
}
