/* Opening an SQLite result database for reading: the one way every reader opens one (ferry db
 * list/show/diff/export-trace through ferry_db_open, ferry report, ferry calibrate --db), so
 * they accept and refuse the same files with the same messages. */
#ifndef FERRY_COMMON_SQLITE_READ_H
#define FERRY_COMMON_SQLITE_READ_H

#include <sqlite3.h>

#include "common/error.h"

/* Open path read-only and check its header: PRAGMA application_id must be app_id and PRAGMA
 * user_version in 1..max_version (FERRY_ERR_SCHEMA when newer, FERRY_ERR_FORMAT when not such
 * a database, FERRY_ERR_NOT_FOUND when missing). A WAL database whose folder this process
 * cannot write (no -shm can be made) is still read with the commits in its -wal file: without
 * a -shm file no writer is attached, so the WAL index is built in private memory (no locks);
 * without a -wal file it is read as immutable. *out is the connection (close with
 * sqlite3_close_v2), *version the schema version. */
ferry_status ferry__sqlite_open_read(const char *path, int app_id, int max_version, sqlite3 **out, int *version,
                                     struct ferry_err *err);

/* "file:" URI for a path (percent-encoded) with a query such as "mode=ro"; owned, or NULL. */
char *ferry__sqlite_file_uri(const char *path, const char *query);

#endif
