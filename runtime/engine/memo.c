/* Repeated op sequences as op graphs (runtime/exec/graph.h). On an executor that only times
 * ops (sim), the ops the engine issues for a layer's attention at a batch size, for one expert's
 * fetch or FFN over m tokens, are the same every time but for their events: they are recorded
 * the first time and launched after, which spares building hundreds of kernels per step. The
 * engine still makes every decision (cache, routing, batching) and updates its own state on
 * both paths; only the ops' construction is skipped. A key names everything the recorded ops
 * depend on; FERRY_SIM_CHECK records every time and compares, which is how the test suite
 * checks the keys. */
#include <string.h>

#include "common/alloc.h"
#include "engine_impl.h"
#include "runtime/exec/graph.h"

/* Graphs are small (a few dozen bytes per op); the cap only bounds pathological runs (very
 * many batch sizes x experts x layers): past it, ops are built as without graphs. */
#define MEMO_MAX_BYTES (256u << 20)

struct memo_entry {
  int64_t key[MEMO_KEY_WORDS];
  struct ferry_exec_graph *g; /* NULL: empty */
};

static uint64_t hash_key(const int64_t *k) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (int i = 0; i < MEMO_KEY_WORDS; i++) {
    h ^= (uint64_t)k[i];
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  return h;
}

static struct memo_entry *find(struct ferry__memo *m, const int64_t *k) {
  if (!m->cap) return NULL;
  size_t i = (size_t)hash_key(k) & (m->cap - 1);
  for (;;) {
    struct memo_entry *en = &m->slots[i];
    if (!en->g || !memcmp(en->key, k, sizeof en->key)) return en;
    i = (i + 1) & (m->cap - 1);
  }
}

static int grow(struct ferry__memo *m) {
  size_t cap = m->cap ? 2 * m->cap : 1024;
  struct memo_entry *slots = ferry__calloc(cap, sizeof *slots), *old = m->slots;
  if (!slots) return 0;
  size_t old_cap = m->cap;
  m->slots = slots;
  m->cap = cap;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].g) *find(m, old[i].key) = old[i];
  ferry_free(old);
  return 1;
}

void ferry__memo_free(struct ferry_engine *e) {
  struct ferry__memo *m = &e->memo;
  for (size_t i = 0; i < m->cap; i++) ferry__exec_graph_free(e->ex, m->slots[i].g);
  ferry_free(m->slots);
  memset(m, 0, sizeof *m);
}

void ferry__memo_step(struct ferry_engine *e) { e->memo.mode = ferry__exec_graph_mode(e->ex); }

ferry_status ferry__memo_begin(struct ferry_engine *e, struct memo_site *site, const int64_t key[MEMO_KEY_WORDS],
                               ferry_event *const *params, int32_t n_params, int64_t context_tokens, int *replayed) {
  struct ferry__memo *m = &e->memo;
  *replayed = 0;
  memset(site, 0, sizeof *site);
  if (m->mode == FERRY__GRAPH_NONE) return FERRY_OK;
  memcpy(site->key, key, sizeof site->key);
  site->context_tokens = context_tokens;
  struct memo_entry *en = find(m, key);
  if (en && en->g && m->mode == FERRY__GRAPH_LAUNCH) {
    ferry_status st = ferry__exec_graph_launch(e->ex, en->g, params, context_tokens);
    if (st != FERRY_OK) return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
    *replayed = 1;
    m->launched++;
    return FERRY_OK;
  }
  if (en && en->g) site->check = en->g;         /* FERRY_SIM_CHECK: record and compare */
  else if (m->bytes >= MEMO_MAX_BYTES) return FERRY_OK; /* full: build the ops, record nothing */
  ferry_status st = ferry__exec_graph_begin(e->ex, params, n_params);
  if (st != FERRY_OK) return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  site->recording = 1;
  return FERRY_OK;
}

ferry_status ferry__memo_end(struct ferry_engine *e, struct memo_site *site, ferry_status st) {
  struct ferry__memo *m = &e->memo;
  if (!site->recording) return st;
  struct ferry_exec_graph *g = NULL;
  ferry_status end = ferry__exec_graph_end(e->ex, &g);
  if (st != FERRY_OK) { /* the ops failed: the caller's error stands */
    ferry__exec_graph_free(e->ex, g);
    return st;
  }
  if (end != FERRY_OK) return ferry__err_set(&e->err, end, "%s", ferry_exec_errmsg(e->ex));
  if (site->check) {
    const int same = ferry__exec_graph_same(e->ex, site->check, g, site->context_tokens);
    ferry__exec_graph_free(e->ex, g);
    if (!same)
      return ferry__err_set(&e->err, FERRY_ERR_INTERNAL,
                            "engine: the op graph of key (%lld, %lld, %lld, %lld) differs from the ops built for it now: "
                            "the key misses something the ops depend on",
                            (long long)site->key[0], (long long)site->key[1], (long long)site->key[2],
                            (long long)site->key[3]);
    m->checked++;
    return FERRY_OK;
  }
  if (2 * (m->n + 1) > m->cap && !grow(m)) { /* no room: simply not kept */
    ferry__exec_graph_free(e->ex, g);
    return FERRY_OK;
  }
  struct memo_entry *en = find(m, site->key);
  memcpy(en->key, site->key, sizeof en->key);
  en->g = g;
  m->n++;
  m->bytes += ferry__exec_graph_bytes(e->ex, g);
  return FERRY_OK;
}
