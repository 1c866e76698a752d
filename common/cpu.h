/* CPU feature checks for the x86 fast paths, spelled so gcc and clang both compile them
 * (clang before 16 has no "f16c" for __builtin_cpu_supports: ask CPUID directly). */
#ifndef FERRY_COMMON_CPU_H
#define FERRY_COMMON_CPU_H

#if defined(__x86_64__)
#include <cpuid.h>
#include <stdatomic.h>

/* AVX with the F16C half-precision conversions (the 8-wide fp16 <-> fp32 paths need both).
 * Asked once: CPUID serialises the processor and, in a virtual machine, exits to the
 * hypervisor (microseconds), and the host executor converts rows thousands of times a step. */
static inline int ferry__cpu_avx_f16c(void) {
  static _Atomic int known; /* 0: not asked yet; 1: no; 2: yes */
  int k = atomic_load_explicit(&known, memory_order_relaxed);
  if (!k) {
    unsigned a, b, c, d;
    k = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 2 : 1;
    atomic_store_explicit(&known, k, memory_order_relaxed);
  }
  return k == 2;
}
#endif /* __x86_64__ */

#endif
