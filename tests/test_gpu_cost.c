/* The GPU cost model (sim/gpu_cost.h), one op kind per test, each against a roofline figure
 * worked out by hand in the comment above its assertion: tensor-core GEMM and streaming GEMV
 * in the weights' precision, a low-bit weight read packed by a fused kernel or expanded by a
 * dequantize kernel first, flash-style prefill attention (K and V read once per tile of
 * queries, from the first key a window or chunk lets them see) and paged decode attention,
 * multi-head latent attention, the published checkpoint formats (GPTQ, AWQ, MXFP4, block fp8),
 * a fused gate_up expert, a quantized embedding table, and element-wise ops priced by their bytes. The profile
 * has round numbers: 1000 GB/s (1000 bytes/ns), fp32 10, fp16 100, bf16 50, int8 200, fp8 400
 * TFLOP/s, no launch overhead, efficiencies 1 unless a test says otherwise. */
#include <math.h>
#include <string.h>

#include "ferry/exec.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "sim/cpu_cost.h"
#include "sim/gpu_cost.h"
#include "sim/hw_internal.h"
#include "testutil.h"

static struct ferry_hw_profile gpu(void) {
  struct ferry_hw_profile p;
  memset(&p, 0, sizeof p);
  p.has_gpu = 1;
  p.gpu.mem_bw_gbps = 1000.0;
  p.gpu.peak_tflops = (struct ferry_hw_peak_tflops){.fp32 = 10, .fp16 = 100, .bf16 = 50, .int8 = 200, .fp8 = 400};
  p.gpu.efficiency = (struct ferry_hw_efficiency){1, 1, 1, 1, 1};
  return p;
}

static int64_t ns_of(const struct ferry_hw_profile *p, const struct ferry_kernel *k,
                     const struct ferry__packed *const packed[3], int fused, struct ferry__gpu_work *w) {
  ferry__gpu_work_of(k, packed, fused, w);
  return ferry__gpu_work_ns(p, w);
}

static struct ferry_kernel matmul(int64_t m, int64_t n, int64_t k, enum ferry_dtype wdt) {
  struct ferry_kernel kk;
  memset(&kk, 0, sizeof kk);
  kk.kind = FERRY_K_MATMUL;
  kk.m = m, kk.n = n, kk.k = k;
  kk.w.dtype = wdt;
  return kk;
}

/* Decode GEMV streams the weights: bytes rule. */
static void test_gemv_by_bytes(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  struct ferry__gpu_work w;
  /* 4096 x 4096 fp16, one row: weights 33554432 B + x 16384 + y 16384 (fp32) = 33587200 B ->
   * 33587.2 ns; flops 2 x 4096 x 4096 = 33554432 at 1e5 flop/ns = 335.5 ns;
   * sqrt(335.54^2 + 33587.2^2) = 33588.88 -> 33589 */
  struct ferry_kernel k = matmul(1, 4096, 4096, FERRY_DTYPE_F16);
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 33589);
  assert_int_equal(w.op, FERRY_HW_OP_GEMM);
  assert_int_equal(w.math, FERRY_DTYPE_F16);
  /* the same weights in bf16: same bytes, the math at bf16's 50 TFLOP/s (671.1 ns): 33594 */
  k.w.dtype = FERRY_DTYPE_BF16;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 33594);
}

/* Prefill GEMM runs at the tensor-core peak of the weights' type. */
static void test_gemm_by_flops(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.gpu.efficiency.gemm = 0.5;
  p.gpu.efficiency.gemv = 0.8;
  struct ferry__gpu_work w;
  /* 2048 rows x 4096 x 4096 fp16: flops 2 x 2048 x 4096^2 = 68719476736 at 1e5 x 0.5 =
   * 1374389.53 ns; bytes 33554432 + 2 x 2048 x 4096 x 4 = 100663296 at 800 B/ns = 125829.12 ns;
   * sqrt of the sum of squares 1380137.67 -> 1380138 */
  struct ferry_kernel k = matmul(2048, 4096, 4096, FERRY_DTYPE_F16);
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 1380138);
  /* fp32 weights: no tensor cores, the fp32 peak (10x slower math) */
  k.w.dtype = FERRY_DTYPE_F32;
  int64_t t32 = ns_of(&p, &k, NULL, 1, &w);
  assert_true(t32 > 9 * 1374389 && t32 < 10 * 1380138);
  /* fp8 weights: fp8's peak, 4x fp16's: 343597.38 ns math, 100663296 - 33554432 + 16777216 B =
   * 83886080 B at 800 = 104857.6 ns: sqrt -> 359241.4 -> 359242 */
  k.w.dtype = FERRY_DTYPE_F8_E4M3;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 359242);
}

/* A low-bit weight a DEQUANTIZE op expanded: fused, the product reads the packed bytes and
 * unpacks on the CUDA cores; unfused, a dequantize kernel writes fp16 the product reads. */
static void test_quantized_matmul(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  struct ferry__gpu_work w;
  /* int4-g64 4096 x 4096: 8388608 B of values + per group an fp16 scale and a u8 zero:
   * 262144 groups x 3 B = 786432 -> 9175040 B packed */
  const double elems = 4096.0 * 4096.0;
  const struct ferry__packed q = {.bytes = 9175040, .elems = elems, .qformat = FERRY_QFORMAT_INT4};
  const struct ferry__packed *packed[3] = {&q, NULL, NULL};
  struct ferry_kernel k = matmul(1, 4096, 4096, FERRY_DTYPE_F32); /* the engine's expanded fp32 copy */
  /* fused GEMV: bytes 9175040 + 16384 + 16384 = 9207808 -> 9207.8 ns; math 33554432 flops at
   * fp16's 1e5 = 335.54 ns; unpacking 1.5 instructions per element = 25165824 at fp32 peak / 2
   * = 5000 per ns = 5033.16 ns: sqrt((335.54 + 5033.16)^2 + 9207.81^2) = 10658.3 -> 10659 */
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 10659);
  assert_int_equal(w.math, FERRY_DTYPE_F16);
  assert_true(w.bytes == 9207808);
  /* ... less than the fp16 GEMV of the same shape (33589 ns, test_gemv_by_bytes) */
  /* unfused: the product reads fp16 (33554432 + 32768 B, 33587.2 ns; math 335.54 ns) -> 33589 */
  assert_int_equal(ns_of(&p, &k, packed, 0, &w), 33589);
  /* ... after a dequantize kernel: packed in, fp16 out = 9175040 + 33554432 = 42729472 B at
   * 1000 B/ns = 42729.47 ns; unpacking 5033.16 ns: sqrt -> 43024.9 -> 43025 */
  struct ferry_kernel dq;
  memset(&dq, 0, sizeof dq);
  dq.kind = FERRY_K_DEQUANTIZE;
  dq.m = 9175040, dq.n = 4096, dq.k = 4096;
  dq.qformat = FERRY_QFORMAT_INT4;
  dq.y.dtype = FERRY_DTYPE_F32;
  assert_int_equal(ns_of(&p, &dq, NULL, 0, &w), 43025);
  assert_false(w.folded);
  /* fused, the dequantize op is folded into its consumer: no time, no launch */
  p.gpu.launch_overhead_ns = 3000;
  assert_int_equal(ns_of(&p, &dq, NULL, 1, &w), 0);
  assert_true(w.folded);
  /* a weight stored in fp16 is read as it is, fused or not: the dequantize op is folded */
  dq.qformat = FERRY_QFORMAT_FP16;
  assert_int_equal(ns_of(&p, &dq, NULL, 0, &w), 0);
  /* prefill through a fused kernel: each 128-row tile of the activation unpacks the weight
   * again: 512 rows = 4 tiles, 100663296 instructions = 20132.66 ns beside 17179869184 flops at
   * 1e5 = 171798.69 ns; bytes 9175040 + 2 x 512 x 4096 x 4 = 25952256 -> 25952.26 ns:
   * sqrt(191931.35^2 + 25952.26^2) = 193677.9 -> 193678 */
  p.gpu.launch_overhead_ns = 0;
  k.m = 512;
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 193678);
}

/* Prefill attention: the causal flops, K and V streamed once per tile of 128 queries. */
static void test_attention_prefill_flash(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  enum { S = 512, HEADS = 32, KVH = 8, HD = 128 };
  int32_t pos[S], slot[S];
  int64_t ctx = 0;
  for (int i = 0; i < S; i++) pos[i] = i, slot[i] = 0, ctx += i + 1;
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_ATTENTION;
  k.m = S, k.heads = HEADS, k.kv_heads = KVH, k.head_dim = HD;
  k.ints = pos, k.ints2 = slot, k.n_ints = S;
  k.context_tokens = ctx;
  k.aux[2].dtype = FERRY_DTYPE_F16;
  struct ferry__gpu_work w;
  int64_t t = ns_of(&p, &k, NULL, 1, &w);
  /* flops: 4 x heads x head_dim x S(S+1)/2 = 4 x 32 x 128 x 131328 = 2151677952 (~2 S^2 d h);
   * K/V: tiles of 128 queries read keys up to their last one: 128 + 256 + 384 + 512 = 1280
   * keys x 8 heads x 128 x 2 (K, V) x 2 B = 5242880 B; q in and out 512 x 32 x 128 x 8 =
   * 16777216 B; new k, v (fp32 in, fp16 written) 512 x 8 x 128 x 2 x 6 = 6291456 B */
  assert_true(w.flops == 2151677952.0);
  assert_true(w.bytes == 5242880.0 + 16777216.0 + 6291456.0);
  /* 21516.78 ns of math at fp16, 28311.55 ns of memory: sqrt -> 35560.6 -> 35561 */
  assert_int_equal(t, 35561);
  /* the same tokens as two sequences of 256: each reads 128 + 256 keys */
  for (int i = 0; i < S; i++) pos[i] = i % 256, slot[i] = i / 256;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  assert_true(w.bytes == 2 * 384.0 * KVH * HD * 2 * 2 + 16777216.0 + 6291456.0);
  /* a sliding window of 64: the tile of queries 128..255 reads keys 65..255 (191) */
  for (int i = 0; i < S; i++) pos[i] = i % 256, slot[i] = i / 256;
  k.sliding_window = 64;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  assert_true(w.bytes == 2 * (128.0 + 191.0) * KVH * HD * 2 * 2 + 16777216.0 + 6291456.0);
  /* chunked attention (Llama 4) in chunks of 100: the tile of queries 128..255 reads keys from
   * its first query's chunk, 100..255 (156) */
  k.sliding_window = 0;
  k.attn_chunk = 100;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  assert_true(w.bytes == 2 * (128.0 + 156.0) * KVH * HD * 2 * 2 + 16777216.0 + 6291456.0);
}

/* Decode attention: each sequence's cached K and V streamed once (paged). */
static void test_attention_decode_paged(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  enum { B = 4, KVH = 8, HD = 128 };
  int32_t pos[B] = {1000, 2000, 3000, 4000}, slot[B] = {0, 1, 2, 3};
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_ATTENTION;
  k.m = B, k.heads = 32, k.kv_heads = KVH, k.head_dim = HD;
  k.ints = pos, k.ints2 = slot, k.n_ints = B;
  k.context_tokens = 1001 + 2001 + 3001 + 4001;
  k.aux[2].dtype = FERRY_DTYPE_F16;
  struct ferry__gpu_work w;
  /* K/V: 10004 keys x 8 x 128 x 2 x 2 = 40976384 B; q and out 4 x 32 x 128 x 8 = 131072;
   * appended 4 x 8 x 128 x 2 x 6 = 49152: 41156608 B -> 41156.6 ns; flops 4 x 32 x 128 x
   * 10004 = 163905536 at 1e5 = 1639.06 ns: sqrt -> 41189.2 -> 41190 */
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 41190);
  assert_true(w.bytes == 41156608.0);
  assert_int_equal(w.op, FERRY_HW_OP_ATTENTION);
  /* three kernels pay the GPU's fixed time: the append of the new K and V, the split-KV
   * attention and the combine of its splits: 41190 + 3 x 2000 = 47190 */
  assert_int_equal(w.launches, 3);
  p.gpu.launch_overhead_ns = 2000;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 47190);
  /* two tokens of one sequence are a prefill chunk: no split, append + attention */
  slot[1] = 0, pos[1] = 1001;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  assert_int_equal(w.launches, 2);
}

/* A step's attention over two sequences at positions 1000 and 2000 (slots 0 and 1: 3002 keys), of
 * heads query and kv_heads K/V heads of 128 dims, over an fp16 cache; pos and slot hold B ints. */
static void two_sequence_attention(struct ferry_kernel *k, int32_t *pos, int32_t *slot, int heads, int kv_heads) {
  memset(k, 0, sizeof *k);
  pos[0] = 1000, pos[1] = 2000, slot[0] = 0, slot[1] = 1;
  k->kind = FERRY_K_ATTENTION;
  k->m = 2, k->heads = heads, k->kv_heads = kv_heads, k->head_dim = 128;
  k->ints = pos, k->ints2 = slot, k->n_ints = 2;
  k->context_tokens = 1001 + 2001;
  k->aux[2].dtype = FERRY_DTYPE_F16;
}

/* A runtime that repeats grouped K and V to every query head first (HF transformers'
 * repeat_kv) writes and reads that copy: n_rep x each sequence's context x kv heads x (K, V)
 * x head_dim x the cache's element size, twice; once per sequence, however many of its
 * queries the step carries. Runtimes without the figure and ungrouped heads are unchanged. */
static void test_attention_repeat_kv(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  int32_t pos[2], slot[2];
  struct ferry_kernel k;
  two_sequence_attention(&k, pos, slot, 32, 8);
  struct ferry__gpu_work w;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double plain = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w); /* no runtime: nothing added */
  assert_true(w.bytes == plain);
  p.has_runtime = 1;
  p.runtime.attn_repeat_kv = 1;
  ferry__runtime_work(&p, &k, 0, &w);
  /* n_rep 4; 3002 keys x 8 heads x 2 (K, V) x 128 x 2 B = 12296192 B of cache, copied 4 times
   * and read back: 2 x 4 x 12296192 = 98369536 B more */
  assert_true(w.bytes == plain + 98369536.0);
  /* a prefill of 3 tokens of one sequence (positions 0..2) and a decode token of another:
   * the copy is made once per sequence: (3 + 2001) keys */
  int32_t pos2[4] = {0, 1, 2, 2000}, slot2[4] = {0, 0, 0, 1};
  k.m = 4, k.ints = pos2, k.ints2 = slot2, k.n_ints = 4, k.context_tokens = 1 + 2 + 3 + 2001;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double plain2 = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == plain2 + 2.0 * 4 * (3 + 2001) * 8 * 2 * 128 * 2);
  /* ungrouped heads (multi-head attention) have nothing to repeat */
  k.kv_heads = 32;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double mha = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == mha);
}

/* An attention kernel that appends the new K and V itself (runtime.attn_fa2_kvcache: FlashAttention-2's
 * flash_attn_with_kvcache given k and v) copies them once per tile of 64 queries per query head,
 * each tile the new rows up to the end of the last 128-key tile (head_dim 128) its causal mask
 * reaches: a K and a V row of 128 fp16 each, read and written (1024 bytes). A decode token of
 * grouped-query attention copies once per KV head. On the CPU, and without the figure, nothing. */
static void test_attention_append_in_kernel(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.has_runtime = 1;
  enum { S = 256 };
  int32_t pos[S + 1], slot[S + 1];
  int64_t ctx = 0;
  for (int i = 0; i < S; i++) pos[i] = i, slot[i] = 0, ctx += i + 1;
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_ATTENTION;
  k.m = S, k.heads = 32, k.kv_heads = 4, k.head_dim = 128;
  k.ints = pos, k.ints2 = slot, k.n_ints = S;
  k.context_tokens = ctx;
  k.aux[2].dtype = FERRY_DTYPE_F16;
  struct ferry__gpu_work w;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double plain = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == plain);
  p.runtime.attn_fa2_kvcache = 1;
  ferry__runtime_work(&p, &k, 0, &w);
  /* 256 new tokens from position 0: the tiles ending at queries 64, 128, 192, 256 reach keys
   * 128, 128, 256, 256: 768 rows x 32 heads x 1024 B = 25165824 B; the kernel count stays */
  assert_true(w.bytes == plain + 25165824.0);
  assert_int_equal(w.launches, 2);
  /* 20 new tokens after 100 cached: one tile reaching key 128 copies the 20 new rows: 640 */
  for (int i = 0; i < 20; i++) pos[i] = 100 + i;
  k.m = 20, k.n_ints = 20, k.context_tokens = 20 * 100 + 210;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double chunk = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == chunk + 20.0 * 32 * 1024);
  /* two decode tokens: one row per KV head each (2 x 4), the group's query heads swapped in */
  pos[0] = 500, pos[1] = 900, slot[0] = 0, slot[1] = 1;
  k.m = 2, k.n_ints = 2, k.context_tokens = 501 + 901;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double decode = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == decode + 8.0 * 1024);
  /* a CPU attention has no such kernel */
  ferry__gpu_work_of(&k, NULL, 1, &w);
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == decode);
}

/* The kernel's work as a runtime of profile p runs it: its own, then the runtime's. */
static struct ferry__gpu_work runtime_priced(const struct ferry_hw_profile *p, const struct ferry_kernel *k, int cpu) {
  struct ferry__gpu_work w;
  ferry__gpu_work_of(k, NULL, 1, &w);
  ferry__runtime_work(p, k, cpu, &w);
  return w;
}

/* FlashAttention-2's split-KV kernel (runtime.attn_fa2_kvcache) runs a call's thread blocks (64-query
 * tiles x query heads, x the splits of the keys FA2 picks when they do not nearly fill the SMs)
 * in waves of the blocks the SMs hold: its math is stretched by ceil(waves) / waves. The profile:
 * an A100's 108 SMs of compute capability 8.0, 164 KiB of shared memory each, of which a block
 * of head dim 128 takes (64 + 2 x 128) x 128 x 2 B + 1 KiB reserved = 82944 B: 2 an SM, 216 at
 * once. Without an SM count, or where no block fits (7.5: 64 KiB), the math is left as it was. */
static void test_attention_fa2_waves(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.has_runtime = 1;
  p.runtime.attn_fa2_kvcache = 1;
  p.gpu.sm_count = 108, p.gpu.compute_capability = 8.0;
  int64_t smem = 0, reserved = 0;
  assert_int_equal(ferry__hw_gpu_shared_memory(8.0, &smem, &reserved), 0);
  assert_true(smem == 167936 && reserved == 1024);
  assert_int_equal(ferry__hw_gpu_shared_memory(9.0, &smem, NULL), 0);
  assert_true(smem == 233472);
  assert_int_equal(ferry__hw_gpu_shared_memory(8.64, &smem, &reserved), -1);
  assert_true(smem == 233472); /* untouched */
  enum { S = 256 };
  int32_t pos[S], slot[S];
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_ATTENTION;
  k.heads = 32, k.kv_heads = 4, k.head_dim = 128;
  k.ints = pos, k.ints2 = slot;
  k.aux[2].dtype = FERRY_DTYPE_F16;
  /* 256 new tokens after 3072 cached: 4 tiles x 32 heads = 128 blocks, at least 0.8 x 108: one
   * split, one wave of 216 slots 128 / 216 full: x 216 / 128 = 1.6875 */
  int64_t ctx = 0;
  for (int i = 0; i < S; i++) pos[i] = 3072 + i, slot[i] = 0, ctx += 3072 + i + 1;
  k.m = S, k.n_ints = S, k.context_tokens = ctx;
  struct ferry__gpu_work w;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double flops = w.flops;
  assert_true(fabs(runtime_priced(&p, &k, 0).flops / flops - 1.6875) < 1e-12);
  /* 128 after 3072: 64 blocks, under 86.4: 25 key tiles; splits of 1..5 make 0.593, 0.593 (13
   * tiles a split), 0.889, 0.790, 0.988 of their last wave full (0.988 at 5 is the best of the
   * eligible counts): 3 is the fewest within 85 % of it: 192 blocks, x 216 / 192 = 1.125 */
  ctx = 0;
  for (int i = 0; i < 128; i++) ctx += 3072 + i + 1;
  k.m = 128, k.n_ints = 128, k.context_tokens = ctx;
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double flops128 = w.flops;
  assert_true(fabs(runtime_priced(&p, &k, 0).flops / flops128 - 1.125) < 1e-12);
  /* no SM count, or a capability whose SM holds no such block: the roofline's math */
  p.gpu.sm_count = 0;
  assert_true(runtime_priced(&p, &k, 0).flops == flops128);
  p.gpu.sm_count = 40, p.gpu.compute_capability = 7.5;
  assert_true(runtime_priced(&p, &k, 0).flops == flops128);
}

/* The KV-offload fork's CPU attention (runtime.cpu_kv_upcast, BLOOM's `key_layer.float()`,
 * `value_layer.float()`) writes an fp32 copy of the K and V of every key each sequence sees when
 * its cache is fp16 and its products read that copy: 4 + 4 bytes per element beyond the cache's
 * own read. Only on the CPU, only for a cache that is not fp32; a repeat_kv copy is then fp32. */
static void test_cpu_kv_upcast(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.has_runtime = 1;
  p.runtime.cpu_kv_upcast = 1;
  int32_t pos[2], slot[2];
  struct ferry_kernel k;
  two_sequence_attention(&k, pos, slot, 16, 16);
  struct ferry__gpu_work w;
  ferry__cpu_work_of(&k, NULL, &w);
  const double plain = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w); /* on the GPU: nothing added */
  assert_true(w.bytes == plain);
  ferry__runtime_work(&p, &k, 1, &w);
  /* 3002 keys x 16 heads x 2 (K, V) x 128 = 12296192 elements, x (4 written + 4 read) */
  assert_true(w.bytes == plain + 98369536.0);
  /* an fp32 cache (OPT's and Llama's in the fork) is read as it is */
  k.aux[2].dtype = FERRY_DTYPE_F32;
  ferry__cpu_work_of(&k, NULL, &w);
  const double f32 = w.bytes;
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == f32);
  /* without the figure nothing is added */
  k.aux[2].dtype = FERRY_DTYPE_F16;
  p.runtime.cpu_kv_upcast = 0;
  ferry__cpu_work_of(&k, NULL, &w);
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == plain);
  /* grouped heads (32 query, 8 kv) with repeat_kv: the upcast 3002 x 8 x 2 x 128 x 8 = 49184768
   * B, then the repeated copy of fp32 elements written and read: 2 x 4 x 3002 x 8 x 2 x 128 x 4
   * = 196739072 B (twice the fp16 copy of test_attention_repeat_kv) */
  p.runtime.cpu_kv_upcast = 1, p.runtime.attn_repeat_kv = 1;
  k.heads = 32, k.kv_heads = 8;
  ferry__cpu_work_of(&k, NULL, &w);
  const double gqa = w.bytes;
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == gqa + 49184768.0 + 196739072.0);
}

/* runtime.cpu_fresh_alloc: PyTorch's CPU tensors are posix_memalign'd with no cache, glibc mmaps a
 * request of at least its largest mmap threshold (32 MiB on 64-bit) fresh, and Linux zeroes each
 * fresh page on its first write: every repeat_kv or upcast copy (one tensor for K, one for V) of at
 * least 32 MiB is written once more, on the CPU only. */
static void test_cpu_fresh_alloc(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.has_runtime = 1;
  p.runtime.attn_repeat_kv = 1, p.runtime.cpu_fresh_alloc = 1;
  int32_t pos[2], slot[2];
  struct ferry_kernel k;
  two_sequence_attention(&k, pos, slot, 32, 8);
  struct ferry__gpu_work w;
  /* fp16 repeat_kv copies: 4 x 3002 x 8 x 128 x 2 = 24592384 B each, under 32 MiB (33554432):
   * they may come from the heap, nothing added beyond test_attention_repeat_kv's 98369536 */
  ferry__cpu_work_of(&k, NULL, &w);
  const double plain = w.bytes;
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == plain + 98369536.0);
  /* with the fp32 upcast the repeated copies are 49184768 B each, over 32 MiB: both zeroed,
   * 98369536 B more; the upcast copies (3002 x 8 x 128 x 4 = 12296192 B each) are not */
  p.runtime.cpu_kv_upcast = 1;
  ferry__cpu_work_of(&k, NULL, &w);
  const double gqa = w.bytes;
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == gqa + 49184768.0 + 196739072.0 + 98369536.0);
  /* on the GPU (the caching allocator) nothing is zeroed: only repeat_kv's fp16 copy */
  ferry__gpu_work_of(&k, NULL, 1, &w);
  const double dev = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == dev + 98369536.0);
  /* ungrouped heads, longer sequences: 10001 + 20001 = 30002 keys; the upcast copies are
   * 30002 x 8 x 128 x 4 = 122888192 B each: written and read (2 x 245776384 B) and zeroed
   * (245776384 B) */
  int32_t pos2[2] = {10000, 20000};
  k.ints = pos2, k.context_tokens = 10001 + 20001, k.heads = 8;
  ferry__cpu_work_of(&k, NULL, &w);
  const double mha = w.bytes;
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == mha + 491552768.0 + 245776384.0);
  /* without the figure: the copies alone */
  p.runtime.cpu_fresh_alloc = 0;
  ferry__cpu_work_of(&k, NULL, &w);
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == mha + 491552768.0);
}

/* A framework that dequantizes and handles its int4 KV cache with separate PyTorch ops (FlexGen,
 * hw/flexgen.json): a dequantize moves dequant_pass_bytes per element beyond its packed read in
 * dequant_kernels kernels; a decode step expands its whole quantized cache first and attention
 * reads fp16; every new K and V element is quantized at kv_quant_bytes. */
static void test_unfused_framework(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.has_runtime = 1;
  p.runtime.dequant_pass_bytes = 12.5, p.runtime.dequant_kernels = 6;
  p.runtime.kv_expand = 1, p.runtime.kv_quant_bytes = 25.5, p.runtime.kv_quant_kernels = 12;
  struct ferry__gpu_work w;
  /* int4-g64 4096 x 4096 (9175040 B packed, test_quantized_matmul): 9175040 + 12.5 x 16777216 =
   * 218890240 B -> 218890.24 ns beside 5033.16 ns of unpacking: sqrt -> 218948.1 -> 218949 */
  struct ferry_kernel dq;
  memset(&dq, 0, sizeof dq);
  dq.kind = FERRY_K_DEQUANTIZE;
  dq.m = 9175040, dq.n = 4096, dq.k = 4096;
  dq.qformat = FERRY_QFORMAT_INT4;
  dq.y.dtype = FERRY_DTYPE_F32;
  ferry__gpu_work_of(&dq, NULL, 0, &w);
  ferry__runtime_work(&p, &dq, 0, &w);
  assert_true(w.bytes == 218890240.0);
  assert_int_equal(w.launches, 6);
  assert_int_equal(w.ops, 5);
  assert_int_equal(ferry__gpu_work_ns(&p, &w), 218949);
  /* on a CPU queue, or folded into a fused consumer: unchanged */
  ferry__gpu_work_of(&dq, NULL, 0, &w);
  ferry__runtime_work(&p, &dq, 1, &w);
  assert_true(w.bytes == 9175040.0 + 2.0 * 4096 * 4096);
  ferry__gpu_work_of(&dq, NULL, 1, &w);
  ferry__runtime_work(&p, &dq, 0, &w);
  assert_true(w.folded && w.bytes == 0 && w.ops == 0);
  /* decode attention of two sequences at positions 1000 and 2000 over an int4 cache (rows of 128
   * = 64 B of codes + 4 fp16 scales = 72 B): 3002 keys x 32 heads x (K, V) = 192128 rows expanded
   * at 72 + 128 x 12.5 = 1672 B (321238016 B), then read as fp16 instead of packed: 192128 x
   * (256 - 72) = 35351552 B; the two new tokens quantized: 2 x 32 x 2 x 128 x 25.5 = 417792 B.
   * Kernels: 2 x 6 for the expansion, 2 x 12 for the quantizer */
  int32_t pos[2] = {1000, 2000}, slot[2] = {0, 1};
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_ATTENTION;
  k.m = 2, k.heads = 32, k.kv_heads = 32, k.head_dim = 128;
  k.ints = pos, k.ints2 = slot, k.n_ints = 2;
  k.context_tokens = 1001 + 2001;
  k.kv_format = FERRY_KV_INT4;
  k.aux[2].dtype = FERRY_DTYPE_U8;
  ferry__gpu_work_of(&k, NULL, 0, &w);
  const double plain = w.bytes;
  const int launches = w.launches;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == plain + 321238016.0 + 35351552.0 + 417792.0);
  assert_int_equal(w.launches, launches + 36);
  assert_int_equal(w.ops, 36);
  /* a prefill of 3 tokens of one sequence: nothing expanded, 3 x 8192 x 25.5 = 626688 B quantized */
  int32_t pos3[3] = {0, 1, 2}, slot3[3] = {0, 0, 0};
  k.m = 3, k.ints = pos3, k.ints2 = slot3, k.n_ints = 3, k.context_tokens = 1 + 2 + 3;
  ferry__gpu_work_of(&k, NULL, 0, &w);
  const double prefill = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == prefill + 626688.0);
  assert_int_equal(w.ops, 24);
  /* an fp16 cache: FlexGen's decode reads it as it is; nothing added */
  k.kv_format = FERRY_KV_FP16;
  k.aux[2].dtype = FERRY_DTYPE_F16;
  ferry__gpu_work_of(&k, NULL, 0, &w);
  const double fp16 = w.bytes;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == fp16 && w.ops == 0);
}

/* runtime.kv_full_window: a runtime that preallocates each sequence's cache for its longest length
 * works over the whole slot (kv_capacity keys) in a decode step, written or not. Without
 * kv_expand (no preset: the KV-offload fork hands each layer the slice written so far) the
 * products read, and multiply, every key of the slot, and the upcast and repeat copies are of all
 * of them; FlexGen (kv_expand): the expansion covers the slot, the products read the keys written. Prefill, a ring cache and a slot no longer than the context
 * add nothing. */
static void test_kv_full_window(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.has_runtime = 1;
  p.runtime.kv_full_window = 1;
  int32_t pos[2], slot[2];
  struct ferry_kernel k;
  two_sequence_attention(&k, pos, slot, 16, 16);
  k.kv_capacity = 4000;
  struct ferry__gpu_work w;
  /* on the CPU, fp16 cache: (4000 - 1001) + (4000 - 2001) = 4998 keys more; read: 4998 x
   * 16 heads x (K, V) x 128 x 2 B = 40943616 B; 4 x 4998 x 16 x 128 = 40943616 flops */
  ferry__cpu_work_of(&k, NULL, &w);
  const double plain = w.bytes, plain_flops = w.flops;
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == plain + 40943616.0);
  assert_true(w.flops == plain_flops + 40943616.0);
  /* with the fp32 upcast: the copy of all 8000 keys (3002 + 4998), 8000 x 16 x 2 x 128 x (4 + 4)
   * = 262144000 B, beside the wider read */
  p.runtime.cpu_kv_upcast = 1;
  ferry__cpu_work_of(&k, NULL, &w);
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == plain + 40943616.0 + 262144000.0);
  p.runtime.cpu_kv_upcast = 0;
  /* a slot no longer than what the sequences have written: nothing more */
  k.kv_capacity = 2001;
  int32_t pos_full[2] = {1000, 2000};
  k.ints = pos_full;
  ferry__cpu_work_of(&k, NULL, &w);
  const double short_slot = w.bytes;
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == short_slot + (2001.0 - 1001) * 16 * 2 * 128 * 2); /* only the first sequence's rest */
  k.kv_capacity = 4000;
  /* a ring cache holds only what its window sees: nothing more */
  k.kv_ring = 1;
  ferry__cpu_work_of(&k, NULL, &w);
  ferry__runtime_work(&p, &k, 1, &w);
  assert_true(w.bytes == plain);
  k.kv_ring = 0;
  /* a prefill (three tokens of one sequence) reads what it has written */
  int32_t pos3[3] = {0, 1, 2}, slot3[3] = {0, 0, 0};
  struct ferry_kernel pre = k;
  pre.m = 3, pre.ints = pos3, pre.ints2 = slot3, pre.n_ints = 3, pre.context_tokens = 1 + 2 + 3;
  ferry__cpu_work_of(&pre, NULL, &w);
  const double prefill = w.bytes;
  ferry__runtime_work(&p, &pre, 1, &w);
  assert_true(w.bytes == prefill);
  /* FlexGen: int4 cache (rows of 72 B), kv_expand: 8000 keys x 16 x 2 = 256000 rows expanded at
   * 72 + 128 x 12.5 = 1672 B (428032000 B), the 3002 written (96064 rows) then read as fp16 instead
   * of packed: 96064 x (256 - 72) = 17675776 B; no wider read by the products */
  p.runtime.kv_expand = 1, p.runtime.dequant_pass_bytes = 12.5;
  k.kv_format = FERRY_KV_INT4;
  k.aux[2].dtype = FERRY_DTYPE_U8;
  ferry__gpu_work_of(&k, NULL, 0, &w);
  const double packed = w.bytes, packed_flops = w.flops;
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == packed + 428032000.0 + 17675776.0);
  assert_true(w.flops == packed_flops);
  /* without the figure: only the written keys expanded (96064 x 1672 = 160619008 B) */
  p.runtime.kv_full_window = 0;
  ferry__gpu_work_of(&k, NULL, 0, &w);
  ferry__runtime_work(&p, &k, 0, &w);
  assert_true(w.bytes == packed + 160619008.0 + 17675776.0);
}

/* Norms, activations, RoPE: their bytes at the element-wise efficiency. */
static void test_elementwise_by_bytes(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.gpu.efficiency.elementwise = 0.5;
  p.gpu.launch_overhead_ns = 2000;
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_SWIGLU;
  k.fn = FERRY_FN_SILU_MUL;
  k.m = 64, k.n = 14336;
  struct ferry__gpu_work w;
  /* silu(gate) x up: read two fp32 rows and write one: 64 x 14336 x 12 = 11010048 B at 500
   * B/ns = 22020.1 ns; 6 flops per element = 5505024 at fp32 1e4 x 0.5 = 1101.0 ns:
   * sqrt -> 22047.6 -> 22048 + 2000 launch */
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 24048);
  assert_int_equal(w.op, FERRY_HW_OP_ELEMENTWISE);
  /* GeGLU (Gemma's gelu_tanh(gate) x up) moves the same rows; a plain GELU rewrites one row in
   * place: 64 x 14336 x 8 = 7340032 B -> 14680.1 ns beside 1101.0: sqrt -> 14721.3 -> 14722 + 2000 */
  k.fn = FERRY_FN_GELU_TANH_MUL;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 24048);
  k.fn = FERRY_FN_GELU_TANH;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 16722);
  /* RMSNorm of 64 rows of 4096 with an fp16 weight: 64 x 4096 x 8 + 4096 x 2 = 2105344 B ->
   * 4210.69 ns; 5 flops per element 1310720 -> 262.14 ns: sqrt -> 4218.8 -> 4219 + 2000 */
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_NORM;
  k.m = 64, k.n = 4096;
  k.w.dtype = FERRY_DTYPE_F16;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 6219);
}

/* Norms, RoPE and activations on a GPU whose SMs, clock and compute capability the profile
 * gives: one block per token, a chain of dependent loads per block beside the runtime's
 * activation bytes, after a 2 us floor. The profile: 10 SMs at 1000 MHz (a round trip of 450
 * cycles = 450 ns), 1000 GB/s, compute capability 8.0 (2048 threads, 32 blocks an SM). */
static void test_elementwise_by_geometry(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  p.gpu.launch_overhead_ns = 5000;
  p.gpu.sm_count = 10, p.gpu.clock_mhz = 1000, p.gpu.compute_capability = 8.0;
  struct ferry_kernel k;
  struct ferry__gpu_work w;
  /* RMSNorm, 64 tokens of 4096: blocks of 1024, 2 x 4 steps; 2 blocks an SM, 20 at once: 4
   * waves x 8 x 450 = 14400 ns; bytes 2 x 64 x 4096 x 2 + 4096 x 2 = 1056768 -> 1056.8 ns;
   * sqrt -> 14438.7 -> 14439 + 2000 */
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_NORM;
  k.m = 64, k.n = 4096;
  k.w.dtype = FERRY_DTYPE_F16;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 16439);
  assert_int_equal(w.geometry, FERRY_GEOM_ROW_BLOCKS);
  assert_true(w.block_steps == 8);
  /* SiLU-and-mul of one token of 28672 (Llama-2-70B): 28 steps of one block, 12600 ns, beside
   * 172032 bytes (172.0 ns): 12601.2 -> 12602 + 2000; the bytes alone would say 2172 */
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_SWIGLU;
  k.fn = FERRY_FN_SILU_MUL;
  k.m = 1, k.n = 28672;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 14602);
  /* RoPE, 3 tokens, 32 query and 8 key heads of 128: 2048 and 512 pairs, blocks of 512: 4 + 1
   * steps, 2250 ns; 4 x 3 x 2560 x 2 = 61440 bytes (61.4 ns): 2250.8 -> 2251 + 2000 */
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_ROPE;
  k.m = 3, k.heads = 32, k.kv_heads = 8, k.head_dim = 128;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 4251);
  /* a plain GELU is a grid over its elements: 2 x 64 x 10240 x 2 bytes = 2621.4 ns + 2000 */
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_SWIGLU;
  k.fn = FERRY_FN_GELU;
  k.m = 64, k.n = 10240;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 4622);
  assert_int_equal(w.geometry, FERRY_GEOM_GRID);
  /* compute capability 7.5 holds one block of 1024 an SM: the norm above takes 7 waves; a
   * runtime of fp32 activations doubles its bytes; a launch overhead below the floor is the floor:
   * sqrt(25200^2 + 2105.3^2) = 25287.8 -> 25288 + 1000 */
  p.gpu.compute_capability = 7.5;
  p.gpu.launch_overhead_ns = 1000;
  p.has_runtime = 1;
  p.runtime.act_bytes = 4;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_NORM;
  k.m = 64, k.n = 4096;
  k.w.dtype = FERRY_DTYPE_F16;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 26288);
  /* without the clock the profile cannot say: the engine's fp32 bytes at the element-wise
   * efficiency, as in test_elementwise_by_bytes: 64 x 4096 x 8 + 8192 = 2105344 B -> 2105.3 ns,
   * 1310720 flops at 1e4 -> 131.1 ns: 2109.4 -> 2110 + 1000 */
  p.gpu.clock_mhz = 0;
  assert_int_equal(ns_of(&p, &k, NULL, 1, &w), 3110);
}

/* The formats of published checkpoints: GPTQ, AWQ and MXFP4 read packed by the same fused
 * kernels as int4; block-scaled fp8 (DeepSeek-V3) on fp8 tensor cores when fused, expanded to
 * fp16 by a dequantize kernel otherwise. */
static void test_published_formats(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  struct ferry__gpu_work w;
  const double elems = 4096.0 * 4096.0;
  struct ferry_kernel k = matmul(1, 4096, 4096, FERRY_DTYPE_F32);
  /* MXFP4 4096 x 4096: two e2m1 values a byte, one e8m0 scale per 32: 8388608 + 524288 =
   * 8912896 B; with x and y 8945664 B -> 8945.66 ns; math 335.54 ns; unpacking 1.5 per element
   * 5033.16 ns: sqrt((335.54 + 5033.16)^2 + 8945.66^2) -> 10434 */
  struct ferry__packed q = {.bytes = 8912896, .elems = elems, .qformat = FERRY_QFORMAT_MXFP4};
  const struct ferry__packed *packed[3] = {&q, NULL, NULL};
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 10434);
  assert_true(w.bytes == 8945664);
  /* GPTQ and AWQ at the same packed size cost the same as MXFP4 (int4 unpacking) */
  q.qformat = FERRY_QFORMAT_GPTQ4;
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 10434);
  q.qformat = FERRY_QFORMAT_AWQ4;
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 10434);
  /* fp8 with fp32 scales per 128 x 128 block: 16777216 + 1024 x 4 = 16781312 B, 16814080 with
   * x and y -> 16814.08 ns; math at fp8's 4e5 flop/ns 83.89 ns; 0.5 instructions per element
   * 1677.72 ns: sqrt((83.89 + 1677.72)^2 + 16814.08^2) -> 16907 */
  q = (struct ferry__packed){.bytes = 16781312, .elems = elems, .qformat = FERRY_QFORMAT_FP8B};
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 16907);
  assert_int_equal(w.math, FERRY_DTYPE_F8_E4M3);
  /* prefill of 2048 rows, fused: 2 x 2048 x 4096^2 flops at 4e5 = 171798.69 ns, unpacking 16
   * tiles x 0.5 x 4096^2 at 5000 = 26843.55 ns; bytes 16781312 + 2 x 2048 x 4096 x 4 =
   * 83890176 -> 83890.18 ns: sqrt -> 215631 */
  k.m = 2048;
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 215631);
  /* expanded to fp16 first: fp16 math 687194.77 ns, bytes 33554432 + 67108864 -> 694529 */
  assert_int_equal(ns_of(&p, &k, packed, 0, &w), 694529);
  assert_int_equal(w.math, FERRY_DTYPE_F16);
}

/* An expert whose gate and up weights are one fused [2n, k] tensor (gpt-oss): each packed weight
 * replaces its own elements of the expanded copy. */
static void test_fused_gate_up_expert(void **state) {
  (void)state;
  struct ferry__gpu_work w;
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_EXPERT;
  k.m = 1, k.n = 1024, k.k = 1024;
  k.w.dtype = k.aux[1].dtype = FERRY_DTYPE_F32;
  /* MXFP4 gate_up 2048 x 1024: 1048576 + 65536 B; down 1024 x 1024: 524288 + 32768 B */
  const struct ferry__packed gate_up = {.bytes = 1114112, .elems = 2048.0 * 1024, .qformat = FERRY_QFORMAT_MXFP4};
  const struct ferry__packed down = {.bytes = 557056, .elems = 1024.0 * 1024, .qformat = FERRY_QFORMAT_MXFP4};
  const struct ferry__packed *packed[3] = {&gate_up, NULL, &down};
  ferry__gpu_work_of(&k, packed, 1, &w);
  /* 3 x 1024 x 1024 x 4 B of expanded weights out, 1671168 packed in; activations 1 x 1024 x 8
   * + 1 x 1024 x 8 = 16384 */
  assert_true(w.bytes == 1671168.0 + 16384.0);
  assert_true(w.alu_ops == 1.5 * 3 * 1024 * 1024);
}

/* Multi-head latent attention (DeepSeek): the latent rows read once per tile of queries like
 * flash attention, the absorbed kv_b_proj weight read packed when it is stored quantized. */
static void test_mla_attention(void **state) {
  (void)state;
  struct ferry_hw_profile p = gpu();
  enum { S = 256, H = 16, NOPE = 128, ROPE = 64, RANK = 512, V = 128 };
  int32_t pos[S], slot[S];
  int64_t ctx = 0;
  for (int i = 0; i < S; i++) pos[i] = i, slot[i] = 0, ctx += i + 1;
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_MLA_ATTENTION;
  k.m = S, k.heads = H, k.kv_heads = 1, k.head_dim = NOPE, k.rot_dim = ROPE, k.k = RANK, k.n = V;
  k.ints = pos, k.ints2 = slot, k.n_ints = S;
  k.context_tokens = ctx;
  k.aux[2].dtype = FERRY_DTYPE_F16;
  k.w.dtype = FERRY_DTYPE_F32; /* kv_b_proj, expanded from fp8 */
  /* kv_b_proj 16 x 256 x 512 = 2097152 fp8 elements + 32 x 4 block scales of 4 B */
  const struct ferry__packed q = {.bytes = 2097664, .elems = 2097152, .qformat = FERRY_QFORMAT_FP8B};
  const struct ferry__packed *packed[3] = {&q, NULL, NULL};
  struct ferry__gpu_work w;
  /* flops 2 x 256 x 16 x 512 x 256 + 2 x 32896 x 16 x (2 x 512 + 64) = 2219048960 at fp16
   * (the cache's type) 22190.49 ns; unpacking 2 tiles x 0.5 x 2097152 at 5000 = 419.43 ns;
   * bytes: latent rows 128 + 256 = 384 x 576 x 2 = 442368, the weight packed 2097664, q in and
   * out 256 x 16 x 320 x 4 = 5242880: 7782912 -> 7782.91 ns: sqrt -> 23912 */
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 23912);
  assert_int_equal(w.op, FERRY_HW_OP_ATTENTION);
  assert_int_equal(w.math, FERRY_DTYPE_F16);
  assert_true(w.flops == 2219048960.0);
  assert_true(w.bytes == 7782912.0);
  /* decode of one token at position 1000: 1001 latent rows once: 1001 x 576 x 2 + 2097664 +
   * 16 x 320 x 4 = 3271296 B -> 3271.3 ns; flops 39045120 -> 390.45 ns + 209.72 unpacking:
   * sqrt -> 3326 */
  pos[0] = 1000;
  k.m = 1, k.n_ints = 1, k.context_tokens = 1001;
  assert_int_equal(ns_of(&p, &k, packed, 1, &w), 3326);
}

/* A quantized embedding table: the gathered rows read packed, not the table expanded. */
static void test_quantized_embed(void **state) {
  (void)state;
  struct ferry_kernel k;
  memset(&k, 0, sizeof k);
  k.kind = FERRY_K_EMBED;
  k.m = 4, k.n = 4096;
  k.w.dtype = FERRY_DTYPE_F32;
  /* int8 table of 32000 x 4096 with fp32 row scales: 131072000 + 128000 B, 1.0009766 B per
   * element */
  const struct ferry__packed q = {.bytes = 131200000, .elems = 32000.0 * 4096, .qformat = FERRY_QFORMAT_INT8};
  const struct ferry__packed *packed[3] = {&q, NULL, NULL};
  struct ferry__gpu_work w;
  ferry__gpu_work_of(&k, packed, 1, &w);
  /* 4 rows x 4096 read packed (16400 B) and written fp32 (65536 B) */
  assert_true(fabs(w.bytes - (4.0 * 4096 * 131200000.0 / (32000.0 * 4096) + 65536.0)) < 1e-6);
  /* unfused: the rows of the fp16 copy */
  ferry__gpu_work_of(&k, packed, 0, &w);
  assert_true(w.bytes == 4.0 * 4096 * 2 + 65536.0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemv_by_bytes),
      cmocka_unit_test(test_gemm_by_flops),
      cmocka_unit_test(test_quantized_matmul),
      cmocka_unit_test(test_attention_prefill_flash),
      cmocka_unit_test(test_attention_decode_paged),
      cmocka_unit_test(test_elementwise_by_bytes), cmocka_unit_test(test_elementwise_by_geometry),
      cmocka_unit_test(test_published_formats),
      cmocka_unit_test(test_fused_gate_up_expert),
      cmocka_unit_test(test_mla_attention),
      cmocka_unit_test(test_attention_repeat_kv),
      cmocka_unit_test(test_attention_append_in_kernel),
      cmocka_unit_test(test_attention_fa2_waves),
      cmocka_unit_test(test_cpu_kv_upcast),
      cmocka_unit_test(test_kv_full_window),
      cmocka_unit_test(test_cpu_fresh_alloc),
      cmocka_unit_test(test_unfused_framework),
      cmocka_unit_test(test_quantized_embed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
