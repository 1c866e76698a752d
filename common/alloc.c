/* The one allocation hook: counts allocations and fails the Nth on request, so tests can
 * drive every out-of-memory path. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "common/alloc.h"

static atomic_int_fast64_t fail_countdown = -1;
static atomic_uint_fast64_t alloc_count;

void ferry_alloc_fail_after(int64_t n) { atomic_store(&fail_countdown, n < 0 ? -1 : n); }

uint64_t ferry_alloc_count(void) { return atomic_load(&alloc_count); }

/* True when this allocation should fail by injection. */
static int injected_failure(void) {
  atomic_fetch_add(&alloc_count, 1);
  int_fast64_t cur = atomic_load(&fail_countdown);
  while (cur >= 0) {
    if (atomic_compare_exchange_weak(&fail_countdown, &cur, cur - 1)) return cur == 0;
  }
  return 0;
}

void *ferry_malloc(size_t size) {
  if (injected_failure()) return NULL;
  return malloc(size ? size : 1);
}

void ferry_free(void *ptr) { free(ptr); }

void *ferry__calloc(size_t n, size_t size) {
  if (injected_failure()) return NULL;
  return calloc(n ? n : 1, size ? size : 1);
}

void *ferry__realloc(void *ptr, size_t size) {
  if (injected_failure()) return NULL;
  return realloc(ptr, size ? size : 1);
}

void *ferry__reallocarray(void *ptr, size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  return ferry__realloc(ptr, n * size);
}

char *ferry__strndup(const char *s, size_t n) {
  char *d = ferry_malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *ferry__strdup(const char *s) { return ferry__strndup(s, strlen(s)); }

void *ferry__aligned_alloc(size_t alignment, size_t size) {
  if (injected_failure()) return NULL;
  if (alignment < sizeof(void *)) alignment = sizeof(void *);
  size_t rounded = (size + alignment - 1) / alignment * alignment;
  if (rounded == 0) rounded = alignment;
  void *p = NULL;
  if (posix_memalign(&p, alignment, rounded) != 0) return NULL;
  return p;
}

/* Large buffers come straight from the kernel so that freeing one gives its memory back at once:
 * through malloc, glibc's dynamic mmap threshold moves up to the size of the first large block
 * freed, and later blocks of that size stay on the heap after they are freed, so memory the
 * engine sheds under pressure would not leave the process. Sanitizer builds keep malloc, whose
 * bounds the sanitizer checks. */
#if defined(__SANITIZE_ADDRESS__)
#define FERRY_PAGES_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_PAGES_MALLOC 1
#endif
#endif

void *ferry__pages_alloc(size_t size) {
#ifdef FERRY_PAGES_MALLOC
  return ferry__aligned_alloc(4096, size);
#else
  if (injected_failure()) return NULL;
  void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
#endif
}

void ferry__pages_free(void *ptr, size_t size) {
  if (!ptr) return;
#ifdef FERRY_PAGES_MALLOC
  (void)size;
  ferry_free(ptr);
#else
  munmap(ptr, size ? size : 1);
#endif
}

char *ferry__asprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *s = ferry_malloc((size_t)n + 1);
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}
