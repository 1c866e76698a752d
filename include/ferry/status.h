/**
 * @file status.h
 * @brief Status codes returned by every ferry function, and their names and messages.
 *
 * One table (FERRY_STATUS_MAP) generates the enum, ferry_status_name() and ferry_strerror().
 * New codes are only ever appended, so numeric values stay stable across versions.
 */
#ifndef FERRY_STATUS_H
#define FERRY_STATUS_H

#include "ferry/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/** X-macro table: X(NAME, value, message). Values are 0 or negative and never reused. */
#define FERRY_STATUS_MAP(X)                                                       \
  X(OK, 0, "success")                                                             \
  X(ERR_INVALID, -1, "invalid argument")                                          \
  X(ERR_NOMEM, -2, "out of memory")                                               \
  X(ERR_IO, -3, "input/output error")                                             \
  X(ERR_NOT_FOUND, -4, "not found")                                               \
  X(ERR_FORMAT, -5, "malformed input")                                            \
  X(ERR_UNSUPPORTED, -6, "unsupported")                                           \
  X(ERR_BUDGET, -7, "memory budget exceeded")                                     \
  X(ERR_RANGE, -8, "value out of range")                                          \
  X(ERR_NO_DEVICE, -9, "no CUDA device")                                          \
  X(ERR_DB, -10, "database error")                                                \
  X(ERR_CUDA, -11, "CUDA error")                                                  \
  X(ERR_EXISTS, -12, "already exists")                                            \
  X(ERR_SCHEMA, -13, "database schema is newer than this build")                  \
  X(ERR_BUSY, -14, "resource busy")                                               \
  X(ERR_INTERNAL, -15, "internal error")                                          \
  X(ERR_NO_SPACE, -16, "no space left on device")                                 \
  X(ERR_TOO_LARGE, -17, "request can never fit")                                  \
  X(ERR_DEVICE, -18, "device failed")

/** Result of every fallible ferry function: FERRY_OK (0) or a negative error. */
typedef enum ferry_status {
#define FERRY_STATUS_ENUM_(name, value, msg) FERRY_##name = value,
  FERRY_STATUS_MAP(FERRY_STATUS_ENUM_)
#undef FERRY_STATUS_ENUM_
} ferry_status;

/**
 * @brief Human-readable description of a status code.
 * @param status any value; unknown values give "unknown status".
 * @return a static string, never NULL; not owned by the caller.
 */
FERRY_API const char *ferry_strerror(ferry_status status);

/**
 * @brief Symbolic name of a status code, e.g. "FERRY_ERR_FORMAT".
 * @param status any value; unknown values give "FERRY_UNKNOWN".
 * @return a static string, never NULL; not owned by the caller.
 */
FERRY_API const char *ferry_status_name(ferry_status status);

/**
 * @brief The detailed message of the most recent failure in the calling thread.
 *
 * Every function that fails records what went wrong and where (file, byte offset or line,
 * what was expected). Handles keep their own copy (e.g. ferry_store_errmsg()); this one also
 * covers failures that happen before a handle exists, such as a failed open.
 * @return a thread-local string, valid until the next ferry call in this thread; "" if none.
 */
FERRY_API const char *ferry_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_STATUS_H */
