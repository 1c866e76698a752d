/* BurstGPT (Wang et al., 2024) CSV: `Timestamp,Model,Request tokens,Response tokens,Total
 * tokens,Log Type`, Timestamp in seconds from the start of the trace. Rows with Response
 * tokens 0 are failed requests in BurstGPT: counted and skipped unless keep_failed is set. */
#include <inttypes.h>

#include "traces/trace_impl.h"

#define BURST_MAX_FIELDS 64

ferry_status ferry__read_burstgpt(struct ferry__trace_reader *rd) {
  struct ferry__lines *lr = rd->lines;
  ferry_trace *t = rd->trace;
  char *f[BURST_MAX_FIELDS];
  int n = ferry__csv_split(lr->buf, f, BURST_MAX_FIELDS);
  int c_ts = n > 0 ? ferry__csv_column(f, n, "Timestamp") : -1;
  int c_in = n > 0 ? ferry__csv_column(f, n, "Request tokens") : -1;
  int c_out = n > 0 ? ferry__csv_column(f, n, "Response tokens") : -1;
  if (c_ts < 0 || c_in < 0 || c_out < 0)
    return ferry__err_set(&t->err, FERRY_ERR_FORMAT,
                          "%s:%" PRId64 ": not a BurstGPT header (expected columns Timestamp,Model,Request "
                          "tokens,Response tokens,Total tokens,Log Type)",
                          lr->path, lr->lineno);
  int need = c_ts > c_in ? c_ts : c_in;
  need = (need > c_out ? need : c_out) + 1;
  for (;;) {
    ferry_status st = ferry__lines_next(lr, &t->err);
    if (st != FERRY_OK) return st;
    if (lr->eof) return FERRY_OK;
    int64_t id = rd->row++;
    n = ferry__csv_split(lr->buf, f, BURST_MAX_FIELDS);
    if (n < need) {
      st = n < 0 ? ferry__trace_bad_row(rd, "unbalanced quote or more than %d fields", BURST_MAX_FIELDS)
                 : ferry__trace_bad_row(rd, "%d fields, expected at least %d", n, need);
      if (st != FERRY_OK) return st;
      continue;
    }
    int64_t ts;
    int32_t in, out;
    int r1 = 0, r2 = 0;
    if (ferry__parse_decimal_ns(f[c_ts], 1000000000, &ts))
      st = ferry__trace_bad_row(rd, "Timestamp '%.40s' is not a non-negative number of seconds", f[c_ts]);
    else if ((r1 = ferry__parse_tokens(f[c_in], &in)) != 0)
      st = ferry__trace_bad_row(rd, "Request tokens '%.40s' %s", f[c_in], ferry__tokens_problem(r1));
    else if ((r2 = ferry__parse_tokens(f[c_out], &out)) != 0)
      st = ferry__trace_bad_row(rd, "Response tokens '%.40s' %s", f[c_out], ferry__tokens_problem(r2));
    else if (out == 0 && !rd->opts->keep_failed)
      t->skipped_failed++;
    else
      st = ferry__trace_push(t, id, ts, in, out, NULL, 0);
    if (st != FERRY_OK) return st;
  }
}
