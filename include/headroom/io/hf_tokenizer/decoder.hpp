#pragma once
// tokenizer.json "decoder": token strings -> text. Each step maps the list of
// token strings to another; the result is their concatenation.
//
//   ByteLevel              a token of the byte alphabet becomes its bytes
//                          (any other token stays as it is); then the bytes
//                          become text, invalid UTF-8 as U+FFFD
//   Replace {pattern, content}
//                          in each token
//   ByteFallback           runs of "<0xXX>" tokens become their bytes: one
//                          token of text where valid UTF-8, else one U+FFFD
//                          per byte
//   Fuse                   all tokens into one
//   Strip {content, start, stop}
//                          up to `start` leading and `stop` trailing
//                          `content` characters off each token
//   Metaspace {replacement, prepend_scheme}
//                          the replacement character back to spaces; in the
//                          first token it is dropped (unless never)
//   Sequence {decoders}
// Anything else is an error naming it. Without a decoder, tokens are joined
// with spaces (as the reference does).
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fields.hpp"
#include "normalizer.hpp"
#include "text.hpp"

namespace headroom::io::detail::hf {

class Decoder {
 public:
  Decoder() = default;

  static Decoder from_json(const JsonValue& v, const std::string& where) {
    Decoder d;
    d.present_ = true;
    d.add(v, where);
    return d;
  }

  std::string operator()(std::vector<std::string> tokens) const {
    if (!present_) {
      std::string out;
      for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    for (const Step& s : steps_) std::visit([&](const auto& step) { step(tokens); }, s);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }

 private:
  using Tokens = std::vector<std::string>;

  struct ByteLevel {
    void operator()(Tokens& tokens) const {
      std::string bytes;
      for (const std::string& t : tokens) {
        const std::size_t mark = bytes.size();
        bool all = true;
        for (std::size_t i = 0; i < t.size() && all;) {
          const auto c = code_point_at(t, i);
          const int b = c.cp < gpt2::unicode_to_byte.size() ? gpt2::unicode_to_byte[c.cp] : -1;
          if (b < 0) all = false;
          else bytes += static_cast<char>(b);
          i += c.len;
        }
        if (!all) {
          bytes.resize(mark);
          bytes += t;
        }
      }
      tokens.assign(1, from_utf8_lossy(bytes));
    }
  };
  struct Replace {
    Pattern pattern;
    std::string content;
    void operator()(Tokens& tokens) const {
      for (std::string& t : tokens) t = pattern.replace_all(t, content);
    }
  };
  struct ByteFallback {
    static int byte_of(const std::string& t) {  // "<0xXX>" -> XX, else -1
      if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
      int v = 0;
      for (int k = 3; k < 5; ++k) {
        const char c = t[static_cast<std::size_t>(k)];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return -1;
        v = v * 16 + d;
      }
      return v;
    }
    void operator()(Tokens& tokens) const {
      Tokens out;
      std::string run;
      const auto flush = [&] {
        if (run.empty()) return;
        if (first_invalid_utf8(run) == std::string::npos) {
          out.push_back(run);
        } else {
          for (std::size_t k = 0; k < run.size(); ++k) out.push_back("\xEF\xBF\xBD");
        }
        run.clear();
      };
      for (std::string& t : tokens) {
        const int b = byte_of(t);
        if (b >= 0) {
          run += static_cast<char>(b);
          continue;
        }
        flush();
        out.push_back(std::move(t));
      }
      flush();
      tokens = std::move(out);
    }
  };
  struct Fuse {
    void operator()(Tokens& tokens) const {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens.assign(1, std::move(all));
    }
  };
  struct Strip {
    std::string content;  // one character
    std::size_t start, stop;
    void operator()(Tokens& tokens) const {
      for (std::string& t : tokens) {
        std::size_t b = 0, e = t.size();
        for (std::size_t k = 0; k < start && std::string_view(t).substr(b, e - b).starts_with(content); ++k)
          b += content.size();
        for (std::size_t k = 0; k < stop && std::string_view(t).substr(b, e - b).ends_with(content); ++k)
          e -= content.size();
        t = t.substr(b, e - b);
      }
    }
  };
  struct Metaspace {
    std::string replacement;
    bool strip_first;
    void operator()(Tokens& tokens) const {
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        std::string out;
        const std::string& t = tokens[i];
        for (std::size_t k = 0; k < t.size();) {
          if (std::string_view(t).substr(k).starts_with(replacement)) {
            if (i != 0 || !strip_first) out += ' ';  // the first token's are dropped, as the reference does
            k += replacement.size();
          } else {
            out += t[k++];
          }
        }
        tokens[i] = std::move(out);
      }
    }
  };
  using Step = std::variant<ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace>;

  void add(const JsonValue& v, const std::string& where) {
    const Fields f(v, where);
    const std::string type = type_of(f);
    if (type == "ByteLevel") {
      steps_.push_back(ByteLevel{});
    } else if (type == "Replace") {
      steps_.push_back(Replace{Pattern::from_json(f, "pattern"), f.string("content")});
    } else if (type == "ByteFallback") {
      steps_.push_back(ByteFallback{});
    } else if (type == "Fuse") {
      steps_.push_back(Fuse{});
    } else if (type == "Strip") {
      Strip s{f.string("content"), static_cast<std::size_t>(f.integer("start", 0, 1 << 20)),
              static_cast<std::size_t>(f.integer("stop", 0, 1 << 20))};
      if (s.content.empty() || code_point_at(s.content, 0).len != s.content.size())
        throw data_error(f.at("content") + ": expected one character, got " + printable(s.content));
      steps_.push_back(std::move(s));
    } else if (type == "Metaspace") {
      const auto scheme = f.optional_string("prepend_scheme");
      const bool strip = scheme ? *scheme != "never" : f.boolean("add_prefix_space", true);
      steps_.push_back(Metaspace{f.string("replacement"), strip});
    } else if (type == "Sequence") {
      f.each("decoders", [&](const JsonValue& e, const std::string& at) { add(e, at); });
    } else {
      unsupported(f, "decoder", type, "ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence");
    }
  }

  bool present_ = false;
  std::vector<Step> steps_;
};

}  // namespace headroom::io::detail::hf
