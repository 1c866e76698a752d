/* Capacity planning decisions (ferry/plan.h): saturation from a run's arrivals and finishes,
 * the rate search state machine, costs and the cheapest pick. Pure functions of their inputs:
 * `ferry plan` feeds them simulated runs, the tests feed them numbers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "ferry/plan.h"

static int cmp_i64(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Events at or before t among sorted times (never-happened ones, negative, left out). */
static size_t count_by(const int64_t *v, size_t n, int64_t t) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid] <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The times that happened, sorted, in a new array (owned). */
static int64_t *sorted_times(const int64_t *t, size_t n, size_t *kept) {
  int64_t *v = ferry__calloc(n ? n : 1, sizeof *v);
  *kept = 0;
  if (!v) return NULL;
  for (size_t i = 0; i < n; i++)
    if (t[i] >= 0) v[(*kept)++] = t[i];
  qsort(v, *kept, sizeof *v, cmp_i64);
  return v;
}

ferry_status ferry_plan_load_analyze(const int64_t *arrival_ns, const int64_t *first_token_ns, const int64_t *finish_ns,
                                     size_t n, struct ferry_plan_load *out) {
  if (!arrival_ns || !first_token_ns || !finish_ns || !out)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_plan_load_analyze: NULL argument");
  memset(out, 0, sizeof *out);
  if (n < 4) return FERRY_OK;
  size_t na, ns, nf;
  int64_t *arr = sorted_times(arrival_ns, n, &na), *started = sorted_times(first_token_ns, n, &ns),
          *fin = sorted_times(finish_ns, n, &nf);
  ferry_status st = FERRY_OK;
  if (!arr || !started || !fin) {
    st = ferry__fail(FERRY_ERR_NOMEM, "ferry_plan_load_analyze: out of memory for %zu requests", n);
    goto out_free;
  }
  if (na < 4) goto out_free;
  const int64_t t0 = arr[0], t1 = arr[na - 1];
  const double window_s = (double)(t1 - t0) / 1e9;
  /* every request at once is a burst, not a rate: nothing arrives while the first are served */
  if (window_s <= 0) goto out_free;
  out->offered_rps = (double)(na - 1) / window_s;
  out->served_rps = (double)count_by(fin, nf, t1) / window_s;
  /* the waiting line at each arrival of the second half, and its least-squares slope */
  const int64_t tmid = t0 + (t1 - t0) / 2;
  size_t first = 0;
  while (first < na && arr[first] < tmid) first++;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  size_t m = 0;
  for (size_t i = first; i < na; i++) {
    const double x = (double)(arr[i] - tmid) / 1e9;
    const double y = (double)count_by(arr, na, arr[i]) - (double)count_by(started, ns, arr[i]);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
    m++;
  }
  out->queue_mid = (int64_t)count_by(arr, na, tmid) - (int64_t)count_by(started, ns, tmid);
  out->queue_end = (int64_t)na - (int64_t)count_by(started, ns, t1);
  const double den = (double)m * sxx - sx * sx;
  if (m >= 3 && den > 0) out->queue_growth_rps = ((double)m * sxy - sx * sy) / den;
  /* a tenth of the half's arrivals left waiting, at a steady slope: a line that a longer window
   * would only make longer */
  const double half_s = (double)(t1 - tmid) / 1e9;
  const double half_rps = half_s > 0 ? (double)m / half_s : 0;
  const double min_growth = fmax(4.0, 0.1 * (double)m);
  out->saturated = out->queue_growth_rps > 0.1 * half_rps && (double)(out->queue_end - out->queue_mid) >= min_growth;
out_free:
  ferry_free(arr);
  ferry_free(started);
  ferry_free(fin);
  return st;
}

void ferry_plan_search_init(struct ferry_plan_search *s, double start_rps, double min_rps, double max_rps,
                            double tolerance) {
  memset(s, 0, sizeof *s);
  s->start_rps = start_rps;
  s->min_rps = min_rps > 0 && min_rps <= start_rps ? min_rps : start_rps;
  s->max_rps = max_rps >= start_rps ? max_rps : start_rps;
  s->tolerance = tolerance > 0 ? tolerance : 0.05;
}

/* Whether the next probe is the floor check: first, or after a first probe that missed. */
static int floor_due(const struct ferry_plan_search *s) {
  if (!s->floor_check || s->floor_probed || !(s->min_rps < s->start_rps) || s->best_rps > 0) return 0;
  /* after a miss by latency: a queue growing without bound says the load is what missed */
  return s->floor_check == 1 ? s->probes == 0 : s->probes == 1 && s->fail_rps > 0 && s->saturated_rps == 0;
}

int ferry_plan_search_next(const struct ferry_plan_search *s, double *rps) {
  const double lo = s->best_rps, hi = s->fail_rps;
  if (lo == 0 && s->unreachable) return 0;
  if (floor_due(s)) {
    *rps = s->min_rps;
    return 1;
  }
  if (lo == 0 && hi == 0) {
    *rps = s->start_rps;
    return 1;
  }
  /* the start is meant to be near the answer: the first step away from it is short, later
   * ones double, so a bad start costs a few probes and a good one none */
  const double step = s->probes <= 1 ? 1.25 : 2.0;
  if (hi == 0) {
    /* every probe so far met the SLO: step up until one fails or the ceiling is reached */
    if (lo >= s->max_rps) return 0;
    *rps = fmin(lo * step, s->max_rps);
    return 1;
  }
  if (lo == 0) {
    /* every probe failed: step down until one meets the SLO or the floor says none will */
    if (hi <= s->min_rps || s->unreachable) return 0;
    *rps = fmax(hi / step, s->min_rps);
    return 1;
  }
  if (hi <= lo * (1 + s->tolerance)) return 0;
  *rps = sqrt(lo * hi);
  return 1;
}

void ferry_plan_search_report(struct ferry_plan_search *s, double rps, int feasible, int saturated, double excess) {
  if (rps == s->min_rps && floor_due(s)) {
    /* the floor check: it decides whether to go on, and leaves the search's own state (and so
     * the rates it probes next) as they were */
    s->floor_probed = 1;
    s->floor_ok = feasible;
    if (!feasible && excess >= FERRY_PLAN_FLOOR_MISS) s->unreachable = 1;
    (void)saturated; /* not the search's saturation rate: the search itself never probed there */
    return;
  }
  s->probes++;
  if (feasible) {
    if (rps > s->best_rps) s->best_rps = rps;
    s->last_excess = 0;
    return;
  }
  const int lower = s->fail_rps == 0 || rps < s->fail_rps;
  if (lower) s->fail_rps = rps;
  if (saturated && (s->saturated_rps == 0 || rps < s->saturated_rps)) s->saturated_rps = rps;
  /* halving the load changed nothing: what misses the limit is not the queue */
  if (s->best_rps == 0 && lower && !saturated && excess > 1 && s->last_excess > 1 &&
      fabs(excess - s->last_excess) <= 0.02 * s->last_excess)
    s->unreachable = 1;
  s->last_excess = saturated ? 0 : excess;
}

int ferry_plan_search_floor_next(const struct ferry_plan_search *s) { return !(s->best_rps == 0 && s->unreachable) && floor_due(s); }

/* The k-th largest (k >= 1) of n values, by partial selection: the lists are short (a prefix of a
 * plan's slice). */
static double kth_largest(const double *v, size_t n, size_t k) {
  double *c = ferry__calloc(n ? n : 1, sizeof *c);
  if (!c) return 0; /* nothing proven */
  memcpy(c, v, n * sizeof *c);
  for (size_t i = 0; i < k; i++) {
    size_t m = i;
    for (size_t j = i + 1; j < n; j++)
      if (c[j] > c[m]) m = j;
    const double t = c[i];
    c[i] = c[m];
    c[m] = t;
  }
  const double x = c[k - 1];
  ferry_free(c);
  return x;
}

double ferry_plan_percentile_floor(const double *known, size_t n_known, size_t n_total, double percentile) {
  if (!known || n_total == 0 || n_known > n_total) return 0;
  /* the rank as ferry__percentile computes it, to the bit */
  const size_t lo = (size_t)(percentile / 100.0 * (double)(n_total - 1));
  const size_t need = n_total - (lo < n_total ? lo : n_total - 1);
  if (n_known < need) return 0;
  return kth_largest(known, n_known, need);
}

double ferry_plan_mean_floor(const double *known, size_t n_known, size_t n_total) {
  if (!known || n_total == 0 || n_known > n_total) return 0;
  double sum = 0;
  for (size_t i = 0; i < n_known; i++) sum += known[i];
  return sum / (double)n_total * (1 - 1e-12);
}

void ferry_plan_cost(double price_per_hour, int machines, double rps, double mean_output_tokens,
                     struct ferry_plan_cost *out) {
  memset(out, 0, sizeof *out);
  out->usd_per_hour = price_per_hour > 0 ? price_per_hour * (machines > 0 ? machines : 1) : 0;
  out->tokens_per_s = rps > 0 && mean_output_tokens > 0 ? rps * mean_output_tokens : 0;
  if (out->usd_per_hour > 0 && out->tokens_per_s > 0) {
    out->usd_per_mtok = out->usd_per_hour / (out->tokens_per_s * 3600.0) * 1e6;
    out->tokens_per_s_per_usd = out->tokens_per_s / out->usd_per_hour;
  }
}

int ferry_plan_cheapest(const struct ferry_plan_choice *c, size_t n) {
  int best = -1;
  for (size_t i = 0; i < n; i++) {
    if (!c[i].eligible || !(c[i].usd_per_hour > 0)) continue;
    if (best < 0 || c[i].usd_per_hour < c[best].usd_per_hour) {
      best = (int)i;
      continue;
    }
    if (c[i].usd_per_hour != c[best].usd_per_hour) continue;
    if (c[i].usd_per_mtok < c[best].usd_per_mtok ||
        (c[i].usd_per_mtok == c[best].usd_per_mtok && c[i].max_rps > c[best].max_rps))
      best = (int)i;
  }
  return best;
}
