// Hugging Face base checkpoints (io/hf_names.hpp): names and layouts of the
// Llama and GPT-2 presets, save -> load round trips that reproduce the loss
// exactly, a GPT-2 file written by hand (transposed Conv1D weights, the
// "transformer." prefix, F16 / BF16 / F64 values, extra tensors), loading
// into a QLoRA trainer (quantized at load), and every kind of bad input.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"
#include "support/hf_files.hpp"

#include <headroom/headroom.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/train/host/trainer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace headroom;
using Catch::Contains;

namespace {
using headroom::test::TempDir;
using headroom::test::mismatch_at;
using headroom::test::ids;
using namespace headroom::test::hf_files;

namespace fs = std::filesystem;

constexpr models::LlamaConfig llama_io{48, 64, 128, 2, 4, 2, 64, false};
constexpr models::GPT2Config gpt2_io{48, 64, 2, 4, 32};

template <class M, class... Opts>
using Run = Train<M, Batch<2>, Seq<12>, Precision<DType::F32>, Opts...>;
using Llama = models::Llama<llama_io>;
using GPT2 = models::GPT2<gpt2_io>;
using LlamaQLoRA = models::Llama<llama_io, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj>>>;

template <class Tr>
void train(Tr& t, int steps, std::uint32_t seed = 1) {
  for (int s = 0; s < steps; ++s) t.step(ids(24, seed + 2 * s), ids(24, seed + 2 * s + 1));
}

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
// Exact encodings of values representable in the 16-bit formats.
std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  REQUIRE((u & 0xFFFFu) == 0);
  return static_cast<std::uint16_t>(u >> 16);
}
std::uint16_t to_f16(float f) {  // normal numbers with at most 11 significant bits
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
  REQUIRE((u & 0x1FFFu) == 0);
  REQUIRE(exp > 0);
  REQUIRE(exp < 31);
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint32_t>(exp) << 10) | ((u >> 13) & 0x3FFu));
}

}  // namespace

TEST_CASE("hf: Llama names, shapes, and a save -> load round trip that reproduces the loss exactly", "[io][hf]") {
  using Tr = host::Trainer<Run<Llama>>;
  STATIC_REQUIRE(io::hf_family<Tr>() == io::HfFamily::llama);
  TempDir tmp;
  const fs::path file = tmp / "model.safetensors";
  const auto tok = ids(24, 100), tgt = ids(24, 101);

  Tr a({.seed = 1, .lr = 1e-2});
  train(a, 2);
  const double loss = a.evaluate(tok, tgt);
  io::save_pretrained(a, file);

  const io::SafetensorsFile f(file);
  CHECK(f.tensors().size() == Tr::param_count);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.expect("model.embed_tokens.weight", DType::F32, {48, 64}).name == "model.embed_tokens.weight");
  f.expect("model.layers.0.self_attn.q_proj.weight", DType::F32, {64, 64});
  f.expect("model.layers.1.self_attn.k_proj.weight", DType::F32, {32, 64});
  f.expect("model.layers.1.mlp.down_proj.weight", DType::F32, {64, 128});
  f.expect("model.layers.0.input_layernorm.weight", DType::F32, {64});
  f.expect("model.layers.1.post_attention_layernorm.weight", DType::F32, {64});
  f.expect("model.norm.weight", DType::F32, {64});
  f.expect("lm_head.weight", DType::F32, {48, 64});
  CHECK(f.find("model.lm_head.weight") == nullptr);
  CHECK(io::hf_name(io::HfFamily::llama, "layers.3.self_attn.q_proj.weight") == "model.layers.3.self_attn.q_proj.weight");

  Tr b({.seed = 77});
  CHECK(b.evaluate(tok, tgt) != loss);
  io::load_pretrained(b, file);
  CHECK(b.evaluate(tok, tgt) == loss);
  require_same_weights(a, b);
}

TEST_CASE("hf: GPT-2 names as published, Conv1D weights transposed, exact round trip", "[io][hf]") {
  using Tr = host::Trainer<Run<GPT2>>;
  STATIC_REQUIRE(io::hf_family<Tr>() == io::HfFamily::gpt2);
  TempDir tmp;
  const fs::path file = tmp / "model.safetensors";
  const auto tok = ids(24, 200), tgt = ids(24, 201);

  Tr a({.seed = 2, .lr = 1e-2});
  train(a, 2);
  const double loss = a.evaluate(tok, tgt);
  io::save_pretrained(a, file);

  const io::SafetensorsFile f(file);
  CHECK(f.tensors().size() == Tr::param_count);
  f.expect("wte.weight", DType::F32, {48, 64});
  f.expect("wpe.weight", DType::F32, {32, 64});
  f.expect("h.0.ln_1.weight", DType::F32, {64});
  f.expect("h.0.ln_1.bias", DType::F32, {64});
  f.expect("h.0.attn.c_attn.weight", DType::F32, {64, 192});  // Conv1D: (in, out)
  f.expect("h.0.attn.c_attn.bias", DType::F32, {192});
  f.expect("h.1.attn.c_proj.weight", DType::F32, {64, 64});
  f.expect("h.1.mlp.c_fc.weight", DType::F32, {64, 256});
  f.expect("h.1.mlp.c_proj.weight", DType::F32, {256, 64});
  f.expect("ln_f.weight", DType::F32, {64});
  f.expect("ln_f.bias", DType::F32, {64});
  CHECK(f.find("lm_head.weight") == nullptr);  // tied to wte

  // the file's c_fc is the transpose of the trainer's (out, in) matrix
  const ParamSlot& fc = *Tr::find("h.1.mlp.c_fc.weight");
  std::vector<float> file_fc(256 * 64);
  f.read("h.1.mlp.c_fc.weight", file_fc.data(), file_fc.size() * 4);
  for (std::int64_t o = 0; o < 256; ++o)
    for (std::int64_t i = 0; i < 64; ++i) REQUIRE(file_fc[static_cast<std::size_t>(i * 256 + o)] == a.weight(fc)[o * 64 + i]);

  Tr b({.seed = 78});
  CHECK(b.evaluate(tok, tgt) != loss);
  io::load_pretrained(b, file);
  CHECK(b.evaluate(tok, tgt) == loss);
  require_same_weights(a, b);
}

TEST_CASE("hf: a GPT-2 file written by hand (transposed weights, transformer. prefix, F16 / BF16 / F64) loads", "[io][hf]") {
  using Tr = host::Trainer<Run<GPT2>>;
  TempDir tmp;
  const fs::path file = tmp / "hand.safetensors";
  Tr a({.seed = 3});
  // norm weights the 16-bit formats hold exactly
  float* ln1 = a.weight(*Tr::find("h.0.ln_1.weight"));
  float* ln2 = a.weight(*Tr::find("h.0.ln_2.weight"));
  for (int i = 0; i < 64; ++i) {
    ln1[i] = 1.0f + static_cast<float>(i) / 64.0f;       // F16: 11 significant bits
    ln2[i] = -0.5f + static_cast<float>(i % 8) / 16.0f;  // BF16: 8 significant bits
  }

  std::vector<Raw> raws;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    const std::string path = Tr::path_of(p);
    const float* w = a.weight(p);
    const std::vector<float> v(w, w + p.elements());
    Raw r{"transformer." + path, DType::F32, {p.rows, p.cols}, bytes_of(v)};
    if (p.cols == 1) r.shape = {p.rows};
    const bool conv1d = p.name == "weight" && (path.find("c_attn") != std::string::npos || path.find("c_proj") != std::string::npos ||
                                               path.find("c_fc") != std::string::npos);
    if (conv1d) {  // (in, out), by hand
      std::vector<float> t(v.size());
      for (std::int64_t o = 0; o < p.rows; ++o)
        for (std::int64_t i = 0; i < p.cols; ++i) t[static_cast<std::size_t>(i * p.rows + o)] = v[static_cast<std::size_t>(o * p.cols + i)];
      r.shape = {p.cols, p.rows};
      r.bytes = bytes_of(t);
    }
    if (path == "h.0.ln_1.weight") {
      std::vector<std::uint16_t> h;
      for (float x : v) h.push_back(to_f16(x));
      r.dtype = DType::F16;
      r.bytes = bytes_of(h);
    } else if (path == "h.0.ln_2.weight") {
      std::vector<std::uint16_t> h;
      for (float x : v) h.push_back(to_bf16(x));
      r.dtype = DType::BF16;
      r.bytes = bytes_of(h);
    } else if (path == "wpe.weight") {
      r.dtype = DType::F64;
      r.bytes = bytes_of(std::vector<double>(v.begin(), v.end()));
    }
    raws.push_back(std::move(r));
  }
  // what transformers also stores, ignored: attention masks and a tied head
  raws.push_back(Raw{"transformer.h.0.attn.bias", DType::U8, {1, 1, 4, 4}, std::vector<unsigned char>(16, 1)});
  raws.push_back(Raw{"lm_head.weight", DType::F32, {48, 64}, std::vector<unsigned char>(48 * 64 * 4, 0)});
  write_all(file, raws);

  Tr b({.seed = 4});
  io::load_pretrained(b, file);
  require_same_weights(a, b);
  const auto tok = ids(24, 300), tgt = ids(24, 301);
  CHECK(b.evaluate(tok, tgt) == a.evaluate(tok, tgt));
}

TEST_CASE("hf: loading a base checkpoint into a QLoRA trainer quantizes it at load", "[io][hf]") {
  using Base = host::Trainer<Run<Llama>>;
  using Q = host::Trainer<Run<LlamaQLoRA>>;
  TempDir tmp;
  const fs::path file = tmp / "model.safetensors";
  const auto tok = ids(24, 400), tgt = ids(24, 401);
  Base a({.seed = 5, .lr = 1e-2});
  train(a, 2);
  const double base_loss = a.evaluate(tok, tgt);
  io::save_pretrained(a, file);

  Q q({.seed = 6});
  io::load_pretrained(q, file);
  // the same bytes as quantizing the base's values directly
  Q direct({.seed = 7});
  int quantized = 0;
  for (std::size_t k = 0; k < Q::param_count; ++k) {
    const ParamSlot& p = Q::param(k);
    const std::string path = Q::path_of(p);
    INFO(path);
    if (io::is_adapter_param(p.name)) continue;
    const ParamSlot& src = *Base::find(path);
    const std::vector<float> v = dense(a, src);
    if (p.quant.kind == QuantKind::none) {
      REQUIRE(mismatch_at(dense(q, p), v) == -1);
      std::copy(v.begin(), v.end(), direct.weight(p));
      continue;
    }
    ++quantized;
    direct.set_quantized(p, v);
    const auto qa = q.quant(p), qb = direct.quant(p);
    REQUIRE(std::memcmp(qa.codes, qb.codes, static_cast<std::size_t>(p.quant.code_bytes(p.elements()))) == 0);
    REQUIRE(std::memcmp(qa.scales, qb.scales, static_cast<std::size_t>(p.quant.scale_bytes(p.elements()))) == 0);
    const std::vector<float> d = dense(q, p);
    float absmax = 0, err = 0;
    for (std::size_t i = 0; i < v.size(); ++i) absmax = std::max(absmax, std::abs(v[i])), err = std::max(err, std::abs(d[i] - v[i]));
    CHECK(err > 0);
    CHECK(err <= 0.2f * absmax);  // NF4's largest gap between codes is < 0.34
  }
  CHECK(quantized == 4);  // q_proj and v_proj of two blocks
  // adapters are not part of a base checkpoint: B stays zero, so the model is its quantized base
  const double q_loss = q.evaluate(tok, tgt);
  CHECK(q_loss == direct.evaluate(tok, tgt));
  CHECK(q_loss != base_loss);
  CHECK(q_loss == Approx(base_loss).epsilon(0.02));

  // a quantized parameter is saved dense (dequantized), and reloads to the same model
  io::save_pretrained(q, tmp / "dequantized.safetensors");
  Base plain({.seed = 8});
  io::load_pretrained(plain, tmp / "dequantized.safetensors");
  CHECK(plain.evaluate(tok, tgt) == Approx(q_loss).epsilon(1e-6));
}

TEST_CASE("hf: bad files give errors that name the file, the tensor and the problem", "[io][hf]") {
  using Tr = host::Trainer<Run<Llama>>;
  TempDir tmp;
  const fs::path good = tmp / "good.safetensors", bad = tmp / "bad.safetensors";
  Tr a({.seed = 9});
  io::save_pretrained(a, good);
  Tr b({.seed = 10});
  const auto tok = ids(24, 500), tgt = ids(24, 501);
  const double before = b.evaluate(tok, tgt);
  const std::string q = "model.layers.0.self_attn.q_proj.weight";

  SECTION("truncated file") {
    fs::copy_file(good, bad);
    fs::resize_file(bad, fs::file_size(good) - 100);
    REQUIRE_THROWS_AS(io::load_pretrained(b, bad), io::format_error);
    REQUIRE_THROWS_WITH(io::load_pretrained(b, bad), Contains(bad.string()) && Contains("out of range"));
  }
  SECTION("corrupt header") {
    fs::copy_file(good, bad);
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("{\"model.emb", 11);
    f.write("!!!!", 4);
    f.close();
    REQUIRE_THROWS_WITH(io::load_pretrained(b, bad), Contains(bad.string()) && Contains("invalid JSON header"));
  }
  SECTION("header length beyond the file") {
    fs::copy_file(good, bad);
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    const unsigned char huge[8] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0};
    f.write(reinterpret_cast<const char*>(huge), 8);
    f.close();
    REQUIRE_THROWS_WITH(io::load_pretrained(b, bad), Contains("exceeds the file size"));
  }
  SECTION("a tensor with the wrong name is missing") {
    auto raws = read_all(good);
    named(raws, q).name = "model.layers.0.self_attn.query.weight";
    write_all(bad, raws);
    REQUIRE_THROWS_AS(io::load_pretrained(b, bad), io::format_error);
    REQUIRE_THROWS_WITH(io::load_pretrained(b, bad),
                        Contains(bad.string()) && Contains("tensor '" + q + "' not found") && Contains("layers.0.self_attn.q_proj.weight"));
  }
  SECTION("wrong shape") {
    auto raws = read_all(good);
    named(raws, "model.layers.1.mlp.up_proj.weight").shape = {64, 128};
    write_all(bad, raws);
    REQUIRE_THROWS_WITH(io::load_pretrained(b, bad), Contains("tensor 'model.layers.1.mlp.up_proj.weight'") &&
                                                         Contains("shape is [64, 128], expected [128, 64]"));
  }
  SECTION("wrong dtype") {
    auto raws = read_all(good);
    named(raws, "model.norm.weight").dtype = DType::I32;
    write_all(bad, raws);
    REQUIRE_THROWS_WITH(io::load_pretrained(b, bad), Contains("tensor 'model.norm.weight'") && Contains("dtype I32 is not supported"));
  }
  SECTION("a dtype headroom cannot hold") {
    auto raws = read_all(good);
    write_all(bad, raws);
    // rewrite the header's dtype in place: same length, so offsets stay valid
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    std::string head(4096, '\0');
    f.read(head.data(), 4096);
    const std::size_t at = head.find("\"model.norm.weight\":{\"dtype\":\"F32\"");
    REQUIRE(at != std::string::npos);
    f.clear();
    f.seekp(static_cast<std::streamoff>(at + std::string("\"model.norm.weight\":{\"dtype\":\"").size()));
    f.write("U32", 3);
    f.close();
    REQUIRE_THROWS_WITH(io::load_pretrained(b, bad), Contains("tensor 'model.norm.weight'") && Contains("unsupported dtype 'U32'"));
  }
  SECTION("GPT-2: a Conv1D weight stored (out, in) is refused with a hint") {
    using G = host::Trainer<Run<GPT2>>;
    G g({.seed = 11});
    io::save_pretrained(g, good.string() + ".gpt2.safetensors");
    auto raws = read_all(good.string() + ".gpt2.safetensors");
    named(raws, "h.0.attn.c_attn.weight").shape = {192, 64};
    write_all(bad, raws);
    REQUIRE_THROWS_WITH(io::load_pretrained(g, bad), Contains("tensor 'h.0.attn.c_attn.weight'") &&
                                                         Contains("shape is [192, 64], expected [64, 192]") && Contains("transposed"));
  }
  SECTION("a missing file") {
    REQUIRE_THROWS_WITH(io::load_pretrained(b, tmp / "nope.safetensors"), Contains("nope.safetensors") && Contains("cannot open"));
  }
  // nothing was written into the trainer
  CHECK(b.evaluate(tok, tgt) == before);
}
