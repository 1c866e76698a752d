/* The device arena's sub-allocator: offsets inside one reserved region, best fit, freed
 * neighbours merged at once so the free list stays short and sorted. */
#include "arena.h"

#include <string.h>

uint64_t ferry__arena_block_bytes(const struct ferry__arena *a, uint64_t bytes) {
  if (!bytes) bytes = 1;
  if (bytes > UINT64_MAX - (a->align - 1)) return 0;
  return (bytes + a->align - 1) & ~(a->align - 1);
}

void ferry__arena_init(struct ferry__arena *a, uint64_t size, uint64_t align) {
  memset(a, 0, sizeof *a);
  a->align = align ? align : 1;
  a->size = size & ~(a->align - 1);
  if (a->size) a->free[a->n_free++] = (struct ferry__arena_range){0, a->size};
}

ferry_status ferry__arena_alloc(struct ferry__arena *a, uint64_t bytes, uint64_t *offset) {
  const uint64_t need = ferry__arena_block_bytes(a, bytes);
  if (!need || a->n_live >= FERRY__ARENA_MAX_RANGES - 1) return FERRY_ERR_NOMEM;
  /* best fit keeps large ranges whole for the large buffers that follow */
  int32_t best = -1;
  for (int32_t i = 0; i < a->n_free; i++)
    if (a->free[i].bytes >= need && (best < 0 || a->free[i].bytes < a->free[best].bytes)) best = i;
  if (best < 0) return FERRY_ERR_NOMEM;
  *offset = a->free[best].offset;
  a->free[best].offset += need;
  a->free[best].bytes -= need;
  if (!a->free[best].bytes) {
    memmove(&a->free[best], &a->free[best + 1], (size_t)(a->n_free - best - 1) * sizeof a->free[0]);
    a->n_free--;
  }
  a->n_live++;
  a->used += need;
  if (a->used > a->peak) a->peak = a->used;
  return FERRY_OK;
}

void ferry__arena_free(struct ferry__arena *a, uint64_t offset, uint64_t bytes) {
  const uint64_t len = ferry__arena_block_bytes(a, bytes);
  /* first free range after the block */
  int32_t i = 0;
  while (i < a->n_free && a->free[i].offset < offset) i++;
  const int joins_prev = i > 0 && a->free[i - 1].offset + a->free[i - 1].bytes == offset;
  const int joins_next = i < a->n_free && offset + len == a->free[i].offset;
  if (joins_prev && joins_next) {
    a->free[i - 1].bytes += len + a->free[i].bytes;
    memmove(&a->free[i], &a->free[i + 1], (size_t)(a->n_free - i - 1) * sizeof a->free[0]);
    a->n_free--;
  } else if (joins_prev) {
    a->free[i - 1].bytes += len;
  } else if (joins_next) {
    a->free[i].offset = offset;
    a->free[i].bytes += len;
  } else {
    /* n_free <= n_live + 1 < FERRY__ARENA_MAX_RANGES: there is room */
    memmove(&a->free[i + 1], &a->free[i], (size_t)(a->n_free - i) * sizeof a->free[0]);
    a->free[i] = (struct ferry__arena_range){offset, len};
    a->n_free++;
  }
  a->n_live--;
  a->used -= len;
}

uint64_t ferry__arena_largest_free(const struct ferry__arena *a) {
  uint64_t best = 0;
  for (int32_t i = 0; i < a->n_free; i++)
    if (a->free[i].bytes > best) best = a->free[i].bytes;
  return best;
}
