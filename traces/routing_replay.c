/* The routing source that replays a recorded trace, answering what the trace lacks (absent
 * rows, other shapes) from a synthetic model, and counting both. */
#include <string.h>

#include "common/alloc.h"
#include "traces/routing_impl.h"

struct ferry_routing_replay {
  const ferry_routing *trace;
  ferry_routing_synth *fallback;
  int64_t hits, misses;
};

ferry_status ferry_routing_replay_create(ferry_routing_replay **out, const ferry_routing *trace,
                                         ferry_routing_synth *fallback) {
  if (!out || !trace || !fallback)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_routing_replay_create: NULL trace or fallback");
  *out = ferry__calloc(1, sizeof **out);
  if (!*out) return ferry__fail(FERRY_ERR_NOMEM, "routing replay: out of memory");
  (*out)->trace = trace;
  (*out)->fallback = fallback;
  return FERRY_OK;
}

void ferry_routing_replay_free(ferry_routing_replay *rp) { ferry_free(rp); }
int64_t ferry_routing_replay_hits(const ferry_routing_replay *rp) { return rp ? rp->hits : 0; }
int64_t ferry_routing_replay_misses(const ferry_routing_replay *rp) { return rp ? rp->misses : 0; }

void ferry_routing_replay_fn(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                             int32_t n_experts, int32_t *ids, float *weights) {
  ferry_routing_replay *rp = user;
  const int32_t *ti;
  const float *tw;
  if (top_k == rp->trace->top_k && n_experts >= rp->trace->n_experts &&
      ferry_routing_lookup(rp->trace, req_id, token_index, layer, &ti, &tw)) {
    memcpy(ids, ti, (size_t)top_k * sizeof *ids);
    if (weights) memcpy(weights, tw, (size_t)top_k * sizeof *weights);
    rp->hits++;
    return;
  }
  rp->misses++;
  ferry_routing_synth_fn(rp->fallback, req_id, token_index, layer, top_k, n_experts, ids, weights);
}
