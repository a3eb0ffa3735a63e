#pragma once
// RMSNorm<D> (Zhang & Sennrich 2019): h = x * rstd * g, rstd = 1/sqrt(mean(x^2) + eps).
// LayerNorm<D>: h = (x - mean) * rstd * g + b.
// Both save their input and f32 row statistics for backward.
#include "layer.hpp"

namespace headroom {

namespace detail {
// One normalization op over rows of x (N, D): declares the parameters named
// in `params` (each (D)), writes h (N, D) and one f32 statistic (N) per name
// in `stats`, and saves x and the statistics for backward.
template <std::size_t P, std::size_t S>
constexpr Ref norm_op(graph::Builder& b, Ref x, std::int64_t D, const std::string_view (&params)[P],
                      const std::string_view (&stats)[S], std::int64_t flops_per_elem_fwd, std::int64_t flops_per_elem_bwd) {
  const std::int64_t n = b.tokens_count();
  Op op{};
  op.kind = S == 1 ? graph::OpKind::rmsnorm : graph::OpKind::layernorm;
  op.dim[0] = D;
  op.in[0] = x;  // x: (N, D)
  op.in_grad[0] = true;
  op.n_in = 1;
  int k = 0;
  for (const auto& name : params) {
    const int id = b.param(name, D, 1);  // (D)
    op.param[k++] = id;
    const graph::Param p = b.params[id];
    if (p.trainable) op.grads[op.n_grads++] = p.grad;
  }
  const Ref h = b.activation("h", D);  // h: (N, D)
  op.out[op.n_out++] = h;
  op.saved[op.n_saved++] = x;
  for (const auto& name : stats) {
    const Ref st = b.produced(name, n * b.cfg.compute_bytes());  // (N) f32
    op.out[op.n_out++] = st;
    op.saved[op.n_saved++] = st;
  }
  op.flops_fwd = flops_per_elem_fwd * n * D;
  op.flops_bwd = flops_per_elem_bwd * n * D;
  b.emit(op);
  return h;
}
}  // namespace detail

template <std::int64_t D>
struct RMSNorm {
  HEADROOM_REQUIRE(D > 0, "RMSNorm<D>: D must be positive (it is {})", D);
  static constexpr std::string_view kind = "RMSNorm";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    constexpr std::string_view params[] = {"weight"};
    constexpr std::string_view stats[] = {"rstd"};
    return detail::norm_op(b, x, D, params, stats, 4, 8);
  }
};

template <std::int64_t D>
struct LayerNorm {
  HEADROOM_REQUIRE(D > 0, "LayerNorm<D>: D must be positive (it is {})", D);
  static constexpr std::string_view kind = "LayerNorm";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    constexpr std::string_view params[] = {"weight", "bias"};
    constexpr std::string_view stats[] = {"mean", "rstd"};
    return detail::norm_op(b, x, D, params, stats, 6, 10);
  }
};

template <class L>
concept Norm = Layer<L> && (L::in_features == L::out_features);

}  // namespace headroom
