/* Merging result databases (ferry db merge, and the ranks of an MPI sweep or plan into rank
 * 0's study): every run of a source that the destination does not already hold is copied with
 * its rows in every table keyed by runId (requests, steps, memory, the nsys timeline tables,
 * META_DATA_EXPORT facts, and any such table a later schema adds), the run ids remapped and
 * every StringIds reference translated. A run the destination holds is skipped: the same run
 * (kind, start and finish, host, process, configuration, outcome), a complete sweep combination (runs.sweep_key,
 * whose unique rule keeps one complete run per combination), an imported file (source_sha256)
 * or a repetition of a repeat group (group, index and configuration). All or nothing: one
 * transaction per source. Runs keep their configuration JSON, provenance and repeat tags as
 * written; nothing is recomputed. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/sqlite_read.h"
#include "common/strbuf.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h"
#include "profiler/table_cols.h"

/* The runs table's identity columns as SQL expressions over src.runs: NULL where an older
 * source lacks the column (v3 has no sweep_key, v4 no repeat group or digest). */
struct run_cols {
  const char *sweep_key, *repeat_group, *repeat_index, *source_sha256;
};

static int exec_sql(sqlite3 *sql, const char *text) { return sqlite3_exec(sql, text, NULL, NULL, NULL); }

/* Why a source run is not copied: 0 when it is new. */
enum dup { DUP_NONE, DUP_SAME_RUN, DUP_SWEEP, DUP_IMPORT, DUP_REPEAT };

static int step_done(sqlite3_stmt *q) {
  int rc = sqlite3_step(q);
  return rc == SQLITE_ROW ? SQLITE_ROW : rc == SQLITE_DONE ? SQLITE_DONE : rc;
}

/* Copy the runs, deciding for each whether the destination already holds it; fills
 * temp.ferry_runmap(src, dst) with the copied ones. */
static int copy_runs(sqlite3 *sql, const struct ferry__cols *dst, const struct ferry__cols *src,
                     const struct run_cols *rc_cols, struct ferry_db_merge_stats *stats) {
  struct ferry_strbuf sel = {0}, ins = {0}, list = {0};
  int rc = SQLITE_NOMEM;
  sqlite3_stmt *runs = NULL, *same = NULL, *sweep = NULL, *imported = NULL, *repeat = NULL, *insert = NULL,
               *map = NULL;
  ferry__sb_printf(&sel,
                   "SELECT id, kind, started_at, hostname, pid, config_hash, complete, %s, %s, %s, %s, finished_at, "
                   "error FROM src.runs ORDER BY id",
                   rc_cols->sweep_key, rc_cols->repeat_group, rc_cols->repeat_index, rc_cols->source_sha256);
  /* the columns both sides have, but the id, which the destination assigns */
  for (int i = 0; i < dst->n; i++) {
    if (!strcmp(dst->names[i], "id") || ferry__cols_find(src, dst->names[i]) < 0) continue;
    ferry__sb_printf(&list, "%s\"%s\"", list.len ? "," : "", dst->names[i]);
  }
  ferry__sb_printf(&ins, "INSERT INTO main.runs(%s) SELECT %s FROM src.runs WHERE id = ?1", list.p ? list.p : "",
                   list.p ? list.p : "");
  if (sel.oom || ins.oom || list.oom) goto out;
  if ((rc = sqlite3_prepare_v2(sql, sel.p, -1, &runs, NULL)) != SQLITE_OK ||
      (rc = sqlite3_prepare_v2(sql,
                               "SELECT 1 FROM main.runs WHERE started_at IS ?1 AND hostname IS ?2 AND pid IS ?3 "
                               "AND config_hash IS ?4 AND kind IS ?5 AND complete IS ?6 AND repeat_group IS ?7 AND "
                               "repeat_index IS ?8 AND finished_at IS ?9 AND error IS ?10",
                               -1, &same, NULL)) != SQLITE_OK ||
      (rc = sqlite3_prepare_v2(sql, "SELECT 1 FROM main.runs WHERE sweep_key = ?1 AND complete = 1", -1, &sweep,
                               NULL)) != SQLITE_OK ||
      (rc = sqlite3_prepare_v2(sql, "SELECT 1 FROM main.runs WHERE source_sha256 = ?1", -1, &imported, NULL)) !=
          SQLITE_OK ||
      (rc = sqlite3_prepare_v2(sql,
                               "SELECT 1 FROM main.runs WHERE repeat_group = ?1 AND repeat_index IS ?2 AND "
                               "config_hash IS ?3",
                               -1, &repeat, NULL)) != SQLITE_OK ||
      (rc = sqlite3_prepare_v2(sql, ins.p, -1, &insert, NULL)) != SQLITE_OK ||
      (rc = sqlite3_prepare_v2(sql, "INSERT INTO temp.ferry_runmap(src, dst) VALUES (?1, ?2)", -1, &map, NULL)) !=
          SQLITE_OK)
    goto out;
  while ((rc = sqlite3_step(runs)) == SQLITE_ROW) {
    const int64_t id = sqlite3_column_int64(runs, 0);
    enum dup why = DUP_NONE;
    /* the same run: every field a run's writer sets, to the millisecond and the process */
    static const int same_cols[10] = {2, 3, 4, 5, 1, 6, 8, 9, 11, 12};
    for (int k = 0; k < 10; k++) sqlite3_bind_value(same, k + 1, sqlite3_column_value(runs, same_cols[k]));
    if ((rc = step_done(same)) == SQLITE_ROW) why = DUP_SAME_RUN;
    sqlite3_reset(same);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) goto out;
    const int complete = sqlite3_column_int(runs, 6);
    if (!why && complete && sqlite3_column_type(runs, 7) != SQLITE_NULL) {
      sqlite3_bind_value(sweep, 1, sqlite3_column_value(runs, 7));
      if ((rc = step_done(sweep)) == SQLITE_ROW) why = DUP_SWEEP;
      sqlite3_reset(sweep);
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) goto out;
    }
    if (!why && sqlite3_column_type(runs, 10) != SQLITE_NULL) {
      sqlite3_bind_value(imported, 1, sqlite3_column_value(runs, 10));
      if ((rc = step_done(imported)) == SQLITE_ROW) why = DUP_IMPORT;
      sqlite3_reset(imported);
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) goto out;
    }
    if (!why && sqlite3_column_type(runs, 8) != SQLITE_NULL) {
      sqlite3_bind_value(repeat, 1, sqlite3_column_value(runs, 8));
      sqlite3_bind_value(repeat, 2, sqlite3_column_value(runs, 9));
      sqlite3_bind_value(repeat, 3, sqlite3_column_value(runs, 5));
      if ((rc = step_done(repeat)) == SQLITE_ROW) why = DUP_REPEAT;
      sqlite3_reset(repeat);
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) goto out;
    }
    switch (why) {
    case DUP_SAME_RUN: stats->same_run++; continue;
    case DUP_SWEEP: stats->same_sweep_key++; continue;
    case DUP_IMPORT: stats->same_import++; continue;
    case DUP_REPEAT: stats->same_repetition++; continue;
    case DUP_NONE: break;
    }
    sqlite3_bind_int64(insert, 1, id);
    rc = sqlite3_step(insert);
    sqlite3_reset(insert);
    if (rc != SQLITE_DONE) goto out;
    sqlite3_bind_int64(map, 1, id);
    sqlite3_bind_int64(map, 2, sqlite3_last_insert_rowid(sql));
    rc = sqlite3_step(map);
    sqlite3_reset(map);
    if (rc != SQLITE_DONE) goto out;
    stats->runs_added++;
  }
  if (rc == SQLITE_DONE) rc = SQLITE_OK;
out:
  sqlite3_finalize(runs);
  sqlite3_finalize(same);
  sqlite3_finalize(sweep);
  sqlite3_finalize(imported);
  sqlite3_finalize(repeat);
  sqlite3_finalize(insert);
  sqlite3_finalize(map);
  ferry_free(sel.p);
  ferry_free(ins.p);
  ferry_free(list.p);
  return rc;
}

/* Copy the rows of the copied runs from one table keyed by runId. `table` is a name from the
 * destination's own schema (never one read from the source). */
static int copy_rows(sqlite3 *sql, const char *table, int64_t *rows) {
  struct ferry__cols dst, src;
  int rc = ferry__cols_read(sql, "main", table, &dst);
  if (rc == SQLITE_OK) rc = ferry__cols_read(sql, "src", table, &src);
  if (rc != SQLITE_OK || src.n == 0 || ferry__cols_find(&src, "runId") < 0) return rc;
  struct ferry_strbuf ins = {0}, sel = {0};
  ferry__sb_printf(&ins, "INSERT INTO main.\"%s\"(runId", table);
  ferry__sb_printf(&sel, " SELECT m.dst");
  for (int i = 0; i < dst.n; i++) {
    const char *col = dst.names[i];
    if (!strcmp(col, "runId")) continue;
    if (ferry__cols_find(&src, col) < 0) {
      if (!dst.notnull[i] || dst.has_default[i]) continue; /* NULL or the column's default */
      ferry__sb_printf(&ins, ",\"%s\"", col);
      ferry__sb_printf(&sel, ",0");
      continue;
    }
    ferry__sb_printf(&ins, ",\"%s\"", col);
    if (ferry__col_is_string_ref(table, col))
      ferry__sb_printf(&sel, ",CASE WHEN x.\"%s\" IS NULL THEN NULL ELSE (SELECT dst FROM temp.ferry_strmap WHERE src = x.\"%s\") END",
                       col, col);
    else
      ferry__sb_printf(&sel, ",x.\"%s\"", col);
  }
  ferry__sb_printf(&ins, ")%s FROM src.\"%s\" x JOIN temp.ferry_runmap m ON m.src = x.runId", sel.p ? sel.p : "",
                   table);
  rc = SQLITE_NOMEM;
  if (!ins.oom && !sel.oom) {
    sqlite3_stmt *q;
    rc = sqlite3_prepare_v2(sql, ins.p, -1, &q, NULL);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(q);
      sqlite3_finalize(q);
      if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
        *rows += sqlite3_changes(sql);
      }
    }
  }
  ferry_free(ins.p);
  ferry_free(sel.p);
  return rc;
}

/* quant_quality has no runs: a row is copied unless the destination holds the same report row. */
static int copy_quant_quality(sqlite3 *sql, int64_t *rows) {
  struct ferry__cols dst, src;
  int rc = ferry__cols_read(sql, "main", "quant_quality", &dst);
  if (rc == SQLITE_OK) rc = ferry__cols_read(sql, "src", "quant_quality", &src);
  if (rc != SQLITE_OK || src.n == 0 || dst.n == 0) return rc;
  struct ferry_strbuf list = {0}, q = {0};
  for (int i = 0; i < dst.n; i++)
    if (strcmp(dst.names[i], "id") && ferry__cols_find(&src, dst.names[i]) >= 0)
      ferry__sb_printf(&list, "%s\"%s\"", list.len ? "," : "", dst.names[i]);
  ferry__sb_printf(&q,
                   "INSERT INTO main.quant_quality(%s) SELECT %s FROM src.quant_quality x WHERE NOT EXISTS (SELECT 1 "
                   "FROM main.quant_quality y WHERE y.created_at IS x.created_at AND y.output IS x.output AND y.plan "
                   "IS x.plan AND y.class IS x.class AND y.format IS x.format)",
                   list.p ? list.p : "", list.p ? list.p : "");
  rc = SQLITE_NOMEM;
  if (!list.oom && !q.oom && list.p) {
    rc = exec_sql(sql, q.p);
    if (rc == SQLITE_OK) *rows += sqlite3_changes(sql);
  }
  ferry_free(list.p);
  ferry_free(q.p);
  return rc;
}

/* The destination's tables that hold per-run rows (a runId column), by name. */
static int run_tables(sqlite3 *sql, char (*names)[64], int max, int *n) {
  sqlite3_stmt *q;
  *n = 0;
  int rc = sqlite3_prepare_v2(sql,
                              "SELECT name FROM main.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                              "AND name <> 'runs' ORDER BY name",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW && *n < max) {
    const char *name = (const char *)sqlite3_column_text(q, 0);
    if (name && strlen(name) < 64) snprintf(names[(*n)++], 64, "%s", name);
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) return rc;
  /* keep those with a runId column */
  int k = 0;
  for (int i = 0; i < *n; i++) {
    struct ferry__cols c;
    if ((rc = ferry__cols_read(sql, "main", names[i], &c)) != SQLITE_OK) return rc;
    if (ferry__cols_find(&c, "runId") >= 0) memmove(names[k++], names[i], 64);
  }
  *n = k;
  return SQLITE_OK;
}

static int same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

ferry_status ferry_db_merge(ferry_db *db, const char *src_path, struct ferry_db_merge_stats *stats) {
  if (!db || !src_path || !stats) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_merge: NULL argument");
  memset(stats, 0, sizeof *stats);
  if (db->read_only) return ferry__err_set(&db->err, FERRY_ERR_INVALID, "%s: opened read-only", db->path);
  if (same_file(src_path, db->path))
    return ferry__err_set(&db->err, FERRY_ERR_INVALID, "%s: cannot merge a database into itself", src_path);
  /* the source is checked the way every reader checks a database: a ferry database no newer
   * than this build (an older one is read as it is: the columns it lacks are NULL) */
  sqlite3 *probe = NULL;
  int version = 0;
  ferry_status st = ferry__sqlite_open_read(src_path, FERRY_DB_APPLICATION_ID, FERRY_DB_SCHEMA_VERSION, &probe, &version,
                                            &db->err);
  sqlite3_close_v2(probe);
  if (st != FERRY_OK) return st;
  char *uri = ferry__sqlite_file_uri(src_path, "mode=ro");
  if (!uri) return ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory", src_path);

  /* rows of the destination's own runs still pending go first */
  if ((st = ferry__db_flush(db)) != FERRY_OK) {
    ferry_free(uri);
    return st;
  }
  pthread_mutex_lock(&db->write_mu);
  const char *what;
  sqlite3_stmt *q = NULL;
  what = "attaching the source";
  int rc = sqlite3_prepare_v2(db->sql, "ATTACH ?1 AS src", -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(q, 1, uri, -1, SQLITE_STATIC);
    rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) {
    st = ferry__db_sqlite_error(db->sql, rc, src_path, what, &db->err);
    goto out_unlock;
  }
  struct ferry__cols dst_runs, src_runs;
  what = "reading the runs table";
  if ((rc = ferry__cols_read(db->sql, "main", "runs", &dst_runs)) != SQLITE_OK ||
      (rc = ferry__cols_read(db->sql, "src", "runs", &src_runs)) != SQLITE_OK)
    goto out_sqlite;
  const struct run_cols cols = {
      .sweep_key = ferry__cols_find(&src_runs, "sweep_key") >= 0 ? "sweep_key" : "NULL",
      .repeat_group = ferry__cols_find(&src_runs, "repeat_group") >= 0 ? "repeat_group" : "NULL",
      .repeat_index = ferry__cols_find(&src_runs, "repeat_index") >= 0 ? "repeat_index" : "NULL",
      .source_sha256 = ferry__cols_find(&src_runs, "source_sha256") >= 0 ? "source_sha256" : "NULL"};
  what = "starting the merge transaction";
  if ((rc = exec_sql(db->sql, "BEGIN IMMEDIATE")) != SQLITE_OK) goto out_sqlite;
  what = "preparing the id maps";
  if ((rc = exec_sql(db->sql,
                     "CREATE TEMP TABLE IF NOT EXISTS ferry_runmap(src INTEGER PRIMARY KEY, dst INTEGER);"
                     "DELETE FROM temp.ferry_runmap;"
                     "CREATE TEMP TABLE IF NOT EXISTS ferry_strmap(src INTEGER PRIMARY KEY, dst INTEGER);"
                     "DELETE FROM temp.ferry_strmap;")) != SQLITE_OK)
    goto out_rollback;
  what = "copying runs";
  if ((rc = copy_runs(db->sql, &dst_runs, &src_runs, &cols, stats)) != SQLITE_OK) goto out_rollback;
  what = "remapping StringIds";
  if ((rc = exec_sql(db->sql,
                     "INSERT OR IGNORE INTO main.StringIds(value) SELECT value FROM src.StringIds WHERE value IS NOT "
                     "NULL;"
                     "INSERT OR IGNORE INTO temp.ferry_strmap SELECT s.id, m.id FROM src.StringIds s"
                     " JOIN main.StringIds m ON m.value = s.value;")) != SQLITE_OK)
    goto out_rollback;
  char tables[64][64];
  int nt;
  what = "listing tables";
  if ((rc = run_tables(db->sql, tables, 64, &nt)) != SQLITE_OK) goto out_rollback;
  for (int i = 0; i < nt; i++) {
    what = tables[i];
    if ((rc = copy_rows(db->sql, tables[i], &stats->rows_added)) != SQLITE_OK) goto out_rollback;
  }
  what = "quant_quality";
  if ((rc = copy_quant_quality(db->sql, &stats->rows_added)) != SQLITE_OK) goto out_rollback;
  what = "committing the merge";
  if ((rc = exec_sql(db->sql, "DELETE FROM temp.ferry_runmap; DELETE FROM temp.ferry_strmap; COMMIT")) != SQLITE_OK)
    goto out_rollback;
  goto out_detach;

out_rollback: {
  char w[160];
  snprintf(w, sizeof w, "merging (%.63s)", what);
  st = ferry__db_sqlite_error(db->sql, rc, rc == SQLITE_FULL ? db->path : src_path, w, &db->err);
  exec_sql(db->sql, "ROLLBACK");
  memset(stats, 0, sizeof *stats);
  goto out_detach;
}
out_sqlite:
  st = ferry__db_sqlite_error(db->sql, rc, src_path, what, &db->err);
out_detach:
  exec_sql(db->sql, "DETACH src");
out_unlock:
  pthread_mutex_unlock(&db->write_mu);
  ferry_free(uri);
  return st;
}
