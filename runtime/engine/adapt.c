/* Staying up while serving: budget changes, the memory-pressure controller (the engine measures
 * and predicts, runtime/policy/pressure.c decides, this file re-plans and moves the weights),
 * weight reloads (versions counted by the sequences running on them, swapped at a step
 * boundary once the old one has none left), and the event log of all of it. Everything here
 * runs at step boundaries on the serving thread, except staging a reload (any thread). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/hostmem.h"
#include "common/units.h"
#include "engine_impl.h"
#include "runtime/policy/pressure.h"

static const char *tier_word(int32_t t) { return t == FERRY_TIER_DEVICE ? "device" : t == FERRY_TIER_HOST ? "host" : "disk"; }

void ferry__engine_event(struct ferry_engine *e, enum ferry_engine_event_kind kind, int32_t tier, double index,
                         const char *action, const char *fmt, ...) {
  pthread_mutex_lock(&e->adapt_mu);
  if (e->n_events == e->cap_events) {
    int64_t cap = e->cap_events ? e->cap_events * 2 : 32;
    struct ferry_engine_event *ev = ferry__reallocarray(e->events, (size_t)cap, sizeof *ev);
    if (!ev) { /* the event is lost, the run goes on: its figures are in the run's other rows */
      pthread_mutex_unlock(&e->adapt_mu);
      return;
    }
    e->events = ev;
    e->cap_events = cap;
  }
  struct ferry_engine_event *ev = &e->events[e->n_events++];
  memset(ev, 0, sizeof *ev);
  ev->t_ns = ferry_exec_now(e->ex);
  ev->kind = kind;
  ev->tier = tier;
  ev->pressure_index = index;
  ev->level = e->level;
  snprintf(ev->action, sizeof ev->action, "%s", action);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ev->detail, sizeof ev->detail, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&e->adapt_mu);
}

const struct ferry_engine_event *ferry_engine_events(const ferry_engine *e, int64_t *n) {
  *n = e->n_events;
  return e->events;
}

int32_t ferry_engine_weights_version(const ferry_engine *e) { return e->current ? e->current->id : 1; }
int32_t ferry_engine_pressure_level(const ferry_engine *e) { return e->level; }

static int cmp_change(const void *a, const void *b) {
  const struct ferry_budget_change *x = a, *y = b;
  return x->at_ns < y->at_ns ? -1 : x->at_ns > y->at_ns;
}

ferry_status ferry__engine_adapt_init(struct ferry_engine *e) {
  e->current = ferry__calloc(1, sizeof *e->current);
  if (!e->current) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
  e->current->store = e->store;
  e->current->id = 1;
  snprintf(e->current->label, sizeof e->current->label, "%s",
           e->store && ferry_store_file_count(e->store) ? ferry_store_file_path(e->store, 0) : "initial weights");
  e->next_version = 2;
  e->budget[FERRY_TIER_DEVICE] = e->cfg.device_budget_bytes;
  e->budget[FERRY_TIER_HOST] = e->cfg.host_budget_bytes;
  e->level_since_ns = INT64_MIN;
  e->asked_expert_slots = e->plan.n_expert_slots;
  if (e->cfg.n_budget_changes > 0) {
    e->schedule = ferry__calloc((size_t)e->cfg.n_budget_changes, sizeof *e->schedule);
    if (!e->schedule) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory");
    memcpy(e->schedule, e->cfg.budget_schedule, (size_t)e->cfg.n_budget_changes * sizeof *e->schedule);
    qsort(e->schedule, (size_t)e->cfg.n_budget_changes, sizeof *e->schedule, cmp_change);
    e->n_schedule = e->cfg.n_budget_changes;
  }
  e->cfg.budget_schedule = NULL; /* borrowed from the caller: the copy above is what is used */
  return FERRY_OK;
}

static void release_version(struct weights_version *v) {
  if (!v) return;
  if (v->owned) ferry_store_close(v->store);
  ferry_free(v);
}

void ferry__engine_adapt_free(struct ferry_engine *e) {
  release_version(e->staged);
  if (e->current && e->current->owned) e->store = NULL;
  release_version(e->current);
  e->staged = e->current = NULL;
  ferry_free(e->schedule);
  ferry_free(e->events);
  e->schedule = NULL;
  e->events = NULL;
  pthread_mutex_destroy(&e->adapt_mu);
}

/* ---- plans for a level --------------------------------------------------------------------- */

/* The plan configuration of a degradation level under the budgets in force. */
static void level_config(const struct ferry_engine *e, int32_t level, struct ferry_plan_config *pc) {
  ferry__engine_base_plan_config(e, pc);
  pc->device_budget_bytes = e->budget[FERRY_TIER_DEVICE];
  pc->host_budget_bytes = e->budget[FERRY_TIER_HOST];
  if (e->cfg.pressure.enabled && pc->host_budget_bytes)
    pc->host_budget_bytes = (uint64_t)((double)pc->host_budget_bytes * e->cfg.pressure.low_water);
  if (level >= FERRY_PRESSURE_PREFETCH) { /* fewer blocks in flight, and no spare slot */
    pc->prefetch_depth = e->cfg.prefetch_depth / 2;
    pc->block_slots = 0;
  }
  if (level >= FERRY_PRESSURE_CACHE && e->asked_expert_slots > 0)
    pc->max_expert_slots = e->asked_expert_slots / 2 > 0 ? e->asked_expert_slots / 2 : 1;
  if (level >= FERRY_PRESSURE_ON_DEMAND) {
    pc->home_disk = 1;
    pc->prefetch_depth = 0;
  }
}

static double ratio(uint64_t used, uint64_t budget) { return budget ? (double)used / (double)budget : 0.0; }

/* The OS's view of host memory, when watched: 1 - available / total, and 1 while PSI says tasks
 * stall on memory. NAN when not watched or not readable. */
static double os_index(const struct ferry_engine *e, struct ferry__host_mem *hm) {
  if (!e->cfg.pressure.watch_os || !e->has_data || !ferry__host_mem_read(hm, NULL, NULL)) return NAN;
  double idx = 1.0 - (double)hm->available_bytes / (double)hm->total_bytes;
  if (hm->has_psi && hm->psi_some_avg10 >= e->cfg.pressure.psi_some_pct && idx < 1.0) idx = 1.0;
  return idx;
}

/* Predicted indexes of a plan (INFINITY for every tier when it cannot be made). */
static void predict(struct ferry_engine *e, int32_t level, double os, const struct ferry__host_mem *hm,
                    double out[FERRY_TIER_COUNT], struct ferry_plan *keep) {
  struct ferry_plan_config pc;
  struct ferry_plan p;
  char msg[FERRY_ERRMSG_MAX];
  level_config(e, level, &pc);
  for (int t = 0; t < FERRY_TIER_COUNT; t++) out[t] = 0;
  if (ferry__engine_make_plan(e, &pc, &p, msg, sizeof msg) != FERRY_OK) {
    for (int t = 0; t < FERRY_TIER_COUNT; t++) out[t] = INFINITY;
    return;
  }
  out[FERRY_TIER_DEVICE] = ratio(p.device_total_bytes, e->budget[FERRY_TIER_DEVICE]);
  out[FERRY_TIER_HOST] = ratio(p.host_total_bytes, e->budget[FERRY_TIER_HOST]);
  if (!isnan(os)) {
    uint64_t used;
    ferry_exec_tier_usage(e->ex, FERRY_TIER_HOST, &used, NULL);
    double after = os + ((double)p.host_total_bytes - (double)used) / (double)hm->total_bytes;
    if (after > out[FERRY_TIER_HOST]) out[FERRY_TIER_HOST] = after;
  }
  if (keep) *keep = p;
  else ferry__plan_free(&p);
}

static int same_pinned(const struct ferry_plan *a, const struct ferry_plan *b, int32_t n_layers) {
  return a->device_pinned_bytes == b->device_pinned_bytes && a->experts_pinned == b->experts_pinned &&
         !memcmp(a->attn_pinned, b->attn_pinned, (size_t)n_layers) && !memcmp(a->ffn_pinned, b->ffn_pinned, (size_t)n_layers);
}

/* Whether two plans place every unit the same way (a re-plan would change nothing). */
static int same_plan(const struct ferry_plan *a, const struct ferry_plan *b, int32_t n_layers) {
  if (!same_pinned(a, b, n_layers) || a->n_blocks != b->n_blocks || a->n_block_slots != b->n_block_slots ||
      a->prefetch_depth != b->prefetch_depth ||
      a->n_expert_slots != b->n_expert_slots || a->experts_on_host != b->experts_on_host ||
      a->n_staging_slots != b->n_staging_slots || a->host_units_bytes != b->host_units_bytes)
    return 0;
  for (int32_t i = 0; i < a->n_blocks; i++)
    if (a->blocks[i].home != b->blocks[i].home) return 0;
  return 1;
}

/* Before moving the weights: raise the executor's budgets that grew (the new placement may use
 * the room); those that shrank are lowered once it is in place (sync_budgets). */
static void raise_budgets(struct ferry_engine *e) {
  for (int t = FERRY_TIER_DEVICE; t <= FERRY_TIER_HOST; t++) {
    const uint64_t now = ferry_exec_tier_budget(e->ex, (enum ferry_tier)t);
    if (now && (!e->budget[t] || e->budget[t] > now)) (void)ferry_exec_set_budget(e->ex, (enum ferry_tier)t, e->budget[t]);
  }
}

/* Lower (or raise) the executor's budgets to those in force, once the weights fit them. */
static void sync_budgets(struct ferry_engine *e) {
  for (int t = FERRY_TIER_DEVICE; t <= FERRY_TIER_HOST; t++)
    if (ferry_exec_tier_budget(e->ex, (enum ferry_tier)t) != e->budget[t])
      (void)ferry_exec_set_budget(e->ex, (enum ferry_tier)t, e->budget[t]); /* over it: the index says so */
}

/* ---- moving the weights -------------------------------------------------------------------- */

/* Replace the placement of the weights by plan `np` (consumed) over `store`: every op in flight
 * finishes first (on the old placement), then what changes is freed before anything is
 * allocated, so no tier ever holds both. The KV cache, workspace and read-back stay (sequences
 * keep running), except that a reload may resize the workspace. */
static ferry_status rebuild(struct ferry_engine *e, ferry_store *store, struct ferry_plan *np, int reload) {
  ferry_status st = ferry_exec_drain(e->ex);
  if (st != FERRY_OK) {
    ferry__plan_free(np);
    return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  }
  raise_budgets(e);
  /* the op graphs name the old placement's buffers, slots and units: recorded again */
  ferry__memo_free(e);
  const int keep_pinned = !reload && store == e->store && same_pinned(&e->plan, np, (int32_t)e->mc->n_layers);
  ferry__engine_free_streaming(e, !keep_pinned);
  ferry__engine_free_units(e);
  ferry__plan_free(&e->plan);
  e->plan = *np;
  memset(np, 0, sizeof *np);
  e->store = store;
  /* a reload to another quantization (dequantization scratch) moves the device's window */
  if (!e->ws_buf || ferry_exec_buf_base(e->ws_buf) != e->ws.device_base ||
      ferry_exec_buf_size(e->ws_buf) != e->ws.total - e->ws.device_base) {
    ferry_exec_free(e->ex, e->ws_buf);
    e->ws_buf = NULL;
    if ((st = ferry__engine_alloc_ws(e, 0, &e->ws_buf)) != FERRY_OK) return st;
  }
  if ((st = ferry__hybrid_alloc_ws(e)) != FERRY_OK) return st; /* the CPU's part of it */
  if ((st = ferry__engine_build_units(e)) != FERRY_OK) return st;
  if ((st = ferry__memo_init(e)) != FERRY_OK) return st;
  if (!keep_pinned && (st = ferry__engine_alloc_pinned(e)) != FERRY_OK) return st;
  if ((st = ferry__engine_alloc_streaming(e)) != FERRY_OK) return st;
  struct ferry_exec_range range = ferry_exec_range_begin(e->ex, "load weights", (int32_t)e->n_steps, -1, -1);
  st = ferry__engine_load_resident(e, keep_pinned);
  if (st == FERRY_OK) st = ferry__hybrid_load(e);
  if (st == FERRY_OK) st = ferry__engine_preload_experts(e);
  ferry_exec_range_end(e->ex, &range);
  return st;
}

static void describe_plan(const struct ferry_engine *e, char *buf, size_t len) {
  char h[32], d[32];
  snprintf(buf, len, "prefetch %d block slot(s), %d expert slot(s), %s of weights in host memory, device %s", e->plan.n_block_slots,
           e->plan.n_expert_slots, ferry__format_bytes(e->plan.host_units_bytes, h, sizeof h),
           ferry__format_bytes(e->plan.device_total_bytes, d, sizeof d));
}

/* ---- memory pressure ----------------------------------------------------------------------- */

/* What the pressure controller sees: each tier's use against its budget and marks (the OS's
 * view of the host where asked, os), the level and its dwell. */
static void pressure_snapshot(struct ferry_engine *e, double os, struct ferry_pressure_snapshot *s) {
  const struct ferry_pressure_config *pc = &e->cfg.pressure;
  memset(s, 0, sizeof *s);
  s->now_ns = ferry_exec_now(e->ex);
  s->last_change_ns = e->level_since_ns;
  s->level = e->level;
  s->budget_changed = e->budget_changed;
  s->min_dwell_ns = pc->min_dwell_ns;
  for (int t = 0; t < FERRY_TIER_COUNT; t++) {
    uint64_t used = 0;
    if (t != FERRY_TIER_DISK) ferry_exec_tier_usage(e->ex, (enum ferry_tier)t, &used, NULL);
    s->index[t] = t == FERRY_TIER_DISK ? 0 : ratio(used, e->budget[t]);
    /* the device is planned to its budget: only an overrun (a budget cut) is pressure there */
    s->high[t] = t == FERRY_TIER_HOST ? pc->high_water : 1.0;
    s->low[t] = t == FERRY_TIER_HOST ? pc->low_water : 1.0;
  }
  if (!isnan(os) && os > s->index[FERRY_TIER_HOST]) s->index[FERRY_TIER_HOST] = os;
}

/* A move down or up the levels: its plan. A degradation goes on up the levels, at this
 * boundary, while no plan fits: a tier over its budget must be shed before the next step, not
 * one level per step. Sets d's level and what; returns whether a plan fits (then in next). */
static int level_plan(struct ferry_engine *e, struct ferry_pressure_decision *d, struct ferry_plan *next) {
  int32_t level = d->level;
  int have_plan;
  for (;;) {
    const int32_t plan_level = level >= FERRY_PRESSURE_REFUSE ? FERRY_PRESSURE_ON_DEMAND : level;
    struct ferry_plan_config lc;
    char msg[FERRY_ERRMSG_MAX];
    level_config(e, plan_level, &lc);
    have_plan = ferry__engine_make_plan(e, &lc, next, msg, sizeof msg) == FERRY_OK;
    if (have_plan || d->action != FERRY_PRESSURE_DEGRADE || level >= FERRY_PRESSURE_REFUSE) break;
    level++;
  }
  if (!have_plan && d->action == FERRY_PRESSURE_DEGRADE) {
    level = FERRY_PRESSURE_REFUSE;
    d->what = "refuse new requests";
  }
  d->level = level;
  if (d->action == FERRY_PRESSURE_DEGRADE) {
    static const char *const up[FERRY_PRESSURE_LEVELS] = {"", "shrink prefetch depth", "shrink expert cache",
                                                          "fall back to on-demand loading", "refuse new requests"};
    d->what = up[level];
  }
  return have_plan;
}

static ferry_status pressure_step(struct ferry_engine *e) {
  struct ferry__host_mem hm;
  const double os = os_index(e, &hm);
  struct ferry_pressure_snapshot s;
  pressure_snapshot(e, os, &s);
  struct ferry_plan same_plan_p;
  memset(&same_plan_p, 0, sizeof same_plan_p);
  predict(e, e->level >= FERRY_PRESSURE_REFUSE ? FERRY_PRESSURE_ON_DEMAND : e->level, os, &hm, s.same, &same_plan_p);
  if (e->level > 0) predict(e, e->level - 1, os, &hm, s.down, NULL);
  struct ferry_pressure_decision d;
  ferry__pressure_decide(&s, &d);
  e->budget_changed = 0;
  char why[160] = "";
  if (!isnan(os))
    snprintf(why, sizeof why, "; OS: %.0f%% of memory in use%s", 100.0 * (1.0 - (double)hm.available_bytes / (double)hm.total_bytes),
             hm.has_psi ? "" : ", no PSI");
  if (!isnan(os) && hm.has_psi)
    snprintf(why + strlen(why), sizeof why - strlen(why), ", PSI some avg10 %.2f%%", hm.psi_some_avg10);
  ferry_status st = FERRY_OK;
  const int32_t old_level = e->level;
  if (d.action == FERRY_PRESSURE_STAY) {
    ferry__plan_free(&same_plan_p);
    return FERRY_OK;
  }
  struct ferry_plan next;
  memset(&next, 0, sizeof next);
  int have_plan = 0;
  if (d.action == FERRY_PRESSURE_REPLAN) {
    next = same_plan_p;
    have_plan = 1;
  } else {
    ferry__plan_free(&same_plan_p);
    have_plan = level_plan(e, &d, &next);
    e->level = d.level;
    e->level_since_ns = s.now_ns;
    if (e->level > e->level_max) e->level_max = e->level;
  }
  e->refusing = e->level >= FERRY_PRESSURE_REFUSE;
  char plan_text[200] = "";
  if (have_plan && !same_plan(&e->plan, &next, (int32_t)e->mc->n_layers)) {
    st = rebuild(e, e->store, &next, 0);
    if (st != FERRY_OK) return st;
    describe_plan(e, plan_text, sizeof plan_text);
  } else {
    if (have_plan) ferry__plan_free(&next);
    /* a re-plan that changes nothing, without a budget change, is not worth an event */
    if (d.action == FERRY_PRESSURE_REPLAN && !s.budget_changed) return FERRY_OK;
    snprintf(plan_text, sizeof plan_text, have_plan ? "placement unchanged" : "no plan fits the budgets in force");
  }
  sync_budgets(e);
  uint64_t used_h = 0, used_d = 0;
  ferry_exec_tier_usage(e->ex, FERRY_TIER_HOST, &used_h, NULL);
  ferry_exec_tier_usage(e->ex, FERRY_TIER_DEVICE, &used_d, NULL);
  char b[4][32];
  const int32_t tier = d.tier >= 0 ? d.tier : FERRY_TIER_HOST;
  ferry__engine_event(e, FERRY_ENGINE_EVENT_PRESSURE, tier, d.tier >= 0 ? d.index : s.index[tier], d.what,
                      "level %d -> %d (%s): %s; host %s of %s, device %s of %s%s", old_level, e->level,
                      ferry__pressure_level_name(e->level), plan_text, ferry__format_bytes(used_h, b[0], 32),
                      e->budget[FERRY_TIER_HOST] ? ferry__format_bytes(e->budget[FERRY_TIER_HOST], b[1], 32) : "unlimited",
                      ferry__format_bytes(used_d, b[2], 32),
                      e->budget[FERRY_TIER_DEVICE] ? ferry__format_bytes(e->budget[FERRY_TIER_DEVICE], b[3], 32) : "unlimited",
                      why);
  return FERRY_OK;
}

/* ---- budget schedule ----------------------------------------------------------------------- */

ferry_status ferry_engine_set_budget(ferry_engine *e, enum ferry_tier tier, uint64_t bytes) {
  if (!e || (tier != FERRY_TIER_HOST && tier != FERRY_TIER_DEVICE) || !bytes)
    return ferry__fail(FERRY_ERR_INVALID, "engine_set_budget: the host or device tier and at least one byte");
  if (!e->cfg.pressure.enabled || (tier == FERRY_TIER_DEVICE && !e->cfg.device_budget_bytes) ||
      (tier == FERRY_TIER_HOST && !e->cfg.host_budget_bytes))
    return ferry__fail(FERRY_ERR_INVALID,
                       "engine_set_budget: needs memory-pressure control and a %s budget to start from",
                       tier == FERRY_TIER_HOST ? "host" : "device");
  pthread_mutex_lock(&e->adapt_mu);
  e->asked_budget[tier] = bytes;
  pthread_mutex_unlock(&e->adapt_mu);
  return FERRY_OK;
}

static void change_budget(struct ferry_engine *e, enum ferry_tier tier, uint64_t bytes, const char *why) {
  char was[32], now_b[32];
  const uint64_t old = e->budget[tier];
  e->budget[tier] = bytes;
  e->budget_changed = 1;
  e->budget_changes++;
  uint64_t used;
  ferry_exec_tier_usage(e->ex, tier, &used, NULL);
  ferry__engine_event(e, FERRY_ENGINE_EVENT_PRESSURE, (int32_t)tier, ratio(used, bytes), "budget changed",
                      "%s budget %s -> %s (%s)", tier_word((int32_t)tier),
                      old ? ferry__format_bytes(old, was, sizeof was) : "unlimited",
                      ferry__format_bytes(bytes, now_b, sizeof now_b), why);
  pthread_mutex_lock(&e->adapt_mu);
  if (e->n_events) e->events[e->n_events - 1].budget_bytes = bytes;
  pthread_mutex_unlock(&e->adapt_mu);
}

static void apply_schedule(struct ferry_engine *e, int64_t now_ns) {
  uint64_t asked[FERRY_TIER_COUNT];
  pthread_mutex_lock(&e->adapt_mu);
  memcpy(asked, e->asked_budget, sizeof asked);
  memset(e->asked_budget, 0, sizeof e->asked_budget);
  pthread_mutex_unlock(&e->adapt_mu);
  for (int t = 0; t < FERRY_TIER_COUNT; t++)
    if (asked[t]) change_budget(e, (enum ferry_tier)t, asked[t], "asked while serving");
  while (e->next_change < e->n_schedule && e->schedule[e->next_change].at_ns <= now_ns) {
    const struct ferry_budget_change *c = &e->schedule[e->next_change++];
    char why[64];
    snprintf(why, sizeof why, "scheduled at %.3f s", (double)c->at_ns / 1e9);
    change_budget(e, c->tier, c->bytes, why);
  }
}

/* ---- reloads ------------------------------------------------------------------------------- */

/* A scratch engine over another store, sharing the model and configuration, to make the plan and
 * unit table the new weights would have without touching the serving engine. */
static ferry_status check_store(struct ferry_engine *e, ferry_store *store, struct ferry_err *err) {
  struct ferry_engine *x = ferry__calloc(1, sizeof *x);
  if (!x) return ferry__err_set(err, FERRY_ERR_NOMEM, "engine: out of memory");
  x->model = e->model;
  x->mc = e->mc;
  x->store = store;
  x->has_data = e->has_data;
  x->ex = e->ex;
  x->cfg = e->cfg;
  x->kv_format = e->kv_format;
  x->kv_dtype = e->kv_dtype;
  x->kv_capacity = e->kv_capacity;
  x->kv_total_bytes = e->kv_total_bytes;
  x->hkv_bytes = e->hkv_bytes;
  x->n_mb = e->n_mb;
  x->n_seqs = e->n_seqs;
  x->li = e->li; /* per-layer tables: borrowed, never freed through x */
  x->rope = e->rope;
  x->kv = e->kv;
  x->first_moe_layer = e->first_moe_layer;
  x->n_moe_layers = e->n_moe_layers;
  x->attn_scale = e->attn_scale;
  x->bounce_bytes = e->bounce_bytes;
  memcpy(x->budget, e->budget, sizeof x->budget);
  x->asked_expert_slots = e->asked_expert_slots;
  struct ferry_plan_config pc;
  level_config(x, e->level >= FERRY_PRESSURE_REFUSE ? FERRY_PRESSURE_ON_DEMAND : e->level, &pc);
  char msg[FERRY_ERRMSG_MAX];
  ferry_status st = ferry__engine_make_plan(x, &pc, &x->plan, msg, sizeof msg);
  if (st != FERRY_OK) {
    ferry__err_set(err, st, "%s", msg);
  } else if ((st = ferry__engine_build_units(x)) != FERRY_OK) {
    ferry__err_set(err, st, "%s", x->err.msg);
  }
  ferry__engine_free_units(x);
  ferry__plan_free(&x->plan);
  ferry_free(x);
  if (st == FERRY_OK && e->has_data) {
    struct ferry_store_nonfinite nf;
    if ((st = ferry_store_scan_nonfinite(store, e->cfg.read_flags & FERRY_READ_DROP_CACHE, &nf)) != FERRY_OK)
      return ferry__err_set(err, st, "checking the new weights for NaN and Inf: %s", ferry_store_errmsg(store));
    if (nf.values && !e->cfg.allow_nonfinite)
      return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: tensor %s holds %llu non-finite value(s) (NaN or Inf)",
                            ferry_store_file_path(store, nf.first_file), nf.first_tensor,
                            (unsigned long long)nf.first_count);
  }
  return st;
}

ferry_status ferry_engine_check_weights(ferry_engine *e, ferry_store *store) {
  if (!e || !store) return ferry__fail(FERRY_ERR_INVALID, "engine_check_weights: NULL argument");
  struct ferry_err err;
  ferry__err_clear(&err);
  ferry_status st = check_store(e, store, &err);
  if (st != FERRY_OK) return ferry__fail(st, "new weights refused: %s", err.msg);
  return FERRY_OK;
}

ferry_status ferry_engine_reload(ferry_engine *e, ferry_store *store, const char *label) {
  if (e && ferry__mgpu_on(e)) /* its weights are spread over the devices (mgpu.c): no re-plan yet */
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "engine_reload: not for a run split over %d devices", e->n_dev);
  ferry_status st = ferry_engine_check_weights(e, store);
  if (st != FERRY_OK) {
    ferry__engine_event(e, FERRY_ENGINE_EVENT_RELOAD, -1, NAN, "reload refused", "%s: %s", label ? label : "weights",
                        ferry_last_error());
    return st;
  }
  struct weights_version *v = ferry__calloc(1, sizeof *v);
  if (!v) return ferry__fail(FERRY_ERR_NOMEM, "engine: out of memory");
  v->store = store;
  v->owned = 1;
  snprintf(v->label, sizeof v->label, "%s", label ? label : ferry_store_file_path(store, 0));
  pthread_mutex_lock(&e->adapt_mu);
  v->id = e->next_version++;
  struct weights_version *replaced = e->staged;
  e->staged = v;
  pthread_mutex_unlock(&e->adapt_mu);
  if (replaced)
    ferry__engine_event(e, FERRY_ENGINE_EVENT_RELOAD, -1, NAN, "reload replaced",
                        "version %d (%s) replaced before it was applied", replaced->id, replaced->label);
  release_version(replaced);
  ferry__engine_event(e, FERRY_ENGINE_EVENT_RELOAD, -1, NAN, "reload staged",
                      "version %d (%s) verified; applied once the %d sequence(s) on version %d finish", v->id, v->label,
                      e->current ? e->current->refs : 0, e->current ? e->current->id : 1);
  return FERRY_OK;
}

int ferry__engine_draining(struct ferry_engine *e) {
  pthread_mutex_lock(&e->adapt_mu);
  int d = e->staged != NULL;
  pthread_mutex_unlock(&e->adapt_mu);
  return d;
}

/* The plan of `store` at the level in force, with the workspace laid out for it (the largest
 * quantized matrix sizes the dequantization scratch). Leaves e->store = store. */
static ferry_status plan_for_store(struct ferry_engine *e, ferry_store *store, struct ferry_plan *out) {
  struct ferry_plan_config pc;
  level_config(e, e->level >= FERRY_PRESSURE_REFUSE ? FERRY_PRESSURE_ON_DEMAND : e->level, &pc);
  char msg[FERRY_ERRMSG_MAX];
  e->store = store;
  e->max_q_numel = 0;
  ferry_status st = ferry__engine_make_plan(e, &pc, out, msg, sizeof msg);
  if (st != FERRY_OK) ferry__err_set(&e->err, st, "%s", msg);
  return st;
}

/* Swap the staged version in (no sequence runs on the current one). When the new weights
 * cannot be placed after all (the budgets changed since they were checked, a read failed), the
 * old version is placed again, so the run keeps serving what it served. */
static ferry_status apply_reload(struct ferry_engine *e) {
  pthread_mutex_lock(&e->adapt_mu);
  struct weights_version *v = e->staged;
  e->staged = NULL;
  pthread_mutex_unlock(&e->adapt_mu);
  if (!v) return FERRY_OK;
  struct weights_version *old = e->current;
  ferry_store *old_store = e->store;
  struct ferry_plan np;
  ferry_status st = plan_for_store(e, v->store, &np);
  e->store = old_store; /* rebuild() swaps it once the old placement is drained */
  if (st == FERRY_OK) st = rebuild(e, v->store, &np, 1);
  if (st == FERRY_OK) {
    e->current = v;
    e->reloads++;
    char plan_text[200];
    describe_plan(e, plan_text, sizeof plan_text);
    ferry__engine_event(e, FERRY_ENGINE_EVENT_RELOAD, -1, NAN, "reload applied", "version %d (%s) serving: %s", v->id,
                        v->label, plan_text);
    release_version(old);
    sync_budgets(e);
    return FERRY_OK;
  }
  char why[FERRY_ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", e->err.msg);
  struct ferry_plan back;
  ferry_status rst = plan_for_store(e, old_store, &back);
  if (rst == FERRY_OK) rst = rebuild(e, old_store, &back, 1);
  release_version(v);
  if (rst != FERRY_OK)
    return ferry__err_set(&e->err, rst, "reload failed (%s) and version %d could not be placed again: %s", why, old->id,
                          e->err.msg);
  ferry__engine_event(e, FERRY_ENGINE_EVENT_RELOAD, -1, NAN, "reload rolled back",
                      "the new weights could not be placed (%s); version %d serves on", why, old->id);
  return FERRY_OK;
}

/* ---- at each step boundary ------------------------------------------------------------------ */

ferry_status ferry__engine_adapt(struct ferry_engine *e, int64_t now_ns) {
  apply_schedule(e, now_ns);
  ferry_status st = FERRY_OK;
  if (e->cfg.pressure.enabled && (st = pressure_step(e)) != FERRY_OK) return st;
  if (ferry__engine_draining(e) && e->current->refs == 0) st = apply_reload(e);
  return st;
}
