/* The `ferry` command: dispatches to one subcommand per concept (model, run, sim, ...). */
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/json.h"

static const struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
} commands[] = {
    {"run", cmd_run, "serve a request trace with weight offloading on a real executor"},
    {"sim", cmd_sim, "simulate serving a request trace on a hardware profile (same engine, virtual time)"},
    {"calibrate", cmd_calibrate, "measure this machine or fit a hardware profile to a recorded run"},
    {"model", cmd_model, "describe, generate and inspect models (show, gen, list)"},
    {"trace", cmd_trace, "request traces: statistics, conversion to JSONL, synthetic (stats, convert, synth)"},
    {"hw", cmd_hw, "hardware profiles for the simulator (list, show)"},
    {"db", cmd_db, "result databases: list, show, diff, export-trace, import-nsys"},
    {"sweep", cmd_sweep, "run the cartesian product of run parameters into one database (resumable)"},
    {"report", cmd_report, "HTML/Markdown/CSV report with gnuplot plots from result databases"},
    {"plan", cmd_plan, "the cheapest hardware and configuration serving a workload within a latency SLO"},
    {"predictor", cmd_predictor, "expert predictors: train an MLP, evaluate on a routing trace (train, eval)"},
    {"ctl", cmd_ctl, "control a serving run over its --control-socket (reload weights, status)"},
};

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry COMMAND [OPTIONS]\n"
          "GPU weight offloading, measured: an offload runtime and its simulator.\n\n"
          "Commands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\nRun 'ferry COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv) {
  ferry__json_init(); /* every cJSON tree of the process through one allocator */
  /* A serving process sheds memory under pressure and swaps weights while it runs: what it frees
   * must leave it. glibc's dynamic thresholds grow to the largest block freed (a 4 MiB scan
   * buffer, a weight buffer) and then keep blocks up to that size on the heap after they are
   * freed; fixed thresholds map large blocks and trim the heap, so memory stays flat over a run. */
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
  if (argc < 2) {
    usage(stderr);
    return CLI_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return CLI_OK;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("ferry %s\n", FERRY_VERSION);
    return CLI_OK;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "ferry: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return CLI_USAGE;
}
