#pragma once
// The host engine's kernel choices in tests (host/cpu.hpp): every choice this
// CPU can run, and a scope that runs its body with one of them.
#include <headroom/host/cpu.hpp>
#include <vector>

namespace headroom::test {

// portable always; avx2 and avx512 where the CPU has them
inline std::vector<host::Isa> runnable_isas() {
  std::vector<host::Isa> v{host::Isa::portable};
  if (host::cpu_features().best >= host::Isa::avx2) v.push_back(host::Isa::avx2);
  if (host::cpu_features().best >= host::Isa::avx512) v.push_back(host::Isa::avx512);
  return v;
}

// The kernels of `i` until the scope ends, then the previous choice again.
struct IsaScope {
  host::Isa before;
  explicit IsaScope(host::Isa i) : before(host::use_isa(i)) {}
  ~IsaScope() { host::use_isa(before); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

}  // namespace headroom::test
