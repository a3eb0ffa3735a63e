// Precision<BF16> on the host engine: bf16 weights, activations and
// gradients with f32 master weights, statistics and sums.
//
// - The plan's figures by hand: 2 B per stored weight, 4 B of master and
//   2 B of gradient per trainable element, AdamW's 8 B of state.
// - A bf16 run tracks the f32 run of the same model, seed and batches:
//   the initial loss within 0.1 % and gradient norm within 2 %, every step's loss within 3 % over 30
//   steps (bf16 keeps 8 significant bits: 0.4 % per rounding), and it learns
//   at least nine tenths as much as the f32 run.
// - The stored weights are the masters rounded to nearest even, to the bit,
//   after every update (the masters carry what bf16 cannot).
// - Each model family the host runs in bf16: Llama (RMSNorm, RoPE, GQA,
//   SwiGLU), GPT-2 (LayerNorm, learned positions, biases, GELU, tied head),
//   LoRA and QLoRA (NF4) adapters with checkpointed blocks, AdamW8bit, SGD.
// sanitizer build at -O1: 30-step runs compared step by step, four times slower at -O0.
#include <catch2/catch.hpp>

#include "support/repeats.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <utility>
#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/train/host/trainer.hpp>
#include <vector>

using namespace headroom;

namespace {

std::vector<std::int32_t> pattern(std::size_t n, int vocab, int shift) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((i * 7 + shift + i / 5) % vocab);
  return v;
}

// The losses of `steps` steps of Run's bf16 run and of its f32 twin (4 under
// the sanitizers, support/repeats.hpp: too few to ask that both learn).
template <class R16, class R32>
void tracks_f32(int steps, double first_tol, double step_tol, host::TrainOptions o = {.lr = 1e-3, .warmup_steps = 2}) {
  steps = test::repeats(steps, 4);
  host::Trainer<R16> a(o);
  host::Trainer<R32> b(o);
  using Tr = host::Trainer<R16>;
  const int vocab = static_cast<int>(Tr::vocab_size());
  double first = 0, last = 0, first32 = 0, last32 = 0;
  for (int s = 0; s < steps; ++s) {
    const auto tok = pattern(Tr::tokens_per_step, vocab, s), tgt = pattern(Tr::tokens_per_step, vocab, s + 1);
    const StepStats x = a.step(tok, tgt), y = b.step(tok, tgt);
    INFO("step " << s << " bf16 loss " << x.loss << " f32 loss " << y.loss << " norms " << x.grad_norm << " " << y.grad_norm);
    REQUIRE(std::isfinite(x.loss));
    CHECK(std::abs(x.loss - y.loss) <= (s == 0 ? first_tol : step_tol) * y.loss);
    if (s == 0) CHECK(std::abs(x.grad_norm - y.grad_norm) <= 0.02 * y.grad_norm);
    if (s == 0) first = x.loss, first32 = y.loss;
    last = x.loss;
    last32 = y.loss;
  }
  // both learn, the bf16 run at least nine tenths as much as the f32 run
  if (!test::under_sanitizers) {
    CHECK(first32 - last32 > 0.05);
    CHECK(first - last >= 0.9 * (first32 - last32));
  }
  // the stored weights are the masters rounded, to the bit
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const auto& p = Tr::param(k);
    const float* m = a.master(p);
    if (!p.trainable) {
      CHECK(m == nullptr);
      continue;
    }
    REQUIRE(m != nullptr);
    const host::bf16* w = a.weight(p);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < p.elements(); ++i) bad += w[i].bits != host::to_bf16(m[i]).bits;
    INFO(Tr::path_of(p));
    CHECK(bad == 0);
  }
}

}  // namespace

using Llama16 = Train<models::Llama<models::tiny_llama>, Batch<4>, Seq<64>, Precision<BF16>, Workers<2>>;
using Llama32 = Train<models::Llama<models::tiny_llama>, Batch<4>, Seq<64>, Workers<2>>;
using GPT2Model = models::GPT2<models::GPT2Config{256, 128, 2, 4, 128}>;
using GPT216 = Train<GPT2Model, Batch<4>, Seq<64>, Precision<BF16>, Workers<2>>;
using GPT232 = Train<GPT2Model, Batch<4>, Seq<64>, Workers<2>>;

TEST_CASE("host bf16: the plan's bytes by hand", "[host][bf16]") {
  constexpr auto p16 = plan<Llama16>();
  constexpr auto p32 = plan<Llama32>();
  const std::int64_t n = p32.bytes(Role::weights) / 4;  // every weight dense and trainable
  CHECK(p16.trainable_parameters() == n);
  CHECK(p16.bytes(Role::weights) == 2 * n);
  CHECK(p16.bytes(Role::master_weights) == 4 * n);
  CHECK(p16.bytes(Role::grads) == 2 * n);
  CHECK(p16.bytes(Role::optimizer_state) == 8 * n);
  CHECK(p32.bytes(Role::master_weights) == 0);
}

TEST_CASE("host bf16: Llama tracks its f32 run, weights are the masters rounded", "[host][bf16]") {
  tracks_f32<Llama16, Llama32>(30, 1e-3, 0.03);
}

TEST_CASE("host bf16: GPT-2 tracks its f32 run", "[host][bf16]") {
  tracks_f32<GPT216, GPT232>(30, 1e-3, 0.03);
}

using LoraCkpt16 = Train<models::GPT2<models::GPT2Config{256, 128, 2, 4, 128}, Apply<LoRA<8>, On<c_attn, c_fc>>,
                                      Apply<Checkpointed<>, EveryBlock>>,
                         Batch<4>, Seq<64>, Precision<BF16>, Workers<2>>;
using LoraCkpt32 = Train<models::GPT2<models::GPT2Config{256, 128, 2, 4, 128}, Apply<LoRA<8>, On<c_attn, c_fc>>,
                                      Apply<Checkpointed<>, EveryBlock>>,
                         Batch<4>, Seq<64>, Workers<2>>;
using QLoRAModel = models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<8>>, On<q_proj, k_proj, v_proj, o_proj>>,
                                 Apply<Checkpointed<>, EveryBlock>>;
using QLoRA16 = Train<QLoRAModel, Batch<4>, Seq<64>, AdamW8bit, Precision<BF16>, Workers<2>>;
using QLoRA32 = Train<QLoRAModel, Batch<4>, Seq<64>, AdamW8bit, Workers<2>>;
using SgdAcc16 = Train<models::Llama<models::tiny_llama>, Batch<2>, Seq<64>, Accumulate<2>, SGD<>, Precision<BF16>,
                       Workers<2>>;
using SgdAcc32 = Train<models::Llama<models::tiny_llama>, Batch<2>, Seq<64>, Accumulate<2>, SGD<>, Workers<2>>;
using Uib16 = Train<models::Llama<models::tiny_llama>, Batch<4>, Seq<64>, UpdateInBackward, Precision<BF16>, Workers<2>>;
using Uib32 = Train<models::Llama<models::tiny_llama>, Batch<4>, Seq<64>, UpdateInBackward, Workers<2>>;

TEST_CASE("host bf16: LoRA with checkpointed blocks tracks its f32 run", "[host][bf16]") {
  tracks_f32<LoraCkpt16, LoraCkpt32>(30, 1e-3, 0.03, {.lr = 1e-2, .warmup_steps = 2});
}
TEST_CASE("host bf16: QLoRA (NF4) with AdamW8bit tracks its f32 run", "[host][bf16]") {
  tracks_f32<QLoRA16, QLoRA32>(30, 1e-3, 0.03, {.lr = 1e-2, .warmup_steps = 2});
}
TEST_CASE("host bf16: SGD with momentum and Accumulate<2> tracks its f32 run", "[host][bf16]") {
  tracks_f32<SgdAcc16, SgdAcc32>(30, 1e-3, 0.03, {.lr = 0.05, .warmup_steps = 2});
}
TEST_CASE("host bf16: UpdateInBackward tracks its f32 run", "[host][bf16]") {
  tracks_f32<Uib16, Uib32>(30, 1e-3, 0.03, {.lr = 1e-3, .warmup_steps = 2, .clip_norm = 0});
}

// A bf16 run saves and resumes: the checkpoint holds the bf16 weights and
// the f32 masters, so the resumed run continues exactly (to the bit); the
// Hugging Face loader sets the masters with the stored values (else the
// first update would start from the old masters).
TEST_CASE("host bf16: a checkpoint resumes the run to the bit, load_pretrained sets the masters", "[host][bf16][io]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "headroom-bf16-io";
  fs::remove_all(dir);
  fs::create_directories(dir);
  using Tr = host::Trainer<Llama16>;
  const host::TrainOptions o{.lr = 1e-3, .warmup_steps = 2};
  const auto batch = [](int s) { return std::pair{pattern(Tr::tokens_per_step, 256, s), pattern(Tr::tokens_per_step, 256, s + 1)}; };
  Tr a(o);
  for (int s = 0; s < 3; ++s) a.step(batch(s).first, batch(s).second);
  io::save_checkpoint(a, dir / "ckpt");
  io::save_pretrained(a, dir / "model.safetensors");
  Tr b(o);
  io::load_checkpoint(b, dir / "ckpt");
  for (int s = 3; s < 6; ++s) {
    const auto [tok, tgt] = batch(s);
    const StepStats x = a.step(tok, tgt), y = b.step(tok, tgt);
    CHECK(x.loss == y.loss);
    CHECK(x.grad_norm == y.grad_norm);
  }
  Tr c(o);
  io::load_pretrained(c, dir / "model.safetensors");  // the weights of step 3, as f32 values of bf16 numbers
  Tr d(o);
  io::load_checkpoint(d, dir / "ckpt");
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const auto& p = Tr::param(k);
    INFO(Tr::path_of(p));
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < p.elements(); ++i) {
      bad += c.weight(p)[i].bits != d.weight(p)[i].bits;
      bad += c.master(p)[i] != host::to_float(d.weight(p)[i]);  // the loaded value itself, not an old master
    }
    CHECK(bad == 0);
  }
  fs::remove_all(dir);
}
