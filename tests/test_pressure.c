/* Memory-pressure control: the pure decision (marks, hysteresis, dwell, the over-budget
 * override), /proc parsing, and the engine on real budgets: a host budget that shrinks while
 * the engine serves is met before the next step (every later memory sample under it), the
 * run keeps serving with unchanged logits and records what it did; a budget below the minimum
 * refuses new requests while the running ones finish; the simulator does the same in virtual
 * time, reproducibly; `ferry run` and `ferry sim` write the transitions to engine_events. */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hostmem.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "runtime/policy/pressure.h"
#include "testutil.h"

static char *tmp, *model_dir;

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("pressure");
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  size_t n = strlen(tmp) + 16;
  model_dir = malloc(n);
  snprintf(model_dir, n, "%s/dense", tmp);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 9};
  assert_int_equal(ferry_model_generate(m, &go, model_dir, NULL), FERRY_OK);
  ferry_model_close(m);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  free(model_dir);
  return 0;
}

/* ---- the decision ----------------------------------------------------------------------------- */

static struct ferry_pressure_snapshot snap(int32_t level, double host, double same, double down) {
  struct ferry_pressure_snapshot s;
  memset(&s, 0, sizeof s);
  s.now_ns = 1000;
  s.last_change_ns = INT64_MIN;
  s.level = level;
  for (int t = 0; t < FERRY_TIER_COUNT; t++) {
    s.high[t] = t == FERRY_TIER_HOST ? 0.85 : 1.0;
    s.low[t] = t == FERRY_TIER_HOST ? 0.70 : 1.0;
    s.index[t] = s.same[t] = s.down[t] = 0.5;
  }
  s.index[FERRY_TIER_HOST] = host;
  s.same[FERRY_TIER_HOST] = same;
  s.down[FERRY_TIER_HOST] = down;
  return s;
}

static void test_decision(void **state) {
  (void)state;
  struct ferry_pressure_decision d;
  struct ferry_pressure_snapshot s = snap(0, 0.6, 0.6, 0);
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_STAY);
  /* over the high mark: a plan for the budgets that fits is taken at the same level */
  s = snap(0, 0.9, 0.7, 0);
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_REPLAN);
  assert_int_equal(d.level, 0);
  assert_int_equal(d.tier, FERRY_TIER_HOST);
  assert_true(d.index == 0.9);
  /* ... else one level up */
  s = snap(1, 0.9, 0.9, 0.95);
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_DEGRADE);
  assert_int_equal(d.level, 2);
  assert_string_equal(d.what, "shrink expert cache");
  /* the top level stays */
  s = snap(4, 0.99, 0.99, 0.99);
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_STAY);
  /* hysteresis: between the marks nothing moves; below the low one, down one level when the
   * level below is predicted under the high mark */
  s = snap(2, 0.75, 0.75, 0.6);
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_STAY);
  s = snap(2, 0.6, 0.6, 0.8);
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_RECOVER);
  assert_int_equal(d.level, 1);
  s = snap(2, 0.6, 0.6, 0.9);
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_STAY);
  /* a budget change re-plans even without pressure */
  s = snap(0, 0.3, 0.3, 0);
  s.budget_changed = 1;
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_REPLAN);
  /* dwell: a recent transition defers the next one, unless a tier is over its budget */
  s = snap(1, 0.9, 0.9, 0.9);
  s.last_change_ns = 900;
  s.min_dwell_ns = 500;
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_STAY);
  s.index[FERRY_TIER_HOST] = 1.2;
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_DEGRADE);
  /* the device tier only counts once over its budget */
  s = snap(0, 0.5, 0.5, 0);
  s.index[FERRY_TIER_DEVICE] = 0.99;
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_STAY);
  s.index[FERRY_TIER_DEVICE] = 1.1;
  s.same[FERRY_TIER_DEVICE] = INFINITY;
  ferry__pressure_decide(&s, &d);
  assert_int_equal(d.action, FERRY_PRESSURE_DEGRADE);
  assert_int_equal(d.tier, FERRY_TIER_DEVICE);
  assert_string_equal(ferry__pressure_level_name(3), "on-demand loading");
}

static void test_proc_parsing(void **state) {
  (void)state;
  char mi[600], psi[600];
  snprintf(mi, sizeof mi, "%s/meminfo", tmp);
  snprintf(psi, sizeof psi, "%s/psi", tmp);
  const char *m = "MemTotal:       16384000 kB\nMemFree:         100 kB\nMemAvailable:    4096000 kB\n";
  const char *p = "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=2.25 avg60=0.00 avg300=0.00 total=9\n";
  tu_write_file(mi, m, strlen(m));
  tu_write_file(psi, p, strlen(p));
  struct ferry__host_mem hm;
  assert_int_equal(ferry__host_mem_read(&hm, mi, psi), 1);
  assert_int_equal(hm.total_bytes, 16384000ull * 1024);
  assert_int_equal(hm.available_bytes, 4096000ull * 1024);
  assert_int_equal(hm.has_psi, 1);
  assert_true(hm.psi_some_avg10 == 12.5 && hm.psi_full_avg10 == 2.25);
  char none[600];
  snprintf(none, sizeof none, "%s/absent", tmp);
  assert_int_equal(ferry__host_mem_read(&hm, mi, none), 1);
  assert_int_equal(hm.has_psi, 0);
  assert_int_equal(ferry__host_mem_read(&hm, none, none), 0);
}

/* ---- the engine on the host executor ----------------------------------------------------------- */

struct sample {
  int64_t t_ns;
  uint64_t used;
};

struct capture {
  struct sample *host;
  size_t n, cap;
  float *logits;
  size_t floats, fcap;
  /* budget changes asked from the tick: at tick k, set host budget to bytes */
  int ticks;
  int at_tick[4];
  uint64_t bytes[4];
  int n_changes;
};

static void sink(void *user, const struct ferry_activity *a) {
  struct capture *c = user;
  if (a->kind != FERRY_ACT_MEMORY || a->tier != FERRY_TIER_HOST) return;
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 256;
    c->host = realloc(c->host, c->cap * sizeof *c->host);
    assert_non_null(c->host);
  }
  c->host[c->n++] = (struct sample){a->start_ns, a->used_bytes};
}

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                      int64_t vocab) {
  (void)req;
  (void)tok;
  (void)tokens;
  (void)n_tokens;
  struct capture *c = user;
  if (c->floats + (size_t)vocab > c->fcap) {
    c->fcap = (c->floats + (size_t)vocab) * 2;
    c->logits = realloc(c->logits, c->fcap * sizeof(float));
    assert_non_null(c->logits);
  }
  memcpy(c->logits + c->floats, l, (size_t)vocab * sizeof(float));
  c->floats += (size_t)vocab;
}

static void tick(void *user, ferry_engine *e, int64_t now_ns) {
  (void)now_ns;
  struct capture *c = user;
  c->ticks++;
  for (int i = 0; i < c->n_changes; i++)
    if (c->at_tick[i] == c->ticks) assert_int_equal(ferry_engine_set_budget(e, FERRY_TIER_HOST, c->bytes[i]), FERRY_OK);
}

static const struct ferry_engine_request reqs[] = {
    {.id = 1, .prompt_tokens = 6, .output_tokens = 6}, {.id = 2, .prompt_tokens = 4, .output_tokens = 7},
    {.id = 3, .prompt_tokens = 9, .output_tokens = 5}, {.id = 4, .prompt_tokens = 5, .output_tokens = 6}};
#define N_REQS 4

struct result {
  ferry_status st;
  struct ferry_serve_summary sum;
  struct ferry_engine_event ev[64];
  int64_t n_ev;
  struct ferry_request_metrics rm[N_REQS];
};

static struct ferry_engine_config base(void) {
  struct ferry_engine_config c = {.block_layers = 1, .prefetch_depth = 2, .max_batch = 2, .max_step_tokens = 16,
                                  .max_seq_tokens = 16, .seed = 3, .read_flags = FERRY_READ_DROP_CACHE};
  return c;
}

static uint64_t host_min(struct ferry_engine_config c, int32_t depth) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  uint64_t dev = 0, host = 0;
  c.prefetch_depth = depth;
  assert_int_equal(ferry_engine_min_budgets(m, s, &c, &dev, &host), FERRY_OK);
  ferry_store_close(s);
  ferry_model_close(m);
  return host;
}

static uint64_t device_min(struct ferry_engine_config c) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  uint64_t dev = 0, host = 0;
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &c, &dev, &host), FERRY_OK);
  ferry_model_close(m);
  return dev;
}

static void serve_host(struct ferry_engine_config c, struct capture *cap, struct result *r) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes, .host_budget_bytes = c.host_budget_bytes,
                                 .compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  ferry_exec_set_sink(ex, sink, cap);
  c.on_logits = on_logits;
  c.logits_user = cap;
  memset(r, 0, sizeof *r);
  r->st = ferry_engine_create(&e, m, s, ex, &c);
  if (r->st == FERRY_OK) {
    struct ferry_run_options ro = {.as_fast_as_possible = 1, .on_tick = tick, .tick_user = cap};
    r->st = ferry_engine_run(e, reqs, N_REQS, &ro);
    if (r->st != FERRY_OK) fprintf(stderr, "run: %s\n", ferry_last_error());
    ferry_engine_summary(e, &r->sum);
    const struct ferry_engine_event *ev = ferry_engine_events(e, &r->n_ev);
    if (r->n_ev > 64) r->n_ev = 64;
    if (r->n_ev) memcpy(r->ev, ev, (size_t)r->n_ev * sizeof *ev);
    int64_t n;
    const struct ferry_request_metrics *rm = ferry_engine_request_metrics(e, &n);
    memcpy(r->rm, rm, sizeof r->rm);
  }
  ferry_exec_set_sink(ex, NULL, NULL);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

static const struct ferry_engine_event *find_event(const struct result *r, const char *action, int nth) {
  for (int64_t i = 0; i < r->n_ev; i++)
    if (!strcmp(r->ev[i].action, action) && nth-- == 0) return &r->ev[i];
  return NULL;
}

static void print_events(const struct result *r) {
  for (int64_t i = 0; i < r->n_ev; i++)
    fprintf(stderr, "  %lld %s level %d: %s\n", (long long)r->ev[i].t_ns, r->ev[i].action, r->ev[i].level, r->ev[i].detail);
}

/* Every host sample from t on is within the budget. */
static void assert_within(const struct capture *cap, int64_t from_ns, int64_t until_ns, uint64_t budget) {
  size_t checked = 0;
  for (size_t i = 0; i < cap->n; i++) {
    if (cap->host[i].t_ns < from_ns || cap->host[i].t_ns >= until_ns) continue;
    if (cap->host[i].used > budget)
      fprintf(stderr, "sample at %lld: %llu bytes > budget %llu\n", (long long)cap->host[i].t_ns,
              (unsigned long long)cap->host[i].used, (unsigned long long)budget);
    assert_true(cap->host[i].used <= budget);
    checked++;
  }
  assert_true(checked > 0);
}

static void test_host_budget_shrinks_while_serving(void **state) {
  (void)state;
  struct ferry_engine_config c = base();
  c.device_budget_bytes = device_min(c);
  /* reference: the same requests, no pressure control, everything streamed from host memory */
  struct capture ref = {0};
  struct result r0;
  c.host_budget_bytes = 256ull << 20;
  serve_host(c, &ref, &r0);
  assert_int_equal(r0.st, FERRY_OK);
  assert_int_equal(r0.sum.requests_done, N_REQS);
  assert_int_equal(r0.sum.bytes_disk, 0);
  /* with pressure control: at the third step boundary the host budget drops to where two
   * staging slots fit but three do not (the prefetch depth must shrink), at the ninth it comes
   * back */
  const uint64_t min1 = host_min(c, 1), min2 = host_min(c, 2);
  assert_true(min2 > min1);
  /* narrow marks: the host tier is planned to 95 % of its budget */
  const uint64_t tight = (uint64_t)((double)(min1 + min2) / 2 / 0.95);
  struct capture cap = {.at_tick = {3, 9}, .bytes = {tight, 256ull << 20}, .n_changes = 2};
  c.pressure.enabled = 1;
  c.pressure.high_water = 0.98;
  c.pressure.low_water = 0.95;
  struct result r;
  serve_host(c, &cap, &r);
  if (r.st != FERRY_OK) print_events(&r);
  assert_int_equal(r.st, FERRY_OK);
  assert_int_equal(r.sum.requests_done, N_REQS);
  assert_int_equal(r.sum.requests_refused, 0);
  assert_int_equal(cap.floats, ref.floats);
  assert_memory_equal(cap.logits, ref.logits, ref.floats * sizeof(float)); /* degrading changes no number */
  const struct ferry_engine_event *cut = find_event(&r, "budget changed", 0), *shed = find_event(&r, "shrink prefetch depth", 0),
                                  *back = find_event(&r, "budget changed", 1);
  if (!cut || !shed || !back) print_events(&r);
  assert_non_null(cut);
  assert_non_null(shed);
  assert_non_null(back);
  assert_int_equal(cut->tier, FERRY_TIER_HOST);
  assert_true(cut->pressure_index > 1.0); /* the new budget was exceeded when it came */
  assert_int_equal(shed->level, 1);
  assert_true(tu_contains(shed->detail, "level 0 -> 1"));
  assert_true(r.sum.pressure_level_max >= 1);
  assert_true(r.sum.bytes_disk > 0); /* what left host memory was read from disk */
  /* from the shed on, until the budget came back, the host tier held to the tight budget */
  assert_within(&cap, shed->t_ns, back->t_ns, tight);
  /* once it came back the engine recovered (a re-plan, then one level down) */
  assert_non_null(find_event(&r, "recover", 0));
  assert_int_equal(r.ev[r.n_ev - 1].level, 0);
  free(ref.host);
  free(ref.logits);
  free(cap.host);
  free(cap.logits);
}

static void test_budget_below_minimum_refuses(void **state) {
  (void)state;
  struct ferry_engine_config c = base();
  c.max_batch = 1; /* one request runs, the others wait */
  c.device_budget_bytes = device_min(c);
  c.host_budget_bytes = 256ull << 20;
  c.pressure.enabled = 1;
  struct capture cap = {.at_tick = {2}, .bytes = {host_min(c, 0) / 4}, .n_changes = 1};
  struct result r;
  serve_host(c, &cap, &r);
  if (r.st != FERRY_OK) print_events(&r);
  assert_int_equal(r.st, FERRY_OK);
  /* the running request finished; those waiting were refused, each with an event */
  assert_int_equal(r.sum.requests_done, 1);
  assert_int_equal(r.sum.requests_refused, N_REQS - 1);
  assert_int_equal(r.rm[0].refused, 0);
  assert_true(r.rm[0].finish_ns > 0);
  for (int i = 1; i < N_REQS; i++) assert_int_equal(r.rm[i].refused, 1);
  const struct ferry_engine_event *refuse = find_event(&r, "refuse new requests", 0);
  assert_non_null(refuse);
  assert_int_equal(refuse->level, 4);
  assert_true(tu_contains(refuse->detail, "no plan fits the budgets in force"));
  const struct ferry_engine_event *one = find_event(&r, "request refused", 0);
  assert_non_null(one);
  assert_int_equal(one->kind, FERRY_ENGINE_EVENT_REFUSED);
  assert_true(tu_contains(one->detail, "refused: memory pressure"));
  assert_non_null(find_event(&r, "request refused", N_REQS - 2));
  free(cap.host);
  free(cap.logits);
}

/* ---- the simulator ------------------------------------------------------------------------------ */

/* The simulator sized by the model folder's files (as `ferry sim --model DIR`): nothing read. */
static void serve_sim(struct result *r, struct capture *cap) {
  ferry_model *m = NULL;
  ferry_store *st = NULL;
  ferry_hw *hw = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&st, model_dir), FERRY_OK);
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  struct ferry_engine_config c = base();
  uint64_t dev = 0, host = 0;
  assert_int_equal(ferry_engine_min_budgets(m, st, &c, &dev, &host), FERRY_OK);
  struct ferry_engine_config one = c;
  one.prefetch_depth = 1;
  uint64_t dev1 = 0, host1 = 0;
  assert_int_equal(ferry_engine_min_budgets(m, st, &one, &dev1, &host1), FERRY_OK);
  c.device_budget_bytes = dev;
  c.host_budget_bytes = 256ull << 20;
  c.pressure.enabled = 1;
  /* in virtual time: cut to "depth 1 only" at 2 ms, below the minimum at 6 ms, back at 9 ms */
  const struct ferry_budget_change sched[] = {
      {.at_ns = 2000000, .tier = FERRY_TIER_HOST, .bytes = (uint64_t)((double)(host + host1) / 2 / 0.70)},
      {.at_ns = 6000000, .tier = FERRY_TIER_HOST, .bytes = host1 / 4},
      {.at_ns = 9000000, .tier = FERRY_TIER_HOST, .bytes = 256ull << 20}};
  c.budget_schedule = sched;
  c.n_budget_changes = 3;
  cap->bytes[0] = sched[0].bytes;
  struct ferry_exec_config xc = {.device_budget_bytes = dev, .host_budget_bytes = c.host_budget_bytes};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  ferry_exec_set_sink(ex, sink, cap);
  /* arrivals every millisecond */
  struct ferry_engine_request rq[12];
  for (int i = 0; i < 12; i++) rq[i] = (struct ferry_engine_request){.id = i, .arrival_ns = (int64_t)i * 1000000,
                                                                     .prompt_tokens = 4 + i % 3, .output_tokens = 3};
  memset(r, 0, sizeof *r);
  assert_int_equal(ferry_engine_create(&e, m, st, ex, &c), FERRY_OK);
  struct ferry_run_options ro = {0};
  r->st = ferry_engine_run(e, rq, 12, &ro);
  ferry_engine_summary(e, &r->sum);
  const struct ferry_engine_event *ev = ferry_engine_events(e, &r->n_ev);
  if (r->n_ev > 64) r->n_ev = 64;
  if (r->n_ev) memcpy(r->ev, ev, (size_t)r->n_ev * sizeof *ev);
  ferry_exec_set_sink(ex, NULL, NULL);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  ferry_store_close(st);
  ferry_model_close(m);
}

static void test_sim_pressure(void **state) {
  (void)state;
  struct result a, b;
  struct capture ca = {0}, cb = {0};
  serve_sim(&a, &ca);
  if (a.st != FERRY_OK) print_events(&a);
  assert_int_equal(a.st, FERRY_OK);
  const struct ferry_engine_event *shed = find_event(&a, "shrink prefetch depth", 0),
                                  *refuse = find_event(&a, "refuse new requests", 0),
                                  *cut2 = find_event(&a, "budget changed", 1);
  if (!shed || !refuse || !cut2) print_events(&a);
  assert_non_null(shed);
  assert_non_null(refuse);
  assert_non_null(cut2);
  assert_within(&ca, shed->t_ns, cut2->t_ns, ca.bytes[0]);
  assert_true(a.sum.requests_refused > 0);
  assert_true(a.sum.requests_done > 0);
  assert_int_equal(a.sum.requests_done + a.sum.requests_refused, 12);
  assert_non_null(find_event(&a, "recover", 0)); /* after the budget came back */
  /* the same run in virtual time is the same run */
  serve_sim(&b, &cb);
  assert_int_equal(b.n_ev, a.n_ev);
  for (int64_t i = 0; i < a.n_ev; i++) {
    assert_int_equal(a.ev[i].t_ns, b.ev[i].t_ns);
    assert_string_equal(a.ev[i].action, b.ev[i].action);
  }
  assert_int_equal(a.sum.requests_refused, b.sum.requests_refused);
  free(ca.host);
  free(cb.host);
}

/* ---- the command --------------------------------------------------------------------------------- */

static int64_t query_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_finalize(st);
  return v;
}

static void test_cli_schedule(void **state) {
  (void)state;
  char db[600], args[2048], *out = NULL;
  snprintf(db, sizeof db, "%s/p.db", tmp);
  /* sim: deterministic; the budget falls at 20 ms, below what streaming needs at 60 ms */
  snprintf(args, sizeof args,
           "sim --model tiny-dense --hw h100-pcie --synthetic rate=200,n=40,prompt=8,output=4 --block-layers 1 "
           "--prefetch-depth 2 --device-budget 6MiB --host-budget 256MiB --host-budget-schedule 0.02:16MiB,0.06:1MiB "
           "--db '%s' --quiet",
           db);
  int rc = tu_run_ferry(args, &out);
  if (rc) fprintf(stderr, "%s\n", out);
  assert_int_equal(rc, 0);
  assert_true(tu_contains(out, "request(s) refused under memory pressure"));
  free(out);
  /* run: the host budget falls a quarter of a second in */
  snprintf(args, sizeof args,
           "run --model '%s' --synthetic rate=20,n=12,prompt=8,output=4 --block-layers 1 --prefetch-depth 2 "
           "--device-budget 6MiB --host-budget 256MiB --host-budget-schedule 0.25:16MiB --db '%s' --quiet",
           model_dir, db);
  rc = tu_run_ferry(args, &out);
  if (rc) fprintf(stderr, "%s\n", out);
  assert_int_equal(rc, 0);
  free(out);
  sqlite3 *s = NULL;
  assert_int_equal(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  for (int run = 1; run <= 2; run++) {
    char q[512];
    snprintf(q, sizeof q, "SELECT count(*) FROM engine_events WHERE runId = %d AND kind = 'pressure' AND tier = 'host'", run);
    assert_true(query_int(s, q) >= 2);
    /* no host sample after the shed (the first transition after the budget change) exceeds 16 MiB */
    snprintf(q, sizeof q,
             "SELECT count(*) FROM memory WHERE runId = %d AND tier = 'host' AND used_bytes > 16777216 AND t_ns >= "
             "(SELECT min(t_ns) FROM engine_events WHERE runId = %d AND kind = 'pressure' AND action != 'budget changed')"
             " AND t_ns < coalesce((SELECT t_ns FROM engine_events WHERE runId = %d AND action = 'budget changed' "
             "ORDER BY t_ns LIMIT 1 OFFSET 1), 9223372036854775807)",
             run, run, run);
    assert_int_equal(query_int(s, q), 0);
  }
  assert_true(query_int(s, "SELECT count(*) FROM engine_events WHERE runId = 1 AND kind = 'refused'") > 0);
  assert_int_equal(query_int(s, "SELECT count(*) FROM requests WHERE runId = 2 AND finish_ns IS NOT NULL"), 12);
  assert_int_equal(query_int(s, "SELECT count(*) FROM runs WHERE complete = 1"), 2);
  sqlite3_close(s);
  /* the report shows them: a section, and marks on the memory chart */
  char rep[600], md[700];
  snprintf(rep, sizeof rep, "%s/report", tmp);
  snprintf(args, sizeof args, "report --db '%s' --out '%s' --timeline-run 1", db, rep);
  rc = tu_run_ferry(args, &out);
  if (rc) fprintf(stderr, "%s\n", out);
  assert_int_equal(rc, 0);
  assert_true(tu_contains(out, " events"));
  free(out);
  snprintf(md, sizeof md, "%s/report.md", rep);
  FILE *f = fopen(md, "r");
  assert_non_null(f);
  const size_t cap = 64u << 20;
  char *text = malloc(cap);
  assert_non_null(text);
  size_t n = fread(text, 1, cap - 1, f);
  text[n] = '\0';
  fclose(f);
  assert_true(tu_contains(text, "## What kept run r1 up"));
  assert_true(tu_contains(text, "refuse new requests"));
  assert_true(tu_contains(text, "plots/pressure_level.svg"));
  snprintf(md, sizeof md, "%s/plots/memory.gp", rep);
  f = fopen(md, "r");
  assert_non_null(f);
  n = fread(text, 1, cap - 1, f);
  text[n] = '\0';
  fclose(f);
  assert_true(tu_contains(text, "'budget changed'"));
  assert_true(tu_contains(text, "$b1 using 1:2 with steps")); /* the host budget as it changed */
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decision),
      cmocka_unit_test(test_proc_parsing),
      cmocka_unit_test(test_host_budget_shrinks_while_serving),
      cmocka_unit_test(test_budget_below_minimum_refuses),
      cmocka_unit_test(test_sim_pressure),
      cmocka_unit_test(test_cli_schedule),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
