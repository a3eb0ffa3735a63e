// The arena-fed host::gemm against Eigen's own product and the kept
// libraries' sgemm (OpenBLAS, BLIS, oneDNN), on the same shapes: the ceiling a training step's GEMMs can
// reach here. host::gemm runs once per kernel this CPU has (gemm/host-avx512,
// gemm/host-avx2; host/cpu.hpp), and on bf16 operands (gemm/host-bf16-...:
// the AVX512_BF16 tile, or the float tile on widened operands), and gemm/fma_peak/... measures the core's
// FMA rate (independent FMA chains, nothing loaded) with 256- and 512-bit
// vectors, the ceiling each kernel is judged against. The CPU and the
// kernels chosen are printed first (host::cpu_report()).
//
//   build/bench/gemm                                        everything (about 8 minutes)
//   build/bench/gemm --benchmark_filter='arena|product'     the headline pair (one thread)
//   build/bench/gemm --benchmark_filter='/nt/threads:1'     one case of every shape
//
// The first two benchmarks are the headline: C = A B^T, (2048 x 768) by
// (768 x 768), one thread. Then every shape below in the four transposition
// cases (nn, nt, tn, tt: op(A), op(B)) on 1 and 2 threads, host::gemm per
// kernel, then Eigen (the same product, Eigen::setNbThreads), then each
// library: the linear layer's forward is nt (X W^T), its dX nn (dY W), its dW
// tn (dY^T X).
//
// No library is linked: each is dlopen'ed at startup (see Library below),
// and one that is missing is not benchmarked (a line on stderr says why).
// OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which OpenBLAS reads when it is
// loaded, are unset before its dlopen so that it picks its own core for this
// CPU (stderr says which); bench/compare times every core instead.
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <Eigen/Dense>
#include <cstdio>
#include <cstdlib>
#include <headroom/host/bf16.hpp>
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

// bf16 operands, float C: the AVX512_BF16 tile where the CPU has it (isa
// avx512), else the float tile on operands widened while packing.
void host_bf16_case(benchmark::State& state, long m, long n, long k, bool ta, bool tb, int workers, host::Isa isa) {
  const host::Isa before = host::use_isa(isa);
  const Mat af = ta ? filled(k, m, 1) : filled(m, k, 1), bf = tb ? filled(n, k, 2) : filled(k, n, 2);
  std::vector<host::bf16> a(static_cast<std::size_t>(af.size())), b(static_cast<std::size_t>(bf.size()));
  for (long i = 0; i < af.size(); ++i) a[static_cast<std::size_t>(i)] = host::to_bf16(af.data()[i]);
  for (long i = 0; i < bf.size(); ++i) b[static_cast<std::size_t>(i)] = host::to_bf16(bf.data()[i]);
  Mat c(m, n);
  const std::int64_t per = GemmBlocking::panel_elements(m, n, k);
  std::vector<float, Eigen::aligned_allocator<float>> panels(static_cast<std::size_t>(per * workers));
  const host::GemmPanels<float> ws{panels.data(), per};
  const auto t = [](bool x) { return x ? host::Trans::yes : host::Trans::no; };
  for (auto _ : state) {
    host::gemm(t(ta), t(tb), m, n, k, 1.0f, a.data(), af.cols(), b.data(), bf.cols(), 0.0f, c.data(), n, ws, workers);
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

// The kept libraries, each through dlopen (none is linked; a library that
// is not installed is left out, with a line on stderr saying why):
//   openblas  libopenblas.so.0 (Debian libopenblas0-pthread): cblas_sgemm,
//             openblas_set_num_threads
//   blis      libblis.so.4 (libblis4-openmp): cblas_sgemm, bli_thread_set_num_threads
//   onednn    libdnnl.so.2 (libdnnl2): dnnl_sgemm (row-major), its OpenMP
//             threads from omp_set_num_threads
struct Library {
  using Cblas = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
  using Dnnl = int (*)(char transa, char transb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc);
  using SetThreads = void (*)(int);
  static constexpr int row_major = 101, no_trans = 111, trans = 112;
  std::string name;
  Cblas cblas = nullptr;
  Dnnl dnnl = nullptr;
  SetThreads set_threads = nullptr;

  void threads(int n) const {
    if (set_threads) set_threads(n);
#ifdef _OPENMP
    else omp_set_num_threads(n);
#endif
  }
  void sgemm(bool ta, bool tb, long m, long n, long k, const float* a, long lda, const float* b, long ldb, float* c,
             long ldc) const {
    if (dnnl) {
      dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
      return;
    }
    const auto i = [](long x) { return static_cast<int>(x); };
    cblas(row_major, ta ? trans : no_trans, tb ? trans : no_trans, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), 0.0f,
          c, i(ldc));
  }
};
std::vector<Library> libraries;

// Loads OpenBLAS, first unsetting the environment that OpenBLAS reads at
// load time (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE: OpenBLAS then picks its
// core for this CPU); says on stderr what it did.
void load_openblas() {
  constexpr const char* lib = "libopenblas.so.0";
  const bool preloaded = dlopen(lib, RTLD_NOW | RTLD_NOLOAD) != nullptr;  // e.g. LD_PRELOAD: too late to unset
  for (const char* var : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}) {
    const char* value = std::getenv(var);
    if (!value) {
      std::fprintf(stderr, "openblas: %s is not set\n", var);
    } else if (preloaded) {
      std::fprintf(stderr,
                   "openblas: %s=%s is set and %s was loaded before main, so it applies; for OpenBLAS's own pick, run "
                   "under `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`\n",
                   var, value, lib);
    } else {
      std::fprintf(stderr, "openblas: %s=%s is set; unsetting it before loading %s, so OpenBLAS picks its core\n", var,
                   value, lib);
      unsetenv(var);
    }
  }
  void* handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    std::fprintf(stderr, "openblas: not benchmarked: dlopen(\"%s\") failed: %s\n", lib, err ? err : "unknown error");
    return;
  }
  Library l{"openblas"};
  l.cblas = reinterpret_cast<Library::Cblas>(dlsym(handle, "cblas_sgemm"));
  l.set_threads = reinterpret_cast<Library::SetThreads>(dlsym(handle, "openblas_set_num_threads"));
  if (!l.cblas || !l.set_threads) {
    std::fprintf(stderr, "openblas: not benchmarked: %s lacks cblas_sgemm or openblas_set_num_threads\n", lib);
    return;
  }
  using Corename = char* (*)();
  if (const auto core = reinterpret_cast<Corename>(dlsym(handle, "openblas_get_corename")))
    std::fprintf(stderr, "openblas: %s loaded, core %s; benchmarked as gemm/openblas/...\n", lib, core());
  libraries.push_back(l);
}

void load_blis() {
  void* handle = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "blis: not benchmarked: %s\n", dlerror());
    return;
  }
  Library l{"blis"};
  l.cblas = reinterpret_cast<Library::Cblas>(dlsym(handle, "cblas_sgemm"));
  l.set_threads = reinterpret_cast<Library::SetThreads>(dlsym(handle, "bli_thread_set_num_threads"));
  if (!l.cblas || !l.set_threads) {
    std::fprintf(stderr, "blis: not benchmarked: libblis.so.4 lacks cblas_sgemm or bli_thread_set_num_threads\n");
    return;
  }
  std::fprintf(stderr, "blis: libblis.so.4 loaded; benchmarked as gemm/blis/...\n");
  libraries.push_back(l);
}

void load_onednn() {
  void* handle = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "onednn: not benchmarked: %s\n", dlerror());
    return;
  }
  Library l{"onednn"};
  l.dnnl = reinterpret_cast<Library::Dnnl>(dlsym(handle, "dnnl_sgemm"));
  if (!l.dnnl) {
    std::fprintf(stderr, "onednn: not benchmarked: libdnnl.so.2 lacks dnnl_sgemm\n");
    return;
  }
  std::fprintf(stderr, "onednn: libdnnl.so.2 loaded; benchmarked as gemm/onednn/... (its OpenMP threads)\n");
  libraries.push_back(l);
}

void library_case(benchmark::State& state, const Library& lib, long m, long n, long k, bool ta, bool tb, int workers) {
  lib.threads(workers);
  const Mat a = ta ? filled(k, m, 1) : filled(m, k, 1), b = tb ? filled(n, k, 2) : filled(k, n, 2);
  Mat c(m, n);
  for (auto _ : state) {
    lib.sgemm(ta, tb, m, n, k, a.data(), a.cols(), b.data(), b.cols(), c.data(), n);
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
          const bool pairs = isa == host::Isa::avx512 && host::cpu_features().avx512_bf16;
          benchmark::RegisterBenchmark(
              ("gemm/host-bf16-" + std::string(pairs ? "avx512_bf16" : isa == host::Isa::avx512 ? "avx512-widened" : "avx2-widened") +
               "/" + tag)
                  .c_str(),
              [=](benchmark::State& st) { host_bf16_case(st, m, n, k, a_t, b_t, workers, isa); })
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
        }
        benchmark::RegisterBenchmark(("gemm/eigen/" + tag).c_str(),
                                     [=](benchmark::State& st) { eigen_case(st, m, n, k, a_t, b_t, workers); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
        for (std::size_t l = 0; l < libraries.size(); ++l)
          benchmark::RegisterBenchmark(("gemm/" + libraries[l].name + "/" + tag).c_str(),
                                       [=](benchmark::State& st) { library_case(st, libraries[l], m, n, k, a_t, b_t, workers); })
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
  load_blis();
  load_onednn();
  register_cases();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
