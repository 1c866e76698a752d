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

/* Monotonic clock in ns. */
int64_t ferry__mono_ns(void);

#endif
