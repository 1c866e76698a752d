/* `ferry run` (real executors) and the shared option handling that `ferry sim` reuses: model,
 * trace, offload policy and budgets, then the engine, the summary and the result database. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/output.h"
#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/engine.h"
#include "ferry/fault.h"
#include "ferry/model.h"
#include "ferry/predict.h"
#include "ferry/trace.h"
#include "runtime/policy/policy.h"

void run_usage(FILE *f, const char *cmd) {
  int sim = !strcmp(cmd, "sim");
  fprintf(f,
          "Usage: ferry %s --model %s (--trace FILE | --synthetic SPEC) [OPTIONS]\n"
          "%s\n\n"
          "Model and workload:\n"
          "  --model %-14s %s\n"
          "  --trace FILE            request trace (Azure CSV, BurstGPT CSV, Mooncake JSONL, ferry JSONL)\n"
          "  --trace-format F        force the trace format (azure, burstgpt, mooncake, jsonl)\n"
          "  --synthetic SPEC        synthetic arrivals, e.g. rate=2,n=50,prompt=128,output=32\n"
          "  --max-requests N        first N requests only\n"
          "  --time-window A:B       requests arriving in [A, B) seconds of the trace (A or B may be empty)\n"
          "  --rate-scale X          replay X times faster (2 = twice the rate)\n"
          "  --time-scale X          multiply arrival times by X\n"
          "  --as-fast-as-possible   every request arrives at the start\n"
          "  --skip-bad              skip malformed trace rows and requests longer than the model's maximum\n"
          "                          position (both counted) instead of failing\n"
          "  --seed S                token ids and synthetic routing (default 1)\n"
          "Offload policy:\n"
          "  --block-layers K        consecutive layers per streamed block (0 = all; default 1)\n"
          "  --prefetch-depth D      blocks in flight ahead of compute (0 = on demand; default 1)\n"
          "  --pin-first N, --pin-last M   keep the first N / last M layers resident\n"
          "  --resident attention|all      keep all attention (or everything) resident\n"
          "  --device-budget SIZE    device memory budget (e.g. 2GiB; default: 90%% of the GPU's memory, the\n"
          "                          profile's in sim, device 0's free memory on cuda; host: unlimited);\n"
          "                          the default keeps a model that fits resident and fills the rest\n"
          "  --fill-budget           dense models: pin the last layers with the budget the working set\n"
          "                          leaves (on by default when the budget is the default)\n"
          "  --host-budget SIZE      host memory budget (default: sim 90%% of the profile's host memory, run\n"
          "                          half of the memory available at start; what does not fit is read from disk)\n"
          "  --home disk             stream every unit from disk (no host copies)\n"
          "  --keep-cache            buffered disk reads keep their pages: the OS page cache (sim: its model, in the\n"
          "                          host memory the budget leaves) serves a second read (default: drop them)\n"
          "  --host-memory M         pinned (default: page-locked host tier, the link's full rate) or pageable\n"
          "                          (ordinary memory: copies staged by the driver, the profile's pageable rate)\n"
          "  --expert-cache P        expert placement: auto (default: frequency with ageing, scan-resistant), lru,\n"
          "                          lfu, static (the most routed pinned: --predictor-routing counts, else a\n"
          "                          warm-up), per-layer:K (K slots per layer, lru in each)\n"
          "  --expert-granularity G  expert (default: each expert through the expert cache) or layer (a layer's\n"
          "                          experts stream with it, all together, as Accelerate and ZeRO-3 do)\n"
          "  --offload-compute SPEC  where what is not on the device is computed: gpu (fetch it, default), cpu\n"
          "                          (on the host's CPU from host memory; only activations cross the link) or\n"
          "                          auto (per op, fetch when copy + device time < CPU time); one for all, or\n"
          "                          per class: experts=cpu,layers=gpu\n"
          "  --max-batch N           concurrent sequences (default 8)\n"
          "  --gpu-batches N         FlexGen's block schedule: N batches of --max-batch sequences go through each\n"
          "                          loaded layer before it is evicted (default 1)\n"
          "  --max-step-tokens N     tokens per step, decode + prefill chunks (default 256)\n"
          "  --max-seq-tokens N      KV capacity per sequence (default: longest request; at most the model's\n"
          "                          maximum position)\n"
          "  --kv-dtype F            KV-cache format: fp32, fp16, bf16, or fp8, int8, int4 with a scale per 32\n"
          "                          (default: the model's dtype, as 'ferry model show' prints; 'ferry model\n"
          "                          kv-error' reports what a format does to the logits)\n"
          "  --kv-home device|host   where the KV cache lives; host: attention runs on the CPU over it\n"
          "  --kv-block-tokens N     a paged KV cache: blocks of N tokens given to sequences as they grow;\n"
          "                          admission by free blocks, the latest sequence preempted when they run\n"
          "                          out; --max-seq-tokens then reserves nothing\n"
          "  --kv-preempt M          recompute (default: a preempted sequence prefills its tokens again) or\n"
          "                          swap (its blocks copied to host memory, within the host budget, and\n"
          "                          back when it is readmitted)\n"
          "  --kv-pool SIZE          the paged cache's device bytes (default: a --max-batch x --max-seq-tokens\n"
          "                          reservation's worth when it fits, else one sequence's; plus what a\n"
          "                          resident model leaves of the budget)\n"
          "%s"
          "MoE routing:\n"
          "  --record-routing FILE   write every routing decision as JSONL (ferry trace routing reads it)\n"
          "  --record-features V     with --record-routing: each token's mlp3 or mlp7 predictor features from\n"
          "                          its embedding and hidden state (ferry predictor train uses them)\n"
          "  --predictor V           expert prefetching: none (no cache reuse), lru (cache only, default),\n"
          "                          frequency, gate-lookahead, mlp3, mlp7, oracle; prefetches --prefetch-depth\n"
          "                          layers ahead\n"
          "  --predictor-routing F   routing trace for frequency (popularity) and oracle on real runs\n"
          "  --predictor-model P     mlp3/mlp7 weights (ferry predictor train), fed each token's features\n"
          "%s"
          "Staying up (faults, memory pressure, reloads):\n"
          "  --faults SPEC           inject faults (as FERRY_FAULT): read:eio@N, read:short@N,\n"
          "                          read:eio@N+ (for good), read:delay:MS@P, kernel:fail@N, ...\n"
          "  --io-retries N          retries of a failed disk read before it is permanent (default 4), with\n"
          "                          exponential backoff and jitter\n"
          "  --pressure              memory-pressure control: above the high-water mark degrade in steps\n"
          "                          (prefetch depth, expert cache, on-demand loading, refuse new requests),\n"
          "                          recover below the low one; the host tier is planned to the low mark\n"
          "  --pressure-marks H:L    high- and low-water marks (default 0.85:0.7)\n"
          "  --host-budget-schedule T:SIZE,...\n"
          "                          change the host budget T seconds into serving (implies --pressure)\n"
          "  --reload-at T:DIR,...   swap in the weights of DIR (same architecture; checked against its\n"
          "                          manifest.sha256) T seconds into serving\n"
          "%s"
          "Output:\n"
          "  --plan-only             print the residency plan and exit\n"
          "  --db FILE               write the run (requests, steps, memory, timeline) to SQLite\n"
          "  --repeat N              run N times, each repetition its own run in --db, tagged with one\n"
          "                          repeat group ('ferry db diff' compares groups with a statistical test)\n"
          "  --repeat-group TAG      the repeat group's tag (default: one made up per invocation); runs of\n"
          "                          separate invocations with one tag form one group (to interleave two builds)\n"
          "  --format F              summary as text (default), json, csv or md (docs/output-formats.md)\n"
          "  --quiet                 no progress lines\n",
          cmd, sim ? "NAME|DIR" : "DIR",
          sim ? "Simulate serving a trace on a hardware profile: the same engine as 'ferry run', on a\n"
                "discrete-event executor whose op durations come from the profile."
              : "Serve a request trace with weight offloading on a real executor and report latency,\n"
                "throughput, bytes moved and peak memory per tier.",
          sim ? "NAME|DIR" : "DIR", sim ? "preset name or model folder (shapes only)" : "model folder (config.json + safetensors)",
          sim ? "Simulation:\n"
                "  --hw PROFILE            hardware profile (ferry hw list) or JSON file\n"
                "  --runtime NAME          the software issuing the work: eager (PyTorch, one kernel at a time from\n"
                "                          Python), graph (CUDA graphs), native (C++ engine), or a runtime file;\n"
                "                          default: the profile's, else native\n"
              : "Executor:\n"
                "  --backend host|cuda     executor (default host)\n"
                "  --threads N             BLAS threads of the host executor (default: cores - 2, at least 1)\n"
                "  --direct-io             read disk units with O_DIRECT\n"
                "  --drop-cache            drop the page cache after each disk read (default on without --direct-io)\n"
                "  --greedy                next token = argmax of the logits (default: seeded draw)\n"
                "  --profile               cuda: record the GPU timeline with CUPTI into --db (untraced, with a\n"
                "                          note in the run, where CUPTI cannot start)\n"
                "  --dump-logits FILE      write every generated token's input ids and logits as JSONL (a NaN or\n"
                "                          infinite logit is null, counted in the row's \"nonfinite\")\n"
                "  --allow-nonfinite       run weights holding NaN or Inf (by default they are refused, naming\n"
                "                          the tensor)\n",
          sim ? "  --routing FILE          replay a recorded routing trace (what the real run chose)\n"
                "  --routing-synth SPEC    synthetic routing, e.g. zipf=1.2,temporal=0.3,layer=0.5,seed=1\n"
                "  --quant PLAN            size a preset's weights in a format or per-class plan (int4-g64, nf4,\n"
                "                          expert=int3-g64,default=fp16, ...); a quantized folder carries its own\n"
              : "",
          sim ? ""
              : "  --verify-reads          checksum every disk read against the first read of the same range\n"
                "  --pressure-os           host pressure also from the OS (MemAvailable, PSI /proc/pressure/memory)\n"
                "  --reload-from DIR       SIGHUP swaps in the weights of DIR\n"
                "  --control-socket PATH   accept 'ferry ctl --socket PATH reload DIR|status' while serving\n");
}

enum {
  OPT_MODEL = 256, OPT_TRACE, OPT_TRACE_FORMAT, OPT_SYNTH, OPT_MAX_REQ, OPT_WINDOW, OPT_RATE, OPT_TSCALE, OPT_AFAP,
  OPT_SKIP_BAD, OPT_SEED, OPT_BLOCK, OPT_DEPTH, OPT_PIN_FIRST, OPT_PIN_LAST, OPT_RESIDENT, OPT_DEV_BUDGET,
  OPT_HOST_BUDGET, OPT_HOME, OPT_CACHE, OPT_MAX_BATCH, OPT_STEP_TOKENS, OPT_SEQ_TOKENS, OPT_PLAN_ONLY, OPT_DB,
  OPT_QUIET, OPT_BACKEND, OPT_THREADS, OPT_DIRECT, OPT_DROP, OPT_GREEDY, OPT_HW, OPT_DUMP, OPT_RECORD_ROUTING, OPT_ROUTING, OPT_ROUTING_SYNTH, OPT_QUANT, OPT_PREDICTOR, OPT_PREDICTOR_ROUTING, OPT_PROFILE, OPT_PREDICTOR_MODEL, OPT_RECORD_FEATURES, OPT_FILL, OPT_ALLOW_NONFINITE, OPT_KV_DTYPE, OPT_RUNTIME, OPT_HOST_MEMORY, OPT_KEEP_CACHE, OPT_REPEAT, OPT_REPEAT_GROUP, OPT_FORMAT, OPT_OFFLOAD_COMPUTE, OPT_KV_HOME, OPT_EXPERT_GRAN, OPT_GPU_BATCHES, OPT_KV_BLOCK, OPT_KV_POOL, OPT_KV_PREEMPT,
  /* staying up (cli/run_resil.c) */
  OPT_FAULTS, OPT_IO_RETRIES, OPT_VERIFY_READS, OPT_PRESSURE, OPT_PRESSURE_MARKS, OPT_PRESSURE_OS, OPT_HOST_SCHEDULE,
  OPT_RELOAD_AT, OPT_RELOAD_FROM, OPT_CONTROL_SOCKET, OPT_HELP
};

static const struct option run_opts[] = {
    {"model", required_argument, 0, OPT_MODEL}, {"trace", required_argument, 0, OPT_TRACE},
    {"trace-format", required_argument, 0, OPT_TRACE_FORMAT}, {"synthetic", required_argument, 0, OPT_SYNTH},
    {"max-requests", required_argument, 0, OPT_MAX_REQ}, {"time-window", required_argument, 0, OPT_WINDOW},
    {"rate-scale", required_argument, 0, OPT_RATE}, {"time-scale", required_argument, 0, OPT_TSCALE},
    {"as-fast-as-possible", no_argument, 0, OPT_AFAP}, {"skip-bad", no_argument, 0, OPT_SKIP_BAD},
    {"seed", required_argument, 0, OPT_SEED}, {"block-layers", required_argument, 0, OPT_BLOCK},
    {"prefetch-depth", required_argument, 0, OPT_DEPTH}, {"pin-first", required_argument, 0, OPT_PIN_FIRST},
    {"pin-last", required_argument, 0, OPT_PIN_LAST}, {"resident", required_argument, 0, OPT_RESIDENT},
    {"fill-budget", no_argument, 0, OPT_FILL},
    {"device-budget", required_argument, 0, OPT_DEV_BUDGET}, {"host-budget", required_argument, 0, OPT_HOST_BUDGET},
    {"home", required_argument, 0, OPT_HOME}, {"expert-cache", required_argument, 0, OPT_CACHE},
    {"max-batch", required_argument, 0, OPT_MAX_BATCH}, {"max-step-tokens", required_argument, 0, OPT_STEP_TOKENS},
    {"max-seq-tokens", required_argument, 0, OPT_SEQ_TOKENS}, {"plan-only", no_argument, 0, OPT_PLAN_ONLY},
    {"db", required_argument, 0, OPT_DB}, {"quiet", no_argument, 0, OPT_QUIET},
    {"backend", required_argument, 0, OPT_BACKEND}, {"threads", required_argument, 0, OPT_THREADS},
    {"direct-io", no_argument, 0, OPT_DIRECT}, {"drop-cache", no_argument, 0, OPT_DROP},
    {"greedy", no_argument, 0, OPT_GREEDY}, {"hw", required_argument, 0, OPT_HW},
    {"dump-logits", required_argument, 0, OPT_DUMP}, {"record-routing", required_argument, 0, OPT_RECORD_ROUTING},
    {"record-features", required_argument, 0, OPT_RECORD_FEATURES},
    {"routing", required_argument, 0, OPT_ROUTING}, {"quant", required_argument, 0, OPT_QUANT},
    {"predictor", required_argument, 0, OPT_PREDICTOR}, {"profile", no_argument, 0, OPT_PROFILE},
    {"predictor-model", required_argument, 0, OPT_PREDICTOR_MODEL}, {"predictor-routing", required_argument, 0, OPT_PREDICTOR_ROUTING}, {"routing-synth", required_argument, 0, OPT_ROUTING_SYNTH},
    {"allow-nonfinite", no_argument, 0, OPT_ALLOW_NONFINITE}, {"kv-dtype", required_argument, 0, OPT_KV_DTYPE},
    {"runtime", required_argument, 0, OPT_RUNTIME}, {"host-memory", required_argument, 0, OPT_HOST_MEMORY},
    {"keep-cache", no_argument, 0, OPT_KEEP_CACHE},
    {"repeat", required_argument, 0, OPT_REPEAT}, {"repeat-group", required_argument, 0, OPT_REPEAT_GROUP},
    {"format", required_argument, 0, OPT_FORMAT}, {"offload-compute", required_argument, 0, OPT_OFFLOAD_COMPUTE},
    {"kv-home", required_argument, 0, OPT_KV_HOME}, {"expert-granularity", required_argument, 0, OPT_EXPERT_GRAN},
    {"gpu-batches", required_argument, 0, OPT_GPU_BATCHES}, {"kv-block-tokens", required_argument, 0, OPT_KV_BLOCK},
    {"kv-pool", required_argument, 0, OPT_KV_POOL}, {"kv-preempt", required_argument, 0, OPT_KV_PREEMPT},
    /* staying up */
    {"faults", required_argument, 0, OPT_FAULTS}, {"io-retries", required_argument, 0, OPT_IO_RETRIES},
    {"verify-reads", no_argument, 0, OPT_VERIFY_READS}, {"pressure", no_argument, 0, OPT_PRESSURE},
    {"pressure-marks", required_argument, 0, OPT_PRESSURE_MARKS}, {"pressure-os", no_argument, 0, OPT_PRESSURE_OS},
    {"host-budget-schedule", required_argument, 0, OPT_HOST_SCHEDULE},
    {"reload-at", required_argument, 0, OPT_RELOAD_AT}, {"reload-from", required_argument, 0, OPT_RELOAD_FROM},
    {"control-socket", required_argument, 0, OPT_CONTROL_SOCKET},
    {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
_Static_assert(OPT_HELP - OPT_MODEL < 128, "run_args.given has one bit per option");

int run_given(const struct run_args *a, const char *name) {
  for (size_t i = 0; run_opts[i].name; i++)
    if (!strcmp(run_opts[i].name, name)) {
      const int bit = run_opts[i].val - OPT_MODEL;
      return (int)((a->given[bit / 64] >> (bit % 64)) & 1u);
    }
  return 0;
}

/* The first of `names` (NULL-terminated) given, or NULL. */
static const char *first_given(const struct run_args *a, const char *const *names) {
  for (size_t i = 0; names[i]; i++)
    if (run_given(a, names[i])) return names[i];
  return NULL;
}

/* Options that would be accepted and then ignored are refused: a run measures what its
 * options say, or says why it cannot. These need only the options; run_execute() checks
 * those that need the model. */
static int refuse_ignored(const char *cmd, const struct run_args *a, int sim) {
  const char *o;
  if (a->synthetic && run_given(a, "trace-format"))
    return cli_usage_error(cmd, "--trace-format applies to --trace files, not to --synthetic");
  if (a->as_fast && (o = first_given(a, (const char *const[]){"time-scale", "rate-scale", NULL})))
    return cli_usage_error(cmd, "--%s changes arrival times, which --as-fast-as-possible ignores", o);
  if (a->plan_only &&
      (o = first_given(a, (const char *const[]){"db", "dump-logits", "record-routing", "record-features", "profile",
                                                 "greedy", "allow-nonfinite", "routing", "routing-synth",
                                                 "predictor-routing", "predictor-model", "runtime", "host-memory",
                                                 "keep-cache", "repeat", "repeat-group", "format", "faults",
                                                 "io-retries", "verify-reads", "host-budget-schedule", "reload-at",
                                                 "reload-from", "control-socket", NULL})))
    return cli_usage_error(cmd, "--%s does nothing with --plan-only (nothing runs)", o);
  if (sim && (o = first_given(a, (const char *const[]){"greedy", "threads", NULL})))
    return cli_usage_error(cmd, "--%s is for 'ferry run': the simulator reads no weights and computes nothing", o);
  if (sim && (o = first_given(a, (const char *const[]){"direct-io", "drop-cache", NULL})))
    return cli_usage_error(cmd, "--%s is for 'ferry run': the simulator's disk reads already leave nothing in its page "
                                "cache model unless --keep-cache",
                           o);
  if (a->keep_cache && (a->ec.read_flags & FERRY_READ_DIRECT))
    return cli_usage_error(cmd, "--keep-cache does nothing with --direct-io: O_DIRECT reads bypass the page cache");
  if (!sim && !strcmp(a->backend, "cuda") && run_given(a, "threads"))
    return cli_usage_error(cmd, "--threads sets the host executor's BLAS threads; --backend cuda computes on the GPU");
  const int32_t batch = a->ec.max_batch ? a->ec.max_batch : 8;
  if (run_given(a, "max-step-tokens") && a->ec.max_step_tokens < batch)
    return cli_usage_error(cmd, "--max-step-tokens %d is below the %d sequences of a batch (--max-batch): each decodes "
                                "one token per step",
                           a->ec.max_step_tokens, batch);
  const char *p = a->predictor;
  const int mlp = p && (!strcmp(p, "mlp3") || !strcmp(p, "mlp7"));
  if (a->predictor_model && !mlp)
    return cli_usage_error(cmd, "--predictor-model is read by --predictor mlp3 or mlp7 only");
  const int static_cache = a->ec.expert_cache && !strcmp(a->ec.expert_cache, "static");
  if (a->predictor_routing && !(static_cache && (!p || !strcmp(p, "lru")))) {
    if (!p || !strcmp(p, "lru") || !strcmp(p, "none"))
      return cli_usage_error(cmd, "--predictor-routing is read by --expert-cache static and --predictor frequency, "
                                  "oracle%s only",
                             sim ? ", gate-lookahead, mlp3 and mlp7" : "");
    if (!sim && (mlp || !strcmp(p, "gate-lookahead")))
      return cli_usage_error(cmd, "--predictor-routing: a real run's %s predictor reads its own activations, not a trace", p);
    if (sim && !strcmp(p, "oracle"))
      return cli_usage_error(cmd, "--predictor-routing: in 'ferry sim' the oracle knows the routing being simulated "
                                  "(replay a recorded one with --routing)");
  }
  if (p && !strcmp(p, "none") && run_given(a, "expert-cache"))
    return cli_usage_error(cmd, "--expert-cache does nothing with --predictor none (no expert is reused)");
  return 0;
}

static int compute_where(const char *v, enum ferry_compute_where *out) {
  if (!strcmp(v, "gpu")) *out = FERRY_COMPUTE_GPU;
  else if (!strcmp(v, "cpu")) *out = FERRY_COMPUTE_CPU;
  else if (!strcmp(v, "auto")) *out = FERRY_COMPUTE_AUTO;
  else return -1;
  return 0;
}

static const char *where_name(enum ferry_compute_where w) {
  return w == FERRY_COMPUTE_CPU ? "cpu" : w == FERRY_COMPUTE_AUTO ? "auto" : "gpu";
}

/* --offload-compute gpu|cpu|auto, or per class: experts=X,layers=Y (each class at most once). */
static int parse_offload_compute(const char *cmd, const char *spec, struct run_args *a) {
  char buf[64];
  if (strlen(spec) >= sizeof buf) return cli_usage_error(cmd, "--offload-compute: '%s' is too long", spec);
  snprintf(buf, sizeof buf, "%s", spec);
  int seen_e = 0, seen_l = 0;
  if (compute_where(buf, &a->ec.compute_experts) == 0) {
    a->ec.compute_layers = a->ec.compute_experts;
    a->compute_experts_given = 0; /* for every class the model has */
    seen_e = seen_l = 1;
  } else {
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      char *eq = strchr(tok, '=');
      enum ferry_compute_where w;
      if (!eq || compute_where(eq + 1, &w))
        return cli_usage_error(cmd, "--offload-compute: expected gpu, cpu, auto or CLASS=gpu|cpu|auto (classes: experts, "
                                    "layers), got '%s'", tok);
      *eq = '\0';
      if (!strcmp(tok, "experts") && !seen_e) {
        a->ec.compute_experts = w;
        a->compute_experts_given = seen_e = 1;
      } else if (!strcmp(tok, "layers") && !seen_l) {
        a->ec.compute_layers = w;
        seen_l = 1;
      } else {
        return cli_usage_error(cmd, "--offload-compute: '%s' is not a class given once (experts, layers)", tok);
      }
    }
  }
  snprintf(a->offload_compute, sizeof a->offload_compute, "experts=%s,layers=%s", where_name(a->ec.compute_experts),
           where_name(a->ec.compute_layers));
  return 0;
}

int run_parse(int argc, char **argv, const char *cmd, struct run_args *a) {
  memset(a, 0, sizeof *a);
  a->cmd = cmd;
  a->backend = "host";
  a->seed = 1;
  a->time_scale = 1.0;
  a->progress = 1;
  a->ec.block_layers = 1;
  a->ec.prefetch_depth = 1;
  a->trace_opts.rate_scale = 1.0;
  a->repeat = 1;
  a->resil.io_retries = -1;
  int sim = !strcmp(cmd, "sim");
  int64_t v;
  int drop_cache_set = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", run_opts, NULL)) != -1) {
    if (c >= OPT_MODEL && c <= OPT_HELP) a->given[(c - OPT_MODEL) / 64] |= 1ull << ((c - OPT_MODEL) % 64);
    switch (c) {
      case OPT_MODEL: a->model = optarg; break;
      case OPT_TRACE: a->trace = optarg; break;
      case OPT_TRACE_FORMAT:
        if (ferry_trace_format_parse(optarg, &a->trace_opts.format) != FERRY_OK)
          return cli_usage_error(cmd, "--trace-format: unknown format '%s'", optarg);
        break;
      case OPT_SYNTH: a->synthetic = optarg; break;
      case OPT_MAX_REQ: if (cli_parse_int("--max-requests", optarg, 1, INT64_MAX, &a->trace_opts.max_requests)) return CLI_USAGE; break;
      case OPT_WINDOW:
        if (ferry__parse_window_ns(optarg, &a->trace_opts.window_start_ns, &a->trace_opts.window_end_ns) != FERRY_OK)
          return cli_usage_error(cmd, "--time-window: %s", ferry_last_error());
        break;
      case OPT_RATE: if (cli_parse_double("--rate-scale", optarg, 1e-6, 1e6, &a->trace_opts.rate_scale)) return CLI_USAGE; break;
      case OPT_TSCALE: if (cli_parse_double("--time-scale", optarg, 1e-9, 1e9, &a->time_scale)) return CLI_USAGE; break;
      case OPT_AFAP: a->as_fast = 1; break;
      case OPT_SKIP_BAD: a->trace_opts.skip_bad = 1; break;
      case OPT_SEED: if (cli_parse_int("--seed", optarg, 0, INT64_MAX, &v)) return CLI_USAGE; a->seed = (uint64_t)v; break;
      case OPT_BLOCK: if (cli_parse_int("--block-layers", optarg, 0, 1 << 20, &v)) return CLI_USAGE; a->ec.block_layers = (int32_t)v; break;
      case OPT_DEPTH: if (cli_parse_int("--prefetch-depth", optarg, 0, 64, &v)) return CLI_USAGE; a->ec.prefetch_depth = (int32_t)v; break;
      case OPT_PIN_FIRST: if (cli_parse_int("--pin-first", optarg, 0, 1 << 20, &v)) return CLI_USAGE; a->ec.pin_first = (int32_t)v; break;
      case OPT_PIN_LAST: if (cli_parse_int("--pin-last", optarg, 0, 1 << 20, &v)) return CLI_USAGE; a->ec.pin_last = (int32_t)v; break;
      case OPT_RESIDENT:
        if (!strcmp(optarg, "attention")) a->ec.resident_attention = 1;
        else if (!strcmp(optarg, "all")) a->ec.resident_all = 1;
        else return cli_usage_error(cmd, "--resident: expected 'attention' or 'all', got '%s'", optarg);
        break;
      case OPT_FILL: a->ec.fill_budget = 1; break;
      case OPT_DEV_BUDGET: if (cli_parse_size("--device-budget", optarg, &a->ec.device_budget_bytes)) return CLI_USAGE; break;
      case OPT_HOST_BUDGET: if (cli_parse_size("--host-budget", optarg, &a->ec.host_budget_bytes)) return CLI_USAGE; break;
      case OPT_HOME:
        if (strcmp(optarg, "disk") && strcmp(optarg, "host"))
          return cli_usage_error(cmd, "--home: expected 'disk' or 'host', got '%s'", optarg);
        a->ec.home_disk = !strcmp(optarg, "disk");
        break;
      case OPT_CACHE:
        if (!strncmp(optarg, "per-layer:", 10)) {
          if (cli_parse_int("--expert-cache per-layer:K", optarg + 10, 1, 1 << 20, &v)) return CLI_USAGE;
          a->ec.expert_cache_per_layer = (int32_t)v;
        } else if (ferry__cache_policy_find(optarg)) {
          a->ec.expert_cache = optarg;
        } else {
          return cli_usage_error(cmd, "--expert-cache: expected auto, lru, lfu, static or per-layer:K, got '%s'", optarg);
        }
        break;
      case OPT_MAX_BATCH: if (cli_parse_int("--max-batch", optarg, 1, 4096, &v)) return CLI_USAGE; a->ec.max_batch = (int32_t)v; break;
      case OPT_STEP_TOKENS: if (cli_parse_int("--max-step-tokens", optarg, 1, 1 << 20, &v)) return CLI_USAGE; a->ec.max_step_tokens = (int32_t)v; break;
      case OPT_SEQ_TOKENS: if (cli_parse_int("--max-seq-tokens", optarg, 2, 1 << 24, &v)) return CLI_USAGE; a->ec.max_seq_tokens = (int32_t)v; break;
      case OPT_PLAN_ONLY: a->plan_only = 1; break;
      case OPT_DB: a->db = optarg; break;
      case OPT_QUIET: a->progress = 0; break;
      case OPT_BACKEND:
        if (sim) return cli_usage_error(cmd, "--backend is for 'ferry run' (the simulator is 'ferry sim')");
        if (strcmp(optarg, "host") && strcmp(optarg, "cuda"))
          return cli_usage_error(cmd, "--backend: expected 'host' or 'cuda', got '%s'", optarg);
        a->backend = optarg;
        break;
      case OPT_THREADS: if (cli_parse_int("--threads", optarg, 1, 1024, &v)) return CLI_USAGE; a->threads = (int)v; break;
      case OPT_DIRECT: a->ec.read_flags |= FERRY_READ_DIRECT; break;
      case OPT_DROP: drop_cache_set = 1; break;
      case OPT_KEEP_CACHE: a->keep_cache = 1; break;
      case OPT_KV_BLOCK: if (cli_parse_int("--kv-block-tokens", optarg, 1, 65536, &v)) return CLI_USAGE; a->ec.kv_block_tokens = (int32_t)v; break;
      case OPT_KV_PREEMPT:
        if (strcmp(optarg, "recompute") && strcmp(optarg, "swap"))
          return cli_usage_error(cmd, "--kv-preempt: expected 'recompute' or 'swap', got '%s'", optarg);
        a->ec.kv_preempt_swap = !strcmp(optarg, "swap");
        break;
      case OPT_KV_POOL: if (cli_parse_size("--kv-pool", optarg, &a->ec.kv_pool_bytes)) return CLI_USAGE; break;
      case OPT_GPU_BATCHES: if (cli_parse_int("--gpu-batches", optarg, 1, 1024, &v)) return CLI_USAGE; a->ec.gpu_batches = (int32_t)v; break;
      case OPT_EXPERT_GRAN:
        if (strcmp(optarg, "expert") && strcmp(optarg, "layer"))
          return cli_usage_error(cmd, "--expert-granularity: expected 'expert' or 'layer', got '%s'", optarg);
        a->ec.expert_granularity_layer = !strcmp(optarg, "layer");
        break;
      case OPT_KV_HOME:
        if (strcmp(optarg, "device") && strcmp(optarg, "host"))
          return cli_usage_error(cmd, "--kv-home: expected 'device' or 'host', got '%s'", optarg);
        a->ec.kv_home_host = !strcmp(optarg, "host");
        break;
      case OPT_OFFLOAD_COMPUTE:
        if (parse_offload_compute(cmd, optarg, a)) return CLI_USAGE;
        break;
      case OPT_GREEDY: a->ec.greedy = 1; break;
      case OPT_DUMP:
        if (sim) return cli_usage_error(cmd, "--dump-logits needs a real executor (the simulator computes no logits)");
        a->dump_logits = optarg;
        break;
      case OPT_HW:
        if (!sim) return cli_usage_error(cmd, "--hw is for 'ferry sim'");
        a->hw = optarg;
        break;
      case OPT_HOST_MEMORY:
        if (strcmp(optarg, "pinned") && strcmp(optarg, "pageable"))
          return cli_usage_error(cmd, "--host-memory: expected 'pinned' or 'pageable', got '%s'", optarg);
        a->host_pageable = !strcmp(optarg, "pageable");
        break;
      case OPT_RUNTIME:
        if (!sim) return cli_usage_error(cmd, "--runtime is for 'ferry sim' (a real run's overheads are its own)");
        a->runtime = optarg;
        break;
      case OPT_RECORD_ROUTING: a->record_routing = optarg; break;
      case OPT_RECORD_FEATURES: a->record_features = optarg; break;
      case OPT_ROUTING:
      case OPT_ROUTING_SYNTH:
        if (!sim)
          return cli_usage_error(cmd, "--routing and --routing-synth are for 'ferry sim' (a real run computes its routing)");
        if (c == OPT_ROUTING) a->routing = optarg;
        else a->routing_synth = optarg;
        break;
      case OPT_PREDICTOR: {
        enum ferry_predictor_kind k;
        if (ferry_predictor_kind_parse(optarg, &k) != FERRY_OK)
          return cli_usage_error(cmd, "--predictor: unknown variant '%s' (none, lru, frequency, gate-lookahead, mlp3, mlp7, oracle)",
                                 optarg);
        a->predictor = optarg;
        break;
      }
      case OPT_PREDICTOR_ROUTING: a->predictor_routing = optarg; break;
      case OPT_PREDICTOR_MODEL: a->predictor_model = optarg; break;
      case OPT_PROFILE:
        if (sim) return cli_usage_error(cmd, "--profile is for 'ferry run --backend cuda'");
        a->profile = 1;
        break;
      case OPT_QUANT:
        if (!sim) return cli_usage_error(cmd, "--quant is for 'ferry sim'; quantize a model folder with 'ferry model quantize'");
        if (ferry_quant_plan_parse(optarg, &a->ec.quant) != FERRY_OK) return cli_usage_error(cmd, "--quant: %s", ferry_last_error());
        a->ec.quant_set = 1;
        a->quant = optarg;
        break;
      case OPT_KV_DTYPE:
        if (ferry_kv_format_parse(optarg, &a->ec.kv_format) != FERRY_OK)
          return cli_usage_error(cmd, "--kv-dtype: %s", ferry_last_error());
        a->kv_dtype = a->ec.kv_format == FERRY_KV_AUTO ? NULL : ferry_kv_format_name(a->ec.kv_format);
        break;
      case OPT_ALLOW_NONFINITE:
        if (sim) return cli_usage_error(cmd, "--allow-nonfinite is for 'ferry run' (the simulator reads no weight values)");
        a->ec.allow_nonfinite = 1;
        break;
      case OPT_REPEAT: if (cli_parse_int("--repeat", optarg, 1, 10000, &v)) return CLI_USAGE; a->repeat = (int)v; break;
      case OPT_REPEAT_GROUP:
        if (!*optarg || strlen(optarg) > 200) return cli_usage_error(cmd, "--repeat-group: a tag of 1 to 200 characters");
        a->repeat_group = optarg;
        break;
      case OPT_FORMAT: if (cli_parse_format(cmd, optarg, &a->format)) return CLI_USAGE; break;
      /* staying up */
      case OPT_FAULTS:
        if (ferry_fault_set(optarg) != FERRY_OK) return cli_usage_error(cmd, "--faults: %s", ferry_last_error());
        ferry_fault_clear(); /* installed when the run starts */
        a->resil.faults = optarg;
        break;
      case OPT_IO_RETRIES: if (cli_parse_int("--io-retries", optarg, 0, 999, &a->resil.io_retries)) return CLI_USAGE; break;
      case OPT_VERIFY_READS:
      case OPT_PRESSURE_OS:
      case OPT_RELOAD_FROM:
      case OPT_CONTROL_SOCKET:
        if (sim) return cli_usage_error(cmd, "--%s is for 'ferry run': the simulator reads no weights and runs in virtual time",
                                        c == OPT_VERIFY_READS ? "verify-reads" : c == OPT_PRESSURE_OS ? "pressure-os"
                                        : c == OPT_RELOAD_FROM ? "reload-from" : "control-socket");
        if (c == OPT_VERIFY_READS) a->resil.verify_reads = 1;
        else if (c == OPT_PRESSURE_OS) a->resil.pressure_os = a->resil.pressure = 1;
        else if (c == OPT_RELOAD_FROM) a->resil.reload_from = optarg;
        else a->resil.control_socket = optarg;
        break;
      case OPT_PRESSURE: a->resil.pressure = 1; break;
      case OPT_PRESSURE_MARKS:
        if (resil_parse_marks(cmd, optarg, &a->resil)) return CLI_USAGE;
        a->resil.pressure = 1;
        break;
      case OPT_HOST_SCHEDULE: if (resil_parse_schedule(cmd, optarg, &a->resil)) return CLI_USAGE; break;
      case OPT_RELOAD_AT: if (resil_parse_reload_at(cmd, optarg, &a->resil)) return CLI_USAGE; break;
      case OPT_HELP: run_usage(stdout, cmd); return -1;
      default: return cli_usage_error(cmd, "invalid option");
    }
  }
  if (optind < argc) return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
  if (!a->model) return cli_usage_error(cmd, "missing --model");
  if (!a->plan_only && !a->trace && !a->synthetic) return cli_usage_error(cmd, "missing --trace FILE or --synthetic SPEC");
  if (a->trace && a->synthetic) return cli_usage_error(cmd, "give either --trace or --synthetic, not both");
  if (sim && !a->hw && !a->plan_only) return cli_usage_error(cmd, "missing --hw PROFILE (see ferry hw list)");
  if (a->profile && !a->db) return cli_usage_error(cmd, "--profile writes the GPU timeline to --db FILE: give one");
  if (a->repeat_group && !a->db) return cli_usage_error(cmd, "--repeat-group tags runs in --db FILE: give one");
  if (a->repeat > 1 && (a->dump_logits || a->record_routing))
    return cli_usage_error(cmd, "--repeat %d would write --%s %d times over: repeat without it", a->repeat,
                           a->dump_logits ? "dump-logits" : "record-routing", a->repeat);
  if (a->profile && strcmp(a->backend, "cuda"))
    return cli_usage_error(cmd, "--profile traces the GPU: use it with --backend cuda");
  const int refused = refuse_ignored(cmd, a, sim);
  if (refused) return refused;
  /* A "disk" read should come from the disk: drop cached pages unless O_DIRECT bypasses them. */
  if (drop_cache_set && a->keep_cache) return cli_usage_error(cmd, "give either --drop-cache or --keep-cache, not both");
  if (drop_cache_set || (!(a->ec.read_flags & FERRY_READ_DIRECT) && !a->keep_cache))
    a->ec.read_flags |= FERRY_READ_DROP_CACHE;
  a->ec.seed = a->seed;
  const struct ferry_path_use paths[] = {
      {"--db", a->db, FERRY_PATH_OUT | FERRY_PATH_SQLITE}, {"--record-routing", a->record_routing, FERRY_PATH_OUT},
      {"--dump-logits", a->dump_logits, FERRY_PATH_OUT},   {"--model", a->model, FERRY_PATH_DIR},
      {"--trace", a->trace, 0},                            {"--routing", a->routing, 0},
      {"--predictor-routing", a->predictor_routing, 0},    {"--predictor-model", a->predictor_model, 0},
      {"--hw", a->hw, 0},                                  {"--runtime", a->runtime, 0},
      {"--reload-from", a->resil.reload_from, FERRY_PATH_DIR}, {"--control-socket", a->resil.control_socket, FERRY_PATH_OUT}};
  if (cli_check_paths(cmd, paths, sizeof paths / sizeof paths[0])) return CLI_USAGE;
  return 0;
}

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
  st = a->synthetic ? ferry_trace_synthetic_open(&t, a->synthetic, a->seed, &a->trace_opts)
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
  if (a->ec.max_seq_tokens <= 0) a->ec.max_seq_tokens = (int32_t)(longest < (1 << 24) ? longest : (1 << 24));
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
