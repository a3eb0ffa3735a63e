// libFuzzer target: the JSON reader load_checkpoint reads trainer.json with
// (and load_adapter adapter_config.json): io::detail::json::parse.
//
// Text that is refused must be refused with json::parse_error; a value that is
// read is walked, and every value in it must keep the reader's promises:
//   - its [begin, end) span lies inside the text, and reading that span alone
//     gives a value of the same kind (the span is what a caller copies out);
//   - strings are UTF-8 and spanned by their quotes; keys of an object are
//     unique and get() finds each one's own value;
//   - numbers are finite, their literal is their span, integer() agrees with
//     the double, and json::number writes a literal that reads back the same;
//   - true, false and null span exactly their words.
#include <headroom/io/safetensors.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace js = headroom::io::detail::json;

[[noreturn]] void broken(const char* what, int line) {
  std::fprintf(stderr, "fuzz checkpoint_metadata: a promise of the JSON reader is broken (line %d): %s\n", line, what);
  std::abort();
}
#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) broken(#cond, __LINE__); \
  } while (0)

bool utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const char* why = nullptr;
    const std::size_t n = headroom::io::detail::utf8_sequence(s.substr(i), why);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void walk(const js::Value& v, std::string_view text) {
  FUZZ_CHECK(v.begin < v.end && v.end <= text.size());
  const std::string_view span = text.substr(v.begin, v.end - v.begin);
  js::Value again;
  try {
    again = js::parse(span);
  } catch (const js::parse_error&) {
    broken("the span of a value does not read back", __LINE__);
  }
  FUZZ_CHECK(again.kind == v.kind);
  switch (v.kind) {
    case js::Value::Kind::Null: FUZZ_CHECK(span == "null"); break;
    case js::Value::Kind::Bool: FUZZ_CHECK(span == (v.boolean ? "true" : "false")); break;
    case js::Value::Kind::String:
      FUZZ_CHECK(span.size() >= 2 && span.front() == '"' && span.back() == '"');
      FUZZ_CHECK(utf8(v.string) && again.string == v.string);
      break;
    case js::Value::Kind::Number: {
      FUZZ_CHECK(std::isfinite(v.number) && v.string == span && again.number == v.number);
      if (const auto i = v.integer()) FUZZ_CHECK(static_cast<double>(*i) == v.number);
      const js::Value written = js::parse(js::number(v.number));
      FUZZ_CHECK(written.kind == js::Value::Kind::Number && written.number == v.number);
      break;
    }
    case js::Value::Kind::Array:
      FUZZ_CHECK(v.keys.empty() && again.items.size() == v.items.size());
      for (const js::Value& item : v.items) walk(item, text);
      break;
    case js::Value::Kind::Object: {
      FUZZ_CHECK(v.keys.size() == v.items.size() && again.keys == v.keys);
      std::vector<std::string_view> keys(v.keys.begin(), v.keys.end());
      std::sort(keys.begin(), keys.end());
      FUZZ_CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
      for (std::size_t i = 0; i < v.keys.size(); ++i) {
        FUZZ_CHECK(utf8(v.keys[i]) && v.get(v.keys[i]) == &v.items[i]);
        walk(v.items[i], text);
      }
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  js::Value root;
  try {
    root = js::parse(text);
  } catch (const js::parse_error&) {
    return 0;  // refused, as it should be, with a message
  }
  walk(root, text);
  return 0;
}
