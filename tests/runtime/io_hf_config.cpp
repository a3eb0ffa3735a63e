// config.json of the Llama 3.1 / 3.2 presets (io/hf_config.hpp): RoPE
// scaling written as meta-llama's published config.json writes it, and every
// difference in it refused, field by field. The figures are the published
// files' (meta-llama/Llama-3.1-8B, meta-llama/Llama-3.2-1B).
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"

#include <headroom/headroom.hpp>
#include <headroom/io/hf_config.hpp>

#include <filesystem>
#include <fstream>
#include <string>

using namespace headroom;
using Catch::Contains;

namespace {
namespace json = headroom::io::detail::json;
namespace fs = std::filesystem;

// What check_hf_config needs of a trainer: its run type.
template <models::LlamaConfig C, std::int64_t S>
struct RunOf {
  using run = Train<models::Llama<C>, Batch<1>, Seq<S>>;
};
using Llama31 = RunOf<models::llama3_1_8b, 131072>;
using Llama32 = RunOf<models::llama3_2_1b, 4096>;
using Qwen25 = RunOf<models::qwen2_5_0_5b, 4096>;

std::string refusal(const fs::path& file) {
  try {
    io::check_hf_config<Llama31>(file);
  } catch (const io::config_mismatch& e) {
    return e.what();
  }
  return "(no error)";
}

// Llama-3.1-8B's config.json with its rope_scaling replaced by `scaling` (JSON text).
std::string with_scaling(const std::string& scaling) {
  std::string text = io::hf_config_json<Llama31>(DType::BF16);
  const std::size_t at = text.find("\"rope_scaling\": ") + 16;
  const std::size_t end = text.find('\n', at);
  return text.replace(at, end - at - 1, scaling);
}

}  // namespace

TEST_CASE("config.json: Llama 3.1's rope_scaling written as the published file writes it", "[io][hf][config]") {
  const json::Value c = json::parse(io::hf_config_json<Llama31>(DType::BF16));
  const json::Value* s = c.get("rope_scaling");
  REQUIRE(s != nullptr);
  REQUIRE(s->kind == json::Value::Kind::Object);
  CHECK(s->get("rope_type")->string == "llama3");
  CHECK(s->get("factor")->number == 8.0);
  CHECK(s->get("low_freq_factor")->number == 1.0);
  CHECK(s->get("high_freq_factor")->number == 4.0);
  CHECK(s->get("original_max_position_embeddings")->integer() == 8192);
  CHECK(c.get("max_position_embeddings")->integer() == 131072);
  CHECK(c.get("rope_theta")->number == 500000.0);
  const json::Value c32 = json::parse(io::hf_config_json<Llama32>(DType::BF16));
  CHECK(c32.get("rope_scaling")->get("factor")->number == 32.0);
  CHECK(c32.get("tie_word_embeddings")->boolean == true);
}

TEST_CASE("config.json: a rope_scaling that differs from the run type's is refused, naming the field",
          "[io][hf][config][errors]") {
  test::TempDir tmp;
  const fs::path file = tmp / "config.json";
  // Llama-3.1-8B's published rope_scaling, key order and all
  test::write_file(file, with_scaling(R"({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, )"
                                      R"("original_max_position_embeddings": 8192, "rope_type": "llama3"})"));
  CHECK(refusal(file) == "(no error)");
  test::write_file(file, with_scaling(R"({"factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, )"
                                      R"("original_max_position_embeddings": 8192, "rope_type": "llama3"})"));
  CHECK_THAT(refusal(file), Contains("rope_scaling.factor is 16.0 in the file, 8.0 in the run type"));
  test::write_file(file, with_scaling(R"({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, )"
                                      R"("original_max_position_embeddings": 4096, "type": "llama3"})"));
  CHECK_THAT(refusal(file), Contains("rope_scaling.original_max_position_embeddings is 4096 in the file, 8192"));
  test::write_file(file, with_scaling(R"({"factor": 8.0, "rope_type": "yarn"})"));
  const std::string m = refusal(file);
  CHECK_THAT(m, Contains("rope_scaling.rope_type is \"yarn\" in the file, \"llama3\" in the run type") &&
                    Contains("rope_scaling.low_freq_factor is missing"));
  test::write_file(file, with_scaling("null"));
  CHECK_THAT(refusal(file), Contains("rope_scaling is null in the file") && Contains("\"rope_type\": \"llama3\"}"));
}

TEST_CASE("config.json: Qwen2.5's (model_type qwen2) written and checked: biases, rms_norm_eps 1e-6, no sliding window",
          "[io][hf][config]") {
  const std::string text = io::hf_config_json<Qwen25>(DType::BF16);
  const json::Value c = json::parse(text);
  CHECK(c.get("architectures")->items.at(0).string == "Qwen2ForCausalLM");
  CHECK(c.get("model_type")->string == "qwen2");
  CHECK(c.get("rms_norm_eps")->number == 1e-6);
  CHECK(c.get("rope_theta")->number == 1000000.0);
  CHECK(c.get("use_sliding_window")->boolean == false);
  CHECK(c.get("tie_word_embeddings")->boolean == true);
  CHECK(c.get("attention_bias") == nullptr);  // Qwen2Config has no such field
  test::TempDir tmp;
  const fs::path file = tmp / "config.json";
  test::write_file(file, text);
  const auto check = [&] {
    try {
      io::check_hf_config<Qwen25>(file);
    } catch (const io::config_mismatch& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(check() == "(no error)");
  std::string edited = text;
  const auto swap = [&](const std::string& from, const std::string& to) { edited.replace(edited.find(from), from.size(), to); };
  swap("\"use_sliding_window\": false", "\"use_sliding_window\": true");
  swap("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e-05");
  test::write_file(file, edited);
  CHECK_THAT(check(), Contains("use_sliding_window is true in the file, false in the run type") &&
                          Contains("rms_norm_eps is 1e-05 in the file, 1e-06 in the run type"));
  // a Llama preset against a Qwen2 file: the model type differs
  test::write_file(file, text);
  try {
    io::check_hf_config<Llama32>(file);
    FAIL("a Qwen2 config.json was accepted for a Llama");
  } catch (const io::config_mismatch& e) {
    CHECK_THAT(std::string(e.what()), Contains("model_type is \"qwen2\" in the file, \"llama\" in the run type"));
  }
}
