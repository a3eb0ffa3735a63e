#pragma once
// Lowering: what a kernel sees of a layer type — integers and enums only.
//
// The planner's types (recipes and policies: template-heavy)
// stay on the host side; a CUDA kernel template takes a lowered descriptor
// as its compile-time argument:
//
//   constexpr ProjectionDesc d = lower_projection<Quantized<NF4, LoRA<16, Linear<4096, 4096>>>>();
//   my_kernel<d.in, d.out, d.lora_rank><<<...>>>(...);
#include <cstdint>

#include "../core/quant_format.hpp"
#include "../policies/apply.hpp"

namespace headroom {

struct ProjectionDesc {
  std::int64_t in = 0, out = 0;
  bool bias = false;
  QuantDesc quant{};           // kind none: dense weights
  int lora_rank = 0;           // 0: no adapter
  std::int64_t alpha_num = 0;  // LoRA scale = alpha_num / (alpha_den * rank)
  std::int64_t alpha_den = 1;
  bool frozen = false;         // base weights take no gradient
  bool checkpointed = false;
  bool offloaded = false;
};

namespace detail {
template <class L>
constexpr void lower_into(ProjectionDesc& d) {
  if constexpr (requires { L::rank; typename L::alpha; }) {
    d.lora_rank = L::rank;
    d.alpha_num = L::alpha::num;
    d.alpha_den = L::alpha::den;
    d.frozen = true;
    lower_into<typename L::inner>(d);
  } else if constexpr (requires { typename L::format; typename L::inner; }) {
    d.frozen = true;
    lower_into<typename L::inner>(d);
    d.quant = L::format::desc.for_row_length(d.in);
  } else if constexpr (is_offloaded<L>::value) {
    d.offloaded = true;
    lower_into<typename L::inner>(d);
  } else if constexpr (is_checkpointed<L>::value) {
    d.checkpointed = true;
    lower_into<typename L::inner>(d);
  } else if constexpr (requires { typename L::inner; }) {  // Frozen
    d.frozen = true;
    lower_into<typename L::inner>(d);
  } else {
    d.in = L::in_features;
    d.out = L::out_features;
    d.bias = L::bias;
  }
}
}  // namespace detail

template <class L>
constexpr ProjectionDesc lower_projection() {
  static_assert(is_projection_v<L>, "lower_projection<L>: L must be a linear projection (Linear or a policy over one)");
  static_assert(!is_recipe<L>(), "lower_projection<L>: L is a recipe without dims; fill it in (a model does) before lowering");
  ProjectionDesc d{};
  detail::lower_into<L>(d);
  return d;
}

}  // namespace headroom
