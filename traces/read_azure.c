/* Azure LLM inference trace 2023 (Splitwise): CSV `TIMESTAMP,ContextTokens,GeneratedTokens`
 * with wall-clock timestamps such as `2023-11-16 18:17:03.9799600`, parsed exactly into
 * integer nanoseconds (no floating point), so first/last arrivals match the file digit for digit. */
#include <inttypes.h>

#include "traces/trace_impl.h"

#define AZURE_MAX_FIELDS 64

ferry_status ferry__read_azure(struct ferry__trace_reader *rd) {
  struct ferry__lines *lr = rd->lines;
  ferry_trace *t = rd->trace;
  char *f[AZURE_MAX_FIELDS];
  int n = ferry__csv_split(lr->buf, f, AZURE_MAX_FIELDS);
  int c_ts = n > 0 ? ferry__csv_column(f, n, "TIMESTAMP") : -1;
  int c_in = n > 0 ? ferry__csv_column(f, n, "ContextTokens") : -1;
  int c_out = n > 0 ? ferry__csv_column(f, n, "GeneratedTokens") : -1;
  if (c_ts < 0 || c_in < 0 || c_out < 0)
    return ferry__err_set(&t->err, FERRY_ERR_FORMAT,
                          "%s:%" PRId64 ": not an Azure trace header (expected columns "
                          "TIMESTAMP,ContextTokens,GeneratedTokens)",
                          lr->path, lr->lineno);
  int need = c_ts > c_in ? c_ts : c_in;
  need = (need > c_out ? need : c_out) + 1;
  for (;;) {
    ferry_status st = ferry__lines_next(lr, &t->err);
    if (st != FERRY_OK) return st;
    if (lr->eof) return FERRY_OK;
    int64_t id = rd->row++;
    n = ferry__csv_split(lr->buf, f, AZURE_MAX_FIELDS);
    if (n < need) {
      st = n < 0 ? ferry__trace_bad_row(rd, "unbalanced quote or more than %d fields", AZURE_MAX_FIELDS)
                 : ferry__trace_bad_row(rd, "%d fields, expected at least %d", n, need);
      if (st != FERRY_OK) return st;
      continue;
    }
    int64_t ts;
    int32_t in, out;
    int r1 = 0, r2 = 0;
    if (ferry__parse_wallclock_ns(f[c_ts], &ts))
      st = ferry__trace_bad_row(rd, "TIMESTAMP '%.40s' is not a time like 2023-11-16 18:17:03.9799600", f[c_ts]);
    else if ((r1 = ferry__parse_tokens(f[c_in], &in)) != 0)
      st = ferry__trace_bad_row(rd, "ContextTokens '%.40s' %s", f[c_in], ferry__tokens_problem(r1));
    else if ((r2 = ferry__parse_tokens(f[c_out], &out)) != 0)
      st = ferry__trace_bad_row(rd, "GeneratedTokens '%.40s' %s", f[c_out], ferry__tokens_problem(r2));
    else
      st = ferry__trace_push(t, id, ts, in, out, NULL, 0);
    if (st != FERRY_OK) return st;
  }
}
