/* The per-layer routing statistics that published routing analyses report, so a synthetic
 * profile can be compared with them: load balance, consecutive-token repetition of the first
 * and of any choice (Mixtral paper, Table 5) with its baselines, how well layer l's first choice
 * predicts layer l+1's, expert co-activation and request specialisation (OLMoE paper, eqs. 6
 * and 7), and the spread of the gate weights. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "traces/routing_stats_impl.h"

#define GATE_BINS 1000
#define CROSS_MAX_EXPERTS 1024 /* E x E count tables above this would be too large */
#define SPEC_MIN_TOKENS 32

static const int32_t *row(const struct ferry__routing_req *q, int32_t t, int32_t l, int32_t L, int32_t K) {
  const int32_t *s = q->ids + ((size_t)t * (size_t)L + (size_t)l) * (size_t)K;
  return s[0] >= 0 ? s : NULL;
}

static const float *row_w(const struct ferry__routing_req *q, int32_t t, int32_t l, int32_t L, int32_t K) {
  return q->weights + ((size_t)t * (size_t)L + (size_t)l) * (size_t)K;
}

/* The first choice: the expert with the largest gate weight (rows need not be ordered). */
static int32_t first_of(const struct ferry__routing_req *q, int32_t t, int32_t l, int32_t L, int32_t K) {
  const int32_t *s = row(q, t, l, L, K);
  const float *w = row_w(q, t, l, L, K);
  int32_t best = 0;
  for (int32_t j = 1; j < K; j++)
    if (w[j] > w[best]) best = j;
  return s[best];
}

static int shares_any(const int32_t *a, const int32_t *b, int32_t k) {
  for (int32_t i = 0; i < k; i++)
    for (int32_t j = 0; j < k; j++)
      if (a[i] == b[j]) return 1;
  return 0;
}

double ferry__routing_any_repeat_uniform(int32_t E, int32_t K) {
  if (2 * K > E) return 1.0;
  double none = 1.0; /* C(E-K, K) / C(E, K) */
  for (int32_t i = 0; i < K; i++) none *= (double)(E - K - i) / (double)(E - i);
  return 1.0 - none;
}

ferry_status ferry__routing_scratch_init(struct ferry__routing_scratch *sc, const ferry_routing *r) {
  memset(sc, 0, sizeof *sc);
  size_t E = (size_t)r->n_experts;
  sc->first = ferry__calloc(E, sizeof *sc->first);
  sc->req_counts = ferry__calloc(E, sizeof *sc->req_counts);
  sc->next_first = ferry__calloc(E, sizeof *sc->next_first);
  sc->next_set = ferry__calloc(E, sizeof *sc->next_set);
  sc->gate_hist = ferry__calloc(GATE_BINS + 1, sizeof *sc->gate_hist);
  sc->order = ferry__calloc(E, sizeof *sc->order);
  if (E <= CROSS_MAX_EXPERTS) {
    sc->pair = ferry__calloc(E * E, sizeof *sc->pair);
    sc->cond_first = ferry__calloc(E * E, sizeof *sc->cond_first);
  }
  if (!sc->first || !sc->req_counts || !sc->next_first || !sc->next_set || !sc->gate_hist || !sc->order ||
      (E <= CROSS_MAX_EXPERTS && (!sc->pair || !sc->cond_first))) {
    ferry__routing_scratch_free(sc);
    return ferry__fail(FERRY_ERR_NOMEM, "routing statistics: out of memory");
  }
  return FERRY_OK;
}

void ferry__routing_scratch_free(struct ferry__routing_scratch *sc) {
  ferry_free(sc->first);
  ferry_free(sc->req_counts);
  ferry_free(sc->next_first);
  ferry_free(sc->next_set);
  ferry_free(sc->gate_hist);
  ferry_free(sc->order);
  ferry_free(sc->pair);
  ferry_free(sc->cond_first);
  memset(sc, 0, sizeof *sc);
}

/* Sum of the k largest of n counts (n small: selection by repeated maximum over a copy). */
static int64_t top_k_sum(const int64_t *c, int32_t n, int32_t k, int64_t *tmp) {
  memcpy(tmp, c, (size_t)n * sizeof *tmp);
  int64_t sum = 0;
  for (int32_t j = 0; j < k && j < n; j++) {
    int32_t best = 0;
    for (int32_t e = 1; e < n; e++)
      if (tmp[e] > tmp[best]) best = e;
    sum += tmp[best];
    tmp[best] = -1;
  }
  return sum;
}

static double percentile(const int64_t *hist, int64_t n, double p) {
  if (!n) return NAN;
  int64_t want = (int64_t)ceil(p * (double)n), seen = 0;
  if (want < 1) want = 1;
  for (int b = 0; b <= GATE_BINS; b++) {
    seen += hist[b];
    if (seen >= want) return (double)b / GATE_BINS;
  }
  return 1.0;
}

static void balance(const int64_t *counts, int32_t E, struct ferry_routing_layer_stats *ls) {
  if (!ls->uses) {
    ls->busiest_share = ls->load_cv = NAN;
    return;
  }
  int64_t mx = 0;
  double mean = (double)ls->uses / E, var = 0;
  for (int32_t e = 0; e < E; e++) {
    if (counts[e] > mx) mx = counts[e];
    var += ((double)counts[e] - mean) * ((double)counts[e] - mean);
  }
  ls->busiest_share = (double)mx / (double)ls->uses;
  ls->load_cv = sqrt(var / E) / mean;
}

/* Consecutive tokens, and unrelated pairs for the baseline of any_repeat. */
static void repetition(const ferry_routing *r, int32_t l, struct ferry__routing_scratch *sc,
                       struct ferry_routing_layer_stats *ls) {
  const int32_t L = r->n_layers, E = r->n_experts, K = r->top_k;
  int64_t pairs = 0, same_first = 0, same_any = 0, n_first = 0, un_pairs = 0, un_any = 0;
  memset(sc->first, 0, (size_t)E * sizeof *sc->first);
  for (size_t i = 0; i < r->n_reqs; i++) {
    const struct ferry__routing_req *q = &r->reqs[i];
    const struct ferry__routing_req *o = r->n_reqs > 1 ? &r->reqs[(i + 1) % r->n_reqs] : q;
    const int32_t shift = r->n_reqs > 1 ? 0 : q->n_tokens / 2;
    for (int32_t t = 0; t < q->n_tokens; t++) {
      const int32_t *s = row(q, t, l, L, K);
      if (!s) continue;
      sc->first[first_of(q, t, l, L, K)]++;
      n_first++;
      const int32_t *p = t > 0 ? row(q, t - 1, l, L, K) : NULL;
      if (p) {
        pairs++;
        same_first += first_of(q, t, l, L, K) == first_of(q, t - 1, l, L, K);
        same_any += shares_any(s, p, K);
      }
      const int32_t *u = NULL;
      if (o != q && t < o->n_tokens) u = row(o, t, l, L, K);
      else if (o == q && shift > 0 && t + shift < q->n_tokens) u = row(q, t + shift, l, L, K);
      if (u) {
        un_pairs++;
        un_any += shares_any(s, u, K);
      }
    }
  }
  ls->token_pairs = pairs;
  ls->first_repeat = pairs ? (double)same_first / (double)pairs : NAN;
  ls->any_repeat = pairs ? (double)same_any / (double)pairs : NAN;
  double sq = 0;
  for (int32_t e = 0; e < E; e++) sq += ((double)sc->first[e] / (double)(n_first ? n_first : 1)) *
                                        ((double)sc->first[e] / (double)(n_first ? n_first : 1));
  ls->first_repeat_indep = n_first ? sq : NAN;
  ls->any_repeat_indep = un_pairs ? (double)un_any / (double)un_pairs : NAN;
}

/* Layer l's first choice against layer l+1's first choice and set, same token. */
static void cross_layer(const ferry_routing *r, int32_t l, struct ferry__routing_scratch *sc,
                        struct ferry_routing_layer_stats *ls) {
  const int32_t L = r->n_layers, E = r->n_experts, K = r->top_k;
  ls->next_first_acc = ls->next_first_base = ls->next_set_recall = ls->next_set_base = NAN;
  if (l + 1 >= L || !sc->cond_first) return;
  const size_t EE = (size_t)E * (size_t)E;
  memset(sc->cond_first, 0, EE * sizeof *sc->cond_first); /* [a][b]: first b at l+1 after first a at l */
  memset(sc->pair, 0, EE * sizeof *sc->pair);             /* [a][e]: e in the set at l+1 after first a */
  memset(sc->next_first, 0, (size_t)E * sizeof *sc->next_first);
  memset(sc->next_set, 0, (size_t)E * sizeof *sc->next_set);
  int64_t n = 0;
  for (size_t i = 0; i < r->n_reqs; i++) {
    const struct ferry__routing_req *q = &r->reqs[i];
    for (int32_t t = 0; t < q->n_tokens; t++) {
      const int32_t *nx = row(q, t, l + 1, L, K);
      if (!row(q, t, l, L, K) || !nx) continue;
      const int32_t a = first_of(q, t, l, L, K), b = first_of(q, t, l + 1, L, K);
      sc->cond_first[(size_t)a * (size_t)E + (size_t)b]++;
      sc->next_first[b]++;
      for (int32_t j = 0; j < K; j++) {
        sc->pair[(size_t)a * (size_t)E + (size_t)nx[j]]++;
        sc->next_set[nx[j]]++;
      }
      n++;
    }
  }
  if (!n) return;
  int64_t acc = 0, rec = 0, base = 0;
  for (int32_t a = 0; a < E; a++) {
    const int64_t *c = sc->cond_first + (size_t)a * (size_t)E;
    int64_t mx = 0;
    for (int32_t b = 0; b < E; b++) mx = c[b] > mx ? c[b] : mx;
    acc += mx;
    rec += top_k_sum(sc->pair + (size_t)a * (size_t)E, E, K, sc->order);
  }
  for (int32_t b = 0; b < E; b++) base = sc->next_first[b] > base ? sc->next_first[b] : base;
  ls->next_first_acc = (double)acc / (double)n;
  ls->next_first_base = (double)base / (double)n;
  ls->next_set_recall = (double)rec / ((double)n * K);
  ls->next_set_base = (double)top_k_sum(sc->next_set, E, K, sc->order) / ((double)n * K);
}

/* Co-activation within the layer and specialisation of requests. */
static void coactivation(const ferry_routing *r, int32_t l, const int64_t *counts, struct ferry__routing_scratch *sc,
                         struct ferry_routing_layer_stats *ls) {
  const int32_t L = r->n_layers, E = r->n_experts, K = r->top_k;
  ls->coact_max = ls->request_spec_max = NAN;
  if (sc->pair && K > 1 && ls->uses) {
    memset(sc->pair, 0, (size_t)E * (size_t)E * sizeof *sc->pair);
    for (size_t i = 0; i < r->n_reqs; i++) {
      const struct ferry__routing_req *q = &r->reqs[i];
      for (int32_t t = 0; t < q->n_tokens; t++) {
        const int32_t *s = row(q, t, l, L, K);
        if (!s) continue;
        for (int32_t a = 0; a < K; a++)
          for (int32_t b = 0; b < K; b++)
            if (a != b) sc->pair[(size_t)s[a] * (size_t)E + (size_t)s[b]]++;
      }
    }
    const double min_uses = (double)ls->uses / (4.0 * E);
    double mx = 0;
    for (int32_t a = 0; a < E; a++) {
      if ((double)counts[a] < min_uses || !counts[a]) continue;
      for (int32_t b = 0; b < E; b++) {
        double c = (double)sc->pair[(size_t)a * (size_t)E + (size_t)b] / (double)counts[a];
        mx = c > mx ? c : mx;
      }
    }
    ls->coact_max = mx;
  }
  double spec = -1;
  for (size_t i = 0; i < r->n_reqs; i++) {
    const struct ferry__routing_req *q = &r->reqs[i];
    memset(sc->req_counts, 0, (size_t)E * sizeof *sc->req_counts);
    int64_t n = 0;
    for (int32_t t = 0; t < q->n_tokens; t++) {
      const int32_t *s = row(q, t, l, L, K);
      if (!s) continue;
      for (int32_t j = 0; j < K; j++) sc->req_counts[s[j]]++;
      n++;
    }
    if (n < SPEC_MIN_TOKENS) continue;
    for (int32_t e = 0; e < E; e++) {
      double v = (double)sc->req_counts[e] / (double)n;
      spec = v > spec ? v : spec;
    }
  }
  if (spec >= 0) ls->request_spec_max = spec;
}

static void gates(const ferry_routing *r, int32_t l, struct ferry__routing_scratch *sc,
                  struct ferry_routing_layer_stats *ls) {
  const int32_t L = r->n_layers, K = r->top_k;
  memset(sc->gate_hist, 0, (GATE_BINS + 1) * sizeof *sc->gate_hist);
  double top = 0, last = 0;
  int64_t n = 0;
  for (size_t i = 0; i < r->n_reqs; i++) {
    const struct ferry__routing_req *q = &r->reqs[i];
    for (int32_t t = 0; t < q->n_tokens; t++) {
      if (!row(q, t, l, L, K)) continue;
      const float *w = row_w(q, t, l, L, K);
      double sum = 0, mx = w[0], mn = w[0];
      for (int32_t j = 0; j < K; j++) {
        sum += w[j];
        mx = w[j] > mx ? w[j] : mx;
        mn = w[j] < mn ? w[j] : mn;
      }
      if (!(sum > 0)) continue;
      double share = mx / sum;
      top += share;
      last += mn / sum;
      int b = (int)(share * GATE_BINS + 0.5);
      sc->gate_hist[b < 0 ? 0 : b > GATE_BINS ? GATE_BINS : b]++;
      n++;
    }
  }
  ls->gate_top1_mean = n ? top / (double)n : NAN;
  ls->gate_last_mean = n ? last / (double)n : NAN;
  ls->gate_top1_p10 = percentile(sc->gate_hist, n, 0.10);
  ls->gate_top1_p50 = percentile(sc->gate_hist, n, 0.50);
  ls->gate_top1_p90 = percentile(sc->gate_hist, n, 0.90);
}

void ferry__routing_layer_measures(const ferry_routing *r, int32_t l, const int64_t *counts,
                                   struct ferry__routing_scratch *sc, struct ferry_routing_layer_stats *ls) {
  balance(counts, r->n_experts, ls);
  repetition(r, l, sc, ls);
  cross_layer(r, l, sc, ls);
  coactivation(r, l, counts, sc, ls);
  gates(r, l, sc, ls);
}
