/* `ferry model`: describe models from the preset catalogue or a Hugging Face config.json
 * folder: configuration, parameter / byte / KV-cache / FLOP accounting, and the preset list.
 * Subcommands live in one dispatch table so others (gen, quantize) can add a line. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/alloc.h"
#include "common/json.h"
#include "common/units.h"
#include "ferry/model.h"

struct subcommand {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *args;
  const char *summary;
};

static int model_show(int argc, char **argv);
static int model_list(int argc, char **argv);

static const struct subcommand subcommands[] = {
    {"show", model_show, "NAME|DIR [--json]",
     "configuration and accounting of a preset or a Hugging Face model folder / config.json"},
    {"list", model_list, "", "the catalogue of presets, one line each"},
    {"gen", cmd_model_gen, "--preset P --out DIR", "write a synthetic model (config.json + safetensors)"},
    {"quantize", cmd_model_quantize, "--format F IN OUT", "pack a model's weights (int8, int4, nf4, ...) and report errors"},
    {"kv-error", cmd_model_kv_error, "DIR [--kv-dtype F,..]", "the logits error of quantized KV-cache formats (fp8, int8, int4)"},
    {"manifest", cmd_model_manifest, "DIR [--check]", "write (or check) DIR/manifest.sha256, which a hot reload verifies"},
};
#define N_SUBCOMMANDS (sizeof subcommands / sizeof subcommands[0])

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry model SUBCOMMAND [OPTIONS]\n"
          "Describe transformer models: presets of published checkpoints and Hugging Face\n"
          "config.json folders, with parameters, bytes, KV-cache bytes and FLOPs.\n\nSubcommands:\n");
  for (size_t i = 0; i < N_SUBCOMMANDS; i++)
    fprintf(f, "  %-6s %-20s %s\n", subcommands[i].name, subcommands[i].args, subcommands[i].summary);
  fprintf(f,
          "\nOptions of show:\n"
          "  --json   print one JSON object (params_*, bytes_*, kv_bytes_*, flops_*, config)\n"
          "\nExamples:\n"
          "  ferry model list\n"
          "  ferry model show mixtral-8x7b\n"
          "  ferry model show path/to/Mixtral-8x7B-v0.1 --json\n");
}

int cmd_model(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return CLI_USAGE;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    usage(stdout);
    return CLI_OK;
  }
  for (size_t i = 0; i < N_SUBCOMMANDS; i++)
    if (!strcmp(sub, subcommands[i].name)) return subcommands[i].fn(argc - 1, argv + 1);
  return cli_usage_error("model", "unknown subcommand '%s' (expected show, list, gen, quantize, kv-error or manifest)", sub);
}

/* ---- formatting ------------------------------------------------------------------------- */

/* Parameter counts in decimal units, as papers write them: "46.70 B". */
static const char *fmt_count(double n, char *buf, size_t len) {
  if (n >= 1e12)
    snprintf(buf, len, "%.2f T", n / 1e12);
  else if (n >= 1e9)
    snprintf(buf, len, "%.2f B", n / 1e9);
  else if (n >= 1e6)
    snprintf(buf, len, "%.2f M", n / 1e6);
  else if (n >= 1e3)
    snprintf(buf, len, "%.2f K", n / 1e3);
  else
    snprintf(buf, len, "%.0f", n);
  return buf;
}

static const char *fmt_flops(double f, char *buf, size_t len) {
  if (f >= 1e12)
    snprintf(buf, len, "%.2f TFLOP", f / 1e12);
  else if (f >= 1e9)
    snprintf(buf, len, "%.2f GFLOP", f / 1e9);
  else if (f >= 1e6)
    snprintf(buf, len, "%.2f MFLOP", f / 1e6);
  else
    snprintf(buf, len, "%.0f FLOP", f);
  return buf;
}

static const char *norm_name(enum ferry_norm_kind n) { return n == FERRY_NORM_LAYER ? "layernorm" : "rmsnorm"; }

static const char *act_name(enum ferry_act_kind a) {
  switch (a) {
  case FERRY_ACT_SWIGLU: return "swiglu";
  case FERRY_ACT_GELU: return "gelu";
  case FERRY_ACT_RELU: return "relu";
  case FERRY_ACT_GEGLU: return "geglu";
  case FERRY_ACT_GELU_TANH: return "gelu_tanh";
  }
  return "?";
}

static const char *rope_name(enum ferry_rope_type t) {
  static const char *const names[] = {"default", "linear", "dynamic", "yarn", "llama3", "longrope"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

static const char *router_name(enum ferry_router_kind r) {
  static const char *const names[] = {"softmax-topk", "topk-softmax", "sigmoid-group", "softmax-group",
                                      "sigmoid-top1", "sparsemixer"};
  return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "?";
}

static const char *quant_name(enum ferry_ckpt_quant q) {
  static const char *const names[] = {"none", "fp8-block", "mxfp4", "gptq", "awq", "compressed-tensors"};
  return (unsigned)q < sizeof names / sizeof names[0] ? names[q] : "?";
}

/* ---- show --------------------------------------------------------------------------------- */

/* The configuration fields in one table, shared by the text and JSON output. */
#define CONFIG_INT_FIELDS(X)                                                                  \
  X(n_layers) X(hidden) X(intermediate) X(n_heads) X(n_kv_heads) X(head_dim) X(vocab)          \
  X(max_position) X(n_experts) X(experts_per_token) X(expert_intermediate) X(n_shared_experts) \
  X(shared_intermediate) X(sliding_window)
#define CONFIG_FLAG_FIELDS(X)                                                                  \
  X(shared_expert_gate) X(norm_topk_prob) X(tied_embeddings) X(qkv_bias) X(attn_out_bias)      \
  X(ffn_bias) X(qk_norm) X(learned_positions)
/* Fields of the newer families, shown when set. */
#define CONFIG_EXTRA_INT_FIELDS(X)                                                             \
  X(first_dense_layers) X(moe_layer_step) X(sliding_pattern) X(attn_chunk) X(nope_layer_step)  \
  X(rotary_dim) X(q_lora_rank) X(kv_lora_rank) X(qk_nope_dim) X(qk_rope_dim) X(v_head_dim)     \
  X(n_group) X(topk_group) X(rope_interleaved) X(norm_unit_offset) X(sandwich_norms)           \
  X(scale_embeddings) X(parallel_residual) X(parallel_shared_norm) X(fused_qkv) X(embed_norm) X(alibi) X(attn_sinks)   \
  X(lm_head_bias) X(router_bias) X(router_score_bias) X(expert_scale_input) X(multimodal_names)
#define CONFIG_EXTRA_NUM_FIELDS(X)                                                             \
  X(rope_local_theta) X(query_pre_attn_scalar) X(attn_softcap) X(final_softcap)                \
  X(attn_temp_floor) X(attn_temp_scale) X(routed_scaling) X(router_jitter) X(swiglu_limit)

/* The config section of `ferry model show`: every field of the model's configuration. */
static void print_config(const ferry_model *m) {
  const struct ferry_model_config *c = ferry_model_get_config(m);
  printf("\nconfig\n");
#define PRINT_INT(f) printf("  %-22s %lld\n", #f, (long long)c->f);
#define PRINT_FLAG(f) printf("  %-22s %d\n", #f, c->f);
#define PRINT_SET_INT(f) if (c->f) printf("  %-22s %lld\n", #f, (long long)c->f);
#define PRINT_SET_NUM(f) if (c->f != 0) printf("  %-22s %g\n", #f, c->f);
  CONFIG_INT_FIELDS(PRINT_INT)
  CONFIG_FLAG_FIELDS(PRINT_FLAG)
  CONFIG_EXTRA_INT_FIELDS(PRINT_SET_INT)
  CONFIG_EXTRA_NUM_FIELDS(PRINT_SET_NUM)
#undef PRINT_INT
#undef PRINT_FLAG
#undef PRINT_SET_INT
#undef PRINT_SET_NUM
  printf("  %-22s %s\n  %-22s %s\n  %-22s %g\n  %-22s %g\n  %-22s %s\n", "norm", norm_name(c->norm), "act",
         act_name(c->act), "norm_eps", c->norm_eps, "rope_theta", c->rope_theta, "dtype", ferry_dtype_name(c->dtype));
  const struct ferry_rope_scaling *rs = &c->rope_scaling;
  if (rs->type != FERRY_ROPE_DEFAULT)
    printf("  %-22s %s factor %g, original context %lld\n", "rope_scaling", rope_name(rs->type), rs->factor,
           (long long)rs->original_max_position);
  if (c->quant.kind != FERRY_CKPT_NONE)
    printf("  %-22s %s, %d bits%s\n", "quantization", quant_name(c->quant.kind), c->quant.bits,
           c->quant.experts_only ? ", routed experts only" : "");
  printf("  %-22s %.4g (softmax scale)\n", "attention scale", ferry_model_attn_scale(m));
}

static void print_text(const ferry_model *m) {
  const struct ferry_model_config *c = ferry_model_get_config(m);
  struct ferry_model_accounting a;
  ferry_model_get_accounting(m, &a);
  char b1[32], b2[32], b3[32], b4[32];
  printf("model   %s\n", c->name);
  if (c->n_experts) {
    printf("family  %s (MoE: %lld routed experts, top-%lld", ferry_family_name(c->family), (long long)c->n_experts,
           (long long)c->experts_per_token);
    if (c->n_shared_experts) printf(", %lld shared expert%s", (long long)c->n_shared_experts, c->n_shared_experts > 1 ? "s" : "");
    printf(", %lld of %lld layers MoE, router %s)\n", (long long)a.n_moe_layers, (long long)c->n_layers,
           router_name(c->router));
  } else {
    printf("family  %s (dense)\n", ferry_family_name(c->family));
  }
  print_config(m);

  printf("\nparameters\n");
  printf("  %-22s %s\n", "total", fmt_count((double)a.params_total, b1, sizeof b1));
  if (a.params_extra) printf("  %-22s %s (not loaded)\n", "of which vision tower", fmt_count((double)a.params_extra, b1, sizeof b1));
  printf("  %-22s %s\n", "active per token", fmt_count((double)a.params_active, b1, sizeof b1));
  printf("  %-22s %s\n", "active w/o embedding", fmt_count((double)a.params_active_no_embed, b1, sizeof b1));
  printf("  %-22s %s\n", "embed", fmt_count((double)a.params_embed, b1, sizeof b1));
  printf("  %-22s %s\n", "head (final norm+head)", fmt_count((double)a.params_head, b1, sizeof b1));
  printf("  %-22s %s\n", "largest layer", fmt_count((double)a.params_layer, b1, sizeof b1));
  printf("  %-22s %s\n", "largest dense part", fmt_count((double)a.params_layer_dense, b1, sizeof b1));
  printf("  %-22s %s\n", "per expert", fmt_count((double)a.params_expert, b1, sizeof b1));
  printf("  %-22s %zu\n", "tensors", ferry_model_tensor_count(m));

  const struct {
    const char *label;
    uint64_t params, published;
  } rows[] = {{"whole model", a.params_total, a.bytes_total},
              {"largest layer", a.params_layer, a.bytes_layer},
              {"largest dense part", a.params_layer_dense, a.bytes_layer_dense},
              {"per expert", a.params_expert, a.bytes_expert},
              {"embed", a.params_embed, a.bytes_embed},
              {"head", a.params_head, a.bytes_head}};
  printf("\nbytes                    %-12s %-12s %-12s %s\n", "fp32", "fp16", "int8",
         c->quant.kind != FERRY_CKPT_NONE ? "as published" : ferry_dtype_name(c->dtype));
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    printf("  %-22s %-12s %-12s %-12s %s\n", rows[i].label, ferry__format_bytes(rows[i].params * 4, b1, sizeof b1),
           ferry__format_bytes(rows[i].params * 2, b2, sizeof b2), ferry__format_bytes(rows[i].params, b3, sizeof b3),
           ferry__format_bytes(rows[i].published, b4, sizeof b4));
  printf("  %-22s %.2f GB (decimal)\n", "whole model published", (double)a.bytes_total / 1e9);

  /* the format a run uses without --kv-dtype: the engine asks the same function */
  printf("\n%s cache (%s; --kv-dtype to change)\n", c->kv_lora_rank ? "MLA latent" : "KV",
         ferry_kv_format_name(ferry_model_kv_format(m, FERRY_KV_AUTO)));
  printf("  %-22s %s\n", "per token", ferry__format_bytes(a.kv_bytes_per_token, b1, sizeof b1));
  printf("  %-22s %s\n", "2048 tokens", ferry__format_bytes(ferry_model_kv_bytes(m, 2048, FERRY_KV_AUTO), b1, sizeof b1));
  printf("  %-22s %s\n", "4096 tokens", ferry__format_bytes(ferry_model_kv_bytes(m, 4096, FERRY_KV_AUTO), b1, sizeof b1));
  printf("  %-22s %s\n", "32768 tokens", ferry__format_bytes(ferry_model_kv_bytes(m, 32768, FERRY_KV_AUTO), b1, sizeof b1));

  printf("\nFLOPs per token\n");
  printf("  %-22s %s\n", "context 0", fmt_flops(ferry_model_flops_per_token(m, 0), b1, sizeof b1));
  printf("  %-22s %s\n", "context 2048", fmt_flops(ferry_model_flops_per_token(m, 2048), b1, sizeof b1));
  printf("  %-22s %s\n", "context 32768", fmt_flops(ferry_model_flops_per_token(m, 32768), b1, sizeof b1));

  const uint64_t in_layers = a.params_total - a.params_embed - a.params_head - a.params_extra;
  printf("\nshare of parameters in transformer layers: %.1f%%\n", 100.0 * (double)in_layers / (double)a.params_total);
}

static int add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v) != NULL; }

static cJSON *json_config(const struct ferry_model_config *c) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  int ok = cJSON_AddStringToObject(o, "name", c->name) && cJSON_AddStringToObject(o, "family", ferry_family_name(c->family));
#define JSON_INT(f) ok = ok && add_num(o, #f, (double)c->f);
#define JSON_FLAG(f) ok = ok && cJSON_AddBoolToObject(o, #f, c->f);
  CONFIG_INT_FIELDS(JSON_INT)
  CONFIG_FLAG_FIELDS(JSON_FLAG)
  CONFIG_EXTRA_INT_FIELDS(JSON_INT)
  CONFIG_EXTRA_NUM_FIELDS(JSON_INT)
#undef JSON_INT
#undef JSON_FLAG
  ok = ok && cJSON_AddStringToObject(o, "norm", norm_name(c->norm)) && cJSON_AddStringToObject(o, "act", act_name(c->act)) &&
       add_num(o, "norm_eps", c->norm_eps) && add_num(o, "rope_theta", c->rope_theta) &&
       cJSON_AddStringToObject(o, "rope_type", rope_name(c->rope_scaling.type)) &&
       add_num(o, "rope_factor", c->rope_scaling.factor) && cJSON_AddStringToObject(o, "router", router_name(c->router)) &&
       cJSON_AddStringToObject(o, "quantization", quant_name(c->quant.kind)) &&
       cJSON_AddStringToObject(o, "dtype", ferry_dtype_name(c->dtype));
  if (!ok) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

static int print_json(const ferry_model *m) {
  const struct ferry_model_config *c = ferry_model_get_config(m);
  struct ferry_model_accounting a;
  ferry_model_get_accounting(m, &a);
  ferry__json_init();
  cJSON *o = cJSON_CreateObject();
  if (!o) return cli_fail(FERRY_ERR_NOMEM, "model show: out of memory");
  int ok = cJSON_AddStringToObject(o, "name", c->name) && cJSON_AddStringToObject(o, "family", ferry_family_name(c->family)) &&
           cJSON_AddBoolToObject(o, "moe", ferry_model_is_moe(m)) &&
           cJSON_AddStringToObject(o, "dtype", ferry_dtype_name(c->dtype));
#define ACC(f) ok = ok && add_num(o, #f, (double)a.f);
  ACC(params_total) ACC(params_active) ACC(params_embed) ACC(params_head) ACC(params_layer)
  ACC(params_layer_dense) ACC(params_expert) ACC(bytes_total) ACC(bytes_layer) ACC(bytes_layer_dense)
  ACC(bytes_expert) ACC(bytes_embed) ACC(bytes_head) ACC(kv_bytes_per_token) ACC(params_active_no_embed)
  ACC(params_extra) ACC(n_moe_layers)
#undef ACC
  ok = ok && add_num(o, "bytes_fp32", (double)a.params_total * 4) && add_num(o, "bytes_fp16", (double)a.params_total * 2) &&
       add_num(o, "bytes_int8", (double)a.params_total) &&
       cJSON_AddStringToObject(o, "kv_dtype", ferry_kv_format_name(ferry_model_kv_format(m, FERRY_KV_AUTO))) &&
       add_num(o, "kv_bytes_2048", (double)ferry_model_kv_bytes(m, 2048, FERRY_KV_AUTO)) &&
       add_num(o, "kv_bytes_4096", (double)ferry_model_kv_bytes(m, 4096, FERRY_KV_AUTO)) &&
       add_num(o, "flops_per_token_ctx0", ferry_model_flops_per_token(m, 0)) &&
       add_num(o, "flops_per_token_ctx2048", ferry_model_flops_per_token(m, 2048)) &&
       add_num(o, "kv_bytes_32768", (double)ferry_model_kv_bytes(m, 32768, FERRY_KV_AUTO)) &&
       add_num(o, "flops_per_token_ctx32768", ferry_model_flops_per_token(m, 32768)) &&
       add_num(o, "attn_scale", ferry_model_attn_scale(m)) &&
       add_num(o, "layer_bytes_share",
               (double)(a.params_total - a.params_embed - a.params_head - a.params_extra) / (double)a.params_total) &&
       add_num(o, "tensor_count", (double)ferry_model_tensor_count(m));
  cJSON *cfg = ok ? json_config(c) : NULL;
  if (cfg && !cJSON_AddItemToObject(o, "config", cfg)) {
    cJSON_Delete(cfg);
    cfg = NULL;
  }
  char *text = cfg ? cJSON_Print(o) : NULL;
  cJSON_Delete(o);
  if (!text) return cli_fail(FERRY_ERR_NOMEM, "model show: out of memory");
  puts(text);
  ferry_free(text);
  return CLI_OK;
}

static int model_show(int argc, char **argv) {
  const char *target = NULL;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("Usage: ferry model show NAME|DIR [--json]\n"
             "Print a model's configuration and accounting. NAME is a preset (ferry model list) or\n"
             "its Hugging Face id in any case (Qwen/Qwen3-30B-A3B); DIR is a folder holding a\n"
             "Hugging Face config.json, or the file itself.\n"
             "  --json   one JSON object instead of text\n");
      return CLI_OK;
    }
    if (!strcmp(argv[i], "--json"))
      json = 1;
    else if (argv[i][0] == '-' && argv[i][1])
      return cli_usage_error("model show", "unknown option '%s'", argv[i]);
    else if (target)
      return cli_usage_error("model show", "one model expected, got '%s' and '%s'", target, argv[i]);
    else
      target = argv[i];
  }
  if (!target) return cli_usage_error("model show", "missing NAME|DIR");
  ferry_model *m = NULL;
  ferry_status st = ferry_model_open(&m, target);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  int rc = CLI_OK;
  if (json)
    rc = print_json(m);
  else
    print_text(m);
  ferry_model_close(m);
  return rc;
}

/* ---- list --------------------------------------------------------------------------------- */

static int model_list(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("Usage: ferry model list\nList the model presets with a one-line summary each.\n");
      return CLI_OK;
    }
    return cli_usage_error("model list", "unexpected argument '%s'", argv[i]);
  }
  for (size_t i = 0; i < ferry_model_preset_count(); i++) {
    const char *name = ferry_model_preset_name(i);
    ferry_model *m = NULL;
    ferry_status st = ferry_model_open(&m, name);
    if (st != FERRY_OK) return cli_fail(st, NULL);
    const struct ferry_model_config *c = ferry_model_get_config(m);
    struct ferry_model_accounting a;
    ferry_model_get_accounting(m, &a);
    char p[32], act[32], by[32], shape[64];
    fmt_count((double)a.params_total, p, sizeof p);
    if (c->n_experts) {
      char tmp[32];
      snprintf(act, sizeof act, "(%s active)", fmt_count((double)a.params_active, tmp, sizeof tmp));
      snprintf(shape, sizeof shape, "%lld layers, %lld experts top-%lld", (long long)c->n_layers,
               (long long)c->n_experts, (long long)c->experts_per_token);
    } else {
      act[0] = '\0';
      snprintf(shape, sizeof shape, "%lld layers, dense", (long long)c->n_layers);
    }
    printf("%-22s %-12s %9s params %-17s %-5s %11s  %s\n", name, ferry_family_name(c->family), p, act,
           ferry_dtype_name(c->dtype), ferry__format_bytes(a.bytes_total, by, sizeof by), shape);
    ferry_model_close(m);
  }
  return CLI_OK;
}
