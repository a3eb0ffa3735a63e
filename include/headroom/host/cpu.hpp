#pragma once
// What the CPU the host engine runs on can do, and which kernels it runs
// there: chosen at run time from the CPU, not from the flags the program was
// compiled with. A consumer build with the compiler's default flags (x86-64,
// SSE2) runs the same AVX2 and AVX-512 kernels as a -march=native build: those
// kernels are compiled for their instruction sets by target pragmas
// (host/target.hpp) and called only where cpu_features() found them.
//
//   host::cpu_features()   the CPU: brand string, ISA extensions the CPU and
//                          the operating system both enable
//   host::isa()            the kernels in use: the best the CPU has, capped by
//                          the environment variable HEADROOM_ISA
//                          (portable | avx2 | avx512) or by use_isa()
//   host::cpu_report()     one line saying both, for logs and benchmarks
//
// Isa::portable is Eigen's product and the scalar element loops, compiled
// with the consumer's flags; avx2 is headroom's AVX2 + FMA kernels; avx512 its
// AVX-512 (F, BW, DQ, VL) GEMM, with the AVX2 element loops.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "target.hpp"

#if HEADROOM_X86_CPUID
#include <cpuid.h>
#endif

namespace headroom::host {

enum class Isa : int { portable = 0, avx2 = 1, avx512 = 2 };

constexpr std::string_view isa_name(Isa i) {
  switch (i) {
    case Isa::portable: return "portable";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

struct CpuFeatures {
  char brand[49] = {};       // the processor's brand string, as cpuid reports it
  bool avx2_fma = false;     // AVX2 and FMA3, with the OS saving ymm state
  bool avx512 = false;       // AVX-512 F, BW, DQ and VL, with the OS saving zmm and mask state
  bool avx512_bf16 = false;  // AVX512_BF16 (vdpbf16ps)
  bool amx_bf16 = false;     // AMX-TILE and AMX-BF16, with the OS enabling tile state
  bool amx_int8 = false;     // AMX-TILE and AMX-INT8, likewise
  Isa best = Isa::portable;  // the best kernels headroom has for this CPU
};

namespace detail {

inline CpuFeatures detect_cpu() {
  CpuFeatures f;
#if HEADROOM_X86_CPUID
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
    unsigned* w = reinterpret_cast<unsigned*>(f.brand);
    for (unsigned leaf = 0; leaf < 3; ++leaf)
      __get_cpuid(0x80000002u + leaf, w + 4 * leaf, w + 4 * leaf + 1, w + 4 * leaf + 2, w + 4 * leaf + 3);
    // the string is padded with spaces on some processors, before or after
    std::size_t lead = 0;
    while (f.brand[lead] == ' ') ++lead;
    std::memmove(f.brand, f.brand + lead, sizeof f.brand - lead);
    for (std::size_t end = std::strlen(f.brand); end > 0 && f.brand[end - 1] == ' '; --end) f.brand[end - 1] = '\0';
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const std::uint64_t xcr0 = (static_cast<std::uint64_t>(xcr0_hi) << 32) | xcr0_lo;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;                // SSE and AVX state
  const bool zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;       // XTILECFG, XTILEDATA
  unsigned max_leaf = 0;
  __get_cpuid(0, &max_leaf, &b, &c, &d);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned ebx7 = b, edx7 = d, leaf7_subleaves = a;
  const bool avx2 = (ebx7 >> 5) & 1;
  const bool avx512fbwdqvl = ((ebx7 >> 16) & 1) && ((ebx7 >> 17) & 1) && ((ebx7 >> 30) & 1) && ((ebx7 >> 31) & 1);
  f.avx2_fma = ymm_state && avx2 && fma;
  f.avx512 = f.avx2_fma && zmm_state && avx512fbwdqvl;
  if (leaf7_subleaves >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.avx512 && ((a >> 5) & 1);
  }
  const bool amx_tile = (edx7 >> 24) & 1;
  f.amx_bf16 = tile_state && amx_tile && ((edx7 >> 22) & 1);
  f.amx_int8 = tile_state && amx_tile && ((edx7 >> 25) & 1);
#endif
  // kernels exist only where this unit compiled them (host/target.hpp)
  f.best = !HEADROOM_X86_KERNELS ? Isa::portable : f.avx512 ? Isa::avx512 : f.avx2_fma ? Isa::avx2 : Isa::portable;
  return f;
}

inline bool parse_isa(std::string_view s, Isa& out) {
  for (Isa i : {Isa::portable, Isa::avx2, Isa::avx512})
    if (s == isa_name(i)) return out = i, true;
  return false;
}

}  // namespace detail

inline const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detail::detect_cpu();
  return f;
}

namespace detail {
// The kernels in use: the CPU's best, or HEADROOM_ISA's cap where it is set
// (read once, at the first call). An unknown name, or an ISA the CPU lacks,
// stops the program with a sentence saying so: running other kernels than
// the ones asked for would make a comparison meaningless.
inline std::atomic<int>& isa_choice() {
  static std::atomic<int> choice = [] {
    const CpuFeatures& f = cpu_features();
    Isa pick = f.best;
    if (const char* env = std::getenv("HEADROOM_ISA"); env != nullptr && *env != '\0') {
      if (!parse_isa(env, pick)) {
        std::fprintf(stderr, "headroom: HEADROOM_ISA=%s is not one of portable, avx2, avx512\n", env);
        std::abort();
      }
      if (static_cast<int>(pick) > static_cast<int>(f.best)) {
        std::fprintf(stderr, "headroom: HEADROOM_ISA=%s asks for kernels this CPU (%s) cannot run; its best is %s\n",
                     env, f.brand, isa_name(f.best).data());
        std::abort();
      }
    }
    return static_cast<int>(pick);
  }();
  return choice;
}
}  // namespace detail

// The kernels the host engine runs now.
inline Isa isa() { return static_cast<Isa>(detail::isa_choice().load(std::memory_order_relaxed)); }

// Runs the host engine's kernels for `i` from now on (tests, benchmarks);
// returns the previous choice. Throws std::invalid_argument where the CPU
// cannot run them. Not for use while a step runs.
inline Isa use_isa(Isa i) {
  const CpuFeatures& f = cpu_features();
  if (static_cast<int>(i) > static_cast<int>(f.best))
    throw std::invalid_argument("headroom::host::use_isa: this CPU (" + std::string(f.brand) + ") cannot run the " +
                                std::string(isa_name(i)) + " kernels; its best is " + std::string(isa_name(f.best)));
  return static_cast<Isa>(detail::isa_choice().exchange(static_cast<int>(i), std::memory_order_relaxed));
}

// "cpu: <brand>; has avx2+fma avx512 avx512_bf16 amx-bf16 amx-int8; kernels: avx512 (GEMM 12x32 AVX-512, element
// loops AVX2)"
inline std::string cpu_report() {
  const CpuFeatures& f = cpu_features();
  std::string s = "cpu: ";
  s += f.brand[0] != '\0' ? f.brand : "unknown";
  s += "; has";
  bool any = false;
  const auto add = [&](bool on, const char* name) {
    if (on) s += ' ', s += name, any = true;
  };
  add(f.avx2_fma, "avx2+fma");
  add(f.avx512, "avx512");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_bf16, "amx-bf16");
  add(f.amx_int8, "amx-int8");
  if (!any) s += " none of avx2+fma, avx512";
  const Isa i = isa();
  s += "; kernels: ";
  s += isa_name(i);
  switch (i) {
    case Isa::portable: s += " (GEMM: Eigen's product, element loops: scalar)"; break;
    case Isa::avx2: s += " (GEMM: headroom 6x16 AVX2+FMA, element loops: AVX2)"; break;
    case Isa::avx512: s += " (GEMM: headroom 12x32 AVX-512, element loops: AVX2)"; break;
  }
  if (i != f.best) s += " [capped; best here: " + std::string(isa_name(f.best)) + "]";
  return s;
}

}  // namespace headroom::host
