/* Options shared by `ferry run` and `ferry sim`, and the steps both take. */
#ifndef FERRY_CLI_RUN_COMMON_H
#define FERRY_CLI_RUN_COMMON_H

#include <stdio.h>

#include "ferry/engine.h"
#include "ferry/trace.h"

struct run_args {
  const char *cmd, *model, *trace, *synthetic, *backend, *hw, *db, *dump_logits;
  const char *record_routing, *record_features, *routing, *routing_synth, *quant, *predictor, *predictor_routing, *predictor_model;
  const char *runtime; /* sim: runtime preset or file (NULL: the profile's, else "native") */
  struct ferry_trace_options trace_opts;
  struct ferry_engine_config ec;
  uint64_t seed;
  double time_scale;
  int as_fast, plan_only, progress, threads, profile;
  int host_pageable; /* --host-memory pageable: the host tier is not pinned */
  int keep_cache;    /* --keep-cache: buffered disk reads keep their pages */
  int64_t n_requests;
};

void run_usage(FILE *f, const char *cmd);
/* 0 to go on, -1 after --help, or a CLI exit code. */
int run_parse(int argc, char **argv, const char *cmd, struct run_args *a);
ferry_status run_load_requests(struct run_args *a, struct ferry_engine_request **out, int64_t *n);
/* Canonical configuration JSON (owned, ferry_free) and its 16-hex-digit hash. */
char *run_config_json(const struct run_args *a);
void run_config_hash(const char *config_json, char out[17]);
/* Open model/store/executor, build the engine, serve, print, write the database. */
int run_execute(struct run_args *a);

#endif
