#pragma once
// tokenizer.json "normalizer": text -> text, before pre-tokenization.
//
//   NFC, NFD, NFKC, NFKD   Unicode normalization forms (utf8proc)
//   Prepend {prepend}      prepends the string to non-empty text
//   Replace {pattern: {String | Regex}, content}
//                          replaces every match, left to right
//   Strip {strip_left, strip_right}
//                          removes leading / trailing White_Space
//   Sequence {normalizers} each in turn
// Anything else is an error naming it.
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fields.hpp"
#include "regex.hpp"
#include "text.hpp"

namespace headroom::io::detail::hf {

// A literal string or a regex: the "pattern" of Replace and Split.
class Pattern {
 public:
  static Pattern from_json(const Fields& owner, std::string_view member) {
    const Fields f(owner.need(member), owner.at(member));
    if (const auto s = f.optional_string("String")) {
      if (s->empty()) f.fail("an empty String pattern");
      return Pattern(*s);
    }
    if (const auto r = f.optional_string("Regex")) return Pattern(std::make_shared<Regex>(*r, f.where()));
    f.fail("expected {\"String\": ...} or {\"Regex\": ...}");
  }

  // f(begin, end) for each match in `s`, left to right, without overlaps.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    if (regex_) return regex_->for_each_match(s, f);
    for (std::size_t at = s.find(literal_); at != std::string_view::npos; at = s.find(literal_, at + literal_.size()))
      f(at, at + literal_.size());
  }

  // `s` with every match replaced by `content`.
  std::string replace_all(const std::string& s, std::string_view content) const {
    std::string out;
    std::size_t kept = 0;
    for_each_match(s, [&](std::size_t b, std::size_t e) {
      out.append(s, kept, b - kept);
      out += content;
      kept = e;
    });
    if (kept == 0 && out.empty()) return s;
    out.append(s, kept, std::string::npos);
    return out;
  }

 private:
  explicit Pattern(std::string literal) : literal_(std::move(literal)) {}
  explicit Pattern(std::shared_ptr<const Regex> r) : regex_(std::move(r)) {}
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

class Normalizer {
 public:
  Normalizer() = default;  // none: text unchanged

  static Normalizer from_json(const JsonValue& v, const std::string& where) {
    Normalizer n;
    n.add(v, where);
    return n;
  }

  bool empty() const { return steps_.empty(); }

  std::string operator()(std::string text) const {
    for (const Step& s : steps_) text = std::visit([&](const auto& step) { return step(std::move(text)); }, s);
    return text;
  }

 private:
  struct Unicode {
    NormalForm form;
    std::string operator()(std::string t) const { return normalize(t, form); }
  };
  struct Prepend {
    std::string prefix;
    std::string operator()(std::string t) const { return t.empty() ? t : prefix + t; }
  };
  struct Replace {
    Pattern pattern;
    std::string content;
    std::string operator()(std::string t) const { return pattern.replace_all(t, content); }
  };
  struct Strip {
    bool left, right;
    std::string operator()(std::string t) const {
      std::size_t b = 0, e = t.size();
      if (left)
        while (b < e && is_whitespace(code_point_at(t, b).cp)) b += code_point_at(t, b).len;
      if (right)
        while (e > b && is_whitespace(code_point_before(t, e).cp)) e -= code_point_before(t, e).len;
      return t.substr(b, e - b);
    }
  };
  using Step = std::variant<Unicode, Prepend, Replace, Strip>;

  void add(const JsonValue& v, const std::string& where) {
    const Fields f(v, where);
    const std::string type = type_of(f);
    if (type == "NFC") steps_.push_back(Unicode{NormalForm::NFC});
    else if (type == "NFD") steps_.push_back(Unicode{NormalForm::NFD});
    else if (type == "NFKC") steps_.push_back(Unicode{NormalForm::NFKC});
    else if (type == "NFKD") steps_.push_back(Unicode{NormalForm::NFKD});
    else if (type == "Prepend") steps_.push_back(Prepend{f.string("prepend")});
    else if (type == "Replace") steps_.push_back(Replace{Pattern::from_json(f, "pattern"), f.string("content")});
    else if (type == "Strip") steps_.push_back(Strip{f.boolean("strip_left", false), f.boolean("strip_right", false)});
    else if (type == "Sequence") {
      f.each("normalizers", [&](const JsonValue& e, const std::string& at) { add(e, at); });
    } else {
      unsupported(f, "normalizer", type, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence");
    }
  }

  std::vector<Step> steps_;
};

}  // namespace headroom::io::detail::hf
