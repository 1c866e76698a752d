/**
 * @file hw.h
 * @brief Hardware profiles: the GPU, host↔GPU link, host memory and disk the simulator
 *        models, read from documented JSON files (the catalogue in `hw/`).
 *
 * A profile is data (SimGrid's platform file): it is joined with a model and a trace only when
 * a simulation runs. Rates use decimal units: `_gbps` is 10^9 **bytes** per second (GB/s, not
 * gigabits), `_tflops` is 10^12 operations per second, `_gflops` 10^9. A rate of 0 means "not
 * given"; ferry_hw_require() turns a missing rate that a run needs into a clear error.
 *
 * The file format and the source of every catalogue figure are described in `hw/README.md`
 * and `docs/hardware-profiles.md`.
 */
#ifndef FERRY_HW_H
#define FERRY_HW_H

#include "ferry/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What a profile file describes. */
enum ferry_hw_kind {
  FERRY_HW_KIND_GPU,  /**< "gpu": a machine with a GPU (gpu section required) */
  FERRY_HW_KIND_HOST, /**< "host": a machine without GPU, or a host-memory part (host section) */
  FERRY_HW_KIND_LINK, /**< "link": a host↔GPU link part (link section), for composition */
  FERRY_HW_KIND_DISK, /**< "disk": a disk part (disk section), for composition */
  FERRY_HW_KIND_RUNTIME /**< "runtime": a software stack's overheads (runtime section): a preset
                             that `ferry sim --runtime NAME` or ferry_hw_set_runtime() applies */
};

/** Kinds of GPU operation, each with its own efficiency in the roofline cost model. */
enum ferry_hw_op {
  FERRY_HW_OP_GEMM,        /**< matrix × matrix (prefill, batched decode) */
  FERRY_HW_OP_GEMV,        /**< matrix × vector (batch-1 decode) */
  FERRY_HW_OP_ATTENTION,   /**< attention over a KV cache */
  FERRY_HW_OP_ELEMENTWISE, /**< norms, activations, residual adds, router top-k */
  FERRY_HW_OP_DEQUANTIZE,  /**< unpacking quantized weights */
  FERRY_HW_OP_COUNT        /**< number of op kinds, not an op kind */
};

/** Peak dense (non-sparse) throughput per element type, in TFLOP/s (TOP/s for int8). */
struct ferry_hw_peak_tflops {
  double fp32; /**< FP32 (non-tensor) peak */
  double fp16; /**< FP16 tensor-core peak with FP32 accumulation; 0 if not given */
  double bf16; /**< BF16 tensor-core peak; 0 if unsupported (falls back to fp16, then fp32) */
  double int8; /**< INT8 tensor-core peak; 0 if not given (falls back to fp16, then fp32) */
  double fp8;  /**< FP8 tensor-core peak with FP32 accumulation; 0 if unsupported (FP8 weights are then converted and run at the fp16 peak) */
};

/** Fraction of peak (in (0, 1]) an op kind reaches; defaults apply when a profile omits them. */
struct ferry_hw_efficiency {
  double gemm;        /**< GEMM; default 0.7 */
  double gemv;        /**< GEMV (memory-bound); default 0.8 */
  double attention;   /**< attention; default 0.5 */
  double elementwise; /**< element-wise kernels (memory-bound); default 0.8 */
  double dequantize;  /**< dequantization kernels; default 0.6 */
};

/** Kernel kinds a profile may carry fitted costs for (the names of ferry_kernel_kind_name()). */
#define FERRY_HW_COST_KINDS 13

/** Arithmetic intensity (flops per byte) above which a matmul or expert op counts as a GEMM and
 *  uses the kind's "_gemm" fitted cost (matrix-vector products below it are memory-bound). */
#define FERRY_HW_GEMM_INTENSITY 8.0

/**
 * Fitted cost of one kernel kind (from `ferry calibrate`): duration = overhead_ns +
 * bytes * ns_per_byte + flops * ns_per_flop, or with roofline = 1, overhead_ns +
 * max(bytes * ns_per_byte, flops * ns_per_flop) (the calibration keeps whichever form fits the
 * measurements better: a CPU converting weights before a GEMM pays both terms, a GPU kernel
 * overlaps them). Where a profile has one, the simulator uses it instead of the datasheet
 * roofline for that kind.
 */
struct ferry_hw_cost {
  double overhead_ns; /**< fixed cost per op */
  double ns_per_byte; /**< cost per byte touched */
  double ns_per_flop; /**< cost per floating-point operation */
  int32_t roofline;   /**< 1: the larger of the two terms; 0: their sum */
  double r2;          /**< how well the fit explains the measured durations (coefficient of
                           determination of the log durations); 0 when not recorded. Below
                           FERRY_HW_FIT_R2_MIN the simulator warns that this kind's predictions
                           may be off */
};

/** The largest link.contention a calibration writes (a kernel at 5 % of its speed while a copy
 *  flows); the reader accepts up to, not including, 1. */
#define FERRY_HW_CONTENTION_MAX 0.95

/** Fits (`cost.KIND.r2`) below this explain too little of what was measured: `ferry calibrate`
 *  and `ferry sim` warn. */
#define FERRY_HW_FIT_R2_MIN 0.9

/** A GPU. */
struct ferry_hw_gpu {
  char name[64];                          /**< marketing name, e.g. "NVIDIA H100 PCIe" */
  uint64_t memory_bytes;                  /**< device memory (nominal GB read as GiB) */
  double mem_bw_gbps;                     /**< device memory bandwidth, GB/s */
  struct ferry_hw_peak_tflops peak_tflops; /**< peak throughput per dtype */
  int64_t launch_overhead_ns;             /**< fixed cost added to every kernel; default 5000 */
  struct ferry_hw_efficiency efficiency;  /**< fraction of peak per op kind */
  int32_t sm_count;                       /**< streaming multiprocessors; 0 = not given */
  double clock_mhz;                       /**< boost clock, MHz; 0 = not given */
  double compute_capability;              /**< CUDA compute capability (e.g. 8.6), which fixes the threads and
                                               blocks an SM holds at once; 0 = not given. With sm_count and
                                               clock_mhz it lets the cost model time the one-block-per-token
                                               element-wise kernels by their launch geometry
                                               (ferry_hw_gpu_residency()) */
};

/** Threads and thread blocks one SM of a GPU of CUDA compute capability @p compute_capability
 *  holds at once (maximum resident threads per SM: the CUDA C++ Programming Guide's "Technical
 *  Specifications per Compute Capability"; resident blocks: CUDA's cuda_occupancy.h).
 *  @return 0 and both figures when the capability is one the table knows (7.0 to 12.0), else -1
 *          (outputs untouched). */
FERRY_API int ferry_hw_gpu_residency(double compute_capability, int32_t *threads_per_sm, int32_t *blocks_per_sm);

/** A host↔GPU link (PCIe). Each direction is modelled as its own fluid-shared channel. */
struct ferry_hw_link {
  char name[64];            /**< e.g. "PCIe 4.0 x16" */
  double h2d_gbps;          /**< host→device bandwidth from pinned memory, GB/s */
  double d2h_gbps;          /**< device→host bandwidth to pinned memory, GB/s */
  double pageable_h2d_gbps; /**< host→device bandwidth from pageable memory, GB/s; a profile that
                                 does not give it gets FERRY_HW_PAGEABLE_H2D_SHARE of h2d_gbps
                                 (pageable_derived) */
  int64_t latency_ns;       /**< fixed cost of one transfer, paid before its bytes flow */
  int32_t copy_engines;     /**< concurrent transfers (DMA copy engines); 0 = unlimited */
  double contention;        /**< share of the device's throughput a transfer in flight on this link takes
                                 from the kernels running beside it, in [0, 1): while a copy's bytes flow,
                                 a kernel advances at (1 - contention) of its speed. 0 = none: a discrete
                                 GPU's PCIe copies touch its HBM at a few percent of its bandwidth. The host
                                 executor's "link" is memcpy through the same DRAM and cores its kernels use
                                 (fitted by `ferry calibrate --db`) */
  int32_t pageable_derived; /**< 1: pageable_h2d_gbps was not given but derived from h2d_gbps, and
                                 follows it when h2d_gbps is set through ferry_hw_link_set_h2d() or
                                 a composed name (`+link.h2d_gbps=20`); 0: given */
};

/** Peak throughput of one CPU core per element type, GFLOP/s (GOP/s for int8); 0 = not given
 *  (falls back to fp32). */
struct ferry_hw_core_gflops {
  double fp32; /**< FP32 SIMD FMA peak (e.g. AVX-512: 2 units x 16 lanes x 2 flops x GHz) */
  double fp16; /**< FP16 SIMD peak (AVX512-FP16), used for fp16 weights */
  double bf16; /**< BF16 dot-product peak (AVX512-BF16), used for bf16 weights */
  double int8; /**< INT8 dot-product peak (AVX-512 VNNI / AVX2 maddubs), used for low-bit weights,
                    which CPU kernels (llama.cpp, llamafile) multiply against int8 activations */
  double amx_bf16; /**< AMX tile peak for bf16 products (TDPBF16PS), GFLOP/s; used only by a runtime
                        with runtime.cpu_amx; 0 = the core has no AMX */
  double amx_int8; /**< AMX tile peak for int8 products (TDPBSSD), GOP/s; used only by a runtime
                        with runtime.cpu_amx; 0 = the core has no AMX */
};

/** Host memory and CPU. */
struct ferry_hw_host {
  char name[64];         /**< e.g. "DDR4-3200, 8 channels" */
  double dram_gbps;      /**< host memory bandwidth, GB/s */
  double cpu_gflops;     /**< CPU throughput for the host executor's math, GFLOP/s; the whole CPU's
                              fp32 peak for the simulator's CPU kernels when cores is not given */
  int32_t cores;         /**< CPU cores that run CPU kernels (hybrid strategies); 0 = not given */
  int32_t sockets;       /**< CPU sockets (NUMA nodes) the cores and dram_gbps are spread over, each
                              with its share of the memory channels; 0 = not given (one) */
  int32_t simd_bits;     /**< width of the vector units core_gflops counts, in bits (512: Sapphire
                              Rapids' two full-width AVX-512 ports; a core that splits 512-bit ops
                              into 256-bit halves, as Zen 4 does, is 256); 0 = not given */
  struct ferry_hw_core_gflops core_gflops; /**< peak per core per element type */
  int64_t cpu_op_ns;     /**< fixed cost of one CPU kernel (a thread pool's wake-up and barrier);
                              default 5000 */
  uint64_t memory_bytes; /**< host memory available for pinned weights */
  int64_t submit_ns;     /**< host time to issue one op (the engine's thread issues at a finite
                              rate); 0 = free */
  int64_t sync_ns;       /**< host wake-up latency after an event it waits for completes; 0 = none */
  int64_t queue_wake_ns; /**< latency for an idle queue to start an op submitted to it (the host
                              executor's worker threads sleep when idle); 0 = none */
  int64_t event_wake_ns; /**< latency from an event's completion to a queue that was blocked
                              waiting for it running its next op (the host executor's worker
                              thread sleeps in the wait and is woken by the thread that completed
                              the event); fitted by `ferry calibrate --db` from a host-executor
                              run's timeline; 0 = none */
  double staged_h2d_gbps; /**< rate at which the host's CPU copies pageable memory into the
                               driver's staging buffer when the driver cannot overlap that copy
                               with the DMA (CUDA under WSL2 stages every pageable copy
                               synchronously); given, a copy from pageable memory moves at
                               1 / (1 / link.h2d_gbps + 1 / staged_h2d_gbps) instead of
                               link.pageable_h2d_gbps; 0 = not given */
};

/**
 * The software that issues the work (the runtime section): its host-side costs, how its
 * kernels read quantized weights and how its CPU kernels (hybrid runs) run. The host thread is busy for these times; what it has already
 * queued runs on meanwhile, so a fast GPU waits for a slow host (a launch-bound run) and a slow
 * GPU hides the host. Presets in the catalogue: "eager" (a Python framework issuing each kernel:
 * Hugging Face transformers, Accelerate, DeepSpeed), "graph" (an engine replaying CUDA graphs:
 * vLLM, TensorRT-LLM), "graph-ray" ("graph" whose other GPUs are Ray workers, each step on several
 * GPUs paying the driver's calls to them: vLLM before 0.5.1, Sarathi-Serve), "native" (a C++ engine
 * issuing kernels one by one: llama.cpp, ferry's own
 * cuda executor), "ktransformers" (graphs on the GPU, routed experts on the CPU), "deepspeed-0.7"
 * (eager, with ZeRO-3's 2022 parameter path: a gather copy and a split copy per fetched
 * parameter, NVMe reads issued after the previous copy, copies that block the host).
 */
struct ferry_hw_runtime {
  char name[64];          /**< e.g. "PyTorch eager (Python issues every kernel)" */
  int64_t launch_ns;      /**< host time to issue one kernel */
  int64_t prefill_launch_ns; /**< host time to issue one kernel in a step that prefills (a prompt's
                               tokens, alone or beside decode tokens), where the runtime replays
                               CUDA graphs for decode-only steps and runs the others eagerly, one
                               PyTorch op at a time (vLLM before V1, ktransformers), and whose
                               model code then waits for each CPU op it calls (the simulated host
                               blocks until the op ends); 0: launch_ns in every step */
  int64_t copy_ns;        /**< host time to issue one copy or disk read */
  int64_t layer_ns;       /**< host time per transformer layer beyond its launches (module
                               dispatch, hooks, the small ops a framework adds) */
  int64_t prefill_layer_ns; /**< layer_ns in a step that prefills, for a runtime that runs such
                               steps eagerly, module by module, and replays CUDA graphs for
                               decode-only ones (ktransformers); 0: layer_ns in every step */
  int64_t step_ns;        /**< host time per engine step (scheduling, input preparation, sampling) */
  int64_t row_ns;         /**< host time per sampled row (sequence) of a step */
  int64_t worker_step_ns; /**< host time per engine step to drive its GPU workers when a run spans
                               several GPUs (`--gpus N`, N > 1), beyond step_ns: a Python engine
                               whose other GPUs are worker processes sends each step's inputs to
                               them and waits for their results (Ray actors in vLLM before 0.5.1,
                               Sarathi-Serve and Vidur's profiler); 0: one process drives every
                               GPU, or the workers cost the host nothing per step */
  int32_t fused_dequant;  /**< 1: quantized weights are read packed by fused dequantize-in-GEMM/GEMV
                               kernels; 0: a dequantize kernel expands them to fp16 first */
  int64_t fused_max_rows; /**< with fused_dequant: the most rows (tokens) a product reads packed
                               weights for; a product over more dequantizes to fp16 and runs an
                               fp16 GEMM (llama.cpp before June 2024 on tensor-core GPUs: 32,
                               MMQ_MAX_BATCH_SIZE, then cuBLAS); 0 = no limit */
  int32_t sync_fetch;     /**< 1: the host waits for a layer's (or expert's) weights to arrive before
                               issuing its compute, as eager frameworks do in pre-forward hooks
                               (DeepSpeed ZeRO-3, Accelerate); 0: the GPU waits, the host goes on */
  int32_t model_syncs;    /**< 1: the runtime runs the model's Hugging Face transformers code
                               (PyTorch eager: Accelerate, DeepSpeed), whose blocking copies of
                               CPU-made tensors make the host wait for the GPU where the engine
                               marks them (ferry_kernel.host_syncs: GPT-J's RoPE table and mask
                               value, GPT-NeoX's mask value); with such waits the layer's host time
                               (layer_ns) is spread over its kernels in proportion to their issue
                               time, as the framework spends it op by op, rather than paid at the
                               layer's start, and a kernel's copies come after its share, just
                               before its launch; 0: no such waits */
  int32_t numa_blind;     /**< 1: the runtime's CPU kernels ignore NUMA: the weights they read lie
                               in one socket's memory (where the loader first touched them), so
                               on a host of several sockets they stream at one socket's share of
                               host.dram_gbps (llama.cpp without --numa, PyTorch); 0: each
                               socket's threads read a copy or share in their own node's memory
                               (ktransformers' dual-socket build) */
  int32_t numa_first_threads; /**< with numa_blind 0 on a host of several sockets: the threads of
                               the process's first CPU job, when the runtime binds each of its
                               host.cores worker threads to a node on the first job that thread
                               runs, by thread id x nodes / that job's thread count: the first
                               job's threads spread evenly over the nodes, the rest (bound by a
                               later job of every thread) crowd the last ones (ktransformers
                               v0.2.0-v0.2.1, Backend::process_tasks before PR 685: its expert
                               warm-up at load runs moe_intermediate_size / 64 tasks first); a
                               node computes with at most its own cores; 0 = threads spread
                               evenly */
  double cpu_math_eff;    /**< fraction of the CPU's SIMD peak its CPU kernels' math reaches (the
                               products of experts or layers computed on the CPU, their unpacking
                               of low-bit weights, attention over a host KV cache); 0 = not given:
                               0.7, the GPU's GEMM default */
  int32_t cpu_quant_simd_bits; /**< widest vectors the runtime's CPU dot products of low-bit weights
                               use, in bits (256: llama.cpp's AVX2 k-quant vec_dot); on a host
                               whose host.simd_bits is wider, those products reach only this
                               fraction of its peak; 0 = not given: the host's full width */
  int32_t cpu_amx;        /**< 1: the runtime's CPU matrix products of bf16 or int8 weights can run on
                               AMX tiles (ktransformers v0.3 AMXInt8 / AMXBF16 experts), at
                               host.core_gflops.amx_bf16 / amx_int8 in whole 16-row tiles, or on
                               its AVX-512 kernel where that is faster (few rows); 0: AVX-512 only */
  int32_t cpu_amx_min_rows; /**< with cpu_amx: the fewest rows a product must have for the runtime to
                               pick its AMX kernel (ktransformers: more than 4 tokens per expert, 5);
                               fewer run on AVX-512 whatever the tiles would take; 0 = no such rule */
  double cpu_amx_eff_bf16; /**< with cpu_amx: fraction of the host's AMX bf16 peak
                               (host.core_gflops.amx_bf16 x host.cores) the runtime's tile kernel
                               reaches in its products (ktransformers v0.3: 21 TFLOP/s of a dual
                               Xeon Gold 6454S's 144.2, doc/en/AMX.md); 0 = not given:
                               cpu_math_eff */
  double cpu_amx_eff_int8; /**< the same for its int8 tile products (host.core_gflops.amx_int8;
                               ktransformers v0.3: 35 TOP/s of 288.4); 0 = not given: cpu_math_eff */
  int32_t attn_repeat_kv; /**< 1: a grouped-query attention first copies K and V repeated to every
                               query head of their group and multiplies that copy (HF transformers'
                               eager and SDPA paths, `repeat_kv`), so it writes and reads n_rep
                               times the cached bytes again; 0: kernels read the shared heads */
  int32_t attn_fa2_kvcache; /**< 1: the GPU attention is FlashAttention-2's flash_attn_with_kvcache
                               given the step's new K and V (Sarathi-Serve, Vidur's profiler: a
                               call per prefill chunk, one for the decode tokens). Its split-KV
                               kernel appends them itself: every tile of 64 queries of every query
                               head copies the new rows up to the last key tile its causal mask
                               reaches before it attends, which for a long prefill chunk is many
                               times the chunk's K and V (the copy phase keeps the append kernel's
                               fixed time, gpu.launch_overhead_ns). With gpu.sm_count and
                               gpu.compute_capability, a call's blocks run in waves of those the
                               SMs hold, stretching its math by ceil(waves) / waves; 0: a kernel
                               of its own appends them once, and the attention is the roofline's */
  int32_t gather_copy;    /**< 1: every copy to the device is followed, on the same stream and before
                               the next, by a copy of its bytes within device memory (DeepSpeed
                               ZeRO-3 before 0.9 gathers each fetched parameter into a fresh
                               buffer even on one GPU: a module's parameters are packed into one
                               flat buffer by torch.cat, a lone one is copied by NCCL's one-rank
                               all-gather), so the link's rate becomes
                               1 / (1 / link + 2 / gpu.mem_bw_gbps) */
  int32_t split_copy;     /**< 1: after that gather each parameter is copied once more within device
                               memory, on the same stream, out of the flat buffer into a tensor of
                               its own (ZeRO-3 before 0.9: AllGatherCoalescedHandle.wait() runs
                               torch.cat on the parameter's one partition); with gather_copy the
                               link's rate becomes 1 / (1 / link + 4 / gpu.mem_bw_gbps) */
  int32_t read_after_copy; /**< 1: the runtime issues a disk read only once the copies to the device
                                issued before it are done (ZeRO-3's NVMe read-ahead is issued after
                                the host waited for the current module's parameters): a read and
                                the previous unit's copy never overlap */
  int32_t blocking_copy;  /**< 1: the host waits for each copy to the device it issues, as for a copy
                               from pageable memory (ZeRO-3 before 0.9 copies a parameter to the
                               GPU with Tensor.to() without non_blocking): a prefetched copy does
                               not run under the host's issue of the current layer */
  int32_t moe_row_copy;   /**< 1: a routed expert's product over several tokens gathers each token's
                               row into a contiguous buffer and scatters each result row back with
                               one device-to-device copy per row and weight matrix, each issued by
                               the host (copy_ns): 6 copies per routed row of a gate/up/down expert
                               (llama.cpp's CUDA mul_mat_id from Mixtral support, December 2023,
                               until April 2024) */
  int32_t act_bytes;      /**< bytes per activation element its GPU kernels hold and move (hidden
                               states, q/k/v, FFN intermediates, expert inputs and outputs): 2 for
                               fp16/bf16 (PyTorch runtimes), 4 for fp32 (llama.cpp's ggml graphs,
                               ferry's own executors); 0 = not given: 2. The simulator charges the
                               device workspace and the activations crossing to the CPU at it
                               (ferry_hw_profile_elem_bytes()) */
  int32_t dequant_bytes;  /**< bytes per element of the copy a dequantize kernel expands a low-bit
                               weight into, where the runtime's products do not read it packed
                               (fused_dequant 0, or a product over more than fused_max_rows): 2 for
                               an fp16 copy, 4 for fp32 (ferry's own executors); 0 = not given: 2 */
  double dequant_pass_bytes; /**< bytes per weight element a dequantize that does not fuse moves
                               through device memory beyond reading the packed weight once: the
                               intermediate tensors of its separate ops and the copy it leaves
                               (FlexGen's TorchCompressedDevice.decompress: 12.5 for int4);
                               0 = not given: one kernel that writes the dequant_bytes copy */
  int32_t dequant_kernels; /**< kernels (framework ops) such a dequantize runs, each paying the GPU's
                               launch_overhead_ns and the host's launch_ns (FlexGen: 6); 0 = 1 */
  int32_t kv_expand;      /**< 1: before a decode step's attention the runtime expands its whole
                               quantized KV cache (K and V of every cached key) to fp16 with that
                               dequantize (dequant_pass_bytes, dequant_kernels each), and attention
                               reads the fp16 copy (FlexGen's mha_gen); 0: attention reads the
                               packed cache as a fused kernel would */
  int32_t kv_full_window; /**< 1: the runtime allocates each sequence's cache for its longest length
                               up front and a decode step's attention works over the whole of it,
                               not only the keys written so far: the simulator takes the
                               sequence's slot, kv_capacity (`--max-seq-tokens`). With kv_expand
                               only the expansion covers the slot and the products read the keys
                               written (FlexGen's mha_gen decompresses the whole cache, then
                               slices it to the context); otherwise the products, and the
                               cpu_kv_upcast and attn_repeat_kv copies they read, cover it (the
                               KV-offload fork of HF transformers attends over its whole
                               preallocated buffer, masked); 0: the keys written */
  double kv_quant_bytes;  /**< bytes per new K or V element the runtime's quantizer moves before the
                               engine's write into a quantized cache, every token, prefill and
                               decode (FlexGen's TorchCompressedDevice.compress: 25.5 for int4);
                               0 = not given: fused into the cache write */
  int32_t kv_quant_kernels; /**< kernels that quantizer runs for K and for V each (FlexGen: 12) */
  int32_t cpu_kv_upcast;  /**< 1: the runtime's attention on the CPU converts the cached K and V of
                               every key it reads to an fp32 copy first when the cache holds another
                               type (`.float()`), and its products read that copy: 4 bytes per
                               element written and 4 read beyond the cache's own read (the
                               KV-offload fork of HF transformers, tjruwase/transformers
                               kvcache-offload-cpu, BloomAttention.forward); 0: the products read
                               the cache in its own type */
  int32_t cpu_fresh_alloc; /**< 1: the framework allocates each CPU op's large outputs and
                               temporaries fresh from the OS (PyTorch: c10's alloc_cpu is
                               posix_memalign, no caching allocator on the CPU; glibc's malloc
                               mmaps any request of at least its mmap threshold, at most 32 MiB on
                               64-bit, and munmaps it when freed), so the Linux kernel zeroes each
                               of their pages on the first write (do_anonymous_page): the bytes of
                               every such temporary the runtime's CPU work already counts
                               (attn_repeat_kv's and cpu_kv_upcast's copies, each K or V tensor of
                               at least 32 MiB) are written once more; 0: reused memory */
  /* How the runtime reads weights from disk (its reader): each disk read is read by read_threads
   * sequential streams, each keeping read_depth requests of read_request_bytes in flight. With
   * Q = min(read_threads x read_depth, disk.queue_depth) requests of R bytes in flight, each taking
   * disk.latency_ns + R / disk.read_gbps, a read reaches at most Q R / (latency + R / rate) of the
   * disk (ferry_hw_disk_read_gbps()). read_depth 0 = the reader is not described: the disk's rate. */
  int32_t read_threads;   /**< threads reading one disk read at once, each a sequential stream of its
                               own (DeepSpeed's aio thread_count: 1; FlexGen's TorchDisk copy
                               threads: 4); 0 = one per host core (host.cores: PyTorch's intra-op
                               threads, which split a copy out of a memory-mapped file), and with
                               no host.cores the reader is not described */
  int32_t read_depth;     /**< requests each stream keeps in flight (DeepSpeed's aio queue_depth: 8;
                               a page-cache reader 2: the read-ahead window it waits on and the next,
                               which its arrival in the first started); 0 = not described */
  int64_t read_request_bytes; /**< bytes per request (DeepSpeed's aio block_size: 1 MiB); 0 = the
                               disk's read-ahead window (disk.read_ahead_bytes): reads through the
                               page cache, read() or faults on a memory map */
  int64_t offload_min_rows; /**< the runtime's own rule for work whose weights are in host memory
                               (`--offload-compute layers=auto`): a step whose largest micro-batch
                               has at least this many rows (tokens) computes the streamed layers on
                               the GPU with their weights copied up, a smaller one on the CPU
                               (llama.cpp's ggml_backend_cuda_offload_op, min_batch_size 32, since
                               PR 6083); 0 = not given: the engine compares the rates */
};

/** Linux's default read-ahead window (VM_READAHEAD_PAGES, 128 KiB): a disk's read_ahead_bytes when
 *  its profile does not give one. */
#define FERRY_HW_READ_AHEAD_BYTES 131072

/** link.pageable_h2d_gbps as a share of link.h2d_gbps when a profile does not give it: a copy
 *  from pageable memory is staged by the driver through a pinned buffer, one CPU copy per chunk
 *  before its DMA. Measured 12.36 of 23.62 GB/s (0.52) for a 256 MiB copy on an RTX 4090 over
 *  PCIe 4.0 x16 (NVlabs/cuda-oxide examples/pinned_overlap/README.md, 2026; hw/README.md). */
#define FERRY_HW_PAGEABLE_H2D_SHARE 0.5

/** host.cpu_op_ns when a profile does not give it: the order of an OpenMP / ggml thread pool's fork
 *  and barrier per op (hw/README.md, defaults). */
#define FERRY_HW_CPU_OP_NS 5000

/** A disk (the tier weights are streamed from, and a KV cache homed on disk is read from and
 *  written to). */
struct ferry_hw_disk {
  char name[64];       /**< e.g. "NVMe PCIe 4.0 x4" */
  double read_gbps;    /**< sequential read bandwidth, GB/s */
  int64_t latency_ns;  /**< fixed cost of one read (or write) request */
  int32_t queue_depth; /**< requests in flight at once; more wait in FIFO order */
  int64_t read_ahead_bytes; /**< the kernel's read-ahead window for buffered and memory-mapped reads
                               of the volume (Linux read_ahead_kb), the request size of a reader
                               through the page cache; 0 = not given: 128 KiB, Linux's default
                               (VM_READAHEAD_PAGES) */
  double write_gbps;   /**< sequential write bandwidth, GB/s (0: not given; writes to the disk tier,
                            ferry_exec_alloc() with FERRY_TIER_DISK, then cannot be simulated) */
};

/**
 * The GPUs of a multi-GPU machine and what joins them (NVLink through NVSwitch, PCIe
 * peer-to-peer). Absent from a single-GPU profile. In a profile with this section the gpu
 * section describes one of its GPUs, the link section each GPU's own link to the host, and
 * price_per_hour_usd the whole machine.
 */
struct ferry_hw_interconnect {
  char name[64];      /**< e.g. "NVLink 4 through NVSwitch (HGX H100 8-GPU)" */
  int32_t gpus;       /**< GPUs in the machine (at least 1) */
  double gpu_gbps;    /**< what one GPU sends to its peers, each direction, GB/s (NVLink 4 on
                           H100: 450 GB/s, the "900 GB/s" bidirectional figure halved) */
  int64_t latency_ns; /**< fixed cost of one GPU-to-GPU transfer (a collective is priced by
                           NCCL's own latency model instead, sim/interconnect.c) */
  int32_t switched;   /**< 1: a switch gives every GPU its gpu_gbps at once (NVSwitch, a PCIe
                           switch per pair); 0: the GPUs share the host's PCIe fabric, so
                           concurrent transfers split it */
  int32_t nvlink;     /**< 1: the GPUs talk over NVLink, 0: over PCIe; which of NCCL's latency
                           tables and protocols prices a collective (sim/interconnect.c) */
};

/** Where a figure of the profile comes from. */
struct ferry_hw_source {
  char figure[64];  /**< field path, e.g. "gpu.peak_tflops.fp16" */
  char value[64];   /**< the value as the source states it (text) */
  char source[256]; /**< document: vendor datasheet name, specification, paper, or "default" */
  char date[32];    /**< date or version of the source */
};

/** A hardware profile: sections are present according to `has_*`. */
struct ferry_hw_profile {
  char name[128];                 /**< catalogue name, e.g. "h100-pcie", or a composed one,
                                       "h100-pcie+host=xeon-6454s-2s" (ferry_hw_open()) */
  enum ferry_hw_kind kind;        /**< what the file describes */
  int has_gpu;                    /**< 1 if @ref gpu is set */
  int has_link;                   /**< 1 if @ref link is set */
  int has_host;                   /**< 1 if @ref host is set */
  int has_disk;                   /**< 1 if @ref disk is set */
  int has_runtime;                /**< 1 if @ref runtime is set */
  int has_interconnect;           /**< 1 if @ref interconnect is set (a multi-GPU machine) */
  struct ferry_hw_gpu gpu;        /**< the GPU */
  struct ferry_hw_link link;      /**< the host↔GPU link */
  struct ferry_hw_host host;      /**< host memory and CPU */
  struct ferry_hw_disk disk;      /**< the disk */
  struct ferry_hw_runtime runtime; /**< the software issuing the work (absent: no host costs, fused
                                        low-bit kernels) */
  struct ferry_hw_interconnect interconnect; /**< the machine's GPUs and what joins them (absent:
                                                  one GPU); see ferry_hw_gpu_count() */
  double price_per_hour_usd;      /**< on-demand rental price of the whole machine (all its
                                       GPUs), USD per hour; 0 if not given */
  int has_cost;                   /**< 1 if a "cost" section with fitted kernel costs is set */
  struct ferry_hw_cost cost[FERRY_HW_COST_KINDS]; /**< fitted costs, see ferry_hw_cost_of() */
  uint32_t cost_set;              /**< bit i: cost[i] was given */
  size_t n_sources;               /**< entries in @ref sources */
  const struct ferry_hw_source *sources; /**< figure sources, including those of composed parts */
  size_t n_fitted;                /**< entries in @ref fitted */
  const char *const *fitted;      /**< field paths whose values were fitted from measurements */
  const char *path;               /**< the file the profile was read from */
};

/** Opaque handle on a loaded profile. */
typedef struct ferry_hw ferry_hw;

/**
 * @brief Open a hardware profile by catalogue name or path.
 *
 * A name (letters, digits, '.', '_' and '-' only) is looked up as `NAME.json` in, in order:
 * each folder of the environment variable `FERRY_HW_PATH` (':'-separated), the source tree's
 * `hw/` folder, and the installed `share/ferry/hw`. Anything containing '/' or ending in
 * ".json" is read as a file path. Sections given as a string name a catalogue part (looked up
 * the same way, the referencing file's folder first); a section object may hold `"base": NAME`
 * to start from a part and override some of its fields.
 *
 * `BASE+SECTION=PART[+...]` (SECTION one of host, link, disk, runtime; BASE and each PART a
 * name or path as above) opens BASE with each named section, values and sources, replaced by
 * PART's: the same GPU with another CPU, PCIe link or disk. `BASE+FIELD=VALUE` sets one numeric
 * figure of a section the profile has (`host.memory_bytes=256GiB`: a *_bytes figure takes a
 * size, the others a number, checked as the reader checks it), its source the name; a derived
 * figure follows the one it is derived from (link.pageable_h2d_gbps, ferry_hw_link_set_h2d()).
 * Applied left to right; the profile is named by the whole text (at most 127 characters).
 * Figures fitted to measurements that a replacement touches lose their fitted mark.
 *
 * The reader is strict: an unknown field, a wrong type, a non-positive rate or a missing
 * required field is FERRY_ERR_FORMAT with a message naming the file and the field path, e.g.
 * "h100.json: gpu.peak_tflops.fp16 must be a number".
 * @param out receives the handle, owned by the caller (release with ferry_hw_close()).
 * @param name_or_path catalogue name, file path or composed name.
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND (unknown name: the message lists the folders
 *         searched); FERRY_ERR_FORMAT (also a composed figure the field refuses); FERRY_ERR_IO;
 *         FERRY_ERR_NOMEM; FERRY_ERR_INVALID (a composed name that is not BASE+SECTION=PART or
 *         BASE+FIELD=VALUE, a part without that section, a value that does not parse, too long).
 */
FERRY_API ferry_status ferry_hw_open(ferry_hw **out, const char *name_or_path);

/**
 * @brief Replace a profile's runtime section (and its sources) by a runtime preset's.
 * @param hw the profile.
 * @param name_or_path a catalogue name ("eager", "graph", "native") or a file of kind "runtime".
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND / FERRY_ERR_FORMAT / FERRY_ERR_IO as ferry_hw_open();
 *         FERRY_ERR_INVALID when the file is not of kind "runtime" (the message says what it is).
 */
FERRY_API ferry_status ferry_hw_set_runtime(ferry_hw *hw, const char *name_or_path);

/** @brief Release a profile. Accepts NULL. */
FERRY_API void ferry_hw_close(ferry_hw *hw);

/** @brief The profile's contents; borrowed, valid until ferry_hw_close(). */
FERRY_API const struct ferry_hw_profile *ferry_hw_get(const ferry_hw *hw);

/**
 * @brief Check that a profile gives every figure a run needs.
 * @param profile the profile.
 * @param what comma-separated field paths, e.g. "gpu.mem_bw_gbps,link.h2d_gbps,disk.read_gbps",
 *        or a section name ("gpu", "link", "host", "disk", "interconnect") meaning its rates
 *        (bandwidths and, for "gpu", memory size and the fp16 and fp32 peaks; for
 *        "interconnect", the GPU count and per-GPU bandwidth).
 * @return FERRY_OK; FERRY_ERR_NOT_FOUND naming the profile and the first missing figure;
 *         FERRY_ERR_INVALID for an unknown field path. Details in ferry_last_error().
 */
FERRY_API ferry_status ferry_hw_require(const struct ferry_hw_profile *profile, const char *what);

/**
 * @brief Name of fitted-cost kind i ("matmul", "attention", "expert", "norm", "rope",
 *        "activation", "router", "moe_combine", "gather_rows", "embed", "dequantize",
 *        "matmul_gemm", "expert_gemm": the last two are the matrix-matrix regime of their kind).
 * @return a static string, or NULL when i is out of range.
 */
FERRY_API const char *ferry_hw_cost_kind_name(int i);

/**
 * @brief The fitted cost of a kernel kind, or NULL when the profile has none for it.
 * @param profile the profile.
 * @param kind_name a kernel kind name (ferry_kernel_kind_name()).
 * @return borrowed from the profile.
 */
FERRY_API const struct ferry_hw_cost *ferry_hw_cost_of(const struct ferry_hw_profile *profile, const char *kind_name);

/**
 * @brief The fitted cost of one op: the kind's "_gemm" cost when the op's arithmetic intensity
 *        (flops / bytes) exceeds FERRY_HW_GEMM_INTENSITY and the profile has one, else the
 *        kind's own; NULL when neither is fitted.
 * @param profile the profile.
 * @param kind_name a kernel kind name.
 * @param gemm 1 for an op above the intensity threshold.
 * @return borrowed from the profile.
 */
FERRY_API const struct ferry_hw_cost *ferry_hw_cost_of_regime(const struct ferry_hw_profile *profile, const char *kind_name,
                                                    int gemm);


/**
 * @brief List the catalogue: the names of every `*.json` in the search folders (the first
 *        folder holding a name wins), sorted.
 * @param out_names receives an owned array of owned strings (free with ferry_hw_list_free()).
 * @param out_count receives the number of names.
 * @return FERRY_OK (an empty catalogue gives 0 names) or FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_hw_list(char ***out_names, size_t *out_count);

/** @brief Free a list returned by ferry_hw_list(). Accepts NULL. */
FERRY_API void ferry_hw_list_free(char **names, size_t count);

/** @brief GPUs in the machine a profile describes: interconnect.gpus, else 1 (0 for a profile
 *         without a gpu section). */
FERRY_API int32_t ferry_hw_gpu_count(const struct ferry_hw_profile *profile);

/**
 * @brief Set a link's rate from pinned memory, @p link->pageable_h2d_gbps following it where the
 *        profile derived that figure (pageable_derived: FERRY_HW_PAGEABLE_H2D_SHARE of the new
 *        rate) and staying where it was given.
 * @param link the link section to change (a profile's own; sources are the caller's to update).
 * @param h2d_gbps the new rate, GB/s (> 0; other values are ignored).
 */
FERRY_API void ferry_hw_link_set_h2d(struct ferry_hw_link *link, double h2d_gbps);

/**
 * @brief Bytes per element at which a GPU runtime described by @p profile holds the engine's
 *        device workspace: what the `sim` executor charges its device tier for it
 *        (ferry_exec_elem_bytes()) and what a tensor-parallel all-reduce moves per element.
 * @param profile the profile, its runtime section applied (ferry_hw_set_runtime()); without a
 *        runtime section: a GPU runtime with fused low-bit kernels, as the simulator assumes.
 * @param act_bytes receives the bytes of an activation element: runtime.act_bytes, 2 when not given
 *        (may be NULL).
 * @param dequant_bytes receives the bytes of an element of a dequantized weight copy: 0 when the
 *        runtime's kernels read every low-bit weight packed (runtime.fused_dequant 1 without a
 *        runtime.fused_max_rows limit), else runtime.dequant_bytes, 2 when not given (may be NULL).
 */
FERRY_API void ferry_hw_profile_elem_bytes(const struct ferry_hw_profile *profile, uint32_t *act_bytes,
                                           uint32_t *dequant_bytes);

/**
 * @brief The rate, GB/s, at which one disk read of the runtime's reader flows when it has the
 *        disk to itself: min(disk.read_gbps, Q R / (disk.latency_ns + R / disk.read_gbps)), with
 *        Q = min(runtime.read_threads x runtime.read_depth, disk.queue_depth) requests of R =
 *        runtime.read_request_bytes (or disk.read_ahead_bytes) in flight. Reads sharing the disk
 *        each flow at the smaller of this and an equal share of disk.read_gbps (the `sim` executor).
 * @param profile the profile, its runtime section applied (ferry_hw_set_runtime()).
 * @return disk.read_gbps when the runtime does not describe its reader (no runtime section,
 *         runtime.read_depth 0, or read_threads 0 on a host without cores); 0 without a disk.
 */
FERRY_API double ferry_hw_disk_read_gbps(const struct ferry_hw_profile *profile);

/** What a figure of a profile rests on (ferry_hw_figures()), from its source entry. */
enum ferry_hw_basis {
  FERRY_HW_BASIS_SOURCED,  /**< a source is given: a datasheet, specification, paper or measurement */
  FERRY_HW_BASIS_FITTED,   /**< fitted from measurements (`ferry calibrate`) */
  FERRY_HW_BASIS_DERIVED,  /**< not given: derived from another figure by a ferry rule
                                (link.pageable_h2d_gbps, FERRY_HW_PAGEABLE_H2D_SHARE) */
  FERRY_HW_BASIS_ESTIMATE, /**< its source calls it an estimate */
  FERRY_HW_BASIS_DEFAULT,  /**< a ferry default, not a measurement (hw/README.md) */
  FERRY_HW_BASIS_NONE      /**< no source given */
};

/** A figure of a profile a sensitivity study scales: a rate, a time or an efficiency. */
struct ferry_hw_figure {
  char path[64];             /**< field path, e.g. "link.h2d_gbps", as ferry_hw_set_figure() and a
                                  composed name (BASE+PATH=VALUE) take it */
  double value;              /**< its value in the profile, in the unit its path names */
  int integer;               /**< 1: an integer figure (nanoseconds): a scaled value is rounded */
  enum ferry_hw_basis basis; /**< what the value rests on */
  char source[256];          /**< its source's text, "" when none is given */
};

/**
 * @brief The figures of a profile that scale what a simulation costs: every rate, time and
 *        efficiency of the sections it has (GPU, link, host, disk, runtime, interconnect, fitted
 *        costs) that is not 0, with what each rests on. Capacities, counts, flags and element
 *        sizes are left out (they change what fits or what runs, not how fast).
 * @param profile the profile (its runtime applied, ferry_hw_set_runtime(), to list the runtime's).
 * @param out receives an array of *n figures in the field table's order, owned by the caller
 *        (ferry_hw_figures_free()); NULL when *n is 0.
 * @param n receives the count.
 * @return FERRY_OK; FERRY_ERR_INVALID on a NULL argument; FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_hw_figures(const struct ferry_hw_profile *profile, struct ferry_hw_figure **out,
                                        size_t *n);

/** @brief Release what ferry_hw_figures() returned. Accepts NULL. */
FERRY_API void ferry_hw_figures_free(struct ferry_hw_figure *figures);

/** @brief Name of a basis ("sourced", "fitted", "derived", "estimate", "default", "none"); "?" if unknown. */
FERRY_API const char *ferry_hw_basis_name(enum ferry_hw_basis basis);

/**
 * @brief Set one numeric figure of an open profile, as BASE+PATH=VALUE in a composed name does
 *        (ferry_hw_open()): the reader's checks apply, the figure's source becomes @p value_text,
 *        a fitted mark on it is dropped, and link.h2d_gbps carries a derived pageable rate along.
 * @param hw the profile.
 * @param path a numeric field's path ("gpu.mem_bw_gbps", "runtime.layer_ns", "host.memory_bytes").
 * @param value_text its value: a number, a size ("256GiB") for a *_bytes figure.
 * @return FERRY_OK; FERRY_ERR_INVALID (NULL argument, unknown or non-numeric path, a section
 *         the profile lacks, a value that does not parse); FERRY_ERR_FORMAT (a value the field
 *         refuses); FERRY_ERR_NOMEM.
 */
FERRY_API ferry_status ferry_hw_set_figure(ferry_hw *hw, const char *path, const char *value_text);

/** @brief Name of a kind as written in files ("gpu", "host", "link", "disk"); "?" if unknown. */
FERRY_API const char *ferry_hw_kind_name(enum ferry_hw_kind kind);

/** @brief Name of an op kind as in the efficiency table ("gemm", ...); "?" if unknown. */
FERRY_API const char *ferry_hw_op_name(enum ferry_hw_op op);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_HW_H */
