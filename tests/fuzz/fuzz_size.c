/* Fuzz target: the number spellings every option, sweep value and profile shares: sizes
 * ("512M", "2GiB", "1.5GB"), strict integers and strict numbers. Invariants: a size that
 * parses is the same size with its suffix spelled in another case; an integer or number that
 * parses prints back to the same value; the option wrappers agree with the parsers. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/units.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size);
  if (!text) return 0;
  uint64_t bytes, again;
  const int size_ok = ferry__parse_size(text, &bytes) == FERRY_OK;
  FUZZ_CHECK((cli_parse_size("--size", text, &again) == 0) == size_ok);
  if (size_ok) {
    FUZZ_CHECK(again == bytes);
    char *upper = strdup(text);
    FUZZ_CHECK(upper != NULL);
    for (char *p = upper; *p; p++)
      if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
    uint64_t b2;
    FUZZ_CHECK(ferry__parse_size(upper, &b2) == FERRY_OK && b2 == bytes);
    free(upper);
    char buf[64];
    ferry__format_bytes(bytes, buf, sizeof buf);
  }
  int64_t i, j;
  if (ferry__parse_i64(text, &i) == FERRY_OK) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, i);
    FUZZ_CHECK(ferry__parse_i64(buf, &j) == FERRY_OK && j == i);
    FUZZ_CHECK(cli_parse_int("--n", text, INT64_MIN, INT64_MAX, &j) == 0 && j == i);
  }
  double d, e;
  if (ferry__parse_double(text, &d) == FERRY_OK) {
    FUZZ_CHECK(isfinite(d));
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", d);
    FUZZ_CHECK(ferry__parse_double(buf, &e) == FERRY_OK && e == d);
    FUZZ_CHECK(cli_parse_double("--x", text, -INFINITY, INFINITY, &e) == 0 && (e == d || (isnan(e) && isnan(d))));
  }
  free(text);
  return 0;
}
