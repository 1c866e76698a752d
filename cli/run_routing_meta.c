/* Routing statistics, prefetch and paged-KV preemption counts of a run, stored as run metadata for the report. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "cli/run_routing_meta.h"
#include "common/alloc.h"

void run_routing_meta(ferry_db *db, int64_t run_id, const char *role, const char *source, const ferry_routing *r) {
  if (!db || !r) return;
  struct ferry_routing_stats s;
  char *json = NULL;
  ferry_status st = ferry_routing_stats_compute(r, &s);
  if (st == FERRY_OK) {
    st = ferry_routing_stats_json(r, &s, source, &json);
    ferry_routing_stats_free(&s);
  }
  char name[64];
  snprintf(name, sizeof name, "ROUTING_STATS_%s", role);
  for (char *c = name; *c; c++) *c = (char)toupper((unsigned char)*c);
  if (st == FERRY_OK) {
    /* the role goes in the document too: "{"role":"replayed","source":...} */
    char *doc = ferry__asprintf("{\"role\":\"%s\",%s", role, json + 1);
    st = doc ? ferry_db_run_meta(db, run_id, name, doc) : FERRY_ERR_NOMEM;
    ferry_free(doc);
  }
  if (st != FERRY_OK) fprintf(stderr, "ferry: routing statistics of %s not stored: %s\n", source, ferry_last_error());
  ferry_free(json);
}

void run_prefetch_meta(ferry_db *db, int64_t run_id, const struct ferry_serve_summary *sum) {
  if (!db || !sum || !sum->prefetches) return;
  char num[32];
  snprintf(num, sizeof num, "%lld", (long long)sum->prefetches);
  ferry_db_run_meta(db, run_id, "EXPERT_PREFETCHES", num);
  snprintf(num, sizeof num, "%lld", (long long)sum->prefetches_used);
  ferry_db_run_meta(db, run_id, "EXPERT_PREFETCHES_USED", num);
}

void run_kv_meta(ferry_db *db, int64_t run_id, const struct ferry_serve_summary *sum) {
  if (!db || !sum || !sum->kv_pool_blocks) return;
  static const char *const names[] = {"KV_POOL_BLOCKS", "KV_PREEMPTIONS", "KV_SWAPS", "KV_SWAP_BYTES"};
  const long long v[] = {(long long)sum->kv_pool_blocks, (long long)sum->preemptions, (long long)sum->swaps,
                         (long long)sum->swap_bytes};
  char num[32];
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    snprintf(num, sizeof num, "%lld", v[i]);
    ferry_db_run_meta(db, run_id, names[i], num);
  }
}
