/**
 * @file fault.h
 * @brief The I/O layer's retry policy and statistics, and fault injection for tests.
 *
 * Every disk read of weights goes through one layer (as SQLite's `sqlite3Os*` wrappers): it
 * retries transient errors (EIO, EAGAIN, EINTR, an end of file before the bytes the caller
 * was promised) with exponential backoff and jitter up to a limit, continues short reads,
 * verifies the size read (and, on request, a checksum: ferry_store_set_verify()), and reports
 * a permanent failure naming the file, the offset and the attempts made. The same layer
 * injects faults so tests can prove that a transient fault is survived and a permanent one
 * fails cleanly; the executors inject faults into their copies and kernels the same way (a
 * device failing mid-run), and the simulator charges injected disk faults and delays in
 * virtual time.
 *
 * Fault specification (`FERRY_FAULT` in the environment, `--faults` on the command line,
 * ferry_fault_set() in a program): comma-separated rules `SITE:KIND@WHEN` and an optional
 * `seed=N` (default 1) for probabilistic rules.
 * - SITE: `read` (disk reads; the default when left out), `copy` (executor copies), `kernel`
 *   (executor kernels).
 * - KIND: `eio`, `eagain`, `eintr` (a read fails with that error), `short` (a read returns half
 *   the bytes asked), `corrupt` (a read returns one flipped byte: only a checksum sees it),
 *   `delay:MS` (the attempt takes MS milliseconds more; any site), `fail` (a copy or kernel
 *   fails: the device is lost).
 * - WHEN: `N` the Nth attempt at that site (1-based) only; `N*K` K attempts from the Nth;
 *   `N+` every attempt from the Nth on (a permanent fault); or a probability written with a
 *   decimal point (`0.01`): each attempt independently, drawn from the seed.
 *
 * Examples: `read:eio@3` (the third read fails once: retried, survived), `read:eio@3+` (every
 * read from the third fails: the run stops naming the file), `short@2,read:delay:20@0.05`,
 * `kernel:fail@500` (the device fails at its 500th kernel).
 * Attempts are counted per site from the last ferry_fault_set() (or process start).
 */
#ifndef FERRY_FAULT_H
#define FERRY_FAULT_H

#include <stdint.h>

#include "ferry/api.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Where a fault is injected. */
enum ferry_fault_site {
  FERRY_FAULT_READ,   /**< disk reads (one pread attempt) */
  FERRY_FAULT_COPY,   /**< executor copies (host to device and back) */
  FERRY_FAULT_KERNEL, /**< executor kernels */
  FERRY_FAULT_SITES   /**< number of sites, not a site */
};

/** What an injected fault does. */
enum ferry_fault_kind {
  FERRY_FAULT_NONE,    /**< nothing */
  FERRY_FAULT_EIO,     /**< the read fails with EIO */
  FERRY_FAULT_EAGAIN,  /**< the read fails with EAGAIN */
  FERRY_FAULT_EINTR,   /**< the read fails with EINTR */
  FERRY_FAULT_SHORT,   /**< the read returns half the bytes asked (at least one) */
  FERRY_FAULT_CORRUPT, /**< the read succeeds with one byte flipped */
  FERRY_FAULT_FAIL     /**< the copy or kernel fails (device lost) */
};

/** The fault to inject into one attempt. */
struct ferry_fault {
  enum ferry_fault_kind kind; /**< what fails (FERRY_FAULT_NONE: nothing) */
  int64_t delay_ns;           /**< extra time the attempt takes (0: none) */
  uint64_t attempt;           /**< the attempt's number at its site (1-based) */
};

/**
 * @brief Install a fault specification (grammar in the file comment) and restart the attempt
 *        counters. NULL or "" removes every rule.
 * @return FERRY_OK; FERRY_ERR_INVALID naming the rule that does not parse (the previous
 *         specification stays).
 */
FERRY_API ferry_status ferry_fault_set(const char *spec);

/** @brief Remove every rule (as ferry_fault_set(NULL)). */
FERRY_API void ferry_fault_clear(void);

/**
 * @brief Install the specification in the environment variable FERRY_FAULT, if set.
 * @return FERRY_OK (also when unset); FERRY_ERR_INVALID when it does not parse.
 */
FERRY_API ferry_status ferry_fault_from_env(void);

/** @brief Whether any rule is installed. */
FERRY_API int ferry_fault_active(void);

/**
 * @brief Count one attempt at @p site and say what to inject into it. Thread-safe; the
 *        attempts of one site are numbered in the order threads reach this call.
 */
FERRY_API struct ferry_fault ferry_fault_draw(enum ferry_fault_site site);

/** @brief The faults injected so far (every site) since the last ferry_fault_set(). */
FERRY_API uint64_t ferry_fault_injected(void);

/** Retry policy of disk reads. */
struct ferry_io_policy {
  int32_t max_attempts;   /**< attempts per read before the failure is permanent (>= 1; default 5) */
  int64_t backoff_ns;     /**< wait before the first retry (default 1 ms); doubles on each retry */
  int64_t backoff_max_ns; /**< longest wait between attempts (default 200 ms) */
  double jitter;          /**< each wait is scaled by a factor drawn in [1 - jitter, 1] (default 0.5) */
};

/** @brief Set the retry policy (copied). Values out of range are clamped; NULL restores the defaults. */
FERRY_API void ferry_io_set_policy(const struct ferry_io_policy *policy);

/** @brief The retry policy in force. */
FERRY_API void ferry_io_get_policy(struct ferry_io_policy *out);

/**
 * @brief Wait before retry number @p retry (1 = the first retry) under the policy:
 *        min(backoff_ns x 2^(retry-1), backoff_max_ns) scaled by a jitter factor drawn
 *        from @p salt (the same salt, the same wait).
 */
FERRY_API int64_t ferry_io_backoff_ns(int32_t retry, uint64_t salt);

/** Counters of the I/O layer since the process started (or ferry_io_stats_reset()). */
struct ferry_io_stats {
  uint64_t reads;       /**< reads asked of the layer */
  uint64_t attempts;    /**< system calls made (retries and continued short reads included) */
  uint64_t retries;     /**< attempts that repeated a failed one */
  uint64_t short_reads; /**< reads that returned fewer bytes than asked and were continued */
  uint64_t recovered;   /**< reads that failed at least once and then succeeded */
  uint64_t failed;      /**< reads that failed permanently */
  uint64_t checksum_mismatches; /**< reads whose checksum did not match (re-read) */
};

/** @brief Read the counters. */
FERRY_API void ferry_io_stats_get(struct ferry_io_stats *out);

/** @brief Zero the counters. */
FERRY_API void ferry_io_stats_reset(void);

/** A retry or a permanent failure, as reported to the observer. */
struct ferry_io_event {
  const char *path;  /**< the file (borrowed for the call) */
  uint64_t offset;   /**< byte offset of the attempt */
  uint64_t len;      /**< bytes the attempt asked for */
  int32_t attempt;   /**< the attempt that failed (1-based) */
  int error;         /**< errno of the failure (0: end of file or checksum mismatch) */
  int permanent;     /**< 1: no more attempts, the read fails */
  const char *what;  /**< what failed, e.g. "EIO", "end of file", "checksum mismatch" */
};

/** @brief Called on every retry and permanent failure, from the thread that read. */
typedef void (*ferry_io_observer_fn)(void *user, const struct ferry_io_event *event);

/** @brief Install (or with NULL remove) the observer. Not thread-safe against running reads. */
FERRY_API void ferry_io_set_observer(ferry_io_observer_fn fn, void *user);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_FAULT_H */
