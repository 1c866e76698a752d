/* The registries' shared mechanics (common/registry.h): one way to list, find and add named
 * entries, and one "did you mean" for an unknown name. */
#include <ctype.h>
#include <string.h>

#include "common/error.h"
#include "common/names.h"
#include "common/registry.h"

size_t ferry__registry_count(const struct ferry__registry *r) { return r->n_builtin + r->n_added; }

const void *ferry__registry_at(const struct ferry__registry *r, size_t i) {
  if (i < r->n_builtin) return r->builtin[i];
  return i - r->n_builtin < r->n_added ? r->added[i - r->n_builtin] : NULL;
}

const char *ferry__registry_name(const struct ferry__registry *r, const void *entry) {
  return *(const char *const *)(const void *)((const char *)entry + r->name_offset);
}

const void *ferry__registry_find(const struct ferry__registry *r, const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < ferry__registry_count(r); i++)
    if (!strcmp(ferry__registry_name(r, ferry__registry_at(r, i)), name)) return ferry__registry_at(r, i);
  return NULL;
}

/* Names are what databases store and command lines take: short, lower case. */
static int valid_name(const char *name) {
  size_t n = 0;
  for (; name && name[n]; n++)
    if (!islower((unsigned char)name[n]) && !isdigit((unsigned char)name[n]) && name[n] != '-') return 0;
  return n >= 1 && n <= 15;
}

ferry_status ferry__registry_add(struct ferry__registry *r, const void *entry) {
  const char *name = entry ? ferry__registry_name(r, entry) : NULL;
  if (!valid_name(name))
    return ferry__fail(FERRY_ERR_INVALID, "%s registry: a name is 1-15 of a-z, 0-9 and '-', not '%.32s'", r->what,
                       name ? name : "(null)");
  if (ferry__registry_find(r, name))
    return ferry__fail(FERRY_ERR_EXISTS, "%s registry: '%s' is registered already", r->what, name);
  if (r->n_added == FERRY_REGISTRY_MAX_ADDED)
    return ferry__fail(FERRY_ERR_RANGE, "%s registry: at most %d entries can be added", r->what, FERRY_REGISTRY_MAX_ADDED);
  r->added[r->n_added++] = entry;
  return FERRY_OK;
}

char *ferry__registry_names(const struct ferry__registry *r, char *buf, size_t len) {
  const char *names[64];
  size_t n = 0;
  for (; n < ferry__registry_count(r) && n < 64; n++) names[n] = ferry__registry_name(r, ferry__registry_at(r, n));
  return ferry__join_names(names, n, "", buf, len);
}

ferry_status ferry__registry_unknown(const struct ferry__registry *r, const char *name) {
  const char *names[64], *near[3];
  size_t n = 0;
  for (; n < ferry__registry_count(r) && n < 64; n++) names[n] = ferry__registry_name(r, ferry__registry_at(r, n));
  char all[512], list[256];
  ferry__join_names(names, n, "", all, sizeof all);
  const size_t k = ferry__nearest_names(name ? name : "", names, n, 1, near, 3);
  if (k)
    return ferry__fail(FERRY_ERR_NOT_FOUND, "no %s named '%s'; did you mean %s? (%ss: %s)", r->what, name ? name : "",
                       ferry__join_names(near, k, "", list, sizeof list), r->what, all);
  return ferry__fail(FERRY_ERR_NOT_FOUND, "no %s named '%s' (%ss: %s)", r->what, name ? name : "", r->what, all);
}
