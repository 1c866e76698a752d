/* `ferry predictor`: train the mlp3 / mlp7 expert predictors from a routing trace (weights
 * written as safetensors in fp32, fp16 or int8) and evaluate any predictor variant by
 * replaying a routing trace through an expert cache with prefetching. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/predictor_cli.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/half.h"
#include "common/units.h"
#include "ferry/predict.h"
#include "ferry/routing.h"
#include "ferry/cache_policy.h"
#include "ferry/prefetch.h"
#include "ferry/store.h"

const char *const predictor_usage =
    "Usage: ferry predictor train --routing FILE --variant mlp3|mlp7 --out P.safetensors [OPTIONS]\n"
    "       ferry predictor eval --routing FILE --variant V [--model P.safetensors] [OPTIONS]\n"
    "Expert predictors for MoE offloading (see docs/predictors.md).\n\n"
    "train: fit the MLP (3 -> 32 -> 16 -> layers x experts sigmoids) with Adam on every token\n"
    "of the routing trace. Features come from the rows' \"features\" when present (written by\n"
    "`ferry run --record-routing`); otherwise only what the trace implies is used (token\n"
    "position, sequence length), and the command says so.\n"
    "  --epochs N            passes over the data (default 10)\n"
    "  --lr X                Adam step size (default 0.01)\n"
    "  --batch N             samples per step (default 32)\n"
    "  --seed S              initialisation and shuffling seed (default 1)\n"
    "  --predictor-dtype D   weights stored as fp16 (default), int8 or fp32\n\n"
    "eval: replay the trace (requests one after another) through an expert cache; at each\n"
    "layer l the predictor names experts of layer l+D, which are loaded if not resident.\n"
    "Variants: none, lru, frequency, gate-lookahead, mlp3, mlp7, oracle (or a registered predictor);\n"
    "several, comma-separated\n"
    "(--variant frequency,mlp3,mlp7), give a table in which predictors whose stall differs by\n"
    "less than the noise (paired bootstrap over requests) are marked tied.\n"
    "Recall, precision, stall (demand loads per token) and waste (prefetched experts never\n"
    "used, per token) carry 95% bootstrap confidence intervals over the requests.\n"
    "  --bootstrap N          bootstrap resamples (default 1000)\n"
    "  --model P.safetensors  MLP weights (mlp3/mlp7; default: train on --train-routing now)\n"
    "  --train-routing FILE   trace for frequency counts and in-process MLP training\n"
    "                         (default: the evaluated trace itself, i.e. in-sample)\n"
    "  --cache-slots N        expert cache capacity, all layers (default: 2 layers' worth of\n"
    "                         experts x top-k, at least 4 x top-k)\n"
    "  --prefetch-depth D     layers ahead (default 1)\n"
    "  --prefetch-max M       experts prefetched per layer (default top-k)\n"
    "  --expert-bytes SIZE    bytes per expert, for byte figures (default 0: loads only)\n"
    "  --link-gbps G          host-to-device GB/s for the stall estimate (default 25)\n"
    "  --expert-cache NAME    eviction policy of the cache (default lru; lfu, or a registered one)\n"
    "  --lfu                  the same as --expert-cache lfu\n"
    "  --predictor-dtype D    round MLP weights through fp16, int8 or fp32\n"
    "Trace shape: --experts E and --layers L as for `ferry trace routing`.\n";


static int parse_dtype(const char *v, enum ferry_dtype *out) {
  if (!strcmp(v, "fp16") || !strcmp(v, "f16")) *out = FERRY_DTYPE_F16;
  else if (!strcmp(v, "int8") || !strcmp(v, "i8")) *out = FERRY_DTYPE_I8;
  else if (!strcmp(v, "fp32") || !strcmp(v, "f32")) *out = FERRY_DTYPE_F32;
  else return -1;
  return 0;
}

/* "mlp3" or "frequency,mlp3,mlp7": the first is a->variant, all of them a->variants. */
static int parse_variants(const char *v, struct predictor_args *a) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", v);
  a->n_variants = 0;
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (a->n_variants == PREDICTOR_MAX_VARIANTS) {
      ferry__fail(FERRY_ERR_INVALID, "at most %d variants", PREDICTOR_MAX_VARIANTS);
      return -1;
    }
    if (ferry_predictor_lookup(t, &a->variants[a->n_variants]) != FERRY_OK) return -1;
    a->n_variants++;
  }
  if (!a->n_variants) {
    ferry__fail(FERRY_ERR_INVALID, "no variant named");
    return -1;
  }
  if (ferry_predictor_kind_parse(a->variants[0]->name, &a->variant) != FERRY_OK) a->variant = FERRY_PREDICTOR_NONE;
  a->has_variant = 1;
  return 0;
}

int predictor_parse(int argc, char **argv, const char *cmd, struct predictor_args *a) {
  memset(a, 0, sizeof *a);
  a->epochs = 10;
  a->batch = 32;
  a->seed = 1;
  a->depth = 1;
  a->lr = 0.01;
  a->gbps = 25;
  a->bootstrap = 1000;
  a->dtype = FERRY_DTYPE_F16;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    if (!strcmp(o, "--lfu")) {
      a->lfu = 1;
      continue;
    }
    if (o[0] != '-') return cli_usage_error(cmd, "unexpected argument '%s'", o);
    if (i + 1 >= argc) return cli_usage_error(cmd, "option '%s' needs a value (or is unknown)", o);
    const char *v = argv[++i];
    if (!strcmp(o, "--routing")) a->routing = v;
    else if (!strcmp(o, "--train-routing")) a->train_routing = v;
    else if (!strcmp(o, "--out")) a->out = v;
    else if (!strcmp(o, "--model")) a->model = v;
    else if (!strcmp(o, "--expert-cache")) {
      const struct ferry_cache_policy_ops *cp;
      if (ferry_cache_policy_lookup(v, &cp) != FERRY_OK) return cli_usage_error(cmd, "--expert-cache: %s", ferry_last_error());
      a->cache_policy = v;
    }
    else if (!strcmp(o, "--variant")) {
      if (parse_variants(v, a)) return cli_usage_error(cmd, "--variant: %s", ferry_last_error());
    } else if (!strcmp(o, "--predictor-dtype")) {
      if (parse_dtype(v, &a->dtype)) return cli_usage_error(cmd, "--predictor-dtype: '%s' is not fp16, int8 or fp32", v);
      a->dtype_set = 1;
    } else if (!strcmp(o, "--epochs")) {
      if (cli_parse_int(o, v, 1, 100000, &a->epochs)) return CLI_USAGE;
    } else if (!strcmp(o, "--batch")) {
      if (cli_parse_int(o, v, 1, 1 << 20, &a->batch)) return CLI_USAGE;
    } else if (!strcmp(o, "--seed")) {
      if (cli_parse_int(o, v, 0, INT64_MAX, &a->seed)) return CLI_USAGE;
    } else if (!strcmp(o, "--cache-slots")) {
      if (cli_parse_int(o, v, 1, 1 << 24, &a->cache_slots)) return CLI_USAGE;
    } else if (!strcmp(o, "--prefetch-depth")) {
      if (cli_parse_int(o, v, 1, FERRY_ROUTING_MAX_LAYERS, &a->depth)) return CLI_USAGE;
    } else if (!strcmp(o, "--prefetch-max")) {
      if (cli_parse_int(o, v, 1, FERRY_ROUTING_MAX_EXPERTS, &a->pf_max)) return CLI_USAGE;
    } else if (!strcmp(o, "--experts")) {
      if (cli_parse_int(o, v, 1, FERRY_ROUTING_MAX_EXPERTS, &a->experts)) return CLI_USAGE;
    } else if (!strcmp(o, "--layers")) {
      if (cli_parse_int(o, v, 1, FERRY_ROUTING_MAX_LAYERS, &a->layers)) return CLI_USAGE;
    } else if (!strcmp(o, "--lr")) {
      if (cli_parse_double(o, v, 1e-9, 10, &a->lr)) return CLI_USAGE;
    } else if (!strcmp(o, "--link-gbps")) {
      if (cli_parse_double(o, v, 1e-6, 1e6, &a->gbps)) return CLI_USAGE;
    } else if (!strcmp(o, "--bootstrap")) {
      if (cli_parse_int(o, v, 10, 1000000, &a->bootstrap)) return CLI_USAGE;
    } else if (!strcmp(o, "--expert-bytes")) {
      if (cli_parse_size(o, v, &a->expert_bytes)) return CLI_USAGE;
    } else {
      return cli_usage_error(cmd, "unknown option '%s'", o);
    }
  }
  if (!a->routing) return cli_usage_error(cmd, "missing --routing FILE");
  if (!a->has_variant) return cli_usage_error(cmd, "missing --variant");
  return CLI_OK;
}

ferry_status predictor_open_trace(const char *path, const struct predictor_args *a, ferry_routing **out) {
  struct ferry_routing_options o = {.n_experts = (int32_t)a->experts, .n_layers = (int32_t)a->layers};
  return ferry_routing_open(out, path, &o);
}

/* One sample per (request, token) present in the trace. *recorded: samples whose features
 * came from the trace. */
static ferry_status build_dataset(const ferry_routing *r, enum ferry_predictor_kind variant, struct ferry_mlp_dataset *d,
                                  float **x_out, int32_t **y_out, int64_t *recorded) {
  int32_t L = ferry_routing_n_layers(r), K = ferry_routing_top_k(r), nf = ferry_routing_n_features(r);
  int32_t n_in = variant == FERRY_PREDICTOR_MLP7 ? FERRY_MLP7_FEATURES : FERRY_MLP3_FEATURES;
  int64_t n = 0;
  struct ferry_routing_request q;
  for (size_t i = 0; ferry_routing_request_at(r, i, &q) == FERRY_OK; i++) n += q.n_tokens;
  float *x = ferry__calloc((size_t)(n ? n : 1) * (size_t)n_in, sizeof *x);
  int32_t *y = ferry__calloc((size_t)(n ? n : 1) * (size_t)L * (size_t)K, sizeof *y);
  if (!x || !y) {
    ferry_free(x);
    ferry_free(y);
    cli_fail(FERRY_ERR_NOMEM, "out of memory for %" PRId64 " training samples", n);
    return FERRY_ERR_NOMEM;
  }
  int64_t s = 0;
  *recorded = 0;
  for (size_t i = 0; ferry_routing_request_at(r, i, &q) == FERRY_OK; i++)
    for (int32_t t = 0; t < q.n_tokens; t++) {
      const int32_t *ids = q.ids + (size_t)t * (size_t)L * (size_t)K;
      int any = 0;
      for (int32_t l = 0; l < L; l++) any |= ids[(size_t)l * (size_t)K] >= 0;
      if (!any) continue;
      if (nf == n_in && q.features && q.has_features[t]) {
        memcpy(x + s * n_in, q.features + (size_t)t * (size_t)nf, (size_t)n_in * sizeof *x);
        (*recorded)++;
      } else {
        ferry_predictor_features_derived(variant, t, q.n_tokens, x + s * n_in);
      }
      memcpy(y + (size_t)s * (size_t)L * (size_t)K, ids, (size_t)L * (size_t)K * sizeof *y);
      s++;
    }
  *d = (struct ferry_mlp_dataset){.n = s, .n_features = n_in, .x = x, .n_layers = L, .top_k = K, .y = y};
  *x_out = x;
  *y_out = y;
  return FERRY_OK;
}

static void say_features(const ferry_routing *r, int64_t recorded, int64_t n, enum ferry_predictor_kind v) {
  if (recorded == n) return;
  int32_t nf = ferry_routing_n_features(r);
  fprintf(stderr,
          "ferry: %" PRId64 " of %" PRId64 " samples have no recorded %s features (the trace carries %d per token); "
          "they use only token position and sequence length\n",
          n - recorded, n, ferry_predictor_kind_name(v), nf);
}

/* Train an MLP of `variant` on trace r. */
ferry_status predictor_train_mlp(const ferry_routing *r, const struct predictor_args *a, struct ferry_mlp *m, int verbose) {
  struct ferry_mlp_dataset d;
  float *x;
  int32_t *y;
  int64_t recorded;
  ferry_status st = build_dataset(r, a->variant, &d, &x, &y, &recorded);
  if (st != FERRY_OK) return st;
  say_features(r, recorded, d.n, a->variant);
  st = ferry_mlp_init(m, a->variant, d.n_layers, ferry_routing_n_experts(r), (uint64_t)a->seed);
  double *loss = ferry__calloc((size_t)a->epochs, sizeof *loss);
  if (st == FERRY_OK && !loss) st = FERRY_ERR_NOMEM;
  if (st == FERRY_OK) {
    double before = ferry_mlp_loss(m, &d);
    struct ferry_mlp_train_config tc = {.epochs = (int32_t)a->epochs, .batch = (int32_t)a->batch, .lr = a->lr,
                                        .seed = (uint64_t)a->seed};
    st = ferry_mlp_train(m, &d, &tc, loss);
    if (st == FERRY_OK && verbose) {
      printf("samples        %" PRId64 " (tokens), %d layers x %d experts outputs\n", d.n, d.n_layers, m->n_experts);
      printf("loss           %.5f before training\n", before);
      for (int64_t e = 0; e < a->epochs; e++) printf("epoch %-8" PRId64 " %.5f\n", e + 1, loss[e]);
    }
  }
  if (st != FERRY_OK) ferry_mlp_free(m);
  ferry_free(loss);
  ferry_free(x);
  ferry_free(y);
  return st;
}

/* ---- weight files: the library's (ferry_mlp_save / ferry_mlp_load) ----------------------- */

ferry_status cli_predictor_load_mlp(const char *path, enum ferry_predictor_kind variant, int32_t n_layers, int32_t n_experts,
                                    struct ferry_mlp *m, enum ferry_dtype *file_dtype) {
  const ferry_status st = ferry_mlp_load(path, variant, n_layers, n_experts, m, file_dtype);
  if (st != FERRY_OK) cli_fail(st, NULL);
  return st;
}

/* ---- subcommands ------------------------------------------------------------------------- */

static int predictor_train(int argc, char **argv) {
  struct predictor_args a;
  int rc = predictor_parse(argc, argv, "predictor train", &a);
  if (rc != CLI_OK) return rc;
  if (a.n_variants != 1 || (strcmp(a.variants[0]->name, "mlp3") && strcmp(a.variants[0]->name, "mlp7")))
    return cli_usage_error("predictor train", "--variant must be mlp3 or mlp7 (the others have nothing to train)");
  if (!a.out) return cli_usage_error("predictor train", "missing --out P.safetensors");
  const struct ferry_path_use paths[] = {{"--out", a.out, FERRY_PATH_OUT}, {"--routing", a.routing, 0},
                                         {"--train-routing", a.train_routing, 0}, {"--model", a.model, FERRY_PATH_DIR}};
  if (cli_check_paths("predictor train", paths, 4)) return CLI_USAGE;
  ferry_routing *r;
  ferry_status st = predictor_open_trace(a.routing, &a, &r);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  struct ferry_mlp m;
  st = predictor_train_mlp(r, &a, &m, 1);
  if (st == FERRY_OK) {
    st = ferry_mlp_save(&m, a.dtype, ferry_routing_top_k(r), a.out);
    if (st != FERRY_OK) cli_fail(st, NULL);
    if (st == FERRY_OK)
      printf("wrote          %s (%s, weights %s)\n", a.out, ferry_predictor_kind_name(a.variant), ferry_dtype_name(a.dtype));
    ferry_mlp_free(&m);
  } else if (st != FERRY_OK) {
    cli_fail(st, NULL);
  }
  ferry_routing_free(r);
  return st == FERRY_OK ? CLI_OK : CLI_FAIL;
}

int cmd_predictor(int argc, char **argv) {
  if (argc < 2) {
    fputs(predictor_usage, stderr);
    return CLI_USAGE;
  }
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || !strcmp(argv[i], "help")) {
      fputs(predictor_usage, stdout);
      return CLI_OK;
    }
  if (!strcmp(argv[1], "train")) return predictor_train(argc - 1, argv + 1);
  if (!strcmp(argv[1], "eval")) return cmd_predictor_eval(argc - 1, argv + 1);
  return cli_usage_error("predictor", "unknown subcommand '%s' (expected train or eval)", argv[1]);
}
