/**
 * @file quantize.h
 * @brief Quantizing a whole model folder: every weight matrix packed in the format a plan gives
 *        its tensor class, written as safetensors with the packed parts as tensors
 *        (`<prefix>.qweight`, `.scales`, `.zeros`, ...) and the format of each tensor recorded in
 *        `__metadata__` under `ferry.quant`. ferry's loader recognises such folders.
 */
#ifndef FERRY_QUANTIZE_H
#define FERRY_QUANTIZE_H

#include "ferry/api.h"

#include <stdint.h>
#include <stdio.h>

#include "ferry/quant.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Quality and size of one tensor class after quantization. */
struct ferry_quantize_class_report {
  int64_t tensors;        /**< tensors of the class */
  uint64_t bytes_before;  /**< bytes in the input */
  uint64_t bytes_after;   /**< bytes in the output (all parts) */
  double max_rel_error;   /**< largest relative Frobenius error of a tensor */
  double mean_rel_error;  /**< mean relative Frobenius error over the tensors */
};

/** What quantizing a model did. */
struct ferry_quantize_report {
  struct ferry_quantize_class_report cls[FERRY_QCLASS_COUNT]; /**< per tensor class */
  uint64_t bytes_before;  /**< whole model, input */
  uint64_t bytes_after;   /**< whole model, output */
};

/**
 * @brief Quantize the model in @p in_dir into @p out_dir (which must not exist or be empty).
 *        Written under a temporary name and renamed at the end: nothing is left on failure.
 * @param in_dir model folder (config.json + safetensors in fp32, fp16 or bf16).
 * @param out_dir output folder.
 * @param plan the format of each tensor class.
 * @param progress where to print progress lines, or NULL.
 * @param report receives sizes and errors (may be NULL).
 */
FERRY_API ferry_status ferry_model_quantize(const char *in_dir, const char *out_dir, const struct ferry_qplan *plan,
                                  FILE *progress, struct ferry_quantize_report *report);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_QUANTIZE_H */
