#pragma once
// A model's weights as a Hugging Face model directory stores them: one
// model.safetensors, or shards that model.safetensors.index.json lists.
// Host only; not in the umbrella header.
//
//   model.safetensors.index.json
//     {"metadata": {"total_size": 16060522496},
//      "weight_map": {"lm_head.weight": "model-00004-of-00004.safetensors", ...}}
//
// Reading (SafetensorsShards). A path to a .safetensors file is that one
// file. A directory holds model.safetensors (read when present, as
// transformers prefers it) or the index; every shard the index names is
// opened once. The index and the shards must agree, and each disagreement is
// one format_error naming the file:
//   - the index is not JSON, or has no "weight_map" object of strings;
//   - it names a shard that is not a plain file name in the directory, or
//     a shard that is not there;
//   - a shard holds a tensor the index does not list, or lists in another
//     shard (a tensor held by two shards);
//   - the index places a tensor in a shard that does not hold it.
// metadata.total_size is written, not trusted: loading needs only the map.
//
// Writing (write_safetensors_shards). Tensors are split in their order into
// shards of at most max_shard_size bytes of data (transformers' default, 5 GB
// = 5 * 10^9), as huggingface_hub splits them: a tensor that would overflow
// the shard in progress starts the next one, a tensor larger than the bound
// has a shard of its own. One shard is model.safetensors without an index;
// several are model-00001-of-0000N.safetensors ... and the index, whose
// weight_map names every tensor once (sorted by name) and whose total_size
// is the sum of the tensors' bytes. Every file is written durably
// (durable.hpp) and only over a file of its own kind: the shards first, the
// index last; then what the previous save left that a loader would read
// instead (a model.safetensors beside the new index, an index beside the new
// model.safetensors) and its shards that no index lists are removed, when
// they are files of their kind.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "durable.hpp"
#include "safetensors.hpp"

namespace headroom::io {

inline constexpr const char* hf_weights_file = "model.safetensors";
inline constexpr const char* hf_weights_index = "model.safetensors.index.json";
inline constexpr std::uint64_t default_max_shard_size = 5'000'000'000;  // transformers' max_shard_size="5GB"

namespace detail::shards {

namespace json = io::detail::json;

[[noreturn]] inline void fail(const std::filesystem::path& file, const std::string& what) {
  throw format_error("safetensors: " + file.string() + ": " + what);
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open file");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A shard name the index may give: a plain file name, inside the directory.
inline bool plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\\') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

// "model-00002-of-00004.safetensors" (huggingface_hub's names: five digits each)
inline std::string shard_name(std::size_t k, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}
inline bool is_shard_name(std::string_view name) {
  // model-DDDDD-of-DDDDD.safetensors
  if (name.size() != std::string_view("model-00001-of-00001.safetensors").size()) return false;
  auto digits = [&](std::size_t at) {
    for (std::size_t i = at; i < at + 5; ++i)
      if (name[i] < '0' || name[i] > '9') return false;
    return true;
  };
  return name.substr(0, 6) == "model-" && digits(6) && name.substr(11, 4) == "-of-" && digits(15) &&
         name.substr(20) == ".safetensors";
}

// Whether `path` is a model.safetensors.index.json (a JSON object with a
// "weight_map"): what a save may replace.
inline bool is_index(const std::filesystem::path& path) { return json::file_is_object_with(path, "weight_map"); }

// The shard names an index lists (empty when it cannot be read).
inline std::vector<std::string> listed_shards(const std::filesystem::path& index) {
  std::vector<std::string> out;
  try {
    const json::Value v = json::parse(read_text(index));
    const json::Value* map = v.get("weight_map");
    if (!map) return out;
    for (const json::Value& f : map->items)
      if (f.kind == json::Value::Kind::String && std::find(out.begin(), out.end(), f.string) == out.end()) out.push_back(f.string);
  } catch (const std::exception&) {
  }
  return out;
}

}  // namespace detail::shards

// The weights of a model directory, or of one .safetensors file (see the top
// of this file).
class SafetensorsShards {
 public:
  struct Found {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* tensor = nullptr;
  };

  SafetensorsShards(const SafetensorsShards&) = delete;  // found pointers point into files_
  SafetensorsShards& operator=(const SafetensorsShards&) = delete;
  SafetensorsShards(SafetensorsShards&&) = default;

  explicit SafetensorsShards(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    namespace sh = detail::shards;
    namespace json = detail::json;
    std::error_code ec;
    if (!fs::is_directory(path, ec)) {
      files_.emplace_back(path);
      source_ = path;
      index_all();
      return;
    }
    if (fs::exists(path / hf_weights_file, ec)) {
      files_.emplace_back(path / hf_weights_file);
      source_ = path / hf_weights_file;
      index_all();
      return;
    }
    source_ = path / hf_weights_index;
    if (!fs::exists(source_, ec))
      throw format_error("safetensors: " + path.string() + ": the directory has neither " + hf_weights_file + " nor " +
                         hf_weights_index + " (a model directory holds its weights in one of them)");
    json::Value root;
    const std::string text = sh::read_text(source_);
    try {
      root = json::parse(text);
    } catch (const json::parse_error& e) {
      sh::fail(source_, std::string("not a weight index: ") + e.what());
    }
    const json::Value* map = root.get("weight_map");
    if (!map || map->kind != json::Value::Kind::Object) sh::fail(source_, "not a weight index: no \"weight_map\" object");
    // the shards, each once, in the order the index first names them
    std::vector<std::string> shard_names;
    std::vector<std::size_t> shard_of(map->keys.size());
    std::map<std::string, std::size_t, std::less<>> shard_at;
    for (std::size_t i = 0; i < map->keys.size(); ++i) {
      const json::Value& f = map->items[i];
      const std::string& tensor = map->keys[i];
      if (f.kind != json::Value::Kind::String)
        sh::fail(source_, "weight_map[" + json::quote(tensor) + "] is not a file name");
      if (!sh::plain_file_name(f.string))
        sh::fail(source_, "tensor " + json::quote(tensor) + " is placed in " + json::quote(f.string) +
                              ", which is not a file name inside the directory");
      auto [it, added] = shard_at.try_emplace(f.string, shard_names.size());
      if (added) shard_names.push_back(f.string);
      shard_of[i] = it->second;
    }
    files_.reserve(shard_names.size());
    for (std::size_t s = 0; s < shard_names.size(); ++s) {
      const fs::path shard = path / shard_names[s];
      if (!fs::is_regular_file(shard, ec)) {
        std::string tensor;
        std::size_t count = 0;
        for (std::size_t i = 0; i < shard_of.size(); ++i)
          if (shard_of[i] == s && count++ == 0) tensor = map->keys[i];
        sh::fail(source_, "names shard " + shard_names[s] + " (for tensor " + json::quote(tensor) +
                              (count > 1 ? " and " + std::to_string(count - 1) + " more" : std::string()) + "), which is not in " +
                              path.string());
      }
      files_.emplace_back(shard);
    }
    // every tensor the index lists in its shard, and every tensor of every shard listed there
    const auto quote = [](std::string_view n) { return json::quote(n); };
    for (std::size_t i = 0; i < shard_of.size(); ++i)
      if (!files_[shard_of[i]].find(map->keys[i]))
        sh::fail(source_, "places tensor " + quote(map->keys[i]) + " in " + shard_names[shard_of[i]] + ", which does not hold it");
    std::map<std::string_view, std::size_t, std::less<>> listed;  // tensor -> shard, from the index
    for (std::size_t i = 0; i < shard_of.size(); ++i) listed.emplace(map->keys[i], shard_of[i]);
    for (std::size_t s = 0; s < files_.size(); ++s) {
      for (const TensorInfo& t : files_[s].tensors()) {
        const auto it = listed.find(t.name);
        if (it == listed.end())
          sh::fail(files_[s].path(), "holds tensor " + quote(t.name) + ", which " + hf_weights_index + " does not list");
        if (it->second != s)
          sh::fail(files_[s].path(), "holds tensor " + quote(t.name) + ", which " + hf_weights_index + " places in " +
                                         shard_names[it->second] + ", which holds it too (a tensor in two shards)");
        by_name_.emplace(t.name, Found{&files_[s], &t});
      }
    }
  }

  // The tensor called `name`, or {nullptr, nullptr}.
  Found find(std::string_view name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? Found{} : it->second;
  }
  std::size_t tensor_count() const { return by_name_.size(); }
  // The files read, each once: one, or the shards in the index's order.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // The .safetensors file, or the index.
  const std::filesystem::path& source() const { return source_; }

 private:
  void index_all() {
    for (const TensorInfo& t : files_[0].tensors()) by_name_.emplace(t.name, Found{&files_[0], &t});
  }

  std::vector<SafetensorsFile> files_;
  std::filesystem::path source_;
  std::map<std::string, Found, std::less<>> by_name_;
};

// The stored bytes a load converts at a time (TensorStream): with the
// values the trainer itself stages, all the memory reading a tensor adds.
inline constexpr std::size_t load_staging_bytes = std::size_t{16} << 20;

// Reads tensors of one file through one open stream, converted from F32,
// F16, BF16 or F64 to U (float or double) in chunks of at most `staging`
// stored bytes; a tensor stored as U is read straight into `out`. A value
// that is not finite stops the read with a format_error naming the tensor
// and the element.
class TensorStream {
 public:
  explicit TensorStream(const SafetensorsFile& file, std::size_t staging = load_staging_bytes)
      : file_(&file), in_(file.path(), std::ios::binary), staging_(staging) {
    if (!in_) detail::shards::fail(file.path(), "cannot open file");
  }

  const SafetensorsFile& file() const { return *file_; }

  template <class U>
  void read(const TensorInfo& t, std::span<U> out) {
    static_assert(std::is_same_v<U, float> || std::is_same_v<U, double>, "TensorStream::read: U is float or double");
    const std::uint64_t bytes = t.end - t.begin;
    const std::size_t width = static_cast<std::size_t>(size_of(t.dtype));
    if (!is_float(t.dtype))
      detail::shards::fail(file_->path(), "tensor '" + t.name + "': dtype " + std::string(detail::safetensors::dtype_name(t.dtype)) +
                                              " is not a floating-point type (F32, F16, BF16 or F64)");
    if (bytes != out.size() * width)
      throw std::invalid_argument("safetensors: " + file_->path().string() + ": reading tensor '" + t.name + "' (" +
                                  std::to_string(bytes) + " bytes) into " + std::to_string(out.size()) + " elements");
    in_.seekg(static_cast<std::streamoff>(file_->data_start() + t.begin));
    if ((t.dtype == DType::F32 && std::is_same_v<U, float>) || (t.dtype == DType::F64 && std::is_same_v<U, double>)) {
      get(t, out.data(), bytes);
    } else {
      const std::size_t per_chunk = std::max<std::size_t>(1, staging_ / width);
      buffer_.resize(std::min<std::size_t>(out.size(), per_chunk) * width);
      for (std::size_t i = 0; i < out.size(); i += per_chunk) {
        const std::size_t n = std::min(per_chunk, out.size() - i);
        get(t, buffer_.data(), n * width);
        detail::safetensors::convert(t.dtype, buffer_.data(), n, out.data() + i);
      }
    }
    for (std::size_t i = 0; i < out.size(); ++i)
      if (!std::isfinite(out[i]))
        detail::shards::fail(file_->path(), "tensor '" + t.name + "': element " + std::to_string(i) + " of " +
                                                detail::safetensors::shape_string(t.shape) + " is " + (std::isnan(out[i]) ? "NaN" : "infinite") +
                                                "; a weight must be finite (the load stopped there: the parameters read before it are loaded)");
  }

 private:
  void get(const TensorInfo& t, void* dst, std::uint64_t bytes) {
    if (bytes == 0) return;
    if (!in_ || !in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes)))
      detail::shards::fail(file_->path(), "file truncated while reading tensor '" + t.name + "'");
  }

  const SafetensorsFile* file_;
  std::ifstream in_;
  std::size_t staging_;
  std::vector<unsigned char> buffer_;
};

// Writes `tensors` into the model directory `dir` (created if missing) as
// model.safetensors or as shards of at most max_shard_size bytes with their
// index (see the top of this file). `writer` names the caller in errors.
// Returns the files written, in order.
inline std::vector<std::string> write_safetensors_shards(const std::filesystem::path& dir, const std::vector<TensorView>& tensors,
                                                         const std::map<std::string, std::string>& metadata,
                                                         std::uint64_t max_shard_size, std::string_view writer) {
  namespace fs = std::filesystem;
  namespace sh = detail::shards;
  if (max_shard_size == 0) throw std::invalid_argument(std::string(writer) + ": max_shard_size must be positive");
  auto bytes_of = [](const TensorView& t) {
    std::uint64_t n = static_cast<std::uint64_t>(size_of(t.dtype));
    for (std::int64_t d : t.shape) n *= static_cast<std::uint64_t>(d);
    return n;
  };
  // huggingface_hub's split
  std::vector<std::vector<std::size_t>> shards;
  std::vector<std::size_t> current;
  std::uint64_t current_size = 0, total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t b = bytes_of(tensors[i]);
    total += b;
    if (b > max_shard_size) {
      shards.push_back({i});
      continue;
    }
    if (current_size + b > max_shard_size && !current.empty()) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += b;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw overwrite_refused(std::string(writer) + ": " + dir.string() + " exists and is not a directory (nothing was written)");
  const bool sharded = shards.size() > 1;
  std::vector<std::string> names;
  if (sharded)
    for (std::size_t k = 0; k < shards.size(); ++k) names.push_back(sh::shard_name(k, shards.size()));
  else
    names.push_back(hf_weights_file);
  // Nothing is written unless every file to write or remove may be.
  for (const std::string& n : names) check_replaceable(dir / n, writer, "safetensors file", is_safetensors_file);
  const fs::path index = dir / hf_weights_index, single = dir / hf_weights_file;
  check_replaceable(index, writer, "safetensors weight index", sh::is_index);
  if (sharded) check_replaceable(single, writer, "safetensors file", is_safetensors_file);
  const std::vector<std::string> before = fs::exists(index, ec) ? sh::listed_shards(index) : std::vector<std::string>{};
  fs::create_directories(dir);

  for (std::size_t k = 0; k < shards.size(); ++k) {
    std::vector<TensorView> part;
    part.reserve(shards[k].size());
    for (std::size_t i : shards[k]) part.push_back(tensors[i]);
    write_safetensors(dir / names[k], part, metadata);
  }
  if (sharded) {
    std::vector<std::pair<std::string_view, std::size_t>> map;
    for (std::size_t k = 0; k < shards.size(); ++k)
      for (std::size_t i : shards[k]) map.emplace_back(tensors[i].name, k);
    std::sort(map.begin(), map.end());
    namespace json = detail::json;
    json::Writer w;  // as transformers writes it: {"metadata": {"total_size": n}, "weight_map": {tensor: file}}, indented
    w.begin_object(json::Layout::lines);
    w.key("metadata").begin_object(json::Layout::lines).key("total_size").integer(total).end();
    w.key("weight_map").begin_object(json::Layout::lines);
    for (const auto& [tensor, shard] : map) w.key(tensor).string(names[shard]);
    w.end().end();
    const std::string j = w.take() + "\n";
    write_durably(
        index, [&](std::ostream& out) { out.write(j.data(), static_cast<std::streamsize>(j.size())); },
        [&](const std::string& what) { sh::fail(index, what); });
  }
  // what a loader would read instead of what was just written, and old shards no index lists
  if (sharded) fs::remove(single, ec);
  else if (fs::exists(index, ec)) fs::remove(index, ec);
  for (const std::string& old : before)
    if (sh::is_shard_name(old) && std::find(names.begin(), names.end(), old) == names.end() && is_safetensors_file(dir / old))
      fs::remove(dir / old, ec);
  sync_path(dir);
  if (sharded) names.push_back(hf_weights_index);
  return names;
}

}  // namespace headroom::io
