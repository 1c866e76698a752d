/* Engine set-up and tear-down: configuration defaults, the residency plan, the unit table,
 * every device and host buffer (sized once: the decode loop allocates nothing), the events
 * that order slot reuse, and loading of resident weights. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/units.h"
#include "engine_impl.h"
#include "ferry/predict.h"

#define WS_ALIGN 64u

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static void apply_defaults(struct ferry_engine_config *c, const struct ferry_model_config *mc) {
  if (c->pressure.high_water <= 0) c->pressure.high_water = 0.85;
  if (c->pressure.low_water <= 0) c->pressure.low_water = 0.70;
  if (c->pressure.psi_some_pct <= 0) c->pressure.psi_some_pct = 10.0;
  if (c->max_batch <= 0) c->max_batch = 8;
  if (c->max_step_tokens <= 0) c->max_step_tokens = 256;
  if (c->max_step_tokens < c->max_batch) c->max_step_tokens = c->max_batch;
  if (c->max_seq_tokens <= 0) c->max_seq_tokens = mc->max_position < 2048 ? (int32_t)mc->max_position : 2048;
  if (c->gpu_batches <= 0) c->gpu_batches = 1;
}

/* Micro-batches of a step and the sequences they hold together (the KV cache's slots). */
static void mb_counts(struct ferry_engine *e) {
  e->n_mb = e->cfg.gpu_batches > 0 ? e->cfg.gpu_batches : 1;
  e->n_seqs = e->n_mb * e->cfg.max_batch;
}

/* Per-layer tables the forward pass and the plan read: layer kinds, RoPE, which layers route. */
static ferry_status layer_tables(struct ferry_engine *e) {
  const struct ferry_model_config *mc = e->mc;
  const size_t L = (size_t)mc->n_layers;
  e->li = ferry__calloc(L, sizeof *e->li);
  e->rope = ferry__calloc(L, sizeof *e->rope);
  e->kv = ferry__calloc(L, sizeof *e->kv);
  if (!e->li || !e->rope || !e->kv) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  e->first_moe_layer = -1;
  e->n_moe_layers = 0;
  for (int64_t l = 0; l < mc->n_layers; l++) {
    ferry_model_layer_info(e->model, l, &e->li[l]);
    if (e->li[l].rope) ferry_model_layer_rope(e->model, l, &e->rope[l]);
    if (e->li[l].moe) {
      if (e->first_moe_layer < 0) e->first_moe_layer = (int32_t)l;
      e->n_moe_layers++;
    }
  }
  e->attn_scale = (float)ferry_model_attn_scale(e->model);
  return FERRY_OK;
}

/* Whether routed experts may run on the CPU (and need the CPU's rows in the workspace). */
static int c_cpu_experts(const struct ferry_engine *e) {
  return e->cfg.compute_experts != FERRY_COMPUTE_GPU;
}

/* The policy placing experts in the cache (--expert-cache): its registry name, auto by default
 * (lfu for the legacy flag, lru inside a per-layer split when none is named). */
static const char *cache_policy_name(const struct ferry_engine_config *c) {
  return c->expert_cache ? c->expert_cache : c->expert_cache_lfu ? "lfu" : c->expert_cache_per_layer ? "lru" : "auto";
}

/* A routed expert runs on the device only from device memory: pinned with every expert (no
 * budget, --resident all), in its layer's block (--expert-granularity layer), or in the expert
 * cache, which experts=cpu fills only by a predictor's prefetches (a demand miss is computed on
 * the CPU: dispatch_experts()) or a policy's preload (static, from a trace's popularity), or a
 * per-layer split sized by the user. Without any of them the cache stays empty. A predictor
 * still to be installed (predict_planned) counts: a plan made before it must be the run's. */
int ferry__experts_cpu_only_config(const struct ferry_engine_config *c, const struct ferry_model_config *mc,
                                   int resident_all, uint64_t device_budget_bytes) {
  if (!mc->n_experts || c->compute_experts != FERRY_COMPUTE_CPU) return 0;
  if (resident_all || !device_budget_bytes || c->expert_granularity_layer || c->predict || c->predict_planned ||
      c->expert_cache_per_layer)
    return 0;
  const struct ferry_cache_policy_ops *policy = NULL;
  return !(c->expert_popularity && ferry_cache_policy_lookup(cache_policy_name(c), &policy) == FERRY_OK &&
           policy->preload);
}

int ferry__experts_cpu_only(const struct ferry_engine *e, const struct ferry_plan_config *pc) {
  return !e->ep && ferry__experts_cpu_only_config(&e->cfg, e->mc, pc->resident_all, pc->device_budget_bytes);
}

struct ferry_exec_elem_bytes ferry__engine_elem_bytes(const struct ferry_engine *e) {
  struct ferry_exec_elem_bytes eb = {4, 4};
  if (e->ex)
    ferry_exec_elem_bytes(e->ex, &eb);
  else if (e->cfg.plan_elem_bytes.activation)
    eb = e->cfg.plan_elem_bytes;
  return eb;
}

/* Lay out the activation buffers for max_step_tokens tokens and max_batch logits rows.
 * One layout on every executor: its offsets are fp32 rows, which the kernels address and the
 * kernel contract checks, so the engine issues the same ops everywhere. What the device tier is
 * charged for it (ws.charged) is the device's part of that layout at the executor's element sizes
 * (ferry_exec_elem_bytes()): on host and cuda the same bytes; in the simulator what the runtime it
 * simulates holds, fp16 activations and no dequantized copy under fused kernels, so the planner's
 * working set and the peak it measures are the runtime's. Integer ids, router weights and the
 * logits rows (sampled in fp32) stay 4 bytes. */
static void layout_workspace(struct ferry_engine *e) {
  const struct ferry_model_config *mc = e->mc;
  const uint64_t T = (uint64_t)e->cfg.max_step_tokens, S = (uint64_t)e->cfg.max_batch;
  const uint64_t H = (uint64_t)mc->hidden, qd = (uint64_t)(mc->n_heads * mc->head_dim),
                 kvd = (uint64_t)(mc->n_kv_heads * mc->head_dim);
  const uint64_t K = (uint64_t)mc->experts_per_token, E = (uint64_t)mc->n_experts;
  const uint64_t latent = (uint64_t)(mc->kv_lora_rank + mc->qk_rope_dim);
  const uint64_t attn = mc->kv_lora_rank && (uint64_t)(mc->n_heads * mc->v_head_dim) > qd
                            ? (uint64_t)(mc->n_heads * mc->v_head_dim)
                            : qd;
  const int dense_layers = e->n_moe_layers < mc->n_layers;
  const uint64_t ei = (uint64_t)mc->expert_intermediate * (mc->expert_layout != FERRY_EXPERTS_SPLIT ? 2 : 1);
  const struct ferry_exec_elem_bytes eb = ferry__engine_elem_bytes(e);
  /* Three classes, laid out in this order: the buffers only the CPU's ops address, those both
   * sides address, those only the device's do. The CPU's copy of the workspace in host memory is
   * the first two (ws.cpu_extent), the device's the last two (from ws.device_base), each at the
   * layout's offsets: the crossings copy between equal offsets and the ops are the same on
   * either side. Layers computed on the CPU address everything; attention over a host cache
   * (forward.c attend(), mla_part()) q, k, v and the output (MLA: and kv_b_proj's dequantized
   * slot); experts on the CPU (cpu_experts(), expert_ops(), gather_pairs()) their input, the
   * routing weights, the dequantized slots, the expert scratch and the rows and sums of the pairs.
   * The device addresses all but the experts' own buffers when no routed expert runs there
   * (experts_cpu_only: it adds the CPU's sum, combine_ops()). */
  const int hybrid = ferry__hybrid_on(e), all = hybrid && e->cfg.compute_layers != FERRY_COMPUTE_GPU;
  const int c_attn = all || (hybrid && (e->cfg.kv_home_host || e->cfg.kv_home_layer)), c_mla = c_attn && mc->kv_lora_rank;
  const int cpu_experts = E && c_cpu_experts(e), pair_rows = cpu_experts || e->ep; /* expert parallel gathers too */
  const int c_exp = all || (hybrid && cpu_experts);
  /* the zero row is written in the host copy and copied down (ferry__hybrid_load) */
  const int c_zero = all || (hybrid && pair_rows);
  const int d_exp = !(hybrid && e->experts_cpu_only); /* the device runs routed experts */
  uint64_t off = 0, charged = 0;
  e->ws.device_base = 0;
  for (int pass = 2; pass >= 0; pass--) { /* 2: the CPU's only, 1: both sides', 0: the device's only */
#define WS_AT(field, elems, elem_bytes, cpu, dev)                                         \
  do {                                                                                    \
    if ((cpu) ? pass != ((dev) ? 1 : 2) : pass != 0) break;                               \
    e->ws.field = off;                                                                    \
    off = align_up(off + (uint64_t)(elems) * 4, WS_ALIGN);                                \
    if (pass < 2) charged = align_up(charged + (uint64_t)(elems) * (elem_bytes), WS_ALIGN); \
  } while (0)
#define WS(field, elems, cpu) WS_AT(field, elems, eb.activation, cpu, 1)
#define WS_EXP(field, elems, cpu) WS_AT(field, elems, eb.activation, cpu, d_exp)
    /* dequantized weights: one slot for matmuls, three for an expert's gate/up/down */
    WS_AT(dq[0], e->max_q_numel, eb.dequant, all || c_mla || c_exp, 1);
    /* an expert's up, or a learned position table (the embedding, on the device) */
    WS_AT(dq[1], E || mc->learned_positions ? e->max_q_numel : 0, eb.dequant, all || c_exp,
          d_exp || mc->learned_positions);
    WS_AT(dq[2], E ? e->max_q_numel : 0, eb.dequant, all || c_exp, d_exp);
    WS(x, T * H * (uint64_t)e->n_mb, all); /* one hidden state per micro-batch */
    WS(h, T * H, all || (c_exp && !mc->parallel_residual));
    WS(h2, mc->parallel_residual ? T * H : 0, all || (c_exp && mc->parallel_residual));
    WS(q, T * qd, c_attn);
    WS(qa, T * (uint64_t)mc->q_lora_rank, all);
    WS(qkv, mc->fused_qkv ? T * 3 * qd : 0, all);
    WS(k, T * (kvd > latent ? kvd : latent), c_attn);
    WS(v, T * kvd, c_attn);
    WS(attn, T * attn, c_attn);
    uint64_t inter = dense_layers ? (uint64_t)mc->intermediate : 0;
    /* a gated FFN's up projection has a buffer of its own beside the gate's; a plain one (OPT's
     * ReLU, BLOOM's and GPT-NeoX's GELU) applies its activation to fc1's output in place
     * (forward.c dense_ffn()) and has none */
    const int gated = mc->act == FERRY_ACT_SWIGLU || mc->act == FERRY_ACT_GEGLU;
    WS(g, T * inter, all);
    WS(u, gated ? T * inter : 0, all);
    WS(logits_r, T * E, all);
    WS(logits_look, T * E * (uint64_t)ferry__lookahead_layers(e), all);
    WS_AT(topk_w, T * K, 4, all || c_exp, 1);
    WS_AT(topk_ids, T * K, 4, all, 1);
    /* hybrid experts: a zero row right after expert_out, for the gathers of each side's pairs */
    WS_EXP(expert_out, T * K * H + (pair_rows ? H : 0), c_exp || c_zero);
    WS_EXP(expert_final, pair_rows ? T * K * H : 0, c_exp);
    WS(cpu_sum, cpu_experts ? T * H : 0, c_exp);
    WS_EXP(gather, E ? T * H : 0, c_exp);
    WS_EXP(eg, T * ei, c_exp);
    WS_EXP(eu, T * (uint64_t)mc->expert_intermediate, c_exp);
    uint64_t sh = mc->n_shared_experts ? (uint64_t)mc->shared_intermediate : 0;
    WS(sg, T * sh, all);
    WS(su, T * sh, all);
    WS(sout, sh ? T * H : 0, all);
    WS(sgate, mc->shared_expert_gate ? T : 0, all);
    WS(rows, S * H, all);
    WS(rows_n, S * H, all);
    /* the weights the CPU's attention reads, whatever side holds the layer (the plan input
     * sized them: ferry__engine_plan_input()) */
    WS_AT(mirror, (e->mirror_bytes + 3) / 4, 4, 1, 0);
    WS_AT(logits, S * (uint64_t)mc->vocab, 4, all, 1);
#undef WS_EXP
#undef WS
#undef WS_AT
    if (pass == 2) e->ws.device_base = off;
    if (pass == 1) e->ws.cpu_extent = hybrid ? off : 0;
  }
  e->ws.zero = pair_rows ? e->ws.expert_out + T * K * H * 4 : 0;
  e->ws.total = off;
  e->ws.charged = charged;
  e->ws.act_bytes = eb.activation;
  /* each micro-batch's hidden state (a plan after a reload may move the workspace's buffers) */
  for (int32_t m = 0; e->mbs && m < e->n_mb; m++) e->mbs[m].x = e->ws.x + (uint64_t)m * T * H * 4;
}

/* Whether each layer's KV cache follows its weights: in host memory while the layer streams, on
 * the device while it is pinned. So in a run that computes streamed layers on the CPU, or that
 * keeps each layer's cache with its weights (--kv-home layer); the plan places the caches
 * (ferry_plan_input::layer_kv_bytes) as it places the layers. */
static int kv_follows_layers(const struct ferry_engine *e) {
  return !e->cfg.kv_home_host && (e->cfg.compute_layers != FERRY_COMPUTE_GPU || e->cfg.kv_home_layer);
}

/* Whether layer l's KV cache lives in host memory: every layer's with --kv-home host, a streamed
 * layer's when caches follow their layers (known once the plan says which layers stream). */
static int kv_on_host(const struct ferry_engine *e, int64_t l, int planned) {
  if (e->cfg.kv_home_host) return 1;
  return planned && kv_follows_layers(e) && e->plan.layer_block[l] >= 0;
}

uint64_t ferry__kv_row_bytes(const struct ferry_engine *e) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t kv_heads = mc->n_kv_heads / (e->tp > 1 ? e->tp : 1); /* tensor parallel: this device's */
  return ferry_kv_format_row_bytes(e->kv_format, mc->kv_lora_rank ? (uint64_t)(mc->kv_lora_rank + mc->qk_rope_dim)
                                                                  : (uint64_t)(kv_heads * mc->head_dim));
}

int ferry__kv_regions(const struct ferry_engine *e) { return e->mc->kv_lora_rank ? 1 : 2; }

/* The KV cache, layer by layer: K and V rows (MLA: the latent rows) for max_batch sequences of
 * max_seq_tokens; a windowed or chunked layer keeps a ring of what one step's queries can see.
 * Layers whose cache is in host memory are laid out in the host's buffer (hkv_bytes); returns
 * the device's bytes. */
static uint64_t layout_kv(struct ferry_engine *e, int planned) {
  const struct ferry_model_config *mc = e->mc;
  const uint64_t B = (uint64_t)e->n_seqs;
  const uint64_t row = ferry__kv_row_bytes(e);
  uint64_t off[2] = {0, 0}, most = 0, earlier = 0; /* earlier: the devices before this one */
  int32_t stage = 0;
  for (int64_t l = 0; l < mc->n_layers; l++) {
    struct kv_layer *kv = &e->kv[l];
    if (ferry__mgpu_layer_dev(e, (int32_t)l) != stage) { /* pipeline: each device's layers from 0 */
      stage = ferry__mgpu_layer_dev(e, (int32_t)l);
      most = off[0] > most ? off[0] : most;
      earlier += off[0];
      off[0] = 0;
    }
    const int64_t vis = e->li[l].kv_visible, need = vis + e->cfg.max_step_tokens;
    kv->ring = vis > 0 && need < e->kv_capacity;
    kv->rows = kv->ring ? (int32_t)need : e->kv_capacity;
    kv->host = kv_on_host(e, l, planned);
    /* a paged layer's region is the pool's blocks, shared by the sequences */
    const uint64_t region = e->kv_block && !kv->ring ? (uint64_t)e->kv_pool_blocks * (uint64_t)e->kv_block * row
                                                     : B * (uint64_t)kv->rows * row;
    uint64_t *o = &off[kv->host];
    kv->bytes = (uint64_t)ferry__kv_regions(e) * region;
    kv->k_off = *o;
    kv->v_off = *o + region;
    *o += kv->bytes;
  }
  off[0] = ferry__kv_prefill_layout(e, off[0]); /* one device: no pipeline stages in a hybrid run */
  most = off[0] > most ? off[0] : most;
  e->kv_total_bytes = earlier + off[0] + off[1];
  e->hkv_bytes = off[1];
  e->kv_dev_bytes = most;
  return most;
}

static uint64_t readback_bytes(const struct ferry_engine *e) {
  return ferry__readback_features_offset(e) + ferry__features_readback_bytes(e);
}

#define BOUNCE_BYTES (8u << 20)

/* What the KV cache was sized from, for messages: a cache sized from one long request is the
 * usual reason an allocation or a budget fails. */
static const char *kv_shape(const struct ferry_engine *e, char *buf, size_t len) {
  /* every layer's row for one token; windowed layers hold a ring, so the total is the layout's */
  const uint64_t per_token = ferry_model_kv_bytes(e->model, 1, e->kv_format);
  char total[32], scratch[256], disk[256];
  snprintf(buf, len,
           "%s %s: %d sequences x %d tokens x %llu bytes per token (%s; --max-batch, --max-seq-tokens, --kv-dtype)%s%s",
           e->mc->kv_lora_rank ? "MLA cache" : "KV cache", ferry__format_bytes(e->kv_total_bytes, total, sizeof total),
           e->n_seqs, e->kv_capacity, (unsigned long long)per_token, ferry_kv_format_name(e->kv_format),
           ferry__kv_prefill_shape(e, scratch, sizeof scratch), ferry__kv_disk_shape(e, disk, sizeof disk));
  return buf;
}

/* Streamed layers that keep their KV cache in host memory (computed on the CPU, or with their
 * weights: --kv-home layer), laid out once the plan says which layers stream. The plan counted
 * each layer's cache where it now is (ferry_plan_input::layer_kv_bytes) and a streamed layer's
 * window scratch on the device (ferry__kv_window_bytes()), so the budgets it checked hold the
 * layout; a difference is a bug. Later plans (memory pressure) keep this layout. */
static ferry_status place_layer_kv(struct ferry_engine *e) {
  const struct ferry_plan *p = &e->plan;
  const uint64_t dev = layout_kv(e, 1);
  if (dev == p->device_kv_bytes && e->hkv_bytes == p->host_kv_bytes) return FERRY_OK;
  char b[4][32];
  return ferry__err_set(&e->err, FERRY_ERR_INTERNAL,
                        "engine: the KV cache laid out by layer (%s on the device, %s in host memory) is not the "
                        "plan's (%s, %s)",
                        ferry__format_bytes(dev, b[0], 32), ferry__format_bytes(e->hkv_bytes, b[1], 32),
                        ferry__format_bytes(p->device_kv_bytes, b[2], 32),
                        ferry__format_bytes(p->host_kv_bytes, b[3], 32));
}

/* How many layers' caches the layout put in host memory (for messages and the plan's lines). */
static int32_t host_kv_layers(const struct ferry_engine *e) {
  int32_t n = 0;
  for (int64_t l = 0; l < e->mc->n_layers; l++) n += e->kv[l].host;
  return n;
}

/* The host budget a refusal names, and what the streamed layers' KV cache takes of it first. */
static const char *host_budget_words(const struct ferry_engine *e, char *buf, size_t len) {
  char b[2][32];
  if (!e->cfg.host_budget_bytes) snprintf(buf, len, "unlimited");
  else if (!kv_follows_layers(e) || !e->hkv_bytes)
    snprintf(buf, len, "%s", ferry__format_bytes(e->cfg.host_budget_bytes, b[0], 32));
  else
    snprintf(buf, len, "%s, of which the KV cache of the %d streamed layers in host memory takes %s",
             ferry__format_bytes(e->cfg.host_budget_bytes, b[0], 32), host_kv_layers(e),
             ferry__format_bytes(e->hkv_bytes, b[1], 32));
  return buf;
}

/* A hybrid run computes on the CPU from host memory: streamed layers computed there keep their
 * KV cache there too (place_layer_kv), and whatever the CPU may compute must have a host copy
 * (the plan homes units on disk when the host budget is short). */
static ferry_status hybrid_plan(struct ferry_engine *e) {
  struct ferry_plan *p = &e->plan;
  char b[32], host[160];
  ferry_status st;
  if (kv_follows_layers(e) && (st = place_layer_kv(e)) != FERRY_OK) return st;
  if (e->cfg.compute_layers != FERRY_COMPUTE_GPU) {
    for (int32_t i = 0; i < p->n_blocks && !e->sizing_only; i++)
      if (p->blocks[i].home != FERRY_TIER_HOST)
        return ferry__err_set(&e->err, FERRY_ERR_BUDGET,
                              "engine: layers computed on the CPU (--offload-compute layers=%s) need their weights in "
                              "host memory, but block of layers %d-%d (%s) is homed on disk (--home disk, or a host "
                              "budget of %s)",
                              e->cfg.compute_layers == FERRY_COMPUTE_CPU ? "cpu" : "auto", p->blocks[i].first_layer,
                              p->blocks[i].first_layer + p->blocks[i].n_layers - 1,
                              ferry__format_bytes(p->blocks[i].bytes, b, 32), host_budget_words(e, host, sizeof host));
  }
  const int64_t n_units = (int64_t)e->n_moe_layers * e->mc->n_experts;
  if (e->mc->n_experts && !p->experts_pinned && !e->cfg.expert_granularity_layer && p->experts_on_host < n_units &&
      !e->sizing_only &&
      (e->cfg.compute_experts != FERRY_COMPUTE_GPU || e->cfg.compute_layers != FERRY_COMPUTE_GPU))
    return ferry__err_set(&e->err, FERRY_ERR_BUDGET,
                          "engine: experts computed on the CPU (--offload-compute) need their weights in host memory, "
                          "but %lld of %lld are homed on disk (--home disk, or a host budget of %s)",
                          (long long)(n_units - p->experts_on_host), (long long)n_units,
                          host_budget_words(e, host, sizeof host));
  return FERRY_OK;
}

/* Bytes of one block of the paged KV cache over the paged layers (MLA: the latent rows only). */
uint64_t ferry__kv_pages_block_bytes(const struct ferry_engine *e) {
  const struct ferry_model_config *mc = e->mc;
  const uint64_t row = ferry__kv_row_bytes(e);
  uint64_t b = 0;
  for (int64_t l = 0; l < mc->n_layers; l++) {
    const int64_t vis = e->li[l].kv_visible, need = vis + e->cfg.max_step_tokens;
    if (vis > 0 && need < e->kv_capacity) continue; /* a ring: its own rows */
    b += (uint64_t)e->kv_block * row * (uint64_t)ferry__kv_regions(e);
  }
  return b;
}

/* The paged pool's blocks: --kv-pool's, or (full) the max_batch x max_seq_tokens reservation's
 * worth, or at least one sequence of max_seq_tokens. */
static int32_t pool_blocks(const struct ferry_engine *e, int full) {
  const uint64_t bb = ferry__kv_pages_block_bytes(e);
  if (e->cfg.kv_pool_bytes && bb) {
    const uint64_t n = e->cfg.kv_pool_bytes / bb;
    return (int32_t)(n > INT32_MAX ? INT32_MAX : n > 0 ? n : 1);
  }
  const int64_t seqs = full ? e->n_seqs : 1, n = seqs * ferry__kv_pages_need(e, e->kv_capacity);
  return (int32_t)(n < INT32_MAX ? n : INT32_MAX);
}

/* With every weight resident the pool also takes what the plan leaves of the budget (vLLM's
 * gpu_memory_utilization); an explicit --kv-pool is kept as given. */
static void grow_pool(struct ferry_engine *e) {
  struct ferry_plan *p = &e->plan;
  const uint64_t budget = e->cfg.device_budget_bytes, bb = ferry__kv_pages_block_bytes(e);
  if (!e->kv_block || e->cfg.kv_pool_bytes || !budget || !bb || p->device_total_bytes >= budget) return;
  if (!(e->cfg.resident_all || (p->n_blocks == 0 && (!e->mc->n_experts || p->experts_pinned)))) return;
  const uint64_t more = (budget - p->device_total_bytes) / bb;
  if (!more) return;
  e->kv_pool_blocks += (int32_t)(more > (uint64_t)(INT32_MAX - e->kv_pool_blocks) ? (uint64_t)(INT32_MAX - e->kv_pool_blocks) : more);
  const uint64_t before = p->device_kv_bytes, dev = layout_kv(e, 1);
  p->device_kv_bytes = dev;
  p->device_total_bytes += dev - before;
}

/* Swap preemption's host copy: a slot per pool block, as many as the host budget leaves after the
 * plan (weights in host memory come first; a sequence that finds too few slots is recomputed).
 * Windowed layers keep per-slot rings a block copy cannot carry: such models always recompute. */
static void swap_space(struct ferry_engine *e) {
  struct ferry_plan *p = &e->plan;
  const uint64_t bb = ferry__kv_pages_block_bytes(e), budget = e->cfg.host_budget_bytes;
  e->kv_swap_blocks = 0;
  if (!e->kv_block || !e->cfg.kv_preempt_swap || e->sizing_only || !bb) return;
  for (int64_t l = 0; l < e->mc->n_layers; l++)
    if (e->kv[l].ring) return;
  uint64_t n = (uint64_t)e->kv_pool_blocks;
  if (e->cfg.kv_swap_bytes && e->cfg.kv_swap_bytes / bb < n) n = e->cfg.kv_swap_bytes / bb;
  if (budget) {
    const uint64_t fit = p->host_total_bytes < budget ? (budget - p->host_total_bytes) / bb : 0;
    if (fit < n) n = fit;
  }
  e->kv_swap_blocks = (int32_t)n;
  p->host_total_bytes += n * bb;
}

/* Per-layer tables and the KV cache layout of the engine's configuration (the workspace's is
 * laid out with each plan: it depends on the store's largest quantized matrix, which a reload
 * may change). A paged cache is laid out for a reservation's worth of blocks (pool_blocks()). */
static ferry_status layout_buffers(struct ferry_engine *e) {
  if (!e->li) {
    ferry_status st = layer_tables(e);
    if (st != FERRY_OK) return st;
  }
  e->kv_format = ferry_model_kv_format(e->model, e->cfg.kv_format);
  e->kv_dtype = ferry_kv_format_dtype(e->kv_format);
  e->kv_capacity = e->cfg.max_seq_tokens;
  const int32_t group = ferry_kv_format_group(e->kv_format);
  const int64_t chunk = e->mc->kv_lora_rank ? e->mc->kv_lora_rank + e->mc->qk_rope_dim : e->mc->head_dim;
  if (group && chunk % group)
    return ferry__err_set(&e->err, FERRY_ERR_INVALID,
                          "engine: a %s KV cache scales groups of %d elements of each %s, but %s's are %lld wide",
                          ferry_kv_format_name(e->kv_format), group, e->mc->kv_lora_rank ? "latent row" : "head",
                          e->mc->name, (long long)chunk);
  if (e->cfg.kv_block_tokens > 0) { /* the pool to plan with: a reservation's worth if it fits */
    e->kv_block = e->cfg.kv_block_tokens;
    e->kv_blocks_per_seq = ferry__kv_pages_need(e, e->kv_capacity);
    e->kv_pool_blocks = pool_blocks(e, e->sizing_only ? 0 : 1);
  }
  layout_kv(e, 0);
  e->bounce_bytes = BOUNCE_BYTES;
  return FERRY_OK;
}

/* The KV cache the plan places. When caches follow their layers (kv_follows_layers()) each
 * layer's, and the window scratch it needs on the device while it streams (*per_layer: owned by
 * the caller, 2 x n_layers), so the plan charges the device only for the pinned layers' caches and
 * the host for the streamed layers'; none is anywhere else. Otherwise the layout's device part,
 * and with --kv-home host the host cache (every layer's, known before the plan; on disk: its
 * staging). */
static ferry_status kv_plan_input(struct ferry_engine *e, struct ferry_plan_input *in, uint64_t **per_layer) {
  const int64_t L = e->mc->n_layers;
  if (!kv_follows_layers(e)) {
    in->kv_bytes = e->kv_total_bytes - e->hkv_bytes;
    in->host_kv_bytes = ferry__hybrid_on(e) ? ferry__kv_host_bytes(e) : 0;
    return FERRY_OK;
  }
  uint64_t *a = *per_layer = ferry__calloc((size_t)(2 * L), sizeof *a);
  if (!a) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  for (int64_t l = 0; l < L; l++) {
    a[l] = e->kv[l].bytes;
    a[L + l] = ferry__kv_window_bytes(e, l);
  }
  in->kv_bytes = in->host_kv_bytes = 0;
  in->layer_kv_bytes = a;
  in->kv_window_bytes = a + L;
  return FERRY_OK;
}

ferry_status ferry__engine_make_plan(struct ferry_engine *e, const struct ferry_plan_config *pc, struct ferry_plan *out,
                                     char *msg, size_t msg_len) {
  struct ferry_plan_input in;
  uint64_t *attn = NULL, *ffn = NULL, *per_layer = NULL;
  ferry_status st = ferry__engine_plan_input(e, &in, &attn, &ffn);
  if (st != FERRY_OK) {
    snprintf(msg, msg_len, "%s", e->err.msg);
    goto out;
  }
  /* every routed expert on the CPU: no expert slot on the device, nor the experts' buffers */
  struct ferry_plan_config cpc = *pc;
  cpc.experts_on_cpu = e->experts_cpu_only = ferry__experts_cpu_only(e, pc);
  layout_workspace(e); /* after the plan input, which found the largest quantized matrix */
  if ((st = kv_plan_input(e, &in, &per_layer)) != FERRY_OK) {
    snprintf(msg, msg_len, "%s", e->err.msg);
    goto out;
  }
  in.n_moe_layers = e->n_moe_layers;
  in.workspace_bytes = e->ws.charged; /* what the device holds for it (layout_workspace) */
  /* a hybrid run's CPU works in a copy of the workspace in host memory */
  in.host_workspace_bytes = ferry__hybrid_on(e) ? e->ws.cpu_extent : 0; /* the buffers its ops address */
  in.host_fixed_bytes = readback_bytes(e) + e->bounce_bytes + in.host_kv_bytes + in.host_workspace_bytes;
  /* Every range of a unit may need an O_DIRECT envelope of its own in staging. */
  size_t n = ferry_model_tensor_count(e->model), dense = 3;
  for (size_t i = 0; i < n; i++)
    if (ferry_model_tensor(e->model, i)->expert < 0) dense++;
  in.staging_align = (uint64_t)dense * 2 * FERRY_DIRECT_ALIGN;
  st = ferry__plan_make(&in, &cpc, out, msg, msg_len);
out:
  ferry_free(attn);
  ferry_free(ffn);
  ferry_free(per_layer);
  return st;
}

void ferry__engine_base_plan_config(const struct ferry_engine *e, struct ferry_plan_config *pc) {
  memset(pc, 0, sizeof *pc);
  pc->block_layers = e->cfg.block_layers;
  pc->prefetch_depth = e->cfg.prefetch_depth;
  pc->block_slots = e->cfg.block_slots;
  pc->pin_first = e->cfg.pin_first;
  pc->pin_last = e->cfg.pin_last;
  pc->resident_attention = e->cfg.resident_attention;
  pc->resident_all = e->cfg.resident_all;
  pc->home_disk = e->cfg.home_disk;
  pc->device_budget_bytes = e->cfg.device_budget_bytes;
  pc->host_budget_bytes = e->cfg.host_budget_bytes;
  /* under pressure control the host tier is planned to its low-water mark: the headroom up to
   * the high mark is what other work on the machine may take before the engine degrades */
  pc->blocks_on_cpu = e->cfg.compute_layers == FERRY_COMPUTE_CPU;
  /* several devices: the plan pins everything; each device's share is held to its budget by the
   * executor as it is allocated (mgpu.c) */
  if (ferry__mgpu_on(e)) pc->device_budget_bytes = 0;
  if (e->cfg.pressure.enabled && pc->host_budget_bytes)
    pc->host_budget_bytes = (uint64_t)((double)pc->host_budget_bytes * e->cfg.pressure.low_water);
}

/* Where no expert cache takes the device budget the working set leaves: a dense model, experts
 * moving with their layers, or every routed expert on the CPU (ferry__experts_cpu_only_config()
 * of the configuration alone). Only there may fill_budget give it to whole layers. */
static int no_expert_cache(const struct ferry_engine_config *c, const struct ferry_model_config *mc) {
  return !mc->n_experts || c->expert_granularity_layer || ferry__experts_cpu_only_config(c, mc, 0, 1);
}

/* Whether the budget left pins whole layers, from the last: fill_budget, which check_config()
 * allows only where no expert cache would take that budget (no_expert_cache()). Never when sizing
 * the minimum, whose budget is any. */
static int fills_layers(const struct ferry_engine *e, const struct ferry_plan_config *pc) {
  return e->cfg.fill_budget && pc->device_budget_bytes && !pc->resident_all && !e->sizing_only;
}

static ferry_status make_plan(struct ferry_engine *e) {
  ferry_status lst = e->devs ? FERRY_OK : ferry__mgpu_check(e);
  if (lst == FERRY_OK) lst = layout_buffers(e);
  if (lst != FERRY_OK) return lst;
  struct ferry_plan_config pc;
  ferry__engine_base_plan_config(e, &pc);
  char msg[FERRY_ERRMSG_MAX];
  ferry_status st = ferry__engine_make_plan(e, &pc, &e->plan, msg, sizeof msg);
  if (st == FERRY_ERR_BUDGET && e->kv_block && !e->cfg.kv_pool_bytes && e->kv_pool_blocks > pool_blocks(e, 0)) {
    /* a reservation's worth does not fit: a paged server runs fewer sequences, not fewer weights */
    e->kv_pool_blocks = pool_blocks(e, 0);
    layout_kv(e, 0);
    st = ferry__engine_make_plan(e, &pc, &e->plan, msg, sizeof msg);
  }
  if (st == FERRY_OK && fills_layers(e, &pc)) {
    /* The most pinned last layers whose working set still fits. Not monotonic near the end
     * (fewer streamed layers need fewer block slots), so every count is tried, largest first. */
    for (int32_t k = e->mc->n_layers - pc.pin_first; k > pc.pin_last; k--) {
      struct ferry_plan_config more = pc;
      struct ferry_plan filled;
      char ignored[FERRY_ERRMSG_MAX];
      more.pin_last = k;
      if (ferry__engine_make_plan(e, &more, &filled, ignored, sizeof ignored) != FERRY_OK) continue;
      ferry__plan_free(&e->plan);
      e->plan = filled;
      e->cfg.pin_last = k;
      break;
    }
  }
  if (st == FERRY_ERR_BUDGET) {
    char kv[1024];
    ferry__err_set(&e->err, st, "%s; %s", msg, kv_shape(e, kv, sizeof kv));
  } else if (st != FERRY_OK) {
    ferry__err_set(&e->err, st, "%s", msg);
  }
  if (st == FERRY_OK) st = hybrid_plan(e);
  if (st == FERRY_OK) grow_pool(e);
  if (st == FERRY_OK) swap_space(e);
  return st;
}

/* A KV cache homed on disk (--kv-home disk): the host cache's file, read into a staging for each
 * attention on the CPU. */
static ferry_status check_kv_disk(const struct ferry_engine_config *c, struct ferry_err *err) {
  if (!c->kv_home_disk) return FERRY_OK;
  if (!c->kv_home_host)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: kv_home_disk homes on disk the KV cache that kv_home_host keeps in host memory, "
                          "with attention on the CPU: set both (--kv-home disk)");
  if (c->kv_attention_device)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: --kv-home disk with --kv-attention device: the rows would go from disk to host "
                          "memory to the device; not supported (the CPU attends over the rows read from disk)");
  if (c->kv_host_memory != FERRY_HOST_MEMORY_DEFAULT)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --kv-host-memory is the memory kind of a KV cache in host memory; with --kv-home "
                          "disk host memory holds only the rows read for the CPU's attention, which never cross the "
                          "link");
  if (c->kv_block_tokens > 0)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: --kv-home disk with a paged KV cache (--kv-block-tokens): not supported (the file "
                          "holds each sequence's rows in place)");
  if (c->compute_layers != FERRY_COMPUTE_GPU)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: --kv-home disk with layers computed on the CPU (--offload-compute layers=...): not "
                          "supported (only the attention of layers computed on the device reads the disk cache)");
  return FERRY_OK;
}

/* --kv-home layer: each layer's cache where its weights live, and where a streamed layer runs
 * decides where it attends; the options that place a whole cache or choose where it attends
 * contradict it. */
static ferry_status check_kv_home_layer(const struct ferry_engine_config *c, const struct ferry_model_config *mc,
                                        struct ferry_err *err) {
  if (!c->kv_home_layer) return FERRY_OK;
  if (c->kv_home_host)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --kv-home is one of device, host or layer (kv_home_host and kv_home_layer both "
                          "set)");
  if (c->kv_prefill_device || c->kv_attention_device)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --kv-home layer: a streamed layer computed on the device attends there over its "
                          "window copied up from the host cache, one computed on the CPU attends on the CPU; "
                          "--kv-prefill and --kv-attention choose for a whole cache in host memory (--kv-home host)");
  if (c->resident_attention)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --kv-home layer keeps a layer's KV cache where its weights are; with --resident "
                          "attention a streamed layer's weights are on both sides");
  if (mc->kv_lora_rank)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: --kv-home layer copies windows of K and V rows to the device; %s's latent (MLA) "
                          "cache is not one (--offload-compute layers=cpu keeps the latent cache of the layers it "
                          "computes on the CPU there)", mc->name);
  return FERRY_OK;
}

/* The KV cache in host memory and where its tokens attend (--kv-home, --kv-attention,
 * --kv-prefill, --kv-host-memory). */
static ferry_status check_kv_home(const struct ferry_engine_config *c, const struct ferry_model_config *mc,
                                  struct ferry_err *err) {
  ferry_status st = check_kv_home_layer(c, mc, err);
  if (st != FERRY_OK) return st;
  if (mc->kv_lora_rank && (c->kv_prefill_device || c->kv_attention_device))
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: --kv-prefill/--kv-attention device copy K and V rows up to attend on the device; "
                          "%s's latent (MLA) cache in host memory is attended on the CPU", mc->name);
  st = check_kv_disk(c, err);
  if (st != FERRY_OK) return st;
  if (c->kv_attention_device && !c->kv_home_host)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --kv-attention device attends on the device over rows copied up from a KV cache "
                          "in host memory; it needs --kv-home host (with the cache on the device every step "
                          "attends there)");
  if (c->kv_host_memory != FERRY_HOST_MEMORY_DEFAULT && !c->kv_home_host && !c->kv_home_layer)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --kv-host-memory is the memory kind of a KV cache in host memory; it needs "
                          "--kv-home host or layer");
  if (c->kv_host_memory != FERRY_HOST_MEMORY_DEFAULT && c->kv_host_memory != FERRY_HOST_MEMORY_PINNED &&
      c->kv_host_memory != FERRY_HOST_MEMORY_PAGEABLE)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: kv_host_memory %d: expected a ferry_host_memory kind",
                          (int)c->kv_host_memory);
  if (c->kv_prefill_device && !c->kv_home_host)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --kv-prefill device attends prompts on the device beside a KV cache in host "
                          "memory; it needs --kv-home host (with the cache on the device every step attends there)");
  return FERRY_OK;
}

/* One rank of ZeRO-3's data-parallel group (--zero-gpus). */
static ferry_status check_zero_gpus(const struct ferry_engine_config *c, const struct ferry_model_config *mc,
                                    struct ferry_err *err) {
  if (c->zero_gpus < 0)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: --zero-gpus %d: the data-parallel ranks are at least 1",
                          c->zero_gpus);
  if (c->zero_gpus > 1 && c->n_devices > 1)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: --zero-gpus %d is one rank on one device of a data-parallel group; not with --gpus %d",
                          c->zero_gpus, c->n_devices);
  /* the ranks route their own tokens: an expert one rank fetches the others need not gather */
  if (c->zero_gpus > 1 && mc->n_experts && !c->expert_granularity_layer)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: --zero-gpus %d partitions streamed layer blocks; %s's experts stream on their own "
                          "(move them with their layer: --expert-granularity layer)",
                          c->zero_gpus, mc->name);
  return FERRY_OK;
}

/* Memory-pressure marks and the budget schedule they shed memory for. */
static ferry_status check_budget_schedule(const struct ferry_engine_config *c, struct ferry_err *err) {
  const struct ferry_pressure_config *pr = &c->pressure;
  if (pr->enabled && !(pr->low_water > 0 && pr->low_water < pr->high_water && pr->high_water <= 1.0))
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: pressure marks need 0 < low water (%g) < high water (%g) <= 1", pr->low_water,
                          pr->high_water);
  if (c->n_budget_changes < 0 || (c->n_budget_changes > 0 && !c->budget_schedule))
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: budget schedule of %d changes without entries",
                          c->n_budget_changes);
  if (c->n_budget_changes > 0 && !pr->enabled)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: a budget schedule needs memory-pressure control (pressure.enabled): without it "
                          "nothing would shed memory when a budget shrinks");
  for (int32_t i = 0; i < c->n_budget_changes; i++) {
    const struct ferry_budget_change *b = &c->budget_schedule[i];
    if ((b->tier != FERRY_TIER_HOST && b->tier != FERRY_TIER_DEVICE) || !b->bytes || b->at_ns < 0)
      return ferry__err_set(err, FERRY_ERR_INVALID,
                            "engine: budget change %d: needs the host or device tier, a size of at least one byte and "
                            "a time >= 0", i + 1);
    if (b->tier == FERRY_TIER_DEVICE && !c->device_budget_bytes)
      return ferry__err_set(err, FERRY_ERR_INVALID,
                            "engine: a device budget change needs a device budget to start from (everything is "
                            "resident without one)");
    if (b->tier == FERRY_TIER_HOST && !c->host_budget_bytes)
      return ferry__err_set(err, FERRY_ERR_INVALID,
                            "engine: a host budget change needs a host budget to start from");
  }
  return FERRY_OK;
}

/* The streaming policy: blocks, their prefetch and slots, pins. */
static ferry_status check_streaming(const struct ferry_engine_config *c, const struct ferry_model_config *mc,
                                    struct ferry_err *err) {
  if (c->block_layers < 0 || c->prefetch_depth < 0 || c->pin_first < 0 || c->pin_last < 0)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: block layers, prefetch depth and pins must be >= 0");
  if (c->block_layers > mc->n_layers)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: --block-layers %d exceeds the model's %lld layers",
                          c->block_layers, (long long)mc->n_layers);
  if (c->prefetch_depth > 64) return ferry__err_set(err, FERRY_ERR_INVALID, "engine: --prefetch-depth is at most 64");
  if (c->block_slots && (c->block_slots < c->prefetch_depth + 1 || c->block_slots > 66))
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --block-slots %d must be 0 or from prefetch depth + 1 (%d) to 66: the blocks in "
                          "flight and the one computing need a slot each",
                          c->block_slots, c->prefetch_depth + 1);
  return FERRY_OK;
}

/* Where routed experts move and are cached. */
static ferry_status check_experts(const struct ferry_engine_config *c, const struct ferry_model_config *mc,
                                  struct ferry_err *err) {
  if (c->expert_granularity_layer) {
    if (!mc->n_experts)
      return ferry__err_set(err, FERRY_ERR_INVALID,
                            "engine: --expert-granularity layer needs a Mixture-of-Experts model (%s is dense)", mc->name);
    if (c->predict || c->compute_experts != FERRY_COMPUTE_GPU || c->expert_cache_lfu || c->expert_no_reuse ||
        c->expert_cache || c->expert_cache_per_layer)
      return ferry__err_set(err, FERRY_ERR_INVALID,
                            "engine: --expert-granularity layer moves a layer's experts with it: there is no expert "
                            "cache for a predictor, an eviction policy or --offload-compute experts=... to act on");
  }
  if (c->expert_cache && !ferry__cache_policy_find(c->expert_cache)) {
    char names[128] = "";
    size_t n = 0;
    for (size_t i = 0; i < ferry__cache_policy_count() && n < sizeof names; i++)
      n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", ferry__cache_policy_at(i)->name);
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: unknown expert-cache policy '%s' (expected %s, or per-layer:K)",
                          c->expert_cache, names);
  }
  if (c->expert_cache_per_layer < 0)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: per-layer expert cache of %d slots", c->expert_cache_per_layer);
  if (c->fill_budget && !no_expert_cache(c, mc))
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --fill-budget pins layers where no expert cache takes the budget left (dense "
                          "models, experts moving with their layers or all computed on the CPU); %s's expert cache "
                          "takes it",
                          mc->name);
  return FERRY_OK;
}

static ferry_status check_config(const struct ferry_engine_config *c, const struct ferry_model_config *mc,
                                 struct ferry_err *err) {
  ferry_status st;
  if ((st = check_streaming(c, mc, err)) != FERRY_OK) return st;
  /* no sequence can be longer than the model's positions: a larger KV cache is memory never used */
  if (c->max_seq_tokens > mc->max_position)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --max-seq-tokens %d exceeds %s's maximum position %lld (max_position_embeddings)",
                          c->max_seq_tokens, mc->name, (long long)mc->max_position);
  if ((unsigned)c->compute_experts > FERRY_COMPUTE_AUTO || (unsigned)c->compute_layers > FERRY_COMPUTE_AUTO)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: compute placement %d/%d is not gpu, cpu or auto",
                          (int)c->compute_experts, (int)c->compute_layers);
  if (c->compute_experts != FERRY_COMPUTE_GPU && !mc->n_experts)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --offload-compute experts=... needs a Mixture-of-Experts model (%s is dense)", mc->name);
  if (c->compute_layers != FERRY_COMPUTE_GPU) {
    if (c->resident_attention)
      return ferry__err_set(err, FERRY_ERR_INVALID,
                            "engine: --offload-compute layers=... computes whole streamed layers on the CPU; with "
                            "--resident attention no layer streams whole");
    if (c->token_features)
      return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                            "engine: predictor features (mlp3, mlp7) are read from the device's activations; not with "
                            "layers computed on the CPU");
  }
  if ((st = check_kv_home(c, mc, err)) != FERRY_OK) return st;
  /* streamed embeddings and head are fetched to the one device that embeds and computes the
   * logits; multi-device runs keep every weight resident, and a CPU-computed step's hidden state
   * would wait for a table it does not use there */
  if (c->stream_embeddings && c->n_devices > 1)
    return ferry__err_set(err, FERRY_ERR_INVALID,
                          "engine: --stream-embeddings streams to one device; with --gpus %d every weight stays resident",
                          c->n_devices);
  if ((st = check_zero_gpus(c, mc, err)) != FERRY_OK) return st;
  if (c->stream_embeddings && c->compute_layers != FERRY_COMPUTE_GPU)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: --stream-embeddings fetches the embeddings and head to the device; not with "
                          "--offload-compute layers=cpu|auto");
  if (c->kv_block_tokens < 0 || c->kv_block_tokens > 65536)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: --kv-block-tokens %d is not in [1, 65536]", c->kv_block_tokens);
  if (c->kv_pool_bytes && !c->kv_block_tokens)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: a KV pool (--kv-pool) is for a paged cache (--kv-block-tokens)");
  if (c->kv_preempt_swap && !c->kv_block_tokens)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: swap preemption (--kv-preempt swap) is for a paged cache");
  if (c->kv_swap_bytes && !c->kv_preempt_swap)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: --kv-swap sizes the host copy of swap preemption; it needs "
                                                  "--kv-preempt swap");
  if (c->kv_block_tokens && c->greedy)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: a paged KV cache recomputes a preempted sequence from its token ids, which --greedy "
                          "takes from logits it does not keep; use the seeded draw");
  if (c->gpu_batches > 1024) return ferry__err_set(err, FERRY_ERR_INVALID, "engine: --gpu-batches is at most 1024");
  if (c->gpu_batches > 1 && c->token_features)
    return ferry__err_set(err, FERRY_ERR_UNSUPPORTED,
                          "engine: predictor features (mlp3, mlp7) are kept for one batch per step; not with --gpu-batches");
  if ((st = check_experts(c, mc, err)) != FERRY_OK) return st;
  if ((unsigned)c->kv_format >= FERRY_KV_FORMAT_COUNT)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: KV format %d is not a format", (int)c->kv_format);
  if (c->token_features != 0 && c->token_features != FERRY_MLP3_FEATURES && c->token_features != FERRY_MLP7_FEATURES)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: token_features is 0, %d (mlp3) or %d (mlp7), not %d",
                          FERRY_MLP3_FEATURES, FERRY_MLP7_FEATURES, c->token_features);
  if ((st = check_budget_schedule(c, err)) != FERRY_OK) return st;
  if (c->token_features && !mc->n_experts)
    return ferry__err_set(err, FERRY_ERR_INVALID, "engine: predictor features are for MoE models; %s is dense",
                          mc->name);
  return FERRY_OK;
}

void ferry__engine_free_streaming(struct ferry_engine *e, int with_pinned) {
  ferry_exec *ex = e->ex;
  if (ex) {
    if (with_pinned) ferry_exec_free(ex, e->pinned_buf);
    ferry_exec_free(ex, e->block_buf);
    ferry_exec_free(ex, e->expert_buf);
    ferry_exec_free(ex, e->host_units_buf);
    ferry_exec_free(ex, e->staging_buf);
    for (int32_t s = 0; e->block_slots && s < e->plan.n_block_slots; s++) {
      ferry_exec_event_destroy(ex, e->block_slots[s].ready);
      ferry_exec_event_destroy(ex, e->block_slots[s].free);
    }
    for (int32_t s = 0; e->expert_slots && s < e->plan.n_expert_slots; s++) {
      ferry_exec_event_destroy(ex, e->expert_slots[s].ready);
      ferry_exec_event_destroy(ex, e->expert_slots[s].free);
    }
    for (int32_t s = 0; e->staging && s < e->plan.n_staging_slots; s++) ferry_exec_event_destroy(ex, e->staging[s].free);
  }
  if (with_pinned) e->pinned_buf = NULL;
  e->block_buf = e->expert_buf = e->host_units_buf = e->staging_buf = NULL;
  ferry_free(e->block_slots);
  ferry_free(e->expert_slots);
  ferry_free(e->staging);
  e->block_slots = e->expert_slots = NULL;
  e->staging = NULL;
  /* a re-plan (adapt.c) replaces the expert cache: the run's prefetch counts carry over */
  e->prefetches_before += e->xplan.prefetches;
  e->prefetches_used_before += e->xplan.prefetches_used;
  ferry__xplan_free(&e->xplan);
}

static void engine_free(struct ferry_engine *e) {
  if (!e) return;
  ferry_free(e->serve.admit_order); /* a run begun and never finished */
  ferry_free(e->serve.waiting);
  ferry_exec *ex = e->ex;
  if (ex) {
    ferry_exec_drain(ex);
    ferry__mgpu_free(e);
    ferry__engine_free_streaming(e, 1);
    ferry_exec_free(ex, e->kv_buf);
    ferry_exec_free(ex, e->ws_buf);
    ferry_exec_free(ex, e->readback_buf);
    ferry_exec_free(ex, e->bounce_buf);
    ferry_exec_event_destroy(ex, e->ev_router);
    ferry_exec_event_destroy(ex, e->ev_step);
    ferry_exec_event_destroy(ex, e->ev_tmp);
    ferry_exec_event_destroy(ex, e->ev_read);
  } else {
    ferry__engine_free_streaming(e, 1);
  }
  if (e->ex) ferry__memo_free(e);
  ferry__hybrid_free(e);
  ferry__kv_pages_free(e);
  ferry__kv_prefill_free(e);
  ferry_free(e->resumes);
  ferry__engine_adapt_free(e);
  ferry__engine_free_units(e);
  ferry__plan_free(&e->plan);
  if (e->mbs) { /* the step arrays are micro-batch 0's, the others views into them */
    ferry_free(e->mbs[0].tok_ids);
    ferry_free(e->mbs[0].tok_pos);
    ferry_free(e->mbs[0].tok_slot);
    ferry_free(e->mbs[0].tok_seq);
    ferry_free(e->mbs[0].tok_index);
    ferry_free(e->mbs[0].tok_seqlen);
    ferry_free(e->mbs[0].row_of_seq);
    ferry_free(e->mbs[0].tok_req);
    ferry_free(e->mbs);
  }
  ferry_free(e->li);
  ferry_free(e->rope);
  ferry_free(e->kv);
  ferry_free(e->expert_tokens);
  ferry_free(e->expert_ranks);
  ferry_free(e->expert_count);
  ferry_free(e->expert_start);
  ferry_free(e->expert_fill);
  ferry_free(e->routing_ids);
  ferry_free(e->routing_w);
  ferry_free(e->layer_stats);
  ferry_free(e->predicted);
  ferry__features_free(e);
  ferry_free(e->reqs);
  ferry_free(e->req_metrics);
  ferry_free(e->steps);
  ferry_free(e->seqs);
  ferry_free(e->seq_tokens);
  ferry_free(e->seq_maxpos);
  ferry_free(e->devs); /* when the executor was gone (ferry__mgpu_free frees them otherwise) */
  ferry_free(e->ep_dev);
  ferry_free(e);
}

void ferry_engine_destroy(ferry_engine *e) { engine_free(e); }

const char *ferry_engine_errmsg(const ferry_engine *e) { return e->err.msg; }

static ferry_status make_slots(struct ferry_engine *e, struct slot **out, int32_t n) {
  *out = ferry__calloc((size_t)(n ? n : 1), sizeof **out);
  if (!*out) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  for (int32_t s = 0; s < n; s++) {
    (*out)[s].unit = -1;
    if (ferry_exec_event_create(e->ex, &(*out)[s].ready) != FERRY_OK ||
        ferry_exec_event_create(e->ex, &(*out)[s].free) != FERRY_OK)
      return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for events");
  }
  return FERRY_OK;
}

/* A failed allocation names the buffer (the executor's message) and, when given, what it was
 * sized from. */
static ferry_status alloc_buf(struct ferry_engine *e, enum ferry_tier tier, uint64_t bytes, const char *label,
                              const char *sized_from, ferry_buf **out) {
  if (!bytes) return FERRY_OK;
  ferry_status st = ferry_exec_alloc(e->ex, tier, bytes, label, out);
  if (st != FERRY_OK)
    ferry__err_set(&e->err, st, "%s%s%s", ferry_exec_errmsg(e->ex), sized_from ? "; " : "", sized_from ? sized_from : "");
  return st;
}

ferry_status ferry__engine_alloc_ws(struct ferry_engine *e, int32_t device, ferry_buf **out) {
  if (!e->ws.total) return FERRY_OK;
  /* the window the device's ops address: the buffers before device_base are the CPU's only */
  ferry_status st = ferry_exec_alloc_window(e->ex, device, FERRY_TIER_DEVICE, e->ws.device_base,
                                            e->ws.total - e->ws.device_base, e->ws.charged, "workspace", out);
  if (st != FERRY_OK) ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  return st;
}

/* The expert cache over the plan's slots (runtime/policy/expert_plan.c), with the popularity the
 * policy may pin from. */
static ferry_status expert_cache(struct ferry_engine *e) {
  const struct ferry_model_config *mc = e->mc;
  const int32_t L = (int32_t)mc->n_layers, K = e->cfg.expert_cache_per_layer;
  if (K && !e->plan.experts_pinned && (int64_t)K * L > e->plan.n_expert_slots)
    return ferry__err_set(&e->err, FERRY_ERR_BUDGET,
                          "engine: --expert-cache per-layer:%d needs %lld slots (%d per layer x %d layers), the device "
                          "budget leaves %d",
                          K, (long long)K * L, K, L, e->plan.n_expert_slots);
  const struct ferry_cache_policy_ops *policy;
  ferry_status st = ferry_cache_policy_lookup(cache_policy_name(&e->cfg), &policy);
  if (st != FERRY_OK) return ferry__err_set(&e->err, st, "engine: %s", ferry_last_error());
  st = ferry__xplan_init(&e->xplan, policy, e->plan.n_expert_slots, K, L, (int32_t)mc->n_experts, e->cfg.expert_popularity,
                         e->cfg.prefetch_depth, e->cfg.expert_no_reuse);
  if (st != FERRY_OK) return ferry__err_set(&e->err, st, "engine: out of memory for the expert cache");
  return FERRY_OK;
}

/* Experts the policy pins before serving (static with a trace's counts): fetched now, as part of
 * loading the weights (and again after a re-plan, whose cache starts empty). */
ferry_status ferry__engine_preload_experts(struct ferry_engine *e) {
  if (!e->mc->n_experts || e->plan.experts_pinned || !e->plan.n_expert_slots || e->cfg.expert_granularity_layer)
    return FERRY_OK;
  int32_t *units = ferry__calloc((size_t)e->plan.n_expert_slots, sizeof *units);
  if (!units) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  const int32_t n = ferry__cache_preload(&e->xplan.cache, units, e->plan.n_expert_slots);
  const int32_t E = (int32_t)e->mc->n_experts;
  ferry_status st = FERRY_OK;
  for (int32_t i = 0; i < n && st == FERRY_OK; i++) {
    const int32_t l = units[i] / E, x = units[i] % E, u = e->expert_unit[units[i]];
    if (u < 0 || ferry__cache_lookup(&e->xplan.cache, l, x) >= 0) continue;
    int32_t el, ex;
    const int32_t slot = ferry__cache_insert(&e->xplan.cache, l, x, &el, &ex);
    if (slot < 0) break;
    st = ferry__engine_fetch_expert(e, u, slot);
  }
  ferry_free(units);
  if (st == FERRY_OK && (st = ferry_exec_drain(e->ex)) != FERRY_OK)
    st = ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  return st;
}

ferry_status ferry__engine_alloc_pinned(struct ferry_engine *e) {
  uint64_t pinned = 0;
  for (int32_t u = 0; u < e->n_units; u++)
    if (e->units[u].pinned) pinned = e->units[u].device_offset + e->units[u].bytes;
  return alloc_buf(e, FERRY_TIER_DEVICE, pinned, "pinned weights", NULL, &e->pinned_buf);
}

ferry_status ferry__engine_alloc_streaming(struct ferry_engine *e) {
  const struct ferry_plan *p = &e->plan;
  uint64_t host_units = 0;
  for (int32_t u = 0; u < e->n_units; u++) {
    const struct unit *un = &e->units[u];
    if (!un->pinned && un->home == FERRY_TIER_HOST && un->bytes) host_units = un->host_offset + un->bytes;
  }
  ferry_status st;
  if ((st = alloc_buf(e, FERRY_TIER_DEVICE, p->device_block_bytes, "block slots", NULL, &e->block_buf)) ||
      (st = alloc_buf(e, FERRY_TIER_DEVICE, p->device_expert_bytes, "expert cache", NULL, &e->expert_buf)) ||
      (st = alloc_buf(e, FERRY_TIER_HOST, host_units, "host-resident weights", NULL, &e->host_units_buf)) ||
      (st = alloc_buf(e, FERRY_TIER_HOST, p->host_staging_bytes, "disk staging", NULL, &e->staging_buf)))
    return st;
  if ((st = make_slots(e, &e->block_slots, p->n_block_slots)) || (st = make_slots(e, &e->expert_slots, p->n_expert_slots)))
    return st;
  e->staging = ferry__calloc((size_t)(p->n_staging_slots ? p->n_staging_slots : 1), sizeof *e->staging);
  if (!e->staging) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  for (int32_t s = 0; s < p->n_staging_slots; s++)
    if (ferry_exec_event_create(e->ex, &e->staging[s].free) != FERRY_OK)
      return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for events");
  if (e->mc->n_experts && (st = expert_cache(e)) != FERRY_OK) return st;
  e->block_fetch_seq = e->block_compute_seq = 0;
  e->next_staging = 0;
  return FERRY_OK;
}

static ferry_status allocate(struct ferry_engine *e) {
  const struct ferry_plan *p = &e->plan;
  const struct ferry_model_config *mc = e->mc;
  ferry_status st;
  char kv[1024];
  kv_shape(e, kv, sizeof kv);
  if (ferry__mgpu_on(e)) { /* per device (mgpu.c) */
    if ((st = ferry__mgpu_alloc(e)) != FERRY_OK) return st;
  } else if ((st = ferry__engine_alloc_pinned(e)) ||
             (st = alloc_buf(e, FERRY_TIER_DEVICE, p->device_kv_bytes, "KV cache", kv, &e->kv_buf)) ||
             (st = ferry__engine_alloc_ws(e, 0, &e->ws_buf))) {
    return st;
  }
  if ((st = ferry__engine_alloc_streaming(e)) ||
      (st = alloc_buf(e, FERRY_TIER_HOST, readback_bytes(e), "read-back", NULL, &e->readback_buf)) ||
      (st = alloc_buf(e, FERRY_TIER_HOST, e->bounce_bytes, "load bounce", NULL, &e->bounce_buf)))
    return st;
  if (ferry_exec_event_create(e->ex, &e->ev_router) != FERRY_OK || ferry_exec_event_create(e->ex, &e->ev_step) != FERRY_OK ||
      ferry_exec_event_create(e->ex, &e->ev_tmp) != FERRY_OK || ferry_exec_event_create(e->ex, &e->ev_read) != FERRY_OK)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for events");
  const size_t T = (size_t)e->cfg.max_step_tokens, K = (size_t)(mc->experts_per_token ? mc->experts_per_token : 1),
               E = (size_t)(mc->n_experts ? mc->n_experts : 1);
  const size_t M = (size_t)e->n_mb, B = (size_t)e->cfg.max_batch;
  e->mbs = ferry__calloc(M, sizeof *e->mbs);
  if (!e->mbs) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the micro-batches");
  struct microbatch *b0 = &e->mbs[0];
  b0->tok_ids = ferry__calloc(M * T, sizeof(int32_t));
  b0->tok_pos = ferry__calloc(M * T, sizeof(int32_t));
  b0->tok_slot = ferry__calloc(M * T, sizeof(int32_t));
  b0->tok_seq = ferry__calloc(M * T, sizeof(int32_t));
  b0->tok_index = ferry__calloc(M * T, sizeof(int32_t));
  b0->tok_seqlen = ferry__calloc(M * T, sizeof(int32_t));
  b0->row_of_seq = ferry__calloc(M * B, sizeof(int32_t));
  b0->tok_req = ferry__calloc(M * T, sizeof(int64_t));
  const uint64_t x0 = e->ws.x;
  for (size_t m = 0; b0->tok_ids && b0->tok_pos && b0->tok_slot && b0->tok_seq && b0->tok_index && b0->tok_seqlen &&
                     b0->row_of_seq && b0->tok_req && m < M;
       m++) {
    struct microbatch *b = &e->mbs[m];
    b->tok_ids = b0->tok_ids + m * T;
    b->tok_pos = b0->tok_pos + m * T;
    b->tok_slot = b0->tok_slot + m * T;
    b->tok_seq = b0->tok_seq + m * T;
    b->tok_index = b0->tok_index + m * T;
    b->tok_seqlen = b0->tok_seqlen + m * T;
    b->row_of_seq = b0->row_of_seq + m * B;
    b->tok_req = b0->tok_req + m * T;
    b->x = x0 + (uint64_t)(m * T) * (uint64_t)mc->hidden * 4;
  }
  ferry__mb_use(e, 0);
  e->expert_tokens = ferry__calloc(T * K, sizeof(int32_t));
  e->expert_ranks = ferry__calloc(T * K, sizeof(int32_t));
  e->expert_count = ferry__calloc(E, sizeof(int32_t));
  e->expert_start = ferry__calloc(E + 1, sizeof(int32_t));
  e->expert_fill = ferry__calloc(E, sizeof(int32_t));
  e->routing_ids = ferry__calloc(T * K, sizeof(int32_t));
  e->routing_w = ferry__calloc(T * K, sizeof(float));
  e->layer_stats = ferry__calloc((size_t)mc->n_layers, sizeof *e->layer_stats);
  if (!e->layer_stats) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the layer metrics");
  for (int32_t l = 0; l < mc->n_layers; l++) e->layer_stats[l].layer = l;
  e->predicted = ferry__calloc(E, sizeof(int32_t));
  e->seqs = ferry__calloc((size_t)e->n_seqs, sizeof *e->seqs);
  e->seq_maxpos = ferry__calloc((size_t)e->n_seqs, sizeof *e->seq_maxpos);
  e->seq_tokens = ferry__calloc((size_t)e->n_seqs * (size_t)e->kv_capacity, sizeof *e->seq_tokens);
  if (!e->seq_tokens)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the token ids of %d sequences x %d tokens",
                          e->n_seqs, e->kv_capacity);
  if (!e->tok_ids || !e->tok_pos || !e->tok_slot || !e->tok_seq || !e->tok_index || !e->tok_seqlen || !e->tok_req || !e->row_of_seq ||
      !e->expert_tokens || !e->expert_ranks || !e->expert_count || !e->expert_start || !e->expert_fill ||
      !e->routing_ids ||
      !e->routing_w || !e->seqs || !e->seq_maxpos || !e->predicted)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the per-step arrays (%d tokens per step)",
                          e->cfg.max_step_tokens);
  if ((st = ferry__hybrid_alloc(e)) != FERRY_OK) return st;
  if ((st = ferry__kv_pages_alloc(e)) != FERRY_OK) return st;
  if ((st = ferry__kv_prefill_alloc(e)) != FERRY_OK) return st;
  return ferry__features_alloc(e);
}

static ferry_status make_queues(struct ferry_engine *e) {
  ferry_status st;
  if ((st = ferry_exec_queue_create(e->ex, FERRY_QUEUE_COMPUTE, &e->q_compute)) ||
      (st = ferry_exec_queue_create(e->ex, FERRY_QUEUE_H2D, &e->q_h2d)) ||
      (st = ferry_exec_queue_create(e->ex, FERRY_QUEUE_D2H, &e->q_d2h)) ||
      (st = ferry_exec_queue_create(e->ex, FERRY_QUEUE_DISK, &e->q_disk)))
    return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  return ferry__hybrid_queues(e);
}

/* Weights holding NaN or Inf make every logit NaN without a word: an executor that computes
 * refuses them, naming the tensor, unless asked to run them anyway. */
static ferry_status check_finite(struct ferry_engine *e) {
  struct ferry_store_nonfinite nf;
  ferry_status st = ferry_store_scan_nonfinite(e->store, e->cfg.read_flags, &nf);
  if (st != FERRY_OK) {
    char why[512]; /* the last error is rewritten below */
    snprintf(why, sizeof why, "%s", ferry_last_error());
    return ferry__err_set(&e->err, st, "engine: checking the weights for NaN and Inf: %s", why);
  }
  if (!nf.values) return FERRY_OK;
  char where[1024];
  snprintf(where, sizeof where, "%s: tensor %s holds %llu non-finite value(s) (NaN or Inf; the first at element %llu), "
           "%llu in %llu tensor(s) in all",
           ferry_store_file_path(e->store, nf.first_file), nf.first_tensor, (unsigned long long)nf.first_count,
           (unsigned long long)nf.first_index, (unsigned long long)nf.values, (unsigned long long)nf.tensors);
  if (!e->cfg.allow_nonfinite)
    return ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s; --allow-nonfinite runs the model anyway", where);
  FERRY_WARN("%s (allowed)", where);
  return FERRY_OK;
}

ferry_status ferry_engine_create(ferry_engine **out, const ferry_model *model, ferry_store *store, ferry_exec *exec,
                                 const struct ferry_engine_config *config) {
  if (!out || !model || !exec || !config) return ferry__fail(FERRY_ERR_INVALID, "engine_create: missing argument");
  struct ferry_engine *e = ferry__calloc(1, sizeof *e);
  if (!e) return ferry__fail(FERRY_ERR_NOMEM, "engine: out of memory");
  pthread_mutex_init(&e->adapt_mu, NULL);
  e->model = model;
  e->mc = ferry_model_get_config(model);
  e->store = store;
  e->ex = exec;
  e->cfg = *config;
  e->has_data = ferry_exec_has_data(exec);
  apply_defaults(&e->cfg, e->mc);
  mb_counts(e);
  ferry_status st = check_config(&e->cfg, e->mc, &e->err);
  if (st == FERRY_OK && e->has_data && !store)
    st = ferry__err_set(&e->err, FERRY_ERR_INVALID, "engine: the %s executor computes on real weights: give a model folder with safetensors",
                        ferry_exec_name(exec));
  if (st == FERRY_OK && e->has_data && e->mc->family == FERRY_FAMILY_OPT)
    st = ferry__err_set(&e->err, FERRY_ERR_UNSUPPORTED,
                        "engine: OPT models are simulation-only (use ferry sim); the %s executor computes every "
                        "other family",
                        ferry_exec_name(exec));
  /* An executor without data computes no router, so routing must come from somewhere the
   * user chose (a recorded trace, a synthetic model): a silent default would hide that choice. */
  if (st == FERRY_OK && !e->has_data && e->mc->n_experts > 0 && !e->cfg.routing)
    st = ferry__err_set(&e->err, FERRY_ERR_INVALID,
                        "engine: the %s executor computes no router for this MoE model: give a routing source "
                        "(engine config 'routing', e.g. ferry_routing_synth_fn or ferry_routing_replay_fn)",
                        ferry_exec_name(exec));
  /* its plan was made for a predictor filling the expert cache: without one the run would differ */
  if (st == FERRY_OK && e->cfg.predict_planned && !e->cfg.predict)
    st = ferry__err_set(&e->err, FERRY_ERR_INVALID,
                        "engine: predict_planned says a predictor fills the expert cache, but none is installed "
                        "(predict is NULL)");
  if (st == FERRY_OK && e->has_data) st = check_finite(e);
  if (st == FERRY_OK) st = make_plan(e);
  if (st == FERRY_OK) st = ferry__engine_build_units(e);
  if (st == FERRY_OK) st = make_queues(e);
  if (st == FERRY_OK) st = allocate(e);
  if (st == FERRY_OK) st = ferry__memo_init(e);
  if (st == FERRY_OK) {
    struct ferry_exec_range range = ferry_exec_range_begin(exec, "load weights", -1, -1, -1);
    st = ferry__engine_load_resident(e, 0);
    if (st == FERRY_OK) st = ferry__mgpu_load_shards(e);
    if (st == FERRY_OK) st = ferry__hybrid_load(e);
    if (st == FERRY_OK) st = ferry__engine_preload_experts(e);
    ferry_exec_range_end(exec, &range);
    e->load_ns = ferry_exec_now(exec) - range.start_ns;
  }
  if (st == FERRY_OK) st = ferry__engine_adapt_init(e);
  if (st != FERRY_OK) {
    ferry__err_copy(NULL, &e->err);
    engine_free(e);
    return st;
  }
  *out = e;
  return FERRY_OK;
}

/* The plan's host tier (and the disk's KV cache, which no budget bounds). */
static void print_plan_host(const struct ferry_engine *e, FILE *f) {
  const struct ferry_plan *p = &e->plan;
  char b[2][32];
  fprintf(f, "  host: %s of %s budget\n", ferry__format_bytes(p->host_total_bytes, b[0], 32),
          e->cfg.host_budget_bytes ? ferry__format_bytes(e->cfg.host_budget_bytes, b[1], 32) : "unlimited");
  fprintf(f, "    resident units   %s\n", ferry__format_bytes(p->host_units_bytes, b[0], 32));
  fprintf(f, "    disk staging     %d x %s\n", p->n_staging_slots, ferry__format_bytes(p->staging_slot_bytes, b[0], 32));
  const uint64_t host_kv = p->host_kv_bytes, host_ws = p->host_workspace_bytes;
  char why[64] = "--kv-home host"; /* else the streamed layers' caches only */
  if (!e->cfg.kv_home_host) {
    snprintf(why, sizeof why, "%d streamed layers, %s", host_kv_layers(e),
             e->cfg.kv_home_layer ? "--kv-home layer" : "computed on the CPU");
  }
  if (host_kv && e->cfg.kv_home_disk)
    fprintf(f, "    KV staging       %s (%d x %d sequences x %d tokens, %s: the rows the CPU attends over, read from "
               "the disk cache; --kv-home disk, --prefetch-depth + 1)\n",
            ferry__format_bytes(host_kv, b[0], 32), e->cfg.prefetch_depth + 1, e->cfg.max_batch, e->kv_capacity,
            ferry_kv_format_name(e->kv_format));
  else if (host_kv)
    fprintf(f, "    KV cache (host)  %s (%d sequences x %d tokens, %s; %s)\n", ferry__format_bytes(host_kv, b[0], 32),
            e->n_seqs, e->kv_capacity, ferry_kv_format_name(e->kv_format), why);
  if (host_ws && e->mirror_bytes)
    fprintf(f, "    CPU workspace    %s (the CPU's ops work in host memory; %s of it the weights its attention reads)\n",
            ferry__format_bytes(host_ws, b[0], 32), ferry__format_bytes(e->mirror_bytes, b[1], 32));
  else if (host_ws)
    fprintf(f, "    CPU workspace    %s (the CPU's ops work in host memory)\n", ferry__format_bytes(host_ws, b[0], 32));
  fprintf(f, "    read-back, load  %s (routing and logits read-back, weight-load bounce buffer)\n",
          ferry__format_bytes(p->host_fixed_bytes - host_kv - host_ws, b[0], 32));
  if (e->cfg.kv_preempt_swap) /* what swap preemption can hold; the rest is recomputed */
    fprintf(f, "    KV swap          %s (%d of the pool's %d blocks: preempted sequences' rows; when full, or with "
               "windowed layers, they are recomputed)\n",
            ferry__format_bytes((uint64_t)e->kv_swap_blocks * ferry__kv_pages_block_bytes(e), b[0], 32), e->kv_swap_blocks,
            e->kv_pool_blocks);
  if (e->cfg.kv_home_disk) /* no budget: the disk tier */
    fprintf(f, "  disk: KV cache %s (%d sequences x %d tokens, %s; a file, read and written every step)\n",
            ferry__format_bytes(e->hkv_bytes, b[0], 32), e->n_seqs, e->kv_capacity, ferry_kv_format_name(e->kv_format));
}

static void print_plan(const struct ferry_engine *e, FILE *f) {
  const struct ferry_plan *p = &e->plan;
  char b[8][32];
  fprintf(f, "plan for %s (%s, %lld layers%s)\n", e->mc->name, ferry_family_name(e->mc->family),
          (long long)e->mc->n_layers, e->mc->n_experts ? ", MoE" : "");
  fprintf(f, "  device: %s of %s budget\n", ferry__format_bytes(p->device_total_bytes, b[0], 32),
          e->cfg.device_budget_bytes ? ferry__format_bytes(e->cfg.device_budget_bytes, b[1], 32) : "unlimited");
  ferry__mgpu_print(e, f);
  fprintf(f, "    pinned weights   %s\n", ferry__format_bytes(p->device_pinned_bytes, b[0], 32));
  if (e->cfg.kv_home_host) { /* the device holds at most a scratch of it */
    char scratch[256];
    fprintf(f, "    KV cache         %s (%s%s)\n", ferry__format_bytes(p->device_kv_bytes, b[0], 32),
            e->cfg.kv_home_disk ? "on disk: --kv-home disk" : "in host memory: --kv-home host",
            ferry__kv_prefill_shape(e, scratch, sizeof scratch));
  } else if (e->kv_block)
    fprintf(f, "    %s %s (paged, %s%s)\n", e->mc->kv_lora_rank ? "MLA cache       " : "KV cache        ",
            ferry__format_bytes(p->device_kv_bytes, b[0], 32), ferry_kv_format_name(e->kv_format),
            e->kv[0].ring || (e->mc->n_layers > 1 && e->kv[1].ring) ? ", windowed layers as rings" : "");
  else {
    char scratch[256]; /* --kv-home layer: the device's scratch for the streamed layers' windows */
    fprintf(f, "    %s %s (%d sequences x %d tokens, %s%s%s)\n",
            e->mc->kv_lora_rank ? "MLA cache       " : "KV cache        ",
            ferry__format_bytes(p->device_kv_bytes, b[0], 32), e->n_seqs, e->kv_capacity,
            ferry_kv_format_name(e->kv_format),
            e->kv[0].ring || (e->mc->n_layers > 1 && e->kv[1].ring) ? ", windowed layers as rings" : "",
            ferry__kv_prefill_shape(e, scratch, sizeof scratch));
  }
  if (e->kv_block) /* what a paged pool holds, in sequences of the longest length kept */
    fprintf(f, "    KV pool          %d blocks of %d tokens: %lld tokens, %lld sequences of %d tokens at once (paged; "
               "--max-batch %d per step)\n",
            e->kv_pool_blocks, e->kv_block, (long long)e->kv_pool_blocks * e->kv_block,
            (long long)e->kv_pool_blocks / (e->kv_blocks_per_seq > 0 ? e->kv_blocks_per_seq : 1), e->kv_capacity,
            e->cfg.max_batch);
  fprintf(f, "    workspace        %s (%d tokens per step)\n", ferry__format_bytes(p->device_workspace_bytes, b[0], 32),
          e->cfg.max_step_tokens);
  fprintf(f, "    block slots      %d x %s\n", p->n_block_slots, ferry__format_bytes(p->block_slot_bytes, b[0], 32));
  if (e->mc->n_experts && !e->cfg.expert_granularity_layer)
    fprintf(f, "    expert cache     %d x %s%s\n", p->n_expert_slots, ferry__format_bytes(p->expert_slot_bytes, b[0], 32),
            p->experts_pinned     ? " (all experts pinned)"
            : e->experts_cpu_only ? " (every routed expert runs on the CPU: nothing to cache)"
                                  : "");
  fprintf(f, "    minimum          %s\n", ferry__format_bytes(p->device_min_bytes, b[0], 32));
  print_plan_host(e, f);
  fprintf(f, "  prefetch depth %d, %d streamed block(s):\n", e->cfg.prefetch_depth, p->n_blocks);
  for (int32_t u = 0; u < e->n_units; u++) {
    const struct unit *un = &e->units[u];
    if (un->kind == UNIT_EXPERT) continue;
    const int streamed = p->embed_block >= 0 || p->head_block >= 0; /* --stream-embeddings */
    if (un->kind == UNIT_GLOBAL && streamed && !un->bytes) continue;
    const char *global = streamed ? "routers" : ferry__lookahead_layers(e) ? "embeddings + head + routers"
                                                                           : "embeddings + head";
    const char *what = un->kind == UNIT_GLOBAL ? global : un->kind == UNIT_LAYER_PART ? "layer" : "block";
    char name[64];
    if (un->kind == UNIT_GLOBAL) snprintf(name, sizeof name, "%s", what);
    else if (un->kind == UNIT_BLOCK && un->block == p->embed_block) snprintf(name, sizeof name, "embeddings");
    else if (un->kind == UNIT_BLOCK && un->block == p->head_block)
      snprintf(name, sizeof name, "%s", e->tied_head_src >= 0 ? "head (tied table again)" : "head");
    else if (un->n_layers == 1) snprintf(name, sizeof name, "%s %d", what, un->layer);
    else snprintf(name, sizeof name, "%s layers %d-%d", what, un->layer, un->layer + un->n_layers - 1);
    fprintf(f, "    %-28s %12s  %s\n", name, ferry__format_bytes(un->bytes, b[0], 32),
            un->pinned ? "pinned on device" : un->home == FERRY_TIER_HOST ? "streamed from host" : "streamed from disk");
  }
  if (e->mc->n_experts && e->cfg.expert_granularity_layer) {
    fprintf(f, "    %-28s %12s  %s\n", "experts", "", "in their layers' units, moving together");
  } else if (e->mc->n_experts) {
    int64_t n = (int64_t)e->n_moe_layers * e->mc->n_experts;
    const int32_t first = e->expert_unit[e->first_moe_layer * e->mc->n_experts];
    const int all_host = p->experts_on_host == n;
    /* with no expert ever on the device (experts=cpu, nothing to fill a cache), the CPU reads them */
    const char *where = p->experts_pinned    ? "pinned on device"
                        : e->experts_cpu_only ? (all_host ? "computed on the CPU from host memory"
                                                          : "computed on the CPU, homed on host/disk")
                        : all_host            ? "cached on device, homed in host memory"
                                              : "cached on device, homed on host/disk";
    fprintf(f, "    %-28s %12s  %s\n", "experts (each)",
            ferry__format_bytes(p->expert_slot_bytes ? p->expert_slot_bytes : e->units[first].bytes, b[0], 32), where);
    if (!p->experts_pinned)
      fprintf(f, "    experts in host memory: %d of %lld; on disk: %lld\n", p->experts_on_host, (long long)n,
              (long long)(n - p->experts_on_host));
  }
}

void ferry_engine_print_plan(const ferry_engine *e, FILE *f) { print_plan(e, f); }

/* An engine that is only planned (no executor): the configuration checked and the plan made, or
 * NULL with the error set (*st). `adjust` edits the configuration first (NULL: as given). */
static struct ferry_engine *planned_engine(const ferry_model *model, ferry_store *store,
                                           const struct ferry_engine_config *config,
                                           void (*adjust)(struct ferry_engine *e), ferry_status *st) {
  struct ferry_engine *e = ferry__calloc(1, sizeof *e);
  if (!e) {
    *st = ferry__fail(FERRY_ERR_NOMEM, "engine: out of memory");
    return NULL;
  }
  pthread_mutex_init(&e->adapt_mu, NULL);
  e->model = model;
  e->mc = ferry_model_get_config(model);
  e->store = store;
  e->cfg = *config;
  e->has_data = store != NULL;
  if (adjust) adjust(e);
  apply_defaults(&e->cfg, e->mc);
  mb_counts(e);
  *st = check_config(&e->cfg, e->mc, &e->err);
  if (*st == FERRY_OK) *st = make_plan(e);
  if (*st == FERRY_OK) return e;
  ferry__err_copy(NULL, &e->err);
  engine_free(e);
  return NULL;
}

ferry_status ferry_engine_plan_only(const ferry_model *model, ferry_store *store,
                                    const struct ferry_engine_config *config, FILE *f) {
  ferry_status st;
  struct ferry_engine *e = planned_engine(model, store, config, NULL, &st);
  if (!e) return st;
  if ((st = ferry__engine_build_units(e)) == FERRY_OK) print_plan(e, f);
  else ferry__err_copy(NULL, &e->err);
  engine_free(e);
  return st;
}

ferry_status ferry_engine_prefetch_depth_used(const ferry_model *model, ferry_store *store,
                                             const struct ferry_engine_config *config, int *used) {
  *used = 1;
  ferry_status st;
  struct ferry_engine *e = planned_engine(model, store, config, NULL, &st);
  if (!e) return st;
  /* every reader of cfg.prefetch_depth: the plan's block and staging slots, the predictor's and
   * gate lookahead's reach (ferry__lookahead_layers; the expert plan's prefetch share is used
   * only with a predictor), and pressure control's re-plans */
  *used = e->plan.n_block_slots > 0 || e->plan.n_staging_slots > 0 || e->cfg.predict || e->cfg.predict_planned ||
          e->cfg.router_lookahead || e->cfg.pressure.enabled || e->cfg.kv_home_disk; /* its reads ahead */
  engine_free(e);
  return FERRY_OK;
}

/* The minimum budgets are those of streaming mode, every unit homed on disk when there is a store
 * (the CPU's need of host copies is not checked). */
static void sizing_config(struct ferry_engine *e) {
  e->cfg.device_budget_bytes = UINT64_MAX / 2; /* any budget: streaming mode */
  e->cfg.host_budget_bytes = 0;
  e->cfg.home_disk = e->store != NULL;
  e->sizing_only = 1;
}

ferry_status ferry_engine_min_budgets(const ferry_model *model, ferry_store *store,
                                      const struct ferry_engine_config *config, uint64_t *device_min,
                                      uint64_t *host_min) {
  ferry_status st;
  struct ferry_engine *e = planned_engine(model, store, config, sizing_config, &st);
  if (!e) return st;
  *device_min = e->plan.device_min_bytes;
  *host_min = e->plan.host_staging_bytes + e->plan.host_fixed_bytes;
  engine_free(e);
  return FERRY_OK;
}
