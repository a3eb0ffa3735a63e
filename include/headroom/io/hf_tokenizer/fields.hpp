#pragma once
// Reading one object of a tokenizer.json: typed members, each missing or
// mistyped member one data_error naming the file and the member's place
// ("tokenizer.json: pre_tokenizer.pretokenizers[0].pattern: ...").
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "../json.hpp"
#include "../tokenizer.hpp"

namespace headroom::io::detail::hf {

using JsonValue = json::Value;
using JsonKind = json::Value::Kind;

class Fields {
 public:
  Fields(const JsonValue& v, std::string where) : v_(v), where_(std::move(where)) {
    if (v.kind != JsonKind::Object) fail("expected an object");
  }

  const std::string& where() const { return where_; }
  std::string at(std::string_view member) const { return where_ + "." + std::string(member); }
  [[noreturn]] void fail(const std::string& what) const { throw data_error(where_ + ": " + what); }

  const JsonValue* find(std::string_view member) const {
    const JsonValue* m = v_.get(member);
    return m && m->kind != JsonKind::Null ? m : nullptr;
  }
  const JsonValue& need(std::string_view member) const {
    const JsonValue* m = find(member);
    if (!m) fail("no \"" + std::string(member) + "\"");
    return *m;
  }
  std::string string(std::string_view member) const {
    const JsonValue& m = need(member);
    if (m.kind != JsonKind::String) throw data_error(at(member) + ": expected a string");
    return m.string;
  }
  std::optional<std::string> optional_string(std::string_view member) const {
    return find(member) ? std::optional<std::string>(string(member)) : std::nullopt;
  }
  bool boolean(std::string_view member, bool otherwise) const {
    const JsonValue* m = find(member);
    if (!m) return otherwise;
    if (m->kind != JsonKind::Bool) throw data_error(at(member) + ": expected true or false");
    return m->boolean;
  }
  std::int64_t integer(std::string_view member, std::int64_t lo, std::int64_t hi) const {
    const JsonValue& m = need(member);
    const auto x = m.integer();
    if (!x || *x < lo || *x > hi)
      throw data_error(at(member) + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "]");
    return *x;
  }
  const JsonValue& array(std::string_view member) const {
    const JsonValue& m = need(member);
    if (m.kind != JsonKind::Array) throw data_error(at(member) + ": expected an array");
    return m;
  }
  // f(element, where) for each element of the array `member`, `where` naming
  // it ("pre_tokenizer.pretokenizers[2]").
  template <class F>
  void each(std::string_view member, F&& f) const {
    const JsonValue& list = array(member);
    for (std::size_t i = 0; i < list.items.size(); ++i) f(list.items[i], at(member) + "[" + std::to_string(i) + "]");
  }

 private:
  const JsonValue& v_;
  std::string where_;
};

// A component's "type", and the error for one this library does not run.
inline std::string type_of(const Fields& f) { return f.string("type"); }

[[noreturn]] inline void unsupported(const Fields& f, std::string_view kind, const std::string& type,
                                     std::string_view supported) {
  f.fail("the " + std::string(kind) + " " + printable(type) + " is not supported (supported: " +
         std::string(supported) + ")");
}

}  // namespace headroom::io::detail::hf
