/* KV-cache placement and precision: the cache in host memory with attention on the CPU (the
 * logits of the resident run, exactly: the same fp32 kernels over the same rows), quantized
 * formats (fp8, int8, int4 with a scale per 32) within their quantization error, their codec's
 * bounds, and in the simulator the bytes each crosses or holds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/quantize.h"
#include "ferry/routing.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "runtime/exec/host_kernels.h"
#include "testutil.h"

static char *dir, *dense_dir, *gpt_oss_dir, *deepseek_dir, *deepseek_q8_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("kv");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 3};
  dense_dir = tu_gen_model(dir, "tiny-dense", "dense", &go);
  gpt_oss_dir = tu_gen_tiny(dir, "gpt_oss", &go);
  deepseek_dir = tu_gen_tiny(dir, "deepseek_v2", &go);
  struct ferry_qplan plan;
  assert_int_equal(ferry_quant_plan_parse("int8", &plan), FERRY_OK);
  const size_t n = strlen(dir) + 32;
  deepseek_q8_dir = malloc(n);
  assert_non_null(deepseek_q8_dir);
  snprintf(deepseek_q8_dir, n, "%s/deepseek_v2-q8", dir);
  assert_int_equal(ferry_model_quantize(deepseek_dir, deepseek_q8_dir, &plan, NULL, NULL), FERRY_OK);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(dense_dir);
  free(gpt_oss_dir);
  free(deepseek_dir);
  free(deepseek_q8_dir);
  return 0;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 21, .output_tokens = 6},
    {.id = 1, .prompt_tokens = 6, .output_tokens = 9},
    {.id = 2, .prompt_tokens = 14, .output_tokens = 4},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

static struct ferry_engine_config config(void) {
  struct ferry_engine_config c = {.max_batch = 2, .max_step_tokens = 16, .max_seq_tokens = 32, .seed = 9,
                                  .block_layers = 1, .prefetch_depth = 1};
  return c;
}

/* The activation bytes crossed in all steps. */
static void sum_bytes_act(struct ferry_engine *e, void *user) {
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  uint64_t *bytes_act = user;
  *bytes_act = 0;
  for (int64_t i = 0; i < n; i++) *bytes_act += sm[i].bytes_act;
}

static void run_host_on(const char *model_dir, struct ferry_engine_config c, struct tu_logit_log *log,
                        uint64_t *bytes_act) {
  c.on_logits = tu_on_logits;
  c.logits_user = log;
  tu_run_host(model_dir, &c, requests, N_REQ, sum_bytes_act, bytes_act);
}

static void run_host(struct ferry_engine_config c, struct tu_logit_log *log, uint64_t *bytes_act) {
  run_host_on(dense_dir, c, log, bytes_act);
}

/* The cache in host memory, with every weight resident and with layers streamed: the same rows
 * and kernels, so the same logits to the bit; only q, k, v and the attention output cross. */
static void test_kv_home_host_same_logits(void **state) {
  (void)state;
  struct tu_logit_log ref = {0};
  uint64_t act = 0;
  run_host(config(), &ref, &act);
  assert_int_equal(act, 0);
  const uint64_t budgets[2] = {0, 3500 << 10};
  for (int i = 0; i < 2; i++) {
    struct tu_logit_log got = {0};
    struct ferry_engine_config c = config();
    c.kv_home_host = 1;
    c.device_budget_bytes = budgets[i];
    run_host(c, &got, &act);
    assert_int_equal(got.n, ref.n);
    assert_memory_equal(got.v, ref.v, ref.n * sizeof(float));
    assert_true(act > 0);
    free(got.v);
  }
  free(ref.v);
}

/* Weights the CPU's attention reads beside its cache: gpt-oss's sinks (a learned logit per head
 * joins each softmax) and DeepSeek-V2's kv_b_proj (absorbed into the latent attention; plain, and
 * stored int8, its parts dequantized by the CPU from its copy). With the
 * cache in host memory or on disk the CPU attends with its own copy of every layer's (a CPU op
 * reads host memory only, and the layer's copy is on the device, in its pinned part or a block
 * slot): the resident run's logits to the bit, with the layers resident and streamed. */
static void test_kv_home_host_mirror(void **state) {
  (void)state;
  const char *dirs[3] = {gpt_oss_dir, deepseek_dir, deepseek_q8_dir};
  const char *names[3] = {"gpt_oss", "deepseek_v2", "deepseek_v2 int8"};
  for (int d = 0; d < 3; d++) {
    struct tu_logit_log ref = {0};
    uint64_t act = 0;
    run_host_on(dirs[d], config(), &ref, &act);
    assert_true(ref.n > 0);
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_open(&m, dirs[d]), FERRY_OK);
    struct ferry_engine_config pc = config();
    pc.kv_home_host = 1;
    char *text = tu_plan_text(m, NULL, &pc);
    if (!tu_contains(text, "of it the weights its attention reads")) fail_msg("%s: the plan hides the copies:\n%s", names[d], text);
    free(text);
    ferry_model_close(m);
    for (int v = 0; v < 4; v++) {
      struct tu_logit_log got = {0};
      struct ferry_engine_config c = config();
      c.kv_home_host = 1;
      c.kv_home_disk = v >= 2;
      if (v % 2) c.device_budget_bytes = tu_min_device_budget(dirs[d], &c);
      run_host_on(dirs[d], c, &got, &act);
      if (got.n != ref.n || memcmp(got.v, ref.v, ref.n * sizeof(float)))
        fail_msg("%s, variant %d (%s, %s): logits differ from the resident run's", names[d], v,
                 v >= 2 ? "disk" : "host", v % 2 ? "streamed" : "resident");
      assert_true(act > 0);
      free(got.v);
    }
    free(ref.v);
  }
}

/* Quantized caches move the logits by their quantization error, ordered by precision. */
static void test_quantized_kv_logits(void **state) {
  (void)state;
  struct tu_logit_log ref = {0};
  uint64_t act;
  run_host(config(), &ref, &act);
  const enum ferry_kv_format fmts[3] = {FERRY_KV_INT8, FERRY_KV_FP8, FERRY_KV_INT4};
  const double bound[3] = {1e-4, 2e-3, 2e-2}; /* 1 - mean cosine */
  double worst[3];
  for (int i = 0; i < 3; i++) {
    struct tu_logit_log got = {0};
    struct ferry_engine_config c = config();
    c.kv_format = fmts[i];
    c.kv_home_host = i == 2; /* int4 on the CPU's side too */
    run_host(c, &got, &act);
    assert_int_equal(got.n, ref.n);
    const size_t V = 256, tokens = ref.n / V;
    double cos = 0;
    for (size_t t = 0; t < tokens; t++) cos += ferry_quant_cosine(ref.v + t * V, got.v + t * V, V);
    worst[i] = 1.0 - cos / (double)tokens;
    if (!(worst[i] < bound[i])) fail_msg("%s KV: 1 - cosine %g above %g", ferry_kv_format_name(fmts[i]), worst[i], bound[i]);
    assert_true(worst[i] > 0); /* it did quantize */
    free(got.v);
  }
  assert_true(worst[0] < worst[2]); /* int8 closer than int4 */
  free(ref.v);
}

/* The codec: a chunk is its codes then its scales, each group scaled by its own absmax; every
 * element within half a step of its value (fp8: its relative precision), zeros stay zeros. */
static void test_kv_codec(void **state) {
  (void)state;
  const int64_t n = 64;
  float src[64], back[64];
  for (int64_t i = 0; i < n; i++) src[i] = i < 32 ? 0.0f : (float)sin((double)i) * (float)(i % 7 + 1);
  const enum ferry_kv_format fmts[3] = {FERRY_KV_INT8, FERRY_KV_INT4, FERRY_KV_FP8};
  for (int f = 0; f < 3; f++) {
    const size_t bytes = ferry__host_kv_chunk_bytes(fmts[f], ferry_kv_format_dtype(fmts[f]), n);
    assert_int_equal(bytes, ferry_kv_format_row_bytes(fmts[f], (uint64_t)n));
    assert_int_equal(bytes, (size_t)(fmts[f] == FERRY_KV_INT4 ? 32 : 64) + 4); /* codes + 2 fp16 scales */
    unsigned char *buf = calloc(3, bytes);
    assert_non_null(buf);
    ferry__host_kv_store(fmts[f], ferry_kv_format_dtype(fmts[f]), buf, 1, src, n); /* the second chunk */
    ferry__host_kv_load(fmts[f], ferry_kv_format_dtype(fmts[f]), buf, 1, back, n);
    for (size_t b = 0; b < bytes; b++) assert_int_equal(buf[b], 0); /* the first chunk untouched */
    float amax = 0;
    for (int64_t i = 32; i < n; i++) amax = fmaxf(amax, fabsf(src[i]));
    for (int64_t i = 0; i < n; i++) {
      const float err = fabsf(back[i] - src[i]);
      if (i < 32) assert_true(back[i] == 0.0f);
      else if (fmts[f] == FERRY_KV_INT8) assert_true(err <= amax / 127.0f * 0.5f * 1.01f);
      else if (fmts[f] == FERRY_KV_INT4) assert_true(err <= amax / 7.0f * 0.5f * 1.01f);
      else assert_true(err <= fabsf(src[i]) / 16.0f + amax / 448.0f * 0.002f);
    }
    free(buf);
  }
}

/* A format whose group does not divide the head is refused, naming both (tiny qwen3: heads of 16). */
static void test_kv_group_must_divide_head(void **state) {
  (void)state;
  ferry_model *m = NULL;
  char *cfg = tu_data_path("configs/tiny/qwen3");
  assert_int_equal(ferry_model_open(&m, cfg), FERRY_OK);
  free(cfg);
  assert_int_equal(ferry_model_get_config(m)->head_dim, 16);
  struct ferry_engine_config c = config();
  c.kv_format = FERRY_KV_INT4;
  FILE *devnull = fopen("/dev/null", "w");
  assert_non_null(devnull);
  assert_int_equal(ferry_engine_plan_only(m, NULL, &c, devnull), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "scales groups of 32 elements of each head"));
  assert_true(tu_contains(ferry_last_error(), "16 wide"));
  c.kv_format = FERRY_KV_BF16; /* a plain format has no groups */
  assert_int_equal(ferry_engine_plan_only(m, NULL, &c, devnull), FERRY_OK);
  fclose(devnull);
  ferry_model_close(m);
}

/* The requests served as fast as possible by model m on simulator profile hw under c: the
 * engine, and its executor at *ex (destroy both). Any failure fails the test. */
static ferry_engine *sim_serve(ferry_hw *hw, ferry_model *m, const struct ferry_engine_config *c, ferry_exec **ex) {
  ferry_engine *e = NULL;
  assert_int_equal(ferry_exec_create_sim(ex, hw, &(struct ferry_exec_config){.lock_host_memory = 1}), FERRY_OK);
  if (ferry_engine_create(&e, m, NULL, *ex, c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  assert_int_equal(ferry_engine_run(e, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1}), FERRY_OK);
  return e;
}

/* In the simulator: a host cache takes nothing from the device and crosses q, k, v down and the
 * attention output up for every layer and token; int4 holds a quarter of fp16 plus its scales. */
static void test_sim_kv_bytes(void **state) {
  (void)state;
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  uint64_t peak[3];
  const enum ferry_kv_format fmts[3] = {FERRY_KV_FP16, FERRY_KV_FP16, FERRY_KV_INT4};
  for (int i = 0; i < 3; i++) {
    struct ferry_engine_config c = config();
    c.kv_format = fmts[i];
    c.kv_home_host = i == 1;
    c.resident_all = 1;
    ferry_exec *ex = NULL;
    ferry_engine *e = sim_serve(hw, m, &c, &ex);
    int64_t n;
    const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
    for (int64_t s = 0; s < n; s++) {
      const uint64_t T = (uint64_t)sm[s].tokens, qd = (uint64_t)(mc->n_heads * mc->head_dim),
                     kvd = (uint64_t)(mc->n_kv_heads * mc->head_dim);
      /* at fp16, the simulated runtime's (h100-pcie has no runtime section: a GPU runtime's 2 bytes) */
      const uint64_t expect = i == 1 ? (uint64_t)mc->n_layers * T * (2 * qd + 2 * kvd) * 2 : 0;
      assert_int_equal(sm[s].bytes_act, expect);
      assert_true(i != 1 || sm[s].cpu_busy_ns > 0);
    }
    struct ferry_serve_summary sum;
    ferry_engine_summary(e, &sum);
    peak[i] = sum.peak_bytes[FERRY_TIER_DEVICE];
    ferry_engine_destroy(e);
    ferry_exec_destroy(ex);
  }
  const uint64_t tokens = 2 * 32; /* max_batch x max_seq_tokens */
  const uint64_t fp16 = ferry_model_kv_bytes(m, (int64_t)tokens, FERRY_KV_FP16),
                 int4 = ferry_model_kv_bytes(m, (int64_t)tokens, FERRY_KV_INT4);
  assert_int_equal(int4, fp16 / 4 + fp16 / 32); /* half a byte per element and 2 bytes per 32 */
  assert_int_equal(peak[0] - peak[1], fp16);                 /* the host cache holds no device bytes */
  assert_int_equal(peak[0] - peak[2], fp16 - int4);
  ferry_model_close(m);
  ferry_hw_close(hw);
}

/* In the simulator, DeepSeek's latent (MLA) cache in host memory: per layer and token q and the new
 * latent row go down and the attention output comes back (at the runtime's 2 bytes), the CPU
 * attends, and the device holds no cache; with the cache on disk the same crossings, and the
 * latent rows are read from and written to the disk. */
static void test_sim_mla_host_bytes(void **state) {
  (void)state;
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  ferry_model *m = NULL;
  char *cfg = tu_data_path("configs/tiny/deepseek_v2");
  assert_int_equal(ferry_model_open(&m, cfg), FERRY_OK);
  free(cfg);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const uint64_t per_token = (uint64_t)(mc->n_heads * (mc->qk_nope_dim + mc->qk_rope_dim)) +
                             (uint64_t)(mc->kv_lora_rank + mc->qk_rope_dim) + (uint64_t)(mc->n_heads * mc->v_head_dim);
  struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                          .top_k = (int32_t)mc->experts_per_token, .seed = 7};
  ferry_routing_synth *synth = NULL;
  assert_int_equal(ferry_routing_synth_create(&synth, &sc), FERRY_OK);
  uint64_t peak[3], disk[3];
  for (int i = 0; i < 3; i++) {
    struct ferry_engine_config c = config();
    c.kv_home_host = i >= 1;
    c.kv_home_disk = i == 2;
    c.resident_all = 1;
    c.kv_format = FERRY_KV_FP16;
    c.routing = ferry_routing_synth_fn; /* the simulator computes no router */
    c.routing_user = synth;
    ferry_exec *ex = NULL;
    ferry_engine *e = sim_serve(hw, m, &c, &ex);
    int64_t n;
    const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
    for (int64_t s = 0; s < n; s++) {
      const uint64_t expect = i ? (uint64_t)mc->n_layers * (uint64_t)sm[s].tokens * per_token * 2 : 0;
      if (sm[s].bytes_act != expect)
        fail_msg("cache %d, step %lld: %llu activation bytes crossed, %llu by hand", i, (long long)s,
                 (unsigned long long)sm[s].bytes_act, (unsigned long long)expect);
      assert_true(!i || sm[s].cpu_busy_ns > 0);
    }
    struct ferry_serve_summary sum;
    ferry_engine_summary(e, &sum);
    peak[i] = sum.peak_bytes[FERRY_TIER_DEVICE];
    disk[i] = sum.bytes_disk_write;
    ferry_engine_destroy(e);
    ferry_exec_destroy(ex);
  }
  const uint64_t cache = ferry_model_kv_bytes(m, (int64_t)config().max_batch * config().max_seq_tokens, FERRY_KV_FP16);
  assert_int_equal(peak[0] - peak[1], cache); /* the host cache holds no device bytes */
  assert_int_equal(peak[1], peak[2]);
  assert_int_equal(disk[1], 0);
  assert_true(disk[2] > 0);
  ferry_routing_synth_free(synth);
  ferry_model_close(m);
  ferry_hw_close(hw);
}

/* A cache kept in host memory is named in the plan and in the error of a host budget it does not
 * fit, with its size, not folded into the read-back buffers. */
static void test_host_kv_in_plan(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  struct ferry_engine_config c = config();
  c.kv_home_host = 1;
  c.kv_format = FERRY_KV_FP32;
  const uint64_t kv = ferry_model_kv_bytes(m, (int64_t)c.max_batch * c.max_seq_tokens, FERRY_KV_FP32);
  char want[64], *text = tu_plan_text(m, NULL, &c);
  snprintf(want, sizeof want, "(%d sequences x %d tokens, fp32; --kv-home host)", c.max_batch, c.max_seq_tokens);
  assert_true(tu_contains(text, "KV cache (host)"));
  assert_true(tu_contains(text, want));
  assert_true(tu_contains(text, "CPU workspace"));
  free(text);
  c.host_budget_bytes = kv / 2;
  FILE *devnull = fopen("/dev/null", "w");
  assert_non_null(devnull);
  assert_int_equal(ferry_engine_plan_only(m, NULL, &c, devnull), FERRY_ERR_BUDGET);
  fclose(devnull);
  assert_true(tu_contains(ferry_last_error(), "KV cache in host memory"));
  ferry_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kv_home_host_same_logits), cmocka_unit_test(test_kv_home_host_mirror),
      cmocka_unit_test(test_host_kv_in_plan), cmocka_unit_test(test_quantized_kv_logits),
      cmocka_unit_test(test_kv_codec),                 cmocka_unit_test(test_kv_group_must_divide_head),
      cmocka_unit_test(test_sim_kv_bytes), cmocka_unit_test(test_sim_mla_host_bytes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
