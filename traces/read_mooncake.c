/* Mooncake (FAST'25) JSON Lines: {"timestamp": ms, "input_length", "output_length",
 * "hash_ids": [...]}; the hash ids (512-token prefix blocks) are kept for prefix-cache and
 * KV-offload studies. */
#include <math.h>

#include "common/alloc.h"
#include "common/json.h"
#include "traces/trace_impl.h"

#define I32_MAX_D 2147483647.0
#define EXACT_INT_D 9007199254740992.0

/* Milliseconds to ns: integers exactly, fractions rounded to the nearest ns. */
static int ms_to_ns(const cJSON *it, int64_t *out) {
  if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < 0) return -1;
  double v = it->valuedouble;
  if (v == floor(v) && v <= EXACT_INT_D) {
    int64_t ms = (int64_t)v;
    if (ms > INT64_MAX / 1000000) return -1;
    *out = ms * 1000000;
    return 0;
  }
  double ns = nearbyint(v * 1e6);
  if (!(ns < 9.2e18)) return -1;
  *out = (int64_t)ns;
  return 0;
}

ferry_status ferry__read_mooncake(struct ferry__trace_reader *rd) {
  ferry_trace *t = rd->trace;
  int64_t *hash = NULL;
  size_t hash_cap = 0;
  ferry_status st = FERRY_OK;
  /* The first line is already in the buffer: process it before reading the next. */
  for (int first = 1;; first = 0) {
    if (!first) {
      st = ferry__lines_next(rd->lines, &t->err);
      if (st != FERRY_OK || rd->lines->eof) break;
    }
    int64_t id = rd->row++;
    cJSON *o = ferry__jl_object(rd, &st);
    if (!o) {
      if (st != FERRY_OK) break;
      continue;
    }
    int64_t ts = 0, in = 0, out = 0;
    int32_t nh = 0;
    const cJSON *jts = cJSON_GetObjectItemCaseSensitive(o, "timestamp");
    int r;
    if (!jts)
      st = ferry__trace_bad_row(rd, "missing \"timestamp\" (milliseconds)");
    else if (ms_to_ns(jts, &ts))
      st = ferry__trace_bad_row(rd, "\"timestamp\" is not a non-negative number of milliseconds");
    else if ((r = ferry__jl_int(o, "input_length", 0, I32_MAX_D, &in)) != 0)
      st = ferry__trace_bad_row(rd, r == 1 ? "missing \"input_length\"" : "\"input_length\" is not a non-negative integer");
    else if ((r = ferry__jl_int(o, "output_length", 0, I32_MAX_D, &out)) != 0)
      st = ferry__trace_bad_row(rd, r == 1 ? "missing \"output_length\"" : "\"output_length\" is not a non-negative integer");
    else if (ferry__jl_hash_ids(rd, o, &hash, &hash_cap, &nh, &st) == 0)
      st = ferry__trace_push(t, id, ts, (int32_t)in, (int32_t)out, hash, nh);
    cJSON_Delete(o);
    if (st != FERRY_OK) break;
  }
  ferry_free(hash);
  return st;
}
