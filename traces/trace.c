/* The trace handle and what every format shares: a bounded line reader, strict field parsers,
 * format detection from the first line, sorting and slicing (window, rate scale, first N),
 * statistics and the ferry JSONL writer. The per-format row parsers live in read_*.c. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/alloc.h"
#include "common/strbuf.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "traces/trace_impl.h"

#define RAW_BLOCK_BYTES (256u * 1024u)

/* ---- handle ----------------------------------------------------------------------------- */

ferry_trace *ferry__trace_new(enum ferry_trace_format format) {
  ferry_trace *t = ferry__calloc(1, sizeof *t);
  if (t) t->format = format;
  return t;
}

void ferry_trace_free(ferry_trace *t) {
  if (!t) return;
  ferry_free(t->reqs);
  ferry_free(t->hash_off);
  ferry_free(t->hash_pool);
  ferry_free(t);
}

size_t ferry_trace_count(const ferry_trace *t) { return t ? t->n : 0; }

const struct ferry_request *ferry_trace_request(const ferry_trace *t, size_t i) {
  return t && i < t->n ? &t->reqs[i] : NULL;
}

const int64_t *ferry_trace_hash_ids(const ferry_trace *t, size_t i, int32_t *n) {
  if (n) *n = 0;
  if (!t || i >= t->n || !t->hash_pool || t->reqs[i].n_hash_ids == 0) return NULL;
  if (n) *n = t->reqs[i].n_hash_ids;
  return t->hash_pool + t->hash_off[i];
}

size_t ferry_trace_skipped(const ferry_trace *t) { return t ? t->skipped_bad : 0; }

enum ferry_trace_format ferry_trace_get_format(const ferry_trace *t) {
  return t ? t->format : FERRY_TRACE_AUTO;
}

const char *ferry_trace_errmsg(const ferry_trace *t) { return t ? t->err.msg : ""; }

static const char *const format_names[] = {"auto", "azure", "burstgpt", "mooncake", "jsonl", "synthetic"};

const char *ferry_trace_format_name(enum ferry_trace_format f) {
  if ((unsigned)f < sizeof format_names / sizeof format_names[0]) return format_names[f];
  return "unknown";
}

ferry_status ferry_trace_format_parse(const char *name, enum ferry_trace_format *out) {
  for (int i = FERRY_TRACE_AUTO; i <= FERRY_TRACE_JSONL; i++) {
    if (name && !strcasecmp(name, format_names[i])) {
      *out = (enum ferry_trace_format)i;
      return FERRY_OK;
    }
  }
  return ferry__fail(FERRY_ERR_INVALID, "unknown trace format '%s' (expected auto, azure, burstgpt, mooncake or jsonl)",
                     name ? name : "");
}

ferry_status ferry__trace_push(ferry_trace *t, int64_t id, int64_t arrival_ns, int32_t prompt,
                               int32_t output, const int64_t *hash_ids, int32_t n_hash) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    struct ferry_request *r = ferry__reallocarray(t->reqs, cap, sizeof *r);
    if (!r) return ferry__err_set(&t->err, FERRY_ERR_NOMEM, "out of memory for %zu requests", cap);
    t->reqs = r;
    int64_t *h = ferry__reallocarray(t->hash_off, cap, sizeof *h);
    if (!h) return ferry__err_set(&t->err, FERRY_ERR_NOMEM, "out of memory for %zu requests", cap);
    t->hash_off = h;
    t->cap = cap;
  }
  if (n_hash > 0) {
    if (t->hash_n + (size_t)n_hash > t->hash_cap) {
      size_t cap = t->hash_cap ? t->hash_cap : 4096;
      while (cap < t->hash_n + (size_t)n_hash) cap *= 2;
      int64_t *p = ferry__reallocarray(t->hash_pool, cap, sizeof *p);
      if (!p) return ferry__err_set(&t->err, FERRY_ERR_NOMEM, "out of memory for %zu hash ids", cap);
      t->hash_pool = p;
      t->hash_cap = cap;
    }
    memcpy(t->hash_pool + t->hash_n, hash_ids, (size_t)n_hash * sizeof *hash_ids);
  }
  t->hash_off[t->n] = (int64_t)t->hash_n;
  t->hash_n += n_hash > 0 ? (size_t)n_hash : 0;
  t->reqs[t->n++] = (struct ferry_request){
      .id = id, .arrival_ns = arrival_ns, .prompt_tokens = prompt, .output_tokens = output,
      .n_hash_ids = n_hash > 0 ? n_hash : 0};
  return FERRY_OK;
}

ferry_status ferry__trace_bad_row(struct ferry__trace_reader *rd, const char *fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  ferry_trace *t = rd->trace;
  if (rd->opts->skip_bad) {
    /* Keep the first skipped row's reason: it is usually the one worth looking at. */
    if (t->skipped_bad++ == 0)
      snprintf(t->err.msg, sizeof t->err.msg, "%s:%" PRId64 ": %s (skipped)", rd->lines->path,
               rd->lines->lineno, what);
    return FERRY_OK;
  }
  return ferry__err_set(&t->err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": %s", rd->lines->path,
                        rd->lines->lineno, what);
}

/* ---- line reader ------------------------------------------------------------------------ */

ferry_status ferry__lines_open(struct ferry__lines *lr, const char *path, struct ferry_err *err) {
  memset(lr, 0, sizeof *lr);
  lr->path = path;
  lr->f = fopen(path, "rb");
  if (!lr->f)
    return ferry__err_set(err, errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: cannot open: %s",
                          path, strerror(errno));
  lr->raw = ferry_malloc(RAW_BLOCK_BYTES);
  lr->cap = 4096;
  lr->buf = ferry_malloc(lr->cap);
  if (!lr->raw || !lr->buf) {
    ferry__lines_close(lr);
    return ferry__err_set(err, FERRY_ERR_NOMEM, "%s: out of memory for the line buffer", path);
  }
  return FERRY_OK;
}

void ferry__lines_close(struct ferry__lines *lr) {
  if (lr->f) fclose(lr->f);
  ferry_free(lr->raw);
  ferry_free(lr->buf);
  lr->f = NULL;
  lr->raw = lr->buf = NULL;
}

static ferry_status line_append(struct ferry__lines *lr, const char *p, size_t n, struct ferry_err *err) {
  /* Refuse before growing: a file without line ends must not be read into memory whole. */
  if (lr->len + n > FERRY_TRACE_MAX_LINE_BYTES + 1)
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": line longer than %u bytes", lr->path,
                          lr->lineno, FERRY_TRACE_MAX_LINE_BYTES);
  if (lr->len + n + 1 > lr->cap) {
    size_t cap = lr->cap;
    while (cap < lr->len + n + 1) cap *= 2;
    char *b = ferry__realloc(lr->buf, cap);
    if (!b) return ferry__err_set(err, FERRY_ERR_NOMEM, "%s: out of memory for a line", lr->path);
    lr->buf = b;
    lr->cap = cap;
  }
  memcpy(lr->buf + lr->len, p, n);
  lr->len += n;
  return FERRY_OK;
}

/* One physical line (without '\n') into buf; sets eof when there is none. */
static ferry_status read_line(struct ferry__lines *lr, struct ferry_err *err) {
  lr->len = 0;
  int got_any = 0;
  for (;;) {
    if (lr->rpos == lr->rend) {
      size_t n = fread(lr->raw, 1, RAW_BLOCK_BYTES, lr->f);
      if (n == 0) {
        if (ferror(lr->f))
          return ferry__err_set(err, FERRY_ERR_IO, "%s:%" PRId64 ": read error", lr->path, lr->lineno + 1);
        if (!got_any) {
          lr->eof = 1;
          return FERRY_OK;
        }
        break; /* last line without a line end */
      }
      lr->rpos = 0;
      lr->rend = n;
    }
    if (!got_any) lr->lineno++;
    got_any = 1;
    const char *start = lr->raw + lr->rpos;
    const char *nl = memchr(start, '\n', lr->rend - lr->rpos);
    size_t n = nl ? (size_t)(nl - start) : lr->rend - lr->rpos;
    ferry_status st = line_append(lr, start, n, err);
    if (st != FERRY_OK) return st;
    lr->rpos += n + (nl ? 1 : 0);
    if (nl) break;
  }
  if (lr->len > 0 && lr->buf[lr->len - 1] == '\r') lr->len--;
  if (lr->len > FERRY_TRACE_MAX_LINE_BYTES)
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": line longer than %u bytes", lr->path,
                          lr->lineno, FERRY_TRACE_MAX_LINE_BYTES);
  lr->buf[lr->len] = '\0';
  const char *nul = memchr(lr->buf, '\0', lr->len);
  if (nul)
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": NUL byte at column %zu (not a text file?)",
                          lr->path, lr->lineno, (size_t)(nul - lr->buf) + 1);
  if (lr->lineno == 1 && lr->len >= 3 && !memcmp(lr->buf, "\xEF\xBB\xBF", 3)) {
    memmove(lr->buf, lr->buf + 3, lr->len - 2);
    lr->len -= 3;
  }
  return FERRY_OK;
}

ferry_status ferry__lines_next(struct ferry__lines *lr, struct ferry_err *err) {
  for (;;) {
    ferry_status st = read_line(lr, err);
    if (st != FERRY_OK || lr->eof) return st;
    for (size_t i = 0; i < lr->len; i++)
      if (!isspace((unsigned char)lr->buf[i])) return FERRY_OK;
  }
}

/* ---- field parsers ---------------------------------------------------------------------- */

int ferry__parse_tokens(const char *s, int32_t *out) {
  if (!*s) return -1;
  int64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    if (v <= INT32_MAX) v = v * 10 + (*p - '0');
  }
  if (v > INT32_MAX) return -2;
  *out = (int32_t)v;
  return 0;
}

const char *ferry__tokens_problem(int rc) {
  return rc == -2 ? "is larger than 2147483647" : "is not a non-negative integer";
}

/* Non-negative decimal "123" or "123.456" in units of scale_ns nanoseconds, exact up to the
 * unit's resolution; further digits round half up. */
int ferry__parse_decimal_ns(const char *s, int64_t scale_ns, int64_t *out) {
  const char *p = s;
  if (!isdigit((unsigned char)*p)) return -1;
  int64_t ip = 0;
  for (; isdigit((unsigned char)*p); p++) {
    if (ip > (INT64_MAX - 9) / 10) return -1;
    ip = ip * 10 + (*p - '0');
  }
  if (ip > INT64_MAX / scale_ns - 1) return -1;
  int64_t ns = ip * scale_ns, place = scale_ns;
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p)) return -1;
    int round_up = 0, first_extra = 1;
    for (; isdigit((unsigned char)*p); p++) {
      if (place >= 10) {
        place /= 10;
        ns += (*p - '0') * place;
      } else if (first_extra) {
        round_up = *p >= '5';
        first_extra = 0;
      }
    }
    ns += round_up;
  }
  if (*p) return -1;
  *out = ns;
  return 0;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant, "chrono-compatible
 * low-level date algorithms"). */
int64_t ferry__days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = (unsigned)(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + (int64_t)doe - 719468;
}

static int digits(const char **p, int n, int *out) {
  int v = 0;
  for (int i = 0; i < n; i++) {
    if (!isdigit((unsigned char)(*p)[i])) return -1;
    v = v * 10 + ((*p)[i] - '0');
  }
  *p += n;
  *out = v;
  return 0;
}

int ferry__parse_wallclock_ns(const char *s, int64_t *out) {
  const char *p = s;
  int y, mo, d, h, mi, se;
  if (digits(&p, 4, &y) || *p++ != '-' || digits(&p, 2, &mo) || *p++ != '-' || digits(&p, 2, &d)) return -1;
  if (*p != ' ' && *p != 'T') return -1;
  p++;
  if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &mi) || *p++ != ':' || digits(&p, 2, &se)) return -1;
  static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (y < 1970 || mo < 1 || mo > 12 || h > 23 || mi > 59 || se > 59) return -1;
  int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (d < 1 || d > mdays[mo - 1] + (mo == 2 && leap)) return -1;
  int64_t frac = 0;
  if (*p == '.') {
    p++;
    int64_t place = 1000000000;
    int nd = 0;
    for (; isdigit((unsigned char)*p); p++, nd++) {
      if (nd == 9) return -1; /* finer than 1 ns */
      place /= 10;
      frac += (*p - '0') * place;
    }
    if (nd == 0) return -1;
  }
  if (*p) return -1;
  int64_t days = ferry__days_from_civil(y, (unsigned)mo, (unsigned)d);
  if (days > 106000) return -1; /* past 2262: ns since 1970 would overflow */
  *out = ((days * 24 + h) * 60 + mi) * 60 * 1000000000LL + (int64_t)se * 1000000000LL + frac;
  return 0;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
  return s;
}

int ferry__csv_split(char *line, char **fields, int max) {
  int n = 0;
  char *p = line;
  for (;;) {
    if (n == max) return -1;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '"') {
      /* Quoted: "" is a quote; unquote in place. */
      char *w = ++p, *start = p;
      for (;;) {
        if (!*p) return -1;
        if (*p == '"') {
          if (p[1] == '"') {
            *w++ = '"';
            p += 2;
            continue;
          }
          p++;
          break;
        }
        *w++ = *p++;
      }
      while (*p == ' ' || *p == '\t') p++;
      if (*p && *p != ',') return -1;
      char sep = *p;
      *w = '\0';
      fields[n++] = start;
      if (!sep) return n;
      p++;
    } else {
      char *comma = strchr(p, ',');
      if (comma) *comma = '\0';
      fields[n++] = trim(p);
      if (!comma) return n;
      p = comma + 1;
    }
  }
}

int ferry__csv_column(char **fields, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcasecmp(fields[i], name)) return i;
  return -1;
}

/* ---- detection and open ----------------------------------------------------------------- */

static ferry_status detect(struct ferry__lines *lr, enum ferry_trace_format *out, struct ferry_err *err) {
  const char *p = lr->buf;
  while (isspace((unsigned char)*p)) p++;
  if (*p == '{') {
    ferry__json_init();
    cJSON *o = cJSON_ParseWithLength(lr->buf, lr->len);
    if (!o || !cJSON_IsObject(o)) {
      cJSON_Delete(o);
      return ferry__err_set(err, FERRY_ERR_FORMAT, "%s:%" PRId64 ": first line is not a JSON object", lr->path,
                            lr->lineno);
    }
    int jsonl = cJSON_HasObjectItem(o, "arrival_ns");
    int moon = cJSON_HasObjectItem(o, "timestamp") && cJSON_HasObjectItem(o, "input_length");
    cJSON_Delete(o);
    if (jsonl || moon) {
      *out = jsonl ? FERRY_TRACE_JSONL : FERRY_TRACE_MOONCAKE;
      return FERRY_OK;
    }
    return ferry__err_set(err, FERRY_ERR_FORMAT,
                          "%s:%" PRId64 ": cannot tell the trace format: the JSON object has neither \"arrival_ns\" "
                          "(ferry JSONL) nor \"timestamp\" and \"input_length\" (Mooncake)",
                          lr->path, lr->lineno);
  }
  char *copy = ferry__strndup(lr->buf, lr->len);
  if (!copy) return ferry__err_set(err, FERRY_ERR_NOMEM, "%s: out of memory", lr->path);
  char *fields[64];
  int n = ferry__csv_split(copy, fields, 64);
  ferry_status st = FERRY_OK;
  if (n > 0 && ferry__csv_column(fields, n, "ContextTokens") >= 0)
    *out = FERRY_TRACE_AZURE;
  else if (n > 0 && ferry__csv_column(fields, n, "Request tokens") >= 0)
    *out = FERRY_TRACE_BURSTGPT;
  else
    st = ferry__err_set(err, FERRY_ERR_FORMAT,
                        "%s:%" PRId64 ": cannot tell the trace format from '%.60s' (expected an Azure header "
                        "'TIMESTAMP,ContextTokens,GeneratedTokens', a BurstGPT header 'Timestamp,Model,Request "
                        "tokens,Response tokens,Total tokens,Log Type', or one JSON object per line)",
                        lr->path, lr->lineno, lr->buf);
  ferry_free(copy);
  return st;
}

ferry_status ferry__trace_check_options(const struct ferry_trace_options *o, struct ferry_err *err) {
  if ((unsigned)o->format > FERRY_TRACE_JSONL)
    return ferry__err_set(err, FERRY_ERR_INVALID, "trace options: format %d is not a file format", (int)o->format);
  if (o->window_start_ns < 0)
    return ferry__err_set(err, FERRY_ERR_INVALID, "trace options: window start %" PRId64 " ns is negative",
                          o->window_start_ns);
  if (o->window_end_ns > 0 && o->window_end_ns <= o->window_start_ns)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "trace options: window end %" PRId64 " ns is not after its start %" PRId64 " ns",
                          o->window_end_ns, o->window_start_ns);
  if (o->rate_scale != 0 && !(isfinite(o->rate_scale) && o->rate_scale > 0))
    return ferry__err_set(err, FERRY_ERR_INVALID, "trace options: rate scale %g is not a positive number",
                          o->rate_scale);
  return FERRY_OK;
}

ferry_status ferry_trace_open(ferry_trace **out, const char *path, const struct ferry_trace_options *opts) {
  static const struct ferry_trace_options defaults = {0};
  const struct ferry_trace_options *o = opts ? opts : &defaults;
  *out = NULL;
  ferry_status st = ferry__trace_check_options(o, NULL);
  if (st != FERRY_OK) return st;
  ferry_trace *t = ferry__trace_new(o->format);
  if (!t) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
  struct ferry__lines lr;
  st = ferry__lines_open(&lr, path, &t->err);
  if (st != FERRY_OK) goto out_free_trace;
  st = ferry__lines_next(&lr, &t->err);
  if (st != FERRY_OK) goto out_close_lines;
  if (lr.eof) {
    st = ferry__err_set(&t->err, FERRY_ERR_FORMAT, "%s: no requests (the file is empty)", path);
    goto out_close_lines;
  }
  if (t->format == FERRY_TRACE_AUTO) {
    st = detect(&lr, &t->format, &t->err);
    if (st != FERRY_OK) goto out_close_lines;
  }
  struct ferry__trace_reader rd = {.lines = &lr, .trace = t, .opts = o};
  switch (t->format) {
  case FERRY_TRACE_AZURE: st = ferry__read_azure(&rd); break;
  case FERRY_TRACE_BURSTGPT: st = ferry__read_burstgpt(&rd); break;
  case FERRY_TRACE_MOONCAKE: st = ferry__read_mooncake(&rd); break;
  default: st = ferry__read_jsonl(&rd); break;
  }
  if (st != FERRY_OK) goto out_close_lines;
  ferry__lines_close(&lr);
  st = ferry__trace_finish(t, o, path);
  if (st != FERRY_OK) goto out_free_trace;
  *out = t;
  return FERRY_OK;

out_close_lines:
  ferry__lines_close(&lr);
out_free_trace:
  ferry_trace_free(t);
  return st;
}

/* ---- ordering and slicing --------------------------------------------------------------- */

struct sort_key {
  int64_t arrival_ns;
  size_t index;
};

static int cmp_key(const void *a, const void *b) {
  const struct sort_key *x = a, *y = b;
  if (x->arrival_ns != y->arrival_ns) return x->arrival_ns < y->arrival_ns ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index); /* file order breaks ties: stable */
}

static ferry_status sort_stable(ferry_trace *t, const char *what) {
  struct sort_key *keys = ferry__reallocarray(NULL, t->n, sizeof *keys);
  struct ferry_request *r = ferry__reallocarray(NULL, t->n, sizeof *r);
  int64_t *h = ferry__reallocarray(NULL, t->n, sizeof *h);
  ferry_status st = FERRY_OK;
  if (!keys || !r || !h) {
    st = ferry__err_set(&t->err, FERRY_ERR_NOMEM, "%s: out of memory sorting %zu requests", what, t->n);
    goto out_free;
  }
  for (size_t i = 0; i < t->n; i++) keys[i] = (struct sort_key){t->reqs[i].arrival_ns, i};
  qsort(keys, t->n, sizeof *keys, cmp_key);
  for (size_t i = 0; i < t->n; i++) {
    r[i] = t->reqs[keys[i].index];
    h[i] = t->hash_off[keys[i].index];
  }
  ferry_free(t->reqs);
  ferry_free(t->hash_off);
  t->reqs = r;
  t->hash_off = h;
  r = NULL;
  h = NULL;
out_free:
  ferry_free(keys);
  ferry_free(r);
  ferry_free(h);
  return st;
}

ferry_status ferry__trace_finish(ferry_trace *t, const struct ferry_trace_options *o, const char *what) {
  if (t->n == 0)
    return ferry__err_set(&t->err, FERRY_ERR_FORMAT, "%s: no requests (%zu malformed and %zu failed rows skipped)",
                          what, t->skipped_bad, t->skipped_failed);
  for (size_t i = 1; i < t->n; i++)
    if (t->reqs[i].arrival_ns < t->reqs[i - 1].arrival_ns) t->out_of_order++;
  if (t->out_of_order) {
    ferry_status st = sort_stable(t, what);
    if (st != FERRY_OK) return st;
    FERRY_WARN("%s: %zu rows arrived earlier than the row before them; sorted by arrival time", what,
               t->out_of_order);
  }
  int64_t t0 = t->reqs[0].arrival_ns;
  int64_t ws = o->window_start_ns, we = o->window_end_ns > 0 ? o->window_end_ns : INT64_MAX;
  double scale = o->rate_scale > 0 ? o->rate_scale : 1.0;
  size_t limit = o->max_requests > 0 ? (size_t)o->max_requests : SIZE_MAX;
  size_t k = 0;
  for (size_t i = 0; i < t->n && k < limit; i++) {
    int64_t rel = t->reqs[i].arrival_ns - t0;
    if (rel < ws) continue;
    if (rel >= we) break;
    rel -= ws;
    if (scale != 1.0) {
      double v = nearbyint((double)rel / scale);
      if (!(v < 9.2e18))
        return ferry__err_set(&t->err, FERRY_ERR_RANGE, "%s: rate scale %g makes arrival times overflow", what,
                              scale);
      rel = (int64_t)v;
    }
    if (rel > FERRY_TRACE_MAX_SPAN_NS)
      return ferry__err_set(&t->err, FERRY_ERR_RANGE,
                            "%s: request %" PRId64 " arrives %.1f days after the first; a trace spans at most 2^53 ns "
                            "(104 days), what ferry JSONL holds exactly",
                            what, t->reqs[i].id, (double)rel / 86400e9);
    t->reqs[k] = t->reqs[i];
    t->reqs[k].arrival_ns = rel;
    t->hash_off[k] = t->hash_off[i];
    k++;
  }
  if (k == 0)
    return ferry__err_set(&t->err, FERRY_ERR_FORMAT,
                          "%s: no requests in the time window [%.3f s, %.3f s) of a trace spanning %.3f s", what,
                          ws / 1e9, we == INT64_MAX ? INFINITY : we / 1e9,
                          (t->reqs[t->n - 1].arrival_ns - t0) / 1e9);
  t->n = k;
  return FERRY_OK;
}

/* ---- statistics ------------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static int64_t rank(const int32_t *sorted, size_t n, unsigned pct) {
  size_t r = (n / 100) * pct + ((n % 100) * pct + 99) / 100; /* nearest rank ceil(n*pct/100) */
  return sorted[r ? r - 1 : 0];
}

static void dist(int32_t *v, size_t n, struct ferry_trace_dist *d) {
  qsort(v, n, sizeof *v, cmp_i32);
  int64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += v[i];
  d->sum = sum;
  d->mean = (double)sum / (double)n;
  d->min = v[0];
  d->max = v[n - 1];
  d->p50 = rank(v, n, 50);
  d->p90 = rank(v, n, 90);
  d->p99 = rank(v, n, 99);
}

ferry_status ferry_trace_get_stats(const ferry_trace *t, struct ferry_trace_stats *s) {
  memset(s, 0, sizeof *s);
  if (!t) return FERRY_OK;
  s->skipped_bad = t->skipped_bad;
  s->skipped_failed = t->skipped_failed;
  s->out_of_order = t->out_of_order;
  s->count = t->n;
  if (t->n == 0) return FERRY_OK;
  s->span_ns = t->reqs[t->n - 1].arrival_ns - t->reqs[0].arrival_ns;
  s->rate_per_s = s->span_ns > 0 ? (double)t->n / (s->span_ns / 1e9) : 0.0;
  int32_t *v = ferry__reallocarray(NULL, t->n, sizeof *v);
  if (!v) return ferry__fail(FERRY_ERR_NOMEM, "out of memory for trace statistics");
  for (size_t i = 0; i < t->n; i++) v[i] = t->reqs[i].prompt_tokens;
  dist(v, t->n, &s->prompt);
  for (size_t i = 0; i < t->n; i++) v[i] = t->reqs[i].output_tokens;
  dist(v, t->n, &s->output);
  ferry_free(v);
  return FERRY_OK;
}

/* ---- ferry JSONL writer ----------------------------------------------------------------- */


ferry_status ferry_trace_write_jsonl(const ferry_trace *t, const char *path) {
  if (!t || !path) return ferry__fail(FERRY_ERR_INVALID, "ferry_trace_write_jsonl: NULL trace or path");
  return ferry_trace_write_jsonl_subset(t, path, t->n, 0, 1);
}

ferry_status ferry_trace_write_jsonl_subset(const ferry_trace *t, const char *path, size_t count, size_t first,
                                            size_t stride) {
  if (!t || !path || stride == 0)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_trace_write_jsonl_subset: NULL trace or path, or stride 0");
  if (count > t->n) count = t->n;
  struct ferry_strbuf b = {0};
  for (size_t i = first; i < count; i += stride) {
    const struct ferry_request *r = &t->reqs[i];
    ferry__sb_printf(&b, "{\"req_id\":%" PRId64 ",\"arrival_ns\":%" PRId64 ",\"prompt_tokens\":%" PRId32
                  ",\"output_tokens\":%" PRId32,
              r->id, r->arrival_ns, r->prompt_tokens, r->output_tokens);
    int32_t nh;
    const int64_t *h = ferry_trace_hash_ids(t, i, &nh);
    if (nh > 0) {
      ferry__sb_printf(&b, ",\"hash_ids\":[");
      for (int32_t j = 0; j < nh; j++) ferry__sb_printf(&b, j ? ",%" PRId64 : "%" PRId64, h[j]);
      ferry__sb_printf(&b, "]");
    }
    ferry__sb_printf(&b, "}\n");
  }
  ferry_status st;
  if (b.oom) {
    st = ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory formatting %zu requests", path, t->n);
  } else {
    st = ferry__write_output(path, b.p ? b.p : "", b.len);
  }
  ferry_free(b.p);
  return st;
}

/* ---- JSON Lines helpers ----------------------------------------------------------------- */

cJSON *ferry__jl_object(struct ferry__trace_reader *rd, ferry_status *st) {
  ferry__json_init();
  const char *end = NULL;
  cJSON *o = cJSON_ParseWithLengthOpts(rd->lines->buf, rd->lines->len, &end, 0);
  if (!o) {
    const char *e = cJSON_GetErrorPtr();
    size_t col = e && e >= rd->lines->buf && e <= rd->lines->buf + rd->lines->len ? (size_t)(e - rd->lines->buf) + 1 : 1;
    *st = ferry__trace_bad_row(rd, "invalid JSON near column %zu", col);
    return NULL;
  }
  for (const char *p = end; p < rd->lines->buf + rd->lines->len; p++) {
    if (!isspace((unsigned char)*p)) {
      cJSON_Delete(o);
      *st = ferry__trace_bad_row(rd, "unexpected data after the JSON object at column %zu",
                                 (size_t)(p - rd->lines->buf) + 1);
      return NULL;
    }
  }
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    *st = ferry__trace_bad_row(rd, "not a JSON object");
    return NULL;
  }
  *st = FERRY_OK;
  return o;
}

int ferry__jl_int(const cJSON *o, const char *key, double min, double max, int64_t *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!it) return 1;
  if (!ferry__json_is_int(it, min, max)) return 2;
  *out = (int64_t)it->valuedouble;
  return 0;
}

int ferry__jl_hash_ids(struct ferry__trace_reader *rd, const cJSON *o, int64_t **buf, size_t *cap,
                       int32_t *n, ferry_status *st) {
  *n = 0;
  *st = FERRY_OK;
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "hash_ids");
  if (!a || cJSON_IsNull(a)) return 0;
  if (!cJSON_IsArray(a)) {
    *st = ferry__trace_bad_row(rd, "hash_ids is not an array");
    return -1;
  }
  int32_t k = 0;
  for (const cJSON *it = a->child; it; it = it->next, k++) {
    if (!ferry__json_is_int(it, 0, 9007199254740992.0)) {
      *st = ferry__trace_bad_row(rd, "hash_ids[%d] is not a non-negative integer", (int)k);
      return -1;
    }
    if ((size_t)k == *cap) {
      size_t nc = *cap ? *cap * 2 : 256;
      int64_t *nb = ferry__reallocarray(*buf, nc, sizeof *nb);
      if (!nb) {
        *st = ferry__err_set(&rd->trace->err, FERRY_ERR_NOMEM, "out of memory for hash ids");
        return -2;
      }
      *buf = nb;
      *cap = nc;
    }
    (*buf)[k] = (int64_t)it->valuedouble;
  }
  *n = k;
  return 0;
}
