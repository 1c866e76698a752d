/* The statistics behind `ferry db diff` of repeated runs: the one-sided Mann-Whitney U test
 * (rank-based, so one slow run on a loaded machine cannot carry the verdict) and Cliff's delta
 * as its effect size. Repeats are few (3 to 30), so the exact null distribution is used; it
 * is the coefficients of the Gaussian binomial [m+n choose m]_q (Mann and Whitney 1947). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "profiler/db_internal.h"

/* Beyond this many pairs the normal approximation is used (the counts lose precision). */
#define EXACT_MAX_PAIRS 900

/* U counts pairs (x_i, y_j) with x_i > y_j, ties a half: small U means y is larger. */
static double u_statistic(const double *x, size_t nx, const double *y, size_t ny) {
  double u = 0;
  for (size_t i = 0; i < nx; i++)
    for (size_t j = 0; j < ny; j++) u += x[i] > y[j] ? 1.0 : x[i] == y[j] ? 0.5 : 0.0;
  return u;
}

/* P(U <= u) under H0 for sizes m, n without ties: the product over i = 1..n of
 * (1 - q^(m+i)) / (1 - q^i), truncated at degree m*n (every step only moves mass upwards, so
 * the truncation is exact). */
static double exact_cdf(size_t m, size_t n, double u) {
  const size_t deg = m * n;
  double *c = ferry__calloc(deg + 1, sizeof *c);
  if (!c) return NAN;
  c[0] = 1;
  for (size_t i = 1; i <= n; i++) {
    for (size_t k = deg; k >= m + i && k <= deg; k--) c[k] -= c[k - m - i];
    for (size_t k = i; k <= deg; k++) c[k] += c[k - i];
  }
  double total = 0, below = 0;
  for (size_t k = 0; k <= deg; k++) {
    total += c[k];
    if ((double)k <= u) below += c[k];
  }
  ferry_free(c);
  return below / total;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Normal approximation with the tie correction of the variance and a continuity correction. */
static double normal_cdf(const double *x, size_t nx, const double *y, size_t ny, double u) {
  const size_t n = nx + ny;
  double *all = ferry__calloc(n, sizeof *all);
  if (!all) return NAN;
  for (size_t i = 0; i < nx; i++) all[i] = x[i];
  for (size_t j = 0; j < ny; j++) all[nx + j] = y[j];
  qsort(all, n, sizeof *all, cmp_double);
  double ties = 0;
  for (size_t i = 0; i < n;) {
    size_t k = i;
    while (k < n && all[k] == all[i]) k++;
    const double t = (double)(k - i);
    ties += t * t * t - t;
    i = k;
  }
  ferry_free(all);
  const double m = (double)nx, w = (double)ny, N = (double)n;
  const double var = m * w / 12.0 * ((N + 1) - ties / (N * (N - 1)));
  if (var <= 0) return 1.0; /* every value equal: no evidence either way */
  const double z = (u + 0.5 - m * w / 2.0) / sqrt(var);
  return 0.5 * erfc(-z / sqrt(2.0));
}

double ferry__mann_whitney_greater(const double *x, size_t nx, const double *y, size_t ny) {
  if (!nx || !ny) return NAN;
  /* every value equal (a deterministic metric that did not change): no evidence either way */
  int constant = 1;
  for (size_t i = 0; i < nx && constant; i++) constant = x[i] == x[0];
  for (size_t j = 0; j < ny && constant; j++) constant = y[j] == x[0];
  if (constant) return 1.0;
  const double u = u_statistic(x, nx, y, ny);
  /* a tie counts a half: rounding U up keeps the exact p-value conservative */
  if (nx * ny <= EXACT_MAX_PAIRS) return exact_cdf(nx, ny, ceil(u));
  return normal_cdf(x, nx, y, ny, u);
}

double ferry__cliffs_delta(const double *x, size_t nx, const double *y, size_t ny) {
  if (!nx || !ny) return NAN;
  double more = 0, less = 0;
  for (size_t i = 0; i < nx; i++)
    for (size_t j = 0; j < ny; j++) {
      more += y[j] > x[i];
      less += y[j] < x[i];
    }
  return (more - less) / ((double)nx * (double)ny);
}
