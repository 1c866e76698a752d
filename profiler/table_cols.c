/* PRAGMA table_info readers shared by the import of Nsight Systems exports and the merge of
 * result databases (table_cols.h). */
#include <stdio.h>
#include <string.h>

#include "profiler/table_cols.h"

int ferry__cols_find(const struct ferry__cols *c, const char *name) {
  for (int i = 0; i < c->n; i++)
    if (!strcmp(c->names[i], name)) return i;
  return -1;
}

int ferry__cols_read(sqlite3 *sql, const char *schema, const char *table, struct ferry__cols *c) {
  char text[160];
  snprintf(text, sizeof text, "PRAGMA %s.table_info(\"%s\")", schema, table);
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(sql, text, -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  c->n = 0;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const char *name = (const char *)sqlite3_column_text(q, 1);
    if (!name || c->n >= FERRY__MAX_COLS || strlen(name) >= sizeof c->names[0]) continue; /* not ours */
    snprintf(c->names[c->n], sizeof c->names[0], "%s", name);
    c->notnull[c->n] = sqlite3_column_int(q, 3);
    c->has_default[c->n] = sqlite3_column_type(q, 4) != SQLITE_NULL;
    c->n++;
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

int ferry__col_is_string_ref(const char *table, const char *col) {
  if (!strcmp(col, "demangledName") || !strcmp(col, "shortName") || !strcmp(col, "mangledName") ||
      !strcmp(col, "textId") || !strcmp(col, "jsonTextId"))
    return 1;
  /* nsys names runtime calls by nameId; ferry also names its copies, memsets and syncs */
  return !strcmp(col, "nameId") && (!strcmp(table, "CUPTI_ACTIVITY_KIND_RUNTIME") || !strcmp(table, "CUPTI_ACTIVITY_KIND_MEMCPY") ||
                                     !strcmp(table, "CUPTI_ACTIVITY_KIND_MEMSET") ||
                                     !strcmp(table, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"));
}
