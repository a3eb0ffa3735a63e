#pragma once
// BitTree: a set of integers in [0, n) that finds the nearest member below
// or above a value, for the constexpr planner (plan/pack.hpp's check).
//
// A 64-ary tree of bit words: level 0 holds one bit per value, each level
// above one bit per word of the level below (set when that word is not
// empty), up to a single word. insert, erase, prev and next touch at most
// two words per level, i.e. O(log64 n) word operations: a few dozen
// evaluated statements for thousands of values, where a sorted array would
// shift half its members on every insert and erase (constant evaluation
// pays for every statement it evaluates).
#include <bit>
#include <cstdint>

#include "cvec.hpp"

namespace headroom::detail {

class BitTree {
 public:
  // The empty set over [0, n), n >= 0.
  constexpr explicit BitTree(int n) {
    int bits = n > 0 ? n : 1;
    int words = 0;
    for (;;) {
      bits_[levels_] = bits;
      at_[levels_] = words;
      ++levels_;
      const int w = (bits + 63) / 64;
      words += w;
      if (w == 1) break;
      bits = w;
    }
    words_.assign(static_cast<std::size_t>(words), 0);
  }

  constexpr bool contains(int v) const { return (words_[at_[0] + (v >> 6)] >> (v & 63)) & 1u; }

  constexpr void insert(int v) {
    for (int l = 0; l < levels_; ++l) {
      std::uint64_t& w = words_[at_[l] + (v >> 6)];
      const bool was_empty = w == 0;
      w |= std::uint64_t{1} << (v & 63);
      if (!was_empty) return;  // the levels above already list this word
      v >>= 6;
    }
  }

  constexpr void erase(int v) {
    for (int l = 0; l < levels_; ++l) {
      std::uint64_t& w = words_[at_[l] + (v >> 6)];
      w &= ~(std::uint64_t{1} << (v & 63));
      if (w != 0) return;  // the word still has members: the levels above stay
      v >>= 6;
    }
  }

  // The smallest member >= v, or -1.
  constexpr int next(int v) const {
    if (v < 0) v = 0;
    if (v >= bits_[0]) return -1;
    int l = 0;
    for (;;) {  // up until a word holds a member at or after v
      const int w = v >> 6;
      const std::uint64_t m = words_[at_[l] + w] & (~std::uint64_t{0} << (v & 63));
      if (m != 0) {
        v = (w << 6) + std::countr_zero(m);
        break;
      }
      if (++l == levels_) return -1;
      v = w + 1;  // the words after w, one level up
      if (v >= bits_[l]) return -1;
    }
    for (; l > 0; --l) v = (v << 6) + std::countr_zero(words_[at_[l - 1] + v]);  // down: the lowest member
    return v;
  }

  // The largest member <= v, or -1.
  constexpr int prev(int v) const {
    if (v < 0) return -1;
    if (v >= bits_[0]) v = bits_[0] - 1;
    int l = 0;
    for (;;) {  // up until a word holds a member at or before v
      const int w = v >> 6;
      const std::uint64_t m = words_[at_[l] + w] & (~std::uint64_t{0} >> (63 - (v & 63)));
      if (m != 0) {
        v = (w << 6) + 63 - std::countl_zero(m);
        break;
      }
      if (++l == levels_) return -1;
      v = w - 1;  // the words before w, one level up
      if (v < 0) return -1;
    }
    for (; l > 0; --l) v = (v << 6) + 63 - std::countl_zero(words_[at_[l - 1] + v]);  // down: the highest member
    return v;
  }

 private:
  static constexpr int max_levels = 6;  // 64^6 > 2^31: any int n
  cvec<std::uint64_t> words_;           // every level's words, level 0 first
  int bits_[max_levels]{};              // values (level 0) or words of the level below
  int at_[max_levels]{};                // index of the level's first word in words_
  int levels_ = 0;
};

}  // namespace headroom::detail
