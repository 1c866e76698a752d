/* Streaming safetensors writer: tensors are declared first (so headers and shard boundaries
 * are known), then data is streamed through one large buffer into temporary files that are
 * fsynced and renamed at finish, so a model generator writes at disk speed and a failure
 * never leaves a partial file under a final name. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "runtime/store/store_impl.h"

#define WRITE_BUF_BYTES (8u << 20)
#define MAX_TOTAL_BYTES 9007199254740992ull /* 2^53: offsets must survive JSON doubles */
#define INDEX_NAME "model.safetensors.index.json"

struct wtensor {
  char *name;
  enum ferry_dtype dtype;
  int32_t ndim;
  int64_t shape[FERRY_ST_MAX_DIMS];
  uint64_t nbytes;
  uint32_t shard;
  uint64_t begin; /* offset in its shard's data area */
};

struct wshard {
  char *file_name, *final_path, *tmp_path;
  int fd;
  int dfd;              /* the same file opened with O_DIRECT for the data area, or -1 */
  uint64_t data_start;  /* file offset of the data area (a multiple of FERRY_DIRECT_ALIGN) */
  uint64_t flushed;     /* data bytes already in the file */
  int created;
  uint64_t data_bytes, written;
  size_t first, count; /* tensors [first, first + count) */
};

struct ferry_store_writer {
  struct ferry_err err;
  char *dir;
  uint64_t max_shard_bytes;
  struct wtensor *tensors;
  size_t ntensors, tensors_cap;
  struct ferry__name_index index;
  char **meta_keys, **meta_values;
  size_t nmeta;
  struct wshard *shards;
  size_t nshards, cur;
  uint64_t total_bytes, written_bytes;
  char *buf;
  size_t buf_len;
  int sealed, finished;
  ferry_status failed; /* sticky: once an I/O step failed, the output is abandoned */
};

/* ---- a growable string for the JSON headers ------------------------------------------------ */

struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = ferry__realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(struct sbuf *b, const char *fmt, ...) FERRY_PRINTF(2, 3);
static void sb_printf(struct sbuf *b, const char *fmt, ...) {
  char tmp[64];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void sb_json(struct sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  const char *run = s;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    sb_put(b, run, (size_t)(s - run));
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      sb_put(b, esc, 2);
    } else {
      sb_printf(b, "\\u%04x", c);
    }
    run = s + 1;
  }
  sb_put(b, run, (size_t)(s - run));
  sb_put(b, "\"", 1);
}

/* ---- errors --------------------------------------------------------------------------------- */

static ferry_status errno_status(int e) {
  return e == ENOSPC || e == EDQUOT ? FERRY_ERR_NO_SPACE : e == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO;
}

/* An I/O failure abandons the output: every later call reports it again. */
static ferry_status fail(ferry_store_writer *w, ferry_status st) {
  w->failed = st;
  return st;
}

static ferry_status refuse_failed(ferry_store_writer *w) {
  return ferry__err_copy(NULL, &w->err);
}

/* ---- declaration -------------------------------------------------------------------------- */

static const char *wtensor_name(const void *ctx, uint32_t i) {
  const ferry_store_writer *w = ctx;
  return w->tensors[i].name;
}

ferry_status ferry_store_writer_create(ferry_store_writer **out, const char *dir, uint64_t max_shard_bytes) {
  if (!out || !dir) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_writer_create: NULL argument");
  *out = NULL;
  if (!ferry__is_dir(dir)) return ferry__fail(FERRY_ERR_NOT_FOUND, "%s: output folder does not exist", dir);
  ferry_store_writer *w = ferry__calloc(1, sizeof *w);
  if (!w) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", dir);
  w->dir = ferry__strdup(dir);
  if (!w->dir) {
    ferry_free(w);
    return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", dir);
  }
  w->max_shard_bytes = max_shard_bytes;
  *out = w;
  return FERRY_OK;
}

ferry_status ferry_store_writer_set_metadata(ferry_store_writer *w, const char *key, const char *value) {
  if (!w || !key || !value) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_writer_set_metadata: NULL argument");
  if (w->failed) return refuse_failed(w);
  if (w->sealed)
    return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: metadata \"%s\" set after the first write", w->dir, key);
  char *v = ferry__strdup(value);
  if (!v) return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
  for (size_t i = 0; i < w->nmeta; i++) {
    if (!strcmp(w->meta_keys[i], key)) {
      ferry_free(w->meta_values[i]);
      w->meta_values[i] = v;
      return FERRY_OK;
    }
  }
  char *k = ferry__strdup(key);
  char **keys = k ? ferry__reallocarray(w->meta_keys, w->nmeta + 1, sizeof *keys) : NULL;
  if (keys) w->meta_keys = keys;
  char **values = keys ? ferry__reallocarray(w->meta_values, w->nmeta + 1, sizeof *values) : NULL;
  if (!values) {
    ferry_free(k);
    ferry_free(v);
    return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
  }
  w->meta_values = values;
  w->meta_keys[w->nmeta] = k;
  w->meta_values[w->nmeta] = v;
  w->nmeta++;
  return FERRY_OK;
}

ferry_status ferry_store_writer_add(ferry_store_writer *w, const char *name, enum ferry_dtype dtype, int32_t ndim,
                                    const int64_t *shape) {
  if (!w || !name) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_writer_add: NULL argument");
  if (w->failed) return refuse_failed(w);
  if (w->sealed)
    return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: tensor \"%s\" declared after the first write", w->dir,
                          name);
  const char *problem = ferry__st_name_problem(name);
  if (problem) return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: tensor name %s", w->dir, problem);
  if (!strcmp(name, "__metadata__"))
    return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: \"__metadata__\" is reserved, not a tensor name", w->dir);
  if ((unsigned)dtype >= FERRY_DTYPE_COUNT)
    return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: tensor \"%s\": unknown dtype %d", w->dir, name, (int)dtype);
  if (ndim < 0 || ndim > FERRY_ST_MAX_DIMS || (ndim > 0 && !shape))
    return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: tensor \"%s\": %d dimensions (expected 0..%d and a shape)",
                          w->dir, name, (int)ndim, FERRY_ST_MAX_DIMS);
  uint64_t nbytes = ferry_dtype_size(dtype);
  for (int32_t d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: tensor \"%s\": shape[%d] = %lld is negative", w->dir,
                            name, (int)d, (long long)shape[d]);
    if (shape[d] && nbytes > MAX_TOTAL_BYTES / (uint64_t)shape[d])
      return ferry__err_set(&w->err, FERRY_ERR_RANGE, "%s: tensor \"%s\": larger than 2^53 bytes", w->dir, name);
    nbytes *= (uint64_t)shape[d];
  }
  if (nbytes > MAX_TOTAL_BYTES - w->total_bytes)
    return ferry__err_set(&w->err, FERRY_ERR_RANGE, "%s: tensors add up to more than 2^53 bytes", w->dir);
  if (w->ntensors == w->tensors_cap) {
    size_t cap = w->tensors_cap ? w->tensors_cap * 2 : 64;
    struct wtensor *t = ferry__reallocarray(w->tensors, cap, sizeof *t);
    if (!t) return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
    w->tensors = t;
    w->tensors_cap = cap;
  }
  if (ferry__name_index_reserve(&w->index, w->ntensors + 1, wtensor_name, w) != FERRY_OK)
    return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
  struct wtensor *t = &w->tensors[w->ntensors];
  memset(t, 0, sizeof *t);
  t->name = ferry__strdup(name);
  if (!t->name) return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
  if (ferry__name_index_insert(&w->index, (uint32_t)w->ntensors, wtensor_name, w) >= 0) {
    ferry_free(t->name);
    return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: tensor \"%s\" declared twice", w->dir, name);
  }
  t->dtype = dtype;
  t->ndim = ndim;
  for (int32_t d = 0; d < ndim; d++) t->shape[d] = shape[d];
  t->nbytes = nbytes;
  w->ntensors++;
  w->total_bytes += nbytes;
  return FERRY_OK;
}

/* ---- layout and files ----------------------------------------------------------------------- */

/* Split the declared tensors into shards and allocate the write buffer. */
static ferry_status seal(ferry_store_writer *w) {
  size_t n = 0;
  uint64_t cur = 0;
  for (size_t i = 0; i < w->ntensors; i++) { /* count shards first */
    if (i == 0 || (w->max_shard_bytes && cur && cur + w->tensors[i].nbytes > w->max_shard_bytes)) {
      n++;
      cur = 0;
    }
    cur += w->tensors[i].nbytes;
  }
  if (n == 0) n = 1; /* no tensors: one file with an empty header */
  w->shards = ferry__calloc(n, sizeof *w->shards);
  w->buf = ferry__aligned_alloc(FERRY_DIRECT_ALIGN, WRITE_BUF_BYTES);
  if (!w->shards || !w->buf) return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
  w->nshards = n;
  for (size_t k = 0; k < n; k++) w->shards[k].fd = w->shards[k].dfd = -1;
  size_t k = 0;
  for (size_t i = 0; i < w->ntensors; i++) {
    struct wshard *sh = &w->shards[k];
    if (i > 0 && w->max_shard_bytes && sh->data_bytes && sh->data_bytes + w->tensors[i].nbytes > w->max_shard_bytes)
      sh = &w->shards[++k];
    if (!sh->count) sh->first = i;
    w->tensors[i].shard = (uint32_t)k;
    w->tensors[i].begin = sh->data_bytes;
    sh->data_bytes += w->tensors[i].nbytes;
    sh->count++;
  }
  for (k = 0; k < n; k++) {
    struct wshard *sh = &w->shards[k];
    if (w->max_shard_bytes)
      sh->file_name = ferry__asprintf("model-%05zu-of-%05zu.safetensors", k + 1, n);
    else
      sh->file_name = ferry__strdup("model.safetensors");
    if (!sh->file_name) return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
    sh->final_path = ferry__path_join(w->dir, sh->file_name);
    char *tmp_name = ferry__asprintf(".%s.tmp", sh->file_name);
    sh->tmp_path = tmp_name ? ferry__path_join(w->dir, tmp_name) : NULL;
    ferry_free(tmp_name);
    if (!sh->final_path || !sh->tmp_path) return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
  }
  w->sealed = 1;
  return FERRY_OK;
}

/* Header JSON of shard k, padded with spaces so the data area starts at a multiple of 4 KiB:
 * the data can then be written with O_DIRECT (and read with it without an envelope). */
static ferry_status build_header(ferry_store_writer *w, const struct wshard *sh, struct sbuf *b) {
  sb_str(b, "{");
  int first = 1;
  if (w->nmeta) {
    sb_str(b, "\"__metadata__\":{");
    for (size_t i = 0; i < w->nmeta; i++) {
      if (i) sb_str(b, ",");
      sb_json(b, w->meta_keys[i]);
      sb_str(b, ":");
      sb_json(b, w->meta_values[i]);
    }
    sb_str(b, "}");
    first = 0;
  }
  for (size_t i = sh->first; i < sh->first + sh->count; i++) {
    const struct wtensor *t = &w->tensors[i];
    if (!first) sb_str(b, ",");
    first = 0;
    sb_json(b, t->name);
    sb_str(b, ":{\"dtype\":");
    sb_json(b, ferry_dtype_st_name(t->dtype));
    sb_str(b, ",\"shape\":[");
    for (int32_t d = 0; d < t->ndim; d++) sb_printf(b, d ? ",%lld" : "%lld", (long long)t->shape[d]);
    sb_printf(b, "],\"data_offsets\":[%llu,", (unsigned long long)t->begin);
    sb_printf(b, "%llu]}", (unsigned long long)(t->begin + t->nbytes));
  }
  sb_str(b, "}");
  while (!b->oom && (8 + b->len) % FERRY_DIRECT_ALIGN) sb_str(b, " ");
  if (b->oom) return ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory building a header", w->dir);
  if (b->len > FERRY_ST_MAX_HEADER_BYTES)
    return ferry__err_set(&w->err, FERRY_ERR_RANGE, "%s: header of %zu bytes exceeds the %u-byte limit",
                          sh->final_path, b->len, FERRY_ST_MAX_HEADER_BYTES);
  return FERRY_OK;
}

/* Create shard k's temporary file and write its length field and header. */
static ferry_status open_shard(ferry_store_writer *w, size_t k) {
  struct wshard *sh = &w->shards[k];
  struct sbuf b = {0};
  ferry_status st = build_header(w, sh, &b);
  if (st != FERRY_OK) goto out_free;
  sh->fd = open(sh->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (sh->fd < 0) {
    st = ferry__err_set(&w->err, errno_status(errno), "%s: cannot create: %s", sh->tmp_path, strerror(errno));
    goto out_free;
  }
  sh->created = 1;
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
  st = ferry__write_all(sh->fd, len8, 8, sh->tmp_path, &w->err);
  if (st == FERRY_OK) st = ferry__write_all(sh->fd, b.p, b.len, sh->tmp_path, &w->err);
  sh->data_start = 8 + b.len;
  /* Data goes straight to the disk where the file system allows: the page cache would only
   * throttle a multi-gigabyte stream to its write-back rate. */
  if (st == FERRY_OK) sh->dfd = open(sh->tmp_path, O_WRONLY | O_DIRECT | O_CLOEXEC);
out_free:
  ferry_free(b.p);
  return st;
}

/* pwrite all of buf at offset, retrying short writes. */
static ferry_status pwrite_all(int fd, const char *buf, size_t len, uint64_t offset, const char *path,
                               struct ferry_err *err) {
  while (len) {
    ssize_t n = pwrite(fd, buf, len, (off_t)offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ferry__err_set(err, errno_status(errno), "%s: write at offset %llu failed: %s", path,
                            (unsigned long long)offset, strerror(errno));
    }
    if (n == 0) return ferry__err_set(err, FERRY_ERR_IO, "%s: write returned 0", path);
    buf += n;
    len -= (size_t)n;
    offset += (uint64_t)n;
  }
  return FERRY_OK;
}

/* Write the buffer to the current shard. With O_DIRECT only whole 4 KiB blocks go out and the
 * rest stays buffered, unless `last` (the shard's final bytes), which go through the buffered
 * descriptor. */
static ferry_status flush_buf(ferry_store_writer *w, int last) {
  if (!w->buf_len) return FERRY_OK;
  struct wshard *sh = &w->shards[w->cur];
  const uint64_t off = sh->data_start + sh->flushed;
  size_t direct = sh->dfd >= 0 ? w->buf_len / FERRY_DIRECT_ALIGN * FERRY_DIRECT_ALIGN : 0;
  ferry_status st = FERRY_OK;
  if (direct) {
    st = pwrite_all(sh->dfd, w->buf, direct, off, sh->tmp_path, &w->err);
    if (st != FERRY_OK && errno == EINVAL) { /* refused after all: stay buffered */
      close(sh->dfd);
      sh->dfd = -1;
      direct = 0;
      st = FERRY_OK;
    }
  }
  if (st != FERRY_OK) return st;
  sh->flushed += direct;
  size_t rest = w->buf_len - direct;
  if (rest && (last || sh->dfd < 0)) {
    st = pwrite_all(sh->fd, w->buf + direct, rest, off + direct, sh->tmp_path, &w->err);
    if (st != FERRY_OK) return st;
    sh->flushed += rest;
    rest = 0;
  }
  if (rest) memmove(w->buf, w->buf + direct, rest);
  w->buf_len = rest;
  return FERRY_OK;
}

static ferry_status flush(ferry_store_writer *w) { return flush_buf(w, 1); }

/* Flush the current shard and start the next one. */
static ferry_status next_shard(ferry_store_writer *w) {
  ferry_status st = flush(w);
  if (st != FERRY_OK) return st;
  w->cur++;
  return open_shard(w, w->cur);
}

ferry_status ferry_store_writer_write(ferry_store_writer *w, const void *data, size_t len) {
  if (!w || (!data && len)) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_writer_write: NULL argument");
  if (w->failed) return refuse_failed(w);
  if (w->finished) return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: write after finish", w->dir);
  if (len > w->total_bytes - w->written_bytes)
    return ferry__err_set(&w->err, FERRY_ERR_RANGE,
                          "%s: writing %zu bytes at data byte %llu overruns the %llu bytes declared", w->dir, len,
                          (unsigned long long)w->written_bytes, (unsigned long long)w->total_bytes);
  ferry_status st;
  if (!w->sealed) {
    if ((st = seal(w)) != FERRY_OK) return fail(w, st);
    if ((st = open_shard(w, 0)) != FERRY_OK) return fail(w, st);
  }
  const char *p = data;
  while (len) {
    struct wshard *sh = &w->shards[w->cur];
    uint64_t room = sh->data_bytes - sh->written;
    if (!room) {
      if ((st = next_shard(w)) != FERRY_OK) return fail(w, st);
      continue;
    }
    size_t take = room < len ? (size_t)room : len;
    if (take > WRITE_BUF_BYTES - w->buf_len) take = WRITE_BUF_BYTES - w->buf_len;
    memcpy(w->buf + w->buf_len, p, take);
    w->buf_len += take;
    if (w->buf_len == WRITE_BUF_BYTES && (st = flush_buf(w, 0)) != FERRY_OK) return fail(w, st);
    sh->written += take;
    w->written_bytes += take;
    p += take;
    len -= take;
  }
  return FERRY_OK;
}

/* The declared tensor holding data byte `pos` (for "which tensor is incomplete"). */
static const struct wtensor *tensor_at_byte(const ferry_store_writer *w, uint64_t pos) {
  uint64_t acc = 0;
  for (size_t i = 0; i < w->ntensors; i++) {
    acc += w->tensors[i].nbytes;
    if (pos < acc) return &w->tensors[i];
  }
  return NULL;
}

static ferry_status write_index(ferry_store_writer *w) {
  struct sbuf b = {0};
  sb_printf(&b, "{\"metadata\":{\"total_size\":%llu},\"weight_map\":{", (unsigned long long)w->total_bytes);
  for (size_t i = 0; i < w->ntensors; i++) {
    if (i) sb_str(&b, ",");
    sb_json(&b, w->tensors[i].name);
    sb_str(&b, ":");
    sb_json(&b, w->shards[w->tensors[i].shard].file_name);
  }
  sb_str(&b, "}}\n");
  ferry_status st;
  char *path = ferry__path_join(w->dir, INDEX_NAME);
  if (b.oom || !path)
    st = ferry__err_set(&w->err, FERRY_ERR_NOMEM, "%s: out of memory", w->dir);
  else
    st = ferry__write_file_atomic(path, b.p, b.len, &w->err);
  ferry_free(path);
  ferry_free(b.p);
  return st;
}

ferry_status ferry_store_writer_finish(ferry_store_writer *w) {
  if (!w) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_writer_finish: NULL writer");
  if (w->failed) return refuse_failed(w);
  if (w->finished) return ferry__err_set(&w->err, FERRY_ERR_INVALID, "%s: already finished", w->dir);
  if (w->written_bytes != w->total_bytes) {
    const struct wtensor *t = tensor_at_byte(w, w->written_bytes);
    return ferry__err_set(&w->err, FERRY_ERR_INVALID,
                          "%s: only %llu of %llu declared data bytes written (tensor \"%s\" is incomplete)", w->dir,
                          (unsigned long long)w->written_bytes, (unsigned long long)w->total_bytes,
                          t ? t->name : "?");
  }
  ferry_status st;
  if (!w->sealed) {
    if ((st = seal(w)) != FERRY_OK) return fail(w, st);
    if ((st = open_shard(w, 0)) != FERRY_OK) return fail(w, st);
  }
  while (w->cur + 1 < w->nshards) /* shards of zero-byte tensors not yet reached */
    if ((st = next_shard(w)) != FERRY_OK) return fail(w, st);
  if ((st = flush(w)) != FERRY_OK) return fail(w, st);
  for (size_t k = 0; k < w->nshards; k++) {
    struct wshard *sh = &w->shards[k];
    if (fsync(sh->fd) != 0)
      return fail(w, ferry__err_set(&w->err, errno_status(errno), "%s: fsync failed: %s", sh->tmp_path,
                                    strerror(errno)));
    if (sh->dfd >= 0) {
      close(sh->dfd);
      sh->dfd = -1;
    }
    int rc = close(sh->fd);
    sh->fd = -1;
    if (rc != 0)
      return fail(w, ferry__err_set(&w->err, errno_status(errno), "%s: close failed: %s", sh->tmp_path,
                                    strerror(errno)));
  }
  for (size_t k = 0; k < w->nshards; k++) {
    struct wshard *sh = &w->shards[k];
    if (rename(sh->tmp_path, sh->final_path) != 0)
      return fail(w, ferry__err_set(&w->err, errno_status(errno), "%s: rename to %s failed: %s", sh->tmp_path,
                                    sh->final_path, strerror(errno)));
    sh->created = 0; /* nothing temporary left to remove */
  }
  if (w->max_shard_bytes && (st = write_index(w)) != FERRY_OK) {
    /* without its index the set is unusable: take the shards back too */
    for (size_t k = 0; k < w->nshards; k++) unlink(w->shards[k].final_path);
    return fail(w, st);
  }
  int dfd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) { /* make the renames durable; best effort */
    (void)fsync(dfd);
    close(dfd);
  }
  w->finished = 1;
  return FERRY_OK;
}

const char *ferry_store_writer_errmsg(const ferry_store_writer *w) { return w ? w->err.msg : ""; }

void ferry_store_writer_free(ferry_store_writer *w) {
  if (!w) return;
  for (size_t k = 0; k < w->nshards; k++) {
    struct wshard *sh = &w->shards[k];
    if (sh->fd >= 0) close(sh->fd);
    if (sh->dfd >= 0) close(sh->dfd);
    if (sh->created && sh->tmp_path) unlink(sh->tmp_path);
    ferry_free(sh->file_name);
    ferry_free(sh->final_path);
    ferry_free(sh->tmp_path);
  }
  ferry_free(w->shards);
  for (size_t i = 0; i < w->ntensors; i++) ferry_free(w->tensors[i].name);
  ferry_free(w->tensors);
  ferry__name_index_free(&w->index);
  for (size_t i = 0; i < w->nmeta; i++) {
    ferry_free(w->meta_keys[i]);
    ferry_free(w->meta_values[i]);
  }
  ferry_free(w->meta_keys);
  ferry_free(w->meta_values);
  ferry_free(w->buf);
  ferry_free(w->dir);
  ferry_free(w);
}
