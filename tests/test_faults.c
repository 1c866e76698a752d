/* The I/O layer and fault injection: the fault grammar and its counting, transient read faults
 * (EIO, EAGAIN, short reads, a corrupted byte under verification) survived with retries and
 * bit-identical logits, permanent ones failing with the file, the offset and the attempts, the
 * simulator charging the same faults in virtual time, and `ferry run` leaving a consistent
 * database when a read or the device fails for good (the run failed with its error, what it
 * served and the runs before it intact). */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/fault.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

static char *tmp, *model_dir;

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("faults");
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  size_t n = strlen(tmp) + 16;
  model_dir = malloc(n);
  snprintf(model_dir, n, "%s/dense", tmp);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 3};
  assert_int_equal(ferry_model_generate(m, &go, model_dir, NULL), FERRY_OK);
  ferry_model_close(m);
  /* retries without waiting: the tests are about what is retried, not how long it waits */
  struct ferry_io_policy p = {.max_attempts = 4, .backoff_ns = 1000, .backoff_max_ns = 10000, .jitter = 0.5};
  ferry_io_set_policy(&p);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  ferry_fault_clear();
  ferry_io_set_policy(NULL);
  tu_rmtree(tmp);
  free(tmp);
  free(model_dir);
  return 0;
}

/* ---- the grammar ------------------------------------------------------------------------------ */

static void test_fault_grammar(void **state) {
  (void)state;
  const char *good[] = {"read:eio@3", "short@2", "read:delay:5@0.5", "kernel:fail@10+", "copy:fail@1*3",
                        "eagain@1,eintr@2,seed=9", "read:corrupt@4", "", NULL};
  for (int i = 0; good[i]; i++) {
    if (ferry_fault_set(good[i]) != FERRY_OK) fprintf(stderr, "refused '%s': %s\n", good[i], ferry_last_error());
    assert_int_equal(ferry_fault_set(good[i]), FERRY_OK);
  }
  const struct {
    const char *spec, *says;
  } bad[] = {{"read:eio", "SITE:KIND@WHEN"},  {"read:boom@1", "unknown fault 'boom'"},
             {"read:fail@1", "read faults are"}, {"kernel:eio@1", "kernel faults are fail"},
             {"read:eio@0", "expected @N"},    {"read:eio@1.5", "probability"},
             {"read:delay@1", "milliseconds"}, {"seed=-1", "seed=N"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(ferry_fault_set(bad[i].spec), FERRY_ERR_INVALID);
    if (!tu_contains(ferry_last_error(), bad[i].says)) fprintf(stderr, "'%s': %s\n", bad[i].spec, ferry_last_error());
    assert_true(tu_contains(ferry_last_error(), bad[i].says));
  }
  /* a refused specification leaves the last good one */
  assert_int_equal(ferry_fault_set("read:eio@2"), FERRY_OK);
  assert_int_equal(ferry_fault_set("read:nope@1"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_fault_draw(FERRY_FAULT_READ).kind, FERRY_FAULT_NONE);
  assert_int_equal(ferry_fault_draw(FERRY_FAULT_READ).kind, FERRY_FAULT_EIO);
  ferry_fault_clear();
  assert_false(ferry_fault_active());
}

static void test_fault_counting(void **state) {
  (void)state;
  assert_int_equal(ferry_fault_set("read:eio@3,read:short@5*2,kernel:fail@2+"), FERRY_OK);
  enum ferry_fault_kind want[] = {FERRY_FAULT_NONE, FERRY_FAULT_NONE, FERRY_FAULT_EIO, FERRY_FAULT_NONE,
                                  FERRY_FAULT_SHORT, FERRY_FAULT_SHORT, FERRY_FAULT_NONE};
  for (int i = 0; i < 7; i++) {
    struct ferry_fault f = ferry_fault_draw(FERRY_FAULT_READ);
    assert_int_equal(f.kind, want[i]);
    assert_int_equal(f.attempt, (uint64_t)i + 1);
  }
  /* sites count apart: kernels fail from the second on, for good */
  assert_int_equal(ferry_fault_draw(FERRY_FAULT_KERNEL).kind, FERRY_FAULT_NONE);
  for (int i = 0; i < 5; i++) assert_int_equal(ferry_fault_draw(FERRY_FAULT_KERNEL).kind, FERRY_FAULT_FAIL);
  assert_int_equal(ferry_fault_draw(FERRY_FAULT_COPY).kind, FERRY_FAULT_NONE);
  assert_int_equal(ferry_fault_injected(), 3 + 5);
  /* probabilities: the same seed draws the same attempts, another seed others */
  int hits[2][200];
  for (int run = 0; run < 2; run++) {
    assert_int_equal(ferry_fault_set("read:delay:1@0.25,seed=5"), FERRY_OK);
    for (int i = 0; i < 200; i++) hits[run][i] = ferry_fault_draw(FERRY_FAULT_READ).delay_ns != 0;
  }
  assert_memory_equal(hits[0], hits[1], sizeof hits[0]);
  int n = 0;
  for (int i = 0; i < 200; i++) n += hits[0][i];
  assert_true(n > 25 && n < 80); /* about 50 of 200 */
  assert_int_equal(ferry_fault_set("read:delay:1@0.25,seed=6"), FERRY_OK);
  int same = 1;
  for (int i = 0; i < 200; i++) same &= hits[0][i] == (ferry_fault_draw(FERRY_FAULT_READ).delay_ns != 0);
  assert_false(same);
  /* backoff doubles up to the cap, scaled by jitter in [1 - jitter, 1] */
  struct ferry_io_policy p = {.max_attempts = 5, .backoff_ns = 1000, .backoff_max_ns = 5000, .jitter = 0.5};
  ferry_io_set_policy(&p);
  for (int retry = 1; retry <= 5; retry++) {
    double full = retry == 1 ? 1000 : retry == 2 ? 2000 : retry == 3 ? 4000 : 5000;
    int64_t w = ferry_io_backoff_ns(retry, 77);
    assert_true(w >= (int64_t)(full * 0.5) && w <= (int64_t)full);
    assert_int_equal(w, ferry_io_backoff_ns(retry, 77));
  }
  struct ferry_io_policy fast = {.max_attempts = 4, .backoff_ns = 1000, .backoff_max_ns = 10000, .jitter = 0.5};
  ferry_io_set_policy(&fast);
  ferry_fault_clear();
}

/* ---- reads through the layer ----------------------------------------------------------------- */

static void read_first_tensor(ferry_store *s, void *buf, uint64_t cap, ferry_status want) {
  const struct ferry_store_tensor *t = ferry_store_tensor_at(s, 0);
  assert_true(t->nbytes <= cap);
  ferry_status st = ferry_store_read_tensor(s, t, buf, cap);
  if (st != want) fprintf(stderr, "read: %s\n", ferry_last_error());
  assert_int_equal(st, want);
}

static void test_read_retries(void **state) {
  (void)state;
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  const struct ferry_store_tensor *t = ferry_store_tensor_at(s, 0);
  const uint64_t cap = t->nbytes;
  char *clean = malloc(cap), *got = malloc(cap);
  read_first_tensor(s, clean, cap, FERRY_OK);
  /* transient: EIO then EAGAIN then a short read, on one read: same bytes */
  const char *transient[] = {"read:eio@1", "read:eagain@1*2,read:short@3", "read:eintr@1,read:short@2*3"};
  for (int i = 0; i < 3; i++) {
    ferry_io_stats_reset();
    assert_int_equal(ferry_fault_set(transient[i]), FERRY_OK);
    memset(got, 0, cap);
    read_first_tensor(s, got, cap, FERRY_OK);
    assert_memory_equal(got, clean, cap);
    struct ferry_io_stats io;
    ferry_io_stats_get(&io);
    assert_true(io.retries >= 1 || io.short_reads >= 1);
    if (i == 0) {
      assert_int_equal(io.retries, 1);
      assert_int_equal(io.recovered, 1);
    }
    assert_int_equal(io.failed, 0);
  }
  /* permanent: every attempt fails; the message names the file, the offset and the attempts */
  ferry_io_stats_reset();
  assert_int_equal(ferry_fault_set("read:eio@1+"), FERRY_OK);
  read_first_tensor(s, got, cap, FERRY_ERR_IO);
  char want[512];
  snprintf(want, sizeof want, "%s: read of %llu bytes at offset %llu failed after 4 attempt(s)",
           ferry_store_file_path(s, t->file), (unsigned long long)t->nbytes, (unsigned long long)t->offset);
  if (!tu_contains(ferry_last_error(), want)) fprintf(stderr, "got: %s\nwant: %s\n", ferry_last_error(), want);
  assert_true(tu_contains(ferry_last_error(), want));
  struct ferry_io_stats io;
  ferry_io_stats_get(&io);
  assert_int_equal(io.failed, 1);
  assert_int_equal(io.attempts, 4);
  /* O_DIRECT reads go through the same layer */
  ferry_fault_clear();
  if (ferry_store_direct_supported(s)) {
    uint64_t span = ferry_store_direct_span(t->offset, t->nbytes), shift = 0;
    char *aligned = NULL;
    assert_int_equal(posix_memalign((void **)&aligned, FERRY_DIRECT_ALIGN, span), 0);
    assert_int_equal(ferry_fault_set("read:eio@1"), FERRY_OK);
    assert_int_equal(ferry_store_read_range(s, t->file, t->offset, t->nbytes, aligned, span, FERRY_READ_DIRECT, &shift), FERRY_OK);
    assert_memory_equal(aligned + shift, clean, cap);
    assert_int_equal(ferry_fault_set("read:eio@1+"), FERRY_OK);
    assert_int_equal(ferry_store_read_range(s, t->file, t->offset, t->nbytes, aligned, span, FERRY_READ_DIRECT, &shift),
                     FERRY_ERR_IO);
    assert_true(tu_contains(ferry_last_error(), "after 4 attempt(s)"));
    free(aligned);
  }
  ferry_fault_clear();
  ferry_store_close(s);
  free(clean);
  free(got);
}

/* A file cut short under an open store: the size is verified, the end of file retried, then
 * reported with what the file holds now. */
static void test_truncated_under_the_reader(void **state) {
  (void)state;
  char dir[600], path[700], cmd[1400];
  snprintf(dir, sizeof dir, "%s/cut", tmp);
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", model_dir, dir);
  assert_int_equal(system(cmd), 0);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  snprintf(path, sizeof path, "%s", ferry_store_file_path(s, 0));
  const struct ferry_store_tensor *last = ferry_store_tensor_at(s, ferry_store_tensor_count(s) - 1);
  assert_int_equal(truncate(path, (off_t)last->offset + 16), 0);
  char *buf = malloc(last->nbytes);
  assert_int_equal(ferry_store_read_tensor(s, last, buf, last->nbytes), FERRY_ERR_IO);
  assert_true(tu_contains(ferry_last_error(), "unexpected end of file"));
  assert_true(tu_contains(ferry_last_error(), "after 4 attempt(s)"));
  char now[64];
  snprintf(now, sizeof now, "the file is now %llu bytes", (unsigned long long)last->offset + 16);
  assert_true(tu_contains(ferry_last_error(), now));
  free(buf);
  ferry_store_close(s);
}

/* Verified reads: a corrupted byte is seen against the first read and read again; corrupted
 * every time, the read fails naming both checksums. */
static void test_verified_reads(void **state) {
  (void)state;
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  ferry_store_set_verify(s, 1);
  const struct ferry_store_tensor *t = ferry_store_tensor_at(s, 0);
  char *clean = malloc(t->nbytes), *got = malloc(t->nbytes);
  read_first_tensor(s, clean, t->nbytes, FERRY_OK); /* records the checksum */
  ferry_io_stats_reset();
  assert_int_equal(ferry_fault_set("read:corrupt@1"), FERRY_OK);
  read_first_tensor(s, got, t->nbytes, FERRY_OK);
  assert_memory_equal(got, clean, t->nbytes);
  struct ferry_io_stats io;
  ferry_io_stats_get(&io);
  assert_int_equal(io.checksum_mismatches, 1);
  assert_int_equal(ferry_fault_set("read:corrupt@1+"), FERRY_OK);
  read_first_tensor(s, got, t->nbytes, FERRY_ERR_IO);
  assert_true(tu_contains(ferry_last_error(), "not the"));
  assert_true(tu_contains(ferry_last_error(), "of their first read, after 4 attempt(s)"));
  /* without verification the corruption goes through: that is what verification is for */
  ferry_store_set_verify(s, 0);
  assert_int_equal(ferry_fault_set("read:corrupt@1"), FERRY_OK);
  read_first_tensor(s, got, t->nbytes, FERRY_OK);
  assert_memory_not_equal(got, clean, t->nbytes);
  ferry_fault_clear();
  free(clean);
  free(got);
  ferry_store_close(s);
}

/* ---- the engine ------------------------------------------------------------------------------- */

struct logits {
  float *v;
  size_t n, cap;
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                      int64_t vocab) {
  (void)req;
  (void)tok;
  (void)tokens;
  (void)n_tokens;
  struct logits *g = user;
  if (g->n + (size_t)vocab > g->cap) {
    g->cap = (g->n + (size_t)vocab) * 2;
    g->v = realloc(g->v, g->cap * sizeof *g->v);
    assert_non_null(g->v);
  }
  memcpy(g->v + g->n, l, (size_t)vocab * sizeof *l);
  g->n += (size_t)vocab;
}

static const struct ferry_engine_request reqs[] = {
    {.id = 1, .prompt_tokens = 6, .output_tokens = 4}, {.id = 2, .prompt_tokens = 3, .output_tokens = 5},
    {.id = 3, .prompt_tokens = 9, .output_tokens = 3}};

/* Serve reqs with every streamed block read from disk each step. */
static ferry_status serve(struct logits *out, struct ferry_serve_summary *sum, unsigned read_flags) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  struct ferry_engine_config c = {.block_layers = 2, .prefetch_depth = 1, .home_disk = 1, .max_batch = 3,
                                  .max_step_tokens = 16, .max_seq_tokens = 16, .seed = 5, .read_flags = read_flags,
                                  .on_logits = on_logits, .logits_user = out};
  uint64_t dev = 0, host = 0;
  assert_int_equal(ferry_engine_min_budgets(m, s, &c, &dev, &host), FERRY_OK);
  c.device_budget_bytes = dev;
  struct ferry_exec_config xc = {.device_budget_bytes = dev, .compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  ferry_status st = ferry_engine_create(&e, m, s, ex, &c);
  if (st == FERRY_OK) {
    struct ferry_run_options ro = {.as_fast_as_possible = 1};
    st = ferry_engine_run(e, reqs, 3, &ro);
    ferry_engine_summary(e, sum);
  }
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
  return st;
}

static void test_engine_survives_transient_faults(void **state) {
  (void)state;
  struct logits clean = {0};
  struct ferry_serve_summary sum;
  ferry_fault_clear();
  assert_int_equal(serve(&clean, &sum, FERRY_READ_DROP_CACHE), FERRY_OK);
  assert_true(sum.bytes_disk > 0);
  assert_int_equal(sum.requests_done, 3);
  /* every third read fails once, some are short, some slow; buffered and O_DIRECT */
  const unsigned flags[] = {FERRY_READ_DROP_CACHE, FERRY_READ_DIRECT};
  for (int i = 0; i < 2; i++) {
    struct logits got = {0};
    ferry_io_stats_reset();
    assert_int_equal(ferry_fault_set("read:eio@5,read:eio@17*2,read:eagain@40,read:short@9,read:short@33,"
                                     "read:delay:1@25"),
                     FERRY_OK);
    ferry_status st = serve(&got, &sum, flags[i]);
    if (st != FERRY_OK) fprintf(stderr, "%s\n", ferry_last_error());
    assert_int_equal(st, FERRY_OK);
    struct ferry_io_stats io;
    ferry_io_stats_get(&io);
    assert_true(io.recovered > 0);
    assert_int_equal(io.failed, 0);
    assert_int_equal(sum.requests_done, 3);
    assert_int_equal(got.n, clean.n);
    assert_memory_equal(got.v, clean.v, clean.n * sizeof(float));
    free(got.v);
  }
  ferry_fault_clear();
  free(clean.v);
}

static void test_engine_permanent_fault_fails_cleanly(void **state) {
  (void)state;
  struct logits got = {0};
  struct ferry_serve_summary sum;
  /* let the weights load, then every read fails: the run stops with the file and attempts */
  assert_int_equal(ferry_fault_set("read:eio@40+"), FERRY_OK);
  ferry_status st = serve(&got, &sum, FERRY_READ_DROP_CACHE);
  assert_int_equal(st, FERRY_ERR_IO);
  assert_true(tu_contains(ferry_last_error(), ".safetensors: read of"));
  assert_true(tu_contains(ferry_last_error(), "failed after 4 attempt(s)"));
  /* the device failing mid-run stops it the same way */
  assert_int_equal(ferry_fault_set("kernel:fail@150"), FERRY_OK);
  st = serve(&got, &sum, FERRY_READ_DROP_CACHE);
  assert_int_equal(st, FERRY_ERR_DEVICE);
  assert_true(tu_contains(ferry_last_error(), "device failed (injected fault kernel:fail at attempt 150)"));
  ferry_fault_clear();
  free(got.v);
}

/* ---- the simulator --------------------------------------------------------------------------- */

static ferry_status sim_serve(const char *faults, struct ferry_serve_summary *sum) {
  ferry_model *m = NULL;
  ferry_hw *hw = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  /* reads drop their pages (as ferry sim by default): each one comes from the disk model */
  struct ferry_engine_config c = {.block_layers = 1, .prefetch_depth = 1, .home_disk = 1, .max_batch = 3,
                                  .max_step_tokens = 16, .max_seq_tokens = 16, .seed = 5,
                                  .read_flags = FERRY_READ_DROP_CACHE};
  uint64_t dev = 0, host = 0;
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &c, &dev, &host), FERRY_OK);
  c.device_budget_bytes = dev;
  struct ferry_exec_config xc = {.device_budget_bytes = dev};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  assert_int_equal(ferry_fault_set(faults), FERRY_OK);
  ferry_status st = ferry_engine_create(&e, m, NULL, ex, &c);
  if (st == FERRY_OK) {
    struct ferry_run_options ro = {.as_fast_as_possible = 1};
    st = ferry_engine_run(e, reqs, 3, &ro);
    ferry_engine_summary(e, sum);
  }
  ferry_fault_clear();
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  ferry_model_close(m);
  return st;
}

/* The simulator charges the faults the host executor survives: retries after the same
 * backoff, short reads as a second request, latency spikes; identical runs, identical times. */
static void test_sim_disk_faults(void **state) {
  (void)state;
  struct ferry_serve_summary base, faulty, again, spiky;
  ferry_status st0 = sim_serve(NULL, &base);
  if (st0 != FERRY_OK) fprintf(stderr, "%s\n", ferry_last_error());
  assert_int_equal(st0, FERRY_OK);
  ferry_io_stats_reset();
  assert_int_equal(sim_serve("read:eio@0.05,read:short@0.05,seed=3", &faulty), FERRY_OK);
  struct ferry_io_stats io;
  ferry_io_stats_get(&io);
  assert_true(io.retries > 0 && io.short_reads > 0 && io.recovered > 0);
  assert_int_equal(io.failed, 0);
  assert_int_equal(faulty.requests_done, 3);
  assert_true(faulty.duration_ns > base.duration_ns);
  assert_int_equal(sim_serve("read:eio@0.05,read:short@0.05,seed=3", &again), FERRY_OK);
  assert_int_equal(again.duration_ns, faulty.duration_ns);
  assert_true(again.e2e.p99 == faulty.e2e.p99);
  /* 50 ms spikes on a tenth of the reads show in the tail */
  assert_int_equal(sim_serve("read:delay:50@0.1,seed=2", &spiky), FERRY_OK);
  assert_true(spiky.e2e.p99 > base.e2e.p99 + 40e6);
  /* a read that never succeeds fails the simulated run the same way */
  assert_int_equal(sim_serve("read:eio@20+", &faulty), FERRY_ERR_IO);
  assert_true(tu_contains(ferry_last_error(), "failed after 4 attempt(s)"));
  assert_int_equal(sim_serve("copy:fail@30", &faulty), FERRY_ERR_DEVICE);
}

/* ---- the command and its database ------------------------------------------------------------ */

static int64_t query_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_finalize(st);
  return v;
}

static char *query_text(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  char *v = NULL;
  if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0)) v = strdup((const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  return v;
}

static void test_cli_database_after_failures(void **state) {
  (void)state;
  char db[600], args[2048], *out = NULL;
  snprintf(db, sizeof db, "%s/study.db", tmp);
  /* every request at the start: the same steps, reads and kernels in every run */
  const char *common = "--synthetic rate=100,n=5,prompt=6,output=4 --as-fast-as-possible --block-layers 2 --home disk "
                       "--device-budget 6MiB "
                       "--io-retries 2 --quiet";
  /* 1: clean; 2: transient faults survived; 3: a read failing for good; 4: the device lost */
  snprintf(args, sizeof args, "run --model '%s' %s --db '%s'", model_dir, common, db);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "run --model '%s' %s --db '%s' --faults read:eio@2,read:short@4", model_dir, common, db);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  /* fail the reads for good near the end of serving: the clean run says how many there are */
  sqlite3 *s = NULL;
  assert_int_equal(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  const int64_t attempts = query_int(s, "SELECT value FROM META_DATA_EXPORT WHERE runId = 1 AND name = 'IO_ATTEMPTS'");
  sqlite3_close(s);
  assert_true(attempts > 20);
  snprintf(args, sizeof args, "run --model '%s' %s --db '%s' --faults 'read:eio@%lld+'", model_dir, common, db,
           (long long)attempts - 8);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "failed after 3 attempt(s): Input/output error"));
  free(out);
  snprintf(args, sizeof args, "run --model '%s' %s --db '%s'", model_dir, common, db);
  setenv("FERRY_FAULT", "kernel:fail@200", 1);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  unsetenv("FERRY_FAULT");
  assert_true(tu_contains(out, "device failed"));
  free(out);
  assert_int_equal(sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  assert_int_equal(query_int(s, "SELECT count(*) FROM runs"), 4);
  assert_int_equal(query_int(s, "SELECT count(*) FROM runs WHERE complete = 1 AND error IS NULL"), 2);
  /* the clean and the faulty run served the same requests */
  assert_int_equal(query_int(s, "SELECT count(*) FROM requests WHERE runId = 1 AND finish_ns IS NOT NULL"), 5);
  assert_int_equal(query_int(s, "SELECT count(*) FROM requests WHERE runId = 2 AND finish_ns IS NOT NULL"), 5);
  assert_int_equal(query_int(s, "SELECT count(*) FROM engine_events WHERE runId = 2 AND kind = 'io' AND action = 'read retried'"), 1);
  assert_int_equal(query_int(s, "SELECT value FROM META_DATA_EXPORT WHERE runId = 2 AND name = 'IO_RECOVERED'"), 1);
  assert_int_equal(query_int(s, "SELECT value FROM META_DATA_EXPORT WHERE runId = 2 AND name = 'IO_SHORT_READS'"), 1);
  /* the failed runs: marked failed with their errors, what they did kept */
  char *err = query_text(s, "SELECT error FROM runs WHERE id = 3");
  assert_non_null(err);
  assert_true(tu_contains(err, ".safetensors: read of"));
  assert_true(tu_contains(err, "at offset"));
  assert_true(tu_contains(err, "failed after 3 attempt(s)"));
  free(err);
  assert_int_equal(query_int(s, "SELECT complete FROM runs WHERE id = 3"), 0);
  assert_int_equal(query_int(s, "SELECT count(*) FROM engine_events WHERE runId = 3 AND action = 'read failed'") >= 1, 1);
  assert_int_equal(query_int(s, "SELECT count(*) FROM requests WHERE runId = 3"), 5);
  assert_true(query_int(s, "SELECT count(*) FROM steps WHERE runId = 3") > 0);
  err = query_text(s, "SELECT error FROM runs WHERE id = 4");
  assert_non_null(err);
  assert_true(tu_contains(err, "device failed (injected fault kernel:fail at attempt 200)"));
  free(err);
  assert_int_equal(query_int(s, "SELECT count(*) FROM engine_events WHERE runId = 4 AND kind = 'device'"), 1);
  assert_true(query_int(s, "SELECT count(*) FROM steps WHERE runId = 4") > 0);
  char *ok = query_text(s, "PRAGMA integrity_check");
  assert_string_equal(ok, "ok");
  free(ok);
  sqlite3_close(s);
  /* the database still takes runs and reads back */
  snprintf(args, sizeof args, "db list --db '%s'", db);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "device failed"));
  free(out);
  snprintf(args, sizeof args, "run --model '%s' %s --db '%s'", model_dir, common, db);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_grammar),
      cmocka_unit_test(test_fault_counting),
      cmocka_unit_test(test_read_retries),
      cmocka_unit_test(test_truncated_under_the_reader),
      cmocka_unit_test(test_verified_reads),
      cmocka_unit_test(test_engine_survives_transient_faults),
      cmocka_unit_test(test_engine_permanent_fault_fails_cleanly),
      cmocka_unit_test(test_sim_disk_faults),
      cmocka_unit_test(test_cli_database_after_failures),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
