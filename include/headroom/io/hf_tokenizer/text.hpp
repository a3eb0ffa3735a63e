#pragma once
// Unicode text for the tokenizer.json pipeline: UTF-8 checks, character
// properties and normalization forms (utf8proc), and lossy decoding of bytes
// back to text as Rust's String::from_utf8_lossy does it (the reference
// library's decoders produce text that way).
//
// Link: -lutf8proc (Debian libutf8proc-dev; CMake target headroom::tokenizers).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <utf8proc.h>

#include "../json_string.hpp"
#include "../tokenizer.hpp"

namespace headroom::io::detail::hf {

using io::detail::append_utf8;

// The byte offset of the first byte of `s` that does not belong to a valid
// UTF-8 sequence (shortest form, no surrogates, at most U+10FFFF), or npos.
inline std::size_t first_invalid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const auto c = gpt2::decode_utf8(s, i);
    if (!c.valid) return i;
    i += c.len;
  }
  return std::string_view::npos;
}

// The code point at byte `i` of valid UTF-8 text, and its length.
inline gpt2::CodePoint code_point_at(std::string_view s, std::size_t i) { return gpt2::decode_utf8(s, i); }

// The code point that ends at byte `end` (end > 0) of valid UTF-8 text.
inline gpt2::CodePoint code_point_before(std::string_view s, std::size_t end) {
  std::size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return gpt2::decode_utf8(s, i);
}

inline utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

// Rust's char::is_numeric: general category Nd, Nl or No.
inline bool is_numeric(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

// Rust's char::is_whitespace: the White_Space property.
inline bool is_whitespace(char32_t c) { return gpt2::is_white_space(c); }

// Rust's char::is_alphanumeric, with letters taken as general category L*.
inline bool is_alphanumeric(char32_t c) {
  const auto k = category(c);
  return is_numeric(c) || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO);
}

// The Unicode normalization forms of valid UTF-8 text.
enum class NormalForm : std::uint8_t { NFC, NFD, NFKC, NFKD };

inline std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (const char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);  // every normal form of ASCII is itself
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  if (n < 0) throw data_error(std::string("tokenizer: Unicode normalization failed: ") + utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
}

// Bytes as text, each maximal ill-formed subsequence replaced by U+FFFD, as
// Rust's String::from_utf8_lossy (and the WHATWG decoder) does.
inline std::string from_utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = b(i);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    std::size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    std::size_t k = 1;
    for (; k <= need && i + k < s.size(); ++k) {
      const unsigned char x = b(i + k);
      if (k == 1 ? (x < lo || x > hi) : (x & 0xC0) != 0x80) break;
    }
    if (k == need + 1) {
      out.append(s.substr(i, k));
    } else {
      out += "\xEF\xBF\xBD";  // the valid prefix [i, i + k) is one maximal subpart
    }
    i += k;
  }
  return out;
}

}  // namespace headroom::io::detail::hf
