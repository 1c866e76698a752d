/* `ferry trace routing [stats]`: statistics of a routing trace (load balance, consecutive-token
 * repetition, cross-layer predictability, co-activation, gate weights, reuse distance), as text
 * or JSON, and generation of synthetic routing traces from the seeded model of routing.h. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/alloc.h"
#include "ferry/routing.h"

static const char *const routing_usage =
    "Usage: ferry trace routing [stats] FILE [--json] [--experts E] [--layers L]\n"
    "       ferry trace routing [stats] --synth SPEC [--requests N] [--tokens T] [--json | --out OUT.jsonl]\n"
    "Statistics of a routing trace (JSONL rows {\"req_id\", \"token_idx\", \"layer\", \"topk_ids\",\n"
    "\"topk_weights\"} with optional \"features\"), per layer and overall: expert load (busiest\n"
    "expert's share, coefficient of variation, entropy / log E), the rate at which consecutive\n"
    "tokens repeat the first choice and any choice (with the uniform-random and unrelated-token\n"
    "baselines), how well layer l's first choice predicts layer l+1's, expert co-activation, the\n"
    "spread of the gate weights, and reuse distance (docs/predictors.md defines each figure).\n\n"
    "Options:\n"
    "  --json          print the statistics as one JSON document\n"
    "  --experts E     experts per layer (ids must be below E; default: largest id + 1)\n"
    "  --layers L      layers (default: largest layer + 1)\n"
    "  --synth SPEC    generate a synthetic trace instead of reading one; SPEC is comma-separated\n"
    "                  key=value: profile=NAME (mixtral, olmoe, deepseek, uniform: statistics\n"
    "                  calibrated to published routing analyses, tests/data/routing/targets.json;\n"
    "                  shape defaults to the profile's model), layers=L, experts=E, k=K, zipf=S\n"
    "                  (popularity skew, 0 = uniform), temporal=P (re-use the previous token's\n"
    "                  set), layer=P (repeat the previous layer's set), seed=N. Without a profile:\n"
    "                  layers=8,experts=32,k=2,zipf=1,temporal=0.3,layer=0.3,seed=1\n"
    "  --requests N    (synth) requests (default 8)\n"
    "  --tokens T      (synth) tokens per request (default 256)\n"
    "  --out FILE      (synth) write the trace there ('-' for standard output) instead of\n"
    "                  printing its statistics\n";

static void print_num(double v) {
  if (isnan(v)) printf(" %6s", "-");
  else printf(" %6.3f", v);
}

static void print_stats(const char *name, const ferry_routing *r, const struct ferry_routing_stats *s) {
  int32_t L = ferry_routing_n_layers(r), E = ferry_routing_n_experts(r), K = ferry_routing_top_k(r);
  printf("routing        %s\n", name);
  printf("shape          %d layers, %d experts, top-%d, %zu requests, %" PRId64 " rows, %d features\n", L, E, K,
         ferry_routing_n_requests(r), ferry_routing_n_rows(r), ferry_routing_n_features(r));
  printf("load           busiest expert %.3f of uses (uniform %.3f), CV %.3f, top-25%% %.3f, entropy %.3f of log E\n",
         s->busiest_share, 1.0 / E, s->load_cv, s->top25_share, s->entropy_norm);
  printf("token t-1->t   first choice repeated %.3f (uniform random %.3f), any choice %.3f (%.3f); "
         "identical sets %.3f\n",
         s->first_repeat, s->first_repeat_uniform, s->any_repeat, s->any_repeat_uniform, s->prev_token_same);
  printf("layer l->l+1   first choice predicted %.3f (busiest alone %.3f), set recall %.3f (busiest k %.3f); "
         "same ids %.3f of k\n",
         s->next_first_acc, s->next_first_base, s->next_set_recall, s->next_set_base, s->next_overlap);
  printf("co-activation  max N(i,j)/N(i) %.3f (uniform random %.3f)\n", s->coact_max,
         E > 1 ? (double)(K - 1) / (E - 1) : 0.0);
  printf("gate weights   top-1 share mean %.3f, smallest share mean %.3f (equal weights: %.3f)\n\n",
         s->gate_top1_mean, s->gate_last_mean, 1.0 / K);
  printf("%5s %6s %6s %6s %6s %6s %6s %6s %6s %6s %6s %6s %6s %6s  %s\n", "layer", "busy", "cv", "entr", "rep1",
         "rep1ix", "repany", "repaix", "nxt1", "nxt1b", "nxtset", "coact", "spec", "gate1", "top experts (share)");
  for (int32_t l = 0; l < L; l++) {
    const struct ferry_routing_layer_stats *ls = &s->layers[l];
    printf("%5d", l);
    const double v[] = {ls->busiest_share,  ls->load_cv,        ls->entropy_norm,   ls->first_repeat,
                        ls->first_repeat_indep, ls->any_repeat, ls->any_repeat_indep, ls->next_first_acc,
                        ls->next_first_base, ls->next_set_recall, ls->coact_max,     ls->request_spec_max,
                        ls->gate_top1_mean};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) print_num(v[i]);
    printf(" ");
    for (int j = 0; j < 4 && ls->top_ids[j] >= 0; j++) printf(" %d (%.3f)", ls->top_ids[j], ls->top_share[j]);
    printf("\n");
  }
  printf("(busy: busiest expert's share; rep1/repany: consecutive tokens repeating the first / any choice,\n"
         " ix: the same for unrelated tokens; nxt1: layer l+1's first choice predicted from layer l's,\n"
         " nxt1b: by the busiest expert alone; nxtset: recall of layer l+1's set; coact: largest\n"
         " co-activation; spec: largest share of one request's tokens on one expert; gate1: top-1 share)\n");
  int64_t total = s->first_uses;
  for (int b = 0; b < FERRY_ROUTING_REUSE_BUCKETS; b++) total += s->reuse_hist[b];
  printf("\nreuse distance (tokens between uses of an expert at one layer of one request)\n");
  for (int b = 0; b < FERRY_ROUTING_REUSE_BUCKETS; b++) {
    int64_t lo = ferry_routing_reuse_bucket_lo(b);
    char label[32];
    if (b == FERRY_ROUTING_REUSE_BUCKETS - 1) snprintf(label, sizeof label, ">%" PRId64, lo - 1);
    else if (ferry_routing_reuse_bucket_lo(b + 1) - 1 == lo) snprintf(label, sizeof label, "%" PRId64, lo);
    else snprintf(label, sizeof label, "%" PRId64 "-%" PRId64, lo, ferry_routing_reuse_bucket_lo(b + 1) - 1);
    printf("  %-10s %10" PRId64 " %6.1f%%\n", label, s->reuse_hist[b], total ? 100.0 * s->reuse_hist[b] / total : 0);
  }
  printf("  %-10s %10" PRId64 " %6.1f%%\n", "first use", s->first_uses, total ? 100.0 * s->first_uses / total : 0);
  printf("  mean %.2f, median %" PRId64 " tokens\n", s->reuse_mean, s->reuse_p50);
}

/* Compute and print (text or JSON) the statistics of r. */
static int report(const char *name, const ferry_routing *r, int json) {
  struct ferry_routing_stats stats;
  ferry_status st = ferry_routing_stats_compute(r, &stats);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  int rc = CLI_OK;
  if (json) {
    char *text = NULL;
    if ((st = ferry_routing_stats_json(r, &stats, name, &text)) != FERRY_OK) rc = cli_fail(st, NULL);
    else printf("%s\n", text);
    ferry_free(text);
  } else {
    print_stats(name, r, &stats);
  }
  ferry_routing_stats_free(&stats);
  return rc;
}

static int synth(const char *spec, int64_t requests, int64_t tokens, const char *out, int json) {
  struct ferry_routing_synth_config cfg = {
      .n_layers = 8, .n_experts = 32, .top_k = 2, .seed = 1, .zipf = 1, .temporal = 0.3, .layer_corr = 0.3};
  ferry_status st = ferry_routing_synth_parse(spec, &cfg);
  if (st != FERRY_OK) return cli_usage_error("trace routing", "--synth: %s", ferry_last_error());
  if (cfg.profile[0]) { /* the profile's model shape unless the spec gives one: parse again over it */
    ferry_routing_profile_shape(cfg.profile, &cfg.n_layers, &cfg.n_experts, &cfg.top_k);
    if ((st = ferry_routing_synth_parse(spec, &cfg)) != FERRY_OK) return cli_fail(st, NULL);
  }
  ferry_routing_synth *s;
  if ((st = ferry_routing_synth_create(&s, &cfg)) != FERRY_OK) return cli_fail(st, NULL);
  ferry_routing *r;
  st = ferry_routing_synth_trace(s, requests, (int32_t)tokens, &r);
  ferry_routing_synth_free(s);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  int rc = CLI_OK;
  if (out) {
    if ((st = ferry_routing_write_jsonl(r, out)) != FERRY_OK) rc = cli_fail(st, NULL);
    else if (strcmp(out, "-"))
      fprintf(stderr, "ferry: wrote %" PRId64 " routing rows to %s\n", ferry_routing_n_rows(r), out);
  } else {
    rc = report("synthetic", r, json);
  }
  ferry_routing_free(r);
  return rc;
}

int cmd_trace_routing(int argc, char **argv) {
  const char *file = NULL, *spec = NULL, *out = NULL;
  int64_t requests = 8, tokens = 256, experts = 0, layers = 0;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(routing_usage, stdout);
      return CLI_OK;
    }
    if (!strcmp(a, "--json")) {
      json = 1;
      continue;
    }
    if (i == 1 && !strcmp(a, "stats")) continue; /* `ferry trace routing stats FILE` = `... routing FILE` */
    int has_value = i + 1 < argc;
    if (!strcmp(a, "--synth") || !strcmp(a, "--out") || !strcmp(a, "--requests") || !strcmp(a, "--tokens") ||
        !strcmp(a, "--experts") || !strcmp(a, "--layers")) {
      if (!has_value) return cli_usage_error("trace routing", "option '%s' needs a value", a);
      const char *v = argv[++i];
      if (!strcmp(a, "--synth")) spec = v;
      else if (!strcmp(a, "--out")) out = v;
      else if (!strcmp(a, "--requests") && cli_parse_int(a, v, 1, 1 << 20, &requests)) return CLI_USAGE;
      else if (!strcmp(a, "--tokens") && cli_parse_int(a, v, 1, FERRY_ROUTING_MAX_TOKEN_IDX, &tokens)) return CLI_USAGE;
      else if (!strcmp(a, "--experts") && cli_parse_int(a, v, 1, FERRY_ROUTING_MAX_EXPERTS, &experts)) return CLI_USAGE;
      else if (!strcmp(a, "--layers") && cli_parse_int(a, v, 1, FERRY_ROUTING_MAX_LAYERS, &layers)) return CLI_USAGE;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("trace routing", "unknown option '%s'", a);
    } else if (!file) {
      file = a;
    } else {
      return cli_usage_error("trace routing", "unexpected argument '%s'", a);
    }
  }
  if (spec && file) return cli_usage_error("trace routing", "give either FILE or --synth, not both");
  if (json && out) return cli_usage_error("trace routing", "give --json or --out, not both");
  if (spec) return synth(spec, requests, tokens, out, json);
  if (!file) return cli_usage_error("trace routing", "missing FILE");
  if (out) return cli_usage_error("trace routing", "--out is only for --synth");
  struct ferry_routing_options o = {.n_experts = (int32_t)experts, .n_layers = (int32_t)layers};
  ferry_routing *r;
  ferry_status st = ferry_routing_open(&r, file, &o);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  int rc = report(file, r, json);
  ferry_routing_free(r);
  return rc;
}
