#pragma once
// Checkpointed<L>: forward keeps only L's input; backward first recomputes
// L's forward (tensors of role recompute, alive until L's backward ends),
// then runs L's backward on them (Chen et al. 2016).
#include "projection.hpp"

namespace headroom {

template <class L = Hole>
struct Checkpointed {
  static constexpr bool is_recipe = headroom::is_recipe<L>();
  static constexpr std::string_view kind = "Checkpointed";
  static constexpr std::int64_t in_features = L::in_features, out_features = L::out_features;
  using inner = L;
  using children = type_list<L>;
  template <class New>
  using rebind = Checkpointed<New>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    const int s = b.begin_segment(x, true, false);
    const Ref y = L::build(b, x);
    b.end_segment(s);
    return y;
  }
};
template <class L>
struct is_projection<Checkpointed<L>> : is_projection<L> {};
template <class L>
struct is_checkpointed : std::false_type {};
template <class L>
struct is_checkpointed<Checkpointed<L>> : std::true_type {};

}  // namespace headroom
