#pragma once
// JSON for every io/ header: the one reader (a Cursor of scanning steps,
// and whole documents as Values) and the one writer (Writer).
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "json_string.hpp"

namespace headroom::io {

// JSON in and out for every io/ header. Reading: a Cursor (the scanning
// steps: whitespace, punctuation, string literals, exact unsigned integers,
// the members of an object and the elements of an array) that each reader is
// built from, and a Reader of whole documents as Values (trainer.json,
// config.json, adapter_config.json, a weight index, tokenizer.json). The
// safetensors header and GPT-2's encoder.json are read straight from a Cursor,
// without a tree of values. Writing: a Writer that lays out objects and
// arrays compactly, inline or one member a line, as each file is written.
namespace detail::json {

inline constexpr std::size_t max_depth = 64;

struct parse_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A digit run read by Cursor::digits.
struct Digits {
  std::uint64_t value = 0;
  std::size_t begin = 0;   // where the run starts
  bool too_large = false;  // it went above the limit: the cursor stops at the digit that did
  // A run of more than one digit that starts with '0' (JSON has no leading zeros).
  bool leading_zero(std::string_view text, std::size_t end) const { return end - begin > 1 && text[begin] == '0'; }
};

// A position in a JSON text and the steps that move it. Every reader of the
// project's JSON is built from these, each with its own words for a problem:
// fail(pos, why) reports one (and must throw); `end_of_text` is what peek()
// says at the end of the text. The cursor never allocates, except for the
// strings it decodes into a caller's buffer.
template <class Fail>
class Cursor {
 public:
  Cursor(std::string_view text, Fail fail, const char* end_of_text = "unexpected end of text")
      : text(text), fail_(std::move(fail)), end_of_text_(end_of_text) {}

  std::string_view text;
  std::size_t pos = 0;

  [[noreturn]] void fail(const std::string& why) const {
    fail_(pos, why);
    throw parse_error(why);  // (not reached: fail_ throws its own error)
  }
  bool at_end() const { return pos >= text.size(); }
  void ws() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')) ++pos;
  }
  char peek() const {
    if (pos >= text.size()) fail(end_of_text_);
    return text[pos];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos;
  }
  bool literal(std::string_view word) {
    if (text.substr(pos, word.size()) != word) return false;
    pos += word.size();
    return true;
  }

  // The string literal at pos appended to `out` (io/json_string.hpp: UTF-8
  // checked, escapes decoded); on bad input on_fail(pos, why), which must throw.
  template <class OnFail>
  void string_into(std::string& out, JsonStringRules rules, OnFail&& on_fail) {
    io::detail::decode_json_string_into(text, pos, out, [&](const std::string& why) { on_fail(pos, why); }, rules);
  }
  void string_into(std::string& out, JsonStringRules rules = {}) {
    string_into(out, rules, [&](std::size_t, const std::string& why) { fail(why); });
  }
  std::string string() {
    std::string out;
    string_into(out);
    return out;
  }

  // The run of decimal digits at pos as an exact integer, read up to the
  // first digit that would take it above `max` (too_large, pos at that
  // digit). The caller judges an empty run, leading zeros and what follows.
  Digits digits(std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
    Digits d{0, pos, false};
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      const auto digit = static_cast<std::uint64_t>(text[pos] - '0');
      if (d.value > (max - digit) / 10) {
        d.too_large = true;
        return d;
      }
      d.value = d.value * 10 + digit;
      ++pos;
    }
    return d;
  }

  // Objects and arrays, one item at a time:
  //   if (c.enter('{')) do { key_at = c.key(); ...; c.colon(); ...value... } while (c.more('}'));
  // enter steps over the opening bracket and whitespace and says whether an
  // item follows (false: the closing bracket, stepped over too); more steps
  // over the ',' before the next item (true) or the closing bracket (false).
  bool enter(char open) {
    expect(open);
    ws();
    if (peek() == (open == '{' ? '}' : ']')) {
      ++pos;
      return false;
    }
    return true;
  }
  bool more(char close) {
    ws();
    if (peek() == ',') {
      ++pos;
      ws();
      return true;
    }
    if (peek() != close) fail(close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    ++pos;
    return false;
  }
  // Where the key of the next member starts (its '"').
  std::size_t key() {
    if (peek() != '"') fail("expected a string key");
    return pos;
  }
  // The ':' between a key and its value, with the whitespace around it.
  void colon() {
    ws();
    expect(':');
    ws();
  }

 private:
  Fail fail_;
  const char* end_of_text_;
};

// The members of the object (or elements of the array) at text[p] and the
// length of its text, by a scan that follows only strings and brackets: what
// a reader reserves room from before its parse validates. {0, 0} when the
// value does not end.
struct Extent {
  std::size_t members = 0, bytes = 0;
};
inline Extent extent(std::string_view text, std::size_t p) {
  std::size_t depth = 0, commas = 0;
  bool any = false;
  for (std::size_t i = p; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
      if (i >= text.size()) return {};
      any = any || depth == 1;
    } else if (c == '{' || c == '[') {
      any = any || depth == 1;
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return {any ? commas + 1 : 0, i + 1 - p};
    } else if (c == ',') {
      commas += depth == 1;
    } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      any = any || depth == 1;
    }
  }
  return {};
}

// A general JSON document: null, booleans, numbers, strings, arrays, objects.
// Every value keeps its [begin, end) span in the source text, so a caller can
// hand back an embedded value verbatim. Strings must be UTF-8 (json_string.hpp),
// keys of an object unique, nesting at most max_depth (64) deep,
// numbers finite doubles; anything else throws parse_error naming the byte.
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

// "invalid JSON at byte N: why"
struct ReaderFail {
  [[noreturn]] void operator()(std::size_t pos, const std::string& why) const {
    throw parse_error("invalid JSON at byte " + std::to_string(pos) + ": " + why);
  }
};

class Reader {
 public:
  explicit Reader(std::string_view text) : c_(text, ReaderFail{}) {}
  Value document() {
    c_.ws();
    Value v = value(0);
    c_.ws();
    if (!c_.at_end()) c_.fail("unexpected trailing characters");
    return v;
  }

 private:
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
        c_.pos = key_at[order[i]];
        c_.fail("duplicate key " + printable(v.keys[order[i]]) + " (first at byte " +
                std::to_string(key_at[order[i - 1]]) + ")");
      }
  }
  Value value(std::size_t depth) {
    if (depth > max_depth) c_.fail("nesting too deep");
    const std::string_view text = c_.text;
    std::size_t& pos = c_.pos;
    Value v;
    v.begin = pos;
    const char c = c_.peek();
    if (c == '{') {
      v.kind = Value::Kind::Object;
      std::vector<std::size_t> key_at;
      if (c_.enter('{')) do {
          key_at.push_back(c_.key());
          v.keys.push_back(c_.string());
          c_.colon();
          v.items.push_back(value(depth + 1));
        } while (c_.more('}'));
      const std::size_t end = pos;
      check_unique(v, key_at);
      pos = end;
    } else if (c == '[') {
      v.kind = Value::Kind::Array;
      if (c_.enter('[')) do v.items.push_back(value(depth + 1));
        while (c_.more(']'));
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.string = c_.string();
    } else if (c_.literal("true") || c_.literal("false")) {
      v.kind = Value::Kind::Bool;
      v.boolean = text[v.begin] == 't';
    } else if (c_.literal("null")) {
      v.kind = Value::Kind::Null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Value::Kind::Number;
      std::size_t p = pos;
      if (text[p] == '-') ++p;
      const std::size_t digits = p;
      while (p < text.size() && text[p] >= '0' && text[p] <= '9') ++p;
      if (p == digits) c_.fail("bad number");
      if (p - digits > 1 && text[digits] == '0') c_.fail("leading zeros are not allowed");
      if (p < text.size() && text[p] == '.') {
        const std::size_t f = ++p;
        while (p < text.size() && text[p] >= '0' && text[p] <= '9') ++p;
        if (p == f) c_.fail("bad number");
      }
      if (p < text.size() && (text[p] == 'e' || text[p] == 'E')) {
        ++p;
        if (p < text.size() && (text[p] == '+' || text[p] == '-')) ++p;
        const std::size_t e = p;
        while (p < text.size() && text[p] >= '0' && text[p] <= '9') ++p;
        if (p == e) c_.fail("bad number");
      }
      v.string = std::string(text.substr(pos, p - pos));
      const auto r = std::from_chars(v.string.data(), v.string.data() + v.string.size(), v.number);
      // out of range: beyond a double's range (from_chars then leaves v.number as it was)
      if (r.ec == std::errc::result_out_of_range) c_.fail("number out of the range of a double");
      if (r.ec != std::errc() || r.ptr != v.string.data() + v.string.size()) c_.fail("bad number");
      pos = p;
    } else {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x21 && u < 0x7F) c_.fail(std::string("unexpected character '") + c + "'");
      c_.fail("unexpected byte " + std::to_string(u));
    }
    v.end = pos;
    return v;
  }

  Cursor<ReaderFail> c_;
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

// How a double is spelled in a file.
enum class Spelling : std::uint8_t {
  shortest,          // the shortest text that reads back as x: 0.5, 1e-05, 16, 1e+20
  python_float,      // as Python's json writes a float: 500000.0, 1e-05
  integer_if_whole,  // a whole number below 9e15 as an integer (16), else shortest
};

// `x` (finite) spelled as `how` says.
inline std::string number(double x, Spelling how = Spelling::shortest) {
  if (how == Spelling::python_float && x == static_cast<double>(static_cast<std::int64_t>(x)) && x > -1e15 && x < 1e15)
    return std::to_string(static_cast<std::int64_t>(x)) + ".0";
  if (how == Spelling::integer_if_whole && x > -9.0e15 && x < 9.0e15 && x == static_cast<double>(static_cast<std::int64_t>(x)))
    return std::to_string(static_cast<std::int64_t>(x));
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

// `s` as a JSON string literal: '"' and '\\' escaped, control characters as
// \u00XX, every other byte as it is (the caller's text is UTF-8).
inline void append_quoted(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  std::size_t run = 0;  // plain bytes are appended a run at a time
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u >= 0x20 && u != '"' && u != '\\') continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    if (u == '"') out += "\\\"";
    else if (u == '\\') out += "\\\\";
    else {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 0xF];
    }
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}
inline std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  append_quoted(out, s);
  return out;
}

// How the items of one object or array are laid out.
enum class Layout : std::uint8_t {
  compact,  // {"a":1,"b":[2,3]}                    (a safetensors header)
  spaced,   // {"a": 1, "b": [2, 3]}                (Python's json.dumps)
  lines,    // one item a line, indented two spaces a level, "}" on a line of its own
            // (json.dumps(indent=2)); empty: {}
};

// Writes one JSON text into a string: values, and objects and arrays opened
// with a layout each and closed with end(). In an object, key() comes before
// each value. break_line() puts the next item of the innermost container on
// a new line, indented two spaces a level, whatever its layout (trainer.json
// lists the parameter names one a line inside a spaced object). Nothing is
// checked but what the writer itself needs: the caller writes valid UTF-8,
// finite numbers and one value per key.
//
//   Writer w;
//   w.begin_object(Layout::lines).key("r").integer(8).key("target_modules").begin_array();
//   for (auto& m : modules) w.string(m);
//   w.end().end();
//   w.text()   // {\n  "r": 8,\n  "target_modules": ["q_proj", "v_proj"]\n}
class Writer {
 public:
  Writer& begin_object(Layout layout = Layout::spaced) { return open('{', layout); }
  Writer& begin_array(Layout layout = Layout::spaced) { return open('[', layout); }
  Writer& end() {
    const Level l = levels_.back();
    levels_.pop_back();
    if (l.layout == Layout::lines && !l.empty) indent(levels_.size());
    out_ += l.close;
    return *this;
  }
  Writer& key(std::string_view k) {
    item();
    append_quoted(out_, k);
    out_ += levels_.back().layout == Layout::compact ? ":" : ": ";
    after_key_ = true;
    return *this;
  }
  Writer& string(std::string_view s) {
    item();
    append_quoted(out_, s);
    return *this;
  }
  template <class I>
    requires std::is_integral_v<I> && (!std::is_same_v<I, bool>)
  Writer& integer(I i) {
    item();
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, i);
    out_.append(buf, r.ptr);
    return *this;
  }
  Writer& number(double x, Spelling how = Spelling::shortest) { return raw(json::number(x, how)); }
  Writer& boolean(bool b) { return raw(b ? "true" : "false"); }
  Writer& null() { return raw("null"); }
  // A value given as JSON text, written as it is (an embedded document).
  Writer& raw(std::string_view json_text) {
    item();
    out_ += json_text;
    return *this;
  }
  Writer& break_line() {
    levels_.back().break_next = true;
    return *this;
  }

  const std::string& text() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  struct Level {
    Layout layout;
    char close;
    bool empty = true;
    bool break_next = false;
  };
  void indent(std::size_t level) {
    out_ += '\n';
    out_.append(2 * level, ' ');
  }
  // What goes before an item: the separator, and a line break where one is due.
  void item() {
    if (after_key_ || levels_.empty()) {
      after_key_ = false;
      return;
    }
    Level& l = levels_.back();
    if (!l.empty) out_ += ',';
    if (l.layout == Layout::lines || l.break_next) indent(levels_.size());
    else if (!l.empty && l.layout == Layout::spaced) out_ += ' ';
    l.empty = false;
    l.break_next = false;
  }
  Writer& open(char bracket, Layout layout) {
    item();
    out_ += bracket;
    levels_.push_back(Level{layout, bracket == '{' ? '}' : ']'});
    return *this;
  }

  std::string out_;
  std::vector<Level> levels_;
  bool after_key_ = false;
};

}  // namespace detail::json

}  // namespace headroom::io
