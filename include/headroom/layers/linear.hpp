#pragma once
// Linear<In, Out, Bias>: y = x W^T (+ b), W [Out, In].
// Linear<> (no dims) is a recipe: the model fills in the dims.
#include "layer.hpp"

namespace headroom {

template <std::int64_t In = 0, std::int64_t Out = 0, bool Bias = false>
struct Linear {
  HEADROOM_REQUIRE(In >= 0 && Out >= 0, "Linear<In, Out>: dims must be positive (they are {} and {})", In, Out);
  static constexpr std::string_view kind = "Linear";
  static constexpr std::int64_t in_features = In, out_features = Out;
  static constexpr bool bias = Bias;
  static constexpr bool is_recipe = (In == 0 || Out == 0);
  using children = type_list<>;
  template <std::int64_t I, std::int64_t O, bool B>
  using with_dims = Linear<I, O, B>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    static_assert(!is_recipe, "Linear<>: a recipe without dims is only valid inside a model's Apply<...>; write Linear<In, Out>");
    const int w = b.matrix("weight", Out, In);  // W: (Out, In)
    const graph::Param pw = b.params[w];
    const bool quantized = pw.quant.kind != QuantKind::none;
    Op op{};
    op.kind = graph::OpKind::linear;
    op.param[0] = w;
    op.dim[0] = In;
    op.dim[1] = Out;
    op.in[0] = x;  // x: (N, In)
    op.in_grad[0] = true;
    op.n_in = 1;
    const Ref y = b.activation("y", Out);  // y: (N, Out)
    op.out[0] = y;
    op.n_out = 1;
    const std::int64_t n = b.tokens_count();
    op.flops_fwd = 2 * n * In * Out + (Bias ? n * Out : 0);
    op.flops_bwd = 2 * n * In * Out;  // dX = dY W
    if (pw.trainable) {
      op.saved[op.n_saved++] = x;
      op.grads[op.n_grads++] = pw.grad;
      op.flops_bwd += 2 * n * In * Out;  // dW = dY^T X
    }
    if constexpr (Bias) {
      const int bias_id = b.param("bias", Out, 1);  // b: (Out)
      op.param[1] = bias_id;
      const graph::Param pb = b.params[bias_id];
      if (pb.trainable) {
        op.grads[op.n_grads++] = pb.grad;
        op.flops_bwd += n * Out;
      }
    }
    if (quantized && b.cfg.cuda()) {
      // dequantized tile by tile inside the GEMM's shared memory: no scratch
    } else if (quantized) {
      // one dequantized panel of W per worker, f32: (tile, In)
      op.scratch_fwd = op.scratch_bwd = b.cfg.workers * detail::tile * In * b.cfg.compute_bytes();
      b.gemm(n, b.cfg.workers * detail::tile, In);   // Y panel = X W_panel^T
      b.gemm(n, In, b.cfg.workers * detail::tile);   // dX += dY_panel W_panel
    } else {
      b.gemm(n, Out, In);  // Y = X W^T;  dX = dY W: (n, In, Out)
      b.gemm(n, In, Out);
    }
    if (pw.trainable) b.gemm(Out, In, n);  // dW = dY^T X
    b.emit(op);
    return y;
  }
};

}  // namespace headroom
