#pragma once
// config.json of a Hugging Face model directory, for the model of a trainer
// type: written by save_pretrained into a directory, and checked by
// load_pretrained before it reads any weight. Host only; not in the umbrella
// header.
//
// What is checked. Every field that changes a shape or the math, against the
// run type, with transformers' default where the file may omit the field:
//
//   Llama (model_type "llama", LlamaForCausalLM; "qwen2", Qwen2ForCausalLM;
//   "qwen3", Qwen3ForCausalLM; "mistral", MistralForCausalLM; as
//   LlamaConfig::arch says)
//     vocab_size, hidden_size, intermediate_size, num_hidden_layers,
//     num_attention_heads, num_key_value_heads (default: the heads),
//     head_dim (default: hidden / heads; Qwen3 128), rms_norm_eps (default 1e-6),
//     rope_theta (default 10000), tie_word_embeddings (default false),
//     hidden_act ("silu"), attention_bias and mlp_bias (Llama: default false;
//     Qwen3: attention_bias only; Qwen2 and Mistral have neither field, Qwen2's
//     q, k, v always have a bias, Mistral's never), use_sliding_window
//     (Qwen2, Qwen3: absent or false), sliding_window (Llama: absent or null;
//     Mistral: the LlamaConfig's window or null, default 4096),
//     rope_scaling (absent or null, or Llama 3.1's {"rope_type": "llama3",
//     factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}
//     equal to the LlamaConfig's), max_position_embeddings (default 2048;
//     Qwen 32768; Mistral 131072) at least Seq. Qwen3's q_norm / k_norm are
//     implied by its model_type (LlamaConfig::qk_norm).
//   GPT-2 (model_type "gpt2", GPT2LMHeadModel)
//     vocab_size, n_embd, n_layer, n_head, n_positions (the position
//     table's rows), n_inner (null or 4 n_embd), layer_norm_epsilon (1e-5),
//     activation_function ("gelu_new"), tie_word_embeddings (true).
//
// A model of another kind (a stack written by hand) has no config.json: a
// directory is read without one.
//
// Every mismatch is listed in one config_mismatch naming the file, the
// field, the file's value (as the file writes it) and the type's value:
//
//   config.json: model/config.json does not describe this run's model:
//   hidden_size is 2048 in the file, 4096 in the run type (and 1 more:
//   intermediate_size is 8192 in the file, 14336 in the run type)
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../math/norms.hpp"
#include "../models/gpt2.hpp"
#include "../models/llama.hpp"
#include "safetensors.hpp"

namespace headroom::io {

// config.json does not describe the run type's model, or cannot be read: the
// message names the file and every field that differs. Nothing was loaded.
struct config_mismatch : format_error {
  using format_error::format_error;
};

inline constexpr const char* hf_config_file = "config.json";

namespace detail::hf_config {

namespace json = io::detail::json;
using Kind = json::Value::Kind;

// The model type of a trainer, a consolidated view or a pipeline stage.
template <class Trainer>
using model_of = typename Trainer::run::model;

template <class M>
concept LlamaModel = M::kind == std::string_view("Llama") && std::is_same_v<std::remove_cv_t<decltype(M::config)>, models::LlamaConfig>;
template <class M>
concept GPT2Model = M::kind == std::string_view("GPT2") && std::is_same_v<std::remove_cv_t<decltype(M::config)>, models::GPT2Config>;

// Whether the model has a config.json (a preset of a Hugging Face family).
template <class M>
inline constexpr bool has_config = LlamaModel<M> || GPT2Model<M>;

// torch_dtype's name for a stored dtype.
inline std::string_view torch_dtype(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F64: return "float64";
    default: return "float32";
  }
}

// A number as Python's json writes a float: 500000.0, 1e-05.
inline std::string python_float(double x) { return json::number(x, json::Spelling::python_float); }

// The file's fields, one check each; problems collects the differences.
class Checker {
 public:
  Checker(const json::Value& root, std::string_view text, std::string prefix = "")
      : root_(root), text_(text), prefix_(std::move(prefix)) {}

  void integer(std::string_view field, std::int64_t want, std::optional<std::int64_t> if_absent = std::nullopt) {
    const json::Value* v = present(field);
    if (!v) return absent(field, std::to_string(want), if_absent ? std::optional<bool>(*if_absent == want) : std::nullopt);
    const auto got = v->integer();
    if (!got || *got != want) differ(field, *v, std::to_string(want));
  }
  // An integer the file must give at least `want` of (positions against Seq).
  void at_least(std::string_view field, std::int64_t want, std::int64_t if_absent, std::string_view what) {
    const json::Value* v = present(field);
    const std::optional<std::int64_t> got = v ? v->integer() : std::optional<std::int64_t>(if_absent);
    if (!got || *got < want)
      problems.push_back(name(field) + " is " + (v ? shown(*v) : std::to_string(if_absent) + " (absent: transformers' default)") +
                         " in the file, fewer than the run type's " + std::string(what) + " " + std::to_string(want));
  }
  void number(std::string_view field, double want, std::optional<double> if_absent = std::nullopt) {
    const json::Value* v = present(field);
    if (!v) return absent(field, python_float(want), if_absent ? std::optional<bool>(*if_absent == want) : std::nullopt);
    if (v->kind != Kind::Number || v->number != want) differ(field, *v, python_float(want));
  }
  void boolean(std::string_view field, bool want, std::optional<bool> if_absent = std::nullopt) {
    const json::Value* v = present(field);
    const char* w = want ? "true" : "false";
    if (!v) return absent(field, w, if_absent ? std::optional<bool>(*if_absent == want) : std::nullopt);
    if (v->kind != Kind::Bool || v->boolean != want) differ(field, *v, w);
  }
  void string(std::string_view field, std::string_view want, std::optional<std::string_view> if_absent = std::nullopt) {
    const json::Value* v = present(field);
    const std::string w = json::quote(want);
    if (!v) return absent(field, w, if_absent ? std::optional<bool>(*if_absent == want) : std::nullopt);
    if (v->kind != Kind::String || v->string != want) differ(field, *v, w);
  }
  // A feature the run type does not have: the field absent or null.
  void none(std::string_view field, std::string_view why) {
    const json::Value* v = present(field);
    if (v && v->kind != Kind::Null) problems.push_back(name(field) + " is " + shown(*v) + " in the file; " + std::string(why));
  }
  // Llama 3.1's RoPE scaling: absent or null where the run type has none,
  // else {"rope_type": "llama3", "factor", "low_freq_factor",
  // "high_freq_factor", "original_max_position_embeddings"} equal to it.
  void rope_scaling(const math::RopeScaling& want) {
    const json::Value* v = present("rope_scaling");
    json::Writer w;
    w.begin_object()
        .key("factor").number(want.factor, json::Spelling::python_float)
        .key("low_freq_factor").number(want.low_freq_factor, json::Spelling::python_float)
        .key("high_freq_factor").number(want.high_freq_factor, json::Spelling::python_float)
        .key("original_max_position_embeddings").integer(want.original_positions)
        .key("rope_type").string("llama3")
        .end();
    const std::string& wanted = w.text();
    if (!want.on()) return none("rope_scaling", "the run type's RoPE is unscaled (its LlamaConfig has no rope_scaling)");
    if (!v || v->kind == Kind::Null) {
      problems.push_back(name("rope_scaling") + " is " + (v ? "null" : "absent") + " in the file, " + wanted +
                         " in the run type");
      return;
    }
    if (v->kind != Kind::Object) return differ("rope_scaling", *v, wanted);
    Checker sub(*v, text_, name("rope_scaling") + ".");
    if (v->get("rope_type")) sub.string("rope_type", "llama3");
    else sub.string("type", "llama3");  // the older spelling
    sub.number("factor", want.factor);
    sub.number("low_freq_factor", want.low_freq_factor);
    sub.number("high_freq_factor", want.high_freq_factor);
    sub.integer("original_max_position_embeddings", want.original_positions);
    problems.insert(problems.end(), sub.problems.begin(), sub.problems.end());
  }
  // A sliding window: `want` positions, or null where want is 0; absent
  // means transformers' default `if_absent`.
  void window(std::string_view field, std::int64_t want, std::int64_t if_absent) {
    const json::Value* v = present(field);
    const std::string w = want > 0 ? std::to_string(want) : "null";
    if (!v) return absent(field, w, want == if_absent);
    if (v->kind == Kind::Null ? want != 0 : v->integer() != std::optional<std::int64_t>(want)) differ(field, *v, w);
  }
  // null, or the integer `want`.
  void null_or(std::string_view field, std::int64_t want) {
    const json::Value* v = present(field);
    if (!v || v->kind == Kind::Null) return;
    const auto got = v->integer();
    if (!got || *got != want) differ(field, *v, "null or " + std::to_string(want));
  }

  std::vector<std::string> problems;

 private:
  const json::Value* present(std::string_view field) const { return root_.get(field); }
  std::string name(std::string_view field) const { return prefix_ + std::string(field); }
  // The value as the file writes it (at most 80 bytes of it).
  std::string shown(const json::Value& v) const {
    std::string s(text_.substr(v.begin, v.end - v.begin));
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
  }
  void differ(std::string_view field, const json::Value& v, const std::string& want) {
    problems.push_back(name(field) + " is " + shown(v) + " in the file, " + want + " in the run type");
  }
  // matches: nullopt when transformers has no default (the field is required)
  void absent(std::string_view field, const std::string& want, std::optional<bool> matches) {
    if (!matches) problems.push_back(name(field) + " is missing from the file (the run type has " + want + ")");
    else if (!*matches)
      problems.push_back(name(field) + " is absent from the file, so transformers' default applies, which is not the run type's " +
                         want);
  }

  const json::Value& root_;
  std::string_view text_;
  std::string prefix_;  // where root_ sits ("rope_scaling." in a nested object)
};

// The names transformers gives a Llama-family architecture: config.json's
// model_type and its architectures' class.
inline constexpr std::string_view model_type(models::LlamaArch a) {
  switch (a) {
    case models::LlamaArch::qwen2: return "qwen2";
    case models::LlamaArch::qwen3: return "qwen3";
    case models::LlamaArch::mistral: return "mistral";
    default: return "llama";
  }
}
inline constexpr std::string_view architecture(models::LlamaArch a) {
  switch (a) {
    case models::LlamaArch::qwen2: return "Qwen2ForCausalLM";
    case models::LlamaArch::qwen3: return "Qwen3ForCausalLM";
    case models::LlamaArch::mistral: return "MistralForCausalLM";
    default: return "LlamaForCausalLM";
  }
}
// What a config.json of the architecture cannot say about a LlamaConfig (a
// window outside Mistral, q / k norms outside Qwen3, Qwen2 without its
// biases, Mistral with them); empty when it can say everything.
inline constexpr std::string_view inexpressible(const models::LlamaConfig& c) {
  using models::LlamaArch;
  if (c.sliding_window > 0 && c.arch != LlamaArch::mistral)
    return "its attention has a sliding window, which only model_type mistral (LlamaArch::mistral) describes";
  if (c.qk_norm != (c.arch == LlamaArch::qwen3))
    return c.qk_norm ? "its attention normalizes q and k heads, which only model_type qwen3 (LlamaArch::qwen3) describes"
                     : "model_type qwen3 normalizes q and k heads, which its attention does not (qk_norm is false)";
  if (c.arch == LlamaArch::qwen2 && !c.attention_bias) return "Qwen2's q, k and v projections have a bias, which its do not";
  if (c.arch == LlamaArch::mistral && c.attention_bias) return "its q, k and v projections have a bias, which Mistral's do not";
  return {};
}

template <class M>
void check_fields(Checker& c, std::int64_t seq) {
  constexpr auto C = M::config;
  const double eps = math::norm_eps;
  if constexpr (LlamaModel<M>) {
    using models::LlamaArch;
    constexpr LlamaArch arch = C.arch;
    c.string("model_type", model_type(arch));
    if (!inexpressible(C).empty())
      c.problems.push_back("no config.json describes the run type's model: " + std::string(inexpressible(C)));
    c.integer("vocab_size", C.vocab);
    c.integer("hidden_size", C.dim);
    c.integer("intermediate_size", C.ffn);
    c.integer("num_hidden_layers", C.layers);
    c.integer("num_attention_heads", C.heads);
    c.integer("num_key_value_heads", C.kv_heads, C.heads);
    // transformers' defaults: Qwen3Config's head_dim 128, the others hidden / heads
    c.integer("head_dim", C.head_width(), arch == LlamaArch::qwen3 ? 128 : C.dim / C.heads);
    c.number("rms_norm_eps", static_cast<double>(C.rms_norm_eps), 1e-6);
    c.number("rope_theta", static_cast<double>(C.rope_theta), 10000.0);
    c.boolean("tie_word_embeddings", C.tied, false);
    c.string("hidden_act", "silu", "silu");
    if constexpr (arch == LlamaArch::qwen2 || arch == LlamaArch::qwen3) {
      // Qwen2: q, k, v always carry a bias (no attention_bias field);
      // Qwen3: attention_bias, default false. The window applies only with
      // use_sliding_window.
      if constexpr (arch == LlamaArch::qwen3) c.boolean("attention_bias", C.attention_bias, false);
      c.boolean("use_sliding_window", false, false);
    } else if constexpr (arch == LlamaArch::mistral) {
      // no bias field (never a bias); sliding_window defaults to 4096
      c.window("sliding_window", C.sliding_window, 4096);
    } else {
      c.boolean("attention_bias", C.attention_bias, false);
      c.boolean("mlp_bias", false, false);
      c.none("sliding_window", "the run type's attention has no sliding window (its LlamaConfig's sliding_window is 0)");
    }
    c.rope_scaling(C.rope_scaling.value());
    // transformers' defaults: Llama 2048, Qwen2 and Qwen3 32768, Mistral 131072
    const std::int64_t positions = arch == LlamaArch::llama ? 2048 : arch == LlamaArch::mistral ? 131072 : 32768;
    c.at_least("max_position_embeddings", seq, positions, "Seq");
  } else if constexpr (GPT2Model<M>) {
    c.string("model_type", "gpt2");
    c.integer("vocab_size", C.vocab);
    c.integer("n_embd", C.dim);
    c.integer("n_layer", C.layers);
    c.integer("n_head", C.heads);
    c.integer("n_positions", C.max_positions);
    c.null_or("n_inner", 4 * C.dim);
    c.number("layer_norm_epsilon", eps, 1e-5);
    c.string("activation_function", "gelu_new", "gelu_new");
    c.boolean("tie_word_embeddings", true, true);
  }
}

}  // namespace detail::hf_config

// The text of config.json for the trainer's model, its weights stored as
// `stored` (torch_dtype). Only for a model of a Hugging Face family
// (detail::hf_config::has_config).
template <class Trainer>
std::string hf_config_json(DType stored = DType::F32) {
  namespace hc = detail::hf_config;
  using M = hc::model_of<Trainer>;
  static_assert(hc::has_config<M>, "io::hf_config_json: the model is not a preset of a Hugging Face family (models::Llama, models::GPT2)");
  constexpr auto C = M::config;
  constexpr auto py = detail::json::Spelling::python_float;  // 500000.0, 1e-05, as transformers writes them
  detail::json::Writer w;
  w.begin_object(detail::json::Layout::lines);
  if constexpr (hc::LlamaModel<M>) {
    static_assert(hc::inexpressible(C).empty(), "io::hf_config_json: no config.json describes the model's LlamaConfig (see "
                                                "detail::hf_config::inexpressible)");
    using models::LlamaArch;
    constexpr LlamaArch arch = C.arch;
    w.key("architectures").begin_array().string(hc::architecture(arch)).end();
    w.key("model_type").string(hc::model_type(arch));
    w.key("vocab_size").integer(C.vocab);
    w.key("hidden_size").integer(C.dim);
    w.key("intermediate_size").integer(C.ffn);
    w.key("num_hidden_layers").integer(C.layers);
    w.key("num_attention_heads").integer(C.heads);
    w.key("num_key_value_heads").integer(C.kv_heads);
    w.key("head_dim").integer(C.head_width());
    w.key("max_position_embeddings").integer(C.max_positions);
    w.key("rms_norm_eps").number(C.rms_norm_eps, py);
    w.key("rope_theta").number(static_cast<double>(C.rope_theta), py);
    w.key("rope_scaling");
    if (!C.rope_scaling.on()) w.null();
    else
      w.begin_object()
          .key("factor").number(C.rope_scaling.factor, py)
          .key("high_freq_factor").number(C.rope_scaling.high_freq_factor, py)
          .key("low_freq_factor").number(C.rope_scaling.low_freq_factor, py)
          .key("original_max_position_embeddings").integer(C.rope_scaling.original_positions)
          .key("rope_type").string("llama3")
          .end();
    w.key("tie_word_embeddings").boolean(C.tied);
    w.key("hidden_act").string("silu");
    if constexpr (arch == LlamaArch::qwen2 || arch == LlamaArch::qwen3) {
      if constexpr (arch == LlamaArch::qwen3) w.key("attention_bias").boolean(C.attention_bias);
      w.key("use_sliding_window").boolean(false);
      w.key("sliding_window").null();
      w.key("max_window_layers").integer(C.layers);
    } else if constexpr (arch == LlamaArch::mistral) {
      w.key("sliding_window");
      if (C.sliding_window > 0) w.integer(C.sliding_window);
      else w.null();
    } else {
      w.key("attention_bias").boolean(C.attention_bias);
      w.key("mlp_bias").boolean(false);
    }
    w.key("attention_dropout").number(0.0, py);
    w.key("initializer_range").number(0.02, py);
    w.key("use_cache").boolean(true);
  } else {
    w.key("architectures").begin_array().string("GPT2LMHeadModel").end();
    w.key("model_type").string("gpt2");
    w.key("vocab_size").integer(C.vocab);
    w.key("n_embd").integer(C.dim);
    w.key("n_layer").integer(C.layers);
    w.key("n_head").integer(C.heads);
    w.key("n_positions").integer(C.max_positions);
    w.key("n_ctx").integer(C.max_positions);
    w.key("n_inner").null();
    w.key("layer_norm_epsilon").number(math::norm_eps, py);
    w.key("activation_function").string("gelu_new");
    w.key("tie_word_embeddings").boolean(true);
    w.key("initializer_range").number(0.02, py);
    w.key("use_cache").boolean(true);
  }
  w.key("torch_dtype").string(hc::torch_dtype(stored));
  w.end();
  return w.take() + "\n";
}

// Whether `path` is a config.json this library may replace: a JSON object
// with a "model_type".
inline bool is_hf_config(const std::filesystem::path& path) { return detail::json::file_is_object_with(path, "model_type"); }

// Checks the config.json at `path` against the trainer's model (see the top
// of this file); throws config_mismatch naming the file and every field that
// differs, or what keeps it from being read.
template <class Trainer>
void check_hf_config(const std::filesystem::path& path) {
  namespace hc = detail::hf_config;
  using M = hc::model_of<Trainer>;
  static_assert(hc::has_config<M>, "io::check_hf_config: the model is not a preset of a Hugging Face family (models::Llama, models::GPT2)");
  const std::string where = "config.json: " + path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw config_mismatch(where + " is missing: a model directory holds the config.json of its model (nothing was loaded)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_mismatch(where + " cannot be opened (nothing was loaded)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  detail::json::Value root;
  try {
    root = detail::json::parse(text);
  } catch (const detail::json::parse_error& e) {
    throw config_mismatch(where + " is not JSON: " + e.what() + " (nothing was loaded)");
  }
  if (root.kind != hc::Kind::Object) throw config_mismatch(where + " is not a JSON object (nothing was loaded)");
  hc::Checker c(root, text);
  hc::check_fields<M>(c, Trainer::run::seq);
  if (c.problems.empty()) return;
  std::string msg = where + " does not describe this run's model: " + c.problems[0];
  if (c.problems.size() > 1) {
    msg += " (and " + std::to_string(c.problems.size() - 1) + " more: ";
    for (std::size_t k = 1; k < c.problems.size(); ++k) msg += (k > 1 ? "; " : "") + c.problems[k];
    msg += ")";
  }
  throw config_mismatch(msg + "; nothing was loaded");
}

}  // namespace headroom::io
