/* Options shared by `ferry run` and `ferry sim`, and the steps both take. */
#ifndef FERRY_CLI_RUN_COMMON_H
#define FERRY_CLI_RUN_COMMON_H

#include <stdio.h>

#include "cli/output.h"
#include "cli/run_options.h"
#include "ferry/engine.h"
#include "ferry/hw.h"
#include "ferry/trace.h"
#include "cli/run_resil.h"

struct run_args {
  const char *cmd; /* "run" or "sim" */
  int sim;         /* cmd is "sim" */
  /* every option of the table (run_options.h), as given or defaulted */
#define RUN_ARGS_FIELD_(field, name, type, ...) RUN_CTYPE_##type field;
  FERRY_RUN_OPTIONS(RUN_ARGS_FIELD_)
#undef RUN_ARGS_FIELD_
  unsigned char given[RUN_OPT_COUNT]; /* 1 for each option given on the command line */
  char time_window_text[64];          /* --time-window in its canonical spelling */
  char offload_compute_text[64];      /* --offload-compute in its canonical spelling */
  char expert_cache_text[32];         /* --expert-cache per-layer:K in its canonical spelling */
  int compute_experts_given;          /* --offload-compute named the experts (plain or experts=) */
  /* what the options imply for the library (run_parse fills them) */
  struct ferry_trace_options trace_opts;
  struct ferry_engine_config ec;
  int progress;     /* not --quiet */
  int64_t n_requests;
  int64_t too_long; /* requests longer than the model's maximum position, skipped (--skip-bad) */
  enum cli_format output_format; /* --format of the summary */
  /* set by run_repeat() for each repetition; run_execute() fills the out fields */
  int repeat_index;
  const char *group_tag;                   /* the repeat group written to the database, or NULL */
  struct ferry_serve_summary *summary_out; /* receives the summary (not printed) when not NULL */
  int64_t run_id_out;                      /* the run's id in --db, or 0 */
  struct resil_opts resil;                 /* what --faults, --pressure, --reload-at, ... imply (cli/run_resil.h) */
  char pressure_marks_text[64];            /* --pressure-marks in its canonical spelling */
  /* called once the engine has served the requests, before anything is written (ferry plan
   * reads the per-request metrics), once per replica's engine in replica order with --replicas;
   * NULL for none */
  /* sim: one figure of the profile set after it is opened (its runtime applied), as
   * BASE+PATH=VALUE would (ferry_hw_set_figure()); NULL for none (--sensitivity sets it) */
  const char *hw_figure_path, *hw_figure_value;
  void (*on_served)(void *user, const ferry_engine *engine);
  void *served_user;
};

/* Whether an option was given on the command line, by field: RUN_GIVEN(a, block_layers). */
#define RUN_GIVEN(a, field) ((a)->given[RUN_OPT_##field])
/* The same by long option name ("block-layers"). */
int run_given(const struct run_args *a, const char *name);

void run_usage(FILE *f, const char *cmd);
/* 0 to go on, -1 after --help, or a CLI exit code. */
int run_parse(int argc, char **argv, const char *cmd, struct run_args *a);
/* The requests to serve. One longer (prompt + output) than the model's maximum position is an
 * error naming it, or with --skip-bad is skipped and counted in a->too_long. Without
 * --max-seq-tokens the KV capacity becomes the longest request kept. */
ferry_status run_load_requests(struct run_args *a, struct ferry_engine_request **out, int64_t *n);
/* Canonical configuration JSON (owned, ferry_free) and its 16-hex-digit hash. */
char *run_config_json(const struct run_args *a);
void run_config_hash(const char *config_json, char out[17]);
/* Open model/store/executor, build the engine, serve, print, write the database. */
int run_execute(struct run_args *a);
/* What run_execute() would plan (the inputs opened, the default budgets applied to a->ec), then
 * whether the prefetch depth is used (ferry_engine_prefetch_depth_used()); *used is 1 whenever
 * that is not known: resilience options, a predictor, or an error (CLI_FAIL, not printed). */
int run_prefetch_depth_used(struct run_args *a, int *used);
/* run_execute() --repeat times on fresh copies of the options, each repetition its own run in
 * the repeat group, then the summaries in --format (run_summary.c). */
int run_repeat(const struct run_args *a);
/* `ferry sim --sensitivity PCT`: the run, then one run per figure of its profile that scales a
 * cost (ferry_hw_figures()) with that figure PCT % lower; prints how the summary moves. */
int run_sensitivity(const struct run_args *a);
/* Figure f lowered by pct percent, written as the profile reader takes it (the fewest digits
 * that read back; an integer figure rounded); 0 when lowering does not change it (a time of a
 * nanosecond or two). */
int run_figure_lowered(const struct ferry_hw_figure *f, double pct, char *out, size_t len);
/* What an unsourced basis is, in words ("a ferry default, not a measurement", "an estimate",
 * "given without a source"); NULL for a figure that rests on a source, a fit or a rule. */
const char *run_basis_unsourced(enum ferry_hw_basis b);
/* The profile a simulation runs on (--hw, --runtime and hw_figure_path applied); owned by the
 * caller (ferry_hw_close()). */
ferry_status run_open_sim_profile(const struct run_args *a, ferry_hw **hw);

#endif
