#pragma once
// LoRA<Rank, L, Alpha>: y = L(x) + (Alpha / Rank) * B (A x)  (Hu et al. 2021).
// The base L is frozen; A (Rank, In) and B (Out, Rank) are trainable, B starts
// at zero so the wrapped layer starts as the base. Alpha is an integer ratio
// (default Alpha = Rank, scale 1). Forward adds the low-rank product into the
// base output in place and saves x and A x (N, Rank) for backward.
#include "../ops/lora.hpp"
#include "projection.hpp"

namespace headroom {

template <int Rank, class L = Linear<>, class Alpha = Ratio<Rank>>
struct LoRA {
  static constexpr bool is_recipe = headroom::is_recipe<L>();
  static_assert(is_projection_v<L>, "LoRA<Rank, L>: L must be a linear projection (Linear, or Quantized / Frozen over one)");
  HEADROOM_REQUIRE(Rank >= 1, "LoRA<Rank, L>: rank must be at least 1 (it is {})", Rank);
  HEADROOM_REQUIRE(is_recipe || (Rank <= L::in_features && Rank <= L::out_features),
                   "LoRA<Rank, L>: rank ({}) must not exceed in_features ({}) or out_features ({}) of the projection", Rank,
                   L::in_features, L::out_features);
  HEADROOM_REQUIRE(adapter_count<L>::value == 0,
                   "LoRA<Rank, L>: a projection takes at most one LoRA adapter, and L already has {}", adapter_count<L>::value);
  HEADROOM_REQUIRE(Rank < 1 || Alpha::num > 0, "LoRA<Rank, L, Alpha>: alpha must be positive (it is {} / {})", Alpha::num,
                   Alpha::den);
  static constexpr std::string_view kind = "LoRA";
  static constexpr std::int64_t in_features = L::in_features, out_features = L::out_features;
  static constexpr int rank = Rank;
  using alpha = Alpha;
  using inner = L;
  using children = type_list<L>;
  using ops = type_list<headroom::ops::LoRA>;
  template <class New>
  using rebind = LoRA<Rank, New, Alpha>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, In)
    b.push_frozen();
    const Ref y = L::build(b, x);  // y: (N, Out), the base output
    b.pop_frozen();
    const int a_id = b.adapter("lora_A", Rank, in_features);   // A: (Rank, In)
    const int b_id = b.adapter("lora_B", out_features, Rank);  // B: (Out, Rank)
    // y += (alpha / Rank) B (A x), in place
    headroom::ops::LoRA::emit(b, x, y, a_id, b_id, in_features, out_features, Rank, Alpha::num, Alpha::den * Rank);
    return y;
  }
};
template <int R, class L, class A>
struct is_projection<LoRA<R, L, A>> : std::true_type {};
template <int R, class L, class A>
struct adapter_count<LoRA<R, L, A>> : std::integral_constant<int, 1 + adapter_count<L>::value> {};
template <int R, class L, class A>
struct quant_format_of<LoRA<R, L, A>> : quant_format_of<L> {};

}  // namespace headroom
