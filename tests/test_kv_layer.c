/* --kv-home layer and runtime.offload_min_rows: llama.cpp's partial offload (-ngl N) as it ran in
 * March 2024. Each layer's KV cache lives where its weights do (llama_kv_cache_init allocates a
 * layer's K and V in its buffer type): pinned layers on the device, streamed layers in host
 * memory. A streamed layer computed on the CPU attends there; one computed on the device (a
 * prompt batch of at least 32 rows: ggml_backend_cuda_offload_op) sends its new k and v down, the
 * CPU writes them into the host cache, and each sequence's window, those rows included, is copied
 * up for the device to attend over. On the host executor the logits are the all-device run's to
 * the bit, for a dense and an MoE model and Gemma 2's windowed layers (rings), several splits of
 * pinned and streamed layers, layers on the device, on the CPU or placed per step by the rows rule,
 * prefetch 0-2, two micro-batches, and a paged cache with preemption.
 * In the simulator a step's bytes are a hand computation: the weights and the windows up, the
 * new rows down (offloaded steps), or the hidden state down and up (steps on the CPU); the plan
 * holds the device KV only for pinned layers, the host KV for the others; the minimum budgets
 * and --fill-budget charge each layer's cache where it is (a device budget below the whole cache
 * plans when every layer runs on the CPU; pinning a layer costs its weights and its cache), each
 * tier's peak within its budget; and what makes no sense is refused by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

static char *dir, *dense_dir, *moe_dir, *gemma2_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("kvlayer");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 11};
  dense_dir = tu_gen_tiny(dir, "qwen3", &go);     /* 3 layers, 4 heads over 2 KV heads */
  moe_dir = tu_gen_tiny(dir, "qwen3_moe", &go);   /* 4 layers: a dense one, then 8 experts top-2 */
  gemma2_dir = tu_gen_tiny(dir, "gemma2", &go);   /* a window of 4: every other layer's cache a ring */
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(dense_dir);
  free(moe_dir);
  free(gemma2_dir);
  return 0;
}

/* With 16 tokens a step and 3 sequences a batch: prompt steps of 8 rows or more, decode steps of
 * at most 3, and steps mixing decode tokens with prompt chunks. */
static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 5, .output_tokens = 6},  {.id = 1, .prompt_tokens = 7, .output_tokens = 5},
    {.id = 2, .prompt_tokens = 13, .output_tokens = 4}, {.id = 3, .prompt_tokens = 3, .output_tokens = 7},
    {.id = 4, .prompt_tokens = 9, .output_tokens = 3},  {.id = 5, .prompt_tokens = 4, .output_tokens = 5},
    {.id = 6, .prompt_tokens = 14, .output_tokens = 10},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

/* Steps that computed the streamed layers on the device and steps that computed them on the CPU:
 * there, beside the weights of pinned layers' experts, only the hidden state crosses, down and
 * back up (a device step copies windows up and its k and v down). */
struct step_kinds {
  int64_t device, cpu, preemptions;
};

static void count_steps(struct ferry_engine *e, void *user) {
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  struct step_kinds *k = user;
  *k = (struct step_kinds){0};
  struct ferry_serve_summary sum;
  ferry_engine_summary(e, &sum);
  k->preemptions = sum.preemptions;
  for (int64_t i = 0; i < n; i++) {
    const uint64_t moved = sm[i].bytes_h2d - sm[i].bytes_blocks - sm[i].bytes_experts;
    (!sm[i].bytes_blocks && moved * 2 == sm[i].bytes_act ? &k->cpu : &k->device)[0]++;
  }
}

static void expect_same(const struct tu_logit_log *a, const struct tu_logit_log *ref, const char *what) {
  if (a->n != ref->n || memcmp(a->v, ref->v, ref->n * sizeof(float)))
    fail_msg("%s: logits differ from the all-device run's (%zu values, %zu there)", what, a->n, ref->n);
}

static const char *const where_name[] = {"gpu", "cpu", "auto"};

/* Every split (all streamed; the last pinned; the first and the last pinned), every placement of
 * the streamed layers (fetched, on the CPU, by the rows rule: 8 rows or more on the device), with
 * prefetch 0, 1, 2 and two micro-batches: the logits of the cache on the device, to the bit (the
 * same fp32 kernels over the same rows: the device attends over the rows the CPU wrote, copied up
 * as they are). The rows rule puts prompt steps on the device and decode steps on the CPU. */
static void same_logits(const char *model_dir, int32_t n_layers) {
  struct ferry_engine_config base = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 24, .seed = 9,
                                     .greedy = 1, .block_layers = 1};
  struct tu_logit_log ref[2] = {{0}}; /* one batch, two micro-batches (another batching rounds otherwise) */
  for (int i = 0; i < 2; i++) {
    struct ferry_engine_config rc = base;
    rc.resident_all = 1;
    rc.gpu_batches = i + 1;
    rc.on_logits = tu_on_logits;
    rc.logits_user = &ref[i];
    tu_run_host(model_dir, &rc, requests, N_REQ, NULL, NULL);
    assert_true(ref[i].n > 0);
  }
  const int32_t pins[3][2] = {{0, 0}, {0, 1}, {1, 1}}; /* pin_first, pin_last */
  for (int where = FERRY_COMPUTE_GPU; where <= FERRY_COMPUTE_AUTO; where++)
    for (int split = 0; split < 3; split++)
      for (int v = 0; v < 4; v++) {
        struct ferry_engine_config c = base;
        c.kv_home_layer = 1;
        c.compute_layers = (enum ferry_compute_where)where;
        c.rates.offload_min_rows = 8;
        c.pin_first = pins[split][0];
        c.pin_last = pins[split][1] < n_layers ? pins[split][1] : 0;
        c.prefetch_depth = v < 3 ? v : 1;
        c.gpu_batches = v == 3 ? 2 : 1;
        c.device_budget_bytes = tu_min_device_budget(model_dir, &c);
        struct tu_logit_log got = {0};
        struct step_kinds k;
        c.on_logits = tu_on_logits;
        c.logits_user = &got;
        tu_run_host(model_dir, &c, requests, N_REQ, count_steps, &k);
        char what[128];
        snprintf(what, sizeof what, "layers=%s, pins %d/%d, prefetch %d, %d micro-batches", where_name[where],
                 c.pin_first, c.pin_last, c.prefetch_depth, c.gpu_batches);
        expect_same(&got, &ref[c.gpu_batches - 1], what);
        /* the rule placed some steps each way, gpu every step on the device, cpu every one on the CPU */
        if ((where == FERRY_COMPUTE_AUTO && !(k.device > 0 && k.cpu > 0)) || (where == FERRY_COMPUTE_GPU && k.cpu) ||
            (where == FERRY_COMPUTE_CPU && k.device))
          fail_msg("%s: %lld steps computed the streamed layers on the device, %lld on the CPU", what,
                   (long long)k.device, (long long)k.cpu);
        free(got.v);
      }
  free(ref[0].v);
  free(ref[1].v);
}

/* A paged cache (blocks of 4 tokens from a pool of 8, so sequences are preempted and prefilled
 * again): the streamed layers' pools are in host memory, their windows copied up block by block
 * through the sequences' tables; the logits are those of the same pool on the device. With two
 * streamed layers (the dense model) the scratch of 3 sequences x 24 rows (18 KiB in fp32) outgrows
 * their pools of 32 rows: the smallest budget counts it, and one byte less is refused naming it
 * beside the streamed layers' pools in host memory. */
static void paged_logits(const char *model_dir, int scratch_grows) {
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 24, .seed = 9,
                                  .block_layers = 1, .kv_block_tokens = 4, .resident_all = 1};
  struct tu_logit_log ref = {0}, got = {0};
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  c.kv_pool_bytes = 8 * ferry_model_kv_bytes(m, 4, FERRY_KV_AUTO);
  ferry_model_close(m);
  c.on_logits = tu_on_logits;
  c.logits_user = &ref;
  tu_run_host(model_dir, &c, requests, N_REQ, NULL, NULL);
  c.resident_all = 0;
  c.kv_home_layer = 1;
  c.compute_layers = FERRY_COMPUTE_AUTO;
  c.rates.offload_min_rows = 8;
  c.pin_last = 1;
  c.prefetch_depth = 1;
  c.device_budget_bytes = tu_min_device_budget(model_dir, &c) - 1;
  if (scratch_grows) {
    assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    assert_int_equal(ferry_engine_plan_only(m, NULL, &c, devnull), FERRY_ERR_BUDGET);
    fclose(devnull);
    ferry_model_close(m);
    if (!tu_contains(ferry_last_error(), "the pinned layers' and a streamed layer's window of 18.00 KiB, the 2 "
                                         "streamed layers' 16.00 KiB in host memory"))
      fail_msg("%s", ferry_last_error());
  }
  c.device_budget_bytes++;
  c.logits_user = &got;
  struct step_kinds k;
  tu_run_host(model_dir, &c, requests, N_REQ, count_steps, &k);
  expect_same(&got, &ref, "a paged cache");
  assert_true(k.device > 0 && k.cpu > 0 && k.preemptions > 0);
  free(ref.v);
  free(got.v);
}

static void test_same_logits_dense(void **state) {
  (void)state;
  same_logits(dense_dir, 3);
  paged_logits(dense_dir, 1);
}

static void test_same_logits_moe(void **state) {
  (void)state;
  same_logits(moe_dir, 4);
  paged_logits(moe_dir, 0);
}

/* ---- the simulator ---------------------------------------------------------------------- */

/* llama-2-7b on the RTX 3090 Ti with llama.cpp's runtime of early 2024 (fp32 activations cross,
 * an fp16 cache: a K or V row is 32 x 128 x 2 = 8 KiB), the last 30 of 32 layers pinned, layers 0
 * and 1 streamed one at a time without prefetch, placed by the rows rule. */
static struct ferry_engine_config sim_config(int32_t min_rows, int32_t gpu_batches, int32_t max_batch) {
  struct ferry_engine_config c = {.max_batch = max_batch, .max_step_tokens = 1024, .max_seq_tokens = 520, .seed = 1,
                                  .block_layers = 1, .prefetch_depth = 0, .pin_last = 30, .kv_home_layer = 1,
                                  .compute_layers = FERRY_COMPUTE_AUTO, .gpu_batches = gpu_batches,
                                  .device_budget_bytes = 20ull << 30};
  c.rates = (struct ferry_compute_rates){.cpu_flops = 1e15, .cpu_bytes = 1e13, .device_flops = 1e12,
                                         .device_bytes = 1e11, .link_bytes = 1e9, .offload_min_rows = min_rows};
  return c;
}

static ferry_status run_sim(const struct ferry_engine_config *c, const struct ferry_engine_request *req, int64_t n,
                            struct tu_sim_result *r) {
  const struct tu_sim_setup setup = {.hw = "rtx-3090-ti", .runtime = "llama.cpp-2024q1",
                                     .exec = {.device_budget_bytes = c->device_budget_bytes}};
  return tu_sim_serve(&setup, c, req, n, r);
}

/* A (prompt 100, 3 tokens out) and B (prompt 300, 6 out) prefill together; A decodes twice and
 * ends, C (prompt 40, 3 out) then prefills beside B's decode token. */
/* Steps of 32 rows or more fetch layers 0 and 1 and copy up each sequence's window, every row to
 * its last position this step (K and V, fp16), layer by layer; only the new k and v rows cross
 * down (fp32: llama.cpp's k_cur and v_cur). Smaller steps fetch nothing and copy no window: the
 * hidden state goes down before layer 0 and comes back after layer 1. */
static void test_sim_bytes(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const uint64_t kvd = (uint64_t)(mc->n_kv_heads * mc->head_dim), H = (uint64_t)mc->hidden, streamed = 2;
  ferry_model_close(m);
  const uint64_t row = kvd * 2; /* an fp16 K or V row */
  struct tu_sim_result *r = calloc(1, sizeof *r);
  assert_non_null(r);
  /* of tu_kv_sim_schedule's steps the first (400 rows) and the fourth (41) reach the 32-row rule and
   * run on the device; the others (2 rows each) run on the CPU */
  const struct ferry_engine_config c = sim_config(32, 1, 2);
  assert_int_equal(run_sim(&c, tu_kv_sim_requests(), TU_KV_SIM_N, r), FERRY_OK);
  assert_int_equal(r->steps, TU_KV_SIM_STEPS);
  uint64_t blocks = 0;
  for (int64_t s = 0; s < r->steps; s++) {
    const struct ferry_step_metrics *sm = &r->sm[s];
    uint64_t window = 0, tokens = 0;
    for (int i = 0; i < 2; i++) {
      window += (uint64_t)(tu_kv_sim_schedule[s][i].cached + tu_kv_sim_schedule[s][i].tokens);
      tokens += (uint64_t)tu_kv_sim_schedule[s][i].tokens;
    }
    assert_int_equal(sm->tokens, tokens);
    if (tokens >= 32) {
      if (!blocks) blocks = sm->bytes_blocks;
      assert_true(blocks > 0);
      assert_int_equal(sm->bytes_blocks, blocks); /* both streamed layers, whole */
      const uint64_t up = streamed * window * row * 2, down = streamed * tokens * kvd * 4 * 2;
      if (sm->bytes_h2d != blocks + up)
        fail_msg("step %lld: %llu bytes host to device, the layers' %llu and the windows' %llu expected", (long long)s,
                 (unsigned long long)sm->bytes_h2d, (unsigned long long)blocks, (unsigned long long)up);
      assert_int_equal(sm->bytes_act, down); /* k and v down, nothing up */
    } else {
      assert_int_equal(sm->bytes_blocks, 0);
      assert_int_equal(sm->bytes_h2d, tokens * H * 4); /* the hidden state back after layer 1 */
      assert_int_equal(sm->bytes_act, 2 * tokens * H * 4);
    }
    assert_true(sm->bytes_d2h >= sm->bytes_act - (tokens >= 32 ? 0 : tokens * H * 4));
  }
  /* a layer of llama-2-7b in fp16 */
  assert_int_equal(blocks, 2 * (4 * H * H + 3 * H * (uint64_t)11008 + 2 * H) * 2);
  free(r);
}

/* The rule reads a micro-batch's rows (a product's), not the step's: two micro-batches of 20
 * tokens stay on the CPU although the step has 40, one of 40 goes to the device. Without the
 * figure the rates decide (here a CPU so fast that every step stays there). */
static void test_rows_rule(void **state) {
  (void)state;
  struct tu_sim_result *r = calloc(1, sizeof *r);
  assert_non_null(r);
  const struct ferry_engine_request twenty[] = {{.id = 0, .prompt_tokens = 20, .output_tokens = 2},
                                                {.id = 1, .prompt_tokens = 20, .output_tokens = 2}};
  const struct ferry_engine_request forty[] = {{.id = 0, .prompt_tokens = 40, .output_tokens = 2},
                                               {.id = 1, .prompt_tokens = 20, .output_tokens = 2}};
  struct ferry_engine_config c = sim_config(32, 2, 1);
  assert_int_equal(run_sim(&c, twenty, 2, r), FERRY_OK);
  assert_int_equal(r->sm[0].tokens, 40);
  assert_int_equal(r->sm[0].bytes_blocks, 0);
  assert_int_equal(run_sim(&c, forty, 2, r), FERRY_OK);
  assert_int_equal(r->sm[0].tokens, 60);
  assert_true(r->sm[0].bytes_blocks > 0);
  assert_int_equal(r->sm[1].bytes_blocks, 0); /* decode: 1 row a micro-batch */
  c.rates.offload_min_rows = 0;
  assert_int_equal(run_sim(&c, forty, 2, r), FERRY_OK);
  for (int64_t s = 0; s < r->steps; s++) assert_int_equal(r->sm[s].bytes_blocks, 0);
  free(r);
}

/* The plan: the device holds the pinned layers' KV cache and the scratch of one layer's windows,
 * the host the 30 streamed layers' cache; a host budget without room for it is refused, naming it. */
static void test_plan(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  struct ferry_engine_config c = {.max_batch = 1, .max_step_tokens = 1024, .max_seq_tokens = 1025, .block_layers = 1,
                                  .pin_last = 2, .kv_home_layer = 1, .compute_layers = FERRY_COMPUTE_AUTO,
                                  .device_budget_bytes = 20ull << 30, .plan_elem_bytes = {4, 2}, .quant_set = 1};
  assert_int_equal(ferry_quant_plan_parse("int4-g64", &c.quant), FERRY_OK);
  char *text = tu_plan_text(m, NULL, &c);
  /* 2 pinned layers x 1025 rows x 8 KiB x 2, and a scratch of 1025 rows: 48.05 MiB; 30 x 16.02 MiB */
  if (!tu_contains(text, "KV cache         48.05 MiB (1 sequences x 1025 tokens, fp16, of which the attention scratch "
                         "on the device 16.02 MiB: 1 micro-batches x 1 sequences x 1025 tokens x 8192 bytes x 2 (K and "
                         "V; --kv-home layer") ||
      !tu_contains(text, "KV cache (host)  480.47 MiB (1 sequences x 1025 tokens, fp16; 30 streamed layers, "
                         "--kv-home layer)"))
    fail_msg("%s", text);
  free(text);
  /* layers on the CPU only: no scratch (a layer never attends on the device over a host cache) */
  c.compute_layers = FERRY_COMPUTE_CPU;
  text = tu_plan_text(m, NULL, &c);
  if (!tu_contains(text, "KV cache         32.03 MiB (1 sequences x 1025 tokens, fp16)")) fail_msg("%s", text);
  free(text);
  /* 3.09 GiB of streamed weights and 682 MiB of CPU workspace fit 4000 MiB, the cache beside them not:
   * the cache comes first, so a block is homed on disk, where the CPU cannot compute it */
  c.host_budget_bytes = 4000ull << 20;
  FILE *devnull = fopen("/dev/null", "w");
  assert_non_null(devnull);
  assert_int_equal(ferry_engine_plan_only(m, NULL, &c, devnull), FERRY_ERR_BUDGET);
  if (!tu_contains(ferry_last_error(), "is homed on disk (--home disk, or a host budget of 3.91 GiB, of which the KV "
                                       "cache of the 30 streamed layers in host memory takes 480.47 MiB)"))
    fail_msg("%s", ferry_last_error());
  /* a host budget below the cache alone: its minimum names it */
  c.host_budget_bytes = 400ull << 20;
  assert_int_equal(ferry_engine_plan_only(m, NULL, &c, devnull), FERRY_ERR_BUDGET);
  if (!tu_contains(ferry_last_error(), "host budget 400.00 MiB is below the minimum") ||
      !tu_contains(ferry_last_error(), "(KV cache in host memory 480.47 MiB,"))
    fail_msg("%s", ferry_last_error());
  fclose(devnull);
  ferry_model_close(m);
}

/* ---- the budgets: each layer's cache charged where it is ---------------------------------- */

/* llama-2-7b's cache of one layer for one token: K and V rows of 32 heads x 128, fp16 */
#define LAYER_TOKEN_BYTES ((uint64_t)2 * 32 * 128 * 2)
#define GiB (1ull << 30)

/* llama-2-7b, 8 sequences of 4096 tokens (a 16 GiB cache) in steps of 256 tokens (the command's
 * default) with each layer's cache where its weights are, every layer streamed one at a time and
 * computed where `where` says. */
static struct ferry_engine_config budget_config(enum ferry_compute_where where) {
  return (struct ferry_engine_config){.max_batch = 8, .max_step_tokens = 256, .max_seq_tokens = 4096, .seed = 1,
                                      .block_layers = 1, .prefetch_depth = 1, .kv_home_layer = 1,
                                      .compute_layers = where};
}

/* The minimum budgets of c at max_seq_tokens `seq`. */
static void min_at(struct ferry_engine_config c, int32_t seq, uint64_t *dev, uint64_t *host) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  c.max_seq_tokens = seq;
  if (ferry_engine_min_budgets(m, NULL, &c, dev, host) != FERRY_OK) fail_msg("%s", ferry_last_error());
  ferry_model_close(m);
}

/* c's plan (owned), and how many layers it pins on the device. */
static char *plan_of(const struct ferry_engine_config *c, int32_t *pinned) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  char *text = tu_plan_text(m, NULL, c);
  ferry_model_close(m);
  *pinned = 0;
  for (const char *at = strstr(text, "\n    layer "); at; at = strstr(at + 1, "\n    layer ")) {
    const char *eol = strchr(at + 1, '\n'), *pin = strstr(at + 1, "pinned on device");
    *pinned += pin && (!eol || pin < eol);
  }
  return text;
}

/* Serve 8 prompts of 256 tokens in c on the RTX 3090 (at c's budgets); each tier's peak within
 * its budget. */
static void serve_within(const struct ferry_engine_config *c, struct tu_sim_result *r) {
  struct ferry_engine_request req[8];
  for (int i = 0; i < 8; i++) req[i] = (struct ferry_engine_request){.id = i, .prompt_tokens = 256, .output_tokens = 4};
  const struct tu_sim_setup setup = {
      .hw = "rtx-3090",
      .exec = {.device_budget_bytes = c->device_budget_bytes, .host_budget_bytes = c->host_budget_bytes}};
  if (tu_sim_serve(&setup, c, req, 8, r) != FERRY_OK) fail_msg("%s", ferry_last_error());
  for (int t = FERRY_TIER_DEVICE; t <= FERRY_TIER_HOST; t++)
    if (!r->sum.budget_bytes[t] || r->sum.peak_bytes[t] > r->sum.budget_bytes[t])
      fail_msg("tier %d: peak %llu of a budget of %llu", t, (unsigned long long)r->sum.peak_bytes[t],
               (unsigned long long)r->sum.budget_bytes[t]);
}

/* Every layer streamed and computed on the CPU: no layer's cache is on the device, so an 8 GiB
 * budget plans and runs a 16 GiB cache, all of it in host memory (the default device cache, or a
 * plan counting every layer's cache there, refuses it: a minimum of 16.53 GiB). The command's plan
 * and a run of shorter prompts at the same sizes. */
static void test_budget_layers_on_cpu(void **state) {
  (void)state;
  char *out = NULL;
  const int rc = tu_run_ferryf(&out, "sim --model llama-2-7b --hw rtx-3090 --synthetic n=8,prompt=2048,output=16 "
                                     "--max-batch 8 --max-seq-tokens 4096 --device-budget 8GiB --offload-compute "
                                     "layers=cpu --kv-home layer --plan-only");
  if (rc != 0 || !tu_contains(out, "    KV cache         0 B (8 sequences x 4096 tokens, fp16)\n") ||
      !tu_contains(out, "    KV cache (host)  16.00 GiB (8 sequences x 4096 tokens, fp16; 32 streamed layers, "
                        "--kv-home layer)"))
    fail_msg("exit %d: %s", rc, out);
  free(out);
  struct ferry_engine_config c = budget_config(FERRY_COMPUTE_CPU);
  c.device_budget_bytes = 8 * GiB;
  c.host_budget_bytes = 57 * GiB;
  struct tu_sim_result *r = calloc(1, sizeof *r);
  assert_non_null(r);
  serve_within(&c, r);
  const uint64_t cache = 32 * 8 * 4096 * LAYER_TOKEN_BYTES; /* every layer's, in host memory */
  assert_true(r->sum.peak_bytes[FERRY_TIER_HOST] >= cache);
  assert_true(r->sum.peak_bytes[FERRY_TIER_DEVICE] < GiB);
  assert_int_equal(r->sum.requests_done, 8);
  free(r);
}

/* With the first N layers pinned the device holds N layers' caches and the host the others': the
 * minimum budgets grow with max_seq_tokens by exactly that (the workspace and the weights do not
 * depend on it), N x 8 sequences x 2048 more tokens x 16 KiB on the device. A streamed layer the
 * device may compute (layers=gpu, auto) adds the scratch of one layer's windows, 8 sequences of
 * max_seq_tokens rows; the caches of streamed layers computed on the CPU without --kv-home layer
 * are in host memory too. */
static void test_budget_pinned_layers(void **state) {
  (void)state;
  const uint64_t more = 8 * 2048 * LAYER_TOKEN_BYTES; /* one layer's cache, 2048 more tokens */
  static const struct {
    enum ferry_compute_where where;
    int kv_home_layer;
    int32_t window; /* layers' worth of scratch on the device */
  } cases[] = {{FERRY_COMPUTE_CPU, 1, 0}, {FERRY_COMPUTE_CPU, 0, 0}, {FERRY_COMPUTE_AUTO, 1, 1},
               {FERRY_COMPUTE_GPU, 1, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int32_t n = 0; n <= 4; n += 4) {
      struct ferry_engine_config c = budget_config(cases[i].where);
      c.kv_home_layer = cases[i].kv_home_layer;
      c.pin_first = n;
      uint64_t dev[2], host[2];
      min_at(c, 2048, &dev[0], &host[0]);
      min_at(c, 4096, &dev[1], &host[1]);
      if (dev[1] - dev[0] != (uint64_t)(n + cases[i].window) * more || host[1] - host[0] != (uint64_t)(32 - n) * more)
        fail_msg("case %zu, %d pinned: device +%llu, host +%llu", i, n, (unsigned long long)(dev[1] - dev[0]),
                 (unsigned long long)(host[1] - host[0]));
    }
  /* the plan's lines: 4 layers x 8 x 4096 x 16 KiB on the device, 28 in host memory */
  struct ferry_engine_config c = budget_config(FERRY_COMPUTE_CPU);
  c.pin_first = 4;
  c.device_budget_bytes = 8 * GiB;
  int32_t pinned;
  char *text = plan_of(&c, &pinned);
  if (pinned != 4 || !tu_contains(text, "    KV cache         2.00 GiB (8 sequences x 4096 tokens, fp16)\n") ||
      !tu_contains(text, "    KV cache (host)  14.00 GiB (8 sequences x 4096 tokens, fp16; 28 streamed layers"))
    fail_msg("%d pinned: %s", pinned, text);
  free(text);
}

/* The default budget of the RTX 3090 (21.60 GiB) with the layers computed on the CPU fills the
 * budget with the last layers, each taking its weights and its own cache: as many as
 * (budget - the working set) / (one layer's weights and cache), 24 of 32, where charging every
 * layer's cache to the device left room for 13; the run's peaks stay within the budgets. */
static void test_budget_fill(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  const struct ferry_machine_memory rtx3090 = {.gpu_name = "rtx-3090", .gpu_bytes = 24 * GiB,
                                               .gpu_free_bytes = UINT64_MAX, .host_bytes = 64 * GiB};
  for (int kv_home_layer = 0; kv_home_layer <= 1; kv_home_layer++) {
    struct ferry_engine_config c = budget_config(FERRY_COMPUTE_CPU);
    c.kv_home_layer = kv_home_layer;
    struct ferry_budget_plan bp;
    assert_int_equal(ferry_engine_plan_budgets(m, NULL, &rtx3090, &c, &bp), FERRY_OK);
    assert_true(bp.device_defaulted && !bp.fits && c.fill_budget);
    uint64_t none, one, host;
    struct ferry_engine_config last = c;
    last.pin_last = 1;
    min_at(c, 4096, &none, &host);
    min_at(last, 4096, &one, &host);
    const uint64_t layer = one - none, cache = 8 * 4096 * LAYER_TOKEN_BYTES;
    const int64_t fit = (int64_t)((c.device_budget_bytes - none) / layer);
    const int64_t all_cache = ((int64_t)c.device_budget_bytes - (int64_t)none - 32 * (int64_t)cache) /
                              (int64_t)(layer - cache);
    int32_t pinned;
    free(plan_of(&c, &pinned));
    if (pinned != (fit < 32 ? fit : 32) || pinned <= all_cache)
      fail_msg("%d layers pinned in %llu bytes: %lld fit at %llu bytes each, %lld with every cache on the device",
               pinned, (unsigned long long)c.device_budget_bytes, (long long)fit, (unsigned long long)layer,
               (long long)all_cache);
    assert_int_equal(pinned, 24);
    struct tu_sim_result *r = calloc(1, sizeof *r);
    assert_non_null(r);
    serve_within(&c, r);
    free(r);
  }
  ferry_model_close(m);
}

/* What makes no sense is refused, by name. */
static void test_refusals(void **state) {
  (void)state;
  static const struct {
    const char *args;
    int status;
    const char *want;
  } cases[] = {
      {"--kv-home layer --kv-attention device", 1,
       "--kv-home layer: a streamed layer computed on the device attends there over its window copied up"},
      {"--kv-home layer --kv-prefill device", 1, "--kv-prefill and --kv-attention choose for a whole cache"},
      {"--kv-home layer --resident attention --device-budget 4MiB", 1,
       "--kv-home layer keeps a layer's KV cache where its weights are"},
      {"--kv-host-memory pinned", 2, "--kv-host-memory is the memory of a KV cache in host memory: it needs --kv-home "
                                     "host or layer"},
      {"--kv-home gpu", 2, "--kv-home: expected 'device', 'host', 'disk' or 'layer', got 'gpu'"},
  };
  char *out = NULL;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int rc = tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 %s", cases[i].args);
    if (rc != cases[i].status || !tu_contains(out, cases[i].want))
      fail_msg("%s: exit %d: %s", cases[i].args, rc, out);
    free(out);
  }
  assert_int_equal(tu_run_ferryf(&out, "sim --model deepseek-v2-lite --hw h100-pcie --synthetic n=1 --kv-home layer "
                                       "--plan-only"),
                   1);
  if (!tu_contains(out, "--kv-home layer copies windows of K and V rows to the device;") ||
      !tu_contains(out, "latent (MLA) cache is not one"))
    fail_msg("%s", out);
  free(out);
  /* nothing streams: every layer's cache would be on the device, as without it */
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --kv-home layer"), 1);
  if (!tu_contains(out, "--kv-home layer has no effect: tiny-dense fits in the default device budget")) fail_msg("%s", out);
  free(out);
  /* streamed layers with their caches pinned in host memory, fetched every step: it runs */
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --kv-home layer "
                                       "--kv-host-memory pinned --device-budget 24MiB"),
                   0);
  free(out);
}

/* Gemma 2's windowed layers keep rings of 20 rows, which request 6 (to position 23) wraps: a
 * window copied up is the ring as it is, the step's rows in their places. */
static void test_same_logits_windowed(void **state) {
  (void)state;
  same_logits(gemma2_dir, 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_logits_dense), cmocka_unit_test(test_same_logits_moe),
      cmocka_unit_test(test_same_logits_windowed),
      cmocka_unit_test(test_sim_bytes),         cmocka_unit_test(test_rows_rule),
      cmocka_unit_test(test_plan),              cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_budget_layers_on_cpu), cmocka_unit_test(test_budget_pinned_layers),
      cmocka_unit_test(test_budget_fill),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
