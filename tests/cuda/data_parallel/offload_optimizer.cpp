// OffloadOptimizer (ZeRO-Offload) and OffloadParameters (ZeRO-Infinity)
// over several processes on the CUDA engine: every process of a
// DataParallel<2>, TensorParallel<2> or PipelineParallel<2> run (and
// products of them) with the offload against the same process of the same
// run without it, over 20 steps. The offloaded run streams each gradient
// to the pinned offload tier once it is complete (with data parallelism:
// once the collective after its backward has averaged it; ZeRO 2 and 3:
// this rank's shard), keeps on the device, and sums there, the gradients
// several processes sum (graph::offloaded_after_sum), and after the
// backward the CPU sums the squares of what this process updates in the
// norm kernel's order, the processes add their sums on the device, and
// every process updates its master weights and optimizer state on the CPU;
// the new weights go back to the device (ZeRO 1 and 2: this rank's block,
// then the all-gather; ZeRO 3: its shard) or, with OffloadParameters, into
// the stored values the next fetches read. So every loss, gradient norm,
// weight, master weight and optimizer state a process holds is the same
// bits as the run without it (the emulator rounds the host's f32 as the
// kernels' f32). Each process compares its two trainers (ranks.hpp).
#include "../support/kernel_test.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>

#include "ranks.hpp"

namespace {

using namespace headroom;
using cuda_test::RankReport;
using cuda_test::run_ranks;
using cuda_test::use_device;

constexpr models::LlamaConfig llama_off{48, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions
using Model = models::Llama<llama_off>;
constexpr std::int64_t batch = 2, seq = 12;
constexpr int steps = 20;

TrainOptions options(double clip) {
  return {.seed = 5, .lr = 5e-2, .warmup_steps = 2, .total_steps = 30, .clip_norm = clip};
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

// On every process of Off (DataParallel, TensorParallel, PipelineParallel:
// with stages, its stage, cuda::with_pipeline_stage): Off (OffloadOptimizer)
// and Ref (the same run without it) trained on the same batches (each
// data-parallel rank its own); throws naming the first difference. A
// process's report holds how many steps clipped.
template <class Off, class Ref>
void offloaded_ranks_match(double clip) {
  constexpr RunConfig c = Off::config();
  static_assert(c.offload_optimizer && !Ref::config().offload_optimizer && c.world() > 1);
  constexpr int N = c.world();
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  const std::vector<RankReport> r = run_ranks(N, [&](int w, RankReport& out) {
    use_device(w);
    cuda::NcclCommunicator comm(id, w, N, std::chrono::seconds(120));
    auto both = [&]<class OffPart>() {
      using RefPart = std::conditional_t<(Off::config().pp > 1), pipeline_stage<Ref, OffPart::config().stage>, Ref>;
      static_assert(plan<OffPart>().bytes(Role::optimizer_state, Tier::device) == 0 &&
                    plan<OffPart>().bytes(Role::master_weights, Tier::device) == 0);
      static_assert(plan<OffPart>().bytes(Role::optimizer_state, Tier::offload) == plan<RefPart>().bytes(Role::optimizer_state));
      cuda::Trainer<RefPart> ref(options(clip), comm);
      cuda::Trainer<OffPart> off(options(clip), comm);
      using T = cuda::Trainer<RefPart>;
      const int d = (w / Off::config().tp) % Off::config().dp;  // the data-parallel rank: its batches
      const std::size_t n = static_cast<std::size_t>(T::tokens_per_step);
      auto fail = [](const std::string& what) { throw std::runtime_error(what); };
      int clipped = 0;
      for (int s = 1; s <= steps; ++s) {
        const std::vector<std::int32_t> tokens = ids(n, s, d, false), targets = ids(n, s, d, true);
        const StepStats a = ref.step(tokens, targets);
        const StepStats b = off.step(tokens, targets);
        if (a.loss != b.loss || a.grad_norm != b.grad_norm)
          fail("step " + std::to_string(s) + ": loss " + std::to_string(a.loss) + " offloaded " + std::to_string(b.loss) + ", norm " +
               std::to_string(a.grad_norm) + " offloaded " + std::to_string(b.grad_norm));
        clipped += clip > 0 && a.grad_norm > clip ? 1 : 0;
      }
      for (std::size_t k = 0; k < T::param_count; ++k) {
        const ParamSlot& p = T::param(k);
        const ParamSlot& q = cuda::Trainer<OffPart>::param(k);
        const std::string path = T::path_of(p);
        if (p.quant.kind != QuantKind::none) continue;  // frozen codes (the evaluation below reads them)
        if (!same_bits(off.download_weight(q), ref.download_weight(p))) fail(path + ": the weights (master) differ");
        if (!same_bits(off.download_stored(q), ref.download_stored(p))) fail(path + ": the stored weights differ");
        if (off.download_state(q) != ref.download_state(p)) fail(path + ": the optimizer states differ");
      }
      // the device's weights: what the next forward reads
      const std::size_t one = static_cast<std::size_t>(T::tokens_per_micro_batch);
      const std::vector<std::int32_t> tokens = ids(one, steps + 1, d, false), targets = ids(one, steps + 1, d, true);
      if (off.evaluate(tokens, targets) != ref.evaluate(tokens, targets)) fail("the evaluation after the steps differs");
      out.steps = clipped;
    };
    if constexpr (Off::config().pp > 1)
      cuda::with_pipeline_stage<Off>(comm, both);
    else
      both.template operator()<Off>();
  });
  for (int q = 0; q < N; ++q) {
    const RankReport& rq = r[static_cast<std::size_t>(q)];
    INFO("process " << q << ": " << rq.error);
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

// ---- tensor and pipeline parallelism ---------------------------------------------------------------------------
// A LoRA matrix every tensor-parallel rank holds whole (q's, k's, v's, gate's,
// up's A; o's and down's B) has a partial gradient on each: it stays on the
// device, is summed over the group after the backward and only then goes to
// the offload tier (graph::offloaded_after_sum); the norm adds the split
// gradients' squares over the group and the whole ones' once.
using ModelLora = models::Llama<llama_off, Apply<LoRA<4>, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;
template <class M, class... Options>
using OffTp = Train<M, Batch<batch>, Seq<seq>, Options..., OffloadOptimizer, OnCuda, TensorParallel<2>>;
template <class M, class... Options>
using DeviceTp = Train<M, Batch<batch>, Seq<seq>, Options..., OnCuda, TensorParallel<2>>;

TEST_CASE("cuda::Trainer OffloadOptimizer, TensorParallel<2>: AdamW bf16 bit for bit as on the device, clipped and not",
          "[tensor_parallel][offload]") {
  offloaded_ranks_match<OffTp<Model, Precision<BF16>>, DeviceTp<Model, Precision<BF16>>>(0.0);
  offloaded_ranks_match<OffTp<Model, Precision<BF16>>, DeviceTp<Model, Precision<BF16>>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, TensorParallel<2> with LoRA: AdamW bf16, and AdamW8bit with Accumulate<2>",
          "[tensor_parallel][offload]") {
  offloaded_ranks_match<OffTp<ModelLora, Precision<BF16>>, DeviceTp<ModelLora, Precision<BF16>>>(0.02);
  offloaded_ranks_match<OffTp<ModelLora, Accumulate<2>, Precision<BF16>, AdamW8bit>,
                        DeviceTp<ModelLora, Accumulate<2>, Precision<BF16>, AdamW8bit>>(0.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, DataParallel<2> x TensorParallel<2> ZeRO 2 with LoRA: AdamW bf16, Accumulate<2>",
          "[tensor_parallel][offload]") {
  offloaded_ranks_match<OffTp<ModelLora, Accumulate<2>, Precision<BF16>, DataParallel<2>, ZeRO<2>>,
                        DeviceTp<ModelLora, Accumulate<2>, Precision<BF16>, DataParallel<2>, ZeRO<2>>>(1.0);
}

// Pipeline stages under 1F1B: each stage streams its gradients as its
// backwards complete them (the last stage's fused loss the LM head's), and
// the norm adds the stages' squares. GPT-2's LM head is tied to the
// embedding table: the first and the last stage sum its gradient on the
// device after the backward, then offload it.
using Gpt2 = models::GPT2<models::GPT2Config{48, 64, 4, 4, 32}>;  // vocab, d, layers, heads, positions
template <class M, class... Options>
using OffPp = Train<M, Batch<batch>, Seq<seq>, Options..., OffloadOptimizer, OnCuda, PipelineParallel<2>>;
template <class M, class... Options>
using DevicePp = Train<M, Batch<batch>, Seq<seq>, Options..., OnCuda, PipelineParallel<2>>;

TEST_CASE("cuda::Trainer OffloadOptimizer, PipelineParallel<2>: AdamW bf16 with Accumulate<4>, clipped and not",
          "[pipeline_parallel][offload]") {
  offloaded_ranks_match<OffPp<Model, Accumulate<4>, Precision<BF16>>, DevicePp<Model, Accumulate<4>, Precision<BF16>>>(0.0);
  offloaded_ranks_match<OffPp<Model, Accumulate<4>, Precision<BF16>>, DevicePp<Model, Accumulate<4>, Precision<BF16>>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, PipelineParallel<2>: GPT-2 with its LM head tied, AdamW8bit bf16 with Accumulate<2>",
          "[pipeline_parallel][offload]") {
  offloaded_ranks_match<OffPp<Gpt2, Accumulate<2>, Precision<BF16>, AdamW8bit>, DevicePp<Gpt2, Accumulate<2>, Precision<BF16>, AdamW8bit>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer, PipelineParallel<2> x DataParallel<2> ZeRO 3: SGD f32 with Accumulate<2>",
          "[pipeline_parallel][offload]") {
  offloaded_ranks_match<OffPp<Model, Accumulate<2>, SGD<>, DataParallel<2>, ZeRO<3>>, DevicePp<Model, Accumulate<2>, SGD<>, DataParallel<2>, ZeRO<3>>>(1.0);
}

// ---- OffloadParameters (ZeRO-Infinity) -------------------------------------------------------------------------
// Every parameter's stored tensor in the pinned offload tier too. With
// ZeRO 3 a rank stores its shards there: a fetch copies them to the device
// on the copy stream, and the all-gather after it (on the communication
// stream, which waits for the fetch) reads them; the CPU's update writes the
// rank's new shard values into the offload tier, where the next step's
// fetches find them.
template <int Stage, class M, class... Options>
using InfinityDp = Train<M, Batch<batch>, Seq<seq>, Options..., OffloadOptimizer, OffloadParameters, OnCuda, DataParallel<2>, ZeRO<Stage>>;
template <int Stage, class M, class... Options>
using DeviceDp = Train<M, Batch<batch>, Seq<seq>, Options..., OnCuda, DataParallel<2>, ZeRO<Stage>>;
// QLoRA with checkpointed blocks: NF4 codes and scales fetched and gathered in forward and recompute
using QLoraModel = models::Llama<llama_off, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj>>, Apply<Checkpointed<>, EveryBlock>>;

TEST_CASE("cuda::Trainer OffloadParameters, DataParallel<2> ZeRO 3: AdamW bf16 clipped and not, AdamW8bit with Accumulate<2>",
          "[data_parallel][offload][offload_params]") {
  offloaded_ranks_match<InfinityDp<3, Model, Precision<BF16>>, DeviceDp<3, Model, Precision<BF16>>>(0.0);
  offloaded_ranks_match<InfinityDp<3, Model, Precision<BF16>>, DeviceDp<3, Model, Precision<BF16>>>(1.0);
  offloaded_ranks_match<InfinityDp<3, Model, Accumulate<2>, Precision<BF16>, AdamW8bit>,
                        DeviceDp<3, Model, Accumulate<2>, Precision<BF16>, AdamW8bit>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadParameters, DataParallel<2> ZeRO 3: QLoRA with checkpointed blocks, AdamW bf16",
          "[data_parallel][offload][offload_params]") {
  offloaded_ranks_match<InfinityDp<3, QLoraModel, Precision<BF16>>, DeviceDp<3, QLoraModel, Precision<BF16>>>(0.02);
}

TEST_CASE("cuda::Trainer OffloadParameters, DataParallel<2> ZeRO 0: SGD f32 with Accumulate<2>", "[data_parallel][offload][offload_params]") {
  offloaded_ranks_match<InfinityDp<0, Model, Accumulate<2>, SGD<>>, DeviceDp<0, Model, Accumulate<2>, SGD<>>>(1.0);
}

TEST_CASE("cuda::Trainer OffloadParameters, TensorParallel<2> with LoRA and PipelineParallel<2>: AdamW bf16",
          "[tensor_parallel][pipeline_parallel][offload][offload_params]") {
  offloaded_ranks_match<OffTp<ModelLora, Precision<BF16>, OffloadParameters>, DeviceTp<ModelLora, Precision<BF16>>>(0.02);
  offloaded_ranks_match<OffPp<Model, Accumulate<2>, Precision<BF16>, OffloadParameters>, DevicePp<Model, Accumulate<2>, Precision<BF16>>>(1.0);
}

// ---- a non-finite gradient over several processes ----------------------------------------------------------------
// GPT-2 whose first MLP computes GELU at 1e20 and multiplies it by a zero
// c_proj: the loss stays finite, but GELU's derivative there is NaN, so the
// gradients of c_fc and everything before it in the backward are NaN. Every
// process (the data-parallel ranks average, the tensor-parallel group sums
// the NaN into every rank's input gradient) stops before any update, clipped
// or not (several processes never update during the backward): it throws
// non_finite_gradient naming what the run on the device names, at step 2,
// and its weights and optimizer state stay those of step 1.
constexpr models::GPT2Config nan_gpt2{96, 32, 2, 2, 16};  // vocab, d, layers, heads, positions
using NanGpt2 = models::GPT2<nan_gpt2>;

template <class Trainer>
void break_mlp_backward(Trainer& t) {
  const ParamSlot& bias = *Trainer::find("h.0.mlp.c_fc.bias");
  const ParamSlot& proj = *Trainer::find("h.0.mlp.c_proj.weight");
  t.upload_weight(bias, std::vector<float>(static_cast<std::size_t>(bias.elements()), 1e20f));
  t.upload_weight(proj, std::vector<float>(static_cast<std::size_t>(proj.elements()), 0.0f));
}

template <class Off, class Dev>
void every_process_stops() {
  constexpr RunConfig c = Off::config();
  static_assert(c.offload_optimizer && !Dev::config().offload_optimizer && c.pp == 1 && c.world() > 1);
  constexpr int N = c.world();
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  const std::vector<RankReport> r = run_ranks(N, [&](int w, RankReport& out) {
    use_device(w);
    cuda::NcclCommunicator comm(id, w, N, std::chrono::seconds(120));
    auto fail = [](const std::string& what) { throw std::runtime_error(what); };
    using O = cuda::Trainer<Off>;
    using D = cuda::Trainer<Dev>;
    const int d = (w / c.tp) % c.dp;
    const std::size_t n = static_cast<std::size_t>(O::tokens_per_step);
    for (const double clip : {1.0, 0.0}) {
      TrainOptions o = options(clip);
      D dev(o, comm);
      O off(o, comm);
      dev.step(ids(n, 1, d, false), ids(n, 1, d, true));
      off.step(ids(n, 1, d, false), ids(n, 1, d, true));
      break_mlp_backward(dev);
      break_mlp_backward(off);
      std::vector<std::vector<float>> weights;
      std::vector<std::vector<std::byte>> states;
      for (std::size_t k = 0; k < O::param_count; ++k) {
        weights.push_back(off.download_weight(O::param(k)));
        states.push_back(off.download_state(O::param(k)));
      }
      std::string expected;
      try {
        dev.step(ids(n, 2, d, false), ids(n, 2, d, true));
      } catch (const non_finite_gradient& e) {
        expected = e.parameter();
      }
      if (expected.empty()) fail("the run on the device did not stop");
      bool thrown = false;
      try {
        off.step(ids(n, 2, d, false), ids(n, 2, d, true));
      } catch (const non_finite_gradient& e) {
        thrown = true;
        if (e.step() != 2 || e.parameter() != expected || std::string(e.what()).find("nothing was updated") == std::string::npos)
          fail("clip " + std::to_string(clip) + ": expected step 2 and " + expected + ", got " + e.what());
      }
      if (!thrown) fail("clip " + std::to_string(clip) + ": the offloaded run did not stop");
      if (off.steps_done() != 1) fail("the step count moved");
      for (std::size_t k = 0; k < O::param_count; ++k) {
        if (!same_bits(off.download_weight(O::param(k)), weights[k])) fail(O::path_of(O::param(k)) + ": the weights changed");
        if (off.download_state(O::param(k)) != states[k]) fail(O::path_of(O::param(k)) + ": the optimizer state changed");
      }
    }
    out.steps = 1;
  });
  for (int q = 0; q < N; ++q) {
    INFO("process " << q << ": " << r[static_cast<std::size_t>(q)].error);
    CHECK(r[static_cast<std::size_t>(q)].done);
  }
}

TEST_CASE("cuda::Trainer OffloadOptimizer over several processes: a non-finite gradient stops every process before any update",
          "[data_parallel][tensor_parallel][offload][non_finite]") {
  SECTION("DataParallel<2> ZeRO 0") {
    every_process_stops<Train<NanGpt2, Batch<1>, Seq<8>, OffloadOptimizer, OnCuda, DataParallel<2>>,
                        Train<NanGpt2, Batch<1>, Seq<8>, OnCuda, DataParallel<2>>>();
  }
  SECTION("DataParallel<2> ZeRO 3 with OffloadParameters") {
    every_process_stops<Train<NanGpt2, Batch<1>, Seq<8>, OffloadOptimizer, OffloadParameters, OnCuda, DataParallel<2>, ZeRO<3>>,
                        Train<NanGpt2, Batch<1>, Seq<8>, OnCuda, DataParallel<2>, ZeRO<3>>>();
  }
  SECTION("TensorParallel<2>") {
    every_process_stops<Train<NanGpt2, Batch<1>, Seq<8>, OffloadOptimizer, OnCuda, TensorParallel<2>>,
                        Train<NanGpt2, Batch<1>, Seq<8>, OnCuda, TensorParallel<2>>>();
  }
}
