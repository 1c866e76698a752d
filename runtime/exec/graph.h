/* Op graphs: a sequence of ops recorded as it is submitted and submitted again later by one
 * call, like a CUDA graph. The engine repeats the same op sequences many times (a layer's
 * attention for a given batch, one expert's fetch and FFN); an executor that only times ops
 * (sim) replays a recorded sequence far faster than the engine can build and enqueue it.
 * Events named as parameters when recording are replaced by others at launch, so one graph
 * serves every expert slot. Only executors whose backend has the graph members offer them, and
 * only while no activity sink is installed (a replay emits no per-op activity). Internal. */
#ifndef FERRY_EXEC_GRAPH_H
#define FERRY_EXEC_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/exec.h"

struct ferry_exec_graph;

enum ferry__graph_mode {
  FERRY__GRAPH_NONE,   /* not offered: build and submit every op */
  FERRY__GRAPH_LAUNCH, /* record once, launch after */
  FERRY__GRAPH_CHECK   /* record every time and compare with the graph that would have been launched */
};

/* Whether op graphs are worth using on ex now (enum ferry__graph_mode). */
int ferry__exec_graph_mode(ferry_exec *ex);

/* Start recording: the ops submitted from now on run as usual and are also recorded, until
 * ferry__exec_graph_end(). A wait the executor skips (its event done already) is recorded too:
 * a launch decides again. An event among params[0..n_params) is recorded as that parameter.
 * FERRY_ERR_BUSY when already recording; FERRY_ERR_UNSUPPORTED without graphs. */
ferry_status ferry__exec_graph_begin(ferry_exec *ex, ferry_event *const *params, int32_t n_params);

/* Stop recording; *out receives the graph (owned, ferry__exec_graph_free()). A host wait
 * (sync, sleep, drain) while recording makes it FERRY_ERR_INTERNAL: a graph holds queue ops
 * only. */
ferry_status ferry__exec_graph_end(ferry_exec *ex, struct ferry_exec_graph **out);

/* Submit g's ops again, args[i] in place of parameter i. Kernels recorded with a context
 * (attention's context_tokens) are timed with context_tokens instead when it is >= 0. */
ferry_status ferry__exec_graph_launch(ferry_exec *ex, const struct ferry_exec_graph *g, ferry_event *const *args,
                                      int64_t context_tokens);

/* A new step: the token arrays the kernels point at (ints, ints2: positions, slots) may hold
 * other values from now on. Until the next call they do not change, so a launch may reuse the
 * time of a kernel of the same shape and context timed since (every layer's attention); a
 * caller that never calls this gets every such kernel timed afresh. */
void ferry__exec_graph_step(ferry_exec *ex);

/* Stop recording and say (*same) whether launching g with context_tokens would have submitted
 * the ops just recorded (a check of a graph's key); nothing is kept. */
ferry_status ferry__exec_graph_check(ferry_exec *ex, const struct ferry_exec_graph *g, int64_t context_tokens, int *same);

/* Memory held by a graph. */
size_t ferry__exec_graph_bytes(ferry_exec *ex, const struct ferry_exec_graph *g);
/* Accepts NULL. */
void ferry__exec_graph_free(ferry_exec *ex, struct ferry_exec_graph *g);

#endif /* FERRY_EXEC_GRAPH_H */
