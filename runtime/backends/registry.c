/* The executor registry: every executor this build has, by name, with what it can do. A new
 * executor is its own file (a static const ferry_exec_info beside its backend table), one line
 * in FERRY_EXECUTORS below and one build line; the command line, sweeps, the result database
 * and the help texts then know it. Tests and plugins add theirs with ferry_exec_register(). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "common/names.h"
#include "ferry/exec.h"

/* One line per executor built in, in the order help texts list them. */
#define FERRY_EXECUTORS(X) \
  X(host)                  \
  X(cuda)                  \
  X(sim)

#define DECLARE_(name) extern const struct ferry_exec_info ferry__exec_info_##name;
FERRY_EXECUTORS(DECLARE_)
#undef DECLARE_

static const struct ferry_exec_info *const builtin[] = {
#define ENTRY_(name) &ferry__exec_info_##name,
    FERRY_EXECUTORS(ENTRY_)
#undef ENTRY_
};
#define N_BUILTIN (sizeof builtin / sizeof builtin[0])
#define MAX_REGISTERED 16

static const struct ferry_exec_info *registered[MAX_REGISTERED];
static size_t n_registered;

size_t ferry_exec_registry_count(void) { return N_BUILTIN + n_registered; }

const struct ferry_exec_info *ferry_exec_registry_at(size_t i) {
  if (i < N_BUILTIN) return builtin[i];
  return i - N_BUILTIN < n_registered ? registered[i - N_BUILTIN] : NULL;
}

const struct ferry_exec_info *ferry_exec_registry_find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < ferry_exec_registry_count(); i++)
    if (!strcmp(ferry_exec_registry_at(i)->name, name)) return ferry_exec_registry_at(i);
  return NULL;
}

/* Registry names are what runs.kind stores and the command line takes: short, lower case. */
static int valid_name(const char *name) {
  size_t n = 0;
  for (; name && name[n]; n++)
    if (!islower((unsigned char)name[n]) && !isdigit((unsigned char)name[n]) && name[n] != '-') return 0;
  return n >= 1 && n <= 15;
}

ferry_status ferry_exec_register(const struct ferry_exec_info *info) {
  if (!info || info->version != FERRY_EXEC_INFO_VERSION || !info->open || !valid_name(info->name))
    return ferry__fail(FERRY_ERR_INVALID, "ferry_exec_register: needs version %d, open() and a name of 1-15 of a-z, 0-9, '-'",
                       FERRY_EXEC_INFO_VERSION);
  if (ferry_exec_registry_find(info->name))
    return ferry__fail(FERRY_ERR_EXISTS, "ferry_exec_register: an executor named '%s' is registered already", info->name);
  if (n_registered == MAX_REGISTERED)
    return ferry__fail(FERRY_ERR_RANGE, "ferry_exec_register: at most %d executors can be added", MAX_REGISTERED);
  registered[n_registered++] = info;
  return FERRY_OK;
}

static ferry_status unknown(const char *name) {
  const char *names[N_BUILTIN + MAX_REGISTERED], *near[3];
  const size_t n = ferry_exec_registry_count();
  for (size_t i = 0; i < n; i++) names[i] = ferry_exec_registry_at(i)->name;
  char list[256], all[256];
  const size_t k = ferry__nearest_names(name, names, n, 1, near, 3);
  ferry__join_names(names, n, "", all, sizeof all);
  if (k)
    return ferry__fail(FERRY_ERR_NOT_FOUND, "no executor named '%s'; did you mean %s? (executors: %s)", name,
                       ferry__join_names(near, k, "", list, sizeof list), all);
  return ferry__fail(FERRY_ERR_NOT_FOUND, "no executor named '%s' (executors: %s)", name, all);
}

ferry_status ferry_exec_open(const char *name, const struct ferry_exec_params *params, ferry_exec **out) {
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "ferry_exec_open: out is NULL");
  *out = NULL;
  const struct ferry_exec_info *info = ferry_exec_registry_find(name);
  if (!info) return unknown(name ? name : "(null)");
  const struct ferry_exec_params none = {{0}, NULL};
  if (!params) params = &none;
  if ((info->caps & FERRY_EXEC_CAP_HW) && !params->hw)
    return ferry__fail(FERRY_ERR_INVALID, "the %s executor needs a hardware profile (ferry hw list)", info->name);
  return info->open(out, params);
}
