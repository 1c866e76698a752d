/* Hot reload of weights: manifests (SHA-256 per file) and the architecture check refuse what
 * must not be served; a reload in the middle of a trace loses and fails no request, the
 * requests admitted before it run on the old weights and those after it on the new ones (new
 * weights, or another quantization), each with the logits of a fresh run of its version; a
 * refused version leaves the old one serving; the simulator swaps in virtual time; `ferry run`
 * reloads over its control socket (`ferry ctl`) and on SIGHUP, and records it all. */
#include <errno.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/quantize.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

static char *tmp;
static char dir_a[600], dir_b[600], dir_q[600], dir_moe[600];

static void gen(const char *preset, uint64_t seed, const char *out) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, preset), FERRY_OK);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = seed};
  assert_int_equal(ferry_model_generate(m, &go, out, NULL), FERRY_OK);
  ferry_model_close(m);
}

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("reload");
  snprintf(dir_a, sizeof dir_a, "%s/a", tmp);
  snprintf(dir_b, sizeof dir_b, "%s/b", tmp);
  snprintf(dir_q, sizeof dir_q, "%s/q", tmp);
  snprintf(dir_moe, sizeof dir_moe, "%s/moe", tmp);
  gen("tiny-dense", 1, dir_a);
  gen("tiny-dense", 2, dir_b); /* same architecture, other weights */
  gen("tiny-moe", 1, dir_moe); /* another architecture */
  struct ferry_qplan plan;
  assert_int_equal(ferry_quant_plan_parse("int8", &plan), FERRY_OK);
  assert_int_equal(ferry_model_quantize(dir_b, dir_q, &plan, NULL, NULL), FERRY_OK); /* another quantization */
  const char *dirs[] = {dir_a, dir_b, dir_q, dir_moe};
  for (int i = 0; i < 4; i++) assert_int_equal(ferry_manifest_write(dirs[i]), FERRY_OK);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

static void copy_dir(const char *from, const char *to) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
  assert_int_equal(system(cmd), 0);
}

/* Flip one byte of a file at an offset. */
static void flip(const char *path, long off) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  int c = fgetc(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  fputc(c ^ 0x40, f);
  fclose(f);
}

static void test_manifest(void **state) {
  (void)state;
  size_t n = 0;
  assert_int_equal(ferry_manifest_verify(dir_a, &n), FERRY_OK);
  assert_int_equal(n, 2); /* config.json and model.safetensors */
  char bad[600], path[700];
  snprintf(bad, sizeof bad, "%s/bad", tmp);
  copy_dir(dir_a, bad);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, bad), FERRY_OK);
  snprintf(path, sizeof path, "%s", ferry_store_file_path(s, 0));
  const struct ferry_store_tensor *t = ferry_store_tensor_at(s, 3);
  long off = (long)t->offset + 5;
  ferry_store_close(s);
  flip(path, off); /* a byte of a weight: still a valid file, not the one listed */
  assert_int_equal(ferry_manifest_verify(bad, NULL), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), path));
  assert_true(tu_contains(ferry_last_error(), "does not match the manifest's"));
  /* a file the manifest does not list; no manifest at all; a malformed line */
  copy_dir(dir_a, bad);
  snprintf(path, sizeof path, "%s/extra.safetensors", bad);
  tu_write_file(path, "x", 1);
  assert_int_equal(ferry_manifest_verify(bad, NULL), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "extra.safetensors is not in the manifest"));
  unlink(path);
  snprintf(path, sizeof path, "%s/%s", bad, FERRY_MANIFEST_NAME);
  tu_write_file(path, "abc  config.json\n", 17);
  assert_int_equal(ferry_manifest_verify(bad, NULL), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), ":1: expected '<64 lowercase hex digits>  <file name>'"));
  unlink(path);
  assert_int_equal(ferry_manifest_verify(bad, NULL), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "no manifest"));
  /* sha256sum reads what ferry writes */
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "cd '%s' && sha256sum --quiet -c %s >/dev/null 2>&1 || ! command -v sha256sum >/dev/null",
           dir_a, FERRY_MANIFEST_NAME);
  assert_int_equal(system(cmd), 0);
}

static void test_architecture(void **state) {
  (void)state;
  ferry_model *a = NULL, *b = NULL, *q = NULL, *moe = NULL;
  assert_int_equal(ferry_model_open(&a, dir_a), FERRY_OK);
  assert_int_equal(ferry_model_open(&b, dir_b), FERRY_OK);
  assert_int_equal(ferry_model_open(&q, dir_q), FERRY_OK);
  assert_int_equal(ferry_model_open(&moe, dir_moe), FERRY_OK);
  assert_int_equal(ferry_model_same_architecture(a, b), FERRY_OK);
  assert_int_equal(ferry_model_same_architecture(a, q), FERRY_OK);
  assert_int_equal(ferry_model_same_architecture(a, moe), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "not the same architecture"));
  ferry_model_close(a);
  ferry_model_close(b);
  ferry_model_close(q);
  ferry_model_close(moe);
}

/* ---- the engine ------------------------------------------------------------------------------ */

#define MAX_TOK 16
struct rec {
  float *rows[8][MAX_TOK]; /* [request id][token] */
  int64_t vocab;
  int ticks, stage_at;
  const char *stage_dir;   /* the version to stage at tick stage_at */
  ferry_status staged;     /* what staging returned */
  char staged_msg[1024];
  int64_t stage_ns;        /* sim: stage at this virtual time instead */
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                      int64_t vocab) {
  (void)tokens;
  (void)n_tokens;
  struct rec *r = user;
  assert_true(req >= 0 && req < 8 && tok >= 0 && tok < MAX_TOK);
  assert_null(r->rows[req][tok]);
  r->rows[req][tok] = malloc((size_t)vocab * sizeof(float));
  memcpy(r->rows[req][tok], l, (size_t)vocab * sizeof(float));
  r->vocab = vocab;
}

static void rec_free(struct rec *r) {
  for (int i = 0; i < 8; i++)
    for (int t = 0; t < MAX_TOK; t++) free(r->rows[i][t]);
}

static void stage(struct rec *r, ferry_engine *e) {
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, r->stage_dir), FERRY_OK);
  r->staged = ferry_engine_reload(e, s, r->stage_dir);
  snprintf(r->staged_msg, sizeof r->staged_msg, "%s", ferry_last_error());
  if (r->staged != FERRY_OK) ferry_store_close(s); /* refused: still ours */
}

static void tick(void *user, ferry_engine *e, int64_t now_ns) {
  struct rec *r = user;
  r->ticks++;
  if (r->stage_dir && ((r->stage_ns && now_ns >= r->stage_ns) || (!r->stage_ns && r->ticks == r->stage_at))) {
    stage(r, e);
    r->stage_dir = NULL;
  }
}

static const struct ferry_engine_request all_reqs[] = {
    {.id = 1, .prompt_tokens = 6, .output_tokens = 6}, {.id = 2, .prompt_tokens = 9, .output_tokens = 4},
    {.id = 3, .prompt_tokens = 5, .output_tokens = 5}, {.id = 4, .prompt_tokens = 7, .output_tokens = 3},
    {.id = 5, .prompt_tokens = 4, .output_tokens = 6}, {.id = 6, .prompt_tokens = 8, .output_tokens = 4}};

struct outcome {
  ferry_status st;
  struct ferry_serve_summary sum;
  int32_t version;
  struct ferry_engine_event ev[32];
  int64_t n_ev;
};

/* Serve requests [first, first + n) of all_reqs on the weights of dir (host executor, streamed
 * blocks: the reload moves real weights). */
static void serve(const char *dir, int first, int n, struct rec *r, struct outcome *o) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  struct ferry_engine_config c = {.block_layers = 2, .prefetch_depth = 1, .max_batch = 2, .max_step_tokens = 16,
                                  .max_seq_tokens = 16, .seed = 4, .on_logits = on_logits, .logits_user = r};
  c.device_budget_bytes = 8u << 20;
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes, .compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  memset(o, 0, sizeof *o);
  o->st = ferry_engine_create(&e, m, s, ex, &c);
  if (o->st == FERRY_OK) {
    struct ferry_run_options ro = {.as_fast_as_possible = 1, .on_tick = tick, .tick_user = r};
    o->st = ferry_engine_run(e, all_reqs + first, n, &ro);
    if (o->st != FERRY_OK) fprintf(stderr, "run: %s\n", ferry_last_error());
    ferry_engine_summary(e, &o->sum);
    o->version = ferry_engine_weights_version(e);
    const struct ferry_engine_event *ev = ferry_engine_events(e, &o->n_ev);
    if (o->n_ev > 32) o->n_ev = 32;
    if (o->n_ev) memcpy(o->ev, ev, (size_t)o->n_ev * sizeof *ev);
  }
  ferry_engine_destroy(e); /* closes the staged store it owns */
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

static void assert_same_rows(const struct rec *got, const struct rec *want, int req) {
  int n = 0;
  for (int t = 0; t < MAX_TOK; t++) {
    assert_true((got->rows[req][t] == NULL) == (want->rows[req][t] == NULL));
    if (!want->rows[req][t]) continue;
    if (memcmp(got->rows[req][t], want->rows[req][t], (size_t)want->vocab * sizeof(float)))
      fprintf(stderr, "request %d token %d: logits differ from a fresh run of its version\n", req, t);
    assert_memory_equal(got->rows[req][t], want->rows[req][t], (size_t)want->vocab * sizeof(float));
    n++;
  }
  assert_true(n > 0);
}

static void print_events(const struct outcome *o) {
  for (int64_t i = 0; i < o->n_ev; i++) fprintf(stderr, "  %s: %s\n", o->ev[i].action, o->ev[i].detail);
}

/* Reload at the second step boundary: requests 1 and 2 (running) finish on the old weights,
 * 3 to 6 wait (none refused) and run on the new ones. */
static void check_reload_to(const char *new_dir) {
  struct rec mid = {.stage_at = 2, .stage_dir = new_dir}, fresh_old = {0}, fresh_new = {0};
  struct outcome o, o_old, o_new;
  serve(dir_a, 0, 6, &mid, &o);
  if (o.st != FERRY_OK || mid.staged != FERRY_OK) print_events(&o);
  assert_int_equal(mid.staged, FERRY_OK);
  assert_int_equal(o.st, FERRY_OK);
  assert_int_equal(o.sum.requests_done, 6);
  assert_int_equal(o.sum.requests_refused + o.sum.requests_rejected, 0);
  assert_int_equal(o.sum.reloads, 1);
  assert_int_equal(o.version, 2);
  serve(dir_a, 0, 2, &fresh_old, &o_old);
  serve(new_dir, 2, 4, &fresh_new, &o_new);
  assert_int_equal(o_old.st, FERRY_OK);
  assert_int_equal(o_new.st, FERRY_OK);
  for (int r = 1; r <= 2; r++) assert_same_rows(&mid, &fresh_old, r);
  for (int r = 3; r <= 6; r++) assert_same_rows(&mid, &fresh_new, r);
  /* and the new weights really differ from the old */
  struct rec all_old = {0};
  struct outcome o_all;
  serve(dir_a, 0, 6, &all_old, &o_all);
  assert_memory_not_equal(all_old.rows[3][0], mid.rows[3][0], (size_t)mid.vocab * sizeof(float));
  int staged = 0, applied = 0;
  for (int64_t i = 0; i < o.n_ev; i++) {
    staged += !strcmp(o.ev[i].action, "reload staged");
    applied += !strcmp(o.ev[i].action, "reload applied");
  }
  assert_int_equal(staged, 1);
  assert_int_equal(applied, 1);
  rec_free(&mid);
  rec_free(&fresh_old);
  rec_free(&fresh_new);
  rec_free(&all_old);
}

static void test_reload_new_weights(void **state) {
  (void)state;
  check_reload_to(dir_b);
}

static void test_reload_new_quantization(void **state) {
  (void)state;
  check_reload_to(dir_q);
}

/* What fails the engine's checks is refused with the reason; the old weights keep serving. */
static void test_reload_refused(void **state) {
  (void)state;
  char nan_dir[600];
  snprintf(nan_dir, sizeof nan_dir, "%s/nan", tmp);
  copy_dir(dir_b, nan_dir);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, nan_dir), FERRY_OK);
  const struct ferry_store_tensor *t = ferry_store_find(s, "model.layers.3.mlp.up_proj.weight");
  assert_non_null(t);
  char path[700];
  snprintf(path, sizeof path, "%s", ferry_store_file_path(s, t->file));
  const long off = (long)t->offset + 64;
  ferry_store_close(s);
  const float nan_v = __builtin_nanf("");
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  fwrite(&nan_v, sizeof nan_v, 1, f);
  fclose(f);
  const struct {
    const char *dir, *says;
  } cases[] = {{dir_moe, "new weights refused"}, {nan_dir, "model.layers.3.mlp.up_proj.weight"}};
  struct rec base = {0};
  struct outcome o_base;
  serve(dir_a, 0, 6, &base, &o_base);
  for (int i = 0; i < 2; i++) {
    struct rec r = {.stage_at = 2, .stage_dir = cases[i].dir};
    struct outcome o;
    serve(dir_a, 0, 6, &r, &o);
    assert_int_not_equal(r.staged, FERRY_OK);
    if (!tu_contains(r.staged_msg, cases[i].says)) fprintf(stderr, "%s\n", r.staged_msg);
    assert_true(tu_contains(r.staged_msg, cases[i].says));
    assert_int_equal(o.st, FERRY_OK);
    assert_int_equal(o.sum.requests_done, 6);
    assert_int_equal(o.sum.reloads, 0);
    assert_int_equal(o.version, 1);
    for (int q = 1; q <= 6; q++) assert_same_rows(&r, &base, q);
    int refused = 0;
    for (int64_t k = 0; k < o.n_ev; k++) refused += !strcmp(o.ev[k].action, "reload refused");
    assert_int_equal(refused, 1);
    rec_free(&r);
  }
  rec_free(&base);
}

/* ---- the simulator --------------------------------------------------------------------------------- */

static void sim_serve(int64_t stage_ns, struct outcome *o, uint64_t *h2d_late) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_hw *hw = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, dir_a), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dir_a), FERRY_OK); /* sizes only: nothing is read */
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  struct ferry_engine_config c = {.block_layers = 1, .prefetch_depth = 1, .max_batch = 2, .max_step_tokens = 16,
                                  .max_seq_tokens = 16, .seed = 4, .device_budget_bytes = 6u << 20};
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  struct ferry_engine_request rq[10];
  for (int i = 0; i < 10; i++)
    rq[i] = (struct ferry_engine_request){.id = i, .arrival_ns = i * 2000000LL, .prompt_tokens = 6, .output_tokens = 4};
  struct rec r = {.stage_dir = stage_ns ? dir_q : NULL, .stage_ns = stage_ns};
  assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_OK);
  struct ferry_run_options ro = {.on_tick = tick, .tick_user = &r};
  memset(o, 0, sizeof *o);
  o->st = ferry_engine_run(e, rq, 10, &ro);
  ferry_engine_summary(e, &o->sum);
  o->version = ferry_engine_weights_version(e);
  const struct ferry_engine_event *ev = ferry_engine_events(e, &o->n_ev);
  if (o->n_ev > 32) o->n_ev = 32;
  if (o->n_ev) memcpy(o->ev, ev, (size_t)o->n_ev * sizeof *ev);
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  *h2d_late = sm[n - 1].bytes_h2d;
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  ferry_store_close(s);
  ferry_model_close(m);
}

static void test_sim_reload(void **state) {
  (void)state;
  struct outcome base, a, b;
  uint64_t h_base, h_a, h_b;
  sim_serve(0, &base, &h_base);
  assert_int_equal(base.st, FERRY_OK);
  sim_serve(7000000, &a, &h_a);
  assert_int_equal(a.st, FERRY_OK);
  assert_int_equal(a.sum.requests_done, 10);
  assert_int_equal(a.sum.reloads, 1);
  assert_int_equal(a.version, 2);
  /* after the swap to int8 each step streams about a quarter of the bytes */
  assert_true(h_a * 3 < h_base);
  sim_serve(7000000, &b, &h_b);
  assert_int_equal(b.n_ev, a.n_ev);
  for (int64_t i = 0; i < a.n_ev; i++) assert_int_equal(a.ev[i].t_ns, b.ev[i].t_ns);
  assert_true(a.sum.e2e.p99 == b.sum.e2e.p99);
}

/* ---- the command ---------------------------------------------------------------------------------- */

static int64_t query_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_finalize(st);
  return v;
}

/* Start `ferry run ARGS` in the background (output to log); returns its pid. */
static pid_t spawn_run(const char *args, const char *log) {
  const char *bin = getenv("FERRY_BIN");
  if (!bin) bin = "build/ferry";
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "exec %s %s >'%s' 2>&1", bin, args, log);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static void wait_for(const char *path) {
  struct stat sb;
  for (int i = 0; i < 600 && stat(path, &sb) != 0; i++) {
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(stat(path, &sb), 0);
}

static void test_cli_control_socket_and_sighup(void **state) {
  (void)state;
  char db[600], sock[600], log[600], args[4096], bad[600], *out = NULL;
  snprintf(db, sizeof db, "%s/r.db", tmp);
  snprintf(sock, sizeof sock, "%s/ctl.sock", tmp);
  snprintf(log, sizeof log, "%s/run.log", tmp);
  snprintf(bad, sizeof bad, "%s/corrupt", tmp);
  copy_dir(dir_b, bad);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, bad), FERRY_OK);
  char shard[700];
  snprintf(shard, sizeof shard, "%s", ferry_store_file_path(s, 0));
  const long off = (long)ferry_store_tensor_at(s, 2)->offset + 3;
  ferry_store_close(s);
  flip(shard, off);
  /* about eight seconds of arrivals (time for the commands below on a loaded machine); SIGHUP
   * reloads the quantized folder */
  snprintf(args, sizeof args,
           "run --model '%s' --synthetic rate=5,n=40,prompt=6,output=3 --device-budget 8MiB --block-layers 2 "
           "--control-socket '%s' --reload-from '%s' --db '%s' --quiet",
           dir_a, sock, dir_q, db);
  pid_t pid = spawn_run(args, log);
  wait_for(sock);
  snprintf(args, sizeof args, "ctl --socket '%s' reload '%s'", sock, bad);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "refused: "));
  assert_true(tu_contains(out, shard)); /* the corrupted file, by name */
  assert_true(tu_contains(out, "does not match the manifest's"));
  free(out);
  snprintf(args, sizeof args, "ctl --socket '%s' reload '%s'", sock, dir_b);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "ok: "));
  free(out);
  snprintf(args, sizeof args, "ctl --socket '%s' status", sock);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "weights version"));
  free(out);
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);
  assert_int_equal(kill(pid, SIGHUP), 0);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) {
    char cat[700];
    snprintf(cat, sizeof cat, "cat '%s' >&2", log);
    (void)system(cat);
  }
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  struct stat sb;
  assert_int_not_equal(stat(sock, &sb), 0); /* removed at the end */
  sqlite3 *d = NULL;
  assert_int_equal(sqlite3_open_v2(db, &d, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  assert_int_equal(query_int(d, "SELECT count(*) FROM requests WHERE finish_ns IS NOT NULL"), 40);
  assert_int_equal(query_int(d, "SELECT complete FROM runs WHERE id = 1"), 1);
  assert_int_equal(query_int(d, "SELECT count(*) FROM engine_events WHERE action = 'reload refused'"), 1);
  assert_int_equal(query_int(d, "SELECT count(*) FROM engine_events WHERE action = 'reload refused' AND detail LIKE "
                                "'%does not match%'"), 1);
  assert_int_equal(query_int(d, "SELECT count(*) FROM engine_events WHERE action = 'reload staged'"), 2);
  assert_int_equal(query_int(d, "SELECT count(*) FROM engine_events WHERE action = 'reload applied'"), 2);
  assert_int_equal(query_int(d, "SELECT count(*) FROM engine_events WHERE action = 'reload applied' AND detail LIKE "
                                "'version 3 (%/q)%'"), 1);
  sqlite3_close(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_manifest),
      cmocka_unit_test(test_architecture),
      cmocka_unit_test(test_reload_new_weights),
      cmocka_unit_test(test_reload_new_quantization),
      cmocka_unit_test(test_reload_refused),
      cmocka_unit_test(test_sim_reload),
      cmocka_unit_test(test_cli_control_socket_and_sighup),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
