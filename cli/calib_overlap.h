/* `ferry calibrate --db`: how long each kernel of a recorded run had a copy over the link beside
 * it, for the fit of link.contention and to take that contention out of the kernel costs. */
#ifndef FERRY_CLI_CALIB_OVERLAP_H
#define FERRY_CLI_CALIB_OVERLAP_H

#include <sqlite3.h>
#include <stdint.h>

#include "ferry/hw.h"
#include "ferry/status.h"

struct calib_copy {
  int64_t start, end;
  int64_t correlation; /* issue order */
};

/* A run's copies between host and device, in order of start. */
struct calib_copies {
  struct calib_copy *v;
  size_t n;
  int64_t longest; /* the longest copy's duration: how far back an overlapping one can start */
};

ferry_status calib_copies_load(sqlite3 *db, int64_t run, struct calib_copies *out);
void calib_copies_free(struct calib_copies *c);

/* The time within [start, end) with some copy in flight (*all), and with some copy issued before
 * the kernel in flight (*before: correlation ids below its own; what the simulator charges). */
void calib_overlap(const struct calib_copies *c, int64_t start, int64_t end, int64_t correlation, double *all,
                   double *before);

/* Fit link.contention to the kernels (a shape: kind, bytes and flops) of n_runs runs, c[i] the
 * copies of runs[i], and print it; p keeps its figure (the base profile's, a probe's) when the
 * runs have too few kernels beside a copy to tell it. *fitted says whether the figure came from
 * these runs. */
ferry_status calib_fit_contention(sqlite3 *db, const int64_t *runs, size_t n_runs, const struct calib_copies *c,
                                  struct ferry_hw_profile *p, int *fitted);

#endif
