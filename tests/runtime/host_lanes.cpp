// The host engine's host-threads lane: an op on ops::Lane::host_threads runs
// on the trainer's lane thread, beside the steps after it, and the step
// waits for it where a later step needs its bytes. Training with the op on
// that lane gives exactly the losses and gradient norms of the same op on
// the compute lane; the layer test harness passes with it.
#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include <headroom/train/host/trainer.hpp>
#include "support/layer_check.hpp"

#include "support/twice_op.hpp"

namespace {
using namespace headroom;
using test_lanes::Seen;
using test_lanes::TwiceModel;

// checkpointed: the lane op runs again in the backward's recompute
template <ops::Lane L>
using Ckpt = Train<Sequential<Embedding<64, 32>, Checkpointed<Sequential<Linear<32, 32>, test_lanes::Twice<32, L>, Linear<32, 32>>>,
                              LMHeadLoss<64, 32, false>>,
                   Batch<2>, Seq<16>, AdamW>;

template <class Run>
std::vector<double> train(int steps) {
  host::Trainer<Run> t({.seed = 3, .lr = 1e-2});
  std::vector<std::int32_t> tok(Run::config().tokens()), tgt(tok.size());
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) {
    for (std::size_t i = 0; i < tok.size(); ++i) {
      tok[i] = static_cast<std::int32_t>((i * 7 + s) % 64);
      tgt[i] = static_cast<std::int32_t>((i * 7 + s + 1) % 64);
    }
    const StepStats st = t.step(tok, tgt);
    out.push_back(st.loss);
    out.push_back(st.grad_norm);
  }
  out.push_back(t.evaluate(tok, tgt));
  return out;
}
}  // namespace

TEST_CASE("an op on the host-threads lane runs on the lane thread and trains like on the compute lane", "[lanes]") {
  using OnCompute = Train<TwiceModel<ops::Lane::compute>, Batch<2>, Seq<16>, AdamW>;
  using OnLane = Train<TwiceModel<ops::Lane::host_threads>, Batch<2>, Seq<16>, AdamW>;
  const std::vector<double> a = train<OnCompute>(4);
  CHECK(Seen::thread.load() == std::this_thread::get_id());
  Seen::thread = std::thread::id{};
  const std::vector<double> b = train<OnLane>(4);
  CHECK(Seen::thread.load() != std::thread::id{});
  CHECK(Seen::thread.load() != std::this_thread::get_id());
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);  // the same arithmetic, in the same order
  const std::vector<double> c = train<Ckpt<ops::Lane::compute>>(4), d = train<Ckpt<ops::Lane::host_threads>>(4);
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(c[i] == d[i]);
}

TEST_CASE("the layer test harness passes with an op on the host-threads lane", "[lanes][harness]") {
  check_layer<test_lanes::Twice<8, ops::Lane::host_threads>>();
}
