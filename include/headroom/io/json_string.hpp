#pragma once
// JSON string literals, decoded once for every reader of the project
// (safetensors headers, trainer.json, adapter_config.json, GPT-2's
// encoder.json): escapes, \u escapes with surrogate pairs, UTF-8 output.
//
// The input must be UTF-8 (RFC 8259, section 8.1): raw bytes inside a string
// are validated as UTF-8 (RFC 3629: no overlong forms, no encoded UTF-16
// surrogates, nothing above U+10FFFF, no truncated sequences), and \u escapes
// must pair surrogates, so the decoded text is always valid UTF-8.
#include <cstddef>
#include <limits>
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

// The length of the well-formed UTF-8 sequence at s[0] (RFC 3629, table 3-7 of
// the Unicode standard), or 0 with `why` set when it is not one. Only called
// for a lead byte >= 0x80.
inline std::size_t utf8_sequence(std::string_view s, const char*& why) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c < 0x80) return 1;
  if (c < 0xC0) {
    why = "invalid UTF-8: a continuation byte without a lead byte";
    return 0;
  }
  if (c < 0xC2) {
    why = "invalid UTF-8: overlong encoding";
    return 0;
  }
  if (c < 0xE0) len = 2;
  else if (c < 0xF0) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // E0 80..9F would be overlong
    if (c == 0xED) hi = 0x9F;  // ED A0..BF would encode a UTF-16 surrogate
  } else if (c < 0xF5) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // F0 80..8F would be overlong
    if (c == 0xF4) hi = 0x8F;  // F4 90.. would be above U+10FFFF
  } else {
    why = "invalid UTF-8: byte above 0xF4 (code point above U+10FFFF)";
    return 0;
  }
  if (s.size() < 2 || b(1) < 0x80 || b(1) > 0xBF) {
    why = "invalid UTF-8: truncated sequence";
    return 0;
  }
  if (b(1) < lo) {
    why = "invalid UTF-8: overlong encoding";
    return 0;
  }
  if (b(1) > hi) {
    why = c == 0xED ? "invalid UTF-8: encoded UTF-16 surrogate (U+D800..U+DFFF)"
                    : "invalid UTF-8: code point above U+10FFFF";
    return 0;
  }
  for (std::size_t i = 2; i < len; ++i)
    if (s.size() <= i || b(i) < 0x80 || b(i) > 0xBF) {
      why = "invalid UTF-8: truncated sequence";
      return 0;
    }
  return len;
}

// What a caller allows in one string beyond JSON's own rules.
struct JsonStringRules {
  std::size_t max_bytes = std::numeric_limits<std::size_t>::max();  // of decoded text
  bool allow_nul = true;                                            // the \u0000 escape
};

// Decodes the string literal starting at text[pos] (a '"'), appends it to
// `out` and moves pos past it. On bad input calls fail(why), which must throw;
// pos then points at the offending byte (the lead byte of bad UTF-8, the '\'
// of a bad escape (of the second half of a surrogate pair when that is bad), the opening '"' of a string over rules.max_bytes). Output
// grows by at most rules.max_bytes + 4 bytes before a too-long string fails.
template <class Fail>
void decode_json_string_into(std::string_view text, std::size_t& pos, std::string& out, Fail&& fail,
                             JsonStringRules rules = {}) {
  const std::size_t open = pos;
  const std::size_t start_size = out.size();
  auto too_long = [&]() {
    pos = open;
    fail("longer than " + std::to_string(rules.max_bytes) + " bytes");
  };
  auto hex4 = [&](std::size_t at, std::size_t esc) {
    char32_t cp = 0;
    if (text.size() - at < 4) {
      pos = text.size();
      fail(std::string("unterminated string"));
    }
    for (std::size_t i = 0; i < 4; ++i) {
      const char c = text[at + i];
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= static_cast<char32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') cp |= static_cast<char32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') cp |= static_cast<char32_t>(c - 'A' + 10);
      else {
        pos = esc;
        fail(std::string("bad \\u escape"));
      }
    }
    return cp;
  };
  if (pos >= text.size() || text[pos] != '"') fail(std::string("expected '\"'"));
  ++pos;
  while (true) {
    // A run of plain bytes is validated, then appended in one piece.
    std::size_t run = pos;
    while (run < text.size()) {
      const auto c = static_cast<unsigned char>(text[run]);
      if (c == '"' || c == '\\' || c < 0x20) break;
      if (c < 0x80) {
        ++run;
        continue;
      }
      const char* why = nullptr;
      const std::size_t n = utf8_sequence(text.substr(run), why);
      if (n == 0) {
        pos = run;
        fail(std::string(why));
      }
      run += n;
    }
    if (run - pos > rules.max_bytes - (out.size() - start_size)) too_long();
    out.append(text.data() + pos, run - pos);
    pos = run;
    if (pos >= text.size()) fail(std::string("unterminated string"));
    const char c = text[pos];
    if (c == '"') {
      ++pos;
      return;
    }
    if (c == '\0') fail(std::string("NUL byte in a string"));
    if (static_cast<unsigned char>(c) < 0x20) fail(std::string("control character in a string (must be escaped)"));
    // An escape.
    const std::size_t esc = pos;
    if (pos + 1 >= text.size()) {
      pos = text.size();
      fail(std::string("unterminated string"));
    }
    const char e = text[pos + 1];
    pos += 2;
    if (out.size() - start_size >= rules.max_bytes) too_long();
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
        char32_t cp = hex4(pos, esc);
        pos += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
          pos = esc;
          fail(std::string("unpaired low surrogate in a \\u escape"));
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate: a low one must follow
          if (pos + 2 > text.size() || text[pos] != '\\' || text[pos + 1] != 'u') {
            pos = esc;
            fail(std::string("unpaired high surrogate in a \\u escape"));
          }
          const char32_t lo = hex4(pos + 2, pos);
          if (lo < 0xDC00 || lo > 0xDFFF) {
            pos = esc;
            fail(std::string("unpaired high surrogate in a \\u escape"));
          }
          pos += 6;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0 && !rules.allow_nul) {
          pos = esc;
          fail(std::string("NUL character (\\u0000)"));
        }
        append_utf8(out, cp);
        break;
      }
      default: {
        pos = esc;
        std::string why = "bad escape '\\";
        if (static_cast<unsigned char>(e) >= 0x20 && static_cast<unsigned char>(e) < 0x7F) why += e;
        else why += "<byte " + std::to_string(static_cast<unsigned char>(e)) + ">";
        fail(why + "'");
      }
    }
    if (out.size() - start_size > rules.max_bytes) too_long();
  }
}

// Decodes the string literal starting at text[pos] (a '"') and moves pos
// past it. On bad input calls fail(why), which must throw (pos then points
// at the problem).
template <class Fail>
std::string decode_json_string(std::string_view text, std::size_t& pos, Fail&& fail, JsonStringRules rules = {}) {
  std::string out;
  decode_json_string_into(text, pos, out, fail, rules);
  return out;
}

// A name, dtype, key or token quoted for an error message: in single quotes, with
// backslashes, quotes and control characters escaped, cut after 64 bytes (a
// hostile one may be megabytes long).
inline std::string printable(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::size_t cut = s.size();
  if (cut > 64) {
    cut = 64;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  }
  std::string out = "'";
  for (char c : s.substr(0, cut)) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 0xF];
    } else {
      out += c;
    }
  }
  out += "'";
  if (cut < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace headroom::io::detail
