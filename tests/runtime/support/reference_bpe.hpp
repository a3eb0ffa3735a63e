#pragma once
// A transcription of GPT-2's bpe() (openai/gpt-2, src/encoder.py), the
// independent reference the GPT-2 tokenizer's tests and fuzz target compare
// io::Gpt2Bpe with:
//
//   while True:
//       bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float('inf')))
//       if bigram not in self.bpe_ranks: break
//       first, second = bigram
//       new_word = []; i = 0
//       while i < len(word):
//           try: j = word.index(first, i); new_word.extend(word[i:j]); i = j
//           except: new_word.extend(word[i:]); break
//           if word[i] == first and i < len(word)-1 and word[i+1] == second:
//               new_word.append(first+second); i += 2
//           else: new_word.append(word[i]); i += 1
//       word = tuple(new_word)
//       if len(word) == 1: break
//       else: pairs = get_pairs(word)
//
// on token strings (the byte alphabet), quadratic and independent of Gpt2Bpe's
// ids and heap; only the pre-tokenization split (next_piece) is shared.
#include <headroom/io/tokenizer.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace headroom::test {

struct ReferenceBpe {
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::map<std::string, std::int32_t> encoder;

  // From the two files' contents (encoder.json, vocab.bpe), as Gpt2Bpe reads
  // them; only meaningful once Gpt2Bpe accepted them.
  static ReferenceBpe from_contents(std::string_view encoder_json, std::string_view vocab_bpe) {
    ReferenceBpe r;
    headroom::io::detail::gpt2::read_encoder_map(encoder_json, "encoder.json", [&](std::string k, std::uint64_t v, std::size_t) {
      r.encoder[k] = static_cast<std::int32_t>(v);
    });
    int rank = 0;
    std::size_t line_no = 0;
    for (std::size_t pos = 0; pos < vocab_bpe.size();) {
      std::size_t end = vocab_bpe.find('\n', pos);
      if (end == std::string_view::npos) end = vocab_bpe.size();
      std::string_view line = vocab_bpe.substr(pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
      const std::size_t space = line.find(' ');
      r.ranks[{std::string(line.substr(0, space)), std::string(line.substr(space + 1))}] = rank++;
    }
    return r;
  }

  static std::string byte_token(unsigned char b) {
    std::string s;
    headroom::io::detail::append_utf8(s, headroom::io::detail::gpt2::byte_to_unicode[b]);
    return s;
  }

  std::vector<std::string> bpe(std::vector<std::string> word) const {
    while (word.size() > 1) {
      int best = INT_MAX;
      std::pair<std::string, std::string> bigram;
      for (std::size_t i = 0; i + 1 < word.size(); ++i)
        if (const auto it = ranks.find({word[i], word[i + 1]}); it != ranks.end() && it->second < best)
          best = it->second, bigram = it->first;
      if (best == INT_MAX) break;
      const auto& [first, second] = bigram;
      std::vector<std::string> out;
      for (std::size_t i = 0; i < word.size();) {
        const auto j = static_cast<std::size_t>(std::find(word.begin() + static_cast<long>(i), word.end(), first) -
                                                word.begin());
        if (j == word.size()) {
          out.insert(out.end(), word.begin() + static_cast<long>(i), word.end());
          break;
        }
        out.insert(out.end(), word.begin() + static_cast<long>(i), word.begin() + static_cast<long>(j));
        i = j;
        if (word[i] == first && i + 1 < word.size() && word[i + 1] == second) {
          out.push_back(first + second);
          i += 2;
        } else {
          out.push_back(word[i]);
          i += 1;
        }
      }
      word = std::move(out);
    }
    return word;
  }

  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> ids;
    for (std::size_t i = 0; i < text.size();) {
      const std::size_t n = headroom::io::detail::gpt2::next_piece(text, i);
      std::vector<std::string> word;
      for (std::size_t k = i; k < i + n; ++k) word.push_back(byte_token(static_cast<unsigned char>(text[k])));
      for (const auto& tok : bpe(std::move(word))) ids.push_back(encoder.at(tok));
      i += n;
    }
    return ids;
  }
};

}  // namespace headroom::test
