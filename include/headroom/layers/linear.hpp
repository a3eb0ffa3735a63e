#pragma once
// Linear<In, Out, Bias>: y = x W^T (+ b), W [Out, In].
// Linear<> (no dims) is a recipe: the model fills in the dims.
// Inside a tensor-parallel split (layers/tensor_parallel.hpp) it builds this
// rank's block: Out / N rows (column-parallel) or In / N columns
// (row-parallel: the partial y is summed over the ranks, then the bias added).
#include "../ops/linear.hpp"
#include "../ops/tensor_parallel.hpp"
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
    const TensorSplit s = b.split();
    const std::int64_t out = s.split() && s.axis == SplitAxis::rows ? Out / s.ranks : Out;
    const std::int64_t in = s.split() && s.axis == SplitAxis::cols ? In / s.ranks : In;
    const int w = b.matrix("weight", out, in);  // W: (out, in); with Bias, b: (out)
    if (s.split() && s.axis == SplitAxis::cols) {
      const Ref partial = headroom::ops::Linear::emit(b, x, w, false, in, out);  // y: (N, Out), this rank's part
      if (b.defer_tp_output) {  // a LoRA adds to the partial first, then sums it (policies/lora.hpp)
        b.deferred_bias = Bias ? headroom::ops::TensorParallelOutput::declare_bias(b, out) : graph::none;
        return partial;
      }
      return headroom::ops::TensorParallelOutput::emit(b, partial, Bias, out);
    }
    return headroom::ops::Linear::emit(b, x, w, Bias, in, out);  // y: (N, out)
  }
};

}  // namespace headroom
