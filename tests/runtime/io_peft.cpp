// LoRA adapters in PEFT's layout (io/peft.hpp): names, shapes and
// adapter_config.json for Llama and GPT-2, load_adapter round trips and its
// errors, and merged checkpoints that reproduce the adapted model's loss in
// a trainer without LoRA (LoRA on dense and on NF4 bases, GPT-2's transposed
// Conv1D weights).
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"

#include <headroom/headroom.hpp>
#include <headroom/io/peft.hpp>
#include <headroom/train/host/trainer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace headroom;
using Catch::Contains;

namespace {
using headroom::test::TempDir;
using headroom::test::mismatch_at;
using headroom::test::ids;

namespace fs = std::filesystem;
namespace js = io::detail::json;

constexpr models::LlamaConfig llama_pf{48, 64, 128, 2, 4, 2, 64, false};
constexpr models::GPT2Config gpt2_pf{48, 64, 2, 4, 32};

template <class M>
using Run = Train<M, Batch<2>, Seq<12>, Precision<DType::F32>>;
using Llama = models::Llama<llama_pf>;
using LlamaLoRA = models::Llama<llama_pf, Apply<LoRA<4>, On<q_proj, v_proj>>>;
using LlamaQLoRA = models::Llama<llama_pf, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj>>>;
using GPT2 = models::GPT2<gpt2_pf>;
// rank 8, alpha 16 on c_attn and the attention's c_proj only (not the MLP's c_proj)
using GPT2LoRA = models::GPT2<gpt2_pf, Apply<LoRA<8, Linear<>, Ratio<16>>, On<c_attn, attn_c_proj>>>;

// A few steps with a large learning rate, so B is far from zero.
template <class Tr>
void train(Tr& t, int steps) {
  for (int s = 0; s < steps; ++s) t.step(ids(24, 7 + 2 * s), ids(24, 8 + 2 * s));
}

template <class Tr>
std::vector<typename Tr::T> adapters(const Tr& t) {
  std::vector<typename Tr::T> v;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    if (io::is_adapter_param(p.name)) v.insert(v.end(), t.weight(p), t.weight(p) + p.elements());
  }
  return v;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }
std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}
std::vector<std::string> strings(const js::Value& v) {
  std::vector<std::string> out;
  for (const js::Value& x : v.items) out.push_back(x.string);
  return out;
}

}  // namespace

// lora_dropout: PEFT's config holds one probability; where modules differ,
// export_adapter writes the most common (it acts in training only: the
// adapters' weights and outputs do not depend on it). load_adapter reads an
// adapter into a run with another dropout: continuing to train with a new
// dropout is the user's choice.
TEST_CASE("peft: lora_dropout is exported, and loads into a run with another", "[io][peft]") {
  using Drop5 = LoRA<4, Linear<>, Ratio<4>, Ratio<1, 20>>;
  using Drop10 = LoRA<4, Linear<>, Ratio<4>, Ratio<1, 10>>;
  using M = models::Llama<llama_pf, Apply<Drop5, On<q_proj, k_proj>>, Apply<Drop10, On<v_proj>>>;
  using Tr = host::Trainer<Run<M>>;
  TempDir tmp;
  Tr t({.seed = 1, .lr = 3e-2});
  train(t, 2);
  io::export_adapter(t, tmp / "adapter", "headroom/tiny-llama");
  const js::Value cfg = js::parse(read_text(tmp / "adapter" / "adapter_config.json"));
  CHECK(cfg.get("lora_dropout")->number == 0.05);  // q and k (4 modules) against v (2)
  CHECK(cfg.get("r")->integer() == 4);

  using Plain = host::Trainer<Run<models::Llama<llama_pf, Apply<LoRA<4>, On<q_proj, k_proj, v_proj>>>>>;
  Plain p({.seed = 2});
  io::load_adapter(p, tmp / "adapter");
  for (const char* name : {"layers.0.self_attn.q_proj.lora_B", "layers.1.self_attn.v_proj.lora_A"}) {
    INFO(name);
    const ParamSlot& a = *Tr::find(name);
    const ParamSlot& b = *Plain::find(name);
    CHECK(std::equal(t.weight(a), t.weight(a) + a.elements(), p.weight(b)));
  }
}

TEST_CASE("peft: a Llama adapter in PEFT's names, shapes and adapter_config.json", "[io][peft]") {
  using Tr = host::Trainer<Run<LlamaLoRA>>;
  TempDir tmp;
  const fs::path dir = tmp / "adapter";
  Tr t({.seed = 1, .lr = 3e-2});
  train(t, 3);
  io::export_adapter(t, dir, "headroom/tiny-llama");

  const io::SafetensorsFile f(dir / "adapter_model.safetensors");
  CHECK(f.tensors().size() == 8);  // (q, v) x (A, B) x 2 blocks
  f.expect("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", DType::F32, {4, 64});
  f.expect("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", DType::F32, {64, 4});
  f.expect("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight", DType::F32, {4, 64});
  f.expect("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight", DType::F32, {32, 4});
  std::vector<float> b(32 * 4);
  f.read("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight", b.data(), b.size() * 4);
  CHECK(std::equal(b.begin(), b.end(), t.weight(*Tr::find("layers.1.self_attn.v_proj.lora_B"))));

  const js::Value cfg = js::parse(read_text(dir / "adapter_config.json"));
  CHECK(cfg.get("peft_type")->string == "LORA");
  CHECK(cfg.get("task_type")->string == "CAUSAL_LM");
  CHECK(cfg.get("base_model_name_or_path")->string == "headroom/tiny-llama");
  CHECK(cfg.get("r")->integer() == 4);
  CHECK(cfg.get("lora_alpha")->string == "4");  // scale 1 * r, an integer
  CHECK(strings(*cfg.get("target_modules")) == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(cfg.get("lora_dropout")->number == 0.0);
  CHECK(cfg.get("bias")->string == "none");
  CHECK(cfg.get("fan_in_fan_out")->kind == js::Value::Kind::Bool);
  CHECK_FALSE(cfg.get("fan_in_fan_out")->boolean);
  CHECK(cfg.get("inference_mode")->boolean);
  CHECK(cfg.get("rank_pattern")->keys.empty());
  CHECK(cfg.get("alpha_pattern")->keys.empty());

  // round trip into a trainer with the same base and fresh adapters
  Tr u({.seed = 1});
  const auto tok = ids(24, 50), tgt = ids(24, 51);
  CHECK(u.evaluate(tok, tgt) != t.evaluate(tok, tgt));
  io::load_adapter(u, dir);
  CHECK(mismatch_at(adapters(u), adapters(t)) == -1);
  CHECK(u.evaluate(tok, tgt) == t.evaluate(tok, tgt));
}

TEST_CASE("peft: a GPT-2 adapter uses transformer. paths, fan_in_fan_out and precise target_modules", "[io][peft]") {
  using Tr = host::Trainer<Run<GPT2LoRA>>;
  TempDir tmp;
  const fs::path dir = tmp / "adapter";
  Tr t({.seed = 2, .lr = 3e-2});
  train(t, 3);
  io::export_adapter(t, dir, "openai-community/gpt2");

  const io::SafetensorsFile f(dir / "adapter_model.safetensors");
  CHECK(f.tensors().size() == 8);
  f.expect("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight", DType::F32, {8, 64});
  f.expect("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight", DType::F32, {192, 8});
  f.expect("base_model.model.transformer.h.1.attn.c_proj.lora_A.weight", DType::F32, {8, 64});
  f.expect("base_model.model.transformer.h.1.attn.c_proj.lora_B.weight", DType::F32, {64, 8});
  CHECK(f.find("base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight") == nullptr);

  const js::Value cfg = js::parse(read_text(dir / "adapter_config.json"));
  CHECK(cfg.get("r")->integer() == 8);
  CHECK(cfg.get("lora_alpha")->string == "16");
  // "c_proj" alone would also put LoRA on the MLP's c_proj in PEFT
  CHECK(strings(*cfg.get("target_modules")) == std::vector<std::string>{"c_attn", "attn.c_proj"});
  CHECK(cfg.get("fan_in_fan_out")->boolean);

  Tr u({.seed = 2});
  io::load_adapter(u, dir);
  CHECK(mismatch_at(adapters(u), adapters(t)) == -1);
  const auto tok = ids(24, 60), tgt = ids(24, 61);
  CHECK(u.evaluate(tok, tgt) == t.evaluate(tok, tgt));
}

TEST_CASE("peft: load_adapter refuses adapters that do not fit, naming the tensor or setting", "[io][peft]") {
  using Tr = host::Trainer<Run<LlamaLoRA>>;
  TempDir tmp;
  const fs::path dir = tmp / "adapter";
  Tr t({.seed = 3, .lr = 3e-2});
  train(t, 1);
  io::export_adapter(t, dir, "x");
  const std::string config = read_text(dir / "adapter_config.json");
  const fs::path weights = dir / "adapter_model.safetensors";
  Tr u({.seed = 3});
  const auto before = adapters(u);

  auto rewrite = [&](auto&& change) {  // every tensor of the adapter, one changed
    const io::SafetensorsFile f(weights);
    std::vector<std::vector<unsigned char>> data;
    std::vector<io::TensorView> views;
    for (const io::TensorInfo& ti : f.tensors()) data.emplace_back(ti.end - ti.begin);
    std::size_t i = 0;
    for (const io::TensorInfo& ti : f.tensors()) {
      f.read(ti.name, data[i].data(), data[i].size());
      views.push_back({ti.name, ti.dtype, ti.shape, data[i].data()});
      ++i;
    }
    change(views, data);
    io::write_safetensors(weights, views);
  };
  const std::string a0 = "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight";

  SECTION("rank") {
    write_text(dir / "adapter_config.json", replace(config, "\"r\": 4", "\"r\": 8"));
    REQUIRE_THROWS_WITH(io::load_adapter(u, dir), Contains("adapter_config.json") && Contains("rank 8 for module model.layers.0.self_attn.q_proj") &&
                                                      Contains("has rank 4"));
  }
  SECTION("alpha") {
    write_text(dir / "adapter_config.json", replace(config, "\"lora_alpha\": 4", "\"lora_alpha\": 16"));
    REQUIRE_THROWS_WITH(io::load_adapter(u, dir), Contains("lora_alpha 16") && Contains("scale 4") && Contains("LoRA scale there is 1"));
  }
  SECTION("not LoRA") {
    write_text(dir / "adapter_config.json", replace(config, "\"LORA\"", "\"IA3\""));
    REQUIRE_THROWS_WITH(io::load_adapter(u, dir), Contains("only LoRA adapters"));
  }
  SECTION("a missing tensor") {
    rewrite([&](auto& views, auto&) {
      for (auto& v : views)
        if (v.name == a0) v.name = "base_model.model.model.layers.0.self_attn.v_proj.lora_A.default.weight";
    });
    REQUIRE_THROWS_WITH(io::load_adapter(u, dir), Contains("tensor '" + a0 + "' not found"));
  }
  SECTION("a wrong shape") {
    rewrite([&](auto& views, auto&) {
      for (auto& v : views)
        if (v.name == a0) v.shape = {64, 4};
    });
    REQUIRE_THROWS_WITH(io::load_adapter(u, dir), Contains("tensor '" + a0 + "'") && Contains("shape is [64, 4], expected [4, 64] (r, in)"));
  }
  SECTION("a wrong dtype") {
    rewrite([&](auto& views, auto&) {
      for (auto& v : views)
        if (v.name == a0) v.dtype = DType::I32;
    });
    REQUIRE_THROWS_WITH(io::load_adapter(u, dir), Contains("tensor '" + a0 + "'") && Contains("dtype I32 is not supported"));
  }
  SECTION("a tensor for a module without LoRA") {
    static const float zeros[4 * 64] = {};
    rewrite([&](auto& views, auto&) {
      views.push_back({"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", DType::F32, {4, 64}, zeros});
    });
    REQUIRE_THROWS_WITH(io::load_adapter(u, dir), Contains("k_proj.lora_A.weight' has no place in this trainer"));
  }
  SECTION("a value that is not finite") {
    rewrite([&](auto& views, auto& data) {
      for (std::size_t i = 0; i < views.size(); ++i)
        if (views[i].name == a0) {
          const float nan = std::nanf("");
          std::memcpy(data[i].data() + 4 * 70, &nan, 4);  // element 70 of (4, 64)
        }
    });
    REQUIRE_THROWS_WITH(io::load_adapter(u, dir), Contains("tensor '" + a0 + "': element 70 of [4, 64] is NaN") &&
                                                      Contains("nothing was loaded"));
  }
  SECTION("BF16 values are converted") {
    rewrite([&](auto& views, auto& data) {
      for (std::size_t i = 0; i < views.size(); ++i) {
        if (views[i].name != a0) continue;
        std::vector<unsigned char> h(data[i].size() / 2);
        for (std::size_t k = 0; k < h.size() / 2; ++k) {  // keep the high half of each f32
          h[2 * k] = data[i][4 * k + 2];
          h[2 * k + 1] = data[i][4 * k + 3];
        }
        data[i] = std::move(h);
        views[i].data = data[i].data();
        views[i].dtype = DType::BF16;
      }
    });
    io::load_adapter(u, dir);
    const float* a = u.weight(*Tr::find("layers.0.self_attn.v_proj.lora_A"));
    const float* ref = t.weight(*Tr::find("layers.0.self_attn.v_proj.lora_A"));
    for (int k = 0; k < 4 * 64; ++k) {
      std::uint32_t bits;
      std::memcpy(&bits, &ref[k], 4);
      bits &= 0xFFFF0000u;
      float trunc;
      std::memcpy(&trunc, &bits, 4);
      REQUIRE(a[k] == trunc);
    }
    return;
  }
  CHECK(mismatch_at(adapters(u), before) == -1);  // nothing was loaded
}

TEST_CASE("peft: a merged checkpoint reproduces the adapted model in a trainer without LoRA", "[io][peft]") {
  TempDir tmp;
  const auto tok = ids(24, 70), tgt = ids(24, 71);

  SECTION("LoRA on a dense Llama") {
    using A = host::Trainer<Run<LlamaLoRA>>;
    A t({.seed = 4, .lr = 3e-2});
    train(t, 3);
    const double adapted = t.evaluate(tok, tgt);
    io::save_merged(t, tmp / "merged.safetensors");
    // W + scale * B A, element by element
    const io::SafetensorsFile f(tmp / "merged.safetensors");
    CHECK(f.tensors().size() == 21);  // the base parameters only
    std::vector<float> w(32 * 64);
    f.read("model.layers.1.self_attn.v_proj.weight", w.data(), w.size() * 4);
    const float* w0 = t.weight(*A::find("layers.1.self_attn.v_proj.weight"));
    const float* a = t.weight(*A::find("layers.1.self_attn.v_proj.lora_A"));
    const float* b = t.weight(*A::find("layers.1.self_attn.v_proj.lora_B"));
    double moved = 0;
    for (int o = 0; o < 32; ++o)
      for (int i = 0; i < 64; ++i) {
        double d = w0[o * 64 + i];
        for (int r = 0; r < 4; ++r) d += double(b[o * 4 + r]) * double(a[r * 64 + i]);
        REQUIRE(w[o * 64 + i] == static_cast<float>(d));
        moved = std::max(moved, std::abs(d - w0[o * 64 + i]));
      }
    CHECK(moved > 1e-4);  // the adapter matters

    host::Trainer<Run<Llama>> plain({.seed = 5});
    io::load_pretrained(plain, tmp / "merged.safetensors");
    CHECK(plain.evaluate(tok, tgt) == Approx(adapted).epsilon(1e-6));
    // and the unmerged base is a different model
    io::save_pretrained(t, tmp / "base.safetensors");
    io::load_pretrained(plain, tmp / "base.safetensors");
    CHECK(plain.evaluate(tok, tgt) != Approx(adapted).epsilon(1e-6));
  }
  SECTION("QLoRA: the NF4 base dequantized, plus the adapter") {
    using Q = host::Trainer<Run<LlamaQLoRA>>;
    Q t({.seed = 6, .lr = 3e-2});
    train(t, 3);
    const double adapted = t.evaluate(tok, tgt);
    io::save_merged(t, tmp / "merged.safetensors");
    host::Trainer<Run<Llama>> plain({.seed = 7});
    io::load_pretrained(plain, tmp / "merged.safetensors");
    CHECK(plain.evaluate(tok, tgt) == Approx(adapted).epsilon(1e-6));
  }
  SECTION("GPT-2: merged Conv1D weights are written transposed") {
    using G = host::Trainer<Run<GPT2LoRA>>;
    G t({.seed = 8, .lr = 3e-2});
    train(t, 3);
    const double adapted = t.evaluate(tok, tgt);
    io::save_merged(t, tmp / "merged.safetensors");
    const io::SafetensorsFile f(tmp / "merged.safetensors");
    f.expect("h.0.attn.c_attn.weight", DType::F32, {64, 192});
    host::Trainer<Run<GPT2>> plain({.seed = 9});
    io::load_pretrained(plain, tmp / "merged.safetensors");
    CHECK(plain.evaluate(tok, tgt) == Approx(adapted).epsilon(1e-6));
  }
}

TEST_CASE("peft: an f64 run's adapter is written as F32, loads back, and merges", "[io][peft]") {
  using G = host::Trainer<Train<GPT2LoRA, Batch<2>, Seq<12>, Precision<DType::F64>>>;
  TempDir tmp;
  const fs::path dir = tmp / "adapter";
  const auto tok = ids(24, 80), tgt = ids(24, 81);
  G t({.seed = 10, .lr = 3e-2});
  train(t, 3);
  io::export_adapter(t, dir, "openai-community/gpt2");
  const io::SafetensorsFile f(dir / "adapter_model.safetensors");
  f.expect("base_model.model.transformer.h.1.attn.c_attn.lora_B.weight", DType::F32, {192, 8});

  G u({.seed = 10});
  io::load_adapter(u, dir);
  std::vector<double> rounded;
  for (double x : adapters(t)) rounded.push_back(static_cast<float>(x));
  CHECK(mismatch_at(adapters(u), rounded) == -1);

  // the merged F32 checkpoint in an f64 trainer without LoRA (transposed reads into double)
  const double adapted = t.evaluate(tok, tgt);
  io::save_merged(t, tmp / "merged.safetensors");
  host::Trainer<Train<GPT2, Batch<2>, Seq<12>, Precision<DType::F64>>> plain({.seed = 11});
  io::load_pretrained(plain, tmp / "merged.safetensors");
  CHECK(plain.evaluate(tok, tgt) == Approx(adapted).epsilon(1e-6));
}
