/* Internals of routing traces shared by routing.c (index, JSONL), routing_stats.c and
 * routing_synth.c: the trace handle and its per-request dense blocks. */
#ifndef FERRY_TRACES_ROUTING_IMPL_H
#define FERRY_TRACES_ROUTING_IMPL_H

#include "common/error.h"
#include "ferry/routing.h"

/* One request: cells [token][layer][k] in token-major order so that growing the token count
 * is a plain realloc. */
struct ferry__routing_req {
  int64_t req_id;
  int32_t n_tokens, cap_tokens;
  int32_t *ids;     /* -1 where absent */
  float *weights;
  float *features;  /* [cap_tokens][n_features], allocated on first use */
  uint8_t *has_features;
  int32_t *look;    /* [cap_tokens][layer][FERRY_ROUTING_MAX_LOOKAHEAD][k] lookahead choices,
                       -1 where absent; allocated on first use */
};

struct ferry_routing {
  int32_t n_layers, n_experts, top_k, n_features;
  struct ferry__routing_req *reqs; /* sorted by req_id */
  size_t n_reqs, cap_reqs;
  int64_t n_rows;
  ferry_status record_status;
  struct ferry_err err;
};

/* vLLM's routed-experts responses (read_routing_vllm.c): whether a first line looks like one,
 * and the reader ferry_routing_open() hands such files to. */
int ferry__routing_looks_vllm(const char *line);
ferry_status ferry__routing_open_vllm(ferry_routing **out, const char *path, const struct ferry_routing_options *opts,
                                      struct ferry_err *err);

/* Request with this id, or NULL. */
const struct ferry__routing_req *ferry__routing_find(const ferry_routing *r, int64_t req_id);

#endif
