#pragma once
// An optimizer's state, declared once as data: its sections (so many bytes
// per so many elements of a parameter), the tables the model shares, and
// where a range of a parameter finds its part (StateAt). The plan sizes the
// state from it; the engines, io and an optimizer's kernels lay it out from
// it (optim/optimizer.hpp: optimizers as types).
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "bytes.hpp"
#include "config.hpp"

namespace headroom {

// One part of an optimizer's state: `bytes` bytes for every `per` elements
// of the parameter (the last group may be short).
struct StateSection {
  std::int64_t bytes = 0;
  std::int64_t per = 1;
  constexpr std::int64_t size(std::int64_t n) const { return ceil_div(n, per) * bytes; }
};

inline constexpr int max_state_sections = 4;

// An optimizer's state per parameter: its sections, one after another
// (section k of an n-element parameter starts at offset(k, n)), and the
// tables the model shares (AdamW8bit's two dynamic maps).
struct OptimDesc {
  std::string_view name{};
  int states = 0;               // state tensors per parameter (a report's count)
  std::string_view storage{};   // how they are stored (a report's words: "f32", "8-bit block-wise")
  int sections = 0;
  StateSection section[max_state_sections]{};
  std::int64_t tables = 0;      // bytes of tables shared by the model
  std::int64_t align = 1;       // a range updated on its own starts on a multiple of this many elements

  static constexpr OptimDesc of(std::string_view name, int states, std::string_view storage,
                                std::initializer_list<StateSection> parts, std::int64_t tables = 0, std::int64_t align = 1) {
    OptimDesc d{name, states, storage, 0, {}, tables, align};
    for (const StateSection& s : parts) d.section[d.sections++] = s;
    return d;
  }
  constexpr std::int64_t offset(int k, std::int64_t n) const {
    std::int64_t at = 0;
    for (int j = 0; j < k; ++j) at += section[j].size(n);
    return at;
  }
  constexpr std::int64_t state_bytes(std::int64_t n) const { return offset(sections, n); }
  constexpr std::int64_t table_bytes() const { return tables; }
};

// The byte offset of section K in the state of an n-element parameter of
// optimizer O, in host or device code (the sections are read as constants:
// no object is read at run time).
template <class O, int K>
HEADROOM_HOST_DEVICE constexpr std::int64_t state_offset(std::int64_t n) {
  if constexpr (K == 0) {
    return 0;
  } else {
    constexpr std::int64_t bytes = O::desc.section[K - 1].bytes, per = O::desc.section[K - 1].per;
    return state_offset<O, K - 1>(n) + (n + per - 1) / per * bytes;
  }
}

// Where the state of a range of a parameter lies: the parameter's state
// buffer `base` (count elements) seen from element `from` (a multiple of
// desc.align). Section k of the range starts at section<T>(k).
struct StateAt {
  std::byte* base = nullptr;
  std::int64_t count = 0;
  std::int64_t from = 0;
  const OptimDesc* desc = nullptr;

  template <class T>
  T* section(int k) const {
    const StateSection& s = desc->section[k];
    return reinterpret_cast<T*>(base + desc->offset(k, count) + from / s.per * s.bytes);
  }
  // the same state from `i` elements further on (a multiple of desc.align)
  StateAt at(std::int64_t i) const { return StateAt{base, count, from + i, desc}; }
};

template <class O>
concept Optimizer = requires {
  { O::desc } -> std::convertible_to<OptimDesc>;
  { O::name } -> std::convertible_to<std::string_view>;
};

}  // namespace headroom
