/**
 * @file calibrate.h
 * @brief Calibration: measure this machine for the `host` executor (`ferry calibrate --probe`)
 *        and fit hardware-profile costs to the op durations of a recorded run's timeline
 *        (`ferry calibrate --db`), so simulated runs are priced by measured rates.
 */
#ifndef FERRY_CALIBRATE_H
#define FERRY_CALIBRATE_H

#include "ferry/api.h"

#include <stdint.h>
#include <stdio.h>

#include "ferry/hw.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One measured op: its cost-model view and how long it took. */
struct ferry_calib_sample {
  double bytes;       /**< bytes moved or touched */
  double flops;       /**< floating-point operations (0 for copies) */
  double duration_ns; /**< measured duration */
};

/**
 * @brief Fit duration = overhead + bytes * ns_per_byte + flops * ns_per_flop, and the roofline
 *        form overhead + max(...) (each op assigned to the term that dominates for it, the
 *        masked linear problem re-solved until the assignment settles); keep the better one
 *        (out->roofline). Relative least squares (weights 1/duration^2), coefficients >= 0;
 *        then every coefficient is scaled by one factor so the fitted durations add up to the
 *        measured total (relative least squares alone comes out low on noisy data, and a run's
 *        latency is a sum of durations).
 * @param samples the measurements (at least one).
 * @param n number of samples.
 * @param out receives the coefficients.
 * @param r2 receives the coefficient of determination of the log durations: 1 - (sum of squared
 *        log errors) / (variance of the log measured durations) (may be NULL).
 * @return FERRY_ERR_INVALID when n is 0.
 */
FERRY_API ferry_status ferry_calibrate_fit(const struct ferry_calib_sample *samples, size_t n, struct ferry_hw_cost *out,
                                 double *r2);

/** One kernel of a recorded run, for the fit of the link's contention with kernels. */
struct ferry_calib_overlap {
  uint64_t group;     /**< kernels of the same kind and shape share it */
  double duration_ns; /**< measured duration */
  double overlap_ns;  /**< the part of it with a copy over the link in flight */
};

/** What the contention fit found (ferry_calibrate_fit_contention()). */
struct ferry_calib_contention {
  double contention; /**< the kernels' extra time per ns of a copy beside them (link.contention) */
  double std_error;  /**< its standard error */
  double r2;         /**< share of the variance within shapes (each duration over its shape's median,
                          less the shape's mean) that the overlap explains */
  size_t samples;    /**< kernels in shapes of two or more (a lone kernel tells nothing) */
  size_t overlapped; /**< of those, the ones a copy overlapped */
};

/**
 * @brief Fit duration = cost of the shape + contention x overlap to kernels of a recorded run:
 *        a regression within each shape (kernels of one kind and size), each scaled by the
 *        shape's median duration, so only the difference between the same kernel run with and
 *        without a copy beside it counts. Kernels above 3x their shape's median (descheduled by
 *        the OS) are left out.
 * @param samples the kernels (reordered by group).
 * @param n number of kernels.
 * @param out receives the fit; out->contention is 0 when no shape has kernels run both with and
 *        without a copy beside them.
 * @return FERRY_ERR_INVALID when n is 0; FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_calibrate_fit_contention(struct ferry_calib_overlap *samples, size_t n,
                                                      struct ferry_calib_contention *out);

/**
 * @brief Measure this machine with the host executor: copy bandwidth and per-op latency,
 *        O_DIRECT read bandwidth and latency, the cost of every kernel kind at the shapes
 *        the engine uses (fitted into the profile's "cost" section), and how much a copy in
 *        flight slows a kernel beside it (link.contention: a memory-bound product timed alone
 *        and beside a 64 MiB copy).
 * @param dir a folder on the disk to measure (a temporary file is written and removed there).
 * @param progress where to print progress lines, or NULL.
 * @param out receives the profile (kind "gpu": the host executor's stand-in device).
 */
FERRY_API ferry_status ferry_calibrate_probe(const char *dir, FILE *progress, struct ferry_hw_profile *out);

/**
 * @brief Write a profile as JSON in the catalogue format (every section it has, the cost
 *        section, the fitted list with a source note for each fitted figure, and the sources
 *        the profile carries for the others, so that a calibrated profile keeps the provenance
 *        of what it did not measure), atomically. Every figure reads back to
 *        the same double; a derived one (link.pageable_h2d_gbps with pageable_derived) is left
 *        for the reader to derive again, so it keeps following link.h2d_gbps.
 * @param profile the profile.
 * @param fitted names of the figures that were fitted or measured (may be NULL).
 * @param n_fitted number of names.
 * @param source_note text for the "source" of the measured figures (e.g. "ferry calibrate
 *        --probe on host X, 2026-11-29").
 * @param path output file.
 */
FERRY_API ferry_status ferry_hw_write_json(const struct ferry_hw_profile *profile, const char *const *fitted, size_t n_fitted,
                                 const char *source_note, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_CALIBRATE_H */
