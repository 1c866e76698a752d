/* `ferry report`: turn one or more result databases into a folder with index.html, report.md,
 * CSV tables and gnuplot-drawn SVG plots (the work is in reports/, see include/ferry/report.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/fsutil.h"
#include "ferry/report.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry report --db STUDY.db [--db MORE.db ...] --out DIR [OPTIONS]\n"
          "Write a report of every run in the databases: DIR/index.html (self-contained, plots inline as\n"
          "SVG), DIR/report.md, DIR/tables/*.csv and DIR/plots/*.gp (the gnuplot script of each plot).\n"
          "Sections appear when the data allows: runs, latency and throughput against each swept\n"
          "parameter, bytes moved and stall, timeline, memory per tier, sim against real,\n"
          "quantization, predictors, hardware what-if with cost per million tokens.\n\n"
          "Options:\n"
          "  --db FILE             result database (repeat for several)\n"
          "  --out DIR             output folder; an existing one is replaced (when the report is complete)\n"
          "                        only if it is an earlier report or empty\n"
          "  --title TEXT          report title\n"
          "  --timeline-run [D:]N  run for the timeline and memory plots (N in database D, counted from 1;\n"
          "                        default: the first complete run with a timeline)\n"
          "  --steps A:B           engine steps of the timeline (default: the first three)\n"
          "  --slo-ttft-p99 MS     hardware what-if: TTFT P99 objective in ms\n"
          "  --slo-tpot-p99 MS     hardware what-if: TPOT P99 objective in ms\n"
          "  --hw-path DIRS        folders of hardware profiles for prices (default $FERRY_HW_PATH, then hw/)\n"
          "  --gnuplot PROG        gnuplot executable (default: gnuplot on PATH)\n"
          "  --quiet               print nothing on success\n"
          "  -h, --help            this help\n");
}

enum { OPT_DB = 256, OPT_OUT, OPT_TITLE, OPT_TL_RUN, OPT_STEPS, OPT_SLO_TTFT, OPT_SLO_TPOT, OPT_HW_PATH, OPT_GNUPLOT, OPT_QUIET };

/* --timeline-run [D:]N: run N of database D (1-based; the first without D). */
static int parse_timeline_run(const char *arg, struct ferry_report_options *o) {
  int64_t v;
  const char *colon = strchr(arg, ':');
  if (!colon) return cli_parse_int("--timeline-run", arg, 0, INT64_MAX, &o->timeline_run) ? CLI_USAGE : CLI_OK;
  char dbi[24];
  size_t n = (size_t)(colon - arg);
  if (n == 0 || n >= sizeof dbi) return cli_usage_error("report", "--timeline-run: expected [D:]N, got '%s'", arg);
  memcpy(dbi, arg, n);
  dbi[n] = '\0';
  if (cli_parse_int("--timeline-run", dbi, 1, 64, &v)) return CLI_USAGE;
  o->timeline_db = (int)v - 1;
  return cli_parse_int("--timeline-run", colon + 1, 0, INT64_MAX, &o->timeline_run) ? CLI_USAGE : CLI_OK;
}

static void print_summary(const struct ferry_report_summary *sum, const char *out_dir) {
  printf("ferry: report of %zu runs (%zu complete, %zu failed) in %s: %zu plots, %zu tables; sections:", sum->runs,
         sum->complete, sum->failed, out_dir, sum->plots, sum->tables);
  for (unsigned bit = 1; bit <= FERRY_REPORT_STRATEGIES; bit <<= 1)
    if (sum->sections & bit) printf(" %s", ferry_report_section_name((enum ferry_report_section)bit));
  printf("\n");
  if (sum->sim_real_flagged)
    printf("ferry: %zu of %zu sim-vs-real pairs flagged (error above 10 %% or weak fits): see the flag column\n",
           sum->sim_real_flagged, sum->sim_real_pairs);
  printf("ferry: open %s/index.html\n", out_dir);
}

int cmd_report(int argc, char **argv) {
  static const struct option opts[] = {{"db", required_argument, 0, OPT_DB},
                                       {"out", required_argument, 0, OPT_OUT},
                                       {"title", required_argument, 0, OPT_TITLE},
                                       {"timeline-run", required_argument, 0, OPT_TL_RUN},
                                       {"steps", required_argument, 0, OPT_STEPS},
                                       {"slo-ttft-p99", required_argument, 0, OPT_SLO_TTFT},
                                       {"slo-tpot-p99", required_argument, 0, OPT_SLO_TPOT},
                                       {"hw-path", required_argument, 0, OPT_HW_PATH},
                                       {"gnuplot", required_argument, 0, OPT_GNUPLOT},
                                       {"quiet", no_argument, 0, OPT_QUIET},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  struct ferry_report_options o;
  ferry_report_options_init(&o);
  const char *dbs[64];
  size_t n_dbs = 0;
  int quiet = 0;
  optind = 1;
  int c;
  while ((c = cli_getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case OPT_DB:
        if (n_dbs == sizeof dbs / sizeof dbs[0]) return cli_usage_error("report", "at most 64 --db");
        dbs[n_dbs++] = optarg;
        break;
      case OPT_OUT: o.out_dir = optarg; break;
      case OPT_TITLE: o.title = optarg; break;
      case OPT_TL_RUN: if (parse_timeline_run(optarg, &o)) return CLI_USAGE; break;
      case OPT_STEPS: {
        long long a, b;
        char extra;
        if (sscanf(optarg, "%lld:%lld%c", &a, &b, &extra) != 2 || a < 0 || b < a)
          return cli_usage_error("report", "--steps: expected A:B with 0 <= A <= B, got '%s'", optarg);
        o.step_first = a;
        o.step_last = b;
        break;
      }
      case OPT_SLO_TTFT: if (cli_parse_double("--slo-ttft-p99", optarg, 0, 1e12, &o.slo_ttft_p99_ms)) return CLI_USAGE; break;
      case OPT_SLO_TPOT: if (cli_parse_double("--slo-tpot-p99", optarg, 0, 1e12, &o.slo_tpot_p99_ms)) return CLI_USAGE; break;
      case OPT_HW_PATH: o.hw_path = optarg; break;
      case OPT_GNUPLOT: o.gnuplot = optarg; break;
      case OPT_QUIET: quiet = 1; break;
      case 'h': usage(stdout); return CLI_OK;
      default: return cli_usage_error("report", "invalid option");
    }
  }
  if (optind < argc) return cli_usage_error("report", "unexpected argument '%s'", argv[optind]);
  if (n_dbs == 0) return cli_usage_error("report", "missing --db FILE");
  if (!o.out_dir) return cli_usage_error("report", "missing --out DIR");
  if (o.timeline_db >= (int)n_dbs)
    return cli_usage_error("report", "--timeline-run: database %d given but only %zu --db", o.timeline_db + 1, n_dbs);
  o.db_paths = dbs;
  o.n_dbs = n_dbs;
  struct ferry_path_use paths[65] = {{"--out", o.out_dir, FERRY_PATH_OUT | FERRY_PATH_DIR}};
  for (size_t i = 0; i < n_dbs; i++) paths[i + 1] = (struct ferry_path_use){"--db", dbs[i], FERRY_PATH_SQLITE};
  if (cli_check_paths("report", paths, n_dbs + 1)) return CLI_USAGE;
  struct ferry_report_summary sum;
  ferry_status st = ferry_report_write(&o, &sum);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  if (!quiet) print_summary(&sum, o.out_dir);
  return CLI_OK;
}
