// Planned = used: the trainer's arenas are the plan's bytes, a step
// allocates nothing, and the process's peak resident memory over a training
// run, and over loading a model directory, stays within the plan plus a
// stated constant.
//
// Allocations are counted by interposing malloc and friends (glibc's
// __libc_* entry points do the work), so every allocation is seen: operator
// new, Eigen's aligned_malloc, the OpenMP runtime, the C library.
// own translation unit: it interposes malloc and its kin at global scope.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <headroom/headroom.hpp>
#include <headroom/host/resident.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/train/host/trainer.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "support/interposed_malloc.hpp"

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
void count() {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace
void counted_allocation(std::size_t) { count(); }

using namespace headroom;

namespace {

template <class F>
long allocations_in(F&& f) {
  allocations = 0;
  counting = true;
  f();
  counting = false;
  return allocations.load();
}

std::vector<std::int32_t> pattern(std::size_t n, int vocab, int shift) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((i * 7 + shift + i / 5) % vocab);
  return v;
}

using Tiny = models::Llama<models::tiny_llama>;
using Full = Train<Tiny, Batch<4>, Seq<64>, Workers<2>>;
using QLoRA = Train<models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<8>>, On<q_proj, k_proj, v_proj, o_proj>>,
                                  Apply<Checkpointed<>, EveryBlock>>,
                    Batch<4>, Seq<64>, AdamW8bit, Workers<2>>;
using Offload = Train<models::Llama<models::tiny_llama, Apply<Offloaded<>, EveryBlock>>, Batch<4>, Seq<64>, Workers<2>>;
using GPT2Acc = Train<models::GPT2<models::GPT2Config{256, 128, 2, 4, 128}, Apply<LoRA<8>, On<c_attn>>>, Batch<2>, Seq<64>,
                      Accumulate<2>, SGD<>, Workers<2>>;
using UIB = Train<Tiny, Batch<2>, Seq<64>, UpdateInBackward, Workers<2>>;
using OneWorker = Train<Tiny, Batch<2>, Seq<64>>;  // Workers<1>: every kernel on the calling thread
using OffloadOpt = Train<Tiny, Batch<2>, Seq<64>, Accumulate<2>, Workers<2>, OffloadOptimizer>;
using OffloadAll = Train<Tiny, Batch<8>, Seq<128>, Workers<2>, OffloadOptimizer, OffloadParameters>;

template <class R>
void no_allocation_in_steps(host::TrainOptions o = {}) {
  host::Trainer<R> t(o);
  using Tr = host::Trainer<R>;
  CHECK(t.arena_bytes(Tier::device) == Tr::plan.peak_bytes(Tier::device));
  CHECK(t.arena_bytes(Tier::offload) == Tr::plan.peak_bytes(Tier::offload));
  const auto tok = pattern(Tr::tokens_per_step, 256, 0), tgt = pattern(Tr::tokens_per_step, 256, 1);
  t.step(tok, tgt);  // warm-up: the OpenMP runtime starts its threads here
  const long n = allocations_in([&] {
    for (int s = 0; s < 3; ++s) t.step(tok, tgt);
  });
  CHECK(n == 0);
  const auto etok = pattern(Tr::tokens_per_micro_batch, 256, 0), etgt = pattern(Tr::tokens_per_micro_batch, 256, 1);
  CHECK(allocations_in([&] { t.evaluate(etok, etgt); }) == 0);
}

}  // namespace

TEST_CASE("the allocation counter sees allocations", "[host][memory]") {
  const long n = allocations_in([] {
    std::vector<int> v(1000);
    v[10] = 3;
    REQUIRE(v[10] == 3);
  });
  CHECK(n >= 1);
}

TEST_CASE("a step allocates nothing: full fine-tuning", "[host][memory]") { no_allocation_in_steps<Full>(); }
TEST_CASE("a step allocates nothing: QLoRA, checkpointing, AdamW8bit", "[host][memory]") { no_allocation_in_steps<QLoRA>(); }
TEST_CASE("a step allocates nothing: offloaded blocks (file-backed tier)", "[host][memory]") { no_allocation_in_steps<Offload>(); }
TEST_CASE("a step allocates nothing: GPT-2 LoRA, Accumulate<2>, SGD", "[host][memory]") { no_allocation_in_steps<GPT2Acc>(); }
TEST_CASE("a step allocates nothing: one worker", "[host][memory]") { no_allocation_in_steps<OneWorker>(); }
TEST_CASE("a step allocates nothing: Precision<BF16>, full and QLoRA", "[host][memory][bf16]") {
  no_allocation_in_steps<Train<Tiny, Batch<4>, Seq<64>, Workers<2>, Precision<BF16>>>();
  no_allocation_in_steps<Train<models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<8>>, On<q_proj, k_proj, v_proj, o_proj>>,
                                             Apply<Checkpointed<>, EveryBlock>>,
                               Batch<4>, Seq<64>, AdamW8bit, Workers<2>, Precision<BF16>>>();
}
TEST_CASE("a step allocates nothing: OffloadOptimizer, the update overlapping backward", "[host][memory]") {
  no_allocation_in_steps<OffloadOpt>({.clip_norm = 0});
}
TEST_CASE("a step allocates nothing: OffloadOptimizer, clipped", "[host][memory]") {
  no_allocation_in_steps<OffloadOpt>({.clip_norm = 1.0});
}
TEST_CASE("a step allocates nothing: OffloadOptimizer and OffloadParameters", "[host][memory]") {
  no_allocation_in_steps<OffloadAll>({.clip_norm = 0});
}
TEST_CASE("a step allocates nothing: UpdateInBackward", "[host][memory]") {
  no_allocation_in_steps<UIB>({.clip_norm = 0});
}

// Peak resident memory over a training run: the arena plus a constant.
// The constant, measured on this machine (2 cores, glibc 2.36, libgomp):
// code pages of the test binary and Eigen's kernels first touched by the
// step, the OpenMP worker's stack, Catch2 and the C++ runtime; at most a few
// MiB, independent of the model. The bound allows 16 MiB.
template <class Run>
void peak_is_plan(const char* what) {
  using Tr = host::Trainer<Run>;
  // start the OpenMP team and touch the code paths once, outside the measurement
  host::team(2, [](int, int) {});
  host::reset_peak_resident();  // VmHWM := the current RSS
  const std::int64_t before = host::resident_bytes();
  {
    Tr t({.lr = 1e-3});
    const auto tok = pattern(Tr::tokens_per_step, 256, 0), tgt = pattern(Tr::tokens_per_step, 256, 1);
    for (int s = 0; s < 4; ++s) t.step(tok, tgt);
  }
  const std::int64_t peak = host::peak_resident_bytes();
  const std::int64_t planned = Tr::plan.peak_bytes();
  const std::int64_t overhead = peak - before - planned;
  INFO(what << ": VmRSS before " << before << " B, VmHWM " << peak << " B, plan " << planned << " B, overhead " << overhead << " B");
  CHECK(peak - before >= planned * 9 / 10);  // the arena is really used
  CHECK(overhead <= 16ll << 20);
  std::printf("VmHWM over a run of %s: plan %lld B + %lld B overhead\n", what, static_cast<long long>(planned),
              static_cast<long long>(overhead));
}
TEST_CASE("peak resident memory (VmHWM) = plan + a constant", "[host][memory]") {
  peak_is_plan<Train<Tiny, Batch<8>, Seq<128>, Workers<2>>>("tiny_llama B8 T128");
}
TEST_CASE("peak resident memory (VmHWM) = plan + a constant: Precision<BF16>", "[host][memory][bf16]") {
  peak_is_plan<Train<Tiny, Batch<8>, Seq<128>, Workers<2>, Precision<BF16>>>("tiny_llama B8 T128 bf16");
}

TEST_CASE("offloaded blocks: the RAM arena shrinks by what the plan says, the tier lives in a file mapping", "[host][memory]") {
  using Tr = host::Trainer<Offload>;
  using Plain = host::Trainer<Full>;
  const auto dir = std::filesystem::temp_directory_path() / "headroom-offload-test";
  std::filesystem::create_directories(dir);
  {
    Tr t({.offload_dir = dir});
    CHECK(t.arena_bytes(Tier::device) == Tr::plan.peak_bytes(Tier::device));
    CHECK(t.arena_bytes(Tier::offload) == Tr::plan.peak_bytes(Tier::offload));
    CHECK(Tr::plan.peak_bytes(Tier::offload) > 0);
    CHECK(Tr::plan.peak_bytes(Tier::device) < Plain::plan.peak_bytes(Tier::device));
    CHECK(t.arena(Tier::offload).file_backed());
    // the file is unlinked at once: nothing is left in the directory
    CHECK(std::filesystem::is_empty(dir));
    const auto tok = pattern(Tr::tokens_per_step, 256, 0), tgt = pattern(Tr::tokens_per_step, 256, 1);
    host::Trainer<Full> plain({});
    CHECK(t.step(tok, tgt).loss == plain.step(tok, tgt).loss);  // the same step, with the copies
  }
  std::filesystem::remove_all(dir);
  REQUIRE_THROWS_WITH(Tr({.offload_dir = "/nonexistent/headroom"}),
                      Catch::Contains("the offload folder '/nonexistent/headroom' does not exist"));
}

// OffloadOptimizer: the optimizer state and the gradients stay in the
// file; the process holds the device tier (whose planned update staging
// buffer takes each update range read from the file), plus the constant
// above; the allowance adds two ranges of gradient and state as a margin
// (host::Trainer::update_chunk elements, 2 x 16,384 x (4 + 8) B with
// AdamW). With OffloadParameters
// the parameters stay in the file too: fetches and updates read and write
// it (pread / pwrite), no page of it is mapped in a step. The offload tier
// is larger than the allowance, so the check fails if it is resident.
template <class Run>
void resident_is_the_device_tier(const char* what) {
  using Tr = host::Trainer<Run>;
  constexpr std::int64_t allowance = (16ll << 20) + 2 * Tr::update_chunk * (4 + 8);
  static_assert(Tr::plan.peak_bytes(Tier::offload) > allowance);
  host::team(2, [](int, int) {});
  for (const double clip : {0.0, 1.0}) {
    host::reset_peak_resident();
    const std::int64_t before = host::resident_bytes();
    {
      Tr t({.lr = 1e-3, .clip_norm = clip});
      const auto tok = pattern(Tr::tokens_per_step, 256, 0), tgt = pattern(Tr::tokens_per_step, 256, 1);
      for (int s = 0; s < 4; ++s) t.step(tok, tgt);
    }
    const std::int64_t peak = host::peak_resident_bytes();
    const std::int64_t planned = Tr::plan.peak_bytes(Tier::device);
    const std::int64_t overhead = peak - before - planned;
    INFO("clip_norm " << clip << ": VmRSS before " << before << " B, VmHWM " << peak << " B, device plan " << planned
                      << " B, offload plan " << Tr::plan.peak_bytes(Tier::offload) << " B, overhead " << overhead << " B");
    CHECK(peak - before >= planned * 9 / 10);
    CHECK(overhead <= allowance);
    std::printf("VmHWM over a run of tiny_llama B8 T128, %s, clip_norm %g: device plan %lld B + %lld B overhead (offload tier %lld B)\n",
                what, clip, static_cast<long long>(planned), static_cast<long long>(overhead),
                static_cast<long long>(Tr::plan.peak_bytes(Tier::offload)));
  }
}
TEST_CASE("OffloadOptimizer: peak resident memory = the device plan + a constant, the tier stays in its file", "[host][memory]") {
  resident_is_the_device_tier<Train<Tiny, Batch<8>, Seq<128>, Workers<2>, OffloadOptimizer>>("OffloadOptimizer");
}
TEST_CASE("OffloadParameters: peak resident memory = the device plan + a constant, the parameters stay in the file",
          "[host][memory]") {
  resident_is_the_device_tier<OffloadAll>("OffloadOptimizer, OffloadParameters");
}

// Loading a model directory: peak resident memory = the plan + the load's
// staging (io::load_staging_bytes of stored values, and one quantized
// parameter in f32 while it is quantized) + the constant above. The model
// is written as published (bf16 values with Hugging Face names, in shards
// as large as its largest tensor, config.json) and loaded into a QLoRA trainer: the f32 embedding
// table goes straight into the arena through the staging buffer, each
// projection is staged once as it is quantized to NF4. A loader that read
// a whole tensor at once would stage the embedding table's bf16 bytes (64 MB
// on the first model), beyond the bound.
template <models::LlamaConfig C>
void load_is_plan_plus_staging(const char* what) {
  using Model = models::Llama<C, Apply<Quantized<NF4, LoRA<8>>, On<q_proj, v_proj>>,
                              Apply<Quantized<NF4>, On<k_proj, o_proj, gate_proj, up_proj, down_proj>>>;
  using Tr = host::Trainer<Train<Model, Batch<1>, Seq<16>, Workers<2>>>;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("headroom-load-rss-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::int64_t stored = 0, largest_quantized = 0, largest = 0;
  {
    std::vector<std::vector<std::uint16_t>> values;
    std::vector<io::TensorView> views;
    std::uint32_t x = 12345;
    for (const io::HfParam& h : io::hf_params<Tr>()) {
      std::vector<std::uint16_t>& v = values.emplace_back(static_cast<std::size_t>(h.slot->elements()));
      for (std::uint16_t& b : v) {  // +-2^-10 .. 2^-4, every mantissa
        x = x * 1664525u + 1013904223u;
        b = static_cast<std::uint16_t>(((x >> 31) << 15) | ((117u + (x >> 8) % 7u) << 7) | ((x >> 16) & 0x7Fu));
      }
      views.push_back({h.name, DType::BF16, h.shape, v.data()});
      stored += 2 * h.slot->elements();
      largest = std::max(largest, 2 * h.slot->elements());
      if (h.slot->quant.kind != QuantKind::none) largest_quantized = std::max(largest_quantized, h.slot->elements());
    }
    io::write_safetensors_shards(dir, views, {{"format", "pt"}}, static_cast<std::uint64_t>(largest), "test");
    std::ofstream(dir / "config.json") << io::hf_config_json<Tr>(DType::BF16);
  }
  REQUIRE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  host::team(2, [](int, int) {});
  host::reset_peak_resident();
  const std::int64_t before = host::resident_bytes();
  {
    Tr t({.seed = 1});
    io::load_pretrained(t, dir);
  }
  const std::int64_t peak = host::peak_resident_bytes();
  std::filesystem::remove_all(dir);
  const std::int64_t planned = Tr::plan.peak_bytes();
  const std::int64_t staging = static_cast<std::int64_t>(io::load_staging_bytes) + 4 * largest_quantized;
  const std::int64_t overhead = peak - before - planned;
  INFO(what << ": VmRSS before " << before << " B, VmHWM " << peak << " B, plan " << planned << " B, staging " << staging
            << " B, overhead " << overhead << " B");
  CHECK(largest > staging + (16ll << 20));  // whole-tensor staging would not fit the bound
  CHECK(peak - before >= Tr::plan.bytes(Role::weights));  // the weights were really loaded
  CHECK(overhead <= staging + (16ll << 20));
  std::printf("VmHWM over loading %s (%lld B of bf16, sharded) into QLoRA: plan %lld B + %lld B (staging bound %lld B + 16 MiB)\n",
              what, static_cast<long long>(stored), static_cast<long long>(planned), static_cast<long long>(overhead),
              static_cast<long long>(staging));
}
// 48.6 million parameters: a 64,000 x 512 embedding table (tied), 4 blocks
constexpr models::LlamaConfig wide_vocab{64000, 512, 2048, 4, 8, 4, 2048, true, 500000};
TEST_CASE("loading a model directory: peak resident memory = plan + the stated staging", "[host][memory][io]") {
  load_is_plan_plus_staging<wide_vocab>("a Llama of 48.6M parameters");
}
// The same on a model of Llama-3.2-1B's shape (1.24 billion parameters, 2.5 GB
// of bf16): about 80 s of CPU time on 2 cores (writing the directory, the
// trainer's own initialization, the load), so hidden from the default run:
// runtime_tests "[.1b]".
TEST_CASE("loading a 1B-shaped model directory: peak resident memory = plan + the stated staging", "[.1b][host][memory][io]") {
  load_is_plan_plus_staging<models::llama3_2_1b>("a model of Llama-3.2-1B's shape");
}
