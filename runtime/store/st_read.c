/* Safetensors reader: opens one file, a sharded set described by model.safetensors.index.json,
 * or a folder, and validates every length and offset before anything is used (the format is
 * attack surface: the header length, shapes and offsets all come from the file). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "runtime/store/store_impl.h"

#define INDEX_NAME "model.safetensors.index.json"

/* ---- small helpers shared with the writer ------------------------------------------------- */

const char *ferry__st_name_problem(const char *name) {
  if (!name || !*name) return "is empty";
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p < 0x20 || *p == 0x7f) return "contains a control character";
  return NULL;
}

ferry_status ferry__st_dtype_parse(const char *text, enum ferry_dtype *out) {
  if (!text) return FERRY_ERR_INVALID;
  for (int i = 0; i < FERRY_DTYPE_COUNT; i++) {
    if (!strcmp(text, ferry_dtype_st_name((enum ferry_dtype)i))) {
      *out = (enum ferry_dtype)i;
      return FERRY_OK;
    }
  }
  return FERRY_ERR_INVALID;
}

static const char *tensor_name(const void *ctx, uint32_t i) {
  const ferry_store *s = ctx;
  return s->tensors[i].name;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static uint64_t read_le64(const unsigned char *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
  return v;
}

/* ---- one safetensors file ------------------------------------------------------------------ */

/* cJSON decodes "\u0000" into a NUL that silently truncates a name ("a\u0000b" would become
 * "a"), so reject the escape outright: returns its byte offset in the header, or -1. */
static int64_t find_escaped_nul(const char *text, size_t len) {
  for (size_t i = 0; i + 1 < len; i++) {
    if (text[i] != '\\') continue;
    if (text[i + 1] == 'u' && i + 5 < len && !memcmp(text + i + 2, "0000", 4)) return (int64_t)i;
    i++; /* skip the escaped character: an escaped backslash then "u0000" is plain text */
  }
  return -1;
}

/* A tensor's [begin, end) inside the data area, for the coverage check. */
struct span {
  uint64_t begin, end;
  size_t tensor;
};

static int span_cmp(const void *a, const void *b) {
  const struct span *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static ferry_status append_file(ferry_store *s, const char *path, struct ferry__st_file **out) {
  struct ferry__st_file *files = ferry__reallocarray(s->files, s->nfiles + 1, sizeof *files);
  if (!files) return ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", path);
  s->files = files;
  struct ferry__st_file *f = &files[s->nfiles];
  memset(f, 0, sizeof *f);
  f->fd = -1;
  f->direct_fd = DIRECT_UNTRIED;
  f->path = ferry__strdup(path);
  if (!f->path) return ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", path);
  s->nfiles++;
  *out = f;
  return FERRY_OK;
}

static ferry_status reserve_tensors(ferry_store *s, size_t extra, const char *path) {
  size_t need = s->ntensors + extra;
  if (need <= s->tensors_cap) return FERRY_OK;
  size_t cap = s->tensors_cap ? s->tensors_cap : 64;
  while (cap < need) cap *= 2;
  struct ferry_store_tensor *t = ferry__reallocarray(s->tensors, cap, sizeof *t);
  if (!t) return ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory for %zu tensors", path, need);
  s->tensors = t;
  s->tensors_cap = cap;
  if (ferry__name_index_reserve(&s->index, need, tensor_name, s) != FERRY_OK)
    return ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory for %zu tensors", path, need);
  return FERRY_OK;
}

static ferry_status parse_metadata(ferry_store *s, const char *path, const cJSON *meta) {
  if (!cJSON_IsObject(meta))
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: \"__metadata__\" must be an object of strings", path);
  for (const cJSON *m = meta->child; m; m = m->next) {
    if (!cJSON_IsString(m))
      return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                            "%s: \"__metadata__\" value of \"%s\" must be a string", path, m->string);
    for (const cJSON *o = meta->child; o != m; o = o->next)
      if (!strcmp(o->string, m->string))
        return ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: duplicate \"__metadata__\" key \"%s\"", path,
                              m->string);
  }
  return FERRY_OK;
}

/* Parse one tensor entry into *t (name not yet set). data_size is the data area length. */
static ferry_status parse_tensor(ferry_store *s, const char *path, const cJSON *e, uint64_t data_size,
                                 struct ferry_store_tensor *t, uint64_t *begin_out, uint64_t *end_out) {
  const char *name = e->string;
  if (!cJSON_IsObject(e))
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: tensor \"%s\": expected an object with dtype, shape and data_offsets", path, name);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  if (!cJSON_IsString(dtype))
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: tensor \"%s\": missing or non-string \"dtype\"", path,
                          name);
  if (ferry__st_dtype_parse(dtype->valuestring, &t->dtype) != FERRY_OK)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: tensor \"%s\": unknown dtype \"%s\" (expected a safetensors dtype such as F32, "
                          "F16, BF16, I8, U8, F8_E4M3)",
                          path, name, dtype->valuestring);

  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
  if (!cJSON_IsArray(shape))
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: tensor \"%s\": missing or non-array \"shape\"", path,
                          name);
  int nd = cJSON_GetArraySize(shape);
  if (nd > FERRY_ST_MAX_DIMS)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: tensor \"%s\": %d dimensions, at most %d supported",
                          path, name, nd, FERRY_ST_MAX_DIMS);
  t->ndim = nd;
  uint64_t numel = 1;
  int overflow = 0;
  int d = 0;
  for (const cJSON *x = shape->child; x; x = x->next, d++) {
    if (!ferry__json_is_int(x, 0, 9007199254740992.0))
      return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                            "%s: tensor \"%s\": shape[%d] must be a non-negative integer", path, name, d);
    uint64_t v = (uint64_t)x->valuedouble;
    t->shape[d] = (int64_t)v;
    if (v && numel > UINT64_MAX / v) overflow = 1;
    numel *= v;
  }
  for (; d < FERRY_ST_MAX_DIMS; d++) t->shape[d] = 0;

  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!offs)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: tensor \"%s\": missing \"data_offsets\"", path, name);
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
      !ferry__json_is_int(offs->child, 0, 9007199254740992.0) ||
      !ferry__json_is_int(offs->child->next, 0, 9007199254740992.0))
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: tensor \"%s\": \"data_offsets\" must be [begin, end] of non-negative integers", path,
                          name);
  uint64_t begin = (uint64_t)offs->child->valuedouble, end = (uint64_t)offs->child->next->valuedouble;
  if (begin > end)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: tensor \"%s\": data_offsets [%llu, %llu]: begin is after end", path, name,
                          (unsigned long long)begin, (unsigned long long)end);
  size_t esize = ferry_dtype_size(t->dtype);
  if (overflow || numel > UINT64_MAX / esize)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: tensor \"%s\": shape overflows 64-bit byte count", path,
                          name);
  uint64_t nbytes = numel * esize;
  if (nbytes != end - begin)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes but dtype %s with %llu "
                          "elements needs %llu",
                          path, name, (unsigned long long)begin, (unsigned long long)end,
                          (unsigned long long)(end - begin), dtype->valuestring, (unsigned long long)numel,
                          (unsigned long long)nbytes);
  if (end > data_size)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: tensor \"%s\": data_offsets [%llu, %llu] past the end of the data area (%llu bytes)",
                          path, name, (unsigned long long)begin, (unsigned long long)end,
                          (unsigned long long)data_size);
  t->nbytes = nbytes;
  *begin_out = begin;
  *end_out = end;
  return FERRY_OK;
}

/* The tensors of one file must tile its data area exactly: no overlap, no hole, nothing after. */
static ferry_status check_coverage(ferry_store *s, const char *path, struct span *spans, size_t n,
                                   uint64_t data_size) {
  qsort(spans, n, sizeof *spans, span_cmp);
  uint64_t expect = 0;
  for (size_t i = 0; i < n; i++) {
    const char *name = s->tensors[spans[i].tensor].name;
    if (spans[i].begin < expect)
      return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                            "%s: tensor \"%s\": data_offsets [%llu, %llu] overlap \"%s\" which ends at %llu", path,
                            name, (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end,
                            s->tensors[spans[i - 1].tensor].name, (unsigned long long)expect);
    if (spans[i].begin > expect)
      return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                            "%s: tensor \"%s\": hole in the data area: bytes [%llu, %llu) belong to no tensor "
                            "(expected it to begin at %llu)",
                            path, name, (unsigned long long)expect, (unsigned long long)spans[i].begin,
                            (unsigned long long)expect);
    expect = spans[i].end;
  }
  if (expect != data_size)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: trailing bytes after the data: tensors end at data offset %llu but the data area "
                          "holds %llu bytes (expected the file to end at byte %llu)",
                          path, (unsigned long long)expect, (unsigned long long)data_size,
                          (unsigned long long)(s->files[s->nfiles - 1].data_start + expect));
  return FERRY_OK;
}

static ferry_status parse_header(ferry_store *s, struct ferry__st_file *f, const cJSON *root) {
  const char *path = f->path;
  uint32_t file_index = (uint32_t)(s->nfiles - 1);
  uint64_t data_size = f->size - f->data_start;
  if (!cJSON_IsObject(root))
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: header must be a JSON object", path);
  int count = cJSON_GetArraySize(root);
  ferry_status st = reserve_tensors(s, (size_t)count, path);
  if (st != FERRY_OK) return st;
  struct span *spans = ferry__calloc((size_t)count, sizeof *spans);
  if (!spans) return ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", path);
  size_t nspans = 0;
  int seen_meta = 0, pos = 0;
  for (const cJSON *e = root->child; e; e = e->next, pos++) {
    const char *name = e->string;
    if (!strcmp(name, "__metadata__")) {
      if (seen_meta) {
        st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: duplicate \"__metadata__\"", path);
        goto out_free_spans;
      }
      seen_meta = 1;
      if ((st = parse_metadata(s, path, e)) != FERRY_OK) goto out_free_spans;
      continue;
    }
    const char *problem = ferry__st_name_problem(name);
    if (problem) {
      st = ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: tensor name at header entry %d %s (expected a non-empty printable name)", path,
                          pos, problem);
      goto out_free_spans;
    }
    struct ferry_store_tensor *t = &s->tensors[s->ntensors];
    memset(t, 0, sizeof *t);
    uint64_t begin = 0, end = 0;
    if ((st = parse_tensor(s, path, e, data_size, t, &begin, &end)) != FERRY_OK) goto out_free_spans;
    t->file = file_index;
    t->offset = f->data_start + begin;
    t->name = ferry__strdup(name);
    if (!t->name) {
      st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", path);
      goto out_free_spans;
    }
    size_t ti = s->ntensors++;
    int64_t dup = ferry__name_index_insert(&s->index, (uint32_t)ti, tensor_name, s);
    if (dup >= 0) {
      if (s->tensors[dup].file == file_index)
        st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: duplicate tensor name \"%s\" in the header", path,
                            name);
      else
        st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: tensor \"%s\" is also in %s", path, name,
                            s->files[s->tensors[dup].file].path);
      goto out_free_spans;
    }
    spans[nspans++] = (struct span){begin, end, ti};
  }
  st = check_coverage(s, path, spans, nspans, data_size);
out_free_spans:
  ferry_free(spans);
  return st;
}

/* Open, check the header length against the file, parse and validate the header. The first
 * file of a store keeps a copy of its __metadata__. */
static ferry_status load_file(ferry_store *s, const char *path, int keep_metadata) {
  struct ferry__st_file *f = NULL;
  ferry_status st = append_file(s, path, &f);
  if (st != FERRY_OK) return st;
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0)
    return ferry__err_set(&s->err, errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: cannot open: %s",
                          path, strerror(errno));
  struct stat sb;
  if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode))
    return ferry__err_set(&s->err, FERRY_ERR_IO, "%s: not a regular file", path);
  f->size = (uint64_t)sb.st_size;
  if (f->size < 8)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: file is %llu bytes, shorter than the 8-byte header length field", path,
                          (unsigned long long)f->size);
  unsigned char lenbuf[8];
  if ((st = ferry__pread_all(f->fd, lenbuf, 8, 0, path, &s->err)) != FERRY_OK) return st;
  uint64_t hlen = read_le64(lenbuf);
  if (hlen > FERRY_ST_MAX_HEADER_BYTES)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: header length %llu at offset 0 exceeds the %u-byte limit", path,
                          (unsigned long long)hlen, FERRY_ST_MAX_HEADER_BYTES);
  if (hlen > f->size - 8)
    return ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: header length %llu at offset 0 but only %llu bytes follow the length field", path,
                          (unsigned long long)hlen, (unsigned long long)(f->size - 8));
  f->data_start = 8 + hlen;
  char *text = ferry_malloc((size_t)hlen + 1);
  if (!text) return ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory for a %llu-byte header", path,
                                   (unsigned long long)hlen);
  cJSON *root = NULL;
  char *what = NULL;
  if ((st = ferry__pread_all(f->fd, text, (size_t)hlen, 8, path, &s->err)) != FERRY_OK) goto out_free_text;
  text[hlen] = '\0';
  int64_t nul = find_escaped_nul(text, (size_t)hlen);
  if (nul >= 0) {
    st = ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                        "%s: header byte %lld (file offset %lld): \"\\u0000\" escape; names and strings must "
                        "not contain NUL",
                        path, (long long)nul, (long long)nul + 8);
    goto out_free_text;
  }
  what = ferry__asprintf("%s: header (file offset 8)", path);
  if (!what) {
    st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", path);
    goto out_free_text;
  }
  if ((st = ferry__json_parse(text, (size_t)hlen, what, &root, &s->err)) != FERRY_OK) goto out_free_text;
  if (keep_metadata && cJSON_IsObject(root)) {
    /* Validate and keep the first __metadata__ before walking the tensors; a second one is
     * still found (and rejected) by parse_header. */
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    if (meta) {
      if ((st = parse_metadata(s, path, meta)) != FERRY_OK) goto out_delete_root;
      s->metadata = cJSON_Duplicate(meta, 1);
      if (!s->metadata) {
        st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", path);
        goto out_delete_root;
      }
    }
  }
  st = parse_header(s, f, root);
out_delete_root:
  cJSON_Delete(root);
out_free_text:
  ferry_free(what);
  ferry_free(text);
  return st;
}

/* ---- whole store ---------------------------------------------------------------------------- */

static int tensor_cmp(const void *a, const void *b) {
  const struct ferry_store_tensor *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Sort by (file, offset) and rebuild the name index over the new positions. */
static ferry_status finalize(ferry_store *s) {
  if (s->ntensors) qsort(s->tensors, s->ntensors, sizeof *s->tensors, tensor_cmp);
  if (s->index.cap) memset(s->index.slots, 0, s->index.cap * sizeof *s->index.slots);
  s->index.count = 0;
  if (ferry__name_index_reserve(&s->index, s->ntensors, tensor_name, s) != FERRY_OK)
    return ferry__err_set(&s->err, FERRY_ERR_NOMEM, "out of memory indexing %zu tensors", s->ntensors);
  for (size_t i = 0; i < s->ntensors; i++) {
    if (ferry__name_index_insert(&s->index, (uint32_t)i, tensor_name, s) >= 0)
      return ferry__err_set(&s->err, FERRY_ERR_INTERNAL, "duplicate tensor \"%s\" after validation",
                            s->tensors[i].name);
  }
  return FERRY_OK;
}

static const char *shard_problem(const char *name) {
  if (!name || !*name) return "is empty";
  if (strchr(name, '/')) return "contains '/'";
  if (strstr(name, "..")) return "contains '..'";
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p < 0x20 || *p == 0x7f) return "contains a control character";
  return NULL;
}

static const char *cjson_key(const void *ctx, uint32_t i) {
  const cJSON *const *items = ctx;
  return items[i]->valuestring;
}

static int shard_cmp(const void *a, const void *b) {
  const cJSON *const *x = a, *const *y = b;
  return strcmp((*x)->valuestring, (*y)->valuestring);
}

static ferry_status open_index(ferry_store *s, const char *index_path) {
  cJSON *root = NULL;
  ferry_status st = ferry__json_load(index_path, FERRY_ST_MAX_HEADER_BYTES, &root, &s->err);
  if (st != FERRY_OK) return st;
  char *dir = NULL, *shard_path = NULL;
  const cJSON **shards = NULL; /* one weight_map entry per distinct shard (first naming it) */
  size_t nshards = 0;
  struct ferry__name_index shard_ix = {0};
  unsigned char *seen = NULL;
  if (!cJSON_IsObject(root)) {
    st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: expected a JSON object", index_path);
    goto out_free;
  }
  const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
  if (meta && !cJSON_IsObject(meta) && !cJSON_IsNull(meta)) {
    st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: \"metadata\" must be an object", index_path);
    goto out_free;
  }
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(wm) || !wm->child) {
    st = ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                        "%s: expected a non-empty \"weight_map\" object of tensor name -> shard file", index_path);
    goto out_free;
  }
  size_t nentries = (size_t)cJSON_GetArraySize(wm);
  shards = ferry__calloc(nentries, sizeof *shards);
  if (!shards || ferry__name_index_reserve(&shard_ix, nentries, cjson_key, shards) != FERRY_OK) {
    st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", index_path);
    goto out_free;
  }
  for (const cJSON *e = wm->child; e; e = e->next) {
    const char *problem = ferry__st_name_problem(e->string);
    if (problem) {
      st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: weight_map tensor name %s", index_path, problem);
      goto out_free;
    }
    if (!cJSON_IsString(e)) {
      st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: weight_map[\"%s\"] must be a shard file name",
                          index_path, e->string);
      goto out_free;
    }
    problem = shard_problem(e->valuestring);
    if (problem) {
      st = ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: weight_map[\"%s\"]: shard name \"%s\" %s (expected a file name in the index's folder)",
                          index_path, e->string, e->valuestring, problem);
      goto out_free;
    }
    shards[nshards] = e;
    if (ferry__name_index_insert(&shard_ix, (uint32_t)nshards, cjson_key, shards) < 0) nshards++;
  }
  qsort(shards, nshards, sizeof *shards, shard_cmp);

  const char *slash = strrchr(index_path, '/');
  dir = slash ? ferry__strndup(index_path, (size_t)(slash - index_path + 1)) : ferry__strdup(".");
  if (!dir) {
    st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", index_path);
    goto out_free;
  }
  for (size_t i = 0; i < nshards; i++) {
    ferry_free(shard_path);
    shard_path = ferry__path_join(dir, shards[i]->valuestring);
    if (!shard_path) {
      st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", index_path);
      goto out_free;
    }
    struct stat sb;
    if (stat(shard_path, &sb) != 0) {
      st = ferry__err_set(&s->err, errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO,
                          "%s: shard \"%s\" (named for tensor \"%s\") not found at %s: %s", index_path,
                          shards[i]->valuestring, shards[i]->string, shard_path, strerror(errno));
      goto out_free;
    }
    if ((st = load_file(s, shard_path, i == 0)) != FERRY_OK) goto out_free;
  }
  if ((st = finalize(s)) != FERRY_OK) goto out_free;

  /* weight_map and shards must agree both ways. */
  seen = ferry__calloc(s->ntensors ? s->ntensors : 1, 1);
  if (!seen) {
    st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", index_path);
    goto out_free;
  }
  for (const cJSON *e = wm->child; e; e = e->next) {
    int64_t ti = ferry__name_index_find(&s->index, e->string, tensor_name, s);
    if (ti < 0) {
      st = ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: weight_map puts tensor \"%s\" in shard \"%s\" but that shard does not contain it",
                          index_path, e->string, e->valuestring);
      goto out_free;
    }
    const char *fpath = s->files[s->tensors[ti].file].path;
    const char *base = strrchr(fpath, '/');
    base = base ? base + 1 : fpath;
    if (strcmp(base, e->valuestring)) {
      st = ferry__err_set(&s->err, FERRY_ERR_FORMAT,
                          "%s: weight_map puts tensor \"%s\" in shard \"%s\" but it is in \"%s\"", index_path,
                          e->string, e->valuestring, base);
      goto out_free;
    }
    if (seen[ti]) {
      st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: weight_map names tensor \"%s\" twice", index_path,
                          e->string);
      goto out_free;
    }
    seen[ti] = 1;
  }
  for (size_t i = 0; i < s->ntensors; i++) {
    if (!seen[i]) {
      st = ferry__err_set(&s->err, FERRY_ERR_FORMAT, "%s: tensor \"%s\" of shard %s is missing from weight_map",
                          index_path, s->tensors[i].name, s->files[s->tensors[i].file].path);
      goto out_free;
    }
  }
out_free:
  ferry_free(seen);
  ferry_free(shard_path);
  ferry_free(dir);
  ferry__name_index_free(&shard_ix);
  ferry_free(shards);
  cJSON_Delete(root);
  return st;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A folder without an index: exactly its *.safetensors files, in name order. */
static ferry_status open_folder_files(ferry_store *s, const char *dir_path) {
  DIR *d = opendir(dir_path);
  if (!d)
    return ferry__err_set(&s->err, errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: cannot open folder: %s",
                          dir_path, strerror(errno));
  ferry_status st = FERRY_OK;
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *ent;
  while ((ent = readdir(d))) {
    if (ent->d_name[0] == '.' || !ends_with(ent->d_name, ".safetensors")) continue;
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      char **nn = ferry__reallocarray(names, ncap, sizeof *nn);
      if (!nn) {
        st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", dir_path);
        goto out_free;
      }
      names = nn;
      cap = ncap;
    }
    names[n] = ferry__path_join(dir_path, ent->d_name);
    if (!names[n]) {
      st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", dir_path);
      goto out_free;
    }
    n++;
  }
  if (!n) {
    st = ferry__err_set(&s->err, FERRY_ERR_NOT_FOUND,
                        "%s: folder holds neither " INDEX_NAME " nor any *.safetensors file", dir_path);
    goto out_free;
  }
  qsort(names, n, sizeof *names, name_cmp);
  for (size_t i = 0; i < n && st == FERRY_OK; i++) st = load_file(s, names[i], i == 0);
  if (st == FERRY_OK) st = finalize(s);
out_free:
  for (size_t i = 0; i < n; i++) ferry_free(names[i]);
  ferry_free(names);
  closedir(d);
  return st;
}

ferry_status ferry_store_open(ferry_store **out, const char *path) {
  if (!out || !path) return ferry__fail(FERRY_ERR_INVALID, "ferry_store_open: NULL argument");
  *out = NULL;
  ferry__json_init();
  ferry_store *s = ferry__calloc(1, sizeof *s);
  if (!s) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
  if (pthread_mutex_init(&s->lock, NULL) != 0) {
    ferry_free(s);
    return ferry__fail(FERRY_ERR_NOMEM, "%s: cannot create a mutex", path);
  }
  ferry__err_clear(&s->err);
  ferry_status st;
  struct stat sb;
  if (stat(path, &sb) != 0) {
    st = ferry__err_set(&s->err, errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: cannot open: %s", path,
                        strerror(errno));
  } else if (S_ISDIR(sb.st_mode)) {
    char *index = ferry__path_join(path, INDEX_NAME);
    if (!index)
      st = ferry__err_set(&s->err, FERRY_ERR_NOMEM, "%s: out of memory", path);
    else if (ferry__is_file(index))
      st = open_index(s, index);
    else
      st = open_folder_files(s, path);
    ferry_free(index);
  } else if (ends_with(path, ".json")) {
    st = open_index(s, path);
  } else {
    st = load_file(s, path, 1);
    if (st == FERRY_OK) st = finalize(s);
  }
  if (st != FERRY_OK) {
    /* closing may overwrite the thread's last error: keep the message */
    struct ferry_err saved = s->err;
    ferry_store_close(s);
    return ferry__err_copy(NULL, &saved);
  }
  *out = s;
  return FERRY_OK;
}

void ferry_store_close(ferry_store *store) {
  if (!store) return;
  for (size_t i = 0; i < store->nfiles; i++) {
    struct ferry__st_file *f = &store->files[i];
    if (f->fd >= 0) close(f->fd);
    if (f->direct_fd >= 0) close(f->direct_fd);
    ferry_free(f->path);
  }
  ferry_free(store->files);
  for (size_t i = 0; i < store->ntensors; i++) ferry_free((char *)store->tensors[i].name);
  ferry_free(store->tensors);
  ferry__name_index_free(&store->index);
  ferry__st_crc_free(store);
  cJSON_Delete(store->metadata);
  pthread_mutex_destroy(&store->lock);
  ferry_free(store);
}

const char *ferry_store_errmsg(const ferry_store *store) { return store ? store->err.msg : ""; }

size_t ferry_store_tensor_count(const ferry_store *store) { return store ? store->ntensors : 0; }

const struct ferry_store_tensor *ferry_store_tensor_at(const ferry_store *store, size_t i) {
  return store && i < store->ntensors ? &store->tensors[i] : NULL;
}

const struct ferry_store_tensor *ferry_store_find(const ferry_store *store, const char *name) {
  if (!store || !name) return NULL;
  int64_t i = ferry__name_index_find(&store->index, name, tensor_name, store);
  return i >= 0 ? &store->tensors[i] : NULL;
}

size_t ferry_store_file_count(const ferry_store *store) { return store ? store->nfiles : 0; }

const char *ferry_store_file_path(const ferry_store *store, size_t i) {
  return store && i < store->nfiles ? store->files[i].path : NULL;
}

uint64_t ferry_store_file_size(const ferry_store *store, size_t i) {
  return store && i < store->nfiles ? store->files[i].size : 0;
}

const char *ferry_store_metadata(const ferry_store *store, const char *key) {
  if (!store || !store->metadata || !key) return NULL;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(store->metadata, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}
