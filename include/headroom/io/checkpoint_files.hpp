#pragma once
// The pieces of io/checkpoint.hpp's checkpoints (the format is described
// there): the run's signature, the trainer's image and its tensors, the
// files' records and trainer.json, the staged save and its swap, the checks
// of a load. checkpoint.hpp (one process) and sharded_checkpoint.hpp (one
// part per process) put them together.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "../plan/schedule.hpp"
#include "../train/loss_scaling.hpp"
#include "durable.hpp"
#include "safetensors.hpp"

#if defined(__linux__)
#include <fcntl.h>  // AT_FDCWD; renameat2 and RENAME_EXCHANGE come with <cstdio> (glibc >= 2.28)
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <sys/stat.h>  // lstat: who owns what a save left
#include <unistd.h>
#endif

namespace headroom::io {

// A checkpoint that is missing, incomplete, corrupt or another run's.
struct checkpoint_error : format_error {
  using format_error::format_error;
};

// What identifies the run a checkpoint belongs to: what it stores. Two runs
// whose parameters have the same paths, shapes and storage and whose
// optimizer keeps the same state read each other's checkpoints, whatever
// else differs (batch, sequence length, Workers<W>, checkpointing or
// offloading of activations: they change scratch and activations, never
// what is saved).
struct CheckpointSignature {
  std::string model;      // the model's kind: "Llama", "GPT2", ...
  std::string dtype;      // "f32", "f64"
  std::string optimizer;  // its name: "AdamW", "AdamW8bit", "SGD", "Lion"
  std::int64_t param_count = 0;
  // One line per parameter, in the schedule's order:
  //   "layers.0.self_attn.q_proj.weight: nf4 block 64 dq, shape (64, 64), master f32, state 8192 B"
  std::vector<std::string> parameters;
};

// How a parameter is stored, in words: "f32", "nf4 block 64 dq", "int8 block 64".
inline std::string storage_name(const QuantDesc& q, std::string_view dense_dtype) {
  switch (q.kind) {
    case QuantKind::none: return std::string(dense_dtype);
    case QuantKind::nf4: return "nf4 block " + std::to_string(q.block) + (q.double_quant ? " dq" : "");
    case QuantKind::int8: return "int8 block " + std::to_string(q.block);
    case QuantKind::int4: return "int4 block " + std::to_string(q.block);
  }
  return "?";
}

template <class Trainer>
CheckpointSignature checkpoint_signature() {
  CheckpointSignature s;
  s.model = std::string(Trainer::plan.nodes[0].kind);
  s.dtype = std::string(name_of(Trainer::config.dtype));  // the dense weights' storage: f32, f64, bf16 or f16
  s.optimizer = std::string(Trainer::config.optim.name);
  s.param_count = static_cast<std::int64_t>(Trainer::param_count);
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    std::string line = Trainer::path_of(p) + ": " + storage_name(p.quant, s.dtype) + ", shape (" + std::to_string(p.rows) +
                       ", " + std::to_string(p.cols) + ")";
    if (p.master >= 0) line += ", master f32";
    line += p.state >= 0 ? ", state " + std::to_string(Trainer::config.optim.state_bytes(p.elements())) + " B" : ", frozen";
    s.parameters.push_back(std::move(line));
  }
  return s;
}

namespace detail::checkpoint {

inline constexpr std::string_view format_name = "headroom-checkpoint";
// The version every save writes: 4, one process's checkpoint or a parallel
// run's (its "layout", a pair of files per rank).
inline constexpr std::int64_t format_version = 4;
// Version 1 identified a run by its plan's arena bytes (which change with the
// batch or Workers<W>); it is still read: its tensors are checked one by one.
inline constexpr std::int64_t oldest_version = 1;
// Version 2: one process's checkpoint signed by its parameters; version 3: a
// parallel run's. Version 4: either, its trainer.json ending in its own
// "checksum" (see trainer_json). Versions 1 to 3 carry no checksum and load
// as they did.
inline constexpr std::int64_t checksum_version = 4;
inline std::string layout_words(std::int64_t ranks, std::int64_t zero, std::int64_t tensor = 1, std::int64_t stages = 1) {
  if (ranks == 1 && tensor == 1 && stages == 1) return "one process";
  std::string w = stages == 1 ? std::string() : std::to_string(stages) + " pipeline stages";
  if (ranks > 1) w += (w.empty() ? "" : " x ") + std::to_string(ranks) + " data-parallel ranks with ZeRO " + std::to_string(zero);
  if (tensor > 1) w += (w.empty() ? "" : " x ") + std::to_string(tensor) + " tensor-parallel ranks";
  return w;
}
inline constexpr const char* model_file = "model.safetensors";
inline constexpr const char* optimizer_file = "optimizer.safetensors";
inline constexpr const char* trainer_file = "trainer.json";

// Test hook: called at named stages of save_checkpoint ("model.safetensors",
// "optimizer.safetensors", "trainer.json", "swap", "aside"; in a parallel
// run's save, "written" on every rank once its files are written, before rank
// 0 checks them); a hook that throws simulates a save interrupted there, one
// that changes the files what another file system would show.
inline std::function<void(std::string_view)>& test_hook() {
  static std::function<void(std::string_view)> hook;
  return hook;
}
// Test switch: swap by two renames even where RENAME_EXCHANGE exists.
inline bool& force_two_renames() {
  static bool force = false;
  return force;
}
inline void stage(std::string_view name) {
  if (auto& h = test_hook()) h(name);
}

[[noreturn]] inline void fail(const std::filesystem::path& where, const std::string& what) {
  throw checkpoint_error("checkpoint: " + where.string() + ": " + what);
}

inline std::filesystem::path normalized(const std::filesystem::path& dir) {
  std::filesystem::path d = dir.lexically_normal();
  if (d.has_parent_path() && d.filename().empty()) d = d.parent_path();
  if (d.empty() || d.filename() == "." || d.filename() == "..")
    throw std::invalid_argument("checkpoint: '" + dir.string() + "' cannot name a checkpoint directory");
  return d;
}
inline std::filesystem::path parent_of(const std::filesystem::path& d) {
  return d.has_parent_path() ? d.parent_path() : std::filesystem::path(".");
}
inline bool complete(const std::filesystem::path& d) {
  std::error_code ec;
  return std::filesystem::is_regular_file(d / trainer_file, ec);
}

// A save's own directories beside `d`: its staging directory
// "<d>.headroom-saving-<random>" and, while the two-rename swap runs, the old
// checkpoint set aside as "<d>.headroom-old-<random>" (io/durable.hpp's
// random names, each made by mkdir for this save alone).
inline constexpr std::string_view staging_marker = ".headroom-saving-";
inline constexpr std::string_view aside_marker = ".headroom-old-";

// Whether `name` is a file a save writes into its directory (or that file's
// temporary, io/durable.hpp): model / optimizer .safetensors, trainer.json,
// model.rank-<r> / optimizer.rank-<r> .safetensors.
inline bool is_saved_file_name(std::string_view name) {
  auto plain = [](std::string_view n) {
    if (n == model_file || n == optimizer_file || n == trainer_file) return true;
    for (const std::string_view kind : {std::string_view("model.rank-"), std::string_view("optimizer.rank-")}) {
      constexpr std::string_view tail = ".safetensors";
      if (n.size() <= kind.size() + tail.size() || n.substr(0, kind.size()) != kind || n.substr(n.size() - tail.size()) != tail)
        continue;
      const std::string_view r = n.substr(kind.size(), n.size() - kind.size() - tail.size());
      if (r.find_first_not_of("0123456789") == std::string_view::npos) return true;
    }
    return false;
  };
  if (plain(name)) return true;
  const std::size_t at = name.rfind(durable::temporary_marker);
  return at != std::string_view::npos && plain(name.substr(0, at)) &&
         durable::is_own_name(name, name.substr(0, at), durable::temporary_marker);
}

// The directories beside `d` that an interrupted save of `d` may have left
// under `marker` (staging_marker or aside_marker): named as a save names them,
// real directories (not links) holding nothing but files a save writes, and,
// unless `any_owner` (reading them), owned by this user. Anything else of a
// similar name is not a save's, and is never read, moved or removed.
inline std::vector<std::filesystem::path> left_by_saves(const std::filesystem::path& d, std::string_view marker,
                                                        bool any_owner = false) {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  const std::string stem = d.filename().string();
  std::error_code ec;
  for (fs::directory_iterator it(parent_of(d), ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    if (!durable::is_own_name(p.filename().string(), stem, marker) || !it->is_directory(ec) || it->is_symlink(ec)) continue;
#if defined(__unix__) || defined(__APPLE__)
    struct stat st {};
    if (!any_owner && (::lstat(p.c_str(), &st) != 0 || st.st_uid != ::geteuid())) continue;
#else
    (void)any_owner;
#endif
    bool own = true;
    std::error_code inner;
    for (fs::directory_iterator f(p, inner); own && !inner && f != end; f.increment(inner))
      own = is_saved_file_name(f->path().filename().string()) && f->symlink_status(inner).type() == fs::file_type::regular;
    if (own && !inner) out.push_back(p);
  }
  return out;
}

// Of `dirs`, the complete one (a trainer.json) written last, or none.
inline std::optional<std::filesystem::path> newest_complete(const std::vector<std::filesystem::path>& dirs) {
  std::optional<std::filesystem::path> best;
  std::filesystem::file_time_type when{};
  for (const auto& p : dirs) {
    std::error_code ec;
    if (!complete(p)) continue;
    const auto t = std::filesystem::last_write_time(p / trainer_file, ec);
    if (!ec && (!best || t > when)) best = p, when = t;
  }
  return best;
}

// Where the newest complete checkpoint of a missing `d` is, when a save
// was interrupted during its swap: its staging directory when complete,
// else the old checkpoint it had set aside. `any_owner`: see left_by_saves.
inline std::optional<std::filesystem::path> left_behind(const std::filesystem::path& d, bool any_owner = false) {
  if (auto staged = newest_complete(left_by_saves(d, staging_marker, any_owner))) return staged;
  return newest_complete(left_by_saves(d, aside_marker, any_owner));
}

// Whether `d` holds a headroom checkpoint: a trainer.json that says so.
inline bool is_checkpoint(const std::filesystem::path& d) {
  if (!complete(d)) return false;
  std::ifstream in(d / trainer_file, std::ios::binary);
  std::string head(256, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  return head.find("\"format\": \"headroom-checkpoint\"") != std::string::npos;
}

// save_checkpoint replaces only a missing path, an empty directory or a
// headroom checkpoint; anything else is refused before anything is touched.
inline void check_replaceable(const std::filesystem::path& d) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status s = fs::symlink_status(d, ec);
  if (!fs::exists(s)) return;
  const std::string head = "save_checkpoint: " + d.string();
  const std::string tail = "; refusing to replace it (nothing was written). Save to a new path, or remove it first";
  if (!fs::is_directory(s)) throw overwrite_refused(head + " exists and is not a directory" + tail);
  if (is_checkpoint(d) || fs::is_empty(d, ec)) return;
  throw overwrite_refused(head + " is a directory that holds no headroom checkpoint (no trainer.json of format "
                          "\"headroom-checkpoint\")" + tail);
}

// 64-bit hash of a file's bytes (a multiply-rotate mix of 8-byte words in
// the style of xxHash64, not xxHash64 itself), fed in chunks of 1 MiB:
// detects corruption and edits, not tampering (anyone can recompute it).
class Hash64 {
 public:
  static constexpr std::size_t chunk_bytes = std::size_t{1} << 20;
  // The next chunk: chunk_bytes bytes, or fewer for the last one.
  void chunk(const char* data, std::size_t got) {
    std::size_t i = 0;
    for (; i + 8 <= got; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, data + i, 8);
      h_ = rotl(h_ ^ rotl(w * p2, 31) * p1, 27) * p1 + p3;
    }
    for (; i < got; ++i) h_ = rotl(h_ ^ (static_cast<unsigned char>(data[i]) * p3), 11) * p1;
    total_ += got;
  }
  std::uint64_t bytes() const { return total_; }
  // 16 hex digits
  std::string hex() const {
    std::uint64_t h = h_ ^ total_;
    h ^= h >> 33;
    h *= p2;
    h ^= h >> 29;
    h *= p3;
    h ^= h >> 32;
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int k = 15; k >= 0; --k, h >>= 4) s[static_cast<std::size_t>(k)] = digits[h & 15];
    return s;
  }

 private:
  static constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ull, p2 = 0xC2B2AE3D27D4EB4Full, p3 = 0x165667B19E3779F9ull;
  static std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  std::uint64_t h_ = p3, total_ = 0;
};

inline std::string file_hash(const std::filesystem::path& path, std::uint64_t* size = nullptr) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file");
  Hash64 h;
  std::vector<char> buf(Hash64::chunk_bytes);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.chunk(buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) fail(path, "read error");
  if (size) *size = h.bytes();
  return h.hex();
}

// file_hash of a file holding `text`.
inline std::string text_hash(std::string_view text) {
  Hash64 h;
  for (std::size_t at = 0; at < text.size(); at += Hash64::chunk_bytes)
    h.chunk(text.data() + at, std::min(Hash64::chunk_bytes, text.size() - at));
  return h.hex();
}

// trainer.json's last member (version 4 on): "checksum", the text_hash of
// the whole text with the checksum's own 16 digits written as zeros. Any
// edit of the file (a step count, an option, the caller's extra object)
// shows as a checksum that does not match.
inline constexpr std::string_view checksum_key = "checksum";
inline constexpr std::string_view checksum_zeros = "0000000000000000";
// The text with its checksum's digits, which are at [at, at + 16), zeroed.
inline std::string checksum_of(std::string text, std::size_t at) {
  text.replace(at, checksum_zeros.size(), checksum_zeros);
  return text_hash(text);
}
// `text`, whose last member is "checksum" (any 16 characters), with its
// checksum computed: what save_checkpoint writes. Tests reseal a
// trainer.json they edit with it, to reach the checks past the checksum.
inline std::string seal(std::string text) {
  const std::string key = "\"" + std::string(checksum_key) + "\": \"";
  const std::size_t found = text.rfind(key), at = found + key.size();
  if (found == std::string::npos || at + checksum_zeros.size() > text.size())
    throw std::invalid_argument("checkpoint: seal: the text has no \"checksum\" member");
  text.replace(at, checksum_zeros.size(), checksum_of(text, at));
  return text;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// What a checkpoint holds of a trainer, in host memory: where each
// parameter's stored values (or quantized codes and scales), f32 master
// copy and optimizer state are, and the model's shared tables. For
// host::Trainer that is its arenas themselves (ArenaImage). A trainer whose
// state lives elsewhere gives a copy in host memory instead,
// `t.checkpoint_image()` (cuda::Trainer: device memory and pinned host
// memory), and takes it back after a load, `t.restore_checkpoint_image(image)`.
template <class Trainer>
struct ArenaImage {
  const Trainer& t;
  const void* weight(const ParamSlot& p) const { return t.weight(p); }
  const std::uint8_t* codes(const ParamSlot& p) const { return t.quant(p).codes; }
  const std::uint8_t* scales(const ParamSlot& p) const { return t.quant(p).scales; }
  const float* master(const ParamSlot& p) const { return t.states_arena().template at<float>(p.master); }
  const std::byte* state(const ParamSlot& p) const { return t.state(p); }
  const std::byte* quant_table() const { return t.arena(Tier::device).template at<std::byte>(Trainer::sched.quant_table); }
  const std::byte* optim_table() const { return t.states_arena().template at<std::byte>(Trainer::sched.optim_table); }
};
template <class Trainer>
auto image_of(const Trainer& t) {
  if constexpr (requires { t.checkpoint_image(); }) return t.checkpoint_image();
  else return ArenaImage<Trainer>{t};
}
// After a load into the image: the trainer takes it back (nothing to do for its own arenas).
template <class Trainer, class Image>
void restore_image(Trainer& t, const Image& image) {
  if constexpr (requires { t.restore_checkpoint_image(image); }) t.restore_checkpoint_image(image);
}

// The tensors of model.safetensors and optimizer.safetensors, pointing into
// the trainer's image (above).
// `masters`: with the f32 master weights, whole (ZeRO 1-3 shard them: optimizer_tensors).
template <class Trainer, class Image>
std::vector<TensorView> model_tensors(const Image& t, bool masters = true) {
  constexpr DType dt = Trainer::config.dtype;
  std::vector<TensorView> v;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    const std::string path = Trainer::path_of(p);
    if (p.quant.kind == QuantKind::none) {
      v.push_back(TensorView{path, dt, {p.rows, p.cols}, t.weight(p)});
    } else {
      v.push_back(TensorView{path, DType::U8, {p.quant.code_bytes(p.elements())}, t.codes(p)});
      v.push_back(TensorView{path + ".scales", DType::U8, {p.quant.scale_bytes(p.elements())}, t.scales(p)});
    }
    if (masters && p.master >= 0) v.push_back(TensorView{path + ".master", DType::F32, {p.rows, p.cols}, t.master(p)});
  }
  return v;
}

// Each trainable parameter's optimizer state over elements(p) of its
// elements (all of them; or a data-parallel rank's shard, none where it
// holds none) and with `masters` its master weights of those elements
// ("<path>.master", F32, 1-D), then the model's shared code tables.
template <class Trainer, class Image, class Elements>
std::vector<TensorView> optimizer_tensors(const Image& t, Elements elements, bool masters = false) {
  std::vector<TensorView> v;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    const std::int64_t n = elements(p);
    if (n == 0) continue;
    if (p.state >= 0) v.push_back(TensorView{Trainer::path_of(p), DType::U8, {Trainer::config.optim.state_bytes(n)}, t.state(p)});
    if (masters && p.master >= 0) v.push_back(TensorView{Trainer::path_of(p) + ".master", DType::F32, {n}, t.master(p)});
  }
  if (Trainer::sched.quant_table >= 0)
    v.push_back(TensorView{"__quant_table__", DType::U8, {Trainer::sched.quant_table_bytes()}, t.quant_table()});
  if (Trainer::sched.optim_table >= 0)
    v.push_back(TensorView{"__optim_table__", DType::U8, {Trainer::config.optim.table_bytes()}, t.optim_table()});
  return v;
}
template <class Trainer, class Image>
std::vector<TensorView> optimizer_tensors(const Image& t) {
  return optimizer_tensors<Trainer>(t, [](const ParamSlot& p) { return p.elements(); });
}

// A checkpoint never holds a NaN or an infinity in a dense weight or master
// copy: an update that overflowed (a learning rate far too large) must not
// replace the last good checkpoint. One pass over the weights, before
// anything is written.
inline void check_finite(const std::filesystem::path& d, const std::vector<TensorView>& model, int steps_done) {
  auto first_bad = [](const auto* x, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i)
      if (!std::isfinite(x[i])) return i;
    return std::int64_t{-1};
  };
  for (const TensorView& v : model) {
    if (v.dtype != DType::F32 && v.dtype != DType::F64) continue;
    std::int64_t n = 1;
    for (const std::int64_t x : v.shape) n *= x;
    const std::int64_t i = v.dtype == DType::F32 ? first_bad(static_cast<const float*>(v.data), n)
                                                 : first_bad(static_cast<const double*>(v.data), n);
    if (i < 0) continue;
    const double x = v.dtype == DType::F32 ? static_cast<const float*>(v.data)[i] : static_cast<const double*>(v.data)[i];
    const std::string at = v.shape.size() == 2 ? std::to_string(i / v.shape[1]) + ", " + std::to_string(i % v.shape[1])
                                               : std::to_string(i);  // a 1-D shard (ZeRO 3)
    fail(d, "not saved: after step " + std::to_string(steps_done) + ", " + v.name + " holds " + std::to_string(x) + " at [" + at +
                "] (the update overflowed; lower the learning rate); the checkpoint there, if any, is left as it was");
  }
}

// Moves whatever an interrupted save left next to `d` into a consistent
// state: a complete staged checkpoint whose swap did not finish becomes `d`
// (or the old one comes back), and the rest of what saves left is removed
// (left_by_saves: only directories a save could have made).
inline void recover(const std::filesystem::path& d) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(d, ec))) {
    if (const auto found = left_behind(d)) fs::rename(*found, d);
  }
  for (const fs::path& p : left_by_saves(d, staging_marker)) fs::remove_all(p, ec);
  if (fs::exists(fs::symlink_status(d, ec)))
    for (const fs::path& p : left_by_saves(d, aside_marker)) fs::remove_all(p, ec);
}

// Swaps the complete directory `staging` in as `d`.
inline void swap_in(const std::filesystem::path& staging, const std::filesystem::path& d) {
  namespace fs = std::filesystem;
  const fs::path parent = parent_of(d);
  std::error_code ec;
  if (!fs::exists(d)) {
    fs::rename(staging, d);
    sync_path(parent);
    return;
  }
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (!force_two_renames() && ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, d.c_str(), RENAME_EXCHANGE) == 0) {
    sync_path(parent);
    fs::remove_all(staging, ec);  // now the old checkpoint
    return;
  }
#endif
  // the old one aside, over an empty directory made for it (so nothing of
  // that name is replaced but what this save made)
  const fs::path aside = durable::create_own_directory(d, aside_marker);
  try {
    fs::rename(d, aside);
  } catch (...) {
    fs::remove(aside, ec);
    throw;
  }
  try {
    stage("aside");
    fs::rename(staging, d);
  } catch (...) {
    fs::rename(aside, d, ec);  // put the old one back
    throw;
  }
  sync_path(parent);
  fs::remove_all(aside, ec);
}

}  // namespace detail::checkpoint

namespace detail::checkpoint {

// extra_json as save_checkpoint stores it: "{}" when empty, else a JSON object.
inline std::string checked_extra(std::string_view extra_json) {
  namespace js = detail::json;
  std::string extra(extra_json);
  if (extra.find_first_not_of(" \t\r\n") == std::string::npos) extra = "{}";
  try {
    if (js::parse(extra).kind != js::Value::Kind::Object) throw std::runtime_error("not an object");
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(std::string("save_checkpoint: extra_json must be a JSON object (") + e.what() + ")");
  }
  return extra;
}

// A written file as trainer.json records it.
struct FileRecord {
  std::string name;
  std::uint64_t bytes = 0;
  std::string hash;
};
inline FileRecord record(const std::filesystem::path& dir, const std::string& name) {
  FileRecord r{name, 0, {}};
  r.hash = file_hash(dir / name, &r.bytes);
  return r;
}

// trainer.json: the run's signature, the files, the options, the caller's
// extra object; `layout` (a data-parallel run's, else empty) and the
// version that goes with it.
template <class Trainer>
std::string trainer_json(const Trainer& t, const std::vector<FileRecord>& files, const std::string& extra, std::int64_t version,
                         const std::string& layout) {
  namespace js = detail::json;
  const CheckpointSignature s = checkpoint_signature<Trainer>();
  const auto& o = t.options();
  js::Writer w;  // one member a line; the small objects on the line of their key
  w.begin_object(js::Layout::lines);
  w.key("format").string(format_name);
  w.key("version").integer(version);
  w.key("steps_done").integer(t.steps_done());
  if (t.scales_loss()) {  // the loss scaler's state (train/loss_scaling.hpp); the scale's shortest round-trip decimal
    const LossScaleState& ls = t.loss_scale_state();
    w.key("loss_scale").begin_object();
    w.key("scale").number(static_cast<double>(ls.scale));
    w.key("growth_tracker").integer(ls.growth_tracker).key("skipped").integer(ls.skipped).end();
  }
  if (!layout.empty()) w.key("layout").raw(layout);
  w.key("signature").begin_object();
  w.key("model").string(s.model).key("dtype").string(s.dtype).key("optimizer").string(s.optimizer);
  w.key("param_count").integer(s.param_count);
  w.break_line().key("parameters").begin_array();  // one name a line
  for (const std::string& p : s.parameters) w.break_line().string(p);
  w.end().end();
  w.key("files").begin_object();
  for (const FileRecord& f : files) w.key(f.name).begin_object().key("bytes").integer(f.bytes).key("hash").string(f.hash).end();
  w.end();
  w.key("options").begin_object();
  w.key("seed").integer(o.seed).key("lr").number(o.lr).key("min_lr_ratio").number(o.min_lr_ratio);
  w.key("warmup_steps").integer(o.warmup_steps).key("total_steps").integer(o.total_steps);
  w.key("clip_norm").number(o.clip_norm);
  w.end();
  w.key("extra").raw(extra);
  w.key(checksum_key).string(checksum_zeros);  // last: seal() finds it from the end
  w.end();
  std::string j = w.take() + "\n";
  return seal(std::move(j));
}

// Writes trainer.json into `staging` (an fsync'ed temporary, renamed: its
// presence marks the checkpoint complete) and swaps the directory in as `d`.
inline void finish_save(const std::filesystem::path& staging, const std::filesystem::path& d, const std::string& json) {
  stage(trainer_file);
  write_durably(
      staging / trainer_file, [&](std::ostream& out) { out.write(json.data(), static_cast<std::streamsize>(json.size())); },
      [&](const std::string& what) { fail(staging / trainer_file, what); });
  stage("swap");
  swap_in(staging, d);
}

// A checkpoint directory opened for loading: where it is (an interrupted
// swap may have left the newest complete one in a sibling), trainer.json's
// text and parsed root, its version and step count; the signature checked
// against the trainer's.
struct Opened {
  std::filesystem::path dir;
  std::string text;
  detail::json::Value root;
  std::int64_t version = 0;
  std::int64_t steps = 0;
  std::filesystem::path trainer_json() const { return dir / trainer_file; }
};

inline const detail::json::Value& member(const Opened& o, const detail::json::Value& obj, std::string_view key,
                                         detail::json::Value::Kind kind, std::string_view where) {
  const detail::json::Value* v = obj.get(key);
  if (!v || v->kind != kind)
    fail(o.trainer_json(), "corrupt: " + std::string(where) + "\"" + std::string(key) + "\" is missing or has the wrong type");
  return *v;
}
inline std::int64_t integer(const Opened& o, const detail::json::Value& obj, std::string_view key, std::string_view where) {
  const auto v = member(o, obj, key, detail::json::Value::Kind::Number, where).integer();
  if (!v) fail(o.trainer_json(), "corrupt: " + std::string(where) + "\"" + std::string(key) + "\" is not an integer");
  return *v;
}

// The loss scaler's state into a trainer that scales its loss. A checkpoint
// without one (an unscaled run's) leaves the scaler at its init_scale, as
// PyTorch's GradScaler without a saved state_dict; a run that does not
// scale ignores a saved one.
template <class Trainer>
void restore_loss_scale(const Opened& o, Trainer& t) {
  const detail::json::Value* v = o.root.get("loss_scale");
  if (v == nullptr || !t.scales_loss()) return;
  if (v->kind != detail::json::Value::Kind::Object) fail(o.trainer_json(), "corrupt: \"loss_scale\" is not an object");
  LossScaleState s;
  s.scale = static_cast<float>(member(o, *v, "scale", detail::json::Value::Kind::Number, "loss_scale.").number);
  const std::int64_t tracker = integer(o, *v, "growth_tracker", "loss_scale.");
  if (tracker < 0 || tracker > std::numeric_limits<std::int32_t>::max())
    fail(o.trainer_json(), "corrupt: loss_scale.\"growth_tracker\" out of range");
  s.growth_tracker = static_cast<std::int32_t>(tracker);
  s.skipped = integer(o, *v, "skipped", "loss_scale.");
  try {
    t.set_loss_scale_state(s);
  } catch (const std::invalid_argument& e) {
    fail(o.trainer_json(), std::string("corrupt: \"loss_scale\": ") + e.what());
  }
}

template <class Trainer>
Opened open_checkpoint(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  namespace js = detail::json;
  Opened o;
  const fs::path named = normalized(dir);
  o.dir = named;
  if (!fs::exists(named)) {
    const auto found = left_behind(named, true);  // what a save interrupted during its swap left (read only)
    if (!found) fail(named, "no such checkpoint directory");
    o.dir = *found;
  }
  if (!fs::is_regular_file(o.trainer_json())) fail(o.dir, "trainer.json not found: not a checkpoint directory, or an incomplete one");
  o.text = read_text(o.trainer_json());
  try {
    o.root = js::parse(o.text);
  } catch (const std::runtime_error& e) {
    fail(o.trainer_json(), std::string("corrupt: ") + e.what());
  }
  if (o.root.kind != js::Value::Kind::Object) fail(o.trainer_json(), "corrupt: not a JSON object");
  if (member(o, o.root, "format", js::Value::Kind::String, "").string != format_name)
    fail(o.trainer_json(), "not a headroom checkpoint (\"format\" is not \"headroom-checkpoint\")");
  o.version = integer(o, o.root, "version", "");
  if (o.version < oldest_version || o.version > format_version)
    fail(o.trainer_json(), "checkpoint format version " + std::to_string(o.version) + ", this build reads versions " +
                               std::to_string(oldest_version) + " to " + std::to_string(format_version));
  if (o.version >= checksum_version) {  // versions 1 to 3 have none
    const js::Value& sum = member(o, o.root, checksum_key, js::Value::Kind::String, "");
    if (sum.string.size() != checksum_zeros.size() || sum.end - sum.begin != checksum_zeros.size() + 2)
      fail(o.trainer_json(), "corrupt: \"checksum\" is not 16 hex digits");
    const std::string got = checksum_of(o.text, sum.begin + 1);
    if (got != sum.string)
      fail(o.trainer_json(), "edited or corrupt: its text hashes to " + got + ", its \"checksum\" records " + sum.string +
                                 "; a checkpoint's trainer.json is written by save_checkpoint alone (nothing was loaded)");
  }
  o.steps = integer(o, o.root, "steps_done", "");
  if (o.steps < 0 || o.steps >= std::numeric_limits<int>::max())  // the next step must be countable
    fail(o.trainer_json(), "corrupt: \"steps_done\" is " + std::to_string(o.steps) + ", outside 0 to " +
                               std::to_string(std::numeric_limits<int>::max() - 1));

  const js::Value& sig = member(o, o.root, "signature", js::Value::Kind::Object, "");
  const CheckpointSignature mine = checkpoint_signature<Trainer>();
  std::string diff;
  auto differs = [&](std::string_view what, const std::string& theirs, const std::string& ours) {
    if (theirs != ours) diff += (diff.empty() ? "" : "; ") + std::string(what) + " " + theirs + " in the checkpoint, " + ours + " in this trainer";
  };
  differs("model", member(o, sig, "model", js::Value::Kind::String, "signature.").string, mine.model);
  differs("dtype", member(o, sig, "dtype", js::Value::Kind::String, "signature.").string, mine.dtype);
  differs("optimizer", member(o, sig, "optimizer", js::Value::Kind::String, "signature.").string, mine.optimizer);
  // (a pipeline stage's parameters are its own: the signature holds the first
  // stage's; every stage checks its files' tensors against its parameters)
  if constexpr (Trainer::config.pp == 1)
    differs("parameter count", std::to_string(integer(o, sig, "param_count", "signature.")), std::to_string(mine.param_count));
  if (o.version >= 2 && Trainer::config.pp == 1) {  // the first parameter stored otherwise
    const auto& theirs = member(o, sig, "parameters", js::Value::Kind::Array, "signature.").items;
    for (std::size_t k = 0; k < std::min(theirs.size(), mine.parameters.size()); ++k) {
      if (theirs[k].kind != js::Value::Kind::String) fail(o.trainer_json(), "corrupt: signature.\"parameters\" holds a non-string");
      if (theirs[k].string != mine.parameters[k]) {
        differs("parameter " + std::to_string(k), "'" + theirs[k].string + "'", "'" + mine.parameters[k] + "'");
        break;
      }
    }
  }
  // the parallel layout: one process (no "layout"), or N data-parallel ranks
  // at a ZeRO stage, of M tensor-parallel ranks each (no "tensor_parallel": 1)
  std::int64_t ranks = 1, zero = 0, tensor = 1, stages = 1;
  if (const js::Value* l = o.root.get("layout")) {
    if (l->kind != js::Value::Kind::Object) fail(o.trainer_json(), "corrupt: \"layout\" is not an object");
    ranks = integer(o, *l, "data_parallel", "layout.");
    zero = integer(o, *l, "zero", "layout.");
    if (l->get("tensor_parallel") != nullptr) tensor = integer(o, *l, "tensor_parallel", "layout.");
    if (l->get("pipeline_parallel") != nullptr) stages = integer(o, *l, "pipeline_parallel", "layout.");
  }
  differs("layout", layout_words(ranks, zero, tensor, stages),
          layout_words(Trainer::config.dp, Trainer::config.zero, Trainer::config.tp, Trainer::config.pp));
  if (!diff.empty()) fail(o.dir, "belongs to another run (" + diff + "); save_pretrained / load_pretrained move weights between runs");
  return o;
}

// Each named file present, of the size and hash trainer.json recorded.
inline void check_files(const Opened& o, const std::vector<std::string>& names) {
  namespace fs = std::filesystem;
  const detail::json::Value& files = member(o, o.root, "files", detail::json::Value::Kind::Object, "");
  for (const std::string& f : names) {
    const fs::path path = o.dir / f;
    if (!fs::is_regular_file(path)) fail(o.dir, f + " is missing");
    const detail::json::Value& rec = member(o, files, f, detail::json::Value::Kind::Object, "files.");
    const auto bytes = integer(o, rec, "bytes", "files.");
    const std::string& want = member(o, rec, "hash", detail::json::Value::Kind::String, "files.").string;
    std::uint64_t got_bytes = 0;
    const std::string got = file_hash(path, &got_bytes);
    if (static_cast<std::int64_t>(got_bytes) != bytes)
      fail(path, "corrupt or truncated: " + std::to_string(got_bytes) + " bytes, trainer.json recorded " + std::to_string(bytes));
    if (got != want) fail(path, "corrupt: its contents hash to " + got + ", trainer.json recorded " + want);
  }
}

// Every view present in the file with its dtype and shape, and no other tensor.
inline void expect_exactly(const SafetensorsFile& f, const std::vector<TensorView>& views) {
  for (const TensorView& v : views) f.expect(v.name, v.dtype, v.shape);
  if (f.tensors().size() != views.size())
    throw checkpoint_error("safetensors: " + f.path().string() + ": holds " + std::to_string(f.tensors().size()) +
                           " tensors, this trainer has " + std::to_string(views.size()));
}
inline void read_all(const SafetensorsFile& f, const std::vector<TensorView>& views) {
  for (const TensorView& v : views) {
    std::int64_t n = size_of(v.dtype);
    for (const std::int64_t x : v.shape) n *= x;
    f.read(v.name, const_cast<void*>(v.data), static_cast<std::size_t>(n));
  }
}

inline std::string extra_of(const Opened& o) {
  const detail::json::Value& extra = member(o, o.root, "extra", detail::json::Value::Kind::Object, "");
  return o.text.substr(extra.begin, extra.end - extra.begin);
}

}  // namespace detail::checkpoint

}  // namespace headroom::io
