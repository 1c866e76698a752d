/* Internal layout of ferry_store shared by the reader (st_read.c), the disk reads (st_io.c)
 * and the writer (st_write.c), plus the name hash index both reader and writer use to find
 * tensors and reject duplicates in O(1). */
#ifndef FERRY_STORE_IMPL_H
#define FERRY_STORE_IMPL_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "ferry/store.h"

/* Open-addressing hash of tensor names to indices into a caller's array of names. */
struct ferry__name_index {
  uint32_t *slots; /* index + 1; 0 = empty */
  size_t cap;      /* power of two, or 0 */
  size_t count;
};

/* Make room for at least n names (rehashing the existing ones with get_name). */
ferry_status ferry__name_index_reserve(struct ferry__name_index *ix, size_t n,
                                       const char *(*get_name)(const void *ctx, uint32_t i), const void *ctx);
/* Find name; returns the stored index or -1. */
int64_t ferry__name_index_find(const struct ferry__name_index *ix, const char *name,
                               const char *(*get_name)(const void *ctx, uint32_t i), const void *ctx);
/* Insert index i (whose name is get_name(ctx, i)); returns the existing index if the name is
 * already present (nothing inserted), else -1. Room must have been reserved. */
int64_t ferry__name_index_insert(struct ferry__name_index *ix, uint32_t i,
                                 const char *(*get_name)(const void *ctx, uint32_t i), const void *ctx);
void ferry__name_index_free(struct ferry__name_index *ix);

/* States of a file's O_DIRECT descriptor. */
enum { DIRECT_UNTRIED = -2, DIRECT_REFUSED = -1 };

struct ferry__st_file {
  char *path;
  int fd;             /* buffered reads */
  int direct_fd;      /* O_DIRECT descriptor, or DIRECT_UNTRIED / DIRECT_REFUSED */
  int direct_refused; /* a read on direct_fd was refused (EINVAL): use buffered reads */
  uint64_t size;      /* bytes */
  uint64_t data_start; /* 8 + header length */
};

/* The checksum of one range as first read (ferry_store_set_verify()). */
struct ferry__st_crc {
  uint64_t offset, len;
  uint32_t file, crc;
  int used;
};

struct ferry_store {
  struct ferry_err err;
  pthread_mutex_t lock; /* guards err and the lazy O_DIRECT descriptors during reads */
  struct ferry__st_file *files;
  size_t nfiles;
  struct ferry_store_tensor *tensors; /* names owned (allocated one by one) */
  size_t ntensors, tensors_cap;
  struct ferry__name_index index;
  cJSON *metadata; /* __metadata__ object of the first file, or NULL */
  int direct_refused; /* some file refused O_DIRECT: every DIRECT read is buffered */
  int verify;                              /* ferry_store_set_verify(): reads are checksummed */
  struct ferry__st_crc *crcs;              /* CRC-32 of each range read so far (guarded by lock) */
  size_t crc_cap, crc_count;
  int nonfinite_scanned;                   /* ferry_store_scan_nonfinite() ran: its result below */
  struct ferry_store_nonfinite nonfinite;  /* guarded by lock */
};

/* Validate a tensor name (non-empty, no control characters); returns a static description of
 * the problem, or NULL when valid. */
const char *ferry__st_name_problem(const char *name);

/* Parse a safetensors dtype name ("F32", ...) — only the safetensors spellings. */
ferry_status ferry__st_dtype_parse(const char *text, enum ferry_dtype *out);

/* Verified reads: compare [buf, buf + len) read from (file, offset) with the checksum of the
 * first read of that range (recording it on the first read). FERRY_OK when it matches or is
 * new, FERRY_ERR_IO on a mismatch (stored checksum in *expected, this read's in *got). */
ferry_status ferry__st_crc_check(ferry_store *s, uint32_t file, uint64_t offset, uint64_t len, const void *buf,
                                 uint32_t *expected, uint32_t *got);
void ferry__st_crc_free(ferry_store *s);

/* Test hook: behave as if O_DIRECT were refused on every file of the store (so the buffered
 * fallback can be tested on file systems that accept O_DIRECT). */
void ferry__store_force_direct_refused(ferry_store *store);

#endif
