/* cli/cmd_sweep.c: `ferry sweep` over a tiny generated model on the host executor. Resume after
 * a partial sweep and after an interruption (SIGTERM mid-sweep) without re-running finished
 * combinations; children killed with a killed sweep; failed runs recorded with their error and a non-zero exit; real runs never
 * overlap even with -j; bad specs (unknown key named with the known list, bad values) fail
 * before anything runs. */
#include <dirent.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "testutil.h"

struct fixture {
  char *dir;
  char db[512];
  char spec[512];
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  f->dir = tu_mkdtemp("sweep");
  snprintf(f->db, sizeof f->db, "%s/study.db", f->dir);
  snprintf(f->spec, sizeof f->spec, "%s/spec.json", f->dir);
  char args[1024], *out = NULL;
  snprintf(args, sizeof args, "model gen --preset tiny-dense --out %s/tiny --quiet", f->dir);
  int rc = tu_run_ferry(args, &out);
  if (rc != 0) fail_msg("ferry %s: %s", args, out);
  free(out);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  tu_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

static void write_spec(struct fixture *f, const char *extra) {
  char text[2048];
  int n = snprintf(text, sizeof text,
                   "{\"model\": [\"%s/tiny\"], \"synthetic\": [\"rate=50,n=4,prompt=8,output=3\"],\n"
                   " \"as_fast_as_possible\": [true], \"device_budget\": [\"64MiB\"]%s}\n",
                   f->dir, extra);
  tu_write_file(f->spec, text, (size_t)n);
}

static int64_t q1(const char *db, const char *sql) {
  sqlite3 *s;
  if (sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    sqlite3_close(s);
    return -1;
  }
  sqlite3_busy_timeout(s, 10000);
  sqlite3_stmt *q;
  int64_t v = -1;
  if (sqlite3_prepare_v2(s, sql, -1, &q, NULL) == SQLITE_OK) {
    if (sqlite3_step(q) == SQLITE_ROW) v = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
  }
  sqlite3_close(s);
  return v;
}

static int sweep(struct fixture *f, const char *opts, char **out) {
  char args[2048];
  snprintf(args, sizeof args, "sweep --spec %s --db %s %s", f->spec, f->db, opts);
  return tu_run_ferry(args, out);
}

static void test_resume_after_partial_sweep(void **state) {
  struct fixture *f = *state;
  write_spec(f, ", \"block_layers\": [1, 2], \"prefetch_depth\": [0, 1]");
  char *out = NULL;
  int rc = sweep(f, "", &out);
  if (rc != 0) fail_msg("sweep: %s", out);
  assert_true(tu_contains(out, "4 combinations: 0 already complete, 4 ran, 0 failed"));
  free(out);
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE complete = 1"), 4);
  assert_int_equal(q1(f->db, "SELECT count(DISTINCT config_hash) FROM runs"), 4);
  /* each child recorded its combination (one complete run per key, by a unique index) */
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE sweep_key = config_hash"), 4);
  /* the grown sweep runs only the new block size */
  write_spec(f, ", \"block_layers\": [1, 2, 4], \"prefetch_depth\": [0, 1]");
  rc = sweep(f, "--dry-run", &out);
  assert_int_equal(rc, 0);
  assert_true(tu_contains(out, "6 combinations, 4 complete, 2 to run"));
  assert_true(tu_contains(out, "--block-layers 4 --prefetch-depth 1"));
  free(out);
  rc = sweep(f, "", &out);
  if (rc != 0) fail_msg("sweep: %s", out);
  assert_true(tu_contains(out, "6 combinations: 4 already complete, 2 ran, 0 failed"));
  free(out);
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs"), 6);
  /* and once everything is there, nothing runs */
  rc = sweep(f, "--quiet", &out);
  assert_int_equal(rc, 0);
  assert_true(tu_contains(out, "6 already complete, 0 ran"));
  free(out);
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs"), 6);
  /* the stored configuration has the swept values */
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE json_extract(config_json, '$.block_layers') = 4"), 2);
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE json_extract(config_json, '$.executor') = 'host'"), 6);
}

static void test_resume_after_interrupt(void **state) {
  struct fixture *f = *state;
  write_spec(f, ", \"block_layers\": [1, 2, 3], \"prefetch_depth\": [0, 1, 2]");
  const char *bin = getenv("FERRY_BIN");
  if (!bin) bin = "build/ferry";
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    freopen("/dev/null", "w", stdout);
    freopen("/dev/null", "w", stderr);
    execl(bin, bin, "sweep", "--spec", f->spec, "--db", f->db, (char *)NULL);
    _exit(127);
  }
  /* interrupt once the first run is complete */
  for (int i = 0; i < 3000; i++) {
    if (q1(f->db, "SELECT count(*) FROM runs WHERE complete = 1") >= 1) break;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGTERM);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  int64_t done_before = q1(f->db, "SELECT count(*) FROM runs WHERE complete = 1");
  assert_true(done_before >= 1);
  /* unless the sweep finished first, it says it was interrupted */
  if (done_before < 9) assert_int_equal(WEXITSTATUS(status), 128 + SIGTERM);
  char *out = NULL;
  int rc = sweep(f, "-j 3", &out);
  if (rc != 0) fail_msg("resumed sweep: %s", out);
  char want[128];
  snprintf(want, sizeof want, "9 combinations: %lld already complete, %lld ran, 0 failed", (long long)done_before,
           (long long)(9 - done_before));
  if (!tu_contains(out, want)) fail_msg("expected '%s' in:\n%s", want, out);
  free(out);
  /* every configuration complete exactly once: nothing finished was run again */
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE complete = 1"), 9);
  assert_int_equal(q1(f->db, "SELECT count(DISTINCT config_hash) FROM runs WHERE complete = 1"), 9);
  /* real runs are measured alone, even with -j 3: no two overlap in time */
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs a JOIN runs b ON a.id < b.id AND a.complete AND b.complete "
                             "WHERE a.started_at < b.finished_at AND b.started_at < a.finished_at"),
                   0);
}

/* Children of pid (from /proc), at most max. */
static int children_of(pid_t pid, pid_t *out, int max) {
  int n = 0;
  DIR *d = opendir("/proc");
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < max) {
    char *end;
    long id = strtol(e->d_name, &end, 10);
    if (*end || id <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", id);
    FILE *fp = fopen(path, "r");
    if (!fp) continue;
    size_t got = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[got] = '\0';
    const char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ..." */
    char state;
    long ppid;
    if (rp && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == pid) out[n++] = (pid_t)id;
  }
  closedir(d);
  return n;
}

/* Gone, or a zombie nobody reaps (a container's init may not). */
static int dead(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  FILE *fp = fopen(path, "r");
  if (!fp) return 1;
  size_t got = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  buf[got] = '\0';
  const char *rp = strrchr(buf, ')');
  return rp && (rp[2] == 'Z' || rp[2] == 'X');
}

/* The sweep killed outright (SIGKILL, no chance to clean up) takes its running child with it,
 * so a resumed sweep never runs beside an orphan of the last one. */
static void test_children_die_with_the_sweep(void **state) {
  struct fixture *f = *state;
  char text[1024];
  /* a real run that paces requests in wall time: about 20 s unless it is killed */
  int n = snprintf(text, sizeof text,
                   "{\"model\": [\"%s/tiny\"], \"synthetic\": [\"rate=2,n=40,prompt=8,output=3\"],"
                   " \"max_seq_tokens\": [64], \"block_layers\": [1, 2]}",
                   f->dir);
  tu_write_file(f->spec, text, (size_t)n);
  const char *bin = getenv("FERRY_BIN");
  if (!bin) bin = "build/ferry";
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    freopen("/dev/null", "w", stdout);
    freopen("/dev/null", "w", stderr);
    execl(bin, bin, "sweep", "--spec", f->spec, "--db", f->db, (char *)NULL);
    _exit(127);
  }
  pid_t kids[8];
  int nk = 0;
  for (int i = 0; i < 3000 && nk == 0; i++) {
    nk = children_of(pid, kids, 8);
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  if (nk == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("the sweep started no child within 30 s");
  }
  assert_int_equal(kill(pid, SIGKILL), 0);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  for (int k = 0; k < nk; k++) {
    int gone = 0;
    for (int i = 0; i < 1000 && !(gone = dead(kids[k])); i++) {
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
    }
    if (!gone) {
      kill(kids[k], SIGKILL);
      fail_msg("child %ld of the killed sweep still runs after 10 s", (long)kids[k]);
    }
  }
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE complete = 1"), 0);
}

static void test_failed_runs_recorded(void **state) {
  struct fixture *f = *state;
  char text[1024];
  int n = snprintf(text, sizeof text,
                   "{\"model\": [\"%s/tiny\", \"%s/no-such-model\"], \"synthetic\": [\"rate=50,n=3,prompt=8,output=2\"],"
                   " \"as_fast_as_possible\": true, \"block_layers\": [1], \"device_budget\": \"64MiB\"}",
                   f->dir, f->dir);
  tu_write_file(f->spec, text, (size_t)n);
  char *out = NULL;
  int rc = sweep(f, "", &out);
  assert_int_equal(rc, 1);
  assert_true(tu_contains(out, "2 combinations: 0 already complete, 1 ran, 1 failed"));
  assert_true(tu_contains(out, "failed: host model="));
  free(out);
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE complete = 1"), 1);
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE complete = 0 AND error LIKE '%no-such-model%'"), 1);
  /* a rerun retries only the failed combination */
  rc = sweep(f, "", &out);
  assert_int_equal(rc, 1);
  assert_true(tu_contains(out, "1 already complete, 0 ran, 1 failed"));
  free(out);
}

/* Spec values reach the run whole, however long (they were cut at 1023 bytes). */
static void test_long_values(void **state) {
  struct fixture *f = *state;
  /* a model path of about 1300 bytes: six long folder names and a link to the model */
  char path[1600], link_target[600];
  int n = snprintf(path, sizeof path, "%s", f->dir);
  for (int i = 0; i < 6; i++) {
    n += snprintf(path + n, sizeof path - (size_t)n, "/%c", 'a' + i);
    for (int k = 0; k < 200; k++) path[n++] = (char)('a' + i);
    path[n] = '\0';
    assert_int_equal(ferry__mkdir_p(path, NULL), FERRY_OK);
  }
  snprintf(link_target, sizeof link_target, "%s/tiny", f->dir);
  n += snprintf(path + n, sizeof path - (size_t)n, "/model");
  assert_int_equal(symlink(link_target, path), 0);
  assert_true(strlen(path) > 1100);
  char text[2048];
  int len = snprintf(text, sizeof text,
                     "{\"model\": [\"%s\"], \"synthetic\": [\"rate=50,n=2,prompt=8,output=2\"], \"as_fast_as_possible\": true}",
                     path);
  assert_true(len < (int)sizeof text);
  tu_write_file(f->spec, text, (size_t)len);
  char *out = NULL;
  int rc = sweep(f, "", &out);
  if (rc != 0) fail_msg("sweep: %s", out);
  free(out);
  char sql[2048];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE complete = 1 AND model = '%s'", path);
  assert_int_equal(q1(f->db, sql), 1);
}

static void expect_bad_spec(struct fixture *f, const char *spec, const char *needle) {
  tu_write_file(f->spec, spec, strlen(spec));
  char *out = NULL;
  int rc = sweep(f, "", &out);
  assert_int_not_equal(rc, 0);
  if (!tu_contains(out, needle)) fail_msg("expected '%s' in: %s", needle, out);
  free(out);
  assert_false(ferry__is_file(f->db)); /* nothing ran, nothing written */
}

/* Every sweep key is part of the configuration hash: a key left out of it made all its values
 * one run (drop_cache and skip_bad did, so a 2 x 2 sweep over them ran once). */
static void test_every_key_is_hashed(void **state) {
  struct fixture *f = *state;
  write_spec(f, ", \"drop_cache\": [true, false], \"skip_bad\": [true, false]");
  char *out = NULL;
  int rc = sweep(f, "", &out);
  if (rc != 0) fail_msg("sweep: %s", out);
  assert_true(tu_contains(out, "4 combinations: 0 already complete, 4 ran, 0 failed"));
  free(out);
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE complete = 1"), 4);
  assert_int_equal(q1(f->db, "SELECT count(DISTINCT config_hash) FROM runs"), 4);
  assert_int_equal(q1(f->db, "SELECT count(*) FROM runs WHERE json_extract(config_json, '$.skip_bad') = 1"), 2);
}

/* Sweeps resume by configuration hash: the hashes of configurations written before the option
 * table generated them stay the same (these were printed by `ferry sweep --dry-run` at 420ffd7;
 * an option added later enters a configuration only when it is given). One change is on
 * purpose: the default expert placement became auto (issue 14), so a configuration naming no
 * --expert-cache measures something else and has a new hash (cases 1-4, reprinted after that
 * merge); case 0 names its policies and keeps its 420ffd7 hashes. */
static void test_config_hash_stable(void **state) {
  struct fixture *f = *state;
  static const struct {
    const char *spec, *hashes[4];
  } cases[] = {
      {"{\"executor\": [\"sim\"], \"hw\": [\"h100-pcie\"], \"model\": [\"tiny-moe\"], \"synthetic\": "
       "[\"rate=4,n=8,prompt=16,output=4\"], \"block_layers\": [1, 2], \"device_budget\": [\"8MiB\"], \"expert_cache\": "
       "[\"lru\", \"lfu\"], \"predictor\": [\"frequency\"], \"routing_synth\": [\"zipf=1.1\"], \"kv_dtype\": [\"fp16\"], "
       "\"time_window\": [\"0:10\"], \"max_batch\": [4]}",
       {"6913d64950982e63", "6b065aad1e0e621f", "b374eaebf9290d9e", "78a361d83873642a"}},
      {"{\"executor\": [\"sim\"], \"hw\": [\"a100-40gb-pcie\"], \"model\": [\"tiny-dense\"], \"synthetic\": "
       "[\"rate=4,n=8,prompt=16,output=4\"], \"prefetch_depth\": [0, 2], \"resident\": [\"attention\"], \"device_budget\": "
       "[\"4MiB\"], \"home\": [\"disk\"], \"quant\": [\"int4-g64\"], \"time_window\": [\"1:\"], \"rate_scale\": [2], "
       "\"max_requests\": [5], \"pin_first\": [1], \"pin_last\": [1], \"host_budget\": [\"1GiB\"], \"max_step_tokens\": "
       "[64], \"max_seq_tokens\": [64]}",
       {"d746aa5d03b64a8c", "e19da7a738e2ad0a"}},
      {"{\"executor\": [\"sim\"], \"hw\": [\"h100-pcie\"], \"model\": [\"tiny-moe\"], \"synthetic\": "
       "[\"rate=4,n=8,prompt=16,output=4\"], \"as_fast_as_possible\": [true, false]}",
       {"f0e7e8383530562a", "3c2b086984a7c959"}},
      {"{\"executor\": [\"host\"], \"model\": [\"m\"], \"synthetic\": [\"rate=4,n=8,prompt=16,output=4\"], "
       "\"direct_io\": [true], \"greedy\": [true], \"threads\": [2], \"seed\": [7], \"time_scale\": [0.5], "
       "\"allow_nonfinite\": [true], \"device_budget\": [\"64MiB\"], \"predictor\": [\"mlp3\"], \"predictor_model\": "
       "[\"p.safetensors\"], \"max_seq_tokens\": [100]}",
       {"636570ac84e6e7cf"}},
      {"{\"executor\": [\"sim\"], \"hw\": [\"h100-pcie\"], \"model\": [\"tiny-moe\"], \"synthetic\": "
       "[\"rate=4,n=8,prompt=16,output=4\"], \"predictor\": [\"gate-lookahead\"], \"routing\": [\"r.jsonl\"], "
       "\"device_budget\": [\"8MiB\"], \"predictor_routing\": [\"x.jsonl\"]}",
       {"be0f8151de24a52f"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tu_write_file(f->spec, cases[i].spec, strlen(cases[i].spec));
    char *out = NULL;
    int rc = sweep(f, "--dry-run", &out);
    if (rc != 0) fail_msg("sweep: %s", out);
    for (size_t h = 0; h < 4 && cases[i].hashes[h]; h++)
      if (!tu_contains(out, cases[i].hashes[h])) fail_msg("case %zu: hash %s missing from:\n%s", i, cases[i].hashes[h], out);
    free(out);
  }
}

static void test_bad_spec(void **state) {
  struct fixture *f = *state;
  expect_bad_spec(f, "{\"model\": [\"x\"], \"block_size\": [1, 2]}",
                  "unknown parameter 'block_size' (known: model, trace,");
  /* a near miss names the key it resembles */
  expect_bad_spec(f, "{\"model\": [\"x\"], \"prefetch_dept\": [1, 2]}",
                  "unknown parameter 'prefetch_dept'; did you mean prefetch_depth?");
  expect_bad_spec(f, "{\"model\": [\"x\"], \"synthetic\": [\"n=2\"], \"executor\": [\"gpu\"]}",
                  "executor: no executor named 'gpu'");
  expect_bad_spec(f, "{\"model\": [\"x\"], \"block_layers\": [{}]}", "block_layers: expected a string or a number");
  expect_bad_spec(f, "{\"model\": [\"x\"], \"greedy\": [1]}", "greedy: expected true or false");
  expect_bad_spec(f, "{\"model\": [\"x\"], \"block_layers\": []}", "block_layers: empty list");
  expect_bad_spec(f, "[1, 2]", "expected a JSON object");
  expect_bad_spec(f, "{\"model\": [\"x\"], ", "spec.json");
  /* a value the run parser refuses */
  char text[512];
  int n = snprintf(text, sizeof text, "{\"model\": [\"%s/tiny\"], \"synthetic\": [\"rate=5,n=2\"], \"prefetch_depth\": [-1]}",
                   f->dir);
  text[n] = '\0';
  expect_bad_spec(f, text, "--prefetch-depth");
  char *out = NULL;
  assert_int_equal(tu_run_ferry("sweep --db x.db", &out), 2);
  assert_true(tu_contains(out, "missing --spec"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_resume_after_partial_sweep, setup, teardown),
      cmocka_unit_test_setup_teardown(test_resume_after_interrupt, setup, teardown),
      cmocka_unit_test_setup_teardown(test_children_die_with_the_sweep, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_runs_recorded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_long_values, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_spec, setup, teardown),
      cmocka_unit_test_setup_teardown(test_every_key_is_hashed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_hash_stable, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
