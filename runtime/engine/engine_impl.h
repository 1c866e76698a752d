/* Internal state of the engine: the unit table (what moves as one transfer), device slots and
 * their events, step-scoped arrays, and metrics. Shared by engine.c (set-up), units.c (unit
 * table), fetch.c (moving units), forward.c (one step's ops) and serve.c (the request loop). */
#ifndef FERRY_ENGINE_IMPL_H
#define FERRY_ENGINE_IMPL_H

#include <pthread.h>

#include "common/error.h"
#include "common/rng.h"
#include "ferry/engine.h"
#include "ferry/quant.h"
#include "runtime/policy/policy.h"

enum unit_kind { UNIT_GLOBAL, UNIT_LAYER_PART, UNIT_BLOCK, UNIT_EXPERT };

/* A contiguous file range of a unit and where it lands inside the unit's device copy. */
struct unit_range {
  uint32_t file;
  uint64_t file_offset, len, unit_offset;
};

struct unit {
  enum unit_kind kind;
  int32_t layer, n_layers, expert, block;
  uint64_t bytes;            /* packed size in a slot */
  uint64_t stage_bytes;      /* staging needed for an O_DIRECT read of all ranges */
  struct unit_range *ranges;
  int32_t n_ranges;
  int pinned;                /* lives on the device for the whole run */
  enum ferry_tier home;      /* where it is read from when streamed: HOST or DISK */
  uint64_t device_offset;    /* pinned: offset in the pinned buffer */
  uint64_t host_offset;      /* home HOST: offset in the host units buffer */
  uint32_t devices;          /* pinned: bit d set when device d holds a copy (multi-device runs; else 1) */
};

/* Where a model tensor lives: its unit and offset inside it. */
struct tensor_loc {
  int32_t unit;
  uint64_t unit_offset;
  enum ferry_dtype dtype;
  int present;
  int quantized;                               /* packed parts; dequantized before use */
  struct ferry_qspec spec;
  uint64_t part_offset[FERRY_QPART_COUNT];     /* offsets of the parts inside the unit */
  enum ferry_dtype part_dtype[FERRY_QPART_COUNT];
  uint32_t part_mask;                          /* bit p: part p exists */
  uint64_t packed_bytes;                       /* all parts */
  /* tensor parallel: split over the devices, kept outside the units (mgpu.c); each device holds
   * its slice at shard_offset of its shard buffer */
  int sharded;                                 /* enum ferry__shard */
  uint32_t file;
  uint64_t file_offset, shard_offset;
};

/* How a tensor parallel run splits a tensor: not, by output rows (column parallel: q, k, v,
 * gate, up and their biases) or by input columns (row parallel: o, down). */
enum ferry__shard { SHARD_NONE, SHARD_ROWS, SHARD_COLS };

/* One device of a multi-device run: its compute queue and buffers, and an event its compute
 * queue records where another device waits for it. */
struct dev_state {
  int32_t q_compute;
  ferry_buf *pinned, *kv, *ws, *shard;
  uint64_t pinned_bytes;
  ferry_event *done;
};

/* A device slot (block or expert) with the events that order its reuse. */
struct slot {
  int32_t unit;         /* unit it holds (or is being filled with), -1 when empty */
  ferry_event *ready;   /* recorded on the copy queue after the fill */
  ferry_event *free;    /* recorded on the compute queue after the last use */
  int used;             /* free has been recorded since the last fill */
};

struct staging_slot {
  ferry_event *free;    /* recorded on the copy queue after the h2d copy out of it */
  int used;
};

/* Offsets (bytes) of the activation buffers inside the workspace. */
struct workspace {
  uint64_t dq[3];            /* dequantized weights: matmul, or an expert's gate/up/down */
  uint64_t x, h, h2, q, qa, qkv, k, v, attn, g, u, logits_r, logits_look, topk_w, topk_ids, expert_out, gather, eg,
      eu, sg, su, sout, sgate, rows, rows_n, logits, total;
  uint64_t charged; /* what the device tier is charged for it: the layout at the executor's
                       element sizes (layout_workspace, ferry_exec_elem_bytes()) */
  uint32_t act_bytes; /* the activation element size it was charged at (ferry__engine_elem_bytes()
                         at layout time): what a crossing of its rows moves per fp32 element */
  /* hybrid runs with experts on the CPU: a zero row right after expert_out (gathered in place
   * of the pairs the other side computes), the gathered rows a combine reads, and the CPU's sum
   * of its pairs per token; 0 when no expert runs on the CPU */
  uint64_t zero, expert_final, cpu_sum;
  /* --kv-home host|disk: the CPU's copies of the weights its attention reads that the device
   * holds (ferry__engine_load_mirror(): gpt-oss's sinks, MLA's kv_b_proj), mirror_bytes long;
   * 0 bytes without them */
  uint64_t mirror;
  /* hybrid runs: the leading bytes of the layout holding every buffer the CPU's ops address
   * (layout_workspace() puts them first), the size of the CPU's copy in host memory; 0 when the
   * run is not hybrid */
  uint64_t cpu_extent;
  /* the leading bytes of that which only the CPU's ops address (every routed expert on the CPU:
   * ferry_engine::experts_cpu_only): the device's workspace is the window [device_base, total)
   * at the same offsets (ferry_exec_alloc_window()), and ws.charged is that window's; 0 when the
   * device addresses the whole layout */
  uint64_t device_base;
};

/* A weights version: its store and the sequences running on it (the reference count). */
struct weights_version {
  ferry_store *store;
  int owned;            /* closed when released (staged by ferry_engine_reload) */
  int32_t id;           /* 1, 2, ... */
  int32_t refs;         /* active sequences admitted on it */
  char label[160];
};

/* One layer's part of the KV cache: K and V regions (MLA: one latent region at k_off), each
 * max_batch x rows rows. A windowed or chunked layer keeps a ring of the rows it can see. */
struct kv_layer {
  uint64_t k_off, v_off;
  uint64_t bytes; /* its K and V regions (MLA: the latent one), wherever they are */
  int32_t rows;
  int ring;
  int host; /* in the host KV buffer: the layer's attention runs on the CPU */
};

/* Tensors of a routed expert by what they are (ferry__engine_loc). */
enum { EXPERT_GATE, EXPERT_UP, EXPERT_DOWN, EXPERT_GATE_UP, EXPERT_GATE_UP_BIAS, EXPERT_DOWN_BIAS, EXPERT_SLOTS };

struct seq {
  int64_t req;          /* index into requests */
  struct weights_version *version; /* the weights it runs on */
  int32_t kv_slot;
  int32_t pos;          /* tokens in the KV cache */
  int32_t prompt_done;  /* prompt tokens processed */
  int32_t prefill;      /* tokens to prefill: the prompt, or a preempted sequence's tokens so far */
  int32_t generated;    /* output tokens produced */
  int32_t last_token;   /* input token of the next decode step */
  int32_t step_tokens;  /* tokens this sequence contributes to the current step */
  int resumed;          /* re-prefilling after a preemption: its prefill yields no new token */
  int active;
};

/* Op graphs of repeated op sequences (memo.c), keyed (kind, a, b): see ferry__memo_begin(). */
enum memo_kind {
  MEMO_LAYER = 1, /* a = layer, b = tokens x micro-batches + micro-batch: attention and the FFN up to the routing */
  MEMO_ROUTING,   /* a = layer, b = tokens: the routing read-back and the record the host waits on */
  MEMO_COMBINE,   /* a = layer, b = tokens: the MoE combine */
  MEMO_EXPERT,    /* a = layer x experts + expert, b = 2 x tokens + streamed: one expert's FFN */
  MEMO_FILL,      /* a = unit, b = ferry__engine_fill_key(): filling a slot */
  MEMO_KINDS
};

struct memo_group;
struct ferry_exec_graph;

struct ferry__memo {
  struct memo_group *groups; /* one per (kind, a) */
  struct ferry_exec_graph **near; /* the first graphs of each group (memo.c) */
  int64_t n_groups, base[MEMO_KINDS], n_near, near_base[MEMO_KINDS], near_n[MEMO_KINDS];
  int64_t n_a[MEMO_KINDS]; /* groups of each kind (the stride of a near b) */
  size_t n, bytes;
  int mode;                  /* enum ferry__graph_mode, refreshed every step */
  uint64_t launched, checked;
};

/* One use of a memoised sequence, between ferry__memo_begin() and ferry__memo_end(). */
struct memo_site {
  enum memo_kind kind;
  int64_t a, b, context_tokens;
  int recording;
  struct ferry_exec_graph *check; /* FERRY_SIM_CHECK: the graph the recording must equal */
};

/* A request preempted out of a paged KV cache: where it stood (and, swapped, where its rows are). */
struct resume {
  int32_t pos, generated, last_token;
  int preempted;
  int32_t swap_head, swap_n; /* swapped out: its blocks in swap slots swap_head -> swap_next ... */
  struct seq saved;          /* and the sequence as it stood (swapped at any point, prefill included) */
  int32_t swap_version;      /* the weights version its rows were computed with */
};

/* One micro-batch of a step (FlexGen's block schedule: --gpu-batches N runs N of them through
 * each layer while it is loaded). The engine's tok_* arrays, n_tok, n_rows and ws.x are those of
 * the micro-batch being issued (ferry__mb_use()); each keeps its own hidden state. */
struct microbatch {
  int32_t *tok_ids, *tok_pos, *tok_slot, *tok_seq, *tok_index, *tok_seqlen, *row_of_seq;
  int64_t *tok_req; /* per token: its request's id (the routing source's key) */
  int32_t n_tok, n_rows;
  uint64_t x;   /* its hidden state's offset in the workspace */
  int on_host;  /* that hidden state is in the CPU's workspace (hybrid runs) */
  /* --kv-prefill device, --kv-attention device, --kv-home layer (kv_prefill.c): tokens
   * [kvp_first, n_tok) attend on the device, each in the scratch's slot kvp_slot[t]; n_tok when
   * none (or off). Per slot: the sequence's KV slot and the rows copied up (those its cache held
   * before the step; --kv-home layer: and the step's, written to the host cache first);
   * kvp_free: recorded when the micro-batch's attention over its scratch is done */
  int32_t kvp_first;
  int32_t *kvp_slot, *kvp_src, *kvp_cached;
  ferry_event *kvp_free;
  /* --kv-home disk (kv_disk.c): per token its slot in a staging (its sequence's place in the
   * micro-batch); per such slot the rows its cache held before the step and the step's new ones */
  int32_t *kvd_slot, *kvd_cached, *kvd_new;
};

struct ferry_engine {
  struct ferry_err err;
  const ferry_model *model;
  const struct ferry_model_config *mc;
  ferry_store *store;
  ferry_exec *ex;
  struct ferry_engine_config cfg;
  struct ferry_plan plan;
  int has_data;
  int sizing_only; /* ferry_engine_min_budgets(): a plan for its sizes, never run */

  /* unit table */
  struct unit *units;
  int32_t n_units;
  struct tensor_loc *tensors; /* indexed like the model's tensors */
  int32_t *block_unit;        /* plan block -> unit */
  int32_t *expert_unit;       /* layer * n_experts + expert -> unit */
  int32_t global_unit;
  int32_t tied_head_src;      /* a streamed tied head: the model index of the table whose copy
                                 tensors[model tensor count] is, else -1 */
  int32_t *role_tensor;       /* (layer + 1) * FERRY_ROLE_COUNT + role -> tensor, or -1 */
  int32_t *expert_tensor;     /* ((layer * n_experts) + expert) * EXPERT_SLOTS + slot -> tensor, or -1 */
  int32_t *unit_slot;         /* streamed unit -> slot holding it, or -1 */
  uint64_t max_stage_extra;
  uint64_t max_q_numel;       /* elements of the largest quantized matrix (dequant scratch) */
  /* --kv-home host|disk: bytes of the CPU's copies of the weights its
   * attention reads (ws.mirror), and each copy's parts at (layer x N_MIRROR_ROLES + role) x
   * FERRY_QPART_COUNT + part, offsets into it (UINT64_MAX: none); NULL until loaded */
  uint64_t mirror_bytes;
  uint64_t *mirror_off;

  /* queues */
  int32_t q_compute, q_h2d, q_d2h, q_disk;
  /* Hybrid runs drive the device and the host's CPU over one op stream: q_cpu runs kernels on
   * host memory, q_up carries their results to the device (beside the weight copies of q_h2d,
   * which it must not queue behind). cq and cws are where ops of the part being issued go: the
   * device (q_compute, ws_buf) or the CPU (q_cpu, hws_buf); w_host reads streamed units'
   * weights from their host copies. -1 / NULL when the run is not hybrid. The crossings' events
   * are each recorded on one queue (ev_dev: compute, ev_down: device-to-host, ev_cpu: CPU, ev_up:
   * q_up), so a later record on a queue running ahead cannot satisfy a wait for an earlier one
   * (waits are for a generation or any later). */
  int32_t q_cpu, q_up, cq;
  ferry_buf *cws;
  int w_host;
  ferry_event *ev_dev, *ev_down, *ev_cpu, *ev_up;

  /* Multi-device runs (cfg.n_devices > 1, mgpu.c): n_dev devices; q_compute, pinned_buf, kv_buf
   * and ws_buf (and cq, cws) above are those of device cur_dev, whose ops are being issued
   * (ferry__dev_use). tp: devices a tensor parallel run splits each layer over (1 otherwise).
   * q_peer carries the device-to-device copies of a pipeline. */
  struct dev_state *devs;
  int32_t n_dev, cur_dev, tp, q_peer;
  int ep;                 /* expert parallel: routed experts split over the devices */
  int8_t *ep_dev;         /* expert parallel: layer * n_experts + expert -> its device */
  int32_t *ep_rows;       /* expert parallel: per device, each pair's row to combine (its own or the zero row) */
  int32_t *ep_zero;       /* per token: the zero row (clears x on the devices after the first) */
  ferry_event **mb_sent;  /* pipeline: per micro-batch, recorded after its hidden state's copy */
  uint64_t shard_bytes;   /* tensor parallel: one device's slices */
  uint64_t kv_dev_bytes;  /* one device's KV cache */

  /* buffers */
  ferry_buf *pinned_buf, *kv_buf, *ws_buf, *block_buf, *expert_buf, *host_units_buf, *staging_buf, *readback_buf,
      *bounce_buf;
  ferry_buf *hws_buf, *hkv_buf;   /* hybrid: the host's workspace (ws's layout) and KV cache */
  uint64_t hkv_bytes;
  struct workspace ws;
  enum ferry_kv_format kv_format; /* resolved: never FERRY_KV_AUTO */
  enum ferry_dtype kv_dtype;      /* its element type, as the executors store it */
  uint64_t kv_total_bytes;        /* the whole cache as laid out (layout_kv) */
  struct ferry_layer_info *li;   /* per layer: MoE, window, chunk, RoPE */
  struct ferry_rope_params *rope; /* per layer RoPE (when li.rope) */
  struct kv_layer *kv;           /* per layer KV cache regions */
  int32_t first_moe_layer;       /* -1 for dense models */
  int32_t n_moe_layers;
  float attn_scale;              /* softmax scale of attention */
  int32_t kv_capacity;
  uint64_t bounce_bytes;
  /* --kv-prefill device, --kv-attention device, --kv-home layer: the scratch of one layer's K and
   * V, in kv_buf at kvp_k_off and kvp_v_off: kvp_slots sequences x kvp_rows rows each, kvp_copies
   * of the pair (one per micro-batch when every token attends there) (kv_prefill.c) */
  uint64_t kvp_k_off, kvp_v_off, kvp_bytes;
  int32_t kvp_rows, kvp_slots, kvp_copies;
  /* --kv-home disk (kv_disk.c): the cache's file (disk tier, laid out as the host cache: hkv_bytes)
   * and its staging in host memory, kvd_copies of one layer's K and V regions for one micro-batch
   * (max_batch x kv_capacity rows each). A step's attentions on the CPU are its uses, layer by layer
   * and micro-batch by micro-batch (kvd_mbs: the step's micro-batches with tokens); use u reads
   * into copy u % kvd_copies, issued kvd_ahead uses before it; kvd_ready[c] is recorded once copy c's
   * reads are in. kvd_use: the next use; kvd_cur: the copy of the one being issued */
  ferry_buf *dkv_buf, *kvd_buf;
  ferry_event **kvd_ready;
  int32_t *kvd_mbs;
  int32_t kvd_copies, kvd_ahead, kvd_n_mbs, kvd_cur;
  int64_t kvd_use;

  /* slots */
  struct slot *block_slots, *expert_slots;
  struct staging_slot *staging;
  int32_t next_staging;
  int64_t block_fetch_seq;    /* streamed-block fetches issued so far (cyclic order) */
  int64_t block_compute_seq;  /* streamed blocks computed so far */
  struct ferry__expert_plan xplan; /* the expert cache's decisions (runtime/policy/expert_plan.c) */
  int64_t prefetches_before, prefetches_used_before; /* of the expert caches a re-plan replaced */
  /* one event per queue that records it, so completions arrive in generation order */
  ferry_event *ev_router, *ev_step, *ev_tmp, *ev_read;

  /* per-step counters */
  uint64_t step_bytes_disk, step_bytes_h2d, step_bytes_d2h;
  int32_t step_hits, step_misses;
  int32_t *predicted;          /* expert prefetch scratch: one token's guess */

  /* step-scoped arrays (sized once) */
  int32_t *tok_ids, *tok_pos, *tok_slot, *tok_seq, *tok_index; /* per token of the step */
  int32_t *tok_seqlen;      /* per token: its sequence's length after this step (length-dependent RoPE) */
  /* the step's attention context for the last (window, chunk) asked (forward.c), when ctx_valid */
  int ctx_valid;
  int64_t ctx_window, ctx_chunk, ctx_tokens;
  int64_t *tok_req;         /* per token: its request's id */
  int32_t *row_of_seq;      /* rows whose logits are computed */
  int32_t *expert_tokens;   /* per layer: tokens grouped by expert */
  int32_t *expert_ranks;
  int32_t *expert_count;    /* per expert of the current layer */
  int32_t *expert_start;
  int32_t *expert_fill;     /* scratch of group_pairs() (forward.c) */
  int pairs_grouped;        /* expert_tokens and expert_ranks hold the current layer's pairs */
  int32_t *routing_ids;     /* host copy of the current layer's top-k */
  float *routing_w;
  float *tok_features;      /* per token of the step: predictor features (FERRY_MLP7_FEATURES apart) */
  double *feat_emb5;        /* per sequence: sum, sum of squares, count of its first embeddings */
  float *feat_seg;          /* per sequence: hidden norms, then embedding variances, of its segment */
  int32_t n_tok, n_rows;
  uint8_t *pair_cpu;        /* hybrid MoE: per (token * top_k + rank) pair, computed on the CPU */
  int32_t *cpu_rows, *dev_rows; /* per pair: its expert_out row or the zero row, for each side */
  int32_t *zero_rows;       /* per token: the zero row (clears the CPU's sum) */
  uint8_t *expert_cpu_now;  /* per expert of the current layer: computed on the CPU */
  int experts_cpu_only;     /* no routed expert ever runs on the device (ferry__experts_cpu_only(),
                               set with each plan): no expert slot, and the device's workspace
                               leaves out the experts' buffers */
  int layer_on_cpu;         /* the layer being issued runs on the CPU */
  int step_layers_cpu;      /* compute_layers auto: this step computes streamed blocks on the CPU */
  uint64_t step_bytes_act;  /* activations moved between the sides this step */
  uint64_t step_bytes_blocks, step_bytes_experts; /* weights moved this step, by class */
  uint64_t step_bytes_peers; /* block bytes the data-parallel peers sent this step (zero_gpus) */
  uint64_t step_bytes_kv_disk, step_bytes_disk_write; /* --kv-home disk: rows read (in step_bytes_disk), written */
  int32_t step_evictions;
  struct ferry_layer_metrics *layer_stats; /* per layer, over the run */
  int32_t step_cpu_experts; /* routed experts computed on the CPU this step */

  /* micro-batches: n_mb of up to max_batch sequences and max_step_tokens tokens each; the
   * KV cache and the sequence table hold n_seqs = n_mb x max_batch sequences */
  struct microbatch *mbs;
  int32_t n_mb, n_seqs, cur_mb;

  /* paged KV cache (cfg.kv_block_tokens > 0): blocks of kv_block tokens from a pool, a block
   * table per sequence slot, a stack of free blocks; layers with a ring keep their own rows */
  int32_t kv_block, kv_pool_blocks, kv_blocks_per_seq, kv_free_count;
  int32_t *kv_table, *kv_free, *seq_blocks;
  struct resume *resumes;   /* per request (run), preemptions */
  int64_t preemptions, swaps;
  /* swap preemption (cfg.kv_preempt_swap): a host copy of the pool, slot by block */
  ferry_buf *kv_swap_buf;
  int32_t kv_swap_blocks; /* slots: the pool's blocks, or what the host budget leaves (swap_space()) */
  int32_t *swap_free, *swap_next, swap_free_count;
  uint64_t swap_bytes, swap_h2d_pending; /* copied out this run; copied in before the step counts it */
  /* copies wait for the compute queue (ev_swap_cmp), compute waits for them (q_d2h, q_h2d) */
  ferry_event *ev_swap_out, *ev_swap_in, *ev_swap_cmp;

  /* serving */
  struct ferry_engine_request *reqs;
  struct ferry_request_metrics *req_metrics;
  int64_t n_reqs;
  struct ferry_step_metrics *steps;
  int64_t n_steps, cap_steps;
  struct seq *seqs;         /* n_seqs */
  int32_t *seq_tokens;      /* n_seqs x kv_capacity: each sequence's token ids */
  int32_t *seq_maxpos;      /* n_seqs: scratch of step_seqlens() */
  int64_t load_ns;
  int64_t run_start_ns;
  /* a run being served step by step (ferry_engine_serve_begin() .. _finish()) */
  struct ferry__serve_state {
    int64_t *admit_order; /* [slot] admission number of its sequence (prefill order) */
    int64_t *waiting;     /* arrived requests, FCFS */
    int64_t n, next, w_head, w_tail, done, admitted, active;
    int64_t t0;      /* executor time of the run's start */
    int64_t cap_reqs; /* requests the per-request arrays hold */
    int64_t last_progress;
    struct ferry_run_options o;
    int open; /* between begin and finish */
  } serve;
  struct ferry__memo memo;

  /* staying up (adapt.c): budgets in force, memory pressure, weights versions, events */
  pthread_mutex_t adapt_mu;          /* guards staged, events (other threads stage reloads) */
  struct weights_version *current, *staged;
  int32_t next_version;
  uint64_t budget[FERRY_TIER_COUNT]; /* budgets in force (the schedule changes them) */
  struct ferry_budget_change *schedule;
  int32_t n_schedule, next_change;
  int budget_changed;
  uint64_t asked_budget[FERRY_TIER_COUNT]; /* ferry_engine_set_budget() (guarded by adapt_mu; 0: none) */
  int32_t level, level_max;
  int64_t level_since_ns;            /* executor time of the last transition (INT64_MIN: none) */
  int32_t asked_expert_slots;        /* expert slots of the first plan (level 2 halves them) */
  int refusing;                      /* level 4: new requests are refused */
  int64_t reloads, budget_changes;
  struct ferry_engine_event *events;
  int64_t n_events, cap_events;
};

/* units.c */
ferry_status ferry__engine_build_units(struct ferry_engine *e);
void ferry__engine_free_units(struct ferry_engine *e);
/* Weight reference of model tensor `role` of layer (and expert), or a ref with buf NULL when
 * the model has no such tensor; for the CPU's ops (w_host) its copy in the mirror, if it has one. */
struct ferry_ref ferry__engine_weight(struct ferry_engine *e, enum ferry_tensor_role role, int32_t layer,
                                      int32_t expert);
/* The location record of a tensor (NULL when the model has none). */
const struct tensor_loc *ferry__engine_loc(const struct ferry_engine *e, enum ferry_tensor_role role, int32_t layer,
                                          int32_t expert);
/* References of a quantized tensor's parts where the ops being issued read them (as
 * ferry__engine_weight()); buf NULL for parts its format lacks. */
void ferry__engine_weight_parts(struct ferry_engine *e, const struct tensor_loc *loc,
                                struct ferry_ref parts[FERRY_QPART_COUNT]);
/* The roles the CPU keeps copies of with --kv-home host or disk (units.c mirror_roles): the
 * mirror, sized by ferry__engine_plan_input() (mirror_bytes). */
#define N_MIRROR_ROLES 2
/* Read the mirror's tensors from the store into the CPU's workspace (ws.mirror) and record where
 * each part is (mirror_off); nothing without a mirror. Needs the CPU's workspace allocated. */
ferry_status ferry__engine_load_mirror(struct ferry_engine *e);
/* Plan input from the unit table (sizes per layer). */
ferry_status ferry__engine_plan_input(struct ferry_engine *e, struct ferry_plan_input *in, uint64_t **attn,
                                      uint64_t **ffn);

/* fetch.c */
ferry_status ferry__engine_load_resident(struct ferry_engine *e, int skip_pinned);
ferry_status ferry__engine_prefetch_blocks(struct ferry_engine *e, int64_t upto_seq);
int32_t ferry__engine_block_slot(struct ferry_engine *e, int64_t seq);
ferry_status ferry__engine_fetch_expert(struct ferry_engine *e, int32_t unit, int32_t slot);
/* A fill of a device slot in three parts, so that a caller can record its ops with others
 * (memo.c): prepare (the staging slot when the unit is on disk), the ops, the state after. */
struct fill {
  struct staging_slot *sg; /* NULL: from host memory */
  uint64_t base;           /* the staging slot's offset */
};
void ferry__engine_fill_prepare(struct ferry_engine *e, int32_t u, struct fill *f);
int64_t ferry__engine_fill_key(const struct slot *sl, const struct fill *f); /* 0..5: what the ops depend on */
ferry_status ferry__engine_fill_ops(struct ferry_engine *e, struct slot *sl, const struct fill *f, ferry_buf *dev,
                                    uint64_t dev_off, int32_t u);
void ferry__engine_fill_done(struct ferry_engine *e, struct slot *sl, const struct fill *f, int32_t u);

/* features.c: mlp3/mlp7 predictor features from the activations (cfg.token_features) */
ferry_status ferry__features_alloc(struct ferry_engine *e);
void ferry__features_free(struct ferry_engine *e);
uint64_t ferry__features_readback_bytes(const struct ferry_engine *e);
/* after the embedding op: read the embeddings back (compute waits for the copy) */
ferry_status ferry__features_after_embed(struct ferry_engine *e);
/* with the routing read-back of `layer`: the hidden states entering the first MoE layer (the
 * caller counts their bytes, ferry__features_hidden_bytes()) */
ferry_status ferry__features_copy_hidden(struct ferry_engine *e, int32_t layer);
uint64_t ferry__features_hidden_bytes(const struct ferry_engine *e, int32_t layer);
/* after that read-back: the step's per-token features */
void ferry__features_compute(struct ferry_engine *e);
/* token t's features, or NULL when not computed (off, or an executor without data) */
const float *ferry__features_of(const struct ferry_engine *e, int64_t t);

/* kv_prefill.c: --kv-prefill device, --kv-attention device. Lay the scratch out in the device's
 * KV buffer from offset off (returns the offset after it; nothing when off); its shape for
 * messages ("" when none); the per-micro-batch slot arrays; which tokens of micro-batch m attend
 * on the device this step; an attention kernel of layer l over tokens [first, ...) pointed at
 * the scratch; before it, the copy of the current micro-batch's cached rows of layer l up into
 * the scratch (--kv-attention device; the compute queue waits for it), and after it, the
 * scratch's release. */
uint64_t ferry__kv_prefill_layout(struct ferry_engine *e, uint64_t off);
/* --kv-home layer: the scratch layer l's windows need while it runs on the device with its cache
 * in host memory (0 when it never attends there: layers computed on the CPU), for the plan to
 * charge before it lays the scratch out */
uint64_t ferry__kv_window_bytes(const struct ferry_engine *e, int64_t l);
const char *ferry__kv_prefill_shape(const struct ferry_engine *e, char *buf, size_t len);
ferry_status ferry__kv_prefill_alloc(struct ferry_engine *e);
void ferry__kv_prefill_free(struct ferry_engine *e);
void ferry__kv_prefill_split(struct ferry_engine *e, int32_t m);
void ferry__kv_prefill_scratch(struct ferry_engine *e, struct ferry_kernel *k, int64_t first, int32_t l);
ferry_status ferry__kv_scratch_load(struct ferry_engine *e, int32_t l);
ferry_status ferry__kv_scratch_used(struct ferry_engine *e);

/* kv_disk.c: --kv-home disk. The staging's bytes in host memory (0 when off); its shape for
 * messages ("" when off); the file, staging, events and per-micro-batch arrays; each micro-batch's
 * staging slots at the start of a step, then the reads of the step's first uses; in attend(),
 * before the CPU's ops of layer l's use the reads of a later one and the CPU's wait for this
 * one's, after them the write of its new rows; the kernel's cache pointed at the staging. */
uint64_t ferry__kv_disk_stage_bytes(const struct ferry_engine *e);
const char *ferry__kv_disk_shape(const struct ferry_engine *e, char *buf, size_t len);
ferry_status ferry__kv_disk_alloc(struct ferry_engine *e);
void ferry__kv_disk_free(struct ferry_engine *e);
void ferry__kv_disk_split(struct ferry_engine *e);
ferry_status ferry__kv_disk_begin(struct ferry_engine *e);
ferry_status ferry__kv_disk_load(struct ferry_engine *e, int32_t l);
ferry_status ferry__kv_disk_store(struct ferry_engine *e, int32_t l);
void ferry__kv_disk_redirect(const struct ferry_engine *e, struct ferry_kernel *k, int32_t l);
/* What the host holds of the KV cache: the whole cache, or with it on disk its staging. */
static inline uint64_t ferry__kv_host_bytes(const struct ferry_engine *e) {
  return e->cfg.kv_home_disk ? ferry__kv_disk_stage_bytes(e) : e->hkv_bytes;
}

/* kv_pages.c: the paged KV cache's blocks */
ferry_status ferry__kv_pages_alloc(struct ferry_engine *e);
void ferry__kv_pages_free(struct ferry_engine *e);
void ferry__kv_pages_reset(struct ferry_engine *e);
/* blocks for `tokens` positions */
static inline int32_t ferry__kv_pages_need(const struct ferry_engine *e, int64_t tokens) {
  return (int32_t)((tokens + e->kv_block - 1) / e->kv_block);
}
/* give slot s blocks for `tokens` positions; 0 when the pool has too few (nothing taken then) */
int ferry__kv_pages_grow(struct ferry_engine *e, int32_t s, int64_t tokens);
void ferry__kv_pages_release(struct ferry_engine *e, int32_t s);
uint64_t ferry__kv_pages_block_bytes(const struct ferry_engine *e); /* engine.c: one block, every paged layer */
/* engine.c: bytes of one token's cached row of one layer in the cache's format (a K or a V row of
 * this device's KV heads, or MLA's latent row), and the regions a layer's cache has (K and V: 2;
 * MLA's latent rows: 1). */
uint64_t ferry__kv_row_bytes(const struct ferry_engine *e);
int ferry__kv_regions(const struct ferry_engine *e);
/* swap preemption: copy slot s's blocks to host swap slots (1), or 0 when they are too few; and
 * back into fresh blocks for a readmitted request (FERRY_ERR_* on an executor error) */
int ferry__kv_pages_swap_out(struct ferry_engine *e, int32_t s, struct resume *r, ferry_status *st);
ferry_status ferry__kv_pages_swap_in(struct ferry_engine *e, int32_t s, struct resume *r);
/* Forget a swapped sequence's rows (the weights changed since): its slots freed, its record one
 * of recompute (decoding: from where it stood; in its first prefill: from the start). */
void ferry__kv_pages_swap_drop(struct ferry_engine *e, struct resume *r);

/* engine.c: planning and the buffers a re-plan replaces */
ferry_status ferry__engine_make_plan(struct ferry_engine *e, const struct ferry_plan_config *pc, struct ferry_plan *out,
                                     char *msg, size_t msg_len);
/* The plan configuration asked for (level 0), with the host tier at its low-water mark under
 * pressure control; budgets from the configuration. */
void ferry__engine_base_plan_config(const struct ferry_engine *e, struct ferry_plan_config *pc);
ferry_status ferry__engine_alloc_pinned(struct ferry_engine *e);
/* Block slots, expert cache, host-resident units, staging: buffers, slots, events, cache. */
ferry_status ferry__engine_alloc_streaming(struct ferry_engine *e);
void ferry__engine_free_streaming(struct ferry_engine *e, int with_pinned);
/* The experts the cache policy pins before serving, fetched (after a load or a re-plan). */
ferry_status ferry__engine_preload_experts(struct ferry_engine *e);

/* serve.c: close a run begun with ferry_engine_serve_begin() without serving the rest */
void ferry__engine_serve_abort(struct ferry_engine *e);
/* One step of the open run if one can run now (after sleeping to an arrival already added),
 * none when every request added is done; the run is closed on an error. */
ferry_status ferry__engine_serve_step(struct ferry_engine *e);
/* The replica of the k-th request in arrival order (ferry_replicas_serve*()): in turn, or the
 * least loaded by `loads` (ties: the lowest index). */
/* A request in serving order: its arrival as the engines will see it (scaled; 0 as fast as
 * possible), its id and its index in the caller's array. */
struct ferry__arrival {
  int64_t ns, id, index;
};
/* The requests in the engines' order of service (that of ferry_engine_run()); a scale past the
 * clock is left for the engine to report. NULL when out of memory; ferry_free() it. */
struct ferry__arrival *ferry__replicas_order(const struct ferry_engine_request *requests, int64_t n,
                                             const struct ferry_run_options *o);
/* A replica's failure, named (its message copied first: the last error is rewritten). */
ferry_status ferry__replica_failed(int32_t replica, ferry_status st);
int32_t ferry__router_pick(enum ferry_router router, const struct ferry_engine_load *loads, int32_t n, int64_t k);
/* adapt.c: budget schedule, memory pressure, weight reloads, events */
ferry_status ferry__engine_adapt_init(struct ferry_engine *e);
void ferry__engine_adapt_free(struct ferry_engine *e);
/* At a step boundary: apply due budget changes, the pressure decision, a staged reload whose
 * predecessor has no sequence left. now_ns: since the start of serving. */
ferry_status ferry__engine_adapt(struct ferry_engine *e, int64_t now_ns);
/* Whether admissions wait (a reload is staged and the current weights still run sequences). */
int ferry__engine_draining(struct ferry_engine *e);
void ferry__engine_event(struct ferry_engine *e, enum ferry_engine_event_kind kind, int32_t tier, double index,
                         const char *action, const char *fmt, ...) FERRY_PRINTF(6, 7);

/* forward.c */
ferry_status ferry__engine_step(struct ferry_engine *e);

/* memo.c. Either the graph of (kind, a, b) is launched (*replayed = 1: the caller issues
 * nothing), or the ops the caller issues next are recorded under it: the caller then passes
 * their status to ferry__memo_end(), which returns the status to go on with. The key must name
 * everything the ops depend on; params are the events that differ between uses (an expert
 * slot's), in a fixed order; context_tokens (>= 0) times the recorded attention kernels again
 * at each launch. The caller's own state changes (counters, slots) happen on both paths. */
ferry_status ferry__memo_init(struct ferry_engine *e); /* after the unit table */
ferry_status ferry__memo_begin(struct ferry_engine *e, struct memo_site *site, enum memo_kind kind, int64_t a,
                               int64_t b, ferry_event *const *params, int32_t n_params, int64_t context_tokens,
                               int *replayed);
ferry_status ferry__memo_end(struct ferry_engine *e, struct memo_site *site, ferry_status st);
void ferry__memo_step(struct ferry_engine *e); /* at each step: whether graphs are used (the sink may change) */
/* Start fetching where the graph of (kind, a, b) is kept (graph = 0), or the graph itself
 * (graph = 1, once that has arrived): the graphs of a layer's many experts are looked up one
 * after the other, and in a large step most are in no cache. */
void ferry__memo_prefetch(struct ferry_engine *e, enum memo_kind kind, int64_t a, int64_t b, int graph);
void ferry__memo_free(struct ferry_engine *e);

/* Layers whose routers each MoE layer applies ahead (gate lookahead), 0 when off. */
static inline int32_t ferry__lookahead_layers(const struct ferry_engine *e) {
  if (!e->cfg.router_lookahead || !e->mc->n_experts) return 0;
  return e->cfg.prefetch_depth > 0 ? e->cfg.prefetch_depth : 1;
}

/* The read-back buffer: the routing (weights, ids), the logits rows, the lookahead logits. */
static inline uint64_t ferry__readback_logits_offset(const struct ferry_engine *e) {
  return ((uint64_t)e->cfg.max_step_tokens * (uint64_t)e->mc->experts_per_token * 8 + 63) / 64 * 64;
}
static inline uint64_t ferry__readback_lookahead_offset(const struct ferry_engine *e) {
  return ferry__readback_logits_offset(e) + ((uint64_t)e->n_seqs * (uint64_t)e->mc->vocab * 4 + 63) / 64 * 64;
}

/* Issue the following ops for micro-batch m: its token arrays, counts and hidden state. */
static inline void ferry__mb_use(struct ferry_engine *e, int32_t m) {
  const struct microbatch *b = &e->mbs[m];
  if (m != e->cur_mb) e->ctx_valid = 0; /* another micro-batch's context */
  e->cur_mb = m;
  e->tok_ids = b->tok_ids;
  e->tok_pos = b->tok_pos;
  e->tok_slot = b->tok_slot;
  e->tok_seq = b->tok_seq;
  e->tok_index = b->tok_index;
  e->tok_seqlen = b->tok_seqlen;
  e->tok_req = b->tok_req;
  e->row_of_seq = b->row_of_seq;
  e->n_tok = b->n_tok;
  e->n_rows = b->n_rows;
  e->ws.x = b->x;
}
static inline uint64_t ferry__readback_features_offset(const struct ferry_engine *e) {
  const uint64_t look = (uint64_t)e->cfg.max_step_tokens * (uint64_t)e->mc->n_experts *
                        (uint64_t)ferry__lookahead_layers(e) * 4;
  return ferry__readback_lookahead_offset(e) + (look + 63) / 64 * 64;
}

/* hybrid.c: the second executor side (the host's CPU). Whether the run has one (inline: asked
 * for every expert the engine runs). */
static inline int ferry__hybrid_on(const struct ferry_engine *e) {
  return e->cfg.compute_experts != FERRY_COMPUTE_GPU || e->cfg.compute_layers != FERRY_COMPUTE_GPU ||
         e->cfg.kv_home_host || e->cfg.kv_home_layer;
}
ferry_status ferry__hybrid_queues(struct ferry_engine *e);
ferry_status ferry__hybrid_alloc(struct ferry_engine *e);
ferry_status ferry__hybrid_alloc_ws(struct ferry_engine *e);
ferry_status ferry__hybrid_load(struct ferry_engine *e);
void ferry__hybrid_free(struct ferry_engine *e);
/* Issue the following ops on the CPU (host workspace, host copies of streamed weights) or on
 * the device; nothing is moved. */
void ferry__side_cpu(struct ferry_engine *e);
void ferry__side_device(struct ferry_engine *e);
/* Move workspace regions (offsets, bytes) device -> host and make q_cpu wait for them, or
 * host -> device on q_up and make the compute queue wait. */
/* The element sizes the device workspace is charged at: the executor's, else (planning without
 * one) the configuration's plan_elem_bytes, else fp32. */
struct ferry_exec_elem_bytes ferry__engine_elem_bytes(const struct ferry_engine *e);
/* The device workspace on `device`: ws.total addressed, ws.charged charged. */
ferry_status ferry__engine_alloc_ws(struct ferry_engine *e, int32_t device, ferry_buf **out);
ferry_status ferry__cross_down(struct ferry_engine *e, const uint64_t *off, const uint64_t *bytes, int n);
ferry_status ferry__cross_up(struct ferry_engine *e, const uint64_t *off, const uint64_t *bytes, int n);
/* Whether no routed expert can ever run on the device under plan configuration pc: every one is
 * computed on the CPU (--offload-compute experts=cpu) and none is ever in device memory (not all
 * pinned, not moving with its layer's block, no predictor prefetching into the expert cache, no
 * policy preloading it). */
int ferry__experts_cpu_only(const struct ferry_engine *e, const struct ferry_plan_config *pc);
/* The same rule from a configuration alone, before an engine exists (the default budget's
 * note, budget.c): with every expert resident or no device budget, some run on the device. */
int ferry__experts_cpu_only_config(const struct ferry_engine_config *c, const struct ferry_model_config *mc,
                                   int resident_all, uint64_t device_budget_bytes);
/* Whether a routed expert that is not on the device runs on the CPU for n tokens. */
int ferry__expert_on_cpu(const struct ferry_engine *e, int32_t layer, int32_t expert, int32_t n_tokens);
/* Whether streamed (not pinned) layers run on the CPU this step of n_tokens (compute_layers; the
 * runtime's rows rule reads the micro-batches' token counts). */
int ferry__layers_on_cpu(const struct ferry_engine *e, int32_t n_tokens);

/* mgpu.c: multi-device runs (tensor and pipeline parallel) */
static inline int ferry__mgpu_on(const struct ferry_engine *e) { return e->n_dev > 1; }
/* What the configuration asks for is a run mgpu.c can do (FERRY_ERR_UNSUPPORTED with why). */
ferry_status ferry__mgpu_check(struct ferry_engine *e);
enum ferry__shard ferry__mgpu_shard(const struct ferry_engine *e, enum ferry_tensor_role role);
/* pipeline parallel: the device of layer l (-1: the embedding, L: the head) */
int32_t ferry__mgpu_layer_dev(const struct ferry_engine *e, int32_t l);
/* the devices a pinned unit lives on (a bit each) */
uint32_t ferry__mgpu_unit_devices(const struct ferry_engine *e, const struct unit *un);
ferry_status ferry__mgpu_alloc(struct ferry_engine *e);     /* queues, buffers, events per device */
ferry_status ferry__mgpu_load_shards(struct ferry_engine *e); /* tensor parallel slices */
void ferry__mgpu_free(struct ferry_engine *e);
/* Issue the following ops on device d: its compute queue, workspace, KV cache and weights. */
void ferry__dev_use(struct ferry_engine *e, int32_t d);
/* Sum the devices' n floats at workspace offset off into every device's (after the ops issued
 * so far on each; the ops issued after it on each wait for it). */
ferry_status ferry__mgpu_allreduce(struct ferry_engine *e, uint64_t off, int64_t n);
/* Pipeline: send the hidden state of micro-batch cur_mb from device `from` to device `to` after
 * the ops issued so far on `from`; receive: the ops issued next on the current device wait for
 * cur_mb's last send (so a stage starts on a micro-batch as soon as it has arrived). */
ferry_status ferry__mgpu_send(struct ferry_engine *e, int32_t from, int32_t to);
ferry_status ferry__mgpu_receive(struct ferry_engine *e);
/* Where a sharded tensor's slice sits in every device's shard buffer (grows shard_bytes). */
uint64_t ferry__mgpu_place_shard(struct ferry_engine *e, const struct ferry_tensor_desc *t, enum ferry_dtype dt);
/* Expert parallel: the device of routed expert x of layer l (the current device otherwise). */
static inline int32_t ferry__mgpu_expert_dev(const struct ferry_engine *e, int32_t l, int32_t x) {
  return e->ep ? e->ep_dev[(int64_t)l * e->mc->n_experts + x] : e->cur_dev;
}
/* Expert parallel: every device's experts' rows (after its zeroed x on all but the first)
 * combined into x, then the all-reduce. */
ferry_status ferry__mgpu_ep_combine(struct ferry_engine *e, int32_t l);
/* The plan's lines of a multi-device run: what each device holds (nothing for one device). */
void ferry__mgpu_print(const struct ferry_engine *e, FILE *f);
/* A sharded tensor's slice on the current device. */
struct ferry_ref ferry__mgpu_weight(const struct ferry_engine *e, const struct tensor_loc *loc);

/* helpers */
static inline struct ferry_ref ferry__ws(struct ferry_engine *e, uint64_t off) {
  struct ferry_ref r = {e->cws ? e->cws : e->ws_buf, off, FERRY_DTYPE_F32};
  return r;
}

#endif
