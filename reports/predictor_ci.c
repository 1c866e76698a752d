/* Section "Expert predictors with confidence intervals": per expert predictor (configuration
 * key predictor), what its runs measured with 95% bootstrap intervals, so predictors within
 * noise read as tied: weight-cache hit rate and compute stall per token resampled over engine
 * steps, TPOT median over requests, prefetch precision as a Wilson interval over prefetches
 * (the runs store totals only), and the prefetched experts never used per output token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/metrics.h"
#include "common/rng.h"
#include "reports/routing_sections.h"

#define NOMEM(rp) ferry__err_set(&(rp)->err, FERRY_ERR_NOMEM, "report: out of memory")
#define BOOT 1000

/* Units of a bootstrap: a numerator and a denominator each (a ratio of sums is resampled). */
struct units {
  double *num, *den;
  size_t n, cap;
};

static int push(struct units *u, double num, double den) {
  if (u->n == u->cap) {
    size_t cap = u->cap ? 2 * u->cap : 256;
    double *a = ferry__realloc(u->num, cap * sizeof *a);
    if (!a) return -1;
    u->num = a;
    double *b = ferry__realloc(u->den, cap * sizeof *b);
    if (!b) return -1;
    u->den = b;
    u->cap = cap;
  }
  u->num[u->n] = num;
  u->den[u->n++] = den;
  return 0;
}

static void units_free(struct units *u) {
  ferry_free(u->num);
  ferry_free(u->den);
  memset(u, 0, sizeof *u);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

struct ci {
  double value, lo, hi;
};

/* Ratio of sums, or the median of num when median is set, with its percentile interval. */
static int bootstrap(const struct units *u, int median, uint64_t seed, struct ci *out) {
  out->value = out->lo = out->hi = NAN;
  if (!u->n) return 0;
  double *v = ferry__calloc(BOOT, sizeof *v), *tmp = median ? ferry__calloc(u->n, sizeof *tmp) : NULL;
  if (!v || (median && !tmp)) {
    ferry_free(v);
    ferry_free(tmp);
    return -1;
  }
  struct ferry_rng rng;
  ferry__rng_seed_stream(&rng, seed, 0x7265706fULL);
  double sn = 0, sd = 0;
  for (size_t i = 0; i < u->n; i++) sn += u->num[i], sd += u->den[i];
  if (median) {
    memcpy(tmp, u->num, u->n * sizeof *tmp);
    qsort(tmp, u->n, sizeof *tmp, cmp_double);
    out->value = ferry__percentile(tmp, u->n, 50); /* the P50 of the metrics (docs/metrics.md) */
  } else {
    out->value = sd > 0 ? sn / sd : NAN;
  }
  for (int b = 0; b < BOOT; b++) {
    double n = 0, d = 0;
    for (size_t i = 0; i < u->n; i++) {
      size_t j = (size_t)ferry__rng_below(&rng, u->n);
      if (median) tmp[i] = u->num[j];
      else n += u->num[j], d += u->den[j];
    }
    if (median) {
      qsort(tmp, u->n, sizeof *tmp, cmp_double);
      v[b] = ferry__percentile(tmp, u->n, 50);
    } else {
      v[b] = d > 0 ? n / d : NAN;
    }
  }
  int m = 0;
  for (int b = 0; b < BOOT; b++)
    if (isfinite(v[b])) v[m++] = v[b];
  qsort(v, (size_t)m, sizeof *v, cmp_double);
  if (m) {
    out->lo = v[(int)floor(0.025 * (m - 1))];
    out->hi = v[(int)ceil(0.975 * (m - 1))];
  }
  ferry_free(v);
  ferry_free(tmp);
  return 0;
}

/* Wilson score interval of k successes in n trials (95%). */
static struct ci wilson(double k, double n) {
  struct ci c = {NAN, NAN, NAN};
  if (n <= 0) return c;
  const double z = 1.959964, p = k / n, z2n = z * z / n;
  const double mid = (p + z2n / 2) / (1 + z2n), half = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z2n);
  c.value = p;
  c.lo = mid - half;
  c.hi = mid + half;
  return c;
}

/* One predictor's measurements over its runs. */
struct pred {
  const char *name;
  int runs;
  struct units hit, stall, tpot;
  double prefetches, used, out_tokens;
  struct ci c_hit, c_stall, c_tpot, c_prec;
};

static ferry_status gather(struct report *rp, const struct rrun *r, struct pred *p) {
  sqlite3 *db = ferry__run_db(rp, r);
  sqlite3_stmt *q = NULL;
  int bad = 0;
  if (sqlite3_prepare_v2(db, "SELECT hits, misses, stall_ns, tokens FROM steps WHERE runId = ?", -1, &q, NULL) ==
      SQLITE_OK) {
    sqlite3_bind_int64(q, 1, r->id);
    while (!bad && sqlite3_step(q) == SQLITE_ROW) {
      double h = sqlite3_column_double(q, 0), m = sqlite3_column_double(q, 1);
      double stall_ms = sqlite3_column_double(q, 2) / 1e6, tok = sqlite3_column_double(q, 3);
      if (h + m > 0 && isfinite(h + m)) bad |= push(&p->hit, h, h + m);
      if (tok > 0 && isfinite(stall_ms)) bad |= push(&p->stall, stall_ms, tok);
    }
  }
  sqlite3_finalize(q);
  q = NULL;
  /* TPOT as every other table has it (common/metrics.h) */
  if (!bad && sqlite3_prepare_v2(db, "SELECT arrival_ns, first_token_ns, finish_ns, output_tokens FROM requests "
                                     "WHERE runId = ?", -1, &q, NULL) == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, r->id);
    while (!bad && sqlite3_step(q) == SQLITE_ROW) {
      struct ferry__request_latency lat;
      const int64_t ft = sqlite3_column_type(q, 1) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 1);
      const int64_t fin = sqlite3_column_type(q, 2) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 2);
      if (ferry__request_latency(sqlite3_column_int64(q, 0), ft, fin, sqlite3_column_int64(q, 3), &lat) &&
          lat.has_tpot && isfinite(lat.tpot_ns))
        bad |= push(&p->tpot, lat.tpot_ns / 1e6, 1);
    }
  }
  sqlite3_finalize(q);
  q = NULL;
  if (!bad && sqlite3_prepare_v2(db, "SELECT name, value FROM META_DATA_EXPORT WHERE runId = ? AND name IN "
                                     "('EXPERT_PREFETCHES', 'EXPERT_PREFETCHES_USED')", -1, &q, NULL) == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, r->id);
    double n = NAN, u = NAN;
    while (sqlite3_step(q) == SQLITE_ROW) {
      const char *name = (const char *)sqlite3_column_text(q, 0), *value = (const char *)sqlite3_column_text(q, 1);
      if (!name || !value) continue;
      double v = strtod(value, NULL);
      if (!strcmp(name, "EXPERT_PREFETCHES")) n = v;
      else u = v;
    }
    if (isfinite(n) && isfinite(u) && n >= u && u >= 0) {
      p->prefetches += n;
      p->used += u;
    }
  }
  sqlite3_finalize(q);
  p->out_tokens += (double)r->out_tokens;
  return bad ? NOMEM(rp) : FERRY_OK;
}

static const char *cell(const struct ci *c, double scale, char *buf, size_t len) {
  char a[32], b[32], d[32];
  if (isnan(c->value)) snprintf(buf, len, "-");
  else if (isnan(c->lo)) snprintf(buf, len, "%s", ferry__fmt_num(c->value * scale, a, sizeof a));
  else
    snprintf(buf, len, "%s [%s, %s]", ferry__fmt_num(c->value * scale, a, sizeof a),
             ferry__fmt_num(c->lo * scale, b, sizeof b), ferry__fmt_num(c->hi * scale, d, sizeof d));
  return buf;
}

static int overlap(const struct ci *a, const struct ci *b) {
  return !isnan(a->lo) && !isnan(b->lo) && a->lo <= b->hi && b->lo <= a->hi;
}

ferry_status ferry__section_predictor_ci(struct report *rp) {
  const struct raxis *ax = NULL;
  for (size_t a = 0; a < rp->n_axes; a++)
    if (!strcmp(rp->axes[a].key, "predictor")) ax = &rp->axes[a];
  if (!ax) return FERRY_OK;
  struct pred *p = ferry__calloc(ax->n ? ax->n : 1, sizeof *p);
  if (!p) return NOMEM(rp);
  ferry_status st = FERRY_OK;
  char v[256];
  for (size_t k = 0; k < ax->n && st == FERRY_OK; k++) {
    p[k].name = ax->vals[k];
    if (!*p[k].name) continue; /* runs without a predictor: nothing to compare */
    for (size_t i = 0; i < rp->n_runs && st == FERRY_OK; i++) {
      const struct rrun *r = &rp->runs[i];
      if (!r->complete || r->n_req <= 0) continue;
      ferry__run_val(r, "predictor", v, sizeof v);
      if (strcmp(v, ax->vals[k])) continue;
      p[k].runs++;
      st = gather(rp, r, &p[k]);
    }
    if (st == FERRY_OK && (bootstrap(&p[k].hit, 0, 1, &p[k].c_hit) || bootstrap(&p[k].stall, 0, 2, &p[k].c_stall) ||
                           bootstrap(&p[k].tpot, 1, 3, &p[k].c_tpot)))
      st = NOMEM(rp);
    p[k].c_prec = wilson(p[k].used, p[k].prefetches);
  }
  struct rtable *t = NULL;
  if (st != FERRY_OK) goto out_free;
  ferry__doc_section(rp, FERRY_REPORT_PREDICTOR_CI, "Expert predictors with confidence intervals");
  ferry__doc_para(rp, "Per expert predictor, over all its runs, with 95%% intervals: weight-cache hit rate and compute "
                      "stall per processed token resampled over engine steps, the median TPOT resampled over "
                      "requests (bootstrap, %d resamples), and prefetch precision (prefetched experts used before "
                      "eviction) as a Wilson interval over the prefetches. A predictor whose hit-rate interval "
                      "overlaps another's is listed as tied with it: the difference is within the noise. "
                      "Recall and precision of the prediction itself are measured offline by ferry predictor eval.",
                  BOOT);
  t = ferry__table_new("predictor_ci", "predictor" SEP "runs" SEP "hit rate (%)" SEP "stall per token (ms)" SEP
                                       "TPOT P50 (ms)" SEP "prefetch precision (%)" SEP
                                       "prefetched unused per output token" SEP "tied on hit rate with");
  if (!t) {
    st = NOMEM(rp);
    goto out_free;
  }
  for (size_t k = 0; k < ax->n; k++) {
    if (!p[k].runs) continue;
    char c1[96], c2[96], c3[96], c4[96], unused[32], ties[512] = "", name[128];
    snprintf(name, sizeof name, "%s", p[k].name);
    for (char *c = name; *c; c++)
      if ((unsigned char)*c < 0x20) *c = '?'; /* table cells never hold control characters */
    for (size_t j = 0; j < ax->n; j++) {
      if (j == k || !p[j].runs || !overlap(&p[k].c_hit, &p[j].c_hit)) continue;
      size_t len = strlen(ties);
      snprintf(ties + len, sizeof ties - len, "%s%s", len ? ", " : "", p[j].name);
    }
    for (char *c = ties; *c; c++)
      if ((unsigned char)*c < 0x20) *c = '?';
    double waste = p[k].out_tokens > 0 && p[k].prefetches > 0 ? (p[k].prefetches - p[k].used) / p[k].out_tokens : NAN;
    ferry__table_rowf(t, "%s" SEP "%d" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s", name, p[k].runs,
                      cell(&p[k].c_hit, 100, c1, sizeof c1), cell(&p[k].c_stall, 1, c2, sizeof c2),
                      cell(&p[k].c_tpot, 1, c3, sizeof c3), cell(&p[k].c_prec, 100, c4, sizeof c4),
                      ferry__fmt_num(waste, unused, sizeof unused), ties[0] ? ties : "-");
  }
  st = ferry__emit_table(rp, t, "Per expert predictor, with 95% confidence intervals.");
  ferry__sb_puts(&rp->html, "</section>\n");
out_free:
  ferry__table_free(t);
  for (size_t k = 0; k < ax->n; k++) {
    units_free(&p[k].hit);
    units_free(&p[k].stall);
    units_free(&p[k].tpot);
  }
  ferry_free(p);
  return st;
}
