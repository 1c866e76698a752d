/* Per-replica figures of a data-parallel run (ferry run|sim --replicas R): what each replica
 * served, from requests.replica and steps.replica (schema 9). A database older than that has
 * no such columns: its runs have no replicas to show. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h" /* ferry__db_sqlite_error */

/* TTFT over requests with a first token, TPOT over those with more than one token and a finish
 * (the database is untrusted: SQLite turns an overflowing difference into a real, no crash). */
static const char replica_sql[] =
    "SELECT replica, count(*), sum(output_tokens),"
    " avg(CASE WHEN first_token_ns >= arrival_ns THEN first_token_ns - arrival_ns END),"
    " avg(CASE WHEN output_tokens > 1 AND finish_ns >= first_token_ns AND first_token_ns >= 0"
    "     THEN (finish_ns - first_token_ns) * 1.0 / (output_tokens - 1) END),"
    " (SELECT count(*) FROM steps s WHERE s.runId = ?1 AND s.replica = r.replica)"
    " FROM requests r WHERE runId = ?1 AND replica IS NOT NULL GROUP BY replica ORDER BY replica";

static ferry_status read_rows(ferry_db *db, int64_t run_id, struct ferry_replica_stats **out, size_t *n) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db->sql, replica_sql, -1, &q, NULL);
  size_t cap = 0;
  ferry_status st = FERRY_OK;
  if (rc == SQLITE_OK) sqlite3_bind_int64(q, 1, run_id);
  while (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? 2 * cap : 8;
      struct ferry_replica_stats *grown = ferry__reallocarray(*out, cap, sizeof *grown);
      if (!grown) {
        st = ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory reading replicas", db->path);
        break;
      }
      *out = grown;
    }
    struct ferry_replica_stats *r = &(*out)[(*n)++];
    r->replica = sqlite3_column_int64(q, 0);
    r->requests = sqlite3_column_int64(q, 1);
    r->output_tokens = sqlite3_column_int64(q, 2);
    r->ttft_mean_ns = sqlite3_column_type(q, 3) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 3);
    r->tpot_mean_ns = sqlite3_column_type(q, 4) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 4);
    r->steps = sqlite3_column_int64(q, 5);
    rc = SQLITE_OK;
  }
  if (st == FERRY_OK && rc != SQLITE_DONE)
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "reading the replicas of a run", &db->err);
  sqlite3_finalize(q);
  return st;
}

ferry_status ferry_db_run_replicas(ferry_db *db, int64_t run_id, struct ferry_replica_stats **out, size_t *n) {
  if (!db || !out || !n) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_run_replicas: NULL argument");
  *out = NULL;
  *n = 0;
  if (db->version < 9) return FERRY_OK; /* before requests.replica */
  pthread_mutex_lock(&db->write_mu);
  const ferry_status st = read_rows(db, run_id, out, n);
  pthread_mutex_unlock(&db->write_mu);
  if (st != FERRY_OK) {
    ferry_free(*out);
    *out = NULL;
    *n = 0;
  }
  return st;
}

void ferry_db_replicas_free(struct ferry_replica_stats *rows) { ferry_free(rows); }
