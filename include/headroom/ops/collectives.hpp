#pragma once
// The collectives of data parallelism, as ops on the communication lane.
//
// The builder emits them for a run with DataParallel<N> (graph/sharding.hpp:
// Sharding::reduce_grads, Sharding::gather_params); the engines run them like
// any op, through the communicator they were given (host: a
// host::Communicator, MPI in host/mpi.hpp; CUDA: a cuda::Communicator, NCCL
// in cuda/nccl.cuh, enqueued on the communication stream with the scaling
// and accumulation kernels around it), beside the compute steps after them
// until a step touches their bytes.
//
//   all_reduce_grads      ZeRO 0 and 1: right after the backward that
//                         completes a gradient, it is summed over the ranks
//                         in place and divided by N (the last micro-batch
//                         of a step only: the others accumulate locally).
//   reduce_scatter_grads  ZeRO 2 and 3: the gradient, a bucket of N shards,
//                         is divided by N and reduce-scattered; this rank
//                         keeps the average of its shard (over micro-batches,
//                         the shard it holds is added into its block first).
//   all_gather_params     ZeRO 3: before an event that reads parameters,
//                         every rank's shard is gathered into buffers that
//                         live until that event.
//
// Shards: parameter p's shard is RunConfig::shard(elements) elements (for
// quantized codes and scales: RunConfig::shard_bytes of their bytes); rank r
// owns elements [r * shard, (r + 1) * shard) of the padded whole.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "../graph/collectives.hpp"
#include "../host/communicator.hpp"
#include "../host/op_context.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/pointwise.cuh"
#include "../cuda/op_context.cuh"
#endif

namespace headroom::ops {

namespace detail {
template <class T>
void scale(T* x, std::int64_t n, T s) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= s;
}
// The kernels of a collective op O, for both engines: its forward is
// O::run(k) with the engine's context (a host::Communicator or a
// cuda::Communicator in k.comm), its backward nothing.
template <class O>
struct CollectiveKernels {
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    O::run(k);
  }
  template <class T>
  static void backward(const host::OpContext<T>&) {}
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    O::run(k);
  }
  template <class S>
  static void backward(const cuda::OpContext<S>&) {}
#endif
};

}  // namespace detail

// The operands (name, lane, grad<Q>, elements<Q>) are the builder's
// declaration, graph/collectives.hpp; this adds the kernels.
struct AllReduceGrads : graph::collective::AllReduceGrads, detail::CollectiveKernels<AllReduceGrads> {

  // The collective on either engine's context (the op's forward; it has no backward).
  template <class K>
  static void run(const K& k) {
    if (k.micro_batch() + 1 < k.accumulate()) return;  // gradients accumulate locally until the last micro-batch
    reduce(k, k[grad<0>], k[elements<0>]);
    reduce(k, k[grad<1>], k[elements<1>]);
  }

 private:
  template <class T>
  static void reduce(const host::OpContext<T>& k, T* g, std::int64_t n) {
    if (g == nullptr) return;
    k.comm->all_reduce_sum(g, n, host::dtype_of<T>);
    detail::scale(g, n, T(1) / static_cast<T>(k.comm->size()));
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void reduce(const cuda::OpContext<S>& k, S* g, std::int64_t n) {
    if (g == nullptr) return;
    k.comm->all_reduce_sum(g, n, cuda::dtype_of<S>, k.stream());
    cuda::scale(g, 1.0f / static_cast<float>(k.comm->size()), n, k.stream());
  }
#endif
};

// Operands: bucket<Q>, shard<Q>, elements<Q>, shard_elements<Q> (graph/collectives.hpp).
struct ReduceScatterGrads : graph::collective::ReduceScatterGrads, detail::CollectiveKernels<ReduceScatterGrads> {

  // The collective on either engine's context (the op's forward; it has no backward).
  template <class K>
  static void run(const K& k) {
    reduce(k, k[bucket<0>], k[shard<0>], k[elements<0>], k[shard_elements<0>], k.first(shard<0>));
    reduce(k, k[bucket<1>], k[shard<1>], k[elements<1>], k[shard_elements<1>], k.first(shard<1>));
  }

 private:
  // This rank's block of the bucket: [r s, r s + own_elements) (the last blocks end at the parameter's end).
  static std::int64_t own_elements(std::int64_t n, std::int64_t s, int r) { return std::clamp<std::int64_t>(n - r * s, 0, s); }
  template <class T>
  static void reduce(const host::OpContext<T>& k, T* bucket, T* shard, std::int64_t n, std::int64_t s, bool first) {
    if (bucket == nullptr) return;
    const int r = k.comm->rank();
    detail::scale(bucket, n, T(1) / static_cast<T>(k.comm->size()));
    if (!first) {  // earlier micro-batches: this rank's running sum joins its own block
      T* own = bucket + r * s;
      const std::int64_t m = own_elements(n, s, r);
      for (std::int64_t i = 0; i < m; ++i) own[i] += shard[i];
    }
    k.comm->reduce_scatter_sum(bucket, shard, s, host::dtype_of<T>);
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void reduce(const cuda::OpContext<S>& k, S* bucket, S* shard, std::int64_t n, std::int64_t s, bool first) {
    if (bucket == nullptr) return;
    const int r = k.comm->rank();
    cuda::scale(bucket, 1.0f / static_cast<float>(k.comm->size()), n, k.stream());
    if (!first) cuda::accumulate(shard, bucket + r * s, false, own_elements(n, s, r), k.stream());  // the running sum joins its block
    k.comm->reduce_scatter_sum(bucket, shard, s, cuda::dtype_of<S>, k.stream());
  }
#endif
};

// Operands: param<Q> (the shards), values<Q>, scales, block<Q>, scales_block (graph/collectives.hpp).
struct AllGatherParams : graph::collective::AllGatherParams, detail::CollectiveKernels<AllGatherParams> {

  // The collective on either engine's context (the op's forward; it has no backward).
  template <class K>
  static void run(const K& k) {
    constexpr auto w0 = param<0>;
    const void* src0 = k.quantized(w0) ? static_cast<const void*>(k.quant(w0).codes) : k[w0];
    gather(k, k.template get<std::byte>(values<0>), src0, k[block<0>]);
    gather(k, k.template get<std::byte>(values<1>), k[param<1>], k[block<1>]);
    if (k.quantized(w0)) gather(k, k.template get<std::byte>(scales), k.quant(w0).scales, k[scales_block]);
  }

 private:
  template <class T>
  static void gather(const host::OpContext<T>& k, std::byte* out, const void* shard, std::int64_t block) {
    if (out == nullptr) return;
    std::memcpy(out + k.comm->rank() * block, shard, static_cast<std::size_t>(block));
    k.comm->all_gather(out, block);
  }
#if HEADROOM_CUDA_KERNELS
  // NCCL gathers from the shard itself (no copy into this rank's block first).
  template <class S>
  static void gather(const cuda::OpContext<S>& k, std::byte* out, const void* shard, std::int64_t block) {
    if (out != nullptr) k.comm->all_gather(shard, out, block, k.stream());
  }
#endif
};

}  // namespace headroom::ops
