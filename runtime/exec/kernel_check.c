/* The kernel contract, checked once for every executor (ferry_exec_compute calls it before any
 * backend sees the op): shapes, element types, every buffer a kernel reads or writes large
 * enough for it, and the immediate ints (token ids, positions, slots, rows) inside what they
 * index. An undersized kernel used to be FERRY_ERR_RANGE on cuda, FERRY_OK on sim and a heap
 * overflow on host; now each executor refuses it with the same status and message, and a
 * backend only adds the limits of its own implementation (cuda: 32-bit dimensions). */
#include <stdio.h>

#include "common/error.h"
#include "exec_impl.h"
#include "kernel_cost.h"
#include "ferry/model.h"
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
  if (!ferry__ref_fits(r, bytes)) { /* past its end, or below a window's base (another buffer's offsets) */
    char window[80];
    ferry__buf_window(r.buf, window, sizeof window);
    return ferry__err_set(&ex->err, FERRY_ERR_RANGE,
                          "kernel %s (%s): %s needs %llu bytes at offset %llu of buffer '%s' (%llu bytes%s)",
                          k->name ? k->name : "?", ferry_kernel_kind_name(k->kind), what, (unsigned long long)bytes,
                          (unsigned long long)r.offset, r.buf->label, (unsigned long long)r.buf->bytes, window);
  }
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
         k->kind == FERRY_K_MLA_ATTENTION || k->kind == FERRY_K_EXPERT || k->kind == FERRY_K_GATHER_ROWS ||
         k->kind == FERRY_K_KV_APPEND;
}

int ferry__kernel_uses_ints2(const struct ferry_kernel *k) {
  return (k->kind == FERRY_K_EMBED && k->aux[0].buf) || k->kind == FERRY_K_ATTENTION ||
         k->kind == FERRY_K_MLA_ATTENTION || k->kind == FERRY_K_EXPERT || k->kind == FERRY_K_KV_APPEND;
}

static ferry_status check_embed(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, n = k->n;
  NEED("y", k->y, prod(m, n, 4));
  if (n <= 0 || m <= 0) return FERRY_OK;
  if (!float_dtype(k->w.dtype) || (k->aux[0].buf && !float_dtype(k->aux[0].dtype)))
    return bad(ex, k, FERRY_ERR_UNSUPPORTED, "embedding tables are fp32, fp16 or bf16");
  NEED("table", k->w, prod(n, esize(k->w.dtype), 1));
  const uint64_t rows = (k->w.buf->bytes - ferry__ref_at(k->w)) / ((uint64_t)n * (uint64_t)esize(k->w.dtype));
  const uint64_t prows = k->aux[0].buf && ferry__ref_fits(k->aux[0], 0)
                             ? (k->aux[0].buf->bytes - ferry__ref_at(k->aux[0])) /
                                   ((uint64_t)n * (uint64_t)esize(k->aux[0].dtype))
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

/* The first position a query at pos sees (window, chunk), as the kernels compute it. */
static int64_t first_visible(const struct ferry_kernel *k, int64_t pos) {
  int64_t first = 0;
  if (k->sliding_window > 0 && pos - k->sliding_window + 1 > first) first = pos - k->sliding_window + 1;
  if (k->attn_chunk > 0 && pos - pos % k->attn_chunk > first) first = pos - pos % k->attn_chunk;
  return first;
}

/* The bytes of one chunk of n cache elements (a KV head's row, or a latent row): n elements of
 * the cache's dtype, or a quantized format's codes and group scales (ferry/model.h). */
static uint64_t kv_chunk_bytes(const struct ferry_kernel *k, enum ferry_dtype dt, int64_t n) {
  const enum ferry_kv_format f = (enum ferry_kv_format)k->kv_format;
  return f != FERRY_KV_AUTO && ferry_kv_format_group(f) > 0 ? ferry_kv_format_row_bytes(f, (uint64_t)n)
                                                            : prod(n, esize(dt), 1);
}

/* The cache's element type: fp32, fp16 or bf16, or the codes of a known quantized format. */
static ferry_status check_kv_format(struct ferry_exec *ex, const struct ferry_kernel *k, enum ferry_dtype dt) {
  const enum ferry_kv_format f = (enum ferry_kv_format)k->kv_format;
  if (k->kv_format < 0 || k->kv_format >= FERRY_KV_FORMAT_COUNT) return bad(ex, k, FERRY_ERR_INVALID, "unknown KV format");
  if (f != FERRY_KV_AUTO && ferry_kv_format_group(f) > 0)
    return dt == ferry_kv_format_dtype(f) ? FERRY_OK
                                          : bad(ex, k, FERRY_ERR_INVALID, "the cache's dtype is not its KV format's codes");
  return float_dtype(dt) ? FERRY_OK : bad(ex, k, FERRY_ERR_UNSUPPORTED, "the KV cache is fp32, fp16 or bf16");
}

/* A paged cache (kv_blocks): the table covers block indices [lo, hi] of the slot, and each
 * block's rows lie inside the cache. */
static ferry_status check_blocks(struct ferry_exec *ex, const struct ferry_kernel *k, const char *what,
                                 struct ferry_ref cache, uint64_t row_bytes, int64_t slot, int64_t lo, int64_t hi) {
  ferry_status st;
  const int64_t bs = k->kv_block_tokens, per = k->kv_blocks_per_seq;
  char why[160];
  if (hi >= per) {
    snprintf(why, sizeof why, "block %lld of slot %lld past its table of %lld blocks", (long long)hi, (long long)slot,
             (long long)per);
    return bad(ex, k, FERRY_ERR_RANGE, why);
  }
  int32_t top = -1;
  for (int64_t i = lo; i <= hi; i++) {
    const int32_t b = k->kv_blocks[slot * per + i];
    if (b < 0) {
      snprintf(why, sizeof why, "slot %lld's block %lld is not assigned (%d)", (long long)slot, (long long)i, b);
      return bad(ex, k, FERRY_ERR_RANGE, why);
    }
    if (b > top) top = b;
  }
  NEED(what, cache, prod((int64_t)top + 1, bs, 1) > UINT64_MAX / (row_bytes ? row_bytes : 1)
                        ? UINT64_MAX
                        : prod((int64_t)top + 1, bs, 1) * row_bytes);
  return FERRY_OK;
}

/* Each token's position and slot: inside the cache (a ring cache holds any position in
 * kv_capacity rows, as long as what the token sees fits them; a paged cache's block table
 * maps the rows). cache_row_bytes is one position's bytes in the cache `what`. */
static ferry_status check_positions(struct ferry_exec *ex, const struct ferry_kernel *k, const char *what,
                                    struct ferry_ref cache, uint64_t cache_row_bytes) {
  ferry_status st;
  const int64_t cap = k->kv_capacity;
  char why[160];
  if (k->kv_blocks && (k->kv_block_tokens <= 0 || k->kv_blocks_per_seq <= 0))
    return bad(ex, k, FERRY_ERR_INVALID, "a paged cache needs positive kv_block_tokens and kv_blocks_per_seq");
  for (int64_t t = 0; t < k->m; t++) {
    const int32_t pos = k->ints[t], slot = k->ints2[t];
    if (pos < 0 || (!k->kv_ring && pos >= cap) || slot < 0) {
      snprintf(why, sizeof why, "position %d outside the KV capacity %lld (slot %d)", pos, (long long)cap, slot);
      return bad(ex, k, FERRY_ERR_RANGE, why);
    }
    if (pos - first_visible(k, pos) + 1 > cap) {
      snprintf(why, sizeof why, "position %d sees %lld positions, more than the %lld cache rows", pos,
               (long long)(pos - first_visible(k, pos) + 1), (long long)cap);
      return bad(ex, k, FERRY_ERR_RANGE, why);
    }
    const int64_t row = k->kv_ring ? (pos < cap ? pos : cap - 1) : pos; /* the highest row written or read */
    if (k->kv_blocks) {
      /* the rows read and written: [first, pos], or a ring's [0, row] */
      const int64_t lo = k->kv_ring ? 0 : first_visible(k, pos);
      if ((st = check_blocks(ex, k, what, cache, cache_row_bytes, slot, lo / k->kv_block_tokens,
                             row / k->kv_block_tokens)) != FERRY_OK)
        return st;
      continue;
    }
    NEED(what, cache, prod(slot, cap, 1) + (uint64_t)row + 1 > UINT64_MAX / (cache_row_bytes ? cache_row_bytes : 1)
                          ? UINT64_MAX
                          : (prod(slot, cap, 1) + (uint64_t)row + 1) * cache_row_bytes);
  }
  return FERRY_OK;
}

/* The new k and v rows and where they go in the K and V caches: what an append reads and
 * writes, alone (FERRY_K_KV_APPEND) or before attention. */
static ferry_status check_kv_append(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, KV = k->kv_heads, hd = k->head_dim;
  if (KV <= 0 || hd <= 0 || k->kv_capacity <= 0)
    return bad(ex, k, FERRY_ERR_INVALID, "kv_heads, head_dim and kv_capacity must be positive");
  if ((st = check_kv_format(ex, k, k->aux[2].dtype)) != FERRY_OK) return st;
  if (k->aux[3].dtype != k->aux[2].dtype) return bad(ex, k, FERRY_ERR_INVALID, "the K and V caches differ in dtype");
  NEED("k", k->aux[0], prod(m, KV, hd * 4));
  NEED("v", k->aux[1], prod(m, KV, hd * 4));
  const uint64_t row_bytes = prod(KV, (int64_t)kv_chunk_bytes(k, k->aux[2].dtype, hd), 1);
  if ((st = check_positions(ex, k, "k cache", k->aux[2], row_bytes)) != FERRY_OK) return st;
  return check_positions(ex, k, "v cache", k->aux[3], row_bytes);
}

static ferry_status check_attention(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, H = k->heads, KV = k->kv_heads, hd = k->head_dim, cap = k->kv_capacity;
  if (H <= 0 || KV <= 0 || H % KV || hd <= 0 || cap <= 0)
    return bad(ex, k, FERRY_ERR_INVALID, "heads, kv_heads (dividing heads), head_dim and kv_capacity must be positive");
  NEED("q", k->x, prod(m, H, hd * 4));
  NEED("out", k->y, prod(m, H, hd * 4));
  MAYBE("sinks", k->aux[4], prod(H, esize(k->aux[4].dtype), 1));
  return check_kv_append(ex, k);
}

/* Multi-head latent attention: queries [m, heads, qk_nope + qk_rope], new latent rows
 * [m, kv_lora_rank + qk_rope] into the cache, kv_b_proj [heads x (qk_nope + v_head), rank]. */
static ferry_status check_mla_attention(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, H = k->heads, nope = k->head_dim, rope = k->rot_dim, rank = k->k, vd = k->n;
  if (H <= 0 || nope < 0 || rope < 0 || rank <= 0 || vd <= 0 || k->kv_capacity <= 0)
    return bad(ex, k, FERRY_ERR_INVALID, "heads, kv_lora_rank, v_head_dim and kv_capacity must be positive");
  if ((st = weight_dtype(ex, k, k->w)) != FERRY_OK) return st;
  if ((st = check_kv_format(ex, k, k->aux[2].dtype)) != FERRY_OK) return st;
  NEED("q", k->x, prod(m, H, (nope + rope) * 4));
  NEED("latent", k->aux[0], prod(m, rank + rope, 4));
  NEED("kv_b_proj", k->w, prod(H, (nope + vd) * rank, esize(k->w.dtype)));
  NEED("out", k->y, prod(m, H, vd * 4));
  return check_positions(ex, k, "latent cache", k->aux[2], kv_chunk_bytes(k, k->aux[2].dtype, rank + rope));
}

/* One expert over its (token, rank) pairs, in its stored layout: split gate/up/down, or a fused
 * gate_up twice as wide (with optional biases); gathered rows scaled by their gate weight
 * (scale_input) read those weights. Transposed weights have the same bytes. */
static ferry_status check_expert(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t m = k->m, n = k->n, kk = k->k;
  const int split = k->expert_layout == FERRY_EXPERTS_SPLIT;
  if (k->expert_layout < FERRY_EXPERTS_SPLIT || k->expert_layout > FERRY_EXPERTS_FUSED_INTERLEAVED)
    return bad(ex, k, FERRY_ERR_INVALID, "unknown expert layout");
  if ((st = weight_dtype(ex, k, k->w)) != FERRY_OK || (split && (st = weight_dtype(ex, k, k->aux[0])) != FERRY_OK) ||
      (st = weight_dtype(ex, k, k->aux[1])) != FERRY_OK)
    return st;
  const int64_t gate_cols = split ? n : 2 * n;
  NEED(split ? "gate" : "gate_up", k->w, prod(gate_cols, kk, esize(k->w.dtype)));
  if (split) NEED("up", k->aux[0], prod(n, kk, esize(k->aux[0].dtype)));
  NEED("down", k->aux[1], prod(kk, n, esize(k->aux[1].dtype)));
  MAYBE("gate_up bias", k->aux[6], prod(gate_cols, esize(k->aux[6].dtype), 1));
  MAYBE("down bias", k->aux[7], prod(kk, esize(k->aux[7].dtype), 1));
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
  if (k->scale_input) NEED("gate weights", k->aux[5], prod(max_tok + 1, k->top_k, 4));
  NEED("gathered x", k->aux[2], prod(m, kk, 4));
  NEED("gate out", k->aux[3], prod(m, gate_cols, 4));
  NEED("up out", k->aux[4], prod(m, n, 4));
  return FERRY_OK;
}

/* A packed weight: every part the format has, as large as ferry_quant_layout() says. */
static ferry_status check_dequantize(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  const int64_t n = k->n, kk = k->k;
  struct ferry_qspec spec = {(enum ferry_qformat)k->qformat, k->qgroup};
  struct ferry_qlayout layout;
  if ((unsigned)k->qformat >= FERRY_QFORMAT_COUNT || n < 1 || kk < 1 || ferry_quant_layout(&spec, n, kk, &layout) != FERRY_OK)
    return bad(ex, k, FERRY_ERR_INVALID, "unknown quantization format, group size or empty weight");
  static const char *const part_names[FERRY_QPART_COUNT] = {"qweight", "scales", "zeros", "absmax_scales",
                                                             "absmax_offsets"};
  if (k->y.dtype != FERRY_DTYPE_F32 && k->y.dtype != FERRY_DTYPE_F16)
    return bad(ex, k, FERRY_ERR_UNSUPPORTED, "a weight dequantizes into fp32 or fp16");
  NEED("y", k->y, prod(n, kk, esize(k->y.dtype)));
  for (int p = 0; p < FERRY_QPART_COUNT; p++)
    if (layout.part[p].bytes) NEED(part_names[p], k->aux[p], layout.part[p].bytes);
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
    case FERRY_K_NORM: {
      /* rows of n with a stride of ld; a weightless RMSNorm (Llama 4's q/k) has no w */
      const int64_t ld = k->ld ? k->ld : n;
      const int weighted = k->norm_kind != FERRY_NORMFN_RMS_PLAIN;
      if (k->norm_kind < FERRY_NORMFN_RMS || k->norm_kind > FERRY_NORMFN_RMS_PLAIN || ld < n)
        return bad(ex, k, FERRY_ERR_INVALID, "unknown norm kind, or a row stride below the row length");
      if ((weighted && !float_dtype(k->w.dtype)) || (k->b.buf && !float_dtype(k->b.dtype)))
        return bad(ex, k, FERRY_ERR_UNSUPPORTED, "norm weights are fp32, fp16 or bf16");
      const uint64_t rows_bytes = m > 0 ? prod(m - 1, ld, 4) + (uint64_t)n * 4 : 0;
      NEED("x", k->x, rows_bytes);
      NEED("y", k->y, rows_bytes);
      if (weighted) NEED("w", k->w, prod(n, esize(k->w.dtype), 1));
      MAYBE("b", k->b, prod(n, esize(k->b.dtype), 1));
      return FERRY_OK;
    }
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
    case FERRY_K_ROPE: {
      const int64_t rd = k->rot_dim ? k->rot_dim : k->head_dim;
      if (k->heads < 0 || k->kv_heads < 0 || k->head_dim < 0) return bad(ex, k, FERRY_ERR_INVALID, "negative heads");
      if (rd % 2 || k->rot_offset < 0 || k->rot_offset + rd > k->head_dim)
        return bad(ex, k, FERRY_ERR_INVALID, "the rotated dimensions are not an even span inside the head");
      NEED("q", k->x, prod(m, k->heads, k->head_dim * 4));
      MAYBE("k", k->aux[0], prod(m, k->kv_heads, k->head_dim * 4));
      return FERRY_OK;
    }
    case FERRY_K_SWIGLU:
      NEED("x", k->x, prod(m, n, 4));
      if (ferry__act_is_gated(k->fn)) { /* into y */
        NEED("up", k->aux[0], prod(m, n, 4));
        NEED("y", k->y, prod(m, n, 4));
      } else if (k->fn != FERRY_FN_GELU && k->fn != FERRY_FN_RELU && k->fn != FERRY_FN_GELU_TANH &&
                 k->fn != FERRY_FN_SOFTCAP) { /* the others in place */
        return bad(ex, k, FERRY_ERR_INVALID, "unknown activation function");
      }
      return FERRY_OK;
    case FERRY_K_ROUTER:
      if (n < 1 || k->top_k < 1 || k->top_k > n) return bad(ex, k, FERRY_ERR_INVALID, "needs 1 <= top_k <= n_experts");
      if (k->router_kind < FERRY_ROUTER_SOFTMAX_TOPK || k->router_kind > FERRY_ROUTER_SPARSEMIXER ||
          (k->n_group > 1 && n % k->n_group) || (k->router_kind == FERRY_ROUTER_SPARSEMIXER && k->top_k != 2))
        return bad(ex, k, FERRY_ERR_INVALID, "unknown router, experts not divisible into its groups, or a sparsemixer "
                                             "not of top-2");
      NEED("logits", k->x, prod(m, n, 4));
      MAYBE("score bias", k->aux[1], prod(n, esize(k->aux[1].dtype), 1));
      NEED("weights", k->y, prod(m, k->top_k, 4));
      NEED("ids", k->aux[0], prod(m, k->top_k, 4));
      if ((st = no_alias(ex, k, "weights", k->y, prod(m, k->top_k, 4), "logits", k->x, prod(m, n, 4))) != FERRY_OK ||
          (st = no_alias(ex, k, "ids", k->aux[0], prod(m, k->top_k, 4), "logits", k->x, prod(m, n, 4))) != FERRY_OK ||
          (st = no_alias(ex, k, "ids", k->aux[0], prod(m, k->top_k, 4), "weights", k->y, prod(m, k->top_k, 4))) != FERRY_OK)
        return st;
      return FERRY_OK;
    case FERRY_K_MOE_COMBINE:
      NEED("y", k->y, prod(m, n, 4));
      /* no ranks (top_k 0): only the shared expert, where every routed pair ran elsewhere */
      if (k->top_k) NEED("expert outputs", k->aux[0], prod(m, k->top_k, n * 4));
      MAYBE("gate weights", k->aux[1], prod(m, k->top_k, 4)); /* without: each rank weighs 1 */
      MAYBE("shared expert", k->aux[2], prod(m, n, 4));
      MAYBE("shared gate", k->aux[3], prod(m, 4, 1));
      return FERRY_OK;
    case FERRY_K_SPLIT_QKV: /* [m, heads, 3, head_dim] into three [m, heads x head_dim] */
      if (k->heads <= 0 || k->head_dim <= 0) return bad(ex, k, FERRY_ERR_INVALID, "heads and head_dim must be positive");
      NEED("qkv", k->x, prod(m, k->heads, 3 * k->head_dim * 4));
      NEED("q", k->y, prod(m, k->heads, k->head_dim * 4));
      NEED("k", k->aux[0], prod(m, k->heads, k->head_dim * 4));
      NEED("v", k->aux[1], prod(m, k->heads, k->head_dim * 4));
      return FERRY_OK;
    default: return bad(ex, k, FERRY_ERR_INVALID, "unknown kernel kind");
  }
}

/* m fp32 vectors of n, one per device, each on a device of its own. */
static ferry_status check_allreduce(struct ferry_exec *ex, const struct ferry_kernel *k) {
  ferry_status st;
  if (k->m < 2 || k->m > FERRY_EXEC_MAX_DEVICES || k->m > ex->config.n_devices)
    return bad(ex, k, FERRY_ERR_INVALID, "an all-reduce joins 2 to n_devices devices (m)");
  uint32_t seen = 0;
  for (int64_t i = 0; i < k->m; i++) {
    const struct ferry_ref r = i ? k->aux[i - 1] : k->x;
    NEED(i ? "a peer's partials" : "x", r, prod(k->n, 4, 1));
    if (r.buf->tier != FERRY_TIER_DEVICE || (seen >> r.buf->device & 1u))
      return bad(ex, k, FERRY_ERR_INVALID, "each partial must be in the device tier of a different device");
    seen |= 1u << r.buf->device;
  }
  return FERRY_OK;
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
    case FERRY_K_KV_APPEND: return check_kv_append(ex, k);
    case FERRY_K_MLA_ATTENTION: return check_mla_attention(ex, k);
    case FERRY_K_EXPERT: return check_expert(ex, k);
    case FERRY_K_DEQUANTIZE: return check_dequantize(ex, k);
    case FERRY_K_GATHER_ROWS: return check_gather(ex, k);
    case FERRY_K_ALLREDUCE: return check_allreduce(ex, k);
    default: return check_simple(ex, k);
  }
}
