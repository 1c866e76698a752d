/* Multi-device runs (engine mgpu.c, executor devices): tensor and pipeline parallel runs on the
 * host executor emulating two devices give the one-device logits, each device within its own
 * budget; the all-reduce kernel sums for real on host and is priced from the profile's
 * interconnect in sim; a simulated tensor parallel decode pays its collectives and beats one GPU. */
#include <math.h>
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
#include "ferry/store.h"
#include "sim/interconnect.h"
#include "testutil.h"

static char *dir, *dense_dir, *moe_dir;
static int placement_hash; /* run_host's expert placement (expert parallel) */

static char *gen(const char *preset, const char *name) {
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 7};
  return tu_gen_model(dir, preset, name, &go);
}

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("multi_gpu");
  dense_dir = gen("tiny-dense", "dense");
  moe_dir = gen("tiny-moe", "moe");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(dense_dir);
  free(moe_dir);
  return 0;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 13, .output_tokens = 5}, {.id = 1, .prompt_tokens = 6, .output_tokens = 7},
    {.id = 2, .prompt_tokens = 9, .output_tokens = 4},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

/* A host run over n devices (parallel p) with budget bytes per device (0: unlimited); its
 * logits in *log and each device's peak in peak[]. */
static void run_host(const char *model_dir, int32_t n, enum ferry_parallel p, uint64_t budget, int32_t gpu_batches,
                     struct tu_logit_log *log, uint64_t *peak) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  struct ferry_exec_config xc = {.device_budget_bytes = budget, .compute_threads = 1, .n_devices = n};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 32, .seed = 5,
                                  .device_budget_bytes = budget, .n_devices = n, .parallel = p,
                                  .gpu_batches = gpu_batches, .on_logits = tu_on_logits, .logits_user = log,
                                  .expert_placement_hash = placement_hash};
  if (ferry_engine_create(&e, m, s, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, requests, N_REQ, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  struct ferry_serve_summary sum;
  ferry_engine_summary(e, &sum);
  assert_int_equal(sum.requests_done, N_REQ);
  assert_int_equal(sum.devices, n);
  for (int32_t d = 0; d < n; d++) ferry_exec_device_usage(ex, d, NULL, &peak[d]);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

/* Each row's largest difference relative to the row's largest logit. */
static double max_rel_diff(const struct tu_logit_log *a, const struct tu_logit_log *b, size_t vocab) {
  double worst = 0;
  for (size_t r = 0; r < a->n / vocab; r++) {
    double big = 0, diff = 0;
    for (size_t i = r * vocab; i < (r + 1) * vocab; i++) {
      const double x = a->v[i] < 0 ? -a->v[i] : a->v[i], d = a->v[i] - b->v[i];
      if (x > big) big = x;
      if ((d < 0 ? -d : d) > diff) diff = d < 0 ? -d : d;
    }
    if (big > 0 && diff / big > worst) worst = diff / big;
  }
  return worst;
}

/* Two emulated devices give the logits of one: pipeline parallel bit for bit (the same ops in
 * the same order, only placed on two devices); tensor parallel within 1e-5 of each row's
 * largest logit, because each device sums its half of every dot product in o_proj and down_proj
 * and the all-reduce adds the halves: fp32 rounds in another order (about 1e-7 per addition,
 * over 8 layers; measured 5e-7). Each device stays within a budget one device could not run in
 * with every weight resident, and holds less than the one device did. */
static void test_host_logits(void **state) {
  (void)state;
  struct tu_logit_log one = {0}, tp = {0}, pp = {0}, one_mb = {0}, pp_mb = {0};
  uint64_t peak1[1], peak_tp[2], peak_pp[2];
  run_host(dense_dir, 1, FERRY_PARALLEL_NONE, 0, 1, &one, peak1);
  const uint64_t budget = peak1[0] * 3 / 4;
  run_host(dense_dir, 2, FERRY_PARALLEL_TP, budget, 1, &tp, peak_tp);
  run_host(dense_dir, 2, FERRY_PARALLEL_PP, budget, 1, &pp, peak_pp);
  /* two micro-batches in flight through the stages (issued stage by stage): the same bits */
  uint64_t peak_mb[2];
  run_host(dense_dir, 1, FERRY_PARALLEL_NONE, 0, 2, &one_mb, peak_mb);
  run_host(dense_dir, 2, FERRY_PARALLEL_PP, 0, 2, &pp_mb, peak_mb);
  assert_true(one_mb.n > 0);
  assert_int_equal(pp_mb.n, one_mb.n);
  assert_memory_equal(pp_mb.v, one_mb.v, one_mb.n * sizeof(float));
  free(one_mb.v);
  free(pp_mb.v);
  assert_true(one.n > 0);
  assert_int_equal(pp.n, one.n);
  assert_memory_equal(pp.v, one.v, one.n * sizeof(float));
  assert_int_equal(tp.n, one.n);
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  const double rel = max_rel_diff(&one, &tp, (size_t)ferry_model_get_config(m)->vocab);
  ferry_model_close(m);
  print_message("tensor parallel: largest logit difference %.3g of the row's largest\n", rel);
  assert_true(rel < 1e-5);
  for (int d = 0; d < 2; d++) {
    assert_true(peak_tp[d] <= budget && peak_tp[d] > 0);
    assert_true(peak_pp[d] <= budget && peak_pp[d] > 0);
  }
  free(one.v);
  free(tp.v);
  free(pp.v);
}

/* Expert parallel on tiny-moe (8 experts, 4 a device; attention tensor parallel): the
 * one-device logits within 1e-5 of each row's largest (the experts' rows are combined per device
 * and the partial sums added by the all-reduce: another order of fp32 additions; measured
 * 3.3e-7), each device within 3/4 of the one-device peak. */
static void test_host_ep(void **state) {
  (void)state;
  struct tu_logit_log one = {0}, ep = {0}, hashed = {0};
  uint64_t peak1[1], peak_ep[2], peak_hash[2];
  run_host(moe_dir, 1, FERRY_PARALLEL_NONE, 0, 1, &one, peak1);
  const uint64_t budget = peak1[0] * 3 / 4;
  run_host(moe_dir, 2, FERRY_PARALLEL_EP, budget, 1, &ep, peak_ep);
  placement_hash = 1; /* experts by a hash of (layer, expert): as many a device, the same logits */
  run_host(moe_dir, 2, FERRY_PARALLEL_EP, budget, 1, &hashed, peak_hash);
  placement_hash = 0;
  assert_true(one.n > 0);
  assert_int_equal(ep.n, one.n);
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, moe_dir), FERRY_OK);
  const size_t vocab = (size_t)ferry_model_get_config(m)->vocab;
  ferry_model_close(m);
  const double rel = max_rel_diff(&one, &ep, vocab);
  print_message("expert parallel: largest logit difference %.3g of the row's largest\n", rel);
  assert_true(rel < 1e-5);
  for (int d = 0; d < 2; d++) assert_true(peak_ep[d] <= budget && peak_ep[d] > 0);
  assert_int_equal(hashed.n, one.n);
  assert_true(max_rel_diff(&one, &hashed, vocab) < 1e-5);
  for (int d = 0; d < 2; d++) assert_int_equal(peak_hash[d], peak_ep[d]);
  free(one.v);
  free(ep.v);
  free(hashed.v);
}

/* What the model and configuration allow is said, not half run. */
static void test_refusals(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, dense_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, dense_dir), FERRY_OK);
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.compute_threads = 1, .n_devices = 3}), FERRY_OK);
  struct ferry_engine_config c = {.max_batch = 2, .max_step_tokens = 8, .max_seq_tokens = 16, .n_devices = 3,
                                  .parallel = FERRY_PARALLEL_TP};
  const int64_t heads = ferry_model_get_config(m)->n_heads;
  if (heads % 3) { /* tiny-dense's heads are not a multiple of 3 */
    assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_ERR_UNSUPPORTED);
    assert_true(tu_contains(ferry_last_error(), "divide"));
  }
  c.n_devices = 4; /* more than the executor drives */
  assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_ERR_UNSUPPORTED);
  assert_true(tu_contains(ferry_last_error(), "fewer devices"));
  c.n_devices = 2; /* expert parallel needs routed experts */
  c.parallel = FERRY_PARALLEL_EP;
  assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_ERR_UNSUPPORTED);
  assert_true(tu_contains(ferry_last_error(), "dense models"));
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

/* An all-reduce over an interconnect as NCCL 2.18's tuner prices it (src/graph/tuning.cc), by
 * hand: latency (base + 2 (n - 1) hops) + bytes / algorithm bandwidth, the fastest of ring and
 * tree with LL, LL128 and Simple. */
static void test_nccl_allreduce_model(void **state) {
  (void)state;
  struct ferry_hw_profile p;
  memset(&p, 0, sizeof p);
  p.has_interconnect = 1;
  p.interconnect = (struct ferry_hw_interconnect){.gpus = 8, .gpu_gbps = 450, .switched = 1, .nvlink = 1};
  /* NVLink: NCCL counts 20 of each link's 25 GB/s: a bus of 360 GB/s. 64 MiB over 8 GPUs: ring
   * Simple, 8.4 + 14 x 3.4 us and 360 x 8 / 14 GB/s (LL128: 14 + 14 x 1.9 us at 0.92 of that) */
  const double bus = 450 * 20.0 / 25.0, big = 67108864;
  const double simple_us = 8.4 + 14 * 3.4 + big / (1000 * bus * 8 / 14);
  assert_int_equal(ferry__ic_allreduce_ns(&p, 8, (uint64_t)big), (int64_t)(simple_us * 1e3 + 0.5));
  assert_true(simple_us < 14 + 14 * 1.9 + big / (1000 * bus * 0.92 * 8 / 14));
  /* 2 KiB: ring LL, 6.6 + 14 x 0.6 us at min(87.7, 360 / 4) x 8 / 14 GB/s */
  const double ll_us = 6.6 + 14 * 0.6 + 2048 / (1000 * 87.7 * 8 / 14);
  assert_int_equal(ferry__ic_allreduce_ns(&p, 8, 2048), (int64_t)(ll_us * 1e3 + 0.5));
  /* PCIe, no switch: 4 GPUs share 29.225 GB/s, PCI hops (ring Simple 5.7 us), no LL128; 1 MiB */
  p.interconnect = (struct ferry_hw_interconnect){.gpus = 4, .gpu_gbps = 29.225, .switched = 0, .nvlink = 0};
  const double pci_us = 8.4 + 6 * 5.7 + 1048576 / (1000 * 29.225 / 4 * 4 / 6);
  assert_int_equal(ferry__ic_allreduce_ns(&p, 4, 1048576), (int64_t)(pci_us * 1e3 + 0.5));
  /* one device: nothing to reduce */
  assert_int_equal(ferry__ic_allreduce_ns(&p, 1, 1048576), 0);
  /* `ferry hw kernel` prices the same through the sim executor; more GPUs than the machine has
   * are refused */
  char *out = NULL;
  assert_int_equal(tu_run_ferry("hw kernel 8xh100-sxm \"allreduce devices=8 bytes=2048\"", &out), 0);
  assert_true(fabs(strtod(out, NULL) - ll_us) < 0.002);
  free(out);
  out = NULL;
  assert_int_not_equal(tu_run_ferry("hw kernel 4xl40s \"allreduce devices=8 bytes=2048\"", &out), 0);
  assert_true(tu_contains(out, "the machine holds 4 GPUs"));
  free(out);
}

/* The ALLREDUCE kernel: every device gets the sum, added in device order; partials on one
 * device are refused. */
static void test_allreduce_host(void **state) {
  (void)state;
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.compute_threads = 1, .n_devices = 3,
                                                                             .device_budget_bytes = 4096}),
                   FERRY_OK);
  assert_int_equal(ferry_exec_device_count(ex), 3);
  ferry_buf *b[3], *extra = NULL;
  int32_t q;
  assert_int_equal(ferry_exec_queue_create_on(ex, FERRY_QUEUE_COMPUTE, 0, &q), FERRY_OK);
  for (int d = 0; d < 3; d++) {
    assert_int_equal(ferry_exec_alloc_on(ex, d, FERRY_TIER_DEVICE, 4000, "partials", &b[d]), FERRY_OK);
    assert_int_equal(ferry_exec_buf_device(b[d]), d);
    float *v = ferry_exec_buf_host_ptr(ex, b[d]);
    for (int i = 0; i < 1000; i++) v[i] = (float)(i * (d + 1));
  }
  /* each device has its own budget: a fourth buffer over device 1's is refused */
  assert_int_equal(ferry_exec_alloc_on(ex, 1, FERRY_TIER_DEVICE, 200, "over", &extra), FERRY_ERR_BUDGET);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "device 1"));
  struct ferry_kernel k = {.kind = FERRY_K_ALLREDUCE, .name = "allreduce", .layer = -1, .expert = -1, .m = 3, .n = 1000};
  k.x = (struct ferry_ref){b[0], 0, FERRY_DTYPE_F32};
  k.aux[0] = (struct ferry_ref){b[1], 0, FERRY_DTYPE_F32};
  k.aux[1] = (struct ferry_ref){b[2], 0, FERRY_DTYPE_F32};
  assert_int_equal(ferry_exec_compute(ex, q, &k), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  for (int d = 0; d < 3; d++) {
    const float *v = ferry_exec_buf_host_ptr(ex, b[d]);
    for (int i = 0; i < 1000; i += 97) assert_true(v[i] == (float)(6 * i));
  }
  k.aux[1] = k.aux[0]; /* two partials on device 1 */
  assert_int_equal(ferry_exec_compute(ex, q, &k), FERRY_ERR_INVALID);
  uint64_t used, peak;
  ferry_exec_device_usage(ex, 2, &used, &peak);
  assert_int_equal(used, 4000);
  ferry_exec_destroy(ex);
}

/* A profile file: 8xh100-sxm with its interconnect's rate replaced (NULL: as it is). */
static char *profile_with_gbps(const char *gbps) {
  char *src = tu_data_path("../../hw/8xh100-sxm.json");
  FILE *f = fopen(src, "rb");
  assert_non_null(f);
  static char text[1 << 16];
  const size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  free(src);
  text[n] = '\0';
  char *at = strstr(text, "\"gpu_gbps\": 450");
  assert_non_null(at);
  size_t len = strlen(dir) + 32;
  char *path = malloc(len);
  snprintf(path, len, "%s/ic-%s.json", dir, gbps); /* a profile file may be named as it likes */
  f = fopen(path, "wb");
  assert_non_null(f);
  fwrite(text, 1, (size_t)(at - text), f);
  fprintf(f, "\"gpu_gbps\": %s%s", gbps, at + strlen("\"gpu_gbps\": 450"));
  fclose(f);
  return path;
}

struct sim_result {
  double tpot_ns, ttft_ns;
  int64_t allreduce_ns, allreduces;
  int64_t peer_ns, peer_copies; /* GPU-to-GPU copies (pipeline hand-offs) */
  uint64_t peak, budget;        /* the fullest device's peak, each device's budget */
  int32_t expert_queue[32 * 8]; /* Mixtral: the queue each (layer, expert) last ran on, -1: none */
};

static void on_activity(void *user, const struct ferry_activity *a) {
  struct sim_result *r = user;
  if (a->kind == FERRY_ACT_KERNEL && a->name && !strcmp(a->name, "allreduce")) {
    r->allreduce_ns += a->end_ns - a->start_ns;
    r->allreduces++;
  }
  if (a->kind == FERRY_ACT_KERNEL && a->name && !strcmp(a->name, "expert") && a->layer >= 0 && a->layer < 32 &&
      a->expert >= 0 && a->expert < 8)
    r->expert_queue[a->layer * 8 + a->expert] = a->queue;
  if (a->kind == FERRY_ACT_MEMCPY && a->copy_kind == FERRY_COPY_PTOP) {
    r->peer_ns += a->end_ns - a->start_ns;
    r->peer_copies++;
  }
}

/* A simulated decode-heavy run of a model preset over n GPUs of a profile (synthetic routing for
 * an MoE model; hash: expert parallel's hashed placement); one GPU offloads what does not fit
 * its budget (90 % of its memory). */
static struct sim_result run_model_placed(const char *profile, const char *model, int32_t n, enum ferry_parallel p,
                                          int32_t gpu_batches, int hash) {
  ferry_hw *hw = NULL;
  ferry_model *m = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  ferry_routing_synth *synth = NULL;
  struct sim_result r = {0};
  for (int i = 0; i < 32 * 8; i++) r.expert_queue[i] = -1;
  assert_int_equal(ferry_hw_open(&hw, profile), FERRY_OK);
  assert_int_equal(ferry_model_open(&m, model), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const uint64_t budget = ferry_hw_get(hw)->gpu.memory_bytes / 10 * 9;
  struct ferry_exec_config xc = {.lock_host_memory = 1, .n_devices = n, .sim_mode = FERRY_SIM_FAST,
                                 .device_budget_bytes = budget};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  ferry_exec_set_sink(ex, on_activity, &r);
  struct ferry_engine_config c = {.max_batch = 4, .max_step_tokens = 256, .max_seq_tokens = 512, .seed = 3,
                                  .n_devices = n, .parallel = p, .device_budget_bytes = budget,
                                  .gpu_batches = gpu_batches, .expert_placement_hash = hash};
  if (mc->n_experts) {
    struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                            .top_k = (int32_t)mc->experts_per_token, .seed = 9};
    assert_int_equal(ferry_routing_synth_create(&synth, &sc), FERRY_OK);
    c.routing = ferry_routing_synth_fn;
    c.routing_user = synth;
  }
  struct ferry_engine_request req[16];
  for (int i = 0; i < 16; i++) req[i] = (struct ferry_engine_request){.id = i, .prompt_tokens = 64, .output_tokens = 24};
  const int64_t n_req = 4 * (gpu_batches > 1 ? gpu_batches : 1); /* a batch of 4 per micro-batch */
  if (ferry_engine_create(&e, m, NULL, ex, &c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, req, n_req, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  struct ferry_serve_summary sum;
  ferry_engine_summary(e, &sum);
  r.tpot_ns = sum.tpot.mean;
  r.ttft_ns = sum.ttft.mean;
  r.peak = sum.peak_bytes[FERRY_TIER_DEVICE];
  r.budget = budget;
  struct ferry_sim_stats ss; /* the executor's own count agrees with the timeline's */
  assert_int_equal(ferry_exec_sim_stats(ex, &ss), FERRY_OK);
  assert_int_equal(ss.allreduces, r.allreduces);
  assert_int_equal(ss.allreduce_ns, r.allreduce_ns);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_routing_synth_free(synth);
  ferry_model_close(m);
  ferry_hw_close(hw);
  return r;
}

static struct sim_result run_model(const char *profile, const char *model, int32_t n, enum ferry_parallel p,
                                   int32_t gpu_batches) {
  return run_model_placed(profile, model, n, p, gpu_batches, 0);
}

static struct sim_result run_sim(const char *profile, int32_t n, enum ferry_parallel p) {
  return run_model(profile, "llama-3-8b", n, p, 1);
}

/* The simulator prices tensor parallel with the interconnect: two all-reduces a layer appear,
 * they take longer over half the NVLink rate and longer still through the host link (a profile
 * without an interconnect), and splitting a memory-bound decode over two GPUs beats one. */
static void test_sim_tp(void **state) {
  (void)state;
  char *full = profile_with_gbps("450"), *half = profile_with_gbps("225");
  const struct sim_result one = run_sim(full, 1, FERRY_PARALLEL_NONE), tp = run_sim(full, 2, FERRY_PARALLEL_TP),
                          tp_half = run_sim(half, 2, FERRY_PARALLEL_TP);
  const struct sim_result via_host = run_sim("h100-sxm", 2, FERRY_PARALLEL_TP);
  print_message("TPOT 1 GPU %.3f ms, TP-2 %.3f ms; all-reduce %.3f ms (NVLink), %.3f ms (half rate), %.3f ms (host)\n",
                one.tpot_ns / 1e6, tp.tpot_ns / 1e6, (double)tp.allreduce_ns / 1e6, (double)tp_half.allreduce_ns / 1e6,
                (double)via_host.allreduce_ns / 1e6);
  assert_int_equal(one.allreduces, 0);
  assert_true(tp.allreduces > 0 && tp.allreduces % (2 * 32) == 0); /* two per layer of each step */
  assert_int_equal(tp_half.allreduces, tp.allreduces);
  assert_true(tp_half.allreduce_ns > tp.allreduce_ns);
  assert_true(via_host.allreduce_ns > tp_half.allreduce_ns);
  assert_true(tp.tpot_ns < one.tpot_ns);
  free(full);
  free(half);
}

/* A runtime whose other GPUs are worker processes (graph-ray: Ray actors) costs the host
 * worker_step_ns more per step on two GPUs and nothing more on one: a decode step, which waits
 * for the previous one's sampling, takes that much longer. */
static void test_sim_worker_step(void **state) {
  (void)state;
  const struct sim_result one = run_sim("8xh100-sxm+runtime=graph", 1, FERRY_PARALLEL_NONE),
                          one_ray = run_sim("8xh100-sxm+runtime=graph-ray", 1, FERRY_PARALLEL_NONE),
                          tp = run_sim("8xh100-sxm+runtime=graph", 2, FERRY_PARALLEL_TP),
                          tp_ray = run_sim("8xh100-sxm+runtime=graph-ray", 2, FERRY_PARALLEL_TP);
  ferry_hw *ray = NULL;
  assert_int_equal(ferry_hw_open(&ray, "graph-ray"), FERRY_OK);
  const double worker_ns = (double)ferry_hw_get(ray)->runtime.worker_step_ns;
  ferry_hw_close(ray);
  print_message("TPOT graph / graph-ray: 1 GPU %.3f / %.3f ms, TP-2 %.3f / %.3f ms (worker_step_ns %.3f ms)\n",
                one.tpot_ns / 1e6, one_ray.tpot_ns / 1e6, tp.tpot_ns / 1e6, tp_ray.tpot_ns / 1e6, worker_ns / 1e6);
  assert_true(worker_ns > 0);
  assert_true(one_ray.tpot_ns == one.tpot_ns);
  assert_true(fabs(tp_ray.tpot_ns - tp.tpot_ns - worker_ns) < 1e-3 * worker_ns);
}

/* A runtime that replays CUDA graphs for decode steps only issues a prefilling step's kernels
 * one by one (runtime.prefill_launch_ns): at a millisecond each the prompt waits for its
 * launches, and the decode steps, replayed, cost the same. */
static void test_sim_prefill_eager(void **state) {
  (void)state;
  const struct sim_result graph = run_sim("8xh100-sxm+runtime=graph", 1, FERRY_PARALLEL_NONE),
                          slow = run_sim("8xh100-sxm+runtime=graph+runtime.prefill_launch_ns=1000000", 1,
                                         FERRY_PARALLEL_NONE);
  print_message("graph: TTFT %.3f ms, TPOT %.3f ms; prefill launches at 1 ms: TTFT %.3f ms, TPOT %.3f ms\n",
                graph.ttft_ns / 1e6, graph.tpot_ns / 1e6, slow.ttft_ns / 1e6, slow.tpot_ns / 1e6);
  assert_true(slow.tpot_ns == graph.tpot_ns);
  /* the prompts' step is launch-bound: 32 layers of several kernels at 1 ms each (the weights'
   * first load, which the launches at 15 us hide under, is shorter) */
  assert_true(slow.ttft_ns >= 32 * 4 * 1e6 && slow.ttft_ns > graph.ttft_ns);
  /* the eager step's host work per layer (runtime.prefill_layer_ns) alike: 32 layers at 10 ms
   * each, nothing of it in a decode step */
  const struct sim_result layers = run_sim("8xh100-sxm+runtime=graph+runtime.prefill_layer_ns=10000000", 1,
                                           FERRY_PARALLEL_NONE);
  print_message("prefill host work at 10 ms a layer: TTFT %.3f ms, TPOT %.3f ms\n", layers.ttft_ns / 1e6,
                layers.tpot_ns / 1e6);
  assert_true(layers.tpot_ns == graph.tpot_ns);
  assert_true(layers.ttft_ns >= 32 * 10 * 1e6 && layers.ttft_ns > graph.ttft_ns);
}

/* Pipeline parallel: one hand-off of the hidden states per step between the two stages, over
 * the interconnect (longer at a hundredth of its rate), and no all-reduce; with four
 * micro-batches in flight the stages overlap and a step takes less than on one GPU. */
static void test_sim_pp(void **state) {
  (void)state;
  char *full = profile_with_gbps("450"), *slow = profile_with_gbps("4.5");
  const struct sim_result pp = run_sim(full, 2, FERRY_PARALLEL_PP), pp_slow = run_sim(slow, 2, FERRY_PARALLEL_PP);
  print_message("PP-2: %lld hand-offs, %.3f ms (NVLink), %.3f ms (1/100 of its rate); TPOT %.3f ms\n",
                (long long)pp.peer_copies, (double)pp.peer_ns / 1e6, (double)pp_slow.peer_ns / 1e6, pp.tpot_ns / 1e6);
  assert_int_equal(pp.allreduces, 0);
  assert_true(pp.peer_copies > 0);
  assert_int_equal(pp_slow.peer_copies, pp.peer_copies);
  assert_true(pp_slow.peer_ns > pp.peer_ns);
  const struct sim_result one_mb = run_model(full, "llama-3-8b", 1, FERRY_PARALLEL_NONE, 4);
  const struct sim_result pp_mb = run_model(full, "llama-3-8b", 2, FERRY_PARALLEL_PP, 4);
  print_message("4 micro-batches: TPOT 1 GPU %.3f ms, PP-2 %.3f ms\n", one_mb.tpot_ns / 1e6, pp_mb.tpot_ns / 1e6);
  assert_true(pp_mb.tpot_ns < 0.8 * one_mb.tpot_ns);
  free(full);
  free(slow);
}

/* Expert parallel in the simulator: Mixtral-8x7B (87 GiB of fp16 weights) does not fit one H100's
 * budget and streams experts; split over two it is resident (each device within its budget),
 * with two all-reduces a layer, and decodes faster. */
static void test_sim_ep(void **state) {
  (void)state;
  const struct sim_result one = run_model("8xh100-sxm", "mixtral-8x7b", 1, FERRY_PARALLEL_NONE, 1);
  const struct sim_result ep = run_model("8xh100-sxm", "mixtral-8x7b", 2, FERRY_PARALLEL_EP, 1);
  print_message("Mixtral-8x7B TPOT: 1 GPU %.3f ms, EP-2 %.3f ms (peak per device %.2f GiB)\n", one.tpot_ns / 1e6,
                ep.tpot_ns / 1e6, (double)ep.peak / (1u << 30));
  assert_true(ep.peak <= ep.budget);
  assert_true(ep.allreduces > 0 && ep.allreduces % (2 * 32) == 0);
  assert_true(ep.tpot_ns < one.tpot_ns);
  /* contiguous ranges: experts 0-3 of every layer on one device's queue, 4-7 on the other's;
   * hashed: some layer mixes them */
  const struct sim_result hashed = run_model_placed("8xh100-sxm", "mixtral-8x7b", 2, FERRY_PARALLEL_EP, 1, 1);
  int mixed = 0;
  for (int l = 0; l < 32; l++)
    for (int x = 0; x < 8; x++) {
      const int32_t q = ep.expert_queue[l * 8 + x], first = ep.expert_queue[l * 8 + (x < 4 ? 0 : 4)];
      if (q >= 0 && first >= 0) assert_int_equal(q, first);
      if (x && hashed.expert_queue[l * 8 + x] >= 0 && hashed.expert_queue[l * 8] >= 0 &&
          (hashed.expert_queue[l * 8 + x] == hashed.expert_queue[l * 8]) != (x < 4))
        mixed = 1;
    }
  assert_true(mixed);
  assert_true(ep.expert_queue[0] >= 0 && ep.expert_queue[4] >= 0 && ep.expert_queue[0] != ep.expert_queue[4]);
  assert_true(hashed.peak <= hashed.budget);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_logits),
      cmocka_unit_test(test_host_ep),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_allreduce_host),
      cmocka_unit_test(test_nccl_allreduce_model),
      cmocka_unit_test(test_sim_tp), cmocka_unit_test(test_sim_worker_step), cmocka_unit_test(test_sim_prefill_eager),
      cmocka_unit_test(test_sim_pp),
      cmocka_unit_test(test_sim_ep),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
