/**
 * @file report.h
 * @brief Reports over result databases: one or more study files (see db.h) become a folder
 *        with `index.html` (self-contained, plots inline as SVG), `report.md`, the CSV behind
 *        every table (`tables/NAME.csv`) and the gnuplot script of every plot
 *        (`plots/NAME.gp`, with its data inline, next to `plots/NAME.svg`).
 *
 * The report reads the databases only (SQLite, read-only); it never runs the engine. Which
 * sections appear depends on the data: a sweep axis is every configuration key whose value
 * differs between runs (runs.config_json), and each axis gets latency and throughput plots;
 * sim-vs-real pairs are runs whose configurations agree except for the executor and hardware;
 * the hardware what-if compares runs that differ only by hardware profile. docs/reports.md
 * describes every section, table and plot.
 *
 * gnuplot is run as an external program (`gnuplot`, or ferry_report_options::gnuplot).
 * The folder is written under a temporary sibling name and renamed into place at the end, so
 * a failed report leaves no half-written folder (and an existing folder of the same name is
 * replaced only on success).
 */
#ifndef FERRY_REPORT_H
#define FERRY_REPORT_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Sections of a report (bits of ferry_report_summary::sections). */
enum ferry_report_section {
  FERRY_REPORT_RUNS = 1 << 0,       /**< the table of every run (always present) */
  FERRY_REPORT_SWEEP = 1 << 1,      /**< latency and throughput against each swept parameter */
  FERRY_REPORT_BYTES = 1 << 2,      /**< bytes moved per tier and stall time */
  FERRY_REPORT_TIMELINE = 1 << 3,   /**< Gantt chart of the queues of one run over a step range */
  FERRY_REPORT_MEMORY = 1 << 4,     /**< memory per tier over time with the budgets */
  FERRY_REPORT_SIM_VS_REAL = 1 << 5, /**< predicted vs measured, error per metric */
  FERRY_REPORT_QUANT = 1 << 6,      /**< per quantization format (config key `quant`) */
  FERRY_REPORT_PREDICTOR = 1 << 7,  /**< per expert predictor (config key `predictor`) */
  FERRY_REPORT_HARDWARE = 1 << 8,   /**< the same workload on several hardware profiles, cost */
  FERRY_REPORT_PREDICTOR_CI = 1 << 9, /**< per expert predictor with bootstrap confidence intervals */
  FERRY_REPORT_ROUTING = 1 << 10,   /**< statistics of every routing trace the runs used or recorded */
  FERRY_REPORT_LATENCY = 1 << 11,   /**< latency distributions (CDF of TTFT, TPOT, e2e) per run */
  FERRY_REPORT_EVENTS = 1 << 12,    /**< engine events: memory pressure, reloads, I/O retries, device failures */
  FERRY_REPORT_PLAN = 1 << 13,      /**< `ferry plan`'s capacity per hardware profile, costs, Pareto front */
  FERRY_REPORT_STRATEGIES = 1 << 14 /**< offloading strategies side by side: TPOT, bytes moved by
                                         class, hit rate, CPU work */
};

/** What to report on and where. Strings are borrowed for the duration of the call. */
struct ferry_report_options {
  const char *const *db_paths; /**< result databases to read (at least one) */
  size_t n_dbs;                /**< number of entries in db_paths */
  const char *out_dir;         /**< output folder; replaced on success if it exists */
  const char *title;           /**< report title, or NULL for "ferry report" */
  int64_t timeline_run;        /**< run id for the timeline and memory plots, or -1 to pick the
                                    first complete run that has timeline rows */
  int timeline_db;             /**< index in db_paths of the database holding timeline_run */
  int64_t step_first;          /**< first engine step of the timeline, or -1 for the run's first */
  int64_t step_last;           /**< last engine step of the timeline (inclusive), or -1 for
                                    step_first + 2 */
  const char *gnuplot;         /**< gnuplot executable, or NULL for "gnuplot" on PATH */
  const char *hw_path;         /**< colon-separated folders of hardware profiles for prices, or
                                    NULL for $FERRY_HW_PATH, then the source and install `hw/` */
  double slo_ttft_p99_ms;      /**< hardware what-if: TTFT P99 objective in ms (0 = none) */
  double slo_tpot_p99_ms;      /**< hardware what-if: TPOT P99 objective in ms (0 = none) */
};

/** What a report contains, filled by ferry_report_write(). */
struct ferry_report_summary {
  size_t runs;           /**< runs read from all databases */
  size_t complete;       /**< runs that finished without error */
  size_t failed;         /**< runs with an error or never finished */
  unsigned sections;     /**< bit set of ferry_report_section present in the report */
  size_t plots;          /**< SVG plots drawn */
  size_t tables;         /**< tables written (one CSV each) */
  size_t axes;           /**< sweep axes found (configuration keys that vary) */
  size_t sim_real_pairs; /**< sim-vs-real pairs */
  size_t sim_real_flagged; /**< of those, pairs flagged: an error above 10 % or a sim run whose profile has fitted costs with R^2 below 0.9 */
};

/**
 * @brief Initialise options with defaults: no databases, timeline_run = -1, steps -1,
 *        everything else 0 or NULL.
 * @param opt options to fill.
 */
FERRY_API void ferry_report_options_init(struct ferry_report_options *opt);

/**
 * @brief Read the databases and write the report folder.
 *
 * Errors (each a one-line message in ferry_last_error(), and no folder is left behind):
 * a missing or non-ferry database (FERRY_ERR_NOT_FOUND, FERRY_ERR_FORMAT), a database whose
 * schema is newer than this build (FERRY_ERR_SCHEMA), databases without any run
 * (FERRY_ERR_NOT_FOUND, "no runs"), a timeline run that does not exist (FERRY_ERR_NOT_FOUND),
 * gnuplot missing (FERRY_ERR_NOT_FOUND naming the program) or failing (FERRY_ERR_INTERNAL with
 * its first error line), an output folder that cannot be written (FERRY_ERR_IO).
 * @param opt what to read and where to write (borrowed).
 * @param summary receives what the report contains; may be NULL.
 * @return FERRY_OK or an error.
 */
FERRY_API ferry_status ferry_report_write(const struct ferry_report_options *opt, struct ferry_report_summary *summary);

/**
 * @brief Name of a section, as used for the anchors of index.html ("runs", "sweep", ...).
 * @param section one bit of ferry_report_section.
 * @return a static string, or "?" for an unknown value.
 */
FERRY_API const char *ferry_report_section_name(enum ferry_report_section section);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_REPORT_H */
