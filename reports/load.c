/* Reading result databases for a report: open each read-only, refuse files that are not ferry
 * databases or come from a newer schema, load every run with its configuration and metrics
 * (latency percentiles, throughput, bytes, stall, peak memory), and find the sweep axes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "common/metrics.h"
#include "common/sqlite_read.h"
#include "common/json.h"
#include "ferry/db.h"
#include "reports/report_internal.h"


static ferry_status sql_fail(struct report *rp, sqlite3 *db, const char *path, const char *what) {
  return ferry__err_set(&rp->err, FERRY_ERR_DB, "%s: %s: %s", path, what, sqlite3_errmsg(db));
}

static ferry_status open_db(struct report *rp, const char *path, sqlite3 **out) {
  /* the same way in as ferry db: read-only folders, committed WAL content, the same refusals */
  return ferry__sqlite_open_read(path, FERRY_DB_APPLICATION_ID, FERRY_DB_SCHEMA_VERSION, out, NULL, &rp->err);
}

static char *col_str(sqlite3_stmt *q, int i) {
  const unsigned char *t = sqlite3_column_text(q, i);
  return t ? ferry__strdup((const char *)t) : NULL;
}

/* The run's metrics as `ferry run` and `ferry db show` print them (common/metrics.h), in ns,
 * then in the report's milliseconds; no samples: NaN (an empty cell). v is left sorted, in
 * milliseconds (the latency distributions draw it). */
static void dist(double *v, int64_t n, struct rdist *d) {
  struct ferry__dist x;
  ferry__dist_compute(v, n > 0 ? (size_t)n : 0, &x);
  for (int64_t i = 0; i < n; i++) v[i] /= 1e6;
  d->n = n;
  if (n <= 0) {
    d->mean = d->p50 = d->p90 = d->p99 = NAN;
    return;
  }
  d->mean = x.mean / 1e6;
  d->p50 = x.p50 / 1e6;
  d->p90 = x.p90 / 1e6;
  d->p99 = x.p99 / 1e6;
}

static ferry_status load_requests(struct report *rp, sqlite3 *db, const char *path, struct rrun *r) {
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(db,
                         "SELECT arrival_ns, first_token_ns, finish_ns, output_tokens FROM requests WHERE runId = ?",
                         -1, &q, NULL) != SQLITE_OK)
    return sql_fail(rp, db, path, "reading requests");
  sqlite3_bind_int64(q, 1, r->id);
  size_t cap = 0, n = 0;
  double *ttft = NULL, *tpot = NULL, *e2e = NULL;
  int64_t nt = 0, np = 0, ne = 0, first_arrival = INT64_MAX, last_finish = INT64_MIN;
  ferry_status st = FERRY_OK;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (n == cap) {
      cap = cap ? cap * 2 : 256;
      double *a = ferry__reallocarray(ttft, cap, sizeof *a);
      if (a) ttft = a;
      double *b = a ? ferry__reallocarray(tpot, cap, sizeof *b) : NULL;
      if (b) tpot = b;
      double *c = b ? ferry__reallocarray(e2e, cap, sizeof *c) : NULL;
      if (c) e2e = c;
      if (!c) {
        st = ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "%s: out of memory reading requests of run %lld", path,
                            (long long)r->id);
        goto out;
      }
    }
    n++;
    int64_t arr = sqlite3_column_int64(q, 0), ft = sqlite3_column_int64(q, 1), fin = sqlite3_column_int64(q, 2);
    int64_t out_tok = sqlite3_column_int64(q, 3);
    r->n_req++;
    /* a NULL time is no time; the database is untrusted: common/metrics.h takes differences as
     * doubles, sums saturate (common/checked.h) */
    if (sqlite3_column_type(q, 1) == SQLITE_NULL) ft = -1;
    if (sqlite3_column_type(q, 2) == SQLITE_NULL) fin = -1;
    struct ferry__request_latency lat;
    if (!ferry__request_latency(arr, ft, fin, out_tok, &lat)) continue;
    ttft[nt++] = lat.ttft_ns;
    e2e[ne++] = lat.e2e_ns;
    if (lat.has_tpot) tpot[np++] = lat.tpot_ns;
    r->out_tokens = ferry__sat_add_i64(r->out_tokens, out_tok);
    if (arr < first_arrival) first_arrival = arr;
    if (fin > last_finish) last_finish = fin;
  }
  if (rc != SQLITE_DONE) {
    st = sql_fail(rp, db, path, "reading requests");
    goto out;
  }
  dist(ttft, nt, &r->ttft);
  dist(tpot, np, &r->tpot);
  dist(e2e, ne, &r->e2e);
  /* sorted by dist(): kept for the latency distributions */
  r->lat[0] = ttft;
  r->lat[1] = tpot;
  r->lat[2] = e2e;
  r->n_lat[0] = nt;
  r->n_lat[1] = np;
  r->n_lat[2] = ne;
  ttft = tpot = e2e = NULL;
  r->thr_tok_s = ne && last_finish > first_arrival ? ferry__throughput_tok_s(r->out_tokens, first_arrival, last_finish) : NAN;
out:
  sqlite3_finalize(q);
  ferry_free(ttft);
  ferry_free(tpot);
  ferry_free(e2e);
  return st;
}

static ferry_status load_steps_memory(struct report *rp, sqlite3 *db, const char *path, struct rrun *r) {
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(db,
                         "SELECT count(*), total(bytes_disk), total(bytes_h2d), total(bytes_d2h), total(stall_ns), "
                         "total(hits), total(misses), total(tokens), min(start_ns), max(end_ns) FROM steps WHERE runId = ?",
                         -1, &q, NULL) != SQLITE_OK)
    return sql_fail(rp, db, path, "reading steps");
  sqlite3_bind_int64(q, 1, r->id);
  r->hit_rate_pct = NAN;
  if (sqlite3_step(q) == SQLITE_ROW) {
    r->n_steps = sqlite3_column_int64(q, 0);
    r->bytes_disk = ferry__finite_or(sqlite3_column_double(q, 1), NAN);
    r->bytes_h2d = ferry__finite_or(sqlite3_column_double(q, 2), NAN);
    r->bytes_d2h = ferry__finite_or(sqlite3_column_double(q, 3), NAN);
    r->stall_ms = ferry__finite_or(sqlite3_column_double(q, 4) / 1e6, NAN);
    r->hits = ferry__f64_to_i64(sqlite3_column_double(q, 5));
    r->misses = ferry__f64_to_i64(sqlite3_column_double(q, 6));
    r->tokens = ferry__f64_to_i64(sqlite3_column_double(q, 7));
    const double h = (double)r->hits, m = (double)r->misses;
    r->hit_rate_pct = h >= 0 && m >= 0 && h + m > 0 ? 100.0 * h / (h + m) : NAN;
    r->span_ms = r->n_steps ? ferry__span(sqlite3_column_int64(q, 8), sqlite3_column_int64(q, 9)) / 1e6 : 0;
  }
  sqlite3_finalize(q);
  if (sqlite3_prepare_v2(db, "SELECT tier, max(used_bytes), count(*) FROM memory WHERE runId = ? GROUP BY tier", -1, &q,
                         NULL) != SQLITE_OK)
    return sql_fail(rp, db, path, "reading memory");
  sqlite3_bind_int64(q, 1, r->id);
  while (sqlite3_step(q) == SQLITE_ROW) {
    const char *tier = (const char *)sqlite3_column_text(q, 0);
    int t = !tier ? -1 : !strcmp(tier, "device") ? 0 : !strcmp(tier, "host") ? 1 : !strcmp(tier, "disk") ? 2 : -1;
    if (t >= 0) r->peak_bytes[t] = ferry__finite_or(sqlite3_column_double(q, 1), 0);
    r->n_mem = ferry__sat_add_i64(r->n_mem, sqlite3_column_int64(q, 2));
  }
  sqlite3_finalize(q);
  /* the budgets the run had, defaults included (older databases have none: the configuration's),
   * its KV capacity, the simulator's weak fits and its provenance (docs/schema.md) */
  if (sqlite3_prepare_v2(db, "SELECT name, value FROM META_DATA_EXPORT WHERE runId = ? AND (name IN "
                             "('DEVICE_BUDGET_BYTES', 'HOST_BUDGET_BYTES', 'KV_CAPACITY_TOKENS', 'WEAK_FITS') OR name GLOB 'BUILD_*' "
                             "OR name GLOB 'MACHINE_*' OR name GLOB 'GPU_*' OR name GLOB 'CUDA_*')",
                         -1, &q, NULL) != SQLITE_OK)
    return sql_fail(rp, db, path, "reading the run's budgets");
  sqlite3_bind_int64(q, 1, r->id);
  static const struct {
    const char *name, *label;
    int prov;
  } facts[] = {{"BUILD_GIT_DESCRIBE", "", PROV_BUILD},      {"BUILD_COMPILER", "", PROV_BUILD},
               {"BUILD_TYPE", "", PROV_BUILD},              {"BUILD_BLAS", "", PROV_BLAS},
               {"MACHINE_CPU_MODEL", "", PROV_MACHINE},     {"MACHINE_CPU_CORES", "cores ", PROV_MACHINE},
               {"MACHINE_MEMORY_BYTES", "memory ", PROV_MACHINE}, {"MACHINE_KERNEL", "", PROV_MACHINE},
               {"GPU_NAME", "", PROV_GPU},                  {"GPU_DRIVER", "driver ", PROV_GPU},
               {"CUDA_RUNTIME", "CUDA ", PROV_GPU}};
  char *vals[sizeof facts / sizeof facts[0]] = {0};
  while (sqlite3_step(q) == SQLITE_ROW) {
    const char *name = (const char *)sqlite3_column_text(q, 0), *value = (const char *)sqlite3_column_text(q, 1);
    if (!name || !value) continue;
    if (!strcmp(name, "WEAK_FITS")) {
      ferry_free(r->weak_fits);
      r->weak_fits = ferry__strdup(value); /* untrusted text: the report's writers escape it */
    } else if (!strcmp(name, "DEVICE_BUDGET_BYTES") || !strcmp(name, "HOST_BUDGET_BYTES"))
      r->budget_bytes[!strcmp(name, "HOST_BUDGET_BYTES")] = ferry__finite_or(strtod(value, NULL), 0);
    else if (!strcmp(name, "KV_CAPACITY_TOKENS"))
      r->kv_capacity = ferry__finite_or(strtod(value, NULL), 0);
    for (size_t f = 0; f < sizeof facts / sizeof facts[0]; f++)
      if (!strcmp(name, facts[f].name) && !vals[f]) {
        char mem[64];
        if (!strcmp(name, "MACHINE_MEMORY_BYTES")) {
          snprintf(mem, sizeof mem, "%.1f GiB", strtod(value, NULL) / (double)(1ull << 30));
          value = mem;
        }
        vals[f] = ferry__asprintf("%s%s", facts[f].label, value);
      }
  }
  sqlite3_finalize(q);
  /* each provenance cell: its facts joined, in the table's order */
  for (int p = 0; p < 4; p++) {
    struct ferry_strbuf b = {0};
    for (size_t f = 0; f < sizeof facts / sizeof facts[0]; f++)
      if (facts[f].prov == p && vals[f]) ferry__sb_printf(&b, "%s%s", b.len ? ", " : "", vals[f]);
    r->prov[p] = b.oom ? NULL : b.p;
    if (b.oom) ferry_free(b.p);
  }
  for (size_t f = 0; f < sizeof facts / sizeof facts[0]; f++) ferry_free(vals[f]);
  return FERRY_OK;
}

/* Timeline row counts per run: one scan per table (the nsys tables have no runId index). */
static ferry_status load_timeline_counts(struct report *rp, sqlite3 *db, int dbi, const char *path) {
  static const char *const sql[2] = {"SELECT runId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY runId",
                                     "SELECT runId, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY runId"};
  for (int k = 0; k < 2; k++) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(db, sql[k], -1, &q, NULL) != SQLITE_OK) return sql_fail(rp, db, path, "reading the timeline");
    while (sqlite3_step(q) == SQLITE_ROW) {
      int64_t id = sqlite3_column_int64(q, 0);
      for (size_t i = 0; i < rp->n_runs; i++) {
        if (rp->runs[i].db != dbi || rp->runs[i].id != id) continue;
        if (k == 0) rp->runs[i].n_kernel = sqlite3_column_int64(q, 1);
        else rp->runs[i].n_memcpy = sqlite3_column_int64(q, 1);
      }
    }
    sqlite3_finalize(q);
  }
  return FERRY_OK;
}

/* The configuration object, with the run's columns standing in for keys it lacks (imports). */
static ferry_status run_config(struct report *rp, struct rrun *r, const char *json, const char *path) {
  cJSON *cfg = NULL;
  if (json && *json) {
    struct ferry_err ignore;
    if (ferry__json_parse(json, strlen(json), path, &cfg, &ignore) != FERRY_OK || !cJSON_IsObject(cfg)) {
      cJSON_Delete(cfg);
      cfg = NULL;
    }
  }
  if (!cfg) cfg = cJSON_CreateObject();
  if (!cfg) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
  if (!cJSON_GetObjectItemCaseSensitive(cfg, "executor")) cJSON_AddStringToObject(cfg, "executor", r->kind);
  if (!cJSON_GetObjectItemCaseSensitive(cfg, "hw") && r->hardware && strcmp(r->kind, "sim") == 0)
    cJSON_AddStringToObject(cfg, "hw", r->hardware);
  if (!cJSON_GetObjectItemCaseSensitive(cfg, "model") && r->model) cJSON_AddStringToObject(cfg, "model", r->model);
  if (!cJSON_GetObjectItemCaseSensitive(cfg, "trace") && r->trace) cJSON_AddStringToObject(cfg, "trace", r->trace);
  r->cfg = cfg;
  return FERRY_OK;
}

static ferry_status load_runs(struct report *rp, int dbi) {
  sqlite3 *db = rp->dbs[dbi];
  const char *path = rp->opt->db_paths[dbi];
  sqlite3_stmt *q;
  if (sqlite3_prepare_v2(db,
                         "SELECT id, kind, model, hardware, trace, config_json, config_hash, complete, error, notes "
                         "FROM runs ORDER BY id",
                         -1, &q, NULL) != SQLITE_OK)
    return sql_fail(rp, db, path, "reading runs");
  ferry_status st = FERRY_OK;
  int rc;
  size_t first = rp->n_runs;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    struct rrun *runs = ferry__reallocarray(rp->runs, rp->n_runs + 1, sizeof *runs);
    if (!runs) {
      st = ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory reading runs");
      break;
    }
    rp->runs = runs;
    struct rrun *r = &runs[rp->n_runs++];
    memset(r, 0, sizeof *r);
    r->db = dbi;
    r->id = sqlite3_column_int64(q, 0);
    if (rp->opt->n_dbs > 1) snprintf(r->label, sizeof r->label, "d%d.r%lld", dbi + 1, (long long)r->id);
    else snprintf(r->label, sizeof r->label, "r%lld", (long long)r->id);
    const unsigned char *kind = sqlite3_column_text(q, 1);
    snprintf(r->kind, sizeof r->kind, "%s", kind ? (const char *)kind : "?");
    r->model = col_str(q, 2);
    r->hardware = col_str(q, 3);
    r->trace = col_str(q, 4);
    r->config_hash = col_str(q, 6);
    r->complete = sqlite3_column_int(q, 7) == 1;
    r->error = col_str(q, 8);
    r->notes = col_str(q, 9);
    if ((st = run_config(rp, r, (const char *)sqlite3_column_text(q, 5), path)) != FERRY_OK) break;
  }
  if (st == FERRY_OK && rc != SQLITE_DONE) st = sql_fail(rp, db, path, "reading runs");
  sqlite3_finalize(q);
  for (size_t i = first; st == FERRY_OK && i < rp->n_runs; i++) {
    if ((st = load_requests(rp, db, path, &rp->runs[i])) != FERRY_OK) break;
    st = load_steps_memory(rp, db, path, &rp->runs[i]);
  }
  if (st == FERRY_OK) st = load_timeline_counts(rp, db, dbi, path);
  return st;
}

/* ---- configuration values --------------------------------------------------------------- */

int ferry__run_val(const struct rrun *r, const char *key, char *buf, size_t len) {
  buf[0] = '\0';
  const cJSON *v = r->cfg ? cJSON_GetObjectItemCaseSensitive(r->cfg, key) : NULL;
  if (!v || cJSON_IsNull(v)) return 0;
  if (cJSON_IsString(v)) snprintf(buf, len, "%s", v->valuestring);
  else if (cJSON_IsBool(v)) snprintf(buf, len, "%s", cJSON_IsTrue(v) ? "true" : "false");
  else if (cJSON_IsNumber(v)) snprintf(buf, len, "%.15g", v->valuedouble);
  else {
    char *t = cJSON_PrintUnformatted(v);
    snprintf(buf, len, "%s", t ? t : "?");
    cJSON_free(t);
  }
  return 1;
}

double ferry__run_num(const struct rrun *r, const char *key) {
  const cJSON *v = r->cfg ? cJSON_GetObjectItemCaseSensitive(r->cfg, key) : NULL;
  return v && cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : NAN;
}

static int listed(const char *key, const char *const *list) {
  for (; list && *list; list++)
    if (!strcmp(key, *list)) return 1;
  return 0;
}

int ferry__runs_same_except(const struct rrun *a, const struct rrun *b, const char *const *except) {
  char va[512], vb[512];
  for (int pass = 0; pass < 2; pass++) {
    const cJSON *obj = pass ? b->cfg : a->cfg;
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
      if (!it->string || listed(it->string, except)) continue;
      int ha = ferry__run_val(a, it->string, va, sizeof va), hb = ferry__run_val(b, it->string, vb, sizeof vb);
      if (ha != hb || strcmp(va, vb)) return 0;
    }
  }
  return 1;
}

const char *ferry__key_label(const char *key) {
  static const struct {
    const char *key, *label;
  } labels[] = {
      {"block_layers", "block size (layers per block)"},
      {"prefetch_depth", "prefetch depth (blocks in flight)"},
      {"device_budget", "device budget (bytes)"},
      {"host_budget", "host budget (bytes)"},
      {"max_batch", "max batch (sequences)"},
      {"max_step_tokens", "max tokens per step"},
      {"max_seq_tokens", "KV capacity (tokens per sequence)"},
      {"max_requests", "requests"},
      {"rate_scale", "arrival rate scale (x)"},
      {"time_scale", "arrival time scale (x)"},
      {"pin_first", "first layers pinned"},
      {"pin_last", "last layers pinned"},
      {"threads", "BLAS threads"},
      {"quant", "weight format"},
      {"predictor", "expert predictor"},
      {"hw", "hardware profile"},
      {"executor", "executor"},
  };
  for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++)
    if (!strcmp(key, labels[i].key)) return labels[i].label;
  return key;
}

/* ---- sweep axes --------------------------------------------------------------------------- */

static int cmp_num_str(const void *a, const void *b) {
  double x = strtod(*(char *const *)a, NULL), y = strtod(*(char *const *)b, NULL);
  return x < y ? -1 : x > y;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Axis order: the usual offload knobs first, then the rest by name, executor and hw last. */
static int key_rank(const char *k) {
  static const char *const order[] = {"block_layers", "prefetch_depth", "device_budget", "host_budget", "quant",
                                      "predictor", "max_batch"};
  for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++)
    if (!strcmp(k, order[i])) return i;
  if (!strcmp(k, "executor")) return 1000;
  if (!strcmp(k, "hw")) return 1001;
  return 100;
}

static int cmp_axis(const void *a, const void *b) {
  const struct raxis *x = a, *y = b;
  int rx = key_rank(x->key), ry = key_rank(y->key);
  return rx != ry ? rx - ry : strcmp(x->key, y->key);
}

static ferry_status find_axes(struct report *rp) {
  char v[512];
  for (size_t i = 0; i < rp->n_runs; i++) {
    if (!rp->runs[i].complete) continue;
    const cJSON *it;
    cJSON_ArrayForEach(it, rp->runs[i].cfg) {
      if (!it->string) continue;
      size_t a;
      for (a = 0; a < rp->n_axes; a++)
        if (!strcmp(rp->axes[a].key, it->string)) break;
      if (a == rp->n_axes) {
        struct raxis *ax = ferry__reallocarray(rp->axes, rp->n_axes + 1, sizeof *ax);
        if (!ax) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
        rp->axes = ax;
        memset(&ax[a], 0, sizeof ax[a]);
        ax[a].key = ferry__strdup(it->string);
        ax[a].numeric = 1;
        rp->n_axes++;
        if (!ax[a].key) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
      }
    }
  }
  /* distinct values per key, over the complete runs (a run without the key counts as "") */
  for (size_t a = 0; a < rp->n_axes; a++) {
    struct raxis *ax = &rp->axes[a];
    for (size_t i = 0; i < rp->n_runs; i++) {
      if (!rp->runs[i].complete) continue;
      ferry__run_val(&rp->runs[i], ax->key, v, sizeof v);
      if (!isfinite(ferry__run_num(&rp->runs[i], ax->key))) ax->numeric = 0;
      size_t k;
      for (k = 0; k < ax->n; k++)
        if (!strcmp(ax->vals[k], v)) break;
      if (k < ax->n) continue;
      char **vals = ferry__reallocarray(ax->vals, ax->n + 1, sizeof *vals);
      if (!vals) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
      ax->vals = vals;
      if (!(vals[ax->n] = ferry__strdup(v))) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
      ax->n++;
    }
    qsort(ax->vals, ax->n, sizeof *ax->vals, ax->numeric ? cmp_num_str : cmp_str);
  }
  /* keep only keys that vary */
  size_t w = 0;
  for (size_t a = 0; a < rp->n_axes; a++) {
    if (rp->axes[a].n > 1) {
      rp->axes[w++] = rp->axes[a];
      continue;
    }
    for (size_t k = 0; k < rp->axes[a].n; k++) ferry_free(rp->axes[a].vals[k]);
    ferry_free(rp->axes[a].vals);
    ferry_free(rp->axes[a].key);
  }
  rp->n_axes = w;
  if (rp->n_axes > 1) qsort(rp->axes, rp->n_axes, sizeof *rp->axes, cmp_axis); /* axes is NULL when none */
  rp->sum.axes = rp->n_axes;
  return FERRY_OK;
}

ferry_status ferry__report_load(struct report *rp) {
  const struct ferry_report_options *o = rp->opt;
  ferry__json_init();
  rp->dbs = ferry__calloc(o->n_dbs, sizeof *rp->dbs);
  if (!rp->dbs) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
  rp->n_dbs = o->n_dbs;
  ferry_status st;
  for (size_t i = 0; i < o->n_dbs; i++) {
    if ((st = open_db(rp, o->db_paths[i], &rp->dbs[i])) != FERRY_OK) return st;
    size_t before = rp->n_runs;
    if ((st = load_runs(rp, (int)i)) != FERRY_OK) return st;
    if (rp->n_runs == before)
      return ferry__err_set(&rp->err, FERRY_ERR_NOT_FOUND, "%s: no runs in the database (nothing to report)",
                            o->db_paths[i]);
  }
  for (size_t i = 0; i < rp->n_runs; i++) {
    rp->sum.runs++;
    if (rp->runs[i].complete) rp->sum.complete++;
    else rp->sum.failed++;
  }
  return find_axes(rp);
}

void ferry__report_unload(struct report *rp) {
  for (size_t i = 0; i < rp->n_runs; i++) {
    struct rrun *r = &rp->runs[i];
    ferry_free(r->model);
    ferry_free(r->hardware);
    ferry_free(r->trace);
    ferry_free(r->config_hash);
    ferry_free(r->error);
    ferry_free(r->notes);
    for (int k = 0; k < 3; k++) ferry_free(r->lat[k]);
    for (int k = 0; k < 4; k++) ferry_free(r->prov[k]);
    ferry_free(r->weak_fits);
    cJSON_Delete(r->cfg);
  }
  ferry_free(rp->runs);
  for (size_t a = 0; a < rp->n_axes; a++) {
    for (size_t k = 0; k < rp->axes[a].n; k++) ferry_free(rp->axes[a].vals[k]);
    ferry_free(rp->axes[a].vals);
    ferry_free(rp->axes[a].key);
  }
  ferry_free(rp->axes);
  for (size_t i = 0; i < rp->n_dbs; i++) sqlite3_close_v2(rp->dbs[i]);
  ferry_free(rp->dbs);
  rp->runs = NULL;
  rp->axes = NULL;
  rp->dbs = NULL;
  rp->n_runs = rp->n_axes = rp->n_dbs = 0;
}

sqlite3 *ferry__run_db(struct report *rp, const struct rrun *r) { return rp->dbs[r->db]; }
