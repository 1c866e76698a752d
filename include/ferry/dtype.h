/**
 * @file dtype.h
 * @brief Element types of tensors, with the names safetensors uses ("F32", "BF16", ...).
 */
#ifndef FERRY_DTYPE_H
#define FERRY_DTYPE_H

#include "ferry/api.h"

#include <stddef.h>

#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** X-macro table: X(ENUM, safetensors name, short name, bytes per element). */
#define FERRY_DTYPE_MAP(X)        \
  X(F32, "F32", "fp32", 4)        \
  X(F16, "F16", "fp16", 2)        \
  X(BF16, "BF16", "bf16", 2)      \
  X(F64, "F64", "fp64", 8)        \
  X(I64, "I64", "int64", 8)       \
  X(I32, "I32", "int32", 4)       \
  X(I16, "I16", "int16", 2)       \
  X(I8, "I8", "int8", 1)          \
  X(U8, "U8", "uint8", 1)         \
  X(BOOL, "BOOL", "bool", 1)      \
  X(U16, "U16", "uint16", 2)      \
  X(U32, "U32", "uint32", 4)      \
  X(U64, "U64", "uint64", 8)      \
  X(F8_E4M3, "F8_E4M3", "fp8e4m3", 1) \
  X(F8_E5M2, "F8_E5M2", "fp8e5m2", 1)

/** Element type of a tensor. */
enum ferry_dtype {
#define FERRY_DTYPE_ENUM_(e, st, short_name, size) FERRY_DTYPE_##e,
  FERRY_DTYPE_MAP(FERRY_DTYPE_ENUM_)
#undef FERRY_DTYPE_ENUM_
  FERRY_DTYPE_COUNT /**< number of dtypes, not a dtype */
};

/**
 * @brief Bytes per element of a dtype.
 * @return 1, 2, 4 or 8; 0 for a value outside the enum.
 */
FERRY_API size_t ferry_dtype_size(enum ferry_dtype dtype);

/**
 * @brief The safetensors spelling of a dtype ("F32", "BF16", ...).
 * @return a static string; "?" for a value outside the enum.
 */
FERRY_API const char *ferry_dtype_st_name(enum ferry_dtype dtype);

/**
 * @brief The short user-facing spelling of a dtype ("fp32", "bf16", ...).
 * @return a static string; "?" for a value outside the enum.
 */
FERRY_API const char *ferry_dtype_name(enum ferry_dtype dtype);

/**
 * @brief Parse a dtype from either its safetensors or its short spelling (also accepts the
 *        Hugging Face `torch_dtype` spellings "float32", "float16", "bfloat16").
 * @param text the spelling; case-sensitive for safetensors names, case-insensitive otherwise.
 * @param out receives the dtype on success.
 * @return FERRY_OK, or FERRY_ERR_INVALID for an unknown spelling.
 */
FERRY_API ferry_status ferry_dtype_parse(const char *text, enum ferry_dtype *out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_DTYPE_H */
