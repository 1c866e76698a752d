/* The CPU cost model (sim/cpu_cost.h): a kernel on a CPU queue priced from the profile's cores,
 * per-core peaks per element type and DDR bandwidth. */
#include <math.h>

#include "ferry/quant.h"
#include "sim/cpu_cost.h"
#include "sim/resource.h"

double ferry__cpu_peak_gflops(const struct ferry_hw_host *h, enum ferry_dtype dtype) {
  if (h->cores <= 0) return h->cpu_gflops > 0 ? h->cpu_gflops : 0;
  const struct ferry_hw_core_gflops *c = &h->core_gflops;
  double per = c->fp32;
  switch (dtype) {
    case FERRY_DTYPE_F16: per = c->fp16 > 0 ? c->fp16 : c->fp32; break;
    case FERRY_DTYPE_BF16: per = c->bf16 > 0 ? c->bf16 : c->fp32; break;
    case FERRY_DTYPE_I8:
    case FERRY_DTYPE_U8: per = c->int8 > 0 ? c->int8 : c->fp32; break;
    default: break;
  }
  if (!(per > 0)) return h->cpu_gflops > 0 ? h->cpu_gflops : 0;
  return per * (double)h->cores;
}

double ferry__cpu_math_eff(const struct ferry_hw_profile *profile) {
  const double e = profile->has_runtime ? profile->runtime.cpu_math_eff : 0;
  return e > 0 && e <= 1 ? e : FERRY_CPU_EFF_MATH;
}

double ferry__cpu_quant_width(const struct ferry_hw_profile *profile) {
  const int rb = profile->has_runtime ? profile->runtime.cpu_quant_simd_bits : 0;
  const int hb = profile->host.simd_bits;
  return rb > 0 && hb > rb ? (double)rb / hb : 1.0;
}

double ferry__cpu_stream_gbps(const struct ferry_hw_profile *profile) {
  const struct ferry_hw_host *h = &profile->host;
  const int blind = profile->has_runtime && profile->runtime.numa_blind;
  return blind && h->sockets > 1 ? h->dram_gbps / h->sockets : h->dram_gbps;
}

double ferry__cpu_amx_gflops(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w) {
  const struct ferry_hw_host *h = &profile->host;
  if (!profile->has_runtime || !profile->runtime.cpu_amx || w->op != FERRY_HW_OP_GEMM || w->rows <= 0) return 0;
  double per = 0;
  if (w->math == FERRY_DTYPE_BF16) per = h->core_gflops.amx_bf16;
  const int int8 = w->math == FERRY_DTYPE_I8 || w->math == FERRY_DTYPE_U8;
  if (int8 && w->qformat == FERRY_QFORMAT_INT8) per = h->core_gflops.amx_int8;
  if (!(per > 0) || h->cores <= 0) return 0;
  /* the TMUL multiplies whole tiles: the last one's rows beyond m are computed and thrown away */
  const double slots = FERRY_AMX_TILE_ROWS * ceil((double)w->rows / FERRY_AMX_TILE_ROWS);
  return per * (double)h->cores * (double)w->rows / slots;
}

double ferry__cpu_amx_eff(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w) {
  const struct ferry_hw_runtime *r = &profile->runtime;
  const double e = !profile->has_runtime ? 0 : w->math == FERRY_DTYPE_BF16 ? r->cpu_amx_eff_bf16 : r->cpu_amx_eff_int8;
  return e > 0 && e <= 1 ? e : ferry__cpu_math_eff(profile);
}

int ferry__cpu_node_threads(const struct ferry_hw_profile *profile, int32_t *threads, int max_nodes) {
  const struct ferry_hw_host *h = &profile->host;
  const struct ferry_hw_runtime *r = &profile->runtime;
  if (!profile->has_runtime || r->numa_blind || r->numa_first_threads <= 0) return 0;
  const int nodes = h->sockets, all = h->cores;
  if (nodes < 2 || nodes > max_nodes || all < nodes) return 0;
  const int first = r->numa_first_threads < all ? r->numa_first_threads : all;
  for (int n = 0; n < nodes; n++) threads[n] = 0;
  /* each thread binds on the first job it runs: the first job's threads by its count, the rest
   * by a later job of every thread (ktransformers' Backend::process_tasks before PR 685) */
  for (int tid = 0; tid < all; tid++) threads[(int64_t)tid * nodes / (tid < first ? first : all)]++;
  return nodes;
}

/* The time of work that takes t_sm (math) and t_mem (bytes) on the whole host, when its threads
 * lie unevenly on its nodes: node n computes with min(threads[n], cores / nodes) cores and streams
 * from its own memory (1 / nodes of host.dram_gbps); the runtime's threads take tasks from each
 * other (work stealing), so the nodes finish together and their rates add. */
static double node_split_ns(const struct ferry_hw_host *h, const int32_t *threads, int nodes, double t_sm,
                            double t_mem) {
  const int per_node = h->cores / nodes;
  double rate = 0;
  for (int n = 0; n < nodes; n++) {
    const int cores = threads[n] < per_node ? threads[n] : per_node;
    if (cores <= 0) continue;
    const double sm = t_sm * h->cores / cores, mem = t_mem * nodes;
    const double t = sqrt(sm * sm + mem * mem);
    if (t > 0) rate += 1 / t;
  }
  return rate > 0 ? 1 / rate : 0;
}

/* The time of work taking t_sm (math) and t_mem (bytes) on the whole host: the rounded roofline,
 * split over the nodes when the runtime's threads lie unevenly on them (nodes > 0). */
static double host_ns(const struct ferry_hw_host *h, const int32_t *threads, int nodes, double t_sm, double t_mem) {
  return nodes ? node_split_ns(h, threads, nodes, t_sm, t_mem) : sqrt(t_sm * t_sm + t_mem * t_mem);
}

void ferry__cpu_work_of(const struct ferry_kernel *k, const struct ferry__packed *const packed[3],
                        struct ferry__gpu_work *out) {
  ferry__gpu_work_of(k, packed, 1, out);
  if (out->alu_ops > 0 && out->math != FERRY_DTYPE_BF16) out->math = FERRY_DTYPE_I8; /* low-bit x int8 dots */
  if (out->op == FERRY_HW_OP_ATTENTION) out->math = FERRY_DTYPE_F32;           /* rows converted to fp32 */
  if (out->math == FERRY_DTYPE_F8_E4M3 || out->math == FERRY_DTYPE_F8_E5M2) out->math = FERRY_DTYPE_F32;
}

int64_t ferry__cpu_work_ns(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w) {
  if (!profile || !profile->has_host || !(w->flops >= 0) || !(w->bytes >= 0) || !(w->alu_ops >= 0)) return -1;
  if (w->folded) return 0;
  const struct ferry_hw_host *h = &profile->host;
  double t_math = 0, t_alu = 0, t_mem = 0;
  const double eff = ferry__cpu_math_eff(profile);
  /* low-bit dot products (int8 math over unpacked weights) run at the runtime's vector width */
  const int low_bit = w->math == FERRY_DTYPE_I8 || w->math == FERRY_DTYPE_U8;
  const double width = ferry__cpu_quant_width(profile);
  if (w->flops > 0) {
    const double peak = ferry__cpu_peak_gflops(h, w->math); /* GFLOP/s = flop/ns */
    if (!(peak > 0)) return -1;
    t_math = w->flops / (peak * eff * (low_bit ? width : 1.0));
  }
  if (w->alu_ops > 0) {
    const double peak = ferry__cpu_peak_gflops(h, FERRY_DTYPE_F32);
    if (!(peak > 0)) return -1;
    t_alu = w->alu_ops / (peak / 2 * eff * (low_bit ? width : 1.0));
  }
  if (w->bytes > 0) {
    if (!(h->dram_gbps > 0)) return -1;
    t_mem = w->bytes / (ferry__cpu_stream_gbps(profile) * FERRY_CPU_EFF_MEMORY);
  }
  int32_t threads[FERRY_CPU_MAX_NODES];
  const int nodes = ferry__cpu_node_threads(profile, threads, FERRY_CPU_MAX_NODES);
  double t = host_ns(h, threads, nodes, t_math + t_alu, t_mem);
  /* AMX tiles where the runtime has them, picks them for this many rows, and they are faster: no
   * unpacking (the tiles take int8 and bf16 weights as stored), the same bytes */
  const double amx = w->flops > 0 ? ferry__cpu_amx_gflops(profile, w) : 0;
  if (amx > 0 && w->rows >= profile->runtime.cpu_amx_min_rows) {
    const double t_amx = host_ns(h, threads, nodes, w->flops / (amx * ferry__cpu_amx_eff(profile, w)), t_mem);
    if (t_amx < t) t = t_amx;
  }
  return (h->cpu_op_ns > 0 ? h->cpu_op_ns : 0) + ferry__ceil_ns(t);
}
