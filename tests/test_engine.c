/* The offload engine on the host executor: offloading never changes the numbers (logits are
 * bit-identical to a fully resident run for every block size, prefetch depth and home tier),
 * budgets hold (peak <= budget), and a budget one byte under the minimum is refused. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/alloc.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/model.h"
#include "ferry/predict.h"
#include "ferry/quantize.h"
#include "ferry/store.h"
#include "testutil.h"

struct fixture {
  char *dir;
  char *dense_dir, *moe_dir, *qmoe_dir, *olmoe_dir, *bloom_dir;
};

static struct fixture fx;

static char *gen_model(const char *preset, const char *name, double skew) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, preset), FERRY_OK);
  size_t n = strlen(fx.dir) + strlen(name) + 2;
  char *out = malloc(n);
  snprintf(out, n, "%s/%s", fx.dir, name);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 7, .router_skew = skew};
  assert_int_equal(ferry_model_generate(m, &go, out, NULL), FERRY_OK);
  ferry_model_close(m);
  return out;
}

static int setup(void **state) {
  (void)state;
  fx.dir = tu_mkdtemp("engine");
  fx.dense_dir = gen_model("tiny-dense", "dense", 0);
  fx.moe_dir = gen_model("tiny-moe", "moe", 0.5);
  fx.qmoe_dir = gen_model("tiny-qwen2-moe", "qmoe", 0);
  fx.olmoe_dir = gen_model("tiny-olmoe", "olmoe", 0);
  /* a small BLOOM: tied head, a norm of the embeddings, LayerNorm with biases (OPT is
   * simulation-only) */
  ferry_model *base = NULL, *bloom = NULL;
  struct ferry_model_config oc;
  assert_int_equal(ferry_model_open(&base, "bloom-176b"), FERRY_OK);
  assert_int_equal(ferry_model_config_derive(ferry_model_get_config(base), 3, 0.03, 512, &oc), FERRY_OK);
  assert_int_equal(ferry_model_create(&bloom, &oc), FERRY_OK);
  size_t n = strlen(fx.dir) + 8; /* "/bloom" */
  fx.bloom_dir = malloc(n);
  snprintf(fx.bloom_dir, n, "%s/bloom", fx.dir);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 7};
  assert_int_equal(ferry_model_generate(bloom, &go, fx.bloom_dir, NULL), FERRY_OK);
  ferry_model_close(bloom);
  ferry_model_close(base);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(fx.dir);
  free(fx.dir);
  free(fx.dense_dir);
  free(fx.moe_dir);
  free(fx.qmoe_dir);
  free(fx.olmoe_dir);
  free(fx.bloom_dir);
  return 0;
}

/* Logits of every generated token, in the order they arrive. */
struct logit_log {
  float *data;
  size_t floats, cap;
  int64_t rows;
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens,
                      const float *logits, int64_t vocab) {
  (void)req;
  (void)tok;
  (void)tokens;
  assert_true(n_tokens >= 1);
  struct logit_log *l = user;
  if (l->floats + (size_t)vocab > l->cap) {
    l->cap = (l->cap + (size_t)vocab) * 2;
    l->data = realloc(l->data, l->cap * sizeof(float));
    assert_non_null(l->data);
  }
  memcpy(l->data + l->floats, logits, (size_t)vocab * sizeof(float));
  l->floats += (size_t)vocab;
  l->rows++;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 5, .output_tokens = 4},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 11, .output_tokens = 3},
    {.id = 2, .arrival_ns = 0, .prompt_tokens = 3, .output_tokens = 6},
    {.id = 3, .arrival_ns = 0, .prompt_tokens = 7, .output_tokens = 2},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

static struct ferry_engine_config base_config(void) {
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 8, .max_seq_tokens = 32, .seed = 11};
  return c;
}

/* Run the requests; fills log, checks peak <= budget per tier, returns the summary. */
static ferry_status run(const char *dir, struct ferry_engine_config c, struct logit_log *log,
                        struct ferry_serve_summary *sum) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes,
                                 .host_budget_bytes = c.host_budget_bytes,
                                 .compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  c.on_logits = on_logits;
  c.logits_user = log;
  ferry_status st = ferry_engine_create(&e, m, s, ex, &c);
  if (st == FERRY_OK) {
    struct ferry_run_options ro = {.as_fast_as_possible = 1};
    st = ferry_engine_run(e, requests, N_REQ, &ro);
    if (st != FERRY_OK) fprintf(stderr, "run failed: %s\n", ferry_last_error());
    assert_int_equal(st, FERRY_OK);
    ferry_engine_summary(e, sum);
    for (int t = 0; t < 2; t++)
      if (sum->budget_bytes[t]) assert_true(sum->peak_bytes[t] <= sum->budget_bytes[t]);
    assert_int_equal(sum->requests_done, N_REQ);
  }
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
  return st;
}

static uint64_t min_device(const char *dir, struct ferry_engine_config c, uint64_t *host_min) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  assert_int_equal(ferry_model_open(&m, dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  uint64_t dev = 0, host = 0;
  assert_int_equal(ferry_engine_min_budgets(m, s, &c, &dev, &host), FERRY_OK);
  ferry_store_close(s);
  ferry_model_close(m);
  if (host_min) *host_min = host;
  return dev;
}

/* The reference: every weight resident, its logits into ref. */
static void resident_run(const char *dir, struct logit_log *ref) {
  struct ferry_engine_config c = base_config();
  struct ferry_serve_summary sum;
  c.resident_all = 1;
  assert_int_equal(run(dir, c, ref, &sum), FERRY_OK);
}

static void check_offload_identical(const char *dir, int moe) {
  struct logit_log ref = {0};
  struct ferry_serve_summary sum;
  struct ferry_engine_config c = base_config();
  c.resident_all = 1;
  assert_int_equal(run(dir, c, &ref, &sum), FERRY_OK);
  int64_t expected_rows = 0;
  for (int64_t i = 0; i < N_REQ; i++) expected_rows += requests[i].output_tokens;
  assert_int_equal(ref.rows, expected_rows);
  for (size_t i = 0; i < ref.floats; i++) assert_true(ref.data[i] == ref.data[i]); /* no NaN */
  const int blocks[] = {1, 2, 3, 0};
  int configs = 0;
  for (int bi = 0; bi < 4; bi++)
    for (int depth = 0; depth <= 3; depth++)
      for (int disk = 0; disk <= 1; disk++) {
        struct ferry_engine_config o = base_config();
        o.block_layers = blocks[bi];
        o.prefetch_depth = depth;
        o.home_disk = disk;
        uint64_t host_min = 0;
        uint64_t dev = min_device(dir, o, &host_min);
        /* a few expert slots beyond the minimum so the cache evicts */
        o.device_budget_bytes = dev + (moe ? 2 * (dev / 64) : 0);
        if (disk) o.host_budget_bytes = host_min;
        struct logit_log got = {0};
        assert_int_equal(run(dir, o, &got, &sum), FERRY_OK);
        assert_int_equal(got.rows, ref.rows);
        if (memcmp(got.data, ref.data, ref.floats * sizeof(float)) != 0) {
          fprintf(stderr, "logits differ: block_layers %d depth %d disk %d\n", blocks[bi], depth, disk);
          fail();
        }
        /* something really moved */
        assert_true(sum.bytes_h2d > 0);
        if (disk) assert_true(sum.bytes_disk > 0);
        if (moe) assert_true(sum.misses > 0);
        free(got.data);
        configs++;
      }
  assert_int_equal(configs, 32);
  free(ref.data);
}

static void test_dense_offload_bit_identical(void **state) {
  (void)state;
  check_offload_identical(fx.dense_dir, 0);
}

static void test_moe_offload_bit_identical(void **state) {
  (void)state;
  check_offload_identical(fx.moe_dir, 1);
}

static void test_qwen2_moe_and_olmoe_offload(void **state) {
  (void)state;
  const char *dirs[] = {fx.qmoe_dir, fx.olmoe_dir};
  for (int i = 0; i < 2; i++) {
    struct logit_log ref = {0}, got = {0};
    struct ferry_serve_summary sum;
    struct ferry_engine_config c = base_config();
    c.resident_all = 1;
    assert_int_equal(run(dirs[i], c, &ref, &sum), FERRY_OK);
    struct ferry_engine_config o = base_config();
    o.block_layers = 2;
    o.prefetch_depth = 1;
    o.device_budget_bytes = min_device(dirs[i], o, NULL);
    assert_int_equal(run(dirs[i], o, &got, &sum), FERRY_OK);
    assert_int_equal(got.rows, ref.rows);
    assert_memory_equal(got.data, ref.data, ref.floats * sizeof(float));
    free(ref.data);
    free(got.data);
  }
}

/* fill_budget pins the last layers with what the working set leaves: the logits do not change,
 * fewer bytes stream, and the budget still holds (run() asserts peak <= budget). A dense model's
 * streamed layers, or an MoE model's whose routed experts all run on the CPU (no expert cache
 * takes the budget; the experts' sums on the CPU are not the resident run's to the bit, the
 * streamed run's are). */
static void check_fill_budget(const char *dir, enum ferry_compute_where experts) {
  struct logit_log ref = {0}, streamed = {0}, filled = {0};
  struct ferry_serve_summary sum_ref, sum_streamed, sum_filled;
  struct ferry_engine_config c = base_config();
  c.resident_all = 1;
  assert_int_equal(run(dir, c, &ref, &sum_ref), FERRY_OK);
  struct ferry_engine_config o = base_config();
  o.block_layers = 1;
  o.prefetch_depth = 1;
  o.compute_experts = experts;
  uint64_t dev = min_device(dir, o, NULL);
  /* room for about two more layers beyond the working set */
  struct ferry_engine_config one = o;
  one.pin_last = 1;
  const uint64_t layer = min_device(dir, one, NULL) - dev;
  o.device_budget_bytes = dev + 2 * layer + layer / 2;
  assert_int_equal(run(dir, o, &streamed, &sum_streamed), FERRY_OK);
  o.fill_budget = 1;
  assert_int_equal(run(dir, o, &filled, &sum_filled), FERRY_OK);
  assert_int_equal(filled.rows, ref.rows);
  assert_memory_equal(filled.data, streamed.data, ref.floats * sizeof(float));
  if (experts == FERRY_COMPUTE_GPU) assert_memory_equal(streamed.data, ref.data, ref.floats * sizeof(float));
  assert_true(sum_filled.bytes_h2d > 0);
  assert_true(sum_filled.bytes_h2d < sum_streamed.bytes_h2d);
  assert_true(sum_filled.peak_bytes[0] > sum_streamed.peak_bytes[0]);
  free(ref.data);
  free(streamed.data);
  free(filled.data);
}

static void test_fill_budget(void **state) {
  (void)state;
  check_fill_budget(fx.dense_dir, FERRY_COMPUTE_GPU);
  check_fill_budget(fx.moe_dir, FERRY_COMPUTE_CPU);
}

static void test_budget_below_minimum_refused(void **state) {
  (void)state;
  const char *dirs[] = {fx.dense_dir, fx.moe_dir};
  for (int i = 0; i < 2; i++) {
    struct ferry_engine_config o = base_config();
    o.block_layers = 2;
    o.prefetch_depth = 2;
    uint64_t dev = min_device(dirs[i], o, NULL);
    struct logit_log log = {0};
    struct ferry_serve_summary sum;
    o.device_budget_bytes = dev - 1;
    assert_int_equal(run(dirs[i], o, &log, &sum), FERRY_ERR_BUDGET);
    assert_true(tu_contains(ferry_last_error(), "minimum working set"));
    o.device_budget_bytes = dev;
    assert_int_equal(run(dirs[i], o, &log, &sum), FERRY_OK);
    assert_true(sum.peak_bytes[FERRY_TIER_DEVICE] <= dev);
    free(log.data);
  }
}

/* --block-slots: a spare slot for the streamed blocks changes nothing the model computes, costs
 * one block's bytes of the minimum device budget, and holds within it; fewer slots than the
 * blocks in flight need, or more than 66, are refused. */
static void test_block_slots(void **state) {
  (void)state;
  struct logit_log ref = {0}, got = {0};
  struct ferry_serve_summary sum;
  resident_run(fx.dense_dir, &ref);
  struct ferry_engine_config o = base_config();
  o.block_layers = 1;
  o.prefetch_depth = 1;
  const uint64_t two = min_device(fx.dense_dir, o, NULL);
  o.block_slots = 3;
  const uint64_t three = min_device(fx.dense_dir, o, NULL);
  assert_true(three > two);
  o.device_budget_bytes = three - 1;
  assert_int_equal(run(fx.dense_dir, o, &got, &sum), FERRY_ERR_BUDGET);
  assert_true(tu_contains(ferry_last_error(), "3 block slot(s)"));
  free(got.data);
  got = (struct logit_log){0};
  o.device_budget_bytes = three;
  assert_int_equal(run(fx.dense_dir, o, &got, &sum), FERRY_OK);
  assert_int_equal(got.floats, ref.floats);
  assert_memory_equal(got.data, ref.data, ref.floats * sizeof(float));
  assert_true(sum.bytes_h2d > 0 && sum.peak_bytes[FERRY_TIER_DEVICE] <= three);
  free(got.data);
  free(ref.data);
  static const int32_t bad[][2] = {{1, 1}, {2, 2}, {1, 67}}; /* {prefetch depth, slots} */
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.prefetch_depth = bad[i][0], o.block_slots = bad[i][1];
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_open(&m, fx.dense_dir), FERRY_OK);
    uint64_t dev = 0, host = 0;
    assert_int_equal(ferry_engine_min_budgets(m, NULL, &o, &dev, &host), FERRY_ERR_INVALID);
    ferry_model_close(m);
    assert_true(tu_contains(ferry_last_error(), "--block-slots"));
  }
}

static void test_resident_attention_streams_ffn(void **state) {
  (void)state;
  struct logit_log ref = {0}, got = {0};
  struct ferry_serve_summary sum;
  resident_run(fx.dense_dir, &ref);
  struct ferry_engine_config o = base_config();
  o.resident_attention = 1;
  o.pin_first = 1;
  o.pin_last = 1;
  o.block_layers = 3;
  o.prefetch_depth = 1;
  o.device_budget_bytes = min_device(fx.dense_dir, o, NULL);
  assert_int_equal(run(fx.dense_dir, o, &got, &sum), FERRY_OK);
  assert_memory_equal(got.data, ref.data, ref.floats * sizeof(float));
  assert_true(sum.bytes_h2d > 0);
  free(ref.data);
  free(got.data);
}

/* --stream-embeddings: the embeddings and the head fetched into a block slot every step (a
 * tied head's table twice) compute the same logits as pinned ones, within the budget, for every
 * prefetch depth and home tier; more bytes cross the link than with them pinned. */
static void test_stream_embeddings_same_logits(void **state) {
  (void)state;
  const char *dirs[] = {fx.dense_dir, fx.bloom_dir}; /* untied (Llama), tied (BLOOM) */
  for (int di = 0; di < 2; di++) {
    struct logit_log ref = {0};
    struct ferry_serve_summary sum, pinned;
    struct ferry_engine_config c = base_config();
    c.resident_all = 1;
    assert_int_equal(run(dirs[di], c, &ref, &sum), FERRY_OK);
    for (int depth = 0; depth <= 2; depth++)
      for (int disk = 0; disk <= 1; disk++) {
        struct ferry_engine_config o = base_config();
        o.block_layers = 1;
        o.prefetch_depth = depth;
        o.home_disk = disk;
        o.stream_embeddings = 1;
        uint64_t host_min = 0;
        o.device_budget_bytes = min_device(dirs[di], o, &host_min);
        if (disk) o.host_budget_bytes = host_min;
        struct logit_log got = {0}, plain = {0};
        assert_int_equal(run(dirs[di], o, &got, &sum), FERRY_OK);
        assert_int_equal(got.rows, ref.rows);
        if (memcmp(got.data, ref.data, ref.floats * sizeof(float)) != 0)
          fail_msg("%s: logits differ with --stream-embeddings, depth %d disk %d", dirs[di], depth, disk);
        /* the same run with them pinned (a budget that holds them) moves less */
        o.stream_embeddings = 0;
        o.device_budget_bytes = min_device(dirs[di], o, &host_min);
        if (disk) o.host_budget_bytes = host_min;
        assert_int_equal(run(dirs[di], o, &plain, &pinned), FERRY_OK);
        assert_true(sum.bytes_h2d > pinned.bytes_h2d);
        if (disk) assert_true(sum.bytes_disk > pinned.bytes_disk);
        free(got.data);
        free(plain.data);
      }
    free(ref.data);
  }
}

static void test_request_too_long_rejected(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, fx.dense_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, fx.dense_dir), FERRY_OK);
  assert_int_equal(ferry_exec_create_host(&ex, NULL), FERRY_OK);
  struct ferry_engine_config c = base_config();
  c.max_seq_tokens = 10;
  assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_OK);
  const struct ferry_engine_request r[] = {{.id = 0, .prompt_tokens = 4, .output_tokens = 3},
                                           {.id = 1, .prompt_tokens = 9, .output_tokens = 3}};
  assert_int_equal(ferry_engine_run(e, r, 2, &(struct ferry_run_options){.as_fast_as_possible = 1}), FERRY_OK);
  int64_t n;
  const struct ferry_request_metrics *rm = ferry_engine_request_metrics(e, &n);
  assert_int_equal(n, 2);
  assert_int_equal(rm[0].rejected, 0);
  assert_int_equal(rm[0].output_tokens, 3);
  assert_int_equal(rm[1].rejected, 1);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

/* The KV cache is bounded by the model's positions (a capacity sized from one long request
 * used to ask for hundreds of GiB), and every failed allocation of engine set-up names what it
 * was sizing: the KV cache's sequences x tokens x bytes per token. */
static void test_kv_bounded_and_alloc_failures_named(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, fx.dense_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, fx.dense_dir), FERRY_OK);
  assert_int_equal(ferry_exec_create_host(&ex, NULL), FERRY_OK);
  struct ferry_engine_config c = base_config();
  c.max_seq_tokens = (int32_t)ferry_model_get_config(m)->max_position + 1;
  assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_ERR_INVALID);
  assert_non_null(strstr(ferry_last_error(), "exceeds tiny-dense's maximum position 2048"));
  ferry_exec_destroy(ex);
  c = base_config();
  int named_kv = 0, failures = 0;
  for (int64_t n = 0; n < 100000; n++) {
    /* a fresh executor each time: a failed set-up leaves its queues in the executor */
    assert_int_equal(ferry_exec_create_host(&ex, NULL), FERRY_OK);
    ferry_alloc_fail_after(n);
    ferry_status st = ferry_engine_create(&e, m, s, ex, &c);
    ferry_alloc_fail_after(-1);
    if (st == FERRY_OK) break;
    ferry_exec_destroy(ex);
    failures++;
    assert_true(strlen(ferry_last_error()) > 10);
    if (strstr(ferry_last_error(), "for KV cache")) {
      assert_non_null(strstr(ferry_last_error(), "3 sequences x 32 tokens x "));
      assert_non_null(strstr(ferry_last_error(), "bytes per token"));
      named_kv++;
    }
  }
  assert_non_null(e); /* set-up succeeded once the injected failures ran out */
  assert_true(failures > 10);
  assert_true(named_kv >= 1); /* the buffer record, then its memory */
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

/* Multiply a bf16 tensor of a model folder by 2^e in place (exact: only exponents change). */
static void scale_bf16(const char *dir, const char *name, int e) {
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  const struct ferry_store_tensor *t = ferry_store_find(s, name);
  assert_non_null(t);
  assert_int_equal(t->dtype, FERRY_DTYPE_BF16);
  const size_t n = (size_t)(t->nbytes / 2);
  uint16_t *v = malloc(t->nbytes);
  assert_non_null(v);
  assert_int_equal(ferry_store_read_tensor(s, t, v, t->nbytes), FERRY_OK);
  for (size_t i = 0; i < n; i++) {
    uint32_t bits = (uint32_t)v[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    f = ldexpf(f, e);
    memcpy(&bits, &f, 4);
    assert_int_equal(bits & 0xffff, 0); /* still a bf16 value */
    v[i] = (uint16_t)(bits >> 16);
  }
  FILE *fp = fopen(ferry_store_file_path(s, t->file), "r+b");
  assert_non_null(fp);
  assert_int_equal(fseek(fp, (long)t->offset, SEEK_SET), 0);
  assert_int_equal(fwrite(v, 2, n, fp), n);
  assert_int_equal(fclose(fp), 0);
  free(v);
  ferry_store_close(s);
}

/* A bf16 model keeps its KV cache in bf16 by default. Its values pass fp16's 65504 when the
 * value projection is scaled by 2^20 (and the output projection by 2^-20, so the model computes
 * the same function): an fp16 cache turns them into Inf and the logits into NaN, while the bf16
 * cache keeps the logits finite and bit-identical to the unscaled model's (scaling by a power of
 * two is exact in every rounding on the way). */
static void test_bf16_kv_cache(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  char ref_dir[512], big_dir[512];
  snprintf(ref_dir, sizeof ref_dir, "%s/bf16-ref", fx.dir);
  snprintf(big_dir, sizeof big_dir, "%s/bf16-big", fx.dir);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_BF16, .seed = 3};
  assert_int_equal(ferry_model_generate(m, &go, ref_dir, NULL), FERRY_OK);
  assert_int_equal(ferry_model_generate(m, &go, big_dir, NULL), FERRY_OK);
  const int64_t layers = ferry_model_get_config(m)->n_layers;
  ferry_model_close(m);
  for (int64_t l = 0; l < layers; l++) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%lld.self_attn.v_proj.weight", (long long)l);
    scale_bf16(big_dir, name, 20);
    snprintf(name, sizeof name, "model.layers.%lld.self_attn.o_proj.weight", (long long)l);
    scale_bf16(big_dir, name, -20);
  }
  ferry_model *bm = NULL;
  assert_int_equal(ferry_model_open(&bm, big_dir), FERRY_OK);
  assert_int_equal(ferry_model_kv_format(bm, FERRY_KV_AUTO), FERRY_KV_BF16); /* what `model show` prints */
  ferry_model_close(bm);

  struct ferry_serve_summary sum;
  struct logit_log ref = {0}, big = {0}, f16 = {0};
  struct ferry_engine_config c = base_config();
  assert_int_equal(run(ref_dir, c, &ref, &sum), FERRY_OK);
  assert_int_equal(run(big_dir, c, &big, &sum), FERRY_OK);
  assert_int_equal(big.rows, ref.rows);
  for (size_t i = 0; i < big.floats; i++) assert_true(isfinite(big.data[i]));
  assert_memory_equal(big.data, ref.data, ref.floats * sizeof(float));
  c.kv_format = FERRY_KV_FP16; /* the old default for bf16 models */
  assert_int_equal(run(big_dir, c, &f16, &sum), FERRY_OK);
  size_t nonfinite = 0;
  for (size_t i = 0; i < f16.floats; i++) nonfinite += !isfinite(f16.data[i]);
  assert_true(nonfinite > 0);
  free(ref.data);
  free(big.data);
  free(f16.data);
}

/* A quantized model runs offloaded with the same logits as resident, and is close to fp32. */
static void test_quantized_offload(void **state) {
  (void)state;
  size_t n = strlen(fx.dir) + 16;
  char *qdir = malloc(n);
  snprintf(qdir, n, "%s/moe-q4", fx.dir);
  struct ferry_qplan plan;
  assert_int_equal(ferry_quant_plan_parse("expert=int4-g64,attn=int8,default=fp16", &plan), FERRY_OK);
  struct ferry_quantize_report rep;
  assert_int_equal(ferry_model_quantize(fx.moe_dir, qdir, &plan, NULL, &rep), FERRY_OK);
  assert_true(rep.bytes_after * 3 < rep.bytes_before);
  assert_true(rep.cls[FERRY_QCLASS_EXPERT].max_rel_error < 0.15);
  struct logit_log ref = {0}, got = {0}, fp = {0};
  struct ferry_serve_summary sum;
  struct ferry_engine_config c = base_config();
  c.resident_all = 1;
  assert_int_equal(run(qdir, c, &ref, &sum), FERRY_OK);
  assert_int_equal(run(fx.moe_dir, c, &fp, &sum), FERRY_OK);
  struct ferry_engine_config o = base_config();
  o.block_layers = 2;
  o.prefetch_depth = 1;
  o.home_disk = 1;
  uint64_t host_min = 0;
  o.device_budget_bytes = min_device(qdir, o, &host_min);
  o.host_budget_bytes = host_min;
  assert_int_equal(run(qdir, o, &got, &sum), FERRY_OK);
  assert_true(sum.bytes_disk > 0);
  assert_int_equal(got.rows, ref.rows);
  assert_memory_equal(got.data, ref.data, ref.floats * sizeof(float));
  /* close to the fp32 model, not equal to it */
  assert_int_equal(fp.rows, ref.rows);
  double worst = 0;
  int differ = 0;
  for (int64_t r = 0; r < ref.rows; r++) {
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < 256; i++) {
      double a = fp.data[r * 256 + i], b = ref.data[r * 256 + i];
      dot += a * b;
      na += a * a;
      nb += b * b;
      differ |= a != b;
    }
    double cs = dot / (sqrt(na) * sqrt(nb));
    if (1 - cs > worst) worst = 1 - cs;
  }
  assert_true(differ);
  assert_true(worst < 0.05);
  free(ref.data);
  free(got.data);
  free(fp.data);

  /* Claim another group size for one tensor in the metadata: its scales no longer match. */
  ferry_store *qs = NULL;
  assert_int_equal(ferry_store_open(&qs, qdir), FERRY_OK);
  char *file = strdup(ferry_store_file_path(qs, 0));
  ferry_store_close(qs);
  FILE *f = fopen(file, "r+b");
  assert_non_null(f);
  uint64_t hlen = 0;
  assert_int_equal(fread(&hlen, 8, 1, f), 1);
  char *hdr = malloc(hlen + 1);
  assert_int_equal(fread(hdr, 1, hlen, f), hlen);
  hdr[hlen] = '\0';
  char *at = strstr(hdr, "int4-g64");
  assert_non_null(at);
  memcpy(at, "int4-g32", 8);
  fseek(f, 8, SEEK_SET);
  assert_int_equal(fwrite(hdr, 1, hlen, f), hlen);
  fclose(f);
  struct logit_log bad = {0};
  assert_int_equal(run(qdir, c, &bad, &sum), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "do not match"));
  free(hdr);
  free(file);
  free(qdir);
}

/* Expert prefetching never changes the numbers: a predictor that guesses badly (random
 * experts) and one that knows the future (replayed from a first run) give the same logits. */
struct recorded {
  int32_t ids[4096][2];
  int64_t key[4096];
  int n;
};

static void record_routing(void *user, int64_t req, int32_t tok, int32_t layer, int32_t k, const int32_t *ids,
                           const float *w, int32_t n_features, const float *features) {
  (void)w;
  (void)n_features;
  (void)features;
  struct recorded *r = user;
  assert_true(r->n < 4096 && k == 2);
  r->key[r->n] = (req << 32) | ((int64_t)tok << 8) | layer;
  memcpy(r->ids[r->n], ids, 2 * sizeof(int32_t));
  r->n++;
}

static int32_t predict_future(void *user, const struct ferry_expert_predict_request *rq, int32_t *out, int32_t max) {
  const struct recorded *r = user;
  const int32_t k = rq->k;
  int64_t key = (rq->req_id << 32) | ((int64_t)rq->token_index << 8) | rq->target_layer;
  for (int i = 0; i < r->n; i++)
    if (r->key[i] == key) {
      for (int32_t j = 0; j < k && j < max; j++) out[j] = r->ids[i][j];
      return k < max ? k : max;
    }
  return 0;
}

static int32_t predict_random(void *user, const struct ferry_expert_predict_request *rq, int32_t *out, int32_t max) {
  (void)user;
  (void)max;
  out[0] = (int32_t)((rq->req_id * 31 + rq->token_index * 7 + rq->layer_now * 3 + rq->target_layer) % 8);
  return rq->k > 0 ? 1 : 0;
}

/* Gate lookahead on real weights: a model whose layer-1 router is a copy of layer 0's, so the
 * lookahead logits of layer 1 at layer 0 are layer 0's own router logits and their top-k must
 * be exactly the experts layer 0 chose; layer 2's router differs from layer 1's, so at layer 1
 * they must not always agree (a stand-in using the current router would). Logits stay
 * bit-identical to a resident run. */
struct lookahead_check {
  int32_t n_experts;
  int64_t calls, same_router_calls, agree, other_calls, other_agree;
};

static int32_t predict_lookahead(void *user, const struct ferry_expert_predict_request *rq, int32_t *out, int32_t max) {
  const int32_t k = rq->k, now = rq->layer_now, target = rq->target_layer;
  const int32_t *ids_now = rq->ids_now;
  const float *look = rq->lookahead_logits;
  struct lookahead_check *c = user;
  assert_non_null(look);
  c->calls++;
  /* top-k of the lookahead logits, best first */
  int32_t top[16];
  assert_true(k <= 16);
  for (int32_t r = 0; r < k; r++) {
    int32_t best = -1;
    for (int32_t x = 0; x < c->n_experts; x++) {
      assert_true(isfinite(look[x]));
      int taken = 0;
      for (int32_t q = 0; q < r; q++) taken |= top[q] == x;
      if (!taken && (best < 0 || look[x] > look[best])) best = x;
    }
    top[r] = best;
  }
  int all = 1;
  for (int32_t r = 0; r < k; r++) {
    int found = 0;
    for (int32_t q = 0; q < k; q++) found |= ids_now[q] == top[r];
    all &= found;
  }
  if (now == 0 && target == 1) {
    c->same_router_calls++;
    c->agree += all;
  } else if (now == 1 && target == 2) {
    c->other_calls++;
    c->other_agree += all;
  }
  int32_t n = k < max ? k : max;
  memcpy(out, top, (size_t)n * sizeof *out);
  return n;
}

static void copy_router(const char *dir, int32_t from_layer, int32_t to_layer) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  assert_int_equal(ferry_model_open(&m, dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  const struct ferry_store_tensor *src = NULL, *dst = NULL;
  for (size_t i = 0; i < ferry_model_tensor_count(m); i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    if (t->role != FERRY_ROLE_ROUTER) continue;
    if (t->layer == from_layer) src = ferry_store_find(s, t->name);
    if (t->layer == to_layer) dst = ferry_store_find(s, t->name);
  }
  assert_non_null(src);
  assert_non_null(dst);
  assert_int_equal(src->nbytes, dst->nbytes);
  void *buf = malloc(src->nbytes);
  assert_non_null(buf);
  assert_int_equal(ferry_store_read_tensor(s, src, buf, src->nbytes), FERRY_OK);
  FILE *f = fopen(ferry_store_file_path(s, dst->file), "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, (long)dst->offset, SEEK_SET), 0);
  assert_int_equal(fwrite(buf, 1, src->nbytes, f), src->nbytes);
  assert_int_equal(fclose(f), 0);
  free(buf);
  ferry_store_close(s);
  ferry_model_close(m);
}

static void test_gate_lookahead_uses_next_router(void **state) {
  (void)state;
  char *dir = gen_model("tiny-moe", "moe-lookahead", 0.5);
  copy_router(dir, 0, 1);
  struct logit_log ref = {0};
  struct ferry_serve_summary sum;
  struct ferry_engine_config c = base_config();
  c.resident_all = 1;
  assert_int_equal(run(dir, c, &ref, &sum), FERRY_OK);
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, dir), FERRY_OK);
  struct lookahead_check chk = {.n_experts = (int32_t)ferry_model_get_config(m)->n_experts};
  ferry_model_close(m);
  for (int depth = 1; depth <= 2; depth++) {
    struct logit_log got = {0};
    struct ferry_engine_config o = base_config();
    o.block_layers = 1;
    o.prefetch_depth = depth;
    o.router_lookahead = 1;
    o.predict = predict_lookahead;
    o.predict_user = &chk;
    /* the minimum with routers resident is more than without: they moved out of the blocks */
    struct ferry_engine_config plain = o;
    plain.router_lookahead = 0;
    uint64_t with = min_device(dir, o, NULL), without = min_device(dir, plain, NULL);
    assert_true(with != without);
    o.device_budget_bytes = with + 6 * 300 * 1024;
    memset(&chk.calls, 0, sizeof chk - offsetof(struct lookahead_check, calls));
    assert_int_equal(run(dir, o, &got, &sum), FERRY_OK);
    assert_memory_equal(got.data, ref.data, ref.floats * sizeof(float));
    assert_true(sum.prefetches > 0);
    assert_true(chk.same_router_calls > 0);
    assert_int_equal(chk.agree, chk.same_router_calls);
    assert_true(chk.other_calls > 0);
    assert_true(chk.other_agree < chk.other_calls);
    free(got.data);
  }
  free(ref.data);
  free(dir);
}

/* Predictor features from the activations: recorded per token through on_routing, the same at
 * every layer, equal between a resident and an offloaded run, and matching an independent
 * computation where one is possible (embedding variance, sequence length, segment position). */
#define FEAT_REQ 4
#define FEAT_TOK 64
struct feature_log {
  int32_t n_features;
  float f[FEAT_REQ][FEAT_TOK][7];
  int seen[FEAT_REQ][FEAT_TOK];
  int32_t tokens[FEAT_REQ][FEAT_TOK];
  int32_t n_tokens[FEAT_REQ];
  int64_t mismatched_layers;
};

static void record_features(void *user, int64_t req, int32_t tok, int32_t layer, int32_t k, const int32_t *ids,
                            const float *w, int32_t n_features, const float *features) {
  (void)layer, (void)k, (void)ids, (void)w;
  struct feature_log *fl = user;
  assert_non_null(features);
  assert_int_equal(n_features, fl->n_features);
  assert_true(req >= 0 && req < FEAT_REQ && tok >= 0 && tok < FEAT_TOK);
  if (!fl->seen[req][tok]) {
    memcpy(fl->f[req][tok], features, (size_t)n_features * sizeof(float));
    fl->seen[req][tok] = 1;
  } else if (memcmp(fl->f[req][tok], features, (size_t)n_features * sizeof(float))) {
    fl->mismatched_layers++;
  }
}

static void feature_tokens(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens,
                           const float *logits, int64_t vocab) {
  (void)tok, (void)logits, (void)vocab;
  struct feature_log *fl = user;
  assert_true(req >= 0 && req < FEAT_REQ && n_tokens <= FEAT_TOK);
  memcpy(fl->tokens[req], tokens, (size_t)n_tokens * sizeof *tokens);
  fl->n_tokens[req] = n_tokens;
}

static void run_features(const char *dir, struct ferry_engine_config c, struct feature_log *fl) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  memset(fl, 0, sizeof *fl);
  fl->n_features = c.token_features;
  assert_int_equal(ferry_model_open(&m, dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes, .compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  c.on_routing = record_features;
  c.on_routing_user = fl;
  c.on_logits = feature_tokens;
  c.logits_user = fl;
  assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_OK);
  struct ferry_run_options ro = {.as_fast_as_possible = 1};
  assert_int_equal(ferry_engine_run(e, requests, N_REQ, &ro), FERRY_OK);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

/* Variance of the values of embedding rows tokens[from..to]. */
static double emb_variance(const float *table, int64_t H, const int32_t *tokens, int32_t from, int32_t to) {
  double sum = 0, sumsq = 0, n = 0;
  for (int32_t i = from; i <= to; i++)
    for (int64_t j = 0; j < H; j++) {
      double v = table[(int64_t)tokens[i] * H + j];
      sum += v;
      sumsq += v * v;
      n++;
    }
  double mean = sum / n;
  return sumsq / n - mean * mean;
}

static void test_token_features(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  assert_int_equal(ferry_model_open(&m, fx.moe_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, fx.moe_dir), FERRY_OK);
  const int64_t H = ferry_model_get_config(m)->hidden;
  const struct ferry_store_tensor *emb = NULL;
  for (size_t i = 0; i < ferry_model_tensor_count(m); i++)
    if (ferry_model_tensor(m, i)->role == FERRY_ROLE_EMBED) emb = ferry_store_find(s, ferry_model_tensor(m, i)->name);
  assert_non_null(emb);
  assert_int_equal(emb->dtype, FERRY_DTYPE_F32);
  float *table = malloc(emb->nbytes);
  assert_non_null(table);
  assert_int_equal(ferry_store_read_tensor(s, emb, table, emb->nbytes), FERRY_OK);

  static struct feature_log resident, offloaded;
  struct ferry_engine_config c = base_config();
  c.token_features = FERRY_MLP3_FEATURES;
  c.resident_all = 1;
  run_features(fx.moe_dir, c, &resident);
  struct ferry_engine_config o = base_config();
  o.token_features = FERRY_MLP3_FEATURES;
  o.block_layers = 1;
  o.prefetch_depth = 1;
  o.device_budget_bytes = min_device(fx.moe_dir, o, NULL);
  run_features(fx.moe_dir, o, &offloaded);
  assert_int_equal(resident.mismatched_layers, 0);
  int64_t checked = 0;
  for (int r = 0; r < N_REQ; r++) {
    const int32_t seq_len = requests[r].prompt_tokens + requests[r].output_tokens;
    float want_len[FERRY_MLP3_FEATURES];
    ferry_predictor_features_mlp3(0, 0, seq_len, want_len);
    /* every input token of the request was routed */
    for (int32_t t = 0; t < seq_len - 1; t++) {
      assert_true(resident.seen[r][t]);
      assert_memory_equal(resident.f[r][t], offloaded.f[r][t], FERRY_MLP3_FEATURES * sizeof(float));
      const float *f = resident.f[r][t];
      assert_true(isfinite(f[0]) && f[0] > 0);
      double want = emb_variance(table, H, resident.tokens[r], 0, t < 4 ? t : 4);
      assert_true(fabs(f[1] - want) <= 1e-5 * fabs(want) + 1e-9);
      assert_true(f[2] == want_len[2]);
      checked++;
    }
  }
  assert_true(checked > 20);

  /* mlp7: segment statistics of the per-token embedding variance, segment position */
  c.token_features = FERRY_MLP7_FEATURES;
  run_features(fx.moe_dir, c, &resident);
  for (int r = 0; r < N_REQ; r++) {
    const int32_t seq_len = requests[r].prompt_tokens + requests[r].output_tokens;
    double sum = 0;
    for (int32_t t = 0; t < seq_len - 1; t++) {
      const float *f = resident.f[r][t];
      sum += emb_variance(table, H, resident.tokens[r], t, t);
      assert_true(fabs(f[2] - sum / (t + 1)) <= 1e-5 * fabs(sum / (t + 1)) + 1e-9);
      float want[FERRY_MLP7_FEATURES];
      float norms[1] = {0}, vars[1] = {0};
      ferry_predictor_features_mlp7(norms, vars, 1, seq_len, t, want);
      assert_true(f[4] == want[4] && f[5] == want[5] && f[6] == want[6]);
      assert_true(f[0] > 0);
    }
  }
  free(table);
  ferry_store_close(s);
  ferry_model_close(m);
}

static void test_predictors_keep_logits(void **state) {
  (void)state;
  struct logit_log ref = {0};
  struct ferry_serve_summary sum;
  static struct recorded rec;
  memset(&rec, 0, sizeof rec);
  struct ferry_engine_config c = base_config();
  c.resident_all = 1;
  c.on_routing = record_routing;
  c.on_routing_user = &rec;
  assert_int_equal(run(fx.moe_dir, c, &ref, &sum), FERRY_OK);
  assert_true(rec.n > 0);
  ferry_expert_predict_fn fns[] = {predict_future, predict_random};
  int64_t used[2];
  for (int i = 0; i < 2; i++) {
    struct logit_log got = {0};
    struct ferry_engine_config o = base_config();
    o.block_layers = 1;
    o.prefetch_depth = 2;
    o.predict = fns[i];
    o.predict_user = &rec;
    o.device_budget_bytes = min_device(fx.moe_dir, o, NULL) + 6 * 300 * 1024;
    assert_int_equal(run(fx.moe_dir, o, &got, &sum), FERRY_OK);
    assert_memory_equal(got.data, ref.data, ref.floats * sizeof(float));
    assert_true(sum.prefetches > 0);
    used[i] = sum.prefetches_used * 100 / sum.prefetches;
    free(got.data);
  }
  /* knowing the future makes better guesses than chance */
  assert_true(used[0] > used[1]);
  struct logit_log got = {0};
  struct ferry_engine_config o = base_config();
  o.expert_no_reuse = 1;
  o.device_budget_bytes = min_device(fx.moe_dir, o, NULL) + 6 * 300 * 1024;
  assert_int_equal(run(fx.moe_dir, o, &got, &sum), FERRY_OK);
  assert_memory_equal(got.data, ref.data, ref.floats * sizeof(float));
  assert_int_equal(sum.hits, 0);
  free(got.data);
  free(ref.data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dense_offload_bit_identical),
      cmocka_unit_test(test_moe_offload_bit_identical),
      cmocka_unit_test(test_qwen2_moe_and_olmoe_offload),
      cmocka_unit_test(test_fill_budget),
      cmocka_unit_test(test_budget_below_minimum_refused),
      cmocka_unit_test(test_block_slots),
      cmocka_unit_test(test_resident_attention_streams_ffn),
      cmocka_unit_test(test_stream_embeddings_same_logits),
      cmocka_unit_test(test_request_too_long_rejected),
      cmocka_unit_test(test_kv_bounded_and_alloc_failures_named),
      cmocka_unit_test(test_bf16_kv_cache),
      cmocka_unit_test(test_quantized_offload),
      cmocka_unit_test(test_predictors_keep_logits),
      cmocka_unit_test(test_gate_lookahead_uses_next_router),
      cmocka_unit_test(test_token_features),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
