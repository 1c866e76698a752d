/* Quality metrics for quantized weights and the logits they produce: relative Frobenius error,
 * cosine similarity and KL divergence of softmax distributions. Accumulated in double so the
 * figures are not limited by fp32 summation over millions of elements. */
#include <math.h>

#include "ferry/quant.h"

double ferry_quant_error(const float *src, const float *rec, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)src[i] - (double)rec[i];
    num += d * d;
    den += (double)src[i] * (double)src[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return sqrt(num / den);
}

double ferry_quant_cosine(const float *a, const float *b, size_t n) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (size_t i = 0; i < n; i++) {
    ab += (double)a[i] * (double)b[i];
    aa += (double)a[i] * (double)a[i];
    bb += (double)b[i] * (double)b[i];
  }
  if (aa == 0.0 && bb == 0.0) return 1.0;
  if (aa == 0.0 || bb == 0.0) return 0.0;
  double c = ab / (sqrt(aa) * sqrt(bb));
  return c > 1.0 ? 1.0 : c < -1.0 ? -1.0 : c;
}

/* log(sum(exp(x))) with the maximum factored out; -INFINITY entries contribute nothing. */
static double log_sum_exp(const float *x, size_t n, double *max_out) {
  double m = -INFINITY;
  for (size_t i = 0; i < n; i++) m = (double)x[i] > m ? (double)x[i] : m;
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += exp((double)x[i] - m);
  *max_out = m;
  return m + log(s);
}

double ferry_quant_kl_logits(const float *ref_logits, const float *q_logits, size_t n) {
  if (n == 0) return 0.0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(ref_logits[i]) || isnan(q_logits[i]) || ref_logits[i] == INFINITY ||
        q_logits[i] == INFINITY)
      return NAN;
  }
  double mr, mq;
  double lse_r = log_sum_exp(ref_logits, n, &mr);
  double lse_q = log_sum_exp(q_logits, n, &mq);
  if (mr == -INFINITY || mq == -INFINITY) return NAN; /* no distribution at all */
  double kl = 0.0;
  for (size_t i = 0; i < n; i++) {
    double lp = (double)ref_logits[i] - lse_r;
    if (lp == -INFINITY) continue; /* p = 0 contributes 0 */
    double lq = (double)q_logits[i] - lse_q;
    if (lq == -INFINITY) return INFINITY;
    kl += exp(lp) * (lp - lq);
  }
  return kl > 0.0 ? kl : 0.0;
}
