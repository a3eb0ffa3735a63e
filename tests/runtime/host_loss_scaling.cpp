// Dynamic loss scaling (train/loss_scaling.hpp) on the host engine, checked
// against evidence from outside the scaler:
//  - the rules, step by step, against GradScaler's (hand-derived sequences);
//  - a scaled step that does not overflow is the unscaled step to the bit
//    (a power-of-two scale commutes with every rounding), for plain, LoRA with
//    checkpointing and Accumulate<2>, bf16 and OffloadOptimizer runs;
//  - a run forced to overflow: its skipped steps change no weight, no
//    optimizer state and no step count, the scale backs off and grows as
//    GradScaler's would, which steps overflow agrees with the gradients an
//    unscaled twin computes, and the steps that ran are the twin's steps on
//    the same batches, to the bit;
//  - checkpoints keep the scaler's state (a resumed run continues to the bit);
//  - UpdateInBackward is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/train/host/trainer.hpp>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/fixtures.hpp"

using namespace headroom;
using Catch::Contains;
using headroom::test::Stream;
using headroom::test::TempDir;
using headroom::test::mismatch_at;

namespace {
constexpr models::LlamaConfig cfg{64, 64, 128, 2, 4, 2, 64, false};
using Model = models::Llama<cfg>;
using LoraCkpt = models::Llama<cfg, Apply<Checkpointed<LoRA<4>>, On<q_proj, v_proj, down_proj>>>;
template <class M, class... Options>
using RunOf = Train<M, Batch<4>, Seq<32>, Workers<2>, Options...>;

LossScaling dynamic(double init, int interval, double growth = 2.0, double backoff = 0.5) {
  return {.mode = LossScaling::dynamic, .init_scale = init, .growth_factor = growth, .backoff_factor = backoff,
          .growth_interval = interval};
}

// Every weight and optimizer state of a trainer, as bytes.
template <class Tr>
std::vector<std::byte> state_of(const Tr& t) {
  std::vector<std::byte> out;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    const auto* w = reinterpret_cast<const std::byte*>(t.weight(p));
    out.insert(out.end(), w, w + p.elements() * static_cast<std::int64_t>(sizeof(typename Tr::T)));
    if (t.state(p) != nullptr) out.insert(out.end(), t.state(p), t.state(p) + Tr::config.optim.state_bytes(p.elements()));
  }
  return out;
}

template <class Tr>
void set_norm_weight(Tr& t, float value) {
  for (std::size_t k = 0; k < Tr::param_count; ++k)
    if (Tr::path_of(Tr::param(k)) == "norm.weight") t.set_dense(Tr::param(k), std::vector<float>(64, value));
}

// The largest |gradient element| the trainer's last backward left, and the gradients' norm.
template <class Tr>
std::pair<double, double> gradient_extent(const Tr& t) {
  double m = 0, sq = 0;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    if (!p.trainable) continue;
    for (std::int64_t i = 0; i < p.elements(); ++i) {
      const double g = t.grad(p)[i];
      m = std::max(m, std::abs(g));
      sq += g * g;
    }
  }
  return {m, std::sqrt(sq)};
}

// Steps a scaled and an unscaled trainer of run R on the same batches: every
// figure and every byte of the state must agree.
template <class R>
void scaled_equals_unscaled(TrainOptions o) {
  using Tr = host::Trainer<R>;
  TempDir d1, d2;
  TrainOptions plain = o, scaled = o;
  plain.loss_scaling.mode = LossScaling::off;
  plain.offload_dir = d1.dir;
  scaled.loss_scaling = dynamic(1024.0, 2);
  scaled.offload_dir = d2.dir;
  Tr a(plain), b(scaled);
  REQUIRE(b.scales_loss());
  REQUIRE_FALSE(a.scales_loss());
  const float want_scale[] = {1024, 1024, 2048, 2048, 4096};  // growth after every 2 clean steps
  for (int s = 0; s < 5; ++s) {
    const Stream d(static_cast<std::size_t>(Tr::tokens_per_step), 20 + s);
    const StepStats x = a.step(d.tok, d.tgt), y = b.step(d.tok, d.tgt);
    INFO("step " << s + 1);
    CHECK(x.loss_scale == 1.0f);
    CHECK(y.loss_scale == want_scale[s]);
    CHECK_FALSE(y.skipped);
    CHECK(y.step == x.step);
    CHECK(y.loss == x.loss);
    CHECK(y.grad_norm == x.grad_norm);
    CHECK(mismatch_at(state_of(a), state_of(b)) == -1);
  }
  CHECK(b.loss_scale_state() == LossScaleState{.scale = 4096, .growth_tracker = 1, .skipped = 0});
}

// The overflow construction: the final norm's weight at 100 makes the
// largest gradient ~42 (about 2^5.4; the LM head's and the embedding's) and
// the norm ~340 (2^8.4). A scale of 2^127 overflows f32 (2^132.4 > 2^128);
// 2^50 keeps the scaled norm below 2^64, where its squares stay inside f32
// (the engines' other overflow; GradScaler looks at elements only, so the
// two rules must agree on every step of a run that compares them). With
// backoff 2^-77 and growth 2^77 every 2 steps GradScaler then skips one step
// in three. The test measures both margins (on the unscaled twin's
// gradients) rather than trusting them: at least 2^2.
using Forced = host::Trainer<RunOf<Model, AdamW>>;
TrainOptions forced_options(LossScaling::Mode mode) {
  TrainOptions o{.seed = 3, .lr = 1e-3, .clip_norm = 1.0};
  o.loss_scaling = dynamic(std::ldexp(1.0, 127), 2, std::ldexp(1.0, 77), std::ldexp(1.0, -77));
  o.loss_scaling.mode = mode;
  return o;
}

}  // namespace

TEST_CASE("LossScaler: GradScaler's rules, step by step", "[loss_scaling]") {
  SECTION("growth after growth_interval clean steps, backoff and a reset tracker on an overflow") {
    LossScaler s(dynamic(65536.0, 3), DType::F32);
    REQUIRE(s.enabled());
    const bool found_inf[] = {false, false, false, true, false, false, true, false, false, false};
    const LossScaleState want[] = {{65536, 1, 0}, {65536, 2, 0}, {131072, 0, 0}, {65536, 0, 1}, {65536, 1, 1},
                                   {65536, 2, 1}, {32768, 0, 2},  {32768, 1, 2},  {32768, 2, 2}, {65536, 0, 2}};
    for (int i = 0; i < 10; ++i) {
      s.update(found_inf[i]);
      INFO("update " << i + 1);
      CHECK(s.state() == want[i]);
    }
  }
  SECTION("no growth out of f32's range; factors that are not powers of two") {
    LossScaler top(dynamic(std::ldexp(1.0, 127), 1), DType::F32);
    top.update(false);
    CHECK(top.scale() == std::ldexp(1.0f, 127));
    CHECK(top.state().growth_tracker == 0);
    LossScaler odd(dynamic(1000.0, 1, 3.0, 0.3), DType::F32);
    odd.update(true);  // 1000 x 0.3 in double, stored in f32
    CHECK(odd.scale() == static_cast<float>(1000.0 * 0.3));
    odd.update(false);
    CHECK(odd.scale() == static_cast<float>(static_cast<double>(static_cast<float>(300.0)) * 3.0));
  }
  SECTION("automatic scales Precision<F16> runs only; off and dynamic say what they say") {
    CHECK(LossScaler(LossScaling{}, DType::F16).enabled());
    CHECK(LossScaler(LossScaling{}, DType::F16).scale() == 65536.0f);
    CHECK_FALSE(LossScaler(LossScaling{}, DType::F32).enabled());
    CHECK_FALSE(LossScaler(LossScaling{}, DType::BF16).enabled());
    CHECK(LossScaler(LossScaling{}, DType::F32).scale() == 1.0f);
    CHECK_FALSE(LossScaler(LossScaling{.mode = LossScaling::off}, DType::F16).enabled());
    CHECK(LossScaler(LossScaling{.mode = LossScaling::dynamic}, DType::F32).enabled());
  }
  SECTION("bad parameters are refused, each with its rule") {
    CHECK_THROWS_WITH(LossScaler(dynamic(0.0, 1), DType::F32), Contains("init_scale must be positive"));
    CHECK_THROWS_WITH(LossScaler(dynamic(1e39, 1), DType::F32), Contains("within f32's range"));
    CHECK_THROWS_WITH(LossScaler(dynamic(1.0, 1, 1.0), DType::F32), Contains("growth_factor must be above 1"));
    CHECK_THROWS_WITH(LossScaler(dynamic(1.0, 1, 2.0, 1.0), DType::F32), Contains("backoff_factor must be in (0, 1)"));
    CHECK_THROWS_WITH(LossScaler(dynamic(1.0, 0), DType::F32), Contains("growth_interval must be at least 1"));
    LossScaler s(dynamic(1.0, 1), DType::F32);
    CHECK_THROWS_WITH(s.set_state({.scale = -1.0f}), Contains("not a scaler's state"));
  }
}

TEST_CASE("loss scaling: a step that does not overflow is the unscaled step, to the bit", "[loss_scaling]") {
  SECTION("f32, clipped") { scaled_equals_unscaled<RunOf<Model, AdamW>>({.seed = 5, .lr = 1e-3, .clip_norm = 0.5}); }
  SECTION("LoRA, checkpointed blocks, Accumulate<2>, unclipped") {
    scaled_equals_unscaled<RunOf<LoraCkpt, AdamW, Accumulate<2>>>({.seed = 6, .lr = 1e-2, .clip_norm = 0});
  }
  SECTION("bf16 with f32 masters, SGD") {
    scaled_equals_unscaled<RunOf<Model, SGD<Ratio<9, 10>>, Precision<BF16>>>({.seed = 7, .lr = 1e-2, .clip_norm = 1.0});
  }
  SECTION("OffloadOptimizer: the unscaled run updates in flight, the scaled one after the backward") {
    scaled_equals_unscaled<RunOf<Model, AdamW8bit, OffloadOptimizer>>({.seed = 8, .lr = 1e-3, .clip_norm = 0});
  }
}

TEST_CASE("loss scaling: a run forced to overflow skips, backs off and grows as GradScaler, and trains as its unscaled twin",
          "[loss_scaling]") {
  Forced scaled(forced_options(LossScaling::dynamic)), twin(forced_options(LossScaling::off));
  set_norm_weight(scaled, 100.0f);
  set_norm_weight(twin, 100.0f);
  const float hi = std::ldexp(1.0f, 127), lo = std::ldexp(1.0f, 50);
  // GradScaler's sequence for these margins: skip at 2^127, two clean steps at 2^50, grow back to 2^127, ...
  const float want_scale[] = {hi, lo, lo, hi, lo, lo, hi, lo};
  const bool want_skip[] = {true, false, false, true, false, false, true, false};
  int ran = 0;
  for (int s = 0; s < 8; ++s) {
    INFO("step call " << s + 1);
    const Stream d(static_cast<std::size_t>(Forced::tokens_per_step), 40 + s);
    // the twin's gradients on these weights and this batch: S x max|g| beyond f32 (an element overflows)
    // where a skip is expected, S x norm below 2^62 (squares well inside f32) where none is
    twin.forward_backward(d.tok, d.tgt);
    const auto [largest, norm] = gradient_extent(twin);
    const double log2_s = std::log2(static_cast<double>(want_scale[s]));
    if (want_skip[s]) CHECK(std::log2(largest) + log2_s >= 130.0);
    else CHECK(std::log2(norm) + log2_s <= 62.0);

    const std::vector<std::byte> before = state_of(scaled);
    const StepStats x = scaled.step(d.tok, d.tgt);
    CHECK(x.loss_scale == want_scale[s]);
    CHECK(x.skipped == want_skip[s]);
    CHECK(std::isfinite(x.loss));
    if (x.skipped) {
      CHECK(mismatch_at(state_of(scaled), before) == -1);  // no weight, no optimizer state moved
      CHECK(x.step == ran);
      CHECK(scaled.steps_done() == ran);
      CHECK_FALSE(std::isfinite(x.grad_norm));
      continue;
    }
    const StepStats y = twin.step(d.tok, d.tgt);  // the twin steps on the batches the scaled run did not skip
    ++ran;
    CHECK(x.step == ran);
    CHECK(y.step == ran);
    CHECK(x.loss == y.loss);
    CHECK(x.grad_norm == y.grad_norm);
    CHECK(mismatch_at(state_of(scaled), state_of(twin)) == -1);
  }
  CHECK(scaled.loss_scale_state() == LossScaleState{.scale = lo, .growth_tracker = 1, .skipped = 3});
}

TEST_CASE("loss scaling: checkpoints keep the scaler's state", "[loss_scaling]") {
  TempDir dir;
  const auto ck = dir.dir / "ckpt";
  Forced a(forced_options(LossScaling::dynamic));
  set_norm_weight(a, 100.0f);
  for (int s = 0; s < 5; ++s) {  // skip, clean, clean (grow), skip, clean
    const Stream d(static_cast<std::size_t>(Forced::tokens_per_step), 40 + s);
    a.step(d.tok, d.tgt);
  }
  const LossScaleState saved = a.loss_scale_state();
  REQUIRE(saved == LossScaleState{.scale = std::ldexp(1.0f, 50), .growth_tracker = 1, .skipped = 2});
  io::save_checkpoint(a, ck);
  {
    std::ifstream in(ck / "trainer.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK_THAT(text, Contains("\"loss_scale\": {\"scale\": 1125899906842624, \"growth_tracker\": 1, \"skipped\": 2}"));
  }
  Forced b(forced_options(LossScaling::dynamic));
  io::load_checkpoint(b, ck);
  CHECK(b.loss_scale_state() == saved);
  CHECK(b.steps_done() == a.steps_done());
  for (int s = 5; s < 9; ++s) {  // clean (grow), skip, clean, clean: the same on both, to the bit
    const Stream d(static_cast<std::size_t>(Forced::tokens_per_step), 40 + s);
    const StepStats x = a.step(d.tok, d.tgt), y = b.step(d.tok, d.tgt);
    INFO("step call " << s + 1);
    CHECK(x.loss_scale == y.loss_scale);
    CHECK(x.skipped == y.skipped);
    CHECK(x.loss == y.loss);
    CHECK(mismatch_at(state_of(a), state_of(b)) == -1);
  }
  CHECK(a.loss_scale_state() == b.loss_scale_state());
  CHECK(b.loss_scale_state().skipped == 3);

  SECTION("an unscaled run's checkpoint starts a scaled run at its init_scale") {
    Forced plain(forced_options(LossScaling::off)), scaled(forced_options(LossScaling::dynamic));
    io::save_checkpoint(plain, dir.dir / "plain");
    io::load_checkpoint(scaled, dir.dir / "plain");
    CHECK(scaled.loss_scale_state() == LossScaleState{.scale = std::ldexp(1.0f, 127), .growth_tracker = 0, .skipped = 0});
  }
  SECTION("a state no scaler could hold is refused as corrupt") {
    std::ifstream in(ck / "trainer.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const std::string from = "\"growth_tracker\": 1", to = "\"growth_tracker\": -1";
    text.replace(text.find(from), from.size(), to);
    std::ofstream(ck / "trainer.json", std::ios::trunc) << io::detail::checkpoint::seal(text);  // past its checksum
    Forced c(forced_options(LossScaling::dynamic));
    CHECK_THROWS_WITH(io::load_checkpoint(c, ck), Contains("loss_scale.\"growth_tracker\" out of range"));
  }
}

TEST_CASE("loss scaling: UpdateInBackward is refused, with the reason", "[loss_scaling]") {
  using Tr = host::Trainer<RunOf<Model, AdamW, UpdateInBackward>>;
  CHECK_THROWS_WITH(Tr(TrainOptions{.clip_norm = 0, .loss_scaling = {.mode = LossScaling::dynamic}}),
                    Contains("loss scaling skips a step whose scaled gradients overflow") && Contains("UpdateInBackward"));
  CHECK_NOTHROW(Tr(TrainOptions{.clip_norm = 0}));  // automatic: an f32 run does not scale
}
