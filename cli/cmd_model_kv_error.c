/* `ferry model kv-error DIR`: what a quantized KV-cache format does to a model's logits, reported
 * like weight quantization (`ferry model quantize --report`): the same requests and token ids,
 * everything resident, each format against the model's own cache type. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/logits_compare.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/model.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry model kv-error DIR [--kv-dtype F[,F...]]\n"
          "The logits error of KV-cache formats on a model folder (host executor, everything resident, 4\n"
          "requests of seeded token ids): cosine, KL divergence and top-1 agreement of every generated\n"
          "token against the model's own cache type, and the cache's bytes per token.\n\n"
          "  --kv-dtype LIST   formats to compare (default fp8,int8,int4)\n");
}

int cmd_model_kv_error(int argc, char **argv) {
  static const struct option opts[] = {{"kv-dtype", required_argument, 0, 'k'}, {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *list = "fp8,int8,int4";
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case 'k': list = optarg; break;
      case 'h': usage(stdout); return CLI_OK;
      default: return cli_usage_error("model kv-error", "invalid option");
    }
  }
  if (argc - optind != 1) return cli_usage_error("model kv-error", "expected one model folder DIR");
  const char *dir = argv[optind];
  const struct ferry_path_use paths[] = {{"DIR", dir, FERRY_PATH_DIR}};
  if (cli_check_paths("model kv-error", paths, 1)) return CLI_USAGE;
  enum ferry_kv_format fmts[FERRY_KV_FORMAT_COUNT];
  int n = 0;
  char buf[128];
  if (strlen(list) >= sizeof buf) return cli_usage_error("model kv-error", "--kv-dtype: '%s' is too long", list);
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (n == FERRY_KV_FORMAT_COUNT) return cli_usage_error("model kv-error", "--kv-dtype: too many formats");
    if (ferry_kv_format_parse(tok, &fmts[n]) != FERRY_OK) return cli_usage_error("model kv-error", "--kv-dtype: %s", ferry_last_error());
    n++;
  }
  ferry_model *m = NULL;
  ferry_status st = ferry_model_open(&m, dir);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  const enum ferry_kv_format own = ferry_model_kv_format(m, FERRY_KV_AUTO);
  char b[32];
  printf("KV-cache formats of %s against its own (%s, %s per token), logits of 4 requests:\n", dir,
         ferry_kv_format_name(own), ferry__format_bytes(ferry_model_kv_bytes(m, 1, own), b, sizeof b));
  printf("%-6s %12s %12s %12s %12s %12s %8s\n", "format", "per token", "cos mean", "cos min", "KL mean", "KL max",
         "top-1");
  int rc = CLI_OK;
  for (int i = 0; i < n && rc == CLI_OK; i++) {
    struct logits_error le;
    if ((st = logits_compare(dir, FERRY_KV_AUTO, dir, fmts[i], &le)) != FERRY_OK) {
      rc = cli_fail(st, NULL);
      break;
    }
    printf("%-6s %12s %12.6f %12.6f %12.2e %12.2e %7.1f%%\n", ferry_kv_format_name(fmts[i]),
           ferry__format_bytes(ferry_model_kv_bytes(m, 1, fmts[i]), b, sizeof b), le.cos_mean, le.cos_min, le.kl_mean,
           le.kl_max, 100.0 * le.top1_share);
  }
  ferry_model_close(m);
  return rc;
}
