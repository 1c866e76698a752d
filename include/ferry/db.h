/**
 * @file db.h
 * @brief The result database: one SQLite file per study holding every run (simulated or
 *        real) with its requests, engine steps, memory samples and a timeline in the table
 *        layout of Nsight Systems' SQLite export. The full schema is in docs/schema.md.
 *
 * Writing: ferry_db_open() with FERRY_DB_CREATE, ferry_db_run_begin() (the run row is
 * committed at once with complete = 0), then rows through ferry_db_add_request(),
 * ferry_db_add_step(), ferry_db_add_memory() and the activity sink
 * ferry_db_activity_sink(), ferry_db_flush() as often as wanted, and ferry_db_run_finish().
 * Rows are written in batched transactions, so a process killed mid-run leaves a consistent
 * database in which the run is marked incomplete and every committed batch is intact.
 *
 * Threads: ferry_db_activity_sink() may be called from any number of threads at once. Every
 * other function must be called from one thread at a time per handle.
 */
#ifndef FERRY_DB_H
#define FERRY_DB_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/activity.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Schema version this build writes (stored in PRAGMA user_version). */
#define FERRY_DB_SCHEMA_VERSION 11

/** PRAGMA application_id of every ferry result database ("FRRY"). */
#define FERRY_DB_APPLICATION_ID 0x46525259

/** Opaque handle on an open result database. */
typedef struct ferry_db ferry_db;

/** How to open a database (ferry_db_open() flags). */
enum ferry_db_open_flags {
  FERRY_DB_READ_ONLY = 0, /**< open an existing database for reading only; nothing is written */
  FERRY_DB_CREATE = 1     /**< open for reading and writing, creating and migrating as needed */
};

/** Kind of a run (runs.kind) for the executors every build has; a run of any registered
 *  executor names it in ferry_run_info::executor instead. */
enum ferry_run_kind {
  FERRY_RUN_SIM = 0,        /**< the discrete-event simulator ("sim") */
  FERRY_RUN_HOST = 1,       /**< the host executor ("host") */
  FERRY_RUN_CUDA = 2,       /**< the CUDA executor ("cuda") */
  FERRY_RUN_NSYS_IMPORT = 3 /**< imported from an Nsight Systems SQLite export ("nsys-import") */
};

/** Description of a run, given to ferry_db_run_begin(). Strings are copied; NULL = unknown. */
struct ferry_run_info {
  enum ferry_run_kind kind; /**< which world produced the run (when executor is NULL) */
  /** The registry name of the executor that produced the run (ferry_exec_name(): "host",
   *  "sim", a test's or a plugin's), stored as runs.kind; NULL: the name of @ref kind. A name is
   *  1-15 of a-z, 0-9 and '-' (FERRY_ERR_INVALID otherwise). */
  const char *executor;
  const char *model;        /**< model name or path */
  const char *hardware;     /**< hardware profile or GPU name */
  const char *trace;        /**< request trace name or path */
  const char *config_json;  /**< the full configuration as JSON text */
  const char *config_hash;  /**< identifies the configuration across runs (sweep resume) */
  const char *git_rev;      /**< source revision of the build */
  const char *notes;        /**< free text */
  /** A combination of a sweep (its configuration hash), or NULL. The database holds at most
   *  one complete run per key (a unique index): ferry_db_run_finish() of a second one records
   *  it as failed and returns FERRY_ERR_EXISTS. `ferry sweep` gives its children the key in the
   *  environment variable FERRY_SWEEP_KEY. */
  const char *sweep_key;
  /** Repetitions of one measurement (`--repeat N`, `--repeat-group TAG`): a tag shared by the
   *  runs of the group, or NULL; `ferry db diff` compares a group's runs as one sample. */
  const char *repeat_group;
  int32_t repeat_index; /**< the run's index in its repeat group (0-based) */
};

/** One request (requests table). Times are ns on the run's clock. */
struct ferry_request_row {
  int64_t req_id;         /**< request id within the trace */
  int64_t arrival_ns;     /**< arrival time */
  int64_t first_token_ns; /**< time the first output token was produced */
  int64_t finish_ns;      /**< time the last output token was produced */
  int64_t prompt_tokens;  /**< prompt length in tokens */
  int64_t output_tokens;  /**< generated tokens */
  int64_t replica;        /**< the replica (engine) that served it, 0 to R-1 in a run of R replicas (0 for one
                               engine); negative: unknown (NULL) */
};

/** One engine step (steps table). */
struct ferry_step_row {
  int64_t step;       /**< step number */
  int64_t start_ns;   /**< step start */
  int64_t end_ns;     /**< step end */
  int64_t batch;      /**< requests in the batch */
  int64_t tokens;     /**< tokens processed */
  uint64_t bytes_disk; /**< bytes read from disk */
  uint64_t bytes_h2d;  /**< bytes copied host to device */
  uint64_t bytes_d2h;  /**< bytes copied device to host */
  int64_t hits;       /**< weight-cache hits */
  int64_t misses;     /**< weight-cache misses */
  int64_t stall_ns;   /**< time compute waited for weights */
  int64_t kv_tokens;  /**< tokens in the KV cache at the end of the step (0: not recorded) */
  int64_t compute_busy_ns; /**< time the device's compute queue ran kernels */
  int64_t cpu_busy_ns;     /**< time the CPU queue ran kernels (hybrid runs) */
  uint64_t bytes_blocks;   /**< host-to-device bytes of streamed layer blocks */
  uint64_t bytes_experts;  /**< host-to-device bytes of routed experts */
  uint64_t bytes_act;      /**< activations between the device and the CPU (in bytes_h2d and bytes_d2h) */
  int64_t evictions;       /**< expert-cache evictions */
  int64_t cpu_experts;     /**< routed experts computed on the CPU */
  int64_t kv_blocks;       /**< KV-cache blocks in use at the end of the step (paged cache) */
  int64_t replica;         /**< the replica (engine) whose step it is, as ferry_request_row::replica */
  uint64_t bytes_disk_write; /**< bytes written to disk: the new KV rows of a cache homed there
                                  (--kv-home disk; ferry_step_metrics::bytes_disk_write) */
  uint64_t bytes_peers;    /**< bytes of streamed blocks received from the data-parallel peers
                                (--zero-gpus N; ferry_step_metrics::bytes_peers, not in bytes_h2d) */
};

/** One layer's expert-cache activity and weight traffic over a run (layer_stats table). */
struct ferry_layer_row {
  int64_t layer;       /**< layer */
  int64_t hits;        /**< expert-cache hits */
  int64_t misses;      /**< demand fetches */
  int64_t evictions;   /**< experts of the layer evicted */
  int64_t prefetches;  /**< experts fetched on a prediction */
  int64_t cpu_experts; /**< experts computed on the CPU */
  uint64_t bytes_h2d;  /**< the layer's weight bytes copied host to device */
};

/** A run as listed by ferry_db_list_runs() and ferry_db_get_run(); strings owned by the array. */
struct ferry_run_summary {
  int64_t id;            /**< run id */
  char kind[16];         /**< the executor's registry name ("sim", "host", "cuda", ...) or "nsys-import" */
  char *model;           /**< model, or NULL */
  char *hardware;        /**< hardware, or NULL */
  char *trace;           /**< trace, or NULL */
  char *started_at;      /**< ISO-8601 UTC start time */
  char *finished_at;     /**< ISO-8601 UTC finish time, or NULL while running / killed */
  int complete;          /**< 1 when the run finished without error */
  char *error;           /**< error message of a failed run, or NULL */
  char *config_json;     /**< configuration JSON, or NULL */
  char *config_hash;     /**< configuration hash, or NULL */
  char *notes;           /**< notes, or NULL */
  char *git_rev;         /**< source revision of the build that made the run (git describe), or NULL */
  char *ferry_version;   /**< ferry version that made the run, or NULL */
  char *repeat_group;    /**< repeat group tag, or NULL */
  int32_t repeat_index;  /**< index in the repeat group */
  int64_t requests;      /**< number of request rows */
  int64_t dropped_records; /**< activity records lost (allocation or write failures, and what
                               ferry_db_run_add_dropped() added) */
};

/** Summary statistics of one sample (latency in ns). */
struct ferry_dist {
  int64_t count; /**< number of samples (0: the other fields are 0) */
  double mean;   /**< arithmetic mean */
  double p50;    /**< median (linear interpolation between closest ranks) */
  double p90;    /**< 90th percentile */
  double p99;    /**< 99th percentile */
};

/** Metrics of one run, computed by ferry_db_run_stats(). */
struct ferry_run_stats {
  struct ferry_dist ttft_ns;  /**< time to first token: first_token_ns - arrival_ns */
  struct ferry_dist tpot_ns;  /**< time per output token after the first (requests with >1 token) */
  struct ferry_dist e2e_ns;   /**< end-to-end latency: finish_ns - arrival_ns */
  int64_t requests;           /**< request rows */
  int64_t output_tokens;      /**< sum of output tokens */
  double throughput_tok_s;    /**< output tokens / (last finish - first arrival) in tokens/s */
  int64_t steps;              /**< step rows */
  uint64_t peak_bytes[FERRY_TIER_COUNT]; /**< peak used_bytes per tier (memory table) */
  uint64_t bytes_disk;        /**< sum of steps.bytes_disk (see bytes_from_timeline) */
  uint64_t bytes_h2d;         /**< sum of steps.bytes_h2d */
  uint64_t bytes_d2h;         /**< sum of steps.bytes_d2h */
  int64_t stall_ns;           /**< sum of steps.stall_ns */
  /** 1 when the run has no step rows (an imported Nsight Systems run) and the bytes moved were
   *  summed from its timeline's copies instead (CUPTI_ACTIVITY_KIND_MEMCPY by copyKind). */
  int bytes_from_timeline;
  uint64_t bytes_disk_write; /**< sum of steps.bytes_disk_write: bytes written to disk (a KV cache homed
                                  there); 0 in a database older than schema 10 */
  uint64_t bytes_peers;      /**< sum of steps.bytes_peers: bytes of streamed blocks received from the
                                  data-parallel peers (--zero-gpus N); 0 in a database older than schema 11 */
};

/** One replica's share of a data-parallel run (ferry_db_run_replicas()). */
struct ferry_replica_stats {
  int64_t replica;       /**< requests.replica */
  int64_t requests;      /**< request rows it served */
  int64_t output_tokens; /**< their output tokens */
  double ttft_mean_ns;   /**< mean TTFT of those with a first token; NAN when none */
  double tpot_mean_ns;   /**< mean TPOT of those with more than one token; NAN when none */
  int64_t steps;         /**< step rows it ran */
};

/** Verdict on one metric, or on a whole comparison (ferry_db_compare_groups()). */
enum ferry_verdict {
  FERRY_VERDICT_NONE = 0,       /**< no significant change (or none beyond the tolerance) */
  FERRY_VERDICT_REGRESSION = 1, /**< B is worse than A by more than the tolerance */
  FERRY_VERDICT_IMPROVEMENT = 2 /**< B is better than A by more than the tolerance */
};

/** One compared metric, produced by ferry_db_compare() and ferry_db_compare_groups(). */
struct ferry_metric_delta {
  char name[32];        /**< metric name, e.g. "ttft_p99_ms" */
  double a;             /**< value in run A (unit in the name); the median over A's runs */
  double b;             /**< value in run B; the median over B's runs */
  double change_pct;    /**< (b - a) / a * 100; 0 when both are 0; +/-inf when a is 0 */
  int higher_is_better; /**< 1 for throughput, 0 for latencies, memory and bytes */
  int regressed;        /**< 1 when B is worse than A by more than the tolerance */
  int n_a;              /**< runs on side A with the metric */
  int n_b;              /**< runs on side B with the metric */
  /** With at least two runs on each side: the one-sided Mann-Whitney U p-value that B is worse
   *  (regression) or better (improvement) than A by more than the tolerance, whichever is
   *  smaller; NAN for single runs (the medians are compared with the tolerance alone). */
  double p_value;
  /** Effect size with two runs or more on each side: Cliff's delta of B against A, signed so
   *  that positive means worse (-1: every B run better than every A run, +1: every one worse);
   *  NAN for single runs. */
  double effect;
  enum ferry_verdict verdict; /**< regression, improvement or neither */
  /** 1 when the metric decides the verdict. Single runs: every metric. Repeated runs: the
   *  p50 and p99 latencies, throughput, peak memory and bytes moved, their p-values
   *  Holm-corrected over those that vary (means, p90 and stall time are shown only). */
  int gated;
};

/** Maximum number of rows ferry_db_compare() writes. */
#define FERRY_DB_MAX_METRICS 32

/**
 * @brief Open (and with FERRY_DB_CREATE create or migrate) a result database.
 *
 * A file that is not SQLite, or an SQLite file without the ferry schema, is refused with
 * FERRY_ERR_FORMAT ("not a ferry database"); a database written by a newer ferry is refused
 * with FERRY_ERR_SCHEMA and nothing is written; an unwritable file or folder gives
 * FERRY_ERR_IO naming the file. The database is put in WAL mode with synchronous=NORMAL.
 * @param out receives the handle (owned: release with ferry_db_close()); NULL on failure.
 * @param path database file.
 * @param flags FERRY_DB_READ_ONLY or FERRY_DB_CREATE.
 * @return FERRY_OK or an error; the message is in ferry_last_error().
 */
FERRY_API ferry_status ferry_db_open(ferry_db **out, const char *path, int flags);

/** What ferry_db_merge() did with one source. */
struct ferry_db_merge_stats {
  int64_t runs_added;      /**< runs copied, with their rows */
  int64_t same_run;        /**< runs skipped: the destination holds the same run (kind, start and
                                finish times, host, process, configuration hash, outcome and
                                repetition: a run copied before) */
  int64_t same_sweep_key;  /**< complete runs skipped: the destination has a complete run of the
                                same sweep combination (runs.sweep_key, the configuration hash) */
  int64_t same_import;     /**< imported runs skipped: the same file (runs.source_sha256) */
  int64_t same_repetition; /**< runs skipped: the same repetition (repeat group, index and
                                configuration hash) */
  int64_t rows_added;      /**< rows copied into the per-run tables and quant_quality */
};

/**
 * @brief Copy every run of another result database that this one does not hold, with all its
 *        rows: requests, steps, memory, the timeline tables, META_DATA_EXPORT facts (provenance)
 *        and every other table with a runId column, run ids remapped and StringIds references
 *        translated; quant_quality rows not already present. A source run is skipped when this
 *        database holds the same run, a complete run of its sweep combination (runs.sweep_key:
 *        one complete run per combination, as the schema requires), the same imported file, or
 *        the same repetition of its repeat group. One transaction: all or nothing.
 * @param db destination, opened with FERRY_DB_CREATE.
 * @param src_path the source database (read only; an older schema version is read as it is).
 * @param stats receives what was copied and skipped (zeroed on failure).
 * @return FERRY_OK; FERRY_ERR_INVALID when db is read-only or src_path is db's own file;
 *         FERRY_ERR_NOT_FOUND, FERRY_ERR_FORMAT or FERRY_ERR_SCHEMA for a source that is
 *         missing, not a ferry database or newer than this build; FERRY_ERR_NO_SPACE; or an
 *         error. Details in ferry_db_errmsg() / ferry_last_error().
 */
FERRY_API ferry_status ferry_db_merge(ferry_db *db, const char *src_path, struct ferry_db_merge_stats *stats);

/**
 * @brief Flush pending activity rows and close the database. Accepts NULL.
 * @param db handle.
 */
FERRY_API void ferry_db_close(ferry_db *db);

/**
 * @brief The detailed message of the handle's last failure.
 * @param db handle (NULL gives "").
 * @return borrowed string valid until the next call on the handle; "" if none.
 */
FERRY_API const char *ferry_db_errmsg(const ferry_db *db);

/**
 * @brief Insert a run row (complete = 0, started_at = now) and commit it at once. The run
 *        becomes the target of ferry_db_activity_sink().
 * @param db handle opened with FERRY_DB_CREATE.
 * @param info run description (copied).
 * @param run_id receives the new run's id.
 * @return FERRY_OK or an error.
 */
FERRY_API ferry_status ferry_db_run_begin(ferry_db *db, const struct ferry_run_info *info, int64_t *run_id);

/**
 * @brief Flush pending rows and mark a run finished: finished_at = now, complete = 1 when
 *        error is NULL, otherwise complete = 0 and runs.error = error.
 * @param db handle.
 * @param run_id run to finish.
 * @param error NULL on success, or what went wrong.
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND for an unknown run, FERRY_ERR_EXISTS when the run's
 *         sweep_key already has a complete run (this one is then recorded as failed, with the
 *         duplicate named in runs.error), or an error.
 */
FERRY_API ferry_status ferry_db_run_finish(ferry_db *db, int64_t run_id, const char *error);

/**
 * @brief Count records a run lost outside the database (e.g. the CUPTI collector's
 *        ferry_cupti_dropped()) in runs.dropped_records. For the active run the count is
 *        written by ferry_db_run_finish(); for a finished run it is added at once.
 * @param db handle opened with FERRY_DB_CREATE.
 * @param run_id the run.
 * @param n records lost.
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND for an unknown run, or an error.
 */
FERRY_API ferry_status ferry_db_run_add_dropped(ferry_db *db, int64_t run_id, uint64_t n);

/**
 * @brief Store a name/value fact about a run (written at once) in META_DATA_EXPORT with its
 *        runId, e.g. "CUPTI_STATUS" = "off: no CUDA device" or "CUPTI_ZERO_TIMESTAMP_RECORDS".
 * @param db handle opened with FERRY_DB_CREATE.
 * @param run_id the run.
 * @param name non-empty name (copied).
 * @param value value (copied); NULL stores NULL.
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND for an unknown run, or an error.
 */
FERRY_API ferry_status ferry_db_run_meta(ferry_db *db, int64_t run_id, const char *name, const char *value);

/** A name/value row of a run's META_DATA_EXPORT facts, from ferry_db_run_meta_list(). */
struct ferry_meta_row {
  char *name;  /**< the fact's name */
  char *value; /**< its value, or NULL */
};

/**
 * @brief Read a run's META_DATA_EXPORT facts (provenance, budgets, collector status, ...).
 * @param db handle.
 * @param run_id the run.
 * @param prefix only names starting with it (e.g. "HOST_"), or NULL for all.
 * @param rows receives an owned array in insertion order (release with ferry_db_meta_free()).
 * @param count receives its length (0 when the run has none).
 * @return FERRY_OK or an error.
 */
FERRY_API ferry_status ferry_db_run_meta_list(ferry_db *db, int64_t run_id, const char *prefix, struct ferry_meta_row **rows,
                                    size_t *count);

/**
 * @brief Release an array from ferry_db_run_meta_list(). Accepts NULL.
 * @param rows the array.
 * @param count its length.
 */
FERRY_API void ferry_db_meta_free(struct ferry_meta_row *rows, size_t count);

/**
 * @brief Store the GPU a run used or simulated as a TARGET_INFO_GPU row (written at once).
 *        Zero numbers and empty strings are stored as NULL (unknown).
 * @param db handle opened with FERRY_DB_CREATE.
 * @param run_id the run.
 * @param gpu_id the device's index in the run (0 for single-GPU runs).
 * @param info what the executor knows (ferry_exec_device_info()).
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND for an unknown run, or an error.
 */
FERRY_API ferry_status ferry_db_add_gpu(ferry_db *db, int64_t run_id, int32_t gpu_id, const struct ferry_device_info *info);

/**
 * @brief Read a run's GPU back from TARGET_INFO_GPU (NULL columns read as 0 or empty).
 * @param gpu_id the device's index in the run.
 * @param out filled on success.
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND when the run has no such GPU row, or an error.
 */
FERRY_API ferry_status ferry_db_get_gpu(ferry_db *db, int64_t run_id, int32_t gpu_id, struct ferry_device_info *out);

/**
 * @brief Add a request row (written with the next batch).
 * @param db handle.
 * @param run_id run the row belongs to.
 * @param row the request.
 * @return FERRY_OK or an error.
 */
FERRY_API ferry_status ferry_db_add_request(ferry_db *db, int64_t run_id, const struct ferry_request_row *row);

/**
 * @brief Add a step row (written with the next batch).
 * @param db handle.
 * @param run_id run the row belongs to.
 * @param row the step.
 * @return FERRY_OK or an error.
 */
FERRY_API ferry_status ferry_db_add_step(ferry_db *db, int64_t run_id, const struct ferry_step_row *row);

/**
 * @brief Write one layer's expert-cache activity and weight traffic of a run (at once, not
 *        batched: one row per layer at the end of a run).
 * @param db handle.
 * @param run_id the run.
 * @param row the layer's counts.
 * @return FERRY_OK or an error (FERRY_ERR_INVALID for a NULL row).
 */
FERRY_API ferry_status ferry_db_add_layer_stats(ferry_db *db, int64_t run_id, const struct ferry_layer_row *row);

/**
 * @brief Add a memory sample (written with the next batch).
 * @param db handle.
 * @param run_id run the row belongs to.
 * @param t_ns sample time.
 * @param tier which tier.
 * @param used_bytes bytes in use.
 * @return FERRY_OK or an error.
 */
FERRY_API ferry_status ferry_db_add_memory(ferry_db *db, int64_t run_id, int64_t t_ns, enum ferry_tier tier,
                                 uint64_t used_bytes);

/**
 * @brief Activity sink: usable directly as a ferry_activity_fn with the ferry_db as user.
 *
 * Thread-safe: appends a copy of the record (its name interned into StringIds) to an
 * in-memory batch under a mutex; a full batch (4096 rows) is written in one transaction by
 * the calling thread. Records go to the run of the last ferry_db_run_begin(); records arriving
 * with no run, or lost to an allocation or write failure, are counted in runs.dropped_records
 * and the failure is reported by the next ferry_db_flush().
 * @param user the ferry_db handle.
 * @param act the record (borrowed for the call).
 */
FERRY_API void ferry_db_activity_sink(void *user, const struct ferry_activity *act);

/**
 * @brief Write every pending row (requests, steps, memory, activities) in one transaction.
 * @param db handle.
 * @return FERRY_OK, FERRY_ERR_NO_SPACE when the disk or database is full (earlier batches
 *         stay intact), or another error, including one deferred from the sink.
 */
FERRY_API ferry_status ferry_db_flush(ferry_db *db);

/**
 * @brief Find the most recent complete run with a configuration hash (sweeps resume by it).
 * @param db handle.
 * @param config_hash the hash.
 * @param run_id receives the run id.
 * @return FERRY_OK, or FERRY_ERR_NOT_FOUND (no message) when there is none.
 */
FERRY_API ferry_status ferry_db_find_complete_run(ferry_db *db, const char *config_hash, int64_t *run_id);

/**
 * @brief List every run, oldest first.
 * @param db handle.
 * @param runs receives an owned array (release with ferry_db_runs_free()).
 * @param count receives the number of runs.
 * @return FERRY_OK or an error.
 */
FERRY_API ferry_status ferry_db_list_runs(ferry_db *db, struct ferry_run_summary **runs, size_t *count);

/**
 * @brief Read one run.
 * @param db handle.
 * @param run_id the run.
 * @param run receives an owned array of one run (release with ferry_db_runs_free(run, 1)).
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND or an error.
 */
FERRY_API ferry_status ferry_db_get_run(ferry_db *db, int64_t run_id, struct ferry_run_summary **run);

/**
 * @brief Release an array from ferry_db_list_runs() or ferry_db_get_run(). Accepts NULL.
 * @param runs the array.
 * @param count its length.
 */
FERRY_API void ferry_db_runs_free(struct ferry_run_summary *runs, size_t count);

/**
 * @brief Compute a run's latency percentiles, throughput, peak memory and bytes moved.
 * @param db handle.
 * @param run_id the run.
 * @param stats receives the metrics.
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND or an error.
 */
FERRY_API ferry_status ferry_db_run_stats(ferry_db *db, int64_t run_id, struct ferry_run_stats *stats);

/**
 * @brief Per-replica figures of a run, from requests.replica and steps.replica (schema 9): one
 *        row per replica that served a request, in replica order. A run of one engine gives
 *        one row (replica 0); a run written before schema 9, or a database older than it, none.
 * @param out receives an array of *n rows (NULL when none), owned by the caller
 *        (ferry_db_replicas_free()).
 * @return FERRY_OK or an error (FERRY_ERR_NOMEM, a database error); *n is 0 on error.
 */
FERRY_API ferry_status ferry_db_run_replicas(ferry_db *db, int64_t run_id, struct ferry_replica_stats **out,
                                             size_t *n);

/** @brief Free what ferry_db_run_replicas() returned; accepts NULL. */
FERRY_API void ferry_db_replicas_free(struct ferry_replica_stats *rows);

/**
 * @brief Compare two runs' metrics (latency percentiles, throughput, peak memory per tier,
 *        bytes moved, stall time).
 * @param a baseline.
 * @param b candidate.
 * @param tolerance_pct allowed worsening in percent (e.g. 5.0).
 * @param out array of at least FERRY_DB_MAX_METRICS rows.
 * @param count receives the number of rows written.
 * @return the number of regressed metrics (0 when B is within tolerance of A).
 */
FERRY_API int ferry_db_compare(const struct ferry_run_stats *a, const struct ferry_run_stats *b,
                     double tolerance_pct, struct ferry_metric_delta *out, size_t *count);

/**
 * @brief Compare repeated runs: each metric's median over B's runs against A's. With at least
 *        two runs on each side a metric regresses only when a one-sided Mann-Whitney U test
 *        says B is worse than A by more than the tolerance (A's values are scaled by the
 *        tolerance before ranking, so noise within the tolerance is never a regression), at
 *        family-wise level alpha over the gated metrics (Holm's correction; see
 *        ferry_metric_delta.gated); with one run on either side the medians are compared with
 *        the tolerance alone, as ferry_db_compare() does. Which metrics are compared: those that
 *        any run has.
 * @param a baseline runs.
 * @param na how many (at least 1).
 * @param b candidate runs.
 * @param nb how many (at least 1).
 * @param tolerance_pct allowed worsening in percent (e.g. 5.0).
 * @param alpha significance level of the test (e.g. 0.05).
 * @param out array of at least FERRY_DB_MAX_METRICS rows.
 * @param count receives the number of rows written.
 * @return the number of regressed metrics.
 */
FERRY_API int ferry_db_compare_groups(const struct ferry_run_stats *a, size_t na, const struct ferry_run_stats *b, size_t nb,
                            double tolerance_pct, double alpha, struct ferry_metric_delta *out, size_t *count);

/**
 * @brief Name of a verdict as printed and written in JSON.
 * @param v the verdict.
 * @return "regression", "improvement" or "no significant change".
 */
FERRY_API const char *ferry_verdict_name(enum ferry_verdict v);

/** One metric of a run, listed by ferry_db_metrics(). */
struct ferry_metric_value {
  char name[32];        /**< metric name, as in ferry_metric_delta */
  double value;         /**< its value (unit in the name) */
  int higher_is_better; /**< 1 for throughput */
};

/**
 * @brief The metrics of a run by name, in the order `ferry db diff` lists them: the one list
 *        that `db show --format json` and `db diff` share. Metrics the run does not have
 *        (latencies without requests, a tier never used, bytes without steps) are left out.
 * @param s the run's statistics.
 * @param out array of at least FERRY_DB_MAX_METRICS rows.
 * @return the number of rows written.
 */
FERRY_API size_t ferry_db_metrics(const struct ferry_run_stats *s, struct ferry_metric_value *out);

/**
 * @brief Write a run's whole timeline as Chrome trace JSON (Perfetto); see
 *        ferry_db_export_trace_window().
 * @param db handle.
 * @param run_id the run.
 * @param out_path output file (replaced atomically).
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND or an error.
 */
FERRY_API ferry_status ferry_db_export_trace(ferry_db *db, int64_t run_id, const char *out_path);

/** What part of a run ferry_db_export_trace_window() writes. */
struct ferry_trace_export_options {
  int64_t step_first;  /**< first step of the window, -1 for the run's start */
  int64_t step_last;   /**< last step, -1 for the run's end */
  double time_first_s; /**< window start in seconds from the run's first timestamp, NAN for none */
  double time_last_s;  /**< window end in seconds from it, NAN for none */
};

/**
 * @brief The whole run: no window.
 * @param opt filled.
 */
FERRY_API void ferry_trace_export_options_init(struct ferry_trace_export_options *opt);

/**
 * @brief Write a run's timeline as Chrome trace JSON (Perfetto). Process 1 is the run: a named
 *        track per queue ("compute", "H2D", "D2H", "disk"; a CUDA stream of a CUPTI run or an
 *        import named by what it carried and its number), NVTX ranges on their own track, a
 *        flow arrow from each weight fetch to the op that consumed it (disk read to the copy,
 *        copy to the first kernel of its layer and expert that starts after it), and counters
 *        of memory per tier, batch size and KV-cache tokens. Process 2 has an async span per
 *        request (its "queued + prefill" and "decode" parts inside). Disk reads are category
 *        "disk" with copyKind "Disk-to-Host (ferry 100)". Times in microseconds from the run's
 *        first timestamp; with a window, only what overlaps it (docs/schema.md).
 * @param db handle.
 * @param run_id the run.
 * @param out_path output file (replaced atomically).
 * @param opt the window.
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND for an unknown run or steps it does not have,
 *         FERRY_ERR_INVALID for an empty window, or an error.
 */
FERRY_API ferry_status ferry_db_export_trace_window(ferry_db *db, int64_t run_id, const char *out_path,
                                          const struct ferry_trace_export_options *opt);

/**
 * @brief Import an Nsight Systems SQLite export (`nsys export --type sqlite`) as a run of
 *        kind nsys-import. Known column variants are accepted; a missing required table
 *        (META_DATA_EXPORT, StringIds, CUPTI_ACTIVITY_KIND_KERNEL) fails with FERRY_ERR_FORMAT
 *        naming the file and table, and nothing is written.
 * @param db handle opened with FERRY_DB_CREATE.
 * @param export_path the export.
 * @param info optional run description (kind is forced to nsys-import; NULL fields are
 *        filled from the export); may be NULL.
 * @param run_id receives the new run's id; when the same file (by SHA-256, runs.source_sha256) was
 *        imported before, the id of that run.
 * @return FERRY_OK, FERRY_ERR_EXISTS when the file was imported before (nothing is written), or
 *         an error.
 */
FERRY_API ferry_status ferry_db_import_nsys(ferry_db *db, const char *export_path,
                                  const struct ferry_run_info *info, int64_t *run_id);

/** The summaries of ferry_db_stats_report(), named after `nsys stats` reports. */
enum ferry_stats_report {
  FERRY_STATS_KERN_SUM = 0,     /**< "kern_sum", nsys cuda_gpu_kern_sum: time per kernel name */
  FERRY_STATS_MEM_SIZE_SUM = 1, /**< "mem_sum", nsys cuda_gpu_mem_size_sum: bytes per copy kind */
  FERRY_STATS_MEM_TIME_SUM = 2, /**< "mem_time_sum", nsys cuda_gpu_mem_time_sum: time per copy kind */
  FERRY_STATS_NVTX_SUM = 3,     /**< "nvtx_sum", nsys nvtx_sum: time per NVTX range name */
  FERRY_STATS_STEP_SUM = 4,     /**< "step_sum" (ferry): engine steps, decode against prefill */
  FERRY_STATS_API_SUM = 5,      /**< "api_sum", nsys cuda_api_sum: host time per CUDA runtime call */
  FERRY_STATS_COUNT = 6         /**< number of reports, not a report */
};

/** A report: nrows x ncols cells, numbers in `num` (NAN where a cell is text or unknown), text
 *  in `text` (NULL where a cell is a number); owned, release with ferry_stats_table_free(). */
struct ferry_stats_table {
  enum ferry_stats_report report; /**< which report */
  size_t ncols;                   /**< columns */
  size_t nrows;                   /**< rows (groups), by total time (or bytes) descending */
  const char *const *columns;     /**< column names as nsys prints them (static) */
  const char *types;              /**< per column 'n' (number) or 't' (text) (static) */
  double *num;                    /**< nrows * ncols numbers */
  char **text;                    /**< nrows * ncols strings */
};

/**
 * @brief Summarise a run's timeline like `nsys stats` does: per group (kernel name, copy kind,
 *        NVTX range name, step kind) the share of the time, total, count, mean, median
 *        (interpolated), min, max and sample standard deviation. Works on ferry's own runs and
 *        on imported Nsight Systems exports; ferry's disk reads (copyKind 100) are the operation
 *        "[ferry disk read Disk-to-Host]". step_sum reads the steps table, or for a run without
 *        one (an import of a profiled ferry run) its NVTX ranges "step N". api_sum groups the
 *        CUDA runtime calls a CUPTI-profiled run (`--profile`) or an import recorded, by name
 *        (printed without CUPTI's API-version suffix, "cudaLaunchKernel" for
 *        "cudaLaunchKernel_v7000", as nsys prints them).
 * @param db handle.
 * @param run_id the run.
 * @param report which summary.
 * @param out receives the table (empty when the run has nothing to summarise).
 * @return FERRY_OK, FERRY_ERR_NOT_FOUND for an unknown run, or an error.
 */
FERRY_API ferry_status ferry_db_stats_report(ferry_db *db, int64_t run_id, enum ferry_stats_report report,
                                   struct ferry_stats_table *out);

/**
 * @brief Release a table from ferry_db_stats_report() (the struct itself is the caller's).
 *        Accepts NULL.
 * @param t the table.
 */
FERRY_API void ferry_stats_table_free(struct ferry_stats_table *t);

/**
 * @brief A report's ferry name ("kern_sum", ...).
 * @param r the report.
 * @return static string, "?" when unknown.
 */
FERRY_API const char *ferry_stats_report_name(enum ferry_stats_report r);

/**
 * @brief The `nsys stats` report a summary follows ("cuda_gpu_kern_sum", ...).
 * @param r the report.
 * @return static string, or NULL for ferry's own (step_sum).
 */
FERRY_API const char *ferry_stats_report_nsys_name(enum ferry_stats_report r);

/**
 * @brief Parse a report name: ferry's ("kern_sum") or the nsys one ("cuda_gpu_kern_sum").
 * @param text the name.
 * @param out receives the report.
 * @return FERRY_OK or FERRY_ERR_INVALID listing the names.
 */
FERRY_API ferry_status ferry_stats_report_parse(const char *text, enum ferry_stats_report *out);

/** Quality of one tensor class of a quantized model (table quant_quality). */
struct ferry_quant_quality_row {
  const char *model;        /**< input model folder */
  const char *output;       /**< quantized model folder */
  const char *plan;         /**< the plan in canonical form */
  const char *cls;          /**< tensor class ("attn", "expert", ...) */
  const char *format;       /**< format of the class ("int4-g64", ...) */
  int64_t tensors;          /**< tensors of the class */
  uint64_t bytes_before;    /**< bytes in the input */
  uint64_t bytes_after;     /**< bytes quantized */
  double mean_rel_error;    /**< mean relative Frobenius error per tensor */
  double max_rel_error;     /**< largest relative Frobenius error of a tensor */
  double logits_cosine_mean; /**< whole model: mean cosine of logits against the input model (NAN if not measured) */
  double logits_cosine_min; /**< whole model: smallest cosine */
  double logits_kl_mean;    /**< whole model: mean KL divergence in nats */
  double logits_kl_max;     /**< whole model: largest KL divergence */
  double top1_agreement;    /**< whole model: share of tokens with the same argmax */
};

/**
 * @brief Store the quality of one tensor class of a quantized model (written at once).
 * @param db an open read-write database.
 * @param row the row (strings copied).
 * @return FERRY_OK or FERRY_ERR_DB / FERRY_ERR_NO_SPACE with the message in the handle.
 */
FERRY_API ferry_status ferry_db_add_quant_quality(ferry_db *db, const struct ferry_quant_quality_row *row);

/** One row of `engine_events`: what kept a run up (schema version 6, docs/schema.md). */
struct ferry_event_row {
  int64_t t_ns;          /**< executor time, the clock of the run's timeline rows */
  const char *kind;      /**< "pressure", "reload", "io", "device" or "refused" */
  const char *tier;      /**< "device", "host", "disk" or NULL */
  double pressure_index; /**< pressure: the tier's index when it happened (NAN: none) */
  int32_t level;         /**< pressure: the degradation level after it (-1: none) */
  const char *action;    /**< what was done, e.g. "shrink prefetch depth", "reload applied" */
  const char *detail;    /**< figures and names behind it, or NULL */
  uint64_t budget_bytes; /**< a budget change: the tier's new budget (0: none) */
};

/**
 * @brief Store one engine event of a run (written at once, in its own transaction).
 * @param db an open read-write database.
 * @param run_id a run of this database.
 * @param row the row (strings copied).
 * @return FERRY_OK; FERRY_ERR_INVALID for a kind or tier not listed above; FERRY_ERR_NOT_FOUND
 *         for an unknown run; FERRY_ERR_DB / FERRY_ERR_NO_SPACE with the message in the handle.
 */
FERRY_API ferry_status ferry_db_add_event(ferry_db *db, int64_t run_id, const struct ferry_event_row *row);

/**
 * @brief Name of a run kind as stored in runs.kind.
 * @param kind the kind.
 * @return a static string ("sim", "host", "cuda", "nsys-import", or "?").
 */
FERRY_API const char *ferry_run_kind_name(enum ferry_run_kind kind);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_DB_H */
