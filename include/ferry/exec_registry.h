/**
 * @file exec_registry.h
 * @brief The registry of executors: every executor this build has (host, cuda, sim) and those
 *        a test or plugin registers, by name, and ferry_exec_open() over it. It sees every
 *        executor, so it sits above them (runtime/backends/): an executor itself needs only
 *        ferry/exec.h, where struct ferry_exec_info is.
 */
#ifndef FERRY_EXEC_REGISTRY_H
#define FERRY_EXEC_REGISTRY_H

#include "ferry/api.h"

#include <stddef.h>

#include "ferry/exec.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @brief Number of registered executors (built in, then those registered at run time). */
FERRY_API size_t ferry_exec_registry_count(void);

/** @brief The i-th registered executor, or NULL past the end. Borrowed, static. */
FERRY_API const struct ferry_exec_info *ferry_exec_registry_at(size_t i);

/** @brief The executor registered under @p name, or NULL. Borrowed, static. */
FERRY_API const struct ferry_exec_info *ferry_exec_registry_find(const char *name);

/**
 * @brief Add an executor to the registry at run time (a test's or a plugin's), before any
 *        ferry_exec_open() of it. Not thread-safe: register at start-up.
 * @param info the table; borrowed and must stay valid for the life of the process.
 * @return FERRY_OK; FERRY_ERR_INVALID for a bad name, version or missing open(); FERRY_ERR_EXISTS
 *         when the name is taken; FERRY_ERR_RANGE when the registry is full (16 run-time entries).
 */
FERRY_API ferry_status ferry_exec_register(const struct ferry_exec_info *info);

/**
 * @brief Open the executor registered as @p name.
 * @param name a registry name ("host", "cuda", "sim", ...).
 * @param params budgets, threads and (for FERRY_EXEC_CAP_HW) the hardware profile; NULL: defaults.
 * @param out receives the executor, owned by the caller (ferry_exec_destroy()).
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND for an unknown name (the message lists the nearest);
 *         FERRY_ERR_INVALID without a profile where one is needed; the executor's own status
 *         when it is unavailable (FERRY_ERR_NO_DEVICE, FERRY_ERR_UNSUPPORTED) or fails.
 */
FERRY_API ferry_status ferry_exec_open(const char *name, const struct ferry_exec_params *params, ferry_exec **out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_EXEC_REGISTRY_H */
