/* The GPU cost model: what a GPU inference runtime executes for one of the engine's kernels
 * (tensor-core math in the weights' precision, low-bit weights read packed by fused kernels or
 * expanded by a dequantize kernel first, flash-style attention, element-wise ops by their
 * bytes) and how long that takes on a hardware profile's GPU. Internal to ferry (sim/). */
#ifndef FERRY_SIM_GPU_COST_H
#define FERRY_SIM_GPU_COST_H

#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/exec.h"
#include "ferry/hw.h"

/* A packed weight a DEQUANTIZE op expanded, remembered for the matrix product that reads it. */
struct ferry__packed {
  uint64_t bytes;  /* bytes of the stored weight, every part (values, scales, zeros) */
  double elems;    /* weight elements */
  int32_t qformat; /* enum ferry_qformat it is stored in */
};

/* The work a GPU runtime does for one kernel. */
struct ferry__gpu_work {
  enum ferry_hw_op op;   /* efficiency class */
  enum ferry_dtype math; /* the element type whose peak the flops run at */
  double flops;          /* math at that peak */
  double bytes;          /* device-memory traffic */
  double alu_ops;        /* CUDA-core instructions beside the math (unpacking low-bit weights) */
  int64_t rows;          /* activation rows a matrix product multiplies by each weight (the kernel's m:
                            tokens, or an expert's routed rows); 0 for other work */
  int32_t qformat;       /* enum ferry_qformat the product's packed weights are stored in (the last
                            packed one read); 0 (fp32) for plain weights and other work */
  int folded;            /* no kernel of its own: its work is charged to the op that reads its output */
  int launches;          /* GPU kernels the runtime runs for it, each paying the GPU's fixed time (0 = 1) */
  int ops;               /* framework ops the runtime issues for it beyond the first, each paying the
                            host's runtime.launch_ns (ferry__runtime_work()) */
  /* Launch geometry of an element-wise kernel (norm, RoPE, activation), which times it where the
   * profile gives its GPU's SMs, clock and compute capability (else bytes and flops above do): */
  int geometry;          /* enum ferry__geometry */
  int64_t blocks;        /* FERRY_GEOM_ROW_BLOCKS: thread blocks, one per token */
  int32_t block_threads; /* threads per block */
  double block_steps;    /* dependent round trips to device memory each block makes */
  double act_elems;      /* activation elements read and written, at the runtime's activation size */
  double fixed_bytes;    /* bytes beside them (a norm's weight vector) */
};

/* How an element-wise kernel spreads over the GPU. */
enum ferry__geometry {
  FERRY_GEOM_NONE = 0,   /* priced by bytes and flops alone */
  FERRY_GEOM_ROW_BLOCKS, /* one thread block per token, each thread striding its row (vLLM's
                            rms_norm_kernel, rotary_embedding_kernel, act_and_mul_kernel) */
  FERRY_GEOM_GRID,       /* a grid over every element (PyTorch's vectorized element-wise kernels) */
};

/* The GPU work of kernel k. packed[i] is the packed weight behind the kernel's i-th weight
 * reference (w, aux[0], aux[1] of an expert; w of a matmul, of an MLA attention (its kv_b_proj)
 * and of an embedding) when a DEQUANTIZE op expanded it
 * for this op, else NULL. fused = 1: the runtime reads low-bit weights with fused
 * dequantize-in-GEMM/GEMV kernels (the DEQUANTIZE op is folded into its consumer, which reads
 * the packed bytes and pays the unpacking on the CUDA cores); 0: a dequantize kernel writes
 * fp16 weights that a tensor-core GEMM then reads. */
void ferry__gpu_work_of(const struct ferry_kernel *k, const struct ferry__packed *const packed[3], int fused,
                        struct ferry__gpu_work *out);

/* What the profile's runtime adds to kernel k's work beyond the kernel itself; cpu = 1 for a
 * kernel on a CPU queue. With runtime.attn_repeat_kv (CPU or GPU), a grouped-query attention
 * writes K and V repeated to every query head and its products read that copy (HF transformers'
 * repeat_kv), so its bytes grow by 2 x n_rep x the keys each sequence sees x kv_heads x 2 rows of
 * head_dim. On the GPU, for frameworks that do not fuse (FlexGen): a dequantize moves
 * runtime.dequant_pass_bytes per weight element instead of its fp16 write and runs
 * runtime.dequant_kernels kernels; with runtime.kv_expand a decode step's attention over a
 * quantized cache first expands it (each sequence's keys x kv_heads x (K, V) rows: the packed row
 * read plus head_dim x dequant_pass_bytes, 2 x dequant_kernels kernels) and reads fp16 rows
 * instead of packed ones; runtime.kv_quant_bytes per new K and V element (m x kv_heads x 2 x
 * head_dim) quantizes the step's rows (2 x kv_quant_kernels kernels). On the CPU, with
 * runtime.cpu_kv_upcast an attention over a cache of fp16 or bf16 first writes an fp32 copy of
 * the K and V of the keys each sequence sees and its products read it (8 bytes per element more;
 * a repeat_kv copy is then of fp32 elements). Every kernel added counts in launches and ops. */
void ferry__runtime_work(const struct ferry_hw_profile *profile, const struct ferry_kernel *k, int cpu,
                         struct ferry__gpu_work *work);

/* Duration of the work on the profile's GPU, rounded up to a whole ns:
 *   launches x launch + sqrt((t_math + t_alu)^2 + t_mem^2), 0 for folded work,
 * (an element-wise kernel with a launch geometry on a GPU whose SMs, clock and compute capability
 * the profile gives: floor + sqrt(t_chain^2 + t_mem^2) instead, see gpu_cost.c),
 * with t_math = flops / (peak[math] * eff_compute), t_alu = alu_ops / (fp32 peak / 2 * eff.dequantize)
 * (one instruction per lane per clock, an FMA counting two flops), t_mem = bytes / (mem_bw *
 * eff_memory). The quadrature sum is a roofline whose corner is rounded: far from the ridge the
 * larger term rules, at the ridge neither overlaps the other perfectly. Efficiencies per class:
 * GEMM and GEMV math at eff.gemm and eff.gemv of the peak, both streaming at eff.gemv of the
 * bandwidth; attention math at eff.attention, its K/V stream at eff.gemv; element-wise and
 * dequantize kernels at their own efficiency for both. The peak for math: F32 fp32; F16 fp16;
 * BF16 bf16 (else fp16); I8/U8 int8 (else fp16); F8 fp8 (else fp16); a missing fp16 falls back
 * to fp32. Returns -1 if the profile lacks a figure the work needs (no gpu section, mem_bw 0
 * with bytes, no usable peak with flops). */
int64_t ferry__gpu_work_ns(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w);

/* ferry__gpu_work_ns() of plain work: flops at dtype's peak and bytes, efficiency class op. */
int64_t ferry__hw_compute_ns(const struct ferry_hw_profile *profile, enum ferry_hw_op op, double flops,
                             double bytes, enum ferry_dtype dtype);

#endif /* FERRY_SIM_GPU_COST_H */
