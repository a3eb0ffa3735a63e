#pragma once
// The CUDA runtime as the engine uses it: errors as exceptions naming the
// call, "is there a device at all", and the two arenas of a plan (one
// cudaMalloc for the device tier, one cudaHostAlloc of pinned memory for the
// offload tier). Nothing else in the engine allocates device memory.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

namespace headroom::cuda {

class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t e, const char* what)
      : std::runtime_error(std::string("headroom::cuda: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"),
        code_(e) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

// Throws cuda_error for a failed call. The call also left its error for
// cudaGetLastError; it is cleared here, so that the next launch's check
// (device.cuh, launch) does not report it again.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw cuda_error(e, what);
  }
}

// True for the errors that mean "no usable GPU here" (no driver, the stub
// driver, no device): tests skip on them instead of failing.
inline bool is_no_device(cudaError_t e) {
  return e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e == cudaErrorStubLibrary;
}

// The number of usable devices (0 where the driver or a device is missing).
inline int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (is_no_device(e)) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  check(e, "cudaGetDeviceCount");
  return n;
}

// Counts every allocation the engine makes, so tests can check that a step
// makes none (the arenas are made once, at construction).
struct AllocationCounter {
  static inline std::int64_t device = 0, pinned = 0;
};

// One tier of a plan in one allocation of `bytes`: device memory
// (cudaMalloc, zeroed once) for the device tier, pinned host memory
// (cudaHostAlloc) for the offload tier. 256-byte aligned (both guarantee at
// least that). The zeroing is done when the constructor returns: cudaMemset
// of device memory is asynchronous, on the legacy default stream, which a
// non-blocking stream's work is not ordered after.
template <bool Pinned>
class TierArena {
 public:
  explicit TierArena(std::int64_t bytes) : bytes_(bytes) {
    if (bytes_ <= 0) return;
    const auto n = static_cast<std::size_t>(bytes_);
    if constexpr (Pinned) {
      check(cudaHostAlloc(&base_, n, cudaHostAllocDefault), "cudaHostAlloc of the offload arena");
      ++AllocationCounter::pinned;
    } else {
      check(cudaMalloc(&base_, n), "cudaMalloc of the device arena");
      ++AllocationCounter::device;
      check(cudaMemset(base_, 0, n), "cudaMemset of the device arena");
      check(cudaDeviceSynchronize(), "zeroing the device arena");
    }
  }
  TierArena(const TierArena&) = delete;
  TierArena& operator=(const TierArena&) = delete;
  ~TierArena() {
    if (base_ == nullptr) return;
    if constexpr (Pinned) cudaFreeHost(base_);
    else cudaFree(base_);
  }
  std::int64_t bytes() const { return bytes_; }
  template <class T>
  T* at(std::int64_t offset) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(base_) + offset);
  }

 private:
  std::int64_t bytes_;
  void* base_ = nullptr;
};
using DeviceArena = TierArena<false>;
using PinnedArena = TierArena<true>;

}  // namespace headroom::cuda
