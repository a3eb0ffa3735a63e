#pragma once
// Tensor parallelism in the layers (Megatron-LM, Shoeybi et al. 2019).
//
// With TensorParallel<N> in the run, each of N ranks holds a block of every
// split parameter (graph/tensor_split.hpp) and computes its part:
//
//   Attention      q, k, v column-parallel (Heads / N query heads and
//                  KVHeads / N KV heads per rank), the attention core on
//                  those heads, o_proj row-parallel
//   MLP, SwiGLU    fc (gate, up) column-parallel (F / N features per rank),
//                  the activation on them, proj (down) row-parallel
//   Embedding      rows split (vocabulary-parallel): a rank looks up the
//                  tokens of its rows, zeros for the others, then the sum
//   LMHeadLoss     rows split: a rank's logits are its vocabulary's; the
//                  fused, chunked loss exchanges each row's max, sum of
//                  exponentials and target logit between the ranks
//                  (per-head q_norm / k_norm: each rank normalizes its
//                  heads with the whole gain, whose gradient it sums with
//                  the others' before the update)
//   LoRA           beside a column-parallel projection A whole and B's
//                  rows split, beside a row-parallel one A's columns split
//                  and B whole (its gradients summed over the ranks before
//                  the update: policies/lora.hpp)
//
// A replicated activation entering column-parallel projections passes a
// tp_input op (its gradient is summed over the ranks in backward); the
// partial output of a row-parallel projection or of the embedding passes a
// tp_output op (summed in forward) (ops/tensor_parallel.hpp). Everything
// else (norms, residual adds, positions, the projections of custom layers)
// runs whole on every rank, on the same values.
//
// The layers call the helpers below; with one rank they build exactly what
// they build without tensor parallelism.
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "../ops/tensor_parallel.hpp"
#include "layer.hpp"

namespace headroom::tensor_parallel {

// x enters projections split over the ranks: Megatron's f.
constexpr Ref input(graph::Builder& b, Ref x, std::int64_t features) {
  return b.cfg.tp > 1 ? ops::TensorParallelInput::emit(b, x, features) : x;
}
// L (a projection) built with its output features split over the ranks;
// `parts`: a fused projection's stacked parts (q | k | v), each split.
template <class L>
constexpr Ref column_parallel(graph::Builder& b, std::string_view name, Ref x, int parts = 1) {
  b.push_split(SplitAxis::rows, parts);
  const Ref y = b.child<L>(name, x);
  b.pop_split();
  return y;
}
// L (a projection) built with its input features split over the ranks; its
// output is summed over them (Linear emits the tp_output).
template <class L>
constexpr Ref row_parallel(graph::Builder& b, std::string_view name, Ref x) {
  b.push_split(SplitAxis::cols);
  const Ref y = b.child<L>(name, x);
  b.pop_split();
  return y;
}
// n divided over the ranks (heads, features, vocabulary rows).
constexpr std::int64_t local(const graph::Builder& b, std::int64_t n) { return n / b.cfg.tp; }

// ---- what a layout cannot split, found at compile time (run.hpp) ---------------------------------------
// The first layer of a model whose dims do not divide by the ranks, or that
// tensor parallelism does not support yet.
struct Issue {
  enum Kind : int { none, heads, features, vocabulary, quantized } kind = none;
  std::int64_t a = 0, b = 0;
};

template <class L>
constexpr Issue issue(int ranks);

template <class... Ls>
constexpr Issue first_issue(type_list<Ls...>, [[maybe_unused]] int ranks) {
  Issue found{};
  ((found.kind == Issue::none ? (found = issue<Ls>(ranks), 0) : 0), ...);
  return found;
}

template <class L>
constexpr Issue issue(int ranks) {
  if (ranks <= 1) return {};
  if constexpr (L::kind == std::string_view("Attention")) {
    if (L::heads % ranks != 0 || L::kv_heads % ranks != 0) return {Issue::heads, L::heads, L::kv_heads};
  } else if constexpr (L::kind == std::string_view("MLP") || L::kind == std::string_view("SwiGLU")) {
    if (L::hidden % ranks != 0) return {Issue::features, L::hidden, 0};
  } else if constexpr (L::kind == std::string_view("Embedding") || L::kind == std::string_view("LMHeadLoss")) {
    if (L::vocab % ranks != 0) return {Issue::vocabulary, L::vocab, 0};
  } else if constexpr (L::kind == std::string_view("Quantized")) {
    return {Issue::quantized, 0, 0};
  }
  return first_issue(typename L::children{}, ranks);
}

// Whether a layer of L's tree (L or a descendant) is one Is<X>::value says.
template <template <class> class Is, class L>
constexpr bool in_tree() {
  if constexpr (Is<L>::value) return true;
  else return []<class... Cs>(type_list<Cs...>) { return (in_tree<Is, Cs>() || ...); }(typename L::children{});
}

// Whether L holds a LoRA adapter (its gradients summed over the ranks
// after the backward: no UpdateInBackward with them, run.hpp).
template <class L>
struct is_adapter : std::bool_constant<L::kind == std::string_view("LoRA")> {};
template <class L>
constexpr bool has_adapter() {
  return in_tree<is_adapter, L>();
}

// Whether L normalizes each query and key head (Attention's QKNorm): the
// gains' gradients are partial on each rank too, summed after the backward.
template <class L>
struct is_head_normed : std::false_type {};
template <class L>
  requires requires { L::qk_norm; }
struct is_head_normed<L> : std::bool_constant<L::qk_norm> {};
template <class L>
constexpr bool has_head_norm() {
  return in_tree<is_head_normed, L>();
}

}  // namespace headroom::tensor_parallel
