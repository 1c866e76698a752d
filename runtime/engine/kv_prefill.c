/* --kv-prefill device: with the KV cache in host memory, a prompt's attention runs on the device
 * (as FlexGen and ZeRO-Inference's KV offload do) over a scratch cache holding only this step's
 * K and V, and the new rows go to the host cache afterwards; decode steps attend on the CPU over
 * the whole cache as before. This file owns the scratch (one layer's worth, in the device's KV
 * buffer, so the plan counts it against the device budget) and which tokens may use it. */
#include <stdio.h>

#include "common/alloc.h"
#include "common/units.h"
#include "engine_impl.h"

/* Bytes of one token's K (or V) row of the usual attention in the cache's format. */
static uint64_t kv_row_bytes(const struct ferry_engine *e) {
  return ferry_kv_format_row_bytes(e->kv_format, (uint64_t)(e->mc->n_kv_heads * e->mc->head_dim));
}

uint64_t ferry__kv_prefill_layout(struct ferry_engine *e, uint64_t off) {
  e->kvp_rows = e->kvp_slots = 0;
  e->kvp_k_off = e->kvp_v_off = e->kvp_bytes = 0;
  if (!e->cfg.kv_prefill_device) return off;
  /* a sequence attended here starts this step at position 0, so its positions are below the
   * step's tokens and below the sequence's capacity; a micro-batch has max_batch sequences */
  e->kvp_rows = e->cfg.max_step_tokens < e->kv_capacity ? e->cfg.max_step_tokens : e->kv_capacity;
  e->kvp_slots = e->cfg.max_batch;
  const uint64_t region = (uint64_t)e->kvp_slots * (uint64_t)e->kvp_rows * kv_row_bytes(e);
  e->kvp_k_off = off;
  e->kvp_v_off = off + region;
  e->kvp_bytes = 2 * region;
  return off + 2 * region;
}

const char *ferry__kv_prefill_shape(const struct ferry_engine *e, char *buf, size_t len) {
  char b[32];
  if (!e->kvp_bytes) {
    if (len) buf[0] = '\0';
    return buf;
  }
  snprintf(buf, len,
           ", of which the prefill scratch on the device %s: %d sequences x %d tokens x %llu bytes x 2 (K and V; "
           "--kv-prefill device, --max-batch, --max-step-tokens)",
           ferry__format_bytes(e->kvp_bytes, b, sizeof b), e->kvp_slots, e->kvp_rows,
           (unsigned long long)kv_row_bytes(e));
  return buf;
}

ferry_status ferry__kv_prefill_alloc(struct ferry_engine *e) {
  if (!e->cfg.kv_prefill_device) return FERRY_OK;
  const size_t T = (size_t)e->cfg.max_step_tokens;
  int32_t *all = ferry__calloc((size_t)e->n_mb * T, sizeof *all);
  if (!all) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the prefill scratch's slots");
  for (int32_t m = 0; m < e->n_mb; m++) e->mbs[m].kvp_slot = all + (size_t)m * T;
  return FERRY_OK;
}

void ferry__kv_prefill_free(struct ferry_engine *e) {
  if (e->mbs) ferry_free(e->mbs[0].kvp_slot); /* the others are views into it */
}

/* The tokens of micro-batch m that attend on the device: the last ones, in whole sequences whose
 * tokens this step are positions 0, 1, 2, ... (a prompt, or its first chunk: every key they see
 * is in the step). The batcher puts decode tokens and continued prompts first (serve.c), so the
 * split is one index; each such sequence gets a scratch slot. */
void ferry__kv_prefill_split(struct ferry_engine *e, int32_t m) {
  struct microbatch *b = &e->mbs[m];
  b->kvp_first = b->n_tok;
  if (!e->cfg.kv_prefill_device) return;
  int32_t t = b->n_tok, slot = 0;
  while (t > 0 && slot < e->kvp_slots) {
    int32_t a = t - 1;
    while (a > 0 && b->tok_seq[a - 1] == b->tok_seq[t - 1]) a--;
    int prompt = t - a <= e->kvp_rows;
    for (int32_t i = a; i < t && prompt; i++) prompt = b->tok_pos[i] == i - a;
    if (!prompt) break;
    for (int32_t i = a; i < t; i++) b->kvp_slot[i] = slot;
    slot++;
    t = a;
  }
  b->kvp_first = t;
}

void ferry__kv_prefill_scratch(struct ferry_engine *e, struct ferry_kernel *k, int64_t first) {
  k->aux[2] = (struct ferry_ref){e->kv_buf, e->kvp_k_off, e->kv_dtype};
  k->aux[3] = (struct ferry_ref){e->kv_buf, e->kvp_v_off, e->kv_dtype};
  k->ints2 = e->mbs[e->cur_mb].kvp_slot + first;
  k->kv_capacity = e->kvp_rows;
  k->kv_ring = 0;
  k->kv_blocks = NULL;
  k->kv_block_tokens = k->kv_blocks_per_seq = 0;
}
