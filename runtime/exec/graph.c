/* Op graph wrappers (graph.h): what every backend would check is checked here once; the
 * recording and the replay belong to the backend (sim/exec_sim_fast.c). */
#include "exec_impl.h"
#include "graph.h"

int ferry__exec_graph_mode(ferry_exec *ex) {
  if (!ex->backend->graph_mode || ex->sink) return FERRY__GRAPH_NONE;
  return ex->backend->graph_mode(ex);
}

ferry_status ferry__exec_graph_begin(ferry_exec *ex, ferry_event *const *params, int32_t n_params) {
  if (!ex->backend->graph_begin)
    return ferry__err_set(&ex->err, FERRY_ERR_UNSUPPORTED, "the %s executor has no op graphs", ex->backend->name);
  if (ex->capturing) return ferry__err_set(&ex->err, FERRY_ERR_BUSY, "op graph: already recording one");
  if (n_params < 0 || (n_params > 0 && !params))
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: %d parameters", n_params);
  ferry_status st = ex->backend->graph_begin(ex, params, n_params);
  if (st == FERRY_OK) ex->capturing = 1;
  return st;
}

ferry_status ferry__exec_graph_end(ferry_exec *ex, struct ferry_exec_graph **out) {
  *out = NULL;
  if (!ex->capturing) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: not recording");
  ex->capturing = 0;
  return ex->backend->graph_end(ex, out);
}

ferry_status ferry__exec_graph_launch(ferry_exec *ex, const struct ferry_exec_graph *g, ferry_event *const *args,
                                      int64_t context_tokens) {
  if (!ex->backend->graph_launch || !g)
    return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: nothing to launch on the %s executor",
                          ex->backend->name);
  if (ex->capturing) return ferry__err_set(&ex->err, FERRY_ERR_BUSY, "op graph: launched while recording one");
  return ex->backend->graph_launch(ex, g, args, context_tokens);
}

ferry_status ferry__exec_graph_check(ferry_exec *ex, const struct ferry_exec_graph *g, int64_t context_tokens, int *same) {
  *same = 0;
  if (!ex->capturing) return ferry__err_set(&ex->err, FERRY_ERR_INVALID, "op graph: not recording");
  ex->capturing = 0;
  return ex->backend->graph_check(ex, g, context_tokens, same);
}

size_t ferry__exec_graph_bytes(ferry_exec *ex, const struct ferry_exec_graph *g) {
  return g && ex->backend->graph_bytes ? ex->backend->graph_bytes(g) : 0;
}

void ferry__exec_graph_free(ferry_exec *ex, struct ferry_exec_graph *g) {
  if (g && ex->backend->graph_free) ex->backend->graph_free(ex, g);
}

void ferry__exec_graph_step(ferry_exec *ex) { ex->graph_epoch++; }
