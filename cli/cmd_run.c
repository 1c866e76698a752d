/* `ferry run` (real executors), and the requests both `ferry run` and `ferry sim` serve: the
 * options are parsed by run_options.c and carried out by run_exec.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/units.h"
#include "ferry/engine.h"
#include "ferry/model.h"
#include "ferry/predict.h"
#include "ferry/trace.h"

ferry_status run_load_requests(struct run_args *a, struct ferry_engine_request **out, int64_t *n_out) {
  /* A request longer than the model's positions can never be served, and sizing the KV cache
   * from it asked for hundreds of GiB: the model's maximum position bounds every request. */
  ferry_model *model = NULL;
  int64_t max_pos = INT64_MAX;
  char model_name[128] = "";
  /* a model that cannot be opened is the run's own error to report (`ferry sweep` plans a
   * combination before its run fails and is recorded) */
  if (ferry_model_open(&model, a->model) == FERRY_OK) {
    const struct ferry_model_config *mc = ferry_model_get_config(model);
    max_pos = mc->max_position;
    snprintf(model_name, sizeof model_name, "%s", mc->name);
    ferry_model_close(model);
  }
  ferry_trace *t = NULL;
  ferry_status st;
  /* synthetic requests are generated lazily: only those the slicing keeps */
  st = a->synthetic ? ferry_trace_synthetic_open(&t, a->synthetic, (uint64_t)a->seed, &a->trace_opts)
                    : ferry_trace_open(&t, a->trace, &a->trace_opts);
  if (st != FERRY_OK) return st;
  const char *what = a->trace ? a->trace : "synthetic trace";
  size_t n = ferry_trace_count(t), kept = 0;
  struct ferry_engine_request *r = ferry__calloc(n ? n : 1, sizeof *r);
  if (!r) {
    ferry_trace_free(t);
    return ferry__fail(FERRY_ERR_NOMEM, "out of memory for %zu requests", n);
  }
  int64_t longest = 0;
  a->too_long = 0;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_request *q = ferry_trace_request(t, i);
    /* the engine needs at least one prompt and one output token */
    const int32_t prompt = q->prompt_tokens > 0 ? q->prompt_tokens : 1, output = q->output_tokens > 0 ? q->output_tokens : 1;
    const int64_t len = (int64_t)prompt + output;
    if (len > max_pos) {
      if (!a->trace_opts.skip_bad) {
        st = ferry__fail(FERRY_ERR_INVALID,
                         "%s: request %lld needs %lld positions (%d prompt + %d output tokens), more than %s's maximum "
                         "position %lld (max_position_embeddings); --skip-bad skips such requests (counted)",
                         what, (long long)q->id, (long long)len, prompt, output, model_name, (long long)max_pos);
        ferry_trace_free(t); /* q lives in it */
        ferry_free(r);
        return st;
      }
      a->too_long++;
      continue;
    }
    r[kept].id = q->id;
    r[kept].arrival_ns = q->arrival_ns;
    r[kept].prompt_tokens = prompt;
    r[kept].output_tokens = output;
    kept++;
    if (len > longest) longest = len;
  }
  ferry_trace_free(t);
  if (kept == 0) {
    ferry_free(r);
    if (a->too_long)
      return ferry__fail(FERRY_ERR_INVALID, "%s: no requests to serve: all %lld are longer than %s's maximum position %lld",
                         what, (long long)a->too_long, model_name, (long long)max_pos);
    return ferry__fail(FERRY_ERR_FORMAT, "%s: no requests to serve", what);
  }
  if (a->ec.max_seq_tokens <= 0) {
    a->ec.max_seq_tokens = (int32_t)(longest < (1 << 24) ? longest : (1 << 24));
    a->max_seq_tokens = a->ec.max_seq_tokens; /* the configuration holds the capacity served */
  }
  a->n_requests = (int64_t)kept;
  *out = r;
  *n_out = (int64_t)kept;
  return FERRY_OK;
}

int cmd_run(int argc, char **argv) {
  struct run_args a;
  int rc = run_parse(argc, argv, "run", &a);
  if (rc) return rc < 0 ? CLI_OK : rc;
  return run_repeat(&a);
}
