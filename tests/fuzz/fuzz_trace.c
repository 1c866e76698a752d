/* Fuzz target: a request trace file in one format, chosen when the target is built
 * (FUZZ_TRACE_FORMAT: Azure 2023 CSV, BurstGPT CSV, Mooncake JSONL or ferry JSONL; one
 * executable and one corpus per format). Invariants of an accepted file: requests sorted by
 * arrival from 0, non-negative lengths, skip_bad accepts it too with nothing skipped, slicing
 * (window, rate scale, first N) keeps exactly the requests it should, statistics are ordered,
 * and the ferry JSONL written for it reads back to the same requests. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/trace.h"
#include "tests/fuzz/fuzz.h"

#ifndef FUZZ_TRACE_FORMAT
#error "build with -DFUZZ_TRACE_FORMAT=FERRY_TRACE_AZURE (or _BURSTGPT, _MOONCAKE, _JSONL)"
#endif

static ferry_trace *open_as(const char *path, enum ferry_trace_format format, const struct ferry_trace_options *base) {
  struct ferry_trace_options o = *base;
  o.format = format;
  ferry_trace *t = NULL;
  return ferry_trace_open(&t, path, &o) == FERRY_OK ? t : NULL;
}

static void check_requests(const ferry_trace *t) {
  const size_t n = ferry_trace_count(t);
  FUZZ_CHECK(n > 0); /* "no requests" is an error, never an empty trace */
  for (size_t i = 0; i < n; i++) {
    const struct ferry_request *r = ferry_trace_request(t, i);
    FUZZ_CHECK(r && r->arrival_ns >= 0 && r->prompt_tokens >= 0 && r->output_tokens >= 0);
    FUZZ_CHECK(i == 0 || r->arrival_ns >= r[-1].arrival_ns);
    int32_t nh;
    const int64_t *h = ferry_trace_hash_ids(t, i, &nh);
    FUZZ_CHECK(nh == r->n_hash_ids && (nh == 0 || h != NULL));
  }
  FUZZ_CHECK(ferry_trace_request(t, n) == NULL);
  struct ferry_trace_stats s;
  FUZZ_CHECK(ferry_trace_get_stats(t, &s) == FERRY_OK);
  FUZZ_CHECK(s.count == n && s.span_ns >= 0);
  const struct ferry_trace_dist *d[2] = {&s.prompt, &s.output};
  for (int k = 0; k < 2; k++)
    FUZZ_CHECK(d[k]->min >= 0 && d[k]->min <= d[k]->p50 && d[k]->p50 <= d[k]->p90 && d[k]->p90 <= d[k]->p99 &&
               d[k]->p99 <= d[k]->max && d[k]->sum >= d[k]->max);
}

static int same_request(const ferry_trace *a, size_t i, const ferry_trace *b, size_t j, int64_t arrival_b) {
  const struct ferry_request *x = ferry_trace_request(a, i), *y = ferry_trace_request(b, j);
  int32_t nx, ny;
  const int64_t *hx = ferry_trace_hash_ids(a, i, &nx), *hy = ferry_trace_hash_ids(b, j, &ny);
  return x->id == y->id && y->arrival_ns == arrival_b && x->prompt_tokens == y->prompt_tokens &&
         x->output_tokens == y->output_tokens && nx == ny && (nx == 0 || !memcmp(hx, hy, (size_t)nx * sizeof *hx));
}

/* window from the middle request's arrival, twice the rate, at most two requests */
static void check_slicing(const char *path, const ferry_trace *full, const struct ferry_trace_options *base) {
  const size_t n = ferry_trace_count(full);
  struct ferry_trace_options o = *base;
  o.window_start_ns = ferry_trace_request(full, n / 2)->arrival_ns;
  o.rate_scale = 2.0;
  o.max_requests = 2;
  ferry_trace *t = open_as(path, FUZZ_TRACE_FORMAT, &o);
  FUZZ_CHECK(t != NULL);
  size_t first = n / 2;
  while (first > 0 && ferry_trace_request(full, first - 1)->arrival_ns == o.window_start_ns) first--;
  FUZZ_CHECK(ferry_trace_count(t) == (n - first < 2 ? n - first : 2));
  for (size_t j = 0; j < ferry_trace_count(t); j++) {
    double rel = nearbyint((double)(ferry_trace_request(full, first + j)->arrival_ns - o.window_start_ns) / 2.0);
    FUZZ_CHECK(same_request(full, first + j, t, j, (int64_t)rel));
  }
  ferry_trace_free(t);
}

/* ferry JSONL written for the trace reads back to the same requests */
static void check_round_trip(const ferry_trace *t) {
  char path[256];
  snprintf(path, sizeof path, "%s/round-trip.jsonl", fuzz_dir());
  FUZZ_CHECK(ferry_trace_write_jsonl(t, path) == FERRY_OK);
  ferry_trace *back = open_as(path, FERRY_TRACE_JSONL, &(struct ferry_trace_options){.rate_scale = 1.0});
  FUZZ_CHECK(back != NULL);
  FUZZ_CHECK(ferry_trace_count(back) == ferry_trace_count(t));
  for (size_t i = 0; i < ferry_trace_count(t); i++)
    FUZZ_CHECK(same_request(t, i, back, i, ferry_trace_request(t, i)->arrival_ns));
  ferry_trace_free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *written = fuzz_write("trace.in", data, size);
  if (!written) return 0;
  char path[256];
  snprintf(path, sizeof path, "%s", written);
  const struct ferry_trace_options strict = {.rate_scale = 1.0}, lenient = {.rate_scale = 1.0, .skip_bad = 1};
  ferry_trace *t = open_as(path, FUZZ_TRACE_FORMAT, &strict);
  ferry_trace *skip = open_as(path, FUZZ_TRACE_FORMAT, &lenient);
  ferry_trace_free(open_as(path, FERRY_TRACE_AUTO, &strict)); /* detection must not crash either */
  if (skip) check_requests(skip);
  if (t) {
    check_requests(t);
    FUZZ_CHECK(ferry_trace_request(t, 0)->arrival_ns == 0);
    FUZZ_CHECK(ferry_trace_get_format(t) == FUZZ_TRACE_FORMAT);
    /* what the strict reader accepts, the lenient one reads the same and skips nothing */
    FUZZ_CHECK(skip && ferry_trace_skipped(skip) == 0 && ferry_trace_count(skip) == ferry_trace_count(t));
    for (size_t i = 0; i < ferry_trace_count(t); i++)
      FUZZ_CHECK(same_request(t, i, skip, i, ferry_trace_request(t, i)->arrival_ns));
    check_slicing(path, t, &strict);
    check_round_trip(t);
  }
  ferry_trace_free(t);
  ferry_trace_free(skip);
  return 0;
}
