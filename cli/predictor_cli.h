/* Shared by the `ferry predictor` subcommands (cmd_predictor.c: options, training, weight
 * files; cmd_predictor_eval.c: evaluation with confidence intervals). */
#ifndef FERRY_CLI_PREDICTOR_CLI_H
#define FERRY_CLI_PREDICTOR_CLI_H

#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/predict.h"
#include "ferry/routing.h"

#define PREDICTOR_MAX_VARIANTS 8

struct predictor_args {
  const char *routing, *train_routing, *out, *model;
  enum ferry_predictor_kind variant; /* the first of variants, when built in (train: mlp3 or mlp7) */
  const struct ferry_predictor_ops *variants[PREDICTOR_MAX_VARIANTS]; /* from the registry */
  int n_variants, has_variant;
  int64_t epochs, batch, seed, cache_slots, depth, pf_max, experts, layers, bootstrap;
  double lr, gbps;
  uint64_t expert_bytes;
  enum ferry_dtype dtype;
  int dtype_set, lfu;
  const char *cache_policy; /* --expert-cache NAME (NULL: lru, or lfu with --lfu) */
};

extern const char *const predictor_usage;

int predictor_parse(int argc, char **argv, const char *cmd, struct predictor_args *a);
ferry_status predictor_open_trace(const char *path, const struct predictor_args *a, ferry_routing **out);
/* Train an MLP of a->variant on trace r (verbose: print the loss per epoch). */
ferry_status predictor_train_mlp(const ferry_routing *r, const struct predictor_args *a, struct ferry_mlp *m, int verbose);
int cmd_predictor_eval(int argc, char **argv);
/* ferry_mlp_load() printing its failure. */
ferry_status cli_predictor_load_mlp(const char *path, enum ferry_predictor_kind variant, int32_t n_layers, int32_t n_experts,
                                    struct ferry_mlp *m, enum ferry_dtype *file_dtype);

#endif
