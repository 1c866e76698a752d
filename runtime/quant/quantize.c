/* Quantization (fp32 -> packed parts) for every format. Not a hot path: it runs once per
 * tensor when a checkpoint is converted, so it favours exactness and determinism (round to
 * nearest even, padding bits zeroed, scales rounded to their stored precision before codes are
 * chosen, so dequantization reproduces exactly what was optimised here). Rows (and NF4's
 * second-level blocks) are independent, so they are split over threads (common/parallel.h):
 * the output is the same bytes whatever the number of threads. */
#include <math.h>
#include <string.h>

#include "common/error.h"
#include "common/half.h"
#include "common/parallel.h"
#include "runtime/quant/quant_impl.h"

/* Rows per thread at least: below that a thread costs more than it saves. */
#define ROWS_PER_CHUNK 16

static void put_code(uint8_t *row, int bits, int64_t j, unsigned code) {
  uint64_t pos = (uint64_t)j * (uint64_t)bits;
  unsigned v = code << (pos & 7u);
  row[pos >> 3] |= (uint8_t)v;
  if ((pos & 7u) + (unsigned)bits > 8u) row[(pos >> 3) + 1] |= (uint8_t)(v >> 8);
}

/* What a row range of a quantizer needs. */
struct qjob {
  const struct ferry_qlayout *l;
  const float *src;
  const struct ferry_qout *out;
};

static void quantize_int8(void *ctx, int64_t r0, int64_t r1) {
  const struct qjob *jb = ctx;
  const float *src = jb->src;
  const int64_t cols = jb->l->cols;
  int8_t *q = jb->out->part[FERRY_QPART_DATA];
  uint8_t *scales = jb->out->part[FERRY_QPART_SCALES];
  for (int64_t r = r0; r < r1; r++) {
    const float *x = src + r * cols;
    float amax = 0.0f;
    for (int64_t j = 0; j < cols; j++) amax = fmaxf(amax, fabsf(x[j]));
    float s = amax / 127.0f;
    ferry__store_f32(scales + 4 * r, s);
    int8_t *qr = q + r * cols;
    if (s == 0.0f) {
      memset(qr, 0, (size_t)cols);
      continue;
    }
    for (int64_t j = 0; j < cols; j++) {
      long v = lrintf(x[j] / s);
      qr[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
  }
}

/* Smallest fp16 value >= s (s >= 0), saturating at the largest finite fp16. */
static uint16_t f16_ceil(float s) {
  uint16_t h = ferry__f32_to_f16(s);
  if (h >= 0x7c00u) return 0x7bffu;
  if (ferry__f16_to_f32(h) < s) h++;
  return h >= 0x7c00u ? 0x7bffu : h;
}

/* Scale and zero point of one group for the range [lo, hi] (lo <= 0 <= hi). */
static void group_params(float lo, float hi, long qmax, uint16_t *s16, long *z) {
  *s16 = f16_ceil((hi - lo) / (float)qmax);
  float s = ferry__f16_to_f32(*s16);
  *z = 0;
  if (s > 0.0f) {
    *z = lrintf(-lo / s);
    *z = *z < 0 ? 0 : *z > qmax ? qmax : *z;
  }
}

static long code_of(float x, float s, long z, long qmax) {
  long v = lrintf(x / s) + z;
  return v < 0 ? 0 : v > qmax ? qmax : v;
}

/* Squared error of a group quantized with (s16, z). */
static double group_sse(const float *x, int64_t n, uint16_t s16, long z, long qmax) {
  float s = ferry__f16_to_f32(s16);
  double e = 0.0;
  for (int64_t j = 0; j < n; j++) {
    double d = s > 0.0f ? (double)x[j] - (double)((float)(code_of(x[j], s, z, qmax) - z) * s) : (double)x[j];
    e += d * d;
  }
  return e;
}

/* Min-max ranges waste levels on the tails of a bell-shaped group; shrinking the range by the
 * factor (of these) that minimises the group's squared error is what keeps 3- and 2-bit
 * usable. A large outlier still wins: clipping it costs more than the resolution gained. */
static const float clip_factors[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.75f, 0.7f, 0.65f,
                                     0.6f, 0.55f, 0.5f};

static void quantize_intn(void *ctx, int64_t r0, int64_t r1) {
  const struct qjob *jb = ctx;
  const struct ferry_qlayout *l = jb->l;
  const float *src = jb->src;
  const struct ferry_qout *out = jb->out;
  const int bits = ferry__quant_bits(l->spec.format);
  const long qmax = (1L << bits) - 1;
  const int64_t cols = l->cols, g = l->spec.group_size, gpr = l->groups_per_row;
  uint8_t *data = out->part[FERRY_QPART_DATA];
  uint8_t *scales = out->part[FERRY_QPART_SCALES];
  uint8_t *zeros = out->part[FERRY_QPART_ZEROS];
  for (int64_t r = r0; r < r1; r++) {
    uint8_t *row = data + (uint64_t)r * l->row_bytes;
    memset(row, 0, l->row_bytes);
    const float *x = src + r * cols;
    for (int64_t k = 0; k < gpr; k++) {
      int64_t j0 = k * g, j1 = j0 + g < cols ? j0 + g : cols;
      /* Keeping 0 inside the range makes the zero point a valid code and zero exact. */
      float lo = 0.0f, hi = 0.0f;
      for (int64_t j = j0; j < j1; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
      }
      uint16_t s16;
      long z;
      group_params(lo, hi, qmax, &s16, &z);
      double best = group_sse(x + j0, j1 - j0, s16, z, qmax);
      for (size_t t = 1; t < sizeof clip_factors / sizeof clip_factors[0] && best > 0.0; t++) {
        uint16_t cs;
        long cz;
        group_params(lo * clip_factors[t], hi * clip_factors[t], qmax, &cs, &cz);
        double e = group_sse(x + j0, j1 - j0, cs, cz, qmax);
        if (e < best) {
          best = e;
          s16 = cs;
          z = cz;
        }
      }
      float s = ferry__f16_to_f32(s16);
      if (s > 0.0f) {
        for (int64_t j = j0; j < j1; j++) put_code(row, bits, j, (unsigned)code_of(x[j], s, z, qmax));
      } else {
        z = 0;
      }
      ferry__store_u16(scales + 2 * (r * gpr + k), s16);
      zeros[r * gpr + k] = (uint8_t)z;
    }
  }
}

static float block_absmax(const struct ferry_qlayout *l, const float *src, int64_t i) {
  int64_t gpr = l->groups_per_row, g = l->spec.group_size;
  int64_t r = i / gpr, k = i % gpr;
  int64_t j0 = k * g, j1 = j0 + g < l->cols ? j0 + g : l->cols;
  const float *x = src + r * l->cols;
  float a = 0.0f;
  for (int64_t j = j0; j < j1; j++) a = fmaxf(a, fabsf(x[j]));
  return a;
}

static unsigned nf4_nearest(float y) {
  /* Midpoints between consecutive levels; a tie goes to the lower level. */
  unsigned c = 0;
  for (int k = 0; k < 15; k++)
    c += y > 0.5f * (ferry__nf4_levels[k] + ferry__nf4_levels[k + 1]);
  return c;
}

/* Index of the dynamic-map value nearest to y (a tie goes to the lower one). */
static uint8_t dynamic_nearest(float y) {
  int lo = 0, hi = 255; /* invariant: map[lo] <= y <= map[hi] once clamped */
  if (y <= ferry__dynamic_map[0]) return 0;
  if (y >= ferry__dynamic_map[255]) return 255;
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (ferry__dynamic_map[mid] <= y) lo = mid;
    else hi = mid;
  }
  return (uint8_t)(y - ferry__dynamic_map[lo] <= ferry__dynamic_map[hi] - y ? lo : hi);
}

/* Level 2 over runs [b0, b1): each run of 256 absmax values minus their mean, scaled by the
 * largest deviation and coded with the dynamic map; fp32 scale and mean per run. */
static void quantize_nf4_level2(void *ctx, int64_t b0, int64_t b1) {
  const struct qjob *jb = ctx;
  const struct ferry_qlayout *l = jb->l;
  const float *src = jb->src;
  const int64_t nblocks = l->rows * l->groups_per_row;
  uint8_t *qa = jb->out->part[FERRY_QPART_SCALES];
  uint8_t *s2p = jb->out->part[FERRY_QPART_SCALES2];
  uint8_t *m2p = jb->out->part[FERRY_QPART_OFFSETS2];
  for (int64_t b2 = b0; b2 < b1; b2++) {
    int64_t i0 = b2 * FERRY_QUANT_NF4_BLOCK2;
    int64_t i1 = i0 + FERRY_QUANT_NF4_BLOCK2 < nblocks ? i0 + FERRY_QUANT_NF4_BLOCK2 : nblocks;
    float a[FERRY_QUANT_NF4_BLOCK2];
    double sum = 0.0;
    for (int64_t i = i0; i < i1; i++) {
      a[i - i0] = block_absmax(l, src, i);
      sum += a[i - i0];
    }
    float mean = (float)(sum / (double)(i1 - i0)), dmax = 0.0f;
    for (int64_t i = i0; i < i1; i++) dmax = fmaxf(dmax, fabsf(a[i - i0] - mean));
    float s2 = dmax;
    for (int64_t i = i0; i < i1; i++) qa[i] = dynamic_nearest(s2 > 0.0f ? (a[i - i0] - mean) / s2 : 0.0f);
    ferry__store_f32(s2p + 4 * b2, s2);
    ferry__store_f32(m2p + 4 * b2, mean);
  }
}

/* Level 1 over rows [r0, r1): codes against the absmax as dequantization will see it. */
static void quantize_nf4_level1(void *ctx, int64_t r0, int64_t r1) {
  const struct qjob *jb = ctx;
  const struct ferry_qlayout *l = jb->l;
  const float *src = jb->src;
  const int64_t g = l->spec.group_size;
  const uint8_t *qa = jb->out->part[FERRY_QPART_SCALES];
  const uint8_t *s2p = jb->out->part[FERRY_QPART_SCALES2];
  const uint8_t *m2p = jb->out->part[FERRY_QPART_OFFSETS2];
  uint8_t *data = jb->out->part[FERRY_QPART_DATA];
  for (int64_t r = r0; r < r1; r++) {
    uint8_t *row = data + (uint64_t)r * l->row_bytes;
    memset(row, 0, l->row_bytes);
    const float *x = src + r * l->cols;
    for (int64_t k = 0; k < l->groups_per_row; k++) {
      int64_t i = r * l->groups_per_row + k, b2 = i / FERRY_QUANT_NF4_BLOCK2;
      float a = ferry__nf4_absmax(qa[i], ferry__load_f32(s2p + 4 * b2), ferry__load_f32(m2p + 4 * b2));
      int64_t j0 = k * g, j1 = j0 + g < l->cols ? j0 + g : l->cols;
      for (int64_t j = j0; j < j1; j++)
        put_code(row, 4, j, a > 0.0f ? nf4_nearest(x[j] / a) : 7u);
    }
  }
}

ferry_status ferry_quant_quantize(const struct ferry_qspec *spec, const float *src, int64_t rows,
                                  int64_t cols, const struct ferry_qout *out) {
  struct ferry_qlayout l;
  ferry_status st = ferry_quant_layout(spec, rows, cols, &l);
  if (st != FERRY_OK) return st;
  if (!src || !out) return ferry__fail(FERRY_ERR_INVALID, "quant: quantize: NULL source or output");
  if (ferry__quant_is_published(spec->format)) {
    char name[FERRY_QSPEC_NAME_MAX];
    return ferry__fail(FERRY_ERR_UNSUPPORTED,
                       "quant: %s is the format of published checkpoints, read as they come; ferry does not "
                       "quantize into it",
                       ferry_quant_spec_name(spec, name, sizeof name));
  }
  for (int i = 0; i < FERRY_QPART_COUNT; i++) {
    if (l.part[i].suffix && !out->part[i])
      return ferry__fail(FERRY_ERR_INVALID, "quant: quantize: output part '%s' is NULL",
                         l.part[i].suffix);
  }
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t j = 0; j < cols; j++) {
      if (!isfinite(src[r * cols + j]))
        return ferry__fail(FERRY_ERR_INVALID,
                           "quant: quantize: element [%lld, %lld] is %s; expected a finite value",
                           (long long)r, (long long)j, isnan(src[r * cols + j]) ? "NaN" : "infinite");
    }
  }
  size_t n = (size_t)rows * (size_t)cols;
  uint8_t *data = out->part[FERRY_QPART_DATA];
  struct qjob job = {&l, src, out};
  switch (spec->format) {
    case FERRY_QFORMAT_FP32:
      memcpy(data, src, n * 4);
      break;
    case FERRY_QFORMAT_FP16:
      for (size_t i = 0; i < n; i++) ferry__store_u16(data + 2 * i, ferry__f32_to_f16(src[i]));
      break;
    case FERRY_QFORMAT_BF16:
      for (size_t i = 0; i < n; i++) ferry__store_u16(data + 2 * i, ferry__f32_to_bf16(src[i]));
      break;
    case FERRY_QFORMAT_INT8:
      ferry__parallel_for(rows, ROWS_PER_CHUNK, quantize_int8, &job);
      break;
    case FERRY_QFORMAT_INT4:
    case FERRY_QFORMAT_INT3:
    case FERRY_QFORMAT_INT2:
      ferry__parallel_for(rows, ROWS_PER_CHUNK, quantize_intn, &job);
      break;
    case FERRY_QFORMAT_NF4: {
      const int64_t runs = (rows * l.groups_per_row + FERRY_QUANT_NF4_BLOCK2 - 1) / FERRY_QUANT_NF4_BLOCK2;
      ferry__parallel_for(runs, 1, quantize_nf4_level2, &job);
      ferry__parallel_for(rows, ROWS_PER_CHUNK, quantize_nf4_level1, &job);
      break;
    }
    default:
      break;
  }
  return FERRY_OK;
}
