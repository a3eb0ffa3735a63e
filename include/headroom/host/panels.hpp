#pragma once
// host::GemmPanels<T>: the GEMM packing panels each worker owns, in the arena.
#include <cstdint>

namespace headroom::host {

// The workspace: `workers` regions of `per_worker` elements each. `base`
// must be 64-byte aligned (Eigen's packing stores aligned vectors; the float
// AVX2 kernel does not need it); the plan's buffer is (256 B), and
// GemmBlocking rounds every region to 64 elements.
template <class T>
struct GemmPanels {
  T* base = nullptr;
  std::int64_t per_worker = 0;
  T* of(int worker) const { return base + worker * per_worker; }
};

}  // namespace headroom::host
