/* runtime/model: presets against published parameter counts, tensor layout and file order,
 * accounting (bytes, KV cache, FLOPs), Hugging Face config.json reading (good fixtures,
 * defaults, malformed corpus), config.json round trips, allocation failures and the CLI. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/json.h"
#include "ferry/alloc.h"
#include "ferry/model.h"
#include "testutil.h"

static ferry_model *open_ok(const char *name) {
  ferry_model *m = NULL;
  ferry_status st = ferry_model_open(&m, name);
  if (st != FERRY_OK) fprintf(stderr, "open %s: %s\n", name, ferry_last_error());
  assert_int_equal(st, FERRY_OK);
  assert_non_null(m);
  return m;
}

static struct ferry_model_accounting acc_of(const ferry_model *m) {
  struct ferry_model_accounting a;
  ferry_model_get_accounting(m, &a);
  return a;
}

static void assert_near(double got, double want, double rel) {
  if (fabs(got - want) > rel * fabs(want)) fail_msg("got %.6g, expected %.6g within %.2f%%", got, want, rel * 100);
}

static const struct ferry_tensor_desc *tensor_named(const ferry_model *m, const char *name) {
  int64_t i = ferry_model_find_tensor(m, name);
  if (i < 0) fail_msg("tensor %s missing", name);
  return ferry_model_tensor(m, (size_t)i);
}

static void assert_shape(const ferry_model *m, const char *name, int64_t s0, int64_t s1) {
  const struct ferry_tensor_desc *t = tensor_named(m, name);
  assert_int_equal(t->shape[0], s0);
  assert_int_equal(t->shape[1], s1);
  assert_int_equal(t->ndim, s1 ? 2 : 1);
}

static char *fixture(const char *family) {
  char rel[128];
  snprintf(rel, sizeof rel, "configs/%s", family);
  return tu_data_path(rel);
}

/* Field-by-field, so struct padding never matters. */
static void assert_config_equal(const struct ferry_model_config *a, const struct ferry_model_config *b, int names) {
  if (names) assert_string_equal(a->name, b->name);
#define EQ(f) assert_true(a->f == b->f)
  EQ(family); EQ(n_layers); EQ(hidden); EQ(intermediate); EQ(n_heads); EQ(n_kv_heads); EQ(head_dim);
  EQ(vocab); EQ(max_position); EQ(n_experts); EQ(experts_per_token); EQ(expert_intermediate);
  EQ(n_shared_experts); EQ(shared_intermediate); EQ(shared_expert_gate); EQ(norm_topk_prob);
  EQ(tied_embeddings); EQ(qkv_bias); EQ(attn_out_bias); EQ(ffn_bias); EQ(qk_norm); EQ(learned_positions);
  EQ(norm); EQ(act); EQ(norm_eps); EQ(rope_theta); EQ(sliding_window); EQ(dtype);
  EQ(first_dense_layers); EQ(moe_layer_step); EQ(sliding_pattern); EQ(rope_local_theta); EQ(rotary_dim);
  EQ(rope_interleaved); EQ(norm_unit_offset); EQ(sandwich_norms); EQ(scale_embeddings); EQ(query_pre_attn_scalar);
  EQ(attn_softcap); EQ(final_softcap); EQ(parallel_residual); EQ(parallel_shared_norm); EQ(fused_qkv); EQ(embed_norm); EQ(alibi);
  EQ(attn_sinks); EQ(attn_chunk); EQ(nope_layer_step); EQ(attn_temp_floor); EQ(attn_temp_scale); EQ(lm_head_bias);
  EQ(q_lora_rank); EQ(kv_lora_rank); EQ(qk_nope_dim); EQ(qk_rope_dim); EQ(v_head_dim); EQ(router); EQ(router_bias);
  EQ(router_score_bias); EQ(n_group); EQ(topk_group); EQ(routed_scaling); EQ(router_jitter); EQ(expert_scale_input);
  EQ(expert_layout); EQ(swiglu_limit); EQ(multimodal_names);
  EQ(rope_scaling.type); EQ(rope_scaling.factor); EQ(rope_scaling.original_max_position);
  EQ(rope_scaling.low_freq_factor); EQ(rope_scaling.high_freq_factor); EQ(rope_scaling.beta_fast);
  EQ(rope_scaling.beta_slow); EQ(rope_scaling.mscale); EQ(rope_scaling.mscale_all_dim);
  EQ(rope_scaling.attention_factor); EQ(rope_scaling.no_truncate); EQ(rope_scaling.n_factors);
  EQ(rope_scaling.short_mscale); EQ(rope_scaling.long_mscale);
  assert_memory_equal(a->rope_scaling.short_factor, b->rope_scaling.short_factor, sizeof a->rope_scaling.short_factor);
  assert_memory_equal(a->rope_scaling.long_factor, b->rope_scaling.long_factor, sizeof a->rope_scaling.long_factor);
  EQ(quant.kind); EQ(quant.bits); EQ(quant.group_size); EQ(quant.block[0]); EQ(quant.block[1]); EQ(quant.symmetric);
  EQ(quant.desc_act); EQ(quant.experts_only);
  assert_memory_equal(&a->vision, &b->vision, sizeof a->vision);
#undef EQ
}

/* ---- layout invariants, for every preset ---------------------------------------------- */

/* Each layer's span covers it exactly, its dense part then its experts back to back; sums the
 * layers' parameters and finds the largest, and counts the MoE layers. */
static void check_layer_spans(const ferry_model *m, const struct ferry_model_config *c,
                              const struct ferry_model_accounting *a, uint64_t *layers, uint64_t *max_all,
                              uint64_t *max_dense, int64_t *moe_layers) {
  /* spans cover each layer exactly: dense part, then its experts back to back */
  for (int64_t l = 0; l < c->n_layers; l++) {
    size_t first, count;
    uint64_t all, dense;
    struct ferry_layer_info li;
    assert_int_equal(ferry_model_layer_span(m, l, &first, &count), FERRY_OK);
    assert_int_equal(ferry_model_layer_params(m, l, &all, &dense), FERRY_OK);
    assert_int_equal(ferry_model_layer_info(m, l, &li), FERRY_OK);
    uint64_t p = 0;
    for (size_t i = first; i < first + count; i++) {
      assert_int_equal(ferry_model_tensor(m, i)->layer, l);
      assert_int_equal(ferry_model_tensor(m, i)->expert, -1);
      p += ferry_model_tensor(m, i)->numel;
    }
    assert_int_equal(p, dense);
    *layers += all;
    if (all > *max_all) *max_all = all;
    if (dense > *max_dense) *max_dense = dense;
    size_t next = first + count;
    *moe_layers += li.moe;
    for (int64_t e = 0; e < c->n_experts; e++) {
      size_t ef, ec;
      if (!li.moe) {
        assert_int_equal(ferry_model_expert_span(m, l, e, &ef, &ec), FERRY_ERR_RANGE);
        continue;
      }
      assert_int_equal(ferry_model_expert_span(m, l, e, &ef, &ec), FERRY_OK);
      assert_int_equal(ef, next);
      assert_true(ec >= 2 && ec <= 4);
      uint64_t ep = 0;
      for (size_t i = ef; i < ef + ec; i++) {
        assert_int_equal(ferry_model_tensor(m, i)->expert, e);
        ep += ferry_model_tensor(m, i)->numel;
      }
      assert_int_equal(ep, a->params_expert);
      next = ef + ec;
    }
    assert_int_equal(all, dense + (li.moe ? (uint64_t)c->n_experts * a->params_expert : 0));
    if (l + 1 < c->n_layers) {
      size_t nf, nc;
      assert_int_equal(ferry_model_layer_span(m, l + 1, &nf, &nc), FERRY_OK);
      assert_int_equal(nf, next);
    }
  }
}

static void check_layout(const ferry_model *m) {
  const struct ferry_model_config *c = ferry_model_get_config(m);
  struct ferry_model_accounting a = acc_of(m);
  size_t n = ferry_model_tensor_count(m);
  assert_true(n > 0);
  assert_null(ferry_model_tensor(m, n));
  uint64_t sum = 0, bytes = 0;
  int phase = 0; /* 0 embeddings, 1 layers, 2 final */
  int32_t prev_layer = -1, prev_expert = -1;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    assert_int_equal(t->numel, (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1));
    /* a fused checkpoint tensor answers by name with its first slice */
    int64_t found = ferry_model_find_tensor(m, t->name);
    assert_true(found >= 0);
    assert_string_equal(ferry_model_tensor(m, (size_t)found)->name, t->name);
    if (t->slice <= 0) assert_int_equal(found, (int64_t)i);
    if (t->slice >= 0) {
      assert_int_equal(t->slice, t->expert);
      assert_int_equal(t->n_slices, c->n_experts);
    }
    if (!t->quantized) assert_int_equal(t->bytes, t->numel * ferry_dtype_size(c->dtype));
    sum += t->numel;
    bytes += t->bytes;
    if (t->layer >= 0) {
      assert_true(phase <= 1);
      phase = 1;
      assert_true(t->layer >= prev_layer);
      if (t->layer == prev_layer) {
        /* within a layer: dense part first, then experts in increasing order, each adjacent */
        if (prev_expert >= 0) assert_true(t->expert >= prev_expert);
      } else {
        assert_int_equal(t->layer, prev_layer + 1);
        assert_int_equal(t->expert, -1);
      }
      prev_layer = t->layer;
      prev_expert = t->expert;
    } else {
      if (t->role == FERRY_ROLE_EMBED || t->role == FERRY_ROLE_POS_EMBED || t->role == FERRY_ROLE_EMBED_NORM ||
          t->role == FERRY_ROLE_EMBED_NORM_BIAS) {
        assert_int_equal(phase, 0);
      } else {
        phase = 2;
        assert_true(t->role == FERRY_ROLE_FINAL_NORM || t->role == FERRY_ROLE_FINAL_NORM_BIAS ||
                    t->role == FERRY_ROLE_LM_HEAD || t->role == FERRY_ROLE_LM_HEAD_BIAS);
      }
    }
  }
  assert_int_equal(prev_layer, c->n_layers - 1);
  assert_int_equal(sum + a.params_extra, a.params_total);
  assert_int_equal(bytes + a.params_extra * ferry_dtype_size(c->dtype), a.bytes_total);
  uint64_t layers = 0, max_all = 0, max_dense = 0;
  int64_t moe_layers = 0;
  check_layer_spans(m, c, &a, &layers, &max_all, &max_dense, &moe_layers);
  assert_int_equal(a.params_total, a.params_embed + a.params_head + layers + a.params_extra);
  assert_int_equal(a.params_layer, max_all);
  assert_int_equal(a.params_layer_dense, max_dense);
  assert_int_equal(a.n_moe_layers, moe_layers);
  assert_int_equal(ferry_model_layer_span(m, c->n_layers, &(size_t){0}, &(size_t){0}), FERRY_ERR_RANGE);
}

static void test_presets_layout(void **state) {
  (void)state;
  assert_int_equal(ferry_model_preset_count(), 27);
  assert_null(ferry_model_preset_name(ferry_model_preset_count()));
  for (size_t i = 0; i < ferry_model_preset_count(); i++) {
    ferry_model *m = open_ok(ferry_model_preset_name(i));
    assert_string_equal(ferry_model_get_config(m)->name, ferry_model_preset_name(i));
    check_layout(m);
    assert_int_equal(ferry_model_is_moe(m), ferry_model_get_config(m)->n_experts > 0);
    ferry_model_close(m);
  }
  ferry_model_close(NULL);
}

/* ---- published figures ------------------------------------------------------------------ */

static void test_llama2_7b(void **state) {
  (void)state;
  ferry_model *m = open_ok("llama-2-7b");
  struct ferry_model_accounting a = acc_of(m);
  assert_near((double)a.params_total, 6.74e9, 0.005);
  assert_int_equal(a.params_total, 6738415616ull); /* the count Meta and HF report */
  assert_int_equal(a.params_active, a.params_total);
  assert_int_equal(a.params_expert, 0);
  assert_int_equal(ferry_model_get_config(m)->dtype, FERRY_DTYPE_F16);
  assert_int_equal(ferry_model_kv_bytes(m, 2048, FERRY_KV_FP16), 1073741824ull);
  assert_int_equal(ferry_model_kv_bytes(m, 2048, FERRY_KV_BF16), 1073741824ull);
  assert_int_equal(ferry_model_kv_bytes(m, 2048, FERRY_KV_FP32), 2147483648ull);
  assert_int_equal(ferry_model_kv_bytes(m, 0, FERRY_KV_FP16), 0);
  assert_int_equal(a.kv_bytes_per_token, 524288);
  assert_shape(m, "model.embed_tokens.weight", 32000, 4096);
  assert_shape(m, "model.layers.31.mlp.down_proj.weight", 4096, 11008);
  assert_shape(m, "model.layers.0.input_layernorm.weight", 4096, 0);
  assert_shape(m, "lm_head.weight", 32000, 4096);
  assert_int_equal(ferry_model_find_tensor(m, "model.layers.32.mlp.down_proj.weight"), -1);
  assert_int_equal(ferry_model_find_tensor(m, "model.layers.0.self_attn.q_proj.bias"), -1);
  assert_int_equal(ferry_model_tensor_count(m), 1 + 32 * 9 + 2);
  ferry_model_close(m);
}

static void test_mixtral(void **state) {
  (void)state;
  ferry_model *m = open_ok("mixtral-8x7b");
  struct ferry_model_accounting a = acc_of(m);
  assert_near((double)a.params_total, 46.7e9, 0.01);
  assert_near((double)a.params_active, 12.9e9, 0.01);
  assert_int_equal(a.params_expert, 3ull * 4096 * 14336);
  assert_shape(m, "model.layers.5.block_sparse_moe.gate.weight", 8, 4096);
  assert_shape(m, "model.layers.5.block_sparse_moe.experts.7.w1.weight", 14336, 4096);
  assert_shape(m, "model.layers.5.block_sparse_moe.experts.7.w3.weight", 14336, 4096);
  assert_shape(m, "model.layers.5.block_sparse_moe.experts.7.w2.weight", 4096, 14336);
  assert_shape(m, "model.layers.0.self_attn.k_proj.weight", 1024, 4096);
  assert_int_equal(tensor_named(m, "model.layers.5.block_sparse_moe.experts.7.w1.weight")->role, FERRY_ROLE_EXPERT_GATE);
  assert_int_equal(tensor_named(m, "model.layers.5.block_sparse_moe.experts.7.w3.weight")->role, FERRY_ROLE_EXPERT_UP);
  assert_int_equal(tensor_named(m, "model.layers.5.block_sparse_moe.experts.7.w2.weight")->role, FERRY_ROLE_EXPERT_DOWN);
  size_t f, n;
  assert_int_equal(ferry_model_expert_span(m, 5, 7, &f, &n), FERRY_OK);
  assert_string_equal(ferry_model_tensor(m, f)->name, "model.layers.5.block_sparse_moe.experts.7.w1.weight");
  assert_int_equal(ferry_model_expert_span(m, 5, 8, &f, &n), FERRY_ERR_RANGE);
  assert_int_equal(ferry_model_expert_span(m, 32, 0, &f, &n), FERRY_ERR_RANGE);
  assert_int_equal(ferry_model_layer_span(m, -1, &f, &n), FERRY_ERR_RANGE);
  assert_int_equal(ferry_model_get_config(m)->norm_topk_prob, 1);
  ferry_model_close(m);
}

static void test_other_moe_published(void **state) {
  (void)state;
  ferry_model *m = open_ok("qwen1.5-moe-a2.7b"); /* 14.3B total, 2.7B activated */
  struct ferry_model_accounting a = acc_of(m);
  assert_near((double)a.params_total, 14.3e9, 0.01);
  assert_near((double)a.params_active, 2.7e9, 0.02);
  assert_shape(m, "model.layers.3.mlp.shared_expert_gate.weight", 1, 2048);
  assert_shape(m, "model.layers.3.mlp.shared_expert.up_proj.weight", 5632, 2048);
  assert_shape(m, "model.layers.3.mlp.experts.59.down_proj.weight", 2048, 1408);
  assert_shape(m, "model.layers.3.self_attn.v_proj.bias", 2048, 0);
  ferry_model_close(m);
  m = open_ok("olmoe-1b-7b"); /* 6.9B total, 1.3B active */
  a = acc_of(m);
  assert_near((double)a.params_total, 6.9e9, 0.01);
  assert_near((double)a.params_active, 1.3e9, 0.02);
  assert_shape(m, "model.layers.15.self_attn.q_norm.weight", 2048, 0);
  assert_shape(m, "model.layers.15.mlp.gate.weight", 64, 2048);
  ferry_model_close(m);
}

static void test_opt(void **state) {
  (void)state;
  ferry_model *m = open_ok("opt-175b");
  struct ferry_model_accounting a = acc_of(m);
  assert_near((double)a.bytes_total, 350e9, 0.02);
  assert_shape(m, "model.decoder.embed_positions.weight", 2050, 12288);
  assert_shape(m, "model.decoder.layers.95.fc1.weight", 49152, 12288);
  assert_shape(m, "model.decoder.layers.95.fc1.bias", 49152, 0);
  assert_shape(m, "model.decoder.layers.0.self_attn.out_proj.bias", 12288, 0);
  assert_shape(m, "model.decoder.layers.0.self_attn_layer_norm.bias", 12288, 0);
  assert_shape(m, "model.decoder.final_layer_norm.bias", 12288, 0);
  assert_int_equal(ferry_model_find_tensor(m, "lm_head.weight"), -1); /* tied */
  assert_int_equal(a.params_embed, (50272ull + 2050ull) * 12288ull);
  ferry_model_close(m);
  m = open_ok("opt-6.7b");
  assert_near((double)acc_of(m).params_total, 6.66e9, 0.005);
  ferry_model_close(m);
}

static void test_tiny_presets(void **state) {
  (void)state;
  const char *tiny[] = {"tiny-dense", "tiny-moe", "tiny-qwen2-moe", "tiny-olmoe"};
  for (size_t i = 0; i < 4; i++) {
    ferry_model *m = open_ok(tiny[i]);
    const struct ferry_model_config *c = ferry_model_get_config(m);
    struct ferry_model_accounting a = acc_of(m);
    assert_int_equal(c->dtype, FERRY_DTYPE_F32);
    assert_int_equal(c->vocab, 256);
    assert_true(a.bytes_total < 20u << 20);
    assert_true((double)(a.bytes_layer * (uint64_t)c->n_layers) >= 0.8 * (double)a.bytes_total);
    ferry_model_close(m);
  }
  ferry_model *m = open_ok("tiny-dense");
  assert_shape(m, "model.layers.7.self_attn.k_proj.weight", 64, 128);
  assert_shape(m, "model.layers.7.mlp.gate_proj.weight", 352, 128);
  ferry_model_close(m);
  m = open_ok("tiny-moe");
  assert_shape(m, "model.layers.5.block_sparse_moe.experts.7.w2.weight", 128, 192);
  assert_int_equal(ferry_model_get_config(m)->norm_topk_prob, 1);
  ferry_model_close(m);
  m = open_ok("tiny-qwen2-moe");
  assert_shape(m, "model.layers.0.mlp.shared_expert_gate.weight", 1, 128);
  assert_shape(m, "model.layers.0.mlp.shared_expert.down_proj.weight", 128, 192);
  assert_shape(m, "model.layers.0.self_attn.q_proj.bias", 128, 0);
  assert_shape(m, "model.layers.0.mlp.experts.0.gate_proj.weight", 96, 128);
  assert_int_equal(ferry_model_get_config(m)->norm_topk_prob, 0);
  ferry_model_close(m);
  m = open_ok("tiny-olmoe");
  assert_shape(m, "model.layers.3.self_attn.q_norm.weight", 128, 0);
  assert_shape(m, "model.layers.3.self_attn.k_norm.weight", 128, 0);
  assert_shape(m, "model.layers.3.mlp.experts.7.up_proj.weight", 96, 128);
  ferry_model_close(m);
}

static void test_flops(void **state) {
  (void)state;
  ferry_model *m = open_ok("llama-2-7b");
  /* every 2-D weight but the embedding: 32 layers x (4 x 4096^2 + 3 x 4096 x 11008) + head */
  double matmul = 32.0 * (4.0 * 4096 * 4096 + 3.0 * 4096 * 11008) + 32000.0 * 4096;
  assert_true(ferry_model_matmul_params_active(m) == matmul);
  assert_true(ferry_model_flops_per_token(m, 0) == 2 * matmul);
  assert_true(ferry_model_flops_per_token(m, 2048) - ferry_model_flops_per_token(m, 0) == 4.0 * 32 * 32 * 128 * 2048);
  assert_true(ferry_model_flops_per_token(m, -5) == ferry_model_flops_per_token(m, 0));
  ferry_model_close(m);
  const char *names[] = {"tiny-moe", "opt-6.7b", "tiny-qwen2-moe"};
  for (size_t k = 0; k < 3; k++) {
    m = open_ok(names[k]);
    double sum = 0;
    for (int64_t i = 0; i < 17; i++) sum += ferry_model_flops_per_token(m, i);
    assert_near(ferry_model_flops_prefill(m, 17), sum, 1e-12);
    assert_true(ferry_model_flops_prefill(m, 0) == 0);
    ferry_model_close(m);
  }
  /* MoE: only top-k experts count; tied OPT head still multiplies */
  m = open_ok("mixtral-8x7b");
  struct ferry_model_accounting a = acc_of(m);
  assert_near(ferry_model_matmul_params_active(m), (double)a.params_active - 32000.0 * 4096 - 65.0 * 4096, 1e-12);
  ferry_model_close(m);
  m = open_ok("opt-6.7b");
  assert_true(ferry_model_matmul_params_active(m) > 32.0 * 12 * 4096 * 4096 + 50272.0 * 4096 - 1);
  ferry_model_close(m);
}

/* ---- config.json --------------------------------------------------------------------------- */

static void test_roundtrip_presets(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("model-rt");
  char path[1024];
  snprintf(path, sizeof path, "%s/config.json", dir);
  for (size_t i = 0; i < ferry_model_preset_count(); i++) {
    ferry_model *m = open_ok(ferry_model_preset_name(i));
    char *text = NULL;
    assert_int_equal(ferry_model_config_json(m, &text), FERRY_OK);
    assert_non_null(text);
    assert_true(tu_contains(text, "\"model_type\""));
    tu_write_file(path, text, strlen(text));
    ferry_free(text);
    ferry_model *back = open_ok(dir);
    assert_config_equal(ferry_model_get_config(m), ferry_model_get_config(back), 1);
    struct ferry_model_accounting a = acc_of(m), b = acc_of(back);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(ferry_model_tensor_count(m), ferry_model_tensor_count(back));
    ferry_model_close(back);
    back = open_ok(path); /* the file itself works too */
    assert_config_equal(ferry_model_get_config(m), ferry_model_get_config(back), 1);
    ferry_model_close(back);
    ferry_model_close(m);
  }
  tu_rmtree(dir);
  free(dir);
}

static void test_fixtures_match_presets(void **state) {
  (void)state;
  const struct {
    const char *fixture, *preset;
  } pairs[] = {{"llama", "llama-2-7b"},     {"llama3", "llama-3-8b"},         {"mixtral", "mixtral-8x7b"},
               {"qwen2_moe", "qwen1.5-moe-a2.7b"}, {"olmoe", "olmoe-1b-7b"}, {"opt", "opt-6.7b"},
               {"qwen3", "qwen3-8b"}, {"qwen3_moe", "qwen3-30b-a3b"}, {"deepseek_v2", "deepseek-v2-lite"},
               {"deepseek_v3", "deepseek-v3"}, {"gpt_oss", "gpt-oss-120b"}, {"gpt_oss_20b", "gpt-oss-20b"},
               {"llama4", "llama-4-scout-17b-16e"}, {"phimoe", "phi-3.5-moe"}, {"gemma2", "gemma-2-9b"},
               {"gemma3", "gemma-3-27b"}, {"gpt_neox", "gpt-neox-20b"}, {"bloom", "bloom-176b"},
               {"gptj", "gpt-j-6b"}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    char *p = fixture(pairs[i].fixture);
    ferry_model *f = open_ok(p), *m = open_ok(pairs[i].preset);
    struct ferry_model_config fc = *ferry_model_get_config(f);
    /* bigscience/bloom's config.json names no dtype (fp32 then); its weights are bf16 */
    if (!strcmp(pairs[i].fixture, "bloom")) {
      assert_int_equal(fc.dtype, FERRY_DTYPE_F32);
      fc.dtype = FERRY_DTYPE_BF16;
    }
    assert_config_equal(&fc, ferry_model_get_config(m), 0);
    ferry_model_close(f);
    ferry_model_close(m);
    free(p);
  }
  char *p = fixture("llama");
  ferry_model *f = open_ok(p);
  assert_string_equal(ferry_model_get_config(f)->name, "meta-llama/Llama-2-7b-hf");
  ferry_model_close(f);
  free(p);
  p = fixture("opt"); /* no _name_or_path: named after its folder */
  f = open_ok(p);
  assert_string_equal(ferry_model_get_config(f)->name, "opt");
  ferry_model_close(f);
  free(p);
}

static void test_fixture_qwen2_mistral(void **state) {
  (void)state;
  char *p = fixture("qwen2");
  ferry_model *m = open_ok(p);
  const struct ferry_model_config *c = ferry_model_get_config(m);
  assert_int_equal(c->family, FERRY_FAMILY_QWEN2);
  assert_int_equal(c->tied_embeddings, 1);
  assert_int_equal(c->qkv_bias, 1);
  assert_int_equal(c->sliding_window, 0); /* use_sliding_window is false */
  assert_int_equal(c->head_dim, 64);
  assert_int_equal(acc_of(m).params_total, 494032768ull); /* Qwen2-0.5B as published */
  assert_int_equal(ferry_model_find_tensor(m, "lm_head.weight"), -1);
  assert_shape(m, "model.layers.23.self_attn.k_proj.bias", 128, 0);
  ferry_model_close(m);
  free(p);
  p = fixture("mistral");
  m = open_ok(p);
  c = ferry_model_get_config(m);
  assert_int_equal(c->family, FERRY_FAMILY_MISTRAL);
  assert_int_equal(c->sliding_window, 4096);
  assert_int_equal(c->n_kv_heads, 8);
  assert_near((double)acc_of(m).params_total, 7.24e9, 0.005);
  char *text = NULL;
  assert_int_equal(ferry_model_config_json(m, &text), FERRY_OK);
  assert_true(tu_contains(text, "\"sliding_window\":\t4096"));
  ferry_free(text);
  ferry_model_close(m);
  free(p);
}

static void write_config(const char *dir, const char *json) {
  char path[2048];
  snprintf(path, sizeof path, "%s/config.json", dir);
  tu_write_file(path, json, strlen(json));
}

static void test_hf_defaults(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("model-def");
  write_config(dir, "{\"model_type\": \"llama\", \"hidden_size\": 512, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 8, \"intermediate_size\": 1024, \"vocab_size\": 1000}");
  ferry_model *m = open_ok(dir);
  const struct ferry_model_config *c = ferry_model_get_config(m);
  assert_int_equal(c->n_kv_heads, 8);
  assert_int_equal(c->head_dim, 64);
  assert_true(c->rope_theta == 10000.0);
  assert_true(c->norm_eps == 1e-6);
  assert_int_equal(c->tied_embeddings, 0);
  assert_int_equal(c->max_position, 2048);
  assert_int_equal(c->dtype, FERRY_DTYPE_F32);
  const char *base = strrchr(dir, '/') + 1;
  assert_string_equal(c->name, base);
  ferry_model_close(m);

  write_config(dir, "{\"model_type\": \"mixtral\", \"hidden_size\": 512, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 16, \"intermediate_size\": 1024, \"vocab_size\": 1000, "
                    "\"torch_dtype\": \"bfloat16\"}");
  m = open_ok(dir);
  c = ferry_model_get_config(m);
  assert_int_equal(c->n_kv_heads, 8);
  assert_int_equal(c->n_experts, 8);
  assert_int_equal(c->experts_per_token, 2);
  assert_int_equal(c->expert_intermediate, 1024);
  assert_true(c->rope_theta == 1e6);
  assert_int_equal(c->dtype, FERRY_DTYPE_BF16);
  ferry_model_close(m);

  write_config(dir, "{\"model_type\": \"opt\", \"hidden_size\": 768, \"num_hidden_layers\": 12, "
                    "\"num_attention_heads\": 12, \"ffn_dim\": 3072, \"vocab_size\": 50272}");
  m = open_ok(dir);
  c = ferry_model_get_config(m);
  assert_int_equal(c->tied_embeddings, 1);
  assert_int_equal(c->max_position, 2048);
  assert_int_equal(c->act, FERRY_ACT_RELU);
  assert_int_equal(c->norm, FERRY_NORM_LAYER);
  assert_int_equal(c->head_dim, 64);
  assert_near((double)acc_of(m).params_total, 125.2e6, 0.005); /* OPT-125m */
  ferry_model_close(m);

  write_config(dir, "{\"model_type\": \"qwen2_moe\", \"hidden_size\": 256, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 4, \"intermediate_size\": 512, \"vocab_size\": 1000, "
                    "\"mlp_only_layers\": [], \"use_sliding_window\": true, \"max_window_layers\": 0}");
  m = open_ok(dir);
  c = ferry_model_get_config(m);
  assert_int_equal(c->n_experts, 60);
  assert_int_equal(c->experts_per_token, 4);
  assert_int_equal(c->expert_intermediate, 1408);
  assert_int_equal(c->shared_intermediate, 5632);
  assert_int_equal(c->shared_expert_gate, 1);
  assert_int_equal(c->sliding_window, 4096);
  ferry_model_close(m);

  write_config(dir, "{\"model_type\": \"olmoe\", \"hidden_size\": 256, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 1000, "
                    "\"dtype\": \"float16\", \"head_dim\": 32}");
  m = open_ok(dir);
  c = ferry_model_get_config(m);
  assert_int_equal(c->n_experts, 64);
  assert_int_equal(c->experts_per_token, 8);
  assert_int_equal(c->qk_norm, 1);
  assert_int_equal(c->head_dim, 32);
  assert_int_equal(c->dtype, FERRY_DTYPE_F16);
  assert_shape(m, "model.layers.1.self_attn.q_proj.weight", 128, 256);
  ferry_model_close(m);
  tu_rmtree(dir);
  free(dir);
}

static void test_bad_configs(void **state) {
  (void)state;
  const struct {
    const char *dir;
    ferry_status status;
    const char *words[2];
  } cases[] = {
      {"unknown-model-type", FERRY_ERR_UNSUPPORTED, {"gpt2", "model_type"}},
      {"missing-model-type", FERRY_ERR_FORMAT, {"model_type", "missing"}},
      {"hidden-size-string", FERRY_ERR_FORMAT, {"hidden_size", "integer"}},
      {"layers-fraction", FERRY_ERR_FORMAT, {"num_hidden_layers", "integer"}},
      {"layers-negative", FERRY_ERR_FORMAT, {"num_hidden_layers", "-1"}},
      {"kv-heads-not-divisor", FERRY_ERR_FORMAT, {"num_key_value_heads", "divide"}},
      {"tie-string", FERRY_ERR_FORMAT, {"tie_word_embeddings", "true or false"}},
      {"rope-theta-string", FERRY_ERR_FORMAT, {"rope_theta", "number"}},
      {"unknown-dtype", FERRY_ERR_FORMAT, {"torch_dtype", "float8"}},
      {"topk-over-experts", FERRY_ERR_FORMAT, {"num_experts_per_tok", "1..8"}},
      {"qwen2-moe-mlp-only-layers", FERRY_ERR_UNSUPPORTED, {"mlp_only_layers", "first layers"}},
      {"qwen3-window-layers", FERRY_ERR_UNSUPPORTED, {"max_window_layers", "= 4"}},
      {"gemma2-irregular-layers", FERRY_ERR_UNSUPPORTED, {"layer_types[2]", "sliding_attention"}},
      {"llama4-irregular-nope", FERRY_ERR_UNSUPPORTED, {"no_rope_layers", "irregular"}},
      {"rope-unknown-key", FERRY_ERR_UNSUPPORTED, {"rope_scaling.mrope_section", "not understood"}},
      {"rope-unknown-type", FERRY_ERR_UNSUPPORTED, {"rope_parameters", "mrope"}},
      {"quant-bitsandbytes", FERRY_ERR_UNSUPPORTED, {"quant_method", "bitsandbytes"}},
      {"awq-gemv", FERRY_ERR_UNSUPPORTED, {"AWQ", "gemm"}},
      {"softcap-in-llama", FERRY_ERR_UNSUPPORTED, {"final_logit_softcapping", "llama"}},
      {"deepseek-moe-freq", FERRY_ERR_UNSUPPORTED, {"moe_layer_freq", "only 1"}},
      {"mlp-only-layers-object", FERRY_ERR_FORMAT, {"mlp_only_layers", "array"}},
      {"opt-post-norm", FERRY_ERR_UNSUPPORTED, {"do_layer_norm_before", "post-norm"}},
      {"gptj-rotary-odd", FERRY_ERR_FORMAT, {"rotary_dim", "even"}},
      {"gptj-tied", FERRY_ERR_UNSUPPORTED, {"tie_word_embeddings", "bias"}},
      {"rotary-dim-in-llama", FERRY_ERR_UNSUPPORTED, {"rotary_dim", "llama"}},
      {"top-level-array", FERRY_ERR_FORMAT, {"JSON object", "top level"}},
      {"truncated", FERRY_ERR_FORMAT, {"invalid JSON", "byte"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char rel[256];
    snprintf(rel, sizeof rel, "configs/bad/%s", cases[i].dir);
    char *p = tu_data_path(rel);
    ferry_model *m = (ferry_model *)0x1;
    ferry_status st = ferry_model_open(&m, p);
    const char *msg = ferry_last_error();
    if (st != cases[i].status || !strstr(msg, "config.json") || !strstr(msg, cases[i].words[0]) ||
        !strstr(msg, cases[i].words[1]))
      fail_msg("%s: got %s \"%s\"", cases[i].dir, ferry_status_name(st), msg);
    assert_null(m);
    free(p);
  }
}

/* ---- the families of 2024-26 --------------------------------------------------------------- */

/* Whether x matches a published figure given to `digits` decimals: within 1 %, or equal once
 * cut or rounded to those digits (publishers print "3.3 B" for 3.35 B). */
static int matches_published(double x, double pub, int digits, int *needed_digits) {
  *needed_digits = 0;
  if (fabs(x - pub) <= 0.01 * pub) return 1;
  const double scale = pow(10.0, digits);
  *needed_digits = 1;
  return floor(x * scale + 1e-9) / scale == pub || round(x * scale) / scale == pub;
}

/* The table: every total/active figure within 1 % of what the publisher states. Active
 * figures follow each publisher's convention: DeepSeek and OpenAI leave the input embedding out
 * (a lookup, not a product), the others count it. */
static void test_published_totals(void **state) {
  (void)state;
  const struct {
    const char *preset, *fixture;
    double total, active; /* billions; active 0 for dense models */
    int digits_total, digits_active, no_embed;
  } table[] = {
      {"qwen3-8b", "qwen3", 8.2, 0, 1, 0, 0},
      {"qwen3-30b-a3b", "qwen3_moe", 30.5, 3.3, 1, 1, 0},
      {"qwen3-235b-a22b", "qwen3_moe_235b", 235, 22, 0, 0, 0},
      {"deepseek-v2-lite", "deepseek_v2", 15.7, 2.4, 1, 1, 1},
      {"deepseek-v3", "deepseek_v3", 671, 37, 0, 0, 1},
      {"gpt-oss-20b", "gpt_oss_20b", 21, 3.6, 0, 1, 1},
      {"gpt-oss-120b", "gpt_oss", 117, 5.1, 0, 1, 1},
      {"llama-4-scout-17b-16e", "llama4", 109, 17, 0, 0, 0},
      {"phi-3.5-moe", "phimoe", 41.9, 6.6, 1, 1, 0},
      {"gemma-2-9b", "gemma2", 9.24, 0, 2, 0, 0},
      {"gemma-3-27b", "gemma3", 27.4, 0, 1, 0, 0},
      {"gpt-neox-20b", "gpt_neox", 20.6, 0, 1, 0, 0},
      {"bloom-176b", "bloom", 176, 0, 0, 0, 0},
      {"gpt-j-6b", "gptj", 6.05, 0, 2, 0, 0}, /* EleutherAI: 6,053,381,344 parameters */
  };
  /* published figures cut to their digits that the 1 % bound alone would miss: listed so that
   * any change in the accounting shows up here */
  const char *cut[] = {"qwen3-30b-a3b active", "deepseek-v2-lite active", "deepseek-v3 active",
                       "llama-4-scout-17b-16e active"};
  int n_cut = 0;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    for (int src = 0; src < 2; src++) {
      char *p = src ? fixture(table[i].fixture) : NULL;
      ferry_model *m = open_ok(src ? p : table[i].preset);
      struct ferry_model_accounting a = acc_of(m);
      int needed;
      double total = (double)a.params_total / 1e9;
      if (!matches_published(total, table[i].total, table[i].digits_total, &needed) || needed)
        fail_msg("%s: total %.4f B, published %g B", table[i].preset, total, table[i].total);
      double active = (double)(table[i].no_embed ? a.params_active_no_embed : a.params_active) / 1e9;
      if (table[i].active > 0) {
        if (!matches_published(active, table[i].active, table[i].digits_active, &needed))
          fail_msg("%s: active %.4f B, published %g B", table[i].preset, active, table[i].active);
        if (needed && !src) {
          char what[64];
          snprintf(what, sizeof what, "%s active", table[i].preset);
          int listed = 0;
          for (size_t k = 0; k < sizeof cut / sizeof cut[0]; k++) listed |= !strcmp(cut[k], what);
          if (!listed) fail_msg("%s: %.4f B outside 1 %% of %g B", what, active, table[i].active);
          n_cut++;
        }
      } else {
        assert_int_equal(a.params_active, a.params_total - a.params_extra);
      }
      check_layout(m);
      ferry_model_close(m);
      free(p);
    }
  }
  assert_int_equal(n_cut, 4);
}

static void test_new_family_layouts(void **state) {
  (void)state;
  ferry_model *m = open_ok("qwen3-30b-a3b");
  assert_shape(m, "model.layers.0.self_attn.q_norm.weight", 128, 0);
  assert_shape(m, "model.layers.47.mlp.experts.127.down_proj.weight", 2048, 768);
  assert_shape(m, "model.layers.47.mlp.gate.weight", 128, 2048);
  assert_int_equal(ferry_model_find_tensor(m, "model.layers.0.mlp.shared_expert.up_proj.weight"), -1);
  ferry_model_close(m);

  m = open_ok("deepseek-v3");
  struct ferry_model_accounting a = acc_of(m);
  assert_shape(m, "model.layers.0.mlp.gate_proj.weight", 18432, 7168); /* first_k_dense_replace = 3 */
  assert_shape(m, "model.layers.2.mlp.down_proj.weight", 7168, 18432);
  assert_int_equal(ferry_model_find_tensor(m, "model.layers.2.mlp.gate.weight"), -1);
  assert_shape(m, "model.layers.3.mlp.gate.weight", 256, 7168);
  assert_shape(m, "model.layers.3.mlp.gate.e_score_correction_bias", 256, 0);
  assert_shape(m, "model.layers.3.mlp.shared_experts.gate_proj.weight", 2048, 7168);
  assert_shape(m, "model.layers.60.mlp.experts.255.up_proj.weight", 2048, 7168);
  assert_shape(m, "model.layers.0.self_attn.q_a_proj.weight", 1536, 7168);
  assert_shape(m, "model.layers.0.self_attn.q_b_proj.weight", 128 * 192, 1536);
  assert_shape(m, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 576, 7168);
  assert_shape(m, "model.layers.0.self_attn.kv_b_proj.weight", 128 * 256, 512);
  assert_shape(m, "model.layers.0.self_attn.o_proj.weight", 7168, 128 * 128);
  /* the latent cache: kv_lora_rank + qk_rope_dim per token and layer, not K and V of 128 heads */
  assert_int_equal(a.kv_bytes_per_token, 61u * 576u * 2u);
  assert_int_equal(ferry_model_kv_bytes(m, 1000, FERRY_KV_FP16), 61u * 576u * 2u * 1000u);
  assert_int_equal(a.n_moe_layers, 58);
  /* fp8 as published: one byte a weight plus a fp32 scale per 128 x 128 block */
  const struct ferry_tensor_desc *t = tensor_named(m, "model.layers.3.mlp.experts.0.gate_proj.weight");
  assert_true(t->quantized);
  assert_int_equal(t->bytes, 2048u * 7168u + 16u * 56u * 4u);
  assert_false(tensor_named(m, "model.layers.3.mlp.gate.weight")->quantized);
  assert_int_equal(tensor_named(m, "lm_head.weight")->bytes, 129280u * 7168u * 2u);
  ferry_model_close(m);

  m = open_ok("gpt-oss-120b");
  a = acc_of(m);
  /* the fused MXFP4 experts: each expert a slice of [128, 5760, 2880] packed 2 values a byte */
  int64_t i = ferry_model_find_tensor(m, "model.layers.0.mlp.experts.gate_up_proj");
  assert_true(i >= 0);
  size_t f, n;
  assert_int_equal(ferry_model_expert_span(m, 0, 5, &f, &n), FERRY_OK);
  assert_int_equal(n, 4);
  t = ferry_model_tensor(m, f);
  assert_string_equal(t->name, "model.layers.0.mlp.experts.gate_up_proj");
  assert_int_equal(t->slice, 5);
  assert_int_equal(t->shape[0], 5760);
  assert_int_equal(t->shape[1], 2880);
  assert_int_equal(t->bytes, 5760u * 2880u / 2u + 5760u * 90u);
  assert_int_equal(ferry_model_tensor(m, f + 1)->role, FERRY_ROLE_EXPERT_GATE_UP_BIAS);
  assert_int_equal(ferry_model_tensor(m, f + 3)->role, FERRY_ROLE_EXPERT_DOWN_BIAS);
  assert_shape(m, "model.layers.0.self_attn.sinks", 64, 0);
  assert_shape(m, "model.layers.0.mlp.router.bias", 128, 0);
  assert_near((double)a.bytes_total / (1u << 30), 60.8, 0.005); /* the 60.8 GiB OpenAI gives */
  struct ferry_layer_info li;
  assert_int_equal(ferry_model_layer_info(m, 0, &li), FERRY_OK);
  assert_int_equal(li.window, 128);
  assert_int_equal(ferry_model_layer_info(m, 1, &li), FERRY_OK);
  assert_int_equal(li.window, 0);
  /* half the layers keep at most 128 tokens */
  assert_int_equal(ferry_model_kv_bytes(m, 4096, FERRY_KV_BF16), 18u * 2u * 8u * 64u * 2u * (4096u + 128u));
  ferry_model_close(m);

  m = open_ok("llama-4-scout-17b-16e");
  assert_shape(m, "language_model.model.layers.0.feed_forward.router.weight", 16, 5120);
  assert_shape(m, "language_model.model.layers.0.feed_forward.shared_expert.down_proj.weight", 5120, 8192);
  t = tensor_named(m, "language_model.model.layers.0.feed_forward.experts.gate_up_proj");
  assert_int_equal(t->shape[0], 5120);
  assert_int_equal(t->shape[1], 16384);
  assert_true(t->transposed);
  assert_shape(m, "language_model.lm_head.weight", 202048, 5120);
  assert_int_equal(ferry_model_layer_info(m, 3, &li), FERRY_OK);
  assert_int_equal(li.rope, 0); /* every fourth layer has no RoPE and attends globally */
  assert_int_equal(li.chunk, 0);
  assert_int_equal(ferry_model_layer_info(m, 2, &li), FERRY_OK);
  assert_int_equal(li.chunk, 8192);
  struct ferry_rope_params rp;
  assert_int_equal(ferry_model_layer_rope(m, 3, &rp), FERRY_ERR_NOT_FOUND);
  assert_int_equal(acc_of(m).params_extra, 871932416ull); /* the vision tower as Meta's module list gives */
  ferry_model_close(m);
}

/* The LayerNorm and fused-qkv families and Gemma 3: their tensors by name, RoPE per layer. */
static void test_classic_family_layouts(void **state) {
  (void)state;
  struct ferry_rope_params rp;
  ferry_model *m = open_ok("gemma-3-27b");
  assert_shape(m, "language_model.model.layers.5.pre_feedforward_layernorm.weight", 5376, 0);
  assert_shape(m, "language_model.model.layers.5.self_attn.q_norm.weight", 128, 0);
  assert_int_equal(ferry_model_find_tensor(m, "language_model.lm_head.weight"), -1); /* tied */
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_OK);
  assert_true(rp.theta == 10000.0 && rp.scaling.type == FERRY_ROPE_DEFAULT); /* local layers */
  assert_int_equal(ferry_model_layer_rope(m, 5, &rp), FERRY_OK);
  assert_true(rp.theta == 1e6 && rp.scaling.type == FERRY_ROPE_LINEAR && rp.scaling.factor == 8);
  assert_near(ferry_model_attn_scale(m), 1.0 / sqrt(168.0), 1e-12);
  ferry_model_close(m);

  m = open_ok("gpt-neox-20b");
  assert_shape(m, "gpt_neox.layers.43.attention.query_key_value.weight", 3 * 6144, 6144);
  assert_shape(m, "gpt_neox.layers.43.attention.query_key_value.bias", 3 * 6144, 0);
  assert_shape(m, "gpt_neox.layers.0.mlp.dense_4h_to_h.weight", 6144, 24576);
  assert_shape(m, "embed_out.weight", 50432, 6144);
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_OK);
  assert_int_equal(rp.dim, 24);
  ferry_model_close(m);

  /* GPT-J: one ln_1 per layer (no second norm), no attention biases, interleaved partial RoPE,
   * an FFN and a head with biases */
  m = open_ok("gpt-j-6b");
  assert_shape(m, "transformer.h.27.attn.q_proj.weight", 4096, 4096);
  assert_int_equal(ferry_model_find_tensor(m, "transformer.h.0.attn.q_proj.bias"), -1);
  assert_int_equal(ferry_model_find_tensor(m, "transformer.h.0.ln_2.weight"), -1);
  assert_shape(m, "transformer.h.0.ln_1.bias", 4096, 0);
  assert_shape(m, "transformer.h.0.mlp.fc_in.weight", 16384, 4096);
  assert_shape(m, "transformer.h.0.mlp.fc_out.bias", 4096, 0);
  assert_shape(m, "lm_head.bias", 50400, 0);
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_OK);
  assert_true(rp.dim == 64 && rp.interleaved);
  assert_true(ferry_model_get_config(m)->parallel_residual && ferry_model_get_config(m)->parallel_shared_norm);
  ferry_model_close(m);

  m = open_ok("bloom-176b");
  assert_shape(m, "word_embeddings_layernorm.bias", 14336, 0);
  assert_shape(m, "h.69.self_attention.query_key_value.weight", 3 * 14336, 14336);
  assert_shape(m, "ln_f.weight", 14336, 0);
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_ERR_NOT_FOUND);
  ferry_model_close(m);

  m = open_ok("phi-3.5-moe");
  assert_shape(m, "model.layers.0.input_layernorm.bias", 4096, 0);
  assert_shape(m, "model.layers.0.block_sparse_moe.experts.15.w2.weight", 4096, 6400);
  assert_shape(m, "lm_head.bias", 32064, 0);
  assert_shape(m, "model.norm.bias", 4096, 0);
  ferry_model_close(m);
}

/* Catalogue names and Hugging Face ids in any case; an existing folder wins over a preset. */
static void test_resolve(void **state) {
  (void)state;
  const char *names[][2] = {{"Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"},   {"qwen/qwen3-30b-a3b", "qwen3-30b-a3b"},
                            {"QWEN3-30B-A3B", "qwen3-30b-a3b"},        {"openai/gpt-oss-120b", "gpt-oss-120b"},
                            {"deepseek-ai/DeepSeek-V3", "deepseek-v3"}, {"Phi-3.5-MoE-instruct", "phi-3.5-moe"},
                            {"meta-llama/Llama-2-7b-hf", "llama-2-7b"}, {"Mixtral-8x7B-v0.1", "mixtral-8x7b"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *r = ferry_model_preset_resolve(names[i][0]);
    if (!r || strcmp(r, names[i][1])) fail_msg("%s resolved to %s", names[i][0], r ? r : "nothing");
    ferry_model *m = open_ok(names[i][0]);
    assert_string_equal(ferry_model_get_config(m)->name, names[i][1]);
    ferry_model_close(m);
  }
  assert_null(ferry_model_preset_resolve("Qwen/Qwen3-31B"));
  assert_null(ferry_model_preset_resolve(""));
  size_t with_id = 0;
  for (size_t i = 0; i < ferry_model_preset_count(); i++) with_id += *ferry_model_preset_hf_id(i) != 0;
  assert_int_equal(with_id, 22);
  assert_null(ferry_model_preset_hf_id(ferry_model_preset_count()));
  /* a folder called like a preset (but not exactly its catalogue name) is read as a folder */
  char *dir = tu_mkdtemp("model-res");
  char sub[1024];
  snprintf(sub, sizeof sub, "%.1000s/Qwen3-8B", dir);
  assert_int_equal(mkdir(sub, 0755), 0);
  write_config(sub, "{\"model_type\": \"qwen3\", \"hidden_size\": 256, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 4, \"intermediate_size\": 512, \"vocab_size\": 1000}");
  ferry_model *m = open_ok(sub);
  assert_int_equal(ferry_model_get_config(m)->hidden, 256);
  ferry_model_close(m);
  tu_rmtree(dir);
  free(dir);
}

/* RoPE: transformers v5 rope_parameters (rope_theta inside it), and the frequencies of each
 * scaling type against their formulas evaluated here independently. */
static void test_rope(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("model-rope");
  write_config(dir, "{\"model_type\": \"llama\", \"hidden_size\": 512, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 8, \"intermediate_size\": 1024, \"vocab_size\": 1000, "
                    "\"max_position_embeddings\": 131072, \"rope_parameters\": {\"rope_type\": \"llama3\", "
                    "\"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                    "\"original_max_position_embeddings\": 8192}}");
  ferry_model *m = open_ok(dir);
  const struct ferry_model_config *c = ferry_model_get_config(m);
  assert_true(c->rope_theta == 500000.0); /* not the 10000 default */
  assert_int_equal(c->rope_scaling.type, FERRY_ROPE_LLAMA3);
  struct ferry_rope_params rp;
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_OK);
  double inv[128], af;
  ferry_rope_inv_freq(&rp, 10, inv, &af);
  assert_true(af == 1.0);
  for (int i = 0; i < 32; i++) {
    double base = 1.0 / pow(500000.0, 2.0 * i / 64), wl = 2 * M_PI / base, want;
    if (wl < 8192.0 / 4) want = base;                 /* high frequency: kept */
    else if (wl > 8192.0) want = base / 8;            /* low frequency: interpolated */
    else {
      double sm = (8192.0 / wl - 1) / (4 - 1);
      want = (1 - sm) * base / 8 + sm * base;
    }
    assert_near(inv[i], want, 1e-12);
  }
  ferry_model_close(m);

  write_config(dir, "{\"model_type\": \"qwen3\", \"hidden_size\": 512, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 4, \"intermediate_size\": 1024, \"vocab_size\": 1000, "
                    "\"max_position_embeddings\": 131072, \"rope_theta\": 1000000, "
                    "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}}");
  m = open_ok(dir);
  assert_int_equal(ferry_model_layer_rope(m, 1, &rp), FERRY_OK);
  ferry_rope_inv_freq(&rp, 10, inv, &af);
  assert_near(af, 0.1 * log(4.0) + 1.0, 1e-12);
  /* yarn: the fastest frequencies extrapolate (unchanged), the slowest interpolate (/ factor) */
  assert_near(inv[0], 1.0, 1e-12);
  assert_near(inv[63], 1.0 / pow(1e6, 126.0 / 128) / 4, 1e-9);
  ferry_model_close(m);

  write_config(dir, "{\"model_type\": \"llama\", \"hidden_size\": 512, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 8, \"intermediate_size\": 1024, \"vocab_size\": 1000, "
                    "\"max_position_embeddings\": 2048, \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}");
  m = open_ok(dir);
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_OK);
  ferry_rope_inv_freq(&rp, 1000, inv, &af);
  assert_near(inv[1], 1.0 / pow(10000.0, 2.0 / 64), 1e-12); /* inside the context: plain */
  ferry_rope_inv_freq(&rp, 4096, inv, &af);
  double base = 10000.0 * pow(2.0 * 4096 / 2048 - 1, 64.0 / 62);
  assert_near(inv[1], 1.0 / pow(base, 2.0 / 64), 1e-12);
  ferry_model_close(m);

  write_config(dir, "{\"model_type\": \"mistral\", \"hidden_size\": 512, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 8, \"intermediate_size\": 1024, \"vocab_size\": 1000, "
                    "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4.0}}");
  m = open_ok(dir);
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_OK);
  ferry_rope_inv_freq(&rp, 1, inv, &af);
  assert_near(inv[3], 1.0 / pow(10000.0, 6.0 / 64) / 4, 1e-12);
  char *text = NULL;
  assert_int_equal(ferry_model_config_json(m, &text), FERRY_OK);
  assert_true(tu_contains(text, "\"linear\""));
  ferry_free(text);
  ferry_model_close(m);

  /* LongRoPE (Phi-3.5-MoE): short factors and mscale up to the original context, long beyond */
  m = open_ok("phi-3.5-moe");
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_OK);
  ferry_rope_inv_freq(&rp, 100, inv, &af);
  assert_near(af, 1.243163121016122, 1e-12);
  assert_near(inv[1], 1.0 / pow(10000.0, 2.0 / 128) / 1.0399999618530273, 1e-7);
  ferry_rope_inv_freq(&rp, 5000, inv, &af);
  assert_near(inv[1], 1.0 / pow(10000.0, 2.0 / 128) / 1.0299999713897705, 1e-7);
  ferry_model_close(m);

  /* DeepSeek: yarn's mscale over all dims raises the softmax scale */
  m = open_ok("deepseek-v3");
  double ms = 0.1 * log(40.0) + 1.0;
  assert_near(ferry_model_attn_scale(m), ms * ms / sqrt(192.0), 1e-12);
  assert_int_equal(ferry_model_layer_rope(m, 0, &rp), FERRY_OK);
  assert_int_equal(rp.dim, 64);
  assert_int_equal(rp.interleaved, 1);
  ferry_model_close(m);
  tu_rmtree(dir);
  free(dir);
}

static void test_quant_configs(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("model-quant");
  const char *base = "\"model_type\": \"qwen3\", \"hidden_size\": 512, \"num_hidden_layers\": 2, "
                     "\"num_attention_heads\": 4, \"intermediate_size\": 1024, \"vocab_size\": 1000, "
                     "\"torch_dtype\": \"float16\"";
  const struct {
    const char *q;
    enum ferry_ckpt_quant kind;
    uint64_t gate_bytes; /* of mlp.gate_proj [1024, 512] */
  } cases[] = {
      {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"desc_act\": false, \"sym\": true}",
       FERRY_CKPT_GPTQ, 1024u * 512u / 2u + 4u * 1024u / 8u * 4u + 4u * 1024u * 2u + 512u * 4u},
      {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": true, \"version\": \"gemm\"}",
       FERRY_CKPT_AWQ, 1024u * 512u / 2u + 4u * 1024u / 8u * 4u + 4u * 1024u * 2u},
      {"{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"config_groups\": {\"group_0\": "
       "{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, "
       "\"group_size\": 128, \"strategy\": \"group\"}}}}",
       FERRY_CKPT_COMPRESSED, 1024u * 512u / 2u + 1024u * 4u * 2u + 16u},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char json[2048];
    snprintf(json, sizeof json, "{%s, \"quantization_config\": %s}", base, cases[i].q);
    write_config(dir, json);
    ferry_model *m = open_ok(dir);
    assert_int_equal(ferry_model_get_config(m)->quant.kind, cases[i].kind);
    const struct ferry_tensor_desc *t = tensor_named(m, "model.layers.0.mlp.gate_proj.weight");
    assert_true(t->quantized);
    assert_int_equal(t->bytes, cases[i].gate_bytes);
    assert_false(tensor_named(m, "model.embed_tokens.weight")->quantized);
    char *text = NULL; /* and back: the written config reads the same */
    assert_int_equal(ferry_model_config_json(m, &text), FERRY_OK);
    ferry_free(text);
    ferry_model_close(m);
  }
  tu_rmtree(dir);
  free(dir);
}

/* FLOPs: attention over the tokens each layer sees (windows, chunks), MLA in latent space. */
static void test_flops_windows(void **state) {
  (void)state;
  ferry_model *m = open_ok("gpt-oss-120b");
  const double mm = ferry_model_matmul_params_active(m), per = 4.0 * 64 * 64;
  /* 18 windowed layers see at most 127 earlier tokens, 18 global layers all of them */
  assert_near(ferry_model_flops_per_token(m, 1000), 2 * mm + per * (18.0 * 127 + 18.0 * 1000), 1e-12);
  double sum = 0;
  for (int64_t i = 0; i < 300; i++) sum += ferry_model_flops_per_token(m, i);
  assert_near(ferry_model_flops_prefill(m, 300), sum, 1e-12);
  ferry_model_close(m);
  m = open_ok("llama-4-scout-17b-16e");
  sum = 0;
  for (int64_t i = 0; i < 9000; i++) sum += ferry_model_flops_per_token(m, i);
  assert_near(ferry_model_flops_prefill(m, 9000), sum, 1e-12);
  ferry_model_close(m);
  m = open_ok("deepseek-v2-lite");
  const double latent = 2.0 * 16 * (2 * 512 + 64);
  assert_near(ferry_model_flops_per_token(m, 100) - ferry_model_flops_per_token(m, 0), 27 * 100 * latent, 1e-12);
  ferry_model_close(m);
}

static void test_open_errors(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "no-such-model"), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "no-such-model"));
  assert_null(m);
  char *dir = tu_mkdtemp("model-empty");
  assert_int_equal(ferry_model_open(&m, dir), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "config.json"));
  tu_rmtree(dir);
  free(dir);
  assert_int_equal(ferry_model_open(NULL, "tiny-moe"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_model_open(&m, NULL), FERRY_ERR_INVALID);
  enum ferry_family f;
  assert_int_equal(ferry_family_parse("qwen2_moe", &f), FERRY_OK);
  assert_int_equal(f, FERRY_FAMILY_QWEN2_MOE);
  assert_string_equal(ferry_family_name(FERRY_FAMILY_OPT), "opt");
  assert_int_equal(ferry_family_parse("gpt2", &f), FERRY_ERR_UNSUPPORTED);
}

static void test_create_invalid(void **state) {
  (void)state;
  ferry_model *base = open_ok("tiny-moe");
  struct ferry_model_config c = *ferry_model_get_config(base);
  ferry_model_close(base);
  ferry_model *m = NULL;
  struct ferry_model_config bad = c;
  bad.n_kv_heads = 3;
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "n_kv_heads"));
  bad = c;
  bad.experts_per_token = 9;
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  bad = c;
  bad.family = FERRY_FAMILY_LLAMA; /* dense family with experts */
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  bad = c;
  bad.norm = FERRY_NORM_LAYER;
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  bad = c;
  bad.intermediate = 192; /* Mixtral has no dense FFN size */
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "expert_intermediate"));
  bad = c;
  bad.n_layers = 0;
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  bad = c;
  bad.hidden = (int64_t)1 << 40;
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  bad = c;
  memset(bad.name, 'x', sizeof bad.name);
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  bad = c;
  bad.n_experts = 4096;
  bad.n_layers = 4096; /* tens of millions of tensors */
  assert_int_equal(ferry_model_create(&m, &bad), FERRY_ERR_INVALID);
  assert_null(m);
  assert_int_equal(ferry_model_create(&m, NULL), FERRY_ERR_INVALID);
  /* a custom shape is fine */
  c.n_layers = 3;
  snprintf(c.name, sizeof c.name, "custom");
  assert_int_equal(ferry_model_create(&m, &c), FERRY_OK);
  assert_int_equal(acc_of(m).params_total, acc_of(m).params_embed + acc_of(m).params_head + 3 * acc_of(m).params_layer);
  ferry_model_close(m);
}

static void test_config_json_unexpressible(void **state) {
  (void)state;
  ferry_model *base = open_ok("tiny-qwen2-moe");
  struct ferry_model_config c = *ferry_model_get_config(base);
  ferry_model_close(base);
  c.qkv_bias = 0; /* Qwen2 attention always has biases */
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_create(&m, &c), FERRY_OK);
  char *text = (char *)0x1;
  assert_int_equal(ferry_model_config_json(m, &text), FERRY_ERR_UNSUPPORTED);
  assert_null(text);
  assert_true(tu_contains(ferry_last_error(), "qkv_bias"));
  ferry_model_close(m);
}

/* Every allocation in open / config_json can fail: the result is NOMEM or OK, never a crash
 * or leak (ASan checks the leaks). */
static void test_alloc_failures(void **state) {
  (void)state;
  char *p = fixture("qwen2_moe");
  const char *targets[] = {"tiny-qwen2-moe", p};
  for (size_t k = 0; k < 2; k++) {
    int ok_seen = 0;
    for (int64_t n = 0; n < 400 && !ok_seen; n++) {
      ferry_alloc_fail_after(n);
      ferry_model *m = NULL;
      ferry_status st = ferry_model_open(&m, targets[k]);
      if (st == FERRY_OK) {
        char *text = NULL;
        ferry_status st2 = ferry_model_config_json(m, &text);
        assert_true(st2 == FERRY_OK || st2 == FERRY_ERR_NOMEM);
        ferry_free(text);
        ferry_model_close(m);
        ok_seen = st2 == FERRY_OK;
      } else {
        if (st != FERRY_ERR_NOMEM && st != FERRY_ERR_FORMAT) fail_msg("n=%lld: %s", (long long)n, ferry_status_name(st));
        assert_null(m);
      }
    }
    ferry_alloc_fail_after(-1);
    assert_true(ok_seen);
  }
  free(p);
}

/* ---- CLI ------------------------------------------------------------------------------------- */

static void test_cli(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferry("model show mixtral-8x7b", &out), 0);
  assert_true(tu_contains(out, "46.70 B"));
  assert_true(tu_contains(out, "12.88 B"));
  assert_true(tu_contains(out, "expert_intermediate"));
  assert_true(tu_contains(out, "2048 tokens"));
  assert_true(tu_contains(out, "share of parameters in transformer layers"));
  free(out);

  assert_int_equal(tu_run_ferry("model show llama-2-7b --json", &out), 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  const char *keys[] = {"params_total", "params_active", "params_layer", "params_expert", "bytes_total",
                        "kv_bytes_per_token", "kv_bytes_2048", "flops_per_token_ctx0"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, keys[i])));
  assert_true(cJSON_GetObjectItem(j, "params_total")->valuedouble == 6738415616.0);
  assert_true(cJSON_GetObjectItem(j, "kv_bytes_2048")->valuedouble == 1073741824.0);
  cJSON *cfg = cJSON_GetObjectItem(j, "config");
  assert_true(cJSON_IsObject(cfg));
  assert_true(cJSON_GetObjectItem(cfg, "n_layers")->valuedouble == 32);
  assert_string_equal(cJSON_GetObjectItem(cfg, "family")->valuestring, "llama");
  cJSON_Delete(j);
  free(out);

  char *p = fixture("olmoe");
  char args[1200];
  snprintf(args, sizeof args, "model show '%s'", p);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "olmoe"));
  free(out);
  free(p);

  assert_int_equal(tu_run_ferry("model list", &out), 0);
  for (size_t i = 0; i < ferry_model_preset_count(); i++) assert_true(tu_contains(out, ferry_model_preset_name(i)));
  free(out);

  assert_int_equal(tu_run_ferry("model --help", &out), 0);
  assert_true(tu_contains(out, "show") && tu_contains(out, "list"));
  free(out);

  assert_int_equal(tu_run_ferry("model show no-such-model", &out), 1);
  assert_true(!strncmp(out, "ferry: ", 7) && tu_contains(out, "no-such-model"));
  assert_int_equal(strchr(out, '\n') - out + 1, (long)strlen(out)); /* one line */
  free(out);

  p = tu_data_path("configs/bad/unknown-model-type");
  snprintf(args, sizeof args, "model show '%s'", p);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "gpt2"));
  free(out);
  free(p);

  assert_int_equal(tu_run_ferry("model frobnicate", &out), 2);
  free(out);
  assert_int_equal(tu_run_ferry("model show", &out), 2);
  free(out);
  assert_int_equal(tu_run_ferry("model show tiny-moe --bogus", &out), 2);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_presets_layout),
      cmocka_unit_test(test_llama2_7b),
      cmocka_unit_test(test_mixtral),
      cmocka_unit_test(test_other_moe_published),
      cmocka_unit_test(test_opt),
      cmocka_unit_test(test_tiny_presets),
      cmocka_unit_test(test_flops),
      cmocka_unit_test(test_roundtrip_presets),
      cmocka_unit_test(test_fixtures_match_presets),
      cmocka_unit_test(test_fixture_qwen2_mistral),
      cmocka_unit_test(test_hf_defaults),
      cmocka_unit_test(test_bad_configs),
      cmocka_unit_test(test_published_totals),
      cmocka_unit_test(test_new_family_layouts),
      cmocka_unit_test(test_classic_family_layouts),
      cmocka_unit_test(test_resolve),
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_quant_configs),
      cmocka_unit_test(test_flops_windows),
      cmocka_unit_test(test_open_errors),
      cmocka_unit_test(test_create_invalid),
      cmocka_unit_test(test_config_json_unexpressible),
      cmocka_unit_test(test_alloc_failures),
      cmocka_unit_test(test_cli),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
