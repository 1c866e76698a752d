/* Section "Routing traces": for every routing trace the study's runs replayed (--routing), read
 * for a predictor (--predictor-routing) or recorded (--record-routing), the statistics of
 * `ferry trace routing stats` that the run stored as metadata (ROUTING_STATS_<ROLE>, JSON):
 * one overview row per trace and one per-layer table each. Traces are told apart by source
 * path and size, so a sweep's many runs over one trace, in any roles, give one row. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "reports/routing_sections.h"

#define NOMEM(rp) ferry__err_set(&(rp)->err, FERRY_ERR_NOMEM, "report: out of memory")
#define MAX_TRACES 64

struct rtrace {
  char key[512];
  char source[400], role[48]; /* roles, comma-separated */
  int runs, last_db;
  int64_t last_run;
  cJSON *doc; /* owned */
};

/* Table cells never hold control characters (the cell separator is one). */
static void clean(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20) *s = '?';
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *fmt(double v, char (*ring)[32], unsigned *i) {
  char *b = ring[(*i)++ % 24];
  return ferry__fmt_num(v, b, 32);
}

static int run_listed(const struct report *rp, int db, int64_t id) {
  for (size_t i = 0; i < rp->n_runs; i++)
    if (rp->runs[i].db == db && rp->runs[i].id == id && rp->runs[i].complete) return 1;
  return 0;
}

/* Every distinct trace in the run metadata of every database. */
static ferry_status collect(struct report *rp, struct rtrace *t, int *n) {
  *n = 0;
  for (size_t d = 0; d < rp->n_dbs; d++) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(rp->dbs[d], "SELECT runId, value FROM META_DATA_EXPORT WHERE name LIKE 'ROUTING_STATS_%' "
                                       "ORDER BY runId, name", -1, &q, NULL) != SQLITE_OK)
      continue; /* a database from before routing statistics: nothing to show */
    while (sqlite3_step(q) == SQLITE_ROW) {
      const char *text = (const char *)sqlite3_column_text(q, 1);
      if (!text || !run_listed(rp, (int)d, sqlite3_column_int64(q, 0))) continue;
      cJSON *doc = cJSON_Parse(text);
      if (!doc) continue; /* not ours, or damaged: the database is untrusted input */
      const cJSON *src = cJSON_GetObjectItemCaseSensitive(doc, "source"), *role = cJSON_GetObjectItemCaseSensitive(doc, "role");
      const cJSON *shape = cJSON_GetObjectItemCaseSensitive(doc, "shape");
      char key[512], rname[16];
      snprintf(key, sizeof key, "%s|%.0f", cJSON_IsString(src) ? src->valuestring : "?", num(shape, "rows"));
      snprintf(rname, sizeof rname, "%s", cJSON_IsString(role) ? role->valuestring : "?");
      clean(rname);
      int found = -1;
      for (int i = 0; i < *n; i++)
        if (!strcmp(t[i].key, key)) found = i;
      if (found >= 0 || *n == MAX_TRACES) {
        if (found >= 0) { /* one trace in several roles: one row naming them all */
          t[found].runs += t[found].last_run != sqlite3_column_int64(q, 0) || t[found].last_db != (int)d;
          t[found].last_run = sqlite3_column_int64(q, 0);
          t[found].last_db = (int)d;
          if (!strstr(t[found].role, rname) && strlen(t[found].role) + strlen(rname) + 3 < sizeof t[found].role) {
            strcat(t[found].role, ", ");
            strcat(t[found].role, rname);
          }
        }
        cJSON_Delete(doc);
        continue;
      }
      struct rtrace *x = &t[(*n)++];
      snprintf(x->key, sizeof x->key, "%s", key);
      snprintf(x->source, sizeof x->source, "%s", cJSON_IsString(src) ? src->valuestring : "?");
      snprintf(x->role, sizeof x->role, "%s", rname);
      clean(x->source);
      x->runs = 1;
      x->last_run = sqlite3_column_int64(q, 0);
      x->last_db = (int)d;
      x->doc = doc;
    }
    sqlite3_finalize(q);
  }
  return FERRY_OK;
}

static ferry_status layer_table(struct report *rp, const struct rtrace *t, int index) {
  char name[32], caption[512];
  snprintf(name, sizeof name, "routing_%d", index + 1);
  struct rtable *tab = ferry__table_new(
      name, "layer" SEP "busiest share" SEP "load CV" SEP "entropy / log E" SEP "first repeat" SEP "(unrelated)" SEP
            "any repeat" SEP "(unrelated)" SEP "l+1 first predicted" SEP "(busiest alone)" SEP "l+1 set recall" SEP
            "co-activation max" SEP "request specialisation" SEP "gate top-1 share" SEP "p10" SEP "p90");
  if (!tab) return NOMEM(rp);
  char ring[24][32];
  unsigned ri = 0;
  const cJSON *l;
  cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(t->doc, "layers")) {
    ri = 0;
    ferry__table_rowf(tab, "%.0f" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP
                           "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s",
                      num(l, "layer"), fmt(num(l, "busiest_share"), ring, &ri),
                      fmt(num(l, "load_cv"), ring, &ri), fmt(num(l, "entropy_norm"), ring, &ri),
                      fmt(num(l, "first_repeat"), ring, &ri), fmt(num(l, "first_repeat_indep"), ring, &ri),
                      fmt(num(l, "any_repeat"), ring, &ri), fmt(num(l, "any_repeat_indep"), ring, &ri),
                      fmt(num(l, "next_first_acc"), ring, &ri), fmt(num(l, "next_first_base"), ring, &ri),
                      fmt(num(l, "next_set_recall"), ring, &ri), fmt(num(l, "coact_max"), ring, &ri),
                      fmt(num(l, "request_spec_max"), ring, &ri), fmt(num(l, "gate_top1_mean"), ring, &ri),
                      fmt(num(l, "gate_top1_p10"), ring, &ri), fmt(num(l, "gate_top1_p90"), ring, &ri));
  }
  snprintf(caption, sizeof caption, "Trace %d (%s, %s) per layer.", index + 1, t->role, t->source);
  ferry_status st = ferry__emit_table(rp, tab, caption);
  ferry__table_free(tab);
  return st;
}

ferry_status ferry__section_routing(struct report *rp) {
  struct rtrace *t = ferry__calloc(MAX_TRACES, sizeof *t);
  if (!t) return NOMEM(rp);
  int n = 0;
  ferry__json_init();
  ferry_status st = collect(rp, t, &n);
  struct rtable *tab = NULL;
  if (st != FERRY_OK || n == 0) goto out_free;
  ferry__doc_section(rp, FERRY_REPORT_ROUTING, "Routing traces");
  ferry__doc_para(rp, "Statistics of every routing trace the runs replayed, read for a predictor or recorded (the "
                      "figures of ferry trace routing stats; docs/predictors.md defines them). Repeat: consecutive "
                      "tokens of a request that keep the first choice, or share any expert, against uniform random "
                      "routing; l+1 first predicted: tokens whose first choice at layer l+1 is the one most often "
                      "seen after their first choice at layer l (in-sample), against the busiest expert alone.");
  tab = ferry__table_new("routing", "trace" SEP "role" SEP "source" SEP "runs" SEP "layers x experts, top-k" SEP
                                    "rows" SEP "busiest share (uniform)" SEP "load CV" SEP "first repeat (uniform)" SEP
                                    "any repeat (uniform)" SEP "l+1 first predicted (busiest alone)" SEP
                                    "co-activation max" SEP "gate top-1 share");
  if (!tab) {
    st = NOMEM(rp);
    goto out_free;
  }
  char ring[24][32];
  for (int i = 0; i < n; i++) {
    unsigned ri = 0;
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t[i].doc, "shape");
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(t[i].doc, "overall");
    const double E = num(shape, "experts");
    char cells[4][80];
    snprintf(cells[0], sizeof cells[0], "%.0f x %.0f, top-%.0f", num(shape, "layers"), E, num(shape, "top_k"));
    snprintf(cells[1], sizeof cells[1], "%s (%s)", fmt(num(o, "busiest_share"), ring, &ri), fmt(1.0 / E, ring, &ri));
    snprintf(cells[2], sizeof cells[2], "%s (%s)", fmt(num(o, "first_repeat"), ring, &ri),
             fmt(num(o, "first_repeat_uniform"), ring, &ri));
    snprintf(cells[3], sizeof cells[3], "%s (%s)", fmt(num(o, "any_repeat"), ring, &ri),
             fmt(num(o, "any_repeat_uniform"), ring, &ri));
    char pred[80];
    snprintf(pred, sizeof pred, "%s (%s)", fmt(num(o, "next_first_acc"), ring, &ri),
             fmt(num(o, "next_first_base"), ring, &ri));
    ferry__table_rowf(tab, "%d" SEP "%s" SEP "%s" SEP "%d" SEP "%s" SEP "%.0f" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP
                           "%s" SEP "%s" SEP "%s",
                      i + 1, t[i].role, t[i].source, t[i].runs, cells[0], num(shape, "rows"), cells[1],
                      fmt(num(o, "load_cv"), ring, &ri), cells[2], cells[3], pred, fmt(num(o, "coact_max"), ring, &ri),
                      fmt(num(o, "gate_top1_mean"), ring, &ri));
  }
  st = ferry__emit_table(rp, tab, "Routing traces of the study, overall (means over layers).");
  for (int i = 0; st == FERRY_OK && i < n; i++) st = layer_table(rp, &t[i], i);
  ferry__sb_puts(&rp->html, "</section>\n");
out_free:
  ferry__table_free(tab);
  for (int i = 0; i < n; i++) cJSON_Delete(t[i].doc);
  ferry_free(t);
  return st;
}
