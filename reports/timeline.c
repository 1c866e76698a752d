/* The per-run sections of a report: a Gantt chart of the compute, copy and disk queues of one
 * run over a range of engine steps (from the nsys-layout kernel and memcpy tables, streamId =
 * queue), and memory per tier over time with the configured budgets drawn as lines. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "reports/report_internal.h"

#define NOMEM(rp) ferry__err_set(&(rp)->err, FERRY_ERR_NOMEM, "report: out of memory")
#define MAX_OPS 50000 /* boxes drawn at most; a longer range is cut (and says so) */

enum op_cat { CAT_COMPUTE, CAT_H2D, CAT_D2H, CAT_DISK, CAT_OTHER, CAT_COUNT };
static const char *const cat_name[CAT_COUNT] = {"compute", "copy host to device", "copy device to host", "disk read",
                                                "other copy"};
static const char *const cat_short[CAT_COUNT] = {"compute", "h2d", "d2h", "disk", "copy"};
static const char *const cat_color[CAT_COUNT] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#7f7f7f"};

struct op {
  int cat;
  int32_t queue;
  int64_t start, end, bytes, step;
  char name[48];
};

static ferry_status sql_fail(struct report *rp, sqlite3 *db, const char *what) {
  return ferry__err_set(&rp->err, FERRY_ERR_DB, "report: %s: %s", what, sqlite3_errmsg(db));
}

const struct rrun *ferry__timeline_run(struct report *rp, ferry_status *st) {
  *st = FERRY_OK;
  const struct ferry_report_options *o = rp->opt;
  if (o->timeline_run >= 0) {
    for (size_t i = 0; i < rp->n_runs; i++)
      if (rp->runs[i].db == o->timeline_db && rp->runs[i].id == o->timeline_run) return &rp->runs[i];
    *st = ferry__err_set(&rp->err, FERRY_ERR_NOT_FOUND, "%s: no run %lld (--timeline-run)",
                         o->db_paths[o->timeline_db < (int)o->n_dbs && o->timeline_db >= 0 ? o->timeline_db : 0],
                         (long long)o->timeline_run);
    return NULL;
  }
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < rp->n_runs; i++)
      if ((pass || rp->runs[i].complete) && rp->runs[i].n_kernel + rp->runs[i].n_memcpy > 0) return &rp->runs[i];
  return NULL;
}

static int cat_of(int is_kernel, int copy_kind) {
  if (is_kernel) return CAT_COMPUTE;
  switch (copy_kind) {
    case 1: return CAT_H2D;
    case 2: return CAT_D2H;
    case 100: /* ferry's disk reads, and writes (101: a KV cache homed on disk) */
    case 101: return CAT_DISK;
    default: return CAT_OTHER;
  }
}

static const char *const ops_sql =
    "SELECT 1, k.streamId, k.start, k.end, coalesce(s.value, ''), coalesce(k.bytes, 0), coalesce(k.step, -1), 0 "
    "FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s ON s.id = k.shortName WHERE k.runId = ?1 AND %s "
    "UNION ALL "
    "SELECT 0, m.streamId, m.start, m.end, coalesce(s.value, ''), m.bytes, coalesce(m.step, -1), m.copyKind "
    "FROM CUPTI_ACTIVITY_KIND_MEMCPY m LEFT JOIN StringIds s ON s.id = m.nameId WHERE m.runId = ?1 AND %s "
    "ORDER BY 3 LIMIT %d";

/* Rows of the run selected by cond_k / cond_m (which may use ?2 and ?3). */
static ferry_status read_ops(struct report *rp, sqlite3 *db, int64_t run, const char *cond_k, const char *cond_m, int64_t a,
                             int64_t b, struct op **out, size_t *n, int *cut) {
  char *sql = ferry__asprintf(ops_sql, cond_k, cond_m, MAX_OPS + 1);
  if (!sql) return NOMEM(rp);
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db, sql, -1, &q, NULL);
  ferry_free(sql);
  if (rc != SQLITE_OK) return sql_fail(rp, db, "reading the timeline");
  sqlite3_bind_int64(q, 1, run);
  if (sqlite3_bind_parameter_count(q) >= 3) {
    sqlite3_bind_int64(q, 2, a);
    sqlite3_bind_int64(q, 3, b);
  }
  size_t cap = 0;
  ferry_status st = FERRY_OK;
  *cut = 0;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (*n == MAX_OPS) {
      *cut = 1;
      break;
    }
    if (*n == cap) {
      cap = cap ? cap * 2 : 1024;
      struct op *ops = ferry__reallocarray(*out, cap, sizeof *ops);
      if (!ops) {
        st = NOMEM(rp);
        break;
      }
      *out = ops;
    }
    struct op *o = &(*out)[(*n)++];
    o->cat = cat_of(sqlite3_column_int(q, 0), sqlite3_column_int(q, 7));
    o->queue = sqlite3_column_int(q, 1);
    o->start = sqlite3_column_int64(q, 2);
    o->end = sqlite3_column_int64(q, 3);
    const unsigned char *name = sqlite3_column_text(q, 4);
    snprintf(o->name, sizeof o->name, "%s", name ? (const char *)name : "");
    for (char *p = o->name; *p; p++)
      if (*p == '\x1f' || *p == '"' || (unsigned char)*p < 0x20) *p = ' ';
    o->bytes = sqlite3_column_int64(q, 5);
    o->step = sqlite3_column_int64(q, 6);
  }
  if (st == FERRY_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) st = sql_fail(rp, db, "reading the timeline");
  sqlite3_finalize(q);
  return st;
}

static int64_t q_i64(sqlite3 *db, const char *sql, int64_t run, int64_t a, int64_t b, int *found) {
  sqlite3_stmt *q;
  *found = 0;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) return 0;
  sqlite3_bind_int64(q, 1, run);
  if (sqlite3_bind_parameter_count(q) >= 3) {
    sqlite3_bind_int64(q, 2, a);
    sqlite3_bind_int64(q, 3, b);
  }
  int64_t v = 0;
  if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_type(q, 0) != SQLITE_NULL) {
    v = sqlite3_column_int64(q, 0);
    *found = 1;
  }
  sqlite3_finalize(q);
  return v;
}

/* One timeline plot: the run, its window of operations and the queues they ran on. */
struct tl {
  struct report *rp;
  const struct rrun *r;
  sqlite3 *db;
  int64_t first, last; /* step range */
  const char *how;     /* how the window was chosen: "steps", "time window of steps", "first operations" */
  struct op *ops;
  size_t n;
  int cut;
  int32_t queues[64]; /* in id order */
  int qcount[64][CAT_COUNT];
  int role[64]; /* the category each queue mostly runs */
  size_t nq;
  int64_t t0, t1;
  double span_ns, div;
  char range[96];
};

/* The operations of the chosen steps; rows without step numbers (imports) fall back to the steps
 * table's time window, else to the beginning of the run. */
static ferry_status tl_read(struct tl *t) {
  const struct ferry_report_options *o = t->rp->opt;
  int found;
  t->first = o->step_first;
  if (t->first < 0) {
    t->first = q_i64(t->db,
                     "SELECT min(s) FROM (SELECT min(step) AS s FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId = ?1 "
                     "UNION ALL SELECT min(step) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId = ?1)",
                     t->r->id, 0, 0, &found);
    if (!found) t->first = 0;
  }
  t->last = o->step_last >= 0 ? o->step_last : ferry__sat_add_i64(t->first, 2);
  if (t->last < t->first) t->last = t->first;
  t->how = "steps";
  ferry_status st = read_ops(t->rp, t->db, t->r->id, "k.step BETWEEN ?2 AND ?3", "m.step BETWEEN ?2 AND ?3", t->first,
                             t->last, &t->ops, &t->n, &t->cut);
  if (st != FERRY_OK || t->n) return st;
  int f1, f2;
  int64_t t0 = q_i64(t->db, "SELECT min(start_ns) FROM steps WHERE runId = ?1 AND step BETWEEN ?2 AND ?3", t->r->id,
                     t->first, t->last, &f1);
  int64_t t1 = q_i64(t->db, "SELECT max(end_ns) FROM steps WHERE runId = ?1 AND step BETWEEN ?2 AND ?3", t->r->id,
                     t->first, t->last, &f2);
  if (f1 && f2) {
    t->how = "time window of steps";
    return read_ops(t->rp, t->db, t->r->id, "k.end > ?2 AND k.start < ?3", "m.end > ?2 AND m.start < ?3", t0, t1,
                    &t->ops, &t->n, &t->cut);
  }
  t->how = "first operations";
  return read_ops(t->rp, t->db, t->r->id, "k.start >= 0 AND ?2 <= ?3", "m.start >= 0 AND ?2 <= ?3", 0, 0, &t->ops,
                  &t->n, &t->cut);
}

/* Queues in id order, each labelled by the kind of op it mostly runs; the time span. */
static void tl_queues(struct tl *t) {
  t->t0 = INT64_MAX;
  t->t1 = INT64_MIN;
  for (size_t i = 0; i < t->n; i++) {
    size_t k;
    for (k = 0; k < t->nq; k++)
      if (t->queues[k] == t->ops[i].queue) break;
    if (k == t->nq && t->nq < 64) t->queues[t->nq++] = t->ops[i].queue;
    if (k < 64) t->qcount[k][t->ops[i].cat]++;
    if (t->ops[i].start < t->t0) t->t0 = t->ops[i].start;
    if (t->ops[i].end > t->t1) t->t1 = t->ops[i].end;
  }
  for (size_t a = 1; a < t->nq; a++)
    for (size_t b = a; b > 0 && t->queues[b - 1] > t->queues[b]; b--) {
      int32_t tq = t->queues[b];
      t->queues[b] = t->queues[b - 1];
      t->queues[b - 1] = tq;
      int tc[CAT_COUNT];
      memcpy(tc, t->qcount[b], sizeof tc);
      memcpy(t->qcount[b], t->qcount[b - 1], sizeof tc);
      memcpy(t->qcount[b - 1], tc, sizeof tc);
    }
  for (size_t k = 0; k < t->nq; k++) {
    int best = 0;
    for (int c = 1; c < CAT_COUNT; c++)
      if (t->qcount[k][c] > t->qcount[k][best]) best = c;
    t->role[k] = best;
  }
  t->span_ns = ferry__span(t->t0, t->t1);
  t->div = t->span_ns < 2e6 ? 1e3 : 1e6;
}

/* Per queue: operations, busy time, share of the span and bytes; and every operation. */
static void tl_tables(const struct tl *t, struct rtable *qt, struct rtable *rows) {
  for (size_t k = 0; k < t->nq; k++) {
    double busy = 0, bytes = 0;
    int cnt = 0;
    for (size_t i = 0; i < t->n; i++)
      if (t->ops[i].queue == t->queues[k]) {
        busy += ferry__span(t->ops[i].start, t->ops[i].end);
        bytes += (double)t->ops[i].bytes;
        cnt++;
      }
    char b1[32], b2[32], b3[32];
    ferry__table_rowf(qt, "%d" SEP "%s" SEP "%d" SEP "%s" SEP "%s" SEP "%s", t->queues[k], cat_short[t->role[k]], cnt,
                      ferry__fmt_num(busy / 1e6, b1, sizeof b1),
                      ferry__fmt_num(t->span_ns > 0 ? 100.0 * busy / t->span_ns : 0, b2, sizeof b2),
                      ferry__fmt_num(bytes / 1048576.0, b3, sizeof b3));
  }
  for (size_t i = 0; i < t->n; i++) {
    const struct op *op = &t->ops[i];
    ferry__table_rowf(rows, "%s" SEP "%d" SEP "%s" SEP "%.6f" SEP "%.6f" SEP "%.3f" SEP "%lld" SEP "%lld",
                      cat_short[op->cat], op->queue, op->name, ferry__span(t->t0, op->start) / 1e6,
                      ferry__span(t->t0, op->end) / 1e6, ferry__span(op->start, op->end) / 1e3, (long long)op->bytes,
                      (long long)op->step);
  }
}

/* One data block of boxes per category; which categories have any. */
static void tl_boxes(const struct tl *t, struct ferry_strbuf *s, int used[CAT_COUNT]) {
  for (int c = 0; c < CAT_COUNT; c++) {
    ferry__sb_printf(s, "$c%d << EOD\n", c);
    for (size_t i = 0; i < t->n; i++) {
      if (t->ops[i].cat != c) continue;
      size_t lane = 0;
      while (lane < t->nq && t->queues[lane] != t->ops[i].queue) lane++;
      double x0 = ferry__span(t->t0, t->ops[i].start) / t->div, x1 = ferry__span(t->t0, t->ops[i].end) / t->div;
      ferry__sb_printf(s, "%.6f %zu %.6f %.6f %.2f %.2f\n", (x0 + x1) / 2, lane, x0, x1, lane - 0.38, lane + 0.38);
      used[c] = 1;
    }
    ferry__sb_puts(s, "EOD\n");
  }
}

/* Dotted lines at the step starts, from the steps table. */
static void tl_step_marks(const struct tl *t, struct ferry_strbuf *s) {
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(t->db,
                         "SELECT step, start_ns FROM steps WHERE runId = ?1 AND start_ns BETWEEN ?2 AND ?3 ORDER BY "
                         "start_ns LIMIT 64",
                         -1, &q, NULL) != SQLITE_OK)
    return;
  sqlite3_bind_int64(q, 1, t->r->id);
  sqlite3_bind_int64(q, 2, t->t0);
  sqlite3_bind_int64(q, 3, t->t1);
  while (sqlite3_step(q) == SQLITE_ROW) {
    double x = ferry__span(t->t0, sqlite3_column_int64(q, 1)) / t->div;
    ferry__sb_printf(s, "set arrow from %.6f, graph 0 to %.6f, graph 1 nohead dt 3 lc rgb '#888888'\nset label ", x, x);
    ferry__gp_strf(s, "step %lld", (long long)sqlite3_column_int64(q, 0));
    ferry__sb_printf(s, " at %.6f, graph 1.02 font ',9' tc rgb '#555555'\n", x);
  }
  sqlite3_finalize(q);
}

/* The Gantt chart's gnuplot script. */
static void tl_script(struct report *rp, const struct tl *t, struct ferry_strbuf *s) {
  int used[CAT_COUNT] = {0};
  tl_boxes(t, s, used);
  tl_step_marks(t, s);
  ferry__events_marks(rp, t->r, t->t0, t->t1, t->div, s);
  ferry__sb_printf(s, "set yrange [%zu.6:-0.6]\nset ytics (", t->nq - 1);
  for (size_t k = 0; k < t->nq; k++) {
    ferry__sb_puts(s, k ? ", " : "");
    char tic[64];
    snprintf(tic, sizeof tic, "queue %d: %s", t->queues[k], cat_short[t->role[k]]);
    ferry__gp_tic(s, tic);
    ferry__sb_printf(s, " %zu", k);
  }
  ferry__sb_puts(s, ")\n");
  ferry__gp_set(s, "xlabel", "time since the first operation (%s)", t->div == 1e3 ? "us" : "ms");
  ferry__sb_printf(s, "set xrange [0:%.6f]\nset grid xtics\nset key outside right top vertical\n"
                      "set style fill solid 0.85 noborder\nset title ", t->span_ns / t->div);
  ferry__gp_strf(s, "Run %s: %s", t->r->label, t->range);
  ferry__sb_puts(s, " offset 0,1\nplot ");
  int any = 0;
  for (int c = 0; c < CAT_COUNT; c++) {
    if (!used[c]) continue;
    ferry__sb_printf(s, "%s$c%d using 1:2:3:4:5:6 with boxxyerror lc rgb '%s' title ", any ? ", " : "", c, cat_color[c]);
    ferry__gp_str(s, cat_name[c]);
    any = 1;
  }
  ferry__sb_puts(s, "\n");
}

/* The chart, the per-queue table and the CSV of every operation. */
static ferry_status tl_emit(struct report *rp, const struct tl *t, struct rtable *qt, struct rtable *rows) {
  struct ferry_strbuf s = {0};
  tl_script(rp, t, &s);
  ferry_status st = FERRY_OK;
  if (s.oom) {
    st = NOMEM(rp);
    goto out;
  }
  char cap[300];
  snprintf(cap, sizeof cap, "Gantt chart of the queues of run %s, %s (dotted lines: step starts).", t->r->label,
           t->range);
  if ((st = ferry__emit_plot(rp, "timeline", cap, 1200, 190 + 46 * (int)t->nq, s.p)) != FERRY_OK) goto out;
  if ((st = ferry__emit_table(rp, qt, "Per queue over the range: operations, busy time and bytes.")) != FERRY_OK)
    goto out;
  if ((st = ferry__emit_csv(rp, rows)) != FERRY_OK) goto out;
  ferry__sb_puts(&rp->html, "<p>Every operation of the chart: <a href=\"tables/timeline.csv\">timeline.csv</a>.</p>\n");
  ferry__sb_puts(&rp->md, "Every operation of the chart: [tables/timeline.csv](tables/timeline.csv).\n\n");
out:
  ferry__sb_free(&s);
  return st;
}

ferry_status ferry__section_timeline(struct report *rp) {
  ferry_status st;
  const struct rrun *r = ferry__timeline_run(rp, &st);
  if (!r) return st;
  struct tl *t = ferry__calloc(1, sizeof *t);
  if (!t) return NOMEM(rp);
  t->rp = rp;
  t->r = r;
  t->db = ferry__run_db(rp, r);
  st = tl_read(t);
  if (st != FERRY_OK || t->n == 0) {
    ferry_free(t->ops);
    ferry_free(t);
    return st;
  }
  tl_queues(t);
  char title[160];
  snprintf(title, sizeof title, "Timeline of run %s", r->label);
  ferry__doc_section(rp, FERRY_REPORT_TIMELINE, title);
  if (!strcmp(t->how, "first operations")) snprintf(t->range, sizeof t->range, "its first %zu operations", t->n);
  else snprintf(t->range, sizeof t->range, "steps %lld to %lld", (long long)t->first, (long long)t->last);
  ferry__doc_para(rp,
                  "Run %s (%s%s%s), %s: %zu operations on %zu queues over %.3f ms%s. Each bar is one operation on its "
                  "queue (stream); gaps on the compute queue while a copy or read is in flight are stalls.",
                  r->label, r->kind, r->hardware ? ", " : "", r->hardware ? r->hardware : "", t->range, t->n, t->nq,
                  t->span_ns / 1e6, t->cut ? " (cut at the first 50000)" : "");
  struct rtable *qt = ferry__table_new("timeline_queues", "queue" SEP "role" SEP "operations" SEP "busy (ms)" SEP
                                                         "busy share (%)" SEP "bytes (MiB)");
  struct rtable *rows = ferry__table_new("timeline", "category" SEP "queue" SEP "name" SEP "start (ms)" SEP "end (ms)" SEP
                                                     "duration (us)" SEP "bytes" SEP "step");
  if (!qt || !rows) {
    st = NOMEM(rp);
  } else {
    tl_tables(t, qt, rows);
    st = tl_emit(rp, t, qt, rows);
  }
  ferry__table_free(qt);
  ferry__table_free(rows);
  ferry_free(t->ops);
  ferry_free(t);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}

/* ---- memory per tier ----------------------------------------------------------------------- */

#define MEM_POINTS 4000 /* per tier; longer series keep the maximum of each time bucket */

struct sample {
  int64_t t;
  double used;
};

/* One memory plot: the run's samples per tier and how they are drawn. */
struct mem {
  struct report *rp;
  const struct rrun *r;
  struct sample *v[3];
  size_t nv[3], cap[3];
  int64_t tmin, tmax;
  double budget[3];
  const char *unit;
  double scale, tdiv;
  int log_y, ms;
};

static const char *const mem_tiers[3] = {"device", "host", "disk"};

/* Every sample of the run, per tier, and their time span. */
static ferry_status mem_read(struct mem *m) {
  sqlite3 *db = ferry__run_db(m->rp, m->r);
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(db, "SELECT t_ns, tier, used_bytes FROM memory WHERE runId = ? ORDER BY t_ns", -1, &q, NULL) !=
      SQLITE_OK)
    return sql_fail(m->rp, db, "reading memory");
  sqlite3_bind_int64(q, 1, m->r->id);
  m->tmin = INT64_MAX;
  m->tmax = INT64_MIN;
  ferry_status st = FERRY_OK;
  while (sqlite3_step(q) == SQLITE_ROW) {
    const char *tier = (const char *)sqlite3_column_text(q, 1);
    int t = !tier ? -1 : !strcmp(tier, "device") ? 0 : !strcmp(tier, "host") ? 1 : !strcmp(tier, "disk") ? 2 : -1;
    if (t < 0) continue;
    if (m->nv[t] == m->cap[t]) {
      m->cap[t] = m->cap[t] ? m->cap[t] * 2 : 1024;
      struct sample *p = ferry__reallocarray(m->v[t], m->cap[t], sizeof *p);
      if (!p) {
        st = NOMEM(m->rp);
        break;
      }
      m->v[t] = p;
    }
    int64_t tn = sqlite3_column_int64(q, 0);
    m->v[t][m->nv[t]].t = tn;
    m->v[t][m->nv[t]++].used = ferry__finite_or(sqlite3_column_double(q, 2), 0);
    if (tn < m->tmin) m->tmin = tn;
    if (tn > m->tmax) m->tmax = tn;
  }
  sqlite3_finalize(q);
  /* an engine event after the last sample (requests refused while idle) still shows */
  const int64_t last_event = ferry__events_last(m->rp, m->r);
  if (m->tmin != INT64_MAX && last_event > m->tmax) m->tmax = last_event;
  return st;
}

/* At most MEM_POINTS per tier, keeping the peak of each bucket so downsampling never hides a
 * budget breach. */
static void mem_downsample(struct mem *m) {
  for (int t = 0; t < 3; t++) {
    if (m->nv[t] <= MEM_POINTS) continue;
    struct sample *v = m->v[t];
    double w = (ferry__span(m->tmin, m->tmax) + 1) / MEM_POINTS;
    size_t out_n = 0;
    for (size_t i = 0; i < m->nv[t];) {
      size_t b = ferry__f64_to_index(ferry__span(m->tmin, v[i].t) / w, MEM_POINTS);
      struct sample best = v[i];
      size_t j = i + 1;
      while (j < m->nv[t] && ferry__f64_to_index(ferry__span(m->tmin, v[j].t) / w, MEM_POINTS) == b) {
        if (v[j].used > best.used) best.used = v[j].used;
        j++;
      }
      best.t = v[i].t;
      v[out_n++] = best;
      i = j;
    }
    m->nv[t] = out_n;
  }
}

/* Budgets (defaults included), the byte unit, and the axes: logarithmic when peaks and budgets
 * span two decades (a device tier of a few MiB beside a host tier of tens of GiB is a flat line
 * on a linear axis; an empty tier then reads as a gap); short runs in ms. */
static void mem_scale(struct mem *m) {
  const struct rrun *r = m->r;
  m->budget[0] = ferry__run_num(r, "device_budget");
  m->budget[1] = ferry__run_num(r, "host_budget");
  m->budget[2] = NAN;
  for (int t = 0; t < 2; t++)
    if (r->budget_bytes[t] > 0) m->budget[t] = r->budget_bytes[t];
  double hi = 0;
  for (int t = 0; t < 3; t++) {
    hi = fmax(hi, r->peak_bytes[t]);
    if (m->budget[t] > 0) hi = fmax(hi, m->budget[t]);
  }
  m->unit = "GiB";
  m->scale = 1.0 / (double)(1ull << 30);
  if (hi < (double)(1ull << 30)) {
    m->unit = "MiB";
    m->scale = 1.0 / 1048576.0;
  }
  double levels[6];
  size_t nlevels = 0;
  for (int t = 0; t < 3; t++) {
    if (m->nv[t]) levels[nlevels++] = r->peak_bytes[t];
    if (m->nv[t] && m->budget[t] > 0) levels[nlevels++] = m->budget[t];
  }
  m->log_y = ferry__spans_decades(levels, nlevels);
  m->ms = ferry__span(m->tmin, m->tmax) < 2e9;
  m->tdiv = m->ms ? 1e6 : 1e9;
}

/* One data block per tier, the samples' CSV and the peak-against-budget table. */
static void mem_series(const struct mem *m, struct ferry_strbuf *s, struct rtable *pts, struct rtable *sumt) {
  for (int t = 0; t < 3; t++) {
    const struct sample *v = m->v[t];
    const size_t nv = m->nv[t];
    ferry__sb_printf(s, "$t%d << EOD\n", t);
    for (size_t i = 0; i < nv; i++) {
      double x = ferry__span(m->tmin, v[i].t) / m->tdiv;
      if (m->log_y && !(v[i].used > 0)) ferry__sb_printf(s, "%.9f NaN\n", x);
      else ferry__sb_printf(s, "%.9f %.9g\n", x, v[i].used * m->scale);
      ferry__table_rowf(pts, "%.9f" SEP "%s" SEP "%.0f", ferry__span(m->tmin, v[i].t) / 1e9, mem_tiers[t], v[i].used);
    }
    /* extend the last level to the end of the run so the step line reaches the right edge */
    if (nv && !(m->log_y && !(v[nv - 1].used > 0)))
      ferry__sb_printf(s, "%.9f %.9g\n", ferry__span(m->tmin, m->tmax) / m->tdiv, v[nv - 1].used * m->scale);
    ferry__sb_puts(s, "EOD\n");
    if (!nv) continue;
    char b1[32], b2[32], b3[32];
    const double peak = m->r->peak_bytes[t], budget = m->budget[t];
    ferry__table_rowf(sumt, "%s" SEP "%zu" SEP "%s" SEP "%s" SEP "%s", mem_tiers[t], nv,
                      ferry__fmt_num(peak * m->scale, b1, sizeof b1),
                      budget > 0 ? ferry__fmt_num(budget * m->scale, b2, sizeof b2) : "unlimited",
                      budget > 0 ? ferry__fmt_num(100.0 * peak / budget, b3, sizeof b3) : "");
  }
}

/* Axes, event marks, budget lines (steps when engine events changed them) and the plot command;
 * returns whether any tier is drawn. */
static int mem_plot(const struct mem *m, struct ferry_strbuf *s) {
  struct report *rp = m->rp;
  const struct rrun *r = m->r;
  ferry__events_marks(rp, r, m->tmin, m->tmax, m->tdiv, s);
  ferry__gp_set(s, "xlabel", "time since the first sample (%s)", m->ms ? "ms" : "s");
  ferry__gp_set(s, "ylabel", "bytes in use (%s%s)", m->unit, m->log_y ? ", log scale" : "");
  ferry__sb_puts(s, m->log_y ? "set datafile missing 'NaN'\nset logscale y\nset key outside right top\n"
                             : "set yrange [0:*]\nset key outside right top\n");
  ferry__gp_set(s, "title", "Memory per tier, run %s", r->label);
  int moving[2] = {
      ferry__events_budget_line(rp, r, 0, m->tmin, m->tmax, m->tdiv, m->budget[0], m->scale, "$b0", s),
      ferry__events_budget_line(rp, r, 1, m->tmin, m->tmax, m->tdiv, m->budget[1], m->scale, "$b1", s)};
  ferry__sb_puts(s, "plot ");
  int drawn = 0;
  for (int t = 0; t < 3; t++) {
    if (!m->nv[t]) continue;
    ferry__sb_printf(s, "%s$t%d using 1:2 with steps lt %d lw 2 title ", drawn ? ", " : "", t, t + 1);
    ferry__gp_str(s, mem_tiers[t]);
    drawn = 1;
    if (t < 2 && moving[t]) {
      ferry__sb_printf(s, ", $b%d using 1:2 with steps lt %d dt 2 lw 1.5 title ", t, t + 1);
      ferry__gp_strf(s, "%s budget", mem_tiers[t]);
    } else if (m->budget[t] > 0) {
      ferry__sb_printf(s, ", %.9g with lines lt %d dt 2 lw 1.5 title ", m->budget[t] * m->scale, t + 1);
      ferry__gp_strf(s, "%s budget", mem_tiers[t]);
    }
  }
  ferry__sb_puts(s, "\n");
  return drawn;
}

/* The run the memory plot shows: the timeline's run, else the first complete run with samples. */
static const struct rrun *mem_run(struct report *rp, ferry_status *st) {
  const struct rrun *r = ferry__timeline_run(rp, st);
  if (*st != FERRY_OK) return NULL;
  if (!r || r->n_mem == 0) {
    r = NULL;
    for (size_t i = 0; i < rp->n_runs && !r; i++)
      if (rp->runs[i].complete && rp->runs[i].n_mem > 0) r = &rp->runs[i];
  }
  return r;
}

ferry_status ferry__section_memory(struct report *rp) {
  ferry_status st;
  const struct rrun *r = mem_run(rp, &st);
  if (!r) return st;
  struct mem m = {.rp = rp, .r = r};
  struct rtable *pts = NULL, *sumt = NULL;
  struct ferry_strbuf s = {0};
  if ((st = mem_read(&m)) != FERRY_OK) goto out;
  mem_downsample(&m);
  mem_scale(&m);
  char title[160];
  snprintf(title, sizeof title, "Memory per tier over time (run %s)", r->label);
  ferry__doc_section(rp, FERRY_REPORT_MEMORY, title);
  ferry__doc_para(rp, "Bytes in use per tier, sampled at every change of the peak and at least once per engine step; "
                      "dashed lines are the budgets the run had (device_budget, host_budget, defaults included; none drawn when unlimited); "
                      "vertical dashed lines mark the run's engine events (red: budget changes and pressure transitions, green: "
                      "reloads, black: a device failure).");
  pts = ferry__table_new("memory", "time (s)" SEP "tier" SEP "used (bytes)");
  char head[200];
  snprintf(head, sizeof head, "tier" SEP "samples" SEP "peak (%s)" SEP "budget (%s)" SEP "peak / budget (%%)", m.unit,
           m.unit);
  sumt = ferry__table_new("memory_peaks", head);
  if (!pts || !sumt) {
    st = NOMEM(rp);
    goto out;
  }
  mem_series(&m, &s, pts, sumt);
  if (!mem_plot(&m, &s)) goto out;
  if (s.oom) {
    st = NOMEM(rp);
    goto out;
  }
  snprintf(title, sizeof title, "Memory in use per tier over run %s, with the budgets as dashed lines.", r->label);
  if ((st = ferry__emit_plot(rp, "memory", title, 1100, 450, s.p)) != FERRY_OK) goto out;
  if ((st = ferry__emit_table(rp, sumt, "Peak memory per tier against its budget.")) != FERRY_OK) goto out;
  if ((st = ferry__emit_csv(rp, pts)) != FERRY_OK) goto out;
  ferry__sb_puts(&rp->html, "<p>The plotted samples: <a href=\"tables/memory.csv\">memory.csv</a>.</p>\n");
  ferry__sb_puts(&rp->md, "The plotted samples: [tables/memory.csv](tables/memory.csv).\n\n");
  st = ferry__plot_batch_kv(rp, r);
out:
  if (rp->sum.sections & FERRY_REPORT_MEMORY) ferry__sb_puts(&rp->html, "</section>\n");
  ferry__sb_free(&s);
  ferry__table_free(pts);
  ferry__table_free(sumt);
  for (int t = 0; t < 3; t++) ferry_free(m.v[t]);
  return st;
}
