/* Real math for the host executor's kernels (OpenBLAS for matrix products, own code for the
 * rest), following the Hugging Face reference implementations of the families it computes. */
#ifndef FERRY_HOST_KERNELS_H
#define FERRY_HOST_KERNELS_H

#include <stddef.h>

#include "exec_impl.h"
#include "ferry/exec.h"

/* Per-queue temporary space: weight conversion panels and attention scores. It grows to the
 * largest need seen and is then reused, so steady-state decoding allocates nothing. */
struct ferry_host_scratch {
  float *buf;
  size_t floats;
};

void ferry__host_scratch_free(struct ferry_host_scratch *s);

/* Shared by the host kernel files. A buffer's bytes at a reference. */
static inline void *ferry__host_at(struct ferry_ref r) { return (char *)r.buf->ptr + ferry__ref_at(r); }
/* The scratch as at least `floats` floats (grown, contents lost), NULL when out of memory. Any
 * call may move it: callers take it once and call nothing else that uses it meanwhile. */
float *ferry__host_scratch(struct ferry_host_scratch *s, size_t floats);
/* n elements of dtype to fp32 (vectorised for fp16/bf16). */
void ferry__host_to_f32(enum ferry_dtype dt, const void *src, float *dst, size_t n);
float ferry__host_load1(enum ferry_dtype dt, const void *base, size_t i);
void ferry__host_store1(enum ferry_dtype dt, void *base, size_t i, float v);
/* The most rows a product with weights of this dtype multiplies row by row (sgemv) rather than
 * with sgemm: 8 for 16-bit weights, 16 for fp32, where the simulator's calibration stops pricing
 * it as a matrix-vector product. */
int64_t ferry__host_gemv_rows_max(enum ferry_dtype weight_dtype);
/* Rows of a [rows_total, width] weight the products convert or multiply at a time: a panel of
 * about 1 MiB of fp32, at least one row. */
int64_t ferry__host_panel_rows(int64_t width, int64_t rows_total);
/* y[m, n] (+)= x[m, k] . W^T (+ bias) with W [n, k] in dtype wdt; ldy is y's row stride.
 * Uses the scratch for weight panels. */
ferry_status ferry__host_matmul(const float *x, int64_t m, int64_t k, const void *w, enum ferry_dtype wdt, int64_t n,
                                const void *bias, enum ferry_dtype bdt, float *y, int64_t ldy, int accumulate,
                                struct ferry_host_scratch *s);
/* y[m, n] (+)= x[m, k] . W with W [k, n] stored input-major (fused expert checkpoints). */
ferry_status ferry__host_matmul_t(const float *x, int64_t m, int64_t k, const void *w, enum ferry_dtype wdt, int64_t n,
                                  float *y, int64_t ldy, int accumulate, struct ferry_host_scratch *s);

/* host_kv.c: cache rows in a KV format, a chunk (a head's n elements, or a latent row) at a time;
 * chunk counts chunks of n from base. Quantized formats (ferry_kv_format_group() > 0) need n a
 * multiple of the group. */
size_t ferry__host_kv_chunk_bytes(enum ferry_kv_format f, enum ferry_dtype dt, int64_t n);
void ferry__host_kv_store(enum ferry_kv_format f, enum ferry_dtype dt, void *base, size_t chunk, const float *src,
                          int64_t n);
void ferry__host_kv_load(enum ferry_kv_format f, enum ferry_dtype dt, const void *base, size_t chunk, float *dst,
                         int64_t n);

/* host_attention.c: RoPE, the KV append (alone: FERRY_K_KV_APPEND, and attention's first
 * half), attention, MLA attention, fused qkv split. */
ferry_status ferry__host_rope(const struct ferry_kernel *k, char *msg, size_t len);
ferry_status ferry__host_kv_append(const struct ferry_kernel *k, char *msg, size_t len);
ferry_status ferry__host_attention(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg, size_t len);
ferry_status ferry__host_mla_attention(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg,
                                       size_t len);
ferry_status ferry__host_split_qkv(const struct ferry_kernel *k);
/* host_moe.c: router, one expert's FFN, the combine. */
ferry_status ferry__host_router(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg, size_t len);
ferry_status ferry__host_expert(const struct ferry_kernel *k, struct ferry_host_scratch *s);
ferry_status ferry__host_combine(const struct ferry_kernel *k);

/* Run one kernel on host memory. On failure writes a message into msg. */
ferry_status ferry__host_kernel_run(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg,
                                    size_t msg_len);

#endif
