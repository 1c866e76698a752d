/* Bootstrap confidence intervals of a predictor evaluation, so that two predictors whose
 * figures differ by less than the sampling noise of the requests are reported as tied: requests
 * are resampled with replacement and every metric recomputed from the summed counts; a paired
 * version resamples the same requests for two evaluations and gives the interval of their
 * difference. Seeded: the same inputs give the same intervals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/rng.h"
#include "ferry/predict.h"

#define CI_LO 0.025
#define CI_HI 0.975

const char *ferry_predict_metric_name(enum ferry_predict_metric m) {
  static const char *const names[FERRY_PREDICT_METRICS] = {"recall", "precision", "stall", "wasted", "hit rate"};
  return (unsigned)m < FERRY_PREDICT_METRICS ? names[m] : "?";
}

int ferry_predict_metric_higher_is_better(enum ferry_predict_metric m) {
  return m != FERRY_PREDICT_STALL && m != FERRY_PREDICT_WASTED;
}

static double ratio(int64_t num, double den) { return den > 0 ? (double)num / den : NAN; }

static double metric(const struct ferry_predict_eval_counts *c, int32_t k, enum ferry_predict_metric m) {
  switch (m) {
    case FERRY_PREDICT_RECALL: return ratio(c->correct_ids, (double)c->predictions * k);
    case FERRY_PREDICT_PRECISION: return ratio(c->correct_ids, (double)c->predicted_ids);
    case FERRY_PREDICT_STALL: return ratio(c->misses, (double)c->tokens);
    case FERRY_PREDICT_WASTED: return ratio(c->prefetch_unused, (double)c->tokens);
    case FERRY_PREDICT_HIT_RATE: return ratio(c->hits, (double)c->uses);
    default: return NAN;
  }
}

static void add(struct ferry_predict_eval_counts *a, const struct ferry_predict_eval_counts *b) {
  a->tokens += b->tokens;
  a->predictions += b->predictions;
  a->predicted_ids += b->predicted_ids;
  a->correct_ids += b->correct_ids;
  a->uses += b->uses;
  a->hits += b->hits;
  a->misses += b->misses;
  a->prefetch_loads += b->prefetch_loads;
  a->prefetch_unused += b->prefetch_unused;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Percentile interval of the finite samples (NAN when none). */
static void interval(double *v, int32_t n, struct ferry_predict_ci *out) {
  int32_t m = 0;
  for (int32_t i = 0; i < n; i++)
    if (isfinite(v[i])) v[m++] = v[i];
  if (!m) {
    out->lo = out->hi = NAN;
    return;
  }
  qsort(v, (size_t)m, sizeof *v, cmp_double);
  out->lo = v[(int32_t)floor(CI_LO * (m - 1))];
  out->hi = v[(int32_t)ceil(CI_HI * (m - 1))];
}

static ferry_status check(const struct ferry_predict_eval_result *r, int32_t n_boot) {
  if (!r || (r->n_requests && !r->per_request) || r->top_k < 1)
    return ferry__fail(FERRY_ERR_INVALID, "predictor confidence intervals: no per-request counts (run ferry_predict_eval)");
  if (n_boot < 10) return ferry__fail(FERRY_ERR_INVALID, "predictor confidence intervals: %d resamples (need >= 10)", n_boot);
  return FERRY_OK;
}

/* Sum of the counts of one resample (indices drawn from rng) into a and, when given, b. */
static void resample(struct ferry_rng *rng, const struct ferry_predict_eval_result *ra,
                     const struct ferry_predict_eval_result *rb, struct ferry_predict_eval_counts *a,
                     struct ferry_predict_eval_counts *b) {
  memset(a, 0, sizeof *a);
  if (b) memset(b, 0, sizeof *b);
  for (size_t i = 0; i < ra->n_requests; i++) {
    size_t j = (size_t)ferry__rng_below(rng, (uint64_t)ra->n_requests);
    add(a, &ra->per_request[j]);
    if (b) add(b, &rb->per_request[j]);
  }
}

static struct ferry_predict_eval_counts total(const struct ferry_predict_eval_result *r) {
  struct ferry_predict_eval_counts t = {0};
  for (size_t i = 0; i < r->n_requests; i++) add(&t, &r->per_request[i]);
  return t;
}

ferry_status ferry_predict_eval_ci(const struct ferry_predict_eval_result *r, int32_t n_boot, uint64_t seed,
                                   struct ferry_predict_ci out[FERRY_PREDICT_METRICS]) {
  ferry_status st = check(r, n_boot);
  if (st != FERRY_OK || !out) return st != FERRY_OK ? st : ferry__fail(FERRY_ERR_INVALID, "ferry_predict_eval_ci: NULL out");
  double *v = ferry__calloc((size_t)n_boot * FERRY_PREDICT_METRICS, sizeof *v);
  if (!v) return ferry__fail(FERRY_ERR_NOMEM, "predictor confidence intervals: out of memory");
  struct ferry_rng rng;
  ferry__rng_seed_stream(&rng, seed, 0x626f6f74ULL);
  for (int32_t b = 0; b < n_boot; b++) {
    struct ferry_predict_eval_counts c;
    resample(&rng, r, NULL, &c, NULL);
    for (int m = 0; m < FERRY_PREDICT_METRICS; m++) v[(size_t)m * (size_t)n_boot + (size_t)b] = metric(&c, r->top_k, m);
  }
  const struct ferry_predict_eval_counts all = total(r);
  for (int m = 0; m < FERRY_PREDICT_METRICS; m++) {
    out[m].value = metric(&all, r->top_k, m);
    interval(v + (size_t)m * (size_t)n_boot, n_boot, &out[m]);
  }
  ferry_free(v);
  return FERRY_OK;
}

ferry_status ferry_predict_eval_diff_ci(const struct ferry_predict_eval_result *a, const struct ferry_predict_eval_result *b,
                                        enum ferry_predict_metric m, int32_t n_boot, uint64_t seed,
                                        struct ferry_predict_ci *out) {
  ferry_status st = check(a, n_boot);
  if (st == FERRY_OK) st = check(b, n_boot);
  if (st != FERRY_OK) return st;
  if (!out || (unsigned)m >= FERRY_PREDICT_METRICS || a->n_requests != b->n_requests || a->top_k != b->top_k)
    return ferry__fail(FERRY_ERR_INVALID, "predictor comparison: the evaluations cover %zu and %zu requests (top-%d, "
                       "top-%d); a paired comparison needs the same", a->n_requests, b->n_requests, a->top_k, b->top_k);
  double *v = ferry__calloc((size_t)n_boot, sizeof *v);
  if (!v) return ferry__fail(FERRY_ERR_NOMEM, "predictor comparison: out of memory");
  struct ferry_rng rng;
  ferry__rng_seed_stream(&rng, seed, 0x70616972ULL);
  for (int32_t i = 0; i < n_boot; i++) {
    struct ferry_predict_eval_counts ca, cb;
    resample(&rng, a, b, &ca, &cb);
    v[i] = metric(&ca, a->top_k, m) - metric(&cb, b->top_k, m);
  }
  const struct ferry_predict_eval_counts ta = total(a), tb = total(b);
  out->value = metric(&ta, a->top_k, m) - metric(&tb, b->top_k, m);
  interval(v, n_boot, out);
  ferry_free(v);
  return FERRY_OK;
}
