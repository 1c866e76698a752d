/* The capacity plan section: what `ferry plan` recorded (the PLAN_* facts of its runs, docs/
 * plan.md) as one table per plan, per hardware profile the highest request rate within the SLO,
 * the configuration, costs and whether it serves the demand, and a Pareto plot of price per hour
 * against that capacity (the profiles no other beats on both). The figures are read, never
 * recomputed: the report links no planning code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "reports/report_internal.h"

#define NOMEM(rp) ferry__err_set(&(rp)->err, FERRY_ERR_NOMEM, "report: out of memory")

/* One profile of one plan. */
struct prow {
  char plan[96], hw[64], config[128], slo[256], model[160], workload[300];
  double demand, max_rps, saturated, bound, price, usd_mtok, tps_usd, replicas, usd_demand, ttft, tpot;
  int gpus, meets, cheapest;
  char run[32];
};

static double fnum(const char *v) { return v && *v ? strtod(v, NULL) : NAN; }

static void set_fact(struct prow *p, const char *name, const char *v) {
  struct {
    const char *name;
    char *text;
    size_t len;
  } texts[] = {{"PLAN_ID", p->plan, sizeof p->plan},         {"PLAN_HARDWARE", p->hw, sizeof p->hw},
               {"PLAN_CONFIG", p->config, sizeof p->config}, {"PLAN_SLO", p->slo, sizeof p->slo},
               {"PLAN_MODEL", p->model, sizeof p->model},    {"PLAN_WORKLOAD", p->workload, sizeof p->workload}};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    if (!strcmp(name, texts[i].name)) {
      snprintf(texts[i].text, texts[i].len, "%s", v ? v : "");
      return;
    }
  struct {
    const char *name;
    double *num;
  } nums[] = {{"PLAN_DEMAND_RPS", &p->demand},
              {"PLAN_MAX_RPS", &p->max_rps},
              {"PLAN_SATURATED_ABOVE_RPS", &p->saturated},
              {"PLAN_THROUGHPUT_BOUND_RPS", &p->bound},
              {"PLAN_PRICE_PER_HOUR", &p->price},
              {"PLAN_USD_PER_MTOK", &p->usd_mtok},
              {"PLAN_TOKENS_PER_S_PER_USD", &p->tps_usd},
              {"PLAN_REPLICAS_FOR_DEMAND", &p->replicas},
              {"PLAN_USD_PER_HOUR_FOR_DEMAND", &p->usd_demand},
              {"PLAN_TTFT_P99_MS", &p->ttft},
              {"PLAN_TPOT_P99_MS", &p->tpot}};
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
    if (!strcmp(name, nums[i].name)) {
      *nums[i].num = fnum(v);
      return;
    }
  if (!strcmp(name, "PLAN_GPUS")) p->gpus = (int)fnum(v);
  else if (!strcmp(name, "PLAN_MEETS_DEMAND")) p->meets = fnum(v) == 1;
  else if (!strcmp(name, "PLAN_CHEAPEST")) p->cheapest = fnum(v) == 1;
}

/* The rows of every plan in the databases: the facts of replica 0 of each profile. */
static ferry_status load_rows(struct report *rp, struct prow **out, size_t *n_out) {
  struct prow *rows = NULL;
  size_t n = 0, cap = 0;
  for (size_t r = 0; r < rp->n_runs; r++) {
    const struct rrun *run = &rp->runs[r];
    sqlite3 *db = ferry__run_db(rp, run);
    if (!db) continue;
    sqlite3_stmt *q;
    /* a database older than PLAN facts, or from before META_DATA_EXPORT had runId: none */
    if (sqlite3_prepare_v2(db,
                           "SELECT name, value FROM META_DATA_EXPORT WHERE runId = ?1 AND name LIKE 'PLAN!_%' "
                           "ESCAPE '!' AND name <> 'PLAN_PROBES'",
                           -1, &q, NULL) != SQLITE_OK)
      continue;
    sqlite3_bind_int64(q, 1, run->id);
    struct prow p;
    memset(&p, 0, sizeof p);
    p.demand = p.max_rps = p.saturated = p.bound = p.price = p.usd_mtok = p.tps_usd = p.replicas = p.usd_demand =
        p.ttft = p.tpot = NAN;
    int facts = 0, replica0 = 1;
    while (sqlite3_step(q) == SQLITE_ROW) {
      const char *name = (const char *)sqlite3_column_text(q, 0), *v = (const char *)sqlite3_column_text(q, 1);
      if (!name) continue;
      if (!strcmp(name, "PLAN_REPLICA") && v && strncmp(v, "0/", 2)) replica0 = 0;
      set_fact(&p, name, v);
      facts++;
    }
    sqlite3_finalize(q);
    if (!facts || !replica0 || !p.plan[0]) continue;
    snprintf(p.run, sizeof p.run, "%s", run->label);
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      struct prow *g = ferry__reallocarray(rows, cap, sizeof *g);
      if (!g) {
        ferry_free(rows);
        return NOMEM(rp);
      }
      rows = g;
    }
    rows[n++] = p;
  }
  *out = rows;
  *n_out = n;
  return FERRY_OK;
}

/* Whether row i is on the Pareto front of its plan: no other row serves at least as much for at
 * most the price, and strictly better on one. */
static int pareto(const struct prow *rows, size_t n, size_t i) {
  const struct prow *a = &rows[i];
  if (!(a->max_rps > 0) || !(a->price > 0)) return 0;
  for (size_t k = 0; k < n; k++) {
    const struct prow *b = &rows[k];
    if (k == i || strcmp(a->plan, b->plan) || !(b->max_rps > 0) || !(b->price > 0)) continue;
    if (b->max_rps >= a->max_rps && b->price <= a->price && (b->max_rps > a->max_rps || b->price < a->price)) return 0;
  }
  return 1;
}

/* Numbers for table cells: a ring of buffers, so one row can format up to 16. */
struct nring {
  char b[16][32];
  unsigned i;
};
static const char *nfmt(struct nring *r, double v) {
  char *b = r->b[r->i++ % 16];
  return ferry__fmt_num(v, b, sizeof r->b[0]);
}

static ferry_status one_plan(struct report *rp, const struct prow *rows, size_t n, const char *plan, int index) {
  struct nring nb = {.i = 0};
#define N(v) nfmt(&nb, (v))
  const struct prow *first = NULL;
  for (size_t i = 0; i < n && !first; i++)
    if (!strcmp(rows[i].plan, plan)) first = &rows[i];
  char title[160];
  snprintf(title, sizeof title, "Plan %s", plan);
  ferry__doc_heading(rp, title);
  ferry__doc_para(rp, "%s on %s; SLO %s; demand %s requests/s. A profile's capacity is the highest request rate "
                      "whose simulated latencies meet the SLO with the queue stable; above \"saturates\" the queue "
                      "grows without bound (those runs' latencies are not used). Costs per million output tokens "
                      "and tokens per second per dollar are at that capacity; the demand column says how many "
                      "replicas of a single-GPU profile (least-tokens router) serve the demand.",
                  first->model, first->workload, first->slo, N(first->demand));
  char name[64];
  snprintf(name, sizeof name, "plan-%d", index);
  struct rtable *t = ferry__table_new(name, "hardware" SEP "GPUs" SEP "run" SEP "max req/s" SEP "saturates above" SEP
                                            "configuration" SEP "TTFT P99 (ms)" SEP "TPOT P99 (ms)" SEP "$/h" SEP
                                            "$ per 1M tokens" SEP "tokens/s per $/h" SEP "serves demand" SEP
                                            "$/h for demand" SEP "Pareto" SEP "cheapest");
  if (!t) return NOMEM(rp);
  struct ferry_strbuf s = {0}, front = {0};
  const char *cheapest = NULL;
  ferry__sb_puts(&s, "$points << EOD\n");
  int points = 0;
  for (size_t i = 0; i < n; i++) {
    const struct prow *p = &rows[i];
    if (strcmp(p->plan, plan)) continue;
    char demand[48];
    if (!p->meets) snprintf(demand, sizeof demand, "no");
    else snprintf(demand, sizeof demand, "yes (%s)", N(p->replicas));
    const int on_front = pareto(rows, n, i);
    ferry__table_rowf(t, "%s" SEP "%d" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP
                         "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s",
                      p->hw, p->gpus, p->run, N(p->max_rps), N(p->saturated), p->config[0] ? p->config : "none meets the SLO",
                      N(p->ttft), N(p->tpot), N(p->price), N(p->usd_mtok), N(p->tps_usd), demand, N(p->usd_demand),
                      on_front ? "yes" : "", p->cheapest ? "yes" : "");
    if (p->cheapest) cheapest = p->hw;
    if (p->max_rps > 0 && p->price > 0) {
      ferry__gp_data(&s, p->hw);
      ferry__sb_printf(&s, " %.9g %.9g %d\n", p->max_rps, p->price, on_front);
      points++;
      if (on_front) ferry__sb_printf(&front, "%.9g %.9g\n", p->max_rps, p->price);
    }
  }
  ferry__sb_puts(&s, "EOD\n");
  ferry_status st = FERRY_OK;
  if (cheapest) ferry__doc_para(rp, "Cheapest serving the demand within the SLO: %s.", cheapest);
  else ferry__doc_para(rp, "No priced profile serves the demand within the SLO and the limits given.");
  if (points > 0) {
    /* the front as a step line, sorted by capacity */
    ferry__sb_puts(&s, "$front << EOD\n");
    ferry__sb_puts(&s, front.p ? front.p : "");
    ferry__sb_puts(&s, "EOD\n");
    ferry__gp_set(&s, "title", "%s", "Price per hour against capacity within the SLO");
    ferry__gp_set(&s, "xlabel", "%s", "highest request rate meeting the SLO (requests/s)");
    ferry__gp_set(&s, "ylabel", "%s", "price per hour ($)");
    ferry__sb_puts(&s, "set key top left\nset grid\nset offsets graph 0.05, graph 0.1, graph 0.1, graph 0.05\n");
    ferry__sb_puts(&s, "plot $points using 2:3 with points pt 7 ps 1.2 lc rgb '#1f77b4' title ");
    ferry__gp_str(&s, "profile");
    ferry__sb_puts(&s, ", $front using 1:2 smooth unique with linespoints pt 6 ps 2 lw 2 lc rgb '#d62728' title ");
    ferry__gp_str(&s, "Pareto front");
    ferry__sb_puts(&s, ", $points using 2:3:1 with labels offset 0,1 font ',9' notitle\n");
    char plot[64], cap[256];
    snprintf(plot, sizeof plot, "plan-%d-pareto", index);
    snprintf(cap, sizeof cap,
             "Each priced profile's price per hour against its capacity within the SLO; the Pareto front joins the "
             "profiles no other beats on both.");
    st = s.oom || front.oom ? NOMEM(rp) : ferry__emit_plot(rp, plot, cap, 900, 560, s.p);
  }
  if (st == FERRY_OK) st = ferry__emit_table(rp, t, "Capacity, configuration and cost per hardware profile.");
  ferry__sb_free(&s);
  ferry__sb_free(&front);
  ferry__table_free(t);
#undef N
  return st;
}

ferry_status ferry__section_plan(struct report *rp) {
  struct prow *rows = NULL;
  size_t n = 0;
  ferry_status st = load_rows(rp, &rows, &n);
  if (st != FERRY_OK || n == 0) {
    ferry_free(rows);
    return st;
  }
  ferry__doc_section(rp, FERRY_REPORT_PLAN, "Capacity plan");
  /* one table and plot per plan, in the order their first runs appear */
  int index = 0;
  for (size_t i = 0; i < n && st == FERRY_OK; i++) {
    int seen = 0;
    for (size_t k = 0; k < i && !seen; k++) seen = !strcmp(rows[k].plan, rows[i].plan);
    if (!seen) st = one_plan(rp, rows, n, rows[i].plan, ++index);
  }
  ferry_free(rows);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}
