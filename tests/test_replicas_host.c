/* Data-parallel replicas on the host executor, in real time (ferry_replicas_serve_realtime()):
 * each engine stepped by its own thread, each request routed when it arrives. On a generated
 * tiny model with greedy sampling, every request's output tokens equal those of one engine
 * serving the whole trace, whichever replica served it; the replicas served what the router
 * decided (round-robin: in turn); each replica's device arena stayed within its budget. The
 * CLI: `ferry run --replicas 2` records which replica served each request and ran each step,
 * as many as the replica's own line says, and `ferry db show` prints them per replica. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/model.h"
#include "ferry/store.h"
#include "testutil.h"

#define N_REQ 6
#define MAX_OUT 8
#define MAX_REP 2

static char *dir, *model_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("replicas_host");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 11};
  model_dir = tu_gen_model(dir, "tiny-dense", "m", &go);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(model_dir);
  return 0;
}

/* Arrivals 3 ms apart (a burst of two at the start), unequal lengths. */
static const struct ferry_engine_request requests[N_REQ] = {
    {.id = 10, .arrival_ns = 0, .prompt_tokens = 13, .output_tokens = 5},
    {.id = 11, .arrival_ns = 0, .prompt_tokens = 6, .output_tokens = 7},
    {.id = 12, .arrival_ns = 3000000, .prompt_tokens = 9, .output_tokens = 4},
    {.id = 13, .arrival_ns = 6000000, .prompt_tokens = 4, .output_tokens = 6},
    {.id = 14, .arrival_ns = 9000000, .prompt_tokens = 11, .output_tokens = 3},
    {.id = 15, .arrival_ns = 12000000, .prompt_tokens = 7, .output_tokens = 5},
};

/* The greedy token each logits row gave, by request (id - 10) and position: each request is
 * served by one engine, so the threads write disjoint entries. */
struct tokens {
  int32_t t[N_REQ][MAX_OUT];
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *toks, int32_t n_toks, const float *l,
                      int64_t vocab) {
  (void)toks;
  (void)n_toks;
  struct tokens *out = user;
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; i++)
    if (l[i] > l[best]) best = i;
  if (req >= 10 && req < 10 + N_REQ && tok >= 0 && tok < MAX_OUT) out->t[req - 10][tok] = (int32_t)best;
}

struct reps {
  int32_t n;
  ferry_model *m;
  ferry_store *s;
  ferry_exec *ex[MAX_REP];
  ferry_engine *eng[MAX_REP];
  uint64_t budget;
};

/* n engines, each on its own host executor with the engine's minimum device budget (layers
 * stream from the shared store), greedy sampling. */
static void reps_create(struct reps *r, int32_t n, struct tokens *tok) {
  memset(r, 0, sizeof *r);
  r->n = n;
  assert_int_equal(ferry_model_open(&r->m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&r->s, model_dir), FERRY_OK);
  struct ferry_engine_config c = {.block_layers = 1, .prefetch_depth = 1, .max_batch = 3, .max_step_tokens = 16,
                                  .max_seq_tokens = 32, .seed = 5, .greedy = 1, .on_logits = on_logits,
                                  .logits_user = tok};
  uint64_t dmin = 0, hmin = 0;
  assert_int_equal(ferry_engine_min_budgets(r->m, r->s, &c, &dmin, &hmin), FERRY_OK);
  c.device_budget_bytes = r->budget = dmin;
  for (int32_t i = 0; i < n; i++) {
    struct ferry_exec_config xc = {.device_budget_bytes = dmin, .compute_threads = 1};
    assert_int_equal(ferry_exec_create_host(&r->ex[i], &xc), FERRY_OK);
    if (ferry_engine_create(&r->eng[i], r->m, r->s, r->ex[i], &c) != FERRY_OK)
      fail_msg("engine_create: %s", ferry_last_error());
  }
}

static void reps_free(struct reps *r) {
  for (int32_t i = 0; i < r->n; i++) {
    ferry_engine_destroy(r->eng[i]);
    ferry_exec_destroy(r->ex[i]);
  }
  ferry_store_close(r->s);
  ferry_model_close(r->m);
}

/* Every request done by the engine the router named, and each device arena within its budget. */
static void check_served(const struct reps *r, const int32_t *replica_of) {
  int64_t served = 0;
  for (int32_t i = 0; i < r->n; i++) {
    int64_t n;
    const struct ferry_request_metrics *rm = ferry_engine_request_metrics(r->eng[i], &n);
    for (int64_t j = 0; j < n; j++) {
      assert_true(rm[j].finish_ns >= rm[j].first_token_ns && rm[j].first_token_ns > 0);
      int k = (int)(rm[j].id - 10);
      assert_true(k >= 0 && k < N_REQ);
      assert_int_equal(replica_of[k], i);
      assert_int_equal(rm[j].output_tokens, requests[k].output_tokens);
    }
    served += n;
    uint64_t used, peak;
    ferry_exec_tier_usage(r->ex[i], FERRY_TIER_DEVICE, &used, &peak);
    assert_true(peak > 0);
    if (peak > r->budget) fail_msg("replica %d: device peak %llu over its budget %llu", i, (unsigned long long)peak,
                                   (unsigned long long)r->budget);
  }
  assert_int_equal(served, N_REQ);
}

static void assert_tokens_equal(const struct tokens *a, const struct tokens *b) {
  for (int k = 0; k < N_REQ; k++)
    for (int j = 0; j < requests[k].output_tokens; j++)
      if (a->t[k][j] != b->t[k][j])
        fail_msg("request %lld token %d: %d on replicas, %d on one engine", (long long)requests[k].id, j, a->t[k][j],
                 b->t[k][j]);
}

/* One engine serving everything; its greedy tokens. */
static void one_engine(struct tokens *tok) {
  struct reps r;
  memset(tok, 0xff, sizeof *tok);
  reps_create(&r, 1, tok);
  if (ferry_engine_run(r.eng[0], requests, N_REQ, NULL) != FERRY_OK) fail_msg("run: %s", ferry_last_error());
  reps_free(&r);
}

static void test_tokens_equal_one_engine(void **state) {
  (void)state;
  struct tokens one, two;
  one_engine(&one);
  static const enum ferry_router routers[] = {FERRY_ROUTER_ROUND_ROBIN, FERRY_ROUTER_LEAST_REQUESTS,
                                              FERRY_ROUTER_LEAST_TOKENS};
  for (size_t ri = 0; ri < sizeof routers / sizeof *routers; ri++) {
    struct reps r;
    int32_t replica_of[N_REQ];
    memset(&two, 0xff, sizeof two);
    reps_create(&r, 2, &two);
    if (ferry_replicas_serve_realtime(r.eng, 2, requests, N_REQ, routers[ri], NULL, replica_of) != FERRY_OK)
      fail_msg("%s: %s", ferry_router_name(routers[ri]), ferry_last_error());
    check_served(&r, replica_of);
    assert_tokens_equal(&two, &one);
    if (routers[ri] == FERRY_ROUTER_ROUND_ROBIN) /* in turn, in arrival order (= the array's) */
      for (int k = 0; k < N_REQ; k++) assert_int_equal(replica_of[k], k % 2);
    reps_free(&r);
  }
}

/* As fast as possible: every request routed at once by the counts the router has sent (the
 * least-requests router splits them evenly before any thread has taken one). */
static void test_all_at_once(void **state) {
  (void)state;
  struct tokens one, two;
  one_engine(&one);
  struct reps r;
  int32_t replica_of[N_REQ];
  memset(&two, 0xff, sizeof two);
  reps_create(&r, 2, &two);
  const struct ferry_run_options o = {.as_fast_as_possible = 1};
  assert_int_equal(ferry_replicas_serve_realtime(r.eng, 2, requests, N_REQ, FERRY_ROUTER_LEAST_REQUESTS, &o, replica_of),
                   FERRY_OK);
  check_served(&r, replica_of);
  assert_tokens_equal(&two, &one);
  int counts[2] = {0, 0};
  for (int k = 0; k < N_REQ; k++) counts[replica_of[k]]++;
  assert_true(counts[0] >= 2 && counts[1] >= 2);
  assert_int_equal(ferry_replicas_serve_realtime(r.eng, 0, requests, N_REQ, FERRY_ROUTER_ROUND_ROBIN, &o, NULL),
                   FERRY_ERR_INVALID);
  /* an arrival past the clock once scaled: routed at once, refused by its replica, named */
  const struct ferry_engine_request late[2] = {requests[0], {.id = 99, .arrival_ns = INT64_MAX / 2,
                                                              .prompt_tokens = 4, .output_tokens = 2}};
  const struct ferry_run_options scaled = {.time_scale = 4};
  assert_int_equal(ferry_replicas_serve_realtime(r.eng, 2, late, 2, FERRY_ROUTER_ROUND_ROBIN, &scaled, NULL),
                   FERRY_ERR_RANGE);
  assert_true(tu_contains(ferry_last_error(), "replica 1: ") && tu_contains(ferry_last_error(), "request 99"));
  reps_free(&r);
}

static int64_t db_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  const int64_t v = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  return v;
}

/* The CLI: each request's replica as the replica's own line counts them; steps carry theirs. */
static void test_cli_run_replicas(void **state) {
  (void)state;
  char db_path[600], sql[256], *out = NULL;
  int64_t counts[2] = {0, 0};
  snprintf(db_path, sizeof db_path, "%s/run.db", dir);
  const int rc = tu_run_ferryf(&out,
                               "run --model '%s' --synthetic rate=200,n=8,prompt=6,output=3 --max-seq-tokens 32 "
                               "--max-batch 2 --greedy --quiet --replicas 2 --router least-requests --db '%s'",
                               model_dir, db_path);
  if (rc != 0) fail_msg("ferry run --replicas 2: exit %d\n%s", rc, out);
  assert_true(tu_contains(out, "replicas: 2, router least-requests") && tu_contains(out, "replica 1: "));
  free(out);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(db_path, &db), SQLITE_OK);
  assert_int_equal(db_int(db, "SELECT count(*) FROM requests"), 8);
  assert_int_equal(db_int(db, "SELECT count(*) FROM requests WHERE replica IS NULL OR replica NOT IN (0, 1)"), 0);
  assert_int_equal(db_int(db, "SELECT count(*) FROM steps WHERE replica IS NULL OR replica NOT IN (0, 1)"), 0);
  for (int i = 0; i < 2; i++) {
    /* the replica's line: "N requests, ..." */
    snprintf(sql, sizeof sql, "SELECT CAST(value AS INTEGER) FROM META_DATA_EXPORT WHERE name = 'REPLICA_%d'", i);
    const int64_t said = db_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM requests WHERE replica = %d", i);
    assert_int_equal(db_int(db, sql), said);
    assert_true(said > 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE replica = %d", i);
    assert_true(db_int(db, sql) > 0);
    counts[i] = said;
  }
  sqlite3_close(db);
  /* db show: a line per replica with what it served */
  if (tu_run_ferryf(&out, "db show 1 --db '%s'", db_path) != 0) fail_msg("db show: %s", out);
  char line[64];
  assert_true(tu_contains(out, "replicas     2"));
  for (int i = 0; i < 2; i++) {
    snprintf(line, sizeof line, "replica %d  %lld requests", i, (long long)counts[i]);
    if (!tu_contains(out, line)) fail_msg("no '%s' in:\n%s", line, out);
  }
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tokens_equal_one_engine),
      cmocka_unit_test(test_all_at_once),
      cmocka_unit_test(test_cli_run_replicas),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
