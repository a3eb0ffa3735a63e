#pragma once
// for_this_cpu(f): runs f() with its loops compiled for the instruction set
// host::isa() chose, whatever flags the build used.
//
// The host engine's GEMM tiles and its transcendental row loops are written
// with intrinsics in target regions (host/target.hpp). The remaining loops
// (norm rows, residual adds, RoPE rotations, softmax bookkeeping, widening
// bf16 rows) are plain C++ that the compiler vectorizes, or runs through GCC
// vector types: compiled at a consumer's default flags they run on SSE2.
// for_this_cpu calls f from a function compiled for AVX2 + FMA (on top of the
// build's own flags) that inlines every call it makes (flatten), so the same
// source is also compiled for AVX2 and chosen at run time. Only code and
// speed change: the arithmetic, its order and its rounding are the source's
// (the project builds with strict ISO C++, where floating-point contraction
// into FMA is off; a consumer building with GNU extensions on lets g++
// contract, which changes the last bit of some results between ISAs).
//
// Keep f small: everything it calls is inlined into each copy. A large
// callee that has its own dispatch (a GEMM) is marked noinline. (clang's
// flatten inlines f itself; f's own calls then follow clang's usual
// inlining, so a helper it keeps out of line runs its default-flags copy.)
#include <cstdint>

#include "cpu.hpp"
#include "parallel.hpp"
#include "target.hpp"

namespace headroom::host {

#if HEADROOM_X86_KERNELS
HEADROOM_TARGET_AVX2_BEGIN
namespace detail {
template <class F, class... Args>
[[gnu::flatten]] inline void run_compiled_for_avx2(F& f, Args... args) {
  f(args...);
}
}  // namespace detail
HEADROOM_TARGET_END
#endif

// f(args...): args are passed by value (indices, counts)
template <class F, class... Args>
inline void for_this_cpu(F&& f, Args... args) {
#if HEADROOM_X86_KERNELS
  if (isa() != Isa::portable) {
    detail::run_compiled_for_avx2(f, args...);
    return;
  }
#endif
  f(args...);
}

// team and parallel_for (host/parallel.hpp) with each worker's share run
// through for_this_cpu: one dispatch per worker, not per element.
template <class F>
void team_for_this_cpu(int workers, F&& f) {
  team(workers, [&](int w, int count) { for_this_cpu(f, w, count); });
}
template <class F>
void parallel_for_this_cpu(std::int64_t n, int workers, F&& f) {
  team_for_this_cpu(workers, [&](int w, int count) {
    const Range r = share(n, count, w);
    for (std::int64_t i = r.begin; i < r.end; ++i) f(i, w);
  });
}

}  // namespace headroom::host
