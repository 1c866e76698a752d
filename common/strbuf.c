/* The growable string shared by every writer of JSONL, HTML, Markdown and gnuplot text. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strbuf.h"

static int reserve(struct ferry_strbuf *b, size_t extra) {
  if (b->oom) return -1;
  if (b->len + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) {
    if (cap > SIZE_MAX / 2) {
      b->oom = 1;
      return -1;
    }
    cap *= 2;
  }
  char *p = ferry__realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

void ferry__sb_put(struct ferry_strbuf *b, const char *s, size_t n) {
  if (reserve(b, n)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void ferry__sb_puts(struct ferry_strbuf *b, const char *s) { ferry__sb_put(b, s, strlen(s)); }

void ferry__sb_vprintf(struct ferry_strbuf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) {
    b->oom = 1;
    return;
  }
  if (reserve(b, (size_t)n)) return;
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void ferry__sb_printf(struct ferry_strbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ferry__sb_vprintf(b, fmt, ap);
  va_end(ap);
}

void ferry__sb_free(struct ferry_strbuf *b) {
  ferry_free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
  b->oom = 0;
}
