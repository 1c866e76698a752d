/* `ferry trace routing`: statistics of a routing trace (expert popularity per layer, reuse
 * distance, agreement of adjacent layers and tokens), and generation of synthetic routing
 * traces from the seeded model of routing.h. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "ferry/routing.h"

static const char *const routing_usage =
    "Usage: ferry trace routing FILE [--experts E] [--layers L]\n"
    "       ferry trace routing --synth SPEC [--requests N] [--tokens T] [--out OUT.jsonl]\n"
    "Statistics of a routing trace (JSONL rows {\"req_id\", \"token_idx\", \"layer\", \"topk_ids\",\n"
    "\"topk_weights\"} with optional \"features\"): expert popularity per layer (top experts, share\n"
    "of the most used 25%, entropy / log E), reuse distance (tokens between consecutive uses of an\n"
    "expert at one layer in one request), and how well layer l's choice predicts layer l+1's.\n\n"
    "Options:\n"
    "  --experts E     experts per layer (ids must be below E; default: largest id + 1)\n"
    "  --layers L      layers (default: largest layer + 1)\n"
    "  --synth SPEC    generate a synthetic trace instead of reading one; SPEC is comma-separated\n"
    "                  key=value: layers=L, experts=E, k=K, zipf=S (popularity skew, 0 = uniform),\n"
    "                  temporal=P (re-use the previous token's set), layer=P (repeat the previous\n"
    "                  layer's set), seed=N. Default: layers=8,experts=32,k=2,zipf=1,temporal=0.3,\n"
    "                  layer=0.3,seed=1\n"
    "  --requests N    (synth) requests (default 8)\n"
    "  --tokens T      (synth) tokens per request (default 256)\n"
    "  --out FILE      (synth) write the trace there ('-' for standard output) instead of\n"
    "                  printing its statistics\n";

static void print_stats(const char *name, const ferry_routing *r, const struct ferry_routing_stats *s) {
  int32_t L = ferry_routing_n_layers(r), E = ferry_routing_n_experts(r), K = ferry_routing_top_k(r);
  printf("routing        %s\n", name);
  printf("shape          %d layers, %d experts, top-%d, %zu requests, %" PRId64 " rows, %d features\n", L, E, K,
         ferry_routing_n_requests(r), ferry_routing_n_rows(r), ferry_routing_n_features(r));
  printf("popularity     top-25%% experts take %.3f of uses (uniform: %.3f); entropy %.3f of log E\n",
         s->top25_share, (double)((E + 3) / 4) / E, s->entropy_norm);
  printf("layer l->l+1   mean overlap %.3f of k, identical sets %.3f (uniform random: %.3f)\n", s->next_overlap,
         s->next_same, (double)K / E);
  printf("token t-1->t   identical sets %.3f (same layer)\n\n", s->prev_token_same);
  printf("%5s %10s %6s %7s %8s %8s %8s  %s\n", "layer", "uses", "top25", "entropy", "next-ovl", "next-eq", "prev-eq",
         "top experts (share)");
  for (int32_t l = 0; l < L; l++) {
    const struct ferry_routing_layer_stats *ls = &s->layers[l];
    printf("%5d %10" PRId64 " %6.3f %7.3f", l, ls->uses, ls->top25_share, ls->entropy_norm);
    if (isnan(ls->next_overlap)) printf(" %8s %8s", "-", "-");
    else printf(" %8.3f %8.3f", ls->next_overlap, ls->next_same);
    if (isnan(ls->prev_token_same)) printf(" %8s ", "-");
    else printf(" %8.3f ", ls->prev_token_same);
    for (int j = 0; j < 4 && ls->top_ids[j] >= 0; j++) printf(" %d (%.3f)", ls->top_ids[j], ls->top_share[j]);
    printf("\n");
  }
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

static int synth(const char *spec, int64_t requests, int64_t tokens, const char *out) {
  struct ferry_routing_synth_config cfg = {
      .n_layers = 8, .n_experts = 32, .top_k = 2, .seed = 1, .zipf = 1, .temporal = 0.3, .layer_corr = 0.3};
  ferry_status st = ferry_routing_synth_parse(spec, &cfg);
  if (st != FERRY_OK) return cli_usage_error("trace routing", "--synth: %s", ferry_last_error());
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
    struct ferry_routing_stats stats;
    if ((st = ferry_routing_stats_compute(r, &stats)) != FERRY_OK) {
      rc = cli_fail(st, NULL);
    } else {
      print_stats("synthetic", r, &stats);
      ferry_routing_stats_free(&stats);
    }
  }
  ferry_routing_free(r);
  return rc;
}

int cmd_trace_routing(int argc, char **argv) {
  const char *file = NULL, *spec = NULL, *out = NULL;
  int64_t requests = 8, tokens = 256, experts = 0, layers = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(routing_usage, stdout);
      return CLI_OK;
    }
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
  if (spec) return synth(spec, requests, tokens, out);
  if (!file) return cli_usage_error("trace routing", "missing FILE");
  if (out) return cli_usage_error("trace routing", "--out is only for --synth");
  struct ferry_routing_options o = {.n_experts = (int32_t)experts, .n_layers = (int32_t)layers};
  ferry_routing *r;
  ferry_status st = ferry_routing_open(&r, file, &o);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  struct ferry_routing_stats s;
  st = ferry_routing_stats_compute(r, &s);
  if (st != FERRY_OK) {
    ferry_routing_free(r);
    return cli_fail(st, NULL);
  }
  print_stats(file, r, &s);
  ferry_routing_stats_free(&s);
  ferry_routing_free(r);
  return CLI_OK;
}
