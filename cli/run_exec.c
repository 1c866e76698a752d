/* The steps `ferry run` and `ferry sim` share once options are parsed: open the model (and its
 * weights for real executors), create the executor, build the engine, serve, report. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/fsutil.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/model.h"
#include "ferry/store.h"

int run_execute(struct run_args *a) {
  int rc = CLI_FAIL;
  int sim = !strcmp(a->cmd, "sim");
  ferry_model *model = NULL;
  ferry_store *store = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *eng = NULL;
  struct ferry_engine_request *reqs = NULL;
  int64_t n = 0;
  ferry_status st = ferry_model_open(&model, a->model);
  if (st != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  if (!sim || ferry__is_dir(a->model)) {
    if (!sim && !ferry__is_dir(a->model)) {
      cli_fail(FERRY_ERR_INVALID, "--model %s: 'ferry %s' needs a model folder with weights (ferry model gen writes one)",
               a->model, a->cmd);
      goto out;
    }
    if (!sim && (st = ferry_store_open(&store, a->model)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
  }
  if (!a->plan_only) {
    if ((st = run_load_requests(a, &reqs, &n)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
  }
  if (a->plan_only) {
    st = ferry_engine_plan_only(model, store, &a->ec, stdout);
    if (st != FERRY_OK) cli_fail(st, NULL);
    else rc = CLI_OK;
    goto out;
  }
  struct ferry_exec_config xc = {.device_budget_bytes = a->ec.device_budget_bytes,
                                 .host_budget_bytes = a->ec.host_budget_bytes,
                                 .lock_host_memory = 1,
                                 .compute_threads = a->threads};
  if (sim) {
    cli_fail(FERRY_ERR_UNSUPPORTED, "ferry sim: the simulator executor is not built yet");
    goto out;
  } else if (!strcmp(a->backend, "cuda")) {
    st = ferry_exec_create_cuda(&ex, &xc);
  } else {
    st = ferry_exec_create_host(&ex, &xc);
  }
  if (st != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  if ((st = ferry_engine_create(&eng, model, store, ex, &a->ec)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  if (a->progress) ferry_engine_print_plan(eng, stderr);
  struct ferry_run_options ro = {.time_scale = a->time_scale, .as_fast_as_possible = a->as_fast, .progress = a->progress};
  if ((st = ferry_engine_run(eng, reqs, n, &ro)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  struct ferry_run_summary sum;
  ferry_engine_summary(eng, &sum);
  ferry_run_summary_print(&sum, stdout);
  if (a->db) {
    cli_fail(FERRY_ERR_UNSUPPORTED, "--db: the result database is not built yet");
    goto out;
  }
  rc = CLI_OK;
out:
  ferry_engine_destroy(eng);
  ferry_exec_destroy(ex);
  ferry_store_close(store);
  ferry_model_close(model);
  ferry_free(reqs);
  return rc;
}
