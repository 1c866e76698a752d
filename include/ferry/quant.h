/**
 * @file quant.h
 * @brief Weight formats and (de)quantization: fp32, fp16, bf16, int8 per row, grouped
 *        asymmetric int4/int3/int2, NF4 with double quantization, and mixed per-class plans.
 *
 * A quantized [rows, cols] matrix is stored as up to five **parts** (packed codes, scales,
 * zero points and, for NF4, the second-level scales and offsets of the double quantization).
 * ferry_quant_layout() says how big each part is, its safetensors dtype and shape, and where it
 * sits in one contiguous blob; the parts can equally be stored as separate safetensors tensors
 * named "<name>.<suffix>" (docs/quantization.md gives every layout bit by bit).
 *
 * The engine's hot path is ferry_quant_dequantize_rows(): it expands a row range of a packed
 * matrix into caller-provided fp32 scratch, allocates nothing and keeps no state, so any number
 * of threads may call it at once on disjoint outputs. Every function here is pure: no I/O, no
 * clock, no global state other than the thread's last error message.
 */
#ifndef FERRY_QUANT_H
#define FERRY_QUANT_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/model.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Weight format family; the group size, where there is one, is in struct ferry_qspec. */
enum ferry_qformat {
  FERRY_QFORMAT_FP32, /**< unquantized IEEE binary32 */
  FERRY_QFORMAT_FP16, /**< IEEE binary16, round to nearest even */
  FERRY_QFORMAT_BF16, /**< bfloat16, round to nearest even */
  FERRY_QFORMAT_INT8, /**< symmetric int8, one fp32 scale per row (output channel) */
  FERRY_QFORMAT_INT4, /**< asymmetric 4-bit, fp16 scale and uint8 zero per group of a row */
  FERRY_QFORMAT_INT3, /**< asymmetric 3-bit, fp16 scale and uint8 zero per group of a row */
  FERRY_QFORMAT_INT2, /**< asymmetric 2-bit, fp16 scale and uint8 zero per group of a row */
  FERRY_QFORMAT_NF4,  /**< QLoRA NormalFloat4, absmax per block, absmax double-quantized */
  /* Formats of published checkpoints, read as they are stored (no quantizer here). */
  FERRY_QFORMAT_GPTQ4,  /**< GPTQ 4-bit: qweight int32 [in/8, out], qzeros int32 [groups, out/8]
                             (stored minus 1), fp16 scales [groups, out], g_idx int32 [in] */
  FERRY_QFORMAT_AWQ4,   /**< AWQ GEMM 4-bit: qweight int32 [in, out/8] and qzeros int32
                             [groups, out/8] in AWQ's nibble order, fp16 scales [groups, out] */
  FERRY_QFORMAT_CT4,    /**< compressed-tensors pack-quantized symmetric int4: weight_packed
                             int32 [out, in/8], bf16 weight_scale [out, groups], weight_shape */
  FERRY_QFORMAT_CT4F16, /**< the same with fp16 weight_scale */
  FERRY_QFORMAT_MXFP4,  /**< OCP MXFP4 as gpt-oss ships it: _blocks uint8 [out, in/32, 16]
                             (two e2m1 values a byte, low nibble first), _scales uint8
                             [out, in/32] (e8m0) */
  FERRY_QFORMAT_FP8B,   /**< fp8 e4m3 weight [out, in] with fp32 weight_scale_inv per 128 x 128
                             block (DeepSeek-V3) */
  FERRY_QFORMAT_COUNT /**< number of formats, not a format */
};

/** A weight format with its parameters, e.g. int4 with groups of 64 ("int4-g64"). */
struct ferry_qspec {
  enum ferry_qformat format; /**< the format family */
  int32_t group_size;        /**< elements per group (INT4/3/2) or per absmax block (NF4),
                                  a multiple of 8 in [8, 4096]; 0 for the other formats */
};

/** Group size of "nf4" when none is given (QLoRA's 64). */
#define FERRY_QUANT_NF4_BLOCK 64
/** Number of first-level NF4 absmax values per second-level block (QLoRA's 256). */
#define FERRY_QUANT_NF4_BLOCK2 256
/** Longest spelling ferry_quant_spec_name() writes, terminating NUL included. */
#define FERRY_QSPEC_NAME_MAX 24

/**
 * @brief Parse a format name: "fp32", "fp16", "bf16", "int8", "int4-g<G>", "int3-g<G>",
 *        "int2-g<G>", "nf4" (block 64) or "nf4-g<G>"; G a multiple of 8 in [8, 4096].
 * @param text the name; case-insensitive.
 * @param out receives the spec on success.
 * @return FERRY_OK; FERRY_ERR_INVALID for an unknown name or bad group size, with a message
 *         naming it and the accepted spellings in ferry_last_error().
 */
FERRY_API ferry_status ferry_quant_spec_parse(const char *text, struct ferry_qspec *out);

/**
 * @brief Write the canonical name of a spec ("int4-g64", "nf4", "fp16", ...).
 * @param spec the spec; an invalid one is written as "?".
 * @param buf receives the NUL-terminated name (FERRY_QSPEC_NAME_MAX bytes always suffice).
 * @param size size of buf in bytes.
 * @return buf.
 */
FERRY_API char *ferry_quant_spec_name(const struct ferry_qspec *spec, char *buf, size_t size);

/**
 * @brief Check that a spec is well formed (known format, group size allowed for it).
 * @return FERRY_OK or FERRY_ERR_INVALID (message in ferry_last_error()).
 */
FERRY_API ferry_status ferry_quant_spec_check(const struct ferry_qspec *spec);

/** The parts a packed matrix consists of; formats use a prefix of this list or a subset. */
enum ferry_qpart {
  FERRY_QPART_DATA,     /**< "qweight": values or packed codes, row-major, rows byte-aligned */
  FERRY_QPART_SCALES,   /**< "scales": per row (INT8, F32) or per group (INTn, F16);
                             "absmax" for NF4: per block, an 8-bit dynamic-map code (U8) */
  FERRY_QPART_ZEROS,    /**< "zeros": per-group zero points of INTn (U8) */
  FERRY_QPART_SCALES2,  /**< "absmax_scales": NF4 second-level scale per 256 absmax (F32);
                             "g_idx" of GPTQ (I32, the group of each input row) */
  FERRY_QPART_OFFSETS2, /**< "absmax_offsets": NF4 second-level mean per 256 absmax (F32);
                             "weight_shape" of compressed-tensors (I64 [2]) */
  FERRY_QPART_COUNT     /**< number of parts, not a part */
};

/** Where one part lives and how it is stored as a safetensors tensor. */
struct ferry_qpart_desc {
  const char *suffix;     /**< tensor name suffix ("qweight", "scales", ...); NULL if the
                               format has no such part (then every other field is 0) */
  enum ferry_dtype dtype; /**< safetensors dtype of the part */
  int32_t ndim;           /**< 1, 2 or 3 */
  int64_t shape[3];       /**< shape in elements of dtype (entries past ndim unused) */
  uint64_t bytes;         /**< exact size in bytes */
  uint64_t offset;        /**< offset in a contiguous blob; parts are 64-byte aligned there */
};

/** Sizes and placement of every part of a packed [rows, cols] matrix. */
struct ferry_qlayout {
  struct ferry_qspec spec;                      /**< the format */
  int64_t rows;                                 /**< matrix rows (output channels) */
  int64_t cols;                                 /**< matrix columns (input features) */
  int64_t groups_per_row;                       /**< groups (INTn) or blocks (NF4) per row;
                                                     1 for INT8, 0 for float formats */
  uint64_t row_bytes;                           /**< bytes of one row of the DATA part */
  struct ferry_qpart_desc part[FERRY_QPART_COUNT]; /**< the parts, indexed by ferry_qpart */
  uint64_t data_bytes;                          /**< bytes of the DATA part */
  uint64_t scale_bytes;                         /**< bytes of all other parts together */
  uint64_t total_bytes;                         /**< data_bytes + scale_bytes: storage cost */
  uint64_t blob_bytes;                          /**< size of the contiguous blob (parts
                                                     64-byte aligned), >= total_bytes */
};

/**
 * @brief Compute the layout of a packed matrix.
 * @param spec the format.
 * @param rows rows, >= 1; a 1-D tensor of n elements is a [1, n] matrix.
 * @param cols columns, >= 1.
 * @param out receives the layout.
 * @return FERRY_OK; FERRY_ERR_INVALID for a bad spec or shape; FERRY_ERR_RANGE if a size
 *         overflows 64 bits.
 */
FERRY_API ferry_status ferry_quant_layout(const struct ferry_qspec *spec, int64_t rows, int64_t cols,
                                struct ferry_qlayout *out);

/**
 * @brief Storage cost of a packed matrix: codes plus scales, zeros and second-level metadata.
 * @param spec the format.
 * @param rows rows, >= 1.
 * @param cols columns, >= 1.
 * @param data_bytes if not NULL, receives the bytes of the DATA part.
 * @param scale_bytes if not NULL, receives the bytes of all the other parts.
 * @return the total bytes (data + scale), or 0 for an invalid spec or shape.
 */
FERRY_API uint64_t ferry_quant_packed_bytes(const struct ferry_qspec *spec, int64_t rows, int64_t cols,
                                  uint64_t *data_bytes, uint64_t *scale_bytes);

/** Read-only pointers to the parts of a packed matrix (unused parts may be NULL). */
struct ferry_qview {
  const void *part[FERRY_QPART_COUNT]; /**< indexed by ferry_qpart; no alignment required */
};

/** Writable pointers to the parts of a packed matrix (unused parts may be NULL). */
struct ferry_qout {
  void *part[FERRY_QPART_COUNT]; /**< indexed by ferry_qpart; no alignment required */
};

/**
 * @brief Point a view at the parts of a contiguous blob laid out as ferry_quant_layout() says.
 * @param layout the layout.
 * @param blob at least layout->blob_bytes bytes; borrowed, the view points into it.
 * @param out receives the part pointers (NULL for parts the format lacks).
 */
FERRY_API void ferry_quant_view_blob(const struct ferry_qlayout *layout, const void *blob,
                           struct ferry_qview *out);

/**
 * @brief Writable counterpart of ferry_quant_view_blob().
 * @param layout the layout.
 * @param blob at least layout->blob_bytes bytes; borrowed, the result points into it.
 * @param out receives the part pointers (NULL for parts the format lacks).
 */
FERRY_API void ferry_quant_out_blob(const struct ferry_qlayout *layout, void *blob, struct ferry_qout *out);

/**
 * @brief Quantize a row-major fp32 [rows, cols] matrix into its packed parts.
 *
 * INT8: scale = max|row| / 127, code = round(x / scale). INTn: per group, range
 * [lo, hi] = [min(min, 0), max(max, 0)] shrunk by the factor in {1, 0.95, ..., 0.5} that
 * minimises the group's squared error, scale = (hi - lo) / (2^n - 1) rounded up to fp16,
 * zero = round(-lo / scale), code = clamp(round(x / scale) + zero). NF4: absmax per block,
 * double-quantized first, and each weight mapped to the nearest NF4 level of
 * x / reconstructed absmax. fp16 turns values beyond +-65504 into infinities. Padding bits at
 * the end of a row are written as 0, so output is deterministic byte for byte.
 * @param spec the format.
 * @param src rows * cols finite floats; borrowed.
 * @param rows rows, >= 1.
 * @param cols columns, >= 1.
 * @param out destination of every part the format has (sizes from ferry_quant_layout()).
 * @return FERRY_OK; FERRY_ERR_INVALID for a bad spec or shape, a NULL part the format needs,
 *         or a NaN or infinite input (the message names its row and column).
 */
FERRY_API ferry_status ferry_quant_quantize(const struct ferry_qspec *spec, const float *src, int64_t rows,
                                  int64_t cols, const struct ferry_qout *out);

/**
 * @brief Expand rows [row_begin, row_end) of a packed matrix into fp32: the hot path.
 *
 * Allocates nothing and touches only the bytes of the requested rows (plus, for NF4, their
 * second-level blocks). Thread-safe on disjoint destinations.
 * @param spec the format.
 * @param packed pointers to the parts of the whole matrix (row 0 first); borrowed.
 * @param rows rows of the whole matrix, used to bounds-check the range.
 * @param cols columns, >= 1.
 * @param row_begin first row to expand, 0 <= row_begin <= row_end.
 * @param row_end one past the last row, <= rows.
 * @param dst receives (row_end - row_begin) * cols floats, row-major.
 * @return FERRY_OK; FERRY_ERR_INVALID for a bad spec, range or NULL pointer.
 */
FERRY_API ferry_status ferry_quant_dequantize_rows(const struct ferry_qspec *spec,
                                         const struct ferry_qview *packed, int64_t rows,
                                         int64_t cols, int64_t row_begin, int64_t row_end,
                                         float *dst);

/**
 * @brief Relative Frobenius error ||src - rec|| / ||src|| (accumulated in double).
 * @param src reference values; borrowed.
 * @param rec reconstructed values; borrowed.
 * @param n number of elements.
 * @return the error; 0 when both are all zero, INFINITY when only src is.
 */
FERRY_API double ferry_quant_error(const float *src, const float *rec, size_t n);

/**
 * @brief Cosine similarity of two vectors (accumulated in double).
 * @param a first vector; borrowed.
 * @param b second vector; borrowed.
 * @param n number of elements.
 * @return a.b / (|a| |b|) in [-1, 1]; 1 when both are zero, 0 when exactly one is.
 */
FERRY_API double ferry_quant_cosine(const float *a, const float *b, size_t n);

/**
 * @brief KL(p_ref || p_q) of the softmax distributions of two logit vectors, in nats.
 *
 * Computed with max-subtracted log-softmax in double, so large logits neither overflow nor
 * lose the small probabilities.
 * @param ref_logits logits of the reference model; borrowed.
 * @param q_logits logits of the quantized model; borrowed.
 * @param n vocabulary size, >= 1.
 * @return the divergence, >= 0; NAN if any logit is NaN or +infinity.
 */
FERRY_API double ferry_quant_kl_logits(const float *ref_logits, const float *q_logits, size_t n);

/** Tensor classes a mixed quantization plan assigns formats to. */
enum ferry_qclass {
  FERRY_QCLASS_ATTN,      /**< "attn": attention projections q, k, v, o */
  FERRY_QCLASS_EXPERT,    /**< "expert": routed expert projections */
  FERRY_QCLASS_SHARED,    /**< "shared": shared expert projections */
  FERRY_QCLASS_ROUTER,    /**< "router": router and the shared expert's sigmoid gate */
  FERRY_QCLASS_DENSE_FFN, /**< "dense_ffn": FFN of a dense layer */
  FERRY_QCLASS_EMBED,     /**< "embed": token and learned position embeddings */
  FERRY_QCLASS_HEAD,      /**< "head": output head (lm_head) */
  FERRY_QCLASS_NORM,      /**< "norm": norm weights and all biases; only fp32, fp16 or bf16 */
  FERRY_QCLASS_COUNT      /**< number of classes, not a class */
};

/** A mixed plan: one format per tensor class. */
struct ferry_qplan {
  struct ferry_qspec spec[FERRY_QCLASS_COUNT]; /**< format of each class */
};

/**
 * @brief Parse a plan such as "attn=int4-g64,expert=int3-g64,shared=int8,default=int8".
 *
 * Entries are "class=format" separated by commas (spaces around them ignored). "default"
 * applies to every class not named explicitly, except norm; classes left unset are fp16, and
 * norm is fp32 unless given as fp32, fp16 or bf16. A single format with no "=" (e.g. "nf4")
 * means "default=nf4". Naming a class twice is an error.
 * @param text the plan.
 * @param out receives the plan on success.
 * @return FERRY_OK; FERRY_ERR_INVALID with a message naming the offending entry, its offset
 *         and what was expected (unknown class, unknown format, duplicate, quantized norm).
 */
FERRY_API ferry_status ferry_quant_plan_parse(const char *text, struct ferry_qplan *out);

/**
 * @brief Fill a plan with one format for every class (norm stays fp32 if spec is quantized).
 * @param plan receives the plan.
 * @param spec the format; must be valid.
 */
FERRY_API void ferry_quant_plan_init(struct ferry_qplan *plan, const struct ferry_qspec *spec);

/**
 * @brief Write a plan in the canonical form parsed by ferry_quant_plan_parse(), every class
 *        spelled out ("attn=int4-g64,expert=...,norm=fp32").
 * @param plan the plan.
 * @param buf receives the NUL-terminated text (truncated to fit).
 * @param size size of buf; 256 bytes always suffice.
 * @return buf.
 */
FERRY_API char *ferry_quant_plan_format(const struct ferry_qplan *plan, char *buf, size_t size);

/**
 * @brief Parse a class name ("attn", "expert", "shared", "router", "dense_ffn", "embed",
 *        "head", "norm").
 * @param name the name; case-insensitive.
 * @param out receives the class.
 * @return FERRY_OK or FERRY_ERR_INVALID naming the unknown class.
 */
FERRY_API ferry_status ferry_quant_class_parse(const char *name, enum ferry_qclass *out);

/**
 * @brief The name of a class ("attn", ...).
 * @return a static string; "?" for a value outside the enum.
 */
FERRY_API const char *ferry_quant_class_name(enum ferry_qclass cls);

/**
 * @brief The format a plan gives to a class, by class name.
 * @param plan the plan.
 * @param class_name a class name as in ferry_quant_class_parse().
 * @param out receives the format.
 * @return FERRY_OK or FERRY_ERR_INVALID naming the unknown class.
 */
FERRY_API ferry_status ferry_quant_plan_lookup(const struct ferry_qplan *plan, const char *class_name,
                                     struct ferry_qspec *out);

/**
 * @brief The class a model tensor belongs to.
 *
 * Attention projections (separate, fused query_key_value, or DeepSeek's latent-attention
 * projections) map to attn, dense FFN roles to dense_ffn, routed expert roles (a fused gate/up
 * included) to expert, shared expert projections to shared, the router and the shared expert's
 * sigmoid gate to router, every 1-D tensor (norms, biases) to norm.
 * @param role the tensor's role.
 * @return the class; FERRY_QCLASS_NORM for a value outside the enum.
 */
FERRY_API enum ferry_qclass ferry_quant_class_of_role(enum ferry_tensor_role role);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_QUANT_H */
