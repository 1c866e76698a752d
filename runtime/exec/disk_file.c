/* Disk-tier buffers as files: a private folder per executor, one sparse file per buffer, copies
 * to and from host memory as pread/pwrite of exactly the range asked (a short transfer or an
 * error fails the copy naming the file and offset: a cache that silently lost rows would give
 * wrong logits, not an error). */
#include "disk_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"

/* A buffer's open file; buf->file points at path. */
struct disk_file {
  int fd;
  char path[];
};

ferry_status ferry__disk_dir_init(struct ferry__disk_dir *d, const char *base) {
  memset(d, 0, sizeof *d);
  pthread_mutex_init(&d->mu, NULL);
  if (!base) return FERRY_OK;
  d->base = ferry__strdup(base);
  return d->base ? FERRY_OK : ferry__fail(FERRY_ERR_NOMEM, "out of memory for the disk folder's name");
}

void ferry__disk_dir_fini(struct ferry__disk_dir *d) {
  if (d->path && rmdir(d->path) != 0 && errno != ENOENT) /* a file left behind by another process */
    fprintf(stderr, "ferry: cannot remove the disk-tier folder %s: %s\n", d->path, strerror(errno));
  ferry_free(d->path);
  ferry_free(d->base);
  pthread_mutex_destroy(&d->mu);
  memset(d, 0, sizeof *d);
}

/* The private folder, made once (with d->mu held). */
static ferry_status make_folder(struct ferry_exec *ex, struct ferry__disk_dir *d) {
  if (d->path) return FERRY_OK;
  const char *base = d->base ? d->base : getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  const size_t n = strlen(base) + sizeof "/ferry-disk-XXXXXX";
  char *path = ferry__calloc(1, n);
  if (!path) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "out of memory for the disk folder's name");
  snprintf(path, n, "%s/ferry-disk-XXXXXX", base);
  if (!mkdtemp(path)) {
    const int err = errno;
    ferry_free(path);
    return ferry__err_set(&ex->err, FERRY_ERR_IO, "%s executor: cannot make a folder for disk-tier buffers in %s: %s",
                          ex->backend->name, base, strerror(err));
  }
  d->path = path;
  return FERRY_OK;
}

ferry_status ferry__disk_file_open(struct ferry_exec *ex, struct ferry__disk_dir *d, ferry_buf *buf) {
  pthread_mutex_lock(&d->mu);
  ferry_status st = make_folder(ex, d);
  const uint64_t number = ++d->made;
  char *dir = st == FERRY_OK ? ferry__strdup(d->path) : NULL;
  pthread_mutex_unlock(&d->mu);
  if (st != FERRY_OK) return st;
  if (!dir) return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "out of memory for a disk file's name");
  /* the label, readable in a file name: letters and digits, the rest as '-' */
  char name[64];
  size_t k = 0;
  for (const char *p = buf->label; *p && k < sizeof name - 1; p++)
    name[k++] = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ? *p : '-';
  name[k] = '\0';
  const size_t n = strlen(dir) + sizeof name + 32;
  struct disk_file *f = ferry__calloc(1, sizeof *f + n);
  if (!f) {
    ferry_free(dir);
    return ferry__err_set(&ex->err, FERRY_ERR_NOMEM, "out of memory for a disk file");
  }
  snprintf(f->path, n, "%s/%llu-%s", dir, (unsigned long long)number, name);
  ferry_free(dir);
  f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (f->fd < 0 || ftruncate(f->fd, (off_t)buf->bytes) != 0) {
    const int err = errno;
    st = ferry__err_set(&ex->err, FERRY_ERR_IO, "%s executor: cannot make the %llu-byte file %s for %s: %s",
                        ex->backend->name, (unsigned long long)buf->bytes, f->path, buf->label, strerror(err));
    if (f->fd >= 0) {
      close(f->fd);
      unlink(f->path);
    }
    ferry_free(f);
    return st;
  }
  buf->backend_ptr = f;
  buf->file = f->path;
  buf->ptr = NULL; /* not host visible: only copies touch it */
  return FERRY_OK;
}

void ferry__disk_file_close(ferry_buf *buf) {
  struct disk_file *f = buf->backend_ptr;
  if (!f) return;
  close(f->fd);
  unlink(f->path);
  ferry_free(f);
  buf->backend_ptr = NULL;
  buf->file = NULL;
}

/* Read or write len bytes at off of the file, retrying interrupted and partial transfers;
 * 0 or the errno (ENODATA: the file ended early) with *done the bytes moved. */
static int transfer(int fd, int write, char *host, uint64_t len, uint64_t off, uint64_t *done) {
  *done = 0;
  while (*done < len) {
    const size_t want = len - *done > (1u << 30) ? (1u << 30) : (size_t)(len - *done);
    const ssize_t n = write ? pwrite(fd, host + *done, want, (off_t)(off + *done))
                            : pread(fd, host + *done, want, (off_t)(off + *done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENODATA;
    *done += (uint64_t)n;
  }
  return 0;
}

void ferry__disk_file_copy(struct ferry_exec *ex, const struct ferry_op *op) {
  const int write = op->u.copy.copy_kind == FERRY_COPY_HOST_TO_DISK;
  const struct ferry_ref *disk = write ? &op->u.copy.dst : &op->u.copy.src;
  const struct ferry_ref *host = write ? &op->u.copy.src : &op->u.copy.dst;
  const struct disk_file *f = disk->buf->backend_ptr;
  const uint64_t len = op->u.copy.bytes, off = ferry__ref_at(*disk);
  char msg[FERRY_ERRMSG_MAX];
  if (!f || off > disk->buf->bytes || len > disk->buf->bytes - off) { /* the wrapper checked it: belt and braces */
    snprintf(msg, sizeof msg, "%s executor: %s %llu bytes at offset %llu of %s: past its %llu bytes", ex->backend->name,
             write ? "writing" : "reading", (unsigned long long)len, (unsigned long long)off,
             f ? f->path : disk->buf->label, (unsigned long long)disk->buf->bytes);
    ferry__exec_op_failed(ex, FERRY_ERR_RANGE, msg);
    return;
  }
  uint64_t done = 0;
  const int err = transfer(f->fd, write, (char *)host->buf->ptr + ferry__ref_at(*host), len, off, &done);
  if (!err) return;
  snprintf(msg, sizeof msg, "%s executor: %s %llu bytes at offset %llu of %s (%s): %s after %llu bytes",
           ex->backend->name, write ? "writing" : "reading", (unsigned long long)len, (unsigned long long)off, f->path,
           disk->buf->label, err == ENODATA ? "the file ends early" : strerror(err), (unsigned long long)done);
  ferry__exec_op_failed(ex, FERRY_ERR_IO, msg);
}
