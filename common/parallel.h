/* Data parallelism for the one-off heavy loops (quantizing a checkpoint): a range split into
 * contiguous chunks over short-lived threads. Results must not depend on the split; every
 * caller computes each index the same way whichever thread runs it. */
#ifndef FERRY_COMMON_PARALLEL_H
#define FERRY_COMMON_PARALLEL_H

#include <stdint.h>

/* Threads a parallel loop may use: FERRY_THREADS when set to a positive number, else the
 * online CPUs (at least 1). */
int ferry__parallel_threads(void);

/* Run fn(ctx, begin, end) over [0, n) in contiguous chunks of at least min_chunk indices, on
 * up to ferry__parallel_threads() threads including the caller. Serial when n is small or a
 * thread cannot be started (the work is then done by the caller: never skipped). */
void ferry__parallel_for(int64_t n, int64_t min_chunk, void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx);

#endif
