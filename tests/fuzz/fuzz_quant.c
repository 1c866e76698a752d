/* Fuzz target: a --quant / --format / --plan string. The same text goes through the format
 * parser and the per-class plan parser. Invariants of an accepted text: the spec is well formed,
 * its canonical name parses back to the same spec (and the plan's canonical text to the same
 * plan), every class has a format, and a small matrix packs in that format and unpacks to
 * finite values of the right magnitude; a format of published checkpoints (read-only) refuses
 * to be quantized into and reads an all-zero matrix as zeros. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/quant.h"
#include "runtime/quant/quant_impl.h"
#include "tests/fuzz/fuzz.h"

static int same_spec(const struct ferry_qspec *a, const struct ferry_qspec *b) {
  return a->format == b->format && a->group_size == b->group_size;
}

/* Pack and unpack a [2, 2 groups] matrix (64 columns without groups) of a smooth ramp. A format
 * of published checkpoints (GPTQ, AWQ, compressed-tensors, MXFP4, fp8 blocks) is read as stored:
 * a [16, 2 groups] (128 columns) matrix has a layout, quantizing into it is refused as
 * unsupported, and an all-zero blob reads as zeros. */
static void check_pack(const struct ferry_qspec *spec) {
  const int published = ferry__quant_is_published(spec->format);
  const int64_t rows = published ? 16 : 2;
  const int64_t cols = spec->group_size > 0 ? 2 * (int64_t)spec->group_size : published ? 128 : 64;
  struct ferry_qlayout lay;
  FUZZ_CHECK(ferry_quant_layout(spec, rows, cols, &lay) == FERRY_OK);
  FUZZ_CHECK(lay.total_bytes == lay.data_bytes + lay.scale_bytes && lay.blob_bytes >= lay.total_bytes);
  FUZZ_CHECK(ferry_quant_packed_bytes(spec, rows, cols, NULL, NULL) == lay.total_bytes);
  float *src = malloc((size_t)(rows * cols) * sizeof *src), *dst = malloc((size_t)(rows * cols) * sizeof *dst);
  uint8_t *blob = calloc(1, (size_t)lay.blob_bytes);
  FUZZ_CHECK(src && dst && blob);
  for (int64_t i = 0; i < rows * cols; i++) src[i] = (float)((double)(i % 17) - 8.0) / 8.0f;
  struct ferry_qout out;
  struct ferry_qview view;
  ferry_quant_out_blob(&lay, blob, &out);
  ferry_quant_view_blob(&lay, blob, &view);
  FUZZ_CHECK(ferry_quant_quantize(spec, src, rows, cols, &out) == (published ? FERRY_ERR_UNSUPPORTED : FERRY_OK));
  FUZZ_CHECK(ferry_quant_dequantize_rows(spec, &view, rows, cols, 0, rows, dst) == FERRY_OK);
  for (int64_t i = 0; i < rows * cols; i++)
    FUZZ_CHECK(published ? dst[i] == 0.0f : isfinite(dst[i]) && fabsf(dst[i]) <= 2.0f);
  FUZZ_CHECK(published || ferry_quant_error(src, dst, (size_t)(rows * cols)) < 1.0);
  free(src);
  free(dst);
  free(blob);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size);
  if (!text) return 0;
  struct ferry_qspec spec, back;
  if (ferry_quant_spec_parse(text, &spec) == FERRY_OK) {
    FUZZ_CHECK(ferry_quant_spec_check(&spec) == FERRY_OK);
    char name[FERRY_QSPEC_NAME_MAX];
    ferry_quant_spec_name(&spec, name, sizeof name);
    FUZZ_CHECK(ferry_quant_spec_parse(name, &back) == FERRY_OK && same_spec(&spec, &back));
    check_pack(&spec);
  }
  struct ferry_qplan plan, plan_back;
  if (ferry_quant_plan_parse(text, &plan) == FERRY_OK) {
    char canon[256];
    ferry_quant_plan_format(&plan, canon, sizeof canon);
    FUZZ_CHECK(ferry_quant_plan_parse(canon, &plan_back) == FERRY_OK);
    for (int c = 0; c < FERRY_QCLASS_COUNT; c++) {
      FUZZ_CHECK(ferry_quant_spec_check(&plan.spec[c]) == FERRY_OK);
      FUZZ_CHECK(same_spec(&plan.spec[c], &plan_back.spec[c]));
      struct ferry_qspec looked;
      FUZZ_CHECK(ferry_quant_plan_lookup(&plan, ferry_quant_class_name((enum ferry_qclass)c), &looked) == FERRY_OK);
      FUZZ_CHECK(same_spec(&looked, &plan.spec[c]));
    }
    FUZZ_CHECK(plan.spec[FERRY_QCLASS_NORM].group_size == 0); /* norms stay float */
  }
  free(text);
  return 0;
}
