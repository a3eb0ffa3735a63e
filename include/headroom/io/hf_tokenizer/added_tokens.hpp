#pragma once
// tokenizer.json "added_tokens": strings matched in the text before the model
// sees it, each becoming its id whole ("<|begin_of_text|>", "<|im_start|>").
//
// Each entry: {id, content, special, lstrip, rstrip, single_word, normalized}.
// Tokens with normalized false are found in the raw text; the text between
// them is normalized, and tokens with normalized true are found in that (their
// content normalized as the text is). A search takes, at the leftmost place
// where any token starts, the longest one there (leftmost-longest, as the
// reference's Aho-Corasick automaton does), and resumes after it. single_word:
// only where no letter or digit touches it; lstrip / rstrip: the whitespace
// before / after it goes with it.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fields.hpp"
#include "normalizer.hpp"
#include "text.hpp"

namespace headroom::io::detail::hf {

struct AddedToken {
  std::string content;
  std::int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
};

class AddedTokens {
 public:
  AddedTokens() = default;

  static AddedTokens from_json(const JsonValue& list, const std::string& where, const Normalizer& normalizer) {
    AddedTokens a;
    if (list.kind == JsonKind::Null) return a;
    if (list.kind != JsonKind::Array) throw data_error(where + ": expected an array");
    for (std::size_t i = 0; i < list.items.size(); ++i) {
      const Fields f(list.items[i], where + "[" + std::to_string(i) + "]");
      AddedToken t{f.string("content"),
                   static_cast<std::int32_t>(f.integer("id", 0, std::numeric_limits<std::int32_t>::max() - 1)),
                   f.boolean("special", false),
                   f.boolean("lstrip", false),
                   f.boolean("rstrip", false),
                   f.boolean("single_word", false),
                   f.boolean("normalized", true)};
      if (t.content.empty()) f.fail("an added token with empty content");
      if (a.by_id_.contains(t.id))
        f.fail("id " + std::to_string(t.id) + " is given to " + printable(a.tokens_[a.by_id_[t.id]].content) +
               " and to " + printable(t.content));
      a.by_id_.emplace(t.id, a.tokens_.size());
      const std::string pattern = t.normalized && !normalizer.empty() ? normalizer(t.content) : t.content;
      (t.normalized ? a.normalized_ : a.raw_).add(pattern, a.tokens_.size());
      a.tokens_.push_back(std::move(t));
    }
    return a;
  }

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // The added token with `id`, or null.
  const AddedToken* by_id(std::int32_t id) const {
    const auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &tokens_[it->second];
  }

  // Over `s`, in order: text(begin, end) for each stretch between tokens (not
  // empty) and token(id) for each token found; `normalized` picks the tokens
  // searched (see the top of this file).
  template <class Text, class Token>
  void split(std::string_view s, bool normalized, Text&& text, Token&& token) const {
    const Trie& trie = normalized ? normalized_ : raw_;
    std::size_t done = 0;  // s[0, done) handed out
    if (!trie.empty())
      for (std::size_t i = 0; i < s.size();) {
        std::size_t len = 0, which = 0;
        if (!trie.longest_at(s, i, len, which)) {
          ++i;
          continue;
        }
        const AddedToken& t = tokens_[which];
        std::size_t start = i, stop = i + len;
        i = stop;
        if (t.single_word) {
          const bool alone_before = start == 0 || !is_alphanumeric(code_point_before(s, start).cp);
          const bool alone_after = stop == s.size() || !is_alphanumeric(code_point_at(s, stop).cp);
          if (!alone_before || !alone_after) continue;
        }
        if (t.lstrip)
          while (start > done && is_whitespace(code_point_before(s, start).cp)) start -= code_point_before(s, start).len;
        if (t.rstrip)
          while (stop < s.size() && is_whitespace(code_point_at(s, stop).cp)) stop += code_point_at(s, stop).len;
        if (start > done) text(done, start);
        token(t.id);
        done = stop;
        i = stop;
      }
    if (done < s.size()) text(done, s.size());
  }

 private:
  // A byte trie of token contents.
  class Trie {
   public:
    bool empty() const { return nodes_.size() <= 1; }
    void add(const std::string& key, std::size_t token) {
      std::uint32_t node = 0;
      for (const char c : key) {
        const std::uint64_t edge = (std::uint64_t{node} << 8) | static_cast<unsigned char>(c);
        auto it = edges_.find(edge);
        if (it == edges_.end()) {
          it = edges_.emplace(edge, static_cast<std::uint32_t>(nodes_.size())).first;
          nodes_.push_back(none);
        }
        node = it->second;
      }
      if (nodes_[node] == none) nodes_[node] = static_cast<std::uint32_t>(token);  // a repeat: the first wins
      first_[static_cast<unsigned char>(key[0])] = true;
    }
    // The longest key starting at s[i]: its length and token.
    bool longest_at(std::string_view s, std::size_t i, std::size_t& len, std::size_t& token) const {
      if (!first_[static_cast<unsigned char>(s[i])]) return false;
      bool found = false;
      std::uint32_t node = 0;
      for (std::size_t k = i; k < s.size(); ++k) {
        const auto it = edges_.find((std::uint64_t{node} << 8) | static_cast<unsigned char>(s[k]));
        if (it == edges_.end()) break;
        node = it->second;
        if (nodes_[node] != none) {
          found = true;
          len = k + 1 - i;
          token = nodes_[node];
        }
      }
      return found;
    }

   private:
    static constexpr std::uint32_t none = 0xFFFFFFFFu;
    std::vector<std::uint32_t> nodes_{none};  // node -> the token ending there, or none; node 0 the root
    std::unordered_map<std::uint64_t, std::uint32_t> edges_;  // (node, byte) -> node
    std::array<bool, 256> first_{};
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<std::int32_t, std::size_t> by_id_;
  Trie raw_, normalized_;
};

}  // namespace headroom::io::detail::hf
