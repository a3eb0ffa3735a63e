// Built as a consumer with the compiler's default flags would build it (no
// -march: x86-64, SSE2; the target property HEADROOM_DEFAULT_FLAGS), this
// program still runs headroom's AVX2 and AVX-512 kernels where the CPU has
// them (host/cpu.hpp): the choice is the CPU's, not the build's. Then whole
// training steps under each kernel choice: headroom's AVX2 and AVX-512 GEMM
// tiles give the same bits (and the element loops are the same AVX2 code),
// so their losses and gradient norms are identical, step after step; the
// portable kernels (Eigen's product, scalar loops) agree to float rounding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <headroom/headroom.hpp>
#include <headroom/host/cpu.hpp>
#include <headroom/host/kernels/pointwise.hpp>
#include <headroom/train/host/trainer.hpp>
#include <vector>

#include "../runtime/support/fixtures.hpp"
#include "../runtime/support/kernel_choice.hpp"

using namespace headroom;

namespace {

#if defined(__AVX2__) || defined(__AVX512F__)
constexpr bool built_for_avx = true;
#else
constexpr bool built_for_avx = false;
#endif

constexpr models::LlamaConfig llama_cfg{64, 64, 128, 2, 4, 2, 64, false};
constexpr models::GPT2Config gpt2_cfg{64, 64, 2, 4, 64};
using LlamaRun = Train<models::Llama<llama_cfg>, Batch<4>, Seq<32>, Workers<2>>;
using GPT2Run = Train<models::GPT2<gpt2_cfg>, Batch<4>, Seq<32>, AdamW, Workers<2>>;
using LlamaBf16 = Train<models::Llama<llama_cfg>, Batch<4>, Seq<32>, Workers<2>, Precision<BF16>>;

const auto runnable = test::runnable_isas;

struct Trace {
  std::vector<double> loss, norm;
};

// Four steps from one seed with the kernels of `isa`.
template <class Run>
Trace train(host::Isa isa) {
  const test::IsaScope scope(isa);
  Trace t;
  host::Trainer<Run> tr({.seed = 5, .threads = 2, .lr = 3e-3, .clip_norm = 1.0});
  for (int s = 0; s < 4; ++s) {
    const test::Stream d(128, 40 + s);
    const auto r = tr.step(d.tok, d.tgt);
    t.loss.push_back(r.loss);
    t.norm.push_back(r.grad_norm);
  }
  return t;
}

// bf16 runs sum their products in different orders under each kernel (k
// in pairs on the AVX512_BF16 tile), so they agree within bf16's noise
// rather than to the bit.
template <class Run>
void same_training_under_every_kernel(double loss_eps = 1e-4, double norm_eps = 1e-3) {
  const auto choices = runnable();
  std::vector<Trace> traces;
  for (host::Isa i : choices) traces.push_back(train<Run>(i));
  for (std::size_t c = 1; c < choices.size(); ++c) {
    INFO(host::isa_name(choices[c]) << " against " << host::isa_name(choices[0]));
    for (std::size_t s = 0; s < traces[0].loss.size(); ++s) {
      INFO("step " << s);
      CHECK(traces[c].loss[s] == Approx(traces[0].loss[s]).epsilon(loss_eps));
      CHECK(traces[c].norm[s] == Approx(traces[0].norm[s]).epsilon(norm_eps));
    }
  }
  if (Run::config().dtype != DType::BF16 && choices.size() == 3) {  // AVX2 and AVX-512: the same bits
    CHECK(traces[1].loss == traces[2].loss);
    CHECK(traces[1].norm == traces[2].norm);
  }
}

}  // namespace

TEST_CASE("a default-flags build runs the best kernels this CPU has", "[host][dispatch]") {
  INFO(host::cpu_report());
  // This file is compiled without -march: if the compiler's own default
  // enables AVX2, the check below proves less (it still passes).
  if (built_for_avx) WARN("this compiler's default flags enable AVX2 or AVX-512");
  const host::CpuFeatures& f = host::cpu_features();
  CHECK(host::isa() == f.best);
  CHECK(f.avx512 == (f.best == host::Isa::avx512));
  CHECK(f.avx2_fma == (f.best >= host::Isa::avx2));
  CHECK(f.brand[0] != '\0');
  // the report names what was chosen
  CHECK_THAT(host::cpu_report(), Catch::Contains(std::string("kernels: ") + std::string(host::isa_name(f.best))));
}

TEST_CASE("use_isa refuses kernels the CPU cannot run, with a sentence", "[host][dispatch]") {
  const host::Isa best = host::cpu_features().best;
  if (best == host::Isa::avx512) {
    CHECK(host::use_isa(host::Isa::portable) == host::Isa::avx512);
    CHECK(host::use_isa(host::Isa::avx512) == host::Isa::portable);
  } else {
    CHECK_THROWS_WITH(host::use_isa(host::Isa::avx512), Catch::Contains("cannot run the avx512 kernels"));
  }
  CHECK(host::isa() == best);
}

TEST_CASE("training steps agree under every kernel choice: Llama (SwiGLU, RMSNorm, RoPE)", "[host][dispatch]") {
  same_training_under_every_kernel<LlamaRun>();
}

TEST_CASE("training steps agree under every kernel choice: GPT-2 (GELU, LayerNorm, tied head)", "[host][dispatch]") {
  same_training_under_every_kernel<GPT2Run>();
}

TEST_CASE("training steps agree under every kernel choice: Llama in bf16", "[host][dispatch][bf16]") {
  same_training_under_every_kernel<LlamaBf16>(5e-4, 5e-3);
}

// for_this_cpu (host/for_this_cpu.hpp) compiles the element and row loops a
// second time for AVX2 and picks that copy at run time: the source's
// arithmetic in the source's order, except that g++ contracts a * b + c into
// one FMA where the instruction exists (its default for C++, as in any
// -march=native build), which rounds once instead of twice. Each kernel here
// runs under the portable choice and under the CPU's best on the same inputs:
// the outputs agree to float rounding (measured: at most 2 float ulps of the
// largest element), and in bf16 to one bf16 rounding.
TEST_CASE("the row kernels' AVX2 copies agree with the portable copies", "[host][dispatch]") {
  const host::Isa best = host::cpu_features().best;
  if (best == host::Isa::portable) {
    WARN("this CPU has no AVX2: only the portable copy exists to run");
    return;
  }
  const auto run = [](host::Isa isa, auto zero) {
    using T = decltype(zero);
    using C = host::compute_t<T>;
    const test::IsaScope scope(isa);
    constexpr std::int64_t n = 37, d = 200, seq = 8;  // d: whole 8-lane chunks and a tail
    std::vector<T> x(n * d), f(n * d), dy(n * d), w(d), b(d);
    for (std::int64_t i = 0; i < n * d; ++i) {
      x[i] = host::narrow<T>(static_cast<C>(std::sin(0.37 * static_cast<double>(i)) * 1.7));
      f[i] = host::narrow<T>(static_cast<C>(std::cos(0.11 * static_cast<double>(i))));
      dy[i] = host::narrow<T>(static_cast<C>(std::sin(0.05 * static_cast<double>(i) + 1.0) * 0.3));
    }
    for (std::int64_t j = 0; j < d; ++j) {
      w[j] = host::narrow<T>(static_cast<C>(1.0 + 0.01 * static_cast<double>(j % 17)));
      b[j] = host::narrow<T>(static_cast<C>(0.02 * static_cast<double>(j % 5)));
    }
    std::vector<std::vector<T>> out;
    std::vector<C> mean(n), rstd(n), mean2(n), rstd2(n);
    std::vector<T> h(n * d), h2(n * d), dx(n * d), dx2(n * d, T{}), dw(d), db(d), s(n * d), dpos(seq * d);
    host::norm_forward(false, x.data(), w.data(), static_cast<const T*>(nullptr), h.data(), mean.data(), rstd.data(), n, d, 2);
    host::norm_forward(true, x.data(), w.data(), b.data(), h2.data(), mean2.data(), rstd2.data(), n, d, 2);
    host::norm_backward(false, x.data(), w.data(), mean.data(), rstd.data(), dy.data(), dx.data(), true, dw.data(), true,
                        static_cast<T*>(nullptr), true, n, d, 2);
    host::norm_backward(true, x.data(), w.data(), mean2.data(), rstd2.data(), dy.data(), dx2.data(), false, dw.data(), false,
                        db.data(), true, n, d, 2);
    host::add_forward(x.data(), f.data(), s.data(), n * d, 2);
    host::positions_backward(dy.data(), dpos.data(), true, 4, seq, seq, d, 2);
    out = {h, h2, dx, dx2, dw, db, s, dpos};
    std::vector<double> stats;
    for (std::int64_t r = 0; r < n; ++r)
      stats.insert(stats.end(), {static_cast<double>(rstd[r]), static_cast<double>(mean2[r]), static_cast<double>(rstd2[r])});
    return std::make_pair(out, stats);
  };
  const char* names[] = {"RMSNorm", "LayerNorm", "RMSNorm dx", "LayerNorm dx (added)", "dw", "db", "residual add",
                         "positions' gradient"};
  const auto agree = [&](auto zero, double tol) {
    const auto portable = run(host::Isa::portable, zero);
    const auto dispatched = run(best, zero);
    const auto close = [tol](const auto& p, const auto& q) {  // |p - q| <= tol * max |p|, element by element
      REQUIRE(p.size() == q.size());
      double scale = 0, worst = 0;
      for (std::size_t i = 0; i < p.size(); ++i) scale = std::max(scale, std::abs(static_cast<double>(host::widen(p[i]))));
      for (std::size_t i = 0; i < p.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(host::widen(p[i])) - static_cast<double>(host::widen(q[i]))));
      INFO("largest difference " << worst << ", largest magnitude " << scale);
      CHECK(scale > 0);
      CHECK(worst <= tol * scale);
    };
    {
      INFO("the rows' statistics");
      close(portable.second, dispatched.second);
    }
    for (std::size_t k = 0; k < portable.first.size(); ++k) {
      INFO(names[k]);
      close(portable.first[k], dispatched.first[k]);
    }
  };
  SECTION("float") { agree(0.0f, 1e-5); }
  SECTION("bf16") { agree(host::bf16{}, 1.0 / 128); }
}
