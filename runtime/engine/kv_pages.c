/* The paged KV cache's bookkeeping (vLLM's PagedAttention): a pool of fixed blocks of kv_block
 * tokens, a table per sequence slot of the blocks holding its positions in order, and a stack
 * of free blocks. Blocks are taken as a sequence grows and all returned when it finishes or is
 * preempted; the attention kernels read positions through the table. */
#include <string.h>

#include "common/alloc.h"
#include "engine_impl.h"

/* Swap preemption (vLLM's swap): a preempted sequence's blocks are copied to host slots and back
 * into fresh blocks when it is readmitted, where it decodes on. The copies are ops on the link
 * queues like any other (the simulator prices them there), ordered against the compute queue by
 * events: they start when the compute before them is done with the blocks, and the compute after
 * them waits for them. */

/* Bytes of one paged layer's K (or V, or MLA latent) rows of one block. */
static uint64_t layer_block_bytes(const struct ferry_engine *e) { return (uint64_t)e->kv_block * ferry__kv_row_bytes(e); }

/* Copy block `blk` of every paged layer between the cache and swap slot `slot` (out: to the slot). */
static ferry_status copy_block(struct ferry_engine *e, int32_t queue, int32_t blk, int32_t slot, int out,
                               uint64_t *moved) {
  const uint64_t lb = layer_block_bytes(e);
  uint64_t at = (uint64_t)slot * ferry__kv_pages_block_bytes(e);
  for (int64_t l = 0; l < e->mc->n_layers; l++) {
    const struct kv_layer *kv = &e->kv[l];
    if (kv->ring) continue;
    ferry_buf *cache = kv->host ? e->hkv_buf : e->kv_buf;
    const uint64_t offs[2] = {kv->k_off, kv->v_off};
    for (int h = 0; h < (e->mc->kv_lora_rank ? 1 : 2); h++, at += lb) {
      const struct ferry_ref c = {cache, offs[h] + (uint64_t)blk * lb, FERRY_DTYPE_U8},
                             w = {e->kv_swap_buf, at, FERRY_DTYPE_U8};
      ferry_status st = ferry_exec_copy(e->ex, queue, out ? w : c, out ? c : w, lb);
      if (st != FERRY_OK) return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
      if (!kv->host) *moved += lb; /* a host-resident layer's copy stays in host memory */
    }
  }
  return FERRY_OK;
}

/* Order `queue` after the compute issued so far, or the compute queue after `queue`'s copies. */
static ferry_status after(struct ferry_engine *e, int32_t waiter, int32_t waited, ferry_event *ev) {
  ferry_status st = ferry_exec_record(e->ex, waited, ev);
  if (st == FERRY_OK) st = ferry_exec_queue_wait(e->ex, waiter, ev);
  return st == FERRY_OK ? FERRY_OK : ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
}

int ferry__kv_pages_swap_out(struct ferry_engine *e, int32_t s, struct resume *r, ferry_status *st) {
  /* the blocks holding its rows; one taken for a token it has not computed yet is not copied */
  const int32_t n = ferry__kv_pages_need(e, e->seqs[s].pos);
  *st = FERRY_OK;
  if (!e->swap_free || n > e->swap_free_count || n > e->seq_blocks[s]) return 0;
  uint64_t moved = 0;
  if ((*st = after(e, e->q_d2h, e->q_compute, e->ev_swap_cmp)) != FERRY_OK) return 0;
  int32_t prev = -1;
  for (int32_t i = n - 1; i >= 0 && *st == FERRY_OK; i--) { /* linked first to last */
    const int32_t slot = e->swap_free[--e->swap_free_count];
    e->swap_next[slot] = prev;
    prev = slot;
    *st = copy_block(e, e->q_d2h, e->kv_table[(int64_t)s * e->kv_blocks_per_seq + i], slot, 1, &moved);
  }
  /* the blocks go back to the pool: whoever takes them next writes after the copies */
  if (*st == FERRY_OK) *st = after(e, e->q_compute, e->q_d2h, e->ev_swap_out);
  if (*st != FERRY_OK) return 0;
  r->swap_head = prev;
  r->swap_n = n;
  e->step_bytes_d2h += moved;
  e->swap_bytes += moved;
  return 1;
}

ferry_status ferry__kv_pages_swap_in(struct ferry_engine *e, int32_t s, struct resume *r) {
  if (!ferry__kv_pages_grow(e, s, (int64_t)r->swap_n * e->kv_block))
    return ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "engine: no blocks to swap a sequence back into");
  uint64_t moved = 0;
  /* its fresh blocks may have been another sequence's until now, and its slots were written by
   * the swap-out queue */
  ferry_status st = after(e, e->q_h2d, e->q_compute, e->ev_swap_cmp);
  if (st == FERRY_OK && (st = ferry_exec_queue_wait(e->ex, e->q_h2d, e->ev_swap_out)) != FERRY_OK)
    return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  int32_t slot = r->swap_head;
  for (int32_t i = 0; i < r->swap_n && st == FERRY_OK; i++) {
    st = copy_block(e, e->q_h2d, e->kv_table[(int64_t)s * e->kv_blocks_per_seq + i], slot, 0, &moved);
    e->swap_free[e->swap_free_count++] = slot;
    slot = e->swap_next[slot];
  }
  if (st == FERRY_OK) st = after(e, e->q_compute, e->q_h2d, e->ev_swap_in);
  if (st != FERRY_OK) return st;
  r->swap_n = 0;
  e->swap_h2d_pending += moved; /* admission comes before the step's counters start */
  return FERRY_OK;
}

void ferry__kv_pages_swap_drop(struct ferry_engine *e, struct resume *r) {
  int32_t slot = r->swap_head;
  for (int32_t i = 0; i < r->swap_n; i++) {
    e->swap_free[e->swap_free_count++] = slot;
    slot = e->swap_next[slot];
  }
  const struct seq q = r->saved;
  if (q.prompt_done >= q.prefill) /* decoding */
    *r = (struct resume){.pos = q.pos, .generated = q.generated, .last_token = q.last_token, .preempted = 1};
  else if (q.resumed) /* prefilling again what it had: the same record */
    *r = (struct resume){.pos = q.prefill, .generated = q.generated, .last_token = q.last_token, .preempted = 1};
  else /* in its first prefill */
    *r = (struct resume){0};
}

ferry_status ferry__kv_pages_alloc(struct ferry_engine *e) {
  if (!e->kv_block) return FERRY_OK;
  if (e->kv_swap_blocks > 0) { /* sized within the host budget by the plan */
    const uint64_t bytes = (uint64_t)e->kv_swap_blocks * ferry__kv_pages_block_bytes(e);
    ferry_status st = ferry_exec_alloc(e->ex, FERRY_TIER_HOST, bytes, "KV swap", &e->kv_swap_buf);
    if (st != FERRY_OK) return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
    e->swap_free = ferry__calloc((size_t)e->kv_swap_blocks, sizeof *e->swap_free);
    e->swap_next = ferry__calloc((size_t)e->kv_swap_blocks, sizeof *e->swap_next);
    if (!e->swap_free || !e->swap_next || ferry_exec_event_create(e->ex, &e->ev_swap_out) != FERRY_OK ||
        ferry_exec_event_create(e->ex, &e->ev_swap_in) != FERRY_OK ||
        ferry_exec_event_create(e->ex, &e->ev_swap_cmp) != FERRY_OK)
      return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the KV swap");
  }
  e->kv_table = ferry__calloc((size_t)e->n_seqs * (size_t)e->kv_blocks_per_seq, sizeof *e->kv_table);
  e->kv_free = ferry__calloc((size_t)(e->kv_pool_blocks > 0 ? e->kv_pool_blocks : 1), sizeof *e->kv_free);
  e->seq_blocks = ferry__calloc((size_t)e->n_seqs, sizeof *e->seq_blocks);
  if (!e->kv_table || !e->kv_free || !e->seq_blocks)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the KV cache's block tables");
  ferry__kv_pages_reset(e);
  return FERRY_OK;
}

void ferry__kv_pages_free(struct ferry_engine *e) {
  if (e->ex) {
    ferry_exec_free(e->ex, e->kv_swap_buf);
    ferry_exec_event_destroy(e->ex, e->ev_swap_out);
    ferry_exec_event_destroy(e->ex, e->ev_swap_in);
    ferry_exec_event_destroy(e->ex, e->ev_swap_cmp);
  }
  e->kv_swap_buf = NULL;
  e->ev_swap_out = e->ev_swap_in = e->ev_swap_cmp = NULL;
  ferry_free(e->swap_free);
  ferry_free(e->swap_next);
  e->swap_free = e->swap_next = NULL;
  ferry_free(e->kv_table);
  ferry_free(e->kv_free);
  ferry_free(e->seq_blocks);
  e->kv_table = e->kv_free = e->seq_blocks = NULL;
}

/* every block free, the lowest on top (the same run always gets the same blocks) */
void ferry__kv_pages_reset(struct ferry_engine *e) {
  if (!e->kv_block) return;
  e->kv_free_count = e->kv_pool_blocks;
  for (int32_t i = 0; i < e->kv_pool_blocks; i++) e->kv_free[i] = e->kv_pool_blocks - 1 - i;
  if (e->swap_free) {
    e->swap_free_count = e->kv_swap_blocks;
    for (int32_t i = 0; i < e->kv_swap_blocks; i++) e->swap_free[i] = e->kv_swap_blocks - 1 - i;
  }
  e->swap_bytes = e->swap_h2d_pending = 0;
  memset(e->seq_blocks, 0, (size_t)e->n_seqs * sizeof *e->seq_blocks);
}

int ferry__kv_pages_grow(struct ferry_engine *e, int32_t s, int64_t tokens) {
  const int32_t need = ferry__kv_pages_need(e, tokens), have = e->seq_blocks[s];
  if (need <= have) return 1;
  if (need - have > e->kv_free_count || need > e->kv_blocks_per_seq) return 0;
  for (int32_t b = have; b < need; b++)
    e->kv_table[(int64_t)s * e->kv_blocks_per_seq + b] = e->kv_free[--e->kv_free_count];
  e->seq_blocks[s] = need;
  return 1;
}

void ferry__kv_pages_release(struct ferry_engine *e, int32_t s) {
  if (!e->kv_block) return;
  for (int32_t b = e->seq_blocks[s] - 1; b >= 0; b--)
    e->kv_free[e->kv_free_count++] = e->kv_table[(int64_t)s * e->kv_blocks_per_seq + b];
  e->seq_blocks[s] = 0;
}
