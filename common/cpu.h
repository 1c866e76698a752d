/* CPU feature checks for the x86 fast paths, spelled so gcc and clang both compile them
 * (clang before 16 has no "f16c" for __builtin_cpu_supports: ask CPUID directly). */
#ifndef FERRY_COMMON_CPU_H
#define FERRY_COMMON_CPU_H

#if defined(__x86_64__)
#include <cpuid.h>

/* AVX with the F16C half-precision conversions (the 8-wide fp16 <-> fp32 paths need both). */
static inline int ferry__cpu_avx_f16c(void) {
  unsigned a, b, c, d;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif /* __x86_64__ */

#endif
