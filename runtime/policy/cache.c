/* The expert cache: a fixed number of device slots shared by all layers (or K per layer), keyed
 * by (layer, expert), with the victims of a registered placement policy (cache_policy.h,
 * cache_*.c) among unprotected slots. The cache finds empty slots (the lowest first) and keeps who holds what; the policy
 * keeps its history and names the victim, so the same routing always leaves the same contents. */
#include <stddef.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/registry.h"
#include "policy.h"

/* One line per built-in policy, in the order help texts list them. */
#define FERRY_CACHE_POLICIES(X) X(auto) X(lru) X(lfu) X(static)

#define DECLARE_(name) extern const struct ferry_cache_policy_ops ferry__cache_policy_##name;
FERRY_CACHE_POLICIES(DECLARE_)
#undef DECLARE_

static const struct ferry_cache_policy_ops *const builtin[] = {
#define ENTRY_(name) &ferry__cache_policy_##name,
    FERRY_CACHE_POLICIES(ENTRY_)
#undef ENTRY_
};

static struct ferry__registry registry = {.what = "expert-cache policy",
                                          .builtin = (const void *const *)builtin,
                                          .n_builtin = sizeof builtin / sizeof builtin[0],
                                          .name_offset = offsetof(struct ferry_cache_policy_ops, name)};

size_t ferry_cache_policy_registry_count(void) { return ferry__registry_count(&registry); }
const struct ferry_cache_policy_ops *ferry_cache_policy_registry_at(size_t i) { return ferry__registry_at(&registry, i); }
const struct ferry_cache_policy_ops *ferry_cache_policy_registry_find(const char *name) {
  return ferry__registry_find(&registry, name);
}

ferry_status ferry_cache_policy_register(const struct ferry_cache_policy_ops *ops) {
  if (!ops || ops->version != FERRY_CACHE_POLICY_VERSION || !ops->create || !ops->free || !ops->touch || !ops->victim)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_cache_policy_register: needs version %d and every function",
                       FERRY_CACHE_POLICY_VERSION);
  return ferry__registry_add(&registry, ops);
}

ferry_status ferry_cache_policy_lookup(const char *name, const struct ferry_cache_policy_ops **out) {
  *out = ferry_cache_policy_registry_find(name);
  return *out ? FERRY_OK : ferry__registry_unknown(&registry, name);
}

/* The engine's and predictor eval's lookups, by registry name (NULL when unknown). */
size_t ferry__cache_policy_count(void) { return ferry_cache_policy_registry_count(); }
const struct ferry_cache_policy_ops *ferry__cache_policy_at(size_t i) { return ferry_cache_policy_registry_at(i); }
const struct ferry_cache_policy_ops *ferry__cache_policy_find(const char *name) {
  return ferry_cache_policy_registry_find(name);
}

ferry_status ferry__cache_init(struct ferry_expert_cache *c, const struct ferry_cache_policy_ops *policy,
                               int32_t n_slots, int32_t per_layer, int32_t n_layers, int32_t n_experts,
                               const int64_t *popularity) {
  memset(c, 0, sizeof *c);
  c->policy = policy;
  c->n_slots = n_slots;
  c->n_layers = n_layers;
  c->n_experts = n_experts;
  c->per_layer = per_layer > 0 ? per_layer : 0;
  size_t units = (size_t)n_layers * (size_t)n_experts;
  size_t slots = n_slots > 0 ? (size_t)n_slots : 1;
  c->slot_of = ferry__calloc(units ? units : 1, sizeof *c->slot_of);
  c->slot_unit = ferry__calloc(slots, sizeof *c->slot_unit);
  c->slot_protected = ferry__calloc(slots, 1);
  c->mask = ferry__calloc(slots, 1);
  const struct ferry_cache_geometry g = {(int32_t)slots, n_layers, n_experts, popularity};
  ferry_status st = FERRY_ERR_NOMEM;
  if (!c->slot_of || !c->slot_unit || !c->slot_protected || !c->mask ||
      (st = policy->create(&c->policy_state, &g)) != FERRY_OK) {
    ferry__cache_free(c);
    return st;
  }
  for (size_t i = 0; i < units; i++) c->slot_of[i] = -1;
  for (size_t s = 0; s < slots; s++) c->slot_unit[s] = -1;
  return FERRY_OK;
}

void ferry__cache_free(struct ferry_expert_cache *c) {
  if (c->policy && c->policy_state) c->policy->free(c->policy_state);
  ferry_free(c->slot_of);
  ferry_free(c->slot_unit);
  ferry_free(c->slot_protected);
  ferry_free(c->mask);
  memset(c, 0, sizeof *c);
}

int32_t ferry__cache_insert(struct ferry_expert_cache *c, int32_t layer, int32_t expert, int32_t *evicted_layer,
                            int32_t *evicted_expert) {
  /* per-layer geometry: layer l's own slots only (a layer without any has none) */
  int32_t lo = 0, hi = c->n_slots;
  if (c->per_layer) {
    lo = layer * c->per_layer;
    hi = lo + c->per_layer < c->n_slots ? lo + c->per_layer : c->n_slots;
  }
  int32_t victim = -1;
  for (int32_t s = lo; c->n_filled < c->n_slots && s < hi && victim < 0; s++)
    if (c->slot_unit[s] < 0) victim = s;
  if (victim < 0 && lo < hi) {
    const uint8_t *prot = c->slot_protected;
    if (c->per_layer) { /* the policy sees the other layers' slots as protected */
      memset(c->mask, 1, (size_t)c->n_slots);
      memcpy(c->mask + lo, c->slot_protected + lo, (size_t)(hi - lo));
      prot = c->mask;
    }
    victim = c->policy->victim(c->policy_state, c->slot_unit, prot, c->n_slots);
    if (victim >= 0 && (victim < lo || victim >= hi)) victim = -1;
  }
  if (victim < 0 || c->slot_protected[victim]) return -1;
  const int32_t old = c->slot_unit[victim];
  *evicted_layer = old >= 0 ? old / c->n_experts : -1;
  *evicted_expert = old >= 0 ? old % c->n_experts : -1;
  if (old >= 0) c->slot_of[old] = -1;
  else c->n_filled++;
  const int32_t unit = layer * c->n_experts + expert;
  c->slot_unit[victim] = unit;
  c->slot_of[unit] = victim;
  return victim;
}

void ferry__cache_protect(struct ferry_expert_cache *c, int32_t slot, int on) { c->slot_protected[slot] = (uint8_t)on; }

void ferry__cache_unprotect_all(struct ferry_expert_cache *c) {
  memset(c->slot_protected, 0, c->n_slots > 0 ? (size_t)c->n_slots : 1);
}

int32_t ferry__cache_preload(struct ferry_expert_cache *c, int32_t *units, int32_t max) {
  return c->policy->preload ? c->policy->preload(c->policy_state, units, max) : 0;
}
