/* The latency metrics of a run, defined once (docs/metrics.md). `ferry run`/`ferry sim`'s
 * summary (the engine), `ferry db show`/`db diff` (profiler/) and `ferry report` (reports/,
 * which reads databases and never links the runtime) all compute them here, so they print the
 * same figures for the same run. */
#ifndef FERRY_COMMON_METRICS_H
#define FERRY_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* A request's latencies in ns. A request counts once it is complete: its first token and its
 * last were produced (times >= 0; a database's NULL is read as -1). */
struct ferry__request_latency {
  double ttft_ns; /* first token - arrival */
  double e2e_ns;  /* finish - arrival */
  double tpot_ns; /* (finish - first token) / (output tokens - 1): the time per output token after
                     the first; only with more than one output token (has_tpot) */
  int has_tpot;
};

/* 1 and the latencies when the request is complete, else 0. Differences are taken as doubles
 * (common/checked.h), so hostile times in a database cannot overflow. */
int ferry__request_latency(int64_t arrival_ns, int64_t first_token_ns, int64_t finish_ns, int64_t output_tokens,
                           struct ferry__request_latency *out);

/* The p-th percentile (p in [0, 100]) of n > 0 sorted values: linear interpolation between the
 * closest ranks, rank p/100 x (n - 1) from 0 (numpy.percentile's default, and what vLLM's and
 * most serving benchmarks report). */
double ferry__percentile(const double *sorted, size_t n, double p);

/* Count, mean, P50, P90, P99 and maximum of a sample. */
struct ferry__dist {
  int64_t count;
  double mean, p50, p90, p99, max;
};

/* The distribution of v[0..n) (sorted in place: the mean is summed in sorted order, so the
 * same sample gives the same bits whatever order it was read in). n = 0: count 0 and zeros. */
void ferry__dist_compute(double *v, size_t n, struct ferry__dist *out);

/* Output tokens per second over the span from the first arrival to the last finish of the
 * complete requests; 0 when the span is empty. */
double ferry__throughput_tok_s(int64_t output_tokens, int64_t first_arrival_ns, int64_t last_finish_ns);

#endif
