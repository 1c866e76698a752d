/* Comparison of two runs' metrics for `ferry db diff` and regression gates: each metric knows
 * whether higher is better, and B regresses when it is worse than A by more than a tolerance. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ferry/db.h"

static void add(struct ferry_metric_delta *out, size_t *n, const char *name, double a, double b,
                int higher_is_better, double tol) {
  if (*n >= FERRY_DB_MAX_METRICS) return;
  struct ferry_metric_delta *d = &out[(*n)++];
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->a = a;
  d->b = b;
  d->higher_is_better = higher_is_better;
  if (a == b)
    d->change_pct = 0;
  else if (a == 0)
    d->change_pct = b > 0 ? INFINITY : -INFINITY;
  else
    d->change_pct = (b - a) / fabs(a) * 100.0;
  /* "worse" is a rise for costs and a fall for throughput. */
  double worse = higher_is_better ? -d->change_pct : d->change_pct;
  d->regressed = worse > tol;
}

int ferry_db_compare(const struct ferry_run_stats *a, const struct ferry_run_stats *b,
                     double tolerance_pct, struct ferry_metric_delta *out, size_t *count) {
  size_t n = 0;
  const double ms = 1e-6;
  if (a->requests || b->requests) {
    add(out, &n, "ttft_mean_ms", a->ttft_ns.mean * ms, b->ttft_ns.mean * ms, 0, tolerance_pct);
    add(out, &n, "ttft_p50_ms", a->ttft_ns.p50 * ms, b->ttft_ns.p50 * ms, 0, tolerance_pct);
    add(out, &n, "ttft_p90_ms", a->ttft_ns.p90 * ms, b->ttft_ns.p90 * ms, 0, tolerance_pct);
    add(out, &n, "ttft_p99_ms", a->ttft_ns.p99 * ms, b->ttft_ns.p99 * ms, 0, tolerance_pct);
    add(out, &n, "tpot_mean_ms", a->tpot_ns.mean * ms, b->tpot_ns.mean * ms, 0, tolerance_pct);
    add(out, &n, "tpot_p50_ms", a->tpot_ns.p50 * ms, b->tpot_ns.p50 * ms, 0, tolerance_pct);
    add(out, &n, "tpot_p90_ms", a->tpot_ns.p90 * ms, b->tpot_ns.p90 * ms, 0, tolerance_pct);
    add(out, &n, "tpot_p99_ms", a->tpot_ns.p99 * ms, b->tpot_ns.p99 * ms, 0, tolerance_pct);
    add(out, &n, "e2e_mean_ms", a->e2e_ns.mean * ms, b->e2e_ns.mean * ms, 0, tolerance_pct);
    add(out, &n, "e2e_p50_ms", a->e2e_ns.p50 * ms, b->e2e_ns.p50 * ms, 0, tolerance_pct);
    add(out, &n, "e2e_p90_ms", a->e2e_ns.p90 * ms, b->e2e_ns.p90 * ms, 0, tolerance_pct);
    add(out, &n, "e2e_p99_ms", a->e2e_ns.p99 * ms, b->e2e_ns.p99 * ms, 0, tolerance_pct);
    add(out, &n, "throughput_tok_s", a->throughput_tok_s, b->throughput_tok_s, 1, tolerance_pct);
  }
  static const char *const peak_names[FERRY_TIER_COUNT] = {"peak_device_bytes", "peak_host_bytes",
                                                           "peak_disk_bytes"};
  for (int t = 0; t < FERRY_TIER_COUNT; t++)
    if (a->peak_bytes[t] || b->peak_bytes[t])
      add(out, &n, peak_names[t], (double)a->peak_bytes[t], (double)b->peak_bytes[t], 0, tolerance_pct);
  if (a->steps || b->steps) {
    add(out, &n, "bytes_disk", (double)a->bytes_disk, (double)b->bytes_disk, 0, tolerance_pct);
    add(out, &n, "bytes_h2d", (double)a->bytes_h2d, (double)b->bytes_h2d, 0, tolerance_pct);
    add(out, &n, "bytes_d2h", (double)a->bytes_d2h, (double)b->bytes_d2h, 0, tolerance_pct);
    add(out, &n, "stall_ms", (double)a->stall_ns * ms, (double)b->stall_ns * ms, 0, tolerance_pct);
  }
  int regressed = 0;
  for (size_t i = 0; i < n; i++) regressed += out[i].regressed;
  *count = n;
  return regressed;
}
