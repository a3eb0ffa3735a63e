#pragma once
// HfTokenizer: a Hugging Face tokenizer.json, text <-> ids, as the tokenizers
// library computes them, for the BPE tokenizers of the models people
// fine-tune: byte-level BPE (GPT-2, Llama 3, Qwen) and SentencePiece-style BPE
// with byte fallback (Llama 2, Mistral, TinyLlama).
//
//   encode: added tokens are found in the text first (hf_tokenizer/added_tokens.hpp);
//           the text between them is normalized (normalizer.hpp), split into
//           pieces (pre_tokenizer.hpp) and each piece tokenized by the BPE model
//           (bpe.hpp); with add_special_tokens, the post-processor's template
//           puts BOS / EOS around the ids (post_processor.hpp)
//   decode: ids -> token strings (an added token's content; special ones
//           dropped with skip_special_tokens) -> the decoder (decoder.hpp)
//
// Anything of a tokenizer.json this does not run (a WordPiece, Unigram or
// WordLevel model, an unknown normalizer, pre-tokenizer, post-processor or
// decoder, BPE dropout) is one data_error naming the member and the type.
// Ids are checked against the reference library (tests/tokenizer/). Text must
// be UTF-8; encode() throws data_error naming the first byte that is not.
//
// Cost: pre-tokenization is PCRE2's JIT over the text; BPE is O(n log n) in a
// piece of n symbols; within one encode() call the ids of short pieces seen
// before are reused. Loading parses the JSON once (about a second for a
// 150k-token vocabulary).
//
// Needs -lpcre2-8 -lutf8proc (Debian libpcre2-dev, libutf8proc-dev): link the
// CMake target headroom::tokenizers.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hf_tokenizer/added_tokens.hpp"
#include "hf_tokenizer/bpe.hpp"
#include "hf_tokenizer/decoder.hpp"
#include "hf_tokenizer/normalizer.hpp"
#include "hf_tokenizer/post_processor.hpp"
#include "hf_tokenizer/pre_tokenizer.hpp"
#include "json.hpp"
#include "tokenizer.hpp"

namespace headroom::io {

class HfTokenizer {
 public:
  struct EncodeOptions {
    bool add_special_tokens = false;  // the post-processor's BOS / EOS
  };
  struct DecodeOptions {
    bool skip_special_tokens = false;  // drop added tokens marked special
  };

  // encode() remembers the ids of up to cache_entries distinct pieces of at
  // most cache_piece_bytes bytes each, for the call.
  static constexpr std::size_t cache_entries = std::size_t{1} << 16;
  static constexpr std::size_t cache_piece_bytes = 64;

  explicit HfTokenizer(const std::filesystem::path& tokenizer_json)
      : HfTokenizer(read(tokenizer_json), tokenizer_json) {}

  // From the file's contents; messages name it `file`.
  HfTokenizer(std::string_view json_text, const std::filesystem::path& file) {
    const std::string where = file.string();
    detail::json::Value root;
    try {
      root = detail::json::parse(json_text);
    } catch (const detail::json::parse_error& e) {
      throw data_error(where + ": " + e.what());
    }
    const detail::hf::Fields f(root, where);
    for (const char* unsupported_member : {"truncation", "padding"})
      if (f.find(unsupported_member))
        throw data_error(f.at(unsupported_member) + ": is set; truncation and padding are not supported (make it null)");
    if (const auto* n = f.find("normalizer")) normalizer_ = detail::hf::Normalizer::from_json(*n, f.at("normalizer"));
    if (const auto* p = f.find("pre_tokenizer"))
      pre_tokenizer_ = detail::hf::PreTokenizer::from_json(*p, f.at("pre_tokenizer"));
    model_ = detail::hf::BpeModel::from_json(f.need("model"), f.at("model"));
    if (const auto* a = f.find("added_tokens"))
      added_ = detail::hf::AddedTokens::from_json(*a, f.at("added_tokens"), normalizer_);
    if (const auto* p = f.find("post_processor"))
      post_processor_ = detail::hf::PostProcessor::from_json(*p, f.at("post_processor"));
    if (const auto* d = f.find("decoder")) decoder_ = detail::hf::Decoder::from_json(*d, f.at("decoder"));

    vocab_size_ = model_.id_bound();
    for (const auto& t : added_.tokens())
      vocab_size_ = std::max(vocab_size_, static_cast<std::size_t>(t.id) + 1);
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the file
    for (const char c : json_text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    static constexpr char hex[] = "0123456789abcdef";
    name_ = "hf-";
    for (int k = 60; k >= 0; k -= 4) name_ += hex[(h >> k) & 15];
  }

  // One more than the largest id of the model's vocab and the added tokens.
  std::size_t vocab_size() const { return vocab_size_; }
  // "hf-" and a hash of the file: a tag for cache file names.
  std::string_view name() const { return name_; }

  // The id of a token string (an added token's content or a vocab entry).
  std::optional<std::int32_t> token_to_id(std::string_view token) const {
    for (const auto& t : added_.tokens())
      if (t.content == token) return t.id;
    const std::int32_t id = model_.id_of(token);
    return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt;
  }

  std::vector<std::int32_t> encode(std::string_view text) const { return encode(text, EncodeOptions{}); }

  std::vector<std::int32_t> encode(std::string_view text, EncodeOptions options) const {
    if (const std::size_t bad = detail::hf::first_invalid_utf8(text); bad != std::string_view::npos)
      throw data_error("tokenizer: the text is not UTF-8: byte " + std::to_string(bad) + " (0x" +
                       hex_byte(text[bad]) + ") starts no valid sequence");
    std::vector<std::int32_t> ids;
    ids.reserve(text.size() / 3);
    Scratch sc;
    const auto token = [&](std::int32_t id) { ids.push_back(id); };
    added_.split(text, false, [&](std::size_t b, std::size_t e) {
      std::string normalized = normalizer_.empty() ? std::string(text.substr(b, e - b))
                                                   : normalizer_(std::string(text.substr(b, e - b)));
      added_.split(normalized, true, [&](std::size_t b2, std::size_t e2) {
        encode_text(std::string_view(normalized).substr(b2, e2 - b2), b == 0 && b2 == 0, sc, ids);
      }, token);
    }, token);
    return options.add_special_tokens ? post_processor_(std::move(ids)) : ids;
  }

  std::string decode(std::span<const std::int32_t> ids) const { return decode(ids, DecodeOptions{}); }

  // Throws data_error for an id no token has.
  std::string decode(std::span<const std::int32_t> ids, DecodeOptions options) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (const auto* a = added_.by_id(ids[i])) {
        if (!(options.skip_special_tokens && a->special)) tokens.push_back(a->content);
      } else if (const std::string* t = model_.token_of(ids[i])) {
        tokens.push_back(*t);
      } else {
        throw data_error("tokenizer: token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                         " is not in the vocabulary (" + std::to_string(vocab_size_) + " ids)");
      }
    }
    return decoder_(std::move(tokens));
  }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Scratch {
    detail::hf::PreTokenized pieces;
    detail::hf::BpeModel::Scratch model;
    std::unordered_map<std::string, std::pair<std::size_t, std::size_t>, Hash, std::equal_to<>> seen;
  };

  static std::string hex_byte(char c) {
    static constexpr char hex[] = "0123456789ABCDEF";
    const auto u = static_cast<unsigned char>(c);
    return {hex[u >> 4], hex[u & 15]};
  }

  static std::string read(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      throw data_error(path.string() + " is a directory; give its tokenizer.json");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw data_error(path.string() + ": cannot open the file");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  void encode_text(std::string_view text, bool at_input_start, Scratch& sc, std::vector<std::int32_t>& ids) const {
    pre_tokenizer_(std::string(text), at_input_start, sc.pieces);
    for (const auto& p : sc.pieces.pieces) {
      const std::string_view piece = sc.pieces.view(p);
      const bool cacheable = piece.size() <= cache_piece_bytes;
      if (cacheable) {
        if (const auto it = sc.seen.find(piece); it != sc.seen.end()) {
          const auto [b, e] = it->second;
          for (std::size_t k = b; k < e; ++k) {
            const std::int32_t id = ids[k];  // a copy: push_back may reallocate
            ids.push_back(id);
          }
          continue;
        }
      }
      const std::size_t begin = ids.size();
      model_.encode(piece, sc.pieces.byte_level, sc.model, ids);
      if (cacheable && sc.seen.size() < cache_entries) sc.seen.emplace(piece, std::pair{begin, ids.size()});
    }
  }

  detail::hf::Normalizer normalizer_;
  detail::hf::PreTokenizer pre_tokenizer_;
  detail::hf::BpeModel model_;
  detail::hf::AddedTokens added_;
  detail::hf::PostProcessor post_processor_;
  detail::hf::Decoder decoder_;
  std::size_t vocab_size_ = 0;
  std::string name_;
};

static_assert(Tokenizer<HfTokenizer>);

}  // namespace headroom::io
