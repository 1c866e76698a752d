/* One attempt of a disk read with its injected fault, and the retry decision: exponential
 * backoff with jitter up to the policy's attempts, then a permanent failure that names the
 * file, the offset and the attempts. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"

static ferry_status errno_status(int e) {
  switch (e) {
    case ENOENT: return FERRY_ERR_NOT_FOUND;
    case ENOMEM: return FERRY_ERR_NOMEM;
    default: return FERRY_ERR_IO;
  }
}

void ferry__io_sleep_ns(int64_t ns) {
  if (ns <= 0) return;
  struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

ssize_t ferry__io_attempt(int fd, void *buf, size_t len, uint64_t offset, size_t align) {
  ferry__io_count(FERRY__IO_ATTEMPTS, 1);
  struct ferry_fault f = ferry_fault_draw(FERRY_FAULT_READ);
  if (f.delay_ns) ferry__io_sleep_ns(f.delay_ns);
  switch (f.kind) {
    case FERRY_FAULT_EIO: errno = EIO; return -1;
    case FERRY_FAULT_EAGAIN: errno = EAGAIN; return -1;
    case FERRY_FAULT_EINTR: errno = EINTR; return -1;
    case FERRY_FAULT_SHORT: {
      size_t half = len / 2;
      if (align > 1) half -= half % align;
      if (half) len = half;
      break;
    }
    default: break;
  }
  ssize_t n = pread(fd, buf, len, (off_t)offset);
  if (n > 0 && f.kind == FERRY_FAULT_CORRUPT) ((unsigned char *)buf)[(size_t)n / 2] ^= 0x5a;
  return n;
}

int ferry__io_transient(int error) {
  return error == EIO || error == EAGAIN || error == EWOULDBLOCK || error == EINTR || error == 0;
}

void ferry__io_try_init(struct ferry__io_try *t, const char *path, uint64_t offset) {
  t->path = path;
  t->attempt = 1;
  t->failures = 0;
  t->salt = offset * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)path;
  ferry__io_count(FERRY__IO_READS, 1);
}

static const char *error_name(int error) {
  switch (error) {
    case 0: return "end of file";
    case EIO: return "EIO";
    case EAGAIN: return "EAGAIN";
    case EINTR: return "EINTR";
    default: return strerror(error);
  }
}

ferry_status ferry__io_retry(struct ferry__io_try *t, int fd, int error, uint64_t offset, uint64_t len,
                             struct ferry_err *err) {
  struct ferry_io_policy p;
  ferry_io_get_policy(&p);
  t->failures++;
  const int transient = ferry__io_transient(error);
  const int permanent = !transient || t->attempt >= p.max_attempts;
  struct ferry_io_event ev = {.path = t->path, .offset = offset, .len = len, .attempt = t->attempt, .error = error,
                              .permanent = permanent, .what = error_name(error)};
  ferry__io_notify(&ev);
  if (!permanent) {
    ferry__io_count(FERRY__IO_RETRIES, 1);
    ferry__io_sleep_ns(ferry_io_backoff_ns(t->attempt, t->salt));
    t->attempt++;
    return FERRY_OK;
  }
  ferry__io_count(FERRY__IO_FAILED, 1);
  if (error == 0) {
    struct stat sb;
    char now[64] = "";
    if (fd >= 0 && fstat(fd, &sb) == 0) snprintf(now, sizeof now, "; the file is now %lld bytes", (long long)sb.st_size);
    return ferry__err_set(err, FERRY_ERR_IO,
                   "%s: unexpected end of file at offset %llu (wanted %llu more bytes) after %d attempt(s)%s", t->path,
                   (unsigned long long)offset, (unsigned long long)len, t->attempt, now);
  }
  return ferry__err_set(err, errno_status(error), "%s: read of %llu bytes at offset %llu failed after %d attempt(s): %s",
                   t->path, (unsigned long long)len, (unsigned long long)offset, t->attempt, strerror(error));
}

void ferry__io_done(struct ferry__io_try *t) {
  if (t->failures) ferry__io_count(FERRY__IO_RECOVERED, 1);
}
