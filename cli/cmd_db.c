/* `ferry db`: inspect and compare result databases: list runs, show one run's metrics, diff
 * two runs with a regression exit code, export a timeline for Perfetto, import an nsys export. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/db_diff.h"
#include "cli/db_stats.h"
#include "cli/output.h"
#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/db.h"

static const char usage_text[] =
    "Usage: ferry db COMMAND [ARGS] --db FILE\n"
    "Inspect and compare result databases.\n\n"
    "Commands:\n"
    "  list                               runs: id, kind, model, hardware, complete, started, requests, error\n"
    "  show RUN                           a run's configuration, provenance and metrics (TTFT/TPOT/e2e,\n"
    "                                     throughput, peak memory and bytes moved per tier, stall time)\n"
    "  diff A B [--tolerance 5%]          compare B against A; exit 3 when B regressed beyond tolerance.\n"
    "                                     A and B are [DB:]RUNS: RUNS is an id, a list (1,2,3) or a range\n"
    "                                     (1-5) in DB (default --db); a run of a repeat group (--repeat N)\n"
    "                                     stands for its whole group. With two runs or more on each side a\n"
    "                                     metric regresses when a one-sided Mann-Whitney U test (--alpha,\n"
    "                                     default 0.05) finds B worse than A by more than the tolerance\n"
    "       [--allow-incomplete]          runs that failed, were killed or still run are refused unless this\n"
    "                                     is given (their metrics cover only part of the work)\n"
    "       [--force]                     compare runs of different kinds or configurations (refused by\n"
    "                                     default; the differing configuration keys are named)\n"
    "       [--single] [--alpha A]        the runs given, not their repeat groups; the test's level\n"
    "  stats --report R --run N           a run's timeline summarised as nsys stats does: R is kern_sum\n"
    "                                     (cuda_gpu_kern_sum), mem_sum (cuda_gpu_mem_size_sum), mem_time_sum\n"
    "                                     (cuda_gpu_mem_time_sum), nvtx_sum, step_sum or api_sum (cuda_api_sum:\n"
    "                                     host time per CUDA runtime call of a --profile run); also imported runs\n"
    "  export-trace --run N --out FILE    Chrome trace JSON of a run's timeline (open in Perfetto): named\n"
    "       [--steps A:B] [--time A:B]    tracks, fetch-to-consumer flows, request spans, memory/batch/KV\n"
    "                                     counters; only steps A to B, or seconds A to B of the run\n"
    "  import-nsys EXPORT.sqlite          add an Nsight Systems SQLite export as a run (kind nsys-import);\n"
    "                                     --into FILE is the same as --db FILE\n"
    "  merge A.db B.db ... --out C.db     copy every run of A, B, ... that C does not hold into C (created if\n"
    "                                     missing) with its rows, run ids and StringIds remapped; a run C holds\n"
    "                                     is skipped: the same run, a complete run of the same sweep\n"
    "                                     combination (configuration hash), the same imported file or the\n"
    "                                     same repetition of a repeat group\n\n"
    "Options:\n"
    "  --db FILE          the result database (required unless every run is given as DB:RUNS)\n"
    "  --format F         list, show, diff, stats: text (default), json, csv or md (docs/output-formats.md)\n"
    "  --tolerance T      diff: allowed worsening, in percent with '%' (5%) or as a fraction (0.05);\n"
    "                     both mean five percent (default 5%)\n"
    "  --model NAME, --hardware NAME   import-nsys: run description\n"
    "  -h, --help         this help\n\n"
    "Exit status: 0 ok, 1 failure, 2 usage error, 3 regression found (diff).\n";

struct opts {
  const char *db, *out, *run, *tolerance, *alpha, *model, *hardware, *format, *report, *steps, *time;
  const char *pos[4];
  int npos;
  int allow_incomplete, force, single;
  enum cli_format fmt;
};

static int parse(int argc, char **argv, struct opts *o) {
  static const struct {
    const char *name;
    size_t off;
  } table[] = {
      {"--db", offsetof(struct opts, db)},           {"--into", offsetof(struct opts, db)},
      {"--out", offsetof(struct opts, out)},         {"--run", offsetof(struct opts, run)},
      {"--tolerance", offsetof(struct opts, tolerance)}, {"--model", offsetof(struct opts, model)},
      {"--hardware", offsetof(struct opts, hardware)}, {"--format", offsetof(struct opts, format)},
      {"--alpha", offsetof(struct opts, alpha)},     {"--report", offsetof(struct opts, report)},
      {"--steps", offsetof(struct opts, steps)},     {"--time", offsetof(struct opts, time)},
  };
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || a[1] == '\0') {
      if (o->npos >= 4) return cli_usage_error("db", "too many arguments ('%s')", a);
      o->pos[o->npos++] = a;
      continue;
    }
    if (!strcmp(a, "--allow-incomplete")) {
      o->allow_incomplete = 1;
      continue;
    }
    if (!strcmp(a, "--force")) {
      o->force = 1;
      continue;
    }
    if (!strcmp(a, "--single")) {
      o->single = 1;
      continue;
    }
    size_t k;
    for (k = 0; k < sizeof table / sizeof table[0]; k++) {
      size_t n = strlen(table[k].name);
      if (strncmp(a, table[k].name, n) != 0 || (a[n] != '\0' && a[n] != '=')) continue;
      const char *v = a[n] == '=' ? a + n + 1 : (i + 1 < argc ? argv[++i] : NULL);
      if (!v) return cli_usage_error("db", "option %s needs a value", table[k].name);
      *(const char **)((char *)o + table[k].off) = v;
      break;
    }
    if (k == sizeof table / sizeof table[0]) return cli_usage_error("db", "unknown option '%s'", a);
  }
  if (o->format && cli_parse_format("db", o->format, &o->fmt)) return CLI_USAGE;
  return 0;
}

static int open_path(const char *path, int flags, ferry_db **db) {
  if (!path) return cli_usage_error("db", "--db FILE is required");
  ferry_status st = ferry_db_open(db, path, flags);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  return 0;
}

static int open_db(const struct opts *o, int flags, ferry_db **db) { return open_path(o->db, flags, db); }

static int parse_run(const char *opt, const char *text, int64_t *id) {
  if (!text) return cli_usage_error("db", "%s: a run id is required", opt);
  return cli_parse_int(opt, text, 1, INT64_MAX, id) ? CLI_USAGE : 0;
}

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

static void scrub_run(struct ferry_run_summary *r) {
  char *fields[] = {r->model, r->hardware, r->trace, r->started_at, r->finished_at, r->error, r->config_json,
                    r->config_hash, r->notes, r->git_rev, r->ferry_version, r->repeat_group};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) cli_scrub(fields[i]);
  cli_scrub(r->kind);
}

static const char *status_of(const struct ferry_run_summary *r) {
  return r->complete == 1 ? "complete" : r->finished_at ? "failed" : "incomplete";
}

/* The run's row as JSON: the fields `db list` shows, and with `full` those of `db show`. */
static cJSON *run_json(const struct ferry_run_summary *r, int full) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddNumberToObject(o, "id", (double)r->id);
  cJSON_AddStringToObject(o, "kind", r->kind);
  cli_json_str(o, "model", r->model);
  cli_json_str(o, "hardware", r->hardware);
  cli_json_str(o, "trace", r->trace);
  cJSON_AddStringToObject(o, "status", status_of(r));
  cli_json_str(o, "started_at", r->started_at);
  cli_json_str(o, "finished_at", r->finished_at);
  cJSON_AddNumberToObject(o, "requests", (double)r->requests);
  cli_json_str(o, "config_hash", r->config_hash);
  cli_json_str(o, "repeat_group", r->repeat_group);
  if (r->repeat_group) cJSON_AddNumberToObject(o, "repeat_index", r->repeat_index);
  else cJSON_AddNullToObject(o, "repeat_index");
  cli_json_str(o, "git_rev", r->git_rev);
  cli_json_str(o, "error", r->error);
  if (full) {
    cli_json_str(o, "ferry_version", r->ferry_version);
    cli_json_str(o, "notes", r->notes);
    cJSON_AddNumberToObject(o, "dropped_records", (double)r->dropped_records);
    /* the configuration as an object when it parses (it comes from the database) */
    cJSON *cfg = r->config_json ? cJSON_Parse(r->config_json) : NULL;
    if (cfg && !cJSON_IsObject(cfg)) {
      cJSON_Delete(cfg);
      cfg = NULL;
    }
    if (cfg) cJSON_AddItemToObject(o, "config", cfg);
    else cli_json_str(o, "config", r->config_json);
  }
  return o;
}

static int do_list(const struct opts *o) {
  ferry_db *db;
  int rc = open_db(o, FERRY_DB_READ_ONLY, &db);
  if (rc) return rc;
  struct ferry_run_summary *runs;
  size_t n;
  ferry_status st = ferry_db_list_runs(db, &runs, &n);
  ferry_db_close(db);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  if (o->fmt != CLI_FORMAT_TEXT) {
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(doc, "runs");
    cJSON_AddStringToObject(doc, "schema", "ferry.db.list.v1");
    cJSON_AddStringToObject(doc, "database", o->db);
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, run_json(&runs[i], 0));
    /* "schema" first reads better; cJSON keeps insertion order */
    cJSON_DetachItemViaPointer(doc, arr);
    cJSON_AddItemToObject(doc, "runs", arr);
    rc = cli_emit(stdout, doc, "runs", o->fmt);
    cJSON_Delete(doc);
    ferry_db_runs_free(runs, n);
    return rc;
  }
  printf("%-5s %-11s %-24s %-16s %-8s %-24s %8s  %s\n", "id", "kind", "model", "hardware", "complete",
         "started", "requests", "error");
  for (size_t i = 0; i < n; i++) {
    struct ferry_run_summary *r = &runs[i];
    scrub_run(r);
    printf("%-5lld %-11s %-24s %-16s %-8s %-24s %8lld  %s\n", (long long)r->id, r->kind, or_dash(r->model),
           or_dash(r->hardware), r->complete ? "yes" : (r->finished_at ? "failed" : "no"), or_dash(r->started_at),
           (long long)r->requests, or_dash(r->error));
  }
  ferry_db_runs_free(runs, n);
  return CLI_OK;
}

static void print_dist(const char *name, const struct ferry_dist *d) {
  if (!d->count) {
    printf("  %-6s  (no samples)\n", name);
    return;
  }
  printf("  %-6s  mean %10.3f  p50 %10.3f  p90 %10.3f  p99 %10.3f  ms  (n=%lld)\n", name, d->mean * 1e-6,
         d->p50 * 1e-6, d->p90 * 1e-6, d->p99 * 1e-6, (long long)d->count);
}

static cJSON *gpu_json(const struct ferry_device_info *g) {
  cJSON *o = cJSON_CreateObject();
  cli_json_str(o, "name", g->name[0] ? g->name : NULL);
  if (g->total_memory_bytes) cJSON_AddNumberToObject(o, "memory_bytes", (double)g->total_memory_bytes);
  if (g->memory_bandwidth_bytes_per_s)
    cJSON_AddNumberToObject(o, "memory_bandwidth_bytes_per_s", (double)g->memory_bandwidth_bytes_per_s);
  if (g->sm_count) cJSON_AddNumberToObject(o, "sm_count", g->sm_count);
  if (g->compute_major) {
    char cc[32];
    snprintf(cc, sizeof cc, "%d.%d", g->compute_major, g->compute_minor);
    cJSON_AddStringToObject(o, "compute_capability", cc);
  }
  if (g->bus_location[0]) cJSON_AddStringToObject(o, "bus_location", g->bus_location);
  return o;
}

/* Metrics as `db diff` names them, and the counts behind them. */
static cJSON *metrics_json(const struct ferry_run_stats *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "requests", (double)s->requests);
  cJSON_AddNumberToObject(o, "output_tokens", (double)s->output_tokens);
  cJSON_AddNumberToObject(o, "steps", (double)s->steps);
  struct ferry_metric_value v[FERRY_DB_MAX_METRICS];
  size_t n = ferry_db_metrics(s, v);
  for (size_t i = 0; i < n; i++) cli_json_num(o, v[i].name, v[i].value);
  return o;
}

/* Provenance facts are the run facts named BUILD_*, MACHINE_*, GPU_* and CUDA_*. */
static int is_provenance(const char *name) {
  static const char *const prefixes[] = {"BUILD_", "MACHINE_", "GPU_", "CUDA_"};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
    if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return 1;
  return 0;
}

static const char *fact(const struct ferry_meta_row *m, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(m[i].name, name) && m[i].value) return m[i].value;
  return NULL;
}

/* "a, b, c" of the facts present. */
static void join_facts(const struct ferry_meta_row *m, size_t n, const char *const *names, const char *const *labels,
                       char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; names[i] && used + 4 < len; i++) {
    const char *v = fact(m, n, names[i]);
    if (!v) continue;
    int w = snprintf(out + used, len - used, "%s%s%s", used ? ", " : "", labels[i], v);
    used = w > 0 && (size_t)w < len - used ? used + (size_t)w : len - 1;
  }
}

static void print_provenance(const struct ferry_meta_row *m, size_t n) {
  char line[1024], b[32];
  join_facts(m, n, (const char *const[]){"BUILD_GIT_DESCRIBE", "BUILD_FERRY_VERSION", "BUILD_COMPILER", "BUILD_TYPE",
                                         "BUILD_CUDA_TOOLKIT", NULL},
             (const char *const[]){"", "ferry ", "", "", "CUDA toolkit "}, line, sizeof line);
  if (line[0]) printf("  build      %s\n", line);
  if (fact(m, n, "BUILD_BLAS")) printf("  blas       %s\n", fact(m, n, "BUILD_BLAS"));
  const char *mem = fact(m, n, "MACHINE_MEMORY_BYTES");
  char memtext[48] = "";
  if (mem) snprintf(memtext, sizeof memtext, "%s", ferry__format_bytes(strtoull(mem, NULL, 10), b, sizeof b));
  const char *cores = fact(m, n, "MACHINE_CPU_CORES");
  char corestext[48] = "";
  if (cores) snprintf(corestext, sizeof corestext, "%s cores", cores);
  const struct ferry_meta_row extra[2] = {{"X_CORES", corestext[0] ? corestext : NULL},
                                          {"X_MEM", memtext[0] ? memtext : NULL}};
  struct ferry_meta_row all[64];
  size_t k = 0;
  for (size_t i = 0; i < n && k < 62; i++) all[k++] = m[i];
  all[k++] = extra[0];
  all[k++] = extra[1];
  join_facts(all, k, (const char *const[]){"MACHINE_CPU_MODEL", "X_CORES", "X_MEM", "MACHINE_KERNEL", "MACHINE_OS", NULL},
             (const char *const[]){"", "", "", "", ""}, line, sizeof line);
  if (line[0]) printf("  machine    %s\n", line);
  join_facts(m, n, (const char *const[]){"GPU_NAME", "GPU_DRIVER", "CUDA_RUNTIME", "CUDA_DRIVER_API", NULL},
             (const char *const[]){"", "driver ", "CUDA runtime ", "driver API "}, line, sizeof line);
  if (line[0]) printf("  gpu driver %s\n", line);
}

/* A data-parallel run's replicas (more than one): what each served. */
struct shown_replicas {
  struct ferry_replica_stats *rows;
  size_t n;
};

static cJSON *replicas_json(const struct shown_replicas *rp) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; a && i < rp->n; i++) {
    const struct ferry_replica_stats *r = &rp->rows[i];
    cJSON *o = cJSON_CreateObject();
    cli_json_num(o, "replica", (double)r->replica);
    cli_json_num(o, "requests", (double)r->requests);
    cli_json_num(o, "output_tokens", (double)r->output_tokens);
    cli_json_num(o, "steps", (double)r->steps);
    cli_json_num(o, "ttft_mean_ms", r->ttft_mean_ns / 1e6);
    cli_json_num(o, "tpot_mean_ms", r->tpot_mean_ns / 1e6);
    cJSON_AddItemToArray(a, o);
  }
  return a;
}

static void replicas_text(const struct shown_replicas *rp) {
  char t[2][32];
  printf("replicas     %zu\n", rp->n);
  for (size_t i = 0; i < rp->n; i++) {
    const struct ferry_replica_stats *r = &rp->rows[i];
    printf("  replica %lld  %lld requests, %lld output tokens, %lld steps; TTFT mean %s, TPOT mean %s\n",
           (long long)r->replica, (long long)r->requests, (long long)r->output_tokens, (long long)r->steps,
           isnan(r->ttft_mean_ns) ? "-" : ferry__format_ns((int64_t)r->ttft_mean_ns, t[0], sizeof t[0]),
           isnan(r->tpot_mean_ns) ? "-" : ferry__format_ns((int64_t)r->tpot_mean_ns, t[1], sizeof t[1]));
  }
}

/* `db show --format json|csv|md`: the run, its provenance facts, GPU and metrics. */
static int show_json(const struct opts *o, const struct ferry_run_summary *r, const struct ferry_meta_row *facts,
                     size_t kept, const struct ferry_device_info *gpu, const struct ferry_run_stats *s,
                     const struct shown_replicas *rp) {
  cJSON *doc = cJSON_CreateObject();
  cJSON_AddStringToObject(doc, "schema", "ferry.db.show.v1");
  cJSON_AddStringToObject(doc, "database", o->db);
  cJSON_AddItemToObject(doc, "run", run_json(r, 1));
  cJSON *prov = cJSON_AddObjectToObject(doc, "provenance");
  for (size_t i = 0; i < kept; i++) cli_json_str(prov, facts[i].name, facts[i].value);
  if (gpu) cJSON_AddItemToObject(doc, "gpu", gpu_json(gpu));
  else cJSON_AddNullToObject(doc, "gpu");
  cJSON_AddItemToObject(doc, "metrics", metrics_json(s));
  if (rp->n > 1) cJSON_AddItemToObject(doc, "replicas", replicas_json(rp));
  const int rc = cli_emit(stdout, doc, NULL, o->fmt);
  cJSON_Delete(doc);
  return rc;
}

/* `db show` as text; the strings from the database are scrubbed of control characters first. */
static void show_text(struct ferry_run_summary *r, struct ferry_meta_row *facts, size_t kept,
                      struct ferry_device_info *gpu, const struct ferry_run_stats *s, const struct shown_replicas *rp) {
  char b1[32], b2[32], b3[32];
  scrub_run(r);
  for (size_t i = 0; i < kept; i++) cli_scrub(facts[i].value);
  printf("run %lld (%s)\n", (long long)r->id, r->kind);
  printf("  model      %s\n  hardware   %s\n  trace      %s\n", or_dash(r->model), or_dash(r->hardware),
         or_dash(r->trace));
  printf("  started    %s\n  finished   %s\n  complete   %s\n", or_dash(r->started_at), or_dash(r->finished_at),
         r->complete ? "yes" : "no");
  if (r->error) printf("  error      %s\n", r->error);
  if (r->notes) printf("  notes      %s\n", r->notes);
  if (r->repeat_group) printf("  repeat     %d of group %s\n", r->repeat_index + 1, r->repeat_group);
  if (r->dropped_records) printf("  dropped    %lld activity records\n", (long long)r->dropped_records);
  if (!kept && r->git_rev) printf("  build      %s\n", r->git_rev);
  print_provenance(facts, kept);
  if (gpu) {
    cli_scrub(gpu->name);
    cli_scrub(gpu->bus_location);
    printf("  gpu        %s", gpu->name[0] ? gpu->name : "-");
    if (gpu->total_memory_bytes) printf(", %s", ferry__format_bytes(gpu->total_memory_bytes, b1, sizeof b1));
    if (gpu->memory_bandwidth_bytes_per_s) printf(", %.0f GB/s", (double)gpu->memory_bandwidth_bytes_per_s / 1e9);
    if (gpu->sm_count) printf(", %d SMs", gpu->sm_count);
    if (gpu->compute_major) printf(", compute %d.%d", gpu->compute_major, gpu->compute_minor);
    if (gpu->bus_location[0]) printf(", bus %s", gpu->bus_location);
    printf("\n");
  }
  printf("  config     %s\n  hash       %s\n", or_dash(r->config_json), or_dash(r->config_hash));
  printf("latency (%lld requests, %lld output tokens)\n", (long long)s->requests, (long long)s->output_tokens);
  print_dist("TTFT", &s->ttft_ns);
  print_dist("TPOT", &s->tpot_ns);
  print_dist("e2e", &s->e2e_ns);
  printf("throughput   %.2f tokens/s\n", s->throughput_tok_s);
  printf("peak memory  device %s  host %s  disk %s\n", ferry__format_bytes(s->peak_bytes[0], b1, sizeof b1),
         ferry__format_bytes(s->peak_bytes[1], b2, sizeof b2), ferry__format_bytes(s->peak_bytes[2], b3, sizeof b3));
  char steps[64];
  if (s->bytes_from_timeline) snprintf(steps, sizeof steps, "from the timeline's copies: no engine steps");
  else snprintf(steps, sizeof steps, "%lld steps", (long long)s->steps);
  printf("bytes moved  disk->host %s  host->device %s  device->host %s  (%s)\n",
         ferry__format_bytes(s->bytes_disk, b1, sizeof b1), ferry__format_bytes(s->bytes_h2d, b2, sizeof b2),
         ferry__format_bytes(s->bytes_d2h, b3, sizeof b3), steps);
  if (s->bytes_disk_write) printf("disk writes  %s (host->disk)\n", ferry__format_bytes(s->bytes_disk_write, b1, sizeof b1));
  if (s->bytes_peers) /* ZeRO-3's partitioned fetch: the rest of each streamed block */
    printf("from peers   %s (streamed blocks from the data-parallel peers, --zero-gpus)\n",
           ferry__format_bytes(s->bytes_peers, b1, sizeof b1));
  printf("stall time   %.3f ms\n", (double)s->stall_ns * 1e-6);
  if (rp->n > 1) replicas_text(rp);
}

static int do_show(const struct opts *o) {
  int64_t id;
  int rc;
  if (o->npos != 1) return cli_usage_error("db", "show takes one run id");
  if ((rc = parse_run("RUN", o->pos[0], &id))) return rc;
  ferry_db *db;
  if ((rc = open_db(o, FERRY_DB_READ_ONLY, &db))) return rc;
  struct ferry_run_summary *r;
  struct ferry_run_stats s;
  ferry_status st = ferry_db_get_run(db, id, &r);
  if (st == FERRY_OK) {
    st = ferry_db_run_stats(db, id, &s);
    if (st != FERRY_OK) ferry_db_runs_free(r, 1);
  }
  if (st != FERRY_OK) {
    ferry_db_close(db);
    return cli_fail(st, NULL);
  }
  struct ferry_device_info gpu;
  const int has_gpu = ferry_db_get_gpu(db, id, 0, &gpu) == FERRY_OK;
  struct ferry_meta_row *facts = NULL;
  size_t n_facts = 0;
  if ((st = ferry_db_run_meta_list(db, id, NULL, &facts, &n_facts)) != FERRY_OK) {
    ferry_db_runs_free(r, 1);
    ferry_db_close(db);
    return cli_fail(st, NULL);
  }
  /* only the provenance facts are shown; the others have their own commands */
  size_t kept = 0;
  for (size_t i = 0; i < n_facts; i++) {
    if (is_provenance(facts[i].name)) {
      struct ferry_meta_row t = facts[kept];
      facts[kept++] = facts[i];
      facts[i] = t;
    }
  }
  struct ferry_device_info *g = has_gpu ? &gpu : NULL;
  struct shown_replicas rp = {0};
  if ((st = ferry_db_run_replicas(db, id, &rp.rows, &rp.n)) != FERRY_OK) {
    ferry_db_meta_free(facts, n_facts);
    ferry_db_runs_free(r, 1);
    ferry_db_close(db);
    return cli_fail(st, NULL);
  }
  if (o->fmt != CLI_FORMAT_TEXT) rc = show_json(o, r, facts, kept, g, &s, &rp);
  else show_text(r, facts, kept, g, &s, &rp);
  ferry_db_replicas_free(rp.rows);
  ferry_db_meta_free(facts, n_facts);
  ferry_db_runs_free(r, 1);
  ferry_db_close(db);
  return rc;
}

static int do_export(const struct opts *o) {
  int64_t id;
  int rc;
  if (o->npos) return cli_usage_error("db", "export-trace takes --run N --out FILE");
  if ((rc = parse_run("--run", o->run, &id))) return rc;
  if (!o->out) return cli_usage_error("db", "--out FILE is required");
  struct ferry_trace_export_options opt;
  ferry_trace_export_options_init(&opt);
  if (o->steps) {
    /* A:B, either end may be left out; A alone is that one step */
    const char *colon = strchr(o->steps, ':');
    char a[32] = "", b[32] = "";
    const size_t la = colon ? (size_t)(colon - o->steps) : strlen(o->steps);
    if (la >= sizeof a || (colon && strlen(colon + 1) >= sizeof b) || !strcmp(o->steps, ":") || !*o->steps)
      return cli_usage_error("db", "--steps: expected A:B (steps A to B, either may be left out), got '%s'", o->steps);
    memcpy(a, o->steps, la);
    snprintf(b, sizeof b, "%s", colon ? colon + 1 : a);
    if ((a[0] && cli_parse_int("--steps", a, 0, INT64_MAX, &opt.step_first)) ||
        (b[0] && cli_parse_int("--steps", b, 0, INT64_MAX, &opt.step_last)))
      return CLI_USAGE;
    if (a[0] && b[0] && opt.step_last < opt.step_first)
      return cli_usage_error("db", "--steps %s: the last step is before the first", o->steps);
  }
  if (o->time) {
    int64_t t0, t1;
    if (ferry__parse_window_ns(o->time, &t0, &t1) != FERRY_OK)
      return cli_usage_error("db", "--time: %s", ferry_last_error());
    opt.time_first_s = (double)t0 / 1e9;
    if (t1 > 0) opt.time_last_s = (double)t1 / 1e9;
  }
  const struct ferry_path_use paths[] = {{"--out", o->out, FERRY_PATH_OUT}, {"--db", o->db, FERRY_PATH_SQLITE}};
  if ((rc = cli_check_paths("db", paths, 2))) return rc;
  ferry_db *db;
  if ((rc = open_db(o, FERRY_DB_READ_ONLY, &db))) return rc;
  ferry_status st = ferry_db_export_trace_window(db, id, o->out, &opt);
  ferry_db_close(db);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  printf("wrote %s (run %lld)\n", o->out, (long long)id);
  return CLI_OK;
}

static int do_import(const struct opts *o) {
  if (o->npos != 1) return cli_usage_error("db", "import-nsys takes one export file");
  const struct ferry_path_use paths[] = {{"--db", o->db, FERRY_PATH_OUT | FERRY_PATH_SQLITE},
                                         {"EXPORT.sqlite", o->pos[0], FERRY_PATH_SQLITE}};
  int rc = cli_check_paths("db", paths, 2);
  if (rc) return rc;
  ferry_db *db;
  rc = open_db(o, FERRY_DB_CREATE, &db);
  if (rc) return rc;
  struct ferry_run_info info = {.kind = FERRY_RUN_NSYS_IMPORT, .model = o->model, .hardware = o->hardware};
  int64_t id;
  ferry_status st = ferry_db_import_nsys(db, o->pos[0], &info, &id);
  ferry_db_close(db);
  if (st == FERRY_ERR_EXISTS) {
    printf("%s was already imported as run %lld (same SHA-256); nothing added\n", o->pos[0], (long long)id);
    return CLI_OK;
  }
  if (st != FERRY_OK) return cli_fail(st, NULL);
  printf("imported %s as run %lld\n", o->pos[0], (long long)id);
  return CLI_OK;
}

/* `ferry db merge A.db B.db ... --out C.db`: any number of sources, so it parses its own
 * arguments. */
static int do_merge(int argc, char **argv) {
  const char *out = NULL;
  int quiet = 0;
  const char **src = ferry__calloc((size_t)argc, sizeof *src);
  struct ferry_path_use *paths = ferry__calloc((size_t)argc + 1, sizeof *paths);
  int n = 0, rc = CLI_OK;
  if (!src || !paths) {
    rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--out") || !strncmp(a, "--out=", 6)) {
      out = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
      if (!out || !*out) {
        rc = cli_usage_error("db", "option --out needs a value");
        goto out;
      }
    } else if (!strcmp(a, "--quiet")) {
      quiet = 1;
    } else if (a[0] == '-' && a[1]) {
      rc = cli_usage_error("db", "merge: unknown option '%s'", a);
      goto out;
    } else {
      src[n++] = a;
    }
  }
  if (!out) {
    rc = cli_usage_error("db", "merge needs --out C.db (the database the runs go into)");
    goto out;
  }
  if (n == 0) {
    rc = cli_usage_error("db", "merge needs at least one source database");
    goto out;
  }
  paths[0] = (struct ferry_path_use){"--out", out, FERRY_PATH_OUT | FERRY_PATH_SQLITE};
  for (int i = 0; i < n; i++) paths[i + 1] = (struct ferry_path_use){"source", src[i], FERRY_PATH_SQLITE};
  if ((rc = cli_check_paths("db", paths, (size_t)n + 1))) goto out;
  ferry_db *db = NULL;
  ferry_status st = ferry_db_open(&db, out, FERRY_DB_CREATE);
  if (st != FERRY_OK) {
    rc = cli_fail(st, NULL);
    goto out;
  }
  for (int i = 0; i < n && rc == CLI_OK; i++) {
    struct ferry_db_merge_stats ms;
    if ((st = ferry_db_merge(db, src[i], &ms)) != FERRY_OK) {
      rc = cli_fail(st, NULL);
      break;
    }
    if (!quiet)
      printf("%s: %lld run(s) added (%lld rows); skipped %lld already in %s (%lld the same run, %lld the same sweep "
             "combination, %lld the same import, %lld the same repetition)\n",
             src[i], (long long)ms.runs_added, (long long)ms.rows_added,
             (long long)(ms.same_run + ms.same_sweep_key + ms.same_import + ms.same_repetition), out,
             (long long)ms.same_run, (long long)ms.same_sweep_key, (long long)ms.same_import,
             (long long)ms.same_repetition);
  }
  ferry_db_close(db);
out:
  ferry_free(src);
  ferry_free(paths);
  return rc;
}

int cmd_db(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage_text, stderr);
    return CLI_USAGE;
  }
  const char *sub = argv[1];
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage_text, stdout);
      return CLI_OK;
    }
  if (!strcmp(sub, "merge")) return do_merge(argc, argv);
  struct opts o = {0};
  int rc = parse(argc, argv, &o);
  if (rc) return rc;
  if (!strcmp(sub, "list")) {
    if (o.npos) return cli_usage_error("db", "list takes no arguments");
    return do_list(&o);
  }
  if (!strcmp(sub, "show")) return do_show(&o);
  if (!strcmp(sub, "diff")) {
    struct db_diff_opts d = {.db = o.db, .a = o.npos > 0 ? o.pos[0] : NULL, .b = o.npos > 1 ? o.pos[1] : NULL,
                             .tolerance = o.tolerance, .alpha = o.alpha, .allow_incomplete = o.allow_incomplete,
                             .force = o.force, .single = o.single, .fmt = o.fmt};
    if (o.npos != 2) return cli_usage_error("db", "diff takes two runs: A B (each [DB:]RUNS)");
    return db_diff(&d);
  }
  if (!strcmp(sub, "stats")) {
    if (o.npos) return cli_usage_error("db", "stats takes --report R --run N");
    return db_stats(o.db, o.report, o.run, o.fmt);
  }
  if (!strcmp(sub, "export-trace")) return do_export(&o);
  if (!strcmp(sub, "import-nsys")) return do_import(&o);
  return cli_usage_error("db", "unknown command '%s'", sub);
}
