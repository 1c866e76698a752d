/* Host kernels: the math of Llama / Mistral / Mixtral / Qwen2 / Qwen2-MoE / OLMoE decoder
 * layers on fp32 activations, with fp32, fp16 or bf16 weights converted as they are used.
 * Summation orders are fixed (never depend on which buffer a weight lives in, or on the order
 * in which experts arrive), so an offloaded run gives bit-identical logits to a resident one. */
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

static float *scratch(struct ferry_host_scratch *s, size_t floats) {
  if (floats > s->floats) {
    float *p = ferry__reallocarray(s->buf, floats, sizeof(float));
    if (!p) return NULL;
    s->buf = p;
    s->floats = floats;
  }
  return s->buf;
}

static inline void *at(struct ferry_ref r) { return (char *)r.buf->ptr + r.offset; }

/* Convert n elements of dtype to fp32 with the quantization module's vectorised expansion
 * (the same code dequantizes stored formats, so one fast path serves both). */
static void to_f32(enum ferry_dtype dt, const void *src, float *dst, size_t n) {
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

static float load1(enum ferry_dtype dt, const void *base, size_t i) {
  switch (dt) {
    case FERRY_DTYPE_F16:
      return ferry__f16_to_f32(((const uint16_t *)base)[i]);
    case FERRY_DTYPE_BF16:
      return ferry__bf16_to_f32(((const uint16_t *)base)[i]);
    default:
      return ((const float *)base)[i];
  }
}

static void store1(enum ferry_dtype dt, void *base, size_t i, float v) {
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

/* y[m, n] (+)= x[m, k] . W[n, k]^T + bias, W in dtype wdt. ldy is y's row stride. Converts
 * W in row panels, so fp16/bf16 weights need only PANEL_BYTES of scratch. */
static ferry_status matmul(const float *x, int64_t m, int64_t k, const void *w, enum ferry_dtype wdt, int64_t n,
                           const void *bias, enum ferry_dtype bdt, float *y, int64_t ldy, int accumulate,
                           struct ferry_host_scratch *s) {
  if (m == 0 || n == 0) return FERRY_OK;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (wdt == FERRY_DTYPE_F32) {
    if (m == 1)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, w, (int)k, x, 1, beta, y, 1);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w, (int)k, beta,
                  y, (int)ldy);
  } else {
    int64_t panel_rows = (int64_t)(PANEL_BYTES / sizeof(float)) / (k ? k : 1);
    if (panel_rows < 1) panel_rows = 1;
    if (panel_rows > n) panel_rows = n;
    float *panel = scratch(s, (size_t)(panel_rows * k));
    if (!panel) return FERRY_ERR_NOMEM;
    size_t es = ferry_dtype_size(wdt);
    for (int64_t r0 = 0; r0 < n; r0 += panel_rows) {
      int64_t rows = n - r0 < panel_rows ? n - r0 : panel_rows;
      to_f32(wdt, (const char *)w + (size_t)(r0 * k) * es, panel, (size_t)(rows * k));
      if (m == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)rows, (int)k, 1.0f, panel, (int)k, x, 1, beta, y + r0, 1);
      else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)rows, (int)k, 1.0f, x, (int)k, panel,
                    (int)k, beta, y + r0, (int)ldy);
    }
  }
  if (bias)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) y[i * ldy + j] += load1(bdt, bias, (size_t)j);
  return FERRY_OK;
}

static ferry_status k_matmul(const struct ferry_kernel *k, struct ferry_host_scratch *s) {
  return matmul(at(k->x), k->m, k->k, at(k->w), k->w.dtype, k->n, k->b.buf ? at(k->b) : NULL, k->b.dtype, at(k->y),
                k->n, k->accumulate, s);
}

/* RMSNorm (HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in fp32) or LayerNorm. */
static ferry_status k_norm(const struct ferry_kernel *k) {
  const float *x = at(k->x);
  float *y = at(k->y);
  const void *w = at(k->w);
  const void *b = k->b.buf ? at(k->b) : NULL;
  const int64_t n = k->n;
  for (int64_t r = 0; r < k->m; r++) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    if (k->norm_kind == 0) {
      float ss = 0.0f;
      for (int64_t i = 0; i < n; i++) ss += xr[i] * xr[i];
      float inv = 1.0f / sqrtf(ss / (float)n + k->eps);
      for (int64_t i = 0; i < n; i++) yr[i] = load1(k->w.dtype, w, (size_t)i) * (xr[i] * inv);
    } else {
      float mean = 0.0f, var = 0.0f;
      for (int64_t i = 0; i < n; i++) mean += xr[i];
      mean /= (float)n;
      for (int64_t i = 0; i < n; i++) var += (xr[i] - mean) * (xr[i] - mean);
      var /= (float)n;
      float inv = 1.0f / sqrtf(var + k->eps);
      for (int64_t i = 0; i < n; i++) {
        float v = (xr[i] - mean) * inv * load1(k->w.dtype, w, (size_t)i);
        yr[i] = b ? v + load1(k->b.dtype, b, (size_t)i) : v;
      }
    }
  }
  return FERRY_OK;
}

static ferry_status k_embed(const struct ferry_kernel *k, char *msg, size_t len) {
  float *y = at(k->y);
  const void *table = at(k->w);
  const int64_t n = k->n;
  const uint64_t rows = (k->w.buf->bytes - k->w.offset) / ((uint64_t)n * ferry_dtype_size(k->w.dtype));
  size_t es = ferry_dtype_size(k->w.dtype);
  for (int64_t t = 0; t < k->m; t++) {
    int32_t id = k->ints[t];
    if (id < 0 || (uint64_t)id >= rows) {
      snprintf(msg, len, "embed: token id %d outside the table of %llu rows", id, (unsigned long long)rows);
      return FERRY_ERR_RANGE;
    }
    to_f32(k->w.dtype, (const char *)table + (size_t)id * (size_t)n * es, y + t * n, (size_t)n);
    if (k->aux[0].buf) { /* learned positions (OPT) */
      const void *pos = at(k->aux[0]);
      size_t row = (size_t)(k->ints2[t] + k->pos_offset);
      for (int64_t i = 0; i < n; i++) y[t * n + i] += load1(k->aux[0].dtype, pos, row * (size_t)n + (size_t)i);
    }
  }
  return FERRY_OK;
}

/* Rotate-half RoPE (HF apply_rotary_pos_emb) on q [m, heads*hd] and k [m, kv_heads*hd]. */
static ferry_status k_rope(const struct ferry_kernel *k) {
  const int64_t hd = k->head_dim, half = hd / 2;
  float *q = at(k->x);
  float *kk = k->aux[0].buf ? at(k->aux[0]) : NULL;
  for (int64_t t = 0; t < k->m; t++) {
    const double pos = (double)k->ints[t];
    for (int64_t i = 0; i < half; i++) {
      /* inv_freq as HF computes it in fp32, the angle in double for accuracy. */
      float inv_freq = (float)(1.0 / pow(k->theta, (double)(2 * i) / (double)hd));
      double ang = pos * (double)inv_freq;
      float c = (float)cos(ang), sn = (float)sin(ang);
      for (int64_t h = 0; h < k->heads; h++) {
        float *v = q + (t * k->heads + h) * hd;
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * sn;
        v[i + half] = x2 * c + x1 * sn;
      }
      if (kk)
        for (int64_t h = 0; h < k->kv_heads; h++) {
          float *v = kk + (t * k->kv_heads + h) * hd;
          float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c - x2 * sn;
          v[i + half] = x2 * c + x1 * sn;
        }
    }
  }
  return FERRY_OK;
}

/* Append each token's k and v at (slot, position) of the cache, then causal attention of each
 * query over positions [max(0, pos - window + 1), pos] of its slot. Cache layout per layer:
 * [slot][position][kv_head][head_dim] in the cache dtype. */
static ferry_status k_attention(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg, size_t len) {
  const int64_t H = k->heads, KV = k->kv_heads, hd = k->head_dim, cap = k->kv_capacity;
  const float *q = at(k->x);
  const float *knew = at(k->aux[0]), *vnew = at(k->aux[1]);
  void *kc = at(k->aux[2]), *vc = at(k->aux[3]);
  const enum ferry_dtype cdt = k->aux[2].dtype;
  float *out = at(k->y);
  const size_t row = (size_t)(KV * hd);
  for (int64_t t = 0; t < k->m; t++) {
    int32_t pos = k->ints[t], slot = k->ints2[t];
    if (pos < 0 || pos >= cap || slot < 0) {
      snprintf(msg, len, "attention: position %d outside the KV capacity %lld", pos, (long long)cap);
      return FERRY_ERR_RANGE;
    }
    size_t base = ((size_t)slot * (size_t)cap + (size_t)pos) * row;
    for (size_t i = 0; i < row; i++) {
      store1(cdt, kc, base + i, knew[(size_t)t * row + i]);
      store1(cdt, vc, base + i, vnew[(size_t)t * row + i]);
    }
  }
  /* Per (token, kv head): expand the visible K and V rows to fp32 once, then every query head
   * of the group is two BLAS matrix-vector products and a softmax. */
  float *kf = scratch(s, (size_t)cap * (size_t)hd * 2 + (size_t)cap);
  if (!kf) return FERRY_ERR_NOMEM;
  float *vf = kf + (size_t)cap * (size_t)hd, *scores = vf + (size_t)cap * (size_t)hd;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t group = H / KV;
  const size_t es = ferry_dtype_size(cdt);
  for (int64_t t = 0; t < k->m; t++) {
    int32_t pos = k->ints[t], slot = k->ints2[t];
    int64_t first = 0;
    if (k->sliding_window > 0 && pos - k->sliding_window + 1 > 0) first = pos - k->sliding_window + 1;
    const int64_t n = pos - first + 1;
    for (int64_t g = 0; g < KV; g++) {
      for (int64_t p = 0; p < n; p++) {
        size_t off = (((size_t)slot * (size_t)cap + (size_t)(first + p)) * (size_t)KV + (size_t)g) * (size_t)hd;
        to_f32(cdt, (const char *)kc + off * es, kf + p * hd, (size_t)hd);
        to_f32(cdt, (const char *)vc + off * es, vf + p * hd, (size_t)hd);
      }
      for (int64_t h = g * group; h < (g + 1) * group; h++) {
        const float *qh = q + (t * H + h) * hd;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)hd, scale, kf, (int)hd, qh, 1, 0.0f, scores, 1);
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t p = 0; p < n; p++) mx = scores[p] > mx ? scores[p] : mx;
        for (int64_t p = 0; p < n; p++) {
          scores[p] = expf(scores[p] - mx);
          sum += scores[p];
        }
        cblas_sgemv(CblasRowMajor, CblasTrans, (int)n, (int)hd, 1.0f / sum, vf, (int)hd, scores, 1, 0.0f,
                    out + (t * H + h) * hd, 1);
      }
    }
  }
  return FERRY_OK;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

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
    case FERRY_FN_GELU:
      for (size_t i = 0; i < n; i++) a[i] = 0.5f * a[i] * (1.0f + erff(a[i] * 0.70710678118654752f));
      break;
    case FERRY_FN_RELU:
      for (size_t i = 0; i < n; i++) a[i] = a[i] > 0 ? a[i] : 0;
      break;
  }
  return FERRY_OK;
}

/* Router: softmax over n expert logits (fp32), top-k by probability (ties to the lower
 * index), optionally renormalised to sum to one (Mixtral; Qwen2-MoE's norm_topk_prob). */
static ferry_status k_router(const struct ferry_kernel *k, struct ferry_host_scratch *s) {
  const int64_t E = k->n, K = k->top_k;
  const float *logits = at(k->x);
  float *wout = at(k->y);
  int32_t *ids = at(k->aux[0]);
  float *p = scratch(s, (size_t)E);
  if (!p) return FERRY_ERR_NOMEM;
  for (int64_t t = 0; t < k->m; t++) {
    const float *l = logits + t * E;
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int64_t e = 0; e < E; e++) {
      p[e] = expf(l[e] - mx);
      sum += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] /= sum;
    float chosen_sum = 0.0f;
    for (int64_t r = 0; r < K; r++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++) {
        if (p[e] < 0) continue; /* already taken */
        if (best < 0 || p[e] > p[best]) best = e;
      }
      ids[t * K + r] = (int32_t)best;
      wout[t * K + r] = p[best];
      chosen_sum += p[best];
      p[best] = -1.0f;
    }
    if (k->renormalize)
      for (int64_t r = 0; r < K; r++) wout[t * K + r] /= chosen_sum;
  }
  return FERRY_OK;
}

/* One routed expert over its tokens: gather rows of x, SwiGLU FFN, write each result to row
 * token*top_k + rank of y. Workspace: aux[2] gathered x, aux[3] gate, aux[4] up. */
static ferry_status k_expert(const struct ferry_kernel *k, struct ferry_host_scratch *s) {
  const int64_t m = k->m, inter = k->n, hidden = k->k;
  if (m == 0) return FERRY_OK;
  const float *x = at(k->x);
  float *xg = at(k->aux[2]), *g = at(k->aux[3]), *u = at(k->aux[4]);
  float *y = at(k->y);
  for (int64_t i = 0; i < m; i++) memcpy(xg + i * hidden, x + (int64_t)k->ints[i] * hidden, (size_t)hidden * 4);
  ferry_status st = matmul(xg, m, hidden, at(k->w), k->w.dtype, inter, NULL, 0, g, inter, 0, s);
  if (st == FERRY_OK) st = matmul(xg, m, hidden, at(k->aux[0]), k->aux[0].dtype, inter, NULL, 0, u, inter, 0, s);
  if (st != FERRY_OK) return st;
  for (int64_t i = 0; i < m * inter; i++) g[i] = silu(g[i]) * u[i];
  /* down projection into the gathered buffer, then scatter */
  st = matmul(g, m, inter, at(k->aux[1]), k->aux[1].dtype, hidden, NULL, 0, xg, hidden, 0, s);
  if (st != FERRY_OK) return st;
  for (int64_t i = 0; i < m; i++)
    memcpy(y + ((int64_t)k->ints[i] * k->top_k + k->ints2[i]) * hidden, xg + i * hidden, (size_t)hidden * 4);
  return FERRY_OK;
}

/* y[t] += sum_r w[t,r] * experts[t*K + r] (rank order) + sigmoid(gate[t]) * shared[t]. */
static ferry_status k_combine(const struct ferry_kernel *k) {
  const int64_t n = k->n, K = k->top_k;
  float *y = at(k->y);
  const float *eo = at(k->aux[0]), *w = at(k->aux[1]);
  const float *shared = k->aux[2].buf ? at(k->aux[2]) : NULL;
  const float *sgate = k->aux[3].buf ? at(k->aux[3]) : NULL;
  for (int64_t t = 0; t < k->m; t++) {
    float sg = sgate ? 1.0f / (1.0f + expf(-sgate[t])) : 1.0f;
    for (int64_t i = 0; i < n; i++) {
      float acc = 0.0f;
      for (int64_t r = 0; r < K; r++) acc += eo[(t * K + r) * n + i] * w[t * K + r];
      if (shared) acc += sg * shared[t * n + i];
      y[t * n + i] += acc;
    }
  }
  return FERRY_OK;
}

static ferry_status k_dequantize(const struct ferry_kernel *k, char *msg, size_t len) {
  struct ferry_qspec spec = {(enum ferry_qformat)k->qformat, k->qgroup};
  struct ferry_qview view;
  for (int p = 0; p < FERRY_QPART_COUNT; p++) view.part[p] = k->aux[p].buf ? at(k->aux[p]) : NULL;
  ferry_status st = ferry_quant_dequantize_rows(&spec, &view, k->n, k->k, 0, k->n, at(k->y));
  if (st != FERRY_OK) snprintf(msg, len, "%s: %s", k->name, ferry_last_error());
  return st;
}

static ferry_status k_gather(const struct ferry_kernel *k) {
  const float *x = at(k->x);
  float *y = at(k->y);
  for (int64_t i = 0; i < k->m; i++) memcpy(y + i * k->n, x + (int64_t)k->ints[i] * k->n, (size_t)k->n * 4);
  return FERRY_OK;
}

ferry_status ferry__host_kernel_run(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg,
                                    size_t len) {
  msg[0] = '\0';
  if ((k->kind == FERRY_K_MATMUL || k->kind == FERRY_K_EXPERT) && !supported_weight(k->w.dtype)) {
    snprintf(msg, len, "%s: weights of dtype %s need a dequantize op first", k->name, ferry_dtype_name(k->w.dtype));
    return FERRY_ERR_UNSUPPORTED;
  }
  ferry_status st;
  switch (k->kind) {
    case FERRY_K_EMBED: return k_embed(k, msg, len);
    case FERRY_K_NORM: return k_norm(k);
    case FERRY_K_MATMUL: st = k_matmul(k, s); break;
    case FERRY_K_ROPE: return k_rope(k);
    case FERRY_K_ATTENTION: st = k_attention(k, s, msg, len); break;
    case FERRY_K_SWIGLU: return k_activation(k);
    case FERRY_K_ROUTER: st = k_router(k, s); break;
    case FERRY_K_EXPERT: st = k_expert(k, s); break;
    case FERRY_K_MOE_COMBINE: return k_combine(k);
    case FERRY_K_GATHER_ROWS: return k_gather(k);
    case FERRY_K_DEQUANTIZE: return k_dequantize(k, msg, len);
    default:
      snprintf(msg, len, "%s: kernel kind %s is not implemented by the host executor", k->name,
               ferry_kernel_kind_name(k->kind));
      return FERRY_ERR_UNSUPPORTED;
  }
  if (st == FERRY_ERR_NOMEM && !msg[0]) snprintf(msg, len, "%s: out of memory for scratch", k->name);
  return st;
}
