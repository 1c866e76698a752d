/* Multi-device runs over one executor driving N devices: tensor parallel (Megatron-LM's
 * column-parallel then row-parallel layers, one all-reduce after attention and one after the
 * FFN) and pipeline parallel (contiguous blocks of layers per device, the hidden state handed
 * from stage to stage). The forward pass (forward.c) is the same code on every device; this
 * file says where weights, KV cache and workspace live, and moves the hidden state. */
#include <string.h>

#include "common/alloc.h"
#include "common/units.h"
#include "engine_impl.h"
#include "ferry/store.h"

#define SHARD_ALIGN 64u

static const char *parallel_name(enum ferry_parallel p) {
  return p == FERRY_PARALLEL_TP ? "tp" : p == FERRY_PARALLEL_PP ? "pp" : p == FERRY_PARALLEL_EP ? "ep" : "none";
}

/* What keeps the model or the configuration from being split (NULL: nothing). */
static const char *unsupported(const struct ferry_engine *e, int32_t n) {
  const struct ferry_model_config *mc = e->mc;
  const struct ferry_engine_config *c = &e->cfg;
  const int ep = c->parallel == FERRY_PARALLEL_EP, tp = c->parallel == FERRY_PARALLEL_TP || ep;
  if (n > FERRY_EXEC_MAX_DEVICES) return "more devices than an executor drives (8)";
  if (!tp && c->parallel != FERRY_PARALLEL_PP)
    return "a run without a way to split the model: name tensor (tp), pipeline (pp) or expert (ep) parallel";
  if (e->ex && ferry_exec_device_count(e->ex) < n) return "an executor created for fewer devices (its n_devices)";
  if (mc->n_experts && !ep) return "MoE models (split them by expert parallel, ep)";
  if (ep && !mc->n_experts) return "dense models (expert parallel splits routed experts: use tp)";
  if (c->expert_placement_hash && !ep) return "a hashed expert placement without expert parallel (ep)";
  if (ep && (mc->n_experts < n || c->expert_granularity_layer || c->router_lookahead || c->compute_experts))
    return "fewer experts than devices, experts moving with their layer, gate lookahead or experts on the CPU";
  if (mc->kv_lora_rank) return "multi-head latent attention (MLA)";
  if (mc->fused_qkv || mc->sandwich_norms || mc->parallel_residual || mc->alibi)
    return "fused qkv, sandwich norms, parallel residual or ALiBi layers";
  if (c->kv_home_host || c->kv_home_layer || c->compute_layers != FERRY_COMPUTE_GPU)
    return "hybrid runs (layers or KV cache on the CPU)";
  if (c->pressure.enabled || c->n_budget_changes) return "memory-pressure control or a budget schedule";
  if (c->token_features || c->kv_preempt_swap) return "predictor features or swap preemption";
  if (!tp) return mc->n_layers < n ? "fewer layers than devices" : NULL;
  if (mc->n_heads % n || mc->n_kv_heads % n || mc->intermediate % n)
    return "a model whose heads, KV heads or FFN width the device count does not divide";
  if (mc->qk_norm == FERRY_QK_NORM_FULL) return "q/k norms over all heads";
  if (c->quant_set) return "quantized weights (tensor parallel slices plain weights)";
  return NULL;
}

/* A 64-bit mix of v (splitmix64's finaliser): the hash of expert placement. */
static uint64_t mix(uint64_t v) {
  v += 0x9e3779b97f4a7c15ull;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
  return v ^ (v >> 31);
}

/* Each layer's experts on the devices, E / N a device (the first E mod N devices one more):
 * in expert order (contiguous ranges), or in the order of their hashes. Owned. */
static int8_t *place_experts(const struct ferry_engine *e) {
  const int32_t L = (int32_t)e->mc->n_layers, E = (int32_t)e->mc->n_experts, N = e->n_dev;
  int8_t *dev = ferry__calloc((size_t)L * (size_t)E, 1);
  if (!dev) return NULL;
  for (int32_t l = 0; l < L; l++)
    for (int32_t x = 0; x < E; x++) {
      int32_t rank = x; /* the expert's place in the order */
      if (e->cfg.expert_placement_hash) {
        const uint64_t h = mix((uint64_t)l << 32 | (uint32_t)x);
        rank = 0;
        for (int32_t y = 0; y < E; y++) { /* E is small: count the experts hashed before it */
          const uint64_t hy = mix((uint64_t)l << 32 | (uint32_t)y);
          rank += hy < h || (hy == h && y < x);
        }
      }
      dev[(size_t)l * (size_t)E + (size_t)x] = (int8_t)((int64_t)rank * N / E);
    }
  return dev;
}

ferry_status ferry__mgpu_check(struct ferry_engine *e) {
  const int32_t n = e->cfg.n_devices > 1 ? e->cfg.n_devices : 1;
  e->n_dev = 1;
  e->tp = 1;
  if (n == 1) return FERRY_OK;
  const char *why = unsupported(e, n);
  if (why)
    return ferry__err_set(&e->err, FERRY_ERR_UNSUPPORTED, "engine: %d devices, parallel %s: not for %s", n,
                          parallel_name(e->cfg.parallel), why);
  e->devs = ferry__calloc((size_t)n, sizeof *e->devs);
  if (!e->devs) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for %d devices", n);
  e->n_dev = n;
  if (e->cfg.parallel == FERRY_PARALLEL_TP || e->cfg.parallel == FERRY_PARALLEL_EP) e->tp = n;
  e->ep = e->cfg.parallel == FERRY_PARALLEL_EP;
  if (e->ep && (e->ep_dev = place_experts(e)) == NULL)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the expert placement");
  e->cfg.resident_all = 1; /* no offloading yet: each device holds its share; the executor enforces its budget */
  return FERRY_OK;
}

enum ferry__shard ferry__mgpu_shard(const struct ferry_engine *e, enum ferry_tensor_role role) {
  if (e->tp < 2) return SHARD_NONE;
  switch (role) {
    case FERRY_ROLE_ATTN_Q:
    case FERRY_ROLE_ATTN_K:
    case FERRY_ROLE_ATTN_V:
    case FERRY_ROLE_ATTN_Q_BIAS:
    case FERRY_ROLE_ATTN_K_BIAS:
    case FERRY_ROLE_ATTN_V_BIAS:
    case FERRY_ROLE_ATTN_SINKS:
    case FERRY_ROLE_FFN_GATE:
    case FERRY_ROLE_FFN_UP:
    case FERRY_ROLE_FFN_UP_BIAS: return SHARD_ROWS;
    case FERRY_ROLE_ATTN_O:
    case FERRY_ROLE_FFN_DOWN: return SHARD_COLS;
    default: return SHARD_NONE;
  }
}

int32_t ferry__mgpu_layer_dev(const struct ferry_engine *e, int32_t l) {
  const int64_t L = e->mc->n_layers, N = e->n_dev;
  if (N < 2 || e->tp > 1 || l < 0) return 0;
  if (l >= L) return (int32_t)N - 1;
  for (int64_t d = N - 1; d > 0; d--)
    if (l >= d * L / N) return (int32_t)d;
  return 0;
}

uint32_t ferry__mgpu_unit_devices(const struct ferry_engine *e, const struct unit *un) {
  if (!ferry__mgpu_on(e)) return 1u;
  if (e->ep && un->kind == UNIT_EXPERT) return 1u << ferry__mgpu_expert_dev(e, un->layer, un->expert);
  if (e->tp > 1) return (1u << e->n_dev) - 1u; /* replicated: norms, embeddings, the head */
  if (un->kind == UNIT_GLOBAL) return 1u | 1u << (e->n_dev - 1); /* embedding first, head last */
  return 1u << ferry__mgpu_layer_dev(e, un->layer);
}

static ferry_status exec_error(struct ferry_engine *e, ferry_status st) {
  return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
}

/* Device d's buffers (sizes from the plan and the unit table), queue and event. */
static ferry_status alloc_device(struct ferry_engine *e, int32_t d) {
  struct dev_state *v = &e->devs[d];
  ferry_status st = FERRY_OK;
  if (d == 0) v->q_compute = e->q_compute;
  else st = ferry_exec_queue_create_on(e->ex, FERRY_QUEUE_COMPUTE, d, &v->q_compute);
  if (st == FERRY_OK && v->pinned_bytes)
    st = ferry_exec_alloc_on(e->ex, d, FERRY_TIER_DEVICE, v->pinned_bytes, "pinned weights", &v->pinned);
  if (st == FERRY_OK && e->kv_dev_bytes)
    st = ferry_exec_alloc_on(e->ex, d, FERRY_TIER_DEVICE, e->kv_dev_bytes, "KV cache", &v->kv);
  if (st == FERRY_OK && (st = ferry__engine_alloc_ws(e, d, &v->ws)) != FERRY_OK) return st;
  if (st == FERRY_OK && e->shard_bytes)
    st = ferry_exec_alloc_on(e->ex, d, FERRY_TIER_DEVICE, e->shard_bytes, "weight shards", &v->shard);
  if (st == FERRY_OK) st = ferry_exec_event_create(e->ex, &v->done);
  return st == FERRY_OK ? FERRY_OK : exec_error(e, st);
}

ferry_status ferry__mgpu_alloc(struct ferry_engine *e) {
  ferry_status st = ferry_exec_queue_create(e->ex, FERRY_QUEUE_D2H, &e->q_peer);
  if (st != FERRY_OK) return exec_error(e, st);
  if (e->ep) {
    const size_t TK = (size_t)e->cfg.max_step_tokens * (size_t)e->mc->experts_per_token;
    e->ep_rows = ferry__calloc((size_t)e->n_dev * TK, sizeof *e->ep_rows);
    e->ep_zero = ferry__calloc((size_t)e->cfg.max_step_tokens, sizeof *e->ep_zero);
    if (!e->ep_rows || !e->ep_zero) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
    for (int32_t t = 0; t < e->cfg.max_step_tokens; t++) e->ep_zero[t] = (int32_t)TK; /* the row after expert_out */
  }
  e->mb_sent = ferry__calloc((size_t)e->n_mb, sizeof *e->mb_sent);
  if (!e->mb_sent) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  for (int32_t m = 0; m < e->n_mb; m++)
    if ((st = ferry_exec_event_create(e->ex, &e->mb_sent[m])) != FERRY_OK) return exec_error(e, st);
  for (int32_t d = 0; d < e->n_dev; d++)
    if ((st = alloc_device(e, d)) != FERRY_OK) return st;
  e->cur_dev = -1;
  ferry__dev_use(e, 0);
  return FERRY_OK;
}

void ferry__mgpu_free(struct ferry_engine *e) {
  if (!e->devs) return;
  for (int32_t d = 0; d < e->n_dev; d++) {
    struct dev_state *v = &e->devs[d];
    ferry_exec_free(e->ex, v->pinned);
    ferry_exec_free(e->ex, v->kv);
    ferry_exec_free(e->ex, v->ws);
    ferry_exec_free(e->ex, v->shard);
    ferry_exec_event_destroy(e->ex, v->done);
  }
  e->pinned_buf = e->kv_buf = e->ws_buf = e->cws = NULL; /* they were the devices' */
  ferry_free(e->devs);
  for (int32_t m = 0; e->mb_sent && m < e->n_mb; m++) ferry_exec_event_destroy(e->ex, e->mb_sent[m]);
  ferry_free(e->mb_sent);
  e->mb_sent = NULL;
  ferry_free(e->ep_rows);
  ferry_free(e->ep_zero);
  ferry_free(e->ep_dev);
  e->devs = NULL;
  e->ep_dev = NULL;
  e->ep_rows = e->ep_zero = NULL;
}

void ferry__dev_use(struct ferry_engine *e, int32_t d) {
  if (!ferry__mgpu_on(e) || d == e->cur_dev) return;
  const struct dev_state *v = &e->devs[d];
  e->cur_dev = d;
  e->q_compute = e->cq = v->q_compute;
  e->pinned_buf = v->pinned;
  e->kv_buf = v->kv;
  e->ws_buf = e->cws = v->ws;
}

struct ferry_ref ferry__mgpu_weight(const struct ferry_engine *e, const struct tensor_loc *loc) {
  return (struct ferry_ref){e->devs[e->cur_dev].shard, loc->shard_offset, loc->dtype};
}

#define TRY(call)                                       \
  do {                                                  \
    ferry_status st_ = (call);                          \
    if (st_ != FERRY_OK) return exec_error(e, st_);     \
  } while (0)

ferry_status ferry__mgpu_allreduce(struct ferry_engine *e, uint64_t off, int64_t n) {
  struct dev_state *v0 = &e->devs[0];
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_ALLREDUCE;
  k.name = "allreduce";
  k.layer = k.expert = -1;
  k.m = e->n_dev;
  k.n = n;
  k.x = (struct ferry_ref){v0->ws, off, FERRY_DTYPE_F32};
  for (int32_t d = 1; d < e->n_dev; d++) {
    k.aux[d - 1] = (struct ferry_ref){e->devs[d].ws, off, FERRY_DTYPE_F32};
    TRY(ferry_exec_record(e->ex, e->devs[d].q_compute, e->devs[d].done));
    TRY(ferry_exec_queue_wait(e->ex, v0->q_compute, e->devs[d].done));
  }
  TRY(ferry_exec_compute(e->ex, v0->q_compute, &k));
  TRY(ferry_exec_record(e->ex, v0->q_compute, v0->done));
  for (int32_t d = 1; d < e->n_dev; d++) TRY(ferry_exec_queue_wait(e->ex, e->devs[d].q_compute, v0->done));
  return FERRY_OK;
}

ferry_status ferry__mgpu_send(struct ferry_engine *e, int32_t from, int32_t to) {
  const struct dev_state *a = &e->devs[from], *b = &e->devs[to];
  const struct microbatch *mb = &e->mbs[e->cur_mb];
  TRY(ferry_exec_record(e->ex, a->q_compute, a->done));
  TRY(ferry_exec_queue_wait(e->ex, e->q_peer, a->done));
  TRY(ferry_exec_copy(e->ex, e->q_peer, (struct ferry_ref){b->ws, mb->x, FERRY_DTYPE_F32},
                      (struct ferry_ref){a->ws, mb->x, FERRY_DTYPE_F32},
                      (uint64_t)mb->n_tok * (uint64_t)e->mc->hidden * 4));
  TRY(ferry_exec_record(e->ex, e->q_peer, e->mb_sent[e->cur_mb]));
  return FERRY_OK;
}

ferry_status ferry__mgpu_receive(struct ferry_engine *e) {
  TRY(ferry_exec_queue_wait(e->ex, e->q_compute, e->mb_sent[e->cur_mb]));
  return FERRY_OK;
}

/* Bytes [src, src + len) of the weights into device d's shard buffer at dst, through the
 * bounce buffer; rows > 1 reads `rows` pieces of len at src + i * stride into one copy. */
static ferry_status load_piece(struct ferry_engine *e, int32_t d, uint32_t file, uint64_t src, uint64_t stride,
                               int64_t rows, uint64_t len, uint64_t dst) {
  const struct ferry_ref bounce = {e->bounce_buf, 0, FERRY_DTYPE_U8};
  for (int64_t i = 0; i < rows; i++)
    TRY(ferry_exec_read(e->ex, e->q_disk, e->store, file, src + (uint64_t)i * stride, len,
                        (struct ferry_ref){e->bounce_buf, (uint64_t)i * len, FERRY_DTYPE_U8}, 0));
  TRY(ferry_exec_drain(e->ex));
  TRY(ferry_exec_copy(e->ex, e->q_h2d, (struct ferry_ref){e->devs[d].shard, dst, FERRY_DTYPE_U8}, bounce,
                      (uint64_t)rows * len));
  TRY(ferry_exec_drain(e->ex));
  return FERRY_OK;
}

/* Device d's slice of a sharded tensor: rows [d R/N, (d+1) R/N) (SHARD_ROWS), or the same
 * part of every row (SHARD_COLS). The simulator moves the slice's bytes as one range (it has
 * no bytes to place, and a load's time depends on how many, not where they go). */
static ferry_status load_slice(struct ferry_engine *e, const struct tensor_loc *loc, const struct ferry_tensor_desc *t,
                               int32_t d) {
  const uint64_t es = ferry_dtype_size(loc->dtype), rows = (uint64_t)t->shape[0];
  const uint64_t row_bytes = (t->ndim == 2 ? (uint64_t)t->shape[1] : 1) * es, N = (uint64_t)e->tp;
  const uint64_t slice = t->numel * es / N, half = e->bounce_bytes / 2;
  if (loc->sharded == SHARD_COLS && e->has_data) {
    const uint64_t len = row_bytes / N, per = half / len ? half / len : 1;
    for (uint64_t r = 0; r < rows; r += per) {
      const int64_t n = (int64_t)(rows - r < per ? rows - r : per);
      ferry_status st = load_piece(e, d, loc->file, loc->file_offset + r * row_bytes + (uint64_t)d * len, row_bytes, n,
                                   len, loc->shard_offset + r * len);
      if (st != FERRY_OK) return st;
    }
    return FERRY_OK;
  }
  const uint64_t first = loc->file_offset + (uint64_t)d * slice; /* SHARD_ROWS: contiguous rows */
  for (uint64_t done = 0; done < slice; done += half) {
    const uint64_t n = slice - done < half ? slice - done : half;
    ferry_status st = load_piece(e, d, loc->file, first + done, 0, 1, n, loc->shard_offset + done);
    if (st != FERRY_OK) return st;
  }
  return FERRY_OK;
}

/* Expert parallel: the zero row after each device's expert_out, written once. */
static ferry_status zero_rows(struct ferry_engine *e) {
  const uint64_t bytes = (uint64_t)e->mc->hidden * 4;
  char *host = ferry_exec_buf_host_ptr(e->ex, e->bounce_buf);
  if (host) memset(host, 0, bytes); /* the simulator has no bytes */
  for (int32_t d = 0; d < e->n_dev; d++)
    TRY(ferry_exec_copy(e->ex, e->q_h2d, (struct ferry_ref){e->devs[d].ws, e->ws.zero, FERRY_DTYPE_F32},
                        (struct ferry_ref){e->bounce_buf, 0, FERRY_DTYPE_F32}, bytes));
  TRY(ferry_exec_drain(e->ex));
  return FERRY_OK;
}

ferry_status ferry__mgpu_load_shards(struct ferry_engine *e) {
  if (e->ep) {
    ferry_status st = zero_rows(e);
    if (st != FERRY_OK) return st;
  }
  if (e->tp < 2) return FERRY_OK;
  const size_t n = ferry_model_tensor_count(e->model);
  for (size_t i = 0; i < n; i++) {
    const struct tensor_loc *loc = &e->tensors[i];
    if (!loc->sharded) continue;
    for (int32_t d = 0; d < e->n_dev; d++) {
      ferry_status st = load_slice(e, loc, ferry_model_tensor(e->model, i), d);
      if (st != FERRY_OK) return st;
    }
  }
  return FERRY_OK;
}

/* Where a sharded tensor sits in every device's shard buffer (the same place on each). */
uint64_t ferry__mgpu_place_shard(struct ferry_engine *e, const struct ferry_tensor_desc *t, enum ferry_dtype dt) {
  const uint64_t at = e->shard_bytes;
  e->shard_bytes += (t->numel * ferry_dtype_size(dt) / (uint64_t)e->tp + SHARD_ALIGN - 1) / SHARD_ALIGN * SHARD_ALIGN;
  return at;
}

/* A gather kernel of m rows of the hidden size from workspace offset src into dst. */
static ferry_status gather(struct ferry_engine *e, int32_t l, const char *name, uint64_t src, uint64_t dst, int64_t m,
                           const int32_t *rows) {
  struct ferry_kernel g;
  memset(&g, 0, sizeof g);
  g.kind = FERRY_K_GATHER_ROWS;
  g.name = name;
  g.layer = l;
  g.expert = -1;
  g.x = ferry__ws(e, src);
  g.y = ferry__ws(e, dst);
  g.m = m;
  g.n = e->mc->hidden;
  g.ints = rows;
  g.n_ints = m;
  TRY(ferry_exec_compute(e->ex, e->cq, &g));
  return FERRY_OK;
}

ferry_status ferry__mgpu_ep_combine(struct ferry_engine *e, int32_t l) {
  const struct ferry_model_config *mc = e->mc;
  const int64_t T = e->n_tok, K = mc->experts_per_token, TK = T * K;
  ferry_status st;
  for (int32_t d = 0; d < e->n_dev; d++) {
    ferry__dev_use(e, d);
    int32_t *rows = e->ep_rows + (size_t)d * (size_t)e->cfg.max_step_tokens * (size_t)K;
    for (int64_t p = 0; p < TK; p++)
      rows[p] = ferry__mgpu_expert_dev(e, l, e->routing_ids[p]) == d ? (int32_t)p : e->ep_zero[0];
    /* the first device adds its rows (and the shared expert) to x; the others start from zero */
    if ((d && (st = gather(e, l, "ep_zero_x", e->ws.expert_out, e->ws.x, T, e->ep_zero))) ||
        (st = gather(e, l, "ep_own_pairs", e->ws.expert_out, e->ws.expert_final, TK, rows)))
      return st;
    struct ferry_kernel ck;
    memset(&ck, 0, sizeof ck);
    ck.kind = FERRY_K_MOE_COMBINE;
    ck.name = "moe_combine";
    ck.layer = l;
    ck.expert = -1;
    ck.y = ferry__ws(e, e->ws.x);
    ck.aux[0] = ferry__ws(e, e->ws.expert_final);
    if (!mc->expert_scale_input) ck.aux[1] = ferry__ws(e, e->ws.topk_w);
    if (!d && mc->n_shared_experts) ck.aux[2] = ferry__ws(e, e->ws.sout);
    if (!d && mc->shared_expert_gate) ck.aux[3] = ferry__ws(e, e->ws.sgate);
    ck.m = T;
    ck.n = mc->hidden;
    ck.top_k = K;
    TRY(ferry_exec_compute(e->ex, e->cq, &ck));
  }
  return ferry__mgpu_allreduce(e, e->ws.x, T * mc->hidden);
}

void ferry__mgpu_print(const struct ferry_engine *e, FILE *f) {
  if (!ferry__mgpu_on(e)) return;
  char b[4][32];
  fprintf(f, "  split over %d devices (%s), each with the budget (the plan's lines after these are before the split)\n", e->n_dev,
          parallel_name(e->cfg.parallel));
  for (int32_t d = 0; d < e->n_dev; d++)
    fprintf(f, "    device %d         pinned %s, weight shards %s, KV cache %s, workspace %s\n", d,
            ferry__format_bytes(e->devs[d].pinned_bytes, b[0], 32), ferry__format_bytes(e->shard_bytes, b[1], 32),
            ferry__format_bytes(e->kv_dev_bytes, b[2], 32), ferry__format_bytes(e->ws.charged, b[3], 32));
}
