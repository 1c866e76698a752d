/* The 2024-26 families on the `sim` executor: the engine prices what each family really holds
 * and does. MLA keeps one compressed latent row per token and layer, windowed layers keep a
 * ring of what they can see, dense-first layers and MoE steps run experts only where the
 * checkpoint has them, shared experts run beside the routed ones, and a checkpoint quantized as
 * published sits in memory at its packed size. Small shapes of the real presets, so the runs
 * take milliseconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/routing.h"
#include "ferry/sim.h"
#include "testutil.h"

static char *tmp;

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("model_sim");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

static ferry_hw *profile(void) {
  char path[512], text[2048];
  snprintf(path, sizeof path, "%s/p.json", tmp);
  snprintf(text, sizeof text,
           "{\"name\": \"p\", \"kind\": \"gpu\","
           " \"gpu\": {\"name\": \"G\", \"memory_bytes\": 1073741824, \"mem_bw_gbps\": 100,"
           " \"peak_tflops\": {\"fp32\": 1, \"fp16\": 10}, \"launch_overhead_ns\": 100},"
           " \"link\": {\"name\": \"L\", \"h2d_gbps\": 1, \"d2h_gbps\": 1, \"latency_ns\": 0, \"copy_engines\": 1},"
           " \"host\": {\"name\": \"H\", \"dram_gbps\": 10, \"cpu_gflops\": 1, \"memory_bytes\": 1073741824},"
           " \"disk\": {\"name\": \"D\", \"read_gbps\": 2, \"latency_ns\": 10000, \"queue_depth\": 4}}");
  tu_write_file(path, text, strlen(text));
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  return hw;
}

/* Kernel activities of a run: kind, name, layer, expert, flops. */
struct op {
  char kind[24], name[24];
  int32_t layer, expert;
  double flops;
};
struct log {
  struct op *a;
  size_t n, cap;
};

static void sink(void *user, const struct ferry_activity *act) {
  struct log *l = user;
  if (act->kind != FERRY_ACT_KERNEL) return;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 4096;
    l->a = realloc(l->a, l->cap * sizeof *l->a);
    assert_non_null(l->a);
  }
  struct op *o = &l->a[l->n++];
  snprintf(o->kind, sizeof o->kind, "%s", act->kind_name ? act->kind_name : "");
  snprintf(o->name, sizeof o->name, "%s", act->name ? act->name : "");
  o->layer = act->layer;
  o->expert = act->expert;
  o->flops = act->flops;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 40, .output_tokens = 12},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 9, .output_tokens = 20},
    {.id = 2, .arrival_ns = 3000000, .prompt_tokens = 30, .output_tokens = 8},
};

static struct ferry_engine_config config(int32_t max_seq) {
  struct ferry_engine_config c;
  memset(&c, 0, sizeof c);
  c.block_layers = 1;
  c.prefetch_depth = 1;
  c.max_batch = 4;
  c.max_step_tokens = 16;
  c.max_seq_tokens = max_seq;
  c.seed = 7;
  return c;
}

/* Device bytes the engine needs at least (the KV cache among them) for sequences of max_seq. */
static uint64_t device_min(const ferry_model *m, int32_t max_seq) {
  struct ferry_engine_config c = config(max_seq);
  uint64_t d = 0, h = 0;
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &c, &d, &h), FERRY_OK);
  return d;
}

/* Serve the requests on the sim with every weight resident; the kernels in *log. */
static void run(const ferry_model *m, struct log *log) {
  ferry_hw *hw = profile();
  struct ferry_engine_config c = config(128);
  struct ferry_exec_config xc = {0};
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  ferry_exec_set_sink(ex, sink, log);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  ferry_routing_synth *synth = NULL;
  if (mc->n_experts) {
    struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                            .top_k = (int32_t)mc->experts_per_token, .seed = 3};
    assert_int_equal(ferry_routing_synth_create(&synth, &sc), FERRY_OK);
    c.routing = ferry_routing_synth_fn;
    c.routing_user = synth;
  }
  ferry_engine *eng = NULL;
  if (ferry_engine_create(&eng, m, NULL, ex, &c) != FERRY_OK) fail_msg("engine: %s", ferry_last_error());
  struct ferry_run_options ro = {.time_scale = 1.0};
  if (ferry_engine_run(eng, requests, 3, &ro) != FERRY_OK) fail_msg("run: %s", ferry_last_error());
  struct ferry_serve_summary sum;
  ferry_engine_summary(eng, &sum);
  assert_int_equal(sum.requests_done, 3);
  ferry_engine_destroy(eng);
  ferry_exec_destroy(ex);
  ferry_routing_synth_free(synth);
  ferry_hw_close(hw);
}

static int64_t count(const struct log *l, const char *kind, const char *name, int32_t layer) {
  int64_t n = 0;
  for (size_t i = 0; i < l->n; i++)
    if ((!kind || !strcmp(l->a[i].kind, kind)) && (!name || !strcmp(l->a[i].name, name)) &&
        (layer < -1 || l->a[i].layer == layer))
      n++;
  return n;
}

static ferry_model *small(const char *preset, void (*shrink)(struct ferry_model_config *)) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, preset), FERRY_OK);
  struct ferry_model_config c = *ferry_model_get_config(m);
  ferry_model_close(m);
  c.vocab = 256;
  c.quant.kind = FERRY_CKPT_NONE;
  c.multimodal_names = 0;
  memset(&c.vision, 0, sizeof c.vision);
  shrink(&c);
  if (ferry_model_create(&m, &c) != FERRY_OK) fail_msg("%s: %s", preset, ferry_last_error());
  return m;
}

static void shrink_deepseek(struct ferry_model_config *c) {
  c->n_layers = 5;
  c->hidden = 64;
  c->n_heads = c->n_kv_heads = 4;
  c->q_lora_rank = 48;
  c->kv_lora_rank = 32;
  c->qk_nope_dim = 16;
  c->qk_rope_dim = 8;
  c->head_dim = 24;
  c->v_head_dim = 16;
  c->intermediate = 96;
  c->n_experts = 8;
  c->experts_per_token = 2;
  c->expert_intermediate = 32;
  c->shared_intermediate = 32;
  c->n_group = 2;
  c->topk_group = 1;
}

/* DeepSeek-V3's shape: three dense layers, MLA everywhere, shared + routed experts after. */
static void test_mla_dense_first(void **state) {
  (void)state;
  ferry_model *m = small("deepseek-v3", shrink_deepseek);
  /* the cache of 64 more tokens a sequence: 4 sequences x 5 layers x 40 latent values, fp16 */
  assert_int_equal(device_min(m, 192) - device_min(m, 128), 4u * 64u * 5u * (32u + 8u) * 2u);
  struct log log = {0};
  run(m, &log);
  for (int32_t l = 0; l < 5; l++) {
    assert_true(count(&log, "mla_attention", NULL, l) > 0);
    assert_int_equal(count(&log, "attention", NULL, l), 0);
    const int moe = l >= 3;
    assert_int_equal(count(&log, "expert", NULL, l) > 0, moe);
    assert_int_equal(count(&log, "router", NULL, l) > 0, moe);
    assert_int_equal(count(&log, "matmul", "shared.down", l) > 0, moe);
    assert_int_equal(count(&log, "matmul", "mlp.down", l) > 0, !moe);
    assert_int_equal(count(&log, "matmul", "attn.q_a", l), count(&log, "mla_attention", NULL, l));
  }
  /* MLA flops of one op: latent queries and values, scores over rank + rope per position */
  for (size_t i = 0; i < log.n; i++)
    if (!strcmp(log.a[i].kind, "mla_attention")) assert_true(log.a[i].flops >= 2.0 * 4 * 32 * (16 + 16));
  free(log.a);
  ferry_model_close(m);
}

static void shrink_gpt_oss(struct ferry_model_config *c) {
  c->n_layers = 4;
  c->hidden = 64;
  c->n_heads = 4;
  c->n_kv_heads = 2;
  c->head_dim = 16;
  c->n_experts = 8;
  c->experts_per_token = 2;
  c->expert_intermediate = 32;
  c->sliding_window = 8;
}

/* gpt-oss's shape: sliding and full layers alternate; a windowed layer keeps a ring of the
 * window plus one step's tokens and attends over at most its window. */
static void test_windows(void **state) {
  (void)state;
  ferry_model *m = small("gpt-oss-120b", shrink_gpt_oss);
  /* 64 more tokens grow the 2 full layers' K and V only */
  assert_int_equal(device_min(m, 192) - device_min(m, 128), 4u * 64u * 2u * (2u * 2u * 16u * 2u));
  struct log log = {0};
  run(m, &log);
  double windowed = 0, full = 0;
  for (size_t i = 0; i < log.n; i++) {
    if (strcmp(log.a[i].kind, "attention")) continue;
    /* at most 16 tokens a step, each seeing at most 8 positions: 4 flops x 8 x 4 heads x 16 */
    if (log.a[i].layer % 2 == 0) {
      assert_true(log.a[i].flops <= 16.0 * 8 * 4 * 4 * 16);
      windowed += log.a[i].flops;
    } else {
      full += log.a[i].flops;
    }
  }
  assert_true(windowed > 0 && full > 2 * windowed);
  assert_true(count(&log, "expert", NULL, -2) > 0);
  free(log.a);
  ferry_model_close(m);
}

static void shrink_qwen3_moe(struct ferry_model_config *c) {
  c->n_layers = 6;
  c->hidden = 64;
  c->n_heads = 4;
  c->n_kv_heads = 2;
  c->head_dim = 16;
  c->intermediate = 96;
  c->n_experts = 8;
  c->experts_per_token = 2;
  c->expert_intermediate = 32;
  c->first_dense_layers = 1; /* mlp_only_layers [0] */
  c->moe_layer_step = 2;     /* decoder_sparse_step 2: layers 1, 3, 5 */
}

static void test_moe_layer_pattern(void **state) {
  (void)state;
  ferry_model *m = small("qwen3-30b-a3b", shrink_qwen3_moe);
  struct log log = {0};
  run(m, &log);
  for (int32_t l = 0; l < 6; l++) {
    const int moe = l % 2 == 1;
    assert_int_equal(count(&log, "expert", NULL, l) > 0, moe);
    assert_int_equal(count(&log, "matmul", "mlp.gate", l) > 0, !moe);
    assert_true(count(&log, "norm", "q_norm", l) > 0); /* Qwen3's per-head q norm */
  }
  free(log.a);
  ferry_model_close(m);
}

/* gpt-oss as published: MXFP4 experts sit on the device at their packed size. */
static void test_published_quant_bytes(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "gpt-oss-20b"), FERRY_OK);
  struct ferry_model_accounting a;
  ferry_model_get_accounting(m, &a);
  struct ferry_engine_config c = config(128);
  c.resident_all = 1;
  uint64_t d = 0, h = 0;
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &c, &d, &h), FERRY_OK);
  /* resident: the packed 12.8 GiB plus cache and workspace, far below bf16's 39 GiB */
  assert_true(d >= a.bytes_total);
  assert_true(d < a.bytes_total + (2ull << 30));
  assert_true((double)d < 0.4 * 2.0 * (double)a.params_total);
  ferry_model_close(m);
}

/* model gen on every new preset, cut small: the folder reads back as the derived shape with
 * its quantization dropped (synthetic weights are plain), fused experts and all. */
static void test_gen_presets(void **state) {
  (void)state;
  const char *presets[] = {"qwen3-8b", "qwen3-30b-a3b", "deepseek-v2-lite", "deepseek-v3", "gpt-oss-20b",
                           "llama-4-scout-17b-16e", "phi-3.5-moe", "gemma-2-9b", "gemma-3-27b", "gpt-neox-20b",
                           "bloom-176b"};
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
    ferry_model *base = NULL, *m = NULL, *back = NULL;
    assert_int_equal(ferry_model_open(&base, presets[i]), FERRY_OK);
    struct ferry_model_config c;
    if (ferry_model_config_derive(ferry_model_get_config(base), 2, 0.03, 256, &c) != FERRY_OK)
      fail_msg("%s: %s", presets[i], ferry_last_error());
    assert_int_equal(ferry_model_create(&m, &c), FERRY_OK);
    char dir[1024];
    snprintf(dir, sizeof dir, "%.900s/gen-%zu", tmp, i);
    struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F16, .seed = 1};
    if (ferry_model_generate(m, &go, dir, NULL) != FERRY_OK) fail_msg("%s: %s", presets[i], ferry_last_error());
    if (ferry_model_open(&back, dir) != FERRY_OK) fail_msg("%s: %s", presets[i], ferry_last_error());
    const struct ferry_model_config *b = ferry_model_get_config(back);
    assert_int_equal(b->quant.kind, FERRY_CKPT_NONE);
    assert_int_equal(b->dtype, FERRY_DTYPE_F16);
    assert_int_equal(b->n_layers, 2);
    assert_int_equal(ferry_model_tensor_count(back), ferry_model_tensor_count(m));
    assert_int_equal(b->family, c.family);
    ferry_model_close(back);
    ferry_model_close(m);
    ferry_model_close(base);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mla_dense_first),
      cmocka_unit_test(test_windows),
      cmocka_unit_test(test_moe_layer_pattern),
      cmocka_unit_test(test_published_quant_bytes),
      cmocka_unit_test(test_gen_presets),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
