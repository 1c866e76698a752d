/* Parsing and printing of byte sizes ("512M", "2GiB", "1.5GB") and durations. */
#ifndef FERRY_COMMON_UNITS_H
#define FERRY_COMMON_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

/* Parse a size: a positive number with an optional suffix. K/M/G/T and KiB/MiB/GiB/TiB
 * are powers of 1024 (as memory budgets are usually meant); KB/MB/GB/TB are powers of 1000;
 * B or no suffix is bytes. Fractions are allowed ("1.5G") and rounded down to whole bytes; a
 * size under one byte ("0", "0.5") is an error, never "unlimited". On error sets the last
 * error naming the text and returns FERRY_ERR_INVALID (FERRY_ERR_RANGE when too large). */
ferry_status ferry__parse_size(const char *text, uint64_t *out_bytes);

/* Format bytes as "1.50 GiB"; returns buf. */
const char *ferry__format_bytes(uint64_t bytes, char *buf, size_t len);

/* Format nanoseconds as "12.3 ms"; returns buf. */
const char *ferry__format_ns(double ns, char *buf, size_t len);

/* Strict integer parse of a whole string (base 10); ERR_INVALID on junk or overflow. */
ferry_status ferry__parse_i64(const char *text, int64_t *out);
ferry_status ferry__parse_double(const char *text, double *out);

/* Seconds given by a user to int64 nanoseconds: every conversion of user time goes through
 * these, so a value past the clock (1e300 s) is FERRY_ERR_RANGE, never a wrapped negative time.
 * Valid: finite and in [0, 9223372036] s. */
ferry_status ferry__seconds_to_ns(double seconds, int64_t *out_ns);
/* Parse a number of seconds ("12.5") into ns; FERRY_ERR_INVALID on junk, ERR_RANGE out of range. */
ferry_status ferry__parse_seconds_ns(const char *text, int64_t *out_ns);
/* Parse a time window "A:B" in seconds; either side may be empty ("600:", ":60"), not both.
 * start_ns = 0 when A is empty; end_ns = 0 (no end) when B is empty; B must be after A. */
ferry_status ferry__parse_window_ns(const char *text, int64_t *start_ns, int64_t *end_ns);
/* ns x factor (a time scale), rounded; FERRY_ERR_RANGE when it leaves the int64 clock. */
ferry_status ferry__scale_ns(int64_t ns, double factor, int64_t *out_ns);

/* Monotonic clock in ns. */
int64_t ferry__mono_ns(void);

#endif
