// The host engine's gradients against finite differences (in double), for
// every layer and the policy mixes; and the equivalences the policies
// promise (Checkpointed changes nothing, LoRA with B = 0 is its base,
// Accumulate<2> of two half batches is one whole batch, UpdateInBackward is
// the same update). Every trainer here also checks arena == plan.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"
#include "support/gradients.hpp"
#include "support/repeats.hpp"

#include <cmath>
#include <cstdint>
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
#include <string>
#include <vector>

using namespace headroom;

namespace {
using headroom::test::ids;

// Small enough to check every parameter in double, big enough to tile NF4 /
// Int8 blocks of 64 and to give RoPE, GQA and two blocks something to do.
constexpr models::LlamaConfig llama_test{48, 64, 128, 2, 4, 2, 64, false};
constexpr models::GPT2Config gpt2_test{48, 64, 2, 4, 32};

template <class M, class... Opts>
using F64Run = Train<M, Batch<2>, Seq<12>, Precision<DType::F64>, Workers<2>, Opts...>;

template <class Trainer>
void check_arena(const Trainer& t) {
  CHECK(t.arena_bytes(Tier::device) == Trainer::plan.peak_bytes(Tier::device));
  CHECK(t.arena_bytes(Tier::offload) == Trainer::plan.peak_bytes(Tier::offload));
}

// Central differences (of evaluate(), which runs no backward) on a spread of
// elements of every trainable parameter (the first and last under the
// sanitizers: support/repeats.hpp); LoRA's B given values first, so both
// adapters' gradients are checked for real.
template <class R>
void gradcheck(int per_param = test::repeats(6, 2)) {
  host::Trainer<R> t({.seed = 11});
  check_arena(t);
  test::perturb_lora_b(t);
  using Tr = host::Trainer<R>;
  const std::int64_t n = Tr::tokens_per_micro_batch;
  const auto tok = ids(n, 1, 48), tgt = ids(n, 2, 48);
  t.forward_backward(tok, tgt);
  int trainable = 0;
  for (std::size_t k = 0; k < Tr::param_count; ++k) trainable += Tr::param(k).trainable;
  REQUIRE(trainable > 0);
  const int checked = test::central_differences(t, per_param, [&] { return t.evaluate(tok, tgt); });
  CHECK(checked >= per_param * trainable);
}

using LlamaFull = models::Llama<llama_test>;
using LlamaLoRAAll = models::Llama<llama_test, Apply<LoRA<4>, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;
using LlamaQLoRACkpt = models::Llama<llama_test, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj>>, Apply<Checkpointed<>, EveryBlock>>;
using LlamaDQOffload = models::Llama<llama_test, Apply<Quantized<NF4DQ, LoRA<4>>, On<q_proj, k_proj, o_proj, down_proj>>,
                                     Apply<Offloaded<>, EveryBlock>>;
using LlamaCkptOffload = models::Llama<llama_test, Apply<LoRA<8, Linear<>, Ratio<16>>, On<v_proj, up_proj>>,
                                       Apply<Checkpointed<>, EveryBlock>, Apply<Offloaded<>, EveryBlock>>;
using LlamaFrozenK = models::Llama<llama_test, Apply<Frozen<>, On<k_proj, gate_proj>>>;
using GPT2Full = models::GPT2<gpt2_test>;
using GPT2IntQuant = models::GPT2<gpt2_test, Apply<Quantized<Int8>, On<c_fc>>, Apply<Quantized<Int4>, On<attn_c_proj>>>;
using GPT2LoRACkpt = models::GPT2<gpt2_test, Apply<LoRA<4>, On<c_attn, c_proj>>, Apply<Checkpointed<>, EveryBlock>>;
// a stack written by hand: Sequential, Residual, a biased Linear, an untied head
using Custom = Sequential<Embedding<48, 64>, Residual<Linear<64, 64, true>>, Residual<Sequential<RMSNorm<64>, Linear<64, 64>>>,
                          LayerNorm<64>, LMHeadLoss<48, 64, false>>;

}  // namespace

TEST_CASE("gradcheck: Llama (RMSNorm, RoPE, GQA, SwiGLU), full fine-tuning", "[host][gradcheck]") { gradcheck<F64Run<LlamaFull>>(); }
TEST_CASE("gradcheck: GPT-2 (LayerNorm, fused attention, GELU, biases, positions, tied head)", "[host][gradcheck]") {
  gradcheck<F64Run<GPT2Full>>();
}
TEST_CASE("gradcheck: LoRA on every Llama projection", "[host][gradcheck]") { gradcheck<F64Run<LlamaLoRAAll>>(); }
TEST_CASE("gradcheck: QLoRA (NF4) with checkpointed blocks", "[host][gradcheck]") { gradcheck<F64Run<LlamaQLoRACkpt>>(); }
TEST_CASE("gradcheck: NF4 with double quantization, LoRA, offloaded blocks", "[host][gradcheck]") {
  gradcheck<F64Run<LlamaDQOffload>>();
}
TEST_CASE("gradcheck: LoRA (alpha 16) with checkpointed and offloaded blocks", "[host][gradcheck]") {
  gradcheck<F64Run<LlamaCkptOffload>>();
}
TEST_CASE("gradcheck: Frozen projections", "[host][gradcheck]") { gradcheck<F64Run<LlamaFrozenK>>(); }
TEST_CASE("gradcheck: Int8 / Int4 quantized GPT-2 projections, the rest trained", "[host][gradcheck]") {
  gradcheck<F64Run<GPT2IntQuant>>();
}
TEST_CASE("gradcheck: GPT-2 with LoRA and checkpointing", "[host][gradcheck]") { gradcheck<F64Run<GPT2LoRACkpt>>(); }
TEST_CASE("gradcheck: a hand-written stack (Sequential, Residual, biased Linear, untied head)", "[host][gradcheck]") {
  gradcheck<F64Run<Custom>>();
}

namespace {
using test::all_grads;
template <class Trainer>
std::vector<double> all_weights(Trainer& t) {
  std::vector<double> w;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    if (p.quant.kind == QuantKind::none) w.insert(w.end(), t.weight(p), t.weight(p) + p.elements());
  }
  return w;
}
}  // namespace

TEST_CASE("Checkpointed<L> gives L's gradients", "[host]") {
  host::Trainer<F64Run<LlamaFull>> plain({.seed = 3});
  host::Trainer<F64Run<models::Llama<llama_test, Apply<Checkpointed<>, EveryBlock>>>> ckpt({.seed = 3});
  check_arena(ckpt);
  CHECK(ckpt.arena_bytes() < plain.arena_bytes());
  const auto tok = ids(24, 5, 48), tgt = ids(24, 6, 48);
  CHECK(plain.forward_backward(tok, tgt) == ckpt.forward_backward(tok, tgt));
  const auto a = all_grads(plain), b = all_grads(ckpt);
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  CHECK(worst == 0.0);  // recompute runs the same kernels on the same inputs
}

TEST_CASE("LoRA with B = 0 reproduces the base layer exactly", "[host]") {
  using Base = Train<LlamaFull, Batch<2>, Seq<12>>;
  using Adapted = Train<LlamaLoRAAll, Batch<2>, Seq<12>>;
  host::Trainer<Base> base({.seed = 9});
  host::Trainer<Adapted> lora({.seed = 9});
  check_arena(lora);
  const auto tok = ids(24, 7, 48), tgt = ids(24, 8, 48);
  CHECK(base.evaluate(tok, tgt) == lora.evaluate(tok, tgt));
}

TEST_CASE("Accumulate<2> over two sequences is one step over both", "[host]") {
  using One = Train<LlamaFull, Batch<2>, Seq<12>, Precision<DType::F64>>;
  using Two = Train<LlamaFull, Batch<1>, Seq<12>, Precision<DType::F64>, Accumulate<2>>;
  host::Trainer<One> a({.seed = 4, .lr = 1e-2});
  host::Trainer<Two> b({.seed = 4, .lr = 1e-2});
  check_arena(b);
  for (int s = 0; s < 3; ++s) {
    const auto tok = ids(24, 20 + s, 48), tgt = ids(24, 40 + s, 48);
    const auto sa = a.step(tok, tgt), sb = b.step(tok, tgt);
    CHECK(sa.loss == Approx(sb.loss).epsilon(1e-12));
    CHECK(sa.grad_norm == Approx(sb.grad_norm).epsilon(1e-10));
  }
  const auto wa = all_weights(a), wb = all_weights(b);
  double worst = 0;
  for (std::size_t i = 0; i < wa.size(); ++i) worst = std::max(worst, std::abs(wa[i] - wb[i]));
  CHECK(worst < 1e-10);
}

TEST_CASE("UpdateInBackward makes the same update as a separate pass", "[host]") {
  using Sep = Train<LlamaLoRAAll, Batch<2>, Seq<12>, Precision<DType::F64>>;
  using Fused = Train<LlamaLoRAAll, Batch<2>, Seq<12>, Precision<DType::F64>, UpdateInBackward>;
  host::Trainer<Sep> a({.seed = 5, .lr = 1e-2, .clip_norm = 0});
  host::Trainer<Fused> b({.seed = 5, .lr = 1e-2, .clip_norm = 0});
  check_arena(b);
  CHECK(Fused::update_in_backward);
  for (int s = 0; s < 3; ++s) {
    const auto tok = ids(24, 60 + s, 48), tgt = ids(24, 80 + s, 48);
    CHECK(a.step(tok, tgt).loss == b.step(tok, tgt).loss);
  }
  CHECK(all_weights(a) == all_weights(b));
}
