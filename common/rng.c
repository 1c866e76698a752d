/* xoshiro256** (Blackman & Vigna) with splitmix64 seeding, plus the distributions ferry
 * needs for synthetic weights, arrivals and routing. Only integer and IEEE double arithmetic,
 * so results are identical wherever the math library's log/sqrt/cos are correctly rounded. */
#include <math.h>

#include "common/rng.h"

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void ferry__rng_seed(struct ferry_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

void ferry__rng_seed_stream(struct ferry_rng *r, uint64_t seed, uint64_t stream) {
  uint64_t x = stream * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL;
  ferry__rng_seed(r, seed ^ splitmix64(&x));
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ferry__rng_u64(struct ferry_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double ferry__rng_uniform(struct ferry_rng *r) {
  return (double)(ferry__rng_u64(r) >> 11) * 0x1.0p-53;
}

uint64_t ferry__rng_below(struct ferry_rng *r, uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = ferry__rng_u64(r);
  while (x >= limit);
  return x % n;
}

double ferry__rng_normal(struct ferry_rng *r) {
  double u1 = ferry__rng_uniform(r);
  double u2 = ferry__rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double ferry__rng_exponential(struct ferry_rng *r, double mean) {
  double u = ferry__rng_uniform(r);
  return -mean * log1p(-u);
}

double ferry__rng_gamma(struct ferry_rng *r, double shape, double scale) {
  if (shape < 1.0) {
    /* Boost: Gamma(k) = Gamma(k+1) * U^(1/k). */
    double u = ferry__rng_uniform(r);
    if (u < 1e-300) u = 1e-300;
    return ferry__rng_gamma(r, shape + 1.0, scale) * pow(u, 1.0 / shape);
  }
  double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
  for (;;) {
    double x = ferry__rng_normal(r), v = 1.0 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    double u = ferry__rng_uniform(r);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
    if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v * scale;
  }
}
