#pragma once
// JSON documents as values: the reader every io/ header uses for the JSON
// files it takes in (trainer.json, config.json, adapter_config.json, a weight
// index, tokenizer.json).
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "json_string.hpp"

namespace headroom::io {

// A small general JSON reader: null, booleans, numbers, strings, arrays, objects.
// Every value keeps its [begin, end) span in the source text, so a caller can
// hand back an embedded value verbatim. Strings must be UTF-8 (json_string.hpp),
// keys of an object unique, nesting at most max_depth (64) deep,
// numbers finite doubles; anything else throws parse_error naming the byte.
namespace detail::json {

inline constexpr std::size_t max_depth = 64;

struct parse_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
    throw parse_error("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
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
  std::string string() {
    return io::detail::decode_json_string(text_, pos_, [&](const std::string& why) { fail(why); });
  }
  // Keys of one object, sorted once when it ends: duplicates are neighbours.
  void check_unique(const Value& v, const std::vector<std::size_t>& key_at) {
    if (v.keys.size() < 2) return;
    std::vector<std::size_t> order(v.keys.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const int c = v.keys[a].compare(v.keys[b]);
      return c != 0 ? c < 0 : a < b;
    });
    for (std::size_t i = 1; i < order.size(); ++i)
      if (v.keys[order[i - 1]] == v.keys[order[i]]) {
        pos_ = key_at[order[i]];
        fail("duplicate key " + printable(v.keys[order[i]]) + " (first at byte " +
             std::to_string(key_at[order[i - 1]]) + ")");
      }
  }
  Value value(std::size_t depth) {
    if (depth > max_depth) fail("nesting too deep");
    Value v;
    v.begin = pos_;
    const char c = peek();
    if (c == '{' || c == '[') {
      const bool object = c == '{';
      std::vector<std::size_t> key_at;
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
            key_at.push_back(pos_);
            v.keys.push_back(string());
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
      if (object) {
        const std::size_t end = pos_;
        check_unique(v, key_at);
        pos_ = end;
      }
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.string = string();
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
      // out of range: beyond a double's range (from_chars then leaves v.number as it was)
      if (r.ec == std::errc::result_out_of_range) fail("number out of the range of a double");
      if (r.ec != std::errc() || r.ptr != v.string.data() + v.string.size()) fail("bad number");
      pos_ = p;
    } else {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x21 && u < 0x7F) fail(std::string("unexpected character '") + c + "'");
      fail("unexpected byte " + std::to_string(u));
    }
    v.end = pos_;
    return v;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

inline Value parse(std::string_view text) { return Reader(text).document(); }

// Whether the file at `path` is a JSON object with a member `key`: how a
// writer recognizes a JSON file of its own kind (durable.hpp's rule for what
// it may replace). False when it cannot be read or parsed.
inline bool file_is_object_with(const std::filesystem::path& path, std::string_view key) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    const Value v = parse(text);
    return v.kind == Value::Kind::Object && v.get(key) != nullptr;
  } catch (const std::exception&) {
    return false;
  }
}

// The shortest text that reads back as `x` (finite numbers only).
inline std::string number(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

}  // namespace detail::json

}  // namespace headroom::io
