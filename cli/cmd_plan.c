/* `ferry plan`: the cheapest hardware and configuration that serve a workload within a latency
 * SLO. For every hardware profile it searches the policy space (quantization, batch limit,
 * offload knobs) for the highest request rate meeting the SLO, simulating in parallel on the
 * local cores (plan_search.c, plan_work.c), then prints per profile that rate, the
 * configuration, its costs and whether it meets the demand, and the cheapest choice; with
 * --db it records the best configuration of each profile as runs for `ferry report`. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/mpi.h"
#include "cli/output.h"
#include "cli/plan.h"
#include "cli/plan_record.h"
#include "cli/plan_sensitivity.h"
#include "cli/plan_search.h"
#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/hw.h"
#include "ferry/model.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry plan --model M (--trace FILE | --synthetic SPEC) --slo ttft_p99=2s,tpot_p99=150ms [OPTIONS]\n"
          "Find, per hardware profile, the highest request rate that meets the SLO and the configuration that\n"
          "reaches it, what it costs, and the cheapest choice that serves the demand. Every point is a\n"
          "'ferry sim' run of the same engine, in parallel on this machine's cores.\n\n"
          "Workload:\n"
          "  --model NAME|DIR        preset or model folder\n"
          "  --trace FILE            request trace (its first --requests requests; --time-window, --trace-format)\n"
          "  --synthetic SPEC        synthetic requests, e.g. prompt=lognormal:512:0.6,output=128 (arrival pattern\n"
          "                          from the spec; its rate is replaced by the rates searched)\n"
          "  --requests N            requests each replica serves in a simulation (default 100; more is slower\n"
          "                          and steadier: see docs/plan.md)\n"
          "  --rate QPS              the demand in requests/s (default: the workload's own rate)\n"
          "  --skip-bad, --time-window A:B, --trace-format F, --seed S   as for 'ferry sim'\n"
          "SLO and search:\n"
          "  --slo LIST              limits, all of which must hold: METRIC_STAT=DURATION with METRIC ttft,\n"
          "                          tpot or e2e, STAT mean, p50, p90 or p99, DURATION e.g. 2s, 150ms, 800us\n"
          "  --hw all|LIST           profiles to consider (default all GPU profiles of the catalogue); a\n"
          "                          name may swap parts or set figures: h100-pcie+link=pcie4-x16,\n"
          "                          h100-pcie+host.memory_bytes=256GiB (ferry hw --help)\n"
          "  --max-gpus N            GPUs at most: single-GPU profiles may be replicated up to N behind a\n"
          "                          least-tokens router; a multi-GPU machine needs N >= its GPUs, and is\n"
          "                          searched as replicas of 1, 2, 4, ... GPUs each, split by tensor (expert\n"
          "                          for MoE) parallelism, or pipeline parallel where a format does not fit\n"
          "                          one GPU (default 1)\n"
          "  --budget-per-hour USD   the cheapest choice costs at most this\n"
          "  --quant LIST            weight formats searched: native (the model's own), int8, int4-g128, ...\n"
          "                          (default native,int8,int4-g128; quantized weights change the model's\n"
          "                          outputs: 'ferry model quantize --report' measures how much)\n"
          "  --max-batch LIST        batch limits searched (default 8,16,32,64,128,256, raised while the\n"
          "                          throughput grows by 5%% or more)\n"
          "  --runtime NAME          the software issuing the work, as 'ferry sim --runtime'\n"
          "  --tolerance T           relative precision of the rate search (default 5%%)\n"
          "  --verify N              check each answer by brute force: simulate N rates from 0.5 to 1.5 times it\n"
          "  --exhaustive            search every configuration to its end, without pruning (slower; the\n"
          "                          pruned search gives the same answers where the metrics grow with the rate)\n"
          "  --sensitivity PCT       then simulate the cheapest pick at the demand once more per rate, time and\n"
          "                          efficiency of its profile and runtime with that figure PCT %% lower, and say\n"
          "                          which break the SLO and what they rest on (sourced, estimate, ferry default)\n"
          "Output:\n"
          "  -j, --jobs N            simulations in parallel (default: the cores online)\n"
          "  --db FILE               record each profile's best configuration as sim runs with the plan's\n"
          "                          figures (PLAN_* facts) for 'ferry report'; the request slices are kept\n"
          "                          in FILE.plan/\n"
          "  --format text|json      the summary (default text)\n"
          "  --quiet                 no progress lines\n"
          "  -h, --help              this help\n");
}

/* "2s", "150ms", "800us", "1500ns" (a bare number is seconds). */
static int parse_duration_ns(const char *text, double *out) {
  char *end;
  double v = strtod(text, &end);
  if (end == text || !(v > 0) || !isfinite(v)) return -1;
  double unit = 1e9;
  if (!strcmp(end, "ms")) unit = 1e6;
  else if (!strcmp(end, "us")) unit = 1e3;
  else if (!strcmp(end, "ns")) unit = 1;
  else if (strcmp(end, "s") && *end) return -1;
  *out = v * unit;
  return 0;
}

static int parse_slo(const char *text, struct plan_opts *o) {
  static const char *const metrics[] = {"ttft", "tpot", "e2e"}, *const stats[] = {"mean", "p50", "p90", "p99"};
  char *copy = ferry__strdup(text);
  if (!copy) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  int rc = 0;
  o->n_slo = 0;
  for (char *save = NULL, *item = strtok_r(copy, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '='), *us = strchr(item, '_');
    int m = -1, st = -1;
    if (eq && us && us < eq) {
      *eq = *us = '\0';
      for (int i = 0; i < 3; i++)
        if (!strcmp(item, metrics[i])) m = i;
      for (int i = 0; i < 4; i++)
        if (!strcmp(us + 1, stats[i])) st = i;
    }
    double ns;
    if (m < 0 || st < 0 || parse_duration_ns(eq + 1, &ns) != 0)
      rc = cli_usage_error("plan", "--slo: expected METRIC_STAT=DURATION terms (ttft_p99=2s,tpot_p99=150ms), got '%s'",
                           text);
    else if (o->n_slo >= PLAN_MAX_SLO)
      rc = cli_usage_error("plan", "--slo: at most %d terms", PLAN_MAX_SLO);
    else
      o->slo[o->n_slo++] = (struct plan_slo){.metric = (enum plan_metric)m, .stat = (enum plan_stat)st, .limit_ns = ns};
  }
  ferry_free(copy);
  snprintf(o->slo_text, sizeof o->slo_text, "%s", text);
  return rc;
}

static int parse_quant(const char *text, struct plan_opts *o) {
  static char store[512];
  snprintf(store, sizeof store, "%s", text);
  o->n_quant = 0;
  for (char *save = NULL, *item = strtok_r(store, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    if (o->n_quant >= PLAN_MAX_QUANT) return cli_usage_error("plan", "--quant: at most %d formats", PLAN_MAX_QUANT);
    o->quant[o->n_quant++] = !strcmp(item, "native") ? NULL : item;
  }
  return o->n_quant ? 0 : cli_usage_error("plan", "--quant: no format given");
}

static int cmp_i32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static int parse_batches(const char *text, struct plan_opts *o) {
  char copy[256];
  snprintf(copy, sizeof copy, "%s", text);
  o->n_batches = 0;
  for (char *save = NULL, *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    int64_t v;
    if (o->n_batches >= PLAN_MAX_BATCHES) return cli_usage_error("plan", "--max-batch: at most %d values", PLAN_MAX_BATCHES);
    if (cli_parse_int("--max-batch", item, 1, 4096, &v)) return CLI_USAGE;
    o->batches[o->n_batches++] = (int32_t)v;
  }
  if (!o->n_batches) return cli_usage_error("plan", "--max-batch: no value given");
  qsort(o->batches, (size_t)o->n_batches, sizeof o->batches[0], cmp_i32);
  return 0;
}

/* What the options need of each other, the defaults that depend on them, and the paths. */
static int check_options(struct plan_opts *o, const char *quant, const char *batches) {
  if (!o->model) return cli_usage_error("plan", "missing --model");
  if (!o->trace == !o->synthetic) return cli_usage_error("plan", "give --trace FILE or --synthetic SPEC (one of them)");
  if (!o->n_slo) return cli_usage_error("plan", "missing --slo (e.g. ttft_p99=2s,tpot_p99=150ms)");
  if (o->synthetic && (o->trace_format || o->time_window))
    return cli_usage_error("plan", "--%s applies to --trace files", o->trace_format ? "trace-format" : "time-window");
  if (!o->requests) {
    /* a synthetic spec's n is the slice size when --requests is not given */
    const char *n = o->synthetic ? strstr(o->synthetic, "n=") : NULL;
    o->requests = n && (n == o->synthetic || n[-1] == ',') ? strtoll(n + 2, NULL, 10) : 100;
    if (o->requests < 4) o->requests = 4;
  }
  if (parse_quant(quant, o)) return CLI_USAGE;
  if (batches) {
    if (parse_batches(batches, o)) return CLI_USAGE;
  } else {
    static const int32_t ladder[] = {8, 16, 32, 64, 128, 256};
    o->n_batches = (int)(sizeof ladder / sizeof ladder[0]);
    memcpy(o->batches, ladder, sizeof ladder);
    o->batch_ladder = 1;
  }
  const struct ferry_path_use paths[] = {{"--db", o->db, FERRY_PATH_OUT | FERRY_PATH_SQLITE},
                                         {"--model", o->model, FERRY_PATH_DIR},
                                         {"--trace", o->trace, 0},
                                         {"--runtime", o->runtime, 0}};
  if (cli_check_paths("plan", paths, sizeof paths / sizeof paths[0])) return CLI_USAGE;
  return 0;
}

static int parse(int argc, char **argv, struct plan_opts *o) {
  enum { O_MODEL = 256, O_TRACE, O_SYNTH, O_REQUESTS, O_RATE, O_SLO, O_HW, O_MAX_GPUS, O_BUDGET, O_QUANT, O_BATCH,
         O_RUNTIME, O_TOL, O_DB, O_FORMAT, O_QUIET, O_SKIP, O_WINDOW, O_TFORMAT, O_SEED, O_VERIFY, O_EXHAUSTIVE,
         O_SENSITIVITY };
  static const struct option opts[] = {
      {"model", required_argument, 0, O_MODEL},         {"trace", required_argument, 0, O_TRACE},
      {"synthetic", required_argument, 0, O_SYNTH},     {"requests", required_argument, 0, O_REQUESTS},
      {"rate", required_argument, 0, O_RATE},           {"slo", required_argument, 0, O_SLO},
      {"hw", required_argument, 0, O_HW},               {"max-gpus", required_argument, 0, O_MAX_GPUS},
      {"budget-per-hour", required_argument, 0, O_BUDGET}, {"quant", required_argument, 0, O_QUANT},
      {"max-batch", required_argument, 0, O_BATCH},     {"runtime", required_argument, 0, O_RUNTIME},
      {"tolerance", required_argument, 0, O_TOL},       {"db", required_argument, 0, O_DB},
      {"format", required_argument, 0, O_FORMAT},       {"quiet", no_argument, 0, O_QUIET},
      {"skip-bad", no_argument, 0, O_SKIP},             {"time-window", required_argument, 0, O_WINDOW},
      {"trace-format", required_argument, 0, O_TFORMAT}, {"seed", required_argument, 0, O_SEED},
      {"verify", required_argument, 0, O_VERIFY},       {"exhaustive", no_argument, 0, O_EXHAUSTIVE},
      {"sensitivity", required_argument, 0, O_SENSITIVITY},
      {"jobs", required_argument, 0, 'j'},              {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->max_gpus = 1;
  o->tolerance = 0.05;
  o->seed = 1;
  o->requests = 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  o->jobs = cores > 0 ? (int)cores : 1;
  int64_t v;
  double d;
  const char *quant = "native,int8,int4-g128", *batches = NULL;
  optind = 1;
  int c;
  while ((c = cli_getopt_long(argc, argv, "hj:", opts, NULL)) != -1) {
    switch (c) {
    case O_MODEL: o->model = optarg; break;
    case O_TRACE: o->trace = optarg; break;
    case O_SYNTH: o->synthetic = optarg; break;
    case O_REQUESTS: if (cli_parse_int("--requests", optarg, 4, 1000000, &o->requests)) return CLI_USAGE; break;
    case O_RATE: if (cli_parse_double("--rate", optarg, 1e-9, 1e9, &o->demand_rps)) return CLI_USAGE; break;
    case O_SLO: if (parse_slo(optarg, o)) return CLI_USAGE; break;
    case O_HW: o->hw = optarg; break;
    case O_MAX_GPUS: if (cli_parse_int("--max-gpus", optarg, 1, PLAN_MAX_REPLICAS, &v)) return CLI_USAGE; o->max_gpus = (int)v; break;
    case O_BUDGET: if (cli_parse_double("--budget-per-hour", optarg, 1e-9, 1e9, &o->budget_per_hour)) return CLI_USAGE; break;
    case O_QUANT: quant = optarg; break;
    case O_BATCH: batches = optarg; break;
    case O_RUNTIME: o->runtime = optarg; break;
    case O_TOL: {
      char *end;
      d = strtod(optarg, &end);
      if (*end == '%') d /= 100, end++;
      if (end == optarg || *end || !(d > 0 && d < 1))
        return cli_usage_error("plan", "--tolerance: expected a fraction (0.05) or a percentage (5%%), got '%s'", optarg);
      o->tolerance = d;
      break;
    }
    case O_DB: o->db = optarg; break;
    case O_FORMAT:
      if (cli_parse_format("plan", optarg, &o->fmt)) return CLI_USAGE;
      if (o->fmt != CLI_FORMAT_TEXT && o->fmt != CLI_FORMAT_JSON)
        return cli_usage_error("plan", "--format: text or json");
      break;
    case O_QUIET: o->quiet = 1; break;
    case O_SKIP: o->skip_bad = 1; break;
    case O_WINDOW: o->time_window = optarg; break;
    case O_TFORMAT: o->trace_format = optarg; break;
    case O_SEED: if (cli_parse_int("--seed", optarg, 0, INT64_MAX, &v)) return CLI_USAGE; o->seed = (uint64_t)v; break;
    case 'j': if (cli_parse_int("--jobs", optarg, 1, 256, &v)) return CLI_USAGE; o->jobs = (int)v; break;
    case O_VERIFY: if (cli_parse_int("--verify", optarg, 2, PLAN_MAX_VERIFY, &v)) return CLI_USAGE; o->verify = (int)v; break;
    case O_EXHAUSTIVE: o->exhaustive = 1; break;
    case O_SENSITIVITY: if (cli_parse_double("--sensitivity", optarg, 0.1, 50, &o->sensitivity)) return CLI_USAGE; break;
    case 'h': usage(stdout); return -1;
    default: return cli_usage_error("plan", "invalid option");
    }
  }
  if (optind < argc) return cli_usage_error("plan", "unexpected argument '%s'", argv[optind]);
  return check_options(o, quant, batches);
}


/* The profiles to consider: every GPU profile of the catalogue, or the list given. */
static int load_hardware(const struct plan_opts *o, struct plan_state *ps) {
  char **names = NULL;
  size_t n = 0;
  char *list = NULL;
  const char **pick = NULL;
  size_t np = 0;
  int rc = CLI_OK;
  if (!o->hw || !strcmp(o->hw, "all")) {
    if (ferry_hw_list(&names, &n) != FERRY_OK) return cli_fail(FERRY_ERR_NOMEM, NULL);
    pick = ferry__calloc(n + 1, sizeof *pick);
    if (!pick) {
      rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
      goto out;
    }
    for (size_t i = 0; i < n; i++) pick[np++] = names[i];
  } else {
    list = ferry__strdup(o->hw);
    pick = ferry__calloc(strlen(o->hw) + 1, sizeof *pick);
    if (!list || !pick) {
      rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
      goto out;
    }
    for (char *save = NULL, *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save))
      pick[np++] = item;
  }
  ps->hw = ferry__calloc(np + 1, sizeof *ps->hw);
  if (!ps->hw) {
    rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < np && ps->nhw < PLAN_MAX_HW; i++) {
    ferry_hw *hw;
    if (ferry_hw_open(&hw, pick[i]) != FERRY_OK) {
      /* a listed catalogue entry that does not load is the catalogue's bug; a name given is the user's */
      rc = cli_fail(FERRY_ERR_NOT_FOUND, NULL);
      goto out;
    }
    const struct ferry_hw_profile *p = ferry_hw_get(hw);
    if (p->kind != FERRY_HW_KIND_GPU) {
      const int explicit = o->hw && strcmp(o->hw, "all");
      ferry_hw_close(hw);
      if (explicit) {
        rc = cli_usage_error("plan", "--hw %s: not a GPU profile (ferry hw list)", pick[i]);
        goto out;
      }
      continue;
    }
    struct plan_hw *h = &ps->hw[ps->nhw++];
    snprintf(h->name, sizeof h->name, "%s", p->name);
    h->price = p->price_per_hour_usd;
    for (size_t s = 0; s < p->n_sources; s++)
      if (!strcmp(p->sources[s].figure, "price_per_hour_usd")) snprintf(h->price_source, sizeof h->price_source, "%s", p->sources[s].date);
    h->gpus = ferry_hw_gpu_count(p);
    if (h->gpus > o->max_gpus) {
      h->skipped = 1;
      snprintf(h->why, sizeof h->why, "a machine of %d GPUs; --max-gpus is %d", h->gpus, o->max_gpus);
    } else if (h->gpus > PLAN_MAX_REPLICAS) {
      h->skipped = 1;
      snprintf(h->why, sizeof h->why, "%d GPUs: more than %d replicas", h->gpus, PLAN_MAX_REPLICAS);
    }
    ferry_hw_close(hw);
  }
  if (!ps->nhw) rc = cli_usage_error("plan", "no GPU profile to consider");
out:
  ferry_free(pick);
  ferry_free(list);
  ferry_hw_list_free(names, n);
  return rc;
}

static void print_text(const struct plan_state *ps, int cheapest, double wall_s) {
  const struct plan_opts *o = ps->o;
  int w = 14; /* the names' column: as wide as the longest (composed names run long) */
  for (int i = 0; i < ps->nhw; i++)
    if ((int)strlen(ps->hw[i].name) > w) w = (int)strlen(ps->hw[i].name);
  printf("%-*s %4s %10s %12s  %-48s %8s %9s %8s  %s\n", w, "hardware", "GPUs", "max req/s", "saturates", "configuration",
         "USD/h", "USD/Mtok", "tok/s/$", "demand");
  for (int i = 0; i < ps->nhw; i++) {
    const struct plan_hw *h = &ps->hw[i];
    if (h->skipped) {
      printf("%-*s %4d %10s %12s  %-48s %8s %9s %8s  skipped: %s\n", w, h->name, h->gpus, "-", "-", "-", "-", "-", "-",
             h->why);
      continue;
    }
    struct plan_figures f;
    plan_hw_figures(ps, h, &f);
    char sat[32] = "-", usd[32] = "-", mtok[32] = "-", tps[32] = "-", demand[96];
    if (h->saturated_rps > 0) snprintf(sat, sizeof sat, ">%.3g", h->saturated_rps);
    if (h->price > 0) snprintf(usd, sizeof usd, "%.2f", h->price);
    if (f.at_max.usd_per_mtok > 0) snprintf(mtok, sizeof mtok, "%.3f", f.at_max.usd_per_mtok);
    if (f.at_max.tokens_per_s_per_usd > 0) snprintf(tps, sizeof tps, "%.0f", f.at_max.tokens_per_s_per_usd);
    if (h->best_cand < 0) snprintf(demand, sizeof demand, "no");
    else if (!f.meets_demand) snprintf(demand, sizeof demand, "no (needs more GPUs than --max-gpus %d)", o->max_gpus);
    else if (h->gpus == 1 && h->need_replicas > 1)
      snprintf(demand, sizeof demand, "yes, %d replicas ($%.2f/h)", h->need_replicas, f.at_demand.usd_per_hour);
    else snprintf(demand, sizeof demand, "yes");
    if (f.meets_demand && !f.within_budget) snprintf(demand + strlen(demand), sizeof demand - strlen(demand), ", over budget");
    printf("%-*s %4d %10.4g %12s  %-48.48s %8s %9s %8s  %s%s\n", w, h->name, h->gpus, h->best_rps, sat,
           h->best_cand >= 0 ? f.config : "no configuration meets the SLO", usd, mtok, tps, demand,
           i == cheapest ? "  <- cheapest" : "");
    if (o->verify && h->best_cand >= 0)
      printf("%-*s brute force over %d rates from %.4g to %.4g req/s: the highest meeting the SLO is %.4g\n", w, "",
             o->verify, h->best_rps * 0.5, h->best_rps * 1.5, h->brute_force_rps);
  }
  if (cheapest >= 0) {
    const struct plan_hw *h = &ps->hw[cheapest];
    struct plan_figures f;
    plan_hw_figures(ps, h, &f);
    printf("\ncheapest for %.4g req/s within %s: %s", ps->demand_rps, o->slo_text, h->name);
    if (h->gpus == 1 && h->need_replicas > 1) printf(" x %d replicas", h->need_replicas);
    printf(" at $%.2f/h ($%.3f per million output tokens at that demand), %s\n", f.at_demand.usd_per_hour,
           f.at_demand.usd_per_mtok, f.config);
  } else {
    printf("\nno priced profile serves %.4g req/s within %s%s\n", ps->demand_rps, o->slo_text,
           o->budget_per_hour > 0 ? " and the budget" : "");
  }
  int sims = 0, reused = 0;
  for (int i = 0; i < ps->nhw; i++) sims += ps->hw[i].sims, reused += ps->hw[i].reused;
  printf("%d simulations of %zu requests per replica in %.1f s", sims, plan_workload_count(ps->w, 1), wall_s);
  if (reused) printf(" (and %d points taken from a configuration that runs the same)", reused);
  printf("\n");
}

int cmd_plan(int argc, char **argv) {
  struct plan_opts o;
  int rc = parse(argc, argv, &o);
  if (rc) return rc < 0 ? CLI_OK : rc;
  struct plan_state ps = {.o = &o};
  struct plan_sens sens = {0};
  struct cli_mpi mpi = {.size = 1};
  const char **names = NULL;
  ferry_model *model = NULL;
  if (ferry_model_open(&model, o.model) != FERRY_OK) return cli_fail(FERRY_ERR_NOT_FOUND, NULL);
  const int moe = ferry_model_get_config(model)->n_experts > 0;
  ferry_model_close(model);
  o.moe = moe;
  /* under mpirun rank 0 searches and the other ranks simulate what it sends them */
  if ((rc = cli_mpi_start("plan", &mpi)) != CLI_OK) return rc;
  if ((rc = load_hardware(&o, &ps)) != CLI_OK) goto out;
  for (int i = 0; i < ps.nhw; i++) ps.hw[i].moe = moe;
  if (mpi.rank > 0) {
    /* the same request slices, in this rank's own temporary folder */
    struct plan_opts wo = o;
    wo.db = NULL;
    if ((rc = plan_workload_open(&wo, &ps.w)) != CLI_OK) {
      cli_mpi_abort(&mpi, rc);
      goto out;
    }
    if (!(names = ferry__calloc((size_t)ps.nhw + 1, sizeof *names))) {
      rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
      cli_mpi_abort(&mpi, rc);
      goto out;
    }
    for (int i = 0; i < ps.nhw; i++) names[i] = ps.hw[i].name;
    rc = plan_remote_worker(&o, names, ps.w, &mpi);
    goto out;
  }
  if ((rc = plan_workload_open(&o, &ps.w)) != CLI_OK) goto out;
  ps.demand_rps = o.demand_rps > 0 ? o.demand_rps : plan_workload_rate(ps.w, 1);
  ps.mean_output = plan_workload_mean_output(ps.w);
  if (!o.quiet)
    fprintf(stderr, "ferry plan: %s, %zu requests per replica (%.4g req/s as recorded, %.1f output tokens each), "
                    "demand %.4g req/s, SLO %s; %d profile(s), %d worker(s)%s\n",
            o.model, plan_workload_count(ps.w, 1), plan_workload_rate(ps.w, 1), ps.mean_output, ps.demand_rps,
            o.slo_text, ps.nhw, o.jobs + mpi.size - 1, mpi.size > 1 ? " (with the other MPI ranks)" : "");
  const int64_t t0 = ferry__mono_ns();
  if ((rc = plan_run(&ps, o.jobs, &mpi)) != CLI_OK) {
    if (mpi.size > 1) cli_mpi_abort(&mpi, rc);
    goto out;
  }
  const double wall_s = (double)(ferry__mono_ns() - t0) / 1e9;
  struct ferry_plan_choice *choice = ferry__calloc((size_t)ps.nhw, sizeof *choice);
  if (!choice) {
    rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < ps.nhw; i++) {
    struct plan_figures f;
    plan_hw_figures(&ps, &ps.hw[i], &f);
    choice[i] = (struct ferry_plan_choice){.usd_per_hour = f.at_demand.usd_per_hour,
                                           .usd_per_mtok = f.at_demand.usd_per_mtok,
                                           .max_rps = ps.hw[i].best_rps,
                                           .eligible = !ps.hw[i].skipped && f.meets_demand && f.within_budget};
  }
  const int cheapest = ferry_plan_cheapest(choice, (size_t)ps.nhw);
  ferry_free(choice);
  if (o.db && (rc = plan_record(&ps, cheapest)) != CLI_OK) goto out;
  if (o.sensitivity > 0 && cheapest >= 0 && (rc = plan_sensitivity_run(&ps, cheapest, &sens)) != CLI_OK) goto out;
  const struct plan_sens *sp = o.sensitivity > 0 && cheapest >= 0 ? &sens : NULL;
  if (o.fmt == CLI_FORMAT_JSON) {
    rc = plan_print_json(&ps, cheapest, wall_s, sp);
  } else {
    print_text(&ps, cheapest, wall_s);
    if (sp) plan_sensitivity_print(&ps, sp, stdout);
  }
out:
  plan_sensitivity_free(&sens);
  for (int i = 0; i < ps.nhw; i++) plan_hw_free(&ps.hw[i]);
  ferry_free(ps.hw);
  ferry_free(names);
  plan_workload_close(ps.w);
  cli_mpi_stop(&mpi);
  return rc;
}
