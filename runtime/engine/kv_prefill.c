/* Attention on the device beside a KV cache in host memory (--kv-home host, or a streamed layer's
 * with --kv-home layer), over a scratch cache in the device's KV buffer (one layer's worth, so the
 * plan counts it against the device budget):
 * - --kv-prefill device: the tokens that start a sequence (as FlexGen's and ZeRO-Inference's
 *   prefill do); the scratch holds only this step's K and V, and decode steps attend on the CPU
 *   over the whole cache as before;
 * - --kv-attention device: every token (FlexGen without --cpu: flex_opt.py load_cache copies the
 *   batch's cached K and V of the layer to the GPU, pytorch_backend.py mha_gen attends there,
 *   store_cache sends the new rows back); the step's sequences' cached rows of the layer are
 *   copied up from the host cache into the scratch first, one scratch per micro-batch so the
 *   copies of one overlap the attention of another. The prefill scratch is the case with no
 *   cached rows.
 * - --kv-home layer: every token of a streamed layer computed on the device (llama.cpp's -ngl, a
 *   prompt batch offloaded to the GPU): its new K and V rows are written into the host cache
 *   first and each sequence's window, those rows included, is copied up (forward.c
 *   attend_window()), as ggml's scheduler copies the cache views the attention reads.
 * Either way the step's new K and V rows cross to the host cache and are appended there on the
 * CPU (forward.c attend()). This file owns the scratch, which tokens use it and its upload. */
#include <stdio.h>

#include "common/alloc.h"
#include "common/units.h"
#include "engine_impl.h"

#define TRY(call)                                                                              \
  do {                                                                                         \
    ferry_status st_ = (call);                                                                 \
    if (st_ != FERRY_OK) return ferry__err_set(&e->err, st_, "%s", ferry_exec_errmsg(e->ex)); \
  } while (0)

/* Every token attends on the device over its sequence's rows copied up (not prompts only). */
static int every_token(const struct ferry_engine *e) {
  return e->cfg.kv_attention_device || e->cfg.kv_home_layer;
}

/* --kv-home layer needs a scratch when a layer with its cache in host memory may run on the
 * device: streamed layers not always computed on the CPU. */
static int scratch_on(const struct ferry_engine *e) {
  return e->cfg.kv_prefill_device || e->cfg.kv_attention_device ||
         (e->cfg.kv_home_layer && e->cfg.compute_layers != FERRY_COMPUTE_CPU);
}

/* --kv-home layer: the most rows a layer whose cache is in host memory holds per sequence (a
 * windowed layer's ring is smaller); 0 when none is (nothing streams, or before the plan). */
static int32_t host_layer_rows(const struct ferry_engine *e) {
  int32_t rows = 0;
  for (int64_t l = 0; l < e->mc->n_layers; l++)
    if (e->kv[l].host && e->kv[l].rows > rows) rows = e->kv[l].rows;
  return rows;
}

/* One scratch's K (or V) region for `rows` rows of each of a micro-batch's sequences, and the
 * copies of the K and V pair: one per micro-batch when every token attends there. */
static uint64_t scratch_region(const struct ferry_engine *e, int32_t rows) {
  return (uint64_t)e->cfg.max_batch * (uint64_t)rows * ferry__kv_row_bytes(e);
}

static int32_t scratch_copies(const struct ferry_engine *e) { return every_token(e) ? e->n_mb : 1; }

uint64_t ferry__kv_window_bytes(const struct ferry_engine *e, int64_t l) {
  if (!e->cfg.kv_home_layer || !scratch_on(e)) return 0;
  return 2 * scratch_region(e, e->kv[l].rows) * (uint64_t)scratch_copies(e);
}

uint64_t ferry__kv_prefill_layout(struct ferry_engine *e, uint64_t off) {
  e->kvp_rows = e->kvp_slots = e->kvp_copies = 0;
  e->kvp_k_off = e->kvp_v_off = e->kvp_bytes = 0;
  if (!scratch_on(e)) return off;
  /* a micro-batch has max_batch sequences. Prompts only: each starts this step at position 0,
   * so its positions are below the step's tokens and below the sequence's capacity. Every
   * token: a sequence's whole cache (a windowed layer's ring is smaller), one scratch per
   * micro-batch in flight */
  const int all = every_token(e);
  e->kvp_rows = all || e->cfg.max_step_tokens >= e->kv_capacity ? e->kv_capacity : e->cfg.max_step_tokens;
  if (e->cfg.kv_home_layer) e->kvp_rows = host_layer_rows(e);
  if (!e->kvp_rows) return off;
  e->kvp_slots = e->cfg.max_batch;
  e->kvp_copies = scratch_copies(e);
  const uint64_t region = scratch_region(e, e->kvp_rows);
  e->kvp_k_off = off;
  e->kvp_v_off = off + region;
  e->kvp_bytes = 2 * region * (uint64_t)e->kvp_copies;
  return off + e->kvp_bytes;
}

const char *ferry__kv_prefill_shape(const struct ferry_engine *e, char *buf, size_t len) {
  char b[32];
  if (!e->kvp_bytes) {
    if (len) buf[0] = '\0';
    return buf;
  }
  if (every_token(e))
    snprintf(buf, len,
             ", of which the attention scratch on the device %s: %d micro-batches x %d sequences x %d tokens x %llu "
             "bytes x 2 (K and V; --kv-%s, --gpu-batches, --max-batch, --max-seq-tokens)",
             ferry__format_bytes(e->kvp_bytes, b, sizeof b), e->kvp_copies, e->kvp_slots, e->kvp_rows,
             (unsigned long long)ferry__kv_row_bytes(e), e->cfg.kv_home_layer ? "home layer" : "attention device");
  else
    snprintf(buf, len,
             ", of which the prefill scratch on the device %s: %d sequences x %d tokens x %llu bytes x 2 (K and V; "
             "--kv-prefill device, --max-batch, --max-step-tokens)",
             ferry__format_bytes(e->kvp_bytes, b, sizeof b), e->kvp_slots, e->kvp_rows,
             (unsigned long long)ferry__kv_row_bytes(e));
  return buf;
}

ferry_status ferry__kv_prefill_alloc(struct ferry_engine *e) {
  if (!scratch_on(e)) return FERRY_OK;
  const size_t T = (size_t)e->cfg.max_step_tokens, S = (size_t)e->cfg.max_batch, per = T + 2 * S;
  int32_t *all = ferry__calloc((size_t)e->n_mb * per, sizeof *all);
  if (!all) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the device scratch's slots");
  for (int32_t m = 0; m < e->n_mb; m++) {
    struct microbatch *b = &e->mbs[m];
    b->kvp_slot = all + (size_t)m * per;
    b->kvp_src = b->kvp_slot + T;
    b->kvp_cached = b->kvp_src + S;
    b->kvp_free = NULL;
    if (every_token(e) && ferry_exec_event_create(e->ex, &b->kvp_free) != FERRY_OK)
      return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for events");
  }
  return FERRY_OK;
}

void ferry__kv_prefill_free(struct ferry_engine *e) {
  if (!e->mbs) return;
  for (int32_t m = 0; m < e->n_mb; m++) {
    if (e->ex) ferry_exec_event_destroy(e->ex, e->mbs[m].kvp_free);
    e->mbs[m].kvp_free = NULL;
  }
  ferry_free(e->mbs[0].kvp_slot); /* the others are views into it */
}

/* The tokens of micro-batch m that attend on the device: the last ones, in whole sequences, each
 * with a scratch slot. With --kv-prefill device only sequences whose tokens this step are
 * positions 0, 1, 2, ... (a prompt, or its first chunk: every key they see is in the step); the
 * batcher puts decode tokens and continued prompts first (serve.c), so the split is one index.
 * With --kv-attention device every sequence, with the rows its cache holds before the step
 * (copied up before the step's are appended); with --kv-home layer every sequence, with those and
 * the step's (written into the host cache first). */
void ferry__kv_prefill_split(struct ferry_engine *e, int32_t m) {
  struct microbatch *b = &e->mbs[m];
  b->kvp_first = b->n_tok;
  if (!scratch_on(e)) return;
  const int all = every_token(e);
  int32_t t = b->n_tok, slot = 0;
  while (t > 0 && slot < e->kvp_slots) {
    int32_t a = t - 1;
    while (a > 0 && b->tok_seq[a - 1] == b->tok_seq[t - 1]) a--;
    int ok = all || t - a <= e->kvp_rows;
    for (int32_t i = a; i < t && ok && !all; i++) ok = b->tok_pos[i] == i - a;
    if (!ok) break;
    for (int32_t i = a; i < t; i++) b->kvp_slot[i] = slot;
    b->kvp_src[slot] = b->tok_slot[a];
    b->kvp_cached[slot] = !all ? 0 : e->cfg.kv_home_layer ? b->tok_pos[t - 1] + 1 : b->tok_pos[a];
    slot++;
    t = a;
  }
  b->kvp_first = t;
}

/* The scratch of the current micro-batch: K at its offset, V one region further. */
static uint64_t scratch_off(const struct ferry_engine *e, int v) {
  const uint64_t region = e->kvp_v_off - e->kvp_k_off;
  const uint64_t copy = e->kvp_copies > 1 ? (uint64_t)e->cur_mb : 0;
  return e->kvp_k_off + copy * 2 * region + (v ? region : 0);
}

/* Rows [0, n) of a scratch slot for layer l: the layer's own ring size with every token on the
 * device (the positions map to rows as in the host cache), the prompts' rows otherwise. */
static int32_t scratch_rows(const struct ferry_engine *e, int32_t l) {
  return every_token(e) ? e->kv[l].rows : e->kvp_rows;
}

void ferry__kv_prefill_scratch(struct ferry_engine *e, struct ferry_kernel *k, int64_t first, int32_t l) {
  k->aux[2] = (struct ferry_ref){e->kv_buf, scratch_off(e, 0), e->kv_dtype};
  k->aux[3] = (struct ferry_ref){e->kv_buf, scratch_off(e, 1), e->kv_dtype};
  k->ints2 = e->mbs[e->cur_mb].kvp_slot + first;
  k->kv_capacity = scratch_rows(e, l);
  k->kv_ring = every_token(e) ? e->kv[l].ring : 0;
  k->kv_blocks = NULL;
  k->kv_block_tokens = k->kv_blocks_per_seq = 0;
}

/* Copy rows [r0, r0 + n) of host-cache region row `src_row` to scratch row `dst_row`, K and V. */
static ferry_status copy_rows(struct ferry_engine *e, int32_t l, uint64_t src_row, uint64_t dst_row, uint64_t n) {
  const uint64_t row = ferry__kv_row_bytes(e), bytes = n * row;
  for (int v = 0; v < 2 && bytes; v++) {
    const uint64_t src = (v ? e->kv[l].v_off : e->kv[l].k_off) + src_row * row;
    TRY(ferry_exec_copy(e->ex, e->q_up, (struct ferry_ref){e->kv_buf, scratch_off(e, v) + dst_row * row, e->kv_dtype},
                        (struct ferry_ref){e->hkv_buf, src, e->kv_dtype}, bytes));
    e->step_bytes_h2d += bytes;
  }
  return FERRY_OK;
}

ferry_status ferry__kv_scratch_load(struct ferry_engine *e, int32_t l) {
  if (!every_token(e)) return FERRY_OK;
  struct microbatch *b = &e->mbs[e->cur_mb];
  const int32_t rows = scratch_rows(e, l), paged = e->kv_block && !e->kv[l].ring;
  int32_t slots = 0, cached = 0;
  for (int32_t t = b->kvp_first; t < b->n_tok; t++) slots = b->kvp_slot[t] + 1 > slots ? b->kvp_slot[t] + 1 : slots;
  for (int32_t s = 0; s < slots; s++) cached |= b->kvp_cached[s];
  if (!cached) return FERRY_OK; /* only new sequences (a prefill step): nothing to copy or wait for */
  /* the scratch is free once this micro-batch's previous layer attended over it, and the host
   * cache's rows are there once the CPU appended them (its queue so far) */
  TRY(ferry_exec_queue_wait(e->ex, e->q_up, b->kvp_free));
  TRY(ferry_exec_record(e->ex, e->q_cpu, e->ev_cpu));
  TRY(ferry_exec_queue_wait(e->ex, e->q_up, e->ev_cpu));
  ferry_status st;
  for (int32_t s = 0; s < slots; s++) {
    /* a ring holds the last `rows` positions, each at position % rows */
    const int64_t n = b->kvp_cached[s] < rows ? b->kvp_cached[s] : rows, dst = (int64_t)s * rows;
    if (!paged) {
      if ((st = copy_rows(e, l, (uint64_t)b->kvp_src[s] * (uint64_t)e->kv[l].rows, (uint64_t)dst, (uint64_t)n)))
        return st;
      continue;
    }
    for (int64_t p = 0; p < n; p += e->kv_block) { /* block by block through the sequence's table */
      const int64_t id = e->kv_table[(int64_t)b->kvp_src[s] * e->kv_blocks_per_seq + p / e->kv_block];
      const int64_t len = n - p < e->kv_block ? n - p : e->kv_block;
      if ((st = copy_rows(e, l, (uint64_t)(id * e->kv_block), (uint64_t)(dst + p), (uint64_t)len))) return st;
    }
  }
  TRY(ferry_exec_record(e->ex, e->q_up, e->ev_up));
  TRY(ferry_exec_queue_wait(e->ex, e->q_compute, e->ev_up));
  return FERRY_OK;
}

ferry_status ferry__kv_scratch_used(struct ferry_engine *e) {
  if (!every_token(e)) return FERRY_OK;
  TRY(ferry_exec_record(e->ex, e->q_compute, e->mbs[e->cur_mb].kvp_free));
  return FERRY_OK;
}
