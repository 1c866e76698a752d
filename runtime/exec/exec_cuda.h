/* Internal interface between the `cuda` executor (exec_cuda.c: streams, events, copies, cuBLAS)
 * and its own kernels (exec_cuda_kernels.cu). Each launcher enqueues one kernel on a stream and
 * returns the launch status; the math follows host_kernels.c exactly (same formulas, same
 * conventions), only the summation order of reductions differs. */
#ifndef FERRY_EXEC_CUDA_H
#define FERRY_EXEC_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types the kernels load and store. Every other dtype reads as fp32, like the host
 * kernels' load1(). */
enum ferry_cu_dtype { FERRY_CU_F32 = 0, FERRY_CU_F16 = 1, FERRY_CU_BF16 = 2 };

/* Tokens of a key/value tile staged in shared memory by the attention kernel. */
#define FERRY_CU_ATTN_TILE 1024
/* Largest head dimension the attention kernel takes (one thread per output dimension). */
#define FERRY_CU_MAX_HEAD_DIM 1024
/* Largest expert count the router kernel takes (probabilities in 48 KiB of shared memory). */
#define FERRY_CU_MAX_EXPERTS 12288

/* out[t,:] = table[ids[t],:] (+ pos_table[pos[t] + pos_offset,:]); pos_table may be NULL. */
cudaError_t ferry__cu_embed(cudaStream_t s, float *y, const void *table, int tdt, const int32_t *ids,
                            const void *pos_table, int pdt, const int32_t *pos, int64_t pos_offset, int64_t m,
                            int64_t n);

/* Row-wise RMSNorm (kind 0) or LayerNorm (kind 1) of x [m, n] into y (may alias x). */
cudaError_t ferry__cu_norm(cudaStream_t s, const float *x, float *y, const void *w, int wdt, const void *b, int bdt,
                           int64_t m, int64_t n, float eps, int kind);

/* Rotate-half RoPE in place on q [m, heads*hd] and (if k != NULL) k [m, kv_heads*hd]. */
cudaError_t ferry__cu_rope(cudaStream_t s, float *q, float *k, const int32_t *pos, int64_t m, int64_t heads,
                           int64_t kv_heads, int64_t hd, double theta);

/* Write each token's k and v rows [kv_heads*hd] at (slot[t], pos[t]) of the caches. */
cudaError_t ferry__cu_kv_append(cudaStream_t s, const float *knew, const float *vnew, void *kc, void *vc, int cdt,
                                const int32_t *pos, const int32_t *slot, int64_t m, int64_t kv_heads, int64_t hd,
                                int64_t cap);

/* Causal GQA attention of q [m, heads*hd] over positions [first, pos[t]] of slot[t]. max_rows:
 * the most positions any token attends over (pos - first + 1, as the host staged them); with
 * few tokens and heads, longer contexts are split over blocks whose partials go in `part`
 * (device scratch of part_bytes, free from this launch to the next op on the stream; NULL: no
 * split) and are combined by a second kernel. */
cudaError_t ferry__cu_attention(cudaStream_t s, const float *q, float *out, const void *kc, const void *vc, int cdt,
                                const int32_t *pos, const int32_t *slot, int64_t m, int64_t heads, int64_t kv_heads,
                                int64_t hd, int64_t cap, int64_t window, int64_t max_rows, float *part,
                                size_t part_bytes);

/* y[i] = silu(a[i]) * b[i] over n elements (y may alias a). */
cudaError_t ferry__cu_silu_mul(cudaStream_t s, const float *a, const float *b, float *y, int64_t n);
/* a[i] = gelu(a[i]) (exact erf form). */
cudaError_t ferry__cu_gelu(cudaStream_t s, float *a, int64_t n);
/* a[i] = max(a[i], 0). */
cudaError_t ferry__cu_relu(cudaStream_t s, float *a, int64_t n);

/* Softmax over n_experts logits per token, top-k (ties to the lower index), optional
 * renormalisation; writes w [m, top_k] and ids [m, top_k]. */
cudaError_t ferry__cu_router(cudaStream_t s, const float *logits, float *w, int32_t *ids, int64_t m,
                             int64_t n_experts, int64_t top_k, int renormalize);

/* y[t,:] += sum_r w[t,r] * eo[t*K + r,:] (rank order) + sigmoid(sgate[t]) * shared[t,:]. */
cudaError_t ferry__cu_combine(cudaStream_t s, float *y, const float *eo, const float *w, const float *shared,
                              const float *sgate, int64_t m, int64_t n, int64_t top_k);

/* out[i,:] = x[rows[i],:] for i < m, rows of n floats. */
cudaError_t ferry__cu_gather(cudaStream_t s, const float *x, float *out, const int32_t *rows, int64_t m, int64_t n);

/* y[tok[i]*top_k + rank[i],:] = src[i,:] for i < m, rows of n floats. */
cudaError_t ferry__cu_scatter(cudaStream_t s, const float *src, float *y, const int32_t *tok, const int32_t *rank,
                              int64_t m, int64_t n, int64_t top_k);

/* y[r, j] += bias[j] for r < m, j < n (row stride ldy). */
cudaError_t ferry__cu_add_bias(cudaStream_t s, float *y, const void *bias, int bdt, int64_t m, int64_t n,
                               int64_t ldy);

/* Convert n fp32 values to fp16 (saturating at +-65504, so a large activation stays finite) or
 * bf16, round to nearest even: the activation side of a mixed-precision GEMM. */
cudaError_t ferry__cu_to_half(cudaStream_t s, const float *x, void *out, int dt, int64_t n);

/* Weight formats the dequantize kernel expands (mapped from enum ferry_qformat by the caller). */
enum ferry_cu_qformat { FERRY_CU_Q_F32, FERRY_CU_Q_F16, FERRY_CU_Q_BF16, FERRY_CU_Q_INT8, FERRY_CU_Q_INTN, FERRY_CU_Q_NF4 };

/* A packed [rows, cols] weight (runtime/quant layout: rows byte-aligned, codes little-endian
 * bit order) and the tables NF4 needs; passed to the kernel by value. */
struct ferry_cu_dequant {
  int format; /* enum ferry_cu_qformat */
  int bits;   /* bits per code */
  int64_t rows, cols, group;
  const uint8_t *data, *scales, *zeros, *scales2, *offsets2;
  float nf4_levels[16];
  float dynamic_map[256];
};

/* y[rows, cols] (fp32, or fp16 when ydt is FERRY_CU_F16) = the weight expanded, element by
 * element with the host's expressions (no fused multiply-add), so the fp32 result is
 * bit-identical to ferry_quant_dequantize_rows() and the fp16 one is that value rounded to
 * nearest even. */
cudaError_t ferry__cu_dequantize(cudaStream_t s, const struct ferry_cu_dequant *d, void *y, int ydt);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_EXEC_CUDA_H */
