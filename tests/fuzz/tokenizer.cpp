// libFuzzer target: the tokenizers (io/tokenizer.hpp).
//
// Three kinds of input (the text may hold NULs):
//   "M" vocab.bpe NUL text   merges only: encoder.json is made for them (the
//                            256 byte tokens, then each merge's result that a
//                            line "left right" of known tokens makes), so most
//                            mutations still load and the merge loop is what
//                            gets fuzzed;
//   encoder.json NUL vocab.bpe NUL text
//                            both files as given: the parsers get fuzzed;
//   anything else            text for a fixed vocabulary (the 256 bytes and
//                            merges that build runs of 'a', "the", " the", ...).
// The files go to Gpt2Bpe::from_contents; a data_error is the expected answer
// to a bad file, anything else escapes and is a finding. When they load:
// every id of encode(text) lies in the vocabulary, decode(encode(text)) ==
// text, and, for a text of up to 4 KiB, the ids equal those of a
// transcription of GPT-2's bpe() (quadratic, on token strings) over the same
// files. Every input: the byte tokenizer's round trip, and the pre-tokenizer's
// pieces tile the text.
// A failed check prints what differs and aborts.
#include <headroom/io/tokenizer.hpp>

#include "../runtime/support/reference_bpe.hpp"

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace io = headroom::io;
namespace gpt2 = headroom::io::detail::gpt2;
using Ids = std::vector<std::int32_t>;

[[noreturn]] void fail(const char* what, std::string_view text) {
  std::fprintf(stderr, "tokenizer fuzz: %s (text of %zu bytes)\n", what, text.size());
  std::abort();
}

std::string byte_token(unsigned char b) { return headroom::test::ReferenceBpe::byte_token(b); }

using Reference = headroom::test::ReferenceBpe;

void check_gpt2(const io::Gpt2Bpe& bpe, const Reference* ref, std::string_view text) {
  const Ids ids = bpe.encode(text);
  for (const std::int32_t id : ids)
    if (id < 0 || static_cast<std::size_t>(id) >= bpe.vocab_size())
      fail("encode gave an id outside the vocabulary", text);
  if (bpe.decode(ids) != text) fail("decode(encode(text)) != text", text);
  if (ref && text.size() <= 4096 && ref->encode(text) != ids) fail("encode differs from GPT-2's bpe()", text);
}

std::string json_of(const std::vector<std::string>& tokens) {
  std::string json = "{";
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    json += id ? ", \"" : "\"";
    for (const char c : tokens[id]) json += (c == '"' || c == '\\') ? std::string{'\\', c} : std::string{c};
    json += "\": " + std::to_string(id);
  }
  return json + "}";
}

// encoder.json for the merges of `vocab_bpe`: the 256 byte tokens, then the
// result of each line "left right" whose two tokens are known, in passes over
// the lines (up to 8), so a merge may use a token a later line makes.
std::string encoder_for(std::string_view vocab_bpe) {
  std::vector<std::string> tokens;
  std::map<std::string, bool> known;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(static_cast<unsigned char>(b)));
  for (const auto& t : tokens) known[t] = true;
  for (int round = 0, added = 1; round < 8 && added; ++round) {
    added = 0;
    for (std::size_t pos = 0; pos < vocab_bpe.size();) {
      std::size_t end = vocab_bpe.find('\n', pos);
      if (end == std::string_view::npos) end = vocab_bpe.size();
      std::string_view line = vocab_bpe.substr(pos, end - pos);
      pos = end + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      const std::size_t space = line.find(' ');
      if (space == std::string_view::npos) continue;
      const std::string l(line.substr(0, space)), r(line.substr(space + 1));
      if (known.contains(l) && known.contains(r) && !known.contains(l + r)) {
        known[l + r] = true;
        tokens.push_back(l + r);
        ++added;
      }
    }
  }
  return json_of(tokens);
}

// The fixed vocabulary for inputs that are only text.
struct Fixed {
  std::string json, merges;
  Fixed() {
    merges = "#version: 0.2\n";
    const std::string G = byte_token(' ');  // "Ġ"
    for (const auto& [l, r] : std::vector<std::pair<std::string, std::string>>{
             {"a", "a"}, {"aa", "a"}, {"aa", "aa"}, {"a", "aa"}, {"aaaa", "aaaa"}, {"t", "h"}, {"th", "e"},
             {G, "t"}, {G + "t", "he"}, {"h", "e"}, {G, "the"}, {"e", "r"}, {"b", "a"}, {"ba", "b"}, {"ab", "a"},
             {"a", "b"}, {"\xC3\xA9", "t"}, {"x", "x"}, {"xx", "x"}})
      merges += l + " " + r + "\n";
    json = encoder_for(merges);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  // the byte tokenizer round-trips anything; the pieces tile the input
  const io::ByteTokenizer bytes;
  if (bytes.decode(bytes.encode(input)) != input) fail("byte tokenizer round trip", input);
  for (std::size_t i = 0; i < input.size();) {
    const std::size_t n = gpt2::next_piece(input, i);
    if (n == 0 || n > input.size() - i) fail("next_piece returned an empty or overlong piece", input);
    i += n;
  }

  const std::size_t first = input.find('\0');
  const std::size_t second = first == std::string_view::npos ? first : input.find('\0', first + 1);
  std::string made_encoder;
  std::string_view encoder_json, vocab_bpe, text;
  if (input.starts_with('M') && first != std::string_view::npos) {
    vocab_bpe = input.substr(1, first - 1);
    made_encoder = encoder_for(vocab_bpe);
    encoder_json = made_encoder;
    text = input.substr(first + 1);
  } else if (second != std::string_view::npos) {
    encoder_json = input.substr(0, first);
    vocab_bpe = input.substr(first + 1, second - first - 1);
    text = input.substr(second + 1);
  } else {
    static const Fixed fixed;
    static const io::Gpt2Bpe bpe = io::Gpt2Bpe::from_contents(fixed.json, fixed.merges);
    static const Reference ref = Reference::from_contents(fixed.json, fixed.merges);
    check_gpt2(bpe, &ref, input);
    return 0;
  }
  std::optional<io::Gpt2Bpe> bpe;
  try {
    bpe.emplace(io::Gpt2Bpe::from_contents(encoder_json, vocab_bpe));
  } catch (const io::data_error&) {
    return 0;  // a bad file, refused as it should be
  }
  const Reference ref = Reference::from_contents(encoder_json, vocab_bpe);
  check_gpt2(*bpe, &ref, text);
  return 0;
}
