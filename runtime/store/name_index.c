/* Name -> index hash table (open addressing, linear probing) used by the safetensors reader
 * and writer: models have thousands of tensors, and lookups and duplicate checks must not be
 * quadratic. The table stores indices only; names live in the caller's array. */
#include <string.h>

#include "common/alloc.h"
#include "runtime/store/store_impl.h"

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ull;
  }
  return h;
}

static void place(uint32_t *slots, size_t cap, uint32_t i, const char *name) {
  size_t mask = cap - 1;
  for (size_t p = hash_name(name) & mask;; p = (p + 1) & mask) {
    if (!slots[p]) {
      slots[p] = i + 1;
      return;
    }
  }
}

ferry_status ferry__name_index_reserve(struct ferry__name_index *ix, size_t n,
                                       const char *(*get_name)(const void *ctx, uint32_t i), const void *ctx) {
  if (n > UINT32_MAX - 1) return FERRY_ERR_RANGE;
  size_t want = 16;
  while (want < n * 2) want *= 2; /* load factor <= 1/2 */
  if (want <= ix->cap) return FERRY_OK;
  uint32_t *slots = ferry__calloc(want, sizeof *slots);
  if (!slots) return FERRY_ERR_NOMEM;
  for (size_t p = 0; p < ix->cap; p++)
    if (ix->slots[p]) place(slots, want, ix->slots[p] - 1, get_name(ctx, ix->slots[p] - 1));
  ferry_free(ix->slots);
  ix->slots = slots;
  ix->cap = want;
  return FERRY_OK;
}

int64_t ferry__name_index_find(const struct ferry__name_index *ix, const char *name,
                               const char *(*get_name)(const void *ctx, uint32_t i), const void *ctx) {
  if (!ix->cap) return -1;
  size_t mask = ix->cap - 1;
  for (size_t p = hash_name(name) & mask;; p = (p + 1) & mask) {
    uint32_t v = ix->slots[p];
    if (!v) return -1;
    if (!strcmp(get_name(ctx, v - 1), name)) return (int64_t)(v - 1);
  }
}

int64_t ferry__name_index_insert(struct ferry__name_index *ix, uint32_t i,
                                 const char *(*get_name)(const void *ctx, uint32_t i), const void *ctx) {
  const char *name = get_name(ctx, i);
  size_t mask = ix->cap - 1;
  for (size_t p = hash_name(name) & mask;; p = (p + 1) & mask) {
    uint32_t v = ix->slots[p];
    if (!v) {
      ix->slots[p] = i + 1;
      ix->count++;
      return -1;
    }
    if (!strcmp(get_name(ctx, v - 1), name)) return (int64_t)(v - 1);
  }
}

void ferry__name_index_free(struct ferry__name_index *ix) {
  if (!ix) return;
  ferry_free(ix->slots);
  ix->slots = NULL;
  ix->cap = ix->count = 0;
}
