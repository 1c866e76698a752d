/* The device arena's sub-allocator (runtime/exec/arena.c; the cuda executor slices its one
 * cudaMalloc of the device budget with it): blocks never overlap, stay inside the arena and
 * aligned, freed space coalesces back into one range, best fit keeps large ranges whole, and a
 * full or fragmented arena refuses instead of overlapping. */
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "runtime/exec/arena.h"
#include "testutil.h"

static struct ferry__arena arena; /* large: not on the stack */

static void test_basic(void **state) {
  (void)state;
  struct ferry__arena *a = &arena;
  ferry__arena_init(a, 1000, 256); /* rounded down to 768 */
  assert_int_equal(a->size, 768);
  assert_int_equal(ferry__arena_largest_free(a), 768);
  uint64_t o1, o2, o3, o4;
  assert_int_equal(ferry__arena_alloc(a, 1, &o1), FERRY_OK); /* takes 256 */
  assert_int_equal(ferry__arena_alloc(a, 256, &o2), FERRY_OK);
  assert_int_equal(ferry__arena_alloc(a, 0, &o3), FERRY_OK);
  assert_int_equal(o1, 0);
  assert_int_equal(o2, 256);
  assert_int_equal(o3, 512);
  assert_int_equal(a->used, 768);
  assert_int_equal(ferry__arena_alloc(a, 1, &o4), FERRY_ERR_NOMEM);
  /* free the middle, then the ends: one range again */
  ferry__arena_free(a, o2, 256);
  assert_int_equal(ferry__arena_largest_free(a), 256);
  assert_int_equal(ferry__arena_alloc(a, 257, &o4), FERRY_ERR_NOMEM);
  ferry__arena_free(a, o1, 1);
  assert_int_equal(a->n_free, 1);
  assert_int_equal(ferry__arena_largest_free(a), 512);
  ferry__arena_free(a, o3, 0);
  assert_int_equal(a->n_free, 1);
  assert_int_equal(a->used, 0);
  assert_int_equal(a->peak, 768);
  assert_int_equal(ferry__arena_largest_free(a), 768);
  /* sizes whose rounding overflows are refused */
  assert_int_equal(ferry__arena_block_bytes(a, UINT64_MAX), 0);
  assert_int_equal(ferry__arena_alloc(a, UINT64_MAX, &o4), FERRY_ERR_NOMEM);
}

/* Best fit: a small block goes to the small hole, so the large hole still takes a large one. */
static void test_best_fit(void **state) {
  (void)state;
  struct ferry__arena *a = &arena;
  ferry__arena_init(a, 16 * 256, 256);
  uint64_t o[5];
  const uint64_t sizes[] = {4 * 256, 256, 2 * 256, 256, 8 * 256};
  for (int i = 0; i < 5; i++) assert_int_equal(ferry__arena_alloc(a, sizes[i], &o[i]), FERRY_OK);
  ferry__arena_free(a, o[0], sizes[0]); /* hole of 4 at 0 */
  ferry__arena_free(a, o[2], sizes[2]); /* hole of 2 at 5 */
  uint64_t small, big;
  assert_int_equal(ferry__arena_alloc(a, 2 * 256, &small), FERRY_OK);
  assert_int_equal(small, o[2]);
  assert_int_equal(ferry__arena_alloc(a, 4 * 256, &big), FERRY_OK);
  assert_int_equal(big, o[0]);
}

/* Random allocations and frees against a map of who owns each unit. */
static void test_random_against_map(void **state) {
  (void)state;
  struct ferry__arena *a = &arena;
  enum { UNITS = 4096, ALIGN = 64, LIVE = 300 };
  ferry__arena_init(a, (uint64_t)UNITS * ALIGN, ALIGN);
  int32_t *owner = calloc(UNITS, sizeof *owner);
  struct {
    uint64_t off, bytes;
    int live;
  } blk[LIVE];
  memset(blk, 0, sizeof blk);
  assert_non_null(owner);
  struct ferry_rng rng;
  ferry__rng_seed(&rng, 42);
  int64_t allocs = 0, refusals = 0;
  for (int iter = 0; iter < 20000; iter++) {
    const int i = (int)(ferry__rng_below(&rng, LIVE));
    if (blk[i].live) {
      const uint64_t first = blk[i].off / ALIGN, n = ferry__arena_block_bytes(a, blk[i].bytes) / ALIGN;
      for (uint64_t u = first; u < first + n; u++) {
        assert_int_equal(owner[u], i + 1);
        owner[u] = 0;
      }
      ferry__arena_free(a, blk[i].off, blk[i].bytes);
      blk[i].live = 0;
    } else {
      const uint64_t bytes = 1 + ferry__rng_below(&rng, 64 * ALIGN);
      uint64_t off = 0;
      if (ferry__arena_alloc(a, bytes, &off) != FERRY_OK) {
        /* refused only when no hole holds it */
        assert_true(ferry__arena_largest_free(a) < ferry__arena_block_bytes(a, bytes));
        refusals++;
        continue;
      }
      assert_int_equal(off % ALIGN, 0);
      assert_true(off + bytes <= a->size);
      const uint64_t first = off / ALIGN, n = ferry__arena_block_bytes(a, bytes) / ALIGN;
      for (uint64_t u = first; u < first + n; u++) {
        assert_int_equal(owner[u], 0); /* never overlaps a live block */
        owner[u] = i + 1;
      }
      blk[i].off = off;
      blk[i].bytes = bytes;
      blk[i].live = 1;
      allocs++;
    }
    /* the free list is sorted, coalesced and adds up with the live blocks */
    uint64_t free_bytes = 0;
    for (int32_t r = 0; r < a->n_free; r++) {
      free_bytes += a->free[r].bytes;
      if (r) assert_true(a->free[r - 1].offset + a->free[r - 1].bytes < a->free[r].offset);
    }
    assert_int_equal(free_bytes + a->used, a->size);
    assert_true(a->n_free <= a->n_live + 1);
  }
  assert_true(allocs > 1000 && refusals > 0);
  for (int i = 0; i < LIVE; i++)
    if (blk[i].live) ferry__arena_free(a, blk[i].off, blk[i].bytes);
  assert_int_equal(a->n_free, 1);
  assert_int_equal(a->used, 0);
  assert_int_equal(ferry__arena_largest_free(a), a->size);
  free(owner);
}

/* More live blocks than the free list could track: refused, never corrupting the list. */
static void test_live_limit(void **state) {
  (void)state;
  struct ferry__arena *a = &arena;
  ferry__arena_init(a, (uint64_t)4 * FERRY__ARENA_MAX_RANGES * 16, 16);
  uint64_t off = 0;
  int32_t n = 0;
  while (ferry__arena_alloc(a, 16, &off) == FERRY_OK) n++;
  assert_int_equal(n, FERRY__ARENA_MAX_RANGES - 1);
  /* free every other block: the most free ranges the list can hold */
  for (int32_t i = 0; i < n; i += 2) ferry__arena_free(a, (uint64_t)i * 16, 16);
  assert_true(a->n_free <= FERRY__ARENA_MAX_RANGES);
  for (int32_t i = 1; i < n; i += 2) ferry__arena_free(a, (uint64_t)i * 16, 16);
  assert_int_equal(a->n_free, 1);
  assert_int_equal(a->used, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_basic),
      cmocka_unit_test(test_best_fit),
      cmocka_unit_test(test_random_against_map),
      cmocka_unit_test(test_live_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
