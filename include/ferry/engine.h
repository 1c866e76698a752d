/**
 * @file engine.h
 * @brief The offload engine: plans residency for a device budget, streams blocks of layers and
 *        experts through the executor with prefetching, and serves a request trace with
 *        continuous batching. The same engine runs on every executor (host, cuda, sim).
 */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include "ferry/api.h"

#include <stdint.h>
#include <stdio.h>

#include "ferry/exec.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/status.h"
#include "ferry/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief Receives the logits of one generated token (real executors only).
 * @param user the pointer given in the configuration.
 * @param req_id the request.
 * @param token_index which output token (0 = the first).
 * @param tokens the sequence's token ids so far (prompt and generated inputs); the logits are
 *        those of the last position. Borrowed for the call.
 * @param n_tokens length of @p tokens.
 * @param logits the logits; borrowed for the call.
 * @param vocab length of @p logits.
 */
typedef void (*ferry_logits_fn)(void *user, int64_t req_id, int32_t token_index, const int32_t *tokens,
                                int32_t n_tokens, const float *logits, int64_t vocab);

/**
 * @brief Supplies routing decisions when the executor computes nothing (the simulator):
 *        fill @p ids (distinct experts) and @p weights for one token at one layer. @p weights
 *        is NULL when nobody reads them (no recording, no predictor): skip drawing them.
 */
typedef void (*ferry_routing_fn)(void *user, int64_t req_id, int32_t token_index, int32_t layer, int32_t top_k,
                                 int32_t n_experts, int32_t *ids, float *weights);

/**
 * @brief The same decisions for the @p n tokens of one step at one layer: token i is request
 *        @p req_ids[i]'s token @p token_index[i]; its experts go to ids[i * top_k ...] and its
 *        weights (when @p weights is not NULL) to weights[i * top_k ...]. Answers equal the
 *        per-token function's; a source gives both when drawing many at once is cheaper (a
 *        simulated trace asks hundreds of millions of times).
 */
typedef void (*ferry_routing_many_fn)(void *user, int64_t n, const int64_t *req_ids, const int32_t *token_index,
                                      int32_t layer, int32_t top_k, int32_t n_experts, int32_t *ids, float *weights);

/**
 * @brief Receives every routing decision the engine acts on (e.g. to record a routing trace).
 *        @p token_features are the token's predictor features (n_features of them, the same at
 *        every layer) when the configuration asks for token_features and the executor
 *        computes; NULL with n_features 0 otherwise.
 */
typedef void (*ferry_routing_record_fn)(void *user, int64_t req_id, int32_t token_index, int32_t layer,
                                        int32_t top_k, const int32_t *ids, const float *weights,
                                        int32_t n_features, const float *token_features);

/** What the engine knows about one token when it asks its expert predictor
 *  (ferry_expert_predict_fn): one struct, so a predictor that needs more is a new member, not a
 *  new signature. Arrays are borrowed for the call. */
struct ferry_expert_predict_request {
  int64_t req_id;               /**< the request */
  int32_t token_index;          /**< the token's position in its sequence */
  int32_t seq_len;              /**< the request's prompt + output length */
  int32_t layer_now;            /**< the layer just routed */
  int32_t target_layer;         /**< the layer to predict (layer_now + 1 ... + prefetch depth) */
  int32_t k;                    /**< experts per token */
  int32_t n_experts;            /**< experts per layer */
  const int32_t *ids_now;       /**< the token's chosen experts at layer_now (k of them) */
  const float *weights_now;     /**< their gate weights */
  const float *lookahead_logits; /**< the router logits of target_layer on this token's hidden state
                                      at layer_now (n_experts), when the configuration asks for
                                      router_lookahead and the executor computes; else NULL */
  const float *token_features;  /**< the token's predictor features (n_features), when asked for
                                      and the executor computes; else NULL */
  int32_t n_features;           /**< entries of token_features */
};

/**
 * @brief Expert predictor: which experts of rq->target_layer to prefetch for one token.
 * @param user the pointer given in the configuration.
 * @param rq what the engine knows.
 * @param out_ids receives up to @p max experts, best first.
 * @param max capacity of out_ids.
 * @return how many experts were written.
 */
typedef int32_t (*ferry_expert_predict_fn)(void *user, const struct ferry_expert_predict_request *rq, int32_t *out_ids,
                                           int32_t max);

/** Where work whose weights are not on the device runs (`--offload-compute`). */
enum ferry_compute_where {
  FERRY_COMPUTE_GPU = 0, /**< fetch the weights to the device and compute there (default) */
  FERRY_COMPUTE_CPU,     /**< compute on the host's CPU where the weights live (host memory); only
                              activations cross the link (Fiddler, ktransformers, llama.cpp's
                              CPU layers) */
  FERRY_COMPUTE_AUTO     /**< per op, Fiddler's rule: fetch when transfer + device time is less
                              than the CPU's time, from the rates in the configuration */
};

/** Throughputs the FERRY_COMPUTE_AUTO rule compares, per second (0: that side is never chosen
 *  for lack of a figure). `ferry sim` takes them from the hardware profile. */
struct ferry_compute_rates {
  double cpu_flops;    /**< the CPU's math, flop/s */
  double cpu_bytes;    /**< the CPU's reading of weights from host memory, bytes/s */
  double device_flops; /**< the device's math, flop/s */
  double device_bytes; /**< the device's memory, bytes/s */
  double link_bytes;   /**< host -> device copies, bytes/s */
  int64_t offload_min_rows; /**< streamed layers (compute_layers AUTO): the runtime's fixed rule in
                            place of the comparison: a step whose largest micro-batch has at least
                            this many tokens computes them on the device (their weights copied), a
                            smaller one on the CPU (llama.cpp's offload_op: 32; `ferry sim` takes
                            runtime.offload_min_rows); 0: compare the rates */
};

/**
 * @brief Memory-pressure control (ferry_engine_config::pressure).
 *
 * Between steps the engine measures a pressure index per tier (bytes in use / budget; for the
 * host tier of a real executor, with watch_os, at least the OS's figure) and degrades in steps
 * above the high-water mark: (1) prefetch depth halved, (2) expert cache halved, (3) on-demand
 * loading (nothing kept in host memory, nothing prefetched), (4) new requests refused
 * (ferry_request_metrics::refused). It recovers one step at a time once every index is below
 * the low-water mark and the step down is predicted to stay under the high mark (hysteresis).
 * A budget change (ferry_engine_config::budget_schedule) re-plans at once; a tier over its
 * budget is shed before the next step runs. The device tier is planned to its budget and
 * degrades only when a budget change leaves it over (its marks are 1.0); the host tier is
 * planned to its low-water mark. Every transition is an engine event (ferry_engine_events()).
 */
struct ferry_pressure_config {
  int enabled;          /**< run the controller (required by a budget schedule) */
  double high_water;    /**< degrade above this index (default 0.85) */
  double low_water;     /**< recover below this index (default 0.70; below high_water) */
  int watch_os;         /**< host index at least 1 - MemAvailable/MemTotal, and 1 while the PSI
                             memory "some avg10" reaches psi_some_pct (Linux, real executors) */
  double psi_some_pct;  /**< PSI threshold in percent (default 10) */
  int64_t min_dwell_ns; /**< least time between transitions unless a tier is over its budget
                             (default 0: any step boundary) */
};

/** A budget change during a run (ferry_engine_config::budget_schedule). */
struct ferry_budget_change {
  int64_t at_ns;        /**< time since the start of serving */
  enum ferry_tier tier; /**< FERRY_TIER_HOST or FERRY_TIER_DEVICE */
  uint64_t bytes;       /**< the new budget (> 0) */
};

/** How a multi-device run splits the model over its devices (ferry_engine_config::parallel). */
enum ferry_parallel {
  FERRY_PARALLEL_NONE = 0, /**< one device */
  FERRY_PARALLEL_TP = 1,   /**< tensor parallel (Megatron-LM): each device holds 1/N of every layer's
                                attention heads (q, k, v column-split, o row-split) and of its FFN
                                columns (gate, up column-split, down row-split) and of the KV cache;
                                one all-reduce of the hidden state after attention and one after the
                                FFN; embeddings, norms and the head replicated */
  FERRY_PARALLEL_PP = 2,   /**< pipeline parallel: contiguous blocks of layers per device (with their
                                KV cache), the hidden state copied device to device between stages;
                                the embedding on the first device, the head on the last */
  FERRY_PARALLEL_EP = 3    /**< expert parallel (MoE models): the routed experts of every layer in
                                contiguous ranges per device (expert x on device x N / E), attention
                                and dense layers tensor parallel as FERRY_PARALLEL_TP; every device
                                holds the layer's tokens (after attention's all-reduce), runs its own
                                experts on those routed to them and combines their rows; an
                                all-reduce of the hidden state joins the devices' partial sums */
};

/** Engine configuration (copied at create time). */
struct ferry_engine_config {
  int32_t block_layers;          /**< consecutive layers per streamed block; 0 = all */
  int32_t prefetch_depth;        /**< blocks in flight ahead of the computing one (0 = on demand) */
  int32_t block_slots;           /**< device slots the streamed blocks take turns in; 0 = prefetch_depth
                                      + 1. A fetch lands in the slot of the block block_slots -
                                      prefetch_depth before the computing one, so with exactly
                                      prefetch_depth + 1 it waits for the previous block's compute
                                      (a copy from pageable memory, which holds the host, then holds
                                      the next compute too); one more lets it land while that block
                                      still computes, as PyTorch runtimes do (each fetched module
                                      gets memory of its own from the caching allocator). At least
                                      prefetch_depth + 1, at most 66 */
  int32_t pin_first;             /**< first layers kept resident */
  int32_t pin_last;              /**< last layers kept resident */
  int resident_attention;        /**< keep all attention resident, stream only FFN / experts */
  int resident_all;              /**< keep everything resident (reference runs) */
  int fill_budget;               /**< where no expert cache takes the device budget left after the
                                      working set (dense models; MoE models whose experts move with
                                      their layers, or whose routed experts all run on the CPU:
                                      compute_experts FERRY_COMPUTE_CPU without a predictor, a
                                      per-layer split or a preloading placement): pin whole layers,
                                      from the last, with it. Other MoE models give it to the expert
                                      cache either way: FERRY_ERR_INVALID for them. `ferry run`/`sim`
                                      set it when they choose the budget */
  int home_disk;                 /**< leave streamed units on disk instead of host memory */
  int stream_embeddings;         /**< stream the embedding tables (token, position, embedding norm)
                                      and the head (final norm, LM head) as blocks of their own in the
                                      fetch order: the embeddings before the first layer, the head
                                      before the logits, each in a block slot only while used; a tied
                                      head fetches the token table a second time (DeepSpeed ZeRO-3
                                      keeps only parameters under its persistence threshold on the
                                      device). Ignored when every weight is resident; one device, on
                                      the device only (not with --offload-compute layers=cpu|auto) */
  int expert_cache_lfu;          /**< legacy: LFU eviction (the same as expert_cache "lfu") */
  const char *expert_cache;      /**< expert placement policy (`--expert-cache`): "auto" (the default,
                                      frequency with ageing: scan-resistant), "lru", "lfu" or "static"
                                      (the most routed experts pinned); NULL: "auto" (or "lfu" with
                                      expert_cache_lfu). Borrowed; must outlive the engine */
  int32_t expert_cache_per_layer; /**< K > 0: K cache slots per layer, each layer evicting only its
                                      own (mixtral-offloading), under the policy above (lru when
                                      none is named) */
  const int64_t *expert_popularity; /**< optional: how often each (layer, expert) is routed, layer
                                      major (a routing trace's counts, `--predictor-routing`): the
                                      static policy pins the most routed before serving. Copied */
  uint64_t device_budget_bytes;  /**< device budget (0 = unlimited: everything resident) */
  uint64_t host_budget_bytes;    /**< host budget (0 = unlimited) */
  int32_t max_batch;             /**< concurrent sequences (KV-cache slots); default 8 */
  int32_t max_step_tokens;       /**< tokens per step, decode and prefill chunks; default 256 */
  int32_t max_seq_tokens;        /**< KV-cache capacity per sequence; default 2048 (or the model's
                                      maximum position when smaller); more than the maximum position
                                      is FERRY_ERR_INVALID */
  unsigned read_flags;           /**< FERRY_READ_DIRECT / FERRY_READ_DROP_CACHE for disk reads */
  uint64_t seed;                 /**< token ids */
  int greedy;                    /**< next token = argmax of the logits (default: seeded draw) */
  enum ferry_kv_format kv_format; /**< how the KV cache stores keys and values (fp32, fp16, bf16, or
                                      fp8 / int8 / int4 with group scales); FERRY_KV_AUTO (0, the
                                      default): the model's own dtype (ferry_model_kv_format()) */
  ferry_logits_fn on_logits;     /**< optional logits callback */
  void *logits_user;             /**< passed to on_logits */
  ferry_routing_fn routing;      /**< routing source for executors without data; required for MoE models there */
  void *routing_user;            /**< passed to routing */
  ferry_routing_many_fn routing_many; /**< optional: the same source for many tokens at once (used instead of
                                      routing when set; same routing_user) */
  struct ferry_qplan quant;      /**< without weight files (simulation): the formats to size the
                                      model's tensors by; a quantized folder's own formats win */
  int quant_set;                 /**< 1 when @ref quant applies */
  ferry_expert_predict_fn predict; /**< optional expert predictor: prefetches experts up to
                                      prefetch_depth layers ahead within the cache's capacity */
  void *predict_user;            /**< passed to predict */
  int predict_planned;           /**< planning before the predictor exists: 1 says predict will be
                                      set before ferry_engine_create(), so the plans made without it
                                      (ferry_engine_plan_only(), ferry_engine_plan_budgets(),
                                      ferry_engine_min_budgets()) are the run's: with every routed
                                      expert on the CPU only a filler such as a predictor makes an
                                      expert cache. ferry_prefetcher_plan() sets it (`ferry run` and
                                      `ferry sim` plan before they create the predictor);
                                      ferry_engine_create() refuses it without predict */
  int router_lookahead;          /**< apply the routers of the next max(1, prefetch_depth) layers to
                                      each MoE layer's hidden state and hand their logits to
                                      predict (gate lookahead); keeps every router resident */
  int32_t token_features;        /**< predictor features per token from the activations, for
                                      predict and on_routing: 0 (none), 3 (mlp3) or 7 (mlp7);
                                      reads each token's embedding and first-layer hidden state
                                      back (ferry/predict.h defines the features) */
  int expert_no_reuse;           /**< predictor "none": every routed expert is fetched on demand,
                                      the cache is not consulted */
  int allow_nonfinite;           /**< run weights holding NaN or Inf (counted, with a warning);
                                      by default ferry_engine_create() refuses them
                                      (ferry_store_scan_nonfinite()) */
  ferry_routing_record_fn on_routing; /**< optional: every routing decision */
  void *on_routing_user;         /**< passed to on_routing */
  enum ferry_compute_where compute_experts; /**< routed experts that are not on the device (a
                                      cache miss): fetched (GPU), computed on the CPU from host
                                      memory, or by the rule (AUTO); they must live in host memory */
  enum ferry_compute_where compute_layers; /**< streamed layers (blocks): fetched, or computed on
                                      the CPU from host memory with their KV cache there (llama.cpp's
                                      layers left on the CPU), or per step by the rule */
  struct ferry_compute_rates rates; /**< the AUTO rule's figures */
  int32_t kv_block_tokens;       /**< a paged KV cache (vLLM): blocks of this many tokens from a pool,
                                      given to sequences as they grow; a request is admitted when the
                                      blocks for its prompt are free, and when a step needs more than
                                      are left the most recently admitted sequence is preempted (its
                                      blocks freed, its tokens prefilled again when readmitted);
                                      max_seq_tokens then reserves nothing. 0: every sequence slot
                                      reserves max_seq_tokens rows */
  int kv_preempt_swap;           /**< paged: a preempted sequence's blocks are copied to host memory
                                      and back into fresh blocks when it is readmitted, where it decodes
                                      on, instead of its tokens being prefilled again. The host copy has
                                      a slot per pool block, as many as the host budget leaves after the
                                      plan; a sequence finding too few slots, or any sequence of a model
                                      with windowed layers (per-slot rings), is recomputed */
  uint64_t kv_swap_bytes;        /**< swap: at most this many host bytes of swap slots (vLLM's
                                      swap_space), rounded down to whole blocks, still within what the
                                      host budget leaves; 0: as many as described above */
  uint64_t kv_pool_bytes;        /**< paged: the pool's bytes on the device; 0: as much as the
                                      max_batch x max_seq_tokens reservation when the budget allows,
                                      else one sequence of max_seq_tokens, and in either case what the
                                      plan leaves of the device budget when every weight is resident */
  int32_t gpu_batches;           /**< FlexGen's block schedule: this many micro-batches of max_batch
                                      sequences (and max_step_tokens tokens) each go through a layer
                                      while it is loaded, so its weights cross once per step for all
                                      of them; the KV cache holds gpu_batches x max_batch sequences
                                      (0 or 1: one batch) */
  int expert_granularity_layer;  /**< a layer's routed experts move with its block, all together
                                      (Accelerate, DeepSpeed ZeRO-3), instead of one by one through the
                                      expert cache; only the routed ones are computed */
  int kv_home_host;              /**< the KV cache in host memory, attention over it on the CPU (the
                                      device sends q, k and v and gets the result back: FlexGen,
                                      ZeRO-Inference's KV offload); the device holds no cache. The
                                      CPU keeps its own copy of the weights that attention reads
                                      (attention sinks, MLA's kv_b_proj), in its workspace */
  int kv_home_layer;             /**< each layer's KV cache where its weights live (llama.cpp's -ngl:
                                      llama_kv_cache_init allocates a layer's K and V in its buffer
                                      type): on the device for pinned layers, in host memory for
                                      streamed ones. A streamed layer computed on the CPU
                                      (compute_layers) attends there; one computed on the device
                                      sends its new k and v rows down, the CPU writes them into the
                                      host cache, and each of the step's sequences' window (every row
                                      up to its last position this step) is copied up into a device
                                      scratch (max_batch x max_seq_tokens rows, K and V, per
                                      micro-batch, in the device budget) where every token attends.
                                      The plan charges the device budget only the pinned layers'
                                      caches and that scratch (none when every streamed layer is
                                      computed on the CPU), the host budget the streamed layers'
                                      caches; fill_budget charges each layer it pins its cache.
                                      Not with kv_home_host, kv_prefill_device, kv_attention_device,
                                      resident_attention, or a latent (MLA) cache */
  enum ferry_host_memory kv_host_memory; /**< with kv_home_host: the host KV cache's memory kind
                                      (FERRY_HOST_MEMORY_DEFAULT: the executor's, as every host
                                      buffer; FlexGen pins its weights but keeps its CPU cache
                                      pageable). The simulator prices the cache's copies to the
                                      device by it (kv_home_layer: the streamed layers' cache).
                                      FERRY_ERR_INVALID without kv_home_host or kv_home_layer, or for
                                      an unknown kind */
  int kv_prefill_device;         /**< with kv_home_host: the tokens of a step that start a sequence
                                      (a whole prompt, or its first chunk, from position 0) attend on
                                      the device over a scratch cache holding only this step's K and
                                      V (max_batch x min(max_step_tokens, max_seq_tokens) rows, one
                                      layer's worth, counted in the device budget), and their new K
                                      and V rows then cross to the host cache, appended there on the
                                      CPU (FlexGen, ZeRO-Inference: prefill attention on the GPU).
                                      Tokens that need context already in the host cache (decode
                                      tokens, later chunks of a prompt) attend on the CPU as before,
                                      in the same step. FERRY_ERR_INVALID without kv_home_host */
  int kv_attention_device;       /**< with kv_home_host: every token of a step (prompt and decode)
                                      attends on the device (FlexGen without --cpu): per layer, the
                                      cached K and V rows of the step's sequences are copied from the
                                      host cache over the link into a device scratch (max_batch x
                                      max_seq_tokens rows, K and V, one layer's worth per micro-batch,
                                      counted in the device budget), the attention runs there, and the
                                      new rows cross back to the host cache, appended there on the CPU,
                                      which attends nothing. Includes what kv_prefill_device does.
                                      FERRY_ERR_INVALID without kv_home_host */
  int kv_home_disk;              /**< with kv_home_host: the host cache's home is a file on disk
                                      (the executor's disk tier; FlexGen with --percent ... 0 0 and
                                      --cpu: cache 0 % GPU, 0 % CPU): host memory holds only a
                                      staging of one layer's cache for one micro-batch (max_batch x
                                      max_seq_tokens rows, K and V) per (layer, micro-batch) read in
                                      flight, prefetch_depth + 1 of them. Before a micro-batch's
                                      attention on the CPU its sequences' cached rows of the layer
                                      are read from the file into a staging (issued prefetch_depth
                                      attentions ahead, on the disk queue), after it the step's new
                                      rows are written back; the same logits as kv_home_host.
                                      FERRY_ERR_INVALID without kv_home_host or with kv_host_memory;
                                      FERRY_ERR_UNSUPPORTED with kv_attention_device, a paged cache
                                      or layers computed on the CPU, and on an executor without a
                                      disk tier (cuda) */
  int prefill_first;             /**< 1: a step carries only prompt tokens while any admitted
                                      sequence still has prompt to prefill; decoding sequences wait
                                      (vLLM's scheduler without chunked prefill, FlexGen's block
                                      schedule, a static batch of HF generate()); 0 (default): each
                                      step carries a decode token of every decoding sequence, then
                                      prompt chunks up to max_step_tokens (chunked prefill) */
  struct ferry_pressure_config pressure; /**< memory-pressure control (off by default) */
  const struct ferry_budget_change *budget_schedule; /**< budget changes (copied; any order) */
  int32_t n_budget_changes;      /**< entries in budget_schedule */
  int32_t n_devices;             /**< devices to split the model over (0 or 1: one); the executor must
                                      drive as many (ferry_exec_config::n_devices), each with the
                                      device budget. Every weight stays resident (no offloading yet);
                                      dense models of the usual attention (no MLA, fused qkv, sandwich
                                      norms, parallel residual or ALiBi; TP and EP: unquantized, heads,
                                      KV heads and FFN width divisible by N; MoE models by EP only); no
                                      hybrid CPU compute,
                                      memory pressure or budget schedule. Other cases are
                                      FERRY_ERR_UNSUPPORTED with the reason */
  enum ferry_parallel parallel;  /**< how (FERRY_PARALLEL_TP, _PP or _EP when n_devices > 1) */
  int32_t zero_gpus;             /**< ZeRO-3's partitioned layer fetch (ZeRO-Inference on N GPUs): the
                                      run is one of N symmetric data-parallel ranks (0 or 1: none;
                                      negative: FERRY_ERR_INVALID), each serving its own batch on one device. Every streamed
                                      block's fetch copies ceil(len / N) bytes of each of its tensors
                                      over this rank's own link (from host memory, or disk through
                                      host memory), then the rest arrives from the peers
                                      (ferry_exec_copy_peers(): priced on the interconnect by the
                                      simulator, copied from the same source by host and cuda, so the
                                      data are exact), before the block's compute. A block read from
                                      disk is read whole: the N ranks reading 1/N each share the disk,
                                      which takes as long. The block slot holds the whole block (the
                                      layer is gathered). One device (not with n_devices > 1); MoE
                                      models only with experts moving with their layer */
  int expert_placement_hash;     /**< expert parallel: each layer's experts go to the devices in the
                                      order of a hash of (layer, expert), E / N a device, instead of
                                      contiguous ranges (so experts popular by their number spread) */
  struct ferry_exec_elem_bytes plan_elem_bytes; /**< planning without an executor
                                      (ferry_engine_plan_only(), ferry_engine_plan_budgets(),
                                      ferry_engine_min_budgets(), ferry_engine_prefetch_depth_used()):
                                      the element sizes the executor the run will use charges its
                                      workspace at (ferry_exec_elem_bytes(); for sim from
                                      ferry_hw_profile_elem_bytes()); activation 0 = fp32, {4, 4}.
                                      With an executor, the executor's own sizes are used */
};

/** One request to serve. */
struct ferry_engine_request {
  int64_t id;            /**< request id */
  int64_t arrival_ns;    /**< arrival time relative to the start of the run */
  int32_t prompt_tokens; /**< prompt length */
  int32_t output_tokens; /**< tokens to generate (at least 1) */
};

/** Opaque engine. */
typedef struct ferry_engine ferry_engine;

/**
 * @brief Called by ferry_engine_run() at every step boundary (and while idle, before sleeping
 *        until the next arrival), on the serving thread: a place to stage a reload
 *        (ferry_engine_reload()) at a chosen time.
 * @param user the pointer given in the options.
 * @param engine the engine.
 * @param now_ns time since the start of serving.
 */
typedef void (*ferry_tick_fn)(void *user, ferry_engine *engine, int64_t now_ns);

/** Options of one run. */
struct ferry_run_options {
  double time_scale;        /**< multiply arrival times (1 = as recorded; 0.5 = twice as fast) */
  int as_fast_as_possible;  /**< ignore arrival times: every request arrives at the start */
  int progress;             /**< print progress lines to stderr */
  ferry_tick_fn on_tick;    /**< optional: called between steps */
  void *tick_user;          /**< passed to on_tick */
};

/** Per-request outcome; times relative to the start of the run. */
struct ferry_request_metrics {
  int64_t id;             /**< request id */
  int64_t arrival_ns;     /**< when it arrived */
  int64_t first_token_ns; /**< when its first output token was ready (-1 if never) */
  int64_t finish_ns;      /**< when its last output token was ready (-1 if never) */
  int32_t prompt_tokens;  /**< prompt length */
  int32_t output_tokens;  /**< tokens generated */
  int rejected;           /**< 1 when it could never fit (longer than the KV capacity) */
  int refused;            /**< 1 when refused on arrival under memory pressure (level 4) */
};

/** Per-step record. */
struct ferry_step_metrics {
  int64_t step;          /**< step number */
  int64_t start_ns;      /**< start */
  int64_t end_ns;        /**< end (logits ready) */
  int32_t batch;         /**< sequences in the step */
  int32_t tokens;        /**< tokens processed (decode + prefill) */
  uint64_t bytes_disk;   /**< bytes read from disk during the step */
  uint64_t bytes_h2d;    /**< bytes copied host to device */
  uint64_t bytes_d2h;    /**< bytes copied device to host */
  int32_t hits;          /**< expert-cache hits */
  int32_t misses;        /**< expert-cache misses */
  int64_t stall_ns;      /**< time the compute queue waited for transfers */
  int64_t compute_busy_ns; /**< time the compute queue spent running kernels */
  int64_t h2d_busy_ns;   /**< time the host-to-device queue spent copying */
  int64_t disk_busy_ns;  /**< time the disk queue spent reading */
  int64_t kv_tokens;     /**< tokens held in the KV cache at the end of the step (its sequences' positions) */
  int64_t cpu_busy_ns;   /**< time the CPU queue spent running kernels (hybrid runs) */
  uint64_t bytes_act;    /**< activations moved between the device and the CPU (hybrid runs; part
                              of bytes_h2d and bytes_d2h) */
  int32_t cpu_experts;   /**< routed experts computed on the CPU instead of fetched (neither hits
                              nor misses) */
  uint64_t bytes_blocks; /**< host-to-device bytes of streamed layer blocks */
  uint64_t bytes_experts; /**< host-to-device bytes of routed experts (demand misses and prefetches) */
  int32_t evictions;     /**< experts evicted from the expert cache */
  int64_t kv_blocks;     /**< KV-cache blocks in use at the end of the step (paged cache; 0 otherwise) */
  uint64_t bytes_peers;  /**< bytes of streamed blocks that came from the data-parallel peers
                              (ferry_engine_config::zero_gpus; not in bytes_h2d or bytes_blocks) */
  uint64_t bytes_kv_disk; /**< KV-cache rows read from disk into host memory
                               (ferry_engine_config::kv_home_disk; part of bytes_disk) */
  uint64_t bytes_disk_write; /**< bytes written to disk: the new KV rows of a cache homed there */
};

/** Expert-cache activity of one layer over a run (ferry_engine_layer_metrics()). */
struct ferry_layer_metrics {
  int32_t layer;         /**< the layer */
  int64_t hits;          /**< routed experts found in the cache */
  int64_t misses;        /**< routed experts fetched on demand */
  int64_t evictions;     /**< experts of this layer evicted */
  int64_t prefetches;    /**< experts of this layer fetched on a prediction */
  int64_t cpu_experts;   /**< routed experts computed on the CPU */
  uint64_t bytes_h2d;    /**< weights of this layer copied host to device (its block, its experts) */
};

/** Distribution summary of one latency metric, in ns. Percentiles interpolate linearly between
 *  the closest ranks, as `ferry db show` and the report compute them (docs/metrics.md). */
struct ferry_latency_stats {
  int64_t count; /**< samples */
  double mean;   /**< mean */
  double p50;    /**< median */
  double p90;    /**< 90th percentile */
  double p99;    /**< 99th percentile */
  double max;    /**< maximum */
};

/** Summary of a run. */
struct ferry_serve_summary {
  int64_t requests_done;      /**< requests completed */
  int64_t requests_rejected;  /**< requests that could never fit */
  int64_t requests_refused;   /**< requests refused under memory pressure */
  int32_t pressure_level_max; /**< highest degradation level reached (0: none) */
  int64_t reloads;            /**< weight versions swapped in */
  int64_t budget_changes;     /**< budget changes applied (budget_bytes are those at the end) */
  int64_t steps;              /**< engine steps */
  int64_t tokens_generated;   /**< output tokens */
  int64_t duration_ns;        /**< first arrival to last finish */
  double tokens_per_s;        /**< output tokens per second over the duration */
  struct ferry_latency_stats ttft;  /**< time to first token */
  struct ferry_latency_stats tpot;  /**< time per output token after the first (requests with more
                                         than one output token) */
  struct ferry_latency_stats e2e;   /**< end-to-end latency */
  struct ferry_latency_stats step;  /**< step duration */
  uint64_t peak_bytes[FERRY_TIER_COUNT]; /**< peak bytes per tier */
  uint64_t budget_bytes[FERRY_TIER_COUNT]; /**< budget per tier (0 = unlimited) */
  uint64_t bytes_disk;        /**< total bytes read from disk while serving */
  uint64_t bytes_disk_write;  /**< total bytes written to disk while serving (a KV cache homed there) */
  uint64_t bytes_h2d;         /**< total bytes host to device while serving */
  uint64_t bytes_d2h;         /**< total bytes device to host while serving */
  uint64_t bytes_peers;       /**< total bytes of streamed blocks from the data-parallel peers
                                   (ferry_step_metrics::bytes_peers summed; not in bytes_h2d) */
  int64_t hits;               /**< expert-cache hits */
  int64_t misses;             /**< expert-cache misses */
  int64_t prefetches;         /**< experts fetched ahead on a prediction */
  int64_t prefetches_used;    /**< of those, used before being evicted */
  int64_t preemptions;        /**< sequences preempted out of a paged KV cache */
  int64_t swaps;              /**< of those, swapped to host memory (the others recomputed) */
  uint64_t swap_bytes;        /**< bytes of the swapped blocks copied device to host (as many come back;
                                   both counted in bytes_d2h and bytes_h2d) */
  int64_t kv_pool_blocks;     /**< blocks of a paged KV cache (0 without paging) */
  int64_t stall_ns;           /**< total compute stall */
  int64_t load_ns;            /**< time to load resident weights before serving */
  int64_t run_start_ns;       /**< executor time at which serving started (request and step
                                   times are relative to it) */
  int64_t kv_capacity_tokens; /**< tokens the KV cache holds: sequences x tokens per sequence */
  int64_t kv_peak_tokens;     /**< most tokens the KV cache held at the end of a step */
  int32_t devices;            /**< devices the model was split over (1: one; see
                                   ferry_engine_config::n_devices); peak_bytes[FERRY_TIER_DEVICE]
                                   and budget_bytes are then those of the fullest device */
  uint64_t device_peak_bytes[FERRY_EXEC_MAX_DEVICES]; /**< peak device-tier bytes of each device (devices of them) */
};

/**
 * @brief Plan residency and allocate every buffer; load pinned and host-resident weights.
 * @param model shapes (borrowed; must outlive the engine).
 * @param store weights (borrowed); may be NULL only when the executor computes nothing.
 * @param exec executor (borrowed); its budgets must match the configuration's.
 * @param out receives the engine, owned by the caller (ferry_engine_destroy()).
 * @return FERRY_ERR_BUDGET when a budget is below the minimum working set (the message gives
 *         the figures); FERRY_ERR_FORMAT when the weights do not match the model, or (on an
 *         executor that computes, unless allow_nonfinite) hold NaN or Inf values, the message
 *         naming the first such tensor, its file and the counts; details in ferry_last_error().
 */
FERRY_API ferry_status ferry_engine_create(ferry_engine **out, const ferry_model *model, ferry_store *store, ferry_exec *exec,
                                 const struct ferry_engine_config *config);

/**
 * @brief Only plan (no allocation, no loading): prints the plan, or the budget error.
 * @param f where to print the plan.
 */
FERRY_API ferry_status ferry_engine_plan_only(const ferry_model *model, ferry_store *store,
                                    const struct ferry_engine_config *config, FILE *f);

/**
 * @brief Whether a configuration's prefetch depth enters anything the engine does: the device
 *        slots of its streamed blocks, its disk staging slots, an expert predictor's or gate
 *        lookahead's reach, or memory-pressure control (which re-plans with a lower depth). When
 *        it does not, configurations that differ only in their prefetch depth serve the same
 *        requests identically (`ferry plan` reuses one's simulations for the other).
 * @param model shapes.
 * @param store weights, or NULL (sized from the model's dtype).
 * @param config the configuration as ferry_engine_create() would get it, budgets included.
 * @param used receives 1 when the depth is used, 0 when it cannot change anything.
 * @return FERRY_OK, or as ferry_engine_plan_only() (FERRY_ERR_BUDGET when a budget is below the
 *         minimum working set; details in ferry_last_error()); *used is then 1.
 */
FERRY_API ferry_status ferry_engine_prefetch_depth_used(const ferry_model *model, ferry_store *store,
                                                        const struct ferry_engine_config *config, int *used);

/**
 * @brief The smallest budgets a configuration can run with: the device's minimum working set
 *        (pinned units, KV cache, workspace, block slots for the prefetch depth, one expert slot
 *        unless every routed expert runs on the CPU)
 *        and the host's (read-back and staging buffers) when streaming.
 * @param model shapes.
 * @param store weights, or NULL to size from the model's dtype.
 * @param config the configuration (its budgets are ignored).
 * @param device_min receives the device minimum in bytes.
 * @param host_min receives the host minimum in bytes (with every streamed unit on disk).
 */
FERRY_API ferry_status ferry_engine_min_budgets(const ferry_model *model, ferry_store *store,
                                      const struct ferry_engine_config *config, uint64_t *device_min,
                                      uint64_t *host_min);

/** What the machine a run is planned for offers, for ferry_engine_plan_budgets(). */
struct ferry_machine_memory {
  const char *gpu_name;          /**< names the GPU in notes and errors ("h100-pcie", "CUDA device 0") */
  uint64_t gpu_bytes;            /**< the GPU's memory; 0 when there is no GPU to size from (the host
                                      executor's "device" is this machine's memory: no default) */
  uint64_t gpu_free_bytes;       /**< free GPU memory now; UINT64_MAX when unknown or all (a profile) */
  const char *host_name;         /**< names a profile's host in notes and errors */
  uint64_t host_bytes;           /**< a profile's host memory (simulated host); 0: none */
  uint64_t host_available_bytes; /**< a real machine's available memory at start; 0: unknown */
};

/** The budgets ferry_engine_plan_budgets() chose, and why, for printing. */
struct ferry_budget_plan {
  int device_defaulted;  /**< the device budget was chosen (none was given) */
  int host_defaulted;    /**< the host budget was chosen */
  int fits;              /**< the model fits the chosen device budget: everything stays resident */
  char device_note[256]; /**< "device budget 72.00 GiB (90% of h100-pcie's 80.00 GiB): the model fits,
                              everything resident", or "" */
  char host_note[256];   /**< "host budget ... (90% of ...'s host memory, ...)", or "" */
};

/**
 * @brief Fill the budgets a configuration leaves out (0) from what the machine offers.
 *
 * The device gets 90 % of the GPU's memory (vLLM's default utilisation; on a real GPU at most
 * its free memory less 256 MiB). A model that fits in it stays resident (resident_all is set);
 * a larger dense model is offloaded with its last layers pinned in what streaming leaves
 * (fill_budget); an MoE model keeps its attention resident when it fits and gives the rest to
 * the expert cache (none when every routed expert runs on the CPU: compute_experts
 * FERRY_COMPUTE_CPU without a predictor (predict, or predict_planned when it is installed after
 * this call), a per-layer split or a preloading policy: its last layers are then pinned in what
 * is left, fill_budget, and the note says so). The host gets 90 % of a profile's host memory, or
 * half of a real machine's available memory: what does not fit streams from disk. Budgets that are given are checked
 * against the machine and kept.
 * @param model shapes.
 * @param store weights, or NULL to size from the model's dtype.
 * @param machine what the GPU and host offer.
 * @param config the configuration, updated in place (budgets, resident_all, resident_attention,
 *        fill_budget).
 * @param plan receives what was chosen and a note saying why.
 * @return FERRY_OK; FERRY_ERR_INVALID when a given budget exceeds the machine's memory;
 *         FERRY_ERR_NOMEM when the GPU has no free memory for a budget.
 */
FERRY_API ferry_status ferry_engine_plan_budgets(const ferry_model *model, ferry_store *store,
                                       const struct ferry_machine_memory *machine, struct ferry_engine_config *config,
                                       struct ferry_budget_plan *plan);

/** @brief Print the engine's plan (bytes per tier, slots, home of every unit). */
FERRY_API void ferry_engine_print_plan(const ferry_engine *engine, FILE *f);

/**
 * @brief Serve requests (sorted by arrival). Metrics accumulate in the engine.
 * @param requests array of @p n requests (copied).
 */
FERRY_API ferry_status ferry_engine_run(ferry_engine *engine, const struct ferry_engine_request *requests, int64_t n,
                              const struct ferry_run_options *options);

/**
 * @brief Start serving step by step: ferry_engine_run() is this, then
 *        ferry_engine_serve_finish(). Requests may be given now (@p n of them, any order) and
 *        more added later in arrival order (ferry_engine_serve_add()); the engine's clock moves
 *        only in ferry_engine_serve_advance() and ferry_engine_serve_finish(). Several engines
 *        driven this way share one timeline (ferry_replicas_serve()).
 * @param requests array of @p n requests (copied); may be NULL when @p n is 0.
 * @param options copied; NULL for the defaults.
 * @return FERRY_OK; FERRY_ERR_INVALID for a bad request or when a run is already open;
 *         FERRY_ERR_RANGE for an arrival past the clock once scaled; FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_engine_serve_begin(ferry_engine *engine, const struct ferry_engine_request *requests,
                                                int64_t n, const struct ferry_run_options *options);

/**
 * @brief Add one request to the open run (copied; its arrival scaled by the run's options). It
 *        must arrive no earlier than every request already added.
 * @return FERRY_OK; FERRY_ERR_INVALID (no open run, a bad request, or out of order: the run is
 *         then closed), FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_engine_serve_add(ferry_engine *engine, const struct ferry_engine_request *request);

/**
 * @brief Serve until the engine's clock reaches @p until_ns (time since the run's start) or
 *        nothing known is left to do before it. A step that starts before @p until_ns runs to
 *        its end, as it would in one run; requests arriving at @p until_ns or later wait.
 * @return FERRY_OK, or the step's error (the run is then closed).
 */
FERRY_API ferry_status ferry_engine_serve_advance(ferry_engine *engine, int64_t until_ns);

/** What an engine has left to do, for a router (ferry_engine_serve_load()). */
struct ferry_engine_load {
  int64_t requests; /**< requests added and not finished (waiting, running or yet to arrive) */
  int64_t tokens;   /**< their prompt tokens still to prefill plus output tokens still to generate */
  int64_t clock_ns; /**< the engine's clock, since the run's start */
};

/** @brief What the open run has left to do now (@p out filled; zeros when no run is open). */
FERRY_API void ferry_engine_serve_load(const ferry_engine *engine, struct ferry_engine_load *out);

/**
 * @brief Serve every request added to the end, wait for the executor, close the run. Metrics
 *        stay in the engine as after ferry_engine_run().
 * @return FERRY_OK, FERRY_ERR_INVALID when no run is open, or the run's error.
 */
FERRY_API ferry_status ferry_engine_serve_finish(ferry_engine *engine);

/** How ferry_replicas_serve() picks the replica of each arriving request. */
enum ferry_router {
  FERRY_ROUTER_ROUND_ROBIN,    /**< "round-robin": replicas in turn */
  FERRY_ROUTER_LEAST_REQUESTS, /**< "least-requests": fewest requests outstanding (vLLM/SGLang routers) */
  FERRY_ROUTER_LEAST_TOKENS    /**< "least-tokens": fewest tokens outstanding (prefill left + output left) */
};

/** @brief The router's name ("round-robin", ...); static storage. */
FERRY_API const char *ferry_router_name(enum ferry_router router);

/** @brief The router named @p name; FERRY_ERR_INVALID (message names the choices) if none. */
FERRY_API ferry_status ferry_router_from_name(const char *name, enum ferry_router *out);

/**
 * @brief Data-parallel serving: @p n_engines engines (each with its own executor; each may span
 *        several devices) serve one trace together. Requests are taken in arrival order; before
 *        each, every engine is advanced to its arrival time (each on its own clock, all measured
 *        from their run's start), then the router picks one from their state at that time
 *        (ties: the lowest index). With one engine the figures are those of ferry_engine_run().
 * @param requests array of @p n requests (copied).
 * @param replica_of optional: filled with the engine that served each request, in the order of
 *        @p requests.
 * @return FERRY_OK, or the first engine's error (the thread's last error says which replica).
 */
FERRY_API ferry_status ferry_replicas_serve(ferry_engine *const *engines, int32_t n_engines,
                                            const struct ferry_engine_request *requests, int64_t n,
                                            enum ferry_router router, const struct ferry_run_options *options,
                                            int32_t *replica_of);

/**
 * @brief Data-parallel serving on executors that run in real time (host, cuda; not
 *        FERRY_EXEC_CAP_VIRTUAL): each engine is served by its own thread on the wall clock, as
 *        separate servers would be, while the calling thread replays the arrivals (scaled as
 *        @p options say, or all at once as fast as possible) and routes each request when it
 *        arrives. The router is ferry_replicas_serve()'s, reading each replica's load as its
 *        thread last published it (after every step and admission) plus the requests routed to
 *        it and not yet taken. The engines must not share an executor; each engine's callbacks
 *        (on_logits, the activity sink of its executor) run on its own thread.
 * @param requests array of @p n requests (borrowed until the call returns).
 * @param replica_of optional: filled with the engine that served each request, in the order of
 *        @p requests.
 * @return FERRY_OK, or the first failed replica's error (named); the others then stop too.
 *         FERRY_ERR_NOMEM when a thread cannot be started.
 */
FERRY_API ferry_status ferry_replicas_serve_realtime(ferry_engine *const *engines, int32_t n_engines,
                                                     const struct ferry_engine_request *requests, int64_t n,
                                                     enum ferry_router router, const struct ferry_run_options *options,
                                                     int32_t *replica_of);

/** @brief Per-request metrics of the last run; borrowed, valid until the next run. */
FERRY_API const struct ferry_request_metrics *ferry_engine_request_metrics(const ferry_engine *engine, int64_t *n);

/** @brief Per-step metrics of the last run; borrowed, valid until the next run. */
FERRY_API const struct ferry_step_metrics *ferry_engine_step_metrics(const ferry_engine *engine, int64_t *n);

/** @brief Per-layer expert-cache activity and weight traffic of the last run, one entry per
 *         layer; borrowed, valid until the next run. */
FERRY_API const struct ferry_layer_metrics *ferry_engine_layer_metrics(const ferry_engine *engine, int64_t *n);

/** @brief Summary of the last run. */
FERRY_API void ferry_engine_summary(const ferry_engine *engine, struct ferry_serve_summary *out);

/** @brief Summary over engines that served one trace together (ferry_replicas_serve()): every
 *         request's latencies, throughput over the union of their times, the fullest replica's
 *         peaks; ferry_engine_summary() is this over one engine. */
FERRY_API void ferry_engine_summary_many(const ferry_engine *const *engines, int32_t n_engines,
                                         struct ferry_serve_summary *out);

/** @brief Print a summary table (mean, P50, P90, P99) of a run. */
FERRY_API void ferry_serve_summary_print(const struct ferry_serve_summary *summary, FILE *f);

/** @brief Last detailed error (borrowed). */
FERRY_API const char *ferry_engine_errmsg(const ferry_engine *engine);

/** Kinds of engine events. */
enum ferry_engine_event_kind {
  FERRY_ENGINE_EVENT_PRESSURE, /**< a budget change or a memory-pressure transition */
  FERRY_ENGINE_EVENT_RELOAD,   /**< a weights version staged, applied, refused or rolled back */
  FERRY_ENGINE_EVENT_REFUSED   /**< a request refused under memory pressure */
};

/** Something the engine did to stay up (ferry_engine_events()). */
struct ferry_engine_event {
  int64_t t_ns;                  /**< executor time (the clock of the timeline and memory samples) */
  enum ferry_engine_event_kind kind; /**< what kind */
  int32_t tier;                  /**< the tier concerned (enum ferry_tier), or -1 */
  double pressure_index;         /**< that tier's pressure index then (NAN when not measured) */
  int32_t level;                 /**< the degradation level after it */
  char action[64];               /**< e.g. "shrink prefetch depth", "recover", "reload applied" */
  char detail[384];              /**< the figures or names behind it */
  uint64_t budget_bytes;         /**< "budget changed": the tier's new budget; else 0 */
};

/**
 * @brief The engine's events since it was created, in order. Borrowed, valid until the next
 *        call into the engine; read it after ferry_engine_run() returns.
 */
FERRY_API const struct ferry_engine_event *ferry_engine_events(const ferry_engine *engine, int64_t *n);

/**
 * @brief Check that @p store can replace the engine's weights, without changing anything: every
 *        tensor of the model present with its shape (a different quantization is fine), a
 *        residency plan within the budgets in force, and (on an executor that computes) no NaN
 *        or Inf values. Safe to call from another thread while the engine serves.
 * @return FERRY_OK; FERRY_ERR_FORMAT / FERRY_ERR_BUDGET / FERRY_ERR_IO with the reason, naming
 *         the file and tensor, in ferry_last_error().
 */
FERRY_API ferry_status ferry_engine_check_weights(ferry_engine *engine, ferry_store *store);

/**
 * @brief Stage a new weights version: checked as ferry_engine_check_weights(), then swapped in
 *        by the serving loop at a step boundary, once every sequence admitted on the current
 *        weights has finished (steps in flight finish on the weights they started with; new
 *        requests wait, none is refused). Each version is reference-counted by the sequences
 *        that run on it; the old one is released when its last sequence ends. A version staged
 *        while another waits replaces it. Safe to call from another thread.
 * @param engine the engine.
 * @param store the new weights; ownership passes to the engine on FERRY_OK (closed when
 *        released); on an error the caller keeps it and the old weights keep serving.
 * @param label names the version in events (copied; e.g. its folder), may be NULL.
 * @return FERRY_OK when staged; the check's error otherwise; FERRY_ERR_UNSUPPORTED for an engine
 *         split over several devices (ferry_engine_config::n_devices).
 */
FERRY_API ferry_status ferry_engine_reload(ferry_engine *engine, ferry_store *store, const char *label);

/**
 * @brief Change a tier's budget while the engine serves (a signal handler's or a control
 *        thread's way to say memory got scarce): applied at the next step boundary as a
 *        scheduled change would be. Needs memory-pressure control. Safe to call from another
 *        thread.
 * @return FERRY_OK; FERRY_ERR_INVALID without pressure control, for another tier or 0 bytes.
 */
FERRY_API ferry_status ferry_engine_set_budget(ferry_engine *engine, enum ferry_tier tier, uint64_t bytes);

/** @brief Version number of the weights serving now (1 for those given at create). */
FERRY_API int32_t ferry_engine_weights_version(const ferry_engine *engine);

/** @brief The memory-pressure degradation level now (0: normal; see ferry_pressure_config). */
FERRY_API int32_t ferry_engine_pressure_level(const ferry_engine *engine);

/** @brief Destroy an engine and free its buffers. Accepts NULL. */
FERRY_API void ferry_engine_destroy(ferry_engine *engine);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_ENGINE_H */
