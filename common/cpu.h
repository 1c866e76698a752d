/* CPU feature checks for the x86 fast paths, spelled so gcc and clang both compile them
 * (clang before 16 has no "f16c" for __builtin_cpu_supports: ask CPUID directly). */
#ifndef FERRY_COMMON_CPU_H
#define FERRY_COMMON_CPU_H

#if defined(__x86_64__)
#include <cpuid.h>
#include <stdatomic.h>

/* AVX with the F16C half-precision conversions (the 8-wide fp16 <-> fp32 paths need both).
 * Asked of the CPU once per process: CPUID traps to the hypervisor in a virtual machine (tens of
 * microseconds), and the callers convert a row at a time. */
static inline int ferry__cpu_avx_f16c(void) {
  static atomic_int known = -1; /* one per translation unit; each asks once */
  int v = atomic_load_explicit(&known, memory_order_relaxed);
  if (v < 0) {
    unsigned a, b, c, d;
    v = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    atomic_store_explicit(&known, v, memory_order_relaxed);
  }
  return v;
}
#endif /* __x86_64__ */

#endif
