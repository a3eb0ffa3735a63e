#pragma once
// The feed-forward halves of a block.
// MLP<D, F, Fc, Proj>: proj(gelu_tanh(fc(x))) (GPT-2; Hendrycks & Gimpel 2016).
// SwiGLU<D, F, Gate, Up, Down>: down(silu(gate(x)) * up(x)) (Shazeer 2020; Llama).
//
// RecomputeAct (a model's Apply<Checkpointed<>, On<mlp_act>>): the
// activation and the down projection are one checkpointed segment, so the
// activation's inputs stay saved and its output, (N, F), is recomputed
// before the down projection's backward instead of kept (Korthikanti et al.
// 2022's selective recomputation, for the MLP: 5 N F or 8 N F FLOPs to save
// N F elements per block). Inside a checkpointed block it changes nothing:
// the block's recompute makes the activation anyway.
#include "../ops/elementwise.hpp"
#include "layer.hpp"
#include "tensor_parallel.hpp"

namespace headroom {

// [first, ...) of the ops of a feed-forward half: a checkpointed segment from
// the activation on when RecomputeAct (and not already inside one); none otherwise.
template <bool RecomputeAct>
constexpr int begin_activation_segment(graph::Builder& b, Ref input) {
  if constexpr (RecomputeAct)
    if (!b.in_checkpoint()) return b.begin_segment(input, true, false);
  return graph::none;
}
constexpr void end_activation_segment(graph::Builder& b, int segment) {
  if (segment != graph::none) b.end_segment(segment);
}

template <std::int64_t D, std::int64_t F, class Fc, class Proj, bool RecomputeAct = false>
struct MLP {
  HEADROOM_REQUIRE(Fc::in_features == D && Fc::out_features == F,
                   "MLP<D, F, ...>: c_fc must map D to F ({} to {}); it maps {} to {}", D, F, Fc::in_features,
                   Fc::out_features);
  HEADROOM_REQUIRE(Proj::in_features == F && Proj::out_features == D,
                   "MLP<D, F, ...>: c_proj must map F to D ({} to {}); it maps {} to {}", F, D, Proj::in_features,
                   Proj::out_features);
  static constexpr std::string_view kind = "MLP";
  static constexpr std::int64_t in_features = D, out_features = D;
  static constexpr std::int64_t hidden = F;
  using children = type_list<Fc, Proj>;
  using ops = type_list<headroom::ops::Gelu>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    x = tensor_parallel::input(b, x, D);
    const Ref pre = tensor_parallel::column_parallel<Fc>(b, "c_fc", x);  // pre: (N, F / ranks)
    const int segment = begin_activation_segment<RecomputeAct>(b, pre);
    b.open("act", "GELU");
    const Ref g = headroom::ops::Gelu::emit(b, pre, tensor_parallel::local(b, F));  // g: (N, F / ranks)
    b.close();
    const Ref y = tensor_parallel::row_parallel<Proj>(b, "c_proj", g);
    end_activation_segment(b, segment);
    return y;
  }
};

template <std::int64_t D, std::int64_t F, class Gate, class Up, class Down, bool RecomputeAct = false>
struct SwiGLU {
  HEADROOM_REQUIRE(Gate::in_features == D && Gate::out_features == F,
                   "SwiGLU<D, F, ...>: gate_proj must map D to F ({} to {}); it maps {} to {}", D, F, Gate::in_features,
                   Gate::out_features);
  HEADROOM_REQUIRE(Up::in_features == D && Up::out_features == F,
                   "SwiGLU<D, F, ...>: up_proj must map D to F ({} to {}); it maps {} to {}", D, F, Up::in_features,
                   Up::out_features);
  HEADROOM_REQUIRE(Down::in_features == F && Down::out_features == D,
                   "SwiGLU<D, F, ...>: down_proj must map F to D ({} to {}); it maps {} to {}", F, D, Down::in_features,
                   Down::out_features);
  static constexpr std::string_view kind = "SwiGLU";
  static constexpr std::int64_t in_features = D, out_features = D;
  static constexpr std::int64_t hidden = F;
  using children = type_list<Gate, Up, Down>;
  using ops = type_list<headroom::ops::SwiGLU>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    x = tensor_parallel::input(b, x, D);
    const Ref gu[2] = {tensor_parallel::column_parallel<Gate>(b, "gate_proj", x),
                       tensor_parallel::column_parallel<Up>(b, "up_proj", x)};  // (N, F / ranks) each
    const int segment = begin_activation_segment<RecomputeAct>(b, gu[0]);
    b.open("act", "SiLU*");
    const Ref s = headroom::ops::SwiGLU::emit(b, gu[0], gu[1], tensor_parallel::local(b, F));  // s: (N, F / ranks)
    b.close();
    const Ref y = tensor_parallel::row_parallel<Down>(b, "down_proj", s);
    end_activation_segment(b, segment);
    return y;
  }
};

}  // namespace headroom
