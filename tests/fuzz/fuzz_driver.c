/* Standalone replay driver: the main() a fuzz target gets when it is built without libFuzzer
 * (gcc, the default and asan presets). Each argument is an input file or a folder of them
 * (every regular file inside, in name order); each is read into a buffer of exactly its size
 * and given to LLVMFuzzerTestOneInput() once, so a corpus replays deterministically in ctest.
 * Fails when an argument yields no input (a corpus that went missing is an error). Paths are
 * made absolute first: some targets work in their scratch folder. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    perror(path);
    fclose(f);
    return -1;
  }
  size_t size = (size_t)st.st_size;
  uint8_t *data = malloc(size ? size : 1);
  if (!data || (size && fread(data, 1, size, f) != size)) {
    fprintf(stderr, "%s: cannot read\n", path);
    free(data);
    fclose(f);
    return -1;
  }
  fclose(f);
  /* a copy of exactly the input's size, so that reading past its end is an ASan report */
  uint8_t *exact = size ? malloc(size) : NULL;
  if (size && !exact) {
    free(data);
    return -1;
  }
  if (size) memcpy(exact, data, size);
  free(data);
  fprintf(stderr, "replay %s (%zu bytes)\n", path, size);
  LLVMFuzzerTestOneInput(exact, size);
  free(exact);
  return 0;
}

static int skip_name(const struct dirent *e) { return e->d_name[0] != '.'; }

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  /* the readers' own output is not under test; the CLI-driven targets print their results */
  if (!freopen("/dev/null", "w", stdout)) return 1;
  for (int a = 1; a < argc; a++) {
    char *abs = realpath(argv[a], NULL);
    if (!abs) {
      perror(argv[a]);
      return 1;
    }
    argv[a] = abs; /* released at exit */
  }
  size_t total = 0;
  for (int a = 1; a < argc; a++) {
    struct stat st;
    if (stat(argv[a], &st) != 0) {
      perror(argv[a]);
      return 1;
    }
    size_t n = 0;
    if (S_ISDIR(st.st_mode)) {
      struct dirent **list;
      int count = scandir(argv[a], &list, skip_name, alphasort);
      if (count < 0) {
        perror(argv[a]);
        return 1;
      }
      for (int i = 0; i < count; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[a], list[i]->d_name);
        struct stat fs;
        if (stat(path, &fs) != 0) {
          perror(path);
          return 1;
        }
        if (S_ISREG(fs.st_mode)) {
          if (replay_file(path) != 0) return 1;
          n++;
        }
        free(list[i]);
      }
      free(list);
    } else {
      if (replay_file(argv[a]) != 0) return 1;
      n = 1;
    }
    if (n == 0) {
      fprintf(stderr, "%s: no inputs to replay\n", argv[a]);
      return 1;
    }
    total += n;
  }
  fprintf(stderr, "%s: %zu inputs replayed, no failure\n", argv[0], total);
  return 0;
}
