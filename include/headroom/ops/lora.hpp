#ifndef HEADROOM_OPS_LORA_HPP
#define HEADROOM_OPS_LORA_HPP
// The LoRA adapter op (Hu et al. 2021): y += s * B (A x) into the frozen
// base's output, in place; saves x and A x (N, rank) for backward. s is
// alpha / rank, kept as the integer ratio scale_num / scale_den.
//
// With dropout p = dropout_num / dropout_den > 0 (PEFT's lora_dropout), a
// training step uses xd = dropout(x) in place of x on the adapter's path:
//   forward:  xd (N, in) into the forward's scratch; ax = xd A^T; y += s ax B^T
//   backward: dB (+)= s dy^T ax; dax = s dy B; xd regenerated into the
//             backward's scratch, dA (+)= dax^T xd; then t = dax A in the same
//             scratch and dx (+)= dropout'(t) (the same mask, the same 1 / (1 - p))
// The mask is regenerated from the step's key (math/dropout.hpp) each time,
// so x is saved as without dropout and no mask lives across events.
// Evaluation and decoding (no step key) drop nothing.
#include <cstdint>
#include <string_view>

#include "../host/op_context.hpp"
#include "../math/dropout.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/dropout.cuh"
#include "../cuda/op_context.cuh"
#endif

namespace headroom::ops {

struct LoRA {
  static constexpr std::string_view name = "lora";
  static constexpr In<0> x{};            // (N, in)
  static constexpr InOut y{};            // (N, out): the base output
  static constexpr Out<0> ax{};          // (N, rank)
  static constexpr Saved<0> x_saved{};
  static constexpr Saved<1> ax_saved{};
  static constexpr Weight<0> a{};        // (rank, in)
  static constexpr Weight<1> b{};        // (out, rank)
  static constexpr Dim<0> in{};
  static constexpr Dim<1> out{};
  static constexpr Dim<2> rank{};
  static constexpr Dim<3> scale_num{};
  static constexpr Dim<4> scale_den{};
  static constexpr Dim<5> dropout_num{};
  static constexpr Dim<6> dropout_den{};
  static constexpr Dim<7> split_input{};  // 1: x is this tensor-parallel rank's block of columns (a row-parallel base)

  // A and B are adapter parameters a_id (rank, in), b_id (out, rank); `base`
  // is the base projection's output (N, out), which the op adds into.
  static constexpr graph::Ref emit(graph::Builder& bd, graph::Ref input, graph::Ref base, int a_id, int b_id, std::int64_t in_f,
                                   std::int64_t out_f, std::int64_t r, std::int64_t num, std::int64_t den,
                                   std::int64_t drop_num = 0, std::int64_t drop_den = 1, bool split_in = false) {
    const std::int64_t n = bd.tokens_count();
    graph::Op op = make<LoRA>();
    op.use(a, a_id, bd.params[a_id].grad);
    op.use(b, b_id, bd.params[b_id].grad);
    op.set(in, in_f);
    op.set(out, out_f);
    op.set(rank, r);
    op.set(scale_num, num);
    op.set(scale_den, den);
    op.set(dropout_num, drop_num);
    op.set(dropout_den, drop_den);
    op.set(split_input, split_in ? 1 : 0);
    op.input(x, input);
    op.update(y, base);
    const graph::Ref prod = bd.produced("lora_ax", n * r * bd.cfg.act_bytes());  // A x: (N, rank)
    op.output(ax, prod);
    op.save(x_saved, input);
    op.save(ax_saved, prod);
    // d(A x): (N, rank) in the compute type; on CUDA in the storage type (a GEMM operand)
    const std::int64_t grad_bytes = bd.cfg.cuda() ? bd.cfg.act_bytes() : bd.cfg.compute_bytes();
    op.scratch_bwd = n * r * grad_bytes;
    if (drop_num > 0) {
      op.scratch_fwd = n * in_f * bd.cfg.act_bytes();  // xd, the dropped input: (N, in)
      op.scratch_bwd += n * in_f * grad_bytes;         // xd again, then t = dax A: (N, in)
    }
    bd.gemm(n, r, in_f);   // A x;  dx += d(Ax) A
    bd.gemm(n, out_f, r);  // y += B (A x)
    bd.gemm(n, r, out_f);  // d(Ax) = dy B
    bd.gemm(n, in_f, r);
    bd.gemm(out_f, r, n);  // dB = dy^T (A x)
    bd.gemm(r, in_f, n);   // dA = d(Ax)^T x
    op.flops_fwd = 2 * n * r * (in_f + out_f);
    op.flops_bwd = 2 * op.flops_fwd;
    bd.emit(op);
    return base;
  }

  template <class U>
  static U scale(const auto& k) {
    return static_cast<U>(k[scale_num]) / static_cast<U>(k[scale_den]);
  }

  // This event's dropout of x (inactive when p = 0 or outside training).
  static math::Dropout dropout(const auto& k) {
    math::Dropout d;
    if (k[dropout_num] == 0 || !k.training()) return d;
    d.stream = math::dropout_stream(math::dropout_step_key(k.seed, k.step, k.data_rank), k.micro, k.node, k.instance);
    d.threshold = math::dropout_threshold(k[dropout_num], k[dropout_den]);
    d.scale = static_cast<double>(k[dropout_den]) / static_cast<double>(k[dropout_den] - k[dropout_num]);
    d.width = k[in];
    if (k[split_input] != 0) {  // x holds columns [rank * in, (rank + 1) * in) of the whole input
      d.col0 = static_cast<std::int64_t>(k.tensor_rank) * k[in];
      d.width = k[in] * k.tensor_ranks;
    }
    return d;
  }

  // ---- host ----------------------------------------------------------------------------------------------
  template <class T>
  static void forward(const host::OpContext<T>& k);
  template <class T>
  static void backward(const host::OpContext<T>& k);

#if HEADROOM_CUDA_KERNELS
  // This event's dropout site (the mask's step is read on the device)
  static cuda::DropoutSite site(const auto& k) {
    return cuda::DropoutSite{dropout(k), k.seed, k.data_rank, k.micro, k.node, k.instance};
  }
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    using cuda::Trans;
    const std::int64_t n = k.rows();
    const S* xa = k[x];
    if (const cuda::DropoutSite ds = site(k); ds.mask.active()) {  // xd (N, in) = dropout(x) in scratch
      cuda::dropout_rows<S>(k[x], k.scratch(), n, k[in], ds, &k.control()->step, k.stream());
      xa = k.scratch();
    }
    // ax (N, r) = xa A^T;  y (N, out) += s ax B^T, straight into the base output
    k.blas().template gemm<S>(Trans::no, Trans::yes, n, k[rank], k[in], 1.0f, xa, k[in], k[a], k[in], 0.0f, k[ax], k[rank],
                              k.stream());
    if (k[y] != nullptr)
      k.blas().template gemm<S>(Trans::no, Trans::yes, n, k[out], k[rank], scale<float>(k), k[ax], k[rank], k[b], k[rank], 1.0f, k[y],
                                k[out], k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    using cuda::Trans;
    const std::int64_t n = k.rows(), r = k[rank];
    const float s = scale<float>(k);
    const S* dy = k.grad(y);
    S* dax = k.template scratch<S>();  // (N, r)
    S* dropped = dax + n * r;          // with dropout: (N, in), xd and then dax A
    const cuda::DropoutSite ds = site(k);
    const bool drop = ds.mask.active();
    if (S* db = k.grad(b))  // dB (out, r) = s dy^T ax
      k.blas().template gemm<S>(Trans::yes, Trans::no, k[out], r, n, s, dy, k[out], k[ax_saved], r, k.first(b) ? 0.0f : 1.0f, db, r,
                                k.stream());
    k.blas().template gemm<S>(Trans::no, Trans::no, n, r, k[out], s, dy, k[out], k[b], r, 0.0f, dax, r, k.stream());
    if (S* da = k.grad(a)) {  // dA (r, in) = dax^T xa
      const S* xa = k[x_saved];
      if (drop) {
        cuda::dropout_rows<S>(k[x_saved], dropped, n, k[in], ds, &k.control()->step, k.stream());
        xa = dropped;
      }
      k.blas().template gemm<S>(Trans::yes, Trans::no, r, k[in], n, 1.0f, dax, r, xa, k[in], k.first(a) ? 0.0f : 1.0f, da, k[in],
                                k.stream());
    }
    if (S* dx = k.grad(x)) {
      if (!drop) {  // dx (N, in) += dax A
        k.blas().template gemm<S>(Trans::no, Trans::no, n, k[in], r, 1.0f, dax, r, k[a], k[in], k.first(x) ? 0.0f : 1.0f, dx, k[in],
                                  k.stream());
      } else {  // t = dax A, then dx (+)= dropout'(t)
        k.blas().template gemm<S>(Trans::no, Trans::no, n, k[in], r, 1.0f, dax, r, k[a], k[in], 0.0f, dropped, k[in], k.stream());
        cuda::dropout_backward<S>(dropped, dx, k.first(x), n, k[in], ds, &k.control()->step, k.stream());
      }
    }
  }
#endif
};

}  // namespace headroom::ops
#endif  // HEADROOM_OPS_LORA_HPP

// ---- the host kernels --------------------------------------------------------------------------------------
// Compiled where the host engine is (train/host/trainer.hpp includes
// ops/host_kernels.hpp, which sets HEADROOM_HOST_KERNELS and includes this
// header again): they need Eigen, which a plan alone does not.
#if defined(HEADROOM_HOST_KERNELS) && !defined(HEADROOM_OPS_LORA_HOST_KERNELS)
#define HEADROOM_OPS_LORA_HOST_KERNELS
#include "../host/kernels/linear.hpp"

namespace headroom::ops {

// ---- host ----------------------------------------------------------------------------------------------
template <class T>
void LoRA::forward(const host::OpContext<T>& k) {
  using C = typename host::OpContext<T>::compute;
  host::lora_forward(k[x], k[a], k[b], k[ax], k[y], scale<C>(k), k.rows(), k[in], k[out], k[rank], k.panels(), k.workers(),
                     dropout(k), k.scratch());
}
template <class T>
void LoRA::backward(const host::OpContext<T>& k) {
  using C = typename host::OpContext<T>::compute;
  // scratch: dax (N, rank) in C, then dropout's (N, in) in C
  std::byte* dropped = k.template scratch<std::byte>() + k.rows() * k[rank] * static_cast<std::int64_t>(sizeof(C));
  host::lora_backward(k.grad(y), k[x_saved], k[ax_saved], k[a], k[b], k.scratch(), k.grad(a), k.first(a), k.grad(b), k.first(b),
                      k.grad(x), k.first(x), scale<C>(k), k.rows(), k[in], k[out], k[rank], k.panels(), k.workers(), dropout(k),
                      static_cast<void*>(dropped));
}

}  // namespace headroom::ops
#endif
