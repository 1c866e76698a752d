/* Moving units: loading resident weights before serving, and streaming blocks and experts into
 * device slots while compute runs. Every transfer is an executor op ordered by events: a slot
 * is refilled only after the compute that used it, a staging buffer only after the copy out of
 * it, and compute waits for the copy that filled its slot. */
#include <string.h>

#include "engine_impl.h"
#include "ferry/store.h"

static struct ferry_ref ref(ferry_buf *b, uint64_t off) { return (struct ferry_ref){b, off, FERRY_DTYPE_U8}; }

static ferry_status exec_error(struct ferry_engine *e, ferry_status st) {
  return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
}

/* Resident weights: host-homed units read straight into host memory; pinned units read through
 * a double-buffered bounce buffer and copied to the device (unless skip_pinned: a re-plan that
 * kept them). Reads use buffered I/O (a load, not streaming), dropping the page cache
 * afterwards when asked. */
ferry_status ferry__engine_load_resident(struct ferry_engine *e, int skip_pinned) {
  ferry_status st = FERRY_OK;
  const unsigned flags = e->cfg.read_flags & FERRY_READ_DROP_CACHE;
  const uint64_t half = e->bounce_bytes / 2;
  ferry_event *read_done[2] = {NULL, NULL}, *copy_done[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++)
    if (ferry_exec_event_create(e->ex, &read_done[i]) || ferry_exec_event_create(e->ex, &copy_done[i])) {
      st = exec_error(e, FERRY_ERR_NOMEM);
      goto out;
    }
  int turn = 0;
  for (int32_t u = 0; u < e->n_units && st == FERRY_OK; u++) {
    const struct unit *un = &e->units[u];
    if (un->pinned && skip_pinned) continue;
    for (int32_t r = 0; r < un->n_ranges && st == FERRY_OK; r++) {
      const struct unit_range *rg = &un->ranges[r];
      if (!un->pinned) {
        if (un->home != FERRY_TIER_HOST) continue;
        st = ferry_exec_read(e->ex, e->q_disk, e->store, rg->file, rg->file_offset, rg->len,
                             ref(e->host_units_buf, un->host_offset + rg->unit_offset), flags);
        if (st) st = exec_error(e, st);
        continue;
      }
      for (uint64_t done = 0; done < rg->len && st == FERRY_OK; done += half) {
        uint64_t n = rg->len - done < half ? rg->len - done : half;
        struct ferry_ref bounce = ref(e->bounce_buf, (uint64_t)turn * half);
        if ((st = ferry_exec_queue_wait(e->ex, e->q_disk, copy_done[turn])) ||
            (st = ferry_exec_read(e->ex, e->q_disk, e->store, rg->file, rg->file_offset + done, n, bounce, flags)) ||
            (st = ferry_exec_record(e->ex, e->q_disk, read_done[turn])) ||
            (st = ferry_exec_queue_wait(e->ex, e->q_h2d, read_done[turn])))
          st = exec_error(e, st);
        /* every device holding the unit gets its copy (one, unless the run spans devices) */
        for (int32_t d = 0; st == FERRY_OK && d < FERRY_EXEC_MAX_DEVICES; d++)
          if (un->devices >> d & 1u &&
              (st = ferry_exec_copy(e->ex, e->q_h2d, ref(e->devs ? e->devs[d].pinned : e->pinned_buf,
                                                         un->device_offset + rg->unit_offset + done),
                                    bounce, n)) != FERRY_OK)
            st = exec_error(e, st);
        if (st == FERRY_OK && (st = ferry_exec_record(e->ex, e->q_h2d, copy_done[turn])) != FERRY_OK)
          st = exec_error(e, st);
        turn ^= 1;
      }
    }
  }
  if (st == FERRY_OK) {
    st = ferry_exec_drain(e->ex);
    if (st != FERRY_OK) st = exec_error(e, st);
  }
out:
  ferry_exec_drain(e->ex);
  for (int i = 0; i < 2; i++) {
    ferry_exec_event_destroy(e->ex, read_done[i]);
    ferry_exec_event_destroy(e->ex, copy_done[i]);
  }
  return st;
}

void ferry__engine_fill_prepare(struct ferry_engine *e, int32_t u, struct fill *f) {
  f->sg = NULL;
  f->base = 0;
  if (e->units[u].home != FERRY_TIER_HOST) {
    const int32_t si = e->next_staging;
    e->next_staging = (e->next_staging + 1) % e->plan.n_staging_slots;
    f->sg = &e->staging[si];
    f->base = (uint64_t)si * e->plan.staging_slot_bytes;
  }
}

/* The weight traffic of a fill, by class and by layer (a block's counts to its first layer). */
static void count_fill(struct ferry_engine *e, const struct unit *un, uint64_t bytes) {
  if (un->kind == UNIT_EXPERT) e->step_bytes_experts += bytes;
  else e->step_bytes_blocks += bytes;
  if (e->layer_stats && un->layer >= 0) e->layer_stats[un->layer].bytes_h2d += bytes;
}

int64_t ferry__engine_fill_key(const struct slot *sl, const struct fill *f) {
  return 3 * (sl->used != 0) + (f->sg ? 1 + (f->sg->used != 0) : 0);
}

/* The bytes of a range of unit un that cross this rank's own link: all of them, or under
 * ZeRO-3's partitioned fetch (zero_gpus N > 1) this rank's partition of each contiguous range of
 * a streamed block, ceil(len / N) (DeepSpeed pads every parameter to a multiple of N and gives
 * each rank one part; the all-gather waits for the largest). */
static uint64_t own_bytes(const struct ferry_engine *e, const struct unit *un, uint64_t len) {
  const uint64_t n = e->cfg.zero_gpus > 1 ? (uint64_t)e->cfg.zero_gpus : 1;
  return un->kind == UNIT_EXPERT ? len : (len + n - 1) / n;
}

/* Copy each range of unit u to the device from where the fill has it (host memory, or the
 * staging slot it was read into): this rank's partition over the link, then, once all of it is
 * there, the peers' parts over the interconnect (the all-gather; the same bytes from the same
 * place, ferry_exec_copy_peers()). */
static ferry_status copy_ranges(struct ferry_engine *e, const struct unit *un, const struct fill *f, ferry_buf *dev,
                                uint64_t dev_off) {
  const int direct = f->sg && (e->cfg.read_flags & FERRY_READ_DIRECT) != 0;
  ferry_buf *src = f->sg ? e->staging_buf : e->host_units_buf;
  ferry_status st = FERRY_OK;
  for (int peers = 0; peers < 2 && st == FERRY_OK; peers++) {
    uint64_t pos = 0;
    for (int32_t r = 0; r < un->n_ranges && st == FERRY_OK; r++) {
      const struct unit_range *rg = &un->ranges[r];
      const uint64_t off = f->sg ? f->base + pos + (direct ? rg->file_offset % FERRY_DIRECT_ALIGN : 0)
                                 : un->host_offset + rg->unit_offset;
      const uint64_t own = own_bytes(e, un, rg->len);
      if (!peers)
        st = ferry_exec_copy(e->ex, e->q_h2d, ref(dev, dev_off + rg->unit_offset), ref(src, off), own);
      else if (own < rg->len)
        st = ferry_exec_copy_peers(e->ex, e->q_h2d, ref(dev, dev_off + rg->unit_offset + own), ref(src, off + own),
                                   rg->len - own);
      pos += (direct ? ferry_store_direct_span(rg->file_offset, rg->len) : rg->len);
      pos = (pos + FERRY_DIRECT_ALIGN - 1) / FERRY_DIRECT_ALIGN * FERRY_DIRECT_ALIGN;
    }
  }
  return st;
}

/* Only ops: a memoised fill skips this, and ferry__engine_fill_done() updates the state on
 * both paths. Marked as an NVTX-style range of the host issuing it. */
ferry_status ferry__engine_fill_ops(struct ferry_engine *e, struct slot *sl, const struct fill *f, ferry_buf *dev,
                                    uint64_t dev_off, int32_t u) {
  const struct unit *un = &e->units[u];
  const int expert = un->kind == UNIT_EXPERT;
  struct staging_slot *sg = f->sg;
  struct ferry_exec_range range = ferry_exec_range_begin(e->ex, expert ? "expert fetch" : "block fetch",
                                                         (int32_t)e->n_steps, un->layer, expert ? un->expert : -1);
  ferry_status st = FERRY_OK;
  if (sl->used && (st = ferry_exec_queue_wait(e->ex, e->q_h2d, sl->free))) goto out;
  if (!sg) {
    if ((st = copy_ranges(e, un, f, dev, dev_off))) goto out;
  } else {
    const int direct = (e->cfg.read_flags & FERRY_READ_DIRECT) != 0;
    if (sg->used && (st = ferry_exec_queue_wait(e->ex, e->q_disk, sg->free))) goto out;
    uint64_t pos = 0;
    for (int32_t r = 0; r < un->n_ranges; r++) {
      const struct unit_range *rg = &un->ranges[r];
      st = ferry_exec_read(e->ex, e->q_disk, e->store, rg->file, rg->file_offset, rg->len,
                           ref(e->staging_buf, f->base + pos), e->cfg.read_flags);
      if (st) goto out;
      pos += (direct ? ferry_store_direct_span(rg->file_offset, rg->len) : rg->len);
      pos = (pos + FERRY_DIRECT_ALIGN - 1) / FERRY_DIRECT_ALIGN * FERRY_DIRECT_ALIGN;
    }
    if ((st = ferry_exec_record(e->ex, e->q_disk, e->ev_read)) || (st = ferry_exec_queue_wait(e->ex, e->q_h2d, e->ev_read)))
      goto out;
    if ((st = copy_ranges(e, un, f, dev, dev_off)) ||
        (st = ferry_exec_record(e->ex, e->q_h2d, sg->free)))
      goto out;
  }
  st = ferry_exec_record(e->ex, e->q_h2d, sl->ready);
out:
  ferry_exec_range_end(e->ex, &range);
  return st ? exec_error(e, st) : FERRY_OK;
}

void ferry__engine_fill_done(struct ferry_engine *e, struct slot *sl, const struct fill *f, int32_t u) {
  const struct unit *un = &e->units[u];
  for (int32_t r = 0; r < un->n_ranges; r++) {
    const uint64_t len = un->ranges[r].len, own = own_bytes(e, un, len);
    e->step_bytes_h2d += own;
    e->step_bytes_peers += len - own;
    count_fill(e, un, own);
    if (f->sg) e->step_bytes_disk += len;
  }
  if (f->sg) f->sg->used = 1;
  const int32_t s = (int32_t)(sl - (un->kind == UNIT_BLOCK ? e->block_slots : e->expert_slots));
  /* the unit it held may be in another slot too (prefetch_blocks()): only this copy goes */
  if (sl->unit >= 0 && e->unit_slot[sl->unit] == s) e->unit_slot[sl->unit] = -1;
  e->unit_slot[u] = s;
  sl->unit = u;
  sl->used = 0;
}

/* Fill a device slot with unit u: the same ops for the same unit and slot state, recorded
 * once per (unit, slot state). */
static ferry_status fill_slot(struct ferry_engine *e, struct slot *sl, ferry_buf *dev, uint64_t dev_off, int32_t u) {
  struct fill f;
  ferry__engine_fill_prepare(e, u, &f);
  ferry_event *params[3] = {sl->free, sl->ready, f.sg ? f.sg->free : NULL};
  struct memo_site site;
  int replayed;
  ferry_status st = ferry__memo_begin(e, &site, MEMO_FILL, u, ferry__engine_fill_key(sl, &f), params, 3, -1, &replayed);
  if (st == FERRY_OK && !replayed) st = ferry__memo_end(e, &site, ferry__engine_fill_ops(e, sl, &f, dev, dev_off, u));
  if (st != FERRY_OK) return st;
  ferry__engine_fill_done(e, sl, &f, u);
  return FERRY_OK;
}

int32_t ferry__engine_block_slot(struct ferry_engine *e, int64_t seq) { return (int32_t)(seq % e->plan.n_block_slots); }

/* Streamed blocks are fetched in a cyclic order (0 .. n_blocks-1, again for the next step), so
 * the prefetch window runs across step boundaries. A slot that already holds the block is not
 * refilled (happens when every block has a slot of its own), and becomes the copy its weights are
 * read from: a step that computes the streamed layers on the CPU (--offload-compute layers=auto)
 * passes over their places in the order, so a block prefetched before it may be fetched again
 * into another slot after it, and the two copies' slots come round again in turn. */
ferry_status ferry__engine_prefetch_blocks(struct ferry_engine *e, int64_t upto_seq) {
  const struct ferry_plan *p = &e->plan;
  while (e->block_fetch_seq <= upto_seq) {
    int64_t seq = e->block_fetch_seq++;
    int32_t b = (int32_t)(seq % p->n_blocks), s = ferry__engine_block_slot(e, seq);
    int32_t u = e->block_unit[b];
    struct slot *sl = &e->block_slots[s];
    if (sl->unit == u) {
      e->unit_slot[u] = s;
      continue;
    }
    ferry_status st = fill_slot(e, sl, e->block_buf, (uint64_t)s * p->block_slot_bytes, u);
    if (st != FERRY_OK) return st;
  }
  return FERRY_OK;
}

ferry_status ferry__engine_fetch_expert(struct ferry_engine *e, int32_t unit, int32_t slot) {
  return fill_slot(e, &e->expert_slots[slot], e->expert_buf, (uint64_t)slot * e->plan.expert_slot_bytes, unit);
}
