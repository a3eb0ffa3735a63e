// The arena-fed host::gemm against Eigen's own product, and OpenBLAS's
// cblas_sgemm, on the same shapes: the ceiling a training step's GEMMs can
// reach here. host::gemm runs once per kernel this CPU has (gemm/host-avx512,
// gemm/host-avx2; host/cpu.hpp), and gemm/fma_peak/... measures the core's
// FMA rate (independent FMA chains, nothing loaded) with 256- and 512-bit
// vectors, the ceiling each kernel is judged against. The CPU and the
// kernels chosen are printed first (host::cpu_report()).
//
//   build/bench/gemm                                        everything (about 3 minutes)
//   build/bench/gemm --benchmark_filter='arena|product'     the headline pair (one thread)
//   build/bench/gemm --benchmark_filter='/nt/threads:1'     one case of every shape
//
// The first two benchmarks are the headline: C = A B^T, (2048 x 768) by
// (768 x 768), one thread. Then every shape below in the four transposition
// cases (nn, nt, tn, tt: op(A), op(B)) on 1 and 2 threads, host::gemm, then
// Eigen (the same product, Eigen::setNbThreads), then OpenBLAS (cblas_sgemm,
// openblas_set_num_threads): the linear layer's forward is nt (X W^T), its dX
// nn (dY W), its dW tn (dY^T X).
//
// OpenBLAS is not linked: libopenblas.so.0 (Debian libopenblas0-pthread) is
// dlopen'ed at startup, and without it the gemm/openblas/... benchmarks are
// not registered (a line on stderr says why). OPENBLAS_CORETYPE and
// OPENBLAS_L2_SIZE, which OpenBLAS reads when it is loaded and which slow it
// here, are unset before the dlopen (stderr says so); the same as running
// under `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <Eigen/Dense>
#include <cstdio>
#include <cstdlib>
#include <headroom/host/gemm.hpp>
#include <headroom/host/target.hpp>
#include <string>
#include <vector>

using namespace headroom;

namespace {

constexpr long M = 2048, N = 768, K = 768;  // tokens x width: a d768 projection's forward

using Mat = Eigen::Matrix<float, -1, -1, Eigen::RowMajor>;

void flops(benchmark::State& state, long m, long n, long k) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * m * n * k * 1e-9, benchmark::Counter::kIsRate);
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
  flops(state, M, N, K);
}

void eigen_nt(benchmark::State& state) {
  Eigen::setNbThreads(1);
  Mat a = Mat::Constant(M, K, 0.5f), b = Mat::Constant(N, K, 0.25f), c(M, N);
  for (auto _ : state) {
    c.noalias() = a * b.transpose();
    benchmark::DoNotOptimize(c.data());
  }
  flops(state, M, N, K);
}

// ---- every shape x transposition x workers --------------------------------
// A is stored (m, k) or, transposed, (k, m); B (k, n) or (n, k).
Mat filled(long rows, long cols, unsigned seed) {
  Mat x(rows, cols);
  unsigned s = seed;
  for (long i = 0; i < x.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    x.data()[i] = static_cast<float>(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
  return x;
}

void host_case(benchmark::State& state, long m, long n, long k, bool ta, bool tb, int workers, host::Isa isa) {
  const host::Isa before = host::use_isa(isa);
  const Mat a = ta ? filled(k, m, 1) : filled(m, k, 1), b = tb ? filled(n, k, 2) : filled(k, n, 2);
  Mat c(m, n);
  const std::int64_t per = GemmBlocking::panel_elements(m, n, k);
  std::vector<float, Eigen::aligned_allocator<float>> panels(static_cast<std::size_t>(per * workers));
  const host::GemmPanels<float> ws{panels.data(), per};
  const auto t = [](bool x) { return x ? host::Trans::yes : host::Trans::no; };
  for (auto _ : state) {
    host::gemm(t(ta), t(tb), m, n, k, 1.0f, a.data(), a.cols(), b.data(), b.cols(), 0.0f, c.data(), n, ws, workers);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  host::use_isa(before);
  flops(state, m, n, k);
}

// ---- the core's FMA peak ---------------------------------------------------
// 12 independent accumulator chains (more than latency x ports on the cores
// seen: 4 cycles x 2 FMA ports), 100 FMAs each per call, nothing loaded or
// stored: FLOP/s = chains x 100 x lanes x 2 per call.
constexpr int chains = 12, fmas_per_chain = 100;
#if HEADROOM_X86_KERNELS
HEADROOM_TARGET_AVX2_BEGIN
float fma_chains_256(float x) {
  __m256 acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm256_set1_ps(x + static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-4f);
  for (int r = 0; r < fmas_per_chain; ++r)
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
}
HEADROOM_TARGET_END
HEADROOM_TARGET_AVX512_BEGIN
float fma_chains_512(float x) {
  __m512 acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm512_set1_ps(x + static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
  for (int r = 0; r < fmas_per_chain; ++r)
#pragma GCC unroll 12
    for (int i = 0; i < chains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}
HEADROOM_TARGET_END

void fma_peak(benchmark::State& state, int lanes, int workers) {
  double calls = 0;
  for (auto _ : state) {
    host::team(workers, [&](int w, int) {
      float x = static_cast<float>(w);
      for (int i = 0; i < 1000; ++i) x = lanes == 16 ? fma_chains_512(x) : fma_chains_256(x);
      benchmark::DoNotOptimize(x);
    });
    calls += 1000.0 * workers;
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(calls * chains * fmas_per_chain * lanes * 2.0 * 1e-9, benchmark::Counter::kIsRate);
}
#endif

void eigen_case(benchmark::State& state, long m, long n, long k, bool ta, bool tb, int workers) {
  Eigen::setNbThreads(workers);
  const Mat a = ta ? filled(k, m, 1) : filled(m, k, 1), b = tb ? filled(n, k, 2) : filled(k, n, 2);
  Mat c(m, n);
  for (auto _ : state) {
    if (!ta && !tb) c.noalias() = a * b;
    else if (!ta) c.noalias() = a * b.transpose();
    else if (!tb) c.noalias() = a.transpose() * b;
    else c.noalias() = a.transpose() * b.transpose();
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  Eigen::setNbThreads(1);
  flops(state, m, n, k);
}

// OpenBLAS's CBLAS through dlopen: the LP64 interface (int dimensions) of
// libopenblas.so.0, with CBLAS's enum values.
struct OpenBlas {
  using Sgemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
  using SetThreads = void (*)(int);
  static constexpr int row_major = 101, no_trans = 111, trans = 112;
  Sgemm sgemm = nullptr;
  SetThreads set_threads = nullptr;
};
OpenBlas openblas;

// Loads OpenBLAS into `openblas`, first unsetting the environment that
// OpenBLAS reads at load time; says on stderr what it did, and, when it
// fails, why the OpenBLAS benchmarks are left out.
void load_openblas() {
  constexpr const char* lib = "libopenblas.so.0";
  const bool preloaded = dlopen(lib, RTLD_NOW | RTLD_NOLOAD) != nullptr;  // e.g. LD_PRELOAD: too late to unset
  for (const char* var : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}) {
    const char* value = std::getenv(var);
    if (!value) {
      std::fprintf(stderr, "openblas: %s is not set\n", var);
    } else if (preloaded) {
      std::fprintf(stderr,
                   "openblas: %s=%s is set and %s was loaded before main, so it applies; for OpenBLAS's best, run "
                   "under `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`\n",
                   var, value, lib);
    } else {
      std::fprintf(stderr,
                   "openblas: %s=%s is set (it slows OpenBLAS); unsetting it before loading %s, as `env -u "
                   "OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` would\n",
                   var, value, lib);
      unsetenv(var);
    }
  }
  void* handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    std::fprintf(stderr, "openblas: not benchmarked: dlopen(\"%s\") failed: %s\n", lib, err ? err : "unknown error");
    return;
  }
  const auto sgemm = reinterpret_cast<OpenBlas::Sgemm>(dlsym(handle, "cblas_sgemm"));
  const auto set_threads = reinterpret_cast<OpenBlas::SetThreads>(dlsym(handle, "openblas_set_num_threads"));
  if (!sgemm || !set_threads) {
    std::fprintf(stderr, "openblas: not benchmarked: %s has no %s\n", lib,
                 !sgemm ? "cblas_sgemm" : "openblas_set_num_threads");
    dlclose(handle);
    return;
  }
  openblas = {sgemm, set_threads};
  std::fprintf(stderr, "openblas: %s loaded; benchmarked as gemm/openblas/...\n", lib);
}

void openblas_case(benchmark::State& state, long m, long n, long k, bool ta, bool tb, int workers) {
  openblas.set_threads(workers);
  const Mat a = ta ? filled(k, m, 1) : filled(m, k, 1), b = tb ? filled(n, k, 2) : filled(k, n, 2);
  Mat c(m, n);
  const auto t = [](bool x) { return x ? OpenBlas::trans : OpenBlas::no_trans; };
  const auto i = [](long x) { return static_cast<int>(x); };
  for (auto _ : state) {
    openblas.sgemm(OpenBlas::row_major, t(ta), t(tb), i(m), i(n), i(k), 1.0f, a.data(), i(a.cols()), b.data(),
                   i(b.cols()), 0.0f, c.data(), i(n));
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  flops(state, m, n, k);
}

struct Shape {
  long m, n, k;
  bool all_trans;  // the four cases, or the LM head's nt only
};
constexpr Shape shapes[] = {
    {2048, 768, 768, true},    // d768 projection, B8 x T256
    {1024, 3072, 768, true},   // MLP up, B4 x T256
    {1024, 768, 3072, true},   // MLP down
    {768, 768, 1024, true},    // a projection's dW: (768 x 1024 tokens) by (1024 x 768)
    {1024, 50257, 768, false}, // the GPT-2 LM head: hidden (1024 x 768) by wte^T
};

int register_cases() {
#if HEADROOM_X86_KERNELS
  for (int workers = 1; workers <= 2; ++workers) {
    const std::string threads = "/threads:" + std::to_string(workers);
    if (host::cpu_features().avx2_fma)
      benchmark::RegisterBenchmark(("gemm/fma_peak/ymm" + threads).c_str(),
                                   [=](benchmark::State& st) { fma_peak(st, 8, workers); })
          ->UseRealTime();
    if (host::cpu_features().avx512)
      benchmark::RegisterBenchmark(("gemm/fma_peak/zmm" + threads).c_str(),
                                   [=](benchmark::State& st) { fma_peak(st, 16, workers); })
          ->UseRealTime();
  }
#endif
  const char* names[] = {"nn", "nt", "tn", "tt"};
  for (const Shape& s : shapes) {
    for (int tr = 0; tr < 4; ++tr) {
      const int ta = tr >> 1, tb = tr & 1;
      if (!s.all_trans && tr != 1) continue;
      for (int workers = 1; workers <= 2; ++workers) {
        const std::string tag = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + "/" +
                                names[tr] + "/threads:" + std::to_string(workers);
        const long m = s.m, n = s.n, k = s.k;
        const bool a_t = ta != 0, b_t = tb != 0;
        for (host::Isa isa : {host::Isa::avx512, host::Isa::avx2}) {
          if (host::cpu_features().best < isa) continue;
          benchmark::RegisterBenchmark(("gemm/host-" + std::string(host::isa_name(isa)) + "/" + tag).c_str(),
                                       [=](benchmark::State& st) { host_case(st, m, n, k, a_t, b_t, workers, isa); })
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
        }
        benchmark::RegisterBenchmark(("gemm/eigen/" + tag).c_str(),
                                     [=](benchmark::State& st) { eigen_case(st, m, n, k, a_t, b_t, workers); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
        if (openblas.sgemm)
          benchmark::RegisterBenchmark(("gemm/openblas/" + tag).c_str(),
                                       [=](benchmark::State& st) { openblas_case(st, m, n, k, a_t, b_t, workers); })
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
      }
    }
  }
  return 0;
}

}  // namespace

BENCHMARK(host_gemm_nt)->Name("gemm/host_arena_panels_2048x768x768")->Unit(benchmark::kMillisecond);
BENCHMARK(eigen_nt)->Name("gemm/eigen_product_2048x768x768")->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  std::fprintf(stderr, "%s\n", host::cpu_report().c_str());
  load_openblas();
  register_cases();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
