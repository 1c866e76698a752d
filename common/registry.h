/* Named tables (executors, expert predictors, expert-cache policies): the entries a build has,
 * then those a test or plugin adds at start-up. Each registry is a struct ferry__registry over
 * its own table type; the entry's name is a `const char *` at name_offset. */
#ifndef FERRY_COMMON_REGISTRY_H
#define FERRY_COMMON_REGISTRY_H

#include <stddef.h>

#include "ferry/status.h"

#define FERRY_REGISTRY_MAX_ADDED 16

struct ferry__registry {
  const char *what;                /* "executor", "predictor", ... for messages */
  const void *const *builtin;      /* the build's entries */
  size_t n_builtin;
  size_t name_offset;              /* offsetof(entry type, name) */
  const void *added[FERRY_REGISTRY_MAX_ADDED];
  size_t n_added;
};

size_t ferry__registry_count(const struct ferry__registry *r);
/* The i-th entry (built in first), NULL past the end. */
const void *ferry__registry_at(const struct ferry__registry *r, size_t i);
const char *ferry__registry_name(const struct ferry__registry *r, const void *entry);
/* The entry named `name`, or NULL. */
const void *ferry__registry_find(const struct ferry__registry *r, const char *name);
/* Add an entry: FERRY_ERR_INVALID for a name not of 1-15 of a-z, 0-9, '-'; FERRY_ERR_EXISTS
 * when taken; FERRY_ERR_RANGE when full. Not thread-safe: register at start-up. */
ferry_status ferry__registry_add(struct ferry__registry *r, const void *entry);
/* FERRY_ERR_NOT_FOUND naming the nearest entries, or all of them. */
ferry_status ferry__registry_unknown(const struct ferry__registry *r, const char *name);
/* "a, b or c" of every entry into buf; returns buf. */
char *ferry__registry_names(const struct ferry__registry *r, char *buf, size_t len);

#endif
