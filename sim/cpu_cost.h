/* The CPU cost model: how long one of the engine's kernels takes on the host's CPU (a kernel on a
 * CPU queue: experts, layers or attention computed where their weights or KV cache live). The
 * work is what a CPU runtime does (llama.cpp, llamafile, ktransformers: low-bit weights read
 * packed and multiplied against int8 activations, 16-bit weights by SIMD dot products), priced
 * by the profile's cores, per-core peaks and DDR bandwidth. Internal to ferry (sim/). */
#ifndef FERRY_SIM_CPU_COST_H
#define FERRY_SIM_CPU_COST_H

#include <stdint.h>

#include "ferry/exec.h"
#include "ferry/hw.h"
#include "sim/gpu_cost.h"

/* Fraction of the SIMD peak a CPU GEMM reaches, and of the DDR bandwidth a CPU kernel streams
 * at: the GPU defaults for GEMM math and GEMV streaming (hw/README.md), not fitted to anything. */
#define FERRY_CPU_EFF_MATH 0.7
#define FERRY_CPU_EFF_MEMORY 0.8

/* The CPU's peak for math in dtype, GFLOP/s (cores x core_gflops, missing types at the fp32
 * peak; without cores, host.cpu_gflops as the whole CPU's fp32 peak); 0 when the profile gives
 * neither. */
double ferry__cpu_peak_gflops(const struct ferry_hw_host *host, enum ferry_dtype dtype);

/* Fraction of the CPU's SIMD peak the runtime's CPU kernels reach: runtime.cpu_math_eff where the
 * runtime gives it, else FERRY_CPU_EFF_MATH. */
double ferry__cpu_math_eff(const struct ferry_hw_profile *profile);

/* The fraction of the host's SIMD peak the runtime's low-bit dot products can use:
 * runtime.cpu_quant_simd_bits / host.simd_bits where the host's vectors are wider (llama.cpp's
 * 256-bit AVX2 k-quant kernels on a core with two 512-bit ports), else 1. */
double ferry__cpu_quant_width(const struct ferry_hw_profile *profile);

/* The DDR bandwidth the CPU kernels stream their bytes from, GB/s: host.dram_gbps, or one
 * socket's share of it when the runtime is NUMA-blind (runtime.numa_blind) on a host of several
 * sockets: the weights then lie in one node's memory, and every core reads them there. */
double ferry__cpu_stream_gbps(const struct ferry_hw_profile *profile);

/* Rows of an AMX tile: a tile register holds 16 rows of 64 bytes (Intel SDM, AMX palette 1), so a
 * product of m activation rows occupies ceil(m / 16) x 16 row slots of the TMUL. */
#define FERRY_AMX_TILE_ROWS 16

/* The whole host's AMX rate for work w, GFLOP/s (GOP/s for int8): cores x
 * host.core_gflops.amx_bf16 (bf16 math) or amx_int8 (int8 math over weights stored as int8, which
 * the tiles take as they are) x rows / (16 x ceil(rows / 16)), the unused rows of the last tile
 * wasted; 0 when AMX does not apply: the runtime lacks runtime.cpu_amx, the host the figure, or w
 * is not a matrix product (GEMM class with rows) of those types (low-bit weights need unpacking
 * to int8, which the AMX kernels modelled do not do). */
double ferry__cpu_amx_gflops(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w);

/* The fraction of that AMX rate the runtime's tile kernel reaches for w: runtime.cpu_amx_eff_bf16
 * (bf16 math) or cpu_amx_eff_int8 where given, else ferry__cpu_math_eff(). */
double ferry__cpu_amx_eff(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w);

/* Most NUMA nodes ferry__cpu_node_threads() counts threads on. */
#define FERRY_CPU_MAX_NODES 64

/* The runtime's CPU threads on each NUMA node when they lie unevenly (runtime.numa_first_threads
 * on a host of several sockets, the runtime not NUMA-blind): one thread per core (host.cores), each
 * bound on the first job it runs to node tid x nodes / that job's threads, the first job running
 * numa_first_threads of them and later ones all; fills threads[0..nodes) and returns host.sockets,
 * or 0 when the threads spread evenly (or the host has more than max_nodes sockets). */
int ferry__cpu_node_threads(const struct ferry_hw_profile *profile, int32_t *threads, int max_nodes);

/* The CPU work of kernel k (ferry__gpu_work_of() with fused low-bit kernels: CPU runtimes read
 * packed weights in their dot products); the math of low-bit weights runs at the int8 peak and
 * attention over a converted KV cache at the fp32 peak. */
void ferry__cpu_work_of(const struct ferry_kernel *k, const struct ferry__packed *const packed[3],
                        struct ferry__gpu_work *out);

/* Duration on the profile's CPU, rounded up to a whole ns: host.cpu_op_ns + sqrt((t_math +
 * t_alu)^2 + t_mem^2), the GPU model's roofline with a rounded corner (ferry__gpu_work_ns(): the
 * same cores issue the loads and the dot products, so near the ridge neither hides the other
 * fully), t_math = flops / (peak[math] x ferry__cpu_math_eff()), t_alu = alu_ops / (fp32 peak / 2 x
 * ferry__cpu_math_eff()) (one SIMD lane-op per unpacked element step), both for low-bit work (int8 math)
 * scaled by ferry__cpu_quant_width(), t_mem = bytes /
 * (ferry__cpu_stream_gbps() x FERRY_CPU_EFF_MEMORY). With threads unevenly on the nodes
 * (ferry__cpu_node_threads()), each node takes that time at its share of the cores it has threads
 * on (at most its own) and of the bandwidth, and the nodes' rates add (the runtime's threads steal
 * each other's tasks): 1 / sum over nodes of 1 / sqrt(t_sm_n^2 + t_mem_n^2); 0 for folded work; -1 when the profile lacks the host figures the work
 * needs (no host section, no CPU peak, no DDR bandwidth). Where ferry__cpu_amx_gflops() applies, the
 * runtime runs the product on whichever kernel is faster: the above (AVX-512) or the AMX one,
 * t_math = flops / (AMX rate x ferry__cpu_amx_eff()) with no unpacking, the same bytes
 * (ktransformers v0.3 picks AMX or AVX-512 per product by its arithmetic intensity). */
int64_t ferry__cpu_work_ns(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w);

#endif /* FERRY_SIM_CPU_COST_H */
