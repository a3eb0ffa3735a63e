#pragma once
// Hugging Face base checkpoints (model.safetensors) for a host::Trainer: the
// Hugging Face name of every parameter, save_pretrained and load_pretrained.
// Host only; not in the umbrella header.
//
//   io::save_pretrained(trainer, "out/model.safetensors");   // one file
//   io::load_pretrained(trainer, "Llama-3.2-1B/model.safetensors");
//   io::save_pretrained(trainer, "out/llama");              // a model directory
//   io::load_pretrained(trainer, "Meta-Llama-3-8B");        // config.json, index, shards
//
// Files and directories. A path ending in ".safetensors" is one weights
// file. Any other path is a Hugging Face model directory: load_pretrained
// checks its config.json against the run type first (hf_config.hpp; nothing
// is read when a field differs), then reads model.safetensors or the shards
// of model.safetensors.index.json, each shard opened once and read in
// order (safetensors_shards.hpp); save_pretrained writes the weights as
// model.safetensors or as shards of at most
// PretrainedSaveOptions::max_shard_size bytes with their index, then
// config.json. A model that is not a preset of a Hugging Face family (a
// stack written by hand) has no config.json: its directory holds the
// weights alone.
//
// Names. A trainer's parameter paths are the module paths of the model type
// ("layers.3.self_attn.q_proj.weight"); the file uses the names of the
// transformers class the preset mirrors, detected from the model's kind
// (plan.nodes[0].kind):
//
//   Llama (LlamaForCausalLM)   "model." + path, except "lm_head.weight"
//                              embed_tokens.weight  -> model.embed_tokens.weight
//                              layers.3.self_attn.q_proj.weight -> model.layers.3.self_attn.q_proj.weight
//                              norm.weight          -> model.norm.weight
//   GPT-2 (GPT2LMHeadModel,    the path itself, as openai-community/gpt2 publishes it:
//    as published)             wte.weight, wpe.weight, h.0.ln_1.weight, h.0.attn.c_attn.weight,
//                              ..., ln_f.weight; no lm_head (it is tied to wte). On load
//                              "transformer." + path is accepted too (what a GPT2LMHeadModel
//                              saved by transformers writes).
//   any other model            the trainer's path, as is.
//
// Layout. Tensors are row-major. A Linear's weight is (out, in) as in
// torch.nn.Linear, a norm's weight and every bias are 1-D (n), embeddings are
// (vocab, dim). GPT-2's c_attn, c_proj and c_fc are transformers' Conv1D,
// which stores its weight transposed, (in, out): those are transposed on the
// way out and on the way in.
//
// Values. save_pretrained writes F32 (converting f64 runs; a quantized
// parameter is written dequantized: a base checkpoint is dense) with metadata
// {"format": "pt"}. load_pretrained accepts F32, F16, BF16 and F64 and
// converts; a quantized parameter is quantized as it is loaded (set_quantized),
// as bitsandbytes does when it loads a QLoRA base. LoRA adapters
// (lora_A / lora_B) are not part of a base checkpoint: they are neither
// written nor read (see peft.hpp). Tensors of the file that no parameter asks
// for (GPT-2's attn.bias masks, a tied lm_head.weight, ...) are ignored.
//
// Errors are io::format_error whose message names the file and the tensor:
// a missing tensor, a wrong shape, a dtype that is not a float type (and
// config_mismatch for config.json). Every tensor is checked before any
// parameter is written, so a bad file leaves the trainer as it was. A value
// that is not finite (found as the tensor is read) stops the load naming the
// tensor and the element; the parameters read before it are then loaded.
//
// Memory. A load adds to the trainer's memory one staging buffer of
// load_staging_bytes (16 MiB) of stored values, and, for a parameter that
// is quantized, transposed (GPT-2's Conv1D) or kept in bf16 / f16 (set from
// f32 values and masters), its values in f32 while it is set; f32 and f64
// runs read a dense parameter straight into the arena.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../host/quant.hpp"
#include "../plan/schedule.hpp"
#include "hf_config.hpp"
#include "safetensors.hpp"
#include "safetensors_shards.hpp"

namespace headroom::io {

// The transformers class whose names a model's checkpoint uses.
enum class HfFamily : std::uint8_t { llama, gpt2, other };

constexpr HfFamily hf_family(std::string_view model_kind) {
  if (model_kind == "Llama") return HfFamily::llama;
  if (model_kind == "GPT2") return HfFamily::gpt2;
  return HfFamily::other;
}

template <class Trainer>
constexpr HfFamily hf_family() {
  return hf_family(Trainer::plan.nodes[0].kind);
}

// Whether t.weight(p) and t.quant(p) hold whole parameters: every trainer's
// but a ZeRO<3> one's, which holds its shards, and a tensor-parallel one's,
// which holds its blocks, and a pipeline stage's, which holds its layers
// (io::Consolidated gathers them).
template <class Trainer>
inline constexpr bool holds_whole_parameters = !Trainer::config.sharded(3) && Trainer::config.tp == 1 && Trainer::config.pp == 1;
#define HEADROOM_WHOLE_PARAMETERS(function)                                                                                    \
  static_assert(holds_whole_parameters<Trainer>, function ": a ZeRO<3>, tensor-parallel or pipeline-stage trainer holds parts "  \
                                                 "of the parameters; give io::Consolidated(trainer) instead (io/consolidated.hpp)")

// LoRA's parameters (lora_A, lora_B): adapters, not part of a base checkpoint.
constexpr bool is_adapter_param(std::string_view name) { return name.substr(0, 5) == "lora_"; }

// The name a base parameter has in a Hugging Face checkpoint.
inline std::string hf_name(HfFamily f, std::string_view path) {
  if (f == HfFamily::llama && path.substr(0, 8) != "lm_head.") return "model." + std::string(path);
  return std::string(path);
}

// The names load_pretrained accepts for a parameter, preferred first.
inline std::vector<std::string> hf_accepted_names(HfFamily f, std::string_view path) {
  if (f == HfFamily::gpt2) return {std::string(path), "transformer." + std::string(path)};
  return {hf_name(f, path)};
}

// A module's path inside the transformers *ForCausalLM model (what PEFT's
// names and target_modules refer to): "model.layers.0.self_attn.q_proj",
// "transformer.h.0.attn.c_attn".
inline std::string hf_module_path(HfFamily f, std::string_view module) {
  switch (f) {
    case HfFamily::llama: return module == "lm_head" ? std::string(module) : "model." + std::string(module);
    case HfFamily::gpt2: return "transformer." + std::string(module);
    case HfFamily::other: break;
  }
  return std::string(module);
}

// True for the GPT-2 Conv1D weights, stored (in, out) by transformers.
inline bool hf_transposed(HfFamily f, std::string_view path) {
  if (f != HfFamily::gpt2) return false;
  auto ends = [&](std::string_view s) { return path.size() >= s.size() && path.substr(path.size() - s.size()) == s; };
  return ends(".c_attn.weight") || ends(".c_proj.weight") || ends(".c_fc.weight");
}

// One base parameter of a trainer, as a Hugging Face checkpoint holds it.
struct HfParam {
  const ParamSlot* slot = nullptr;
  std::string path;                 // the trainer's path
  std::string name;                 // its name in the file
  bool transposed = false;          // stored (cols, rows)
  std::vector<std::int64_t> shape;  // its shape in the file
};

// The trainer's base (non-adapter) parameters, in parameter order.
template <class Trainer>
std::vector<HfParam> hf_params() {
  constexpr HfFamily f = hf_family<Trainer>();
  std::vector<HfParam> out;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    if (is_adapter_param(p.name)) continue;
    HfParam h;
    h.slot = &p;
    h.path = Trainer::path_of(p);
    h.name = hf_name(f, h.path);
    h.transposed = hf_transposed(f, h.path);
    const std::string_view kind = Trainer::plan.nodes[p.node].kind;
    const bool vector = p.cols == 1 && (p.name == "bias" || kind == "RMSNorm" || kind == "LayerNorm");
    if (vector) h.shape = {p.rows};
    else if (h.transposed) h.shape = {p.cols, p.rows};
    else h.shape = {p.rows, p.cols};
    out.push_back(std::move(h));
  }
  return out;
}

// How save_pretrained / save_merged write a model directory.
struct PretrainedSaveOptions {
  // The largest shard, in bytes of tensor data (transformers' default "5GB").
  std::uint64_t max_shard_size = default_max_shard_size;
};

namespace detail::hf {

// An engine whose arena is in host memory (host::Trainer: weight(p) is a
// pointer to the values); otherwise (cuda::Trainer) values are copied with
// download_dense(p) and upload_weight(p, values).
template <class Trainer>
concept HostArena = requires(const Trainer& t, const ParamSlot& p) { t.weight(p); };

// A parameter's values in the trainer's (rows, cols) layout as double:
// dense values converted, quantized ones dequantized (exactly: code * absmax
// is computed in float, as the kernels do).
template <class Trainer>
std::vector<double> dense_values(const Trainer& t, const ParamSlot& p) {
  if constexpr (!HostArena<Trainer>) {
    const std::vector<float> f = t.download_dense(p);
    return std::vector<double>(f.begin(), f.end());
  } else {
    std::vector<double> v(static_cast<std::size_t>(p.elements()));
    if (p.quant.kind == QuantKind::none) {
      const auto* w = t.weight(p);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(host::widen(w[i]));
    } else {
      host::dequantize_rows<double>(t.quant(p), 0, p.rows, v.data());
    }
    return v;
  }
}

// (rows, cols) -> (cols, rows)
template <class U, class V>
void transpose(const U* in, V* out, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = static_cast<V>(in[r * cols + c]);
}

// A path save_pretrained writes as one file: it ends in ".safetensors".
inline bool names_one_file(const std::filesystem::path& path) { return path.extension() == ".safetensors"; }

// Writes the trainer's base parameters with Hugging Face names as F32, to
// one file or a model directory (names_one_file).
// `wants(p)` is true for a parameter whose values `apply(p, values)` changes
// (in the trainer's (rows, cols) layout, in double) before they are written.
template <class Trainer, class Wants, class Apply>
void write_base(const Trainer& t, const std::filesystem::path& path, const PretrainedSaveOptions& o, std::string_view writer,
                Wants&& wants, Apply&& apply) {
  HEADROOM_WHOLE_PARAMETERS("io::save_pretrained / save_merged");
  const std::vector<HfParam> params = hf_params<Trainer>();
  std::vector<std::vector<float>> staged;
  staged.reserve(params.size());
  std::vector<TensorView> views;
  views.reserve(params.size());
  for (const HfParam& h : params) {
    const ParamSlot& p = *h.slot;
    const bool change = wants(p);
    if constexpr (HostArena<Trainer>) {
      if constexpr (std::is_same_v<typename Trainer::T, float>) {
        if (!h.transposed && p.quant.kind == QuantKind::none && !change) {  // straight from the arena
          views.push_back(TensorView{h.name, DType::F32, h.shape, t.weight(p)});
          continue;
        }
      }
    }
    std::vector<double> v = dense_values(t, p);
    if (change) apply(p, v);
    std::vector<float>& out = staged.emplace_back(v.size());
    if (h.transposed) transpose(v.data(), out.data(), p.rows, p.cols);
    else
      for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
    views.push_back(TensorView{h.name, DType::F32, h.shape, out.data()});
  }
  if (names_one_file(path)) {
    write_safetensors(path, views, {{"format", "pt"}});
    return;
  }
  namespace hc = detail::hf_config;
  namespace fs = std::filesystem;
  constexpr bool config = hc::has_config<hc::model_of<Trainer>>;
  const fs::path cfg = path / hf_config_file;
  // into a missing or empty directory, or over a model: a directory whose
  // config.json is a model's (for a model without one, whose weights are
  // there and which is not a checkpoint: no trainer.json)
  std::error_code ec;
  const bool model_there = config ? is_hf_config(cfg)
                                  : (fs::exists(path / hf_weights_file, ec) || fs::exists(path / hf_weights_index, ec)) &&
                                        !fs::exists(path / "trainer.json", ec);
  if (fs::is_directory(path, ec) && !fs::is_empty(path, ec) && !model_there)
    throw overwrite_refused(std::string(writer) + ": " + path.string() + " is a directory that holds no model (" +
                            (config ? "no model's " + std::string(hf_config_file) : "no weights, or a checkpoint's") +
                            "); a model is written into a new or empty directory, or over a model (nothing was written)");
  if constexpr (config) check_replaceable(cfg, writer, "model config.json", is_hf_config);
  write_safetensors_shards(path, views, {{"format", "pt"}}, o.max_shard_size, writer);
  if constexpr (config) {
    const std::string j = hf_config_json<Trainer>(DType::F32);
    write_durably(
        cfg, [&](std::ostream& out) { out.write(j.data(), static_cast<std::streamsize>(j.size())); },
        [&](const std::string& what) { throw format_error(std::string(writer) + ": " + cfg.string() + ": " + what); });
  }
}

[[noreturn]] inline void fail(const std::filesystem::path& file, const std::string& what) {
  throw format_error("safetensors: " + file.string() + ": " + what);
}

}  // namespace detail::hf

// Writes the trainer's base parameters (F32, Hugging Face names and layout;
// see the top of this file) to `path`: one model.safetensors-style file
// when it ends in ".safetensors", else a model directory (config.json and
// the weights, sharded by o.max_shard_size). Each file is written atomically
// and durably, and only over a file of its own kind.
template <class Trainer>
void save_pretrained(const Trainer& t, const std::filesystem::path& path, const PretrainedSaveOptions& o = {}) {
  detail::hf::write_base(
      t, path, o, "save_pretrained", [](const ParamSlot&) { return false; }, [](const ParamSlot&, std::vector<double>&) {});
}

// Loads every base parameter of the trainer from a Hugging Face
// model.safetensors, or from a model directory (config.json checked first,
// then model.safetensors or the index's shards; see the top of this file);
// quantized parameters are quantized from the loaded values. Adapters,
// optimizer state and the step count are left as they are.
template <class Trainer>
void load_pretrained(Trainer& t, const std::filesystem::path& path) {
  HEADROOM_WHOLE_PARAMETERS("io::load_pretrained");
  namespace st = detail::safetensors;
  namespace hc = detail::hf_config;
  std::error_code ec;
  if constexpr (hc::has_config<hc::model_of<Trainer>>)
    if (std::filesystem::is_directory(path, ec)) check_hf_config<Trainer>(path / hf_config_file);
  const SafetensorsShards weights(path);
  const bool sharded = weights.files().size() > 1;
  const std::vector<HfParam> params = hf_params<Trainer>();

  // Check everything first, so a bad file changes nothing.
  std::vector<SafetensorsShards::Found> found(params.size());
  std::vector<std::string> problems;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const HfParam& h = params[i];
    const std::vector<std::string> names = hf_accepted_names(hf_family<Trainer>(), h.path);
    for (const std::string& n : names)
      if ((found[i] = weights.find(n)).tensor != nullptr) break;
    const TensorInfo* ti = found[i].tensor;
    if (!ti) {
      std::string tried;
      for (std::size_t k = 1; k < names.size(); ++k) tried += (k > 1 ? "', '" : " (nor '") + names[k];
      if (!tried.empty()) tried += "')";
      problems.push_back("tensor '" + names[0] + "'" + tried + " not found, for parameter " + h.path + " (the " +
                         (sharded ? "shards hold " : "file has ") + std::to_string(weights.tensor_count()) + " tensors)");
      continue;
    }
    std::string what;
    if (!is_float(ti->dtype))
      what = "dtype " + std::string(st::dtype_name(ti->dtype)) + " is not supported (F32, F16, BF16 or F64 expected)";
    if (ti->shape != h.shape) {
      if (!what.empty()) what += "; ";
      what += "shape is " + st::shape_string(ti->shape) + ", expected " + st::shape_string(h.shape);
      if (h.transposed) what += " (GPT-2 Conv1D weights are stored transposed, (in, out))";
    }
    const std::string in_shard = sharded ? " (in " + found[i].file->path().filename().string() + ")" : "";
    if (!what.empty()) problems.push_back("tensor '" + ti->name + "'" + in_shard + ": " + what);
  }
  if (!problems.empty()) {
    std::string msg = problems[0];
    if (problems.size() > 1) {
      msg += " (and " + std::to_string(problems.size() - 1) + " more: ";
      for (std::size_t k = 1; k < problems.size() && k < 4; ++k) msg += (k > 1 ? "; " : "") + problems[k];
      msg += problems.size() > 4 ? "; ...)" : ")";
    }
    detail::hf::fail(weights.source(), msg);
  }

  // File by file, each opened once and read in data order.
  std::vector<std::size_t> order(params.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const SafetensorsFile* first_file = weights.files().data();
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto fa = found[a].file - first_file, fb = found[b].file - first_file;
    return fa != fb ? fa < fb : found[a].tensor->begin < found[b].tensor->begin;
  });
  std::unique_ptr<TensorStream> in;  // the open file
  for (std::size_t i : order) {
    const HfParam& h = params[i];
    const ParamSlot& p = *h.slot;
    const TensorInfo& ti = *found[i].tensor;
    if (!in || &in->file() != found[i].file) in = std::make_unique<TensorStream>(*found[i].file);
    const auto n = static_cast<std::size_t>(p.elements());
    if constexpr (detail::hf::HostArena<Trainer>) {
      using T = typename Trainer::T;
      if constexpr (!host::half_storage<T>) {  // f32 / f64: straight into the arena
        if (p.quant.kind == QuantKind::none && !h.transposed) {
          in->read<T>(ti, std::span<T>(t.weight(p), n));
          continue;
        }
        if (p.quant.kind == QuantKind::none) {  // transposed: file (cols, rows) -> (rows, cols)
          std::vector<T> v(n);
          in->read<T>(ti, std::span<T>(v));
          detail::hf::transpose(v.data(), t.weight(p), p.cols, p.rows);
          continue;
        }
      }
    }
    std::vector<float> v(n);
    in->read<float>(ti, std::span<float>(v));
    if (h.transposed) {
      std::vector<float> w(n);
      detail::hf::transpose(v.data(), w.data(), p.cols, p.rows);
      v.swap(w);
    }
    if constexpr (detail::hf::HostArena<Trainer>) {
      if constexpr (host::half_storage<typename Trainer::T>) {
        if (p.quant.kind == QuantKind::none) {  // the values rounded, and the masters set
          t.set_dense(p, v);
          continue;
        }
      }
      t.set_quantized(p, v);  // a float run's dense values went straight into the arena above
    } else {
      t.upload_weight(p, v);  // the engine converts (or quantizes) and copies
    }
  }
}

}  // namespace headroom::io
