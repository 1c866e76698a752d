/* Read-only opening of result databases (see sqlite_read.h). The awkward case is a database in
 * WAL mode that this process may not write beside: SQLite needs a -shm file to read a WAL, and
 * refuses (SQLITE_CANTOPEN) when it cannot create one. Reading it as immutable would silently
 * skip every transaction still in the -wal file, i.e. runs that were committed; instead the
 * WAL index is kept in private memory (exclusive locking mode, which SQLite allows without a
 * -shm file) over the "unix-none" VFS, whose locks cannot fail on a file we may only read. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/sqlite_read.h"

/* A WAL file holds commits when it has at least one frame after its 32-byte header. */
#define WAL_HEADER_BYTES 32

char *ferry__sqlite_file_uri(const char *path, const char *query) {
  size_t n = strlen(path);
  char *u = ferry_malloc(n * 3 + strlen(query) + 8);
  if (!u) return NULL;
  char *w = u + sprintf(u, "file:");
  for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
    if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr("/._-~", *p))
      *w++ = (char)*p;
    else
      w += sprintf(w, "%%%02X", *p);
  }
  sprintf(w, "?%s", query);
  return u;
}

static int pragma_int(sqlite3 *db, const char *sql, int *out) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db, sql, -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  rc = sqlite3_step(q);
  if (rc == SQLITE_ROW) {
    *out = sqlite3_column_int(q, 0);
    rc = SQLITE_OK;
  } else if (rc == SQLITE_DONE) {
    rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  return rc;
}

struct header {
  int version, app_id, tables;
};

/* Open with the URI query and read the header; the connection is kept even on failure (for
 * its message). `pre` runs before the first read. */
static int open_read(const char *path, const char *query, const char *pre, sqlite3 **db, struct header *h) {
  char *uri = ferry__sqlite_file_uri(path, query);
  if (!uri) return SQLITE_NOMEM;
  int rc = sqlite3_open_v2(uri, db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
  ferry_free(uri);
  if (rc != SQLITE_OK) return rc;
  sqlite3_extended_result_codes(*db, 1);
  sqlite3_busy_timeout(*db, 60000); /* a sweep may be writing: wait for its transactions */
  if (pre && (rc = sqlite3_exec(*db, pre, NULL, NULL, NULL)) != SQLITE_OK) return rc;
  if ((rc = pragma_int(*db, "PRAGMA user_version", &h->version)) != SQLITE_OK) return rc;
  if ((rc = pragma_int(*db, "PRAGMA application_id", &h->app_id)) != SQLITE_OK) return rc;
  return pragma_int(*db, "SELECT count(*) FROM sqlite_master", &h->tables);
}

static void close_db(sqlite3 **db) {
  sqlite3_close_v2(*db);
  *db = NULL;
}

ferry_status ferry__sqlite_open_read(const char *path, int app_id, int max_version, sqlite3 **out, int *version,
                                     struct ferry_err *err) {
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0)
    return ferry__err_set(err, errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: no such database (%s)", path,
                          strerror(errno));
  if (S_ISDIR(sb.st_mode)) return ferry__err_set(err, FERRY_ERR_IO, "%s: is a folder, expected a database file", path);
  sqlite3 *db = NULL;
  struct header h = {0, 0, 0};
  int rc = open_read(path, "mode=ro", NULL, &db, &h);
  if ((rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_READONLY) {
    /* WAL mode in a folder we cannot write: no -shm, so no writer is attached */
    char *wal = ferry__asprintf("%s-wal", path);
    if (!wal) {
      close_db(&db);
      return ferry__err_set(err, FERRY_ERR_NOMEM, "%s: out of memory", path);
    }
    struct stat ws;
    int commits = stat(wal, &ws) == 0 && ws.st_size > WAL_HEADER_BYTES;
    close_db(&db);
    h = (struct header){0, 0, 0};
    if (commits)
      rc = open_read(path, "mode=ro&vfs=unix-none", "PRAGMA locking_mode=EXCLUSIVE", &db, &h);
    else
      rc = open_read(path, "mode=ro&immutable=1", NULL, &db, &h); /* nothing in a WAL to miss */
    if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_NOTADB) {
      ferry_status st = ferry__err_set(err, FERRY_ERR_IO,
                                       "%s: cannot read it where it is (%s): the folder is read-only and SQLite needs "
                                       "%s-shm to read the runs committed in %s; copy the database and its -wal file "
                                       "to a writable folder",
                                       path, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc), path, wal);
      ferry_free(wal);
      close_db(&db);
      return st;
    }
    ferry_free(wal);
  }
  ferry_status st = FERRY_OK;
  if ((rc & 0xff) == SQLITE_NOTADB)
    st = ferry__err_set(err, FERRY_ERR_FORMAT, "%s: not a ferry database (not an SQLite file)", path);
  else if ((rc & 0xff) == SQLITE_NOMEM)
    st = ferry__err_set(err, FERRY_ERR_NOMEM, "%s: out of memory opening the database", path);
  else if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
    st = ferry__err_set(err, FERRY_ERR_BUSY, "%s: reading the database header: %s", path, sqlite3_errmsg(db));
  else if (rc != SQLITE_OK)
    st = ferry__err_set(err, (rc & 0xff) == SQLITE_CORRUPT ? FERRY_ERR_FORMAT : FERRY_ERR_IO,
                        "%s: reading the database header: %s", path, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  else if (h.version > max_version)
    st = ferry__err_set(err, FERRY_ERR_SCHEMA, "%s: schema version %d is newer than this build's %d; upgrade ferry",
                        path, h.version, max_version);
  else if (h.version == 0 || h.app_id != app_id)
    st = ferry__err_set(err, FERRY_ERR_FORMAT, "%s: not a ferry database (%s)", path,
                        h.version == 0 && h.tables == 0 ? "empty file"
                        : h.app_id != app_id          ? "an SQLite file with other tables"
                                                      : "no schema version");
  if (st != FERRY_OK) {
    close_db(&db);
    return st;
  }
  *out = db;
  if (version) *version = h.version;
  return FERRY_OK;
}
