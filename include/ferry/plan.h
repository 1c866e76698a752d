/**
 * @file plan.h
 * @brief Capacity planning decisions: whether a served workload's queue is stable (saturation),
 *        the search for the highest request rate that meets a latency SLO, costs per hour and
 *        per token, and the cheapest pick. `ferry plan` drives simulations with these; they are
 *        pure functions of the numbers they are given (no I/O, no clock), so they are tested
 *        without simulating anything.
 *
 * The rate search is Vidur-Search style: the SLO metrics are taken to grow with the request
 * rate, so the feasible rates form an interval [0, capacity]; a bracket is found by stepping
 * from a starting rate (by 1.25 the first time, then doubling or halving), then bisected
 * geometrically until the largest feasible and the smallest infeasible rate are within a
 * relative tolerance.
 */
#ifndef FERRY_PLAN_H
#define FERRY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Whether a served workload kept up with its arrivals. */
struct ferry_plan_load {
  double offered_rps;       /**< arrivals per second over the arrival window (first to last arrival) */
  double served_rps;        /**< completions per second within the arrival window */
  double queue_growth_rps;  /**< least-squares slope, against time, of the requests waiting (arrived,
                                 no first token yet) over the second half of the arrival window, in
                                 requests per second */
  int64_t queue_mid;        /**< requests waiting at the middle of the arrival window */
  int64_t queue_end;        /**< requests waiting at the last arrival */
  int saturated;            /**< 1: the queue grows without bound at this rate (see
                                 ferry_plan_load_analyze()) */
};

/**
 * @brief Decide whether arrivals outpaced service. A queue that grows without bound shows as
 *        a waiting line (requests arrived but not yet given their first token) that keeps
 *        growing through the second half of the arrival window: saturated when its slope is
 *        more than a tenth of that half's arrival rate and it grew by at least max(4, a tenth of
 *        that half's arrivals). A stable system's line fluctuates around a level however long
 *        its requests run, so a slow but stable server is not mistaken for a saturated one.
 * @param arrival_ns arrival times of the n requests (any order).
 * @param first_token_ns their first tokens' times; negative: never.
 * @param finish_ns their finish times; negative: never finished.
 * @param n number of requests; fewer than 4 cannot be judged (never saturated).
 * @param out receives the analysis.
 * @return FERRY_OK; FERRY_ERR_INVALID for NULL arguments; FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_plan_load_analyze(const int64_t *arrival_ns, const int64_t *first_token_ns, const int64_t *finish_ns,
                                               size_t n, struct ferry_plan_load *out);

/** The floor check (ferry_plan_search_next()) ends a search when the floor misses the SLO by at
 *  least this ratio: a near miss there can be noise (the P99 of a short slice is one of its
 *  slowest requests), a failed or unfinished run says nothing, and both let the search go on as
 *  without the check. */
#define FERRY_PLAN_FLOOR_MISS 1.25

/** State of one rate search; fields read-only for callers (ferry_plan_search_init()), except floor_check. */
struct ferry_plan_search {
  double start_rps;     /**< the first rate probed */
  double min_rps;       /**< below this no rate meets the SLO (the search stops) */
  double max_rps;       /**< above this the search stops (capacity at least max_rps) */
  double tolerance;     /**< relative width at which the bracket is narrow enough */
  double best_rps;      /**< largest rate found feasible; 0 = none yet */
  double fail_rps;      /**< smallest rate found infeasible; 0 = none yet */
  double saturated_rps; /**< smallest rate found saturated (queue without bound); 0 = none */
  int probes;           /**< rates probed so far */
  double last_excess;   /**< how far the last failed probe missed the SLO (see
                             ferry_plan_search_report()); 0 = not known */
  int unreachable;      /**< 1: lowering the rate stopped bringing the SLO metrics down while they
                             still miss it, or the floor missed it clearly: no rate meets the SLO
                             (the search is over) */
  int floor_check;      /**< set by the caller after ferry_plan_search_init() (default 0): 1 to
                             probe min_rps first, 2 to probe it after a first probe that missed
                             the SLO, not saturated (see ferry_plan_search_next()) */
  int floor_probed;     /**< 1: the floor check was made */
  int floor_ok;         /**< 1: the floor check met the SLO */
};

/**
 * @brief Start a search.
 * @param s the state (overwritten).
 * @param start_rps first rate to probe (> 0), e.g. a fraction of the throughput with every
 *        request queued at once.
 * @param min_rps smallest rate worth probing (> 0, <= start_rps).
 * @param max_rps largest rate worth probing (>= start_rps).
 * @param tolerance relative bracket width to stop at, e.g. 0.05.
 */
FERRY_API void ferry_plan_search_init(struct ferry_plan_search *s, double start_rps, double min_rps, double max_rps,
                                      double tolerance);

/**
 * @brief The next rate to probe.
 * @param s the state.
 * @param rps receives the rate.
 * With floor_check set, a search probes min_rps first (1), or right after a first probe that
 * missed the SLO while its queue stayed stable (2): as the metrics are taken to grow with the rate, a clear miss there (by
 * FERRY_PLAN_FLOOR_MISS or more) means no rate meets the SLO, and the search ends at once
 * instead of stepping down to where the miss stops depending on the load (the costliest probes:
 * at low rates every request is served alone, in the most steps). Any other outcome of the
 * floor changes nothing else: the search then probes exactly the rates it would have without
 * the check, so its answer is the same. First is worth it where a miss is likely.
 * @return 1 when a rate is to be probed; 0 when the search is over (best_rps is the answer:
 *         0 when no rate at or above min_rps meets the SLO; max_rps when even that did).
 */
FERRY_API int ferry_plan_search_next(const struct ferry_plan_search *s, double *rps);

/**
 * @brief Record a probe's outcome.
 * @param s the state.
 * @param rps the rate probed (as returned by ferry_plan_search_next(); the floor check is the
 *        probe at min_rps that floor_check asks for).
 * @param feasible 1 when the SLO was met and the queue stayed stable.
 * @param saturated 1 when the queue grew without bound (then feasible must be 0).
 * @param excess for a stable probe that missed the SLO, the largest ratio of an SLO metric to
 *        its limit (> 1), else 0. When two probes in a row below every feasible rate miss by
 *        the same (within 2 %) after the rate was halved, the metric no longer depends on the
 *        load (the slowest request alone misses the limit) and the search ends: no rate meets
 *        the SLO.
 */
FERRY_API void ferry_plan_search_report(struct ferry_plan_search *s, double rps, int feasible, int saturated, double excess);

/**
 * @brief Whether the next rate ferry_plan_search_next() gives is the floor check (floor_check):
 *        the probe whose clear miss ends the search, which a caller may answer from part of the
 *        requests (ferry_plan_percentile_floor()).
 * @param s the state.
 * @return 1 when it is, else 0.
 */
FERRY_API int ferry_plan_search_floor_next(const struct ferry_plan_search *s);

/**
 * @brief A lower bound of a percentile of n_total non-negative values of which only some are
 *        known. ferry's percentiles (ferry_serve_summary) interpolate linearly between the
 *        sorted values at ranks lo = floor(p / 100 x (n_total - 1)) and lo + 1, so they are at
 *        least the value at rank lo, which is at least the (n_total - lo)-th largest known value:
 *        the n_total - lo largest values of the whole are all at least that one.
 * @param known the known values (any order; not modified).
 * @param n_known how many are known (<= n_total).
 * @param n_total how many values the whole has.
 * @param percentile 0 to 100.
 * @return the bound; 0 when fewer than n_total - lo values are known (nothing is proven).
 */
FERRY_API double ferry_plan_percentile_floor(const double *known, size_t n_known, size_t n_total, double percentile);

/**
 * @brief A lower bound of the mean of n_total non-negative values of which some are known: their
 *        sum over n_total, less a relative 1e-12 so that no order of summation (the whole's mean
 *        adds the values in another order, each addition rounded) can end below it.
 * @param known the known values.
 * @param n_known how many are known (<= n_total).
 * @param n_total how many values the whole has (0: returns 0).
 * @return the bound.
 */
FERRY_API double ferry_plan_mean_floor(const double *known, size_t n_known, size_t n_total);

/** Costs of serving at a rate. */
struct ferry_plan_cost {
  double usd_per_hour;           /**< price per hour of the machines */
  double tokens_per_s;           /**< output tokens per second served */
  double usd_per_mtok;           /**< USD per million output tokens at this rate (0 without a price) */
  double tokens_per_s_per_usd;   /**< output tokens per second per dollar-hour (0 without a price) */
};

/**
 * @brief Costs of serving `rps` requests per second on `machines` machines.
 * @param price_per_hour one machine's price per hour (0 = unknown).
 * @param machines machines rented (>= 1).
 * @param rps requests per second served.
 * @param mean_output_tokens output tokens per request on average.
 * @param out receives the costs.
 */
FERRY_API void ferry_plan_cost(double price_per_hour, int machines, double rps, double mean_output_tokens,
                               struct ferry_plan_cost *out);

/** One candidate of the cheapest pick. */
struct ferry_plan_choice {
  double usd_per_hour; /**< what it costs per hour (0 = no price: never picked) */
  double usd_per_mtok; /**< per million output tokens, the tie-breaker */
  double max_rps;      /**< the highest request rate it serves within the SLO (its headroom), the
                            next tie-breaker: variants of one priced machine cost the same */
  int eligible;        /**< 1 when it serves the demand within the SLO and the budget */
};

/**
 * @brief The cheapest eligible choice: the lowest price per hour, then the lowest price per
 *        million tokens, then the highest max_rps, then the first given.
 * @param c choices.
 * @param n how many.
 * @return its index, or -1 when none is eligible and priced.
 */
FERRY_API int ferry_plan_cheapest(const struct ferry_plan_choice *c, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_PLAN_H */
