/* The GPU cost model: from one of the engine's kernels to the work a GPU inference runtime
 * does for it (sim/gpu_cost.h), and from that work to a duration on a profile's GPU. The
 * engine's kernels are those of the host executor (fp32 activations, a separate DEQUANTIZE
 * op before a product on a quantized weight); a GPU runtime fuses or expands the low-bit
 * weights and runs the products on tensor cores in the weights' precision, and that is what
 * is priced here. */
#include <math.h>

#include "ferry/quant.h"
#include "runtime/exec/kernel_cost.h"
#include "sim/gpu_cost.h"
#include "sim/hw_internal.h"
#include "sim/resource.h"

/* CUDA-core instructions per weight element to turn a stored element into an fp16 operand.
 * Packed 32-bit words are unpacked two lanes at a time (half2): int8 and int4 take a byte
 * permute or a lop3 mask-and-shift, one half2 subtract of the zero point and one half2
 * multiply by the scale per pair, plus their share of the word load (Marlin, AWQ and the
 * llama.cpp kernels work this way): about 1.5 per element; int3 and int2 straddle bytes and
 * need more shifting; NF4 looks its code up in a 16-entry table and scales by a
 * double-quantized absmax. 16-bit formats are read as they are. The published 4-bit formats
 * (GPTQ, AWQ, compressed-tensors) are int4 in other packing orders, read by the same Marlin /
 * AWQ kernels; MXFP4's e2m1 pairs take the same mask-and-shift to half2 and a multiply by
 * their power-of-two block scale (no zero point); block-scaled fp8 converts two elements per
 * instruction (cvt.f16x2.e4m3x2) and is scaled per 128 x 128 block on the accumulators. */
static double unpack_instr_per_elem(int32_t qformat) {
  switch ((enum ferry_qformat)qformat) {
    case FERRY_QFORMAT_INT8:
    case FERRY_QFORMAT_INT4:
    case FERRY_QFORMAT_GPTQ4:
    case FERRY_QFORMAT_AWQ4:
    case FERRY_QFORMAT_CT4:
    case FERRY_QFORMAT_CT4F16:
    case FERRY_QFORMAT_MXFP4: return 1.5;
    case FERRY_QFORMAT_INT3:
    case FERRY_QFORMAT_INT2: return 2.0;
    case FERRY_QFORMAT_NF4: return 2.5;
    case FERRY_QFORMAT_FP8B: return 0.5;
    default: return 0; /* fp32, fp16, bf16 */
  }
}

static int is_16bit(int32_t qformat) { return qformat == FERRY_QFORMAT_FP16 || qformat == FERRY_QFORMAT_BF16; }

/* Rows of the activation a fused low-bit GEMM multiplies per unpacking of a weight tile: each
 * block of output rows unpacks the weight tiles it needs again (Marlin's and CUTLASS's M tile). */
#define FUSED_M_TILE 128

static uint64_t esize(enum ferry_dtype d) {
  size_t s = ferry_dtype_size(d);
  return s ? s : 4;
}

/* A weight the engine reads as an expanded fp32 copy (`ref`, `elems` of them) is, on a GPU
 * runtime, the packed one behind it: read packed and unpacked on the CUDA cores once per tile of
 * `m` activation rows (fused kernels), or read as the fp16 copy a dequantize kernel wrote. The
 * element type the product then runs in: bf16 for bf16 weights; fp8 for block-scaled fp8 read
 * by fused kernels (fp8 tensor cores, the fp16 peak where a GPU has none); else fp16. */
static enum ferry_dtype charge_packed(struct ferry__gpu_work *out, const struct ferry_ref *ref, double elems,
                                      const struct ferry__packed *p, int fused, int64_t m) {
  out->bytes -= elems * (double)esize(ref->dtype); /* the expanded copy the engine reads */
  if (is_16bit(p->qformat) || fused) {
    out->bytes += (double)p->bytes;
    const double tiles = ceil((double)(m > 0 ? m : 1) / FUSED_M_TILE);
    out->alu_ops += p->elems * unpack_instr_per_elem(p->qformat) * tiles;
    if (p->qformat == FERRY_QFORMAT_FP8B) return FERRY_DTYPE_F8_E4M3;
  } else {
    out->bytes += elems * 2; /* fp16 weights the dequantize kernel wrote */
  }
  return p->qformat == FERRY_QFORMAT_BF16 ? FERRY_DTYPE_BF16 : FERRY_DTYPE_F16;
}

/* Whether attention kernel k reads a quantized KV cache. */
static int kv_quantized(const struct ferry_kernel *k) {
  return k->kv_format > 0 && ferry_kv_format_group((enum ferry_kv_format)k->kv_format) > 0;
}

/* The type attention's math runs in: the cache's, or fp16 for a quantized cache (its codes are
 * scaled to fp16 as they are read, as vLLM's fp8 and KIVI's int4 kernels do). */
static enum ferry_dtype kv_math(const struct ferry_kernel *k) {
  if (kv_quantized(k)) return FERRY_DTYPE_F16;
  return k->aux[2].dtype;
}

/* A decode step's attention: every token of the batch is its sequence's only query (tokens of
 * one sequence are consecutive, so a token of the same slot as its predecessor is a prefill). */
static int attention_is_decode(const struct ferry_kernel *k) {
  if (k->m <= 1) return 1;
  if (!k->ints2 || k->n_ints < k->m) return 0;
  for (int64_t i = 1; i < k->m; i++)
    if (k->ints2[i] == k->ints2[i - 1]) return 0;
  return 1;
}

/* Kernels a GPU runtime runs for the engine's attention op, which appends the new K and V to the
 * cache itself: the runtimes write them with a kernel of their own before the attention kernel
 * (vLLM's reshape_and_cache_flash before flash_attn_varlen_func / flash_attn_with_kvcache;
 * llama.cpp's ggml_cpy of K and V into the cache views; HF transformers' DynamicCache.update),
 * and a decode step's attention is split along the keys (flash-decoding: FlashAttention-2's
 * flash_fwd_splitkv_kernel, FlashMLA, FlashInfer's split-k decode) with a second kernel that
 * combines the splits' partial softmax results (FlashAttention-2 csrc/flash_attn/src/
 * flash_fwd_launch_template.h, run_mha_fwd_splitkv_dispatch: flash_fwd_splitkv_combine_kernel).
 * FlashAttention-2 skips the split when the batch's heads alone fill the GPU, which a profile
 * without an SM count cannot tell: the combine is charged to every decode step (one fixed
 * kernel time, small beside a batch that large). */
static int attention_launches(const struct ferry_kernel *k) { return 2 + attention_is_decode(k); }

/* The launch geometry GPU runtimes give the element-wise kernels around the products, after
 * vLLM's kernels (csrc/layernorm_kernels.cu, pos_encoding_kernels.cu, activation_kernels.cu;
 * SGLang, sarathi-serve and Vidur's profiler run the same ones): one thread block per token,
 * each thread walking its row with a stride of the block's width, one element per load.
 * RMSNorm: block min(n, 1024), two passes over the row (the sum of squares, then the scaled
 * write: 2 ceil(n / block) steps). RoPE: block min(heads x rot / 2, 512), one step per pair of
 * elements of the queries' heads, then of the keys'. A gated activation (silu(gate) x up):
 * block min(n, 1024), one step per ceil(n / block). A plain activation is PyTorch's
 * vectorized grid over every element (FERRY_GEOM_GRID). Each step waits for its loads: the
 * chain of steps, not the bytes, is what a small batch costs (Llama-2-70B's SiLU-and-mul, 28
 * steps, takes 22 us on an A100 at 1 to 16 tokens for 172 KB). Elements: read and written once
 * (the norm's second pass finds its row in L1), RoPE's cos/sin rows are L2 hits. */
static void elementwise_geometry(const struct ferry_kernel *k, struct ferry__gpu_work *out) {
  const int64_t m = k->m > 0 ? k->m : 0, n = k->n > 0 ? k->n : 0;
  if (m == 0) return;
  switch (k->kind) {
    case FERRY_K_NORM: {
      if (n == 0) return;
      const int64_t block = n < 1024 ? n : 1024;
      out->geometry = FERRY_GEOM_ROW_BLOCKS;
      out->block_threads = (int32_t)block;
      out->block_steps = 2.0 * (double)((n - 1) / block + 1);
      out->act_elems = 2.0 * (double)m * (double)n;
      out->fixed_bytes = (double)n * (double)esize(k->w.dtype);
      break;
    }
    case FERRY_K_ROPE: {
      const int64_t rot = k->rot_dim > 0 ? k->rot_dim : k->head_dim;
      const double q_pairs = (double)(k->heads > 0 ? k->heads : 0) * (double)(rot / 2),
                   k_pairs = (double)(k->kv_heads > 0 ? k->kv_heads : 0) * (double)(rot / 2);
      if (!(q_pairs >= 1)) return;
      const double block = q_pairs < 512 ? q_pairs : 512;
      out->geometry = FERRY_GEOM_ROW_BLOCKS;
      out->block_threads = (int32_t)block;
      out->block_steps = ceil(q_pairs / block) + ceil(k_pairs / block);
      out->act_elems = 4.0 * (double)m * (q_pairs + k_pairs); /* each pair read and written */
      break;
    }
    case FERRY_K_SWIGLU: {
      if (n == 0) return;
      const int gated = ferry__act_is_gated(k->fn);
      out->act_elems = (double)m * (double)n * (gated ? 3 : 2);
      if (!gated) {
        out->geometry = FERRY_GEOM_GRID;
        break;
      }
      const int64_t block = n < 1024 ? n : 1024;
      out->geometry = FERRY_GEOM_ROW_BLOCKS;
      out->block_threads = (int32_t)block;
      out->block_steps = (double)((n - 1) / block + 1);
      break;
    }
    default:
      break;
  }
  out->blocks = out->geometry == FERRY_GEOM_ROW_BLOCKS ? m : 0;
}

void ferry__gpu_work_of(const struct ferry_kernel *k, const struct ferry__packed *const packed[3], int fused,
                        struct ferry__gpu_work *out) {
  double flops;
  uint64_t bytes;
  ferry_kernel_cost(k, &flops, &bytes);
  out->flops = flops;
  out->bytes = (double)bytes;
  out->alu_ops = 0;
  out->rows = 0;
  out->qformat = 0;
  out->folded = 0;
  out->launches = 1;
  out->ops = 0;
  out->math = FERRY_DTYPE_F32;
  out->op = FERRY_HW_OP_ELEMENTWISE;
  out->geometry = FERRY_GEOM_NONE;
  out->blocks = 0, out->block_threads = 0, out->block_steps = 0;
  out->act_elems = out->fixed_bytes = 0;
  switch (k->kind) {
    case FERRY_K_MATMUL:
    case FERRY_K_EXPERT: {
      out->op = FERRY_HW_OP_GEMM;
      out->math = k->w.dtype;
      out->rows = k->m;
      const struct ferry_ref *refs[3] = {&k->w, &k->aux[0], &k->aux[1]};
      const int n_w = k->kind == FERRY_K_EXPERT ? 3 : 1;
      for (int i = 0; i < n_w; i++) {
        const struct ferry__packed *p = packed ? packed[i] : NULL;
        /* each weight's own element count: a fused gate_up weight is twice the down one */
        if (!p) continue;
        out->math = charge_packed(out, refs[i], p->elems, p, fused, k->m);
        out->qformat = p->qformat;
      }
      break;
    }
    case FERRY_K_ATTENTION:
      out->op = FERRY_HW_OP_ATTENTION;
      out->math = kv_math(k); /* the KV cache's type: fp16/bf16 on tensor cores */
      out->launches = attention_launches(k);
      break;
    case FERRY_K_MLA_ATTENTION:
      /* a flash-style kernel over the latent cache (FlashMLA), with the absorbed kv_b_proj
       * weight read once per step: packed when it is stored quantized */
      out->op = FERRY_HW_OP_ATTENTION;
      out->math = kv_math(k);
      out->launches = attention_launches(k);
      if (packed && packed[0]) charge_packed(out, &k->w, packed[0]->elems, packed[0], fused, k->m);
      break;
    case FERRY_K_EMBED:
      /* fused: a quantized table is read by the rows the tokens gather, not expanded whole;
       * else the rows of the fp16 copy a dequantize kernel wrote */
      if (packed && packed[0] && packed[0]->elems > 0) {
        const struct ferry__packed *p = packed[0];
        const double elems = (double)k->m * (double)k->n;
        out->bytes -= elems * (double)esize(k->w.dtype);
        out->bytes += elems * (is_16bit(p->qformat) || fused ? (double)p->bytes / p->elems : 2.0);
      }
      break;
    case FERRY_K_DEQUANTIZE:
      out->op = FERRY_HW_OP_DEQUANTIZE;
      if (fused || is_16bit(k->qformat)) {
        out->folded = 1; /* read packed by its consumer */
        out->flops = out->bytes = 0;
      } else {
        const double elems = (double)k->n * (double)k->k;
        out->flops = 0;
        out->bytes = (double)k->m + elems * 2; /* packed in, fp16 out */
        out->alu_ops = elems * unpack_instr_per_elem(k->qformat);
      }
      break;
    case FERRY_K_NORM:
    case FERRY_K_ROPE:
    case FERRY_K_SWIGLU:
      elementwise_geometry(k, out);
      break;
    default: /* embed, router top-k, combine, gather: priced by bytes */
      break;
  }
}

static double peak_for(const struct ferry_hw_peak_tflops *p, enum ferry_dtype dtype) {
  double fp16 = p->fp16 > 0 ? p->fp16 : p->fp32;
  switch (dtype) {
    case FERRY_DTYPE_F16: return fp16;
    case FERRY_DTYPE_BF16: return p->bf16 > 0 ? p->bf16 : fp16;
    case FERRY_DTYPE_I8:
    case FERRY_DTYPE_U8: return p->int8 > 0 ? p->int8 : fp16;
    case FERRY_DTYPE_F8_E4M3:
    case FERRY_DTYPE_F8_E5M2: return p->fp8 > 0 ? p->fp8 : fp16;
    default: return p->fp32;
  }
}

/* Work of a framework that dequantizes with separate ops (FlexGen's decompress: shifts, masks,
 * strided copies into an fp16 tensor, a divide and an add, each a pass over device memory). */
static void unfused_dequant_work(const struct ferry_hw_runtime *r, const struct ferry_kernel *k,
                                 struct ferry__gpu_work *work) {
  if (work->folded || !(r->dequant_pass_bytes > 0 || r->dequant_kernels > 1)) return;
  const double elems = (double)k->n * (double)k->k;
  if (r->dequant_pass_bytes > 0) work->bytes += elems * (r->dequant_pass_bytes - 2); /* beyond the fp16 write */
  if (r->dequant_kernels > 1) { /* PyTorch element-wise kernels, not one dequantize kernel */
    work->op = FERRY_HW_OP_ELEMENTWISE;
    work->launches += r->dequant_kernels - 1;
    work->ops += r->dequant_kernels - 1;
  }
}

/* Keys a decode step's attention covers beyond those its sequences have written, for a runtime
 * that works over each sequence's whole preallocated cache (runtime.kv_full_window): the slot's
 * kv_capacity keys less the p + 1 a token at position p has. A ring or a windowed or chunked
 * cache holds only what its queries see; a kernel without positions cannot tell (0). */
static double full_window_extra_keys(const struct ferry_hw_runtime *r, const struct ferry_kernel *k) {
  if (!r->kv_full_window || k->kv_capacity <= 0 || k->kv_ring || k->sliding_window > 0 || k->attn_chunk > 0 ||
      !k->ints || k->n_ints < k->m || !attention_is_decode(k))
    return 0;
  double extra = 0;
  for (int64_t i = 0; i < k->m; i++) {
    const int64_t keys = (int64_t)k->ints[i] + 1;
    if (keys < k->kv_capacity) extra += (double)(k->kv_capacity - keys);
  }
  return extra;
}

/* FlashAttention-2's split-KV kernel, which flash_attn_with_kvcache always runs: 128 threads, tiles
 * of 64 queries by 256, 128 or 64 keys for head dims up to 64, up to 128, and more, Q, K and V
 * tiles in shared memory (csrc/flash_attn/src/flash_fwd_launch_template.h,
 * run_mha_fwd_splitkv_dispatch; kernel_traits.h). */
#define FA2_SPLITKV_Q_TILE 64
#define FA2_SPLITKV_THREADS 128
#define FA2_MAX_SPLITS 128
static int64_t fa2_splitkv_key_tile(int64_t head_dim) { return head_dim <= 64 ? 256 : head_dim <= 128 ? 128 : 64; }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The splits of the keys FlashAttention-2 launches a call's `blocks` thread blocks with
 * (csrc/flash_attn/flash_api.cpp, num_splits_heuristic, v2.5.0-v2.5.6, over the SM count; v2.5.7
 * on passes twice it): one split when the blocks nearly fill the SMs, else the fewest splits
 * (each a different number of key tiles) whose waves come within 85 % of the best's. */
static int64_t fa2_num_splits(int64_t blocks, int64_t sms, int64_t key_tiles) {
  if ((double)blocks >= 0.8 * (double)sms) return 1;
  int64_t max_splits = FA2_MAX_SPLITS;
  if (sms < max_splits) max_splits = sms;
  if (key_tiles < max_splits) max_splits = key_tiles;
  double eff[FA2_MAX_SPLITS] = {0}, best = 0;
  for (int64_t n = 1; n <= max_splits; n++) {
    if (n > 1 && ceil_div(key_tiles, n) == ceil_div(key_tiles, n - 1)) continue; /* the same as n - 1 */
    const double waves = (double)(blocks * n) / (double)sms;
    eff[n - 1] = waves / ceil(waves);
    if (eff[n - 1] > best) best = eff[n - 1];
  }
  for (int64_t n = 1; n <= max_splits; n++)
    if (eff[n - 1] > 0 && eff[n - 1] >= 0.85 * best) return n;
  return 1;
}

/* Thread blocks of `block_threads` threads and `block_smem` bytes of shared memory (plus what
 * the driver reserves per block) one SM of the profile's GPU holds at once: its thread, block
 * and shared-memory limits (ferry_hw_gpu_residency(), ferry__hw_gpu_shared_memory()); 0 when the
 * profile gives no SM count or a capability ferry does not know, or when no such block fits. */
static int64_t sm_resident_blocks(const struct ferry_hw_gpu *g, int64_t block_threads, int64_t block_smem) {
  int32_t threads = 0, blocks = 0;
  int64_t smem = 0, reserved = 0;
  if (g->sm_count <= 0 || block_threads <= 0 || ferry_hw_gpu_residency(g->compute_capability, &threads, &blocks) != 0 ||
      ferry__hw_gpu_shared_memory(g->compute_capability, &smem, &reserved) != 0)
    return 0;
  int64_t n = threads / block_threads;
  if (n > blocks) n = blocks;
  if (block_smem > 0 && n > smem / (block_smem + reserved)) n = smem / (block_smem + reserved);
  return n;
}

/* The split-KV kernel's thread blocks one SM holds: its Q, K and V tiles of fp16 in shared memory. */
static int64_t fa2_blocks_per_sm(const struct ferry_hw_gpu *g, int64_t head_dim) {
  return sm_resident_blocks(g, FA2_SPLITKV_THREADS,
                            (FA2_SPLITKV_Q_TILE + 2 * fa2_splitkv_key_tile(head_dim)) * head_dim * 2);
}

/* How much longer a call's math takes than the whole GPU's rate says: its blocks (after the
 * splits) run in waves of the blocks the SMs hold at once, and a last, partial wave leaves SMs
 * idle: ceil(waves) / waves. */
static double fa2_wave_factor(int64_t blocks, int64_t slots) {
  if (blocks <= 0 || slots <= 0) return 1;
  const double waves = (double)blocks / (double)slots;
  return ceil(waves) / waves;
}

/* Keys the queries at positions c + 1 .. c + n (counted from 1) see in all, each at most a
 * window of w (0: no window). */
static double visible_keys(int64_t c, int64_t n, int64_t w) {
  const double a = (double)c + 1, b = (double)(c + n);
  if (w <= 0 || b <= (double)w) return (a + b) * (double)n / 2;
  if (a > (double)w) return (double)w * (double)n;
  return ((double)w + a) * ((double)w - a + 1) / 2 + (double)w * (b - (double)w);
}

/* What FlashAttention-2's flash_attn_with_kvcache given the step's new K and V does beyond the
 * attention (runtime.attn_fa2_kvcache), per call: Sarathi-Serve calls it once per prefill chunk
 * (batch 1) and once for the batch's decode tokens.
 * - Copies: each thread block, one tile of queries of one query head, first copies the step's new
 *   rows from the cache's old end up to the end of the last key tile its causal mask reaches, then
 *   attends (flash_fwd_kernel.h, compute_attn_1rowblock_splitkv with Append_KV: copy_w_min_idx
 *   from n_block_max - 1 down to seqlen_k_cache / kBlockN, rows from seqlen_k_cache to seqlen_k).
 *   A sequence's n new tokens from position c: tile t copies min(ceil((c + min(64 (t + 1), n)) /
 *   key_tile) key_tile, c + n) - c rows, once per query head; a decode call of grouped-query
 *   attention runs the group's query heads as the queries of one block per KV head
 *   (mha_fwd_kvcache, seqlenq_ngroups_swapped: one query, more query than KV heads, no window).
 * - Waves: a call's blocks (query tiles x heads, x its splits) run in waves of the blocks the SMs
 *   hold (fa2_blocks_per_sm); its math takes fa2_wave_factor() of the roofline's time. `waved`
 *   is the step's flops weighted so, `flops` unweighted (only on a profile that gives the SM
 *   count and compute capability; else both 0).
 * Without positions the m tokens are one sequence from position 0. */
struct fa2_call_work {
  double rows_copied, flops, waved;
};

static void fa2_kvcache_work(const struct ferry_hw_gpu *g, const struct ferry_kernel *k, struct fa2_call_work *out) {
  const int64_t key_tile = fa2_splitkv_key_tile(k->head_dim), w = k->sliding_window;
  const int positions = k->ints && k->ints2 && k->n_ints >= k->m;
  const int gqa_swap = k->kv_heads > 0 && k->heads > k->kv_heads && w <= 0;
  const int64_t per_sm = fa2_blocks_per_sm(g, k->head_dim), slots = per_sm * g->sm_count;
  const double flops_per_key = 4.0 * (double)k->heads * (double)k->head_dim;
  int64_t decode_seqs = 0, decode_max_keys = 0;
  double decode_keys = 0;
  *out = (struct fa2_call_work){0};
  for (int64_t i = 0; i < k->m;) {
    int64_t j = i + 1;
    if (positions)
      while (j < k->m && k->ints2[j] == k->ints2[i] && k->ints[j] == k->ints[j - 1] + 1) j++;
    else
      j = k->m;
    const int64_t c = positions ? k->ints[i] : 0, n = j - i;
    const double blocks_per_tile = (double)(n == 1 && gqa_swap ? k->kv_heads : k->heads);
    for (int64_t q_end = FA2_SPLITKV_Q_TILE;; q_end += FA2_SPLITKV_Q_TILE) {
      const int64_t reach = ceil_div(c + (q_end < n ? q_end : n), key_tile) * key_tile;
      out->rows_copied += blocks_per_tile * (double)((reach < c + n ? reach : c + n) - c);
      if (q_end >= n) break;
    }
    if (n == 1) { /* one call for the step's decode tokens */
      decode_seqs++, decode_keys += visible_keys(c, 1, w);
      if (c + 1 > decode_max_keys) decode_max_keys = c + 1;
    } else if (slots > 0) {
      const int64_t blocks = k->heads * ceil_div(n, FA2_SPLITKV_Q_TILE);
      const int64_t splits = fa2_num_splits(blocks, g->sm_count, ceil_div(c + n, key_tile));
      const double flops = flops_per_key * visible_keys(c, n, w);
      out->flops += flops, out->waved += flops * fa2_wave_factor(blocks * splits, slots);
    }
    i = j;
  }
  if (decode_seqs > 0 && slots > 0) {
    const int64_t blocks = decode_seqs * (gqa_swap ? k->kv_heads : k->heads);
    const int64_t splits = fa2_num_splits(blocks, g->sm_count, ceil_div(decode_max_keys, key_tile));
    const double flops = flops_per_key * decode_keys;
    out->flops += flops, out->waved += flops * fa2_wave_factor(blocks * splits, slots);
  }
}

/* flash_attn_with_kvcache in place of an append kernel and an attention kernel: the copies'
 * reads and writes, and the math stretched by its waves. The copy is a phase of its own in every
 * thread block (the copies, a barrier, then the attention reading back what was written), so it
 * keeps the fixed time (gpu.launch_overhead_ns) ferry charges the append kernel of the other
 * runtimes: the kernel count stays. What the fusion saves, the host's launch of a second kernel,
 * is not GPU time. */
static void fa2_kvcache_charge(const struct ferry_hw_gpu *g, const struct ferry_kernel *k, struct ferry__gpu_work *work) {
  struct fa2_call_work c;
  fa2_kvcache_work(g, k, &c);
  const double row_bytes = (double)ferry__kv_bytes(k, (uint64_t)k->head_dim);
  work->bytes += c.rows_copied * 2 /* K and V */ * row_bytes * 2 /* read, write */;
  if (c.flops > 0) work->flops *= c.waved / c.flops;
}

/* What a framework does around an attention over its cache beyond the kernel itself (GPU only). */
static void attention_frame_work(const struct ferry_hw_runtime *r, const struct ferry_kernel *k,
                                 struct ferry__gpu_work *work) {
  if (!kv_quantized(k)) return;
  const double hd = (double)k->head_dim, kv_elems = (double)k->kv_heads * 2 * hd; /* K and V of one key */
  const double row = (double)ferry_kv_format_row_bytes((enum ferry_kv_format)k->kv_format, (uint64_t)k->head_dim);
  if (r->kv_expand && attention_is_decode(k)) {
    /* the cache expanded to fp16 as a weight is (the packed rows read, the passes' bytes), the
     * whole slot with kv_full_window; then attention reads the fp16 copy of the keys written
     * instead of their packed rows */
    const double pass = r->dequant_pass_bytes > 0 ? r->dequant_pass_bytes : 2;
    const double kv_rows = (double)ferry__attention_seq_keys(k) * (double)k->kv_heads * 2;
    const double expanded_rows = kv_rows + full_window_extra_keys(r, k) * (double)k->kv_heads * 2;
    work->bytes += expanded_rows * (row + hd * pass) + kv_rows * (hd * 2 - row);
    const int n = r->dequant_kernels > 0 ? r->dequant_kernels : 1;
    work->launches += 2 * n, work->ops += 2 * n;
  }
  if (r->kv_quant_bytes > 0) { /* every new K and V element quantized by separate ops */
    work->bytes += (double)k->m * kv_elems * r->kv_quant_bytes;
    work->launches += 2 * r->kv_quant_kernels, work->ops += 2 * r->kv_quant_kernels;
  }
}

/* The largest mmap threshold glibc's malloc sets itself (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit:
 * 4 MiB x sizeof(long), malloc/malloc.c): the threshold starts at 128 KiB and rises to the size
 * of an mmapped chunk freed below this bound (_int_free's dynamic adjustment), so a request of at
 * least this many bytes always gets a fresh mmap from sysmalloc (and free munmaps it); a smaller
 * one may come from the heap, depending on what the process freed before, and is not charged. */
#define GLIBC_MMAP_THRESHOLD_MAX_BYTES (4.0 * 1024 * 1024 * 8)

/* Bytes the kernel writes to hand over `tensors` fresh temporaries of `tensor_bytes` each
 * (runtime.cpu_fresh_alloc: PyTorch's CPU allocator, c10 alloc_cpu, is posix_memalign with no
 * cache, so a temporary over the threshold is a fresh anonymous mapping; Linux's
 * do_anonymous_page zeroes every page it hands over on the first write, clear_user_highpage),
 * written once more at the host's memory rate before the op writes them. The faults' own cost
 * (one per 4 KiB page, or per 2 MiB with transparent huge pages) has no sourced figure and is
 * left out. */
static double fresh_zeroing_bytes(const struct ferry_hw_runtime *r, int cpu, double tensor_bytes, int tensors) {
  if (!cpu || !r->cpu_fresh_alloc || tensor_bytes < GLIBC_MMAP_THRESHOLD_MAX_BYTES) return 0;
  return tensors * tensor_bytes;
}

void ferry__runtime_work(const struct ferry_hw_profile *profile, const struct ferry_kernel *k, int cpu,
                         struct ferry__gpu_work *work) {
  if (!profile || !profile->has_runtime) return;
  const struct ferry_hw_runtime *r = &profile->runtime;
  if (!cpu && k->kind == FERRY_K_DEQUANTIZE) unfused_dequant_work(r, k, work);
  if (!cpu && k->kind == FERRY_K_ATTENTION) attention_frame_work(r, k, work);
  if (!cpu && k->kind == FERRY_K_ATTENTION && r->attn_fa2_kvcache) fa2_kvcache_charge(&profile->gpu, k, work);
  if (k->kind != FERRY_K_ATTENTION) return;
  double rows = (double)ferry__attention_seq_keys(k) * (double)k->kv_heads * 2; /* K and V */
  if (!r->kv_expand) {
    /* products over the whole slot, masked: its unwritten keys read (and multiplied) too, and
     * the copies below made of all of it */
    const double extra = full_window_extra_keys(r, k);
    work->bytes += extra * (double)k->kv_heads * 2 * (double)ferry__kv_bytes(k, (uint64_t)k->head_dim);
    work->flops += 4.0 * extra * (double)k->heads * (double)k->head_dim;
    rows += extra * (double)k->kv_heads * 2;
  }
  double elem = (double)esize(kv_math(k));
  if (cpu && r->cpu_kv_upcast && !kv_quantized(k) && k->aux[2].dtype != FERRY_DTYPE_F32) {
    /* key_layer.float(), value_layer.float(): every key's K and V written as fp32 and the
     * products read that copy; the cache's own read is the kernel's. Two new tensors, K's and
     * V's, each half the copy */
    const double copy = rows * (double)k->head_dim * 4.0;
    work->bytes += copy * 2 + fresh_zeroing_bytes(r, cpu, copy / 2, 2);
    elem = 4.0;
  }
  if (!r->attn_repeat_kv || k->kv_heads <= 0 || k->heads <= k->kv_heads) return;
  /* expand(...).reshape(...) copies each sequence's cached K and V once per query head of
   * their group, in the type the products read; the products then read that copy: one new
   * tensor for K and one for V */
  const double n_rep = (double)k->heads / (double)k->kv_heads;
  const double copy = n_rep * rows * (double)k->head_dim * elem;
  work->bytes += 2.0 * copy + fresh_zeroing_bytes(r, cpu, copy / 2, 2);
}

static double eff(double v) { return v > 0 && v <= 1 ? v : 1.0; }

/* One dependent round trip to device memory, in SM clock cycles, under the load these kernels
 * put on it. An idle global-memory load takes about 400 cycles on V100, A100 and H100 alike
 * (PMC10448217, Table 3, "Hardware features of different Nvidia GPU architectures": 400 clock
 * cycles for each); loaded, a little more. 450 is what D6's A100 element-wise kernel times
 * (Vidur, 1 to 32768 tokens) fit best, the A100 being the only GPU used to choose it; the H100
 * and A40 sets check it (docs/validation.md). */
#define DRAM_ROUND_TRIP_CYCLES 450.0

/* The device time of a kernel whose work is nil: launch, one wave's scheduling and the drain.
 * The shortest kernels D6 measured on the A100 (a GELU over 10240 elements at one token) take
 * 2 us; gpu.launch_overhead_ns (5 us by default) also holds a GEMM's pipeline fill and a decode
 * loop's gap between kernels, and caps it. */
#define KERNEL_FLOOR_NS 2000

/* Whether the profile says enough about its GPU to time a kernel by its launch geometry. */
static int geometry_known(const struct ferry_hw_gpu *g) {
  return g->sm_count > 0 && g->clock_mhz > 0 && ferry_hw_gpu_residency(g->compute_capability, NULL, NULL) == 0;
}

/* An element-wise kernel timed by its launch geometry: its activations at the runtime's
 * activation size streamed at the element-wise efficiency (t_mem) and, for one block per token,
 * the chain of dependent loads each block makes (t_chain: waves of blocks the SMs hold at once x
 * steps x one round trip), combined as the roofline's other terms are, after the kernel floor. */
static int64_t geometry_ns(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w) {
  const struct ferry_hw_gpu *g = &profile->gpu;
  uint32_t act_bytes = 2;
  ferry_hw_profile_elem_bytes(profile, &act_bytes, NULL);
  const double bytes = w->act_elems * act_bytes + w->fixed_bytes;
  const double t_mem = bytes / (g->mem_bw_gbps * eff(g->efficiency.elementwise));
  double t_chain = 0;
  if (w->geometry == FERRY_GEOM_ROW_BLOCKS && w->blocks > 0 && w->block_threads > 0) {
    int64_t resident = sm_resident_blocks(g, w->block_threads, 0);
    if (resident < 1) resident = 1;
    const double waves = ceil((double)w->blocks / (double)(resident * g->sm_count));
    t_chain = waves * w->block_steps * DRAM_ROUND_TRIP_CYCLES / (g->clock_mhz * 1e-3);
  }
  const int64_t launch = g->launch_overhead_ns > 0 ? g->launch_overhead_ns : 0;
  return (launch < KERNEL_FLOOR_NS ? launch : KERNEL_FLOOR_NS) + ferry__ceil_ns(sqrt(t_chain * t_chain + t_mem * t_mem));
}

int64_t ferry__gpu_work_ns(const struct ferry_hw_profile *profile, const struct ferry__gpu_work *w) {
  if (!profile || !profile->has_gpu || !(w->flops >= 0) || !(w->bytes >= 0) || !(w->alu_ops >= 0)) return -1;
  if (w->folded) return 0;
  const struct ferry_hw_gpu *g = &profile->gpu;
  const struct ferry_hw_efficiency *e = &g->efficiency;
  if (w->geometry != FERRY_GEOM_NONE && w->launches <= 1 && g->mem_bw_gbps > 0 && w->act_elems >= 0 &&
      w->fixed_bytes >= 0 && geometry_known(g))
    return geometry_ns(profile, w);
  double e_math, e_mem;
  switch (w->op) {
    case FERRY_HW_OP_GEMM: e_math = e->gemm, e_mem = e->gemv; break;
    case FERRY_HW_OP_GEMV: e_math = e_mem = e->gemv; break;
    case FERRY_HW_OP_ATTENTION: e_math = e->attention, e_mem = e->gemv; break;
    case FERRY_HW_OP_DEQUANTIZE: e_math = e_mem = e->dequantize; break;
    default: e_math = e_mem = e->elementwise; break;
  }
  double t_math = 0, t_alu = 0, t_mem = 0;
  if (w->flops > 0) {
    double peak = peak_for(&g->peak_tflops, w->math); /* TFLOP/s = 1e3 flop/ns */
    if (!(peak > 0)) return -1;
    t_math = w->flops / (peak * 1e3 * eff(e_math));
  }
  if (w->alu_ops > 0) {
    if (!(g->peak_tflops.fp32 > 0)) return -1;
    t_alu = w->alu_ops / (g->peak_tflops.fp32 * 1e3 / 2 * eff(e->dequantize));
  }
  if (w->bytes > 0) {
    if (!(g->mem_bw_gbps > 0)) return -1; /* GB/s = bytes/ns */
    t_mem = w->bytes / (g->mem_bw_gbps * eff(e_mem));
  }
  const double t_sm = t_math + t_alu;
  const double t = t_sm == 0 ? t_mem : t_mem == 0 ? t_sm : sqrt(t_sm * t_sm + t_mem * t_mem);
  const int64_t launch = g->launch_overhead_ns > 0 ? g->launch_overhead_ns : 0;
  return (w->launches > 1 ? w->launches : 1) * launch + ferry__ceil_ns(t);
}

int64_t ferry__hw_compute_ns(const struct ferry_hw_profile *profile, enum ferry_hw_op op, double flops,
                             double bytes, enum ferry_dtype dtype) {
  const struct ferry__gpu_work w = {.op = op, .math = dtype, .flops = flops, .bytes = bytes};
  return ferry__gpu_work_ns(profile, &w);
}
