// Checkpoints of cuda::Trainer (io/checkpoint.hpp): a run saved after some
// steps and loaded into a fresh trainer goes on bit for bit as the run that
// was not interrupted, whatever holds its state (device memory; master
// weights and optimizer state in the pinned offload tier; quantized codes
// and the shared code tables; AdamW8bit's dynamic maps). An f32 checkpoint
// loads into host::Trainer and the other way round, and a checkpoint of
// another run is refused with the difference named.
#include "../support/kernel_test.hpp"
#include "../support/trainer_test.hpp"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/train/cuda/trainer.cuh>
#include <headroom/train/host/trainer.hpp>

namespace {

using namespace headroom;
namespace fs = std::filesystem;

constexpr models::LlamaConfig small_llama{64, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions

// The batch of step i (next-token targets of a pattern), the same for every trainer of a test.
template <class Trainer>
StepStats step_of(Trainer& t, int i) {
  const std::size_t n = static_cast<std::size_t>(Trainer::tokens_per_step);
  std::vector<std::int32_t> stream(n + 1);
  std::uint32_t s = 977u * static_cast<std::uint32_t>(i) + 5u;
  for (auto& x : stream) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(small_llama.vocab));
  }
  const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1), targets(stream.begin() + 1, stream.end());
  return t.step(tokens, targets);
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("headroom_cuda_checkpoint_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

// Everything a checkpoint holds, as bytes (the image's tensors).
template <class Trainer>
std::vector<std::vector<std::byte>> held(const Trainer& t) {
  const auto image = io::detail::checkpoint::image_of(t);
  std::vector<std::vector<std::byte>> out;
  for (const auto& views : {io::detail::checkpoint::model_tensors<Trainer>(image), io::detail::checkpoint::optimizer_tensors<Trainer>(image)})
    for (const io::TensorView& v : views) {
      std::int64_t n = size_of(v.dtype);
      for (const std::int64_t x : v.shape) n *= x;
      const auto* b = static_cast<const std::byte*>(v.data);
      out.emplace_back(b, b + n);
    }
  return out;
}

// Run R: 2 steps, save, 2 more steps; a fresh trainer loads the checkpoint
// and takes the same 2 steps: the same losses and gradient norms, and the
// same bytes of every weight, master copy, state and table after them.
template <class R>
void resumes_bit_for_bit(const std::string& name) {
  const fs::path dir = fresh_dir(name);
  TrainOptions o = cuda_test::trainer_options();
  cuda::Trainer<R> a(o);
  for (int i = 0; i < 2; ++i) step_of(a, i);
  io::save_checkpoint(a, dir, R"({"position": 2})");
  std::vector<StepStats> want;
  for (int i = 2; i < 4; ++i) want.push_back(step_of(a, i));

  o.seed = 12345;  // other initial values: all of them must come from the checkpoint
  cuda::Trainer<R> b(o);
  CHECK(io::load_checkpoint(b, dir) == R"({"position": 2})");
  CHECK(b.steps_done() == 2);
  for (int i = 2; i < 4; ++i) {
    const StepStats got = step_of(b, i);
    INFO(name << ", step " << i + 1);
    CHECK(got.loss == want[static_cast<std::size_t>(i - 2)].loss);
    CHECK(got.grad_norm == want[static_cast<std::size_t>(i - 2)].grad_norm);
  }
  CHECK(held(a) == held(b));
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("cuda::Trainer checkpoints resume bit for bit: f32 AdamW, bf16 with f32 masters and AdamW8bit's maps",
          "[trainer][checkpoint]") {
  using M = models::Llama<small_llama>;
  resumes_bit_for_bit<Train<M, Batch<2>, Seq<16>, OnCuda>>("f32");
  resumes_bit_for_bit<Train<M, Batch<2>, Seq<16>, Precision<BF16>, AdamW8bit, OnCuda>>("bf16_8bit");
}

TEST_CASE("cuda::Trainer checkpoints resume bit for bit: QLoRA (NF4 codes, scales and code tables, frozen base)",
          "[trainer][checkpoint]") {
  using M = models::Llama<small_llama, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj, down_proj>>>;
  resumes_bit_for_bit<Train<M, Batch<2>, Seq<16>, Precision<BF16>, OnCuda>>("qlora");
}

TEST_CASE("cuda::Trainer checkpoints resume bit for bit: the optimizer and parameters in the offload tier",
          "[trainer][checkpoint][offload]") {
  using M = models::Llama<small_llama>;
  resumes_bit_for_bit<Train<M, Batch<2>, Seq<16>, Precision<BF16>, OffloadOptimizer, OffloadParameters, OnCuda>>("offload");
}

TEST_CASE("cuda::Trainer and host::Trainer load each other's f32 checkpoints, another run's is refused", "[trainer][checkpoint]") {
  using M = models::Llama<small_llama>;
  using H = Train<M, Batch<2>, Seq<16>>;
  using C = Train<M, Batch<2>, Seq<16>, OnCuda>;
  const fs::path from_cuda = fresh_dir("from_cuda"), from_host = fresh_dir("from_host");
  cuda::Trainer<C> c(cuda_test::trainer_options());
  host::Trainer<H> h(cuda_test::trainer_options());
  for (int i = 0; i < 2; ++i) {
    step_of(c, i);
    step_of(h, i);
  }
  io::save_checkpoint(c, from_cuda);
  io::save_checkpoint(h, from_host);
  // each engine's checkpoint in the other: the same bytes as its saver holds, and the next step's loss within f32 summation noise
  cuda::Trainer<C> c2(cuda_test::trainer_options());
  host::Trainer<H> h2(cuda_test::trainer_options());
  io::load_checkpoint(c2, from_host);
  io::load_checkpoint(h2, from_cuda);
  CHECK(held(c2) == held(h));
  CHECK(held(h2) == held(c));
  const double lc = step_of(c2, 2).loss, lh = step_of(h, 2).loss;
  CHECK(std::fabs(lc - lh) <= 1e-4 * std::fabs(lh));
  // AdamW8bit keeps other state than AdamW: refused, naming it
  cuda::Trainer<Train<M, Batch<2>, Seq<16>, AdamW8bit, OnCuda>> other(cuda_test::trainer_options());
  CHECK_THROWS_WITH(io::load_checkpoint(other, from_cuda), Catch::Contains("AdamW8bit"));
  fs::remove_all(from_cuda);
  fs::remove_all(from_host);
}
