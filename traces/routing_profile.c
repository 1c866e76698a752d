/* Named routing profiles: knob settings of the synthetic routing model calibrated so that the
 * statistics of routing_stats.c land on what papers measured on real models. The figures and
 * their sources are in tests/data/routing/targets.json; test_routing_profiles checks each
 * profile against them. What no paper measured (marked below) is set to plausible values and
 * is not a target. */
#include <stdio.h>
#include <string.h>

#include "traces/routing_impl.h"

struct profile {
  const char *name;
  int32_t layers, experts, top_k; /* the model the figures were measured on */
  double zipf;
  double sticky_first[3], sticky_any[3]; /* first, middle, last layer */
  double affinity, coact;
  int32_t domains;
  double domain_mix, domain_zipf, gate_temp;
};

static const struct profile profiles[] = {
    /* Mixtral-8x7B (Mixtral paper, Table 5 and Figure 7): consecutive tokens repeat the first
     * choice 14% / 26% / 23% of the time at layers 0 / 15 / 31 and any choice 48% / 64% / 51%;
     * expert shares per domain stay near 1/8. No domain specialisation (OLMoE paper, Fig. 22).
     * Not published: cross-layer affinity and the gate spread. */
    {"mixtral", 32, 8, 2, 0.15, {0.018, 0.160, 0.110}, {0.010, 0.165, 0.000}, 0.20, 0, 0, 0, 0, 1.0},
    /* OLMoE-1B-7B (OLMoE paper, section 5): co-activation pairs on generic text (C4; experts 48
     * and 23 of layer 7 at 60%: the pairs here, measured without domains), and experts nearly
     * 100% specialised on one domain (arXiv, layer 0: the per-request domains here). Not
     * published: temporal locality (Mixtral-like values), gate spread. */
    {"olmoe", 16, 64, 8, 0.20, {0.05, 0.15, 0.10}, {0.05, 0.15, 0.05}, 0.20, 0.35, 8, 0.45, 2.5, 1.0},
    /* The DeepSeek 16B ablation model of the DeepSeek-V3 report (Figure 9): with batch-wise
     * (auxiliary-loss-free) balancing, per-domain relative expert load reaches the top of the
     * figure's 0-10 colour scale (32 domains with their own rankings, uniform global
     * popularity) while the batch stays balanced. Not published: temporal locality
     * (Mixtral-like values), co-activation, gate spread. */
    {"deepseek", 27, 64, 6, 0, {0.05, 0.15, 0.10}, {0.05, 0.15, 0.05}, 0.20, 0, 32, 0.70, 1.2, 1.0},
    /* Uniform, independent choices: the random baselines of every statistic. */
    {"uniform", 8, 32, 2, 0, {0, 0, 0}, {0, 0, 0}, 0, 0, 0, 0, 0, 0},
};

static const struct profile *find(const char *name) {
  for (size_t i = 0; name && i < sizeof profiles / sizeof *profiles; i++)
    if (!strcmp(profiles[i].name, name)) return &profiles[i];
  return NULL;
}

static ferry_status unknown(const char *name) {
  return ferry__fail(FERRY_ERR_INVALID, "routing profile '%s' is unknown (expected mixtral, olmoe, deepseek or uniform)",
                     name ? name : "(null)");
}

const char *ferry_routing_profile_name(size_t i) {
  return i < sizeof profiles / sizeof *profiles ? profiles[i].name : NULL;
}

ferry_status ferry_routing_profile_shape(const char *name, int32_t *n_layers, int32_t *n_experts, int32_t *top_k) {
  const struct profile *p = find(name);
  if (!p) return unknown(name);
  if (n_layers) *n_layers = p->layers;
  if (n_experts) *n_experts = p->experts;
  if (top_k) *top_k = p->top_k;
  return FERRY_OK;
}

ferry_status ferry_routing_profile_apply(const char *name, struct ferry_routing_synth_config *cfg) {
  const struct profile *p = find(name);
  if (!p) return unknown(name);
  if (!cfg) return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_profile_apply: NULL config");
  snprintf(cfg->profile, sizeof cfg->profile, "%s", p->name);
  cfg->zipf = p->zipf;
  cfg->temporal = cfg->layer_corr = 0;
  memcpy(cfg->sticky_first, p->sticky_first, sizeof cfg->sticky_first);
  memcpy(cfg->sticky_any, p->sticky_any, sizeof cfg->sticky_any);
  cfg->affinity = p->affinity;
  cfg->coact = p->coact;
  cfg->domains = p->domains;
  cfg->domain_mix = p->domain_mix;
  cfg->domain_zipf = p->domain_zipf;
  cfg->gate_temp = p->gate_temp;
  return FERRY_OK;
}
