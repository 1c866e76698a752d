/* Internals shared by the quant module's files: the NF4 level table, N-bit pack/unpack of one
 * row (the reference definition of the bit layout, also used by the tests), and unaligned
 * little-endian loads and stores, since safetensors does not align tensor data. */
#ifndef FERRY_QUANT_IMPL_H
#define FERRY_QUANT_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ferry/quant.h"

/* The 16 NF4 levels of QLoRA (bitsandbytes csrc/kernels.cu), ascending; index 7 is 0. */
extern const float ferry__nf4_levels[16];

/* Bits per code of a format (32 fp32, 16 fp16/bf16, 8 int8, 4/3/2, 4 nf4); 0 if unknown. */
int ferry__quant_bits(enum ferry_qformat format);

/* Pack n codes of `bits` bits (each < 2^bits) densely, little-endian bit order: code j takes
 * bits [j*bits, (j+1)*bits) of the row, bit b being bit b%8 of byte b/8. Writes exactly
 * ceil(n*bits/8) bytes; padding bits are 0. bits in 1..8. */
void ferry__quant_pack_row(int bits, const uint8_t *codes, int64_t n, uint8_t *out);
/* Inverse of ferry__quant_pack_row. */
void ferry__quant_unpack_row(int bits, const uint8_t *packed, int64_t n, uint8_t *codes);

/* Code j of a packed row (reads only bytes that hold its bits). */
static inline unsigned ferry__quant_code_at(const uint8_t *row, int bits, int64_t j) {
  uint64_t pos = (uint64_t)j * (uint64_t)bits;
  uint64_t byte = pos >> 3;
  unsigned shift = (unsigned)(pos & 7u);
  unsigned v = row[byte];
  if (shift + (unsigned)bits > 8u) v |= (unsigned)row[byte + 1] << 8;
  return (v >> shift) & ((1u << bits) - 1u);
}

/* The signed 8-bit dynamic map NF4's absmax values are quantized with, ascending. */
extern const float ferry__dynamic_map[256];

/* Reconstructed NF4 absmax of one block from its double-quantized form. Quantize and
 * dequantize both use this one expression, so they agree bit for bit. */
static inline float ferry__nf4_absmax(uint8_t code, float scale2, float offset2) {
  return offset2 + ferry__dynamic_map[code] * scale2;
}

/* Formats of published checkpoints (published.c): read-only, laid out as their tools store them. */
static inline int ferry__quant_is_published(enum ferry_qformat f) {
  return f >= FERRY_QFORMAT_GPTQ4 && f < FERRY_QFORMAT_COUNT;
}
/* Their parts (suffix, dtype, shape as stored, bytes) for an [rows = out, cols = in] matrix;
 * non-zero with a message in msg when the shape does not fit the format. */
int ferry__quant_published_layout(const struct ferry_qspec *spec, int64_t rows, int64_t cols,
                                  struct ferry_qlayout *out, char *msg, size_t msg_len);
/* Rows [r0, r1) of the [rows, cols] (out, in) matrix in fp32. */
void ferry__quant_published_dequant(const struct ferry_qspec *spec, const struct ferry_qview *v, int64_t rows,
                                    int64_t cols, int64_t r0, int64_t r1, float *dst);

/* Test hook: enable (1, the default) or disable the SIMD dequantization kernels. */
void ferry__quant_set_simd(int enable);

static inline float ferry__load_f32(const void *p) {
  float f;
  memcpy(&f, p, 4);
  return f;
}
static inline uint16_t ferry__load_u16(const void *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static inline void ferry__store_f32(void *p, float f) { memcpy(p, &f, 4); }
static inline void ferry__store_u16(void *p, uint16_t v) { memcpy(p, &v, 2); }

#endif
