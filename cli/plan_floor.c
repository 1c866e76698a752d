/* The floor check of `ferry plan` answered from a prefix of the request slice (docs/plan.md,
 * step 2). At the search's floor (1/256 of the throughput bound) requests are served one by one,
 * the costliest probe of a search, and on a profile that cannot meet the SLO its verdict is
 * usually plain from the first requests: each of them misses a limit by a factor.
 *
 * Why the verdict is the whole slice's: the engine admits a request only once it has arrived
 * (ferry_engine_serve_add() adds them in arrival order and gives the same steps as one run over
 * all), and with replicas the router picks one for each arriving request from the replicas'
 * state at that time, so until the first request after the prefix arrives, the whole slice's
 * run and the prefix's run take the same steps, on the same executor state, with the same KV capacity
 * (pinned here to the whole slice's, which `ferry sim` sizes from the longest request). A prefix
 * request that finished by then has the same arrival, first token and finish in both runs. If
 * the whole run is complete and stable (what the floor check requires before it can end a
 * search), its P-th percentile over N values is at least its value at rank floor(P/100 (N-1)),
 * so at least the (N - rank)-th largest of those known values (ferry_plan_percentile_floor),
 * and its mean at least their sum over N. Bounds that miss a limit by FERRY_PLAN_FLOOR_MISS
 * make the whole run's miss it by as much: the floor check's verdict. If instead the whole run
 * were incomplete (a request longer than the KV capacity is refused at any rate) or saturated at
 * 1/256 of its bound, it misses the SLO at the floor, and by the search's own assumption (the
 * metrics grow with the rate) at every rate: the answer, no rate, is the same. */
#include <string.h>

#include "cli/cli.h"
#include "cli/plan.h"
#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/metrics.h"
#include "common/units.h"

/* Requests per replica at least in a prefix: fewer rarely hold two finished misses. */
#define MIN_PREFIX 10
/* A prefix is worth trying when it is at most this share of the slice. */
#define MAX_PREFIX_SHARE 0.4

int32_t plan_floor_prefix(const struct plan_opts *o, const struct plan_workload *w, int replicas) {
  const size_t n = plan_workload_count(w, replicas);
  if (replicas < 1 || n < 2) return 0;
  size_t need = n;
  for (int i = 0; i < o->n_slo; i++) {
    if (o->slo[i].stat == PLAN_MEAN) continue;
    static const double pct[] = {0, 50, 90, 99};
    const size_t lo = (size_t)(pct[o->slo[i].stat] / 100.0 * (double)(n - 1));
    if (n - lo < need) need = n - lo;
  }
  size_t k = 3 * need;
  if (k < (size_t)MIN_PREFIX * (size_t)replicas) k = (size_t)MIN_PREFIX * (size_t)replicas;
  return (double)k <= MAX_PREFIX_SHARE * (double)n ? (int32_t)k : 0;
}

struct known {
  double *v[3]; /* ttft, tpot, e2e of requests served as in the whole run */
  size_t n[3];
  size_t total[3]; /* how many values the whole run has of each */
};

/* Serve the prefix; keep the latencies that are the whole run's. 0 or -1 (not known). */
static int serve_prefix(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                        const struct plan_job *j, struct known *k) {
  struct plan_argv av;
  plan_job_argv(o, hw_name, w, j, NULL, &av);
  struct run_args whole, pre;
  struct ferry_engine_request *reqs = NULL;
  int64_t n = 0;
  struct plan_served s = {0};
  int rc = -1;
  if (run_parse(av.n, av.v, "sim", &whole) != 0) return -1;
  pre = whole;
  if (run_load_requests(&whole, &reqs, &n) != FERRY_OK || n <= j->prefix) goto out;
  for (int64_t q = 0; q < n; q++) {
    k->total[0]++, k->total[2]++;
    k->total[1] += reqs[q].output_tokens > 1;
  }
  /* the first rows of the slice, with the whole slice's KV capacity */
  pre.max_requests = pre.trace_opts.max_requests = j->prefix;
  pre.max_seq_tokens = pre.ec.max_seq_tokens = whole.ec.max_seq_tokens;
  struct ferry_serve_summary sum;
  pre.summary_out = &sum;
  pre.on_served = plan_on_served;
  pre.served_user = &s;
  if (run_execute(&pre) != 0 || s.oom || s.n == 0 || s.n >= (size_t)n) goto out;
  /* the prefix is reqs[0, s.n) (the slice in arrival order, the same rows kept); the next
   * request arrives at `cut` on the engine's clock, as the engine scales it */
  int64_t cut;
  if (ferry__scale_ns(reqs[s.n].arrival_ns, pre.time_scale, &cut) != FERRY_OK) goto out;
  for (int m = 0; m < 3; m++)
    if (!(k->v[m] = ferry__calloc(s.n, sizeof *k->v[m]))) goto out; /* at most one value a request */
  for (size_t q = 0; q < s.n; q++) {
    struct ferry__request_latency l;
    if (s.finish[q] > cut || !ferry__request_latency(s.arrival[q], s.first[q], s.finish[q], s.output[q], &l)) continue;
    const double v[3] = {l.ttft_ns, l.tpot_ns, l.e2e_ns};
    for (int m = 0; m < 3; m++)
      if (m != 1 || l.has_tpot) k->v[m][k->n[m]++] = v[m];
  }
  rc = 0;
out:
  ferry_free(reqs);
  plan_served_free(&s);
  return rc;
}

int plan_floor_prove(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                     const struct plan_job *j, struct plan_result *r) {
  struct known k = {0};
  const int ok = serve_prefix(o, hw_name, w, j, &k) == 0;
  int proven = 0;
  if (ok) {
    memset(r, 0, sizeof *r);
    double *stat[3] = {r->ttft, r->tpot, r->e2e};
    static const double pct[] = {50, 90, 99};
    for (int m = 0; m < 3; m++) {
      stat[m][0] = ferry_plan_mean_floor(k.v[m], k.n[m], k.total[m]);
      for (int p = 0; p < 3; p++) stat[m][p + 1] = ferry_plan_percentile_floor(k.v[m], k.n[m], k.total[m], pct[p]);
    }
    /* judged as a complete, stable run with these latencies: what the whole run's, each at
     * least as high, would be judged if it is complete and stable */
    r->ok = 1;
    r->requests = r->done = (int64_t)k.total[0];
    r->floor_proven = 1;
    r->proven_by = (int64_t)k.n[0];
    char why[256];
    double excess = 0;
    plan_meets_slo(o, r, why, sizeof why, &excess);
    proven = excess >= FERRY_PLAN_FLOOR_MISS;
  }
  for (int m = 0; m < 3; m++) ferry_free(k.v[m]);
  return proven;
}
