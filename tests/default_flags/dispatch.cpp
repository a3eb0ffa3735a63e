// Built as a consumer with the compiler's default flags would build it (no
// -march: x86-64, SSE2; the target property HEADROOM_DEFAULT_FLAGS), this
// program still runs headroom's AVX2 and AVX-512 kernels where the CPU has
// them (host/cpu.hpp): the choice is the CPU's, not the build's. Then whole
// training steps under each kernel choice: headroom's AVX2 and AVX-512 GEMM
// tiles give the same bits (and the element loops are the same AVX2 code),
// so their losses and gradient norms are identical, step after step; the
// portable kernels (Eigen's product, scalar loops) agree to float rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <headroom/headroom.hpp>
#include <headroom/host/cpu.hpp>
#include <headroom/host/trainer.hpp>
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
