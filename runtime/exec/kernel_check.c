/* The kernel contract, checked once for every executor (ferry_exec_compute calls it before any
 * backend sees the op): shapes, element types, every buffer a kernel reads or writes large
 * enough for it, and the immediate ints (token ids, positions, slots, rows) inside what they
 * index. An undersized kernel used to be FERRY_ERR_RANGE on cuda, FERRY_OK on sim and a heap
 * overflow on host; now each executor refuses it with the same status and message, and a
 * backend only adds the limits of its own implementation (cuda: 32-bit dimensions). */
#include <stdio.h>

#include "common/error.h"
#include "exec_impl.h"
#include "ferry/quant.h"
#include "runtime/quant/quant_impl.h"

/* a*b*c with saturation: an absurd shape then fails the bounds check instead of wrapping. */
static uint64_t prod(int64_t a, int64_t b, int64_t c) {
  uint64_t r;
  if (a < 0 || b < 0 || c < 0) return UINT64_MAX;
  if (__builtin_mul_overflow((uint64_t)a, (uint64_t)b, &r) || __builtin_mul_overflow(r, (uint64_t)c, &r))
    return UINT64_MAX;
  return r;
}

/* Element types a kernel computes with: fp32, fp16 and bf16 (packed formats go through a
 * dequantize op first). */
static int float_dtype(enum ferry_dtype dt) {
  return dt == FERRY_DTYPE_F32 || dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16;
}

static int64_t esize(enum ferry_dtype dt) { return (int64_t)ferry_dtype_size(dt); }

static ferry_status bad(struct ferry_exec *ex, const struct ferry_kernel *k, ferry_status st, const char *why) {
  return ferry__err_set(&ex->err, st, "kernel %s (%s): %s", k->name ? k->name : "?", ferry_kernel_kind_name(k->kind),
                        why);
}

/* The reference must name a buffer (when required) with `bytes` from its offset. */
static ferry_status need(struct ferry_exec *ex, const struct ferry_kernel *k, const char *what, struct ferry_ref r,
                         uint64_t bytes, int required) {
  if (!r.buf) {
    if (!required) return FERRY_OK;
    char why[96];
    snprintf(why, sizeof why, "no buffer for %s", what);
    return bad(ex, k, FERRY_ERR_INVALID, why);
  }
  if (r.offset > r.buf->bytes || bytes > r.buf->bytes - r.offset)
    return ferry__err_set(&ex->err, FERRY_ERR_RANGE,
                          "kernel %s (%s): %s needs %llu bytes at offset %llu of buffer '%s' (%llu bytes)",
                          k->name ? k->name : "?", ferry_kernel_kind_name(k->kind), what, (unsigned long long)bytes,
                          (unsigned long long)r.offset, r.buf->label, (unsigned long long)r.buf->bytes);
  return FERRY_OK;
}

#define NEED(what, ref, bytes)                                                    \
  do {                                                                            \
    if ((st = need(ex, k, (what), (ref), (bytes), 1)) != FERRY_OK) return st;     \
  } while (0)
#define MAYBE(what, ref, bytes)                                                   \
  do {                                                                            \
    if ((st = need(ex, k, (what), (ref), (bytes), 0)) != FERRY_OK) return st;     \
  } while (0)

/* Whether an output overlaps an input: a matrix product reads its inputs while it writes, so
 * an aliased one computes garbage on a real executor and is refused on every one. */
static int overlaps(struct ferry_ref a, uint64_t a_bytes, struct ferry_ref b, uint64_t b_bytes) {
  return a.buf && b.buf && a.buf == b.buf && a_bytes && b_bytes && a.offset < b.offset + b_bytes &&
         b.offset < a.offset + a_bytes;
}

static ferry_status no_alias(struct ferry_exec *ex, const struct ferry_kernel *k, const char *out, struct ferry_ref o,
                             uint64_t o_bytes, const char *in, struct ferry_ref i, uint64_t i_bytes) {
  if (!overlaps(o, o_bytes, i, i_bytes)) return FERRY_OK;
  char why[128];
  snprintf(why, sizeof why, "%s overlaps %s in buffer '%s'", out, in, o.buf->label);
  return bad(ex, k, FERRY_ERR_INVALID, why);
}

static ferry_status weight_dtype(struct ferry_exec *ex, const struct ferry_kernel *k, struct ferry_ref w) {
  if (!w.buf || float_dtype(w.dtype)) return FERRY_OK;
  char why[128];
  snprintf(why, sizeof why, "weights of dtype %s need a dequantize op first", ferry_dtype_name(w.dtype));
  return bad(ex, k, FERRY_ERR_UNSUPPORTED, why);
}

int ferry__kernel_uses_ints(const struct ferry_kernel *k) {
  return k->kind == FERRY_K_EMBED || k->kind == FERRY_K_ROPE || k->kind == FERRY_K_ATTENTION ||
         k->kind == FERRY_K_EXPERT || k->kind == FERRY_K_GATHER_ROWS;
}

int ferry__kernel_uses_ints2(const struct ferry_kernel *k) {
  return (k->kind == FERRY_K_EMBED && k->aux[0].buf) || k->kind == FERRY_K_ATTENTION || k->kind == FERRY_K_EXPERT;
}

static ferry_status check_embed(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, n = k->n;
  NEED("y", k->y, prod(m, n, 4));
  if (n <= 0 || m <= 0) return FERRY_OK;
  if (!float_dtype(k->w.dtype) || (k->aux[0].buf && !float_dtype(k->aux[0].dtype)))
    return bad(ex, k, FERRY_ERR_UNSUPPORTED, "embedding tables are fp32, fp16 or bf16");
  NEED("table", k->w, prod(n, esize(k->w.dtype), 1));
  const uint64_t rows = (k->w.buf->bytes - k->w.offset) / ((uint64_t)n * (uint64_t)esize(k->w.dtype));
  const uint64_t prows = k->aux[0].buf && k->aux[0].offset <= k->aux[0].buf->bytes
                             ? (k->aux[0].buf->bytes - k->aux[0].offset) / ((uint64_t)n * (uint64_t)esize(k->aux[0].dtype))
                             : 0;
  char why[160];
  for (int64_t t = 0; t < m; t++) {
    if (k->ints[t] < 0 || (uint64_t)k->ints[t] >= rows) {
      snprintf(why, sizeof why, "token id %d outside the table of %llu rows", k->ints[t], (unsigned long long)rows);
      return bad(ex, k, FERRY_ERR_RANGE, why);
    }
    const int64_t row = k->aux[0].buf ? (int64_t)k->ints2[t] + k->pos_offset : 0;
    if (k->aux[0].buf && (row < 0 || (uint64_t)row >= prows)) {
      snprintf(why, sizeof why, "position row %lld outside the position table of %llu rows", (long long)row,
               (unsigned long long)prows);
      return bad(ex, k, FERRY_ERR_RANGE, why);
    }
  }
  return FERRY_OK;
}

static ferry_status check_attention(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, H = k->heads, KV = k->kv_heads, hd = k->head_dim, cap = k->kv_capacity;
  if (H <= 0 || KV <= 0 || H % KV || hd <= 0 || cap <= 0)
    return bad(ex, k, FERRY_ERR_INVALID, "heads, kv_heads (dividing heads), head_dim and kv_capacity must be positive");
  if (!float_dtype(k->aux[2].dtype) || k->aux[3].dtype != k->aux[2].dtype)
    return bad(ex, k, FERRY_ERR_UNSUPPORTED, "the K and V caches are one of fp32, fp16 or bf16");
  NEED("q", k->x, prod(m, H, hd * 4));
  NEED("out", k->y, prod(m, H, hd * 4));
  NEED("k", k->aux[0], prod(m, KV, hd * 4));
  NEED("v", k->aux[1], prod(m, KV, hd * 4));
  NEED("k cache", k->aux[2], 0);
  NEED("v cache", k->aux[3], 0);
  char why[160];
  for (int64_t t = 0; t < m; t++) {
    const int32_t pos = k->ints[t], slot = k->ints2[t];
    if (pos < 0 || pos >= cap || slot < 0) {
      snprintf(why, sizeof why, "position %d outside the KV capacity %lld (slot %d)", pos, (long long)cap, slot);
      return bad(ex, k, FERRY_ERR_RANGE, why);
    }
    const uint64_t rows = prod(slot, cap, 1) + (uint64_t)pos + 1;
    NEED("k cache", k->aux[2], prod((int64_t)rows, KV * hd, esize(k->aux[2].dtype)));
    NEED("v cache", k->aux[3], prod((int64_t)rows, KV * hd, esize(k->aux[3].dtype)));
  }
  return FERRY_OK;
}

static ferry_status check_expert(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, n = k->n, kk = k->k;
  if ((st = weight_dtype(ex, k, k->w)) != FERRY_OK || (st = weight_dtype(ex, k, k->aux[0])) != FERRY_OK ||
      (st = weight_dtype(ex, k, k->aux[1])) != FERRY_OK)
    return st;
  NEED("gate", k->w, prod(n, kk, esize(k->w.dtype)));
  NEED("up", k->aux[0], prod(n, kk, esize(k->aux[0].dtype)));
  NEED("down", k->aux[1], prod(kk, n, esize(k->aux[1].dtype)));
  if (m == 0) return FERRY_OK;
  if (k->top_k < 1) return bad(ex, k, FERRY_ERR_INVALID, "top_k must be positive");
  int64_t max_tok = 0, max_row = 0;
  char why[160];
  for (int64_t i = 0; i < m; i++) {
    if (k->ints[i] < 0 || k->ints2[i] < 0 || k->ints2[i] >= k->top_k) {
      snprintf(why, sizeof why, "pair %lld: token %d, rank %d (top_k %lld)", (long long)i, k->ints[i], k->ints2[i],
               (long long)k->top_k);
      return bad(ex, k, FERRY_ERR_RANGE, why);
    }
    if (k->ints[i] > max_tok) max_tok = k->ints[i];
    if ((int64_t)k->ints[i] * k->top_k + k->ints2[i] > max_row) max_row = (int64_t)k->ints[i] * k->top_k + k->ints2[i];
  }
  NEED("x", k->x, prod(max_tok + 1, kk, 4));
  NEED("y", k->y, prod(max_row + 1, kk, 4));
  NEED("gathered x", k->aux[2], prod(m, kk, 4));
  NEED("gate out", k->aux[3], prod(m, n, 4));
  NEED("up out", k->aux[4], prod(m, n, 4));
  return FERRY_OK;
}

static ferry_status check_dequantize(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t n = k->n, kk = k->k;
  struct ferry_qspec spec = {(enum ferry_qformat)k->qformat, k->qgroup};
  if ((unsigned)k->qformat >= FERRY_QFORMAT_COUNT || ferry_quant_spec_check(&spec) != FERRY_OK)
    return bad(ex, k, FERRY_ERR_INVALID, "unknown quantization format or group size");
  if (n < 1 || kk < 1) return bad(ex, k, FERRY_ERR_INVALID, "empty weight");
  const int bits = ferry__quant_bits(spec.format);
  const int64_t g = spec.group_size, gpr = g ? (kk + g - 1) / g : 0;
  const enum ferry_qformat f = spec.format;
  const int grouped = f == FERRY_QFORMAT_INT4 || f == FERRY_QFORMAT_INT3 || f == FERRY_QFORMAT_INT2;
  if ((grouped || f == FERRY_QFORMAT_NF4) && g < 1) return bad(ex, k, FERRY_ERR_INVALID, "grouped format without a group size");
  NEED("y", k->y, prod(n, kk, 4));
  NEED("qweight", k->aux[FERRY_QPART_DATA], prod(n, (kk * bits + 7) / 8, 1));
  if (f == FERRY_QFORMAT_INT8) NEED("scales", k->aux[FERRY_QPART_SCALES], prod(n, 4, 1));
  if (grouped) {
    NEED("scales", k->aux[FERRY_QPART_SCALES], prod(n, gpr, 2));
    NEED("zeros", k->aux[FERRY_QPART_ZEROS], prod(n, gpr, 1));
  }
  if (f == FERRY_QFORMAT_NF4) {
    const uint64_t blocks = prod(n, gpr, 1), b2 = (blocks + FERRY_QUANT_NF4_BLOCK2 - 1) / FERRY_QUANT_NF4_BLOCK2;
    NEED("absmax", k->aux[FERRY_QPART_SCALES], blocks);
    NEED("absmax_scales", k->aux[FERRY_QPART_SCALES2], b2 * 4);
    NEED("absmax_offsets", k->aux[FERRY_QPART_OFFSETS2], b2 * 4);
  }
  return FERRY_OK;
}

static ferry_status check_gather(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  int64_t max_row = 0;
  for (int64_t i = 0; i < k->m; i++) {
    if (k->ints[i] < 0) return bad(ex, k, FERRY_ERR_RANGE, "negative row");
    if (k->ints[i] > max_row) max_row = k->ints[i];
  }
  if (k->m > 0) NEED("x", k->x, prod(max_row + 1, k->n, 4));
  NEED("y", k->y, prod(k->m, k->n, 4));
  return FERRY_OK;
}

/* The kinds whose checks are a few lines each. */
static ferry_status check_simple(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, n = k->n, kk = k->k;
  switch (k->kind) {
    case FERRY_K_NORM:
      if (!float_dtype(k->w.dtype) || (k->b.buf && !float_dtype(k->b.dtype)))
        return bad(ex, k, FERRY_ERR_UNSUPPORTED, "norm weights are fp32, fp16 or bf16");
      NEED("x", k->x, prod(m, n, 4));
      NEED("y", k->y, prod(m, n, 4));
      NEED("w", k->w, prod(n, esize(k->w.dtype), 1));
      MAYBE("b", k->b, prod(n, esize(k->b.dtype), 1));
      return FERRY_OK;
    case FERRY_K_MATMUL:
      if ((st = weight_dtype(ex, k, k->w)) != FERRY_OK || (st = weight_dtype(ex, k, k->b)) != FERRY_OK) return st;
      NEED("x", k->x, prod(m, kk, 4));
      NEED("y", k->y, prod(m, n, 4));
      NEED("w", k->w, prod(n, kk, esize(k->w.dtype)));
      MAYBE("bias", k->b, prod(n, esize(k->b.dtype), 1));
      if ((st = no_alias(ex, k, "y", k->y, prod(m, n, 4), "x", k->x, prod(m, kk, 4))) != FERRY_OK ||
          (st = no_alias(ex, k, "y", k->y, prod(m, n, 4), "w", k->w, prod(n, kk, esize(k->w.dtype)))) != FERRY_OK)
        return st;
      return FERRY_OK;
    case FERRY_K_ROPE:
      if (k->heads < 0 || k->kv_heads < 0 || k->head_dim < 0) return bad(ex, k, FERRY_ERR_INVALID, "negative heads");
      NEED("q", k->x, prod(m, k->heads, k->head_dim * 4));
      MAYBE("k", k->aux[0], prod(m, k->kv_heads, k->head_dim * 4));
      return FERRY_OK;
    case FERRY_K_SWIGLU:
      NEED("x", k->x, prod(m, n, 4));
      if (k->fn == FERRY_FN_SILU_MUL) {
        NEED("up", k->aux[0], prod(m, n, 4));
        NEED("y", k->y, prod(m, n, 4));
      } else if (k->fn != FERRY_FN_GELU && k->fn != FERRY_FN_RELU) {
        return bad(ex, k, FERRY_ERR_INVALID, "unknown activation function");
      }
      return FERRY_OK;
    case FERRY_K_ROUTER:
      if (n < 1 || k->top_k < 1 || k->top_k > n) return bad(ex, k, FERRY_ERR_INVALID, "needs 1 <= top_k <= n_experts");
      NEED("logits", k->x, prod(m, n, 4));
      NEED("weights", k->y, prod(m, k->top_k, 4));
      NEED("ids", k->aux[0], prod(m, k->top_k, 4));
      if ((st = no_alias(ex, k, "weights", k->y, prod(m, k->top_k, 4), "logits", k->x, prod(m, n, 4))) != FERRY_OK ||
          (st = no_alias(ex, k, "ids", k->aux[0], prod(m, k->top_k, 4), "logits", k->x, prod(m, n, 4))) != FERRY_OK ||
          (st = no_alias(ex, k, "ids", k->aux[0], prod(m, k->top_k, 4), "weights", k->y, prod(m, k->top_k, 4))) != FERRY_OK)
        return st;
      return FERRY_OK;
    case FERRY_K_MOE_COMBINE:
      NEED("y", k->y, prod(m, n, 4));
      NEED("expert outputs", k->aux[0], prod(m, k->top_k, n * 4));
      NEED("gate weights", k->aux[1], prod(m, k->top_k, 4));
      MAYBE("shared expert", k->aux[2], prod(m, n, 4));
      MAYBE("shared gate", k->aux[3], prod(m, 4, 1));
      return FERRY_OK;
    default: return bad(ex, k, FERRY_ERR_INVALID, "unknown kernel kind");
  }
}

ferry_status ferry__kernel_check(struct ferry_exec *ex, const struct ferry_kernel *k) {
  if ((unsigned)k->kind >= FERRY_K_COUNT) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "compute: invalid kernel");
  if (k->m < 0 || k->n < 0 || k->k < 0) return bad(ex, k, FERRY_ERR_INVALID, "negative shape");
  if (ferry__kernel_uses_ints(k) && k->m > 0 &&
      (!k->ints || k->n_ints < k->m || (ferry__kernel_uses_ints2(k) && !k->ints2)))
    return bad(ex, k, FERRY_ERR_INVALID, "missing immediate ints (need m of them)");
  switch (k->kind) {
    case FERRY_K_EMBED: return check_embed(ex, k);
    case FERRY_K_ATTENTION: return check_attention(ex, k);
    case FERRY_K_EXPERT: return check_expert(ex, k);
    case FERRY_K_DEQUANTIZE: return check_dequantize(ex, k);
    case FERRY_K_GATHER_ROWS: return check_gather(ex, k);
    default: return check_simple(ex, k);
  }
}
