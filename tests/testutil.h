/* Helpers shared by the cmocka tests: temporary folders, test-data paths, running the ferry
 * command and capturing its output. */
#ifndef FERRY_TESTUTIL_H
#define FERRY_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the three includes above first. */
#include <cmocka.h>

#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/sim.h"

/* A fresh private folder under $TMPDIR (or /tmp); owned, remove with tu_rmtree + free. */
char *tu_mkdtemp(const char *tag);
void tu_rmtree(const char *path);
/* Path under tests/data (owned). */
char *tu_data_path(const char *name);
/* Path under ../shared (owned), or NULL if shared/ is not present. */
char *tu_shared_path(const char *name);
/* Run `ferry ARGS` (a shell-quoted string) and capture stdout+stderr into an owned string;
 * returns the exit status (or -1). */
int tu_run_ferry(const char *args, char **output);
/* tu_run_ferry with the arguments formatted printf-style (up to 2 KiB). */
int tu_run_ferryf(char **output, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Write a file with the given bytes; asserts on failure. */
void tu_write_file(const char *path, const void *data, size_t len);
/* Whether the text contains the needle (case-sensitive). */
int tu_contains(const char *text, const char *needle);
/* Fail the test unless `doc` matches docs/schemas/NAME.schema.json (python3-jsonschema, a test
 * dependency installed by scripts/setup-deps.sh: its absence fails too). */
struct cJSON;
void tu_check_schema(const struct cJSON *doc, const char *name);

struct ferry_gen_options;
/* A model folder DIR/NAME generated from a catalogue preset with the options; asserts on
 * failure; free() the returned path. */
char *tu_gen_model(const char *dir, const char *preset, const char *name, const struct ferry_gen_options *options);
/* tu_gen_model() of the tiny config tests/data/configs/tiny/NAME, generated into DIR/NAME. */
char *tu_gen_tiny(const char *dir, const char *name, const struct ferry_gen_options *options);

/* Every logits row an engine run hands out, appended in order: the user pointer of
 * tu_on_logits. Starts zeroed; free(v) when done. */
struct tu_logit_log {
  float *v;
  size_t n, cap;
};
/* A ferry_engine_config.on_logits callback appending to the struct tu_logit_log at user. */
void tu_on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                  int64_t vocab);

struct ferry_engine;
struct ferry_engine_config;
struct ferry_engine_request;
/* Run n requests over the model at model_dir on the host executor (one compute thread, config
 * c's device budget) as fast as possible, then call inspect(engine, user) before the engine is
 * destroyed (NULL: none). Any failure fails the test. */
void tu_run_host(const char *model_dir, const struct ferry_engine_config *c, const struct ferry_engine_request *reqs,
                 int64_t n, void (*inspect)(struct ferry_engine *engine, void *user), void *user);
struct ferry_model;
struct ferry_store;
/* What ferry_engine_plan_only() prints for model m (store s, or NULL) under configuration c;
 * free() it. A refused plan fails the test with the library's message. */
char *tu_plan_text(struct ferry_model *m, struct ferry_store *s, const struct ferry_engine_config *c);
/* The smallest device budget of configuration c for the model at model_dir
 * (ferry_engine_min_budgets(): its pinned layers, block slots and working set). Any failure fails
 * the test. */
uint64_t tu_min_device_budget(const char *model_dir, const struct ferry_engine_config *c);

/* Three requests the host-KV-cache tests simulate (A: prompt 100, 3 tokens; B: 300, 6; C: 40, 3;
 * TU_KV_SIM_N of them) and, by hand, the schedule the engine gives them with --max-batch 2 and
 * whole prompts per step: per step, each sequence's tokens and the rows its cache held before the
 * step (its position). A's third token is its last (the prefill gives the first). */
#define TU_KV_SIM_N 3
#define TU_KV_SIM_STEPS 6
const struct ferry_engine_request *tu_kv_sim_requests(void);
struct tu_seq_step {
  int32_t tokens, cached;
};
extern const struct tu_seq_step tu_kv_sim_schedule[TU_KV_SIM_STEPS][2];

/* A simulated serving run of llama-2-7b: the hardware profile hw (with the runtime preset
 * runtime when not NULL), a sim executor of exec's budgets, an activity sink when sink is set. */
struct tu_sim_setup {
  const char *hw, *runtime;
  struct ferry_exec_config exec;
  ferry_activity_fn sink;
  void *sink_user;
};
#define TU_SIM_MAX_STEPS 64
/* What it leaves: the summary, each step's metrics, and the executor's stats after loading
 * (loaded) and after serving (stats). */
struct tu_sim_result {
  struct ferry_serve_summary sum;
  struct ferry_sim_stats loaded, stats;
  int64_t steps;
  struct ferry_step_metrics sm[TU_SIM_MAX_STEPS];
};
/* Creates the engine of c on that executor and serves req (n of them) as fast as possible into r;
 * returns the engine's status (creating it, e.g. FERRY_ERR_BUDGET, or serving). Everything it
 * opened is closed again; a failure to open the profile, model or executor fails the test. */
ferry_status tu_sim_serve(const struct tu_sim_setup *setup, const struct ferry_engine_config *c,
                          const struct ferry_engine_request *req, int64_t n, struct tu_sim_result *r);

#endif
