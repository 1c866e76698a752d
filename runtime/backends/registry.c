/* The executor registry: every executor this build has, by name, with what it can do. A new
 * executor is its own file (a static const ferry_exec_info beside its backend table), one line
 * in FERRY_EXECUTORS below and one build line; the command line, sweeps, the result database
 * and the help texts then know it. Tests and plugins add theirs with ferry_exec_register(). */
#include <stddef.h>

#include "common/error.h"
#include "common/registry.h"
#include "ferry/exec.h"
#include "ferry/exec_registry.h"

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

static struct ferry__registry registry = {.what = "executor",
                                          .builtin = (const void *const *)builtin,
                                          .n_builtin = sizeof builtin / sizeof builtin[0],
                                          .name_offset = offsetof(struct ferry_exec_info, name)};

size_t ferry_exec_registry_count(void) { return ferry__registry_count(&registry); }
const struct ferry_exec_info *ferry_exec_registry_at(size_t i) { return ferry__registry_at(&registry, i); }
const struct ferry_exec_info *ferry_exec_registry_find(const char *name) { return ferry__registry_find(&registry, name); }

ferry_status ferry_exec_register(const struct ferry_exec_info *info) {
  if (!info || info->version != FERRY_EXEC_INFO_VERSION || !info->open)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_exec_register: needs version %d and open()", FERRY_EXEC_INFO_VERSION);
  return ferry__registry_add(&registry, info);
}

ferry_status ferry_exec_open(const char *name, const struct ferry_exec_params *params, ferry_exec **out) {
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "ferry_exec_open: out is NULL");
  *out = NULL;
  const struct ferry_exec_info *info = ferry_exec_registry_find(name);
  if (!info) return ferry__registry_unknown(&registry, name ? name : "(null)");
  const struct ferry_exec_params none = {{0}, NULL};
  if (!params) params = &none;
  if ((info->caps & FERRY_EXEC_CAP_HW) && !params->hw)
    return ferry__fail(FERRY_ERR_INVALID, "the %s executor needs a hardware profile (ferry hw list)", info->name);
  return info->open(out, params);
}
