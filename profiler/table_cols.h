/* The columns of an SQLite table (PRAGMA table_info), for the copies that join two databases
 * with INSERT ... SELECT built from both sides' columns: the Nsight Systems import and the
 * merge of result databases. */
#ifndef FERRY_PROFILER_TABLE_COLS_H
#define FERRY_PROFILER_TABLE_COLS_H

#include <sqlite3.h>

#define FERRY__MAX_COLS 64

struct ferry__cols {
  char names[FERRY__MAX_COLS][48];
  int notnull[FERRY__MAX_COLS];
  int has_default[FERRY__MAX_COLS];
  int n;
};

/* Index of column `name`, or -1. */
int ferry__cols_find(const struct ferry__cols *c, const char *name);

/* PRAGMA schema.table_info(table) into *c; a table that does not exist gives c->n = 0.
 * Returns an SQLite code. `schema` and `table` are spliced into SQL: pass names of this
 * build's own schema or constants only. */
int ferry__cols_read(sqlite3 *sql, const char *schema, const char *table, struct ferry__cols *c);

/* Whether a column holds a StringIds id (kernel names, NVTX text, op names). */
int ferry__col_is_string_ref(const char *table, const char *col);

#endif
