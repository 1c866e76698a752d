/* Detailed error messages: each handle embeds a ferry_err; setting one also records the
 * message as the calling thread's ferry_last_error(), so failures before a handle exists are
 * still explained. */
#ifndef FERRY_COMMON_ERROR_H
#define FERRY_COMMON_ERROR_H

#include "ferry/status.h"

#define FERRY_ERRMSG_MAX 1024

struct ferry_err {
  ferry_status status;
  char msg[FERRY_ERRMSG_MAX];
};

#if defined(__GNUC__)
#define FERRY_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FERRY_PRINTF(a, b)
#endif

/* Record status and a printf-style message in err (may be NULL) and in the thread's last
 * error. Returns status, so callers can write `return ferry__err_set(...)`. */
ferry_status ferry__err_set(struct ferry_err *err, ferry_status status, const char *fmt, ...)
    FERRY_PRINTF(3, 4);

/* Copy another error (e.g. a child handle's) into err, prefixing context if given. */
ferry_status ferry__err_copy(struct ferry_err *err, const struct ferry_err *from);

/* Record a message only in the thread's last error. */
ferry_status ferry__fail(ferry_status status, const char *fmt, ...) FERRY_PRINTF(2, 3);

void ferry__err_clear(struct ferry_err *err);

#endif
