/* What a run stores about its routing and expert prefetching in the result database, for
 * `ferry report` (which reads databases only): the statistics of every routing trace the run
 * used or recorded, the prefetch counts behind a predictor's precision, and a paged KV cache's
 * preemptions. */
#ifndef FERRY_CLI_RUN_ROUTING_META_H
#define FERRY_CLI_RUN_ROUTING_META_H

#include "ferry/db.h"
#include "ferry/engine.h"
#include "ferry/routing.h"

/* Run metadata ROUTING_STATS_<ROLE> = the trace's statistics as JSON (ferry_routing_stats_json,
 * with "role" and "source"); role is "replayed", "predictor" or "recorded". A trace of NULL
 * does nothing; a failure is reported on stderr and does not fail the run. */
void run_routing_meta(ferry_db *db, int64_t run_id, const char *role, const char *source, const ferry_routing *r);

/* Run metadata EXPERT_PREFETCHES and EXPERT_PREFETCHES_USED (only when the run prefetched). */
void run_prefetch_meta(ferry_db *db, int64_t run_id, const struct ferry_serve_summary *sum);

/* Run metadata KV_POOL_BLOCKS, KV_PREEMPTIONS, KV_SWAPS and KV_SWAP_BYTES (device to host, as
 * many back), only for a paged KV cache. */
void run_kv_meta(ferry_db *db, int64_t run_id, const struct ferry_serve_summary *sum);

#endif
