#pragma once
// JSON string literals, decoded once for every reader of the project
// (safetensors headers, trainer.json, adapter_config.json, GPT-2's
// encoder.json): escapes, \u escapes with surrogate pairs, UTF-8 output.
#include <cstddef>
#include <string>
#include <string_view>

namespace headroom::io::detail {

inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes the string literal starting at text[pos] (a '"') and moves pos
// past it. On bad input calls fail(why), which must throw (pos then points
// at the problem).
template <class Fail>
std::string decode_json_string(std::string_view text, std::size_t& pos, Fail&& fail) {
  auto next = [&]() {
    if (pos >= text.size()) fail(std::string("unterminated string"));
    return text[pos++];
  };
  auto hex4 = [&]() {
    char32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = next();
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= static_cast<char32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') cp |= static_cast<char32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') cp |= static_cast<char32_t>(c - 'A' + 10);
      else fail(std::string("bad \\u escape"));
    }
    return cp;
  };
  if (pos >= text.size() || text[pos] != '"') fail(std::string("expected '\"'"));
  ++pos;
  std::string out;
  while (true) {
    const char c = next();
    if (c == '"') return out;
    if (static_cast<unsigned char>(c) < 0x20) fail(std::string("control character in a string"));
    if (c != '\\') {
      out += c;
      continue;
    }
    const char e = next();
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        char32_t cp = hex4();
        if (cp >= 0xDC00 && cp <= 0xDFFF) fail(std::string("unpaired low surrogate in a \\u escape"));
        if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate: a low one must follow
          if (pos + 2 > text.size() || text[pos] != '\\' || text[pos + 1] != 'u')
            fail(std::string("unpaired high surrogate in a \\u escape"));
          pos += 2;
          const char32_t lo = hex4();
          if (lo < 0xDC00 || lo > 0xDFFF) fail(std::string("unpaired high surrogate in a \\u escape"));
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        append_utf8(out, cp);
        break;
      }
      default: fail(std::string("bad escape '\\") + e + "'");
    }
  }
}

}  // namespace headroom::io::detail
