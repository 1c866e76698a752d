/* The unit table: which tensors move together (a pinned layer part, a block of layers, one
 * expert), the file ranges each unit is read from, and where every tensor sits inside its
 * unit's device copy. Built from the plan, so the forward pass can look up any weight the same
 * way whether it is pinned, in a block slot or in the expert cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "engine_impl.h"
#include "common/json.h"
#include "ferry/quant.h"
#include "ferry/store.h"

#define RANGE_ALIGN 64u

enum group { G_GLOBAL, G_ATTN, G_FFN, G_EXPERT, G_EMBED, G_HEAD };

/* The model's weights outside the layers: with --stream-embeddings the embeddings and the head
 * are units of their own (streamed when the plan does not pin everything), the rest (routers
 * kept for lookahead) stays with the pinned global unit. */
static enum group global_group(const struct ferry_engine *e, enum ferry_tensor_role role) {
  if (!e->cfg.stream_embeddings) return G_GLOBAL;
  switch (role) {
    case FERRY_ROLE_EMBED:
    case FERRY_ROLE_POS_EMBED:
    case FERRY_ROLE_EMBED_NORM:
    case FERRY_ROLE_EMBED_NORM_BIAS: return G_EMBED;
    case FERRY_ROLE_FINAL_NORM:
    case FERRY_ROLE_FINAL_NORM_BIAS:
    case FERRY_ROLE_LM_HEAD:
    case FERRY_ROLE_LM_HEAD_BIAS: return G_HEAD;
    default: return G_GLOBAL;
  }
}

/* A tied head streamed on its own needs the token table in its unit as well: a second entry
 * (index = the model's tensor count) with the table's file ranges, fetched again before the
 * logits as ZeRO-3 fetches the shared Parameter again for lm_head. Its index in the model, or -1. */
static int32_t tied_table(const struct ferry_engine *e) {
  if (!e->cfg.stream_embeddings || !e->mc->tied_embeddings) return -1;
  size_t n = ferry_model_tensor_count(e->model);
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(e->model, i);
    if (t->layer < 0 && t->role == FERRY_ROLE_EMBED) return (int32_t)i;
  }
  return -1;
}

/* routers_resident: every layer's router lives with the global weights, so a layer can apply
 * the routers of the layers after it (gate lookahead) whatever block is on the device. */
static enum group tensor_group(const struct ferry_engine *e, const struct ferry_tensor_desc *t,
                               int routers_resident) {
  if (t->layer < 0) return global_group(e, t->role);
  if (routers_resident && (t->role == FERRY_ROLE_ROUTER || t->role == FERRY_ROLE_ROUTER_BIAS)) return G_GLOBAL;
  if (t->expert >= 0) return e->cfg.expert_granularity_layer ? G_FFN : G_EXPERT; /* with its layer, or alone */
  switch (t->role) {
    case FERRY_ROLE_FFN_NORM:
    case FERRY_ROLE_FFN_NORM_BIAS:
    case FERRY_ROLE_POST_FFN_NORM:
      /* an MoE layer's FFN is its experts: the norm stays with attention */
      return e->li[t->layer].moe ? G_ATTN : G_FFN;
    case FERRY_ROLE_FFN_GATE:
    case FERRY_ROLE_FFN_UP:
    case FERRY_ROLE_FFN_UP_BIAS:
    case FERRY_ROLE_FFN_DOWN:
    case FERRY_ROLE_FFN_DOWN_BIAS:
      return G_FFN;
    default:
      return G_ATTN; /* attention, norms, router, shared expert */
  }
}

/* The slot of a routed expert's tensor in expert_tensor, -1 for other roles. */
static int expert_slot(enum ferry_tensor_role role) {
  switch (role) {
    case FERRY_ROLE_EXPERT_GATE: return EXPERT_GATE;
    case FERRY_ROLE_EXPERT_UP: return EXPERT_UP;
    case FERRY_ROLE_EXPERT_DOWN: return EXPERT_DOWN;
    case FERRY_ROLE_EXPERT_GATE_UP: return EXPERT_GATE_UP;
    case FERRY_ROLE_EXPERT_GATE_UP_BIAS: return EXPERT_GATE_UP_BIAS;
    case FERRY_ROLE_EXPERT_DOWN_BIAS: return EXPERT_DOWN_BIAS;
    default: return -1;
  }
}

/* Where a tensor's bytes are: one part for a plain tensor, up to FERRY_QPART_COUNT for a
 * quantized one (packed codes, scales, zeros, ...), in the files (store) or in a virtual file
 * laid out in model order (no store: simulation). */
struct part_file {
  uint32_t file;
  uint64_t offset, bytes;
  enum ferry_dtype dtype;
};

struct tensor_file {
  int n_parts;
  int quantized;
  struct ferry_qspec spec;
  struct part_file part[FERRY_QPART_COUNT]; /* indexed by ferry_qpart when quantized */
  uint64_t bytes;                           /* all parts */
};

/* The "ferry.quant" metadata of a quantized folder: tensor name -> format. */
static cJSON *quant_map(struct ferry_engine *e, ferry_status *st) {
  const char *meta = e->store ? ferry_store_metadata(e->store, "ferry.quant") : NULL;
  if (!meta) return NULL;
  cJSON *map = NULL;
  if (ferry__json_parse(meta, strlen(meta), "ferry.quant metadata", &map, &e->err) != FERRY_OK || !cJSON_IsObject(map)) {
    cJSON_Delete(map);
    *st = ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: __metadata__ ferry.quant is not a JSON object of formats",
                         ferry_store_file_path(e->store, 0));
    return NULL;
  }
  return map;
}

/* The parts of quantized tensor t: each must exist with the dtype and shape its format and
 * the tensor's shape imply, or the scales would not match the weights. */
static ferry_status quantized_parts(struct ferry_engine *e, const struct ferry_tensor_desc *t, const char *spec_name,
                                    struct tensor_file *out) {
  const char *file0 = ferry_store_file_path(e->store, 0);
  if (ferry_quant_spec_parse(spec_name, &out->spec) != FERRY_OK)
    return ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: tensor %s: unknown quantization format \"%s\"", file0, t->name,
                          spec_name);
  if (t->ndim != 2)
    return ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: tensor %s is %d-dimensional and cannot be quantized", file0,
                          t->name, t->ndim);
  struct ferry_qlayout lay;
  if (ferry_quant_layout(&out->spec, t->shape[0], t->shape[1], &lay) != FERRY_OK)
    return ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: tensor %s: %s", file0, t->name, ferry_last_error());
  char prefix[96], name[128];
  size_t n = strlen(t->name);
  if (n > 7 && !strcmp(t->name + n - 7, ".weight")) n -= 7;
  snprintf(prefix, sizeof prefix, "%.*s", (int)n, t->name);
  out->quantized = 1;
  out->n_parts = FERRY_QPART_COUNT;
  for (int p = 0; p < FERRY_QPART_COUNT; p++) {
    if (!lay.part[p].suffix) continue;
    snprintf(name, sizeof name, "%s.%s", prefix, lay.part[p].suffix);
    const struct ferry_store_tensor *s = ferry_store_find(e->store, name);
    if (!s)
      return ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: quantized tensor %s (%s) has no part %s", file0, t->name,
                            spec_name, name);
    int same = s->dtype == lay.part[p].dtype && s->ndim == lay.part[p].ndim && s->nbytes == lay.part[p].bytes;
    for (int d = 0; same && d < s->ndim; d++) same = s->shape[d] == lay.part[p].shape[d];
    if (!same)
      return ferry__err_set(&e->err, FERRY_ERR_FORMAT,
                            "%s: %s has dtype %s and %llu bytes, but %s of %s [%lld, %lld] needs %s with %llu bytes "
                            "(scales that do not match their weights)",
                            ferry_store_file_path(e->store, s->file), name, ferry_dtype_st_name(s->dtype),
                            (unsigned long long)s->nbytes, spec_name, t->name, (long long)t->shape[0],
                            (long long)t->shape[1], ferry_dtype_st_name(lay.part[p].dtype),
                            (unsigned long long)lay.part[p].bytes);
    out->part[p] = (struct part_file){s->file, s->offset, s->nbytes, s->dtype};
    out->bytes += s->nbytes;
  }
  return FERRY_OK;
}

/* The format a tensor quantized as published is stored in, from the config's
 * quantization_config; FERRY_ERR_UNSUPPORTED for variants ferry cannot dequantize. */
static ferry_status published_spec(struct ferry_engine *e, const struct ferry_tensor_desc *t, enum ferry_dtype scale_dt,
                                   struct ferry_qspec *spec) {
  const struct ferry_ckpt_quant_config *q = &e->mc->quant;
  spec->group_size = (int32_t)q->group_size;
  switch (q->kind) {
    case FERRY_CKPT_GPTQ: spec->format = FERRY_QFORMAT_GPTQ4; break;
    case FERRY_CKPT_AWQ: spec->format = FERRY_QFORMAT_AWQ4; break;
    case FERRY_CKPT_COMPRESSED:
      spec->format = scale_dt == FERRY_DTYPE_F16 ? FERRY_QFORMAT_CT4F16 : FERRY_QFORMAT_CT4;
      if (!q->symmetric)
        return ferry__err_set(&e->err, FERRY_ERR_UNSUPPORTED, "%s: asymmetric compressed-tensors weights are not read",
                              t->name);
      break;
    case FERRY_CKPT_MXFP4: spec->format = FERRY_QFORMAT_MXFP4, spec->group_size = 0; break;
    case FERRY_CKPT_FP8_BLOCK:
      spec->format = FERRY_QFORMAT_FP8B, spec->group_size = 0;
      if (q->block[0] != 128 || q->block[1] != 128)
        return ferry__err_set(&e->err, FERRY_ERR_UNSUPPORTED, "%s: fp8 blocks of %lld x %lld (read: 128 x 128)", t->name,
                              (long long)q->block[0], (long long)q->block[1]);
      break;
    case FERRY_CKPT_NONE: return ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "%s: not quantized", t->name);
  }
  if (q->kind != FERRY_CKPT_MXFP4 && q->kind != FERRY_CKPT_FP8_BLOCK && q->bits != 4)
    return ferry__err_set(&e->err, FERRY_ERR_UNSUPPORTED, "%s: %d-bit %s weights are not read (4-bit are)", t->name,
                          q->bits, q->kind == FERRY_CKPT_GPTQ ? "GPTQ" : q->kind == FERRY_CKPT_AWQ ? "AWQ" : "compressed-tensors");
  if (ferry_quant_spec_check(spec) != FERRY_OK)
    return ferry__err_set(&e->err, FERRY_ERR_UNSUPPORTED, "%s: %s", t->name, ferry_last_error());
  return FERRY_OK;
}

/* A tensor quantized as published: its parts under the names its tool gives them ("x.qweight",
 * "x.weight_scale", "x_blocks"), each checked against the shape the format implies; the slice of
 * a fused [experts, ...] checkpoint tensor for one expert. */
static ferry_status published_parts(struct ferry_engine *e, const struct ferry_tensor_desc *t, struct tensor_file *out) {
  const char *file0 = ferry_store_file_path(e->store, 0);
  char prefix[112], name[160];
  size_t n = strlen(t->name);
  const int mx = e->mc->quant.kind == FERRY_CKPT_MXFP4;
  if (!mx && n > 7 && !strcmp(t->name + n - 7, ".weight")) n -= 7;
  snprintf(prefix, sizeof prefix, "%.*s", (int)n, t->name);
  /* compressed-tensors scales come in the model's dtype: look before choosing the format */
  snprintf(name, sizeof name, "%s.weight_scale", prefix);
  const struct ferry_store_tensor *sc = ferry_store_find(e->store, name);
  ferry_status st = published_spec(e, t, sc ? sc->dtype : FERRY_DTYPE_BF16, &out->spec);
  if (st != FERRY_OK) return st;
  struct ferry_qlayout lay;
  if (ferry_quant_layout(&out->spec, t->shape[0], t->shape[1], &lay) != FERRY_OK)
    return ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: tensor %s: %s", file0, t->name, ferry_last_error());
  out->quantized = 1;
  out->n_parts = FERRY_QPART_COUNT;
  const int lead = t->slice >= 0;
  for (int p = 0; p < FERRY_QPART_COUNT; p++) {
    if (!lay.part[p].suffix) continue;
    snprintf(name, sizeof name, "%s%s%s", prefix, mx ? "_" : ".", lay.part[p].suffix);
    const struct ferry_store_tensor *s = ferry_store_find(e->store, name);
    if (!s)
      return ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: tensor %s, quantized as published, has no part %s", file0,
                            t->name, name);
    int same = s->dtype == lay.part[p].dtype && s->ndim == lay.part[p].ndim + lead && (!lead || s->shape[0] == t->n_slices);
    for (int d = 0; same && d < lay.part[p].ndim; d++) same = s->shape[d + lead] == lay.part[p].shape[d];
    const uint64_t bytes = lead ? s->nbytes / (uint64_t)t->n_slices : s->nbytes;
    if (!same || bytes != lay.part[p].bytes)
      return ferry__err_set(&e->err, FERRY_ERR_FORMAT,
                            "%s: %s has dtype %s and %llu bytes%s, but %s [%lld, %lld] stored as %s needs %s with %llu "
                            "bytes",
                            ferry_store_file_path(e->store, s->file), name, ferry_dtype_st_name(s->dtype),
                            (unsigned long long)bytes, lead ? " per expert" : "", t->name, (long long)t->shape[0],
                            (long long)t->shape[1], ferry_quant_spec_name(&out->spec, prefix, sizeof prefix),
                            ferry_dtype_st_name(lay.part[p].dtype), (unsigned long long)lay.part[p].bytes);
    out->part[p] = (struct part_file){s->file, s->offset + (lead ? (uint64_t)t->slice * bytes : 0), bytes, s->dtype};
    out->bytes += bytes;
  }
  return FERRY_OK;
}

/* A tensor stored unquantized (F32, F16 or BF16), or one slice of a fused [n_slices, ...] tensor. */
static ferry_status stored_parts(struct ferry_engine *e, const struct ferry_tensor_desc *t, struct tensor_file *out) {
  const struct ferry_store_tensor *s = ferry_store_find(e->store, t->name);
  if (!s) {
    return ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: tensor %s required by the model is missing",
                         ferry_store_file_path(e->store, 0), t->name);
  }
  /* a slice of a fused [n_slices, ...] tensor: its shape after the leading dimension */
  const int lead = t->slice >= 0;
  int same = s->ndim == t->ndim + lead && (!lead || s->shape[0] == t->n_slices);
  for (int d = 0; same && d < t->ndim; d++) same = s->shape[d + lead] == t->shape[d];
  if (!same) {
    return ferry__err_set(&e->err, FERRY_ERR_FORMAT,
                         "%s: tensor %s has %d dims [%lld, %lld, ...], the model expects %s[%lld, %lld]",
                         ferry_store_file_path(e->store, s->file), t->name, s->ndim, (long long)s->shape[0],
                         (long long)(s->ndim > 1 ? s->shape[1] : 0), lead ? "n_experts x " : "",
                         (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0));
  }
  if (s->dtype != FERRY_DTYPE_F32 && s->dtype != FERRY_DTYPE_F16 && s->dtype != FERRY_DTYPE_BF16) {
    return ferry__err_set(&e->err, FERRY_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (expected F32, F16 or BF16)",
                         ferry_store_file_path(e->store, s->file), t->name, ferry_dtype_st_name(s->dtype));
  }
  const uint64_t bytes = lead ? s->nbytes / (uint64_t)t->n_slices : s->nbytes;
  out->n_parts = 1;
  out->part[0] = (struct part_file){s->file, s->offset + (lead ? (uint64_t)t->slice * bytes : 0), bytes, s->dtype};
  out->bytes = bytes;
  return FERRY_OK;
}

/* A simulated quantized tensor: its parts move and sit in memory at their packed size, laid
 * out one after another from *virtual_offset. Packed formats hold [out, in] rows, so a tensor
 * stored [in, out] (a bf16 fused expert) is packed as its transpose. */
static ferry_status virtual_quant_parts(struct ferry_engine *e, const struct ferry_tensor_desc *t,
                                        uint64_t *virtual_offset, struct tensor_file *out) {
  struct ferry_qlayout lay;
  const int64_t rows = t->transposed ? t->shape[1] : t->shape[0], cols = t->transposed ? t->shape[0] : t->shape[1];
  if (ferry_quant_layout(&out->spec, rows, cols, &lay) != FERRY_OK)
    return ferry__err_set(&e->err, FERRY_ERR_INVALID, "%s: %s", t->name, ferry_last_error());
  out->quantized = 1;
  out->n_parts = FERRY_QPART_COUNT;
  for (int p = 0; p < FERRY_QPART_COUNT; p++) {
    if (!lay.part[p].suffix) continue;
    out->part[p] = (struct part_file){0, *virtual_offset, lay.part[p].bytes, lay.part[p].dtype};
    *virtual_offset += lay.part[p].bytes;
    out->bytes += lay.part[p].bytes;
  }
  return FERRY_OK;
}

static struct tensor_file *tensor_files(struct ferry_engine *e, ferry_status *st) {
  size_t n = ferry_model_tensor_count(e->model);
  struct tensor_file *tf = ferry__calloc(n + 1, sizeof *tf); /* + a tied head's table (tied_table) */
  if (!tf) {
    *st = ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
    return NULL;
  }
  *st = FERRY_OK;
  cJSON *qmap = quant_map(e, st);
  if (*st != FERRY_OK) goto fail;
  uint64_t virtual_offset = 0;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(e->model, i);
    if (e->store && t->quantized) {
      if ((*st = published_parts(e, t, &tf[i])) != FERRY_OK) goto fail;
    } else if (e->store) {
      const cJSON *q = qmap ? cJSON_GetObjectItemCaseSensitive(qmap, t->name) : NULL;
      if (q) {
        if (!cJSON_IsString(q) || (*st = quantized_parts(e, t, q->valuestring, &tf[i])) != FERRY_OK) {
          if (*st == FERRY_OK)
            *st = ferry__err_set(&e->err, FERRY_ERR_FORMAT, "%s: ferry.quant entry of %s is not a format name",
                                 ferry_store_file_path(e->store, 0), t->name);
          goto fail;
        }
        continue;
      }
      if ((*st = stored_parts(e, t, &tf[i])) != FERRY_OK) goto fail;
    } else if (t->quantized && !(e->cfg.quant_set && t->ndim == 2)) {
      /* simulated, quantized as published: its parts move and sit in memory at their packed
       * size, and each use dequantizes them first (a --quant plan sizes a preset's weights in
       * its formats instead, the published ones included: the plan says what the run holds) */
      if ((*st = published_spec(e, t, FERRY_DTYPE_BF16, &tf[i].spec)) != FERRY_OK ||
          (*st = virtual_quant_parts(e, t, &virtual_offset, &tf[i])) != FERRY_OK)
        goto fail;
    } else if (e->cfg.quant_set && t->ndim == 2 &&
               e->cfg.quant.spec[ferry_quant_class_of_role(t->role)].format > FERRY_QFORMAT_BF16) {
      /* simulated quantized model: the parts' sizes from the format's layout */
      tf[i].spec = e->cfg.quant.spec[ferry_quant_class_of_role(t->role)];
      if ((*st = virtual_quant_parts(e, t, &virtual_offset, &tf[i])) != FERRY_OK) goto fail;
    } else {
      enum ferry_dtype dt = e->mc->dtype;
      if (e->cfg.quant_set && t->ndim == 2) {
        enum ferry_qformat f = e->cfg.quant.spec[ferry_quant_class_of_role(t->role)].format;
        dt = f == FERRY_QFORMAT_FP16 ? FERRY_DTYPE_F16 : f == FERRY_QFORMAT_BF16 ? FERRY_DTYPE_BF16 : FERRY_DTYPE_F32;
      }
      uint64_t bytes = t->numel * ferry_dtype_size(dt);
      tf[i].n_parts = 1;
      tf[i].part[0] = (struct part_file){0, virtual_offset, bytes, dt};
      tf[i].bytes = bytes;
      virtual_offset += bytes;
    }
  }
  cJSON_Delete(qmap);
  const int32_t tied = tied_table(e);
  if (tied >= 0) tf[n] = tf[tied];
  return tf;
fail:
  cJSON_Delete(qmap);
  ferry_free(tf);
  return NULL;
}

/* The weights the CPU's attention reads when the layer it attends for may be on the device
 * (forward.c attend(), mla_part()): a layer's attention sinks (gpt-oss) and its kv_b_proj (MLA,
 * absorbed into the latent attention). */
static const enum ferry_tensor_role mirror_roles[N_MIRROR_ROLES] = {FERRY_ROLE_ATTN_SINKS, FERRY_ROLE_MLA_KV_B};

static int mirror_role(enum ferry_tensor_role role) {
  for (int r = 0; r < N_MIRROR_ROLES; r++)
    if (mirror_roles[r] == role) return r;
  return -1;
}

/* Whether the run keeps those copies: --kv-home host or disk (the CPU attends for every layer). */
static int mirrored_run(const struct ferry_engine *e) { return e->cfg.kv_home_host && ferry__hybrid_on(e); }

/* The bytes tensor i's parts take in the mirror, each at a RANGE_ALIGN boundary (0: not mirrored). */
static uint64_t mirror_span(const struct ferry_engine *e, const struct ferry_tensor_desc *t,
                            const struct tensor_file *tf) {
  if (!mirrored_run(e) || t->layer < 0 || t->expert >= 0 || mirror_role(t->role) < 0) return 0;
  uint64_t span = 0;
  for (int p = 0; p < tf->n_parts; p++) span += (tf->part[p].bytes + RANGE_ALIGN - 1) / RANGE_ALIGN * RANGE_ALIGN;
  return span;
}

ferry_status ferry__engine_load_mirror(struct ferry_engine *e) {
  if (!e->mirror_bytes) return FERRY_OK;
  const size_t slots = (size_t)e->mc->n_layers * N_MIRROR_ROLES * FERRY_QPART_COUNT;
  if (!e->mirror_off && !(e->mirror_off = ferry__calloc(slots, sizeof *e->mirror_off)))
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  for (size_t i = 0; i < slots; i++) e->mirror_off[i] = UINT64_MAX;
  ferry_status st = FERRY_OK;
  struct tensor_file *tf = tensor_files(e, &st);
  if (!tf) return st;
  const size_t n = ferry_model_tensor_count(e->model);
  uint64_t pos = 0;
  for (size_t i = 0; i < n && st == FERRY_OK; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(e->model, i);
    if (!mirror_span(e, t, &tf[i])) continue;
    uint64_t *off = &e->mirror_off[((size_t)t->layer * N_MIRROR_ROLES + (size_t)mirror_role(t->role)) * FERRY_QPART_COUNT];
    for (int p = 0; p < tf[i].n_parts && st == FERRY_OK; p++) {
      const struct part_file *pf = &tf[i].part[p];
      if (!pf->bytes && tf[i].quantized) continue; /* as pack_unit(): a part this format has not */
      if (pos + pf->bytes > e->mirror_bytes) {
        st = ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "engine: the weights mirrored for the CPU exceed the plan");
        break;
      }
      off[p] = pos;
      st = ferry_exec_read(e->ex, e->q_disk, e->store, pf->file, pf->offset, pf->bytes,
                           (struct ferry_ref){e->hws_buf, e->ws.mirror + pos, pf->dtype},
                           e->cfg.read_flags & FERRY_READ_DROP_CACHE);
      if (st != FERRY_OK) st = ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
      pos += (pf->bytes + RANGE_ALIGN - 1) / RANGE_ALIGN * RANGE_ALIGN;
    }
  }
  ferry_free(tf);
  if (st == FERRY_OK && (st = ferry_exec_drain(e->ex)) != FERRY_OK)
    st = ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  return st;
}

/* Where the CPU's copy of tensor (role, layer)'s part p is in the mirror, or UINT64_MAX: none, or
 * the ops are not the CPU's (a streamed unit's host copy, or the device's own, serves them). */
static uint64_t mirror_at(const struct ferry_engine *e, enum ferry_tensor_role role, int32_t layer, int p) {
  if (!e->w_host || !e->mirror_off || layer < 0) return UINT64_MAX; /* before the role: every lookup passes */
  const int r = mirror_role(role);
  if (r < 0) return UINT64_MAX;
  return e->mirror_off[((size_t)layer * N_MIRROR_ROLES + (size_t)r) * FERRY_QPART_COUNT + (size_t)p];
}

ferry_status ferry__engine_plan_input(struct ferry_engine *e, struct ferry_plan_input *in, uint64_t **attn,
                                      uint64_t **ffn) {
  const struct ferry_model_config *mc = e->mc;
  ferry_status st = FERRY_OK;
  struct tensor_file *tf = tensor_files(e, &st);
  if (!tf) return st;
  *attn = ferry__calloc((size_t)mc->n_layers, sizeof **attn);
  *ffn = ferry__calloc((size_t)mc->n_layers, sizeof **ffn);
  if (!*attn || !*ffn) {
    ferry_free(tf);
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  }
  memset(in, 0, sizeof *in);
  in->n_layers = (int32_t)mc->n_layers;
  in->n_experts = e->cfg.expert_granularity_layer ? 0 : (int32_t)mc->n_experts; /* no expert cache */
  in->experts_per_token = (int32_t)mc->experts_per_token;
  uint64_t *expert_sum = ferry__calloc((size_t)(mc->n_layers * (mc->n_experts ? mc->n_experts : 1)), sizeof(uint64_t));
  if (!expert_sum) {
    ferry_free(tf);
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  }
  size_t n = ferry_model_tensor_count(e->model);
  e->mirror_bytes = 0;
  /* Each tensor may start a range aligned to RANGE_ALIGN: count that slack so packed units
   * always fit the slot sizes planned from these figures. */
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(e->model, i);
    e->mirror_bytes += mirror_span(e, t, &tf[i]);
    if (ferry__mgpu_shard(e, t->role) != SHARD_NONE) continue; /* in the devices' shard buffers, not units */
    uint64_t b = tf[i].bytes + RANGE_ALIGN * (uint64_t)tf[i].n_parts;
    if (tf[i].quantized && t->numel > e->max_q_numel) e->max_q_numel = t->numel;
    switch (tensor_group(e, t, e->cfg.router_lookahead)) {
      case G_GLOBAL: in->global_bytes += b; break;
      case G_EMBED: in->embed_bytes += b; break;
      case G_HEAD: in->head_bytes += b; break;
      case G_ATTN: (*attn)[t->layer] += b; break;
      case G_FFN: (*ffn)[t->layer] += b; break;
      case G_EXPERT: expert_sum[t->layer * mc->n_experts + t->expert] += b; break;
    }
  }
  if (tied_table(e) >= 0) { /* the head's copy of the table; one copy when pinned */
    in->head_shared_bytes = tf[n].bytes + RANGE_ALIGN * (uint64_t)tf[n].n_parts;
    in->head_bytes += in->head_shared_bytes;
  }
  for (int64_t i = 0; i < mc->n_layers * mc->n_experts; i++)
    if (expert_sum[i] > in->expert_bytes) in->expert_bytes = expert_sum[i];
  in->attn_bytes = *attn;
  in->ffn_bytes = *ffn;
  in->disk_available = e->store != NULL || !e->has_data;
  ferry_free(expert_sum);
  ferry_free(tf);
  return FERRY_OK;
}

/* One contiguous piece of a tensor in the files: a plain tensor or one part of a quantized one. */
struct piece {
  int32_t tensor, part;
  const struct part_file *f;
};

static int cmp_piece(const void *a, const void *b) {
  const struct part_file *x = ((const struct piece *)a)->f, *y = ((const struct piece *)b)->f;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Give unit u its ranges and its tensors (and their parts) their offsets inside it. */
static ferry_status pack_unit(struct ferry_engine *e, int32_t u, const int32_t *members, int32_t n_members,
                              const struct tensor_file *tf) {
  struct unit *un = &e->units[u];
  int32_t n_pieces = 0;
  for (int32_t i = 0; i < n_members; i++) n_pieces += tf[members[i]].n_parts;
  struct piece *pc = ferry__calloc((size_t)(n_pieces ? n_pieces : 1), sizeof *pc);
  un->ranges = ferry__calloc((size_t)(n_pieces ? n_pieces : 1), sizeof *un->ranges);
  if (!pc || !un->ranges) {
    ferry_free(pc);
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  }
  int32_t k = 0;
  for (int32_t i = 0; i < n_members; i++) {
    const struct tensor_file *t = &tf[members[i]];
    for (int p = 0; p < t->n_parts; p++)
      if (t->part[p].bytes || !t->quantized) pc[k++] = (struct piece){members[i], p, &t->part[p]};
  }
  n_pieces = k;
  qsort(pc, (size_t)n_pieces, sizeof *pc, cmp_piece);
  uint64_t end = 0, stage = 0;
  for (int32_t i = 0; i < n_pieces; i++) {
    const struct part_file *t = pc[i].f;
    struct unit_range *r = un->n_ranges ? &un->ranges[un->n_ranges - 1] : NULL;
    size_t es = ferry_dtype_size(t->dtype);
    /* Extend the current range when the piece follows it in the same file and stays aligned
     * to its element size inside the unit. */
    if (r && r->file == t->file && r->file_offset + r->len == t->offset && (r->unit_offset + r->len) % es == 0) {
      r->len += t->bytes;
    } else {
      if (r) stage += ferry_store_direct_span(r->file_offset, r->len) + FERRY_DIRECT_ALIGN;
      r = &un->ranges[un->n_ranges++];
      r->file = t->file;
      r->file_offset = t->offset;
      r->len = t->bytes;
      r->unit_offset = (end + RANGE_ALIGN - 1) / RANGE_ALIGN * RANGE_ALIGN;
    }
    struct tensor_loc *loc = &e->tensors[pc[i].tensor];
    const struct tensor_file *tfi = &tf[pc[i].tensor];
    loc->unit = u;
    loc->present = 1;
    loc->quantized = tfi->quantized;
    loc->spec = tfi->spec;
    loc->part_offset[pc[i].part] = r->unit_offset + (t->offset - r->file_offset);
    loc->part_dtype[pc[i].part] = t->dtype;
    loc->part_mask |= 1u << pc[i].part;
    loc->packed_bytes = tfi->bytes;
    if (pc[i].part == 0) {
      loc->unit_offset = loc->part_offset[0];
      loc->dtype = t->dtype;
    }
    end = r->unit_offset + r->len;
  }
  if (un->n_ranges) {
    struct unit_range *r = &un->ranges[un->n_ranges - 1];
    stage += ferry_store_direct_span(r->file_offset, r->len) + FERRY_DIRECT_ALIGN;
  }
  un->bytes = end;
  un->stage_bytes = stage;
  ferry_free(pc);
  return FERRY_OK;
}

/* The units in a fixed order: global, pinned layer parts, blocks, experts. layer_unit[l] is
 * layer l's pinned unit (-1: none). Returns the number of units. */
static int32_t make_units(struct ferry_engine *e, int32_t *layer_unit) {
  const struct ferry_plan *p = &e->plan;
  const int32_t L = (int32_t)e->mc->n_layers, E = (int32_t)e->mc->n_experts;
  int32_t nu = 0;
  e->global_unit = nu;
  e->units[nu++] = (struct unit){.kind = UNIT_GLOBAL, .layer = -1, .expert = -1, .block = -1, .pinned = 1};
  for (int32_t l = 0; l < L; l++) {
    layer_unit[l] = -1;
    if (p->attn_pinned[l] || p->ffn_pinned[l]) {
      layer_unit[l] = nu;
      e->units[nu++] = (struct unit){.kind = UNIT_LAYER_PART, .layer = l, .n_layers = 1, .expert = -1, .block = -1,
                                     .pinned = 1};
    }
  }
  for (int32_t b = 0; b < p->n_blocks; b++) {
    e->block_unit[b] = nu;
    /* the streamed embeddings and head: blocks of no layer (layer -1) */
    e->units[nu++] = (struct unit){.kind = UNIT_BLOCK, .layer = p->blocks[b].n_layers ? p->blocks[b].first_layer : -1,
                                   .n_layers = p->blocks[b].n_layers, .expert = -1, .block = b,
                                   .home = p->blocks[b].home};
  }
  int32_t moe_rank = 0;
  for (int32_t l = 0; l < L; l++) {
    for (int32_t x = 0; x < E; x++) e->expert_unit[l * E + x] = -1;
    if (!e->li[l].moe || e->cfg.expert_granularity_layer) continue; /* experts in their layer's unit */
    for (int32_t x = 0; x < E; x++) {
      /* host homes go to the first experts in layer order, counting MoE layers only */
      int32_t idx = moe_rank * E + x;
      e->expert_unit[l * E + x] = nu;
      e->units[nu++] = (struct unit){.kind = UNIT_EXPERT, .layer = l, .n_layers = 1, .expert = x, .block = -1,
                                     .pinned = p->experts_pinned,
                                     .home = idx < p->experts_on_host ? FERRY_TIER_HOST : FERRY_TIER_DISK};
    }
    moe_rank++;
  }
  return nu;
}

/* Places: pinned units packed in the pinned buffer, host-homed units in the host buffer. */
static ferry_status place_units(struct ferry_engine *e) {
  const struct ferry_plan *p = &e->plan;
  uint64_t dev = 0, host = 0, fill[FERRY_EXEC_MAX_DEVICES] = {0};
  e->max_stage_extra = 0;
  const int32_t nu = e->n_units;
  for (int32_t u = 0; u < nu; u++) {
    struct unit *un = &e->units[u];
    if (un->stage_bytes > un->bytes && un->stage_bytes - un->bytes > e->max_stage_extra)
      e->max_stage_extra = un->stage_bytes - un->bytes;
    if (un->pinned) {
      /* one offset serves every device holding a copy: the furthest their fills have reached */
      un->devices = ferry__mgpu_unit_devices(e, un);
      uint64_t at = 0;
      for (int32_t d = 0; d < FERRY_EXEC_MAX_DEVICES; d++)
        if (un->devices >> d & 1u && fill[d] > at) at = fill[d];
      un->device_offset = at;
      for (int32_t d = 0; d < FERRY_EXEC_MAX_DEVICES; d++)
        if (un->devices >> d & 1u) fill[d] = at + (un->bytes + RANGE_ALIGN - 1) / RANGE_ALIGN * RANGE_ALIGN;
      if (fill[0] > dev) dev = fill[0];
    } else if (un->home == FERRY_TIER_HOST) {
      un->host_offset = host;
      host += (un->bytes + RANGE_ALIGN - 1) / RANGE_ALIGN * RANGE_ALIGN;
    }
  }
  for (int32_t d = 0; e->devs && d < e->n_dev; d++) e->devs[d].pinned_bytes = fill[d];
  if (dev > p->device_pinned_bytes || host > p->host_units_bytes + RANGE_ALIGN * (uint64_t)nu) {
    return ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "engine: packed units exceed the plan (device %llu > %llu)",
                        (unsigned long long)dev, (unsigned long long)p->device_pinned_bytes);
  }
  return FERRY_OK;
}

/* Tensor parallel: tensor i is split over the devices, each holding its slice in its shard
 * buffer (mgpu.c); plain weights only (a quantized tensor's groups would straddle slices). */
static ferry_status shard_tensor(struct ferry_engine *e, size_t i, enum ferry__shard sh, const struct tensor_file *tf) {
  const struct ferry_tensor_desc *t = ferry_model_tensor(e->model, i);
  if (tf->quantized || tf->n_parts != 1)
    return ferry__err_set(&e->err, FERRY_ERR_UNSUPPORTED,
                          "engine: tensor parallel splits plain weights; %s is stored quantized", t->name);
  struct tensor_loc *loc = &e->tensors[i];
  loc->unit = -1;
  loc->present = 1;
  loc->dtype = tf->part[0].dtype;
  loc->sharded = (int)sh;
  loc->file = tf->part[0].file;
  loc->file_offset = tf->part[0].offset;
  loc->shard_offset = ferry__mgpu_place_shard(e, t, loc->dtype);
  return FERRY_OK;
}

ferry_status ferry__engine_build_units(struct ferry_engine *e) {
  const struct ferry_model_config *mc = e->mc;
  const struct ferry_plan *p = &e->plan;
  const int32_t L = (int32_t)mc->n_layers, E = (int32_t)mc->n_experts;
  ferry_status st = FERRY_OK;
  struct tensor_file *tf = tensor_files(e, &st);
  if (!tf) return st;
  size_t n_tensors = ferry_model_tensor_count(e->model);
  int32_t max_units = 1 + L + p->n_blocks + L * E;
  /* one entry more than the model's tensors: a streamed tied head's table (tied_table) */
  int32_t *unit_of = ferry__calloc(n_tensors + 1, sizeof *unit_of);
  int32_t *members = ferry__calloc(n_tensors + 1, sizeof *members);
  e->units = ferry__calloc((size_t)max_units, sizeof *e->units);
  e->tensors = ferry__calloc(n_tensors + 1, sizeof *e->tensors);
  e->block_unit = ferry__calloc((size_t)(p->n_blocks ? p->n_blocks : 1), sizeof *e->block_unit);
  e->expert_unit = ferry__calloc((size_t)(L * E > 0 ? L * E : 1), sizeof *e->expert_unit);
  int32_t *layer_unit = ferry__calloc((size_t)L, sizeof *layer_unit);
  e->role_tensor = ferry__calloc((size_t)(L + 1) * FERRY_ROLE_COUNT, sizeof *e->role_tensor);
  e->expert_tensor = ferry__calloc((size_t)(L * E > 0 ? L * E * EXPERT_SLOTS : 1), sizeof *e->expert_tensor);
  e->unit_slot = ferry__calloc((size_t)max_units, sizeof *e->unit_slot);
  if (!unit_of || !members || !e->units || !e->tensors || !e->block_unit || !e->expert_unit || !layer_unit ||
      !e->role_tensor || !e->expert_tensor || !e->unit_slot) {
    st = ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
    goto out;
  }
  const int32_t nu = make_units(e, layer_unit);
  e->n_units = nu;
  for (int32_t i = 0; i < (L + 1) * FERRY_ROLE_COUNT; i++) e->role_tensor[i] = -1;
  for (int32_t i = 0; i < L * E * EXPERT_SLOTS; i++) e->expert_tensor[i] = -1;
  for (int32_t u = 0; u < max_units; u++) e->unit_slot[u] = -1;
  for (size_t i = 0; i < n_tensors; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(e->model, i);
    if (t->expert >= 0) {
      e->expert_tensor[(t->layer * E + t->expert) * EXPERT_SLOTS + expert_slot(t->role)] = (int32_t)i;
    } else {
      e->role_tensor[(t->layer + 1) * FERRY_ROLE_COUNT + (int32_t)t->role] = (int32_t)i;
    }
    const enum ferry__shard sh = ferry__mgpu_shard(e, t->role);
    if (sh != SHARD_NONE) {
      unit_of[i] = -1;
      if ((st = shard_tensor(e, i, sh, &tf[i])) != FERRY_OK) goto out;
      continue;
    }
    switch (tensor_group(e, t, e->cfg.router_lookahead)) {
      case G_GLOBAL: unit_of[i] = e->global_unit; break;
      case G_EMBED: unit_of[i] = p->embed_block >= 0 ? e->block_unit[p->embed_block] : e->global_unit; break;
      case G_HEAD: unit_of[i] = p->head_block >= 0 ? e->block_unit[p->head_block] : e->global_unit; break;
      case G_ATTN:
        unit_of[i] = p->attn_pinned[t->layer] ? layer_unit[t->layer] : e->block_unit[p->layer_block[t->layer]];
        break;
      case G_FFN:
        unit_of[i] = p->ffn_pinned[t->layer] ? layer_unit[t->layer] : e->block_unit[p->layer_block[t->layer]];
        break;
      case G_EXPERT: unit_of[i] = e->expert_unit[t->layer * E + t->expert]; break;
    }
  }
  unit_of[n_tensors] = -1;
  e->tied_head_src = -1;
  const int32_t tied = tied_table(e);
  if (tied >= 0 && p->head_block >= 0) {
    unit_of[n_tensors] = e->block_unit[p->head_block];
    e->role_tensor[FERRY_ROLE_LM_HEAD] = (int32_t)n_tensors; /* layer -1: the head reads its own copy */
    e->tied_head_src = tied;
  }
  for (int32_t u = 0; u < nu && st == FERRY_OK; u++) {
    int32_t m = 0;
    for (size_t i = 0; i <= n_tensors; i++)
      if (unit_of[i] == u) members[m++] = (int32_t)i;
    st = pack_unit(e, u, members, m, tf);
  }
  if (st != FERRY_OK) goto out;
  st = place_units(e);
out:
  ferry_free(layer_unit);
  ferry_free(members);
  ferry_free(unit_of);
  ferry_free(tf);
  return st;
}

const struct tensor_loc *ferry__engine_loc(const struct ferry_engine *e, enum ferry_tensor_role role, int32_t layer,
                                          int32_t expert) {
  int32_t ti;
  if (expert >= 0) {
    const int slot = expert_slot(role);
    if (slot < 0) return NULL;
    ti = e->expert_tensor[(layer * (int32_t)e->mc->n_experts + expert) * EXPERT_SLOTS + slot];
  } else {
    ti = e->role_tensor[(layer + 1) * FERRY_ROLE_COUNT + (int32_t)role];
  }
  return ti < 0 ? NULL : &e->tensors[ti];
}

/* Where unit u's bytes are on the device now: the pinned buffer, or the slot holding it. */
static void unit_base(const struct ferry_engine *e, int32_t u, ferry_buf **buf, uint64_t *off) {
  const struct unit *un = &e->units[u];
  if (un->pinned) {
    *buf = e->pinned_buf;
    *off = un->device_offset;
  } else if (e->w_host) { /* computed on the CPU from its host copy (hybrid runs) */
    *buf = e->host_units_buf;
    *off = un->host_offset;
  } else if (un->kind == UNIT_BLOCK) {
    *buf = e->block_buf;
    *off = (uint64_t)e->unit_slot[u] * e->plan.block_slot_bytes;
  } else {
    *buf = e->expert_buf;
    *off = (uint64_t)e->unit_slot[u] * e->plan.expert_slot_bytes;
  }
}

struct ferry_ref ferry__engine_weight(struct ferry_engine *e, enum ferry_tensor_role role, int32_t layer,
                                      int32_t expert) {
  struct ferry_ref r = {NULL, 0, FERRY_DTYPE_F32};
  const struct tensor_loc *loc = ferry__engine_loc(e, role, layer, expert);
  if (!loc) return r;
  if (loc->sharded) return ferry__mgpu_weight(e, loc);
  const uint64_t mirrored = mirror_at(e, role, layer, 0);
  if (mirrored != UINT64_MAX) return (struct ferry_ref){e->hws_buf, e->ws.mirror + mirrored, loc->dtype};
  unit_base(e, loc->unit, &r.buf, &r.offset);
  r.offset += loc->unit_offset;
  r.dtype = loc->dtype;
  return r;
}

void ferry__engine_weight_parts(struct ferry_engine *e, const struct tensor_loc *loc,
                                struct ferry_ref parts[FERRY_QPART_COUNT]) {
  ferry_buf *buf;
  uint64_t off;
  unit_base(e, loc->unit, &buf, &off);
  const size_t ti = (size_t)(loc - e->tensors);
  const struct ferry_tensor_desc *t =
      e->mirror_off && ti < ferry_model_tensor_count(e->model) ? ferry_model_tensor(e->model, ti) : NULL;
  const int mirrored = t && mirror_at(e, t->role, t->layer, 0) != UINT64_MAX;
  for (int p = 0; p < FERRY_QPART_COUNT; p++) {
    if (!(loc->part_mask >> p & 1)) {
      parts[p] = (struct ferry_ref){NULL, 0, FERRY_DTYPE_U8};
      continue;
    }
    parts[p] = mirrored ? (struct ferry_ref){e->hws_buf, e->ws.mirror + mirror_at(e, t->role, t->layer, p), loc->part_dtype[p]}
                        : (struct ferry_ref){buf, off + loc->part_offset[p], loc->part_dtype[p]};
  }
}

void ferry__engine_free_units(struct ferry_engine *e) {
  ferry_free(e->mirror_off);
  e->mirror_off = NULL;
  for (int32_t u = 0; u < e->n_units; u++) ferry_free(e->units[u].ranges);
  ferry_free(e->units);
  ferry_free(e->tensors);
  ferry_free(e->block_unit);
  ferry_free(e->expert_unit);
  ferry_free(e->role_tensor);
  ferry_free(e->expert_tensor);
  ferry_free(e->unit_slot);
  e->role_tensor = e->expert_tensor = e->unit_slot = NULL;
  e->units = NULL;
  e->n_units = 0;
}
