/* Dequantization (packed parts -> fp32 rows): the engine's hot path, run for every weight
 * block that reaches compute. No allocation; per-group scales and zero points are loaded once
 * per group. Portable loops are written for the auto-vectoriser; on x86-64 CPUs with AVX2 the
 * grouped and NF4 formats use explicit kernels (8 codes per variable shift, NF4 levels by
 * register permutes) and fp16 uses F16C. Both paths give bit-identical results. */
#include <string.h>

#include "common/cpu.h"
#include "common/error.h"
#include "common/half.h"
#include "runtime/quant/quant_impl.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(FERRY_QUANT_NO_SIMD)
#include <immintrin.h>
#define HAVE_X86_DISPATCH 1
#endif

static _Atomic int simd_enabled;

/* binary16 -> binary32 without branches on the common path (F. Giesen's method); exact for
 * every half including subnormals, infinities and NaN. */
static inline float h2f(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
  uint32_t exp = shifted_exp & o;
  o += (uint32_t)(127 - 15) << 23;
  if (exp == shifted_exp) {
    o += (uint32_t)(128 - 16) << 23;
  } else if (exp == 0) {
    o += 1u << 23;
    o = ferry__f32_bits(ferry__bits_f32(o) - ferry__bits_f32(113u << 23));
  }
  o |= ((uint32_t)h & 0x8000u) << 16;
  return ferry__bits_f32(o);
}

static void deq_f16_portable(const uint8_t *src, size_t n, float *dst) {
  for (size_t i = 0; i < n; i++) dst[i] = h2f(ferry__load_u16(src + 2 * i));
}

#ifdef HAVE_X86_DISPATCH
__attribute__((target("avx,f16c"))) static void deq_f16_f16c(const uint8_t *src, size_t n,
                                                               float *dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i h0 = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
    __m128i h1 = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i + 16));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h0));
    _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(h1));
  }
  for (; i < n; i++) dst[i] = h2f(ferry__load_u16(src + 2 * i));
}
#endif /* HAVE_X86_DISPATCH */

static void deq_f16(const uint8_t *src, size_t n, float *dst) {
#ifdef HAVE_X86_DISPATCH
  if (simd_enabled && ferry__cpu_avx_f16c()) {
    deq_f16_f16c(src, n, dst);
    return;
  }
#endif
  deq_f16_portable(src, n, dst);
}

static void deq_bf16(const uint8_t *src, size_t n, float *dst) {
  for (size_t i = 0; i < n; i++) dst[i] = ferry__bits_f32((uint32_t)ferry__load_u16(src + 2 * i) << 16);
}

static void deq_int8_row(const int8_t *q, float s, int64_t cols, float *dst) {
  for (int64_t j = 0; j < cols; j++) dst[j] = (float)q[j] * s;
}

/* Grouped formats: value = (code - zero) * scale. With an fp16 scale and |code - zero| < 256
 * the product is exact in fp32, so there is no rounding to disagree about. */
static void tail_intn(const uint8_t *row, int bits, int64_t j0, int64_t j1, int z, float s,
                      float *dst) {
  for (int64_t j = j0; j < j1; j++) dst[j] = (float)((int)ferry__quant_code_at(row, bits, j) - z) * s;
}

static void deq_int4_row(const uint8_t *row, const uint8_t *scales, const uint8_t *zeros,
                         int64_t cols, int64_t g, float *dst) {
  int64_t full = cols / g, k = 0;
  for (; k < full; k++) {
    const float s = h2f(ferry__load_u16(scales + 2 * k));
    const int z = zeros[k];
    const uint8_t *q = row + k * (g / 2);
    float *d = dst + k * g;
    for (int64_t i = 0; i < g / 2; i++) {
      d[2 * i] = (float)((int)(q[i] & 15u) - z) * s;
      d[2 * i + 1] = (float)((int)(q[i] >> 4) - z) * s;
    }
  }
  if (full * g < cols)
    tail_intn(row, 4, full * g, cols, zeros[k], h2f(ferry__load_u16(scales + 2 * k)), dst);
}

static void deq_int3_row(const uint8_t *row, const uint8_t *scales, const uint8_t *zeros,
                         int64_t cols, int64_t g, float *dst) {
  int64_t full = cols / g, k = 0;
  for (; k < full; k++) {
    const float s = h2f(ferry__load_u16(scales + 2 * k));
    const int z = zeros[k];
    const uint8_t *q = row + k * (g / 8) * 3;
    float *d = dst + k * g;
    for (int64_t c = 0; c < g / 8; c++) {
      const uint32_t v = (uint32_t)q[3 * c] | (uint32_t)q[3 * c + 1] << 8 | (uint32_t)q[3 * c + 2] << 16;
      float *o = d + 8 * c;
      o[0] = (float)((int)(v & 7u) - z) * s;
      o[1] = (float)((int)((v >> 3) & 7u) - z) * s;
      o[2] = (float)((int)((v >> 6) & 7u) - z) * s;
      o[3] = (float)((int)((v >> 9) & 7u) - z) * s;
      o[4] = (float)((int)((v >> 12) & 7u) - z) * s;
      o[5] = (float)((int)((v >> 15) & 7u) - z) * s;
      o[6] = (float)((int)((v >> 18) & 7u) - z) * s;
      o[7] = (float)((int)(v >> 21) - z) * s;
    }
  }
  if (full * g < cols)
    tail_intn(row, 3, full * g, cols, zeros[k], h2f(ferry__load_u16(scales + 2 * k)), dst);
}

static void deq_int2_row(const uint8_t *row, const uint8_t *scales, const uint8_t *zeros,
                         int64_t cols, int64_t g, float *dst) {
  int64_t full = cols / g, k = 0;
  for (; k < full; k++) {
    const float s = h2f(ferry__load_u16(scales + 2 * k));
    const int z = zeros[k];
    const uint8_t *q = row + k * (g / 4);
    float *d = dst + k * g;
    for (int64_t i = 0; i < g / 4; i++) {
      const unsigned v = q[i];
      d[4 * i] = (float)((int)(v & 3u) - z) * s;
      d[4 * i + 1] = (float)((int)((v >> 2) & 3u) - z) * s;
      d[4 * i + 2] = (float)((int)((v >> 4) & 3u) - z) * s;
      d[4 * i + 3] = (float)((int)(v >> 6) - z) * s;
    }
  }
  if (full * g < cols)
    tail_intn(row, 2, full * g, cols, zeros[k], h2f(ferry__load_u16(scales + 2 * k)), dst);
}

#ifdef HAVE_X86_DISPATCH
/* Lane i takes bits [i*bits, (i+1)*bits) of a 32-bit word: eight codes at once, in the
 * little-endian bit order of the packed rows. */
__attribute__((target("avx2"), always_inline)) static inline __m256i codes8(uint32_t w, int bits) {
  const __m256i sh = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits));
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh),
                          _mm256_set1_epi32((1 << bits) - 1));
}

/* `bits` bytes hold 8 codes; read exactly those bytes. */
static inline uint32_t chunk_word(const uint8_t *q, int bits) {
  if (bits == 4) {
    uint32_t w;
    memcpy(&w, q, 4);
    return w;
  }
  if (bits == 3) return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16;
  return (uint32_t)q[0] | (uint32_t)q[1] << 8;
}

__attribute__((target("avx2"), always_inline)) static inline void deq_grouped_avx2(
    const int bits, const uint8_t *row, const uint8_t *scales, const uint8_t *zeros, int64_t cols,
    int64_t g, float *dst) {
  int64_t full = cols / g, k = 0;
  for (; k < full; k++) {
    const __m256 sv = _mm256_set1_ps(h2f(ferry__load_u16(scales + 2 * k)));
    const __m256i zv = _mm256_set1_epi32(zeros[k]);
    const uint8_t *q = row + k * (g / 8) * bits;
    float *d = dst + k * g;
    for (int64_t c = 0; c < g / 8; c++, q += bits, d += 8) {
      __m256i v = _mm256_sub_epi32(codes8(chunk_word(q, bits), bits), zv);
      _mm256_storeu_ps(d, _mm256_mul_ps(_mm256_cvtepi32_ps(v), sv));
    }
  }
  if (full * g < cols)
    tail_intn(row, bits, full * g, cols, zeros[k], h2f(ferry__load_u16(scales + 2 * k)), dst);
}

__attribute__((target("avx2"))) static void deq_int4_row_avx2(const uint8_t *row, const uint8_t *scales,
                                                               const uint8_t *zeros, int64_t cols,
                                                               int64_t g, float *dst) {
  deq_grouped_avx2(4, row, scales, zeros, cols, g, dst);
}
__attribute__((target("avx2"))) static void deq_int3_row_avx2(const uint8_t *row, const uint8_t *scales,
                                                               const uint8_t *zeros, int64_t cols,
                                                               int64_t g, float *dst) {
  deq_grouped_avx2(3, row, scales, zeros, cols, g, dst);
}
__attribute__((target("avx2"))) static void deq_int2_row_avx2(const uint8_t *row, const uint8_t *scales,
                                                               const uint8_t *zeros, int64_t cols,
                                                               int64_t g, float *dst) {
  deq_grouped_avx2(2, row, scales, zeros, cols, g, dst);
}

/* NF4: the 16 scaled levels live in two registers; permute picks by the low 3 bits and bit 3
 * (moved to the sign bit) selects the register. */
__attribute__((target("avx2"))) static void deq_nf4_row_avx2(const uint8_t *row, const uint8_t *qa,
                                                              int64_t first_block, const uint8_t *s2p,
                                                              const uint8_t *m2p, int64_t cols,
                                                              int64_t g, float *dst) {
  const __m256 lv_lo = _mm256_loadu_ps(ferry__nf4_levels), lv_hi = _mm256_loadu_ps(ferry__nf4_levels + 8);
  int64_t nblk = (cols + g - 1) / g;
  for (int64_t k = 0; k < nblk; k++) {
    int64_t i = first_block + k, b2 = i / FERRY_QUANT_NF4_BLOCK2;
    const float a = ferry__nf4_absmax(qa[i], ferry__load_f32(s2p + 4 * b2), ferry__load_f32(m2p + 4 * b2));
    if ((k + 1) * g > cols) {
      for (int64_t j = k * g; j < cols; j++) dst[j] = ferry__nf4_levels[ferry__quant_code_at(row, 4, j)] * a;
      break;
    }
    const __m256 av = _mm256_set1_ps(a);
    const __m256 lo = _mm256_mul_ps(lv_lo, av), hi = _mm256_mul_ps(lv_hi, av);
    const uint8_t *q = row + k * (g / 2);
    float *d = dst + k * g;
    for (int64_t c = 0; c < g / 8; c++, q += 4, d += 8) {
      __m256i idx = codes8(chunk_word(q, 4), 4);
      __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
      _mm256_storeu_ps(d, _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx),
                                           _mm256_permutevar8x32_ps(hi, idx), sel));
    }
  }
}
#endif /* HAVE_X86_DISPATCH */

/* Test hook: 0 forces the portable kernels so both paths can be checked on one machine. */
static _Atomic int simd_enabled = 1;
void ferry__quant_set_simd(int enable) { simd_enabled = enable; }

#ifdef HAVE_X86_DISPATCH
static int use_avx2(void) { return simd_enabled && __builtin_cpu_supports("avx2"); }
#endif /* HAVE_X86_DISPATCH */

static void deq_nf4_row(const uint8_t *row, const uint8_t *qa, int64_t first_block,
                        const uint8_t *s2p, const uint8_t *m2p, int64_t cols, int64_t g, float *dst) {
  int64_t nblk = (cols + g - 1) / g;
  for (int64_t k = 0; k < nblk; k++) {
    int64_t i = first_block + k, b2 = i / FERRY_QUANT_NF4_BLOCK2;
    const float a = ferry__nf4_absmax(qa[i], ferry__load_f32(s2p + 4 * b2), ferry__load_f32(m2p + 4 * b2));
    float lut[16];
    for (int c = 0; c < 16; c++) lut[c] = ferry__nf4_levels[c] * a;
    float *d = dst + k * g;
    if ((k + 1) * g <= cols) {
      const uint8_t *q = row + k * (g / 2);
      for (int64_t b = 0; b < g / 2; b++) {
        d[2 * b] = lut[q[b] & 15u];
        d[2 * b + 1] = lut[q[b] >> 4];
      }
    } else {
      for (int64_t j = k * g; j < cols; j++) dst[j] = lut[ferry__quant_code_at(row, 4, j)];
    }
  }
}

ferry_status ferry_quant_dequantize_rows(const struct ferry_qspec *spec,
                                         const struct ferry_qview *packed, int64_t rows,
                                         int64_t cols, int64_t row_begin, int64_t row_end,
                                         float *dst) {
  ferry_status st = ferry_quant_spec_check(spec);
  if (st != FERRY_OK) return st;
  if (!packed || !dst) return ferry__fail(FERRY_ERR_INVALID, "quant: dequantize: NULL packed view or destination");
  if (rows < 1 || cols < 1 || row_begin < 0 || row_begin > row_end || row_end > rows)
    return ferry__fail(FERRY_ERR_INVALID,
                       "quant: dequantize: rows [%lld, %lld) of a [%lld, %lld] matrix; expected "
                       "0 <= begin <= end <= rows",
                       (long long)row_begin, (long long)row_end, (long long)rows, (long long)cols);
  const int bits = ferry__quant_bits(spec->format);
  const uint64_t row_bytes = ((uint64_t)cols * (uint64_t)bits + 7) / 8;
  const int64_t g = spec->group_size, gpr = g ? (cols + g - 1) / g : 0;
  const uint8_t *data = packed->part[FERRY_QPART_DATA];
  const uint8_t *scales = packed->part[FERRY_QPART_SCALES];
  const uint8_t *zeros = packed->part[FERRY_QPART_ZEROS];
  const uint8_t *s2p = packed->part[FERRY_QPART_SCALES2];
  const uint8_t *m2p = packed->part[FERRY_QPART_OFFSETS2];
  int need_scales = spec->format >= FERRY_QFORMAT_INT8;
  int need_zeros = (spec->format >= FERRY_QFORMAT_INT4 && spec->format <= FERRY_QFORMAT_INT2) ||
                   spec->format == FERRY_QFORMAT_GPTQ4 || spec->format == FERRY_QFORMAT_AWQ4;
  int need_l2 = spec->format == FERRY_QFORMAT_NF4;
  if (!data || (need_scales && !scales) || (need_zeros && !zeros) || (need_l2 && (!s2p || !m2p)) ||
      (spec->format == FERRY_QFORMAT_GPTQ4 && !s2p))
    return ferry__fail(FERRY_ERR_INVALID, "quant: dequantize: a part the format needs is NULL");
  if (row_begin == row_end) return FERRY_OK;
  if (ferry__quant_is_published(spec->format)) {
    struct ferry_qlayout l;
    if ((st = ferry_quant_layout(spec, rows, cols, &l)) != FERRY_OK) return st;
    ferry__quant_published_dequant(spec, packed, rows, cols, row_begin, row_end, dst);
    return FERRY_OK;
  }

  const uint8_t *first = data + (uint64_t)row_begin * row_bytes;
  const size_t n = (size_t)(row_end - row_begin) * (size_t)cols;
  switch (spec->format) {
    case FERRY_QFORMAT_FP32:
      memcpy(dst, first, n * 4);
      return FERRY_OK;
    case FERRY_QFORMAT_FP16:
      deq_f16(first, n, dst);
      return FERRY_OK;
    case FERRY_QFORMAT_BF16:
      deq_bf16(first, n, dst);
      return FERRY_OK;
    default:
      break;
  }
  typedef void (*grouped_fn)(const uint8_t *, const uint8_t *, const uint8_t *, int64_t, int64_t, float *);
  typedef void (*nf4_fn)(const uint8_t *, const uint8_t *, int64_t, const uint8_t *, const uint8_t *,
                         int64_t, int64_t, float *);
  grouped_fn int4 = deq_int4_row, int3 = deq_int3_row, int2 = deq_int2_row;
  nf4_fn nf4 = deq_nf4_row;
#ifdef HAVE_X86_DISPATCH
  if (use_avx2()) {
    int4 = deq_int4_row_avx2;
    int3 = deq_int3_row_avx2;
    int2 = deq_int2_row_avx2;
    nf4 = deq_nf4_row_avx2;
  }
#endif
  for (int64_t r = row_begin; r < row_end; r++) {
    const uint8_t *row = data + (uint64_t)r * row_bytes;
    float *d = dst + (size_t)(r - row_begin) * (size_t)cols;
    switch (spec->format) {
      case FERRY_QFORMAT_INT8:
        deq_int8_row((const int8_t *)row, ferry__load_f32(scales + 4 * r), cols, d);
        break;
      case FERRY_QFORMAT_INT4:
        int4(row, scales + 2 * r * gpr, zeros + r * gpr, cols, g, d);
        break;
      case FERRY_QFORMAT_INT3:
        int3(row, scales + 2 * r * gpr, zeros + r * gpr, cols, g, d);
        break;
      case FERRY_QFORMAT_INT2:
        int2(row, scales + 2 * r * gpr, zeros + r * gpr, cols, g, d);
        break;
      case FERRY_QFORMAT_NF4:
        nf4(row, scales, r * gpr, s2p, m2p, cols, g, d);
        break;
      default:
        break;
    }
  }
  return FERRY_OK;
}
