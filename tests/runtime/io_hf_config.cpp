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
using Qwen3 = RunOf<models::qwen3_0_6b, 4096>;
using Mistral = RunOf<models::mistral_7b, 32768>;

// What check_hf_config<Run> says of `text` written as a config.json.
template <class Run>
std::string verdict(const std::string& text) {
  test::TempDir tmp;
  const fs::path file = tmp / "config.json";
  test::write_file(file, text);
  try {
    io::check_hf_config<Run>(file);
  } catch (const io::config_mismatch& e) {
    return e.what();
  }
  return "(no error)";
}
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

// The config.json files as published on the Hugging Face hub (Qwen/Qwen3-0.6B,
// mistralai/Mistral-7B-v0.1), key order and number spelling kept.
const char* const qwen3_0_6b_published = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936
})";
const char* const mistral_7b_published = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000
})";

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

TEST_CASE("config.json: Qwen3's (model_type qwen3) written and checked: head_dim apart from hidden / heads, q / k norms",
          "[io][hf][config]") {
  const std::string text = io::hf_config_json<Qwen3>(DType::BF16);
  const json::Value c = json::parse(text);
  CHECK(c.get("architectures")->items.at(0).string == "Qwen3ForCausalLM");
  CHECK(c.get("model_type")->string == "qwen3");
  CHECK(c.get("head_dim")->integer() == 128);
  CHECK(c.get("hidden_size")->integer() == 1024);
  CHECK(c.get("num_attention_heads")->integer() == 16);
  CHECK(c.get("attention_bias")->boolean == false);
  CHECK(c.get("use_sliding_window")->boolean == false);
  CHECK(verdict<Qwen3>(text) == "(no error)");
  CHECK(verdict<Qwen3>(qwen3_0_6b_published) == "(no error)");
  // head_dim absent: Qwen3Config's default, 128, is the preset's
  CHECK(verdict<Qwen3>(replaced(qwen3_0_6b_published, "\"head_dim\": 128, ", "")) == "(no error)");
  CHECK_THAT(verdict<Qwen3>(replaced(qwen3_0_6b_published, "\"head_dim\": 128", "\"head_dim\": 64")),
             Contains("head_dim is 64 in the file, 128 in the run type"));
  CHECK_THAT(verdict<Qwen3>(replaced(qwen3_0_6b_published, "\"attention_bias\": false", "\"attention_bias\": true")),
             Contains("attention_bias is true in the file, false in the run type"));
  // Qwen2.5 and Qwen3 are different networks (biases, q / k norms)
  CHECK_THAT(verdict<Qwen3>(io::hf_config_json<Qwen25>(DType::BF16)),
             Contains("model_type is \"qwen2\" in the file, \"qwen3\" in the run type"));
  CHECK_THAT(verdict<Qwen25>(qwen3_0_6b_published), Contains("model_type is \"qwen3\" in the file, \"qwen2\" in the run type"));
  // a Seq beyond the file's 40960 positions
  using Qwen3Long = RunOf<models::qwen3_0_6b, 40960>;
  CHECK_THAT(verdict<Qwen3Long>(replaced(qwen3_0_6b_published, "40960", "32768")),
             Contains("max_position_embeddings is 32768 in the file, fewer than the run type's Seq 40960"));
}

TEST_CASE("config.json: Mistral's (model_type mistral) written and checked: the sliding window", "[io][hf][config]") {
  const std::string text = io::hf_config_json<Mistral>(DType::BF16);
  const json::Value c = json::parse(text);
  CHECK(c.get("architectures")->items.at(0).string == "MistralForCausalLM");
  CHECK(c.get("model_type")->string == "mistral");
  CHECK(c.get("sliding_window")->integer() == 4096);
  CHECK(c.get("head_dim")->integer() == 128);
  CHECK(c.get("attention_bias") == nullptr);  // MistralConfig has no such field
  CHECK(verdict<Mistral>(text) == "(no error)");
  // the published file says rms_norm_eps 1e-05, as the preset does
  CHECK(verdict<Mistral>(mistral_7b_published) == "(no error)");
  // sliding_window absent: MistralConfig's default, 4096, is the preset's
  CHECK(verdict<Mistral>(replaced(mistral_7b_published, "\"sliding_window\": 4096, ", "")) == "(no error)");
  CHECK_THAT(verdict<Mistral>(replaced(mistral_7b_published, "\"sliding_window\": 4096", "\"sliding_window\": null")),
             Contains("sliding_window is null in the file, 4096 in the run type"));
  CHECK_THAT(verdict<Mistral>(replaced(mistral_7b_published, "\"sliding_window\": 4096", "\"sliding_window\": 2048")),
             Contains("sliding_window is 2048 in the file, 4096 in the run type"));
  // a Mistral file for a Llama run type: another model type, and a window Llama has not
  const std::string as_llama = verdict<Llama32>(mistral_7b_published);
  CHECK_THAT(as_llama, Contains("model_type is \"mistral\" in the file, \"llama\" in the run type") &&
                           Contains("sliding_window is 4096 in the file; the run type's attention has no sliding window"));
}
