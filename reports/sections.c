/* The comparison sections of a report: the run table, latency and throughput against every
 * swept parameter, bytes moved and stall time, sim against real (paired by configuration),
 * per-variant tables for quantization formats and predictors, and the hardware what-if with
 * cost per million tokens. Each builds its tables and gnuplot scripts from the loaded runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "reports/report_internal.h"

#define NOMEM(rp) ferry__err_set(&(rp)->err, FERRY_ERR_NOMEM, "report: out of memory")

/* Numbers for table cells ("" when not a number): a ring of buffers so one row can format up
 * to 16 numbers; each call advances the ring inside a function, so argument order is moot. */
struct nring {
  char b[16][32];
  unsigned i;
};
static const char *nfmt(struct nring *r, double v) {
  char *b = r->b[r->i++ % 16];
  return ferry__fmt_num(v, b, sizeof r->b[0]);
}
#define NUMBUF \
  struct nring nr_; \
  nr_.i = 0
#define N(v) nfmt(&nr_, (v))

/* Short name of a key for plot labels: initials of its words ("prefetch_depth" -> "pd"). */
static void key_abbrev(const char *key, char *out, size_t len) {
  size_t n = 0;
  int start = 1;
  for (const char *p = key; *p && n + 1 < len; p++) {
    if (*p == '_') start = 1;
    else if (start) {
      out[n++] = *p;
      start = 0;
    }
  }
  out[n] = '\0';
}

/* A value as a tick label shows: the last component of a path, and byte counts of budget
 * keys in binary units ("67108864" -> "64MiB"), so labels stay short enough not to collide. */
static void label_value(const char *key, const char *v, char *out, size_t len) {
  if (!*v) {
    snprintf(out, len, "-");
    return;
  }
  size_t vl = strlen(v);
  while (vl > 1 && v[vl - 1] == '/') vl--;
  const char *base = v;
  for (size_t i = 0; i < vl; i++)
    if (v[i] == '/' && i + 1 < vl) base = v + i + 1;
  size_t bl = (size_t)(v + vl - base);
  char *end = NULL;
  unsigned long long bytes = strtoull(v, &end, 10);
  const size_t kl = strlen(key);
  if (kl > 6 && !strcmp(key + kl - 6, "budget") && end && *end == '\0' && bytes > 0) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)bytes;
    int u = 0;
    while (x >= 1024.0 && u < 4) {
      x /= 1024.0;
      u++;
    }
    snprintf(out, len, "%.4g%s", x, unit[u]);
    return;
  }
  snprintf(out, len, "%.*s", (int)bl, base);
}

/* "r3 sim bl2 pd1": the run label and its values on the sweep axes, executor and hardware
 * first (they tell runs apart most), at most 48 characters. */
static void short_desc(const struct report *rp, const struct rrun *r, const char *skip, char *out, size_t len) {
  size_t n = (size_t)snprintf(out, len, "%s", r->label);
  char v[128], lv[128], ab[16];
  for (size_t i = 0; i < 2 * rp->n_axes && n < len; i++) {
    const size_t a = i % rp->n_axes;
    const char *k = rp->axes[a].key;
    const int first = !strcmp(k, "executor") || !strcmp(k, "hw");
    if ((i < rp->n_axes) != first) continue;
    if (skip && !strcmp(k, skip)) continue;
    ferry__run_val(r, k, v, sizeof v);
    int plain = !strcmp(k, "executor") || !strcmp(k, "hw") || !strcmp(k, "quant") || !strcmp(k, "predictor") ||
                !rp->axes[a].numeric;
    key_abbrev(k, ab, sizeof ab);
    label_value(k, v, lv, sizeof lv);
    n += (size_t)snprintf(out + n, len - n, " %s%s", plain ? "" : ab, lv);
  }
  const size_t max_label = 48;
  if (len > max_label + 1 && strlen(out) > max_label) memcpy(out + max_label - 3, "...", 4);
}

void ferry__run_short_label(const struct report *rp, const struct rrun *r, char *out, size_t len) {
  short_desc(rp, r, NULL, out, len);
}

/* "key=value, key=value" of the axes, except one. */
static void axes_desc(const struct report *rp, const struct rrun *r, const char *skip, char *out, size_t len) {
  size_t n = 0;
  out[0] = '\0';
  char v[128];
  for (size_t a = 0; a < rp->n_axes && n < len; a++) {
    if (skip && !strcmp(rp->axes[a].key, skip)) continue;
    ferry__run_val(r, rp->axes[a].key, v, sizeof v);
    n += (size_t)snprintf(out + n, len - n, "%s%s=%s", n ? ", " : "", rp->axes[a].key, *v ? v : "-");
  }
}

static void gnum(struct ferry_strbuf *b, double v) {
  if (isfinite(v)) ferry__sb_printf(b, " %.9g", v);
  else ferry__sb_puts(b, " NaN");
}

/* Time unit for values in ms: seconds when they reach 10 s. */
static double time_unit(const double *v, size_t n, const char **unit) {
  double hi = 0;
  for (size_t i = 0; i < n; i++)
    if (isfinite(v[i]) && v[i] > hi) hi = v[i];
  *unit = hi >= 10000 ? "s" : "ms";
  return hi >= 10000 ? 1e-3 : 1;
}

/* Byte unit for a maximum value. */
static double byte_unit(double hi, const char **unit) {
  if (hi >= (double)(1ull << 30)) {
    *unit = "GiB";
    return 1.0 / (double)(1ull << 30);
  }
  if (hi >= (double)(1ull << 20)) {
    *unit = "MiB";
    return 1.0 / (double)(1ull << 20);
  }
  if (hi >= 1024) {
    *unit = "KiB";
    return 1.0 / 1024;
  }
  *unit = "B";
  return 1;
}

static int usable(const struct rrun *r) { return r->complete && r->n_req > 0; }

/* ---- runs ---------------------------------------------------------------------------------- */

static ferry_status failed_runs(struct report *rp) {
  struct rtable *t = ferry__table_new("failed_runs", "run" SEP "kind" SEP "configuration" SEP "error");
  if (!t) return NOMEM(rp);
  for (size_t i = 0; i < rp->n_runs; i++) {
    const struct rrun *r = &rp->runs[i];
    if (r->complete) continue;
    char desc[512], err[600];
    axes_desc(rp, r, NULL, desc, sizeof desc);
    snprintf(err, sizeof err, "%s", r->error ? r->error : "killed, or still running (no error recorded)");
    for (char *p = err; *p; p++)
      if (*p == '\x1f') *p = ' ';
    ferry__table_rowf(t, "%s" SEP "%s" SEP "%s" SEP "%s", r->label, r->kind, desc, err);
  }
  ferry_status st = ferry__emit_table(rp, t, "Runs that did not complete, with their error.");
  ferry__table_free(t);
  return st;
}

/* "r1-r4, r7": labels of consecutive runs of one database compacted. */
static void run_list(const struct report *rp, const size_t *idx, size_t n, struct ferry_strbuf *b) {
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && rp->runs[idx[j + 1]].db == rp->runs[idx[j]].db && rp->runs[idx[j + 1]].id == rp->runs[idx[j]].id + 1)
      j++;
    ferry__sb_printf(b, "%s%s", b->len ? ", " : "", rp->runs[idx[i]].label);
    if (j > i) ferry__sb_printf(b, "-%s", rp->runs[idx[j]].label);
    i = j + 1;
  }
}

static int same_text(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

/* What made the runs, one row per distinct build and machine (docs/schema.md, provenance). */
static ferry_status provenance(struct report *rp) {
  size_t *idx = ferry__calloc(rp->n_runs ? rp->n_runs : 1, sizeof *idx);
  int *done = ferry__calloc(rp->n_runs ? rp->n_runs : 1, sizeof *done);
  struct rtable *t = ferry__table_new("provenance", "runs" SEP "build" SEP "BLAS" SEP "machine" SEP "GPU");
  ferry_status st = FERRY_OK;
  size_t unknown = 0;
  if (!idx || !done || !t) {
    st = NOMEM(rp);
    goto out;
  }
  for (size_t i = 0; i < rp->n_runs; i++) {
    const struct rrun *r = &rp->runs[i];
    if (done[i]) continue;
    if (!r->prov[PROV_BUILD] && !r->prov[PROV_MACHINE]) {
      unknown++;
      continue;
    }
    size_t n = 0;
    for (size_t j = i; j < rp->n_runs; j++) {
      int same = 1;
      for (int p = 0; p < 4 && same; p++) same = same_text(r->prov[p], rp->runs[j].prov[p]);
      if (!same || done[j]) continue;
      done[j] = 1;
      idx[n++] = j;
    }
    struct ferry_strbuf list = {0};
    run_list(rp, idx, n, &list);
    ferry__table_rowf(t, "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s", list.p ? list.p : "", r->prov[0] ? r->prov[0] : "",
                      r->prov[1] ? r->prov[1] : "", r->prov[2] ? r->prov[2] : "", r->prov[3] ? r->prov[3] : "");
    if (list.oom) t->oom = 1;
    ferry__sb_free(&list);
  }
  if (t->nrows) {
    char cap[256];
    snprintf(cap, sizeof cap, "What made the runs: build (git describe, compiler, build type), BLAS, machine and GPU%s.",
             unknown ? "; runs written before ferry recorded provenance are not listed" : "");
    st = ferry__emit_table(rp, t, cap);
  } else {
    ferry__doc_para(rp, "No run recorded its provenance (databases written before schema version 5).");
  }
out:
  ferry_free(idx);
  ferry_free(done);
  ferry__table_free(t);
  return st;
}

ferry_status ferry__section_runs(struct report *rp) {
  NUMBUF;
  ferry__doc_section(rp, FERRY_REPORT_RUNS, "Runs");
  char head[2048];
  size_t n = (size_t)snprintf(head, sizeof head, "run" SEP "kind" SEP "status" SEP "model" SEP "hardware" SEP "trace");
  for (size_t a = 0; a < rp->n_axes && n < sizeof head; a++)
    if (strcmp(rp->axes[a].key, "executor") && strcmp(rp->axes[a].key, "model") && strcmp(rp->axes[a].key, "trace"))
      n += (size_t)snprintf(head + n, sizeof head - n, SEP "%s", rp->axes[a].key);
  snprintf(head + n, sizeof head - n,
           SEP "requests" SEP "TTFT P50 (ms)" SEP "TTFT P99 (ms)" SEP "TPOT P50 (ms)" SEP "TPOT P99 (ms)" SEP
               "e2e P50 (ms)" SEP "e2e P99 (ms)" SEP "throughput (tok/s)" SEP "peak device (MiB)" SEP
               "peak host (MiB)" SEP "config hash");
  struct rtable *t = ferry__table_new("runs", head);
  if (!t) return NOMEM(rp);
  for (size_t i = 0; i < rp->n_runs; i++) {
    const struct rrun *r = &rp->runs[i];
    struct ferry_strbuf axes = {0};
    char v[256];
    for (size_t a = 0; a < rp->n_axes; a++)
      if (strcmp(rp->axes[a].key, "executor") && strcmp(rp->axes[a].key, "model") && strcmp(rp->axes[a].key, "trace")) {
        ferry__run_val(r, rp->axes[a].key, v, sizeof v);
        ferry__sb_printf(&axes, SEP "%s", v);
      }
    char status[300];
    if (r->complete) snprintf(status, sizeof status, "ok");
    else if (r->error) snprintf(status, sizeof status, "failed: %.280s", r->error);
    else snprintf(status, sizeof status, "incomplete");
    for (char *p = status; *p; p++)
      if (*p == '\x1f') *p = ' ';
    ferry__table_rowf(t, "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s%s" SEP "%lld" SEP "%s" SEP "%s" SEP "%s" SEP
                         "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s",
                      r->label, r->kind, status, r->model ? r->model : "", r->hardware ? r->hardware : "",
                      r->trace ? r->trace : "", axes.p ? axes.p : "", (long long)r->n_req, N(r->ttft.p50), N(r->ttft.p99),
                      N(r->tpot.p50), N(r->tpot.p99), N(r->e2e.p50), N(r->e2e.p99), N(r->thr_tok_s),
                      N(r->peak_bytes[0] / 1048576.0), N(r->peak_bytes[1] / 1048576.0),
                      r->config_hash ? r->config_hash : "");
    if (axes.oom) t->oom = 1;
    ferry__sb_free(&axes);
  }
  if (rp->sum.failed)
    ferry__doc_para(rp, "%zu of %zu runs did not complete; they are listed here with their error and left out of the "
                        "comparisons.",
                    rp->sum.failed, rp->sum.runs);
  ferry_status st = ferry__emit_table(rp, t, "Every run: configuration on the swept parameters and headline metrics.");
  ferry__table_free(t);
  if (st == FERRY_OK && rp->sum.failed) st = failed_runs(rp);
  if (st == FERRY_OK) st = provenance(rp);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}

/* ---- latency and throughput against each swept parameter ---------------------------------- */

/* Parts of a series key are separated by this (values never hold it: control characters). */
#define PART "\x1e"

struct point {
  char series[256]; /* the other axes' values, PART-separated "key=value" */
  char x[256];
  int n;
  double m[7]; /* ttft p50, p99, tpot p50, p99, e2e p50, p99, throughput */
  char first_run[32];
};

/* The values the other axes are held at when there are too many lines: those of the slice of
 * runs (one value per other axis, `keep` and `skip` aside) that covers the most values of ax,
 * then the most runs. Fixing each axis at its own most frequent value instead can pick a
 * combination no run has (host-only routing with the simulator's executor) and draw nothing. */
static void best_slice(const struct report *rp, const struct raxis *ax, const int *skip, size_t keep,
                       char (*modes)[256]) {
  size_t best = SIZE_MAX, best_x = 0, best_n = 0;
  char v[256], w[256];
  for (size_t i = 0; i < rp->n_runs; i++) {
    if (!usable(&rp->runs[i])) continue;
    size_t nx = 0, n = 0;
    char seen[64][64];
    for (size_t j = 0; j < rp->n_runs; j++) {
      if (!usable(&rp->runs[j])) continue;
      int same = 1;
      for (size_t a = 0; a < rp->n_axes && same; a++) {
        if (&rp->axes[a] == ax || a == keep || skip[a]) continue;
        if (!ferry__run_val(&rp->runs[i], rp->axes[a].key, v, sizeof v) ||
            !ferry__run_val(&rp->runs[j], rp->axes[a].key, w, sizeof w))
          continue; /* absent in one: no difference */
        same = !strcmp(v, w);
      }
      if (!same) continue;
      n++;
      ferry__run_val(&rp->runs[j], ax->key, v, sizeof v);
      size_t k;
      for (k = 0; k < nx; k++)
        if (!strncmp(seen[k], v, sizeof seen[k] - 1)) break;
      if (k == nx && nx < 64) snprintf(seen[nx++], sizeof seen[0], "%.63s", v);
    }
    if (nx > best_x || (nx == best_x && n > best_n)) {
      best = i;
      best_x = nx;
      best_n = n;
    }
  }
  for (size_t a = 0; a < rp->n_axes; a++) {
    modes[a][0] = '\0';
    if (best != SIZE_MAX) ferry__run_val(&rp->runs[best], rp->axes[a].key, modes[a], sizeof modes[a]);
  }
}

/* Whether axis `o` follows axis `ax` among the usable runs: one value of o for each value of ax
 * (hw follows executor: host runs have none, sim runs their profile). Such an axis neither
 * splits the plot against ax into series nor is held fixed: it changes with ax. */
static int follows(const struct report *rp, const struct raxis *ax, const struct raxis *o) {
  char x[256], y[256], x2[256], y2[256];
  for (size_t i = 0; i < rp->n_runs; i++) {
    if (!usable(&rp->runs[i])) continue;
    ferry__run_val(&rp->runs[i], ax->key, x, sizeof x);
    ferry__run_val(&rp->runs[i], o->key, y, sizeof y);
    for (size_t j = i + 1; j < rp->n_runs; j++) {
      if (!usable(&rp->runs[j])) continue;
      ferry__run_val(&rp->runs[j], ax->key, x2, sizeof x2);
      if (strcmp(x, x2)) continue;
      ferry__run_val(&rp->runs[j], o->key, y2, sizeof y2);
      if (strcmp(y, y2)) return 0;
    }
  }
  return 1;
}

/* Points (series, x) averaged over repeats. Series are the combinations of the other axes not
 * in `skip`; with `modes` set, only axis `keep` makes series and the others must equal modes[a]
 * (runs that do not are counted in *held_out). */
static ferry_status collect_points(struct report *rp, const struct raxis *ax, const int *skip, size_t keep,
                                   char (*modes)[256], struct point **out, size_t *nout, size_t *held_out) {
  struct point *pts = NULL;
  size_t npts = 0;
  char v[256];
  *held_out = 0;
  for (size_t i = 0; i < rp->n_runs; i++) {
    const struct rrun *r = &rp->runs[i];
    if (!usable(r)) continue;
    char series[256] = "";
    size_t sl = 0;
    int take = 1;
    for (size_t a = 0; a < rp->n_axes; a++) {
      const struct raxis *o = &rp->axes[a];
      if (o == ax || skip[a]) continue;
      /* a key the run does not have (a host run's routing) neither splits nor excludes it */
      if (!ferry__run_val(r, o->key, v, sizeof v)) continue;
      if (modes && a != keep) {
        if (modes[a][0] && strcmp(v, modes[a])) take = 0;
        continue;
      }
      sl += (size_t)snprintf(series + sl, sl < sizeof series ? sizeof series - sl : 0, "%s%s=%s", sl ? PART : "",
                             o->key, *v ? v : "-");
      if (sl >= sizeof series) sl = sizeof series - 1;
    }
    if (!take) {
      (*held_out)++;
      continue;
    }
    ferry__run_val(r, ax->key, v, sizeof v);
    size_t k;
    for (k = 0; k < npts; k++)
      if (!strcmp(pts[k].series, series) && !strcmp(pts[k].x, v)) break;
    if (k == npts) {
      struct point *p = ferry__reallocarray(pts, npts + 1, sizeof *p);
      if (!p) {
        ferry_free(pts);
        return NOMEM(rp);
      }
      pts = p;
      memset(&pts[k], 0, sizeof pts[k]);
      snprintf(pts[k].series, sizeof pts[k].series, "%s", series);
      snprintf(pts[k].x, sizeof pts[k].x, "%s", v);
      snprintf(pts[k].first_run, sizeof pts[k].first_run, "%s", r->label);
      npts++;
    }
    const double m[7] = {r->ttft.p50, r->ttft.p99, r->tpot.p50, r->tpot.p99, r->e2e.p50, r->e2e.p99, r->thr_tok_s};
    /* repeats of one configuration are averaged */
    for (int j = 0; j < 7; j++) pts[k].m[j] = (pts[k].m[j] * pts[k].n + m[j]) / (pts[k].n + 1);
    pts[k].n++;
  }
  *out = pts;
  *nout = npts;
  return FERRY_OK;
}

static size_t count_series(const struct point *pts, size_t n) {
  size_t ns = 0;
  for (size_t k = 0; k < n; k++) {
    size_t j;
    for (j = 0; j < k; j++)
      if (!strcmp(pts[j].series, pts[k].series)) break;
    ns += j == k;
  }
  return ns;
}

/* The i-th PART of a series key ("" past the end). */
static void series_part(const char *series, size_t i, char *out, size_t len) {
  const char *p = series;
  for (size_t k = 0; k < i && p; k++) {
    p = strstr(p, PART);
    if (p) p++;
  }
  if (!p) {
    out[0] = '\0';
    return;
  }
  size_t n = strcspn(p, PART);
  snprintf(out, len, "%.*s", (int)n, p);
}

/* The value of `key` in a series key, into out; 0 when the series has no such part. */
static int series_value(const char *series, const char *key, char *out, size_t len) {
  char part[256];
  const size_t kl = strlen(key);
  for (size_t i = 0;; i++) {
    series_part(series, i, part, sizeof part);
    if (!part[0]) return 0;
    if (!strncmp(part, key, kl) && part[kl] == '=') {
      snprintf(out, len, "%s", part + kl + 1);
      return 1;
    }
  }
}

/* Labels of the series as a reader needs them: only the keys whose values differ between the
 * series that have them, paths as their last component and budgets in binary units ("hw=l4,
 * pd=2"). A series without a key (a host run has no hw) is not different for that. */
static void series_labels(const char *const *series, size_t ns, char (*labels)[160]) {
  char part[256], other[256];
  for (size_t si = 0; si < ns; si++) {
    size_t used = 0;
    labels[si][0] = '\0';
    for (size_t i = 0;; i++) {
      series_part(series[si], i, part, sizeof part);
      if (!part[0]) break;
      char *eq = strchr(part, '=');
      if (!eq) continue;
      *eq = '\0';
      int differs = 0;
      for (size_t sj = 0; sj < ns && !differs; sj++)
        differs = series_value(series[sj], part, other, sizeof other) && strcmp(eq + 1, other) != 0;
      if (!differs) continue;
      char shortv[128], ab[16];
      label_value(part, eq + 1, shortv, sizeof shortv);
      key_abbrev(part, ab, sizeof ab);
      int w = snprintf(labels[si] + used, 160 - used, "%s%s=%s", used ? ", " : "", strlen(part) > 14 ? ab : part,
                       shortv);
      used = w > 0 && (size_t)w < 160 - used ? used + (size_t)w : 159;
    }
    if (!labels[si][0]) snprintf(labels[si], 160, "%s", ns > 1 ? "(same)" : "all runs");
  }
}

void ferry__run_labels(const struct report *rp, const struct rrun *const *runs, size_t n, char (*labels)[160]) {
  char(*keys)[256] = ferry__calloc(n ? n : 1, sizeof *keys);
  const char **series = ferry__calloc(n ? n : 1, sizeof *series);
  char(*diff)[160] = ferry__calloc(n ? n : 1, sizeof *diff);
  if (!keys || !series || !diff) {
    for (size_t i = 0; i < n; i++) snprintf(labels[i], 160, "%s", runs[i]->label);
  } else {
    char v[256];
    for (size_t i = 0; i < n; i++) {
      size_t used = 0;
      for (size_t a = 0; a < rp->n_axes && used < sizeof keys[i]; a++) {
        if (!ferry__run_val(runs[i], rp->axes[a].key, v, sizeof v)) continue;
        used += (size_t)snprintf(keys[i] + used, sizeof keys[i] - used, "%s%s=%s", used ? PART : "", rp->axes[a].key,
                                 *v ? v : "-");
      }
      series[i] = keys[i];
    }
    series_labels(series, n, diff);
    for (size_t i = 0; i < n; i++) snprintf(labels[i], 160, "%.31s: %.120s", runs[i]->label, diff[i]);
  }
  ferry_free(keys);
  ferry_free(series);
  ferry_free(diff);
}

/* What one plot against an axis is made of, gathered step by step by the functions below. */
enum { MAX_SERIES = 16, MAX_ALL = 256 };
struct sweep_plot {
  struct report *rp;
  const struct raxis *ax;
  int *skip;             /* axes that follow ax (change with it): not lines of their own */
  size_t n_other;        /* axes that vary independently of ax */
  size_t smallest;       /* the other axis with fewest values: one line per value when narrowing */
  struct ferry_strbuf follow, left;
  char fixed[1024];      /* "key=value, ..." the other axes are held at when narrowed */
  size_t fixed_len, held_out;
  struct point *pts;
  size_t npts;
  const char *series[MAX_SERIES];
  size_t ns;
  char (*labels)[160];
  double all[7][MAX_ALL]; /* every point's figures, for the panels' units and scales */
  size_t nall;
  int budget;
  double xscale;
};

/* Which other axes change with ax (listed, not drawn) and which one gives the lines. */
static void sweep_partition(struct sweep_plot *sp) {
  const struct report *rp = sp->rp;
  sp->smallest = SIZE_MAX;
  for (size_t a = 0; a < rp->n_axes; a++) {
    if (&rp->axes[a] == sp->ax) continue;
    if (follows(rp, sp->ax, &rp->axes[a])) {
      sp->skip[a] = 1;
      ferry__sb_printf(&sp->follow, "%s%s", sp->follow.len ? ", " : "", rp->axes[a].key);
      continue;
    }
    sp->n_other++;
    if (sp->smallest == SIZE_MAX || rp->axes[a].n < rp->axes[sp->smallest].n) sp->smallest = a;
  }
  /* when the other axes are fixed, the executor keeps its lines (sim against real side by side) */
  for (size_t a = 0; a < rp->n_axes; a++)
    if (&rp->axes[a] != sp->ax && !sp->skip[a] && !strcmp(rp->axes[a].key, "executor")) sp->smallest = a;
}

/* Too many lines: one line per value of the smallest other axis, the rest at the values of the
 * slice of runs that covers ax best. */
static ferry_status sweep_narrow(struct sweep_plot *sp) {
  struct report *rp = sp->rp;
  ferry_free(sp->pts);
  sp->pts = NULL;
  char(*modes)[256] = ferry__calloc(rp->n_axes, sizeof *modes);
  if (!modes) return NOMEM(rp);
  best_slice(rp, sp->ax, sp->skip, sp->smallest, modes);
  for (size_t a = 0; a < rp->n_axes; a++) {
    /* an axis the chosen slice does not have is not fixed: its runs may hold any value */
    if (&rp->axes[a] == sp->ax || a == sp->smallest || sp->skip[a] || !modes[a][0]) continue;
    char lv[128];
    label_value(rp->axes[a].key, modes[a], lv, sizeof lv);
    size_t room = sp->fixed_len < sizeof sp->fixed ? sizeof sp->fixed - sp->fixed_len : 0;
    sp->fixed_len += (size_t)snprintf(sp->fixed + sp->fixed_len, room, "%s%s=%s", sp->fixed_len ? ", " : "",
                                      rp->axes[a].key, lv);
    if (sp->fixed_len >= sizeof sp->fixed) sp->fixed_len = sizeof sp->fixed - 1;
  }
  ferry_status st = collect_points(rp, sp->ax, sp->skip, sp->smallest, modes, &sp->pts, &sp->npts, &sp->held_out);
  ferry_free(modes);
  if (st == FERRY_OK && sp->held_out)
    ferry__sb_printf(&sp->left, "%s%zu run%s at other values of the fixed parameters", sp->left.len ? "; " : "",
                     sp->held_out, sp->held_out == 1 ? "" : "s");
  return st;
}

/* Distinct series in order of appearance; a series with a single point draws no line, so when
 * some series have several points the single-point ones (runs that only share the key's value by
 * chance, e.g. a what-if on other hardware) are left out, and said so. */
static void sweep_series(struct sweep_plot *sp) {
  size_t counts[MAX_SERIES] = {0};
  size_t ns = 0, beyond = 0;
  for (size_t k = 0; k < sp->npts; k++) {
    size_t si;
    for (si = 0; si < ns; si++)
      if (!strcmp(sp->series[si], sp->pts[k].series)) break;
    if (si == ns) {
      if (ns == MAX_SERIES) {
        beyond++;
        continue;
      }
      sp->series[ns++] = sp->pts[k].series;
    }
    counts[si]++;
  }
  if (beyond)
    ferry__sb_printf(&sp->left, "%s%zu point%s of series beyond the first %d", sp->left.len ? "; " : "", beyond,
                     beyond == 1 ? "" : "s", MAX_SERIES);
  size_t multi = 0;
  for (size_t si = 0; si < ns; si++) multi += counts[si] > 1;
  sp->ns = ns;
  if (!multi) return;
  size_t kept = 0, dropped = 0;
  struct ferry_strbuf runs = {0};
  for (size_t si = 0; si < ns; si++) {
    if (counts[si] > 1) {
      sp->series[kept++] = sp->series[si];
      continue;
    }
    dropped++;
    for (size_t k = 0; k < sp->npts; k++)
      if (!strcmp(sp->pts[k].series, sp->series[si]))
        ferry__sb_printf(&runs, "%s%s", runs.len ? ", " : "", sp->pts[k].first_run);
  }
  sp->ns = kept;
  if (dropped)
    ferry__sb_printf(&sp->left, "%s%zu configuration%s with a single value of %s (run%s %s)",
                     sp->left.len ? "; " : "", dropped, dropped == 1 ? "" : "s", sp->ax->key,
                     dropped == 1 ? "" : "s", runs.p ? runs.p : "");
  ferry__sb_free(&runs);
}

/* The gnuplot data blocks, one per series, and the table of the same points. */
static void sweep_data(struct sweep_plot *sp, struct ferry_strbuf *s, struct rtable *t) {
  NUMBUF;
  const struct raxis *ax = sp->ax;
  for (size_t si = 0; si < sp->ns; si++) {
    ferry__sb_printf(s, "$s%zu << EOD\n", si);
    for (size_t xi = 0; xi < ax->n; xi++) {
      for (size_t k = 0; k < sp->npts; k++) {
        const struct point *p = &sp->pts[k];
        if (strcmp(p->series, sp->series[si]) || strcmp(p->x, ax->vals[xi])) continue;
        if (ax->numeric) gnum(s, strtod(p->x, NULL) * sp->xscale);
        else ferry__sb_printf(s, " %zu", xi);
        for (int j = 0; j < 7; j++) gnum(s, p->m[j]);
        ferry__sb_puts(s, "\n");
        if (sp->nall < MAX_ALL) {
          for (int j = 0; j < 7; j++) sp->all[j][sp->nall] = p->m[j];
          sp->nall++;
        }
        ferry__table_rowf(t, "%s" SEP "%s" SEP "%d" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s",
                          sp->labels[si], p->x, p->n, N(p->m[0]), N(p->m[1]), N(p->m[2]), N(p->m[3]), N(p->m[4]),
                          N(p->m[5]), N(p->m[6]));
      }
    }
    ferry__sb_puts(s, "EOD\n");
  }
  ferry__sb_puts(s, "set datafile missing 'NaN'\n");
}

/* The x axis: numeric values at their places (log scale when they span decades), names at 0..n-1. */
static void sweep_x_axis(const struct sweep_plot *sp, struct ferry_strbuf *s) {
  const struct raxis *ax = sp->ax;
  char xlabel[160];
  snprintf(xlabel, sizeof xlabel, "%s%s", sp->budget ? ax->key : ferry__key_label(ax->key),
           sp->budget ? " (GiB)" : "");
  if (ax->numeric) {
    double xs[256];
    size_t nx = 0;
    for (size_t xi = 0; xi < ax->n && nx < 256; xi++) xs[nx++] = strtod(ax->vals[xi], NULL);
    if (ferry__spans_decades(xs, nx) && xs[0] > 0) ferry__sb_puts(s, "set logscale x 2\n");
    else ferry__sb_puts(s, "set offsets graph 0.05, graph 0.05, 0, 0\n");
    if (nx <= 12) {
      ferry__sb_puts(s, "set xtics (");
      for (size_t xi = 0; xi < nx; xi++) ferry__sb_printf(s, "%s%.9g", xi ? ", " : "", xs[xi] * sp->xscale);
      ferry__sb_puts(s, ")\n");
    }
  } else {
    ferry__sb_printf(s, "set xrange [-0.5:%zu.5]\nset xtics (", ax->n - 1);
    for (size_t xi = 0; xi < ax->n; xi++) {
      char lv[128];
      label_value(ax->key, ax->vals[xi], lv, sizeof lv);
      ferry__sb_puts(s, xi ? ", " : "");
      ferry__gp_tic(s, lv);
      ferry__sb_printf(s, " %zu", xi);
    }
    ferry__sb_puts(s, ")\n");
  }
  ferry__sb_puts(s, "set xlabel ");
  ferry__gp_str(s, xlabel);
}

/* Four panels: TTFT, TPOT, end-to-end (P50 solid, P99 dashed) and throughput. */
static void sweep_panels(const struct sweep_plot *sp, struct ferry_strbuf *s) {
  ferry__sb_puts(s, "\nset multiplot layout 2,2 title ");
  char mtitle[1200];
  /* a long list of fixed values would run off the picture: the caption has it */
  snprintf(mtitle, sizeof mtitle, "Latency and throughput against %s%s%s", sp->ax->key,
           sp->fixed_len ? (sp->fixed_len > 90 ? " (other parameters fixed: see the caption" : " (") : "",
           sp->fixed_len && sp->fixed_len <= 90 ? sp->fixed : "");
  if (sp->fixed_len) strncat(mtitle, ")", sizeof mtitle - strlen(mtitle) - 1);
  ferry__gp_str(s, mtitle);
  ferry__sb_puts(s, "\n");
  static const char *const panel[4] = {"Time to first token", "Time per output token", "End-to-end latency",
                                       "Throughput"};
  for (int p = 0; p < 4; p++) {
    const char *unit = "tok/s";
    double scale = 1;
    double vals[2 * MAX_ALL];
    size_t nv = 0;
    for (size_t k = 0; k < sp->nall; k++) {
      if (p < 3) {
        vals[nv++] = sp->all[2 * p][k];
        vals[nv++] = sp->all[2 * p + 1][k];
      } else {
        vals[nv++] = sp->all[6][k];
      }
    }
    if (p < 3) scale = time_unit(vals, nv, &unit);
    ferry__gp_set(s, "title", "%s%s", panel[p], p < 3 ? " (solid P50, dashed P99)" : "");
    ferry__gp_set(s, "ylabel", "%s (%s)", p == 3 ? "output tokens/s" : "latency", unit);
    ferry__sb_printf(s, "%s\n", ferry__spans_decades(vals, nv) ? "set logscale y" : "unset logscale y");
    ferry__sb_puts(s, p == 0 ? "set key top left\n" : "unset key\n");
    ferry__sb_puts(s, "plot ");
    for (size_t si = 0; si < sp->ns; si++) {
      int col = p < 3 ? 2 + 2 * p : 8;
      ferry__sb_printf(s, "%s$s%zu using 1:($%d*%g) with linespoints lt %zu title ", si ? ", " : "", si, col, scale,
                       si + 1);
      ferry__gp_str(s, sp->labels[si]);
      if (p < 3)
        ferry__sb_printf(s, ", $s%zu using 1:($%d*%g) with linespoints lt %zu dt 2 notitle", si, col + 1, scale,
                         si + 1);
    }
    ferry__sb_puts(s, "\n");
  }
  ferry__sb_puts(s, "unset multiplot\n");
}

/* The plot, its caption (what the lines are, what is held fixed, what was left out) and its table. */
static ferry_status sweep_emit(struct sweep_plot *sp) {
  struct report *rp = sp->rp;
  const struct raxis *ax = sp->ax;
  char title[256], tname[128];
  snprintf(title, sizeof title, "Against %s", ax->key);
  ferry__doc_heading(rp, title);
  snprintf(tname, sizeof tname, "sweep_%s", ax->key);
  struct rtable *t = ferry__table_new(tname, "series" SEP "value" SEP "runs" SEP "TTFT P50 (ms)" SEP "TTFT P99 (ms)" SEP
                                             "TPOT P50 (ms)" SEP "TPOT P99 (ms)" SEP "e2e P50 (ms)" SEP "e2e P99 (ms)" SEP
                                             "throughput (tok/s)");
  if (!t) return NOMEM(rp);
  struct ferry_strbuf s = {0};
  sweep_data(sp, &s, t);
  sweep_x_axis(sp, &s);
  sweep_panels(sp, &s);
  ferry_status st = FERRY_OK;
  if (s.oom || sp->follow.oom || sp->left.oom) {
    st = NOMEM(rp);
  } else {
    char cap[2400];
    snprintf(cap, sizeof cap,
             "Latency (TTFT, TPOT, end-to-end; P50 solid, P99 dashed) and throughput against %s, one line per "
             "%s%s%s%s%s%s%s.",
             ax->key, sp->n_other ? "combination of the other swept parameters (named by what differs)" : "configuration",
             sp->fixed_len ? "; other parameters fixed at " : "", sp->fixed_len ? sp->fixed : "",
             sp->follow.len ? "; changing with it: " : "", sp->follow.len ? sp->follow.p : "",
             sp->left.len ? ". Left out: " : "", sp->left.len ? sp->left.p : "");
    st = ferry__emit_plot(rp, tname, cap, 1100, 780, s.p);
    if (st == FERRY_OK) {
      snprintf(cap, sizeof cap, "Points of the plot against %s (mean over repeated configurations).", ax->key);
      st = ferry__emit_table(rp, t, cap);
    }
  }
  ferry__sb_free(&s);
  ferry__table_free(t);
  return st;
}

static ferry_status sweep_axis(struct report *rp, const struct raxis *ax) {
  struct sweep_plot *sp = ferry__calloc(1, sizeof *sp);
  if (!sp) return NOMEM(rp);
  sp->rp = rp;
  sp->ax = ax;
  ferry_status st = FERRY_OK;
  sp->skip = ferry__calloc(rp->n_axes ? rp->n_axes : 1, sizeof *sp->skip);
  if (!sp->skip) {
    st = NOMEM(rp);
    goto out;
  }
  sweep_partition(sp);
  st = collect_points(rp, ax, sp->skip, 0, NULL, &sp->pts, &sp->npts, &sp->held_out);
  if (st == FERRY_OK && count_series(sp->pts, sp->npts) > 8 && sp->n_other > 1) st = sweep_narrow(sp);
  if (st != FERRY_OK) goto out;
  sweep_series(sp);
  if (sp->ns == 0) goto out; /* no runs vary along this key with the others held fixed: nothing to draw */
  sp->labels = ferry__calloc(sp->ns, sizeof *sp->labels);
  if (!sp->labels) {
    st = NOMEM(rp);
    goto out;
  }
  series_labels(sp->series, sp->ns, sp->labels);
  sp->budget = strstr(ax->key, "budget") != NULL && ax->numeric;
  sp->xscale = sp->budget ? 1.0 / (double)(1ull << 30) : 1;
  st = sweep_emit(sp);
out:
  ferry__sb_free(&sp->follow);
  ferry__sb_free(&sp->left);
  ferry_free(sp->labels);
  ferry_free(sp->skip);
  ferry_free(sp->pts);
  ferry_free(sp);
  return st;
}

ferry_status ferry__section_sweep(struct report *rp) {
  size_t n_usable = 0;
  for (size_t i = 0; i < rp->n_runs; i++) n_usable += usable(&rp->runs[i]);
  if (rp->n_axes == 0 || n_usable < 2) return FERRY_OK;
  ferry__doc_section(rp, FERRY_REPORT_SWEEP, "Latency and throughput against each swept parameter");
  struct ferry_strbuf keys = {0};
  for (size_t a = 0; a < rp->n_axes; a++)
    ferry__sb_printf(&keys, "%s%s (%zu values)", a ? ", " : "", rp->axes[a].key, rp->axes[a].n);
  ferry__doc_para(rp,
                  "Swept parameters (configuration keys whose value differs between the complete runs): %s. "
                  "TTFT is the time to the first output token, TPOT the time per output token after the first, "
                  "end-to-end the time from arrival to the last token; throughput is output tokens per second of the run.",
                  keys.p ? keys.p : "");
  ferry__sb_free(&keys);
  ferry_status st = FERRY_OK;
  for (size_t a = 0; a < rp->n_axes && st == FERRY_OK; a++) st = sweep_axis(rp, &rp->axes[a]);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}

/* ---- bytes moved and stall ----------------------------------------------------------------- */

ferry_status ferry__section_bytes(struct report *rp) {
  NUMBUF;
  size_t n = 0;
  double hi = 0;
  for (size_t i = 0; i < rp->n_runs; i++) {
    const struct rrun *r = &rp->runs[i];
    if (!r->complete || r->n_steps == 0) continue;
    n++;
    hi = fmax(hi, fmax(r->bytes_disk, fmax(r->bytes_h2d, r->bytes_d2h)));
  }
  if (n == 0) return FERRY_OK;
  ferry__doc_section(rp, FERRY_REPORT_BYTES, "Bytes moved per tier and stall time");
  ferry__doc_para(rp, "Bytes read from disk and copied host to device and device to host over each run (sums of the "
                      "engine steps), and the time compute waited for weights to arrive (stall). Stall share is stall "
                      "time over the time from the first step's start to the last step's end.");
  const char *unit;
  double scale = byte_unit(hi, &unit);
  char head[512];
  snprintf(head, sizeof head,
           "run" SEP "configuration" SEP "steps" SEP "disk (%s)" SEP "host to device (%s)" SEP "device to host (%s)" SEP
           "stall (ms)" SEP "stall share (%%)" SEP "hits" SEP "misses" SEP "hit rate (%%)",
           unit, unit, unit);
  struct rtable *t = ferry__table_new("bytes", head);
  if (!t) return NOMEM(rp);
  struct ferry_strbuf s = {0};
  ferry__sb_puts(&s, "$b << EOD\n");
  double stall[1024];
  size_t nst = 0;
  /* a small run beside a large one is a bar of no height on a linear axis: logarithmic when the
   * byte counts span two decades or more, with nothing moved left blank (no log of 0) */
  double moved[3072];
  size_t nmoved = 0;
  for (size_t i = 0; i < rp->n_runs && nmoved + 3 <= 3072; i++) {
    const struct rrun *r = &rp->runs[i];
    if (!r->complete || r->n_steps == 0) continue;
    moved[nmoved++] = r->bytes_disk;
    moved[nmoved++] = r->bytes_h2d;
    moved[nmoved++] = r->bytes_d2h;
  }
  const int log_bytes = ferry__spans_decades(moved, nmoved);
  for (size_t i = 0; i < rp->n_runs; i++) {
    const struct rrun *r = &rp->runs[i];
    if (!r->complete || r->n_steps == 0) continue;
    char desc[512], sd[256];
    axes_desc(rp, r, NULL, desc, sizeof desc);
    short_desc(rp, r, NULL, sd, sizeof sd);
    double share = r->span_ms > 0 ? 100.0 * r->stall_ms / r->span_ms : NAN;
    double hr = r->hit_rate_pct;
    ferry__table_rowf(t, "%s" SEP "%s" SEP "%lld" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%lld" SEP "%lld" SEP "%s",
                      r->label, desc, (long long)r->n_steps, N(r->bytes_disk * scale), N(r->bytes_h2d * scale),
                      N(r->bytes_d2h * scale), N(r->stall_ms), N(share), (long long)r->hits, (long long)r->misses, N(hr));
    ferry__gp_data(&s, sd);
    gnum(&s, log_bytes && !(r->bytes_disk > 0) ? NAN : r->bytes_disk * scale);
    gnum(&s, log_bytes && !(r->bytes_h2d > 0) ? NAN : r->bytes_h2d * scale);
    gnum(&s, log_bytes && !(r->bytes_d2h > 0) ? NAN : r->bytes_d2h * scale);
    gnum(&s, r->stall_ms);
    gnum(&s, share);
    ferry__sb_puts(&s, "\n");
    if (nst < 1024) stall[nst++] = r->stall_ms;
  }
  ferry__sb_puts(&s, "EOD\nset datafile missing 'NaN'\n"
                     "set style data histograms\nset style histogram clustered gap 1\n"
                     "set style fill solid 0.85 border -1\nset boxwidth 0.9\n"
                     "set xtics rotate by -90 left nomirror\nset key outside top center horizontal\nset yrange [0:*]\n"
                     "set multiplot layout 1,2\n");
  ferry__gp_set(&s, "title", "Bytes moved per tier%s", log_bytes ? " (log scale)" : "");
  ferry__gp_set(&s, "ylabel", "%s", unit);
  if (log_bytes) ferry__sb_puts(&s, "set logscale y\nset yrange [*:*]\n");
  ferry__sb_puts(&s, "plot $b using 2:xtic(1) title 'disk read' lt 5, '' using 3 title 'host to device' lt 2, "
                     "'' using 4 title 'device to host' lt 3\n");
  ferry__gp_set(&s, "title", "Stall time (compute waiting for transfers)");
  ferry__gp_set(&s, "ylabel", "stall (ms)");
  if (ferry__spans_decades(stall, nst)) ferry__sb_puts(&s, "set logscale y\nset yrange [*:*]\n");
  else ferry__sb_puts(&s, "unset logscale y\nset yrange [0:*]\n");
  ferry__sb_puts(&s, "plot $b using 5:xtic(1) title 'stall' lt 4\nunset multiplot\n");
  ferry_status st = s.oom ? NOMEM(rp)
                          : ferry__emit_plot(rp, "bytes_stall", "Bytes moved per tier (left) and stall time (right) per run.",
                                             1200, 640, s.p);
  if (st == FERRY_OK) st = ferry__emit_table(rp, t, "Bytes moved per tier, stall time and weight-cache hit rate per run.");
  ferry__sb_free(&s);
  ferry__table_free(t);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}

/* ---- sim against real ------------------------------------------------------------------------ */

/* A paired prediction further off than this on any metric is flagged. */
#define SIM_ERROR_FLAG_PCT 10.0

/* A real run a and a simulation b of the same configuration: paired when they agree on every key
 * but these (the runtime preset describes the software a simulation prices; a real run's is its
 * own). */
static int sim_pair(const struct rrun *a, const struct rrun *b) {
  static const char *const except[] = {"executor", "hw",     "runtime", "threads", "direct_io",
                                       "routing",  "routing_synth", "greedy", NULL};
  return usable(a) && usable(b) && strcmp(a->kind, "sim") && strcmp(a->kind, "nsys-import") && !strcmp(b->kind, "sim") &&
         ferry__runs_same_except(a, b, except);
}

static const char *const svr_metric[3] = {"mean TTFT", "mean TPOT", "P99 e2e"};

/* The errors over all pairs and the scatter's points, per metric. */
struct svr {
  double sum_abs[3], max_abs[3], sum[3];
  int cnt[3];
  struct ferry_strbuf d[3];
  double lo, hi;
};

/* One pair's row: measured, predicted and error per metric, and what makes it suspect (a large
 * miss, or a profile fitted poorly). */
static void svr_pair(struct report *rp, const struct rrun *a, const struct rrun *b, struct rtable *t, struct svr *v) {
  NUMBUF;
  double meas[3] = {a->ttft.mean, a->tpot.mean, a->e2e.p99}, pred[3] = {b->ttft.mean, b->tpot.mean, b->e2e.p99};
  double err[3];
  int off = 0;
  for (int m = 0; m < 3; m++) {
    err[m] = meas[m] > 0 ? 100.0 * (pred[m] - meas[m]) / meas[m] : NAN;
    if (isfinite(err[m])) {
      v->sum_abs[m] += fabs(err[m]);
      v->sum[m] += err[m];
      v->max_abs[m] = fmax(v->max_abs[m], fabs(err[m]));
      v->cnt[m]++;
    }
    if (meas[m] > 0 && pred[m] > 0 && isfinite(meas[m]) && isfinite(pred[m])) {
      ferry__sb_printf(&v->d[m], "%.9g %.9g\n", meas[m], pred[m]);
      v->lo = fmin(v->lo, fmin(meas[m], pred[m]));
      v->hi = fmax(v->hi, fmax(meas[m], pred[m]));
    }
    off |= isfinite(err[m]) && fabs(err[m]) > SIM_ERROR_FLAG_PCT;
  }
  char desc[512], flag[640] = "";
  axes_desc(rp, a, "executor", desc, sizeof desc);
  snprintf(flag, sizeof flag, "%s%s%s%s", off ? "error > 10%" : "", off && b->weak_fits ? "; " : "",
           b->weak_fits ? "weak fits: " : "", b->weak_fits ? b->weak_fits : "");
  if (flag[0]) rp->sum.sim_real_flagged++;
  ferry__table_rowf(t, "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP
                       "%s" SEP "%s" SEP "%s",
                    a->label, b->label, b->hardware ? b->hardware : "", desc, N(meas[0]), N(pred[0]), N(err[0]),
                    N(meas[1]), N(pred[1]), N(err[1]), N(meas[2]), N(pred[2]), N(err[2]), flag);
}

/* Predicted against measured, one point per metric of each pair, with y = x. */
static ferry_status svr_scatter(struct report *rp, const struct svr *v) {
  struct ferry_strbuf s = {0};
  for (int m = 0; m < 3; m++) ferry__sb_printf(&s, "$m%d << EOD\n%sEOD\n", m, v->d[m].p ? v->d[m].p : "");
  int logs = v->hi / v->lo >= 100;
  double rlo = logs ? v->lo / 1.5 : 0, rhi = v->hi * 1.15;
  ferry__sb_printf(&s,
                   "%s"
                   "set xrange [%.9g:%.9g]\nset yrange [%.9g:%.9g]\nset size ratio -1\n"
                   "set xlabel 'measured (ms)'\nset ylabel 'predicted by the simulator (ms)'\n"
                   "set key top left\nset title 'Simulator prediction against measurement'\n"
                   "set samples 200\n"
                   "plot x with lines dt 2 lc rgb '#555555' lw 1 title 'y = x'",
                   logs ? "set logscale xy\n" : "", rlo, rhi, rlo, rhi);
  for (int m = 0; m < 3; m++)
    if (v->d[m].len) {
      ferry__sb_printf(&s, ", $m%d using 1:2 with points lt %d ps 1.4 title ", m, m + 1);
      ferry__gp_str(&s, svr_metric[m]);
    }
  ferry__sb_puts(&s, "\n");
  ferry_status st =
      s.oom ? NOMEM(rp)
            : ferry__emit_plot(rp, "sim_vs_real",
                               "Predicted (simulator) against measured (real executor) per paired configuration; the "
                               "dashed line is y = x.",
                               700, 640, s.p);
  ferry__sb_free(&s);
  return st;
}

ferry_status ferry__section_sim_vs_real(struct report *rp) {
  NUMBUF;
  size_t npairs = 0;
  for (size_t i = 0; i < rp->n_runs; i++)
    for (size_t j = 0; j < rp->n_runs; j++) npairs += (size_t)sim_pair(&rp->runs[i], &rp->runs[j]);
  if (npairs == 0) return FERRY_OK;
  rp->sum.sim_real_pairs = npairs;
  ferry__doc_section(rp, FERRY_REPORT_SIM_VS_REAL, "Simulator against real runs");
  ferry__doc_para(rp, "Runs are paired when their configurations agree on every key except the executor, the routing source, the "
                      "hardware profile and the runtime preset. Error = (predicted - measured) / measured, in percent; the scatter shows each "
                      "metric of each pair with the y = x line (a perfect prediction lies on it). The flag column marks "
                      "pairs off by more than 10 %% on a metric, and simulations whose profile has fitted costs that "
                      "explain little of their measurements (R^2 below 0.9, from ferry calibrate).");
  struct rtable *t = ferry__table_new(
      "sim_vs_real", "real run" SEP "sim run" SEP "hardware" SEP "configuration" SEP "mean TTFT measured (ms)" SEP
                     "mean TTFT predicted (ms)" SEP "mean TTFT error (%)" SEP "mean TPOT measured (ms)" SEP
                     "mean TPOT predicted (ms)" SEP "mean TPOT error (%)" SEP "P99 e2e measured (ms)" SEP
                     "P99 e2e predicted (ms)" SEP "P99 e2e error (%)" SEP "flag");
  struct rtable *e = ferry__table_new("sim_error", "metric" SEP "pairs" SEP "mean |error| (%)" SEP "max |error| (%)" SEP
                                                   "mean error (%)");
  if (!t || !e) {
    ferry__table_free(t);
    ferry__table_free(e);
    return NOMEM(rp);
  }
  struct svr v = {.lo = INFINITY};
  for (size_t i = 0; i < rp->n_runs; i++)
    for (size_t j = 0; j < rp->n_runs; j++)
      if (sim_pair(&rp->runs[i], &rp->runs[j])) svr_pair(rp, &rp->runs[i], &rp->runs[j], t, &v);
  for (int m = 0; m < 3; m++)
    ferry__table_rowf(e, "%s" SEP "%d" SEP "%s" SEP "%s" SEP "%s", svr_metric[m], v.cnt[m],
                      N(v.cnt[m] ? v.sum_abs[m] / v.cnt[m] : NAN), N(v.cnt[m] ? v.max_abs[m] : NAN),
                      N(v.cnt[m] ? v.sum[m] / v.cnt[m] : NAN));
  ferry_status st = v.hi > 0 ? svr_scatter(rp, &v) : FERRY_OK;
  if (st == FERRY_OK) st = ferry__emit_table(rp, e, "Simulator error per metric over all pairs.");
  if (st == FERRY_OK) st = ferry__emit_table(rp, t, "Sim against real, per paired configuration.");
  for (int m = 0; m < 3; m++) ferry__sb_free(&v.d[m]);
  ferry__table_free(t);
  ferry__table_free(e);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}

/* ---- per-variant sections (quantization formats, predictors) -------------------------------- */

ferry_status ferry__section_variants(struct report *rp, const char *key, enum ferry_report_section sec) {
  NUMBUF;
  const struct raxis *ax = NULL;
  for (size_t a = 0; a < rp->n_axes; a++)
    if (!strcmp(rp->axes[a].key, key)) ax = &rp->axes[a];
  if (!ax) return FERRY_OK;
  int quant = sec == FERRY_REPORT_QUANT;
  ferry__doc_section(rp, sec, quant ? "Quantization formats" : "Expert predictors");
  ferry__doc_para(rp, quant ? "Per weight format (configuration key quant), averaged over its runs: bytes moved per output "
                              "token (disk + host to device), latency and throughput."
                            : "Per expert predictor (configuration key predictor), averaged over its runs: weight-cache "
                              "hit rate (hits over hits + misses: the share of needed units already resident, a proxy for "
                              "the predictor's recall), bytes moved per output token, latency and throughput.");
  struct rtable *t = ferry__table_new(quant ? "quant" : "predictor",
                                      "value" SEP "runs" SEP "bytes moved per token (KiB)" SEP "hit rate (%)" SEP
                                      "TPOT P50 (ms)" SEP "TTFT P99 (ms)" SEP "throughput (tok/s)");
  if (!t) return NOMEM(rp);
  struct ferry_strbuf s = {0};
  ferry__sb_puts(&s, "$v << EOD\n");
  char v[256];
  for (size_t k = 0; k < ax->n; k++) {
    double bpt = 0, hr = 0, tpot = 0, ttft = 0, thr = 0;
    int n = 0, nh = 0;
    for (size_t i = 0; i < rp->n_runs; i++) {
      const struct rrun *r = &rp->runs[i];
      if (!usable(r)) continue;
      ferry__run_val(r, key, v, sizeof v);
      if (strcmp(v, ax->vals[k])) continue;
      n++;
      bpt += r->out_tokens > 0 ? (r->bytes_disk + r->bytes_h2d) / (double)r->out_tokens / 1024.0 : 0;
      if (isfinite(r->hit_rate_pct)) {
        hr += r->hit_rate_pct;
        nh++;
      }
      tpot += r->tpot.p50;
      ttft += r->ttft.p99;
      thr += r->thr_tok_s;
    }
    if (!n) continue;
    double hrm = nh ? hr / nh : NAN;
    ferry__table_rowf(t, "%s" SEP "%d" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s", ax->vals[k], n, N(bpt / n), N(hrm),
                      N(tpot / n), N(ttft / n), N(thr / n));
    ferry__gp_data(&s, ax->vals[k]);
    gnum(&s, bpt / n);
    gnum(&s, hrm);
    gnum(&s, tpot / n);
    ferry__sb_puts(&s, "\n");
  }
  ferry__sb_puts(&s, "EOD\nset datafile missing 'NaN'\nset style data histograms\nset style fill solid 0.85 border -1\n"
                     "set boxwidth 0.7\nset yrange [0:*]\nunset key\nset multiplot layout 1,3\n");
  ferry__gp_set(&s, "xlabel", "%s", ferry__key_label(key));
  ferry__sb_puts(&s, "set title 'Bytes moved per output token'\nset ylabel 'KiB per token'\n"
                     "plot $v using 2:xtic(1) lt 1\n"
                     "set title 'Weight-cache hit rate'\nset ylabel 'hit rate (%)'\nset yrange [0:100]\n"
                     "plot $v using 3:xtic(1) lt 2\n"
                     "set title 'Time per output token (P50)'\nset ylabel 'TPOT (ms)'\nset yrange [0:*]\n"
                     "plot $v using 4:xtic(1) lt 3\nunset multiplot\n");
  ferry_status st = s.oom ? NOMEM(rp)
                          : ferry__emit_plot(rp, quant ? "quant" : "predictor",
                                             quant ? "Bytes per token, hit rate and TPOT per weight format."
                                                   : "Bytes per token, hit rate and TPOT per expert predictor.",
                                             1200, 450, s.p);
  if (st == FERRY_OK) st = ferry__emit_table(rp, t, quant ? "Per weight format." : "Per expert predictor.");
  ferry__sb_free(&s);
  ferry__table_free(t);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}

/* ---- hardware what-if --------------------------------------------------------------------- */

static int price_from_file(const char *path, double *price) {
  cJSON *j = NULL;
  struct ferry_err err;
  if (ferry__json_load(path, 1 << 20, &j, &err) != FERRY_OK) return 0;
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "price_per_hour_usd");
  int ok = cJSON_IsNumber(p) && p->valuedouble > 0;
  if (ok) *price = p->valuedouble;
  cJSON_Delete(j);
  return ok;
}

/* Price per hour of a hardware profile: a JSON path, or NAME.json in the profile folders, or
 * "price_per_hour_usd=X" in the run's notes. */
static double hw_price(const struct report *rp, const struct rrun *r, const char *hw) {
  double price = NAN;
  if (r->notes) {
    const char *p = strstr(r->notes, "price_per_hour_usd=");
    if (p) price = strtod(p + strlen("price_per_hour_usd="), NULL);
    if (price > 0) return price;
  }
  if (!hw || !*hw) return NAN;
  if (strchr(hw, '/') || (strlen(hw) > 5 && !strcmp(hw + strlen(hw) - 5, ".json")))
    return price_from_file(hw, &price) ? price : NAN;
  for (const char *c = hw; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_' ||
          *c == '.'))
      return NAN;
  char *beside = ferry__installed_hw_dir(); /* an installation under another prefix */
  const char *paths[4] = {rp->opt->hw_path ? rp->opt->hw_path : getenv("FERRY_HW_PATH"), FERRY_REPORT_HW_SOURCE_DIR,
                          beside, FERRY_REPORT_HW_INSTALL_DIR};
  for (int i = 0; i < 4; i++) {
    const char *p = paths[i];
    while (p && *p) {
      const char *colon = strchr(p, ':');
      size_t n = colon ? (size_t)(colon - p) : strlen(p);
      char file[1024];
      if (n > 0 && n < 900) {
        snprintf(file, sizeof file, "%.*s/%s.json", (int)n, p, hw);
        if (price_from_file(file, &price)) {
          ferry_free(beside);
          return price;
        }
      }
      p = colon ? colon + 1 : NULL;
    }
  }
  ferry_free(beside);
  return NAN;
}

/* A run the what-if compares: complete with requests, or failed (it is listed with its error:
 * a profile on which the workload does not run is an answer too). */
static int whatif_run(const struct rrun *r) { return usable(r) || (!r->complete && r->error); }

/* Groups of runs that differ only by hardware, with at least two profiles and one usable run:
 * group[i] > 0 their ids (in order, with gaps where a group was withdrawn), -1 or 0 otherwise.
 * Returns the number of groups. */
static int hw_groups(const struct report *rp, int *group) {
  static const char *const except[] = {"hw", NULL};
  const size_t n = rp->n_runs;
  int ngroups = 0;
  char v1[256], v2[256];
  for (size_t i = 0; i < n; i++) {
    if (!whatif_run(&rp->runs[i]) || group[i]) continue;
    int id = ++ngroups, profiles = 1, ok = usable(&rp->runs[i]);
    group[i] = id;
    ferry__run_val(&rp->runs[i], "hw", v1, sizeof v1);
    for (size_t j = i + 1; j < n; j++) {
      if (!whatif_run(&rp->runs[j]) || group[j] || !ferry__runs_same_except(&rp->runs[i], &rp->runs[j], except)) continue;
      group[j] = id;
      ok += usable(&rp->runs[j]);
      ferry__run_val(&rp->runs[j], "hw", v2, sizeof v2);
      if (strcmp(v1, v2)) profiles++;
    }
    if (profiles < 2 || !ok) {
      for (size_t j = i; j < n; j++)
        if (group[j] == id) group[j] = -1;
      ngroups--;
    }
  }
  return ngroups;
}

/* What the groups' rows add up to. */
struct hw_sum {
  struct ferry_strbuf s, cheapest; /* the bar data ($g1..$g6); the cheapest run of each group */
  int any_price, shown, slo;
};

/* One run of group `shown`: its table row and bar; the group's cheapest run meeting the SLO. */
static void hw_run(struct report *rp, const struct rrun *r, const char *desc, struct rtable *t, struct hw_sum *h,
                   const char **best, double *best_cost) {
  NUMBUF;
  const struct ferry_report_options *o = rp->opt;
  const int ok = usable(r);
  char v1[256];
  ferry__run_val(r, "hw", v1, sizeof v1);
  const char *hw = *v1 ? v1 : (r->hardware ? r->hardware : "");
  char hwl[128];
  label_value("hw", hw, hwl, sizeof hwl);
  double price = hw_price(rp, r, hw);
  double thr = ok ? r->thr_tok_s : NAN;
  double cost = price > 0 && thr > 0 ? price / (thr * 3600.0) * 1e6 : NAN;
  if (isfinite(cost)) h->any_price = 1;
  int meets = ok && (o->slo_ttft_p99_ms <= 0 || r->ttft.p99 <= o->slo_ttft_p99_ms) &&
              (o->slo_tpot_p99_ms <= 0 || r->tpot.p99 <= o->slo_tpot_p99_ms);
  if (meets && isfinite(cost) && cost < *best_cost) {
    *best_cost = cost;
    *best = r->label;
  }
  char note[400] = "";
  if (!ok) snprintf(note, sizeof note, "failed: %.360s", r->error ? r->error : "no error recorded");
  else if (!(price > 0))
    snprintf(note, sizeof note, "no cost: %s has no price_per_hour_usd (add it to the profile, or "
                                "price_per_hour_usd=X to the run's notes)", hwl);
  for (char *c = note; *c; c++)
    if (*c == '\x1f') *c = ' ';
  ferry__table_rowf(t, "%d" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s",
                    h->shown, desc, hw, r->label, N(thr), ok ? N(r->ttft.p99) : "", ok ? N(r->tpot.p99) : "", N(price),
                    N(cost), h->slo ? (meets ? "yes" : "no") : "", note);
  if (h->shown <= 6) {
    char bar[160];
    snprintf(bar, sizeof bar, "%s%s", hwl, ok ? "" : " (failed)");
    ferry__gp_data(&h->s, bar);
    gnum(&h->s, thr);
    gnum(&h->s, cost);
    ferry__sb_puts(&h->s, "\n");
  }
}

/* Every kept group's runs, renumbered 1.. (some ids were withdrawn). */
static void hw_rows(struct report *rp, const int *group, struct rtable *t, struct hw_sum *h) {
  NUMBUF;
  int next = 1;
  for (size_t i = 0; i < rp->n_runs; i++) {
    if (group[i] <= 0 || group[i] < next) continue;
    int g = group[i];
    next = g + 1;
    h->shown++;
    char desc[512];
    axes_desc(rp, &rp->runs[i], "hw", desc, sizeof desc);
    if (h->shown <= 6) ferry__sb_printf(&h->s, "$g%d << EOD\n", h->shown);
    const char *best = NULL;
    double best_cost = INFINITY;
    for (size_t j = i; j < rp->n_runs; j++)
      if (group[j] == g) hw_run(rp, &rp->runs[j], desc, t, h, &best, &best_cost);
    if (h->shown <= 6) ferry__sb_puts(&h->s, "EOD\n");
    if (best)
      ferry__sb_printf(&h->cheapest, "%sgroup %d: %s at %s $ per 1M tokens", h->cheapest.len ? "; " : "", h->shown,
                       best, N(best_cost));
  }
}

/* Throughput and (when any run has a price) cost panels, one bar colour per group. */
static void hw_panels(struct ferry_strbuf *s, int shown, int any_price) {
  /* labels turned to end at their tick: long profile names stay inside the picture */
  ferry__sb_puts(s, "set datafile missing 'NaN'\nset style data histograms\nset style histogram clustered gap 1\n"
                    "set style fill solid 0.85 border -1\nset yrange [0:*]\nset xtics rotate by 30 right nomirror\n"
                    "set bmargin 7\nset key top right\n");
  if (shown == 1) ferry__sb_puts(s, "unset key\n");
  if (any_price) ferry__sb_puts(s, "set multiplot layout 1,2\n");
  for (int panel = 0; panel < (any_price ? 2 : 1); panel++) {
    ferry__gp_set(s, "title", "%s", panel ? "Cost per million output tokens" : "Throughput");
    ferry__gp_set(s, "ylabel", "%s", panel ? "$ per 1M tokens" : "output tokens/s");
    ferry__sb_puts(s, "plot ");
    for (int g = 1; g <= shown && g <= 6; g++) {
      ferry__sb_printf(s, "%s$g%d using %d:xtic(1) title ", g > 1 ? ", " : "", g, panel ? 3 : 2);
      ferry__gp_strf(s, "group %d", g);
      ferry__sb_printf(s, " lt %d", g);
    }
    ferry__sb_puts(s, "\n");
  }
  if (any_price) ferry__sb_puts(s, "unset multiplot\n");
}

ferry_status ferry__section_hardware(struct report *rp) {
  int *group = ferry__calloc(rp->n_runs ? rp->n_runs : 1, sizeof *group);
  if (!group) return NOMEM(rp);
  if (hw_groups(rp, group) == 0) {
    ferry_free(group);
    return FERRY_OK;
  }
  ferry__doc_section(rp, FERRY_REPORT_HARDWARE, "Hardware what-if");
  ferry__doc_para(rp, "The same workload and configuration on several hardware profiles. Cost per million output tokens = "
                      "price per hour / (throughput x 3600) x 10^6, with the price from the profile's price_per_hour_usd "
                      "(or price_per_hour_usd=X in the run's notes); the note says why a cost is missing. A run that "
                      "failed on a profile is listed with its error.");
  struct hw_sum h = {.slo = rp->opt->slo_ttft_p99_ms > 0 || rp->opt->slo_tpot_p99_ms > 0};
  struct rtable *t = ferry__table_new("hardware", "group" SEP "configuration" SEP "hardware" SEP "run" SEP
                                                  "throughput (tok/s)" SEP "TTFT P99 (ms)" SEP "TPOT P99 (ms)" SEP
                                                  "price ($/h)" SEP "cost ($ per 1M tokens)" SEP "meets SLO" SEP "note");
  if (!t) {
    ferry_free(group);
    return NOMEM(rp);
  }
  hw_rows(rp, group, t, &h);
  if (h.cheapest.len)
    ferry__doc_para(rp, "Cheapest run%s: %s.", h.slo ? " meeting the latency objective" : "", h.cheapest.p);
  hw_panels(&h.s, h.shown, h.any_price);
  char cap[400];
  snprintf(cap, sizeof cap,
           "Throughput and cost per million output tokens per hardware profile (one bar colour per group of otherwise "
           "identical runs; a failed run has no bar)%s.",
           h.shown > 6 ? "; groups beyond the sixth are in the table only" : "");
  ferry_status st = h.s.oom || h.cheapest.oom ? NOMEM(rp)
                                              : ferry__emit_plot(rp, "hardware", cap, h.any_price ? 1200 : 700, 540, h.s.p);
  if (st == FERRY_OK) st = ferry__emit_table(rp, t, "The same workload on several hardware profiles.");
  ferry__sb_free(&h.s);
  ferry__sb_free(&h.cheapest);
  ferry__table_free(t);
  ferry_free(group);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}
