#pragma once
// What a kernel test under tests/cuda/kernels/ includes first. The same test
// source is built twice:
//   - by nvcc into cuda_kernels (runs on a GPU; exit 77 = no CUDA device), and
//   - by g++ into cuda_kernels_emulated, against the CPU emulator
//     (tests/cuda/emulator/cuda_emulator.hpp), which runs in CI everywhere.
// Buffer<T> is device memory on a GPU and host memory under the emulator;
// tests fill it from host vectors and read it back, so one source serves both.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if !defined(__CUDACC__)
#include "../emulator/cuda_emulator.hpp"
#include "../emulator/runtime_emulator.hpp"
#else
#include <cuda_runtime.h>
#endif

#include <catch2/catch.hpp>

#include <headroom/cuda/device.cuh>

namespace headroom::cuda_test {

#if defined(__CUDACC__)
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

// Waits for every launched kernel; surfaces a kernel's error on a GPU.
inline void sync() {
#if defined(__CUDACC__)
  check(cudaGetLastError(), "kernel launch");
  check(cudaDeviceSynchronize(), "kernel");
#endif
}

template <class T>
class Buffer {
 public:
  explicit Buffer(std::size_t n) : n_(n) {
#if defined(__CUDACC__)
    check(cudaMalloc(&p_, n * sizeof(T) + 1), "cudaMalloc");
    check(cudaMemset(p_, 0, n * sizeof(T) + 1), "cudaMemset");
#else
    // aligned as cudaMalloc aligns (256 bytes), so that what depends on a
    // pointer's alignment (Blas's choice of algorithm) does not depend on where
    // the heap put the buffer
    host_.assign(n * sizeof(T) + 256, std::byte{0});
    void* p = host_.data();
    std::size_t space = host_.size();
    p_ = static_cast<T*>(std::align(256, n * sizeof(T), p, space));
    std::uninitialized_value_construct_n(p_, n);
#endif
  }
  explicit Buffer(const std::vector<T>& v) : Buffer(v.size()) { upload(v); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
#if defined(__CUDACC__)
    cudaFree(p_);
#else
    std::destroy_n(p_, n_);
#endif
  }
  void upload(const std::vector<T>& v) {
    if (v.size() != n_) throw std::invalid_argument("Buffer::upload: size mismatch");
#if defined(__CUDACC__)
    check(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
#else
    std::memcpy(static_cast<void*>(p_), v.data(), n_ * sizeof(T));
#endif
  }
  std::vector<T> download() const {
    sync();
    std::vector<T> v(n_);
#if defined(__CUDACC__)
    check(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
#else
    std::memcpy(static_cast<void*>(v.data()), p_, n_ * sizeof(T));
#endif
    return v;
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_;
  T* p_ = nullptr;
#if !defined(__CUDACC__)
  std::vector<std::byte> host_;  // p_'s n_ elements, 256-byte aligned inside
#endif
};

// Host vectors in a storage type S from floats, and back.
template <class S>
std::vector<S> to_storage(const std::vector<float>& v) {
  std::vector<S> s(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) s[i] = cuda::from_float<S>(v[i]);
  return s;
}
template <class S>
std::vector<float> to_floats(const std::vector<S>& s) {
  std::vector<float> v(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) v[i] = cuda::to_float(s[i]);
  return v;
}
// The value a float takes after a round trip through S (what a kernel reads).
template <class S>
std::vector<float> rounded(const std::vector<float>& v) {
  return to_floats(to_storage<S>(v));
}

// Deterministic test data in [-amp, amp).
inline std::vector<float> pattern(std::size_t n, std::uint32_t seed, float amp = 1.0f) {
  std::vector<float> v(n);
  std::uint32_t s = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = amp * (static_cast<float>(s >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

// Largest |a - b| / (atol + rtol |b|) over the elements (<= 1 passes).
inline double worst_ratio(const std::vector<float>& a, const std::vector<float>& b, double atol, double rtol) {
  if (a.size() != b.size()) return 1e30;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] > b[i] ? double(a[i]) - b[i] : double(b[i]) - a[i];
    const double bb = b[i] < 0 ? -double(b[i]) : double(b[i]);
    const double r = d / (atol + rtol * bb);
    if (!(r <= worst)) worst = r;  // NaN counts as worst
  }
  return worst;
}

}  // namespace headroom::cuda_test
