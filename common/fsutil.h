/* File-system helpers: directories, joined paths, whole-file writes that never leave a
 * partial file behind (write to a temporary name, fsync, rename). */
#ifndef FERRY_COMMON_FSUTIL_H
#define FERRY_COMMON_FSUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Create a directory and its parents (mode 0755); an existing directory is fine. */
ferry_status ferry__mkdir_p(const char *path, struct ferry_err *err);
/* Remove a directory tree (used to undo a failed output folder). Best effort. */
void ferry__rm_rf(const char *path);
/* dir + "/" + name, owned by the caller; NULL on allocation failure. */
char *ferry__path_join(const char *dir, const char *name);
/* Whether path exists and is a directory / regular file. */
int ferry__is_dir(const char *path);
/* The hardware-profile folder of an installation this program runs from: BIN/../share/ferry/hw
 * beside the running executable (/proc/self/exe), so a binary installed under any prefix
 * (cmake --install --prefix P) finds P/share/ferry/hw. Owned, or NULL when there is none. */
char *ferry__installed_hw_dir(void);
int ferry__is_file(const char *path);
/* Write all bytes to fd at the current position, retrying short writes and EINTR; maps
 * ENOSPC to FERRY_ERR_NO_SPACE. `what` names the file in the message. */
ferry_status ferry__write_all(int fd, const void *buf, size_t len, const char *what, struct ferry_err *err);
/* pread exactly len bytes at offset; a short read (EOF) is FERRY_ERR_IO naming file and offset. */
ferry_status ferry__pread_all(int fd, void *buf, size_t len, uint64_t offset, const char *what,
                              struct ferry_err *err);
/* Write a whole file atomically (tmp + fsync + rename). */
ferry_status ferry__write_file_atomic(const char *path, const void *data, size_t len, struct ferry_err *err);
/* Write an output a command produced: to standard output when path is "-", else atomically to
 * the file (ferry__write_file_atomic). */
ferry_status ferry__write_output(const char *path, const void *data, size_t len);
/* Whether two paths name the same file: the same device and inode when both exist, else the
 * same resolved path (symbolic links and "..", of the longest existing prefix, resolved), so an
 * output that does not exist yet is compared too. */
int ferry__same_file(const char *a, const char *b);
/* Whether path (existing or not) is folder dir itself or lies anywhere inside it. */
int ferry__path_within(const char *path, const char *dir);

/* How a command uses a path, for ferry__check_paths. */
enum {
  FERRY_PATH_IN = 0,     /* read */
  FERRY_PATH_OUT = 1,    /* written or replaced */
  FERRY_PATH_DIR = 2,    /* a folder: everything inside it is in use too */
  FERRY_PATH_SQLITE = 4, /* an SQLite database: its -wal, -shm and -journal files too */
};
struct ferry_path_use {
  const char *option; /* "--out", for messages */
  const char *path;   /* NULL, "" and "-" (standard input or output) are skipped */
  int flags;          /* FERRY_PATH_* */
};
/* The one check every command runs on its paths before it writes anything: an output must
 * not be an input (nor inside an input folder, nor an SQLite side file of an input database),
 * nor another output; an input must not lie inside an output folder. Inputs that do not exist
 * are skipped (nothing to destroy). FERRY_ERR_INVALID with a message naming both options. */
ferry_status ferry__check_paths(const struct ferry_path_use *uses, size_t n);

/* Memory the kernel reports as available for new work (MemAvailable in /proc/meminfo), or 0
 * when it cannot be read. */
uint64_t ferry__mem_available_bytes(void);
/* Read a whole small file into an owned NUL-terminated buffer (at most max_bytes). */
ferry_status ferry__read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                              struct ferry_err *err);

#endif
