/* The shared fuzz helpers of fuzz.h: scratch folder, input files and invariant failures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/units.h"
#include "tests/fuzz/fuzz.h"

static char dir[64];

static void remove_dir(void) {
  if (dir[0]) ferry__rm_rf(dir);
}

const char *fuzz_dir(void) {
  if (!dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/ferry-fuzz-XXXXXX", tmp && *tmp && strlen(tmp) < 32 ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
      perror("fuzz: mkdtemp");
      abort();
    }
    atexit(remove_dir);
  }
  return dir;
}

const char *fuzz_write(const char *name, const uint8_t *data, size_t size) {
  static char path[128];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
  FILE *f = fopen(path, "wb");
  if (!f) return NULL;
  size_t n = size ? fwrite(data, 1, size, f) : 0;
  return fclose(f) == 0 && n == size ? path : NULL;
}

char *fuzz_cstr(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) return NULL;
  if (size) memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

int fuzz_synthetic_small(const char *spec, int64_t max_n) {
  /* the items as ferry_trace_synthetic() splits them: commas, leading spaces, key "n" */
  char *copy = strdup(spec), *save = NULL;
  if (!copy) return 0;
  int small = 1;
  for (char *item = strtok_r(copy, ",", &save); item && small; item = strtok_r(NULL, ",", &save)) {
    while (*item == ' ') item++;
    int64_t n;
    if (!strncmp(item, "n=", 2) && ferry__parse_i64(item + 2, &n) == FERRY_OK && n > max_n) small = 0;
  }
  free(copy);
  return small;
}

void fuzz_fail(const char *file, int line, const char *what) {
  fprintf(stderr, "%s:%d: invariant broken on an accepted input: %s\n", file, line, what);
  abort();
}
