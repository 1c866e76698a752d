/* The KV cache's rows on the host executor: chunks of a head's elements (MLA: the latent row)
 * stored in the cache's format. A plain format is the elements in their dtype; a quantized one
 * (FERRY_KV_FORMAT_MAP: fp8, int8, int4) is each group's codes, then the chunk's fp16 scales:
 * symmetric, scale = absmax / the largest code, so a group of zeros stays exact. */
#include <math.h>
#include <string.h>

#include "common/half.h"
#include "host_kernels.h"

static float code_max(enum ferry_kv_format f) {
  switch (f) {
    case FERRY_KV_FP8: return 448.0f;
    case FERRY_KV_INT8: return 127.0f;
    default: return 7.0f; /* int4 */
  }
}

static int quantized(enum ferry_kv_format f) { return f != FERRY_KV_AUTO && ferry_kv_format_group(f) > 0; }

size_t ferry__host_kv_chunk_bytes(enum ferry_kv_format f, enum ferry_dtype dt, int64_t n) {
  return quantized(f) ? (size_t)ferry_kv_format_row_bytes(f, (uint64_t)n) : (size_t)n * ferry_dtype_size(dt);
}

void ferry__host_kv_store(enum ferry_kv_format f, enum ferry_dtype dt, void *base, size_t chunk, const float *src,
                          int64_t n) {
  if (!quantized(f)) {
    for (int64_t i = 0; i < n; i++) ferry__host_store1(dt, base, chunk * (size_t)n + (size_t)i, src[i]);
    return;
  }
  const int64_t g = ferry_kv_format_group(f), groups = (n + g - 1) / g;
  uint8_t *codes = (uint8_t *)base + chunk * ferry__host_kv_chunk_bytes(f, dt, n);
  uint8_t *scale_bytes = codes + (f == FERRY_KV_INT4 ? (n + 1) / 2 : n);
  if (f == FERRY_KV_INT4) memset(codes, 0, (size_t)(n + 1) / 2);
  for (int64_t q = 0; q < groups; q++) {
    const int64_t lo = q * g, hi = lo + g < n ? lo + g : n;
    float amax = 0.0f;
    for (int64_t i = lo; i < hi; i++) amax = fmaxf(amax, fabsf(src[i]));
    const uint16_t h = ferry__f32_to_f16(amax / code_max(f));
    const float scale = ferry__f16_to_f32(h), inv = scale > 0 ? 1.0f / scale : 0.0f;
    memcpy(scale_bytes + (size_t)q * 2, &h, 2);
    for (int64_t i = lo; i < hi; i++) {
      const float v = src[i] * inv;
      switch (f) {
        case FERRY_KV_FP8: codes[i] = ferry__f32_to_e4m3(v); break;
        case FERRY_KV_INT8: codes[i] = (uint8_t)(int8_t)fmaxf(-127.0f, fminf(127.0f, nearbyintf(v))); break;
        default: {
          const int c = (int)fmaxf(-7.0f, fminf(7.0f, nearbyintf(v))) + 8;
          codes[i / 2] |= (uint8_t)(c << (4 * (i & 1)));
          break;
        }
      }
    }
  }
}

void ferry__host_kv_load(enum ferry_kv_format f, enum ferry_dtype dt, const void *base, size_t chunk, float *dst,
                         int64_t n) {
  if (!quantized(f)) {
    const size_t es = ferry_dtype_size(dt);
    ferry__host_to_f32(dt, (const char *)base + chunk * (size_t)n * es, dst, (size_t)n);
    return;
  }
  const int64_t g = ferry_kv_format_group(f);
  const uint8_t *codes = (const uint8_t *)base + chunk * ferry__host_kv_chunk_bytes(f, dt, n);
  const uint8_t *scale_bytes = codes + (f == FERRY_KV_INT4 ? (n + 1) / 2 : n);
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, scale_bytes + (size_t)(i / g) * 2, 2);
    const float scale = ferry__f16_to_f32(h);
    float v;
    switch (f) {
      case FERRY_KV_FP8: v = ferry__e4m3_to_f32(codes[i]); break;
      case FERRY_KV_INT8: v = (float)(int8_t)codes[i]; break;
      default: v = (float)((codes[i / 2] >> (4 * (i & 1))) & 0xf) - 8.0f; break;
    }
    dst[i] = v * scale;
  }
}
