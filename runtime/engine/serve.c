/* Serving: requests arrive on the executor's clock (so replay is the same code for real and
 * simulated runs), wait FCFS for a KV-cache slot, and are batched continuously: every step
 * carries one decode token per running sequence plus prefill chunks up to the token budget. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/metrics.h"
#include "common/units.h"
#include "engine_impl.h"

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Token j of request id: the same for every executor and every run with this seed. */
static int32_t token_id(const struct ferry_engine *e, int64_t req_id, int64_t j) {
  return (int32_t)(mix64(e->cfg.seed ^ mix64((uint64_t)req_id * 0x100000001b3ULL + (uint64_t)j)) %
                   (uint64_t)e->mc->vocab);
}

static int cmp_arrival(const void *a, const void *b) {
  const struct ferry_engine_request *x = a, *y = b;
  if (x->arrival_ns != y->arrival_ns) return x->arrival_ns < y->arrival_ns ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t argmax(const float *v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return (int32_t)best;
}

/* A sequence with prompt (or recomputed) tokens still to prefill. */
static int prefilling(const struct seq *q) { return q->active && q->prompt_done < q->prefill; }

/* Build micro-batch m's token list from its sequences (slots [m x max_batch, (m + 1) x
 * max_batch)); returns the number of sequences in it. hold_decode: the step carries prompt tokens
 * only (prefill-first scheduling while a prompt waits). */
static int32_t build_mb(struct ferry_engine *e, int32_t m, int64_t *admit_order, int hold_decode) {
  const int32_t B = e->cfg.max_batch, s0 = m * B, s1 = s0 + B;
  struct microbatch *mb = &e->mbs[m];
  int32_t n = 0, rows = 0, batch = 0;
  for (int32_t s = s0; s < s1; s++) e->seqs[s].step_tokens = 0;
  /* decode tokens first: one per sequence past its prompt */
  for (int32_t s = s0; s < s1 && !hold_decode; s++) {
    struct seq *q = &e->seqs[s];
    if (!q->active || q->prompt_done < q->prefill) continue;
    q->step_tokens = 1;
    mb->tok_ids[n] = q->last_token;
    e->seq_tokens[(int64_t)s * e->kv_capacity + q->pos] = q->last_token;
    mb->tok_pos[n] = q->pos;
    mb->tok_slot[n] = s;
    mb->tok_seq[n] = s;
    mb->tok_index[n] = q->pos;
    mb->row_of_seq[rows++] = n;
    n++;
    batch++;
  }
  /* then prefill chunks, in admission order */
  for (;;) {
    int32_t pick = -1;
    for (int32_t s = s0; s < s1; s++) {
      struct seq *q = &e->seqs[s];
      if (!prefilling(q) || q->step_tokens) continue;
      if (pick < 0 || admit_order[s] < admit_order[pick]) pick = s;
    }
    if (pick < 0 || n >= e->cfg.max_step_tokens) break;
    struct seq *q = &e->seqs[pick];
    const struct ferry_engine_request *r = &e->reqs[q->req];
    int32_t chunk = q->prefill - q->prompt_done;
    if (chunk > e->cfg.max_step_tokens - n) chunk = e->cfg.max_step_tokens - n;
    for (int32_t j = 0; j < chunk; j++) {
      int32_t p = q->prompt_done + j;
      mb->tok_ids[n] = token_id(e, r->id, p);
      e->seq_tokens[(int64_t)pick * e->kv_capacity + p] = mb->tok_ids[n];
      mb->tok_pos[n] = p;
      mb->tok_slot[n] = pick;
      mb->tok_seq[n] = pick;
      mb->tok_index[n] = p;
      n++;
    }
    q->step_tokens = chunk;
    /* a recomputed sequence's prefill ends where its next input token is already known */
    if (q->prompt_done + chunk == q->prefill && !q->resumed) mb->row_of_seq[rows++] = n - 1;
    batch++;
  }
  mb->n_tok = n;
  mb->n_rows = rows;
  return batch;
}

/* Build every micro-batch of the step; returns the sequences in it and the tokens in *tokens. */
static int32_t build_step(struct ferry_engine *e, int64_t *admit_order, int32_t *tokens) {
  int32_t batch = 0;
  *tokens = 0;
  /* prefill-first (vLLM's scheduler without chunked prefill, FlexGen's lockstep block, a static
   * batch): while any admitted prompt still has tokens to prefill, no sequence decodes */
  int hold_decode = 0;
  for (int32_t s = 0; e->cfg.prefill_first && s < e->n_seqs && !hold_decode; s++)
    hold_decode = prefilling(&e->seqs[s]);
  for (int32_t m = 0; m < e->n_mb; m++) {
    batch += build_mb(e, m, admit_order, hold_decode);
    *tokens += e->mbs[m].n_tok;
  }
  return batch;
}

/* Paged KV cache: preempt the most recently admitted sequence (vLLM's recompute, or swap): its
 * blocks go back to the pool (swap: after a copy to host memory) and its request to the head of
 * the waiting queue, to prefill its tokens again (swap: to copy them back) when blocks are free.
 * Grows the step table for the steps that prefill takes. */
static ferry_status preempt(struct ferry_engine *e, struct ferry__serve_state *rs) {
  int32_t v = -1;
  for (int32_t s = 0; s < e->n_seqs; s++)
    if (e->seqs[s].active && (v < 0 || rs->admit_order[s] > rs->admit_order[v])) v = s;
  if (v < 0) return ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "engine: a step needs KV blocks and none can be freed");
  struct seq *q = &e->seqs[v];
  /* swapped: its state is kept as it stands; else decoding: resume where it stands; in its first
   * prefill: start again; re-prefilling after an earlier preemption: that record still holds */
  struct resume *r = &e->resumes[q->req];
  ferry_status st = FERRY_OK;
  if (e->cfg.kv_preempt_swap && q->pos > 0 && ferry__kv_pages_swap_out(e, v, r, &st)) {
    r->saved = *q; /* swapped, decoding or prefilling: it goes on from where it stands */
    r->saved.version = NULL; /* it holds no weights version while it waits */
    r->swap_version = q->version->id;
    r->preempted = 1;
    e->swaps++;
  } else if (st != FERRY_OK) {
    return st;
  } else if (q->prompt_done >= q->prefill) {
    *r = (struct resume){.pos = q->pos, .generated = q->generated, .last_token = q->last_token, .preempted = 1};
  }
  ferry__kv_pages_release(e, v);
  q->active = 0;
  q->version->refs--;
  q->step_tokens = 0;
  rs->waiting[--rs->w_head] = q->req; /* it was admitted: its place in the queue is free */
  rs->active--;
  e->preemptions++;
  const int64_t more = q->pos / e->cfg.max_step_tokens + 2;
  struct ferry_step_metrics *grown = ferry__reallocarray(e->steps, (size_t)(e->cap_steps + more), sizeof *grown);
  if (!grown) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the step table");
  e->steps = grown;
  e->cap_steps += more;
  return FERRY_OK;
}

/* Give every sequence of the step the blocks its new tokens need, preempting (and rebuilding the
 * step) while the pool is short. */
static ferry_status page_step(struct ferry_engine *e, struct ferry__serve_state *rs, int32_t *batch, int32_t *tokens) {
  for (;;) {
    int ok = 1;
    for (int32_t s = 0; s < e->n_seqs && ok; s++) {
      const struct seq *q = &e->seqs[s];
      if (q->active && q->step_tokens) ok = ferry__kv_pages_grow(e, s, (int64_t)q->pos + q->step_tokens);
    }
    if (ok) return FERRY_OK;
    ferry_status st = preempt(e, rs);
    if (st != FERRY_OK) return st;
    *batch = build_step(e, rs->admit_order, tokens);
  }
}

/* A request as served: checked, its arrival scaled (or 0 as fast as possible). */
static ferry_status arrival_check(ferry_engine *e, const struct ferry_engine_request *in, const struct ferry_run_options *o,
                                  struct ferry_engine_request *out) {
  *out = *in;
  if (in->output_tokens < 1 || in->prompt_tokens < 1 || in->arrival_ns < 0)
    return ferry__err_set(&e->err, FERRY_ERR_INVALID, "request %lld: needs prompt and output tokens >= 1 (got %d, %d)",
                          (long long)in->id, in->prompt_tokens, in->output_tokens);
  if (o->as_fast_as_possible)
    out->arrival_ns = 0;
  else if (ferry__scale_ns(in->arrival_ns, o->time_scale, &out->arrival_ns) != FERRY_OK)
    return ferry__err_set(&e->err, FERRY_ERR_RANGE,
                          "request %lld: arrival %lld ns x time scale %g is past the int64 nanosecond clock",
                          (long long)in->id, (long long)in->arrival_ns, o->time_scale);
  return FERRY_OK;
}

/* The requests (copied, validated, arrival times scaled, sorted) and the per-request and
 * per-step arrays, bounded up front: each step produces a token or finishes a prefill chunk. */
static ferry_status prepare_run(ferry_engine *e, const struct ferry_engine_request *requests, int64_t n,
                                const struct ferry_run_options *o, struct ferry__serve_state *rs) {
  ferry_free(e->reqs);
  ferry_free(e->req_metrics);
  ferry_free(e->steps);
  e->reqs = NULL;
  e->req_metrics = NULL;
  e->steps = NULL;
  e->n_reqs = e->n_steps = 0;
  e->xplan.prefetches = e->xplan.prefetches_used = 0;
  e->prefetches_before = e->prefetches_used_before = 0;
  for (int32_t l = 0; l < e->mc->n_layers; l++) e->layer_stats[l] = (struct ferry_layer_metrics){.layer = l};
  int64_t cap = 16;
  for (int64_t i = 0; i < n; i++)
    cap += requests[i].output_tokens + requests[i].prompt_tokens / (e->cfg.max_step_tokens) + 2;
  e->reqs = ferry__calloc((size_t)(n ? n : 1), sizeof *e->reqs);
  e->req_metrics = ferry__calloc((size_t)(n ? n : 1), sizeof *e->req_metrics);
  e->steps = ferry__calloc((size_t)cap, sizeof *e->steps);
  /* committed now, not page by page as steps complete: the serving loop takes no page fault
   * for its records, and a long run's memory stays flat */
  if (e->steps) memset(e->steps, 0, (size_t)cap * sizeof *e->steps);
  e->cap_steps = cap;
  rs->admit_order = ferry__calloc((size_t)e->n_seqs, sizeof *rs->admit_order);
  rs->waiting = ferry__calloc((size_t)(n ? n : 1), sizeof *rs->waiting);
  if (!e->reqs || !e->req_metrics || !rs->admit_order || !rs->waiting || !e->steps)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for %lld requests", (long long)n);
  if (n) memcpy(e->reqs, requests, (size_t)n * sizeof *requests); /* begun empty: requests may be NULL */
  for (int64_t i = 0; i < n; i++) {
    const ferry_status st = arrival_check(e, &requests[i], o, &e->reqs[i]);
    if (st != FERRY_OK) return st;
  }
  qsort(e->reqs, (size_t)n, sizeof *e->reqs, cmp_arrival);
  e->n_reqs = n;
  for (int64_t i = 0; i < n; i++) {
    struct ferry_request_metrics *m = &e->req_metrics[i];
    m->id = e->reqs[i].id;
    m->arrival_ns = e->reqs[i].arrival_ns;
    m->prompt_tokens = e->reqs[i].prompt_tokens;
    m->first_token_ns = m->finish_ns = -1;
  }
  memset(e->seqs, 0, (size_t)e->n_seqs * sizeof *e->seqs);
  e->preemptions = e->swaps = 0;
  if (e->kv_block) {
    ferry_free(e->resumes);
    e->resumes = ferry__calloc((size_t)(n ? n : 1), sizeof *e->resumes);
    if (!e->resumes) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for %lld requests", (long long)n);
    ferry__kv_pages_reset(e);
  }
  e->current->refs = 0;
  rs->n = rs->cap_reqs = n;
  return FERRY_OK;
}

/* Request r into free slot s: a new sequence, or (paged) one preempted before, recomputed or
 * swapped back into fresh blocks to go on where it stood. 0 when a paged cache lacks the blocks
 * (it waits), 1 when admitted, or a negative status. */
static int admit_one(ferry_engine *e, struct ferry__serve_state *rs, int64_t r, int32_t s) {
  const struct ferry_engine_request *rq = &e->reqs[r];
  struct resume *rm = e->kv_block ? &e->resumes[r] : NULL;
  if (rm && rm->swap_n && rm->swap_version != e->current->id) ferry__kv_pages_swap_drop(e, rm); /* reloaded since */
  const int resumed = rm && rm->preempted;
  /* paged: admitted when the blocks for its prefill and first new token are free (swapped:
   * those of the rest of its prefill, or its next token) */
  const int32_t swapped = resumed && rm->swap_n;
  const int32_t upto = swapped ? (rm->saved.prefill > rm->saved.pos ? rm->saved.prefill : rm->saved.pos)
                       : resumed ? rm->pos
                                 : rq->prompt_tokens;
  if (e->kv_block && ferry__kv_pages_need(e, (int64_t)upto + 1) > e->kv_free_count) return 0;
  e->seqs[s] = (struct seq){.req = r, .kv_slot = s, .active = 1, .prefill = rq->prompt_tokens, .version = e->current};
  if (resumed && !swapped)
    e->seqs[s] = (struct seq){.req = r, .kv_slot = s, .active = 1, .prefill = rm->pos, .generated = rm->generated,
                              .last_token = rm->last_token, .resumed = 1, .version = e->current};
  if (swapped) { /* its rows come back into fresh blocks; it goes on where it stood */
    e->seqs[s] = rm->saved;
    e->seqs[s].kv_slot = s;
    e->seqs[s].step_tokens = 0;
    e->seqs[s].active = 1;
    e->seqs[s].version = e->current;
    const ferry_status st = ferry__kv_pages_swap_in(e, s, rm);
    if (st != FERRY_OK) return (int)st;
    for (int32_t p = 0; p < e->seqs[s].pos; p++) /* its token ids, for the logits callback */
      e->seq_tokens[(int64_t)s * e->kv_capacity + p] = token_id(e, rq->id, p);
  }
  e->current->refs++;
  rs->admit_order[s] = rs->admitted++;
  rs->active++;
  return 1;
}

/* Arrived requests join the queue; admit FCFS while KV slots are free; reject what can never
 * fit; under the last pressure level refuse (a preempted one goes on), and while a reload waits
 * for the running sequences (draining), hold. */
static ferry_status admit(ferry_engine *e, struct ferry__serve_state *rs, int64_t now, int draining) {
  while (rs->next < rs->n && e->reqs[rs->next].arrival_ns <= now) rs->waiting[rs->w_tail++] = rs->next++;
  while (rs->w_head < rs->w_tail) {
    const int64_t r = rs->waiting[rs->w_head];
    const struct ferry_engine_request *rq = &e->reqs[r];
    const int64_t len = (int64_t)rq->prompt_tokens + rq->output_tokens;
    if (len > e->kv_capacity || (e->kv_block && ferry__kv_pages_need(e, len) > e->kv_pool_blocks)) {
      e->req_metrics[r].rejected = 1;
      rs->w_head++;
      rs->done++;
      continue;
    }
    if (e->refusing && !(e->kv_block && e->resumes[r].preempted)) {
      e->req_metrics[r].refused = 1;
      ferry__engine_event(e, FERRY_ENGINE_EVENT_REFUSED, FERRY_TIER_HOST, NAN, "request refused",
                          "request %lld refused: memory pressure (level %d, %s)", (long long)rq->id, e->level,
                          "new requests are refused until pressure falls");
      rs->w_head++;
      rs->done++;
      continue;
    }
    if (draining) break;
    int32_t s = -1;
    for (int32_t i = 0; i < e->n_seqs && s < 0; i++)
      if (!e->seqs[i].active) s = i;
    if (s < 0) break;
    const int got = admit_one(e, rs, r, s);
    if (got < 0) return (ferry_status)got;
    if (!got) break;
    rs->w_head++;
  }
  return FERRY_OK;
}

/* What a step moved and how busy the queues were, from the engine's step counters. */
static void step_measures(ferry_engine *e, struct ferry_step_metrics *sm, const int64_t busy0[4], int64_t stall0) {
  const int32_t qc = e->q_compute;
  sm->bytes_disk = e->step_bytes_disk;
  sm->bytes_h2d = e->step_bytes_h2d;
  sm->bytes_d2h = e->step_bytes_d2h;
  sm->hits = e->step_hits;
  sm->misses = e->step_misses;
  sm->stall_ns = ferry_exec_queue_stall_ns(e->ex, qc) - stall0;
  /* copies and reads of a step may still run after its logits are back (prefetches for the
   * next step): their time is counted in the step in which they complete */
  sm->compute_busy_ns = ferry_exec_queue_busy_ns(e->ex, qc) - busy0[0];
  sm->h2d_busy_ns = ferry_exec_queue_busy_ns(e->ex, e->q_h2d) - busy0[1];
  sm->disk_busy_ns = ferry_exec_queue_busy_ns(e->ex, e->q_disk) - busy0[2];
  sm->cpu_busy_ns = e->q_cpu >= 0 ? ferry_exec_queue_busy_ns(e->ex, e->q_cpu) - busy0[3] : 0;
  sm->bytes_act = e->step_bytes_act;
  sm->cpu_experts = e->step_cpu_experts;
  sm->bytes_blocks = e->step_bytes_blocks;
  sm->bytes_peers = e->step_bytes_peers;
  sm->bytes_experts = e->step_bytes_experts;
  sm->evictions = e->step_evictions;
  sm->bytes_kv_disk = e->step_bytes_kv_disk;
  sm->bytes_disk_write = e->step_bytes_disk_write;
}

/* One step on the executor, measured. *ran is 0 when a paged cache sent the step's only
 * sequence back to wait for the whole pool (nothing ran). */
static ferry_status run_step(ferry_engine *e, struct ferry__serve_state *rs, int *ran) {
  struct ferry_step_metrics *sm = &e->steps[e->n_steps];
  memset(sm, 0, sizeof *sm);
  sm->step = e->n_steps;
  const int64_t start = ferry_exec_now(e->ex) - rs->t0;
  struct ferry_exec_range range = ferry_exec_range_begin(e->ex, "step", (int32_t)sm->step, -1, -1);
  const int32_t qc = e->q_compute;
  const int64_t stall0 = ferry_exec_queue_stall_ns(e->ex, qc);
  const int64_t busy0[4] = {ferry_exec_queue_busy_ns(e->ex, qc), ferry_exec_queue_busy_ns(e->ex, e->q_h2d),
                            ferry_exec_queue_busy_ns(e->ex, e->q_disk),
                            e->q_cpu >= 0 ? ferry_exec_queue_busy_ns(e->ex, e->q_cpu) : 0};
  e->step_bytes_disk = e->step_bytes_d2h = e->step_bytes_act = 0;
  e->step_bytes_h2d = e->swap_h2d_pending; /* sequences swapped back in as they were admitted */
  e->swap_h2d_pending = 0;
  e->step_bytes_blocks = e->step_bytes_experts = e->step_bytes_peers = 0;
  e->step_bytes_kv_disk = e->step_bytes_disk_write = 0;
  e->step_hits = e->step_misses = e->step_cpu_experts = e->step_evictions = 0;
  int32_t tokens = 0, batch = build_step(e, rs->admit_order, &tokens);
  ferry_status st = e->kv_block ? page_step(e, rs, &batch, &tokens) : FERRY_OK;
  *ran = st == FERRY_OK && tokens > 0;
  /* a step that prefills (a prompt chunk, alone or beside decode tokens) is marked as such: an
   * engine that replays CUDA graphs for decode-only steps runs it eagerly (runtime.prefill_launch_ns) */
  int prefills = 0;
  for (int32_t s = 0; *ran && s < e->n_seqs && !prefills; s++)
    prefills = prefilling(&e->seqs[s]) && e->seqs[s].step_tokens > 0;
  struct ferry_exec_range prefill = {0};
  if (prefills) prefill = ferry_exec_range_begin(e->ex, "prefill", (int32_t)e->n_steps, -1, -1); /* sm may have moved */
  if (*ran) st = ferry__engine_step(e);
  if (prefills) ferry_exec_range_end(e->ex, &prefill);
  ferry_exec_range_end(e->ex, &range);
  if (st != FERRY_OK || !*ran) return st;
  sm = &e->steps[e->n_steps]; /* a preemption grows the step table */
  sm->step = e->n_steps;
  sm->start_ns = start;
  sm->end_ns = ferry_exec_now(e->ex) - rs->t0;
  sm->batch = batch;
  sm->tokens = tokens;
  step_measures(e, sm, busy0, stall0);
  e->n_steps++;
  ferry_exec_sample_memory(e->ex);
  return FERRY_OK;
}

/* Micro-batch mbi's logits rows are generated tokens (their next input drawn or, greedy, the
 * argmax); a sequence that has them all is done. */
static void mb_outcomes(ferry_engine *e, struct ferry__serve_state *rs, int32_t mbi, int64_t end) {
  const struct microbatch *mb = &e->mbs[mbi];
  const float *logits = NULL;
  if (e->has_data) {
    const uint64_t off =
        ferry__readback_logits_offset(e) + (uint64_t)mbi * (uint64_t)e->cfg.max_batch * (uint64_t)e->mc->vocab * 4;
    logits = (const float *)((const char *)ferry_exec_buf_host_ptr(e->ex, e->readback_buf) + off);
  }
  for (int32_t i = 0; i < mb->n_rows; i++) {
    const int32_t t = mb->row_of_seq[i], s_idx = mb->tok_seq[t];
    struct seq *q = &e->seqs[s_idx];
    const struct ferry_engine_request *rq = &e->reqs[q->req];
    struct ferry_request_metrics *m = &e->req_metrics[q->req];
    const float *row = logits ? logits + (int64_t)i * e->mc->vocab : NULL;
    if (row && e->cfg.on_logits)
      e->cfg.on_logits(e->cfg.logits_user, rq->id, q->generated, e->seq_tokens + (int64_t)s_idx * e->kv_capacity,
                       mb->tok_pos[t] + 1, row, e->mc->vocab);
    if (q->generated == 0) m->first_token_ns = end;
    q->last_token = (row && e->cfg.greedy) ? argmax(row, e->mc->vocab) : token_id(e, rq->id, rq->prompt_tokens + q->generated);
    q->generated++;
    m->output_tokens = q->generated;
    if (q->generated == rq->output_tokens) {
      m->finish_ns = end;
      ferry__kv_pages_release(e, s_idx);
      q->active = 0;
      q->version->refs--;
      rs->active--;
      rs->done++;
    }
  }
}

/* Outcomes of a step: each micro-batch's generated tokens; the step's tokens are now in the KV
 * cache. */
static void step_outcomes(ferry_engine *e, struct ferry__serve_state *rs) {
  struct ferry_step_metrics *sm = &e->steps[e->n_steps - 1];
  for (int32_t mbi = 0; mbi < e->n_mb; mbi++) mb_outcomes(e, rs, mbi, sm->end_ns);
  for (int32_t s = 0; s < e->n_seqs; s++) {
    struct seq *q = &e->seqs[s];
    if (!q->step_tokens) continue;
    if (q->prompt_done < q->prefill) {
      q->prompt_done += q->step_tokens;
      if (q->prompt_done == q->prefill) q->resumed = 0; /* recomputed: decoding on from last_token */
    }
    q->pos += q->step_tokens;
    sm->kv_tokens += q->pos; /* a sequence finished in this step still held its cache during it */
  }
  if (e->kv_block) sm->kv_blocks = e->kv_pool_blocks - e->kv_free_count;
}

/* Steps until every request known so far is done, until the clock reaches `until` (time since
 * the run's start) or after `max_steps` steps; between steps with nothing to run, the clock
 * sleeps to the next arrival. A request arriving at `until` or later is left for the next call:
 * a caller adding requests in arrival order (ferry_engine_serve_add()) sees the same steps as
 * one run over all. */
static ferry_status serve_loop(ferry_engine *e, struct ferry__serve_state *rs, int64_t until, int64_t max_steps) {
  const struct ferry_run_options *o = &rs->o;
  for (int64_t ran_steps = 0; rs->done < rs->n && ran_steps < max_steps;) {
    const int64_t now = ferry_exec_now(e->ex) - rs->t0;
    if (now >= until) break;
    /* step boundary: budget changes, memory pressure, a staged reload */
    if (o->on_tick) o->on_tick(o->tick_user, e, now);
    ferry_status st = ferry__engine_adapt(e, now);
    if (st != FERRY_OK || (st = admit(e, rs, now, ferry__engine_draining(e))) != FERRY_OK) return st;
    if (!rs->active) {
      if (rs->next < rs->n) {
        if (e->reqs[rs->next].arrival_ns >= until) break;
        ferry_exec_sleep_until(e->ex, rs->t0 + e->reqs[rs->next].arrival_ns);
        continue;
      }
      if (rs->w_head == rs->w_tail) break;
      continue;
    }
    int ran;
    if ((st = run_step(e, rs, &ran)) != FERRY_OK) return st;
    if (!ran) continue;
    ran_steps++;
    step_outcomes(e, rs);
    /* progress is paced by the wall clock: a simulated run covers hours of virtual time */
    if (o->progress && ferry__mono_ns() - rs->last_progress > 2000000000LL) {
      fprintf(stderr, "ferry: %lld/%lld requests done, %lld steps, t=%.1f s\n", (long long)rs->done, (long long)rs->n,
              (long long)e->n_steps, (double)e->steps[e->n_steps - 1].end_ns / 1e9);
      rs->last_progress = ferry__mono_ns();
    }
    if (e->n_steps >= e->cap_steps)
      return ferry__err_set(&e->err, FERRY_ERR_INTERNAL, "engine: more steps than the bound %lld", (long long)e->cap_steps);
  }
  return FERRY_OK;
}

/* The run failed: its state is released and the error is the thread's last. */
static ferry_status serve_close(ferry_engine *e, ferry_status st) {
  struct ferry__serve_state *rs = &e->serve;
  ferry_free(rs->admit_order);
  ferry_free(rs->waiting);
  rs->admit_order = rs->waiting = NULL;
  rs->open = 0;
  if (st != FERRY_OK) ferry__err_copy(NULL, &e->err);
  return st;
}

void ferry__engine_serve_abort(ferry_engine *e) {
  if (e->serve.open) serve_close(e, FERRY_OK);
}

ferry_status ferry_engine_serve_begin(ferry_engine *e, const struct ferry_engine_request *requests, int64_t n,
                                      const struct ferry_run_options *opts) {
  if (e->serve.open) return ferry__fail(FERRY_ERR_INVALID, "engine: a run is already being served (finish it first)");
  struct ferry__serve_state *rs = &e->serve;
  memset(rs, 0, sizeof *rs);
  rs->o = (struct ferry_run_options){.time_scale = 1.0};
  if (opts) rs->o = *opts;
  if (rs->o.time_scale <= 0) rs->o.time_scale = 1.0;
  rs->open = 1;
  ferry_status st = prepare_run(e, requests, n, &rs->o, rs);
  if (st != FERRY_OK) return serve_close(e, st);
  rs->t0 = e->run_start_ns = ferry_exec_now(e->ex);
  rs->last_progress = ferry__mono_ns();
  return FERRY_OK;
}

/* realloc to n elements of `size` into *p (left as it was on failure); 0 when out of memory. */
static int grow(void **p, int64_t n, size_t size) {
  void *q = ferry__reallocarray(*p, (size_t)n, size);
  if (q) *p = q;
  return q != NULL;
}

/* Room for one more request: the per-request arrays double, the step table grows by what the
 * request can take (one step per token or prefill chunk). */
static ferry_status grow_requests(ferry_engine *e, struct ferry__serve_state *rs, const struct ferry_engine_request *r) {
  const int64_t more = r->output_tokens + r->prompt_tokens / e->cfg.max_step_tokens + 2;
  const int64_t cap = rs->n < rs->cap_reqs ? rs->cap_reqs : rs->cap_reqs ? 2 * rs->cap_reqs : 16;
  void *steps = e->steps, *reqs = e->reqs, *metrics = e->req_metrics, *waiting = rs->waiting, *resumes = e->resumes;
  const int ok = grow(&steps, e->cap_steps + more, sizeof *e->steps) && grow(&reqs, cap, sizeof *e->reqs) &&
                 grow(&metrics, cap, sizeof *e->req_metrics) && grow(&waiting, cap, sizeof *rs->waiting) &&
                 (!e->kv_block || grow(&resumes, cap, sizeof *e->resumes));
  e->steps = steps; /* what moved is kept, grown or not */
  e->reqs = reqs;
  e->req_metrics = metrics;
  rs->waiting = waiting;
  e->resumes = resumes;
  if (!ok) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for %lld requests", (long long)cap);
  e->cap_steps += more;
  if (e->kv_block) memset(e->resumes + rs->cap_reqs, 0, (size_t)(cap - rs->cap_reqs) * sizeof *e->resumes);
  rs->cap_reqs = cap;
  return FERRY_OK;
}

ferry_status ferry_engine_serve_add(ferry_engine *e, const struct ferry_engine_request *request) {
  struct ferry__serve_state *rs = &e->serve;
  if (!rs->open) return ferry__fail(FERRY_ERR_INVALID, "engine: no run is being served (ferry_engine_serve_begin)");
  struct ferry_engine_request r;
  ferry_status st = arrival_check(e, request, &rs->o, &r);
  if (st == FERRY_OK && rs->n && r.arrival_ns < e->reqs[rs->n - 1].arrival_ns)
    st = ferry__err_set(&e->err, FERRY_ERR_INVALID, "request %lld: arrives at %lld ns, before request %lld (%lld ns)",
                        (long long)r.id, (long long)r.arrival_ns, (long long)e->reqs[rs->n - 1].id,
                        (long long)e->reqs[rs->n - 1].arrival_ns);
  if (st == FERRY_OK) st = grow_requests(e, rs, &r);
  if (st != FERRY_OK) return serve_close(e, st);
  e->reqs[rs->n] = r;
  e->req_metrics[rs->n] = (struct ferry_request_metrics){.id = r.id, .arrival_ns = r.arrival_ns,
                                                         .prompt_tokens = r.prompt_tokens, .first_token_ns = -1,
                                                         .finish_ns = -1};
  e->n_reqs = ++rs->n;
  return FERRY_OK;
}

ferry_status ferry_engine_serve_advance(ferry_engine *e, int64_t until_ns) {
  if (!e->serve.open) return ferry__fail(FERRY_ERR_INVALID, "engine: no run is being served (ferry_engine_serve_begin)");
  const ferry_status st = serve_loop(e, &e->serve, until_ns, INT64_MAX);
  return st == FERRY_OK ? FERRY_OK : serve_close(e, st);
}

ferry_status ferry__engine_serve_step(ferry_engine *e) {
  if (!e->serve.open) return ferry__fail(FERRY_ERR_INVALID, "engine: no run is being served (ferry_engine_serve_begin)");
  const ferry_status st = serve_loop(e, &e->serve, INT64_MAX, 1);
  return st == FERRY_OK ? FERRY_OK : serve_close(e, st);
}

void ferry_engine_serve_load(const ferry_engine *e, struct ferry_engine_load *out) {
  const struct ferry__serve_state *rs = &e->serve;
  *out = (struct ferry_engine_load){0};
  if (!rs->open) return;
  *out = (struct ferry_engine_load){.requests = rs->n - rs->done, .clock_ns = ferry_exec_now(e->ex) - rs->t0};
  for (int64_t i = rs->w_head; i < rs->w_tail; i++) {
    const struct ferry_engine_request *r = &e->reqs[rs->waiting[i]];
    out->tokens += r->prompt_tokens + r->output_tokens - e->req_metrics[rs->waiting[i]].output_tokens;
  }
  for (int64_t i = rs->next; i < rs->n; i++) out->tokens += e->reqs[i].prompt_tokens + e->reqs[i].output_tokens;
  for (int32_t s = 0; s < e->n_seqs; s++) {
    const struct seq *q = &e->seqs[s];
    if (q->active) out->tokens += (q->prefill - q->prompt_done) + (e->reqs[q->req].output_tokens - q->generated);
  }
}

ferry_status ferry_engine_serve_finish(ferry_engine *e) {
  if (!e->serve.open) return ferry__fail(FERRY_ERR_INVALID, "engine: no run is being served (ferry_engine_serve_begin)");
  ferry_status st = serve_loop(e, &e->serve, INT64_MAX, INT64_MAX);
  if (st == FERRY_OK && (st = ferry_exec_drain(e->ex)) != FERRY_OK)
    ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  return serve_close(e, st);
}

ferry_status ferry_engine_run(ferry_engine *e, const struct ferry_engine_request *requests, int64_t n,
                              const struct ferry_run_options *opts) {
  const ferry_status st = ferry_engine_serve_begin(e, requests, n, opts);
  return st == FERRY_OK ? ferry_engine_serve_finish(e) : st;
}

const struct ferry_request_metrics *ferry_engine_request_metrics(const ferry_engine *e, int64_t *n) {
  *n = e->n_reqs;
  return e->req_metrics;
}

const struct ferry_layer_metrics *ferry_engine_layer_metrics(const ferry_engine *e, int64_t *n) {
  *n = e->mc->n_layers;
  return e->layer_stats;
}

const struct ferry_step_metrics *ferry_engine_step_metrics(const ferry_engine *e, int64_t *n) {
  *n = e->n_steps;
  return e->steps;
}

