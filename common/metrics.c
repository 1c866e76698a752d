/* One definition of each latency metric (common/metrics.h, docs/metrics.md). */
#include <stdlib.h>
#include <string.h>

#include "common/checked.h"
#include "common/metrics.h"

int ferry__request_latency(int64_t arrival_ns, int64_t first_token_ns, int64_t finish_ns, int64_t output_tokens,
                           struct ferry__request_latency *out) {
  memset(out, 0, sizeof *out);
  if (first_token_ns < 0 || finish_ns < 0) return 0;
  out->ttft_ns = ferry__span(arrival_ns, first_token_ns);
  out->e2e_ns = ferry__span(arrival_ns, finish_ns);
  out->has_tpot = output_tokens > 1;
  if (out->has_tpot) out->tpot_ns = ferry__span(first_token_ns, finish_ns) / ((double)output_tokens - 1.0);
  return 1;
}

double ferry__percentile(const double *v, size_t n, double p) {
  const double rank = p / 100.0 * (double)(n - 1);
  const size_t lo = (size_t)rank;
  if (lo + 1 >= n) return v[n - 1];
  return v[lo] + (v[lo + 1] - v[lo]) * (rank - (double)lo);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void ferry__dist_compute(double *v, size_t n, struct ferry__dist *out) {
  memset(out, 0, sizeof *out);
  if (!n) return;
  qsort(v, n, sizeof *v, cmp_double);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += v[i];
  out->count = (int64_t)n;
  out->mean = sum / (double)n;
  out->p50 = ferry__percentile(v, n, 50);
  out->p90 = ferry__percentile(v, n, 90);
  out->p99 = ferry__percentile(v, n, 99);
  out->max = v[n - 1];
}

double ferry__throughput_tok_s(int64_t output_tokens, int64_t first_arrival_ns, int64_t last_finish_ns) {
  const double span_ns = ferry__span(first_arrival_ns, last_finish_ns);
  return span_ns > 0 ? (double)output_tokens / (span_ns / 1e9) : 0;
}
