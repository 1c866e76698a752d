/* The CPU cost model (sim/cpu_cost.h) against a roofline worked out by hand: a product on a CPU
 * of round figures (2 cores of 10 GFLOP/s fp32 and 40 GOP/s int8 each, 10 GB/s of DDR, 1 us per
 * op), its math at 0.7 of the peak and its bytes at 0.8 of the bandwidth, the two summed in
 * quadrature as on the GPU. */
#include <math.h>
#include <string.h>

#include "ferry/exec.h"
#include "ferry/quant.h"
#include "sim/cpu_cost.h"
#include "testutil.h"

static struct ferry_hw_profile cpu(void) {
  struct ferry_hw_profile p;
  memset(&p, 0, sizeof p);
  p.has_host = 1;
  p.host.dram_gbps = 10.0;
  p.host.cores = 2;
  p.host.core_gflops.fp32 = 10;
  p.host.core_gflops.int8 = 40;
  p.host.cpu_op_ns = 1000;
  return p;
}

/* Neither term rules: the corner of the roofline is rounded. */
static void test_cpu_product_soft_roofline(void **state) {
  (void)state;
  struct ferry_hw_profile p = cpu();
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_MATMUL;
  k.m = 4, k.n = 1024, k.k = 1024;
  k.w.dtype = FERRY_DTYPE_F32;
  struct ferry__gpu_work w;
  ferry__cpu_work_of(&k, NULL, &w);
  /* flops 2 x 4 x 1024 x 1024 = 8388608 at 2 x 10 x 0.7 = 14 flop/ns: 599186.3 ns; bytes
   * 1024 x 1024 x 4 + 2 x 4 x 1024 x 4 = 4227072 at 10 x 0.8 = 8 B/ns: 528384 ns;
   * sqrt(599186.3^2 + 528384^2) = 798882.9 -> 798883, + 1000 per op = 799883 (the larger term
   * alone would say 600187) */
  assert_true(w.flops == 8388608.0 && w.bytes == 4227072.0);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 799883);
  /* far from the ridge the larger term rules: 64x the rows, the math 64x (38347922.3 ns), the
   * bytes 4194304 + 2 x 256 x 1024 x 4 = 6291456 (786432 ns): 38355986 + 1000 */
  k.m = 256;
  ferry__cpu_work_of(&k, NULL, &w);
  const double tm = 2.0 * 256 * 1024 * 1024 / 14.0, tb = 6291456.0 / 8.0;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), (int64_t)ceil(sqrt(tm * tm + tb * tb)) + 1000);
  assert_true(fabs((double)ferry__cpu_work_ns(&p, &w) - tm) < 0.001 * tm);
}

/* A NUMA-blind runtime on two sockets streams from one socket's memory: half the bandwidth. */
static void test_cpu_numa_blind(void **state) {
  (void)state;
  struct ferry_hw_profile p = cpu();
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_MATMUL;
  k.m = 1, k.n = 1024, k.k = 1024;
  k.w.dtype = FERRY_DTYPE_F32;
  struct ferry__gpu_work w;
  ferry__cpu_work_of(&k, NULL, &w);
  /* bytes 4194304 + 2 x 4096 = 4202496 at 8 B/ns: 525312 ns; flops 2097152 at 14: 149796.6 ns;
   * sqrt -> 546252.4 -> 546253, + 1000 */
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 547253);
  p.host.sockets = 2; /* two sockets: the same when every socket reads its own memory */
  p.has_runtime = 1;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 547253);
  p.runtime.numa_blind = 1; /* 5 GB/s x 0.8 = 4 B/ns: 1050624 ns; sqrt -> 1061249.2 -> 1061250 */
  assert_true(ferry__cpu_stream_gbps(&p) == 5.0);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 1062250);
  p.host.sockets = 0; /* one socket: nothing to be blind to */
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 547253);
}

/* A runtime's own CPU efficiency replaces the default 0.7 for the math (and the unpacking). */
static void test_cpu_runtime_math_eff(void **state) {
  (void)state;
  struct ferry_hw_profile p = cpu();
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_MATMUL;
  k.m = 256, k.n = 1024, k.k = 1024;
  k.w.dtype = FERRY_DTYPE_F32;
  struct ferry__gpu_work w;
  ferry__cpu_work_of(&k, NULL, &w);
  p.has_runtime = 1;
  p.runtime.cpu_math_eff = 0.35; /* half the default: flops 536870912 at 20 x 0.35 = 7 flop/ns */
  assert_true(ferry__cpu_math_eff(&p) == 0.35);
  const double tm = 536870912.0 / 7.0, tb = 6291456.0 / 8.0;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), (int64_t)ceil(sqrt(tm * tm + tb * tb)) + 1000);
  p.runtime.cpu_math_eff = 0; /* not given: the default */
  assert_true(ferry__cpu_math_eff(&p) == FERRY_CPU_EFF_MATH);
}

/* A runtime whose low-bit dot products use 256-bit vectors on a host whose peaks count 512-bit
 * units reaches half the int8 and unpacking peaks; fp32 work keeps the full peak. */
static void test_cpu_quant_simd_width(void **state) {
  (void)state;
  struct ferry_hw_profile p = cpu();
  p.host.simd_bits = 512;
  p.has_runtime = 1;
  p.runtime.cpu_quant_simd_bits = 256;
  assert_true(ferry__cpu_quant_width(&p) == 0.5);
  struct ferry__gpu_work w;
  memset(&w, 0, sizeof w);
  w.op = FERRY_HW_OP_GEMM;
  w.math = FERRY_DTYPE_I8;
  w.flops = 1.6e6, w.alu_ops = 2e5, w.bytes = 8000;
  /* math 1.6e6 at 2 x 40 x 0.7 x 0.5 = 28 op/ns: 57142.86 ns; unpacking 2e5 at 2 x 10 / 2 x 0.7
   * x 0.5 = 3.5 op/ns: 57142.86 ns; bytes 8000 at 8 B/ns: 1000 ns;
   * sqrt(114285.71^2 + 1000^2) = 114290.09 -> 114291, + 1000 per op = 115291 */
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 115291);
  /* full width (the runtime gives none, or the host's units are no wider): twice as fast */
  p.runtime.cpu_quant_simd_bits = 0;
  assert_true(ferry__cpu_quant_width(&p) == 1.0);
  const double t = 1.6e6 / 56.0 + 2e5 / 7.0;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), (int64_t)ceil(sqrt(t * t + 1000.0 * 1000.0)) + 1000);
  p.runtime.cpu_quant_simd_bits = 256, p.host.simd_bits = 256;
  assert_true(ferry__cpu_quant_width(&p) == 1.0);
  /* fp32 math is not a low-bit dot product: the width does not apply */
  p.host.simd_bits = 512;
  w.math = FERRY_DTYPE_F32, w.alu_ops = 0, w.flops = 1.4e6; /* at 2 x 10 x 0.7 = 14 flop/ns: 1e5 ns */
  assert_int_equal(ferry__cpu_work_ns(&p, &w), (int64_t)ceil(sqrt(1e10 + 1e6)) + 1000);
}

/* Threads bound by the first job each runs (ktransformers before PR 685): 4 threads, one a core,
 * on 2 nodes of 2 cores; the first job runs 2 of them, which land one a node (tid x 2 / 2), the
 * other two bind at a job of all 4 (tid x 2 / 4 = 1): 1 thread on node 0, 3 on node 1, which
 * computes with its 2 cores. Bytes each node reads from its own memory at half the bandwidth. */
static void test_cpu_numa_first_threads(void **state) {
  (void)state;
  struct ferry_hw_profile p = cpu();
  p.host.cores = 4, p.host.sockets = 2;
  p.has_runtime = 1;
  p.runtime.cpu_math_eff = 1;
  p.runtime.numa_first_threads = 2;
  int32_t threads[FERRY_CPU_MAX_NODES];
  assert_int_equal(ferry__cpu_node_threads(&p, threads, FERRY_CPU_MAX_NODES), 2);
  assert_int_equal(threads[0], 1);
  assert_int_equal(threads[1], 3);
  struct ferry__gpu_work w;
  memset(&w, 0, sizeof w);
  w.op = FERRY_HW_OP_GEMM;
  w.math = FERRY_DTYPE_I8;
  /* math only: 1.6e5 at 4 x 40 = 160 op/ns is 1000 ns on the whole host; node 0 (1 core) 4000
   * ns, node 1 (2 cores) 2000 ns; their rates add: 1 / (1/4000 + 1/2000) = 1333.3 -> 1334 */
  w.flops = 1.6e5;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 1334 + 1000);
  /* bytes only: 8000 at 10 x 0.8 = 8 B/ns is 1000 ns; each node 2000 ns at its half: 1000 ns */
  w.flops = 0, w.bytes = 8000;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 1000 + 1000);
  /* both: node 0 sqrt(4000^2 + 2000^2) = 4472.1, node 1 sqrt(2000^2 + 2000^2) = 2828.4;
   * 1 / (1/4472.1 + 1/2828.4) = 1732.6 -> 1733 */
  w.flops = 1.6e5;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 1733 + 1000);
  /* threads spread evenly (no first-job figure, or a first job of every thread): the plain
   * roofline, sqrt(1000^2 + 1000^2) = 1414.2 -> 1415 */
  p.runtime.numa_first_threads = 0;
  assert_int_equal(ferry__cpu_node_threads(&p, threads, FERRY_CPU_MAX_NODES), 0);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 1415 + 1000);
  p.runtime.numa_first_threads = 4;
  assert_int_equal(ferry__cpu_node_threads(&p, threads, FERRY_CPU_MAX_NODES), 2);
  assert_int_equal(threads[0], 2);
  assert_int_equal(threads[1], 2);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 1415 + 1000);
  /* the 2 x Xeon Gold 6454S with --cpu_infer 65 (64 threads) after a 32-task warm-up: 16 + 48 */
  p.host.cores = 64, p.runtime.numa_first_threads = 32;
  assert_int_equal(ferry__cpu_node_threads(&p, threads, FERRY_CPU_MAX_NODES), 2);
  assert_int_equal(threads[0], 16);
  assert_int_equal(threads[1], 48);
  /* one socket, or a NUMA-blind runtime: no binding to count */
  p.host.sockets = 1;
  assert_int_equal(ferry__cpu_node_threads(&p, threads, FERRY_CPU_MAX_NODES), 0);
  p.host.sockets = 2, p.runtime.numa_blind = 1;
  assert_int_equal(ferry__cpu_node_threads(&p, threads, FERRY_CPU_MAX_NODES), 0);
}

/* An int8 product over m rows of a 1024 x 1024 int8 weight: its flops, the AVX-512 path's unpacking
 * (1.5 per element) and 8000 bytes (1000 ns at 8 B/ns). */
static struct ferry__gpu_work int8_product(int64_t m) {
  struct ferry__gpu_work w;
  memset(&w, 0, sizeof w);
  w.op = FERRY_HW_OP_GEMM;
  w.math = FERRY_DTYPE_I8;
  w.qformat = FERRY_QFORMAT_INT8;
  w.rows = m;
  w.flops = 2.0 * (double)m * 1024 * 1024, w.alu_ops = 1.5 * 1024 * 1024, w.bytes = 8000;
  return w;
}

/* A runtime with AMX kernels multiplies int8 weights on the tiles (1000 GOP/s a core here), whole
 * 16-row tiles at a time, with no unpacking; a runtime without them keeps the AVX-512 time. */
static void test_cpu_amx_int8(void **state) {
  (void)state;
  struct ferry_hw_profile p = cpu();
  p.host.core_gflops.amx_int8 = 1000;
  p.has_runtime = 1;
  /* AVX-512 (no cpu_amx): m = 16: math 33554432 at 56 op/ns (599186.3 ns) + unpacking 1572864 at
   * 7 op/ns (224694.9 ns), bytes 1000 ns: sqrt -> 823881.8 -> 823882, + 1000 */
  struct ferry__gpu_work w = int8_product(16);
  assert_true(ferry__cpu_amx_gflops(&p, &w) == 0);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 824882);
  p.runtime.cpu_amx = 1;
  /* AMX, m = 16: one full tile, 2 x 1000 GOP/s x 0.7 = 1400 op/ns: 23967.5 ns; with the 1000 ns of
   * bytes sqrt -> 23988.3 -> 23989, + 1000 */
  assert_true(ferry__cpu_amx_gflops(&p, &w) == 2000);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 24989);
  /* m = 1: the tile's 16 rows computed for one: 2000 x 1 / 16 = 125 GOP/s, 2097152 ops take as
   * long as m = 16's (23967.5 ns), still faster than AVX-512's unpacking (263146) */
  w = int8_product(1);
  assert_true(ferry__cpu_amx_gflops(&p, &w) == 125);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 24989);
  /* m = 17: two tiles for 17 rows: 2000 x 17 / 32 = 1062.5 GOP/s, 35651584 ops at 743.75 op/ns:
   * 47934.9 ns; sqrt with 1000 -> 47945.3 -> 47946, + 1000 */
  w = int8_product(17);
  assert_true(ferry__cpu_amx_gflops(&p, &w) == 1062.5);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 48946);
  /* low-bit weights need unpacking to int8, which the AMX kernels do not do; a host without the
   * figure has no AMX: both keep the AVX-512 time (m = 17: 862331) */
  w.qformat = FERRY_QFORMAT_INT4;
  assert_true(ferry__cpu_amx_gflops(&p, &w) == 0);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 862331);
  w.qformat = FERRY_QFORMAT_INT8, p.host.core_gflops.amx_int8 = 0;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 862331);
  /* a runtime that picks AMX only from 5 rows (ktransformers): m = 4 keeps AVX-512 although its
   * tile (2000 x 4 / 16 = 500 GOP/s: 8388608 ops in 23967.5 ns, as m = 16's) would be faster;
   * without the rule the tile; m = 5 runs on the tile (625 GOP/s, 23967.5 ns again) */
  p.host.core_gflops.amx_int8 = 1000, p.runtime.cpu_amx_min_rows = 5;
  w = int8_product(4);
  p.runtime.cpu_amx = 0;
  const int64_t avx4 = ferry__cpu_work_ns(&p, &w);
  assert_true(avx4 > 24989);
  p.runtime.cpu_amx = 1;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), avx4);
  p.runtime.cpu_amx_min_rows = 0;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 24989);
  p.runtime.cpu_amx_min_rows = 5;
  w = int8_product(5);
  assert_true(ferry__cpu_amx_gflops(&p, &w) == 625);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 24989);
  /* the runtime's tile kernel reaching a fraction of its own (ktransformers v0.3: 35 of 288.4
   * TOP/s): int8 at 0.35 instead of 0.7 takes twice the math, m = 16: 33554432 / 700 = 47934.9 ns;
   * sqrt with 1000 -> 47945.3 -> 47946, + 1000; the bf16 fraction leaves int8 products alone */
  w = int8_product(16);
  p.runtime.cpu_amx_eff_bf16 = 0.1;
  assert_true(ferry__cpu_amx_eff(&p, &w) == FERRY_CPU_EFF_MATH);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 24989);
  p.runtime.cpu_amx_eff_int8 = 0.35;
  assert_true(ferry__cpu_amx_eff(&p, &w) == 0.35);
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 48946);
  /* so low (tiles at 2000 x 0.01 = 20 GOP/s: 1677721.6 ns) that AVX-512's unpacking is faster:
   * the runtime picks that */
  p.runtime.cpu_amx_eff_int8 = 0.01;
  p.runtime.cpu_amx = 0;
  const int64_t avx16 = ferry__cpu_work_ns(&p, &w);
  assert_true(avx16 < 1677721);
  p.runtime.cpu_amx = 1;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), avx16);
}

/* bf16 weights, which AVX-512 multiplies without unpacking: a decode row runs faster there than on
 * a tile 1/16 full, a 16-row prefill on the tile. */
static void test_cpu_amx_bf16_fallback(void **state) {
  (void)state;
  struct ferry_hw_profile p = cpu();
  p.host.core_gflops.bf16 = 40, p.host.core_gflops.amx_bf16 = 500;
  p.has_runtime = 1, p.runtime.cpu_amx = 1;
  struct ferry__gpu_work w = int8_product(1);
  w.math = FERRY_DTYPE_BF16, w.qformat = FERRY_QFORMAT_BF16, w.alu_ops = 0;
  /* m = 1: AVX-512 2097152 / 56 = 37449.1 ns against AMX 2097152 / (1000 / 16 x 0.7) = 47934.9:
   * AVX-512; sqrt with 1000 -> 37462.5 -> 37463, + 1000 */
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 38463);
  /* m = 16: AMX 33554432 / 700 = 47934.9 ns against AVX-512's 599186.3: AMX (48946) */
  w.rows = 16, w.flops = 2.0 * 16 * 1024 * 1024;
  assert_int_equal(ferry__cpu_work_ns(&p, &w), 48946);
}

/* ferry__cpu_work_of() gives a product's rows and its packed weight's format to the AMX rule. */
static void test_cpu_work_rows_format(void **state) {
  (void)state;
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_MATMUL;
  k.m = 17, k.n = 1024, k.k = 1024;
  k.w.dtype = FERRY_DTYPE_F32;
  const struct ferry__packed packed = {1024 * 1024 + 1024 * 4, 1024.0 * 1024, FERRY_QFORMAT_INT8};
  const struct ferry__packed *const refs[3] = {&packed, NULL, NULL};
  struct ferry__gpu_work w;
  ferry__cpu_work_of(&k, refs, &w);
  assert_int_equal(w.rows, 17);
  assert_int_equal(w.qformat, FERRY_QFORMAT_INT8);
  assert_int_equal(w.math, FERRY_DTYPE_I8);
  ferry__cpu_work_of(&k, NULL, &w); /* plain fp32 weights */
  assert_int_equal(w.qformat, 0);
  assert_int_equal(w.math, FERRY_DTYPE_F32);
}

/* The catalogue's desktop hosts (hw/desktop-ddr4.json, desktop-ddr5.json: a named CPU's cores and
 * per-core rates) decode a 4-bit product of one row as llama.cpp does on them: bound by the
 * memory the weights stream from. A 4096 x 11008 int4 weight with a scale per 32 (4.5 bits a
 * weight, 25.4 MB): the time is within 1.5x of its bytes at 0.8 of the DDR bandwidth, and the
 * math alone (the product and the unpacking) takes less than the bytes. */
static void test_cpu_desktop_decode_memory_bound(void **state) {
  (void)state;
  static const char *const gpus[] = {"rtx-3060", "rtx-3090", "rtx-3090-ti", "rtx-4090", "rtx-5090"};
  for (size_t g = 0; g < sizeof gpus / sizeof gpus[0]; g++) {
    ferry_hw *hw = NULL;
    assert_int_equal(ferry_hw_open(&hw, gpus[g]), FERRY_OK);
    assert_int_equal(ferry_hw_set_runtime(hw, "native"), FERRY_OK);
    const struct ferry_hw_profile *p = ferry_hw_get(hw);
    assert_true(p->host.cores > 0 && p->host.core_gflops.int8 > p->host.core_gflops.fp32);
    struct ferry_kernel k;
    memset(&k, 0, sizeof k);
    k.kind = FERRY_K_MATMUL;
    k.m = 1, k.n = 11008, k.k = 4096;
    k.w.dtype = FERRY_DTYPE_F32;
    const double elems = 4096.0 * 11008;
    const struct ferry__packed packed = {(uint64_t)(elems * 4.5 / 8), elems, FERRY_QFORMAT_INT4};
    const struct ferry__packed *const refs[3] = {&packed, NULL, NULL};
    struct ferry__gpu_work w;
    ferry__cpu_work_of(&k, refs, &w);
    const double t_mem = w.bytes / (p->host.dram_gbps * 0.8);
    const int64_t t = ferry__cpu_work_ns(p, &w) - p->host.cpu_op_ns;
    if (!(t > t_mem && t < 1.5 * t_mem)) fail_msg("%s: %lld ns against %.0f ns of bytes", gpus[g], (long long)t, t_mem);
    struct ferry__gpu_work math = w;
    math.bytes = 0;
    assert_true(ferry__cpu_work_ns(p, &math) - p->host.cpu_op_ns < t_mem);
    ferry_hw_close(hw);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_product_soft_roofline),
      cmocka_unit_test(test_cpu_numa_blind),
      cmocka_unit_test(test_cpu_runtime_math_eff),
      cmocka_unit_test(test_cpu_quant_simd_width),
      cmocka_unit_test(test_cpu_numa_first_threads),
      cmocka_unit_test(test_cpu_amx_int8),
      cmocka_unit_test(test_cpu_amx_bf16_fallback),
      cmocka_unit_test(test_cpu_work_rows_format),
      cmocka_unit_test(test_cpu_desktop_decode_memory_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
