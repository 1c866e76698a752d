/* Synthetic request traces from a spec string ("arrivals=gamma,cv=2,rate=4,n=1000,
 * prompt=lognormal:512:0.6,output=uniform:16:256"): Poisson, Gamma or evenly spaced arrivals
 * and fixed, uniform, lognormal or resampled lengths, each drawn from its own seeded stream. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/rng.h"
#include "common/units.h"
#include "traces/trace_impl.h"

#define KNOWN_KEYS "arrivals, rate, cv, n, prompt, output"

/* Random stream ids: one per quantity, so changing one distribution leaves the others' draws
 * unchanged. */
enum { STREAM_ARRIVALS = 1, STREAM_PROMPT = 2, STREAM_OUTPUT = 3 };

enum arrivals { ARR_POISSON, ARR_GAMMA, ARR_UNIFORM };
enum len_kind { LEN_FIXED, LEN_UNIFORM, LEN_LOGNORMAL, LEN_RESAMPLE };

struct len_dist {
  enum len_kind kind;
  int64_t lo, hi;        /* fixed: lo; uniform: [lo, hi] */
  double median, sigma;  /* lognormal */
  char *path;            /* resample */
  ferry_trace *src;      /* resample: loaded trace (owned, or borrowed when shared) */
  int src_shared;
};

static int parse_num(const char *s, double *out) { return ferry__parse_double(s, out) != FERRY_OK; }

static int parse_int(const char *s, int64_t *out) { return ferry__parse_i64(s, out) != FERRY_OK; }

static ferry_status parse_len(const char *key, char *v, struct len_dist *d) {
  char *colon = strchr(v, ':');
  if (!colon) {
    d->kind = LEN_FIXED;
    if (parse_int(v, &d->lo) || d->lo < 0 || d->lo > INT32_MAX) goto bad;
    return FERRY_OK;
  }
  *colon = '\0';
  char *args = colon + 1;
  if (!strcmp(v, "resample")) {
    d->kind = LEN_RESAMPLE;
    if (!*args) goto bad_restore;
    d->path = ferry__strdup(args);
    if (!d->path) return ferry__fail(FERRY_ERR_NOMEM, "out of memory");
    return FERRY_OK;
  }
  char *a2 = strchr(args, ':');
  if (!a2 || strchr(a2 + 1, ':')) goto bad_restore;
  *a2++ = '\0';
  if (!strcmp(v, "uniform")) {
    d->kind = LEN_UNIFORM;
    if (parse_int(args, &d->lo) || parse_int(a2, &d->hi) || d->lo < 0 || d->hi < d->lo || d->hi > INT32_MAX)
      goto bad_restore2;
    return FERRY_OK;
  }
  if (!strcmp(v, "lognormal")) {
    d->kind = LEN_LOGNORMAL;
    if (parse_num(args, &d->median) || parse_num(a2, &d->sigma) || !(d->median > 0) || !(d->sigma >= 0))
      goto bad_restore2;
    return FERRY_OK;
  }
  a2[-1] = ':';
bad_restore:
  *colon = ':';
  goto bad;
bad_restore2:
  a2[-1] = ':';
  *colon = ':';
bad:
  return ferry__fail(FERRY_ERR_INVALID,
                     "synthetic spec: %s='%s' is not a length distribution (expected N, uniform:LO:HI, "
                     "lognormal:MEDIAN:SIGMA or resample:PATH, lengths non-negative)",
                     key, v);
}

static int32_t draw_len(const struct len_dist *d, struct ferry_rng *r, int64_t *row, int prompt) {
  switch (d->kind) {
  case LEN_FIXED: return (int32_t)d->lo;
  case LEN_UNIFORM: return (int32_t)(d->lo + (int64_t)ferry__rng_below(r, (uint64_t)(d->hi - d->lo + 1)));
  case LEN_LOGNORMAL: {
    double x = nearbyint(exp(log(d->median) + d->sigma * ferry__rng_normal(r)));
    if (x < 1) x = 1;
    if (x > INT32_MAX) x = INT32_MAX;
    return (int32_t)x;
  }
  case LEN_RESAMPLE: {
    /* A row drawn for the prompt is reused for the output when both resample one file. */
    if (*row < 0) *row = (int64_t)ferry__rng_below(r, ferry_trace_count(d->src));
    const struct ferry_request *q = ferry_trace_request(d->src, (size_t)*row);
    return prompt ? q->prompt_tokens : q->output_tokens;
  }
  }
  return 0;
}

static void len_free(struct len_dist *d) {
  ferry_free(d->path);
  if (!d->src_shared) ferry_trace_free(d->src);
}

ferry_status ferry_trace_synthetic(ferry_trace **out, const char *spec, uint64_t seed) {
  return ferry_trace_synthetic_open(out, spec, seed, NULL);
}

ferry_status ferry_trace_synthetic_open(ferry_trace **out, const char *spec, uint64_t seed,
                                        const struct ferry_trace_options *opts) {
  static const struct ferry_trace_options defaults = {0};
  const struct ferry_trace_options *so = opts ? opts : &defaults;
  *out = NULL;
  if (so->format != FERRY_TRACE_AUTO)
    return ferry__fail(FERRY_ERR_INVALID, "synthetic trace: a trace format (%s) applies to trace files only",
                       ferry_trace_format_name(so->format));
  ferry_status cst = ferry__trace_check_options(so, NULL);
  if (cst != FERRY_OK) return cst;
  enum arrivals arr = ARR_POISSON;
  double rate = 1.0, cv = 1.0;
  int cv_given = 0;
  int64_t n = 100;
  struct len_dist prompt = {.kind = LEN_FIXED, .lo = 512}, output = {.kind = LEN_FIXED, .lo = 128};
  ferry_trace *t = NULL;
  ferry_status st = FERRY_OK;
  char *copy = ferry__strdup(spec ? spec : "");
  if (!copy) return ferry__fail(FERRY_ERR_NOMEM, "out of memory");

  char *save = NULL;
  for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    while (*item == ' ') item++;
    if (!*item) continue;
    char *eq = strchr(item, '=');
    if (!eq) {
      st = ferry__fail(FERRY_ERR_INVALID, "synthetic spec: '%s' is not key=value (keys: " KNOWN_KEYS ")", item);
      goto out_free;
    }
    *eq = '\0';
    const char *key = item;
    char *v = eq + 1;
    if (!strcmp(key, "arrivals")) {
      if (!strcmp(v, "poisson"))
        arr = ARR_POISSON;
      else if (!strcmp(v, "gamma"))
        arr = ARR_GAMMA;
      else if (!strcmp(v, "uniform"))
        arr = ARR_UNIFORM;
      else {
        st = ferry__fail(FERRY_ERR_INVALID, "synthetic spec: arrivals='%s' (expected poisson, gamma or uniform)", v);
        goto out_free;
      }
    } else if (!strcmp(key, "rate")) {
      if (parse_num(v, &rate) || !(rate > 0)) {
        st = ferry__fail(FERRY_ERR_INVALID, "synthetic spec: rate='%s' is not a positive number of requests/s", v);
        goto out_free;
      }
    } else if (!strcmp(key, "cv")) {
      if (parse_num(v, &cv) || !(cv > 0) || cv > 1000) {
        st = ferry__fail(FERRY_ERR_INVALID, "synthetic spec: cv='%s' is not a number in (0, 1000]", v);
        goto out_free;
      }
      cv_given = 1;
    } else if (!strcmp(key, "n")) {
      if (parse_int(v, &n) || n < 1 || n > FERRY_TRACE_MAX_SYNTHETIC) {
        st = ferry__fail(FERRY_ERR_INVALID, "synthetic spec: n='%s' is not an integer in [1, %d]", v,
                         FERRY_TRACE_MAX_SYNTHETIC);
        goto out_free;
      }
    } else if (!strcmp(key, "prompt") || !strcmp(key, "output")) {
      struct len_dist *d = key[0] == 'p' ? &prompt : &output;
      ferry_free(d->path);
      *d = (struct len_dist){0};
      st = parse_len(key, v, d);
      if (st != FERRY_OK) goto out_free;
    } else {
      st = ferry__fail(FERRY_ERR_INVALID, "synthetic spec: unknown key '%s' (known: " KNOWN_KEYS ")", key);
      goto out_free;
    }
  }
  if (cv_given && arr != ARR_GAMMA) {
    st = ferry__fail(FERRY_ERR_INVALID, "synthetic spec: cv applies only to arrivals=gamma");
    goto out_free;
  }
  if (prompt.kind == LEN_RESAMPLE) {
    st = ferry_trace_open(&prompt.src, prompt.path, NULL);
    if (st != FERRY_OK) goto out_free;
  }
  if (output.kind == LEN_RESAMPLE) {
    if (prompt.kind == LEN_RESAMPLE && !strcmp(prompt.path, output.path)) {
      output.src = prompt.src;
      output.src_shared = 1;
    } else {
      st = ferry_trace_open(&output.src, output.path, NULL);
      if (st != FERRY_OK) goto out_free;
    }
  }

  t = ferry__trace_new(FERRY_TRACE_SYNTHETIC);
  if (!t) {
    st = ferry__fail(FERRY_ERR_NOMEM, "out of memory");
    goto out_free;
  }
  struct ferry_rng ra, rp, ro;
  ferry__rng_seed_stream(&ra, seed, STREAM_ARRIVALS);
  ferry__rng_seed_stream(&rp, seed, STREAM_PROMPT);
  ferry__rng_seed_stream(&ro, seed, STREAM_OUTPUT);
  const double mean_gap_ns = 1e9 / rate, shape = 1.0 / (cv * cv);
  double now_ns = 0;
  int joint = output.src_shared;
  /* Lazily, as ferry__trace_finish() would slice the whole trace: only requests that are kept
   * are stored, and generation stops at the window's end or the last request wanted, so
   * n=1e8 with --max-requests 3 costs three requests. Every generated request still draws
   * its lengths, so the kept ones are those of the full trace. */
  const int64_t ws = so->window_start_ns, we = so->window_end_ns > 0 ? so->window_end_ns : INT64_MAX;
  const double scale = so->rate_scale > 0 ? so->rate_scale : 1.0;
  const size_t limit = so->max_requests > 0 ? (size_t)so->max_requests : SIZE_MAX;
  double last_ns = 0;
  for (int64_t i = 0; i < n && t->n < limit; i++) {
    if (i > 0) {
      double gap;
      switch (arr) {
      case ARR_GAMMA: gap = ferry__rng_gamma(&ra, shape, mean_gap_ns / shape); break;
      case ARR_UNIFORM: gap = mean_gap_ns; break;
      default: gap = ferry__rng_exponential(&ra, mean_gap_ns); break;
      }
      now_ns += gap;
    }
    double at = nearbyint(now_ns);
    if (!(at < 9.2e18)) {
      st = ferry__err_set(&t->err, FERRY_ERR_RANGE, "synthetic spec: arrival times overflow at request %" PRId64
                          " (rate %g/s too low for n=%" PRId64 ")", i, rate, n);
      goto out_free;
    }
    int64_t row = -1;
    int32_t p = draw_len(&prompt, &rp, &row, 1);
    if (!joint) row = -1;
    int32_t o = draw_len(&output, &ro, &row, 0);
    last_ns = at;
    int64_t rel = (int64_t)at;
    if (rel < ws) continue;
    if (rel >= we) break;
    rel -= ws;
    if (scale != 1.0) { /* as ferry__trace_finish() */
      const double v = nearbyint((double)rel / scale);
      if (!(v < 9.2e18)) {
        st = ferry__err_set(&t->err, FERRY_ERR_RANGE, "synthetic trace: rate scale %g makes arrival times overflow",
                            scale);
        goto out_free;
      }
      rel = (int64_t)v;
    }
    st = ferry__trace_push(t, i, rel, p, o, NULL, 0);
    if (st != FERRY_OK) goto out_free;
  }
  if (t->n == 0) {
    st = ferry__err_set(&t->err, FERRY_ERR_FORMAT,
                        "synthetic trace: no requests in the time window [%.3f s, %.3f s) of a trace spanning %.3f s",
                        ws / 1e9, we == INT64_MAX ? INFINITY : we / 1e9, last_ns / 1e9);
    goto out_free;
  }
  *out = t;
  t = NULL;

out_free:
  ferry_trace_free(t);
  len_free(&output);
  len_free(&prompt);
  ferry_free(copy);
  return st;
}
