/* Fuzz target: a --routing-synth spec ("layers=L,experts=E,k=K,zipf=S,temporal=P,layer=P,
 * seed=N"), parsed over a Mixtral-like default and then used. Invariants of an accepted spec:
 * the model is created, every choice is k distinct experts below E heaviest first with
 * weights summing to 1, the same call gives the same choice, and a call of the wrong shape
 * still gives a valid choice and is counted as a mismatch. */
#include <math.h>
#include <stdlib.h>

#include "ferry/routing.h"
#include "tests/fuzz/fuzz.h"

static void check_choice(const int32_t *ids, const float *w, int32_t k, int32_t n_experts) {
  double sum = 0;
  for (int32_t j = 0; j < k; j++) {
    FUZZ_CHECK(ids[j] >= 0 && ids[j] < n_experts && isfinite(w[j]) && w[j] >= 0);
    FUZZ_CHECK(j == 0 || w[j] <= w[j - 1]);
    for (int32_t m = 0; m < j; m++) FUZZ_CHECK(ids[m] != ids[j]);
    sum += w[j];
  }
  FUZZ_CHECK(fabs(sum - 1.0) < 1e-4);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *spec = fuzz_cstr(data, size);
  if (!spec) return 0;
  struct ferry_routing_synth_config cfg = {.n_layers = 32, .n_experts = 8, .top_k = 2, .seed = 1, .zipf = 1.0};
  ferry_routing_synth *s = NULL;
  if (ferry_routing_synth_parse(spec, &cfg) != FERRY_OK || ferry_routing_synth_create(&s, &cfg) != FERRY_OK) {
    free(spec);
    return 0;
  }
  int32_t ids[FERRY_ROUTING_MAX_TOPK], again[FERRY_ROUTING_MAX_TOPK];
  float w[FERRY_ROUTING_MAX_TOPK], wa[FERRY_ROUTING_MAX_TOPK];
  const int32_t layers[3] = {0, cfg.n_layers / 2, cfg.n_layers - 1};
  for (int64_t req = 0; req < 2; req++)
    for (int32_t t = 0; t < 3; t++)
      for (int li = 0; li < 3; li++) {
        ferry_routing_synth_fn(s, req, t, layers[li], cfg.top_k, cfg.n_experts, ids, w);
        check_choice(ids, w, cfg.top_k, cfg.n_experts);
        ferry_routing_synth_fn(s, req, t, layers[li], cfg.top_k, cfg.n_experts, again, wa);
        for (int32_t j = 0; j < cfg.top_k; j++) FUZZ_CHECK(ids[j] == again[j] && w[j] == wa[j]);
      }
  FUZZ_CHECK(ferry_routing_synth_mismatches(s) == 0);
  ferry_routing_synth_fn(s, 0, 0, cfg.n_layers, 1, 1, ids, w); /* past the last layer */
  check_choice(ids, w, 1, 1);
  FUZZ_CHECK(ferry_routing_synth_mismatches(s) == 1);
  ferry_routing_synth_free(s);
  free(spec);
  return 0;
}
