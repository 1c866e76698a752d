/* Host kernels of Mixture-of-Experts layers: the routers of each family (softmax top-k,
 * top-k then softmax, DeepSeek's group-limited sigmoid and softmax gates, Llama 4's sigmoid
 * top-1, Phi-3.5-MoE's sparsemixer), one routed expert's FFN in every stored layout, and the
 * weighted combine. Ties always go to the lower expert index, as torch.topk does here. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host_kernels.h"

#define at ferry__host_at

/* The index of the largest value among those not yet taken (-INFINITY marks taken). */
static int64_t argmax(const float *v, int64_t n) {
  int64_t best = -1;
  for (int64_t e = 0; e < n; e++)
    if (v[e] != -INFINITY && (best < 0 || v[e] > v[best])) best = e;
  return best;
}

/* top-k of v (n values) into ids; v is consumed */
static void topk(float *v, int64_t n, int64_t K, int32_t *ids) {
  for (int64_t r = 0; r < K; r++) {
    int64_t b = argmax(v, n);
    ids[r] = (int32_t)b;
    v[b] = -INFINITY;
  }
}

/* DeepSeek group-limited selection: the topk_group groups with the best score (the group's max,
 * or the sum of its top two for V3) keep their experts, the others' choice scores become 0. */
static void limit_groups(float *choice, int64_t E, int64_t groups, int64_t keep, int top2, float *gscore) {
  const int64_t per = E / groups;
  for (int64_t g = 0; g < groups; g++) {
    float a = -INFINITY, b = -INFINITY;
    for (int64_t e = g * per; e < (g + 1) * per; e++) {
      if (choice[e] > a) {
        b = a;
        a = choice[e];
      } else if (choice[e] > b) {
        b = choice[e];
      }
    }
    gscore[g] = top2 ? a + b : a;
  }
  int32_t kept[64];
  int64_t nk = keep < 64 ? keep : 64;
  topk(gscore, groups, nk, kept);
  for (int64_t g = 0; g < groups; g++) {
    int on = 0;
    for (int64_t i = 0; i < nk; i++) on |= kept[i] == g;
    if (!on)
      for (int64_t e = g * per; e < (g + 1) * per; e++) choice[e] = 0.0f;
  }
}

/* Phi-3.5-MoE's sparsemixer in inference: each pick is the best remaining logit, weighted by a
 * softmax over the logits within 2 * eps (relative) of it. */
static void sparsemixer(const float *l, int64_t E, float eps, float *p, int32_t *ids, float *w) {
  memcpy(p, l, (size_t)E * sizeof *p);
  for (int r = 0; r < 2; r++) {
    /* the first pick scores all experts, the second all but the first pick */
    int64_t top = argmax(p, E);
    const float mx = p[top];
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
      const float factor = fabsf(l[e]) > mx ? fabsf(l[e]) : mx;
      const int masked = p[e] == -INFINITY || (mx - l[e]) / factor > 2 * eps;
      if (!masked) sum += expf(l[e] - mx);
    }
    ids[r] = (int32_t)top;
    w[r] = 1.0f / sum; /* exp(mx - mx) / sum */
    p[top] = -INFINITY;
  }
}

ferry_status ferry__host_router(const struct ferry_kernel *k, struct ferry_host_scratch *s, char *msg, size_t len) {
  const int64_t E = k->n, K = k->top_k;
  const float *logits = at(k->x);
  float *wout = at(k->y);
  int32_t *ids = at(k->aux[0]);
  const void *bias = k->aux[1].buf ? at(k->aux[1]) : NULL;
  const float scaling = k->routed_scale != 0 ? k->routed_scale : 1.0f;
  if (K > E || K < 1 || (k->n_group > 1 && E % k->n_group)) {
    snprintf(msg, len, "%s: %lld of %lld experts in %lld groups cannot be routed", k->name, (long long)K, (long long)E,
             (long long)k->n_group);
    return FERRY_ERR_INVALID;
  }
  float *p = ferry__host_scratch(s, (size_t)E * 3 + 64);
  if (!p) return FERRY_ERR_NOMEM;
  float *prob = p + E, *gscore = prob + E;
  for (int64_t t = 0; t < k->m; t++) {
    const float *l = logits + t * E;
    int32_t *id = ids + t * K;
    float *w = wout + t * K;
    switch ((enum ferry_router_kind)k->router_kind) {
      case FERRY_ROUTER_SOFTMAX_TOPK:
      case FERRY_ROUTER_SOFTMAX_GROUP: {
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int64_t e = 0; e < E; e++) sum += (prob[e] = expf(l[e] - mx));
        for (int64_t e = 0; e < E; e++) p[e] = prob[e] /= sum;
        if (k->router_kind == FERRY_ROUTER_SOFTMAX_GROUP && k->n_group > 1)
          limit_groups(p, E, k->n_group, k->topk_group, 0, gscore);
        topk(p, E, K, id);
        float chosen = 0.0f;
        for (int64_t r = 0; r < K; r++) chosen += (w[r] = prob[id[r]]);
        if (k->router_kind == FERRY_ROUTER_SOFTMAX_TOPK) {
          if (k->renormalize)
            for (int64_t r = 0; r < K; r++) w[r] /= chosen;
        } else if (K > 1 && k->renormalize) { /* DeepSeek-V2: normalise, or else scale */
          for (int64_t r = 0; r < K; r++) w[r] /= chosen + 1e-20f;
        } else {
          for (int64_t r = 0; r < K; r++) w[r] *= scaling;
        }
        break;
      }
      case FERRY_ROUTER_SIGMOID_GROUP: { /* DeepSeek-V3 noaux_tc */
        for (int64_t e = 0; e < E; e++) {
          prob[e] = 1.0f / (1.0f + expf(-l[e]));
          p[e] = prob[e] + (bias ? ferry__host_load1(k->aux[1].dtype, bias, (size_t)e) : 0.0f);
        }
        if (k->n_group > 1) limit_groups(p, E, k->n_group, k->topk_group, 1, gscore);
        topk(p, E, K, id);
        float chosen = 0.0f;
        for (int64_t r = 0; r < K; r++) chosen += (w[r] = prob[id[r]]);
        for (int64_t r = 0; r < K; r++) w[r] = (k->renormalize ? w[r] / (chosen + 1e-20f) : w[r]) * scaling;
        break;
      }
      case FERRY_ROUTER_TOPK_SOFTMAX: { /* gpt-oss: softmax over the chosen logits */
        memcpy(p, l, (size_t)E * sizeof *p);
        topk(p, E, K, id);
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t r = 0; r < K; r++) mx = l[id[r]] > mx ? l[id[r]] : mx;
        for (int64_t r = 0; r < K; r++) sum += (w[r] = expf(l[id[r]] - mx));
        for (int64_t r = 0; r < K; r++) w[r] /= sum;
        break;
      }
      case FERRY_ROUTER_SIGMOID_TOP1: { /* Llama 4 */
        memcpy(p, l, (size_t)E * sizeof *p);
        topk(p, E, K, id);
        for (int64_t r = 0; r < K; r++) w[r] = 1.0f / (1.0f + expf(-l[id[r]]));
        break;
      }
      case FERRY_ROUTER_SPARSEMIXER:
        if (K != 2) {
          snprintf(msg, len, "%s: sparsemixer routes to 2 experts, not %lld", k->name, (long long)K);
          return FERRY_ERR_INVALID;
        }
        sparsemixer(l, E, k->jitter, p, id, w);
        break;
      default:
        snprintf(msg, len, "%s: unknown router kind %d", k->name, k->router_kind);
        return FERRY_ERR_INVALID;
    }
  }
  return FERRY_OK;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* One routed expert over its tokens: gather rows of x (scaled by their gate weight for Llama
 * 4), the gated FFN in the expert's stored layout, each result to row token*top_k + rank of y.
 * Workspace: aux[2] gathered x, aux[3] gate (or fused gate_up), aux[4] up. */
ferry_status ferry__host_expert(const struct ferry_kernel *k, struct ferry_host_scratch *s) {
  const int64_t m = k->m, inter = k->n, hidden = k->k;
  if (m == 0) return FERRY_OK;
  const float *x = at(k->x);
  float *xg = at(k->aux[2]), *g = at(k->aux[3]), *u = at(k->aux[4]);
  float *y = at(k->y);
  const float *gate_w = k->scale_input ? (const float *)at(k->aux[5]) : NULL;
  for (int64_t i = 0; i < m; i++) {
    memcpy(xg + i * hidden, x + (int64_t)k->ints[i] * hidden, (size_t)hidden * 4);
    if (gate_w) {
      const float wt = gate_w[(int64_t)k->ints[i] * k->top_k + k->ints2[i]];
      for (int64_t j = 0; j < hidden; j++) xg[i * hidden + j] *= wt;
    }
  }
  ferry_status st;
  const int tg = k->w_trans & FERRY_EXPERT_W_TRANS_GATE, td = k->w_trans & FERRY_EXPERT_W_TRANS_DOWN;
  if (k->expert_layout == FERRY_EXPERTS_SPLIT) {
    st = ferry__host_matmul(xg, m, hidden, at(k->w), k->w.dtype, inter, NULL, 0, g, inter, 0, s);
    if (st == FERRY_OK) st = ferry__host_matmul(xg, m, hidden, at(k->aux[0]), k->aux[0].dtype, inter, NULL, 0, u, inter, 0, s);
    if (st != FERRY_OK) return st;
    for (int64_t i = 0; i < m * inter; i++) g[i] = silu(g[i]) * u[i];
  } else {
    /* fused gate_up [m, 2I]: halves (Llama 4) or alternating columns with a bias and the
     * clamped SwiGLU of gpt-oss: (up + 1) * gate * sigmoid(1.702 gate) */
    const int64_t w2 = 2 * inter;
    if (tg)
      st = ferry__host_matmul_t(xg, m, hidden, at(k->w), k->w.dtype, w2, g, w2, 0, s);
    else
      st = ferry__host_matmul(xg, m, hidden, at(k->w), k->w.dtype, w2, NULL, 0, g, w2, 0, s);
    if (st != FERRY_OK) return st;
    const void *gb = k->aux[6].buf ? at(k->aux[6]) : NULL;
    const int inter_leaved = k->expert_layout == FERRY_EXPERTS_FUSED_INTERLEAVED;
    const float lim = k->swiglu_limit;
    for (int64_t i = 0; i < m; i++) {
      float *row = g + i * w2;
      if (gb)
        for (int64_t j = 0; j < w2; j++) row[j] += ferry__host_load1(k->aux[6].dtype, gb, (size_t)j);
      for (int64_t j = 0; j < inter; j++) {
        float a = inter_leaved ? row[2 * j] : row[j], b = inter_leaved ? row[2 * j + 1] : row[inter + j];
        float v;
        if (lim > 0) {
          a = a < lim ? a : lim;
          b = b < -lim ? -lim : b > lim ? lim : b;
          v = (b + 1.0f) * (a / (1.0f + expf(-1.702f * a)));
        } else {
          v = silu(a) * b;
        }
        u[i * inter + j] = v;
      }
    }
    memcpy(g, u, (size_t)(m * inter) * sizeof(float));
  }
  /* down projection into the gathered buffer, then scatter */
  if (td)
    st = ferry__host_matmul_t(g, m, inter, at(k->aux[1]), k->aux[1].dtype, hidden, xg, hidden, 0, s);
  else
    st = ferry__host_matmul(g, m, inter, at(k->aux[1]), k->aux[1].dtype, hidden, NULL, 0, xg, hidden, 0, s);
  if (st != FERRY_OK) return st;
  const void *db = k->aux[7].buf ? at(k->aux[7]) : NULL;
  for (int64_t i = 0; i < m; i++) {
    float *dst = y + ((int64_t)k->ints[i] * k->top_k + k->ints2[i]) * hidden;
    memcpy(dst, xg + i * hidden, (size_t)hidden * 4);
    if (db)
      for (int64_t j = 0; j < hidden; j++) dst[j] += ferry__host_load1(k->aux[7].dtype, db, (size_t)j);
  }
  return FERRY_OK;
}

/* y[t] += sum_r w[t,r] * experts[t*K + r] (rank order; weight 1 without weights) +
 * sigmoid(gate[t]) * shared[t]. */
ferry_status ferry__host_combine(const struct ferry_kernel *k) {
  const int64_t n = k->n, K = k->top_k;
  float *y = at(k->y);
  const float *eo = k->aux[0].buf ? at(k->aux[0]) : NULL, *w = k->aux[1].buf ? at(k->aux[1]) : NULL;
  const float *shared = k->aux[2].buf ? at(k->aux[2]) : NULL;
  const float *sgate = k->aux[3].buf ? at(k->aux[3]) : NULL;
  for (int64_t t = 0; t < k->m; t++) {
    float sg = sgate ? 1.0f / (1.0f + expf(-sgate[t])) : 1.0f;
    for (int64_t i = 0; i < n; i++) {
      float acc = 0.0f;
      for (int64_t r = 0; r < K; r++) acc += eo[(t * K + r) * n + i] * (w ? w[t * K + r] : 1.0f);
      if (shared) acc += sg * shared[t * n + i];
      y[t * n + i] += acc;
    }
  }
  return FERRY_OK;
}
