/* `ferry plan`'s results (plan_record.h): costs per profile, the JSON summary and the PLAN_*
 * facts the study database keeps for `ferry report` (docs/plan.md lists them). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/output.h"
#include "cli/plan_record.h"
#include "cli/plan_sensitivity.h"
#include "common/alloc.h"
#include "ferry/db.h"

void plan_hw_figures(const struct plan_state *ps, const struct plan_hw *h, struct plan_figures *f) {
  memset(f, 0, sizeof *f);
  ferry_plan_cost(h->price, 1, h->best_rps, ps->mean_output, &f->at_max);
  f->meets_demand = h->best_cand >= 0 && h->need_replicas > 0;
  /* a single-GPU profile replicated is that many machines; a multi-GPU machine is one */
  f->rented = h->gpus == 1 && h->need_replicas > 1 ? h->need_replicas : 1;
  if (f->meets_demand) ferry_plan_cost(h->price, f->rented, ps->demand_rps, ps->mean_output, &f->at_demand);
  f->within_budget = ps->o->budget_per_hour <= 0 ||
                     (f->at_demand.usd_per_hour > 0 && f->at_demand.usd_per_hour <= ps->o->budget_per_hour);
  if (h->best_cand >= 0) {
    const struct plan_knobs *k = &h->c[h->best_cand].k;
    plan_knobs_text(ps->o, k, f->config, sizeof f->config);
    f->replicas = plan_cand_replicas(h, k);
    const size_t n = strlen(f->config);
    if (f->replicas > 1)
      snprintf(f->config + n, sizeof f->config - n, ", %d replicas (%s)", f->replicas, PLAN_ROUTER);
  }
  for (int c = 0; c < h->nc; c++) {
    const double bound = h->c[c].mu_rps * plan_cand_replicas(h, &h->c[c].k);
    if (bound > f->bound_rps) f->bound_rps = bound;
  }
}

const char *plan_hw_command(const struct plan_state *ps, const struct plan_hw *h, char *buf, size_t len) {
  buf[0] = '\0';
  if (h->best_cand < 0) return buf;
  const struct plan_knobs *k = &h->c[h->best_cand].k;
  struct plan_job j = {.kind = PLAN_JOB_PROBE, .k = *k, .rps = h->best_rps, .replicas = plan_cand_replicas(h, k)};
  struct plan_argv a;
  plan_job_argv(ps->o, h->name, ps->w, &j, NULL, &a);
  size_t n = (size_t)snprintf(buf, len, "ferry");
  for (int i = 0; i < a.n && n < len; i++) {
    if (!strcmp(a.v[i], "--quiet")) continue;
    n += (size_t)snprintf(buf + n, len - n, " %s", a.v[i]);
  }
  return buf;
}

static const char *const metric_names[] = {"ttft", "tpot", "e2e"}, *const stat_names[] = {"mean", "p50", "p90", "p99"};

static cJSON *probes_json(const struct plan_state *ps, const struct plan_hw *h) {
  static const char *const kinds[] = {"bound", "probe", "record"};
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; arr && i < h->nlog; i++) {
    const struct plan_probe *p = &h->log[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    char knobs[128];
    plan_knobs_text(ps->o, &h->c[p->cand].k, knobs, sizeof knobs);
    cli_json_str(o, "kind", kinds[p->kind]);
    cli_json_str(o, "config", knobs);
    cli_json_num(o, "rps", p->rps);
    cli_json_num(o, "replicas", p->replicas);
    cJSON_AddBoolToObject(o, "feasible", p->feasible);
    cJSON_AddBoolToObject(o, "saturated", p->saturated);
    if (p->kind != 0) {
      cli_json_num(o, "ttft_p99_ms", p->ttft_p99_ms);
      cli_json_num(o, "tpot_p99_ms", p->tpot_p99_ms);
      cli_json_num(o, "e2e_p99_ms", p->e2e_p99_ms);
    }
    cli_json_str(o, "why", p->why);
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

static cJSON *hw_json(const struct plan_state *ps, const struct plan_hw *h, int cheapest_here) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  struct plan_figures f;
  plan_hw_figures(ps, h, &f);
  cli_json_str(o, "hardware", h->name);
  cli_json_num(o, "gpus", h->gpus);
  cJSON_AddBoolToObject(o, "skipped", h->skipped);
  if (h->skipped) cli_json_str(o, "why", h->why);
  cli_json_num(o, "price_per_hour", h->price > 0 ? h->price : NAN);
  cli_json_str(o, "price_date", h->price_source[0] ? h->price_source : NULL);
  cli_json_num(o, "max_rps", h->best_rps);
  cli_json_num(o, "saturated_above_rps", h->saturated_rps > 0 ? h->saturated_rps : NAN);
  cli_json_num(o, "throughput_bound_rps", f.bound_rps);
  if (h->best_cand >= 0) {
    const struct plan_knobs *k = &h->c[h->best_cand].k;
    cJSON *c = cJSON_AddObjectToObject(o, "config");
    if (c) {
      cli_json_str(c, "text", f.config);
      cli_json_str(c, "quant", ps->o->quant[k->quant] ? ps->o->quant[k->quant] : "native");
      cli_json_num(c, "max_batch", k->max_batch);
      cli_json_num(c, "block_layers", k->block_layers > 0 ? k->block_layers : NAN);
      cli_json_num(c, "prefetch_depth", k->prefetch_depth >= 0 ? k->prefetch_depth : NAN);
      cli_json_str(c, "expert_cache", k->expert_lfu > 0 ? "lfu" : NULL);
      cli_json_num(c, "gpus_per_replica", k->gpus > 1 ? k->gpus : 1);
      cli_json_str(c, "parallel", plan_parallel_name(k->gpus > 1 ? k->parallel : PLAN_PAR_NONE));
      cli_json_num(c, "replicas", f.replicas);
      cli_json_str(c, "router", f.replicas > 1 ? PLAN_ROUTER : NULL);
    }
    cli_json_num(o, "ttft_p99_ms", h->best.ttft[3] / 1e6);
    cli_json_num(o, "tpot_p99_ms", h->best.tpot[3] / 1e6);
    cli_json_num(o, "e2e_p99_ms", h->best.e2e[3] / 1e6);
    char cmd[4096];
    cli_json_str(o, "command", plan_hw_command(ps, h, cmd, sizeof cmd));
  } else {
    cJSON_AddNullToObject(o, "config");
  }
  cli_json_num(o, "usd_per_mtok", f.at_max.usd_per_mtok > 0 ? f.at_max.usd_per_mtok : NAN);
  cli_json_num(o, "tokens_per_s_per_usd", f.at_max.tokens_per_s_per_usd > 0 ? f.at_max.tokens_per_s_per_usd : NAN);
  cJSON_AddBoolToObject(o, "meets_demand", f.meets_demand);
  cli_json_num(o, "replicas_for_demand", f.meets_demand ? (h->gpus == 1 ? h->need_replicas : 1) : NAN);
  cli_json_num(o, "usd_per_hour_for_demand", f.at_demand.usd_per_hour > 0 ? f.at_demand.usd_per_hour : NAN);
  cJSON_AddBoolToObject(o, "within_budget", f.within_budget);
  cJSON_AddBoolToObject(o, "cheapest", cheapest_here);
  cli_json_num(o, "simulations", h->sims);
  cli_json_num(o, "reused", h->reused);
  if (ps->o->verify && h->best_cand >= 0) {
    cJSON *v = cJSON_AddObjectToObject(o, "verify");
    cJSON *rates = v ? cJSON_AddArrayToObject(v, "rps") : NULL, *ok = v ? cJSON_AddArrayToObject(v, "feasible") : NULL;
    for (int i = 0; rates && ok && i < ps->o->verify && i < PLAN_MAX_VERIFY; i++) {
      cJSON_AddItemToArray(rates, cJSON_CreateNumber(h->verify_rps[i]));
      cJSON_AddItemToArray(ok, cJSON_CreateBool(h->verify_ok[i]));
    }
    if (v) cli_json_num(v, "brute_force_rps", h->brute_force_rps);
  }
  cJSON_AddItemToObject(o, "probes", probes_json(ps, h));
  return o;
}

int plan_print_json(const struct plan_state *ps, int cheapest, double wall_s, const struct plan_sens *sens) {
  const struct plan_opts *o = ps->o;
  cJSON *doc = cJSON_CreateObject();
  if (!doc) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  cli_json_str(doc, "schema", "ferry.plan.v1");
  cli_json_str(doc, "model", o->model);
  cJSON *w = cJSON_AddObjectToObject(doc, "workload");
  if (w) {
    cli_json_str(w, "trace", o->trace);
    cli_json_str(w, "synthetic", o->synthetic);
    cli_json_num(w, "requests_per_replica", (double)plan_workload_count(ps->w, 1));
    cli_json_num(w, "recorded_rps", plan_workload_rate(ps->w, 1));
    cli_json_num(w, "mean_output_tokens", ps->mean_output);
  }
  cli_json_num(doc, "demand_rps", ps->demand_rps);
  cJSON *slo = cJSON_AddArrayToObject(doc, "slo");
  for (int i = 0; slo && i < o->n_slo; i++) {
    cJSON *t = cJSON_CreateObject();
    if (!t) break;
    cli_json_str(t, "metric", metric_names[o->slo[i].metric]);
    cli_json_str(t, "stat", stat_names[o->slo[i].stat]);
    cli_json_num(t, "limit_ms", o->slo[i].limit_ns / 1e6);
    cJSON_AddItemToArray(slo, t);
  }
  cli_json_num(doc, "max_gpus", o->max_gpus);
  cli_json_num(doc, "budget_per_hour", o->budget_per_hour > 0 ? o->budget_per_hour : NAN);
  cli_json_num(doc, "tolerance", o->tolerance);
  cli_json_str(doc, "cheapest", cheapest >= 0 ? ps->hw[cheapest].name : NULL);
  int sims = 0, reused = 0;
  for (int i = 0; i < ps->nhw; i++) sims += ps->hw[i].sims, reused += ps->hw[i].reused;
  cli_json_num(doc, "simulations", sims);
  cli_json_num(doc, "reused", reused);
  cli_json_num(doc, "wall_s", wall_s);
  cli_json_num(doc, "workers", o->jobs);
  cJSON *arr = cJSON_AddArrayToObject(doc, "hardware");
  for (int i = 0; arr && i < ps->nhw; i++) cJSON_AddItemToArray(arr, hw_json(ps, &ps->hw[i], i == cheapest));
  if (sens) cJSON_AddItemToObject(doc, "sensitivity", plan_sensitivity_json(ps, sens));
  int rc = cli_emit(stdout, doc, NULL, CLI_FORMAT_JSON);
  cJSON_Delete(doc);
  return rc;
}

/* ---- the study database ------------------------------------------------------------------- */

static ferry_status fact(ferry_db *db, int64_t run, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ferry_status fact(ferry_db *db, int64_t run, const char *name, const char *fmt, ...) {
  char v[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  return ferry_db_run_meta(db, run, name, v);
}

static ferry_status hw_facts(ferry_db *db, int64_t run, const struct plan_state *ps, const struct plan_hw *h,
                             const char *plan_id, int cheapest_here, int replica, int with_probes) {
  const struct plan_opts *o = ps->o;
  struct plan_figures f;
  plan_hw_figures(ps, h, &f);
  ferry_status st = FERRY_OK;
#define F(name, ...)                                                                                                   \
  do {                                                                                                                 \
    if (st == FERRY_OK) st = fact(db, run, name, __VA_ARGS__);                                                        \
  } while (0)
  F("PLAN_ID", "%s", plan_id);
  F("PLAN_MODEL", "%s", o->model);
  F("PLAN_WORKLOAD", "%s (%zu requests per replica, %.6g req/s as recorded)", o->trace ? o->trace : o->synthetic,
    plan_workload_count(ps->w, 1), plan_workload_rate(ps->w, 1));
  F("PLAN_SLO", "%s", o->slo_text);
  F("PLAN_DEMAND_RPS", "%.9g", ps->demand_rps);
  F("PLAN_HARDWARE", "%s", h->name);
  F("PLAN_GPUS", "%d", h->gpus);
  F("PLAN_MAX_RPS", "%.9g", h->best_rps);
  if (h->saturated_rps > 0) F("PLAN_SATURATED_ABOVE_RPS", "%.9g", h->saturated_rps);
  F("PLAN_THROUGHPUT_BOUND_RPS", "%.9g", f.bound_rps);
  if (h->price > 0) F("PLAN_PRICE_PER_HOUR", "%.9g", h->price);
  if (f.at_max.usd_per_mtok > 0) F("PLAN_USD_PER_MTOK", "%.9g", f.at_max.usd_per_mtok);
  if (f.at_max.tokens_per_s_per_usd > 0) F("PLAN_TOKENS_PER_S_PER_USD", "%.9g", f.at_max.tokens_per_s_per_usd);
  if (h->best_cand >= 0) {
    F("PLAN_CONFIG", "%s", f.config);
    F("PLAN_TTFT_P99_MS", "%.9g", h->best.ttft[3] / 1e6);
    F("PLAN_TPOT_P99_MS", "%.9g", h->best.tpot[3] / 1e6);
  }
  F("PLAN_MEETS_DEMAND", "%d", f.meets_demand);
  if (f.meets_demand) {
    F("PLAN_REPLICAS_FOR_DEMAND", "%d", h->gpus == 1 ? h->need_replicas : 1);
    if (f.at_demand.usd_per_hour > 0) F("PLAN_USD_PER_HOUR_FOR_DEMAND", "%.9g", f.at_demand.usd_per_hour);
  }
  F("PLAN_CHEAPEST", "%d", cheapest_here);
  F("PLAN_REPLICA", "%d/%d", replica, h->n_run_ids > 1 ? h->n_run_ids : 1);
  if (h->best_cand >= 0) {
    const struct plan_knobs *k = &h->c[h->best_cand].k;
    F("PLAN_PARALLEL", "%s %d", plan_parallel_name(k->gpus > 1 ? k->parallel : PLAN_PAR_NONE), k->gpus > 1 ? k->gpus : 1);
    F("PLAN_REPLICAS", "%d", f.replicas);
    if (f.replicas > 1) F("PLAN_ROUTER", "%s", PLAN_ROUTER);
  }
#undef F
  if (st == FERRY_OK && with_probes) {
    cJSON *p = probes_json(ps, h);
    char *text = p ? cJSON_PrintUnformatted(p) : NULL;
    cJSON_Delete(p);
    if (text) st = ferry_db_run_meta(db, run, "PLAN_PROBES", text);
    cJSON_free(text);
  }
  return st;
}

int plan_record(struct plan_state *ps, int cheapest) {
  ferry_db *db = NULL;
  ferry_status st = ferry_db_open(&db, ps->o->db, FERRY_DB_CREATE);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  char plan_id[96];
  {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(plan_id, sizeof plan_id, "plan-%s-%d", when, (int)getpid());
  }
  for (int i = 0; i < ps->nhw && st == FERRY_OK; i++) {
    const struct plan_hw *h = &ps->hw[i];
    if (h->n_run_ids > 0) {
      for (int r = 0; r < h->n_run_ids && st == FERRY_OK; r++)
        st = hw_facts(db, h->run_ids[r], ps, h, plan_id, i == cheapest, r, r == 0);
      continue;
    }
    /* no configuration meets the SLO, or the profile was skipped: a failed run says why */
    struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = ps->o->model, .hardware = h->name,
                                  .trace = ps->o->trace ? ps->o->trace : ps->o->synthetic,
                                  .notes = "recorded by ferry plan: no run of this profile meets the SLO"};
    int64_t id;
    if ((st = ferry_db_run_begin(db, &info, &id)) != FERRY_OK) break;
    st = hw_facts(db, id, ps, h, plan_id, 0, 0, 1);
    char why[300];
    snprintf(why, sizeof why, "%s", h->skipped ? h->why : "no rate meets the SLO with any configuration tried");
    if (st == FERRY_OK) st = ferry_db_run_finish(db, id, why);
  }
  ferry_db_close(db);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  if (!ps->o->quiet) fprintf(stderr, "ferry plan: wrote plan %s to %s\n", plan_id, ps->o->db);
  return CLI_OK;
}
