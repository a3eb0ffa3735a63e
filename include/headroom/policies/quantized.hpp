#pragma once
// Quantized<Q, L>: L's weight matrix stored frozen in format Q (NF4, Int4,
// Int8, LLMInt8<>; see core/quant_format.hpp). Forward and the input gradient
// dequantize one (tile, In) panel at a time into per-worker scratch; the
// whole dequantized matrix never exists.
#include "projection.hpp"

namespace headroom {

namespace detail {
// A format's name for a message (&Q::name), or null for void.
template <class Q>
constexpr const std::string_view* quant_name() {
  if constexpr (requires { Q::name; }) return &Q::name;
  else return nullptr;
}
}  // namespace detail

template <class Q, class L = Linear<>>
struct Quantized {
  static_assert(QuantFormat<Q>, "Quantized<Q, L>: Q must be a quantization format (NF4, NF4DQ, Int8, Int4, LLMInt8<>)");
  static constexpr bool is_recipe = headroom::is_recipe<L>();
  static_assert(is_projection_v<L>, "Quantized<Q, L>: L must be a linear projection (Linear, or LoRA / Frozen over one)");
  // (block 0: one block per row, LLMInt8)
  HEADROOM_REQUIRE(is_recipe || L::in_features % (Q::desc.block == 0 ? 1 : Q::desc.block) == 0,
                   "Quantized<Q, L>: the quantization block size of Q ({}) must divide the row length (in_features) of L ({})",
                   Q::desc.block, L::in_features);
  HEADROOM_REQUIRE(std::is_void_v<typename quant_format_of<L>::type>,
                   "Quantized<Q, L>: L is already quantized ({} inside {}); a weight is stored in one format",
                   detail::quant_name<typename quant_format_of<L>::type>(), detail::quant_name<Q>());
  static constexpr std::string_view kind = "Quantized";
  static constexpr std::int64_t in_features = L::in_features, out_features = L::out_features;
  using format = Q;
  using inner = L;
  using children = type_list<L>;
  template <class New>
  using rebind = Quantized<Q, New>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    b.push_quant(Q::desc.for_row_length(L::in_features));
    const Ref y = L::build(b, x);
    b.pop_quant();
    return y;
  }
};
template <class Q, class L>
struct is_projection<Quantized<Q, L>> : std::true_type {};
template <class Q, class L>
struct adapter_count<Quantized<Q, L>> : adapter_count<L> {};
template <class Q, class L>
struct quant_format_of<Quantized<Q, L>> {
  using type = Q;
};

}  // namespace headroom
