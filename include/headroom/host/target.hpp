#pragma once
// Compiling a kernel for an instruction set the build's flags do not enable:
// code between HEADROOM_TARGET_AVX2_BEGIN (or _AVX512_BEGIN, _AVX512_BF16_BEGIN)
// and HEADROOM_TARGET_END is compiled for AVX2 + FMA (or AVX-512 F/BW/DQ/VL on
// top, or AVX512_BF16 on top of that), whatever -m flags the consumer passed, so a default-flags build
// carries every kernel and host/cpu.hpp's isa() picks one at run time. Only
// functions in such a region may use that set's intrinsics, and they run only
// where isa() says the CPU has it.
//
// HEADROOM_X86_KERNELS is 1 where these kernels exist: x86-64 with g++ or
// clang, outside nvcc (a .cu file's host code runs the portable kernels),
// unless HEADROOM_NO_X86_KERNELS is defined.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) && !defined(HEADROOM_NO_X86_KERNELS)
#define HEADROOM_X86_KERNELS 1
#else
#define HEADROOM_X86_KERNELS 0
#endif

// cpuid is readable in every x86-64 g++ / clang translation unit (nvcc's host
// code included), so every unit agrees on what the CPU has.
#if defined(__x86_64__) && defined(__GNUC__)
#define HEADROOM_X86_CPUID 1
#else
#define HEADROOM_X86_CPUID 0
#endif

#if HEADROOM_X86_KERNELS
#include <immintrin.h>
#if defined(__clang__)
#define HEADROOM_TARGET_AVX2_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)")
#define HEADROOM_TARGET_AVX512_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,avx512f,avx512bw,avx512dq,avx512vl\"))), apply_to = function)")
#define HEADROOM_TARGET_AVX512_BF16_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16\"))), apply_to = function)")
#define HEADROOM_TARGET_END _Pragma("clang attribute pop")
#else
#define HEADROOM_TARGET_AVX2_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma\")")
#define HEADROOM_TARGET_AVX512_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,avx512f,avx512bw,avx512dq,avx512vl\")")
#define HEADROOM_TARGET_AVX512_BF16_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16\")")
#define HEADROOM_TARGET_END _Pragma("GCC pop_options")
#endif
#endif
