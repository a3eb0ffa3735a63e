#pragma once
// Row normalizations over (N, D): RMSNorm (Zhang & Sennrich 2019),
// h = x * rstd * g with rstd = 1/sqrt(mean(x^2) + eps); LayerNorm,
// h = (x - mean) * rstd * g + b. Both save x and their row statistics
// ((N), f32; f64 in f64 runs) for backward. A per-head norm (Qwen3's q_norm
// and k_norm) normalizes each token's G groups of D values: (N G, D) rows,
// one gain (D) shared by the groups.
#include <bit>
#include <cstdint>
#include <string_view>

#include "../host/kernels/pointwise.hpp"
#include "../math/norms.hpp"
#include "../host/op_context.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/pointwise.cuh"
#include "../cuda/op_context.cuh"
#endif

namespace headroom::ops {

// Layer = false: RMSNorm; true: LayerNorm.
template <bool Layer>
struct Norm {
  static constexpr std::string_view name = Layer ? "layernorm" : "rmsnorm";
  static constexpr In<0> x{};          // (N G, D)
  static constexpr Out<0> h{};         // (N G, D)
  static constexpr Out<1> mean{};      // (N G) compute type; LayerNorm only
  static constexpr Out<Layer ? 2 : 1> rstd{};
  static constexpr Saved<0> x_saved{};
  static constexpr Saved<1> mean_saved{};
  static constexpr Saved<Layer ? 2 : 1> rstd_saved{};
  static constexpr Weight<0> gain{};   // (D)
  static constexpr Weight<1> shift{};  // (D), LayerNorm only
  static constexpr Dim<0> features{};
  static constexpr Dim<1> eps_bits{};  // epsilon, the bits of its double
  static constexpr Dim<2> groups{};    // G: rows per token (1; a per-head norm: the heads)

  // The gain is parameter `g` (D); LayerNorm's shift parameter `s` (D);
  // `per_token` rows of d features per token (G).
  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref input, int g, int s, std::int64_t d,
                                   double eps = math::norm_eps, std::int64_t per_token = 1) {
    const std::int64_t n = b.tokens_count() * per_token;
    graph::Op op = make<Norm>();
    op.set(features, d);
    op.set(eps_bits, std::bit_cast<std::int64_t>(eps));
    op.set(groups, per_token);
    op.input(x, input);
    const graph::Param pg = b.params[g];
    op.use(gain, g, pg.trainable ? pg.grad : graph::none);
    if constexpr (Layer) {
      const graph::Param ps = b.params[s];
      op.use(shift, s, ps.trainable ? ps.grad : graph::none);
    }
    const graph::Ref out = b.activation("h", per_token * d);  // (N G, D)
    op.output(h, out);
    op.save(x_saved, input);
    if constexpr (Layer) {
      const graph::Ref m = b.produced("mean", n * b.cfg.compute_bytes());  // (N G)
      op.output(mean, m);
      op.save(mean_saved, m);
    }
    const graph::Ref r = b.produced("rstd", n * b.cfg.compute_bytes());  // (N G)
    op.output(rstd, r);
    op.save(rstd_saved, r);
    op.flops_fwd = (Layer ? 6 : 4) * n * d;
    op.flops_bwd = (Layer ? 10 : 8) * n * d;
    b.emit(op);
    return out;
  }

  template <class T>
  static void forward(const host::OpContext<T>& k) {
    using C = typename host::OpContext<T>::compute;
    host::norm_forward<T>(Layer, k[x], k[gain], Layer ? k[shift] : nullptr, k[h], Layer ? k.template get<C>(mean) : nullptr,
                          k.template get<C>(rstd), rows(k), k[features], k.workers(), eps(k));
  }
  template <class Context>
  static double eps(const Context& k) {
    return std::bit_cast<double>(k[eps_bits]);
  }
  template <class Context>
  static std::int64_t rows(const Context& k) {  // N G
    return k.rows() * k[groups];
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    using C = typename host::OpContext<T>::compute;
    host::norm_backward<T>(Layer, k[x_saved], k[gain], Layer ? k.template get<C>(mean_saved) : nullptr,
                           k.template get<C>(rstd_saved), k.grad(h), k.grad(x), k.first(x), k.grad(gain), k.first(gain),
                           Layer ? k.grad(shift) : nullptr, Layer && k.first(shift), rows(k), k[features], k.workers());
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    cuda::norm_forward<S>(Layer, k[x], k[gain], Layer ? k[shift] : nullptr, k[h], Layer ? k.template get<float>(mean) : nullptr,
                          k.template get<float>(rstd), rows(k), k[features], k.stream(), static_cast<float>(eps(k)));
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    cuda::norm_backward<S>(Layer, k[x_saved], k[gain], Layer ? k.template get<float>(mean_saved) : nullptr,
                           k.template get<float>(rstd_saved), k.grad(h), k.grad(x), k.first(x), k.grad(gain), k.first(gain),
                           Layer ? k.grad(shift) : nullptr, Layer && k.first(shift), rows(k), k[features], k.stream());
  }
#endif
};

using RMSNorm = Norm<false>;
using LayerNorm = Norm<true>;

}  // namespace headroom::ops
