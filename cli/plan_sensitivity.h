/* `ferry plan --sensitivity PCT`: whether the cheapest pick still serves the demand within the
 * SLO when a figure of its profile is PCT % worse than the profile says. Its best configuration
 * is simulated at the demand (each machine's share) once as planned and once per rate, time and
 * efficiency of the profile and runtime (ferry_hw_figures()) with that figure PCT % lower, and
 * each run is judged by the plan's SLO: the figures a purchase hinges on, and what they rest on. */
#ifndef FERRY_CLI_PLAN_SENSITIVITY_H
#define FERRY_CLI_PLAN_SENSITIVITY_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "cli/plan_search.h"
#include "ferry/hw.h"

/* One run: as planned (figure "") or with one figure lowered. */
struct plan_sens_run {
  char figure[64];
  double value;              /* the profile's */
  char lowered[40];          /* what the run set */
  enum ferry_hw_basis basis;
  char source[256];
  struct plan_result r;      /* the simulation's latencies (ns) */
  int meets;                 /* the SLO holds */
  double excess;             /* the largest ratio of a metric to its limit (<= 1 meets) */
  char why[200];             /* plan_meets_slo()'s verdict */
};

struct plan_sens {
  double pct;
  int hw;                    /* the cheapest profile (index into the plan's list) */
  double rps_per_machine;    /* the demand each rented machine serves */
  int replicas;              /* engines on one machine */
  char config[192];
  struct plan_sens_run base;
  struct plan_sens_run *runs; /* n, the largest SLO ratio first */
  int n;
};

/* Run the study for the cheapest profile; CLI_OK or a CLI exit code (messages printed). */
int plan_sensitivity_run(const struct plan_state *ps, int cheapest, struct plan_sens *out);
/* The text table (after the plan's). */
void plan_sensitivity_print(const struct plan_state *ps, const struct plan_sens *s, FILE *f);
/* The study as the plan document's "sensitivity" member; NULL when out of memory. */
cJSON *plan_sensitivity_json(const struct plan_state *ps, const struct plan_sens *s);
void plan_sensitivity_free(struct plan_sens *s);

#endif
