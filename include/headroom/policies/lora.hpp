#pragma once
// LoRA<Rank, L, Alpha, Dropout>: y = L(x) + (Alpha / Rank) * B (A dropout(x))
// (Hu et al. 2021). The base L is frozen; A (Rank, In) and B (Out, Rank) are
// trainable, B starts at zero so the wrapped layer starts as the base. Alpha
// is an integer ratio (default Alpha = Rank, scale 1). Forward adds the
// low-rank product into the base output in place and saves x and A x (N,
// Rank) for backward.
//
// Dropout, a Ratio (default 0: none), is PEFT's lora_dropout: during
// training each element of the adapter's input is dropped with that
// probability and the rest scaled by 1 / (1 - p); the base path sees x
// untouched, and evaluation and generation drop nothing. The mask is not
// stored: math/dropout.hpp regenerates it from the step's key in the
// backward (and in a checkpointed block's recompute), so dropout costs the
// dropped input as a GEMM operand, (N, In) in the forward's scratch and
// again in the backward's, and no memory that lives across the step.
//   LoRA<8, Linear<>, Ratio<32>, Ratio<1, 10>>   // r=8, lora_alpha=32, lora_dropout=0.1
#include "../ops/lora.hpp"
#include "projection.hpp"

namespace headroom {

template <int Rank, class L = Linear<>, class Alpha = Ratio<Rank>, class Dropout = Ratio<0>>
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
  HEADROOM_REQUIRE(Dropout::num >= 0 && Dropout::num < Dropout::den,
                   "LoRA<Rank, L, Alpha, Dropout>: the dropout probability must be at least 0 and below 1 (it is {} / {})",
                   Dropout::num, Dropout::den);
  static constexpr std::string_view kind = "LoRA";
  static constexpr std::int64_t in_features = L::in_features, out_features = L::out_features;
  static constexpr int rank = Rank;
  using alpha = Alpha;
  using dropout = Dropout;
  using inner = L;
  using children = type_list<L>;
  using ops = type_list<headroom::ops::LoRA>;
  template <class New>
  using rebind = LoRA<Rank, New, Alpha, Dropout>;

  // With TensorParallel<N> (layers/tensor_parallel.hpp), beside a
  // column-parallel base (W's rows split; x whole on every rank): A whole,
  // B's rows split as W's; each rank adds B_r (A x) to its rows of y, and
  // its gradient of A is a partial sum (through B_r), summed over the ranks
  // before the update (graph::Param::tensor_partial; x's gradient is summed
  // by the tp_input before the projections, as W's part of it is). Beside a
  // row-parallel base (W's columns split; x split): A's columns split as
  // W's, B whole; each rank adds B (A_r x_r) to its partial y before the
  // tp_output sums it (one sum for both), and its gradient of B is the
  // partial sum. No collective of its own in forward or backward.
  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, In), or this rank's columns (N, In / N)
    const TensorSplit s = b.split();
    const bool column = s.split() && s.axis == SplitAxis::rows, row = s.split() && s.axis == SplitAxis::cols;
    const std::int64_t in = row ? in_features / s.ranks : in_features, out = column ? out_features / s.ranks : out_features;
    b.push_frozen();
    b.defer_tp_output = row;
    const Ref y = L::build(b, x);  // y: (N, out), the base output (row-parallel: this rank's partial sum)
    const int bias = b.deferred_bias;
    b.defer_tp_output = false;
    b.deferred_bias = graph::none;
    b.pop_frozen();
    const int a_id = whole_if(b, column, [&] { return b.adapter("lora_A", Rank, in); });  // A: (Rank, in)
    const int b_id = whole_if(b, row, [&] { return b.adapter("lora_B", out, Rank); });    // B: (out, Rank)
    // y += (alpha / Rank) B (A x), in place
    headroom::ops::LoRA::emit(b, x, y, a_id, b_id, in, out, Rank, Alpha::num, Alpha::den * Rank, Dropout::num, Dropout::den, row);
    return row ? headroom::ops::TensorParallelOutput::emit_with(b, y, bias, out) : y;
  }

 private:
  // The parameter `make` declares; when `whole`, held whole by every
  // tensor-parallel rank, with a partial gradient on each.
  template <class Make>
  static constexpr int whole_if(graph::Builder& b, bool whole, Make make) {
    if (!whole) return make();
    b.push_split(SplitAxis::none);
    const int id = make();
    b.pop_split();
    b.params[id].tensor_partial = true;
    return id;
  }
};
template <int R, class L, class A, class D>
struct is_projection<LoRA<R, L, A, D>> : std::true_type {};
template <int R, class L, class A, class D>
struct adapter_count<LoRA<R, L, A, D>> : std::integral_constant<int, 1 + adapter_count<L>::value> {};
template <int R, class L, class A, class D>
struct quant_format_of<LoRA<R, L, A, D>> : quant_format_of<L> {};

}  // namespace headroom
