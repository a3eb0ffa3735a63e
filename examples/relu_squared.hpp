#pragma once
// A new op with its own kernels, in one header: ReLU² (So et al. 2021,
// Primer), y = max(x, 0)², the layer that emits it, and a pre-norm MLP block
// built around it. docs/custom-layers.md walks through this file;
// examples/custom_op.cpp trains a model of these blocks.
#include <headroom/headroom.hpp>
#include <headroom/host/kernels/pointwise.hpp>
#include <headroom/host/op_context.hpp>
#if HEADROOM_CUDA_KERNELS  // nvcc, or the CPU emulator the tests run CUDA kernels on
#include <headroom/cuda/kernels/pointwise.cuh>
#include <headroom/cuda/op_context.cuh>
#endif

namespace my {
using namespace headroom;

// 1. The element math, once, for both engines.
struct ReluSquaredMath {
  template <class T>
  HEADROOM_HOST_DEVICE static T forward(T x) {  // max(x, 0)^2
    return x > T(0) ? x * x : T(0);
  }
  template <class T>
  HEADROOM_HOST_DEVICE static T backward(T x, T dy) {  // dx = dy * 2 max(x, 0)
    return x > T(0) ? T(2) * x * dy : T(0);
  }
};

// 2. The op: its name, its operands by name, how it enters the plan, and a
//    forward and backward per engine.
struct ReluSquaredOp {
  static constexpr std::string_view name = "relu_squared";
  static constexpr ops::In<0> x{};          // (N, F)
  static constexpr ops::Out<0> y{};         // (N, F)
  static constexpr ops::Saved<0> x_saved{};  // backward reads x again
  static constexpr ops::Dim<0> features{};

  static constexpr Ref emit(graph::Builder& b, Ref in, std::int64_t f) {
    graph::Op op = ops::make<ReluSquaredOp>();
    op.input(x, in);  // backward writes dx
    op.save(x_saved, in);
    op.set(features, f);
    const Ref out = b.activation("y", f);  // (N, F)
    op.output(y, out);
    op.flops_fwd = 2 * b.tokens_count() * f;
    op.flops_bwd = 3 * b.tokens_count() * f;
    b.emit(op);
    return out;
  }

  template <class T>  // the host engine: T = float or double
  static void forward(const host::OpContext<T>& k) {
    host::map_forward<ReluSquaredMath>(k[x], k[y], k.rows() * k[features], k.workers());
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* dx = k.grad(x)) host::map_backward<ReluSquaredMath>(k[x_saved], k.grad(y), dx, k.first(x), k.rows() * k[features], k.workers());
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>  // the CUDA engine: S = float, bf16 or half (the math runs in f32)
  static void forward(const cuda::OpContext<S>& k) {
    cuda::map_forward<ReluSquaredMath>(k[x], k[y], k.rows() * k[features], k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    if (S* dx = k.grad(x)) cuda::map_backward<ReluSquaredMath>(k[x_saved], k.grad(y), dx, k.first(x), k.rows() * k[features], k.stream());
  }
#endif
};

// 3. The layer that emits it: ReLU² over F features.
template <std::int64_t F>
struct ReluSquared {
  static_assert(F > 0, "ReluSquared<F>: F must be positive");
  static constexpr std::string_view kind = "ReluSquared";
  static constexpr std::int64_t in_features = F, out_features = F;
  using children = type_list<>;
  using ops = type_list<ReluSquaredOp>;  // the ops it emits itself: the engines find their kernels here
  static constexpr Ref build(graph::Builder& b, Ref x) { return ReluSquaredOp::emit(b, x, F); }
};

// 4. A block that uses it: x + down(relu²(up(rmsnorm(x)))), its children named.
template <std::int64_t D, std::int64_t F, class Up = Linear<D, F>, class Down = Linear<F, D>>
struct MlpBlock {
  static_assert(Up::in_features == D && Up::out_features == F, "MlpBlock<D, F, Up, Down>: Up must map D to F");
  static_assert(Down::in_features == F && Down::out_features == D, "MlpBlock<D, F, Up, Down>: Down must map F to D");
  static constexpr std::string_view kind = "MlpBlock";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<RMSNorm<D>, Up, ReluSquared<F>, Down>;
  using ops = type_list<headroom::ops::Add>;  // residual_add's

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    Ref h = b.child<RMSNorm<D>>("norm", x);
    h = b.child<Up>("up", h);               // (N, F)
    h = b.child<ReluSquared<F>>("act", h);  // (N, F)
    h = b.child<Down>("down", h);           // (N, D)
    return residual_add(b, "add", x, h, D);  // one gradient stream, no new buffer
  }
};

// 5. A byte-level language model of L such blocks.
template <int L, class Block, std::int64_t V = 256>
struct TinyLM {
  static constexpr std::int64_t D = Block::in_features;
  static constexpr std::string_view kind = "TinyLM";
  static constexpr std::int64_t in_features = 0, out_features = 0;
  static constexpr std::int64_t max_seq = 1024;  // optional: Train checks Seq<T> against it
  using children = type_list<Embedding<V, D>, Repeat<L, Block>, RMSNorm<D>, LMHeadLoss<V, D, false>>;

  static constexpr Ref build(graph::Builder& b, Ref tokens) {
    Ref x = b.child<Embedding<V, D>>("embed", tokens);
    x = b.child<Repeat<L, Block>>("blocks", x);
    x = b.child<RMSNorm<D>>("norm", x);
    return b.child<LMHeadLoss<V, D, false>>("head", x);
  }
};

}  // namespace my
