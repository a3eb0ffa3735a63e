// Whole training steps of cuda::Trainer against host::Trainer: the same
// model, initial weights (trainers::InitialValues), batches and optimizer;
// the losses and gradient norms of several steps must agree. On a GPU this
// is the engine's end-to-end test; under the emulator it checks the
// trainer's dispatch, arena offsets, chunking and copies with kernels run on
// the CPU and cuBLASLt's products computed by the emulator.
#include "../support/kernel_test.hpp"
#include "../support/trainer_test.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/train/cuda/trainer.cuh>
#include <headroom/train/host/trainer.hpp>

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

// The CUDA run of HostRun (the same options plus OnCuda) against the host
// trainer: losses and gradient norms of `steps` steps within rel.
template <class HostRun, class CudaRun>
void compare_with_host(int steps, double loss_rel, double norm_rel) {
  host::Trainer<HostRun> h(cuda_test::trainer_options());
  cuda::Trainer<CudaRun> c(cuda_test::trainer_options());
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

// Qwen3: q / k norms on each head, heads of 48 (apart from 128 / 4).
// Mistral: a window of 12 over 160 positions, so that a query tile's keys lie
// in tiles wholly inside, partly inside and wholly outside the window.
constexpr models::LlamaConfig tiny_qwen3{.vocab = 256, .dim = 128, .ffn = 256, .layers = 2, .heads = 4, .kv_heads = 2,
                                         .max_positions = 64, .rms_norm_eps = real(1e-6), .arch = models::LlamaArch::qwen3,
                                         .head_dim = 48, .qk_norm = true};
constexpr models::LlamaConfig tiny_mistral{.vocab = 256, .dim = 128, .ffn = 256, .layers = 2, .heads = 4, .kv_heads = 2,
                                           .max_positions = 160, .arch = models::LlamaArch::mistral, .sliding_window = 12};

TEST_CASE("cuda::Trainer f32 matches host::Trainer: Qwen3 (per-head q / k norms) and Mistral (sliding window)", "[trainer]") {
  using HQ = Train<models::Llama<tiny_qwen3>, Batch<2>, Seq<16>>;
  using CQ = Train<models::Llama<tiny_qwen3>, Batch<2>, Seq<16>, OnCuda>;
  compare_with_host<HQ, CQ>(3, 1e-4, 1e-3);
  using HM = Train<models::Llama<tiny_mistral>, Batch<1>, Seq<160>>;
  using CM = Train<models::Llama<tiny_mistral>, Batch<1>, Seq<160>, OnCuda>;
  compare_with_host<HM, CM>(3, 1e-4, 1e-3);
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

// LoRA dropout: both engines drop the same elements (math/dropout.hpp), in
// the forward, a checkpointed block's recompute and the backward, each
// micro-batch its own mask.
TEST_CASE("cuda::Trainer f32 matches host::Trainer: LoRA dropout (checkpointed blocks, Accumulate<2>)", "[trainer]") {
  using M = models::Llama<models::tiny_llama, Apply<LoRA<4, Linear<>, Ratio<8>, Ratio<1, 10>>, On<q_proj, v_proj, down_proj>>,
                          Apply<Checkpointed<>, EveryBlock>>;
  compare_with_host<Train<M, Batch<2>, Seq<16>, Accumulate<2>>, Train<M, Batch<2>, Seq<16>, Accumulate<2>, OnCuda>>(3, 1e-4, 1e-3);
}

// Blocks 1 and 3 checkpointed, 0 and 2 not: four groups of one block each
// (layers/block_runs.hpp), the recompute only where a block is checkpointed.
TEST_CASE("cuda::Trainer f32 matches host::Trainer: selected blocks checkpointed (Blocks<1, 3>)", "[trainer]") {
  using M = models::Llama<models::tiny_llama, Apply<LoRA<4>, On<q_proj, v_proj>>, Apply<Checkpointed<>, Blocks<1, 3>>>;
  static_assert(M::blocks::run_count == 4);
  compare_with_host<Train<M, Batch<2>, Seq<16>>, Train<M, Batch<2>, Seq<16>, OnCuda>>(3, 1e-4, 1e-3);
}

// The MLP's activation recomputed before down_proj's backward (On<mlp_act>).
TEST_CASE("cuda::Trainer f32 matches host::Trainer: the MLP's activation recomputed (On<mlp_act>)", "[trainer]") {
  using M = models::Llama<models::tiny_llama, Apply<Checkpointed<>, On<mlp_act>>>;
  static_assert(plan<Train<M, Batch<2>, Seq<16>, OnCuda>>().flops_recompute > 0);
  compare_with_host<Train<M, Batch<2>, Seq<16>>, Train<M, Batch<2>, Seq<16>, OnCuda>>(3, 1e-4, 1e-3);
}

template <class M>
void update_in_backward_matches_host(int steps) {
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0;
  host::Trainer<Train<M, Batch<2>, Seq<16>, UpdateInBackward>> h(o);
  cuda::Trainer<Train<M, Batch<2>, Seq<16>, UpdateInBackward, OnCuda>> c(o);
  const Curve a = train_steps(h, steps, models::tiny_llama.vocab);
  const Curve b = train_steps(c, steps, models::tiny_llama.vocab);
  for (int i = 0; i < steps; ++i) {
    INFO("step " << i + 1 << ": host " << a.loss[i] << " cuda " << b.loss[i]);
    CHECK(std::fabs(a.loss[i] - b.loss[i]) <= 1e-4 * a.loss[i]);
  }
}

TEST_CASE("cuda::Trainer f32 matches host::Trainer: UpdateInBackward", "[trainer]") {
  update_in_backward_matches_host<models::Llama<models::tiny_llama, Apply<LoRA<4>, On<q_proj, v_proj>>>>(3);
}

// Every parameter trained, the LM head untied: the loss event completes the
// LM head's gradient, and its update runs right after it (a step that left
// it out kept the head at its initial values: 5.5572 against 5.5495 at
// step 2, and further apart after).
TEST_CASE("cuda::Trainer f32 matches host::Trainer: UpdateInBackward updates the LM head after the loss event", "[trainer]") {
  using M = models::Llama<models::tiny_llama>;
  using S = cuda::Trainer<Train<M, Batch<2>, Seq<16>, UpdateInBackward, OnCuda>>;
  bool head_at_loss = false;
  for (const Step& st : S::sched.steps)
    for (int u = st.update_begin; u < st.update_end; ++u)
      head_at_loss = head_at_loss || (st.kind == EventKind::loss && S::path_of(S::param(S::sched.updates[u])) == "lm_head.weight");
  CHECK(head_at_loss);
  update_in_backward_matches_host<M>(4);
}

// bf16 storage with f32 master weights against the f32 host run: the first
// loss differs only by rounding the weights and activations to bf16 (8
// significant bits, ~0.4% per value, averaging out over a row), well inside
// 2%; training still lowers the loss on a repeated batch.
TEST_CASE("cuda::Trainer bf16 stays close to the f32 host run and learns", "[trainer]") {
  using H = Train<models::GPT2<small_gpt2>, Batch<2>, Seq<16>>;
  using C = Train<models::GPT2<small_gpt2>, Batch<2>, Seq<16>, Precision<BF16>, OnCuda>;
  host::Trainer<H> h(cuda_test::trainer_options());
  cuda::Trainer<C> c(cuda_test::trainer_options());
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
  cuda::Trainer<C> c(cuda_test::trainer_options());
  std::vector<std::int32_t> tokens(8, 1), targets(8, 1);
  targets[3] = 384;
  CHECK_THROWS_WITH(c.step(tokens, targets), Catch::Contains("outside the vocabulary [0, 384)"));
  CHECK_THROWS_WITH(c.step(std::vector<std::int32_t>(7, 1), targets), Catch::Contains("expected 8 token ids"));
}

}  // namespace

namespace {

// A step replayed from a captured CUDA graph computes what the same step
// enqueued kernel by kernel computes (the batch and the hyperparameters
// reach the graph through the pinned staging and the control block). The
// adapters' dropout reads the step from the control block: a replay that
// kept the captured step's masks would differ from the second step on.
TEST_CASE("cuda::Trainer: steps replayed from a CUDA graph match eager steps", "[trainer][graph]") {
  using M = models::Llama<models::tiny_llama, Apply<LoRA<4, Linear<>, Ratio<4>, Ratio<1, 5>>, On<q_proj, v_proj>>,
                          Apply<Checkpointed<>, EveryBlock>>;
  using C = Train<M, Batch<2>, Seq<16>, Accumulate<2>, OnCuda>;
  TrainOptions o = cuda_test::trainer_options();
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
    TrainOptions o = cuda_test::trainer_options();
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
  TrainOptions other = cuda_test::trainer_options();
  other.seed = 7;  // different initial weights, replaced by the file's
  host::Trainer<H> h(other);
  io::save_pretrained(h, dir / "base.safetensors");
  cuda::Trainer<C> c(cuda_test::trainer_options());
  io::load_pretrained(c, dir / "base.safetensors");
  io::save_pretrained(c, dir / "from_cuda.safetensors");
  host::Trainer<H> back(cuda_test::trainer_options());
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

namespace {

// ---- weights set from the host are the ones the next step trains --------------------------------------

// upload_weight (what load_pretrained calls) copies from pageable host
// memory; the step's kernels run on a non-blocking stream, which a copy on
// the legacy default stream is not ordered with. The emulator lands such a
// copy as late as CUDA allows, so a step right after an upload that is not
// ordered with the compute stream trains the old weights.
TEST_CASE("cuda::Trainer: weights uploaded right before a step are the weights it trains", "[trainer][upload]") {
  using H = Train<models::GPT2<small_gpt2>, Batch<2>, Seq<16>>;
  using C = Train<models::GPT2<small_gpt2>, Batch<2>, Seq<16>, OnCuda>;
  host::Trainer<H> h(cuda_test::trainer_options());
  cuda::Trainer<C> c(cuda_test::trainer_options());
  // new values for every parameter: the host's at another seed
  TrainOptions other = cuda_test::trainer_options();
  other.seed = 5;
  host::Trainer<H> source(other);
  for (std::size_t k = 0; k < host::Trainer<H>::param_count; ++k) {
    const ParamSlot& p = host::Trainer<H>::param(k);
    const float* w = source.weight(p);
    std::copy(w, w + p.elements(), h.weight(p));
    c.upload_weight(cuda::Trainer<C>::param(k), std::span<const float>(w, static_cast<std::size_t>(p.elements())));
  }
  // the last upload, right before the step: the (tied) token embedding, which every logit reads
  const ParamSlot& wte = *host::Trainer<H>::find("wte.weight");
  std::vector<float> table(source.weight(wte), source.weight(wte) + wte.elements());
  for (float& x : table) x *= 1.5f;
  std::copy(table.begin(), table.end(), h.weight(wte));
  c.upload_weight(*cuda::Trainer<C>::find("wte.weight"), table);
  const Curve a = train_steps(h, 2, small_gpt2.vocab);
  const Curve b = train_steps(c, 2, small_gpt2.vocab);
  for (int i = 0; i < 2; ++i) {
    INFO("step " << i + 1 << ": host " << a.loss[i] << " cuda " << b.loss[i]);
    CHECK(std::fabs(a.loss[i] - b.loss[i]) <= 1e-4 * a.loss[i]);
  }
  // and what a step leaves is what the next download reads (no upload lands late over it)
  const std::vector<float> after = c.download_weight(*cuda::Trainer<C>::find("h.0.mlp.c_fc.weight"));
  const float* want = h.weight(*host::Trainer<H>::find("h.0.mlp.c_fc.weight"));  // the host plan's offsets
  CHECK(std::equal(after.begin(), after.end(), want, [](float x, float y) { return std::fabs(x - y) <= 1e-4f; }));
}

// ---- evaluate() after a captured step ---------------------------------------------------------------------

// evaluate() runs the forward only; the copy events it may wait for must be
// ones it recorded itself: after a captured step, the events of the backward's
// prefetches were last recorded inside the capture, which CUDA refuses to wait for.
TEST_CASE("cuda::Trainer: evaluate() after steps replayed from a CUDA graph (offloaded blocks)", "[trainer][graph]") {
  using M = models::GPT2<small_gpt2, Apply<Offloaded<>, EveryBlock>>;
  using C = Train<M, Batch<1>, Seq<16>, OnCuda>;
  TrainOptions o = cuda_test::trainer_options();
  cuda::Trainer<C> eager(o);
  o.cuda_graph = true;
  cuda::Trainer<C> graph(o);
  train_steps(eager, 3, small_gpt2.vocab);
  train_steps(graph, 3, small_gpt2.vocab);
  REQUIRE(graph.graph_captured());
  const std::vector<std::int32_t> stream = token_pattern(17, small_gpt2.vocab, 41);
  const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
  const double a = eager.evaluate(tokens, targets);
  const double b = graph.evaluate(tokens, targets);
  CHECK(std::fabs(a - b) <= 1e-6 * a);
  // and the graph still replays after it
  const Curve after = train_steps(graph, 1, small_gpt2.vocab);
  const Curve eager_after = train_steps(eager, 1, small_gpt2.vocab);
  CHECK(std::fabs(after.loss[0] - eager_after.loss[0]) <= 1e-6 * eager_after.loss[0]);
}

// ---- the LM head's padded logits -------------------------------------------------------------------------

// An odd vocabulary (GPT-2's 50,257) would give the logits an odd leading
// dimension; the plan pads it to a multiple of 64 (385 -> 448 here) and the
// loss ignores the padding columns: loss and every gradient are the host's.
TEST_CASE("cuda::Trainer: an odd vocabulary's logits have a padded leading dimension, loss and gradients are the host's",
          "[trainer][lm_head]") {
  constexpr models::GPT2Config odd{385, 64, 1, 4, 64};
  using H = Train<models::GPT2<odd>, Batch<2>, Seq<16>, LossChunk<12>>;
  using C = Train<models::GPT2<odd>, Batch<2>, Seq<16>, LossChunk<12>, OnCuda>;
  host::Trainer<H> h(cuda_test::trainer_options());
  cuda::Trainer<C> c(cuda_test::trainer_options());
  const std::vector<std::int32_t> stream = token_pattern(33, odd.vocab, 3);
  const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
#if !defined(__CUDACC__)
  cuda_emulator::blaslt_detail::matmul_log().clear();
#endif
  const double lc = c.forward_backward(tokens, targets);
  const double lh = h.forward_backward(tokens, targets);
  CHECK(std::fabs(lc - lh) <= 1e-5 * lh);
#if !defined(__CUDACC__)
  constexpr std::int64_t padded = 448;
  static_assert(CudaWorkspace::lm_head_logits_ld(odd.vocab) == padded);
  // cuBLASLt's column-major view: logits^T (V, rows) = W h^T, written at ld 448;
  // dh reads them as B (k = V), dW as B (n = V)
  int logits = 0, reads = 0;
  for (const auto& mm : cuda_emulator::blaslt_detail::matmul_log()) {
    if (mm.m == odd.vocab) {
      ++logits;
      CHECK(mm.ldd == padded);
    }
    if (mm.k == odd.vocab || mm.n == odd.vocab) {
      ++reads;
      CHECK(mm.ldb == padded);
    }
  }
  CHECK(logits == 3);  // ceil(32 / 12) chunks
  CHECK(reads == 2 * 3);
#endif
  for (std::size_t k = 0; k < cuda::Trainer<C>::param_count; ++k) {
    const ParamSlot& p = cuda::Trainer<C>::param(k);
    const ParamSlot& q = host::Trainer<H>::param(k);  // the same parameter at the host plan's offsets
    if (!p.trainable) continue;
    INFO(cuda::Trainer<C>::path_of(p));
    const std::vector<float> got = c.download_grad(p);
    const std::vector<float> want(h.grad(q), h.grad(q) + q.elements());
    float scale = 0;
    for (float g : want) scale = std::max(scale, std::fabs(g));
    CHECK(cuda_test::worst_ratio(got, want, 1e-4 * scale, 1e-3) <= 1.0);
  }
}

}  // namespace

namespace {

// ---- a finite loss with non-finite gradients --------------------------------------------------------------

// A block whose MLP computes GELU at 1e20 and multiplies the result by a zero
// c_proj: the forward (and the loss) stays finite, as gelu(1e20) = 1e20 and
// 1e20 x 0 = 0, but GELU's derivative there (math::gelu_tanh_grad in f32)
// is 0 x inf = NaN, so c_fc's gradient and everything before it in the
// backward is NaN. At 3e19 the derivative is still finite (1): every
// gradient element is finite, but c_proj's (dy^T gelu, ~1e18 each) has a sum
// of squares beyond f32.
template <class Trainer>
void break_mlp_backward(Trainer& t, float pre_activation = 1e20f) {
  const ParamSlot& bias = *Trainer::find("h.0.mlp.c_fc.bias");
  const ParamSlot& proj = *Trainer::find("h.0.mlp.c_proj.weight");
  t.upload_weight(bias, std::vector<float>(static_cast<std::size_t>(bias.elements()), pre_activation));
  t.upload_weight(proj, std::vector<float>(static_cast<std::size_t>(proj.elements()), 0.0f));
}

struct Snapshot {
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<std::byte>> states;
};
template <class Trainer>
Snapshot snapshot(const Trainer& t) {
  Snapshot s;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    s.weights.push_back(t.download_weight(Trainer::param(k)));
    s.states.push_back(t.download_state(Trainer::param(k)));
  }
  return s;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// The first parameter (schedule order) whose gradient holds a NaN or an infinity, from the arena.
template <class Trainer>
std::string first_non_finite_grad(const Trainer& t) {
  for (std::size_t k = 0; k < Trainer::param_count; ++k)
    if (!all_finite(t.download_grad(Trainer::param(k)))) return Trainer::path_of(Trainer::param(k));
  return "";
}

constexpr models::GPT2Config nan_gpt2{96, 32, 2, 2, 16};

TEST_CASE("cuda::Trainer: a finite loss with a non-finite gradient updates nothing and names the parameter",
          "[trainer][non_finite]") {
  using C = Train<models::GPT2<nan_gpt2>, Batch<1>, Seq<8>, OnCuda>;
  for (const double clip : {1.0, 0.0})
    for (const bool graph : {false, true}) {
      INFO("clip_norm = " << clip << ", cuda_graph = " << graph);
      TrainOptions o = cuda_test::trainer_options();
      o.clip_norm = clip;
      o.cuda_graph = graph;
      cuda::Trainer<C> c(o);
      const Curve first = train_steps(c, 1, nan_gpt2.vocab);
      CHECK(first.norm[0] > 0);  // computed (and reported) with clipping off too
      break_mlp_backward(c);
      const Snapshot before = snapshot(c);
      bool thrown = false;
      try {
        train_steps(c, 1, nan_gpt2.vocab);
      } catch (const non_finite_gradient& e) {
        thrown = true;
        CHECK(e.step() == 2);
        CHECK(e.parameter() == first_non_finite_grad(c));
        CHECK(!e.parameter().empty());
        CHECK_THAT(e.what(), Catch::Contains("step 2") && Catch::Contains(e.parameter()));
      }
      REQUIRE(thrown);
      CHECK(c.steps_done() == 1);
      const Snapshot after = snapshot(c);
      for (std::size_t k = 0; k < cuda::Trainer<C>::param_count; ++k) {
        INFO(cuda::Trainer<C>::path_of(cuda::Trainer<C>::param(k)));
        CHECK(same_bits(after.weights[k], before.weights[k]));
        CHECK(after.states[k] == before.states[k]);
      }
    }
}

// Every gradient element finite, but a sum of squares beyond f32: the global
// norm is infinite, nothing is updated, and the parameter whose own norm
// overflows is named.
TEST_CASE("cuda::Trainer: a gradient norm that overflows f32 updates nothing", "[trainer][non_finite]") {
  using C = Train<models::GPT2<nan_gpt2>, Batch<1>, Seq<8>, OnCuda>;
  cuda::Trainer<C> c(cuda_test::trainer_options());
  train_steps(c, 1, nan_gpt2.vocab);
  break_mlp_backward(c, 3e19f);
  const Snapshot before = snapshot(c);
  bool thrown = false;
  try {
    train_steps(c, 1, nan_gpt2.vocab);
  } catch (const non_finite_gradient& e) {
    thrown = true;
    CHECK(e.step() == 2);
    CHECK(e.parameter() == "h.0.mlp.c_proj.weight");
    CHECK_THAT(e.what(), Catch::Contains("every gradient element is finite"));
  }
  REQUIRE(thrown);
  CHECK(first_non_finite_grad(c).empty());
  const Snapshot after = snapshot(c);
  for (std::size_t k = 0; k < cuda::Trainer<C>::param_count; ++k) {
    CHECK(same_bits(after.weights[k], before.weights[k]));
    CHECK(after.states[k] == before.states[k]);
  }
}

// With UpdateInBackward a parameter is updated as soon as its gradient is
// complete: each update checks its own gradient; from the first non-finite
// one on, no update of the step runs; those before keep their (finite)
// update; the step count stays; the exception names the first parameter in
// schedule order with a non-finite gradient.
TEST_CASE("cuda::Trainer: UpdateInBackward stops updating at the first non-finite gradient", "[trainer][non_finite]") {
  using M = models::GPT2<nan_gpt2>;
  using C = Train<M, Batch<1>, Seq<8>, UpdateInBackward, OnCuda>;
  using Twin = Train<M, Batch<1>, Seq<8>, OnCuda>;  // keeps every gradient to the end of the step
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0;
  cuda::Trainer<C> c(o);
  cuda::Trainer<Twin> twin(o);
  train_steps(c, 1, nan_gpt2.vocab);
  train_steps(twin, 1, nan_gpt2.vocab);
  break_mlp_backward(c);
  break_mlp_backward(twin);
  const Snapshot before = snapshot(c);
  std::string expected;
  try {
    train_steps(twin, 1, nan_gpt2.vocab);
  } catch (const non_finite_gradient&) {
  }
  expected = first_non_finite_grad(twin);
  REQUIRE(!expected.empty());
  // the update order: the first position whose parameter's gradient is non-finite
  // (parameter k of one plan is parameter k of the other, at other offsets)
  constexpr auto& sched = cuda::Trainer<C>::sched;
  int trainable = 0;
  for (const ParamSlot& p : sched.params) trainable += p.trainable ? 1 : 0;
  int first_bad = -1;
  for (int i = 0; i < trainable && first_bad < 0; ++i)
    if (!all_finite(twin.download_grad(cuda::Trainer<Twin>::param(static_cast<std::size_t>(sched.updates[i]))))) first_bad = i;
  REQUIRE(first_bad > 0);  // some parameters are updated before it
  bool thrown = false;
  try {
    train_steps(c, 1, nan_gpt2.vocab);
  } catch (const non_finite_gradient& e) {
    thrown = true;
    CHECK(e.step() == 2);
    CHECK(e.parameter() == expected);
  }
  REQUIRE(thrown);
  CHECK(c.steps_done() == 1);
  const Snapshot after = snapshot(c);
  for (int i = 0; i < trainable; ++i) {
    const std::size_t k = static_cast<std::size_t>(sched.updates[i]);
    INFO("update " << i << ": " << cuda::Trainer<C>::path_of(sched.params[k]));
    if (i < first_bad) {
      CHECK(!same_bits(after.weights[k], before.weights[k]));
      CHECK(all_finite(after.weights[k]));
      CHECK(after.states[k] != before.states[k]);
    } else {
      CHECK(same_bits(after.weights[k], before.weights[k]));
      CHECK(after.states[k] == before.states[k]);
    }
  }
}

}  // namespace
namespace {

// ---- OffloadOptimizer (ZeRO-Offload) ----------------------------------------------------------------------

// An OffloadOptimizer run against the same run without it: the update runs on
// the CPU from the offload tier with the update kernels' element math (the
// emulator rounds the host's f32 as the kernels' f32), so every loss, weight
// and optimizer state is the same bits; with clipping the CPU sums the
// squares in the norm kernel's order, so the norm (and clip scale) is too.
// Without clipping the norm is the per-parameter sums' (double, schedule
// order) against the kernel's f32 tree: within norm_rel. With
// OffloadParameters too the parameters' values live in the offload tier and
// every event reads the copy its fetch brought: the same bits again.
template <class Off, class Ref>
void compare_offloaded(TrainOptions o, int steps, std::int64_t vocab, double norm_rel) {
  static_assert(plan<Off>().bytes(Role::optimizer_state, Tier::device) == 0 &&
                plan<Off>().bytes(Role::master_weights, Tier::device) == 0);
  static_assert(plan<Off>().bytes(Role::optimizer_state, Tier::offload) == plan<Ref>().bytes(Role::optimizer_state));
  // OffloadParameters: every stored parameter in the offload tier (the device's weights are fetched copies)
  static_assert(!Off::config().offload_params || plan<Off>().bytes(Role::weights, Tier::offload) == plan<Ref>().bytes(Role::weights));
  cuda::Trainer<Ref> ref(o);
  cuda::Trainer<Off> off(o);
  REQUIRE(off.arena_bytes(Tier::device) == plan<Off>().peak_bytes(Tier::device));
  REQUIRE(off.arena_bytes(Tier::offload) == plan<Off>().peak_bytes(Tier::offload));
  const std::int64_t allocations = cuda::AllocationCounter::device + cuda::AllocationCounter::pinned;
  const Curve a = train_steps(ref, steps, vocab);
  const Curve b = train_steps(off, steps, vocab);
  CHECK(cuda::AllocationCounter::device + cuda::AllocationCounter::pinned == allocations);
  int clipped = 0;
  for (int i = 0; i < steps; ++i) {
    INFO("step " << i + 1 << ": loss " << a.loss[i] << " offloaded " << b.loss[i] << "; norm " << a.norm[i] << " offloaded "
                 << b.norm[i]);
    CHECK(a.loss[i] == b.loss[i]);
    if (norm_rel == 0) CHECK(a.norm[i] == b.norm[i]);
    else CHECK(std::fabs(a.norm[i] - b.norm[i]) <= norm_rel * a.norm[i]);
    clipped += o.clip_norm > 0 && a.norm[i] > o.clip_norm ? 1 : 0;
  }
  if (o.clip_norm > 0) CHECK(clipped == steps);  // the clip scale acts at every step
  for (std::size_t k = 0; k < cuda::Trainer<Ref>::param_count; ++k) {
    const ParamSlot& p = cuda::Trainer<Ref>::param(k);
    const ParamSlot& q = cuda::Trainer<Off>::param(k);
    INFO(cuda::Trainer<Ref>::path_of(p));
    if (p.quant.kind == QuantKind::none) {
      CHECK(same_bits(off.download_weight(q), ref.download_weight(p)));  // the master copy, or a frozen parameter's values
      CHECK(same_bits(off.download_stored(q), ref.download_stored(p)));  // what the kernels read (fetched, with OffloadParameters)
    } else {
      CHECK(same_bits(off.download_dense(q), ref.download_dense(p)));
    }
    CHECK(off.download_state(q) == ref.download_state(p));
  }
  // the device's weights: what the next forward reads
  const std::vector<std::int32_t> stream = token_pattern(static_cast<std::size_t>(cuda::Trainer<Ref>::tokens_per_micro_batch) + 1, vocab, 23);
  const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
  CHECK(off.evaluate(tokens, targets) == ref.evaluate(tokens, targets));
}

TEST_CASE("cuda::Trainer OffloadOptimizer: AdamW bf16 trains bit for bit as on the device, clipped and not", "[trainer][offload]") {
  using M = models::GPT2<small_gpt2>;
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0.5;
  compare_offloaded<Train<M, Batch<2>, Seq<16>, Precision<BF16>, OffloadOptimizer, OnCuda>,
                    Train<M, Batch<2>, Seq<16>, Precision<BF16>, OnCuda>>(o, 20, small_gpt2.vocab, 0);
  o.clip_norm = 0;
  compare_offloaded<Train<M, Batch<2>, Seq<16>, Precision<BF16>, OffloadOptimizer, OnCuda>,
                    Train<M, Batch<2>, Seq<16>, Precision<BF16>, OnCuda>>(o, 20, small_gpt2.vocab, 1e-5);
}

// A Llama small enough for the emulator's AdamW8bit kernel (a block of 256
// threads per 256 elements) over 20 steps.
constexpr models::LlamaConfig two_layer_llama{64, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions

TEST_CASE("cuda::Trainer OffloadOptimizer: AdamW8bit", "[trainer][offload]") {
  using M = models::Llama<two_layer_llama>;
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0.5;
  compare_offloaded<Train<M, Batch<2>, Seq<16>, Precision<BF16>, AdamW8bit, OffloadOptimizer, OnCuda>,
                    Train<M, Batch<2>, Seq<16>, Precision<BF16>, AdamW8bit, OnCuda>>(o, 20, two_layer_llama.vocab, 0);
}

TEST_CASE("cuda::Trainer OffloadOptimizer: SGD with Accumulate<2> (f32)", "[trainer][offload]") {
  using M = models::GPT2<small_gpt2>;
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0;
  compare_offloaded<Train<M, Batch<1>, Seq<16>, Accumulate<2>, SGD<>, OffloadOptimizer, OnCuda>,
                    Train<M, Batch<1>, Seq<16>, Accumulate<2>, SGD<>, OnCuda>>(o, 20, small_gpt2.vocab, 1e-5);
}

TEST_CASE("cuda::Trainer OffloadOptimizer: LoRA", "[trainer][offload]") {
  using M = models::Llama<two_layer_llama, Apply<LoRA<4>, On<q_proj, v_proj>>>;
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0.01;
  compare_offloaded<Train<M, Batch<2>, Seq<16>, Precision<BF16>, OffloadOptimizer, OnCuda>,
                    Train<M, Batch<2>, Seq<16>, Precision<BF16>, OnCuda>>(o, 20, two_layer_llama.vocab, 0);
}

// ---- OffloadParameters (ZeRO-Infinity) ----------------------------------------------------------------------
// OffloadOptimizer + OffloadParameters against the same run on the device:
// the fetches copy each event's parameters from the pinned tier on the copy
// stream, and the CPU's update writes the stored values there.

TEST_CASE("cuda::Trainer OffloadParameters: AdamW bf16, GPT-2's tied head, clipped and not", "[trainer][offload][offload_params]") {
  using M = models::GPT2<small_gpt2>;
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0.5;
  compare_offloaded<Train<M, Batch<2>, Seq<16>, Precision<BF16>, OffloadOptimizer, OffloadParameters, OnCuda>,
                    Train<M, Batch<2>, Seq<16>, Precision<BF16>, OnCuda>>(o, 20, small_gpt2.vocab, 0);
  o.clip_norm = 0;
  compare_offloaded<Train<M, Batch<2>, Seq<16>, Precision<BF16>, OffloadOptimizer, OffloadParameters, OnCuda>,
                    Train<M, Batch<2>, Seq<16>, Precision<BF16>, OnCuda>>(o, 20, small_gpt2.vocab, 1e-5);
}

TEST_CASE("cuda::Trainer OffloadParameters: QLoRA (NF4 + LoRA, checkpointed blocks, AdamW8bit) with Accumulate<2>",
          "[trainer][offload][offload_params]") {
  using M = models::Llama<two_layer_llama, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj, down_proj>>, Apply<Checkpointed<>, EveryBlock>>;
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0.01;
  compare_offloaded<Train<M, Batch<1>, Seq<16>, Accumulate<2>, Precision<BF16>, AdamW8bit, OffloadOptimizer, OffloadParameters, OnCuda>,
                    Train<M, Batch<1>, Seq<16>, Accumulate<2>, Precision<BF16>, AdamW8bit, OnCuda>>(o, 20, two_layer_llama.vocab, 0);
  o.clip_norm = 0;
  compare_offloaded<Train<M, Batch<1>, Seq<16>, Accumulate<2>, Precision<BF16>, AdamW8bit, OffloadOptimizer, OffloadParameters, OnCuda>,
                    Train<M, Batch<1>, Seq<16>, Accumulate<2>, Precision<BF16>, AdamW8bit, OnCuda>>(o, 20, two_layer_llama.vocab, 1e-5);
}

// f32 (the master is the weight; the update writes both), with the blocks'
// activations offloaded: prefetches and fetches share the copy stream.
TEST_CASE("cuda::Trainer OffloadParameters: f32 SGD, offloaded blocks, Accumulate<2>", "[trainer][offload][offload_params]") {
  using M = models::GPT2<small_gpt2, Apply<Offloaded<>, EveryBlock>>;
  TrainOptions o = cuda_test::trainer_options();
  o.clip_norm = 0;
  compare_offloaded<Train<M, Batch<1>, Seq<16>, Accumulate<2>, SGD<>, OffloadOptimizer, OffloadParameters, OnCuda>,
                    Train<M, Batch<1>, Seq<16>, Accumulate<2>, SGD<>, OnCuda>>(o, 20, small_gpt2.vocab, 1e-5);
}

}  // namespace

namespace {

// A finite loss with non-finite gradients (break_mlp_backward) under
// OffloadOptimizer, as on the host engine: with clipping the norm needs every
// gradient, and the step stops before any update, naming the first parameter
// in schedule order with a NaN or an infinity; without clipping each
// parameter is updated on the CPU as soon as its gradient is offloaded, until
// the first gradient in backward order that is not finite or whose squares
// leave f32's range: those before keep their update (and their new weights
// reach the device, or with OffloadParameters the stored values the next
// fetches read), none after it is updated, the step count stays.
// C: the offloaded run; Twin: the same on the device, which keeps every gradient in the arena.
template <class C, class Twin>
void check_offloaded_non_finite() {
  constexpr auto& sched = cuda::Trainer<C>::sched;
  int trainable = 0;
  for (const ParamSlot& p : sched.params) trainable += p.trainable ? 1 : 0;
  const std::vector<std::int32_t> stream = token_pattern(9, nan_gpt2.vocab, 31);
  const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
  for (const double clip : {1.0, 0.0}) {
    INFO("clip_norm = " << clip);
    TrainOptions o = cuda_test::trainer_options();
    o.clip_norm = clip;
    cuda::Trainer<C> c(o);
    cuda::Trainer<Twin> twin(o);
    train_steps(c, 1, nan_gpt2.vocab);
    train_steps(twin, 1, nan_gpt2.vocab);
    break_mlp_backward(c);
    break_mlp_backward(twin);
    const Snapshot before = snapshot(c);
    try {
      train_steps(twin, 1, nan_gpt2.vocab);
    } catch (const non_finite_gradient&) {
    }
    const std::string expected = first_non_finite_grad(twin);
    REQUIRE(!expected.empty());
    // the update order's first gradient that stops the updates
    int first_bad = -1;
    for (int i = 0; i < trainable && first_bad < 0; ++i) {
      double sq = 0;
      for (const float g : twin.download_grad(cuda::Trainer<Twin>::param(static_cast<std::size_t>(sched.updates[i])))) sq += double(g) * g;
      if (!(sq <= std::numeric_limits<float>::max())) first_bad = i;
    }
    REQUIRE(first_bad > 0);
    bool thrown = false;
    try {
      train_steps(c, 1, nan_gpt2.vocab);
    } catch (const non_finite_gradient& e) {
      thrown = true;
      CHECK(e.step() == 2);
      CHECK(e.parameter() == expected);
      CHECK_THAT(e.what(), Catch::Contains(clip > 0 ? "nothing was updated" : "OffloadOptimizer without clipping"));
    }
    REQUIRE(thrown);
    CHECK(c.steps_done() == 1);
    const Snapshot after = snapshot(c);
    for (int i = 0; i < trainable; ++i) {
      const std::size_t k = static_cast<std::size_t>(sched.updates[i]);
      INFO("update " << i << ": " << cuda::Trainer<C>::path_of(sched.params[k]));
      if (clip == 0 && i < first_bad) {
        CHECK(!same_bits(after.weights[k], before.weights[k]));
        CHECK(all_finite(after.weights[k]));
        CHECK(after.states[k] != before.states[k]);
      } else {
        CHECK(same_bits(after.weights[k], before.weights[k]));
        CHECK(after.states[k] == before.states[k]);
      }
    }
    // the device holds the weights the offload tier holds: a trainer given them evaluates the same
    cuda::Trainer<Twin> copy(o);
    for (std::size_t k = 0; k < cuda::Trainer<C>::param_count; ++k)
      copy.upload_weight(cuda::Trainer<Twin>::param(k), c.download_weight(cuda::Trainer<C>::param(k)));
    CHECK(copy.evaluate(tokens, targets) == c.evaluate(tokens, targets));
  }
}

TEST_CASE("cuda::Trainer OffloadOptimizer: a non-finite gradient stops the updates and names the parameter",
          "[trainer][offload][non_finite]") {
  using M = models::GPT2<nan_gpt2>;
  check_offloaded_non_finite<Train<M, Batch<1>, Seq<8>, OffloadOptimizer, OnCuda>, Train<M, Batch<1>, Seq<8>, OnCuda>>();
}

TEST_CASE("cuda::Trainer OffloadParameters: a non-finite gradient stops the updates and names the parameter",
          "[trainer][offload][offload_params][non_finite]") {
  using M = models::GPT2<nan_gpt2>;
  check_offloaded_non_finite<Train<M, Batch<1>, Seq<8>, OffloadOptimizer, OffloadParameters, OnCuda>,
                             Train<M, Batch<1>, Seq<8>, OnCuda>>();
}

// A CUDA graph would replay the device work without the CPU's update between
// it and the weights' copies back: refused, with the reason.
TEST_CASE("cuda::Trainer OffloadOptimizer refuses cuda_graph", "[trainer][offload]") {
  using C = Train<models::GPT2<nan_gpt2>, Batch<1>, Seq<8>, OffloadOptimizer, OnCuda>;
  TrainOptions o = cuda_test::trainer_options();
  o.cuda_graph = true;
  CHECK_THROWS_WITH(cuda::Trainer<C>(o), Catch::Contains("OffloadOptimizer") && Catch::Contains("cuda_graph = false"));
}

}  // namespace
