/* ferry's own JSON Lines trace: {"arrival_ns", "prompt_tokens", "output_tokens"} per line,
 * optional "req_id" and "hash_ids"; what ferry_trace_write_jsonl() writes, so any trace
 * converts to it and back without loss. */
#include "common/alloc.h"
#include "common/json.h"
#include "traces/trace_impl.h"

#define I32_MAX_D 2147483647.0
#define EXACT_INT_D 9007199254740992.0

ferry_status ferry__read_jsonl(struct ferry__trace_reader *rd) {
  ferry_trace *t = rd->trace;
  int64_t *hash = NULL;
  size_t hash_cap = 0;
  ferry_status st = FERRY_OK;
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
    int r;
    if ((r = ferry__jl_int(o, "arrival_ns", 0, EXACT_INT_D, &ts)) != 0)
      st = ferry__trace_bad_row(rd, r == 1 ? "missing \"arrival_ns\""
                                           : "\"arrival_ns\" is not an integer in [0, 2^53]");
    else if ((r = ferry__jl_int(o, "prompt_tokens", 0, I32_MAX_D, &in)) != 0)
      st = ferry__trace_bad_row(rd, r == 1 ? "missing \"prompt_tokens\"" : "\"prompt_tokens\" is not a non-negative integer");
    else if ((r = ferry__jl_int(o, "output_tokens", 0, I32_MAX_D, &out)) != 0)
      st = ferry__trace_bad_row(rd, r == 1 ? "missing \"output_tokens\"" : "\"output_tokens\" is not a non-negative integer");
    else if ((r = ferry__jl_int(o, "req_id", -EXACT_INT_D, EXACT_INT_D, &id)) == 2)
      st = ferry__trace_bad_row(rd, "\"req_id\" is not an integer");
    else if (ferry__jl_hash_ids(rd, o, &hash, &hash_cap, &nh, &st) == 0)
      st = ferry__trace_push(t, id, ts, (int32_t)in, (int32_t)out, hash, nh);
    cJSON_Delete(o);
    if (st != FERRY_OK) break;
  }
  ferry_free(hash);
  return st;
}
