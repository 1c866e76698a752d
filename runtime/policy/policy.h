/* Pure offload decisions: the residency plan (what is pinned on the device, what is streamed
 * in blocks, where each streamed unit lives between uses) and the expert cache. No I/O, no
 * clock, no executor: the engine hands in a snapshot of sizes and state and gets a decision. */
#ifndef FERRY_POLICY_H
#define FERRY_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/activity.h"
#include "ferry/cache_policy.h"
#include "ferry/status.h"

/* Sizes the plan is made from (bytes as stored, per layer). */
struct ferry_plan_input {
  int32_t n_layers;
  int32_t n_experts;            /* 0 for dense models */
  int32_t experts_per_token;
  int32_t n_moe_layers;         /* layers with routed experts (0: all n_layers when n_experts) */
  uint64_t global_bytes;        /* embeddings, final norm, head (less what streams): always pinned */
  uint64_t embed_bytes;         /* streamed embeddings (token and position tables, embedding norm);
                                   0: in global_bytes */
  uint64_t head_bytes;          /* streamed head (final norm, LM head or, tied, the token table again) */
  uint64_t head_shared_bytes;   /* of head_bytes, the tied table the embeddings hold too (pinned once) */
  const uint64_t *attn_bytes;   /* per layer: attention part (+ router, shared expert, norms for MoE) */
  const uint64_t *ffn_bytes;    /* per layer: dense FFN part (0 for MoE) */
  uint64_t expert_bytes;        /* one routed expert (largest) */
  uint64_t kv_bytes;            /* KV cache (device; with layer_kv_bytes, what no layer holds) */
  const uint64_t *layer_kv_bytes; /* per layer, or NULL: the layer's KV cache, kept where its
                                   weights are (--kv-home layer, layers computed on the CPU): on
                                   the device while the layer is pinned, in host memory (counted
                                   in host_fixed_bytes and host_kv_bytes of the plan) while any
                                   part of it streams */
  const uint64_t *kv_window_bytes; /* per layer, with layer_kv_bytes: the device scratch a streamed
                                   layer computed on the device copies its window up into (0: it
                                   never attends there); the largest of the streamed layers' is
                                   charged once, the layers take turns */
  uint64_t workspace_bytes;     /* activations and kernel workspace (device) */
  uint64_t host_fixed_bytes;    /* host buffers the engine always needs (read-back, the CPU's
                                   workspace and KV cache below) */
  uint64_t host_kv_bytes;       /* of host_fixed_bytes: the KV cache kept in host memory */
  uint64_t host_workspace_bytes; /* of host_fixed_bytes: the CPU's copy of the workspace */
  uint64_t staging_align;       /* extra bytes per staging slot for O_DIRECT envelopes */
  int disk_available;           /* weights can be read from files */
};

struct ferry_plan_config {
  int32_t block_layers;         /* layers per streamed block; 0 = all streamed layers */
  int32_t prefetch_depth;       /* blocks in flight ahead of the one computing */
  int32_t block_slots;          /* device slots for streamed blocks; 0 = prefetch_depth + 1 */
  int32_t pin_first, pin_last;  /* layers pinned at either end */
  int resident_attention;       /* keep every attention part pinned; stream FFN / experts */
  int resident_all;             /* pin everything (the reference for offloaded runs) */
  int home_disk;                /* keep streamed units on disk (no host copies) */
  uint64_t device_budget_bytes; /* 0 = unlimited: everything pinned */
  uint64_t host_budget_bytes;   /* 0 = unlimited */
  int blocks_on_cpu;            /* streamed blocks are computed on the CPU where they live: no
                                   device slots for them */
  int32_t max_expert_slots;     /* at most this many expert-cache slots (0 = as many as fit): memory
                                   pressure shrinks the cache */
  int experts_on_cpu;           /* every routed expert not pinned is computed on the CPU from its
                                   home and none is ever cached on the device: no expert slot */
};

struct ferry_plan_block {
  int32_t first_layer, n_layers;
  uint64_t bytes;
  enum ferry_tier home; /* HOST or DISK */
};

struct ferry_plan {
  /* per layer: 1 if its attention / FFN part is pinned on the device; -1 or its block */
  uint8_t *attn_pinned, *ffn_pinned;
  int32_t *layer_block;        /* block holding the layer's streamed parts, or -1 */
  struct ferry_plan_block *blocks;
  int32_t n_blocks;
  int32_t embed_block, head_block; /* the streamed embeddings' and head's blocks (first and last,
                                   n_layers 0), or -1 when they are pinned */
  int32_t n_block_slots;       /* device slots for streamed blocks (prefetch depth + 1, or more) */
  int32_t prefetch_depth;      /* blocks fetched ahead of the computing one: at most n_block_slots - 1 */
  uint64_t block_slot_bytes;
  /* experts */
  int experts_pinned;          /* all experts pinned (resident_all or unlimited budget) */
  int32_t n_expert_slots;      /* expert cache capacity (all layers together) */
  uint64_t expert_slot_bytes;
  enum ferry_tier expert_home; /* HOST or DISK for experts not pinned */
  int32_t experts_on_host;     /* how many experts (layer-major order over the MoE layers) live in host memory */
  /* staging for units homed on disk */
  int32_t n_staging_slots;
  uint64_t staging_slot_bytes;
  /* device bytes */
  uint64_t device_pinned_bytes, device_kv_bytes, device_workspace_bytes, device_block_bytes,
      device_expert_bytes, device_total_bytes, device_min_bytes;
  /* host bytes */
  uint64_t host_units_bytes, host_staging_bytes, host_fixed_bytes, host_total_bytes;
  uint64_t host_kv_bytes, host_workspace_bytes; /* of host_fixed_bytes (ferry_plan_input, and the
                                   streamed layers' caches of layer_kv_bytes) */
};

/* Make the plan. On failure returns FERRY_ERR_BUDGET (or INVALID) with a message naming the
 * figures (the minimum working set and what it is made of) in msg. */
ferry_status ferry__plan_make(const struct ferry_plan_input *in, const struct ferry_plan_config *cfg,
                              struct ferry_plan *out, char *msg, size_t msg_len);
void ferry__plan_free(struct ferry_plan *plan);

/* ---- predictors: the selection they share ---- */
/* The `max` largest keys, best first, ties to the lower index; key() returns NaN for an entry
 * that must not be chosen. O(n * max), which beats sorting for the handful of experts
 * prefetched per layer. */
int32_t ferry__top_keys(const void *v, int32_t n, int32_t max, double (*key)(const void *v, int32_t i), int32_t *out);
/* key of a float logit: the finite ones */
double ferry__logit_key(const void *v, int32_t i);

/* ---- expert cache: fixed slots, a registered placement policy (cache_policy.h, cache_*.c)
 * choosing victims ---- */

/* The registered policies, and lookup by name (NULL when unknown). */
const struct ferry_cache_policy_ops *ferry__cache_policy_find(const char *name);
size_t ferry__cache_policy_count(void);
const struct ferry_cache_policy_ops *ferry__cache_policy_at(size_t i);

struct ferry_expert_cache {
  const struct ferry_cache_policy_ops *policy;
  void *policy_state;
  int32_t n_slots, n_layers, n_experts;
  int32_t per_layer;       /* K > 0: layer l owns slots [l K, (l + 1) K) (mixtral-offloading) */
  int32_t *slot_of;        /* [unit = layer * n_experts + expert] -> slot or -1 */
  int32_t *slot_unit;      /* slot -> unit, -1 when empty */
  int32_t n_filled;        /* slots holding a unit: once all do, an insert looks for no empty one */
  uint8_t *slot_protected;
  uint8_t *mask;           /* scratch: protected, or another layer's slot (per_layer) */
};

/* A cache of n_slots under `policy`; per_layer > 0 splits it into per_layer slots per layer;
 * popularity (optional, n_layers x n_experts) is handed to the policy's create().
 * FERRY_ERR_NOMEM or the policy's error. */
ferry_status ferry__cache_init(struct ferry_expert_cache *c, const struct ferry_cache_policy_ops *policy,
                               int32_t n_slots, int32_t per_layer, int32_t n_layers, int32_t n_experts,
                               const int64_t *popularity);
void ferry__cache_free(struct ferry_expert_cache *c);
/* Slot holding (layer, expert), or -1 (inline: asked for every routed expert of every step). */
static inline int32_t ferry__cache_lookup(const struct ferry_expert_cache *c, int32_t layer, int32_t expert) {
  return c->slot_of[(size_t)layer * (size_t)c->n_experts + (size_t)expert];
}
/* Record a use (hit or fresh fill). */
static inline void ferry__cache_touch(struct ferry_expert_cache *c, int32_t slot) {
  c->policy->touch(c->policy_state, slot, c->slot_unit[slot]);
}
/* Choose a slot for (layer, expert): an empty one, else the victim by policy among slots not
 * protected. Returns the slot and the evicted (layer, expert) through out params (-1 when the
 * slot was empty); -1 when every slot is protected. The slot is assigned to the new expert. */
int32_t ferry__cache_insert(struct ferry_expert_cache *c, int32_t layer, int32_t expert, int32_t *evicted_layer,
                            int32_t *evicted_expert);
void ferry__cache_protect(struct ferry_expert_cache *c, int32_t slot, int on);
void ferry__cache_unprotect_all(struct ferry_expert_cache *c);
/* Units the policy places before serving (best first), at most max; 0 without a preload. */
int32_t ferry__cache_preload(struct ferry_expert_cache *c, int32_t *units, int32_t max);

/* ---- hybrid placement: Fiddler's rule ---- */
/* Throughputs per second; 0 = unknown (that side is not chosen). */
struct ferry_place_rates {
  double cpu_flops, cpu_bytes, dev_flops, dev_bytes, link_bytes;
};
/* 1 when running `flops` of math over a weight of `weight_bytes` in host memory is faster on the
 * CPU (max of its math and its reading of the weight) than copying the weight to the device and
 * running there (copy, then the larger of the device's math and reading); 0 otherwise, and when
 * the CPU's rates are unknown. */
int ferry__place_on_cpu(const struct ferry_place_rates *r, double weight_bytes, double flops);

/* ---- the expert cache as the engine drives it (expert_plan.c): the engine issues the ops,
 * `ferry predictor eval` counts them ---- */
struct ferry__expert_plan {
  struct ferry_expert_cache cache;
  uint8_t *prefetched; /* [slot] filled on a prediction and not used yet */
  int32_t *votes;      /* [expert] predictions for the target layer being prefetched */
  int32_t n_experts, budget;
  int no_reuse;        /* every use fetched on demand, the cache never consulted (predictor none) */
  int32_t evicted_layer; /* the layer of the expert the last fill evicted, or -1 (read by fn) */
  int64_t hits, misses, prefetches, prefetches_used, prefetches_wasted, evictions;
};

/* fn(user, layer, expert, slot, fetch): the expert is in `slot`; fetch says it must be loaded
 * there first (a miss or a prefetch). */
typedef ferry_status (*ferry__xplan_fn)(void *user, int32_t layer, int32_t expert, int32_t slot, int fetch);

/* The cache's geometry as ferry__cache_init() takes it (per_layer, popularity). */
ferry_status ferry__xplan_init(struct ferry__expert_plan *p, const struct ferry_cache_policy_ops *policy, int32_t n_slots,
                               int32_t per_layer, int32_t n_layers, int32_t n_experts, const int64_t *popularity,
                               int32_t prefetch_depth, int no_reuse);
void ferry__xplan_free(struct ferry__expert_plan *p);
/* Layer `layer`'s routed experts (count[x] > 0): the hits first, then the misses, experts in
 * index order, fn for each; an expert with skip[x] set (optional: computed elsewhere, on the
 * CPU) is neither, unless the cache holds it. */
ferry_status ferry__xplan_demand(struct ferry__expert_plan *p, int32_t layer, const int32_t *count, const uint8_t *skip,
                                 ferry__xplan_fn fn, void *user);
/* The votes of one target layer: reset, add each token's predicted ids, then prefetch the most
 * voted that are not cached, at most the budget (ties: the lower expert). */
void ferry__xplan_vote_reset(struct ferry__expert_plan *p);
void ferry__xplan_vote(struct ferry__expert_plan *p, const int32_t *ids, int32_t n);
ferry_status ferry__xplan_prefetch(struct ferry__expert_plan *p, int32_t target, ferry__xplan_fn fn, void *user);

#endif
