/**
 * @file cache_policy.h
 * @brief Expert-cache policies: which resident expert a full cache evicts. Each policy is a
 *        const op table in its own file listed in one registry (`auto`, `lru`, `lfu`, `static`;
 *        a test's or a plugin's added with ferry_cache_policy_register()); the engine
 *        (`--expert-cache NAME`, also inside `per-layer:K`), the simulator and
 *        `ferry predictor eval` take it by name.
 *
 * A cache has a fixed number of slots; a unit is one (layer, expert) pair, numbered
 * layer * n_experts + expert. The cache itself finds empty slots, keeps which unit each slot
 * holds and which slots are protected (in use by the running layer); the policy keeps whatever
 * history it wants and picks the victim among the unprotected slots. Policies are pure: no I/O,
 * no clock; ties must break the same way every time (the simulator is bit-reproducible).
 */
#ifndef FERRY_CACHE_POLICY_H
#define FERRY_CACHE_POLICY_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Version of struct ferry_cache_policy_ops this build reads. */
#define FERRY_CACHE_POLICY_VERSION 1

/** What a policy is created for. */
struct ferry_cache_geometry {
  int32_t n_slots;           /**< the cache's slots */
  int32_t n_layers;          /**< layers: units are layer * n_experts + expert */
  int32_t n_experts;         /**< experts per layer */
  const int64_t *popularity; /**< optional: how often each unit is routed (a routing trace's
                                  counts, n_layers x n_experts), borrowed during create(); NULL
                                  when unknown */
};

/** An eviction policy (static const, one per file; ferry_cache_policy_register() for others). */
struct ferry_cache_policy_ops {
  int version;             /**< FERRY_CACHE_POLICY_VERSION */
  const char *name;        /**< registry name: 1-15 of a-z, 0-9, '-' */
  const char *description; /**< one line for help texts */
  /** The policy's state for a cache of @p g (owned by the cache, released with free()). */
  ferry_status (*create)(void **state, const struct ferry_cache_geometry *g);
  /** Release the state. */
  void (*free)(void *state);
  /** A use of the unit held by a slot: a hit, or the first use after it was filled. */
  void (*touch)(void *state, int32_t slot, int32_t unit);
  /** The slot to evict: one whose slot_unit[] is >= 0 and is_protected[] is 0, or -1 when there
   *  is none. Called only when every slot is occupied. */
  int32_t (*victim)(void *state, const int32_t *slot_unit, const uint8_t *is_protected, int32_t n_slots);
  /** Optional (NULL): units to place before serving (pinned hot experts), best first; writes at
   *  most @p max into @p units and returns how many. */
  int32_t (*preload)(void *state, int32_t *units, int32_t max);
};

/** @brief Number of registered policies. */
FERRY_API size_t ferry_cache_policy_registry_count(void);
/** @brief The i-th registered policy, or NULL past the end (borrowed, static). */
FERRY_API const struct ferry_cache_policy_ops *ferry_cache_policy_registry_at(size_t i);
/** @brief The policy named @p name, or NULL. */
FERRY_API const struct ferry_cache_policy_ops *ferry_cache_policy_registry_find(const char *name);
/**
 * @brief Add a policy at start-up (not thread-safe).
 * @param ops borrowed; must stay valid for the life of the process.
 * @return FERRY_OK; FERRY_ERR_INVALID (version, missing functions, bad name); FERRY_ERR_EXISTS;
 *         FERRY_ERR_RANGE when 16 have been added.
 */
FERRY_API ferry_status ferry_cache_policy_register(const struct ferry_cache_policy_ops *ops);
/**
 * @brief The policy named @p name, or FERRY_ERR_NOT_FOUND naming the nearest (ferry_last_error()).
 * @param out receives the policy (borrowed, static).
 */
FERRY_API ferry_status ferry_cache_policy_lookup(const char *name, const struct ferry_cache_policy_ops **out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_CACHE_POLICY_H */
