/* Machine-readable output of the commands that print results (`db list/show/diff/stats`, the
 * `run`/`sim` summary): each builds one JSON document (schemas in docs/output-formats.md) and
 * hands it here to be written as JSON, CSV or Markdown; the text form stays each command's own. */
#ifndef FERRY_CLI_OUTPUT_H
#define FERRY_CLI_OUTPUT_H

#include <cjson/cJSON.h>
#include <stdio.h>

enum cli_format { CLI_FORMAT_TEXT, CLI_FORMAT_JSON, CLI_FORMAT_CSV, CLI_FORMAT_MD };

/* --format VALUE: 0, or CLI_USAGE after printing what was expected. */
int cli_parse_format(const char *cmd, const char *text, enum cli_format *out);

/* Write `doc` in `fmt` (not CLI_FORMAT_TEXT). JSON: the document, indented. CSV and Markdown:
 * the array member `rows` of the document as a table, one row per element, the columns the
 * union of the elements' keys in first-seen order with nested objects flattened ("a.b");
 * with rows NULL, the whole document flattened into two columns, key and value. Strings are
 * written without control characters (the database is untrusted and this goes to terminals).
 * Returns 0, or CLI_FAIL after an allocation or write failure. */
int cli_emit(FILE *f, const cJSON *doc, const char *rows, enum cli_format fmt);

/* cJSON helpers that tolerate NULL: a NULL string becomes JSON null. */
void cli_json_str(cJSON *obj, const char *key, const char *value);
/* A number; a non-finite one becomes null (JSON has no NaN or Infinity). */
void cli_json_num(cJSON *obj, const char *key, double value);

#endif
