#pragma once
// LoRA<Rank, L, Alpha>: y = L(x) + (Alpha / Rank) * B (A x)  (Hu et al. 2021).
// The base L is frozen; A (Rank, In) and B (Out, Rank) are trainable, B starts
// at zero so the wrapped layer starts as the base. Alpha is an integer ratio
// (default Alpha = Rank, scale 1). Forward adds the low-rank product into the
// base output in place and saves x and A x (N, Rank) for backward.
#include "projection.hpp"

namespace headroom {

template <int Rank, class L = Linear<>, class Alpha = Ratio<Rank>>
struct LoRA {
  static constexpr bool is_recipe = headroom::is_recipe<L>();
  static_assert(is_projection_v<L>, "LoRA<Rank, L>: L must be a linear projection (Linear, or Quantized / Frozen over one)");
  HEADROOM_REQUIRE(Rank >= 1, "LoRA<Rank, L>: rank must be at least 1 (it is {})", Rank);
  HEADROOM_REQUIRE(is_recipe || (Rank <= L::in_features && Rank <= L::out_features),
                   "LoRA<Rank, L>: rank ({}) must not exceed in_features ({}) or out_features ({}) of the projection", Rank,
                   L::in_features, L::out_features);
  HEADROOM_REQUIRE(adapter_count<L>::value == 0,
                   "LoRA<Rank, L>: a projection takes at most one LoRA adapter, and L already has {}", adapter_count<L>::value);
  HEADROOM_REQUIRE(Rank < 1 || Alpha::num > 0, "LoRA<Rank, L, Alpha>: alpha must be positive (it is {} / {})", Alpha::num,
                   Alpha::den);
  static constexpr std::string_view kind = "LoRA";
  static constexpr std::int64_t in_features = L::in_features, out_features = L::out_features;
  static constexpr int rank = Rank;
  using alpha = Alpha;
  using inner = L;
  using children = type_list<L>;
  template <class New>
  using rebind = LoRA<Rank, New, Alpha>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, In)
    b.push_frozen();
    const Ref y = L::build(b, x);  // y: (N, Out), the base output
    b.pop_frozen();
    const int a_id = b.adapter("lora_A", Rank, in_features);   // A: (Rank, In)
    const int b_id = b.adapter("lora_B", out_features, Rank);  // B: (Out, Rank)
    const graph::Param pa = b.params[a_id];
    const graph::Param pb = b.params[b_id];
    const std::int64_t n = b.tokens_count();
    Op op{};
    op.kind = graph::OpKind::lora;
    op.param[0] = a_id;
    op.param[1] = b_id;
    op.dim[0] = in_features;
    op.dim[1] = out_features;
    op.dim[2] = Rank;
    op.scale_num = Alpha::num;
    op.scale_den = Alpha::den * Rank;
    op.in[0] = x;
    op.in_grad[0] = true;
    op.n_in = 1;
    op.inout = y;                                                // y += s * B (A x)
    const Ref ax = b.produced("lora_ax", n * Rank * b.cfg.act_bytes());  // A x: (N, Rank)
    op.out[0] = ax;
    op.n_out = 1;
    op.saved[op.n_saved++] = x;
    op.saved[op.n_saved++] = ax;
    op.grads[op.n_grads++] = pa.grad;
    op.grads[op.n_grads++] = pb.grad;
    // d(A x): (N, Rank) in the compute type; on CUDA in the storage type (a GEMM operand)
    op.scratch_bwd = n * Rank * (b.cfg.cuda() ? b.cfg.act_bytes() : b.cfg.compute_bytes());
    b.gemm(n, Rank, in_features);   // A x;  dx += d(Ax) A
    b.gemm(n, out_features, Rank);  // y += B (A x)
    b.gemm(n, Rank, out_features);  // d(Ax) = dy B
    b.gemm(n, in_features, Rank);
    b.gemm(out_features, Rank, n);  // dB = dy^T (A x)
    b.gemm(Rank, in_features, n);   // dA = d(Ax)^T x
    op.flops_fwd = 2 * n * Rank * (in_features + out_features);
    op.flops_bwd = 2 * op.flops_fwd;
    b.emit(op);
    return y;
  }
};
template <int R, class L, class A>
struct is_projection<LoRA<R, L, A>> : std::true_type {};
template <int R, class L, class A>
struct adapter_count<LoRA<R, L, A>> : std::integral_constant<int, 1 + adapter_count<L>::value> {};
template <int R, class L, class A>
struct quant_format_of<LoRA<R, L, A>> : quant_format_of<L> {};

}  // namespace headroom
