/* The seeded synthetic routing model: Zipf popularity over a per-layer permutation (and, with
 * domains, a per-request-domain one), temporal re-use of the previous token's set or of one of
 * its experts, repetition of the previous layer's set or of its first choice through a fixed
 * mapping, co-activation pairs, and gate weights of a chosen spread. Every choice is a pure
 * function of (seed, request, token, layer), so the simulator gets the same routing whatever
 * order it asks in. The named profiles that set these knobs live in routing_profile.c. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/rng.h"
#include "common/units.h"
#include "traces/routing_impl.h"

#define MAX_WALK 64

enum { SALT_LAYER, SALT_TEMPORAL, SALT_BASE, SALT_MISMATCH, SALT_MODE, SALT_DOMAIN, N_SALTS };
static const uint64_t salts[N_SALTS] = {0x4c41, 0x5445, 0x4241, 0x4d49, 0x4d4f, 0x444f};

/* How a (token, layer) gets its choice: from a fresh draw, or from its one predecessor. */
enum mode { FRESH, COPY_LAYER, COPY_TOKEN, STICKY_FIRST, STICKY_ANY, AFFINITY };

struct alias {
  double *prob; /* Walker/Vose alias table over popularity ranks: O(1) draws */
  int32_t *idx;
  int sure;     /* every prob >= 1: a draw's coin never picks the alias (uniform popularity) */
};

struct ferry_routing_synth {
  struct ferry_routing_synth_config cfg;
  int extended;       /* any profile knob set */
  int32_t *perm;      /* [layer][rank] -> expert */
  struct alias global;
  int32_t *dperm;     /* [layer][domain][rank] -> expert (domains > 1) */
  struct alias domain;
  int32_t *partner;   /* [layer][expert] co-activation partner (coact > 0) */
  int32_t *amap;      /* [layer][expert] image of the previous layer's first choice (affinity > 0) */
  double *sticky_first, *sticky_any; /* [layer] */
  uint64_t salt_mix[N_SALTS]; /* the seed mixed with each salt, hashed once */
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

/* Vose's alias method over the Zipf weights 1/(r+1)^skew of n ranks. */
static ferry_status build_alias(struct alias *a, int32_t n, double skew) {
  a->prob = ferry__calloc((size_t)n, sizeof *a->prob);
  a->idx = ferry__calloc((size_t)n, sizeof *a->idx);
  double *scaled = ferry__calloc((size_t)n, sizeof *scaled);
  int32_t *small = ferry__calloc((size_t)n, sizeof *small), *large = ferry__calloc((size_t)n, sizeof *large);
  ferry_status st = FERRY_ERR_NOMEM;
  if (!a->prob || !a->idx || !scaled || !small || !large) goto out_free;
  /* weights as differences of the running sum, as the model always computed them (the same
   * bits, so the same draws for the same seed) */
  double total = 0, prev = 0;
  for (int32_t r = 0; r < n; r++) total += pow((double)(r + 1), -skew);
  double acc = 0;
  int32_t ns = 0, nl = 0;
  for (int32_t r = 0; r < n; r++) {
    acc += pow((double)(r + 1), -skew);
    scaled[r] = (acc - prev) / total * n;
    prev = acc;
    if (scaled[r] < 1.0) small[ns++] = r;
    else large[nl++] = r;
  }
  while (ns && nl) {
    int32_t x = small[--ns], y = large[--nl];
    a->prob[x] = scaled[x];
    a->idx[x] = y;
    scaled[y] = scaled[y] + scaled[x] - 1.0;
    if (scaled[y] < 1.0) small[ns++] = y;
    else large[nl++] = y;
  }
  while (nl) {
    int32_t y = large[--nl];
    a->prob[y] = 1.0;
    a->idx[y] = y;
  }
  while (ns) {
    int32_t x = small[--ns];
    a->prob[x] = 1.0;
    a->idx[x] = x;
  }
  a->sure = 1;
  for (int32_t r = 0; r < n; r++) a->sure &= a->prob[r] >= 1.0;
  st = FERRY_OK;
out_free:
  ferry_free(scaled);
  ferry_free(small);
  ferry_free(large);
  return st;
}

static void alias_free(struct alias *a) {
  ferry_free(a->prob);
  ferry_free(a->idx);
}

/* Fill p[0..n) with a permutation of 0..n-1 from its own seeded stream. */
static void shuffle(int32_t *p, int32_t n, uint64_t seed, uint64_t stream) {
  struct ferry_rng rng;
  ferry__rng_seed_stream(&rng, seed, stream);
  for (int32_t e = 0; e < n; e++) p[e] = e;
  for (int32_t e = n - 1; e > 0; e--) {
    int32_t j = (int32_t)ferry__rng_below(&rng, (uint64_t)e + 1);
    int32_t tmp = p[e];
    p[e] = p[j];
    p[j] = tmp;
  }
}

/* Value of a per-layer knob given at the first, middle and last layer. */
static double interpolate(const double v[3], int32_t l, int32_t n_layers) {
  double x = n_layers > 1 ? (double)l / (n_layers - 1) : 0;
  return x <= 0.5 ? v[0] + (v[1] - v[0]) * x * 2 : v[1] + (v[2] - v[1]) * (x - 0.5) * 2;
}

static int prob_ok(double p) { return p >= 0 && p <= 1; }

static ferry_status check_config(const struct ferry_routing_synth_config *c) {
  if (c->n_layers < 1 || c->n_layers > FERRY_ROUTING_MAX_LAYERS || c->n_experts < 1 ||
      c->n_experts > FERRY_ROUTING_MAX_EXPERTS || c->top_k < 1 || c->top_k > c->n_experts ||
      c->top_k > FERRY_ROUTING_MAX_TOPK)
    return ferry__fail(FERRY_ERR_INVALID, "synthetic routing: layers=%d experts=%d k=%d: need 1 <= k <= experts <= %d, "
                       "layers <= %d, k <= %d", c->n_layers, c->n_experts, c->top_k, FERRY_ROUTING_MAX_EXPERTS,
                       FERRY_ROUTING_MAX_LAYERS, FERRY_ROUTING_MAX_TOPK);
  if (!(c->zipf >= 0 && c->zipf <= 10) || !prob_ok(c->temporal) || !prob_ok(c->layer_corr))
    return ferry__fail(FERRY_ERR_INVALID, "synthetic routing: zipf=%g temporal=%g layer=%g: need zipf in [0, 10] "
                       "and probabilities in [0, 1]", c->zipf, c->temporal, c->layer_corr);
  for (int i = 0; i < 3; i++)
    if (!prob_ok(c->sticky_first[i]) || !prob_ok(c->sticky_any[i]) ||
        c->sticky_first[i] + c->sticky_any[i] + c->affinity > 1 + 1e-12)
      return ferry__fail(FERRY_ERR_INVALID, "synthetic routing: sticky=%g, sticky_any=%g and affinity=%g must be "
                         "probabilities whose sum is at most 1", c->sticky_first[i], c->sticky_any[i], c->affinity);
  if (!prob_ok(c->affinity) || !prob_ok(c->coact) || !prob_ok(c->domain_mix) || c->domains < 0 ||
      c->domains > 4096 || !(c->domain_zipf >= 0 && c->domain_zipf <= 10) || !(c->gate_temp >= 0 && c->gate_temp <= 100))
    return ferry__fail(FERRY_ERR_INVALID, "synthetic routing: affinity=%g coact=%g domain_mix=%g domains=%d "
                       "domain_zipf=%g gate_temp=%g: need probabilities in [0, 1], 0..4096 domains, skew in "
                       "[0, 10] and a temperature in [0, 100]", c->affinity, c->coact, c->domain_mix, c->domains,
                       c->domain_zipf, c->gate_temp);
  return FERRY_OK;
}

ferry_status ferry_routing_synth_create(ferry_routing_synth **out, const struct ferry_routing_synth_config *cfg) {
  if (!out || !cfg) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_synth_create: NULL argument");
  *out = NULL;
  ferry_status st = check_config(cfg);
  if (st != FERRY_OK) return st;
  const struct ferry_routing_synth_config *c = cfg;
  const size_t L = (size_t)c->n_layers, E = (size_t)c->n_experts;
  const int32_t D = c->domains > 1 ? c->domains : 0;
  ferry_routing_synth *s = ferry__calloc(1, sizeof *s);
  if (!s) return ferry__fail(FERRY_ERR_NOMEM, "synthetic routing: out of memory");
  s->cfg = *c;
  s->cfg.profile[FERRY_ROUTING_PROFILE_NAME_MAX - 1] = '\0';
  for (int i = 0; i < 3; i++) s->extended |= c->sticky_first[i] > 0 || c->sticky_any[i] > 0;
  s->extended |= c->affinity > 0 || c->coact > 0 || D > 0 || c->gate_temp > 0;
  s->perm = ferry__calloc(L * E, sizeof *s->perm);
  s->sticky_first = ferry__calloc(L, sizeof *s->sticky_first);
  s->sticky_any = ferry__calloc(L, sizeof *s->sticky_any);
  int ok = s->perm && s->sticky_first && s->sticky_any && build_alias(&s->global, c->n_experts, c->zipf) == FERRY_OK;
  if (ok && D) {
    s->dperm = ferry__calloc(L * (size_t)D * E, sizeof *s->dperm);
    ok = s->dperm && build_alias(&s->domain, c->n_experts, c->domain_zipf) == FERRY_OK;
  }
  if (ok && c->coact > 0) ok = (s->partner = ferry__calloc(L * E, sizeof *s->partner)) != NULL;
  if (ok && c->affinity > 0) ok = (s->amap = ferry__calloc(L * E, sizeof *s->amap)) != NULL;
  if (!ok) {
    ferry_routing_synth_free(s);
    return ferry__fail(FERRY_ERR_NOMEM, "synthetic routing: out of memory");
  }
  for (int i = 0; i < N_SALTS; i++) s->salt_mix[i] = mix64(c->seed ^ mix64(salts[i]));
  for (size_t l = 0; l < L; l++) {
    shuffle(s->perm + l * E, c->n_experts, c->seed, 0x7065726d00000000ULL + l);
    s->sticky_first[l] = interpolate(c->sticky_first, (int32_t)l, c->n_layers);
    s->sticky_any[l] = interpolate(c->sticky_any, (int32_t)l, c->n_layers);
    for (int32_t d = 0; d < D; d++)
      shuffle(s->dperm + (l * (size_t)D + (size_t)d) * E, c->n_experts, c->seed,
              0x646f6d0000000000ULL + l * (size_t)D + (size_t)d);
    if (s->amap) shuffle(s->amap + l * E, c->n_experts, c->seed, 0x616d617000000000ULL + l);
    if (s->partner) {
      /* a random perfect matching: consecutive entries of a shuffled order are partners */
      int32_t *order = s->partner + l * E; /* shuffled in place, then turned into the map */
      int32_t *tmp = ferry__calloc(E, sizeof *tmp);
      if (!tmp) {
        ferry_routing_synth_free(s);
        return ferry__fail(FERRY_ERR_NOMEM, "synthetic routing: out of memory");
      }
      shuffle(tmp, c->n_experts, c->seed, 0x7061697200000000ULL + l);
      for (size_t e = 0; e < E; e++) order[e] = (int32_t)e;
      for (size_t e = 0; e + 1 < E; e += 2) {
        order[tmp[e]] = tmp[e + 1];
        order[tmp[e + 1]] = tmp[e];
      }
      ferry_free(tmp);
    }
  }
  *out = s;
  return FERRY_OK;
}

void ferry_routing_synth_free(ferry_routing_synth *s) {
  if (!s) return;
  ferry_free(s->perm);
  alias_free(&s->global);
  ferry_free(s->dperm);
  alias_free(&s->domain);
  ferry_free(s->partner);
  ferry_free(s->amap);
  ferry_free(s->sticky_first);
  ferry_free(s->sticky_any);
  ferry_free(s);
}

int64_t ferry_routing_synth_mismatches(const ferry_routing_synth *s) { return s ? s->mismatches : 0; }

int32_t ferry_routing_synth_domain(const ferry_routing_synth *s, int64_t req_id) {
  if (!s || s->cfg.domains <= 1) return 0;
  return (int32_t)((key(s, SALT_DOMAIN, req_id, 0, 0) >> 33) % (uint64_t)s->cfg.domains);
}

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

/* Softmax of the k largest of many Gumbel(0, 1) logits over a temperature: those order
 * statistics are -log(S_i) (plus a constant) with S_i a running sum of unit exponentials,
 * so weight i is proportional to S_i^(-1/temp) and the weights come out sorted. */
static void gumbel_weights(uint64_t x, int32_t k, double temp, float *w) {
  double sum_s = 0, raw[FERRY_ROUTING_MAX_TOPK], total = 0;
  for (int32_t i = 0; i < k; i++) {
    double u = unit(mix64(x + 0x5851f42d4c957f2dULL * (uint64_t)(i + 1)));
    sum_s += -log(1.0 - u);
    raw[i] = pow(sum_s, -1.0 / temp);
    total += raw[i];
  }
  for (int32_t i = 0; i < k; i++) w[i] = (float)(raw[i] / total);
}

/* Whether expert e is among the first n ids. */
static int taken(const int32_t *ids, int32_t n, int32_t e) {
  for (int32_t j = 0; j < n; j++)
    if (ids[j] == e) return 1;
  return 0;
}

/* Whether the model draws from the global popularity only (no domains, no partners). */
static int plain_draws(const ferry_routing_synth *s) { return !s->dperm && !s->partner; }

/* draw_base() without a forced expert for a plain model (plain_draws()): the same hashes in
 * the same order, without the branches it does not need, because the simulator draws hundreds
 * of millions of these. */
static inline void draw_plain(const ferry_routing_synth *s, uint64_t base, int32_t l, int32_t *ids, float *w) {
  const struct ferry_routing_synth_config *c = &s->cfg;
  const int32_t *perm = s->perm + (size_t)l * (size_t)c->n_experts;
  const uint64_t n = (uint64_t)c->n_experts;
  const double *prob = s->global.prob;
  const int32_t *alias = s->global.idx;
  const int sure = s->global.sure;
  uint64_t draw = 0;
  for (int32_t i = 0; i < c->top_k; i++) {
    int32_t pick = -1;
    for (int attempt = 0; attempt < 64 && pick < 0; attempt++) {
      const uint64_t x = mix64(base + 0x9e3779b97f4a7c15ULL * ++draw);
      const int32_t idx = (int32_t)(((x >> 32) * n) >> 32);
      /* the coin is below 1: with every prob at 1 it always keeps idx */
      pick = perm[sure || (double)(uint32_t)x * (1.0 / 4294967296.0) < prob[idx] ? idx : alias[idx]];
      for (int32_t j = 0; j < i; j++)
        if (ids[j] == pick) pick = -1;
    }
    for (int32_t r = 0; pick < 0 && r < c->n_experts; r++)
      if (!taken(ids, i, perm[r])) pick = perm[r];
    ids[i] = pick;
  }
  if (w) {
    if (c->gate_temp > 0) gumbel_weights(base, c->top_k, c->gate_temp, w);
    else draw_weights(base, c->top_k, w);
  }
}

/* k distinct experts of layer l (without replacement) from the Zipf popularity of the layer,
 * or of the request's domain: alias-table draws, each from its own mix of the decision's hash
 * (independent, so they pipeline), redrawn on a repeat. `forced` (>= 0) goes at position
 * forced_pos unless an earlier position already holds it; a drawn expert brings its partner
 * along with probability coact. */
static void draw_base(const ferry_routing_synth *s, int64_t req, int32_t tok, int32_t l, int32_t forced_pos,
                      int32_t forced, int32_t *ids, float *w) {
  const struct ferry_routing_synth_config *c = &s->cfg;
  const uint64_t base = key(s, SALT_BASE, req, tok, l);
  if (forced_pos < 0 && plain_draws(s)) {
    draw_plain(s, base, l, ids, w);
    return;
  }
  const size_t E = (size_t)c->n_experts;
  const int32_t *perm = s->perm + (size_t)l * E;
  const int32_t *dperm = s->dperm ? s->dperm + ((size_t)l * (size_t)c->domains + (size_t)ferry_routing_synth_domain(s, req)) * E
                                  : NULL;
  const uint64_t n = (uint64_t)c->n_experts;
  uint64_t draw = 0;
  for (int32_t i = 0; i < c->top_k; i++) {
    if (i == forced_pos && forced >= 0 && !taken(ids, i, forced)) {
      ids[i] = forced;
    } else {
      int32_t pick = -1;
      for (int attempt = 0; attempt < 64 && pick < 0; attempt++) {
        uint64_t x = mix64(base + 0x9e3779b97f4a7c15ULL * ++draw);
        int32_t idx = (int32_t)(((x >> 32) * n) >> 32);
        double coin = (double)(uint32_t)x * (1.0 / 4294967296.0);
        const int use_domain = dperm && unit(mix64(x ^ 0xd1b54a32d192ed03ULL)) < c->domain_mix;
        const struct alias *a = use_domain ? &s->domain : &s->global;
        int32_t rank = coin < a->prob[idx] ? idx : a->idx[idx];
        pick = (use_domain ? dperm : perm)[rank];
        if (taken(ids, i, pick)) pick = -1;
      }
      for (int32_t r = 0; r < c->n_experts && pick < 0; r++) /* heavily skewed and unlucky: */
        if (!taken(ids, i, perm[r])) pick = perm[r];           /* the most popular not yet taken */
      ids[i] = pick;
    }
    if (s->partner && i + 1 < c->top_k && i + 1 != forced_pos &&
        unit(mix64(base ^ (0xa0761d6478bd642fULL * (uint64_t)(i + 1)))) < c->coact) {
      int32_t p = s->partner[(size_t)l * E + (size_t)ids[i]];
      if (!taken(ids, i + 1, p)) ids[++i] = p;
    }
  }
  if (!w) return;
  if (c->gate_temp > 0) gumbel_weights(base, c->top_k, c->gate_temp, w);
  else draw_weights(base, c->top_k, w);
}

static void uniform_choice(const ferry_routing_synth *s, int64_t req, int32_t tok, int32_t layer, int32_t k,
                           int32_t n_experts, int32_t *ids, float *w) {
  const uint64_t base = key(s, SALT_MISMATCH, req, tok, layer);
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

/* How (t, l) gets its choice. The whole-set copies are checked first, each with its own hash,
 * so a model without profile knobs draws exactly as before they existed. */
static enum mode mode_of(const ferry_routing_synth *s, int64_t req, int32_t t, int32_t l) {
  const struct ferry_routing_synth_config *c = &s->cfg;
  if (l > 0 && c->layer_corr > 0 && unit(key(s, SALT_LAYER, req, t, l)) < c->layer_corr) return COPY_LAYER;
  if (t > 0 && c->temporal > 0 && unit(key(s, SALT_TEMPORAL, req, t, l)) < c->temporal) return COPY_TOKEN;
  if (!s->extended) return FRESH;
  const double u = unit(key(s, SALT_MODE, req, t, l));
  double acc = 0;
  if (t > 0 && u < (acc += s->sticky_first[l])) return STICKY_FIRST;
  if (t > 0 && u < (acc += s->sticky_any[l])) return STICKY_ANY;
  if (l > 0 && u < (acc += c->affinity)) return AFFINITY;
  return FRESH;
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
  /* Walk the chain of predecessors (each (token, layer) has at most one: the previous token or
   * the previous layer) back to the one that made a fresh draw (at most MAX_WALK steps, then a
   * fresh draw), then replay it forwards: a copy keeps the choice, the sticky and affinity
   * modes force one expert into a fresh draw. Each whole-set knob is exact when the others are
   * 0; together, layer repetition (checked first) thins the token re-use seen deeper. */
  int32_t ts[MAX_WALK + 1], ls[MAX_WALK + 1];
  enum mode modes[MAX_WALK + 1];
  int n = 0;
  ts[0] = token_index;
  ls[0] = layer;
  for (;; n++) {
    modes[n] = n < MAX_WALK ? mode_of(s, req_id, ts[n], ls[n]) : FRESH;
    if (modes[n] == FRESH) break;
    const int by_layer = modes[n] == COPY_LAYER || modes[n] == AFFINITY;
    ts[n + 1] = ts[n] - !by_layer;
    ls[n + 1] = ls[n] - by_layer;
  }
  /* the ids never depend on the weights: a caller that reads none (the simulator without a
   * predictor) does not pay for drawing them */
  float *w = weights;
  draw_base(s, req_id, ts[n], ls[n], -1, -1, ids, w);
  for (int i = n - 1; i >= 0; i--) {
    const uint64_t h = key(s, SALT_MODE, req_id, ts[i], ls[i]);
    switch (modes[i]) {
      case STICKY_FIRST: draw_base(s, req_id, ts[i], ls[i], 0, ids[0], ids, w); break;
      case STICKY_ANY: {
        int32_t keep = ids[(h >> 40) % (uint64_t)top_k];
        draw_base(s, req_id, ts[i], ls[i], top_k > 1 ? 1 : 0, keep, ids, w);
        break;
      }
      case AFFINITY:
        draw_base(s, req_id, ts[i], ls[i], 0, s->amap[(size_t)ls[i] * (size_t)n_experts + (size_t)ids[0]], ids, w);
        break;
      default: break; /* whole-set copies keep ids and weights */
    }
  }
}

/* Fresh draws of many tokens in passes the processor can overlap (the hashes of one token
 * depend on each other; those of different tokens do not): every token's hash, then its first
 * k draws; a token whose first k draws are not k distinct experts is drawn again the sequential
 * way, which would have made the same first draws, so the answers are draw_plain()'s. */
#define MANY_CHUNK 64

/* Top-2 over at most 8 experts (Mixtral's routing, the common case) eight tokens at a time with
 * AVX-512 where the processor has it: 64-bit multiplies for the hashes, and the alias tables
 * and the layer's ranking held in registers. Integer hashes and the same exact comparison (a
 * 32-bit integer times 2^-32 against the table's double) give the same draws as PICK; a
 * uniform popularity's probabilities are all >= 1, above every coin, so `sure` needs no case.
 * Fills base[] and the two distinct draws of tokens [0, t) and returns t, a multiple of 8. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MANY_AVX512 1
#define AVX512 __attribute__((target("avx512f,avx512dq")))
AVX512 static inline __m512i mix64_x8(__m512i z) {
  z = _mm512_add_epi64(z, _mm512_set1_epi64((long long)0x9e3779b97f4a7c15ULL));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ULL));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), _mm512_set1_epi64((long long)0x94d049bb133111ebULL));
  return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

/* PICK of eight hashes x (already offset by the draw's number) from in-register tables. */
AVX512 static inline __m512i pick_x8(__m512i x, __m512i e, __m512d prob, __m512i alias, __m512i perm) {
  x = mix64_x8(x);
  const __m512i idx = _mm512_srli_epi64(_mm512_mul_epu32(_mm512_srli_epi64(x, 32), e), 32);
  const __m512d coin = _mm512_mul_pd(_mm512_cvtepu64_pd(_mm512_and_si512(x, _mm512_set1_epi64(0xffffffffLL))),
                                     _mm512_set1_pd(1.0 / 4294967296.0));
  const __mmask8 keep = _mm512_cmp_pd_mask(coin, _mm512_permutexvar_pd(idx, prob), _CMP_LT_OQ);
  return _mm512_permutexvar_epi64(_mm512_mask_blend_epi64(keep, _mm512_permutexvar_epi64(idx, alias), idx), perm);
}

AVX512 static int64_t top2_small_avx512(uint64_t lmix, int64_t m, const int64_t *req_ids, const int32_t *token_index,
                                        int32_t E, const int32_t *perm, const double *prob, const int32_t *alias,
                                        uint64_t *base, int32_t *id) {
  const __mmask16 em = (__mmask16)((1u << E) - 1);
  const __m512d probv = _mm512_maskz_loadu_pd((__mmask8)em, prob);
  const __m512i aliasv = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(_mm512_maskz_loadu_epi32(em, alias)));
  const __m512i permv = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(_mm512_maskz_loadu_epi32(em, perm)));
  const __m512i e = _mm512_set1_epi64(E), lm = _mm512_set1_epi64((long long)lmix),
                c1 = _mm512_set1_epi64((long long)0x9e3779b97f4a7c15ULL), c2 = _mm512_set1_epi64((long long)0xc2b2ae3d27d4eb4fULL),
                d2 = _mm512_set1_epi64((long long)(2 * 0x9e3779b97f4a7c15ULL));
  const __m512i inter = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  int64_t t = 0;
  for (; t + 8 <= m; t += 8) {
    const __m512i r = _mm512_loadu_si512((const void *)(req_ids + t));
    const __m512i k = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(const void *)(token_index + t)));
    const __m512i b = mix64_x8(_mm512_xor_si512(_mm512_xor_si512(lm, _mm512_mullo_epi64(r, c1)), _mm512_mullo_epi64(k, c2)));
    _mm512_storeu_si512((void *)(base + t), b);
    const __m512i first = pick_x8(_mm512_add_epi64(b, c1), e, probv, aliasv, permv);
    __m512i second = pick_x8(_mm512_add_epi64(b, d2), e, probv, aliasv, permv);
    /* a second draw that repeats the first draws on, as draw_plain() does: its third, fourth, ...
     * draw (every lane draws; those settled keep theirs), the most popular other expert after 64 */
    __mmask8 again = _mm512_cmpeq_epi64_mask(first, second);
    for (uint64_t d = 3; again && d <= 65; d++) {
      const __m512i next =
          pick_x8(_mm512_add_epi64(b, _mm512_set1_epi64((long long)(0x9e3779b97f4a7c15ULL * d))), e, probv, aliasv, permv);
      const __mmask8 ok = _mm512_mask_cmpneq_epi64_mask(again, next, first);
      second = _mm512_mask_blend_epi64(ok, second, next);
      again &= (__mmask8)~ok;
    }
    if (again) {
      const __m512i p0 = _mm512_set1_epi64(perm[0]), p1 = _mm512_set1_epi64(perm[1]);
      second = _mm512_mask_blend_epi64(again, second, _mm512_mask_blend_epi64(_mm512_cmpneq_epi64_mask(p0, first), p1, p0));
    }
    const __m256i x0 = _mm512_cvtepi64_epi32(first), x1 = _mm512_cvtepi64_epi32(second);
    _mm512_storeu_si512((void *)(id + 2 * t),
                        _mm512_permutex2var_epi32(_mm512_castsi256_si512(x0), inter, _mm512_castsi256_si512(x1)));
  }
  return t;
}
#undef AVX512

/* loads and bit tests of what the compiler's runtime read at start: no cache of our own, which
 * threads drawing routing together would write at once */
static int have_avx512(void) { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"); }
#endif /* MANY_AVX512 */

static void draw_many_fresh(const ferry_routing_synth *s, int64_t n, const int64_t *req_ids, const int32_t *token_index,
                            int32_t layer, int32_t *ids, float *weights) {
  const struct ferry_routing_synth_config *c = &s->cfg;
  const int32_t k = c->top_k;
  const uint64_t E = (uint64_t)c->n_experts;
  const int32_t *perm = s->perm + (size_t)layer * (size_t)c->n_experts;
  const double *prob = s->global.prob;
  const int32_t *alias = s->global.idx;
  const int sure = s->global.sure;
  /* key() with the layer's part folded in once (the parts are xored) */
  const uint64_t lmix = s->salt_mix[SALT_BASE] ^ ((uint64_t)(uint32_t)layer * 0x165667b19e3779f9ULL);
#define PICK(x) perm[sure || (double)(uint32_t)(x) * (1.0 / 4294967296.0) < prob[(((x) >> 32) * E) >> 32] \
                      ? (int32_t)((((x) >> 32) * E) >> 32)                                         \
                      : alias[(((x) >> 32) * E) >> 32]]
  uint64_t base[MANY_CHUNK];
  for (int64_t i0 = 0; i0 < n; i0 += MANY_CHUNK) {
    const int64_t m = n - i0 < MANY_CHUNK ? n - i0 : MANY_CHUNK;
    int32_t *id = ids + i0 * k;
    int64_t done = 0; /* tokens hashed and drawn already */
#ifdef MANY_AVX512
    if (k == 2 && E <= 8 && have_avx512())
      done = top2_small_avx512(lmix, m, req_ids + i0, token_index + i0, (int32_t)E, perm, prob, alias, base, id);
#endif
    for (int64_t t = done; t < m; t++)
      base[t] = mix64(lmix ^ ((uint64_t)req_ids[i0 + t] * 0x9e3779b97f4a7c15ULL) ^
                      ((uint64_t)(uint32_t)token_index[i0 + t] * 0xc2b2ae3d27d4eb4fULL));
    if (k == 2) { /* the common top-2: both draws, then the rare repeat drawn on */
      for (int64_t t = done; t < m; t++) {
        const uint64_t x0 = mix64(base[t] + 0x9e3779b97f4a7c15ULL), x1 = mix64(base[t] + 2 * 0x9e3779b97f4a7c15ULL);
        id[2 * t] = PICK(x0);
        id[2 * t + 1] = PICK(x1);
      }
      for (int64_t t = done; t < m; t++) {
        if (id[2 * t + 1] != id[2 * t]) continue;
        /* the second draw repeated the first: go on drawing as draw_plain() does (its third,
         * fourth, ... draw; the most popular other expert after 64 attempts) */
        int32_t pick = -1;
        for (uint64_t d = 3; d <= 65 && pick < 0; d++) {
          const uint64_t x = mix64(base[t] + 0x9e3779b97f4a7c15ULL * d);
          pick = PICK(x);
          if (pick == id[2 * t]) pick = -1;
        }
        for (int32_t r = 0; pick < 0 && r < c->n_experts; r++)
          if (perm[r] != id[2 * t]) pick = perm[r];
        id[2 * t + 1] = pick;
      }
    } else {
      for (int64_t t = 0; t < m; t++)
        for (int32_t j = 0; j < k; j++) {
          const uint64_t x = mix64(base[t] + 0x9e3779b97f4a7c15ULL * (uint64_t)(j + 1));
          id[t * k + j] = PICK(x);
        }
      for (int64_t t = 0; t < m; t++) {
        int distinct = 1;
        for (int32_t j = 1; j < k && distinct; j++)
          for (int32_t i = 0; i < j; i++) distinct &= id[t * k + j] != id[t * k + i];
        if (!distinct) draw_plain(s, base[t], layer, id + t * k, NULL);
      }
    }
    if (weights)
      for (int64_t t = 0; t < m; t++) {
        float *w = weights + (i0 + t) * k;
        if (c->gate_temp > 0) gumbel_weights(base[t], k, c->gate_temp, w);
        else draw_weights(base[t], k, w);
      }
  }
#undef PICK
}

void ferry_routing_synth_many(void *user, int64_t n, const int64_t *req_ids, const int32_t *token_index, int32_t layer,
                              int32_t top_k, int32_t n_experts, int32_t *ids, float *weights) {
  ferry_routing_synth *s = user;
  const struct ferry_routing_synth_config *c = &s->cfg;
  /* every token draws fresh when no knob copies or forces a choice */
  int fresh = !s->extended && !(layer > 0 && c->layer_corr > 0) && c->temporal <= 0 && plain_draws(s) &&
              top_k == c->top_k && n_experts == c->n_experts && layer >= 0 && layer < c->n_layers;
  for (int64_t i = 0; i < n && fresh; i++) fresh = token_index[i] >= 0;
  if (fresh) {
    draw_many_fresh(s, n, req_ids, token_index, layer, ids, weights);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    ferry_routing_synth_fn(user, req_ids[i], token_index[i], layer, top_k, n_experts, ids + i * top_k,
                           weights ? weights + i * top_k : NULL);
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

/* A per-layer knob set to one value at every layer. */
static ferry_status parse_curve(const char *key, const char *v, double out[3]) {
  double x = 0;
  ferry_status st = parse_prob(key, v, 0, 1, &x);
  if (st == FERRY_OK) out[0] = out[1] = out[2] = x;
  return st;
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
    if (!strcmp(k, "profile")) st = ferry_routing_profile_apply(v, cfg);
    else if (!strcmp(k, "layers")) st = parse_i32(k, v, 1, FERRY_ROUTING_MAX_LAYERS, &cfg->n_layers);
    else if (!strcmp(k, "experts")) st = parse_i32(k, v, 1, FERRY_ROUTING_MAX_EXPERTS, &cfg->n_experts);
    else if (!strcmp(k, "k")) st = parse_i32(k, v, 1, FERRY_ROUTING_MAX_TOPK, &cfg->top_k);
    else if (!strcmp(k, "zipf")) st = parse_prob(k, v, 0, 10, &cfg->zipf);
    else if (!strcmp(k, "temporal")) st = parse_prob(k, v, 0, 1, &cfg->temporal);
    else if (!strcmp(k, "layer")) st = parse_prob(k, v, 0, 1, &cfg->layer_corr);
    else if (!strcmp(k, "sticky")) st = parse_curve(k, v, cfg->sticky_first);
    else if (!strcmp(k, "sticky_any")) st = parse_curve(k, v, cfg->sticky_any);
    else if (!strcmp(k, "affinity")) st = parse_prob(k, v, 0, 1, &cfg->affinity);
    else if (!strcmp(k, "coact")) st = parse_prob(k, v, 0, 1, &cfg->coact);
    else if (!strcmp(k, "domains")) st = parse_i32(k, v, 0, 4096, &cfg->domains);
    else if (!strcmp(k, "domain_mix")) st = parse_prob(k, v, 0, 1, &cfg->domain_mix);
    else if (!strcmp(k, "domain_zipf")) st = parse_prob(k, v, 0, 10, &cfg->domain_zipf);
    else if (!strcmp(k, "gate_temp")) st = parse_prob(k, v, 0, 100, &cfg->gate_temp);
    else if (!strcmp(k, "seed")) {
      int64_t x;
      if (ferry__parse_i64(v, &x) != FERRY_OK || x < 0)
        st = ferry__fail(FERRY_ERR_INVALID, "routing spec: seed=%s is not a non-negative integer", v);
      else cfg->seed = (uint64_t)x;
    } else {
      st = ferry__fail(FERRY_ERR_INVALID,
                       "routing spec: unknown key '%s' (expected profile, layers, experts, k, zipf, temporal, layer, "
                       "sticky, sticky_any, affinity, coact, domains, domain_mix, domain_zipf, gate_temp, seed)", k);
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

