/* Shared by routing_stats.c (the whole-trace figures) and routing_stats_layer.c (the per-layer
 * measures published routing analyses report): scratch buffers sized once per trace. */
#ifndef FERRY_TRACES_ROUTING_STATS_IMPL_H
#define FERRY_TRACES_ROUTING_STATS_IMPL_H

#include "traces/routing_impl.h"

struct ferry__routing_scratch {
  int64_t *first;      /* [E] first-choice counts */
  int64_t *req_counts; /* [E] per-request counts */
  int64_t *next_first; /* [E] first choices at l+1 */
  int64_t *next_set;   /* [E] set members at l+1 */
  int64_t *gate_hist;  /* top-1 share histogram */
  int64_t *order;      /* [E] scratch for top-k sums */
  int64_t *pair;       /* [E][E] co-occurrence (NULL when E is too large) */
  int64_t *cond_first; /* [E][E] first at l -> first at l+1 (NULL when E is too large) */
};

ferry_status ferry__routing_scratch_init(struct ferry__routing_scratch *sc, const ferry_routing *r);
void ferry__routing_scratch_free(struct ferry__routing_scratch *sc);

/* Fill the load, repetition, cross-layer, co-activation and gate fields of layer l. */
void ferry__routing_layer_measures(const ferry_routing *r, int32_t l, const int64_t *counts,
                                   struct ferry__routing_scratch *sc, struct ferry_routing_layer_stats *ls);

/* any_repeat of uniform random top-k routing: 1 - C(E-K, K) / C(E, K). */
double ferry__routing_any_repeat_uniform(int32_t E, int32_t K);

#endif
