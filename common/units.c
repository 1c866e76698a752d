/* Size and number parsing shared by the command line, sweep specs and profiles, so every
 * place accepts the same spellings and rejects the same junk. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/error.h"
#include "common/units.h"

ferry_status ferry__parse_size(const char *text, uint64_t *out_bytes) {
  if (!text || !*text) return ferry__fail(FERRY_ERR_INVALID, "empty size");
  errno = 0;
  char *end = NULL;
  double value = strtod(text, &end);
  if (end == text || errno || !isfinite(value) || value < 0 || text[0] == '-')
    return ferry__fail(FERRY_ERR_INVALID, "'%s' is not a size (expected e.g. 4096, 512M, 2GiB)", text);
  while (*end == ' ') end++;
  static const struct {
    const char *suffix;
    double mult;
  } units[] = {
      {"", 1},          {"b", 1},           {"k", 1024.0},    {"ki", 1024.0},  {"kib", 1024.0},
      {"kb", 1e3},      {"m", 1048576.0},   {"mi", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
      {"g", 1073741824.0}, {"gi", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
      {"t", 1099511627776.0}, {"ti", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
  };
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcasecmp(end, units[i].suffix) == 0) {
      double bytes = floor(value * units[i].mult);
      if (bytes >= 18446744073709551616.0)
        return ferry__fail(FERRY_ERR_RANGE, "size '%s' is too large", text);
      /* 0 (or 0.5) must not quietly mean "no limit" where 0 is a budget's "unlimited": a size
       * is at least one byte, and "no limit" is said by leaving the option out. */
      if (bytes < 1)
        return ferry__fail(FERRY_ERR_INVALID, "size '%s' is less than one byte (leave the option out for no limit)",
                           text);
      *out_bytes = (uint64_t)bytes;
      return FERRY_OK;
    }
  }
  return ferry__fail(FERRY_ERR_INVALID, "'%s': unknown size suffix '%s' (expected K, M, G, T, KiB, MB, ...)",
                     text, end);
}

const char *ferry__format_bytes(uint64_t bytes, char *buf, size_t len) {
  static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)bytes;
  int i = 0;
  while (v >= 1024.0 && i < 5) {
    v /= 1024.0;
    i++;
  }
  if (i == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)bytes);
  else
    snprintf(buf, len, "%.2f %s", v, names[i]);
  return buf;
}

const char *ferry__format_ns(double ns, char *buf, size_t len) {
  if (ns < 1e3)
    snprintf(buf, len, "%.0f ns", ns);
  else if (ns < 1e6)
    snprintf(buf, len, "%.1f us", ns / 1e3);
  else if (ns < 1e9)
    snprintf(buf, len, "%.2f ms", ns / 1e6);
  else
    snprintf(buf, len, "%.3f s", ns / 1e9);
  return buf;
}

ferry_status ferry__parse_i64(const char *text, int64_t *out) {
  if (!text || !*text) return ferry__fail(FERRY_ERR_INVALID, "empty number");
  errno = 0;
  char *end = NULL;
  long long v = strtoll(text, &end, 10);
  if (*end || errno) return ferry__fail(FERRY_ERR_INVALID, "'%s' is not an integer", text);
  *out = v;
  return FERRY_OK;
}

ferry_status ferry__parse_double(const char *text, double *out) {
  if (!text || !*text) return ferry__fail(FERRY_ERR_INVALID, "empty number");
  errno = 0;
  char *end = NULL;
  double v = strtod(text, &end);
  if (*end || errno || !isfinite(v)) return ferry__fail(FERRY_ERR_INVALID, "'%s' is not a number", text);
  *out = v;
  return FERRY_OK;
}

/* Largest number of seconds whose nanoseconds fit in int64_t (about 292 years). */
#define MAX_SECONDS (9223372036854775807.0 / 1e9)

ferry_status ferry__seconds_to_ns(double seconds, int64_t *out_ns) {
  if (!isfinite(seconds) || seconds < 0 || !(seconds * 1e9 < 9223372036854775808.0))
    return ferry__fail(FERRY_ERR_RANGE, "%g s is outside [0, %.0f] s (times are int64 nanoseconds, about 292 years)",
                       seconds, floor(MAX_SECONDS));
  *out_ns = (int64_t)llround(seconds * 1e9);
  return FERRY_OK;
}

ferry_status ferry__parse_seconds_ns(const char *text, int64_t *out_ns) {
  char *end = NULL;
  const double v = text && *text ? strtod(text, &end) : NAN; /* 1e999 is inf: out of range below */
  if (!text || end == text || *end || isnan(v))
    return ferry__fail(FERRY_ERR_INVALID, "'%s' is not a number of seconds", text ? text : "");
  int64_t ns = 0;
  if (ferry__seconds_to_ns(v, &ns) != FERRY_OK)
    return ferry__fail(FERRY_ERR_RANGE, "'%s' s is outside [0, %.0f] s (times are int64 nanoseconds, about 292 years)",
                       text, floor(MAX_SECONDS));
  *out_ns = ns;
  return FERRY_OK;
}

ferry_status ferry__parse_window_ns(const char *text, int64_t *start_ns, int64_t *end_ns) {
  const char *colon = text ? strchr(text, ':') : NULL;
  if (!colon || strchr(colon + 1, ':'))
    return ferry__fail(FERRY_ERR_INVALID, "'%s' is not START:END in seconds (either may be empty: '600:', ':60')",
                       text ? text : "");
  char a[64], b[64];
  const size_t la = (size_t)(colon - text), lb = strlen(colon + 1);
  if (la >= sizeof a || lb >= sizeof b) return ferry__fail(FERRY_ERR_INVALID, "'%s' is too long for a time window", text);
  if (!la && !lb) return ferry__fail(FERRY_ERR_INVALID, "'%s' is an empty time window (give START:END in seconds)", text);
  memcpy(a, text, la);
  a[la] = '\0';
  memcpy(b, colon + 1, lb + 1);
  int64_t s = 0, e = 0;
  ferry_status st;
  if ((la && (st = ferry__parse_seconds_ns(a, &s)) != FERRY_OK) || (lb && (st = ferry__parse_seconds_ns(b, &e)) != FERRY_OK)) {
    char why[256]; /* the last error is about to be rewritten */
    snprintf(why, sizeof why, "%s", ferry_last_error());
    return ferry__fail(st, "time window '%s': %s", text, why);
  }
  if (lb && e <= s) return ferry__fail(FERRY_ERR_INVALID, "time window '%s': the end is not after the start", text);
  *start_ns = s;
  *end_ns = lb ? e : 0;
  return FERRY_OK;
}

ferry_status ferry__scale_ns(int64_t ns, double factor, int64_t *out_ns) {
  const double v = nearbyint((double)ns * factor);
  if (!isfinite(factor) || factor < 0 || !(v < 9223372036854775808.0) || v < -9223372036854775808.0)
    return ferry__fail(FERRY_ERR_RANGE, "%lld ns x %g is outside the int64 nanosecond clock", (long long)ns, factor);
  *out_ns = (int64_t)v;
  return FERRY_OK;
}

int64_t ferry__mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
