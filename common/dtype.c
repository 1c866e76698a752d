/* dtype names and sizes from the one FERRY_DTYPE_MAP table. */
#include <string.h>
#include <strings.h>

#include "ferry/dtype.h"

static const struct {
  const char *st_name, *short_name;
  size_t size;
} table[] = {
#define FERRY_DTYPE_ROW_(e, st, short_name, size) {st, short_name, size},
    FERRY_DTYPE_MAP(FERRY_DTYPE_ROW_)
#undef FERRY_DTYPE_ROW_
};

size_t ferry_dtype_size(enum ferry_dtype dtype) {
  return (unsigned)dtype < FERRY_DTYPE_COUNT ? table[dtype].size : 0;
}

const char *ferry_dtype_st_name(enum ferry_dtype dtype) {
  return (unsigned)dtype < FERRY_DTYPE_COUNT ? table[dtype].st_name : "?";
}

const char *ferry_dtype_name(enum ferry_dtype dtype) {
  return (unsigned)dtype < FERRY_DTYPE_COUNT ? table[dtype].short_name : "?";
}

ferry_status ferry_dtype_parse(const char *text, enum ferry_dtype *out) {
  if (!text) return FERRY_ERR_INVALID;
  for (int i = 0; i < FERRY_DTYPE_COUNT; i++) {
    if (!strcmp(text, table[i].st_name) || !strcasecmp(text, table[i].short_name)) {
      *out = (enum ferry_dtype)i;
      return FERRY_OK;
    }
  }
  static const struct {
    const char *name;
    enum ferry_dtype dtype;
  } aliases[] = {{"float32", FERRY_DTYPE_F32}, {"float", FERRY_DTYPE_F32},
                 {"float16", FERRY_DTYPE_F16}, {"half", FERRY_DTYPE_F16},
                 {"bfloat16", FERRY_DTYPE_BF16}, {"float64", FERRY_DTYPE_F64}};
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
    if (!strcasecmp(text, aliases[i].name)) {
      *out = aliases[i].dtype;
      return FERRY_OK;
    }
  }
  return FERRY_ERR_INVALID;
}
