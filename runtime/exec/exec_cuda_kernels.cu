/* The `cuda` executor's own kernels: everything but the matrix products (cuBLAS, in
 * exec_cuda.c). Each mirrors its host twin in host_kernels.c line for line, written for
 * readability: one block per row or per (token, head), grid-stride loops for elementwise work,
 * fp32 arithmetic throughout. Only reductions sum in a different order than on the host. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "exec_cuda.h"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(int dt, const void *base, size_t i) {
  switch (dt) {
    case FERRY_CU_F16:
      return __half2float(static_cast<const __half *>(base)[i]);
    case FERRY_CU_BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
    default:
      return static_cast<const float *>(base)[i];
  }
}

__device__ __forceinline__ void store(int dt, void *base, size_t i, float v) {
  switch (dt) {
    case FERRY_CU_F16:
      static_cast<__half *>(base)[i] = __float2half_rn(v);
      break;
    case FERRY_CU_BF16:
      static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<float *>(base)[i] = v;
      break;
  }
}

/* Sum (or max) of one value per thread over the block; every thread gets the result. blockDim
 * must be a multiple of 32; `sh` holds 32 floats. The leading barrier lets callers reuse `sh`. */
__device__ float block_sum(float v, float *sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.0f;
  for (unsigned w = 0; w < blockDim.x / 32; w++) r += sh[w];
  return r;
}

__device__ float block_max(float v, float *sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = -INFINITY;
  for (unsigned w = 0; w < blockDim.x / 32; w++) r = fmaxf(r, sh[w]);
  return r;
}

/* Blocks for a grid-stride loop over n elements. */
unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 65536) b = 65536;
  return static_cast<unsigned>(b);
}

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);            \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void embed_kernel(float *y, const void *table, int tdt, const int32_t *ids, const void *pos_table, int pdt,
                             const int32_t *pos, int64_t pos_offset, int64_t n) {
  const int64_t t = blockIdx.x;
  const size_t row = static_cast<size_t>(ids[t]) * static_cast<size_t>(n);
  float *yr = y + t * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = load(tdt, table, row + static_cast<size_t>(i));
    if (pos_table) v += load(pdt, pos_table, static_cast<size_t>(pos[t] + pos_offset) * static_cast<size_t>(n) + i);
    yr[i] = v;
  }
}

/* HF LlamaRMSNorm: w * (x * rsqrt(mean(x^2) + eps)); LayerNorm: (x - mean) * rstd * w + b. */
__global__ void norm_kernel(const float *x, float *y, const void *w, int wdt, const void *b, int bdt, int64_t n,
                            float eps, int kind) {
  __shared__ float sh[32];
  const float *xr = x + static_cast<int64_t>(blockIdx.x) * n;
  float *yr = y + static_cast<int64_t>(blockIdx.x) * n;
  if (kind == 0) {
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = load(wdt, w, i) * (xr[i] * inv);
  } else {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, sh) / static_cast<float>(n);
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    const float var = block_sum(v, sh) / static_cast<float>(n);
    const float inv = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float o = (xr[i] - mean) * inv * load(wdt, w, i);
      yr[i] = b ? o + load(bdt, b, i) : o;
    }
  }
}

/* Blocks (token, slice of the token's (head, i) pairs), a thread a pair. inv_freq in fp32 as HF
 * computes it, the angle in double, as on the host. Each pair costs a double-precision pow, cos
 * and sin, so one block per token left a decode step's few tokens a chain of them per thread
 * (31 us a call for 2 tokens on an H200, the GPU check of 2026-12-04). */
__global__ void rope_kernel(float *q, float *k, const int32_t *pos, int64_t heads, int64_t kv_heads, int64_t hd,
                            double theta) {
  const int64_t t = blockIdx.x, half = hd / 2;
  const int64_t all_heads = heads + (k ? kv_heads : 0);
  const double p = static_cast<double>(pos[t]);
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < all_heads * half;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    const int64_t h = j / half, i = j % half;
    const float inv_freq = static_cast<float>(1.0 / pow(theta, static_cast<double>(2 * i) / static_cast<double>(hd)));
    const double ang = p * static_cast<double>(inv_freq);
    const float c = static_cast<float>(cos(ang)), sn = static_cast<float>(sin(ang));
    float *v = h < heads ? q + (t * heads + h) * hd : k + (t * kv_heads + (h - heads)) * hd;
    const float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * c - x2 * sn;
    v[i + half] = x2 * c + x1 * sn;
  }
}

/* Blocks (token, slice of its row), as rope_kernel's */
__global__ void kv_append_kernel(const float *knew, const float *vnew, void *kc, void *vc, int cdt, const int32_t *pos,
                                 const int32_t *slot, int64_t row, int64_t cap) {
  const int64_t t = blockIdx.x;
  const size_t base = (static_cast<size_t>(slot[t]) * static_cast<size_t>(cap) + static_cast<size_t>(pos[t])) *
                      static_cast<size_t>(row);
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < row;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    store(cdt, kc, base + i, knew[t * row + i]);
    store(cdt, vc, base + i, vnew[t * row + i]);
  }
}

/* One block per (token, head). Keys are scored a tile at a time into shared memory with a running
 * max and sum (online softmax), so any context length works with fixed shared memory.
 *
 * The work is spread for memory-level parallelism, since a decode step reads each cached row once
 * and waits on memory: measured on an H200 (2026-12-04), one thread per key row (a row read
 * element by element) ran a decode step's attention at 1/45 of its roofline, and one warp per
 * row (a load, then a shuffle reduction, per row) slower still. Here 8 lanes share a key row, so
 * a warp scores 4 rows and the block 4 * warps rows at once, each lane with hd / 8 independent
 * loads; and the weighted sum of values splits the rows among `groups` copies of the head's
 * dimensions (blockDim / hd_pad threads each), whose partial sums are added at the end. On the
 * H200 this cut a resident run's attention time by 19-38 % against one thread per row, but a
 * decode call over 517 cached rows still took ~89 us (roofline: ~2 us) with a block per (token,
 * head): 128 blocks for 4 tokens of 32 heads. So with few blocks a context is split over more
 * (grid z, flash-decoding): each split writes its max, sum and unnormalised values, and
 * attention_combine_kernel weighs them; on the H200 a decode call fell to ~30 us + 2.5 us. */
constexpr int kAttnLanesPerRow = 8;
/* Splitting a context over blocks (flash-decoding): rows a split takes at least, blocks a launch
 * aims at (an H200 has 132 SMs), and splits at most. */
constexpr int64_t kAttnSplitRows = 128;
constexpr int64_t kAttnBlocks = 1024;
constexpr int64_t kAttnMaxSplits = 32;

__global__ void attention_kernel(const float *q, float *out, float *part, const void *kc, const void *vc, int cdt,
                                 const int32_t *pos_a, const int32_t *slot_a, int64_t heads, int64_t kv_heads, int64_t hd,
                                 int64_t hd_pad, int64_t cap, int64_t window, int64_t chunk, float scale) {
  extern __shared__ float smem[];
  __shared__ float red[32];
  float *qs = smem;
  float *sc = smem + hd;
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t pos = pos_a[t], slot = slot_a[t];
  const int64_t kvh = h / (heads / kv_heads);
  int64_t first = 0;
  if (window > 0 && pos - window + 1 > 0) first = pos - window + 1;
  /* split z of gridDim.z takes `chunk` rows from first (none past pos: its partial is empty) */
  const int64_t lo = first + static_cast<int64_t>(blockIdx.z) * chunk;
  const int64_t hi = lo + chunk - 1 < pos ? lo + chunk - 1 : pos;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[(t * heads + h) * hd + i];
  __syncthreads();

  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned sub = lane % kAttnLanesPerRow, row_in_warp = lane / kAttnLanesPerRow;
  const unsigned rows_per_pass = warps * (32 / kAttnLanesPerRow);
  const int64_t groups = blockDim.x / hd_pad, group = threadIdx.x / hd_pad, d = threadIdx.x % hd_pad;
  const bool sums = group < groups && d < hd; /* this thread adds values for dimension d */
  float m_run = -INFINITY, l_run = 0.0f, acc = 0.0f;
  for (int64_t p0 = lo; p0 <= hi; p0 += FERRY_CU_ATTN_TILE) {
    const int64_t cnt = hi - p0 + 1 < FERRY_CU_ATTN_TILE ? hi - p0 + 1 : FERRY_CU_ATTN_TILE;
    /* the pass bound is the same for the whole warp: every lane reaches the shuffles */
    for (int64_t base = static_cast<int64_t>(warp) * (32 / kAttnLanesPerRow); base < cnt; base += rows_per_pass) {
      const int64_t j = base + row_in_warp;
      float dot = 0.0f;
      if (j < cnt) {
        const size_t off = ((static_cast<size_t>(slot) * cap + static_cast<size_t>(p0 + j)) * kv_heads + kvh) * hd;
#pragma unroll 4
        for (int64_t i = sub; i < hd; i += kAttnLanesPerRow) dot += qs[i] * load(cdt, kc, off + i);
      }
      for (int o = kAttnLanesPerRow / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (j < cnt && sub == 0) sc[j] = dot * scale;
    }
    __syncthreads();
    float lmax = -INFINITY;
    for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) lmax = fmaxf(lmax, sc[j]);
    const float new_max = fmaxf(m_run, block_max(lmax, red));
    const float corr = expf(m_run - new_max); /* 0 on the first tile */
    float lsum = 0.0f;
    for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) {
      const float e = expf(sc[j] - new_max);
      sc[j] = e;
      lsum += e;
    }
    l_run = l_run * corr + block_sum(lsum, red);
    if (sums) {
      float a = acc * corr;
#pragma unroll 8
      for (int64_t j = group; j < cnt; j += groups) {
        const size_t off = ((static_cast<size_t>(slot) * cap + static_cast<size_t>(p0 + j)) * kv_heads + kvh) * hd;
        a += sc[j] * load(cdt, vc, off + d);
      }
      acc = a;
    }
    m_run = new_max;
    __syncthreads(); /* the next tile (or the groups' sum) overwrites sc */
  }
  /* groups * hd <= blockDim <= FERRY_CU_ATTN_TILE: the partial sums fit where the scores were */
  if (sums) sc[group * hd + d] = acc;
  __syncthreads();
  if (sums && group == 0) {
    float total = 0.0f;
    for (int64_t g = 0; g < groups; g++) total += sc[g * hd + d];
    if (gridDim.z == 1) {
      out[(t * heads + h) * hd + d] = total / l_run;
    } else { /* (max, sum, unnormalised values) of this split, for attention_combine_kernel */
      float *pp = part + ((t * heads + h) * static_cast<int64_t>(gridDim.z) + blockIdx.z) * (hd + 2);
      if (d == 0) {
        pp[0] = m_run;
        pp[1] = l_run;
      }
      pp[2 + d] = total;
    }
  }
}

/* One block per (token, head), a thread per dimension: the splits' partials weighted by
 * exp(split max - overall max), as flash-decoding combines them. Split 0 always holds rows. */
__global__ void attention_combine_kernel(const float *part, float *out, int64_t heads, int64_t hd, int splits) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const float *pp = part + (t * heads + h) * splits * (hd + 2);
  float mx = -INFINITY;
  for (int s = 0; s < splits; s++) mx = fmaxf(mx, pp[s * (hd + 2)]);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float l = 0.0f, a = 0.0f;
    for (int s = 0; s < splits; s++) {
      const float *ps = pp + s * (hd + 2);
      if (ps[1] == 0.0f) continue; /* an empty split (max -inf) */
      const float w = expf(ps[0] - mx);
      l += ps[1] * w;
      a += ps[2 + d] * w;
    }
    out[(t * heads + h) * hd + d] = a / l;
  }
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void silu_mul_kernel(const float *a, const float *b, float *y, int64_t n) {
  GRID_STRIDE(i, n) { y[i] = silu(a[i]) * b[i]; }
}

__global__ void gelu_kernel(float *a, int64_t n) {
  GRID_STRIDE(i, n) { a[i] = 0.5f * a[i] * (1.0f + erff(a[i] * 0.70710678118654752f)); }
}

__global__ void relu_kernel(float *a, int64_t n) {
  GRID_STRIDE(i, n) { a[i] = a[i] > 0.0f ? a[i] : 0.0f; }
}

/* One single-thread block per token: the host's loops verbatim (sequential sums, so the
 * probabilities and the tie-breaking match the host's). */
__global__ void router_kernel(const float *logits, float *wout, int32_t *ids, int64_t E, int64_t K, int renormalize) {
  extern __shared__ float p[];
  const int64_t t = blockIdx.x;
  const float *l = logits + t * E;
  float mx = -INFINITY, sum = 0.0f;
  for (int64_t e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
  for (int64_t e = 0; e < E; e++) {
    p[e] = expf(l[e] - mx);
    sum += p[e];
  }
  for (int64_t e = 0; e < E; e++) p[e] /= sum;
  float chosen = 0.0f;
  for (int64_t r = 0; r < K; r++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++) {
      if (p[e] < 0.0f) continue; /* already taken */
      if (best < 0 || p[e] > p[best]) best = e;
    }
    ids[t * K + r] = static_cast<int32_t>(best);
    wout[t * K + r] = p[best];
    chosen += p[best];
    p[best] = -1.0f;
  }
  if (renormalize)
    for (int64_t r = 0; r < K; r++) wout[t * K + r] /= chosen;
}

__global__ void combine_kernel(float *y, const float *eo, const float *w, const float *shared, const float *sgate,
                               int64_t m, int64_t n, int64_t K) {
  GRID_STRIDE(idx, m * n) {
    const int64_t t = idx / n, i = idx % n;
    const float sg = sgate ? 1.0f / (1.0f + expf(-sgate[t])) : 1.0f;
    float acc = 0.0f;
    for (int64_t r = 0; r < K; r++) acc += eo[(t * K + r) * n + i] * (w ? w[t * K + r] : 1.0f);
    if (shared) acc += sg * shared[t * n + i];
    y[t * n + i] += acc;
  }
}

__global__ void gather_kernel(const float *x, float *out, const int32_t *rows, int64_t n) {
  const int64_t r = blockIdx.x;
  const float *src = x + static_cast<int64_t>(rows[r]) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[r * n + i] = src[i];
}

__global__ void scatter_kernel(const float *src, float *y, const int32_t *tok, const int32_t *rank, int64_t n,
                               int64_t K) {
  const int64_t r = blockIdx.x;
  float *dst = y + (static_cast<int64_t>(tok[r]) * K + rank[r]) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[r * n + i];
}

__global__ void add_bias_kernel(float *y, const void *bias, int bdt, int64_t m, int64_t n, int64_t ldy) {
  GRID_STRIDE(idx, m * n) {
    const int64_t r = idx / n, j = idx % n;
    y[r * ldy + j] += load(bdt, bias, j);
  }
}

__global__ void to_half_kernel(const float *x, void *out, int dt, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    if (dt == FERRY_CU_F16 && !isnan(v)) v = fminf(fmaxf(v, -65504.0f), 65504.0f); /* saturate; NaN stays NaN */
    store(dt, out, i, v);
  }
}

__device__ __forceinline__ float f32_at(const uint8_t *p) {
  const uint32_t b = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
                     static_cast<uint32_t>(p[3]) << 24;
  return __uint_as_float(b);
}

__device__ __forceinline__ unsigned short u16_at(const uint8_t *p) {
  return static_cast<unsigned short>(p[0] | p[1] << 8);
}

/* Code j of a packed row: bits [j*bits, (j+1)*bits), little-endian bit order. */
__device__ __forceinline__ unsigned code_at(const uint8_t *row, int bits, int64_t j) {
  const uint64_t pos = static_cast<uint64_t>(j) * static_cast<uint64_t>(bits);
  const unsigned shift = static_cast<unsigned>(pos & 7u);
  unsigned v = row[pos >> 3];
  if (shift + static_cast<unsigned>(bits) > 8u) v |= static_cast<unsigned>(row[(pos >> 3) + 1]) << 8;
  return (v >> shift) & ((1u << bits) - 1u);
}

/* One row a block (grid x), its columns over the block's threads and grid y's slices: the row's
 * pointer, scale and group base are computed once, and a column's group is a 32-bit division
 * (a 64-bit div/mod per element made it 55 us a call on an H200, for weights of 4-11 M elements). */
__global__ void dequant_kernel(const ferry_cu_dequant d, void *y, int ydt) {
  const int64_t r = blockIdx.x;
  const int cols = static_cast<int>(d.cols), group = static_cast<int>(d.group);
  const uint64_t row_bytes = (static_cast<uint64_t>(d.cols) * static_cast<uint64_t>(d.bits) + 7) / 8;
  const int64_t gpr = group ? (d.cols + group - 1) / group : 0;
  const uint8_t *row = d.data + static_cast<uint64_t>(r) * row_bytes;
  const float row_scale = d.format == FERRY_CU_Q_INT8 ? f32_at(d.scales + 4 * r) : 0.0f;
  const int64_t g0 = r * gpr;
  const size_t out0 = static_cast<size_t>(r) * static_cast<size_t>(cols);
  for (int j = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x); j < cols;
       j += static_cast<int>(gridDim.y * blockDim.x)) {
    float v = 0.0f;
    switch (d.format) {
      case FERRY_CU_Q_F32:
        v = f32_at(row + 4 * static_cast<size_t>(j));
        break;
      case FERRY_CU_Q_F16:
        v = __half2float(__ushort_as_half(u16_at(row + 2 * static_cast<size_t>(j))));
        break;
      case FERRY_CU_Q_BF16:
        v = __uint_as_float(static_cast<uint32_t>(u16_at(row + 2 * static_cast<size_t>(j))) << 16);
        break;
      case FERRY_CU_Q_INT8:
        v = static_cast<float>(static_cast<int8_t>(row[j])) * row_scale;
        break;
      case FERRY_CU_Q_INTN: {
        const int64_t g = g0 + j / group;
        const float s = __half2float(__ushort_as_half(u16_at(d.scales + 2 * g)));
        v = static_cast<float>(static_cast<int>(code_at(row, d.bits, j)) - static_cast<int>(d.zeros[g])) * s;
        break;
      }
      case FERRY_CU_Q_NF4: {
        const int64_t i = g0 + j / group, b2 = i / 256; /* FERRY_QUANT_NF4_BLOCK2 */
        /* offset2 + map[code] * scale2, rounded twice as on the host (no FMA) */
        const float a = __fadd_rn(f32_at(d.offsets2 + 4 * b2), __fmul_rn(d.dynamic_map[d.scales[i]], f32_at(d.scales2 + 4 * b2)));
        v = __fmul_rn(d.nf4_levels[code_at(row, 4, j)], a);
        break;
      }
    }
    if (ydt == FERRY_CU_F16) static_cast<__half *>(y)[out0 + j] = __float2half_rn(v);
    else static_cast<float *>(y)[out0 + j] = v;
  }
}

/* int4 with groups a multiple of 8 into fp16 (the engine's usual case on this executor): a
 * thread takes 8 codes from one 32-bit word (code i of the word in bits 4i..4i+3, as the packed
 * little-endian bit order puts them), which share a group, and stores 8 halves at once. The
 * launcher checks the alignments. */
__global__ void dequant_int4_half_kernel(const ferry_cu_dequant d, __half *y) {
  const int64_t r = blockIdx.x;
  const int words = static_cast<int>(d.cols / 8), group = static_cast<int>(d.group);
  const int64_t gpr = (d.cols + group - 1) / group;
  const uint32_t *row = reinterpret_cast<const uint32_t *>(d.data + static_cast<uint64_t>(r) * static_cast<uint64_t>(d.cols / 2));
  __half *out = y + static_cast<size_t>(r) * static_cast<size_t>(d.cols);
  for (int w = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x); w < words;
       w += static_cast<int>(gridDim.y * blockDim.x)) {
    const uint32_t packed = row[w];
    const int64_t g = r * gpr + (w * 8) / group;
    const float s = __half2float(__ushort_as_half(u16_at(d.scales + 2 * g)));
    const int z = static_cast<int>(d.zeros[g]);
    __align__(16) __half h[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
      h[i] = __float2half_rn(static_cast<float>(static_cast<int>((packed >> (4 * i)) & 15u) - z) * s);
    *reinterpret_cast<uint4 *>(out + 8 * static_cast<size_t>(w)) = *reinterpret_cast<const uint4 *>(h);
  }
}

/* Grid x is limited to 2^31-1 blocks: rows per launch are capped there (the executor rejects
 * larger m before launching). */
unsigned rows_grid(int64_t m) { return static_cast<unsigned>(m); }

/* (rows, slices of `per_row` items at `threads` a block): enough blocks to fill the GPU when
 * the rows are few (a decode step's tokens), one slice a row when they are many */
dim3 rows_slices_grid(int64_t m, int64_t per_row, int threads) {
  int64_t slices = (per_row + threads - 1) / threads;
  const int64_t wanted = (1024 + m - 1) / m; /* about 1024 blocks in all */
  if (slices > wanted) slices = wanted;
  if (slices < 1) slices = 1;
  if (slices > 65535) slices = 65535;
  return dim3(rows_grid(m), static_cast<unsigned>(slices));
}

}  // namespace

extern "C" {

cudaError_t ferry__cu_embed(cudaStream_t s, float *y, const void *table, int tdt, const int32_t *ids,
                            const void *pos_table, int pdt, const int32_t *pos, int64_t pos_offset, int64_t m,
                            int64_t n) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  embed_kernel<<<rows_grid(m), kThreads, 0, s>>>(y, table, tdt, ids, pos_table, pdt, pos, pos_offset, n);
  return cudaGetLastError();
}

cudaError_t ferry__cu_norm(cudaStream_t s, const float *x, float *y, const void *w, int wdt, const void *b, int bdt,
                           int64_t m, int64_t n, float eps, int kind) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  norm_kernel<<<rows_grid(m), kThreads, 0, s>>>(x, y, w, wdt, b, bdt, n, eps, kind);
  return cudaGetLastError();
}

cudaError_t ferry__cu_rope(cudaStream_t s, float *q, float *k, const int32_t *pos, int64_t m, int64_t heads,
                           int64_t kv_heads, int64_t hd, double theta) {
  if (m <= 0 || hd < 2) return cudaSuccess;
  const int64_t pairs = (heads + (k ? kv_heads : 0)) * (hd / 2);
  rope_kernel<<<rows_slices_grid(m, pairs, 128), 128, 0, s>>>(q, k, pos, heads, kv_heads, hd, theta);
  return cudaGetLastError();
}

cudaError_t ferry__cu_kv_append(cudaStream_t s, const float *knew, const float *vnew, void *kc, void *vc, int cdt,
                                const int32_t *pos, const int32_t *slot, int64_t m, int64_t kv_heads, int64_t hd,
                                int64_t cap) {
  if (m <= 0) return cudaSuccess;
  kv_append_kernel<<<rows_slices_grid(m, kv_heads * hd, kThreads), kThreads, 0, s>>>(knew, vnew, kc, vc, cdt, pos, slot,
                                                                                 kv_heads * hd, cap);
  return cudaGetLastError();
}

cudaError_t ferry__cu_attention(cudaStream_t s, const float *q, float *out, const void *kc, const void *vc, int cdt,
                                const int32_t *pos, const int32_t *slot, int64_t m, int64_t heads, int64_t kv_heads,
                                int64_t hd, int64_t cap, int64_t window, int64_t max_rows, float *part,
                                size_t part_bytes) {
  if (m <= 0 || heads <= 0) return cudaSuccess;
  /* hd_pad: a group of whole warps per copy of the head's dimensions (hd <= 1024, checked at
   * submit); at least 512 threads, so a short head still has rows in flight */
  const int64_t hd_pad = (hd + 31) / 32 * 32;
  const int64_t threads = hd_pad > 512 ? hd_pad : 512;
  const size_t smem = static_cast<size_t>(hd + FERRY_CU_ATTN_TILE) * sizeof(float);
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  /* Few (token, head) blocks over long contexts (decode): split each context into chunks of at
   * least kAttnSplitRows rows over more blocks, up to about kAttnBlocks in all, where the
   * partials fit `part` */
  int64_t splits = 1;
  const int64_t blocks = m * heads;
  if (part && max_rows > kAttnSplitRows && blocks < kAttnBlocks) {
    splits = (max_rows + kAttnSplitRows - 1) / kAttnSplitRows;
    if (splits > kAttnBlocks / blocks) splits = kAttnBlocks / blocks;
    if (splits > kAttnMaxSplits) splits = kAttnMaxSplits;
    while (splits > 1 && static_cast<size_t>(blocks * splits * (hd + 2)) * sizeof(float) > part_bytes) splits--;
  }
  const int64_t chunk = splits > 1 ? (max_rows + splits - 1) / splits : INT64_MAX / 2; /* one split: every row */
  dim3 grid(rows_grid(m), static_cast<unsigned>(heads), static_cast<unsigned>(splits));
  attention_kernel<<<grid, static_cast<unsigned>(threads), smem, s>>>(q, out, part, kc, vc, cdt, pos, slot, heads,
                                                                       kv_heads, hd, hd_pad, cap, window, chunk, scale);
  if (splits > 1) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    attention_combine_kernel<<<dim3(rows_grid(m), static_cast<unsigned>(heads)), static_cast<unsigned>(hd_pad), 0, s>>>(
        part, out, heads, hd, static_cast<int>(splits));
  }
  return cudaGetLastError();
}

cudaError_t ferry__cu_silu_mul(cudaStream_t s, const float *a, const float *b, float *y, int64_t n) {
  if (n <= 0) return cudaSuccess;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n);
  return cudaGetLastError();
}

cudaError_t ferry__cu_gelu(cudaStream_t s, float *a, int64_t n) {
  if (n <= 0) return cudaSuccess;
  gelu_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, n);
  return cudaGetLastError();
}

cudaError_t ferry__cu_relu(cudaStream_t s, float *a, int64_t n) {
  if (n <= 0) return cudaSuccess;
  relu_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, n);
  return cudaGetLastError();
}

cudaError_t ferry__cu_router(cudaStream_t s, const float *logits, float *w, int32_t *ids, int64_t m,
                             int64_t n_experts, int64_t top_k, int renormalize) {
  if (m <= 0 || n_experts <= 0) return cudaSuccess;
  router_kernel<<<rows_grid(m), 1, static_cast<size_t>(n_experts) * sizeof(float), s>>>(logits, w, ids, n_experts,
                                                                                        top_k, renormalize);
  return cudaGetLastError();
}

cudaError_t ferry__cu_combine(cudaStream_t s, float *y, const float *eo, const float *w, const float *shared,
                              const float *sgate, int64_t m, int64_t n, int64_t top_k) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  combine_kernel<<<blocks_for(m * n), kThreads, 0, s>>>(y, eo, w, shared, sgate, m, n, top_k);
  return cudaGetLastError();
}

cudaError_t ferry__cu_gather(cudaStream_t s, const float *x, float *out, const int32_t *rows, int64_t m, int64_t n) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  gather_kernel<<<rows_grid(m), kThreads, 0, s>>>(x, out, rows, n);
  return cudaGetLastError();
}

cudaError_t ferry__cu_scatter(cudaStream_t s, const float *src, float *y, const int32_t *tok, const int32_t *rank,
                              int64_t m, int64_t n, int64_t top_k) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  scatter_kernel<<<rows_grid(m), kThreads, 0, s>>>(src, y, tok, rank, n, top_k);
  return cudaGetLastError();
}

cudaError_t ferry__cu_add_bias(cudaStream_t s, float *y, const void *bias, int bdt, int64_t m, int64_t n,
                               int64_t ldy) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  add_bias_kernel<<<blocks_for(m * n), kThreads, 0, s>>>(y, bias, bdt, m, n, ldy);
  return cudaGetLastError();
}

cudaError_t ferry__cu_to_half(cudaStream_t s, const float *x, void *out, int dt, int64_t n) {
  if (n <= 0) return cudaSuccess;
  to_half_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, out, dt, n);
  return cudaGetLastError();
}

cudaError_t ferry__cu_dequantize(cudaStream_t s, const struct ferry_cu_dequant *d, void *y, int ydt) {
  if (d->rows <= 0 || d->cols <= 0) return cudaSuccess;
  const bool int4_half = ydt == FERRY_CU_F16 && d->format == FERRY_CU_Q_INTN && d->bits == 4 && d->group > 0 &&
                        d->group % 8 == 0 && d->cols % 8 == 0 && reinterpret_cast<uintptr_t>(d->data) % 4 == 0 &&
                        reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (int4_half)
    dequant_int4_half_kernel<<<rows_slices_grid(d->rows, d->cols / 8, kThreads), kThreads, 0, s>>>(*d,
                                                                                                  static_cast<__half *>(y));
  else
    dequant_kernel<<<rows_slices_grid(d->rows, d->cols, kThreads), kThreads, 0, s>>>(*d, y, ydt);
  return cudaGetLastError();
}

}  // extern "C"
