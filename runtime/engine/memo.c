/* Repeated op sequences as op graphs (runtime/exec/graph.h). On an executor that only times
 * ops (sim), the ops the engine issues for a layer's attention at a batch size, for one expert's
 * fetch or FFN over m tokens, are the same every time but for their events: they are recorded
 * the first time and launched after, which spares building hundreds of kernels per step. The
 * engine still makes every decision (cache, routing, batching) and updates its own state on
 * both paths; only the ops' construction is skipped. A key names everything the recorded ops
 * depend on; FERRY_SIM_CHECK records every time and compares, which is how the test suite
 * checks the keys.
 *
 * Keys are (kind, a, b) with small a and b (a layer, an expert, a unit; a token count), so the
 * graphs sit in one vector per (kind, a) indexed by b: a launch costs two dependent loads, and
 * the graphs a decode step uses stay few and close (a hash table's scattered slots made the
 * lookups a fifth of a simulation). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "engine_impl.h"
#include "runtime/exec/graph.h"

/* Graphs are small (a few dozen bytes per op); the cap only bounds pathological runs (very
 * many batch sizes x experts x layers): past it, ops are built as without graphs. */
#define MEMO_MAX_BYTES (256u << 20)

/* The graphs a decode step uses (few tokens: b up to near[kind]) sit in one flat array, by b
 * then a: a decode step's experts have one or two tokens, so the graphs of every layer's experts
 * it asks for are a few lines of it; the rest sit in a vector per group. */

struct memo_group {
  struct ferry_exec_graph **g; /* indexed by b - near of its kind; NULL: not recorded */
  uint32_t n;
};

/* How many b of a kind are near: those of a step of decode tokens only (at most max_batch
 * tokens, an expert gets at most one per token). Keep in step with the keys (engine_impl.h). */
static int64_t near_count(const struct ferry_engine *e, enum memo_kind kind) {
  const int64_t B = e->cfg.max_batch;
  switch (kind) {
    case MEMO_LAYER:
    case MEMO_ROUTING:
    case MEMO_COMBINE: return B + 1;
    case MEMO_EXPERT: return 2 * (B + 1);
    case MEMO_FILL: return 6;
    default: return 0;
  }
}

/* Groups per kind: (kind, a) is group base[kind] + a. */
static int64_t group_count(const struct ferry_engine *e, enum memo_kind kind) {
  const int64_t L = e->mc->n_layers, E = e->mc->n_experts > 0 ? e->mc->n_experts : 1;
  switch (kind) {
    case MEMO_LAYER:
    case MEMO_ROUTING:
    case MEMO_COMBINE: return L;
    case MEMO_EXPERT: return L * E;
    case MEMO_FILL: return e->n_units;
    default: return 0;
  }
}

ferry_status ferry__memo_init(struct ferry_engine *e) {
  struct ferry__memo *m = &e->memo;
  memset(m, 0, sizeof *m);
  int64_t n = 0, near = 0;
  for (int k = MEMO_LAYER; k < MEMO_KINDS; k++) {
    m->base[k] = n;
    m->near_base[k] = near;
    m->near_n[k] = near_count(e, (enum memo_kind)k);
    m->n_a[k] = group_count(e, (enum memo_kind)k);
    n += group_count(e, (enum memo_kind)k);
    near += group_count(e, (enum memo_kind)k) * m->near_n[k];
  }
  m->groups = ferry__calloc((size_t)(n ? n : 1), sizeof *m->groups);
  m->near = ferry__calloc((size_t)(near ? near : 1), sizeof *m->near); /* untouched pages cost nothing */
  m->n_near = near;
  if (!m->groups || !m->near) return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for op graphs");
  m->n_groups = n;
  return FERRY_OK;
}

void ferry__memo_free(struct ferry_engine *e) {
  struct ferry__memo *m = &e->memo;
  if (getenv("FERRY_MEMO_DEBUG"))
    fprintf(stderr, "memo: %zu graphs, %zu bytes, %llu launched\n", m->n, m->bytes, (unsigned long long)m->launched);
  for (int64_t i = 0; m->groups && i < m->n_groups; i++) {
    for (uint32_t b = 0; b < m->groups[i].n; b++) ferry__exec_graph_free(e->ex, m->groups[i].g[b]);
    ferry_free(m->groups[i].g);
  }
  for (int64_t i = 0; m->near && i < m->n_near; i++) ferry__exec_graph_free(e->ex, m->near[i]);
  ferry_free(m->groups);
  ferry_free(m->near);
  memset(m, 0, sizeof *m);
}

void ferry__memo_step(struct ferry_engine *e) {
  /* a multi-device run issues every op (its graphs would span devices' queues) */
  e->memo.mode = e->memo.groups && !ferry__mgpu_on(e) ? ferry__exec_graph_mode(e->ex) : 0;
  ferry__exec_graph_step(e->ex); /* the step's token positions are set (build_step) */
}

/* Where the graph of (kind, a, b) is kept, or NULL when b is past the group's vector. */
static struct ferry_exec_graph **place(struct ferry__memo *m, enum memo_kind kind, int64_t a, int64_t b) {
  const int64_t near = m->near_n[kind];
  if (b < near) return &m->near[m->near_base[kind] + b * m->n_a[kind] + a];
  struct memo_group *grp = &m->groups[m->base[kind] + a];
  return (uint64_t)(b - near) < grp->n ? &grp->g[b - near] : NULL;
}

void ferry__memo_prefetch(struct ferry_engine *e, enum memo_kind kind, int64_t a, int64_t b, int graph) {
  struct ferry__memo *m = &e->memo;
  if (m->mode != FERRY__GRAPH_LAUNCH) return;
  struct ferry_exec_graph **at = place(m, kind, a, b);
  if (!at) return;
  if (!graph) {
    __builtin_prefetch(at);
  } else if (*at) {
    __builtin_prefetch(*at);
    __builtin_prefetch((const char *)*at + 64);
  }
}

ferry_status ferry__memo_begin(struct ferry_engine *e, struct memo_site *site, enum memo_kind kind, int64_t a,
                               int64_t b, ferry_event *const *params, int32_t n_params, int64_t context_tokens,
                               int *replayed) {
  struct ferry__memo *m = &e->memo;
  *replayed = 0;
  site->recording = 0;
  if (m->mode == FERRY__GRAPH_NONE) return FERRY_OK;
  struct ferry_exec_graph **at = place(m, kind, a, b), *g = at ? *at : NULL;
  if (g && m->mode == FERRY__GRAPH_LAUNCH) {
    ferry_status st = ferry__exec_graph_launch(e->ex, g, params, context_tokens);
    if (st != FERRY_OK) return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
    *replayed = 1;
    m->launched++;
    return FERRY_OK;
  }
  if (!g && m->bytes >= MEMO_MAX_BYTES) return FERRY_OK; /* full: build the ops, record nothing */
  ferry_status st = ferry__exec_graph_begin(e->ex, params, n_params);
  if (st != FERRY_OK) return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  site->kind = kind;
  site->a = a;
  site->b = b;
  site->context_tokens = context_tokens;
  site->check = g; /* FERRY_SIM_CHECK: the recording must equal it */
  site->recording = 1;
  return FERRY_OK;
}

ferry_status ferry__memo_end(struct ferry_engine *e, struct memo_site *site, ferry_status st) {
  struct ferry__memo *m = &e->memo;
  if (!site->recording) return st;
  site->recording = 0;
  if (site->check) {
    int same = 0;
    ferry_status end = ferry__exec_graph_check(e->ex, site->check, site->context_tokens, &same);
    if (st != FERRY_OK) return st; /* the ops failed: the caller's error stands */
    if (end != FERRY_OK) return ferry__err_set(&e->err, end, "%s", ferry_exec_errmsg(e->ex));
    if (!same)
      return ferry__err_set(&e->err, FERRY_ERR_INTERNAL,
                            "engine: the op graph of key (%d, %lld, %lld) differs from the ops built for it now: the "
                            "key misses something the ops depend on",
                            (int)site->kind, (long long)site->a, (long long)site->b);
    m->checked++;
    return FERRY_OK;
  }
  struct ferry_exec_graph *g = NULL;
  ferry_status end = ferry__exec_graph_end(e->ex, &g);
  if (st != FERRY_OK) {
    ferry__exec_graph_free(e->ex, g);
    return st;
  }
  if (end != FERRY_OK) return ferry__err_set(&e->err, end, "%s", ferry_exec_errmsg(e->ex));
  struct ferry_exec_graph **at = place(m, site->kind, site->a, site->b);
  if (!at) {
    struct memo_group *grp = &m->groups[m->base[site->kind] + site->a];
    const uint64_t i = (uint64_t)(site->b - m->near_n[site->kind]);
    uint32_t n = grp->n ? grp->n : 8;
    while (n <= i) n *= 2;
    struct ferry_exec_graph **v = ferry__reallocarray(grp->g, n, sizeof *v);
    if (!v) { /* no room: simply not kept */
      ferry__exec_graph_free(e->ex, g);
      return FERRY_OK;
    }
    memset(v + grp->n, 0, (size_t)(n - grp->n) * sizeof *v);
    grp->g = v;
    grp->n = n;
    at = &v[i];
  }
  *at = g;
  m->n++;
  m->bytes += ferry__exec_graph_bytes(e->ex, g);
  return FERRY_OK;
}
