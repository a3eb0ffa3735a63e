// The arena-fed host::gemm against Eigen's own product on the same shapes
// (one thread): the ceiling a training step's GEMMs can reach here.
//
//   build/bench/gemm
#include <benchmark/benchmark.h>

#include <Eigen/Dense>
#include <headroom/host/gemm.hpp>
#include <vector>

using namespace headroom;

namespace {

constexpr long M = 2048, N = 768, K = 768;  // tokens x width: a d768 projection's forward

void flops(benchmark::State& state) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * M * N * K * 1e-9, benchmark::Counter::kIsRate);
}

void host_gemm_nt(benchmark::State& state) {
  std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
  const std::int64_t per = GemmBlocking::panel_elements(M, N, K);
  std::vector<float, Eigen::aligned_allocator<float>> panels(static_cast<std::size_t>(per));
  const host::GemmPanels<float> ws{panels.data(), per};
  for (auto _ : state) {
    host::gemm(host::Trans::no, host::Trans::yes, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N, ws, 1);
    benchmark::DoNotOptimize(c.data());
  }
  flops(state);
}

void eigen_nt(benchmark::State& state) {
  Eigen::setNbThreads(1);
  Eigen::Matrix<float, -1, -1, Eigen::RowMajor> a = Eigen::MatrixXf::Constant(M, K, 0.5f), b = Eigen::MatrixXf::Constant(N, K, 0.25f),
                                                c(M, N);
  for (auto _ : state) {
    c.noalias() = a * b.transpose();
    benchmark::DoNotOptimize(c.data());
  }
  flops(state);
}

}  // namespace

BENCHMARK(host_gemm_nt)->Name("gemm/host_arena_panels_2048x768x768")->Unit(benchmark::kMillisecond);
BENCHMARK(eigen_nt)->Name("gemm/eigen_product_2048x768x768")->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
