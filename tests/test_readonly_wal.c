/* A study in WAL mode whose folder the reader may not write, with its committed runs still in
 * the -wal file and no -shm file (a writer killed before its checkpoint, or a copy without the
 * -shm): ferry db and ferry report read every committed run, and write nothing beside it; so
 * do they a finished study there (WAL mode in its header, no -wal file). The
 * folder is really read-only: as root the check runs in a child that drops to user nobody
 * (root ignores permission bits); where that is impossible the test says so and skips. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/db.h"
#include "ferry/report.h"
#include "testutil.h"

static char *dir;
static char ro_dir[600], ro_db[700], done_db[700], out_dir[700];

static void add_run(ferry_db *db, const char *model) {
  struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = model, .hardware = "h100-pcie",
                                .config_json = "{\"block_layers\": 1}", .config_hash = model};
  int64_t id;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_OK);
  for (int r = 0; r < 4; r++) {
    struct ferry_request_row q = {r, r * 1000000LL, r * 1000000LL + 3000000, r * 1000000LL + 9000000, 8, 4, 0};
    assert_int_equal(ferry_db_add_request(db, id, &q), FERRY_OK);
  }
  assert_int_equal(ferry_db_run_finish(db, id, NULL), FERRY_OK);
}

static void copy(const char *from, const char *to) {
  char *data = NULL;
  size_t len = 0;
  assert_int_equal(ferry__read_file(from, (size_t)1 << 30, &data, &len, NULL), FERRY_OK);
  tu_write_file(to, data, len);
  free(data);
}

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("rowal");
  assert_int_equal(chmod(dir, 0755), 0);
  char live[700], path[800];
  snprintf(live, sizeof live, "%s/live.db", dir);
  snprintf(ro_dir, sizeof ro_dir, "%s/ro", dir);
  snprintf(ro_db, sizeof ro_db, "%s/study.db", ro_dir);
  snprintf(out_dir, sizeof out_dir, "%s/out", dir);
  assert_int_equal(mkdir(ro_dir, 0755), 0);
  assert_int_equal(mkdir(out_dir, 0755), 0);
  assert_int_equal(chmod(out_dir, 0777), 0);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, live, FERRY_DB_CREATE), FERRY_OK);
  add_run(db, "first");
  add_run(db, "second");
  /* the writer is still open: its commits are in live.db-wal, not yet in live.db */
  copy(live, ro_db);
  snprintf(path, sizeof path, "%s-wal", live);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_true(sb.st_size > 32);
  char wal[800];
  snprintf(wal, sizeof wal, "%s-wal", ro_db);
  copy(path, wal);
  ferry_db_close(db);
  /* a finished study: WAL mode in its header, nothing in a -wal file */
  snprintf(done_db, sizeof done_db, "%s/done.db", ro_dir);
  copy(live, done_db);
  assert_int_equal(chmod(done_db, 0444), 0);
  assert_int_equal(chmod(ro_db, 0444), 0);
  assert_int_equal(chmod(wal, 0444), 0);
  assert_int_equal(chmod(ro_dir, 0555), 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  chmod(ro_dir, 0755);
  tu_rmtree(dir);
  free(dir);
  return 0;
}

/* ferry db and ferry report on one database: 0, or the failed step. */
static int read_study(const char *path, const char *report_name) {
  ferry_db *db;
  if (ferry_db_open(&db, path, FERRY_DB_READ_ONLY) != FERRY_OK) {
    fprintf(stderr, "ferry_db_open: %s\n", ferry_last_error());
    return 1;
  }
  struct ferry_run_summary *runs;
  size_t n = 0;
  if (ferry_db_list_runs(db, &runs, &n) != FERRY_OK) {
    fprintf(stderr, "ferry_db_list_runs: %s\n", ferry_last_error());
    return 2;
  }
  int ok = n == 2 && runs[1].complete && !strcmp(runs[1].model, "second");
  ferry_db_runs_free(runs, n);
  struct ferry_run_stats s;
  if (!ok || ferry_db_run_stats(db, 2, &s) != FERRY_OK || s.requests != 4) {
    fprintf(stderr, "runs: %zu (want 2 complete, the second with 4 requests): %s\n", n, ferry_last_error());
    return 3;
  }
  ferry_db_close(db);
  struct ferry_report_options o;
  ferry_report_options_init(&o);
  const char *dbs[1] = {path};
  char out[800];
  snprintf(out, sizeof out, "%s/%s", out_dir, report_name);
  o.db_paths = dbs;
  o.n_dbs = 1;
  o.out_dir = out;
  struct ferry_report_summary sum;
  if (ferry_report_write(&o, &sum) != FERRY_OK) {
    fprintf(stderr, "ferry_report_write: %s\n", ferry_last_error());
    return 4;
  }
  if (sum.runs != 2 || sum.complete != 2) return 5;
  return 0;
}

/* In the child: 0 ok, 77 not really read-only here, else the failed step (+10 for done.db). */
static int reader(void) {
  if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) return 77;
  if (access(ro_dir, W_OK) == 0) return 77;
  int rc = read_study(ro_db, "wal");
  if (rc == 0 && (rc = read_study(done_db, "done")) != 0) rc += 10;
  return rc;
}

static void test_committed_runs_are_read(void **state) {
  (void)state;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(reader());
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    print_message("SKIP: cannot make a folder read-only for this process (root without setuid to nobody?)\n");
    skip();
  }
  assert_int_equal(WEXITSTATUS(status), 0);
  /* nothing was written beside the database */
  char shm[800];
  snprintf(shm, sizeof shm, "%s-shm", ro_db);
  assert_int_equal(access(shm, F_OK), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_committed_runs_are_read)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
