/* `ferry plan`: the pieces shared by its files. cmd_plan.c parses the options and prints,
 * plan_search.c drives each hardware profile's search (bounds, rate search, replicas, record),
 * plan_work.c runs simulations in worker processes, plan_workload.c writes the request slices
 * the simulations replay, plan_record.c writes the study database. The decisions themselves
 * (saturation, the rate search, costs, the cheapest pick) are the library's (ferry/plan.h). */
#ifndef FERRY_CLI_PLAN_H
#define FERRY_CLI_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "cli/output.h"
#include "ferry/engine.h"
#include "ferry/plan.h"

#define PLAN_MAX_QUANT 6
#define PLAN_MAX_BATCHES 12
#define PLAN_MAX_SLO 12
#define PLAN_MAX_REPLICAS 64
#define PLAN_MAX_HW 128
#define PLAN_MAX_VERIFY 64
#define PLAN_MAX_LADDERS 16

/* One SLO term: a latency statistic at most a limit. */
enum plan_metric { PLAN_TTFT, PLAN_TPOT, PLAN_E2E };
enum plan_stat { PLAN_MEAN, PLAN_P50, PLAN_P90, PLAN_P99 };
struct plan_slo {
  enum plan_metric metric;
  enum plan_stat stat;
  double limit_ns;
};

struct plan_opts {
  const char *model, *trace, *synthetic, *trace_format, *time_window, *db, *runtime, *hw;
  int skip_bad;
  int64_t requests;         /* --requests: the slice each replica serves */
  double demand_rps;        /* --rate; 0: the slice's own rate */
  struct plan_slo slo[PLAN_MAX_SLO];
  int n_slo;
  char slo_text[256];
  int max_gpus;
  double budget_per_hour;   /* 0: none */
  double tolerance;
  int jobs, quiet;
  int verify;               /* --verify N: a brute-force scan of N rates around each answer */
  enum cli_format fmt;
  const char *quant[PLAN_MAX_QUANT]; /* NULL: the model's own format */
  int n_quant;
  int32_t batches[PLAN_MAX_BATCHES];
  int n_batches;
  int batch_ladder;         /* 1: stop raising the batch when throughput stops growing */
  int exhaustive;           /* --exhaustive: search every bounded configuration to its end (no pruning) */
  double sensitivity;       /* --sensitivity PCT: the cheapest pick at the demand with each figure of its
                               profile PCT % lower (plan_sensitivity.h); 0: not asked */
  uint64_t seed;
  int moe;                  /* the model routes experts (set from the model: --seed seeds its routing) */
};

/* How one engine splits the model over its GPUs (ferry sim --parallel). */
enum plan_parallel { PLAN_PAR_NONE, PLAN_PAR_TP, PLAN_PAR_PP, PLAN_PAR_EP };

/* A point of the policy space. */
struct plan_knobs {
  int32_t quant;            /* index into plan_opts.quant */
  int32_t max_batch;
  int32_t block_layers;     /* 0: the default */
  int32_t prefetch_depth;   /* -1: the default */
  int32_t expert_lfu;       /* -1: the default (lru), 1: lfu */
  int32_t gpus;             /* GPUs one engine drives (--gpus); 0 or 1: one */
  int32_t parallel;         /* enum plan_parallel: how, with gpus > 1 */
};

/* The replicas' router (ferry sim --router): the load-aware one that counts work left. */
#define PLAN_ROUTER "least-tokens"

enum plan_job_kind { PLAN_JOB_BOUND, PLAN_JOB_PROBE, PLAN_JOB_RECORD };

/* What a worker is asked to simulate: self-contained (workers were forked before it existed). */
struct plan_job {
  int64_t id;
  int32_t kind;
  int32_t hw;               /* index into the hardware list */
  int32_t cand;             /* the hardware's candidate */
  struct plan_knobs k;
  double rps;               /* total rate over the replicas (ignored by bounds: all at once) */
  int32_t replicas;
  int32_t slot;             /* --verify: the grid point */
  int32_t prefix;           /* the floor check: first try the first `prefix` requests of the slice
                               (plan_floor_prove), 0: simulate the job as it is */
  char figure[64];          /* --sensitivity: a figure of the profile set to figure_value ("": none) */
  char figure_value[40];
};

/* What came back. Latencies in ns over every replica's requests. */
struct plan_result {
  int64_t id;
  int32_t ok;
  char error[240];
  double ttft[4], tpot[4], e2e[4]; /* mean, p50, p90, p99 */
  int64_t requests, done;
  double duration_s;        /* first arrival to last finish, the longest replica */
  double throughput_rps;    /* done / duration */
  double mean_output_tokens;
  int32_t saturated;        /* some replica's queue grew without bound */
  double queue_growth_rps;  /* the largest replica's */
  int32_t streams;          /* weights were fetched while serving (offloaded) */
  int32_t reused;           /* an equivalent candidate's simulation, not run again (plan_hw_reuse) */
  int32_t floor_proven;     /* the floor check answered from a prefix (plan_floor_prove): the latencies
                               are lower bounds of the whole slice's */
  int64_t proven_by;        /* then: the requests whose latencies are the whole slice's */
  int64_t run_ids[PLAN_MAX_REPLICAS];
  int32_t n_run_ids;
};

/* The request slices the simulations replay: for R replicas, the first max(N, 50 R) requests
 * of the workload in one file, which `ferry sim --replicas R --router least-tokens` shares out;
 * arrival times are scaled per probe. */
struct plan_workload;
int plan_workload_open(const struct plan_opts *o, struct plan_workload **out);
/* Write the files for R replicas if not done yet; 0 or CLI_FAIL. */
int plan_workload_prepare(struct plan_workload *w, int replicas);
/* The file of the slice for R replicas (in buf). */
const char *plan_workload_file(const struct plan_workload *w, int replicas, char *buf, size_t len);
/* Requests per second of the slice for R replicas as recorded (all replicas together). */
double plan_workload_rate(const struct plan_workload *w, int replicas);
/* Mean output tokens per request of the one-replica slice. */
double plan_workload_mean_output(const struct plan_workload *w);
size_t plan_workload_count(const struct plan_workload *w, int replicas);
/* The folder of the files (kept with --db, else removed by plan_workload_close). */
const char *plan_workload_dir(const struct plan_workload *w);
void plan_workload_close(struct plan_workload *w);

/* The `ferry sim` arguments of a job (argv[0] = "sim", NULL-terminated; owned strings in the
 * caller's buffer). */
struct plan_argv {
  char *v[64];
  char store[4096];
  size_t used;
  int n;
};
void plan_job_argv(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                   const struct plan_job *j, const char *db, struct plan_argv *a);
/* A human description of knobs ("int8, batch 32, prefetch 2", "native, batch 8, tp 2"). */
void plan_knobs_text(const struct plan_opts *o, const struct plan_knobs *k, char *buf, size_t len);
/* "none", "tp", "pp" or "ep" (ferry sim --parallel). */
const char *plan_parallel_name(int parallel);

/* Worker pool: plan_pool_start forks n workers on this machine and, under mpirun, takes the
 * other ranks as one worker each (plan_remote_worker); submit sends a job to an idle one
 * (local_only: a worker of this machine, for jobs that write its files); wait blocks for a
 * result. */
struct plan_pool;
struct cli_mpi;
int plan_pool_start(const struct plan_opts *o, const char *const *hw_names, const struct plan_workload *w,
                    int n, struct cli_mpi *mpi, struct plan_pool **out);
int plan_pool_slots(const struct plan_pool *p);
int plan_pool_idle(const struct plan_pool *p);
int plan_pool_idle_local(const struct plan_pool *p);
int plan_pool_submit(struct plan_pool *p, const struct plan_job *j, int local_only);
int plan_pool_wait(struct plan_pool *p, struct plan_result *r);
void plan_pool_stop(struct plan_pool *p);
/* An MPI rank other than 0: run the jobs rank 0 sends until it says stop. */
int plan_remote_worker(const struct plan_opts *o, const char *const *hw_names, struct plan_workload *w,
                       struct cli_mpi *mpi);
/* Run one job in this process (workers, and the MPI ranks). */
void plan_job_run(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                  const struct plan_job *j, struct plan_result *r);

/* 1 when configuration k simulates exactly as `twin` on this profile and workload: the two
 * differ only in their prefetch depth, their runs get the same engine configuration once the
 * budgets are applied, and the engine uses the depth in neither
 * (ferry_engine_prefetch_depth_used()). Else 0 (also when that cannot be worked out). */
int plan_same_runs(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                   const struct plan_knobs *k, const struct plan_knobs *twin);

/* Per-request times of a run, as the engines served them (plan_on_served gathers them: the
 * served hook of run_args, called once per replica); replica i's are [seg[i], seg[i + 1]). */
struct plan_served {
  int64_t *arrival, *first, *finish, *output;
  size_t n, cap;
  size_t seg[PLAN_MAX_REPLICAS + 1];
  int nseg;
  int oom;
};
void plan_on_served(void *user, const ferry_engine *eng);
void plan_served_free(struct plan_served *s);

/* The floor check's first try (docs/plan.md, step 2): simulate only the first j->prefix requests
 * of the slice, with the KV capacity the whole slice gets. A request of the prefix that finished
 * before the next request of the slice arrived was served exactly as in the whole slice's run (the engine sees no request before it arrives), so its latencies are the whole
 * run's; enough of them above a limit bound the whole run's statistic from below
 * (ferry_plan_percentile_floor). 1 with *r filled (floor_proven, the bounds as its latencies,
 * complete and stable) when those bounds miss the SLO by FERRY_PLAN_FLOOR_MISS or more; else 0
 * (r unspecified) and the job is to be simulated whole. */
int plan_floor_prove(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                     const struct plan_job *j, struct plan_result *r);
/* Requests the floor check first tries for R replicas: enough for the SLO's percentile term
 * that needs the fewest misses, three times over, and at least 10 a replica; 0 when that is not
 * much less than the slice. */
int32_t plan_floor_prefix(const struct plan_opts *o, const struct plan_workload *w, int replicas);

/* Whether a result meets every SLO term (and is complete and stable); `why` names the first
 * term missed; *excess (may be NULL) the largest ratio of a term to its limit of a complete,
 * stable run, else 0. */
int plan_meets_slo(const struct plan_opts *o, const struct plan_result *r, char *why, size_t len, double *excess);

#endif
