/**
 * @file exec.h
 * @brief The executor interface: the one seam between the engine's decisions and the world
 *        that carries them out (real CPU work, a GPU, or a discrete-event simulation).
 *
 * Modelled on CUDA streams: buffers live in budgeted tiers; ops are enqueued on queues and run
 * in order per queue; events order queues against each other and let the host wait. Every
 * public wrapper validates its arguments, keeps the tier accounting and reports an activity
 * record to the installed sink; backends implement a function table (exec_impl.h).
 *
 * Lifetimes: a kernel's immediate arrays (token ids, positions, routing lists) are borrowed
 * until the op has completed, i.e. until an event recorded after it has been waited for; the
 * engine keeps them per step and synchronises at the end of each step.
 */
#ifndef FERRY_EXEC_H
#define FERRY_EXEC_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/activity.h"
#include "ferry/dtype.h"
#include "ferry/model.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ferry_store;

/** Opaque executor. */
typedef struct ferry_exec ferry_exec;
/** Opaque buffer in one tier of an executor. */
typedef struct ferry_buf ferry_buf;
/** Opaque event. */
typedef struct ferry_event ferry_event;

/** What a queue is for; decides which engine or link its ops use in the simulator. */
enum ferry_queue_role {
  FERRY_QUEUE_COMPUTE, /**< kernels */
  FERRY_QUEUE_H2D,     /**< host to device copies */
  FERRY_QUEUE_D2H,     /**< device to host copies */
  FERRY_QUEUE_DISK,    /**< disk reads into host memory (and copies between disk-tier and host
                            buffers) */
  FERRY_QUEUE_CPU      /**< kernels on the host's CPU over host-tier buffers only (hybrid
                            strategies: experts, layers or attention computed where their weights
                            or KV cache live); events order it against the device's queues like
                            any other queue. host: a worker thread running the host kernels; cuda:
                            a CPU thread beside the GPU streams; sim: priced from the profile's
                            CPU (host.cores, host.core_gflops, host.dram_gbps) */
};

/** Configuration common to every executor (copied at create time). */
struct ferry_exec_config {
  uint64_t device_budget_bytes; /**< most bytes the device tier may hold (0 = unlimited) */
  uint64_t host_budget_bytes;   /**< most bytes the host tier may hold (0 = unlimited) */
  int lock_host_memory;         /**< 1: the host tier is pinned (cuda: cudaHostAlloc; host executor:
                                     mlock, warned when refused; sim: the link's pinned rate); 0:
                                     pageable (cuda: malloc memory, copies staged by the driver;
                                     sim: link.pageable_h2d_gbps) */
  int compute_threads;          /**< host executor: BLAS threads (0 = cores - 2, at least 1: the copy
                                     and disk queues keep a core each) */
  int sim_mode;                 /**< sim executor: a ::ferry_sim_mode (0 = FERRY_SIM_EXACT) */
  int32_t n_devices;            /**< devices the executor drives (0 or 1: one; at most
                                     FERRY_EXEC_MAX_DEVICES). Each has its own device tier of
                                     device_budget_bytes; buffers and queues name theirs
                                     (ferry_exec_alloc_on(), ferry_exec_queue_create_on()).
                                     host: N budgeted arenas in RAM (multi-device numerics in one
                                     process); sim: N GPUs of the profile joined by its
                                     interconnect; cuda: one only */
  const char *disk_dir;         /**< host executor: the folder in which the files of disk-tier
                                     buffers are made, inside a private folder of its own that the
                                     executor creates at the first one and removes when destroyed
                                     (NULL: $TMPDIR, else /tmp). Copied at create time */
};

/** Most devices one executor drives (ferry_exec_config::n_devices). */
#define FERRY_EXEC_MAX_DEVICES 8

/**
 * How the `sim` executor computes times (sim.h). The fast modes give the same figures as the
 * exact one (the test suite compares them on dense and MoE runs, offloaded and resident, with
 * and without a predictor), provided every channel (a link direction, the disk, a memory) is
 * used by one queue only, as the engine does; an op that would share a channel with another
 * queue is refused in the fast modes, with a message. Injected faults (fault.h) are modelled by
 * the exact mode only: an executor created while faults are installed runs exact whatever its
 * mode, and a fast one refuses ops once faults are installed after its creation.
 */
enum ferry_sim_mode {
  FERRY_SIM_EXACT = 0, /**< every op becomes events of the discrete-event simulation (transfers of
                            several queues share their channel) */
  FERRY_SIM_FAST = 1,  /**< each op's start and end are worked out when it is enqueued (no events),
                            and the engine replays the op sequences it repeats as op graphs */
  FERRY_SIM_CHECK = 2  /**< fast timing, but the engine builds every op and checks each op graph
                            it would have replayed against them (a test of the graphs' keys) */
};

/** Kernel kinds. Each carries real arguments (buffers) and its shape for the cost model. */
enum ferry_kernel_kind {
  FERRY_K_EMBED,       /**< out[t,:] = table[ids[t],:] (+ pos_table[positions[t]+pos_offset,:]) */
  FERRY_K_NORM,        /**< out = norm(x) * w (+ b): RMSNorm or LayerNorm over rows of length n */
  FERRY_K_MATMUL,      /**< y[m,n] (+)= x[m,k] . W[n,k]^T (+ bias[n]) */
  FERRY_K_ROPE,        /**< rotate-half RoPE in place on rows of heads x head_dim */
  FERRY_K_ATTENTION,   /**< append k,v to the KV cache, then causal attention of q over it */
  FERRY_K_SWIGLU,      /**< out = silu(gate) * up, or gelu/relu in place */
  FERRY_K_ROUTER,      /**< softmax over expert logits, top-k, optional renormalisation */
  FERRY_K_EXPERT,      /**< one expert's FFN over the (token, rank) pairs routed to it */
  FERRY_K_MOE_COMBINE, /**< x += sum over ranks of gate weight x expert output (+ shared); top_k 0:
                            no ranks and no expert outputs (aux[0] may be absent), the shared
                            expert only */
  FERRY_K_GATHER_ROWS, /**< out[i,:] = x[rows[i],:] */
  FERRY_K_DEQUANTIZE,  /**< packed [n, k] weight (parts in aux[0..4], indexed by ferry_qpart;
                            m = packed bytes) expanded into y: fp32, or fp16 when y.dtype is
                            FERRY_DTYPE_F16 (each fp32 value rounded to nearest even) */
  FERRY_K_SPLIT_QKV,   /**< x [m, heads, 3, head_dim] (a fused query_key_value output) into q (y),
                            k (aux[0]) and v (aux[1]), each [m, heads x head_dim] */
  FERRY_K_MLA_ATTENTION, /**< multi-head latent attention with absorbed weights: append the new
                            latent rows aux[0] [m, k + rot_dim] to the cache aux[2], then each
                            query head of x [m, heads, head_dim + rot_dim] (no-RoPE part first)
                            attends over the latent rows; w = kv_b_proj [heads x (head_dim + n), k];
                            y [m, heads, n]. head_dim: qk_nope, rot_dim: qk_rope, k: kv_lora_rank,
                            n: v_head_dim */
  FERRY_K_ALLREDUCE,   /**< a collective over m devices (2..FERRY_EXEC_MAX_DEVICES): x (on the
                            queue's device) and aux[0..m-2] (one per other device) each hold n
                            fp32 partials; every one is replaced by their sum, added in the order
                            x, aux[0], aux[1], ... so each device holds the same bits. Enqueued
                            on one device's compute queue; the caller orders the other devices'
                            queues before (events) and after it (host: a real sum; sim: a ring
                            all-reduce priced from the profile's interconnect) */
  FERRY_K_KV_APPEND,   /**< append k (aux[0]) and v (aux[1]), [m, kv_heads x head_dim] fp32, to the
                            KV cache aux[2]/aux[3] at each token's position (ints) and slot
                            (ints2), with no attention: the cache fields as FERRY_K_ATTENTION's
                            (kv_capacity, kv_ring, kv_blocks, kv_format). The same append the
                            attention kernels do; used where attention ran elsewhere (a prompt
                            attended on the device whose rows go to a cache in host memory) */
  FERRY_K_COUNT        /**< number of kinds, not a kind */
};

/** A reference to bytes inside a buffer. */
struct ferry_ref {
  ferry_buf *buf;          /**< the buffer */
  uint64_t offset;         /**< byte offset inside it (a window's offsets start at its base:
                                ferry_exec_alloc_window()) */
  enum ferry_dtype dtype;  /**< element type of the data there */
};

/** Activation or weight function for FERRY_K_SWIGLU. */
enum ferry_act_fn {
  FERRY_FN_SILU_MUL, /**< out = silu(a) * b */
  FERRY_FN_GELU,     /**< a = gelu(a) (tanh approximation off: exact erf) */
  FERRY_FN_RELU,     /**< a = relu(a) */
  FERRY_FN_GELU_TANH,     /**< a = gelu(a), tanh approximation (GPT-NeoX gelu_fast, BLOOM) */
  FERRY_FN_GELU_TANH_MUL, /**< out = gelu_tanh(a) * b (Gemma GeGLU) */
  FERRY_FN_SOFTCAP        /**< a = softcap * tanh(a / softcap) (Gemma 2 logits) */
};

/** Norm kinds of FERRY_K_NORM (its norm_kind). */
enum ferry_norm_fn {
  FERRY_NORMFN_RMS = 0,        /**< x * rsqrt(mean(x^2) + eps) * w */
  FERRY_NORMFN_LAYER = 1,      /**< (x - mean) * rsqrt(var + eps) * w + b */
  FERRY_NORMFN_RMS_OFFSET = 2, /**< x * rsqrt(mean(x^2) + eps) * (1 + w) (Gemma) */
  FERRY_NORMFN_RMS_PLAIN = 3   /**< x * rsqrt(mean(x^2) + eps), no weight (Llama 4 q/k) */
};

/** Routed expert FFN layouts of FERRY_K_EXPERT (its expert_layout; enum ferry_expert_layout). */
#define FERRY_EXPERT_W_TRANS_GATE 1 /**< w_trans bit: the gate (or fused gate_up) weight is stored [in, out] */
#define FERRY_EXPERT_W_TRANS_DOWN 4 /**< w_trans bit: the down weight is stored [in, out] */

/** A described kernel. Fields not used by a kind are ignored. */
struct ferry_kernel {
  enum ferry_kernel_kind kind; /**< what to run */
  const char *name;            /**< timeline name ("attn.q", "expert", ...); static string */
  int32_t layer;               /**< layer, or -1 */
  int32_t expert;              /**< expert, or -1 */
  int64_t m;                   /**< rows (tokens) */
  int64_t n;                   /**< output columns / row length */
  int64_t k;                   /**< inner dimension */
  struct ferry_ref x;          /**< main input (fp32 activations) */
  struct ferry_ref y;          /**< main output (fp32 activations) */
  struct ferry_ref w;          /**< weight (matmul W, norm weight, embedding table, router logits) */
  struct ferry_ref b;          /**< bias (optional: buf NULL when absent) */
  struct ferry_ref aux[8];     /**< kind-specific extra buffers (see exec.h per kind) */
  const int32_t *ints;         /**< immediate ints: token ids, positions, row lists, ... */
  const int32_t *ints2;        /**< second immediate array: seq slots, ranks, ... */
  int64_t n_ints;              /**< length of ints (and ints2 when used) */
  int accumulate;              /**< matmul/combine: add into y instead of overwriting */
  float eps;                   /**< norm epsilon */
  double theta;                /**< RoPE base */
  int64_t heads;               /**< attention/rope: query heads */
  int64_t kv_heads;            /**< attention: key/value heads */
  int64_t head_dim;            /**< attention/rope: head dimension */
  int64_t kv_capacity;         /**< attention: tokens per sequence slot in the KV cache */
  int64_t context_tokens;      /**< attention: sum over tokens of the keys each attends to (cost model: flops) */
  int64_t top_k;               /**< router: experts per token */
  int norm_kind;               /**< norm: 0 RMSNorm, 1 LayerNorm */
  int renormalize;             /**< router: renormalise top-k weights */
  enum ferry_act_fn fn;        /**< swiglu kind */
  int64_t pos_offset;          /**< embed: learned-position offset (OPT: 2) */
  int64_t sliding_window;      /**< attention: window in tokens, 0 = none */
  int32_t qformat;             /**< dequantize: enum ferry_qformat of the packed weight */
  int32_t qgroup;              /**< dequantize: group size of the format (0 when it has none) */
  /* Added for the 2024-26 families; zero keeps the behaviour above. */
  float scale;                 /**< attention: softmax scale (0: 1/sqrt(head_dim)); embed: multiplier (0: 1) */
  float softcap;               /**< attention: logits soft-capped c * tanh(s / c); activation FN_SOFTCAP: c */
  int64_t attn_chunk;          /**< attention: queries see only their chunk of this many positions */
  int kv_ring;                 /**< attention: the cache holds kv_capacity rows per sequence as a ring
                                    (row = position % kv_capacity), enough for its window or chunk */
  int alibi;                   /**< attention: ALiBi position bias per head (BLOOM) */
  float temp_floor;            /**< attention: Llama 4 query temperature 1 + temp_scale *
                                    log1p(floor((pos + 1) / temp_floor)); 0 = off */
  float temp_scale;            /**< attention: see temp_floor */
  const struct ferry_rope_params *rope; /**< rope: the layer's RoPE (NULL: default rotation with theta);
                                             ints2 then holds each token's sequence length */
  int64_t rot_offset;          /**< rope: first rotated dimension of each head (MLA: qk_nope) */
  int64_t rot_dim;             /**< rope: rotated dimensions (0 = head_dim); mla attention: qk_rope */
  int64_t ld;                  /**< norm: row stride of x and y in elements (0 = n) */
  int32_t router_kind;         /**< router: enum ferry_router_kind */
  int64_t n_group;             /**< router: expert groups of group-limited routing (0 or 1 = off) */
  int64_t topk_group;          /**< router: groups a token may use */
  float routed_scale;          /**< router: weights multiplied by this (0 = 1) */
  float jitter;                /**< router: sparsemixer threshold epsilon */
  int32_t expert_layout;       /**< expert: enum ferry_expert_layout (SPLIT: w gate, aux[0] up, aux[1]
                                    down; FUSED: w gate_up [2n wide], aux[1] down, aux[6]/aux[7]
                                    biases of gate_up and down or NULL) */
  int32_t w_trans;             /**< expert: FERRY_EXPERT_W_TRANS_* bits of weights stored [in, out] */
  float swiglu_limit;          /**< expert: clamped SwiGLU (gpt-oss) when > 0 */
  int scale_input;             /**< expert: each routed row is multiplied by its weight (aux[5],
                                    [m_tokens, top_k]) before the FFN (Llama 4) */
  const int32_t *kv_blocks;    /**< attention, mla attention: a paged cache's block table, sequence
                                    slot major (kv_blocks_per_seq entries per slot): position p of
                                    slot s is row kv_blocks[s * kv_blocks_per_seq + p / kv_block_tokens]
                                    * kv_block_tokens + p % kv_block_tokens of the layer's region
                                    (NULL: slot s owns rows [s * kv_capacity, (s + 1) * kv_capacity)).
                                    Borrowed like ints */
  int64_t kv_block_tokens;     /**< attention: tokens per block of a paged cache */
  int64_t kv_blocks_per_seq;   /**< attention: the block table's entries per slot */
  int32_t kv_format;           /**< attention, mla attention: enum ferry_kv_format of a quantized
                                    cache (codes and group scales per head chunk, ferry/model.h);
                                    0: elements of aux[2].dtype */
  int64_t dq_rows;             /**< dequantize: rows (tokens) of the product that reads the weight, for
                                    executors that expand a weight only for products over many rows;
                                    0 = not known (the weight is read as its format's kernels read it) */
  int32_t host_syncs;          /**< blocking copies to the device of tensors made on the CPU that the
                                    family's Hugging Face transformers code makes just before this op
                                    (GPT-J's RoPE table and mask value): each makes the host wait for
                                    the op's queue to drain. Only the simulator charges them, and
                                    only for a runtime that runs that code (runtime.model_syncs);
                                    0 = none */
};

/**
 * @brief Create the `host` executor: the device tier is a budgeted arena in RAM standing in
 *        for GPU memory, queues are worker threads, compute is real math (OpenBLAS).
 * @param out receives the executor, owned by the caller (ferry_exec_destroy()).
 */
FERRY_API ferry_status ferry_exec_create_host(ferry_exec **out, const struct ferry_exec_config *config);

/**
 * @brief Create the `cuda` executor on device 0.
 * @return FERRY_ERR_NO_DEVICE when no driver or device is present, FERRY_ERR_UNSUPPORTED when
 *         this build has no CUDA; details in ferry_last_error().
 */
FERRY_API ferry_status ferry_exec_create_cuda(ferry_exec **out, const struct ferry_exec_config *config);

/**
 * @brief Free and total memory of CUDA device 0, without creating an executor (`ferry run`
 *        sizes its default device budget from it).
 * @param free_bytes receives the free bytes (may be NULL).
 * @param total_bytes receives the device's total bytes (may be NULL).
 * @return FERRY_OK; FERRY_ERR_NO_DEVICE without a driver or device; FERRY_ERR_UNSUPPORTED in a
 *         build without CUDA. The message says which (ferry_last_error()).
 */
FERRY_API ferry_status ferry_exec_cuda_memory(uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- the registry ---------------------------------------------------------------------- */

struct ferry_hw;

/** What a registered executor can do (bits of ferry_exec_info::caps). */
enum ferry_exec_cap {
  FERRY_EXEC_CAP_DATA = 1u << 0,    /**< computes on real bytes: logits, routing and features are read back */
  FERRY_EXEC_CAP_MEMORY = 1u << 1,  /**< ferry_exec_info::memory says the device's memory before one is opened */
  FERRY_EXEC_CAP_PROFILE = 1u << 2, /**< its device work can be traced with CUPTI (`ferry run --profile`) */
  FERRY_EXEC_CAP_VIRTUAL = 1u << 3, /**< simulated time: a run on it is a simulation, measured alongside others */
  FERRY_EXEC_CAP_HW = 1u << 4       /**< needs a hardware profile (ferry_exec_params::hw); `ferry sim` runs it */
};

/** What ferry_exec_open() hands an executor (copied; the profile is borrowed for the call). */
struct ferry_exec_params {
  struct ferry_exec_config config; /**< budgets and threads */
  const struct ferry_hw *hw;       /**< hardware profile, for executors with FERRY_EXEC_CAP_HW */
};

/** Version of struct ferry_exec_info this build reads. */
#define FERRY_EXEC_INFO_VERSION 1

/**
 * One executor of the registry (ferry/exec_registry.h): a static const table in the executor's
 * own file, listed by one line in the registry (runtime/backends/registry.c) or registered at
 * run time with ferry_exec_register(). The command line (`--backend`, `ferry sim`), sweeps (`executor`), the
 * result database (`runs.kind`) and the help texts read names from the registry.
 */
struct ferry_exec_info {
  int version;             /**< FERRY_EXEC_INFO_VERSION */
  const char *name;        /**< registry name: 1-15 of a-z, 0-9, '-' ("host", "cuda", "sim") */
  const char *description; /**< one line for help texts */
  unsigned caps;           /**< ferry_exec_cap bits */
  /** optional: 1 when the executor can be opened on this machine, else 0 with the reason in
   *  @p why (no device, not in this build); NULL means always */
  int (*available)(char *why, size_t len);
  /** create one (receives an executor owned by the caller) */
  ferry_status (*open)(ferry_exec **out, const struct ferry_exec_params *params);
  /** with FERRY_EXEC_CAP_MEMORY: the device's free and total bytes (either may be NULL) */
  ferry_status (*memory)(uint64_t *free_bytes, uint64_t *total_bytes);
};

/** @brief Destroy an executor after draining its queues; frees its buffers. Accepts NULL. */
FERRY_API void ferry_exec_destroy(ferry_exec *ex);

/** @brief Backend name: its registry name ("host", "cuda", "sim", ...). */
FERRY_API const char *ferry_exec_name(const ferry_exec *ex);

/** @brief Called on the issuing thread right before an op's driver calls, with its tag
 *         (ferry_op_tag()). */
typedef void (*ferry_launch_begin_fn)(void *user, uint64_t tag);
/** @brief Called on the same thread right after them. */
typedef void (*ferry_launch_end_fn)(void *user);

/**
 * @brief Bracket every copy and kernel the executor hands to a driver, so a profiler that sees
 *        only driver activity can tell which op it came from (ferry_cupti_launch_begin()
 *        pushes the tag as CUPTI's external correlation id). Only the cuda executor calls it;
 *        set it before submitting work. NULL functions remove the hook.
 */
FERRY_API void ferry_exec_set_launch_hook(ferry_exec *ex, ferry_launch_begin_fn begin, ferry_launch_end_fn end, void *user);

/**
 * @brief Describe the executor's GPU.
 * @param out filled on success (zeroed first).
 * @return FERRY_OK; FERRY_ERR_UNSUPPORTED for the host executor, which drives no GPU.
 */
FERRY_API ferry_status ferry_exec_device_info(ferry_exec *ex, struct ferry_device_info *out);

/** @brief Last detailed error of this executor (borrowed; "" if none). */
FERRY_API const char *ferry_exec_errmsg(const ferry_exec *ex);

/** @brief Install the activity sink (NULL to remove). Not thread-safe against running ops. */
FERRY_API void ferry_exec_set_sink(ferry_exec *ex, ferry_activity_fn fn, void *user);

/**
 * @brief Whether this executor computes on real data (host, cuda) or only accounts (sim).
 *        The engine reads routing decisions from buffers only when it does.
 */
FERRY_API int ferry_exec_has_data(const ferry_exec *ex);

/**
 * @brief Whether a DEQUANTIZE into fp16 is this executor's fast path (the cuda executor: the
 *        product that reads the weight then runs on fp16 tensor cores and reads half the bytes).
 *        Every executor computes both outputs; the engine asks for fp16 only where this says so,
 *        and only for formats fp16 holds to within its own rounding.
 * @return 1 or 0.
 */
FERRY_API int ferry_exec_half_dequant(const ferry_exec *ex);

/**
 * @brief Create a queue. Ops on one queue run in order; different queues may overlap.
 * @param out receives the queue id (small non-negative integer).
 */
FERRY_API ferry_status ferry_exec_queue_create(ferry_exec *ex, enum ferry_queue_role role, int32_t *out);

/**
 * @brief Allocate a buffer in a tier. Over budget is FERRY_ERR_BUDGET (never overcommitted).
 *
 * A disk-tier buffer (FERRY_TIER_DISK) is a file of @p bytes (host executor: made sparse in a
 * private folder under ferry_exec_config::disk_dir, read and written with pread/pwrite, removed
 * when the buffer is freed; sim: accounting only; cuda: not supported). Its bytes are not host
 * visible: only a copy between it and a host-tier buffer touches them (ferry_exec_copy(), a read
 * or a write of the disk, on any queue; the simulator prices the read on the disk's read channel
 * and the write at disk.write_gbps); a kernel operand or a copy to or from the device tier in it
 * is FERRY_ERR_INVALID. The disk tier has no budget; its usage and peak are kept like the others'.
 * An I/O error or a short transfer fails the copy (reported by the next sync) naming the file,
 * the offset and the length.
 * @param tier FERRY_TIER_DEVICE, FERRY_TIER_HOST or FERRY_TIER_DISK.
 * @param label name shown in messages and memory samples (static string).
 * @param out receives the buffer, owned by the executor (ferry_exec_free()).
 */
FERRY_API ferry_status ferry_exec_alloc(ferry_exec *ex, enum ferry_tier tier, uint64_t bytes, const char *label,
                              ferry_buf **out);

/**
 * @brief As ferry_exec_queue_create(), for device @p device of a multi-device executor
 *        (ferry_exec_config::n_devices): its kernels run on that device, its copies use that
 *        device's link. ferry_exec_queue_create() is device 0.
 * @return FERRY_ERR_INVALID when @p device is not one of the executor's devices.
 */
FERRY_API ferry_status ferry_exec_queue_create_on(ferry_exec *ex, enum ferry_queue_role role, int32_t device,
                                                  int32_t *out);

/**
 * @brief As ferry_exec_alloc(), on device @p device: a device-tier buffer counts against that
 *        device's budget (each device has device_budget_bytes). ferry_exec_alloc() is device 0.
 *        A copy between device buffers of two devices is a peer-to-peer copy (the simulator
 *        prices it on the profile's interconnect).
 * @return FERRY_ERR_INVALID when @p device is not one of the executor's devices;
 *         FERRY_ERR_BUDGET over that device's budget.
 */
FERRY_API ferry_status ferry_exec_alloc_on(ferry_exec *ex, int32_t device, enum ferry_tier tier, uint64_t bytes,
                                           const char *label, ferry_buf **out);

/**
 * Bytes per element at which an executor's device holds the engine's workspace (the activations
 * of a step and the scratch a quantized weight is expanded into): what the work takes on the
 * runtime the executor is, or simulates. The engine lays the workspace out in fp32 on every
 * executor (its kernels address fp32 rows) and charges the device tier these sizes
 * (ferry_exec_alloc_charged()).
 */
struct ferry_exec_elem_bytes {
  uint32_t activation; /**< an activation element (hidden states, q/k/v, attention output, FFN
                            intermediates, expert inputs and outputs), also as it crosses between
                            device and CPU in a hybrid run: 4 on host and cuda (they compute in
                            fp32); in sim the simulated runtime's (2 for fp16/bf16,
                            ferry_hw_profile_elem_bytes()) */
  uint32_t dequant;    /**< an element of a quantized weight expanded for a product: 4 on host and
                            cuda (an fp32 copy); in sim 2 for the fp16 copy a non-fused runtime's
                            dequantize kernel writes, 0 where its fused kernels read the packed
                            weight (no copy) */
};

/**
 * @brief The element sizes at which this executor's device holds the engine's workspace.
 * @param ex the executor.
 * @param out filled: {4, 4} for an executor that computes in fp32 (host, cuda, and any backend
 *        that does not say), the simulated runtime's for sim.
 */
FERRY_API void ferry_exec_elem_bytes(const ferry_exec *ex, struct ferry_exec_elem_bytes *out);

/**
 * @brief As ferry_exec_alloc_on(), charging the tier @p charged_bytes for a buffer addressable
 *        as @p bytes: the buffer's references, bounds checks and ferry_exec_buf_size() are those
 *        of @p bytes, its budget check, usage, peak and memory samples those of @p charged_bytes.
 *        Only an executor without data (ferry_exec_has_data() 0: the simulator, whose buffers
 *        hold no bytes) may be charged less than it addresses: it charges what the runtime it
 *        simulates would hold (the engine's fp32 workspace at the runtime's element sizes,
 *        ferry_exec_elem_bytes()).
 * @return FERRY_OK; FERRY_ERR_INVALID when @p charged_bytes exceeds @p bytes, or is below it on an
 *         executor with data (it holds every byte it allocates); else as ferry_exec_alloc_on().
 */
FERRY_API ferry_status ferry_exec_alloc_charged(ferry_exec *ex, int32_t device, enum ferry_tier tier, uint64_t bytes,
                                                uint64_t charged_bytes, const char *label, ferry_buf **out);

/**
 * @brief As ferry_exec_alloc_charged(), for a window on a layout: the buffer holds @p bytes
 *        addressed at offsets [@p base, @p base + @p bytes), the layout's lower offsets being
 *        held by another buffer (the engine's workspace in a hybrid run whose routed experts all
 *        run on the CPU: its leading buffers only the CPU's ops address, in the CPU's copy at the
 *        same offsets, so the device holds and is charged for the rest only). A reference below
 *        @p base is outside the buffer: copies and kernels addressing it are refused with
 *        FERRY_ERR_RANGE like those past its end. @p charged_bytes is compared with @p bytes.
 * @return as ferry_exec_alloc_charged(); FERRY_ERR_INVALID when @p base + @p bytes overflows.
 */
FERRY_API ferry_status ferry_exec_alloc_window(ferry_exec *ex, int32_t device, enum ferry_tier tier, uint64_t base,
                                               uint64_t bytes, uint64_t charged_bytes, const char *label,
                                               ferry_buf **out);

/** The kind of host memory a host-tier buffer is (ferry_exec_alloc_host()). */
enum ferry_host_memory {
  FERRY_HOST_MEMORY_DEFAULT = 0, /**< the configuration's (ferry_exec_config::lock_host_memory; the
                                      simulator created without one: pinned) */
  FERRY_HOST_MEMORY_PINNED,      /**< page-locked: cuda cudaHostAlloc, host executor mlock (warned
                                      when refused), sim copies at the link's pinned rate */
  FERRY_HOST_MEMORY_PAGEABLE     /**< ordinary memory: cuda malloc (copies staged by the driver),
                                      host executor unlocked, sim copies to the device at the
                                      pageable rate (link.pageable_h2d_gbps, or the staged
                                      formula with host.staged_h2d_gbps) with the host waiting for
                                      each, as on a pageable run */
};

/**
 * @brief Allocate a host-tier buffer of the given memory kind, whatever the configuration's
 *        (ferry_exec_config::lock_host_memory): a run whose weights are pinned can keep, say,
 *        its KV cache in pageable memory, as FlexGen does. Otherwise as ferry_exec_alloc() with
 *        FERRY_TIER_HOST. The simulator prices a copy to the device by its source buffer's kind;
 *        a copy from the device into pageable memory keeps link.d2h_gbps (profiles have no
 *        pageable device-to-host figure).
 * @param kind a ::ferry_host_memory.
 * @return FERRY_OK; FERRY_ERR_INVALID for an unknown @p kind; as ferry_exec_alloc() otherwise.
 */
FERRY_API ferry_status ferry_exec_alloc_host(ferry_exec *ex, uint64_t bytes, enum ferry_host_memory kind,
                                             const char *label, ferry_buf **out);

/** @brief 1 when a host-tier buffer is page-locked (pinned), 0 when pageable; 1 for device-tier
 *         buffers, 0 for NULL. */
FERRY_API int ferry_exec_buf_pinned(const ferry_buf *buf);

/** @brief Devices the executor drives (1 unless configured with n_devices > 1). */
FERRY_API int32_t ferry_exec_device_count(const ferry_exec *ex);

/** @brief Device a buffer lives on (0 for host-tier buffers and single-device executors). */
FERRY_API int32_t ferry_exec_buf_device(const ferry_buf *buf);

/**
 * @brief Device-tier bytes in use and the peak of one device since creation (the tier figures
 *        of ferry_exec_tier_usage() are all devices together).
 * @param used receives the bytes in use (may be NULL); 0 for a device out of range.
 * @param peak receives the peak (may be NULL).
 */
FERRY_API void ferry_exec_device_usage(const ferry_exec *ex, int32_t device, uint64_t *used, uint64_t *peak);

/** @brief Free a buffer (its queues must be idle on it). Accepts NULL. */
FERRY_API void ferry_exec_free(ferry_exec *ex, ferry_buf *buf);

/** @brief The file behind a disk-tier buffer (borrowed, valid until the buffer is freed), or NULL
 *         (another tier, or an executor that keeps no files: the simulator). */
FERRY_API const char *ferry_exec_buf_file(const ferry_buf *buf);

/** @brief Size in bytes of a buffer (what it holds, from its base). */
FERRY_API uint64_t ferry_exec_buf_size(const ferry_buf *buf);

/** @brief The first offset a buffer addresses: a window's base (ferry_exec_alloc_window()), 0 for
 *         every other buffer. */
FERRY_API uint64_t ferry_exec_buf_base(const ferry_buf *buf);

/** @brief Tier of a buffer. */
FERRY_API enum ferry_tier ferry_exec_buf_tier(const ferry_buf *buf);

/**
 * @brief Host-visible pointer to a buffer's bytes, or NULL when the bytes are not host
 *        visible (device memory on a GPU; every buffer in the simulator). Borrowed.
 */
FERRY_API void *ferry_exec_buf_host_ptr(ferry_exec *ex, ferry_buf *buf);

/** @brief Bytes in use and peak bytes of a tier since creation (or the last reset). */
FERRY_API void ferry_exec_tier_usage(const ferry_exec *ex, enum ferry_tier tier, uint64_t *used, uint64_t *peak);

/** @brief Budget of a tier (0 = unlimited). */
FERRY_API uint64_t ferry_exec_tier_budget(const ferry_exec *ex, enum ferry_tier tier);

/**
 * @brief Change the budget of a tier while the executor runs (memory pressure: the engine sheds
 *        memory first, then lowers the budget, so later allocations are held to it).
 * @param ex the executor.
 * @param tier FERRY_TIER_DEVICE or FERRY_TIER_HOST.
 * @param bytes the new budget (0 = unlimited).
 * @return FERRY_OK; FERRY_ERR_BUDGET, with the budget set all the same, when the tier already
 *         holds more (the message gives both figures); FERRY_ERR_INVALID for another tier.
 */
FERRY_API ferry_status ferry_exec_set_budget(ferry_exec *ex, enum ferry_tier tier, uint64_t bytes);

/**
 * @brief Enqueue a read of a file range of a store into a host buffer.
 * @param flags FERRY_READ_DIRECT / FERRY_READ_DROP_CACHE (store.h). With DIRECT, the data
 *        lands at dst + *shift where shift = offset % FERRY_DIRECT_ALIGN, and the buffer
 *        needs ferry_store_direct_span() bytes from the aligned start dst.offset.
 */
FERRY_API ferry_status ferry_exec_read(ferry_exec *ex, int32_t queue, struct ferry_store *store, uint32_t file,
                             uint64_t offset, uint64_t len, struct ferry_ref dst, unsigned flags);

/** @brief Enqueue a copy of @p bytes between buffers; direction follows their tiers (a disk-tier
 *         buffer on one side: a read or write of its file, the other side in the host tier). */
FERRY_API ferry_status ferry_exec_copy(ferry_exec *ex, int32_t queue, struct ferry_ref dst, struct ferry_ref src,
                             uint64_t bytes);

/**
 * @brief Enqueue a copy into a device buffer of bytes that stand for what the other ranks of a
 *        data-parallel group send over the interconnect: their partitions of a weight ZeRO-3
 *        all-gathers (ferry_engine_config::zero_gpus). The executor drives one rank, so the
 *        bytes come from @p src (host or device memory holding the same data): host and cuda copy
 *        them as ferry_exec_copy() does, so the result is exact; the simulator prices the copy on
 *        the profile's interconnect (interconnect.gpu_gbps, latency_ns) instead of the link. Its
 *        activity is named "all-gather", of kind FERRY_COPY_PTOP.
 * @return FERRY_OK; FERRY_ERR_INVALID when @p dst is not in the device tier, or as ferry_exec_copy().
 */
FERRY_API ferry_status ferry_exec_copy_peers(ferry_exec *ex, int32_t queue, struct ferry_ref dst, struct ferry_ref src,
                                             uint64_t bytes);

/** @brief Enqueue a kernel. The struct is copied; its immediate arrays are borrowed. */
FERRY_API ferry_status ferry_exec_compute(ferry_exec *ex, int32_t queue, const struct ferry_kernel *kernel);

/** @brief Create an event (not yet recorded: waiting on it returns at once). */
FERRY_API ferry_status ferry_exec_event_create(ferry_exec *ex, ferry_event **out);

/** @brief Destroy an event. Accepts NULL. */
FERRY_API void ferry_exec_event_destroy(ferry_exec *ex, ferry_event *ev);

/**
 * @brief Record an event on a queue: it completes when every op enqueued on the queue
 *        before it has completed. Re-recording replaces the previous record (CUDA semantics).
 */
FERRY_API ferry_status ferry_exec_record(ferry_exec *ex, int32_t queue, ferry_event *ev);

/** @brief Make a queue wait (without blocking the host) for the event's latest record. */
FERRY_API ferry_status ferry_exec_queue_wait(ferry_exec *ex, int32_t queue, ferry_event *ev);

/**
 * @brief Block the host until the event's latest record completes. The only blocking point;
 *        in the simulator it advances virtual time until the event has happened. When the host
 *        really waited and a sink is installed, the wait is reported as a range activity named
 *        "host wait" (step, layer and expert -1).
 * @return FERRY_OK, or the first error of an op that failed before the event.
 */
FERRY_API ferry_status ferry_exec_sync(ferry_exec *ex, ferry_event *ev);

/** @brief Whether the event's latest record has completed (1) or not (0). */
FERRY_API int ferry_exec_query(ferry_exec *ex, ferry_event *ev);

/** @brief Drain every queue (host waits for all enqueued work). */
FERRY_API ferry_status ferry_exec_drain(ferry_exec *ex);

/** @brief Executor time in ns since creation: wall clock for real executors, virtual for sim. */
FERRY_API int64_t ferry_exec_now(ferry_exec *ex);

/** @brief Wait until executor time @p t_ns (returns at once if already past). */
FERRY_API void ferry_exec_sleep_until(ferry_exec *ex, int64_t t_ns);

/** @brief Total ns a queue has spent waiting on events that were not yet complete. */
FERRY_API int64_t ferry_exec_queue_stall_ns(const ferry_exec *ex, int32_t queue);

/** @brief Total ns a queue has spent running ops. */
FERRY_API int64_t ferry_exec_queue_busy_ns(const ferry_exec *ex, int32_t queue);

/**
 * @brief Report an engine phase (step, weight load, ...) as a range activity (an NVTX-style
 *        range on the timeline). Times are on the executor's clock.
 * @param ex the executor.
 * @param name static string naming the range.
 * @param start_ns start of the range.
 * @param end_ns end of the range.
 * @param step engine step, or -1.
 * @param layer layer, or -1.
 */
FERRY_API void ferry_exec_emit_range(ferry_exec *ex, const char *name, int64_t start_ns, int64_t end_ns, int32_t step,
                           int32_t layer);

/**
 * @brief A range of engine work in progress (a step, a layer, a block or expert fetch),
 *        opened by ferry_exec_range_begin() and closed by ferry_exec_range_end(). Plain data
 *        owned by the caller, usually on its stack.
 */
struct ferry_exec_range {
  const char *name;  /**< static string naming the range ("step", "layer", "block fetch", ...) */
  int64_t start_ns;  /**< executor time at the open */
  int32_t step;      /**< engine step, or -1 */
  int32_t layer;     /**< layer, or -1 */
  int32_t expert;    /**< expert, or -1 */
  uint64_t nvtx_id;  /**< the NVTX range opened with it (0: none) */
  int32_t outer_step;   /**< the enclosing range's step, restored at the end */
  int32_t outer_layer;  /**< the enclosing range's layer, restored at the end */
  int32_t outer_expert; /**< the enclosing range's expert, restored at the end */
};

/**
 * @brief Open a range of engine work now, on the calling thread.
 *
 * Executors that run in real time (host, cuda) also open an NVTX range in the domain "ferry"
 * (message "layer 3", "expert fetch L2 E5", ...; payload the step), so a profiler attached to
 * the process (Nsight Systems: `nsys profile -t nvtx,cuda`) shows the engine's phases over
 * its own timeline. Without a profiler attached the NVTX call is a no-op; builds without
 * the CUDA toolkit's NVTX headers make none. The simulator's clock is virtual: no NVTX there.
 * Until the range ends, the copies and reads submitted are attributed to its step, layer and
 * expert (their activity records carry them), so a timeline ties each fetch to its layer.
 * Ranges nest: ending one restores the enclosing range's attribution.
 * @param ex the executor.
 * @param name static string naming the range.
 * @param step engine step, or -1.
 * @param layer layer, or -1.
 * @param expert expert, or -1.
 * @return the open range, to pass to ferry_exec_range_end().
 */
FERRY_API struct ferry_exec_range ferry_exec_range_begin(ferry_exec *ex, const char *name, int32_t step, int32_t layer,
                                               int32_t expert);

/**
 * @brief Close a range opened by ferry_exec_range_begin(): ends its NVTX range and reports it
 *        as a range activity (as ferry_exec_emit_range()) from its open until now. Any thread
 *        may close it; closing twice is harmless.
 */
FERRY_API void ferry_exec_range_end(ferry_exec *ex, struct ferry_exec_range *range);

/** @brief Report the bytes in use of every tier now as memory activities. */
FERRY_API void ferry_exec_sample_memory(ferry_exec *ex);

/** Queries of one sequence an attention kernel keeps on chip while it streams K and V past them
 *  (FlashAttention-2's tile for head dims up to 128): a prefill chunk reads its cached keys once
 *  per tile of this many queries (ferry_kernel_cost()). */
#define FERRY_ATTN_Q_TILE 128

/**
 * @brief Cost-model view of a kernel as it is issued: floating-point operations and bytes of
 *        memory traffic (weights as the op reads them, fp32 activations; attention reads the
 *        cached K and V once per tile of FERRY_ATTN_Q_TILE queries of a sequence, from the first
 *        key its window or chunk lets the tile see, and does 4 x heads x head_dim flops per
 *        (query, key) pair the mask keeps; MLA attention reads its latent rows the same way). Used by the
 *        simulator and calibration and put on every kernel activity record.
 */
FERRY_API void ferry_kernel_cost(const struct ferry_kernel *kernel, double *flops, uint64_t *bytes);

/** @brief Name of a kernel kind ("matmul", "attention", ...). */
FERRY_API const char *ferry_kernel_kind_name(enum ferry_kernel_kind kind);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_EXEC_H */
