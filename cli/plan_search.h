/* `ferry plan`'s search over one hardware profile, as a state machine the scheduler feeds
 * with simulation results (plan_search.c):
 *   1. bounds: each quantization level's batch ladder (8, 16, 32, ...) served with every
 *      request queued at once gives the throughput of each configuration; a ladder stops when
 *      the throughput grows by less than 5 % or the configuration does not fit; where the
 *      weights stream, offload variants (block size, prefetch depth, expert cache) are added;
 *      on a multi-GPU machine, ladders of engines split over 2, 4, ... of its GPUs too (tensor
 *      parallel, expert parallel for MoE models; pipeline parallel over all of them where a
 *      format does not fit one GPU), the rest of the GPUs as replicas behind the least-tokens
 *      router;
 *   2. search: configurations in order of that throughput, each searched for its highest rate
 *      meeting the SLO (ferry_plan_search), skipping those whose throughput bound is below the
 *      best rate found, scaled by the ratio of rate to bound measured on the configurations
 *      already searched (a configuration serves a stream about as much faster or slower than a
 *      full queue as the others do);
 *   (--verify N: N rates from half to one and a half times the answer are simulated too, a
 *   brute-force check of the search);
 *   3. replicas: when the demand exceeds one GPU's capacity and --max-gpus allows, the fewest
 *      replicas (least-tokens router) that meet it at the demand, verified by simulation;
 *   4. record: with --db, the best configuration at its highest rate is written as sim runs.
 * Every step depends only on this profile's results, so the outcome does not depend on which
 * worker or rank ran what, nor when. */
#ifndef FERRY_CLI_PLAN_SEARCH_H
#define FERRY_CLI_PLAN_SEARCH_H

#include "cli/plan.h"
#include "ferry/hw.h"

/* A configuration under study. */
struct plan_cand {
  struct plan_knobs k;
  int state;                    /* CAND_* in plan_search.c */
  double mu_rps;                /* one replica's throughput with every request queued at once */
  int streams;                  /* weights stream while serving */
  char error[240];              /* why it could not run */
  struct ferry_plan_search s;
  struct plan_result best;      /* the result at s.best_rps */
  int same_as;                  /* an earlier candidate whose simulations are this one's, -1: none */
};

/* A simulation's result, kept to answer the same job of a candidate that runs the same. */
struct plan_kept {
  int cand, kind, replicas;
  double rps;
  struct plan_result r;
};

/* One simulated point, for the report and the database. */
struct plan_probe {
  int cand;
  int kind;                     /* PLAN_JOB_* */
  double rps;
  int replicas;
  int feasible, saturated;
  double ttft_p99_ms, tpot_p99_ms, e2e_p99_ms, throughput_rps;
  char why[256];
};

struct plan_hw {
  char name[sizeof ((struct ferry_hw_profile *)0)->name];
  double price;                 /* the machine's, USD per hour (0: unknown) */
  char price_source[96];
  int gpus;                     /* GPUs in the machine */
  int moe;
  int skipped;
  char why[256];
  struct plan_cand *c;
  int nc, capc;
  /* phase 1: a batch ladder per weight format and per way of splitting the machine */
  struct {
    struct plan_knobs base;     /* the rungs' knobs but the batch limit */
    int next;                   /* index into the batch list of the next rung */
    int running, done;
    int last;                   /* candidate of the last rung, -1 */
  } ladder[PLAN_MAX_LADDERS];
  int nladders;
  int knobs_added;
  /* phases */
  int phase;
  int inflight;
  int searching;                /* candidate being searched, -1 */
  int best_cand;                /* -1: no configuration meets the SLO */
  double best_rps, saturated_rps;
  double ratio;                 /* highest rate found / throughput bound of a searched configuration */
  struct plan_result best;
  /* --verify */
  int verify_next, verify_ok[PLAN_MAX_VERIFY];
  double verify_rps[PLAN_MAX_VERIFY];
  double brute_force_rps;       /* the largest grid rate that meets the SLO */
  /* phase 3 */
  int need_replicas;            /* replicas (GPUs of single-GPU profiles) for the demand; 0: cannot */
  int demand_replicas;
  struct plan_result demand;   /* the demand served by need_replicas replicas */
  /* phase 4 */
  int64_t run_ids[PLAN_MAX_REPLICAS];
  int n_run_ids;
  /* every point simulated */
  struct plan_probe *log;
  int nlog, caplog;
  int sims;
  int reused;                   /* jobs answered by an equivalent candidate's simulation */
  struct plan_kept *kept;
  int nkept, capkept;
  double wall_s;
};

struct plan_state {
  const struct plan_opts *o;
  struct plan_workload *w;
  double demand_rps;
  double mean_output;
  struct plan_hw *hw;
  int nhw;
  int64_t next_job_id;
};

/* Replicas a configuration of this profile simulates: a multi-GPU machine's GPUs shared out
 * among engines of k.gpus GPUs each; one on a single-GPU profile (phase 3 adds more). */
int plan_cand_replicas(const struct plan_hw *h, const struct plan_knobs *k);

/* Set up a profile's search; 0 or CLI_FAIL. */
int plan_hw_init(struct plan_state *ps, struct plan_hw *h);
/* The next job of a profile, if one is ready: 1 and *j filled. */
int plan_hw_next(struct plan_state *ps, struct plan_hw *h, struct plan_job *j);
/* A finished job of this profile. 0 or CLI_FAIL. */
int plan_hw_result(struct plan_state *ps, struct plan_hw *h, const struct plan_job *j, const struct plan_result *r);
/* 1 and *r filled (its id the job's) when the job's candidate runs as an earlier one whose same
 * job was simulated; else 0. */
int plan_hw_reuse(const struct plan_hw *h, const struct plan_job *j, struct plan_result *r);
int plan_hw_done(const struct plan_hw *h);
void plan_hw_free(struct plan_hw *h);

/* Run every profile's search on n local workers (fork) or in this process (n = 0 and no
 * MPI), and under mpirun on the other ranks too. */
struct cli_mpi;
int plan_run(struct plan_state *ps, int workers, struct cli_mpi *mpi);

#endif
