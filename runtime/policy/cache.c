/* The expert cache: a fixed number of device slots shared by all layers, keyed by
 * (layer, expert), with LRU or LFU eviction among unprotected slots. Ties are broken by the
 * lowest slot index, so the same routing always leaves the same cache contents. */
#include <string.h>

#include "common/alloc.h"
#include "policy.h"

ferry_status ferry__cache_init(struct ferry_expert_cache *c, enum ferry_cache_policy policy, int32_t n_slots,
                               int32_t n_layers, int32_t n_experts) {
  memset(c, 0, sizeof *c);
  c->policy = policy;
  c->n_slots = n_slots;
  c->n_layers = n_layers;
  c->n_experts = n_experts;
  size_t units = (size_t)n_layers * (size_t)n_experts;
  size_t slots = n_slots > 0 ? (size_t)n_slots : 1;
  c->slot_of = ferry__calloc(units ? units : 1, sizeof *c->slot_of);
  c->use_count = ferry__calloc(units ? units : 1, sizeof *c->use_count);
  c->slot_layer = ferry__calloc(slots, sizeof *c->slot_layer);
  c->slot_expert = ferry__calloc(slots, sizeof *c->slot_expert);
  c->slot_stamp = ferry__calloc(slots, sizeof *c->slot_stamp);
  c->slot_protected = ferry__calloc(slots, 1);
  if (!c->slot_of || !c->use_count || !c->slot_layer || !c->slot_expert || !c->slot_stamp || !c->slot_protected) {
    ferry__cache_free(c);
    return FERRY_ERR_NOMEM;
  }
  for (size_t i = 0; i < units; i++) c->slot_of[i] = -1;
  for (size_t s = 0; s < slots; s++) c->slot_layer[s] = c->slot_expert[s] = -1;
  return FERRY_OK;
}

void ferry__cache_free(struct ferry_expert_cache *c) {
  ferry_free(c->slot_of);
  ferry_free(c->use_count);
  ferry_free(c->slot_layer);
  ferry_free(c->slot_expert);
  ferry_free(c->slot_stamp);
  ferry_free(c->slot_protected);
  memset(c, 0, sizeof *c);
}

int32_t ferry__cache_lookup(const struct ferry_expert_cache *c, int32_t layer, int32_t expert) {
  return c->slot_of[(size_t)layer * (size_t)c->n_experts + (size_t)expert];
}

void ferry__cache_touch(struct ferry_expert_cache *c, int32_t slot) {
  c->slot_stamp[slot] = ++c->clock;
  size_t u = (size_t)c->slot_layer[slot] * (size_t)c->n_experts + (size_t)c->slot_expert[slot];
  c->use_count[u]++;
}

int32_t ferry__cache_insert(struct ferry_expert_cache *c, int32_t layer, int32_t expert, int32_t *evicted_layer,
                            int32_t *evicted_expert) {
  int32_t victim = -1;
  for (int32_t s = 0; s < c->n_slots && victim < 0; s++)
    if (c->slot_layer[s] < 0) victim = s;
  if (victim < 0) {
    for (int32_t s = 0; s < c->n_slots; s++) {
      if (c->slot_protected[s]) continue;
      if (victim < 0) {
        victim = s;
        continue;
      }
      if (c->policy == FERRY_CACHE_LFU) {
        uint64_t us = c->use_count[(size_t)c->slot_layer[s] * (size_t)c->n_experts + (size_t)c->slot_expert[s]];
        uint64_t uv =
            c->use_count[(size_t)c->slot_layer[victim] * (size_t)c->n_experts + (size_t)c->slot_expert[victim]];
        if (us < uv || (us == uv && c->slot_stamp[s] < c->slot_stamp[victim])) victim = s;
      } else if (c->slot_stamp[s] < c->slot_stamp[victim]) {
        victim = s;
      }
    }
  }
  if (victim < 0) return -1;
  *evicted_layer = c->slot_layer[victim];
  *evicted_expert = c->slot_expert[victim];
  if (*evicted_layer >= 0)
    c->slot_of[(size_t)*evicted_layer * (size_t)c->n_experts + (size_t)*evicted_expert] = -1;
  c->slot_layer[victim] = layer;
  c->slot_expert[victim] = expert;
  c->slot_of[(size_t)layer * (size_t)c->n_experts + (size_t)expert] = victim;
  return victim;
}

void ferry__cache_protect(struct ferry_expert_cache *c, int32_t slot, int on) { c->slot_protected[slot] = (uint8_t)on; }

void ferry__cache_unprotect_all(struct ferry_expert_cache *c) {
  memset(c->slot_protected, 0, c->n_slots > 0 ? (size_t)c->n_slots : 1);
}
