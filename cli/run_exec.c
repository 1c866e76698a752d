/* The steps `ferry run` and `ferry sim` share once options are parsed: open the model (and its
 * weights for real executors), create the executor, build the engine, serve, report. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_common.h"
#include "sim/cpu_cost.h"
#include "sim/gpu_cost.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/cupti.h"
#include "ferry/db.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/provenance.h"
#include "ferry/routing.h"
#include "cli/predict_glue.h"
#include "cli/run_routing_meta.h"
#include "ferry/sim.h"
#include "ferry/store.h"

/* With CUPTI tracing the GPU, kernels and copies come from CUPTI (CUDA stream ids, real kernel
 * names); from the executor only the engine's ranges and memory samples are kept, so nothing
 * appears twice in the timeline. */
static void ranges_and_memory(void *user, const struct ferry_activity *a) {
  if (a->kind == FERRY_ACT_RANGE || a->kind == FERRY_ACT_MEMORY) ferry_db_activity_sink(user, a);
}

struct logit_dump {
  FILE *f;
  int failed;
  uint64_t nonfinite; /* logits written as null */
};

/* One JSON object per row. JSON has no NaN or Infinity: a non-finite logit is null, and the
 * row says how many it has, so the file always parses. */
static void dump_logits(void *user, int64_t req_id, int32_t token_index, const int32_t *tokens, int32_t n_tokens,
                        const float *logits, int64_t vocab) {
  struct logit_dump *d = user;
  FILE *f = d->f;
  int64_t bad = 0;
  for (int64_t i = 0; i < vocab; i++) bad += !isfinite(logits[i]);
  d->nonfinite += (uint64_t)bad;
  fprintf(f, "{\"req_id\":%lld,\"token_index\":%d,\"tokens\":[", (long long)req_id, token_index);
  for (int32_t i = 0; i < n_tokens; i++) fprintf(f, i ? ",%d" : "%d", tokens[i]);
  fprintf(f, "],\"nonfinite\":%lld,\"logits\":[", (long long)bad);
  for (int64_t i = 0; i < vocab; i++) {
    if (i) fputc(',', f);
    if (isfinite(logits[i])) fprintf(f, "%.9g", (double)logits[i]);
    else fputs("null", f);
  }
  if (fputs("]}\n", f) < 0) d->failed = 1;
}

/* Requests and steps on the executor's clock, like the timeline rows. */
static ferry_status write_results(ferry_db *db, int64_t run_id, ferry_engine *eng, const struct ferry_serve_summary *sum) {
  int64_t n;
  const struct ferry_request_metrics *rm = ferry_engine_request_metrics(eng, &n);
  const int64_t base = sum->run_start_ns;
  ferry_status st = FERRY_OK;
  for (int64_t i = 0; i < n && st == FERRY_OK; i++) {
    if (rm[i].rejected) continue;
    struct ferry_request_row r = {.req_id = rm[i].id, .arrival_ns = base + rm[i].arrival_ns,
                                  .first_token_ns = rm[i].first_token_ns < 0 ? -1 : base + rm[i].first_token_ns,
                                  .finish_ns = rm[i].finish_ns < 0 ? -1 : base + rm[i].finish_ns,
                                  .prompt_tokens = rm[i].prompt_tokens, .output_tokens = rm[i].output_tokens};
    st = ferry_db_add_request(db, run_id, &r);
  }
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(eng, &n);
  for (int64_t i = 0; i < n && st == FERRY_OK; i++) {
    struct ferry_step_row r = {.step = sm[i].step, .start_ns = base + sm[i].start_ns, .end_ns = base + sm[i].end_ns,
                               .batch = sm[i].batch, .tokens = sm[i].tokens, .bytes_disk = sm[i].bytes_disk,
                               .bytes_h2d = sm[i].bytes_h2d, .bytes_d2h = sm[i].bytes_d2h, .hits = sm[i].hits,
                               .misses = sm[i].misses, .stall_ns = sm[i].stall_ns, .kv_tokens = sm[i].kv_tokens,
                               .compute_busy_ns = sm[i].compute_busy_ns, .cpu_busy_ns = sm[i].cpu_busy_ns,
                               .bytes_blocks = sm[i].bytes_blocks, .bytes_experts = sm[i].bytes_experts,
                               .bytes_act = sm[i].bytes_act, .evictions = sm[i].evictions,
                               .cpu_experts = sm[i].cpu_experts, .kv_blocks = sm[i].kv_blocks};
    st = ferry_db_add_step(db, run_id, &r);
  }
  const struct ferry_layer_metrics *lm = ferry_engine_layer_metrics(eng, &n);
  for (int64_t i = 0; i < n && st == FERRY_OK; i++) {
    const struct ferry_layer_metrics *l = &lm[i];
    if (!l->hits && !l->misses && !l->evictions && !l->prefetches && !l->cpu_experts && !l->bytes_h2d) continue;
    const struct ferry_layer_row r = {.layer = l->layer, .hits = l->hits, .misses = l->misses, .evictions = l->evictions,
                                      .prefetches = l->prefetches, .cpu_experts = l->cpu_experts, .bytes_h2d = l->bytes_h2d};
    st = ferry_db_add_layer_stats(db, run_id, &r);
  }
  if (st == FERRY_OK) st = ferry_db_flush(db);
  return st;
}

static int has_weights(const char *dir) {
  char *idx = ferry__path_join(dir, "model.safetensors.index.json"), *one = ferry__path_join(dir, "model.safetensors");
  int yes = (idx && ferry__is_file(idx)) || (one && ferry__is_file(one));
  ferry_free(idx);
  ferry_free(one);
  return yes;
}

/* Without --device-budget a GPU gets 90 % of its memory (vLLM's default utilisation): the rest
 * is for the CUDA context, cuBLAS workspaces and staging. A model that fits in that is kept
 * resident, as without a budget; a larger one is offloaded, never run or simulated as if it
 * fit. A budget beyond the (simulated) GPU's memory is refused. The host executor's "device"
 * is this machine's memory: no default there. The simulator's host memory is the profile's
 * too: 90 % of it by default (the rest for the OS), and what does not fit streams from disk. */
#define DEFAULT_DEVICE_FRACTION 0.9

static ferry_status default_host_budget(struct run_args *a, const struct ferry_hw_profile *p) {
  if (!p->has_host || !p->host.memory_bytes) return FERRY_OK;
  char want[32], have[32];
  if (a->ec.host_budget_bytes > p->host.memory_bytes)
    return ferry__fail(FERRY_ERR_INVALID, "--host-budget %s exceeds the host memory of %s (%s)",
                       ferry__format_bytes(a->ec.host_budget_bytes, want, sizeof want), p->name,
                       ferry__format_bytes(p->host.memory_bytes, have, sizeof have));
  if (a->ec.host_budget_bytes) return FERRY_OK;
  a->ec.host_budget_bytes = (uint64_t)((double)p->host.memory_bytes * DEFAULT_DEVICE_FRACTION);
  if (a->progress || a->plan_only)
    fprintf(stderr, "ferry: host budget %s (90%% of %s's host memory, %s; --host-budget to change)\n",
            ferry__format_bytes(a->ec.host_budget_bytes, want, sizeof want), p->name,
            ferry__format_bytes(p->host.memory_bytes, have, sizeof have));
  return FERRY_OK;
}

/* A real run's streamed weights live in this machine's memory (pinned, on cuda): by default at
 * most half of what is available when it starts, the rest is read from disk, so a model larger
 * than memory streams instead of swapping or failing to pin. */
static void default_real_host_budget(struct run_args *a) {
  if (a->ec.host_budget_bytes) return;
  const uint64_t avail = ferry__mem_available_bytes();
  if (!avail) return;
  a->ec.host_budget_bytes = avail / 2;
  char want[32], have[32];
  if (a->progress || a->plan_only)
    fprintf(stderr, "ferry: host budget %s (half of the %s this machine has available; --host-budget to change)\n",
            ferry__format_bytes(a->ec.host_budget_bytes, want, sizeof want), ferry__format_bytes(avail, have, sizeof have));
}

static ferry_status default_device_budget(struct run_args *a, int sim, const ferry_model *model, ferry_store *store) {
  uint64_t gpu_bytes = 0, free_bytes = UINT64_MAX;
  char gpu[80] = "";
  if (!sim) default_real_host_budget(a);
  if (sim) {
    if (!a->hw) return FERRY_OK; /* --plan-only without a profile: no GPU to size from */
    ferry_hw *hw = NULL;
    ferry_status st = ferry_hw_open(&hw, a->hw);
    if (st != FERRY_OK) return st;
    const struct ferry_hw_profile *p = ferry_hw_get(hw);
    if (p->has_gpu) gpu_bytes = p->gpu.memory_bytes;
    snprintf(gpu, sizeof gpu, "%s", p->name);
    st = default_host_budget(a, p);
    ferry_hw_close(hw);
    if (st != FERRY_OK) return st;
  } else if (!strcmp(a->backend, "cuda")) {
    /* no device: creating the executor says so (a plan needs no device) */
    if (ferry_exec_cuda_memory(&free_bytes, &gpu_bytes) != FERRY_OK) return FERRY_OK;
    snprintf(gpu, sizeof gpu, "CUDA device 0");
  }
  if (!gpu_bytes) return FERRY_OK;
  char want[32], have[32];
  if (a->ec.device_budget_bytes > gpu_bytes)
    return ferry__fail(FERRY_ERR_INVALID, "--device-budget %s exceeds the memory of %s (%s)",
                       ferry__format_bytes(a->ec.device_budget_bytes, want, sizeof want), gpu,
                       ferry__format_bytes(gpu_bytes, have, sizeof have));
  if (a->ec.device_budget_bytes) return FERRY_OK;
  uint64_t budget = (uint64_t)((double)gpu_bytes * DEFAULT_DEVICE_FRACTION);
  /* a real GPU may be partly held by another process: stay 256 MiB under what is free */
  const uint64_t reserve = 256ull << 20, usable = free_bytes > reserve ? free_bytes - reserve : 0;
  if (budget > usable) budget = usable;
  if (!budget) return ferry__fail(FERRY_ERR_NOMEM, "%s has no free memory for a device budget", gpu);
  struct ferry_engine_config whole = a->ec;
  whole.resident_all = 1;
  uint64_t need = 0, host_min = 0;
  const int fits = ferry_engine_min_budgets(model, store, &whole, &need, &host_min) == FERRY_OK && need <= budget;
  a->ec.device_budget_bytes = budget;
  /* experts moving with their layers stream like a dense model's layers */
  const int moe = ferry_model_get_config(model)->n_experts > 0 && !a->ec.expert_granularity_layer;
  const char *how = ": the model fits, everything resident";
  if (fits) {
    a->ec.resident_all = 1;
  } else if (!moe) {
    a->ec.fill_budget = 1;
    how = ": the last layers fill what streaming leaves";
  } else {
    /* every token reads all attention and only some experts: attention first, when it fits,
     * then the expert cache takes the rest */
    how = ": the expert cache takes what streaming leaves";
    struct ferry_engine_config attn = a->ec;
    attn.resident_attention = 1;
    if (!a->ec.resident_attention && ferry_engine_min_budgets(model, store, &attn, &need, &host_min) == FERRY_OK &&
        need <= budget) {
      a->ec.resident_attention = 1;
      how = ": attention resident, the expert cache takes the rest";
    }
  }
  if (a->progress || a->plan_only)
    fprintf(stderr, "ferry: device budget %s (%.0f%% of %s's %s%s; --device-budget to change)%s\n",
            ferry__format_bytes(budget, want, sizeof want), 100.0 * (double)budget / (double)gpu_bytes, gpu,
            ferry__format_bytes(gpu_bytes, have, sizeof have), free_bytes != UINT64_MAX ? ", less what is in use" : "",
            how);
  return FERRY_OK;
}

/* Options that need the model to know they would be ignored. */
static ferry_status refuse_ignored_for_model(const struct run_args *a, const struct ferry_model_config *mc,
                                             const ferry_store *store) {
  if (!mc->n_experts && run_given(a, "expert-cache"))
    return ferry__fail(FERRY_ERR_INVALID, "--expert-cache needs a Mixture-of-Experts model (%s is dense)", a->model);
  if (!mc->n_experts && run_given(a, "expert-granularity"))
    return ferry__fail(FERRY_ERR_INVALID, "--expert-granularity needs a Mixture-of-Experts model (%s is dense)", a->model);
  if (!mc->n_experts && a->compute_experts_given && a->ec.compute_experts != FERRY_COMPUTE_GPU)
    return ferry__fail(FERRY_ERR_INVALID, "--offload-compute experts=...: %s is dense (no experts)", a->model);
  if (mc->n_experts && !a->ec.expert_granularity_layer && run_given(a, "fill-budget"))
    return ferry__fail(FERRY_ERR_INVALID,
                       "--fill-budget is for dense models: %s is MoE, whose expert cache takes the budget left either way",
                       a->model);
  if (!strcmp(a->cmd, "sim") && !mc->n_experts && a->trace && run_given(a, "seed"))
    return ferry__fail(FERRY_ERR_INVALID,
                       "--seed has no effect: the simulator computes no tokens, and a dense model served from a --trace "
                       "file draws nothing (it seeds --synthetic traces and MoE routing)");
  if (a->quant && store)
    return ferry__fail(FERRY_ERR_INVALID,
                       "--quant sizes a preset or a folder with only config.json; %s has weight files, whose own formats "
                       "are used (quantize it with ferry model quantize)",
                       a->model);
  return FERRY_OK;
}

/* With every weight on the device nothing streams: the streaming options would be accepted and
 * measured as if they mattered. `asked_all` is --resident all; `defaulted` says the budget was
 * chosen here (the model fits in it). */
static ferry_status refuse_ignored_when_resident(const struct run_args *a, int asked_all, int defaulted) {
  if (!a->ec.resident_all && a->ec.device_budget_bytes) return FERRY_OK;
  static const char *const streaming[] = {"block-layers", "prefetch-depth", "pin-first", "pin-last", "home",
                                          "fill-budget",  "expert-cache",   "predictor", "direct-io", "keep-cache",
                                          "offload-compute", "expert-granularity", NULL};
  const char *o = NULL;
  for (size_t i = 0; streaming[i] && !o; i++)
    if (run_given(a, streaming[i])) o = streaming[i];
  if (!o && run_given(a, "resident") && !asked_all) o = "resident attention";
  if (!o) return FERRY_OK;
  char budget[32];
  if (asked_all)
    return ferry__fail(FERRY_ERR_INVALID, "--%s has no effect with --resident all: every weight stays on the device", o);
  if (defaulted)
    return ferry__fail(FERRY_ERR_INVALID,
                       "--%s has no effect: %s fits in the default device budget (%s) and stays resident; give "
                       "--device-budget SIZE to offload it",
                       o, a->model, ferry__format_bytes(a->ec.device_budget_bytes, budget, sizeof budget));
  return ferry__fail(FERRY_ERR_INVALID,
                     "--%s has no effect: without --device-budget the %s executor keeps every weight resident; give "
                     "--device-budget SIZE to offload",
                     o, strcmp(a->cmd, "sim") ? a->backend : "sim");
}

/* Requests of the run that a replayed routing trace has no decisions for: all of them means the
 * trace was recorded on other requests (an error); some are warned about, with the count. */
static ferry_status check_routing_coverage(const struct run_args *a, const ferry_routing *r,
                                           const struct ferry_engine_request *reqs, int64_t n) {
  int64_t absent = 0;
  for (int64_t i = 0; i < n; i++) absent += !ferry_routing_lookup(r, reqs[i].id, 0, 0, NULL, NULL);
  if (n && absent == n)
    return ferry__fail(FERRY_ERR_INVALID,
                       "--routing %s has no decisions for any of the %lld requests (their ids are not in the trace): "
                       "record it on the same requests (ferry run --record-routing)",
                       a->routing, (long long)n);
  if (absent)
    fprintf(stderr, "ferry: --routing %s: %lld of %lld requests have no recorded routing; the synthetic model routes "
                    "them\n",
            a->routing, (long long)absent, (long long)n);
  return FERRY_OK;
}

/* Fitted kernel costs that explain little of their measurements (R^2 below
 * FERRY_HW_FIT_R2_MIN): named in `out` ("" when none) and warned of, since the run's
 * predictions rest on them. */
static void weak_fits(const struct ferry_hw_profile *p, char *out, size_t len) {
  size_t n = 0;
  out[0] = '\0';
  for (int i = 0; i < FERRY_HW_COST_KINDS; i++) {
    if (!(p->cost_set >> i & 1) || p->cost[i].r2 == 0 || p->cost[i].r2 >= FERRY_HW_FIT_R2_MIN) continue;
    int k = snprintf(out + n, len - n, "%s%s R^2 %.2f", n ? ", " : "", ferry_hw_cost_kind_name(i), p->cost[i].r2);
    if (k < 0 || (size_t)k >= len - n) break;
    n += (size_t)k;
  }
  if (n) fprintf(stderr, "ferry: warning: %s has weak fitted costs (%s < %.1f): its predictions may be off\n", p->name, out,
                 FERRY_HW_FIT_R2_MIN);
}

/* The figures --offload-compute auto compares, from the profile's cost models: what a GEMM of
 * 1e12 flops and a read of 1e12 bytes take on its GPU and on its CPU, and its link's rate. */
static void profile_rates(const struct ferry_hw_profile *p, enum ferry_dtype dtype, struct ferry_compute_rates *r) {
  const double big = 1e12;
  const struct ferry__gpu_work math = {.op = FERRY_HW_OP_GEMM, .math = dtype, .flops = big};
  const struct ferry__gpu_work mem = {.op = FERRY_HW_OP_GEMV, .math = dtype, .bytes = big};
  int64_t ns;
  memset(r, 0, sizeof *r);
  if ((ns = ferry__gpu_work_ns(p, &math)) > 0) r->device_flops = big / ((double)ns * 1e-9);
  if ((ns = ferry__gpu_work_ns(p, &mem)) > 0) r->device_bytes = big / ((double)ns * 1e-9);
  if ((ns = ferry__cpu_work_ns(p, &math)) > 0) r->cpu_flops = big / ((double)ns * 1e-9);
  if ((ns = ferry__cpu_work_ns(p, &mem)) > 0) r->cpu_bytes = big / ((double)ns * 1e-9);
  if (p->has_link) r->link_bytes = p->link.h2d_gbps * 1e9;
}

/* A real run has no profile: its device computes as fast as its CPU as far as the rule knows
 * (true of the host executor, whose device is this CPU), so --offload-compute auto computes on
 * the CPU, never paying for a copy. */
static void same_rates(struct ferry_compute_rates *r) {
  r->cpu_flops = r->device_flops = 1e12;
  r->cpu_bytes = r->device_bytes = r->link_bytes = 1e10;
}

int run_execute(struct run_args *a) {
  int rc = CLI_FAIL;
  int sim = !strcmp(a->cmd, "sim");
  ferry_model *model = NULL;
  ferry_store *store = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *eng = NULL;
  ferry_db *db = NULL;
  int64_t run_id = -1;
  char *config_json = NULL, *dump_tmp = NULL;
  char fit_warning[512] = "";
  ferry_routing *recorded = NULL, *replayed = NULL;
  ferry_routing_synth *synth = NULL;
  ferry_routing_replay *replay = NULL;
  ferry_routing *pred_trace = NULL;
  int64_t *popularity = NULL;
  struct predict_glue glue = {0};
  ferry_cupti *cupti = NULL;
  struct logit_dump dump = {0};
  struct ferry_engine_request *reqs = NULL;
  int64_t n = 0;
  struct run_resil resil;
  resil_init(&resil, &a->resil);
  ferry_status st = resil_prepare(&a->resil, &a->ec);
  if (st != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  st = ferry_model_open(&model, a->model);
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
    /* The simulator reads no weights, but a folder's files give the real sizes and formats of
     * its tensors (a quantized folder streams fewer bytes); a folder with only config.json is
     * sized from the configuration. */
    if (!sim || has_weights(a->model)) {
      if ((st = ferry_store_open(&store, a->model)) != FERRY_OK) {
        cli_fail(st, NULL);
        goto out;
      }
      if (a->resil.verify_reads) ferry_store_set_verify(store, 1);
    }
  }
  if ((st = refuse_ignored_for_model(a, ferry_model_get_config(model), store)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  /* --offload-compute cpu on a dense model: its only class is layers */
  if (!ferry_model_get_config(model)->n_experts) a->ec.compute_experts = FERRY_COMPUTE_GPU;
  /* a layer's experts in its block: its expert cache and predictor do not exist */
  if (a->ec.expert_granularity_layer && a->ec.compute_experts != FERRY_COMPUTE_GPU && !a->compute_experts_given)
    a->ec.compute_experts = FERRY_COMPUTE_GPU;
  /* a plan sizes the KV cache from the requests, as the run would: load them when given */
  if (!a->plan_only || a->trace || a->synthetic) {
    if ((st = run_load_requests(a, &reqs, &n)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
    if (a->too_long)
      fprintf(stderr, "ferry: skipped %lld request(s) longer than %s's maximum position %lld (--skip-bad)\n",
              (long long)a->too_long, ferry_model_get_config(model)->name,
              (long long)ferry_model_get_config(model)->max_position);
  } else if (a->ec.max_seq_tokens <= 0) {
    fprintf(stderr, "ferry: no --trace or --synthetic: the KV cache is sized for 2048 tokens per sequence "
                    "(--max-seq-tokens N to change)\n");
  }
  /* the configuration as asked, before defaults drawn from this machine (its free memory varies
   * from run to run): `ferry sweep` finds completed runs by its hash */
  config_json = run_config_json(a);
  const int asked_all = a->ec.resident_all, had_budget = a->ec.device_budget_bytes != 0;
  if ((st = default_device_budget(a, sim, model, store)) != FERRY_OK ||
      (st = refuse_ignored_when_resident(a, asked_all, !had_budget && a->ec.device_budget_bytes)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  /* gate lookahead keeps every router resident: the plan must know before anything is sized */
  if (a->predictor && !strcmp(a->predictor, "gate-lookahead")) a->ec.router_lookahead = 1;
  if (a->plan_only) {
    st = ferry_engine_plan_only(model, store, &a->ec, stdout);
    if (st != FERRY_OK) cli_fail(st, NULL);
    else rc = CLI_OK;
    goto out;
  }
  if (a->db) {
    if ((st = ferry_db_open(&db, a->db, FERRY_DB_CREATE)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
  }
  struct ferry_exec_config xc = {.device_budget_bytes = a->ec.device_budget_bytes,
                                 .host_budget_bytes = a->ec.host_budget_bytes,
                                 .lock_host_memory = !a->host_pageable,
                                 .compute_threads = a->threads};
  if (sim) {
    ferry_hw *hw = NULL;
    st = ferry_hw_open(&hw, a->hw);
    /* the software issuing the work: as asked, else the profile's, else a C++ engine */
    if (st == FERRY_OK && (a->runtime || !ferry_hw_get(hw)->has_runtime))
      st = ferry_hw_set_runtime(hw, a->runtime ? a->runtime : "native");
    if (st == FERRY_OK) st = ferry_exec_create_sim(&ex, hw, &xc);
    if (st == FERRY_OK) weak_fits(ferry_hw_get(hw), fit_warning, sizeof fit_warning);
    if (st == FERRY_OK) profile_rates(ferry_hw_get(hw), ferry_model_get_config(model)->dtype, &a->ec.rates);
    /* a multi-GPU machine's profile: the engine drives one GPU of it (one replica) */
    if (st == FERRY_OK && a->progress && ferry_hw_gpu_count(ferry_hw_get(hw)) > 1)
      fprintf(stderr, "ferry: %s holds %d GPUs; the engine drives one of them (ferry plan counts the others as replicas)\n",
              ferry_hw_get(hw)->name, ferry_hw_gpu_count(ferry_hw_get(hw)));
    ferry_hw_close(hw);
  } else if (!strcmp(a->backend, "cuda")) {
    st = ferry_exec_create_cuda(&ex, &xc);
    same_rates(&a->ec.rates);
  } else {
    st = ferry_exec_create_host(&ex, &xc);
    same_rates(&a->ec.rates);
  }
  if (st != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  resil_attach(&resil, ex);
  const struct ferry_model_config *mc = ferry_model_get_config(model);
  if ((a->record_routing || a->routing || a->routing_synth) && !mc->n_experts) {
    cli_fail(FERRY_ERR_INVALID, "routing options need a Mixture-of-Experts model (%s is dense)", a->model);
    goto out;
  }
  if (a->record_routing) {
    if ((st = ferry_routing_create(&recorded, (int32_t)mc->n_layers, (int32_t)mc->n_experts,
                                   (int32_t)mc->experts_per_token)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
    a->ec.on_routing = ferry_routing_record;
    a->ec.on_routing_user = recorded;
  }
  if (a->record_features) {
    const int mlp3 = !strcmp(a->record_features, "mlp3"), mlp7 = !strcmp(a->record_features, "mlp7");
    if (!a->record_routing || (!mlp3 && !mlp7 && strcmp(a->record_features, "none"))) {
      cli_fail(FERRY_ERR_INVALID, "--record-features %s: expected mlp3, mlp7 or none, with --record-routing FILE",
               a->record_features);
      goto out;
    }
    a->ec.token_features = mlp3 ? FERRY_MLP3_FEATURES : mlp7 ? FERRY_MLP7_FEATURES : 0;
  }
  if (sim && mc->n_experts) {
    /* routing source: a recorded trace (falling back to the synthetic model), or the model */
    struct ferry_routing_synth_config sc = {.n_layers = (int32_t)mc->n_layers, .n_experts = (int32_t)mc->n_experts,
                                            .top_k = (int32_t)mc->experts_per_token, .seed = a->seed};
    if (a->routing_synth && (st = ferry_routing_synth_parse(a->routing_synth, &sc)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
    /* the engine routes the model's shape: another one in the spec would be ignored */
    if (sc.n_layers != (int32_t)mc->n_layers || sc.n_experts != (int32_t)mc->n_experts ||
        sc.top_k != (int32_t)mc->experts_per_token) {
      cli_fail(FERRY_ERR_INVALID,
               "--routing-synth %s: %s has %lld layers, %lld experts and routes %lld per token; layers, experts and k "
               "must match it (leave them out)",
               a->routing_synth, a->model, (long long)mc->n_layers, (long long)mc->n_experts,
               (long long)mc->experts_per_token);
      goto out;
    }
    if ((st = ferry_routing_synth_create(&synth, &sc)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
    a->ec.routing = ferry_routing_synth_fn;
    a->ec.routing_user = synth;
    if (a->routing) {
      if ((st = ferry_routing_open(&replayed, a->routing, NULL)) != FERRY_OK ||
          (st = ferry_routing_check_shape(replayed, sc.n_layers, sc.n_experts, sc.top_k, a->routing)) != FERRY_OK ||
          (st = check_routing_coverage(a, replayed, reqs, n)) != FERRY_OK ||
          (st = ferry_routing_replay_create(&replay, replayed, synth)) != FERRY_OK) {
        cli_fail(st, NULL);
        goto out;
      }
      a->ec.routing = ferry_routing_replay_fn;
      a->ec.routing_user = replay;
    }
  }
  if ((a->predictor || a->predictor_routing) && !mc->n_experts) {
    cli_fail(FERRY_ERR_INVALID, "--predictor needs a Mixture-of-Experts model (%s is dense)", a->model);
    goto out;
  }
  if (a->predictor_routing &&
      ((st = ferry_routing_open(&pred_trace, a->predictor_routing, NULL)) != FERRY_OK ||
       (st = ferry_routing_check_shape(pred_trace, (int32_t)mc->n_layers, (int32_t)mc->n_experts,
                                       (int32_t)mc->experts_per_token, a->predictor_routing)) != FERRY_OK)) {
    cli_fail(st, NULL);
    goto out;
  }
  /* the static placement pins the experts the trace routes most */
  if (pred_trace && a->ec.expert_cache && !strcmp(a->ec.expert_cache, "static")) {
    popularity = ferry__calloc((size_t)(mc->n_layers * mc->n_experts), sizeof *popularity);
    if (!popularity || (st = ferry_routing_counts(pred_trace, (int32_t)mc->n_experts, popularity)) != FERRY_OK) {
      cli_fail(popularity ? st : FERRY_ERR_NOMEM, popularity ? NULL : "out of memory for the routing counts");
      goto out;
    }
    a->ec.expert_popularity = popularity;
  }
  const int32_t recorded_features = a->ec.token_features;
  if (a->predictor &&
      (st = predict_glue_init(&glue, a->predictor, a->predictor_model, mc, pred_trace, sim ? a->ec.routing : NULL,
                              sim ? a->ec.routing_user : NULL, &a->ec)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  if (a->predictor) glue.record = recorded;
  if (recorded_features && a->ec.token_features != recorded_features) {
    cli_fail(FERRY_ERR_INVALID, "--record-features %s and --predictor %s compute different features: use the same variant",
             a->record_features, a->predictor);
    goto out;
  }
  if (a->dump_logits) {
    dump_tmp = ferry__asprintf("%s.tmp", a->dump_logits);
    dump.f = dump_tmp ? fopen(dump_tmp, "w") : NULL;
    if (!dump.f) {
      cli_fail(FERRY_ERR_IO, "--dump-logits %s: cannot create the file", a->dump_logits);
      goto out;
    }
    a->ec.on_logits = dump_logits;
    a->ec.logits_user = &dump;
  }
  if (db) {
    char hash[17];
    run_config_hash(config_json ? config_json : "", hash);
    /* what made the run: build, machine, GPU (docs/schema.md, provenance) */
    struct ferry_provenance prov;
    ferry_provenance_collect(ex, &prov);
    struct ferry_run_info info = {.kind = sim ? FERRY_RUN_SIM : !strcmp(a->backend, "cuda") ? FERRY_RUN_CUDA : FERRY_RUN_HOST,
                                  .model = a->model,
                                  .hardware = sim ? a->hw : a->backend,
                                  .trace = a->trace ? a->trace : a->synthetic,
                                  .config_json = config_json,
                                  .config_hash = hash,
                                  .git_rev = ferry_provenance_value(&prov, "BUILD_GIT_DESCRIBE"),
                                  .sweep_key = getenv("FERRY_SWEEP_KEY"), /* set by ferry sweep */
                                  .repeat_group = a->group_tag,
                                  .repeat_index = a->repeat_index};
    if ((st = ferry_db_run_begin(db, &info, &run_id)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
    for (size_t i = 0; i < prov.count; i++) ferry_db_run_meta(db, run_id, prov.items[i].name, prov.items[i].value);
    /* the budgets the run had, defaults included (0: unlimited) */
    char budget[32];
    snprintf(budget, sizeof budget, "%llu", (unsigned long long)a->ec.device_budget_bytes);
    ferry_db_run_meta(db, run_id, "DEVICE_BUDGET_BYTES", budget);
    snprintf(budget, sizeof budget, "%llu", (unsigned long long)a->ec.host_budget_bytes);
    ferry_db_run_meta(db, run_id, "HOST_BUDGET_BYTES", budget);
    if (a->too_long) {
      snprintf(budget, sizeof budget, "%lld", (long long)a->too_long);
      ferry_db_run_meta(db, run_id, "REQUESTS_TOO_LONG", budget);
    }
    if (fit_warning[0]) ferry_db_run_meta(db, run_id, "WEAK_FITS", fit_warning);
    ferry_exec_set_sink(ex, ferry_db_activity_sink, db);
    resil_attach_db(&resil, db, run_id);
    struct ferry_device_info gpu;
    if (ferry_exec_device_info(ex, &gpu) == FERRY_OK && (st = ferry_db_add_gpu(db, run_id, 0, &gpu)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
    if (a->profile) {
      int64_t t0 = ferry_cupti_clock_ns() - ferry_exec_now(ex);
      st = ferry_cupti_start(&cupti, ferry_db_activity_sink, db, t0);
      if (st != FERRY_OK) {
        fprintf(stderr, "ferry: %s\n", ferry_last_error());
        ferry_db_run_meta(db, run_id, "CUPTI_STATUS", ferry_last_error());
      } else {
        ferry_db_run_meta(db, run_id, "CUPTI_STATUS", "on");
        ferry_exec_set_sink(ex, ranges_and_memory, db);
        /* CUPTI's kernels and copies get the layer and expert of the op that issued them */
        ferry_exec_set_launch_hook(ex, ferry_cupti_launch_begin, ferry_cupti_launch_end, cupti);
      }
    }
  }
  if ((st = ferry_engine_create(&eng, model, store, ex, &a->ec)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  if (a->progress) ferry_engine_print_plan(eng, stderr);
  if ((st = resil_start(&resil, eng, model)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  struct ferry_run_options ro = {.time_scale = a->time_scale, .as_fast_as_possible = a->as_fast, .progress = a->progress,
                                 .on_tick = resil_tick, .tick_user = &resil};
  int64_t wall0 = ferry__mono_ns();
  if ((st = ferry_engine_run(eng, reqs, n, &ro)) != FERRY_OK) {
    /* what was served before the failure stays in the database beside the error */
    char why[FERRY_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", ferry_last_error());
    resil_stop(&resil);
    resil_note_failure(&resil, st, why);
    if (db) {
      struct ferry_serve_summary part;
      ferry_engine_summary(eng, &part);
      write_results(db, run_id, eng, &part);
    }
    ferry__fail(st, "%s", why); /* the run's error in the database */
    cli_fail(st, NULL);
    goto out;
  }
  resil_stop(&resil);
  if (sim && a->progress) {
    struct ferry_sim_stats ss;
    double wall_s = (double)(ferry__mono_ns() - wall0) / 1e9;
    if (ferry_exec_sim_stats(ex, &ss) == FERRY_OK)
      fprintf(stderr, "ferry: simulated %.3f s in %.3f s of wall time: %llu events (%.0f events/s), %llu ops\n",
              (double)ss.now_ns / 1e9, wall_s, (unsigned long long)ss.events_run,
              wall_s > 0 ? (double)ss.events_run / wall_s : 0.0, (unsigned long long)ss.ops_done);
    if (ferry_exec_sim_stats(ex, &ss) == FERRY_OK && ss.cache_hits + ss.cache_misses) {
      char hit[32];
      fprintf(stderr, "ferry: page cache: %llu of %llu buffered disk reads served from memory (%s)\n",
              (unsigned long long)ss.cache_hits, (unsigned long long)(ss.cache_hits + ss.cache_misses),
              ferry__format_bytes(ss.bytes_cache, hit, sizeof hit));
    }
  }
  struct ferry_serve_summary sum;
  ferry_engine_summary(eng, &sum);
  if (a->summary_out) *a->summary_out = sum;
  else ferry_serve_summary_print(&sum, stdout);
  if (a->on_served) a->on_served(a->served_user, eng);
  if (db && (st = write_results(db, run_id, eng, &sum)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  if (db) {
    char kv[32];
    snprintf(kv, sizeof kv, "%lld", (long long)sum.kv_capacity_tokens);
    ferry_db_run_meta(db, run_id, "KV_CAPACITY_TOKENS", kv);
  }
  /* for the report: the routing traces this run used, and its prefetch counts */
  run_routing_meta(db, run_id, "replayed", a->routing, replayed);
  run_routing_meta(db, run_id, "predictor", a->predictor_routing, pred_trace);
  run_prefetch_meta(db, run_id, &sum);
  run_kv_meta(db, run_id, &sum);
  if (dump.f) {
    int bad = dump.failed || fclose(dump.f) != 0;
    dump.f = NULL;
    if (bad || rename(dump_tmp, a->dump_logits) != 0) {
      cli_fail(FERRY_ERR_IO, "--dump-logits %s: write failed", a->dump_logits);
      goto out;
    }
    if (dump.nonfinite)
      fprintf(stderr, "ferry: --dump-logits %s: %llu non-finite logit(s) (NaN or Inf) written as null\n",
              a->dump_logits, (unsigned long long)dump.nonfinite);
  }
  if (recorded) {
    if ((st = ferry_routing_record_status(recorded)) != FERRY_OK || (st = glue.record_status) != FERRY_OK ||
        (st = ferry_routing_write_jsonl(recorded, a->record_routing)) != FERRY_OK) {
      cli_fail(st, NULL);
      goto out;
    }
    run_routing_meta(db, run_id, "recorded", a->record_routing, recorded);
    if (a->progress)
      fprintf(stderr, "ferry: wrote %lld routing decisions to %s\n", (long long)ferry_routing_n_rows(recorded),
              a->record_routing);
  }
  if (replay && a->progress)
    fprintf(stderr, "ferry: routing replayed from %s: %lld decisions from the trace, %lld from the synthetic model\n",
            a->routing, (long long)ferry_routing_replay_hits(replay), (long long)ferry_routing_replay_misses(replay));
  rc = CLI_OK;
out:
  resil_stop(&resil);
  predict_glue_free(&glue);
  ferry_routing_free(pred_trace);
  ferry_free(popularity);
  ferry_routing_replay_free(replay);
  ferry_routing_free(replayed);
  ferry_routing_synth_free(synth);
  ferry_routing_free(recorded);
  if (dump.f) fclose(dump.f);
  if (dump_tmp && rc != CLI_OK) remove(dump_tmp);
  ferry_free(dump_tmp);
  if (db && run_id >= 0) {
    if (ex) ferry_exec_drain(ex);
    if (cupti) {
      struct ferry_cupti_stats cs;
      ferry_exec_set_launch_hook(ex, NULL, NULL, NULL);
      ferry_status cst = ferry_cupti_stop(cupti, &cs);
      cupti = NULL;
      ferry_db_run_add_dropped(db, run_id, cs.dropped_records + cs.zero_timestamp);
      const struct {
        const char *name;
        uint64_t value;
      } counts[] = {{"CUPTI_RECORDS", cs.records},
                    {"CUPTI_DROPPED_RECORDS", cs.dropped_records},
                    {"CUPTI_ZERO_TIMESTAMP_RECORDS", cs.zero_timestamp},
                    {"CUPTI_UNPAIRED_MARKERS", cs.unpaired_markers},
                    {"CUPTI_OWN_RANGES", cs.own_ranges},
                    {"CUPTI_POOL_EXHAUSTED", cs.pool_exhausted},
                    {"CUPTI_ATTRIBUTED_RECORDS", cs.attributed}};
      for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        char num[32];
        snprintf(num, sizeof num, "%llu", (unsigned long long)counts[i].value);
        ferry_db_run_meta(db, run_id, counts[i].name, num);
      }
      if (cst != FERRY_OK) ferry_db_run_meta(db, run_id, "CUPTI_STOP", ferry_last_error());
    }
    ferry_exec_set_sink(ex, NULL, NULL);
    /* events and I/O counters of every run that started, failed ones included */
    char run_error[FERRY_ERRMSG_MAX];
    snprintf(run_error, sizeof run_error, "%s", ferry_last_error());
    resil_stop(&resil);
    resil.eng = eng;
    ferry_status rst = resil_write(&resil, db, run_id);
    if (rst != FERRY_OK && rc == CLI_OK) {
      rc = cli_fail(rst, NULL);
      snprintf(run_error, sizeof run_error, "%s", ferry_last_error());
    }
    ferry_status fst = ferry_db_run_finish(db, run_id, rc == CLI_OK ? NULL : run_error);
    if (fst != FERRY_OK && rc == CLI_OK) rc = cli_fail(fst, NULL);
    if (rc == CLI_OK && a->progress) fprintf(stderr, "ferry: wrote run %lld to %s\n", (long long)run_id, a->db);
    a->run_id_out = run_id;
  }
  ferry_db_close(db);
  ferry_free(config_json);
  ferry_engine_destroy(eng);
  resil_free(&resil);
  ferry_exec_destroy(ex);
  ferry_store_close(store);
  ferry_model_close(model);
  ferry_free(reqs);
  return rc;
}
