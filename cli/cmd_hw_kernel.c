/* `ferry hw kernel`: what one kernel costs on a profile's GPU, as the simulator prices it (the
 * same sim executor and cost model a `ferry sim` run uses), so a kernel can be checked against a
 * measured time (scripts/validate-published.sh does this for the A100 kernel timings). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/alloc.h"
#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/quant.h"
#include "ferry/sim.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry hw kernel PROFILE [--runtime NAME] SPEC...   (SPEC '-': one per line on stdin)\n"
          "Print the simulated GPU time of each kernel (of a step: the host's), in microseconds, one\n"
          "line per SPEC.\n\n"
          "A SPEC is a kind and key=value pairs, e.g.\n"
          "  matmul m=1 n=12288 k=4096 w=fp16          y[m,n] = x[m,k] W[n,k]^T (w: fp32 fp16 bf16 fp8e4m3, or a\n"
          "                                             quantized format such as int4-g64: read packed)\n"
          "  attention batch=1 q=512 ctx=0 heads=32 kv_heads=8 head_dim=128 [window=W] [kv=fp16]\n"
          "                                             q new tokens per sequence over ctx cached ones\n"
          "  norm m=4096 n=4096 [w=fp16]    rope m=4096 heads=32 kv_heads=8 head_dim=128\n"
          "  activation m=4096 n=11008 [fn=silu_mul|gelu_tanh_mul|gelu|gelu_tanh|relu]\n"
          "  allreduce devices=8 bytes=1048576          an all-reduce of that many bytes per GPU over the\n"
          "                                             profile's interconnect (at most 8 GPUs)\n"
          "  sendrecv bytes=1048576                     one GPU's hand-off of that many bytes to another (a\n"
          "                                             pipeline stage's), over the profile's interconnect\n"
          "  step batch=8 [devices=2]                   the host's time for one engine step sampling batch\n"
          "                                             rows: the runtime's step_ns, row_ns a row and, on\n"
          "                                             more than one GPU, worker_step_ns (not GPU time)\n"
          "--runtime picks how quantized weights are read (eager: a dequantize kernel first; graph and\n"
          "native: fused kernels) and the activations' size (native: fp32, the others fp16; without\n"
          "--runtime, the profile's own, else native); the host's launch costs are not part of a\n"
          "kernel's time. On a GPU whose profile gives gpu.sm_count, gpu.clock_mhz and\n"
          "gpu.compute_capability, norm, rope and activation are timed by their launch geometry\n"
          "(hw/README.md). A profile composed with +runtime.attn_fa2_kvcache=1 prices attention as\n"
          "FlashAttention-2's flash_attn_with_kvcache given the new K and V (the append inside the\n"
          "kernel, its waves), as Vidur's kernel sets were measured.\n");
}

struct spec {
  char kind[32];
  int64_t m, n, k, batch, q, ctx, heads, kv_heads, head_dim, window, devices, bytes;
  enum ferry_dtype w, kv;
  struct ferry_qspec quant;
  int quantized;
  enum ferry_act_fn fn;
};

static int parse_spec(const char *text, struct spec *s) {
  memset(s, 0, sizeof *s);
  s->w = s->kv = FERRY_DTYPE_F16;
  s->batch = 1;
  s->fn = FERRY_FN_SILU_MUL;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", text);
  char *save = NULL;
  char *tok = strtok_r(buf, " \t\r\n", &save);
  if (!tok) return -1;
  snprintf(s->kind, sizeof s->kind, "%s", tok);
  while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
    char *eq = strchr(tok, '=');
    if (!eq) return cli_usage_error("hw kernel", "'%s': expected key=value", tok);
    *eq = '\0';
    const char *key = tok, *val = eq + 1;
    static const struct {
      const char *key;
      size_t off;
    } ints[] = {{"m", offsetof(struct spec, m)},           {"n", offsetof(struct spec, n)},
                {"k", offsetof(struct spec, k)},           {"batch", offsetof(struct spec, batch)},
                {"q", offsetof(struct spec, q)},           {"ctx", offsetof(struct spec, ctx)},
                {"heads", offsetof(struct spec, heads)},   {"kv_heads", offsetof(struct spec, kv_heads)},
                {"head_dim", offsetof(struct spec, head_dim)}, {"window", offsetof(struct spec, window)},
                {"devices", offsetof(struct spec, devices)},   {"bytes", offsetof(struct spec, bytes)}};
    size_t i = 0;
    while (i < sizeof ints / sizeof ints[0] && strcmp(key, ints[i].key)) i++;
    if (i < sizeof ints / sizeof ints[0]) {
      char opt[40];
      snprintf(opt, sizeof opt, "%s=", key);
      if (cli_parse_int(opt, val, 0, (int64_t)1 << 40, (int64_t *)(void *)((char *)s + ints[i].off))) return CLI_USAGE;
    } else if (!strcmp(key, "w") || !strcmp(key, "kv")) {
      enum ferry_dtype dt;
      if (ferry_dtype_parse(val, &dt) == FERRY_OK && ferry_dtype_size(dt) > 0) {
        *(!strcmp(key, "w") ? &s->w : &s->kv) = dt;
      } else if (!strcmp(key, "w") && ferry_quant_spec_parse(val, &s->quant) == FERRY_OK) {
        s->quantized = 1;
      } else {
        return cli_usage_error("hw kernel", "%s=%s: not an element type or weight format", key, val);
      }
    } else if (!strcmp(key, "fn")) {
      if (!strcmp(val, "silu_mul")) s->fn = FERRY_FN_SILU_MUL;
      else if (!strcmp(val, "gelu_tanh_mul")) s->fn = FERRY_FN_GELU_TANH_MUL;
      else if (!strcmp(val, "gelu")) s->fn = FERRY_FN_GELU;
      else if (!strcmp(val, "gelu_tanh")) s->fn = FERRY_FN_GELU_TANH;
      else if (!strcmp(val, "relu")) s->fn = FERRY_FN_RELU;
      else return cli_usage_error("hw kernel", "fn=%s: expected silu_mul, gelu_tanh_mul, gelu, gelu_tanh or relu", val);
    } else {
      return cli_usage_error("hw kernel", "unknown key '%s'", key);
    }
  }
  return 0;
}

struct timing {
  int64_t ns;
  int kernels;
  int copies; /* 1: time the copies (a sendrecv), else the kernels */
};

static void sink(void *user, const struct ferry_activity *a) {
  struct timing *t = user;
  if (a->kind != (t->copies ? FERRY_ACT_MEMCPY : FERRY_ACT_KERNEL)) return;
  t->ns += a->end_ns - a->start_ns;
  t->kernels++;
}

/* The end of a run on an executor of its own: the failure reported, the executor (and the
 * buffers it holds) gone; the command's exit code. */
static int finish(ferry_exec *ex, ferry_status st) {
  const int rc = st != FERRY_OK ? cli_fail(st, "%s", ex ? ferry_exec_errmsg(ex) : "") : 0;
  ferry_exec_destroy(ex);
  return rc;
}

/* The buffers a kernel names, in one device buffer: the simulator touches no byte, but every
 * executor checks that a kernel's buffers hold its shape (runtime/exec/kernel_check.c). */
struct placement {
  struct ferry_ref *ref;
  uint64_t bytes;
};

static ferry_status place(ferry_exec *ex, struct placement *p, int n, ferry_buf **out) {
  uint64_t total = 0;
  for (int i = 0; i < n; i++) total += (p[i].bytes + 255) / 256 * 256;
  ferry_status st = ferry_exec_alloc(ex, FERRY_TIER_DEVICE, total ? total : 256, "kernel", out);
  if (st != FERRY_OK) return st;
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    p[i].ref->buf = *out;
    p[i].ref->offset = off;
    off += (p[i].bytes + 255) / 256 * 256;
  }
  return FERRY_OK;
}

static uint64_t esz(enum ferry_dtype dt) { return ferry_dtype_size(dt); }

/* The buffers of each kind of kernel `ferry hw kernel` prices. */
static ferry_status place_kernel(ferry_exec *ex, struct ferry_kernel *k, ferry_buf **out) {
  const uint64_t m = (uint64_t)k->m, n = (uint64_t)k->n, kk = (uint64_t)k->k;
  const uint64_t q = (uint64_t)(k->heads * k->head_dim) * 4, kv = (uint64_t)(k->kv_heads * k->head_dim);
  switch (k->kind) {
    case FERRY_K_MATMUL: {
      struct placement p[] = {{&k->x, m * kk * 4}, {&k->y, m * n * 4}, {&k->w, k->w.buf ? 0 : n * kk * esz(k->w.dtype)}};
      return place(ex, p, k->w.buf ? 2 : 3, out); /* a dequantized weight has its buffer */
    }
    case FERRY_K_ATTENTION: {
      const uint64_t slots = (uint64_t)k->ints2[k->m - 1] + 1, cache = slots * (uint64_t)k->kv_capacity * kv;
      struct placement p[] = {{&k->x, m * q},         {&k->y, m * q},
                              {&k->aux[0], m * kv * 4}, {&k->aux[1], m * kv * 4},
                              {&k->aux[2], cache * esz(k->aux[2].dtype)}, {&k->aux[3], cache * esz(k->aux[3].dtype)}};
      return place(ex, p, 6, out);
    }
    case FERRY_K_NORM: {
      struct placement p[] = {{&k->x, m * n * 4}, {&k->y, m * n * 4}, {&k->w, n * esz(k->w.dtype)}};
      return place(ex, p, 3, out);
    }
    case FERRY_K_ROPE: {
      struct placement p[] = {{&k->x, m * q}, {&k->aux[0], m * kv * 4}};
      return place(ex, p, 2, out);
    }
    default: { /* activations */
      struct placement p[] = {{&k->x, m * n * 4}, {&k->y, m * n * 4}, {&k->aux[0], m * n * 4}};
      return place(ex, p, 3, out);
    }
  }
}

/* A packed weight's parts and the fp32 matrix it expands into. */
static ferry_status place_dequant(ferry_exec *ex, struct ferry_kernel *d, const struct ferry_qspec *spec, ferry_buf **out) {
  struct ferry_qlayout lay;
  ferry_status st = ferry_quant_layout(spec, d->n, d->k, &lay);
  if (st != FERRY_OK) return st;
  struct placement p[1 + FERRY_QPART_COUNT] = {{&d->y, (uint64_t)(d->n * d->k) * 4}};
  int n = 1;
  for (int i = 0; i < FERRY_QPART_COUNT; i++)
    if (lay.part[i].bytes) {
      d->aux[i].dtype = FERRY_DTYPE_U8;
      p[n++] = (struct placement){&d->aux[i], lay.part[i].bytes};
    }
  return place(ex, p, n, out);
}

/* An all-reduce: its own executor of `devices` GPUs, one partial of bytes (in the runtime's
 * activation elements, which is what the simulator all-reduces) on each. */
static int time_allreduce(const ferry_hw *hw, const struct spec *s, struct timing *t) {
  if (s->devices < 2 || s->devices > FERRY_EXEC_MAX_DEVICES)
    return cli_usage_error("hw kernel", "allreduce: devices=%lld: 2 to %d GPUs", (long long)s->devices,
                           FERRY_EXEC_MAX_DEVICES);
  if (s->bytes < 1) return cli_usage_error("hw kernel", "allreduce: bytes= must be at least 1");
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  const int32_t gpus = ferry_hw_gpu_count(p);
  if (p->has_interconnect && s->devices > gpus)
    return cli_usage_error("hw kernel", "allreduce: devices=%lld: the machine holds %d GPUs", (long long)s->devices, gpus);
  uint32_t act_bytes = 4;
  ferry_hw_profile_elem_bytes(p, &act_bytes, NULL);
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_ALLREDUCE;
  k.name = "allreduce";
  k.layer = k.expert = -1;
  k.m = s->devices;
  k.n = (s->bytes + act_bytes - 1) / act_bytes;
  ferry_exec *ex = NULL;
  ferry_buf *bufs[FERRY_EXEC_MAX_DEVICES] = {0};
  int32_t q;
  ferry_status st = ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.n_devices = (int32_t)s->devices});
  if (st == FERRY_OK) st = ferry_exec_queue_create_on(ex, FERRY_QUEUE_COMPUTE, 0, &q);
  for (int32_t d = 0; st == FERRY_OK && d < (int32_t)s->devices; d++) {
    st = ferry_exec_alloc_on(ex, d, FERRY_TIER_DEVICE, (uint64_t)k.n * 4, "partials", &bufs[d]);
    if (st == FERRY_OK) *(d ? &k.aux[d - 1] : &k.x) = (struct ferry_ref){bufs[d], 0, FERRY_DTYPE_F32};
  }
  memset(t, 0, sizeof *t);
  if (st == FERRY_OK) {
    ferry_exec_set_sink(ex, sink, t);
    if ((st = ferry_exec_compute(ex, q, &k)) == FERRY_OK) st = ferry_exec_drain(ex);
  }
  return finish(ex, st);
}

/* A hand-off of `bytes` from one GPU's memory to another's, as a pipeline-parallel run's engine
 * copies a stage's hidden states to the next (runtime/engine/mgpu.c): a copy between two
 * devices on a copy queue, priced on the profile's interconnect. */
static int time_sendrecv(const ferry_hw *hw, const struct spec *s, struct timing *t) {
  if (s->bytes < 1) return cli_usage_error("hw kernel", "sendrecv: bytes= must be at least 1");
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  if (p->has_interconnect && ferry_hw_gpu_count(p) < 2)
    return cli_usage_error("hw kernel", "sendrecv: the machine holds one GPU");
  ferry_exec *ex = NULL;
  ferry_buf *from = NULL, *to = NULL;
  int32_t q;
  ferry_status st = ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.n_devices = 2});
  if (st == FERRY_OK) st = ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &q);
  if (st == FERRY_OK) st = ferry_exec_alloc_on(ex, 0, FERRY_TIER_DEVICE, (uint64_t)s->bytes, "send", &from);
  if (st == FERRY_OK) st = ferry_exec_alloc_on(ex, 1, FERRY_TIER_DEVICE, (uint64_t)s->bytes, "recv", &to);
  memset(t, 0, sizeof *t);
  t->copies = 1;
  if (st == FERRY_OK) {
    ferry_exec_set_sink(ex, sink, t);
    st = ferry_exec_copy(ex, q, (struct ferry_ref){to, 0, FERRY_DTYPE_U8}, (struct ferry_ref){from, 0, FERRY_DTYPE_U8},
                         (uint64_t)s->bytes);
    if (st == FERRY_OK) st = ferry_exec_drain(ex);
  }
  return finish(ex, st);
}

/* One engine step's host time as a `ferry sim` run charges it, on an executor of `devices` GPUs:
 * the runtime's work when the engine opens the step, then the gather of the rows the step
 * samples (the sampler's and output processing's work, per row), up to the moment the host is
 * free again; the GPU's share of the gather is not counted. */
static int time_step(const ferry_hw *hw, const struct spec *s, int32_t *ints, struct timing *t) {
  const int64_t devices = s->devices ? s->devices : 1;
  if (devices > FERRY_EXEC_MAX_DEVICES)
    return cli_usage_error("hw kernel", "step: devices=%lld: 1 to %d GPUs", (long long)devices, FERRY_EXEC_MAX_DEVICES);
  if (s->batch < 1 || s->batch > 65536) return cli_usage_error("hw kernel", "step: batch= must be 1 to 65536");
  struct ferry_kernel g;
  memset(&g, 0, sizeof g);
  g.kind = FERRY_K_GATHER_ROWS;
  g.name = "gather_rows";
  g.layer = g.expert = -1;
  g.m = s->batch, g.n = 1;
  g.x.dtype = g.y.dtype = FERRY_DTYPE_F32;
  for (int64_t i = 0; i < g.m; i++) ints[i] = (int32_t)i;
  g.ints = ints, g.n_ints = g.m;
  ferry_exec *ex = NULL;
  ferry_buf *bufs = NULL;
  int32_t q;
  ferry_status st = ferry_exec_create_sim(&ex, hw, &(struct ferry_exec_config){.n_devices = (int32_t)devices});
  if (st == FERRY_OK) st = ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &q);
  if (st == FERRY_OK) st = place(ex, (struct placement[]){{&g.x, (uint64_t)g.m * 4}, {&g.y, (uint64_t)g.m * 4}}, 2, &bufs);
  if (st == FERRY_OK) {
    const int64_t start = ferry_exec_now(ex);
    struct ferry_exec_range step = ferry_exec_range_begin(ex, "step", 0, -1, -1);
    st = ferry_exec_compute(ex, q, &g);
    memset(t, 0, sizeof *t);
    t->ns = ferry_exec_now(ex) - start;
    ferry_exec_range_end(ex, &step);
    if (st == FERRY_OK) st = ferry_exec_drain(ex);
  }
  return finish(ex, st);
}

/* Simulate one kernel (a quantized product: its dequantize op, then the product). */
static int time_spec(ferry_exec *ex, int32_t q, const struct spec *s, struct timing *t, int32_t *ints) {
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.layer = k.expert = -1;
  k.name = s->kind;
  k.x.dtype = k.y.dtype = FERRY_DTYPE_F32;
  ferry_buf *dq = NULL, *bufs = NULL;
  ferry_status st = FERRY_OK;
  if (!strcmp(s->kind, "matmul")) {
    k.kind = FERRY_K_MATMUL;
    k.m = s->m, k.n = s->n, k.k = s->k;
    k.w.dtype = s->w;
    if (s->quantized) {
      /* the engine's way: expand into a scratch buffer, then multiply (the simulated runtime
       * fuses the two or not) */
      const uint64_t packed = ferry_quant_packed_bytes(&s->quant, s->n, s->k, NULL, NULL);
      if (!packed) return cli_usage_error("hw kernel", "matmul: n and k must be at least 1");
      struct ferry_kernel d;
      memset(&d, 0, sizeof d);
      d.kind = FERRY_K_DEQUANTIZE;
      d.name = "dequantize";
      d.layer = d.expert = -1;
      d.m = (int64_t)packed, d.n = s->n, d.k = s->k;
      d.qformat = (int32_t)s->quant.format;
      d.qgroup = s->quant.group_size;
      d.y.dtype = FERRY_DTYPE_F32;
      if ((st = place_dequant(ex, &d, &s->quant, &dq)) != FERRY_OK) return cli_fail(st, NULL);
      if ((st = ferry_exec_compute(ex, q, &d)) != FERRY_OK) return cli_fail(st, "%s", ferry_exec_errmsg(ex));
      k.w = d.y;
    }
  } else if (!strcmp(s->kind, "attention")) {
    const int64_t qn = s->q > 0 ? s->q : 1, m = s->batch * qn;
    if (m > 65536) return cli_usage_error("hw kernel", "attention: at most 65536 query tokens (batch x q)");
    k.kind = FERRY_K_ATTENTION;
    k.m = m, k.heads = s->heads, k.kv_heads = s->kv_heads ? s->kv_heads : s->heads, k.head_dim = s->head_dim;
    k.sliding_window = s->window;
    k.aux[2].dtype = k.aux[3].dtype = s->kv;
    int64_t ctx = 0;
    for (int64_t b = 0; b < s->batch; b++)
      for (int64_t i = 0; i < qn; i++) {
        int64_t pos = s->ctx + i, c = pos + 1;
        if (s->window > 0 && c > s->window) c = s->window;
        ints[b * qn + i] = (int32_t)pos;
        ints[65536 + b * qn + i] = (int32_t)b;
        ctx += c;
      }
    k.ints = ints, k.ints2 = ints + 65536, k.n_ints = m;
    k.context_tokens = ctx;
    k.kv_capacity = s->ctx + qn;
  } else if (!strcmp(s->kind, "norm")) {
    k.kind = FERRY_K_NORM;
    k.m = s->m, k.n = s->n;
    k.w.dtype = s->w;
  } else if (!strcmp(s->kind, "rope")) {
    if (s->m > 65536) return cli_usage_error("hw kernel", "rope: at most 65536 tokens (m)");
    k.kind = FERRY_K_ROPE;
    k.m = s->m, k.heads = s->heads, k.kv_heads = s->kv_heads ? s->kv_heads : s->heads, k.head_dim = s->head_dim;
    for (int64_t i = 0; i < k.m; i++) ints[i] = (int32_t)i; /* positions */
    k.ints = ints, k.n_ints = k.m;
  } else if (!strcmp(s->kind, "activation")) {
    k.kind = FERRY_K_SWIGLU;
    k.m = s->m, k.n = s->n, k.fn = s->fn;
  } else {
    return cli_usage_error("hw kernel", "unknown kernel kind '%s' (matmul, attention, norm, rope, activation, allreduce, sendrecv, step)",
                           s->kind);
  }
  if ((st = place_kernel(ex, &k, &bufs)) != FERRY_OK) return cli_fail(st, NULL);
  memset(t, 0, sizeof *t);
  ferry_exec_set_sink(ex, sink, t);
  if ((st = ferry_exec_compute(ex, q, &k)) != FERRY_OK || (st = ferry_exec_drain(ex)) != FERRY_OK)
    return cli_fail(st, "%s", ferry_exec_errmsg(ex));
  ferry_exec_set_sink(ex, NULL, NULL);
  ferry_exec_free(ex, bufs);
  ferry_exec_free(ex, dq);
  return 0;
}

int hw_kernel(int argc, char **argv) {
  const char *profile = NULL, *runtime = NULL;
  int first = 0, n_specs = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return CLI_OK;
    }
    if (!strcmp(argv[i], "--runtime")) {
      if (++i >= argc) return cli_usage_error("hw kernel", "--runtime needs a name");
      runtime = argv[i];
    } else if (!profile) {
      profile = argv[i];
    } else {
      if (!first) first = i;
      n_specs++;
    }
  }
  if (!profile || !n_specs) return cli_usage_error("hw kernel", "expected a PROFILE and at least one SPEC");
  ferry_hw *hw = NULL;
  ferry_exec *ex = NULL;
  int32_t *ints = NULL;
  int rc = CLI_FAIL;
  ferry_status st = ferry_hw_open(&hw, profile);
  if (st == FERRY_OK && (runtime || !ferry_hw_get(hw)->has_runtime))
    st = ferry_hw_set_runtime(hw, runtime ? runtime : "native");
  if (st == FERRY_OK) st = ferry_exec_create_sim(&ex, hw, NULL);
  if (st != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  int32_t q;
  ints = ferry_malloc(2 * 65536 * sizeof *ints);
  if (!ints || (st = ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &q)) != FERRY_OK) {
    cli_fail(ints ? st : FERRY_ERR_NOMEM, NULL);
    goto out;
  }
  rc = CLI_OK;
  for (int i = first; i < argc && rc == CLI_OK; i++) {
    if (!strcmp(argv[i], "--runtime")) {
      i++;
      continue;
    }
    char line[512];
    int from_stdin = !strcmp(argv[i], "-");
    FILE *in = from_stdin ? stdin : NULL;
    const char *text = argv[i];
    while (rc == CLI_OK) {
      if (from_stdin) {
        if (!fgets(line, sizeof line, in)) break;
        if (line[strspn(line, " \t\r\n")] == '\0' || line[0] == '#') continue;
        text = line;
      }
      struct spec s;
      struct timing t;
      if ((rc = parse_spec(text, &s)) != 0) break;
      rc = !strcmp(s.kind, "allreduce") ? time_allreduce(hw, &s, &t)
           : !strcmp(s.kind, "step")    ? time_step(hw, &s, ints, &t)
           : !strcmp(s.kind, "sendrecv") ? time_sendrecv(hw, &s, &t)
                                        : time_spec(ex, q, &s, &t, ints);
      if (rc != 0) break;
      printf("%.3f\n", (double)t.ns / 1e3);
      if (!from_stdin) break;
    }
  }
  fflush(stdout);
out:
  ferry_free(ints);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  return rc;
}
