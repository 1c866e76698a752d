/* The I/O layer every disk read of weights goes through (include/ferry/fault.h describes it):
 * one attempt with fault injection, the decision to retry with backoff, and the whole
 * retrying read that the buffered path (ferry__pread_all) and the O_DIRECT path share. */
#ifndef FERRY_COMMON_IO_H
#define FERRY_COMMON_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/error.h"
#include "ferry/fault.h"

enum ferry__io_counter {
  FERRY__IO_READS,
  FERRY__IO_ATTEMPTS,
  FERRY__IO_RETRIES,
  FERRY__IO_SHORT,
  FERRY__IO_RECOVERED,
  FERRY__IO_FAILED,
  FERRY__IO_MISMATCH
};
void ferry__io_count(enum ferry__io_counter c, uint64_t n);
void ferry__io_notify(const struct ferry_io_event *ev);

/* One pread attempt with the injected fault of this attempt applied: returns what pread
 * returns (-1 with errno set on failure). A short fault asks for half the bytes, rounded down
 * to a multiple of `align` (>= 1) when that leaves any. A corrupt fault flips a byte read. */
ssize_t ferry__io_attempt(int fd, void *buf, size_t len, uint64_t offset, size_t align);

/* State of one read across its attempts. */
struct ferry__io_try {
  const char *path;
  int32_t attempt;  /* attempts made so far for the current chunk (1 after the first) */
  int32_t failures; /* failed attempts over the whole read */
  uint64_t salt;    /* jitter seed */
};
void ferry__io_try_init(struct ferry__io_try *t, const char *path, uint64_t offset);

/* After a failed attempt (n < 0 with errno `error`, or n == 0 at an unexpected end of file):
 * FERRY_OK to try again (after waiting), or the permanent failure's status. Transient failures (EIO, EAGAIN, EWOULDBLOCK, EINTR, EOF) are retried
 * after the policy's backoff until max_attempts; then, or for any other error, the failure is
 * permanent, with err set to "PATH: read of LEN bytes at offset OFF failed after N
 * attempt(s): WHAT" (the end-of-file message also says the file's size now). */
ferry_status ferry__io_retry(struct ferry__io_try *t, int fd, int error, uint64_t offset, uint64_t len,
                             struct ferry_err *err);

/* A successful read ends: counts it recovered when it failed on the way. */
void ferry__io_done(struct ferry__io_try *t);

/* Whether an errno is a transient read failure. */
int ferry__io_transient(int error);

/* Sleep for ns (the caller's thread). */
void ferry__io_sleep_ns(int64_t ns);

#endif
