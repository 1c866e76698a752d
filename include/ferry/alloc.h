/**
 * @file alloc.h
 * @brief The allocation hook every ferry allocation goes through, with fault injection.
 *
 * Tests use ferry_alloc_fail_after() to make the Nth allocation from now fail, so that every
 * error path that handles out-of-memory is exercised (as SQLite's and curl's test suites do).
 */
#ifndef FERRY_ALLOC_H
#define FERRY_ALLOC_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief Make the allocation after the next @p n succeed-or-fail calls fail.
 *
 * With n = 0 the very next allocation fails; with n = 3 three more succeed, then one fails.
 * Only one allocation fails per call; afterwards allocations succeed again.
 * @param n number of allocations that still succeed, or a negative value to disarm.
 */
FERRY_API void ferry_alloc_fail_after(int64_t n);

/**
 * @brief Number of allocations made through the hook since the process started.
 * @return the running count (including failed ones).
 */
FERRY_API uint64_t ferry_alloc_count(void);

/**
 * @brief Allocate @p size bytes through ferry's hook (malloc semantics).
 * @return owned by the caller, release with ferry_free(); NULL on failure or injected fault.
 */
FERRY_API void *ferry_malloc(size_t size);

/**
 * @brief Release memory from ferry_malloc() or a ferry function documented to return owned
 *        memory. Accepts NULL.
 */
FERRY_API void ferry_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_ALLOC_H */
