/* Large copies with non-temporal stores (host_copy.h says why). */
#include "host_copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>

void ferry__host_copy(void *dst, const void *src, size_t n) {
  if (n < FERRY_HOST_STREAM_COPY_BYTES) {
    memcpy(dst, src, n);
    return;
  }
  char *d = dst;
  const char *s = src;
  /* the head up to a 16-byte aligned destination, as a plain copy */
  const size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  /* 64 bytes an iteration: four unaligned loads, four streaming stores */
  const size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 16));
    const __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 32));
    const __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 48));
    _mm_stream_si128((__m128i *)(void *)(d + i), a);
    _mm_stream_si128((__m128i *)(void *)(d + i + 16), b);
    _mm_stream_si128((__m128i *)(void *)(d + i + 32), c);
    _mm_stream_si128((__m128i *)(void *)(d + i + 48), e);
  }
  /* streaming stores are weakly ordered: fence them before the copy is reported done (and the
   * consumer, on another thread, reads the bytes) */
  _mm_sfence();
  memcpy(d + body, s + body, n - body);
}

#else

void ferry__host_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

#endif
