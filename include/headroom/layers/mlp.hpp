#pragma once
// The feed-forward halves of a block.
// MLP<D, F, Fc, Proj>: proj(gelu_tanh(fc(x))) (GPT-2; Hendrycks & Gimpel 2016).
// SwiGLU<D, F, Gate, Up, Down>: down(silu(gate(x)) * up(x)) (Shazeer 2020; Llama).
#include "layer.hpp"

namespace headroom {

namespace detail {
// An elementwise op over (N, F) inputs producing (N, F); saves its inputs.
constexpr Ref elementwise(graph::Builder& b, graph::OpKind kind, std::string_view out_name, const Ref* in, int n_in,
                          std::int64_t features, std::int64_t flops_per_elem) {
  Op op{};
  op.kind = kind;
  op.dim[0] = features;
  for (int i = 0; i < n_in; ++i) {
    op.in[i] = in[i];
    op.in_grad[i] = true;
    op.saved[op.n_saved++] = in[i];
  }
  op.n_in = n_in;
  const Ref y = b.activation(out_name, features);
  op.out[0] = y;
  op.n_out = 1;
  op.flops_fwd = flops_per_elem * b.tokens_count() * features;
  op.flops_bwd = 2 * op.flops_fwd;
  b.emit(op);
  return y;
}
}  // namespace detail

template <std::int64_t D, std::int64_t F, class Fc, class Proj>
struct MLP {
  HEADROOM_REQUIRE(Fc::in_features == D && Fc::out_features == F,
                   "MLP<D, F, ...>: c_fc must map D to F ({} to {}); it maps {} to {}", D, F, Fc::in_features,
                   Fc::out_features);
  HEADROOM_REQUIRE(Proj::in_features == F && Proj::out_features == D,
                   "MLP<D, F, ...>: c_proj must map F to D ({} to {}); it maps {} to {}", F, D, Proj::in_features,
                   Proj::out_features);
  static constexpr std::string_view kind = "MLP";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<Fc, Proj>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    const Ref pre = b.child<Fc>("c_fc", x);                // pre: (N, F)
    b.open("act", "GELU");
    const Ref g = detail::elementwise(b, graph::OpKind::gelu, "gelu", &pre, 1, F, 8);  // g: (N, F)
    b.close();
    return b.child<Proj>("c_proj", g);
  }
};

template <std::int64_t D, std::int64_t F, class Gate, class Up, class Down>
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
  using children = type_list<Gate, Up, Down>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    const Ref gu[2] = {b.child<Gate>("gate_proj", x), b.child<Up>("up_proj", x)};  // (N, F) each
    b.open("act", "SiLU*");
    const Ref s = detail::elementwise(b, graph::OpKind::swiglu, "silu_mul", gu, 2, F, 5);  // s: (N, F)
    b.close();
    return b.child<Down>("down_proj", s);
  }
};

}  // namespace headroom
