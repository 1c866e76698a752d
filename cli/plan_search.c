/* `ferry plan`'s per-profile search (plan_search.h) and the local scheduler that feeds it from
 * a pool of simulation workers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/mpi.h"
#include "cli/plan_search.h"
#include "common/alloc.h"
#include "common/units.h"

enum { CAND_NEW, CAND_RUNNING, CAND_BOUNDED, CAND_FAILED, CAND_SEARCHING, CAND_SEARCHED, CAND_PRUNED };
enum { PHASE_BOUNDS, PHASE_SEARCH, PHASE_VERIFY, PHASE_REPLICAS, PHASE_RECORD, PHASE_DONE };

/* A ladder rung that raises the throughput by less than this stops the ladder. */
#define LADDER_GAIN 1.05
/* Pruning: configurations are searched in order of their all-at-once throughput (the bound);
 * one whose bound, times the highest ratio of rate found to bound seen on this profile so far
 * and this margin, is below the best rate found is not searched. The ratio is not 1: a steady
 * stream is served with partly filled batches, a full queue ends with some (0.85 for
 * Llama-3-8B on the Azure conversation trace), and with short requests a stream can even be
 * served faster than a burst (1.2 for a tiny model): it is measured, not assumed. */
#define BOUND_MARGIN 1.1
/* Offload variants are tried for a format whose best bound is within this factor of the best. */
#define VARIANT_REACH 1.5
/* The search's first probe, floor and ceiling as fractions of the throughput bound: a stable
 * queue is served below it, and most SLOs hold up to most of it. */
#define START_FRACTION 0.85
#define FLOOR_FRACTION (1.0 / 256)
#define CEIL_FRACTION 1.5

static int add_cand(struct plan_hw *h, const struct plan_knobs *k) {
  if (h->nc == h->capc) {
    int cap = h->capc ? h->capc * 2 : 16;
    struct plan_cand *c = ferry__reallocarray(h->c, (size_t)cap, sizeof *c);
    if (!c) return -1;
    h->c = c;
    h->capc = cap;
  }
  memset(&h->c[h->nc], 0, sizeof h->c[h->nc]);
  h->c[h->nc].k = *k;
  h->c[h->nc].same_as = -1;
  return h->nc++;
}

static int log_probe(struct plan_hw *h, const struct plan_job *j, const struct plan_result *r, int feasible,
                     const char *why) {
  if (h->nlog == h->caplog) {
    int cap = h->caplog ? h->caplog * 2 : 32;
    struct plan_probe *l = ferry__reallocarray(h->log, (size_t)cap, sizeof *l);
    if (!l) return -1;
    h->log = l;
    h->caplog = cap;
  }
  struct plan_probe *p = &h->log[h->nlog++];
  memset(p, 0, sizeof *p);
  p->cand = j->cand;
  p->kind = j->kind;
  p->rps = j->kind == PLAN_JOB_BOUND ? r->throughput_rps : j->rps;
  p->replicas = j->replicas;
  p->feasible = feasible;
  p->saturated = r->saturated;
  p->ttft_p99_ms = r->ttft[3] / 1e6;
  p->tpot_p99_ms = r->tpot[3] / 1e6;
  p->e2e_p99_ms = r->e2e[3] / 1e6;
  p->throughput_rps = r->throughput_rps;
  snprintf(p->why, sizeof p->why, "%.200s", why);
  return 0;
}

int plan_cand_replicas(const struct plan_hw *h, const struct plan_knobs *k) {
  const int per = k->gpus > 1 ? k->gpus : 1;
  return h->gpus > per ? h->gpus / per : 1;
}

/* All of a configuration's replicas together with every request queued at once. */
static double cand_bound(const struct plan_hw *h, const struct plan_cand *c) {
  return c->mu_rps * plan_cand_replicas(h, &c->k);
}

static int add_ladder(struct plan_state *ps, struct plan_hw *h, const struct plan_knobs *base) {
  if (h->nladders == PLAN_MAX_LADDERS) return CLI_OK; /* the machine's widest splits are left out */
  const int replicas = plan_cand_replicas(h, base);
  if (plan_workload_prepare(ps->w, replicas) != CLI_OK) return CLI_FAIL;
  memset(&h->ladder[h->nladders], 0, sizeof h->ladder[h->nladders]);
  h->ladder[h->nladders].base = *base;
  h->ladder[h->nladders].base.max_batch = 0;
  h->ladder[h->nladders++].last = -1;
  return CLI_OK;
}

/* The model's own format, where the formats searched include it: tensor and expert parallel
 * engines run no quantized weights (docs/multi-gpu.md). */
static int native_quant(const struct plan_opts *o) {
  for (int q = 0; q < o->n_quant; q++)
    if (!o->quant[q]) return q;
  return -1;
}

int plan_hw_init(struct plan_state *ps, struct plan_hw *h) {
  h->searching = -1;
  h->best_cand = -1;
  h->phase = h->skipped ? PHASE_DONE : PHASE_BOUNDS;
  if (h->skipped) return CLI_OK;
  const struct plan_opts *o = ps->o;
  for (int q = 0; q < o->n_quant; q++) {
    const struct plan_knobs k = {.quant = q, .prefetch_depth = -1, .expert_lfu = -1, .gpus = 1};
    if (add_ladder(ps, h, &k) != CLI_OK) return CLI_FAIL;
  }
  /* a machine's GPUs split among engines of 2, 4, ... GPUs each (the rest of them replicas) */
  const int native = native_quant(o);
  for (int g = 2; g <= h->gpus && native >= 0; g *= 2) {
    if (h->gpus % g) continue;
    const struct plan_knobs k = {.quant = native, .prefetch_depth = -1, .expert_lfu = -1, .gpus = g,
                                 .parallel = h->moe ? PLAN_PAR_EP : PLAN_PAR_TP};
    if (add_ladder(ps, h, &k) != CLI_OK) return CLI_FAIL;
  }
  return CLI_OK;
}

/* Pipeline parallel over every GPU of a machine, for each format of a dense model that does not
 * fit one of its GPUs (every one-GPU configuration of it streams its weights or does not run):
 * pipeline stages split the memory, not the time (docs/multi-gpu.md). */
static int add_pipeline_ladders(struct plan_state *ps, struct plan_hw *h) {
  if (h->gpus < 2 || h->moe) return CLI_OK;
  for (int q = 0; q < ps->o->n_quant; q++) {
    int fits = 0;
    for (int c = 0; c < h->nc; c++)
      fits |= h->c[c].k.quant == q && h->c[c].k.gpus <= 1 && h->c[c].state == CAND_BOUNDED && !h->c[c].streams;
    const struct plan_knobs k = {.quant = q, .prefetch_depth = -1, .expert_lfu = -1, .gpus = h->gpus,
                                 .parallel = PLAN_PAR_PP};
    if (!fits && add_ladder(ps, h, &k) != CLI_OK) return CLI_FAIL;
  }
  return CLI_OK;
}

int plan_hw_done(const struct plan_hw *h) { return h->phase == PHASE_DONE && h->inflight == 0; }

void plan_hw_free(struct plan_hw *h) {
  ferry_free(h->c);
  ferry_free(h->log);
  ferry_free(h->kept);
  h->c = NULL;
  h->log = NULL;
  h->kept = NULL;
}

/* Offload variants of a streaming configuration: how the weights stream matters only then. */
static int add_knob_variants(struct plan_hw *h, int base) {
  static const struct {
    int32_t block, prefetch, lfu;
  } dense[] = {{2, -1, -1}, {-1, 2, -1}, {2, 2, -1}, {4, 2, -1}},
    moe[] = {{-1, 2, -1}, {-1, -1, 1}, {-1, 2, 1}};
  const int n = h->moe ? (int)(sizeof moe / sizeof moe[0]) : (int)(sizeof dense / sizeof dense[0]);
  for (int i = 0; i < n; i++) {
    struct plan_knobs k = h->c[base].k;
    k.block_layers = h->moe ? moe[i].block : dense[i].block;
    k.prefetch_depth = h->moe ? moe[i].prefetch : dense[i].prefetch;
    k.expert_lfu = h->moe ? moe[i].lfu : dense[i].lfu;
    if (k.block_layers < 0) k.block_layers = 0;
    if (add_cand(h, &k) < 0) return -1;
  }
  return 0;
}

static void job_for(struct plan_state *ps, struct plan_hw *h, int cand, int kind, double rps, int replicas,
                    struct plan_job *j) {
  memset(j, 0, sizeof *j);
  j->id = ++ps->next_job_id;
  j->kind = kind;
  j->hw = (int32_t)(h - ps->hw);
  j->cand = cand;
  j->k = h->c[cand].k;
  j->rps = rps;
  j->replicas = replicas;
  h->inflight++;
}

/* Offload variants that only change the prefetch depth where the engine does not use it (no
 * streamed blocks, no disk staging, no predictor): their simulations would be an earlier
 * candidate's, byte for byte, so that candidate's results answer them (plan_hw_reuse). */
static void find_same_runs(struct plan_state *ps, struct plan_hw *h) {
  for (int c = 0; c < h->nc; c++) {
    if (h->c[c].state != CAND_NEW || h->c[c].k.prefetch_depth < 0) continue;
    for (int t = 0; t < c; t++) {
      struct plan_knobs k = h->c[c].k;
      k.prefetch_depth = -1;
      if (memcmp(&k, &h->c[t].k, sizeof k) != 0) continue;
      if (plan_same_runs(ps->o, h->name, ps->w, &h->c[c].k, &h->c[t].k)) h->c[c].same_as = t;
      break;
    }
  }
}

/* Phase 1: the next ladder rung or offload variant to bound. */
static int next_bound(struct plan_state *ps, struct plan_hw *h, struct plan_job *j) {
  const struct plan_opts *o = ps->o;
  for (int q = 0; q < h->nladders; q++) {
    if (h->ladder[q].running || h->ladder[q].done) continue;
    if (h->ladder[q].next >= o->n_batches) {
      h->ladder[q].done = 1;
      continue;
    }
    struct plan_knobs k = h->ladder[q].base;
    k.max_batch = o->batches[h->ladder[q].next];
    int c = add_cand(h, &k);
    if (c < 0) return -1;
    h->ladder[q].next++;
    h->ladder[q].running = 1;
    h->ladder[q].last = c;
    h->c[c].state = CAND_RUNNING;
    job_for(ps, h, c, PLAN_JOB_BOUND, 0, 1, j);
    return 1;
  }
  int ladders_done = 1;
  for (int q = 0; q < h->nladders; q++) ladders_done &= h->ladder[q].done;
  if (!ladders_done) return 0;
  if (!h->knobs_added) {
    /* after every ladder, in quantization order, so the candidates' order never depends on
     * which simulation finished first */
    h->knobs_added = 1;
    double top = 0;
    for (int c = 0; c < h->nc; c++)
      if (h->c[c].k.gpus <= 1 && h->c[c].state == CAND_BOUNDED && h->c[c].mu_rps > top) top = h->c[c].mu_rps;
    for (int q = 0; q < o->n_quant; q++) {
      int best = -1;
      for (int c = 0; c < h->nc; c++)
        if (h->c[c].k.quant == q && h->c[c].k.gpus <= 1 && h->c[c].state == CAND_BOUNDED &&
            (best < 0 || h->c[c].mu_rps > h->c[best].mu_rps))
          best = c;
      /* how weights stream is worth tuning where they stream and the format is not far behind
       * the best: a better prefetch gains tens of percent, not factors */
      if (best >= 0 && h->c[best].streams && h->c[best].mu_rps * VARIANT_REACH >= top &&
          add_knob_variants(h, best) < 0)
        return -1;
    }
    if (!o->exhaustive) find_same_runs(ps, h);
    const int n = h->nladders;
    if (add_pipeline_ladders(ps, h) != CLI_OK) return -1;
    if (h->nladders > n) return next_bound(ps, h, j); /* their rungs first */
  }
  for (int c = 0; c < h->nc; c++) {
    if (h->c[c].state != CAND_NEW) continue;
    /* one that runs as an earlier one waits for that one's bound, and takes it */
    const int twin = h->c[c].same_as;
    if (twin >= 0 && (h->c[twin].state == CAND_NEW || h->c[twin].state == CAND_RUNNING)) continue;
    h->c[c].state = CAND_RUNNING;
    job_for(ps, h, c, PLAN_JOB_BOUND, 0, 1, j);
    return 1;
  }
  for (int c = 0; c < h->nc; c++)
    if (h->c[c].state == CAND_RUNNING) return 0;
  h->phase = PHASE_SEARCH;
  return 0;
}

/* Phase 2: the next candidate worth searching, or the next probe of the one being searched. */
static int next_search(struct plan_state *ps, struct plan_hw *h, struct plan_job *j) {
  if (h->searching >= 0) {
    struct plan_cand *c = &h->c[h->searching];
    if (c->state == CAND_RUNNING) return 0; /* its probe is out */
    double rps;
    /* a rate below the best found already missed the SLO: this configuration's answer, below
     * every rate that missed, cannot beat the best (ties go to the earlier), so its search ends */
    const int more = ferry_plan_search_next(&c->s, &rps);
    int beaten = more && !ps->o->exhaustive && h->best_cand >= 0 && c->s.fail_rps > 0 && c->s.fail_rps <= h->best_rps;
    if (beaten) {
      /* its ratio of rate to bound, which prunes the rest, is then known only to be below the
       * missed rate's: end the search only if the next configuration in line is skipped even
       * with that (so with the true ratio too: a lower ratio skips more), else search on */
      int next = -1;
      for (int k = 0; k < h->nc; k++)
        if (h->c[k].state == CAND_BOUNDED && (next < 0 || cand_bound(h, &h->c[k]) > cand_bound(h, &h->c[next]))) next = k;
      const double upper = c->mu_rps > 0 ? c->s.fail_rps / cand_bound(h, c) : 0,
                   ratio = upper > h->ratio ? upper : h->ratio;
      if (next >= 0 && !(cand_bound(h, &h->c[next]) * ratio * BOUND_MARGIN < h->best_rps)) beaten = 0;
    }
    if (more && !beaten) {
      /* the floor check first tries a prefix of the slice (plan_floor_prove): the same verdict */
      const int floor = ferry_plan_search_floor_next(&c->s);
      c->state = CAND_RUNNING;
      const int replicas = plan_cand_replicas(h, &c->k);
      job_for(ps, h, h->searching, PLAN_JOB_PROBE, rps, replicas, j);
      if (floor) j->prefix = plan_floor_prefix(ps->o, ps->w, replicas);
      return 1;
    }
    c->state = CAND_SEARCHED;
    /* the ratio that prunes later configurations: a search ended early counts with the lowest
     * rate that missed, above its answer (what comes next is skipped either way) */
    const double reached = beaten ? c->s.fail_rps : c->s.best_rps;
    if (c->mu_rps > 0 && reached / cand_bound(h, c) > h->ratio) h->ratio = reached / cand_bound(h, c);
    if (c->s.best_rps > h->best_rps) {
      h->best_rps = c->s.best_rps;
      h->best_cand = h->searching;
      h->best = c->best;
      h->saturated_rps = c->s.saturated_rps;
    }
    h->searching = -1;
  }
  /* the highest bound not yet searched (ties: the earlier candidate) */
  int next = -1;
  for (int c = 0; c < h->nc; c++)
    if (h->c[c].state == CAND_BOUNDED && (next < 0 || cand_bound(h, &h->c[c]) > cand_bound(h, &h->c[next]))) next = c;
  if (next < 0) {
    h->phase = PHASE_VERIFY;
    return 0;
  }
  struct plan_cand *c = &h->c[next];
  const double bound = cand_bound(h, c);
  if (!ps->o->exhaustive && h->best_rps > 0 && bound * h->ratio * BOUND_MARGIN < h->best_rps) {
    /* every remaining bound is lower still */
    for (int k = 0; k < h->nc; k++)
      if (h->c[k].state == CAND_BOUNDED) h->c[k].state = CAND_PRUNED;
    h->phase = PHASE_VERIFY;
    return 0;
  }
  ferry_plan_search_init(&c->s, bound * START_FRACTION, bound * FLOOR_FRACTION, bound * CEIL_FRACTION,
                         ps->o->tolerance);
  /* while nothing on this profile met the SLO: once something did, a configuration that
   * misses is stopped by the best found instead, without a floor probe (the costliest kind).
   * First where the weights stream (slow profiles, where nothing meeting the SLO is likely),
   * else after a first probe that missed. Either way the answers are the same. */
  if (!ps->o->exhaustive && h->best_cand < 0) c->s.floor_check = c->streams ? 1 : 2;
  c->state = CAND_SEARCHING;
  h->searching = next;
  return next_search(ps, h, j);
}

/* --verify: a grid of rates around the answer, all at once (they are independent). */
static int next_verify(struct plan_state *ps, struct plan_hw *h, struct plan_job *j) {
  const int n = ps->o->verify < PLAN_MAX_VERIFY ? ps->o->verify : PLAN_MAX_VERIFY;
  if (h->best_cand < 0 || n < 2) {
    h->phase = PHASE_REPLICAS;
    return 0;
  }
  if (h->verify_next < n) {
    const int i = h->verify_next++;
    h->verify_rps[i] = h->best_rps * (0.5 + (double)i / (n - 1));
    job_for(ps, h, h->best_cand, PLAN_JOB_PROBE, h->verify_rps[i], plan_cand_replicas(h, &h->c[h->best_cand].k), j);
    j->slot = i + 1;
    return 1;
  }
  if (h->inflight) return 0;
  for (int i = 0; i < n; i++)
    if (h->verify_ok[i] && h->verify_rps[i] > h->brute_force_rps) h->brute_force_rps = h->verify_rps[i];
  h->phase = PHASE_REPLICAS;
  return 0;
}

/* Phase 3: how many replicas serve the demand (single-GPU profiles; a machine's GPUs are fixed). */
static int next_replicas(struct plan_state *ps, struct plan_hw *h, struct plan_job *j) {
  const struct plan_opts *o = ps->o;
  if (h->demand_replicas) return 0; /* a verification is out */
  if (h->best_cand < 0) {
    h->need_replicas = 0;
  } else if (h->best_rps >= ps->demand_rps) {
    h->need_replicas = h->gpus;
  } else if (h->gpus == 1 && o->max_gpus > 1) {
    int r = h->need_replicas ? h->need_replicas + 1 : (int)ceil(ps->demand_rps / h->best_rps);
    if (r < 2) r = 2;
    if (r <= o->max_gpus && r <= PLAN_MAX_REPLICAS) {
      if (plan_workload_prepare(ps->w, r) != CLI_OK) return -1;
      h->need_replicas = r;
      h->demand_replicas = r;
      job_for(ps, h, h->best_cand, PLAN_JOB_PROBE, ps->demand_rps, r, j);
      return 1;
    }
    h->need_replicas = 0;
  } else {
    h->need_replicas = 0;
  }
  h->phase = o->db && h->best_cand >= 0 ? PHASE_RECORD : PHASE_DONE;
  return 0;
}

int plan_hw_next(struct plan_state *ps, struct plan_hw *h, struct plan_job *j) {
  for (;;) {
    const int phase = h->phase;
    int got = 0;
    switch (phase) {
    case PHASE_BOUNDS: got = next_bound(ps, h, j); break;
    case PHASE_SEARCH: got = next_search(ps, h, j); break;
    case PHASE_VERIFY: got = next_verify(ps, h, j); break;
    case PHASE_REPLICAS: got = next_replicas(ps, h, j); break;
    case PHASE_RECORD:
      if (h->n_run_ids || h->inflight) return 0;
      job_for(ps, h, h->best_cand, PLAN_JOB_RECORD, h->best_rps, plan_cand_replicas(h, &h->c[h->best_cand].k), j);
      h->phase = PHASE_DONE;
      return 1;
    default: return 0;
    }
    if (got) return got;
    if (h->phase == phase) return 0; /* waiting for results */
  }
}

/* Keep a one-replica result for candidates that run the same (find_same_runs): every one, as
 * the ladder's bounds come back before the variants that may run as they do exist. */
static int keep(struct plan_hw *h, const struct plan_job *j, const struct plan_result *r) {
  if (j->kind == PLAN_JOB_RECORD || j->replicas != 1) return 0;
  if (h->nkept == h->capkept) {
    int cap = h->capkept ? h->capkept * 2 : 16;
    struct plan_kept *k = ferry__reallocarray(h->kept, (size_t)cap, sizeof *k);
    if (!k) return -1;
    h->kept = k;
    h->capkept = cap;
  }
  h->kept[h->nkept++] = (struct plan_kept){.cand = j->cand, .kind = j->kind, .replicas = j->replicas, .rps = j->rps, .r = *r};
  return 0;
}

int plan_hw_reuse(const struct plan_hw *h, const struct plan_job *j, struct plan_result *r) {
  const int twin = h->c[j->cand].same_as;
  if (twin < 0 || j->kind == PLAN_JOB_RECORD || j->replicas != 1) return 0;
  for (int i = 0; i < h->nkept; i++) {
    const struct plan_kept *k = &h->kept[i];
    /* the very job: the same kind at the same rate (bits), bounds at none */
    if (k->cand != twin || k->kind != j->kind || k->replicas != j->replicas ||
        memcmp(&k->rps, &j->rps, sizeof k->rps) != 0)
      continue;
    *r = k->r;
    r->id = j->id;
    return 1;
  }
  return 0;
}

int plan_hw_result(struct plan_state *ps, struct plan_hw *h, const struct plan_job *j, const struct plan_result *r) {
  h->inflight--;
  if (r->reused) h->reused += j->replicas;
  else h->sims += j->replicas;
  if (!r->reused && keep(h, j, r) < 0) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  struct plan_cand *c = &h->c[j->cand];
  char why[256];
  int feasible = 0;
  double excess = 0; /* a probe's: declared here, as C11 (clang) takes no declaration after a case label */
  switch (j->kind) {
  case PLAN_JOB_BOUND:
    if (!r->ok || r->throughput_rps <= 0) {
      c->state = CAND_FAILED;
      snprintf(c->error, sizeof c->error, "%s", r->ok ? "served nothing" : r->error);
      snprintf(why, sizeof why, "does not run: %.200s", c->error);
    } else {
      c->state = CAND_BOUNDED;
      c->mu_rps = r->throughput_rps;
      c->streams = r->streams;
      snprintf(why, sizeof why, "throughput bound %.4g requests/s (every request queued at once)%s", c->mu_rps,
               c->streams ? "; weights stream" : "");
    }
    /* the ladder: a rung that does not run, or barely helps, ends it */
    for (int q = 0; q < h->nladders; q++) {
      if (!h->ladder[q].running || h->ladder[q].last != j->cand) continue;
      h->ladder[q].running = 0;
      int prev = -1;
      for (int k = 0; k < j->cand; k++) {
        struct plan_knobs rung = h->c[k].k;
        rung.max_batch = 0;
        if (!memcmp(&rung, &h->ladder[q].base, sizeof rung) &&
            (h->c[k].state == CAND_BOUNDED || h->c[k].state == CAND_FAILED))
          prev = k;
      }
      if (c->state == CAND_FAILED) h->ladder[q].done = 1;
      else if (ps->o->batch_ladder && prev >= 0 && h->c[prev].state == CAND_BOUNDED &&
               c->mu_rps < h->c[prev].mu_rps * LADDER_GAIN)
        h->ladder[q].done = 1;
    }
    break;
  case PLAN_JOB_PROBE:
    feasible = plan_meets_slo(ps->o, r, why, sizeof why, &excess);
    if (j->slot > 0) {
      h->verify_ok[j->slot - 1] = feasible;
    } else if (h->demand_replicas) {
      /* phase 3: the demand on R replicas */
      h->demand = *r;
      h->demand_replicas = 0;
      if (feasible) h->phase = ps->o->db ? PHASE_RECORD : PHASE_DONE;
    } else {
      const int floor_due = c->s.floor_check && !c->s.floor_probed;
      ferry_plan_search_report(&c->s, j->rps, feasible, r->saturated, excess);
      const int floor = floor_due && c->s.floor_probed; /* this was the floor check */
      if (floor) snprintf(why + strlen(why), sizeof why - strlen(why), "; the search's floor (1/256 of the bound)");
      if (floor && r->floor_proven)
        snprintf(why + strlen(why), sizeof why - strlen(why),
                 "; lower bounds: %lld of the first %d requests of the slice, served as in the whole slice",
                 (long long)r->proven_by, j->prefix);
      if (floor && c->s.unreachable)
        snprintf(why + strlen(why), sizeof why - strlen(why), ", missed by %.0f %% or more: no rate meets the SLO",
                 (FERRY_PLAN_FLOOR_MISS - 1) * 100);
      else if (c->s.unreachable)
        snprintf(why + strlen(why), sizeof why - strlen(why), "; as at half the rate: no rate meets the SLO");
      if (feasible && c->s.best_rps > 0 && j->rps >= c->s.best_rps) c->best = *r;
      c->state = CAND_SEARCHING;
    }
    break;
  case PLAN_JOB_RECORD:
    snprintf(why, sizeof why, "%.200s", r->ok ? "recorded" : r->error);
    if (!r->ok) {
      h->n_run_ids = 0;
      fprintf(stderr, "ferry plan: %s: recording the best configuration failed: %s\n", h->name, r->error);
    } else {
      for (int i = 0; i < r->n_run_ids; i++) h->run_ids[h->n_run_ids++] = r->run_ids[i];
    }
    feasible = r->ok;
    break;
  }
  if (r->reused)
    snprintf(why + strlen(why), sizeof why - strlen(why),
             "; not simulated: the same run as configuration %d's (the engine does not use the prefetch depth here)",
             c->same_as);
  if (log_probe(h, j, r, feasible, why) < 0) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  return CLI_OK;
}

/* ---- local scheduling --------------------------------------------------------------------- */

struct inflight {
  struct plan_job j;
  int used;
};

static void progress_line(const struct plan_state *ps, const struct plan_hw *h) {
  if (ps->o->quiet || h->skipped) return;
  char knobs[128] = "no configuration meets the SLO";
  if (h->best_cand >= 0) plan_knobs_text(ps->o, &h->c[h->best_cand].k, knobs, sizeof knobs);
  fprintf(stderr, "ferry plan: %-14s %8.4g req/s  (%s; %d simulations)\n", h->name, h->best_rps, knobs, h->sims);
}

/* One line per profile as it finishes (the table comes at the end). */
static void report_finished(const struct plan_state *ps, unsigned char *reported) {
  for (int i = 0; i < ps->nhw; i++) {
    if (reported[i] || !plan_hw_done(&ps->hw[i])) continue;
    reported[i] = 1;
    progress_line(ps, &ps->hw[i]);
  }
}

/* The scheduler's state: the workers, the jobs in flight, a job held for a local worker. */
struct plan_loop {
  struct plan_pool *pool; /* NULL: jobs run in this process */
  struct inflight *fl;
  int nfl;
  struct plan_job held;
  int have_held;
  int turn; /* the profile asked first for its next job */
  unsigned char *reported;
};

/* The next job, from the held one or the profiles in turn: 1, 0 when none is ready, or a CLI
 * exit code (negated) on failure. */
static int next_job(struct plan_state *ps, struct plan_loop *L, struct plan_job *j) {
  if (L->have_held) {
    /* a job that writes this machine's files waits for one of its workers */
    if (!plan_pool_idle_local(L->pool)) return 0;
    *j = L->held;
    L->have_held = 0;
    return 1;
  }
  for (int k = 0; k < ps->nhw; k++) {
    const int got = plan_hw_next(ps, &ps->hw[(L->turn + k) % ps->nhw], j);
    if (got < 0) return -cli_fail(FERRY_ERR_NOMEM, "out of memory");
    if (got) {
      L->turn = (L->turn + k + 1) % ps->nhw;
      return 1;
    }
  }
  return 0;
}

/* Fill idle workers (or, without workers, run each job now). */
static int fill_workers(struct plan_state *ps, struct plan_loop *L) {
  int free_slots = L->pool ? plan_pool_idle(L->pool) : 1, rc;
  while (free_slots > 0) {
    struct plan_job j;
    const int got = next_job(ps, L, &j);
    if (got < 0) return -got;
    if (!got) break;
    const int local_only = j.kind == PLAN_JOB_RECORD;
    struct plan_result r;
    if (plan_hw_reuse(&ps->hw[j.hw], &j, &r)) {
      r.reused = 1;
      if ((rc = plan_hw_result(ps, &ps->hw[j.hw], &j, &r)) != CLI_OK) return rc;
      continue;
    }
    if (!L->pool) {
      plan_job_run(ps->o, ps->hw[j.hw].name, ps->w, &j, &r);
      if ((rc = plan_hw_result(ps, &ps->hw[j.hw], &j, &r)) != CLI_OK) return rc;
      report_finished(ps, L->reported);
      continue;
    }
    if (local_only && !plan_pool_idle_local(L->pool)) {
      L->held = j;
      L->have_held = 1;
      break;
    }
    int slot = -1;
    for (int s = 0; s < L->nfl && slot < 0; s++)
      if (!L->fl[s].used) slot = s;
    if (slot < 0) return cli_fail(FERRY_ERR_INTERNAL, "plan: no slot for a job");
    if ((rc = plan_pool_submit(L->pool, &j, local_only)) != CLI_OK) return rc;
    L->fl[slot] = (struct inflight){.j = j, .used = 1};
    free_slots--;
  }
  return CLI_OK;
}

/* Wait for one result and hand it to its profile's search. */
static int collect_one(struct plan_state *ps, struct plan_loop *L) {
  struct plan_result r;
  int rc = plan_pool_wait(L->pool, &r);
  if (rc != CLI_OK) return rc;
  int slot = -1;
  for (int s = 0; s < L->nfl && slot < 0; s++)
    if (L->fl[s].used && L->fl[s].j.id == r.id) slot = s;
  if (slot < 0) return cli_fail(FERRY_ERR_INTERNAL, "plan: a result for no job (%lld)", (long long)r.id);
  L->fl[slot].used = 0;
  return plan_hw_result(ps, &ps->hw[L->fl[slot].j.hw], &L->fl[slot].j, &r);
}

/* Schedule until every profile's search has ended. */
static int schedule(struct plan_state *ps, struct plan_loop *L) {
  int rc;
  for (;;) {
    if ((rc = fill_workers(ps, L)) != CLI_OK) return rc;
    report_finished(ps, L->reported);
    int busy = 0;
    for (int s = 0; s < L->nfl; s++) busy += L->fl[s].used;
    if (!busy && L->have_held) return cli_fail(FERRY_ERR_INTERNAL, "plan: a job for this machine with no worker here (-j 0?)");
    if (!busy) break;
    if ((rc = collect_one(ps, L)) != CLI_OK) return rc;
  }
  for (int i = 0; i < ps->nhw; i++)
    if (!plan_hw_done(&ps->hw[i]))
      return cli_fail(FERRY_ERR_INTERNAL, "plan: %s stopped before its search ended", ps->hw[i].name);
  return CLI_OK;
}

int plan_run(struct plan_state *ps, int workers, struct cli_mpi *mpi) {
  const char **names = ferry__calloc((size_t)ps->nhw + 1, sizeof *names);
  if (!names) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  for (int i = 0; i < ps->nhw; i++) names[i] = ps->hw[i].name;
  struct plan_loop L = {.nfl = 1, .reported = ferry__calloc((size_t)ps->nhw + 1, 1)};
  int rc = CLI_OK;
  for (int i = 0; i < ps->nhw; i++)
    if ((rc = plan_hw_init(ps, &ps->hw[i])) != CLI_OK) goto out;
  if ((workers > 0 || (mpi && mpi->size > 1)) &&
      (rc = plan_pool_start(ps->o, names, ps->w, workers, mpi, &L.pool)) != CLI_OK)
    goto out;
  if (L.pool) L.nfl = plan_pool_slots(L.pool);
  if (!L.reported || !(L.fl = ferry__calloc((size_t)L.nfl, sizeof *L.fl))) {
    rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
    goto out;
  }
  rc = schedule(ps, &L);
out:
  plan_pool_stop(L.pool);
  ferry_free(L.fl);
  ferry_free(names);
  ferry_free(L.reported);
  return rc;
}
