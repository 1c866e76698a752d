/* One pass over a store's floating-point tensors counting NaN and infinite values, so a model
 * whose weights hold them is refused (or run knowingly) before it computes garbage. The result
 * is kept in the store: several engines on one store read the weights once. */
#include <string.h>

#include "common/alloc.h"
#include "runtime/store/store_impl.h"

#define SCAN_CHUNK_BYTES (4u << 20)

/* Non-finite elements in n bytes of one dtype (n a multiple of the element size): the
 * exponent bits all set (NaN and Inf), or the one NaN encoding of fp8 e4m3, which has no Inf. */
static uint64_t count_nonfinite(enum ferry_dtype dt, const unsigned char *p, size_t n, uint64_t *first) {
  uint64_t count = 0;
  size_t es = ferry_dtype_size(dt);
  for (size_t i = 0; i < n; i += es) {
    int bad;
    switch (dt) {
      case FERRY_DTYPE_F32: {
        uint32_t v;
        memcpy(&v, p + i, 4);
        bad = (v & 0x7f800000u) == 0x7f800000u;
        break;
      }
      case FERRY_DTYPE_F64: {
        uint64_t v;
        memcpy(&v, p + i, 8);
        bad = (v & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        break;
      }
      case FERRY_DTYPE_F16:
      case FERRY_DTYPE_BF16: {
        uint16_t v;
        memcpy(&v, p + i, 2);
        const uint16_t exp = dt == FERRY_DTYPE_F16 ? 0x7c00u : 0x7f80u;
        bad = (v & exp) == exp;
        break;
      }
      case FERRY_DTYPE_F8_E5M2: bad = (p[i] & 0x7cu) == 0x7cu; break;
      case FERRY_DTYPE_F8_E4M3: bad = (p[i] & 0x7fu) == 0x7fu; break;
      default: return 0;
    }
    if (bad) {
      if (!count && first) *first = i / es;
      count++;
    }
  }
  return count;
}

static int is_float(enum ferry_dtype dt) {
  return dt == FERRY_DTYPE_F32 || dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16 || dt == FERRY_DTYPE_F64 ||
         dt == FERRY_DTYPE_F8_E4M3 || dt == FERRY_DTYPE_F8_E5M2;
}

ferry_status ferry_store_scan_nonfinite(ferry_store *store, struct ferry_store_nonfinite *out) {
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
      /* a one-time check must not leave the weights in the page cache for "disk" reads */
      st = ferry_store_read_range(store, x->file, x->offset + done_bytes, n, buf, SCAN_CHUNK_BYTES,
                                  FERRY_READ_DROP_CACHE, NULL);
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
