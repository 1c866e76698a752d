/* The memory-pressure controller's decision: pure, like the rest of runtime/policy. The engine
 * measures (tier usage against budgets, the OS's available memory and PSI) and predicts what
 * each candidate plan would use; this function only compares figures and returns what to do. */
#ifndef FERRY_POLICY_PRESSURE_H
#define FERRY_POLICY_PRESSURE_H

#include <stdint.h>

#include "ferry/activity.h"

/* Degradation levels, in the order the engine takes them. */
enum ferry_pressure_level {
  FERRY_PRESSURE_NORMAL = 0,    /* the configuration as asked */
  FERRY_PRESSURE_PREFETCH = 1,  /* prefetch depth halved: fewer block slots and staging buffers */
  FERRY_PRESSURE_CACHE = 2,     /* the expert cache halved as well */
  FERRY_PRESSURE_ON_DEMAND = 3, /* nothing kept in host memory, nothing prefetched: units read on demand */
  FERRY_PRESSURE_REFUSE = 4,    /* as 3, and new requests are refused */
  FERRY_PRESSURE_LEVELS = 5
};

enum ferry_pressure_action {
  FERRY_PRESSURE_STAY,    /* nothing to do */
  FERRY_PRESSURE_REPLAN,  /* same level, a new plan for the budgets in force */
  FERRY_PRESSURE_DEGRADE, /* one level up */
  FERRY_PRESSURE_RECOVER  /* one level down */
};

/* What the engine measured and predicted. Indexes are used / budget (host: at least the OS's
 * figure when it is watched); a predicted index of a plan that cannot be made is INFINITY. */
struct ferry_pressure_snapshot {
  int64_t now_ns, last_change_ns; /* last_change_ns: the last transition (INT64_MIN: none) */
  int32_t level;
  int budget_changed;             /* a budget changed since the last decision */
  double index[FERRY_TIER_COUNT];
  double high[FERRY_TIER_COUNT], low[FERRY_TIER_COUNT]; /* per tier: degrade above high, recover below low */
  double same[FERRY_TIER_COUNT];  /* predicted after re-planning at this level */
  double down[FERRY_TIER_COUNT];  /* predicted one level down (unused at level 0) */
  int64_t min_dwell_ns;           /* least time between transitions, unless a tier is over its budget */
};

struct ferry_pressure_decision {
  enum ferry_pressure_action action;
  int32_t level;       /* the level after it */
  int32_t tier;        /* the tier that decided (enum ferry_tier), -1 when none */
  double index;        /* its index */
  const char *what;    /* the action in words ("shrink prefetch depth", "recover", ...) */
};

/* The decision, from the snapshot alone:
 * - a tier over its high-water mark (or a budget change): re-plan at this level when the plan
 *   for the budgets in force is predicted at or under every high mark, else degrade one level;
 * - every tier under its low-water mark and the level below predicted at or under every high
 *   mark: recover one level (hysteresis: the band between the marks changes nothing);
 * - transitions closer than min_dwell_ns are deferred unless a tier is over its budget. */
void ferry__pressure_decide(const struct ferry_pressure_snapshot *s, struct ferry_pressure_decision *out);

/* Words for a level ("normal", "prefetch shrunk", ...). */
const char *ferry__pressure_level_name(int32_t level);

#endif
