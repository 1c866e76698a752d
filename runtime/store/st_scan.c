/* One pass over a store's floating-point tensors counting NaN and infinite values, so a model
 * whose weights hold them is refused (or run knowingly) before it computes garbage. The result
 * is kept in the store: several engines on one store read the weights once. */
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "runtime/store/store_impl.h"

#define SCAN_CHUNK_BYTES (4u << 20)

/* Non-finite elements among n of one width: those with every exponent bit set (NaN and Inf),
 * or for fp8 e4m3, which has no Inf, its one NaN pattern. Plain loops over the aligned buffer,
 * which the compiler vectorises: the scan runs at disk speed. The first one's index is found
 * only when there is one. */
#define COUNT_MASKED(T, mask)                                                       \
  static uint64_t count_##T(const T *v, size_t n, T m, uint64_t *first) {           \
    uint64_t c = 0;                                                                 \
    for (size_t i = 0; i < n; i++) c += (v[i] & m) == m;                            \
    if (c)                                                                          \
      for (size_t i = 0; i < n; i++)                                                \
        if ((v[i] & m) == m) {                                                      \
          *first = i;                                                               \
          break;                                                                    \
        }                                                                           \
    return c;                                                                       \
  }
COUNT_MASKED(uint8_t, mask)
COUNT_MASKED(uint16_t, mask)
COUNT_MASKED(uint32_t, mask)
COUNT_MASKED(uint64_t, mask)
#undef COUNT_MASKED

/* buf is ferry_malloc'd (aligned for any scalar) and holds whole elements */
static uint64_t count_nonfinite(enum ferry_dtype dt, const void *buf, size_t bytes, uint64_t *first) {
  switch (dt) {
    case FERRY_DTYPE_F32: return count_uint32_t(buf, bytes / 4, 0x7f800000u, first);
    case FERRY_DTYPE_F64: return count_uint64_t(buf, bytes / 8, 0x7ff0000000000000ull, first);
    case FERRY_DTYPE_F16: return count_uint16_t(buf, bytes / 2, 0x7c00u, first);
    case FERRY_DTYPE_BF16: return count_uint16_t(buf, bytes / 2, 0x7f80u, first);
    case FERRY_DTYPE_F8_E5M2: return count_uint8_t(buf, bytes, 0x7cu, first);
    case FERRY_DTYPE_F8_E4M3: return count_uint8_t(buf, bytes, 0x7fu, first);
    default: return 0;
  }
}

static int is_float(enum ferry_dtype dt) {
  return dt == FERRY_DTYPE_F32 || dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16 || dt == FERRY_DTYPE_F64 ||
         dt == FERRY_DTYPE_F8_E4M3 || dt == FERRY_DTYPE_F8_E5M2;
}

ferry_status ferry_store_scan_nonfinite(ferry_store *store, unsigned flags, struct ferry_store_nonfinite *out) {
  if (!store || !out) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_scan_nonfinite: missing argument");
  pthread_mutex_lock(&store->lock);
  const int done = store->nonfinite_scanned;
  if (done) *out = store->nonfinite;
  pthread_mutex_unlock(&store->lock);
  if (done) return FERRY_OK;
  struct ferry_store_nonfinite r;
  memset(&r, 0, sizeof r);
  unsigned char *buf = ferry_malloc(SCAN_CHUNK_BYTES);
  if (!buf) return ferry__fail(FERRY_ERR_NOMEM, "store: out of memory for the non-finite scan");
  ferry_status st = FERRY_OK;
  for (size_t t = 0; t < store->ntensors && st == FERRY_OK; t++) {
    const struct ferry_store_tensor *x = &store->tensors[t];
    if (!is_float(x->dtype)) continue;
    const uint64_t es = ferry_dtype_size(x->dtype), step = SCAN_CHUNK_BYTES / es * es;
    uint64_t in_tensor = 0, first = 0;
    for (uint64_t done_bytes = 0; done_bytes < x->nbytes; done_bytes += step) {
      const uint64_t n = x->nbytes - done_bytes < step ? x->nbytes - done_bytes : step;
      /* buffered; with DROP_CACHE a one-time check leaves no weights in the page cache for "disk" reads */
      st = ferry_store_read_range(store, x->file, x->offset + done_bytes, n, buf, SCAN_CHUNK_BYTES,
                                  flags & FERRY_READ_DROP_CACHE, NULL);
      if (st != FERRY_OK) break;
      uint64_t at = 0;
      const uint64_t c = count_nonfinite(x->dtype, buf, (size_t)(n / es * es), &at);
      if (c && !in_tensor) first = done_bytes / es + at;
      in_tensor += c;
    }
    if (in_tensor) {
      if (!r.tensors++) {
        r.first_tensor = x->name;
        r.first_file = x->file;
        r.first_count = in_tensor;
        r.first_index = first;
      }
      r.values += in_tensor;
    }
  }
  ferry_free(buf);
  if (st != FERRY_OK) return st;
  pthread_mutex_lock(&store->lock);
  store->nonfinite = r;
  store->nonfinite_scanned = 1;
  pthread_mutex_unlock(&store->lock);
  *out = r;
  return FERRY_OK;
}
