/* ferry_status names and messages, generated from the one FERRY_STATUS_MAP table, and the
 * per-thread last error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"

const char *ferry_strerror(ferry_status status) {
  switch (status) {
#define FERRY_STATUS_MSG_(name, value, msg) \
  case FERRY_##name:                        \
    return msg;
    FERRY_STATUS_MAP(FERRY_STATUS_MSG_)
#undef FERRY_STATUS_MSG_
  }
  return "unknown status";
}

const char *ferry_status_name(ferry_status status) {
  switch (status) {
#define FERRY_STATUS_NAME_(name, value, msg) \
  case FERRY_##name:                         \
    return "FERRY_" #name;
    FERRY_STATUS_MAP(FERRY_STATUS_NAME_)
#undef FERRY_STATUS_NAME_
  }
  return "FERRY_UNKNOWN";
}

static _Thread_local char last_error[FERRY_ERRMSG_MAX];

const char *ferry_last_error(void) { return last_error; }

static void vrecord(struct ferry_err *err, ferry_status status, const char *fmt, va_list ap) {
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  if (err) {
    err->status = status;
    memcpy(err->msg, last_error, sizeof err->msg);
  }
}

ferry_status ferry__err_set(struct ferry_err *err, ferry_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vrecord(err, status, fmt, ap);
  va_end(ap);
  return status;
}

ferry_status ferry__fail(ferry_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vrecord(NULL, status, fmt, ap);
  va_end(ap);
  return status;
}

ferry_status ferry__err_copy(struct ferry_err *err, const struct ferry_err *from) {
  snprintf(last_error, sizeof last_error, "%s", from->msg);
  if (err && err != from) *err = *from;
  return from->status;
}

void ferry__err_clear(struct ferry_err *err) {
  if (!err) return;
  err->status = FERRY_OK;
  err->msg[0] = '\0';
}
