#pragma once
// Linear<In, Out, Bias>: y = x W^T (+ b), W [Out, In].
// Linear<> (no dims) is a recipe: the model fills in the dims.
#include "../ops/linear.hpp"
#include "layer.hpp"

namespace headroom {

template <std::int64_t In = 0, std::int64_t Out = 0, bool Bias = false>
struct Linear {
  HEADROOM_REQUIRE(In >= 0 && Out >= 0, "Linear<In, Out>: dims must be positive (they are {} and {})", In, Out);
  static constexpr std::string_view kind = "Linear";
  static constexpr std::int64_t in_features = In, out_features = Out;
  static constexpr bool bias = Bias;
  static constexpr bool is_recipe = (In == 0 || Out == 0);
  using children = type_list<>;
  using ops = type_list<headroom::ops::Linear>;
  template <std::int64_t I, std::int64_t O, bool B>
  using with_dims = Linear<I, O, B>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    static_assert(!is_recipe, "Linear<>: a recipe without dims is only valid inside a model's Apply<...>; write Linear<In, Out>");
    const int w = b.matrix("weight", Out, In);      // W: (Out, In); with Bias, b: (Out)
    return headroom::ops::Linear::emit(b, x, w, Bias, In, Out);  // y: (N, Out)
  }
};

}  // namespace headroom
