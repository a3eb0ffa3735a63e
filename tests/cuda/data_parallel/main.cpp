// The data-parallel CUDA tests' main. Under the emulator the tests always
// run (ranks are processes sharing the emulated NCCL's segment). On a GPU
// build each rank takes a GPU of its own, so the tests need 4 (the ZeRO 3
// run on 4 ranks); with fewer the program exits 77 (skipped), saying so, and
// with fewer than 8 the tests of 8 ranks print that they were skipped.
// The GPUs are counted in a child process: the test process must not
// initialize CUDA before it forks the ranks.
#include "catch_session.hpp"
// HEADROOM_GPU_TEST_MAIN: the main of the nvcc-built program, compiled by the
// C++ compiler against the CUDA runtime (tests/CMakeLists.txt); without it,
// the emulated program's.
#if defined(HEADROOM_GPU_TEST_MAIN)
#include <cuda_runtime.h>
#endif

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

// The ranks a test may start (ranks.hpp: cuda_test::can_start): one GPU each on a GPU build.
int headroom_cuda_test_rank_limit = 8;

int main(int argc, char** argv) {
#if defined(HEADROOM_GPU_TEST_MAIN)
  constexpr int needed = 4;
  const pid_t pid = fork();
  if (pid == 0) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    _exit(devices > 100 ? 100 : devices);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  const int devices = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  if (devices < needed) {
    std::printf("SKIP: the data-parallel tests take one GPU per rank, %d; this machine has %d\n", needed, devices);
    return 77;
  }
  std::printf("cuda_data_parallel on %d GPUs (NCCL)\n", devices);
  headroom_cuda_test_rank_limit = devices;
#else
  // on stderr: catch_discover_tests reads the test names from stdout
  std::fprintf(stderr, "cuda_data_parallel_emulated: ranks are processes, NCCL and the kernels are emulated on the CPU (not a GPU test)\n");
#endif
  return headroom_test::run_catch_session(argc, argv);
}
