#pragma once
// Tokenizers: text <-> token ids, on the host.
//
//   ByteTokenizer   one token per byte, vocab 256 (needs no files)
//   Gpt2Bpe         GPT-2's byte-level BPE, vocab 50257, from the standard
//                   encoder.json + vocab.bpe (scripts/fetch-corpus --gpt2-bpe)
//
// Both satisfy the `Tokenizer` concept: vocab_size(), encode(text) -> ids,
// decode(ids) -> text, and name() (a short tag used in cache file names).
// Tokens are std::int32_t, as the engines and token files take them.
//
// GPT-2's byte-level BPE (Radford et al. 2019, the files of openai/gpt-2):
//   1. pre-tokenization splits the text into pieces with the regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (implemented by hand below, see detail::gpt2::next_piece);
//   2. each piece's UTF-8 bytes are mapped one to one onto printable code points
//      (byte_to_unicode: printable Latin-1 bytes map to themselves, the other 68
//      bytes to U+0100.. in byte order), so every token is a printable string;
//   3. BPE: starting from one token per byte, the adjacent pair with the lowest
//      merge rank (its line in vocab.bpe) is merged everywhere in the piece,
//      left to right, without overlaps ("a a a" -> "aa a"), until no adjacent
//      pair has a rank (the reference's bpe(), src/encoder.py);
//   4. encoder.json maps each resulting token string to its id.
// Cost: pre-tokenization is linear in the text; BPE is O(n log n) in a piece's
// n bytes (a priority queue of adjacent pairs, see Gpt2Bpe::bpe), so a long
// piece without spaces (a base64 blob, a run of one character) costs O(log n)
// per byte, not O(n) (docs/benchmarks.md#tokenizer).
// "<|endoftext|>" (id 50256) is an entry of encoder.json; encode() treats text
// as plain text (as the reference encoder does) and never emits it: append
// eot_id() yourself between documents.
#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bpe_merge_table.hpp"
#include "json.hpp"
#include "json_string.hpp"

namespace headroom::io {

// Any problem with training data: a missing or malformed corpus, token or
// tokenizer file, a split too short, an id outside a vocabulary. The message
// names the file (where there is one) and the problem.
struct data_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the data pipeline needs of a tokenizer.
template <class T>
concept Tokenizer = requires(const T& t, std::string_view text, std::span<const std::int32_t> ids) {
  { t.vocab_size() } -> std::convertible_to<std::size_t>;
  { t.encode(text) } -> std::same_as<std::vector<std::int32_t>>;
  { t.decode(ids) } -> std::same_as<std::string>;
  { t.name() } -> std::convertible_to<std::string_view>;
};

// One token per byte: id = the byte's value. Round-trips any byte string.
class ByteTokenizer {
 public:
  static constexpr std::size_t vocab_size() { return 256; }
  static constexpr std::string_view name() { return "byte"; }

  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }

  // Throws data_error for an id outside [0, 256).
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string text(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= 256)
        throw data_error("byte tokenizer: token id " + std::to_string(ids[i]) + " at position " +
                         std::to_string(i) + " is outside the vocabulary [0, 256)");
      text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return text;
  }
};

namespace detail::gpt2 {

// --- UTF-8 -------------------------------------------------------------------

using io::detail::append_utf8;  // (io/json_string.hpp)

// One decoded code point and the number of bytes it took. A byte that does not
// start a valid (shortest-form, non-surrogate) UTF-8 sequence decodes as
// itself, U+0080..U+00FF style, with length 1: encoding must accept any bytes.
struct CodePoint {
  char32_t cp;
  std::size_t len;
  bool valid;
};

inline CodePoint decode_utf8(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const CodePoint invalid{c, 1, false};
  if (c < 0x80) return {c, 1, true};
  std::size_t len = 0;
  char32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return invalid;
  }
  if (i + len > s.size()) return invalid;
  for (std::size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return invalid;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  constexpr char32_t min_for_len[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_for_len[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return invalid;
  return {cp, len, true};
}

// --- byte <-> printable code point (GPT-2's bytes_to_unicode) -----------------

// Bytes that are printable Latin-1 characters keep their code point; the others
// (0x00-0x20, 0x7F-0xA0, 0xAD) take U+0100, U+0101, ... in byte order.
inline constexpr std::array<char32_t, 256> byte_to_unicode = [] {
  std::array<char32_t, 256> map{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}();

// The inverse, over U+0000..U+0143; -1 where no byte maps.
inline constexpr std::array<int, 0x144> unicode_to_byte = [] {
  std::array<int, 0x144> inv{};
  for (auto& v : inv) v = -1;
  for (int b = 0; b < 256; ++b) inv[byte_to_unicode[static_cast<std::size_t>(b)]] = b;
  return inv;
}();

// --- character classes of the pre-tokenization regex -------------------------
//
// \s is Unicode's White_Space property, exactly. \p{L} (letter) and \p{N}
// (number) are exact for ASCII and Latin-1 (U+0000..U+00FF), and U+2000..U+20CF
// (general punctuation, super/subscripts' neighbours, currency) is treated as
// neither letter nor number. APPROXIMATION: every other non-ASCII code point
// counts as a letter, so e.g. CJK punctuation, emoji, or non-Latin digits stay
// in the letter run they touch, where GPT-2 would split them off; the BPE still
// produces valid ids, only a different (usually longer) segmentation. English
// text (the corpora here are ASCII plus '£') tokenizes exactly as GPT-2 does.
enum class CharClass : std::uint8_t { Space, Letter, Number, Other };

inline bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

inline CharClass classify(char32_t c) {
  if (is_white_space(c)) return CharClass::Space;
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::Letter;
    if (c >= '0' && c <= '9') return CharClass::Number;
    return CharClass::Other;
  }
  if (c < 0x100) {
    // Latin-1: ª µ º and the letters from U+00C0 except × and ÷; ² ³ ¹ ¼ ½ ¾ are numbers.
    if (c == 0xAA || c == 0xB5 || c == 0xBA || (c >= 0xC0 && c != 0xD7 && c != 0xF7)) return CharClass::Letter;
    if (c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE)) return CharClass::Number;
    return CharClass::Other;
  }
  if (c >= 0x2000 && c <= 0x20CF) return CharClass::Other;
  return CharClass::Letter;  // the approximation described above
}

// The length in bytes of the pre-tokenization piece starting at byte `i` of
// `text` (i < text.size()): the first alternative of the regex that matches.
inline std::size_t next_piece(std::string_view text, std::size_t i) {
  const std::size_t n = text.size();
  const auto at = [&](std::size_t k) { return decode_utf8(text, k); };
  const auto cls = [&](std::size_t k) { return classify(at(k).cp); };
  // Bytes to the end of the run of class `c` starting at k.
  const auto run_end = [&](std::size_t k, CharClass c) {
    while (k < n && cls(k) == c) k += at(k).len;
    return k;
  };

  // 's 't 're 've 'm 'll 'd (case-sensitive, as in GPT-2)
  if (text[i] == '\'') {
    const std::string_view rest = text.substr(i + 1);
    for (std::string_view c : {"re", "ve", "ll", "s", "t", "m", "d"})
      if (rest.starts_with(c)) return 1 + c.size();
  }
  //  ?\p{L}+   ?\p{N}+   ?[^\s\p{L}\p{N}]+
  const std::size_t start = (text[i] == ' ' && i + 1 < n) ? i + 1 : i;
  const CharClass c = cls(start);
  if (c != CharClass::Space) return run_end(start, c) - i;
  // \s+(?!\S)  then  \s+ : a whitespace run, less its last character when a
  // non-space follows it (that character then opens the next piece, " word").
  std::size_t end = i, last = i;
  while (end < n && cls(end) == CharClass::Space) last = end, end += at(end).len;
  if (end == n || last == i) return end - i;
  return last - i;
}

// --- a JSON object of string -> non-negative integer (encoder.json) -----------

// Reads the object that is all of `text`, calling put(key, value, key_offset)
// for each member in file order, without holding the document: one pass of a
// json::Cursor (io/json.hpp). key_offset is the byte of the file where the
// key's opening '"' stands; keys must be valid UTF-8 (io/json_string.hpp),
// values integers in [0, 2^32). Errors are data_errors naming `file` and the byte.
template <class Put>
void read_encoder_map(std::string_view text, const std::filesystem::path& file, Put&& put) {
  const auto fail = [&](std::size_t pos, const std::string& what) {
    throw data_error("gpt2 bpe: " + file.string() + ": byte " + std::to_string(pos) + ": " + what);
  };
  json::Cursor c(text, fail, "unexpected end of file");
  // A token id: no sign, no leading zeros, at most 2^32 - 1.
  const auto id = [&]() -> std::uint64_t {
    if (c.peek() == '-') c.fail("negative token ids are not allowed");
    const json::Digits d = c.digits(std::numeric_limits<std::uint32_t>::max());
    if (d.too_large) c.fail("token id too large");
    if (c.pos == d.begin) c.fail("expected a non-negative integer token id");
    if (d.leading_zero(text, c.pos)) c.fail("leading zeros are not allowed");
    return d.value;
  };
  c.ws();
  if (c.enter('{'))
    while (true) {
      const std::size_t key_offset = c.key();
      std::string key = c.string();
      c.colon();
      const std::uint64_t value = id();
      put(std::move(key), value, key_offset);
      c.ws();
      if (c.peek() == ',') {
        ++c.pos;
        c.ws();
        continue;
      }
      c.expect('}');
      break;
    }
  c.ws();
  if (!c.at_end()) c.fail("unexpected characters after the object");
}

// A token string for a message: quoted, at most 64 bytes of it.
inline std::string shown(std::string_view s) {
  constexpr std::size_t most = 64;
  return "\"" + std::string(s.substr(0, most)) + (s.size() > most ? "\"..." : "\"");
}

inline std::string read_file(const std::filesystem::path& path, std::string_view who) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st))
    throw data_error(std::string(who) + ": " + path.string() + " is a directory, not a file");
  if (!fs::exists(st))
    throw data_error(std::string(who) + ": " + path.string() +
                     ": file not found (scripts/fetch-corpus --gpt2-bpe downloads GPT-2's files)");
  if (!fs::is_regular_file(st))
    throw data_error(std::string(who) + ": " + path.string() + " is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw data_error(std::string(who) + ": " + path.string() + ": cannot open the file");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace detail::gpt2

// GPT-2's byte-level BPE tokenizer (50257 ids). Construction reads and checks
// both files; encode/decode are const and thread-safe.
class Gpt2Bpe {
 public:
  // The work one encode() call did, counted: tests bound the algorithm's cost
  // by these, not by a clock.
  struct EncodeStats {
    std::size_t pieces = 0;        // pre-tokenization pieces
    std::size_t cached = 0;        // of those, repeats taken from the call's cache
    std::size_t symbols = 0;       // bytes of the pieces BPE ran on: the symbols it started from
    std::size_t merges = 0;        // pair merges (each removes one symbol)
    std::size_t passes = 0;        // rounds of "merge every occurrence of the lowest-ranked pair"
    std::size_t pair_lookups = 0;  // probes of the merge table
    std::size_t pairs_queued = 0;  // pairs put in the queue
    std::size_t pairs_taken = 0;   // pairs taken out of it (stale ones included)
  };

  // A vocab.bpe line longer than this is an error (GPT-2's longest is 257 bytes).
  static constexpr std::size_t max_merge_line_bytes = 4096;
  // encode() remembers the tokens of up to cache_entries distinct pieces of at
  // most cache_piece_bytes bytes each, for the call: bounded memory, and
  // prose's repeated words are tokenized once.
  static constexpr std::size_t cache_entries = std::size_t{1} << 16;
  static constexpr std::size_t cache_piece_bytes = 64;

  // Reads `dir`/encoder.json and `dir`/vocab.bpe.
  explicit Gpt2Bpe(const std::filesystem::path& dir)
      : Gpt2Bpe(checked_dir(dir) / "encoder.json", dir / "vocab.bpe") {}

  // encoder.json: a JSON object token string -> id, the ids exactly 0..N-1,
  // every key a distinct non-empty string of GPT-2's byte alphabet (valid UTF-8).
  // vocab.bpe: an optional "#version" line, then one merge "left right" per
  // line, highest priority first (rank = line number among the merges); at
  // least one merge, none repeated, both tokens and their concatenation in
  // the encoder, lines of at most max_merge_line_bytes. Every violation is a
  // data_error naming the file and the byte (encoder.json) or line (vocab.bpe).
  Gpt2Bpe(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe) {
    load_encoder(detail::gpt2::read_file(encoder_json, "gpt2 bpe"), encoder_json);
    load_merges(detail::gpt2::read_file(vocab_bpe, "gpt2 bpe"), vocab_bpe);
  }

  // The same from the two files' contents, already in memory; error messages
  // name them `encoder_json` and `vocab_bpe`.
  static Gpt2Bpe from_contents(std::string_view encoder_text, std::string_view merges_text,
                               const std::filesystem::path& encoder_json = "encoder.json",
                               const std::filesystem::path& vocab_bpe = "vocab.bpe") {
    Gpt2Bpe t;
    t.load_encoder(encoder_text, encoder_json);
    t.load_merges(merges_text, vocab_bpe);
    return t;
  }

  std::size_t vocab_size() const { return token_bytes_.size(); }
  static constexpr std::string_view name() { return "gpt2"; }
  // The id of "<|endoftext|>" (50256 in GPT-2's files).
  std::int32_t eot_id() const { return eot_id_; }

  std::vector<std::int32_t> encode(std::string_view text) const {
    EncodeStats stats;
    return encode(text, stats);
  }

  // encode(text), and what it cost in `stats`.
  std::vector<std::int32_t> encode(std::string_view text, EncodeStats& stats) const {
    stats = {};
    std::vector<std::int32_t> ids;
    ids.reserve(text.size() / 3);
    std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> seen;  // piece -> [begin, end) in ids
    Scratch scratch;
    std::vector<std::int32_t> word;
    for (std::size_t i = 0; i < text.size();) {
      const std::size_t len = detail::gpt2::next_piece(text, i);
      const std::string_view piece = text.substr(i, len);
      i += len;
      ++stats.pieces;
      const bool cacheable = len <= cache_piece_bytes;
      if (cacheable) {
        if (const auto it = seen.find(piece); it != seen.end()) {
          ++stats.cached;
          const auto [b, e] = it->second;
          for (std::size_t k = b; k < e; ++k) {
            const std::int32_t id = ids[k];  // a copy: push_back may reallocate
            ids.push_back(id);
          }
          continue;
        }
      }
      bpe(piece, scratch, word, stats);
      if (cacheable && seen.size() < cache_entries)
        seen.emplace(piece, std::pair{ids.size(), ids.size() + word.size()});
      ids.insert(ids.end(), word.begin(), word.end());
    }
    return ids;
  }

  // Throws data_error for an id outside [0, vocab_size()).
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string text;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || static_cast<std::size_t>(ids[i]) >= token_bytes_.size())
        throw data_error("gpt2 bpe: token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                         " is outside the vocabulary [0, " + std::to_string(token_bytes_.size()) + ")");
      text += token_bytes_[static_cast<std::size_t>(ids[i])];
    }
    return text;
  }

  // The bytes token `id` stands for (id in [0, vocab_size())).
  const std::string& token_bytes(std::int32_t id) const { return token_bytes_.at(static_cast<std::size_t>(id)); }

 private:
  using Merge = detail::bpe::Merge;
  using MergeTable = detail::bpe::MergeTable;
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) { return detail::bpe::pair_key(a, b); }

  // One piece's symbols while BPE runs on it, and its queue of pairs. A
  // symbol is named by the byte it starts at; symbol 0 is always alive. Kept
  // across the pieces of one encode() call so the storage is reused.
  struct Symbol {
    std::int32_t id;     // its token; -1 once merged into its left neighbour
    std::uint32_t prev;  // the live symbol before, none at the start
    std::uint32_t next;  // the live symbol after, none at the end
  };
  struct Scratch {
    std::vector<Symbol> sym;                          // (n) one per byte of the piece, at first
    std::vector<std::uint32_t> bucket_of_rank;        // (merges) rank -> its bucket, none while it has none
    std::vector<std::vector<std::uint32_t>> buckets;  // each: the left symbols of pairs of one rank (some stale)
    std::vector<std::uint32_t> free_buckets;          // buckets not in use
    std::vector<std::uint32_t> ranks;                 // min-heap of the ranks that have a bucket
    std::vector<std::uint32_t> merged;                // symbols that took their right neighbour in this pass
  };
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

  // BPE on one piece: `word` receives its token ids. Exactly the reference's
  // loop (find the lowest-ranked adjacent pair; merge all its occurrences left
  // to right without overlaps; repeat), done with a priority queue of pairs:
  //   * every adjacent pair that has a rank sits in its rank's bucket (by its
  //     left symbol); a min-heap holds the ranks whose bucket is not empty;
  //   * an entry goes stale when its pair changes (a neighbour merged); it is
  //     not removed but skipped when taken: its left symbol is gone or the
  //     pair there now has another rank (lazy invalidation);
  //   * a pass empties the lowest rank's bucket, left to right (sorted by
  //     symbol), merging the entries that are still that pair: a symbol taken
  //     by the merge on its left is gone, so "a a a" under (a, a) gives
  //     "aa a", as the reference's scan does;
  //   * the pairs a pass creates (each merged symbol with its two neighbours)
  //     are queued after the pass, so one of lower rank cannot cut in before
  //     the pass has merged every occurrence, as the reference's would not.
  // Each merge removes a symbol and queues at most 2 pairs: at most n - 1
  // merges, 3n entries queued, taken and sorted once: O(n log n) for n bytes.
  // Buckets keep this local in memory: the heap holds ranks, not pairs.
  void bpe(std::string_view piece, Scratch& sc, std::vector<std::int32_t>& word, EncodeStats& stats) const {
    const std::size_t n = piece.size();
    word.clear();
    stats.symbols += n;
    if (n >= none)
      throw data_error("gpt2 bpe: a pre-tokenization piece of " + std::to_string(n) +
                       " bytes; pieces of up to 4 GiB - 2 bytes are supported");
    if (n == 1) {
      word.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    sc.sym.resize(n);
    for (std::size_t k = 0; k < n; ++k)
      sc.sym[k] = {byte_id_[static_cast<unsigned char>(piece[k])], k == 0 ? none : static_cast<std::uint32_t>(k - 1),
                   k + 1 == n ? none : static_cast<std::uint32_t>(k + 1)};
    if (sc.bucket_of_rank.size() != merges_.size()) sc.bucket_of_rank.assign(merges_.size(), none);
    constexpr std::greater<std::uint32_t> min_first{};
    const auto lookup = [&](std::uint32_t i) -> const Merge* {  // the pair (i, next[i]), if it has a rank
      const std::uint32_t j = sc.sym[i].next;
      if (j == none) return nullptr;
      ++stats.pair_lookups;
      return merges_.find(pair_key(sc.sym[i].id, sc.sym[j].id));
    };
    const auto queue = [&](std::uint32_t i) {  // the pair (i, next[i]) into its rank's bucket
      const Merge* m = lookup(i);
      if (!m) return;
      const auto rank = static_cast<std::uint32_t>(m->rank);
      std::uint32_t& b = sc.bucket_of_rank[rank];
      if (b == none) {
        if (sc.free_buckets.empty()) {
          sc.free_buckets.push_back(static_cast<std::uint32_t>(sc.buckets.size()));
          sc.buckets.emplace_back();
        }
        b = sc.free_buckets.back();
        sc.free_buckets.pop_back();
        sc.ranks.push_back(rank);
        std::push_heap(sc.ranks.begin(), sc.ranks.end(), min_first);
      }
      sc.buckets[b].push_back(i);
      ++stats.pairs_queued;
    };

    for (std::uint32_t k = 0; k + 1 < n; ++k) queue(k);
    while (!sc.ranks.empty()) {
      std::pop_heap(sc.ranks.begin(), sc.ranks.end(), min_first);
      const std::uint32_t rank = sc.ranks.back();
      sc.ranks.pop_back();
      const std::uint32_t b = std::exchange(sc.bucket_of_rank[rank], none);
      std::vector<std::uint32_t>& pass = sc.buckets[b];
      if (!std::is_sorted(pass.begin(), pass.end())) std::sort(pass.begin(), pass.end());
      ++stats.passes;
      sc.merged.clear();
      for (const std::uint32_t i : pass) {  // left to right
        ++stats.pairs_taken;
        if (sc.sym[i].id < 0) continue;  // taken by the merge on its left
        const Merge* m = lookup(i);
        if (!m || static_cast<std::uint32_t>(m->rank) != rank) continue;  // stale: the pair changed
        Symbol& left = sc.sym[i];
        Symbol& right = sc.sym[left.next];
        left.id = m->merged;
        right.id = -1;
        left.next = right.next;
        if (right.next != none) sc.sym[right.next].prev = i;
        sc.merged.push_back(i);
        ++stats.merges;
      }
      pass.clear();
      sc.free_buckets.push_back(b);
      for (const std::uint32_t i : sc.merged) {  // the pairs the pass made: (prev, i) and (i, next)
        if (sc.sym[i].prev != none) queue(sc.sym[i].prev);
        queue(i);
      }
    }
    for (std::uint32_t i = 0; i != none; i = sc.sym[i].next) word.push_back(sc.sym[i].id);
  }

  static const std::filesystem::path& checked_dir(const std::filesystem::path& dir) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(dir, ec))
      throw data_error("gpt2 bpe: " + dir.string() +
                       " is a file; give the directory that holds encoder.json and vocab.bpe");
    return dir;
  }

  Gpt2Bpe() = default;

  void load_encoder(std::string_view text, const std::filesystem::path& path) {
    using detail::gpt2::shown;
    const auto fail = [&](const std::string& what) { throw data_error("gpt2 bpe: " + path.string() + ": " + what); };
    const auto fail_at = [&](std::size_t byte, const std::string& what) {
      fail("byte " + std::to_string(byte) + ": " + what);
    };
    struct Entry {
      std::string key;
      std::uint64_t id;
      std::size_t offset;  // of the key's opening '"'
    };
    std::vector<Entry> entries;
    detail::gpt2::read_encoder_map(text, path, [&](std::string key, std::uint64_t id, std::size_t offset) {
      entries.push_back({std::move(key), id, offset});
    });
    if (entries.empty()) fail("no tokens in the encoder");
    const std::size_t n = entries.size();
    token_bytes_.assign(n, {});
    std::vector<std::size_t> offset_of_id(n, 0);
    std::vector<bool> taken(n, false);
    for (auto& [key, id, offset] : entries) {
      if (key.empty()) fail_at(offset, "an empty token string \"\" (id " + std::to_string(id) + ")");
      if (const auto it = ids_.find(key); it != ids_.end())
        fail_at(offset, "token " + shown(key) + " appears twice (first at byte " +
                            std::to_string(offset_of_id[static_cast<std::size_t>(it->second)]) + ")");
      if (id >= n)
        fail_at(offset, "token " + shown(key) + " has id " + std::to_string(id) + "; the " + std::to_string(n) +
                            " ids must be exactly 0.." + std::to_string(n - 1));
      if (taken[id])
        fail_at(offset, "token " + shown(key) + " has id " + std::to_string(id) + ", already given to token " +
                            shown(token_string(id)) + " at byte " + std::to_string(offset_of_id[id]));
      taken[id] = true;
      offset_of_id[id] = offset;
      // The token's bytes: each code point of the key maps back to one byte.
      std::string bytes;
      for (std::size_t i = 0; i < key.size();) {
        const auto c = detail::gpt2::decode_utf8(key, i);  // valid: the parser checked the UTF-8
        const int b = c.cp < detail::gpt2::unicode_to_byte.size() ? detail::gpt2::unicode_to_byte[c.cp] : -1;
        if (b < 0)
          fail_at(offset, "token " + shown(key) + " (id " + std::to_string(id) + ") is not in GPT-2's byte alphabet");
        bytes += static_cast<char>(b);
        i += c.len;
      }
      token_bytes_[id] = std::move(bytes);
      ids_.emplace(std::move(key), static_cast<std::int32_t>(id));
    }
    for (int b = 0; b < 256; ++b) {
      std::string single;
      detail::gpt2::append_utf8(single, detail::gpt2::byte_to_unicode[static_cast<std::size_t>(b)]);
      const auto it = ids_.find(single);
      if (it == ids_.end()) fail("no token for the single byte " + std::to_string(b));
      byte_id_[static_cast<std::size_t>(b)] = it->second;
    }
    if (const auto it = ids_.find("<|endoftext|>"); it != ids_.end()) eot_id_ = it->second;
  }

  // Token `id` as encoder.json spells it (its bytes through byte_to_unicode).
  std::string token_string(std::size_t id) const {
    std::string s;
    for (const char c : token_bytes_[id])
      detail::gpt2::append_utf8(s, detail::gpt2::byte_to_unicode[static_cast<unsigned char>(c)]);
    return s;
  }

  void load_merges(std::string_view text, const std::filesystem::path& path) {
    using detail::gpt2::shown;
    std::vector<std::size_t> line_of_rank;  // rank -> its line
    std::size_t line_no = 0;
    for (std::size_t pos = 0; pos < text.size();) {
      std::size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      ++line_no;
      const auto fail = [&](const std::string& what) {
        throw data_error("gpt2 bpe: " + path.string() + ": line " + std::to_string(line_no) + ": " + what);
      };
      if (line.size() > max_merge_line_bytes)
        fail("the line is " + std::to_string(line.size()) + " bytes long; a merge line has at most " +
             std::to_string(max_merge_line_bytes) + " (is this GPT-2's vocab.bpe?)");
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
      const std::size_t space = line.find(' ');
      if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string_view::npos)
        fail("expected a merge \"left right\", got " + shown(line));
      const std::string left(line.substr(0, space)), right(line.substr(space + 1));
      const auto l = ids_.find(left), r = ids_.find(right), m = ids_.find(left + right);
      if (l == ids_.end())
        fail("merge " + shown(line) + ": its left token " + shown(left) + " is not in the encoder");
      if (r == ids_.end())
        fail("merge " + shown(line) + ": its right token " + shown(right) + " is not in the encoder");
      if (m == ids_.end())
        fail("merge " + shown(line) + ": its result " + shown(left + right) + " is not in the encoder");
      const auto rank = static_cast<std::int32_t>(line_of_rank.size());
      if (const Merge* first = merges_.insert(pair_key(l->second, r->second), Merge{rank, m->second}))
        fail("merge " + shown(line) + " repeats line " +
             std::to_string(line_of_rank[static_cast<std::size_t>(first->rank)]));
      line_of_rank.push_back(line_no);
    }
    if (merges_.empty())
      throw data_error("gpt2 bpe: " + path.string() +
                       ": no merges (no \"left right\" line after the \"#version\" line); GPT-2's vocab.bpe has 50000");
  }

  std::unordered_map<std::string, std::int32_t> ids_;    // token string (byte alphabet) -> id
  std::vector<std::string> token_bytes_;                 // id -> the bytes it stands for
  std::array<std::int32_t, 256> byte_id_{};              // byte -> id of its single-byte token
  MergeTable merges_;                                    // (left id, right id) -> rank, merged id
  std::int32_t eot_id_ = -1;                             // -1 when the encoder has no "<|endoftext|>"
};

static_assert(Tokenizer<ByteTokenizer>);
static_assert(Tokenizer<Gpt2Bpe>);

}  // namespace headroom::io
