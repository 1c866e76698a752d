/* The CPU's workspace of a hybrid run holds only the buffers its ops address (the leading part
 * of the device workspace's layout, laid out first): q, k, v and the attention output for
 * attention over a KV cache in host memory; the experts' input, routing weights, scratch and
 * pair rows for experts on the CPU; everything when whole layers run there. The plan charges
 * that, the host executor allocates that, and the logits stay those of the resident run. When
 * every routed expert runs on the CPU the device's workspace is the rest of the layout only (a
 * window without the experts' own buffers, which the executor contract keeps device ops out of)
 * and the device holds no expert slot. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/model.h"
#include "ferry/store.h"
#include "runtime/engine/engine_impl.h" /* the engine's workspace layout and buffers (check_window) */
#include "testutil.h"

static char *dir, *moe_dir, *dense_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("hybrid_ws");
  const struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 7, .router_skew = 0.5};
  moe_dir = tu_gen_model(dir, "tiny-moe", "moe", &go);
  dense_dir = tu_gen_model(dir, "tiny-dense", "dense", &go);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(moe_dir);
  free(dense_dir);
  return 0;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 11, .output_tokens = 4},
    {.id = 1, .prompt_tokens = 6, .output_tokens = 5},
    {.id = 2, .prompt_tokens = 14, .output_tokens = 3},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))
#define T 16 /* max_step_tokens */

static struct ferry_engine_config config(uint64_t device_budget) {
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = T, .max_seq_tokens = 32, .seed = 5,
                                  .block_layers = 1, .prefetch_depth = 1, .device_budget_bytes = device_budget};
  return c;
}

/* n fp32 elements of one workspace buffer, at the layout's 64-byte alignment (layout_workspace) */
static uint64_t buf(uint64_t n) { return (n * 4 + 63) / 64 * 64; }

/* What a host executor run gave: logits, host bytes in use once the engine is made, each tier's
 * peak and budget. */
struct outcome {
  struct tu_logit_log log;
  uint64_t host_used, host_peak, host_budget, device_peak, device_budget;
};

/* Looks at an engine once it is made, before it runs (optional). */
typedef void (*inspect_fn)(ferry_engine *e, ferry_exec *ex, void *user);

static void run_inspected(const char *model_dir, struct ferry_engine_config c, struct outcome *o, inspect_fn inspect,
                          void *user) {
  memset(o, 0, sizeof *o);
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes,
                                 .host_budget_bytes = c.host_budget_bytes,
                                 .compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  c.on_logits = tu_on_logits;
  c.logits_user = &o->log;
  ferry_status st = ferry_engine_create(&e, m, s, ex, &c);
  if (st != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  uint64_t peak;
  ferry_exec_tier_usage(ex, FERRY_TIER_HOST, &o->host_used, &peak);
  if (inspect) inspect(e, ex, user);
  st = ferry_engine_run(e, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1});
  if (st != FERRY_OK) fail_msg("engine_run: %s", ferry_last_error());
  struct ferry_serve_summary sum;
  ferry_engine_summary(e, &sum);
  assert_int_equal(sum.requests_done, N_REQ);
  o->host_peak = sum.peak_bytes[FERRY_TIER_HOST];
  o->host_budget = sum.budget_bytes[FERRY_TIER_HOST];
  o->device_peak = sum.peak_bytes[FERRY_TIER_DEVICE];
  o->device_budget = sum.budget_bytes[FERRY_TIER_DEVICE];
  if (o->host_budget) assert_true(o->host_peak <= o->host_budget);
  if (o->device_budget) assert_true(o->device_peak <= o->device_budget);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

static void run(const char *model_dir, struct ferry_engine_config c, struct outcome *o) {
  run_inspected(model_dir, c, o, NULL, NULL);
}

/* Every logit within fp32 rounding of the reference's (sums taken in another order). */
static void assert_close(const struct tu_logit_log *ref, const struct tu_logit_log *got) {
  assert_int_equal(ref->n, got->n);
  assert_true(ref->n > 0);
  for (size_t i = 0; i < ref->n; i++)
    if (fabs((double)ref->v[i] - (double)got->v[i]) > 1e-5 * (1.0 + fabs((double)ref->v[i])))
      fail_msg("logit %zu: %g, the resident run's %g", i, (double)got->v[i], (double)ref->v[i]);
}

/* The bytes of a plan line "    LABEL  12.25 KiB ...", as printed (two decimals); -1 when the
 * plan has no such line. */
static double plan_bytes(const char *model_dir, const struct ferry_engine_config *c, const char *label) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  assert_int_equal(ferry_engine_plan_only(m, s, c, f), FERRY_OK);
  fclose(f);
  ferry_store_close(s);
  ferry_model_close(m);
  double v = -1;
  const char *at = strstr(text, label);
  if (at) {
    char unit[8] = "";
    assert_int_equal(sscanf(at + strlen(label), " %lf %7s", &v, unit), 2);
    static const char *units[] = {"B", "KiB", "MiB", "GiB"};
    int i = 0;
    while (i < 4 && strcmp(unit, units[i])) i++;
    assert_true(i < 4);
    v *= (double)(1ull << (10 * i));
  }
  free(text);
  return v;
}

/* A printed figure within its rounding (two decimals of its unit) of the exact bytes. */
static void assert_printed(double printed, uint64_t bytes) {
  if (fabs(printed - (double)bytes) > 0.006 * (bytes >= (1u << 20) ? 1048576.0 : 1024.0))
    fail_msg("the plan prints %.0f bytes, expected %llu", printed, (unsigned long long)bytes);
}

/* --kv-home host: the CPU attends over the host cache and appends to it, addressing q, k, v and
 * the attention output of a step's tokens; the host holds exactly those beside the cache. */
static void test_kv_home_host(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const uint64_t qd = (uint64_t)(mc->n_heads * mc->head_dim), kvd = (uint64_t)(mc->n_kv_heads * mc->head_dim);
  const uint64_t cpu_ws = buf(T * qd) + buf(T * kvd) + buf(T * kvd) + buf(T * qd);
  /* every layer's K and V for max_batch x max_seq_tokens tokens, fp32 */
  const uint64_t host_kv = (uint64_t)mc->n_layers * 2 * 3 * 32 * kvd * 4;
  ferry_model_close(m);

  struct outcome ref, hyb;
  run(dense_dir, config(0), &ref);
  struct ferry_engine_config c = config(0);
  c.kv_home_host = 1;
  assert_printed(plan_bytes(dense_dir, &c, "CPU workspace"), cpu_ws);
  run(dense_dir, c, &hyb);
  assert_close(&ref.log, &hyb.log);
  /* the host memory the run adds: its KV cache and the CPU's four buffers, nothing more */
  assert_int_equal(hyb.host_used - ref.host_used, host_kv + cpu_ws);
  assert_true(hyb.host_peak - ref.host_peak <= host_kv + cpu_ws);
  /* a host budget that leaves less than a whole workspace's copy beside them still runs (the
   * device's workspace is the size a copy of it used to be) */
  const double whole = plan_bytes(dense_dir, &c, "    workspace ");
  assert_true(whole > (double)cpu_ws * 2);
  c.host_budget_bytes = hyb.host_peak + (uint64_t)(whole - (double)cpu_ws) / 2;
  struct outcome tight;
  run(dense_dir, c, &tight);
  assert_true(tight.host_budget > 0);
  assert_int_equal(tight.host_peak, hyb.host_peak);
  assert_close(&ref.log, &tight.log);
  /* --kv-prefill device and --kv-attention device: the same buffers (the CPU appends k and v,
   * and attends the tokens the scratch has no slot for) */
  c.host_budget_bytes = 0;
  c.kv_prefill_device = 1;
  assert_printed(plan_bytes(dense_dir, &c, "CPU workspace"), cpu_ws);
  c.kv_prefill_device = 0;
  c.kv_attention_device = 1;
  assert_printed(plan_bytes(dense_dir, &c, "CPU workspace"), cpu_ws);
  struct outcome att;
  run(dense_dir, c, &att);
  assert_close(&ref.log, &att.log);
  free(ref.log.v);
  free(hyb.log.v);
  free(tight.log.v);
  free(att.log.v);
}

/* Experts on the CPU: their input (the FFN norm), the routing weights, the expert scratch
 * (gathered rows, gate and up), the pairs' rows with the zero row after them, the gathered
 * rows a combine reads and the CPU's sum (fp32 weights: the dequantization slots are empty). */
static void test_experts_on_cpu(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, moe_dir), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  assert_false(mc->parallel_residual);
  const uint64_t H = (uint64_t)mc->hidden, K = (uint64_t)mc->experts_per_token,
                 ei = (uint64_t)mc->expert_intermediate, gate = mc->expert_layout == FERRY_EXPERTS_SPLIT ? ei : 2 * ei;
  const uint64_t cpu_ws = buf(T * H) + buf(T * K) + buf(T * K * H + H) + buf(T * K * H) + buf(T * H) + buf(T * H) +
                          buf(T * gate) + buf(T * ei);
  const uint64_t qd = (uint64_t)(mc->n_heads * mc->head_dim), kvd = (uint64_t)(mc->n_kv_heads * mc->head_dim);
  ferry_model_close(m);

  struct outcome ref, cpu;
  run(moe_dir, config(0), &ref);
  struct ferry_engine_config c = config(3500 << 10);
  c.compute_experts = FERRY_COMPUTE_CPU;
  assert_printed(plan_bytes(moe_dir, &c, "CPU workspace"), cpu_ws);
  run(moe_dir, c, &cpu);
  assert_close(&ref.log, &cpu.log);
  /* with the cache in host memory too: both sets, each once */
  c.kv_home_host = 1;
  assert_printed(plan_bytes(moe_dir, &c, "CPU workspace"), cpu_ws + 2 * buf(T * qd) + 2 * buf(T * kvd));
  struct outcome both;
  run(moe_dir, c, &both);
  assert_close(&ref.log, &both.log);
  free(ref.log.v);
  free(cpu.log.v);
  free(both.log.v);
}

/* A predictor naming expert 0 for every layer. */
static int32_t predict_first(void *user, const struct ferry_expert_predict_request *rq, int32_t *out_ids, int32_t max) {
  (void)user;
  (void)rq;
  if (max < 1) return 0;
  out_ids[0] = 0;
  return 1;
}

/* The layout a run with every routed expert on the CPU was made with, worked out by hand. */
struct window_want {
  uint64_t cpu_only; /* the buffers only the CPU addresses: the device's window starts there */
  double whole;      /* the whole layout as the plan prints it (a device that runs experts) */
};

/* The engine's device workspace is the window past the CPU's own buffers, and a device op that
 * addresses one of them is refused by the executor's contract: the combine over the pairs'
 * gathered rows the device ran before, and the copy of the zero row down. What the device does
 * address (the CPU's sum, the routing weights, the experts' input) is inside its window. */
static void check_window(ferry_engine *e, ferry_exec *ex, void *user) {
  const struct window_want *w = user;
  const int64_t H = e->mc->hidden, K = e->mc->experts_per_token;
  assert_true(e->experts_cpu_only);
  assert_int_equal(e->ws.device_base, w->cpu_only);
  assert_int_equal(ferry_exec_buf_base(e->ws_buf), w->cpu_only);
  assert_int_equal(ferry_exec_buf_base(e->ws_buf) + ferry_exec_buf_size(e->ws_buf), e->ws.total);
  assert_printed(w->whole, e->ws.total);
  /* the CPU's copy: its own buffers and those it shares with the device, from offset 0 */
  assert_int_equal(ferry_exec_buf_base(e->hws_buf), 0);
  assert_true(ferry_exec_buf_size(e->hws_buf) > w->cpu_only && ferry_exec_buf_size(e->hws_buf) < e->ws.total);
  const uint64_t cpu_only[] = {e->ws.expert_out, e->ws.expert_final, e->ws.gather, e->ws.eg, e->ws.eu, e->ws.zero};
  for (size_t i = 0; i < sizeof cpu_only / sizeof cpu_only[0]; i++) assert_true(cpu_only[i] < w->cpu_only);
  const uint64_t shared[] = {e->ws.h, e->ws.topk_w, e->ws.cpu_sum, e->ws.x, e->ws.sout};
  for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) assert_true(shared[i] >= w->cpu_only);

  struct ferry_kernel k = {.kind = FERRY_K_MOE_COMBINE, .name = "moe_combine", .layer = 0, .expert = -1};
  k.y = (struct ferry_ref){e->ws_buf, e->ws.x, FERRY_DTYPE_F32};
  k.aux[0] = (struct ferry_ref){e->ws_buf, e->ws.expert_final, FERRY_DTYPE_F32};
  k.aux[1] = (struct ferry_ref){e->ws_buf, e->ws.topk_w, FERRY_DTYPE_F32};
  k.m = T;
  k.n = H;
  k.top_k = K;
  assert_int_equal(ferry_exec_compute(ex, e->q_compute, &k), FERRY_ERR_RANGE);
  const char *msg = ferry_exec_errmsg(ex);
  if (!tu_contains(msg, "expert outputs") || !tu_contains(msg, "'workspace'") || !tu_contains(msg, "at offsets"))
    fail_msg("unexpected refusal: %s", msg);
  const uint64_t row = (uint64_t)H * 4;
  assert_int_equal(ferry_exec_copy(ex, e->q_h2d, (struct ferry_ref){e->ws_buf, e->ws.zero, FERRY_DTYPE_F32},
                                   (struct ferry_ref){e->hws_buf, e->ws.zero, FERRY_DTYPE_F32}, row),
                   FERRY_ERR_RANGE);
  /* one byte below the window is outside it, its first byte inside */
  assert_int_equal(ferry_exec_copy(ex, e->q_d2h, (struct ferry_ref){e->hws_buf, w->cpu_only - 4, FERRY_DTYPE_F32},
                                   (struct ferry_ref){e->ws_buf, w->cpu_only - 4, FERRY_DTYPE_F32}, 8),
                   FERRY_ERR_RANGE);
  assert_int_equal(ferry_exec_copy(ex, e->q_up, (struct ferry_ref){e->ws_buf, e->ws.cpu_sum, FERRY_DTYPE_F32},
                                   (struct ferry_ref){e->hws_buf, e->ws.cpu_sum, FERRY_DTYPE_F32}, (uint64_t)T * row),
                   FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
}

/* Every routed expert on the CPU (no predictor, no preloading policy): the device's workspace is
 * the layout less the buffers only the CPU's expert ops address (the pairs' rows and the zero
 * row, the gathered rows, the expert scratch; fp32 weights: empty dequantization slots), and no
 * expert slot is needed. experts=auto may run an expert on the device: it keeps both. The run
 * fits a budget below what experts=cpu needed before (auto's minimum, the whole workspace and a
 * slot), its peak within it, its logits the resident run's. */
static void test_experts_all_on_cpu(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, moe_dir), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  assert_int_equal(mc->expert_layout, FERRY_EXPERTS_SPLIT);
  const uint64_t H = (uint64_t)mc->hidden, K = (uint64_t)mc->experts_per_token, ei = (uint64_t)mc->expert_intermediate;
  const uint64_t cpu_only = buf(T * K * H + H) + buf(T * K * H) + buf(T * H) + buf(T * ei) + buf(T * ei);
  /* gate, up and down in fp32, each with the alignment slack a unit counts per range (units.c) */
  const uint64_t expert_bytes = 3 * (H * ei * 4 + 64);
  ferry_model_close(m);

  struct ferry_engine_config c = config(3500 << 10), a = c;
  c.compute_experts = FERRY_COMPUTE_CPU;
  a.compute_experts = FERRY_COMPUTE_AUTO;
  const uint64_t min_cpu = tu_min_device_budget(moe_dir, &c), min_auto = tu_min_device_budget(moe_dir, &a);
  assert_int_equal(min_auto - min_cpu, cpu_only + expert_bytes);
  struct window_want want = {.cpu_only = cpu_only, .whole = plan_bytes(moe_dir, &a, "    workspace ")};
  assert_printed(plan_bytes(moe_dir, &c, "    workspace "), (uint64_t)want.whole - cpu_only);
  assert_true(plan_bytes(moe_dir, &c, "expert cache     0 x") >= 0);
  /* the CPU's copy is the same: the experts' buffers were always in it */
  assert_true(fabs(plan_bytes(moe_dir, &c, "CPU workspace") - plan_bytes(moe_dir, &a, "CPU workspace")) < 1e-9);

  struct outcome ref, cpu;
  run(moe_dir, config(0), &ref);
  c.device_budget_bytes = min_cpu; /* below experts=cpu's former minimum (min_auto) */
  run_inspected(moe_dir, c, &cpu, check_window, &want);
  assert_int_equal(cpu.device_budget, min_cpu);
  assert_true(cpu.device_peak <= min_cpu);
  assert_close(&ref.log, &cpu.log);
  /* a predictor prefetches experts into the cache, where the device runs them: all kept */
  c.predict = predict_first;
  assert_int_equal(tu_min_device_budget(moe_dir, &c), min_auto);
  free(ref.log.v);
  free(cpu.log.v);
}

/* Layers computed on the CPU address every buffer: the whole workspace, as the device's. */
static void test_layers_on_cpu_whole(void **state) {
  (void)state;
  struct ferry_engine_config c = config(1500 << 10);
  c.compute_layers = FERRY_COMPUTE_CPU;
  const double whole = plan_bytes(dense_dir, &c, "    workspace ");
  assert_true(whole > 0);
  assert_true(fabs(plan_bytes(dense_dir, &c, "CPU workspace") - whole) < 1e-9);
  c.compute_layers = FERRY_COMPUTE_GPU;
  c.device_budget_bytes = 0;
  assert_true(plan_bytes(dense_dir, &c, "CPU workspace") < 0); /* not a hybrid run: none */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kv_home_host),
      cmocka_unit_test(test_experts_on_cpu),
      cmocka_unit_test(test_experts_all_on_cpu),
      cmocka_unit_test(test_layers_on_cpu_whole),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
