// Training checkpoints (io/checkpoint.hpp): resuming from a checkpoint in a
// new trainer gives bit-identical losses and weights (AdamW, AdamW8bit with
// two workers, QLoRA with double-quantized NF4 and AdamW8bit, an f64 GPT-2);
// trainer.json; checkpoints of
// another run and missing or corrupt files are refused with clear messages;
// an interrupted save leaves the previous checkpoint loadable.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"

#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/train/host/trainer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using namespace headroom;
using Catch::Contains;

namespace {
using headroom::test::TempDir;
using headroom::test::mismatch_at;
using headroom::test::ids;

namespace fs = std::filesystem;

constexpr models::LlamaConfig llama_ck{48, 64, 128, 2, 4, 2, 64, false};
constexpr models::GPT2Config gpt2_ck{48, 64, 2, 4, 32};

template <class M, class... Opts>
using Run = Train<M, Batch<2>, Seq<12>, Precision<DType::F32>, Opts...>;
using Llama = models::Llama<llama_ck>;
using LlamaQLoRA = models::Llama<llama_ck, Apply<Quantized<NF4DQ, LoRA<4>>, On<q_proj, v_proj, down_proj>>>;
using AdamRun = Run<Llama, AdamW>;
using Adam8Run = Run<Llama, AdamW8bit, Workers<2>>;  // two threads: resuming does not depend on them
using QLoRARun = Run<LlamaQLoRA, AdamW8bit>;
using GPT2F64Run = Train<models::GPT2<gpt2_ck>, Batch<2>, Seq<12>, Precision<DType::F64>, AdamW>;

// Resets the save hooks however a test ends.
struct HookGuard {
  ~HookGuard() {
    io::detail::checkpoint::test_hook() = nullptr;
    io::detail::checkpoint::force_two_renames() = false;
  }
};

host::TrainOptions options(std::uint64_t seed) {
  return {.seed = seed, .lr = 1e-2, .warmup_steps = 2, .total_steps = 6};
}

// Step s (1-based) of every run sees the same batch.
template <class Tr>
double step(Tr& t) {
  const auto s = static_cast<std::uint32_t>(t.steps_done() + 1);
  return t.step(ids(24, 10 * s), ids(24, 10 * s + 1)).loss;
}

// Every byte a step reads: parameters as stored, and optimizer states.
template <class Tr>
std::vector<unsigned char> state_bytes(const Tr& t) {
  std::vector<unsigned char> out;
  auto add = [&](const void* p, std::int64_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    if (p.quant.kind == QuantKind::none) {
      add(t.weight(p), p.elements() * static_cast<std::int64_t>(sizeof(typename Tr::T)));
    } else {
      add(t.quant(p).codes, p.quant.code_bytes(p.elements()));
      add(t.quant(p).scales, p.quant.scale_bytes(p.elements()));
    }
    if (p.state >= 0) add(t.state(p), Tr::config.optim.state_bytes(p.elements()));
  }
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The entries of a directory, by name.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// What a save of `target` made beside it and left: entries named
// "<target>.headroom-saving-<random>" or "<target>.headroom-old-<random>".
std::vector<std::string> left_beside(const fs::path& target) {
  std::vector<std::string> left;
  for (const std::string& n : names_in(target.parent_path()))
    for (const std::string marker : {".headroom-saving-", ".headroom-old-"})
      if (n.rfind(target.filename().string() + marker, 0) == 0) left.push_back(n);
  return left;
}

// Names a save of `target` might have given its staging directory and the
// old checkpoint it set aside (as an interrupted save leaves them).
fs::path staging_name(const fs::path& target) { return target.string() + ".headroom-saving-0123456789ab"; }
fs::path aside_name(const fs::path& target) { return target.string() + ".headroom-old-0123456789ab"; }

template <class R>
void resume_is_bit_identical() {
  using Tr = host::Trainer<R>;
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";

  Tr straight(options(1));
  std::vector<double> losses;
  for (int s = 0; s < 6; ++s) losses.push_back(step(straight));

  {
    Tr first(options(1));
    for (int s = 0; s < 3; ++s) REQUIRE(step(first) == losses[static_cast<std::size_t>(s)]);
    io::save_checkpoint(first, dir, R"({"loader": {"epoch": 0, "position": 72}, "note": "step \"3\""})");
  }
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK(fs::exists(dir / "optimizer.safetensors"));
  CHECK(fs::exists(dir / "trainer.json"));
  CHECK(names_in(tmp.dir) == std::vector<std::string>{"ckpt"});

  Tr resumed(options(99));  // a new trainer, other initial weights
  const std::string extra = io::load_checkpoint(resumed, dir);
  CHECK(extra == R"({"loader": {"epoch": 0, "position": 72}, "note": "step \"3\""})");
  CHECK(resumed.steps_done() == 3);
  for (int s = 3; s < 6; ++s) CHECK(step(resumed) == losses[static_cast<std::size_t>(s)]);
  CHECK(resumed.steps_done() == 6);
  CHECK(mismatch_at(state_bytes(resumed), state_bytes(straight)) == -1);
}

}  // namespace

TEST_CASE("checkpoint: resuming in a new trainer is bit-identical (AdamW)", "[io][checkpoint]") { resume_is_bit_identical<AdamRun>(); }
TEST_CASE("checkpoint: resuming in a new trainer is bit-identical (AdamW8bit, two workers)", "[io][checkpoint]") {
  resume_is_bit_identical<Adam8Run>();
}
TEST_CASE("checkpoint: resuming QLoRA (NF4 + double quantization, AdamW8bit) is bit-identical", "[io][checkpoint]") {
  resume_is_bit_identical<QLoRARun>();
}

TEST_CASE("checkpoint: resuming an f64 GPT-2 run is bit-identical", "[io][checkpoint]") { resume_is_bit_identical<GPT2F64Run>(); }

TEST_CASE("checkpoint: the files hold every parameter as stored, the states, and trainer.json", "[io][checkpoint]") {
  using Tr = host::Trainer<QLoRARun>;
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  Tr t(options(2));
  step(t);
  io::save_checkpoint(t, dir);

  const io::SafetensorsFile model(dir / "model.safetensors"), optim(dir / "optimizer.safetensors");
  model.expect("embed_tokens.weight", DType::F32, {48, 64});
  model.expect("layers.0.input_layernorm.weight", DType::F32, {64, 1});
  model.expect("layers.1.self_attn.q_proj.weight", DType::U8, {64 * 64 / 2});  // NF4 codes
  model.expect("layers.1.self_attn.q_proj.weight.scales", DType::U8, {64 + 4 + 4});  // 64 blocks: u8 codes, absmax2, offset
  model.expect("layers.1.self_attn.q_proj.lora_A", DType::F32, {4, 64});
  CHECK(optim.find("embed_tokens.weight") == nullptr);  // frozen: no state
  const std::int64_t a_state = 2 * (4 * 64 + 4);        // AdamW8bit: two u8 moments + an f32 absmax per 256
  optim.expect("layers.1.self_attn.q_proj.lora_A", DType::U8, {a_state});
  optim.expect("__quant_table__", DType::U8, {(16 + 256) * 4});
  optim.expect("__optim_table__", DType::U8, {2 * 256 * 4});

  const std::string json = read_text(dir / "trainer.json");
  CHECK_THAT(json, Contains("\"format\": \"headroom-checkpoint\""));
  CHECK_THAT(json, Contains("\"steps_done\": 1"));
  CHECK_THAT(json, Contains("\"model\": \"Llama\""));
  CHECK_THAT(json, Contains("\"optimizer\": \"AdamW8bit\""));
  CHECK_THAT(json, Contains("\"param_count\": " + std::to_string(Tr::param_count)));
  CHECK_THAT(json, Contains("\"layers.0.self_attn.q_proj.weight: nf4 block 64 dq, shape (64, 64), frozen\""));
  CHECK_THAT(json, Contains("\"layers.1.self_attn.q_proj.lora_A: f32, shape (4, 64), state 520 B\""));
  CHECK_THAT(json, Contains("\"extra\": {}"));
  Tr u(options(3));
  CHECK(io::load_checkpoint(u, dir) == "{}");

  CHECK_THROWS_AS(io::save_checkpoint(t, tmp / "x", "[1, 2]"), std::invalid_argument);
  CHECK_THROWS_AS(io::save_checkpoint(t, tmp / "x", "{\"a\": "), std::invalid_argument);
  CHECK_FALSE(fs::exists(tmp / "x"));
}

TEST_CASE("checkpoint: another run's checkpoint is refused, naming what differs", "[io][checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  host::Trainer<AdamRun> t(options(4));
  io::save_checkpoint(t, dir);

  host::Trainer<Adam8Run> eight(options(4));
  REQUIRE_THROWS_AS(io::load_checkpoint(eight, dir), io::checkpoint_error);
  REQUIRE_THROWS_WITH(io::load_checkpoint(eight, dir),
                      Contains("belongs to another run") && Contains("optimizer AdamW in the checkpoint, AdamW8bit in this trainer"));

  host::Trainer<Run<models::GPT2<gpt2_ck>, AdamW>> gpt2(options(4));
  REQUIRE_THROWS_WITH(io::load_checkpoint(gpt2, dir), Contains("model Llama in the checkpoint, GPT2 in this trainer"));

  // the same model with LoRA on q_proj: the base is frozen there, which the
  // first parameter already shows
  using LlamaLoRA = models::Llama<llama_ck, Apply<LoRA<4>, On<q_proj>>>;
  host::Trainer<Run<LlamaLoRA, AdamW>> lora(options(4));
  REQUIRE_THROWS_WITH(io::load_checkpoint(lora, dir),
                      Contains("parameter count 21 in the checkpoint, 25 in this trainer") &&
                          Contains("parameter 0 'embed_tokens.weight: f32, shape (48, 64), state 24576 B' in the checkpoint, "
                                   "'embed_tokens.weight: f32, shape (48, 64), frozen' in this trainer"));
  CHECK(lora.steps_done() == 0);

  // NF4 instead of Int8 on the same projections: same count, other storage
  using LlamaInt8 = models::Llama<llama_ck, Apply<Quantized<Int8, LoRA<4>>, On<q_proj, v_proj, down_proj>>>;
  io::save_checkpoint(host::Trainer<Run<LlamaQLoRA, AdamW8bit>>(options(4)), tmp / "qlora");
  host::Trainer<Run<LlamaInt8, AdamW8bit>> int8(options(4));
  REQUIRE_THROWS_WITH(io::load_checkpoint(int8, tmp / "qlora"),
                      Contains("'layers.0.self_attn.q_proj.weight: nf4 block 64 dq, shape (64, 64), frozen' in the checkpoint") &&
                          Contains("'layers.0.self_attn.q_proj.weight: int8 block 64, shape (64, 64), frozen' in this trainer"));
}

// What a checkpoint stores does not depend on the batch, Workers<W> or
// activation checkpointing: a run that differs only there resumes it, and
// the state it loads is bit-identical to the one saved.
template <class Saver, class Loader>
void moves_between(std::uint64_t seed) {
  TempDir tmp;
  host::Trainer<Saver> a(options(seed));
  for (int s = 0; s < 2; ++s) step(a);
  io::save_checkpoint(a, tmp / "ckpt");
  host::Trainer<Loader> b(options(seed + 1));
  io::load_checkpoint(b, tmp / "ckpt");
  CHECK(b.steps_done() == 2);
  CHECK(mismatch_at(state_bytes(b), state_bytes(a)) == -1);
}

TEST_CASE("checkpoint: a run that differs only in scratch or activations resumes it bit-identically", "[io][checkpoint]") {
  using W1 = Run<Llama, AdamW8bit>;
  REQUIRE(host::Trainer<W1>::plan.peak_bytes(Tier::device) != host::Trainer<Adam8Run>::plan.peak_bytes(Tier::device));
  moves_between<Adam8Run, W1>(21);
  moves_between<W1, Adam8Run>(22);
  moves_between<AdamRun, Train<Llama, Batch<1>, Seq<12>, Precision<DType::F32>, AdamW>>(23);
  moves_between<Run<LlamaQLoRA, AdamW8bit>,
                Run<models::Llama<llama_ck, Apply<Quantized<NF4DQ, LoRA<4>>, On<q_proj, v_proj, down_proj>>,
                                  Apply<Checkpointed<>, EveryBlock>>,
                    AdamW8bit, Workers<2>>>(24);

  // Workers<1> and Workers<2> compute the same steps, so the resumed run
  // continues exactly as the saved one would have.
  TempDir tmp;
  host::Trainer<W1> one(options(25));
  host::Trainer<Adam8Run> straight(options(25));
  for (int s = 0; s < 3; ++s) REQUIRE(step(one) == step(straight));
  io::save_checkpoint(one, tmp / "ckpt");
  host::Trainer<Adam8Run> two(options(26));
  io::load_checkpoint(two, tmp / "ckpt");
  for (int s = 0; s < 3; ++s) CHECK(step(two) == step(straight));
  CHECK(mismatch_at(state_bytes(two), state_bytes(straight)) == -1);
}

TEST_CASE("checkpoint: a save replaces only a missing path, an empty directory or a checkpoint", "[io][checkpoint]") {
  TempDir tmp;
  host::Trainer<AdamRun> t(options(27));
  step(t);
  auto refused = [&](const fs::path& target, const std::string& why) {
    REQUIRE_THROWS_AS(io::save_checkpoint(t, target), io::overwrite_refused);
    REQUIRE_THROWS_WITH(io::save_checkpoint(t, target), Contains(target.string()) && Contains(why) && Contains("nothing was written"));
    CHECK(left_beside(target).empty());
  };

  SECTION("an output folder of other files is left as it was") {
    const fs::path out = tmp / "out";
    fs::create_directories(out / "adapter");
    headroom::test::write_file(out / "model.safetensors", "weights");
    headroom::test::write_file(out / "notes.txt", "do not lose me");
    headroom::test::write_file(out / "adapter" / "adapter_config.json", "{}");
    refused(out, "holds no headroom checkpoint");
    CHECK(read_text(out / "model.safetensors") == "weights");
    CHECK(read_text(out / "notes.txt") == "do not lose me");
    CHECK(read_text(out / "adapter" / "adapter_config.json") == "{}");
  }
  SECTION("a file is not replaced by a checkpoint directory") {
    const fs::path file = tmp / "model.safetensors";
    headroom::test::write_file(file, "weights");
    refused(file, "is not a directory");
    CHECK(fs::is_regular_file(file));
    CHECK(read_text(file) == "weights");
  }
  SECTION("a folder whose trainer.json is someone else's") {
    const fs::path other = tmp / "other";
    fs::create_directories(other);
    headroom::test::write_file(other / "trainer.json", R"({"format": "something-else"})");
    refused(other, "holds no headroom checkpoint");
    CHECK(read_text(other / "trainer.json") == R"({"format": "something-else"})");
  }
  SECTION("an empty directory, then the checkpoint itself, are replaced") {
    const fs::path dir = tmp / "empty";
    fs::create_directories(dir);
    io::save_checkpoint(t, dir);
    step(t);
    io::save_checkpoint(t, dir);
    host::Trainer<AdamRun> u(options(28));
    io::load_checkpoint(u, dir);
    CHECK(u.steps_done() == 2);
  }
}

TEST_CASE("checkpoint: a version 1 checkpoint (signed by the plan's arena bytes) still loads", "[io][checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  host::Trainer<AdamRun> t(options(29));
  step(t);
  io::save_checkpoint(t, dir);
  // rewrite trainer.json as version 1 wrote it
  std::string json = read_text(dir / "trainer.json");
  json.replace(json.find("\"version\": 4"), 12, "\"version\": 1");
  const auto a = json.find(",\n    \"parameters\": [");
  const auto b = json.find("]}", a);
  json.replace(a, b + 1 - a, ", \"plan_peak_bytes\": {\"device\": 1, \"offload\": 0}");
  headroom::test::write_file(dir / "trainer.json", json);
  host::Trainer<AdamRun> u(options(30));
  io::load_checkpoint(u, dir);
  CHECK(mismatch_at(state_bytes(u), state_bytes(t)) == -1);
}

TEST_CASE("checkpoint: missing, truncated and corrupt files are refused before anything is loaded", "[io][checkpoint]") {
  using Tr = host::Trainer<AdamRun>;
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  Tr t(options(5));
  step(t);
  io::save_checkpoint(t, dir);
  Tr u(options(6));
  const auto before = state_bytes(u);

  SECTION("no directory") {
    REQUIRE_THROWS_WITH(io::load_checkpoint(u, tmp / "nothing"), Contains("nothing") && Contains("no such checkpoint directory"));
  }
  SECTION("trainer.json missing") {
    fs::remove(dir / "trainer.json");
    REQUIRE_THROWS_WITH(io::load_checkpoint(u, dir), Contains("trainer.json not found"));
  }
  SECTION("trainer.json corrupt") {
    std::ofstream(dir / "trainer.json", std::ios::trunc) << "{\"format\": \"headroom-checkpoint\", \"version\": ";
    REQUIRE_THROWS_WITH(io::load_checkpoint(u, dir), Contains("trainer.json") && Contains("corrupt"));
  }
  SECTION("a step count that leaves no room for the next step") {
    std::string json = read_text(dir / "trainer.json");
    const auto at = json.find("\"steps_done\": 1");
    REQUIRE(at != std::string::npos);
    for (const char* steps : {"2147483647", "-1"}) {
      std::string edited = json;
      edited.replace(at, std::string("\"steps_done\": 1").size(), std::string("\"steps_done\": ") + steps);
      headroom::test::write_file(dir / "trainer.json", io::detail::checkpoint::seal(edited));  // past the checksum
      REQUIRE_THROWS_WITH(io::load_checkpoint(u, dir), Contains("trainer.json") && Contains(std::string("\"steps_done\" is ") + steps) &&
                                                           Contains("outside 0 to 2147483646"));
    }
  }
  SECTION("optimizer.safetensors missing") {
    fs::remove(dir / "optimizer.safetensors");
    REQUIRE_THROWS_WITH(io::load_checkpoint(u, dir), Contains("optimizer.safetensors is missing"));
  }
  SECTION("model.safetensors truncated") {
    fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 64);
    REQUIRE_THROWS_WITH(io::load_checkpoint(u, dir), Contains("model.safetensors") && Contains("truncated"));
  }
  SECTION("a flipped byte in the data") {
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1000, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(-1000, std::ios::end);
    f.write(&c, 1);
    f.close();
    REQUIRE_THROWS_WITH(io::load_checkpoint(u, dir), Contains("model.safetensors") && Contains("corrupt"));
  }
  CHECK(mismatch_at(state_bytes(u), before) == -1);
  CHECK(u.steps_done() == 0);
}

TEST_CASE("checkpoint: an interrupted save leaves the previous checkpoint loadable", "[io][checkpoint]") {
  using Tr = host::Trainer<AdamRun>;
  namespace ck = io::detail::checkpoint;
  HookGuard guard;
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  Tr t(options(7));
  step(t);
  io::save_checkpoint(t, dir, R"({"v": 1})");
  const auto v1 = state_bytes(t);
  step(t);
  const auto v2 = state_bytes(t);
  REQUIRE(mismatch_at(v1, v2) != -1);

  auto loads_v1 = [&] {
    Tr u(options(8));
    CHECK(io::load_checkpoint(u, dir) == R"({"v": 1})");
    CHECK(u.steps_done() == 1);
    CHECK(mismatch_at(state_bytes(u), v1) == -1);
  };
  auto interrupt_at = [&](std::string_view where) {
    ck::test_hook() = [where](std::string_view stage) {
      if (stage == where) throw std::runtime_error("interrupted at " + std::string(stage));
    };
    REQUIRE_THROWS_WITH(io::save_checkpoint(t, dir, R"({"v": 2})"), Contains("interrupted"));
    ck::test_hook() = nullptr;
    CHECK(left_beside(dir).empty());
  };

  SECTION("after model.safetensors") {
    interrupt_at("model.safetensors");
    loads_v1();
  }
  SECTION("after optimizer.safetensors") {
    interrupt_at("optimizer.safetensors");
    loads_v1();
  }
  SECTION("before trainer.json") {
    interrupt_at("trainer.json");
    loads_v1();
  }
  SECTION("just before the swap") {
    interrupt_at("swap");
    loads_v1();
  }
  SECTION("between the two renames (no RENAME_EXCHANGE)") {
    ck::force_two_renames() = true;
    interrupt_at("aside");
    loads_v1();
    CHECK(left_beside(dir).empty());
  }
  SECTION("the two-rename swap when it completes") {
    ck::force_two_renames() = true;
    io::save_checkpoint(t, dir, R"({"v": 2})");
    Tr u(options(8));
    CHECK(io::load_checkpoint(u, dir) == R"({"v": 2})");
    CHECK(mismatch_at(state_bytes(u), v2) == -1);
    CHECK(left_beside(dir).empty());
  }
  SECTION("a crash that left an incomplete staging directory") {
    fs::create_directory(staging_name(dir));
    std::ofstream(staging_name(dir) / "model.safetensors") << "partial";
    std::ofstream(staging_name(dir) / "optimizer.safetensors.headroom-tmp-0123456789ab") << "partial";
    loads_v1();
    io::save_checkpoint(t, dir, R"({"v": 2})");  // cleans it up
    CHECK(left_beside(dir).empty());
    Tr u(options(8));
    CHECK(io::load_checkpoint(u, dir) == R"({"v": 2})");
    CHECK(mismatch_at(state_bytes(u), v2) == -1);
  }
  SECTION("a crash between the two renames: the complete new checkpoint is found, and the next save recovers") {
    // the state a process killed after "rename dir aside" leaves
    io::save_checkpoint(t, tmp / "other", R"({"v": 2})");
    fs::rename(dir, aside_name(dir));
    fs::rename(tmp / "other", staging_name(dir));
    {
      Tr u(options(8));
      CHECK(io::load_checkpoint(u, dir) == R"({"v": 2})");
      CHECK(mismatch_at(state_bytes(u), v2) == -1);
    }
    step(t);
    io::save_checkpoint(t, dir, R"({"v": 3})");
    CHECK(names_in(tmp.dir) == std::vector<std::string>{"ckpt"});
    Tr u(options(8));
    CHECK(io::load_checkpoint(u, dir) == R"({"v": 3})");
    CHECK(u.steps_done() == 3);
  }
  SECTION("a crash after the old one was set aside, before the new one was complete") {
    fs::rename(dir, aside_name(dir));
    fs::create_directory(staging_name(dir));
    loads_v1();
    io::save_checkpoint(t, dir, R"({"v": 2})");
    CHECK(names_in(tmp.dir) == std::vector<std::string>{"ckpt"});
    Tr u(options(8));
    CHECK(io::load_checkpoint(u, dir) == R"({"v": 2})");
  }
}

TEST_CASE("checkpoint: weights that overflowed are not saved over the last good checkpoint", "[io][checkpoint]") {
  using Tr = host::Trainer<AdamRun>;
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  Tr t(options(31));
  step(t);
  io::save_checkpoint(t, dir);
  const auto good = state_bytes(t);
  step(t);
  // what an update that left f32's range writes
  const ParamSlot& p = *Tr::find("layers.1.mlp.down_proj.weight");
  t.weight(p)[3 * p.cols + 5] = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_AS(io::save_checkpoint(t, dir), io::checkpoint_error);
  REQUIRE_THROWS_WITH(io::save_checkpoint(t, dir), Contains("not saved: after step 2, layers.1.mlp.down_proj.weight holds inf at [3, 5]"));
  CHECK(names_in(tmp.dir) == std::vector<std::string>{"ckpt"});
  Tr u(options(32));
  io::load_checkpoint(u, dir);
  CHECK(u.steps_done() == 1);
  CHECK(mismatch_at(state_bytes(u), good) == -1);
}

TEST_CASE("checkpoint: a save leaves folders and links named like its staging or its old copy alone", "[io][checkpoint]") {
  using Tr = host::Trainer<AdamRun>;
  namespace ck = io::detail::checkpoint;
  HookGuard guard;
  TempDir tmp;
  Tr t(options(33));
  step(t);
  // the user's own folders of those names, and links of those names to a folder of theirs
  fs::create_directories(tmp / "ckpt.headroom-saving");
  headroom::test::write_file(tmp / "ckpt.headroom-saving" / "notes.txt", "mine");
  fs::create_directories(tmp / "ckpt.headroom-old" / "sub");
  headroom::test::write_file(tmp / "ckpt.headroom-old" / "sub" / "trainer.json", "my trainer notes");
  fs::create_directories(tmp / "elsewhere");
  headroom::test::write_file(tmp / "elsewhere" / "keep.txt", "kept");
  fs::create_directory_symlink(tmp / "elsewhere", tmp / "other.headroom-saving");
  fs::create_directory_symlink(tmp / "elsewhere", tmp / "other.headroom-old");
  // named as a save names its own, but not what a save makes: a folder holding
  // another file, and links
  fs::create_directories(tmp / "ckpt.headroom-saving-aaaaaaaaaaaa");
  headroom::test::write_file(tmp / "ckpt.headroom-saving-aaaaaaaaaaaa" / "notes.txt", "mine too");
  fs::create_directory_symlink(tmp / "elsewhere", tmp / "ckpt.headroom-old-bbbbbbbbbbbb");
  fs::create_directory_symlink(tmp / "elsewhere", tmp / "other.headroom-saving-cccccccccccc");
  const std::vector<std::string> before = names_in(tmp.dir);

  for (const char* name : {"ckpt", "other"}) {
    io::save_checkpoint(t, tmp / name);  // into a new directory
    step(t);
    io::save_checkpoint(t, tmp / name);  // swapped over the first
    ck::force_two_renames() = true;
    io::save_checkpoint(t, tmp / name);  // set aside, then renamed in
    ck::force_two_renames() = false;
    ck::test_hook() = [](std::string_view stage) {
      if (stage == "swap") throw std::runtime_error("interrupted");
    };
    REQUIRE_THROWS_WITH(io::save_checkpoint(t, tmp / name), Contains("interrupted"));
    ck::test_hook() = nullptr;
    Tr u(options(34));
    io::load_checkpoint(u, tmp / name);
    CHECK(u.steps_done() == t.steps_done());
  }
  std::vector<std::string> after = before;
  after.push_back("ckpt");
  after.push_back("other");
  std::sort(after.begin(), after.end());
  CHECK(names_in(tmp.dir) == after);
  CHECK(names_in(tmp / "ckpt.headroom-saving") == std::vector<std::string>{"notes.txt"});
  CHECK(read_text(tmp / "ckpt.headroom-saving" / "notes.txt") == "mine");
  CHECK(read_text(tmp / "ckpt.headroom-saving-aaaaaaaaaaaa" / "notes.txt") == "mine too");
  CHECK(read_text(tmp / "ckpt.headroom-old" / "sub" / "trainer.json") == "my trainer notes");
  CHECK(fs::is_symlink(tmp / "other.headroom-saving"));
  CHECK(fs::is_symlink(tmp / "other.headroom-old"));
  CHECK(names_in(tmp / "elsewhere") == std::vector<std::string>{"keep.txt"});
  CHECK(read_text(tmp / "elsewhere" / "keep.txt") == "kept");
}

TEST_CASE("checkpoint: a trainer.json edited by hand is refused, naming the file", "[io][checkpoint]") {
  using Tr = host::Trainer<AdamRun>;
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";
  Tr t(options(35));
  for (int s = 0; s < 3; ++s) step(t);
  io::save_checkpoint(t, dir, R"({"position": 72})");
  const std::string json = read_text(dir / "trainer.json");
  Tr u(options(36));
  const auto before = state_bytes(u);
  auto refused = [&](const std::string& from, const std::string& to) {
    std::string edited = json;
    REQUIRE(edited.find(from) != std::string::npos);
    edited.replace(edited.find(from), from.size(), to);
    headroom::test::write_file(dir / "trainer.json", edited);
    REQUIRE_THROWS_AS(io::load_checkpoint(u, dir), io::checkpoint_error);
    REQUIRE_THROWS_WITH(io::load_checkpoint(u, dir), Contains((dir / "trainer.json").string()) && Contains("edited"));
    CHECK(u.steps_done() == 0);
    CHECK(mismatch_at(state_bytes(u), before) == -1);
  };
  SECTION("the step count") { refused("\"steps_done\": 3", "\"steps_done\": 1"); }
  SECTION("the caller's extra object") { refused("\"position\": 72", "\"position\": 7"); }
  SECTION("an option") { refused("\"warmup_steps\": 2", "\"warmup_steps\": 3"); }
  SECTION("a version 2 trainer.json (written before the checksum) loads as before") {
    std::string v2 = json;
    v2.replace(v2.find("\"version\": 4"), 12, "\"version\": 2");
    const auto at = v2.find(",\n  \"checksum\": ");
    REQUIRE(at != std::string::npos);
    v2.erase(at, v2.find('\n', at + 2) - at);
    REQUIRE(v2.find("checksum") == std::string::npos);
    headroom::test::write_file(dir / "trainer.json", v2);
    CHECK(io::load_checkpoint(u, dir) == R"({"position": 72})");
    CHECK(u.steps_done() == 3);
    CHECK(mismatch_at(state_bytes(u), state_bytes(t)) == -1);
  }
}
