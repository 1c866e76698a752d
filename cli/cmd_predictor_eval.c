/* `ferry predictor eval`: replay a routing trace through an expert cache with one or more
 * predictors prefetching, and print recall, precision, stall and waste with 95% bootstrap
 * confidence intervals over the requests; with several predictors, a table that marks those
 * whose stall differs by less than the noise (paired bootstrap) as tied. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "ferry/prefetch.h"
#include "cli/predictor_cli.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/units.h"

/* What every variant's evaluation shares: the traces and the evaluator's configuration. */
struct eval_setup {
  const struct predictor_args *a;
  ferry_routing *r, *tr;
  const ferry_routing *train_src;
  struct ferry_predict_eval_request *reqs;
  size_t n;
  int32_t L, E, K;
  struct ferry_predict_eval_config ec;
};

struct eval_run {
  const struct ferry_predictor_ops *ops;
  char origin[96]; /* where MLP weights came from ("" for other variants) */
  enum ferry_dtype dtype;
  struct ferry_predict_eval_result res;
  struct ferry_predict_ci ci[FERRY_PREDICT_METRICS];
};

static int setup_open(const struct predictor_args *a, struct eval_setup *s) {
  memset(s, 0, sizeof *s);
  s->a = a;
  ferry_status st = predictor_open_trace(a->routing, a, &s->r);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  s->L = ferry_routing_n_layers(s->r);
  s->E = ferry_routing_n_experts(s->r);
  s->K = ferry_routing_top_k(s->r);
  if (a->depth >= s->L && s->L > 1)
    return cli_usage_error("predictor eval", "--prefetch-depth %" PRId64 " must be below the %d layers", a->depth, s->L);
  if (a->model && a->n_variants > 1)
    return cli_usage_error("predictor eval", "--model gives the weights of one MLP: evaluate one variant with it");
  s->train_src = s->r;
  if (a->train_routing) {
    struct predictor_args ta = *a;
    ta.experts = s->E;
    ta.layers = s->L;
    if ((st = predictor_open_trace(a->train_routing, &ta, &s->tr)) != FERRY_OK) return cli_fail(st, NULL);
    if (ferry_routing_top_k(s->tr) != s->K)
      return cli_fail(FERRY_ERR_FORMAT, "%s: top-%d, the evaluated trace has top-%d", a->train_routing,
                      ferry_routing_top_k(s->tr), s->K);
    s->train_src = s->tr;
  }
  s->n = ferry_routing_n_requests(s->r);
  s->reqs = ferry__calloc(s->n ? s->n : 1, sizeof *s->reqs);
  if (!s->reqs) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < s->n; i++) {
    struct ferry_routing_request q;
    ferry_routing_request_at(s->r, i, &q);
    s->reqs[i] = (struct ferry_predict_eval_request){.n_tokens = q.n_tokens, .ids = q.ids, .weights = q.weights,
                                                     .features = q.features, .has_features = q.has_features,
                                                     .lookahead = q.lookahead,
                                                     .lookahead_max = FERRY_ROUTING_MAX_LOOKAHEAD};
  }
  int64_t slots = a->cache_slots;
  if (!slots) {
    slots = 2 * (int64_t)s->K * (a->depth + 1);
    if (slots < 4 * s->K) slots = 4 * s->K;
  }
  s->ec = (struct ferry_predict_eval_config){.n_layers = s->L, .n_experts = s->E, .top_k = s->K,
                                             .n_features = ferry_routing_n_features(s->r),
                                             .cache_slots = (int32_t)slots, .prefetch_depth = (int32_t)a->depth,
                                             .prefetch_max = (int32_t)a->pf_max, .expert_bytes = a->expert_bytes,
                                             .lfu = a->lfu, .cache_policy = a->cache_policy};
  return CLI_OK;
}

static void setup_free(struct eval_setup *s) {
  ferry_free(s->reqs);
  ferry_routing_free(s->tr);
  ferry_routing_free(s->r);
}

/* Build the predictor of one variant and replay the trace through it. */
static int evaluate(const struct eval_setup *s, const struct ferry_predictor_ops *ops, struct eval_run *run) {
  const struct predictor_args *a = s->a;
  memset(run, 0, sizeof *run);
  run->ops = ops;
  run->dtype = a->dtype;
  struct ferry_mlp m = {0};
  /* weights: the built-in MLPs read them from a file or train them here */
  enum ferry_predictor_kind kind = FERRY_PREDICTOR_NONE;
  const int has_mlp = (ops->needs & FERRY_PREDICT_NEEDS_WEIGHTS) && ferry_predictor_kind_parse(ops->name, &kind) == FERRY_OK;
  ferry_status st = FERRY_OK;
  if (has_mlp && a->model) {
    enum ferry_dtype fdt;
    if (cli_predictor_load_mlp(a->model, kind, s->L, s->E, &m, &fdt) != FERRY_OK) return CLI_FAIL;
    if (!a->dtype_set) run->dtype = fdt;
    snprintf(run->origin, sizeof run->origin, "%s", a->model);
  } else if (has_mlp) {
    struct predictor_args ta = *a;
    ta.variant = kind;
    if ((st = predictor_train_mlp(s->train_src, &ta, &m, 0)) != FERRY_OK) return cli_fail(st, NULL);
    snprintf(run->origin, sizeof run->origin, "%s",
             a->train_routing ? "trained now on --train-routing" : "trained now on this trace (in-sample)");
  }
  struct ferry_predictor_config pc = {.name = ops->name, .n_layers = s->L, .n_experts = s->E, .top_k = s->K,
                                      .mlp_dtype = run->dtype, .mlp_dtype_set = 1};
  ferry_predictor *p = NULL;
  st = ferry_predictor_create(&p, &pc);
  if (st == FERRY_OK && has_mlp) st = ferry_predictor_set_mlp(p, &m);
  ferry_mlp_free(&m);
  if (st == FERRY_OK) st = ferry_predictor_seed_popularity(p, s->train_src, s->L, s->E);
  if (st == FERRY_OK) st = ferry_predict_eval(p, s->reqs, s->n, &s->ec, &run->res);
  if (st == FERRY_OK) st = ferry_predict_eval_ci(&run->res, (int32_t)a->bootstrap, (uint64_t)a->seed, run->ci);
  ferry_predictor_free(p);
  return st == FERRY_OK ? CLI_OK : cli_fail(st, NULL);
}

static void print_ci(const char *fmt, const struct ferry_predict_ci *c) {
  if (isnan(c->value)) {
    printf(" -");
    return;
  }
  printf(" ");
  printf(fmt, c->value);
  if (isnan(c->lo)) printf(" [-]");
  else {
    printf(" [");
    printf(fmt, c->lo);
    printf(", ");
    printf(fmt, c->hi);
    printf("]");
  }
}

static void print_one(const struct eval_setup *s, const struct eval_run *run) {
  const struct predictor_args *a = s->a;
  const struct ferry_predict_eval_result *res = &run->res;
  const int32_t K = s->K;
  char b1[32], b2[32];
  printf("predictor      %s%s%s%s\n", run->ops->name, run->origin[0] ? " (" : "", run->origin,
         run->origin[0] ? ")" : "");
  if (run->origin[0]) printf("weights        %s\n", ferry_dtype_name(run->dtype));
  printf("routing        %s: %d layers, %d experts, top-%d, %zu requests, %" PRId64 " tokens\n", a->routing, s->L, s->E,
         K, s->n, res->tokens);
  printf("cache          %d slots (%s), prefetch depth %" PRId64 ", up to %d experts per layer\n", s->ec.cache_slots,
         a->cache_policy ? a->cache_policy : a->lfu ? "lfu" : "lru", a->depth, a->pf_max ? (int)a->pf_max : K);
  if (res->predictions) {
    printf("recall         %.4f (top-%d, over %" PRId64 " predicted token-layers)\n", res->recall, K, res->predictions);
    printf("precision      %.4f of predicted experts were chosen\n", res->precision);
    if (run->ops->needs & FERRY_PREDICT_NEEDS_LOOKAHEAD)
      printf("lookahead      %" PRId64 " of %" PRId64 " predictions replay a real run's recorded choices%s\n",
             res->recorded_lookahead, res->predictions,
             res->recorded_lookahead ? "" : " (the rest: the current layer's choice as a proxy)");
  } else {
    printf("recall         - (no predictions)\n");
  }
  printf("uses           %" PRId64 ": hits %" PRId64 ", misses %" PRId64 " (hit rate %.4f)\n", res->uses, res->hits,
         res->misses, res->uses ? (double)res->hits / res->uses : 0);
  printf("prefetches     %" PRId64 " loads: %" PRId64 " used, %" PRId64 " evicted or left unused, %" PRId64
         " dropped (no free slot); prefetch precision %.4f\n",
         res->prefetch_loads, res->prefetch_useful, res->prefetch_unused, res->prefetch_dropped,
         res->prefetch_loads ? (double)res->prefetch_useful / res->prefetch_loads : 0);
  printf("stall proxy    %" PRId64 " demand loads (%.3f per token)", res->misses,
         res->tokens ? (double)res->misses / res->tokens : 0);
  if (a->expert_bytes)
    printf(", ~%.3f ms at %.1f GB/s\n", (double)res->misses * (double)a->expert_bytes / (a->gbps * 1e9) * 1e3, a->gbps);
  else
    printf("\n");
  if (a->expert_bytes)
    printf("bytes          %s loaded, %s fetched but unused\n", ferry__format_bytes(res->bytes_loaded, b1, sizeof b1),
           ferry__format_bytes(res->bytes_unused, b2, sizeof b2));
  else
    printf("loads          %" PRId64 " loaded, %" PRId64 " fetched but unused (give --expert-bytes for bytes)\n",
           res->misses + res->prefetch_loads, res->prefetch_unused);
  printf("95%% CI         bootstrap over %zu requests (%" PRId64 " resamples): recall", s->n, a->bootstrap);
  print_ci("%.4f", &run->ci[FERRY_PREDICT_RECALL]);
  printf(", precision");
  print_ci("%.4f", &run->ci[FERRY_PREDICT_PRECISION]);
  printf(", stall/token");
  print_ci("%.3f", &run->ci[FERRY_PREDICT_STALL]);
  printf(", wasted/token");
  print_ci("%.3f", &run->ci[FERRY_PREDICT_WASTED]);
  if (a->expert_bytes && !isnan(run->ci[FERRY_PREDICT_WASTED].value))
    printf(" (x %s per expert)", ferry__format_bytes(a->expert_bytes, b1, sizeof b1));
  printf("\n");
  if (res->predictions) {
    printf("\n%5s %8s\n", "layer", "recall");
    for (int32_t l = 0; l < s->L; l++) {
      if (isnan(res->layer_recall[l])) printf("%5d %8s\n", l, "-");
      else printf("%5d %8.4f\n", l, res->layer_recall[l]);
    }
  }
}

/* Several predictors: one row each with intervals, and which of the others each is tied with
 * on stall (the paired interval of the difference contains 0). */
static int print_table(const struct eval_setup *s, const struct eval_run *runs, int n) {
  const struct predictor_args *a = s->a;
  printf("routing        %s: %d layers, %d experts, top-%d, %zu requests; cache %d slots, prefetch depth %" PRId64 "\n",
         a->routing, s->L, s->E, s->K, s->n, s->ec.cache_slots, a->depth);
  printf("95%% intervals: bootstrap over requests (%" PRId64 " resamples); tied: the paired interval of the stall\n"
         "difference contains 0\n\n",
         a->bootstrap);
  printf("%-15s %-25s %-25s %-23s %-23s %s\n", "predictor", "recall", "precision", "stall (loads/token)",
         "wasted (loads/token)", "tied on stall with");
  for (int i = 0; i < n; i++) {
    const struct eval_run *r = &runs[i];
    printf("%-15s", r->ops->name);
    static const enum ferry_predict_metric cols[] = {FERRY_PREDICT_RECALL, FERRY_PREDICT_PRECISION, FERRY_PREDICT_STALL,
                                                     FERRY_PREDICT_WASTED};
    for (size_t c = 0; c < sizeof cols / sizeof *cols; c++) {
      char cell[64];
      const struct ferry_predict_ci *ci = &r->ci[cols[c]];
      const char *f = c < 2 ? "%.3f [%.3f, %.3f]" : "%.2f [%.2f, %.2f]";
      if (isnan(ci->value)) snprintf(cell, sizeof cell, "-");
      else snprintf(cell, sizeof cell, f, ci->value, ci->lo, ci->hi);
      printf(" %-*s", c < 2 ? 25 : 23, cell);
    }
    int ties = 0;
    for (int j = 0; j < n; j++) {
      if (j == i) continue;
      struct ferry_predict_ci d;
      ferry_status st = ferry_predict_eval_diff_ci(&r->res, &runs[j].res, FERRY_PREDICT_STALL, (int32_t)a->bootstrap,
                                                   (uint64_t)a->seed, &d);
      if (st != FERRY_OK) return cli_fail(st, NULL);
      if (d.lo <= 0 && d.hi >= 0) printf("%s%s", ties++ ? ", " : " ", runs[j].ops->name);
    }
    printf("%s\n", ties ? "" : " -");
  }
  return CLI_OK;
}

int cmd_predictor_eval(int argc, char **argv) {
  struct predictor_args a;
  int rc = predictor_parse(argc, argv, "predictor eval", &a);
  if (rc != CLI_OK) return rc;
  struct eval_setup s;
  struct eval_run runs[PREDICTOR_MAX_VARIANTS];
  int done = 0;
  rc = setup_open(&a, &s);
  for (int i = 0; rc == CLI_OK && i < a.n_variants; i++, done++) rc = evaluate(&s, a.variants[i], &runs[i]);
  if (rc == CLI_OK) {
    if (a.n_variants == 1) print_one(&s, &runs[0]);
    else rc = print_table(&s, runs, a.n_variants);
  }
  for (int i = 0; i < done; i++) ferry_predict_eval_result_free(&runs[i].res);
  setup_free(&s);
  return rc;
}
