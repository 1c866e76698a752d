/* Fuzz target: model.safetensors.index.json, the map of a sharded checkpoint. The index is
 * written into a model folder holding two valid shards (tests/data/safetensors/sharded_valid),
 * next to a third safetensors file outside the folder that a "../" entry could reach, and the
 * folder is opened. Invariants of an accepted index: every file of the store lies inside the
 * model folder, every tensor lies inside its file, is found by name and reads back. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ferry/store.h"
#include "tests/fuzz/fuzz.h"

#ifndef FUZZ_SOURCE_DIR
#error "build with -DFUZZ_SOURCE_DIR=\"<ferry source tree>\""
#endif

static void copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  FUZZ_CHECK(in && out);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) FUZZ_CHECK(fwrite(buf, 1, n, out) == n);
  fclose(in);
  FUZZ_CHECK(fclose(out) == 0);
}

static char model_dir[PATH_MAX];

static void setup(void) {
  const char *src = FUZZ_SOURCE_DIR "/tests/data/safetensors";
  char from[PATH_MAX], to[PATH_MAX + 64];
  snprintf(model_dir, sizeof model_dir, "%s/model", fuzz_dir());
  FUZZ_CHECK(mkdir(model_dir, 0755) == 0);
  for (int i = 1; i <= 2; i++) {
    snprintf(from, sizeof from, "%s/sharded_valid/model-0000%d-of-00002.safetensors", src, i);
    snprintf(to, sizeof to, "%s/model-0000%d-of-00002.safetensors", model_dir, i);
    copy_file(from, to);
  }
  snprintf(from, sizeof from, "%s/valid_small.safetensors", src);
  snprintf(to, sizeof to, "%s/valid_small.safetensors", fuzz_dir());
  copy_file(from, to);
  char *real = realpath(model_dir, NULL);
  FUZZ_CHECK(real && strlen(real) < sizeof model_dir);
  snprintf(model_dir, sizeof model_dir, "%s", real);
  free(real);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    setup();
    ready = 1;
  }
  if (!fuzz_write("model/model.safetensors.index.json", data, size)) return 0;
  ferry_store *s = NULL;
  if (ferry_store_open(&s, model_dir) != FERRY_OK) return 0;
  const size_t files = ferry_store_file_count(s);
  FUZZ_CHECK(files >= 1);
  for (size_t f = 0; f < files; f++) {
    char *real = realpath(ferry_store_file_path(s, f), NULL);
    FUZZ_CHECK(real && !strncmp(real, model_dir, strlen(model_dir)) && real[strlen(model_dir)] == '/');
    free(real);
  }
  uint8_t buf[256];
  for (size_t i = 0; i < ferry_store_tensor_count(s); i++) {
    const struct ferry_store_tensor *t = ferry_store_tensor_at(s, i);
    FUZZ_CHECK(t && t->file < files && t->offset <= ferry_store_file_size(s, t->file));
    FUZZ_CHECK(t->nbytes <= ferry_store_file_size(s, t->file) - t->offset);
    FUZZ_CHECK(ferry_store_find(s, t->name) == t);
    if (t->nbytes <= sizeof buf) FUZZ_CHECK(ferry_store_read_tensor(s, t, buf, sizeof buf) == FERRY_OK);
  }
  ferry_store_close(s);
  return 0;
}
