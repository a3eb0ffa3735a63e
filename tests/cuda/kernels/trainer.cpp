// Whole training steps of cuda::Trainer against host::Trainer: the same
// model, initial weights (trainers::InitialValues), batches and optimizer;
// the losses and gradient norms of several steps must agree. On a GPU this
// is the engine's end-to-end test; under the emulator it checks the
// trainer's dispatch, arena offsets, chunking and copies with kernels run on
// the CPU and cuBLASLt's products computed by the emulator.
#include "../support/kernel_test.hpp"

#include <cmath>
#include <filesystem>
#include <vector>

#include <headroom/cuda/trainer.cuh>
#include <headroom/headroom.hpp>
#include <headroom/host/trainer.hpp>
#include <headroom/io/hf_names.hpp>

namespace {

using namespace headroom;

std::vector<std::int32_t> token_pattern(std::size_t n, std::int64_t vocab, std::uint32_t seed) {
  std::vector<std::int32_t> t(n);
  std::uint32_t s = seed * 2654435761u + 7u;
  for (auto& x : t) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(vocab));
  }
  return t;
}

struct Curve {
  std::vector<double> loss, norm;
};

template <class Trainer>
Curve train_steps(Trainer& t, int steps, std::int64_t vocab) {
  Curve c;
  const std::size_t n = static_cast<std::size_t>(Trainer::tokens_per_step);
  for (int i = 0; i < steps; ++i) {
    // next-token targets: the tokens shifted by one within a longer pattern
    const std::vector<std::int32_t> stream = token_pattern(n + 1, vocab, 17u + static_cast<std::uint32_t>(i));
    const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
    const StepStats s = t.step(tokens, targets);
    c.loss.push_back(s.loss);
    c.norm.push_back(s.grad_norm);
  }
  return c;
}

TrainOptions options() {
  TrainOptions o;
  o.lr = 3e-3;
  o.clip_norm = 1.0;
  o.seed = 99;
  return o;
}

// The CUDA run of HostRun (the same options plus OnCuda) against the host
// trainer: losses and gradient norms of `steps` steps within rel.
template <class HostRun, class CudaRun>
void compare_with_host(int steps, double loss_rel, double norm_rel) {
  host::Trainer<HostRun> h(options());
  cuda::Trainer<CudaRun> c(options());
  constexpr std::int64_t vocab = host::Trainer<HostRun>::vocab_size();
  // the plan is the truth: the device arena is the plan's bytes
  REQUIRE(c.arena_bytes(Tier::device) == plan<CudaRun>().peak_bytes(Tier::device));
  REQUIRE(c.arena_bytes(Tier::offload) == plan<CudaRun>().peak_bytes(Tier::offload));
  const std::int64_t allocations = cuda::AllocationCounter::device + cuda::AllocationCounter::pinned;
  const Curve a = train_steps(h, steps, vocab);
  const Curve b = train_steps(c, steps, vocab);
  // no device or pinned allocation inside a step
  CHECK(cuda::AllocationCounter::device + cuda::AllocationCounter::pinned == allocations);
  for (int i = 0; i < steps; ++i) {
    INFO("step " << i + 1 << ": host loss " << a.loss[i] << " cuda " << b.loss[i] << "; host norm " << a.norm[i] << " cuda "
                 << b.norm[i]);
    CHECK(std::fabs(a.loss[i] - b.loss[i]) <= loss_rel * std::fabs(a.loss[i]));
    CHECK(std::fabs(a.norm[i] - b.norm[i]) <= norm_rel * std::fabs(a.norm[i]) + 1e-7);
  }
}

constexpr models::GPT2Config small_gpt2{384, 64, 2, 4, 64};  // vocab, D, layers, heads, positions

// f32 on both engines: the only differences are summation orders (GEMM
// blocking, reductions over rows and tiles), ~1e-6 relative per op; after a
// few AdamW steps at lr 3e-3 the losses agree to ~1e-5 and the norms to ~1e-4.
TEST_CASE("cuda::Trainer f32 matches host::Trainer: tiny Llama (RMSNorm, RoPE, GQA, SwiGLU, AdamW)", "[trainer]") {
  using H = Train<models::Llama<models::tiny_llama>, Batch<2>, Seq<16>, LossChunk<12>>;
  using C = Train<models::Llama<models::tiny_llama>, Batch<2>, Seq<16>, LossChunk<12>, OnCuda>;
  compare_with_host<H, C>(3, 1e-4, 1e-3);
}

TEST_CASE("cuda::Trainer f32 matches host::Trainer: GPT-2 (LayerNorm, positions, fused GELU, tied head, AdamW)", "[trainer]") {
  using H = Train<models::GPT2<small_gpt2>, Batch<2>, Seq<16>>;
  using C = Train<models::GPT2<small_gpt2>, Batch<2>, Seq<16>, OnCuda>;
  compare_with_host<H, C>(3, 1e-4, 1e-3);
}

TEST_CASE("cuda::Trainer f32 matches host::Trainer: QLoRA (NF4 + LoRA, checkpointed blocks, AdamW8bit)", "[trainer]") {
  using M = models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<8>>, On<q_proj, v_proj, down_proj>>,
                          Apply<Checkpointed<>, EveryBlock>>;
  using H = Train<M, Batch<2>, Seq<16>, AdamW8bit>;
  using C = Train<M, Batch<2>, Seq<16>, AdamW8bit, OnCuda>;
  compare_with_host<H, C>(3, 1e-4, 1e-3);
}

TEST_CASE("cuda::Trainer f32 matches host::Trainer: offloaded blocks, accumulation, SGD", "[trainer]") {
  using M = models::GPT2<small_gpt2, Apply<Offloaded<>, EveryBlock>>;
  using H = Train<M, Batch<1>, Seq<16>, Accumulate<2>, SGD<>>;
  using C = Train<M, Batch<1>, Seq<16>, Accumulate<2>, SGD<>, OnCuda>;
  compare_with_host<H, C>(2, 1e-4, 1e-3);
}

TEST_CASE("cuda::Trainer f32 matches host::Trainer: UpdateInBackward", "[trainer]") {
  using M = models::Llama<models::tiny_llama, Apply<LoRA<4>, On<q_proj, v_proj>>>;
  TrainOptions o = options();
  o.clip_norm = 0;
  host::Trainer<Train<M, Batch<2>, Seq<16>, UpdateInBackward>> h(o);
  cuda::Trainer<Train<M, Batch<2>, Seq<16>, UpdateInBackward, OnCuda>> c(o);
  const Curve a = train_steps(h, 3, models::tiny_llama.vocab);
  const Curve b = train_steps(c, 3, models::tiny_llama.vocab);
  for (int i = 0; i < 3; ++i) {
    INFO("step " << i + 1 << ": host " << a.loss[i] << " cuda " << b.loss[i]);
    CHECK(std::fabs(a.loss[i] - b.loss[i]) <= 1e-4 * a.loss[i]);
  }
}

// bf16 storage with f32 master weights against the f32 host run: the first
// loss differs only by rounding the weights and activations to bf16 (8
// significant bits, ~0.4% per value, averaging out over a row), well inside
// 2%; training still lowers the loss on a repeated batch.
TEST_CASE("cuda::Trainer bf16 stays close to the f32 host run and learns", "[trainer]") {
  using H = Train<models::GPT2<small_gpt2>, Batch<2>, Seq<16>>;
  using C = Train<models::GPT2<small_gpt2>, Batch<2>, Seq<16>, Precision<BF16>, OnCuda>;
  host::Trainer<H> h(options());
  cuda::Trainer<C> c(options());
  const std::vector<std::int32_t> stream = token_pattern(33, small_gpt2.vocab, 5);
  const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
  const double first_host = h.step(tokens, targets).loss;
  const double first = c.step(tokens, targets).loss;
  CHECK(std::fabs(first - first_host) <= 0.02 * first_host);
  double last = first;
  for (int i = 0; i < 8; ++i) last = c.step(tokens, targets).loss;
  CHECK(last < first - 0.5);
}

TEST_CASE("cuda::Trainer rejects a bad batch with the host's message", "[trainer]") {
  using C = Train<models::GPT2<small_gpt2>, Batch<1>, Seq<8>, OnCuda>;
  cuda::Trainer<C> c(options());
  std::vector<std::int32_t> tokens(8, 1), targets(8, 1);
  targets[3] = 384;
  CHECK_THROWS_WITH(c.step(tokens, targets), Catch::Contains("outside the vocabulary [0, 384)"));
  CHECK_THROWS_WITH(c.step(std::vector<std::int32_t>(7, 1), targets), Catch::Contains("expected 8 token ids"));
}

}  // namespace

namespace {

// A step replayed from a captured CUDA graph computes what the same step
// enqueued kernel by kernel computes (the batch and the hyperparameters
// reach the graph through the pinned staging and the control block).
TEST_CASE("cuda::Trainer: steps replayed from a CUDA graph match eager steps", "[trainer][graph]") {
  using M = models::Llama<models::tiny_llama, Apply<LoRA<4>, On<q_proj, v_proj>>, Apply<Checkpointed<>, EveryBlock>>;
  using C = Train<M, Batch<2>, Seq<16>, Accumulate<2>, OnCuda>;
  TrainOptions o = options();
  o.warmup_steps = 2;  // a learning rate that changes from step to step
  cuda::Trainer<C> eager(o);
  o.cuda_graph = true;
  cuda::Trainer<C> graph(o);
  const Curve a = train_steps(eager, 4, models::tiny_llama.vocab);
  const std::int64_t allocations = cuda::AllocationCounter::device + cuda::AllocationCounter::pinned;
  const Curve b = train_steps(graph, 4, models::tiny_llama.vocab);
  CHECK(graph.graph_captured());
  CHECK(!eager.graph_captured());
  CHECK(cuda::AllocationCounter::device + cuda::AllocationCounter::pinned == allocations);
  for (int i = 0; i < 4; ++i) {
    INFO("step " << i + 1 << ": eager " << a.loss[i] << " graph " << b.loss[i]);
    // the same kernels in the same order; float atomics (embedding backward)
    // may add in another order on a GPU
    CHECK(std::fabs(a.loss[i] - b.loss[i]) <= 1e-6 * a.loss[i]);
    CHECK(std::fabs(a.norm[i] - b.norm[i]) <= 1e-5 * a.norm[i]);
  }
}

// A loss that is not finite stops the step before any update, as on the
// host: the exception names the step, and the weights stay those of the
// step before.
TEST_CASE("cuda::Trainer: a non-finite loss updates nothing", "[trainer]") {
  using C = Train<models::GPT2<small_gpt2>, Batch<1>, Seq<8>, SGD<Ratio<0>>, OnCuda>;
  for (const bool graph : {false, true}) {
    INFO("cuda_graph = " << graph);
    TrainOptions o = options();
    o.lr = 1e12;  // diverges within a few steps
    o.clip_norm = 0;
    o.cuda_graph = graph;
    cuda::Trainer<C> c(o);
    const ParamSlot* w = cuda::Trainer<C>::find("h.0.mlp.c_fc.weight");
    REQUIRE(w != nullptr);
    bool thrown = false;
    for (int i = 0; i < 12 && !thrown; ++i) {
      const std::vector<float> before = c.download_weight(*w);
      const int done = c.steps_done();
      try {
        train_steps(c, 1, small_gpt2.vocab);
      } catch (const non_finite_loss& e) {
        thrown = true;
        CHECK(e.step() == done + 1);
        CHECK(c.steps_done() == done);
        CHECK(c.download_weight(*w) == before);
      }
    }
    CHECK(thrown);
  }
}

}  // namespace

namespace {

// Hugging Face checkpoints move between the engines: a model saved by the
// host trainer and loaded into the CUDA trainer (quantizing its NF4
// projections as it loads) trains with the host's losses, and what the CUDA
// trainer saves loads back into a host trainer unchanged.
TEST_CASE("cuda::Trainer loads and saves Hugging Face checkpoints like host::Trainer", "[trainer][io]") {
  using M = models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj>>>;
  using H = Train<M, Batch<2>, Seq<16>>;
  using C = Train<M, Batch<2>, Seq<16>, OnCuda>;
  const auto dir = std::filesystem::temp_directory_path() / "headroom_cuda_io_test";
  std::filesystem::create_directories(dir);
  TrainOptions other = options();
  other.seed = 7;  // different initial weights, replaced by the file's
  host::Trainer<H> h(other);
  io::save_pretrained(h, dir / "base.safetensors");
  cuda::Trainer<C> c(options());
  io::load_pretrained(c, dir / "base.safetensors");
  io::save_pretrained(c, dir / "from_cuda.safetensors");
  host::Trainer<H> back(options());
  io::load_pretrained(back, dir / "from_cuda.safetensors");
  for (std::size_t k = 0; k < host::Trainer<H>::param_count; ++k) {
    const ParamSlot& p = host::Trainer<H>::param(k);
    if (io::is_adapter_param(p.name)) continue;
    INFO(host::Trainer<H>::path_of(p));
    // NF4 codes re-quantized from their own dequantized values are the same codes
    CHECK(io::detail::hf::dense_values(back, p) == io::detail::hf::dense_values(h, p));
  }
  // `back` and `c` share base weights (the file's) and adapters (seed 99)
  const Curve a = train_steps(back, 2, models::tiny_llama.vocab);
  const Curve b = train_steps(c, 2, models::tiny_llama.vocab);
  for (int i = 0; i < 2; ++i) CHECK(std::fabs(a.loss[i] - b.loss[i]) <= 1e-4 * a.loss[i]);
  std::filesystem::remove_all(dir);
}

}  // namespace
