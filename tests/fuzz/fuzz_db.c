/* Fuzz target: a result database (an SQLite file), read as `ferry db list`, `db show`, `db diff`
 * and `db export-trace` read it, then loaded as `ferry report` loads it (the loader only: no
 * report folder is written and gnuplot is never run). Invariants: every listed run is found by
 * its id with the same columns, statistics are ordered and counted consistently, the metrics of
 * `db show` and `db diff` are distinct and list the disk writes and the peers' bytes exactly when
 * the run has them, the exported Perfetto trace is valid JSON, and the report loader sees the same
 * runs as the list. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"
#include "ferry/alloc.h"
#include "ferry/db.h"
#include "reports/report_internal.h"
#include "tests/fuzz/fuzz.h"

/* runs looked at in detail: enough for every seed, bounded for crafted files with thousands */
#define MAX_RUNS 8

static int same_str(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

static void check_dist(const struct ferry_dist *d) {
  FUZZ_CHECK(d->count >= 0);
  if (d->count == 0) return;
  FUZZ_CHECK(!(d->p50 > d->p90) && !(d->p90 > d->p99)); /* ordered (NaN only from NaN input) */
}

/* `db show --format json`'s metrics: within the caller's array, each named once, and the bytes a
 * run wrote to disk (schema 10) and received from its peers (schema 11) listed exactly when it has
 * them, with their value */
static void check_metrics(const struct ferry_run_stats *s) {
  struct ferry_metric_value v[FERRY_DB_MAX_METRICS];
  const size_t n = ferry_db_metrics(s, v);
  FUZZ_CHECK(n <= FERRY_DB_MAX_METRICS);
  int disk_write = 0, peers = 0;
  for (size_t i = 0; i < n; i++) {
    FUZZ_CHECK(memchr(v[i].name, '\0', sizeof v[i].name) != NULL);
    for (size_t j = 0; j < i; j++) FUZZ_CHECK(strcmp(v[i].name, v[j].name) != 0);
    if (!strcmp(v[i].name, "bytes_disk_write")) disk_write = v[i].value == (double)s->bytes_disk_write;
    if (!strcmp(v[i].name, "bytes_peers")) peers = v[i].value == (double)s->bytes_peers;
  }
  FUZZ_CHECK(disk_write == (s->bytes_disk_write != 0) && peers == (s->bytes_peers != 0));
}

static void check_export(ferry_db *db, int64_t id) {
  char path[256];
  snprintf(path, sizeof path, "%s/trace.json", fuzz_dir());
  if (ferry_db_export_trace(db, id, path) != FERRY_OK) return;
  cJSON *json = NULL;
  struct ferry_err err;
  FUZZ_CHECK(ferry__json_load(path, 64u << 20, &json, &err) == FERRY_OK); /* valid JSON */
  FUZZ_CHECK(cJSON_IsObject(json) && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(json, "traceEvents")));
  cJSON_Delete(json);
}

/* list, show, diff and export-trace; returns the number of runs listed, -1 when not readable */
static int64_t read_as_db_command(const char *path) {
  ferry_db *db = NULL;
  if (ferry_db_open(&db, path, FERRY_DB_READ_ONLY) != FERRY_OK) return -1;
  struct ferry_run_summary *runs = NULL;
  size_t n = 0;
  if (ferry_db_list_runs(db, &runs, &n) != FERRY_OK) {
    ferry_db_close(db);
    return -1;
  }
  struct ferry_run_stats first;
  int have_first = 0;
  for (size_t i = 0; i < n && i < MAX_RUNS; i++) {
    const struct ferry_run_summary *r = &runs[i];
    FUZZ_CHECK(memchr(r->kind, '\0', sizeof r->kind) != NULL && r->requests >= 0);
    struct ferry_run_summary *one = NULL;
    if (ferry_db_get_run(db, r->id, &one) == FERRY_OK) {
      FUZZ_CHECK(one->id == r->id && !strcmp(one->kind, r->kind) && same_str(one->model, r->model));
      FUZZ_CHECK(one->complete == r->complete && same_str(one->config_json, r->config_json));
      ferry_db_runs_free(one, 1);
    }
    struct ferry_run_stats s;
    if (ferry_db_run_stats(db, r->id, &s) == FERRY_OK) {
      FUZZ_CHECK(s.requests >= 0 && s.steps >= 0);
      FUZZ_CHECK(s.ttft_ns.count <= s.requests && s.e2e_ns.count <= s.requests && s.tpot_ns.count <= s.requests);
      check_dist(&s.ttft_ns);
      check_dist(&s.tpot_ns);
      check_dist(&s.e2e_ns);
      check_metrics(&s);
      if (have_first) {
        struct ferry_metric_delta d[FERRY_DB_MAX_METRICS];
        size_t nd = 0;
        const int regressed = ferry_db_compare(&first, &s, 5.0, d, &nd);
        FUZZ_CHECK(nd <= FERRY_DB_MAX_METRICS && regressed >= 0 && (size_t)regressed <= nd);
      } else {
        first = s;
        have_first = 1;
      }
    }
    struct ferry_device_info gpu;
    if (ferry_db_get_gpu(db, r->id, 0, &gpu) == FERRY_OK) FUZZ_CHECK(memchr(gpu.name, '\0', sizeof gpu.name) != NULL);
    if (i < 2) check_export(db, r->id);
  }
  ferry_db_runs_free(runs, n);
  ferry_db_close(db);
  return (int64_t)n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *written = fuzz_write("study.db", data, size);
  if (!written) return 0;
  char path[256], side[300];
  snprintf(path, sizeof path, "%s", written);
  /* no -wal or -shm of an earlier input may be read with this one */
  snprintf(side, sizeof side, "%s-wal", path);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", path);
  unlink(side);
  const int64_t listed = read_as_db_command(path);

  struct ferry_report_options opt;
  ferry_report_options_init(&opt);
  const char *paths[1] = {path};
  opt.db_paths = paths;
  opt.n_dbs = 1;
  struct report rp;
  memset(&rp, 0, sizeof rp);
  rp.opt = &opt;
  if (ferry__report_load(&rp) == FERRY_OK) {
    FUZZ_CHECK(rp.n_runs > 0 && rp.sum.runs == rp.n_runs && rp.sum.complete + rp.sum.failed == rp.n_runs);
    if (listed >= 0) FUZZ_CHECK((int64_t)rp.n_runs == listed);
    for (size_t i = 0; i < rp.n_runs; i++) {
      const struct rrun *r = &rp.runs[i];
      FUZZ_CHECK(r->cfg != NULL && r->n_req >= 0 && memchr(r->label, '\0', sizeof r->label) != NULL);
    }
    for (size_t a = 0; a < rp.n_axes; a++) FUZZ_CHECK(rp.axes[a].n >= 2); /* an axis is a key that varies */
  }
  ferry__report_unload(&rp);
  return 0;
}
