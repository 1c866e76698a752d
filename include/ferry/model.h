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

#include <stddef.h>
#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Architecture family; decides tensor names and the math the host executor runs. */
enum ferry_family {
  FERRY_FAMILY_LLAMA,     /**< Llama 2/3 (`model_type` "llama") */
  FERRY_FAMILY_MISTRAL,   /**< Mistral ("mistral"), Llama-shaped */
  FERRY_FAMILY_MIXTRAL,   /**< Mixtral ("mixtral"): routed experts w1/w2/w3 */
  FERRY_FAMILY_QWEN2,     /**< Qwen2 ("qwen2"): q/k/v biases */
  FERRY_FAMILY_QWEN2_MOE, /**< Qwen2-MoE / Qwen1.5-MoE ("qwen2_moe"): shared expert with gate */
  FERRY_FAMILY_OLMOE,     /**< OLMoE ("olmoe"): q/k RMSNorm, 64 experts */
  FERRY_FAMILY_OPT        /**< OPT ("opt"): LayerNorm, ReLU, learned positions; simulation only */
};

/** Normalisation kind. */
enum ferry_norm_kind {
  FERRY_NORM_RMS,  /**< RMSNorm (weight only) */
  FERRY_NORM_LAYER /**< LayerNorm (weight and bias) */
};

/** Feed-forward activation. */
enum ferry_act_kind {
  FERRY_ACT_SWIGLU, /**< down(silu(gate(x)) * up(x)) */
  FERRY_ACT_GELU,   /**< fc2(gelu(fc1(x))) */
  FERRY_ACT_RELU    /**< fc2(relu(fc1(x))) */
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
  int qk_norm;                   /**< 1 if q and k are RMS-normalised after projection (OLMoE) */
  int learned_positions;         /**< 1 for learned absolute positions (OPT), 0 for RoPE */
  enum ferry_norm_kind norm;     /**< normalisation */
  enum ferry_act_kind act;       /**< FFN activation */
  double norm_eps;               /**< epsilon of the norms */
  double rope_theta;             /**< RoPE base */
  int64_t sliding_window;        /**< attention window in tokens (Mistral); 0 = full attention */
  enum ferry_dtype dtype;        /**< dtype of the weights as published */
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
};

/**
 * @brief KV-cache formats, one row each: X(ENUM, name, element dtype). Append only. Today every
 *        format is a plain element type; a quantized one (fp8, int8 or int4 with per-head
 *        scales) adds a row here and its bytes per row in ferry_kv_format_row_bytes(), and the
 *        engine, the simulator's pricing and `ferry model show` follow.
 */
#define FERRY_KV_FORMAT_MAP(X)      \
  X(FP32, "fp32", FERRY_DTYPE_F32)  \
  X(FP16, "fp16", FERRY_DTYPE_F16)  \
  X(BF16, "bf16", FERRY_DTYPE_BF16)

/** How the KV cache stores keys and values. */
enum ferry_kv_format {
  FERRY_KV_AUTO = 0, /**< the model's own dtype: fp32 for fp32 (and fp64) models, bf16 for bf16
                          models, fp16 otherwise (ferry_model_kv_format()) */
#define FERRY_KV_FORMAT_ENUM_(e, name, dtype) FERRY_KV_##e,
  FERRY_KV_FORMAT_MAP(FERRY_KV_FORMAT_ENUM_)
#undef FERRY_KV_FORMAT_ENUM_
  FERRY_KV_FORMAT_COUNT /**< number of formats, not a format */
};

/** @brief Name of a KV format ("fp16", ...; "auto" for FERRY_KV_AUTO; "?" outside the enum). */
const char *ferry_kv_format_name(enum ferry_kv_format format);

/**
 * @brief Parse a KV format name: "fp32", "fp16", "bf16" (or "auto").
 * @return FERRY_OK, or FERRY_ERR_INVALID with a message listing the names.
 */
ferry_status ferry_kv_format_parse(const char *text, enum ferry_kv_format *out);

/** @brief The element dtype executors store a format's cache in (FERRY_DTYPE_F32 for AUTO). */
enum ferry_dtype ferry_kv_format_dtype(enum ferry_kv_format format);

/** @brief Bytes of one cache row of @p elements keys (or values) in @p format (AUTO: 0). */
uint64_t ferry_kv_format_row_bytes(enum ferry_kv_format format, uint64_t elements);

/** Parameter and byte accounting of a model (bytes at the model's dtype). */
struct ferry_model_accounting {
  uint64_t params_total;       /**< every parameter (tied head counted once) */
  uint64_t params_active;      /**< parameters touched per token: all but the unrouted experts */
  uint64_t params_embed;       /**< input embedding (+ learned positions) */
  uint64_t params_head;        /**< final norm + output head (0 head when tied) */
  uint64_t params_layer;       /**< one whole layer, all its experts included */
  uint64_t params_layer_dense; /**< one layer without its routed experts (attention, norms,
                                    router, shared expert); the whole layer for dense models */
  uint64_t params_expert;      /**< one routed expert; 0 for dense models */
  uint64_t bytes_total;        /**< params_total at the model dtype */
  uint64_t bytes_layer;        /**< params_layer at the model dtype */
  uint64_t bytes_layer_dense;  /**< params_layer_dense at the model dtype */
  uint64_t bytes_expert;       /**< params_expert at the model dtype */
  uint64_t bytes_embed;        /**< params_embed at the model dtype */
  uint64_t bytes_head;         /**< params_head at the model dtype */
  uint64_t kv_bytes_per_token; /**< K and V of every layer for one token, in the model's default
                                    KV format (ferry_model_kv_format() of FERRY_KV_AUTO) */
};

/** Opaque model description (shapes only). */
typedef struct ferry_model ferry_model;

/**
 * @brief Open a model description from a catalogue preset name, a folder holding a Hugging
 *        Face `config.json`, or the path of a `config.json` file.
 * @param out receives the new handle, owned by the caller (release with ferry_model_close()).
 * @param name_or_path preset name (see ferry_model_preset_name()) or path.
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND for an unknown preset or missing file;
 *         FERRY_ERR_FORMAT for a malformed config (the message names file and field);
 *         FERRY_ERR_UNSUPPORTED for an unknown `model_type`. Details in ferry_last_error().
 */
ferry_status ferry_model_open(ferry_model **out, const char *name_or_path);

/**
 * @brief Create a model description from an explicit configuration (copied).
 * @return FERRY_OK or FERRY_ERR_INVALID when the configuration is inconsistent (e.g. heads
 *         not dividing into kv heads); details in ferry_last_error().
 */
ferry_status ferry_model_create(ferry_model **out, const struct ferry_model_config *config);

/** @brief Release a model. Accepts NULL. */
void ferry_model_close(ferry_model *model);

/** @brief The model's configuration; borrowed, valid while the model is open. */
const struct ferry_model_config *ferry_model_get_config(const ferry_model *model);

/** @brief Number of weight tensors in the layout. */
size_t ferry_model_tensor_count(const ferry_model *model);

/**
 * @brief Tensor i of the layout. Tensors come in file order: embeddings, then for each layer
 *        its non-expert tensors followed by its experts one after another (each expert's
 *        tensors adjacent), then final norm and head. Borrowed; NULL when i is out of range.
 */
const struct ferry_tensor_desc *ferry_model_tensor(const ferry_model *model, size_t i);

/**
 * @brief Find a tensor by its Hugging Face name.
 * @return the tensor index, or -1 when absent.
 */
int64_t ferry_model_find_tensor(const ferry_model *model, const char *name);

/** @brief Parameter and byte accounting (bytes at the model's dtype). */
void ferry_model_get_accounting(const ferry_model *model, struct ferry_model_accounting *out);

/**
 * @brief The KV format a run of this model uses: @p requested itself, or for FERRY_KV_AUTO the
 *        model's dtype (fp32 and fp64 models: fp32; bf16: bf16; every other: fp16). The engine
 *        and `ferry model show` both ask here, so what is shown is what runs.
 */
enum ferry_kv_format ferry_model_kv_format(const ferry_model *model, enum ferry_kv_format requested);

/**
 * @brief KV-cache bytes for @p tokens tokens (all layers, K and V) in @p kv_format (FERRY_KV_AUTO:
 *        the model's, ferry_model_kv_format()). For 32 layers x 32 KV heads x head dim 128 x 2048
 *        tokens in fp16 this is exactly 1 GiB.
 */
uint64_t ferry_model_kv_bytes(const ferry_model *model, int64_t tokens, enum ferry_kv_format kv_format);

/**
 * @brief FLOPs (multiply-add = 2) to process one token: the matrix products of the active
 *        parameters plus attention over @p context_len earlier tokens.
 * @param model the model.
 * @param context_len tokens already in the KV cache when this token is processed.
 */
double ferry_model_flops_per_token(const ferry_model *model, int64_t context_len);

/**
 * @brief FLOPs to prefill a prompt of @p prompt_len tokens (sum over its tokens).
 */
double ferry_model_flops_prefill(const ferry_model *model, int64_t prompt_len);

/** @brief Number of catalogue presets. */
size_t ferry_model_preset_count(void);

/** @brief Name of preset i ("tiny-moe", "mixtral-8x7b", ...); NULL when out of range. */
const char *ferry_model_preset_name(size_t i);

/** @brief Family name as Hugging Face spells `model_type` ("llama", "qwen2_moe", ...). */
const char *ferry_family_name(enum ferry_family family);

/** @brief Whether this model is Mixture-of-Experts (n_experts > 0). */
int ferry_model_is_moe(const ferry_model *model);

/**
 * @brief Parse a family from its Hugging Face `model_type` spelling ("llama", "qwen2_moe", ...).
 * @return FERRY_OK, or FERRY_ERR_UNSUPPORTED for an unknown spelling (no message set).
 */
ferry_status ferry_family_parse(const char *name, enum ferry_family *out);

/**
 * @brief The tensors of one layer's dense part (everything but its routed experts: norms,
 *        attention, router, shared expert), which are adjacent in file order.
 * @param model the model.
 * @param layer layer index, 0 .. n_layers - 1.
 * @param first receives the index of the first tensor (see ferry_model_tensor()).
 * @param count receives the number of tensors.
 * @return FERRY_OK, or FERRY_ERR_RANGE when @p layer is out of range.
 */
ferry_status ferry_model_layer_span(const ferry_model *model, int64_t layer, size_t *first,
                                    size_t *count);

/**
 * @brief The tensors of routed expert @p expert of layer @p layer, adjacent in file order.
 * @param model the model.
 * @param layer layer index, 0 .. n_layers - 1.
 * @param expert routed expert index, 0 .. n_experts - 1.
 * @param first receives the index of the first tensor (see ferry_model_tensor()).
 * @param count receives the number of tensors (3: gate, up, down).
 * @return FERRY_OK, or FERRY_ERR_RANGE when the layer or expert is out of range (always for
 *         dense models).
 */
ferry_status ferry_model_expert_span(const ferry_model *model, int64_t layer, int64_t expert,
                                     size_t *first, size_t *count);

/**
 * @brief Parameters multiplied per token by matrix products: every 2-D weight of the active
 *        path (attention, dense FFN, router, shared expert, top-k routed experts, output head,
 *        the tied embedding when it serves as head), without biases, norms or the embedding
 *        lookup. ferry_model_flops_per_token() is twice this plus attention.
 */
double ferry_model_matmul_params_active(const ferry_model *model);

/**
 * @brief Write the model's Hugging Face `config.json` text for this configuration.
 *
 * The text is read back before it is returned: a configuration that config.json cannot
 * express for its family (e.g. Qwen2 without q/k/v biases) gives FERRY_ERR_UNSUPPORTED.
 * @param model the model.
 * @param out receives a NUL-terminated string owned by the caller (ferry_free()).
 */
ferry_status ferry_model_config_json(const ferry_model *model, char **out);

/**
 * @brief Whether @p candidate describes the same architecture as @p serving: every field of the
 *        configuration but the name and the published dtype (a hot reload may bring another
 *        quantization, not another model).
 * @return FERRY_OK; FERRY_ERR_FORMAT naming the first field that differs, with both values.
 */
ferry_status ferry_model_same_architecture(const ferry_model *serving, const ferry_model *candidate);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_MODEL_H */
