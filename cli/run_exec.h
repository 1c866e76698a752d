/* The state of one `ferry run` / `ferry sim` while it executes, shared by the steps in
 * run_exec.c (open, plan, serve), run_routing.c (routing sources, predictor) and run_output.c
 * (result database, logits, CUPTI). Each step returns a ferry_status; run_execute() prints the
 * first failure once. */
#ifndef FERRY_CLI_RUN_EXEC_H
#define FERRY_CLI_RUN_EXEC_H

#include <stdio.h>

#include "cli/run_common.h"
#include "cli/run_resil.h"
#include "ferry/cupti.h"
#include "ferry/db.h"
#include "ferry/exec.h"
#include "ferry/prefetch.h"
#include "ferry/routing.h"
#include "ferry/store.h"

struct logit_dump {
  FILE *f;
  char *tmp_path; /* written here, renamed to --dump-logits when complete */
  int failed;
  uint64_t nonfinite; /* logits written as null */
};

struct run_ctx {
  struct run_args *a;
  ferry_model *model;
  const struct ferry_model_config *mc;
  ferry_store *store;
  ferry_exec *ex;
  ferry_engine *eng;
  ferry_db *db;
  int64_t run_id; /* -1 until the run's row exists */
  char *config_json;
  char fit_warning[512]; /* the profile's weak fitted costs ("" when none), for the run's metadata */
  struct ferry_engine_request *reqs;
  int64_t n_reqs;
  ferry_routing *recorded;   /* --record-routing */
  ferry_routing *replayed;   /* --routing */
  ferry_routing *pred_trace; /* --predictor-routing */
  int64_t *popularity;       /* its counts, for --expert-cache static */
  ferry_routing_synth *synth;
  ferry_routing_replay *replay;
  ferry_prefetcher *prefetcher;
  ferry_cupti *cupti;
  struct logit_dump dump;
  struct run_resil resil; /* faults, pressure, reloads (cli/run_resil.c) */
  /* --replicas R (cli/run_replicas.c): engines and executors, [0] the run's own (eng, ex) */
  ferry_engine **rep_eng;
  ferry_exec **rep_ex;
  int32_t n_rep;        /* 0 without --replicas */
  int32_t *replica_of;  /* [request] the replica that served it */
};

/* run_exec.c: the executor of the run (`first`) or of another replica */
ferry_status run_open_executor(struct run_ctx *c, int first, ferry_exec **out);

/* run_replicas.c: create replicas 1..R-1 and serve the trace over all; the summary over them (or
 * the one engine); per-replica lines to f (NULL: none) and the run's metadata; release */
ferry_status run_replicas_serve(struct run_ctx *c, const struct ferry_run_options *ro);
void run_replicas_summary(const struct run_ctx *c, struct ferry_serve_summary *out);
void run_replicas_report(const struct run_ctx *c, FILE *f);
void run_replicas_free(struct run_ctx *c);

/* run_routing.c: recording, the simulator's routing source, the expert predictor */
ferry_status run_setup_routing(struct run_ctx *c);
/* before planning: the predictor's and static placement's part of the plan (ferry_prefetcher_plan(),
 * the placement's popularity), so the plan is the run's */
ferry_status run_plan_predictor(struct run_ctx *c);
ferry_status run_setup_predictor(struct run_ctx *c);
ferry_status run_finish_routing(struct run_ctx *c);
void run_free_routing(struct run_ctx *c);

/* run_output.c: the result database, --dump-logits and CUPTI */
ferry_status run_open_dump(struct run_ctx *c);
ferry_status run_close_dump(struct run_ctx *c, int ok);
ferry_status run_db_begin(struct run_ctx *c);
ferry_status run_db_write_results(struct run_ctx *c, const struct ferry_serve_summary *sum);
/* Stops CUPTI and marks the run finished (with the error when !ok); returns a failure to
 * finish. */
ferry_status run_db_finish(struct run_ctx *c, int ok);

#endif
