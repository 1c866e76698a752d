/* The MoE side of a run: recording the routing (--record-routing, --record-features), the
 * simulator's routing source (a replayed trace with the synthetic model behind it, or the
 * synthetic model alone) and the expert predictor. */
#include <stdio.h>
#include <string.h>

#include "cli/run_exec.h"
#include "cli/run_routing_meta.h"
#include "common/alloc.h"
#include "common/error.h"

/* Requests of the run that a replayed routing trace has no decisions for: all of them means the
 * trace was recorded on other requests (an error); some are warned about, with the count. */
static ferry_status check_routing_coverage(const struct run_ctx *c) {
  int64_t absent = 0;
  for (int64_t i = 0; i < c->n_reqs; i++) absent += !ferry_routing_lookup(c->replayed, c->reqs[i].id, 0, 0, NULL, NULL);
  if (c->n_reqs && absent == c->n_reqs)
    return ferry__fail(FERRY_ERR_INVALID,
                       "--routing %s has no decisions for any of the %lld requests (their ids are not in the trace): "
                       "record it on the same requests (ferry run --record-routing)",
                       c->a->routing, (long long)c->n_reqs);
  if (absent)
    fprintf(stderr, "ferry: --routing %s: %lld of %lld requests have no recorded routing; the synthetic model routes "
                    "them\n",
            c->a->routing, (long long)absent, (long long)c->n_reqs);
  return FERRY_OK;
}

/* The simulator computes no router: a recorded trace (falling back to the synthetic model for
 * what it lacks), or the synthetic model. */
static ferry_status sim_routing_source(struct run_ctx *c) {
  struct run_args *a = c->a;
  const struct ferry_model_config *mc = c->mc;
  struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                          .top_k = (int32_t)mc->experts_per_token, .seed = (uint64_t)a->seed};
  ferry_status st;
  if (a->routing_synth && (st = ferry_routing_synth_parse(a->routing_synth, &sc)) != FERRY_OK) return st;
  /* the engine routes the model's shape: another one in the spec would be ignored */
  if (sc.n_layers != (int32_t)mc->n_layers || sc.n_experts != (int32_t)mc->n_experts ||
      sc.top_k != (int32_t)mc->experts_per_token)
    return ferry__fail(FERRY_ERR_INVALID,
                       "--routing-synth %s: %s has %lld layers, %lld experts and routes %lld per token; layers, experts "
                       "and k must match it (leave them out)",
                       a->routing_synth, a->model, (long long)mc->n_layers, (long long)mc->n_experts,
                       (long long)mc->experts_per_token);
  if ((st = ferry_routing_synth_create(&c->synth, &sc)) != FERRY_OK) return st;
  a->ec.routing = ferry_routing_synth_fn;
  a->ec.routing_many = ferry_routing_synth_many;
  a->ec.routing_user = c->synth;
  if (!a->routing) return FERRY_OK;
  if ((st = ferry_routing_open(&c->replayed, a->routing, NULL)) != FERRY_OK ||
      (st = ferry_routing_check_shape(c->replayed, sc.n_layers, sc.n_experts, sc.top_k, a->routing)) != FERRY_OK ||
      (st = check_routing_coverage(c)) != FERRY_OK ||
      (st = ferry_routing_replay_create(&c->replay, c->replayed, c->synth)) != FERRY_OK)
    return st;
  a->ec.routing = ferry_routing_replay_fn;
  a->ec.routing_many = NULL;
  a->ec.routing_user = c->replay;
  return FERRY_OK;
}

ferry_status run_setup_routing(struct run_ctx *c) {
  struct run_args *a = c->a;
  const struct ferry_model_config *mc = c->mc;
  if ((a->record_routing || a->routing || a->routing_synth) && !mc->n_experts)
    return ferry__fail(FERRY_ERR_INVALID, "routing options need a Mixture-of-Experts model (%s is dense)", a->model);
  if (a->record_routing) {
    ferry_status st = ferry_routing_create(&c->recorded, (int32_t)mc->n_layers, (int32_t)mc->n_experts,
                                           (int32_t)mc->experts_per_token);
    if (st != FERRY_OK) return st;
    a->ec.on_routing = ferry_routing_record;
    a->ec.on_routing_user = c->recorded;
  }
  return a->sim && mc->n_experts ? sim_routing_source(c) : FERRY_OK;
}

/* Before the plan: what the predictor, the static placement and recorded features change in it.
 * The trace they read is opened and the placement's counts taken now, so that the plan
 * (--plan-only's too) sizes the expert cache the run fills: with every routed expert on the CPU
 * only they make one. Features are read back (host buffers) for a predictor or a recording. */
ferry_status run_plan_predictor(struct run_ctx *c) {
  struct run_args *a = c->a;
  const struct ferry_model_config *mc = c->mc;
  ferry_status st;
  if ((a->predictor || a->predictor_routing) && !mc->n_experts)
    return ferry__fail(FERRY_ERR_INVALID, "--predictor needs a Mixture-of-Experts model (%s is dense)", a->model);
  if (a->predictor_routing && !c->pred_trace &&
      ((st = ferry_routing_open(&c->pred_trace, a->predictor_routing, NULL)) != FERRY_OK ||
       (st = ferry_routing_check_shape(c->pred_trace, (int32_t)mc->n_layers, (int32_t)mc->n_experts,
                                       (int32_t)mc->experts_per_token, a->predictor_routing)) != FERRY_OK))
    return st;
  /* the static placement pins the experts the trace routes most */
  if (c->pred_trace && !c->popularity && a->ec.expert_cache && !strcmp(a->ec.expert_cache, "static")) {
    c->popularity = ferry__calloc((size_t)(mc->n_layers * mc->n_experts), sizeof *c->popularity);
    if (!c->popularity) return ferry__fail(FERRY_ERR_NOMEM, "out of memory for the routing counts");
    if ((st = ferry_routing_counts(c->pred_trace, (int32_t)mc->n_experts, c->popularity)) != FERRY_OK) return st;
    a->ec.expert_popularity = c->popularity;
  }
  /* (a dense model's recording is refused with the other routing options: run_setup_routing()) */
  const int32_t recorded = !a->record_features || !mc->n_experts ? 0
                           : !strcmp(a->record_features, "mlp3") ? FERRY_MLP3_FEATURES
                           : !strcmp(a->record_features, "mlp7") ? FERRY_MLP7_FEATURES
                                                                  : 0;
  if (recorded) a->ec.token_features = recorded;
  if (a->predictor && (st = ferry_prefetcher_plan(a->predictor, &a->ec)) != FERRY_OK) return st;
  if (recorded && a->ec.token_features != recorded)
    return ferry__fail(FERRY_ERR_INVALID,
                       "--record-features %s and --predictor %s compute different features: use the same variant",
                       a->record_features, a->predictor);
  return FERRY_OK;
}

ferry_status run_setup_predictor(struct run_ctx *c) {
  struct run_args *a = c->a;
  const struct ferry_prefetcher_config pc = {.predictor = a->predictor,
                                             .weights = a->predictor_model,
                                             .trace = c->pred_trace,
                                             .routing = a->sim ? a->ec.routing : NULL,
                                             .routing_user = a->sim ? a->ec.routing_user : NULL,
                                             .record = c->recorded};
  return a->predictor ? ferry_prefetcher_create(&c->prefetcher, &pc, c->mc, &a->ec) : FERRY_OK;
}

/* After serving: write the recorded routing, say how a replay went. */
ferry_status run_finish_routing(struct run_ctx *c) {
  const struct run_args *a = c->a;
  ferry_status st;
  if (c->recorded) {
    if ((st = ferry_routing_record_status(c->recorded)) != FERRY_OK || (st = ferry_prefetcher_record_status(c->prefetcher)) != FERRY_OK ||
        (st = ferry_routing_write_jsonl(c->recorded, a->record_routing)) != FERRY_OK)
      return st;
    if (c->db) run_routing_meta(c->db, c->run_id, "recorded", a->record_routing, c->recorded);
    if (a->progress)
      fprintf(stderr, "ferry: wrote %lld routing decisions to %s\n", (long long)ferry_routing_n_rows(c->recorded),
              a->record_routing);
  }
  if (c->replay && a->progress)
    fprintf(stderr, "ferry: routing replayed from %s: %lld decisions from the trace, %lld from the synthetic model\n",
            a->routing, (long long)ferry_routing_replay_hits(c->replay), (long long)ferry_routing_replay_misses(c->replay));
  return FERRY_OK;
}

void run_free_routing(struct run_ctx *c) {
  ferry_prefetcher_free(c->prefetcher);
  ferry_routing_free(c->pred_trace);
  ferry_free(c->popularity);
  ferry_routing_replay_free(c->replay);
  ferry_routing_free(c->replayed);
  ferry_routing_synth_free(c->synth);
  ferry_routing_free(c->recorded);
}
