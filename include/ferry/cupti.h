/**
 * @file cupti.h
 * @brief The CUPTI collector: records what really ran on the GPU (kernels, copies, memsets,
 *        synchronizations, CUDA runtime calls, NVTX ranges) through CUPTI's Activity API and
 *        delivers each record as a struct ferry_activity to an activity sink, with times on
 *        the run's clock. Typical sink: ferry_db_activity_sink() (include/ferry/db.h).
 *
 * Built when CMake finds CUDA (FERRY_HAVE_CUDA). Without CUDA the functions exist and
 * ferry_cupti_start() fails with FERRY_ERR_UNSUPPORTED; on a machine without a CUDA driver or
 * device it fails with FERRY_ERR_NO_DEVICE. In both cases the caller goes on untraced and
 * notes the reason in the run's metadata. CUPTI allows one subscriber per process: a second
 * collector while one runs is refused with FERRY_ERR_BUSY. See docs/cupti.md.
 */
#ifndef FERRY_CUPTI_H
#define FERRY_CUPTI_H

#include "ferry/api.h"

#include <stdint.h>

#include "ferry/activity.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Opaque handle on a running collector. */
typedef struct ferry_cupti ferry_cupti;

/** Buffer pool of a collector (ferry_cupti_start_config()); 0 fields take the defaults. */
struct ferry_cupti_config {
  uint64_t buffer_bytes; /**< bytes per activity buffer (default 4 MiB; at least 64 KiB) */
  uint32_t buffers;      /**< buffers in the pool, all allocated at start (default 16) */
  uint32_t flush_period_ms; /**< CUPTI worker flush period; 0 = CUPTI's default */
};

/** What a collector saw; every count covers the collector's whole life. */
struct ferry_cupti_stats {
  uint64_t records;           /**< CUPTI records read from completed buffers */
  uint64_t delivered;         /**< activities delivered to the sink */
  uint64_t dropped_records;   /**< records CUPTI dropped (cuptiActivityGetNumDroppedRecords) */
  uint64_t zero_timestamp;    /**< records skipped because CUPTI could not time them (0) */
  uint64_t unpaired_markers;  /**< NVTX range starts without an end, or ends without a start,
                                   or starts beyond the open-range table */
  uint64_t ignored;           /**< records of kinds the collector does not convert */
  uint64_t own_ranges;        /**< NVTX ranges of ferry's own domain "ferry" (the engine's steps,
                                   layers and fetches, the cuda executor's kernels): the
                                   executor reports those itself, with step, layer and expert,
                                   so CUPTI's copies are not converted */
  uint64_t pool_exhausted;    /**< buffer requests refused because every buffer was in use
                                   (CUPTI then drops records: see dropped_records) */
  uint64_t attributed;        /**< kernels, copies and memsets matched to the ferry op that
                                   issued them (layer and expert set; see
                                   ferry_cupti_launch_begin()) */
};

/**
 * @brief The clock every ferry executor and the collector use: CLOCK_MONOTONIC in ns.
 *        A run's t0 (the absolute time of its clock's 0) is
 *        `ferry_cupti_clock_ns() - ferry_exec_now(ex)` read right after creating the executor.
 *        Available with or without CUDA.
 * @return the current absolute time in ns.
 */
FERRY_API int64_t ferry_cupti_clock_ns(void);

/**
 * @brief Start collecting with the default buffer pool (16 buffers of 4 MiB).
 *
 * Checks for a device through the CUDA runtime (cudaGetDeviceCount) first, registers the
 * buffer callbacks and a timestamp callback returning ferry_cupti_clock_ns(), then enables
 * CONCURRENT_KERNEL, MEMCPY, MEMSET, RUNTIME, SYNCHRONIZATION and MARKER (NVTX). Records are
 * delivered from CUPTI's threads (the sink must be thread-safe) with times
 * `clock - t0_ns`. Sets NVTX_INJECTION64_PATH to the CUPTI library when unset, so NVTX ranges
 * are seen if no NVTX call happened in the process before.
 * @param out receives the handle (owned: release with ferry_cupti_stop()); NULL on failure.
 * @param sink receives every converted record; must be thread-safe.
 * @param user passed to sink.
 * @param t0_ns absolute time (ferry_cupti_clock_ns()) of the run clock's 0.
 * @return FERRY_OK; FERRY_ERR_UNSUPPORTED (built without CUDA); FERRY_ERR_NO_DEVICE (no CUDA
 *         driver or device; nothing was enabled); FERRY_ERR_BUSY (a collector already runs);
 *         FERRY_ERR_CUDA (a CUPTI call failed, its code in the message); FERRY_ERR_NOMEM.
 *         The message is in ferry_last_error().
 */
FERRY_API ferry_status ferry_cupti_start(ferry_cupti **out, ferry_activity_fn sink, void *user, int64_t t0_ns);

/**
 * @brief ferry_cupti_start() with an explicit buffer pool.
 * @param out receives the handle; NULL on failure.
 * @param sink receives every converted record; must be thread-safe.
 * @param user passed to sink.
 * @param t0_ns absolute time of the run clock's 0.
 * @param config pool sizes (NULL = defaults); copied.
 * @return as ferry_cupti_start(), plus FERRY_ERR_INVALID for a bad config.
 */
FERRY_API ferry_status ferry_cupti_start_config(ferry_cupti **out, ferry_activity_fn sink, void *user, int64_t t0_ns,
                                      const struct ferry_cupti_config *config);

/**
 * @brief Deliver every record CUPTI holds now (cuptiActivityFlushAll with
 *        CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), e.g. at the end of each step.
 * @param c handle.
 * @return FERRY_OK or FERRY_ERR_CUDA.
 */
FERRY_API ferry_status ferry_cupti_flush(ferry_cupti *c);

/**
 * @brief Records lost so far: CUPTI's dropped records plus records skipped for a zero
 *        timestamp. Meant for the run's dropped_records.
 * @param c handle (NULL gives 0).
 * @return the count.
 */
FERRY_API uint64_t ferry_cupti_dropped(const ferry_cupti *c);

/**
 * @brief The counts so far.
 * @param c handle.
 * @param stats receives the counts (zeroed when c is NULL).
 */
FERRY_API void ferry_cupti_get_stats(const ferry_cupti *c, struct ferry_cupti_stats *stats);

/**
 * @brief Stop: forced flush (every pending record reaches the sink before this returns),
 *        disable the activity kinds, report the counts and release the handle. Accepts NULL.
 * @param c handle; invalid after the call.
 * @param stats receives the final counts; may be NULL.
 * @return FERRY_OK, or FERRY_ERR_CUDA when the flush or a disable failed (the handle is
 *         released all the same).
 */
FERRY_API ferry_status ferry_cupti_stop(ferry_cupti *c, struct ferry_cupti_stats *stats);

/**
 * @brief A ::ferry_launch_begin_fn for ferry_exec_set_launch_hook() (user = the collector):
 *        pushes the op's tag as CUPTI's external correlation id (kind CUSTOM0) on the calling
 *        thread, so the kernels and copies CUPTI records get the op's layer and expert. Does
 *        nothing without CUDA or without a running collector.
 */
FERRY_API void ferry_cupti_launch_begin(void *user, uint64_t tag);

/** @brief The matching ::ferry_launch_end_fn: pops the external correlation id. */
FERRY_API void ferry_cupti_launch_end(void *user);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_CUPTI_H */
