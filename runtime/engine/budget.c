/* Default budgets: what a run gets when it names no budget, chosen from what the machine (real
 * or a profile) offers and what the model needs. One decision for `ferry run`, `ferry sim` and
 * any program using the library, so a library user plans exactly as the command does. */
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "common/units.h"
#include "engine_impl.h"

/* Without a device budget a GPU gets 90 % of its memory (vLLM's default utilisation): the rest
 * is for the CUDA context, cuBLAS workspaces and staging. A simulated host keeps 10 % for the
 * operating system. */
#define DEFAULT_FRACTION 0.9
/* a real GPU may be partly held by another process: stay this far under what is free */
#define FREE_RESERVE_BYTES (256ull << 20)

static ferry_status plan_host(const struct ferry_machine_memory *m, struct ferry_engine_config *c,
                              struct ferry_budget_plan *plan) {
  char want[32], have[32];
  if (m->host_bytes && c->host_budget_bytes > m->host_bytes)
    return ferry__fail(FERRY_ERR_INVALID, "host budget %s exceeds the host memory of %s (%s)",
                       ferry__format_bytes(c->host_budget_bytes, want, sizeof want), m->host_name ? m->host_name : "the host",
                       ferry__format_bytes(m->host_bytes, have, sizeof have));
  if (c->host_budget_bytes) return FERRY_OK;
  if (m->host_bytes) {
    /* the profile's host memory, less the operating system's share; what does not fit streams
     * from disk */
    c->host_budget_bytes = (uint64_t)((double)m->host_bytes * DEFAULT_FRACTION);
    snprintf(plan->host_note, sizeof plan->host_note, "host budget %s (90%% of %s's host memory, %s)",
             ferry__format_bytes(c->host_budget_bytes, want, sizeof want), m->host_name ? m->host_name : "the profile",
             ferry__format_bytes(m->host_bytes, have, sizeof have));
  } else if (m->host_available_bytes) {
    /* a real run's streamed weights live in this machine's memory (pinned, on cuda): at most
     * half of what is available when it starts, so a model larger than memory streams instead
     * of swapping or failing to pin */
    c->host_budget_bytes = m->host_available_bytes / 2;
    snprintf(plan->host_note, sizeof plan->host_note, "host budget %s (half of the %s this machine has available)",
             ferry__format_bytes(c->host_budget_bytes, want, sizeof want),
             ferry__format_bytes(m->host_available_bytes, have, sizeof have));
  } else {
    return FERRY_OK;
  }
  plan->host_defaulted = 1;
  return FERRY_OK;
}

/* Where a default device budget goes: a model that fits stays resident (as without a budget);
 * a larger dense one pins its last layers in what streaming leaves; an MoE model keeps its
 * attention resident when it fits (every token reads all of it and only some experts) and
 * gives the rest to the expert cache, unless every routed expert runs on the CPU: then there is
 * none (ferry__experts_cpu_only_config(), the engine's rule), its last layers are pinned in what
 * is left as a dense model's, and the note says so. */
static const char *place(const ferry_model *model, ferry_store *store, struct ferry_engine_config *c, uint64_t budget,
                         int *fits) {
  struct ferry_engine_config whole = *c;
  whole.resident_all = 1;
  uint64_t need = 0, host_min = 0;
  *fits = ferry_engine_min_budgets(model, store, &whole, &need, &host_min) == FERRY_OK && need <= budget;
  if (*fits) {
    c->resident_all = 1;
    return ": the model fits, everything resident";
  }
  /* experts moving with their layers (--expert-granularity layer) stream like a dense model's */
  if (ferry_model_get_config(model)->n_experts == 0 || c->expert_granularity_layer) {
    c->fill_budget = 1;
    return ": the last layers fill what streaming leaves";
  }
  const int cpu_only = ferry__experts_cpu_only_config(c, ferry_model_get_config(model), 0, budget);
  struct ferry_engine_config attn = *c;
  attn.resident_attention = 1;
  if (!c->resident_attention && ferry_engine_min_budgets(model, store, &attn, &need, &host_min) == FERRY_OK &&
      need <= budget) {
    c->resident_attention = 1;
    if (!cpu_only) return ": attention resident, the expert cache takes the rest";
  }
  if (!cpu_only) return ": the expert cache takes what streaming leaves";
  /* No expert cache: nothing in the config fills one (a predictor, installed or planned, or a
   * static placement's popularity); the note says what would. The budget it leaves pins the last
   * layers, as a dense model's does. */
  c->fill_budget = 1;
#define NO_CACHE                                                                                                   \
  "routed experts run on the CPU (--offload-compute experts=cpu): no expert cache unless a predictor or a static " \
  "placement fills one"
  if (c->resident_attention) return ": attention resident; " NO_CACHE;
  /* the layers not pinned are fetched, computed on the CPU, or either per step */
  if (c->compute_layers == FERRY_COMPUTE_CPU)
    return ": " NO_CACHE "; the last layers fill what is left, the others run on the CPU";
  return c->compute_layers == FERRY_COMPUTE_AUTO
             ? ": " NO_CACHE "; the last layers fill what streaming leaves, the others stream or run on the CPU"
             : ": " NO_CACHE "; the last layers fill what streaming leaves";
#undef NO_CACHE
}

ferry_status ferry_engine_plan_budgets(const ferry_model *model, ferry_store *store,
                                       const struct ferry_machine_memory *m, struct ferry_engine_config *c,
                                       struct ferry_budget_plan *plan) {
  if (!model || !m || !c || !plan) return ferry__fail(FERRY_ERR_INVALID, "ferry_engine_plan_budgets: NULL argument");
  memset(plan, 0, sizeof *plan);
  ferry_status st = plan_host(m, c, plan);
  if (st != FERRY_OK || !m->gpu_bytes) return st; /* no GPU to size from: the host executor's device is RAM */
  const char *gpu = m->gpu_name ? m->gpu_name : "the GPU";
  char want[32], have[32];
  if (c->device_budget_bytes > m->gpu_bytes)
    return ferry__fail(FERRY_ERR_INVALID, "device budget %s exceeds the memory of %s (%s)",
                       ferry__format_bytes(c->device_budget_bytes, want, sizeof want), gpu,
                       ferry__format_bytes(m->gpu_bytes, have, sizeof have));
  if (c->device_budget_bytes) return FERRY_OK;
  uint64_t budget = (uint64_t)((double)m->gpu_bytes * DEFAULT_FRACTION);
  const int known_free = m->gpu_free_bytes != UINT64_MAX;
  if (known_free) {
    const uint64_t usable = m->gpu_free_bytes > FREE_RESERVE_BYTES ? m->gpu_free_bytes - FREE_RESERVE_BYTES : 0;
    if (budget > usable) budget = usable;
  }
  if (!budget) return ferry__fail(FERRY_ERR_NOMEM, "%s has no free memory for a device budget", gpu);
  c->device_budget_bytes = budget;
  const char *how = place(model, store, c, budget, &plan->fits);
  plan->device_defaulted = 1;
  snprintf(plan->device_note, sizeof plan->device_note, "device budget %s (%.0f%% of %s's %s%s)%s",
           ferry__format_bytes(budget, want, sizeof want), 100.0 * (double)budget / (double)m->gpu_bytes, gpu,
           ferry__format_bytes(m->gpu_bytes, have, sizeof have), known_free ? ", less what is in use" : "", how);
  return FERRY_OK;
}
