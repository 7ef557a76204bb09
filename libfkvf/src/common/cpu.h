/* What the CPU the library runs on can do, asked once per feature: the one
 * place that decides whether the x86-64 kernels (AVX sums and rotations,
 * AVX2 + FMA and AVX-512 scores, F16C stores) may run. Every function returns 0 on other
 * architectures and compilers; all are thread-safe. */
#ifndef FKVF_COMMON_CPU_H
#define FKVF_COMMON_CPU_H

/* 1 if AVX instructions run (the CPU has them and the OS saves YMM state). */
int fkvf_cpu_avx(void);
/* 1 if AVX2 and FMA instructions run (the encoder's and training's kernels). */
int fkvf_cpu_avx2(void);
/* 1 if AVX-512 F instructions run with their 512-bit registers (the CPU has
 * them and the OS saves ZMM and opmask state), and AVX2 and FMA too: the
 * encoder's and training's wide scoring kernel. */
int fkvf_cpu_avx512(void);
/* 1 if F16C (vcvtps2ph) and AVX instructions run (the decoders' f16 stores). */
int fkvf_cpu_f16c(void);

#endif
