/* The cost-model view of a kernel (FLOPs and bytes touched). One function serves the
 * simulator's roofline, the activity records of every executor and calibration, so all three
 * agree on what an op costs. */
#include "exec_impl.h"
#include "kernel_cost.h"

const char *ferry_kernel_kind_name(enum ferry_kernel_kind kind) {
  static const char *names[FERRY_K_COUNT] = {
      [FERRY_K_EMBED] = "embed",         [FERRY_K_NORM] = "norm",
      [FERRY_K_MATMUL] = "matmul",       [FERRY_K_ROPE] = "rope",
      [FERRY_K_ATTENTION] = "attention", [FERRY_K_SWIGLU] = "activation",
      [FERRY_K_ROUTER] = "router",       [FERRY_K_EXPERT] = "expert",
      [FERRY_K_MOE_COMBINE] = "moe_combine", [FERRY_K_GATHER_ROWS] = "gather_rows",
      [FERRY_K_DEQUANTIZE] = "dequantize",   [FERRY_K_SPLIT_QKV] = "split_qkv",
      [FERRY_K_MLA_ATTENTION] = "mla_attention", [FERRY_K_ALLREDUCE] = "allreduce",
      [FERRY_K_KV_APPEND] = "kv_append",
  };
  return (unsigned)kind < FERRY_K_COUNT ? names[kind] : "?";
}

static uint64_t esize(enum ferry_dtype d) {
  size_t s = ferry_dtype_size(d);
  return s ? s : 4;
}

uint64_t ferry__kv_bytes(const struct ferry_kernel *k, uint64_t n) {
  if (k->kv_format > 0 && ferry_kv_format_group((enum ferry_kv_format)k->kv_format) > 0)
    return ferry_kv_format_row_bytes((enum ferry_kv_format)k->kv_format, n);
  return n * esize(k->aux[2].dtype);
}

/* Keys each tile of queries reads from the KV cache. A flash-style kernel (FlashAttention-2,
 * paged decode) keeps a tile of FERRY_ATTN_Q_TILE queries of one sequence on chip and streams
 * that sequence's K and V past it once: a prefill chunk reads its keys once per tile, not once
 * per query, and a decode token (a tile of one) reads its context once. Tokens of one sequence
 * are consecutive in the batch (same slot, rising positions). Without per-token positions the
 * m tokens are taken as one sequence whose queries see context_tokens keys in all. */
static uint64_t attention_kv_tokens_tiled(const struct ferry_kernel *k, int64_t q_tile) {
  const int64_t m = k->m, window = k->sliding_window, chunk = k->attn_chunk;
  if (m <= 0) return 0;
  if (!k->ints || !k->ints2 || k->n_ints < m) {
    uint64_t tile = (uint64_t)(m < q_tile ? m : q_tile);
    return ((uint64_t)k->context_tokens + tile - 1) / tile;
  }
  uint64_t keys = 0;
  for (int64_t i = 0; i < m;) {
    /* one tile: up to q_tile consecutive tokens of one sequence */
    int64_t j = i + 1;
    while (j < m && j - i < q_tile && k->ints2[j] == k->ints2[i] && k->ints[j] > k->ints[j - 1]) j++;
    int64_t first = k->ints[i], last = k->ints[j - 1];
    int64_t lo = window > 0 && first - window + 1 > 0 ? first - window + 1 : 0;
    if (chunk > 0 && first - first % chunk > lo) lo = first - first % chunk; /* chunked attention */
    keys += (uint64_t)(last + 1 - lo);
    i = j;
  }
  return keys;
}

static uint64_t attention_kv_tokens(const struct ferry_kernel *k) {
  return attention_kv_tokens_tiled(k, FERRY_ATTN_Q_TILE);
}

uint64_t ferry__attention_seq_keys(const struct ferry_kernel *k) {
  return attention_kv_tokens_tiled(k, k->m > 0 ? k->m : 1);
}

int ferry__act_is_gated(enum ferry_act_fn fn) { return fn == FERRY_FN_SILU_MUL || fn == FERRY_FN_GELU_TANH_MUL; }

void ferry_kernel_cost(const struct ferry_kernel *k, double *flops, uint64_t *bytes) {
  double f = 0;
  uint64_t b = 0;
  const uint64_t m = (uint64_t)k->m, n = (uint64_t)k->n, kk = (uint64_t)k->k;
  switch (k->kind) {
    case FERRY_K_EMBED:
      b = m * n * (esize(k->w.dtype) + 4);
      break;
    case FERRY_K_NORM:
      f = 5.0 * (double)(m * n);
      b = m * n * 8 + n * esize(k->w.dtype);
      break;
    case FERRY_K_MATMUL:
      f = 2.0 * (double)m * (double)n * (double)kk;
      b = n * kk * esize(k->w.dtype) + m * kk * 4 + m * n * 4;
      break;
    case FERRY_K_ROPE:
      f = 6.0 * (double)(m * (uint64_t)(k->heads + k->kv_heads) * (uint64_t)k->head_dim);
      b = 2 * 4 * m * (uint64_t)(k->heads + k->kv_heads) * (uint64_t)k->head_dim;
      break;
    case FERRY_K_ATTENTION: {
      /* QK^T and PV: 2 + 2 flops per (query, key, dim) pair the causal mask keeps */
      const uint64_t hd = (uint64_t)k->head_dim, kvh = (uint64_t)k->kv_heads, kv_row = ferry__kv_bytes(k, hd);
      f = 4.0 * (double)k->context_tokens * (double)k->heads * (double)hd;
      /* cached K and V as a tiled kernel reads them, q in and out, new k and v appended */
      b = attention_kv_tokens(k) * kvh * 2 * kv_row + m * (uint64_t)k->heads * hd * 8 + m * kvh * 2 * (hd * 4 + kv_row);
      break;
    }
    case FERRY_K_KV_APPEND: {
      /* the new fp32 k and v rows read, written into the cache in its format */
      const uint64_t hd = (uint64_t)k->head_dim, kvh = (uint64_t)k->kv_heads;
      b = m * kvh * 2 * (hd * 4 + ferry__kv_bytes(k, hd));
      break;
    }
    case FERRY_K_SWIGLU:
      f = 6.0 * (double)(m * n);
      b = m * n * (ferry__act_is_gated(k->fn) ? 12 : 8); /* fp32: two rows in and one out, or one rewritten */
      break;
    case FERRY_K_ROUTER:
      f = 10.0 * (double)(m * n);
      b = m * n * 4 + m * (uint64_t)k->top_k * 8;
      break;
    case FERRY_K_EXPERT:
      f = 2.0 * 3.0 * (double)m * (double)n * (double)kk;
      b = 3 * n * kk * esize(k->w.dtype) + m * kk * 8 + m * n * 8;
      break;
    case FERRY_K_MOE_COMBINE:
      f = 2.0 * (double)(m * n * (uint64_t)(k->top_k + 1));
      b = m * n * 4 * (uint64_t)(k->top_k + 2);
      break;
    case FERRY_K_GATHER_ROWS:
      b = m * n * 8;
      break;
    case FERRY_K_DEQUANTIZE:
      /* packed bytes read (m) + expanded bytes written */
      f = 2.0 * (double)(n * kk);
      b = m + n * kk * esize(k->y.dtype);
      break;
    case FERRY_K_SPLIT_QKV:
      b = m * 3 * (uint64_t)k->heads * (uint64_t)k->head_dim * 8;
      break;
    case FERRY_K_MLA_ATTENTION: {
      /* absorbed MLA: queries into the latent space, scores and values over the compressed
       * cache (context_tokens rows of rank + rope), values back out of it */
      const double H = (double)k->heads, nope = (double)k->head_dim, rope = (double)k->rot_dim, rank = (double)kk,
                   v = (double)n, ctx = (double)k->context_tokens;
      f = 2.0 * (double)m * H * rank * (nope + v) + 2.0 * ctx * H * (2.0 * rank + rope);
      b = attention_kv_tokens(k) * ferry__kv_bytes(k, (uint64_t)(rank + rope)) +
          (uint64_t)(H * (nope + v) * rank) * esize(k->w.dtype) + m * (uint64_t)(H * (nope + rope + v)) * 4;
      break;
    }
    case FERRY_K_ALLREDUCE: /* m - 1 additions per element; each device's partials read and written */
      f = (double)((k->m > 1 ? k->m - 1 : 0) * n);
      b = m * n * 8;
      break;
    case FERRY_K_COUNT:
      break;
  }
  if (flops) *flops = f;
  if (bytes) *bytes = b;
}
