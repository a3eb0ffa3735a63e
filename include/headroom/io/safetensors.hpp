#pragma once
// The safetensors checkpoint format (Hugging Face), read and written on the host.
//
// Layout of a file:
//   [0, 8)          u64 little-endian N: length of the JSON header
//   [8, 8 + N)      UTF-8 JSON object: name -> {"dtype", "shape", "data_offsets": [begin, end]}
//                   plus an optional "__metadata__": {string: string}
//   [8 + N, size)   data buffer; offsets are relative to its first byte, and the
//                   tensors cover it contiguously, without holes or overlaps.
//
// SafetensorsFile validates the whole header when opened and reads tensor data on
// demand. write_safetensors writes through `path + ".tmp"` and renames over `path`,
// so an interrupted save never leaves a broken file behind.
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "json_string.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <unistd.h>
#endif

#include "../core/dtype.hpp"

namespace headroom::io {

// Any problem with a safetensors file; the message names the file and the problem.
struct format_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin;  // byte offsets into the data buffer, [begin, end)
  std::uint64_t end;
};

// One tensor to write: `data` points at product(shape) * size_of(dtype) bytes.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  const void* data;
};

namespace detail::safetensors {

// Headers beyond this size are refused (the reference implementation uses 100 MB).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
inline constexpr std::size_t max_json_depth = 64;

// safetensors dtype spelling <-> DType.
inline std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "F64") return DType::F64;
  if (s == "I32") return DType::I32;
  if (s == "I8") return DType::I8;
  if (s == "U8") return DType::U8;
  return std::nullopt;
}

// Valid safetensors dtypes that headroom has no DType for.
inline bool known_unsupported_dtype(std::string_view s) {
  constexpr std::string_view names[] = {"BOOL", "I16", "U16", "U32", "I64", "U64",
                                        "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4",
                                        "F6_E2M3", "F6_E3M2", "C64"};
  for (auto n : names)
    if (s == n) return true;
  return false;
}

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
  }
  return "?";
}

inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// a * b, or nullopt on u64 overflow.
inline std::optional<std::uint64_t> mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

// ---------------------------------------------------------------------------
// A strict JSON parser for the subset safetensors headers use: objects, arrays,
// strings (with escapes), non-negative integers. Anything else is rejected.
// ---------------------------------------------------------------------------
struct Json {
  enum class Kind : std::uint8_t { Object, Array, String, Integer };
  Kind kind = Kind::Integer;
  std::uint64_t integer = 0;
  std::string string;
  std::vector<std::string> keys;  // Object: keys[i] -> items[i], in source order
  std::vector<Json> items;        // Object values or Array elements
};

inline std::string_view kind_name(Json::Kind k) {
  switch (k) {
    case Json::Kind::Object: return "an object";
    case Json::Kind::Array: return "an array";
    case Json::Kind::String: return "a string";
    case Json::Kind::Integer: return "an integer";
  }
  return "?";
}

// Decodes the JSON string literal starting at text[pos] (a '"'), escapes
// included, and moves pos past it; errors throw std::runtime_error("<what> at
// byte N: ...").
inline std::string decode_json_string(std::string_view text, std::size_t& pos, std::string_view what) {
  return io::detail::decode_json_string(text, pos, [&](const std::string& why) {
    throw std::runtime_error(std::string(what) + " at byte " + std::to_string(pos) + ": " + why);
  });
}

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : text_(text) {}

  // Parses the whole text as one value; trailing whitespace is allowed (headers
  // are padded with spaces), anything else after the value is an error.
  Json parse_document() {
    skip_ws();
    Json v = parse_value(0);
    skip_ws();
    if (pos_ != text_.size()) fail("unexpected trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON header at byte " + std::to_string(pos_) + ": " + what);
  }

  void skip_ws() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  char peek() const {
    if (pos_ >= text_.size()) fail("unexpected end of header");
    return text_[pos_];
  }

  void expect_char(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  Json parse_value(std::size_t depth) {
    if (depth > max_json_depth) fail("nesting too deep");
    const char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      Json v;
      v.kind = Json::Kind::String;
      v.string = parse_string();
      return v;
    }
    if (c >= '0' && c <= '9') return parse_integer();
    if (c == '-') fail("negative numbers are not allowed");
    fail(std::string("unexpected character '") + c + "'");
  }

  Json parse_object(std::size_t depth) {
    Json v;
    v.kind = Json::Kind::Object;
    expect_char('{');
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      for (const auto& k : v.keys)
        if (k == key) fail("duplicate key \"" + key + "\"");
      skip_ws();
      expect_char(':');
      skip_ws();
      v.keys.push_back(std::move(key));
      v.items.push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect_char('}');
      return v;
    }
  }

  Json parse_array(std::size_t depth) {
    Json v;
    v.kind = Json::Kind::Array;
    expect_char('[');
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_ws();
      v.items.push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect_char(']');
      return v;
    }
  }

  Json parse_integer() {
    Json v;
    v.kind = Json::Kind::Integer;
    const std::size_t start = pos_;
    std::uint64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto digit = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) fail("integer too large");
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ - start > 1 && text_[start] == '0') fail("leading zeros are not allowed");
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      fail("only non-negative integers are allowed");
    v.integer = value;
    return v;
  }

  std::string parse_string() { return decode_json_string(text_, pos_, "invalid JSON header"); }

  std::string_view text_;
  std::size_t pos_ = 0;
};

// JSON string literal for `s` (quotes, backslashes and control characters escaped).
inline std::string json_quote(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (u < 0x20) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 0xF];
    } else out += c;
  }
  return out + "\"";
}

[[noreturn]] inline void write_fail(const std::filesystem::path& path, const std::string& what) {
  throw format_error("safetensors: " + path.string() + ": " + what);
}

inline std::uint64_t load_u64_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline void store_u64_le(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace detail::safetensors

// An opened, validated safetensors file. Only the header is held in memory;
// tensor data is read on demand.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::filesystem::path path) : path_(std::move(path)) {
    namespace st = detail::safetensors;
    std::error_code ec;
    const std::uintmax_t file_size = std::filesystem::file_size(path_, ec);
    if (ec) fail("cannot open file: " + ec.message());
    std::ifstream in(path_, std::ios::binary);
    if (!in) fail("cannot open file");
    if (file_size < 8)
      fail("file too short (" + std::to_string(file_size) + " bytes) to hold the 8-byte header length");

    unsigned char len_bytes[8];
    if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) fail("cannot read the header length");
    const std::uint64_t n = st::load_u64_le(len_bytes);
    if (n > file_size - 8)
      fail("header length " + std::to_string(n) + " exceeds the file size (" + std::to_string(file_size) +
           " bytes): file too short or corrupt");
    if (n > st::max_header_bytes)
      fail("header length " + std::to_string(n) + " exceeds the limit of " +
           std::to_string(st::max_header_bytes) + " bytes");
    data_start_ = 8 + n;
    const std::uint64_t data_size = file_size - data_start_;

    std::string text(static_cast<std::size_t>(n), '\0');
    if (n > 0 && !in.read(text.data(), static_cast<std::streamsize>(n)))
      fail("file too short: cannot read the " + std::to_string(n) + "-byte header");

    st::Json root;
    try {
      root = st::JsonParser(text).parse_document();
    } catch (const std::runtime_error& e) {
      fail(e.what());
    }
    if (root.kind != st::Json::Kind::Object) fail("header is not a JSON object");

    for (std::size_t i = 0; i < root.keys.size(); ++i) {
      const std::string& name = root.keys[i];
      const st::Json& entry = root.items[i];
      if (name == "__metadata__") {
        parse_metadata(entry);
        continue;
      }
      tensors_.push_back(parse_tensor(name, entry, data_size));
    }

    // The data buffer must be covered exactly: sorted by offset, each tensor
    // starts where the previous one ended, and the last ends at the file's end.
    std::stable_sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t cursor = 0;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo& t : tensors_) {
      if (t.begin < cursor)
        fail("tensor '" + t.name + "' data [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             ") overlaps tensor '" + (prev ? prev->name : std::string()) + "' which ends at " +
             std::to_string(cursor));
      if (t.begin > cursor)
        fail("hole in the data buffer: bytes [" + std::to_string(cursor) + ", " + std::to_string(t.begin) +
             ") before tensor '" + t.name + "' belong to no tensor");
      cursor = t.end;
      prev = &t;
    }
    if (cursor != data_size)
      fail("hole in the data buffer: bytes [" + std::to_string(cursor) + ", " + std::to_string(data_size) +
           ") at the end of the file belong to no tensor");
  }

  const std::filesystem::path& path() const { return path_; }

  // Tensors in file (data offset) order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const {
    for (const TensorInfo& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }

  // The tensor called `name`, checked against the dtype and shape the caller
  // needs; throws format_error naming the tensor and every difference.
  const TensorInfo& expect(std::string_view name, DType dtype, const std::vector<std::int64_t>& shape) const {
    namespace st = detail::safetensors;
    const TensorInfo* t = find(name);
    if (!t)
      fail("tensor '" + std::string(name) + "' not found (the file has " + std::to_string(tensors_.size()) +
           " tensors)");
    std::string problems;
    if (t->dtype != dtype)
      problems += "dtype is " + std::string(st::dtype_name(t->dtype)) + ", expected " +
                  std::string(st::dtype_name(dtype));
    if (t->shape != shape) {
      if (!problems.empty()) problems += "; ";
      problems += "shape is " + st::shape_string(t->shape) + ", expected " + st::shape_string(shape);
    }
    if (!problems.empty()) fail("tensor '" + t->name + "': " + problems);
    return *t;
  }

  // Copies the data of tensor `name` into dst, which holds `bytes` bytes; `bytes`
  // must equal the tensor's size.
  void read(std::string_view name, void* dst, std::size_t bytes) const {
    const TensorInfo* t = find(name);
    if (!t) fail("tensor '" + std::string(name) + "' not found");
    const std::uint64_t size = t->end - t->begin;
    if (bytes != size)
      throw std::invalid_argument("safetensors: " + path_.string() + ": reading tensor '" + t->name + "' (" +
                                  std::to_string(size) + " bytes) into a buffer of " + std::to_string(bytes) +
                                  " bytes");
    if (size == 0) return;
    std::ifstream in(path_, std::ios::binary);
    if (!in) fail("cannot open file to read tensor '" + t->name + "'");
    in.seekg(static_cast<std::streamoff>(data_start_ + t->begin));
    if (!in || !in.read(static_cast<char*>(dst), static_cast<std::streamsize>(size)))
      fail("file truncated while reading tensor '" + t->name + "'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw format_error("safetensors: " + path_.string() + ": " + what);
  }

  void parse_metadata(const detail::safetensors::Json& entry) {
    using Kind = detail::safetensors::Json::Kind;
    if (entry.kind != Kind::Object) fail("\"__metadata__\" is not an object");
    for (std::size_t i = 0; i < entry.keys.size(); ++i) {
      if (entry.items[i].kind != Kind::String)
        fail("\"__metadata__\" value for key '" + entry.keys[i] + "' is not a string");
      metadata_.emplace(entry.keys[i], entry.items[i].string);
    }
  }

  TensorInfo parse_tensor(const std::string& name, const detail::safetensors::Json& entry,
                          std::uint64_t data_size) const {
    namespace st = detail::safetensors;
    using Kind = st::Json::Kind;
    for (const TensorInfo& t : tensors_)
      if (t.name == name) fail("duplicate tensor name '" + name + "'");
    if (entry.kind != Kind::Object) fail("entry for tensor '" + name + "' is not an object");
    const st::Json* dtype = nullptr;
    const st::Json* shape = nullptr;
    const st::Json* offsets = nullptr;
    for (std::size_t i = 0; i < entry.keys.size(); ++i) {
      if (entry.keys[i] == "dtype") dtype = &entry.items[i];
      else if (entry.keys[i] == "shape") shape = &entry.items[i];
      else if (entry.keys[i] == "data_offsets") offsets = &entry.items[i];
    }
    const std::string where = "tensor '" + name + "': ";
    if (!dtype) fail(where + "missing \"dtype\"");
    if (!shape) fail(where + "missing \"shape\"");
    if (!offsets) fail(where + "missing \"data_offsets\"");

    TensorInfo t;
    t.name = name;
    if (dtype->kind != Kind::String) fail(where + "\"dtype\" is not a string");
    if (auto d = st::parse_dtype(dtype->string)) t.dtype = *d;
    else if (st::known_unsupported_dtype(dtype->string))
      fail(where + "unsupported dtype '" + dtype->string + "'");
    else fail(where + "unknown dtype '" + dtype->string + "'");

    if (shape->kind != Kind::Array) fail(where + "\"shape\" is not an array");
    std::uint64_t elements = 1;
    for (const st::Json& d : shape->items) {
      if (d.kind != Kind::Integer) fail(where + "\"shape\" holds " + std::string(st::kind_name(d.kind)));
      if (d.integer > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(where + "shape dimension too large");
      const auto e = st::mul(elements, d.integer);
      if (!e) fail(where + "shape product overflows");
      elements = *e;
      t.shape.push_back(static_cast<std::int64_t>(d.integer));
    }

    if (offsets->kind != Kind::Array || offsets->items.size() != 2 || offsets->items[0].kind != Kind::Integer ||
        offsets->items[1].kind != Kind::Integer)
      fail(where + "\"data_offsets\" is not an array of two integers");
    t.begin = offsets->items[0].integer;
    t.end = offsets->items[1].integer;
    if (t.begin > t.end)
      fail(where + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
           "] begin after end");
    if (t.end > data_size)
      fail(where + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
           "] out of range: the data buffer holds " + std::to_string(data_size) + " bytes");
    const auto bytes = st::mul(elements, static_cast<std::uint64_t>(size_of(t.dtype)));
    if (!bytes || *bytes != t.end - t.begin)
      fail(where + "shape " + st::shape_string(t.shape) + " of " + std::string(st::dtype_name(t.dtype)) +
           " needs " + (bytes ? std::to_string(*bytes) : std::string("too many")) + " bytes but data_offsets [" +
           std::to_string(t.begin) + ", " + std::to_string(t.end) + "] span " + std::to_string(t.end - t.begin));
    return t;
  }

  std::filesystem::path path_;
  std::uint64_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (in the given order) and `metadata` to `path` as safetensors.
// The header is padded with spaces so the data starts 8-byte aligned. The file is
// written to `path + ".tmp"` and renamed over `path` only when complete; on any
// error the temporary is removed and an existing `path` is left untouched.
inline void write_safetensors(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  namespace st = detail::safetensors;
  auto fail = [&](const std::string& what) { st::write_fail(path, what); };

  // Header JSON.
  std::vector<std::uint64_t> sizes;
  sizes.reserve(tensors.size());
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (it != metadata.begin()) header += ',';
      header += st::json_quote(it->first) + ':' + st::json_quote(it->second);
    }
    header += '}';
    first = false;
  }
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    if (t.name.empty()) fail("tensor " + std::to_string(i) + " has an empty name");
    if (t.name == "__metadata__") fail("a tensor cannot be named \"__metadata__\"");
    for (std::size_t j = 0; j < i; ++j)
      if (tensors[j].name == t.name) fail("duplicate tensor name '" + t.name + "'");
    std::uint64_t elements = 1;
    for (std::int64_t d : t.shape) {
      if (d < 0) fail("tensor '" + t.name + "' has a negative dimension");
      const auto e = st::mul(elements, static_cast<std::uint64_t>(d));
      if (!e) fail("tensor '" + t.name + "': shape product overflows");
      elements = *e;
    }
    const auto bytes = st::mul(elements, static_cast<std::uint64_t>(size_of(t.dtype)));
    if (!bytes) fail("tensor '" + t.name + "': byte size overflows");
    sizes.push_back(*bytes);
    if (!first) header += ',';
    first = false;
    header += st::json_quote(t.name) + ":{\"dtype\":\"" + std::string(st::dtype_name(t.dtype)) + "\",\"shape\":[";
    for (std::size_t k = 0; k < t.shape.size(); ++k) {
      if (k) header += ',';
      header += std::to_string(t.shape[k]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + ',' + std::to_string(offset + *bytes) + "]}";
    offset += *bytes;
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::filesystem::path tmp = path.string() + ".tmp";
  std::ofstream out;
  try {
    out.open(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create temporary file " + tmp.string());
    unsigned char len_bytes[8];
    st::store_u64_le(len_bytes, header.size());
    out.write(reinterpret_cast<const char*>(len_bytes), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (sizes[i] == 0) continue;
      if (!tensors[i].data) fail("tensor '" + tensors[i].name + "' has no data (null pointer)");
      out.write(static_cast<const char*>(tensors[i].data), static_cast<std::streamsize>(sizes[i]));
      if (!out) fail("write failed for tensor '" + tensors[i].name + "'");
    }
    out.flush();
    if (!out) fail("write failed while flushing " + tmp.string());
    out.close();
    if (!out) fail("closing " + tmp.string() + " failed");
    std::filesystem::rename(tmp, path);
  } catch (...) {
    if (out.is_open()) out.close();
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

// ---------------------------------------------------------------------------
// Helpers shared by the other io/ headers (hf_names, checkpoint, peft).
// ---------------------------------------------------------------------------

// True for the floating-point dtypes a checkpoint's values can be read from.
constexpr bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64;
}

namespace detail::safetensors {

// IEEE half (binary16) and bfloat16 bit patterns to float.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits = 0;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant != 0) {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  } else {
    bits = sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace detail::safetensors

// Reads tensor `t` of `file` (F32, F16, BF16 or F64, little-endian) converted
// to U (float or double) into out, which holds exactly its element count.
template <class U>
void read_converted(const SafetensorsFile& file, const TensorInfo& t, std::span<U> out) {
  namespace st = detail::safetensors;
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, double>, "read_converted: U is float or double");
  const std::uint64_t bytes = t.end - t.begin;
  if (!is_float(t.dtype))
    throw format_error("safetensors: " + file.path().string() + ": tensor '" + t.name + "': dtype " +
                       std::string(st::dtype_name(t.dtype)) + " is not a floating-point type (F32, F16, BF16 or F64)");
  if (bytes != out.size() * static_cast<std::uint64_t>(size_of(t.dtype)))
    throw std::invalid_argument("safetensors: " + file.path().string() + ": reading tensor '" + t.name + "' (" +
                                std::to_string(bytes) + " bytes of " + std::string(st::dtype_name(t.dtype)) +
                                ") into " + std::to_string(out.size()) + " elements");
  if ((t.dtype == DType::F32 && std::is_same_v<U, float>) || (t.dtype == DType::F64 && std::is_same_v<U, double>)) {
    file.read(t.name, out.data(), static_cast<std::size_t>(bytes));
    return;
  }
  std::vector<unsigned char> raw(static_cast<std::size_t>(bytes));
  file.read(t.name, raw.data(), raw.size());
  const unsigned char* p = raw.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case DType::F32: {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        out[i] = static_cast<U>(f);
        break;
      }
      case DType::F64: {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<U>(d);
        break;
      }
      case DType::F16:
        out[i] = static_cast<U>(st::half_to_float(static_cast<std::uint16_t>(p[2 * i] | (p[2 * i + 1] << 8))));
        break;
      case DType::BF16:
        out[i] = static_cast<U>(st::bf16_to_float(static_cast<std::uint16_t>(p[2 * i] | (p[2 * i + 1] << 8))));
        break;
      default: break;
    }
  }
}

// Flushes a file's or a directory's contents to the disk (fsync); throws
// std::system_error on failure. A no-op where POSIX is unavailable.
inline void sync_path(const std::filesystem::path& path) {
#if defined(__unix__) || defined(__APPLE__)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot open " + path.string() + " to fsync it");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::system_error(err, std::generic_category(), "fsync of " + path.string() + " failed");
#else
  (void)path;
#endif
}

// A small general JSON reader for the io/ headers' own JSON files (trainer.json,
// adapter_config.json): null, booleans, numbers, strings, arrays, objects.
// Every value keeps its [begin, end) span in the source text, so a caller can
// hand back an embedded value verbatim.
namespace detail::json {

struct Value {
  enum class Kind : std::uint8_t { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;               // Number
  std::string string;              // String: the decoded text; Number: the literal
  std::vector<std::string> keys;   // Object: keys[i] -> items[i]
  std::vector<Value> items;        // Object values or Array elements
  std::size_t begin = 0, end = 0;  // span in the source

  // The member called `key` of an object, or nullptr.
  const Value* get(std::string_view key) const {
    if (kind != Kind::Object) return nullptr;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &items[i];
    return nullptr;
  }
  // A non-negative or negative integer that fits in int64, or nullopt.
  std::optional<std::int64_t> integer() const {
    if (kind != Kind::Number) return std::nullopt;
    std::int64_t v = 0;
    const auto r = std::from_chars(string.data(), string.data() + string.size(), v);
    if (r.ec != std::errc() || r.ptr != string.data() + string.size()) return std::nullopt;
    return v;
  }
};

class Reader {
 public:
  explicit Reader(std::string_view text) : text_(text) {}
  Value document() {
    ws();
    Value v = value(0);
    ws();
    if (pos_ != text_.size()) fail("unexpected trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }
  void ws() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  char peek() const {
    if (pos_ >= text_.size()) fail("unexpected end of text");
    return text_[pos_];
  }
  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  Value value(std::size_t depth) {
    if (depth > safetensors::max_json_depth) fail("nesting too deep");
    Value v;
    v.begin = pos_;
    const char c = peek();
    if (c == '{' || c == '[') {
      const bool object = c == '{';
      v.kind = object ? Value::Kind::Object : Value::Kind::Array;
      ++pos_;
      ws();
      if (peek() == (object ? '}' : ']')) {
        ++pos_;
      } else {
        while (true) {
          ws();
          if (object) {
            if (peek() != '"') fail("expected a string key");
            std::string key = safetensors::decode_json_string(text_, pos_, "invalid JSON");
            for (const auto& k : v.keys)
              if (k == key) fail("duplicate key \"" + key + "\"");
            v.keys.push_back(std::move(key));
            ws();
            if (peek() != ':') fail("expected ':'");
            ++pos_;
            ws();
          }
          v.items.push_back(value(depth + 1));
          ws();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          if (peek() != (object ? '}' : ']')) fail(object ? "expected ',' or '}'" : "expected ',' or ']'");
          ++pos_;
          break;
        }
      }
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.string = safetensors::decode_json_string(text_, pos_, "invalid JSON");
    } else if (literal("true") || literal("false")) {
      v.kind = Value::Kind::Bool;
      v.boolean = text_[v.begin] == 't';
    } else if (literal("null")) {
      v.kind = Value::Kind::Null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Value::Kind::Number;
      std::size_t p = pos_;
      if (text_[p] == '-') ++p;
      const std::size_t digits = p;
      while (p < text_.size() && text_[p] >= '0' && text_[p] <= '9') ++p;
      if (p == digits) fail("bad number");
      if (p - digits > 1 && text_[digits] == '0') fail("leading zeros are not allowed");
      if (p < text_.size() && text_[p] == '.') {
        const std::size_t f = ++p;
        while (p < text_.size() && text_[p] >= '0' && text_[p] <= '9') ++p;
        if (p == f) fail("bad number");
      }
      if (p < text_.size() && (text_[p] == 'e' || text_[p] == 'E')) {
        ++p;
        if (p < text_.size() && (text_[p] == '+' || text_[p] == '-')) ++p;
        const std::size_t e = p;
        while (p < text_.size() && text_[p] >= '0' && text_[p] <= '9') ++p;
        if (p == e) fail("bad number");
      }
      v.string = std::string(text_.substr(pos_, p - pos_));
      const auto r = std::from_chars(v.string.data(), v.string.data() + v.string.size(), v.number);
      if (r.ec != std::errc() && r.ec != std::errc::result_out_of_range) fail("bad number");
      pos_ = p;
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    v.end = pos_;
    return v;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

inline Value parse(std::string_view text) { return Reader(text).document(); }

// The shortest text that reads back as `x` (finite numbers only).
inline std::string number(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

}  // namespace detail::json

}  // namespace headroom::io
