/* runtime/store: safetensors round trips (single and sharded), byte-range reads with and
 * without O_DIRECT (and its buffered fallback), the malformed-file corpus under
 * tests/data/safetensors/, writer misuse, concurrent reads and allocation-failure injection. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/json.h"
#include "ferry/store.h"
#include "runtime/store/store_impl.h"
#include "testutil.h"

/* Deterministic data byte at global position i of a written model. */
static unsigned char pattern(uint64_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

static char *join(const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *p = malloc(n);
  assert_non_null(p);
  snprintf(p, n, "%s/%s", a, b);
  return p;
}

/* Read a whole file with stdio (independent of the store). */
static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

struct decl {
  const char *name;
  enum ferry_dtype dtype;
  int32_t ndim;
  int64_t shape[4];
};

static uint64_t decl_bytes(const struct decl *d) {
  uint64_t n = ferry_dtype_size(d->dtype);
  for (int i = 0; i < d->ndim; i++) n *= (uint64_t)d->shape[i];
  return n;
}

/* Write decls with the pattern data, streamed in chunks of `chunk` bytes. */
static void write_model(const char *dir, uint64_t max_shard, const struct decl *decls, size_t n, size_t chunk) {
  ferry_store_writer *w = NULL;
  assert_int_equal(ferry_store_writer_create(&w, dir, max_shard), FERRY_OK);
  assert_int_equal(ferry_store_writer_set_metadata(w, "format", "pt"), FERRY_OK);
  assert_int_equal(ferry_store_writer_set_metadata(w, "note", "quote \" and\nnewline"), FERRY_OK);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(ferry_store_writer_add(w, decls[i].name, decls[i].dtype, decls[i].ndim, decls[i].shape), FERRY_OK);
    total += decl_bytes(&decls[i]);
  }
  unsigned char *buf = malloc(chunk);
  assert_non_null(buf);
  for (uint64_t pos = 0; pos < total;) {
    size_t take = total - pos < chunk ? (size_t)(total - pos) : chunk;
    for (size_t j = 0; j < take; j++) buf[j] = pattern(pos + j);
    assert_int_equal(ferry_store_writer_write(w, buf, take), FERRY_OK);
    pos += take;
  }
  free(buf);
  assert_int_equal(ferry_store_writer_finish(w), FERRY_OK);
  ferry_store_writer_free(w);
}

/* Every declared tensor is found with its shape, and its bytes are the pattern. */
static void check_model(ferry_store *s, const struct decl *decls, size_t n) {
  assert_int_equal(ferry_store_tensor_count(s), n);
  uint64_t pos = 0;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_store_tensor *t = ferry_store_find(s, decls[i].name);
    assert_non_null(t);
    assert_string_equal(t->name, decls[i].name);
    assert_int_equal(t->dtype, decls[i].dtype);
    assert_int_equal(t->ndim, decls[i].ndim);
    for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], decls[i].shape[d]);
    assert_int_equal(t->nbytes, decl_bytes(&decls[i]));
    unsigned char *buf = malloc(t->nbytes + 1);
    assert_non_null(buf);
    assert_int_equal(ferry_store_read_tensor(s, t, buf, t->nbytes), FERRY_OK);
    for (uint64_t j = 0; j < t->nbytes; j++)
      if (buf[j] != pattern(pos + j)) fail_msg("tensor %s byte %llu differs", t->name, (unsigned long long)j);
    free(buf);
    pos += t->nbytes;
  }
  /* sorted by (file, offset), tiling each file after its header */
  for (size_t i = 1; i < n; i++) {
    const struct ferry_store_tensor *a = ferry_store_tensor_at(s, i - 1), *b = ferry_store_tensor_at(s, i);
    assert_true(a->file < b->file || (a->file == b->file && a->offset + a->nbytes == b->offset));
  }
  assert_null(ferry_store_tensor_at(s, n));
  assert_null(ferry_store_find(s, "no.such.tensor"));
}

static const struct decl model_decls[] = {
    {"embed.weight", FERRY_DTYPE_F32, 2, {33, 17}},
    {"layers.0.attn.q", FERRY_DTYPE_BF16, 2, {64, 31}},
    {"layers.0.scale", FERRY_DTYPE_F16, 0, {0}},
    {"layers.0.empty", FERRY_DTYPE_F32, 2, {0, 5}},
    {"layers.0.mlp.up", FERRY_DTYPE_I8, 3, {3, 100, 41}},
    {"layers.1.big", FERRY_DTYPE_F64, 1, {3000}},
    {"lm_head", FERRY_DTYPE_U8, 1, {777}},
};
#define NDECLS (sizeof model_decls / sizeof model_decls[0])

static void test_roundtrip_single(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("store-single");
  write_model(dir, 0, model_decls, NDECLS, 1000);
  assert_int_equal(count_entries(dir), 1); /* no temporary file left */
  char *file = join(dir, "model.safetensors");
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, file), FERRY_OK);
  check_model(s, model_decls, NDECLS);
  /* one file: declared order is file order; data area starts at a multiple of 8 */
  for (size_t i = 0; i < NDECLS; i++) assert_string_equal(ferry_store_tensor_at(s, i)->name, model_decls[i].name);
  assert_int_equal(ferry_store_tensor_at(s, 0)->offset % 8, 0);
  assert_string_equal(ferry_store_metadata(s, "format"), "pt");
  assert_string_equal(ferry_store_metadata(s, "note"), "quote \" and\nnewline");
  assert_null(ferry_store_metadata(s, "absent"));
  assert_int_equal(ferry_store_file_count(s), 1);
  assert_string_equal(ferry_store_file_path(s, 0), file);
  struct stat sb;
  assert_int_equal(stat(file, &sb), 0);
  assert_int_equal(ferry_store_file_size(s, 0), (uint64_t)sb.st_size);
  const struct ferry_store_tensor *last = ferry_store_tensor_at(s, NDECLS - 1);
  assert_int_equal(last->offset + last->nbytes, (uint64_t)sb.st_size);
  assert_null(ferry_store_file_path(s, 1));
  ferry_store_close(s);
  /* the folder opens the same */
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  check_model(s, model_decls, NDECLS);
  ferry_store_close(s);
  free(file);
  tu_rmtree(dir);
  free(dir);
}

static void test_roundtrip_sharded(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("store-sharded");
  /* 8 KiB shards: lm_head/embed share, the 24000-byte tensor gets one of its own */
  write_model(dir, 8192, model_decls, NDECLS, 4093);
  char *index = join(dir, "model.safetensors.index.json");
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, index), FERRY_OK);
  check_model(s, model_decls, NDECLS);
  size_t nfiles = ferry_store_file_count(s);
  assert_true(nfiles >= 3);
  char expect[64];
  snprintf(expect, sizeof expect, "model-00001-of-%05zu.safetensors", nfiles);
  assert_true(tu_contains(ferry_store_file_path(s, 0), expect));
  assert_string_equal(ferry_store_metadata(s, "format"), "pt");
  assert_int_equal(count_entries(dir), (int)nfiles + 1);
  uint64_t total = 0;
  for (size_t i = 0; i < NDECLS; i++) total += decl_bytes(&model_decls[i]);
  /* no shard holds more than 8 KiB of data unless a single tensor is larger */
  for (size_t f = 0; f < nfiles; f++) {
    uint64_t data = 0;
    size_t count = 0;
    for (size_t i = 0; i < NDECLS; i++)
      if (ferry_store_tensor_at(s, i)->file == f) {
        data += ferry_store_tensor_at(s, i)->nbytes;
        count++;
      }
    assert_true(data <= 8192 || count == 1);
  }
  ferry_store_close(s);
  /* index content */
  cJSON *root = NULL;
  assert_int_equal(ferry__json_load(index, 1 << 20, &root, NULL), FERRY_OK);
  const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
  int64_t total_size = 0;
  assert_int_equal(ferry__json_i64(meta, "total_size", 0, &total_size, "index", NULL), FERRY_OK);
  assert_int_equal((uint64_t)total_size, total);
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  assert_int_equal(cJSON_GetArraySize(wm), NDECLS);
  assert_string_equal(wm->child->string, model_decls[0].name); /* declared order */
  cJSON_Delete(root);
  /* the folder prefers the index; one shard opens alone */
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  assert_int_equal(ferry_store_file_count(s), nfiles);
  ferry_store_close(s);
  char *shard = join(dir, expect);
  assert_int_equal(ferry_store_open(&s, shard), FERRY_OK);
  assert_int_equal(ferry_store_file_count(s), 1);
  assert_true(ferry_store_tensor_count(s) >= 1 && ferry_store_tensor_count(s) < NDECLS);
  ferry_store_close(s);
  free(shard);
  free(index);
  tu_rmtree(dir);
  free(dir);
}

/* Compare read_range (buffered, DIRECT and DROP_CACHE) with the file's bytes. */
static void check_ranges(ferry_store *s, const unsigned char *file, size_t file_len) {
  const uint64_t cases[][2] = {{0, 1},           {0, 8},      {3, 100},         {4095, 2},
                               {4096, 4096},     {100, 9000}, {8191, 1},        {file_len - 1, 1},
                               {file_len - 5000, 5000}, {0, file_len}, {12345, 0}};
  void *abuf = ferry__aligned_alloc(FERRY_DIRECT_ALIGN, file_len + 2 * FERRY_DIRECT_ALIGN);
  unsigned char *plain = malloc(file_len);
  assert_non_null(abuf);
  assert_non_null(plain);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    uint64_t off = cases[c][0], len = cases[c][1];
    uint64_t shift = 99;
    assert_int_equal(ferry_store_read_range(s, 0, off, len, plain, file_len, 0, &shift), FERRY_OK);
    assert_int_equal(shift, 0);
    if (len) assert_memory_equal(plain, file + off, len);
    assert_int_equal(ferry_store_read_range(s, 0, off, len, plain, file_len, FERRY_READ_DROP_CACHE, NULL), FERRY_OK);
    if (len) assert_memory_equal(plain, file + off, len);
    uint64_t span = ferry_store_direct_span(off, len);
    assert_true(span % FERRY_DIRECT_ALIGN == 0 && span >= len);
    memset(abuf, 0xee, span);
    assert_int_equal(ferry_store_read_range(s, 0, off, len, abuf, span, FERRY_READ_DIRECT, &shift), FERRY_OK);
    assert_int_equal(shift, off % FERRY_DIRECT_ALIGN);
    if (len) assert_memory_equal((unsigned char *)abuf + shift, file + off, len);
  }
  /* misuse */
  uint64_t shift;
  assert_int_equal(ferry_store_read_range(s, 0, file_len - 3, 4, plain, file_len, 0, NULL), FERRY_ERR_RANGE);
  assert_true(tu_contains(ferry_store_errmsg(s), "outside"));
  assert_int_equal(ferry_store_read_range(s, 0, UINT64_MAX, 2, plain, file_len, 0, NULL), FERRY_ERR_RANGE);
  assert_int_equal(ferry_store_read_range(s, 7, 0, 1, plain, file_len, 0, NULL), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_read_range(s, 0, 0, 100, plain, 99, 0, NULL), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_read_range(s, 0, 0, 100, (char *)abuf + 8, file_len, FERRY_READ_DIRECT, &shift),
                   FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_read_range(s, 0, 10, 100, abuf, 100, FERRY_READ_DIRECT, &shift), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_read_range(s, 0, 10, 100, abuf, 4096, FERRY_READ_DIRECT, NULL), FERRY_ERR_INVALID);
  ferry_free(abuf);
  free(plain);
}

static void read_range_in(const char *dir) {
  write_model(dir, 0, model_decls, NDECLS, 65536);
  char *path = join(dir, "model.safetensors");
  size_t file_len;
  unsigned char *file = slurp(path, &file_len);
  assert_true(file_len > 3 * FERRY_DIRECT_ALIGN && file_len % FERRY_DIRECT_ALIGN);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, path), FERRY_OK);
  int direct = ferry_store_direct_supported(s);
  print_message("O_DIRECT on %s: %s\n", dir, direct ? "works" : "refused (buffered fallback)");
  check_ranges(s, file, file_len);
  /* the buffered + DONTNEED fallback, as on file systems that refuse O_DIRECT */
  ferry__store_force_direct_refused(s);
  assert_int_equal(ferry_store_direct_supported(s), 0);
  check_ranges(s, file, file_len);
  ferry_store_close(s);
  free(file);
  free(path);
}

static void test_read_range(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("store-range");
  read_range_in(dir);
  tu_rmtree(dir);
  free(dir);
  /* tmpfs too, where O_DIRECT support depends on the kernel */
  char shm[] = "/dev/shm/ferry-store-range-XXXXXX";
  if (access("/dev/shm", W_OK) == 0 && mkdtemp(shm)) {
    read_range_in(shm);
    tu_rmtree(shm);
  }
}

/* One malformed file per case (see tests/data/safetensors/README.md). */
static const struct corpus_case {
  const char *file;
  ferry_status status;
  const char *msg;
} corpus[] = {
    {"empty.safetensors", FERRY_ERR_FORMAT, "file is 0 bytes, shorter than the 8-byte header length"},
    {"truncated_length.safetensors", FERRY_ERR_FORMAT, "file is 5 bytes, shorter than the 8-byte header length"},
    {"header_len_past_eof.safetensors", FERRY_ERR_FORMAT, "header length 1000 at offset 0 but only 20 bytes follow"},
    {"header_len_2pow63.safetensors", FERRY_ERR_FORMAT, "header length 9223372036854775808 at offset 0 exceeds"},
    {"header_len_over_limit.safetensors", FERRY_ERR_FORMAT, "header length 104857601 at offset 0 exceeds"},
    {"invalid_json.safetensors", FERRY_ERR_FORMAT, "invalid JSON at byte"},
    {"trailing_json_garbage.safetensors", FERRY_ERR_FORMAT, "unexpected data after JSON at byte 3"},
    {"header_not_object.safetensors", FERRY_ERR_FORMAT, "header must be a JSON object"},
    {"unknown_dtype.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": unknown dtype \"F31\""},
    {"dtype_short_name.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": unknown dtype \"fp32\""},
    {"missing_dtype.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": missing or non-string \"dtype\""},
    {"offsets_past_eof.safetensors", FERRY_ERR_FORMAT,
     "tensor \"a\": data_offsets [0, 16] past the end of the data area (8 bytes)"},
    {"begin_after_end.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": data_offsets [8, 4]: begin is after end"},
    {"offsets_wrong_arity.safetensors", FERRY_ERR_FORMAT, "\"data_offsets\" must be [begin, end]"},
    {"overlap.safetensors", FERRY_ERR_FORMAT, "tensor \"b\": data_offsets [4, 12] overlap \"a\" which ends at 8"},
    {"hole.safetensors", FERRY_ERR_FORMAT, "tensor \"b\": hole in the data area: bytes [4, 8)"},
    {"trailing_bytes.safetensors", FERRY_ERR_FORMAT,
     "trailing bytes after the data: tensors end at data offset 4 but the data area holds 8 bytes"},
    {"shape_size_mismatch.safetensors", FERRY_ERR_FORMAT,
     "tensor \"a\": data_offsets [0, 8] hold 8 bytes but dtype F32 with 3 elements needs 12"},
    {"negative_shape.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": shape[0] must be a non-negative integer"},
    {"non_integer_shape.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": shape[0] must be a non-negative integer"},
    {"shape_overflow.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": shape overflows"},
    {"too_many_dims.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": 9 dimensions, at most 8"},
    {"missing_data_offsets.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": missing \"data_offsets\""},
    {"duplicate_names.safetensors", FERRY_ERR_FORMAT, "duplicate tensor name \"a\""},
    {"name_control_char.safetensors", FERRY_ERR_FORMAT, "tensor name at header entry 0 contains a control character"},
    {"name_nul_escape.safetensors", FERRY_ERR_FORMAT, "header byte 3 (file offset 11): \"\\u0000\" escape"},
    {"empty_name.safetensors", FERRY_ERR_FORMAT, "tensor name at header entry 0 is empty"},
    {"tensor_not_object.safetensors", FERRY_ERR_FORMAT, "tensor \"a\": expected an object"},
    {"metadata_non_string.safetensors", FERRY_ERR_FORMAT, "\"__metadata__\" value of \"format\" must be a string"},
    {"metadata_not_object.safetensors", FERRY_ERR_FORMAT, "\"__metadata__\" must be an object"},
    {"no_such_file.safetensors", FERRY_ERR_NOT_FOUND, "cannot open"},
    /* sharded sets (folders) */
    {"sharded_missing_shard", FERRY_ERR_NOT_FOUND,
     "model.safetensors.index.json: shard \"model-00002-of-00002.safetensors\" (named for tensor \"b\") not found"},
    {"sharded_tensor_not_in_shard", FERRY_ERR_FORMAT,
     "weight_map puts tensor \"b\" in shard \"model-00001-of-00002.safetensors\" but that shard does not contain it"},
    {"sharded_tensor_not_in_map", FERRY_ERR_FORMAT, "tensor \"c\" of shard"},
    {"sharded_wrong_shard", FERRY_ERR_FORMAT,
     "weight_map puts tensor \"a\" in shard \"model-00002-of-00002.safetensors\" but it is in "
     "\"model-00001-of-00002.safetensors\""},
    {"sharded_path_traversal", FERRY_ERR_FORMAT, "shard name \"../valid_small.safetensors\" contains '/'"},
    {"sharded_dotdot", FERRY_ERR_FORMAT, "shard name \"..valid_small.safetensors\" contains '..'"},
    {"sharded_duplicate_tensor", FERRY_ERR_FORMAT, "tensor \"a\" is also in"},
};

static void test_malformed_corpus(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) {
    char *rel = join("safetensors", corpus[i].file);
    char *path = tu_data_path(rel);
    ferry_store *s = (ferry_store *)&s; /* must be reset to NULL on failure */
    ferry_status st = ferry_store_open(&s, path);
    const char *msg = ferry_last_error();
    if (st != corpus[i].status || !tu_contains(msg, corpus[i].msg) || !tu_contains(msg, corpus[i].file))
      fail_msg("%s: got %s \"%s\", expected %s containing \"%s\" and the file name", corpus[i].file,
               ferry_status_name(st), msg, ferry_status_name(corpus[i].status), corpus[i].msg);
    assert_null(s);
    free(path);
    free(rel);
  }
}

static void test_valid_corpus(void **state) {
  (void)state;
  /* hand-made by make_corpus.py, independently of ferry's writer */
  char *path = tu_data_path("safetensors/valid_small.safetensors");
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, path), FERRY_OK);
  assert_int_equal(ferry_store_tensor_count(s), 5);
  assert_string_equal(ferry_store_metadata(s, "note"), "hand made");
  const struct ferry_store_tensor *b = ferry_store_find(s, "b");
  assert_non_null(b);
  assert_int_equal(b->dtype, FERRY_DTYPE_BF16);
  assert_int_equal(b->nbytes, 6);
  unsigned char buf[8];
  assert_int_equal(ferry_store_read_tensor(s, b, buf, sizeof buf), FERRY_OK);
  for (int i = 0; i < 6; i++) assert_int_equal(buf[i], 16 + i);
  assert_int_equal(ferry_store_read_tensor(s, b, buf, 5), FERRY_ERR_INVALID);
  const struct ferry_store_tensor *sc = ferry_store_find(s, "s");
  assert_int_equal(sc->ndim, 0);
  assert_int_equal(sc->nbytes, 1);
  assert_int_equal(ferry_store_find(s, "empty")->nbytes, 0);
  assert_string_equal(ferry_store_tensor_at(s, 0)->name, "w");
  ferry_store_close(s);
  free(path);
  path = tu_data_path("safetensors/name_escaped_backslash_ok.safetensors");
  assert_int_equal(ferry_store_open(&s, path), FERRY_OK);
  assert_non_null(ferry_store_find(s, "a\\u0000b"));
  ferry_store_close(s);
  free(path);
  path = tu_data_path("safetensors/sharded_valid");
  assert_int_equal(ferry_store_open(&s, path), FERRY_OK);
  assert_int_equal(ferry_store_file_count(s), 2);
  const struct ferry_store_tensor *tb = ferry_store_find(s, "b");
  assert_int_equal(tb->file, 1);
  assert_int_equal(ferry_store_read_tensor(s, tb, buf, sizeof buf), FERRY_OK);
  assert_int_equal(buf[0], 2);
  ferry_store_close(s);
  free(path);
  ferry_store_close(NULL);
}

/* NaN and Inf in weights are counted in one pass, per dtype, naming the first tensor; integer
 * tensors (packed quantized weights) are not floats and are skipped. */
static void test_scan_nonfinite(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("store-nonfinite");
  ferry_store_writer *w = NULL;
  int64_t n8[1] = {8}, big[1] = {3 << 20}; /* "big" spans chunks of the scan */
  assert_int_equal(ferry_store_writer_create(&w, dir, 0), FERRY_OK);
  assert_int_equal(ferry_store_writer_add(w, "clean.f16", FERRY_DTYPE_F16, 1, n8), FERRY_OK);
  assert_int_equal(ferry_store_writer_add(w, "ints", FERRY_DTYPE_U8, 1, n8), FERRY_OK);
  assert_int_equal(ferry_store_writer_add(w, "w.f32", FERRY_DTYPE_F32, 1, n8), FERRY_OK);
  assert_int_equal(ferry_store_writer_add(w, "w.bf16", FERRY_DTYPE_BF16, 1, big), FERRY_OK);
  uint16_t f16[8] = {0x3c00, 0x7bff, 0xfbff, 0, 0x8000, 0x0001, 0x3c00, 0x3c00}; /* max finite, subnormal */
  unsigned char ints[8] = {0xff, 0xff, 0x7f, 0x7c, 0xff, 0xff, 0xff, 0xff};
  float f32[8] = {1, 2, 3, NAN, 5, 6, 7, -INFINITY};
  uint16_t *bf = calloc((size_t)big[0], sizeof *bf);
  assert_non_null(bf);
  bf[(size_t)big[0] - 1] = 0x7f80; /* +Inf in the last element, past the first chunk */
  bf[2500000] = 0xffc1;             /* a NaN */
  assert_int_equal(ferry_store_writer_write(w, f16, sizeof f16), FERRY_OK);
  assert_int_equal(ferry_store_writer_write(w, ints, sizeof ints), FERRY_OK);
  assert_int_equal(ferry_store_writer_write(w, f32, sizeof f32), FERRY_OK);
  assert_int_equal(ferry_store_writer_write(w, bf, (size_t)big[0] * sizeof *bf), FERRY_OK);
  assert_int_equal(ferry_store_writer_finish(w), FERRY_OK);
  ferry_store_writer_free(w);
  free(bf);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  struct ferry_store_nonfinite nf;
  assert_int_equal(ferry_store_scan_nonfinite(s, FERRY_READ_DROP_CACHE, &nf), FERRY_OK);
  assert_int_equal(nf.values, 4);
  assert_int_equal(nf.tensors, 2);
  assert_string_equal(nf.first_tensor, "w.f32");
  assert_int_equal(nf.first_count, 2);
  assert_int_equal(nf.first_index, 3);
  assert_int_equal(nf.first_file, 0);
  struct ferry_store_nonfinite again;
  assert_int_equal(ferry_store_scan_nonfinite(s, 0, &again), FERRY_OK); /* kept: no second pass */
  assert_memory_equal(&again, &nf, sizeof nf);
  ferry_store_close(s);
  tu_rmtree(dir);
  free(dir);
}

static void test_writer_misuse(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("store-misuse");
  ferry_store_writer *w = NULL;
  int64_t shape[2] = {2, 3};
  assert_int_equal(ferry_store_writer_create(&w, "/nonexistent/ferry/dir", 0), FERRY_ERR_NOT_FOUND);
  assert_int_equal(ferry_store_writer_create(&w, dir, 0), FERRY_OK);
  assert_int_equal(ferry_store_writer_add(w, "a", FERRY_DTYPE_F32, 2, shape), FERRY_OK);
  assert_int_equal(ferry_store_writer_add(w, "a", FERRY_DTYPE_F32, 2, shape), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_store_writer_errmsg(w), "declared twice"));
  assert_int_equal(ferry_store_writer_add(w, "bad\tname", FERRY_DTYPE_F32, 2, shape), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_writer_add(w, "", FERRY_DTYPE_F32, 2, shape), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_writer_add(w, "__metadata__", FERRY_DTYPE_F32, 2, shape), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_writer_add(w, "c", FERRY_DTYPE_F32, 9, shape), FERRY_ERR_INVALID);
  int64_t neg[1] = {-4};
  assert_int_equal(ferry_store_writer_add(w, "d", FERRY_DTYPE_F32, 1, neg), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_writer_add(w, "b", FERRY_DTYPE_U8, 1, shape), FERRY_OK);
  unsigned char data[64] = {0};
  assert_int_equal(ferry_store_writer_write(w, data, 10), FERRY_OK);
  assert_int_equal(ferry_store_writer_add(w, "late", FERRY_DTYPE_U8, 1, shape), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_writer_set_metadata(w, "k", "v"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_store_writer_write(w, data, 17), FERRY_ERR_RANGE); /* 26 declared */
  assert_int_equal(ferry_store_writer_finish(w), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_store_writer_errmsg(w), "tensor \"a\" is incomplete"));
  assert_int_equal(count_entries(dir), 1); /* the temporary file */
  ferry_store_writer_free(w);              /* unfinished: removes it */
  assert_int_equal(count_entries(dir), 0);
  /* a writer with no tensors writes a valid empty file */
  assert_int_equal(ferry_store_writer_create(&w, dir, 0), FERRY_OK);
  assert_int_equal(ferry_store_writer_finish(w), FERRY_OK);
  assert_int_equal(ferry_store_writer_finish(w), FERRY_ERR_INVALID);
  ferry_store_writer_free(w);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  assert_int_equal(ferry_store_tensor_count(s), 0);
  ferry_store_close(s);
  ferry_store_writer_free(NULL);
  tu_rmtree(dir);
  free(dir);
}

static void test_find_many(void **state) {
  (void)state;
  enum { N = 5000 };
  char *dir = tu_mkdtemp("store-many");
  ferry_store_writer *w = NULL;
  assert_int_equal(ferry_store_writer_create(&w, dir, 4000), FERRY_OK);
  int64_t shape[1] = {4};
  char name[64];
  for (int i = 0; i < N; i++) {
    snprintf(name, sizeof name, "model.layers.%d.weight", i);
    assert_int_equal(ferry_store_writer_add(w, name, FERRY_DTYPE_U8, 1, shape), FERRY_OK);
  }
  for (int i = 0; i < N; i++) assert_int_equal(ferry_store_writer_write(w, &i, 4), FERRY_OK);
  assert_int_equal(ferry_store_writer_finish(w), FERRY_OK);
  ferry_store_writer_free(w);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  assert_int_equal(ferry_store_tensor_count(s), N);
  assert_int_equal(ferry_store_file_count(s), 5); /* 1000 tensors of 4 bytes per 4000-byte shard */
  for (int i = 0; i < N; i += 7) {
    snprintf(name, sizeof name, "model.layers.%d.weight", i);
    const struct ferry_store_tensor *t = ferry_store_find(s, name);
    assert_non_null(t);
    int v = -1;
    assert_int_equal(ferry_store_read_tensor(s, t, &v, sizeof v), FERRY_OK);
    assert_int_equal(v, i);
  }
  assert_null(ferry_store_find(s, "model.layers.5000.weight"));
  ferry_store_close(s);
  tu_rmtree(dir);
  free(dir);
}

struct reader_arg {
  ferry_store *store;
  const unsigned char *file;
  size_t len;
  unsigned seed;
  int errors;
};

static void *reader_thread(void *p) {
  struct reader_arg *a = p;
  void *buf = ferry__aligned_alloc(FERRY_DIRECT_ALIGN, a->len + 2 * FERRY_DIRECT_ALIGN);
  if (!buf) {
    a->errors++;
    return NULL;
  }
  for (int i = 0; i < 200; i++) {
    a->seed = a->seed * 1103515245u + 12345u;
    uint64_t off = (a->seed >> 8) % a->len;
    uint64_t len = 1 + (a->seed >> 4) % (a->len - off);
    uint64_t shift = 0;
    unsigned flags = (i & 1) ? FERRY_READ_DIRECT : 0;
    if (ferry_store_read_range(a->store, 0, off, len, buf, a->len + 2 * FERRY_DIRECT_ALIGN, flags, &shift) != FERRY_OK ||
        memcmp((char *)buf + shift, a->file + off, len))
      a->errors++;
  }
  ferry_free(buf);
  return NULL;
}

static void test_concurrent_reads(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("store-threads");
  write_model(dir, 0, model_decls, NDECLS, 8192);
  char *path = join(dir, "model.safetensors");
  size_t len;
  unsigned char *file = slurp(path, &len);
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, path), FERRY_OK);
  pthread_t th[4];
  struct reader_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (struct reader_arg){s, file, len, 17u * (unsigned)i + 1, 0};
    assert_int_equal(pthread_create(&th[i], NULL, reader_thread, &args[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(args[i].errors, 0);
  }
  ferry_store_close(s);
  free(file);
  free(path);
  tu_rmtree(dir);
  free(dir);
}

/* Fail the n-th allocation of an open, for every n until the open needs no more: each attempt
 * must fail cleanly with FERRY_ERR_NOMEM (ASan checks nothing leaks) or succeed. */
static void open_under_alloc_failures(const char *path) {
  int succeeded = 0;
  for (int64_t n = 0; n < 5000 && !succeeded; n++) {
    ferry_store *s = NULL;
    ferry_alloc_fail_after(n);
    ferry_status st = ferry_store_open(&s, path);
    ferry_alloc_fail_after(-1);
    if (st == FERRY_OK) {
      assert_non_null(s);
      assert_true(ferry_store_tensor_count(s) > 0);
      ferry_store_close(s);
      succeeded = 1;
    } else if (st != FERRY_ERR_NOMEM) {
      fail_msg("%s with allocation %lld failing: %s (%s)", path, (long long)n, ferry_status_name(st),
               ferry_last_error());
    } else {
      assert_null(s);
    }
  }
  assert_true(succeeded);
}

static void test_alloc_failures(void **state) {
  (void)state;
  char *path = tu_data_path("safetensors/valid_small.safetensors");
  open_under_alloc_failures(path);
  free(path);
  path = tu_data_path("safetensors/sharded_valid");
  open_under_alloc_failures(path);
  free(path);
  char *dir = tu_mkdtemp("store-nomem");
  write_model(dir, 4096, model_decls, NDECLS, 4096);
  open_under_alloc_failures(dir);
  /* the writer under allocation failures: NOMEM, no temporary file left behind */
  char *out = tu_mkdtemp("store-nomem-w");
  int succeeded = 0;
  static unsigned char data[64 * 1024];
  for (int64_t n = 0; n < 5000 && !succeeded; n++) {
    ferry_store_writer *w = NULL;
    ferry_alloc_fail_after(n);
    ferry_status st = ferry_store_writer_create(&w, out, 8192);
    for (size_t i = 0; st == FERRY_OK && i < NDECLS; i++)
      st = ferry_store_writer_add(w, model_decls[i].name, model_decls[i].dtype, model_decls[i].ndim,
                                  model_decls[i].shape);
    for (size_t i = 0; st == FERRY_OK && i < NDECLS; i++)
      st = ferry_store_writer_write(w, data, decl_bytes(&model_decls[i]));
    if (st == FERRY_OK) st = ferry_store_writer_finish(w);
    ferry_alloc_fail_after(-1);
    ferry_store_writer_free(w);
    if (st == FERRY_OK) {
      succeeded = 1;
    } else {
      if (st != FERRY_ERR_NOMEM) fail_msg("writer with allocation %lld failing: %s", (long long)n, ferry_last_error());
      assert_int_equal(count_entries(out), 0);
    }
  }
  assert_true(succeeded);
  tu_rmtree(out);
  free(out);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_single), cmocka_unit_test(test_roundtrip_sharded),
      cmocka_unit_test(test_read_range),       cmocka_unit_test(test_malformed_corpus),
      cmocka_unit_test(test_valid_corpus),     cmocka_unit_test(test_writer_misuse),
      cmocka_unit_test(test_find_many),        cmocka_unit_test(test_concurrent_reads),
      cmocka_unit_test(test_alloc_failures),   cmocka_unit_test(test_scan_nonfinite),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
