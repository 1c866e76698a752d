/* NVTX ranges as a profiler sees them: the test process loads a real NVTX tool
 * (tests/nvtx_inject.c, through NVTX_INJECTION64_PATH, as Nsight Systems is loaded) and runs
 * the engine on the host executor. Every step, layer, block fetch and expert fetch must show
 * as a range of the domain "ferry", opened and closed once, layers nested in their step, in
 * the same number as the range activities the executor reports; the simulator, whose clock is
 * virtual, must show none. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/activity.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/routing.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "nvtx_inject.h"
#include "testutil.h"

#ifdef FERRY_NVTX_INJECT

static nvtx_seen_fn seen_fn;

/* Load the tool before anything makes an NVTX call: NVTX reads the variable once. */
static int setup(void **state) {
  (void)state;
  setenv("NVTX_INJECTION64_PATH", FERRY_NVTX_INJECT, 1);
  void *h = dlopen(FERRY_NVTX_INJECT, RTLD_NOW);
  if (!h) {
    fprintf(stderr, "test_nvtx: %s\n", dlerror());
    return -1;
  }
  seen_fn = (nvtx_seen_fn)dlsym(h, "ferry_test_nvtx_seen");
  return seen_fn ? 0 : -1;
}

static char *gen_model(const char *dir, const char *preset) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, preset), FERRY_OK);
  size_t n = strlen(dir) + strlen(preset) + 2;
  char *out = malloc(n);
  snprintf(out, n, "%s/%s", dir, preset);
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 5, .router_skew = 0.3};
  assert_int_equal(ferry_model_generate(m, &go, out, NULL), FERRY_OK);
  ferry_model_close(m);
  return out;
}

/* A generated tiny MoE model, opened: its folder, model and weights. */
struct tiny_moe {
  char *dir, *path;
  ferry_model *m;
  ferry_store *s;
};

static struct tiny_moe tiny_moe_open(const char *tag) {
  struct tiny_moe tm = {.dir = tu_mkdtemp(tag)};
  tm.path = gen_model(tm.dir, "tiny-moe");
  assert_int_equal(ferry_model_open(&tm.m, tm.path), FERRY_OK);
  assert_int_equal(ferry_store_open(&tm.s, tm.path), FERRY_OK);
  return tm;
}

static void tiny_moe_close(struct tiny_moe *tm) {
  ferry_store_close(tm->s);
  ferry_model_close(tm->m);
  tu_rmtree(tm->dir);
  free(tm->path);
  free(tm->dir);
}

/* Range activities by name, counted by the executor's sink. */
struct range_counts {
  int64_t step, layer, block_fetch, expert_fetch, load, prefill;
};

static void count_ranges(void *user, const struct ferry_activity *a) {
  struct range_counts *c = user;
  if (a->kind != FERRY_ACT_RANGE) return;
  if (!strcmp(a->name, "step")) c->step++;
  else if (!strcmp(a->name, "layer")) c->layer++;
  else if (!strcmp(a->name, "block fetch")) c->block_fetch++;
  else if (!strcmp(a->name, "expert fetch")) c->expert_fetch++;
  else if (!strcmp(a->name, "load weights")) c->load++;
  else if (!strcmp(a->name, "prefill")) c->prefill++;
}

static const struct ferry_engine_request requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 6, .output_tokens = 4},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 3, .output_tokens = 5},
};

/* Run the engine on `ex` with weights streamed (one-layer blocks, experts through a cache of
 * the minimum size); returns the summary and fills the activity counts. */
static void run(ferry_exec *ex, const ferry_model *m, ferry_store *s, struct range_counts *rc,
                struct ferry_serve_summary *sum, int routing) {
  struct ferry_engine_config c = {.max_batch = 2, .max_step_tokens = 8, .max_seq_tokens = 32, .seed = 3,
                                  .block_layers = 1, .prefetch_depth = 1};
  uint64_t dev = 0, host = 0;
  assert_int_equal(ferry_engine_min_budgets(m, s, &c, &dev, &host), FERRY_OK);
  c.device_budget_bytes = dev;
  ferry_routing_synth *rs = NULL;
  if (routing) {
    const struct ferry_model_config *mc = ferry_model_get_config(m);
    struct ferry_routing_synth_config rcfg = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                              .top_k = (int32_t)mc->experts_per_token, .seed = 9, .zipf = 0.8};
    assert_int_equal(ferry_routing_synth_create(&rs, &rcfg), FERRY_OK);
    c.routing = ferry_routing_synth_fn;
    c.routing_user = rs;
  }
  ferry_exec_set_sink(ex, count_ranges, rc);
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&e, m, s, ex, &c), FERRY_OK);
  struct ferry_run_options ro = {.as_fast_as_possible = 1};
  assert_int_equal(ferry_engine_run(e, requests, 2, &ro), FERRY_OK);
  ferry_engine_summary(e, sum);
  ferry_engine_destroy(e);
  ferry_exec_set_sink(ex, NULL, NULL);
  ferry_routing_synth_free(rs);
}

static int starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

/* Index of the end event of the range opened at event i, or -1. */
static int64_t end_of(const struct nvtx_seen_log *log, int64_t i) {
  for (int64_t j = i + 1; j < log->n; j++)
    if (log->events[j].kind == NVTX_SEEN_END && log->events[j].id == log->events[i].id) return j;
  return -1;
}

static void test_engine_ranges(void **state) {
  (void)state;
  struct tiny_moe tm = tiny_moe_open("nvtx");
  ferry_exec *ex = NULL;
  struct ferry_exec_config xc = {.compute_threads = 1};
  assert_int_equal(ferry_exec_create_host(&ex, &xc), FERRY_OK);
  seen_fn(1);
  struct range_counts rc = {0};
  struct ferry_serve_summary sum;
  run(ex, tm.m, tm.s, &rc, &sum, 0);
  const struct nvtx_seen_log *log = seen_fn(0);
  const int64_t n_layers = ferry_model_get_config(tm.m)->n_layers;

  assert_int_equal(log->domains_created, 1);
  assert_int_equal(log->dropped, 0);
  struct range_counts nv = {0};
  int64_t ends = 0;
  for (int64_t i = 0; i < log->n; i++) {
    const struct nvtx_seen *ev = &log->events[i];
    assert_true(ev->domain_ok);
    if (ev->kind == NVTX_SEEN_END) {
      ends++;
      continue;
    }
    assert_int_equal(ev->kind, NVTX_SEEN_START); /* the host executor pushes no kernel ranges */
    const int64_t j = end_of(log, i);
    assert_true(j > i); /* every range closed, after it opened */
    assert_true(ev->color != 0);
    if (starts_with(ev->message, "step ")) {
      nv.step++;
      assert_true(ev->has_payload);
      char want[32];
      snprintf(want, sizeof want, "step %lld", (long long)ev->payload);
      assert_string_equal(ev->message, want);
      /* the step's layers, all inside it, in order */
      int64_t layers = 0;
      for (int64_t k = i + 1; k < j; k++) {
        const struct nvtx_seen *in = &log->events[k];
        if (in->kind != NVTX_SEEN_START || !starts_with(in->message, "layer ")) continue;
        char lw[32];
        snprintf(lw, sizeof lw, "layer L%lld", (long long)layers);
        assert_string_equal(in->message, lw);
        assert_true(in->has_payload && in->payload == ev->payload);
        const int64_t e = end_of(log, k);
        assert_true(e > k && e < j);
        layers++;
      }
      assert_int_equal(layers, n_layers);
    } else if (starts_with(ev->message, "layer L")) {
      nv.layer++;
    } else if (starts_with(ev->message, "block fetch L")) {
      nv.block_fetch++;
    } else if (starts_with(ev->message, "expert fetch L")) {
      nv.expert_fetch++;
      assert_non_null(strstr(ev->message, " E"));
    } else if (!strcmp(ev->message, "load weights")) {
      nv.load++;
    } else if (starts_with(ev->message, "prefill ")) {
      nv.prefill++; /* a step that prefills says so, inside the step */
      assert_true(ev->has_payload);
      char want[32];
      snprintf(want, sizeof want, "prefill %lld", (long long)ev->payload);
      assert_string_equal(ev->message, want);
    } else {
      fail_msg("unexpected range '%s'", ev->message);
    }
  }
  fprintf(stderr, "test_nvtx: %lld ranges seen: %lld steps, %lld layers, %lld block fetches, %lld expert fetches\n",
          (long long)(log->n - ends), (long long)nv.step, (long long)nv.layer, (long long)nv.block_fetch,
          (long long)nv.expert_fetch);
  assert_int_equal(ends, log->n - ends);
  /* one NVTX range per range activity, and the engine really streamed */
  assert_int_equal(nv.step, sum.steps);
  assert_int_equal(nv.step, rc.step);
  assert_int_equal(nv.layer, sum.steps * n_layers);
  assert_int_equal(nv.layer, rc.layer);
  assert_int_equal(nv.block_fetch, rc.block_fetch);
  assert_int_equal(nv.expert_fetch, rc.expert_fetch);
  assert_int_equal(nv.load, 1);
  assert_int_equal(rc.load, 1);
  /* the prompts (6 and 3 tokens, 8 a step) prefill in the first two steps; the rest decode */
  assert_int_equal(nv.prefill, 2);
  assert_int_equal(rc.prefill, 2);
  assert_true(nv.block_fetch > 0);
  assert_true(nv.expert_fetch > 0 && sum.misses > 0);

  ferry_exec_destroy(ex);
  tiny_moe_close(&tm);
}

/* The simulator's ranges are in virtual time: activities, but no NVTX. */
static void test_sim_makes_none(void **state) {
  (void)state;
  struct tiny_moe tm = tiny_moe_open("nvtx-sim");
  ferry_exec *ex = NULL;
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  struct ferry_exec_config xc = {0};
  assert_int_equal(ferry_exec_create_sim(&ex, hw, &xc), FERRY_OK);
  seen_fn(1);
  struct range_counts rc = {0};
  struct ferry_serve_summary sum;
  run(ex, tm.m, tm.s, &rc, &sum, 1);
  assert_true(rc.step == sum.steps && rc.layer > 0);
  assert_int_equal(seen_fn(0)->n, 0);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  tiny_moe_close(&tm);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_ranges),
      cmocka_unit_test(test_sim_makes_none),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}

#else

static void test_no_nvtx(void **state) {
  (void)state;
  fprintf(stderr, "test_nvtx: SKIPPED: built without NVTX (FERRY_NVTX=OFF or no NVTX headers found)\n");
  skip();
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_nvtx)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
