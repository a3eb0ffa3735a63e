// A host kernel that multiplies stored bf16 values directly, as a float
// kernel would: the message says how a kernel computes over 16-bit storage.
// expect: host: bf16 and f16 are storage types without arithmetic
#include <headroom/headroom.hpp>
#include <headroom/host/storage.hpp>

template <class T>
void scale(const T* x, const T* g, T* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = x[i] * g[i];
}
template void scale<headroom::host::bf16>(const headroom::host::bf16*, const headroom::host::bf16*, headroom::host::bf16*, long);
