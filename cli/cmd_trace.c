/* `ferry trace`: inspect request traces (stats), convert any supported format to ferry JSONL
 * (convert) and generate synthetic traces (synth). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/units.h"
#include "common/fsutil.h"
#include "ferry/trace.h"

static const char *const trace_usage =
    "Usage: ferry trace stats FILE [OPTIONS]\n"
    "       ferry trace convert FILE [OPTIONS] [--out OUT.jsonl]\n"
    "       ferry trace synth SPEC [--seed S] [--out OUT.jsonl]\n"
    "       ferry trace routing FILE | --synth SPEC  (routing traces: see 'ferry trace routing --help')\n"
    "Inspect, convert and generate request traces.\n\n"
    "Formats read: azure (Azure LLM inference 2023 CSV), burstgpt (BurstGPT CSV), mooncake\n"
    "(Mooncake JSONL), jsonl (ferry JSONL); detected from the first line unless forced.\n\n"
    "Options for stats and convert:\n"
    "  --trace-format F    auto (default), azure, burstgpt, mooncake or jsonl\n"
    "  --skip-bad          count and skip malformed rows instead of failing\n"
    "  --keep-failed       keep BurstGPT rows with 0 response tokens (skipped by default)\n"
    "  --time-window A:B   keep requests arriving in [A, B) seconds after the first; A or B may\n"
    "                      be empty (\"600:\", \":60\"); times then start at A\n"
    "  --rate-scale X      divide inter-arrival times by X (2 = twice the rate)\n"
    "  --max-requests N    keep the first N requests (after the window)\n"
    "  --out FILE          (convert, synth) output file, '-' for standard output (default)\n"
    "  --seed S            (synth) random seed (default 1)\n\n"
    "Synthetic SPEC: comma-separated key=value: arrivals=poisson|gamma|uniform, rate=REQ_PER_S,\n"
    "cv=C (gamma), n=N, prompt=D, output=D with D = N | uniform:LO:HI | lognormal:MEDIAN:SIGMA |\n"
    "resample:TRACE_FILE. Example: arrivals=gamma,cv=2,rate=4,n=1000,prompt=lognormal:512:0.6\n";

static int wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
  return 0;
}

/* "--name value" or "--name=value": returns the value and advances *i, or NULL if argv[*i] is
 * not this option. *missing is set when the option has no value. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, int *missing) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n)) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n]) return NULL;
  if (*i + 1 >= argc) {
    *missing = 1;
    return NULL;
  }
  return argv[++*i];
}

static int parse_window(const char *text, struct ferry_trace_options *o) {
  if (ferry__parse_window_ns(text, &o->window_start_ns, &o->window_end_ns) == FERRY_OK) return 0;
  fprintf(stderr, "ferry: --time-window: %s\n", ferry_last_error());
  return -1;
}

struct trace_args {
  const char *input;
  const char *out;
  int64_t seed;
  struct ferry_trace_options opts;
};

/* Shared option parsing; `allow` is a bit set: 1 read options, 2 --out, 4 --seed. */
static int parse_args(int argc, char **argv, const char *cmd, int allow, struct trace_args *a) {
  memset(a, 0, sizeof *a);
  a->out = "-";
  a->seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *v;
    int missing = 0;
    if ((allow & 1) && (v = opt_value(argc, argv, &i, "--trace-format", &missing))) {
      if (ferry_trace_format_parse(v, &a->opts.format) != FERRY_OK)
        return cli_usage_error(cmd, "--trace-format: %s", ferry_last_error());
    } else if ((allow & 1) && !strcmp(argv[i], "--skip-bad")) {
      a->opts.skip_bad = 1;
    } else if ((allow & 1) && !strcmp(argv[i], "--keep-failed")) {
      a->opts.keep_failed = 1;
    } else if ((allow & 1) && (v = opt_value(argc, argv, &i, "--time-window", &missing))) {
      if (parse_window(v, &a->opts)) return CLI_USAGE;
    } else if ((allow & 1) && (v = opt_value(argc, argv, &i, "--rate-scale", &missing))) {
      if (cli_parse_double("--rate-scale", v, 1e-6, 1e6, &a->opts.rate_scale)) return CLI_USAGE;
    } else if ((allow & 1) && (v = opt_value(argc, argv, &i, "--max-requests", &missing))) {
      if (cli_parse_int("--max-requests", v, 1, INT64_MAX, &a->opts.max_requests)) return CLI_USAGE;
    } else if ((allow & 2) && (v = opt_value(argc, argv, &i, "--out", &missing))) {
      a->out = v;
    } else if ((allow & 4) && (v = opt_value(argc, argv, &i, "--seed", &missing))) {
      if (cli_parse_int("--seed", v, 0, INT64_MAX, &a->seed)) return CLI_USAGE;
    } else if (missing) {
      return cli_usage_error(cmd, "option '%s' needs a value", argv[i]);
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error(cmd, "unknown option '%s'", argv[i]);
    } else if (!a->input) {
      a->input = argv[i];
    } else {
      return cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
    }
  }
  if (!a->input) return cli_usage_error(cmd, "missing %s", allow & 4 ? "SPEC" : "FILE");
  return CLI_OK;
}

static void print_dist(const char *name, const struct ferry_trace_dist *d) {
  printf("%-14s %10.1f %8" PRId64 " %8" PRId64 " %8" PRId64 " %8" PRId64 " %8" PRId64 "\n", name, d->mean, d->min,
         d->p50, d->p90, d->p99, d->max);
}

static int trace_stats(int argc, char **argv) {
  struct trace_args a;
  int rc = parse_args(argc, argv, "trace stats", 1, &a);
  if (rc != CLI_OK) return rc;
  ferry_trace *t;
  ferry_status st = ferry_trace_open(&t, a.input, &a.opts);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  struct ferry_trace_stats s;
  st = ferry_trace_get_stats(t, &s);
  if (st != FERRY_OK) {
    ferry_trace_free(t);
    return cli_fail(st, NULL);
  }
  printf("trace          %s (%s)\n", a.input, ferry_trace_format_name(ferry_trace_get_format(t)));
  printf("requests       %zu\n", s.count);
  printf("skipped        %zu malformed, %zu failed (0 output tokens)\n", s.skipped_bad, s.skipped_failed);
  if (s.skipped_bad) printf("first skipped  %s\n", ferry_trace_errmsg(t));
  if (s.out_of_order) printf("out of order   %zu rows (sorted by arrival)\n", s.out_of_order);
  printf("span           %.3f s\n", s.span_ns / 1e9);
  printf("mean rate      %.3f req/s\n", s.rate_per_s);
  printf("%-14s %10s %8s %8s %8s %8s %8s\n", "tokens", "mean", "min", "p50", "p90", "p99", "max");
  print_dist("prompt", &s.prompt);
  print_dist("output", &s.output);
  ferry_trace_free(t);
  return CLI_OK;
}

static int write_out(ferry_trace *t, const char *out) {
  ferry_status st = ferry_trace_write_jsonl(t, out);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  if (strcmp(out, "-")) fprintf(stderr, "ferry: wrote %zu requests to %s\n", ferry_trace_count(t), out);
  return CLI_OK;
}

static int trace_convert(int argc, char **argv) {
  struct trace_args a;
  int rc = parse_args(argc, argv, "trace convert", 1 | 2, &a);
  if (rc != CLI_OK) return rc;
  const struct ferry_path_use paths[] = {{"--out", a.out, FERRY_PATH_OUT}, {"FILE", a.input, 0}};
  if ((rc = cli_check_paths("trace convert", paths, 2))) return rc;
  ferry_trace *t;
  ferry_status st = ferry_trace_open(&t, a.input, &a.opts);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  rc = write_out(t, a.out);
  ferry_trace_free(t);
  return rc;
}

static int trace_synth(int argc, char **argv) {
  struct trace_args a;
  int rc = parse_args(argc, argv, "trace synth", 2 | 4, &a);
  if (rc != CLI_OK) return rc;
  ferry_trace *t;
  ferry_status st = ferry_trace_synthetic(&t, a.input, (uint64_t)a.seed);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  rc = write_out(t, a.out);
  ferry_trace_free(t);
  return rc;
}

int cmd_trace(int argc, char **argv) {
  if (argc < 2) {
    fputs(trace_usage, stderr);
    return CLI_USAGE;
  }
  if (!strcmp(argv[1], "routing")) return cmd_trace_routing(argc - 1, argv + 1);
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help") || wants_help(argc, argv)) {
    fputs(trace_usage, stdout);
    return CLI_OK;
  }
  if (!strcmp(argv[1], "stats")) return trace_stats(argc - 1, argv + 1);
  if (!strcmp(argv[1], "convert")) return trace_convert(argc - 1, argv + 1);
  if (!strcmp(argv[1], "synth")) return trace_synth(argc - 1, argv + 1);
  return cli_usage_error("trace", "unknown subcommand '%s' (expected stats, convert, synth or routing)", argv[1]);
}
