/* Disk-tier buffers as files (ferry_exec_alloc() with FERRY_TIER_DISK): each one a sparse file in
 * a private folder the executor makes at its first one and removes when destroyed, read and
 * written with pread/pwrite by the copies between it and host memory. Shared by the executors
 * that keep real bytes. */
#ifndef FERRY_EXEC_DISK_FILE_H
#define FERRY_EXEC_DISK_FILE_H

#include <pthread.h>
#include <stdint.h>

#include "exec_impl.h"

/* Where an executor's disk-tier files go. */
struct ferry__disk_dir {
  char *base;      /* the folder the private one is made in (owned; NULL: $TMPDIR, else /tmp) */
  char *path;      /* the private folder, made at the first file (owned), or NULL */
  uint64_t made;   /* files made so far: each one's name starts with its number */
  pthread_mutex_t mu;
};

/* base: ferry_exec_config::disk_dir (copied; NULL for the default). FERRY_ERR_NOMEM. */
ferry_status ferry__disk_dir_init(struct ferry__disk_dir *d, const char *base);
/* Remove the private folder (its files are removed as their buffers are freed). */
void ferry__disk_dir_fini(struct ferry__disk_dir *d);

/* Make buf's file (buf->bytes long, sparse) and open it: buf->file names it, buf->backend_ptr
 * holds it. FERRY_ERR_IO naming the folder or file on failure (in ex's message). */
ferry_status ferry__disk_file_open(struct ferry_exec *ex, struct ferry__disk_dir *d, ferry_buf *buf);
/* Close and remove buf's file. */
void ferry__disk_file_close(ferry_buf *buf);

/* Run a copy between a disk-tier buffer and a host-tier one (FERRY_COPY_DISK_TO_HOST or
 * FERRY_COPY_HOST_TO_DISK): the whole range or a failure reported with ferry__exec_op_failed()
 * (FERRY_ERR_IO, or FERRY_ERR_RANGE past the file's end), naming the file and offset. */
void ferry__disk_file_copy(struct ferry_exec *ex, const struct ferry_op *op);

#endif
