/* One engine step: the forward pass of a batch of tokens (decode tokens and prefill chunks)
 * expressed as executor ops, with block prefetching at layer-block boundaries, the expert
 * cache consulted after each router, and the logits of the sampled rows read back. Each
 * family's layer is the same skeleton (norm, attention, norm, FFN or MoE) with its variations
 * chosen from the configuration: MLA, fused qkv, q/k norms, sandwich norms, parallel residual. */
#include <math.h>
#include <string.h>

#include "engine_impl.h"

#define TRY(call)                                                               \
  do {                                                                          \
    ferry_status st_ = (call);                                                  \
    if (st_ != FERRY_OK) return ferry__err_set(&e->err, st_, "%s", ferry_exec_errmsg(e->ex)); \
  } while (0)

#define NOREF ((struct ferry_ref){0})

static struct ferry_kernel kernel(enum ferry_kernel_kind kind, const char *name, int32_t layer) {
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = kind;
  k.name = name;
  k.layer = layer;
  k.expert = -1;
  return k;
}

static ferry_status x_to(struct ferry_engine *e, int cpu);

/* Blocking copies to the device of tensors made on the CPU that the family's Hugging Face
 * transformers code (2022: the eager runs Accelerate and DeepSpeed drive) makes before op kind
 * of every layer. GPT-J's fixed_pos_embedding builds its sin/cos table on the CPU and copies it
 * (`.to(x.device)`) before the rotary, from the model's addition (PR 13022, 2021) until its
 * cached table; GPT-J's and GPT-NeoX's _attn copy the mask value (`torch.tensor(mask_value)
 * .to(device)`, since PR 17306, v4.20) before the causal mask. A copy from pageable memory
 * without non_blocking returns once done, so the host waits for the kernels queued before it;
 * only the simulator charges that, for a runtime that runs this code (runtime.model_syncs). */
static int32_t hf_host_syncs(enum ferry_family family, enum ferry_kernel_kind kind) {
  switch (family) {
    case FERRY_FAMILY_GPTJ: return kind == FERRY_K_ROPE || kind == FERRY_K_ATTENTION;
    case FERRY_FAMILY_GPT_NEOX: return kind == FERRY_K_ATTENTION;
    default: return 0;
  }
}

/* Devices a tensor parallel run splits each layer over (1 otherwise): this device's heads, KV
 * heads and FFN columns are the model's over tp. */
static int64_t tp_of(const struct ferry_engine *e) { return e->tp > 1 ? e->tp : 1; }

/* The residual add of a row-parallel matmul (attn.o, mlp.down): on a tensor parallel run the
 * devices other than the first write their partial sums over x instead of adding them, and
 * only the first adds the bias, so the all-reduce that follows gives x + o_proj(attn) + b. */
static int resid_acc(const struct ferry_engine *e) { return e->tp < 2 || e->cur_dev == 0; }

/* The element type a weight of `format` dequantizes into: fp16 where the executor's products
 * run faster on it (ferry_exec_half_dequant: the cuda executor's tensor cores) and the format's
 * values are a small integer times a scale, or fp16 already, so fp16 holds each to within its
 * own rounding; fp32 otherwise, and on a hybrid run's CPU queue, whose products want fp32. */
static enum ferry_dtype dequant_dtype(const struct ferry_engine *e, enum ferry_qformat format) {
  if (!ferry_exec_half_dequant(e->ex) || (ferry__hybrid_on(e) && e->cq == e->q_cpu)) return FERRY_DTYPE_F32;
  switch (format) {
    case FERRY_QFORMAT_FP16:
    case FERRY_QFORMAT_INT8:
    case FERRY_QFORMAT_INT4:
    case FERRY_QFORMAT_INT3:
    case FERRY_QFORMAT_INT2:
    case FERRY_QFORMAT_NF4: return FERRY_DTYPE_F16;
    default: return FERRY_DTYPE_F32;
  }
}

/* The weight (role, layer, expert) as a kernel reads it: the tensor where it lives, or, when it
 * is stored quantized, a DEQUANTIZE op into dequantization slot `slot` of the workspace first
 * (an op of its own, so every executor can time it and the simulator can cost it), told the
 * rows of the product that reads it (0: a lookup, not a product). */
static ferry_status weight(struct ferry_engine *e, enum ferry_tensor_role role, int32_t layer, int32_t expert, int slot,
                           int64_t rows, struct ferry_ref *out) {
  const struct tensor_loc *loc = ferry__engine_loc(e, role, layer, expert);
  if (!loc || !loc->quantized) {
    *out = ferry__engine_weight(e, role, layer, expert);
    return FERRY_OK;
  }
  size_t ti = (size_t)(loc - e->tensors);
  if (ti == ferry_model_tensor_count(e->model)) ti = (size_t)e->tied_head_src; /* a streamed tied head's copy */
  const struct ferry_tensor_desc *t = ferry_model_tensor(e->model, ti);
  struct ferry_kernel k = kernel(FERRY_K_DEQUANTIZE, "dequantize", layer);
  k.expert = expert;
  ferry__engine_weight_parts(e, loc, k.aux);
  k.y = ferry__ws(e, e->ws.dq[slot]);
  k.y.dtype = dequant_dtype(e, loc->spec.format);
  k.n = t->shape[0];
  k.k = t->shape[1];
  k.m = (int64_t)loc->packed_bytes;
  k.qformat = (int32_t)loc->spec.format;
  k.qgroup = loc->spec.group_size;
  k.dq_rows = rows;
  TRY(ferry_exec_compute(e->ex, e->cq, &k));
  *out = k.y;
  return FERRY_OK;
}

/* y (+)= x . W^T + b, an op of `layer` on the weight w. */
static ferry_status matmul_w(struct ferry_engine *e, const char *name, int32_t layer, uint64_t x, uint64_t y, int64_t m,
                             int64_t n, int64_t k, struct ferry_ref w, struct ferry_ref b, int accumulate) {
  struct ferry_kernel kk = kernel(FERRY_K_MATMUL, name, layer);
  kk.x = ferry__ws(e, x);
  kk.y = ferry__ws(e, y);
  kk.w = w;
  kk.b = b;
  kk.m = m;
  kk.n = n;
  kk.k = k;
  kk.accumulate = accumulate;
  TRY(ferry_exec_compute(e->ex, e->cq, &kk));
  return FERRY_OK;
}

/* y (+)= x . W^T + b with W = the weight of `role` at `layer` (dequantized if need be). */
static ferry_status matmul(struct ferry_engine *e, const char *name, int32_t layer, uint64_t x, uint64_t y, int64_t m,
                           int64_t n, int64_t k, enum ferry_tensor_role role, struct ferry_ref b, int accumulate) {
  struct ferry_ref w;
  ferry_status st = weight(e, role, layer, -1, 0, m, &w);
  if (st != FERRY_OK) return st;
  return matmul_w(e, name, layer, x, y, m, n, k, w, b, accumulate);
}

/* The norm of this model's hidden states: RMSNorm, Gemma's (1 + w) RMSNorm, or LayerNorm. */
static int model_norm(const struct ferry_model_config *mc) {
  if (mc->norm == FERRY_NORM_LAYER) return FERRY_NORMFN_LAYER;
  return mc->norm_unit_offset ? FERRY_NORMFN_RMS_OFFSET : FERRY_NORMFN_RMS;
}

/* y (+)= norm(x) over m rows of n (row stride ld, 0 = n). */
static ferry_status norm_ex(struct ferry_engine *e, const char *name, int32_t layer, uint64_t x, uint64_t y, int64_t m,
                           int64_t n, int64_t ld, struct ferry_ref w, struct ferry_ref b, int kind, int accumulate) {
  struct ferry_kernel k = kernel(FERRY_K_NORM, name, layer);
  k.x = ferry__ws(e, x);
  k.y = ferry__ws(e, y);
  k.w = w;
  k.b = b;
  k.m = m;
  k.n = n;
  k.ld = ld;
  k.eps = (float)e->mc->norm_eps;
  k.norm_kind = kind;
  k.accumulate = accumulate;
  TRY(ferry_exec_compute(e->ex, e->cq, &k));
  return FERRY_OK;
}

static ferry_status norm(struct ferry_engine *e, const char *name, int32_t layer, uint64_t x, uint64_t y, int64_t m,
                         int64_t n, struct ferry_ref w, struct ferry_ref b) {
  return norm_ex(e, name, layer, x, y, m, n, 0, w, b, model_norm(e->mc), 0);
}

static struct ferry_ref W(struct ferry_engine *e, enum ferry_tensor_role role, int32_t layer) {
  return ferry__engine_weight(e, role, layer, -1);
}

/* RoPE on `heads` rows of head_dim per token at x (and kv_heads rows at k when k_off is not 0):
 * the layer's scaling and layout; rot_offset/rot_dim pick the rotated part of each row. */
static ferry_status rope(struct ferry_engine *e, int32_t l, uint64_t x, int64_t heads, uint64_t k_off, int64_t kv_heads,
                         int64_t head_dim, int64_t rot_offset, int64_t rot_dim) {
  const struct ferry_rope_params *rp = &e->rope[l];
  struct ferry_kernel k = kernel(FERRY_K_ROPE, "rope", l);
  k.host_syncs = hf_host_syncs(e->mc->family, FERRY_K_ROPE);
  k.x = ferry__ws(e, x);
  if (k_off) k.aux[0] = ferry__ws(e, k_off);
  k.m = e->n_tok;
  k.ints = e->tok_pos;
  k.n_ints = e->n_tok;
  k.heads = heads;
  k.kv_heads = k_off ? kv_heads : 0;
  k.head_dim = head_dim;
  k.theta = rp->theta;
  k.rot_offset = rot_offset;
  k.rot_dim = rot_dim == head_dim ? 0 : rot_dim;
  /* the plain rotation needs no parameters: executors without the scaled ones still run it */
  if (rp->scaling.type != FERRY_ROPE_DEFAULT || rp->interleaved) {
    k.rope = rp;
    k.ints2 = e->tok_seqlen;
  }
  TRY(ferry_exec_compute(e->ex, e->cq, &k));
  return FERRY_OK;
}

/* Tokens each query of tokens [a, b) of layer l sees, summed (the cost model's context). */
static int64_t context_range(const struct ferry_engine *e, int32_t l, int64_t a, int64_t b) {
  const struct ferry_layer_info *li = &e->li[l];
  int64_t ctx = 0;
  for (int64_t t = a; t < b; t++) {
    const int64_t pos = e->tok_pos[t];
    int64_t first = 0;
    if (li->window > 0 && pos - li->window + 1 > first) first = pos - li->window + 1;
    if (li->chunk > 0 && pos - pos % li->chunk > first) first = pos - pos % li->chunk;
    ctx += pos - first + 1;
  }
  return ctx;
}

/* The same over the whole step. */
static int64_t context_tokens(struct ferry_engine *e, int32_t l) {
  const struct ferry_layer_info *li = &e->li[l];
  /* layers of one kind see the same context: worked out once a micro-batch's step */
  if (e->ctx_valid && e->ctx_window == li->window && e->ctx_chunk == li->chunk) return e->ctx_tokens;
  const int64_t ctx = context_range(e, l, 0, e->n_tok);
  e->ctx_valid = 1, e->ctx_window = li->window, e->ctx_chunk = li->chunk, e->ctx_tokens = ctx;
  return ctx;
}

/* The attention op's cache and visibility fields for layer l. */
static void attention_common(struct ferry_engine *e, int32_t l, struct ferry_kernel *k) {
  const struct kv_layer *kv = &e->kv[l];
  ferry_buf *cache = kv->host ? e->hkv_buf : e->kv_buf;
  k->aux[2] = (struct ferry_ref){cache, kv->k_off, e->kv_dtype};
  k->aux[3] = (struct ferry_ref){cache, kv->v_off, e->kv_dtype};
  if (e->kv_block && !kv->ring) { /* a paged layer: positions through the block table */
    k->kv_blocks = e->kv_table;
    k->kv_block_tokens = e->kv_block;
    k->kv_blocks_per_seq = e->kv_blocks_per_seq;
  }
  /* a quantized cache says so; plain ones are their element type (every executor reads those) */
  if (ferry_kv_format_group(e->kv_format) > 0) k->kv_format = (int32_t)e->kv_format;
  k->m = e->n_tok;
  k->ints = e->tok_pos;
  k->ints2 = e->tok_slot;
  k->n_ints = e->n_tok;
  k->kv_capacity = kv->rows;
  k->kv_ring = kv->ring;
  k->sliding_window = e->li[l].window;
  k->attn_chunk = e->li[l].chunk;
  k->context_tokens = context_tokens(e, l);
  if (e->cfg.kv_home_disk) ferry__kv_disk_redirect(e, k, l); /* the rows read from disk into host memory */
}

/* Multi-head latent attention (DeepSeek): low-rank q, the compressed kv row [c_kv | k_pe]
 * normalised and rotated, attention in the latent space, o_proj into the residual. */
static ferry_status mla_part(struct ferry_engine *e, int32_t l) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t T = e->n_tok, H = mc->hidden, NH = mc->n_heads, qk = mc->qk_nope_dim + mc->qk_rope_dim;
  const int64_t rank = mc->kv_lora_rank, width = rank + mc->qk_rope_dim;
  ferry_status st;
  if (mc->q_lora_rank) {
    if ((st = matmul(e, "attn.q_a", l, e->ws.h, e->ws.qa, T, mc->q_lora_rank, H, FERRY_ROLE_MLA_Q_A, NOREF, 0)) ||
        (st = norm_ex(e, "q_a_norm", l, e->ws.qa, e->ws.qa, T, mc->q_lora_rank, 0, W(e, FERRY_ROLE_MLA_Q_A_NORM, l),
                      NOREF, FERRY_NORMFN_RMS, 0)) ||
        (st = matmul(e, "attn.q_b", l, e->ws.qa, e->ws.q, T, NH * qk, mc->q_lora_rank, FERRY_ROLE_MLA_Q_B, NOREF, 0)))
      return st;
  } else if ((st = matmul(e, "attn.q", l, e->ws.h, e->ws.q, T, NH * qk, H, FERRY_ROLE_MLA_Q_B, NOREF, 0))) {
    return st;
  }
  if ((st = matmul(e, "attn.kv_a", l, e->ws.h, e->ws.k, T, width, H, FERRY_ROLE_MLA_KV_A, NOREF, 0)) ||
      (st = norm_ex(e, "kv_a_norm", l, e->ws.k, e->ws.k, T, rank, width, W(e, FERRY_ROLE_MLA_KV_A_NORM, l), NOREF,
                    FERRY_NORMFN_RMS, 0)) ||
      (st = rope(e, l, e->ws.q, NH, 0, 0, qk, mc->qk_nope_dim, mc->qk_rope_dim)) ||
      (st = rope(e, l, e->ws.k, 1, 0, 0, width, rank, mc->qk_rope_dim)))
    return st;
  /* a latent cache in host memory (--kv-home host, or a streamed layer of a hybrid run, computed
   * on the device this step): q and the new latent rows go down, the CPU attends with its copy of
   * kv_b_proj (the mirror, or the streamed layer's host copy), the result comes back; with the
   * cache on disk the CPU's op waits for the reads of the micro-batch's cached rows into a
   * staging, and the step's new rows are written back after it (kv_disk.c) */
  const int remote = e->kv[l].host && !e->layer_on_cpu;
  if (remote) {
    const uint64_t off[2] = {e->ws.q, e->ws.k};
    const uint64_t bytes[2] = {(uint64_t)(T * NH * qk) * 4, (uint64_t)(T * width) * 4};
    if ((st = ferry__cross_down(e, off, bytes, 2))) return st;
    ferry__side_cpu(e);
    if ((st = ferry__kv_disk_load(e, l))) return st;
  }
  struct ferry_kernel k = kernel(FERRY_K_MLA_ATTENTION, "mla_attention", l);
  if ((st = weight(e, FERRY_ROLE_MLA_KV_B, l, -1, 0, e->n_tok, &k.w))) return st;
  attention_common(e, l, &k);
  k.x = ferry__ws(e, e->ws.q);
  k.aux[0] = ferry__ws(e, e->ws.k);
  k.aux[3] = NOREF;
  k.y = ferry__ws(e, e->ws.attn);
  k.heads = NH;
  k.kv_heads = 1;
  k.head_dim = mc->qk_nope_dim;
  k.rot_dim = mc->qk_rope_dim;
  k.k = rank;
  k.n = mc->v_head_dim;
  k.scale = e->attn_scale;
  TRY(ferry_exec_compute(e->ex, e->cq, &k));
  if (remote) {
    if ((st = ferry__kv_disk_store(e, l))) return st;
    ferry__side_device(e);
    const uint64_t off = e->ws.attn, bytes = (uint64_t)(T * NH * mc->v_head_dim) * 4;
    if ((st = ferry__cross_up(e, &off, &bytes, 1))) return st;
  }
  return matmul(e, "attn.o", l, e->ws.attn, e->ws.x, T, H, NH * mc->v_head_dim, FERRY_ROLE_ATTN_O, NOREF, 1);
}

/* q, k and v of the usual attention: separate projections, or one fused query_key_value. */
static ferry_status qkv(struct ferry_engine *e, int32_t l) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t T = e->n_tok, H = mc->hidden, qd = mc->n_heads * mc->head_dim / tp_of(e),
                kvd = mc->n_kv_heads * mc->head_dim / tp_of(e);
  ferry_status st;
  if (mc->fused_qkv) {
    if ((st = matmul(e, "attn.qkv", l, e->ws.h, e->ws.qkv, T, 3 * qd, H, FERRY_ROLE_ATTN_QKV,
                     W(e, FERRY_ROLE_ATTN_QKV_BIAS, l), 0)))
      return st;
    struct ferry_kernel k = kernel(FERRY_K_SPLIT_QKV, "split_qkv", l);
    k.x = ferry__ws(e, e->ws.qkv);
    k.y = ferry__ws(e, e->ws.q);
    k.aux[0] = ferry__ws(e, e->ws.k);
    k.aux[1] = ferry__ws(e, e->ws.v);
    k.m = T;
    k.heads = mc->n_heads;
    k.head_dim = mc->head_dim;
    TRY(ferry_exec_compute(e->ex, e->cq, &k));
    return FERRY_OK;
  }
  if ((st = matmul(e, "attn.q", l, e->ws.h, e->ws.q, T, qd, H, FERRY_ROLE_ATTN_Q, W(e, FERRY_ROLE_ATTN_Q_BIAS, l), 0)) ||
      (st = matmul(e, "attn.k", l, e->ws.h, e->ws.k, T, kvd, H, FERRY_ROLE_ATTN_K, W(e, FERRY_ROLE_ATTN_K_BIAS, l), 0)) ||
      (st = matmul(e, "attn.v", l, e->ws.h, e->ws.v, T, kvd, H, FERRY_ROLE_ATTN_V, W(e, FERRY_ROLE_ATTN_V_BIAS, l), 0)))
    return st;
  return FERRY_OK;
}

/* Narrow layer l's attention or append op k, built for the whole step, to tokens [a, b): their
 * rows of q, the output, k and v, their positions and slots, the context they see. */
static void token_range(struct ferry_engine *e, int32_t l, struct ferry_kernel *k, int64_t a, int64_t b) {
  if (a == 0 && b == e->n_tok) return;
  const uint64_t qrow = (uint64_t)(k->heads * k->head_dim) * 4, kvrow = (uint64_t)(k->kv_heads * k->head_dim) * 4;
  k->x.offset += (uint64_t)a * qrow;
  k->y.offset += (uint64_t)a * qrow;
  k->aux[0].offset += (uint64_t)a * kvrow;
  k->aux[1].offset += (uint64_t)a * kvrow;
  k->m = b - a;
  k->ints += a;
  k->ints2 += a;
  k->n_ints = b - a;
  k->context_tokens = context_range(e, l, a, b);
}

/* Layer l's attention op over tokens [a, b) on the side ops are issued to, over the layer's
 * cache; kind FERRY_K_KV_APPEND: only the append of their k and v rows (x, y, heads unset). */
static void attention_op(struct ferry_engine *e, int32_t l, enum ferry_kernel_kind kind, int64_t a, int64_t b,
                         struct ferry_kernel *k) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t hd = mc->head_dim;
  *k = kernel(kind, kind == FERRY_K_KV_APPEND ? "kv_append" : "attention", l);
  attention_common(e, l, k);
  k->aux[0] = ferry__ws(e, e->ws.k);
  k->aux[1] = ferry__ws(e, e->ws.v);
  k->kv_heads = mc->n_kv_heads / tp_of(e);
  k->head_dim = hd;
  if (kind == FERRY_K_ATTENTION) {
    k->host_syncs = hf_host_syncs(mc->family, FERRY_K_ATTENTION);
    k->x = ferry__ws(e, e->ws.q);
    k->y = ferry__ws(e, e->ws.attn);
    k->aux[4] = W(e, FERRY_ROLE_ATTN_SINKS, l);
    k->heads = mc->n_heads / tp_of(e);
    /* only a scale other than 1/sqrt(head_dim) is spelled out (executors may lack the option) */
    if (fabsf(e->attn_scale - 1.0f / sqrtf((float)hd)) > 1e-6f * e->attn_scale) k->scale = e->attn_scale;
    k->softcap = (float)mc->attn_softcap;
    k->alibi = mc->alibi;
    if (!e->li[l].rope && mc->attn_temp_floor > 0) {
      k->temp_floor = (float)mc->attn_temp_floor;
      k->temp_scale = (float)mc->attn_temp_scale;
    }
  }
  token_range(e, l, k, a, b);
  if (kind == FERRY_K_KV_APPEND) k->context_tokens = 0;
}

/* --kv-home layer (llama.cpp's -ngl), layer l's cache in host memory and the layer on the device
 * this step: the new k and v rows go down and the CPU writes them into the host cache (ggml's
 * scheduler runs the ggml_cpy into the cache's view on the cache's backend, the CPU), then each
 * sequence's window, every row up to its last position this step, is copied up into the scratch
 * (the cache views the attention's products read are inputs of the GPU's split, copied up) and
 * every token attends there. The copy up waits for the CPU's writes and the device for the copy,
 * so the next layer's copy down (after the device's ops) overwrites no row the CPU still reads. */
static ferry_status attend_window(struct ferry_engine *e, int32_t l) {
  const int64_t T = e->n_tok, kvd = e->mc->n_kv_heads / tp_of(e) * e->mc->head_dim;
  const uint64_t off[2] = {e->ws.k, e->ws.v}, bytes[2] = {(uint64_t)(T * kvd) * 4, (uint64_t)(T * kvd) * 4};
  struct ferry_kernel k;
  ferry_status st;
  if (e->mbs[e->cur_mb].kvp_first) /* a micro-batch holds at most the scratch's max_batch sequences */
    return ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "engine: layer %d: tokens without a scratch slot", l);
  if ((st = ferry__cross_down(e, off, bytes, 2))) return st;
  ferry__side_cpu(e);
  attention_op(e, l, FERRY_K_KV_APPEND, 0, T, &k);
  TRY(ferry_exec_compute(e->ex, e->cq, &k));
  ferry__side_device(e);
  if ((st = ferry__kv_scratch_load(e, l))) return st;
  attention_op(e, l, FERRY_K_ATTENTION, 0, T, &k);
  ferry__kv_prefill_scratch(e, &k, 0, l);
  TRY(ferry_exec_compute(e->ex, e->cq, &k));
  return ferry__kv_scratch_used(e);
}

/* Layer l's attention where its KV cache is. A cache in host memory (--kv-home host, or a
 * streamed layer of a hybrid run computed on the device this step): q, k and v go down, the
 * CPU attends, the result comes back. With --kv-prefill device the step's tokens [dev, T) that
 * start their sequences attend on the device over the prefill scratch meanwhile (their k and v
 * still go down, appended to the host cache on the CPU), and only [0, dev) attend on the CPU.
 * With --kv-attention device every token does (dev is 0), over the scratch into which their
 * sequences' cached rows were copied up: only k and v go down, nothing comes back, and the
 * device waits only for that copy down (before the next layer overwrites k and v). With the cache
 * on disk (--kv-home disk) the CPU's ops wait for the reads of the micro-batch's cached rows into a
 * staging, and the step's new rows are written back after them (kv_disk.c). */
static ferry_status attend(struct ferry_engine *e, int32_t l) {
  const int64_t T = e->n_tok, qd = e->mc->n_heads / tp_of(e) * e->mc->head_dim,
                kvd = e->mc->n_kv_heads / tp_of(e) * e->mc->head_dim;
  const int remote = e->kv[l].host && !e->layer_on_cpu;
  if (remote && e->cfg.kv_home_layer) return attend_window(e, l);
  const int64_t dev = remote ? e->mbs[e->cur_mb].kvp_first : T;
  const int all = remote && e->cfg.kv_attention_device && dev == 0;
  struct ferry_kernel k;
  ferry_status st;
  if (remote) {
    const uint64_t off[3] = {e->ws.q, e->ws.k, e->ws.v};
    const uint64_t bytes[3] = {(uint64_t)(dev * qd) * 4, (uint64_t)(T * kvd) * 4, (uint64_t)(T * kvd) * 4};
    if ((st = ferry__cross_down(e, off, bytes, 3))) return st;
    if (dev < T) {
      if ((st = ferry__kv_scratch_load(e, l))) return st;
      attention_op(e, l, FERRY_K_ATTENTION, dev, T, &k);
      ferry__kv_prefill_scratch(e, &k, dev, l);
      TRY(ferry_exec_compute(e->ex, e->cq, &k));
      if ((st = ferry__kv_scratch_used(e))) return st;
    }
    if (all) TRY(ferry_exec_queue_wait(e->ex, e->q_compute, e->ev_down));
    ferry__side_cpu(e);
    if ((st = ferry__kv_disk_load(e, l))) return st;
  }
  if (dev > 0) {
    attention_op(e, l, FERRY_K_ATTENTION, 0, dev, &k);
    TRY(ferry_exec_compute(e->ex, e->cq, &k));
  }
  if (dev < T) {
    attention_op(e, l, FERRY_K_KV_APPEND, dev, T, &k);
    TRY(ferry_exec_compute(e->ex, e->cq, &k));
  }
  if (remote && (st = ferry__kv_disk_store(e, l))) return st;
  if (all) {
    /* the host workspace's k and v are read: the next copy down may overwrite them */
    ferry__side_device(e);
    TRY(ferry_exec_record(e->ex, e->q_cpu, e->ev_cpu));
    TRY(ferry_exec_queue_wait(e->ex, e->q_d2h, e->ev_cpu));
  } else if (remote) {
    ferry__side_device(e);
    const uint64_t off = e->ws.attn, bytes = (uint64_t)(dev * qd) * 4;
    if ((st = ferry__cross_up(e, &off, &bytes, 1))) return st;
  }
  return FERRY_OK;
}

static ferry_status attention_part(struct ferry_engine *e, int32_t l) {
  const struct ferry_model_config *mc = e->mc;
  const struct ferry_layer_info *li = &e->li[l];
  const int64_t T = e->n_tok, H = mc->hidden, NH = mc->n_heads / tp_of(e), KV = mc->n_kv_heads / tp_of(e),
                hd = mc->head_dim;
  const int64_t qd = NH * hd, kvd = KV * hd;
  ferry_status st;
  if ((st = norm(e, "attn_norm", l, e->ws.x, e->ws.h, T, H, W(e, FERRY_ROLE_ATTN_NORM, l),
                 W(e, FERRY_ROLE_ATTN_NORM_BIAS, l))))
    return st;
  /* parallel residual (GPT-NeoX): the FFN reads the norm of the layer's input, not of x + attn;
   * GPT-J's one norm is computed again into h2, as attention's output projection reuses h */
  const int shared = mc->parallel_shared_norm;
  if (mc->parallel_residual &&
      (st = norm(e, "ffn_norm", l, e->ws.x, e->ws.h2, T, H, W(e, shared ? FERRY_ROLE_ATTN_NORM : FERRY_ROLE_FFN_NORM, l),
                 W(e, shared ? FERRY_ROLE_ATTN_NORM_BIAS : FERRY_ROLE_FFN_NORM_BIAS, l))))
    return st;
  if (mc->kv_lora_rank) return mla_part(e, l);
  if ((st = qkv(e, l))) return st;
  if (mc->qk_norm == FERRY_QK_NORM_FULL) {
    if ((st = norm_ex(e, "q_norm", l, e->ws.q, e->ws.q, T, qd, 0, W(e, FERRY_ROLE_Q_NORM, l), NOREF, FERRY_NORMFN_RMS, 0)) ||
        (st = norm_ex(e, "k_norm", l, e->ws.k, e->ws.k, T, kvd, 0, W(e, FERRY_ROLE_K_NORM, l), NOREF, FERRY_NORMFN_RMS, 0)))
      return st;
  } else if (mc->qk_norm == FERRY_QK_NORM_HEAD) {
    const int kind = model_norm(mc); /* Gemma 3's q/k norms are (1 + w) like its others */
    if ((st = norm_ex(e, "q_norm", l, e->ws.q, e->ws.q, T * NH, hd, 0, W(e, FERRY_ROLE_Q_NORM, l), NOREF, kind, 0)) ||
        (st = norm_ex(e, "k_norm", l, e->ws.k, e->ws.k, T * KV, hd, 0, W(e, FERRY_ROLE_K_NORM, l), NOREF, kind, 0)))
      return st;
  }
  if (li->rope) {
    const int64_t rd = mc->rotary_dim ? mc->rotary_dim : hd;
    if ((st = rope(e, l, e->ws.q, NH, e->ws.k, KV, hd, 0, rd))) return st;
    /* Llama 4: RoPE layers normalise q and k per head after the rotation */
    if (mc->qk_norm == FERRY_QK_NORM_L2 &&
        ((st = norm_ex(e, "q_l2norm", l, e->ws.q, e->ws.q, T * NH, hd, 0, NOREF, NOREF, FERRY_NORMFN_RMS_PLAIN, 0)) ||
         (st = norm_ex(e, "k_l2norm", l, e->ws.k, e->ws.k, T * KV, hd, 0, NOREF, NOREF, FERRY_NORMFN_RMS_PLAIN, 0))))
      return st;
  }
  if ((st = attend(e, l))) return st;
  /* residual: x += o_proj(attn); Gemma normalises the output first */
  if (mc->sandwich_norms)
    return (st = matmul(e, "attn.o", l, e->ws.attn, e->ws.h, T, H, qd, FERRY_ROLE_ATTN_O, W(e, FERRY_ROLE_ATTN_O_BIAS, l), 0))
               ? st
               : norm_ex(e, "post_attn_norm", l, e->ws.h, e->ws.x, T, H, 0, W(e, FERRY_ROLE_POST_ATTN_NORM, l), NOREF,
                         model_norm(mc), 1);
  return matmul(e, "attn.o", l, e->ws.attn, e->ws.x, T, H, qd, FERRY_ROLE_ATTN_O,
                resid_acc(e) ? W(e, FERRY_ROLE_ATTN_O_BIAS, l) : NOREF, resid_acc(e));
}

/* The dense FFN of layer l on the normed input `in`, added into x (Gemma: normalised first). */
static ferry_status dense_ffn(struct ferry_engine *e, int32_t l, uint64_t in) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t T = e->n_tok, H = mc->hidden, I = mc->intermediate / tp_of(e);
  ferry_status st;
  if (mc->act == FERRY_ACT_SWIGLU || mc->act == FERRY_ACT_GEGLU) {
    if ((st = matmul(e, "mlp.gate", l, in, e->ws.g, T, I, H, FERRY_ROLE_FFN_GATE, NOREF, 0)) ||
        (st = matmul(e, "mlp.up", l, in, e->ws.u, T, I, H, FERRY_ROLE_FFN_UP, NOREF, 0)))
      return st;
    struct ferry_kernel k = kernel(FERRY_K_SWIGLU, mc->act == FERRY_ACT_GEGLU ? "geglu" : "swiglu", l);
    k.x = ferry__ws(e, e->ws.g);
    k.aux[0] = ferry__ws(e, e->ws.u);
    k.y = ferry__ws(e, e->ws.g);
    k.m = T;
    k.n = I;
    k.fn = mc->act == FERRY_ACT_GEGLU ? FERRY_FN_GELU_TANH_MUL : FERRY_FN_SILU_MUL;
    TRY(ferry_exec_compute(e->ex, e->cq, &k));
  } else {
    if ((st = matmul(e, "mlp.fc1", l, in, e->ws.g, T, I, H, FERRY_ROLE_FFN_UP, W(e, FERRY_ROLE_FFN_UP_BIAS, l), 0)))
      return st;
    const enum ferry_act_fn fn = mc->act == FERRY_ACT_GELU ? FERRY_FN_GELU
                                 : mc->act == FERRY_ACT_GELU_TANH ? FERRY_FN_GELU_TANH
                                                                  : FERRY_FN_RELU;
    struct ferry_kernel k = kernel(FERRY_K_SWIGLU, fn == FERRY_FN_RELU ? "relu" : "gelu", l);
    k.x = k.y = ferry__ws(e, e->ws.g);
    k.m = T;
    k.n = I;
    k.fn = fn;
    TRY(ferry_exec_compute(e->ex, e->cq, &k));
  }
  if (mc->sandwich_norms)
    return (st = matmul(e, "mlp.down", l, e->ws.g, e->ws.h, T, H, I, FERRY_ROLE_FFN_DOWN, NOREF, 0))
               ? st
               : norm_ex(e, "post_ffn_norm", l, e->ws.h, e->ws.x, T, H, 0, W(e, FERRY_ROLE_POST_FFN_NORM, l), NOREF,
                         model_norm(mc), 1);
  return matmul(e, "mlp.down", l, e->ws.g, e->ws.x, T, H, I, FERRY_ROLE_FFN_DOWN,
                resid_acc(e) ? W(e, FERRY_ROLE_FFN_DOWN_BIAS, l) : NOREF, resid_acc(e));
}

/* Whether layer l's ops of the current micro-batch may be op graphs (memo.c): only the device's.
 * A graph times its kernels again at launch with the GPU's cost model, and a hybrid run's ops
 * move between the device and the CPU as the placement of the hidden state decides. */
static int memo_device_only(const struct ferry_engine *e, int32_t l) {
  return !e->layer_on_cpu && !ferry__hybrid_on(e) && !e->kv[l].host; /* a host KV cache is hybrid */
}

/* The read-back of layer l's routing and lookahead logits to the host, on the device's side
 * (recorded by the memo). */
static ferry_status readback_ops(struct ferry_engine *e, int32_t l, int32_t rq, uint64_t look_bytes) {
  const int64_t T = e->n_tok, K = e->mc->experts_per_token;
  struct ferry_ref dst_w = {e->readback_buf, 0, FERRY_DTYPE_F32};
  struct ferry_ref dst_i = {e->readback_buf, (uint64_t)(T * K) * 4, FERRY_DTYPE_I32};
  if (!e->layer_on_cpu) {
    TRY(ferry_exec_record(e->ex, e->q_compute, e->ev_router));
    TRY(ferry_exec_queue_wait(e->ex, e->q_d2h, e->ev_router));
  }
  TRY(ferry_exec_copy(e->ex, rq, dst_w, ferry__ws(e, e->ws.topk_w), (uint64_t)(T * K) * 4));
  TRY(ferry_exec_copy(e->ex, rq, dst_i, ferry__ws(e, e->ws.topk_ids), (uint64_t)(T * K) * 4));
  ferry_status st = ferry__features_copy_hidden(e, l);
  if (st != FERRY_OK) return st;
  if (look_bytes) {
    struct ferry_ref dst_l = {e->readback_buf, ferry__readback_lookahead_offset(e), FERRY_DTYPE_F32};
    TRY(ferry_exec_copy(e->ex, rq, dst_l, ferry__ws(e, e->ws.logits_look), look_bytes));
  }
  return FERRY_OK;
}

/* Routing of the current layer into e->routing_ids / routing_w: read back from the device
 * when the executor computes, else asked from the routing source. */
static ferry_status routing(struct ferry_engine *e, int32_t l) {
  const int64_t T = e->n_tok, K = e->mc->experts_per_token;
  /* The read-back and the host wait happen on every executor, so a simulated run has the same
   * ops and the same stall as a real one; only where the ids come from differs. */
  /* a layer computed on the CPU routed in host memory: its queue copies the result itself */
  const int32_t rq = e->layer_on_cpu ? e->q_cpu : e->q_d2h;
  ferry_event *done = e->layer_on_cpu ? e->ev_cpu : e->ev_tmp;
  const uint64_t look_bytes = (uint64_t)(T * e->mc->n_experts * ferry__lookahead_layers(e)) * 4;
  /* the same ops whenever the layer routes as many tokens on the device (the features' copy
   * depends on the layer: only the plain read-back is recorded), its record of done with them */
  ferry_status fst;
  if (memo_device_only(e, l) && !e->cfg.token_features) {
    struct memo_site site;
    int replayed;
    if ((fst = ferry__memo_begin(e, &site, MEMO_ROUTING, l, T, NULL, 0, -1, &replayed)) != FERRY_OK) return fst;
    if (!replayed) {
      fst = readback_ops(e, l, rq, look_bytes);
      if (fst == FERRY_OK && (fst = ferry_exec_record(e->ex, rq, done)) != FERRY_OK)
        fst = ferry__err_set(&e->err, fst, "%s", ferry_exec_errmsg(e->ex));
      if ((fst = ferry__memo_end(e, &site, fst)) != FERRY_OK) return fst;
    }
  } else {
    if ((fst = readback_ops(e, l, rq, look_bytes)) != FERRY_OK) return fst;
    TRY(ferry_exec_record(e->ex, rq, done));
  }
  TRY(ferry_exec_sync(e->ex, done));
  if (!e->layer_on_cpu) e->step_bytes_d2h += (uint64_t)(T * K) * 8 + look_bytes;
  if (l == e->first_moe_layer) ferry__features_compute(e);
  if (e->has_data) {
    const char *base = ferry_exec_buf_host_ptr(e->ex, e->readback_buf);
    memcpy(e->routing_w, base, (size_t)(T * K) * 4);
    memcpy(e->routing_ids, base + (T * K) * 4, (size_t)(T * K) * 4);
    for (int64_t i = 0; i < T * K; i++)
      if (e->routing_ids[i] < 0 || e->routing_ids[i] >= e->mc->n_experts)
        return ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "layer %d: router chose expert %d", l, e->routing_ids[i]);
  } else {
    /* Nothing computes with gate weights here: ask for them only when someone reads them. */
    const int need_weights = e->cfg.on_routing || e->cfg.predict;
    if (e->cfg.routing_many)
      e->cfg.routing_many(e->cfg.routing_user, T, e->tok_req, e->tok_index, l, (int32_t)K, (int32_t)e->mc->n_experts,
                          e->routing_ids, need_weights ? e->routing_w : NULL);
    else
      for (int64_t t = 0; t < T; t++)
        e->cfg.routing(e->cfg.routing_user, e->tok_req[t], e->tok_index[t], l, (int32_t)K, (int32_t)e->mc->n_experts,
                       e->routing_ids + t * K, need_weights ? e->routing_w + t * K : NULL);
  }
  if (e->cfg.on_routing)
    for (int64_t t = 0; t < T; t++) {
      const struct seq *s = &e->seqs[e->tok_seq[t]];
      const float *feat = ferry__features_of(e, t);
      e->cfg.on_routing(e->cfg.on_routing_user, e->reqs[s->req].id, e->tok_index[t], l, (int32_t)K,
                        e->routing_ids + t * K, e->routing_w + t * K, feat ? e->cfg.token_features : 0, feat);
    }
  return FERRY_OK;
}

static void group_pairs(struct ferry_engine *e);

/* Expert x of layer l over its tokens from slot sl (NULL: resident, in its block or on the
 * CPU): wait for the slot's fill, the FFN (after dequantizing), and mark the slot's use. */
static ferry_status expert_ops(struct ferry_engine *e, int32_t l, int32_t x, struct slot *sl, uint64_t in) {
  const struct ferry_model_config *mc = e->mc;
  if (sl) TRY(ferry_exec_queue_wait(e->ex, e->q_compute, sl->ready));
  struct ferry_kernel k = kernel(FERRY_K_EXPERT, "expert", l);
  const int64_t rows = e->expert_count[x];
  k.expert = x;
  k.x = ferry__ws(e, in);
  k.y = ferry__ws(e, e->ws.expert_out);
  ferry_status st;
  k.expert_layout = (int32_t)mc->expert_layout;
  if (mc->expert_layout == FERRY_EXPERTS_SPLIT) {
    if ((st = weight(e, FERRY_ROLE_EXPERT_GATE, l, x, 0, rows, &k.w)) ||
        (st = weight(e, FERRY_ROLE_EXPERT_UP, l, x, 1, rows, &k.aux[0])) ||
        (st = weight(e, FERRY_ROLE_EXPERT_DOWN, l, x, 2, rows, &k.aux[1])))
      return st;
  } else {
    if ((st = weight(e, FERRY_ROLE_EXPERT_GATE_UP, l, x, 0, rows, &k.w)) ||
        (st = weight(e, FERRY_ROLE_EXPERT_DOWN, l, x, 2, rows, &k.aux[1])))
      return st;
    const struct tensor_loc *gu = ferry__engine_loc(e, FERRY_ROLE_EXPERT_GATE_UP, l, x);
    const struct tensor_loc *dn = ferry__engine_loc(e, FERRY_ROLE_EXPERT_DOWN, l, x);
    /* stored [in, out] unless dequantized (quantized formats pack [out, in] rows) */
    if (!gu->quantized && ferry_model_tensor(e->model, (size_t)(gu - e->tensors))->transposed)
      k.w_trans |= FERRY_EXPERT_W_TRANS_GATE;
    if (!dn->quantized && ferry_model_tensor(e->model, (size_t)(dn - e->tensors))->transposed)
      k.w_trans |= FERRY_EXPERT_W_TRANS_DOWN;
    k.aux[6] = ferry__engine_weight(e, FERRY_ROLE_EXPERT_GATE_UP_BIAS, l, x);
    k.aux[7] = ferry__engine_weight(e, FERRY_ROLE_EXPERT_DOWN_BIAS, l, x);
    k.swiglu_limit = (float)mc->swiglu_limit;
  }
  k.aux[2] = ferry__ws(e, e->ws.gather);
  k.aux[3] = ferry__ws(e, e->ws.eg);
  k.aux[4] = ferry__ws(e, e->ws.eu);
  if (mc->expert_scale_input) {
    k.scale_input = 1;
    k.aux[5] = ferry__ws(e, e->ws.topk_w);
  }
  k.m = e->expert_count[x];
  k.n = mc->expert_intermediate;
  k.k = mc->hidden;
  k.top_k = mc->experts_per_token;
  group_pairs(e);
  k.ints = e->expert_tokens + e->expert_start[x];
  k.ints2 = e->expert_ranks + e->expert_start[x];
  k.n_ints = k.m;
  TRY(ferry_exec_compute(e->ex, e->cq, &k));
  if (sl) TRY(ferry_exec_record(e->ex, e->q_compute, sl->free));
  return FERRY_OK;
}

/* The same ops for the same expert, tokens and slot kind on the device: one op graph each, the
 * slot's events its parameters. */
static ferry_status run_expert(struct ferry_engine *e, int32_t l, int32_t x, int32_t slot, uint64_t in) {
  /* an expert in a cache slot is streamed (its unit is pinned only when every expert is) */
  const int streamed = slot >= 0 && !e->plan.experts_pinned;
  struct slot *sl = streamed ? &e->expert_slots[slot] : NULL;
  ferry_status st;
  if (e->cq == e->q_compute && memo_device_only(e, l)) {
    ferry_event *params[2] = {sl ? sl->ready : NULL, sl ? sl->free : NULL};
    struct memo_site site;
    int replayed;
    if ((st = ferry__memo_begin(e, &site, MEMO_EXPERT, (int64_t)l * e->mc->n_experts + x,
                                (int64_t)e->expert_count[x] * 2 + streamed, params, 2, -1, &replayed)) != FERRY_OK)
      return st;
    if (!replayed && (st = ferry__memo_end(e, &site, expert_ops(e, l, x, sl, in))) != FERRY_OK) return st;
  } else if ((st = expert_ops(e, l, x, sl, in)) != FERRY_OK) {
    return st;
  }
  if (sl) sl->used = 1;
  return FERRY_OK;
}

/* What the expert plan decided, as ops: a hit runs, a miss or a prefetch is fetched first (a
 * prefetch runs later, when its layer routes to it). */
struct expert_act {
  struct ferry_engine *e;
  uint64_t in;
  int run; /* demand: run the expert; prefetch: only fetch it */
};

static ferry_status expert_act(void *user, int32_t l, int32_t x, int32_t slot, int fetch) {
  struct expert_act *a = user;
  struct ferry_engine *e = a->e;
  ferry_status st;
  /* the fill's eviction (expert_plan.c notes its layer), and the step's and layer's counts */
  if (fetch && e->xplan.evicted_layer >= 0) {
    e->step_evictions++;
    e->layer_stats[e->xplan.evicted_layer].evictions++;
  }
  if (a->run && fetch) e->step_misses++, e->layer_stats[l].misses++;
  else if (a->run) e->step_hits++, e->layer_stats[l].hits++;
  else e->layer_stats[l].prefetches++;
  if (fetch && (st = ferry__engine_fetch_expert(e, e->expert_unit[l * e->mc->n_experts + x], slot)) != FERRY_OK)
    return st;
  return a->run ? run_expert(e, l, x, slot, a->in) : FERRY_OK;
}

/* After layer l's experts are enqueued: ask the predictor, per token, for the experts of the
 * next prefetch_depth layers; the plan fetches the most voted ones that are not cached. Wrong
 * guesses cost bandwidth and slots, never correctness: a demand miss fetches what is really
 * needed. */
static ferry_status prefetch_experts(struct ferry_engine *e, int32_t l) {
  const struct ferry_model_config *mc = e->mc;
  if (!e->cfg.predict) return FERRY_OK;
  const int32_t E = (int32_t)mc->n_experts, K = (int32_t)mc->experts_per_token, L = (int32_t)mc->n_layers;
  const int32_t depth = e->cfg.prefetch_depth > 0 ? e->cfg.prefetch_depth : 1;
  /* lookahead logits of (ahead, token) as read back with the routing; none without data */
  const int32_t n_look = ferry__lookahead_layers(e);
  const float *look = n_look && e->has_data
                          ? (const float *)((const char *)ferry_exec_buf_host_ptr(e->ex, e->readback_buf) +
                                            ferry__readback_lookahead_offset(e))
                          : NULL;
  struct expert_act act = {.e = e, .run = 0};
  for (int32_t ahead = 1; ahead <= depth && l + ahead < L; ahead++) {
    const int32_t target = l + ahead;
    if (!e->li[target].moe) continue; /* a dense layer has no experts to fetch */
    ferry__xplan_vote_reset(&e->xplan);
    for (int64_t t = 0; t < e->n_tok; t++) {
      const struct seq *q = &e->seqs[e->tok_seq[t]];
      const struct ferry_engine_request *r = &e->reqs[q->req];
      const float *look_t = look && ahead <= n_look ? look + ((int64_t)(ahead - 1) * e->n_tok + t) * E : NULL;
      const float *feat = ferry__features_of(e, t);
      const struct ferry_expert_predict_request rq = {
          .req_id = r->id, .token_index = e->tok_index[t], .seq_len = r->prompt_tokens + r->output_tokens,
          .layer_now = l, .target_layer = target, .k = K, .n_experts = E, .ids_now = e->routing_ids + t * K,
          .weights_now = e->routing_w + t * K, .lookahead_logits = look_t, .token_features = feat,
          .n_features = feat ? e->cfg.token_features : 0};
      const int32_t n = e->cfg.predict(e->cfg.predict_user, &rq, e->predicted, E);
      ferry__xplan_vote(&e->xplan, e->predicted, n < E ? n : E);
    }
    ferry_status st = ferry__xplan_prefetch(&e->xplan, target, expert_act, &act);
    if (st != FERRY_OK) return ferry__err_set(&e->err, st, "%s", ferry_last_error());
  }
  return FERRY_OK;
}

/* Gate lookahead: the routers of the next layers (resident) applied to this layer's hidden
 * state, into rows [ahead - 1][token] of logits_look; read back with the routing. An op of the
 * layer it runs in, on the weight of the layer it looks at. Dense layers ahead have no router. */
static ferry_status router_lookahead(struct ferry_engine *e, int32_t l) {
  const int32_t n_look = ferry__lookahead_layers(e);
  const int64_t T = e->n_tok, H = e->mc->hidden, E = e->mc->n_experts;
  for (int32_t ahead = 1; ahead <= n_look && l + ahead < e->mc->n_layers; ahead++) {
    if (!e->li[l + ahead].moe) continue;
    const uint64_t y = e->ws.logits_look + (uint64_t)((int64_t)(ahead - 1) * T * E) * 4;
    struct ferry_ref w;
    ferry_status st = weight(e, FERRY_ROLE_ROUTER, l + ahead, -1, 0, T, &w);
    if (st == FERRY_OK)
      st = matmul_w(e, "router.lookahead", l, e->ws.h, y, T, E, H, w, W(e, FERRY_ROLE_ROUTER_BIAS, l + ahead), 0);
    if (st != FERRY_OK) return st;
  }
  return FERRY_OK;
}

/* A gather of T x top_k expert rows from expert_out: pair p's own row where keep(p), else the
 * zero row after expert_out. */
static ferry_status gather_pairs(struct ferry_engine *e, int32_t l, const char *name, int32_t *rows, int cpu_side) {
  const int64_t TK = (int64_t)e->n_tok * e->mc->experts_per_token;
  const int32_t zero = e->cfg.max_step_tokens * (int32_t)e->mc->experts_per_token; /* the zero row */
  for (int64_t p = 0; p < TK; p++) rows[p] = e->pair_cpu[p] == cpu_side ? (int32_t)p : zero;
  struct ferry_kernel g = kernel(FERRY_K_GATHER_ROWS, name, l);
  g.x = ferry__ws(e, e->ws.expert_out);
  g.y = ferry__ws(e, e->ws.expert_final);
  g.m = TK;
  g.n = e->mc->hidden;
  g.ints = rows;
  g.n_ints = TK;
  TRY(ferry_exec_compute(e->ex, e->cq, &g));
  return FERRY_OK;
}

/* The routed experts of layer l marked in expert_cpu_now, on the CPU from their host copies: the
 * layer's input (and gate weights) go down, the CPU combines its experts' rows into one row per
 * token (the other pairs read as zeros), and only that sum comes back (ktransformers, Fiddler).
 * Returns in *n_pairs how many (token, expert) pairs the CPU computes. */
static ferry_status cpu_experts(struct ferry_engine *e, int32_t l, uint64_t in, int64_t *n_pairs) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t T = e->n_tok, K = mc->experts_per_token, H = mc->hidden, E = mc->n_experts;
  int64_t n = 0;
  memset(e->pair_cpu, 0, (size_t)(T * K));
  group_pairs(e);
  for (int32_t x = 0; x < E; x++) {
    if (!e->expert_cpu_now[x]) continue;
    for (int32_t i = e->expert_start[x]; i < e->expert_start[x] + e->expert_count[x]; i++, n++)
      e->pair_cpu[e->expert_tokens[i] * (int32_t)K + e->expert_ranks[i]] = 1;
  }
  *n_pairs = n;
  if (!n) return FERRY_OK;
  const uint64_t off[2] = {in, e->ws.topk_w};
  const uint64_t bytes[2] = {(uint64_t)(T * H) * 4, (uint64_t)(T * K) * 4};
  ferry_status st = ferry__cross_down(e, off, bytes, 2);
  if (st != FERRY_OK) return st;
  ferry__side_cpu(e);
  for (int32_t x = 0; x < E && st == FERRY_OK; x++)
    if (e->expert_cpu_now[x]) {
      st = run_expert(e, l, x, -1, in);
      e->step_cpu_experts++;
      e->layer_stats[l].cpu_experts++;
    }
  if (st == FERRY_OK) st = gather_pairs(e, l, "gather_cpu_pairs", e->cpu_rows, 1);
  if (st == FERRY_OK) { /* cpu_sum = 0, then the weighted sum of the CPU's pairs */
    const int32_t zero = e->cfg.max_step_tokens * (int32_t)K;
    for (int64_t t = 0; t < T; t++) e->zero_rows[t] = zero;
    struct ferry_kernel z = kernel(FERRY_K_GATHER_ROWS, "zero_cpu_sum", l);
    z.x = ferry__ws(e, e->ws.expert_out);
    z.y = ferry__ws(e, e->ws.cpu_sum);
    z.m = T;
    z.n = H;
    z.ints = e->zero_rows;
    z.n_ints = T;
    struct ferry_kernel c = kernel(FERRY_K_MOE_COMBINE, "moe_combine_cpu", l);
    c.y = ferry__ws(e, e->ws.cpu_sum);
    c.aux[0] = ferry__ws(e, e->ws.expert_final);
    if (!mc->expert_scale_input) c.aux[1] = ferry__ws(e, e->ws.topk_w);
    c.m = T;
    c.n = H;
    c.top_k = K;
    if ((st = ferry_exec_compute(e->ex, e->cq, &z)) == FERRY_OK) st = ferry_exec_compute(e->ex, e->cq, &c);
    if (st != FERRY_OK) st = ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  }
  ferry__side_device(e);
  return st;
}

/* How many of ids[0, n) name each expert x < E (at most 16): a pass per expert, which the
 * compiler turns into vector compares (a large step's pairs; few experts). */
static inline __attribute__((always_inline)) void count_passes(const int32_t *ids, int64_t n, int64_t E,
                                                               int32_t *count) {
  for (int64_t x = 0; x < E; x++) {
    int32_t c = 0;
    for (int64_t i = 0; i < n; i++) c += ids[i] == (int32_t)x;
    count[x] = c;
  }
}

/* Without wide vectors the passes cost more than a histogram: four of them, so that repeated
 * experts do not wait on each other's increment. */
static void count_histograms(const int32_t *ids, int64_t n, int64_t E, int32_t *count) {
  int32_t h[4][16] = {{0}};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) h[0][ids[i]]++, h[1][ids[i + 1]]++, h[2][ids[i + 2]]++, h[3][ids[i + 3]]++;
  for (; i < n; i++) h[0][ids[i]]++;
  for (int64_t x = 0; x < E; x++) count[x] = h[0][x] + h[1][x] + h[2][x] + h[3][x];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* sixteen pairs a compare where the processor has AVX-512 (checked at run time) */
__attribute__((target("avx512f"))) static void count_passes_avx512(const int32_t *ids, int64_t n, int64_t E,
                                                                   int32_t *count) {
  count_passes(ids, n, E, count);
}

static void (*count_passes_best(void))(const int32_t *, int64_t, int64_t, int32_t *) {
  /* a load and a bit test of what the compiler's runtime read at start: no cache of our own,
   * which replicas' engine threads would write together */
  return __builtin_cpu_supports("avx512f") ? count_passes_avx512 : count_histograms;
}
#else
static void (*count_passes_best(void))(const int32_t *, int64_t, int64_t, int32_t *) { return count_histograms; }
#endif

/* Count the (token, rank) pairs of each expert and where each expert's run of them starts; the
 * pairs themselves are placed by group_pairs() when an op is built that reads them (a replayed
 * op graph does not: in a simulation most layers never need them). */
static void group_by_expert(struct ferry_engine *e) {
  const int64_t T = e->n_tok, K = e->mc->experts_per_token, E = e->mc->n_experts, TK = T * K;
  const int32_t *ids = e->routing_ids;
  int32_t *count = e->expert_count;
  if (E <= 16 && TK >= 64) {
    count_passes_best()(ids, TK, E, count);
  } else {
    memset(count, 0, (size_t)E * sizeof(int32_t));
    for (int64_t i = 0; i < TK; i++) count[ids[i]]++;
  }
  e->expert_start[0] = 0;
  for (int64_t x = 0; x < E; x++) e->expert_start[x + 1] = e->expert_start[x] + count[x];
  e->pairs_grouped = 0;
}

/* Place the pairs of the current layer by expert, experts in index order (expert_tokens,
 * expert_ranks from expert_start): the same routing always gives the same ops in the same
 * order. Once per layer, before the first op that reads them. */
static void group_pairs(struct ferry_engine *e) {
  if (e->pairs_grouped) return;
  const int64_t T = e->n_tok, K = e->mc->experts_per_token, E = e->mc->n_experts;
  int32_t *at = e->expert_fill;
  for (int64_t x = 0; x < E; x++) at[x] = e->expert_start[x];
  for (int64_t t = 0; t < T; t++)
    for (int64_t r = 0; r < K; r++) {
      const int32_t p = at[e->routing_ids[t * K + r]]++;
      e->expert_tokens[p] = (int32_t)t;
      e->expert_ranks[p] = (int32_t)r;
    }
  e->pairs_grouped = 1;
}

/* Every routed expert of layer l runs: where the layer runs (all resident, the layer on the CPU
 * or in its block), else through the expert cache or on the CPU; *n_cpu_pairs counts the pairs
 * the CPU computed. */
static ferry_status dispatch_experts(struct ferry_engine *e, int32_t l, uint64_t in, int64_t *n_cpu_pairs) {
  const int64_t E = e->mc->n_experts;
  ferry_status st;
  if (e->plan.experts_pinned || e->layer_on_cpu || e->cfg.expert_granularity_layer) {
    /* every expert where the layer runs: resident on the device (or in the layer's block), or
     * on the layer's CPU */
    for (int32_t x = 0; x < E; x++) {
      if (!e->expert_count[x]) continue;
      ferry__dev_use(e, ferry__mgpu_expert_dev(e, l, x)); /* expert parallel: where it lives */
      if ((st = run_expert(e, l, x, -1, in))) return st;
    }
  } else {
    /* Hits first (their data may already be there), then misses, each fetched into a slot
     * chosen by the cache policy (runtime/policy/expert_plan.c), or computed on the CPU from
     * host memory (hybrid runs: those are issued first, so the CPU works while the device runs
     * the others). */
    const int reuse = !e->cfg.expert_no_reuse;
    if (e->expert_cpu_now) {
      for (int32_t x = 0; x < E; x++)
        e->expert_cpu_now[x] = e->expert_count[x] && !(reuse && ferry__cache_lookup(&e->xplan.cache, l, x) >= 0) &&
                               ferry__expert_on_cpu(e, l, x, e->expert_count[x]);
      if ((st = cpu_experts(e, l, in, n_cpu_pairs))) return st;
    }
    struct expert_act act = {.e = e, .in = in, .run = 1};
    if ((st = ferry__xplan_demand(&e->xplan, l, e->expert_count, e->expert_cpu_now, expert_act, &act)) != FERRY_OK)
      return e->err.status == st ? st : ferry__err_set(&e->err, st, "%s", ferry_last_error());
    if ((st = prefetch_experts(e, l))) return st;
  }
  return FERRY_OK;
}

static ferry_status combine_ops(struct ferry_engine *e, int32_t l, int64_t n_cpu_pairs);

/* The experts' rows weighted into the hidden state (the device's pairs, then the CPU's sum):
 * one op graph per (layer, tokens) on the device. */
static ferry_status combine_experts(struct ferry_engine *e, int32_t l, int64_t n_cpu_pairs) {
  const int64_t T = e->n_tok;
  ferry_status st;
  struct memo_site site;
  int replayed = 0, memo = !n_cpu_pairs && memo_device_only(e, l);
  if (memo && ((st = ferry__memo_begin(e, &site, MEMO_COMBINE, l, T, NULL, 0, -1, &replayed)) != FERRY_OK || replayed))
    return st;
  st = combine_ops(e, l, n_cpu_pairs);
  return memo ? ferry__memo_end(e, &site, st) : st;
}

/* The combine's ops (see combine_experts()). */
static ferry_status combine_ops(struct ferry_engine *e, int32_t l, int64_t n_cpu_pairs) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t T = e->n_tok, H = mc->hidden, K = mc->experts_per_token;
  /* every pair on the CPU and the combine on the device (not a layer computed on the CPU): the
   * device has no pairs of its own, only the shared expert and the CPU's sum to add (it has no
   * expert rows either: layout_workspace()). A combine of no ranks adds what one of the zero
   * rows would (a sum from +0), so the logits are those of gathering them. */
  const int none_here = n_cpu_pairs && e->experts_cpu_only;
  ferry_status st;
  uint64_t expert_rows = e->ws.expert_out;
  if (n_cpu_pairs) { /* the device's own pairs only; the CPU's sum is added after */
    const uint64_t off = e->ws.cpu_sum, bytes = (uint64_t)(T * H) * 4;
    if ((st = ferry__cross_up(e, &off, &bytes, 1))) return st;
    if (!none_here && (st = gather_pairs(e, l, "gather_device_pairs", e->dev_rows, 0))) return st;
    expert_rows = e->ws.expert_final;
  }
  struct ferry_kernel ck = kernel(FERRY_K_MOE_COMBINE, "moe_combine", l);
  ck.y = ferry__ws(e, e->ws.x);
  if (!none_here) ck.aux[0] = ferry__ws(e, expert_rows);
  /* Llama 4 weighted each expert's input already */
  if (!mc->expert_scale_input && !none_here) ck.aux[1] = ferry__ws(e, e->ws.topk_w);
  if (mc->n_shared_experts) ck.aux[2] = ferry__ws(e, e->ws.sout);
  if (mc->shared_expert_gate) ck.aux[3] = ferry__ws(e, e->ws.sgate);
  ck.m = T;
  ck.n = H;
  ck.top_k = none_here ? 0 : K;
  TRY(ferry_exec_compute(e->ex, e->cq, &ck));
  if (n_cpu_pairs) {
    struct ferry_kernel add = kernel(FERRY_K_MOE_COMBINE, "add_cpu_sum", l);
    add.y = ferry__ws(e, e->ws.x);
    add.aux[0] = ferry__ws(e, e->ws.cpu_sum);
    add.m = T;
    add.n = H;
    add.top_k = 1;
    TRY(ferry_exec_compute(e->ex, e->cq, &add));
  }
  return FERRY_OK;
}

/* The MoE layer's ops up to its routing: router logits and top-k, gate lookahead, the shared
 * expert (part of the layer's op graph). */
static ferry_status moe_router(struct ferry_engine *e, int32_t l, uint64_t in) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t T = e->n_tok, H = mc->hidden, K = mc->experts_per_token, E = mc->n_experts;
  ferry_status st;
  if ((st = matmul(e, "router", l, in, e->ws.logits_r, T, E, H, FERRY_ROLE_ROUTER, W(e, FERRY_ROLE_ROUTER_BIAS, l), 0)))
    return st;
  struct ferry_kernel rk = kernel(FERRY_K_ROUTER, "router_topk", l);
  rk.x = ferry__ws(e, e->ws.logits_r);
  rk.y = ferry__ws(e, e->ws.topk_w);
  rk.aux[0] = ferry__ws(e, e->ws.topk_ids);
  rk.aux[0].dtype = FERRY_DTYPE_I32;
  rk.aux[1] = W(e, FERRY_ROLE_ROUTER_SCORE_BIAS, l);
  rk.m = T;
  rk.n = E;
  rk.top_k = K;
  rk.renormalize = mc->norm_topk_prob;
  rk.router_kind = (int32_t)mc->router;
  rk.n_group = mc->n_group;
  rk.topk_group = mc->topk_group;
  rk.routed_scale = (float)mc->routed_scaling;
  rk.jitter = (float)mc->router_jitter;
  TRY(ferry_exec_compute(e->ex, e->cq, &rk));
  if ((st = router_lookahead(e, l))) return st;
  /* Shared expert on every token; its sigmoid gate (Qwen2-MoE) scales it in the combine (expert
   * parallel: the first device's) */
  if (mc->n_shared_experts && resid_acc(e)) {
    const int64_t S = mc->shared_intermediate;
    if ((st = matmul(e, "shared.gate", l, in, e->ws.sg, T, S, H, FERRY_ROLE_SHARED_GATE, NOREF, 0)) ||
        (st = matmul(e, "shared.up", l, in, e->ws.su, T, S, H, FERRY_ROLE_SHARED_UP, NOREF, 0)))
      return st;
    struct ferry_kernel k = kernel(FERRY_K_SWIGLU, "swiglu", l);
    k.x = k.y = ferry__ws(e, e->ws.sg);
    k.aux[0] = ferry__ws(e, e->ws.su);
    k.m = T;
    k.n = S;
    k.fn = FERRY_FN_SILU_MUL;
    TRY(ferry_exec_compute(e->ex, e->cq, &k));
    if ((st = matmul(e, "shared.down", l, e->ws.sg, e->ws.sout, T, H, S, FERRY_ROLE_SHARED_DOWN, NOREF, 0)))
      return st;
    if (mc->shared_expert_gate &&
        (st = matmul(e, "shared.gate_logit", l, in, e->ws.sgate, T, 1, H, FERRY_ROLE_SHARED_EXPERT_GATE, NOREF, 0)))
      return st;
  }
  return FERRY_OK;
}

/* The MoE layer from its routing on: read it back, each expert (from the cache, fetched on a
 * miss, or on the CPU), the predictor's prefetches, and the combine. */
static ferry_status moe_experts(struct ferry_engine *e, int32_t l, uint64_t in) {
  ferry_status st;
  ferry__dev_use(e, 0); /* expert parallel: every device routed alike; the first's is read back */
  if ((st = routing(e, l))) return st;
  int64_t n_cpu_pairs = 0;
  group_by_expert(e);
  /* a prefill step's experts' graphs (the common state: a streamed slot): first where they are
   * kept, then the graphs; a decode step's stay in cache anyway */
  const int64_t E = e->mc->n_experts;
  for (int graph = 0; graph < 2 && e->n_tok > e->cfg.max_batch && memo_device_only(e, l); graph++)
    for (int32_t x = 0; x < E; x++)
      if (e->expert_count[x])
        ferry__memo_prefetch(e, MEMO_EXPERT, (int64_t)l * E + x, (int64_t)e->expert_count[x] * 2 + 1, graph);
  if ((st = dispatch_experts(e, l, in, &n_cpu_pairs))) return st;
  return e->ep ? ferry__mgpu_ep_combine(e, l) : combine_experts(e, l, n_cpu_pairs);
}

/* The head of micro-batch cur_mb and the read-back of its logits rows; the host waits for them
 * after the last micro-batch's (`last`). */
static ferry_status logits(struct ferry_engine *e, int last) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t S = e->n_rows, H = mc->hidden, V = mc->vocab;
  ferry_status xs = x_to(e, 0); /* the head is on the device */
  if (xs != FERRY_OK) return xs;
  /* the previous micro-batch's logits must have left the workspace they share */
  if (e->cur_mb > 0) TRY(ferry_exec_queue_wait(e->ex, e->q_compute, e->ev_step));
  struct ferry_kernel g = kernel(FERRY_K_GATHER_ROWS, "gather_rows", -1);
  g.x = ferry__ws(e, e->ws.x);
  g.y = ferry__ws(e, e->ws.rows);
  g.m = S;
  g.n = H;
  g.ints = e->row_of_seq;
  g.n_ints = S;
  TRY(ferry_exec_compute(e->ex, e->cq, &g));
  ferry_status st = norm(e, "final_norm", -1, e->ws.rows, e->ws.rows_n, S, H, W(e, FERRY_ROLE_FINAL_NORM, -1),
                         W(e, FERRY_ROLE_FINAL_NORM_BIAS, -1));
  if (st) return st;
  /* a tied head reads the token table (its own copy of it when the head streams) */
  enum ferry_tensor_role head =
      mc->tied_embeddings && e->tied_head_src < 0 ? FERRY_ROLE_EMBED : FERRY_ROLE_LM_HEAD;
  if ((st = matmul(e, "lm_head", -1, e->ws.rows_n, e->ws.logits, S, V, H, head, W(e, FERRY_ROLE_LM_HEAD_BIAS, -1), 0)))
    return st;
  if (mc->final_softcap > 0) {
    struct ferry_kernel k = kernel(FERRY_K_SWIGLU, "logit_softcap", -1);
    k.x = k.y = ferry__ws(e, e->ws.logits);
    k.m = S;
    k.n = V;
    k.fn = FERRY_FN_SOFTCAP;
    k.softcap = (float)mc->final_softcap;
    TRY(ferry_exec_compute(e->ex, e->cq, &k));
  }
  TRY(ferry_exec_record(e->ex, e->q_compute, e->ev_router));
  TRY(ferry_exec_queue_wait(e->ex, e->q_d2h, e->ev_router));
  /* each micro-batch's rows after the previous ones' */
  const uint64_t off = ferry__readback_logits_offset(e) + (uint64_t)e->cur_mb * (uint64_t)e->cfg.max_batch * (uint64_t)V * 4;
  TRY(ferry_exec_copy(e->ex, e->q_d2h, (struct ferry_ref){e->readback_buf, off, FERRY_DTYPE_F32}, ferry__ws(e, e->ws.logits),
                      (uint64_t)(S * V) * 4));
  e->step_bytes_d2h += (uint64_t)(S * V) * 4;
  TRY(ferry_exec_record(e->ex, e->q_d2h, e->ev_step));
  if (last) TRY(ferry_exec_sync(e->ex, e->ev_step));
  return FERRY_OK;
}

/* One layer of the step: its block's arrival (and the prefetch of the blocks after it),
 * attention, the FFN or MoE, and the release of the block's slot after its last layer. */
/* Put the hidden state (and GPT-NeoX's second norm of it) on the side the next ops run on,
 * and issue them there. */
static ferry_status x_to(struct ferry_engine *e, int cpu) {
  if (!ferry__hybrid_on(e)) return FERRY_OK;
  struct microbatch *mb = &e->mbs[e->cur_mb];
  if (cpu != mb->on_host) {
    const uint64_t row = (uint64_t)e->n_tok * (uint64_t)e->mc->hidden * 4;
    const uint64_t off[2] = {e->ws.x, e->ws.h2}, bytes[2] = {row, e->mc->parallel_residual ? row : 0};
    ferry_status st = cpu ? ferry__cross_down(e, off, bytes, 2) : ferry__cross_up(e, off, bytes, 2);
    if (st != FERRY_OK) return st;
    mb->on_host = cpu;
  }
  if (cpu) ferry__side_cpu(e);
  else ferry__side_device(e);
  return FERRY_OK;
}

/* Layer l's FFN up to the routing (a dense layer's whole FFN), its norm first. */
static ferry_status ffn_part(struct ferry_engine *e, int32_t l, uint64_t in) {
  const struct ferry_model_config *mc = e->mc;
  ferry_status st;
  if (!mc->parallel_residual &&
      (st = norm(e, "ffn_norm", l, e->ws.x, e->ws.h, e->n_tok, mc->hidden, W(e, FERRY_ROLE_FFN_NORM, l),
                 W(e, FERRY_ROLE_FFN_NORM_BIAS, l))))
    return st;
  return e->li[l].moe ? moe_router(e, l, in) : dense_ffn(e, l, in);
}

/* Tensor parallel: attention on every device (its heads), the all-reduce of x, the FFN on
 * every device (its columns), the all-reduce of x. */
static ferry_status tp_layer_ops(struct ferry_engine *e, int32_t l, uint64_t in) {
  const int64_t n = (int64_t)e->n_tok * e->mc->hidden;
  ferry_status st;
  for (int32_t d = 0; d < e->n_dev; d++) {
    ferry__dev_use(e, d);
    if ((st = attention_part(e, l))) return st;
  }
  if ((st = ferry__mgpu_allreduce(e, e->ws.x, n))) return st;
  for (int32_t d = 0; d < e->n_dev; d++) {
    ferry__dev_use(e, d);
    if ((st = ffn_part(e, l, in))) return st;
  }
  /* an MoE layer (expert parallel) joins its devices after the combine (ferry__mgpu_ep_combine) */
  return e->li[l].moe ? FERRY_OK : ferry__mgpu_allreduce(e, e->ws.x, n);
}

/* Layer l's attention and its FFN up to the routing (a dense layer's whole FFN). */
static ferry_status layer_ops(struct ferry_engine *e, int32_t l, uint64_t in) {
  if (e->tp > 1) return tp_layer_ops(e, l, in);
  ferry_status st = attention_part(e, l);
  return st != FERRY_OK ? st : ffn_part(e, l, in);
}

/* Layer l of micro-batch cur_mb, where it runs: attention, then the FFN or the experts. On the
 * device, attention and the FFN up to the routing are the same ops whenever the micro-batch has
 * as many tokens: one op graph per (layer, tokens, micro-batch; its kernels read that
 * micro-batch's token arrays), its attention timed with this step's context. */
static ferry_status layer_body(struct ferry_engine *e, int32_t l) {
  const struct ferry_model_config *mc = e->mc;
  ferry_status st;
  if ((st = x_to(e, e->layer_on_cpu))) return st;
  const uint64_t in = mc->parallel_residual ? e->ws.h2 : e->ws.h;
  if (memo_device_only(e, l)) {
    struct memo_site site;
    int replayed;
    if ((st = ferry__memo_begin(e, &site, MEMO_LAYER, l, (int64_t)e->n_tok * e->n_mb + e->cur_mb, NULL, 0,
                                context_tokens(e, l), &replayed)) != FERRY_OK)
      return st;
    if (!replayed && (st = ferry__memo_end(e, &site, layer_ops(e, l, in))) != FERRY_OK) return st;
  } else if ((st = layer_ops(e, l, in)) != FERRY_OK) {
    return st;
  }
  return e->li[l].moe ? moe_experts(e, l, in) : FERRY_OK;
}

/* Streamed block b's turn in the fetch order: the next prefetch_depth blocks go in flight now
 * (at most the slots less b's; each lands in a slot whose last use has been enqueued already,
 * that of the block n_slots - depth before b), and compute waits for b's copy. Returns its
 * slot, which stream_release() frees after b's last use. */
static ferry_status stream_acquire(struct ferry_engine *e, int32_t b, struct slot **out) {
  const int64_t seq = e->block_compute_seq;
  struct slot *sl = &e->block_slots[ferry__engine_block_slot(e, seq)];
  ferry_status st = ferry__engine_prefetch_blocks(e, seq + e->plan.prefetch_depth);
  if (st) return st;
  if (sl->unit != e->block_unit[b]) return ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "block %d is not in its slot", b);
  TRY(ferry_exec_queue_wait(e->ex, e->q_compute, sl->ready));
  *out = sl;
  return FERRY_OK;
}

static ferry_status stream_release(struct ferry_engine *e, struct slot *sl) {
  TRY(ferry_exec_record(e->ex, e->q_compute, sl->free));
  sl->used = 1;
  e->block_compute_seq++;
  return FERRY_OK;
}

/* One layer of the step: its block's arrival (and the prefetch of the blocks after it), the
 * layer for every micro-batch while the block is there (FlexGen's zig-zag: a column of the
 * layers x batches grid at a time), and the release of the block's slot after its last layer. */
static ferry_status forward_layer(struct ferry_engine *e, int32_t l) {
  const struct ferry_plan *p = &e->plan;
  ferry_status st;
  int32_t b = p->layer_block[l];
  struct slot *sl = NULL;
  /* a streamed layer of a step that computes them on the CPU: nothing is fetched, the block's
   * place in the fetch order passes */
  e->layer_on_cpu = b >= 0 && e->step_layers_cpu;
  if (e->layer_on_cpu) {
    if (l == p->blocks[b].first_layer + p->blocks[b].n_layers - 1) {
      e->block_compute_seq++;
      if (e->block_fetch_seq < e->block_compute_seq) e->block_fetch_seq = e->block_compute_seq;
    }
    b = -1;
  }
  if (b >= 0) {
    sl = &e->block_slots[ferry__engine_block_slot(e, e->block_compute_seq)];
    if (l == p->blocks[b].first_layer && (st = stream_acquire(e, b, &sl))) return st;
  }
  for (int32_t m = 0; m < e->n_mb; m++) {
    if (!e->mbs[m].n_tok) continue;
    ferry__mb_use(e, m);
    if ((st = layer_body(e, l))) return st;
  }
  if (b >= 0 && l == p->blocks[b].first_layer + p->blocks[b].n_layers - 1 && (st = stream_release(e, sl))) return st;
  e->layer_on_cpu = 0;
  return FERRY_OK;
}

/* Pipeline parallel: stage by stage, each micro-batch through the stage's layers and handed to
 * the next stage, so stage s works on micro-batch m + 1 while stage s + 1 works on m (every
 * weight is resident: no block to wait for). */
static ferry_status pipeline_layers(struct ferry_engine *e) {
  const int32_t L = (int32_t)e->mc->n_layers;
  ferry_status st;
  for (int32_t first = 0; first < L;) {
    const int32_t d = ferry__mgpu_layer_dev(e, first);
    int32_t end = first;
    while (end < L && ferry__mgpu_layer_dev(e, end) == d) end++;
    for (int32_t m = 0; m < e->n_mb; m++) {
      if (!e->mbs[m].n_tok) continue;
      ferry__mb_use(e, m);
      ferry__dev_use(e, d);
      if (first && (st = ferry__mgpu_receive(e))) return st;
      for (int32_t l = first; l < end; l++) {
        struct ferry_exec_range range = ferry_exec_range_begin(e->ex, "layer", (int32_t)e->n_steps, l, -1);
        st = layer_body(e, l);
        ferry_exec_range_end(e->ex, &range);
        if (st) return st;
      }
      if (end < L && (st = ferry__mgpu_send(e, d, ferry__mgpu_layer_dev(e, end)))) return st;
    }
    first = end;
  }
  return FERRY_OK;
}

/* Each token's sequence length after this step: length-dependent RoPE (dynamic NTK,
 * LongRoPE) rotates a step's tokens with the frequencies of that length, as transformers does
 * for the sequence it is given. */
static void step_seqlens(struct ferry_engine *e) {
  for (int64_t t = 0; t < e->n_tok; t++) e->tok_req[t] = e->reqs[e->seqs[e->tok_seq[t]].req].id;
  for (int64_t t = 0; t < e->n_tok; t++) e->seq_maxpos[e->tok_seq[t]] = -1;
  for (int64_t t = 0; t < e->n_tok; t++)
    if (e->tok_pos[t] > e->seq_maxpos[e->tok_seq[t]]) e->seq_maxpos[e->tok_seq[t]] = e->tok_pos[t];
  for (int64_t t = 0; t < e->n_tok; t++) e->tok_seqlen[t] = e->seq_maxpos[e->tok_seq[t]] + 1;
  e->ctx_valid = 0;
}

/* The embedding of micro-batch cur_mb's tokens into its hidden state. */
static ferry_status embed(struct ferry_engine *e) {
  const struct ferry_model_config *mc = e->mc;
  ferry_status st;
  step_seqlens(e);
  struct ferry_kernel k = kernel(FERRY_K_EMBED, "embed", -1);
  if ((st = weight(e, FERRY_ROLE_EMBED, -1, -1, 0, 0, &k.w))) return st;
  k.y = ferry__ws(e, e->ws.x);
  k.m = e->n_tok;
  k.n = mc->hidden;
  k.ints = e->tok_ids;
  k.ints2 = e->tok_pos;
  k.n_ints = e->n_tok;
  if (mc->learned_positions) {
    /* a quantized position table is expanded like any weight: kernels read fp32, fp16 or bf16 */
    if ((st = weight(e, FERRY_ROLE_POS_EMBED, -1, -1, 1, 0, &k.aux[0]))) return st;
    k.pos_offset = 2;
  }
  /* Gemma: embeddings times sqrt(hidden), rounded to the activation dtype (fp32 here) */
  if (mc->scale_embeddings) k.scale = sqrtf((float)mc->hidden);
  TRY(ferry_exec_compute(e->ex, e->cq, &k));
  if (mc->embed_norm &&
      (st = norm(e, "embed_norm", -1, e->ws.x, e->ws.x, e->n_tok, mc->hidden, W(e, FERRY_ROLE_EMBED_NORM, -1),
                 W(e, FERRY_ROLE_EMBED_NORM_BIAS, -1))))
    return st;
  return ferry__features_after_embed(e);
}

ferry_status ferry__engine_step(struct ferry_engine *e) {
  const struct ferry_model_config *mc = e->mc;
  ferry_status st;
  ferry__memo_step(e);
  int32_t tokens = 0;
  for (int32_t m = 0; m < e->n_mb; m++) tokens += e->mbs[m].n_tok;
  e->step_layers_cpu = ferry__layers_on_cpu(e, tokens);
  /* the embedding on the first device (tensor parallel: on each, the hidden state replicated);
   * streamed embeddings hold a block slot while every micro-batch is embedded, as the head does
   * for the logits */
  struct slot *gsl = NULL;
  if (e->plan.embed_block >= 0 && (st = stream_acquire(e, e->plan.embed_block, &gsl))) return st;
  for (int32_t m = 0; m < e->n_mb; m++) {
    if (!e->mbs[m].n_tok) continue;
    ferry__mb_use(e, m);
    ferry__kv_prefill_split(e, m);
    for (int32_t d = 0; d < (e->tp > 1 ? e->n_dev : 1); d++) {
      ferry__dev_use(e, d);
      if ((st = embed(e))) return st;
    }
  }
  ferry__kv_disk_split(e); /* the staging slots, and the reads of the step's first attentions */
  if ((st = ferry__kv_disk_begin(e))) return st;
  if (gsl && (st = stream_release(e, gsl))) return st;
  if (ferry__mgpu_on(e) && e->tp < 2) {
    if ((st = pipeline_layers(e))) return st;
  }
  for (int32_t l = 0; l < mc->n_layers && !(ferry__mgpu_on(e) && e->tp < 2); l++) {
    /* a range of the host issuing the layer (waits for routing included) */
    struct ferry_exec_range range = ferry_exec_range_begin(e->ex, "layer", (int32_t)e->n_steps, l, -1);
    st = forward_layer(e, l);
    ferry_exec_range_end(e->ex, &range);
    if (st) return st;
  }
  int32_t last = -1;
  for (int32_t m = 0; m < e->n_mb; m++)
    if (e->mbs[m].n_tok) last = m;
  ferry__dev_use(e, ferry__mgpu_layer_dev(e, (int32_t)mc->n_layers)); /* the head's device */
  if (e->plan.head_block >= 0 && (st = stream_acquire(e, e->plan.head_block, &gsl))) return st;
  for (int32_t m = 0; m <= last; m++) {
    if (!e->mbs[m].n_tok) continue;
    ferry__mb_use(e, m);
    if ((st = logits(e, m == last))) return st;
  }
  if (e->plan.head_block >= 0 && (st = stream_release(e, gsl))) return st;
  ferry__dev_use(e, 0); /* the step's measures read device 0's queues (serve.c) */
  return FERRY_OK;
}
