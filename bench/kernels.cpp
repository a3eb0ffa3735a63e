// Microbenchmarks of the host kernels (include/headroom/host/), each against
// a ceiling measured on this machine in the same run:
//
//   sgemm ceiling      Eigen's own single-thread product c = a b^T (row-major,
//                      a projection's forward) at n 1024 x in 768 x out 768
//                      and x out 3072: the better of the two, each the fastest
//                      of 30 / 8 products (~1.5 s before the benchmarks).
//                      GEMM-type benchmarks report GFLOP/s and
//                      of_ceiling = GFLOP/s / (workers x ceiling). host::gemm's
//                      own AVX2 kernel can pass it (of_ceiling > 1); the run's
//                      context also prints the core's FMA peak.
//   bandwidth ceiling  two STREAM-like loops over 64 MiB arrays (twice the
//                      32 MiB L3 of the machine it was written on), 12 B per
//                      element each: the triad a = b + s c, and the in-place
//                      a += s b. The cache reads a line before writing it, so
//                      the triad moves 16 B per 12 counted while the in-place
//                      loop moves 12; the optimizers update in place, the
//                      activations and norms write new arrays. The ceiling is
//                      the better of the two, each the fastest of 40 passes,
//                      with 1 and with 2 threads (a team, as the kernels split
//                      work). Memory-bound benchmarks report GB/s (1e9 B) and
//                      of_bandwidth = GB/s / ceiling at the same worker count.
//
// Counting: a GEMM of (m, n, k) is 2 m n k FLOPs; epilogues, dequantization,
// softmax exponentials are not counted (they are the overhead the figures
// show). LoRA counts its low-rank GEMMs only. Attention counts the causal half
// as bench/attention.cpp does (forward 2 B H T^2 hd, backward 5 B H T^2 hd).
// Bytes are each array's compulsory traffic, once: what the kernel must read
// and write at the least (a second pass over an input is not counted again; a
// write counts once, as STREAM counts it, though a cache writes-allocate).
// Element-wise and optimizer buffers are 16 Mi elements (64 MiB each), norms
// 16384 x 768 (48 MiB per tensor): all larger than the L3, so GB/s is DRAM
// bandwidth, comparable with the streams.
//
// Every benchmark takes its worker count as the argument (1 and 2; the
// kernels' `workers`). Buffers, GEMM panels and scratch are 64-byte aligned,
// as the arena gives them. Each iteration is timed (UseManualTime: the Time
// column is the mean): with 1 worker by the calling thread's CPU time (the
// kernel runs on that thread alone, so time the machine gave other processes
// is left out), with 2 by wall-clock time (a team waits for its slowest
// thread: on a busy machine these figures measure the contention too). The
// single-thread ceilings are timed the same way. GFLOP/s and GB/s are those
// of the fastest iteration, as each ceiling is its fastest repetition.
// Console output prints values below 1 with SI prefixes (0.93 shows as 930m);
// the label repeats the fraction in percent.
//
//   build/bench/kernels [--benchmark_filter=REGEX] [--benchmark_min_time=0.5]
#include <benchmark/benchmark.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#include <headroom/core/quant_format.hpp>
#include <headroom/host/attention.hpp>
#include <headroom/host/gemm.hpp>
#include <headroom/host/kernels/linear.hpp>
#include <headroom/host/kernels/lm_head.hpp>
#include <headroom/host/kernels/optimizer.hpp>
#include <headroom/host/kernels/pointwise.hpp>
#include <headroom/host/parallel.hpp>
#include <headroom/host/quant.hpp>
#include <headroom/math/dynamic_map.hpp>
#include <headroom/math/optim.hpp>
#include <headroom/optim/adamw.hpp>
#include <headroom/optim/adamw8bit.hpp>
#include <headroom/optim/sgd.hpp>
#include <new>
#include <string>
#include <utility>

namespace {

namespace host = headroom::host;
namespace math = headroom::math;
using headroom::AdamW;
using headroom::AdamW8bit;
using headroom::ceil_div;
using headroom::GemmBlocking;
using headroom::QuantDesc;
using headroom::Ratio;
using headroom::SGD;
using headroom::StateAt;
using i64 = std::int64_t;
// Seconds since an arbitrary start: the calling thread's CPU time (one
// worker), or wall-clock time (a team of several).
double now(bool thread_cpu) {
  if (thread_cpu) {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------
// Buffers: 64-byte aligned, filled with cheap deterministic values
// ---------------------------------------------------------------------------
template <class T>
class Buf {
 public:
  Buf() = default;
  explicit Buf(i64 count) : n_(count) {
    const std::size_t bytes = std::max<std::size_t>(64, (static_cast<std::size_t>(count) * sizeof(T) + 63) / 64 * 64);
    p_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (p_ == nullptr) throw std::bad_alloc();
    std::memset(static_cast<void*>(p_), 0, bytes);  // touch every page now, not inside a timed loop
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  Buf& operator=(Buf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~Buf() { std::free(p_); }
  T* data() const { return p_; }
  i64 size() const { return n_; }

 private:
  T* p_ = nullptr;
  i64 n_ = 0;
};

inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// uniform in [-scale, scale) (offset: added, for strictly positive buffers)
void fill(float* p, i64 n, float scale, std::uint64_t seed, float offset = 0.0f) {
  for (i64 i = 0; i < n; ++i) {
    const float u = static_cast<float>(mix(seed * 0x100000001b3ull + static_cast<std::uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    p[i] = offset + scale * (2.0f * u - 1.0f);
  }
}
Buf<float> filled(i64 n, float scale, std::uint64_t seed, float offset = 0.0f) {
  Buf<float> b(n);
  fill(b.data(), n, scale, seed, offset);
  return b;
}

// Panels for any GEMM the kernels here run (the plan's largest per-worker size).
struct Panels {
  Buf<float> buf;
  host::GemmPanels<float> ws;
  explicit Panels(int workers) {
    const i64 per = GemmBlocking::panel_elements(1 << 20, 1 << 20, 1 << 20);
    buf = Buf<float>(per * workers);
    ws = host::GemmPanels<float>{buf.data(), per};
  }
};

// ---------------------------------------------------------------------------
// The ceilings, measured once in main() before the benchmarks
// ---------------------------------------------------------------------------
constexpr i64 n_tokens = 1024;  // B4 x T256
constexpr i64 d_model = 768, d_ff = 3072;

double sgemm_ceiling = 0;          // GFLOP/s, one thread
double sgemm_at[2] = {0, 0};       // at out 768 and out 3072
double triad_gbs[3] = {0, 0, 0}, inplace_gbs[3] = {0, 0, 0};  // at 1 and 2 threads
double bandwidth_ceiling[3] = {0, 0, 0};                        // the better of the two
double memcpy_gbs = 0;                                          // one thread, for the record

// The fastest of `reps` runs of f, after one warm-up run, on `workers` threads.
template <class F>
double best_seconds(int reps, int workers, F&& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now(workers == 1);
    f();
    best = std::min(best, now(workers == 1) - t0);
  }
  return best;
}

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

double eigen_sgemm_gflops(i64 m, i64 k, i64 n_out) {
  RowMat a = RowMat::Random(m, k), b = RowMat::Random(n_out, k), c(m, n_out);
  const double s = best_seconds(n_out > 1024 ? 8 : 30, 1, [&] {
    c.noalias() = a * b.transpose();
    benchmark::DoNotOptimize(c.data());
  });
  return 2.0 * m * k * n_out / s * 1e-9;
}

constexpr i64 stream_elements = i64{1} << 24;  // 64 MiB per array

void triad(float* a, const float* b, const float* c, i64 n, int workers) {
  host::team(workers, [&](int w, int count) {
    const host::Range r = host::share(n, count, w);
    for (i64 i = r.begin; i < r.end; ++i) a[i] = b[i] + 3.0f * c[i];
  });
}
void inplace(float* a, const float* b, i64 n, int workers) {
  host::team(workers, [&](int w, int count) {
    const host::Range r = host::share(n, count, w);
    for (i64 i = r.begin; i < r.end; ++i) a[i] += 1e-3f * b[i];
  });
}

// For the record: the core's FMA throughput (12 independent 8-lane chains),
// 2 FLOPs per lane per FMA; 0 where the build has no AVX2 + FMA.
double fma_peak_gflops() {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr int chains = 12;
  constexpr i64 steps = 1 << 22;
  __m256 acc[chains];
  for (int j = 0; j < chains; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  const double s = best_seconds(5, 1, [&] {
    for (i64 i = 0; i < steps; ++i)
      for (int j = 0; j < chains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, c);
    for (int j = 0; j < chains; ++j) benchmark::DoNotOptimize(acc[j]);
  });
  return 2.0 * 8 * chains * static_cast<double>(steps) / s * 1e-9;
#else
  return 0;
#endif
}
double fma_peak = 0;

void measure_ceilings() {
  fma_peak = fma_peak_gflops();
  sgemm_at[0] = eigen_sgemm_gflops(n_tokens, d_model, d_model);
  sgemm_at[1] = eigen_sgemm_gflops(n_tokens, d_model, d_ff);
  sgemm_ceiling = std::max(sgemm_at[0], sgemm_at[1]);
  Buf<float> a = filled(stream_elements, 1, 1), b = filled(stream_elements, 1, 2), c = filled(stream_elements, 1, 3);
  const double bytes = 12.0 * stream_elements;
  for (int w = 1; w <= 2; ++w) {
    triad_gbs[w] = bytes / best_seconds(40, w, [&] {
                     triad(a.data(), b.data(), c.data(), stream_elements, w);
                     benchmark::ClobberMemory();
                   }) * 1e-9;
    inplace_gbs[w] = bytes / best_seconds(40, w, [&] {
                       inplace(a.data(), b.data(), stream_elements, w);
                       benchmark::ClobberMemory();
                     }) * 1e-9;
    bandwidth_ceiling[w] = std::max(triad_gbs[w], inplace_gbs[w]);
  }
  memcpy_gbs = 8.0 * stream_elements / best_seconds(15, 1, [&] {
                 std::memcpy(a.data(), b.data(), stream_elements * sizeof(float));
                 benchmark::ClobberMemory();
               }) * 1e-9;
}

// ---------------------------------------------------------------------------
// Timing and counters
// ---------------------------------------------------------------------------
// Runs the timed loop; returns the fastest iteration's seconds (the Time
// column is the mean).
template <class F>
double timed(benchmark::State& state, F&& body) {
  const bool thread_cpu = state.range(0) == 1;
  double best = 1e30;
  for (auto _ : state) {
    const double t0 = now(thread_cpu);
    body();
    benchmark::ClobberMemory();
    const double s = now(thread_cpu) - t0;
    state.SetIterationTime(s);
    best = std::min(best, s);
  }
  return best;
}

std::string percent(double f, const char* of) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.0f%% of %s", 100.0 * f, of);
#ifndef _OPENMP
  return std::string(buf) + "; no OpenMP: sequential";
#else
  return buf;
#endif
}

int workers_of(const benchmark::State& state) { return static_cast<int>(state.range(0)); }

void report_flops(benchmark::State& state, double flops_per_iteration, double fastest) {
  const double gflops = flops_per_iteration / fastest * 1e-9;
  const double of = gflops / (workers_of(state) * sgemm_ceiling);
  state.counters["GFLOP/s"] = gflops;
  state.counters["of_ceiling"] = of;
  state.SetLabel(percent(of, "sgemm ceiling"));
}

void report_bytes(benchmark::State& state, double bytes_per_iteration, double fastest) {
  const double gbs = bytes_per_iteration / fastest * 1e-9;
  const double of = gbs / bandwidth_ceiling[workers_of(state)];
  state.counters["GB/s"] = gbs;
  state.counters["of_bandwidth"] = of;
  state.SetLabel(percent(of, "bandwidth ceiling"));
}

// ---------------------------------------------------------------------------
// Ceilings as benchmarks (the in-run figures the fractions divide by)
// ---------------------------------------------------------------------------
void bm_eigen_sgemm(benchmark::State& state, i64 out) {
  RowMat a = RowMat::Random(n_tokens, d_model), b = RowMat::Random(out, d_model), c(n_tokens, out);
  const double s = timed(state, [&] {
    c.noalias() = a * b.transpose();
    benchmark::DoNotOptimize(c.data());
  });
  report_flops(state, 2.0 * n_tokens * d_model * out, s);
}

void bm_triad(benchmark::State& state) {
  const int w = workers_of(state);
  Buf<float> a = filled(stream_elements, 1, 1), b = filled(stream_elements, 1, 2), c = filled(stream_elements, 1, 3);
  const double s = timed(state, [&] { triad(a.data(), b.data(), c.data(), stream_elements, w); });
  report_bytes(state, 12.0 * stream_elements, s);
}
void bm_inplace(benchmark::State& state) {
  const int w = workers_of(state);
  Buf<float> a = filled(stream_elements, 1, 1), b = filled(stream_elements, 1, 2);
  const double s = timed(state, [&] { inplace(a.data(), b.data(), stream_elements, w); });
  report_bytes(state, 12.0 * stream_elements, s);
}

// ---------------------------------------------------------------------------
// Dense projections: y (n, out) = x (n, in) W^T
// ---------------------------------------------------------------------------
struct Dense {
  i64 n, in, out;
  Buf<float> x, w, bias, y, act, dy, dx, dw;
  Dense(i64 n_, i64 in_, i64 out_)
      : n(n_), in(in_), out(out_),
        x(filled(n * in, 1.0f, 11)), w(filled(out * in, 0.02f, 12)), bias(filled(out, 0.02f, 13)), y(n * out),
        act(n * out), dy(filled(n * out, 1e-3f, 14)), dx(n * in), dw(out * in) {}
  double gemm_flops() const { return 2.0 * n * in * out; }
};

void bm_linear_forward(benchmark::State& state, i64 in, i64 out) {
  const int w = workers_of(state);
  Dense p(n_tokens, in, out);
  Panels ws(w);
  const double s = timed(state, [&] {
    host::linear_forward<float>(p.x.data(), p.w.data(), p.y.data(), p.n, p.in, p.out, {}, ws.ws, w);
  });
  report_flops(state, p.gemm_flops(), s);
}

void bm_linear_forward_bias_gelu(benchmark::State& state, i64 in, i64 out) {
  const int w = workers_of(state);
  Dense p(n_tokens, in, out);
  Panels ws(w);
  const host::Epilogue<float> ep{p.bias.data(), host::Fused::gelu, p.act.data(), nullptr};
  const double s = timed(state, [&] {
    host::linear_forward<float>(p.x.data(), p.w.data(), p.y.data(), p.n, p.in, p.out, ep, ws.ws, w);
  });
  report_flops(state, p.gemm_flops(), s);
}

// dx = dy W (overwritten: the first gradient of x) and dW = dy^T x (overwritten)
void bm_linear_backward(benchmark::State& state, i64 in, i64 out) {
  const int w = workers_of(state);
  Dense p(n_tokens, in, out);
  Panels ws(w);
  const double s = timed(state, [&] {
    host::linear_backward<float>(p.dy.data(), p.x.data(), p.w.data(), p.dx.data(), true, p.dw.data(), true, nullptr, false, p.n,
                                 p.in, p.out, ws.ws, w);
  });
  report_flops(state, 2.0 * p.gemm_flops(), s);
}

// ---------------------------------------------------------------------------
// LoRA (rank 16), accumulating into the base output / the base's dx
// ---------------------------------------------------------------------------
constexpr i64 lora_rank = 16;
constexpr float lora_scale = 2.0f;  // alpha 32 / r 16

struct Lora {
  i64 n, in, out, r;
  Buf<float> x, a, b, ax, y, dy, dax, da, db, dx;
  Lora(i64 n_, i64 in_, i64 out_, i64 r_)
      : n(n_), in(in_), out(out_), r(r_),
        x(filled(n * in, 1.0f, 21)), a(filled(r * in, 0.03f, 22)), b(filled(out * r, 0.01f, 23)), ax(filled(n * r, 0.1f, 24)),
        y(filled(n * out, 0.1f, 25)), dy(filled(n * out, 1e-3f, 26)), dax(n * r), da(r * in), db(out * r), dx(filled(n * in, 1e-3f, 27)) {}
};

void bm_lora_forward(benchmark::State& state, i64 in, i64 out) {
  const int w = workers_of(state);
  Lora p(n_tokens, in, out, lora_rank);
  Panels ws(w);
  const double s = timed(state, [&] {
    host::lora_forward<float>(p.x.data(), p.a.data(), p.b.data(), p.ax.data(), p.y.data(), lora_scale, p.n, p.in, p.out, p.r, ws.ws,
                              w);
  });
  report_flops(state, 2.0 * p.n * p.r * (p.in + p.out), s);  // x A^T, then ax B^T
}

// dB, dax, dA (overwritten) and dx (+)= dax A, as when LoRA wraps a base projection
void bm_lora_backward(benchmark::State& state, i64 in, i64 out) {
  const int w = workers_of(state);
  Lora p(n_tokens, in, out, lora_rank);
  Panels ws(w);
  const double s = timed(state, [&] {
    host::lora_backward<float>(p.dy.data(), p.x.data(), p.ax.data(), p.a.data(), p.b.data(), p.dax.data(), p.da.data(), true,
                               p.db.data(), true, p.dx.data(), false, lora_scale, p.n, p.in, p.out, p.r, ws.ws, w);
  });
  report_flops(state, 4.0 * p.n * p.r * (p.in + p.out), s);  // dB, dax (out); dA, dx (in)
}

// ---------------------------------------------------------------------------
// Quantized projections: panel dequantization feeding the GEMM
// ---------------------------------------------------------------------------
struct Quant {
  i64 n, in, out;
  Buf<float> x, y, dy, dx, table;
  Buf<std::uint8_t> codes, scales;
  host::QuantView view;
  Quant(QuantDesc q, i64 n_, i64 in_, i64 out_)
      : n(n_), in(in_), out(out_),
        x(filled(n * in, 1.0f, 31)), y(n * out), dy(filled(n * out, 1e-3f, 32)), dx(n * in),
        table(std::max<i64>(1, q.table_bytes() / 4)), codes(q.code_bytes(out * in)), scales(q.scale_bytes(out * in)) {
    if (q.table_bytes() > 0) host::fill_quant_table(table.data(), q.double_quant);
    view = host::QuantView{q, codes.data(), scales.data(), q.table_bytes() > 0 ? table.data() : nullptr, out, in};
    Buf<float> dense = filled(out * in, 0.02f, 33);
    Buf<float> staging(view.blocks());
    host::quantize_rows(view, 0, out, dense.data(), staging.data());
    host::finish_double_quant(view, staging.data());
  }
};

void bm_quant_forward(benchmark::State& state, QuantDesc q, i64 in, i64 out) {
  const int w = workers_of(state);
  Quant p(q, n_tokens, in, out);
  Panels ws(w);
  Buf<float> panel(host::quant_panel_rows(w) * in);
  const double s = timed(state, [&] {
    host::quant_linear_forward<float>(p.x.data(), p.view, p.y.data(), p.n, {}, panel.data(), ws.ws, w);
  });
  report_flops(state, 2.0 * p.n * p.in * p.out, s);
}

void bm_quant_backward_input(benchmark::State& state, QuantDesc q, i64 in, i64 out) {
  const int w = workers_of(state);
  Quant p(q, n_tokens, in, out);
  Panels ws(w);
  Buf<float> panel(host::quant_panel_rows(w) * in);
  const double s = timed(state, [&] {
    host::quant_linear_backward_input<float>(p.dy.data(), p.view, p.dx.data(), true, p.n, panel.data(), ws.ws, w);
  });
  report_flops(state, 2.0 * p.n * p.in * p.out, s);
}

// ---------------------------------------------------------------------------
// Attention (the shapes of bench/attention.cpp)
// ---------------------------------------------------------------------------
struct AttnShape {
  host::AttentionDims d;
  bool fused;  // q, k, v in one (N, 3D) buffer
};
const AttnShape llama_like{{4, 256, 4, 2, 64, true, 10000.0}, false};
const AttnShape gpt2_like{{1, 1024, 12, 12, 64, false, 10000.0}, true};

struct Attn {
  host::AttentionDims d;
  i64 ldq, ldk, ldv;
  Buf<float> qkv, dqkv, o, lse, dout, scratch;
  const float *q, *k, *v;
  float *dq, *dk, *dv;
  Attn(const AttnShape& s, int workers) : d(s.d) {
    const i64 n = d.batch * d.seq, wq = d.heads * d.head_dim, wkv = d.kv_heads * d.head_dim;
    qkv = filled(n * (wq + 2 * wkv), 1.0f, 41);
    dqkv = Buf<float>(n * (wq + 2 * wkv));
    o = Buf<float>(n * wq);
    lse = Buf<float>(d.batch * d.heads * d.seq);
    dout = filled(n * wq, 1.0f, 42);
    scratch = Buf<float>(std::max(host::attention_forward_scratch(d, workers), host::attention_backward_scratch(d, workers)));
    if (s.fused) {  // (N, 3D) rows
      ldq = ldk = ldv = wq + 2 * wkv;
      q = qkv.data(), k = q + wq, v = k + wkv;
      dq = dqkv.data(), dk = dq + wq, dv = dk + wkv;
    } else {  // three dense buffers, back to back
      ldq = wq, ldk = ldv = wkv;
      q = qkv.data(), k = q + n * wq, v = k + n * wkv;
      dq = dqkv.data(), dk = dq + n * wq, dv = dk + n * wkv;
    }
  }
  double flops_fwd() const { return 2.0 * static_cast<double>(d.batch * d.heads) * static_cast<double>(d.seq * d.seq) * d.head_dim; }
  void forward(int w) { host::attention_forward<float>(d, q, ldq, k, ldk, v, ldv, o.data(), lse.data(), scratch.data(), w); }
};

void bm_attention_forward(benchmark::State& state, AttnShape shape) {
  const int w = workers_of(state);
  Attn p(shape, w);
  const double s = timed(state, [&] { p.forward(w); });
  report_flops(state, p.flops_fwd(), s);
}

void bm_attention_backward(benchmark::State& state, AttnShape shape) {
  const int w = workers_of(state);
  Attn p(shape, w);
  p.forward(w);
  const double s = timed(state, [&] {
    host::attention_backward<float>(p.d, p.q, p.ldq, p.k, p.ldk, p.v, p.ldv, p.o.data(), p.lse.data(), p.dout.data(), p.dq, p.ldq,
                                    p.dk, p.ldk, p.dv, p.ldv, p.scratch.data(), w);
  });
  report_flops(state, 2.5 * p.flops_fwd(), s);
}

// ---------------------------------------------------------------------------
// Fused, chunked LM head + cross-entropy
// ---------------------------------------------------------------------------
constexpr i64 lm_vocab = 50257, lm_chunk = 256;

void bm_lm_head(benchmark::State& state, bool grads) {
  const int w = workers_of(state);
  const i64 n = n_tokens, d = d_model, V = lm_vocab;
  Buf<float> h = filled(n * d, 1.0f, 51), wt = filled(V * d, 0.02f, 52), dh(n * d), dw(grads ? V * d : 0);
  Buf<float> scratch(lm_chunk * (V + 2));
  Buf<std::int32_t> targets(n);
  for (i64 i = 0; i < n; ++i) targets.data()[i] = static_cast<std::int32_t>(mix(static_cast<std::uint64_t>(i)) % V);
  Panels ws(w);
  double loss = 0;
  const double s = timed(state, [&] {
    loss = host::lm_head_loss<float>(h.data(), wt.data(), targets.data(), grads ? dh.data() : nullptr, true,
                                     grads ? dw.data() : nullptr, true, 1.0f / n, n, d, V, lm_chunk, scratch.data(), ws.ws, w);
    benchmark::DoNotOptimize(loss);
  });
  report_flops(state, (grads ? 3.0 : 1.0) * 2.0 * n * d * V, s);  // logits; dh = dz W; dW = dz^T h
}

// ---------------------------------------------------------------------------
// Optimizer passes over 16 Mi parameters
// ---------------------------------------------------------------------------
constexpr i64 optim_params = i64{1} << 24;

const math::AdamWStep<float> adam_step = math::adamw_step(math::AdamWHyper<float>{1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f}, 10);

// read p, g, m, v; write p, m, v: 28 B per parameter
void bm_adamw(benchmark::State& state) {
  const int w = workers_of(state);
  const i64 n = optim_params;
  Buf<float> p = filled(n, 0.02f, 61), g = filled(n, 1e-2f, 62), st(2 * n);
  fill(st.data(), n, 1e-3f, 63);
  fill(st.data() + n, n, 1e-5f, 64, 2e-5f);
  const StateAt at{reinterpret_cast<std::byte*>(st.data()), n, 0, &AdamW::desc};
  const double s = timed(state, [&] { host::optimizer_pass<AdamW>(p.data(), nullptr, g.data(), at, n, adam_step, 1.0f, nullptr, w); });
  report_bytes(state, 28.0 * n, s);
}

// read p, g, m and v codes; write p and the codes: 16 B per parameter, plus
// the two absmaxes per 256 read and written (16 / 256 B)
void bm_adamw8bit(benchmark::State& state) {
  const int w = workers_of(state);
  const i64 n = optim_params, blocks = ceil_div(n, math::adam8bit_block);
  Buf<float> p = filled(n, 0.02f, 71), g = filled(n, 1e-2f, 72), maps(512);
  AdamW8bit::fill_table(maps.data());
  Buf<std::uint8_t> st(8 * blocks + 2 * n);
  auto* absmax = reinterpret_cast<float*>(st.data());
  fill(absmax, blocks, 0.0f, 0, 1e-3f);            // m absmax
  fill(absmax + blocks, blocks, 0.0f, 0, 1e-5f);   // v absmax
  std::uint8_t* codes = st.data() + 8 * blocks;
  for (i64 i = 0; i < 2 * n; ++i) codes[i] = static_cast<std::uint8_t>(mix(static_cast<std::uint64_t>(i) + 7) >> 56);
  const double s = timed(state, [&] {
    host::optimizer_pass<AdamW8bit>(p.data(), nullptr, g.data(), StateAt{reinterpret_cast<std::byte*>(st.data()), n, 0, &AdamW8bit::desc}, n, adam_step, 1.0f,
                                    maps.data(), w);
  });
  report_bytes(state, 16.0 * n + 16.0 * blocks, s);
}

// with momentum: read p, g, buf; write p, buf: 20 B. without: read p, g; write p: 12 B
void bm_sgd(benchmark::State& state, bool momentum) {
  const int w = workers_of(state);
  const i64 n = optim_params;
  Buf<float> p = filled(n, 0.02f, 81), g = filled(n, 1e-2f, 82), buf(momentum ? n : 0);
  if (momentum) fill(buf.data(), n, 1e-2f, 83);
  const double s = timed(state, [&] {
    const math::SgdStep<float> step{1e-3f, momentum ? 0.9f : 0.0f, 0.0f};
    if (momentum)
      host::optimizer_pass<SGD<>>(p.data(), nullptr, g.data(), StateAt{reinterpret_cast<std::byte*>(buf.data()), n, 0, &SGD<>::desc}, n,
                                  step, 1.0f, nullptr, w);
    else
      host::optimizer_pass<SGD<Ratio<0>>>(p.data(), nullptr, g.data(), StateAt{nullptr, n, 0, &SGD<Ratio<0>>::desc}, n, step, 1.0f,
                                          nullptr, w);
  });
  report_bytes(state, (momentum ? 20.0 : 12.0) * n, s);
}

// ---------------------------------------------------------------------------
// Norms, GELU, SwiGLU
// ---------------------------------------------------------------------------
constexpr i64 norm_rows = 16384, norm_d = d_model;
constexpr i64 act_elements = i64{1} << 24;

// forward: read x, w (b); write h, rstd (mean)
void bm_norm_forward(benchmark::State& state, bool layer) {
  const int w = workers_of(state);
  const i64 n = norm_rows, d = norm_d;
  Buf<float> x = filled(n * d, 1.0f, 91), wt = filled(d, 0.1f, 92, 1.0f), b = filled(d, 0.1f, 93), h(n * d), mean(n), rstd(n);
  const double s = timed(state, [&] {
    host::norm_forward<float>(layer, x.data(), wt.data(), layer ? b.data() : nullptr, h.data(), layer ? mean.data() : nullptr,
                              rstd.data(), n, d, w);
  });
  report_bytes(state, 8.0 * n * d + (layer ? 8.0 : 4.0) * (n + d), s);
}

// backward into the residual stream's gradient (dx (+)=), dw (db) overwritten:
// read x, dh, dx, rstd (mean), w; write dx, dw (db). The second pass (column
// sums of dh * xhat) reads x and dh again; not counted.
void bm_norm_backward(benchmark::State& state, bool layer) {
  const int w = workers_of(state);
  const i64 n = norm_rows, d = norm_d;
  Buf<float> x = filled(n * d, 1.0f, 101), wt = filled(d, 0.1f, 102, 1.0f), b = filled(d, 0.1f, 103), h(n * d), mean(n), rstd(n);
  Buf<float> dh = filled(n * d, 1e-3f, 104), dx = filled(n * d, 1e-3f, 105), dw(d), db(d);
  host::norm_forward<float>(layer, x.data(), wt.data(), layer ? b.data() : nullptr, h.data(), layer ? mean.data() : nullptr,
                            rstd.data(), n, d, w);
  const double s = timed(state, [&] {
    host::norm_backward<float>(layer, x.data(), wt.data(), layer ? mean.data() : nullptr, rstd.data(), dh.data(), dx.data(), false,
                               dw.data(), true, layer ? db.data() : nullptr, true, n, d, w);
  });
  report_bytes(state, 16.0 * n * d + (layer ? 8.0 : 4.0) * n + (layer ? 12.0 : 8.0) * d, s);
}

// read x; write y: 8 B
void bm_gelu_forward(benchmark::State& state) {
  const int w = workers_of(state);
  const i64 n = act_elements;
  Buf<float> x = filled(n, 3.0f, 111), y(n);
  const double s = timed(state, [&] { host::gelu_forward<float>(x.data(), y.data(), n, w); });
  report_bytes(state, 8.0 * n, s);
}
// read x, dy; write dx (first): 12 B
void bm_gelu_backward(benchmark::State& state) {
  const int w = workers_of(state);
  const i64 n = act_elements;
  Buf<float> x = filled(n, 3.0f, 121), dy = filled(n, 1e-3f, 122), dx(n);
  const double s = timed(state, [&] { host::gelu_backward<float>(x.data(), dy.data(), dx.data(), true, n, w); });
  report_bytes(state, 12.0 * n, s);
}
// read gate, up; write y: 12 B
void bm_swiglu_forward(benchmark::State& state) {
  const int w = workers_of(state);
  const i64 n = act_elements;
  Buf<float> g = filled(n, 3.0f, 131), u = filled(n, 1.0f, 132), y(n);
  const double s = timed(state, [&] { host::swiglu_forward<float>(g.data(), u.data(), y.data(), n, w); });
  report_bytes(state, 12.0 * n, s);
}
// read gate, up, dy; write dgate, dup (first): 20 B
void bm_swiglu_backward(benchmark::State& state) {
  const int w = workers_of(state);
  const i64 n = act_elements;
  Buf<float> g = filled(n, 3.0f, 141), u = filled(n, 1.0f, 142), dy = filled(n, 1e-3f, 143), dg(n), du(n);
  const double s = timed(state, [&] {
    host::swiglu_backward<float>(g.data(), u.data(), dy.data(), dg.data(), true, du.data(), true, n, w);
  });
  report_bytes(state, 20.0 * n, s);
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------
template <class F, class... A>
void add(const std::string& name, F f, A... args) {
  benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { f(st, args...); })
      ->Arg(1)
      ->Arg(2)
      ->ArgName("workers")
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

std::string shape(i64 in, i64 out) { return "n1024_in" + std::to_string(in) + "_out" + std::to_string(out); }

void register_all() {
  for (i64 out : {d_model, d_ff})
    benchmark::RegisterBenchmark(("ceiling/eigen_sgemm/" + shape(d_model, out)).c_str(),
                                 [=](benchmark::State& st) { bm_eigen_sgemm(st, out); })
        ->Arg(1)
        ->ArgName("workers")
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  add("ceiling/stream_triad/64MiB_x3", bm_triad);
  add("ceiling/stream_inplace_axpy/64MiB_x2", bm_inplace);

  for (i64 out : {d_model, d_ff}) add("linear/forward/" + shape(d_model, out), bm_linear_forward, d_model, out);
  for (i64 out : {d_model, d_ff})
    add("linear/forward_bias_gelu/" + shape(d_model, out), bm_linear_forward_bias_gelu, d_model, out);
  for (i64 out : {d_model, d_ff}) add("linear/backward_dx_dw/" + shape(d_model, out), bm_linear_backward, d_model, out);

  for (i64 out : {d_model, d_ff}) add("lora_r16/forward/" + shape(d_model, out), bm_lora_forward, d_model, out);
  for (i64 out : {d_model, d_ff}) add("lora_r16/backward/" + shape(d_model, out), bm_lora_backward, d_model, out);

  const std::pair<const char*, QuantDesc> formats[] = {
      {"nf4", headroom::NF4::desc}, {"int4", headroom::Int4::desc}, {"int8", headroom::Int8::desc}};
  for (const auto& [fname, q] : formats) {
    for (i64 out : {d_model, d_ff})
      add(std::string("quant_") + fname + "/forward/" + shape(d_model, out), bm_quant_forward, q, d_model, out);
    for (i64 out : {d_model, d_ff})
      add(std::string("quant_") + fname + "/backward_input/" + shape(d_model, out), bm_quant_backward_input, q, d_model, out);
  }

  add("attention/forward/llama_b4_t256_h4_kv2_hd64", bm_attention_forward, llama_like);
  add("attention/backward/llama_b4_t256_h4_kv2_hd64", bm_attention_backward, llama_like);
  add("attention/forward/gpt2_b1_t1024_h12_hd64", bm_attention_forward, gpt2_like);
  add("attention/backward/gpt2_b1_t1024_h12_hd64", bm_attention_backward, gpt2_like);

  add("lm_head/loss_and_grads/n1024_d768_v50257_chunk256", bm_lm_head, true);
  add("lm_head/loss_only/n1024_d768_v50257_chunk256", bm_lm_head, false);

  add("optim/adamw/16Mi", bm_adamw);
  add("optim/adamw8bit/16Mi", bm_adamw8bit);
  add("optim/sgd_momentum/16Mi", bm_sgd, true);
  add("optim/sgd/16Mi", bm_sgd, false);

  add("norm/rms_forward/n16384_d768", bm_norm_forward, false);
  add("norm/rms_backward/n16384_d768", bm_norm_backward, false);
  add("norm/layer_forward/n16384_d768", bm_norm_forward, true);
  add("norm/layer_backward/n16384_d768", bm_norm_backward, true);

  add("act/gelu_forward/16Mi", bm_gelu_forward);
  add("act/gelu_backward/16Mi", bm_gelu_backward);
  add("act/swiglu_forward/16Mi", bm_swiglu_forward);
  add("act/swiglu_backward/16Mi", bm_swiglu_backward);
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Eigen::setNbThreads(1);  // Eigen's own products on one thread; the kernels split work themselves
  measure_ceilings();
  benchmark::AddCustomContext("kernels", host::cpu_report());
  benchmark::AddCustomContext("sgemm_ceiling_GFLOP/s",
                              fmt(sgemm_ceiling) + " (Eigen 1 thread; out 768: " + fmt(sgemm_at[0]) + ", out 3072: " +
                                  fmt(sgemm_at[1]) + "; 2 workers compare with twice this); the core's FMA peak " +
                                  fmt(fma_peak));
  benchmark::AddCustomContext("bandwidth_ceiling_GB/s",
                              fmt(bandwidth_ceiling[1]) + " (1 thread), " + fmt(bandwidth_ceiling[2]) + " (2 threads); triad " +
                                  fmt(triad_gbs[1]) + " / " + fmt(triad_gbs[2]) + ", in-place a += s b " + fmt(inplace_gbs[1]) +
                                  " / " + fmt(inplace_gbs[2]) + ", memcpy " + fmt(memcpy_gbs) + " (1 thread)");
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
