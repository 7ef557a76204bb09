/* CPU feature detection (cpu.h). */
#include "cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPU_X86 1
#include <cpuid.h>
#include <stdatomic.h>
/* 0 not yet known, 1 no, 2 yes (cpuid is slow in a VM: asked once) */
static atomic_int f16c_state;
#endif

int fkvf_cpu_avx(void)
{
#ifdef CPU_X86
    return __builtin_cpu_supports("avx") ? 1 : 0;
#else
    return 0;
#endif
}

int fkvf_cpu_avx2(void)
{
#ifdef CPU_X86
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

int fkvf_cpu_avx512(void)
{
#ifdef CPU_X86
    /* GCC's and clang's runtimes report avx512f only when XCR0 says the OS
     * saves the opmask and ZMM registers */
    return fkvf_cpu_avx2() && __builtin_cpu_supports("avx512f") ? 1 : 0;
#else
    return 0;
#endif
}

int fkvf_cpu_f16c(void)
{
#ifdef CPU_X86
    /* CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports lacks
     * "f16c"); the AVX check covers the OS's YMM support */
    int st = atomic_load_explicit(&f16c_state, memory_order_relaxed);
    if (!st) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        st = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 2 : 1;
        atomic_store_explicit(&f16c_state, st, memory_order_relaxed);
    }
    return st == 2 && fkvf_cpu_avx();
#else
    return 0;
#endif
}
