#pragma once
// The two communication points of tensor parallelism (Megatron-LM's f and
// g, Shoeybi et al. 2019), as ops the layers emit for a run with
// TensorParallel<N> (layers/tensor_parallel.hpp):
//
//   tp_input   (f) where a replicated activation x enters column-parallel
//              projections (q, k, v; fc; gate and up; the vocabulary-parallel
//              LM head): forward nothing (every rank holds x), backward
//              sums dx over the tensor-parallel ranks in place, once every
//              projection reading x has added its part to it.
//   tp_output  (g) after a row-parallel projection (o_proj, c_proj,
//              down_proj) or the vocabulary-parallel embedding: forward
//              sums the ranks' partial y in place, then adds the bias
//              (which every rank holds whole, so it is added once);
//              backward passes dy through (the same on every rank) and
//              sums it into the bias's gradient.
//
// Both run on the compute lane (the next op needs their bytes at once) and
// call the tensor-parallel communicator (host::OpContext::tensor_comm; on the
// CUDA engine cuda::OpContext::tensor_comm, its collectives enqueued on the
// compute stream, so the next kernel sees the sum without a wait).
#include <cstdint>
#include <string_view>

#include "../host/communicator.hpp"
#include "../host/kernels/pointwise.hpp"
#include "../host/op_context.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/pointwise.cuh"
#include "../cuda/op_context.cuh"
#endif

namespace headroom::ops {

struct TensorParallelInput {
  static constexpr std::string_view name = "tp_input";
  static constexpr InOut x{};  // (N, features), read by column-parallel projections after this op
  static constexpr Dim<0> features{};

  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref input, std::int64_t d) {
    graph::Op op = make<TensorParallelInput>();
    op.set(features, d);
    op.update(x, input);
    op.exchange_bwd = graph::Exchange{.all_reduce = b.act(d), .all_reduce_calls = 1};
    b.emit(op);
    return input;
  }
  template <class T>
  static void forward(const host::OpContext<T>&) {}
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* dx = k.grad(x)) k.tensor_comm->all_reduce_sum(dx, k.rows() * k[features], host::dtype_of<T>);
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>&) {}
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    if (S* dx = k.grad(x)) k.tensor_comm->all_reduce_sum(dx, k.rows() * k[features], cuda::dtype_of<S>, k.stream());
  }
#endif
};

struct TensorParallelOutput {
  static constexpr std::string_view name = "tp_output";
  static constexpr InOut y{};           // (N, features): this rank's partial sum, then the whole
  static constexpr Weight<0> bias{};    // (features), optional, whole on every rank
  static constexpr Dim<0> features{};

  // with_bias declares the bias, parameter "bias" (features), replicated.
  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref partial, bool with_bias, std::int64_t d) {
    return emit_with(b, partial, with_bias ? declare_bias(b, d) : graph::none, d);
  }
  static constexpr int declare_bias(graph::Builder& b, std::int64_t d) { return b.param("bias", d, 1); }
  // b_id: the bias declared before (graph::none: no bias).
  static constexpr graph::Ref emit_with(graph::Builder& b, graph::Ref partial, int b_id, std::int64_t d) {
    graph::Op op = make<TensorParallelOutput>();
    op.set(features, d);
    op.update(y, partial);
    op.exchange_fwd = graph::Exchange{.all_reduce = b.act(d), .all_reduce_calls = 1};
    if (b_id != graph::none) {
      const graph::Param pb = b.params[b_id];
      op.use(bias, b_id, pb.trainable ? pb.grad : graph::none);
      op.flops_fwd = b.tokens_count() * d;
      if (pb.trainable) op.flops_bwd = b.tokens_count() * d;
    }
    b.emit(op);
    return partial;
  }
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    const std::int64_t n = k.rows(), d = k[features];
    T* out = k[y];
    k.tensor_comm->all_reduce_sum(out, n * d, host::dtype_of<T>);
    if (const T* b = k[bias])
      host::parallel_for(n, k.workers(), [&](std::int64_t r, int) {
        for (std::int64_t j = 0; j < d; ++j) out[r * d + j] += b[j];
      });
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    const T* dy = k.grad(y);
    if (T* db = k.grad(bias); db != nullptr && dy != nullptr)
      host::column_sums(k.rows(), k[features], k.workers(), db, k.first(bias), [&](std::int64_t r, std::int64_t j) {
        return dy[r * k[features] + j];
      });
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    const std::int64_t n = k.rows(), d = k[features];
    k.tensor_comm->all_reduce_sum(k[y], n * d, cuda::dtype_of<S>, k.stream());
    if (const S* b = k[bias]) cuda::positions_forward<S>(b, k[y], n, 1, d, k.stream());  // every row += b: a one-position table
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    const S* dy = k.grad(y);
    if (S* db = k.grad(bias); db != nullptr && dy != nullptr) cuda::column_sums<S>(dy, db, k.first(bias), k.rows(), k[features], k.stream());
  }
#endif
};

}  // namespace headroom::ops
