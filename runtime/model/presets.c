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

static const struct ferry_model_config presets[] = {
    /* Tiny shapes for tests: F32, vocab 256 so the layers hold most of the bytes. */
    {.name = "tiny-dense", .family = FERRY_FAMILY_LLAMA, LLAMA_LIKE, .n_layers = 8, .hidden = 128,
     .intermediate = 352, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32, .vocab = 256,
     .max_position = 2048, .norm_eps = 1e-5, .rope_theta = 10000.0, .dtype = FERRY_DTYPE_F32},
    {.name = "tiny-moe", .family = FERRY_FAMILY_MIXTRAL, LLAMA_LIKE, .n_layers = 6, .hidden = 128,
     .n_heads = 4, .n_kv_heads = 2, .head_dim = 32, .vocab = 256, .max_position = 2048,
     .n_experts = 8, .experts_per_token = 2, .expert_intermediate = 192, .norm_topk_prob = 1,
     .norm_eps = 1e-5, .rope_theta = 1e6, .dtype = FERRY_DTYPE_F32},
    {.name = "tiny-qwen2-moe", .family = FERRY_FAMILY_QWEN2_MOE, LLAMA_LIKE, .n_layers = 4,
     .hidden = 128, .intermediate = 192, .n_heads = 4, .n_kv_heads = 4, .head_dim = 32,
     .vocab = 256, .max_position = 2048, .n_experts = 8, .experts_per_token = 2,
     .expert_intermediate = 96, .n_shared_experts = 1, .shared_intermediate = 192,
     .shared_expert_gate = 1, .qkv_bias = 1, .norm_eps = 1e-6, .rope_theta = 1e6,
     .dtype = FERRY_DTYPE_F32},
    {.name = "tiny-olmoe", .family = FERRY_FAMILY_OLMOE, LLAMA_LIKE, .n_layers = 4, .hidden = 128,
     .n_heads = 4, .n_kv_heads = 4, .head_dim = 32, .vocab = 256, .max_position = 2048,
     .n_experts = 8, .experts_per_token = 2, .expert_intermediate = 96, .qk_norm = 1,
     .norm_eps = 1e-5, .rope_theta = 10000.0, .dtype = FERRY_DTYPE_F32},

    /* meta-llama/Llama-2-7b-hf, Llama-2-70b-hf, Meta-Llama-3-8B */
    {.name = "llama-2-7b", .family = FERRY_FAMILY_LLAMA, LLAMA_LIKE, .n_layers = 32,
     .hidden = 4096, .intermediate = 11008, .n_heads = 32, .n_kv_heads = 32, .head_dim = 128,
     .vocab = 32000, .max_position = 4096, .norm_eps = 1e-5, .rope_theta = 10000.0,
     .dtype = FERRY_DTYPE_F16},
    {.name = "llama-2-70b", .family = FERRY_FAMILY_LLAMA, LLAMA_LIKE, .n_layers = 80,
     .hidden = 8192, .intermediate = 28672, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128,
     .vocab = 32000, .max_position = 4096, .norm_eps = 1e-5, .rope_theta = 10000.0,
     .dtype = FERRY_DTYPE_F16},
    {.name = "llama-3-8b", .family = FERRY_FAMILY_LLAMA, LLAMA_LIKE, .n_layers = 32,
     .hidden = 4096, .intermediate = 14336, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
     .vocab = 128256, .max_position = 8192, .norm_eps = 1e-5, .rope_theta = 500000.0,
     .dtype = FERRY_DTYPE_BF16},
    /* mistralai/Mixtral-8x7B-v0.1 (intermediate_size there is the expert size) */
    {.name = "mixtral-8x7b", .family = FERRY_FAMILY_MIXTRAL, LLAMA_LIKE, .n_layers = 32,
     .hidden = 4096, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .vocab = 32000,
     .max_position = 32768, .n_experts = 8, .experts_per_token = 2, .expert_intermediate = 14336,
     .norm_topk_prob = 1, .norm_eps = 1e-5, .rope_theta = 1e6, .dtype = FERRY_DTYPE_BF16},
    /* Qwen/Qwen1.5-MoE-A2.7B */
    {.name = "qwen1.5-moe-a2.7b", .family = FERRY_FAMILY_QWEN2_MOE, LLAMA_LIKE, .n_layers = 24,
     .hidden = 2048, .intermediate = 5632, .n_heads = 16, .n_kv_heads = 16, .head_dim = 128,
     .vocab = 151936, .max_position = 8192, .n_experts = 60, .experts_per_token = 4,
     .expert_intermediate = 1408, .n_shared_experts = 1, .shared_intermediate = 5632,
     .shared_expert_gate = 1, .qkv_bias = 1, .norm_eps = 1e-6, .rope_theta = 1e6,
     .dtype = FERRY_DTYPE_BF16},
    /* allenai/OLMoE-1B-7B-0924 (intermediate_size there is the expert size) */
    {.name = "olmoe-1b-7b", .family = FERRY_FAMILY_OLMOE, LLAMA_LIKE, .n_layers = 16,
     .hidden = 2048, .n_heads = 16, .n_kv_heads = 16, .head_dim = 128, .vocab = 50304,
     .max_position = 4096, .n_experts = 64, .experts_per_token = 8, .expert_intermediate = 1024,
     .qk_norm = 1, .norm_eps = 1e-5, .rope_theta = 10000.0, .dtype = FERRY_DTYPE_BF16},
    /* facebook/opt-6.7b, opt-30b; OPT-175B as published in the OPT paper / metaseq */
    {.name = "opt-6.7b", OPT_LIKE, .n_layers = 32, .hidden = 4096, .intermediate = 16384,
     .n_heads = 32, .n_kv_heads = 32, .head_dim = 128},
    {.name = "opt-30b", OPT_LIKE, .n_layers = 48, .hidden = 7168, .intermediate = 28672,
     .n_heads = 56, .n_kv_heads = 56, .head_dim = 128},
    {.name = "opt-175b", OPT_LIKE, .n_layers = 96, .hidden = 12288, .intermediate = 49152,
     .n_heads = 96, .n_kv_heads = 96, .head_dim = 128},
};

#define N_PRESETS (sizeof presets / sizeof presets[0])

size_t ferry_model_preset_count(void) { return N_PRESETS; }

const char *ferry_model_preset_name(size_t i) { return i < N_PRESETS ? presets[i].name : NULL; }

const struct ferry_model_config *ferry__model_preset_find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < N_PRESETS; i++)
    if (!strcasecmp(presets[i].name, name)) return &presets[i]; /* "Mixtral-8x7B" is mixtral-8x7b */
  return NULL;
}
