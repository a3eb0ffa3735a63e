// LoRA dropout (PEFT's lora_dropout) on the host engine: the masks
// (math/dropout.hpp) against an independent SplitMix64 and against their
// expected drop rate; the plan's scratch by hand; gradients through the masks
// against finite differences; dropout in training only; the masks
// deterministic per seed and regenerated to the bit by a checkpointed block.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"
#include "support/gradients.hpp"
#include "support/repeats.hpp"

#include <cmath>
#include <cstdint>
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
#include <vector>

using namespace headroom;

namespace {
using headroom::test::all_grads;
using headroom::test::ids;
using headroom::test::perturb_lora_b;

constexpr models::LlamaConfig cfg{48, 64, 128, 2, 4, 2, 64, false};
using Drop = LoRA<4, Linear<>, Ratio<8>, Ratio<1, 5>>;  // r 4, alpha 8, lora_dropout 0.2
using NoDrop = LoRA<4, Linear<>, Ratio<8>>;
using LlamaDrop = models::Llama<cfg, Apply<Drop, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;
using LlamaNoDrop = models::Llama<cfg, Apply<NoDrop, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;
using LlamaDropCkpt = models::Llama<cfg, Apply<Drop, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>,
                                    Apply<Checkpointed<>, EveryBlock>>;

template <class M, class... Opts>
using Run = Train<M, Batch<2>, Seq<12>, Workers<2>, Opts...>;

// SplitMix64 as its authors give it: a state advanced by the golden gamma,
// each output the state mixed (Steele, Lea and Flood 2014; Vigna's
// splitmix64.c). Written here apart from math/dropout.hpp.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

}  // namespace

TEST_CASE("LoRA dropout: the mask is SplitMix64's sequence, its top 24 bits against the threshold", "[host][dropout]") {
  SplitMix64 zero{0};
  CHECK(zero.next() == 0xe220a8397b1dcdafull);  // the reference implementation's first output from seed 0
  for (const std::uint64_t stream : {std::uint64_t{0}, std::uint64_t{12345}, math::dropout_stream(math::dropout_step_key(7, 3, 1), 1, 5, 2)}) {
    SplitMix64 g{stream};
    const std::uint32_t threshold = math::dropout_threshold(1, 5);
    for (std::uint64_t i = 0; i < 10000; ++i) {
      const bool kept = static_cast<std::uint32_t>(g.next() >> 40) >= threshold;
      if (kept != math::dropout_keep(stream, i, threshold)) FAIL("element " << i << " of stream " << stream);
    }
  }
  CHECK(math::dropout_threshold(1, 10) == 1677721);  // floor(0.1 * 2^24)
  CHECK(math::dropout_threshold(1, 2) == 8388608);
  CHECK(math::dropout_threshold(0, 1) == 0);
}

TEST_CASE("LoRA dropout: drop rate, scale, and distinct streams", "[host][dropout]") {
  for (const auto& [num, den] : {std::pair<int, int>{1, 10}, {1, 2}, {1, 20}}) {
    const double p = static_cast<double>(num) / den;
    math::Dropout d;
    d.stream = math::dropout_stream(math::dropout_step_key(1234, 1, 0), 0, 3, 0);
    d.threshold = math::dropout_threshold(num, den);
    d.scale = 1.0 / (1.0 - p);
    d.width = 1024;
    const std::int64_t rows = 1024, n = rows * d.width;
    std::int64_t dropped = 0;
    double sum = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < d.width; ++c) {
        const double y = d.apply(1.0, r, c);
        dropped += y == 0.0;
        sum += y;
      }
    const double rate = static_cast<double>(dropped) / static_cast<double>(n), sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
    INFO("p " << p << ": dropped " << rate);
    CHECK(std::abs(rate - p) < 5 * sigma);
    CHECK(std::abs(sum / static_cast<double>(n) - 1.0) < 5 * sigma / (1 - p));  // inverted dropout keeps the mean
  }
  // neighbouring steps, micro-batches, ranks and sites share no mask
  const std::uint64_t key = math::dropout_step_key(1234, 5, 0);
  const std::uint64_t streams[] = {math::dropout_stream(key, 0, 3, 0), math::dropout_stream(key, 1, 3, 0),
                                   math::dropout_stream(key, 0, 4, 0), math::dropout_stream(key, 0, 3, 1),
                                   math::dropout_stream(math::dropout_step_key(1234, 6, 0), 0, 3, 0),
                                   math::dropout_stream(math::dropout_step_key(1234, 5, 1), 0, 3, 0),
                                   math::dropout_stream(math::dropout_step_key(1235, 5, 0), 0, 3, 0)};
  const std::uint32_t half = math::dropout_threshold(1, 2);
  for (std::size_t a = 0; a < std::size(streams); ++a)
    for (std::size_t b = a + 1; b < std::size(streams); ++b) {
      int same = 0;
      for (std::uint64_t i = 0; i < 4096; ++i) same += math::dropout_keep(streams[a], i, half) == math::dropout_keep(streams[b], i, half);
      INFO("streams " << a << " and " << b << ": " << same << " of 4096 decisions equal");
      CHECK(std::abs(same - 2048) < 5 * 32);  // independent: half agree (sigma 32)
    }
}

TEST_CASE("LoRA dropout: the plan's scratch, by hand", "[host][dropout][plan]") {
  // N = 24 tokens, f32. Forward: the dropped input xd (N, in); backward: d(A x)
  // (N, r) and (N, in) for xd, then d(A x) A. Without dropout: (N, r) in the backward only.
  constexpr std::int64_t N = 24, r = 4;
  const auto check = [&]<class Tr>(bool drop) {
    int seen = 0;
    for (const Step& s : Tr::sched.steps) {
      if (s.op != ops::LoRA::name) continue;
      const std::int64_t in = s.dim[ops::LoRA::in.index];
      INFO(Tr::node_path(s.node, s.instance) << " " << name_of(s.kind) << ", in " << in);
      if (s.kind == EventKind::forward) CHECK(s.scratch.bytes == (drop ? N * in * 4 : 0));
      if (s.kind == EventKind::backward) CHECK(s.scratch.bytes == (drop ? N * (r + in) * 4 : N * r * 4));
      ++seen;
    }
    CHECK(seen == 2 * 7 * 2);  // forward and backward of 7 projections in 2 blocks
  };
  check.operator()<host::Trainer<Run<LlamaDrop>>>(true);
  check.operator()<host::Trainer<Run<LlamaNoDrop>>>(false);
  // the whole step: dropout adds scratch only (no saved mask, no buffer across events)
  using A = host::Trainer<Run<LlamaDrop>>;
  using B = host::Trainer<Run<LlamaNoDrop>>;
  CHECK(A::plan.bytes(Role::saved_activation) == B::plan.bytes(Role::saved_activation));
  CHECK(A::plan.bytes(Role::activation) == B::plan.bytes(Role::activation));
  CHECK(A::plan.peak_bytes() >= B::plan.peak_bytes());
  CHECK(A::plan.peak_bytes() - B::plan.peak_bytes() <= N * (r + 128) * 4);  // at most the widest backward's (N, in)
}

TEST_CASE("gradcheck: LoRA dropout on every Llama projection, through the step's masks", "[host][dropout][gradcheck]") {
  // forward_backward(tokens) runs the step in progress (steps_done() + 1) again
  // each time, so its masks are fixed: the loss it returns is a function of
  // the weights whose gradient backward computes.
  using Tr = host::Trainer<Run<LlamaDrop, Precision<DType::F64>>>;
  Tr t({.seed = 11});
  perturb_lora_b(t);
  const std::int64_t n = Tr::tokens_per_micro_batch;
  const auto tok = ids(n, 1, 48), tgt = ids(n, 2, 48);
  t.forward_backward(tok, tgt);
  const int per_param = test::repeats(4, 2);  // elements of each of A and B, in 7 projections of 2 blocks
  CHECK(test::central_differences(t, per_param, [&] { return t.forward_backward(tok, tgt); }) == per_param * 2 * 7 * 2);
  // and the masks matter: the same weights without dropout give another loss
  host::Trainer<Run<LlamaNoDrop, Precision<DType::F64>>> plain({.seed = 11});
  perturb_lora_b(plain);
  CHECK(plain.forward_backward(tok, tgt) != t.forward_backward(tok, tgt));
}

TEST_CASE("LoRA dropout acts in training only, masks follow the seed, a checkpointed block regenerates them", "[host][dropout]") {
  const auto tok = ids(24, 5, 48), tgt = ids(24, 6, 48);
  host::Trainer<Run<LlamaDrop>> drop({.seed = 4, .lr = 1e-2});
  host::Trainer<Run<LlamaNoDrop>> plain({.seed = 4, .lr = 1e-2});
  perturb_lora_b(drop);
  perturb_lora_b(plain);
  // evaluation drops nothing: the same weights give the same loss, to the bit
  CHECK(drop.evaluate(tok, tgt) == plain.evaluate(tok, tgt));
  // training does
  const double with = drop.forward_backward(tok, tgt), without = plain.forward_backward(tok, tgt);
  CHECK(with != without);
  CHECK(std::abs(with - without) < 0.05 * without);  // a perturbation of the adapters' path, not another model
  // the same seed, the same masks (bits); another seed, other masks
  host::Trainer<Run<LlamaDrop>> again({.seed = 4, .lr = 1e-2});
  perturb_lora_b(again);
  CHECK(again.forward_backward(tok, tgt) == with);
  CHECK(all_grads(again) == all_grads(drop));
  // another seed, on the same weights: the same evaluation, another training loss
  TrainOptions other{.seed = 5, .lr = 1e-2};
  host::Trainer<Run<LlamaDrop>> reseeded(other);
  perturb_lora_b(reseeded);
  // (another seed also initializes A differently: set it to drop's)
  for (std::size_t k = 0; k < host::Trainer<Run<LlamaDrop>>::param_count; ++k) {
    const ParamSlot& p = host::Trainer<Run<LlamaDrop>>::param(k);
    if (p.quant.kind == QuantKind::none)
      reseeded.set_dense(p, std::vector<float>(drop.weight(p), drop.weight(p) + p.elements()));
  }
  CHECK(reseeded.evaluate(tok, tgt) == drop.evaluate(tok, tgt));
  CHECK(reseeded.forward_backward(tok, tgt) != with);

  // Checkpointed blocks recompute their forward, masks included, to the bit
  host::Trainer<Run<LlamaDropCkpt>> ckpt({.seed = 4, .lr = 1e-2});
  perturb_lora_b(ckpt);
  CHECK(ckpt.forward_backward(tok, tgt) == with);
  CHECK(all_grads(ckpt) == all_grads(drop));
  for (int s = 0; s < 3; ++s) {
    const auto a = drop.step(tok, tgt), b = ckpt.step(tok, tgt);
    INFO("step " << s + 1);
    CHECK(a.loss == b.loss);
    CHECK(a.grad_norm == b.grad_norm);
  }
}
