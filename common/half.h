/* IEEE binary16 and bfloat16 conversions (round to nearest even), used wherever weights are
 * written or read in 16-bit formats. */
#ifndef FERRY_COMMON_HALF_H
#define FERRY_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t ferry__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float ferry__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t ferry__f32_to_bf16(float f) {
  uint32_t u = ferry__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float ferry__bf16_to_f32(uint16_t h) { return ferry__bits_f32((uint32_t)h << 16); }

uint16_t ferry__f32_to_f16(float f);
float ferry__f16_to_f32(uint16_t h);

/* fp8 e4m3 (fn: bias 7, no infinities, 0x7f/0xff NaN): round to nearest even, saturating at
 * +-448 (the KV cache's fp8 format stores scaled values that never exceed it). */
uint8_t ferry__f32_to_e4m3(float f);
float ferry__e4m3_to_f32(uint8_t b);

/* Bulk conversions (n elements). */
void ferry__f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void ferry__bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);

#endif
