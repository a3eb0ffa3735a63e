#pragma once
// LoRA adapters of a host::Trainer in PEFT's layout, and merged checkpoints.
// Host only; not in the umbrella header.
//
//   io::export_adapter(trainer, "out/adapter", "meta-llama/Llama-3.2-1B");
//   io::load_adapter(trainer, "out/adapter");
//   io::save_merged(trainer, "out/merged/model.safetensors");
//
// An adapter directory holds what PEFT's save_pretrained writes for LoRA:
//
//   adapter_model.safetensors   per adapted module M (its path inside the
//                               transformers *ForCausalLM, see hf_names.hpp):
//                                 "base_model.model.<M>.lora_A.weight"  F32 (r, in)
//                                 "base_model.model.<M>.lora_B.weight"  F32 (out, r)
//                               e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight (Llama),
//                                    base_model.model.transformer.h.0.attn.c_attn.lora_A.weight (GPT-2:
//                                    PEFT wraps GPT2LMHeadModel, whose blocks live under "transformer.")
//                               metadata {"format": "pt"}. The adapter weights are
//                               nn.Linear weights even on GPT-2's Conv1D, so they
//                               are never transposed (f64 runs are written as F32).
//   adapter_config.json         {"peft_type": "LORA", "task_type": "CAUSAL_LM",
//                                "base_model_name_or_path", "r", "lora_alpha" (= scale * r,
//                                from the schedule), "target_modules" (the distinct projection
//                                names, "q_proj"; a longer suffix such as "attn.c_proj" where
//                                the short name would also match modules without LoRA),
//                                "rank_pattern" / "alpha_pattern" (modules whose rank or
//                                alpha differ from r / lora_alpha), "lora_dropout" (the LoRA
//                                dropout probability; PEFT holds one: where modules differ,
//                                the most common, as for r),
//                                "bias": "none", "fan_in_fan_out" (true for GPT-2's Conv1D),
//                                "inference_mode": true, ...}
//
// load_adapter reads both back into a trainer whose LoRA modules are the
// same: every module's rank and alpha / r must be this trainer's (the scale
// is part of the run type), every lora_A / lora_B must be present with its
// shape and a float dtype (F32, F16, BF16, F64), and a tensor the trainer has
// no place for (another module's adapter, PEFT's modules_to_save) is an
// error rather than silently dropped. Nothing is written before all of it
// has been checked. target_modules and fan_in_fan_out are not checked: the
// trainer's model type decides where LoRA is, and lora_A / lora_B have the
// same layout either way.
//
// save_merged writes a dense base checkpoint exactly like save_pretrained
// (Hugging Face names, F32), except that each adapted projection's weight is
// W + scale * B A, computed in double from the stored values (a quantized W
// dequantized exactly as the kernels see it) and rounded once to F32. A
// trainer of the same model without LoRA that load_pretrained's it computes
// the adapted model's loss, up to float rounding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../ops/linear.hpp"
#include "../ops/lora.hpp"
#include "hf_names.hpp"
#include "safetensors.hpp"

namespace headroom::io {

// One LoRA-adapted projection of a trainer (one Repeat instance).
struct LoraModule {
  std::string module;     // trainer path: "layers.0.self_attn.q_proj"
  std::string hf_module;  // path in the transformers model: "model.layers.0.self_attn.q_proj"
  const ParamSlot* A = nullptr;       // (rank, in)
  const ParamSlot* B = nullptr;       // (out, rank)
  const ParamSlot* weight = nullptr;  // the base (out, in), or null
  std::int64_t in = 0, out = 0, rank = 0;
  std::int64_t scale_num = 1, scale_den = 1;  // scale = alpha / rank
  std::int64_t dropout_num = 0, dropout_den = 1;  // lora_dropout = num / den

  double scale() const { return static_cast<double>(scale_num) / static_cast<double>(scale_den); }
  double alpha() const { return scale() * static_cast<double>(rank); }
  double dropout() const { return static_cast<double>(dropout_num) / static_cast<double>(dropout_den); }
  std::string peft_name(std::string_view which) const {  // which: "lora_A" / "lora_B"
    return "base_model.model." + hf_module + "." + std::string(which) + ".weight";
  }
};

// The trainer's LoRA modules, in schedule order.
template <class Trainer>
std::vector<LoraModule> lora_modules() {
  std::vector<LoraModule> out;
  for (const Step& st : Trainer::sched.steps) {
    using L = ops::LoRA;
    if (st.op != L::name || st.kind != EventKind::forward) continue;
    const std::string module = Trainer::node_path(st.node, st.instance);
    bool seen = false;
    for (const LoraModule& m : out) seen = seen || m.module == module;
    if (seen) continue;
    LoraModule m;
    m.module = module;
    m.hf_module = hf_module_path(hf_family<Trainer>(), module);
    m.A = &Trainer::param(static_cast<std::size_t>(st.param[L::a.index]));
    m.B = &Trainer::param(static_cast<std::size_t>(st.param[L::b.index]));
    m.in = st.dim[L::in.index];
    m.out = st.dim[L::out.index];
    m.rank = st.dim[L::rank.index];
    m.scale_num = st.dim[L::scale_num.index];
    m.scale_den = st.dim[L::scale_den.index];
    m.dropout_num = st.dim[L::dropout_num.index];
    m.dropout_den = st.dim[L::dropout_den.index];
    for (const ParamSlot& p : Trainer::sched.params)
      if (p.node == st.node && p.instance == st.instance && p.name == "weight") m.weight = &p;
    if (m.A->rows != m.rank || m.A->cols != m.in || m.B->rows != m.out || m.B->cols != m.rank ||
        (m.weight && (m.weight->rows != m.out || m.weight->cols != m.in)))
      throw std::logic_error("peft: LoRA module " + module + ": its parameters' shapes do not match the op's dimensions");
    out.push_back(std::move(m));
  }
  return out;
}

namespace detail::peft {

inline constexpr const char* weights_file = "adapter_model.safetensors";
inline constexpr const char* config_file = "adapter_config.json";

// Whether `path` is a PEFT adapter config (a JSON object with "peft_type"):
// what export_adapter may replace.
inline bool is_adapter_config(const std::filesystem::path& path) { return detail::json::file_is_object_with(path, "peft_type"); }

// PEFT's target_modules matching: the module's name equals the key or ends with "." + key.
inline bool key_matches(std::string_view key, std::string_view module) {
  if (module == key) return true;
  return module.size() > key.size() && module.substr(module.size() - key.size()) == key &&
         module[module.size() - key.size() - 1] == '.';
}

// The shortest dotted suffix of each adapted module that matches no
// projection without LoRA; distinct, in order.
template <class Trainer>
std::vector<std::string> target_modules(const std::vector<LoraModule>& mods) {
  std::vector<std::string> projections;  // every projection of the model, HF paths
  for (const Step& st : Trainer::sched.steps) {
    if ((st.op != ops::Linear::name && st.op != ops::LoRA::name) || st.kind != EventKind::forward) continue;
    const std::string m = hf_module_path(hf_family<Trainer>(), Trainer::node_path(st.node, st.instance));
    if (std::find(projections.begin(), projections.end(), m) == projections.end()) projections.push_back(m);
  }
  auto adapted = [&](const std::string& p) {
    for (const LoraModule& m : mods)
      if (m.hf_module == p) return true;
    return false;
  };
  std::vector<std::string> out;
  for (const LoraModule& m : mods) {
    std::vector<std::string> parts;  // "model", "layers", "0", "self_attn", "q_proj"
    for (std::size_t b = 0, e = 0; b <= m.hf_module.size(); b = e + 1) {
      e = m.hf_module.find('.', b);
      if (e == std::string::npos) e = m.hf_module.size();
      parts.push_back(m.hf_module.substr(b, e - b));
    }
    std::string key = m.hf_module;
    for (std::size_t n = 1; n <= parts.size(); ++n) {  // "q_proj", "self_attn.q_proj", ...
      std::string s;
      for (std::size_t k = parts.size() - n; k < parts.size(); ++k) s += (s.empty() ? "" : ".") + parts[k];
      bool only_adapted = true;
      for (const std::string& p : projections) only_adapted = only_adapted && (!key_matches(s, p) || adapted(p));
      if (only_adapted) {
        key = s;
        break;
      }
    }
    if (std::find(out.begin(), out.end(), key) == out.end()) out.push_back(key);
  }
  return out;
}

// The most frequent value.
template <class V>
V most_common(const std::vector<V>& v) {
  V best = v.front();
  std::size_t best_n = 0;
  for (const V& x : v) {
    const auto n = static_cast<std::size_t>(std::count(v.begin(), v.end(), x));
    if (n > best_n) best = x, best_n = n;
  }
  return best;
}

[[noreturn]] inline void fail(const std::filesystem::path& where, const std::string& what) {
  throw format_error("peft: " + where.string() + ": " + what);
}
[[noreturn]] inline void fail_file(const SafetensorsFile& f, const std::string& what) {
  throw format_error("safetensors: " + f.path().string() + ": " + what);
}

}  // namespace detail::peft

// Writes the trainer's LoRA adapters to `dir` (created if needed) as PEFT's
// adapter_model.safetensors and adapter_config.json (see the top of this file).
template <class Trainer>
void export_adapter(const Trainer& t, const std::filesystem::path& dir, std::string_view base_model_name) {
  HEADROOM_WHOLE_PARAMETERS("io::export_adapter");
  namespace fs = std::filesystem;
  namespace pf = detail::peft;
  using T = typename Trainer::T;
  const std::vector<LoraModule> mods = lora_modules<Trainer>();
  if (mods.empty()) throw std::invalid_argument("export_adapter: this trainer's model has no LoRA adapters");
  // Nothing is written unless both files may be replaced.
  if (fs::exists(dir) && !fs::is_directory(dir))
    throw overwrite_refused("export_adapter: " + dir.string() + " exists and is not a directory (nothing was written)");
  check_replaceable(dir / pf::weights_file, "export_adapter", "safetensors file", is_safetensors_file);
  check_replaceable(dir / pf::config_file, "export_adapter", "PEFT adapter config", pf::is_adapter_config);
  fs::create_directories(dir);

  std::vector<std::vector<float>> staged;
  staged.reserve(2 * mods.size());
  std::vector<TensorView> views;
  for (const LoraModule& m : mods) {
    for (const ParamSlot* p : {m.A, m.B}) {
      const T* w = t.weight(*p);
      const void* data = w;
      if constexpr (!std::is_same_v<T, float>) data = staged.emplace_back(w, w + p->elements()).data();
      views.push_back(TensorView{m.peft_name(p->name), DType::F32, {p->rows, p->cols}, data});
    }
  }
  write_safetensors(dir / pf::weights_file, views, {{"format", "pt"}});

  // adapter_config.json
  std::vector<std::int64_t> ranks;
  std::vector<double> alphas;
  for (const LoraModule& m : mods) ranks.push_back(m.rank), alphas.push_back(m.alpha());
  const std::int64_t r = pf::most_common(ranks);
  const double alpha = pf::most_common(alphas);
  std::vector<double> dropouts;
  for (const LoraModule& m : mods) dropouts.push_back(m.dropout());
  const double dropout = pf::most_common(dropouts);  // PEFT has one lora_dropout (it only acts in training)
  namespace js = detail::json;
  constexpr auto whole = js::Spelling::integer_if_whole;  // lora_alpha 16, not 16.0
  js::Writer w;
  w.begin_object(js::Layout::lines);
  w.key("peft_type").string("LORA");
  w.key("task_type").string("CAUSAL_LM");
  w.key("base_model_name_or_path").string(base_model_name);
  w.key("r").integer(r);
  w.key("lora_alpha").number(alpha, whole);
  w.key("target_modules").begin_array();
  for (const std::string& k : pf::target_modules<Trainer>(mods)) w.string(k);
  w.end();
  w.key("rank_pattern").begin_object();  // the modules whose rank or alpha differs from r and lora_alpha
  for (const LoraModule& m : mods)
    if (m.rank != r) w.key(m.hf_module).integer(m.rank);
  w.end();
  w.key("alpha_pattern").begin_object();
  for (const LoraModule& m : mods)
    if (m.alpha() != alpha) w.key(m.hf_module).number(m.alpha(), whole);
  w.end();
  w.key("lora_dropout").number(dropout, whole);
  w.key("bias").string("none");
  w.key("fan_in_fan_out").boolean(hf_family<Trainer>() == HfFamily::gpt2);
  w.key("inference_mode").boolean(true);
  w.key("init_lora_weights").boolean(true);
  w.key("use_rslora").boolean(false);
  w.key("use_dora").boolean(false);
  w.key("modules_to_save").null();
  w.key("layers_to_transform").null();
  w.key("revision").null();
  w.end();
  const std::string j = w.take() + "\n";
  const fs::path cfg_path = dir / pf::config_file;
  write_durably(
      cfg_path, [&](std::ostream& out) { out.write(j.data(), static_cast<std::streamsize>(j.size())); },
      [&](const std::string& what) { pf::fail(cfg_path, what); });
}

// Loads a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors)
// into the trainer's lora_A / lora_B (see the top of this file).
template <class Trainer>
void load_adapter(Trainer& t, const std::filesystem::path& dir) {
  HEADROOM_WHOLE_PARAMETERS("io::load_adapter");
  namespace fs = std::filesystem;
  namespace pf = detail::peft;
  namespace js = detail::json;
  namespace st = detail::safetensors;
  using T = typename Trainer::T;
  const std::vector<LoraModule> mods = lora_modules<Trainer>();
  if (mods.empty()) throw std::invalid_argument("load_adapter: this trainer's model has no LoRA adapters");

  // adapter_config.json
  const fs::path cfg_path = dir / pf::config_file;
  std::ifstream in(cfg_path, std::ios::binary);
  if (!in) pf::fail(cfg_path, "cannot open the file (not an adapter directory?)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  js::Value cfg;
  try {
    cfg = js::parse(text);
  } catch (const std::runtime_error& e) {
    pf::fail(cfg_path, e.what());
  }
  if (cfg.kind != js::Value::Kind::Object) pf::fail(cfg_path, "not a JSON object");
  const js::Value* type = cfg.get("peft_type");
  if (!type || type->kind != js::Value::Kind::String || type->string != "LORA")
    pf::fail(cfg_path, "\"peft_type\" is not \"LORA\"; only LoRA adapters can be loaded");
  if (const js::Value* dora = cfg.get("use_dora"); dora && dora->kind == js::Value::Kind::Bool && dora->boolean)
    pf::fail(cfg_path, "a DoRA adapter (\"use_dora\": true) cannot be loaded: the trainer's adapters are plain LoRA");
  const js::Value* r = cfg.get("r");
  if (!r || !r->integer() || *r->integer() <= 0) pf::fail(cfg_path, "\"r\" is missing or not a positive integer");
  const js::Value* alpha = cfg.get("lora_alpha");
  if (!alpha || alpha->kind != js::Value::Kind::Number) pf::fail(cfg_path, "\"lora_alpha\" is missing or not a number");
  auto pattern = [&](const char* key, const LoraModule& m) -> const js::Value* {
    const js::Value* pat = cfg.get(key);
    if (!pat || pat->kind != js::Value::Kind::Object) return nullptr;
    for (std::size_t i = 0; i < pat->keys.size(); ++i)
      if (pf::key_matches(pat->keys[i], m.hf_module)) return &pat->items[i];
    return nullptr;
  };
  for (const LoraModule& m : mods) {
    const js::Value* rv = pattern("rank_pattern", m);
    const std::int64_t rank = rv && rv->integer() ? *rv->integer() : *r->integer();
    const js::Value* av = pattern("alpha_pattern", m);
    const double a = av && av->kind == js::Value::Kind::Number ? av->number : alpha->number;
    if (rank != m.rank)
      pf::fail(cfg_path, "rank " + std::to_string(rank) + " for module " + m.hf_module + ", but this trainer's LoRA there has rank " +
                             std::to_string(m.rank));
    const double scale = a / static_cast<double>(rank);
    if (std::abs(scale - m.scale()) > 1e-9 * std::max(1.0, std::abs(m.scale())))
      pf::fail(cfg_path, "lora_alpha " + js::number(a, js::Spelling::integer_if_whole) + " / r " + std::to_string(rank) +
                             " = scale " + js::number(scale) + " for module " + m.hf_module +
                             ", but this trainer's LoRA scale there is " + js::number(m.scale()) + " (alpha " +
                             js::number(m.alpha(), js::Spelling::integer_if_whole) +
                             "); the scale is part of the run type (LoRA<R, L, Ratio<alpha>>)");
  }

  // adapter_model.safetensors: check everything, then read
  const SafetensorsFile file(dir / pf::weights_file);
  auto bad = [&](const std::string& what) { pf::fail_file(file, what); };
  std::vector<std::string> wanted;
  for (const LoraModule& m : mods) {
    for (const ParamSlot* p : {m.A, m.B}) {
      const std::string name = m.peft_name(p->name);
      wanted.push_back(name);
      const TensorInfo* ti = file.find(name);
      if (!ti) pf::fail_file(file, "tensor '" + name + "' not found, for the adapter of " + m.module + " (the file has " + std::to_string(file.tensors().size()) + " tensors)");
      std::string what;
      if (!is_float(ti->dtype)) what = "dtype " + std::string(st::dtype_name(ti->dtype)) + " is not supported (F32, F16, BF16 or F64 expected)";
      const std::vector<std::int64_t> shape{p->rows, p->cols};
      if (ti->shape != shape)
        what += (what.empty() ? "" : "; ") + std::string("shape is ") + st::shape_string(ti->shape) + ", expected " + st::shape_string(shape) +
                (p->name == "lora_A" ? " (r, in)" : " (out, r)");
      if (!what.empty()) bad("tensor '" + name + "': " + what);
      std::vector<double> values(static_cast<std::size_t>(p->elements()));  // finite, before anything is set
      read_converted<double>(file, *ti, std::span<double>(values));
      for (std::size_t i = 0; i < values.size(); ++i)
        if (!std::isfinite(values[i]))
          bad("tensor '" + name + "': element " + std::to_string(i) + " of " + st::shape_string(shape) + " is " +
              (std::isnan(values[i]) ? "NaN" : "infinite") + "; an adapter must be finite (nothing was loaded)");
    }
  }
  for (const TensorInfo& ti : file.tensors())
    if (std::find(wanted.begin(), wanted.end(), ti.name) == wanted.end())
      bad("tensor '" + ti.name + "' has no place in this trainer (its LoRA modules are " + mods.front().module +
          (mods.size() > 1 ? ", ..." : "") + "; only their lora_A / lora_B are loaded)");
  for (const LoraModule& m : mods)
    for (const ParamSlot* p : {m.A, m.B})
      if constexpr (host::half_storage<T>) {  // rounded, and the masters set
        std::vector<float> v(static_cast<std::size_t>(p->elements()));
        read_converted<float>(file, *file.find(m.peft_name(p->name)), std::span<float>(v));
        t.set_dense(*p, v);
      } else {
        read_converted<T>(file, *file.find(m.peft_name(p->name)), std::span<T>(t.weight(*p), static_cast<std::size_t>(p->elements())));
      }
}

// Writes a dense base checkpoint (Hugging Face names, F32; a file or a
// model directory, like save_pretrained) in which every adapted
// projection's weight is W + scale * B A.
template <class Trainer>
void save_merged(const Trainer& t, const std::filesystem::path& path, const PretrainedSaveOptions& o = {}) {
  const std::vector<LoraModule> mods = lora_modules<Trainer>();
  auto module_of = [&](const ParamSlot& p) -> const LoraModule* {
    for (const LoraModule& m : mods)
      if (m.weight == &p) return &m;
    return nullptr;
  };
  detail::hf::write_base(
      t, path, o, "save_merged", [&](const ParamSlot& p) { return module_of(p) != nullptr; },
      [&](const ParamSlot& p, std::vector<double>& w) {
        const LoraModule& m = *module_of(p);
        const auto* a = t.weight(*m.A);  // (r, in)
        const auto* b = t.weight(*m.B);  // (out, r)
        const double s = m.scale();
        for (std::int64_t o = 0; o < m.out; ++o)
          for (std::int64_t i = 0; i < m.in; ++i) {
            double d = 0;
            for (std::int64_t k = 0; k < m.rank; ++k) d += static_cast<double>(host::widen(b[o * m.rank + k])) * static_cast<double>(host::widen(a[k * m.in + i]));
            w[static_cast<std::size_t>(o * m.in + i)] += s * d;
          }
      });
}

}  // namespace headroom::io
