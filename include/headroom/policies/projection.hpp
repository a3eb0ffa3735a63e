#pragma once
// Projections (Linear and policies over one) and recipes (dims still open).
#include "../layers/linear.hpp"

namespace headroom {

template <class L>
struct is_projection : std::false_type {};
template <std::int64_t I, std::int64_t O, bool B>
struct is_projection<Linear<I, O, B>> : std::true_type {};

template <class L>
inline constexpr bool is_projection_v = is_projection<L>::value;

// How many LoRA adapters, and which quantization format (void: none), a
// policy stack holds, read from the type alone (nothing is instantiated, so
// a model can check the stacks its Applys make before any of them is built).
// Each policy specializes them; a one-parameter wrapper (Frozen,
// Checkpointed, Offloaded) looks through.
template <class L>
struct adapter_count : std::integral_constant<int, 0> {};
template <template <class> class P, class L>
struct adapter_count<P<L>> : adapter_count<L> {};
template <class L>
struct quant_format_of {
  using type = void;
};
template <template <class> class P, class L>
struct quant_format_of<P<L>> : quant_format_of<L> {};

// A type still waiting for dims from a model (Linear<>, LoRA<8, Linear<>>, Checkpointed<>).
template <class L>
constexpr bool is_recipe() {
  if constexpr (std::is_same_v<L, Hole>) return true;
  else if constexpr (requires { L::is_recipe; }) return L::is_recipe;
  else return false;
}

}  // namespace headroom
