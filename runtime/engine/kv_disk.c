/* A KV cache homed on disk (--kv-home disk: FlexGen's --percent ... 0 0 with --cpu, the cache 0 %
 * on the GPU and 0 % in CPU memory). The cache is a file of the executor's disk tier laid out as
 * the host cache would be; host memory holds a staging of one layer's K and V for one micro-batch
 * per attention in flight. Before a micro-batch's attention on the CPU its sequences' cached rows
 * of the layer are read from the file into a staging (flex_opt.py SelfAttention.load_cache, path
 * 1: general_copy of the first prompt_len + i - 1 positions into the CPU's attention workspace),
 * the CPU attends there and appends the step's K and V, and the new rows are written back
 * (store_cache: the new token's K and V, or the prompt's). The reads of the next attentions are
 * issued ahead (prefetch_depth of them: FlexGen's load_cache(i, j, k + 1) overlaps compute(i, j, k))
 * on the disk queue, which also carries the weights' reads and keeps every read of a sequence's
 * rows behind their last write (FlexGen: one disk copy queue). This file owns the staging, the
 * file and their I/O; forward.c attend() calls it around the CPU's ops. */
#include <stdio.h>

#include "common/alloc.h"
#include "common/units.h"
#include "engine_impl.h"

#define TRY(call)                                                                              \
  do {                                                                                         \
    ferry_status st_ = (call);                                                                 \
    if (st_ != FERRY_OK) return ferry__err_set(&e->err, st_, "%s", ferry_exec_errmsg(e->ex)); \
  } while (0)

/* One staging copy's K region (V follows it; MLA has the latent rows only): max_batch sequences
 * of kv_capacity rows. */
static uint64_t region_bytes(const struct ferry_engine *e) {
  return (uint64_t)e->cfg.max_batch * (uint64_t)e->kv_capacity * ferry__kv_row_bytes(e);
}

/* Stagings: one per use in flight, the one attended and prefetch_depth read ahead. */
static int32_t copies(const struct ferry_engine *e) { return e->cfg.prefetch_depth + 1; }

uint64_t ferry__kv_disk_stage_bytes(const struct ferry_engine *e) {
  return e->cfg.kv_home_disk ? (uint64_t)copies(e) * (uint64_t)ferry__kv_regions(e) * region_bytes(e) : 0;
}

const char *ferry__kv_disk_shape(const struct ferry_engine *e, char *buf, size_t len) {
  char b[2][32];
  if (!e->cfg.kv_home_disk) {
    if (len) buf[0] = '\0';
    return buf;
  }
  snprintf(buf, len,
           ", on disk %s and its host staging %s: %d x %d sequences x %d tokens x %llu bytes%s; --kv-home "
           "disk, --prefetch-depth + 1, --max-batch, --max-seq-tokens)",
           ferry__format_bytes(e->hkv_bytes, b[0], sizeof b[0]),
           ferry__format_bytes(ferry__kv_disk_stage_bytes(e), b[1], sizeof b[1]), copies(e), e->cfg.max_batch,
           e->kv_capacity, (unsigned long long)ferry__kv_row_bytes(e), ferry__kv_regions(e) == 2 ? " x 2 (K and V" : " (latent rows");
  return buf;
}

ferry_status ferry__kv_disk_alloc(struct ferry_engine *e) {
  if (!e->cfg.kv_home_disk) return FERRY_OK;
  ferry_status st;
  e->kvd_copies = copies(e);
  e->kvd_ahead = e->cfg.prefetch_depth;
  const uint64_t stage = ferry__kv_disk_stage_bytes(e);
  if ((st = ferry_exec_alloc(e->ex, FERRY_TIER_DISK, e->hkv_bytes, "KV cache (disk)", &e->dkv_buf)) != FERRY_OK ||
      (st = ferry_exec_alloc(e->ex, FERRY_TIER_HOST, stage, "KV staging", &e->kvd_buf)) != FERRY_OK) {
    char shape[512];
    return ferry__err_set(&e->err, st, "%s; the KV cache%s", ferry_exec_errmsg(e->ex),
                          ferry__kv_disk_shape(e, shape, sizeof shape));
  }
  const size_t T = (size_t)e->cfg.max_step_tokens, B = (size_t)e->cfg.max_batch, per = T + 2 * B;
  int32_t *all = ferry__calloc((size_t)e->n_mb * per, sizeof *all);
  e->kvd_mbs = ferry__calloc((size_t)e->n_mb, sizeof *e->kvd_mbs);
  e->kvd_ready = ferry__calloc((size_t)e->kvd_copies, sizeof *e->kvd_ready);
  if (!all || !e->kvd_mbs || !e->kvd_ready) {
    ferry_free(all);
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the KV staging's slots");
  }
  for (int32_t m = 0; m < e->n_mb; m++) {
    struct microbatch *b = &e->mbs[m];
    b->kvd_slot = all + (size_t)m * per;
    b->kvd_cached = b->kvd_slot + T;
    b->kvd_new = b->kvd_cached + B;
  }
  for (int32_t c = 0; c < e->kvd_copies; c++)
    if (ferry_exec_event_create(e->ex, &e->kvd_ready[c]) != FERRY_OK)
      return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for events");
  return FERRY_OK;
}

void ferry__kv_disk_free(struct ferry_engine *e) {
  if (e->ex) {
    ferry_exec_free(e->ex, e->dkv_buf);
    ferry_exec_free(e->ex, e->kvd_buf);
    for (int32_t c = 0; e->kvd_ready && c < e->kvd_copies; c++) ferry_exec_event_destroy(e->ex, e->kvd_ready[c]);
  }
  e->dkv_buf = e->kvd_buf = NULL;
  ferry_free(e->kvd_ready);
  ferry_free(e->kvd_mbs);
  e->kvd_ready = NULL;
  e->kvd_mbs = NULL;
  if (e->mbs) ferry_free(e->mbs[0].kvd_slot); /* the others are views into it */
}

/* Micro-batch m's sequences are slots [m x max_batch, (m + 1) x max_batch) (serve.c build_mb()):
 * each has the staging slot of its place there; a sequence's tokens of a step are consecutive
 * positions, its cache held the rows before the first. The step's uses start again. */
void ferry__kv_disk_split(struct ferry_engine *e) {
  if (!e->cfg.kv_home_disk) return;
  e->kvd_n_mbs = 0;
  e->kvd_use = 0;
  for (int32_t m = 0; m < e->n_mb; m++) {
    struct microbatch *b = &e->mbs[m];
    const int32_t s0 = m * e->cfg.max_batch;
    for (int32_t j = 0; j < e->cfg.max_batch; j++) b->kvd_cached[j] = b->kvd_new[j] = 0;
    for (int32_t t = 0; t < b->n_tok; t++) {
      const int32_t j = b->tok_slot[t] - s0;
      b->kvd_slot[t] = j;
      if (!b->kvd_new[j]++) b->kvd_cached[j] = b->tok_pos[t];
    }
    if (b->n_tok) e->kvd_mbs[e->kvd_n_mbs++] = m;
  }
}

/* Staging copy c's K (v 0) or V (v 1) region. */
static uint64_t stage_off(const struct ferry_engine *e, int32_t c, int v) {
  return (uint64_t)c * (uint64_t)ferry__kv_regions(e) * region_bytes(e) + (v ? region_bytes(e) : 0);
}

/* Rows [r, r + n) of staging slot j of copy c and of the file's slot `slot`, K and V, layer l:
 * read into the staging (write 0) or written from it (write 1). */
static ferry_status move_rows(struct ferry_engine *e, int32_t l, int32_t c, int32_t j, int32_t slot, int64_t r,
                              int64_t n, int write) {
  const struct kv_layer *kv = &e->kv[l];
  const uint64_t row = ferry__kv_row_bytes(e), bytes = (uint64_t)n * row, rows = (uint64_t)kv->rows;
  for (int v = 0; v < ferry__kv_regions(e) && bytes; v++) {
    const uint64_t in_file = (v ? kv->v_off : kv->k_off) + ((uint64_t)slot * rows + (uint64_t)r) * row;
    const uint64_t in_stage = stage_off(e, c, v) + ((uint64_t)j * rows + (uint64_t)r) * row;
    const struct ferry_ref file = {e->dkv_buf, in_file, e->kv_dtype}, stage = {e->kvd_buf, in_stage, e->kv_dtype};
    TRY(ferry_exec_copy(e->ex, e->q_disk, write ? file : stage, write ? stage : file, bytes));
    if (write) {
      e->step_bytes_disk_write += bytes;
    } else {
      e->step_bytes_disk += bytes;
      e->step_bytes_kv_disk += bytes;
    }
  }
  return FERRY_OK;
}

/* Use u's reads into its copy: each sequence's cached rows of the layer (a windowed layer's ring
 * holds the last `rows` positions, each at position % rows: its rows as they are), then the copy's
 * ready record, also when nothing was read (it then orders the copy's reuse after the last write
 * out of it, which the disk queue ran before). */
static ferry_status issue_reads(struct ferry_engine *e, int64_t u) {
  if (u >= (int64_t)e->kvd_n_mbs * e->mc->n_layers) return FERRY_OK; /* past the step's last use */
  const int32_t l = (int32_t)(u / e->kvd_n_mbs), m = e->kvd_mbs[u % e->kvd_n_mbs], c = (int32_t)(u % e->kvd_copies);
  const struct microbatch *b = &e->mbs[m];
  const int32_t rows = e->kv[l].rows;
  ferry_status st;
  for (int32_t j = 0; j < e->cfg.max_batch; j++) {
    const int64_t n = b->kvd_cached[j] < rows ? b->kvd_cached[j] : rows;
    if (b->kvd_new[j] && n && (st = move_rows(e, l, c, j, m * e->cfg.max_batch + j, 0, n, 0))) return st;
  }
  TRY(ferry_exec_record(e->ex, e->q_disk, e->kvd_ready[c]));
  return FERRY_OK;
}

ferry_status ferry__kv_disk_begin(struct ferry_engine *e) {
  ferry_status st;
  for (int64_t u = 0; e->cfg.kv_home_disk && u < e->kvd_ahead; u++)
    if ((st = issue_reads(e, u))) return st;
  return FERRY_OK;
}

ferry_status ferry__kv_disk_load(struct ferry_engine *e, int32_t l) {
  if (!e->cfg.kv_home_disk) return FERRY_OK;
  const int64_t u = e->kvd_use++;
  if (!e->kvd_n_mbs || u / e->kvd_n_mbs != l || e->kvd_mbs[u % e->kvd_n_mbs] != e->cur_mb)
    return ferry__err_set(&e->err, FERRY_ERR_INTERNAL,
                          "engine: KV staging use %lld is not layer %d of micro-batch %d (the step's order changed)",
                          (long long)u, l, e->cur_mb);
  e->kvd_cur = (int32_t)(u % e->kvd_copies);
  ferry_status st = issue_reads(e, u + e->kvd_ahead); /* without read-ahead: this use's own */
  if (st != FERRY_OK) return st;
  TRY(ferry_exec_queue_wait(e->ex, e->q_cpu, e->kvd_ready[e->kvd_cur]));
  return FERRY_OK;
}

ferry_status ferry__kv_disk_store(struct ferry_engine *e, int32_t l) {
  if (!e->cfg.kv_home_disk) return FERRY_OK;
  const struct microbatch *b = &e->mbs[e->cur_mb];
  const int64_t rows = e->kv[l].rows;
  /* the CPU has appended the step's rows to the staging */
  TRY(ferry_exec_record(e->ex, e->q_cpu, e->ev_cpu));
  TRY(ferry_exec_queue_wait(e->ex, e->q_disk, e->ev_cpu));
  ferry_status st;
  for (int32_t j = 0; j < e->cfg.max_batch; j++) {
    int64_t n = b->kvd_new[j], r = b->kvd_cached[j] % rows;
    const int32_t slot = e->cur_mb * e->cfg.max_batch + j;
    if (n >= rows) r = 0, n = rows; /* a ring written over whole */
    const int64_t first = r + n <= rows ? n : rows - r; /* a ring's positions wrap to its row 0 */
    if (n && (st = move_rows(e, l, e->kvd_cur, j, slot, r, first, 1))) return st;
    if (first < n && (st = move_rows(e, l, e->kvd_cur, j, slot, 0, n - first, 1))) return st;
  }
  return FERRY_OK;
}

void ferry__kv_disk_redirect(const struct ferry_engine *e, struct ferry_kernel *k, int32_t l) {
  k->aux[2] = (struct ferry_ref){e->kvd_buf, stage_off(e, e->kvd_cur, 0), e->kv_dtype};
  k->aux[3] = ferry__kv_regions(e) == 2 ? (struct ferry_ref){e->kvd_buf, stage_off(e, e->kvd_cur, 1), e->kv_dtype}
                                        : (struct ferry_ref){NULL, 0, e->kv_dtype}; /* MLA: no V rows */
  k->ints2 = e->mbs[e->cur_mb].kvd_slot;
  k->kv_capacity = e->kv[l].rows;
  k->kv_blocks = NULL;
  k->kv_block_tokens = k->kv_blocks_per_seq = 0;
}
