/* Fuzz target: one .safetensors file (header JSON, dtypes, shapes, data offsets). Invariants of
 * an accepted file: the tensors tile the data area exactly (sorted, no overlap, no hole, ending
 * at the end of the file), each length is its shape times its dtype size, every tensor is
 * found by its name and reads back. */
#include <stdlib.h>
#include <string.h>

#include "ferry/store.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write("model.safetensors", data, size);
  if (!path) return 0;
  ferry_store *s = NULL;
  if (ferry_store_open(&s, path) != FERRY_OK) return 0;
  FUZZ_CHECK(ferry_store_file_count(s) == 1);
  const uint64_t file_size = ferry_store_file_size(s, 0);
  FUZZ_CHECK(file_size == size);
  uint64_t end = 0;
  uint8_t *buf = NULL;
  for (size_t i = 0; i < ferry_store_tensor_count(s); i++) {
    const struct ferry_store_tensor *t = ferry_store_tensor_at(s, i);
    FUZZ_CHECK(t && t->name && t->file == 0);
    FUZZ_CHECK(t->ndim >= 0 && t->ndim <= FERRY_ST_MAX_DIMS);
    uint64_t elems = 1;
    for (int d = 0; d < t->ndim; d++) {
      FUZZ_CHECK(t->shape[d] >= 0);
      FUZZ_CHECK(t->shape[d] == 0 || elems <= UINT64_MAX / (uint64_t)t->shape[d]);
      elems *= (uint64_t)t->shape[d];
    }
    FUZZ_CHECK(elems <= UINT64_MAX / ferry_dtype_size(t->dtype));
    FUZZ_CHECK(t->nbytes == elems * ferry_dtype_size(t->dtype));
    if (i == 0) end = t->offset; /* the data area starts after the header */
    FUZZ_CHECK(t->offset == end);
    FUZZ_CHECK(t->nbytes <= file_size - t->offset);
    end = t->offset + t->nbytes;
    FUZZ_CHECK(ferry_store_find(s, t->name) == t);
    uint8_t *b = realloc(buf, t->nbytes ? t->nbytes : 1);
    FUZZ_CHECK(b != NULL);
    buf = b;
    FUZZ_CHECK(ferry_store_read_tensor(s, t, buf, t->nbytes) == FERRY_OK);
    FUZZ_CHECK(t->nbytes == 0 || memcmp(buf, data + t->offset, t->nbytes) == 0);
  }
  FUZZ_CHECK(ferry_store_tensor_count(s) == 0 || end == file_size);
  FUZZ_CHECK(ferry_store_tensor_at(s, ferry_store_tensor_count(s)) == NULL);
  free(buf);
  ferry_store_close(s);
  return 0;
}
