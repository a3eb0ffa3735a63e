#pragma once
// Frozen<L>: L's parameters take no gradients and no optimizer state.
// Backward still propagates the input gradient through L.
#include "projection.hpp"

namespace headroom {

template <class L = Hole>
struct Frozen {
  static constexpr bool is_recipe = headroom::is_recipe<L>();
  static constexpr std::string_view kind = "Frozen";
  static constexpr std::int64_t in_features = L::in_features, out_features = L::out_features;
  using inner = L;
  using children = type_list<L>;
  template <class New>
  using rebind = Frozen<New>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    b.push_frozen();
    const Ref y = L::build(b, x);
    b.pop_frozen();
    return y;
  }
};
template <class L>
struct is_projection<Frozen<L>> : is_projection<L> {};

}  // namespace headroom
