/* An output path that names an input (or another output) is refused before anything is
 * written, by every command, through one check (ferry__check_paths): the same file by device
 * and inode (hard links, symbolic links, "..") or, for an output that does not exist yet, by
 * resolved path; outputs inside an input folder; SQLite side files of an input database. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/db.h"
#include "testutil.h"

static char *dir;

static char *p(const char *name) {
  static char buf[8][700];
  static int i;
  char *b = buf[i++ % 8];
  snprintf(b, sizeof buf[0], "%s/%s", dir, name);
  return b;
}

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("paths");
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, p("study.db"), FERRY_DB_CREATE), FERRY_OK);
  struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = "tiny-dense", .config_hash = "h"};
  int64_t run;
  assert_int_equal(ferry_db_run_begin(db, &info, &run), FERRY_OK);
  struct ferry_request_row r = {0, 0, 1000, 5000, 4, 4, 0};
  assert_int_equal(ferry_db_add_request(db, run, &r), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, run, NULL), FERRY_OK);
  ferry_db_close(db);
  tu_write_file(p("input.txt"), "input\n", 6);
  assert_int_equal(mkdir(p("folder"), 0755), 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  return 0;
}

static void test_identity(void **state) {
  (void)state;
  char a[700], b[700];
  snprintf(a, sizeof a, "%s", p("input.txt"));
  /* the same file under other names */
  snprintf(b, sizeof b, "%s/folder/../input.txt", dir);
  assert_true(ferry__same_file(a, b));
  assert_int_equal(link(a, p("hard.txt")), 0);
  assert_true(ferry__same_file(a, p("hard.txt")));
  assert_int_equal(symlink(a, p("soft.txt")), 0);
  assert_true(ferry__same_file(p("soft.txt"), a));
  assert_false(ferry__same_file(a, p("study.db")));
  /* outputs that do not exist yet: equal when they resolve to one path */
  snprintf(a, sizeof a, "%s/new.json", dir);
  snprintf(b, sizeof b, "%s/missing/../new.json", dir);
  assert_true(ferry__same_file(a, b));
  assert_int_equal(symlink(p("folder"), p("link")), 0);
  assert_true(ferry__same_file(p("folder/x.json"), p("link/x.json")));
  assert_false(ferry__same_file(p("folder/x.json"), p("folder/y.json")));
  /* inside a folder, at any depth, through links too */
  assert_true(ferry__path_within(p("folder/a/b/c"), p("folder")));
  assert_true(ferry__path_within(p("link/x"), p("folder")));
  assert_true(ferry__path_within(p("folder"), p("folder")));
  assert_false(ferry__path_within(p("folderx"), p("folder")));
  assert_false(ferry__path_within(p("input.txt"), p("folder")));
  /* the check itself */
  struct ferry_path_use u[] = {{"--out", p("study.db-wal"), FERRY_PATH_OUT}, {"--db", p("study.db"), FERRY_PATH_SQLITE}};
  assert_int_equal(ferry__check_paths(u, 2), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "side file"));
  u[0].path = p("trace.json");
  assert_int_equal(ferry__check_paths(u, 2), FERRY_OK);
  /* a missing input cannot be destroyed; two outputs may not be one file */
  struct ferry_path_use v[] = {{"--a", p("x.out"), FERRY_PATH_OUT}, {"--in", p("x.out"), 0}};
  assert_int_equal(ferry__check_paths(v, 2), FERRY_OK);
  v[1].flags = FERRY_PATH_OUT;
  assert_int_equal(ferry__check_paths(v, 2), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "another output"));
  /* standard output is no file */
  v[0].path = v[1].path = "-";
  assert_int_equal(ferry__check_paths(v, 2), FERRY_OK);
}

/* Every command: exit status 2, one message naming both options, the input untouched. */
static void expect_refused(const char *args, const char *opt_a, const char *opt_b, const char *input) {
  struct stat before, after;
  assert_int_equal(stat(input, &before), 0);
  char *out = NULL;
  int rc = tu_run_ferry(args, &out);
  if (rc != 2 || !tu_contains(out, "must not overwrite") || !tu_contains(out, opt_a) || !tu_contains(out, opt_b))
    fail_msg("ferry %s: exit %d: %s", args, rc, out);
  free(out);
  assert_int_equal(stat(input, &after), 0);
  assert_int_equal(before.st_size, after.st_size);
  assert_int_equal(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
  assert_int_equal(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
}

static void test_commands(void **state) {
  (void)state;
  char args[4096];
  const char *db = p("study.db");
  snprintf(args, sizeof args, "db export-trace --run 1 --db '%s' --out '%s'", db, db);
  expect_refused(args, "--out", "--db", db);
  snprintf(args, sizeof args, "db export-trace --run 1 --db '%s' --out '%s/folder/../study.db-wal'", db, dir);
  expect_refused(args, "--out", "--db", db);
  snprintf(args, sizeof args, "db import-nsys '%s' --db '%s'", db, db);
  expect_refused(args, "--db", "EXPORT", db);
  snprintf(args, sizeof args, "report --db '%s' --out '%s'", db, dir);
  expect_refused(args, "--out", "--db", db);
  snprintf(args, sizeof args, "report --db '%s' --out '%s'", db, db);
  expect_refused(args, "--out", "--db", db);
  snprintf(args, sizeof args, "sweep --spec '%s' --db '%s'", p("input.txt"), p("input.txt"));
  expect_refused(args, "--db", "--spec", p("input.txt"));
  snprintf(args, sizeof args, "calibrate --db '%s' --run 1 --base h100-pcie --out '%s'", db, db);
  expect_refused(args, "--out", "--db", db);
  snprintf(args, sizeof args, "trace convert '%s' --out '%s'", p("input.txt"), p("hard.txt"));
  expect_refused(args, "--out", "FILE", p("input.txt"));
  snprintf(args, sizeof args, "predictor train --routing '%s' --variant mlp3 --out '%s'", p("input.txt"),
           p("input.txt"));
  expect_refused(args, "--out", "--routing", p("input.txt"));
  snprintf(args, sizeof args, "model quantize --format int8 '%s' '%s/.'", p("folder"), p("folder"));
  expect_refused(args, "OUT_DIR", "IN_DIR", p("folder"));
  /* run and sim: the database, the routing record and the logits against every input */
  tu_write_file(p("folder/config.json"), "{}", 2);
  snprintf(args, sizeof args, "run --model '%s' --synthetic n=1 --dump-logits '%s'", p("folder"), p("folder/config.json"));
  expect_refused(args, "--dump-logits", "--model", p("folder/config.json"));
  snprintf(args, sizeof args, "run --model tiny-moe --synthetic n=1 --db '%s' --record-routing '%s'", db, db);
  expect_refused(args, "--record-routing", "--db", db);
  snprintf(args, sizeof args, "sim --model tiny-dense --hw h100-pcie --trace '%s' --db '%s'", p("input.txt"),
           p("soft.txt"));
  expect_refused(args, "--db", "--trace", p("input.txt"));
  snprintf(args, sizeof args, "sim --model tiny-moe --hw h100-pcie --synthetic n=1 --routing '%s' --record-routing '%s'",
           p("input.txt"), p("input.txt"));
  expect_refused(args, "--record-routing", "--routing", p("input.txt"));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_identity), cmocka_unit_test(test_commands)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
