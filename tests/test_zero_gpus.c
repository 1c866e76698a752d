/* ZeRO-3's partitioned layer fetch (ferry_engine_config::zero_gpus): the run is one of N
 * data-parallel ranks. On the host executor the logits are bit-identical to a run without it
 * (the peers' part is copied from host memory); in the simulator each streamed block's ranges
 * cross the link in ceil(len / N) parts, the rest arrives over the interconnect after them, at
 * its rate, before the block's compute; N = 1 is today's run; bad values are refused by name. A
 * run recorded to a result database keeps the peers' bytes per step. */
#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/activity.h"
#include "ferry/db.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

static char *tmp, *dense_dir;

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("zerogpus");
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  size_t n = strlen(tmp) + 8;
  dense_dir = malloc(n);
  snprintf(dense_dir, n, "%s/dense", tmp);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 7};
  assert_int_equal(ferry_model_generate(m, &go, dense_dir, NULL), FERRY_OK);
  ferry_model_close(m);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  free(dense_dir);
  return 0;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 5, .output_tokens = 4},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 11, .output_tokens = 3},
    {.id = 2, .arrival_ns = 0, .prompt_tokens = 3, .output_tokens = 6},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

static struct ferry_engine_config base_config(void) {
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 8, .max_seq_tokens = 32, .seed = 11,
                                  .block_layers = 1};
  return c;
}

/* ---- host executor: the same logits ---- */

struct logit_log {
  float *data;
  size_t floats, cap;
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens,
                      const float *logits, int64_t vocab) {
  (void)req;
  (void)tok;
  (void)tokens;
  (void)n_tokens;
  struct logit_log *l = user;
  if (l->floats + (size_t)vocab > l->cap) {
    l->cap = (l->cap + (size_t)vocab) * 2;
    l->data = realloc(l->data, l->cap * sizeof(float));
    assert_non_null(l->data);
  }
  memcpy(l->data + l->floats, logits, (size_t)vocab * sizeof(float));
  l->floats += (size_t)vocab;
}

static void host_run(struct ferry_engine_config c, struct logit_log *log, struct ferry_serve_summary *sum) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dense_dir), FERRY_OK);
  uint64_t dev = 0, host = 0;
  assert_int_equal(ferry_engine_min_budgets(m, s, &c, &dev, &host), FERRY_OK);
  c.device_budget_bytes = dev;
  if (c.home_disk) c.host_budget_bytes = host;
  struct ferry_exec_config xc = {.device_budget_bytes = dev, .host_budget_bytes = c.host_budget_bytes,
                                 .compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  c.on_logits = on_logits;
  c.logits_user = log;
  if (ferry_engine_create(&e, m, s, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  struct ferry_run_options ro = {.as_fast_as_possible = 1};
  if (ferry_engine_run(e, requests, N_REQ, &ro) != FERRY_OK) fail_msg("engine_run: %s", ferry_last_error());
  ferry_engine_summary(e, sum);
  assert_int_equal(sum->requests_done, N_REQ);
  assert_true(sum->peak_bytes[FERRY_TIER_DEVICE] <= dev); /* the slot holds the whole (gathered) block */
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

/* Logits bit-identical with and without --zero-gpus, from host memory and from disk, with and
 * without prefetch; the link carries less (the rank's part), the disk the same (whole blocks). */
static void test_host_logits_identical(void **state) {
  (void)state;
  for (int disk = 0; disk <= 1; disk++)
    for (int depth = 0; depth <= 1; depth++) {
      struct ferry_engine_config c = base_config();
      c.home_disk = disk;
      c.prefetch_depth = depth;
      struct logit_log ref = {0};
      struct ferry_serve_summary ref_sum;
      host_run(c, &ref, &ref_sum);
      assert_true(ref.floats > 0);
      for (int32_t n = 2; n <= 3; n++) {
        struct logit_log got = {0};
        struct ferry_serve_summary sum;
        c.zero_gpus = n;
        host_run(c, &got, &sum);
        assert_int_equal(got.floats, ref.floats);
        if (memcmp(got.data, ref.data, ref.floats * sizeof(float)) != 0)
          fail_msg("logits differ with zero_gpus %d (disk %d, depth %d)", n, disk, depth);
        assert_true(sum.bytes_h2d > 0);
        assert_true(sum.bytes_h2d * (uint64_t)n < ref_sum.bytes_h2d + ref_sum.bytes_h2d / 8);
        assert_int_equal(sum.bytes_disk, ref_sum.bytes_disk);
        free(got.data);
      }
      free(ref.data);
    }
}

/* ---- simulator: bytes and times ---- */

/* Round numbers: link 1 B/ns each way, interconnect 4 B/ns, no latencies; 4 GPUs. */
static ferry_hw *profile(int with_interconnect) {
  char path[512], text[2048];
  snprintf(path, sizeof path, "%s/zg%d.json", tmp, with_interconnect);
  snprintf(text, sizeof text,
           "{\"name\": \"zg\", \"kind\": \"gpu\","
           " \"gpu\": {\"name\": \"G\", \"memory_bytes\": 1073741824, \"mem_bw_gbps\": 100,"
           " \"peak_tflops\": {\"fp32\": 1, \"fp16\": 10}, \"launch_overhead_ns\": 100},"
           " \"link\": {\"name\": \"L\", \"h2d_gbps\": 1, \"d2h_gbps\": 1, \"latency_ns\": 0, \"copy_engines\": 1},"
           " \"host\": {\"name\": \"H\", \"dram_gbps\": 10, \"cpu_gflops\": 1, \"memory_bytes\": 1073741824},"
           " \"disk\": {\"name\": \"D\", \"read_gbps\": 2, \"latency_ns\": 0, \"queue_depth\": 4}%s}",
           with_interconnect ? ", \"interconnect\": {\"name\": \"I\", \"gpus\": 4, \"gpu_gbps\": 4, \"latency_ns\": 0,"
                               " \"switched\": 1}"
                             : "");
  tu_write_file(path, text, strlen(text));
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  return hw;
}

struct log {
  struct ferry_activity *a;
  size_t n, cap;
};

static void sink(void *user, const struct ferry_activity *act) {
  struct log *l = user;
  if (act->kind != FERRY_ACT_KERNEL && act->kind != FERRY_ACT_MEMCPY) return;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 1024;
    l->a = realloc(l->a, l->cap * sizeof *l->a);
    assert_non_null(l->a);
  }
  l->a[l->n] = *act;
  l->a[l->n].name = NULL;
  l->n++;
}

struct sim_run {
  ferry_exec *ex;
  ferry_engine *eng;
  ferry_model *model;
  struct log log;
};

static void sim_run_mode(struct sim_run *r, ferry_hw *hw, struct ferry_engine_config c, int mode) {
  memset(r, 0, sizeof *r);
  assert_int_equal(ferry_model_open(&r->model, "tiny-dense"), FERRY_OK);
  uint64_t dev = 0, host = 0;
  assert_int_equal(ferry_engine_min_budgets(r->model, NULL, &c, &dev, &host), FERRY_OK);
  c.device_budget_bytes = dev;
  struct ferry_exec_config xc = {.device_budget_bytes = dev, .lock_host_memory = 1, .sim_mode = mode};
  assert_int_equal(ferry_exec_create_sim(&r->ex, hw, &xc), FERRY_OK);
  ferry_exec_set_sink(r->ex, sink, &r->log);
  if (ferry_engine_create(&r->eng, r->model, NULL, r->ex, &c) != FERRY_OK)
    fail_msg("engine_create: %s", ferry_last_error());
  struct ferry_run_options ro = {.time_scale = 1.0};
  if (ferry_engine_run(r->eng, requests, N_REQ, &ro) != FERRY_OK) fail_msg("engine_run: %s", ferry_last_error());
}

static void sim_run(struct sim_run *r, ferry_hw *hw, struct ferry_engine_config c) {
  sim_run_mode(r, hw, c, FERRY_SIM_EXACT);
}

static void sim_free(struct sim_run *r) {
  ferry_engine_destroy(r->eng);
  ferry_exec_destroy(r->ex);
  ferry_model_close(r->model);
  free(r->log.a);
}

/* tiny-dense's layer in fp32: q, o 128 x 128; k, v 64 x 128; gate, up, down 352 x 128; two
 * norms of 128: 4 x (2 x 16384 + 2 x 8192 + 3 x 45056 + 2 x 128) bytes, one contiguous range. */
#define LAYER_BYTES (4ull * (2 * 16384 + 2 * 8192 + 3 * 45056 + 2 * 128))
#define LAYERS 8

static void check_rank(int disk) {
  ferry_hw *hw = profile(1);
  struct ferry_engine_config c = base_config();
  c.home_disk = disk;
  struct sim_run plain, one, z;
  sim_run(&plain, hw, c);
  c.zero_gpus = 1;
  sim_run(&one, hw, c);
  c.zero_gpus = 3;
  sim_run(&z, hw, c);
  int64_t n0, n1, n3;
  const struct ferry_step_metrics *s0 = ferry_engine_step_metrics(plain.eng, &n0);
  const struct ferry_step_metrics *s1 = ferry_engine_step_metrics(one.eng, &n1);
  const struct ferry_step_metrics *s3 = ferry_engine_step_metrics(z.eng, &n3);
  /* N = 1 is today's run, to the nanosecond */
  assert_int_equal(n1, n0);
  for (int64_t i = 0; i < n0; i++) {
    assert_int_equal(s1[i].end_ns, s0[i].end_ns);
    assert_int_equal(s1[i].bytes_h2d, s0[i].bytes_h2d);
    assert_int_equal(s1[i].bytes_peers, 0);
  }
  /* every step streams the 8 layers: the rank's ceil(1/3) over the link, the rest from peers */
  const uint64_t own = (LAYER_BYTES + 2) / 3, rest = LAYER_BYTES - own;
  assert_int_equal(own, 246102); /* 738304 / 3 = 246101.3 */
  assert_int_equal(n3, n0);
  for (int64_t i = 0; i < n3; i++) {
    assert_int_equal(s0[i].bytes_blocks, LAYERS * LAYER_BYTES);
    assert_int_equal(s3[i].bytes_blocks, LAYERS * own);
    assert_int_equal(s3[i].bytes_peers, LAYERS * rest);
    assert_int_equal(s3[i].bytes_disk, s0[i].bytes_disk); /* whole blocks read: the ranks share the disk */
    assert_true(s3[i].end_ns - s3[i].start_ns < s0[i].end_ns - s0[i].start_ns); /* link-bound: faster */
  }
  struct ferry_sim_stats ss;
  assert_int_equal(ferry_exec_sim_stats(z.ex, &ss), FERRY_OK);
  assert_int_equal(ss.bytes_gather, (uint64_t)n3 * LAYERS * rest);
  struct ferry_serve_summary sum;
  ferry_engine_summary(z.eng, &sum);
  assert_int_equal(sum.bytes_peers, ss.bytes_gather); /* the steps' bytes_peers summed */
  ferry_engine_summary(plain.eng, &sum);
  assert_int_equal(sum.bytes_peers, 0);
  /* each gather: the interconnect's rate (4 B/ns), after the rank's part, before the compute */
  int gathers = 0;
  for (size_t i = 0; i < z.log.n; i++) {
    const struct ferry_activity *g = &z.log.a[i];
    if (g->kind != FERRY_ACT_MEMCPY || g->copy_kind != FERRY_COPY_PTOP) continue;
    gathers++;
    assert_int_equal(g->bytes, rest);
    const int64_t want = (int64_t)(rest + 3) / 4, got = g->end_ns - g->start_ns;
    assert_true(got >= want - 1 && got <= want + 1);
    const struct ferry_activity *mine = NULL, *first = NULL;
    for (size_t j = 0; j < z.log.n; j++) {
      const struct ferry_activity *a = &z.log.a[j];
      if (a->kind == FERRY_ACT_MEMCPY && a->copy_kind == FERRY_COPY_HTOD && a->layer == g->layer &&
          a->step == g->step) {
        assert_null(mine);
        mine = a;
      }
    }
    assert_non_null(mine);
    assert_int_equal(mine->bytes, own);
    assert_int_equal(mine->end_ns - mine->start_ns, (int64_t)own); /* 1 B/ns */
    assert_true(mine->end_ns <= g->start_ns);
    /* the block's compute: the layer's first kernel after its fetch began (kernels carry no step) */
    for (size_t j = 0; j < z.log.n; j++) {
      const struct ferry_activity *a = &z.log.a[j];
      if (a->kind == FERRY_ACT_KERNEL && a->layer == g->layer && a->start_ns >= mine->start_ns &&
          (!first || a->start_ns < first->start_ns))
        first = a;
    }
    assert_non_null(first);
    assert_true(first->start_ns >= g->end_ns);
  }
  assert_int_equal(gathers, n3 * LAYERS);
  /* the fast mode (op graphs replayed) times the all-gather as the exact one does */
  struct sim_run fast;
  sim_run_mode(&fast, hw, c, FERRY_SIM_FAST);
  int64_t nf;
  const struct ferry_step_metrics *sf = ferry_engine_step_metrics(fast.eng, &nf);
  assert_int_equal(nf, n3);
  for (int64_t i = 0; i < nf; i++) {
    assert_int_equal(sf[i].end_ns, s3[i].end_ns);
    assert_int_equal(sf[i].bytes_peers, s3[i].bytes_peers);
  }
  sim_free(&fast);
  sim_free(&plain);
  sim_free(&one);
  sim_free(&z);
  ferry_hw_close(hw);
}

static void test_sim_host_home(void **state) {
  (void)state;
  check_rank(0);
}

static void test_sim_disk_home(void **state) {
  (void)state;
  check_rank(1);
}

/* Bad values name the option. */
static void test_refused(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  ferry_hw *hw = profile(1);
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
  struct ferry_engine_config c = base_config();
  c.zero_gpus = -1;
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "--zero-gpus -1"));
  ferry_exec_destroy(ex);
  ferry_model_close(m);
  assert_int_equal(ferry_model_open(&m, "tiny-moe"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
  c.zero_gpus = 2;
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_ERR_UNSUPPORTED);
  assert_true(tu_contains(ferry_last_error(), "--zero-gpus 2"));
  ferry_exec_destroy(ex);
  ferry_model_close(m);
  ferry_hw_close(hw);
  /* the command line: below 1, more ranks than the machine's GPUs, no interconnect */
  char *out = NULL;
  assert_int_not_equal(tu_run_ferry("sim --model tiny-dense --hw h100-pcie --quiet --synthetic n=2,prompt=4,output=2 "
                                    "--device-budget 8MiB --zero-gpus 0",
                                    &out),
                       0);
  assert_true(tu_contains(out, "--zero-gpus"));
  free(out);
  assert_int_not_equal(tu_run_ferry("sim --model tiny-dense --hw h100-pcie --quiet --synthetic n=2,prompt=4,output=2 "
                                    "--device-budget 8MiB --zero-gpus 2",
                                    &out),
                       0);
  assert_true(tu_contains(out, "--zero-gpus 2: hardware profile h100-pcie has no interconnect section"));
  free(out);
  assert_int_not_equal(tu_run_ferry("sim --model tiny-dense --hw 4xl40s --quiet --synthetic n=2,prompt=4,output=2 "
                                    "--device-budget 8MiB --zero-gpus 5",
                                    &out),
                       0);
  assert_true(tu_contains(out, "--zero-gpus 5: 4xl40s holds 4 GPUs"));
  free(out);
  assert_int_equal(tu_run_ferry("sim --model tiny-dense --hw 4xl40s --quiet --synthetic n=2,prompt=4,output=2 "
                                "--device-budget 8MiB --zero-gpus 4",
                                &out),
                   0);
  free(out);
}

/* A run recorded to a result database keeps what its peers sent: the steps rows' bytes_peers sum
 * to the summary's peers_to_device, every step streamed its blocks, and the readers agree (the
 * run's stats, `db show`'s "from peers" line and its bytes_peers metric); a run without peers
 * shows neither. */
static int64_t sim_to_db(const char *db_path, const char *extra, cJSON **doc, double *peers) {
  char *out = NULL;
  if (tu_run_ferryf(&out, "sim --model tiny-dense --hw 4xl40s --synthetic n=3,prompt=8,output=4 --device-budget 8MiB "
                          "--quiet --format json --db '%s' %s", db_path, extra) != 0)
    fail_msg("ferry sim %s: %s", extra, out);
  *doc = cJSON_Parse(out);
  if (!*doc) fail_msg("ferry sim %s: not JSON: %s", extra, out);
  free(out);
  const cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(*doc, "runs"), 0);
  const cJSON *moved = cJSON_GetObjectItemCaseSensitive(run, "bytes_moved");
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(moved, "peers_to_device");
  *peers = cJSON_IsNumber(p) ? p->valuedouble : -1;
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(run, "run_id");
  assert_true(cJSON_IsNumber(id));
  return (int64_t)id->valuedouble;
}

/* `db show`'s bytes_peers metric in JSON (-1: absent) and whether its text has the peers' line. */
static double shown_peers(const char *db_path, int64_t id, int *text_line) {
  char *out = NULL;
  if (tu_run_ferryf(&out, "db show %lld --db '%s'", (long long)id, db_path) != 0) fail_msg("%s", out);
  *text_line = tu_contains(out, "from peers   ");
  free(out);
  if (tu_run_ferryf(&out, "db show %lld --db '%s' --format json", (long long)id, db_path) != 0) fail_msg("%s", out);
  cJSON *shown = cJSON_Parse(out);
  if (!shown) fail_msg("db show --format json: %s", out);
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(shown, "metrics"), "bytes_peers");
  const double v = cJSON_IsNumber(m) ? m->valuedouble : -1;
  cJSON_Delete(shown);
  free(out);
  return v;
}

static void test_db_steps(void **state) {
  (void)state;
  char db_path[600];
  snprintf(db_path, sizeof db_path, "%s/peers.db", tmp);
  cJSON *doc = NULL;
  double peers = 0;
  const int64_t id = sim_to_db(db_path, "--zero-gpus 4", &doc, &peers);
  const cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "runs"), 0);
  const double steps = cJSON_GetObjectItemCaseSensitive(run, "steps")->valuedouble;
  cJSON_Delete(doc);
  assert_true(peers > 0);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, "SELECT total(bytes_peers), count(*), count(nullif(bytes_peers, 0)) FROM steps "
                             "WHERE runId = ?1", -1, &q, NULL) != SQLITE_OK)
    fail_msg("%s: %s", db_path, sqlite3_errmsg(db));
  sqlite3_bind_int64(q, 1, id);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  const double sum = sqlite3_column_double(q, 0);
  const int64_t rows = sqlite3_column_int64(q, 1), streaming = sqlite3_column_int64(q, 2);
  sqlite3_finalize(q);
  sqlite3_close(db);
  if (sum != peers || rows != (int64_t)steps || streaming != rows)
    fail_msg("the summary had %.0f bytes from peers in %.0f steps; the steps table %.0f bytes in %lld rows (%lld "
             "nonzero)", peers, steps, sum, (long long)rows, (long long)streaming);
  ferry_db *fdb = NULL;
  assert_int_equal(ferry_db_open(&fdb, db_path, FERRY_DB_READ_ONLY), FERRY_OK);
  struct ferry_run_stats stats;
  assert_int_equal(ferry_db_run_stats(fdb, id, &stats), FERRY_OK);
  assert_true((double)stats.bytes_peers == peers);
  ferry_db_close(fdb);
  int line = 0;
  assert_true(shown_peers(db_path, id, &line) == peers);
  assert_true(line);
  /* without peers: no bytes from them, no line, no metric */
  const int64_t plain = sim_to_db(db_path, "", &doc, &peers);
  cJSON_Delete(doc);
  assert_true(peers == -1);
  assert_true(shown_peers(db_path, plain, &line) == -1);
  assert_false(line);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_logits_identical),
      cmocka_unit_test(test_sim_host_home),
      cmocka_unit_test(test_sim_disk_home),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_db_steps),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
