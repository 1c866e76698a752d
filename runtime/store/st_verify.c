/* Verified reads (ferry_store_set_verify()): the CRC-32 of every byte range as first read,
 * kept in an open-addressing table, and compared with each later read of the same range, so a
 * file changed under a running engine, or bytes damaged between the disk and memory, are seen
 * and re-read instead of computed with. */
#include <string.h>
#include <zlib.h>

#include "common/alloc.h"
#include "runtime/store/store_impl.h"

static uint64_t key_hash(uint32_t file, uint64_t offset, uint64_t len) {
  uint64_t h = offset * 0x9e3779b97f4a7c15ULL ^ len * 0xbf58476d1ce4e5b9ULL ^ file;
  return h ^ (h >> 29);
}

static struct ferry__st_crc *find_slot(struct ferry__st_crc *t, size_t cap, uint32_t file, uint64_t offset,
                                       uint64_t len) {
  size_t i = (size_t)key_hash(file, offset, len) & (cap - 1);
  while (t[i].used && !(t[i].file == file && t[i].offset == offset && t[i].len == len)) i = (i + 1) & (cap - 1);
  return &t[i];
}

static int grow(ferry_store *s) {
  size_t cap = s->crc_cap ? s->crc_cap * 2 : 256;
  struct ferry__st_crc *t = ferry__calloc(cap, sizeof *t);
  if (!t) return 0;
  for (size_t i = 0; i < s->crc_cap; i++)
    if (s->crcs[i].used) *find_slot(t, cap, s->crcs[i].file, s->crcs[i].offset, s->crcs[i].len) = s->crcs[i];
  ferry_free(s->crcs);
  s->crcs = t;
  s->crc_cap = cap;
  return 1;
}

ferry_status ferry__st_crc_check(ferry_store *s, uint32_t file, uint64_t offset, uint64_t len, const void *buf,
                                 uint32_t *expected, uint32_t *got) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const unsigned char *p = buf;
  for (uint64_t left = len; left;) {
    uInt n = left > (1u << 30) ? (1u << 30) : (uInt)left;
    crc = crc32(crc, p, n);
    p += n;
    left -= n;
  }
  *got = (uint32_t)crc;
  ferry_status st = FERRY_OK;
  pthread_mutex_lock(&s->lock);
  if ((s->crc_count + 1) * 2 > s->crc_cap && !grow(s)) {
    pthread_mutex_unlock(&s->lock);
    return FERRY_OK; /* out of memory: this read goes unverified rather than failing */
  }
  struct ferry__st_crc *e = find_slot(s->crcs, s->crc_cap, file, offset, len);
  if (!e->used) {
    *e = (struct ferry__st_crc){.offset = offset, .len = len, .file = file, .crc = *got, .used = 1};
    s->crc_count++;
  } else if (e->crc != *got) {
    *expected = e->crc;
    st = FERRY_ERR_IO;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

void ferry__st_crc_free(ferry_store *s) {
  ferry_free(s->crcs);
  s->crcs = NULL;
  s->crc_cap = s->crc_count = 0;
}

void ferry_store_set_verify(ferry_store *store, int on) {
  if (!store) return;
  pthread_mutex_lock(&store->lock);
  store->verify = on != 0;
  pthread_mutex_unlock(&store->lock);
}
