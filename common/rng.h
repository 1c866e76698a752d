/* Seeded random streams with explicit state (xoshiro256** seeded through splitmix64): the
 * same seed gives the same numbers on every platform, which makes runs reproducible. */
#ifndef FERRY_COMMON_RNG_H
#define FERRY_COMMON_RNG_H

#include <stdint.h>

struct ferry_rng {
  uint64_t s[4];
};

void ferry__rng_seed(struct ferry_rng *r, uint64_t seed);
/* Derive an independent stream: seed mixed with a stream id (e.g. a layer or request). */
void ferry__rng_seed_stream(struct ferry_rng *r, uint64_t seed, uint64_t stream);
uint64_t ferry__rng_u64(struct ferry_rng *r);
/* Uniform in [0, 1), 53 random bits. */
double ferry__rng_uniform(struct ferry_rng *r);
/* Uniform integer in [0, n) without modulo bias; n > 0. */
uint64_t ferry__rng_below(struct ferry_rng *r, uint64_t n);
/* Standard normal (Box-Muller, both values used in turn is avoided for simplicity of state). */
double ferry__rng_normal(struct ferry_rng *r);
/* Exponential with the given mean. */
double ferry__rng_exponential(struct ferry_rng *r, double mean);
/* Gamma(shape k, scale theta), Marsaglia-Tsang. */
double ferry__rng_gamma(struct ferry_rng *r, double shape, double scale);

#endif
