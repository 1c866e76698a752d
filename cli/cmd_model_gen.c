/* `ferry model gen`: write a synthetic model (config.json + safetensors) from a preset or a
 * Hugging Face config, with seeded weights, and report the write speed. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/units.h"
#include "ferry/gen.h"
#include "ferry/model.h"

static void gen_usage(FILE *f) {
  fprintf(f,
          "Usage: ferry model gen --preset NAME|DIR --out DIR [OPTIONS]\n"
          "Write a synthetic model: config.json plus safetensors with Hugging Face tensor names,\n"
          "seeded weights scaled so activations stay bounded, each layer and expert contiguous.\n\n"
          "  --preset NAME|DIR     preset (ferry model list) or Hugging Face config folder\n"
          "  --out DIR             output folder (must not exist or be empty)\n"
          "  --layers N            override the number of layers\n"
          "  --scale F             multiply widths (hidden size, heads, FFN sizes) by F\n"
          "  --vocab N             override the vocabulary size\n"
          "  --dtype fp32|fp16|bf16  weight dtype (default: the preset's)\n"
          "  --seed S              generator seed (default 1)\n"
          "  --shard-size SIZE     split into shards of at most SIZE (default 2GiB; 'none' = one file)\n"
          "  --router-skew X       MoE: make low-numbered experts more popular (0 = uniform; try 0.5)\n"
          "  --router-locality X   MoE: correlate routers of adjacent layers, 0..1 (try 0.8)\n"
          "  --routing-profile P   MoE: routers shaped like a trained model's (mixtral, olmoe,\n"
          "                        deepseek: balanced load, realistic gate spread, layer-to-layer\n"
          "                        predictability, token-cluster specialisation; uniform: plain\n"
          "                        random routers); excludes --router-skew/--router-locality\n"
          "  --force               replace a non-empty output folder\n"
          "  --quiet               no progress lines\n");
}

int cmd_model_gen(int argc, char **argv) {
  static const struct option opts[] = {
      {"preset", required_argument, 0, 'p'}, {"out", required_argument, 0, 'o'},
      {"layers", required_argument, 0, 'l'}, {"vocab", required_argument, 0, 'v'}, {"scale", required_argument, 0, 's'},
      {"dtype", required_argument, 0, 'd'},  {"seed", required_argument, 0, 'S'},
      {"shard-size", required_argument, 0, 'z'}, {"router-skew", required_argument, 0, 'k'},
      {"router-locality", required_argument, 0, 'c'}, {"routing-profile", required_argument, 0, 'P'},
      {"force", no_argument, 0, 'f'},
      {"quiet", no_argument, 0, 'q'},        {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  const char *preset = NULL, *out = NULL, *dtype_text = NULL;
  int64_t layers = 0, seed = 1, vocab = 0;
  double scale = 1.0;
  uint64_t shard = 2ull << 30;
  struct ferry_gen_options go = {.progress = 1};
  optind = 1;
  int c;
  while ((c = cli_getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case 'p': preset = optarg; break;
      case 'o': out = optarg; break;
      case 'l': if (cli_parse_int("--layers", optarg, 1, 100000, &layers)) return CLI_USAGE; break;
      case 'v': if (cli_parse_int("--vocab", optarg, 2, 1 << 24, &vocab)) return CLI_USAGE; break;
      case 's': if (cli_parse_double("--scale", optarg, 0.001, 1000, &scale)) return CLI_USAGE; break;
      case 'd': dtype_text = optarg; break;
      case 'S': if (cli_parse_int("--seed", optarg, 0, INT64_MAX, &seed)) return CLI_USAGE; break;
      case 'z':
        /* one file is asked for by name: a size is never 0 */
        if (!strcmp(optarg, "none")) shard = 0;
        else if (cli_parse_size("--shard-size", optarg, &shard)) return CLI_USAGE;
        break;
      case 'k': if (cli_parse_double("--router-skew", optarg, 0, 100, &go.router_skew)) return CLI_USAGE; break;
      case 'c': if (cli_parse_double("--router-locality", optarg, 0, 1, &go.router_locality)) return CLI_USAGE; break;
      case 'P': go.routing_profile = optarg; break;
      case 'f': go.force = 1; break;
      case 'q': go.progress = 0; break;
      case 'h': gen_usage(stdout); return CLI_OK;
      default: return cli_usage_error("model gen", "invalid option");
    }
  }
  if (optind < argc && !preset) preset = argv[optind++];
  if (optind < argc) return cli_usage_error("model gen", "unexpected argument '%s'", argv[optind]);
  if (!preset) return cli_usage_error("model gen", "missing --preset NAME|DIR");
  if (!out) return cli_usage_error("model gen", "missing --out DIR");
  ferry_model *base = NULL, *m = NULL;
  ferry_status st = ferry_model_open(&base, preset);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  struct ferry_model_config mc;
  st = ferry_model_config_derive(ferry_model_get_config(base), layers, scale, vocab, &mc);
  ferry_model_close(base);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  go.dtype = mc.dtype;
  if (dtype_text && ferry_dtype_parse(dtype_text, &go.dtype) != FERRY_OK)
    return cli_usage_error("model gen", "--dtype: unknown dtype '%s' (expected fp32, fp16 or bf16)", dtype_text);
  go.seed = (uint64_t)seed;
  go.max_shard_bytes = shard;
  if ((st = ferry_model_create(&m, &mc)) != FERRY_OK) return cli_fail(st, NULL);
  uint64_t bytes = 0;
  int64_t t0 = ferry__mono_ns();
  st = ferry_model_generate(m, &go, out, &bytes);
  double secs = (double)(ferry__mono_ns() - t0) / 1e9;
  ferry_model_close(m);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  char b[32];
  printf("wrote %s (%s weights, %s) in %.2f s: %.0f MB/s\n", out, ferry__format_bytes(bytes, b, sizeof b),
         ferry_dtype_name(go.dtype), secs, secs > 0 ? (double)bytes / 1e6 / secs : 0.0);
  return CLI_OK;
}
