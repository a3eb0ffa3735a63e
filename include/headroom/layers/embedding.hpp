#pragma once
// Embedding<Vocab, Dim>: x[i] = E[token[i]], E [Vocab, Dim].
// LearnedPositions<MaxPos, Dim>: x[i] += P[i mod T] in place (GPT-2's wpe).
#include "layer.hpp"

namespace headroom {

template <std::int64_t Vocab, std::int64_t Dim>
struct Embedding {
  HEADROOM_REQUIRE(Vocab > 0 && Dim > 0, "Embedding<Vocab, Dim>: dims must be positive (they are {} and {})", Vocab, Dim);
  static constexpr std::string_view kind = "Embedding";
  static constexpr std::int64_t in_features = 0, out_features = Dim;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref tokens) {  // tokens: (N) i32
    const int w = b.param("weight", Vocab, Dim);                // E: (Vocab, Dim)
    b.tied_weight = w;
    const graph::Param pw = b.params[w];
    Op op{};
    op.kind = graph::OpKind::embedding;
    op.param[0] = w;
    op.dim[0] = Vocab;
    op.dim[1] = Dim;
    op.in[0] = tokens;
    op.n_in = 1;
    const Ref x = b.activation("x", Dim);  // x: (N, Dim)
    op.out[0] = x;
    op.n_out = 1;
    op.flops_fwd = 0;
    if (pw.trainable) {
      op.saved[op.n_saved++] = tokens;
      op.grads[op.n_grads++] = pw.grad;
      op.flops_bwd = b.tokens_count() * Dim;  // scatter-add of dX rows
    }
    b.emit(op);
    return x;
  }
};

template <std::int64_t MaxPos, std::int64_t Dim>
struct LearnedPositions {
  HEADROOM_REQUIRE(MaxPos > 0 && Dim > 0, "LearnedPositions<MaxPos, Dim>: dims must be positive (they are {} and {})", MaxPos,
                   Dim);
  static constexpr std::string_view kind = "LearnedPositions";
  static constexpr std::int64_t in_features = Dim, out_features = Dim;
  static constexpr std::int64_t max_positions = MaxPos;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, Dim), updated in place
    const int w = b.param("weight", MaxPos, Dim);  // P: (MaxPos, Dim)
    const graph::Param pw = b.params[w];
    Op op{};
    op.kind = graph::OpKind::positions;
    op.param[0] = w;
    op.dim[0] = MaxPos;
    op.dim[1] = Dim;
    op.inout = x;
    op.flops_fwd = b.tokens_count() * Dim;
    if (pw.trainable) {
      op.grads[op.n_grads++] = pw.grad;
      op.flops_bwd = b.tokens_count() * Dim;
    }
    b.emit(op);
    return x;
  }
};

}  // namespace headroom
