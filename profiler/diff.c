/* Comparison of runs' metrics for `ferry db diff` and regression gates: each metric is defined
 * once (its name, where it comes from in ferry_run_stats, whether higher is better), and B
 * regresses when it is worse than A by more than a tolerance: for single runs by the change of
 * the values, for repeated runs by a one-sided Mann-Whitney U test of that worsening. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "ferry/db.h"
#include "profiler/db_internal.h"

/* Which runs have a metric: latencies need requests, a tier's peak needs samples of it, bytes
 * and stall time need steps. */
enum family { F_REQUESTS, F_PEAK_DEVICE, F_PEAK_HOST, F_PEAK_DISK, F_STEPS, F_DISK_WRITE, F_PEERS };

static double ms(double ns) { return ns * 1e-6; }

/* `gate`: with repeated runs only these decide the verdict, Holm-corrected over them: the
 * medians and tails a user gates on, memory and traffic. Means and p90 follow the same shifts,
 * and stall time (a sum of short waits, heavy-tailed on a loaded machine) swings by tens of
 * percent between identical runs: tested each alone they would multiply false alarms, so they
 * are shown with their p-values for information. */
#define DIST(name, field, stat, gate) \
  {name, F_REQUESTS, 0, gate, offsetof(struct ferry_run_stats, field) + offsetof(struct ferry_dist, stat), 'd'}
static const struct metric {
  const char *name;
  enum family family;
  int higher_is_better;
  int gate;
  size_t off; /* of the value in ferry_run_stats */
  char type;  /* 'd': double ns shown in ms, 't': double as is, 'u': uint64, 'i': int64 ns shown in ms */
} metrics[] = {
    DIST("ttft_mean_ms", ttft_ns, mean, 0), DIST("ttft_p50_ms", ttft_ns, p50, 1),
    DIST("ttft_p90_ms", ttft_ns, p90, 0),   DIST("ttft_p99_ms", ttft_ns, p99, 1),
    DIST("tpot_mean_ms", tpot_ns, mean, 0), DIST("tpot_p50_ms", tpot_ns, p50, 1),
    DIST("tpot_p90_ms", tpot_ns, p90, 0),   DIST("tpot_p99_ms", tpot_ns, p99, 1),
    DIST("e2e_mean_ms", e2e_ns, mean, 0),   DIST("e2e_p50_ms", e2e_ns, p50, 1),
    DIST("e2e_p90_ms", e2e_ns, p90, 0),     DIST("e2e_p99_ms", e2e_ns, p99, 1),
    {"throughput_tok_s", F_REQUESTS, 1, 1, offsetof(struct ferry_run_stats, throughput_tok_s), 't'},
    {"peak_device_bytes", F_PEAK_DEVICE, 0, 1, offsetof(struct ferry_run_stats, peak_bytes) + 0 * sizeof(uint64_t),
     'u'},
    {"peak_host_bytes", F_PEAK_HOST, 0, 1, offsetof(struct ferry_run_stats, peak_bytes) + 1 * sizeof(uint64_t), 'u'},
    {"peak_disk_bytes", F_PEAK_DISK, 0, 1, offsetof(struct ferry_run_stats, peak_bytes) + 2 * sizeof(uint64_t), 'u'},
    {"bytes_disk", F_STEPS, 0, 1, offsetof(struct ferry_run_stats, bytes_disk), 'u'},
    {"bytes_h2d", F_STEPS, 0, 1, offsetof(struct ferry_run_stats, bytes_h2d), 'u'},
    {"bytes_d2h", F_STEPS, 0, 1, offsetof(struct ferry_run_stats, bytes_d2h), 'u'},
    {"bytes_disk_write", F_DISK_WRITE, 0, 1, offsetof(struct ferry_run_stats, bytes_disk_write), 'u'},
    {"bytes_peers", F_PEERS, 0, 1, offsetof(struct ferry_run_stats, bytes_peers), 'u'},
    {"stall_ms", F_STEPS, 0, 0, offsetof(struct ferry_run_stats, stall_ns), 'i'},
};
#undef DIST
#define N_METRICS (sizeof metrics / sizeof metrics[0])
_Static_assert(N_METRICS <= FERRY_DB_MAX_METRICS, "FERRY_DB_MAX_METRICS holds every metric");

static int has(const struct ferry_run_stats *s, enum family f) {
  switch (f) {
    case F_REQUESTS: return s->requests != 0;
    case F_PEAK_DEVICE: return s->peak_bytes[FERRY_TIER_DEVICE] != 0;
    case F_PEAK_HOST: return s->peak_bytes[FERRY_TIER_HOST] != 0;
    case F_PEAK_DISK: return s->peak_bytes[FERRY_TIER_DISK] != 0;
    case F_STEPS: return s->steps != 0 || s->bytes_from_timeline;
    case F_DISK_WRITE: return s->bytes_disk_write != 0; /* only runs that wrote to disk (--kv-home disk) */
    case F_PEERS: return s->bytes_peers != 0;           /* only runs with data-parallel peers (--zero-gpus N) */
  }
  return 0;
}

static double value(const struct ferry_run_stats *s, const struct metric *m) {
  const char *p = (const char *)s + m->off;
  double v;
  switch (m->type) {
    case 'd': memcpy(&v, p, sizeof v); return ms(v);
    case 't': memcpy(&v, p, sizeof v); return v;
    case 'u': {
      uint64_t u;
      memcpy(&u, p, sizeof u);
      return (double)u;
    }
    default: {
      int64_t i;
      memcpy(&i, p, sizeof i);
      return ms((double)i);
    }
  }
}

size_t ferry_db_metrics(const struct ferry_run_stats *s, struct ferry_metric_value *out) {
  size_t n = 0;
  for (size_t i = 0; i < N_METRICS; i++) {
    if (!has(s, metrics[i].family)) continue;
    struct ferry_metric_value *v = &out[n++];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", metrics[i].name);
    v->value = value(s, &metrics[i]);
    v->higher_is_better = metrics[i].higher_is_better;
  }
  return n;
}

const char *ferry_verdict_name(enum ferry_verdict v) {
  switch (v) {
    case FERRY_VERDICT_REGRESSION: return "regression";
    case FERRY_VERDICT_IMPROVEMENT: return "improvement";
    case FERRY_VERDICT_NONE: break;
  }
  return "no significant change";
}

static double change_pct(double a, double b) {
  if (a == b) return 0;
  if (a == 0) return b > 0 ? INFINITY : -INFINITY;
  return (b - a) / fabs(a) * 100.0;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* The median of v (sorted in place). */
static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return ferry__db_percentile(v, n, 50);
}

/* One-sided p-value that `worse` (B's values) exceed `base` scaled by `scale`; with `below`
 * the question is whether they fall below it instead. */
static double shifted_p(const double *base, size_t na, const double *b, size_t nb, double scale, int below,
                        double *tmp) {
  for (size_t i = 0; i < na; i++) tmp[i] = base[i] * scale;
  if (!below) return ferry__mann_whitney_greater(tmp, na, b, nb);
  /* B below A' is A' above B */
  return ferry__mann_whitney_greater(b, nb, tmp, na);
}

/* The p-values of one metric before the correction over the gated ones. */
struct tested {
  double p_worse, p_better;
  int counted; /* gated and not the same value in every run (such a test can never reject) */
};

static void compare_metric(const struct metric *m, double *va, size_t na, double *vb, size_t nb, double tol,
                           double *tmp, struct ferry_metric_delta *d, struct tested *t) {
  memset(d, 0, sizeof *d);
  memset(t, 0, sizeof *t);
  snprintf(d->name, sizeof d->name, "%s", m->name);
  d->higher_is_better = m->higher_is_better;
  d->n_a = (int)na;
  d->n_b = (int)nb;
  d->p_value = NAN;
  d->effect = NAN;
  d->gated = 1;
  if (na >= 2 && nb >= 2) {
    const double up = 1.0 + tol / 100.0, down = 1.0 - tol / 100.0;
    /* a cost regresses when B exceeds A*(1+tol); throughput when B falls below A*(1-tol) */
    t->p_worse = m->higher_is_better ? shifted_p(va, na, vb, nb, down, 1, tmp) : shifted_p(va, na, vb, nb, up, 0, tmp);
    t->p_better = m->higher_is_better ? shifted_p(va, na, vb, nb, up, 0, tmp) : shifted_p(va, na, vb, nb, down, 1, tmp);
    const double delta = ferry__cliffs_delta(va, na, vb, nb);
    d->effect = (m->higher_is_better ? -delta : delta) + 0.0; /* + 0.0: no "-0.00" */
    d->p_value = t->p_worse < t->p_better ? t->p_worse : t->p_better;
    d->gated = m->gate;
    int constant = 1;
    for (size_t i = 0; i < na && constant; i++) constant = va[i] == va[0];
    for (size_t j = 0; j < nb && constant; j++) constant = vb[j] == va[0];
    /* Tarone: a test whose data allow no p-value below the level is no hypothesis to correct for */
    t->counted = m->gate && !constant;
  }
  d->a = median(va, na);
  d->b = median(vb, nb);
  d->change_pct = change_pct(d->a, d->b);
  if (na < 2 || nb < 2) {
    /* "worse" is a rise for costs and a fall for throughput */
    const double worse = m->higher_is_better ? -d->change_pct : d->change_pct;
    if (worse > tol) d->verdict = FERRY_VERDICT_REGRESSION;
    else if (-worse > tol) d->verdict = FERRY_VERDICT_IMPROVEMENT;
  }
}

/* Holm's step-down over the counted metrics: the k-th smallest p-value of m is compared with
 * alpha / (m - k + 1) until one fails. Family-wise error at most alpha per direction. */
static void holm(const struct tested *t, size_t n, int worse, double alpha, struct ferry_metric_delta *d,
                 enum ferry_verdict v) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++) m += (size_t)t[i].counted;
  int done[FERRY_DB_MAX_METRICS] = {0};
  for (size_t k = 0; k < m; k++) {
    size_t best = n;
    for (size_t i = 0; i < n; i++) {
      if (!t[i].counted || done[i]) continue;
      const double p = worse ? t[i].p_worse : t[i].p_better;
      if (best == n || p < (worse ? t[best].p_worse : t[best].p_better)) best = i;
    }
    const double p = worse ? t[best].p_worse : t[best].p_better;
    if (!(p < alpha / (double)(m - k))) return;
    done[best] = 1;
    if (d[best].verdict == FERRY_VERDICT_NONE) d[best].verdict = v;
  }
}

int ferry_db_compare_groups(const struct ferry_run_stats *a, size_t na, const struct ferry_run_stats *b, size_t nb,
                            double tolerance_pct, double alpha, struct ferry_metric_delta *out, size_t *count) {
  *count = 0;
  if (!a || !b || !na || !nb) return 0;
  double *va = ferry__calloc(na, sizeof *va), *vb = ferry__calloc(nb, sizeof *vb),
         *tmp = ferry__calloc(na > nb ? na : nb, sizeof *tmp);
  struct tested t[FERRY_DB_MAX_METRICS];
  size_t n = 0;
  int regressed = 0;
  if (va && vb && tmp) {
    for (size_t i = 0; i < N_METRICS; i++) {
      const struct metric *m = &metrics[i];
      size_t ka = 0, kb = 0, any = 0;
      /* a run without the metric (no requests, the tier unused) counts as 0 when another run
       * has it: a candidate that stops using a tier has changed */
      for (size_t r = 0; r < na; r++) any |= (size_t)has(&a[r], m->family);
      for (size_t r = 0; r < nb; r++) any |= (size_t)has(&b[r], m->family);
      if (!any) continue;
      for (size_t r = 0; r < na; r++) va[ka++] = value(&a[r], m);
      for (size_t r = 0; r < nb; r++) vb[kb++] = value(&b[r], m);
      compare_metric(m, va, ka, vb, kb, tolerance_pct, tmp, &out[n], &t[n]);
      n++;
    }
    if (na >= 2 && nb >= 2) {
      holm(t, n, 1, alpha, out, FERRY_VERDICT_REGRESSION);
      holm(t, n, 0, alpha, out, FERRY_VERDICT_IMPROVEMENT);
    }
    for (size_t i = 0; i < n; i++) {
      out[i].regressed = out[i].verdict == FERRY_VERDICT_REGRESSION;
      regressed += out[i].regressed;
    }
  }
  ferry_free(va);
  ferry_free(vb);
  ferry_free(tmp);
  *count = n;
  return regressed;
}

int ferry_db_compare(const struct ferry_run_stats *a, const struct ferry_run_stats *b, double tolerance_pct,
                     struct ferry_metric_delta *out, size_t *count) {
  return ferry_db_compare_groups(a, 1, b, 1, tolerance_pct, 0.05, out, count);
}
