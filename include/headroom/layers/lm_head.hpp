#pragma once
// LMHeadLoss<Vocab, D, Tied>: logits = h W^T, loss = mean cross-entropy,
// fused and chunked: tokens are processed `loss_chunk` at a time, each chunk's
// logits (chunk, Vocab) f32 exist only in scratch and are turned into
// dlogits, dH and dW in the same pass, so the (N, Vocab) logits never exist
// whole and backward has nothing left to do (the loss event writes the
// gradients). Tied: W is the embedding table (with PipelineParallel<S>, the
// last stage's copy of it: the model declares it there, b.declare<Embedding>).
#include "../ops/lm_head_loss.hpp"
#include "layer.hpp"
#include "tensor_parallel.hpp"

namespace headroom {

template <std::int64_t Vocab, std::int64_t D, bool Tied>
struct LMHeadLoss {
  HEADROOM_REQUIRE(Vocab > 0 && D > 0, "LMHeadLoss<Vocab, D, Tied>: dims must be positive (they are {} and {})", Vocab, D);
  static constexpr std::string_view kind = "LMHeadLoss";
  static constexpr std::int64_t in_features = D, out_features = 0;
  static constexpr bool tied = Tied;
  static constexpr std::int64_t vocab = Vocab;
  using children = type_list<>;
  using ops = type_list<headroom::ops::LmHeadLoss>;

  static constexpr Ref build(graph::Builder& b, Ref h) {  // h: (N, D)
    h = tensor_parallel::input(b, h, D);
    int w = b.tied_weight;
    if constexpr (Tied) {
      if (w == graph::none) {  // a pipeline stage without the table: refused by plan<Run>() (Graph::tied_table_missing)
        b.tied_table_missing = true;
        return h;
      }
    } else {
      b.push_split(SplitAxis::rows);  // vocabulary-parallel with TensorParallel<N>
      w = b.matrix("weight", tensor_parallel::local(b, Vocab), D);  // W: (Vocab / ranks, D)
      b.pop_split();
    }
    return headroom::ops::LmHeadLoss::emit(b, h, w, tensor_parallel::local(b, Vocab), D);  // the loss
  }
};

}  // namespace headroom
