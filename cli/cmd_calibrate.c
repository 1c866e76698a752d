/* `ferry calibrate`: measure this machine for the host executor (--probe), or fit a hardware
 * profile's costs to the op durations recorded in a run's timeline (--db), so `ferry sim`
 * prices ops by measured rates. */
#include <getopt.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/calib_overlap.h"
#include "cli/calib_wake.h"
#include "cli/cli.h"
#include "common/alloc.h"
#include "common/checked.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/sqlite_read.h"
#include "ferry/db.h"
#include "ferry/calibrate.h"
#include "ferry/hw.h"

#define MAX_FIT_RUNS 256

/* The runs one fit pools. Each run's timeline starts afresh (timestamps are run-relative), so
 * what matches ops in time (copies beside kernels, waits inside layers, consecutive steps) is
 * matched within a run; the samples of all of them then go into one fit. */
struct fit_runs {
  int64_t id[MAX_FIT_RUNS];
  size_t n;
};

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry calibrate --probe --out PROFILE.json [--dir DIR]\n"
          "       ferry calibrate --db RUN.db --run N[,N...]|all --base PROFILE --out FITTED.json\n"
          "Make a hardware profile from measurements.\n\n"
          "  --probe          measure this machine through the host executor: copy bandwidth and\n"
          "                   latency, O_DIRECT read bandwidth and latency (a 256 MiB scratch file in\n"
          "                   DIR, default .), and the cost of every kernel kind at engine shapes\n"
          "  --db RUN.db      fit costs to the timeline of a recorded run (host, cuda or an nsys import):\n"
          "                   per kernel kind, duration = overhead + bytes x a + flops x b, or + max(...),\n"
          "                   whichever fits better (relative least squares, coefficients >= 0); copies and\n"
          "                   disk reads: latency + bytes / rate; link.contention (a kernel's extra time per ns\n"
          "                   of a copy beside it) from kernels of one shape run with and without a copy\n"
          "                   beside them, and taken out of the kernel costs (else the base profile's); a\n"
          "                   timeline of CUDA's kernels (run --profile, an nsys import) has no ferry kinds\n"
          "                   or sizes: its copies, launches and host times are fitted, its kernels not;\n"
          "                   from host-executor runs also host.event_wake_ns (a queue blocked in a wait\n"
          "                   running on after the event: the median over the runs' waits)\n"
          "  --run N[,N...]|all\n"
          "                   the run(s) in RUN.db, or all of them: several runs of one executor are fitted\n"
          "                   together, their ops as one sample (a machine's pace varies from run to run;\n"
          "                   one run's fit carries that run's pace into every simulation); repeatable\n"
          "  --base PROFILE   the profile whose other figures the fitted one keeps (ferry hw list)\n"
          "  --out FILE       where to write the profile (JSON, the catalogue format)\n");
}

/* A timeline row worth fitting: the database is untrusted, so sizes must be finite and not
 * negative and durations positive (an inf or NaN would poison the whole fit). */
static int usable_sample(double bytes, double flops, double dur_ns) {
  return isfinite(bytes) && isfinite(flops) && isfinite(dur_ns) && bytes >= 0 && flops >= 0 && dur_ns > 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Medians of one column of a query's rows: durations, so values that are not finite or are
 * negative (a crafted database) are left out. NAN when none. */
static double median_of(sqlite3 *db, const char *sql, const struct fit_runs *runs, size_t *n_out) {
  sqlite3_stmt *q = NULL;
  *n_out = 0;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) return NAN;
  double *v = NULL;
  size_t n = 0, cap = 0;
  int nomem = 0;
  for (size_t r = 0; r < runs->n && !nomem; r++) {
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, runs->id[r]);
    while (sqlite3_step(q) == SQLITE_ROW) {
      double *nv = cli_room(v, &cap, n, sizeof *v, 256);
      if (!nv) {
        nomem = 1;
        break;
      }
      v = nv;
      const double x = sqlite3_column_double(q, 0);
      if (isfinite(x) && x >= 0) v[n++] = x;
    }
  }
  sqlite3_finalize(q);
  double med = NAN;
  if (n) {
    qsort(v, n, sizeof *v, cmp_double); /* a database may hold millions of calls */
    med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  ferry_free(v);
  *n_out = n;
  return med;
}

struct span {
  int64_t start, end;
  int32_t layer;
};

static int cmp_span(const void *a, const void *b) {
  const struct span *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* Rows of a query (start, end[, layer]) as spans sorted by start; *n 0 when none. */
static ferry_status spans_of(sqlite3 *db, const char *sql, int64_t run, struct span **out, size_t *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) return FERRY_OK;
  sqlite3_bind_int64(q, 1, run);
  size_t cap = 0;
  struct span *v = NULL;
  while (sqlite3_step(q) == SQLITE_ROW) {
    struct span *nv = cli_room(v, &cap, *n, sizeof *v, 1024);
    if (!nv) {
      sqlite3_finalize(q);
      ferry_free(v);
      *n = 0;
      return ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
    }
    v = nv;
    const int64_t start = sqlite3_column_int64(q, 0), end = sqlite3_column_int64(q, 1);
    const int64_t layer = sqlite3_column_count(q) > 2 ? sqlite3_column_int64(q, 2) : -1;
    if (end < start) continue; /* a crafted row: a range that ends before it starts */
    v[(*n)++] = (struct span){start, end, layer >= 0 && layer <= INT32_MAX ? (int32_t)layer : -1};
  }
  sqlite3_finalize(q);
  if (*n) qsort(v, *n, sizeof *v, cmp_span);
  *out = v;
  return FERRY_OK;
}

/* The host time of layer ranges beyond their ops, over every run fitted. */
struct layer_fit {
  double *extra;
  size_t n;
};

/* Per layer range of one run: its duration, less the host waits inside it, less its ops' issue
 * costs (the ops of a layer, on average over the run: kernels and copies tagged with it / its
 * ranges), appended to out. */
static ferry_status layer_extra(sqlite3 *db, int64_t run, double per_kernel, double per_copy, struct layer_fit *out) {
  struct span *layers = NULL, *waits = NULL;
  size_t nl = 0, nw = 0;
  ferry_status st = spans_of(db, "SELECT start, end, layer FROM NVTX_EVENTS WHERE runId = ?1 AND text = 'layer'", run,
                             &layers, &nl);
  if (st == FERRY_OK)
    st = spans_of(db, "SELECT start, end FROM NVTX_EVENTS WHERE runId = ?1 AND text = 'host wait'", run, &waits, &nw);
  int32_t max_layer = -1;
  for (size_t i = 0; i < nl; i++)
    if (layers[i].layer > max_layer) max_layer = layers[i].layer;
  double *ops = NULL, *extra = NULL;
  int64_t *ranges = NULL;
  if (st != FERRY_OK || nl < 3 || max_layer < 0 || max_layer > 100000) goto out;
  ops = ferry__calloc((size_t)max_layer + 1, sizeof *ops);
  ranges = ferry__calloc((size_t)max_layer + 1, sizeof *ranges);
  extra = ferry__reallocarray(out->extra, out->n + nl, sizeof *extra);
  if (extra) out->extra = extra;
  if (!ops || !ranges || !extra) {
    st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
    goto out;
  }
  static const char *const count_sql[2] = {
      "SELECT layer, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId = ?1 AND layer IS NOT NULL GROUP BY layer",
      "SELECT layer, COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId = ?1 AND layer IS NOT NULL GROUP BY layer"};
  for (int c = 0; c < 2; c++) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, count_sql[c], -1, &q, NULL) != SQLITE_OK) continue;
    sqlite3_bind_int64(q, 1, run);
    while (sqlite3_step(q) == SQLITE_ROW) {
      int64_t l = sqlite3_column_int64(q, 0);
      if (l >= 0 && l <= max_layer) ops[l] += (double)sqlite3_column_int64(q, 1) * (c ? per_copy : per_kernel);
    }
    sqlite3_finalize(q);
  }
  for (size_t i = 0; i < nl; i++)
    if (layers[i].layer >= 0) ranges[layers[i].layer]++;
  size_t w = 0;
  for (size_t i = 0; i < nl; i++) {
    const struct span *l = &layers[i];
    while (w < nw && waits[w].end <= l->start) w++;
    double waited = 0;
    for (size_t k = w; k < nw && waits[k].start < l->end; k++)
      if (waits[k].start >= l->start && waits[k].end <= l->end) waited += ferry__span(waits[k].start, waits[k].end);
    double issue = l->layer >= 0 && ranges[l->layer] ? ops[l->layer] / (double)ranges[l->layer] : 0;
    out->extra[out->n++] = ferry__span(l->start, l->end) - waited - issue;
  }
out:
  ferry_free(ops);
  ferry_free(ranges);
  ferry_free(layers);
  ferry_free(waits);
  return st;
}

/* The executor the runs were recorded on ("" where the database does not say); an error when
 * they differ (one executor's fit cannot describe another's ops) or a run is not there. */
static ferry_status runs_kind(sqlite3 *db, const char *db_path, const struct fit_runs *runs, char *kind, size_t cap) {
  sqlite3_stmt *q = NULL;
  kind[0] = '\0';
  if (sqlite3_prepare_v2(db, "SELECT COALESCE(kind, '') FROM runs WHERE id = ?1", -1, &q, NULL) != SQLITE_OK)
    return FERRY_OK; /* an import without a runs table */
  ferry_status st = FERRY_OK;
  for (size_t r = 0; r < runs->n && st == FERRY_OK; r++) {
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, runs->id[r]);
    if (sqlite3_step(q) != SQLITE_ROW) {
      st = ferry__fail(FERRY_ERR_NOT_FOUND, "%s: no run %lld", db_path, (long long)runs->id[r]);
      break;
    }
    char k[16];
    snprintf(k, sizeof k, "%s", sqlite3_column_text(q, 0) ? (const char *)sqlite3_column_text(q, 0) : "");
    cli_scrub(k); /* it goes into a message */
    if (r == 0) snprintf(kind, cap, "%s", k);
    else if (strcmp(kind, k))
      st = ferry__fail(FERRY_ERR_INVALID, "%s: run %lld was recorded on the %s executor, run %lld on %s: fit runs of one "
                                          "executor together", db_path, (long long)runs->id[0], kind[0] ? kind : "(unknown)",
                       (long long)runs->id[r], k[0] ? k : "(unknown)");
  }
  sqlite3_finalize(q);
  return st;
}

/* The sum over the runs of sql's one number for run ?1 (how much of the runs' time a fit covers);
 * nonzero when the statement does not prepare (the table is missing). */
static int sum_over_runs(sqlite3 *db, const char *sql, const struct fit_runs *runs, double *total) {
  sqlite3_stmt *q = NULL;
  *total = 0;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) return -1;
  for (size_t r = 0; r < runs->n; r++) {
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, runs->id[r]);
    if (sqlite3_step(q) == SQLITE_ROW) *total += sqlite3_column_double(q, 0);
  }
  sqlite3_finalize(q);
  return 0;
}

/* runtime.step_ns and row_ns: the gaps between steps while requests were in flight, fitted
 * against the batch. A database without engine steps (an import) leaves them as they are. */
static ferry_status fit_step_gaps(sqlite3 *db, const struct fit_runs *runs, struct ferry_hw_profile *p,
                                  const char **fitted, size_t *n_fitted, int *weak) {
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT s.batch, n.start_ns - s.end_ns FROM steps s JOIN steps n ON n.runId = s.runId AND "
                         "n.step = s.step + 1 WHERE s.runId = ?1 AND EXISTS (SELECT 1 FROM requests r WHERE r.runId = "
                         "s.runId AND r.arrival_ns <= s.end_ns AND r.finish_ns > s.end_ns) LIMIT 200000",
                         -1, &q, NULL) != SQLITE_OK)
    return FERRY_OK; /* an import without engine steps: nothing more to fit */
  struct ferry_calib_sample *v = NULL;
  size_t n = 0, cap = 0;
  double gaps_ns = 0;
  for (size_t r = 0; r < runs->n; r++) {
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, runs->id[r]);
    while (sqlite3_step(q) == SQLITE_ROW) {
      struct ferry_calib_sample *nv = cli_room(v, &cap, n, sizeof *v, 256);
      if (!nv) {
        sqlite3_finalize(q);
        ferry_free(v);
        return ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
      }
      v = nv;
      const double batch = (double)sqlite3_column_int64(q, 0), gap = (double)sqlite3_column_int64(q, 1);
      if (batch < 0 || gap < 0) continue; /* a crafted row: steps overlap, or a negative batch */
      v[n++] = (struct ferry_calib_sample){batch, 0, gap};
      gaps_ns += gap;
    }
  }
  sqlite3_finalize(q);
  /* the gaps' share of the runs' time says how much a weak fit of them matters */
  double span_ns = 0;
  (void)sum_over_runs(db, "SELECT COALESCE(MAX(end_ns) - MIN(start_ns), 0) FROM steps WHERE runId = ?1", runs,
                      &span_ns); /* failing, it leaves span_ns 0: no share shown */
  const double share_pct = span_ns > 0 ? 100.0 * gaps_ns / span_ns : 0;
  if (n >= 3) {
    struct ferry_hw_cost f;
    double r2 = 0;
    ferry_calibrate_fit(v, n, &f, &r2);
    p->runtime.step_ns = ferry__f64_to_i64(round(f.overhead_ns));
    p->runtime.row_ns = ferry__f64_to_i64(round(f.ns_per_byte));
    fitted[(*n_fitted)++] = "runtime.step_ns";
    fitted[(*n_fitted)++] = "runtime.row_ns";
    printf("%-12s %6zu gaps: %lld ns + %lld ns per sequence (R^2 %.3f; %.1f %% of the runs' time)\n", "step", n,
           (long long)p->runtime.step_ns, (long long)p->runtime.row_ns, r2, share_pct);
    /* a constant is no worse a description when the gaps barely vary: judge the fit by its
     * error then, not by R^2 */
    if (r2 < FERRY_HW_FIT_R2_MIN && f.ns_per_byte > 0) {
      fprintf(stderr,
              "ferry: warning: the step fit explains little of the gaps between steps (R^2 %.3f < %.1f; the gaps "
              "are %.1f %% of the runs' time)\n",
              r2, FERRY_HW_FIT_R2_MIN, share_pct);
      (*weak)++;
    }
  }
  ferry_free(v);
  return FERRY_OK;
}

/* The software's host costs (the profile's runtime section) from the run's timeline:
 * - step_ns + row_ns x batch: the gaps between one engine step and the next while requests were
 *   in flight (sampling, bookkeeping, admission), fitted by least squares;
 * - launch_ns, copy_ns: the median duration of the CUDA runtime's launch and copy calls, where
 *   the timeline has them (CUPTI, nsys imports); else the base profile's;
 * - layer_ns: the median host time of a layer range beyond its ops' issue costs (host.submit_ns
 *   and launch_ns / copy_ns each) and the host's waits inside it ("host wait" ranges);
 * - host.event_wake_ns, for host-executor runs: the median time from an event's completion to the
 *   queue that was blocked waiting for it running on (calib_wake.h).
 * The quality of each fit is printed; a step fit with R^2 < FERRY_HW_FIT_R2_MIN is warned of. */
static ferry_status fit_runtime(sqlite3 *db, const struct fit_runs *runs, const char *kind, struct ferry_hw_profile *p,
                                const char **fitted, size_t *n_fitted, int *weak) {
  if (!p->has_runtime) {
    memset(&p->runtime, 0, sizeof p->runtime);
    p->has_runtime = 1;
  }
  /* ferry's own executors expand quantized weights before multiplying */
  if (!strcmp(kind, "host") || !strcmp(kind, "cuda")) {
    p->runtime.fused_dequant = 0;
    p->runtime.act_bytes = p->runtime.dequant_bytes = 4; /* and compute in fp32 */
  }
  snprintf(p->runtime.name, sizeof p->runtime.name, "fitted to a %s run", kind[0] ? kind : "recorded");
  /* CUDA runtime calls, where recorded */
  size_t n_launch = 0, n_copy = 0;
  double launch = median_of(db,
                            "SELECT r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds n ON n.id = r.nameId "
                            "WHERE r.runId = ?1 AND n.value LIKE 'cudaLaunchKernel%'",
                            runs, &n_launch);
  double copy = median_of(db,
                          "SELECT r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds n ON n.id = r.nameId "
                          "WHERE r.runId = ?1 AND n.value LIKE 'cudaMemcpyAsync%'",
                          runs, &n_copy);
  if (n_launch >= 3) {
    p->runtime.launch_ns = ferry__f64_to_i64(round(launch));
    fitted[(*n_fitted)++] = "runtime.launch_ns";
    printf("%-12s %6zu calls: %.0f ns per kernel launch (median)\n", "launch", n_launch, launch);
  }
  if (n_copy >= 3) {
    p->runtime.copy_ns = ferry__f64_to_i64(round(copy));
    fitted[(*n_fitted)++] = "runtime.copy_ns";
    printf("%-12s %6zu calls: %.0f ns per copy issue (median)\n", "copy issue", n_copy, copy);
  }
  ferry_status st = fit_step_gaps(db, runs, p, fitted, n_fitted, weak);
  if (st != FERRY_OK) return st;
  /* layers: host time beyond issuing their ops and waiting */
  struct layer_fit lf = {NULL, 0};
  for (size_t r = 0; r < runs->n && st == FERRY_OK; r++)
    st = layer_extra(db, runs->id[r], (double)(p->host.submit_ns + p->runtime.launch_ns),
                     (double)(p->host.submit_ns + p->runtime.copy_ns), &lf);
  if (st == FERRY_OK && lf.n >= 3) {
    qsort(lf.extra, lf.n, sizeof *lf.extra, cmp_double);
    const double median = lf.n % 2 ? lf.extra[lf.n / 2] : (lf.extra[lf.n / 2 - 1] + lf.extra[lf.n / 2]) / 2;
    p->runtime.layer_ns = median > 0 ? ferry__f64_to_i64(round(median)) : 0;
    fitted[(*n_fitted)++] = "runtime.layer_ns";
    printf("%-12s %6zu layers: %lld ns of host work per layer beyond issuing its ops and waiting (median)\n", "layer",
           lf.n, (long long)p->runtime.layer_ns);
  }
  ferry_free(lf.extra);
  /* the host executor's queues: how long one blocked in a wait takes to run on */
  if (st == FERRY_OK && p->has_host && !strcmp(kind, "host")) {
    double wake_ns = 0;
    size_t n_waits = 0;
    st = calib_event_wake(db, runs->id, runs->n, &wake_ns, &n_waits);
    if (st == FERRY_OK && n_waits >= CALIB_WAKE_MIN_WAITS) {
      p->host.event_wake_ns = ferry__f64_to_i64(round(wake_ns));
      fitted[(*n_fitted)++] = "host.event_wake_ns";
      printf("%-12s %6zu waits: %lld ns from the event to the waiting queue running on (median)\n", "event wake",
             n_waits, (long long)p->host.event_wake_ns);
    }
  }
  return st;
}

/* The kernel cost of each kind: least squares over the run's kernels of that kind (above or below
 * the GEMM intensity where the kind has a _gemm variant), each without the time the copies
 * issued before it took from it (p->link.contention x their overlap: what the simulator charges
 * on top of the cost). s holds up to cap samples. */
static ferry_status fit_kernels(sqlite3 *db, const char *db_path, const struct fit_runs *runs,
                                const struct calib_copies *copies, struct ferry_calib_sample *s, size_t cap,
                                struct ferry_hw_profile *p, int *any, int *weak) {
  /* Each kind's share of the kernel time says how much a weak fit matters: a gather of a few
   * rows explained badly moves no simulated figure, an expert product does. */
  double total_ns = 0;
  if (sum_over_runs(db,
                    "SELECT TOTAL(CASE WHEN end > start THEN end - start ELSE 0 END) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                    "WHERE runId = ?1",
                    runs, &total_ns))
    return ferry__fail(FERRY_ERR_DB, "%s: not a ferry result database with a timeline (%s)", db_path,
                       sqlite3_errmsg(db));
  for (int kind = 0; kind < FERRY_HW_COST_KINDS; kind++) {
    /* "<kind>_gemm" takes the ops of <kind> above the GEMM intensity; <kind> the rest */
    const char *name = ferry_hw_cost_kind_name(kind);
    char kind_base[32];
    snprintf(kind_base, sizeof kind_base, "%s", name);
    char *suffix = strstr(kind_base, "_gemm");
    const int gemm_kind = suffix != NULL;
    if (suffix) *suffix = '\0';
    char gemm_name[40];
    snprintf(gemm_name, sizeof gemm_name, "%s_gemm", kind_base);
    int has_gemm_variant = 0;
    for (int j = 0; j < FERRY_HW_COST_KINDS; j++) has_gemm_variant |= !strcmp(ferry_hw_cost_kind_name(j), gemm_name);
    sqlite3_stmt *q = NULL;
    const char *sql =
        "SELECT k.bytes, k.flops, k.end - k.start, k.start, k.end, COALESCE(k.correlationId, 0) FROM "
        "CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON n.id = k.shortName WHERE k.runId = ?1 AND n.value = ?2 "
        "LIMIT 200000";
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) {
      return ferry__fail(FERRY_ERR_DB, "%s: not a ferry result database with a timeline (%s)", db_path,
                         sqlite3_errmsg(db));
    }
    sqlite3_bind_text(q, 2, kind_base, -1, SQLITE_TRANSIENT);
    size_t n = 0;
    double kind_ns = 0; /* as measured, before the contention comes out */
    for (size_t r = 0; r < runs->n; r++) {
      sqlite3_reset(q);
      sqlite3_bind_int64(q, 1, runs->id[r]);
      while (sqlite3_step(q) == SQLITE_ROW && n < cap) {
        double bytes = (double)sqlite3_column_int64(q, 0), flops = sqlite3_column_double(q, 1);
        double dur = (double)sqlite3_column_int64(q, 2);
        if (!usable_sample(bytes, flops, dur)) continue;
        const double measured_ns = dur;
        if (p->link.contention > 0) {
          double all, before;
          calib_overlap(&copies[r], sqlite3_column_int64(q, 3), sqlite3_column_int64(q, 4), sqlite3_column_int64(q, 5),
                        &all, &before);
          dur -= p->link.contention * before;
        }
        int is_gemm = bytes > 0 && flops / bytes > FERRY_HW_GEMM_INTENSITY;
        if (has_gemm_variant && is_gemm != gemm_kind) continue;
        s[n++] = (struct ferry_calib_sample){bytes, flops, dur};
        kind_ns += measured_ns;
      }
    }
    sqlite3_finalize(q);
    if (n < 3) continue;
    double r2 = 0;
    ferry_calibrate_fit(s, n, &p->cost[kind], &r2);
    p->cost[kind].r2 = r2;
    p->cost_set |= 1u << kind;
    p->has_cost = 1;
    (*any) = 1;
    const double share_pct = total_ns > 0 ? 100.0 * kind_ns / total_ns : 0;
    printf("%-12s %6zu ops: %9.0f ns + %s(%.4f ns/byte, %.5f ns/flop) (R^2 %.3f; %.1f %% of kernel time)\n", name, n,
           p->cost[kind].overhead_ns, p->cost[kind].roofline ? "max" : "sum", p->cost[kind].ns_per_byte,
           p->cost[kind].ns_per_flop, r2, share_pct);
    if (r2 < FERRY_HW_FIT_R2_MIN) {
      fprintf(stderr,
              "ferry: warning: the %s fit (%.1f %% of the kernel time measured) explains little of what was "
              "measured (R^2 %.3f < %.1f): simulated %s times may be off\n",
              name, share_pct, r2, FERRY_HW_FIT_R2_MIN, name);
      (*weak)++;
    }
  }
  return FERRY_OK;
}

/* Link and disk: latency and bandwidth fitted to the run's copies and reads. */
static void fit_copies(sqlite3 *db, const struct fit_runs *runs, struct ferry_calib_sample *s, size_t cap,
                       struct ferry_hw_profile *p, const char **fitted, size_t *n_fitted, int *any) {
  /* copies (1 = host->device, 2 = device->host) and disk reads (ferry's copy kind 100) */
  static const struct {
    int copy_kind;
    const char *name;
  } copies[] = {{1, "h2d"}, {2, "d2h"}, {100, "disk"}};
  for (int c = 0; c < 3; c++) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, "SELECT bytes, end - start FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId = ?1 AND copyKind = ?2 LIMIT 65536",
                           -1, &q, NULL) != SQLITE_OK)
      break;
    sqlite3_bind_int(q, 2, copies[c].copy_kind);
    size_t n = 0;
    for (size_t r = 0; r < runs->n; r++) {
      sqlite3_reset(q);
      sqlite3_bind_int64(q, 1, runs->id[r]);
      while (sqlite3_step(q) == SQLITE_ROW && n < cap) {
        double bytes = (double)sqlite3_column_int64(q, 0), dur = (double)sqlite3_column_int64(q, 1);
        if (usable_sample(bytes, 0, dur)) s[n++] = (struct ferry_calib_sample){bytes, 0, dur};
      }
    }
    sqlite3_finalize(q);
    if (n < 3) continue;
    struct ferry_hw_cost f;
    ferry_calibrate_fit(s, n, &f, NULL);
    if (f.ns_per_byte <= 0) {
      /* copies of about one size (an offload run streams one block size) cannot tell a fixed
       * cost from a rate, and the fit put all of the time in the fixed cost: said, not used */
      double lo = s[0].bytes, hi = s[0].bytes;
      for (size_t i = 0; i < n; i++) {
        if (s[i].bytes < lo) lo = s[i].bytes;
        if (s[i].bytes > hi) hi = s[i].bytes;
      }
      printf("%-12s %6zu ops: no rate fitted (%.0f to %.0f bytes: %s); the base's stays\n", copies[c].name, n, lo,
             hi, hi < 2 * lo ? "one size cannot tell a fixed cost from a rate" : "the fit found no cost per byte");
      continue;
    }
    (*any) = 1;
    printf("%-12s %6zu ops: latency %.0f ns, %.2f GB/s\n", copies[c].name, n, f.overhead_ns, 1.0 / f.ns_per_byte);
    if (copies[c].copy_kind == 1) {
      ferry_hw_link_set_h2d(&p->link, 1.0 / f.ns_per_byte);
      p->link.latency_ns = (int64_t)f.overhead_ns;
      fitted[(*n_fitted)++] = "link.h2d_gbps";
      fitted[(*n_fitted)++] = "link.latency_ns";
    } else if (copies[c].copy_kind == 2) {
      p->link.d2h_gbps = 1.0 / f.ns_per_byte;
      fitted[(*n_fitted)++] = "link.d2h_gbps";
    } else if (p->has_disk) {
      p->disk.read_gbps = 1.0 / f.ns_per_byte;
      p->disk.latency_ns = (int64_t)f.overhead_ns;
      fitted[(*n_fitted)++] = "disk.read_gbps";
      fitted[(*n_fitted)++] = "disk.latency_ns";
    }
  }
}

/* "1", "1,3", or appended to by a repeated --run; "all": every run in the database (filled in
 * once it is open: runs->n stays 0). Returns nonzero on a malformed list. */
static int parse_runs(const char *text, struct fit_runs *runs, int *all) {
  if (!strcmp(text, "all")) {
    *all = 1;
    return 0;
  }
  const char *p = text;
  for (;;) {
    char item[32];
    const size_t len = strcspn(p, ",");
    if (len == 0 || len >= sizeof item) return cli_usage_error("calibrate", "--run: '%s' is not a run number or list", text);
    memcpy(item, p, len);
    item[len] = '\0';
    int64_t id;
    if (cli_parse_int("--run", item, 1, INT64_MAX, &id)) return 1;
    if (runs->n == MAX_FIT_RUNS) return cli_usage_error("calibrate", "--run: at most %d runs", MAX_FIT_RUNS);
    runs->id[runs->n++] = id;
    if (!p[len]) return 0;
    p += len + 1;
  }
}

/* Every run of the database, in order (--run all). */
static ferry_status all_runs(sqlite3 *db, const char *db_path, struct fit_runs *runs) {
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, "SELECT id FROM runs ORDER BY id", -1, &q, NULL) != SQLITE_OK)
    return ferry__fail(FERRY_ERR_DB, "%s: no runs table to take all runs from (%s)", db_path, sqlite3_errmsg(db));
  int more = 0;
  while (sqlite3_step(q) == SQLITE_ROW) {
    if (runs->n == MAX_FIT_RUNS) {
      more = 1;
      break;
    }
    runs->id[runs->n++] = sqlite3_column_int64(q, 0);
  }
  sqlite3_finalize(q);
  if (more) return ferry__fail(FERRY_ERR_RANGE, "%s: more than %d runs: name the ones to fit with --run", db_path, MAX_FIT_RUNS);
  if (!runs->n) return ferry__fail(FERRY_ERR_NOT_FOUND, "%s: the database holds no runs", db_path);
  return FERRY_OK;
}

/* "1,2,3" for notes and messages. */
static void runs_text(const struct fit_runs *runs, char *out, size_t cap) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t r = 0; r < runs->n && used < cap; r++) {
    const int w = snprintf(out + used, cap - used, "%s%lld", r ? "," : "", (long long)runs->id[r]);
    if (w < 0) break;
    used += (size_t)w;
  }
}

/* What the written profile's figures rest on, as `ferry hw show` says it: the estimates and ferry
 * defaults the fit or the probe left unmeasured are named. */
static void print_written_bases(const char *out) {
  ferry_hw *hw = NULL;
  if (ferry_hw_open(&hw, out) != FERRY_OK) return; /* just written: the reader's error would be a bug */
  cli_print_bases(stdout, ferry_hw_get(hw));
  ferry_hw_close(hw);
}

static int fit_from_db(const char *db_path, struct fit_runs *runs, int all, const char *base, const char *out) {
  ferry_hw *hw = NULL;
  ferry_status st = ferry_hw_open(&hw, base);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  struct ferry_hw_profile p = *ferry_hw_get(hw);
  sqlite3 *db = NULL;
  int rc = CLI_FAIL;
  struct ferry_calib_sample *s = NULL;
  struct calib_copies *copies = NULL;
  const char *fitted[64];
  size_t n_fitted = 0;
  int weak = 0;
  char run_list[256];
  if ((st = ferry__sqlite_open_read(db_path, FERRY_DB_APPLICATION_ID, FERRY_DB_SCHEMA_VERSION, &db, NULL, NULL)) !=
      FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  if (all && (st = all_runs(db, db_path, runs)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  runs_text(runs, run_list, sizeof run_list);
  char kind[16];
  if ((st = runs_kind(db, db_path, runs, kind, sizeof kind)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  size_t cap = 200000;
  s = ferry_malloc(cap * sizeof *s);
  copies = ferry__calloc(runs->n, sizeof *copies);
  if (!s || !copies) {
    cli_fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
    goto out;
  }
  int any = 0, contention_fitted = 0;
  for (size_t r = 0; r < runs->n && st == FERRY_OK; r++) st = calib_copies_load(db, runs->id[r], &copies[r]);
  if (st != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  /* A GPU timeline recorded by CUPTI (`ferry run --profile`) or imported from Nsight Systems
   * names each kernel as CUDA does (a cuBLAS `nvjet_...`, a `rope_kernel`), without ferry's
   * kind, bytes or flops: nothing to fit a kernel cost to, and kernels of one name but many
   * shapes would make the with/without-a-copy comparison measure shapes, not contention
   * (0.80 ns per ns from an H200 run whose copies could not have slowed its kernels). Said,
   * not fitted; the copies, launches and host times still are. */
  double n_kernels = 0, n_sized = 0;
  if (!sum_over_runs(db, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId = ?1", runs, &n_kernels) &&
      !sum_over_runs(db, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId = ?1 AND (bytes > 0 OR flops > 0)",
                     runs, &n_sized) &&
      n_kernels > 0 && n_sized == 0) {
    fprintf(stderr,
            "ferry: warning: %s: the %.0f kernels of run%s %s carry no ferry kind, bytes or flops (a GPU timeline "
            "recorded by CUPTI with --profile, or an Nsight Systems import): kernel costs and link.contention are not "
            "fitted, the base profile's stay; record the run without --profile to fit them\n",
            db_path, n_kernels, runs->n > 1 ? "s" : "", run_list);
    weak++;
  } else {
    if ((st = calib_fit_contention(db, runs->id, runs->n, copies, &p, &contention_fitted)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
    if (contention_fitted) fitted[n_fitted++] = "link.contention";
    if ((st = fit_kernels(db, db_path, runs, copies, s, cap, &p, &any, &weak)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
  }
  if ((st = fit_runtime(db, runs, kind, &p, fitted, &n_fitted, &weak)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  fit_copies(db, runs, s, cap, &p, fitted, &n_fitted, &any);
  if (!any) {
    cli_fail(FERRY_ERR_NOT_FOUND, "%s: run%s %s %s no timeline rows to fit (recorded with --db?)", db_path,
             runs->n > 1 ? "s" : "", run_list, runs->n > 1 ? "have" : "has");
    goto out;
  }
  char note[512];
  snprintf(note, sizeof note, "ferry calibrate --db %s --run %s", db_path, run_list);
  snprintf(p.name, sizeof p.name, "%.50s-fitted", ferry_hw_get(hw)->name);
  if ((st = ferry_hw_write_json(&p, fitted, n_fitted, note, out)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  printf("wrote %s (fitted to run%s %s)%s\n", out, runs->n > 1 ? "s" : "", run_list,
         weak ? " (with weak fits: see the warnings)" : "");
  print_written_bases(out);
  rc = CLI_OK;
out:
  ferry_free(s);
  for (size_t r = 0; copies && r < runs->n; r++) calib_copies_free(&copies[r]);
  ferry_free(copies);
  sqlite3_close_v2(db);
  ferry_hw_close(hw);
  return rc;
}

int cmd_calibrate(int argc, char **argv) {
  static const struct option opts[] = {{"probe", no_argument, 0, 'p'},     {"out", required_argument, 0, 'o'},
                                       {"dir", required_argument, 0, 'd'}, {"db", required_argument, 0, 'b'},
                                       {"run", required_argument, 0, 'r'}, {"base", required_argument, 0, 'B'},
                                       {"help", no_argument, 0, 'h'},      {0, 0, 0, 0}};
  int probe = 0;
  const char *out = NULL, *dir = ".", *db = NULL, *base = NULL;
  struct fit_runs runs = {.n = 0};
  int all_runs_asked = 0;
  optind = 1;
  int c;
  while ((c = cli_getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case 'p': probe = 1; break;
      case 'o': out = optarg; break;
      case 'd': dir = optarg; break;
      case 'b': db = optarg; break;
      case 'r': if (parse_runs(optarg, &runs, &all_runs_asked)) return CLI_USAGE; break;
      case 'B': base = optarg; break;
      case 'h': usage(stdout); return CLI_OK;
      default: return cli_usage_error("calibrate", "invalid option");
    }
  }
  if (optind < argc) return cli_usage_error("calibrate", "unexpected argument '%s'", argv[optind]);
  if (!out) return cli_usage_error("calibrate", "missing --out FILE");
  if (probe == !!db) return cli_usage_error("calibrate", "give either --probe or --db RUN.db");
  const struct ferry_path_use paths[] = {{"--out", out, FERRY_PATH_OUT}, {"--db", db, FERRY_PATH_SQLITE}, {"--base", base, 0}};
  if (cli_check_paths("calibrate", paths, 3)) return CLI_USAGE;
  if (db) {
    if ((!runs.n && !all_runs_asked) || !base) return cli_usage_error("calibrate", "--db needs --run N and --base PROFILE");
    if (runs.n && all_runs_asked) return cli_usage_error("calibrate", "--run all names every run: give it alone");
    return fit_from_db(db, &runs, all_runs_asked, base, out);
  }
  struct ferry_hw_profile p;
  ferry_status st = ferry_calibrate_probe(dir, stderr, &p);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  static const char *const measured[] = {"gpu.mem_bw_gbps", "gpu.peak_tflops.fp32", "gpu.launch_overhead_ns",
                                         "link.h2d_gbps",   "link.d2h_gbps",        "link.latency_ns",
                                         "host.dram_gbps",  "host.cpu_gflops",      "disk.read_gbps",
                                         "disk.latency_ns", "host.submit_ns",       "host.sync_ns",
                                         "host.queue_wake_ns", "link.contention"};
  char host[64] = "this machine", note[256];
  gethostname(host, sizeof host - 1);
  snprintf(note, sizeof note, "ferry calibrate --probe on %s", host);
  if ((st = ferry_hw_write_json(&p, measured, sizeof measured / sizeof measured[0], note, out)) != FERRY_OK)
    return cli_fail(st, NULL);
  printf("memcpy %.2f GB/s (latency %lld ns), O_DIRECT reads %.2f GB/s (latency %lld ns), matmul peak %.1f GFLOP/s, "
         "op issue %lld ns, event round trip %lld ns, idle queue wake-up %lld ns, a kernel beside a copy %.3f ns "
         "slower per ns of overlap (link.contention)\n",
         p.link.h2d_gbps, (long long)p.link.latency_ns, p.disk.read_gbps, (long long)p.disk.latency_ns,
         p.host.cpu_gflops, (long long)p.host.submit_ns, (long long)p.host.sync_ns, (long long)p.host.queue_wake_ns,
         p.link.contention);
  for (int i = 0; i < FERRY_HW_COST_KINDS; i++)
    if (p.cost_set >> i & 1)
      printf("  %-12s %9.0f ns + %s(%.4f ns/byte, %.5f ns/flop) (R^2 %.3f)%s\n", ferry_hw_cost_kind_name(i),
             p.cost[i].overhead_ns, p.cost[i].roofline ? "max" : "sum", p.cost[i].ns_per_byte, p.cost[i].ns_per_flop,
             p.cost[i].r2, p.cost[i].r2 < FERRY_HW_FIT_R2_MIN ? "  weak fit" : "");
  printf("wrote %s\n", out);
  print_written_bases(out);
  return CLI_OK;
}
