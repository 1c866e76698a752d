/* Host kernels of attention: RoPE in every layout transformers uses (halves or interleaved
 * pairs, partial, scaled), attention over the KV cache with the variants of the 2024-26
 * families (windows and chunks over a ring cache, soft-capping, sinks, ALiBi, query
 * temperature), multi-head latent attention over a compressed cache, and the fused-qkv split. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cblas.h>

#include "ferry/model.h"
#include "host_kernels.h"

#define at ferry__host_at

/* Half the rotated dimensions at most: keeps the frequency table on the stack. */
#define ROPE_MAX_HALF 1024

static void rotate(float *v, int64_t half, int interleaved, const float *c, const float *sn) {
  for (int64_t i = 0; i < half; i++) {
    float *a = interleaved ? v + 2 * i : v + i, *b = interleaved ? v + 2 * i + 1 : v + i + half;
    const float x1 = *a, x2 = *b;
    *a = x1 * c[i] - x2 * sn[i];
    *b = x2 * c[i] + x1 * sn[i];
  }
}

ferry_status ferry__host_rope(const struct ferry_kernel *k, char *msg, size_t len) {
  const int64_t hd = k->head_dim, rd = k->rot_dim ? k->rot_dim : hd, off = k->rot_offset, half = rd / 2;
  if (rd % 2 || off < 0 || off + rd > hd || half > ROPE_MAX_HALF) {
    snprintf(msg, len, "%s: rotating dims %lld..%lld of heads of %lld is not possible", k->name, (long long)off,
             (long long)(off + rd), (long long)hd);
    return FERRY_ERR_INVALID;
  }
  const struct ferry_rope_params *rp = k->rope;
  /* frequencies depend on the sequence length only for dynamic NTK and LongRoPE */
  const int by_len = rp && (rp->scaling.type == FERRY_ROPE_DYNAMIC || rp->scaling.type == FERRY_ROPE_LONGROPE);
  double inv[ROPE_MAX_HALF], af = 1.0;
  float invf[ROPE_MAX_HALF], c[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
  int64_t have_len = -1;
  float *q = at(k->x);
  float *kk = k->aux[0].buf ? at(k->aux[0]) : NULL;
  for (int64_t t = 0; t < k->m; t++) {
    const int64_t len_t = by_len && k->ints2 ? k->ints2[t] : 0;
    if (have_len < 0 || (by_len && len_t != have_len)) {
      if (rp) {
        struct ferry_rope_params p = *rp;
        p.dim = rd;
        ferry_rope_inv_freq(&p, len_t, inv, &af);
      } else {
        for (int64_t i = 0; i < half; i++) inv[i] = 1.0 / pow(k->theta, (double)(2 * i) / (double)rd);
      }
      /* inv_freq as transformers keeps it (fp32), the angle in double for accuracy */
      for (int64_t i = 0; i < half; i++) invf[i] = (float)inv[i];
      have_len = len_t;
    }
    const double pos = (double)k->ints[t];
    for (int64_t i = 0; i < half; i++) {
      const double ang = pos * (double)invf[i];
      c[i] = (float)cos(ang) * (float)af;
      sn[i] = (float)sin(ang) * (float)af;
    }
    for (int64_t h = 0; h < k->heads; h++) rotate(q + (t * k->heads + h) * hd + off, half, rp && rp->interleaved, c, sn);
    if (kk)
      for (int64_t h = 0; h < k->kv_heads; h++)
        rotate(kk + (t * k->kv_heads + h) * hd + off, half, rp && rp->interleaved, c, sn);
  }
  return FERRY_OK;
}

/* ALiBi slopes of BLOOM (build_alibi_tensor): powers of 2^(-8/n) for the nearest power of two
 * heads, interleaved extra slopes for the rest. */
static double alibi_slope(int64_t heads, int64_t h) {
  int64_t p2 = 1;
  while (p2 * 2 <= heads) p2 *= 2;
  const double base = pow(2.0, -pow(2.0, -(log2((double)p2) - 3)));
  if (h < p2) return pow(base, (double)(h + 1));
  const double extra = pow(2.0, -pow(2.0, -(log2((double)(2 * p2)) - 3)));
  return pow(extra, (double)(2 * (h - p2) + 1));
}

/* The first position a query at pos sees: window and chunk. */
static int64_t first_visible(const struct ferry_kernel *k, int64_t pos) {
  int64_t first = 0;
  if (k->sliding_window > 0 && pos - k->sliding_window + 1 > first) first = pos - k->sliding_window + 1;
  if (k->attn_chunk > 0 && pos - pos % k->attn_chunk > first) first = pos - pos % k->attn_chunk;
  return first;
}

/* Where position pos of a sequence slot lives in a cache of cap rows per slot. */
static int cache_row(const struct ferry_kernel *k, int64_t pos, int64_t *row, char *msg, size_t len) {
  const int64_t cap = k->kv_capacity;
  if (pos < 0 || (!k->kv_ring && pos >= cap)) {
    snprintf(msg, len, "attention: position %lld outside the KV capacity %lld", (long long)pos, (long long)cap);
    return -1;
  }
  *row = k->kv_ring ? pos % cap : pos;
  return 0;
}

/* The row of the layer's region holding (slot, r): the slot's own rows, or a paged cache's
 * block (r is then the position). */
static size_t region_row(const struct ferry_kernel *k, int64_t slot, int64_t r) {
  if (k->kv_blocks) {
    const int64_t bs = k->kv_block_tokens;
    return (size_t)k->kv_blocks[slot * k->kv_blocks_per_seq + r / bs] * (size_t)bs + (size_t)(r % bs);
  }
  return (size_t)slot * (size_t)k->kv_capacity + (size_t)r;
}

/* softmax of scores[0..n) with an optional extra sink logit; returns 1 / sum for the caller */
static float softmax_inplace(float *scores, int64_t n, const float *sink) {
  float mx = sink ? *sink : -INFINITY, sum = 0.0f;
  for (int64_t p = 0; p < n; p++) mx = scores[p] > mx ? scores[p] : mx;
  for (int64_t p = 0; p < n; p++) {
    scores[p] = expf(scores[p] - mx);
    sum += scores[p];
  }
  if (sink) sum += expf(*sink - mx);
  return 1.0f / sum;
}

/* Each token's k and v at (slot, row) of the cache. Cache layout per layer:
 * [slot][row][kv_head][head_dim]. */
ferry_status ferry__host_kv_append(const struct ferry_kernel *k, char *msg, size_t len) {
  const int64_t KV = k->kv_heads, hd = k->head_dim;
  const float *knew = at(k->aux[0]), *vnew = at(k->aux[1]);
  void *kc = at(k->aux[2]), *vc = at(k->aux[3]);
  const enum ferry_dtype cdt = k->aux[2].dtype;
  const enum ferry_kv_format fmt = (enum ferry_kv_format)k->kv_format;
  const size_t row = (size_t)(KV * hd);
  for (int64_t t = 0; t < k->m; t++) {
    int64_t r;
    if (cache_row(k, k->ints[t], &r, msg, len) || k->ints2[t] < 0) {
      if (!msg[0]) snprintf(msg, len, "attention: negative slot %d", k->ints2[t]);
      return FERRY_ERR_RANGE;
    }
    const size_t chunk = region_row(k, k->ints2[t], r) * (size_t)KV;
    for (int64_t g = 0; g < KV; g++) {
      ferry__host_kv_store(fmt, cdt, kc, chunk + (size_t)g, knew + (size_t)t * row + (size_t)(g * hd), hd);
      ferry__host_kv_store(fmt, cdt, vc, chunk + (size_t)g, vnew + (size_t)t * row + (size_t)(g * hd), hd);
    }
  }
  return FERRY_OK;
}

/* Append each token's k and v (ferry__host_kv_append), then causal attention of each query
 * over its visible positions. */
ferry_status ferry__host_attention(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg, size_t len) {
  const int64_t H = k->heads, KV = k->kv_heads, hd = k->head_dim, cap = k->kv_capacity;
  const float *q = at(k->x);
  const void *kc = at(k->aux[2]), *vc = at(k->aux[3]);
  const enum ferry_dtype cdt = k->aux[2].dtype;
  const void *sinks = k->aux[4].buf ? at(k->aux[4]) : NULL;
  float *out = at(k->y);
  const enum ferry_kv_format fmt = (enum ferry_kv_format)k->kv_format;
  const ferry_status ast = ferry__host_kv_append(k, msg, len);
  if (ast != FERRY_OK) return ast;
  /* Per (token, kv head): expand the visible K and V rows to fp32 once, then every query head
   * of the group is two BLAS matrix-vector products and a softmax. */
  float *kf = ferry__host_scratch(s, (size_t)cap * (size_t)hd * 2 + (size_t)cap);
  if (!kf) return FERRY_ERR_NOMEM;
  float *vf = kf + (size_t)cap * (size_t)hd, *scores = vf + (size_t)cap * (size_t)hd;
  const float scale = k->scale != 0 ? k->scale : 1.0f / sqrtf((float)hd);
  const int64_t group = H / KV;
  for (int64_t t = 0; t < k->m; t++) {
    const int64_t pos = k->ints[t], slot = k->ints2[t], first = first_visible(k, pos), n = pos - first + 1;
    if (n > cap) {
      snprintf(msg, len, "attention: %lld visible positions exceed the %lld cache rows", (long long)n, (long long)cap);
      return FERRY_ERR_RANGE;
    }
    float qscale = scale;
    if (k->temp_floor > 0) /* Llama 4: longer contexts sharpen NoPE layers' queries */
      qscale *= (float)(log1p(floor(((double)pos + 1.0) / (double)k->temp_floor)) * (double)k->temp_scale + 1.0);
    for (int64_t g = 0; g < KV; g++) {
      for (int64_t p = 0; p < n; p++) {
        const int64_t r = k->kv_ring ? (first + p) % cap : first + p;
        const size_t chunk = region_row(k, slot, r) * (size_t)KV + (size_t)g;
        ferry__host_kv_load(fmt, cdt, kc, chunk, kf + p * hd, hd);
        ferry__host_kv_load(fmt, cdt, vc, chunk, vf + p * hd, hd);
      }
      for (int64_t h = g * group; h < (g + 1) * group; h++) {
        const float *qh = q + (t * H + h) * hd;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)hd, qscale, kf, (int)hd, qh, 1, 0.0f, scores, 1);
        if (k->alibi) {
          const double slope = alibi_slope(H, h);
          for (int64_t p = 0; p < n; p++) scores[p] += (float)(slope * (double)(first + p - pos));
        }
        if (k->softcap > 0)
          for (int64_t p = 0; p < n; p++) scores[p] = k->softcap * tanhf(scores[p] / k->softcap);
        float sink = sinks ? ferry__host_load1(k->aux[4].dtype, sinks, (size_t)h) : 0.0f;
        const float inv = softmax_inplace(scores, n, sinks ? &sink : NULL);
        cblas_sgemv(CblasRowMajor, CblasTrans, (int)n, (int)hd, inv, vf, (int)hd, scores, 1, 0.0f,
                    out + (t * H + h) * hd, 1);
      }
    }
  }
  return FERRY_OK;
}

/* Multi-head latent attention with the up-projections absorbed (DeepSeek's inference form):
 * q_nope . W_UK turns each query head into the latent space, it attends over the compressed
 * rows [c_kv, k_pe] directly, and W_UV turns the attended latent back into the head's values.
 * Equal to decompressing K and V, with a cache of kv_lora_rank + qk_rope_dim per token. */
ferry_status ferry__host_mla_attention(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg,
                                       size_t len) {
  const int64_t H = k->heads, nope = k->head_dim, rope = k->rot_dim, rank = k->k, vd = k->n, cap = k->kv_capacity;
  const int64_t qd = nope + rope, width = rank + rope;
  const float *q = at(k->x), *lat = at(k->aux[0]);
  void *cache = at(k->aux[2]);
  const enum ferry_dtype cdt = k->aux[2].dtype, wdt = k->w.dtype;
  const void *w = at(k->w);
  float *out = at(k->y);
  for (int64_t t = 0; t < k->m; t++) {
    int64_t r;
    if (cache_row(k, k->ints[t], &r, msg, len) || k->ints2[t] < 0) {
      if (!msg[0]) snprintf(msg, len, "mla attention: negative slot %d", k->ints2[t]);
      return FERRY_ERR_RANGE;
    }
    ferry__host_kv_store((enum ferry_kv_format)k->kv_format, cdt, cache, region_row(k, k->ints2[t], r), lat + t * width,
                         width);
  }
  const size_t wh = (size_t)((nope + vd) * rank); /* one head's rows of kv_b_proj */
  float *cf = ferry__host_scratch(s, (size_t)cap * (size_t)width + wh + (size_t)width + (size_t)cap + (size_t)rank);
  if (!cf) return FERRY_ERR_NOMEM;
  float *wf = cf + (size_t)cap * (size_t)width, *qf = wf + wh, *scores = qf + width, *olat = scores + cap;
  const float scale = k->scale != 0 ? k->scale : 1.0f / sqrtf((float)qd);
  const size_t wes = ferry_dtype_size(wdt);
  for (int64_t t = 0; t < k->m; t++) {
    const int64_t pos = k->ints[t], slot = k->ints2[t], first = first_visible(k, pos), n = pos - first + 1;
    if (n > cap) {
      snprintf(msg, len, "mla attention: %lld visible positions exceed the %lld cache rows", (long long)n, (long long)cap);
      return FERRY_ERR_RANGE;
    }
    for (int64_t p = 0; p < n; p++) {
      const int64_t r = k->kv_ring ? (first + p) % cap : first + p;
      ferry__host_kv_load((enum ferry_kv_format)k->kv_format, cdt, cache, region_row(k, slot, r), cf + p * width,
                          width);
    }
    for (int64_t h = 0; h < H; h++) {
      const float *W = wf;
      if (wdt == FERRY_DTYPE_F32)
        W = (const float *)w + (size_t)h * wh;
      else
        ferry__host_to_f32(wdt, (const char *)w + (size_t)h * wh * wes, wf, wh);
      const float *qh = q + (t * H + h) * qd;
      /* q_lat = W_UK^T q_nope; the RoPE part joins as is */
      cblas_sgemv(CblasRowMajor, CblasTrans, (int)nope, (int)rank, 1.0f, W, (int)rank, qh, 1, 0.0f, qf, 1);
      memcpy(qf + rank, qh + nope, (size_t)rope * sizeof(float));
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)width, scale, cf, (int)width, qf, 1, 0.0f, scores, 1);
      const float inv = softmax_inplace(scores, n, NULL);
      cblas_sgemv(CblasRowMajor, CblasTrans, (int)n, (int)rank, inv, cf, (int)width, scores, 1, 0.0f, olat, 1);
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)vd, (int)rank, 1.0f, W + nope * rank, (int)rank, olat, 1, 0.0f,
                  out + (t * H + h) * vd, 1);
    }
  }
  return FERRY_OK;
}

/* query_key_value output [m, heads, 3, head_dim] (GPT-NeoX and BLOOM order) into q, k, v. */
ferry_status ferry__host_split_qkv(const struct ferry_kernel *k) {
  const int64_t H = k->heads, hd = k->head_dim;
  const float *x = at(k->x);
  float *dst[3] = {at(k->y), at(k->aux[0]), at(k->aux[1])};
  for (int64_t t = 0; t < k->m; t++)
    for (int64_t h = 0; h < H; h++)
      for (int j = 0; j < 3; j++)
        memcpy(dst[j] + (t * H + h) * hd, x + ((t * H + h) * 3 + j) * hd, (size_t)hd * sizeof(float));
  return FERRY_OK;
}
