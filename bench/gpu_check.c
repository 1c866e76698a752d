/* The GPU check's measuring tool (driven by scripts/gpu-check.sh): kernel-by-kernel comparison
 * of the cuda executor against the host executor, end-to-end logits of a model on both,
 * probes of pinned H2D/D2H bandwidth and GEMM throughput written as a calibrated hardware
 * profile, and the measured-vs-simulated table over result databases. Everything goes through
 * the public executor API, so the same code would check any executor that computes.
 * Exit status: 0 pass, 1 fail, 2 usage or I/O error, 77 no CUDA device (skip). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "common/half.h"
#include "common/rng.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/store.h"

#define EXIT_SKIP 77

typedef ferry_status (*make_fn)(ferry_exec **out, const struct ferry_exec_config *c);

static int die(const char *what) {
  fprintf(stderr, "gpu_check: %s: %s\n", what, ferry_last_error());
  return 2;
}

/* Create the cuda executor or explain why not (77 = skip). */
static int make_cuda(ferry_exec **ex) {
  struct ferry_exec_config c = {0};
  ferry_status st = ferry_exec_create_cuda(ex, &c);
  if (st == FERRY_OK) return 0;
  fprintf(stderr, "gpu_check: %s\n", ferry_last_error());
  return st == FERRY_ERR_NO_DEVICE || st == FERRY_ERR_UNSUPPORTED ? EXIT_SKIP : 2;
}

/* --- kernels: one case per kernel kind and variant ------------------------------------------- */

struct region {
  uint64_t off, n;
  enum ferry_dtype dt;
};

struct kcase {
  const char *name;
  struct ferry_kernel k; /* refs carry offsets; buf is set to the device buffer when non-NULL */
  uint64_t bytes;
  struct region fill[8]; /* typed random contents (everything else: fp32 in [-1, 1]) */
  int n_fill;
  uint64_t out_off, out_floats; /* compared as floats */
  uint64_t ids_off, ids_n;      /* compared exactly as int32 (router ids) */
  double tol;
  int32_t ints[64], ints2[64];
  int quant; /* DEQUANTIZE: a packed weight of qspec at blob_off, quantized from random floats */
  struct ferry_qspec qspec;
  struct ferry_qlayout qlayout;
  uint64_t blob_off;
};

static ferry_buf *const PLACEHOLDER = (ferry_buf *)1;

static uint64_t place(struct kcase *c, uint64_t bytes) {
  uint64_t off = c->bytes;
  c->bytes += (bytes + 255) / 256 * 256;
  return off;
}

static struct ferry_ref ref(uint64_t off, enum ferry_dtype dt) { return (struct ferry_ref){PLACEHOLDER, off, dt}; }

static struct ferry_ref typed(struct kcase *c, uint64_t n, enum ferry_dtype dt) {
  uint64_t off = place(c, n * (dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16 ? 2 : 4));
  c->fill[c->n_fill++] = (struct region){off, n, dt};
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

static struct kcase case_attention(const char *name, int64_t window, enum ferry_dtype cdt) {
  struct kcase c = base(name, FERRY_K_ATTENTION, 1e-3);
  const int64_t m = 4, H = 8, KV = 2, hd = 64, cap = 1100, slots = 2;
  /* slot 0: three new tokens at 0..2; slot 1: one token at 1050 over 1050 cached positions
   * (more than one key tile) */
  const int32_t pos[4] = {0, 1, 2, 1050}, slot[4] = {0, 0, 0, 1};
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
  memcpy(c.ints, pos, sizeof pos);
  memcpy(c.ints2, slot, sizeof slot);
  c.k.n_ints = m;
  out(&c, c.k.y, (uint64_t)(m * H * hd));
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

/* A [37, 200] weight (200 is not a multiple of the groups: tails are exercised). */
static struct kcase case_dequant(const char *spec_text) {
  struct kcase c = base(spec_text, FERRY_K_DEQUANTIZE, 1e-6);
  c.quant = 1;
  if (ferry_quant_spec_parse(spec_text, &c.qspec) != FERRY_OK ||
      ferry_quant_layout(&c.qspec, 37, 200, &c.qlayout) != FERRY_OK) {
    fprintf(stderr, "gpu_check: %s: %s\n", spec_text, ferry_last_error());
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
  c.k.y = f32(&c, 37 * 200);
  out(&c, c.k.y, 37 * 200);
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
    const struct region *g = &c->fill[r];
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
      fprintf(stderr, "gpu_check: quantize %s: %s\n", c->name, ferry_last_error());
      exit(2);
    }
    free(src);
  }
}

/* Run one case on an executor: fill host, copy up, compute, copy down, sync. Result bytes are
 * returned (owned, free()). */
static ferry_status run_case(ferry_exec *ex, const struct kcase *c, char **result) {
  int32_t qc, qh, qd;
  ferry_buf *h = NULL, *d = NULL;
  ferry_event *up = NULL, *done = NULL, *down = NULL;
  ferry_status st;
  if ((st = ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc)) || (st = ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh)) ||
      (st = ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd)) ||
      (st = ferry_exec_alloc(ex, FERRY_TIER_HOST, c->bytes, "case host", &h)) ||
      (st = ferry_exec_alloc(ex, FERRY_TIER_DEVICE, c->bytes, "case device", &d)) ||
      (st = ferry_exec_event_create(ex, &up)) || (st = ferry_exec_event_create(ex, &done)) ||
      (st = ferry_exec_event_create(ex, &down)))
    goto out;
  char *hp = ferry_exec_buf_host_ptr(ex, h);
  fill_case(c, hp);
  struct ferry_kernel k = c->k;
  struct ferry_ref *refs[] = {&k.x, &k.y, &k.w, &k.b, &k.aux[0], &k.aux[1], &k.aux[2], &k.aux[3], &k.aux[4], &k.aux[5]};
  for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++)
    if (refs[i]->buf) refs[i]->buf = d;
  k.ints = c->ints;
  k.ints2 = c->ints2;
  struct ferry_ref rh = {h, 0, FERRY_DTYPE_U8}, rd = {d, 0, FERRY_DTYPE_U8};
  if ((st = ferry_exec_copy(ex, qh, rd, rh, c->bytes)) || (st = ferry_exec_record(ex, qh, up)) ||
      (st = ferry_exec_queue_wait(ex, qc, up)) || (st = ferry_exec_compute(ex, qc, &k)) ||
      (st = ferry_exec_record(ex, qc, done)) || (st = ferry_exec_queue_wait(ex, qd, done)) ||
      (st = ferry_exec_copy(ex, qd, rh, rd, c->bytes)) || (st = ferry_exec_record(ex, qd, down)) ||
      (st = ferry_exec_sync(ex, down)))
    goto out;
  *result = malloc(c->bytes);
  if (!*result) {
    st = FERRY_ERR_NOMEM;
    goto out;
  }
  memcpy(*result, hp, c->bytes);
out:
  ferry_exec_drain(ex);
  ferry_exec_event_destroy(ex, up);
  ferry_exec_event_destroy(ex, done);
  ferry_exec_event_destroy(ex, down);
  ferry_exec_free(ex, h);
  ferry_exec_free(ex, d);
  return st;
}

/* second = the executor checked against the host one (the host itself for a self-test of the
 * harness, where every error must be exactly zero) */
static int cmd_kernels(int self_test) {
  struct kcase cases[] = {
      case_matmul("matmul.fp32.bias.acc", 7, 320, 200, FERRY_DTYPE_F32, 1, 1, 1e-4),
      case_matmul("matmul.fp16.gemv", 1, 4096, 1024, FERRY_DTYPE_F16, 0, 0, 1e-2),
      case_matmul("matmul.fp16.gemm", 300, 1024, 512, FERRY_DTYPE_F16, 0, 1, 1e-2),
      case_matmul("matmul.bf16.bias", 33, 512, 384, FERRY_DTYPE_BF16, 1, 0, 1e-2),
      case_norm("norm.rms.fp16w", 0, 4, 1000, FERRY_DTYPE_F16),
      case_norm("norm.layer.fp32", 1, 3, 777, FERRY_DTYPE_F32),
      case_rope(),
      case_attention("attention.f16cache", 0, FERRY_DTYPE_F16),
      case_attention("attention.window", 3, FERRY_DTYPE_F16),
      case_attention("attention.f32cache", 0, FERRY_DTYPE_F32),
      case_act("swiglu", FERRY_FN_SILU_MUL),
      case_act("gelu", FERRY_FN_GELU),
      case_act("relu", FERRY_FN_RELU),
      case_router("router.renorm", 1),
      case_router("router", 0),
      case_expert(FERRY_DTYPE_F32),
      case_expert(FERRY_DTYPE_F16),
      case_combine(),
      case_gather(),
      case_embed(0),
      case_embed(1),
      case_dequant("int8"),
      case_dequant("int4-g64"),
      case_dequant("int3-g32"),
      case_dequant("int2-g64"),
      case_dequant("nf4"),
      case_dequant("fp16"),
      case_dequant("bf16"),
  };
  ferry_exec *cu = NULL;
  if (!self_test) {
    int rc = make_cuda(&cu);
    if (rc) return rc;
    ferry_exec_destroy(cu);
  }
  int failures = 0;
  printf("%-24s %12s %10s %s\n", "kernel", "max rel err", "tolerance", "result");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const struct kcase *c = &cases[i];
    ferry_exec *host = NULL;
    char *a = NULL, *b = NULL;
    struct ferry_exec_config xc = {.compute_threads = 1};
    if (ferry_exec_create_host(&host, &xc) != FERRY_OK) return die("host executor");
    if (self_test ? ferry_exec_create_host(&cu, &xc) != FERRY_OK : make_cuda(&cu) != 0) return 2;
    ferry_status sa = run_case(host, c, &a), sb = run_case(cu, c, &b);
    if (sa != FERRY_OK || sb != FERRY_OK) {
      printf("%-24s %12s %10s FAIL (%s: %s)\n", c->name, "-", "-", sa ? "host" : "cuda",
             ferry_exec_errmsg(sa ? host : cu));
      failures++;
    } else {
      const float *fa = (const float *)(void *)(a + c->out_off), *fb = (const float *)(void *)(b + c->out_off);
      double maxdiff = 0, maxabs = 0;
      int nonfinite = 0;
      for (uint64_t j = 0; j < c->out_floats; j++) {
        if (!isfinite(fb[j]) && isfinite(fa[j])) nonfinite = 1;
        double d = fabs((double)fa[j] - (double)fb[j]);
        if (d > maxdiff) maxdiff = d;
        if (fabs((double)fa[j]) > maxabs) maxabs = fabs((double)fa[j]);
      }
      double rel = maxdiff / (maxabs > 1e-30 ? maxabs : 1.0);
      int ids_ok = c->ids_n == 0 || !memcmp(a + c->ids_off, b + c->ids_off, c->ids_n * 4);
      int ok = !nonfinite && rel <= (self_test ? 0.0 : c->tol) && ids_ok;
      printf("%-24s %12.3e %10.1e %s%s\n", c->name, rel, c->tol, ok ? "ok" : "FAIL", ids_ok ? "" : " (ids differ)");
      failures += !ok;
    }
    free(a);
    free(b);
    ferry_exec_destroy(host);
    ferry_exec_destroy(cu);
  }
  printf("kernels: %d of %zu failed\n", failures, sizeof cases / sizeof cases[0]);
  return failures ? 1 : 0;
}

/* --- logits: a whole model on both executors ------------------------------------------------- */

struct logit_log {
  float *data;
  size_t floats, cap;
  int64_t rows, vocab;
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens,
                      const float *logits, int64_t vocab) {
  (void)req;
  (void)tok;
  (void)tokens;
  (void)n_tokens;
  struct logit_log *l = user;
  if (l->floats + (size_t)vocab > l->cap) {
    size_t cap = (l->cap + (size_t)vocab) * 2;
    float *p = realloc(l->data, cap * sizeof(float));
    if (!p) return;
    l->data = p;
    l->cap = cap;
  }
  memcpy(l->data + l->floats, logits, (size_t)vocab * sizeof(float));
  l->floats += (size_t)vocab;
  l->rows++;
  l->vocab = vocab;
}

static const struct ferry_engine_request logit_requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 12, .output_tokens = 8},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 5, .output_tokens = 12},
    {.id = 2, .arrival_ns = 0, .prompt_tokens = 30, .output_tokens = 4},
};

static ferry_status run_model(const char *dir, make_fn make, struct logit_log *log) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  ferry_status st;
  struct ferry_exec_config xc = {.compute_threads = 0};
  if ((st = ferry_model_open(&m, dir)) || (st = ferry_store_open(&s, dir)) || (st = make(&ex, &xc))) goto out;
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 64, .seed = 5, .greedy = 1};
  c.on_logits = on_logits;
  c.logits_user = log;
  if ((st = ferry_engine_create(&e, m, s, ex, &c))) goto out;
  struct ferry_run_options ro = {.as_fast_as_possible = 1};
  st = ferry_engine_run(e, logit_requests, (int64_t)(sizeof logit_requests / sizeof logit_requests[0]), &ro);
out:
  if (st) fprintf(stderr, "gpu_check: %s\n", ferry_last_error());
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
  return st;
}

static int64_t argmax(const float *v, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (v[i] > v[b]) b = i;
  return b;
}

/* self_test: host against host, every logit identical (checks the harness, as kernels --self-test) */
static int cmd_logits(const char *dir, double tol, int self_test) {
  if (self_test) {
    tol = 0;
  } else {
    ferry_exec *probe = NULL;
    int rc = make_cuda(&probe);
    if (rc) return rc;
    ferry_exec_destroy(probe);
  }
  struct logit_log lh = {0}, lc = {0};
  if (run_model(dir, ferry_exec_create_host, &lh) ||
      run_model(dir, self_test ? ferry_exec_create_host : ferry_exec_create_cuda, &lc)) {
    free(lh.data);
    free(lc.data);
    return 2;
  }
  int64_t rows = lh.rows < lc.rows ? lh.rows : lc.rows, top1_same = 0, first_diff = -1;
  double worst = 0;
  for (int64_t r = 0; r < rows; r++) {
    const float *a = lh.data + r * lh.vocab, *b = lc.data + r * lc.vocab;
    double maxdiff = 0, maxabs = 0;
    for (int64_t i = 0; i < lh.vocab; i++) {
      double d = fabs((double)a[i] - (double)b[i]);
      if (!(d <= maxdiff)) maxdiff = d; /* NaN counts as the worst */
      if (fabs((double)a[i]) > maxabs) maxabs = fabs((double)a[i]);
    }
    double rel = maxdiff / (maxabs > 1e-30 ? maxabs : 1.0);
    if (!(rel <= worst)) worst = rel;
    if (argmax(a, lh.vocab) == argmax(b, lc.vocab)) top1_same++;
    else if (first_diff < 0) first_diff = r;
  }
  int ok = lh.rows == lc.rows && rows > 0 && top1_same == rows && worst <= tol;
  printf("logits: %lld rows (host %lld, %s %lld), max relative error %.3e (tolerance %.1e), same top-1 %lld/%lld%s -> %s\n",
         (long long)rows, (long long)lh.rows, self_test ? "host again" : "cuda", (long long)lc.rows, worst, tol, (long long)top1_same, (long long)rows,
         first_diff >= 0 ? " (first difference at a row; greedy decoding diverges after it)" : "", ok ? "ok" : "FAIL");
  free(lh.data);
  free(lc.data);
  return ok ? 0 : 1;
}

/* --- probe: link bandwidth and GEMM throughput into a calibrated profile --------------------- */

static double copy_gbps(ferry_exec *ex, int32_t q, struct ferry_ref dst, struct ferry_ref src, uint64_t bytes, int reps) {
  ferry_event *ev = NULL;
  if (ferry_exec_event_create(ex, &ev)) return 0;
  double best = 0;
  for (int r = 0; r < reps + 1; r++) { /* the first round warms up */
    int64_t t0 = ferry_exec_now(ex);
    if (ferry_exec_copy(ex, q, dst, src, bytes) || ferry_exec_record(ex, q, ev) || ferry_exec_sync(ex, ev)) break;
    int64_t dt = ferry_exec_now(ex) - t0;
    double gbps = dt > 0 ? (double)bytes / (double)dt : 0;
    if (r > 0 && gbps > best) best = gbps;
  }
  ferry_exec_event_destroy(ex, ev);
  return best;
}

/* TFLOP/s of y[m,n] = x[m,k] W[n,k]^T with weights of dtype wdt: after one warm-up, reps
 * products issued back to back and synchronised once, so a short product (a GEMV takes tens of
 * microseconds on a large GPU) is not charged the host's submit-to-completion round trip. */
static double gemm_tflops(ferry_exec *ex, int32_t qc, ferry_buf *d, int64_t m, int64_t n, int64_t k,
                          enum ferry_dtype wdt, int reps) {
  const uint64_t xb = (uint64_t)(m * k) * 4, wb = (uint64_t)(n * k) * (wdt == FERRY_DTYPE_F32 ? 4 : 2);
  struct ferry_kernel kk = {.kind = FERRY_K_MATMUL, .name = "probe_gemm", .layer = -1, .expert = -1, .m = m, .n = n, .k = k};
  kk.x = (struct ferry_ref){d, 0, FERRY_DTYPE_F32};
  kk.w = (struct ferry_ref){d, xb, wdt};
  kk.y = (struct ferry_ref){d, xb + wb, FERRY_DTYPE_F32};
  ferry_event *ev = NULL;
  if (ferry_exec_event_create(ex, &ev)) return 0;
  double tf = 0;
  if (ferry_exec_compute(ex, qc, &kk) || ferry_exec_record(ex, qc, ev) || ferry_exec_sync(ex, ev)) goto fail;
  const int64_t t0 = ferry_exec_now(ex);
  for (int r = 0; r < reps; r++)
    if (ferry_exec_compute(ex, qc, &kk)) goto fail;
  if (ferry_exec_record(ex, qc, ev) || ferry_exec_sync(ex, ev)) goto fail;
  const int64_t dt = ferry_exec_now(ex) - t0;
  tf = dt > 0 ? 2.0 * (double)m * (double)n * (double)k * reps / (double)dt / 1e3 : 0;
  ferry_exec_event_destroy(ex, ev);
  return tf;
fail:
  fprintf(stderr, "gpu_check: gemm probe: %s\n", ferry_exec_errmsg(ex));
  ferry_exec_event_destroy(ex, ev);
  return 0;
}

/* The calibrated profile: BASE composed with the measured link rates and GEMM/GEMV
 * efficiencies, listed under "fitted"; reloaded to check it. 0, or 2 on an I/O error. */
static int write_profile(const char *out_path, const char *base, const char *link, const char *hostp, const char *disk,
                         double h2d, double d2h, double eff_gemm, double eff_gemv) {
  FILE *f = fopen(out_path, "w");
  if (!f) {
    fprintf(stderr, "gpu_check: cannot write %s\n", out_path);
    return 2;
  }
  fprintf(f,
          "{\n  \"name\": \"calibrated\",\n  \"kind\": \"gpu\",\n"
          "  \"gpu\": {\"base\": \"%s\", \"efficiency\": {\"gemm\": %.4f, \"gemv\": %.4f}},\n"
          "  \"link\": {\"base\": \"%s\", \"h2d_gbps\": %.3f, \"d2h_gbps\": %.3f},\n"
          "  \"host\": \"%s\",\n  \"disk\": \"%s\",\n"
          "  \"fitted\": [\"gpu.efficiency.gemm\", \"gpu.efficiency.gemv\", \"link.h2d_gbps\", \"link.d2h_gbps\"]\n}\n",
          base, eff_gemm, eff_gemv, link, h2d, d2h, hostp, disk);
  if (fclose(f) != 0) {
    fprintf(stderr, "gpu_check: cannot write %s\n", out_path);
    return 2;
  }
  ferry_hw *check = NULL;
  if (ferry_hw_open(&check, out_path) != FERRY_OK) return die("the written profile does not load");
  ferry_hw_close(check);
  return 0;
}

/* profile OUT.json H2D D2H EFF_GEMM EFF_GEMV [BASE LINK HOST DISK]: the profile the probe
 * writes, from given figures (the rehearsal checks the format loads and simulates). */
static int cmd_profile(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: gpu_check profile OUT.json H2D_GBPS D2H_GBPS EFF_GEMM EFF_GEMV [BASE LINK HOST DISK]\n");
    return 2;
  }
  double v[4];
  for (int i = 0; i < 4; i++) {
    char *end = NULL;
    v[i] = strtod(argv[3 + i], &end);
    if (!end || *end || !(v[i] > 0)) {
      fprintf(stderr, "gpu_check: profile: '%s' is not a positive number\n", argv[3 + i]);
      return 2;
    }
  }
  return write_profile(argv[2], argc > 7 ? argv[7] : "h200", argc > 8 ? argv[8] : "pcie5-x16",
                       argc > 9 ? argv[9] : "ddr5", argc > 10 ? argv[10] : "nvme-gen4", v[0], v[1], v[2], v[3]);
}

static int cmd_probe(const char *out_path, const char *base, const char *link, const char *hostp, const char *disk) {
  ferry_exec *ex = NULL;
  int rc = make_cuda(&ex);
  if (rc) return rc;
  ferry_hw *hw = NULL;
  if (ferry_hw_open(&hw, base) != FERRY_OK) {
    ferry_exec_destroy(ex);
    return die("base profile");
  }
  const struct ferry_hw_profile *bp = ferry_hw_get(hw);
  const uint64_t N = 512ull << 20;
  int32_t qh, qd, qc;
  ferry_buf *h = NULL, *d = NULL;
  if (ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh) || ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd) ||
      ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc) || ferry_exec_alloc(ex, FERRY_TIER_HOST, N, "probe host", &h) ||
      ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 2 * N, "probe device", &d)) {
    rc = die("probe set-up");
    goto out;
  }
  memset(ferry_exec_buf_host_ptr(ex, h), 0, N);
  struct ferry_ref rh = {h, 0, FERRY_DTYPE_U8}, rd = {d, 0, FERRY_DTYPE_U8};
  const double h2d = copy_gbps(ex, qh, rd, rh, N, 5), d2h = copy_gbps(ex, qd, rh, rd, N, 5);
  /* zero the GEMM operands (device to device copies of the zeroed host buffer) */
  struct ferry_ref rd2 = {d, N, FERRY_DTYPE_U8};
  ferry_event *ev = NULL;
  if (ferry_exec_copy(ex, qh, rd2, rh, N) || ferry_exec_event_create(ex, &ev) || ferry_exec_record(ex, qh, ev) ||
      ferry_exec_sync(ex, ev)) {
    rc = die("probe zeroing");
    goto out;
  }
  ferry_exec_event_destroy(ex, ev);
  const double tf16 = gemm_tflops(ex, qc, d, 4096, 8192, 8192, FERRY_DTYPE_F16, 10);
  const double tf32 = gemm_tflops(ex, qc, d, 2048, 4096, 4096, FERRY_DTYPE_F32, 5);
  /* GEMV: one token through 8192 x 16384 fp16 weights: bytes of the weights over the time */
  const double gemv_tf = gemm_tflops(ex, qc, d, 1, 16384, 8192, FERRY_DTYPE_F16, 100);
  const double gemv_gbps = gemv_tf * 1e3; /* 2 flops and 2 bytes per fp16 weight */
  printf("probe: pinned h2d %.2f GB/s, d2h %.2f GB/s; gemm fp16 %.1f TFLOP/s, fp32 %.1f TFLOP/s; gemv %.0f GB/s\n",
         h2d, d2h, tf16, tf32, gemv_gbps);
  double eff_gemm = bp->has_gpu && bp->gpu.peak_tflops.fp16 > 0 ? tf16 / bp->gpu.peak_tflops.fp16 : 0.7;
  double eff_gemv = bp->has_gpu && bp->gpu.mem_bw_gbps > 0 ? gemv_gbps / bp->gpu.mem_bw_gbps : 0.8;
  if (eff_gemm > 1) eff_gemm = 1;
  if (eff_gemv > 1) eff_gemv = 1;
  if (!(h2d > 0 && d2h > 0 && eff_gemm > 0 && eff_gemv > 0)) {
    fprintf(stderr, "gpu_check: probe measured a zero rate; not writing %s\n", out_path);
    rc = 1;
    goto out;
  }
  rc = write_profile(out_path, base, link, hostp, disk, h2d, d2h, eff_gemm, eff_gemv);
  if (rc) goto out;
  printf("probe: wrote %s\n", out_path);
out:
  ferry_hw_close(hw);
  ferry_exec_destroy(ex);
  return rc;
}

/* --- table: measured vs simulated over result databases -------------------------------------- */

struct run_figures {
  int ok;
  double ttft_ns, tpot_ns, decode_ns, decode_h2d_bytes, h2d_bytes, h2d_busy_ns;
};

static double q1(sqlite3 *db, const char *sql, int64_t run) {
  sqlite3_stmt *s = NULL;
  double v = NAN;
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK) {
    for (int i = 1; i <= sqlite3_bind_parameter_count(s); i++) sqlite3_bind_int64(s, i, run);
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL) v = sqlite3_column_double(s, 0);
  } else {
    fprintf(stderr, "gpu_check: %s\n", sqlite3_errmsg(db));
  }
  sqlite3_finalize(s);
  return v;
}

static struct run_figures read_run(const char *path) {
  struct run_figures r = {0};
  sqlite3 *db = NULL;
  if (!path || sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    sqlite3_close(db);
    return r;
  }
  double run = q1(db, "SELECT MAX(id) FROM runs WHERE complete = 1 AND ?1 = ?1", 0);
  if (!isnan(run)) {
    int64_t id = (int64_t)run;
    r.ok = 1;
    r.ttft_ns = q1(db, "SELECT AVG(first_token_ns - arrival_ns) FROM requests WHERE runId = ?1 AND first_token_ns >= 0", id);
    r.tpot_ns = q1(db, "SELECT AVG((finish_ns - first_token_ns) * 1.0 / (output_tokens - 1)) FROM requests "
                       "WHERE runId = ?1 AND output_tokens > 1 AND finish_ns >= 0", id);
    /* decode steps: one token per sequence */
    r.decode_ns = q1(db, "SELECT SUM(end_ns - start_ns) FROM steps WHERE runId = ?1 AND tokens = batch", id);
    r.decode_h2d_bytes = q1(db, "SELECT SUM(bytes_h2d) FROM steps WHERE runId = ?1 AND tokens = batch", id);
    r.h2d_bytes = q1(db, "SELECT SUM(m.bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE m.runId = ?1 AND m.copyKind = 1 "
                         "AND m.start >= (SELECT MIN(start_ns) FROM steps WHERE runId = ?1 AND tokens = batch)", id);
    r.h2d_busy_ns = q1(db, "SELECT SUM(m.end - m.start) FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE m.runId = ?1 AND m.copyKind = 1 "
                           "AND m.start >= (SELECT MIN(start_ns) FROM steps WHERE runId = ?1 AND tokens = batch)", id);
  }
  sqlite3_close(db);
  return r;
}

static void fmt_ms(char *buf, size_t n, double ns) {
  if (isnan(ns)) snprintf(buf, n, "-");
  else snprintf(buf, n, "%.2f", ns / 1e6);
}

static void fmt_err(char *buf, size_t n, double real, double sim) {
  if (isnan(real) || isnan(sim) || real <= 0) snprintf(buf, n, "-");
  else snprintf(buf, n, "%+.1f%%", 100.0 * (sim - real) / real);
}

/* table --h2d-gbps X LABEL REAL.db SIM.db|- [LABEL REAL.db SIM.db|- ...] */
static int cmd_table(int argc, char **argv) {
  if (argc < 5 || strcmp(argv[2], "--h2d-gbps") || (argc - 4) % 3) {
    fprintf(stderr, "usage: gpu_check table --h2d-gbps X LABEL REAL.db SIM.db|- ...\n");
    return 2;
  }
  const double peak = atof(argv[3]);
  /* issue 8's goals, counted over the rows that have the figure */
  int h2d_ok = 0, h2d_n = 0, floor_ok = 0, floor_n = 0, sim_ok = 0, sim_n = 0;
  printf("| config | TTFT ms real | TTFT ms sim | err | TPOT ms real | TPOT ms sim | err | H2D GB/s (of probe) | "
         "pipeline eff | decode / floor |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 4; i + 2 < argc; i += 3) {
    struct run_figures r = read_run(argv[i + 1]), s = read_run(strcmp(argv[i + 2], "-") ? argv[i + 2] : NULL);
    char a[32], b[32], c[32], d[32], e[32], f[32], g[48], h[32], k[32];
    if (!r.ok) {
      printf("| %s | (no complete run in %s) | | | | | | | | |\n", argv[i], argv[i + 1]);
      continue;
    }
    fmt_ms(a, sizeof a, r.ttft_ns);
    fmt_ms(b, sizeof b, s.ok ? s.ttft_ns : NAN);
    fmt_err(c, sizeof c, r.ttft_ns, s.ok ? s.ttft_ns : NAN);
    fmt_ms(d, sizeof d, r.tpot_ns);
    fmt_ms(e, sizeof e, s.ok ? s.tpot_ns : NAN);
    fmt_err(f, sizeof f, r.tpot_ns, s.ok ? s.tpot_ns : NAN);
    const double gbps = r.h2d_busy_ns > 0 ? r.h2d_bytes / r.h2d_busy_ns : NAN;
    if (isnan(gbps)) snprintf(g, sizeof g, "- (no decode copies)");
    else snprintf(g, sizeof g, "%.2f (%.0f%%)", gbps, peak > 0 ? 100.0 * gbps / peak : 0.0);
    if (r.decode_ns > 0 && !isnan(r.h2d_busy_ns)) snprintf(h, sizeof h, "%.2f", r.h2d_busy_ns / r.decode_ns);
    else snprintf(h, sizeof h, "-");
    const double floor_ns = peak > 0 && r.decode_h2d_bytes > 0 ? r.decode_h2d_bytes / peak : NAN;
    if (!isnan(floor_ns) && floor_ns > 0) snprintf(k, sizeof k, "%.2f", r.decode_ns / floor_ns);
    else snprintf(k, sizeof k, "-");
    if (!isnan(gbps) && peak > 0) {
      h2d_n++;
      h2d_ok += gbps >= 0.9 * peak;
    }
    const char *depth = strstr(argv[i], "_d");
    if (depth && atoi(depth + 2) >= 2 && !isnan(floor_ns) && floor_ns > 0) {
      floor_n++;
      floor_ok += r.decode_ns <= 1.15 * floor_ns;
    }
    if (s.ok && !isnan(s.tpot_ns) && !isnan(r.tpot_ns) && r.tpot_ns > 0) {
      sim_n++;
      sim_ok += fabs(s.tpot_ns - r.tpot_ns) <= 0.10 * r.tpot_ns;
    }
    printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", argv[i], a, b, c, d, e, f, g, h, k);
  }
  printf("\nTTFT/TPOT: mean per request. H2D GB/s: bytes over busy time of the host-to-device copies during "
         "decode steps. pipeline eff: H2D busy time / decode time. decode / floor: decode time / (decode H2D bytes / "
         "probed H2D GB/s).\n");
  printf("\nGoals (issue 8), rows meeting each: H2D >= 90%% of the probe %d/%d; decode / floor <= 1.15 at prefetch "
         "depth >= 2 %d/%d; simulated TPOT within 10%% %d/%d.\n",
         h2d_ok, h2d_n, floor_ok, floor_n, sim_ok, sim_n);
  return 0;
}

static int usage(void) {
  fprintf(stderr,
          "usage: gpu_check kernels [--self-test]   (--self-test: host against host, checks the harness)\n"
          "       gpu_check logits MODEL_DIR [TOLERANCE] [--self-test]\n"
          "       gpu_check probe OUT.json [BASE_PROFILE LINK HOST DISK]   (default h200 pcie5-x16 ddr5 nvme-gen4)\n"
          "       gpu_check table --h2d-gbps X LABEL REAL.db SIM.db|- ...\n"
          "       gpu_check profile OUT.json H2D_GBPS D2H_GBPS EFF_GEMM EFF_GEMV [BASE LINK HOST DISK]\n"
          "exit: 0 pass, 1 fail, 2 error, 77 no CUDA device\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  if (!strcmp(argv[1], "kernels")) return cmd_kernels(argc >= 3 && !strcmp(argv[2], "--self-test"));
  if (!strcmp(argv[1], "logits") && argc >= 3)
    return cmd_logits(argv[2], argc >= 4 && strcmp(argv[3], "--self-test") ? atof(argv[3]) : 1e-2,
                      !strcmp(argv[argc - 1], "--self-test"));
  if (!strcmp(argv[1], "probe") && argc >= 3)
    return cmd_probe(argv[2], argc >= 4 ? argv[3] : "h200", argc >= 5 ? argv[4] : "pcie5-x16",
                     argc >= 6 ? argv[5] : "ddr5", argc >= 7 ? argv[6] : "nvme-gen4");
  if (!strcmp(argv[1], "table")) return cmd_table(argc, argv);
  if (!strcmp(argv[1], "profile")) return cmd_profile(argc, argv);
  return usage();
}
