// The kernel tests' main: on a GPU build, exit 77 (skipped) where no CUDA
// device or driver is present, with the reason printed; under the emulator,
// the tests always run (on the CPU).
#include "catch_session.hpp"
// HEADROOM_GPU_TEST_MAIN: the main of the nvcc-built program, compiled by the
// C++ compiler against the CUDA runtime (tests/CMakeLists.txt); without it,
// the emulated program's.
#if defined(HEADROOM_GPU_TEST_MAIN)
#include <cuda_runtime.h>
#endif

#include <cstdio>

int main(int argc, char** argv) {
#if defined(HEADROOM_GPU_TEST_MAIN)
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice || err == cudaErrorStubLibrary || devices == 0) {
    std::printf("SKIP: no CUDA device (%s)\n", cudaGetErrorString(err));
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("cuda_kernels on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
#else
  // on stderr: catch_discover_tests reads the test names from stdout
  std::fprintf(stderr, "cuda_kernels_emulated: kernels run on the CPU emulator (not a GPU test)\n");
#endif
  return headroom_test::run_catch_session(argc, argv);
}
