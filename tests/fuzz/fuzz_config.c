/* Fuzz target: a Hugging Face config.json (every family ferry knows). Invariants of an accepted
 * config: positive sizes, a tensor layout whose shapes match the configuration, layer and
 * expert spans inside the layout, and config.json written back for it reads back to the same
 * shape. */
#include <stdio.h>
#include <string.h>

#include "ferry/alloc.h"
#include "ferry/model.h"
#include "tests/fuzz/fuzz.h"

static void check_layout(const ferry_model *m) {
  const struct ferry_model_config *c = ferry_model_get_config(m);
  const size_t n = ferry_model_tensor_count(m);
  FUZZ_CHECK(n > 0);
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    FUZZ_CHECK(t && (t->ndim == 1 || t->ndim == 2) && t->shape[0] > 0);
    FUZZ_CHECK(t->layer >= -1 && t->layer < c->n_layers);
    FUZZ_CHECK(t->expert >= -1 && t->expert < (c->n_experts > 0 ? c->n_experts : 0));
    FUZZ_CHECK(t->numel == (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1));
    FUZZ_CHECK(memchr(t->name, '\0', sizeof t->name) && ferry_model_find_tensor(m, t->name) == (int64_t)i);
  }
  for (int64_t l = 0; l < c->n_layers; l++) {
    size_t first, count;
    FUZZ_CHECK(ferry_model_layer_span(m, l, &first, &count) == FERRY_OK);
    FUZZ_CHECK(count > 0 && first + count <= n);
    for (size_t i = first; i < first + count; i++) FUZZ_CHECK(ferry_model_tensor(m, i)->layer == l);
    /* the first and last expert are enough: the layout is regular; a dense layer of an MoE model
     * (DeepSeek's first layers, Qwen2-MoE's mlp_only_layers) has none */
    struct ferry_layer_info info;
    FUZZ_CHECK(ferry_model_layer_info(m, l, &info) == FERRY_OK);
    FUZZ_CHECK(info.moe == (ferry_model_expert_span(m, l, 0, &first, &count) == FERRY_OK));
    for (int64_t e = 0; info.moe && e < c->n_experts; e += c->n_experts > 1 ? c->n_experts - 1 : 1) {
      FUZZ_CHECK(ferry_model_expert_span(m, l, e, &first, &count) == FERRY_OK);
      FUZZ_CHECK(count > 0 && first + count <= n && ferry_model_tensor(m, first)->expert == e);
    }
  }
  FUZZ_CHECK(ferry_model_layer_span(m, c->n_layers, &(size_t){0}, &(size_t){0}) == FERRY_ERR_RANGE);
  struct ferry_model_accounting a;
  ferry_model_get_accounting(m, &a);
  FUZZ_CHECK(a.params_total > 0 && a.params_active <= a.params_total);
  (void)ferry_model_flops_per_token(m, c->max_position);
  (void)ferry_model_flops_prefill(m, c->max_position);
}

/* config.json written for the model reads back to the same configuration */
static void check_round_trip(const ferry_model *m) {
  char *json = NULL;
  if (ferry_model_config_json(m, &json) != FERRY_OK) return;
  const char *path = fuzz_write("config.json", (const uint8_t *)json, strlen(json));
  ferry_free(json);
  FUZZ_CHECK(path != NULL);
  ferry_model *back = NULL;
  FUZZ_CHECK(ferry_model_open(&back, path) == FERRY_OK);
  const struct ferry_model_config *a = ferry_model_get_config(m), *b = ferry_model_get_config(back);
  FUZZ_CHECK(a->family == b->family && a->n_layers == b->n_layers && a->hidden == b->hidden);
  FUZZ_CHECK(a->intermediate == b->intermediate && a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads);
  FUZZ_CHECK(a->head_dim == b->head_dim && a->vocab == b->vocab && a->max_position == b->max_position);
  FUZZ_CHECK(a->n_experts == b->n_experts && a->experts_per_token == b->experts_per_token);
  FUZZ_CHECK(a->expert_intermediate == b->expert_intermediate && a->n_shared_experts == b->n_shared_experts);
  FUZZ_CHECK(a->shared_intermediate == b->shared_intermediate && a->tied_embeddings == b->tied_embeddings);
  FUZZ_CHECK(a->dtype == b->dtype && a->sliding_window == b->sliding_window);
  FUZZ_CHECK(ferry_model_tensor_count(m) == ferry_model_tensor_count(back));
  ferry_model_close(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write("config.json", data, size);
  if (!path) return 0;
  ferry_model *m = NULL;
  if (ferry_model_open(&m, path) != FERRY_OK) return 0;
  const struct ferry_model_config *c = ferry_model_get_config(m);
  FUZZ_CHECK(c->n_layers > 0 && c->hidden > 0 && c->n_heads > 0 && c->vocab > 0);
  FUZZ_CHECK(c->n_experts == 0 || (c->experts_per_token > 0 && c->experts_per_token <= c->n_experts));
  check_layout(m);
  check_round_trip(m);
  ferry_model_close(m);
  return 0;
}
