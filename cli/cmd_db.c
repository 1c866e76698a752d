/* `ferry db`: inspect and compare result databases: list runs, show one run's metrics, diff
 * two runs with a regression exit code, export a timeline for Perfetto, import an nsys export. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/db.h"

static const char usage_text[] =
    "Usage: ferry db COMMAND [ARGS] --db FILE\n"
    "Inspect and compare result databases.\n\n"
    "Commands:\n"
    "  list                               runs: id, kind, model, hardware, complete, started, requests, error\n"
    "  show RUN                           a run's configuration and metrics (TTFT/TPOT/e2e, throughput,\n"
    "                                     peak memory and bytes moved per tier, stall time)\n"
    "  diff RUN_A RUN_B [--tolerance 5%]  compare B against A; exit 3 when B regressed beyond tolerance;\n"
    "       [--allow-incomplete]          runs that failed, were killed or still run are refused unless this\n"
    "                                     is given (their metrics cover only part of the work)\n"
    "  export-trace --run N --out FILE    Chrome trace JSON of a run's timeline (open in Perfetto)\n"
    "  import-nsys EXPORT.sqlite          add an Nsight Systems SQLite export as a run (kind nsys-import);\n"
    "                                     --into FILE is the same as --db FILE\n\n"
    "Options:\n"
    "  --db FILE          the result database (required)\n"
    "  --model NAME, --hardware NAME   import-nsys: run description\n"
    "  -h, --help         this help\n\n"
    "Exit status: 0 ok, 1 failure, 2 usage error, 3 regression found (diff).\n";

struct opts {
  const char *db, *out, *run, *tolerance, *model, *hardware;
  const char *pos[4];
  int npos;
  int allow_incomplete;
};

static int parse(int argc, char **argv, struct opts *o) {
  static const struct {
    const char *name;
    size_t off;
  } table[] = {
      {"--db", offsetof(struct opts, db)},           {"--into", offsetof(struct opts, db)},
      {"--out", offsetof(struct opts, out)},         {"--run", offsetof(struct opts, run)},
      {"--tolerance", offsetof(struct opts, tolerance)}, {"--model", offsetof(struct opts, model)},
      {"--hardware", offsetof(struct opts, hardware)},
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
  return 0;
}

static int open_db(const struct opts *o, int flags, ferry_db **db) {
  if (!o->db) return cli_usage_error("db", "--db FILE is required");
  ferry_status st = ferry_db_open(db, o->db, flags);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  return 0;
}

static int parse_run(const char *opt, const char *text, int64_t *id) {
  if (!text) return cli_usage_error("db", "%s: a run id is required", opt);
  return cli_parse_int(opt, text, 1, INT64_MAX, id) ? CLI_USAGE : 0;
}

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

/* Text from the database goes to a terminal: no control characters (escape sequences could
 * rewrite what the screen shows, a newline fake a line). */
static void scrub(char *s) {
  for (; s && *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f) *s = '?';
}

static void scrub_run(struct ferry_run_summary *r) {
  char *fields[] = {r->model, r->hardware, r->trace, r->started_at, r->finished_at, r->error, r->config_json,
                    r->config_hash, r->notes};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) scrub(fields[i]);
  scrub(r->kind);
}

static int do_list(const struct opts *o) {
  ferry_db *db;
  int rc = open_db(o, FERRY_DB_READ_ONLY, &db);
  if (rc) return rc;
  struct ferry_run_summary *runs;
  size_t n;
  ferry_status st = ferry_db_list_runs(db, &runs, &n);
  if (st != FERRY_OK) {
    ferry_db_close(db);
    return cli_fail(st, NULL);
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
  ferry_db_close(db);
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
  char b1[32], b2[32], b3[32];
  scrub_run(r);
  printf("run %lld (%s)\n", (long long)r->id, r->kind);
  printf("  model      %s\n  hardware   %s\n  trace      %s\n", or_dash(r->model), or_dash(r->hardware),
         or_dash(r->trace));
  printf("  started    %s\n  finished   %s\n  complete   %s\n", or_dash(r->started_at), or_dash(r->finished_at),
         r->complete ? "yes" : "no");
  if (r->error) printf("  error      %s\n", r->error);
  if (r->notes) printf("  notes      %s\n", r->notes);
  if (r->dropped_records) printf("  dropped    %lld activity records\n", (long long)r->dropped_records);
  struct ferry_device_info gpu;
  if (ferry_db_get_gpu(db, id, 0, &gpu) == FERRY_OK) {
    scrub(gpu.name);
    scrub(gpu.bus_location);
    printf("  gpu        %s", gpu.name[0] ? gpu.name : "-");
    if (gpu.total_memory_bytes) printf(", %s", ferry__format_bytes(gpu.total_memory_bytes, b1, sizeof b1));
    if (gpu.memory_bandwidth_bytes_per_s) printf(", %.0f GB/s", (double)gpu.memory_bandwidth_bytes_per_s / 1e9);
    if (gpu.sm_count) printf(", %d SMs", gpu.sm_count);
    if (gpu.compute_major) printf(", compute %d.%d", gpu.compute_major, gpu.compute_minor);
    if (gpu.bus_location[0]) printf(", bus %s", gpu.bus_location);
    printf("\n");
  }
  printf("  config     %s\n  hash       %s\n", or_dash(r->config_json), or_dash(r->config_hash));
  printf("latency (%lld requests, %lld output tokens)\n", (long long)s.requests, (long long)s.output_tokens);
  print_dist("TTFT", &s.ttft_ns);
  print_dist("TPOT", &s.tpot_ns);
  print_dist("e2e", &s.e2e_ns);
  printf("throughput   %.2f tokens/s\n", s.throughput_tok_s);
  printf("peak memory  device %s  host %s  disk %s\n", ferry__format_bytes(s.peak_bytes[0], b1, sizeof b1),
         ferry__format_bytes(s.peak_bytes[1], b2, sizeof b2), ferry__format_bytes(s.peak_bytes[2], b3, sizeof b3));
  printf("bytes moved  disk->host %s  host->device %s  device->host %s  (%lld steps)\n",
         ferry__format_bytes(s.bytes_disk, b1, sizeof b1), ferry__format_bytes(s.bytes_h2d, b2, sizeof b2),
         ferry__format_bytes(s.bytes_d2h, b3, sizeof b3), (long long)s.steps);
  printf("stall time   %.3f ms\n", (double)s.stall_ns * 1e-6);
  ferry_db_runs_free(r, 1);
  ferry_db_close(db);
  return CLI_OK;
}

static int parse_tolerance(const char *text, double *pct) {
  if (!text) {
    *pct = 5.0;
    return 0;
  }
  char buf[64];
  snprintf(buf, sizeof buf, "%s", text);
  size_t n = strlen(buf);
  if (n && buf[n - 1] == '%') buf[n - 1] = '\0';
  return cli_parse_double("--tolerance", buf, 0.0, 1e6, pct) ? CLI_USAGE : 0;
}

static int do_diff(const struct opts *o) {
  int64_t a, b;
  double tol;
  int rc;
  if (o->npos != 2) return cli_usage_error("db", "diff takes two run ids: RUN_A RUN_B");
  if ((rc = parse_run("RUN_A", o->pos[0], &a)) || (rc = parse_run("RUN_B", o->pos[1], &b)) ||
      (rc = parse_tolerance(o->tolerance, &tol)))
    return rc;
  ferry_db *db;
  if ((rc = open_db(o, FERRY_DB_READ_ONLY, &db))) return rc;
  /* a run that did not complete measured only part of the work: a diff against it would
   * report whatever it happened to reach, typically "no regression" */
  const int64_t ids[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    struct ferry_run_summary *r;
    ferry_status st = ferry_db_get_run(db, ids[i], &r);
    if (st != FERRY_OK) {
      ferry_db_close(db);
      return cli_fail(st, NULL);
    }
    char why[300];
    if (r->error) snprintf(why, sizeof why, "failed: %.250s", r->error);
    else snprintf(why, sizeof why, "%s", r->finished_at ? "failed" : "killed, or still running");
    scrub(why);
    int complete = r->complete == 1;
    ferry_db_runs_free(r, 1);
    if (!complete && !o->allow_incomplete) {
      ferry_db_close(db);
      return cli_fail(FERRY_ERR_INVALID, "%s: run %lld did not complete (%s); its metrics cover only part of the work. "
                      "Compare complete runs, or pass --allow-incomplete", o->db, (long long)ids[i], why);
    }
    if (!complete) fprintf(stderr, "ferry: warning: run %lld did not complete (%s)\n", (long long)ids[i], why);
  }
  struct ferry_run_stats sa, sb;
  ferry_status st = ferry_db_run_stats(db, a, &sa);
  if (st == FERRY_OK) st = ferry_db_run_stats(db, b, &sb);
  ferry_db_close(db);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  struct ferry_metric_delta d[FERRY_DB_MAX_METRICS];
  size_t n;
  int regressed = ferry_db_compare(&sa, &sb, tol, d, &n);
  printf("%-20s %16s %16s %10s\n", "metric", "run A", "run B", "change");
  for (size_t i = 0; i < n; i++) {
    char change[32];
    if (isinf(d[i].change_pct))
      snprintf(change, sizeof change, "%s", d[i].change_pct > 0 ? "+inf%" : "-inf%");
    else
      snprintf(change, sizeof change, "%+.2f%%", d[i].change_pct);
    printf("%-20s %16.3f %16.3f %10s%s\n", d[i].name, d[i].a, d[i].b, change, d[i].regressed ? "  REGRESSION" : "");
  }
  if (regressed) {
    printf("%d metric%s regressed beyond %.2f%%\n", regressed, regressed == 1 ? "" : "s", tol);
    return CLI_REGRESSION;
  }
  printf("no regression beyond %.2f%%\n", tol);
  return CLI_OK;
}

static int do_export(const struct opts *o) {
  int64_t id;
  int rc;
  if (o->npos) return cli_usage_error("db", "export-trace takes --run N --out FILE");
  if ((rc = parse_run("--run", o->run, &id))) return rc;
  if (!o->out) return cli_usage_error("db", "--out FILE is required");
  const struct ferry_path_use paths[] = {{"--out", o->out, FERRY_PATH_OUT}, {"--db", o->db, FERRY_PATH_SQLITE}};
  if ((rc = cli_check_paths("db", paths, 2))) return rc;
  ferry_db *db;
  if ((rc = open_db(o, FERRY_DB_READ_ONLY, &db))) return rc;
  ferry_status st = ferry_db_export_trace(db, id, o->out);
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
  if (st != FERRY_OK) return cli_fail(st, NULL);
  printf("imported %s as run %lld\n", o->pos[0], (long long)id);
  return CLI_OK;
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
  struct opts o = {0};
  int rc = parse(argc, argv, &o);
  if (rc) return rc;
  if (!strcmp(sub, "list")) {
    if (o.npos) return cli_usage_error("db", "list takes no arguments");
    return do_list(&o);
  }
  if (!strcmp(sub, "show")) return do_show(&o);
  if (!strcmp(sub, "diff")) return do_diff(&o);
  if (!strcmp(sub, "export-trace")) return do_export(&o);
  if (!strcmp(sub, "import-nsys")) return do_import(&o);
  return cli_usage_error("db", "unknown command '%s'", sub);
}
