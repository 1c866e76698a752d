/* libFuzzer target for the safetensors reader: every input is written to a memfd and opened
 * as a .safetensors file; any crash, leak or sanitizer report is a bug. Not part of the gcc
 * build (tests/CMakeLists.txt globs only test_*.c): scripts/fuzz.sh builds it with clang and
 * runs it on seeds from tests/data/safetensors. */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (ferry__write_all(fd, data, size, "fuzz", NULL) == FERRY_OK) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ferry_store *s = NULL;
    if (ferry_store_open(&s, path) == FERRY_OK) {
      /* everything the reader accepted must be readable */
      char buf[256];
      for (size_t i = 0; i < ferry_store_tensor_count(s); i++) {
        const struct ferry_store_tensor *t = ferry_store_tensor_at(s, i);
        if (t->nbytes <= sizeof buf && ferry_store_read_tensor(s, t, buf, sizeof buf) != FERRY_OK) __builtin_trap();
        if (ferry_store_find(s, t->name) != t) __builtin_trap();
      }
      ferry_store_close(s);
    }
  }
  close(fd);
  return 0;
}
