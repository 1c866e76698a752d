/* cJSON wrappers with strict types and file-and-field error messages. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/json.h"

/* Set when an allocation made by cJSON fails: cJSON reports out-of-memory as a parse error,
 * so ferry__json_parse uses this to return FERRY_ERR_NOMEM instead of FERRY_ERR_FORMAT. */
static _Thread_local int json_alloc_failed;

static void *json_malloc(size_t size) {
  void *p = ferry_malloc(size);
  if (!p) json_alloc_failed = 1;
  return p;
}

/* cJSON allocates through ferry's hook, so injected allocation failures reach it too. */
static void install_hooks(void) {
  cJSON_Hooks hooks = {.malloc_fn = json_malloc, .free_fn = ferry_free};
  cJSON_InitHooks(&hooks);
}

void ferry__json_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, install_hooks);
}

ferry_status ferry__json_parse(const char *text, size_t len, const char *what, cJSON **out,
                               struct ferry_err *err) {
  ferry__json_init();
  const char *end = NULL;
  json_alloc_failed = 0;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root && json_alloc_failed)
    return ferry__err_set(err, FERRY_ERR_NOMEM, "%s: out of memory parsing JSON", what);
  if (!root) {
    size_t off = end && end >= text ? (size_t)(end - text) : 0;
    const char *perr = cJSON_GetErrorPtr();
    if (perr && perr >= text && perr <= text + len) off = (size_t)(perr - text);
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: invalid JSON at byte %zu", what, off);
  }
  size_t off = (size_t)(end - text);
  for (size_t i = off; i < len; i++) {
    char c = text[i];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\0') {
      cJSON_Delete(root);
      return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: unexpected data after JSON at byte %zu", what, i);
    }
  }
  *out = root;
  return FERRY_OK;
}

ferry_status ferry__json_load(const char *path, size_t max_bytes, cJSON **out, struct ferry_err *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return ferry__err_set(err, errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO,
                                "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return ferry__err_set(err, FERRY_ERR_IO, "%s: not a regular file", path);
  }
  if ((uint64_t)st.st_size > max_bytes) {
    fclose(f);
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: %lld bytes, larger than the %zu allowed for this file",
                          path, (long long)st.st_size, max_bytes);
  }
  size_t n = (size_t)st.st_size;
  char *buf = ferry_malloc(n + 1);
  if (!buf) {
    fclose(f);
    return ferry__err_set(err, FERRY_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
  }
  size_t got = fread(buf, 1, n, f);
  int rerr = ferror(f);
  fclose(f);
  if (got != n || rerr) {
    ferry_free(buf);
    return ferry__err_set(err, FERRY_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n);
  }
  buf[n] = '\0';
  ferry_status st2 = ferry__json_parse(buf, n, path, out, err);
  ferry_free(buf);
  return st2;
}

int ferry__json_is_int(const cJSON *item, double min, double max) {
  if (!cJSON_IsNumber(item)) return 0;
  double v = item->valuedouble;
  if (!isfinite(v) || floor(v) != v) return 0;
  if (fabs(v) > 9007199254740992.0) return 0;
  return v >= min && v <= max;
}

static ferry_status missing(const char *key, int optional, const char *what, struct ferry_err *err) {
  if (optional) return FERRY_ERR_NOT_FOUND;
  return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: missing field \"%s\"", what, key);
}

ferry_status ferry__json_i64(const cJSON *obj, const char *key, int optional, int64_t *out,
                             const char *what, struct ferry_err *err) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!item || cJSON_IsNull(item)) return missing(key, optional, what, err);
  if (!ferry__json_is_int(item, -9007199254740992.0, 9007199254740992.0))
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: field \"%s\" must be an integer", what, key);
  *out = (int64_t)item->valuedouble;
  return FERRY_OK;
}

ferry_status ferry__json_f64(const cJSON *obj, const char *key, int optional, double *out,
                             const char *what, struct ferry_err *err) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!item || cJSON_IsNull(item)) return missing(key, optional, what, err);
  if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: field \"%s\" must be a number", what, key);
  *out = item->valuedouble;
  return FERRY_OK;
}

ferry_status ferry__json_bool(const cJSON *obj, const char *key, int optional, int *out,
                              const char *what, struct ferry_err *err) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!item || cJSON_IsNull(item)) return missing(key, optional, what, err);
  if (!cJSON_IsBool(item))
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: field \"%s\" must be true or false", what, key);
  *out = cJSON_IsTrue(item);
  return FERRY_OK;
}

ferry_status ferry__json_str(const cJSON *obj, const char *key, int optional, const char **out,
                             const char *what, struct ferry_err *err) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!item || cJSON_IsNull(item)) return missing(key, optional, what, err);
  if (!cJSON_IsString(item))
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: field \"%s\" must be a string", what, key);
  *out = item->valuestring;
  return FERRY_OK;
}

void ferry__double_text(double v, char out[FERRY_DOUBLE_TEXT_MAX]) {
  for (int digits = 15; digits <= 17; digits++) {
    snprintf(out, FERRY_DOUBLE_TEXT_MAX, "%.*g", digits, v);
    if (strtod(out, NULL) == v) break;
  }
}

cJSON *ferry__json_add_number(cJSON *obj, const char *key, double v) {
  if (!isfinite(v)) return cJSON_AddNumberToObject(obj, key, v);
  char text[FERRY_DOUBLE_TEXT_MAX];
  ferry__double_text(v, text);
  /* a number printed by %g is valid JSON as it stands */
  return cJSON_AddRawToObject(obj, key, text);
}
