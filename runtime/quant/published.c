/* The quantized formats checkpoints are published in, read exactly as their tools store them:
 * GPTQ (AutoGPTQ/transformers "gptq" format: zeros stored minus one, act-order through g_idx),
 * AWQ GEMM (AutoAWQ's interleaved nibble order), compressed-tensors pack-quantized symmetric
 * int4, MXFP4 as gpt-oss ships it, and DeepSeek-V3's fp8 with 128 x 128 block scales. Each
 * becomes fp32 rows of the [out, in] weight a Linear layer multiplies by. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/half.h"
#include "runtime/quant/quant_impl.h"

static void part(struct ferry_qpart_desc *p, const char *suffix, enum ferry_dtype dt, int32_t ndim, int64_t d0,
                 int64_t d1, int64_t d2) {
  p->suffix = suffix;
  p->dtype = dt;
  p->ndim = ndim;
  p->shape[0] = d0;
  p->shape[1] = ndim > 1 ? d1 : 0;
  p->shape[2] = ndim > 2 ? d2 : 0;
  uint64_t n = (uint64_t)d0 * (uint64_t)(ndim > 1 ? d1 : 1) * (uint64_t)(ndim > 2 ? d2 : 1);
  p->bytes = n * ferry_dtype_size(dt);
}

int ferry__quant_published_layout(const struct ferry_qspec *spec, int64_t rows, int64_t cols,
                                  struct ferry_qlayout *out, char *msg, size_t msg_len) {
  const int64_t n = rows, k = cols, g = spec->group_size;
  struct ferry_qpart_desc *p = out->part;
  switch (spec->format) {
    case FERRY_QFORMAT_GPTQ4:
    case FERRY_QFORMAT_AWQ4:
      if (k % 8 || n % 8 || k % g) {
        snprintf(msg, msg_len, "%s needs in (%lld) and out (%lld) multiples of 8 and in a multiple of the group %lld",
                 spec->format == FERRY_QFORMAT_GPTQ4 ? "gptq4" : "awq4", (long long)k, (long long)n, (long long)g);
        return 1;
      }
      if (spec->format == FERRY_QFORMAT_GPTQ4) {
        part(&p[FERRY_QPART_DATA], "qweight", FERRY_DTYPE_I32, 2, k / 8, n, 0);
        part(&p[FERRY_QPART_SCALES2], "g_idx", FERRY_DTYPE_I32, 1, k, 0, 0);
      } else {
        part(&p[FERRY_QPART_DATA], "qweight", FERRY_DTYPE_I32, 2, k, n / 8, 0);
      }
      part(&p[FERRY_QPART_ZEROS], "qzeros", FERRY_DTYPE_I32, 2, k / g, n / 8, 0);
      part(&p[FERRY_QPART_SCALES], "scales", FERRY_DTYPE_F16, 2, k / g, n, 0);
      out->groups_per_row = k / g;
      break;
    case FERRY_QFORMAT_CT4:
    case FERRY_QFORMAT_CT4F16:
      if (k % 8 || k % g) {
        snprintf(msg, msg_len, "ct4 needs in (%lld) a multiple of 8 and of the group %lld", (long long)k, (long long)g);
        return 1;
      }
      part(&p[FERRY_QPART_DATA], "weight_packed", FERRY_DTYPE_I32, 2, n, k / 8, 0);
      part(&p[FERRY_QPART_SCALES], "weight_scale", spec->format == FERRY_QFORMAT_CT4 ? FERRY_DTYPE_BF16 : FERRY_DTYPE_F16,
           2, n, k / g, 0);
      part(&p[FERRY_QPART_OFFSETS2], "weight_shape", FERRY_DTYPE_I64, 1, 2, 0, 0);
      out->groups_per_row = k / g;
      break;
    case FERRY_QFORMAT_MXFP4:
      if (k % 32) {
        snprintf(msg, msg_len, "mxfp4 needs in (%lld) a multiple of 32", (long long)k);
        return 1;
      }
      part(&p[FERRY_QPART_DATA], "blocks", FERRY_DTYPE_U8, 3, n, k / 32, 16);
      part(&p[FERRY_QPART_SCALES], "scales", FERRY_DTYPE_U8, 2, n, k / 32, 0);
      out->groups_per_row = k / 32;
      break;
    case FERRY_QFORMAT_FP8B:
      part(&p[FERRY_QPART_DATA], "weight", FERRY_DTYPE_F8_E4M3, 2, n, k, 0);
      part(&p[FERRY_QPART_SCALES], "weight_scale_inv", FERRY_DTYPE_F32, 2, (n + 127) / 128, (k + 127) / 128, 0);
      out->groups_per_row = (k + 127) / 128;
      break;
    default:
      snprintf(msg, msg_len, "format %d is not a published format", (int)spec->format);
      return 1;
  }
  out->row_bytes = p[FERRY_QPART_DATA].bytes / (uint64_t)(spec->format == FERRY_QFORMAT_GPTQ4 || spec->format == FERRY_QFORMAT_AWQ4 ? k : n);
  return 0;
}

static inline uint32_t load_u32(const uint8_t *base, uint64_t i) {
  uint32_t v;
  memcpy(&v, base + 4 * i, 4);
  return v;
}

static inline float f16_at(const uint8_t *base, uint64_t i) { return ferry__f16_to_f32(ferry__load_u16(base + 2 * i)); }
static inline float bf16_at(const uint8_t *base, uint64_t i) { return ferry__bf16_to_f32(ferry__load_u16(base + 2 * i)); }

/* e4m3 (fn): bias 7, no infinities, S.1111.111 is NaN. */
static float fp8_e4m3(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7)
    v = NAN;
  else if (e == 0)
    v = ldexpf((float)m / 8.0f, -6);
  else
    v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
  return s ? -v : v;
}

/* AutoAWQ packs output columns 0,2,4,6,1,3,5,7 of each eight into nibbles 0..7. */
static const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* e2m1 values of the 16 MXFP4 codes (OCP Microscaling spec; transformers' FP4_VALUES). */
static const float fp4[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void ferry__quant_published_dequant(const struct ferry_qspec *spec, const struct ferry_qview *v, int64_t rows,
                                    int64_t cols, int64_t r0, int64_t r1, float *dst) {
  const uint8_t *data = v->part[FERRY_QPART_DATA], *scales = v->part[FERRY_QPART_SCALES];
  const uint8_t *zeros = v->part[FERRY_QPART_ZEROS], *gidx = v->part[FERRY_QPART_SCALES2];
  const int64_t n = rows, k = cols, g = spec->group_size;
  for (int64_t r = r0; r < r1; r++) {
    float *d = dst + (size_t)(r - r0) * (size_t)k;
    switch (spec->format) {
      case FERRY_QFORMAT_GPTQ4:
        /* stored [in, out]: output row r is column r of the packed matrix */
        for (int64_t i = 0; i < k; i++) {
          const unsigned q = (load_u32(data, (uint64_t)(i / 8) * (uint64_t)n + (uint64_t)r) >> (4 * (i % 8))) & 15u;
          int32_t grp;
          memcpy(&grp, gidx + 4 * i, 4);
          const unsigned z = (load_u32(zeros, (uint64_t)grp * (uint64_t)(n / 8) + (uint64_t)(r / 8)) >> (4 * (r % 8))) & 15u;
          d[i] = f16_at(scales, (uint64_t)grp * (uint64_t)n + (uint64_t)r) * ((float)q - (float)(z + 1));
        }
        break;
      case FERRY_QFORMAT_AWQ4: {
        const int shift = 4 * awq_nibble[r % 8];
        for (int64_t i = 0; i < k; i++) {
          const int64_t grp = i / g;
          const unsigned q = (load_u32(data, (uint64_t)i * (uint64_t)(n / 8) + (uint64_t)(r / 8)) >> shift) & 15u;
          const unsigned z = (load_u32(zeros, (uint64_t)grp * (uint64_t)(n / 8) + (uint64_t)(r / 8)) >> shift) & 15u;
          d[i] = ((float)q - (float)z) * f16_at(scales, (uint64_t)grp * (uint64_t)n + (uint64_t)r);
        }
        break;
      }
      case FERRY_QFORMAT_CT4:
      case FERRY_QFORMAT_CT4F16:
        for (int64_t i = 0; i < k; i++) {
          const unsigned q = (load_u32(data, (uint64_t)r * (uint64_t)(k / 8) + (uint64_t)(i / 8)) >> (4 * (i % 8))) & 15u;
          const uint64_t si = (uint64_t)r * (uint64_t)(k / g) + (uint64_t)(i / g);
          const float s = spec->format == FERRY_QFORMAT_CT4 ? bf16_at(scales, si) : f16_at(scales, si);
          d[i] = ((float)q - 8.0f) * s;
        }
        break;
      case FERRY_QFORMAT_MXFP4:
        for (int64_t b = 0; b < k / 32; b++) {
          const float s = ldexpf(1.0f, (int)scales[(uint64_t)r * (uint64_t)(k / 32) + (uint64_t)b] - 127);
          const uint8_t *blk = data + ((uint64_t)r * (uint64_t)(k / 32) + (uint64_t)b) * 16;
          for (int j = 0; j < 16; j++) {
            d[b * 32 + 2 * j] = fp4[blk[j] & 15u] * s;
            d[b * 32 + 2 * j + 1] = fp4[blk[j] >> 4] * s;
          }
        }
        break;
      case FERRY_QFORMAT_FP8B: {
        const int64_t bc = (k + 127) / 128;
        for (int64_t i = 0; i < k; i++)
          d[i] = fp8_e4m3(data[(uint64_t)r * (uint64_t)k + (uint64_t)i]) *
                 ferry__load_f32(scales + 4 * ((uint64_t)(r / 128) * (uint64_t)bc + (uint64_t)(i / 128)));
        break;
      }
      default:
        break;
    }
  }
}
