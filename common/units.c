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

int64_t ferry__mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
