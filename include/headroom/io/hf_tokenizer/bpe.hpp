#pragma once
// tokenizer.json "model" of type BPE: one piece -> token ids.
//
//   vocab            token string -> id
//   merges           "left right" strings or [left, right] pairs, highest
//                    priority first; left, right and left+right in the vocab
//   ignore_merges    a piece that is a token as a whole is that token
//   byte_fallback    a character outside the vocab becomes its UTF-8 bytes'
//                    "<0xXX>" tokens
//   unk_token, fuse_unk
//                    else it becomes unk_token (consecutive ones one token
//                    with fuse_unk); without unk_token it is dropped
// Refused, each by name: dropout (encoding would be random), a
// continuing_subword_prefix or end_of_word_suffix other than empty.
//
// The merge loop is the reference library's: adjacent pairs with a merge are
// taken lowest (rank, position) first; one is merged when its pair still
// yields the merged id it was queued with, and the pairs the merge makes with
// its neighbours are queued (see merge_all). O(n log n) for n symbols.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <functional>
#include <utility>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../bpe_merge_table.hpp"
#include "fields.hpp"
#include "text.hpp"

namespace headroom::io::detail::hf {

class BpeModel {
 public:
  static BpeModel from_json(const JsonValue& v, const std::string& where) {
    const Fields f(v, where);
    if (const auto type = f.optional_string("type"); type && *type != "BPE")
      unsupported(f, "model", *type, "BPE");
    if (f.find("dropout"))
      throw data_error(f.at("dropout") + ": BPE dropout is not supported (it makes encoding random)");
    for (const char* m : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (const auto s = f.optional_string(m); s && !s->empty())
        throw data_error(f.at(m) + ": " + printable(*s) + " is not supported (only none or \"\")");
    BpeModel b;
    b.byte_fallback_ = f.boolean("byte_fallback", false);
    b.fuse_unk_ = f.boolean("fuse_unk", false);
    b.ignore_merges_ = f.boolean("ignore_merges", false);
    b.load_vocab(f);
    if (const auto unk = f.optional_string("unk_token")) {
      const auto it = b.vocab_.find(*unk);
      if (it == b.vocab_.end()) throw data_error(f.at("unk_token") + ": " + printable(*unk) + " is not in the vocab");
      b.unk_id_ = it->second;
    }
    b.load_merges(f);
    return b;
  }

  // The id of `token`, or -1.
  std::int32_t id_of(std::string_view token) const {
    const auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
  }
  // The token string of `id`, or null where no token has it.
  const std::string* token_of(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size() || !has_id_[static_cast<std::size_t>(id)])
      return nullptr;
    return &tokens_[static_cast<std::size_t>(id)];
  }
  // One more than the largest id.
  std::size_t id_bound() const { return tokens_.size(); }

  struct Scratch {
    struct Symbol {
      std::int32_t id;
      std::uint32_t len;  // bytes; 0 once merged into its left neighbour
      std::uint32_t prev, next;
    };
    std::vector<Symbol> symbols;
    std::vector<std::uint32_t> bucket_of_rank;        // rank -> its bucket, none while it has none
    std::vector<std::vector<std::uint32_t>> buckets;  // each: left symbols of pairs of one rank (some expired)
    std::vector<std::uint32_t> free_buckets;
    std::vector<std::uint32_t> ranks;  // min-heap of the ranks that have a bucket
    std::vector<std::uint32_t> taking;  // the entries of the bucket being taken
    std::string mapped;
  };

  // Appends the ids of `piece` to `out`. byte_level: the piece is raw bytes,
  // each a symbol of the byte alphabet.
  void encode(std::string_view piece, bool byte_level, Scratch& sc, std::vector<std::int32_t>& out) const {
    if (ignore_merges_) {
      std::string_view whole = piece;
      if (byte_level) whole = map_bytes(piece, sc.mapped);
      if (const auto it = vocab_.find(std::string(whole)); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    initial_symbols(piece, byte_level, sc);
    merge_all(sc);
    for (const auto& s : sc.symbols)
      if (s.len != 0) out.push_back(s.id);
  }

 private:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

  static std::string_view map_bytes(std::string_view bytes, std::string& out) {
    out.clear();
    for (const char c : bytes) append_utf8(out, gpt2::byte_to_unicode[static_cast<unsigned char>(c)]);
    return out;
  }

  void add_symbol(Scratch& sc, std::int32_t id, std::size_t len) const {
    const auto n = static_cast<std::uint32_t>(sc.symbols.size());
    if (n > 0) sc.symbols.back().next = n;
    sc.symbols.push_back({id, static_cast<std::uint32_t>(len), n == 0 ? none : n - 1, none});
  }

  // One symbol per character (byte_level: per byte), unknown ones as the
  // reference treats them.
  void initial_symbols(std::string_view piece, bool byte_level, Scratch& sc) const {
    sc.symbols.clear();
    if (piece.size() >= none) throw data_error("tokenizer: a piece of " + std::to_string(piece.size()) + " bytes");
    std::int32_t unk_len = 0;  // bytes of the unknown run waiting to be added (fuse_unk), 0: none
    const auto flush_unk = [&] {
      if (unk_len) add_symbol(sc, unk_id_, static_cast<std::size_t>(unk_len));
      unk_len = 0;
    };
    std::string ch;
    for (std::size_t i = 0; i < piece.size();) {
      std::int32_t id;
      std::size_t len;
      if (byte_level) {
        const auto b = static_cast<unsigned char>(piece[i]);
        id = byte_ids_[b];
        len = 1;
        if (id < 0) map_bytes(piece.substr(i, 1), ch);
      } else {
        len = code_point_at(piece, i).len;
        ch.assign(piece.substr(i, len));
        const auto it = vocab_.find(ch);
        id = it == vocab_.end() ? -1 : it->second;
      }
      i += len;
      if (id >= 0) {
        flush_unk();
        add_symbol(sc, id, len);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (const char c : ch) all = all && fallback_ids_[static_cast<unsigned char>(c)] >= 0;
        if (all) {
          for (const char c : ch) add_symbol(sc, fallback_ids_[static_cast<unsigned char>(c)], 1);
          continue;
        }
      }
      if (unk_id_ >= 0) {
        if (unk_len && !fuse_unk_) flush_unk();
        unk_len += static_cast<std::int32_t>(len);
      }
    }
    flush_unk();
  }

  // The reference's order, (rank, position) lowest first, kept with a bucket
  // of left symbols per rank and a min-heap of the ranks that have one: the
  // heap holds ranks, not pairs, and a bucket is taken left to right (sorted
  // once), so a piece of millions of symbols stays near-linear. A merge may
  // queue a pair of a lower rank than the bucket being taken (files whose
  // merges are out of order): then the rest of the bucket goes back and the
  // lower rank is taken first, as the reference's heap would.
  void merge_all(Scratch& sc) const {
    auto& sym = sc.symbols;
    if (sc.bucket_of_rank.size() != rank_merged_.size()) sc.bucket_of_rank.assign(rank_merged_.size(), none);
    const auto lookup = [&](std::uint32_t left) -> const bpe::Merge* {
      const std::uint32_t right = sym[left].next;
      return right == none ? nullptr : merges_.find(bpe::pair_key(sym[left].id, sym[right].id));
    };
    const auto add = [&](std::uint32_t rank, std::uint32_t left) {
      std::uint32_t& b = sc.bucket_of_rank[rank];
      if (b == none) {
        if (sc.free_buckets.empty()) {
          sc.free_buckets.push_back(static_cast<std::uint32_t>(sc.buckets.size()));
          sc.buckets.emplace_back();
        }
        b = sc.free_buckets.back();
        sc.free_buckets.pop_back();
        sc.ranks.push_back(rank);
        std::push_heap(sc.ranks.begin(), sc.ranks.end(), std::greater<>{});
      }
      sc.buckets[b].push_back(left);
    };
    const auto queue = [&](std::uint32_t left) {
      if (const bpe::Merge* m = lookup(left)) add(static_cast<std::uint32_t>(m->rank), left);
    };
    for (std::uint32_t k = 0; k + 1 < sym.size(); ++k) queue(k);
    while (!sc.ranks.empty()) {
      std::pop_heap(sc.ranks.begin(), sc.ranks.end(), std::greater<>{});
      const std::uint32_t rank = sc.ranks.back();
      sc.ranks.pop_back();
      const std::uint32_t b = std::exchange(sc.bucket_of_rank[rank], none);
      std::vector<std::uint32_t>& entries = sc.taking;  // the bucket's entries, its storage back to the pool
      entries.clear();
      std::swap(entries, sc.buckets[b]);
      sc.free_buckets.push_back(b);
      if (!std::is_sorted(entries.begin(), entries.end())) std::sort(entries.begin(), entries.end());
      const std::int32_t merged = rank_merged_[rank];
      for (std::size_t e = 0; e < entries.size(); ++e) {
        const std::uint32_t i = entries[e];
        auto& cur = sym[i];
        if (cur.len == 0 || cur.next == none) continue;
        const bpe::Merge* m = lookup(i);
        if (!m || m->merged != merged) continue;  // an expired entry
        const std::uint32_t right = cur.next;
        cur.id = merged;
        cur.len += sym[right].len;
        cur.next = sym[right].next;
        sym[right].len = 0;
        if (cur.next != none) sym[cur.next].prev = i;
        if (cur.prev != none) queue(cur.prev);
        queue(i);
        if (!sc.ranks.empty() && sc.ranks.front() < rank) {  // a lower rank first: the rest goes back
          for (std::size_t rest = e + 1; rest < entries.size(); ++rest) add(rank, entries[rest]);
          break;
        }
      }
    }
  }

  void load_vocab(const Fields& f) {
    const JsonValue& vocab = f.need("vocab");
    if (vocab.kind != JsonKind::Object) throw data_error(f.at("vocab") + ": expected an object token -> id");
    if (vocab.keys.empty()) throw data_error(f.at("vocab") + ": no tokens");
    vocab_.reserve(vocab.keys.size());
    for (std::size_t i = 0; i < vocab.keys.size(); ++i) {
      const auto id = vocab.items[i].integer();
      if (!id || *id < 0 || *id >= std::numeric_limits<std::int32_t>::max())
        throw data_error(f.at("vocab") + ": token " + printable(vocab.keys[i]) + " has no id in [0, 2^31 - 1)");
      const auto k = static_cast<std::size_t>(*id);
      if (k >= tokens_.size()) {
        tokens_.resize(k + 1);
        has_id_.resize(k + 1, false);
      }
      if (has_id_[k])
        throw data_error(f.at("vocab") + ": id " + std::to_string(k) + " is given to " + printable(tokens_[k]) +
                         " and to " + printable(vocab.keys[i]));
      has_id_[k] = true;
      tokens_[k] = vocab.keys[i];
      vocab_.emplace(vocab.keys[i], static_cast<std::int32_t>(k));
    }
    byte_ids_.fill(-1);
    fallback_ids_.fill(-1);
    std::string s;
    for (int b = 0; b < 256; ++b) {
      s.clear();
      append_utf8(s, gpt2::byte_to_unicode[static_cast<std::size_t>(b)]);
      if (const auto it = vocab_.find(s); it != vocab_.end()) byte_ids_[static_cast<std::size_t>(b)] = it->second;
      static constexpr char hex[] = "0123456789ABCDEF";
      s = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
      if (const auto it = vocab_.find(s); it != vocab_.end()) fallback_ids_[static_cast<std::size_t>(b)] = it->second;
    }
  }

  void load_merges(const Fields& f) {
    const JsonValue& merges = f.array("merges");
    for (std::size_t r = 0; r < merges.items.size(); ++r) {
      const JsonValue& m = merges.items[r];
      const std::string where = f.at("merges") + "[" + std::to_string(r) + "]";
      std::string left, right;
      if (m.kind == JsonKind::String) {
        const std::size_t space = m.string.find(' ');
        if (space == std::string::npos || m.string.find(' ', space + 1) != std::string::npos)
          throw data_error(where + ": expected \"left right\", got " + printable(m.string));
        left = m.string.substr(0, space);
        right = m.string.substr(space + 1);
      } else if (m.kind == JsonKind::Array && m.items.size() == 2 && m.items[0].kind == JsonKind::String &&
                 m.items[1].kind == JsonKind::String) {
        left = m.items[0].string;
        right = m.items[1].string;
      } else {
        throw data_error(where + ": expected \"left right\" or [\"left\", \"right\"]");
      }
      const std::int32_t l = id_of(left), rr = id_of(right), merged = id_of(left + right);
      if (l < 0) throw data_error(where + ": " + printable(left) + " is not in the vocab");
      if (rr < 0) throw data_error(where + ": " + printable(right) + " is not in the vocab");
      if (merged < 0) throw data_error(where + ": the merged token " + printable(left + right) + " is not in the vocab");
      // A repeated pair takes its last rank, as the reference's map does.
      merges_.assign(bpe::pair_key(l, rr), bpe::Merge{static_cast<std::int32_t>(r), merged});
      rank_merged_.push_back(merged);
    }
  }

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::vector<std::string> tokens_;  // id -> token string
  std::vector<bool> has_id_;
  std::array<std::int32_t, 256> byte_ids_{};      // byte -> id of its byte-alphabet character, -1: none
  std::array<std::int32_t, 256> fallback_ids_{};  // byte -> id of "<0xXX>", -1: none
  bpe::MergeTable merges_;
  std::vector<std::int32_t> rank_merged_;  // rank -> the id its merge makes
  std::int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
};

}  // namespace headroom::io::detail::hf
