/* Host kernels: the math of the decoder layers ferry computes, on fp32 activations with fp32,
 * fp16 or bf16 weights converted as they are used: matrix products, norms, embeddings,
 * activations, gathers and dequantization here; attention in host_attention.c, routing and
 * experts in host_moe.c. Summation orders are fixed (never depend on which buffer a weight
 * lives in, or on the order in which experts arrive), so an offloaded run gives bit-identical
 * logits to a resident one. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cblas.h>

#include "common/alloc.h"
#include "common/half.h"
#include "ferry/quant.h"
#include "exec_impl.h"
#include "host_kernels.h"

/* Rows of a weight matrix converted to fp32 at a time: bounded scratch (about 1 MiB). */
#define PANEL_BYTES (1u << 20)

void ferry__host_scratch_free(struct ferry_host_scratch *s) {
  ferry_free(s->buf);
  s->buf = NULL;
  s->floats = 0;
}

float *ferry__host_scratch(struct ferry_host_scratch *s, size_t floats) {
  if (floats > s->floats) {
    float *p = ferry__reallocarray(s->buf, floats, sizeof(float));
    if (!p) return NULL;
    s->buf = p;
    s->floats = floats;
  }
  return s->buf;
}

#define at ferry__host_at
#define scratch ferry__host_scratch

/* Convert n elements of dtype to fp32 with the quantization module's vectorised expansion
 * (the same code dequantizes stored formats, so one fast path serves both). */
void ferry__host_to_f32(enum ferry_dtype dt, const void *src, float *dst, size_t n) {
  if (dt == FERRY_DTYPE_F32) {
    memcpy(dst, src, n * sizeof(float));
    return;
  }
  struct ferry_qspec spec = {dt == FERRY_DTYPE_F16 ? FERRY_QFORMAT_FP16 : FERRY_QFORMAT_BF16, 0};
  struct ferry_qview view = {{src}};
  if (ferry_quant_dequantize_rows(&spec, &view, 1, (int64_t)n, 0, 1, dst) != FERRY_OK) {
    if (dt == FERRY_DTYPE_F16) ferry__f16_to_f32_n(src, dst, n);
    else ferry__bf16_to_f32_n(src, dst, n);
  }
}

#define to_f32 ferry__host_to_f32
#define matmul ferry__host_matmul
#define load1 ferry__host_load1
#define store1 ferry__host_store1

float ferry__host_load1(enum ferry_dtype dt, const void *base, size_t i) {
  switch (dt) {
    case FERRY_DTYPE_F16:
      return ferry__f16_to_f32(((const uint16_t *)base)[i]);
    case FERRY_DTYPE_BF16:
      return ferry__bf16_to_f32(((const uint16_t *)base)[i]);
    default:
      return ((const float *)base)[i];
  }
}

void ferry__host_store1(enum ferry_dtype dt, void *base, size_t i, float v) {
  switch (dt) {
    case FERRY_DTYPE_F16:
      ((uint16_t *)base)[i] = ferry__f32_to_f16(v);
      break;
    case FERRY_DTYPE_BF16:
      ((uint16_t *)base)[i] = ferry__f32_to_bf16(v);
      break;
    default:
      ((float *)base)[i] = v;
      break;
  }
}

static int supported_weight(enum ferry_dtype dt) {
  return dt == FERRY_DTYPE_F32 || dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16;
}

/* Products of a few rows go row by row through sgemv over a cache-sized panel of the weight:
 * OpenBLAS's single-threaded sgemm with 2-7 rows runs its edge kernels, costs 2-5x as much as
 * the same number of matrix-vector products (bench/host_matmul, 1792x512 fp16 converted: 2 rows
 * 512 us against 257, 3 rows 702 against 331, 4 rows 507 against 415) and jumps with the row
 * count's parity, which no cost linear in the work can price. Row by row goes as far as the
 * simulator's calibration prices a product as a matrix-vector one: up to 8 flops a byte of
 * weight (FERRY_HW_GEMM_INTENSITY), 2 x rows / element bytes, so 8 rows of 16-bit weights and 16
 * of fp32 (where sgemm is no faster: `bench/host_matmul 1792 512 20 fp32`, 12 rows 2078 us
 * against 938 row by row). Above, sgemm: prefill's hundreds of rows need it. A row's result is
 * the same whichever of the rows up to that limit came with it. */
int64_t ferry__host_gemv_rows_max(enum ferry_dtype weight_dtype) {
  return 4 * (int64_t)ferry_dtype_size(weight_dtype);
}

/* y[m, rows] (+)= x[m, k] . panel[rows, k]^T; row by row up to gemv_rows rows */
static void panel_product(const float *x, int64_t m, int64_t k, const float *panel, int64_t rows, float beta,
                          float *y, int64_t ldy, int64_t gemv_rows) {
  if (m <= gemv_rows) {
    for (int64_t i = 0; i < m; i++)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)rows, (int)k, 1.0f, panel, (int)k, x + i * k, 1, beta, y + i * ldy,
                  1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)rows, (int)k, 1.0f, x, (int)k, panel, (int)k,
                beta, y, (int)ldy);
  }
}

/* y[m, n] (+)= x[m, k] . panel[rows, n] for the rows of W [k, n] from r0 (x's columns r0..) */
static void panel_product_t(const float *x, int64_t m, int64_t k, int64_t r0, const float *panel, int64_t rows,
                            int64_t n, float beta, float *y, int64_t ldy, int64_t gemv_rows) {
  if (m <= gemv_rows) {
    for (int64_t i = 0; i < m; i++)
      cblas_sgemv(CblasRowMajor, CblasTrans, (int)rows, (int)n, 1.0f, panel, (int)n, x + i * k + r0, 1, beta,
                  y + i * ldy, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)rows, 1.0f, x + r0, (int)k, panel,
                (int)n, beta, y, (int)ldy);
  }
}

int64_t ferry__host_panel_rows(int64_t width, int64_t rows_total) {
  int64_t rows = (int64_t)(PANEL_BYTES / sizeof(float)) / (width ? width : 1);
  if (rows < 1) rows = 1;
  return rows > rows_total ? rows_total : rows;
}

/* y[m, n] (+)= x[m, k] . W[n, k]^T + bias, W in dtype wdt. ldy is y's row stride. Converts
 * W in row panels, so fp16/bf16 weights need only PANEL_BYTES of scratch; fp32 weights are read
 * in place, in panels too when few rows reuse each one. */
ferry_status ferry__host_matmul(const float *x, int64_t m, int64_t k, const void *w, enum ferry_dtype wdt, int64_t n,
                                const void *bias, enum ferry_dtype bdt, float *y, int64_t ldy, int accumulate,
                                struct ferry_host_scratch *s) {
  if (m == 0 || n == 0) return FERRY_OK;
  const float beta = accumulate ? 1.0f : 0.0f;
  const int64_t gemv_rows = ferry__host_gemv_rows_max(wdt);
  if (wdt == FERRY_DTYPE_F32 && m > gemv_rows) {
    panel_product(x, m, k, w, n, beta, y, ldy, gemv_rows);
  } else {
    const int64_t panel_rows = ferry__host_panel_rows(k, n);
    float *panel = NULL;
    if (wdt != FERRY_DTYPE_F32 && !(panel = scratch(s, (size_t)(panel_rows * k)))) return FERRY_ERR_NOMEM;
    const size_t es = ferry_dtype_size(wdt);
    for (int64_t r0 = 0; r0 < n; r0 += panel_rows) {
      const int64_t rows = n - r0 < panel_rows ? n - r0 : panel_rows;
      const void *src = (const char *)w + (size_t)(r0 * k) * es;
      if (panel) to_f32(wdt, src, panel, (size_t)(rows * k));
      panel_product(x, m, k, panel ? panel : src, rows, beta, y + r0, ldy, gemv_rows);
    }
  }
  if (bias)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) y[i * ldy + j] += load1(bdt, bias, (size_t)j);
  return FERRY_OK;
}

/* y = x . W with W [k, n]: fp16/bf16 weights converted a panel of input rows at a time, each
 * panel's product added to y in order (the same order whatever the panel size). */
ferry_status ferry__host_matmul_t(const float *x, int64_t m, int64_t k, const void *w, enum ferry_dtype wdt, int64_t n,
                                  float *y, int64_t ldy, int accumulate, struct ferry_host_scratch *s) {
  if (m == 0 || n == 0) return FERRY_OK;
  const int64_t gemv_rows = ferry__host_gemv_rows_max(wdt);
  if (wdt == FERRY_DTYPE_F32 && m > gemv_rows) {
    panel_product_t(x, m, k, 0, w, k, n, accumulate ? 1.0f : 0.0f, y, ldy, gemv_rows);
    return FERRY_OK;
  }
  const int64_t panel_rows = ferry__host_panel_rows(n, k);
  float *panel = NULL;
  if (wdt != FERRY_DTYPE_F32 && !(panel = scratch(s, (size_t)(panel_rows * n)))) return FERRY_ERR_NOMEM;
  const size_t es = ferry_dtype_size(wdt);
  for (int64_t r0 = 0; r0 < k; r0 += panel_rows) {
    const int64_t rows = k - r0 < panel_rows ? k - r0 : panel_rows;
    const void *src = (const char *)w + (size_t)(r0 * n) * es;
    if (panel) to_f32(wdt, src, panel, (size_t)(rows * n));
    panel_product_t(x, m, k, r0, panel ? panel : src, rows, n, (accumulate || r0 > 0) ? 1.0f : 0.0f, y, ldy,
                    gemv_rows);
  }
  return FERRY_OK;
}

static ferry_status k_matmul(const struct ferry_kernel *k, struct ferry_host_scratch *s) {
  return matmul(at(k->x), k->m, k->k, at(k->w), k->w.dtype, k->n, k->b.buf ? at(k->b) : NULL, k->b.dtype, at(k->y),
                k->n, k->accumulate, s);
}

/* RMSNorm (HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in fp32; Gemma: * (1 + w); Llama 4
 * q/k: no weight) or LayerNorm, over rows of n with stride ld; optionally added into y. */
static ferry_status k_norm(const struct ferry_kernel *k) {
  const float *x = at(k->x);
  float *y = at(k->y);
  const void *w = k->w.buf ? at(k->w) : NULL;
  const void *b = k->b.buf ? at(k->b) : NULL;
  const int64_t n = k->n, ld = k->ld ? k->ld : k->n;
  for (int64_t r = 0; r < k->m; r++) {
    const float *xr = x + r * ld;
    float *yr = y + r * ld;
    float mean = 0.0f, inv;
    if (k->norm_kind == FERRY_NORMFN_LAYER) {
      float var = 0.0f;
      for (int64_t i = 0; i < n; i++) mean += xr[i];
      mean /= (float)n;
      for (int64_t i = 0; i < n; i++) var += (xr[i] - mean) * (xr[i] - mean);
      var /= (float)n;
      inv = 1.0f / sqrtf(var + k->eps);
    } else {
      float ss = 0.0f;
      for (int64_t i = 0; i < n; i++) ss += xr[i] * xr[i];
      inv = 1.0f / sqrtf(ss / (float)n + k->eps);
    }
    for (int64_t i = 0; i < n; i++) {
      float v = (xr[i] - mean) * inv;
      if (k->norm_kind == FERRY_NORMFN_RMS_OFFSET)
        v *= 1.0f + load1(k->w.dtype, w, (size_t)i);
      else if (k->norm_kind != FERRY_NORMFN_RMS_PLAIN)
        v *= load1(k->w.dtype, w, (size_t)i);
      if (b) v += load1(k->b.dtype, b, (size_t)i);
      yr[i] = k->accumulate ? yr[i] + v : v;
    }
  }
  return FERRY_OK;
}

static ferry_status k_embed(const struct ferry_kernel *k, char *msg, size_t len) {
  float *y = at(k->y);
  const void *table = at(k->w);
  const int64_t n = k->n;
  const uint64_t rows = (k->w.buf->bytes - ferry__ref_at(k->w)) / ((uint64_t)n * ferry_dtype_size(k->w.dtype));
  size_t es = ferry_dtype_size(k->w.dtype);
  for (int64_t t = 0; t < k->m; t++) {
    int32_t id = k->ints[t];
    if (id < 0 || (uint64_t)id >= rows) {
      snprintf(msg, len, "embed: token id %d outside the table of %llu rows", id, (unsigned long long)rows);
      return FERRY_ERR_RANGE;
    }
    to_f32(k->w.dtype, (const char *)table + (size_t)id * (size_t)n * es, y + t * n, (size_t)n);
    if (k->scale != 0 && k->scale != 1)
      for (int64_t i = 0; i < n; i++) y[t * n + i] *= k->scale;
    if (k->aux[0].buf) { /* learned positions (OPT) */
      const void *pos = at(k->aux[0]);
      size_t row = (size_t)(k->ints2[t] + k->pos_offset);
      for (int64_t i = 0; i < n; i++) y[t * n + i] += load1(k->aux[0].dtype, pos, row * (size_t)n + (size_t)i);
    }
  }
  return FERRY_OK;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

static inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

static ferry_status k_activation(const struct ferry_kernel *k) {
  const size_t n = (size_t)(k->m * k->n);
  float *a = at(k->x);
  switch (k->fn) {
    case FERRY_FN_SILU_MUL: {
      const float *b = at(k->aux[0]);
      float *y = at(k->y);
      for (size_t i = 0; i < n; i++) y[i] = silu(a[i]) * b[i];
      break;
    }
    case FERRY_FN_GELU_TANH_MUL: {
      const float *b = at(k->aux[0]);
      float *y = at(k->y);
      for (size_t i = 0; i < n; i++) y[i] = gelu_tanh(a[i]) * b[i];
      break;
    }
    case FERRY_FN_GELU:
      for (size_t i = 0; i < n; i++) a[i] = 0.5f * a[i] * (1.0f + erff(a[i] * 0.70710678118654752f));
      break;
    case FERRY_FN_GELU_TANH:
      for (size_t i = 0; i < n; i++) a[i] = gelu_tanh(a[i]);
      break;
    case FERRY_FN_RELU:
      for (size_t i = 0; i < n; i++) a[i] = a[i] > 0 ? a[i] : 0;
      break;
    case FERRY_FN_SOFTCAP:
      for (size_t i = 0; i < n; i++) a[i] = k->softcap * tanhf(a[i] / k->softcap);
      break;
  }
  return FERRY_OK;
}

/* fp32 straight into y; fp16 through fp32 rows in bounded chunks of the queue's scratch, each
 * value rounded once (the cuda kernel's __float2half_rn of the same fp32 value). */
static ferry_status k_dequantize(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg, size_t len) {
  struct ferry_qspec spec = {(enum ferry_qformat)k->qformat, k->qgroup};
  struct ferry_qview view;
  for (int p = 0; p < FERRY_QPART_COUNT; p++) view.part[p] = k->aux[p].buf ? at(k->aux[p]) : NULL;
  ferry_status st = FERRY_OK;
  if (k->y.dtype != FERRY_DTYPE_F16) {
    st = ferry_quant_dequantize_rows(&spec, &view, k->n, k->k, 0, k->n, at(k->y));
  } else {
    int64_t chunk = (int64_t)(1 << 16) / k->k;
    if (chunk < 1) chunk = 1;
    if (chunk > k->n) chunk = k->n;
    float *rows = ferry__host_scratch(s, (size_t)(chunk * k->k));
    if (!rows) {
      snprintf(msg, len, "%s: out of memory for a dequantized chunk", k->name);
      return FERRY_ERR_NOMEM;
    }
    uint16_t *y = at(k->y);
    for (int64_t r0 = 0; r0 < k->n && st == FERRY_OK; r0 += chunk) {
      const int64_t r1 = r0 + chunk < k->n ? r0 + chunk : k->n;
      st = ferry_quant_dequantize_rows(&spec, &view, k->n, k->k, r0, r1, rows);
      for (int64_t i = 0; st == FERRY_OK && i < (r1 - r0) * k->k; i++) y[r0 * k->k + i] = ferry__f32_to_f16(rows[i]);
    }
  }
  if (st != FERRY_OK) snprintf(msg, len, "%s: %s", k->name, ferry_last_error());
  return st;
}

static ferry_status k_gather(const struct ferry_kernel *k) {
  const float *x = at(k->x);
  float *y = at(k->y);
  for (int64_t i = 0; i < k->m; i++) memcpy(y + i * k->n, x + (int64_t)k->ints[i] * k->n, (size_t)k->n * 4);
  return FERRY_OK;
}

/* The devices' partials summed in device order into every device's copy: the bits do not depend
 * on which device asks. */
static ferry_status k_allreduce(const struct ferry_kernel *k) {
  float *v[FERRY_EXEC_MAX_DEVICES];
  for (int64_t d = 0; d < k->m; d++) v[d] = at(d ? k->aux[d - 1] : k->x);
  for (int64_t i = 0; i < k->n; i++) {
    float sum = v[0][i];
    for (int64_t d = 1; d < k->m; d++) sum += v[d][i];
    for (int64_t d = 0; d < k->m; d++) v[d][i] = sum;
  }
  return FERRY_OK;
}

ferry_status ferry__host_kernel_run(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg,
                                    size_t len) {
  msg[0] = '\0';
  if ((k->kind == FERRY_K_MATMUL || k->kind == FERRY_K_EXPERT || k->kind == FERRY_K_MLA_ATTENTION) &&
      !supported_weight(k->w.dtype)) {
    snprintf(msg, len, "%s: weights of dtype %s need a dequantize op first", k->name, ferry_dtype_name(k->w.dtype));
    return FERRY_ERR_UNSUPPORTED;
  }
  ferry_status st;
  switch (k->kind) {
    case FERRY_K_EMBED: return k_embed(k, msg, len);
    case FERRY_K_NORM: return k_norm(k);
    case FERRY_K_MATMUL: st = k_matmul(k, s); break;
    case FERRY_K_ROPE: return ferry__host_rope(k, msg, len);
    case FERRY_K_ATTENTION: st = ferry__host_attention(k, s, msg, len); break;
    case FERRY_K_KV_APPEND: return ferry__host_kv_append(k, msg, len);
    case FERRY_K_MLA_ATTENTION: st = ferry__host_mla_attention(k, s, msg, len); break;
    case FERRY_K_SPLIT_QKV: return ferry__host_split_qkv(k);
    case FERRY_K_SWIGLU: return k_activation(k);
    case FERRY_K_ROUTER: st = ferry__host_router(k, s, msg, len); break;
    case FERRY_K_EXPERT: st = ferry__host_expert(k, s); break;
    case FERRY_K_MOE_COMBINE: return ferry__host_combine(k);
    case FERRY_K_GATHER_ROWS: return k_gather(k);
    case FERRY_K_DEQUANTIZE: return k_dequantize(k, s, msg, len);
    case FERRY_K_ALLREDUCE: return k_allreduce(k);
    default:
      snprintf(msg, len, "%s: kernel kind %s is not implemented by the host executor", k->name,
               ferry_kernel_kind_name(k->kind));
      return FERRY_ERR_UNSUPPORTED;
  }
  if (st == FERRY_ERR_NOMEM && !msg[0]) snprintf(msg, len, "%s: out of memory for scratch", k->name);
  return st;
}
