// OffloadOptimizer on the host engine: the optimizer state and the
// gradients live in the offload tier (a file-backed mapping), the update
// runs on the host's update thread; the same math in another place, so a
// run equals the same run without it bit for bit: losses, gradient norms,
// every weight and every optimizer state, over 20 steps.
//
// Also: the clipping norm is complete before any update (a gradient that
// stops the step leaves every weight and state as it was); a checkpoint
// of an offloaded run resumes bit-identically; the offload folder is
// checked before the first step (missing, not a folder, not writable, too
// small), and a checkpoint that cannot be written leaves the last one
// intact.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/train/host/trainer.hpp>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "support/fixtures.hpp"
#include "support/repeats.hpp"

using namespace headroom;
using headroom::test::mismatch_at;
using headroom::test::Stream;
using headroom::test::TempDir;

namespace {
constexpr models::LlamaConfig cfg{64, 64, 128, 2, 4, 2, 64, false};
using Llama = models::Llama<cfg>;
using LoRAModel = models::Llama<cfg, Apply<LoRA<8>, On<q_proj, k_proj, v_proj, o_proj>>, Apply<Checkpointed<>, EveryBlock>>;
using QLoRAModel = models::Llama<cfg, Apply<Quantized<NF4, LoRA<8>>, On<q_proj, v_proj, down_proj>>, Apply<Checkpointed<>, EveryBlock>>;
// GPT-2's LM head is tied to the embedding: its gradient is written in the
// loss event and completed by the embedding's backward, the last one
using GPT2 = models::GPT2<models::GPT2Config{64, 64, 2, 4, 64}>;

template <class Tr>
std::vector<std::byte> bytes_of(const std::byte* p, std::int64_t n) {
  return p == nullptr ? std::vector<std::byte>{} : std::vector<std::byte>(p, p + n);
}
// A parameter's stored bytes (dense values, or quantized codes) and its optimizer state.
template <class Tr>
std::vector<std::byte> weight_bytes(const Tr& t, const ParamSlot& p) {
  if (p.quant.kind != QuantKind::none) return bytes_of<Tr>(reinterpret_cast<const std::byte*>(t.quant(p).codes), p.quant.code_bytes(p.elements()));
  return bytes_of<Tr>(reinterpret_cast<const std::byte*>(t.weight(p)), p.elements() * static_cast<std::int64_t>(sizeof(float)));
}
template <class Tr>
std::vector<std::byte> state_bytes(const Tr& t, const ParamSlot& p) {
  return bytes_of<Tr>(t.state(p), p.state >= 0 ? Tr::config.optim.state_bytes(p.elements()) : 0);
}

// Every parameter of b (offloaded) bit-identical to a's (on the device), with its optimizer state.
template <class A, class B>
void check_same_model(const A& a, const B& b) {
  static_assert(A::param_count == B::param_count);
  for (std::size_t k = 0; k < A::param_count; ++k) {
    const ParamSlot &p = A::param(k), &q = B::param(k);
    INFO(A::path_of(p));
    REQUIRE(A::path_of(p) == B::path_of(q));
    CHECK(mismatch_at(weight_bytes(a, p), weight_bytes(b, q)) == -1);  // -1: bit-identical, else the first byte that differs
    CHECK(mismatch_at(state_bytes(a, p), state_bytes(b, q)) == -1);
  }
}

// 20 steps (3 under the sanitizers: support/repeats.hpp) of the run on the
// device and with OffloadOptimizer (and `Also`: OffloadParameters), same
// seed and batches.
template <class Also, class Model, class... Options>
struct offloaded {
  using type = Train<Model, Options..., OffloadOptimizer, Also>;
};
template <class Model, class... Options>
struct offloaded<void, Model, Options...> {
  using type = Train<Model, Options..., OffloadOptimizer>;
};
template <class Model, class Also, class... Options>
void same_as_on_device(double clip) {
  using A = host::Trainer<Train<Model, Options...>>;
  using B = host::Trainer<typename offloaded<Also, Model, Options...>::type>;
  static_assert(B::config.offload_optimizer && !A::config.offload_optimizer);
  // the model states really moved: no optimizer state on B's device tier, its gradients in the offload tier
  static_assert(B::plan.bytes(Role::optimizer_state, Tier::device) == 0 && B::plan.bytes(Role::optimizer_state, Tier::offload) > 0);
  static_assert(B::plan.bytes(Role::grads, Tier::offload) > 0 && B::plan.peak_bytes(Tier::device) < A::plan.peak_bytes(Tier::device));
  INFO("clip_norm " << clip);
  const TrainOptions o{.seed = 7, .lr = 1e-2, .warmup_steps = 3, .total_steps = 20, .clip_norm = clip};
  A a(o);
  B b(o);
  REQUIRE(b.arena(Tier::offload).file_backed());
  for (int s = 0, steps = test::repeats(20, 3); s < steps; ++s) {
    const Stream d(static_cast<std::size_t>(A::tokens_per_step), 30 + s);
    const StepStats x = a.step(d.tok, d.tgt), y = b.step(d.tok, d.tgt);
    INFO("step " << s + 1);
    CHECK(x.loss == y.loss);
    CHECK(x.grad_norm == y.grad_norm);
    // every gradient went to the offload tier once per micro-batch (and came back for the later ones)
    std::int64_t grads = 0;
    for (std::size_t k = 0; k < B::param_count; ++k)
      if (B::param(k).trainable) grads += B::param(k).elements() * static_cast<std::int64_t>(sizeof(float));
    CHECK(b.tier_traffic().to_offload == grads * B::config.accumulate);
    if constexpr (!B::config.offload_params) {
      CHECK(b.tier_traffic().to_device == grads * (B::config.accumulate - 1));
    } else {
      // and every parameter came to the device at least once per micro-batch, for its forward
      std::int64_t stored = 0;
      for (std::size_t k = 0; k < B::param_count; ++k) {
        const ParamSlot& p = B::param(k);
        stored += p.quant.kind == QuantKind::none ? p.elements() * static_cast<std::int64_t>(sizeof(float))
                                                  : p.quant.code_bytes(p.elements()) + p.quant.scale_bytes(p.elements());
      }
      CHECK(b.tier_traffic().to_device >= grads * (B::config.accumulate - 1) + stored * B::config.accumulate);
    }
  }
  check_same_model(a, b);
}
}  // namespace

TEST_CASE("OffloadOptimizer trains bit-identically to the device: AdamW, full fine-tuning", "[host][offload]") {
  // 0: each update overlaps the backward; 0.05: every step clipped, so an
  // update begun before the norm was complete (with a scale of 1) would differ
  const double clip = GENERATE(0.0, 1.0, 0.05);
  same_as_on_device<Llama, void, Batch<4>, Seq<32>, Workers<2>>(clip);
}

TEST_CASE("OffloadOptimizer trains bit-identically to the device: AdamW8bit, QLoRA, checkpointing, Accumulate<2>",
          "[host][offload]") {
  const double clip = GENERATE(0.0, 0.5);
  same_as_on_device<QLoRAModel, void, Batch<2>, Seq<32>, Accumulate<2>, AdamW8bit, Workers<2>>(clip);
}

TEST_CASE("OffloadOptimizer trains bit-identically to the device: SGD, LoRA, checkpointing, Accumulate<3>", "[host][offload]") {
  const double clip = GENERATE(0.0, 0.5);
  same_as_on_device<LoRAModel, void, Batch<2>, Seq<32>, Accumulate<3>, SGD<>>(clip);
}

TEST_CASE("OffloadOptimizer trains bit-identically to the device: GPT-2, tied LM head, AdamW8bit", "[host][offload]") {
  const double clip = GENERATE(0.0, 1.0);
  same_as_on_device<GPT2, void, Batch<2>, Seq<32>, AdamW8bit, Workers<2>>(clip);
}

TEST_CASE("OffloadParameters trains bit-identically to the device: AdamW, full fine-tuning", "[host][offload]") {
  // the parameters too live in the file; each event reads its fetched copy
  using B = host::Trainer<Train<Llama, Batch<4>, Seq<32>, Workers<2>, OffloadOptimizer, OffloadParameters>>;
  static_assert(B::plan.bytes(Role::weights, Tier::offload) > 0);
  const double clip = GENERATE(0.0, 0.05);
  same_as_on_device<Llama, OffloadParameters, Batch<4>, Seq<32>, Workers<2>>(clip);
}

TEST_CASE("OffloadParameters trains bit-identically to the device: AdamW8bit, QLoRA (NF4 codes fetched), checkpointing, "
          "Accumulate<2>, GPT-2's tied head",
          "[host][offload]") {
  const double clip = GENERATE(0.0, 0.5);
  same_as_on_device<QLoRAModel, OffloadParameters, Batch<2>, Seq<32>, Accumulate<2>, AdamW8bit, Workers<2>>(clip);
  same_as_on_device<GPT2, OffloadParameters, Batch<2>, Seq<32>, SGD<>>(clip);
}

TEST_CASE("OffloadOptimizer with clipping: the norm is complete before any update", "[host][offload][non_finite]") {
  // The final norm's weight at 1e25 makes every gradient finite but their
  // squares overflow f32 (tests/runtime/host_non_finite.cpp): with clipping
  // the update waits for the norm, which stops the step: every weight and
  // state is as before, though the update thread had every gradient during
  // the backward.
  using Tr = host::Trainer<Train<Llama, Batch<4>, Seq<32>, Workers<2>, OffloadOptimizer>>;
  const Stream first(128, 11), second(128, 12);
  Tr t({.seed = 1, .lr = 1e-2, .clip_norm = 1.0});
  t.step(first.tok, first.tgt);
  const ParamSlot& norm = *Tr::find("norm.weight");
  std::fill(t.weight(norm), t.weight(norm) + norm.elements(), 1e25f);
  std::vector<std::vector<std::byte>> weights, states;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    weights.push_back(weight_bytes(t, Tr::param(k)));
    states.push_back(state_bytes(t, Tr::param(k)));
  }
  CHECK_THROWS_AS(t.step(second.tok, second.tgt), non_finite_gradient);
  CHECK(t.steps_done() == 1);
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    INFO(Tr::path_of(Tr::param(k)));
    CHECK(mismatch_at(weight_bytes(t, Tr::param(k)), weights[k]) == -1);
    CHECK(mismatch_at(state_bytes(t, Tr::param(k)), states[k]) == -1);
  }
  // and training goes on from there, as on the device
  std::fill(t.weight(norm), t.weight(norm) + norm.elements(), 1.0f);
  CHECK(std::isfinite(t.step(second.tok, second.tgt).loss));
}

namespace {
template <class Tr>
void resumes_bit_identically() {
  const TempDir tmp;
  const TrainOptions o{.seed = 5, .lr = 1e-2, .clip_norm = 1.0, .offload_dir = tmp.dir};
  Tr whole(o), first(o);
  const int half = test::repeats(10, 2);  // steps before the checkpoint and after it
  for (int s = 0; s < half; ++s) {
    const Stream d(static_cast<std::size_t>(Tr::tokens_per_step), 60 + s);
    CHECK(whole.step(d.tok, d.tgt).loss == first.step(d.tok, d.tgt).loss);
  }
  io::save_checkpoint(first, tmp / "ckpt");
  Tr resumed({.seed = 99, .lr = 1e-2, .clip_norm = 1.0, .offload_dir = tmp.dir});  // other initial weights: the checkpoint decides
  io::load_checkpoint(resumed, tmp / "ckpt");
  CHECK(resumed.steps_done() == half);
  for (int s = half; s < 2 * half; ++s) {
    const Stream d(static_cast<std::size_t>(Tr::tokens_per_step), 60 + s);
    CHECK(whole.step(d.tok, d.tgt).loss == resumed.step(d.tok, d.tgt).loss);
  }
  check_same_model(whole, resumed);
}
}  // namespace

TEST_CASE("OffloadOptimizer: a checkpoint saves and resumes the offloaded state bit-identically", "[host][offload][checkpoint]") {
  resumes_bit_identically<host::Trainer<Train<QLoRAModel, Batch<2>, Seq<32>, Accumulate<2>, AdamW8bit, Workers<2>, OffloadOptimizer>>>();
  // and the parameters themselves, stored in the offload tier
  resumes_bit_identically<host::Trainer<Train<Llama, Batch<4>, Seq<32>, Workers<2>, OffloadOptimizer, OffloadParameters>>>();
}

namespace {
using Offloading = Train<Llama, Batch<4>, Seq<32>, OffloadOptimizer>;
constexpr std::int64_t tier_bytes = plan<Offloading>().peak_bytes(Tier::offload);

// Runs f with the process's file-size limit at `limit` bytes (a file
// system too small for what is written), then restores it.
template <class F>
void with_file_size_limit(rlim_t limit, F&& f) {
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of killing the process
  rlimit small = old;
  small.rlim_cur = limit;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  try {
    f();
  } catch (...) {
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    throw;
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
}

// The message of what constructing the trainer with this offload folder throws.
std::string refusal(const std::filesystem::path& dir) {
  try {
    host::Trainer<Offloading> t({.offload_dir = dir});
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("OffloadOptimizer: an offload folder that cannot hold the tier is refused before the first step", "[host][offload][errors]") {
  const TempDir tmp;
  const std::string bytes = std::to_string(tier_bytes) + " B";
  SECTION("missing") {
    CHECK_THAT(refusal(tmp / "absent"), Catch::Contains("offload folder") && Catch::Contains("does not exist") && Catch::Contains(bytes));
  }
  SECTION("a file, not a folder") {
    test::write_file(tmp / "file", "x");
    CHECK_THAT(refusal(tmp / "file"), Catch::Contains("is not a directory") && Catch::Contains(bytes));
  }
  SECTION("not writable") {
    const auto dir = tmp / "read-only";
    std::filesystem::create_directories(dir);
    std::filesystem::permissions(dir, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec |
                                          std::filesystem::perms::group_read | std::filesystem::perms::others_read);
    std::string message;
    if (::geteuid() != 0) {
      message = refusal(dir);
    } else {
      // root may write anywhere: check as another user, on a thread of its own
      // (the raw system call changes only the calling thread's user ids)
      std::thread([&] {
        REQUIRE(::syscall(SYS_setresuid, 65534, 65534, 0) == 0);
        message = refusal(dir);
        REQUIRE(::syscall(SYS_setresuid, 0, 0, 0) == 0);
      }).join();
    }
    CHECK_THAT(message, Catch::Contains("is not writable") && Catch::Contains(bytes));
  }
  SECTION("too small: less free space than the tier") {
    // the check against the file system's free bytes, with the real numbers of this folder
    struct statvfs fs {};
    REQUIRE(::statvfs(tmp.dir.c_str(), &fs) == 0);
    const std::int64_t free = static_cast<std::int64_t>(fs.f_bavail) * static_cast<std::int64_t>(fs.f_frsize);
    CHECK_NOTHROW(host::check_offload_dir(tmp.dir, 1));
    CHECK_THROWS_WITH(host::check_offload_dir(tmp.dir, free + (std::int64_t{1} << 30)),
                      Catch::Contains("B free, less than the planned offload tier of " + std::to_string(free + (std::int64_t{1} << 30)) + " B"));
  }
  SECTION("too small: the tier's blocks cannot be reserved") {
    with_file_size_limit(static_cast<rlim_t>(tier_bytes / 2), [&] {
      CHECK_THAT(refusal(tmp.dir), Catch::Contains("cannot reserve the planned offload tier of " + bytes));
    });
  }
  // nothing was left behind: the offload file is unlinked as soon as it is made
  for (const auto& entry : std::filesystem::directory_iterator(tmp.dir))
    CHECK(entry.path().filename().string().rfind("headroom-offload-", 0) != 0);
}

TEST_CASE("OffloadOptimizer: a checkpoint that runs out of space stops with an error and leaves the last one intact",
          "[host][offload][checkpoint][errors]") {
  using Tr = host::Trainer<Offloading>;
  const TempDir tmp;
  Tr t({.seed = 3, .lr = 1e-2, .offload_dir = tmp.dir});
  const Stream d(128, 4);
  t.step(d.tok, d.tgt);
  io::save_checkpoint(t, tmp / "ckpt");
  t.step(d.tok, d.tgt);
  // the offload tier is reserved: the step runs; the next checkpoint's files cannot be written
  with_file_size_limit(4096, [&] { CHECK_THROWS(io::save_checkpoint(t, tmp / "ckpt")); });
  Tr back({.seed = 8, .offload_dir = tmp.dir});
  io::load_checkpoint(back, tmp / "ckpt");
  CHECK(back.steps_done() == 1);
}
