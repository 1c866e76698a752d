/* SHA-256 (FIPS 180-4) of a buffer or a file: the identity of an imported file, so importing
 * the same Nsight Systems export twice finds the first run. */
#ifndef FERRY_COMMON_SHA256_H
#define FERRY_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

struct ferry__sha256 {
  uint32_t h[8];
  uint64_t len;      /* bytes hashed so far */
  uint8_t buf[64];
  size_t used;       /* bytes in buf */
};

void ferry__sha256_init(struct ferry__sha256 *s);
void ferry__sha256_update(struct ferry__sha256 *s, const void *data, size_t n);
/* The digest as 64 lowercase hex digits and a NUL. */
void ferry__sha256_hex(struct ferry__sha256 *s, char out[65]);
/* The file's digest; FERRY_ERR_IO naming the file when it cannot be read. */
ferry_status ferry__sha256_file(const char *path, char out[65], struct ferry_err *err);

#endif
