/* `ferry run/sim --repeat N` and `--format`: each repetition runs on a fresh copy of the
 * options (run_execute() applies machine defaults to them) as its own run of one repeat group,
 * and the summaries are printed as text (with mean +- standard deviation over repetitions,
 * as llama-bench does) or as one JSON document with a row per repetition. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/run_common.h"
#include "common/alloc.h"

static cJSON *latency_json(const struct ferry_latency_stats *l) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "n", (double)l->count);
  cli_json_num(o, "mean", l->mean * 1e-6);
  cli_json_num(o, "p50", l->p50 * 1e-6);
  cli_json_num(o, "p90", l->p90 * 1e-6);
  cli_json_num(o, "p99", l->p99 * 1e-6);
  cli_json_num(o, "max", l->max * 1e-6);
  return o;
}

static cJSON *tiers_json(const uint64_t *v) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "device", (double)v[FERRY_TIER_DEVICE]);
  cJSON_AddNumberToObject(o, "host", (double)v[FERRY_TIER_HOST]);
  cJSON_AddNumberToObject(o, "disk", (double)v[FERRY_TIER_DISK]);
  return o;
}

/* One repetition's summary; field names as in docs/output-formats.md (ferry.run.v1). */
static cJSON *summary_json(const struct ferry_serve_summary *s, int index, int64_t run_id) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "repetition", index);
  if (run_id > 0) cJSON_AddNumberToObject(o, "run_id", (double)run_id);
  else cJSON_AddNullToObject(o, "run_id");
  cJSON_AddNumberToObject(o, "requests_done", (double)s->requests_done);
  cJSON_AddNumberToObject(o, "requests_rejected", (double)s->requests_rejected);
  cJSON_AddNumberToObject(o, "steps", (double)s->steps);
  cJSON_AddNumberToObject(o, "tokens_generated", (double)s->tokens_generated);
  cJSON_AddNumberToObject(o, "duration_s", (double)s->duration_ns * 1e-9);
  cli_json_num(o, "tokens_per_s", s->tokens_per_s);
  cJSON_AddItemToObject(o, "ttft_ms", latency_json(&s->ttft));
  cJSON_AddItemToObject(o, "tpot_ms", latency_json(&s->tpot));
  cJSON_AddItemToObject(o, "e2e_ms", latency_json(&s->e2e));
  cJSON_AddItemToObject(o, "step_ms", latency_json(&s->step));
  cJSON_AddItemToObject(o, "peak_bytes", tiers_json(s->peak_bytes));
  cJSON_AddItemToObject(o, "budget_bytes", tiers_json(s->budget_bytes));
  cJSON *moved = cJSON_AddObjectToObject(o, "bytes_moved");
  cJSON_AddNumberToObject(moved, "disk_to_host", (double)s->bytes_disk);
  cJSON_AddNumberToObject(moved, "host_to_device", (double)s->bytes_h2d);
  cJSON_AddNumberToObject(moved, "device_to_host", (double)s->bytes_d2h);
  if (s->bytes_disk_write) cJSON_AddNumberToObject(moved, "host_to_disk", (double)s->bytes_disk_write); /* --kv-home disk */
  if (s->bytes_peers) cJSON_AddNumberToObject(moved, "peers_to_device", (double)s->bytes_peers); /* --zero-gpus N */
  cJSON_AddNumberToObject(o, "expert_hits", (double)s->hits);
  cJSON_AddNumberToObject(o, "expert_misses", (double)s->misses);
  cJSON_AddNumberToObject(o, "prefetches", (double)s->prefetches);
  cJSON_AddNumberToObject(o, "prefetches_used", (double)s->prefetches_used);
  cJSON_AddNumberToObject(o, "kv_capacity_tokens", (double)s->kv_capacity_tokens);
  cJSON_AddNumberToObject(o, "kv_peak_tokens", (double)s->kv_peak_tokens);
  if (s->kv_pool_blocks) { /* a paged cache */
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_paged");
    cJSON_AddNumberToObject(kv, "pool_blocks", (double)s->kv_pool_blocks);
    cJSON_AddNumberToObject(kv, "preemptions", (double)s->preemptions);
    cJSON_AddNumberToObject(kv, "swaps", (double)s->swaps);
    cJSON_AddNumberToObject(kv, "swap_bytes", (double)s->swap_bytes);
  }
  cJSON_AddNumberToObject(o, "stall_s", (double)s->stall_ns * 1e-9);
  cJSON_AddNumberToObject(o, "load_s", (double)s->load_ns * 1e-9);
  return o;
}

/* Mean and sample standard deviation over the repetitions, min and max beside. */
static void spread(const char *name, const char *unit, const double *v, int n) {
  double sum = 0, lo = v[0], hi = v[0];
  for (int i = 0; i < n; i++) {
    sum += v[i];
    lo = v[i] < lo ? v[i] : lo;
    hi = v[i] > hi ? v[i] : hi;
  }
  const double mean = sum / n;
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (v[i] - mean) * (v[i] - mean);
  const double sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
  printf("  %-14s %12.3f +- %-10.3f %s  (min %.3f, max %.3f, cv %.1f%%)\n", name, mean, sd, unit, lo, hi,
         mean ? 100.0 * sd / mean : 0.0);
}

static void print_spread(const struct ferry_serve_summary *s, int n) {
  double *v = ferry__calloc((size_t)n, sizeof *v);
  if (!v) return;
  printf("over %d repetitions: mean +- standard deviation\n", n);
#define SPREAD(label, unit, expr)            \
  do {                                       \
    for (int i = 0; i < n; i++) v[i] = (expr); \
    spread(label, unit, v, n);               \
  } while (0)
  SPREAD("TTFT p50", "ms", s[i].ttft.p50 * 1e-6);
  SPREAD("TPOT p50", "ms", s[i].tpot.p50 * 1e-6);
  SPREAD("e2e p99", "ms", s[i].e2e.p99 * 1e-6);
  SPREAD("throughput", "tok/s", s[i].tokens_per_s);
#undef SPREAD
  ferry_free(v);
}

int run_repeat(const struct run_args *given) {
  const int n = given->repeat > 0 ? (int)given->repeat : 1;
  char tag[96];
  const char *group = given->repeat_group;
  if (!group && n > 1 && given->db) {
    /* one tag per invocation: time and process id tell two invocations apart */
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(tag, sizeof tag, "repeat-%s-%d", when, (int)getpid());
    group = tag;
  }
  struct ferry_serve_summary *sums = ferry__calloc((size_t)n, sizeof *sums);
  int64_t *ids = ferry__calloc((size_t)n, sizeof *ids);
  cJSON *doc = NULL, *rows = NULL;
  int rc = CLI_OK, done = 0;
  if (!sums || !ids) {
    rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
    goto out;
  }
  if (given->output_format != CLI_FORMAT_TEXT) {
    doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "schema", "ferry.run.v1");
    cJSON_AddStringToObject(doc, "command", given->cmd);
    cli_json_str(doc, "database", given->db);
    cli_json_str(doc, "repeat_group", group);
    rows = cJSON_AddArrayToObject(doc, "runs");
  }
  for (int i = 0; i < n && rc == CLI_OK; i++) {
    struct run_args a = *given; /* run_execute() fills defaults in: every repetition starts afresh */
    a.repeat_index = i;
    a.group_tag = group;
    a.summary_out = given->plan_only ? NULL : &sums[i];
    if (n > 1 && given->progress) fprintf(stderr, "ferry: repetition %d of %d\n", i + 1, n);
    rc = run_execute(&a);
    if (rc != CLI_OK || given->plan_only) break;
    ids[i] = a.run_id_out;
    done++;
    if (rows) {
      cJSON_AddItemToArray(rows, summary_json(&sums[i], i, ids[i]));
    } else {
      if (n > 1) printf("repetition %d of %d%s", i + 1, n, ids[i] ? "" : "\n");
      if (n > 1 && ids[i]) printf(" (run %lld)\n", (long long)ids[i]);
      ferry_serve_summary_print(&sums[i], stdout);
    }
  }
  if (rc == CLI_OK && !given->plan_only) {
    if (doc) rc = cli_emit(stdout, doc, given->output_format == CLI_FORMAT_JSON ? NULL : "runs", given->output_format);
    else if (done > 1) print_spread(sums, done);
  }
out:
  cJSON_Delete(doc);
  ferry_free(sums);
  ferry_free(ids);
  return rc;
}
