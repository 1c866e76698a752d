/* The catalogue of model presets: tiny shapes for tests and the exact shapes of published
 * Hugging Face checkpoints (values copied from their config.json), so that planning and
 * simulation can start from a name instead of a downloaded folder. */
#include <string.h>
#include <strings.h>

#include "runtime/model/model_impl.h"

/* Shorthands keep each preset readable as one block. Every field not named is zero. */
#define LLAMA_LIKE .norm = FERRY_NORM_RMS, .act = FERRY_ACT_SWIGLU
#define OPT_LIKE                                                                           \
  .family = FERRY_FAMILY_OPT, .norm = FERRY_NORM_LAYER, .act = FERRY_ACT_RELU,             \
  .tied_embeddings = 1, .qkv_bias = 1, .attn_out_bias = 1, .ffn_bias = 1,                  \
  .learned_positions = 1, .norm_eps = 1e-5, .max_position = 2048, .vocab = 50272,          \
  .dtype = FERRY_DTYPE_F16

/* A catalogue entry: the Hugging Face id it mirrors ("" for ferry's own shapes) and its shape. */
struct preset {
  const char *hf_id;
  struct ferry_model_config cfg;
};

/* Phi-3.5-MoE's LongRoPE factors: the first 8 of each list as published (quoted in public test
 * code); the other 56 could not be obtained and are 1.0 (see tests/data/configs/README.md).
 * They change only the rotation frequencies, not shapes, bytes or FLOPs. */
#define PHI_LONG {1.0199999809265137f, 1.0299999713897705f, 1.0399999618530273f, 1.0499999523162842f, \
                  1.0499999523162842f, 1.0499999523162842f, 1.059999942779541f, 1.059999942779541f,   \
                  1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,             \
                  1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1}
#define PHI_SHORT {1.0f, 1.0399999618530273f, 1.0399999618530273f, 1.0399999618530273f,            \
                   1.0499999523162842f, 1.0499999523162842f, 1.0499999523162842f, 1.0499999523162842f, \
                   1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,            \
                   1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1}

#define QWEN3_LIKE LLAMA_LIKE, .qk_norm = FERRY_QK_NORM_HEAD, .head_dim = 128, .vocab = 151936, \
  .norm_eps = 1e-6, .dtype = FERRY_DTYPE_BF16
#define DEEPSEEK_LIKE LLAMA_LIKE, .kv_lora_rank = 512, .qk_nope_dim = 128, .qk_rope_dim = 64,    \
  .v_head_dim = 128, .head_dim = 192, .rope_interleaved = 1, .max_position = 163840,             \
  .norm_eps = 1e-6, .rope_theta = 10000.0, .dtype = FERRY_DTYPE_BF16
#define DEEPSEEK_YARN(ms)                                                                       \
  .rope_scaling = {.type = FERRY_ROPE_YARN, .factor = 40, .original_max_position = 4096,       \
                   .beta_fast = 32, .beta_slow = 1, .mscale = ms, .mscale_all_dim = ms}
#define GPT_OSS_LIKE                                                                            \
  .family = FERRY_FAMILY_GPT_OSS, LLAMA_LIKE, .hidden = 2880, .expert_intermediate = 2880,     \
  .n_heads = 64, .n_kv_heads = 8, .head_dim = 64, .vocab = 201088, .max_position = 131072,     \
  .experts_per_token = 4, .norm_eps = 1e-5, .rope_theta = 150000.0,                            \
  .rope_scaling = {.type = FERRY_ROPE_YARN, .factor = 32, .original_max_position = 4096,       \
                   .beta_fast = 32, .beta_slow = 1, .no_truncate = 1},                          \
  .sliding_window = 128, .sliding_pattern = 2, .qkv_bias = 1, .attn_out_bias = 1,               \
  .attn_sinks = 1, .router = FERRY_ROUTER_TOPK_SOFTMAX, .router_bias = 1,                       \
  .expert_layout = FERRY_EXPERTS_FUSED_INTERLEAVED, .swiglu_limit = 7.0,                        \
  .quant = {.kind = FERRY_CKPT_MXFP4, .bits = 4, .group_size = 32, .experts_only = 1},          \
  .dtype = FERRY_DTYPE_BF16
#define GEMMA_LIKE .norm = FERRY_NORM_RMS, .act = FERRY_ACT_GEGLU, .norm_unit_offset = 1,        \
  .sandwich_norms = 1, .scale_embeddings = 1, .tied_embeddings = 1, .norm_eps = 1e-6,            \
  .dtype = FERRY_DTYPE_BF16
#define FUSED_QKV_LIKE .norm = FERRY_NORM_LAYER, .act = FERRY_ACT_GELU_TANH, .fused_qkv = 1,     \
  .qkv_bias = 1, .attn_out_bias = 1, .ffn_bias = 1, .norm_eps = 1e-5

static const struct preset presets[] = {
    /* Tiny shapes for tests: F32, vocab 256 so the layers hold most of the bytes. */
    {"", {.name = "tiny-dense", .family = FERRY_FAMILY_LLAMA, LLAMA_LIKE, .n_layers = 8, .hidden = 128,
     .intermediate = 352, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32, .vocab = 256,
     .max_position = 2048, .norm_eps = 1e-5, .rope_theta = 10000.0, .dtype = FERRY_DTYPE_F32}},
    {"", {.name = "tiny-moe", .family = FERRY_FAMILY_MIXTRAL, LLAMA_LIKE, .n_layers = 6, .hidden = 128,
     .n_heads = 4, .n_kv_heads = 2, .head_dim = 32, .vocab = 256, .max_position = 2048,
     .n_experts = 8, .experts_per_token = 2, .expert_intermediate = 192, .norm_topk_prob = 1,
     .norm_eps = 1e-5, .rope_theta = 1e6, .dtype = FERRY_DTYPE_F32}},
    {"", {.name = "tiny-qwen2-moe", .family = FERRY_FAMILY_QWEN2_MOE, LLAMA_LIKE, .n_layers = 4,
     .hidden = 128, .intermediate = 192, .n_heads = 4, .n_kv_heads = 4, .head_dim = 32,
     .vocab = 256, .max_position = 2048, .n_experts = 8, .experts_per_token = 2,
     .expert_intermediate = 96, .n_shared_experts = 1, .shared_intermediate = 192,
     .shared_expert_gate = 1, .qkv_bias = 1, .norm_eps = 1e-6, .rope_theta = 1e6,
     .dtype = FERRY_DTYPE_F32}},
    {"", {.name = "tiny-olmoe", .family = FERRY_FAMILY_OLMOE, LLAMA_LIKE, .n_layers = 4, .hidden = 128,
     .n_heads = 4, .n_kv_heads = 4, .head_dim = 32, .vocab = 256, .max_position = 2048,
     .n_experts = 8, .experts_per_token = 2, .expert_intermediate = 96, .qk_norm = FERRY_QK_NORM_FULL,
     .norm_eps = 1e-5, .rope_theta = 10000.0, .dtype = FERRY_DTYPE_F32}},

    /* meta-llama/Llama-2-7b-hf, Llama-2-70b-hf, Meta-Llama-3-8B */
    {"meta-llama/Llama-2-7b-hf", {.name = "llama-2-7b", .family = FERRY_FAMILY_LLAMA, LLAMA_LIKE, .n_layers = 32,
     .hidden = 4096, .intermediate = 11008, .n_heads = 32, .n_kv_heads = 32, .head_dim = 128,
     .vocab = 32000, .max_position = 4096, .norm_eps = 1e-5, .rope_theta = 10000.0,
     .dtype = FERRY_DTYPE_F16}},
    {"meta-llama/Llama-2-70b-hf", {.name = "llama-2-70b", .family = FERRY_FAMILY_LLAMA, LLAMA_LIKE, .n_layers = 80,
     .hidden = 8192, .intermediate = 28672, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128,
     .vocab = 32000, .max_position = 4096, .norm_eps = 1e-5, .rope_theta = 10000.0,
     .dtype = FERRY_DTYPE_F16}},
    {"meta-llama/Meta-Llama-3-8B", {.name = "llama-3-8b", .family = FERRY_FAMILY_LLAMA, LLAMA_LIKE, .n_layers = 32,
     .hidden = 4096, .intermediate = 14336, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
     .vocab = 128256, .max_position = 8192, .norm_eps = 1e-5, .rope_theta = 500000.0,
     .dtype = FERRY_DTYPE_BF16}},
    /* mistralai/Mixtral-8x7B-v0.1 (intermediate_size there is the expert size) */
    {"mistralai/Mixtral-8x7B-v0.1", {.name = "mixtral-8x7b", .family = FERRY_FAMILY_MIXTRAL, LLAMA_LIKE, .n_layers = 32,
     .hidden = 4096, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .vocab = 32000,
     .max_position = 32768, .n_experts = 8, .experts_per_token = 2, .expert_intermediate = 14336,
     .norm_topk_prob = 1, .norm_eps = 1e-5, .rope_theta = 1e6, .dtype = FERRY_DTYPE_BF16}},
    /* Qwen/Qwen1.5-MoE-A2.7B */
    {"Qwen/Qwen1.5-MoE-A2.7B", {.name = "qwen1.5-moe-a2.7b", .family = FERRY_FAMILY_QWEN2_MOE, LLAMA_LIKE, .n_layers = 24,
     .hidden = 2048, .intermediate = 5632, .n_heads = 16, .n_kv_heads = 16, .head_dim = 128,
     .vocab = 151936, .max_position = 8192, .n_experts = 60, .experts_per_token = 4,
     .expert_intermediate = 1408, .n_shared_experts = 1, .shared_intermediate = 5632,
     .shared_expert_gate = 1, .qkv_bias = 1, .norm_eps = 1e-6, .rope_theta = 1e6,
     .dtype = FERRY_DTYPE_BF16}},
    /* allenai/OLMoE-1B-7B-0924 (intermediate_size there is the expert size) */
    {"allenai/OLMoE-1B-7B-0924", {.name = "olmoe-1b-7b", .family = FERRY_FAMILY_OLMOE, LLAMA_LIKE, .n_layers = 16,
     .hidden = 2048, .n_heads = 16, .n_kv_heads = 16, .head_dim = 128, .vocab = 50304,
     .max_position = 4096, .n_experts = 64, .experts_per_token = 8, .expert_intermediate = 1024,
     .qk_norm = FERRY_QK_NORM_FULL, .norm_eps = 1e-5, .rope_theta = 10000.0, .dtype = FERRY_DTYPE_BF16}},
    /* facebook/opt-6.7b, opt-30b; OPT-175B as published in the OPT paper / metaseq */
    {"facebook/opt-6.7b", {.name = "opt-6.7b", OPT_LIKE, .n_layers = 32, .hidden = 4096, .intermediate = 16384,
     .n_heads = 32, .n_kv_heads = 32, .head_dim = 128}},
    {"facebook/opt-30b", {.name = "opt-30b", OPT_LIKE, .n_layers = 48, .hidden = 7168, .intermediate = 28672,
     .n_heads = 56, .n_kv_heads = 56, .head_dim = 128}},
    {"", {.name = "opt-175b", OPT_LIKE, .n_layers = 96, .hidden = 12288, .intermediate = 49152,
     .n_heads = 96, .n_kv_heads = 96, .head_dim = 128}},

    /* Qwen/Qwen3-8B, Qwen3-30B-A3B, Qwen3-235B-A22B (tests/data/configs/qwen3*) */
    {"Qwen/Qwen3-8B", {.name = "qwen3-8b", .family = FERRY_FAMILY_QWEN3, QWEN3_LIKE, .n_layers = 36,
     .hidden = 4096, .intermediate = 12288, .n_heads = 32, .n_kv_heads = 8, .max_position = 40960,
     .rope_theta = 1e6}},
    {"Qwen/Qwen3-30B-A3B", {.name = "qwen3-30b-a3b", .family = FERRY_FAMILY_QWEN3_MOE, QWEN3_LIKE,
     .n_layers = 48, .hidden = 2048, .intermediate = 6144, .n_heads = 32, .n_kv_heads = 4,
     .max_position = 40960, .rope_theta = 1e6, .n_experts = 128, .experts_per_token = 8,
     .expert_intermediate = 768, .norm_topk_prob = 1}},
    {"Qwen/Qwen3-235B-A22B", {.name = "qwen3-235b-a22b", .family = FERRY_FAMILY_QWEN3_MOE, QWEN3_LIKE,
     .n_layers = 94, .hidden = 4096, .intermediate = 12288, .n_heads = 64, .n_kv_heads = 4,
     .max_position = 40960, .rope_theta = 1e6, .n_experts = 128, .experts_per_token = 8,
     .expert_intermediate = 1536, .norm_topk_prob = 1}},
    /* deepseek-ai/DeepSeek-V2-Lite, DeepSeek-V3 (fp8 with 128 x 128 block scales, as published) */
    {"deepseek-ai/DeepSeek-V2-Lite", {.name = "deepseek-v2-lite", .family = FERRY_FAMILY_DEEPSEEK_V2,
     DEEPSEEK_LIKE, .n_layers = 27, .hidden = 2048, .intermediate = 10944, .n_heads = 16, .n_kv_heads = 16,
     .vocab = 102400, .n_experts = 64, .experts_per_token = 6, .expert_intermediate = 1408,
     .n_shared_experts = 2, .shared_intermediate = 2816, .first_dense_layers = 1,
     .router = FERRY_ROUTER_SOFTMAX_GROUP, .n_group = 1, .topk_group = 1, .routed_scaling = 1.0,
     DEEPSEEK_YARN(0.707)}},
    {"deepseek-ai/DeepSeek-V3", {.name = "deepseek-v3", .family = FERRY_FAMILY_DEEPSEEK_V3, DEEPSEEK_LIKE,
     .n_layers = 61, .hidden = 7168, .intermediate = 18432, .n_heads = 128, .n_kv_heads = 128,
     .vocab = 129280, .q_lora_rank = 1536, .n_experts = 256, .experts_per_token = 8,
     .expert_intermediate = 2048, .n_shared_experts = 1, .shared_intermediate = 2048,
     .first_dense_layers = 3, .norm_topk_prob = 1, .router = FERRY_ROUTER_SIGMOID_GROUP,
     .router_score_bias = 1, .n_group = 8, .topk_group = 4, .routed_scaling = 2.5, DEEPSEEK_YARN(1.0),
     .quant = {.kind = FERRY_CKPT_FP8_BLOCK, .bits = 8, .block = {128, 128}}}},
    /* openai/gpt-oss-20b, gpt-oss-120b (MXFP4 experts, as published) */
    {"openai/gpt-oss-20b", {.name = "gpt-oss-20b", GPT_OSS_LIKE, .n_layers = 24, .n_experts = 32}},
    {"openai/gpt-oss-120b", {.name = "gpt-oss-120b", GPT_OSS_LIKE, .n_layers = 36, .n_experts = 128}},
    /* meta-llama/Llama-4-Scout-17B-16E (text model; the vision tower counts in the total) */
    {"meta-llama/Llama-4-Scout-17B-16E", {.name = "llama-4-scout-17b-16e", .family = FERRY_FAMILY_LLAMA4,
     LLAMA_LIKE, .n_layers = 48, .hidden = 5120, .intermediate = 16384, .n_heads = 40, .n_kv_heads = 8,
     .head_dim = 128, .vocab = 202048, .max_position = 262144, .n_experts = 16, .experts_per_token = 1,
     .expert_intermediate = 8192, .n_shared_experts = 1, .shared_intermediate = 8192,
     .router = FERRY_ROUTER_SIGMOID_TOP1, .expert_scale_input = 1, .expert_layout = FERRY_EXPERTS_FUSED_HALVES,
     .qk_norm = FERRY_QK_NORM_L2, .rope_interleaved = 1, .rope_theta = 500000.0,
     .rope_scaling = {.type = FERRY_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                      .original_max_position = 8192},
     .norm_eps = 1e-5, .attn_chunk = 8192, .nope_layer_step = 4, .attn_temp_floor = 8192, .attn_temp_scale = 0.1,
     .multimodal_names = 1,
     .vision = {.kind = FERRY_VISION_LLAMA4, .hidden = 1408, .intermediate = 5632, .layers = 34, .heads = 16,
                .patch = 14, .image = 336, .channels = 3, .output_dim = 4096, .projector_in = 4096,
                .projector_out = 4096},
     .dtype = FERRY_DTYPE_BF16}},
    /* microsoft/Phi-3.5-MoE-instruct */
    {"microsoft/Phi-3.5-MoE-instruct", {.name = "phi-3.5-moe", .family = FERRY_FAMILY_PHIMOE,
     .norm = FERRY_NORM_LAYER, .act = FERRY_ACT_SWIGLU, .n_layers = 32, .hidden = 4096, .n_heads = 32,
     .n_kv_heads = 8, .head_dim = 128, .vocab = 32064, .max_position = 131072, .n_experts = 16,
     .experts_per_token = 2, .expert_intermediate = 6400, .qkv_bias = 1, .attn_out_bias = 1,
     .lm_head_bias = 1, .sliding_window = 131072, .router = FERRY_ROUTER_SPARSEMIXER,
     .router_jitter = 0.01, .norm_eps = 1e-5, .rope_theta = 10000.0,
     .rope_scaling = {.type = FERRY_ROPE_LONGROPE, .original_max_position = 4096,
                      .n_factors = 64, .short_factor = PHI_SHORT, .long_factor = PHI_LONG,
                      .short_mscale = 1.243163121016122, .long_mscale = 1.243163121016122},
     .dtype = FERRY_DTYPE_BF16}},
    /* google/gemma-2-9b, gemma-3-27b-it (text model; the SigLIP tower counts in the total) */
    {"google/gemma-2-9b", {.name = "gemma-2-9b", .family = FERRY_FAMILY_GEMMA2, GEMMA_LIKE, .n_layers = 42,
     .hidden = 3584, .intermediate = 14336, .n_heads = 16, .n_kv_heads = 8, .head_dim = 256, .vocab = 256000,
     .max_position = 8192, .rope_theta = 10000.0, .query_pre_attn_scalar = 256, .attn_softcap = 50,
     .final_softcap = 30, .sliding_window = 4096, .sliding_pattern = 2}},
    {"google/gemma-3-27b-it", {.name = "gemma-3-27b", .family = FERRY_FAMILY_GEMMA3, GEMMA_LIKE, .n_layers = 62,
     .hidden = 5376, .intermediate = 21504, .n_heads = 32, .n_kv_heads = 16, .head_dim = 128, .vocab = 262208,
     .max_position = 131072, .rope_theta = 1e6, .rope_local_theta = 10000.0,
     .rope_scaling = {.type = FERRY_ROPE_LINEAR, .factor = 8}, .query_pre_attn_scalar = 168,
     .sliding_window = 1024, .sliding_pattern = 6, .qk_norm = FERRY_QK_NORM_HEAD, .multimodal_names = 1,
     .vision = {.kind = FERRY_VISION_SIGLIP, .hidden = 1152, .intermediate = 4304, .layers = 27, .heads = 16,
                .patch = 14, .image = 896, .channels = 3}}},
    /* EleutherAI/gpt-neox-20b, bigscience/bloom */
    {"EleutherAI/gpt-neox-20b", {.name = "gpt-neox-20b", .family = FERRY_FAMILY_GPT_NEOX, FUSED_QKV_LIKE,
     .n_layers = 44, .hidden = 6144, .intermediate = 24576, .n_heads = 64, .n_kv_heads = 64, .head_dim = 96,
     .vocab = 50432, .max_position = 2048, .rope_theta = 10000.0, .rotary_dim = 24, .parallel_residual = 1,
     .dtype = FERRY_DTYPE_F16}},
    /* EleutherAI/gpt-j-6b (its main branch is fp32) */
    {"EleutherAI/gpt-j-6b", {.name = "gpt-j-6b", .family = FERRY_FAMILY_GPTJ, .norm = FERRY_NORM_LAYER,
     .act = FERRY_ACT_GELU_TANH, .ffn_bias = 1, .lm_head_bias = 1, .norm_eps = 1e-5, .n_layers = 28,
     .hidden = 4096, .intermediate = 16384, .n_heads = 16, .n_kv_heads = 16, .head_dim = 256, .vocab = 50400,
     .max_position = 2048, .rope_theta = 10000.0, .rotary_dim = 64, .rope_interleaved = 1,
     .parallel_residual = 1, .parallel_shared_norm = 1, .dtype = FERRY_DTYPE_F32}},
    {"bigscience/bloom", {.name = "bloom-176b", .family = FERRY_FAMILY_BLOOM, FUSED_QKV_LIKE, .n_layers = 70,
     .hidden = 14336, .intermediate = 57344, .n_heads = 112, .n_kv_heads = 112, .head_dim = 128,
     .vocab = 250880, .max_position = 2048, .alibi = 1, .embed_norm = 1, .tied_embeddings = 1,
     .dtype = FERRY_DTYPE_BF16}},
};

#define N_PRESETS (sizeof presets / sizeof presets[0])

size_t ferry_model_preset_count(void) { return N_PRESETS; }

const char *ferry_model_preset_name(size_t i) { return i < N_PRESETS ? presets[i].cfg.name : NULL; }

const char *ferry_model_preset_hf_id(size_t i) { return i < N_PRESETS ? presets[i].hf_id : NULL; }

/* Catalogue name, Hugging Face id, or the id's last part, all without regard to case. */
static const struct preset *resolve(const char *name) {
  if (!name || !*name) return NULL;
  for (size_t i = 0; i < N_PRESETS; i++)
    if (!strcasecmp(presets[i].cfg.name, name)) return &presets[i];
  for (size_t i = 0; i < N_PRESETS; i++) {
    const char *id = presets[i].hf_id;
    if (!*id) continue;
    const char *base = strrchr(id, '/');
    if (!strcasecmp(id, name) || (base && !strcasecmp(base + 1, name))) return &presets[i];
  }
  return NULL;
}

const char *ferry_model_preset_resolve(const char *name) {
  const struct preset *p = resolve(name);
  return p ? p->cfg.name : NULL;
}

const struct ferry_model_config *ferry__model_preset_find(const char *name) {
  const struct preset *p = resolve(name);
  return p ? &p->cfg : NULL;
}
