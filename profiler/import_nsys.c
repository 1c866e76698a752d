/* Import of an Nsight Systems SQLite export (`nsys export --type sqlite`) as a run of kind
 * nsys-import. The export is attached read-only; each timeline table is copied with one
 * INSERT ... SELECT built from PRAGMA table_info of both sides, so known column variants
 * (demangledName vs name, NVTX text vs textId, missing optional columns) are accepted and
 * string ids are remapped into this database's StringIds. All or nothing: one transaction. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/alloc.h"
#include "common/sha256.h"
#include "common/sqlite_read.h"
#include "common/strbuf.h"
#include "ferry/activity.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h"
#include "profiler/table_cols.h"

/* Source column for a target column: the same name, or a known older/other variant. */
static const char *source_col(const struct ferry__cols *src, const char *col) {
  if (ferry__cols_find(src, col) >= 0) return col;
  static const char *const alts[][3] = {
      {"demangledName", "name", NULL},
      {"shortName", "demangledName", "name"},
      {"globalPid", "globalTid", NULL},
  };
  for (size_t i = 0; i < sizeof alts / sizeof alts[0]; i++)
    if (!strcmp(alts[i][0], col))
      for (int k = 1; k < 3 && alts[i][k]; k++)
        if (ferry__cols_find(src, alts[i][k]) >= 0) return alts[i][k];
  return NULL;
}


/* Copy one table. Target columns come from this database's schema (constant names), so no
 * name read from the export is ever spliced into SQL. */
static ferry_status copy_table(struct ferry_db *db, const char *export_path, const char *table, int64_t run_id,
                               int64_t *copied) {
  struct ferry__cols dst, src;
  int rc = ferry__cols_read(db->sql, "main", table, &dst);
  if (rc == SQLITE_OK) rc = ferry__cols_read(db->sql, "nsys", table, &src);
  if (rc != SQLITE_OK) return ferry__db_sqlite_error(db->sql, rc, export_path, table, &db->err);
  *copied = 0;
  if (src.n == 0) return FERRY_OK; /* optional table absent: nsys creates tables lazily */
  int timeline = strncmp(table, "CUPTI_", 6) == 0 || !strcmp(table, "NVTX_EVENTS");
  if (timeline && ferry__cols_find(&src, "start") < 0)
    return ferry__err_set(&db->err, FERRY_ERR_FORMAT, "%s: table %s has no column start", export_path, table);
  if (!strcmp(table, "CUPTI_ACTIVITY_KIND_KERNEL") && !source_col(&src, "shortName"))
    return ferry__err_set(&db->err, FERRY_ERR_FORMAT,
                          "%s: table %s has no kernel name column (demangledName, shortName or name)",
                          export_path, table);

  struct ferry_strbuf ins = {0}, sel = {0};
  ferry__sb_printf(&ins, "INSERT INTO main.%s(runId", table);
  ferry__sb_printf(&sel, " SELECT ?1");
  for (int i = 0; i < dst.n; i++) {
    const char *col = dst.names[i];
    if (!strcmp(col, "runId")) continue;
    const char *from = source_col(&src, col);
    if (!from) {
      if (!dst.notnull[i] || dst.has_default[i]) continue; /* NULL or the column default */
      ferry__sb_printf(&ins, ",\"%s\"", col);
      ferry__sb_printf(&sel, ",0");
      continue;
    }
    ferry__sb_printf(&ins, ",\"%s\"", col);
    if (ferry__col_is_string_ref(table, col) && (strcmp(col, "nameId") || !strcmp(table, "CUPTI_ACTIVITY_KIND_RUNTIME")))
      ferry__sb_printf(&sel, ",%s(SELECT dst FROM temp.ferry_strmap WHERE src = x.\"%s\")%s", dst.notnull[i] ? "coalesce(" : "",
             from, dst.notnull[i] ? ",0)" : "");
    else if (dst.notnull[i])
      ferry__sb_printf(&sel, ",coalesce(x.\"%s\",0)", from);
    else
      ferry__sb_printf(&sel, ",x.\"%s\"", from);
  }
  ferry__sb_printf(&ins, ")%s FROM nsys.%s x", sel.p ? sel.p : "", table);
  ferry_status st = FERRY_OK;
  if (ins.oom || sel.oom) {
    st = ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory", export_path);
    goto out_free;
  }
  sqlite3_stmt *q;
  rc = sqlite3_prepare_v2(db->sql, ins.p, -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, run_id);
    rc = sqlite3_step(q);
    sqlite3_finalize(q);
  }
  if (rc != SQLITE_DONE && rc != SQLITE_OK) {
    char what[128];
    snprintf(what, sizeof what, "copying table %s", table);
    st = ferry__db_sqlite_error(db->sql, rc, export_path, what, &db->err);
  } else {
    *copied = sqlite3_changes(db->sql);
  }
out_free:
  ferry_free(ins.p);
  ferry_free(sel.p);
  return st;
}

static int exec1(sqlite3 *sql, const char *text, int64_t arg) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(sql, text, -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_int64(q, 1, arg);
  rc = sqlite3_step(q);
  sqlite3_finalize(q);
  return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static const char *const copied_tables[] = {
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",          "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS",
    "TARGET_INFO_GPU",             "TARGET_INFO_SESSION_START_TIME",      "META_DATA_EXPORT",
};
static const char *const required_tables[] = {"META_DATA_EXPORT", "StringIds", "CUPTI_ACTIVITY_KIND_KERNEL"};

ferry_status ferry_db_import_nsys(ferry_db *db, const char *export_path, const struct ferry_run_info *info,
                                  int64_t *run_id) {
  if (!db || !export_path || !run_id) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_import_nsys: NULL argument");
  if (db->read_only) return ferry__err_set(&db->err, FERRY_ERR_INVALID, "%s: opened read-only", db->path);
  struct stat sb;
  if (stat(export_path, &sb) != 0)
    return ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: no such file", export_path);
  if (!S_ISREG(sb.st_mode))
    return ferry__err_set(&db->err, FERRY_ERR_IO, "%s: not a regular file", export_path);
  /* the same file imported again is the same run: found by its digest */
  char sha[65];
  ferry_status st = ferry__sha256_file(export_path, sha, &db->err);
  if (st != FERRY_OK) return st;
  char *uri = ferry__sqlite_file_uri(export_path, "mode=ro");
  if (!uri) return ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory", export_path);

  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db->sql, "SELECT id FROM runs WHERE source_sha256 = ?1", -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(q, 1, sha, -1, SQLITE_STATIC);
    rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
      *run_id = sqlite3_column_int64(q, 0);
      st = ferry__err_set(&db->err, FERRY_ERR_EXISTS, "%s: already imported as run %lld (same SHA-256 %.12s...)",
                          export_path, (long long)*run_id, sha);
    } else if (rc != SQLITE_DONE) {
      st = ferry__db_sqlite_error(db->sql, rc, db->path, "looking up the export's digest", &db->err);
    }
  } else {
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "looking up the export's digest", &db->err);
  }
  sqlite3_finalize(q);
  q = NULL;
  if (st != FERRY_OK) goto out_unlock;
  rc = sqlite3_prepare_v2(db->sql, "ATTACH ?1 AS nsys", -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(q, 1, uri, -1, SQLITE_STATIC);
    rc = sqlite3_step(q);
  }
  sqlite3_finalize(q);
  q = NULL;
  if (rc != SQLITE_DONE) {
    st = ferry__db_sqlite_error(db->sql, rc, export_path, "cannot open the export", &db->err);
    goto out_unlock;
  }

  /* Validate before writing anything. */
  for (size_t i = 0; i < sizeof required_tables / sizeof required_tables[0]; i++) {
    struct ferry__cols c;
    rc = ferry__cols_read(db->sql, "nsys", required_tables[i], &c);
    if (rc != SQLITE_OK) {
      if ((rc & 0xff) == SQLITE_NOTADB)
        st = ferry__err_set(&db->err, FERRY_ERR_FORMAT, "%s: not an SQLite file (expected an nsys SQLite export)",
                            export_path);
      else
        st = ferry__db_sqlite_error(db->sql, rc, export_path, "reading the export's tables", &db->err);
      goto out_detach;
    }
    if (c.n == 0) {
      st = ferry__err_set(&db->err, FERRY_ERR_FORMAT,
                          "%s: not an Nsight Systems export: required table %s is missing", export_path,
                          required_tables[i]);
      goto out_detach;
    }
    if (!strcmp(required_tables[i], "StringIds") && (ferry__cols_find(&c, "id") < 0 || ferry__cols_find(&c, "value") < 0)) {
      st = ferry__err_set(&db->err, FERRY_ERR_FORMAT, "%s: table StringIds lacks column id or value", export_path);
      goto out_detach;
    }
    if (!strcmp(required_tables[i], "META_DATA_EXPORT") && (ferry__cols_find(&c, "name") < 0 || ferry__cols_find(&c, "value") < 0)) {
      st = ferry__err_set(&db->err, FERRY_ERR_FORMAT, "%s: table META_DATA_EXPORT lacks column name or value",
                          export_path);
      goto out_detach;
    }
  }
  /* EXPORT_SCHEMA_VERSION ("3.16.1"), or its parts (_MAJOR, _MINOR, _MICRO or _PATCH) in some
   * versions; the product version where the export names it */
  char product[64] = "", schema[64] = "", part[3][24] = {"", "", ""}, gpu[256] = "";
  rc = sqlite3_prepare_v2(db->sql, "SELECT name, value FROM nsys.META_DATA_EXPORT", -1, &q, NULL);
  while (rc == SQLITE_OK || rc == SQLITE_ROW) {
    if ((rc = sqlite3_step(q)) != SQLITE_ROW) break;
    const char *n = (const char *)sqlite3_column_text(q, 0), *v = (const char *)sqlite3_column_text(q, 1);
    if (!n || !v) continue;
    if (!strcmp(n, "EXPORT_PRODUCT_VERSION")) snprintf(product, sizeof product, "%s", v);
    if (!strcmp(n, "EXPORT_SCHEMA_VERSION")) snprintf(schema, sizeof schema, "%s", v);
    if (!strcmp(n, "EXPORT_SCHEMA_VERSION_MAJOR")) snprintf(part[0], sizeof part[0], "%s", v);
    if (!strcmp(n, "EXPORT_SCHEMA_VERSION_MINOR")) snprintf(part[1], sizeof part[1], "%s", v);
    if (!strcmp(n, "EXPORT_SCHEMA_VERSION_MICRO") || !strcmp(n, "EXPORT_SCHEMA_VERSION_PATCH"))
      snprintf(part[2], sizeof part[2], "%s", v);
  }
  if (!schema[0] && part[0][0])
    snprintf(schema, sizeof schema, "%.20s%s%.20s%s%.20s", part[0], part[1][0] ? "." : "", part[1],
             part[2][0] ? "." : "", part[2]);
  sqlite3_finalize(q);
  q = NULL;
  if (rc != SQLITE_DONE && rc != SQLITE_OK) {
    st = ferry__db_sqlite_error(db->sql, rc, export_path, "reading META_DATA_EXPORT", &db->err);
    goto out_detach;
  }
  struct ferry__cols gc;
  if (ferry__cols_read(db->sql, "nsys", "TARGET_INFO_GPU", &gc) == SQLITE_OK && ferry__cols_find(&gc, "name") >= 0 &&
      sqlite3_prepare_v2(db->sql, "SELECT name FROM nsys.TARGET_INFO_GPU WHERE name IS NOT NULL LIMIT 1", -1, &q,
                         NULL) == SQLITE_OK) {
    if (sqlite3_step(q) == SQLITE_ROW) snprintf(gpu, sizeof gpu, "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    q = NULL;
  }

  char notes[512], started[32];
  const char *base = strrchr(export_path, '/');
  base = base ? base + 1 : export_path;
  snprintf(notes, sizeof notes, "imported from the Nsight Systems export %.200s (%s%s%s%s%s), sha256 %.16s", base,
           schema[0] ? "export schema " : "export schema unknown", schema, product[0] ? ", " : "",
           product[0] ? "nsys " : "", product, sha);
  for (char *c = notes; *c; c++)
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
  {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &tm);
  }
  const char *what = "starting the import transaction";
  if ((rc = sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL)) != SQLITE_OK) goto out_sqlite;
  what = "inserting the run row";
  rc = sqlite3_prepare_v2(db->sql,
                          "INSERT INTO runs(kind,started_at,finished_at,complete,model,hardware,trace,config_json,"
                          "config_hash,ferry_version,git_rev,notes,source_sha256)"
                          " VALUES('nsys-import',?1,?1,1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
                          -1, &q, NULL);
  if (rc != SQLITE_OK) goto out_rollback;
  sqlite3_bind_text(q, 1, started, -1, SQLITE_TRANSIENT);
  const char *fields[] = {info ? info->model : NULL,       info && info->hardware ? info->hardware : (gpu[0] ? gpu : NULL),
                          info && info->trace ? info->trace : export_path, info ? info->config_json : NULL,
                          info ? info->config_hash : NULL, NULL, info ? info->git_rev : NULL,
                          info && info->notes ? info->notes : notes};
  for (int i = 0; i < 8; i++) {
    if (i == 5)
      sqlite3_bind_text(q, 7, FERRY_VERSION, -1, SQLITE_STATIC);
    else if (fields[i])
      sqlite3_bind_text(q, i + 2, fields[i], -1, SQLITE_TRANSIENT);
  }
  sqlite3_bind_text(q, 10, sha, -1, SQLITE_TRANSIENT);
  rc = sqlite3_step(q);
  sqlite3_finalize(q);
  q = NULL;
  if (rc != SQLITE_DONE) goto out_rollback;
  int64_t id = sqlite3_last_insert_rowid(db->sql);

  what = "remapping StringIds";
  if ((rc = sqlite3_exec(db->sql,
                         "INSERT OR IGNORE INTO main.StringIds(value) SELECT value FROM nsys.StringIds WHERE value IS NOT NULL;"
                         "CREATE TEMP TABLE IF NOT EXISTS ferry_strmap(src INTEGER PRIMARY KEY, dst INTEGER);"
                         "DELETE FROM temp.ferry_strmap;"
                         "INSERT OR IGNORE INTO temp.ferry_strmap SELECT s.id, m.id FROM nsys.StringIds s"
                         " JOIN main.StringIds m ON m.value = s.value;",
                         NULL, NULL, NULL)) != SQLITE_OK)
    goto out_rollback;
  for (size_t i = 0; i < sizeof copied_tables / sizeof copied_tables[0]; i++) {
    int64_t n;
    if ((st = copy_table(db, export_path, copied_tables[i], id, &n)) != FERRY_OK) {
      sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
      goto out_detach;
    }
  }
  /* ferry's own NVTX ranges (domain "ferry": "step N", "layer LN", "block fetch LN",
   * "expert fetch LN EM", the step as int64 payload) get their step, layer and expert columns
   * back, as a run recorded by ferry itself has them */
  what = "attributing ferry's NVTX ranges";
  if ((rc = exec1(db->sql,
                  "UPDATE main.NVTX_EVENTS AS n SET"
                  " step = CASE WHEN t.txt GLOB 'step [0-9]*' THEN CAST(substr(t.txt, 6) AS INTEGER)"
                  "             ELSE n.int64Value END,"
                  " layer = CASE WHEN t.txt GLOB 'layer L[0-9]*' THEN CAST(substr(t.txt, 8) AS INTEGER)"
                  "              WHEN t.txt GLOB 'block fetch L[0-9]*' THEN CAST(substr(t.txt, 14) AS INTEGER)"
                  "              WHEN t.txt GLOB 'expert fetch L[0-9]*' THEN CAST(substr(t.txt, 15) AS INTEGER) END,"
                  " expert = CASE WHEN t.txt GLOB 'expert fetch L[0-9]* E[0-9]*'"
                  "               THEN CAST(substr(t.txt, instr(t.txt, ' E') + 2) AS INTEGER) END"
                  " FROM (SELECT e.rowid AS rid, coalesce(e.text, s.value) AS txt FROM main.NVTX_EVENTS e"
                  "       LEFT JOIN main.StringIds s ON s.id = e.textId WHERE e.runId = ?1) t"
                  " WHERE n.rowid = t.rid AND n.eventType <> 75 AND n.domainId IN"
                  "  (SELECT e.domainId FROM main.NVTX_EVENTS e LEFT JOIN main.StringIds s ON s.id = e.textId"
                  "   WHERE e.runId = ?1 AND e.eventType = 75 AND coalesce(e.text, s.value) = '" FERRY_NVTX_DOMAIN "')",
                  id)) != SQLITE_OK)
    goto out_rollback;
  what = "committing the import";
  if ((rc = exec1(db->sql, "DELETE FROM temp.ferry_strmap WHERE ?1 = ?1", 0)) != SQLITE_OK) goto out_rollback;
  if ((rc = sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL)) != SQLITE_OK) goto out_rollback;
  *run_id = id;
  goto out_detach;

out_rollback:
  st = ferry__db_sqlite_error(db->sql, rc, rc == SQLITE_FULL ? db->path : export_path, what, &db->err);
  sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
  goto out_detach;
out_sqlite:
  st = ferry__db_sqlite_error(db->sql, rc, db->path, what, &db->err);
out_detach:
  sqlite3_exec(db->sql, "DETACH nsys", NULL, NULL, NULL);
out_unlock:
  pthread_mutex_unlock(&db->write_mu);
  ferry_free(uri);
  return st;
}
