/* The simulator's fast mode against its exact mode (FERRY_SIM_FAST vs FERRY_SIM_EXACT) on
 * small workloads of every kind: dense and MoE, offloaded (streamed blocks, an expert cache,
 * weights on disk, with the page cache keeping or dropping them) and resident, with and
 * without an expert predictor, quantized weights, families whose layers differ (latent
 * attention, sliding windows, shared experts), the runtimes' host costs (native, eager with
 * its synchronous fetches, CUDA graphs), pageable host memory, a profile where issuing ops
 * and waking queues take host time, and the execution strategies (the auto, lru and static
 * placement policies, a paged KV cache preempting by recompute and by swap, experts computed
 * on the CPU and a KV cache in host memory (hybrid runs, which a fast executor times exactly:
 * checked), two micro-batches through each loaded layer). Every request's and every step's
 * figures must be equal, so the latency statistics (within 0.5 % is the contract; they come
 * out identical) and the bytes moved, hits and misses are. Each workload also runs in
 * FERRY_SIM_CHECK, where the engine builds every op it would replay and compares it with the
 * op graph: a key that misses something the ops depend on fails there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/fault.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/routing.h"
#include "ferry/sim.h"
#include "testutil.h"

static char *tmp;

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("sim_fast");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

/* A small GPU whose link and compute times are of the same order for the tiny presets, with a
 * disk; `host` adds the host's own costs (issuing, noticing an event, waking a queue), `link`
 * more link figures (its contention with kernels for one memory system). */
static ferry_hw *profile(const char *name, const char *host, const char *link) {
  char path[512], text[2048];
  snprintf(path, sizeof path, "%s/%s.json", tmp, name);
  snprintf(text, sizeof text,
           "{\"name\": \"%s\", \"kind\": \"gpu\","
           " \"gpu\": {\"name\": \"G\", \"memory_bytes\": 1099511627776, \"mem_bw_gbps\": 50,"
           " \"peak_tflops\": {\"fp32\": 1, \"fp16\": 10, \"bf16\": 10}, \"launch_overhead_ns\": 300},"
           " \"link\": {\"name\": \"L\", \"h2d_gbps\": 4, \"d2h_gbps\": 3, \"latency_ns\": 700, \"copy_engines\": 2%s},"
           " \"host\": {\"name\": \"H\", \"dram_gbps\": 20, \"cpu_gflops\": 1, \"memory_bytes\": 1099511627776%s},"
           " \"disk\": {\"name\": \"D\", \"read_gbps\": 2, \"latency_ns\": 9000, \"queue_depth\": 4}}",
           name, link, host);
  tu_write_file(path, text, strlen(text));
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  return hw;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 40, .output_tokens = 12},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 9, .output_tokens = 20},
    {.id = 2, .arrival_ns = 3000000, .prompt_tokens = 70, .output_tokens = 8},
    {.id = 3, .arrival_ns = 5000000, .prompt_tokens = 5, .output_tokens = 16},
    {.id = 4, .arrival_ns = 7000000, .prompt_tokens = 33, .output_tokens = 9},
    {.id = 5, .arrival_ns = 900000000, .prompt_tokens = 30, .output_tokens = 4},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

/* A predictor that guesses the token's current experts and their neighbours, so that some
 * prefetches are used and some wasted. */
static int32_t guess(void *user, const struct ferry_expert_predict_request *rq, int32_t *out, int32_t max) {
  (void)user;
  int32_t n = 0;
  for (int32_t i = 0; i < rq->k && n < max; i++)
    out[n++] = (rq->ids_now[i] + (rq->token_index + rq->target_layer - rq->layer_now) % 2) % max;
  return n;
}

struct workload {
  const char *name;
  const char *preset;
  int host_costs;       /* profile with host.submit_ns, sync_ns, queue_wake_ns, event_wake_ns */
  int resident_all, resident_attention, home_disk, lfu, predict;
  int32_t block_layers, prefetch_depth, expert_slots; /* expert_slots: cache size over the minimum */
  const char *quant;    /* a quantization plan, or NULL */
  const char *runtime;  /* a runtime preset (host costs per launch, copy, layer, step; eager fetches
                           synchronously and dequantizes with kernels of its own), or NULL: none */
  int pageable;         /* host memory not pinned: the host waits for each host-to-device copy */
  int drop_cache;       /* disk reads drop their pages (else the page cache keeps them) */
  int schedule;         /* memory-pressure control with the device budget cut at 4 ms and restored
                           at 8 ms: the engine re-plans mid-run (its op graphs recorded again) */
  const char *policy;   /* an expert placement policy (NULL: the engine's default, auto) */
  int32_t kv_block;     /* a paged KV cache of blocks of this many tokens (0: none) ... */
  int32_t kv_pool_blocks; /* ... in a pool of this many blocks (0: the default), */
  int kv_swap;          /* ... preempted sequences swapped to host memory (else recomputed) */
  int cpu_experts;      /* --offload-compute experts=cpu: a miss computed on the CPU */
  int kv_home_host;     /* --kv-home host: attention on the CPU over a KV cache in host memory */
  int kv_prefill;       /* --kv-prefill device: with it, prompts attend on the device over a scratch */
  int32_t gpu_batches;  /* micro-batches through each loaded layer (FlexGen) */
  int contention;       /* link.contention 0.3: kernels slowed while link copies flow */
  const char *hw;       /* a catalogue profile instead of the small GPU above (real kernel and link
                           times: a compute queue can run longer than the copies it waits for) */
};

struct result {
  struct ferry_serve_summary sum;
  struct ferry_request_metrics *req;
  struct ferry_step_metrics *steps;
  int64_t n_req, n_steps;
  struct ferry_sim_stats stats;
  int64_t replans; /* engine events with a new placement */
  int64_t cpu_experts; /* experts computed on the CPU, over the steps */
};

/* The engine configuration a workload describes (budgets and routing are run()'s). */
static void engine_config(const struct workload *w, ferry_model *model, struct ferry_engine_config *c) {
  memset(c, 0, sizeof *c);
  c->block_layers = w->block_layers;
  c->prefetch_depth = w->prefetch_depth;
  c->max_batch = 4;
  c->max_step_tokens = 48;
  c->max_seq_tokens = 128;
  c->seed = 3;
  c->resident_all = w->resident_all;
  c->resident_attention = w->resident_attention;
  c->home_disk = w->home_disk;
  c->expert_cache_lfu = w->lfu;
  c->expert_cache = w->policy;
  c->kv_block_tokens = w->kv_block;
  c->kv_preempt_swap = w->kv_swap;
  if (w->kv_pool_blocks) {
    struct ferry_model_accounting acc;
    ferry_model_get_accounting(model, &acc);
    c->kv_pool_bytes = (uint64_t)w->kv_pool_blocks * (uint64_t)w->kv_block * acc.kv_bytes_per_token;
  }
  if (w->cpu_experts) c->compute_experts = FERRY_COMPUTE_CPU;
  c->kv_home_host = w->kv_home_host;
  c->kv_prefill_device = w->kv_prefill;
  c->gpu_batches = w->gpu_batches;
  if (w->drop_cache) c->read_flags = FERRY_READ_DROP_CACHE;
  if (w->quant) {
    assert_int_equal(ferry_quant_plan_parse(w->quant, &c->quant), FERRY_OK);
    c->quant_set = 1;
  }
}

static void run(const struct workload *w, int mode, struct result *out) {
  char name[32];
  snprintf(name, sizeof name, "%s%s", w->host_costs ? "host_costs" : "plain", w->contention ? "_contended" : "");
  ferry_hw *hw = NULL;
  if (w->hw)
    assert_int_equal(ferry_hw_open(&hw, w->hw), FERRY_OK);
  else
    hw = profile(name, w->host_costs ? ", \"submit_ns\": 1500, \"sync_ns\": 2500, \"queue_wake_ns\": 4000, \"event_wake_ns\": 3000" : "",
                 w->contention ? ", \"contention\": 0.3" : "");
  if (w->runtime) assert_int_equal(ferry_hw_set_runtime(hw, w->runtime), FERRY_OK);
  ferry_model *model = NULL;
  assert_int_equal(ferry_model_open(&model, w->preset), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(model);
  struct ferry_engine_config c;
  engine_config(w, model, &c);
  ferry_routing_synth *synth = NULL;
  if (mc->n_experts) {
    struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                            .top_k = (int32_t)mc->experts_per_token, .seed = 5};
    assert_int_equal(ferry_routing_synth_create(&synth, &sc), FERRY_OK);
    c.routing = ferry_routing_synth_fn;
    c.routing_many = mode == FERRY_SIM_EXACT ? NULL : ferry_routing_synth_many; /* both ways give the same */
    c.routing_user = synth;
    if (w->predict) c.predict = guess;
  }
  uint64_t dmin = 0, hmin = 0;
  if (!w->resident_all) {
    assert_int_equal(ferry_engine_min_budgets(model, NULL, &c, &dmin, &hmin), FERRY_OK);
    /* a routed expert's bytes at most (fp32): the slots above the minimum */
    const uint64_t expert = 3 * (uint64_t)mc->hidden * (uint64_t)mc->expert_intermediate * 4;
    c.device_budget_bytes = dmin + (uint64_t)w->expert_slots * expert;
  }
  struct ferry_budget_change sched[2];
  if (w->schedule) { /* the device cut to 2 expert slots over the minimum at 4 ms, restored at 8 ms */
    const uint64_t expert = 3 * (uint64_t)mc->hidden * (uint64_t)mc->expert_intermediate * 4;
    c.pressure.enabled = 1;
    sched[0] = (struct ferry_budget_change){.at_ns = 4000000, .tier = FERRY_TIER_DEVICE, .bytes = dmin + 2 * expert};
    sched[1] = (struct ferry_budget_change){.at_ns = 8000000, .tier = FERRY_TIER_DEVICE, .bytes = c.device_budget_bytes};
    c.budget_schedule = sched;
    c.n_budget_changes = 2;
  }
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes,
                                 .host_budget_bytes = c.host_budget_bytes, .lock_host_memory = !w->pageable,
                                 .sim_mode = mode};
  ferry_exec *ex = NULL;
  ferry_engine *eng = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  if (ferry_engine_create(&eng, model, NULL, ex, &c) != FERRY_OK) fail_msg("%s: %s", w->name, ferry_last_error());
  struct ferry_run_options ro = {.time_scale = 1.0};
  if (ferry_engine_run(eng, requests, N_REQ, &ro) != FERRY_OK)
    fail_msg("%s (mode %d): %s", w->name, mode, ferry_last_error());
  ferry_engine_summary(eng, &out->sum);
  const struct ferry_request_metrics *rm = ferry_engine_request_metrics(eng, &out->n_req);
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(eng, &out->n_steps);
  out->req = malloc((size_t)out->n_req * sizeof *out->req);
  out->steps = malloc((size_t)(out->n_steps ? out->n_steps : 1) * sizeof *out->steps);
  assert_non_null(out->req);
  assert_non_null(out->steps);
  memcpy(out->req, rm, (size_t)out->n_req * sizeof *rm);
  memcpy(out->steps, sm, (size_t)out->n_steps * sizeof *sm);
  out->cpu_experts = 0;
  for (int64_t i = 0; i < out->n_steps; i++) out->cpu_experts += sm[i].cpu_experts;
  assert_int_equal(ferry_exec_sim_stats(ex, &out->stats), FERRY_OK);
  int64_t n_ev = 0;
  const struct ferry_engine_event *ev = ferry_engine_events(eng, &n_ev);
  out->replans = 0;
  for (int64_t i = 0; i < n_ev; i++) { /* a new placement is described by its slots */
    if (strstr(ev[i].detail, "expert slot(s)")) out->replans++;
  }
  ferry_engine_destroy(eng);
  ferry_exec_destroy(ex);
  ferry_routing_synth_free(synth);
  ferry_model_close(model);
  ferry_hw_close(hw);
}

static void result_free(struct result *r) {
  free(r->req);
  free(r->steps);
}

static void same_latency(const char *what, const struct ferry_latency_stats *a, const struct ferry_latency_stats *b) {
  const double pa[] = {a->mean, a->p50, a->p90, a->p99, a->max}, pb[] = {b->mean, b->p50, b->p90, b->p99, b->max};
  assert_int_equal(a->count, b->count);
  for (int i = 0; i < 5; i++) {
    if (pa[i] != pb[i]) fail_msg("%s statistic %d: fast %.17g, exact %.17g", what, i, pa[i], pb[i]);
    /* the contract (0.5 %) holds a fortiori */
    assert_true(pa[i] <= pb[i] * 1.005 && pa[i] >= pb[i] * 0.995);
  }
}

static void compare(const struct workload *w) {
  struct result exact, fast, check;
  run(w, FERRY_SIM_EXACT, &exact);
  run(w, FERRY_SIM_FAST, &fast);
  run(w, FERRY_SIM_CHECK, &check); /* fails inside if a graph differs from the ops built for it */
  const struct result *r[2] = {&fast, &check};
  /* the CPU's results go up on a second host-to-device queue */
  const int hybrid = w->cpu_experts || w->kv_home_host;
  for (int i = 0; i < 2; i++) {
    const struct ferry_serve_summary *a = &r[i]->sum, *b = &exact.sum;
    if (a->requests_done != N_REQ)
      fail_msg("%s: %lld request(s) done, %lld refused, pressure level up to %d (exact: %lld done)", w->name,
               (long long)a->requests_done, (long long)a->requests_refused, a->pressure_level_max,
               (long long)b->requests_done);
    assert_int_equal(a->requests_done, b->requests_done);
    assert_int_equal(a->steps, b->steps);
    assert_int_equal(a->bytes_disk, b->bytes_disk);
    assert_int_equal(a->bytes_h2d, b->bytes_h2d);
    assert_int_equal(a->bytes_d2h, b->bytes_d2h);
    assert_int_equal(a->hits, b->hits);
    assert_int_equal(a->misses, b->misses);
    assert_int_equal(a->prefetches, b->prefetches);
    assert_int_equal(a->prefetches_used, b->prefetches_used);
    assert_int_equal(a->stall_ns, b->stall_ns);
    assert_int_equal(a->load_ns, b->load_ns);
    assert_int_equal(a->preemptions, b->preemptions);
    assert_int_equal(a->swaps, b->swaps);
    assert_int_equal(a->swap_bytes, b->swap_bytes);
    same_latency("TTFT", &a->ttft, &b->ttft);
    same_latency("TPOT", &a->tpot, &b->tpot);
    same_latency("e2e", &a->e2e, &b->e2e);
    assert_int_equal(r[i]->n_req, exact.n_req);
    for (int64_t q = 0; q < exact.n_req; q++) {
      assert_int_equal(r[i]->req[q].first_token_ns, exact.req[q].first_token_ns);
      assert_int_equal(r[i]->req[q].finish_ns, exact.req[q].finish_ns);
    }
    for (int64_t s = 0; s < exact.n_steps; s++) {
      const struct ferry_step_metrics *x = &r[i]->steps[s], *y = &exact.steps[s];
      if (x->start_ns != y->start_ns || x->end_ns != y->end_ns || x->tokens != y->tokens || x->hits != y->hits ||
          x->misses != y->misses || x->bytes_h2d != y->bytes_h2d || x->bytes_disk != y->bytes_disk ||
          x->bytes_d2h != y->bytes_d2h || x->stall_ns != y->stall_ns || x->compute_busy_ns != y->compute_busy_ns ||
          x->h2d_busy_ns != y->h2d_busy_ns || x->disk_busy_ns != y->disk_busy_ns || x->cpu_busy_ns != y->cpu_busy_ns ||
          x->cpu_experts != y->cpu_experts || x->evictions != y->evictions || x->kv_blocks != y->kv_blocks ||
          x->bytes_act != y->bytes_act)
        fail_msg("%s: step %lld differs (mode %d): [%lld, %lld] vs [%lld, %lld]", w->name, (long long)s,
                 i ? FERRY_SIM_CHECK : FERRY_SIM_FAST, (long long)x->start_ns, (long long)x->end_ns,
                 (long long)y->start_ns, (long long)y->end_ns);
    }
    /* the simulator's own counters agree too */
    assert_int_equal(r[i]->stats.now_ns, exact.stats.now_ns);
    assert_int_equal(r[i]->stats.ops_done, exact.stats.ops_done);
    assert_int_equal(r[i]->stats.kernels, exact.stats.kernels);
    assert_int_equal(r[i]->stats.copies, exact.stats.copies);
    assert_int_equal(r[i]->stats.reads, exact.stats.reads);
    assert_int_equal(r[i]->stats.bytes_h2d, exact.stats.bytes_h2d);
    assert_int_equal(r[i]->stats.bytes_disk, exact.stats.bytes_disk);
    assert_int_equal(r[i]->stats.h2d_busy_ns, exact.stats.h2d_busy_ns);
    assert_int_equal(r[i]->stats.compute_busy_ns, exact.stats.compute_busy_ns);
    /* a hybrid run has two host-to-device queues that may share the link at once: the executor
     * chose the exact path before the first op */
    assert_int_equal(r[i]->stats.mode, hybrid ? FERRY_SIM_EXACT : i ? FERRY_SIM_CHECK : FERRY_SIM_FAST);
    if (!hybrid) assert_int_equal(r[i]->stats.events_run, 0); /* no event kernel */
  }
  assert_true(exact.stats.events_run > 0);
  assert_int_equal(exact.stats.graph_ops, 0);
  assert_int_equal(check.stats.graph_ops, 0); /* built every op, compared each graph */
  if (!hybrid) {
    assert_true(fast.stats.graph_ops > 0); /* the fast mode did replay */
    assert_true(fast.stats.graph_ops < fast.stats.ops_done);
  }
  if (!w->resident_all) assert_true(exact.sum.bytes_h2d > 0);
  /* each strategy did what it is there for */
  if (w->kv_pool_blocks) assert_true(exact.sum.preemptions > 0);
  if (w->kv_swap) assert_true(exact.sum.swaps > 0);
  if (w->cpu_experts) assert_true(exact.cpu_experts > 0);
  if (w->schedule) {
    assert_int_equal(exact.sum.budget_changes, 2);
    assert_int_equal(exact.replans, 2); /* fewer expert slots, then as many as before */
    assert_int_equal(fast.replans, exact.replans);
    assert_int_equal(check.replans, exact.replans);
  }
  if (w->contention) { /* the copies did slow kernels (latencies may go either way: steps batch differently) */
    struct workload plain = *w;
    struct result free_run;
    plain.contention = 0;
    run(&plain, FERRY_SIM_EXACT, &free_run);
    /* eager fetches synchronously: the host issues a layer's compute once its copies are done, so
     * no copy issued before a kernel flows beside it */
    const int sync_fetch = w->runtime && !strcmp(w->runtime, "eager");
    if (sync_fetch ? exact.stats.compute_busy_ns != free_run.stats.compute_busy_ns
                   : !(exact.stats.compute_busy_ns > free_run.stats.compute_busy_ns))
      fail_msg("%s: compute busy %lld ns contended, %lld ns not", w->name, (long long)exact.stats.compute_busy_ns,
               (long long)free_run.stats.compute_busy_ns);
    result_free(&free_run);
  }
  result_free(&exact);
  result_free(&fast);
  result_free(&check);
}

static const struct workload workloads[] = {
    {.name = "dense streamed", .preset = "tiny-dense", .block_layers = 1, .prefetch_depth = 1},
    {.name = "dense blocks of 2, depth 2", .preset = "tiny-dense", .block_layers = 2, .prefetch_depth = 2},
    {.name = "dense resident", .preset = "tiny-dense", .resident_all = 1, .block_layers = 1},
    {.name = "dense on disk", .preset = "tiny-dense", .home_disk = 1, .block_layers = 1, .prefetch_depth = 1},
    {.name = "moe expert cache", .preset = "tiny-moe", .block_layers = 1, .prefetch_depth = 1, .expert_slots = 6},
    {.name = "moe predictor", .preset = "tiny-moe", .block_layers = 1, .prefetch_depth = 2, .expert_slots = 8, .predict = 1},
    {.name = "moe lfu on disk", .preset = "tiny-moe", .resident_attention = 1, .home_disk = 1, .lfu = 1,
     .block_layers = 1, .prefetch_depth = 1, .expert_slots = 5},
    {.name = "moe resident", .preset = "tiny-moe", .resident_all = 1, .block_layers = 1},
    {.name = "moe int4", .preset = "tiny-moe", .block_layers = 1, .prefetch_depth = 1, .expert_slots = 6,
     .quant = "expert=int4-g64,default=fp16"},
    {.name = "shared experts", .preset = "tiny-qwen2-moe", .resident_attention = 1, .block_layers = 1,
     .prefetch_depth = 1, .expert_slots = 6},
    {.name = "host costs", .preset = "tiny-moe", .host_costs = 1, .block_layers = 1, .prefetch_depth = 1,
     .expert_slots = 6, .predict = 1},
    {.name = "host costs dense", .preset = "tiny-dense", .host_costs = 1, .block_layers = 2, .prefetch_depth = 1},
    {.name = "latent attention", .preset = "deepseek-v2-lite", .resident_attention = 1, .block_layers = 1,
     .prefetch_depth = 1, .expert_slots = 40},
    {.name = "sliding windows", .preset = "gemma-2-9b", .block_layers = 3, .prefetch_depth = 1},
    {.name = "native runtime", .preset = "tiny-dense", .runtime = "native", .block_layers = 1, .prefetch_depth = 1},
    {.name = "eager runtime, int4 on disk", .preset = "tiny-moe", .runtime = "eager", .home_disk = 1,
     .resident_attention = 1, .block_layers = 1, .prefetch_depth = 1, .expert_slots = 5,
     .quant = "expert=int4-g64,default=fp16"},
    /* catalogue models on a real profile, where kernels can outlast the copies they wait for and
     * a CUDA-graph runtime's launches differ between prefilling and decode steps (the op graphs
     * of the second once replayed a decode step's launch price in a prefilling one: CHECK mode
     * found it) */
    {.name = "eager runtime, expert cache, l4", .preset = "olmoe-1b-7b", .runtime = "eager", .hw = "l4",
     .block_layers = 1, .prefetch_depth = 1, .expert_slots = 24},
    {.name = "graph runtime, int4, l4", .preset = "qwen3-30b-a3b", .runtime = "graph", .hw = "l4",
     .block_layers = 1, .prefetch_depth = 1, .expert_slots = 40, .quant = "int4-g64"},
    {.name = "graph runtime, predictor", .preset = "tiny-moe", .runtime = "graph", .block_layers = 1,
     .prefetch_depth = 2, .expert_slots = 8, .predict = 1},
    {.name = "pageable host memory", .preset = "tiny-moe", .pageable = 1, .runtime = "native", .block_layers = 1,
     .prefetch_depth = 1, .expert_slots = 6},
    {.name = "dense on disk, pages dropped", .preset = "tiny-dense", .home_disk = 1, .drop_cache = 1,
     .runtime = "native", .block_layers = 2, .prefetch_depth = 1},
    {.name = "budget schedule under pressure", .preset = "tiny-moe", .block_layers = 1, .prefetch_depth = 2,
     .expert_slots = 6, .schedule = 1},
    /* the execution strategies (issue 14): placement policies, paged KV, CPU compute, micro-batches */
    {.name = "auto placement", .preset = "tiny-moe", .policy = "auto", .block_layers = 1, .prefetch_depth = 1,
     .expert_slots = 6},
    {.name = "lru placement, predictor", .preset = "tiny-moe", .policy = "lru", .block_layers = 1,
     .prefetch_depth = 2, .expert_slots = 8, .predict = 1},
    {.name = "static placement", .preset = "tiny-moe", .policy = "static", .resident_attention = 1,
     .block_layers = 1, .prefetch_depth = 1, .expert_slots = 6},
    {.name = "paged KV, recompute", .preset = "tiny-moe", .block_layers = 1, .prefetch_depth = 1, .expert_slots = 6,
     .kv_block = 16, .kv_pool_blocks = 8},
    {.name = "paged KV, swap", .preset = "tiny-dense", .block_layers = 1, .prefetch_depth = 1, .kv_block = 16,
     .kv_pool_blocks = 10, .kv_swap = 1},
    {.name = "experts on the CPU", .preset = "tiny-moe", .cpu_experts = 1, .block_layers = 1, .prefetch_depth = 1,
     .expert_slots = 4},
    {.name = "KV in host memory, streamed", .preset = "tiny-moe", .kv_home_host = 1, .block_layers = 1,
     .prefetch_depth = 1, .expert_slots = 4},
    {.name = "KV in host memory, prompts on the device", .preset = "tiny-dense", .kv_home_host = 1, .kv_prefill = 1,
     .block_layers = 1, .prefetch_depth = 1, .gpu_batches = 2},
    {.name = "two micro-batches", .preset = "tiny-moe", .gpu_batches = 2, .block_layers = 1, .prefetch_depth = 1,
     .expert_slots = 6},
    {.name = "two micro-batches, dense", .preset = "tiny-dense", .gpu_batches = 2, .block_layers = 2,
     .prefetch_depth = 1},
    /* link copies slowing the kernels beside them (link.contention) */
    {.name = "contended, dense streamed", .preset = "tiny-dense", .block_layers = 1, .prefetch_depth = 1,
     .contention = 1},
    {.name = "contended, dense blocks of 2, depth 2", .preset = "tiny-dense", .block_layers = 2,
     .prefetch_depth = 2, .contention = 1},
    {.name = "contended, moe predictor", .preset = "tiny-moe", .block_layers = 1, .prefetch_depth = 2,
     .expert_slots = 8, .predict = 1, .contention = 1},
    {.name = "contended, host costs", .preset = "tiny-moe", .host_costs = 1, .block_layers = 1,
     .prefetch_depth = 1, .expert_slots = 6, .predict = 1, .contention = 1},
    {.name = "contended, graph runtime", .preset = "tiny-moe", .runtime = "graph", .block_layers = 1,
     .prefetch_depth = 2, .expert_slots = 8, .predict = 1, .contention = 1},
    {.name = "contended, eager on disk", .preset = "tiny-moe", .runtime = "eager", .home_disk = 1,
     .resident_attention = 1, .block_layers = 1, .prefetch_depth = 1, .expert_slots = 5, .contention = 1},
    {.name = "contended, paged KV swap", .preset = "tiny-dense", .block_layers = 1, .prefetch_depth = 1,
     .kv_block = 16, .kv_pool_blocks = 10, .kv_swap = 1, .contention = 1},
    {.name = "contended, two micro-batches", .preset = "tiny-moe", .gpu_batches = 2, .block_layers = 1,
     .prefetch_depth = 1, .expert_slots = 6, .contention = 1},
};

static void test_fast_equals_exact(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof workloads / sizeof workloads[0]; i++) compare(&workloads[i]);
}

/* The fast mode times a transfer alone on its channel. Two queues moving bytes the same way,
 * made before the first op, make a fast executor time everything exactly (the exact mode shares
 * the bandwidth); a queue made after ops were timed fast cannot change that, so an overlap on it
 * is refused with a message. */
static void test_shared_channel(void **state) {
  (void)state;
  ferry_hw *hw = profile("plain", "", "");
  for (int mode = FERRY_SIM_EXACT; mode <= FERRY_SIM_FAST; mode++)
    for (int late = 0; late < 2; late++) {
      struct ferry_exec_config xc = {.lock_host_memory = 1, .sim_mode = mode};
      ferry_exec *ex = NULL;
      assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
      ferry_buf *h, *d;
      assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1 << 20, "h", &h), FERRY_OK);
      assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1 << 20, "d", &d), FERRY_OK);
      struct ferry_ref rh = {h, 0, FERRY_DTYPE_U8}, rd = {d, 0, FERRY_DTYPE_U8};
      int32_t q1, q2;
      assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q1), FERRY_OK);
      if (!late) assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q2), FERRY_OK);
      assert_int_equal(ferry_exec_copy(ex, q1, rd, rh, 1 << 20), FERRY_OK);
      if (late) assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q2), FERRY_OK);
      ferry_status st = ferry_exec_copy(ex, q2, rd, rh, 1 << 20);
      struct ferry_sim_stats stats;
      assert_int_equal(ferry_exec_sim_stats(ex, &stats), FERRY_OK);
      if (mode == FERRY_SIM_EXACT || !late) {
        assert_int_equal(st, FERRY_OK);
        assert_int_equal(stats.mode, FERRY_SIM_EXACT);
        assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
        assert_int_equal(ferry_exec_sim_stats(ex, &stats), FERRY_OK);
        assert_true(stats.events_run > 0);
        /* the two copies shared the link: both done when 2 MiB have crossed it, not before */
        assert_int_equal(stats.bytes_h2d, 2u << 20);
      } else {
        assert_int_equal(stats.mode, FERRY_SIM_FAST);
        assert_int_equal(st, FERRY_ERR_UNSUPPORTED);
        assert_true(tu_contains(ferry_exec_errmsg(ex), "would share"));
        assert_true(tu_contains(ferry_exec_errmsg(ex), "--exact"));
        assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
      }
      ferry_exec_destroy(ex);
    }
  ferry_hw_close(hw);
}

/* Injected faults are modelled by the exact mode only: a fast executor created with faults
 * installed runs exact (events, delays charged); one whose faults came later refuses ops. */
static void test_faults_run_exact(void **state) {
  (void)state;
  ferry_hw *hw = profile("plain", "", "");
  for (int late = 0; late < 2; late++) {
    if (!late) assert_int_equal(ferry_fault_set("copy:delay:1@1+"), FERRY_OK);
    struct ferry_exec_config xc = {.lock_host_memory = 1, .sim_mode = FERRY_SIM_FAST};
    ferry_exec *ex = NULL;
    assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
    if (late) assert_int_equal(ferry_fault_set("copy:delay:1@1+"), FERRY_OK);
    int32_t q;
    assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &q), FERRY_OK);
    ferry_buf *h, *d;
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1 << 20, "h", &h), FERRY_OK);
    assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 1 << 20, "d", &d), FERRY_OK);
    struct ferry_ref rh = {h, 0, FERRY_DTYPE_U8}, rd = {d, 0, FERRY_DTYPE_U8};
    ferry_status st = ferry_exec_copy(ex, q, rd, rh, 1 << 20);
    struct ferry_sim_stats stats;
    if (!late) {
      assert_int_equal(st, FERRY_OK);
      assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
      assert_int_equal(ferry_exec_sim_stats(ex, &stats), FERRY_OK);
      assert_true(stats.events_run > 0);        /* the discrete-event path ran it */
      assert_true(stats.now_ns >= 1000000);     /* with its injected millisecond */
    } else {
      assert_int_equal(st, FERRY_ERR_INVALID);
      assert_true(tu_contains(ferry_exec_errmsg(ex), "faults were installed after"));
    }
    ferry_fault_clear();
    ferry_exec_destroy(ex);
  }
  ferry_hw_close(hw);
}

/* `ferry sim` is fast by default and --exact gives the same summary: on a tiny model, and on
 * catalogue models and profiles where a random search of configurations once found the two
 * apart (eager's synchronous fetch waited for the compute queue too in the fast path: 3 %
 * of TTFT; a CUDA-graph runtime's op graph recorded in a decode step replayed its launches at
 * the decode price in a prefilling step: 0.1 %). */
static void test_cli_exact(void **state) {
  (void)state;
  static const char *const runs[] = {
      "sim --model tiny-moe --hw h100-pcie --synthetic rate=50,n=12,prompt=40,output=10 --device-budget 64MiB "
      "--max-batch 4 --quiet",
      "sim --model olmoe-1b-7b --hw l4 --runtime eager --prefetch-depth 1 --device-budget 12GiB --max-batch 1 "
      "--synthetic n=2,prompt=64,output=2 --as-fast-as-possible --quiet",
      "sim --model qwen3-30b-a3b --hw l4 --runtime graph --quant int4-g64 --prefetch-depth 1 --device-budget 8GiB "
      "--max-batch 4 --synthetic rate=4,n=5,prompt=64,output=4 --quiet",
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    char cmd[512], *fast = NULL, *exact = NULL;
    assert_int_equal(tu_run_ferry(runs[i], &fast), 0);
    snprintf(cmd, sizeof cmd, "%s --exact", runs[i]);
    assert_int_equal(tu_run_ferry(cmd, &exact), 0);
    assert_true(tu_contains(fast, "expert cache:"));
    if (strcmp(fast, exact)) fail_msg("ferry %s\nfast:\n%s\nexact:\n%s", runs[i], fast, exact);
    free(fast);
    free(exact);
  }
  char *out = NULL;
  assert_int_equal(tu_run_ferry("run --model x --exact --synthetic n=1", &out), 2);
  assert_true(tu_contains(out, "--exact is for 'ferry sim'"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fast_equals_exact),
      cmocka_unit_test(test_shared_channel),
      cmocka_unit_test(test_faults_run_exact),
      cmocka_unit_test(test_cli_exact),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
