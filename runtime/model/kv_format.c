/* KV-cache formats: names, element types and row sizes from the one FERRY_KV_FORMAT_MAP table,
 * and the format a model uses by default (its own dtype), shared by the engine, the simulator's
 * pricing and `ferry model show`. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "runtime/model/model_impl.h"

static const struct {
  const char *name;
  enum ferry_dtype dtype;
  int bits, group;
} formats[] = {
    [FERRY_KV_AUTO] = {"auto", FERRY_DTYPE_F32, 32, 0},
#define FERRY_KV_FORMAT_ROW_(e, n, dt, bits, group) [FERRY_KV_##e] = {n, dt, bits, group},
    FERRY_KV_FORMAT_MAP(FERRY_KV_FORMAT_ROW_)
#undef FERRY_KV_FORMAT_ROW_
};

const char *ferry_kv_format_name(enum ferry_kv_format f) {
  return (unsigned)f < FERRY_KV_FORMAT_COUNT ? formats[f].name : "?";
}

ferry_status ferry_kv_format_parse(const char *text, enum ferry_kv_format *out) {
  for (int i = 0; text && i < FERRY_KV_FORMAT_COUNT; i++) {
    if (!strcasecmp(text, formats[i].name)) {
      *out = (enum ferry_kv_format)i;
      return FERRY_OK;
    }
  }
  char names[128] = "";
  size_t n = 0;
  for (int i = 1; i < FERRY_KV_FORMAT_COUNT && n < sizeof names; i++)
    n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i > 1 ? ", " : "", formats[i].name);
  return ferry__fail(FERRY_ERR_INVALID, "unknown KV-cache format '%s' (expected %s, or auto for the model's dtype)",
                     text ? text : "", names);
}

enum ferry_dtype ferry_kv_format_dtype(enum ferry_kv_format f) {
  return (unsigned)f < FERRY_KV_FORMAT_COUNT ? formats[f].dtype : FERRY_DTYPE_F32;
}

int32_t ferry_kv_format_group(enum ferry_kv_format f) {
  return (unsigned)f < FERRY_KV_FORMAT_COUNT ? formats[f].group : 0;
}

/* codes (bits each, whole bytes per group) and one fp16 scale per group */
uint64_t ferry_kv_format_row_bytes(enum ferry_kv_format f, uint64_t elements) {
  if (f == FERRY_KV_AUTO || (unsigned)f >= FERRY_KV_FORMAT_COUNT) return 0;
  if (!formats[f].group) return elements * ferry_dtype_size(formats[f].dtype);
  const uint64_t groups = (elements + (uint64_t)formats[f].group - 1) / (uint64_t)formats[f].group;
  return (elements * (uint64_t)formats[f].bits + 7) / 8 + groups * 2;
}

/* A bf16 model keeps bf16's range in its cache: values past fp16's 65504 would become Inf. */
enum ferry_kv_format ferry__kv_format_default(enum ferry_dtype model_dtype) {
  switch (model_dtype) {
    case FERRY_DTYPE_F32:
    case FERRY_DTYPE_F64: return FERRY_KV_FP32;
    case FERRY_DTYPE_BF16: return FERRY_KV_BF16;
    default: return FERRY_KV_FP16;
  }
}

enum ferry_kv_format ferry_model_kv_format(const ferry_model *model, enum ferry_kv_format requested) {
  if (requested != FERRY_KV_AUTO && (unsigned)requested < FERRY_KV_FORMAT_COUNT) return requested;
  return ferry__kv_format_default(model ? ferry_model_get_config(model)->dtype : FERRY_DTYPE_F32);
}
