// The CUDA engine's communication lane: an op on ops::Lane::communication
// runs on the trainer's communication stream, ordered after the compute
// stream's work and waited for where a later step needs its bytes. Training
// with the op there gives the losses and gradient norms of the same op on the
// compute lane, plain, checkpointed and replayed from a CUDA graph.
#include "../support/kernel_test.hpp"

#include <vector>

#include <headroom/train/cuda/trainer.cuh>

#include "../../runtime/support/twice_op.hpp"

namespace {
using namespace headroom;
using test_lanes::Seen;

template <ops::Lane L>
using Plain = Train<test_lanes::TwiceModel<L>, Batch<2>, Seq<16>, AdamW, OnCuda>;
template <ops::Lane L>
using Ckpt = Train<Sequential<Embedding<64, 32>, Checkpointed<Sequential<Linear<32, 32>, test_lanes::Twice<32, L>, Linear<32, 32>>>,
                              LMHeadLoss<64, 32, false>>,
                   Batch<2>, Seq<16>, AdamW, OnCuda>;

template <class Run>
std::vector<double> train(int steps, bool graph) {
  cuda::Trainer<Run> t({.seed = 3, .lr = 1e-2, .cuda_graph = graph});
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

TEST_CASE("an op on the communication lane runs on its own stream and trains like on the compute lane", "[cuda][lanes]") {
  for (bool graph : {false, true}) {
    Seen::stream = nullptr;
    const std::vector<double> a = train<Plain<ops::Lane::compute>>(4, graph);
    void* compute = Seen::stream.load();
    const std::vector<double> b = train<Plain<ops::Lane::communication>>(4, graph);
    CHECK(Seen::stream.load() != nullptr);
    CHECK(Seen::stream.load() != compute);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
    const std::vector<double> c = train<Ckpt<ops::Lane::compute>>(4, graph), d = train<Ckpt<ops::Lane::communication>>(4, graph);
    for (std::size_t i = 0; i < c.size(); ++i) CHECK(c[i] == d[i]);
  }
}
