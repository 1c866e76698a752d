/* The kernel cases of kernel_cases.h: how each is built, filled and run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/rng.h"
#include "ferry/model.h"
#include "kernel_cases.h"

static ferry_buf *const PLACEHOLDER = (ferry_buf *)1;

static uint64_t place(struct kcase *c, uint64_t bytes) {
  uint64_t off = c->bytes;
  c->bytes += (bytes + 255) / 256 * 256;
  return off;
}

static struct ferry_ref ref(uint64_t off, enum ferry_dtype dt) { return (struct ferry_ref){PLACEHOLDER, off, dt}; }

static struct ferry_ref typed(struct kcase *c, uint64_t n, enum ferry_dtype dt) {
  uint64_t off = place(c, n * (dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16 ? 2 : 4));
  c->fill[c->n_fill++] = (struct kc_region){off, n, dt};
  return ref(off, dt);
}

static struct ferry_ref f32(struct kcase *c, uint64_t n) { return ref(place(c, n * 4), FERRY_DTYPE_F32); }

static void out(struct kcase *c, struct ferry_ref r, uint64_t floats) {
  c->out_off = r.offset;
  c->out_floats = floats;
}

static struct kcase base(const char *name, enum ferry_kernel_kind kind, double tol) {
  struct kcase c;
  memset(&c, 0, sizeof c);
  c.name = name;
  c.k.kind = kind;
  c.k.name = name;
  c.k.layer = c.k.expert = -1;
  c.tol = tol;
  return c;
}

static struct kcase case_matmul(const char *name, int64_t m, int64_t k, int64_t n, enum ferry_dtype wdt, int bias,
                                int acc, double tol) {
  struct kcase c = base(name, FERRY_K_MATMUL, tol);
  c.k.m = m;
  c.k.n = n;
  c.k.k = k;
  c.k.accumulate = acc;
  c.k.x = f32(&c, (uint64_t)(m * k));
  c.k.w = typed(&c, (uint64_t)(n * k), wdt);
  if (bias) c.k.b = typed(&c, (uint64_t)n, wdt);
  c.k.y = f32(&c, (uint64_t)(m * n));
  out(&c, c.k.y, (uint64_t)(m * n));
  return c;
}

static struct kcase case_norm(const char *name, int kind, int64_t m, int64_t n, enum ferry_dtype wdt) {
  struct kcase c = base(name, FERRY_K_NORM, 1e-4);
  c.k.m = m;
  c.k.n = n;
  c.k.norm_kind = kind;
  c.k.eps = 1e-5f;
  c.k.x = f32(&c, (uint64_t)(m * n));
  c.k.w = typed(&c, (uint64_t)n, wdt);
  if (kind == 1) c.k.b = typed(&c, (uint64_t)n, wdt);
  c.k.y = f32(&c, (uint64_t)(m * n));
  out(&c, c.k.y, (uint64_t)(m * n));
  return c;
}

static struct kcase case_rope(void) {
  struct kcase c = base("rope", FERRY_K_ROPE, 1e-4);
  const int64_t m = 5, H = 8, KV = 2, hd = 64;
  const int32_t pos[5] = {0, 3, 17, 100, 2047};
  c.k.m = m;
  c.k.heads = H;
  c.k.kv_heads = KV;
  c.k.head_dim = hd;
  c.k.theta = 10000.0;
  c.k.x = f32(&c, (uint64_t)(m * (H + KV) * hd)); /* q then k in one output region */
  c.k.aux[0] = ref(c.k.x.offset + (uint64_t)(m * H * hd) * 4, FERRY_DTYPE_F32);
  memcpy(c.ints, pos, sizeof pos);
  c.k.n_ints = m;
  out(&c, c.k.x, (uint64_t)(m * (H + KV) * hd));
  return c;
}

/* Attention of m tokens at (slot[t], pos[t]) over two slots' caches of cap rows (8 heads over 2
 * KV heads). hd: 64, or 80 (phi-2's), which no whole number of warps covers. */
static struct kcase attention_tokens(const char *name, int64_t window, enum ferry_dtype cdt, int64_t hd, int64_t m,
                                     int64_t cap, const int32_t *pos, const int32_t *slot) {
  struct kcase c = base(name, FERRY_K_ATTENTION, 1e-3);
  const int64_t H = 8, KV = 2, slots = 2;
  c.k.m = m;
  c.k.heads = H;
  c.k.kv_heads = KV;
  c.k.head_dim = hd;
  c.k.kv_capacity = cap;
  c.k.sliding_window = window;
  c.k.x = f32(&c, (uint64_t)(m * H * hd));
  c.k.aux[0] = f32(&c, (uint64_t)(m * KV * hd));
  c.k.aux[1] = f32(&c, (uint64_t)(m * KV * hd));
  c.k.aux[2] = typed(&c, (uint64_t)(slots * cap * KV * hd), cdt);
  c.k.aux[3] = typed(&c, (uint64_t)(slots * cap * KV * hd), cdt);
  c.k.y = f32(&c, (uint64_t)(m * H * hd));
  memcpy(c.ints, pos, (size_t)m * sizeof *pos);
  memcpy(c.ints2, slot, (size_t)m * sizeof *slot);
  c.k.n_ints = m;
  out(&c, c.k.y, (uint64_t)(m * H * hd));
  return c;
}

/* A decode-like step: slot 0 three new tokens at 0..2; slot 1 one token at 1050 over 1050
 * cached positions (more than one key tile; the cuda executor splits it over blocks and combines
 * them). */
static struct kcase case_attention(const char *name, int64_t window, enum ferry_dtype cdt, int64_t hd) {
  static const int32_t pos[4] = {0, 1, 2, 1050}, slot[4] = {0, 0, 0, 1};
  return attention_tokens(name, window, cdt, hd, 4, 1100, pos, slot);
}

/* A prefill step: 40 tokens in two runs, a fresh prompt (slot 0 at 0..22) and a chunk after a
 * cached context (slot 1 at 300..316): each query with its own causal (and window) bound over
 * rows appended by this very op. The cuda executor splits these contexts in three (320 blocks
 * of (token, head)), so most of the prompt's splits are empty. */
static struct kcase case_attention_prefill(const char *name, int64_t window, enum ferry_dtype cdt, int64_t hd) {
  int32_t pos[40], slot[40];
  for (int t = 0; t < 40; t++) {
    slot[t] = t < 23 ? 0 : 1;
    pos[t] = t < 23 ? t : 300 + (t - 23);
  }
  return attention_tokens(name, window, cdt, hd, 40, 400, pos, slot);
}

/* The append alone (attention's first half): rows of two slots written into fp32 K and V caches
 * laid out one after the other, so the output compared is both caches. */
static struct kcase case_kv_append(void) {
  struct kcase c = base("kv_append", FERRY_K_KV_APPEND, 0);
  const int64_t m = 4, KV = 2, hd = 64, cap = 8, slots = 2, cache = slots * cap * KV * hd;
  const int32_t pos[4] = {0, 1, 2, 5}, slot[4] = {0, 0, 0, 1};
  c.k.m = m;
  c.k.kv_heads = KV;
  c.k.head_dim = hd;
  c.k.kv_capacity = cap;
  c.k.aux[0] = typed(&c, (uint64_t)(m * KV * hd), FERRY_DTYPE_F32);
  c.k.aux[1] = typed(&c, (uint64_t)(m * KV * hd), FERRY_DTYPE_F32);
  c.k.aux[2] = typed(&c, (uint64_t)(2 * cache), FERRY_DTYPE_F32);
  c.k.aux[3] = ref(c.k.aux[2].offset + (uint64_t)cache * 4, FERRY_DTYPE_F32);
  memcpy(c.ints, pos, sizeof pos);
  memcpy(c.ints2, slot, sizeof slot);
  c.k.n_ints = m;
  out(&c, c.k.aux[2], (uint64_t)(2 * cache));
  return c;
}

static struct kcase case_act(const char *name, enum ferry_act_fn fn) {
  struct kcase c = base(name, FERRY_K_SWIGLU, 1e-5);
  const int64_t m = 3, n = 1000;
  c.k.m = m;
  c.k.n = n;
  c.k.fn = fn;
  c.k.x = f32(&c, (uint64_t)(m * n));
  if (fn == FERRY_FN_SILU_MUL) {
    c.k.aux[0] = f32(&c, (uint64_t)(m * n));
    c.k.y = f32(&c, (uint64_t)(m * n));
    out(&c, c.k.y, (uint64_t)(m * n));
  } else {
    out(&c, c.k.x, (uint64_t)(m * n));
  }
  return c;
}

static struct kcase case_router(const char *name, int renorm) {
  struct kcase c = base(name, FERRY_K_ROUTER, 1e-5);
  const int64_t m = 6, E = 16, K = 4;
  c.k.m = m;
  c.k.n = E;
  c.k.top_k = K;
  c.k.renormalize = renorm;
  c.k.x = f32(&c, (uint64_t)(m * E));
  c.k.y = f32(&c, (uint64_t)(m * K));
  c.k.aux[0] = ref(place(&c, (uint64_t)(m * K) * 4), FERRY_DTYPE_I32);
  out(&c, c.k.y, (uint64_t)(m * K));
  c.ids_off = c.k.aux[0].offset;
  c.ids_n = (uint64_t)(m * K);
  return c;
}

static struct kcase case_expert(enum ferry_dtype wdt) {
  struct kcase c = base(wdt == FERRY_DTYPE_F32 ? "expert.fp32" : "expert.fp16", FERRY_K_EXPERT,
                        wdt == FERRY_DTYPE_F32 ? 1e-4 : 1e-2);
  const int64_t m = 5, T = 5, hidden = 128, inter = 96, K = 2;
  const int32_t tok[5] = {0, 1, 1, 3, 4}, rank[5] = {0, 0, 1, 1, 0};
  c.k.m = m;
  c.k.n = inter;
  c.k.k = hidden;
  c.k.top_k = K;
  c.k.x = f32(&c, (uint64_t)(T * hidden));
  c.k.y = f32(&c, (uint64_t)(T * K * hidden));
  c.k.w = typed(&c, (uint64_t)(inter * hidden), wdt);
  c.k.aux[0] = typed(&c, (uint64_t)(inter * hidden), wdt);
  c.k.aux[1] = typed(&c, (uint64_t)(hidden * inter), wdt);
  c.k.aux[2] = f32(&c, (uint64_t)(m * hidden));
  c.k.aux[3] = f32(&c, (uint64_t)(m * inter));
  c.k.aux[4] = f32(&c, (uint64_t)(m * inter));
  memcpy(c.ints, tok, sizeof tok);
  memcpy(c.ints2, rank, sizeof rank);
  c.k.n_ints = m;
  out(&c, c.k.y, (uint64_t)(T * K * hidden));
  return c;
}

static struct kcase case_combine(void) {
  struct kcase c = base("moe_combine", FERRY_K_MOE_COMBINE, 1e-5);
  const int64_t m = 3, n = 64, K = 2;
  c.k.m = m;
  c.k.n = n;
  c.k.top_k = K;
  c.k.y = f32(&c, (uint64_t)(m * n));
  c.k.aux[0] = f32(&c, (uint64_t)(m * K * n));
  c.k.aux[1] = f32(&c, (uint64_t)(m * K));
  c.k.aux[2] = f32(&c, (uint64_t)(m * n));
  c.k.aux[3] = f32(&c, (uint64_t)m);
  out(&c, c.k.y, (uint64_t)(m * n));
  return c;
}

static struct kcase case_gather(void) {
  struct kcase c = base("gather_rows", FERRY_K_GATHER_ROWS, 0);
  const int32_t rows[3] = {2, 0, 2};
  c.k.m = 3;
  c.k.n = 50;
  c.k.x = f32(&c, 3 * 50);
  c.k.y = f32(&c, 3 * 50);
  memcpy(c.ints, rows, sizeof rows);
  c.k.n_ints = 3;
  out(&c, c.k.y, 3 * 50);
  return c;
}

static struct kcase case_embed(int learned_pos) {
  struct kcase c = base(learned_pos ? "embed.pos" : "embed", FERRY_K_EMBED, 0);
  const int32_t ids[4] = {1, 9, 0, 3}, pos[4] = {0, 1, 5, 7};
  c.k.m = 4;
  c.k.n = 64;
  c.k.w = typed(&c, 10 * 64, FERRY_DTYPE_F16);
  if (learned_pos) {
    c.k.aux[0] = typed(&c, 12 * 64, FERRY_DTYPE_F32);
    c.k.pos_offset = 2;
  }
  c.k.y = f32(&c, 4 * 64);
  memcpy(c.ints, ids, sizeof ids);
  memcpy(c.ints2, pos, sizeof pos);
  c.k.n_ints = 4;
  out(&c, c.k.y, 4 * 64);
  return c;
}

/* A [37, 200] weight (200 is not a multiple of the groups: tails are exercised), expanded into
 * fp32 or (name "<spec>.fp16") fp16, as the engine asks of an executor whose fast path that is. */
static struct kcase case_dequant(const char *name, enum ferry_dtype ydt) {
  char spec_text[32];
  snprintf(spec_text, sizeof spec_text, "%s", name);
  char *dot = strchr(spec_text, '.');
  if (dot) *dot = '\0';
  struct kcase c = base(name, FERRY_K_DEQUANTIZE, 1e-6);
  c.quant = 1;
  if (ferry_quant_spec_parse(spec_text, &c.qspec) != FERRY_OK ||
      ferry_quant_layout(&c.qspec, 37, 200, &c.qlayout) != FERRY_OK) {
    fprintf(stderr, "kernel_cases: %s: %s\n", spec_text, ferry_last_error());
    exit(2);
  }
  c.k.n = 37;
  c.k.k = 200;
  c.k.m = (int64_t)c.qlayout.total_bytes;
  c.k.qformat = (int32_t)c.qspec.format;
  c.k.qgroup = c.qspec.group_size;
  c.blob_off = place(&c, c.qlayout.blob_bytes);
  for (int p = 0; p < FERRY_QPART_COUNT; p++)
    if (c.qlayout.part[p].bytes) c.k.aux[p] = ref(c.blob_off + c.qlayout.part[p].offset, FERRY_DTYPE_U8);
  /* fp16 output in the fp32 case's room: the same layout, so the same random weight */
  c.k.y = ref(place(&c, 37 * 200 * 4), ydt);
  out(&c, c.k.y, 37 * 200);
  c.out_dt = ydt;
  return c;
}

static void fill_case(const struct kcase *c, char *h) {
  struct ferry_rng rng;
  ferry__rng_seed(&rng, 12345);
  for (uint64_t i = 0; i + 4 <= c->bytes; i += 4) {
    float v = (float)(ferry__rng_uniform(&rng) * 2.0 - 1.0);
    memcpy(h + i, &v, 4);
  }
  for (int r = 0; r < c->n_fill; r++) {
    const struct kc_region *g = &c->fill[r];
    for (uint64_t i = 0; i < g->n; i++) {
      float v = (float)(ferry__rng_uniform(&rng) * 2.0 - 1.0) * 0.5f;
      if (g->dt == FERRY_DTYPE_F16) ((uint16_t *)(void *)(h + g->off))[i] = ferry__f32_to_f16(v);
      else if (g->dt == FERRY_DTYPE_BF16) ((uint16_t *)(void *)(h + g->off))[i] = ferry__f32_to_bf16(v);
      else ((float *)(void *)(h + g->off))[i] = v;
    }
  }
  if (c->quant) {
    float *src = malloc((size_t)(c->k.n * c->k.k) * sizeof(float));
    if (!src) exit(2);
    for (int64_t i = 0; i < c->k.n * c->k.k; i++) src[i] = (float)(ferry__rng_normal(&rng) * 0.05);
    struct ferry_qout qo;
    for (int p = 0; p < FERRY_QPART_COUNT; p++) qo.part[p] = h + c->blob_off + c->qlayout.part[p].offset;
    if (ferry_quant_quantize(&c->qspec, src, c->k.n, c->k.k, &qo) != FERRY_OK) {
      fprintf(stderr, "kernel_cases: quantize %s: %s\n", c->name, ferry_last_error());
      exit(2);
    }
    free(src);
  }
}

ferry_status kc_run(ferry_exec *ex, const struct kcase *c, uint64_t device_bytes, char **result) {
  const uint64_t moved = device_bytes < c->bytes ? device_bytes : c->bytes;
  int32_t qc, qh, qd;
  ferry_buf *h = NULL, *d = NULL;
  ferry_event *up = NULL, *done = NULL, *down = NULL;
  ferry_status st;
  if ((st = ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc)) || (st = ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh)) ||
      (st = ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd)) ||
      (st = ferry_exec_alloc(ex, FERRY_TIER_HOST, c->bytes, "case host", &h)) ||
      (st = ferry_exec_alloc(ex, FERRY_TIER_DEVICE, device_bytes, "case device", &d)) ||
      (st = ferry_exec_event_create(ex, &up)) || (st = ferry_exec_event_create(ex, &done)) ||
      (st = ferry_exec_event_create(ex, &down)))
    goto out;
  char *hp = ferry_exec_buf_host_ptr(ex, h);
  if (hp) fill_case(c, hp); /* an executor without host-visible memory (sim) computes nothing */
  struct ferry_kernel k = c->k;
  struct ferry_ref *refs[] = {&k.x, &k.y, &k.w, &k.b, &k.aux[0], &k.aux[1], &k.aux[2], &k.aux[3], &k.aux[4], &k.aux[5], &k.aux[6], &k.aux[7]};
  _Static_assert(sizeof k.aux / sizeof k.aux[0] == 8, "every aux reference is placed");
  for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++)
    if (refs[i]->buf) refs[i]->buf = d;
  k.ints = c->ints;
  k.ints2 = c->ints2;
  struct ferry_ref rh = {h, 0, FERRY_DTYPE_U8}, rd = {d, 0, FERRY_DTYPE_U8};
  if ((st = ferry_exec_copy(ex, qh, rd, rh, moved)) || (st = ferry_exec_record(ex, qh, up)) ||
      (st = ferry_exec_queue_wait(ex, qc, up)) || (st = ferry_exec_compute(ex, qc, &k)) ||
      (st = ferry_exec_record(ex, qc, done)) || (st = ferry_exec_queue_wait(ex, qd, done)) ||
      (st = ferry_exec_copy(ex, qd, rh, rd, moved)) || (st = ferry_exec_record(ex, qd, down)) ||
      (st = ferry_exec_sync(ex, down)))
    goto out;
  *result = calloc(1, c->bytes);
  if (!*result) {
    st = FERRY_ERR_NOMEM;
    goto out;
  }
  if (hp) memcpy(*result, hp, c->bytes);
out:
  ferry_exec_drain(ex);
  ferry_exec_event_destroy(ex, up);
  ferry_exec_event_destroy(ex, done);
  ferry_exec_event_destroy(ex, down);
  ferry_exec_free(ex, h);
  ferry_exec_free(ex, d);
  return st;
}


/* A ring cache (Gemma's and Llama 4's local layers): positions past the capacity wrap, a
 * window no longer than the cache. */
static struct kcase case_attention_ring(void) {
  struct kcase c = case_attention("attention.ring", 4, FERRY_DTYPE_F32, 64);
  const int64_t cap = 8, slots = 2, KV = 2, hd = 64;
  const int32_t pos[4] = {0, 1, 9, 50};
  c.k.kv_capacity = cap;
  c.k.kv_ring = 1;
  /* smaller caches at the end of the case */
  c.k.aux[2] = typed(&c, (uint64_t)(slots * cap * KV * hd), FERRY_DTYPE_F32);
  c.k.aux[3] = typed(&c, (uint64_t)(slots * cap * KV * hd), FERRY_DTYPE_F32);
  memcpy(c.ints, pos, sizeof pos);
  return c;
}

/* A fused gate_up expert twice as wide, with biases (Llama 4, gpt-oss layouts). */
static struct kcase case_expert_fused(void) {
  struct kcase c = base("expert.fused", FERRY_K_EXPERT, 1e-4);
  const int64_t m = 4, T = 4, hidden = 64, inter = 48, K = 2;
  const int32_t tok[4] = {0, 1, 2, 3}, rank[4] = {0, 1, 1, 0};
  c.k.m = m;
  c.k.n = inter;
  c.k.k = hidden;
  c.k.top_k = K;
  c.k.expert_layout = FERRY_EXPERTS_FUSED_HALVES;
  c.k.x = f32(&c, (uint64_t)(T * hidden));
  c.k.y = f32(&c, (uint64_t)(T * K * hidden));
  c.k.w = typed(&c, (uint64_t)(2 * inter * hidden), FERRY_DTYPE_F32);
  c.k.aux[1] = typed(&c, (uint64_t)(hidden * inter), FERRY_DTYPE_F32);
  c.k.aux[6] = typed(&c, (uint64_t)(2 * inter), FERRY_DTYPE_F32);
  c.k.aux[7] = typed(&c, (uint64_t)hidden, FERRY_DTYPE_F32);
  c.k.aux[2] = f32(&c, (uint64_t)(m * hidden));
  c.k.aux[3] = f32(&c, (uint64_t)(m * 2 * inter));
  c.k.aux[4] = f32(&c, (uint64_t)(m * inter));
  memcpy(c.ints, tok, sizeof tok);
  memcpy(c.ints2, rank, sizeof rank);
  c.k.n_ints = m;
  out(&c, c.k.y, (uint64_t)(T * K * hidden));
  return c;
}

/* A fused query_key_value output split into q, k and v (GPT-NeoX, BLOOM). */
static struct kcase case_split_qkv(void) {
  struct kcase c = base("split_qkv", FERRY_K_SPLIT_QKV, 0);
  const int64_t m = 3, H = 4, hd = 16;
  c.k.m = m;
  c.k.heads = H;
  c.k.head_dim = hd;
  c.k.x = f32(&c, (uint64_t)(m * H * 3 * hd));
  c.k.y = f32(&c, (uint64_t)(m * H * hd));
  c.k.aux[0] = f32(&c, (uint64_t)(m * H * hd));
  c.k.aux[1] = f32(&c, (uint64_t)(m * H * hd));
  out(&c, c.k.y, (uint64_t)(m * H * hd) * 3); /* q, k and v, one after the other */
  return c;
}

/* Multi-head latent attention over a compressed cache (DeepSeek-V2/V3). */
static struct kcase case_mla_attention(void) {
  struct kcase c = base("mla_attention", FERRY_K_MLA_ATTENTION, 1e-3);
  const int64_t m = 3, H = 4, nope = 16, rope = 8, rank = 32, vd = 16, cap = 12, slots = 2;
  const int32_t pos[3] = {0, 1, 5}, slot[3] = {0, 0, 1};
  c.k.m = m;
  c.k.heads = H;
  c.k.head_dim = nope;
  c.k.rot_dim = rope;
  c.k.k = rank;
  c.k.n = vd;
  c.k.kv_capacity = cap;
  c.k.x = f32(&c, (uint64_t)(m * H * (nope + rope)));
  c.k.aux[0] = f32(&c, (uint64_t)(m * (rank + rope)));
  c.k.w = typed(&c, (uint64_t)(H * (nope + vd) * rank), FERRY_DTYPE_F16);
  c.k.aux[2] = typed(&c, (uint64_t)(slots * cap * (rank + rope)), FERRY_DTYPE_F32);
  c.k.y = f32(&c, (uint64_t)(m * H * vd));
  memcpy(c.ints, pos, sizeof pos);
  memcpy(c.ints2, slot, sizeof slot);
  c.k.n_ints = m;
  out(&c, c.k.y, (uint64_t)(m * H * vd));
  return c;
}

const struct kcase *kc_cases(size_t *n) {
  static struct kcase cases[42];
  static int built;
  if (!built) {
    const struct kcase all[] = {
      case_matmul("matmul.fp32.bias.acc", 7, 320, 200, FERRY_DTYPE_F32, 1, 1, 1e-4),
      case_matmul("matmul.fp16.gemv", 1, 4096, 1024, FERRY_DTYPE_F16, 0, 0, 1e-2),
      case_matmul("matmul.fp16.gemm", 300, 1024, 512, FERRY_DTYPE_F16, 0, 1, 1e-2),
      case_matmul("matmul.bf16.bias", 33, 512, 384, FERRY_DTYPE_BF16, 1, 0, 1e-2),
      case_norm("norm.rms.fp16w", 0, 4, 1000, FERRY_DTYPE_F16),
      case_norm("norm.layer.fp32", 1, 3, 777, FERRY_DTYPE_F32),
      case_rope(),
      case_attention("attention.f16cache", 0, FERRY_DTYPE_F16, 64),
      case_attention("attention.window", 3, FERRY_DTYPE_F16, 64),
      case_attention("attention.window600", 600, FERRY_DTYPE_F32, 64),
      case_attention_prefill("attention.prefill", 0, FERRY_DTYPE_F16, 128),
      case_attention_prefill("attention.prefill.window", 20, FERRY_DTYPE_F32, 64),
      case_attention_prefill("attention.prefill.hd80", 0, FERRY_DTYPE_BF16, 80),
      case_attention("attention.f32cache", 0, FERRY_DTYPE_F32, 64),
      case_attention("attention.hd80", 0, FERRY_DTYPE_BF16, 80),
      case_attention_ring(),
      case_kv_append(),
      case_split_qkv(),
      case_mla_attention(),
      case_act("swiglu", FERRY_FN_SILU_MUL),
      case_act("gelu", FERRY_FN_GELU),
      case_act("relu", FERRY_FN_RELU),
      case_router("router.renorm", 1),
      case_router("router", 0),
      case_expert(FERRY_DTYPE_F32),
      case_expert(FERRY_DTYPE_F16),
      case_expert_fused(),
      case_combine(),
      case_gather(),
      case_embed(0),
      case_embed(1),
      case_dequant("int8", FERRY_DTYPE_F32),
      case_dequant("int4-g64", FERRY_DTYPE_F32),
      case_dequant("int3-g32", FERRY_DTYPE_F32),
      case_dequant("int2-g64", FERRY_DTYPE_F32),
      case_dequant("nf4", FERRY_DTYPE_F32),
      case_dequant("fp16", FERRY_DTYPE_F32),
      case_dequant("bf16", FERRY_DTYPE_F32),
      case_dequant("int8.fp16", FERRY_DTYPE_F16),
      case_dequant("int4-g64.fp16", FERRY_DTYPE_F16),
      case_dequant("int3-g32.fp16", FERRY_DTYPE_F16),
      case_dequant("nf4.fp16", FERRY_DTYPE_F16),
  };
    _Static_assert(sizeof all / sizeof all[0] == sizeof cases / sizeof cases[0], "the table's size");
    memcpy(cases, all, sizeof cases);
    built = 1;
  }
  *n = sizeof cases / sizeof cases[0];
  return cases;
}

/* Output element j of a case's bytes as read back. */
static double out_value(const struct kcase *c, const char *bytes, uint64_t j) {
  if (c->out_dt == FERRY_DTYPE_F16) {
    uint16_t h;
    memcpy(&h, bytes + c->out_off + 2 * j, 2);
    return (double)ferry__f16_to_f32(h);
  }
  float f;
  memcpy(&f, bytes + c->out_off + 4 * j, 4);
  return (double)f;
}

double kc_max_rel_error(const struct kcase *c, const char *a, const char *b, int *ids_ok, int *nonfinite) {
  double maxdiff = 0, maxabs = 0;
  *nonfinite = 0;
  for (uint64_t j = 0; j < c->out_floats; j++) {
    const double va = out_value(c, a, j), vb = out_value(c, b, j);
    if (!isfinite(vb) && isfinite(va)) *nonfinite = 1;
    const double d = fabs(va - vb);
    if (d > maxdiff) maxdiff = d;
    if (fabs(va) > maxabs) maxabs = fabs(va);
  }
  *ids_ok = c->ids_n == 0 || !memcmp(a + c->ids_off, b + c->ids_off, c->ids_n * 4);
  return maxdiff / (maxabs > 1e-30 ? maxabs : 1.0);
}
