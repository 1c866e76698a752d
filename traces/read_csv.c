/* The CSV request traces: one reader driven by a table per format (the columns for arrival,
 * prompt and output, how the arrival is written, and whether zero-output rows are failed
 * requests), so Azure 2023 and BurstGPT share every line of parsing and error reporting.
 *   Azure LLM inference 2023 (Splitwise): `TIMESTAMP,ContextTokens,GeneratedTokens`, wall-clock
 *     timestamps such as `2023-11-16 18:17:03.9799600` parsed exactly into integer nanoseconds.
 *   BurstGPT (Wang et al., 2024): `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log
 *     Type`, Timestamp in seconds from the start; rows with Response tokens 0 are failed requests,
 *     counted and skipped unless keep_failed is set. */
#include <inttypes.h>

#include "traces/trace_impl.h"

#define CSV_MAX_FIELDS 64

struct csv_format {
  const char *ts, *in, *out;   /* column names */
  const char *header_expected; /* for the "not a ... header" message */
  const char *ts_expected;     /* what a timestamp should look like */
  int wallclock;               /* timestamps are wall-clock times (else seconds) */
  int zero_output_failed;      /* rows with 0 output tokens are failed requests */
};

static const struct csv_format azure = {
    "TIMESTAMP", "ContextTokens", "GeneratedTokens",
    "an Azure trace header (expected columns TIMESTAMP,ContextTokens,GeneratedTokens)",
    "a time like 2023-11-16 18:17:03.9799600", 1, 0};

static const struct csv_format burstgpt = {
    "Timestamp", "Request tokens", "Response tokens",
    "a BurstGPT header (expected columns Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type)",
    "a non-negative number of seconds", 0, 1};

static ferry_status read_csv(struct ferry__trace_reader *rd, const struct csv_format *fmt) {
  struct ferry__lines *lr = rd->lines;
  ferry_trace *t = rd->trace;
  char *f[CSV_MAX_FIELDS];
  int n = ferry__csv_split(lr->buf, f, CSV_MAX_FIELDS);
  int c_ts = n > 0 ? ferry__csv_column(f, n, fmt->ts) : -1;
  int c_in = n > 0 ? ferry__csv_column(f, n, fmt->in) : -1;
  int c_out = n > 0 ? ferry__csv_column(f, n, fmt->out) : -1;
  if (c_ts < 0 || c_in < 0 || c_out < 0)
    return ferry__err_set(&t->err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": not %s", lr->path, lr->lineno,
                          fmt->header_expected);
  int need = c_ts > c_in ? c_ts : c_in;
  need = (need > c_out ? need : c_out) + 1;
  for (;;) {
    ferry_status st = ferry__lines_next(lr, &t->err);
    if (st != FERRY_OK) return st;
    if (lr->eof) return FERRY_OK;
    int64_t id = rd->row++;
    n = ferry__csv_split(lr->buf, f, CSV_MAX_FIELDS);
    if (n < need) {
      st = n < 0 ? ferry__trace_bad_row(rd, "unbalanced quote or more than %d fields", CSV_MAX_FIELDS)
                 : ferry__trace_bad_row(rd, "%d fields, expected at least %d", n, need);
      if (st != FERRY_OK) return st;
      continue;
    }
    int64_t ts;
    int32_t in, out;
    int r1 = 0, r2 = 0;
    if (fmt->wallclock ? ferry__parse_wallclock_ns(f[c_ts], &ts) : ferry__parse_decimal_ns(f[c_ts], 1000000000, &ts))
      st = ferry__trace_bad_row(rd, "%s '%.40s' is not %s", fmt->ts, f[c_ts], fmt->ts_expected);
    else if ((r1 = ferry__parse_tokens(f[c_in], &in)) != 0)
      st = ferry__trace_bad_row(rd, "%s '%.40s' %s", fmt->in, f[c_in], ferry__tokens_problem(r1));
    else if ((r2 = ferry__parse_tokens(f[c_out], &out)) != 0)
      st = ferry__trace_bad_row(rd, "%s '%.40s' %s", fmt->out, f[c_out], ferry__tokens_problem(r2));
    else if (fmt->zero_output_failed && out == 0 && !rd->opts->keep_failed)
      t->skipped_failed++;
    else
      st = ferry__trace_push(t, id, ts, in, out, NULL, 0);
    if (st != FERRY_OK) return st;
  }
}

ferry_status ferry__read_azure(struct ferry__trace_reader *rd) { return read_csv(rd, &azure); }

ferry_status ferry__read_burstgpt(struct ferry__trace_reader *rd) { return read_csv(rd, &burstgpt); }
