/* `ferry model quantize`: pack a model folder's weights in a format (or a per-class plan) and
 * report size and error per tensor class; with --report also the end-to-end logits error of
 * the quantized model against the input model on a fixed token set (host executor). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/logits_compare.h"
#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/db.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/quantize.h"
#include "ferry/store.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry model quantize (--format F | --plan SPEC) IN_DIR OUT_DIR [--report]\n"
          "Pack a model's weights: formats fp16, bf16, int8, int4-g32|64|128, int3-g64, int2-g64, nf4;\n"
          "a plan gives one per tensor class, e.g. attn=int4-g64,expert=int3-g64,head=fp16,default=int8\n"
          "(classes: attn, expert, shared, router, dense_ffn, embed, head, norm).\n\n"
          "  --report   also compare the logits of both models on a fixed token set (cosine, KL)\n"
          "  --db FILE  store size and error per tensor class (and the logits figures) in a result database\n");
}

int cmd_model_quantize(int argc, char **argv) {
  static const struct option opts[] = {{"format", required_argument, 0, 'f'}, {"plan", required_argument, 0, 'p'},
                                       {"report", no_argument, 0, 'r'},       {"help", no_argument, 0, 'h'},
                                       {"db", required_argument, 0, 'd'},
                                       {0, 0, 0, 0}};
  const char *format = NULL, *plan_text = NULL, *db_path = NULL;
  int report = 0;
  optind = 1;
  int c;
  while ((c = cli_getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case 'f': format = optarg; break;
      case 'p': plan_text = optarg; break;
      case 'r': report = 1; break;
      case 'd': db_path = optarg; break;
      case 'h': usage(stdout); return CLI_OK;
      default: return cli_usage_error("model quantize", "invalid option");
    }
  }
  if (argc - optind != 2) return cli_usage_error("model quantize", "expected IN_DIR OUT_DIR");
  if (!!format == !!plan_text) return cli_usage_error("model quantize", "give either --format F or --plan SPEC");
  const char *in = argv[optind], *out = argv[optind + 1];
  const struct ferry_path_use paths[] = {{"OUT_DIR", out, FERRY_PATH_OUT | FERRY_PATH_DIR},
                                         {"--db", db_path, FERRY_PATH_OUT | FERRY_PATH_SQLITE},
                                         {"IN_DIR", in, FERRY_PATH_DIR}};
  if (cli_check_paths("model quantize", paths, 3)) return CLI_USAGE;
  struct ferry_qplan plan;
  if (ferry_quant_plan_parse(format ? format : plan_text, &plan) != FERRY_OK)
    return cli_usage_error("model quantize", "%s", ferry_last_error());
  struct ferry_quantize_report rep;
  ferry_status st = ferry_model_quantize(in, out, &plan, cli_is_tty(stderr) ? stderr : NULL, &rep);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  char buf[256], b1[32], b2[32];
  printf("quantized %s -> %s with %s\n", in, out, ferry_quant_plan_format(&plan, buf, sizeof buf));
  printf("%-10s %-10s %8s %12s %12s %7s %10s %10s\n", "class", "format", "tensors", "before", "after", "ratio",
         "mean err", "max err");
  for (int k = 0; k < FERRY_QCLASS_COUNT; k++) {
    const struct ferry_quantize_class_report *r = &rep.cls[k];
    if (!r->tensors) continue;
    char spec[32];
    printf("%-10s %-10s %8lld %12s %12s %6.2fx %10.4f %10.4f\n", ferry_quant_class_name((enum ferry_qclass)k),
           ferry_quant_spec_name(&plan.spec[k], spec, sizeof spec), (long long)r->tensors,
           ferry__format_bytes(r->bytes_before, b1, sizeof b1), ferry__format_bytes(r->bytes_after, b2, sizeof b2),
           r->bytes_after ? (double)r->bytes_before / (double)r->bytes_after : 0, r->mean_rel_error, r->max_rel_error);
  }
  printf("%-10s %-10s %8s %12s %12s %6.2fx   (relative Frobenius error per tensor)\n", "total", "", "",
         ferry__format_bytes(rep.bytes_before, b1, sizeof b1), ferry__format_bytes(rep.bytes_after, b2, sizeof b2),
         rep.bytes_after ? (double)rep.bytes_before / (double)rep.bytes_after : 0);
  double cos_mean = NAN, cos_min = NAN, kl_mean = NAN, kl_max = NAN, top1_share = NAN;
  int rc = CLI_OK;
  if (report) {
    struct logits_error le;
    if ((st = logits_compare(in, FERRY_KV_AUTO, out, FERRY_KV_AUTO, &le)) != FERRY_OK) return cli_fail(st, NULL);
    printf("logits over %zu tokens (4 requests, seeded ids): cosine mean %.5f min %.5f; KL mean %.5f max %.5f nats; "
           "top-1 agreement %.1f%%\n",
           le.tokens, le.cos_mean, le.cos_min, le.kl_mean, le.kl_max, 100.0 * le.top1_share);
    cos_mean = le.cos_mean, cos_min = le.cos_min, kl_mean = le.kl_mean, kl_max = le.kl_max, top1_share = le.top1_share;
  }
  if (rc == CLI_OK && db_path) {
    ferry_db *db = NULL;
    if ((st = ferry_db_open(&db, db_path, FERRY_DB_CREATE)) != FERRY_OK) return cli_fail(st, NULL);
    for (int k = 0; k < FERRY_QCLASS_COUNT && st == FERRY_OK; k++) {
      const struct ferry_quantize_class_report *r = &rep.cls[k];
      if (!r->tensors) continue;
      char spec[32];
      struct ferry_quant_quality_row row = {
          .model = in, .output = out, .plan = buf, .cls = ferry_quant_class_name((enum ferry_qclass)k),
          .format = ferry_quant_spec_name(&plan.spec[k], spec, sizeof spec), .tensors = r->tensors,
          .bytes_before = r->bytes_before, .bytes_after = r->bytes_after, .mean_rel_error = r->mean_rel_error,
          .max_rel_error = r->max_rel_error, .logits_cosine_mean = cos_mean, .logits_cosine_min = cos_min,
          .logits_kl_mean = kl_mean, .logits_kl_max = kl_max, .top1_agreement = top1_share};
      st = ferry_db_add_quant_quality(db, &row);
    }
    ferry_db_close(db);
    if (st != FERRY_OK) return cli_fail(st, NULL);
    printf("stored in %s (table quant_quality)\n", db_path);
  }
  return rc;
}
