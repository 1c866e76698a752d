/* The mlp3 / mlp7 expert predictors' network: forward pass, storage-dtype rounding, feature
 * definitions and deterministic Adam training on routing samples. Plain loops in a fixed
 * order (no BLAS, no threads) so a seed always gives the same bytes. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/half.h"
#include "common/rng.h"
#include "ferry/predict.h"

/* All arrays live in one allocation, in struct order from in_mean: the trainable ones
 * (w1 .. b3) are contiguous, which lets Adam treat them as one vector. */
static size_t n_out(const struct ferry_mlp *m) { return (size_t)m->n_layers * (size_t)m->n_experts; }

static size_t n_params(const struct ferry_mlp *m) {
  return (size_t)FERRY_MLP_H1 * ((size_t)m->n_in + 1) + (size_t)FERRY_MLP_H2 * (FERRY_MLP_H1 + 1) +
         n_out(m) * (FERRY_MLP_H2 + 1);
}

static ferry_status alloc_mlp(struct ferry_mlp *m, enum ferry_predictor_kind variant, int32_t n_layers,
                              int32_t n_experts) {
  memset(m, 0, sizeof *m);
  if (variant != FERRY_PREDICTOR_MLP3 && variant != FERRY_PREDICTOR_MLP7)
    return ferry__fail(FERRY_ERR_INVALID, "mlp: variant %s is not mlp3 or mlp7", ferry_predictor_kind_name(variant));
  if (n_layers < 1 || n_experts < 1 || (int64_t)n_layers * n_experts > (1 << 24))
    return ferry__fail(FERRY_ERR_INVALID, "mlp: %d layers x %d experts is outside [1, 2^24] outputs", n_layers,
                       n_experts);
  m->variant = variant;
  m->n_in = variant == FERRY_PREDICTOR_MLP3 ? FERRY_MLP3_FEATURES : FERRY_MLP7_FEATURES;
  m->n_layers = n_layers;
  m->n_experts = n_experts;
  size_t total = 2 * (size_t)m->n_in + n_params(m);
  float *b = ferry__calloc(total, sizeof *b);
  if (!b) return ferry__fail(FERRY_ERR_NOMEM, "mlp: out of memory for %zu parameters", total);
  m->in_mean = b;
  m->in_scale = m->in_mean + m->n_in;
  m->w1 = m->in_scale + m->n_in;
  m->b1 = m->w1 + FERRY_MLP_H1 * m->n_in;
  m->w2 = m->b1 + FERRY_MLP_H1;
  m->b2 = m->w2 + FERRY_MLP_H2 * FERRY_MLP_H1;
  m->w3 = m->b2 + FERRY_MLP_H2;
  m->b3 = m->w3 + n_out(m) * FERRY_MLP_H2;
  return FERRY_OK;
}

static void he_uniform(struct ferry_rng *rng, float *w, size_t n, int32_t fan_in) {
  double lim = sqrt(6.0 / fan_in);
  for (size_t i = 0; i < n; i++) w[i] = (float)((2 * ferry__rng_uniform(rng) - 1) * lim);
}

ferry_status ferry_mlp_init(struct ferry_mlp *m, enum ferry_predictor_kind variant, int32_t n_layers,
                            int32_t n_experts, uint64_t seed) {
  if (!m) return ferry__fail(FERRY_ERR_INVALID, "ferry_mlp_init: NULL mlp");
  ferry_status st = alloc_mlp(m, variant, n_layers, n_experts);
  if (st != FERRY_OK) return st;
  for (int32_t i = 0; i < m->n_in; i++) m->in_scale[i] = 1;
  struct ferry_rng rng;
  ferry__rng_seed(&rng, seed);
  he_uniform(&rng, m->w1, (size_t)FERRY_MLP_H1 * (size_t)m->n_in, m->n_in);
  he_uniform(&rng, m->w2, (size_t)FERRY_MLP_H2 * FERRY_MLP_H1, FERRY_MLP_H1);
  he_uniform(&rng, m->w3, n_out(m) * FERRY_MLP_H2, FERRY_MLP_H2);
  return FERRY_OK;
}

void ferry_mlp_free(struct ferry_mlp *m) {
  if (!m) return;
  ferry_free(m->in_mean);
  memset(m, 0, sizeof *m);
}

ferry_status ferry_mlp_copy(struct ferry_mlp *dst, const struct ferry_mlp *src) {
  if (!dst || !src || !src->in_mean) return ferry__fail(FERRY_ERR_INVALID, "ferry_mlp_copy: empty MLP");
  ferry_status st = alloc_mlp(dst, src->variant, src->n_layers, src->n_experts);
  if (st != FERRY_OK) return st;
  /* The source may come from ferry_mlp_init() (one block) or be assembled by hand. */
  memcpy(dst->in_mean, src->in_mean, (size_t)src->n_in * sizeof(float));
  memcpy(dst->in_scale, src->in_scale, (size_t)src->n_in * sizeof(float));
  memcpy(dst->w1, src->w1, (size_t)FERRY_MLP_H1 * (size_t)src->n_in * sizeof(float));
  memcpy(dst->b1, src->b1, FERRY_MLP_H1 * sizeof(float));
  memcpy(dst->w2, src->w2, (size_t)FERRY_MLP_H2 * FERRY_MLP_H1 * sizeof(float));
  memcpy(dst->b2, src->b2, FERRY_MLP_H2 * sizeof(float));
  memcpy(dst->w3, src->w3, n_out(src) * FERRY_MLP_H2 * sizeof(float));
  memcpy(dst->b3, src->b3, n_out(src) * sizeof(float));
  return FERRY_OK;
}

/* Hidden activations for one input. */
static void hidden(const struct ferry_mlp *m, const float *x, float *z, float *h1, float *h2) {
  for (int32_t i = 0; i < m->n_in; i++) z[i] = (x[i] - m->in_mean[i]) * m->in_scale[i];
  for (int32_t j = 0; j < FERRY_MLP_H1; j++) {
    float a = m->b1[j];
    for (int32_t i = 0; i < m->n_in; i++) a += m->w1[j * m->n_in + i] * z[i];
    h1[j] = a > 0 ? a : 0;
  }
  for (int32_t j = 0; j < FERRY_MLP_H2; j++) {
    float a = m->b2[j];
    for (int32_t i = 0; i < FERRY_MLP_H1; i++) a += m->w2[j * FERRY_MLP_H1 + i] * h1[i];
    h2[j] = a > 0 ? a : 0;
  }
}

static float out_logit(const struct ferry_mlp *m, const float *h2, size_t o) {
  float a = m->b3[o];
  const float *w = m->w3 + o * FERRY_MLP_H2;
  for (int32_t i = 0; i < FERRY_MLP_H2; i++) a += w[i] * h2[i];
  return a;
}

void ferry_mlp_forward(const struct ferry_mlp *m, const float *x, int32_t layer, float *logits) {
  float z[FERRY_MLP7_FEATURES], h1[FERRY_MLP_H1], h2[FERRY_MLP_H2];
  hidden(m, x, z, h1, h2);
  size_t base = (size_t)layer * (size_t)m->n_experts;
  for (int32_t e = 0; e < m->n_experts; e++) logits[e] = out_logit(m, h2, base + (size_t)e);
}

static void round_f16(float *w, size_t n) {
  for (size_t i = 0; i < n; i++) w[i] = ferry__f16_to_f32(ferry__f32_to_f16(w[i]));
}

static void round_i8_rows(float *w, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; r++) {
    float *row = w + r * cols, mx = 0;
    for (size_t c = 0; c < cols; c++) mx = fabsf(row[c]) > mx ? fabsf(row[c]) : mx;
    if (mx == 0) continue;
    float scale = mx / 127.0f;
    for (size_t c = 0; c < cols; c++) {
      float q = nearbyintf(row[c] / scale);
      q = q > 127 ? 127 : q < -127 ? -127 : q;
      row[c] = q * scale;
    }
  }
}

ferry_status ferry_mlp_quantize(struct ferry_mlp *m, enum ferry_dtype dtype) {
  if (!m || !m->in_mean) return ferry__fail(FERRY_ERR_INVALID, "ferry_mlp_quantize: empty MLP");
  switch (dtype) {
  case FERRY_DTYPE_F32:
    return FERRY_OK;
  case FERRY_DTYPE_F16:
    round_f16(m->w1, (size_t)FERRY_MLP_H1 * (size_t)m->n_in);
    round_f16(m->b1, FERRY_MLP_H1);
    round_f16(m->w2, (size_t)FERRY_MLP_H2 * FERRY_MLP_H1);
    round_f16(m->b2, FERRY_MLP_H2);
    round_f16(m->w3, n_out(m) * FERRY_MLP_H2);
    round_f16(m->b3, n_out(m));
    return FERRY_OK;
  case FERRY_DTYPE_I8:
    round_i8_rows(m->w1, FERRY_MLP_H1, (size_t)m->n_in);
    round_i8_rows(m->w2, FERRY_MLP_H2, FERRY_MLP_H1);
    round_i8_rows(m->w3, n_out(m), FERRY_MLP_H2);
    return FERRY_OK;
  default:
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "mlp: weights in %s are not supported (fp32, fp16 or int8)",
                       ferry_dtype_name(dtype));
  }
}

/* ---- features ---------------------------------------------------------------------------- */

static float lognorm(double n) { return (float)(log1p(n > 0 ? n : 0) / log1p((double)FERRY_MLP_MAX_SEQ)); }

void ferry_predictor_features_mlp3(float hidden_l2, float emb_var5, int32_t seq_len, float out[FERRY_MLP3_FEATURES]) {
  out[0] = hidden_l2;
  out[1] = emb_var5;
  out[2] = lognorm(seq_len);
}

static void mean_spread(const float *v, int32_t n, float *mean, float *spread) {
  double s = 0, ss = 0;
  for (int32_t i = 0; i < n; i++) s += v[i];
  double mu = n > 0 ? s / n : 0;
  for (int32_t i = 0; i < n; i++) ss += (v[i] - mu) * (v[i] - mu);
  *mean = (float)mu;
  *spread = n > 1 ? (float)sqrt(ss / n) : 0.0f;
}

void ferry_predictor_features_mlp7(const float *hidden_l2, const float *emb_var, int32_t n, int32_t seq_len,
                                   int32_t token_idx, float out[FERRY_MLP7_FEATURES]) {
  mean_spread(hidden_l2, n, &out[0], &out[1]);
  mean_spread(emb_var, n, &out[2], &out[3]);
  out[4] = lognorm(seq_len);
  out[5] = lognorm(token_idx / FERRY_MLP_SEGMENT_TOKENS);
  out[6] = (float)(token_idx % FERRY_MLP_SEGMENT_TOKENS) / FERRY_MLP_SEGMENT_TOKENS;
}

void ferry_predictor_features_derived(enum ferry_predictor_kind variant, int32_t token_idx, int32_t seq_len,
                                      float *out) {
  if (variant == FERRY_PREDICTOR_MLP7) {
    out[0] = out[1] = out[2] = out[3] = 0;
    out[4] = lognorm(seq_len);
    out[5] = lognorm(token_idx / FERRY_MLP_SEGMENT_TOKENS);
    out[6] = (float)(token_idx % FERRY_MLP_SEGMENT_TOKENS) / FERRY_MLP_SEGMENT_TOKENS;
  } else {
    out[0] = lognorm((double)token_idx + 1);
    out[1] = 0;
    out[2] = lognorm(seq_len);
  }
}

/* ---- training ---------------------------------------------------------------------------- */

static int shapes_match(const struct ferry_mlp *m, const struct ferry_mlp_dataset *d) {
  return m && m->in_mean && d && d->n >= 0 && (d->n == 0 || (d->x && d->y)) && d->n_features == m->n_in &&
         d->n_layers == m->n_layers && d->top_k >= 1 && d->top_k <= m->n_experts;
}

/* Whether expert e is in the k targets. */
static int is_target(const int32_t *y, int32_t k, int32_t e) {
  for (int32_t i = 0; i < k; i++)
    if (y[i] == e) return 1;
  return 0;
}

/* Numerically stable binary cross-entropy with logits. */
static double bce(double z, int t) { return (z > 0 ? z : 0) - (t ? z : 0) + log1p(exp(-fabs(z))); }

double ferry_mlp_loss(const struct ferry_mlp *m, const struct ferry_mlp_dataset *d) {
  if (!shapes_match(m, d)) return NAN;
  float z[FERRY_MLP7_FEATURES], h1[FERRY_MLP_H1], h2[FERRY_MLP_H2];
  double sum = 0;
  int64_t count = 0;
  for (int64_t s = 0; s < d->n; s++) {
    hidden(m, d->x + s * d->n_features, z, h1, h2);
    for (int32_t l = 0; l < m->n_layers; l++) {
      const int32_t *y = d->y + ((size_t)s * (size_t)d->n_layers + (size_t)l) * (size_t)d->top_k;
      if (y[0] < 0) continue;
      for (int32_t e = 0; e < m->n_experts; e++)
        sum += bce(out_logit(m, h2, (size_t)l * (size_t)m->n_experts + (size_t)e), is_target(y, d->top_k, e));
      count += m->n_experts;
    }
  }
  return count ? sum / (double)count : NAN;
}

/* Standardise each feature to mean 0 and deviation 1 over the data (deviation 0: scale 1). */
static void fit_standardisation(struct ferry_mlp *m, const struct ferry_mlp_dataset *d) {
  for (int32_t i = 0; i < m->n_in; i++) {
    double s = 0, ss = 0;
    for (int64_t j = 0; j < d->n; j++) s += d->x[j * d->n_features + i];
    double mu = d->n ? s / (double)d->n : 0;
    for (int64_t j = 0; j < d->n; j++) {
      double v = d->x[j * d->n_features + i] - mu;
      ss += v * v;
    }
    double sd = d->n ? sqrt(ss / (double)d->n) : 0;
    m->in_mean[i] = (float)mu;
    m->in_scale[i] = sd > 1e-6 ? (float)(1.0 / sd) : 1.0f;
  }
}

ferry_status ferry_mlp_train(struct ferry_mlp *m, const struct ferry_mlp_dataset *d,
                             const struct ferry_mlp_train_config *cfg, double *epoch_loss) {
  if (!shapes_match(m, d) || !cfg)
    return ferry__fail(FERRY_ERR_INVALID, "mlp train: the data (%d features, %d layers) does not match the MLP "
                       "(%d features, %d layers)", d ? d->n_features : 0, d ? d->n_layers : 0, m ? m->n_in : 0,
                       m ? m->n_layers : 0);
  int32_t epochs = cfg->epochs > 0 ? cfg->epochs : 10;
  int32_t batch = cfg->batch > 0 ? cfg->batch : 32;
  double lr = cfg->lr > 0 ? cfg->lr : 1e-2;
  if (d->n == 0) return ferry__fail(FERRY_ERR_INVALID, "mlp train: no samples");
  size_t P = n_params(m), O = n_out(m);
  float *grad = ferry__calloc(P, sizeof *grad);
  double *adam_m = ferry__calloc(P, sizeof *adam_m), *adam_v = ferry__calloc(P, sizeof *adam_v);
  int64_t *order = ferry__calloc((size_t)d->n, sizeof *order);
  ferry_status st = FERRY_OK;
  if (!grad || !adam_m || !adam_v || !order) {
    st = ferry__fail(FERRY_ERR_NOMEM, "mlp train: out of memory for %zu parameters", P);
    goto out_free;
  }
  fit_standardisation(m, d);
  float *g_w1 = grad, *g_b1 = g_w1 + FERRY_MLP_H1 * m->n_in, *g_w2 = g_b1 + FERRY_MLP_H1,
        *g_b2 = g_w2 + FERRY_MLP_H2 * FERRY_MLP_H1, *g_w3 = g_b2 + FERRY_MLP_H2, *g_b3 = g_w3 + O * FERRY_MLP_H2;
  float *param = m->w1; /* w1 .. b3 are contiguous (alloc_mlp) */
  struct ferry_rng rng;
  ferry__rng_seed(&rng, cfg->seed);
  for (int64_t i = 0; i < d->n; i++) order[i] = i;
  int64_t step = 0;
  for (int32_t ep = 0; ep < epochs; ep++) {
    for (int64_t i = d->n - 1; i > 0; i--) {
      int64_t j = (int64_t)ferry__rng_below(&rng, (uint64_t)i + 1);
      int64_t t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    for (int64_t b0 = 0; b0 < d->n; b0 += batch) {
      int64_t b1 = b0 + batch < d->n ? b0 + batch : d->n;
      memset(grad, 0, P * sizeof *grad);
      int64_t outputs = 0;
      for (int64_t bi = b0; bi < b1; bi++) {
        const int32_t *ys = d->y + (size_t)order[bi] * (size_t)d->n_layers * (size_t)d->top_k;
        for (int32_t l = 0; l < m->n_layers; l++) outputs += ys[(size_t)l * (size_t)d->top_k] >= 0 ? m->n_experts : 0;
      }
      if (!outputs) continue;
      float inv = 1.0f / (float)outputs;
      for (int64_t bi = b0; bi < b1; bi++) {
        int64_t s = order[bi];
        const int32_t *ys = d->y + (size_t)s * (size_t)d->n_layers * (size_t)d->top_k;
        float z[FERRY_MLP7_FEATURES], h1[FERRY_MLP_H1], h2[FERRY_MLP_H2], dh1[FERRY_MLP_H1] = {0},
                                                                          dh2[FERRY_MLP_H2] = {0};
        hidden(m, d->x + s * d->n_features, z, h1, h2);
        for (int32_t l = 0; l < m->n_layers; l++) {
          const int32_t *y = ys + (size_t)l * (size_t)d->top_k;
          if (y[0] < 0) continue;
          for (int32_t e = 0; e < m->n_experts; e++) {
            size_t o = (size_t)l * (size_t)m->n_experts + (size_t)e;
            float zl = out_logit(m, h2, o);
            float p = 1.0f / (1.0f + expf(-zl));
            float g = (p - (float)is_target(y, d->top_k, e)) * inv;
            const float *w = m->w3 + o * FERRY_MLP_H2;
            float *gw = g_w3 + o * FERRY_MLP_H2;
            for (int32_t i = 0; i < FERRY_MLP_H2; i++) {
              gw[i] += g * h2[i];
              dh2[i] += g * w[i];
            }
            g_b3[o] += g;
          }
        }
        for (int32_t j = 0; j < FERRY_MLP_H2; j++) {
          if (h2[j] <= 0) continue;
          for (int32_t i = 0; i < FERRY_MLP_H1; i++) {
            g_w2[j * FERRY_MLP_H1 + i] += dh2[j] * h1[i];
            dh1[i] += dh2[j] * m->w2[j * FERRY_MLP_H1 + i];
          }
          g_b2[j] += dh2[j];
        }
        for (int32_t j = 0; j < FERRY_MLP_H1; j++) {
          if (h1[j] <= 0) continue;
          for (int32_t i = 0; i < m->n_in; i++) g_w1[j * m->n_in + i] += dh1[j] * z[i];
          g_b1[j] += dh1[j];
        }
      }
      step++;
      double c1 = 1 - pow(0.9, (double)step), c2 = 1 - pow(0.999, (double)step);
      for (size_t i = 0; i < P; i++) {
        adam_m[i] = 0.9 * adam_m[i] + 0.1 * grad[i];
        adam_v[i] = 0.999 * adam_v[i] + 0.001 * (double)grad[i] * grad[i];
        param[i] -= (float)(lr * (adam_m[i] / c1) / (sqrt(adam_v[i] / c2) + 1e-8));
      }
    }
    if (epoch_loss) epoch_loss[ep] = ferry_mlp_loss(m, d);
  }
out_free:
  ferry_free(grad);
  ferry_free(adam_m);
  ferry_free(adam_v);
  ferry_free(order);
  return st;
}
