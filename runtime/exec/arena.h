/* A sub-allocator over one reserved region (the cuda executor's device arena: one cudaMalloc
 * of the device budget per run, sliced into the engine's buffers, so nothing is allocated from
 * the driver after the executor is created). Offsets only: the caller owns the memory.
 * Best fit over a sorted, coalesced free list; every block a multiple of `align`. Not
 * thread-safe: the caller locks. */
#ifndef FERRY_EXEC_ARENA_H
#define FERRY_EXEC_ARENA_H

#include <stdint.h>

#include "ferry/status.h"

/* Free ranges kept at most; live blocks are limited to one less (frees never need more). */
#define FERRY__ARENA_MAX_RANGES 1024

struct ferry__arena_range {
  uint64_t offset, bytes;
};

struct ferry__arena {
  uint64_t size, align;
  uint64_t used, peak;   /* bytes in live blocks, padding included */
  int32_t n_live;        /* live blocks */
  int32_t n_free;        /* free ranges, sorted by offset, none adjacent */
  struct ferry__arena_range free[FERRY__ARENA_MAX_RANGES];
};

/* Bytes a request of `bytes` takes in the arena (rounded up to align; 0 takes align). 0 when
 * the rounding overflows. */
uint64_t ferry__arena_block_bytes(const struct ferry__arena *a, uint64_t bytes);

/* An empty arena of `size` bytes (rounded down to align); align a power of two. */
void ferry__arena_init(struct ferry__arena *a, uint64_t size, uint64_t align);

/* Place a block; FERRY_ERR_NOMEM when no free range holds it (or FERRY__ARENA_MAX_RANGES - 1
 * blocks are live). */
ferry_status ferry__arena_alloc(struct ferry__arena *a, uint64_t bytes, uint64_t *offset);

/* Return the block at offset allocated with `bytes` (the same request size). */
void ferry__arena_free(struct ferry__arena *a, uint64_t offset, uint64_t bytes);

/* The largest block that would fit now. */
uint64_t ferry__arena_largest_free(const struct ferry__arena *a);

#endif
