/* A growable string: appends never fail loudly; the first allocation failure sets `oom` and
 * later appends do nothing, so a builder can be filled without checking every call. */
#ifndef FERRY_COMMON_STRBUF_H
#define FERRY_COMMON_STRBUF_H

#include <stdarg.h>
#include <stddef.h>

#include "common/error.h"

struct ferry_strbuf {
  char *p;     /* NUL-terminated once anything was appended; owned */
  size_t len, cap;
  int oom;
};

void ferry__sb_put(struct ferry_strbuf *b, const char *s, size_t n);
void ferry__sb_puts(struct ferry_strbuf *b, const char *s);
void ferry__sb_printf(struct ferry_strbuf *b, const char *fmt, ...) FERRY_PRINTF(2, 3);
void ferry__sb_vprintf(struct ferry_strbuf *b, const char *fmt, va_list ap);
void ferry__sb_free(struct ferry_strbuf *b);

#endif
