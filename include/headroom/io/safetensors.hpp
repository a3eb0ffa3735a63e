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
// What the reader accepts (each refusal is an io::format_error naming the file
// and, for the header, the byte offset in the file): a header of at most
// 100,000,000 bytes (the reference implementation's limit), valid UTF-8 JSON
// nested at most 64 deep, unique keys in every object; tensor names and
// __metadata__ keys of at most 4096 bytes, free of NUL as metadata values are;
// shapes of at most 64 dimensions (detail::safetensors::max_*). Opening
// takes O(n log n) time in the tensor count and a small multiple of the header
// in memory (docs/benchmarks.md, "Opening safetensors files").
//
// SafetensorsFile validates the whole header when opened and reads tensor data on
// demand. write_safetensors writes through a new temporary file of its own beside
// `path`, fsyncs it and renames it over `path` (io/durable.hpp), so an
// interrupted save never leaves a broken file behind and a finished one
// survives a power cut.
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "durable.hpp"
#include "json.hpp"
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

// Limits of the reader. Exceeding one is an io::format_error that names the
// file, the limit and the byte offset in the file.
//
// Headers beyond max_header_bytes are refused before they are read: the limit
// of the reference implementation (MAX_HEADER_SIZE = 100_000_000 in
// huggingface/safetensors, safetensors/src/tensor.rs).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
inline constexpr std::size_t max_json_depth = json::max_depth;
// Tensor names and __metadata__ keys: at most this many bytes of UTF-8.
// (__metadata__ values are bounded by the header size only: trainers store
// whole JSON configurations there.)
inline constexpr std::size_t max_name_bytes = 4096;
// Dimensions of a tensor's shape (numpy 2's NPY_MAXDIMS).
inline constexpr std::size_t max_rank = 64;
static_assert(max_header_bytes < (std::uint64_t{1} << 32), "header offsets and indices are kept in 32 bits");

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

// Test hook: while it points at a counter, every comparison of two names
// (tensor names and __metadata__ keys, on open and on lookups) made on this
// thread adds one to it.
inline thread_local std::uint64_t* name_comparisons = nullptr;

inline int compare_names(std::string_view a, std::string_view b) {
  if (std::uint64_t* c = name_comparisons) ++*c;
  return a.compare(b);
}

using io::detail::printable;  // (io/json_string.hpp)

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

class HeaderReader;

}  // namespace detail::safetensors

// The "__metadata__" of a safetensors file: string keys to string values, in
// key order. Keys and values share one buffer; lookups are binary searches.
class SafetensorsMetadata {
 public:
  using value_type = std::pair<std::string_view, std::string_view>;  // key, value

  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = SafetensorsMetadata::value_type;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = value_type;
    const_iterator() = default;
    value_type operator*() const { return m_->item(i_); }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    const_iterator operator++(int) {
      const_iterator old = *this;
      ++i_;
      return old;
    }
    bool operator==(const const_iterator&) const = default;

   private:
    friend class SafetensorsMetadata;
    const_iterator(const SafetensorsMetadata* m, std::size_t i) : m_(m), i_(i) {}
    const SafetensorsMetadata* m_ = nullptr;
    std::size_t i_ = 0;
  };

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, entries_.size()}; }

  // The value for `key`, or nullopt.
  std::optional<std::string_view> get(std::string_view key) const {
    const auto it = std::lower_bound(entries_.begin(), entries_.end(), key, [&](const Entry& e, std::string_view k) {
      return detail::safetensors::compare_names(key_of(e), k) < 0;
    });
    if (it == entries_.end() || detail::safetensors::compare_names(key_of(*it), key) != 0) return std::nullopt;
    return value_of(*it);
  }
  bool contains(std::string_view key) const { return get(key).has_value(); }
  // The value for `key`; throws std::out_of_range when there is none.
  std::string_view at(std::string_view key) const {
    if (auto v = get(key)) return *v;
    throw std::out_of_range("safetensors metadata: no key " + detail::safetensors::printable(key));
  }
  std::map<std::string, std::string> to_map() const {
    std::map<std::string, std::string> m;
    for (const auto& [k, v] : *this) m.emplace(k, v);
    return m;
  }

 private:
  friend class detail::safetensors::HeaderReader;
  // A key at text_[key, key + key_len), its value right after it.
  struct Entry {
    std::uint32_t key, key_len, value_len;
  };
  std::string_view key_of(const Entry& e) const { return std::string_view(text_).substr(e.key, e.key_len); }
  std::string_view value_of(const Entry& e) const {
    return std::string_view(text_).substr(e.key + e.key_len, e.value_len);
  }
  value_type item(std::size_t i) const { return {key_of(entries_[i]), value_of(entries_[i])}; }

  std::string text_;
  std::vector<Entry> entries_;  // sorted by key
};

namespace detail::safetensors {

// A header as parsed: its tensors in header order, with the offset in the
// header text of each one's name, and the metadata.
struct Header {
  std::vector<TensorInfo> tensors;
  std::vector<std::uint32_t> name_at;
  SafetensorsMetadata metadata;
};

// Reads a header in one pass straight into TensorInfo records and the compact
// metadata: no tree of JSON values, the JSON read step by step through a
// json::Cursor (io/json.hpp). The JSON accepted is the subset safetensors
// uses: objects, arrays, strings, non-negative integers; unknown members of a
// tensor entry are validated and skipped. Every string is checked as UTF-8;
// names and metadata are checked against the limits above. Errors throw
// format_error("<prefix><what>"), where `what` gives the offset in the file
// (base + offset in the text) of the problem.
//
// Memory: besides the text, the records, with reservations sized from a
// prescan (json::extent) and capped by the smallest text a valid member can
// have (so a header of bare commas reserves little); see docs/benchmarks.md.
class HeaderReader {
 public:
  HeaderReader(std::string_view text, std::uint64_t data_size, std::string prefix, std::uint64_t base)
      : c_(text, Syntax{this}, "unexpected end of header"), data_size_(data_size), prefix_(std::move(prefix)), base_(base) {}
  HeaderReader(const HeaderReader&) = delete;  // the cursor reports through `this`
  HeaderReader& operator=(const HeaderReader&) = delete;

  Header read() {
    Header h;
    c_.ws();
    if (!c_.at_end() && (text()[c_.pos] == '[' || text()[c_.pos] == '"' || is_digit(text()[c_.pos])))
      fail("header is not a JSON object (it starts with " + describe(text()[c_.pos]) + ")");
    if (c_.peek() != '{') unexpected();
    // A valid tensor member takes at least 50 bytes of text:
    // "":{"dtype":"U8","shape":[],"data_offsets":[0,1]}, and one more for the comma.
    const std::size_t members = std::min(json::extent(text(), c_.pos).members, text().size() / 50 + 2);
    h.tensors.reserve(members);
    h.name_at.reserve(members);
    bool have_metadata = false;
    std::size_t metadata_at = 0;
    if (c_.enter('{')) do {
        const std::size_t key_at = c_.key();
        name_.clear();
        decode(name_, "tensor name", {max_name_bytes, false});
        c_.colon();
        if (name_ == "__metadata__") {
          if (have_metadata) duplicate("", "__metadata__", metadata_at, key_at);
          have_metadata = true;
          metadata_at = key_at;
          read_metadata(h.metadata);
        } else {
          h.tensors.push_back(read_tensor());
          h.name_at.push_back(static_cast<std::uint32_t>(key_at));
        }
      } while (c_.more('}'));
    c_.ws();
    if (!c_.at_end()) c_.fail("unexpected trailing characters");
    return h;
  }

  // The offset in the file of text offset p.
  std::string at(std::size_t p) const { return std::to_string(base_ + p); }

 private:
  // A syntax error: "invalid JSON header at byte <offset in the file>: why".
  struct Syntax {
    const HeaderReader* r;
    [[noreturn]] void operator()(std::size_t pos, const std::string& why) const {
      r->fail("invalid JSON header at byte " + r->at(pos) + ": " + why);
    }
  };

  std::string_view text() const { return c_.text; }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  static std::string describe(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x21 && u < 0x7F) return std::string("'") + c + "'";
    static constexpr char hex[] = "0123456789ABCDEF";
    return std::string("byte 0x") + hex[u >> 4] + hex[u & 0xF];
  }

  [[noreturn]] void fail(const std::string& what) const { throw format_error(prefix_ + what); }
  [[noreturn]] void unexpected() const {
    if (c_.at_end()) c_.fail("unexpected end of header");
    if (text()[c_.pos] == '-') c_.fail("negative numbers are not allowed");
    c_.fail("unexpected character " + describe(text()[c_.pos]));
  }
  [[noreturn]] void duplicate(const std::string& where, std::string_view key, std::size_t first,
                              std::size_t second) const {
    fail(where + "duplicate key " + printable(key) + " at bytes " + at(first) + " and " + at(second));
  }

  // Appends the string at the cursor to out; `role` names it in errors.
  void decode(std::string& out, std::string_view role, io::detail::JsonStringRules rules) {
    c_.string_into(out, rules, [&](std::size_t pos, const std::string& why) {
      fail(std::string(role) + " at byte " + at(pos) + ": " + why);
    });
  }

  // The integer at the cursor (a digit is there), exactly, as a u64.
  std::uint64_t read_uint() {
    const json::Digits d = c_.digits();
    if (d.too_large) {
      c_.pos = d.begin;
      c_.fail("integer too large");
    }
    if (d.leading_zero(text(), c_.pos)) {
      c_.pos = d.begin;
      c_.fail("leading zeros are not allowed");
    }
    if (!c_.at_end() && (text()[c_.pos] == '.' || text()[c_.pos] == 'e' || text()[c_.pos] == 'E'))
      c_.fail("only non-negative integers are allowed");
    return d.value;
  }

  // Checks, and steps over, any value of the accepted subset. Keys of objects
  // inside it must be unique too.
  void skip_value(std::size_t depth) {
    if (depth > max_json_depth) c_.fail("nesting too deep");
    const char c = c_.peek();
    if (c == '{') {
      const std::size_t mark = keys_.size();
      if (!c_.enter('{')) return;
      do {
        c_.key();
        push_key();
        c_.colon();
        skip_value(depth + 1);
      } while (c_.more('}'));
      check_unique_keys(mark, "");
    } else if (c == '[') {
      if (c_.enter('[')) do skip_value(depth + 1);
        while (c_.more(']'));
    } else if (c == '"') {
      scratch_.clear();
      decode(scratch_, "string", {});
    } else if (is_digit(c)) {
      read_uint();
    } else {
      unexpected();
    }
  }

  // What the value at p is, for messages (after skip_value accepted it).
  std::string kind_at(std::size_t p) const {
    switch (text()[p]) {
      case '{': return "an object";
      case '[': return "an array";
      case '"': return "a string";
      default: return "an integer";
    }
  }

  // Rejects the value at the cursor, which has the wrong kind: a syntax error
  // in it is reported first, as it would be anywhere else.
  [[noreturn]] void wrong_kind(const std::string& what, std::size_t depth = 2) {
    skip_value(depth);
    fail(what);
  }

  // The keys of the objects being skipped, innermost last, for the
  // uniqueness check: key i is key_text_[keys_[i].text, + len).
  struct Key {
    std::uint32_t text, len, at;
  };
  void push_key() {
    const std::size_t key_at = c_.pos, off = key_text_.size();
    decode(key_text_, "key", {});
    keys_.push_back(Key{static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(key_text_.size() - off),
                        static_cast<std::uint32_t>(key_at)});
  }
  void check_unique_keys(std::size_t mark, const std::string& where) {
    const std::string_view all = key_text_;
    auto key = [&](const Key& k) { return all.substr(k.text, k.len); };
    if (keys_.size() - mark > 1) {
      std::sort(keys_.begin() + static_cast<std::ptrdiff_t>(mark), keys_.end(), [&](const Key& a, const Key& b) {
        const int c = compare_names(key(a), key(b));
        return c != 0 ? c < 0 : a.at < b.at;
      });
      for (std::size_t i = mark + 1; i < keys_.size(); ++i)
        if (compare_names(key(keys_[i - 1]), key(keys_[i])) == 0)
          duplicate(where, key(keys_[i]), keys_[i - 1].at, keys_[i].at);
    }
    if (mark < keys_.size()) {
      std::uint32_t text_mark = keys_[mark].text;
      for (std::size_t i = mark; i < keys_.size(); ++i) text_mark = std::min(text_mark, keys_[i].text);
      key_text_.resize(text_mark);
      keys_.resize(mark);
    }
  }

  // One tensor entry, named name_: {"dtype": s, "shape": [n...], "data_offsets": [b, e]}.
  TensorInfo read_tensor() {
    auto bad = [&](const std::string& what) -> std::string { return "tensor " + quote_name() + ": " + what; };
    if (c_.peek() != '{') wrong_kind("entry for tensor " + quote_name() + " is not an object", 1);
    TensorInfo t;
    std::optional<std::size_t> dtype_at, shape_at, offsets_at;
    std::int64_t dims[max_rank];
    std::size_t rank = 0;
    const std::size_t mark = keys_.size();
    if (c_.enter('{')) do {
        const std::size_t key_at = c_.key();
        field_.clear();
        decode(field_, "key", {});
        c_.colon();
        if (field_ == "dtype") {
          if (dtype_at) duplicate(bad(""), field_, *dtype_at, key_at);
          dtype_at = key_at;
          if (c_.peek() != '"') wrong_kind(bad("\"dtype\" is not a string"));
          field_.clear();
          decode(field_, "dtype", {});
          if (auto d = parse_dtype(field_)) t.dtype = *d;
          else if (known_unsupported_dtype(field_)) fail(bad("unsupported dtype '" + field_ + "'"));
          else fail(bad("unknown dtype " + printable(field_)));
        } else if (field_ == "shape") {
          if (shape_at) duplicate(bad(""), field_, *shape_at, key_at);
          shape_at = key_at;
          const std::size_t start = c_.pos;
          if (c_.peek() != '[') wrong_kind(bad("\"shape\" is not an array"));
          if (c_.enter('[')) do {
              if (!is_digit(c_.peek())) {
                const std::string kind = kind_at(c_.pos);
                c_.pos = start;
                wrong_kind(bad("\"shape\" holds " + kind));
              }
              const std::uint64_t d = read_uint();
              if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
                fail(bad("shape dimension too large"));
              if (rank == max_rank)
                fail(bad("shape has more than " + std::to_string(max_rank) + " dimensions (at byte " + at(start) + ")"));
              dims[rank++] = static_cast<std::int64_t>(d);
            } while (c_.more(']'));
        } else if (field_ == "data_offsets") {
          if (offsets_at) duplicate(bad(""), field_, *offsets_at, key_at);
          offsets_at = key_at;
          const std::size_t start = c_.pos;
          std::uint64_t v[2] = {0, 0};
          bool ok = c_.peek() == '[';
          for (int i = 0; ok && i < 2; ++i) {
            ++c_.pos;  // '[' or ','
            c_.ws();
            ok = is_digit(c_.peek());
            if (ok) v[i] = read_uint();
            c_.ws();
            ok = ok && c_.peek() == (i == 0 ? ',' : ']');
          }
          if (!ok) {
            c_.pos = start;
            wrong_kind(bad("\"data_offsets\" is not an array of two integers"));
          }
          ++c_.pos;  // ']'
          t.begin = v[0];
          t.end = v[1];
        } else {
          keys_.push_back(Key{static_cast<std::uint32_t>(key_text_.size()), static_cast<std::uint32_t>(field_.size()),
                              static_cast<std::uint32_t>(key_at)});
          key_text_ += field_;
          skip_value(2);
        }
      } while (c_.more('}'));
    check_unique_keys(mark, bad(""));

    if (!dtype_at) fail(bad("missing \"dtype\""));
    if (!shape_at) fail(bad("missing \"shape\""));
    if (!offsets_at) fail(bad("missing \"data_offsets\""));
    t.shape.assign(dims, dims + rank);
    std::uint64_t elements = 1;
    for (std::size_t i = 0; i < rank; ++i) {
      const auto e = mul(elements, static_cast<std::uint64_t>(dims[i]));
      if (!e) fail(bad("shape product overflows"));
      elements = *e;
    }
    auto offsets = [&] { return "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]"; };
    if (t.begin > t.end) fail(bad(offsets() + " begin after end"));
    if (t.end > data_size_)
      fail(bad(offsets() + " out of range: the data buffer holds " + std::to_string(data_size_) + " bytes"));
    const auto bytes = mul(elements, static_cast<std::uint64_t>(size_of(t.dtype)));
    if (!bytes || *bytes != t.end - t.begin)
      fail(bad("shape " + shape_string(t.shape) + " of " + std::string(dtype_name(t.dtype)) + " needs " +
               (bytes ? std::to_string(*bytes) : std::string("too many")) + " bytes but " + offsets() + " span " +
               std::to_string(t.end - t.begin)));
    t.name = name_;
    return t;
  }

  std::string quote_name() const { return printable(name_); }

  // "__metadata__": {string: string}, decoded into m's one buffer.
  void read_metadata(SafetensorsMetadata& m) {
    using Entry = SafetensorsMetadata::Entry;
    if (c_.peek() != '{') wrong_kind("\"__metadata__\" is not an object", 1);
    const std::size_t open = c_.pos;
    const json::Extent scan = json::extent(text(), c_.pos);
    // A member takes at least 6 bytes: "":"", ; decoded text is never longer than its literal.
    m.entries_.reserve(std::min(scan.members, scan.bytes / 6 + 1));
    m.text_.reserve(scan.bytes);
    if (c_.enter('{')) do {
        c_.key();
        const std::size_t key = m.text_.size();
        decode(m.text_, "__metadata__ key", {max_name_bytes, false});
        const std::size_t value = m.text_.size();
        c_.colon();
        if (c_.peek() != '"')
          wrong_kind("\"__metadata__\" value for key " + printable(std::string_view(m.text_).substr(key)) +
                     " is not a string");
        decode(m.text_, "__metadata__ value", {std::numeric_limits<std::size_t>::max(), false});
        m.entries_.push_back(Entry{static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(value - key),
                                   static_cast<std::uint32_t>(m.text_.size() - value)});
      } while (c_.more('}'));
    // Sorted by key, then by position (keys are stored in header order).
    std::sort(m.entries_.begin(), m.entries_.end(), [&](const Entry& a, const Entry& b) {
      const int c = compare_names(m.key_of(a), m.key_of(b));
      return c != 0 ? c < 0 : a.key < b.key;
    });
    for (std::size_t i = 1; i < m.entries_.size(); ++i)
      if (compare_names(m.key_of(m.entries_[i - 1]), m.key_of(m.entries_[i])) == 0) {
        const std::size_t end = c_.pos;
        // Two keys stored at one offset are both "" with "" values between them.
        const std::size_t offset = m.entries_[i].key;
        const std::size_t first = metadata_key_at(open, m.entries_[i - 1].key, 0);
        const std::size_t second = metadata_key_at(open, offset, offset == m.entries_[i - 1].key ? 1 : 0);
        c_.pos = end;
        duplicate("in \"__metadata__\": ", m.key_of(m.entries_[i]), first, second);
      }
  }

  // Where in the text the metadata key stored at `offset` of the buffer
  // starts (the one after `skip` others stored there): the object at `open`
  // is read again (it is valid), adding up the decoded sizes. Only for
  // messages, so the entries need not keep offsets.
  std::size_t metadata_key_at(std::size_t open, std::size_t offset, int skip) {
    c_.pos = open + 1;
    std::size_t decoded = 0;
    while (true) {
      c_.ws();
      const std::size_t key_at = c_.pos;
      if (decoded == offset && skip-- == 0) return key_at;
      for (int part = 0; part < 2; ++part) {  // key, value
        scratch_.clear();
        decode(scratch_, "__metadata__", {});
        decoded += scratch_.size();
        c_.ws();
        ++c_.pos;  // ':' or ','
        c_.ws();
      }
    }
  }

  json::Cursor<Syntax> c_;
  std::uint64_t data_size_;
  std::string prefix_;
  std::uint64_t base_;
  std::string name_, field_, scratch_;  // reused for every tensor
  std::string key_text_;
  std::vector<Key> keys_;
};
}  // namespace detail::safetensors

// An opened, validated safetensors file. Only the header is held in memory;
// tensor data is read on demand.
//
// Opening takes O(n log n) time for n tensors (names and offsets are sorted
// once), lookups by name O(log n), and at most a small multiple of the
// header's size in memory, whatever the header holds (docs/benchmarks.md).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::filesystem::path path) : path_(std::move(path)) {
    namespace st = detail::safetensors;
    std::error_code ec;
    if (std::filesystem::is_directory(path_, ec))
      fail("is a directory, not a safetensors file (name the .safetensors file inside it)");
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

    st::Header h;
    {
      const auto text = std::make_unique_for_overwrite<char[]>(static_cast<std::size_t>(n));
      if (n > 0 && !in.read(text.get(), static_cast<std::streamsize>(n)))
        fail("file too short: cannot read the " + std::to_string(n) + "-byte header");
      in.close();
      h = st::HeaderReader(std::string_view(text.get(), static_cast<std::size_t>(n)), data_size,
                           "safetensors: " + path_.string() + ": ", 8)
              .read();
    }  // the text is freed before the indices are built
    tensors_ = std::move(h.tensors);
    metadata_ = std::move(h.metadata);
    index(h.name_at, data_size);
  }

  const std::filesystem::path& path() const { return path_; }
  // Where the data buffer starts in the file (TensorInfo::begin and end are
  // relative to it): 8 + the header's length.
  std::uint64_t data_start() const { return data_start_; }

  // Tensors in file (data offset) order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const SafetensorsMetadata& metadata() const { return metadata_; }

  // The tensor called `name`, or nullptr. O(log n).
  const TensorInfo* find(std::string_view name) const {
    namespace st = detail::safetensors;
    const auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name, [&](std::uint32_t i, std::string_view k) {
      return st::compare_names(tensors_[i].name, k) < 0;
    });
    if (it == by_name_.end() || st::compare_names(tensors_[*it].name, name) != 0) return nullptr;
    return &tensors_[*it];
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

  // Sorts names once (duplicates are then neighbours) and offsets once (the
  // data buffer must be covered exactly: each tensor starts where the previous
  // one ended, the last ends at the file's end); leaves tensors_ in offset
  // order and by_name_ indexing it in name order. name_at: where each tensor's
  // name is in the header text, in header order; it is used up.
  void index(std::vector<std::uint32_t>& name_at, std::uint64_t data_size) {
    namespace st = detail::safetensors;
    const std::size_t n = tensors_.size();
    auto at = [&](std::uint32_t i) { return std::to_string(8 + std::uint64_t{name_at[i]}); };

    // (Writers often list tensors in name order, offset order or both: a
    // sorted list costs one pass, not a sort.)
    std::vector<std::uint32_t> by_name(n);
    for (std::size_t i = 0; i < n; ++i) by_name[i] = static_cast<std::uint32_t>(i);
    const auto name_less = [&](std::uint32_t a, std::uint32_t b) {
      const int c = st::compare_names(tensors_[a].name, tensors_[b].name);
      return c != 0 ? c < 0 : a < b;
    };
    if (!std::is_sorted(by_name.begin(), by_name.end(), name_less)) std::sort(by_name.begin(), by_name.end(), name_less);
    for (std::size_t i = 1; i < n; ++i)
      if (st::compare_names(tensors_[by_name[i - 1]].name, tensors_[by_name[i]].name) == 0)
        fail("duplicate key " + st::printable(tensors_[by_name[i]].name) + " at bytes " + at(by_name[i - 1]) + " and " +
             at(by_name[i]) + ": two tensors with one name");

    std::vector<std::uint32_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
    const auto offset_less = [&](std::uint32_t a, std::uint32_t b) {
      const TensorInfo &x = tensors_[a], &y = tensors_[b];
      if (x.begin != y.begin) return x.begin < y.begin;
      if (x.end != y.end) return x.end < y.end;
      return a < b;
    };
    if (!std::is_sorted(order.begin(), order.end(), offset_less)) std::sort(order.begin(), order.end(), offset_less);
    std::uint64_t cursor = 0;
    const TensorInfo* prev = nullptr;
    for (std::uint32_t i : order) {
      const TensorInfo& t = tensors_[i];
      if (t.begin < cursor)
        fail("tensor " + st::printable(t.name) + " data [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             ") overlaps tensor " + st::printable(prev ? prev->name : std::string()) + " which ends at " +
             std::to_string(cursor));
      if (t.begin > cursor)
        fail("hole in the data buffer: bytes [" + std::to_string(cursor) + ", " + std::to_string(t.begin) +
             ") before tensor " + st::printable(t.name) + " belong to no tensor");
      cursor = t.end;
      prev = &t;
    }
    if (cursor != data_size)
      fail("hole in the data buffer: bytes [" + std::to_string(cursor) + ", " + std::to_string(data_size) +
           ") at the end of the file belong to no tensor");

    // Into offset order: by_name follows through the inverse permutation
    // (name_at, no longer needed, holds it), tensors_ is permuted in place.
    std::vector<std::uint32_t>& rank = name_at;
    for (std::size_t i = 0; i < n; ++i) rank[order[i]] = static_cast<std::uint32_t>(i);
    for (std::uint32_t& i : by_name) i = rank[i];
    for (std::size_t i = 0; i < n; ++i) {  // cycle by cycle: new tensors_[i] = old tensors_[order[i]]
      if (order[i] == i) continue;
      TensorInfo held = std::move(tensors_[i]);
      std::size_t j = i;
      while (order[j] != i) {
        const std::size_t k = order[j];
        tensors_[j] = std::move(tensors_[k]);
        order[j] = static_cast<std::uint32_t>(j);
        j = k;
      }
      tensors_[j] = std::move(held);
      order[j] = static_cast<std::uint32_t>(j);
    }
    by_name_ = std::move(by_name);
  }

  std::filesystem::path path_;
  std::uint64_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::vector<std::uint32_t> by_name_;  // indices into tensors_, in name order
  SafetensorsMetadata metadata_;
};

// Whether `path` looks like a safetensors file: a u64 header length N, a
// file of at least 8 + N bytes, and a header that opens with '{'. The test
// write_safetensors applies before it replaces an existing file.
inline bool is_safetensors_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char head[9];
  if (!in.read(reinterpret_cast<char*>(head), 9)) return false;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return !ec && n >= 2 && n <= size - 8 && head[8] == '{';
}

// Writes `tensors` (in the given order) and `metadata` to `path` as safetensors.
// The header is padded with spaces so the data starts 8-byte aligned. Written
// durably through io::replace_file (io/durable.hpp): only a missing path or an
// existing safetensors file is replaced; the file and its directory are
// fsync'ed; on any error an existing `path` is left untouched.
inline void write_safetensors(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  namespace st = detail::safetensors;
  namespace json = detail::json;
  auto fail = [&](const std::string& what) { st::write_fail(path, what); };

  // What the reader accepts: names, metadata keys and values in well-formed
  // UTF-8 without NUL, names and keys of at most max_name_bytes; no tensor
  // name twice (found by one sort).
  auto check_text = [&](const std::string& text, std::string_view what, std::size_t max_bytes) {
    std::string shown = "'";  // the first 64 bytes, other than printable ASCII as \xHH
    for (const char c : std::string_view(text).substr(0, 64)) {
      static constexpr char hex[] = "0123456789ABCDEF";
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u < 0x7F) shown += c;
      else shown += std::string("\\x") + hex[u >> 4] + hex[u & 15];
    }
    shown += text.size() > 64 ? "...'" : "'";
    if (text.size() > max_bytes)
      fail(std::string(what) + " " + shown + " is " + std::to_string(text.size()) + " bytes, more than " + std::to_string(max_bytes));
    for (std::size_t k = 0; k < text.size();) {
      const char* why = "a NUL byte";
      const std::size_t n = text[k] == '\0' ? 0 : detail::utf8_sequence(std::string_view(text).substr(k), why);
      if (n == 0) fail(std::string(what) + " " + shown + ", byte " + std::to_string(k) + ": " + why);
      k += n;
    }
  };
  {
    std::vector<std::string_view> names;
    names.reserve(tensors.size());
    for (const TensorView& t : tensors) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    if (const auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end())
      fail("duplicate tensor name '" + std::string(*dup) + "'");
  }
  for (const auto& [key, value] : metadata) {
    check_text(key, "__metadata__ key", st::max_name_bytes);
    check_text(value, "__metadata__ value", std::string::npos);
  }

  // Header JSON, compact: {"__metadata__":{"k":"v"},"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}
  std::vector<std::uint64_t> sizes;
  sizes.reserve(tensors.size());
  json::Writer w;
  w.begin_object(json::Layout::compact);
  if (!metadata.empty()) {
    w.key("__metadata__").begin_object(json::Layout::compact);
    for (const auto& [key, value] : metadata) w.key(key).string(value);
    w.end();
  }
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    if (t.name.empty()) fail("tensor " + std::to_string(i) + " has an empty name");
    if (t.name == "__metadata__") fail("a tensor cannot be named \"__metadata__\"");
    check_text(t.name, "tensor name", st::max_name_bytes);
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
    w.key(t.name).begin_object(json::Layout::compact).key("dtype").string(st::dtype_name(t.dtype));
    w.key("shape").begin_array(json::Layout::compact);
    for (const std::int64_t d : t.shape) w.integer(d);
    w.end().key("data_offsets").begin_array(json::Layout::compact).integer(offset).integer(offset + *bytes).end();
    w.end();
    offset += *bytes;
  }
  w.end();
  std::string header = w.take();
  header.append((8 - header.size() % 8) % 8, ' ');

  replace_file(
      path, "write_safetensors", "safetensors file", is_safetensors_file,
      [&](std::ostream& out) {
        unsigned char len_bytes[8];
        st::store_u64_le(len_bytes, header.size());
        out.write(reinterpret_cast<const char*>(len_bytes), 8);
        out.write(header.data(), static_cast<std::streamsize>(header.size()));
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          if (sizes[i] == 0) continue;
          if (!tensors[i].data) fail("tensor '" + tensors[i].name + "' has no data (null pointer)");
          errno = 0;
          out.write(static_cast<const char*>(tensors[i].data), static_cast<std::streamsize>(sizes[i]));
          if (!out) fail("write failed for tensor '" + tensors[i].name + "'" + system_reason());
        }
      },
      fail);
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

namespace detail::safetensors {
// n little-endian values of a float dtype at p, converted to U.
template <class U>
void convert(DType dtype, const unsigned char* p, std::size_t n, U* out) {
  for (std::size_t i = 0; i < n; ++i) {
    switch (dtype) {
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
      case DType::F16: out[i] = static_cast<U>(half_to_float(static_cast<std::uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)))); break;
      case DType::BF16: out[i] = static_cast<U>(bf16_to_float(static_cast<std::uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)))); break;
      default: break;
    }
  }
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
  st::convert(t.dtype, raw.data(), out.size(), out.data());
}


}  // namespace headroom::io
