/* Fuzz target: an expert-predictor weight file (`ferry predictor train` output: safetensors
 * with ferry.* metadata and fp32, fp16 or int8 tensors), loaded by the library's
 * ferry_mlp_load() as `run --predictor-model` and `predictor eval --model` load it. The shape
 * the caller expects is taken from the file's own metadata when it gives one (capped at
 * 64 x 64), so valid files of any shape load.
 * Invariants of an accepted file: the MLP has the variant and shape asked for, and its forward
 * pass runs on every layer. */
#include <stdio.h>
#include <stdlib.h>

#include "common/units.h"
#include "ferry/prefetch.h"
#include "ferry/store.h"
#include "tests/fuzz/fuzz.h"

static int32_t meta_dim(const char *path, const char *key, int32_t dflt) {
  ferry_store *s = NULL;
  int64_t v = dflt;
  if (ferry_store_open(&s, path) == FERRY_OK) {
    const char *text = ferry_store_metadata(s, key);
    if (!text || ferry__parse_i64(text, &v) != FERRY_OK || v < 1 || v > 64) v = dflt;
    ferry_store_close(s);
  }
  return (int32_t)v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *written = fuzz_write("predictor.safetensors", data, size);
  if (!written) return 0;
  char path[256];
  snprintf(path, sizeof path, "%s", written);
  const int32_t layers = meta_dim(path, "ferry.n_layers", 2), experts = meta_dim(path, "ferry.n_experts", 4);
  static const enum ferry_predictor_kind variants[2] = {FERRY_PREDICTOR_MLP3, FERRY_PREDICTOR_MLP7};
  for (int v = 0; v < 2; v++) {
    struct ferry_mlp m;
    enum ferry_dtype file_dtype;
    if (ferry_mlp_load(path, variants[v], layers, experts, &m, &file_dtype) != FERRY_OK) continue;
    FUZZ_CHECK(m.variant == variants[v] && m.n_layers == layers && m.n_experts >= 1 && m.n_experts <= experts);
    FUZZ_CHECK(m.n_in == (variants[v] == FERRY_PREDICTOR_MLP3 ? FERRY_MLP3_FEATURES : FERRY_MLP7_FEATURES));
    FUZZ_CHECK(file_dtype == FERRY_DTYPE_F32 || file_dtype == FERRY_DTYPE_F16 || file_dtype == FERRY_DTYPE_I8);
    float x[FERRY_MLP7_FEATURES] = {0.5f, 0.25f, 0.125f, 1, 2, 3, 4}, *logits = malloc((size_t)m.n_experts * sizeof *logits);
    FUZZ_CHECK(logits != NULL);
    for (int32_t l = 0; l < m.n_layers; l++) ferry_mlp_forward(&m, x, l, logits);
    free(logits);
    ferry_mlp_free(&m);
  }
  return 0;
}
