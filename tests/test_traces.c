/* traces/: every reader on committed slices of real traces (exact first/last arrivals in ns,
 * token sums), malformed-row corpus with line numbers, slicing, JSONL round trip, synthetic
 * determinism and statistics, allocation-failure injection and the `ferry trace` command. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/alloc.h"
#include "ferry/trace.h"
#include "testutil.h"
#include "traces/trace_impl.h"

static ferry_trace *open_data(const char *name, const struct ferry_trace_options *o) {
  char *p = tu_data_path(name);
  ferry_trace *t = NULL;
  ferry_status st = ferry_trace_open(&t, p, o);
  if (st != FERRY_OK) fprintf(stderr, "open %s: %s\n", p, ferry_last_error());
  assert_int_equal(st, FERRY_OK);
  free(p);
  return t;
}

static void sums(const ferry_trace *t, int64_t *prompt, int64_t *output) {
  *prompt = *output = 0;
  for (size_t i = 0; i < ferry_trace_count(t); i++) {
    *prompt += ferry_trace_request(t, i)->prompt_tokens;
    *output += ferry_trace_request(t, i)->output_tokens;
  }
}

static void check_sorted_from_zero(const ferry_trace *t) {
  assert_int_equal(ferry_trace_request(t, 0)->arrival_ns, 0);
  for (size_t i = 1; i < ferry_trace_count(t); i++)
    assert_true(ferry_trace_request(t, i)->arrival_ns >= ferry_trace_request(t, i - 1)->arrival_ns);
}

/* ---- readers on real slices ------------------------------------------------------------- */

static void test_azure_slices(void **state) {
  (void)state;
  ferry_trace *t = open_data("traces/azure_conv_200.csv", NULL);
  assert_int_equal(ferry_trace_get_format(t), FERRY_TRACE_AZURE);
  assert_int_equal(ferry_trace_count(t), 200);
  check_sorted_from_zero(t);
  /* 18:15:46.6805900 -> 18:16:47.9441270, every digit kept. */
  assert_int_equal(ferry_trace_request(t, 199)->arrival_ns, 61263537000LL);
  assert_int_equal(ferry_trace_request(t, 1)->arrival_ns, 4314579000LL);
  assert_int_equal(ferry_trace_request(t, 0)->prompt_tokens, 374);
  assert_int_equal(ferry_trace_request(t, 0)->output_tokens, 44);
  assert_int_equal(ferry_trace_request(t, 199)->id, 199);
  assert_int_equal(ferry_trace_request(t, 0)->n_hash_ids, 0);
  assert_null(ferry_trace_request(t, 200));
  int64_t p, o;
  sums(t, &p, &o);
  assert_int_equal(p, 180695);
  assert_int_equal(o, 47050);
  ferry_trace_free(t);

  t = open_data("traces/azure_code_200.csv", NULL);
  assert_int_equal(ferry_trace_count(t), 200);
  assert_int_equal(ferry_trace_request(t, 199)->arrival_ns, 199089585000LL);
  sums(t, &p, &o);
  assert_int_equal(p, 414215);
  assert_int_equal(o, 4907);
  struct ferry_trace_stats s;
  assert_int_equal(ferry_trace_get_stats(t, &s), FERRY_OK);
  assert_int_equal(s.count, 200);
  assert_int_equal(s.span_ns, 199089585000LL);
  assert_int_equal(s.prompt.sum, 414215);
  assert_true(s.prompt.min <= s.prompt.p50 && s.prompt.p50 <= s.prompt.p90 && s.prompt.p90 <= s.prompt.p99 &&
              s.prompt.p99 <= s.prompt.max);
  assert_true(fabs(s.rate_per_s - 200 / 199.089585) < 1e-9);
  ferry_trace_free(t);
}

static void test_mooncake_slice(void **state) {
  (void)state;
  ferry_trace *t = open_data("traces/mooncake_conv_200.jsonl", NULL);
  assert_int_equal(ferry_trace_get_format(t), FERRY_TRACE_MOONCAKE);
  assert_int_equal(ferry_trace_count(t), 200);
  check_sorted_from_zero(t);
  assert_int_equal(ferry_trace_request(t, 199)->arrival_ns, 72000LL * 1000000);
  int64_t p, o, nh = 0;
  sums(t, &p, &o);
  assert_int_equal(p, 2782179);
  assert_int_equal(o, 71379);
  for (size_t i = 0; i < 200; i++) nh += ferry_trace_request(t, i)->n_hash_ids;
  assert_int_equal(nh, 5537);
  int32_t n;
  const int64_t *h = ferry_trace_hash_ids(t, 199, &n);
  assert_int_equal(n, 40);
  assert_int_equal(h[0], 0);
  assert_int_equal(h[1], 5176);
  assert_int_equal(h[2], 5177);
  assert_int_equal(ferry_trace_request(t, 0)->prompt_tokens, 6758);
  assert_int_equal(ferry_trace_request(t, 0)->output_tokens, 500);
  ferry_trace_free(t);
}

static void test_burstgpt(void **state) {
  (void)state;
  ferry_trace *t = open_data("traces/burstgpt_small.csv", NULL);
  assert_int_equal(ferry_trace_get_format(t), FERRY_TRACE_BURSTGPT);
  assert_int_equal(ferry_trace_count(t), 6);
  struct ferry_trace_stats s;
  assert_int_equal(ferry_trace_get_stats(t, &s), FERRY_OK);
  assert_int_equal(s.skipped_failed, 2);
  assert_int_equal(s.skipped_bad, 0);
  const int64_t ids[] = {0, 2, 3, 4, 6, 7};
  for (int i = 0; i < 6; i++) assert_int_equal(ferry_trace_request(t, i)->id, ids[i]);
  assert_int_equal(ferry_trace_request(t, 2)->arrival_ns, 113500000000LL);  /* 118.5 - 5 s */
  assert_int_equal(ferry_trace_request(t, 4)->arrival_ns, 272125000000LL);  /* 277.125 - 5 s */
  assert_int_equal(ferry_trace_request(t, 5)->arrival_ns, 295000000000LL);
  assert_int_equal(ferry_trace_request(t, 5)->prompt_tokens, 92); /* quoted fields */
  ferry_trace_free(t);

  struct ferry_trace_options o = {.keep_failed = 1};
  t = open_data("traces/burstgpt_small.csv", &o);
  assert_int_equal(ferry_trace_count(t), 8);
  assert_int_equal(ferry_trace_request(t, 5)->arrival_ns, 196000000001LL); /* 201.000000001 - 5 s */
  assert_int_equal(ferry_trace_request(t, 5)->output_tokens, 0);
  ferry_trace_free(t);
}

static void test_crlf_and_jsonl(void **state) {
  (void)state;
  ferry_trace *t = open_data("traces/azure_crlf_no_final_newline.csv", NULL);
  assert_int_equal(ferry_trace_count(t), 3);
  assert_int_equal(ferry_trace_request(t, 1)->arrival_ns, 4314579000LL);
  assert_int_equal(ferry_trace_request(t, 2)->arrival_ns, 4903775000LL);
  assert_int_equal(ferry_trace_request(t, 2)->output_tokens, 111); /* last line, no newline */
  ferry_trace_free(t);

  t = open_data("traces/ferry_small.jsonl", NULL);
  assert_int_equal(ferry_trace_get_format(t), FERRY_TRACE_JSONL);
  assert_int_equal(ferry_trace_count(t), 3);
  assert_int_equal(ferry_trace_request(t, 0)->id, 7);
  assert_int_equal(ferry_trace_request(t, 1)->id, 1); /* no req_id: row index */
  assert_int_equal(ferry_trace_request(t, 2)->id, 9);
  assert_int_equal(ferry_trace_request(t, 1)->arrival_ns, 1500);
  assert_int_equal(ferry_trace_request(t, 2)->arrival_ns, 3000);
  assert_int_equal(ferry_trace_request(t, 2)->prompt_tokens, 0);
  int32_t n;
  const int64_t *h = ferry_trace_hash_ids(t, 1, &n);
  assert_int_equal(n, 3);
  assert_int_equal(h[2], 3);
  assert_null(ferry_trace_hash_ids(t, 0, &n));
  assert_int_equal(n, 0);
  ferry_trace_free(t);
}

static void test_out_of_order_sorted_stably(void **state) {
  (void)state;
  ferry_trace *t = open_data("traces/azure_out_of_order.csv", NULL);
  const int32_t prompts[] = {500, 100, 300, 200, 400}; /* 200 and 400 tie: file order */
  const int64_t at[] = {0, 500000000, 1500000000, 2500000000, 2500000000};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(ferry_trace_request(t, i)->prompt_tokens, prompts[i]);
    assert_int_equal(ferry_trace_request(t, i)->arrival_ns, at[i]);
  }
  struct ferry_trace_stats s;
  ferry_trace_get_stats(t, &s);
  assert_int_equal(s.out_of_order, 2);
  ferry_trace_free(t);
}

/* ---- malformed input -------------------------------------------------------------------- */

static void test_malformed_corpus(void **state) {
  (void)state;
  static const struct {
    const char *file, *where, *what;
  } cases[] = {
      {"azure_tokens_not_integer.csv", ":4: ", "ContextTokens 'abc' is not a non-negative integer"},
      {"azure_tokens_negative.csv", ":3: ", "GeneratedTokens '-5' is not a non-negative integer"},
      {"azure_tokens_overflow.csv", ":2: ", "larger than 2147483647"},
      {"azure_timestamp_bad_month.csv", ":5: ", "TIMESTAMP '2023-13-16"},
      {"azure_timestamp_feb30.csv", ":2: ", "TIMESTAMP '2023-02-30"},
      {"azure_missing_field.csv", ":3: ", "2 fields, expected at least 3"},
      {"azure_header_only.csv", ": ", "no requests"},
      {"empty.csv", ": ", "no requests"},
      {"blank_lines_only.csv", ": ", "no requests"},
      {"unknown_header.csv", ":1: ", "cannot tell the trace format"},
      {"burstgpt_timestamp_exponent.csv", ":3: ", "Timestamp '1e3'"},
      {"burstgpt_unbalanced_quote.csv", ":3: ", "unbalanced quote"},
      {"burstgpt_all_failed.csv", ": ", "no requests (0 malformed and 1 failed rows skipped)"},
      {"mooncake_truncated_json.jsonl", ":3: ", "invalid JSON"},
      {"mooncake_length_negative.jsonl", ":2: ", "\"input_length\" is not a non-negative integer"},
      {"mooncake_missing_timestamp.jsonl", ":4: ", "missing \"timestamp\""},
      {"mooncake_hash_not_integer.jsonl", ":2: ", "hash_ids[1]"},
      {"mooncake_not_object.jsonl", ":2: ", "not a JSON object"},
      {"jsonl_missing_output.jsonl", ":2: ", "missing \"output_tokens\""},
      {"jsonl_arrival_fractional.jsonl", ":2: ", "\"arrival_ns\" is not an integer"},
      {"jsonl_trailing_garbage.jsonl", ":1: ", "unexpected data after the JSON object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char name[256], where[300];
    snprintf(name, sizeof name, "traces/malformed/%s", cases[i].file);
    char *p = tu_data_path(name);
    ferry_trace *t = (ferry_trace *)1;
    ferry_status st = ferry_trace_open(&t, p, NULL);
    snprintf(where, sizeof where, "%s%s", cases[i].file, cases[i].where);
    const char *msg = ferry_last_error();
    if (st != FERRY_ERR_FORMAT || !tu_contains(msg, where) || !tu_contains(msg, cases[i].what))
      fprintf(stderr, "case %s: status %s, message '%s'\n", cases[i].file, ferry_status_name(st), msg);
    assert_int_equal(st, FERRY_ERR_FORMAT);
    assert_null(t);
    assert_true(tu_contains(msg, where));
    assert_true(tu_contains(msg, cases[i].what));
    free(p);
  }
}

static void test_skip_bad(void **state) {
  (void)state;
  struct ferry_trace_options o = {.skip_bad = 1};
  ferry_trace *t = open_data("traces/malformed/azure_tokens_not_integer.csv", &o);
  assert_int_equal(ferry_trace_count(t), 3);
  assert_int_equal(ferry_trace_skipped(t), 1);
  assert_true(tu_contains(ferry_trace_errmsg(t), "azure_tokens_not_integer.csv:4: "));
  assert_int_equal(ferry_trace_request(t, 2)->id, 3); /* ids count the skipped row */
  ferry_trace_free(t);
  t = open_data("traces/malformed/mooncake_truncated_json.jsonl", &o);
  assert_int_equal(ferry_trace_count(t), 3);
  assert_int_equal(ferry_trace_skipped(t), 1);
  ferry_trace_free(t);
  /* Skipping cannot rescue a file with no rows. */
  char *p = tu_data_path("traces/malformed/azure_header_only.csv");
  assert_int_equal(ferry_trace_open(&t, p, &o), FERRY_ERR_FORMAT);
  free(p);
}

static void test_generated_bad_files(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("traces");
  char path[512];
  ferry_trace *t;
  /* A line over 1 MiB is an error, not a truncation. */
  size_t n = FERRY_TRACE_MAX_LINE_BYTES + 100;
  char *big = malloc(n + 200);
  assert_non_null(big);
  int k = snprintf(big, 200, "{\"arrival_ns\":0,\"prompt_tokens\":1,\"output_tokens\":1}\n{\"pad\":\"");
  memset(big + k, 'x', n);
  memcpy(big + k + n, "\"}\n", 3);
  snprintf(path, sizeof path, "%s/long.jsonl", dir);
  tu_write_file(path, big, (size_t)k + n + 3);
  assert_int_equal(ferry_trace_open(&t, path, NULL), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "long.jsonl:2: line longer than 1048576 bytes"));
  free(big);

  static const char nul[] = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,1\0,2\n";
  snprintf(path, sizeof path, "%s/nul.csv", dir);
  tu_write_file(path, nul, sizeof nul - 1);
  assert_int_equal(ferry_trace_open(&t, path, NULL), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "nul.csv:2: NUL byte at column 24"));

  snprintf(path, sizeof path, "%s/missing.csv", dir);
  assert_int_equal(ferry_trace_open(&t, path, NULL), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "missing.csv"));

  /* A UTF-8 byte-order mark before the header is skipped. */
  static const char bom[] = "\xEF\xBB\xBFTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,1,2\n";
  snprintf(path, sizeof path, "%s/bom.csv", dir);
  tu_write_file(path, bom, sizeof bom - 1);
  assert_int_equal(ferry_trace_open(&t, path, NULL), FERRY_OK);
  assert_int_equal(ferry_trace_count(t), 1);
  ferry_trace_free(t);
  tu_rmtree(dir);
  free(dir);
}

static void test_forced_format(void **state) {
  (void)state;
  struct ferry_trace_options o = {.format = FERRY_TRACE_BURSTGPT};
  char *p = tu_data_path("traces/azure_conv_200.csv");
  ferry_trace *t;
  assert_int_equal(ferry_trace_open(&t, p, &o), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "azure_conv_200.csv:1: not a BurstGPT header"));
  o.format = FERRY_TRACE_AZURE;
  assert_int_equal(ferry_trace_open(&t, p, &o), FERRY_OK);
  assert_int_equal(ferry_trace_count(t), 200);
  ferry_trace_free(t);
  o.format = FERRY_TRACE_JSONL;
  assert_int_equal(ferry_trace_open(&t, p, &o), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), ":2: invalid JSON") || tu_contains(ferry_last_error(), ":1: "));
  free(p);
  enum ferry_trace_format f;
  assert_int_equal(ferry_trace_format_parse("mooncake", &f), FERRY_OK);
  assert_int_equal(f, FERRY_TRACE_MOONCAKE);
  assert_int_equal(ferry_trace_format_parse("csv", &f), FERRY_ERR_INVALID);
  assert_string_equal(ferry_trace_format_name(FERRY_TRACE_BURSTGPT), "burstgpt");
  assert_string_equal(ferry_trace_format_name((enum ferry_trace_format)99), "unknown");
}

/* ---- internals: exact time parsing ------------------------------------------------------ */

static void test_time_parsers(void **state) {
  (void)state;
  assert_int_equal(ferry__days_from_civil(1970, 1, 1), 0);
  assert_int_equal(ferry__days_from_civil(2000, 3, 1), 11017);
  assert_int_equal(ferry__days_from_civil(2023, 11, 16), 19677);
  int64_t ns;
  assert_int_equal(ferry__parse_wallclock_ns("2023-11-16 18:15:46.6805900", &ns), 0);
  assert_int_equal(ns, 1700158546680590000LL);
  assert_int_equal(ferry__parse_wallclock_ns("2024-02-29T00:00:00", &ns), 0);
  assert_int_equal(ferry__parse_wallclock_ns("2023-02-29 00:00:00", &ns), -1);
  assert_int_equal(ferry__parse_wallclock_ns("2023-11-16 24:00:00", &ns), -1);
  assert_int_equal(ferry__parse_wallclock_ns("2023-11-16 18:15:46.", &ns), -1);
  assert_int_equal(ferry__parse_wallclock_ns("2023-11-16 18:15:46.1234567891", &ns), -1);
  assert_int_equal(ferry__parse_wallclock_ns("2023-11-16 18:15:46 ", &ns), -1);
  assert_int_equal(ferry__parse_decimal_ns("1.5", 1000000000, &ns), 0);
  assert_int_equal(ns, 1500000000);
  assert_int_equal(ferry__parse_decimal_ns("0.0000000015", 1000000000, &ns), 0);
  assert_int_equal(ns, 2); /* rounded half up */
  assert_int_equal(ferry__parse_decimal_ns("7", 1000000, &ns), 0);
  assert_int_equal(ns, 7000000);
  assert_int_equal(ferry__parse_decimal_ns("-1", 1000000000, &ns), -1);
  assert_int_equal(ferry__parse_decimal_ns("1.", 1000000000, &ns), -1);
  assert_int_equal(ferry__parse_decimal_ns("99999999999999999999", 1000000000, &ns), -1);
  int32_t v;
  assert_int_equal(ferry__parse_tokens("2147483647", &v), 0);
  assert_int_equal(ferry__parse_tokens("2147483648", &v), -2);
  assert_int_equal(ferry__parse_tokens("", &v), -1);
  assert_int_equal(ferry__parse_tokens("+1", &v), -1);
}

/* ---- slicing ---------------------------------------------------------------------------- */

static void test_slicing(void **state) {
  (void)state;
  ferry_trace *all = open_data("traces/azure_conv_200.csv", NULL);
  const int64_t s = 10000000000LL, e = 30000000000LL;
  size_t expect = 0, first = SIZE_MAX;
  for (size_t i = 0; i < ferry_trace_count(all); i++) {
    int64_t a = ferry_trace_request(all, i)->arrival_ns;
    if (a >= s && a < e) {
      if (first == SIZE_MAX) first = i;
      expect++;
    }
  }
  assert_true(expect > 10 && expect < 190);
  struct ferry_trace_options o = {.window_start_ns = s, .window_end_ns = e};
  ferry_trace *w = open_data("traces/azure_conv_200.csv", &o);
  assert_int_equal(ferry_trace_count(w), expect);
  assert_int_equal(ferry_trace_request(w, 0)->arrival_ns, ferry_trace_request(all, first)->arrival_ns - s);
  assert_int_equal(ferry_trace_request(w, 0)->id, ferry_trace_request(all, first)->id);
  ferry_trace_free(w);

  o = (struct ferry_trace_options){.rate_scale = 2.0};
  w = open_data("traces/azure_conv_200.csv", &o);
  assert_int_equal(ferry_trace_count(w), 200);
  for (size_t i = 0; i < 200; i++)
    assert_int_equal(ferry_trace_request(w, i)->arrival_ns, (int64_t)nearbyint(ferry_trace_request(all, i)->arrival_ns / 2.0));
  ferry_trace_free(w);

  o = (struct ferry_trace_options){.max_requests = 5, .window_start_ns = s, .rate_scale = 0.5};
  w = open_data("traces/azure_conv_200.csv", &o);
  assert_int_equal(ferry_trace_count(w), 5);
  for (size_t i = 0; i < 5; i++) {
    const struct ferry_request *a = ferry_trace_request(all, first + i), *b = ferry_trace_request(w, i);
    assert_int_equal(b->arrival_ns, (a->arrival_ns - s) * 2);
    assert_int_equal(b->prompt_tokens, a->prompt_tokens);
  }
  ferry_trace_free(w);

  char *p = tu_data_path("traces/azure_conv_200.csv");
  o = (struct ferry_trace_options){.window_start_ns = 500000000000LL};
  assert_int_equal(ferry_trace_open(&w, p, &o), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "no requests in the time window"));
  o = (struct ferry_trace_options){.window_start_ns = 5, .window_end_ns = 5};
  assert_int_equal(ferry_trace_open(&w, p, &o), FERRY_ERR_INVALID);
  o = (struct ferry_trace_options){.rate_scale = -1};
  assert_int_equal(ferry_trace_open(&w, p, &o), FERRY_ERR_INVALID);
  o = (struct ferry_trace_options){.rate_scale = NAN};
  assert_int_equal(ferry_trace_open(&w, p, &o), FERRY_ERR_INVALID);
  free(p);
  ferry_trace_free(all);
}

/* ---- JSONL round trip ------------------------------------------------------------------- */

static void test_jsonl_roundtrip(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("traces");
  char path[512];
  snprintf(path, sizeof path, "%s/out.jsonl", dir);
  const char *srcs[] = {"traces/mooncake_conv_200.jsonl", "traces/azure_code_200.csv", "traces/burstgpt_small.csv"};
  for (int k = 0; k < 3; k++) {
    ferry_trace *a = open_data(srcs[k], NULL);
    assert_int_equal(ferry_trace_write_jsonl(a, path), FERRY_OK);
    ferry_trace *b;
    assert_int_equal(ferry_trace_open(&b, path, NULL), FERRY_OK);
    assert_int_equal(ferry_trace_get_format(b), FERRY_TRACE_JSONL);
    assert_int_equal(ferry_trace_count(a), ferry_trace_count(b));
    for (size_t i = 0; i < ferry_trace_count(a); i++) {
      const struct ferry_request *ra = ferry_trace_request(a, i), *rb = ferry_trace_request(b, i);
      assert_int_equal(ra->id, rb->id);
      assert_int_equal(ra->arrival_ns, rb->arrival_ns);
      assert_int_equal(ra->prompt_tokens, rb->prompt_tokens);
      assert_int_equal(ra->output_tokens, rb->output_tokens);
      assert_int_equal(ra->n_hash_ids, rb->n_hash_ids);
      int32_t na, nb;
      const int64_t *ha = ferry_trace_hash_ids(a, i, &na), *hb = ferry_trace_hash_ids(b, i, &nb);
      assert_int_equal(na, nb);
      if (na) assert_memory_equal(ha, hb, (size_t)na * sizeof *ha);
    }
    ferry_trace_free(a);
    ferry_trace_free(b);
  }
  tu_rmtree(dir);
  free(dir);
}

/* A trace spanning more than 2^53 ns (found by fuzz_trace_azure: a year between two rows) is
 * refused, since ferry JSONL could not hold it; up to 2^53 it converts and reads back. */
static void test_span_limit(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("traces");
  char path[512], out[512];
  snprintf(path, sizeof path, "%s/year.csv", dir);
  snprintf(out, sizeof out, "%s/year.jsonl", dir);
  static const char year[] = "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-11-16 18:15:46.6805900,374,44\n"
                             "2023-11-16 18:15:50.9951690,396,109\n";
  tu_write_file(path, year, sizeof year - 1);
  ferry_trace *t;
  assert_int_equal(ferry_trace_open(&t, path, NULL), FERRY_ERR_RANGE);
  assert_true(tu_contains(ferry_last_error(), "year.csv: request 0 arrives 366.0 days after the first"));
  /* the window that keeps the first 100 days of it is fine, and round-trips through JSONL */
  struct ferry_trace_options o = {.window_end_ns = 100 * 86400000000000LL};
  assert_int_equal(ferry_trace_open(&t, path, &o), FERRY_OK);
  assert_int_equal(ferry_trace_write_jsonl(t, out), FERRY_OK);
  ferry_trace *back;
  assert_int_equal(ferry_trace_open(&back, out, NULL), FERRY_OK);
  assert_int_equal(ferry_trace_count(back), 1);
  ferry_trace_free(back);
  ferry_trace_free(t);
  static const char edge[] = "{\"arrival_ns\":0,\"prompt_tokens\":1,\"output_tokens\":1}\n"
                             "{\"arrival_ns\":9007199254740992,\"prompt_tokens\":1,\"output_tokens\":1}\n";
  tu_write_file(out, edge, sizeof edge - 1);
  assert_int_equal(ferry_trace_open(&t, out, NULL), FERRY_OK);
  assert_int_equal(ferry_trace_request(t, 1)->arrival_ns, FERRY_TRACE_MAX_SPAN_NS);
  ferry_trace_free(t);
  tu_rmtree(dir);
  free(dir);
}

/* ---- full shared trace ------------------------------------------------------------------ */

static void test_shared_azure_conv(void **state) {
  (void)state;
  char *p = tu_shared_path("traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv");
  if (!p) {
    fprintf(stderr, "skipped: shared Azure conv trace not found (set FERRY_SHARED)\n");
    skip();
  }
  ferry_trace *t;
  assert_int_equal(ferry_trace_open(&t, p, NULL), FERRY_OK);
  assert_int_equal(ferry_trace_count(t), 19366);
  assert_int_equal(ferry_trace_request(t, 19365)->arrival_ns, 3501721937000LL);
  struct ferry_trace_stats s;
  assert_int_equal(ferry_trace_get_stats(t, &s), FERRY_OK);
  assert_int_equal(s.prompt.sum, 22361870);
  assert_int_equal(s.output.sum, 4088665);
  assert_int_equal(s.prompt.max, 14050);
  assert_int_equal(s.prompt.p50, 1020);
  assert_int_equal(s.output.max, 1000);
  assert_int_equal(s.out_of_order, 0);
  assert_true(fabs(s.rate_per_s - 5.53) < 0.005);
  ferry_trace_free(t);
  struct ferry_trace_options o = {.window_start_ns = 600000000000LL, .window_end_ns = 1200000000000LL};
  assert_int_equal(ferry_trace_open(&t, p, &o), FERRY_OK);
  assert_int_equal(ferry_trace_count(t), 3118);
  assert_int_equal(ferry_trace_request(t, 0)->arrival_ns, 197636000);
  ferry_trace_free(t);
  free(p);
}

/* ---- synthetic -------------------------------------------------------------------------- */

static char *jsonl_bytes(const ferry_trace *t, const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/synth.jsonl", dir);
  assert_int_equal(ferry_trace_write_jsonl(t, path), FERRY_OK);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = '\0';
  fclose(f);
  return b;
}

static void test_synthetic_determinism(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("synth");
  const char *spec = "arrivals=gamma,cv=2,rate=4,n=1000,prompt=lognormal:512:0.6,output=uniform:16:256";
  ferry_trace *a, *b, *c;
  assert_int_equal(ferry_trace_synthetic(&a, spec, 42), FERRY_OK);
  assert_int_equal(ferry_trace_synthetic(&b, spec, 42), FERRY_OK);
  assert_int_equal(ferry_trace_synthetic(&c, spec, 43), FERRY_OK);
  assert_int_equal(ferry_trace_get_format(a), FERRY_TRACE_SYNTHETIC);
  char *ba = jsonl_bytes(a, dir), *bb = jsonl_bytes(b, dir), *bc = jsonl_bytes(c, dir);
  assert_string_equal(ba, bb);
  assert_true(strcmp(ba, bc) != 0);
  free(ba);
  free(bb);
  free(bc);
  /* Separate streams: a different length distribution leaves arrivals unchanged. */
  ferry_trace *d;
  assert_int_equal(ferry_trace_synthetic(&d, "arrivals=gamma,cv=2,rate=4,n=1000,prompt=77,output=uniform:16:256", 42),
                   FERRY_OK);
  for (size_t i = 0; i < 1000; i++) {
    assert_int_equal(ferry_trace_request(a, i)->arrival_ns, ferry_trace_request(d, i)->arrival_ns);
    assert_int_equal(ferry_trace_request(a, i)->output_tokens, ferry_trace_request(d, i)->output_tokens);
    assert_int_equal(ferry_trace_request(d, i)->prompt_tokens, 77);
    int32_t o = ferry_trace_request(a, i)->output_tokens;
    assert_true(o >= 16 && o <= 256);
    assert_true(ferry_trace_request(a, i)->prompt_tokens >= 1);
  }
  ferry_trace_free(a);
  ferry_trace_free(b);
  ferry_trace_free(c);
  ferry_trace_free(d);
  tu_rmtree(dir);
  free(dir);
}

static void gap_moments(const ferry_trace *t, double *mean_s, double *cv) {
  size_t n = ferry_trace_count(t);
  double s = 0, sq = 0;
  for (size_t i = 1; i < n; i++) {
    double g = (ferry_trace_request(t, i)->arrival_ns - ferry_trace_request(t, i - 1)->arrival_ns) / 1e9;
    s += g;
    sq += g * g;
  }
  double m = s / (double)(n - 1);
  *mean_s = m;
  *cv = sqrt(sq / (double)(n - 1) - m * m) / m;
}

static void test_synthetic_statistics(void **state) {
  (void)state;
  ferry_trace *t;
  double mean, cv;
  assert_int_equal(ferry_trace_synthetic(&t, "rate=4,n=100000", 7), FERRY_OK);
  struct ferry_trace_stats s;
  ferry_trace_get_stats(t, &s);
  assert_int_equal(s.count, 100000);
  assert_true(fabs(s.rate_per_s / 4.0 - 1) < 0.02);
  gap_moments(t, &mean, &cv);
  assert_true(fabs(cv - 1.0) < 0.03); /* exponential: CV 1 */
  assert_int_equal(s.prompt.min, 512);
  assert_int_equal(s.output.max, 128);
  ferry_trace_free(t);

  assert_int_equal(ferry_trace_synthetic(&t, "arrivals=gamma,cv=2,rate=10,n=200000,prompt=lognormal:1000:0.5", 7),
                   FERRY_OK);
  gap_moments(t, &mean, &cv);
  assert_true(fabs(mean * 10 - 1) < 0.03);
  assert_true(fabs(cv / 2.0 - 1) < 0.05);
  ferry_trace_get_stats(t, &s);
  assert_true(labs((long)s.prompt.p50 - 1000) < 20);
  ferry_trace_free(t);

  assert_int_equal(ferry_trace_synthetic(&t, "arrivals=uniform,rate=3,n=4", 1), FERRY_OK);
  assert_int_equal(ferry_trace_request(t, 1)->arrival_ns, 333333333);
  assert_int_equal(ferry_trace_request(t, 3)->arrival_ns, 1000000000);
  ferry_trace_free(t);
}

/* Synthetic traces are generated lazily: n=1e8 with max_requests 3 stores three requests
 * (it used to build all 1e8 first, several GB), and a sliced synthetic trace equals the whole
 * trace sliced afterwards. */
static void test_synthetic_lazy(void **state) {
  (void)state;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const long rss0_kb = ru.ru_maxrss;
  ferry_trace *t = NULL, *full = NULL;
  struct ferry_trace_options o = {.max_requests = 3};
  assert_int_equal(ferry_trace_synthetic_open(&t, "n=100000000,prompt=uniform:1:900", 5, &o), FERRY_OK);
  assert_int_equal(ferry_trace_count(t), 3);
  getrusage(RUSAGE_SELF, &ru);
  assert_true(ru.ru_maxrss - rss0_kb < 64 * 1024); /* 1e8 requests are 2.4 GB */
  assert_int_equal(ferry_trace_synthetic(&full, "n=1000,prompt=uniform:1:900", 5), FERRY_OK);
  for (size_t i = 0; i < 3; i++) { /* field by field: the struct has padding */
    const struct ferry_request *a = ferry_trace_request(t, i), *b = ferry_trace_request(full, i);
    assert_int_equal(a->id, b->id);
    assert_int_equal(a->arrival_ns, b->arrival_ns);
    assert_int_equal(a->prompt_tokens, b->prompt_tokens);
    assert_int_equal(a->output_tokens, b->output_tokens);
    assert_int_equal(a->n_hash_ids, b->n_hash_ids);
  }
  ferry_trace_free(t);

  /* window [100 s, 200 s), twice the rate, first 40: as ferry__trace_finish() slices */
  o = (struct ferry_trace_options){.window_start_ns = 100000000000LL, .window_end_ns = 200000000000LL,
                                   .rate_scale = 2.0, .max_requests = 40};
  assert_int_equal(ferry_trace_synthetic_open(&t, "n=1000,prompt=uniform:1:900", 5, &o), FERRY_OK);
  size_t k = 0;
  for (size_t i = 0; i < ferry_trace_count(full) && k < 40; i++) {
    const struct ferry_request *r = ferry_trace_request(full, i);
    if (r->arrival_ns < o.window_start_ns) continue;
    if (r->arrival_ns >= o.window_end_ns) break;
    const struct ferry_request *q = ferry_trace_request(t, k++);
    assert_non_null(q);
    assert_int_equal(q->id, r->id);
    assert_int_equal(q->prompt_tokens, r->prompt_tokens);
    assert_int_equal(q->arrival_ns, (int64_t)nearbyint((double)(r->arrival_ns - o.window_start_ns) / 2.0));
  }
  assert_int_equal(ferry_trace_count(t), k);
  assert_true(k > 10);
  ferry_trace_free(t);
  ferry_trace_free(full);

  /* a window past the last arrival, and a file format, are errors */
  o = (struct ferry_trace_options){.window_start_ns = 1000000000000000LL};
  assert_int_equal(ferry_trace_synthetic_open(&t, "n=10", 5, &o), FERRY_ERR_FORMAT);
  assert_null(t);
  assert_true(strstr(ferry_last_error(), "no requests in the time window") != NULL);
  o = (struct ferry_trace_options){.format = FERRY_TRACE_AZURE};
  assert_int_equal(ferry_trace_synthetic_open(&t, "n=10", 5, &o), FERRY_ERR_INVALID);
}

static void test_synthetic_resample(void **state) {
  (void)state;
  char *p = tu_data_path("traces/azure_conv_200.csv");
  char spec[1024];
  snprintf(spec, sizeof spec, "n=500,prompt=resample:%s,output=resample:%s", p, p);
  ferry_trace *src = open_data("traces/azure_conv_200.csv", NULL), *t;
  assert_int_equal(ferry_trace_synthetic(&t, spec, 3), FERRY_OK);
  for (size_t i = 0; i < 500; i++) {
    const struct ferry_request *r = ferry_trace_request(t, i);
    int found = 0;
    for (size_t j = 0; j < 200 && !found; j++)
      found = ferry_trace_request(src, j)->prompt_tokens == r->prompt_tokens &&
              ferry_trace_request(src, j)->output_tokens == r->output_tokens;
    assert_true(found); /* pairs drawn jointly */
  }
  ferry_trace_free(t);
  ferry_trace_free(src);
  snprintf(spec, sizeof spec, "n=5,prompt=resample:%s.missing", p);
  assert_int_equal(ferry_trace_synthetic(&t, spec, 3), FERRY_ERR_NOT_FOUND);
  free(p);
}

static void test_synthetic_errors(void **state) {
  (void)state;
  ferry_trace *t;
  assert_int_equal(ferry_trace_synthetic(&t, "rate=2,burst=3", 1), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "unknown key 'burst'"));
  assert_true(tu_contains(ferry_last_error(), "arrivals, rate, cv, n, prompt, output"));
  assert_int_equal(ferry_trace_synthetic(&t, "rate=0", 1), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "rate='0'"));
  assert_int_equal(ferry_trace_synthetic(&t, "cv=2", 1), FERRY_ERR_INVALID);
  assert_int_equal(ferry_trace_synthetic(&t, "n=0", 1), FERRY_ERR_INVALID);
  assert_int_equal(ferry_trace_synthetic(&t, "arrivals=weibull", 1), FERRY_ERR_INVALID);
  assert_int_equal(ferry_trace_synthetic(&t, "prompt=uniform:9:3", 1), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "prompt='uniform:9:3'"));
  assert_int_equal(ferry_trace_synthetic(&t, "output=lognormal:0:1", 1), FERRY_ERR_INVALID);
  assert_int_equal(ferry_trace_synthetic(&t, "output=zipf:1:2", 1), FERRY_ERR_INVALID);
  assert_int_equal(ferry_trace_synthetic(&t, "output=-4", 1), FERRY_ERR_INVALID);
  assert_int_equal(ferry_trace_synthetic(&t, "norate", 1), FERRY_ERR_INVALID);
  assert_int_equal(ferry_trace_synthetic(&t, "", 1), FERRY_OK); /* all defaults */
  assert_int_equal(ferry_trace_count(t), 100);
  ferry_trace_free(t);
  ferry_trace_free(NULL);
}

/* ---- allocation failures ---------------------------------------------------------------- */

static void test_alloc_failures(void **state) {
  (void)state;
  char *p = tu_data_path("traces/mooncake_conv_200.jsonl");
  struct ferry_trace_options o = {.window_start_ns = 1};
  int failed = 0;
  for (int64_t n = 0; n < 3000; n++) {
    ferry_trace *t = NULL;
    ferry_alloc_fail_after(n);
    ferry_status st = ferry_trace_open(&t, p, &o);
    ferry_alloc_fail_after(-1);
    if (st == FERRY_OK) {
      assert_int_equal(ferry_trace_count(t), 200 - 10);
      ferry_trace_free(t);
      break;
    }
    /* cJSON reports an allocation failure as a parse failure, so FORMAT is possible too. */
    assert_true(st == FERRY_ERR_NOMEM || st == FERRY_ERR_FORMAT);
    assert_null(t);
    failed++;
  }
  assert_true(failed > 10);
  ferry_trace *t = NULL;
  for (int64_t n = 0; n < 50; n++) {
    ferry_alloc_fail_after(n);
    ferry_status st = ferry_trace_synthetic(&t, "n=5000", 1);
    ferry_alloc_fail_after(-1);
    if (st == FERRY_OK) break;
    assert_int_equal(st, FERRY_ERR_NOMEM);
  }
  assert_int_equal(ferry_trace_count(t), 5000);
  ferry_trace_free(t);
  free(p);
}

/* ---- command line ----------------------------------------------------------------------- */

static void test_cli(void **state) {
  (void)state;
  char *data = tu_data_path("traces");
  char *dir = tu_mkdtemp("tracecli");
  char args[2048];
  char *out = NULL;
  snprintf(args, sizeof args, "trace stats '%s/azure_conv_200.csv'", data);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "requests       200"));
  assert_true(tu_contains(out, "(azure)"));
  assert_true(tu_contains(out, "span           61.264 s"));
  free(out);
  snprintf(args, sizeof args, "trace stats '%s/azure_conv_200.csv' --time-window 10:30 --rate-scale 2 --max-requests 7",
           data);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "requests       7\n"));
  free(out);
  snprintf(args, sizeof args, "trace stats '%s/malformed/azure_tokens_not_integer.csv'", data);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "ferry: "));
  assert_true(tu_contains(out, "azure_tokens_not_integer.csv:4: ContextTokens 'abc'"));
  free(out);
  snprintf(args, sizeof args, "trace stats '%s/malformed/azure_tokens_not_integer.csv' --skip-bad", data);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "1 malformed"));
  free(out);
  snprintf(args, sizeof args, "trace convert '%s/mooncake_conv_200.jsonl' --out '%s/m.jsonl'", data, dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "trace stats '%s/m.jsonl'", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "requests       200"));
  assert_true(tu_contains(out, "(jsonl)"));
  free(out);
  snprintf(args, sizeof args, "trace synth rate=2,n=10 --seed 5 --out '%s/s.jsonl'", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  assert_int_equal(tu_run_ferry("trace synth rate=2,n=3 --seed 5", &out), 0);
  assert_true(tu_contains(out, "{\"req_id\":2,"));
  free(out);
  assert_int_equal(tu_run_ferry("trace synth rate=2,bogus=1", &out), 1);
  assert_true(tu_contains(out, "unknown key 'bogus'"));
  free(out);
  assert_int_equal(tu_run_ferry("trace stats --help", &out), 0);
  assert_true(tu_contains(out, "--time-window"));
  free(out);
  assert_int_equal(tu_run_ferry("trace stats x --frobnicate", &out), 2);
  free(out);
  assert_int_equal(tu_run_ferry("trace stats x --time-window 5:2", &out), 2);
  free(out);
  assert_int_equal(tu_run_ferry("trace", &out), 2);
  free(out);
  tu_rmtree(dir);
  free(dir);
  free(data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_azure_slices),
      cmocka_unit_test(test_mooncake_slice),
      cmocka_unit_test(test_burstgpt),
      cmocka_unit_test(test_crlf_and_jsonl),
      cmocka_unit_test(test_out_of_order_sorted_stably),
      cmocka_unit_test(test_malformed_corpus),
      cmocka_unit_test(test_skip_bad),
      cmocka_unit_test(test_generated_bad_files),
      cmocka_unit_test(test_forced_format),
      cmocka_unit_test(test_time_parsers),
      cmocka_unit_test(test_slicing),
      cmocka_unit_test(test_jsonl_roundtrip),
      cmocka_unit_test(test_span_limit),
      cmocka_unit_test(test_shared_azure_conv),
      cmocka_unit_test(test_synthetic_determinism),
      cmocka_unit_test(test_synthetic_statistics),
      cmocka_unit_test(test_synthetic_lazy),
      cmocka_unit_test(test_synthetic_resample),
      cmocka_unit_test(test_synthetic_errors),
      cmocka_unit_test(test_alloc_failures),
      cmocka_unit_test(test_cli),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
