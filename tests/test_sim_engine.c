/* The engine on the `sim` executor: runs complete within budget, two runs give identical
 * metrics, the block pipeline (block_layers 1, prefetch depth 1) runs at the analytic
 * max-of-sums in both the copy-bound and the compute-bound regime, MoE runs with the synthetic
 * (or a supplied) routing source report expert-cache hits and misses, and an MoE run without a
 * routing source is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

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
  tmp = tu_mkdtemp("sim_engine");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

/* A profile with round numbers: link 1 B/ns each way, no latency (a block's copy time is its
 * bytes in ns); the GPU's memory bandwidth sets how long the layers compute. */
static ferry_hw *profile(const char *name, const char *mem_bw_gbps) {
  char path[512], text[2048];
  snprintf(path, sizeof path, "%s/%s.json", tmp, name);
  snprintf(text, sizeof text,
           "{\"name\": \"%s\", \"kind\": \"gpu\","
           " \"gpu\": {\"name\": \"G\", \"memory_bytes\": 1073741824, \"mem_bw_gbps\": %s,"
           " \"peak_tflops\": {\"fp32\": 1, \"fp16\": 10}, \"launch_overhead_ns\": 100},"
           " \"link\": {\"name\": \"L\", \"h2d_gbps\": 1, \"d2h_gbps\": 1, \"latency_ns\": 0, \"copy_engines\": 1},"
           " \"host\": {\"name\": \"H\", \"dram_gbps\": 10, \"cpu_gflops\": 1, \"memory_bytes\": 1073741824},"
           " \"disk\": {\"name\": \"D\", \"read_gbps\": 2, \"latency_ns\": 10000, \"queue_depth\": 4}}",
           name, mem_bw_gbps);
  tu_write_file(path, text, strlen(text));
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  return hw;
}

/* Activities of a run, grown as needed. */
struct log {
  struct ferry_activity *a;
  size_t n, cap;
  int64_t lookahead_ops; /* kernels named router.lookahead */
};

static void sink(void *user, const struct ferry_activity *act) {
  struct log *l = user;
  if (act->kind != FERRY_ACT_KERNEL && act->kind != FERRY_ACT_MEMCPY) return;
  if (act->kind == FERRY_ACT_KERNEL && act->name && !strcmp(act->name, "router.lookahead")) l->lookahead_ops++;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 1024;
    l->a = realloc(l->a, l->cap * sizeof *l->a);
    assert_non_null(l->a);
  }
  l->a[l->n] = *act;
  l->a[l->n].name = NULL; /* borrowed for the callback only */
  l->n++;
}

struct run {
  ferry_exec *ex;
  ferry_engine *eng;
  ferry_model *model;
  struct log log;
  struct ferry_serve_summary sum;
};

static const struct ferry_engine_request requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 40, .output_tokens = 12},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 9, .output_tokens = 20},
    {.id = 2, .arrival_ns = 3000000, .prompt_tokens = 70, .output_tokens = 8},
    {.id = 3, .arrival_ns = 5000000, .prompt_tokens = 5, .output_tokens = 16},
    {.id = 4, .arrival_ns = 900000000, .prompt_tokens = 30, .output_tokens = 4},
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

/* Run a model (taken over: run_free closes it) on a profile; device budget = the engine's
 * minimum + extra_device. */
static void run_model(struct run *r, ferry_model *model, ferry_hw *hw, struct ferry_engine_config cfg,
                      uint64_t extra_device) {
  memset(r, 0, sizeof *r);
  r->model = model;
  uint64_t dmin = 0, hmin = 0;
  assert_int_equal(ferry_engine_min_budgets(r->model, NULL, &cfg, &dmin, &hmin), FERRY_OK);
  cfg.device_budget_bytes = dmin + extra_device;
  struct ferry_exec_config xc = {.device_budget_bytes = cfg.device_budget_bytes,
                                 .host_budget_bytes = cfg.host_budget_bytes, .lock_host_memory = 1};
  assert_int_equal(ferry_exec_create_sim(&r->ex, hw, &xc), FERRY_OK);
  ferry_exec_set_sink(r->ex, sink, &r->log);
  ferry_status st = ferry_engine_create(&r->eng, r->model, NULL, r->ex, &cfg);
  if (st != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  struct ferry_run_options ro = {.time_scale = 1.0};
  st = ferry_engine_run(r->eng, requests, N_REQ, &ro);
  if (st != FERRY_OK) fail_msg("engine_run: %s", ferry_last_error());
  ferry_engine_summary(r->eng, &r->sum);
}

/* Run a preset on a profile; device budget = the engine's minimum + extra_device. */
static void run(struct run *r, const char *preset, ferry_hw *hw, struct ferry_engine_config cfg, uint64_t extra_device) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, preset), FERRY_OK);
  run_model(r, m, hw, cfg, extra_device);
}

static void run_free(struct run *r) {
  ferry_engine_destroy(r->eng);
  ferry_exec_destroy(r->ex);
  ferry_model_close(r->model);
  free(r->log.a);
}

static struct ferry_engine_config base_config(void) {
  struct ferry_engine_config c;
  memset(&c, 0, sizeof c);
  c.block_layers = 1;
  c.prefetch_depth = 1;
  c.max_batch = 4;
  c.max_step_tokens = 64;
  c.max_seq_tokens = 128;
  c.seed = 7;
  return c;
}

static void check_complete_within_budget(const struct run *r) {
  assert_int_equal(r->sum.requests_done, N_REQ);
  assert_int_equal(r->sum.requests_rejected, 0);
  int64_t tokens = 0;
  for (int64_t i = 0; i < N_REQ; i++) tokens += requests[i].output_tokens;
  assert_int_equal(r->sum.tokens_generated, tokens);
  for (int t = 0; t < 2; t++)
    if (r->sum.budget_bytes[t]) assert_true(r->sum.peak_bytes[t] <= r->sum.budget_bytes[t]);
  assert_true(r->sum.peak_bytes[FERRY_TIER_DEVICE] > 0);
  int64_t n;
  const struct ferry_request_metrics *m = ferry_engine_request_metrics(r->eng, &n);
  assert_int_equal(n, N_REQ);
  for (int64_t i = 0; i < n; i++) {
    assert_true(m[i].first_token_ns > m[i].arrival_ns);
    assert_true(m[i].finish_ns >= m[i].first_token_ns);
  }
  /* the late request arrived on the virtual clock: served after its arrival, not before */
  assert_true(m[N_REQ - 1].arrival_ns == 900000000 && m[N_REQ - 1].first_token_ns > 900000000);
}

static void test_dense_completes_deterministically(void **state) {
  (void)state;
  ferry_hw *hw = profile("dense", "10");
  struct run a, b;
  run(&a, "tiny-dense", hw, base_config(), 0);
  run(&b, "tiny-dense", hw, base_config(), 0);
  check_complete_within_budget(&a);
  assert_true(a.sum.bytes_h2d > 0); /* blocks were streamed */
  assert_true(a.sum.load_ns > 0);   /* resident weights came from the simulated disk */
  /* identical request and step metrics, field by field */
  int64_t na, nb;
  const struct ferry_request_metrics *ra = ferry_engine_request_metrics(a.eng, &na), *rb = ferry_engine_request_metrics(b.eng, &nb);
  assert_int_equal(na, nb);
  for (int64_t i = 0; i < na; i++) {
    assert_int_equal(ra[i].id, rb[i].id);
    assert_int_equal(ra[i].first_token_ns, rb[i].first_token_ns);
    assert_int_equal(ra[i].finish_ns, rb[i].finish_ns);
    assert_int_equal(ra[i].output_tokens, rb[i].output_tokens);
  }
  const struct ferry_step_metrics *sa = ferry_engine_step_metrics(a.eng, &na), *sb = ferry_engine_step_metrics(b.eng, &nb);
  assert_int_equal(na, nb);
  assert_true(na > 20);
  for (int64_t i = 0; i < na; i++) {
    assert_int_equal(sa[i].start_ns, sb[i].start_ns);
    assert_int_equal(sa[i].end_ns, sb[i].end_ns);
    assert_int_equal(sa[i].tokens, sb[i].tokens);
    assert_int_equal(sa[i].bytes_h2d, sb[i].bytes_h2d);
    assert_int_equal(sa[i].stall_ns, sb[i].stall_ns);
  }
  assert_int_equal(a.log.n, b.log.n);
  for (size_t i = 0; i < a.log.n; i++) {
    assert_int_equal(a.log.a[i].start_ns, b.log.a[i].start_ns);
    assert_int_equal(a.log.a[i].end_ns, b.log.a[i].end_ns);
  }
  struct ferry_sim_stats s1, s2;
  assert_int_equal(ferry_exec_sim_stats(a.ex, &s1), FERRY_OK);
  assert_int_equal(ferry_exec_sim_stats(b.ex, &s2), FERRY_OK);
  assert_int_equal(s1.events_run, s2.events_run);
  assert_int_equal(s1.now_ns, s2.now_ns);
  run_free(&a);
  run_free(&b);
  ferry_hw_close(hw);
}

/* Per step: compute of the layers (kernels with a layer), the rest of the compute (embedding,
 * head) with the logits read-back, and host-to-device bytes, from the timeline. */
struct step_parts {
  int64_t layers_ns, other_ns, h2d_ns;
  int64_t tail_ns; /* what runs after the last block has arrived: its layer, the head, read-back */
};

static struct step_parts parts_of(const struct run *r, const struct ferry_step_metrics *s, int32_t last_layer) {
  struct step_parts p = {0, 0, 0, 0};
  int seen_embed = 0;
  int64_t lo = r->sum.run_start_ns + s->start_ns, hi = r->sum.run_start_ns + s->end_ns;
  for (size_t i = 0; i < r->log.n; i++) {
    const struct ferry_activity *a = &r->log.a[i];
    if (a->start_ns < lo || a->start_ns >= hi) continue;
    int64_t d = a->end_ns - a->start_ns;
    if (a->kind == FERRY_ACT_KERNEL) {
      if (a->layer >= 0) p.layers_ns += d;
      else p.other_ns += d;
      /* activities arrive in completion order: the step's first layer-less kernel is the
       * embedding, which runs while the first block is still arriving */
      if (a->layer == last_layer || (a->layer < 0 && seen_embed)) p.tail_ns += d;
      if (a->layer < 0) seen_embed = 1;
    } else if (a->copy_kind == FERRY_COPY_DTOH) {
      p.other_ns += d;
      p.tail_ns += d;
    } else if (a->copy_kind == FERRY_COPY_HTOD) {
      p.h2d_ns += d;
    }
  }
  return p;
}

/* Steady-state step time = max(L x copy per block, compute of the layers + the rest): the
 * copy queue and the compute queue each run their sum back to back, and the slower one sets
 * the pace. Exactly: compute-bound, the step is its compute; copy-bound, the link never rests,
 * so a step is L copies shifted by the change in what runs after the last block arrives (the
 * last layer, the head, the read-back) from the step before. The first steps fill the
 * pipeline and are skipped. */
static void check_pipeline(const char *mem_bw, int copy_bound) {
  ferry_hw *hw = profile(copy_bound ? "copybound" : "computebound", mem_bw);
  struct run r;
  run(&r, "tiny-dense", hw, base_config(), 0);
  check_complete_within_budget(&r);
  const int64_t L = 8;
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(r.eng, &n);
  /* copy per block: every block has the same bytes, at 1 B/ns */
  assert_true(sm[3].bytes_h2d % L == 0);
  const int64_t X = (int64_t)(sm[3].bytes_h2d / L);
  assert_true(X > 100000);
  int checked = 0;
  for (int64_t i = 3; i < n; i++) {
    const struct ferry_step_metrics *s = &sm[i];
    /* after idle time the pipeline restarts: skip two steps */
    if (s->start_ns != sm[i - 1].end_ns || sm[i - 1].start_ns != sm[i - 2].end_ns ||
        sm[i - 2].start_ns != sm[i - 3].end_ns)
      continue;
    assert_int_equal(s->bytes_h2d, (uint64_t)(L * X)); /* every block streamed once per step */
    struct step_parts p = parts_of(&r, s, (int32_t)(L - 1)), prev = parts_of(&r, &sm[i - 1], (int32_t)(L - 1));
    int64_t compute = p.layers_ns + p.other_ns, copy = L * X;
    int64_t expect = compute > copy ? compute : copy;
    int64_t got = s->end_ns - s->start_ns;
    if (copy_bound) {
      assert_true(copy > 2 * compute);
      assert_int_equal(got, copy + p.tail_ns - prev.tail_ns);
      assert_true(s->stall_ns > 0); /* compute waits for the link */
    } else {
      assert_true(compute > 2 * copy);
      assert_int_equal(got, compute); /* the compute queue never waits */
      assert_int_equal(s->stall_ns, 0);
    }
    /* and within 2% of the plain max-of-sums */
    int64_t diff = got > expect ? got - expect : expect - got;
    assert_true(diff * 50 <= expect);
    checked++;
  }
  assert_true(checked >= 10);
  run_free(&r);
  ferry_hw_close(hw);
}

static void test_pipeline_copy_bound(void **state) {
  (void)state;
  check_pipeline("10", 1); /* ~74 us of weights per layer vs ~738 us of copy */
}

static void test_pipeline_compute_bound(void **state) {
  (void)state;
  check_pipeline("0.05", 0); /* ~15 ms per layer vs ~738 us of copy */
}

/* Always experts 0 and 1: after the first step every lookup hits. */
static void fixed_routing(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                          int32_t n_experts, int32_t *ids, float *weights) {
  (void)req_id;
  (void)token_index;
  (void)layer;
  (void)n_experts;
  int *calls = user;
  (*calls)++;
  for (int32_t r = 0; r < top_k; r++) {
    ids[r] = r;
    if (weights) weights[r] = 1.0f / (float)top_k;
  }
}

struct lookahead_sim {
  int64_t calls, with_logits;
};

static void routing_without_features(void *user, int64_t req, int32_t tok, int32_t layer, int32_t k, const int32_t *ids,
                                     const float *w, int32_t n_features, const float *features) {
  (void)req, (void)tok, (void)layer, (void)k, (void)ids, (void)w;
  struct lookahead_sim *s = user;
  s->calls++;
  s->with_logits += n_features != 0 || features != NULL;
}

static int32_t predict_none_expected(void *user, const struct ferry_expert_predict_request *rq, int32_t *out,
                                     int32_t max) {
  (void)out, (void)max;
  struct lookahead_sim *s = user;
  s->calls++;
  s->with_logits += rq->lookahead_logits != NULL;
  return 0;
}

/* tiny-moe's layer count and the bytes of one routed expert (fp32). */
static void moe_shape(int64_t *layers, uint64_t *expert_bytes) {
  ferry_model *m;
  assert_int_equal(ferry_model_open(&m, "tiny-moe"), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  *expert_bytes = 3 * (uint64_t)mc->hidden * (uint64_t)mc->expert_intermediate * 4;
  *layers = mc->n_layers;
  ferry_model_close(m);
}

static void test_moe_expert_cache(void **state) {
  (void)state;
  ferry_hw *hw = profile("moe", "10");
  struct ferry_engine_config cfg = base_config();
  ferry_model *m;
  assert_int_equal(ferry_model_open(&m, "tiny-moe"), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const uint64_t expert_bytes = 3 * (uint64_t)mc->hidden * (uint64_t)mc->expert_intermediate * 4;
  const int64_t L = mc->n_layers;

  /* the simulator computes no router: without a routing source the engine refuses, naming it */
  ferry_exec *ex = NULL;
  ferry_engine *eng = NULL;
  struct ferry_engine_config no_routing = cfg;
  no_routing.device_budget_bytes = 1ull << 30;
  struct ferry_exec_config xc = {.device_budget_bytes = no_routing.device_budget_bytes};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  assert_int_equal(ferry_engine_create(&eng, m, NULL, ex, &no_routing), FERRY_ERR_INVALID);
  assert_null(eng);
  assert_non_null(strstr(ferry_last_error(), "routing source"));
  ferry_exec_destroy(ex);

  /* the synthetic routing model: a small cache both hits and misses */
  struct ferry_routing_synth_config sc = {.n_layers = (int32_t)L, .n_experts = (int32_t)mc->n_experts,
                                          .top_k = (int32_t)mc->experts_per_token, .seed = 7};
  ferry_routing_synth *synth = NULL;
  assert_int_equal(ferry_routing_synth_create(&synth, &sc), FERRY_OK);
  ferry_model_close(m);
  cfg.routing = ferry_routing_synth_fn;
  cfg.routing_user = synth;
  struct run r;
  run(&r, "tiny-moe", hw, cfg, 12 * expert_bytes);
  check_complete_within_budget(&r);
  assert_true(r.sum.misses > 0);
  assert_true(r.sum.hits > 0);
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(r.eng, &n);
  int64_t hits = 0, misses = 0;
  for (int64_t i = 0; i < n; i++) {
    hits += sm[i].hits;
    misses += sm[i].misses;
  }
  assert_int_equal(hits, r.sum.hits);
  assert_int_equal(misses, r.sum.misses);
  assert_true(r.sum.bytes_h2d > 0);
  struct run again;
  run(&again, "tiny-moe", hw, cfg, 12 * expert_bytes);
  assert_int_equal(again.sum.hits, r.sum.hits); /* the same routing every run */
  assert_int_equal(again.sum.misses, r.sum.misses);
  assert_int_equal(again.sum.duration_ns, r.sum.duration_ns);
  run_free(&again);
  run_free(&r);
  ferry_routing_synth_free(synth);
  ferry_hw_close(hw);
}

/* A supplied routing source, and what the engine reads back for gate lookahead and predictor
 * features on an executor that computes nothing. */
static void test_moe_fixed_routing(void **state) {
  (void)state;
  ferry_hw *hw = profile("moe", "10");
  struct ferry_engine_config cfg = base_config();
  int64_t L;
  uint64_t expert_bytes;
  moe_shape(&L, &expert_bytes);
  struct run r;
  int64_t n;
  const struct ferry_step_metrics *sm;

  /* a supplied routing source that always picks experts 0 and 1, with room for every layer's
   * pair: each (layer, expert) misses once, then always hits */
  int calls = 0;
  cfg.routing = fixed_routing;
  cfg.routing_user = &calls;
  run(&r, "tiny-moe", hw, cfg, (uint64_t)(2 * L) * expert_bytes);
  check_complete_within_budget(&r);
  assert_true(calls > 0);
  assert_int_equal(r.sum.misses, 2 * L);
  assert_true(r.sum.hits > 0);
  sm = ferry_engine_step_metrics(r.eng, &n);
  assert_int_equal(sm[0].misses, 2 * L);
  for (int64_t i = 1; i < n; i++) assert_int_equal(sm[i].misses, 0);
  run_free(&r);

  /* gate lookahead: the same ops as on a computing executor (the next layers' routers, read
   * back with the routing), no logits for the predictor, and the run stays within budget */
  struct lookahead_sim ls = {0};
  cfg.routing = fixed_routing;
  cfg.routing_user = &calls;
  cfg.router_lookahead = 1;
  cfg.predict = predict_none_expected;
  cfg.predict_user = &ls;
  run(&r, "tiny-moe", hw, cfg, (uint64_t)(2 * L) * expert_bytes);
  check_complete_within_budget(&r);
  assert_true(ls.calls > 0);
  assert_int_equal(ls.with_logits, 0);
  assert_int_equal(r.log.lookahead_ops, r.sum.steps * (L - 1));
  const uint64_t d2h_with_lookahead = r.sum.bytes_d2h;
  run_free(&r);

  /* predictor features: the same read-backs as a computing executor (more bytes), no values */
  struct lookahead_sim fs = {0};
  cfg.router_lookahead = 0;
  cfg.predict = NULL;
  cfg.token_features = 3;
  cfg.on_routing = routing_without_features;
  cfg.on_routing_user = &fs;
  run(&r, "tiny-moe", hw, cfg, (uint64_t)(2 * L) * expert_bytes);
  check_complete_within_budget(&r);
  assert_true(fs.calls > 0);
  assert_int_equal(fs.with_logits, 0);
  assert_true(r.sum.bytes_d2h > d2h_with_lookahead);
  run_free(&r);
  cfg.on_routing = NULL;
  /* only 0, 3 and 7 features exist */
  cfg.token_features = 5;
  {
    ferry_model *mm = NULL;
    ferry_exec *x2 = NULL;
    ferry_engine *e2 = NULL;
    struct ferry_exec_config xc2 = {.device_budget_bytes = 1ull << 30};
    cfg.device_budget_bytes = 1ull << 30;
    assert_int_equal(ferry_model_open(&mm, "tiny-moe"), FERRY_OK);
    assert_int_equal(ferry_exec_create_sim(&x2, hw, &xc2), FERRY_OK);
    assert_int_equal(ferry_engine_create(&e2, mm, NULL, x2, &cfg), FERRY_ERR_INVALID);
    assert_non_null(strstr(ferry_last_error(), "token_features"));
    ferry_exec_destroy(x2);
    ferry_model_close(mm);
  }
  ferry_hw_close(hw);
}

/* `ferry sim`: the plan and summary, clear errors, and a result database tagged as a sim run. */
/* The simulator prices the KV cache by its format: the plan reserves its bytes and every
 * attention op reads them (fp32 twice the bytes of fp16 and bf16, and slower). */
static void test_kv_format_priced(void **state) {
  (void)state;
  ferry_hw *hw = profile("kvprice", "100");
  const enum ferry_kv_format fmts[] = {FERRY_KV_FP16, FERRY_KV_BF16, FERRY_KV_FP32};
  uint64_t peak[3], attn_bytes[3];
  int64_t attn_ns[3];
  for (int f = 0; f < 3; f++) {
    struct run r;
    struct ferry_engine_config c = base_config();
    c.kv_format = fmts[f];
    run(&r, "tiny-dense", hw, c, 0);
    check_complete_within_budget(&r);
    peak[f] = r.sum.peak_bytes[FERRY_TIER_DEVICE];
    attn_bytes[f] = 0;
    attn_ns[f] = 0;
    for (size_t i = 0; i < r.log.n; i++)
      if (r.log.a[i].kind == FERRY_ACT_KERNEL && r.log.a[i].kind_name && !strcmp(r.log.a[i].kind_name, "attention")) {
        attn_bytes[f] += r.log.a[i].bytes;
        attn_ns[f] += r.log.a[i].end_ns - r.log.a[i].start_ns;
      }
    if (f == 2) {
      /* fp32 holds the fp16 cache twice: the peaks differ by one fp16 cache */
      const uint64_t fp16_kv = ferry_model_kv_bytes(r.model, (int64_t)c.max_batch * c.max_seq_tokens, FERRY_KV_FP16);
      assert_int_equal(peak[2] - peak[0], fp16_kv);
    }
    run_free(&r);
  }
  assert_true(attn_bytes[0] > 0);
  assert_int_equal(attn_bytes[0], attn_bytes[1]);
  assert_int_equal(peak[0], peak[1]);
  assert_true(attn_bytes[2] > attn_bytes[0]);
  assert_true(attn_ns[2] > attn_ns[0]);
  ferry_hw_close(hw);
}

static void test_cli(void **state) {
  (void)state;
  char *out = NULL, args[1024];
  assert_int_equal(tu_run_ferry("sim --help", &out), 0);
  assert_true(tu_contains(out, "--hw PROFILE"));
  free(out);
  assert_int_equal(tu_run_ferry("sim --model tiny-moe --synthetic rate=5,n=4,prompt=8,output=3", &out), 2);
  assert_true(tu_contains(out, "missing --hw"));
  free(out);
  assert_int_equal(tu_run_ferry("sim --model tiny-moe --hw no-such-gpu --synthetic rate=5,n=4,prompt=8,output=3", &out), 1);
  assert_true(tu_contains(out, "ferry: "));
  assert_true(tu_contains(out, "no-such-gpu"));
  free(out);
  snprintf(args, sizeof args,
           "sim --model tiny-moe --hw h100-pcie --synthetic rate=5,n=6,prompt=16,output=4 --device-budget 8MiB "
           "--db '%s/sim.db'",
           tmp);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "plan for tiny-moe"));
  assert_true(tu_contains(out, "requests: 6 done, 0 rejected"));
  assert_true(tu_contains(out, "expert cache:"));
  assert_true(tu_contains(out, "events"));
  free(out);
  snprintf(args, sizeof args, "db list --db '%s/sim.db'", tmp);
  int rc = tu_run_ferry(args, &out);
  if (rc != 0) fail_msg("ferry %s: %s", args, out);
  assert_true(tu_contains(out, "sim"));
  assert_true(tu_contains(out, "h100-pcie"));
  free(out);
  /* the simulated GPU, as nsys describes the GPU of a run: name, memory and bandwidth of the profile */
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  const struct ferry_hw_profile *hp = ferry_hw_get(hw);
  snprintf(args, sizeof args, "%s/sim.db", tmp);
  sqlite3 *sql = NULL;
  assert_int_equal(sqlite3_open_v2(args, &sql, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_stmt *q = NULL;
  assert_int_equal(sqlite3_prepare_v2(sql, "SELECT runId, id, name, totalMemory, memoryBandwidth, smCount, COUNT(*) "
                                           "FROM TARGET_INFO_GPU", -1, &q, NULL),
                   SQLITE_OK);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  assert_int_equal(sqlite3_column_int64(q, 6), 1);
  assert_int_equal(sqlite3_column_int64(q, 0), 1);
  assert_int_equal(sqlite3_column_int64(q, 1), 0);
  assert_string_equal((const char *)sqlite3_column_text(q, 2), hp->gpu.name);
  assert_int_equal(sqlite3_column_int64(q, 3), (int64_t)hp->gpu.memory_bytes);
  assert_int_equal(sqlite3_column_int64(q, 4), (int64_t)(hp->gpu.mem_bw_gbps * 1e9));
  assert_int_equal(sqlite3_column_type(q, 5), SQLITE_NULL); /* the profile does not say */
  sqlite3_finalize(q);
  sqlite3_close(sql);
  snprintf(args, sizeof args, "db show 1 --db '%s/sim.db'", tmp);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  char want[160];
  snprintf(want, sizeof want, "gpu        %s, ", hp->gpu.name);
  assert_true(tu_contains(out, want));
  free(out);
  ferry_hw_close(hw);
  /* --quiet: the summary only */
  assert_int_equal(tu_run_ferry("sim --model tiny-dense --hw rtx-4090 --synthetic rate=5,n=3,prompt=8,output=2 --quiet", &out), 0);
  assert_false(tu_contains(out, "plan for"));
  assert_true(tu_contains(out, "requests: 3 done"));
  free(out);
}

/* Mean TPOT in seconds from the summary ("TPOT   3.801 s ..." or "TPOT   18.39 ms ..."). */
static double tpot_s(const char *out) {
  const char *p = strstr(out, "\nTPOT");
  assert_non_null(p);
  double v = 0;
  char unit[8] = "";
  assert_int_equal(sscanf(p + 5, "%lf %7s", &v, unit), 2);
  return !strcmp(unit, "ms") ? v / 1e3 : !strcmp(unit, "us") ? v / 1e6 : v;
}

/* Quantized decode is faster than 16-bit decode, as on real GPUs (a GPU runtime reads low-bit
 * weights packed, with fused dequantize-in-GEMV kernels): where the model fits (h100-pcie) and
 * where it streams or spills over PCIe (l4; Mixtral on both). The families whose weights the
 * plan's classes must also reach: gpt-oss's and Llama 4's fused expert gate/up and DeepSeek's
 * latent-attention projections (once sized as norms: fp32 under an int4 plan, so int4 decode
 * of gpt-oss-20b came out 9x slower than the published MXFP4). */
static void test_quantized_decode_faster(void **state) {
  (void)state;
  static const char *const models[] = {"llama-3-8b", "mixtral-8x7b", "gpt-oss-20b", "llama-4-scout-17b-16e",
                                       "deepseek-v2-lite"},
                           *const gpus[] = {"h100-pcie", "l4"};
  for (int m = 0; m < 5; m++)
    for (int g = 0; g < 2; g++) {
      double tpot[2];
      static const char *const quant[2] = {"fp16", "int4-g64"};
      for (int q = 0; q < 2; q++) {
        char args[256], *out = NULL;
        snprintf(args, sizeof args, "sim --model %s --hw %s --synthetic rate=1,n=2,prompt=64,output=8 --quant %s --quiet",
                 models[m], gpus[g], quant[q]);
        if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
        tpot[q] = tpot_s(out);
        free(out);
      }
      if (!(tpot[1] < tpot[0]))
        fail_msg("%s on %s: int4 TPOT %.2f ms is not below fp16's %.2f ms", models[m], gpus[g], tpot[1] * 1e3,
                 tpot[0] * 1e3);
    }
}

/* The software issuing the work: eager PyTorch (a Python launch per kernel, a millisecond of host
 * work per layer) makes batch-1 decode of an 8B model host-bound, slower than a C++ engine; a
 * runtime that is not one is refused. */
static void test_runtime_presets_in_sim(void **state) {
  (void)state;
  double tpot[2];
  static const char *const rt[2] = {"native", "eager"};
  for (int i = 0; i < 2; i++) {
    char args[256], *out = NULL;
    snprintf(args, sizeof args, "sim --model llama-3-8b --hw h100-pcie --synthetic rate=1,n=1,prompt=16,output=8 --runtime %s --quiet",
             rt[i]);
    if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
    tpot[i] = tpot_s(out);
    free(out);
  }
  /* eager: 32 layers x (1.02 ms + 12 launches x 15 us) = 38.4 ms of host work a token, more than
   * the GPU's ~11 ms */
  assert_true(tpot[1] > 3 * tpot[0]);
  assert_true(tpot[1] > 0.038 && tpot[1] < 0.045);
  char *out = NULL;
  assert_int_equal(tu_run_ferry("sim --model tiny-dense --hw h100-pcie --synthetic rate=1,n=1,prompt=4,output=2 --runtime pcie4-x16",
                                &out), 1);
  assert_true(tu_contains(out, "not a runtime"));
  free(out);
  assert_int_equal(tu_run_ferry("run --model x --synthetic rate=1,n=1,prompt=4,output=2 --runtime eager", &out), 2);
  free(out);
}

/* --host-memory pageable: copies from ordinary memory run at the link's pageable rate and the
 * host waits for each, so a streamed model decodes more slowly than from pinned memory; a real
 * run accepts it too (the host executor then leaves its host tier unlocked) and records it. */
static void test_host_memory_pageable(void **state) {
  (void)state;
  double tpot[2];
  static const char *const mem[2] = {"pinned", "pageable"};
  for (int i = 0; i < 2; i++) {
    char args[256], *out = NULL;
    snprintf(args, sizeof args, "sim --model llama-3-8b --hw l4 --device-budget 8GiB --synthetic rate=1,n=1,prompt=16,output=4 "
                                "--host-memory %s --quiet", mem[i]);
    if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
    tpot[i] = tpot_s(out);
    free(out);
  }
  /* l4's PCIe 4 link: 31.5 GB/s pinned, 15.8 GB/s pageable (the part's default) */
  assert_true(tpot[1] > 1.5 * tpot[0]);
  char args[1024], *out = NULL;
  assert_int_equal(tu_run_ferry("sim --model tiny-dense --hw l4 --synthetic rate=1,n=1,prompt=4,output=2 --host-memory gpu", &out), 2);
  assert_true(tu_contains(out, "--host-memory: expected 'pinned' or 'pageable'"));
  free(out);
  snprintf(args, sizeof args, "model gen --preset tiny-dense --layers 2 --out '%s/pageable-model' --quiet", tmp);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "run --model '%s/pageable-model' --synthetic rate=100,n=2,prompt=8,output=3 --device-budget 4MiB "
                              "--host-memory pageable --db '%s/pageable.db' --quiet", tmp, tmp);
  if (tu_run_ferry(args, &out) != 0) fail_msg("%s", out);
  assert_true(tu_contains(out, "requests: 2 done"));
  free(out);
  snprintf(args, sizeof args, "%s/pageable.db", tmp);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(args, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_stmt *q = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, "SELECT config_json FROM runs", -1, &q, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  assert_true(strstr((const char *)sqlite3_column_text(q, 0), "\"host_memory\":\"pageable\"") != NULL);
  sqlite3_finalize(q);
  sqlite3_close(db);
}

/* Disk-homed weights: reads drop their pages by default (as real runs do), so every step reads
 * the disk; with --keep-cache the page cache in the host memory the budget leaves serves the
 * second read on, unless the budget leaves too little for the streamed weights. */
static void test_keep_cache(void **state) {
  (void)state;
  static const char *const opts[3] = {"", "--keep-cache", "--keep-cache --host-budget 250GiB"};
  double tpot[3];
  for (int i = 0; i < 3; i++) {
    char args[512], *out = NULL;
    snprintf(args, sizeof args, "sim --model llama-3-8b --hw l4 --device-budget 8GiB --home disk "
                                "--synthetic rate=1,n=1,prompt=16,output=4 %s", opts[i]);
    if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s: %s", args, out);
    tpot[i] = tpot_s(out);
    if (i == 1) assert_true(tu_contains(out, "ferry: page cache: "));
    free(out);
  }
  assert_true(tpot[1] < 0.5 * tpot[0]); /* 256 GiB host, 230 GiB budget: 26 GiB of cache */
  assert_true(fabs(tpot[2] / tpot[0] - 1) < 0.01); /* 6 GiB of cache for 13 GiB cycled: no hits */
  char *out = NULL;
  assert_int_equal(tu_run_ferry("sim --model tiny-dense --hw l4 --synthetic rate=1,n=1,prompt=4,output=2 --keep-cache --drop-cache", &out), 2);
  free(out);
}

struct attn_log {
  int64_t n, first_ns;
  uint64_t first_bytes;
  int64_t first_m;
};

static void attention_sink(void *user, const struct ferry_activity *a) {
  struct attn_log *l = user;
  if (a->kind != FERRY_ACT_KERNEL || !a->kind_name || strcmp(a->kind_name, "attention")) return;
  if (!l->n++) {
    l->first_ns = a->end_ns - a->start_ns;
    l->first_bytes = a->bytes;
  }
}

/* A batch of long prompts prefilled in one step costs, per layer, one flash-attention kernel's
 * roofline: the causal flops at the fp16 peak and the cached K and V read once per tile of 128
 * queries (OPT-30B, 8 prompts of 512 tokens, on a T4), not once per query; plus the fixed time
 * of the kernel that appends the new K and V to the cache before it (sim/gpu_cost.c). */
static void test_prefill_attention_flash_roofline(void **state) {
  (void)state;
  enum { B = 8, S = 512 };
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "t4"), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  ferry_model *model = NULL;
  assert_int_equal(ferry_model_open(&model, "opt-30b"), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(model);
  struct ferry_engine_config cfg = base_config();
  cfg.max_batch = B;
  cfg.max_step_tokens = B * S;
  cfg.max_seq_tokens = S + 2;
  uint64_t dmin = 0, hmin = 0;
  assert_int_equal(ferry_engine_min_budgets(model, NULL, &cfg, &dmin, &hmin), FERRY_OK);
  cfg.device_budget_bytes = dmin;
  struct ferry_exec_config xc = {.device_budget_bytes = dmin, .lock_host_memory = 1};
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  struct attn_log log = {0};
  ferry_exec_set_sink(ex, attention_sink, &log);
  ferry_engine *eng = NULL;
  assert_int_equal(ferry_engine_create(&eng, model, NULL, ex, &cfg), FERRY_OK);
  struct ferry_engine_request reqs[B];
  for (int i = 0; i < B; i++) reqs[i] = (struct ferry_engine_request){.id = i, .prompt_tokens = S, .output_tokens = 2};
  struct ferry_run_options ro = {.time_scale = 1.0};
  assert_int_equal(ferry_engine_run(eng, reqs, B, &ro), FERRY_OK);
  /* one prefill step then one decode step, one attention kernel per layer each */
  assert_int_equal(log.n, 2 * mc->n_layers);
  const double h = (double)mc->n_heads, kvh = (double)mc->n_kv_heads, d = (double)mc->head_dim, T = B * S;
  /* per sequence: 4 h d S(S+1)/2 flops (about 2 S^2 d h); keys read 128 + 256 + 384 + 512 */
  const double flops = B * 4 * h * d * (S * (S + 1.0) / 2);
  const double kv_bytes = B * 1280.0 * kvh * d * 2 * 2, bytes = kv_bytes + T * h * d * 8 + T * kvh * d * 2 * 6;
  assert_true((double)log.first_bytes == bytes);
  const double t_math = flops / (p->gpu.peak_tflops.fp16 * 1e3 * p->gpu.efficiency.attention);
  const double t_mem = bytes / (p->gpu.mem_bw_gbps * p->gpu.efficiency.gemv);
  const double want = 2.0 * (double)p->gpu.launch_overhead_ns + sqrt(t_math * t_math + t_mem * t_mem);
  if (fabs((double)log.first_ns - want) > 1.0)
    fail_msg("prefill attention of layer 0: %lld ns, the flash roofline says %.0f ns", (long long)log.first_ns, want);
  /* read per query, the cached keys would have been 8 x 131328 reads: 100 times the traffic */
  assert_true(kv_bytes * 100 < B * (S * (S + 1.0) / 2) * kvh * d * 2 * 2);
  ferry_engine_destroy(eng);
  ferry_exec_destroy(ex);
  ferry_model_close(model);
  ferry_hw_close(hw);
}

/* Without --device-budget a simulated GPU gets 90% of its memory: a model that fits stays
 * resident, a larger one is offloaded with the last layers filling what streaming leaves (so
 * a bigger GPU is faster on the same link), and a budget beyond the GPU is refused. */
static void test_default_budget(void **state) {
  (void)state;
  char *out = NULL;
  const char *work = " --synthetic rate=1,n=1,prompt=16,output=3 --as-fast-as-possible";
  char args[512];
  snprintf(args, sizeof args, "sim --model llama-2-70b --hw rtx-4090%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "device budget 21.60 GiB (90% of rtx-4090's 24.00 GiB"));
  assert_true(tu_contains(out, "the last layers fill what streaming leaves"));
  /* the desktop's 64 GiB of host memory cannot hold the 128 GiB model: the rest comes from disk */
  assert_true(tu_contains(out, "host budget 57.60 GiB (90% of rtx-4090's host memory, 64.00 GiB"));
  assert_true(tu_contains(out, "streamed from disk"));
  assert_false(tu_contains(out, "moved: disk 0 B"));
  assert_true(tu_contains(out, "layer 79                         1.59 GiB  pinned on device"));
  const char *peak = strstr(out, "peak device ");
  assert_non_null(peak);
  double peak_gib = 0;
  assert_int_equal(sscanf(peak, "peak device %lf GiB of 21.60 GiB", &peak_gib), 1);
  assert_true(peak_gib > 15 && peak_gib <= 21.60);
  const double filled = tpot_s(out);
  free(out);
  /* the report draws the budgets the run had, defaults included (run meta), not "unlimited" */
  snprintf(args, sizeof args, "sim --model llama-2-70b --hw rtx-4090 --quiet --db '%s/default.db'%s", tmp, work);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "report --db '%s/default.db' --out '%s/default-report'", tmp, tmp);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "%s/default-report/tables/memory_peaks.csv", tmp);
  FILE *csv = fopen(args, "r");
  assert_non_null(csv);
  char text[1024] = "";
  size_t got = fread(text, 1, sizeof text - 1, csv);
  text[got] = '\0';
  fclose(csv);
  assert_true(tu_contains(text, ",21.6,"));
  assert_true(tu_contains(text, ",57.6,"));
  /* the same budget given explicitly streams every layer: slower */
  snprintf(args, sizeof args, "sim --model llama-2-70b --hw rtx-4090 --device-budget 21.6GiB%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  const double streamed = tpot_s(out);
  free(out);
  assert_true(filled < 0.95 * streamed);
  /* and with --fill-budget as fast as the default */
  snprintf(args, sizeof args, "sim --model llama-2-70b --hw rtx-4090 --device-budget 21.6GiB --fill-budget%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tpot_s(out) < 0.95 * streamed);
  free(out);
  /* a bigger GPU on a link of the same generation: faster, because more of the model stays */
  snprintf(args, sizeof args, "sim --model llama-2-70b --hw a100-40gb-pcie%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "device budget 36.00 GiB"));
  assert_true(tpot_s(out) < filled);
  free(out);
  /* MoE: every token reads all attention, so the default keeps it resident and gives the rest to
   * the expert cache, which beats the same budget spent on experts alone */
  snprintf(args, sizeof args, "sim --model mixtral-8x7b --hw h100-pcie%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "device budget 72.00 GiB"));
  assert_true(tu_contains(out, "attention resident, the expert cache takes the rest"));
  const double moe_default = tpot_s(out);
  free(out);
  snprintf(args, sizeof args, "sim --model mixtral-8x7b --hw h100-pcie --device-budget 72GiB%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(moe_default < 0.95 * tpot_s(out));
  free(out);
  /* a model that fits: everything resident, nothing streamed */
  snprintf(args, sizeof args, "sim --model llama-2-7b --hw rtx-4090%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "the model fits, everything resident"));
  assert_true(tu_contains(out, "host->device 0 B"));
  free(out);
  /* more than the GPU has */
  snprintf(args, sizeof args, "sim --model llama-2-7b --hw rtx-4090 --device-budget 30GiB%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "device budget 30.00 GiB exceeds the memory of rtx-4090 (24.00 GiB)"));
  free(out);
  /* a real run's host budget: half of the memory available */
  snprintf(args, sizeof args, "model gen --preset tiny-dense --dtype fp16 --out '%s/td' --quiet", tmp);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "run --model '%s/td' --synthetic rate=1,n=1,prompt=8,output=2 --device-budget 1GiB --plan-only",
           tmp);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "this machine has available); --host-budget to change"));
  assert_false(tu_contains(out, "of unlimited budget"));
  free(out);
  /* --plan-only sizes the KV cache from the requests as the run does, and says so without any */
  assert_int_equal(tu_run_ferry("sim --model llama-2-7b --hw h100-pcie --synthetic rate=1,n=2,prompt=32,output=16 "
                                "--plan-only", &out), 0);
  assert_true(tu_contains(out, "(8 sequences x 48 tokens"));
  free(out);
  assert_int_equal(tu_run_ferry("sim --model llama-2-7b --plan-only", &out), 0);
  assert_true(tu_contains(out, "sized for 2048 tokens per sequence"));
  assert_true(tu_contains(out, "(8 sequences x 2048 tokens"));
  free(out);
  snprintf(args, sizeof args, "sim --model llama-2-7b --hw rtx-4090 --host-budget 1TiB%s", work);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "host budget 1.00 TiB exceeds the host memory of rtx-4090 (64.00 GiB)"));
  free(out);
}

static int32_t no_prediction(void *user, const struct ferry_expert_predict_request *rq, int32_t *out_ids,
                             int32_t max_ids) {
  (void)user, (void)rq, (void)out_ids, (void)max_ids;
  return 0;
}

/* ferry_engine_prefetch_depth_used(): the depth sizes streamed blocks' slots, so it is used by a
 * dense model streaming its layers; an MoE model with its attention resident and its experts
 * cached uses it only with a predictor or pressure control; a resident model never. */
static void test_prefetch_depth_used(void **state) {
  (void)state;
  ferry_model *dense = NULL, *moe = NULL;
  assert_int_equal(ferry_model_open(&dense, "tiny-dense"), FERRY_OK);
  assert_int_equal(ferry_model_open(&moe, "tiny-moe"), FERRY_OK);
  uint64_t whole = 0, host_min = 0;
  struct ferry_engine_config all = {.resident_all = 1};
  assert_int_equal(ferry_engine_min_budgets(dense, NULL, &all, &whole, &host_min), FERRY_OK);
  int used = -1;
  /* between the streaming minimum and the whole model: layers stream in blocks */
  struct ferry_engine_config d = {.block_layers = 1, .prefetch_depth = 1};
  uint64_t stream_min = 0;
  assert_int_equal(ferry_engine_min_budgets(dense, NULL, &d, &stream_min, &host_min), FERRY_OK);
  assert_true(stream_min < whole);
  d.device_budget_bytes = stream_min + (whole - stream_min) / 4;
  assert_int_equal(ferry_engine_prefetch_depth_used(dense, NULL, &d, &used), FERRY_OK);
  assert_int_equal(used, 1);
  d.resident_all = 1;
  d.device_budget_bytes = 0;
  assert_int_equal(ferry_engine_prefetch_depth_used(dense, NULL, &d, &used), FERRY_OK);
  assert_int_equal(used, 0);
  /* experts cached: room for the attention and a few expert slots */
  uint64_t attn = 0, moe_whole = 0;
  struct ferry_engine_config a = {.resident_attention = 1, .prefetch_depth = 1};
  assert_int_equal(ferry_engine_min_budgets(moe, NULL, &a, &attn, &host_min), FERRY_OK);
  assert_int_equal(ferry_engine_min_budgets(moe, NULL, &all, &moe_whole, &host_min), FERRY_OK);
  assert_true(attn < moe_whole);
  a.device_budget_bytes = attn + (moe_whole - attn) / 4;
  assert_int_equal(ferry_engine_prefetch_depth_used(moe, NULL, &a, &used), FERRY_OK);
  assert_int_equal(used, 0);
  a.prefetch_depth = 3;
  assert_int_equal(ferry_engine_prefetch_depth_used(moe, NULL, &a, &used), FERRY_OK);
  assert_int_equal(used, 0);
  struct ferry_engine_config p = a;
  p.predict = no_prediction;
  assert_int_equal(ferry_engine_prefetch_depth_used(moe, NULL, &p, &used), FERRY_OK);
  assert_int_equal(used, 1);
  p = a;
  p.pressure.enabled = 1;
  assert_int_equal(ferry_engine_prefetch_depth_used(moe, NULL, &p, &used), FERRY_OK);
  assert_int_equal(used, 1);
  /* attention streamed too: its blocks' slots follow the depth */
  p = a;
  p.resident_attention = 0;
  assert_int_equal(ferry_engine_prefetch_depth_used(moe, NULL, &p, &used), FERRY_OK);
  assert_int_equal(used, 1);
  /* a budget below the working set: the error, and "used" (nothing can be said) */
  p = a;
  p.device_budget_bytes = 1;
  assert_int_equal(ferry_engine_prefetch_depth_used(moe, NULL, &p, &used), FERRY_ERR_BUDGET);
  assert_int_equal(used, 1);
  ferry_model_close(dense);
  ferry_model_close(moe);
}

/* The default budgets are a library decision (ferry_engine_plan_budgets()), the same for
 * `ferry sim`, `ferry run` and any program: a model that fits stays resident, a larger dense one
 * pins its last layers in what is left, a budget beyond the machine is refused, and a real
 * host tier gets half of the memory available. */
static void test_plan_budgets(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  uint64_t need = 0, host_min = 0;
  struct ferry_engine_config whole = {.resident_all = 1};
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &whole, &need, &host_min), FERRY_OK);
  struct ferry_machine_memory big = {.gpu_name = "big", .gpu_bytes = 4 * need, .gpu_free_bytes = UINT64_MAX,
                                     .host_available_bytes = 8ull << 30};
  struct ferry_engine_config c = {.block_layers = 1, .prefetch_depth = 1};
  struct ferry_budget_plan plan;
  assert_int_equal(ferry_engine_plan_budgets(m, NULL, &big, &c, &plan), FERRY_OK);
  assert_true(plan.device_defaulted && plan.fits && c.resident_all && !c.fill_budget);
  assert_true(c.device_budget_bytes == (uint64_t)((double)big.gpu_bytes * 0.9));
  assert_true(plan.host_defaulted && c.host_budget_bytes == 4ull << 30);
  assert_true(tu_contains(plan.device_note, "the model fits, everything resident"));
  /* a GPU smaller than the model: offloaded, the last layers filling what streaming leaves */
  struct ferry_machine_memory small = big;
  small.gpu_bytes = need / 2;
  struct ferry_engine_config d = {.block_layers = 1, .prefetch_depth = 1};
  assert_int_equal(ferry_engine_plan_budgets(m, NULL, &small, &d, &plan), FERRY_OK);
  assert_true(plan.device_defaulted && !plan.fits && !d.resident_all && d.fill_budget);
  /* a given budget is kept, and one beyond the GPU refused */
  struct ferry_engine_config e = {.device_budget_bytes = need / 4};
  assert_int_equal(ferry_engine_plan_budgets(m, NULL, &small, &e, &plan), FERRY_OK);
  assert_true(!plan.device_defaulted && e.device_budget_bytes == need / 4 && !e.fill_budget);
  e.device_budget_bytes = need;
  assert_int_equal(ferry_engine_plan_budgets(m, NULL, &small, &e, &plan), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "exceeds the memory of big"));
  /* a GPU another process fills: at most its free memory less a reserve */
  struct ferry_machine_memory busy = big;
  busy.gpu_free_bytes = 0;
  struct ferry_engine_config f = {0};
  assert_int_equal(ferry_engine_plan_budgets(m, NULL, &busy, &f, &plan), FERRY_ERR_NOMEM);
  ferry_model_close(m);
}

/* Bytes of the weights outside the layers that --stream-embeddings fetches each step: the
 * embeddings, the final norm and the head, and a tied head's table a second time. */
static uint64_t streamed_global_bytes(const ferry_model *m) {
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  uint64_t bytes = 0;
  for (size_t i = 0; i < ferry_model_tensor_count(m); i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    if (t->layer >= 0) continue;
    const uint64_t b = (uint64_t)t->numel * ferry_dtype_size(mc->dtype);
    switch (t->role) {
      case FERRY_ROLE_EMBED: bytes += mc->tied_embeddings ? 2 * b : b; break;
      case FERRY_ROLE_POS_EMBED:
      case FERRY_ROLE_EMBED_NORM:
      case FERRY_ROLE_EMBED_NORM_BIAS:
      case FERRY_ROLE_FINAL_NORM:
      case FERRY_ROLE_FINAL_NORM_BIAS:
      case FERRY_ROLE_LM_HEAD:
      case FERRY_ROLE_LM_HEAD_BIAS: bytes += b; break;
      default: break;
    }
  }
  return bytes;
}

/* Host-to-device bytes of a step in the steady state (every step after the first issues the
 * same fetches for a dense model: one turn of the cyclic block order); fails if they vary. */
static uint64_t steady_step_h2d(const struct run *r) {
  int64_t n = 0;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(r->eng, &n);
  assert_true(n >= 4);
  for (int64_t i = 2; i < n - 1; i++) assert_int_equal(sm[i].bytes_h2d, sm[1].bytes_h2d);
  return sm[1].bytes_h2d;
}

/* --stream-embeddings (DeepSpeed ZeRO-3's offloaded embeddings and head): each step fetches the
 * embeddings and the head like layer blocks, so its host-to-device bytes grow by exactly their
 * bytes, the token table twice for a tied head (OPT), once for an untied one (Llama), and the
 * run stays within its budget. */
static void test_stream_embeddings_bytes(void **state) {
  (void)state;
  ferry_hw *hw = profile("stream_emb", "100");
  ferry_model *base = NULL;
  assert_int_equal(ferry_model_open(&base, "opt-6.7b"), FERRY_OK);
  struct ferry_model_config opt;
  assert_int_equal(ferry_model_config_derive(ferry_model_get_config(base), 4, 0.03, 2048, &opt), FERRY_OK);
  ferry_model_close(base);
  for (int tied = 0; tied <= 1; tied++) {
    uint64_t h2d[2];
    for (int stream = 0; stream <= 1; stream++) {
      ferry_model *m = NULL;
      if (tied) assert_int_equal(ferry_model_create(&m, &opt), FERRY_OK);
      else assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
      assert_int_equal(ferry_model_get_config(m)->tied_embeddings, tied);
      struct ferry_engine_config c = base_config();
      c.stream_embeddings = stream;
      struct run r;
      run_model(&r, m, hw, c, 0);
      check_complete_within_budget(&r);
      h2d[stream] = steady_step_h2d(&r);
      if (stream) assert_int_equal(h2d[1] - h2d[0], streamed_global_bytes(r.model));
      run_free(&r);
    }
    assert_true(h2d[1] > h2d[0]);
  }
  ferry_hw_close(hw);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_budget),
      cmocka_unit_test(test_prefetch_depth_used),
      cmocka_unit_test(test_plan_budgets),
      cmocka_unit_test(test_dense_completes_deterministically),
      cmocka_unit_test(test_pipeline_copy_bound),
      cmocka_unit_test(test_pipeline_compute_bound),
      cmocka_unit_test(test_moe_expert_cache),
      cmocka_unit_test(test_moe_fixed_routing),
      cmocka_unit_test(test_kv_format_priced),
      cmocka_unit_test(test_cli),
      cmocka_unit_test(test_quantized_decode_faster),
      cmocka_unit_test(test_runtime_presets_in_sim),
      cmocka_unit_test(test_host_memory_pageable),
      cmocka_unit_test(test_keep_cache),
      cmocka_unit_test(test_stream_embeddings_bytes),
      cmocka_unit_test(test_prefill_attention_flash_roofline),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
