/* `ferry plan`'s results: the figures of each profile (costs at its highest rate and at the
 * demand), the JSON summary, and the study database (plan_record.c). */
#ifndef FERRY_CLI_PLAN_RECORD_H
#define FERRY_CLI_PLAN_RECORD_H

#include "cli/plan_search.h"

struct plan_figures {
  struct ferry_plan_cost at_max;    /* one machine at its highest rate within the SLO */
  struct ferry_plan_cost at_demand; /* the machines that serve the demand */
  int meets_demand;                 /* within --max-gpus */
  int within_budget;                /* at_demand within --budget-per-hour (or no budget) */
  double bound_rps;                 /* the highest throughput with every request queued at once */
  char config[192];                 /* the best configuration, in words (with its replicas) */
  int replicas;                     /* the best configuration's replicas (engines), router PLAN_ROUTER */
  int rented;                       /* machines rented for the demand: a single-GPU profile's replicas, else 1 */
};

void plan_hw_figures(const struct plan_state *ps, const struct plan_hw *h, struct plan_figures *f);
/* The `ferry sim` command that reproduces a profile's best point (every replica), in buf. */
const char *plan_hw_command(const struct plan_state *ps, const struct plan_hw *h, char *buf, size_t len);
/* PLAN_* facts on each profile's recorded runs (a failed run for a profile without one). */
int plan_record(struct plan_state *ps, int cheapest);
struct plan_sens;
/* The plan as ferry.plan.v1, with the --sensitivity study as "sensitivity" when sens is not NULL. */
int plan_print_json(const struct plan_state *ps, int cheapest, double wall_s, const struct plan_sens *sens);

#endif
