/* Distributions and per-step series of a report: the latency CDF of every run (TTFT, TPOT and
 * end-to-end, from the per-request values load.c computed once), and for the memory section's
 * run its batch size and KV-cache tokens over time (steps.batch, steps.kv_tokens). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "reports/report_internal.h"

#define NOMEM(rp) ferry__err_set(&(rp)->err, FERRY_ERR_NOMEM, "report: out of memory")
#define CDF_RUNS 10     /* lines per panel; the others are named as left out */
#define CDF_POINTS 400  /* points per line at most (order statistics, evenly spaced) */
#define STEP_POINTS 2000

static int usable(const struct rrun *r) { return r->complete && r->n_req > 0; }

ferry_status ferry__section_latency(struct report *rp) {
  size_t n = 0;
  for (size_t i = 0; i < rp->n_runs; i++) n += usable(&rp->runs[i]) && rp->runs[i].n_lat[2] > 0;
  if (!n) return FERRY_OK;
  ferry__doc_section(rp, FERRY_REPORT_LATENCY, "Latency distributions");
  ferry__doc_para(rp, "The share of requests served within a latency, per run (empirical CDF): time to first token, "
                      "time per output token (requests with more than one output token) and end-to-end latency. A "
                      "line further left is faster; its spread is the tail. The values behind the percentiles of the "
                      "other sections.");
  struct ferry_strbuf s = {0}, left = {0};
  struct rtable *t = ferry__table_new("latency_cdf", "run" SEP "metric" SEP "fraction" SEP "latency (ms)");
  if (!t) return NOMEM(rp);
  size_t shown = 0;
  const struct rrun *runs[CDF_RUNS];
  double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {0, 0, 0};
  for (size_t i = 0; i < rp->n_runs; i++) {
    const struct rrun *r = &rp->runs[i];
    if (!usable(r) || r->n_lat[2] <= 0) continue;
    /* every run's values go to the CSV; the first CDF_RUNS are drawn */
    for (int m = 0; m < 3; m++) {
      static const char *const mname[3] = {"ttft", "tpot", "e2e"};
      const int64_t k = r->n_lat[m];
      const int64_t stride = k > CDF_POINTS ? (k + CDF_POINTS - 1) / CDF_POINTS : 1;
      for (int64_t j = 0; j < k; j += stride)
        ferry__table_rowf(t, "%s" SEP "%s" SEP "%.6f" SEP "%.9g", r->label, mname[m], (double)(j + 1) / (double)k,
                          r->lat[m][j]);
    }
    if (shown == CDF_RUNS) {
      ferry__sb_printf(&left, "%s%s", left.len ? ", " : "", r->label);
      continue;
    }
    runs[shown] = r;
    for (int m = 0; m < 3; m++) {
      ferry__sb_printf(&s, "$r%zum%d << EOD\n", shown, m);
      const int64_t k = r->n_lat[m];
      const int64_t stride = k > CDF_POINTS ? (k + CDF_POINTS - 1) / CDF_POINTS : 1;
      for (int64_t j = 0; j < k; j += stride) {
        const double v = r->lat[m][j];
        if (!isfinite(v)) continue;
        ferry__sb_printf(&s, "%.9g %.6f\n", v, (double)(j + 1) / (double)k);
        if (v > 0 && v < lo[m]) lo[m] = v;
        if (v > hi[m]) hi[m] = v;
      }
      /* the last value ends at 1 even when the stride skipped it */
      if (k > 0 && isfinite(r->lat[m][k - 1])) ferry__sb_printf(&s, "%.9g 1\n", r->lat[m][k - 1]);
      ferry__sb_puts(&s, "EOD\n");
    }
    shown++;
  }
  char labels[CDF_RUNS][160];
  ferry__run_labels(rp, runs, shown, labels);
  /* the legend below the panels: over a CDF it would hide the tails */
  ferry__sb_puts(&s, "set multiplot layout 1,3 margins 0.06,0.98,0.40,0.93 spacing 0.07\nset yrange [0:1]\n"
                     "set ytics 0.25\nset grid\nset key at screen 0.5,0.01 center bottom vertical maxrows 5 "
                     "width 2 font ',9'\nset xtics rotate by -30\n");
  static const char *const title[3] = {"Time to first token", "Time per output token", "End-to-end latency"};
  for (int m = 0; m < 3; m++) {
    ferry__gp_set(&s, "title", "%s", title[m]);
    /* requests spread over decades (a queue building up): a logarithmic axis keeps both ends */
    const int log_x = hi[m] > 0 && lo[m] < INFINITY && hi[m] / lo[m] >= 100.0;
    ferry__sb_puts(&s, log_x ? "set logscale x\n" : "unset logscale x\n");
    /* seconds past 10 s, as the other sections show times */
    const int secs = hi[m] >= 10000;
    ferry__gp_set(&s, "xlabel", "%s (%s%s)", m == 1 ? "TPOT" : "latency", secs ? "s" : "ms", log_x ? ", log scale" : "");
    ferry__gp_set(&s, "ylabel", "share of requests");
    if (m) ferry__sb_puts(&s, "unset key\n");
    ferry__sb_puts(&s, "plot ");
    for (size_t i = 0; i < shown; i++) {
      ferry__sb_printf(&s, "%s$r%zum%d using ($1*%g):2 with steps lt %zu lw 1.5 title ", i ? ", " : "", i, m,
                       secs ? 1e-3 : 1.0, i + 1);
      ferry__gp_str(&s, labels[i]);
    }
    ferry__sb_puts(&s, "\n");
  }
  ferry__sb_puts(&s, "unset multiplot\n");
  ferry_status st = FERRY_OK;
  if (s.oom || left.oom) {
    st = NOMEM(rp);
  } else {
    char cap[2048];
    snprintf(cap, sizeof cap, "Latency distribution of each run (share of requests within a latency).%s%s%s",
             left.len ? " Not drawn (more than " : "", left.len ? "ten runs; their values are in latency_cdf.csv): " : "",
             left.len ? left.p : "");
    st = ferry__emit_plot(rp, "latency_cdf", cap, 1200, 620, s.p);
  }
  if (st == FERRY_OK) {
    st = ferry__emit_csv(rp, t);
    ferry__sb_puts(&rp->html, "<p>Every run's distribution: <a href=\"tables/latency_cdf.csv\">latency_cdf.csv</a>.</p>\n");
    ferry__sb_puts(&rp->md, "Every run's distribution: [tables/latency_cdf.csv](tables/latency_cdf.csv).\n\n");
  }
  ferry__sb_free(&s);
  ferry__sb_free(&left);
  ferry__table_free(t);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}

ferry_status ferry__plot_batch_kv(struct report *rp, const struct rrun *r) {
  sqlite3 *db = ferry__run_db(rp, r);
  sqlite3_stmt *q = NULL;
  /* kv_tokens came with schema version 5 */
  const int has_kv =
      sqlite3_prepare_v2(db, "SELECT kv_tokens FROM steps LIMIT 0", -1, &q, NULL) == SQLITE_OK;
  sqlite3_finalize(q);
  q = NULL;
  if (sqlite3_prepare_v2(db,
                         has_kv ? "SELECT start_ns, end_ns, batch, kv_tokens FROM steps WHERE runId = ? ORDER BY start_ns"
                                : "SELECT start_ns, end_ns, batch, NULL FROM steps WHERE runId = ? ORDER BY start_ns",
                         -1, &q, NULL) != SQLITE_OK)
    return ferry__err_set(&rp->err, FERRY_ERR_DB, "report: reading steps: %s", sqlite3_errmsg(db));
  sqlite3_bind_int64(q, 1, r->id);
  struct ferry_strbuf b = {0}, k = {0};
  int64_t t0 = 0, tend = 0, n = 0, nkv = 0;
  double kv_max = 0, batch_max = 0;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const int64_t start = sqlite3_column_int64(q, 0), end = sqlite3_column_int64(q, 1);
    if (!n) t0 = start;
    tend = end > tend ? end : tend;
    n++;
    if (n > STEP_POINTS * 4) continue; /* a long run: the first steps stand for it (said below) */
    const double x = ferry__span(t0, start) / 1e9, batch = (double)sqlite3_column_int64(q, 2);
    ferry__sb_printf(&b, "%.9f %.9g\n", x, batch);
    batch_max = fmax(batch_max, batch);
    if (sqlite3_column_type(q, 3) != SQLITE_NULL) {
      const double kv = (double)sqlite3_column_int64(q, 3);
      ferry__sb_printf(&k, "%.9f %.9g\n", x, kv);
      kv_max = fmax(kv_max, kv);
      nkv++;
    }
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE) {
    ferry__sb_free(&b);
    ferry__sb_free(&k);
    return ferry__err_set(&rp->err, FERRY_ERR_DB, "report: reading steps: %s", sqlite3_errmsg(db));
  }
  ferry_status st = FERRY_OK;
  if (n) {
    struct ferry_strbuf s = {0};
    const double span = ferry__span(t0, tend) / 1e9;
    ferry__sb_printf(&s, "$b << EOD\n%s%.9f %.9g\nEOD\n", b.p ? b.p : "", span, 0.0);
    if (nkv) ferry__sb_printf(&s, "$k << EOD\n%s%.9f 0\nEOD\n", k.p, span);
    ferry__sb_printf(&s, "set multiplot layout %d,1\nset xlabel 'time since the first step (s)'\nset yrange [0:*]\n"
                         "set key top right\n",
                     nkv ? 2 : 1);
    ferry__gp_set(&s, "title", "Batch size per step, run %s", r->label);
    ferry__sb_puts(&s, "set ylabel 'sequences'\nplot $b using 1:2 with steps lt 1 lw 1.5 title 'batch'\n");
    if (nkv) {
      ferry__gp_set(&s, "title", "KV cache in use at each step's end, run %s", r->label);
      ferry__sb_puts(&s, "set ylabel 'tokens'\n");
      if (r->kv_capacity > 0) ferry__sb_printf(&s, "set yrange [0:%.9g]\n", r->kv_capacity * 1.08);
      ferry__sb_puts(&s, "plot $k using 1:2 with steps lt 2 lw 1.5 title 'KV tokens'");
      if (r->kv_capacity > 0) ferry__sb_printf(&s, ", %.9g with lines lt 2 dt 2 title 'capacity'", r->kv_capacity);
      ferry__sb_puts(&s, "\n");
    }
    ferry__sb_puts(&s, "unset multiplot\n");
    char kvtext[160] = "", cap[512];
    if (nkv && r->kv_capacity > 0)
      snprintf(kvtext, sizeof kvtext, "; peak KV %.0f of %.0f tokens, %.0f%%", kv_max, r->kv_capacity,
               100.0 * kv_max / r->kv_capacity);
    else if (!nkv)
      snprintf(kvtext, sizeof kvtext, "; KV use not recorded by this database's version");
    snprintf(cap, sizeof cap, "Sequences batched in each engine step%s of run %s (%lld steps%s; peak batch %.0f%s).",
             nkv ? " and the KV-cache tokens they hold" : "", r->label, (long long)n,
             n > STEP_POINTS * 4 ? ", the first 8000 drawn" : "", batch_max, kvtext);
    st = s.oom || b.oom || k.oom ? NOMEM(rp) : ferry__emit_plot(rp, "batch_kv", cap, 1100, nkv ? 560 : 300, s.p);
    ferry__sb_free(&s);
  }
  ferry__sb_free(&b);
  ferry__sb_free(&k);
  return st;
}
