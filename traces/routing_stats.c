/* Statistics of a routing trace, the figures `ferry trace routing` prints and the synthetic
 * model's tests check: expert popularity per layer (top experts, share of the top quarter,
 * normalised entropy), reuse distance, and agreement between adjacent layers and tokens; the
 * per-layer measures of published routing analyses come from routing_stats_layer.c. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "traces/routing_stats_impl.h"

int64_t ferry_routing_reuse_bucket_lo(int b) {
  if (b <= 0) return 1;
  if (b == 1) return 2;
  return ((int64_t)1 << (b - 1)) + 1;
}

static int bucket_of(int64_t d) {
  int b = 0;
  while (b + 1 < FERRY_ROUTING_REUSE_BUCKETS && d >= ferry_routing_reuse_bucket_lo(b + 1)) b++;
  return b;
}

/* Number of ids shared by two sets of k. */
static int32_t overlap(const int32_t *a, const int32_t *b, int32_t k) {
  int32_t n = 0;
  for (int32_t i = 0; i < k; i++)
    for (int32_t j = 0; j < k; j++) n += a[i] == b[j];
  return n;
}

struct by_count {
  int64_t count;
  int32_t id;
};

/* Most used first, ties by lower id. */
static int cmp_expert(const void *a, const void *b) {
  const struct by_count *x = a, *y = b;
  if (x->count != y->count) return x->count > y->count ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Mean of one field over the layers where it is a number (NAN when none). */
static double layer_mean(const struct ferry_routing_stats *s, size_t offset) {
  double sum = 0;
  int n = 0;
  for (int32_t l = 0; l < s->n_layers; l++) {
    double v = *(const double *)((const char *)&s->layers[l] + offset);
    if (isnan(v)) continue;
    sum += v;
    n++;
  }
  return n ? sum / n : NAN;
}

static void overall_means(struct ferry_routing_stats *s, int32_t E, int32_t K) {
#define MEAN(f) s->f = layer_mean(s, offsetof(struct ferry_routing_layer_stats, f))
  MEAN(busiest_share);
  MEAN(load_cv);
  MEAN(first_repeat);
  MEAN(any_repeat);
  MEAN(next_first_acc);
  MEAN(next_first_base);
  MEAN(next_set_recall);
  MEAN(next_set_base);
  MEAN(coact_max);
  MEAN(gate_top1_mean);
  MEAN(gate_last_mean);
#undef MEAN
  s->first_repeat_uniform = 1.0 / E;
  s->any_repeat_uniform = ferry__routing_any_repeat_uniform(E, K);
}

void ferry_routing_stats_free(struct ferry_routing_stats *s) {
  if (!s) return;
  ferry_free(s->layers);
  s->layers = NULL;
}

ferry_status ferry_routing_stats_compute(const ferry_routing *r, struct ferry_routing_stats *out) {
  if (!r || !out) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_stats_compute: NULL argument");
  memset(out, 0, sizeof *out);
  int32_t L = r->n_layers, E = r->n_experts, K = r->top_k;
  int32_t max_tokens = 1;
  for (size_t i = 0; i < r->n_reqs; i++)
    if (r->reqs[i].n_tokens > max_tokens) max_tokens = r->reqs[i].n_tokens;
  ferry_status st = FERRY_ERR_NOMEM;
  int64_t *counts = ferry__calloc((size_t)L * (size_t)E, sizeof *counts);
  int64_t *pair_n = ferry__calloc((size_t)L * 3, sizeof *pair_n); /* per layer: pairs, overlap sum, same */
  int64_t *prev_n = ferry__calloc((size_t)L * 2, sizeof *prev_n); /* per layer: pairs, same */
  int32_t *last = ferry__calloc((size_t)L * (size_t)E, sizeof *last);
  int64_t *dist = ferry__calloc((size_t)max_tokens + 1, sizeof *dist);
  struct by_count *order = ferry__calloc((size_t)E, sizeof *order);
  struct ferry__routing_scratch sc = {0};
  out->layers = ferry__calloc((size_t)L, sizeof *out->layers);
  if (!counts || !pair_n || !prev_n || !last || !dist || !order || !out->layers) {
    ferry__fail(FERRY_ERR_NOMEM, "routing statistics: out of memory");
    goto out_free;
  }
  if ((st = ferry__routing_scratch_init(&sc, r)) != FERRY_OK) goto out_free;
  st = FERRY_ERR_NOMEM;
  out->n_layers = L;
  for (size_t i = 0; i < r->n_reqs; i++) {
    const struct ferry__routing_req *q = &r->reqs[i];
    for (size_t j = 0; j < (size_t)L * (size_t)E; j++) last[j] = -1;
    for (int32_t t = 0; t < q->n_tokens; t++) {
      for (int32_t l = 0; l < L; l++) {
        const int32_t *s = q->ids + ((size_t)t * (size_t)L + (size_t)l) * (size_t)K;
        if (s[0] < 0) continue;
        for (int32_t j = 0; j < K; j++) {
          counts[(size_t)l * (size_t)E + (size_t)s[j]]++;
          int32_t *lu = &last[(size_t)l * (size_t)E + (size_t)s[j]];
          if (*lu >= 0) dist[t - *lu]++;
          else out->first_uses++;
          *lu = t;
        }
        if (l + 1 < L) {
          const int32_t *n = s + K;
          if (n[0] >= 0) {
            int32_t ov = overlap(s, n, K);
            pair_n[l * 3]++;
            pair_n[l * 3 + 1] += ov;
            pair_n[l * 3 + 2] += ov == K;
          }
        }
        if (t > 0) {
          const int32_t *p = s - (size_t)L * (size_t)K;
          if (p[0] >= 0) {
            prev_n[l * 2]++;
            prev_n[l * 2 + 1] += overlap(s, p, K) == K;
          }
        }
      }
    }
  }
  int32_t quarter = (E + 3) / 4;
  int32_t n_pairs = 0;
  for (int32_t l = 0; l < L; l++) {
    struct ferry_routing_layer_stats *ls = &out->layers[l];
    const int64_t *c = counts + (size_t)l * (size_t)E;
    for (int32_t e = 0; e < E; e++) {
      order[e] = (struct by_count){c[e], e};
      ls->uses += c[e];
    }
    qsort(order, (size_t)E, sizeof *order, cmp_expert);
    for (int j = 0; j < 8; j++) {
      ls->top_ids[j] = j < E ? order[j].id : -1;
      ls->top_share[j] = j < E && ls->uses ? (double)order[j].count / (double)ls->uses : 0;
    }
    int64_t top = 0;
    for (int32_t j = 0; j < quarter; j++) top += order[j].count;
    ls->top25_share = ls->uses ? (double)top / (double)ls->uses : 0;
    double h = 0;
    for (int32_t e = 0; e < E; e++)
      if (c[e]) {
        double p = (double)c[e] / (double)ls->uses;
        h -= p * log(p);
      }
    ls->entropy_norm = E > 1 ? h / log((double)E) : 1.0;
    ls->next_overlap = pair_n[l * 3] ? (double)pair_n[l * 3 + 1] / ((double)pair_n[l * 3] * K) : NAN;
    ls->next_same = pair_n[l * 3] ? (double)pair_n[l * 3 + 2] / (double)pair_n[l * 3] : NAN;
    ls->prev_token_same = prev_n[l * 2] ? (double)prev_n[l * 2 + 1] / (double)prev_n[l * 2] : NAN;
    ferry__routing_layer_measures(r, l, c, &sc, ls);
    out->top25_share += ls->top25_share / L;
    out->entropy_norm += ls->entropy_norm / L;
    if (pair_n[l * 3]) {
      out->next_overlap += ls->next_overlap;
      out->next_same += ls->next_same;
      n_pairs++;
    }
  }
  out->next_overlap = n_pairs ? out->next_overlap / n_pairs : NAN;
  out->next_same = n_pairs ? out->next_same / n_pairs : NAN;
  int32_t n_prev = 0;
  for (int32_t l = 0; l < L; l++)
    if (prev_n[l * 2]) {
      out->prev_token_same += out->layers[l].prev_token_same;
      n_prev++;
    }
  out->prev_token_same = n_prev ? out->prev_token_same / n_prev : NAN;
  int64_t n_dist = 0;
  double sum = 0;
  for (int32_t d = 1; d <= max_tokens; d++) {
    if (!dist[d]) continue;
    out->reuse_hist[bucket_of(d)] += dist[d];
    n_dist += dist[d];
    sum += (double)d * (double)dist[d];
  }
  overall_means(out, E, K);
  out->reuse_mean = n_dist ? sum / (double)n_dist : 0;
  int64_t seen = 0;
  for (int32_t d = 1; d <= max_tokens && n_dist; d++) {
    seen += dist[d];
    if (2 * seen >= n_dist) {
      out->reuse_p50 = d;
      break;
    }
  }
  st = FERRY_OK;
out_free:
  if (st != FERRY_OK) ferry_routing_stats_free(out);
  ferry_free(counts);
  ferry_free(pair_n);
  ferry_free(prev_n);
  ferry_free(last);
  ferry_free(dist);
  ferry_free(order);
  ferry__routing_scratch_free(&sc);
  return st;
}
