/* The option table of `ferry run` and `ferry sim` (run_options.h) turned into a parser and a
 * usage text. Long options only, matched whole: getopt_long would take --prefetch for
 * --prefetch-depth (and silently a different option once a longer one is added), so an unknown
 * or shortened name is an error that names the nearest options instead. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_common.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/names.h"
#include "common/units.h"
#include "ferry/cache_policy.h"
#include "ferry/exec.h"
#include "ferry/exec_registry.h"
#include "ferry/fault.h"
#include "ferry/model.h"
#include "ferry/predict.h"
#include "ferry/quant.h"

/* --- checks of TEXT values (the table's `check` column) ------------------------------------ */

static int expect_one_of(struct run_args *a, const char *opt, const char *value, const char *const *choices) {
  for (size_t i = 0; choices[i]; i++)
    if (!strcmp(value, choices[i])) return 0;
  char list[256];
  size_t used = 0;
  for (size_t i = 0; choices[i] && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s'%s'", i == 0 ? "" : choices[i + 1] ? ", " : " or ",
                             choices[i]);
  return cli_usage_error(a->cmd, "--%s: expected %s, got '%s'", opt, list, value);
}

static int check_trace_format(struct run_args *a, const char *value) {
  if (ferry_trace_format_parse(value, &a->trace_opts.format) != FERRY_OK)
    return cli_usage_error(a->cmd, "--trace-format: unknown format '%s'", value);
  return 0;
}

static int check_time_window(struct run_args *a, const char *value) {
  struct ferry_trace_options *t = &a->trace_opts;
  if (ferry__parse_window_ns(value, &t->window_start_ns, &t->window_end_ns) != FERRY_OK)
    return cli_usage_error(a->cmd, "--time-window: %s", ferry_last_error());
  /* the configuration holds the window as parsed, so "10:20" and "10.0:20" are one run */
  char *w = a->time_window_text;
  const size_t len = sizeof a->time_window_text;
  if (t->window_end_ns > 0)
    snprintf(w, len, "%.9g:%.9g", (double)t->window_start_ns / 1e9, (double)t->window_end_ns / 1e9);
  else if (t->window_start_ns > 0) /* open end ("600:") */
    snprintf(w, len, "%.9g:", (double)t->window_start_ns / 1e9);
  else
    w[0] = '\0';
  a->time_window = w[0] ? w : NULL;
  return 0;
}

static int check_resident(struct run_args *a, const char *value) {
  return expect_one_of(a, "resident", value, (const char *const[]){"attention", "all", NULL});
}

static int check_home(struct run_args *a, const char *value) {
  return expect_one_of(a, "home", value, (const char *const[]){"disk", "host", NULL});
}

/* Eviction policies from their registry (ferry/cache_policy.h). */
/* A registered policy by name, or per-layer:K (K slots per layer, lru in each unless a policy
 * is named as well: the last given wins). */
static int check_expert_cache(struct run_args *a, const char *value) {
  if (!strncmp(value, "per-layer:", 10)) {
    int64_t k;
    if (cli_parse_int("--expert-cache per-layer:K", value + 10, 1, 1 << 20, &k)) return CLI_USAGE;
    a->ec.expert_cache_per_layer = (int32_t)k;
    snprintf(a->expert_cache_text, sizeof a->expert_cache_text, "per-layer:%d", (int)k);
    a->expert_cache = a->expert_cache_text; /* the configuration holds it as parsed */
    return 0;
  }
  const struct ferry_cache_policy_ops *p;
  if (ferry_cache_policy_lookup(value, &p) != FERRY_OK)
    return cli_usage_error(a->cmd, "--expert-cache: %s (or per-layer:K)", ferry_last_error());
  a->ec.expert_cache_per_layer = 0;
  return 0;
}

static int check_expert_granularity(struct run_args *a, const char *value) {
  return expect_one_of(a, "expert-granularity", value, (const char *const[]){"expert", "layer", NULL});
}

static int check_kv_home(struct run_args *a, const char *value) {
  return expect_one_of(a, "kv-home", value, (const char *const[]){"device", "host", "disk", "layer", NULL});
}

static int check_kv_prefill(struct run_args *a, const char *value) {
  return expect_one_of(a, "kv-prefill", value, (const char *const[]){"device", "host", NULL});
}

static int check_kv_attention(struct run_args *a, const char *value) {
  return expect_one_of(a, "kv-attention", value, (const char *const[]){"device", "cpu", NULL});
}

static int check_schedule(struct run_args *a, const char *value) {
  return expect_one_of(a, "schedule", value, (const char *const[]){"mixed", "prefill-first", NULL});
}

static int check_kv_preempt(struct run_args *a, const char *value) {
  return expect_one_of(a, "kv-preempt", value, (const char *const[]){"recompute", "swap", NULL});
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

/* --offload-compute gpu|cpu|auto, or per class: experts=X,layers=Y (each class at most once);
 * the configuration holds the canonical experts=X,layers=Y. */
static int check_offload_compute(struct run_args *a, const char *spec) {
  char buf[64];
  if (strlen(spec) >= sizeof buf) return cli_usage_error(a->cmd, "--offload-compute: '%s' is too long", spec);
  snprintf(buf, sizeof buf, "%s", spec);
  struct ferry_engine_config *ec = &a->ec;
  int seen_e = 0, seen_l = 0;
  if (compute_where(buf, &ec->compute_experts) == 0) {
    ec->compute_layers = ec->compute_experts;
    a->compute_experts_given = 0; /* for every class the model has */
  } else {
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      char *eq = strchr(tok, '=');
      enum ferry_compute_where w;
      if (!eq || compute_where(eq + 1, &w))
        return cli_usage_error(a->cmd, "--offload-compute: expected gpu, cpu, auto or CLASS=gpu|cpu|auto (classes: "
                                       "experts, layers), got '%s'", tok);
      *eq = '\0';
      if (!strcmp(tok, "experts") && !seen_e) {
        ec->compute_experts = w;
        a->compute_experts_given = seen_e = 1;
      } else if (!strcmp(tok, "layers") && !seen_l) {
        ec->compute_layers = w;
        seen_l = 1;
      } else {
        return cli_usage_error(a->cmd, "--offload-compute: '%s' is not a class given once (experts, layers)", tok);
      }
    }
  }
  snprintf(a->offload_compute_text, sizeof a->offload_compute_text, "experts=%s,layers=%s",
           where_name(ec->compute_experts), where_name(ec->compute_layers));
  a->offload_compute = a->offload_compute_text;
  return 0;
}

static int check_parallel(struct run_args *a, const char *value) {
  return expect_one_of(a, "parallel", value, (const char *const[]){"tp", "pp", "ep", NULL});
}

static int check_router(struct run_args *a, const char *value) {
  return expect_one_of(a, "router", value, (const char *const[]){"round-robin", "least-requests", "least-tokens", NULL});
}

static int check_expert_placement(struct run_args *a, const char *value) {
  return expect_one_of(a, "expert-placement", value, (const char *const[]){"range", "hash", NULL});
}

static int check_host_memory(struct run_args *a, const char *value) {
  return expect_one_of(a, "host-memory", value, (const char *const[]){"pinned", "pageable", NULL});
}

static int check_kv_host_memory(struct run_args *a, const char *value) {
  return expect_one_of(a, "kv-host-memory", value, (const char *const[]){"pinned", "pageable", NULL});
}

static int check_kv_dtype(struct run_args *a, const char *value) {
  if (ferry_kv_format_parse(value, &a->ec.kv_format) != FERRY_OK)
    return cli_usage_error(a->cmd, "--kv-dtype: %s", ferry_last_error());
  a->kv_dtype = a->ec.kv_format == FERRY_KV_AUTO ? NULL : ferry_kv_format_name(a->ec.kv_format);
  return 0;
}

/* Executors from the registry; those that need a hardware profile are `ferry sim`'s. */
static int check_backend(struct run_args *a, const char *value) {
  const struct ferry_exec_info *x = ferry_exec_registry_find(value);
  if (x && !(x->caps & FERRY_EXEC_CAP_HW)) return 0;
  if (x) return cli_usage_error(a->cmd, "--backend %s simulates a hardware profile: run 'ferry sim --hw PROFILE'", value);
  const char *names[32], *near[3];
  size_t n = 0;
  for (size_t i = 0; i < ferry_exec_registry_count() && n < 32; i++)
    if (!(ferry_exec_registry_at(i)->caps & FERRY_EXEC_CAP_HW)) names[n++] = ferry_exec_registry_at(i)->name;
  char all[256], list[256];
  const size_t k = ferry__nearest_names(value, names, n, 1, near, 3);
  return cli_usage_error(a->cmd, "--backend: no executor '%s'%s%s%s (executors: %s)", value, k ? "; did you mean " : "",
                         k ? ferry__join_names(near, k, "", list, sizeof list) : "", k ? "?" : "",
                         ferry__join_names(names, n, "", all, sizeof all));
}

static int check_quant(struct run_args *a, const char *value) {
  if (ferry_quant_plan_parse(value, &a->ec.quant) != FERRY_OK) return cli_usage_error(a->cmd, "--quant: %s", ferry_last_error());
  a->ec.quant_set = 1;
  return 0;
}

static int check_record_features(struct run_args *a, const char *value) {
  return expect_one_of(a, "record-features", value, (const char *const[]){"mlp3", "mlp7", "none", NULL});
}

/* Predictors from their registry (ferry/predict.h). */
static int check_predictor(struct run_args *a, const char *value) {
  const struct ferry_predictor_ops *p;
  if (ferry_predictor_lookup(value, &p) != FERRY_OK) return cli_usage_error(a->cmd, "--predictor: %s", ferry_last_error());
  return 0;
}

/* --- staying up: cli/run_resil.c parses, the options keep the text ----------------------- */

static int check_faults(struct run_args *a, const char *value) {
  if (ferry_fault_set(value) != FERRY_OK) return cli_usage_error(a->cmd, "--faults: %s", ferry_last_error());
  ferry_fault_clear(); /* installed when the run starts (resil_prepare) */
  return 0;
}

static int check_pressure_marks(struct run_args *a, const char *value) {
  if (resil_parse_marks(a->cmd, value, &a->resil)) return CLI_USAGE;
  /* the configuration holds the marks as parsed, so "0.85:0.7" and "0.850:0.70" are one run */
  snprintf(a->pressure_marks_text, sizeof a->pressure_marks_text, "%g:%g", a->resil.high_water, a->resil.low_water);
  a->pressure_marks = a->pressure_marks_text;
  return 0;
}

static int check_host_budget_schedule(struct run_args *a, const char *value) {
  return resil_parse_schedule(a->cmd, value, &a->resil) ? CLI_USAGE : 0;
}

static int check_reload_at(struct run_args *a, const char *value) {
  return resil_parse_reload_at(a->cmd, value, &a->resil) ? CLI_USAGE : 0;
}

static int check_repeat_group(struct run_args *a, const char *value) {
  if (!*value || strlen(value) > 200) return cli_usage_error(a->cmd, "--repeat-group: a tag of 1 to 200 characters");
  return 0;
}

static int check_format(struct run_args *a, const char *value) {
  return cli_parse_format(a->cmd, value, &a->output_format) ? CLI_USAGE : 0;
}

/* --- the table ------------------------------------------------------------------------------ */

static const struct run_option_info rows[RUN_OPT_COUNT + 1] = {
#define ROW_(field, name, type, metavar, modes, section, cfg, key, def, lo, hi, check, help, why) \
  {#field, name, TYPE_##type, metavar, modes, section, cfg, key, help, why},
    FERRY_RUN_OPTIONS(ROW_)
#undef ROW_
};

const struct run_option_info *run_option(enum run_opt id) { return (unsigned)id < RUN_OPT_COUNT ? &rows[id] : NULL; }

enum run_opt run_option_by_field(const char *field) {
  for (int i = 0; i < RUN_OPT_COUNT; i++)
    if (!strcmp(rows[i].field, field)) return (enum run_opt)i;
  return RUN_OPT_COUNT;
}

int run_given(const struct run_args *a, const char *name) {
  for (int i = 0; i < RUN_OPT_COUNT; i++)
    if (!strcmp(rows[i].name, name)) return a->given[i];
  return 0;
}

static void set_defaults(struct run_args *a) {
#define DEFAULT_(field, name, type, metavar, modes, section, cfg, key, def, ...) a->field = (RUN_CTYPE_##type)(def);
  FERRY_RUN_OPTIONS(DEFAULT_)
#undef DEFAULT_
  if (a->sim) a->executor = "sim";
}

/* Setters per value type; each prints its own error. */
static int set_FLAG(const char *opt, const char *value, int *dst, double lo, double hi) {
  *dst = 1;
  return 0;
}
#define set_FLAG01 set_FLAG
static int set_INT(const char *opt, const char *value, int64_t *dst, double lo, double hi) {
  return cli_parse_int(opt, value, (int64_t)lo, hi >= 9.2e18 ? INT64_MAX : (int64_t)hi, dst) ? CLI_USAGE : 0;
}
static int set_SIZE(const char *opt, const char *value, uint64_t *dst, double lo, double hi) {
  return cli_parse_size(opt, value, dst) ? CLI_USAGE : 0;
}
static int set_REAL(const char *opt, const char *value, double *dst, double lo, double hi) {
  return cli_parse_double(opt, value, lo, hi, dst) ? CLI_USAGE : 0;
}
static int set_TEXT(const char *opt, const char *value, const char **dst, double lo, double hi) {
  *dst = value;
  return 0;
}

typedef int (*check_fn)(struct run_args *a, const char *value);

static int set_value(struct run_args *a, enum run_opt id, const char *value) {
  int rc = 0;
  check_fn check = NULL;
  switch (id) {
#define SET_(field, name, type, metavar, modes, section, cfg, key, def, lo, hi, chk, ...) \
  case RUN_OPT_##field:                                                                  \
    rc = set_##type("--" name, value, &a->field, (double)(lo), (double)(hi));            \
    check = chk;                                                                         \
    break;
    FERRY_RUN_OPTIONS(SET_)
#undef SET_
    case RUN_OPT_COUNT: break;
  }
  if (!rc && check) rc = check(a, value);
  return rc;
}

/* --- usage ---------------------------------------------------------------------------------- */

/* --backend's help: the registry's executors that `ferry run` drives. Whether one can be opened
 * here is not asked: for cuda that loads CUDA's libraries (about 100 ms), and --help must stay
 * instant; choosing an executor that cannot open fails with the reason. */
static const char *backend_help(void) {
  static char text[2048];
  size_t n = (size_t)snprintf(text, sizeof text, "the executor (default host):");
  for (size_t i = 0; i < ferry_exec_registry_count() && n < sizeof text; i++) {
    const struct ferry_exec_info *x = ferry_exec_registry_at(i);
    if (x->caps & FERRY_EXEC_CAP_HW) continue;
    n += (size_t)snprintf(text + n, sizeof text - n, "\n  %s: %s", x->name, x->description);
  }
  return text;
}

/* --expert-cache's help: the registered eviction policies. */
static const char *cache_help(void) {
  static char text[1024];
  size_t n = (size_t)snprintf(text, sizeof text, "expert placement (default auto), or per-layer:K (K slots per\nlayer, "
                                                 "lru in each):");
  for (size_t i = 0; i < ferry_cache_policy_registry_count() && n < sizeof text; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, "\n  %s: %s", ferry_cache_policy_registry_at(i)->name,
                          ferry_cache_policy_registry_at(i)->description);
  return text;
}

/* --predictor's help: the registered predictors. */
static const char *predictor_help(void) {
  static char text[2048];
  size_t n = (size_t)snprintf(text, sizeof text, "expert prefetching, --prefetch-depth layers ahead:");
  for (size_t i = 0; i < ferry_predictor_registry_count() && n < sizeof text; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, "\n  %s: %s", ferry_predictor_registry_at(i)->name,
                          ferry_predictor_registry_at(i)->description);
  return text;
}

/* Help computed when printed (the table's help is NULL). */
static const char *dynamic_help(enum run_opt id) {
  switch (id) {
    case RUN_OPT_executor: return backend_help();
    case RUN_OPT_expert_cache: return cache_help();
    case RUN_OPT_predictor: return predictor_help();
    default: return "";
  }
}

static void print_option(FILE *f, const struct run_option_info *r, enum run_opt id) {
  char head[64];
  snprintf(head, sizeof head, "--%s%s%s", r->name, r->metavar[0] ? " " : "", r->metavar);
  const char *help = r->help ? r->help : dynamic_help(id);
  if (strlen(head) <= 22) fprintf(f, "  %-22s  ", head);
  else fprintf(f, "  %s\n%26s", head, ""); /* the help under it: lines stay within 100 columns */
  for (const char *p = help; *p; p++) {
    fputc(*p, f);
    if (*p == '\n') fprintf(f, "%26s", "");
  }
  fputc('\n', f);
}

void run_usage(FILE *f, const char *cmd) {
  const int sim = !strcmp(cmd, "sim"), mode = sim ? SIM_M : RUN_M;
  static const char *const heading[SEC_COUNT] = {"Model and workload", "Offload policy", "Executor", "Simulation",
                                                 "MoE routing", "Staying up (faults, memory pressure, reloads)",
                                                 "Output"};
  fprintf(f, "Usage: ferry %s --model %s (--trace FILE | --synthetic SPEC) [OPTIONS]\n%s\n", cmd, sim ? "NAME|DIR" : "DIR",
          sim ? "Simulate serving a trace on a hardware profile: the same engine as 'ferry run', on a\n"
                "discrete-event executor whose op durations come from the profile."
              : "Serve a request trace with weight offloading on a real executor and report latency,\n"
                "throughput, bytes moved and peak memory per tier.");
  for (int s = 0; s < SEC_COUNT; s++) {
    int shown = 0;
    for (int i = 0; i < RUN_OPT_COUNT; i++) {
      if (rows[i].section != (enum run_section)s || !(rows[i].modes & mode)) continue;
      if (!shown++) fprintf(f, "\n%s:\n", heading[s]);
      print_option(f, &rows[i], (enum run_opt)i);
    }
  }
  fprintf(f, "\nOptions are spelt out in full (no abbreviations); --name=VALUE also works.\n");
}

/* --- parsing -------------------------------------------------------------------------------- */

static int unknown_option(const char *cmd, const char *name, size_t len) {
  char word[128];
  snprintf(word, sizeof word, "%.*s", (int)len, name);
  const char *names[RUN_OPT_COUNT], *near[3];
  for (int i = 0; i < RUN_OPT_COUNT; i++) names[i] = rows[i].name;
  const size_t n = ferry__nearest_names(word, names, RUN_OPT_COUNT, 1, near, 3);
  if (!n) return cli_usage_error(cmd, "unknown option '--%s'", word);
  char list[256];
  return cli_usage_error(cmd, "unknown option '--%s'; did you mean %s?", word,
                         ferry__join_names(near, n, "--", list, sizeof list));
}

/* One option at argv[*i]; advances *i past its value. */
static int parse_one(struct run_args *a, int argc, char **argv, int *i) {
  const char *arg = argv[*i];
  if (!strcmp(arg, "-h")) arg = "--help";
  if (strncmp(arg, "--", 2) || !arg[2]) return cli_usage_error(a->cmd, "unexpected argument '%s'", arg);
  const char *name = arg + 2;
  const size_t len = strcspn(name, "=");
  int id = 0;
  while (id < RUN_OPT_COUNT && (strlen(rows[id].name) != len || strncmp(rows[id].name, name, len))) id++;
  if (id == RUN_OPT_COUNT) return unknown_option(a->cmd, name, len);
  const struct run_option_info *r = &rows[id];
  if (!(r->modes & (a->sim ? SIM_M : RUN_M)))
    return cli_usage_error(a->cmd, "--%s is for 'ferry %s'%s", r->name, a->sim ? "run" : "sim", r->why);
  const char *value = NULL;
  if (r->type == TYPE_FLAG || r->type == TYPE_FLAG01) {
    if (name[len] == '=') return cli_usage_error(a->cmd, "--%s takes no value", r->name);
  } else if (name[len] == '=') {
    value = name + len + 1;
  } else if (*i + 1 < argc) {
    value = argv[++*i];
  } else {
    return cli_usage_error(a->cmd, "--%s needs a value (%s)", r->name, r->metavar);
  }
  a->given[id] = 1;
  if (id == RUN_OPT_help) {
    run_usage(stdout, a->cmd);
    return -1;
  }
  return set_value(a, (enum run_opt)id, value);
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
static int refuse_ignored(const struct run_args *a) {
  const char *cmd = a->cmd, *o;
  const int sim = a->sim;
  if (a->synthetic && RUN_GIVEN(a, trace_format))
    return cli_usage_error(cmd, "--trace-format applies to --trace files, not to --synthetic");
  if (a->as_fast_as_possible && (o = first_given(a, (const char *const[]){"time-scale", "rate-scale", NULL})))
    return cli_usage_error(cmd, "--%s changes arrival times, which --as-fast-as-possible ignores", o);
  if (a->plan_only &&
      (o = first_given(a, (const char *const[]){"db", "dump-logits", "record-routing", "record-features", "profile",
                                                 "greedy", "allow-nonfinite", "routing", "routing-synth",
                                                 "predictor-model", "host-memory", "kv-host-memory",
                                                 "keep-cache", "repeat", "repeat-group", "format", "faults",
                                                 "io-retries", "verify-reads", "host-budget-schedule", "reload-at",
                                                 "reload-from", "control-socket", NULL})))
    return cli_usage_error(cmd, "--%s does nothing with --plan-only (nothing runs)", o);
  /* --sensitivity runs the simulation once per figure and reports how the summary moves: nothing
   * of those runs is kept, and a plan runs nothing */
  if (a->sensitivity > 0 &&
      (o = first_given(a, (const char *const[]){"plan-only", "db", "repeat", "repeat-group", "record-routing",
                                                 "record-features", "profile", NULL})))
    return cli_usage_error(cmd, "--%s does not go with --sensitivity (its runs are compared, not kept)", o);
  if (RUN_GIVEN(a, jobs) && !(a->sensitivity > 0))
    return cli_usage_error(cmd, "--jobs runs --sensitivity's simulations in parallel: give --sensitivity PCT");
  /* the experts the static placement pins from its counts fill the expert cache, which with every
   * routed expert on the CPU exists only for them: the plan reads the trace as the run does */
  if (a->plan_only && a->predictor_routing && strcmp(a->expert_cache, "static"))
    return cli_usage_error(cmd, "--predictor-routing does nothing with --plan-only (nothing runs) unless "
                                "--expert-cache static pins from it");
  /* (--runtime does: the plan charges the workspace at the precision the runtime holds it in) */
  /* every token attends on the device, prompts included */
  if (a->kv_host_memory && strcmp(a->kv_home, "host") && strcmp(a->kv_home, "layer"))
    return cli_usage_error(cmd, "--kv-host-memory is the memory of a KV cache in host memory: it needs --kv-home host "
                                "or layer");
  if (!strcmp(a->kv_attention, "device") && RUN_GIVEN(a, kv_prefill) && strcmp(a->kv_prefill, "device"))
    return cli_usage_error(cmd, "--kv-attention device attends prompts on the device too; --kv-prefill %s contradicts it",
                           a->kv_prefill);
  if (a->disk_dir && strcmp(a->kv_home, "disk"))
    return cli_usage_error(cmd, "--disk-dir is where --kv-home disk keeps its KV cache's file: nothing else uses it");
  if (a->keep_cache && a->direct_io)
    return cli_usage_error(cmd, "--keep-cache does nothing with --direct-io: O_DIRECT reads bypass the page cache");
  if (a->keep_cache && a->drop_cache) return cli_usage_error(cmd, "give either --drop-cache or --keep-cache, not both");
  if (!sim && strcmp(a->executor, "host") && RUN_GIVEN(a, threads))
    return cli_usage_error(cmd, "--threads sets the host executor's BLAS threads; --backend %s does not use them",
                           a->executor);
  if (RUN_GIVEN(a, max_step_tokens) && a->max_step_tokens < a->max_batch)
    return cli_usage_error(cmd, "--max-step-tokens %lld is below the %lld sequences of a batch (--max-batch): each decodes "
                                "one token per step",
                           (long long)a->max_step_tokens, (long long)a->max_batch);
  /* what the predictor reads, from its registry entry */
  const struct ferry_predictor_ops *pr = a->predictor ? ferry_predictor_registry_find(a->predictor) : NULL;
  const unsigned needs = pr ? pr->needs : 0;
  const char *p = a->predictor;
  if (a->predictor_model && !(needs & FERRY_PREDICT_NEEDS_WEIGHTS))
    return cli_usage_error(cmd, "--predictor-model is read by --predictor mlp3 or mlp7 only (predictors of weights)");
  /* --expert-cache static pins the experts a routing trace routes most (with a predictor that
   * reads no trace, or none) */
  const int static_cache = !strcmp(a->expert_cache, "static");
  const unsigned any_trace = FERRY_PREDICT_USES_POPULARITY | FERRY_PREDICT_NEEDS_FUTURE | FERRY_PREDICT_NEEDS_LOOKAHEAD |
                             FERRY_PREDICT_NEEDS_FEATURES;
  if (a->predictor_routing && !(static_cache && !(needs & any_trace))) {
    const unsigned reads_trace = FERRY_PREDICT_USES_POPULARITY | FERRY_PREDICT_NEEDS_FUTURE |
                                 (sim ? FERRY_PREDICT_NEEDS_LOOKAHEAD | FERRY_PREDICT_NEEDS_FEATURES : 0);
    const unsigned activations = FERRY_PREDICT_NEEDS_LOOKAHEAD | FERRY_PREDICT_NEEDS_FEATURES;
    if (!(needs & reads_trace) && !(!sim && (needs & activations)))
      return cli_usage_error(cmd, "--predictor-routing is read by --expert-cache static and --predictor frequency, "
                                  "oracle%s only",
                             sim ? ", gate-lookahead, mlp3 and mlp7" : "");
    if (!sim && (needs & activations) && !(needs & (FERRY_PREDICT_USES_POPULARITY | FERRY_PREDICT_NEEDS_FUTURE)))
      return cli_usage_error(cmd, "--predictor-routing: a real run's %s predictor reads its own activations, not a trace", p);
    if (sim && (needs & FERRY_PREDICT_NEEDS_FUTURE) && !(needs & (reads_trace & ~FERRY_PREDICT_NEEDS_FUTURE)))
      return cli_usage_error(cmd, "--predictor-routing: in 'ferry sim' the %s knows the routing being "
                                  "simulated (replay a recorded one with --routing)",
                             p);
  }
  if (a->record_features && !a->record_routing)
    return cli_usage_error(cmd, "--record-features %s: the features go into --record-routing FILE: give one",
                           a->record_features);
  if ((needs & FERRY_PREDICT_NO_REUSE) && RUN_GIVEN(a, expert_cache))
    return cli_usage_error(cmd, "--expert-cache does nothing with --predictor none (no expert is reused)");
  return 0;
}

/* --gpus and --parallel go together, on an executor that drives several devices. */
static int refuse_parallel(const struct run_args *a) {
  if (a->gpus > 1 && !RUN_GIVEN(a, parallel))
    return cli_usage_error(a->cmd, "--gpus %lld: say how to split the model (--parallel tp, pp or ep)", (long long)a->gpus);
  if (a->gpus < 2 && RUN_GIVEN(a, parallel))
    return cli_usage_error(a->cmd, "--parallel %s splits the model over --gpus N (N > 1)", a->parallel);
  if (a->replicas > 1 && !a->sim && strcmp(a->executor, "host"))
    return cli_usage_error(a->cmd, "--replicas %lld: the %s executor drives one device, which replicas would share "
                                   "(the host executor runs them, each in its own arena; ferry sim prices them)",
                           (long long)a->replicas, a->executor);
  if (a->zero_gpus > 1 && a->gpus > 1)
    return cli_usage_error(a->cmd, "--zero-gpus %lld: the run is one rank on one device; not with --gpus %lld",
                           (long long)a->zero_gpus, (long long)a->gpus);
  if (RUN_GIVEN(a, router) && a->replicas < 2)
    return cli_usage_error(a->cmd, "--router %s routes requests over --replicas R (R > 1)", a->router);
  if (RUN_GIVEN(a, expert_placement) && strcmp(a->parallel, "ep"))
    return cli_usage_error(a->cmd, "--expert-placement places experts of --parallel ep: give it");
  if (a->gpus > 1 && !a->sim && strcmp(a->executor, "host"))
    return cli_usage_error(a->cmd, "--gpus %lld: the %s executor drives one device (the host executor emulates "
                                   "several; ferry sim prices them)",
                           (long long)a->gpus, a->executor);
  return 0;
}

/* What the options mean for the engine and the trace reader. */
static void apply(struct run_args *a) {
  struct ferry_engine_config *ec = &a->ec;
  ec->block_layers = (int32_t)a->block_layers;
  ec->prefetch_depth = (int32_t)a->prefetch_depth;
  ec->block_slots = (int32_t)a->block_slots;
  ec->pin_first = (int32_t)a->pin_first;
  ec->pin_last = (int32_t)a->pin_last;
  ec->resident_attention = !strcmp(a->resident, "attention");
  ec->resident_all = !strcmp(a->resident, "all");
  ec->fill_budget = a->fill_budget;
  ec->home_disk = !strcmp(a->home, "disk");
  ec->stream_embeddings = a->stream_embeddings;
  ec->expert_granularity_layer = !strcmp(a->expert_granularity, "layer");
  /* per-layer:K names no policy (lru in each layer, the engine's choice); a layer's experts in its
   * block have no expert cache: only a policy the user named reaches the engine, which refuses it */
  ec->expert_cache = ec->expert_cache_per_layer || (ec->expert_granularity_layer && !RUN_GIVEN(a, expert_cache))
                         ? NULL
                         : a->expert_cache;
  /* the cache on disk is the host cache's home: the CPU attends over its rows read into memory */
  ec->kv_home_disk = !strcmp(a->kv_home, "disk");
  ec->kv_home_host = ec->kv_home_disk || !strcmp(a->kv_home, "host");
  ec->kv_home_layer = !strcmp(a->kv_home, "layer");
  ec->kv_host_memory = !a->kv_host_memory                    ? FERRY_HOST_MEMORY_DEFAULT
                       : !strcmp(a->kv_host_memory, "pinned") ? FERRY_HOST_MEMORY_PINNED
                                                              : FERRY_HOST_MEMORY_PAGEABLE;
  ec->kv_prefill_device = !strcmp(a->kv_prefill, "device");
  ec->kv_attention_device = !strcmp(a->kv_attention, "device");
  ec->prefill_first = !strcmp(a->schedule, "prefill-first");
  ec->kv_block_tokens = (int32_t)a->kv_block_tokens;
  ec->kv_preempt_swap = !strcmp(a->kv_preempt, "swap");
  ec->kv_pool_bytes = a->kv_pool;
  ec->kv_swap_bytes = a->kv_swap;
  ec->gpu_batches = (int32_t)a->gpu_batches;
  ec->n_devices = (int32_t)a->gpus;
  ec->zero_gpus = (int32_t)a->zero_gpus;
  ec->expert_placement_hash = !strcmp(a->expert_placement, "hash");
  ec->parallel = !strcmp(a->parallel, "tp")   ? FERRY_PARALLEL_TP
                 : !strcmp(a->parallel, "pp") ? FERRY_PARALLEL_PP
                 : !strcmp(a->parallel, "ep") ? FERRY_PARALLEL_EP
                                              : FERRY_PARALLEL_NONE;
  ec->device_budget_bytes = a->device_budget;
  ec->host_budget_bytes = a->host_budget;
  ec->max_batch = (int32_t)a->max_batch;
  ec->max_step_tokens = (int32_t)a->max_step_tokens;
  ec->max_seq_tokens = (int32_t)a->max_seq_tokens;
  /* A "disk" read should come from the disk: drop cached pages unless O_DIRECT bypasses them. */
  ec->read_flags = (a->direct_io ? FERRY_READ_DIRECT : 0u) |
                   (a->drop_cache || (!a->direct_io && !a->keep_cache) ? FERRY_READ_DROP_CACHE : 0u);
  ec->seed = (uint64_t)a->seed;
  ec->greedy = a->greedy;
  ec->allow_nonfinite = a->allow_nonfinite;
  a->trace_opts.max_requests = a->max_requests;
  a->trace_opts.rate_scale = a->rate_scale;
  a->trace_opts.skip_bad = a->skip_bad;
  a->progress = !a->quiet;
  /* staying up: the marks, an OS watch and a budget schedule each need pressure control, which
   * the configuration then holds */
  a->pressure = a->pressure || a->pressure_marks || a->pressure_os || a->resil.n_schedule;
  struct resil_opts *r = &a->resil;
  r->faults = a->faults;
  r->io_retries = a->io_retries;
  r->verify_reads = a->verify_reads;
  r->pressure = a->pressure;
  r->pressure_os = a->pressure_os;
  r->host_schedule = a->host_budget_schedule;
  r->reload_at_text = a->reload_at;
  r->reload_from = a->reload_from;
  r->control_socket = a->control_socket;
}

int run_parse(int argc, char **argv, const char *cmd, struct run_args *a) {
  memset(a, 0, sizeof *a);
  a->cmd = cmd;
  a->sim = !strcmp(cmd, "sim");
  set_defaults(a);
  for (int i = 1; i < argc; i++) {
    const int rc = parse_one(a, argc, argv, &i);
    if (rc) return rc;
  }
  if (!a->model) return cli_usage_error(cmd, "missing --model");
  if (!a->plan_only && !a->trace && !a->synthetic) return cli_usage_error(cmd, "missing --trace FILE or --synthetic SPEC");
  if (a->trace && a->synthetic) return cli_usage_error(cmd, "give either --trace or --synthetic, not both");
  if (a->sim && !a->hw && !a->plan_only) return cli_usage_error(cmd, "missing --hw PROFILE (see ferry hw list)");
  if (a->profile && !a->db) return cli_usage_error(cmd, "--profile writes the GPU timeline to --db FILE: give one");
  if (a->repeat_group && !a->db) return cli_usage_error(cmd, "--repeat-group tags runs in --db FILE: give one");
  if (a->repeat > 1 && (a->dump_logits || a->record_routing))
    return cli_usage_error(cmd, "--repeat %d would write --%s %d times over: repeat without it", (int)a->repeat,
                           a->dump_logits ? "dump-logits" : "record-routing", (int)a->repeat);
  const struct ferry_exec_info *x = ferry_exec_registry_find(a->executor);
  if (a->profile && !(x && (x->caps & FERRY_EXEC_CAP_PROFILE)))
    return cli_usage_error(cmd, "--profile traces the GPU with CUPTI: the %s executor has nothing to trace (use --backend "
                                "cuda)",
                           a->executor);
  int refused = refuse_ignored(a);
  if (!refused) refused = refuse_parallel(a);
  if (refused) return refused;
  apply(a);
  const struct ferry_path_use paths[] = {
      {"--db", a->db, FERRY_PATH_OUT | FERRY_PATH_SQLITE}, {"--record-routing", a->record_routing, FERRY_PATH_OUT},
      {"--dump-logits", a->dump_logits, FERRY_PATH_OUT},   {"--model", a->model, FERRY_PATH_DIR},
      {"--trace", a->trace, 0},                            {"--routing", a->routing, 0},
      {"--predictor-routing", a->predictor_routing, 0},    {"--predictor-model", a->predictor_model, 0},
      {"--hw", a->hw, 0},                                  {"--runtime", a->runtime, 0},
      {"--reload-from", a->reload_from, FERRY_PATH_DIR},   {"--control-socket", a->control_socket, FERRY_PATH_OUT},
      {"--disk-dir", a->disk_dir, FERRY_PATH_DIR}};
  if (cli_check_paths(cmd, paths, sizeof paths / sizeof paths[0])) return CLI_USAGE;
  return 0;
}
