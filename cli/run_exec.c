/* The steps `ferry run` and `ferry sim` share once options are parsed: open the model (and its
 * weights for real executors) and the requests, plan the budgets (ferry_engine_plan_budgets()
 * decides; this prints), create the executor, build the engine, serve, report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_exec.h"
#include "cli/run_routing_meta.h"
#include "sim/cpu_cost.h"
#include "sim/gpu_cost.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/exec_registry.h"
#include "ferry/hw.h"
#include "ferry/sim.h"

static int has_weights(const char *dir) {
  char *idx = ferry__path_join(dir, "model.safetensors.index.json"), *one = ferry__path_join(dir, "model.safetensors");
  int yes = (idx && ferry__is_file(idx)) || (one && ferry__is_file(one));
  ferry_free(idx);
  ferry_free(one);
  return yes;
}

/* Options that need the model to know they would be ignored. */
static ferry_status refuse_ignored_for_model(const struct run_args *a, const struct ferry_model_config *mc,
                                             const ferry_store *store) {
  if (!mc->n_experts && RUN_GIVEN(a, expert_cache))
    return ferry__fail(FERRY_ERR_INVALID, "--expert-cache needs a Mixture-of-Experts model (%s is dense)", a->model);
  if (!mc->n_experts && RUN_GIVEN(a, expert_granularity))
    return ferry__fail(FERRY_ERR_INVALID, "--expert-granularity needs a Mixture-of-Experts model (%s is dense)", a->model);
  if (!mc->n_experts && a->compute_experts_given && a->ec.compute_experts != FERRY_COMPUTE_GPU)
    return ferry__fail(FERRY_ERR_INVALID, "--offload-compute experts=...: %s is dense (no experts)", a->model);
  if (a->sim && !mc->n_experts && a->trace && RUN_GIVEN(a, seed))
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

/* The model, its weights (the simulator reads none, but a folder's files give the real sizes
 * and formats of its tensors: a quantized folder streams fewer bytes) and the requests. */
static ferry_status open_inputs(struct run_ctx *c) {
  struct run_args *a = c->a;
  ferry_status st = ferry_model_open(&c->model, a->model);
  if (st != FERRY_OK) return st;
  c->mc = ferry_model_get_config(c->model);
  const int dir = ferry__is_dir(a->model);
  if (!a->sim && !dir)
    return ferry__fail(FERRY_ERR_INVALID, "--model %s: 'ferry %s' needs a model folder with weights (ferry model gen "
                                          "writes one)",
                       a->model, a->cmd);
  if (dir && (!a->sim || has_weights(a->model)) && (st = ferry_store_open(&c->store, a->model)) != FERRY_OK) return st;
  if (c->store && a->verify_reads) ferry_store_set_verify(c->store, 1);
  if ((st = refuse_ignored_for_model(a, c->mc, c->store)) != FERRY_OK) return st;
  /* --offload-compute cpu on a dense model: its only class is layers */
  if (!c->mc->n_experts) a->ec.compute_experts = FERRY_COMPUTE_GPU;
  /* a layer's experts in its block: its expert cache and predictor do not exist */
  if (a->ec.expert_granularity_layer && a->ec.compute_experts != FERRY_COMPUTE_GPU && !a->compute_experts_given)
    a->ec.compute_experts = FERRY_COMPUTE_GPU;
  /* a plan sizes the KV cache from the requests, as the run would: load them when given */
  if (a->plan_only && !a->trace && !a->synthetic) {
    if (a->ec.max_seq_tokens <= 0)
      fprintf(stderr, "ferry: no --trace or --synthetic: the KV cache is sized for 2048 tokens per sequence "
                      "(--max-seq-tokens N to change)\n");
    return FERRY_OK;
  }
  if ((st = run_load_requests(a, &c->reqs, &c->n_reqs)) != FERRY_OK) return st;
  if (a->too_long)
    fprintf(stderr, "ferry: skipped %lld request(s) longer than %s's maximum position %lld (--skip-bad)\n",
            (long long)a->too_long, c->mc->name, (long long)c->mc->max_position);
  return FERRY_OK;
}

/* The profile a simulation runs on, with the software issuing the work: as asked, else the
 * profile's, else a C++ engine. Without a profile (--plan-only) that runtime alone, which is
 * all the plan reads (the element sizes of its workspace). */
ferry_status run_open_sim_profile(const struct run_args *a, ferry_hw **hw) {
  const char *runtime = a->runtime ? a->runtime : "native";
  if (!a->hw) return ferry_hw_open(hw, runtime);
  ferry_status st = ferry_hw_open(hw, a->hw);
  if (st == FERRY_OK && (a->runtime || !ferry_hw_get(*hw)->has_runtime)) st = ferry_hw_set_runtime(*hw, runtime);
  if (st == FERRY_OK && a->hw_figure_path) st = ferry_hw_set_figure(*hw, a->hw_figure_path, a->hw_figure_value);
  if (st != FERRY_OK) {
    ferry_hw_close(*hw);
    *hw = NULL;
  }
  return st;
}

/* What the machine offers, for the default budgets: the profile's GPU and host in sim, device
 * 0's memory on cuda (no device: creating the executor says so, and a plan needs none), this
 * machine's available memory for a real run's host tier. */
static ferry_status machine_memory(const struct run_args *a, struct ferry_machine_memory *m, ferry_hw **hw) {
  memset(m, 0, sizeof *m);
  m->gpu_free_bytes = UINT64_MAX;
  if (!a->sim) {
    m->host_available_bytes = ferry__mem_available_bytes();
    /* an executor that can say how much device memory it has (cuda): its device 0 */
    const struct ferry_exec_info *x = ferry_exec_registry_find(a->executor);
    static char device[48];
    snprintf(device, sizeof device, "%s device 0", a->executor);
    if (x && (x->caps & FERRY_EXEC_CAP_MEMORY) && x->memory(&m->gpu_free_bytes, &m->gpu_bytes) == FERRY_OK)
      m->gpu_name = device;
    else
      m->gpu_free_bytes = UINT64_MAX, m->gpu_bytes = 0;
    return FERRY_OK;
  }
  ferry_status st = run_open_sim_profile(a, hw);
  if (st != FERRY_OK || !a->hw) return st; /* --plan-only without a profile: no memory to size from */
  const struct ferry_hw_profile *p = ferry_hw_get(*hw);
  m->gpu_name = m->host_name = p->name;
  if (p->has_gpu) m->gpu_bytes = p->gpu.memory_bytes;
  if (p->has_host) m->host_bytes = p->host.memory_bytes;
  return FERRY_OK;
}

/* With every weight on the device nothing streams: the streaming options would be accepted and
 * measured as if they mattered. `asked_all` is --resident all; `defaulted` says the budget was
 * chosen by the plan (the model fits in it). */
static ferry_status refuse_ignored_when_resident(const struct run_args *a, int asked_all, int defaulted) {
  if (!a->ec.resident_all && a->ec.device_budget_bytes) return FERRY_OK;
  static const char *const streaming[] = {"block-layers", "prefetch-depth", "pin-first", "pin-last", "home",
                                          "fill-budget",  "expert-cache",   "predictor", "direct-io", "keep-cache",
                                          "offload-compute", "expert-granularity", "stream-embeddings", NULL};
  const char *o = NULL;
  for (size_t i = 0; streaming[i] && !o; i++) /* --kv-home disk reads its cache that many attentions ahead */
    if (run_given(a, streaming[i]) && !(a->ec.kv_home_disk && !strcmp(streaming[i], "prefetch-depth"))) o = streaming[i];
  if (!o && RUN_GIVEN(a, resident) && !asked_all) o = "resident attention";
  if (!o && !strcmp(a->kv_home, "layer")) o = "kv-home layer"; /* every layer's cache with it on the device */
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
                     o, a->executor);
}

/* The configuration as asked, then the budgets it leaves out. */
static ferry_status plan(struct run_ctx *c) {
  struct run_args *a = c->a;
  /* hashed before defaults drawn from this machine (its free memory varies from run to run):
   * `ferry sweep` finds completed runs by it */
  c->config_json = run_config_json(a);
  struct ferry_machine_memory m;
  struct ferry_budget_plan bp;
  ferry_hw *hw = NULL;
  const int asked_all = a->ec.resident_all;
  ferry_status st = machine_memory(a, &m, &hw);
  /* the plan charges the workspace at the element sizes the simulated runtime holds it at, as
   * the sim executor will (ferry_exec_elem_bytes()) */
  if (st == FERRY_OK && hw)
    ferry_hw_profile_elem_bytes(ferry_hw_get(hw), &a->ec.plan_elem_bytes.activation, &a->ec.plan_elem_bytes.dequant);
  /* what the predictor and placement will change in the plan (its expert cache, resident
   * routers), known before anything is sized: --plan-only prints the run's plan */
  if (st == FERRY_OK) st = run_plan_predictor(c);
  if (st == FERRY_OK) st = ferry_engine_plan_budgets(c->model, c->store, &m, &a->ec, &bp);
  ferry_hw_close(hw);
  if (st != FERRY_OK) return st;
  if (a->progress || a->plan_only) {
    if (bp.host_defaulted) fprintf(stderr, "ferry: %s; --host-budget to change\n", bp.host_note);
    if (bp.device_defaulted) fprintf(stderr, "ferry: %s; --device-budget to change\n", bp.device_note);
  }
  return refuse_ignored_when_resident(a, asked_all, bp.device_defaulted);
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

/* Work on the CPU priced from a host that names no cores: every type, int8 included, at
 * host.cpu_gflops taken as the whole CPU's fp32 peak (sim/cpu_cost.c), a rough figure in most
 * catalogue parts; the run's CPU times rest on it, so say so (not under --quiet). */
static void rough_cpu_warning(const struct ferry_hw_profile *p, const struct ferry_engine_config *ec, int quiet) {
  /* a per-layer cache (kv_home_layer) is attended on the CPU only with its layer computed there */
  const int cpu_work =
      ec->compute_experts != FERRY_COMPUTE_GPU || ec->compute_layers != FERRY_COMPUTE_GPU || ec->kv_home_host;
  if (quiet || !cpu_work || !p->has_host || p->host.cores > 0) return;
  fprintf(stderr,
          "ferry: warning: %s's host names no CPU cores (host.cores, host.core_gflops): its CPU kernels are "
          "priced at host.cpu_gflops %.0f GFLOP/s for every type; give the host's cores and per-core rates "
          "for CPU times to trust, or name a host part that has them (--hw %s+host=xeon-6454s-2s)\n",
          p->name, p->host.cpu_gflops, p->name);
}

/* The figures --offload-compute auto compares, from the profile's cost models: what a GEMM of
 * 1e12 flops and a read of 1e12 bytes take on its GPU and on its CPU, and its link's rate; and
 * the runtime's own rule for streamed layers where it has one (runtime.offload_min_rows). */
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
  if (p->has_runtime) r->offload_min_rows = p->runtime.offload_min_rows;
}

/* A real run has no profile: its device computes as fast as its CPU as far as the rule knows
 * (true of the host executor, whose device is this CPU), so --offload-compute auto computes on
 * the CPU, never paying for a copy. */
static void same_rates(struct ferry_compute_rates *r) {
  r->cpu_flops = r->device_flops = 1e12;
  r->cpu_bytes = r->device_bytes = r->link_bytes = 1e10;
}

/* The executor by its registry name: --backend, or sim (with the --hw profile); the rates
 * --offload-compute auto weighs, from the profile or (a real run) alike. `first`: the run's
 * first executor (another replica's says nothing more). */
ferry_status run_open_executor(struct run_ctx *c, int first, ferry_exec **out) {
  struct run_args *a = c->a;
  struct ferry_exec_params xp = {.config = {.device_budget_bytes = a->ec.device_budget_bytes,
                                            .host_budget_bytes = a->ec.host_budget_bytes,
                                            .lock_host_memory = strcmp(a->host_memory, "pageable") != 0,
                                            .compute_threads = (int)a->threads,
                                            .sim_mode = a->exact ? FERRY_SIM_EXACT : FERRY_SIM_FAST,
                                            .n_devices = a->ec.n_devices,
                                            .disk_dir = a->disk_dir}};
  ferry_hw *hw = NULL;
  ferry_status st = a->hw ? run_open_sim_profile(a, &hw) : FERRY_OK;
  xp.hw = hw;
  if (st == FERRY_OK) st = ferry_exec_open(a->executor, &xp, out);
  if (!first) {
    ferry_hw_close(hw);
    return st;
  }
  if (st == FERRY_OK && hw) {
    weak_fits(ferry_hw_get(hw), c->fit_warning, sizeof c->fit_warning);
    rough_cpu_warning(ferry_hw_get(hw), &a->ec, a->quiet);
  }
  if (hw) profile_rates(ferry_hw_get(hw), c->mc->dtype, &a->ec.rates);
  else same_rates(&a->ec.rates);
  const int gpus = hw ? ferry_hw_gpu_count(ferry_hw_get(hw)) : 1;
  if (st == FERRY_OK && hw && ferry_hw_get(hw)->has_interconnect && a->ec.n_devices > gpus)
    st = ferry__fail(FERRY_ERR_INVALID, "--gpus %d: %s holds %d GPUs", a->ec.n_devices, ferry_hw_get(hw)->name, gpus);
  /* ZeRO-3's ranks gather each block over the machine's GPU-to-GPU fabric */
  if (st == FERRY_OK && hw && a->ec.zero_gpus > 1 && !ferry_hw_get(hw)->has_interconnect)
    st = ferry__fail(FERRY_ERR_INVALID,
                     "--zero-gpus %d: hardware profile %s has no interconnect section (the GPUs the ranks' all-gather "
                     "joins, and its rate; hw/README.md)",
                     a->ec.zero_gpus, ferry_hw_get(hw)->name);
  if (st == FERRY_OK && hw && a->ec.zero_gpus > gpus)
    st = ferry__fail(FERRY_ERR_INVALID, "--zero-gpus %d: %s holds %d GPUs (interconnect.gpus)", a->ec.zero_gpus,
                     ferry_hw_get(hw)->name, gpus);
  /* a multi-GPU machine's profile: the engine drives one GPU of it (one replica) */
  if (st == FERRY_OK && hw && a->progress && gpus > 1 && a->ec.n_devices < 2 && a->ec.zero_gpus < 2)
    fprintf(stderr, "ferry: %s holds %d GPUs; the engine drives one of them (--gpus N --parallel tp|pp splits the "
                    "model over several)\n",
            ferry_hw_get(hw)->name, ferry_hw_gpu_count(ferry_hw_get(hw)));
  ferry_hw_close(hw);
  return st;
}

/* How the simulation went: its speed, and what its page cache model served. */
static void print_sim_stats(ferry_exec *ex, int64_t wall0, int asked_exact) {
  struct ferry_sim_stats ss;
  if (ferry_exec_sim_stats(ex, &ss) != FERRY_OK) return;
  const double wall_s = (double)(ferry__mono_ns() - wall0) / 1e9;
  const int exact = ss.mode == FERRY_SIM_EXACT;
  fprintf(stderr, "ferry: simulated %.3f s in %.3f s of wall time (%s mode%s): %llu ops (%.0f ops/s), %llu events\n",
          (double)ss.now_ns / 1e9, wall_s, exact ? "exact" : "fast",
          exact && !asked_exact ? ", chosen because two queues move bytes the same way, faults are injected or the "
                                  "runtime reads from disk only after its copies"
                                : "",
          (unsigned long long)ss.ops_done, wall_s > 0 ? (double)ss.ops_done / wall_s : 0.0,
          (unsigned long long)ss.events_run);
  if (ss.allreduces || ss.bytes_peer) {
    char moved[32];
    fprintf(stderr, "ferry: between GPUs: %llu all-reduces in %.3f ms; %s copied GPU to GPU in %.3f ms\n",
            (unsigned long long)ss.allreduces, (double)ss.allreduce_ns / 1e6,
            ferry__format_bytes(ss.bytes_peer, moved, sizeof moved), (double)ss.peer_busy_ns / 1e6);
  }
  if (ss.bytes_gather) {
    char moved[32];
    fprintf(stderr, "ferry: ZeRO-3 all-gather: %s of streamed blocks from the peers in %.3f ms (interconnect)\n",
            ferry__format_bytes(ss.bytes_gather, moved, sizeof moved), (double)ss.gather_busy_ns / 1e6);
  }
  if (ss.cache_hits + ss.cache_misses) {
    char hit[32];
    fprintf(stderr, "ferry: page cache: %llu of %llu buffered disk reads served from memory (%s)\n",
            (unsigned long long)ss.cache_hits, (unsigned long long)(ss.cache_hits + ss.cache_misses),
            ferry__format_bytes(ss.bytes_cache, hit, sizeof hit));
  }
}

/* The engine failed while serving: what it served before stays in the database beside the
 * error, and the failure is an event of the run. */
static ferry_status serve_failed(struct run_ctx *c, ferry_status st) {
  char why[FERRY_ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", ferry_last_error());
  resil_stop(&c->resil);
  resil_note_failure(&c->resil, st, why);
  if (c->db) {
    struct ferry_serve_summary part;
    run_replicas_summary(c, &part);
    run_db_write_results(c, &part);
  }
  return ferry__fail(st, "%s", why); /* the run's error in the database */
}

/* Serve the requests and print the summary; the outputs follow. */
static ferry_status serve(struct run_ctx *c) {
  struct run_args *a = c->a;
  ferry_status st = ferry_engine_create(&c->eng, c->model, c->store, c->ex, &a->ec);
  if (st != FERRY_OK) return st;
  if (a->progress) ferry_engine_print_plan(c->eng, stderr);
  if ((st = resil_start(&c->resil, c->eng, c->model)) != FERRY_OK) return st;
  struct ferry_run_options ro = {.time_scale = a->time_scale, .as_fast_as_possible = a->as_fast_as_possible,
                                 .progress = a->progress, .on_tick = resil_tick, .tick_user = &c->resil};
  const int64_t wall0 = ferry__mono_ns();
  st = a->replicas > 1 ? run_replicas_serve(c, &ro) : ferry_engine_run(c->eng, c->reqs, c->n_reqs, &ro);
  if (st != FERRY_OK) return serve_failed(c, st);
  resil_stop(&c->resil);
  if (a->sim && a->progress) print_sim_stats(c->ex, wall0, (int)a->exact);
  struct ferry_sim_stats ss;
  /* not in the configuration (both modes give the same figures), but said; known once the
   * engine has made its queues (a hybrid run's are timed exactly) */
  if (a->sim && c->db && ferry_exec_sim_stats(c->ex, &ss) == FERRY_OK)
    ferry_db_run_meta(c->db, c->run_id, "SIM_MODE", ss.mode == FERRY_SIM_EXACT ? "exact" : "fast");
  struct ferry_serve_summary sum;
  run_replicas_summary(c, &sum);
  /* text: the replicas above the summary (run_repeat() prints it in --format) */
  run_replicas_report(c, a->output_format == CLI_FORMAT_TEXT ? stdout : NULL);
  if (a->summary_out) *a->summary_out = sum;
  else ferry_serve_summary_print(&sum, stdout);
  /* once per engine: replica i's requests are those its engine served */
  for (int32_t i = 0; a->on_served && i < (c->n_rep > 1 ? c->n_rep : 1); i++)
    a->on_served(a->served_user, c->n_rep > 1 ? c->rep_eng[i] : c->eng);
  if ((st = run_db_write_results(c, &sum)) != FERRY_OK) return st;
  if (c->db) {
    /* for the report: the routing traces this run used, and its prefetch counts */
    run_routing_meta(c->db, c->run_id, "replayed", a->routing, c->replayed);
    run_routing_meta(c->db, c->run_id, "predictor", a->predictor_routing, c->pred_trace);
    run_prefetch_meta(c->db, c->run_id, &sum);
    run_kv_meta(c->db, c->run_id, &sum);
  }
  if ((st = run_close_dump(c, 1)) != FERRY_OK) return st;
  return run_finish_routing(c);
}

static ferry_status execute(struct run_ctx *c) {
  struct run_args *a = c->a;
  ferry_status st;
  if ((st = resil_prepare(&a->resil, &a->ec)) != FERRY_OK || (st = open_inputs(c)) != FERRY_OK ||
      (st = plan(c)) != FERRY_OK)
    return st;
  if (a->plan_only) return ferry_engine_plan_only(c->model, c->store, &a->ec, stdout);
  if ((a->db && (st = ferry_db_open(&c->db, a->db, FERRY_DB_CREATE)) != FERRY_OK) || (st = run_open_executor(c, 1, &c->ex)) != FERRY_OK)
    return st;
  resil_attach(&c->resil, c->ex); /* its events on the executor's clock */
  if ((st = run_setup_routing(c)) != FERRY_OK || (st = run_setup_predictor(c)) != FERRY_OK ||
      (st = run_open_dump(c)) != FERRY_OK || (st = run_db_begin(c)) != FERRY_OK)
    return st;
  return serve(c);
}

int run_execute(struct run_args *a) {
  struct run_ctx c = {.a = a, .run_id = -1};
  resil_init(&c.resil, &a->resil);
  ferry_status st = execute(&c);
  int rc = CLI_OK;
  if (st != FERRY_OK) rc = cli_fail(st, NULL);
  run_close_dump(&c, 0);
  resil_stop(&c.resil);
  const ferry_status fst = run_db_finish(&c, rc == CLI_OK);
  if (fst != FERRY_OK && rc == CLI_OK) rc = cli_fail(fst, NULL);
  run_free_routing(&c);
  ferry_db_close(c.db);
  run_replicas_free(&c);
  ferry_free(c.config_json);
  ferry_engine_destroy(c.eng);
  resil_free(&c.resil);
  ferry_exec_destroy(c.ex);
  ferry_store_close(c.store);
  ferry_model_close(c.model);
  ferry_free(c.reqs);
  return rc;
}

int run_prefetch_depth_used(struct run_args *a, int *used) {
  *used = 1;
  /* budget schedules, reloads, pressure control and faults change the run as it goes: never
   * called the same */
  const struct resil_opts *r = &a->resil;
  if (r->faults || getenv("FERRY_FAULT") || r->pressure || r->n_schedule || r->n_reload_at || r->reload_from ||
      r->control_socket || a->predictor || a->predictor_routing)
    return CLI_OK;
  struct run_ctx c = {.a = a, .run_id = -1};
  ferry_status st = open_inputs(&c);
  if (st == FERRY_OK) st = plan(&c);
  if (st == FERRY_OK) st = ferry_engine_prefetch_depth_used(c.model, c.store, &a->ec, used);
  run_free_routing(&c);
  ferry_free(c.config_json);
  ferry_store_close(c.store);
  ferry_model_close(c.model);
  ferry_free(c.reqs);
  if (st != FERRY_OK) *used = 1;
  return st == FERRY_OK ? CLI_OK : CLI_FAIL;
}
