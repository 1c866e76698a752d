/* Data-parallel replicas (ferry_replicas_serve()) on the `sim` executor: one replica gives the
 * figures of ferry_engine_run() byte for byte; round-robin alternates; the load-aware routers
 * send a request away from a replica busy with a long one and lower P99 TTFT on a bursty trace
 * of long and short requests; two replicas serve a saturating trace twice as fast; every
 * replica stays within its budgets. The CLI: --replicas 1 prints what no option does, R=2 records
 * every request in one run with a line per replica, and what it cannot honour is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "testutil.h"

#define MAX_REP 4

static char *tmp;
static ferry_hw *hw;
static ferry_model *model;

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("replicas");
  char path[512];
  snprintf(path, sizeof path, "%s/p.json", tmp);
  static const char text[] =
      "{\"name\": \"p\", \"kind\": \"gpu\","
      " \"gpu\": {\"name\": \"G\", \"memory_bytes\": 1073741824, \"mem_bw_gbps\": 10,"
      " \"peak_tflops\": {\"fp32\": 1, \"fp16\": 10}, \"launch_overhead_ns\": 100},"
      " \"link\": {\"name\": \"L\", \"h2d_gbps\": 1, \"d2h_gbps\": 1, \"latency_ns\": 0, \"copy_engines\": 1},"
      " \"host\": {\"name\": \"H\", \"dram_gbps\": 10, \"cpu_gflops\": 1, \"memory_bytes\": 1073741824},"
      " \"disk\": {\"name\": \"D\", \"read_gbps\": 2, \"latency_ns\": 10000, \"queue_depth\": 4}}";
  tu_write_file(path, text, strlen(text));
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  assert_int_equal(ferry_model_open(&model, "tiny-dense"), FERRY_OK);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  ferry_model_close(model);
  ferry_hw_close(hw);
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

struct reps {
  int32_t n;
  ferry_exec *ex[MAX_REP];
  ferry_engine *eng[MAX_REP];
};

/* R engines, each on its own simulated executor with the engine's minimum budgets; `paged`:
 * a paged KV cache of 16-token blocks (the default pool, which the test traces overfill). */
static void reps_create_kv(struct reps *r, int32_t n, int paged) {
  struct ferry_engine_config c;
  memset(&c, 0, sizeof c);
  c.block_layers = 1;
  c.prefetch_depth = 1;
  c.max_batch = 4;
  c.max_step_tokens = 64;
  c.max_seq_tokens = 256;
  c.seed = 7;
  if (paged) {
    c.kv_block_tokens = 16;
  }
  uint64_t dmin = 0, hmin = 0;
  assert_int_equal(ferry_engine_min_budgets(model, NULL, &c, &dmin, &hmin), FERRY_OK);
  c.device_budget_bytes = dmin;
  c.host_budget_bytes = 4 * hmin;
  const struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes,
                                       .host_budget_bytes = c.host_budget_bytes, .lock_host_memory = 1};
  r->n = n;
  for (int32_t i = 0; i < n; i++) {
    assert_int_equal(ferry_exec_create_sim(&r->ex[i], hw, &xc), FERRY_OK);
    if (ferry_engine_create(&r->eng[i], model, NULL, r->ex[i], &c) != FERRY_OK) fail_msg("%s", ferry_last_error());
  }
}

static void reps_create(struct reps *r, int32_t n) { reps_create_kv(r, n, 0); }

static void reps_free(struct reps *r) {
  for (int32_t i = 0; i < r->n; i++) {
    ferry_engine_destroy(r->eng[i]);
    ferry_exec_destroy(r->ex[i]);
  }
}

/* Serve and summarise; every replica within its budgets. */
static void serve(struct reps *r, const struct ferry_engine_request *q, int64_t n, enum ferry_router router, int afap,
                  int32_t *replica_of, struct ferry_serve_summary *sum) {
  const struct ferry_run_options o = {.time_scale = 1.0, .as_fast_as_possible = afap};
  if (ferry_replicas_serve(r->eng, r->n, q, n, router, &o, replica_of) != FERRY_OK) fail_msg("%s", ferry_last_error());
  ferry_engine_summary_many((const ferry_engine *const *)r->eng, r->n, sum);
  assert_int_equal(sum->requests_done, n);
  for (int32_t i = 0; i < r->n; i++) {
    struct ferry_serve_summary one;
    ferry_engine_summary(r->eng[i], &one);
    for (int t = 0; t < 2; t++)
      if (one.budget_bytes[t]) assert_true(one.peak_bytes[t] <= one.budget_bytes[t]);
  }
}

/* n requests: even ids long (`long_out` tokens), odd ones short, in bursts of `burst` every
 * `gap_ns`. */
static struct ferry_engine_request *trace(int64_t n, int32_t long_out, int64_t burst, int64_t gap_ns) {
  struct ferry_engine_request *q = calloc((size_t)n, sizeof *q);
  assert_non_null(q);
  for (int64_t i = 0; i < n; i++)
    q[i] = (struct ferry_engine_request){.id = i, .arrival_ns = (i / burst) * gap_ns + i % burst,
                                         .prompt_tokens = 16 + (int32_t)(i % 5) * 7,
                                         .output_tokens = i % 2 ? 2 : long_out};
  return q;
}

/* One replica, with or without a paged KV cache (its per-request arrays grow as requests are
 * added), gives ferry_engine_run()'s metrics byte for byte. */
static void one_replica_is_engine_run(int paged) {
  struct ferry_engine_request *q = trace(24, 40, 6, 20000000);
  struct reps a, b;
  reps_create_kv(&a, 1, paged);
  reps_create_kv(&b, 1, paged);
  const struct ferry_run_options o = {.time_scale = 1.0};
  assert_int_equal(ferry_engine_run(a.eng[0], q, 24, &o), FERRY_OK);
  struct ferry_serve_summary sa, sb;
  ferry_engine_summary(a.eng[0], &sa);
  serve(&b, q, 24, FERRY_ROUTER_LEAST_TOKENS, 0, NULL, &sb);
  assert_memory_equal(&sa, &sb, sizeof sa);
  /* paged: the pool is short, and preempted requests' records are in the grown arrays */
  assert_true(!paged || (sa.kv_pool_blocks > 0 && sa.preemptions > 0));
  int64_t na, nb;
  const struct ferry_request_metrics *ra = ferry_engine_request_metrics(a.eng[0], &na);
  const struct ferry_request_metrics *rb = ferry_engine_request_metrics(b.eng[0], &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(ra, rb, (size_t)na * sizeof *ra);
  const struct ferry_step_metrics *ka = ferry_engine_step_metrics(a.eng[0], &na);
  const struct ferry_step_metrics *kb = ferry_engine_step_metrics(b.eng[0], &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(ka, kb, (size_t)na * sizeof *ka);
  reps_free(&a);
  reps_free(&b);
  free(q);
}

static void test_one_replica_is_engine_run(void **state) {
  (void)state;
  one_replica_is_engine_run(0);
  one_replica_is_engine_run(1);
}

static void test_round_robin_alternates(void **state) {
  (void)state;
  struct ferry_engine_request *q = trace(10, 8, 1, 1000000);
  int32_t of[10];
  struct ferry_serve_summary s;
  struct reps r;
  reps_create(&r, 2);
  serve(&r, q, 10, FERRY_ROUTER_ROUND_ROBIN, 0, of, &s);
  for (int i = 0; i < 10; i++) assert_int_equal(of[i], i % 2);
  for (int32_t k = 0; k < 2; k++) {
    int64_t n;
    const struct ferry_request_metrics *m = ferry_engine_request_metrics(r.eng[k], &n);
    assert_int_equal(n, 5);
    for (int64_t i = 0; i < n; i++) assert_int_equal(m[i].id, 2 * i + k);
  }
  reps_free(&r);
  free(q);
}

/* A long request on replica 0, a short one on replica 1 (done by the time a third arrives):
 * round-robin puts the third behind the long one; both load-aware routers do not, and it gets
 * its first token sooner. */
static void test_routes_away_from_long_request(void **state) {
  (void)state;
  struct ferry_engine_request q[3] = {{.id = 0, .arrival_ns = 0, .prompt_tokens = 60, .output_tokens = 180},
                                      {.id = 1, .arrival_ns = 0, .prompt_tokens = 8, .output_tokens = 2},
                                      {.id = 2, .arrival_ns = 0, .prompt_tokens = 60, .output_tokens = 4}};
  struct ferry_serve_summary s;
  int32_t of[3];
  struct reps r;
  reps_create(&r, 2);
  serve(&r, q, 2, FERRY_ROUTER_ROUND_ROBIN, 0, of, &s);
  int64_t n;
  const int64_t short_done = ferry_engine_request_metrics(r.eng[1], &n)[0].finish_ns;
  const int64_t long_done = ferry_engine_request_metrics(r.eng[0], &n)[0].finish_ns;
  reps_free(&r);
  assert_true(short_done < long_done);
  q[2].arrival_ns = (short_done + long_done) / 2;
  int64_t ttft[3];
  for (int k = 0; k < 3; k++) {
    reps_create(&r, 2);
    serve(&r, q, 3, (enum ferry_router)k, 0, of, &s);
    assert_int_equal(of[2], k == FERRY_ROUTER_ROUND_ROBIN ? 0 : 1);
    const struct ferry_request_metrics *m = ferry_engine_request_metrics(r.eng[of[2]], &n);
    ttft[k] = m[n - 1].first_token_ns - m[n - 1].arrival_ns;
    reps_free(&r);
  }
  assert_true(ttft[FERRY_ROUTER_LEAST_REQUESTS] < ttft[FERRY_ROUTER_ROUND_ROBIN]);
  assert_true(ttft[FERRY_ROUTER_LEAST_TOKENS] < ttft[FERRY_ROUTER_ROUND_ROBIN]);
}

/* Bursts alternating long and short requests: round-robin stacks every long one on replica 0. */
static void test_least_tokens_lowers_p99_ttft(void **state) {
  (void)state;
  struct ferry_engine_request *q = trace(48, 120, 8, 100000000);
  struct ferry_serve_summary rr, lt;
  struct reps r;
  reps_create(&r, 2);
  serve(&r, q, 48, FERRY_ROUTER_ROUND_ROBIN, 0, NULL, &rr);
  reps_free(&r);
  reps_create(&r, 2);
  serve(&r, q, 48, FERRY_ROUTER_LEAST_TOKENS, 0, NULL, &lt);
  reps_free(&r);
  assert_true(lt.ttft.p99 < rr.ttft.p99);
  free(q);
}

/* Every request at once, all alike: each of two replicas does the steps one replica does for
 * half of them, so the rate doubles up to the first and last steps' partial batches (5 %). */
static void test_two_replicas_double_throughput(void **state) {
  (void)state;
  struct ferry_engine_request q[32];
  for (int i = 0; i < 32; i++)
    q[i] = (struct ferry_engine_request){.id = i, .arrival_ns = 0, .prompt_tokens = 32, .output_tokens = 24};
  struct ferry_serve_summary one, two;
  struct reps r;
  reps_create(&r, 1);
  serve(&r, q, 32, FERRY_ROUTER_ROUND_ROBIN, 1, NULL, &one);
  reps_free(&r);
  reps_create(&r, 2);
  serve(&r, q, 32, FERRY_ROUTER_LEAST_REQUESTS, 1, NULL, &two);
  reps_free(&r);
  const double ratio = two.tokens_per_s / one.tokens_per_s;
  if (ratio < 1.9 || ratio > 2.1) fail_msg("R=2 / R=1 throughput %.3f, expected 2 +- 5%%", ratio);
}

static void test_bad_calls_refused(void **state) {
  (void)state;
  struct reps r;
  reps_create(&r, 1);
  enum ferry_router router;
  assert_int_equal(ferry_router_from_name("random", &router), FERRY_ERR_INVALID);
  assert_int_equal(ferry_router_from_name("least-tokens", &router), FERRY_OK);
  assert_string_equal(ferry_router_name(router), "least-tokens");
  assert_int_equal(ferry_replicas_serve(r.eng, 0, NULL, 0, router, NULL, NULL), FERRY_ERR_INVALID);
  const struct ferry_engine_request q[2] = {{.id = 0, .arrival_ns = 5, .prompt_tokens = 4, .output_tokens = 2},
                                            {.id = 1, .arrival_ns = 1, .prompt_tokens = 4, .output_tokens = 2}};
  assert_int_equal(ferry_engine_serve_add(r.eng[0], &q[0]), FERRY_ERR_INVALID); /* no open run */
  assert_int_equal(ferry_engine_serve_begin(r.eng[0], NULL, 0, NULL), FERRY_OK);
  assert_int_equal(ferry_engine_serve_begin(r.eng[0], NULL, 0, NULL), FERRY_ERR_INVALID);
  assert_int_equal(ferry_engine_serve_add(r.eng[0], &q[0]), FERRY_OK);
  assert_int_equal(ferry_engine_serve_add(r.eng[0], &q[1]), FERRY_ERR_INVALID); /* out of order: closed */
  assert_int_equal(ferry_engine_serve_finish(r.eng[0]), FERRY_ERR_INVALID);
  reps_free(&r);
}

#define SIM "sim --model tiny-dense --hw h100-pcie --quiet --synthetic rate=50,n=12,prompt=16,output=6 "

/* Run `ferry ARGS`: its exit status and output (owned). */
static char *ferry_out(const char *args, int want) {
  char *out = NULL;
  const int rc = tu_run_ferry(args, &out);
  if (rc != want) fprintf(stderr, "ferry %s: exit %d (want %d):\n%s\n", args, rc, want, out ? out : "");
  assert_int_equal(rc, want);
  return out;
}

static int64_t db_count(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  sqlite3_stmt *q = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &q, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  const int64_t v = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  sqlite3_close(db);
  return v;
}

static void test_cli_replicas(void **state) {
  (void)state;
  char *plain = ferry_out(SIM, 0), *one = ferry_out(SIM "--replicas 1", 0);
  assert_string_equal(plain, one);
  char args[1024], db[600];
  snprintf(db, sizeof db, "%s/r.db", tmp);
  snprintf(args, sizeof args, SIM "--replicas 2 --router least-tokens --db '%s'", db);
  char *two = ferry_out(args, 0);
  assert_true(tu_contains(two, "replicas: 2, router least-tokens") && tu_contains(two, "replica 1: "));
  assert_true(tu_contains(two, "requests: 12 done"));
  assert_int_equal(db_count(db, "SELECT COUNT(*) FROM runs"), 1);
  assert_int_equal(db_count(db, "SELECT COUNT(*) FROM requests"), 12);
  assert_int_equal(db_count(db, "SELECT COUNT(*) FROM META_DATA_EXPORT WHERE name LIKE 'REPLICA_%'"), 2);
  /* each request's replica, as many as the replica's own line says it served */
  for (int i = 0; i < 2; i++) {
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT CAST(value AS INTEGER) FROM META_DATA_EXPORT WHERE name = 'REPLICA_%d'", i);
    const int64_t said = db_count(db, sql);
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM requests WHERE replica = %d", i);
    assert_int_equal(db_count(db, sql), said);
    assert_true(said > 0);
  }
  assert_int_equal(db_count(db, "SELECT COUNT(*) FROM requests WHERE replica IS NULL"), 0);
  assert_int_equal(db_count(db, "SELECT COUNT(DISTINCT replica) FROM steps"), 2);
  free(plain);
  free(one);
  free(two);
  const struct {
    const char *args, *needle;
    int rc;
  } refused[] = {
      {"run --backend cuda --model x --synthetic n=2 --replicas 2", "drives one device, which replicas would share", 2},
      {SIM "--router least-tokens", "over --replicas R (R > 1)", 2},
      {SIM "--replicas 2 --router random", "--router: expected", 2},
      {SIM "--replicas 2 --faults read:eio@1", "its state belongs to one engine", 1},
  };
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    char *out = ferry_out(refused[i].args, refused[i].rc);
    if (!tu_contains(out, refused[i].needle)) fail_msg("ferry %s: no '%s' in:\n%s", refused[i].args, refused[i].needle, out);
    free(out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_replica_is_engine_run),   cmocka_unit_test(test_round_robin_alternates),
      cmocka_unit_test(test_routes_away_from_long_request), cmocka_unit_test(test_least_tokens_lowers_p99_ttft),
      cmocka_unit_test(test_two_replicas_double_throughput), cmocka_unit_test(test_bad_calls_refused),
      cmocka_unit_test(test_cli_replicas),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
