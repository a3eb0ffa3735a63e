#pragma once
// Ranks as processes, for the data-parallel tests of the CUDA engine: each
// rank (and the one-rank reference) runs in a fork()ed process of the test,
// writes what it measured into memory shared with the test process, and
// ends with _exit. Under the CPU emulator, the processes' emulated NCCL
// exchanges bytes through the segment ncclGetUniqueId mapped before the
// fork (tests/cuda/emulator/nccl_emulator.hpp); with nvcc, each rank takes
// the GPU of its index (cudaSetDevice), so a job needs that many GPUs.
// The test process itself never initializes CUDA (a forked child cannot use
// a CUDA context of its parent).
// Include it after ../support/kernel_test.hpp (the CUDA runtime, or its emulator).
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if !defined(__CUDACC__)
#include "../emulator/nccl_emulator.hpp"
#endif
#include <headroom/cuda/nccl.cuh>

extern int headroom_cuda_test_rank_limit;  // main.cpp

namespace headroom::cuda_test {

// Whether `ranks` processes can run here: on a GPU build one GPU each, as
// many as main() counted (main.cpp), under the emulator up to its 8 ranks. A
// test that needs more says so and passes.
inline bool can_start(int ranks) {
  if (ranks <= headroom_cuda_test_rank_limit) return true;
  std::printf("skipped: %d ranks, one GPU each; this machine has %d GPUs\n", ranks, headroom_cuda_test_rank_limit);
  return false;
}

// One GPU per rank on a GPU build (the GPU of the rank's index); the emulator has one device for all.
inline void use_device(int rank) {
#if defined(__CUDACC__)
  cuda::check(cudaSetDevice(rank), "cudaSetDevice");
#else
  (void)rank;
#endif
}

// What a rank writes back (one per process).
struct RankReport {
  static constexpr int max_steps = 8;
  static constexpr std::size_t max_values = std::size_t{1} << 18;
  bool done = false;  // the rank's function returned
  bool threw = false;
  char error[1024] = {};
  double seconds = 0;  // from the rank's start to its return or its exception
  int steps = 0;
  double loss[max_steps] = {}, norm[max_steps] = {};
  double evaluated = 0;
  std::size_t values = 0;
  float value[max_values] = {};  // the weights it holds, at their places in all parameters (NaN where it holds none)
};
static_assert(std::is_trivially_copyable_v<RankReport>);

// Runs run(rank, report) in `n` processes at once and waits for them, at
// most `limit`: those still running then are killed (and reported). With
// `decisive` >= 0, the others are killed as soon as that rank has ended.
template <class Run>
std::vector<RankReport> run_ranks(int n, Run run, std::chrono::seconds limit = std::chrono::seconds(300), int decisive = -1) {
  void* shared = mmap(nullptr, sizeof(RankReport) * static_cast<std::size_t>(n), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) throw std::runtime_error("run_ranks: mmap failed");
  auto* reports = static_cast<RankReport*>(shared);
  for (int r = 0; r < n; ++r) new (reports + r) RankReport{};
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("run_ranks: fork failed");
    if (pid == 0) {
      RankReport& report = reports[r];
      const auto start = std::chrono::steady_clock::now();
      try {
        run(r, report);
      } catch (const std::exception& e) {
        report.threw = true;
        std::snprintf(report.error, sizeof report.error, "%s", e.what());
      } catch (...) {
        report.threw = true;
        std::snprintf(report.error, sizeof report.error, "an exception that is not a std::exception");
      }
      report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      report.done = !report.threw;
      std::fflush(nullptr);
      _exit(0);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<bool> ended(static_cast<std::size_t>(n), false);
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; ++r) {
      if (ended[static_cast<std::size_t>(r)]) continue;
      int status = 0;
      if (waitpid(pids[static_cast<std::size_t>(r)], &status, WNOHANG) == pids[static_cast<std::size_t>(r)]) {
        ended[static_cast<std::size_t>(r)] = true;
        --left;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
          std::snprintf(reports[r].error, sizeof reports[r].error, "rank process ended abnormally (status %d)", status);
      }
    }
    const bool decided = decisive >= 0 && ended[static_cast<std::size_t>(decisive)];
    if (left > 0 && (decided || std::chrono::steady_clock::now() > deadline)) {
      for (int r = 0; r < n; ++r)
        if (!ended[static_cast<std::size_t>(r)]) {
          kill(pids[static_cast<std::size_t>(r)], SIGKILL);
          waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
          if (!decided)
            std::snprintf(reports[r].error, sizeof reports[r].error, "rank process killed after %lld s", static_cast<long long>(limit.count()));
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<RankReport> out(reports, reports + n);
  munmap(shared, sizeof(RankReport) * static_cast<std::size_t>(n));
  return out;
}

}  // namespace headroom::cuda_test
