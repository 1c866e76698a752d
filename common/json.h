/* Strict accessors over cJSON: each names the file and field in its error, and integers are
 * checked to be whole, in range and exactly representable (cJSON stores numbers as double). */
#ifndef FERRY_COMMON_JSON_H
#define FERRY_COMMON_JSON_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "common/error.h"

/* Route cJSON's allocations through ferry's hook; call before building cJSON trees. */
void ferry__json_init(void);

/* Parse a whole buffer as JSON; trailing bytes other than white space are an error. The
 * error message names `what` (usually the file) and the byte offset of the problem. */
ferry_status ferry__json_parse(const char *text, size_t len, const char *what, cJSON **out,
                               struct ferry_err *err);

/* Read a whole file (at most max_bytes) and parse it. */
ferry_status ferry__json_load(const char *path, size_t max_bytes, cJSON **out, struct ferry_err *err);

/* Integer member `key` of obj. Missing: returns FERRY_ERR_NOT_FOUND (no message set) when
 * optional, so the caller can apply a default; otherwise FERRY_ERR_FORMAT naming what/key. */
ferry_status ferry__json_i64(const cJSON *obj, const char *key, int optional, int64_t *out,
                             const char *what, struct ferry_err *err);
ferry_status ferry__json_f64(const cJSON *obj, const char *key, int optional, double *out,
                             const char *what, struct ferry_err *err);
ferry_status ferry__json_bool(const cJSON *obj, const char *key, int optional, int *out,
                              const char *what, struct ferry_err *err);
/* Borrowed string inside obj. */
ferry_status ferry__json_str(const cJSON *obj, const char *key, int optional, const char **out,
                             const char *what, struct ferry_err *err);

/* Room for any finite double as ferry__double_text() writes it. */
#define FERRY_DOUBLE_TEXT_MAX 32

/* A finite v as the fewest significant digits (15, 16 or 17) that read back (strtod) to v. */
void ferry__double_text(double v, char out[FERRY_DOUBLE_TEXT_MAX]);

/* Add number v to obj as key, written with the fewest significant digits (15, 16 or 17) that
 * read back to the same double: cJSON's own printer keeps 15 whenever they come within an epsilon
 * of v, which loses the last bits of some values (a figure written and read back would differ).
 * The item is cJSON_Raw text, so only for a tree that is printed, not one read as a tree
 * (cJSON_IsNumber() is false on it). A non-finite v is added as cJSON adds it (printed null).
 * NULL when out of memory. */
cJSON *ferry__json_add_number(cJSON *obj, const char *key, double v);

/* Whether a cJSON number is an integer in [min, max] (and |v| <= 2^53). */
int ferry__json_is_int(const cJSON *item, double min, double max);

#endif
