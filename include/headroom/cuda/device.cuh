#pragma once
// What every CUDA kernel header of headroom includes: the storage types, the
// f32 view of a stored element, warp and block reductions, and launch().
//
// Kernel headers (cuda/kernels/*.cuh) use only what this header and math/
// provide, plus the CUDA built-ins listed in docs/cuda.md ("the kernel
// subset"), so the same source also compiles with g++ against the CPU
// emulator of tests/cuda/emulator/ (HEADROOM_CUDA_EMULATOR), where the
// kernel tests run without a GPU. The only runtime call here is launch()'s
// cudaGetLastError after each launch.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "../core/config.hpp"
#include "../core/dtype.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#elif !defined(HEADROOM_CUDA_EMULATOR)
#error "headroom/cuda/*.cuh are compiled by nvcc (or by g++ after tests/cuda/emulator/cuda_emulator.hpp)"
#endif

#include "runtime.cuh"  // cuda_error: launch() checks every launch

namespace headroom::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// The C++ type that stores a DType on the device.
template <DType D>
struct storage_of;
template <>
struct storage_of<DType::F32> {
  using type = float;
};
template <>
struct storage_of<DType::BF16> {
  using type = bf16;
};
template <>
struct storage_of<DType::F16> {
  using type = f16;
};
template <DType D>
using storage_t = typename storage_of<D>::type;
// ... and the DType a storage type stores.
template <class S>
inline constexpr DType dtype_of = std::is_same_v<S, bf16> ? DType::BF16 : std::is_same_v<S, f16> ? DType::F16 : DType::F32;

// A stored element as f32, and back (round to nearest even).
HEADROOM_HOST_DEVICE inline float to_float(float x) { return x; }
HEADROOM_HOST_DEVICE inline float to_float(bf16 x) { return __bfloat162float(x); }
HEADROOM_HOST_DEVICE inline float to_float(f16 x) { return __half2float(x); }
template <class S>
HEADROOM_HOST_DEVICE inline S from_float(float x);
template <>
HEADROOM_HOST_DEVICE inline float from_float<float>(float x) { return x; }
template <>
HEADROOM_HOST_DEVICE inline bf16 from_float<bf16>(float x) { return __float2bfloat16(x); }
template <>
HEADROOM_HOST_DEVICE inline f16 from_float<f16>(float x) { return __float2half(x); }

inline constexpr int warp_size = 32;
inline constexpr unsigned full_mask = 0xffffffffu;

// Sum / max over the 32 lanes of a warp (an xor butterfly); every lane gets
// the result. The CPU emulator runs the same five rounds, in the same order,
// as one warp collective (a fifth of its fiber switches; its self-test holds
// it to the shuffle loop bit for bit).
__device__ inline float warp_sum(float v) {
#if defined(HEADROOM_CUDA_EMULATOR)
  return cuda_emulator::warp_butterfly_sum(full_mask, v);
#else
  for (int o = warp_size / 2; o > 0; o /= 2) v += __shfl_xor_sync(full_mask, v, o);
  return v;
#endif
}
__device__ inline float warp_max(float v) {
#if defined(HEADROOM_CUDA_EMULATOR)
  return cuda_emulator::warp_butterfly_max(full_mask, v);
#else
  for (int o = warp_size / 2; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(full_mask, v, o);
    v = w > v ? w : v;
  }
  return v;
#endif
}

namespace device_detail {
struct WarpSum {
  __device__ float operator()(float v) const { return warp_sum(v); }
};
struct WarpMax {
  __device__ float operator()(float v) const { return warp_max(v); }
};
// Reduces v over a 1-D block of Threads threads: within each warp, then the
// warps' results by the first warp. identity: what an absent warp adds.
template <int Threads, class WarpReduce>
__device__ inline float block_reduce(float v, float* shared, float identity, WarpReduce reduce) {
  static_assert(Threads % warp_size == 0 && Threads <= 1024, "block_sum / block_max: Threads must be a multiple of 32, at most 1024");
  constexpr int warps = Threads / warp_size;
  v = reduce(v);
  if constexpr (warps == 1) {
    return v;
  } else {
    const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = lane < warps ? shared[lane] : identity;
    t = reduce(t);
    __syncthreads();
    return t;
  }
}
}  // namespace device_detail

// Sum / max over a 1-D block of Threads threads (a multiple of 32, at most
// 1024); every thread gets the result. `shared`: (32) floats of shared
// memory, free for reuse after the call returns.
template <int Threads>
__device__ inline float block_sum(float v, float* shared) {
  return device_detail::block_reduce<Threads>(v, shared, 0.0f, device_detail::WarpSum{});
}
template <int Threads>
__device__ inline float block_max(float v, float* shared) {
  return device_detail::block_reduce<Threads>(v, shared, -3.402823466e38f, device_detail::WarpMax{});
}

inline constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

namespace device_detail {
inline std::string dims(dim3 d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}
[[noreturn]] inline void refused(cudaError_t e, const char* name, dim3 grid, dim3 block, std::size_t shared_bytes) {
  const std::string what = std::string("launch of ") + name + " with grid " + dims(grid) + ", block " + dims(block) + ", " +
                           std::to_string(shared_bytes) + " B of dynamic shared memory";
  throw cuda_error(e, what.c_str());
}
}  // namespace device_detail

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...); under the
// emulator, runs it on the CPU (blocks in order, threads as fibers). Every
// launch is checked: CUDA refuses a configuration beyond the device's limits
// (more than 1024 threads per block, grid.y or .z above 65,535, a zero
// dimension, dynamic shared memory above the kernel's limit) by not running
// the kernel and leaving the error for cudaGetLastError, which does not
// synchronize; launch() reads it and throws cuda_error naming the kernel
// (`name`) and its configuration. (An earlier asynchronous error, sticky on
// a GPU, is reported here too.)
template <class... Params, class... Args>
void launch_with_shared(void (*kernel)(Params...), const char* name, dim3 grid, dim3 block, std::size_t shared_bytes,
                        cudaStream_t stream, Args&&... args) {
#if defined(__CUDACC__)
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
#else
  ::headroom::cuda_emulator::run(kernel, grid, block, shared_bytes, stream, static_cast<Params>(std::forward<Args>(args))...);
#endif
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) device_detail::refused(e, name, grid, block, shared_bytes);
}
// The same without dynamic shared memory (every kernel of cuda/kernels/).
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), const char* name, dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  launch_with_shared(kernel, name, grid, block, 0, stream, std::forward<Args>(args)...);
}

}  // namespace headroom::cuda
