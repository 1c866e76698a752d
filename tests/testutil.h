/* Helpers shared by the cmocka tests: temporary folders, test-data paths, running the ferry
 * command and capturing its output. */
#ifndef FERRY_TESTUTIL_H
#define FERRY_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the three includes above first. */
#include <cmocka.h>

/* A fresh private folder under $TMPDIR (or /tmp); owned, remove with tu_rmtree + free. */
char *tu_mkdtemp(const char *tag);
void tu_rmtree(const char *path);
/* Path under tests/data (owned). */
char *tu_data_path(const char *name);
/* Path under ../shared (owned), or NULL if shared/ is not present. */
char *tu_shared_path(const char *name);
/* Run `ferry ARGS` (a shell-quoted string) and capture stdout+stderr into an owned string;
 * returns the exit status (or -1). */
int tu_run_ferry(const char *args, char **output);
/* Write a file with the given bytes; asserts on failure. */
void tu_write_file(const char *path, const void *data, size_t len);
/* Whether the text contains the needle (case-sensitive). */
int tu_contains(const char *text, const char *needle);

#endif
