// A new op with its own CUDA kernels (examples/relu_squared.hpp): a model of
// its blocks trained by cuda::Trainer and by host::Trainer from the same
// initial weights and batches; losses and gradient norms agree step by step.
#include "../support/kernel_test.hpp"

#include <cmath>
#include <vector>

#include <headroom/train/cuda/trainer.cuh>
#include <headroom/train/host/trainer.hpp>

#include "../../../examples/relu_squared.hpp"

namespace {
using namespace headroom;

template <class Trainer>
std::vector<double> losses(Trainer& t, int steps, std::int64_t vocab) {
  std::vector<double> out;
  const std::size_t n = static_cast<std::size_t>(Trainer::tokens_per_step);
  std::uint32_t s = 12345;
  for (int i = 0; i < steps; ++i) {
    std::vector<std::int32_t> stream(n + 1);
    for (auto& x : stream) {
      s = s * 1664525u + 1013904223u;
      x = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(vocab));
    }
    const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
    const StepStats st = t.step(tokens, targets);
    out.push_back(st.loss);
    out.push_back(st.grad_norm);
  }
  return out;
}
}  // namespace

TEST_CASE("a user op with its own CUDA kernels trains like on the host", "[cuda][custom_op]") {
  using Model = my::TinyLM<2, my::MlpBlock<32, 64>, 64>;
  using HostRun = Train<Model, Batch<2>, Seq<16>, AdamW>;
  using CudaRun = Train<Model, Batch<2>, Seq<16>, AdamW, OnCuda>;
  const TrainOptions o{.seed = 5, .lr = 3e-3};
  host::Trainer<HostRun> h(o);
  cuda::Trainer<CudaRun> c(o);
  const std::vector<double> a = losses(h, 3, 64), b = losses(c, 3, 64);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("value " << i << ": host " << a[i] << ", cuda " << b[i]);
    CHECK(std::abs(a[i] - b[i]) <= 2e-3 * std::max(1.0, std::abs(a[i])));
  }
}
