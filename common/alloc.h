/* Internal allocation helpers; all go through the hook in alloc.c so tests can inject
 * failures (ferry_alloc_fail_after). */
#ifndef FERRY_COMMON_ALLOC_H
#define FERRY_COMMON_ALLOC_H

#include <stddef.h>

#include "ferry/alloc.h"

void *ferry__calloc(size_t n, size_t size);
void *ferry__realloc(void *ptr, size_t size);
/* Reallocate an array of n elements of size bytes, checking n * size for overflow. */
void *ferry__reallocarray(void *ptr, size_t n, size_t size);
char *ferry__strdup(const char *s);
char *ferry__strndup(const char *s, size_t n);
/* Aligned allocation (alignment a power of two, size rounded up to it); free with
 * ferry_free(). */
void *ferry__aligned_alloc(size_t alignment, size_t size);
/* Page-aligned memory of its own mapping (through the same failure hook), returned to the
 * system by ferry__pages_free(ptr, size) with the size it was allocated with. */
void *ferry__pages_alloc(size_t size);
void ferry__pages_free(void *ptr, size_t size);
/* printf into a new owned string. */
char *ferry__asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
