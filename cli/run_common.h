/* Options shared by `ferry run` and `ferry sim`, and the steps both take. */
#ifndef FERRY_CLI_RUN_COMMON_H
#define FERRY_CLI_RUN_COMMON_H

#include <stdio.h>

#include "cli/output.h"
#include "ferry/engine.h"
#include "ferry/trace.h"
#include "cli/run_resil.h"

struct run_args {
  const char *cmd, *model, *trace, *synthetic, *backend, *hw, *db, *dump_logits;
  const char *record_routing, *record_features, *routing, *routing_synth, *quant, *predictor, *predictor_routing, *predictor_model;
  const char *kv_dtype; /* --kv-dtype as given (NULL: the model's dtype) */
  const char *runtime;  /* sim: runtime preset or file (NULL: the profile's, else "native") */
  char offload_compute[64]; /* --offload-compute in canonical form ("" when not given) */
  int compute_experts_given; /* --offload-compute named the experts (plain or experts=) */
  struct ferry_trace_options trace_opts;
  struct ferry_engine_config ec;
  uint64_t seed;
  double time_scale;
  int as_fast, plan_only, progress, threads, profile;
  int host_pageable; /* --host-memory pageable: the host tier is not pinned */
  int keep_cache;    /* --keep-cache: buffered disk reads keep their pages */
  int64_t n_requests;
  int64_t too_long; /* requests longer than the model's maximum position, skipped (--skip-bad) */
  uint64_t given[2]; /* one bit per option given on the command line (run_given()) */
  int repeat;               /* --repeat N (1 by default) */
  const char *repeat_group; /* --repeat-group TAG, or NULL */
  enum cli_format format;   /* --format of the summary */
  /* set by run_repeat() for each repetition; run_execute() fills the out fields */
  int repeat_index;
  const char *group_tag;          /* the repeat group written to the database, or NULL */
  struct ferry_serve_summary *summary_out; /* receives the summary (not printed) when not NULL */
  int64_t run_id_out;             /* the run's id in --db, or 0 */
  struct resil_opts resil; /* --faults, --pressure, --reload-at, ... (cli/run_resil.h) */
  /* called once the engine has served the requests, before anything is written (ferry plan
   * reads the per-request metrics); NULL for none */
  void (*on_served)(void *user, const ferry_engine *engine);
  void *served_user;
};

/* Whether the option with this long name ("block-layers") was given. */
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
/* run_execute() --repeat times on fresh copies of the options, each repetition its own run in
 * the repeat group, then the summaries in --format (run_summary.c). */
int run_repeat(const struct run_args *a);

#endif
