/* The registries' promise: a new executor, expert predictor or eviction policy is one file and
 * one registry line. This file defines three test-only ones and registers each with one line:
 * an executor ("recorder": every op completes at once on a virtual clock of 1 us per op, and is
 * counted), a predictor ("previous": the experts the previous token chose at the target layer)
 * and an eviction policy ("mru": evict the most recently used). The executor opens by name,
 * serves a model through the engine and runs `ferry run --backend recorder` into a result
 * database whose runs.kind names it; the predictor and the policy run in `ferry run` on the host
 * executor, in `ferry sim` and in `ferry predictor eval` (the commands' own code, in this
 * process). Nothing outside this file knows them. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "cli/cli.h"
#include "common/alloc.h"
#include "ferry/cache_policy.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/exec_registry.h"
#include "ferry/predict.h"
#include "runtime/exec/exec_impl.h"
#include "testutil.h"

/* --- the test executor ---------------------------------------------------------------------- */

struct recorder {
  int64_t now_ns;
  uint64_t ops[FERRY_OP_WAIT + 1];
  uint64_t kernels[FERRY_K_COUNT];
};

static struct recorder *rec(struct ferry_exec *ex) { return ex->backend_state; }
static uint64_t recorded_kernels; /* over every recorder of the process */

static void rec_destroy(struct ferry_exec *ex) {
  ferry_free(ex->backend_state);
  ferry__exec_fini(ex);
  ferry_free(ex);
}
static ferry_status rec_queue_init(struct ferry_exec *ex, int32_t q) { return FERRY_OK; }
static ferry_status rec_buf_alloc(struct ferry_exec *ex, ferry_buf *b) { return FERRY_OK; } /* no bytes behind it */
static void rec_buf_free(struct ferry_exec *ex, ferry_buf *b) {}

static ferry_status rec_submit(struct ferry_exec *ex, int32_t queue, const struct ferry_op *op) {
  struct recorder *r = rec(ex);
  const int64_t start = r->now_ns;
  r->ops[op->kind]++;
  if (op->kind == FERRY_OP_KERNEL) {
    r->kernels[op->u.kernel.kind]++;
    recorded_kernels++;
  }
  if (op->kind != FERRY_OP_RECORD && op->kind != FERRY_OP_WAIT) r->now_ns += 1000;
  if (op->kind == FERRY_OP_RECORD) {
    atomic_store(&op->u.event.ev->done_gen, op->u.event.gen);
    op->u.event.ev->done_time_ns = r->now_ns;
  }
  ferry__exec_op_done(ex, queue, op, start, r->now_ns);
  return FERRY_OK;
}

static ferry_status rec_sync(struct ferry_exec *ex, ferry_event *ev, uint64_t gen) { return FERRY_OK; }
static ferry_status rec_drain(struct ferry_exec *ex) { return FERRY_OK; }
static int64_t rec_now(struct ferry_exec *ex) { return rec(ex)->now_ns; }
static void rec_sleep_until(struct ferry_exec *ex, int64_t t) {
  if (t > rec(ex)->now_ns) rec(ex)->now_ns = t;
}

static const struct ferry_exec_backend recorder_backend = {
    .version = FERRY_EXEC_BACKEND_VERSION,
    .name = "recorder",
    .has_data = 0,
    .virtual_clock = 1,
    .destroy = rec_destroy,
    .queue_init = rec_queue_init,
    .buf_alloc = rec_buf_alloc,
    .buf_free = rec_buf_free,
    .submit = rec_submit,
    .sync = rec_sync,
    .drain = rec_drain,
    .now = rec_now,
    .sleep_until = rec_sleep_until,
};

static ferry_status recorder_open(ferry_exec **out, const struct ferry_exec_params *p) {
  struct ferry_exec *ex = ferry__calloc(1, sizeof *ex);
  struct recorder *r = ferry__calloc(1, sizeof *r);
  if (!ex || !r) {
    ferry_free(ex);
    ferry_free(r);
    return FERRY_ERR_NOMEM;
  }
  ferry__exec_init(ex, &recorder_backend, &p->config);
  ex->backend_state = r;
  *out = ex;
  return FERRY_OK;
}

static const struct ferry_exec_info recorder_info = {
    .version = FERRY_EXEC_INFO_VERSION,
    .name = "recorder",
    .description = "test only: counts every op, computes nothing, 1 us per op",
    .caps = FERRY_EXEC_CAP_VIRTUAL,
    .open = recorder_open,
};

/* --- the test predictor: the previous token's choice at the target layer ----------------- */

struct previous {
  int32_t n_layers, k;
  int32_t last[64][16]; /* [layer][rank] the last choice seen, -1 before any */
};
static uint64_t previous_predictions;

static ferry_status previous_create(void **state, const struct ferry_predictor_config *cfg) {
  struct previous *p = ferry__calloc(1, sizeof *p);
  if (!p || cfg->n_layers > 64 || cfg->top_k > 16) {
    ferry_free(p);
    return FERRY_ERR_INVALID;
  }
  p->n_layers = cfg->n_layers;
  p->k = cfg->top_k;
  memset(p->last, -1, sizeof p->last);
  *state = p;
  return FERRY_OK;
}

static void previous_free(void *state) { ferry_free(state); }

static void previous_observe(void *state, const struct ferry_predict_context *ctx, int32_t k, const int32_t *ids) {
  struct previous *p = state;
  for (int32_t i = 0; i < k && i < 16; i++) p->last[ctx->layer][i] = ids[i];
}

static ferry_status previous_predict(void *state, const struct ferry_predict_context *ctx, int32_t ahead, int32_t *out,
                                     int32_t max, int32_t *n) {
  const struct previous *p = state;
  *n = 0;
  for (int32_t i = 0; i < p->k && *n < max; i++)
    if (p->last[ctx->layer + ahead][i] >= 0) out[(*n)++] = p->last[ctx->layer + ahead][i];
  previous_predictions++;
  return FERRY_OK;
}

static const struct ferry_predictor_ops previous_ops = {
    .version = FERRY_PREDICTOR_OPS_VERSION, .name = "previous",
    .description = "test only: the previous token's choice at the target layer",
    .needs = FERRY_PREDICT_PREDICTS, .create = previous_create, .free = previous_free, .observe = previous_observe,
    .predict = previous_predict};

/* --- the test eviction policy: the most recently used goes ------------------------------- */

struct mru {
  uint64_t clock, stamp[];
};
static uint64_t mru_victims;

static ferry_status mru_create(void **state, const struct ferry_cache_geometry *g) {
  struct mru *m = ferry__calloc(1, sizeof *m + (size_t)g->n_slots * sizeof m->stamp[0]);
  *state = m;
  return m ? FERRY_OK : FERRY_ERR_NOMEM;
}
static void mru_free(void *state) { ferry_free(state); }
static void mru_touch(void *state, int32_t slot, int32_t unit) {
  struct mru *m = state;
  m->stamp[slot] = ++m->clock;
}
static int32_t mru_victim(void *state, const int32_t *slot_unit, const uint8_t *is_protected, int32_t n_slots) {
  const struct mru *m = state;
  int32_t victim = -1;
  for (int32_t s = 0; s < n_slots; s++)
    if (!is_protected[s] && slot_unit[s] >= 0 && (victim < 0 || m->stamp[s] > m->stamp[victim])) victim = s;
  mru_victims++;
  return victim;
}

static const struct ferry_cache_policy_ops mru_ops = {
    .version = FERRY_CACHE_POLICY_VERSION, .name = "mru", .description = "test only: evict the most recently used",
    .create = mru_create, .free = mru_free, .touch = mru_touch, .victim = mru_victim};

/* --- the tests ------------------------------------------------------------------------------ */

static char *tmp;
static char model_dir[600], moe_dir[600];

static int setup(void **state) {
  (void)state;
  /* one registry line each */
  if (ferry_exec_register(&recorder_info) != FERRY_OK || ferry_predictor_register(&previous_ops) != FERRY_OK ||
      ferry_cache_policy_register(&mru_ops) != FERRY_OK)
    return -1;
  tmp = tu_mkdtemp("registry");
  snprintf(model_dir, sizeof model_dir, "%s/dense", tmp);
  snprintf(moe_dir, sizeof moe_dir, "%s/moe", tmp);
  char args[800];
  snprintf(args, sizeof args, "model gen --preset tiny-dense --dtype fp32 --quiet --out '%s'", model_dir);
  if (tu_run_ferry(args, NULL) != 0) return -1;
  snprintf(args, sizeof args, "model gen --preset tiny-moe --dtype fp32 --quiet --out '%s'", moe_dir);
  return tu_run_ferry(args, NULL) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

static void test_registry_lists_it(void **state) {
  (void)state;
  const struct ferry_exec_info *x = ferry_exec_registry_find("recorder");
  assert_ptr_equal(x, &recorder_info);
  int host = 0, sim = 0, mine = 0;
  for (size_t i = 0; i < ferry_exec_registry_count(); i++) {
    host |= !strcmp(ferry_exec_registry_at(i)->name, "host");
    sim |= !strcmp(ferry_exec_registry_at(i)->name, "sim");
    mine |= ferry_exec_registry_at(i) == &recorder_info;
  }
  assert_true(host && sim && mine);
  assert_null(ferry_exec_registry_at(ferry_exec_registry_count()));
  /* a name is taken once, and has the registry's form */
  assert_int_equal(ferry_exec_register(&recorder_info), FERRY_ERR_EXISTS);
  struct ferry_exec_info bad = recorder_info;
  bad.name = "Not a name";
  assert_int_equal(ferry_exec_register(&bad), FERRY_ERR_INVALID);
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_open("recordr", NULL, &ex), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "did you mean recorder?"));
  assert_int_equal(ferry_exec_open("sim", NULL, &ex), FERRY_ERR_INVALID); /* needs a profile */
  assert_true(tu_contains(ferry_last_error(), "hardware profile"));
}

/* Through the engine, opened by name: a dense model served, every op on the recorder. */
static void test_engine_runs_on_it(void **state) {
  (void)state;
  ferry_model *m = NULL;
  ferry_store *st = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *eng = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&st, model_dir), FERRY_OK);
  struct ferry_exec_params p = {.config = {.device_budget_bytes = 4u << 20}};
  assert_int_equal(ferry_exec_open("recorder", &p, &ex), FERRY_OK);
  assert_string_equal(ferry_exec_name(ex), "recorder");
  struct ferry_engine_config c = {.block_layers = 1, .prefetch_depth = 1, .device_budget_bytes = 4u << 20, .seed = 1,
                                  .max_batch = 2, .max_seq_tokens = 16};
  assert_int_equal(ferry_engine_create(&eng, m, st, ex, &c), FERRY_OK);
  const struct ferry_engine_request reqs[2] = {{.id = 0, .prompt_tokens = 5, .output_tokens = 3},
                                               {.id = 1, .arrival_ns = 2000, .prompt_tokens = 4, .output_tokens = 2}};
  assert_int_equal(ferry_engine_run(eng, reqs, 2, NULL), FERRY_OK);
  struct ferry_serve_summary s;
  ferry_engine_summary(eng, &s);
  assert_int_equal(s.requests_done, 2);
  assert_int_equal(s.tokens_generated, 5);
  const struct recorder *r = rec(ex);
  assert_true(r->kernels[FERRY_K_MATMUL] > 0 && r->kernels[FERRY_K_ATTENTION] > 0 && r->kernels[FERRY_K_EMBED] > 0);
  assert_true(r->ops[FERRY_OP_COPY] > 0); /* streamed blocks: the budget holds part of the model */
  assert_true(s.duration_ns > 0 && s.duration_ns % 1000 == 0); /* its clock: whole microseconds */
  ferry_engine_destroy(eng);
  ferry_exec_destroy(ex);
  ferry_store_close(st);
  ferry_model_close(m);
}

static int64_t q1(const char *db, const char *sql, char *text, size_t len) {
  sqlite3 *s;
  int64_t v = -1;
  if (sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(s, sql, -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW) {
      v = sqlite3_column_int64(q, 0);
      if (text) snprintf(text, len, "%s", sqlite3_column_text(q, 0) ? (const char *)sqlite3_column_text(q, 0) : "");
    }
    sqlite3_finalize(q);
  }
  sqlite3_close(s);
  return v;
}

/* Through the command: `ferry run --backend recorder` takes the name from the registry (its
 * help lists it), serves, and records runs.kind = 'recorder'. */
static void test_cli_runs_on_it(void **state) {
  (void)state;
  char db[700];
  snprintf(db, sizeof db, "%s/study.db", tmp);
  char *argv[] = {"run", "--model", model_dir, "--backend", "recorder", "--synthetic", "rate=50,n=3,prompt=6,output=3",
                  "--device-budget", "4MiB", "--db", db, "--quiet", NULL};
  const uint64_t before = recorded_kernels;
  fflush(stdout);
  assert_int_equal(cmd_run(12, argv), CLI_OK);
  assert_true(recorded_kernels > before);
  char kind[32];
  assert_true(q1(db, "SELECT kind FROM runs WHERE complete = 1", kind, sizeof kind) >= 0);
  assert_string_equal(kind, "recorder");
  assert_int_equal(q1(db, "SELECT count(*) FROM requests", NULL, 0), 3);
  assert_int_equal(q1(db, "SELECT json_extract(config_json, '$.executor') = 'recorder' FROM runs", NULL, 0), 1);
  /* and its kernels are on the run's timeline, as any executor's */
  assert_true(q1(db, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL", NULL, 0) > 0);
}

/* The test predictor and eviction policy in the engine on the host executor, in the simulator
 * and in the evaluator, through the commands, by their names. */
static void test_predictor_and_policy_everywhere(void **state) {
  (void)state;
  char routing[700];
  snprintf(routing, sizeof routing, "%s/routing.jsonl", tmp);
  uint64_t p0 = previous_predictions, v0 = mru_victims;
  char *run[] = {"run", "--model", moe_dir, "--synthetic", "rate=50,n=4,prompt=8,output=6", "--device-budget", "10MiB",
                 "--block-layers", "1", "--predictor", "previous", "--expert-cache", "mru", "--record-routing", routing,
                 "--quiet", NULL};
  fflush(stdout);
  assert_int_equal(cmd_run(16, run), CLI_OK);
  assert_true(previous_predictions > p0 && mru_victims > v0);
  p0 = previous_predictions, v0 = mru_victims;
  char *sim[] = {"sim", "--model", "tiny-moe", "--hw", "h100-pcie", "--synthetic", "rate=50,n=4,prompt=8,output=6",
                 "--device-budget", "10MiB", "--predictor", "previous", "--expert-cache", "mru", "--quiet", NULL};
  assert_int_equal(cmd_sim(14, sim), CLI_OK);
  assert_true(previous_predictions > p0 && mru_victims > v0);
  p0 = previous_predictions, v0 = mru_victims;
  char *eval[] = {"predictor", "eval", "--routing", routing, "--variant", "previous,frequency", "--expert-cache", "mru",
                  "--cache-slots", "6", "--bootstrap", "20", NULL};
  assert_int_equal(cmd_predictor(12, eval), CLI_OK);
  assert_true(previous_predictions > p0 && mru_victims > v0);
  fflush(stdout);
  /* an unknown one is named with the nearest */
  char *bad[] = {"sim", "--model", "tiny-moe", "--hw", "h100-pcie", "--synthetic", "n=2", "--predictor", "previus", NULL};
  assert_int_equal(cmd_sim(9, bad), CLI_USAGE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry_lists_it),
      cmocka_unit_test(test_engine_runs_on_it),
      cmocka_unit_test(test_cli_runs_on_it),
      cmocka_unit_test(test_predictor_and_policy_everywhere),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
