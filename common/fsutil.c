/* POSIX file helpers with error messages that name the path and the offset. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/io.h"

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
  /* through the I/O layer: transient failures are retried with backoff, short reads continued */
  char *p = buf;
  uint64_t off = offset;
  struct ferry__io_try t;
  ferry__io_try_init(&t, what, offset);
  while (len) {
    ssize_t n = ferry__io_attempt(fd, p, len, off, 1);
    if (n <= 0) {
      ferry_status st = ferry__io_retry(&t, fd, n < 0 ? errno : 0, off, len, err);
      if (st != FERRY_OK) return st;
      continue;
    }
    if ((size_t)n < len) ferry__io_count(FERRY__IO_SHORT, 1);
    t.attempt = 1; /* progress: the attempts count again from the next chunk */
    p += n;
    off += (uint64_t)n;
    len -= (size_t)n;
  }
  ferry__io_done(&t);
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

/* ---- path identity ------------------------------------------------------------------------ */

/* Drop "." and ".." components lexically (in place; path is absolute). */
static void normalize(char *path) {
  char *w = path;
  for (char *r = path; *r;) {
    while (*r == '/') r++;
    size_t len = strcspn(r, "/");
    if (len == 0) break;
    if (len == 2 && r[0] == '.' && r[1] == '.') {
      while (w > path && *--w != '/') {
      }
    } else if (!(len == 1 && r[0] == '.')) {
      *w++ = '/';
      memmove(w, r, len);
      w += len;
    }
    r += len;
  }
  if (w == path) *w++ = '/';
  *w = '\0';
}

/* The absolute path with symbolic links resolved as far as it exists and the missing rest
 * appended lexically; owned, NULL when out of memory. */
static char *resolve(const char *path) {
  char cwd[PATH_MAX];
  char *abs = path[0] == '/' ? ferry__strdup(path) : getcwd(cwd, sizeof cwd) ? ferry__path_join(cwd, path) : NULL;
  char *rest = NULL, *out = NULL;
  while (abs) {
    char *real = realpath(abs, NULL);
    if (real) {
      out = rest ? ferry__path_join(real, rest) : ferry__strdup(real);
      free(real); /* realpath's buffer comes from malloc */
      break;
    }
    char *slash = strrchr(abs, '/');
    if (!slash) break;
    char *r = rest ? ferry__path_join(slash + 1, rest) : ferry__strdup(slash + 1);
    ferry_free(rest);
    rest = r;
    if (!rest) break;
    if (slash == abs) slash[1] = '\0'; /* the root */
    else *slash = '\0';
  }
  ferry_free(abs);
  ferry_free(rest);
  if (out) normalize(out);
  return out;
}

int ferry__same_file(const char *a, const char *b) {
  struct stat sa, sb;
  int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return 0; /* one exists, the other not: different files */
  char *ra = resolve(a), *rb = resolve(b);
  int same = ra && rb && !strcmp(ra, rb);
  ferry_free(ra);
  ferry_free(rb);
  return same;
}

int ferry__path_within(const char *path, const char *dir) {
  struct stat sd;
  if (stat(dir, &sd) != 0 || !S_ISDIR(sd.st_mode)) return 0;
  char *r = resolve(path);
  if (!r) return 0;
  /* walk up the resolved path comparing each existing ancestor with the folder */
  int inside = 0;
  for (;;) {
    struct stat sp;
    if (stat(r, &sp) == 0 && sp.st_dev == sd.st_dev && sp.st_ino == sd.st_ino) {
      inside = 1;
      break;
    }
    char *slash = strrchr(r, '/');
    if (!slash) break;
    if (slash == r) {
      if (r[1] == '\0') break;
      r[1] = '\0';
      continue;
    }
    *slash = '\0';
  }
  ferry_free(r);
  return inside;
}

static int skipped(const struct ferry_path_use *u) { return !u->path || !*u->path || !strcmp(u->path, "-"); }

/* Whether output o clashes with path p (the other use u); sets how. */
static int clashes(const struct ferry_path_use *o, const struct ferry_path_use *u, const char **how) {
  if (ferry__same_file(o->path, u->path)) {
    *how = "the same file as";
    return 1;
  }
  if ((u->flags & FERRY_PATH_DIR) && ferry__path_within(o->path, u->path)) {
    *how = "inside";
    return 1;
  }
  if ((o->flags & FERRY_PATH_DIR) && ferry__path_within(u->path, o->path)) {
    *how = "a folder holding";
    return 1;
  }
  if (u->flags & FERRY_PATH_SQLITE) {
    static const char *const side[] = {"-wal", "-shm", "-journal"};
    for (size_t k = 0; k < 3; k++) {
      char *s = ferry__asprintf("%s%s", u->path, side[k]);
      int same = s && ferry__same_file(o->path, s);
      ferry_free(s);
      if (same) {
        *how = "a side file of database";
        return 1;
      }
    }
  }
  return 0;
}

ferry_status ferry__check_paths(const struct ferry_path_use *uses, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const struct ferry_path_use *o = &uses[i];
    if (skipped(o) || !(o->flags & FERRY_PATH_OUT)) continue;
    for (size_t j = 0; j < n; j++) {
      const struct ferry_path_use *u = &uses[j];
      if (j == i || skipped(u)) continue;
      int out = (u->flags & FERRY_PATH_OUT) != 0;
      if (out && j < i) continue; /* each pair of outputs once */
      struct stat sb;
      if (!out && stat(u->path, &sb) != 0) continue; /* a missing input cannot be overwritten */
      const char *how = NULL;
      if (clashes(o, u, &how) || (out && clashes(u, o, &how)))
        return ferry__fail(FERRY_ERR_INVALID, "%s %s is %s %s %s: an output must not overwrite %s", o->option, o->path,
                           how, u->option, u->path, out ? "another output" : "an input");
    }
  }
  return FERRY_OK;
}

char *ferry__installed_hw_dir(void) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = '\0'; /* the bin folder */
  char *dir = ferry__asprintf("%s/../share/ferry/hw", exe);
  if (dir && !ferry__is_dir(dir)) {
    ferry_free(dir);
    dir = NULL;
  }
  return dir;
}
