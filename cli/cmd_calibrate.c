/* `ferry calibrate`: measure this machine for the host executor (--probe), or fit a hardware
 * profile's costs to the op durations recorded in a run's timeline (--db), so `ferry sim`
 * prices ops by measured rates. */
#include <getopt.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/sqlite_read.h"
#include "ferry/db.h"
#include "ferry/calibrate.h"
#include "ferry/hw.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry calibrate --probe --out PROFILE.json [--dir DIR]\n"
          "       ferry calibrate --db RUN.db --run N --base PROFILE --out FITTED.json\n"
          "Make a hardware profile from measurements.\n\n"
          "  --probe          measure this machine through the host executor: copy bandwidth and\n"
          "                   latency, O_DIRECT read bandwidth and latency (a 256 MiB scratch file in\n"
          "                   DIR, default .), and the cost of every kernel kind at engine shapes\n"
          "  --db RUN.db      fit costs to the timeline of a recorded run (host, cuda or an nsys import):\n"
          "                   per kernel kind, duration = overhead + bytes x a + flops x b, or + max(...),\n"
          "                   whichever fits better (relative least squares, coefficients >= 0); copies and\n"
          "                   disk reads: latency + bytes / rate\n"
          "  --run N          the run in RUN.db\n"
          "  --base PROFILE   the profile whose other figures the fitted one keeps (ferry hw list)\n"
          "  --out FILE       where to write the profile (JSON, the catalogue format)\n");
}

/* A timeline row worth fitting: the database is untrusted, so sizes must be finite and not
 * negative and durations positive (an inf or NaN would poison the whole fit). */
static int usable_sample(double bytes, double flops, double dur_ns) {
  return isfinite(bytes) && isfinite(flops) && isfinite(dur_ns) && bytes >= 0 && flops >= 0 && dur_ns > 0;
}

static int fit_from_db(const char *db_path, int64_t run, const char *base, const char *out) {
  ferry_hw *hw = NULL;
  ferry_status st = ferry_hw_open(&hw, base);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  struct ferry_hw_profile p = *ferry_hw_get(hw);
  sqlite3 *db = NULL;
  int rc = CLI_FAIL;
  struct ferry_calib_sample *s = NULL;
  const char *fitted[64];
  size_t n_fitted = 0;
  if ((st = ferry__sqlite_open_read(db_path, FERRY_DB_APPLICATION_ID, FERRY_DB_SCHEMA_VERSION, &db, NULL, NULL)) !=
      FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  size_t cap = 200000;
  s = ferry_malloc(cap * sizeof *s);
  if (!s) goto out;
  int any = 0;
  for (int kind = 0; kind < FERRY_HW_COST_KINDS; kind++) {
    /* "<kind>_gemm" takes the ops of <kind> above the GEMM intensity; <kind> the rest */
    const char *name = ferry_hw_cost_kind_name(kind);
    char kind_base[32];
    snprintf(kind_base, sizeof kind_base, "%s", name);
    char *suffix = strstr(kind_base, "_gemm");
    const int gemm_kind = suffix != NULL;
    if (suffix) *suffix = '\0';
    char gemm_name[40];
    snprintf(gemm_name, sizeof gemm_name, "%s_gemm", kind_base);
    int has_gemm_variant = 0;
    for (int j = 0; j < FERRY_HW_COST_KINDS; j++) has_gemm_variant |= !strcmp(ferry_hw_cost_kind_name(j), gemm_name);
    sqlite3_stmt *q = NULL;
    const char *sql =
        "SELECT k.bytes, k.flops, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON n.id = k.shortName "
        "WHERE k.runId = ?1 AND n.value = ?2 LIMIT 200000";
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) {
      cli_fail(FERRY_ERR_DB, "%s: not a ferry result database with a timeline (%s)", db_path, sqlite3_errmsg(db));
      goto out;
    }
    sqlite3_bind_int64(q, 1, run);
    sqlite3_bind_text(q, 2, kind_base, -1, SQLITE_TRANSIENT);
    size_t n = 0;
    while (sqlite3_step(q) == SQLITE_ROW && n < cap) {
      double bytes = (double)sqlite3_column_int64(q, 0), flops = sqlite3_column_double(q, 1);
      double dur = (double)sqlite3_column_int64(q, 2);
      if (!usable_sample(bytes, flops, dur)) continue;
      int is_gemm = bytes > 0 && flops / bytes > FERRY_HW_GEMM_INTENSITY;
      if (has_gemm_variant && is_gemm != gemm_kind) continue;
      s[n++] = (struct ferry_calib_sample){bytes, flops, dur};
    }
    sqlite3_finalize(q);
    if (n < 3) continue;
    double r2 = 0;
    ferry_calibrate_fit(s, n, &p.cost[kind], &r2);
    p.cost_set |= 1u << kind;
    p.has_cost = 1;
    any = 1;
    printf("%-12s %6zu ops: %9.0f ns + %s(%.4f ns/byte, %.5f ns/flop) (R^2 %.3f)\n", name, n, p.cost[kind].overhead_ns,
           p.cost[kind].roofline ? "max" : "sum", p.cost[kind].ns_per_byte, p.cost[kind].ns_per_flop, r2);
  }
  /* copies (1 = host->device, 2 = device->host) and disk reads (ferry's copy kind 100) */
  static const struct {
    int copy_kind;
    const char *name;
  } copies[] = {{1, "h2d"}, {2, "d2h"}, {100, "disk"}};
  for (int c = 0; c < 3; c++) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, "SELECT bytes, end - start FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId = ?1 AND copyKind = ?2 LIMIT 65536",
                           -1, &q, NULL) != SQLITE_OK)
      break;
    sqlite3_bind_int64(q, 1, run);
    sqlite3_bind_int(q, 2, copies[c].copy_kind);
    size_t n = 0;
    while (sqlite3_step(q) == SQLITE_ROW && n < cap) {
      double bytes = (double)sqlite3_column_int64(q, 0), dur = (double)sqlite3_column_int64(q, 1);
      if (usable_sample(bytes, 0, dur)) s[n++] = (struct ferry_calib_sample){bytes, 0, dur};
    }
    sqlite3_finalize(q);
    if (n < 3) continue;
    struct ferry_hw_cost f;
    ferry_calibrate_fit(s, n, &f, NULL);
    if (f.ns_per_byte <= 0) continue;
    any = 1;
    printf("%-12s %6zu ops: latency %.0f ns, %.2f GB/s\n", copies[c].name, n, f.overhead_ns, 1.0 / f.ns_per_byte);
    if (copies[c].copy_kind == 1) {
      p.link.h2d_gbps = 1.0 / f.ns_per_byte;
      p.link.latency_ns = (int64_t)f.overhead_ns;
      fitted[n_fitted++] = "link.h2d_gbps";
      fitted[n_fitted++] = "link.latency_ns";
    } else if (copies[c].copy_kind == 2) {
      p.link.d2h_gbps = 1.0 / f.ns_per_byte;
      fitted[n_fitted++] = "link.d2h_gbps";
    } else if (p.has_disk) {
      p.disk.read_gbps = 1.0 / f.ns_per_byte;
      p.disk.latency_ns = (int64_t)f.overhead_ns;
      fitted[n_fitted++] = "disk.read_gbps";
      fitted[n_fitted++] = "disk.latency_ns";
    }
  }
  if (!any) {
    cli_fail(FERRY_ERR_NOT_FOUND, "%s: run %lld has no timeline rows to fit (was it recorded with --db?)", db_path,
             (long long)run);
    goto out;
  }
  char note[256];
  snprintf(note, sizeof note, "ferry calibrate --db %s --run %lld", db_path, (long long)run);
  snprintf(p.name, sizeof p.name, "%.50s-fitted", ferry_hw_get(hw)->name);
  if ((st = ferry_hw_write_json(&p, fitted, n_fitted, note, out)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  printf("wrote %s\n", out);
  rc = CLI_OK;
out:
  ferry_free(s);
  sqlite3_close_v2(db);
  ferry_hw_close(hw);
  return rc;
}

int cmd_calibrate(int argc, char **argv) {
  static const struct option opts[] = {{"probe", no_argument, 0, 'p'},     {"out", required_argument, 0, 'o'},
                                       {"dir", required_argument, 0, 'd'}, {"db", required_argument, 0, 'b'},
                                       {"run", required_argument, 0, 'r'}, {"base", required_argument, 0, 'B'},
                                       {"help", no_argument, 0, 'h'},      {0, 0, 0, 0}};
  int probe = 0;
  const char *out = NULL, *dir = ".", *db = NULL, *base = NULL;
  int64_t run = -1;
  optind = 1;
  int c;
  while ((c = cli_getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case 'p': probe = 1; break;
      case 'o': out = optarg; break;
      case 'd': dir = optarg; break;
      case 'b': db = optarg; break;
      case 'r': if (cli_parse_int("--run", optarg, 1, INT64_MAX, &run)) return CLI_USAGE; break;
      case 'B': base = optarg; break;
      case 'h': usage(stdout); return CLI_OK;
      default: return cli_usage_error("calibrate", "invalid option");
    }
  }
  if (optind < argc) return cli_usage_error("calibrate", "unexpected argument '%s'", argv[optind]);
  if (!out) return cli_usage_error("calibrate", "missing --out FILE");
  if (probe == !!db) return cli_usage_error("calibrate", "give either --probe or --db RUN.db");
  const struct ferry_path_use paths[] = {{"--out", out, FERRY_PATH_OUT}, {"--db", db, FERRY_PATH_SQLITE}, {"--base", base, 0}};
  if (cli_check_paths("calibrate", paths, 3)) return CLI_USAGE;
  if (db) {
    if (run < 0 || !base) return cli_usage_error("calibrate", "--db needs --run N and --base PROFILE");
    return fit_from_db(db, run, base, out);
  }
  struct ferry_hw_profile p;
  ferry_status st = ferry_calibrate_probe(dir, stderr, &p);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  static const char *const measured[] = {"gpu.mem_bw_gbps", "gpu.peak_tflops.fp32", "gpu.launch_overhead_ns",
                                         "link.h2d_gbps",   "link.d2h_gbps",        "link.latency_ns",
                                         "host.dram_gbps",  "host.cpu_gflops",      "disk.read_gbps",
                                         "disk.latency_ns", "host.submit_ns",       "host.sync_ns",
                                         "host.queue_wake_ns"};
  char host[64] = "this machine", note[256];
  gethostname(host, sizeof host - 1);
  snprintf(note, sizeof note, "ferry calibrate --probe on %s", host);
  if ((st = ferry_hw_write_json(&p, measured, sizeof measured / sizeof measured[0], note, out)) != FERRY_OK)
    return cli_fail(st, NULL);
  printf("memcpy %.2f GB/s (latency %lld ns), O_DIRECT reads %.2f GB/s (latency %lld ns), matmul peak %.1f GFLOP/s, "
         "op issue %lld ns, event round trip %lld ns, idle queue wake-up %lld ns\n",
         p.link.h2d_gbps, (long long)p.link.latency_ns, p.disk.read_gbps, (long long)p.disk.latency_ns,
         p.host.cpu_gflops, (long long)p.host.submit_ns, (long long)p.host.sync_ns, (long long)p.host.queue_wake_ns);
  for (int i = 0; i < FERRY_HW_COST_KINDS; i++)
    if (p.cost_set >> i & 1)
      printf("  %-12s %9.0f ns + %s(%.4f ns/byte, %.5f ns/flop)\n", ferry_hw_cost_kind_name(i), p.cost[i].overhead_ns,
             p.cost[i].roofline ? "max" : "sum", p.cost[i].ns_per_byte, p.cost[i].ns_per_flop);
  printf("wrote %s\n", out);
  return CLI_OK;
}
