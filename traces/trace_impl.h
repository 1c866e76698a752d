/* Internals shared by the trace readers: the trace handle, a bounded line reader, and the
 * strict field parsers every reader uses so that all formats report errors the same way. */
#ifndef FERRY_TRACES_TRACE_IMPL_H
#define FERRY_TRACES_TRACE_IMPL_H

#include <stdio.h>

#include "common/error.h"
#include "ferry/trace.h"

struct ferry_trace {
  struct ferry_request *reqs;
  int64_t *hash_off; /* per request: first index in hash_pool (only when hash_pool is used) */
  size_t n, cap;
  int64_t *hash_pool;
  size_t hash_n, hash_cap;
  size_t skipped_bad, skipped_failed, out_of_order;
  enum ferry_trace_format format;
  struct ferry_err err;
};

/* Reads a file line by line with a bound on line length; tracks the 1-based line number. */
struct ferry__lines {
  FILE *f;
  const char *path;
  char *buf;      /* holds the current line, NUL-terminated, line end stripped */
  size_t cap;
  size_t len;
  char *raw;      /* read-ahead block and the unread part [rpos, rend) */
  size_t rpos, rend;
  int64_t lineno; /* of the current line */
  int eof;
};

/* Reader state passed to each format's parser. */
struct ferry__trace_reader {
  struct ferry__lines *lines;
  ferry_trace *trace;
  const struct ferry_trace_options *opts;
  int64_t row; /* data rows seen so far (kept or skipped): the next request id */
};

ferry_status ferry__lines_open(struct ferry__lines *lr, const char *path, struct ferry_err *err);
void ferry__lines_close(struct ferry__lines *lr);
/* Next non-blank line into lr->buf. Returns FERRY_OK with lr->eof set at the end; errors
 * (I/O, line too long, NUL byte) are set in err. */
ferry_status ferry__lines_next(struct ferry__lines *lr, struct ferry_err *err);

/* Append a request (hash ids copied if n_hash > 0). */
ferry_status ferry__trace_push(ferry_trace *t, int64_t id, int64_t arrival_ns, int32_t prompt,
                               int32_t output, const int64_t *hash_ids, int32_t n_hash);

/* A malformed row: with skip_bad counts it and returns FERRY_OK; otherwise records
 * "path:line: <message>" as FERRY_ERR_FORMAT. */
ferry_status ferry__trace_bad_row(struct ferry__trace_reader *rd, const char *fmt, ...)
    FERRY_PRINTF(2, 3);

/* Strict parses of a whole field; return 0 on success. */
/* Integer in [0, INT32_MAX]: 0 ok, -1 not a non-negative integer, -2 too large. */
int ferry__parse_tokens(const char *s, int32_t *out);
/* Message end for a parse_tokens failure ("is larger than 2147483647"). */
const char *ferry__tokens_problem(int rc);
int ferry__parse_decimal_ns(const char *s, int64_t scale_ns, int64_t *out); /* "12.345" units */
int ferry__parse_wallclock_ns(const char *s, int64_t *out);      /* "2023-11-16 18:17:03.9799600" */
int64_t ferry__days_from_civil(int64_t y, unsigned m, unsigned d);

/* Split a CSV line in place (double quotes honoured, no multi-line fields). Returns the
 * number of fields (at most max) or -1 if there are more than max or a quote is unbalanced. */
int ferry__csv_split(char *line, char **fields, int max);
/* Index of the column named `name` (case-insensitive, surrounding blanks ignored) or -1. */
int ferry__csv_column(char **fields, int n, const char *name);

/* JSON Lines helpers. Parse lr->buf as one JSON object (NULL: bad row already reported
 * through ferry__trace_bad_row, check *st). */
struct cJSON;
struct cJSON *ferry__jl_object(struct ferry__trace_reader *rd, ferry_status *st);
/* Integer member in [min, max]: 0 ok, 1 missing, 2 not an integer in range. */
int ferry__jl_int(const struct cJSON *o, const char *key, double min, double max, int64_t *out);
/* Optional "hash_ids" array of integers >= 0 into a growing scratch buffer: 0 ok (n = 0 when
 * absent), -1 malformed (reported as a bad row; check *st), -2 out of memory (*st set). */
int ferry__jl_hash_ids(struct ferry__trace_reader *rd, const struct cJSON *o, int64_t **buf, size_t *cap,
                       int32_t *n, ferry_status *st);

/* Format readers: called with lines positioned on the first non-blank line (the header for
 * CSV, the first object for JSONL). */
ferry_status ferry__read_azure(struct ferry__trace_reader *rd);
ferry_status ferry__read_burstgpt(struct ferry__trace_reader *rd);
ferry_status ferry__read_mooncake(struct ferry__trace_reader *rd);
ferry_status ferry__read_jsonl(struct ferry__trace_reader *rd);

/* Validate trace options (format, window, rate scale); FERRY_ERR_INVALID naming the field. */
ferry_status ferry__trace_check_options(const struct ferry_trace_options *o, struct ferry_err *err);

/* Sort by arrival (stable), make times relative and apply the options' slicing. */
ferry_status ferry__trace_finish(ferry_trace *t, const struct ferry_trace_options *opts, const char *what);

ferry_trace *ferry__trace_new(enum ferry_trace_format format);

#endif
