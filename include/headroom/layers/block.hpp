#pragma once
// Residual composition and the pre-norm transformer block.
//
// residual_add emits y = x + f (ops::Add), for blocks of any shape.
//
// PreNormBlock<Names, Norm1, Attn, Norm2, Mlp>:
//   x2 = x + Attn(Norm1(x));  y = x2 + Mlp(Norm2(x2))
#include "../ops/elementwise.hpp"
#include "layer.hpp"

namespace headroom {

// y = x + f under a node `name` (kind "Add"): the residual connection of a
// block (ops::Add). Its backward writes nothing new: the gradients of x and f
// are the gradient of y itself (one buffer), so a stack of residual blocks
// carries one activation-gradient stream, accumulated in place, as in
// llm.c. A layer that calls it lists headroom::ops::Add in its `ops`.
constexpr Ref residual_add(graph::Builder& b, std::string_view name, Ref x, Ref f, std::int64_t features) {  // x, f: (N, D)
  b.open(name, "Add");
  const Ref y = ops::Add::emit(b, x, f, features);  // y: (N, D)
  b.close();
  return y;
}

// Residual<F>: y = x + F(x).
template <class F>
struct Residual {
  HEADROOM_REQUIRE(F::in_features == F::out_features,
                   "Residual<F>: F must map D features to D features (it maps {} to {})", F::in_features, F::out_features);
  static constexpr std::string_view kind = "Residual";
  static constexpr std::int64_t in_features = F::in_features, out_features = F::out_features;
  using children = type_list<F>;
  using ops = type_list<headroom::ops::Add>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    const Ref f = b.child<F>("fn", x);
    return residual_add(b, "add", x, f, out_features);
  }
};

// Slot names of a block, as the checkpoints of its family spell them.
struct LlamaBlockNames {
  static constexpr std::string_view norm1 = "input_layernorm", attn = "self_attn";
  static constexpr std::string_view norm2 = "post_attention_layernorm", mlp = "mlp";
};
struct GPT2BlockNames {
  static constexpr std::string_view norm1 = "ln_1", attn = "attn", norm2 = "ln_2", mlp = "mlp";
};

template <class Names, class Norm1, class Attn, class Norm2, class Mlp>
struct PreNormBlock {
  static constexpr std::int64_t D = Attn::in_features;
  HEADROOM_REQUIRE(Norm1::in_features == D && Norm2::in_features == D && Mlp::in_features == D && Mlp::out_features == D &&
                       Attn::out_features == D,
                   "PreNormBlock: norms, attention and MLP must all map D features to D features (D = {}: norm1 takes {}, "
                   "attention gives {}, norm2 takes {}, MLP maps {} to {})",
                   D, Norm1::in_features, Attn::out_features, Norm2::in_features, Mlp::in_features, Mlp::out_features);
  static constexpr std::string_view kind = "Block";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<Norm1, Attn, Norm2, Mlp>;
  using ops = type_list<headroom::ops::Add>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    const Ref a = b.child<Attn>(Names::attn, b.child<Norm1>(Names::norm1, x));
    const Ref x2 = residual_add(b, "residual_1", x, a, D);  // x2: (N, D)
    const Ref m = b.child<Mlp>(Names::mlp, b.child<Norm2>(Names::norm2, x2));
    return residual_add(b, "residual_2", x2, m, D);  // y: (N, D)
  }
};

}  // namespace headroom
