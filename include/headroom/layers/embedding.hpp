#pragma once
// Embedding<Vocab, Dim>: x[i] = E[token[i]], E [Vocab, Dim].
// LearnedPositions<MaxPos, Dim>: x[i] += P[i mod T] in place (GPT-2's wpe).
#include "../ops/embedding.hpp"
#include "layer.hpp"
#include "tensor_parallel.hpp"

namespace headroom {

template <std::int64_t Vocab, std::int64_t Dim>
struct Embedding {
  HEADROOM_REQUIRE(Vocab > 0 && Dim > 0, "Embedding<Vocab, Dim>: dims must be positive (they are {} and {})", Vocab, Dim);
  static constexpr std::string_view kind = "Embedding";
  static constexpr std::int64_t in_features = 0, out_features = Dim;
  static constexpr std::int64_t vocab = Vocab;
  using children = type_list<>;
  using ops = type_list<headroom::ops::Embedding>;

  // The table E: (Vocab / ranks, Dim), the one an LM head may be tied to.
  static constexpr int declare(graph::Builder& b) {
    b.push_split(SplitAxis::rows);  // vocabulary-parallel with TensorParallel<N>
    const int w = b.param("weight", tensor_parallel::local(b, Vocab), Dim);
    b.pop_split();
    b.tied_weight = w;
    return w;
  }

  static constexpr Ref build(graph::Builder& b, Ref tokens) {  // tokens: (N) i32
    const int w = declare(b);
    const Ref x = headroom::ops::Embedding::emit(b, tokens, w, tensor_parallel::local(b, Vocab), Dim);  // x: (N, Dim)
    // this rank's rows; zeros for the tokens of the others' (summed over the ranks)
    return b.cfg.tp > 1 ? headroom::ops::TensorParallelOutput::emit(b, x, false, Dim) : x;
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
  using ops = type_list<headroom::ops::Positions>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, Dim), updated in place
    const int w = b.param("weight", MaxPos, Dim);  // P: (MaxPos, Dim)
    return headroom::ops::Positions::emit(b, x, w, MaxPos, Dim);
  }
};

}  // namespace headroom
