#ifndef HEADROOM_OPS_LINEAR_HPP
#define HEADROOM_OPS_LINEAR_HPP
// y = x W^T (+ b): the projection op. W (out, in) is dense, or quantized
// (NF4, int8, int4) and frozen: then it is dequantized panel by panel inside
// the GEMM (host) or tile by tile in shared memory (CUDA), never whole.
// LLM.int8 (row-wise int8 W, LLMInt8<>): the forward quantizes the input
// too and multiplies in int8, its outlier columns in f32
// (math/llm_int8.hpp); the backward dequantizes as for the other formats.
// The activations it lists in `epilogues` (GELU, SwiGLU) are computed in
// its GEMM epilogue when they come right after it (ops/epilogue.hpp).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "../host/op_context.hpp"
#include "../math/llm_int8.hpp"
#include "elementwise.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/llm_int8.cuh"
#include "../cuda/kernels/pointwise.cuh"
#include "../cuda/kernels/quant_linear.cuh"
#include "../cuda/op_context.cuh"
#endif

namespace headroom::ops {

struct Linear {
  static constexpr std::string_view name = "linear";
  static constexpr In<0> x{};            // (N, in)
  static constexpr Out<0> y{};           // (N, out)
  static constexpr Saved<0> x_saved{};   // when W trains
  static constexpr Weight<0> weight{};   // (out, in)
  static constexpr Weight<1> bias{};     // (out), optional
  static constexpr Dim<0> in{};
  static constexpr Dim<1> out{};
  using epilogues = type_list<Gelu, SwiGLU>;  // forward computes them after the GEMM (fused<Gelu>())
  // rows of a dequantized weight panel per worker (host engine)
  static constexpr std::int64_t panel_rows = 64;

  // W is parameter `w` (out, in); with_bias declares the bias, parameter
  // "bias" (out), after the output.
  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref input, int w, bool with_bias, std::int64_t in_f, std::int64_t out_f) {
    const graph::Param pw = b.params[w];
    const bool quantized = pw.quant.kind != QuantKind::none;
    graph::Op op = make<Linear>();
    op.use(weight, w, pw.trainable ? pw.grad : graph::none);
    op.set(in, in_f);
    op.set(out, out_f);
    op.input(x, input);
    const graph::Ref output = b.activation("y", out_f);  // (N, out)
    op.output(y, output);
    const std::int64_t n = b.tokens_count();
    op.flops_fwd = 2 * n * in_f * out_f + (with_bias ? n * out_f : 0);
    op.flops_bwd = 2 * n * in_f * out_f;  // dX = dY W
    if (pw.trainable) {
      op.save(x_saved, input);
      op.flops_bwd += 2 * n * in_f * out_f;  // dW = dY^T X
    }
    if (with_bias) {
      const int b_id = b.param("bias", out_f, 1);
      const graph::Param pb = b.params[b_id];
      op.use(bias, b_id, pb.trainable ? pb.grad : graph::none);
      if (pb.trainable) op.flops_bwd += n * out_f;
    }
    if (quantized && b.cfg.cuda()) {
      // dequantized tile by tile inside the GEMM's shared memory: no scratch
      // (LLM.int8: the quantized input and its outlier columns, math/llm_int8.hpp)
      if (pw.quant.vectorwise) op.scratch_fwd = math::int8_scratch(n, in_f, pw.quant.max_outliers).bytes;
    } else if (quantized) {
      // one dequantized panel of W per worker, in the compute type: (panel_rows, in)
      op.scratch_fwd = op.scratch_bwd = b.cfg.workers * panel_rows * in_f * b.cfg.compute_bytes();
      b.gemm(n, in_f, b.cfg.workers * panel_rows);  // dX += dY_panel W_panel
      if (pw.quant.vectorwise)  // LLM.int8's forward: the quantized input and its outlier columns, no panel
        op.scratch_fwd = math::int8_scratch(n, in_f, pw.quant.max_outliers).bytes;
      else
        b.gemm(n, b.cfg.workers * panel_rows, in_f);  // Y panel = X W_panel^T
    } else {
      b.gemm(n, out_f, in_f);  // Y = X W^T;  dX = dY W
      b.gemm(n, in_f, out_f);
    }
    if (pw.trainable) b.gemm(out_f, in_f, n);  // dW = dY^T X
    b.emit(op);
    return output;
  }

  // ---- host ----------------------------------------------------------------------------------------------
  template <class T>
  static void forward(const host::OpContext<T>& k);
  template <class T>
  static void backward(const host::OpContext<T>& k);

  // ---- CUDA ----------------------------------------------------------------------------------------------
#if HEADROOM_CUDA_KERNELS
  // y = x W^T + b and the activation fused after it (GELU in cuBLASLt's
  // epilogue when it fits; SwiGLU as its own kernel, right after). LLM.int8:
  // cuda/kernels/llm_int8.cuh, in the op's forward scratch.
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    using cuda::GemmEpilogue, cuda::Trans;
    const std::int64_t n = k.rows();
    const S* b = k[bias];
    S* out_y = k[y];
    const auto* gelu = k.template fused<Gelu>();
    const auto* swiglu = k.template fused<SwiGLU>();
    if (k.quantized(weight) && k.quant(weight).q.vectorwise) {
      // LLM.int8: a batch beyond the plan's outlier bound stops the step (the control block)
      cuda::llm_int8_forward<S>(k[x], k.quant(weight), b, out_y, n, k.template scratch<std::byte>(), k.control(), k.schedule_step,
                                k.stream());
    } else if (k.quantized(weight)) {
      cuda::quant_linear_forward<S>(k[x], k.quant(weight), b, out_y, n, k.stream());
    } else if (gelu != nullptr && b != nullptr && cuda::Blas::gelu_epilogue_fits(k[out])) {
      // the pre-activation y (saved for backward) and gelu(y) in one GEMM
      k.blas().template gemm<S>(Trans::no, Trans::yes, n, k[out], k[in], 1.0f, k[x], k[in], k[weight], k[in], 0.0f, (*gelu)[Gelu::y],
                                k[out], k.stream(), GemmEpilogue::gelu_aux_bias, b, out_y);
      return;
    } else {
      k.blas().template gemm<S>(Trans::no, Trans::yes, n, k[out], k[in], 1.0f, k[x], k[in], k[weight], k[in], 0.0f, out_y, k[out],
                                k.stream(), b != nullptr ? GemmEpilogue::bias : GemmEpilogue::none, b);
    }
    if (gelu != nullptr) cuda::gelu_forward<S>(out_y, (*gelu)[Gelu::y], n * k[out], k.stream());
    if (swiglu != nullptr) cuda::swiglu_forward<S>((*swiglu)[SwiGLU::gate], out_y, (*swiglu)[SwiGLU::y], n * k[out], k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    using cuda::Trans;
    const std::int64_t n = k.rows();
    const S* dy = k.grad(y);
    S* dx = k.grad(x);
    if (k.quantized(weight)) {
      if (dx != nullptr) cuda::quant_linear_backward_input<S>(dy, k.quant(weight), dx, k.first(x), n, k.stream());
    } else {
      if (dx != nullptr)  // dx (N, in) = dy W
        k.blas().template gemm<S>(Trans::no, Trans::no, n, k[in], k[out], 1.0f, dy, k[out], k[weight], k[in], k.first(x) ? 0.0f : 1.0f,
                                  dx, k[in], k.stream());
      if (S* dw = k.grad(weight))  // dW (out, in) = dy^T x
        k.blas().template gemm<S>(Trans::yes, Trans::no, k[out], k[in], n, 1.0f, dy, k[out], k[x_saved], k[in],
                                  k.first(weight) ? 0.0f : 1.0f, dw, k[in], k.stream());
    }
    if (S* db = k.grad(bias)) cuda::column_sums<S>(dy, db, k.first(bias), n, k[out], k.stream());
  }
#endif
};

}  // namespace headroom::ops
#endif  // HEADROOM_OPS_LINEAR_HPP

// ---- the host kernels --------------------------------------------------------------------------------------
// Compiled where the host engine is (train/host/trainer.hpp includes
// ops/host_kernels.hpp, which sets HEADROOM_HOST_KERNELS and includes this
// header again): they need Eigen, which a plan alone does not.
#if defined(HEADROOM_HOST_KERNELS) && !defined(HEADROOM_OPS_LINEAR_HOST_KERNELS)
#define HEADROOM_OPS_LINEAR_HOST_KERNELS
#include "../host/kernels/linear.hpp"

namespace headroom::ops {

// ---- host ----------------------------------------------------------------------------------------------
template <class T>
void Linear::forward(const host::OpContext<T>& k) {
  host::Epilogue<T> ep{};
  ep.bias = k[bias];
  if (const auto* g = k.template fused<Gelu>()) {
    ep.act = host::Fused::gelu;
    ep.act_out = (*g)[Gelu::y];
  } else if (const auto* s = k.template fused<SwiGLU>()) {
    ep.act = host::Fused::swiglu_up;
    ep.act_out = (*s)[SwiGLU::y];
    ep.gate = (*s)[SwiGLU::gate];
  }
  const math::QuantView& q = k.quant(weight);
  if (k.quantized(weight) && q.q.vectorwise) {
    const std::int64_t found = host::llm_int8_forward(k[x], q, k[y], k.rows(), ep, k.template scratch<std::byte>(), k.workers());
    if (found > q.q.max_outliers) throw outlier_bound_exceeded("", found, q.q.max_outliers, q.q.outlier_threshold);
  } else if (k.quantized(weight)) {
    host::quant_linear_forward(k[x], q, k[y], k.rows(), ep, k.scratch(), k.panels(), k.workers());
  } else {
    host::linear_forward(k[x], k[weight], k[y], k.rows(), k[in], k[out], ep, k.panels(), k.workers());
  }
}
template <class T>
void Linear::backward(const host::OpContext<T>& k) {
  T* dx = k.grad(x);
  if (k.quantized(weight)) {  // frozen matrix: the input's gradient, and the bias's
    if (dx != nullptr)
      host::quant_linear_backward_input(k.grad(y), k.quant(weight), dx, k.first(x), k.rows(), k.scratch(), k.panels(), k.workers());
    host::linear_backward<T>(k.grad(y), nullptr, nullptr, nullptr, false, nullptr, false, k.grad(bias), k.first(bias), k.rows(),
                             k[in], k[out], k.panels(), k.workers());
  } else {
    host::linear_backward(k.grad(y), k[x_saved], k[weight], dx, k.first(x), k.grad(weight), k.first(weight), k.grad(bias),
                          k.first(bias), k.rows(), k[in], k[out], k.panels(), k.workers());
  }
}

}  // namespace headroom::ops
#endif
