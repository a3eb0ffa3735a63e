#pragma once
// The elementwise ops: GELU (tanh form; Hendrycks & Gimpel 2016), SwiGLU's
// silu(gate) * up (Shazeer 2020) and the residual add. Each reads and writes
// (N, F) tensors; the element math is in math/activations.hpp
// (HEADROOM_HOST_DEVICE), shared by both engines' kernels.
#include <cstdint>
#include <string_view>

#include "../host/kernels/pointwise.hpp"
#include "../host/op_context.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/pointwise.cuh"
#include "../cuda/op_context.cuh"
#endif

namespace headroom::ops {

struct Linear;  // ops/linear.hpp: computes GELU and SwiGLU in its epilogue

// y = gelu(x). A linear right before it computes it in its GEMM epilogue.
struct Gelu {
  static constexpr std::string_view name = "gelu";
  static constexpr In<0> x{};
  static constexpr Out<0> y{};
  static constexpr Saved<0> x_saved{};
  static constexpr Dim<0> features{};
  static constexpr EpilogueOf<Linear> epilogue{x};  // a linear right before it whose output is x

  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref in, std::int64_t f) {  // in: (N, F)
    graph::Op op = make<Gelu>();
    op.input(x, in);
    op.save(x_saved, in);
    op.set(features, f);
    const graph::Ref out = b.activation("gelu", f);  // (N, F)
    op.output(y, out);
    op.flops_fwd = 8 * b.tokens_count() * f;
    op.flops_bwd = 2 * op.flops_fwd;
    b.emit(op);
    return out;
  }

  template <class T>
  static void forward(const host::OpContext<T>& k) {
    host::gelu_forward(k[x], k[y], k.rows() * k[features], k.workers());
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* dx = k.grad(x)) host::gelu_backward(k[x_saved], k.grad(y), dx, k.first(x), k.rows() * k[features], k.workers());
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    cuda::gelu_forward<S>(k[x], k[y], k.rows() * k[features], k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    if (S* dx = k.grad(x)) cuda::gelu_backward<S>(k[x_saved], k.grad(y), dx, k.first(x), k.rows() * k[features], k.stream());
  }
#endif
};

// y = silu(gate) * up. The up projection right before it computes it in its
// GEMM epilogue (gate already computed).
struct SwiGLU {
  static constexpr std::string_view name = "swiglu";
  static constexpr In<0> gate{};
  static constexpr In<1> up{};
  static constexpr Out<0> y{};
  static constexpr Saved<0> gate_saved{};
  static constexpr Saved<1> up_saved{};
  static constexpr Dim<0> features{};
  static constexpr EpilogueOf<Linear> epilogue{up};  // the up projection right before it (gate already computed)

  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref g, graph::Ref u, std::int64_t f) {  // g, u: (N, F)
    graph::Op op = make<SwiGLU>();
    op.input(gate, g);
    op.input(up, u);
    op.save(gate_saved, g);
    op.save(up_saved, u);
    op.set(features, f);
    const graph::Ref out = b.activation("silu_mul", f);  // (N, F)
    op.output(y, out);
    op.flops_fwd = 5 * b.tokens_count() * f;
    op.flops_bwd = 2 * op.flops_fwd;
    b.emit(op);
    return out;
  }

  template <class T>
  static void forward(const host::OpContext<T>& k) {
    host::swiglu_forward(k[gate], k[up], k[y], k.rows() * k[features], k.workers());
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    host::swiglu_backward(k[gate_saved], k[up_saved], k.grad(y), k.grad(gate), k.first(gate), k.grad(up), k.first(up),
                          k.rows() * k[features], k.workers());
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    cuda::swiglu_forward<S>(k[gate], k[up], k[y], k.rows() * k[features], k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    cuda::swiglu_backward<S>(k[gate_saved], k[up_saved], k.grad(y), k.grad(gate), k.first(gate), k.grad(up), k.first(up),
                             k.rows() * k[features], k.stream());
  }
#endif
};

// y = x + f. Backward writes nothing new: the gradients of x and f are the
// gradient of y itself (one buffer), so a stack of residual blocks carries
// one activation-gradient stream, accumulated in place, as in llm.c.
struct Add {
  static constexpr std::string_view name = "add";
  static constexpr In<0> x{};
  static constexpr In<1> f{};
  static constexpr Out<0> y{};
  static constexpr Dim<0> features{};

  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref a, graph::Ref c, std::int64_t d) {  // a, c: (N, D)
    graph::Op op = make<Add>();
    op.input(x, a, true, true);
    op.input(f, c, true, true);
    op.set(features, d);
    const graph::Ref out = b.activation("residual", d);  // (N, D)
    op.output(y, out);
    op.flops_fwd = b.tokens_count() * d;
    b.emit(op);
    return out;
  }

  template <class T>
  static void forward(const host::OpContext<T>& k) {
    host::add_forward(k[x], k[f], k[y], k.rows() * k[features], k.workers());
  }
  // Only where the plan gave an input's gradient a buffer of its own (not aliased).
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* d = k.grad(x)) host::accumulate(k.grad(y), d, k.first(x), k.rows() * k[features], k.workers());
    if (T* d = k.grad(f)) host::accumulate(k.grad(y), d, k.first(f), k.rows() * k[features], k.workers());
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    cuda::add_forward<S>(k[x], k[f], k[y], k.rows() * k[features], k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    if (S* d = k.grad(x)) cuda::accumulate<S>(k.grad(y), d, k.first(x), k.rows() * k[features], k.stream());
    if (S* d = k.grad(f)) cuda::accumulate<S>(k.grad(y), d, k.first(f), k.rows() * k[features], k.stream());
  }
#endif
};

}  // namespace headroom::ops
