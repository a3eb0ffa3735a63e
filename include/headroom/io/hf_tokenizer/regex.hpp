#pragma once
// The regular expressions of tokenizer.json files (Split pre-tokenizers,
// Replace normalizers, ByteLevel's GPT-2 pattern), run by PCRE2 with Unicode
// properties (\p{L}, \p{N}, \s as Unicode defines them) and its JIT compiler.
//
// Link: -lpcre2-8 (Debian libpcre2-dev; CMake target headroom::tokenizers).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include "../tokenizer.hpp"
#include "text.hpp"

namespace headroom::io::detail::hf {

class Regex {
 public:
  // Compiles `pattern` (UTF-8) with PCRE2_UTF | PCRE2_UCP; `where` names the
  // pattern's place for the error a bad pattern gets.
  Regex(std::string_view pattern, const std::string& where) : pattern_(pattern) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
    if (!c)
      throw data_error(where + ": the regex " + printable(pattern) + " does not compile (at character " +
                       std::to_string(offset) + ": " + message(code) + ")");
    code_.reset(c, pcre2_code_free);
    jit_ = pcre2_jit_compile(c, PCRE2_JIT_COMPLETE) == 0;
  }

  const std::string& pattern() const { return pattern_; }

  // Calls f(begin, end) for each match in valid UTF-8 `s`, left to right and
  // without overlaps; after an empty match the search resumes one character on.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    Scratch& sc = scratch();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    for (std::size_t at = 0; at <= s.size();) {
      const int rc = jit_ ? pcre2_jit_match(code_.get(), subject, s.size(), at, PCRE2_NO_UTF_CHECK, sc.match.get(),
                                            sc.context.get())
                          : pcre2_match(code_.get(), subject, s.size(), at, PCRE2_NO_UTF_CHECK, sc.match.get(),
                                        sc.context.get());
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0)
        throw data_error("tokenizer: the regex " + printable(pattern_) + " failed on a text of " +
                         std::to_string(s.size()) + " bytes: " + message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.match.get());
      const std::size_t begin = ov[0], end = ov[1];
      f(begin, end);
      if (end > begin) {
        at = end;
      } else {
        if (end == s.size()) return;
        at = end + code_point_at(s, end).len;
      }
    }
  }

 private:
  static std::string message(int code) {
    PCRE2_UCHAR buf[256];
    const int n = pcre2_get_error_message(code, buf, sizeof buf);
    return n < 0 ? "error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf));
  }

  // Per thread: match data and a JIT stack large enough for long matches (a
  // megabyte of one repeated character is one match).
  struct Scratch {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match{nullptr, pcre2_match_data_free};
    std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> stack{nullptr, pcre2_jit_stack_free};
    std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context{nullptr,
                                                                                      pcre2_match_context_free};
  };
  static Scratch& scratch() {
    thread_local Scratch sc = [] {
      Scratch s;
      s.match.reset(pcre2_match_data_create(1, nullptr));
      s.context.reset(pcre2_match_context_create(nullptr));
      s.stack.reset(pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr));
      if (!s.match || !s.context || !s.stack) throw std::bad_alloc();
      pcre2_jit_stack_assign(s.context.get(), nullptr, s.stack.get());
      return s;
    }();
    return sc;
  }

  std::string pattern_;
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;
};

}  // namespace headroom::io::detail::hf
