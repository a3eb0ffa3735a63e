#pragma once
// Configuration macros shared by host and device code.
//
// HEADROOM_HOST_DEVICE marks a function usable from host code and from CUDA
// kernels (the shared op math in math/ is written once with it).
// HEADROOM_CUDA_KERNELS is set where the CUDA kernels of ops and optimizers
// are compiled: nvcc, or the CPU emulator the tests run them on.

#if defined(__CUDACC__)
#define HEADROOM_HOST_DEVICE __host__ __device__
#else
#define HEADROOM_HOST_DEVICE
#endif

#if defined(__CUDACC__) || defined(HEADROOM_CUDA_EMULATOR)
#define HEADROOM_CUDA_KERNELS 1
#endif

namespace headroom {
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
}  // namespace headroom
