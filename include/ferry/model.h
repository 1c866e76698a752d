/**
 * @file model.h
 * @brief Model descriptions: the catalogue of presets, Hugging Face `config.json` reading,
 *        the tensor layout with Hugging Face names, and accounting (parameters, bytes, KV-cache
 *        bytes and FLOPs per layer, expert and token).
 *
 * A ferry_model is shapes only: it never holds weights. Weights live in a ferry_store.
 */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Architecture family; decides tensor names and the math the host executor runs. */
enum ferry_family {
  FERRY_FAMILY_LLAMA,       /**< Llama 2/3 (`model_type` "llama") */
  FERRY_FAMILY_MISTRAL,     /**< Mistral ("mistral"), Llama-shaped */
  FERRY_FAMILY_MIXTRAL,     /**< Mixtral ("mixtral"): routed experts w1/w2/w3 */
  FERRY_FAMILY_QWEN2,       /**< Qwen2 ("qwen2"): q/k/v biases */
  FERRY_FAMILY_QWEN2_MOE,   /**< Qwen2-MoE / Qwen1.5-MoE ("qwen2_moe"): shared expert with gate */
  FERRY_FAMILY_OLMOE,       /**< OLMoE ("olmoe"): q/k RMSNorm, 64 experts */
  FERRY_FAMILY_OPT,         /**< OPT ("opt"): LayerNorm, ReLU, learned positions; simulation only */
  FERRY_FAMILY_QWEN3,       /**< Qwen3 ("qwen3"): RMSNorm of q and k per head */
  FERRY_FAMILY_QWEN3_MOE,   /**< Qwen3-MoE ("qwen3_moe"): routed experts, no shared expert */
  FERRY_FAMILY_GEMMA2,      /**< Gemma 2 ("gemma2"): soft-capping, sliding/global layers, GeGLU */
  FERRY_FAMILY_GEMMA3,      /**< Gemma 3 text ("gemma3_text", or the text part of "gemma3") */
  FERRY_FAMILY_PHIMOE,      /**< Phi-3.5-MoE ("phimoe"): LayerNorm, sparsemixer top-2 */
  FERRY_FAMILY_GPT_NEOX,    /**< GPT-NeoX ("gpt_neox"): parallel residual, partial rotary */
  FERRY_FAMILY_LLAMA4,      /**< Llama 4 text ("llama4_text", or the text part of "llama4") */
  FERRY_FAMILY_DEEPSEEK_V2, /**< DeepSeek-V2 ("deepseek_v2"): multi-head latent attention */
  FERRY_FAMILY_DEEPSEEK_V3, /**< DeepSeek-V3 ("deepseek_v3"): MLA, sigmoid routing with bias */
  FERRY_FAMILY_GPT_OSS,     /**< gpt-oss ("gpt_oss"): attention sinks, clamped SwiGLU experts */
  FERRY_FAMILY_BLOOM,       /**< BLOOM ("bloom"): ALiBi, LayerNorm after the embedding */
  FERRY_FAMILY_GPTJ         /**< GPT-J ("gptj"): parallel residual over one LayerNorm, interleaved
                                 partial rotary, biased FFN and head */
};

/** Normalisation kind. */
enum ferry_norm_kind {
  FERRY_NORM_RMS,  /**< RMSNorm (weight only) */
  FERRY_NORM_LAYER /**< LayerNorm (weight and bias) */
};

/** Feed-forward activation. */
enum ferry_act_kind {
  FERRY_ACT_SWIGLU,    /**< down(silu(gate(x)) * up(x)) */
  FERRY_ACT_GELU,      /**< fc2(gelu(fc1(x))), exact (erf) GELU */
  FERRY_ACT_RELU,      /**< fc2(relu(fc1(x))) */
  FERRY_ACT_GEGLU,     /**< down(gelu_tanh(gate(x)) * up(x)) (Gemma) */
  FERRY_ACT_GELU_TANH  /**< fc2(gelu_tanh(fc1(x))), tanh-approximated GELU (GPT-NeoX, BLOOM) */
};

/** How q and k are normalised after their projections (the config's `qk_norm` field). */
enum ferry_qk_norm {
  FERRY_QK_NORM_NONE = 0, /**< none */
  FERRY_QK_NORM_FULL = 1, /**< RMSNorm over all heads at once, weight [heads x head_dim] (OLMoE) */
  FERRY_QK_NORM_HEAD = 2, /**< RMSNorm of each head, weight [head_dim] (Qwen3, Gemma 3) */
  FERRY_QK_NORM_L2 = 3    /**< RMS normalisation of each head without a weight, on RoPE layers (Llama 4) */
};

/** RoPE frequency scaling, as transformers' `rope_type`. */
enum ferry_rope_type {
  FERRY_ROPE_DEFAULT,  /**< inv_freq = theta^(-2i/d) */
  FERRY_ROPE_LINEAR,   /**< position interpolation: inv_freq / factor */
  FERRY_ROPE_DYNAMIC,  /**< dynamic NTK: theta grows once a sequence passes the original length */
  FERRY_ROPE_YARN,     /**< YaRN: ramp between interpolation and extrapolation, attention factor */
  FERRY_ROPE_LLAMA3,   /**< Llama 3.1: low/high frequency factors */
  FERRY_ROPE_LONGROPE  /**< Phi-3 LongRoPE: per-frequency short and long factors */
};

/** Most per-frequency factors LongRoPE carries (head_dim / 2 at most). */
#define FERRY_ROPE_MAX_FACTORS 256

/** RoPE scaling parameters (`rope_scaling` / `rope_parameters` of a config.json). */
struct ferry_rope_scaling {
  enum ferry_rope_type type;     /**< scaling kind */
  double factor;                 /**< scaling factor (linear, dynamic, yarn, llama3, longrope) */
  int64_t original_max_position; /**< pre-training context (yarn, llama3, dynamic, longrope); 0 = max_position */
  double low_freq_factor;        /**< llama3 */
  double high_freq_factor;       /**< llama3 */
  double beta_fast;              /**< yarn (0 = 32) */
  double beta_slow;              /**< yarn (0 = 1) */
  double mscale;                 /**< yarn / DeepSeek (0 = absent) */
  double mscale_all_dim;         /**< yarn / DeepSeek (0 = absent); DeepSeek also scales the softmax by it */
  double attention_factor;       /**< yarn / longrope explicit attention factor (0 = derived) */
  int no_truncate;               /**< yarn: keep the correction range fractional (`truncate`: false, gpt-oss) */
  int32_t n_factors;             /**< longrope: entries of short_factor and long_factor (head_dim / 2) */
  float short_factor[FERRY_ROPE_MAX_FACTORS]; /**< longrope factors up to the original context */
  float long_factor[FERRY_ROPE_MAX_FACTORS];  /**< longrope factors beyond it */
  double short_mscale;           /**< longrope attention factor up to the original context (0 = derived) */
  double long_mscale;            /**< longrope attention factor beyond it (0 = derived) */
};

/** Routed-expert gate (router) semantics. */
enum ferry_router_kind {
  FERRY_ROUTER_SOFTMAX_TOPK,   /**< softmax over all experts, top-k, optional renormalisation */
  FERRY_ROUTER_TOPK_SOFTMAX,   /**< top-k of the logits, softmax over those k (gpt-oss) */
  FERRY_ROUTER_SIGMOID_GROUP,  /**< sigmoid scores, bias-corrected group-limited top-k (DeepSeek-V3) */
  FERRY_ROUTER_SOFTMAX_GROUP,  /**< softmax, group-limited greedy top-k (DeepSeek-V2) */
  FERRY_ROUTER_SIGMOID_TOP1,   /**< top-k of the logits weighted by their sigmoid (Llama 4) */
  FERRY_ROUTER_SPARSEMIXER     /**< sparsemixer top-2 (Phi-3.5-MoE) */
};

/** How a layer's routed experts are stored in a checkpoint. */
enum ferry_expert_layout {
  FERRY_EXPERTS_SPLIT,          /**< gate, up and down per expert, each [out, in] */
  FERRY_EXPERTS_FUSED_HALVES,   /**< gate_up_proj [E, hidden, 2I] (gate then up) and down_proj
                                     [E, I, hidden], stored [in, out] (Llama 4) */
  FERRY_EXPERTS_FUSED_INTERLEAVED /**< gate_up_proj [E, hidden, 2I] with gate and up columns
                                       alternating, down_proj [E, I, hidden], biases, clamped
                                       SwiGLU (gpt-oss) */
};

/** How a checkpoint stores its quantized weights (its `quantization_config`). */
enum ferry_ckpt_quant {
  FERRY_CKPT_NONE,       /**< plain dtype */
  FERRY_CKPT_FP8_BLOCK,  /**< fp8 e4m3 with fp32 block scales "weight_scale_inv" (DeepSeek-V3) */
  FERRY_CKPT_MXFP4,      /**< OCP MXFP4: "_blocks" (2 values a byte) and "_scales" (E8M0 per 32) */
  FERRY_CKPT_GPTQ,       /**< GPTQ: qweight/qzeros (int32-packed), fp16 scales, g_idx */
  FERRY_CKPT_AWQ,        /**< AWQ (GEMM): qweight/qzeros packed along the output, fp16 scales */
  FERRY_CKPT_COMPRESSED  /**< compressed-tensors pack-quantized: weight_packed, weight_scale (+ zero point) */
};

/** Published quantization of a checkpoint. */
struct ferry_ckpt_quant_config {
  enum ferry_ckpt_quant kind; /**< format */
  int32_t bits;               /**< bits per weight (4 for GPTQ/AWQ/compressed int4, 4 for MXFP4, 8 for FP8) */
  int64_t group_size;         /**< values per scale along the input (GPTQ/AWQ/compressed; 32 for MXFP4) */
  int64_t block[2];           /**< FP8 block shape [out, in] (128 x 128) */
  int symmetric;              /**< 1: no zero points (compressed-tensors symmetric, GPTQ sym) */
  int desc_act;               /**< GPTQ act-order: g_idx permutes groups */
  int experts_only;           /**< only routed expert weights are quantized (gpt-oss MXFP4) */
};

/** Vision tower of a multimodal checkpoint (its `vision_config`), for parameter accounting. */
enum ferry_vision_kind {
  FERRY_VISION_NONE,   /**< text-only checkpoint */
  FERRY_VISION_SIGLIP, /**< SigLIP encoder + Gemma 3 projector */
  FERRY_VISION_LLAMA4  /**< Llama 4 vision encoder + pixel-shuffle adapter + projector */
};

/** Shape of a vision tower (fields as in its config.json; unused ones 0). */
struct ferry_vision_config {
  enum ferry_vision_kind kind; /**< which encoder */
  int64_t hidden;              /**< hidden_size */
  int64_t intermediate;        /**< intermediate_size */
  int64_t layers;              /**< num_hidden_layers */
  int64_t heads;               /**< num_attention_heads */
  int64_t patch;               /**< patch_size */
  int64_t image;               /**< image_size */
  int64_t channels;            /**< num_channels */
  int64_t output_dim;          /**< vision_output_dim (Llama 4) */
  int64_t projector_in;        /**< projector_input_dim (Llama 4) */
  int64_t projector_out;       /**< projector_output_dim (Llama 4) */
};

/** The shape of a transformer. Integer fields are counts; zero means "not present". */
struct ferry_model_config {
  char name[64];                 /**< preset name or the `_name_or_path`/folder it came from */
  enum ferry_family family;      /**< architecture family */
  int64_t n_layers;              /**< transformer layers */
  int64_t hidden;                /**< hidden size (d_model) */
  int64_t intermediate;          /**< dense FFN size (dense models and Qwen2-MoE's base size; 0 for
                                      Mixtral and OLMoE, whose routed size is expert_intermediate) */
  int64_t n_heads;               /**< attention heads */
  int64_t n_kv_heads;            /**< key/value heads (grouped-query attention); = n_heads for MHA */
  int64_t head_dim;              /**< per-head dimension */
  int64_t vocab;                 /**< vocabulary size */
  int64_t max_position;          /**< max_position_embeddings */
  int64_t n_experts;             /**< routed experts per layer; 0 for dense models */
  int64_t experts_per_token;     /**< top-k routed experts per token */
  int64_t expert_intermediate;   /**< FFN size of one routed expert */
  int64_t n_shared_experts;      /**< shared (always active) experts per layer */
  int64_t shared_intermediate;   /**< FFN size of the shared expert (all shared experts fused) */
  int shared_expert_gate;        /**< 1 if a sigmoid gate scales the shared expert (Qwen2-MoE) */
  int norm_topk_prob;            /**< 1 if the top-k gate weights are renormalised to sum to 1 */
  int tied_embeddings;           /**< 1 if the output head reuses the input embedding */
  int qkv_bias;                  /**< 1 if q/k/v projections have biases (Qwen2) */
  int attn_out_bias;             /**< 1 if the output projection has a bias (OPT) */
  int ffn_bias;                  /**< 1 if FFN projections have biases (OPT) */
  int qk_norm;                   /**< q/k normalisation after projection (enum ferry_qk_norm) */
  int learned_positions;         /**< 1 for learned absolute positions (OPT), 0 for RoPE */
  enum ferry_norm_kind norm;     /**< normalisation */
  enum ferry_act_kind act;       /**< FFN activation */
  double norm_eps;               /**< epsilon of the norms */
  double rope_theta;             /**< RoPE base */
  int64_t sliding_window;        /**< attention window in tokens; 0 = full attention */
  enum ferry_dtype dtype;        /**< dtype of the weights as published (unquantized tensors) */
  /* Families of 2024-26. Zero keeps the behaviour of the families above. */
  int64_t first_dense_layers;    /**< leading layers with a dense FFN of size `intermediate` in an
                                      MoE model (DeepSeek first_k_dense_replace) */
  int64_t moe_layer_step;        /**< MoE only on layers with (l + 1) % step == 0 (Qwen
                                      decoder_sparse_step, Llama 4 interleave_moe_layer_step);
                                      0 or 1 = every layer past first_dense_layers */
  int64_t sliding_pattern;       /**< with sliding_window: layer l is global when
                                      (l + 1) % pattern == 0, windowed otherwise; 0 = all windowed */
  double rope_local_theta;       /**< RoPE base of windowed layers (Gemma 3); 0 = rope_theta */
  int64_t rotary_dim;            /**< dimensions of a head that RoPE rotates (GPT-NeoX rotary_pct);
                                      0 = head_dim (MLA: qk_rope_dim) */
  int rope_interleaved;          /**< RoPE rotates pairs (2i, 2i+1) instead of halves (DeepSeek, Llama 4) */
  struct ferry_rope_scaling rope_scaling; /**< RoPE scaling (global layers only for Gemma 3) */
  int norm_unit_offset;          /**< RMSNorm multiplies by (1 + w) (Gemma) */
  int sandwich_norms;            /**< extra norms on the attention and FFN outputs before the residual add (Gemma) */
  int scale_embeddings;          /**< embeddings multiplied by sqrt(hidden) (Gemma) */
  double query_pre_attn_scalar;  /**< attention scale is 1/sqrt(this) (Gemma); 0 = head_dim */
  double attn_softcap;           /**< attention logits soft-capped: c * tanh(s / c); 0 = off (Gemma 2) */
  double final_softcap;          /**< output logits soft-capped likewise; 0 = off (Gemma 2) */
  int parallel_residual;         /**< x + attn(ln1(x)) + ffn(ln2(x)) (GPT-NeoX) */
  int parallel_shared_norm;      /**< with parallel_residual: x + attn(ln1(x)) + ffn(ln1(x)), one norm
                                      for both (GPT-J) */
  int fused_qkv;                 /**< one query_key_value weight, per head [q; k; v] (GPT-NeoX, BLOOM) */
  int embed_norm;                /**< LayerNorm on the embeddings (BLOOM) */
  int alibi;                     /**< ALiBi biases instead of positional embeddings (BLOOM) */
  int attn_sinks;                /**< a learned sink logit per head joins each softmax (gpt-oss) */
  int64_t attn_chunk;            /**< chunked local attention on RoPE layers (Llama 4); 0 = off */
  int64_t nope_layer_step;       /**< every step-th layer has no RoPE, attends globally (Llama 4); 0 = off */
  double attn_temp_floor;        /**< Llama 4 NoPE-layer query temperature: 1 + scale * log1p(floor((p+1)/floor)); 0 = off */
  double attn_temp_scale;        /**< scale of that temperature */
  int lm_head_bias;              /**< the output head has a bias (Phi-3.5-MoE) */
  int64_t q_lora_rank;           /**< MLA: rank of the query compression; 0 = direct q_proj */
  int64_t kv_lora_rank;          /**< MLA: rank of the compressed KV (the latent cache); 0 = no MLA */
  int64_t qk_nope_dim;           /**< MLA: per-head query/key dimensions without RoPE */
  int64_t qk_rope_dim;           /**< MLA: per-head query/key dimensions with RoPE (key shared by heads) */
  int64_t v_head_dim;            /**< MLA: per-head value dimension */
  enum ferry_router_kind router; /**< gate semantics */
  int router_bias;               /**< the router has a bias (gpt-oss) */
  int router_score_bias;         /**< selection bias e_score_correction_bias (DeepSeek-V3) */
  int64_t n_group;               /**< group-limited routing: expert groups (1 = off) */
  int64_t topk_group;            /**< group-limited routing: groups a token may use */
  double routed_scaling;         /**< routed experts' weights multiplied by this (0 = 1) */
  double router_jitter;          /**< sparsemixer threshold epsilon (Phi-3.5-MoE router_jitter_noise) */
  int expert_scale_input;        /**< the routing weight scales the expert's input, not its output (Llama 4) */
  enum ferry_expert_layout expert_layout; /**< how routed experts are stored */
  double swiglu_limit;           /**< clamped SwiGLU of gpt-oss experts (0 = plain SwiGLU) */
  struct ferry_ckpt_quant_config quant; /**< quantization as published */
  struct ferry_vision_config vision; /**< vision tower of a multimodal checkpoint: counted in the
                                          totals (params_extra), never loaded */
  int multimodal_names;          /**< tensor names begin with "language_model." (multimodal checkpoints) */
};

/** What a tensor is, independent of the family's naming. */
enum ferry_tensor_role {
  FERRY_ROLE_EMBED,            /**< token embedding [vocab, hidden] */
  FERRY_ROLE_POS_EMBED,        /**< learned positions [max_position + offset, hidden] (OPT) */
  FERRY_ROLE_ATTN_NORM,        /**< pre-attention norm weight [hidden] */
  FERRY_ROLE_ATTN_NORM_BIAS,   /**< pre-attention LayerNorm bias [hidden] */
  FERRY_ROLE_ATTN_Q,           /**< [n_heads*head_dim, hidden] */
  FERRY_ROLE_ATTN_Q_BIAS,      /**< [n_heads*head_dim] */
  FERRY_ROLE_ATTN_K,           /**< [n_kv_heads*head_dim, hidden] */
  FERRY_ROLE_ATTN_K_BIAS,      /**< [n_kv_heads*head_dim] */
  FERRY_ROLE_ATTN_V,           /**< [n_kv_heads*head_dim, hidden] */
  FERRY_ROLE_ATTN_V_BIAS,      /**< [n_kv_heads*head_dim] */
  FERRY_ROLE_ATTN_O,           /**< [hidden, n_heads*head_dim] */
  FERRY_ROLE_ATTN_O_BIAS,      /**< [hidden] */
  FERRY_ROLE_Q_NORM,           /**< q RMSNorm weight [n_heads*head_dim] (OLMoE) */
  FERRY_ROLE_K_NORM,           /**< k RMSNorm weight [n_kv_heads*head_dim] (OLMoE) */
  FERRY_ROLE_FFN_NORM,         /**< pre-FFN norm weight [hidden] */
  FERRY_ROLE_FFN_NORM_BIAS,    /**< pre-FFN LayerNorm bias [hidden] */
  FERRY_ROLE_FFN_GATE,         /**< dense gate projection [intermediate, hidden] */
  FERRY_ROLE_FFN_UP,           /**< dense up projection / fc1 [intermediate, hidden] */
  FERRY_ROLE_FFN_UP_BIAS,      /**< fc1 bias [intermediate] */
  FERRY_ROLE_FFN_DOWN,         /**< dense down projection / fc2 [hidden, intermediate] */
  FERRY_ROLE_FFN_DOWN_BIAS,    /**< fc2 bias [hidden] */
  FERRY_ROLE_ROUTER,           /**< router [n_experts, hidden] */
  FERRY_ROLE_EXPERT_GATE,      /**< routed expert gate (Mixtral w1) [expert_intermediate, hidden] */
  FERRY_ROLE_EXPERT_UP,        /**< routed expert up (Mixtral w3) [expert_intermediate, hidden] */
  FERRY_ROLE_EXPERT_DOWN,      /**< routed expert down (Mixtral w2) [hidden, expert_intermediate] */
  FERRY_ROLE_SHARED_GATE,      /**< shared expert gate proj [shared_intermediate, hidden] */
  FERRY_ROLE_SHARED_UP,        /**< shared expert up proj [shared_intermediate, hidden] */
  FERRY_ROLE_SHARED_DOWN,      /**< shared expert down proj [hidden, shared_intermediate] */
  FERRY_ROLE_SHARED_EXPERT_GATE, /**< sigmoid gate of the shared expert [1, hidden] */
  FERRY_ROLE_FINAL_NORM,       /**< final norm weight [hidden] */
  FERRY_ROLE_FINAL_NORM_BIAS,  /**< final LayerNorm bias [hidden] */
  FERRY_ROLE_LM_HEAD,          /**< output head [vocab, hidden]; absent when tied */
  FERRY_ROLE_ATTN_QKV,         /**< fused query_key_value [3 x heads x head_dim, hidden], per head q, k, v */
  FERRY_ROLE_ATTN_QKV_BIAS,    /**< its bias */
  FERRY_ROLE_POST_ATTN_NORM,   /**< norm of the attention output before the residual add (Gemma) */
  FERRY_ROLE_POST_FFN_NORM,    /**< norm of the FFN output before the residual add (Gemma) */
  FERRY_ROLE_EMBED_NORM,       /**< LayerNorm of the embeddings (BLOOM) */
  FERRY_ROLE_EMBED_NORM_BIAS,  /**< its bias */
  FERRY_ROLE_ATTN_SINKS,       /**< sink logit per head [heads] (gpt-oss) */
  FERRY_ROLE_MLA_Q_A,          /**< MLA q_a_proj [q_lora_rank, hidden] */
  FERRY_ROLE_MLA_Q_A_NORM,     /**< MLA q_a_layernorm [q_lora_rank] */
  FERRY_ROLE_MLA_Q_B,          /**< MLA q_b_proj [heads x (nope + rope), q_lora_rank] (q_proj when rank 0) */
  FERRY_ROLE_MLA_KV_A,         /**< MLA kv_a_proj_with_mqa [kv_lora_rank + rope, hidden] */
  FERRY_ROLE_MLA_KV_A_NORM,    /**< MLA kv_a_layernorm [kv_lora_rank] */
  FERRY_ROLE_MLA_KV_B,         /**< MLA kv_b_proj [heads x (nope + v), kv_lora_rank] */
  FERRY_ROLE_ROUTER_BIAS,      /**< router bias [n_experts] (gpt-oss) */
  FERRY_ROLE_ROUTER_SCORE_BIAS,/**< e_score_correction_bias [n_experts] (DeepSeek-V3) */
  FERRY_ROLE_EXPERT_GATE_UP,   /**< fused gate/up of one expert, a slice [hidden, 2I] of [E, hidden, 2I] */
  FERRY_ROLE_EXPERT_GATE_UP_BIAS, /**< its bias, a slice [2I] of [E, 2I] (gpt-oss) */
  FERRY_ROLE_EXPERT_DOWN_BIAS, /**< down bias, a slice [hidden] of [E, hidden] (gpt-oss) */
  FERRY_ROLE_LM_HEAD_BIAS,     /**< output head bias [vocab] (Phi-3.5-MoE) */
  FERRY_ROLE_COUNT             /**< number of roles, not a role */
};

/** One weight tensor of the layout, in file order. */
struct ferry_tensor_desc {
  char name[96];               /**< Hugging Face name, e.g. "model.layers.3.mlp.gate_proj.weight" */
  enum ferry_tensor_role role; /**< what it is */
  int32_t layer;               /**< layer index, or -1 for embeddings, final norm and head */
  int32_t expert;              /**< routed expert index, or -1 */
  int32_t ndim;                /**< 1 or 2 */
  int64_t shape[2];            /**< row-major shape as in the checkpoint ([out, in] for matrices) */
  uint64_t numel;              /**< shape[0] * shape[1] */
  int32_t slice;               /**< -1: the whole checkpoint tensor; else its index along the leading
                                    dimension of a checkpoint tensor [n_slices, shape...] (fused experts) */
  int32_t n_slices;            /**< leading dimension of that checkpoint tensor (0 when slice is -1) */
  int transposed;              /**< stored [in, out] (x . W), not [out, in] (fused experts) */
  int quantized;               /**< stored in the checkpoint's quantized format (config quant) */
  uint64_t bytes;              /**< bytes as published, quantization parts included */
};

/**
 * @brief KV-cache formats, one row each: X(ENUM, name, element dtype, bits per element, group).
 *        Append only. A plain format (group 0) stores each element in its dtype; a quantized one
 *        stores each row in chunks of a head's elements (MLA: the latent row), every group of
 *        `group` elements as codes of `bits` bits and one fp16 scale (symmetric, absmax / the
 *        code's largest value: 127 for int8, 7 for int4, 448 for fp8 e4m3), so a chunk holds
 *        its codes then its scales and the head size must be a multiple of the group.
 *        ferry_kv_format_row_bytes() sizes rows from this table; the engine, the host
 *        executor's attention, the simulator's pricing and `ferry model show` follow.
 */
#define FERRY_KV_FORMAT_MAP(X)               \
  X(FP32, "fp32", FERRY_DTYPE_F32, 32, 0)    \
  X(FP16, "fp16", FERRY_DTYPE_F16, 16, 0)    \
  X(BF16, "bf16", FERRY_DTYPE_BF16, 16, 0)   \
  X(FP8, "fp8", FERRY_DTYPE_F8_E4M3, 8, 32)  \
  X(INT8, "int8", FERRY_DTYPE_I8, 8, 32)     \
  X(INT4, "int4", FERRY_DTYPE_U8, 4, 32)

/** How the KV cache stores keys and values. */
enum ferry_kv_format {
  FERRY_KV_AUTO = 0, /**< the model's own dtype: fp32 for fp32 (and fp64) models, bf16 for bf16
                          models, fp16 otherwise (ferry_model_kv_format()) */
#define FERRY_KV_FORMAT_ENUM_(e, name, dtype, bits, group) FERRY_KV_##e,
  FERRY_KV_FORMAT_MAP(FERRY_KV_FORMAT_ENUM_)
#undef FERRY_KV_FORMAT_ENUM_
  FERRY_KV_FORMAT_COUNT /**< number of formats, not a format */
};

/** @brief Name of a KV format ("fp16", ...; "auto" for FERRY_KV_AUTO; "?" outside the enum). */
FERRY_API const char *ferry_kv_format_name(enum ferry_kv_format format);

/**
 * @brief Parse a KV format name: "fp32", "fp16", "bf16", "fp8", "int8", "int4" (or "auto").
 * @return FERRY_OK, or FERRY_ERR_INVALID with a message listing the names.
 */
FERRY_API ferry_status ferry_kv_format_parse(const char *text, enum ferry_kv_format *out);

/** @brief The element dtype executors store a format's cache in (FERRY_DTYPE_F32 for AUTO; the
 *         codes' type for a quantized format). */
FERRY_API enum ferry_dtype ferry_kv_format_dtype(enum ferry_kv_format format);

/** @brief Elements per scale of a quantized format; 0 for a plain one (and AUTO). */
FERRY_API int32_t ferry_kv_format_group(enum ferry_kv_format format);

/** @brief Bytes of one cache row of @p elements keys (or values) in @p format (AUTO: 0). */
FERRY_API uint64_t ferry_kv_format_row_bytes(enum ferry_kv_format format, uint64_t elements);

/** Parameter and byte accounting of a model (bytes at the model's dtype). */
struct ferry_model_accounting {
  uint64_t params_total;       /**< every parameter (tied head counted once; the vision tower of a
                                    multimodal checkpoint included) */
  uint64_t params_active;      /**< parameters touched per token: all but the unrouted experts */
  uint64_t params_embed;       /**< input embedding (+ learned positions) */
  uint64_t params_head;        /**< final norm + output head (0 head when tied) */
  uint64_t params_layer;       /**< the largest layer, all its experts included */
  uint64_t params_layer_dense; /**< the largest layer without its routed experts (attention,
                                    norms, router, shared expert, or a dense FFN) */
  uint64_t params_expert;      /**< one routed expert; 0 for dense models */
  uint64_t bytes_total;        /**< every tensor as published (dtype or quantized format) */
  uint64_t bytes_layer;        /**< the largest layer as published */
  uint64_t bytes_layer_dense;  /**< the largest dense part as published */
  uint64_t bytes_expert;       /**< one routed expert as published */
  uint64_t bytes_embed;        /**< the embedding as published */
  uint64_t bytes_head;         /**< final norm + head as published */
  uint64_t kv_bytes_per_token; /**< cache of every layer for one token at the model dtype: K and V,
                                    or MLA's compressed latent (kv_lora_rank + qk_rope_dim) */
  uint64_t params_active_no_embed; /**< params_active without the input embedding table (the
                                        convention of DeepSeek and OpenAI) */
  uint64_t params_extra;       /**< checkpoint parameters outside the text decoder (vision tower),
                                    included in params_total, never loaded */
  int64_t n_moe_layers;        /**< layers with routed experts */
};

/** What differs between the layers of one model. */
struct ferry_layer_info {
  int moe;             /**< routed experts (else a dense FFN of `intermediate`) */
  int64_t window;      /**< sliding window in tokens, 0 = none */
  int64_t chunk;       /**< chunked attention size in tokens, 0 = none */
  int rope;            /**< RoPE applied in this layer */
  int rope_local;      /**< RoPE of windowed layers (rope_local_theta, no scaling: Gemma 3) */
  uint64_t kv_bytes_per_token; /**< cache bytes per token of this layer at the model dtype */
  int64_t kv_visible;  /**< most earlier tokens one query sees (window or chunk), 0 = unbounded */
};

/** RoPE of one layer as a kernel needs it: every number that changes the rotation. */
struct ferry_rope_params {
  double theta;                        /**< base */
  int64_t dim;                         /**< rotated dimensions per head */
  int interleaved;                     /**< pairs (2i, 2i+1) instead of halves */
  int64_t max_position;                /**< config max_position_embeddings */
  struct ferry_rope_scaling scaling;   /**< scaling (type DEFAULT: none) */
};

/** Opaque model description (shapes only). */
typedef struct ferry_model ferry_model;

/**
 * @brief Open a model description from a catalogue preset name, a folder holding a Hugging
 *        Face `config.json`, the path of a `config.json` file, or a preset's name or Hugging
 *        Face id in any case ("Qwen/Qwen3-30B-A3B"; an existing file or folder of that name wins).
 * @param out receives the new handle, owned by the caller (release with ferry_model_close()).
 * @param name_or_path preset name (see ferry_model_preset_name()) or path.
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND for an unknown preset or missing file;
 *         FERRY_ERR_FORMAT for a malformed config (the message names file and field);
 *         FERRY_ERR_UNSUPPORTED for an unknown `model_type`. Details in ferry_last_error().
 */
FERRY_API ferry_status ferry_model_open(ferry_model **out, const char *name_or_path);

/**
 * @brief Create a model description from an explicit configuration (copied).
 * @return FERRY_OK or FERRY_ERR_INVALID when the configuration is inconsistent (e.g. heads
 *         not dividing into kv heads); details in ferry_last_error().
 */
FERRY_API ferry_status ferry_model_create(ferry_model **out, const struct ferry_model_config *config);

/** @brief Release a model. Accepts NULL. */
FERRY_API void ferry_model_close(ferry_model *model);

/** @brief The model's configuration; borrowed, valid while the model is open. */
FERRY_API const struct ferry_model_config *ferry_model_get_config(const ferry_model *model);

/** @brief Number of weight tensors in the layout. */
FERRY_API size_t ferry_model_tensor_count(const ferry_model *model);

/**
 * @brief Tensor i of the layout. Tensors come in file order: embeddings, then for each layer
 *        its non-expert tensors followed by its experts one after another (each expert's
 *        tensors adjacent), then final norm and head. Borrowed; NULL when i is out of range.
 */
FERRY_API const struct ferry_tensor_desc *ferry_model_tensor(const ferry_model *model, size_t i);

/**
 * @brief Find a tensor by its Hugging Face name.
 * @return the tensor index, or -1 when absent.
 */
FERRY_API int64_t ferry_model_find_tensor(const ferry_model *model, const char *name);

/** @brief Parameter and byte accounting (bytes as published: the model's dtype, or the
 *         checkpoint's quantized format). Per-layer figures are the largest layer's. */
FERRY_API void ferry_model_get_accounting(const ferry_model *model, struct ferry_model_accounting *out);

/**
 * @brief The KV format a run of this model uses: @p requested itself, or for FERRY_KV_AUTO the
 *        model's dtype (fp32 and fp64 models: fp32; bf16: bf16; every other: fp16). The engine
 *        and `ferry model show` both ask here, so what is shown is what runs.
 */
FERRY_API enum ferry_kv_format ferry_model_kv_format(const ferry_model *model, enum ferry_kv_format requested);

/**
 * @brief KV-cache bytes for @p tokens tokens of one sequence (all layers; K and V, or MLA's
 *        latent) in @p kv_format (FERRY_KV_AUTO: the model's, ferry_model_kv_format()). A windowed
 *        or chunked layer holds at most the tokens a query sees. For 32 layers x 32 KV heads x
 *        head dim 128 x 2048 tokens in fp16 this is exactly 1 GiB.
 */
FERRY_API uint64_t ferry_model_kv_bytes(const ferry_model *model, int64_t tokens, enum ferry_kv_format kv_format);

/**
 * @brief FLOPs (multiply-add = 2) to process one token: the matrix products of the active
 *        parameters plus attention over @p context_len earlier tokens.
 * @param model the model.
 * @param context_len tokens already in the KV cache when this token is processed.
 */
FERRY_API double ferry_model_flops_per_token(const ferry_model *model, int64_t context_len);

/**
 * @brief FLOPs to prefill a prompt of @p prompt_len tokens (sum over its tokens).
 */
FERRY_API double ferry_model_flops_prefill(const ferry_model *model, int64_t prompt_len);

/** @brief Number of catalogue presets. */
FERRY_API size_t ferry_model_preset_count(void);

/** @brief Name of preset i ("tiny-moe", "mixtral-8x7b", ...); NULL when out of range. */
FERRY_API const char *ferry_model_preset_name(size_t i);

/** @brief Family name as Hugging Face spells `model_type` ("llama", "qwen2_moe", ...). */
FERRY_API const char *ferry_family_name(enum ferry_family family);

/** @brief Whether this model is Mixture-of-Experts (n_experts > 0). */
FERRY_API int ferry_model_is_moe(const ferry_model *model);

/**
 * @brief Parse a family from its Hugging Face `model_type` spelling ("llama", "qwen2_moe", ...).
 * @return FERRY_OK, or FERRY_ERR_UNSUPPORTED for an unknown spelling (no message set).
 */
FERRY_API ferry_status ferry_family_parse(const char *name, enum ferry_family *out);

/**
 * @brief The tensors of one layer's dense part (everything but its routed experts: norms,
 *        attention, router, shared expert), which are adjacent in file order.
 * @param model the model.
 * @param layer layer index, 0 .. n_layers - 1.
 * @param first receives the index of the first tensor (see ferry_model_tensor()).
 * @param count receives the number of tensors.
 * @return FERRY_OK, or FERRY_ERR_RANGE when @p layer is out of range.
 */
FERRY_API ferry_status ferry_model_layer_span(const ferry_model *model, int64_t layer, size_t *first,
                                    size_t *count);

/**
 * @brief The tensors of routed expert @p expert of layer @p layer, adjacent in file order.
 * @param model the model.
 * @param layer layer index, 0 .. n_layers - 1.
 * @param expert routed expert index, 0 .. n_experts - 1.
 * @param first receives the index of the first tensor (see ferry_model_tensor()).
 * @param count receives the number of tensors (gate, up, down; or the fused slices and biases).
 * @return FERRY_OK, or FERRY_ERR_RANGE when the layer or expert is out of range (always for
 *         dense models and the dense layers of MoE models).
 */
FERRY_API ferry_status ferry_model_expert_span(const ferry_model *model, int64_t layer, int64_t expert,
                                     size_t *first, size_t *count);

/**
 * @brief Parameters multiplied per token by matrix products: every 2-D weight of the active
 *        path (attention, dense FFN, router, shared expert, top-k routed experts, output head,
 *        the tied embedding when it serves as head), without biases, norms or the embedding
 *        lookup. ferry_model_flops_per_token() is twice this plus attention.
 */
FERRY_API double ferry_model_matmul_params_active(const ferry_model *model);

/**
 * @brief Write the model's Hugging Face `config.json` text for this configuration.
 *
 * The text is read back before it is returned: a configuration that config.json cannot
 * express for its family (e.g. Qwen2 without q/k/v biases) gives FERRY_ERR_UNSUPPORTED.
 * @param model the model.
 * @param out receives a NUL-terminated string owned by the caller (ferry_free()).
 */
FERRY_API ferry_status ferry_model_config_json(const ferry_model *model, char **out);

/**
 * @brief Whether @p candidate describes the same architecture as @p serving: every field of the
 *        configuration but the name and the published dtype (a hot reload may bring another
 *        quantization, not another model).
 * @return FERRY_OK; FERRY_ERR_FORMAT naming the first field that differs, with both values.
 */
FERRY_API ferry_status ferry_model_same_architecture(const ferry_model *serving, const ferry_model *candidate);

/**
 * @brief Per-layer facts: MoE or dense, window or chunk, RoPE or not, cache bytes per token.
 * @return FERRY_OK, or FERRY_ERR_RANGE when @p layer is out of range.
 */
FERRY_API ferry_status ferry_model_layer_info(const ferry_model *model, int64_t layer, struct ferry_layer_info *out);

/**
 * @brief Parameters of one layer (all its experts) and of its dense part alone.
 * @return FERRY_OK, or FERRY_ERR_RANGE when @p layer is out of range.
 */
FERRY_API ferry_status ferry_model_layer_params(const ferry_model *model, int64_t layer, uint64_t *all, uint64_t *dense);

/**
 * @brief The RoPE of layer @p layer (its base, rotated dimensions, layout and scaling).
 * @return FERRY_OK; FERRY_ERR_RANGE for a bad layer; FERRY_ERR_NOT_FOUND when the layer applies
 *         no RoPE (learned positions, ALiBi, Llama 4 NoPE layers).
 */
FERRY_API ferry_status ferry_model_layer_rope(const ferry_model *model, int64_t layer, struct ferry_rope_params *out);

/**
 * @brief RoPE inverse frequencies of @p rope for a sequence of @p seq_len tokens, exactly as
 *        transformers computes them (the length matters for dynamic NTK and LongRoPE only).
 * @param rope the layer's RoPE.
 * @param seq_len tokens of the sequence (its last position + 1).
 * @param inv_freq receives dim / 2 values.
 * @param attn_factor receives the factor cos and sin are multiplied by (1 unless yarn/longrope).
 */
FERRY_API void ferry_rope_inv_freq(const struct ferry_rope_params *rope, int64_t seq_len, double *inv_freq, double *attn_factor);

/**
 * @brief The softmax scale of attention (1/sqrt(head_dim), Gemma's query_pre_attn_scalar,
 *        DeepSeek's yarn mscale) of this model.
 */
FERRY_API double ferry_model_attn_scale(const ferry_model *model);

/**
 * @brief Find a model by catalogue name or Hugging Face id, ignoring case
 *        ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b").
 * @return the preset's catalogue name (static), or NULL when none matches.
 */
FERRY_API const char *ferry_model_preset_resolve(const char *name);

/** @brief Hugging Face id of preset i ("Qwen/Qwen3-30B-A3B"); "" for ferry's own shapes. */
FERRY_API const char *ferry_model_preset_hf_id(size_t i);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_MODEL_H */
