#pragma once
// A BPE merge table: (left id, right id) -> the merge's rank and the id of the
// merged token. Open addressing with linear probing in a power-of-two array at
// most half full: one probe, usually, into 16-byte slots (BPE looks a pair up
// for every merge it considers). Shared by the GPT-2 and tokenizer.json BPEs.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace headroom::io::detail::bpe {

struct Merge {
  std::int32_t rank;    // lower merges first
  std::int32_t merged;  // id of left+right
};
inline std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

class MergeTable {
 public:
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The merge of `key`, or null.
  const Merge* find(std::uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == empty_key) return nullptr;
    }
  }
  // Sets `key` -> `m`, over what `key` had.
  void assign(std::uint64_t key, Merge m) {
    if (const Merge* old = find(key)) {
      *const_cast<Merge*>(old) = m;
      return;
    }
    insert(key, m);
  }
  // Adds `key` -> `m`; when `key` is there already, returns its merge and
  // changes nothing, else null.
  const Merge* insert(std::uint64_t key, Merge m) {
    if (const Merge* old = find(key)) return old;
    if (2 * (size_ + 1) > slots_.size()) grow();
    std::size_t i = slot_of(key);
    while (slots_[i].key != empty_key) i = (i + 1) & mask_;
    slots_[i] = {key, m};
    ++size_;
    return nullptr;
  }

 private:
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};  // ids are >= 0: no pair has this key
  struct Slot {
    std::uint64_t key = empty_key;
    Merge merge{};
  };
  std::size_t slot_of(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);  // Fibonacci hashing
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    const std::size_t capacity = old.empty() ? 64 : 2 * old.size();
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<int>(std::countr_zero(capacity));
    for (const Slot& s : old)
      if (s.key != empty_key) {
        std::size_t i = slot_of(s.key);
        while (slots_[i].key != empty_key) i = (i + 1) & mask_;
        slots_[i] = s;
      }
  }
  std::vector<Slot> slots_;
  std::size_t size_ = 0, mask_ = 0;
  int shift_ = 64;
};

}  // namespace headroom::io::detail::bpe
