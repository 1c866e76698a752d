/* What kept a run up (engine_events, schema version 6): budget changes, memory-pressure
 * transitions, reloads, I/O retries, device failures and refused requests, as marks on the
 * run's timeline and memory charts and as a section of their own (a table, the CSV, and the
 * degradation level over time). Databases older than version 6 have none: nothing is shown. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/checked.h"
#include "reports/report_internal.h"

#define NOMEM(rp) ferry__err_set(&(rp)->err, FERRY_ERR_NOMEM, "report: out of memory")
#define MAX_MARKS 40  /* labelled marks per chart; more are drawn unlabelled */
#define MAX_ROWS 2000 /* table rows; the CSV has them all */

static int has_events(sqlite3 *db) {
  sqlite3_stmt *q;
  int yes = 0;
  if (sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'engine_events'", -1, &q,
                         NULL) == SQLITE_OK) {
    yes = sqlite3_step(q) == SQLITE_ROW;
    sqlite3_finalize(q);
  }
  return yes;
}

static const char *color_of(const char *kind) {
  if (!kind) return "#7f7f7f";
  if (!strcmp(kind, "pressure")) return "#d62728";
  if (!strcmp(kind, "reload")) return "#2ca02c";
  if (!strcmp(kind, "device")) return "#000000";
  return "#8c564b"; /* io, refused */
}

void ferry__events_marks(struct report *rp, const struct rrun *r, int64_t t0, int64_t t1, double div,
                         struct ferry_strbuf *s) {
  sqlite3 *db = ferry__run_db(rp, r);
  if (!has_events(db)) return;
  sqlite3_stmt *q;
  /* refused requests and retries are many: the chart marks transitions, the table has the rest */
  if (sqlite3_prepare_v2(db,
                         "SELECT t_ns, kind, action FROM engine_events WHERE runId = ?1 AND t_ns BETWEEN ?2 AND ?3 "
                         "AND kind IN ('pressure', 'reload', 'device') ORDER BY t_ns LIMIT 200",
                         -1, &q, NULL) != SQLITE_OK)
    return;
  sqlite3_bind_int64(q, 1, r->id);
  sqlite3_bind_int64(q, 2, t0);
  sqlite3_bind_int64(q, 3, t1);
  int n = 0;
  while (sqlite3_step(q) == SQLITE_ROW) {
    const char *kind = (const char *)sqlite3_column_text(q, 1), *action = (const char *)sqlite3_column_text(q, 2);
    double x = ferry__span(t0, sqlite3_column_int64(q, 0)) / div;
    ferry__sb_printf(s, "set arrow from %.6f, graph 0 to %.6f, graph 1 nohead dt 2 lw 1.5 lc rgb '%s'\n", x, x,
                     color_of(kind));
    if (n++ < MAX_MARKS) {
      ferry__sb_puts(s, "set label ");
      ferry__gp_str(s, action ? action : "");
      /* labels of events close together alternate heights so they do not print over each other */
      ferry__sb_printf(s, " at %.6f, graph %s rotate by 90 right font ',8' tc rgb '%s' front\n", x,
                       n % 2 ? "0.98" : "0.62", color_of(kind));
    }
  }
  sqlite3_finalize(q);
}

int64_t ferry__events_last(struct report *rp, const struct rrun *r) {
  sqlite3 *db = ferry__run_db(rp, r);
  int64_t last = INT64_MIN;
  sqlite3_stmt *q;
  if (!has_events(db) ||
      sqlite3_prepare_v2(db, "SELECT max(t_ns) FROM engine_events WHERE runId = ? AND kind IN ('pressure', 'reload', 'device')",
                         -1, &q, NULL) != SQLITE_OK)
    return last;
  sqlite3_bind_int64(q, 1, r->id);
  if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_type(q, 0) != SQLITE_NULL) last = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  return last;
}

int ferry__events_budget_line(struct report *rp, const struct rrun *r, int tier, int64_t t0, int64_t t1, double div,
                              double initial, double scale, const char *name, struct ferry_strbuf *s) {
  sqlite3 *db = ferry__run_db(rp, r);
  if (!has_events(db)) return 0;
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(db,
                         "SELECT t_ns, budget_bytes FROM engine_events WHERE runId = ?1 AND tier = ?2 AND "
                         "budget_bytes > 0 ORDER BY t_ns LIMIT 10000",
                         -1, &q, NULL) != SQLITE_OK)
    return 0;
  sqlite3_bind_int64(q, 1, r->id);
  sqlite3_bind_text(q, 2, tier ? "host" : "device", -1, SQLITE_STATIC);
  int n = 0;
  double level = initial > 0 ? initial : NAN;
  while (sqlite3_step(q) == SQLITE_ROW) {
    if (!n) ferry__sb_printf(s, "%s << EOD\n%.9f %.9g\n", name, 0.0, isnan(level) ? 0.0 : level * scale);
    const double x = ferry__span(t0, sqlite3_column_int64(q, 0)) / div;
    level = ferry__finite_or(sqlite3_column_double(q, 1), 0);
    ferry__sb_printf(s, "%.9f %.9g\n", x < 0 ? 0 : x, level * scale);
    n++;
  }
  sqlite3_finalize(q);
  if (!n) return 0;
  ferry__sb_printf(s, "%.9f %.9g\nEOD\n", ferry__span(t0, t1) / div, level * scale);
  return 1;
}

/* The run whose events are shown: the timeline's run when it has any, else the first run that
 * has. */
static const struct rrun *events_run(struct report *rp, ferry_status *st) {
  const struct rrun *r = ferry__timeline_run(rp, st);
  if (*st != FERRY_OK) return NULL;
  const struct rrun *pick = NULL;
  for (int pass = 0; pass < 2 && !pick; pass++)
    for (size_t i = 0; i < rp->n_runs && !pick; i++) {
      const struct rrun *c = pass ? &rp->runs[i] : r;
      if (!c) break;
      sqlite3 *db = ferry__run_db(rp, c);
      if (!has_events(db)) continue;
      sqlite3_stmt *q;
      if (sqlite3_prepare_v2(db, "SELECT 1 FROM engine_events WHERE runId = ? LIMIT 1", -1, &q, NULL) != SQLITE_OK) continue;
      sqlite3_bind_int64(q, 1, c->id);
      if (sqlite3_step(q) == SQLITE_ROW) pick = c;
      sqlite3_finalize(q);
    }
  return pick;
}

/* What the run's events add up to while they are read. */
struct ev_tally {
  int64_t counts[5]; /* pressure, reload, io, device, refused */
  int64_t rows, max_level, last_level;
  double last_x;
  int levels; /* level transitions (the step line's points) */
};

static const char *const ev_kinds[5] = {"pressure", "reload", "io", "device", "refused"};

/* Every event into `all`, the transitions into `t`, the level's step line into s ($lvl). */
static void ev_rows(sqlite3_stmt *q, struct rtable *t, struct rtable *all, struct ferry_strbuf *s,
                    struct ev_tally *n) {
  int64_t t_first = INT64_MIN;
  ferry__sb_puts(s, "$lvl << EOD\n");
  while (sqlite3_step(q) == SQLITE_ROW) {
    const int64_t tn = sqlite3_column_int64(q, 0);
    if (t_first == INT64_MIN) {
      t_first = sqlite3_column_type(q, 7) == SQLITE_NULL ? tn : sqlite3_column_int64(q, 7);
      if (t_first > tn) t_first = tn;
    }
    const char *kind = (const char *)sqlite3_column_text(q, 1);
    const char *tier = (const char *)sqlite3_column_text(q, 2);
    const char *action = (const char *)sqlite3_column_text(q, 5), *detail = (const char *)sqlite3_column_text(q, 6);
    for (int k = 0; k < 5; k++)
      if (kind && !strcmp(kind, ev_kinds[k])) n->counts[k]++;
    char idx[32] = "", lvl[16] = "";
    if (sqlite3_column_type(q, 3) != SQLITE_NULL)
      ferry__fmt_num(ferry__finite_or(sqlite3_column_double(q, 3), 0), idx, sizeof idx);
    const double secs = ferry__span(t_first, tn) / 1e9;
    if (sqlite3_column_type(q, 4) != SQLITE_NULL) {
      int64_t level = sqlite3_column_int64(q, 4);
      snprintf(lvl, sizeof lvl, "%lld", (long long)level);
      /* the level as a step line: it holds until the next transition */
      if (n->levels < 4000)
        ferry__sb_printf(s, "%.9f %lld\n%.9f %lld\n", secs, (long long)n->last_level, secs, (long long)level);
      n->levels++;
      n->last_level = level;
      n->last_x = secs;
      if (level > n->max_level) n->max_level = level;
    }
    ferry__table_rowf(all, "%.6f" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s", secs, kind ? kind : "",
                      tier ? tier : "", idx, lvl, action ? action : "", detail ? detail : "");
    /* the table shows the transitions; retries and refusals are counted, and in the CSV */
    if (kind && (!strcmp(kind, "io") || !strcmp(kind, "refused"))) continue;
    if (n->rows++ < MAX_ROWS)
      ferry__table_rowf(t, "%.6f" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s", secs, kind ? kind : "",
                        tier ? tier : "", idx, lvl, action ? action : "", detail ? detail : "");
  }
}

/* The memory-pressure level over time, from the step line ev_rows() wrote. */
static ferry_status ev_level_plot(struct report *rp, const struct rrun *r, struct ferry_strbuf *s,
                                  const struct ev_tally *n) {
  ferry__sb_printf(s, "%.9f %lld\nEOD\n", n->last_x + fmax(n->last_x * 0.05, 1e-3), (long long)n->last_level);
  ferry__gp_set(s, "xlabel", "time since the first memory sample (s)");
  ferry__gp_set(s, "ylabel", "degradation level");
  ferry__sb_puts(s, "set yrange [-0.2:4.4]\nset ytics (");
  static const char *const names[5] = {"0 normal", "1 prefetch", "2 cache", "3 on demand", "4 refusing"};
  for (int i = 0; i < 5; i++) {
    ferry__sb_puts(s, i ? ", " : "");
    ferry__gp_tic(s, names[i]);
    ferry__sb_printf(s, " %d", i);
  }
  ferry__sb_puts(s, ")\nset grid\nset key off\n");
  ferry__gp_set(s, "title", "Memory-pressure level, run %s", r->label);
  ferry__sb_puts(s, "plot $lvl using 1:2 with lines lw 2 lc rgb '#d62728'\n");
  if (s->oom) return NOMEM(rp);
  char title[160];
  snprintf(title, sizeof title, "Degradation level of run %s over time.", r->label);
  return ferry__emit_plot(rp, "pressure_level", title, 1000, 300, s->p);
}

ferry_status ferry__section_events(struct report *rp) {
  ferry_status st;
  const struct rrun *r = events_run(rp, &st);
  if (!r) return st;
  sqlite3 *db = ferry__run_db(rp, r);
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(db,
                         "SELECT t_ns, kind, tier, pressure_index, level, action, detail, "
                         "(SELECT min(t_ns) FROM memory WHERE runId = ?1) FROM engine_events WHERE runId = ?1 "
                         "ORDER BY t_ns, rowid",
                         -1, &q, NULL) != SQLITE_OK)
    return ferry__err_set(&rp->err, FERRY_ERR_DB, "report: reading engine events: %s", sqlite3_errmsg(db));
  sqlite3_bind_int64(q, 1, r->id);
  struct rtable *t = ferry__table_new("engine_events", "time (s)" SEP "kind" SEP "tier" SEP "pressure index" SEP "level"
                                                       SEP "action" SEP "detail");
  struct rtable *all = ferry__table_new("engine_events_all", "time (s)" SEP "kind" SEP "tier" SEP "pressure index" SEP
                                                             "level" SEP "action" SEP "detail");
  struct ferry_strbuf s = {0};
  struct ev_tally n = {0};
  if (!t || !all) {
    st = NOMEM(rp);
    goto out;
  }
  ev_rows(q, t, all, &s, &n);
  char title[160];
  snprintf(title, sizeof title, "What kept run %s up", r->label);
  ferry__doc_section(rp, FERRY_REPORT_EVENTS, title);
  ferry__doc_para(rp,
                  "Engine events of run %s: %lld memory-pressure event(s) (budget changes and transitions; highest "
                  "degradation level %lld), %lld reload event(s), %lld I/O retry or failure event(s), %lld device "
                  "failure(s), %lld request(s) refused under pressure. Levels: 0 normal, 1 prefetch depth halved, 2 "
                  "expert cache halved, 3 on-demand loading, 4 new requests refused. Times from the run's first "
                  "memory sample; the timeline and memory charts mark the same events.",
                  r->label, (long long)n.counts[0], (long long)n.max_level, (long long)n.counts[1],
                  (long long)n.counts[2], (long long)n.counts[3], (long long)n.counts[4]);
  if (n.levels && (st = ev_level_plot(rp, r, &s, &n)) != FERRY_OK) goto out;
  if (t->nrows && (st = ferry__emit_table(rp, t, "Budget changes, pressure transitions, reloads and device failures.")) != FERRY_OK)
    goto out;
  if ((st = ferry__emit_csv(rp, all)) != FERRY_OK) goto out;
  ferry__sb_puts(&rp->html, "<p>Every event, retries and refused requests included: "
                            "<a href=\"tables/engine_events_all.csv\">engine_events_all.csv</a>.</p>\n");
  ferry__sb_puts(&rp->md, "Every event, retries and refused requests included: "
                          "[tables/engine_events_all.csv](tables/engine_events_all.csv).\n\n");
out:
  sqlite3_finalize(q);
  if (rp->sum.sections & FERRY_REPORT_EVENTS) ferry__sb_puts(&rp->html, "</section>\n");
  ferry__sb_free(&s);
  ferry__table_free(t);
  ferry__table_free(all);
  return st;
}
