/* POSIX file helpers with error messages that name the path and the offset. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"

static ferry_status errno_status(int e) {
  switch (e) {
    case ENOENT: return FERRY_ERR_NOT_FOUND;
    case ENOSPC:
    case EDQUOT: return FERRY_ERR_NO_SPACE;
    case ENOMEM: return FERRY_ERR_NOMEM;
    case EEXIST: return FERRY_ERR_EXISTS;
    default: return FERRY_ERR_IO;
  }
}

ferry_status ferry__mkdir_p(const char *path, struct ferry_err *err) {
  char *p = ferry__strdup(path);
  if (!p) return ferry__err_set(err, FERRY_ERR_NOMEM, "out of memory");
  ferry_status st = FERRY_OK;
  for (char *s = p + 1;; s++) {
    if (*s == '/' || *s == '\0') {
      char saved = *s;
      *s = '\0';
      if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        st = ferry__err_set(err, errno_status(errno), "%s: cannot create directory: %s", p, strerror(errno));
        break;
      }
      *s = saved;
      if (saved == '\0') break;
    }
  }
  if (st == FERRY_OK && !ferry__is_dir(path))
    st = ferry__err_set(err, FERRY_ERR_IO, "%s: exists and is not a directory", path);
  ferry_free(p);
  return st;
}

void ferry__rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (d) {
      struct dirent *e;
      while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *child = ferry__path_join(path, e->d_name);
        if (child) {
          ferry__rm_rf(child);
          ferry_free(child);
        }
      }
      closedir(d);
    }
    rmdir(path);
  } else {
    unlink(path);
  }
}

char *ferry__path_join(const char *dir, const char *name) {
  size_t n = strlen(dir);
  if (n && dir[n - 1] == '/') return ferry__asprintf("%s%s", dir, name);
  return ferry__asprintf("%s/%s", dir, name);
}

int ferry__is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int ferry__is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

ferry_status ferry__write_all(int fd, const void *buf, size_t len, const char *what, struct ferry_err *err) {
  const char *p = buf;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ferry__err_set(err, errno_status(errno), "%s: write failed: %s", what, strerror(errno));
    }
    if (n == 0) return ferry__err_set(err, FERRY_ERR_IO, "%s: write returned 0", what);
    p += n;
    len -= (size_t)n;
  }
  return FERRY_OK;
}

ferry_status ferry__pread_all(int fd, void *buf, size_t len, uint64_t offset, const char *what,
                              struct ferry_err *err) {
  char *p = buf;
  uint64_t off = offset;
  while (len) {
    ssize_t n = pread(fd, p, len, (off_t)off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ferry__err_set(err, errno_status(errno), "%s: read at offset %llu failed: %s", what,
                            (unsigned long long)off, strerror(errno));
    }
    if (n == 0)
      return ferry__err_set(err, FERRY_ERR_IO, "%s: unexpected end of file at offset %llu (wanted %zu more bytes)",
                            what, (unsigned long long)off, len);
    p += n;
    off += (uint64_t)n;
    len -= (size_t)n;
  }
  return FERRY_OK;
}

ferry_status ferry__write_file_atomic(const char *path, const void *data, size_t len, struct ferry_err *err) {
  char *tmp = ferry__asprintf("%s.tmp.%ld", path, (long)getpid());
  if (!tmp) return ferry__err_set(err, FERRY_ERR_NOMEM, "out of memory");
  ferry_status st = FERRY_OK;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = ferry__err_set(err, errno_status(errno), "%s: cannot create: %s", path, strerror(errno));
    goto out_free;
  }
  st = ferry__write_all(fd, data, len, path, err);
  if (st == FERRY_OK && fsync(fd) != 0)
    st = ferry__err_set(err, errno_status(errno), "%s: fsync failed: %s", path, strerror(errno));
  if (close(fd) != 0 && st == FERRY_OK)
    st = ferry__err_set(err, errno_status(errno), "%s: close failed: %s", path, strerror(errno));
  if (st == FERRY_OK && rename(tmp, path) != 0)
    st = ferry__err_set(err, errno_status(errno), "%s: rename failed: %s", path, strerror(errno));
  if (st != FERRY_OK) unlink(tmp);
out_free:
  ferry_free(tmp);
  return st;
}

ferry_status ferry__read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                              struct ferry_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ferry__err_set(err, errno_status(errno), "%s: cannot open: %s", path, strerror(errno));
  ferry_status st = FERRY_OK;
  struct stat sb;
  char *buf = NULL;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = ferry__err_set(err, FERRY_ERR_IO, "%s: not a regular file", path);
    goto out_close;
  }
  if ((uint64_t)sb.st_size > max_bytes) {
    st = ferry__err_set(err, FERRY_ERR_FORMAT, "%s: %lld bytes is larger than the %zu allowed", path,
                        (long long)sb.st_size, max_bytes);
    goto out_close;
  }
  buf = ferry_malloc((size_t)sb.st_size + 1);
  if (!buf) {
    st = ferry__err_set(err, FERRY_ERR_NOMEM, "%s: out of memory", path);
    goto out_close;
  }
  st = ferry__pread_all(fd, buf, (size_t)sb.st_size, 0, path, err);
  if (st != FERRY_OK) {
    ferry_free(buf);
    goto out_close;
  }
  buf[sb.st_size] = '\0';
  *out = buf;
  if (out_len) *out_len = (size_t)sb.st_size;
out_close:
  close(fd);
  return st;
}

uint64_t ferry__mem_available_bytes(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
  fclose(f);
  return found ? (uint64_t)kib * 1024u : 0;
}

ferry_status ferry__write_output(const char *path, const void *data, size_t len) {
  if (strcmp(path, "-")) return ferry__write_file_atomic(path, data ? data : "", len, NULL);
  if (len && (fwrite(data, 1, len, stdout) != len || fflush(stdout) != 0))
    return ferry__fail(FERRY_ERR_IO, "standard output: write failed: %s", strerror(errno));
  return FERRY_OK;
}
