/* The paged KV cache's bookkeeping (vLLM's PagedAttention): a pool of fixed blocks of kv_block
 * tokens, a table per sequence slot of the blocks holding its positions in order, and a stack
 * of free blocks. Blocks are taken as a sequence grows and all returned when it finishes or is
 * preempted; the attention kernels read positions through the table. */
#include <string.h>

#include "common/alloc.h"
#include "engine_impl.h"

ferry_status ferry__pages_alloc(struct ferry_engine *e) {
  if (!e->kv_block) return FERRY_OK;
  e->kv_table = ferry__calloc((size_t)e->n_seqs * (size_t)e->kv_blocks_per_seq, sizeof *e->kv_table);
  e->kv_free = ferry__calloc((size_t)(e->kv_pool_blocks > 0 ? e->kv_pool_blocks : 1), sizeof *e->kv_free);
  e->seq_blocks = ferry__calloc((size_t)e->n_seqs, sizeof *e->seq_blocks);
  if (!e->kv_table || !e->kv_free || !e->seq_blocks)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the KV cache's block tables");
  ferry__pages_reset(e);
  return FERRY_OK;
}

void ferry__pages_free(struct ferry_engine *e) {
  ferry_free(e->kv_table);
  ferry_free(e->kv_free);
  ferry_free(e->seq_blocks);
  e->kv_table = e->kv_free = e->seq_blocks = NULL;
}

/* every block free, the lowest on top (the same run always gets the same blocks) */
void ferry__pages_reset(struct ferry_engine *e) {
  if (!e->kv_block) return;
  e->kv_free_count = e->kv_pool_blocks;
  for (int32_t i = 0; i < e->kv_pool_blocks; i++) e->kv_free[i] = e->kv_pool_blocks - 1 - i;
  memset(e->seq_blocks, 0, (size_t)e->n_seqs * sizeof *e->seq_blocks);
}

int ferry__pages_grow(struct ferry_engine *e, int32_t s, int64_t tokens) {
  const int32_t need = ferry__pages_need(e, tokens), have = e->seq_blocks[s];
  if (need <= have) return 1;
  if (need - have > e->kv_free_count || need > e->kv_blocks_per_seq) return 0;
  for (int32_t b = have; b < need; b++)
    e->kv_table[(int64_t)s * e->kv_blocks_per_seq + b] = e->kv_free[--e->kv_free_count];
  e->seq_blocks[s] = need;
  return 1;
}

void ferry__pages_release(struct ferry_engine *e, int32_t s) {
  if (!e->kv_block) return;
  for (int32_t b = e->seq_blocks[s] - 1; b >= 0; b--)
    e->kv_free[e->kv_free_count++] = e->kv_table[(int64_t)s * e->kv_blocks_per_seq + b];
  e->seq_blocks[s] = 0;
}
