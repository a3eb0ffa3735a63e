#pragma once
// RMSNorm<D> (Zhang & Sennrich 2019): h = x * rstd * g, rstd = 1/sqrt(mean(x^2) + eps).
// LayerNorm<D>: h = (x - mean) * rstd * g + b.
// Both save their input and f32 row statistics for backward.
#include "layer.hpp"

namespace headroom {

template <std::int64_t D>
struct RMSNorm {
  static_assert(D > 0, "RMSNorm<D>: D must be positive");
  static constexpr std::string_view kind = "RMSNorm";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    const graph::Param pg = b.params[b.param("weight", D, 1)];  // g: (D)
    const std::int64_t n = b.tokens_count();
    Op op{};
    op.in[0] = x;  // x: (N, D)
    op.in_grad[0] = true;
    op.n_in = 1;
    const Ref h = b.activation("h", D);          // h: (N, D)
    const Ref rstd = b.produced("rstd", n * 4);  // rstd: (N) f32
    op.out[0] = h;
    op.out[1] = rstd;
    op.n_out = 2;
    op.saved[op.n_saved++] = x;
    op.saved[op.n_saved++] = rstd;
    if (pg.trainable) op.grads[op.n_grads++] = pg.grad;
    op.flops_fwd = 4 * n * D;
    op.flops_bwd = 8 * n * D;
    b.emit(op);
    return h;
  }
};

template <std::int64_t D>
struct LayerNorm {
  static_assert(D > 0, "LayerNorm<D>: D must be positive");
  static constexpr std::string_view kind = "LayerNorm";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    const graph::Param pg = b.params[b.param("weight", D, 1)];  // g: (D)
    const graph::Param pb = b.params[b.param("bias", D, 1)];    // b: (D)
    const std::int64_t n = b.tokens_count();
    Op op{};
    op.in[0] = x;  // x: (N, D)
    op.in_grad[0] = true;
    op.n_in = 1;
    const Ref h = b.activation("h", D);          // h: (N, D)
    const Ref mean = b.produced("mean", n * 4);  // mean: (N) f32
    const Ref rstd = b.produced("rstd", n * 4);  // rstd: (N) f32
    op.out[0] = h;
    op.out[1] = mean;
    op.out[2] = rstd;
    op.n_out = 3;
    op.saved[op.n_saved++] = x;
    op.saved[op.n_saved++] = mean;
    op.saved[op.n_saved++] = rstd;
    if (pg.trainable) op.grads[op.n_grads++] = pg.grad;
    if (pb.trainable) op.grads[op.n_grads++] = pb.grad;
    op.flops_fwd = 6 * n * D;
    op.flops_bwd = 10 * n * D;
    b.emit(op);
    return h;
  }
};

template <class L>
concept Norm = Layer<L> && (L::in_features == L::out_features);

}  // namespace headroom
