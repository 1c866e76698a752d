/* Speed of a simulated trace replay: the engine on the `sim` executor serving a request trace
 * (by default the Azure 2023 conversation trace, Mixtral-8x7B shapes, h100-pcie with the native
 * runtime as `ferry sim` gives it, experts streamed from host memory). Prints wall and CPU
 * time, virtual time, ops/s (and events/s in the exact mode), and the figures that must not
 * depend on the mode; the goal is the whole Azure conversation trace in <= 30 s in the release
 * build (docs/simulator-speed.md).
 * Usage: sim_replay [TRACE [MODEL [HW [DEVICE_BUDGET [MAX_BATCH [MAX_SEQ_TOKENS [MAX_REQUESTS [fast|exact]]]]]]]] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/units.h"
#include "ferry/engine.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/routing.h"
#include "ferry/sim.h"
#include "ferry/trace.h"

int main(int argc, char **argv) {
  char default_trace[1024];
  const char *shared = getenv("FERRY_SHARED") ? getenv("FERRY_SHARED") : "../shared";
  snprintf(default_trace, sizeof default_trace, "%s/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv", shared);
  const char *trace_path = argc > 1 ? argv[1] : default_trace;
  const char *model_name = argc > 2 ? argv[2] : "mixtral-8x7b";
  const char *hw_name = argc > 3 ? argv[3] : "h100-pcie";
  const char *budget = argc > 4 ? argv[4] : "40GiB";
  const int32_t max_batch = argc > 5 ? atoi(argv[5]) : 64;
  const int32_t max_seq = argc > 6 ? atoi(argv[6]) : 4096;
  const int64_t max_requests = argc > 7 ? atoll(argv[7]) : 0;
  const int exact = argc > 8 && !strcmp(argv[8], "exact");

  int rc = 1;
  ferry_model *model = NULL;
  ferry_hw *hw = NULL;
  ferry_trace *trace = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *eng = NULL;
  ferry_routing_synth *synth = NULL;
  struct ferry_engine_request *reqs = NULL;
  struct ferry_engine_config ec = {.block_layers = 1, .prefetch_depth = 1, .max_batch = max_batch,
                                   .max_seq_tokens = max_seq, .seed = 1};
  struct ferry_trace_options to = {.rate_scale = 1.0, .max_requests = max_requests};
  if (ferry__parse_size(budget, &ec.device_budget_bytes) != FERRY_OK || ferry_model_open(&model, model_name) != FERRY_OK ||
      ferry_hw_open(&hw, hw_name) != FERRY_OK ||
      (!ferry_hw_get(hw)->has_runtime && ferry_hw_set_runtime(hw, "native") != FERRY_OK) || /* as ferry sim */
      ferry_trace_open(&trace, trace_path, &to) != FERRY_OK) {
    fprintf(stderr, "sim_replay: %s\n", ferry_last_error());
    goto out;
  }
  size_t n = ferry_trace_count(trace);
  reqs = ferry__calloc(n ? n : 1, sizeof *reqs);
  if (!reqs) goto out;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_request *q = ferry_trace_request(trace, i);
    reqs[i] = (struct ferry_engine_request){q->id, q->arrival_ns, q->prompt_tokens > 0 ? q->prompt_tokens : 1,
                                            q->output_tokens > 0 ? q->output_tokens : 1};
  }
  const struct ferry_model_config *mc = ferry_model_get_config(model);
  if (mc->n_experts) { /* the simulator computes no router: uniform synthetic routing, as `ferry sim` */
    struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                            .top_k = (int32_t)mc->experts_per_token, .seed = ec.seed};
    if (ferry_routing_synth_create(&synth, &sc) != FERRY_OK) {
      fprintf(stderr, "sim_replay: %s\n", ferry_last_error());
      goto out;
    }
    ec.routing = ferry_routing_synth_fn;
    ec.routing_many = exact ? NULL : ferry_routing_synth_many; /* one token at a time, as before */
    ec.routing_user = synth;
  }
  struct ferry_exec_config xc = {.device_budget_bytes = ec.device_budget_bytes, .lock_host_memory = 1,
                                 .sim_mode = exact ? FERRY_SIM_EXACT : FERRY_SIM_FAST};
  if (ferry_exec_create_sim(&ex, hw, &xc) != FERRY_OK || ferry_engine_create(&eng, model, NULL, ex, &ec) != FERRY_OK) {
    fprintf(stderr, "sim_replay: %s\n", ferry_last_error());
    goto out;
  }
  struct ferry_run_options ro = {.time_scale = 1.0};
  int64_t t0 = ferry__mono_ns();
  const clock_t c0 = clock();
  if (ferry_engine_run(eng, reqs, (int64_t)n, &ro) != FERRY_OK) {
    fprintf(stderr, "sim_replay: %s\n", ferry_last_error());
    goto out;
  }
  double wall_s = (double)(ferry__mono_ns() - t0) / 1e9, cpu_s = (double)(clock() - c0) / CLOCKS_PER_SEC;
  struct ferry_sim_stats ss;
  struct ferry_serve_summary sum;
  ferry_exec_sim_stats(ex, &ss);
  ferry_engine_summary(eng, &sum);
  printf("sim_replay: %s, %s on %s, device budget %s, max batch %d, max seq tokens %d, %s mode\n", trace_path,
         model_name, hw_name, budget, max_batch, max_seq, exact ? "exact" : "fast");
  printf("  requests      %zu (%" PRId64 " done, %" PRId64 " rejected), %" PRId64 " steps\n", n, sum.requests_done,
         sum.requests_rejected, sum.steps);
  printf("  virtual time  %.1f s\n", (double)ss.now_ns / 1e9);
  printf("  wall time     %.2f s, CPU %.2f s (serving only; goal <= 30 s for the whole Azure conversation trace)\n",
         wall_s, cpu_s);
  printf("  ops           %" PRIu64 " (%.2f million/s): %" PRIu64 " kernels, %" PRIu64 " copies; %" PRIu64
         " from op graphs\n",
         ss.ops_done, (double)ss.ops_done / wall_s / 1e6, ss.kernels, ss.copies, ss.graph_ops);
  if (exact) printf("  events        %" PRIu64 " (%.2f million/s)\n", ss.events_run, (double)ss.events_run / wall_s / 1e6);
  printf("  TTFT          mean %.6f s, p99 %.6f s\n", sum.ttft.mean / 1e9, sum.ttft.p99 / 1e9);
  printf("  TPOT          mean %.9f s, p99 %.9f s\n", sum.tpot.mean / 1e9, sum.tpot.p99 / 1e9);
  printf("  moved         host->device %" PRIu64 " B, device->host %" PRIu64 " B, disk %" PRIu64 " B\n", sum.bytes_h2d,
         sum.bytes_d2h, sum.bytes_disk);
  printf("  expert cache  %" PRId64 " hits, %" PRId64 " misses\n", sum.hits, sum.misses);
  rc = 0;
out:
  ferry_engine_destroy(eng);
  ferry_exec_destroy(ex);
  ferry_routing_synth_free(synth);
  ferry_trace_free(trace);
  ferry_hw_close(hw);
  ferry_model_close(model);
  ferry_free(reqs);
  return rc;
}
