// Hugging Face model directories (io/hf_names.hpp, io/hf_config.hpp,
// io/safetensors_shards.hpp): save_pretrained into a directory and
// load_pretrained from it, bit for bit, as one model.safetensors and as
// shards with their index; config.json written with transformers' fields
// and checked against the run type field by field; every kind of bad
// directory refused with the file named and the trainer untouched; the
// chunked reader against the whole-tensor one.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"
#include "support/hf_files.hpp"

#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/io/peft.hpp>
#include <headroom/train/host/trainer.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace headroom;
using Catch::Contains;

namespace {
using headroom::test::TempDir;
using headroom::test::ids;
using headroom::test::write_file;
using namespace headroom::test::hf_files;
namespace fs = std::filesystem;
namespace json = headroom::io::detail::json;

constexpr models::LlamaConfig llama_dir{48, 64, 128, 2, 4, 2, 64, false, 500000};
constexpr models::GPT2Config gpt2_dir{48, 64, 2, 4, 32};
template <class M, class... Opts>
using Run = Train<M, Batch<2>, Seq<12>, Opts...>;
using Llama = models::Llama<llama_dir>;
using GPT2 = models::GPT2<gpt2_dir>;
using LlamaTr = host::Trainer<Run<Llama>>;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every file of a directory, by name.
std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// The bytes of every tensor of a trainer, as save_pretrained writes them (F32).
template <class Tr>
std::int64_t f32_bytes() {
  std::int64_t n = 0;
  for (std::size_t k = 0; k < Tr::param_count; ++k)
    if (!io::is_adapter_param(Tr::param(k).name)) n += Tr::param(k).elements() * 4;
  return n;
}

// config.json with one field's value replaced by `value` (its JSON text), or removed (value empty).
void edit_config(const fs::path& file, const std::string& field, const std::string& value) {
  const std::string text = read_text(file);
  const json::Value root = json::parse(text);
  std::string out = "{";
  bool seen = false, first = true;
  for (std::size_t i = 0; i < root.keys.size(); ++i) {
    const bool hit = root.keys[i] == field;
    seen = seen || hit;
    if (hit && value.empty()) continue;
    out += (first ? "\n  " : ",\n  ") + io::detail::json::quote(root.keys[i]) + ": " +
           (hit ? value : text.substr(root.items[i].begin, root.items[i].end - root.items[i].begin));
    first = false;
  }
  if (!seen && !value.empty()) out += ",\n  " + io::detail::json::quote(field) + ": " + value;
  write_file(file, out + "\n}\n");
}

// The message load_pretrained throws for `dir`, and whether it left the trainer as it was.
template <class Tr>
std::string refusal(Tr& t, const fs::path& dir) {
  const std::vector<std::int32_t> tok = ids(24, 3), tgt = ids(24, 4);
  const double before = t.evaluate(tok, tgt);
  std::string msg = "(no error)";
  try {
    io::load_pretrained(t, dir);
  } catch (const io::format_error& e) {
    msg = e.what();
  }
  CHECK(t.evaluate(tok, tgt) == before);
  return msg;
}

}  // namespace

TEST_CASE("model directory: one model.safetensors and config.json, loaded back bit for bit", "[io][hf][model_dir]") {
  TempDir tmp;
  LlamaTr a({.seed = 3, .lr = 1e-2});
  a.step(ids(24, 1), ids(24, 2));
  io::save_pretrained(a, tmp / "llama");
  CHECK(listing(tmp / "llama") == std::set<std::string>{"config.json", "model.safetensors"});
  // config.json: what transformers' LlamaConfig reads, from the preset's numbers
  const json::Value c = json::parse(read_text(tmp / "llama" / "config.json"));
  CHECK(c.get("architectures")->items.at(0).string == "LlamaForCausalLM");
  CHECK(c.get("model_type")->string == "llama");
  CHECK(c.get("vocab_size")->integer() == 48);
  CHECK(c.get("hidden_size")->integer() == 64);
  CHECK(c.get("intermediate_size")->integer() == 128);
  CHECK(c.get("num_hidden_layers")->integer() == 2);
  CHECK(c.get("num_attention_heads")->integer() == 4);
  CHECK(c.get("num_key_value_heads")->integer() == 2);
  CHECK(c.get("head_dim")->integer() == 16);
  CHECK(c.get("max_position_embeddings")->integer() == 64);
  CHECK(c.get("rms_norm_eps")->number == 1e-5);
  CHECK(c.get("rope_theta")->number == 500000.0);
  CHECK(c.get("rope_scaling")->kind == json::Value::Kind::Null);
  CHECK(c.get("tie_word_embeddings")->boolean == false);
  CHECK(c.get("hidden_act")->string == "silu");
  CHECK(c.get("torch_dtype")->string == "float32");
  const io::SafetensorsFile f(tmp / "llama" / "model.safetensors");
  CHECK(f.tensors().size() == 2 + 2 * 9 + 1);  // embed, norm, lm_head; 9 per block
  LlamaTr b({.seed = 99});
  io::load_pretrained(b, tmp / "llama");
  require_same_weights(a, b);
  CHECK(b.evaluate(ids(24, 5), ids(24, 6)) == a.evaluate(ids(24, 5), ids(24, 6)));
}

TEST_CASE("model directory: shards of at most max_shard_size with their index, loaded back bit for bit", "[io][hf][model_dir]") {
  TempDir tmp;
  LlamaTr a({.seed = 4, .lr = 1e-2});
  a.step(ids(24, 1), ids(24, 2));
  const fs::path dir = tmp / "llama";
  io::save_pretrained(a, dir);  // one file first: the sharded save replaces it
  // the largest tensors are the (128, 64) MLP matrices: 32,768 bytes each
  const std::uint64_t bound = 40'000;
  io::save_pretrained(a, dir, {.max_shard_size = bound});
  const std::set<std::string> files = listing(dir);
  CHECK(files.count("model.safetensors") == 0);  // a loader would read it instead of the index
  REQUIRE(files.count("model.safetensors.index.json") == 1);
  const json::Value index = json::parse(read_text(dir / "model.safetensors.index.json"));
  const json::Value& map = *index.get("weight_map");
  // every tensor once, each in a shard that exists and holds it; the shards' data within the bound
  std::int64_t total = 0;
  std::map<std::string, std::uint64_t> shard_bytes;
  for (std::size_t i = 0; i < map.keys.size(); ++i) {
    INFO(map.keys[i]);
    REQUIRE(files.count(map.items[i].string) == 1);
    const io::SafetensorsFile shard(dir / map.items[i].string);
    const io::TensorInfo* t = shard.find(map.keys[i]);
    REQUIRE(t != nullptr);
    total += static_cast<std::int64_t>(t->end - t->begin);
    shard_bytes[map.items[i].string] += t->end - t->begin;
  }
  CHECK(map.keys.size() == 21);
  CHECK(index.get("metadata")->get("total_size")->integer() == f32_bytes<LlamaTr>());
  CHECK(total == f32_bytes<LlamaTr>());
  const std::size_t n = shard_bytes.size();
  CHECK(n >= static_cast<std::size_t>((f32_bytes<LlamaTr>() + bound - 1) / bound));
  for (const auto& [name, bytes] : shard_bytes) {
    INFO(name);
    CHECK(bytes <= bound);
    CHECK(name.size() == std::string("model-00001-of-00009.safetensors").size());
    CHECK(name.substr(0, 6) == "model-");
    CHECK(name.substr(11) == "-of-" + std::string(5 - std::to_string(n).size(), '0') + std::to_string(n) + ".safetensors");
  }
  CHECK(files.size() == n + 2);  // the shards, the index, config.json
  // and read back, each shard once
  LlamaTr b({.seed = 98});
  io::load_pretrained(b, dir);
  require_same_weights(a, b);
  // saved again as one file: the index and its shards go, the file stays alone
  io::save_pretrained(a, dir);
  CHECK(listing(dir) == std::set<std::string>{"config.json", "model.safetensors"});
  LlamaTr c({.seed = 97});
  io::load_pretrained(c, dir);
  require_same_weights(a, c);
}

TEST_CASE("model directory: GPT-2 (Conv1D transposed, tied head) and a merged LoRA model", "[io][hf][model_dir]") {
  TempDir tmp;
  using G = host::Trainer<Run<GPT2>>;
  G a({.seed = 5, .lr = 1e-2});
  a.step(ids(24, 1), ids(24, 2));
  io::save_pretrained(a, tmp / "gpt2", {.max_shard_size = 20'000});
  const json::Value c = json::parse(read_text(tmp / "gpt2" / "config.json"));
  CHECK(c.get("architectures")->items.at(0).string == "GPT2LMHeadModel");
  CHECK(c.get("model_type")->string == "gpt2");
  CHECK(c.get("n_embd")->integer() == 64);
  CHECK(c.get("n_layer")->integer() == 2);
  CHECK(c.get("n_head")->integer() == 4);
  CHECK(c.get("n_positions")->integer() == 32);
  CHECK(c.get("layer_norm_epsilon")->number == 1e-5);
  CHECK(c.get("activation_function")->string == "gelu_new");
  G b({.seed = 6});
  io::load_pretrained(b, tmp / "gpt2");
  require_same_weights(a, b);
  // a LoRA run's merged model is a dense directory the run without LoRA loads
  using L = host::Trainer<Run<models::Llama<llama_dir, Apply<LoRA<4>, On<q_proj, v_proj>>>>>;
  L l({.seed = 7, .lr = 1e-2});
  for (int s = 0; s < 2; ++s) l.step(ids(24, 10 + s), ids(24, 20 + s));
  io::save_merged(l, tmp / "merged", {.max_shard_size = 30'000});
  CHECK(listing(tmp / "merged").count("model.safetensors.index.json") == 1);
  LlamaTr m({.seed = 8});
  io::load_pretrained(m, tmp / "merged");
  CHECK(std::abs(m.evaluate(ids(24, 3), ids(24, 4)) - l.evaluate(ids(24, 3), ids(24, 4))) < 1e-5);
}

TEST_CASE("model directory: config.json is checked field by field before any weight is read", "[io][hf][model_dir][errors]") {
  TempDir tmp;
  LlamaTr a({.seed = 3});
  const fs::path good = tmp / "good";
  io::save_pretrained(a, good);
  LlamaTr b({.seed = 4});
  auto with = [&](const std::string& field, const std::string& value) {
    const fs::path dir = tmp / ("edit_" + field);
    fs::create_directories(dir);
    fs::copy_file(good / "model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
    fs::copy_file(good / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
    edit_config(dir / "config.json", field, value);
    return refusal(b, dir);
  };
  std::string m = with("hidden_size", "2048");
  CHECK_THAT(m, Contains("config.json") && Contains("hidden_size is 2048 in the file, 64 in the run type") &&
                    Contains("nothing was loaded"));
  m = with("num_key_value_heads", "4");
  CHECK_THAT(m, Contains("num_key_value_heads is 4 in the file, 2 in the run type"));
  m = with("num_key_value_heads", "");  // absent: transformers' default is the heads (4)
  CHECK_THAT(m, Contains("num_key_value_heads is absent from the file, so transformers' default applies"));
  m = with("rms_norm_eps", "1e-06");
  CHECK_THAT(m, Contains("rms_norm_eps is 1e-06 in the file, 1e-05 in the run type"));
  m = with("rope_theta", "10000.0");
  CHECK_THAT(m, Contains("rope_theta is 10000.0 in the file, 500000.0 in the run type"));
  m = with("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})");
  CHECK_THAT(m, Contains("rope_scaling is {\"rope_type\": \"llama3\", \"factor\": 8.0} in the file") && Contains("unscaled"));
  m = with("sliding_window", "4096");
  CHECK_THAT(m, Contains("sliding_window is 4096 in the file") && Contains("no sliding window"));
  m = with("tie_word_embeddings", "true");
  CHECK_THAT(m, Contains("tie_word_embeddings is true in the file, false in the run type"));
  m = with("attention_bias", "true");
  CHECK_THAT(m, Contains("attention_bias is true in the file, false in the run type"));
  m = with("model_type", "\"qwen2\"");
  CHECK_THAT(m, Contains("model_type is \"qwen2\" in the file, \"llama\" in the run type"));
  m = with("max_position_embeddings", "8");
  CHECK_THAT(m, Contains("max_position_embeddings is 8 in the file, fewer than the run type's Seq 12"));
  m = with("vocab_size", "");
  CHECK_THAT(m, Contains("vocab_size is missing from the file (the run type has 48)"));
  // several at once: one error naming each
  edit_config(tmp / "edit_vocab_size" / "config.json", "num_hidden_layers", "32");
  m = refusal(b, tmp / "edit_vocab_size");
  CHECK_THAT(m, Contains("vocab_size is missing") && Contains("and 1 more: num_hidden_layers is 32 in the file, 2 in the run type"));
  // what keeps the file from being read
  const fs::path dir = tmp / "edit_hidden_size";
  write_file(dir / "config.json", "{\"model_type\": \"llama\",");
  CHECK_THAT(refusal(b, dir), Contains("config.json") && Contains("is not JSON"));
  write_file(dir / "config.json", "[1, 2]");
  CHECK_THAT(refusal(b, dir), Contains("is not a JSON object"));
  fs::remove(dir / "config.json");
  CHECK_THAT(refusal(b, dir), Contains("config.json") && Contains("is missing"));
  // and GPT-2's own fields
  using G = host::Trainer<Run<GPT2>>;
  G g({.seed = 1});
  io::save_pretrained(g, tmp / "gpt2");
  edit_config(tmp / "gpt2" / "config.json", "n_positions", "1024");
  CHECK_THAT(refusal(g, tmp / "gpt2"), Contains("n_positions is 1024 in the file, 32 in the run type"));
  edit_config(tmp / "gpt2" / "config.json", "n_positions", "32");
  edit_config(tmp / "gpt2" / "config.json", "activation_function", "\"gelu\"");
  CHECK_THAT(refusal(g, tmp / "gpt2"), Contains("activation_function is \"gelu\" in the file, \"gelu_new\" in the run type"));
}

TEST_CASE("model directory: an index and shards that disagree are refused, naming the file", "[io][hf][model_dir][errors]") {
  TempDir tmp;
  LlamaTr a({.seed = 3});
  const fs::path good = tmp / "good";
  io::save_pretrained(a, good, {.max_shard_size = 40'000});
  const std::string index_text = read_text(good / "model.safetensors.index.json");
  const json::Value index = json::parse(index_text);
  const json::Value& map = *index.get("weight_map");
  const std::string first_shard = map.get("model.embed_tokens.weight")->string;
  const std::string norm_shard = map.get("model.norm.weight")->string;
  REQUIRE(first_shard != norm_shard);
  LlamaTr b({.seed = 4});
  auto copy = [&](const std::string& name) {
    const fs::path dir = tmp / name;
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(good)) fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
    return dir;
  };
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    const auto at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  SECTION("an index naming a shard that is not there") {
    const fs::path dir = copy("missing");
    fs::remove(dir / norm_shard);
    CHECK_THAT(refusal(b, dir), Contains("model.safetensors.index.json") && Contains("names shard " + norm_shard) &&
                                    Contains("which is not in"));
  }
  SECTION("a shard outside the directory") {
    const fs::path dir = copy("outside");
    write_file(dir / "model.safetensors.index.json",
               replace(index_text, "\"model.norm.weight\": \"" + norm_shard + "\"", "\"model.norm.weight\": \"../good/" + norm_shard + "\""));
    CHECK_THAT(refusal(b, dir), Contains("not a file name inside the directory"));
  }
  SECTION("a tensor in two shards") {
    const fs::path dir = copy("twice");
    std::vector<Raw> raws = read_all(dir / first_shard);
    raws.push_back(read_all(good / norm_shard).front());  // a tensor of another shard, here too
    const std::string extra = raws.back().name;
    fs::remove(dir / first_shard);
    write_all(dir / first_shard, raws);
    CHECK_THAT(refusal(b, dir), Contains(first_shard) && Contains("holds tensor \"" + extra + "\"") && Contains("two shards"));
  }
  SECTION("a shard holding a tensor the index does not list") {
    const fs::path dir = copy("unlisted");
    std::vector<Raw> raws = read_all(dir / first_shard);
    raws.push_back(raws.front());
    raws.back().name = "model.extra.weight";
    fs::remove(dir / first_shard);
    write_all(dir / first_shard, raws);
    CHECK_THAT(refusal(b, dir), Contains(first_shard) && Contains("holds tensor \"model.extra.weight\", which") &&
                                    Contains("does not list"));
  }
  SECTION("an index placing a tensor in a shard that lacks it") {
    const fs::path dir = copy("lacking");
    write_file(dir / "model.safetensors.index.json",
               replace(index_text, "\"model.norm.weight\": \"" + norm_shard + "\"", "\"model.norm.weight\": \"" + first_shard + "\""));
    CHECK_THAT(refusal(b, dir), Contains("model.safetensors.index.json") &&
                                    Contains("places tensor \"model.norm.weight\" in " + first_shard + ", which does not hold it"));
  }
  SECTION("an index that is not one") {
    const fs::path dir = copy("notindex");
    write_file(dir / "model.safetensors.index.json", "{\"metadata\": {}}");
    CHECK_THAT(refusal(b, dir), Contains("model.safetensors.index.json") && Contains("no \"weight_map\" object"));
    write_file(dir / "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"x.safetensors\", \"a\": \"y.safetensors\"}}");
    CHECK_THAT(refusal(b, dir), Contains("not a weight index") && Contains("duplicate key"));
  }
  SECTION("no weights at all") {
    const fs::path dir = tmp / "empty";
    fs::create_directories(dir);
    fs::copy_file(good / "config.json", dir / "config.json");
    CHECK_THAT(refusal(b, dir), Contains("neither model.safetensors nor model.safetensors.index.json"));
  }
  SECTION("a tensor of the wrong shape names its shard") {
    const fs::path dir = copy("shape");
    std::vector<Raw> raws = read_all(dir / norm_shard);
    named(raws, "model.norm.weight").shape = {8, 8};
    fs::remove(dir / norm_shard);
    write_all(dir / norm_shard, raws);
    CHECK_THAT(refusal(b, dir), Contains("tensor 'model.norm.weight' (in " + norm_shard + "): shape is [8, 8], expected [64]"));
  }
}

TEST_CASE("model directory: a save writes only into a new or empty directory or over a model", "[io][hf][model_dir][durable]") {
  TempDir tmp;
  LlamaTr a({.seed = 3});
  const fs::path dir = tmp / "notes";
  fs::create_directories(dir);
  write_file(dir / "notes.txt", "mine");
  REQUIRE_THROWS_AS(io::save_pretrained(a, dir), io::overwrite_refused);
  CHECK(listing(dir) == std::set<std::string>{"notes.txt"});
  // a file of another kind where a weight file goes: nothing is written
  const fs::path model = tmp / "model";
  io::save_pretrained(a, model);
  write_file(model / "model.safetensors.index.json", "not an index");
  REQUIRE_THROWS_WITH(io::save_pretrained(a, model, {.max_shard_size = 40'000}), Contains("is not a safetensors weight index"));
  CHECK(listing(model) == std::set<std::string>{"config.json", "model.safetensors", "model.safetensors.index.json"});
  write_file(model / "config.json", "not a config");
  fs::remove(model / "model.safetensors.index.json");
  REQUIRE_THROWS_WITH(io::save_pretrained(a, model), Contains("holds no model (no model's config.json)"));
  CHECK(read_text(model / "config.json") == "not a config");
  // a checkpoint holds a model.safetensors of its own: not a model directory
  const fs::path ckpt = tmp / "ckpt";
  io::save_checkpoint(a, ckpt);
  REQUIRE_THROWS_AS(io::save_pretrained(a, ckpt), io::overwrite_refused);
}

TEST_CASE("model directory: the chunked reader converts as the whole-tensor reader does", "[io][hf][model_dir]") {
  TempDir tmp;
  // F16 and BF16 values of every finite exponent, and an F32 tensor, read through a 6-byte staging buffer
  std::vector<std::uint16_t> h(1000), bf(1001);
  for (std::size_t i = 0; i < h.size(); ++i) {  // finite: the largest exponent (inf, NaN) lowered by one
    h[i] = static_cast<std::uint16_t>((i * 65.537));
    if ((h[i] & 0x7C00u) == 0x7C00u) h[i] ^= 0x0400u;
  }
  for (std::size_t i = 0; i < bf.size(); ++i) {
    bf[i] = static_cast<std::uint16_t>((i * 65.471));
    if ((bf[i] & 0x7F80u) == 0x7F80u) bf[i] ^= 0x0080u;
  }
  std::vector<float> f(37);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = 0.25f * static_cast<float>(i) - 3;
  io::write_safetensors(tmp / "x.safetensors", {{"h", DType::F16, {1000}, h.data()},
                                                {"bf", DType::BF16, {7, 143}, bf.data()},
                                                {"f", DType::F32, {37}, f.data()}});
  const io::SafetensorsFile file(tmp / "x.safetensors");
  io::TensorStream in(file, 6);
  for (const char* name : {"bf", "h", "f"}) {
    const io::TensorInfo& t = *file.find(name);
    const std::size_t n = static_cast<std::size_t>((t.end - t.begin) / headroom::size_of(t.dtype));
    std::vector<float> whole(n), chunked(n);
    std::vector<double> whole64(n), chunked64(n);
    io::read_converted<float>(file, t, std::span<float>(whole));
    io::read_converted<double>(file, t, std::span<double>(whole64));
    in.read<float>(t, std::span<float>(chunked));
    in.read<double>(t, std::span<double>(chunked64));
    INFO(name);
    CHECK(std::memcmp(whole.data(), chunked.data(), n * 4) == 0);
    CHECK(std::memcmp(whole64.data(), chunked64.data(), n * 8) == 0);
  }
}

TEST_CASE("model directory: a weight that is not finite stops the load, naming the tensor and the element", "[io][hf][errors]") {
  TempDir tmp;
  LlamaTr a({.seed = 3});
  io::save_pretrained(a, tmp / "model.safetensors");
  std::vector<Raw> raws = read_all(tmp / "model.safetensors");
  Raw& norm = named(raws, "model.norm.weight");
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(norm.bytes.data() + 4 * 17, &inf, 4);
  fs::remove(tmp / "model.safetensors");
  write_all(tmp / "model.safetensors", raws);
  LlamaTr b({.seed = 4});
  REQUIRE_THROWS_WITH(io::load_pretrained(b, tmp / "model.safetensors"),
                      Contains("tensor 'model.norm.weight': element 17 of [64] is infinite; a weight must be finite"));
  // and in bf16, through the staging buffer
  Raw& q = named(raws, "model.layers.1.self_attn.q_proj.weight");
  std::vector<unsigned char> half(q.bytes.size() / 2);
  for (std::size_t k = 0; k < half.size() / 2; ++k) half[2 * k] = q.bytes[4 * k + 2], half[2 * k + 1] = q.bytes[4 * k + 3];
  half[2 * 1000 + 1] = 0x7F, half[2 * 1000] = 0xC1;  // element 1000: a NaN
  q.bytes = half;
  q.dtype = DType::BF16;
  std::memcpy(norm.bytes.data() + 4 * 17, &raws.front().bytes[0], 4);  // the norm finite again
  fs::remove(tmp / "model.safetensors");
  write_all(tmp / "model.safetensors", raws);
  REQUIRE_THROWS_WITH(io::load_pretrained(b, tmp / "model.safetensors"),
                      Contains("tensor 'model.layers.1.self_attn.q_proj.weight': element 1000 of [64, 64] is NaN"));
}

TEST_CASE("model directory: a save leaves files and links named <file>.tmp alone", "[io][hf][model_dir][durable]") {
  TempDir tmp;
  LlamaTr a({.seed = 3});
  const fs::path dir = tmp / "llama";
  io::save_pretrained(a, dir);
  write_file(dir / "config.json.tmp", "my draft");
  write_file(tmp / "precious.bin", "do not lose me");
  fs::create_symlink(tmp / "precious.bin", dir / "model.safetensors.tmp");
  fs::create_symlink(tmp / "precious.bin", dir / "model.safetensors.index.json.tmp");
  io::save_pretrained(a, dir);
  io::save_pretrained(a, dir, {.max_shard_size = 40'000});  // shards and their index over the one file
  io::save_pretrained(a, dir);                              // and the one file again
  CHECK(listing(dir) == std::set<std::string>{"config.json", "config.json.tmp", "model.safetensors", "model.safetensors.index.json.tmp",
                                              "model.safetensors.tmp"});
  CHECK(read_text(dir / "config.json.tmp") == "my draft");
  CHECK(read_text(tmp / "precious.bin") == "do not lose me");
  CHECK(fs::read_symlink(dir / "model.safetensors.tmp") == tmp / "precious.bin");
  LlamaTr b({.seed = 99});
  io::load_pretrained(b, dir);
  require_same_weights(a, b);
}
