/* binary16 <-> float32 by bit manipulation: exact for every half value, round-to-nearest-even
 * on the way down, with subnormals, infinities and NaN handled. */
#include <math.h>
#include <stddef.h>

#include "common/half.h"

uint16_t ferry__f32_to_f16(float f) {
  uint32_t x = ferry__f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) /* inf or NaN */
    return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflows to inf */
  if (absx < 0x38800000u) { /* subnormal or zero in half */
    if (absx < 0x33000000u) return (uint16_t)sign;
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    int shift = 113 - (int)(absx >> 23) + 13;
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) half_mant++;
    return (uint16_t)(sign | half_mant);
  }
  uint32_t exp = ((absx >> 23) - 112) << 10;
  uint32_t mant = (absx >> 13) & 0x3ffu;
  uint32_t h = exp | mant;
  uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float ferry__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return ferry__bits_f32(sign);
    /* subnormal: normalise */
    int e = -1;
    do {
      e++;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return ferry__bits_f32(sign | ((uint32_t)(112 - e) << 23) | (mant << 13));
  }
  if (exp == 31) return ferry__bits_f32(sign | 0x7f800000u | (mant << 13));
  return ferry__bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

void ferry__f16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ferry__f16_to_f32(src[i]);
}

void ferry__bf16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = ferry__bf16_to_f32(src[i]);
}

uint8_t ferry__f32_to_e4m3(float f) {
  const uint8_t sign = signbit(f) ? 0x80 : 0;
  float a = fabsf(f);
  if (isnan(f)) return 0x7f;
  if (a >= 448.0f) return sign | 0x7e;
  if (a == 0.0f) return sign;
  int e;
  frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1): a's binary exponent is e - 1 */
  int exp = e - 1;
  if (exp < -6) { /* subnormal: multiples of 2^-9 */
    const int m = (int)nearbyintf(a * 512.0f);
    return sign | (uint8_t)m; /* m == 8 is the smallest normal, 0x08 */
  }
  int m = (int)nearbyintf((a / ldexpf(1.0f, exp) - 1.0f) * 8.0f);
  if (m == 8) m = 0, exp++;
  if (exp > 8 || (exp == 8 && m > 6)) return sign | 0x7e;
  return sign | (uint8_t)((exp + 7) << 3 | m);
}

float ferry__e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 0xf, m = b & 7;
  float v;
  if (e == 0xf && m == 7) return NAN;
  v = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9);
  return (b & 0x80) ? -v : v;
}
