/* Result-database schema: the ordered list of migration steps (step i takes a database from
 * user_version i-1 to i) and the function that applies the missing ones. */
#ifndef FERRY_PROFILER_SCHEMA_H
#define FERRY_PROFILER_SCHEMA_H

#include <sqlite3.h>

#include "common/error.h"

#include "ferry/db.h" /* FERRY_DB_APPLICATION_ID */

struct ferry__migration {
  int version;        /* user_version after this step */
  const char *what;   /* one line for messages */
  const char *sql;    /* statements run in the migration transaction */
};

/* The steps, in order; *count receives their number (== FERRY_DB_SCHEMA_VERSION). */
const struct ferry__migration *ferry__db_migrations(int *count);

/* Bring the open database up to `target` (<= the newest step) in one IMMEDIATE transaction.
 * A database newer than this build is FERRY_ERR_SCHEMA and nothing is written. `path` names
 * the file in messages. */
ferry_status ferry__db_migrate(sqlite3 *sql, const char *path, int target, struct ferry_err *err);

/* Translate an SQLite result code (and the connection's message) into a ferry status and a
 * message "path: what: sqlite message". */
ferry_status ferry__db_sqlite_error(sqlite3 *sql, int rc, const char *path, const char *what,
                                    struct ferry_err *err);

#endif
