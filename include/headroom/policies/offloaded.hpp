#pragma once
// Offloaded<L>: the activations L's backward reads are copied to the offload
// tier after L's forward (the device copy is freed) and copied back ahead of
// L's backward. For a repeated block the copy back is issued when the next
// block's backward starts, so it overlaps that block's compute.
#include "../layers/repeat.hpp"
#include "projection.hpp"

namespace headroom {

template <class L = Hole>
struct Offloaded {
  static constexpr bool is_recipe = headroom::is_recipe<L>();
  static constexpr std::string_view kind = "Offloaded";
  static constexpr std::int64_t in_features = L::in_features, out_features = L::out_features;
  using inner = L;
  using children = type_list<L>;
  template <class New>
  using rebind = Offloaded<New>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    const int s = b.begin_segment(x, false, true);
    const Ref y = L::build(b, x);
    b.end_segment(s);
    return y;
  }
};
template <class L>
struct is_offloaded<Offloaded<L>> : std::true_type {};
template <class L>
struct is_projection<Offloaded<L>> : is_projection<L> {};

}  // namespace headroom
