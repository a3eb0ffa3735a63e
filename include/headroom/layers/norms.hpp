#pragma once
// RMSNorm<D, Eps> (Zhang & Sennrich 2019): h = x * rstd * g, rstd = 1/sqrt(mean(x^2) + eps),
// eps = Eps (rms_norm_eps of a config.json: 1e-5 for Llama, real(1e-6) for Qwen).
// LayerNorm<D>: h = (x - mean) * rstd * g + b, eps 1e-5 (GPT-2's).
// Both save their input and f32 row statistics for backward.
#include "../core/real.hpp"
#include "../ops/norm.hpp"
#include "layer.hpp"

namespace headroom {

template <std::int64_t D, Real Eps = real(math::norm_eps)>
struct RMSNorm {
  HEADROOM_REQUIRE(D > 0, "RMSNorm<D>: D must be positive (it is {})", D);
  static_assert(Eps > 0 && Eps < 1, "RMSNorm<D, Eps>: the epsilon Eps must be in (0, 1)");
  static constexpr double eps = Eps;
  static constexpr std::string_view kind = "RMSNorm";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;
  using ops = type_list<headroom::ops::RMSNorm>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    const int g = b.param("weight", D, 1);                // g: (D)
    return headroom::ops::RMSNorm::emit(b, x, g, graph::none, D, eps);  // h: (N, D)
  }
  // Each of a token's `heads` groups of D values normalized alone, with one
  // gain (Qwen3's q_norm, k_norm). Heads split over tensor-parallel ranks
  // leave each rank a partial gradient of the gain, summed before the update.
  static constexpr Ref build_per_head(graph::Builder& b, Ref x, std::int64_t heads) {  // x: (N, heads D)
    const int g = b.param("weight", D, 1);  // g: (D)
    if (b.cfg.tp > 1 && b.params[g].trainable) b.params[g].tensor_partial = true;
    return headroom::ops::RMSNorm::emit(b, x, g, graph::none, D, eps, heads);  // h: (N, heads D)
  }
};

template <std::int64_t D>
struct LayerNorm {
  HEADROOM_REQUIRE(D > 0, "LayerNorm<D>: D must be positive (it is {})", D);
  static constexpr std::string_view kind = "LayerNorm";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;
  using ops = type_list<headroom::ops::LayerNorm>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    const int g = b.param("weight", D, 1);  // g: (D)
    const int s = b.param("bias", D, 1);    // b: (D)
    return headroom::ops::LayerNorm::emit(b, x, g, s, D);  // h: (N, D)
  }
};

template <class L>
concept Norm = Layer<L> && (L::in_features == L::out_features);

}  // namespace headroom
