// Host causal attention (host/attention.hpp), float: forward and backward
// throughput for 1 and 2 workers on two shapes,
//   llama-like  B=4, T=256, 4 heads / 2 kv heads, head_dim 64, RoPE, separate q, k, v
//   gpt2        B=1, T=1024, 12 heads, head_dim 64, no RoPE, q|k|v fused (stride 3D)
// GFLOP/s counts the FLOPs the plan charges (layers/attention.hpp): forward
// 2 B H T^2 hd (the causal half of QK^T and PV), backward 5 B H T^2 hd. The
// kernels also compute the masked half of each diagonal tile, not counted.
// Built without OpenMP, every worker count runs on one thread; the label says so.
#include <benchmark/benchmark.h>

#include <headroom/host/attention.hpp>

#include <cstdint>
#include <random>
#include <vector>

namespace {

using headroom::host::AttentionDims;
namespace host = headroom::host;

struct Shape {
  AttentionDims d;
  bool fused;  // q, k, v inside one (N, 3D) buffer
};

const Shape llama_like{{4, 256, 4, 2, 64, true, 10000.0}, false};
const Shape gpt2{{1, 1024, 12, 12, 64, false, 10000.0}, true};

// Inputs and outputs of one shape, filled once.
struct Problem {
  AttentionDims d;
  std::int64_t ldq, ldk, ldv;
  std::vector<float> qkv, q_buf, k_buf, v_buf, o, lse, dout, dqkv, dq_buf, dk_buf, dv_buf;
  const float *q, *k, *v;
  float *dq, *dk, *dv;

  explicit Problem(const Shape& s) : d(s.d) {
    const std::int64_t N = d.batch * d.seq, wq = d.heads * d.head_dim, wkv = d.kv_heads * d.head_dim;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto filled = [&](std::int64_t n) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (auto& e : x) e = nd(rng);
      return x;
    };
    if (s.fused) {
      ldq = ldk = ldv = wq + 2 * wkv;
      qkv = filled(N * ldq);
      dqkv.assign(qkv.size(), 0.0f);
      q = qkv.data(), k = qkv.data() + wq, v = qkv.data() + wq + wkv;
      dq = dqkv.data(), dk = dqkv.data() + wq, dv = dqkv.data() + wq + wkv;
    } else {
      ldq = wq, ldk = ldv = wkv;
      q_buf = filled(N * wq), k_buf = filled(N * wkv), v_buf = filled(N * wkv);
      dq_buf.assign(q_buf.size(), 0.0f), dk_buf.assign(k_buf.size(), 0.0f), dv_buf.assign(v_buf.size(), 0.0f);
      q = q_buf.data(), k = k_buf.data(), v = v_buf.data();
      dq = dq_buf.data(), dk = dk_buf.data(), dv = dv_buf.data();
    }
    o.assign(static_cast<std::size_t>(N * wq), 0.0f);
    lse.assign(static_cast<std::size_t>(d.batch * d.heads * d.seq), 0.0f);
    dout = filled(N * wq);
  }
  double flops_fwd() const {
    return 2.0 * static_cast<double>(d.batch * d.heads) * static_cast<double>(d.seq * d.seq) * static_cast<double>(d.head_dim);
  }
};

void label(benchmark::State& state) {
#ifndef _OPENMP
  state.SetLabel("no OpenMP: sequential");
#else
  (void)state;
#endif
}

void forward(benchmark::State& state, Shape shape) {
  const int workers = static_cast<int>(state.range(0));
  Problem p(shape);
  std::vector<float> scratch(static_cast<std::size_t>(host::attention_forward_scratch(p.d, workers)));
  for (auto _ : state) {
    host::attention_forward<float>(p.d, p.q, p.ldq, p.k, p.ldk, p.v, p.ldv, p.o.data(), p.lse.data(), scratch.data(),
                                   workers);
    benchmark::DoNotOptimize(p.o.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(p.flops_fwd() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  label(state);
}

void backward(benchmark::State& state, Shape shape) {
  const int workers = static_cast<int>(state.range(0));
  Problem p(shape);
  std::vector<float> scratch(static_cast<std::size_t>(
      std::max(host::attention_forward_scratch(p.d, workers), host::attention_backward_scratch(p.d, workers))));
  host::attention_forward<float>(p.d, p.q, p.ldq, p.k, p.ldk, p.v, p.ldv, p.o.data(), p.lse.data(), scratch.data(),
                                 workers);
  for (auto _ : state) {
    host::attention_backward<float>(p.d, p.q, p.ldq, p.k, p.ldk, p.v, p.ldv, p.o.data(), p.lse.data(), p.dout.data(),
                                    p.dq, p.ldq, p.dk, p.ldk, p.dv, p.ldv, scratch.data(), workers);
    benchmark::DoNotOptimize(p.dq);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.5 * p.flops_fwd() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  label(state);
}

}  // namespace

BENCHMARK_CAPTURE(forward, llama_like_b4_t256_h4_kv2_hd64, llama_like)
    ->Arg(1)->Arg(2)->ArgName("workers")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(backward, llama_like_b4_t256_h4_kv2_hd64, llama_like)
    ->Arg(1)->Arg(2)->ArgName("workers")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(forward, gpt2_b1_t1024_h12_hd64, gpt2)
    ->Arg(1)->Arg(2)->ArgName("workers")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(backward, gpt2_b1_t1024_h12_hd64, gpt2)
    ->Arg(1)->Arg(2)->ArgName("workers")->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
