/* ferry_db_merge and `ferry db merge`: runs of two databases land in a third with every row,
 * their run ids remapped and kernel and copy names translated through StringIds (the sources
 * intern the same names under different ids); a complete run of a sweep combination the
 * destination holds, a repetition it holds and the same run merged twice are skipped; bad
 * sources (itself, not a database, a newer schema) are refused and leave it unchanged. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/activity.h"
#include "ferry/db.h"
#include "testutil.h"

struct fixture {
  char *dir;
  char a[1024], b[1024], c[1024];
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  f->dir = tu_mkdtemp("merge");
  snprintf(f->a, sizeof f->a, "%s/a.db", f->dir);
  snprintf(f->b, sizeof f->b, "%s/b.db", f->dir);
  snprintf(f->c, sizeof f->c, "%s/c.db", f->dir);
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

static ferry_db *open_rw(const char *path) {
  ferry_db *db = NULL;
  if (ferry_db_open(&db, path, FERRY_DB_CREATE) != FERRY_OK) fail_msg("open %s: %s", path, ferry_last_error());
  return db;
}

static void activity(ferry_db *db, enum ferry_activity_kind kind, const char *name, int64_t t) {
  struct ferry_activity a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.name = name;
  a.start_ns = t;
  a.end_ns = t + 100;
  a.bytes = 4096;
  a.step = a.layer = a.expert = -1;
  ferry_db_activity_sink(db, &a);
}

/* One run with `n` requests whose times encode `tag`, kernels and copies named after `names`,
 * a step, memory samples and a fact. */
static int64_t add_run(ferry_db *db, const char *hash, const char *sweep, const char *group, int index, int tag,
                       const char *const *names, int n, int fail) {
  struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = "tiny-moe", .hardware = "t4", .trace = "synthetic",
                                .config_json = "{}", .config_hash = hash, .sweep_key = sweep,
                                .repeat_group = group, .repeat_index = index};
  int64_t id;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_OK);
  for (int i = 0; i < n; i++) {
    struct ferry_request_row r = {.req_id = i, .arrival_ns = tag * 1000 + i, .first_token_ns = tag * 1000 + i + 10,
                                  .finish_ns = tag * 1000 + i + 50, .prompt_tokens = 8, .output_tokens = 4};
    assert_int_equal(ferry_db_add_request(db, id, &r), FERRY_OK);
  }
  struct ferry_step_row s = {.step = 0, .start_ns = 0, .end_ns = 40, .batch = 2, .tokens = 3, .bytes_h2d = 4096};
  assert_int_equal(ferry_db_add_step(db, id, &s), FERRY_OK);
  for (int i = 0; names[i]; i++) {
    activity(db, FERRY_ACT_KERNEL, names[i], tag * 1000 + i);
    activity(db, FERRY_ACT_MEMCPY, names[i], tag * 1000 + i);
  }
  char v[32];
  snprintf(v, sizeof v, "tag-%d", tag);
  assert_int_equal(ferry_db_run_meta(db, id, "TEST_TAG", v), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, id, fail ? "failed on purpose" : NULL), FERRY_OK);
  return id;
}

static int64_t count(const char *path, const char *sql) {
  sqlite3 *s;
  sqlite3_stmt *q;
  assert_int_equal(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  if (sqlite3_prepare_v2(s, sql, -1, &q, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(s));
  int64_t v = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
  sqlite3_finalize(q);
  sqlite3_close(s);
  return v;
}

/* The run of `path` whose TEST_TAG fact is tag-N, or -1. */
static int64_t run_of_tag(const char *path, int tag) {
  char sql[160];
  snprintf(sql, sizeof sql, "SELECT runId FROM META_DATA_EXPORT WHERE name = 'TEST_TAG' AND value = 'tag-%d'", tag);
  return count(path, sql);
}

/* A run's rows in `path`, with names resolved, as one comparable text. */
static char *rows_text(const char *path, int64_t run) {
  sqlite3 *s;
  assert_int_equal(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  static const char *const queries[] = {
      "SELECT req_id, arrival_ns, first_token_ns, finish_ns, prompt_tokens, output_tokens FROM requests WHERE "
      "runId = ?1 ORDER BY req_id",
      "SELECT step, start_ns, end_ns, batch, tokens, bytes_h2d FROM steps WHERE runId = ?1",
      "SELECT start, n.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON n.id = k.shortName "
      "JOIN StringIds d ON d.id = k.demangledName WHERE runId = ?1 ORDER BY start",
      "SELECT start, n.value, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN StringIds n ON n.id = m.nameId WHERE "
      "runId = ?1 ORDER BY start",
      "SELECT name, value FROM META_DATA_EXPORT WHERE runId = ?1 ORDER BY name, value",
      "SELECT kind, complete, config_hash, sweep_key, repeat_group, repeat_index, error FROM runs WHERE id = ?1"};
  size_t cap = 1 << 16, len = 0;
  char *out = calloc(1, cap);
  for (size_t k = 0; k < sizeof queries / sizeof queries[0]; k++) {
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(s, queries[k], -1, &q, NULL), SQLITE_OK);
    sqlite3_bind_int64(q, 1, run);
    while (sqlite3_step(q) == SQLITE_ROW) {
      for (int c = 0; c < sqlite3_column_count(q); c++) {
        const char *t = (const char *)sqlite3_column_text(q, c);
        len += (size_t)snprintf(out + len, cap - len, "%s|", t ? t : "NULL");
      }
      len += (size_t)snprintf(out + len, cap - len, "\n");
      assert_true(len < cap - 256);
    }
    sqlite3_finalize(q);
  }
  sqlite3_close(s);
  return out;
}

static void same_rows(const char *src, int64_t src_run, const char *dst, int64_t dst_run) {
  char *a = rows_text(src, src_run), *b = rows_text(dst, dst_run);
  assert_true(strlen(a) > 100);
  if (strcmp(a, b)) fail_msg("run %lld of %s differs in %s (run %lld):\n%s\n---\n%s", (long long)src_run, src,
                             dst, (long long)dst_run, a, b);
  free(a);
  free(b);
}

static void test_merge(void **state) {
  struct fixture *f = *state;
  /* the sources intern the same names in another order, so their StringIds ids differ */
  static const char *const names_a[] = {"matmul", "attention", "h2d layer 1", NULL};
  static const char *const names_b[] = {"expert", "h2d layer 1", "matmul", NULL};
  ferry_db *a = open_rw(f->a), *b = open_rw(f->b);
  add_run(a, "h1", "h1", NULL, 0, 1, names_a, 5, 0);   /* sweep combination h1 */
  add_run(a, "h2", NULL, "g", 0, 2, names_a, 3, 0);    /* repetition 0 of group g */
  add_run(a, "h3", "h3", NULL, 0, 3, names_a, 2, 1);   /* a failed combination */
  add_run(b, "h1", "h1", NULL, 0, 4, names_b, 4, 0);   /* h1 again: the destination will hold it */
  add_run(b, "h2", NULL, "g", 1, 5, names_b, 3, 0);    /* repetition 1 of g */
  add_run(b, "h2", NULL, "g", 0, 6, names_b, 3, 0);    /* repetition 0 of g again */
  add_run(b, "h3", "h3", NULL, 0, 7, names_b, 6, 0);   /* h3 now complete */
  ferry_db_close(a);
  ferry_db_close(b);
  /* b was written by another process, as an MPI rank's database is: its runs are never the
   * same runs as a's (this test writes both within one millisecond) */
  sqlite3 *raw;
  assert_int_equal(sqlite3_open(f->b, &raw), SQLITE_OK);
  assert_int_equal(sqlite3_exec(raw, "UPDATE runs SET pid = pid + 1", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(raw);
  assert_true(count(f->a, "SELECT id FROM StringIds WHERE value = 'matmul'") !=
              count(f->b, "SELECT id FROM StringIds WHERE value = 'matmul'"));

  ferry_db *c = open_rw(f->c);
  struct ferry_db_merge_stats ms;
  assert_int_equal(ferry_db_merge(c, f->a, &ms), FERRY_OK);
  assert_int_equal(ms.runs_added, 3);
  assert_int_equal(ms.same_run + ms.same_sweep_key + ms.same_repetition + ms.same_import, 0);
  assert_true(ms.rows_added > 0);
  assert_int_equal(ferry_db_merge(c, f->b, &ms), FERRY_OK);
  assert_int_equal(ms.runs_added, 2); /* g/1 and the complete h3 */
  assert_int_equal(ms.same_sweep_key, 1);
  assert_int_equal(ms.same_repetition, 1);
  /* the same sources again: every run is already there */
  assert_int_equal(ferry_db_merge(c, f->a, &ms), FERRY_OK);
  assert_int_equal(ms.runs_added, 0);
  assert_int_equal(ms.same_run, 3);
  /* a database cannot be merged into itself */
  assert_int_equal(ferry_db_merge(c, f->c, &ms), FERRY_ERR_INVALID);
  ferry_db_close(c);

  assert_int_equal(count(f->c, "SELECT count(*) FROM runs"), 5);
  assert_int_equal(count(f->c, "SELECT count(*) FROM runs WHERE sweep_key = 'h3' AND complete = 1"), 1);
  assert_int_equal(count(f->c, "SELECT count(*) FROM runs WHERE sweep_key = 'h3' AND complete = 0"), 1);
  /* every copied run has exactly its own rows, names translated */
  const int tags_a[] = {1, 2, 3}, tags_b[] = {5, 7};
  for (int i = 0; i < 3; i++) same_rows(f->a, run_of_tag(f->a, tags_a[i]), f->c, run_of_tag(f->c, tags_a[i]));
  for (int i = 0; i < 2; i++) same_rows(f->b, run_of_tag(f->b, tags_b[i]), f->c, run_of_tag(f->c, tags_b[i]));
  assert_int_equal(run_of_tag(f->c, 4), -1);
  assert_int_equal(run_of_tag(f->c, 6), -1);
  /* each name once */
  assert_int_equal(count(f->c, "SELECT count(*) FROM StringIds WHERE value = 'matmul'"), 1);
  assert_int_equal(count(f->c, "SELECT count(*) FROM requests"), 5 + 3 + 2 + 3 + 6);
  assert_int_equal(count(f->c, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId NOT IN (SELECT id FROM runs)"), 0);
}

static void test_refused_sources(void **state) {
  struct fixture *f = *state;
  static const char *const names[] = {"matmul", NULL};
  ferry_db *c = open_rw(f->c);
  add_run(c, "h9", "h9", NULL, 0, 9, names, 2, 0);
  struct ferry_db_merge_stats ms;
  /* missing, not SQLite, another SQLite file, a newer schema: refused, nothing written */
  char path[1100];
  snprintf(path, sizeof path, "%s/none.db", f->dir);
  assert_int_equal(ferry_db_merge(c, path, &ms), FERRY_ERR_NOT_FOUND);
  snprintf(path, sizeof path, "%s/text.db", f->dir);
  static const char text[] = "not a database, just text, longer than SQLite's 100-byte header....................................";
  tu_write_file(path, text, sizeof text - 1);
  assert_int_equal(ferry_db_merge(c, path, &ms), FERRY_ERR_FORMAT);
  snprintf(path, sizeof path, "%s/other.db", f->dir);
  sqlite3 *s;
  assert_int_equal(sqlite3_open(path, &s), SQLITE_OK);
  assert_int_equal(sqlite3_exec(s, "CREATE TABLE t(x)", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(s);
  assert_int_equal(ferry_db_merge(c, path, &ms), FERRY_ERR_FORMAT);
  ferry_db *a = open_rw(f->a);
  add_run(a, "h8", "h8", NULL, 0, 8, names, 2, 0);
  ferry_db_close(a);
  assert_int_equal(sqlite3_open(f->a, &s), SQLITE_OK);
  assert_int_equal(sqlite3_exec(s, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(s);
  assert_int_equal(ferry_db_merge(c, f->a, &ms), FERRY_ERR_SCHEMA);
  assert_true(tu_contains(ferry_last_error(), "newer than this build"));
  ferry_db_close(c);
  assert_int_equal(count(f->c, "SELECT count(*) FROM runs"), 1);
}

/* `ferry db merge`: the summary per source, --out refused when it is a source. */
static void test_cli(void **state) {
  struct fixture *f = *state;
  static const char *const names[] = {"matmul", NULL};
  ferry_db *a = open_rw(f->a), *b = open_rw(f->b);
  add_run(a, "h1", "h1", NULL, 0, 1, names, 2, 0);
  add_run(b, "h1", "h1", NULL, 0, 2, names, 2, 0);
  add_run(b, "h2", "h2", NULL, 0, 3, names, 2, 0);
  ferry_db_close(a);
  ferry_db_close(b);
  char args[4096], *out = NULL;
  snprintf(args, sizeof args, "db merge %s %s --out %s", f->a, f->b, f->c);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "a.db: 1 run(s) added"));
  assert_true(tu_contains(out, "b.db: 1 run(s) added"));
  assert_true(tu_contains(out, "1 the same sweep combination"));
  free(out);
  assert_int_equal(count(f->c, "SELECT count(*) FROM runs"), 2);
  snprintf(args, sizeof args, "db merge %s %s --out %s", f->a, f->b, f->b);
  assert_int_equal(tu_run_ferry(args, &out), 2);
  assert_true(tu_contains(out, "--out"));
  free(out);
  snprintf(args, sizeof args, "db merge %s", f->a);
  assert_int_equal(tu_run_ferry(args, &out), 2);
  assert_true(tu_contains(out, "--out"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_merge, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refused_sources, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
