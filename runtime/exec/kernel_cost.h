/* Internal pieces of the cost-model view of a kernel (runtime/exec/kernel_cost.c) that the
 * simulator prices runtimes with. */
#ifndef FERRY_RUNTIME_EXEC_KERNEL_COST_H
#define FERRY_RUNTIME_EXEC_KERNEL_COST_H

#include <stdint.h>

#include "ferry/exec.h"

/* Keys an attention kernel's sequences see in all this step: each sequence's context once (from
 * the first key its window or chunk lets its first query of the step see), however many of its
 * queries the step carries. The K and V an unfused attention reads per sequence
 * (ferry_kernel_cost() counts a flash-style kernel's reads per tile of queries instead). */
uint64_t ferry__attention_seq_keys(const struct ferry_kernel *k);

/* Bytes of one cached chunk of n elements (a head's K or V, or a latent row): in the cache's
 * format when quantized (codes and group scales), else its element type. */
uint64_t ferry__kv_bytes(const struct ferry_kernel *k, uint64_t n);

/* Whether activation fn is gated: it reads a gate and an up row and writes the product into the
 * kernel's y (SwiGLU's silu_mul, GeGLU's gelu_tanh_mul); the others rewrite x in place. */
int ferry__act_is_gated(enum ferry_act_fn fn);

#endif
