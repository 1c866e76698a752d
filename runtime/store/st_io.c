/* Disk reads of tensors and byte ranges: buffered pread, or O_DIRECT into the caller's aligned
 * buffer with a buffered + fadvise(DONTNEED) fallback where the file system refuses O_DIRECT.
 * Many executor threads read at once: shared state (errors, lazy descriptors) sits behind a lock. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/io.h"
#include "runtime/store/store_impl.h"

#define ALIGN_DOWN(x) ((x) & ~(uint64_t)(FERRY_DIRECT_ALIGN - 1))

uint64_t ferry_store_direct_span(uint64_t offset, uint64_t len) {
  if (len == 0) return 0;
  uint64_t end = offset + len;
  if (end < offset || end > UINT64_MAX - FERRY_DIRECT_ALIGN) return UINT64_MAX;
  return ALIGN_DOWN(end + FERRY_DIRECT_ALIGN - 1) - ALIGN_DOWN(offset);
}

/* Publish a read error on the store (under the lock: other threads may fail at once). */
static ferry_status publish(ferry_store *s, const struct ferry_err *e) {
  pthread_mutex_lock(&s->lock);
  s->err = *e;
  pthread_mutex_unlock(&s->lock);
  return e->status;
}

/* The O_DIRECT descriptor of file i, opened on first use; -1 when O_DIRECT is not usable. */
static int direct_fd(ferry_store *s, uint32_t i) {
  struct ferry__st_file *f = &s->files[i];
  pthread_mutex_lock(&s->lock);
  if (f->direct_fd == DIRECT_UNTRIED) {
    int fd = open(f->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    f->direct_fd = fd >= 0 ? fd : DIRECT_REFUSED;
  }
  int fd = (s->direct_refused || f->direct_refused) ? -1 : f->direct_fd;
  pthread_mutex_unlock(&s->lock);
  return fd < 0 ? -1 : fd;
}

static void mark_refused(ferry_store *s, uint32_t i) {
  pthread_mutex_lock(&s->lock);
  s->files[i].direct_refused = 1;
  pthread_mutex_unlock(&s->lock);
}

static void drop_cache(int fd, uint64_t offset, uint64_t len) {
  (void)posix_fadvise(fd, (off_t)offset, (off_t)len, POSIX_FADV_DONTNEED);
}

/* Read the aligned envelope [a0, a0 + span) with O_DIRECT until [a0, need_end) is covered
 * (the file may end inside the envelope). Returns FERRY_ERR_UNSUPPORTED, with nothing
 * published, when the very first read is refused so the caller can fall back. */
static ferry_status read_direct(ferry_store *s, uint32_t i, int dfd, char *buf, uint64_t a0, uint64_t span,
                                uint64_t need_end, struct ferry_err *e) {
  const struct ferry__st_file *f = &s->files[i];
  uint64_t pos = 0;
  struct ferry__io_try t;
  ferry__io_try_init(&t, f->path, a0);
  while (pos < need_end) {
    ssize_t n = ferry__io_attempt(dfd, buf + pos, (size_t)(span - pos), a0 + pos, FERRY_DIRECT_ALIGN);
    if (n < 0 && errno == EINVAL && pos == 0) return FERRY_ERR_UNSUPPORTED;
    if (n <= 0) {
      ferry_status st = ferry__io_retry(&t, dfd, n < 0 ? errno : 0, a0 + pos, need_end - pos, e);
      if (st != FERRY_OK) return st;
      continue;
    }
    if ((uint64_t)n < span - pos) ferry__io_count(FERRY__IO_SHORT, 1);
    t.attempt = 1;
    pos += (uint64_t)n;
    if (pos < need_end && pos % FERRY_DIRECT_ALIGN) {
      /* An unaligned short read cannot be continued with O_DIRECT: finish buffered. */
      ferry__io_done(&t);
      return ferry__pread_all(f->fd, buf + pos, (size_t)(need_end - pos), a0 + pos, f->path, e);
    }
  }
  ferry__io_done(&t);
  return FERRY_OK;
}

static ferry_status read_range_once(ferry_store *store, uint32_t file, uint64_t offset, uint64_t len, void *buf,
                                   uint64_t buf_cap, unsigned flags, uint64_t *data_shift) {
  struct ferry_err e;
  ferry__err_clear(&e);
  if (!store) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_read_range: NULL store");
  if (file >= store->nfiles) {
    ferry__err_set(&e, FERRY_ERR_INVALID, "read: file index %u out of range (store has %zu files)", file,
                   store->nfiles);
    return publish(store, &e);
  }
  const struct ferry__st_file *f = &store->files[file];
  if (offset > f->size || len > f->size - offset) {
    ferry__err_set(&e, FERRY_ERR_RANGE, "%s: read of %llu bytes at offset %llu is outside the %llu-byte file",
                   f->path, (unsigned long long)len, (unsigned long long)offset, (unsigned long long)f->size);
    return publish(store, &e);
  }
  if (!buf && len) {
    ferry__err_set(&e, FERRY_ERR_INVALID, "%s: read into a NULL buffer", f->path);
    return publish(store, &e);
  }
  if (len > SIZE_MAX) {
    ferry__err_set(&e, FERRY_ERR_RANGE, "%s: read of %llu bytes is larger than memory", f->path,
                   (unsigned long long)len);
    return publish(store, &e);
  }
  ferry_status st;
  if (!(flags & FERRY_READ_DIRECT)) {
    if (buf_cap < len) {
      ferry__err_set(&e, FERRY_ERR_INVALID, "%s: buffer of %llu bytes cannot hold the %llu bytes read at offset %llu",
                     f->path, (unsigned long long)buf_cap, (unsigned long long)len, (unsigned long long)offset);
      return publish(store, &e);
    }
    if (data_shift) *data_shift = 0;
    if (!len) return FERRY_OK;
    st = ferry__pread_all(f->fd, buf, (size_t)len, offset, f->path, &e);
    if (st != FERRY_OK) return publish(store, &e);
    if (flags & FERRY_READ_DROP_CACHE) drop_cache(f->fd, offset, len);
    return FERRY_OK;
  }

  uint64_t a0 = ALIGN_DOWN(offset), shift = offset - a0, span = ferry_store_direct_span(offset, len);
  if (!data_shift || ((uintptr_t)buf % FERRY_DIRECT_ALIGN) || buf_cap < span) {
    ferry__err_set(&e, FERRY_ERR_INVALID,
                   "%s: O_DIRECT read at offset %llu needs a %u-aligned buffer of %llu bytes and data_shift "
                   "(got %llu bytes at %p)",
                   f->path, (unsigned long long)offset, FERRY_DIRECT_ALIGN, (unsigned long long)span,
                   (unsigned long long)buf_cap, buf);
    return publish(store, &e);
  }
  *data_shift = shift;
  if (!len) return FERRY_OK;
  char *cbuf = buf;
  int dfd = direct_fd(store, file);
  if (dfd >= 0) {
    st = read_direct(store, file, dfd, cbuf, a0, span, shift + len, &e);
    if (st == FERRY_OK) return FERRY_OK;
    if (st != FERRY_ERR_UNSUPPORTED) return publish(store, &e);
    mark_refused(store, file);
  }
  /* Fallback: buffered read to the same place, then drop the pages so the next read of this
   * range costs a disk read as O_DIRECT would. */
  st = ferry__pread_all(f->fd, cbuf + shift, (size_t)len, offset, f->path, &e);
  if (st != FERRY_OK) return publish(store, &e);
  drop_cache(f->fd, offset, len);
  return FERRY_OK;
}

ferry_status ferry_store_read_range(ferry_store *store, uint32_t file, uint64_t offset, uint64_t len, void *buf,
                                    uint64_t buf_cap, unsigned flags, uint64_t *data_shift) {
  uint64_t shift = 0, *sp = (flags & FERRY_READ_DIRECT) && !data_shift ? NULL : &shift; /* refused there */
  ferry_status st = read_range_once(store, file, offset, len, buf, buf_cap, flags, sp);
  if (data_shift) *data_shift = shift;
  if (st != FERRY_OK || !len) return st;
  pthread_mutex_lock(&store->lock);
  const int verify = store->verify;
  pthread_mutex_unlock(&store->lock);
  if (!verify) return FERRY_OK;
  /* A range whose bytes differ from its first read is read again, as a transient failure; the
   * same policy bounds the attempts. */
  struct ferry__io_try t;
  ferry__io_try_init(&t, store->files[file].path, offset);
  for (;;) {
    uint32_t want = 0, got = 0;
    if (ferry__st_crc_check(store, file, offset, len, (const char *)buf + shift, &want, &got) == FERRY_OK) break;
    ferry__io_count(FERRY__IO_MISMATCH, 1);
    struct ferry_io_policy p;
    ferry_io_get_policy(&p);
    const int permanent = t.attempt >= p.max_attempts;
    struct ferry_io_event ev = {.path = store->files[file].path, .offset = offset, .len = len, .attempt = t.attempt,
                                .permanent = permanent, .what = "checksum mismatch"};
    ferry__io_notify(&ev);
    if (permanent) {
      struct ferry_err e;
      ferry__io_count(FERRY__IO_FAILED, 1);
      ferry__err_set(&e, FERRY_ERR_IO,
                     "%s: %llu bytes at offset %llu read with CRC-32 %08x, not the %08x of their first read, after %d "
                     "attempt(s)",
                     store->files[file].path, (unsigned long long)len, (unsigned long long)offset, got, want, t.attempt);
      return publish(store, &e);
    }
    t.failures++;
    ferry__io_count(FERRY__IO_RETRIES, 1);
    ferry__io_sleep_ns(ferry_io_backoff_ns(t.attempt, t.salt));
    t.attempt++;
    if ((st = read_range_once(store, file, offset, len, buf, buf_cap, flags, sp)) != FERRY_OK) return st;
  }
  ferry__io_done(&t);
  return FERRY_OK;
}

ferry_status ferry_store_read_tensor(ferry_store *store, const struct ferry_store_tensor *tensor, void *buf,
                                     uint64_t buf_cap) {
  if (!store || !tensor) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_read_tensor: NULL argument");
  return ferry_store_read_range(store, tensor->file, tensor->offset, tensor->nbytes, buf, buf_cap, 0, NULL);
}

int ferry_store_direct_supported(ferry_store *store) {
  if (!store || !store->nfiles) return 0;
  int dfd = direct_fd(store, 0);
  if (dfd < 0) return 0;
  pthread_mutex_lock(&store->lock);
  int probed = store->files[0].direct_refused;
  pthread_mutex_unlock(&store->lock);
  if (probed) return 0;
  void *block = ferry__aligned_alloc(FERRY_DIRECT_ALIGN, FERRY_DIRECT_ALIGN);
  if (!block) return 0;
  ssize_t n;
  do {
    n = pread(dfd, block, FERRY_DIRECT_ALIGN, 0);
  } while (n < 0 && errno == EINTR);
  int refused = n < 0 && errno == EINVAL;
  ferry_free(block);
  if (refused) mark_refused(store, 0);
  return !refused;
}

void ferry__store_force_direct_refused(ferry_store *store) {
  pthread_mutex_lock(&store->lock);
  store->direct_refused = 1;
  pthread_mutex_unlock(&store->lock);
}
