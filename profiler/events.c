/* engine_events rows (schema version 5): memory-pressure transitions, reloads, I/O retries,
 * device failures and refused requests of a run, each written at once (they are few, and a
 * run that dies next should still have them). */
#include <math.h>
#include <string.h>

#include "profiler/db_internal.h"
#include "profiler/schema.h"

static int one_of(const char *v, const char *const *list) {
  for (; *list; list++)
    if (!strcmp(v, *list)) return 1;
  return 0;
}

ferry_status ferry_db_add_event(ferry_db *db, int64_t run_id, const struct ferry_event_row *row) {
  if (!db || !row) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_add_event: NULL argument");
  if (db->read_only)
    return ferry__err_set(&db->err, FERRY_ERR_INVALID, "%s: ferry_db_add_event: database opened read-only", db->path);
  static const char *const kinds[] = {"pressure", "reload", "io", "device", "refused", NULL};
  static const char *const tiers[] = {"device", "host", "disk", NULL};
  if (!row->kind || !one_of(row->kind, kinds) || (row->tier && !one_of(row->tier, tiers)) || !row->action)
    return ferry__err_set(&db->err, FERRY_ERR_INVALID,
                          "ferry_db_add_event: kind '%s' or tier '%s' is not one the schema knows, or no action",
                          row->kind ? row->kind : "(null)", row->tier ? row->tier : "(null)");
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *ins = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "INSERT INTO engine_events(runId, t_ns, kind, tier, pressure_index, level, action, detail, "
                              "budget_bytes) SELECT id, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9 FROM runs WHERE id = ?1",
                              -1, &ins, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(ins, 1, run_id);
    sqlite3_bind_int64(ins, 2, row->t_ns);
    sqlite3_bind_text(ins, 3, row->kind, -1, SQLITE_TRANSIENT);
    if (row->tier) sqlite3_bind_text(ins, 4, row->tier, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(ins, 4);
    if (isfinite(row->pressure_index)) sqlite3_bind_double(ins, 5, row->pressure_index);
    else sqlite3_bind_null(ins, 5);
    if (row->level >= 0) sqlite3_bind_int(ins, 6, row->level);
    else sqlite3_bind_null(ins, 6);
    sqlite3_bind_text(ins, 7, row->action, -1, SQLITE_TRANSIENT);
    if (row->detail) sqlite3_bind_text(ins, 8, row->detail, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(ins, 8);
    if (row->budget_bytes) sqlite3_bind_int64(ins, 9, (sqlite3_int64)(row->budget_bytes > INT64_MAX ? INT64_MAX : row->budget_bytes));
    else sqlite3_bind_null(ins, 9);
    rc = sqlite3_step(ins);
  }
  sqlite3_finalize(ins);
  ferry_status st = FERRY_OK;
  if (rc != SQLITE_DONE)
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "writing an engine event", &db->err);
  else if (sqlite3_changes(db->sql) == 0)
    st = ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: no run %lld", db->path, (long long)run_id);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}
