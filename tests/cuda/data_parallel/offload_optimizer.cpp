// OffloadOptimizer (ZeRO-Offload) with data parallelism on the CUDA engine:
// each rank of a DataParallel<2> run with OffloadOptimizer against the same
// rank of the same run without it, over ten steps. The offloaded run streams
// each gradient to the pinned offload tier once the collective after its
// backward has averaged it (ZeRO 2 and 3: this rank's shard), and after the
// backward the CPU sums the squares of what this rank updates in the norm
// kernel's order, the ranks add their sums on the device, and every rank
// updates its master weights and optimizer state on the CPU; the new
// weights go back to the device (ZeRO 1 and 2: this rank's block, then the
// all-gather; ZeRO 3: its shard). So every loss, gradient norm, weight,
// master weight and optimizer state a rank holds is the same bits as the
// run without it (the emulator rounds the host's f32 as the kernels' f32).
// Each rank compares its two trainers in its own process (ranks.hpp).
#include "../support/kernel_test.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <headroom/cuda/trainer.cuh>
#include <headroom/headroom.hpp>

#include "ranks.hpp"

namespace {

using namespace headroom;
using cuda_test::RankReport;
using cuda_test::run_ranks;
using cuda_test::use_device;

constexpr models::LlamaConfig llama_off{48, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions
using Model = models::Llama<llama_off>;
constexpr std::int64_t batch = 2, seq = 12;
constexpr int steps = 10;

TrainOptions options(double clip) {
  return {.seed = 5, .lr = 5e-2, .warmup_steps = 2, .total_steps = 20, .clip_norm = clip};
}

// Rank r's tokens or targets of step s (every rank its own).
std::vector<std::int32_t> ids(std::size_t n, int s, int rank, bool targets) {
  std::vector<std::int32_t> t(n);
  std::uint32_t x = static_cast<std::uint32_t>(1000 * s + 10 * rank + (targets ? 1 : 0)) * 2654435761u + 7u;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(llama_off.vocab));
  }
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// On each of 2 ranks: Off (OffloadOptimizer) and Ref (the same run without
// it) trained on the same batches; throws naming the first difference.
// Returns nothing; a rank's report holds how many steps clipped.
template <class Off, class Ref>
void offloaded_ranks_match(double clip) {
  static_assert(Off::config().offload_optimizer && !Ref::config().offload_optimizer && Off::config().dp == 2);
  static_assert(plan<Off>().bytes(Role::optimizer_state, Tier::device) == 0 && plan<Off>().bytes(Role::master_weights, Tier::device) == 0);
  static_assert(plan<Off>().bytes(Role::optimizer_state, Tier::offload) == plan<Ref>().bytes(Role::optimizer_state));
  constexpr int N = 2;
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  const std::vector<RankReport> r = run_ranks(N, [&](int rank, RankReport& out) {
    use_device(rank);
    cuda::NcclCommunicator comm(id, rank, N, std::chrono::seconds(120));
    cuda::Trainer<Ref> ref(options(clip), comm);
    cuda::Trainer<Off> off(options(clip), comm);
    using T = cuda::Trainer<Ref>;
    const std::size_t n = static_cast<std::size_t>(T::tokens_per_step);
    auto fail = [](const std::string& what) { throw std::runtime_error(what); };
    int clipped = 0;
    for (int s = 1; s <= steps; ++s) {
      const std::vector<std::int32_t> tokens = ids(n, s, rank, false), targets = ids(n, s, rank, true);
      const StepStats a = ref.step(tokens, targets);
      const StepStats b = off.step(tokens, targets);
      if (a.loss != b.loss || a.grad_norm != b.grad_norm)
        fail("step " + std::to_string(s) + ": loss " + std::to_string(a.loss) + " offloaded " + std::to_string(b.loss) + ", norm " +
             std::to_string(a.grad_norm) + " offloaded " + std::to_string(b.grad_norm));
      clipped += clip > 0 && a.grad_norm > clip ? 1 : 0;
    }
    for (std::size_t k = 0; k < T::param_count; ++k) {
      const ParamSlot& p = T::param(k);
      const ParamSlot& q = cuda::Trainer<Off>::param(k);
      const std::string path = T::path_of(p);
      if (!same_bits(off.download_weight(q), ref.download_weight(p))) fail(path + ": the weights (master) differ");
      if (!same_bits(off.download_stored(q), ref.download_stored(p))) fail(path + ": the stored weights differ");
      if (off.download_state(q) != ref.download_state(p)) fail(path + ": the optimizer states differ");
    }
    // the device's weights: what the next forward reads
    const std::size_t one = static_cast<std::size_t>(T::tokens_per_micro_batch);
    const std::vector<std::int32_t> tokens = ids(one, steps + 1, rank, false), targets = ids(one, steps + 1, rank, true);
    if (off.evaluate(tokens, targets) != ref.evaluate(tokens, targets)) fail("the evaluation after the steps differs");
    out.steps = clipped;
  });
  for (int q = 0; q < N; ++q) {
    const RankReport& rq = r[static_cast<std::size_t>(q)];
    INFO("rank " << q << ": " << rq.error);
    REQUIRE(rq.done);
    if (clip > 0) CHECK(rq.steps > 0);  // the clip scale acts
  }
}

template <int Stage, class... Options>
using OffRun = Train<Model, Batch<batch>, Seq<seq>, Options..., OffloadOptimizer, OnCuda, DataParallel<2>, ZeRO<Stage>>;
template <int Stage, class... Options>
using DeviceRun = Train<Model, Batch<batch>, Seq<seq>, Options..., OnCuda, DataParallel<2>, ZeRO<Stage>>;

}  // namespace

TEST_CASE("cuda::Trainer OffloadOptimizer, DataParallel<2> ZeRO 0: AdamW bf16 bit for bit as on the device, clipped and not",
          "[data_parallel][offload]") {
  offloaded_ranks_match<OffRun<0, Precision<BF16>>, DeviceRun<0, Precision<BF16>>>(0.0);
  offloaded_ranks_match<OffRun<0, Precision<BF16>>, DeviceRun<0, Precision<BF16>>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, DataParallel<2> ZeRO 1: AdamW bf16", "[data_parallel][offload]") {
  offloaded_ranks_match<OffRun<1, Precision<BF16>>, DeviceRun<1, Precision<BF16>>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, DataParallel<2> ZeRO 0: SGD f32 with Accumulate<2>", "[data_parallel][offload]") {
  offloaded_ranks_match<OffRun<0, Accumulate<2>, SGD<>>, DeviceRun<0, Accumulate<2>, SGD<>>>(0.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, DataParallel<2> ZeRO 2: AdamW bf16, clipped and not", "[data_parallel][offload]") {
  offloaded_ranks_match<OffRun<2, Precision<BF16>>, DeviceRun<2, Precision<BF16>>>(0.0);
  offloaded_ranks_match<OffRun<2, Precision<BF16>>, DeviceRun<2, Precision<BF16>>>(1.0);
}

// Accumulate<2>: this rank's gradient shard starts from the offload tier's
// sum before the reduce-scatter adds the second micro-batch (Step::grad_load)
TEST_CASE("cuda::Trainer OffloadOptimizer, DataParallel<2> ZeRO 2: AdamW8bit bf16 with Accumulate<2>", "[data_parallel][offload]") {
  offloaded_ranks_match<OffRun<2, Accumulate<2>, Precision<BF16>, AdamW8bit>, DeviceRun<2, Accumulate<2>, Precision<BF16>, AdamW8bit>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, DataParallel<2> ZeRO 3: AdamW bf16, clipped and not", "[data_parallel][offload]") {
  offloaded_ranks_match<OffRun<3, Precision<BF16>>, DeviceRun<3, Precision<BF16>>>(0.0);
  offloaded_ranks_match<OffRun<3, Precision<BF16>>, DeviceRun<3, Precision<BF16>>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, DataParallel<2> ZeRO 3: SGD f32 and AdamW8bit bf16 with Accumulate<2>", "[data_parallel][offload]") {
  offloaded_ranks_match<OffRun<3, Accumulate<2>, SGD<>>, DeviceRun<3, Accumulate<2>, SGD<>>>(0.0);
  offloaded_ranks_match<OffRun<3, Accumulate<2>, Precision<BF16>, AdamW8bit>, DeviceRun<3, Accumulate<2>, Precision<BF16>, AdamW8bit>>(1.0);
}
