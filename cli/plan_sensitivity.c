/* `ferry plan --sensitivity PCT` (plan_sensitivity.h). The runs are the plan's own simulations
 * (plan_job_run()) of the cheapest profile's best configuration at the demand, one after another
 * in this process, each with one figure set as BASE+PATH=VALUE would set it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/output.h"
#include "cli/plan_record.h"
#include "cli/plan_sensitivity.h"
#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/error.h"

static void judge(const struct plan_opts *o, struct plan_sens_run *run) {
  run->meets = plan_meets_slo(o, &run->r, run->why, sizeof run->why, &run->excess);
}

static int by_excess(const void *x, const void *y) {
  const struct plan_sens_run *a = x, *b = y;
  if (a->excess != b->excess) return a->excess > b->excess ? -1 : 1;
  return strcmp(a->figure, b->figure);
}

int plan_sensitivity_run(const struct plan_state *ps, int cheapest, struct plan_sens *out) {
  const struct plan_opts *o = ps->o;
  const struct plan_hw *h = &ps->hw[cheapest];
  memset(out, 0, sizeof *out);
  out->pct = o->sensitivity;
  out->hw = cheapest;
  struct plan_figures f;
  plan_hw_figures(ps, h, &f);
  const struct plan_knobs *k = &h->c[h->best_cand].k;
  out->rps_per_machine = ps->demand_rps / f.rented; /* each rented machine's share of the demand */
  out->replicas = plan_cand_replicas(h, k);
  snprintf(out->config, sizeof out->config, "%s", f.config);
  /* the figures of the profile the plan ran (with its --runtime) */
  struct run_args a;
  memset(&a, 0, sizeof a);
  a.hw = h->name;
  a.runtime = o->runtime;
  ferry_hw *hw = NULL;
  struct ferry_hw_figure *figs = NULL;
  size_t n = 0;
  ferry_status st = run_open_sim_profile(&a, &hw);
  if (st == FERRY_OK) st = ferry_hw_figures(ferry_hw_get(hw), &figs, &n);
  ferry_hw_close(hw);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  if (n && !(out->runs = ferry__calloc(n, sizeof *out->runs))) {
    ferry_hw_figures_free(figs);
    return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  }
  struct plan_job j = {.kind = PLAN_JOB_PROBE, .k = *k, .rps = out->rps_per_machine, .replicas = out->replicas};
  plan_job_run(o, h->name, ps->w, &j, &out->base.r);
  judge(o, &out->base);
  for (size_t i = 0; i < n; i++) {
    struct plan_sens_run *run = &out->runs[out->n];
    if (!run_figure_lowered(&figs[i], out->pct, run->lowered, sizeof run->lowered)) continue;
    snprintf(run->figure, sizeof run->figure, "%s", figs[i].path);
    snprintf(run->source, sizeof run->source, "%s", figs[i].source);
    run->value = figs[i].value;
    run->basis = figs[i].basis;
    if (!o->quiet)
      fprintf(stderr, "ferry plan: sensitivity %zu of %zu: %s %g -> %s\n", i + 1, n, run->figure, run->value,
              run->lowered);
    snprintf(j.figure, sizeof j.figure, "%s", run->figure);
    snprintf(j.figure_value, sizeof j.figure_value, "%s", run->lowered);
    plan_job_run(o, h->name, ps->w, &j, &run->r);
    judge(o, run);
    out->n++;
  }
  ferry_hw_figures_free(figs);
  qsort(out->runs, (size_t)out->n, sizeof *out->runs, by_excess);
  return CLI_OK;
}

/* The run moved the plan's latencies (p99 of the three) by at least 0.05 %. */
static int moved(const struct plan_sens_run *base, const struct plan_sens_run *run) {
  const double *a[3] = {base->r.ttft, base->r.tpot, base->r.e2e}, *b[3] = {run->r.ttft, run->r.tpot, run->r.e2e};
  if (!run->r.ok) return 1;
  for (int m = 0; m < 3; m++)
    if (a[m][3] > 0 && fabs(b[m][3] - a[m][3]) >= 5e-4 * a[m][3]) return 1;
  return 0;
}

static void print_row(FILE *f, const char *figure, double value, const char *basis, const struct plan_sens_run *run) {
  if (value > 0) fprintf(f, "%-34s %12.6g  %-8s", figure, value, basis);
  else fprintf(f, "%-34s %12s  %-8s", figure, "", basis);
  if (!run->r.ok) {
    fprintf(f, "  failed: %s\n", run->r.error);
    return;
  }
  fprintf(f, " %11.4g %11.4g %11.4g  %5.1f %%  %s\n", run->r.ttft[3] / 1e6, run->r.tpot[3] / 1e6, run->r.e2e[3] / 1e6,
          100.0 * run->excess, run->meets ? "meets" : run->why);
}

void plan_sensitivity_print(const struct plan_state *ps, const struct plan_sens *s, FILE *f) {
  fprintf(f, "\nsensitivity of the cheapest, %s (%s) at %.4g req/s a machine, each figure %g %% lower:\n",
          ps->hw[s->hw].name, s->config, s->rps_per_machine, s->pct);
  fprintf(f, "%-34s %12s  %-8s %11s %11s %11s  %7s  %s\n", "figure", "value", "basis", "TTFT p99 ms", "TPOT p99 ms",
          "e2e p99 ms", "of SLO", "verdict");
  print_row(f, "(as planned)", 0, "", &s->base);
  int quiet = 0, breaks = 0;
  for (int i = 0; i < s->n; i++) {
    const struct plan_sens_run *run = &s->runs[i];
    if (!moved(&s->base, run)) {
      quiet++;
      continue;
    }
    breaks += !run->meets;
    print_row(f, run->figure, run->value, ferry_hw_basis_name(run->basis), run);
  }
  if (quiet) {
    fprintf(f, "no change (under 0.05 %%):");
    for (int i = 0; i < s->n; i++)
      if (!moved(&s->base, &s->runs[i])) fprintf(f, " %s", s->runs[i].figure);
    fprintf(f, "\n");
  }
  fprintf(f, "%s", !s->base.meets ? "the pick misses the SLO at the demand even as planned\n"
                   : breaks        ? ""
                                   : "the pick meets the SLO at the demand with any one figure that much lower\n");
  if (breaks)
    fprintf(f, "%d figure(s) %g %% lower break the SLO at the demand: measure them before buying on the plan\n",
            breaks, s->pct);
  fflush(f);
  for (int i = 0; i < s->n; i++) {
    const struct plan_sens_run *run = &s->runs[i];
    const char *what = run_basis_unsourced(run->basis);
    if (!run->meets && s->base.meets && what)
      fprintf(stderr,
              "ferry plan: sensitivity: the SLO breaks with %s %g %% lower, and that figure is %s: measure it (ferry "
              "calibrate) or give a sourced one (--hw %s+%s=VALUE)\n",
              run->figure, s->pct, what, ps->hw[s->hw].name, run->figure);
  }
}

static cJSON *run_json(const struct plan_sens_run *run) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  if (run->figure[0]) {
    cli_json_str(o, "figure", run->figure);
    cli_json_num(o, "value", run->value);
    cli_json_str(o, "lowered_to", run->lowered);
    cli_json_str(o, "basis", ferry_hw_basis_name(run->basis));
    cli_json_str(o, "source", run->source);
  }
  cli_json_num(o, "ttft_p99_ms", run->r.ok ? run->r.ttft[3] / 1e6 : NAN);
  cli_json_num(o, "tpot_p99_ms", run->r.ok ? run->r.tpot[3] / 1e6 : NAN);
  cli_json_num(o, "e2e_p99_ms", run->r.ok ? run->r.e2e[3] / 1e6 : NAN);
  cli_json_num(o, "slo_ratio", run->r.ok ? run->excess : NAN);
  cJSON_AddBoolToObject(o, "meets_slo", run->meets);
  cli_json_str(o, "verdict", run->why);
  return o;
}

cJSON *plan_sensitivity_json(const struct plan_state *ps, const struct plan_sens *s) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cli_json_str(o, "hardware", ps->hw[s->hw].name);
  cli_json_str(o, "config", s->config);
  cli_json_num(o, "rps_per_machine", s->rps_per_machine);
  cli_json_num(o, "step_pct", s->pct);
  cJSON_AddItemToObject(o, "as_planned", run_json(&s->base));
  cJSON *arr = cJSON_AddArrayToObject(o, "figures");
  for (int i = 0; arr && i < s->n; i++) cJSON_AddItemToArray(arr, run_json(&s->runs[i]));
  return o;
}

void plan_sensitivity_free(struct plan_sens *s) {
  ferry_free(s->runs);
  memset(s, 0, sizeof *s);
}
