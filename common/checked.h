/* Arithmetic on numbers read from untrusted input (a result database someone else wrote, a
 * crafted one): every reader goes through these instead of plain +, - and casts, so
 * INT64_MIN/MAX times, negative counts and 1e308 reals in integer columns saturate or become
 * finite doubles, never signed overflow or an out-of-range conversion (undefined behaviour). */
#ifndef FERRY_COMMON_CHECKED_H
#define FERRY_COMMON_CHECKED_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* a + b, saturating at INT64_MIN / INT64_MAX. */
static inline int64_t ferry__sat_add_i64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
  return r;
}

/* a - b, saturating. */
static inline int64_t ferry__sat_sub_i64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) return b < 0 ? INT64_MAX : INT64_MIN;
  return r;
}

/* end - start as a double: never overflows (exact while both are below 2^53, about 104 days
 * of nanoseconds; beyond that rounded, as any double). */
static inline double ferry__span(int64_t start, int64_t end) { return (double)end - (double)start; }

/* A double as int64: saturating, NaN as 0 (a cast of an out-of-range double is undefined). */
static inline int64_t ferry__f64_to_i64(double v) {
  if (!(v == v)) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

/* A double as uint64: negative and NaN as 0, saturating above. */
static inline uint64_t ferry__f64_to_u64(double v) {
  if (!(v > 0)) return 0;
  if (v >= 18446744073709551615.0) return UINT64_MAX;
  return (uint64_t)v;
}

/* A double as size_t in [0, max]: for indexes computed from untrusted values. */
static inline size_t ferry__f64_to_index(double v, size_t max) {
  if (!(v > 0)) return 0;
  if (v >= (double)max) return max;
  return (size_t)v;
}

/* v when finite, else fallback (NaN and infinities from a database or strtod). */
static inline double ferry__finite_or(double v, double fallback) { return isfinite(v) ? v : fallback; }

#endif
