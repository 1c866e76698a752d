/* The memory-pressure decision (see pressure.h): compare each tier's index with its marks and
 * the predicted indexes of the plans the engine could switch to. No I/O, no clock reads: the
 * time comes in the snapshot. */
#include <math.h>

#include "runtime/policy/pressure.h"

const char *ferry__pressure_level_name(int32_t level) {
  static const char *const names[FERRY_PRESSURE_LEVELS] = {"normal", "prefetch shrunk", "expert cache shrunk",
                                                           "on-demand loading", "refusing new requests"};
  return level >= 0 && level < FERRY_PRESSURE_LEVELS ? names[level] : "?";
}

/* The tier with the largest index relative to its high mark; -1 when none exceeds it. */
static int32_t worst_over(const double *index, const double *high, double *worst) {
  int32_t t_worst = -1;
  double best = 0;
  for (int32_t t = 0; t < FERRY_TIER_COUNT; t++) {
    if (!(index[t] > high[t])) continue;
    double over = index[t] - high[t];
    if (t_worst < 0 || over > best) {
      best = over;
      t_worst = t;
    }
  }
  if (t_worst >= 0) *worst = index[t_worst];
  return t_worst;
}

static int all_at_most(const double *v, const double *limit) {
  for (int32_t t = 0; t < FERRY_TIER_COUNT; t++)
    if (!(v[t] <= limit[t])) return 0;
  return 1;
}

static int all_below(const double *v, const double *limit) {
  for (int32_t t = 0; t < FERRY_TIER_COUNT; t++)
    if (!(v[t] < limit[t])) return 0;
  return 1;
}

void ferry__pressure_decide(const struct ferry_pressure_snapshot *s, struct ferry_pressure_decision *out) {
  out->action = FERRY_PRESSURE_STAY;
  out->level = s->level;
  out->tier = -1;
  out->index = 0;
  out->what = "stay";
  double worst = 0;
  int32_t tier = worst_over(s->index, s->high, &worst);
  int over_budget = 0;
  for (int32_t t = 0; t < FERRY_TIER_COUNT; t++) over_budget |= s->index[t] > 1.0;
  const int dwelling = s->last_change_ns != INT64_MIN && s->now_ns - s->last_change_ns < s->min_dwell_ns && !over_budget;
  if (tier >= 0 || s->budget_changed) {
    out->tier = tier;
    out->index = tier >= 0 ? worst : 0;
    if (all_at_most(s->same, s->high)) {
      out->action = FERRY_PRESSURE_REPLAN;
      out->what = "re-plan for the budgets";
      return;
    }
    if (dwelling || s->level >= FERRY_PRESSURE_LEVELS - 1) return;
    out->action = FERRY_PRESSURE_DEGRADE;
    out->level = s->level + 1;
    static const char *const up[FERRY_PRESSURE_LEVELS] = {"", "shrink prefetch depth", "shrink expert cache",
                                                          "fall back to on-demand loading", "refuse new requests"};
    out->what = up[out->level];
    return;
  }
  if (s->level > 0 && !dwelling && all_below(s->index, s->low) && all_at_most(s->down, s->high)) {
    out->action = FERRY_PRESSURE_RECOVER;
    out->level = s->level - 1;
    out->what = "recover";
    double top = 0;
    for (int32_t t = 0; t < FERRY_TIER_COUNT; t++)
      if (s->index[t] > top || out->tier < 0) {
        top = s->index[t];
        out->tier = t;
      }
    out->index = top;
  }
}
