#pragma once
// The collectives of data parallelism, as ops on the communication lane.
//
// The builder emits them for a run with DataParallel<N> (plan/graph.hpp:
// Builder::reduce_grads, Builder::gather_params); the engines run them like
// any op, through the communicator they were given (host: a
// host::Communicator, MPI in host/mpi.hpp), beside the compute steps after
// them until a step touches their bytes.
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

#include "../host/communicator.hpp"
#include "../host/op_context.hpp"
#include "op.hpp"

namespace headroom::ops {

namespace detail {
template <class T>
constexpr DType dtype_of() {
  return sizeof(T) == 8 ? DType::F64 : DType::F32;
}
template <class T>
void scale(T* x, std::int64_t n, T s) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= s;
}
}  // namespace detail

struct AllReduceGrads {
  static constexpr std::string_view name = graph::collective::all_reduce_grads;
  static constexpr Lane lane = Lane::communication;
  static constexpr In<0> grad0{};
  static constexpr In<1> grad1{};
  static constexpr Dim<0> elements0{};
  static constexpr Dim<2> elements1{};

  template <class T>
  static void forward(const host::OpContext<T>& k) {
    if (k.micro_batch() + 1 < k.accumulate()) return;  // gradients accumulate locally until the last micro-batch
    const T inv = T(1) / static_cast<T>(k.comm->size());
    reduce(k, k[grad0], k[elements0], inv);
    reduce(k, k[grad1], k[elements1], inv);
  }
  template <class T>
  static void backward(const host::OpContext<T>&) {}

 private:
  template <class T>
  static void reduce(const host::OpContext<T>& k, T* g, std::int64_t n, T inv) {
    if (g == nullptr) return;
    k.comm->all_reduce_sum(g, n, detail::dtype_of<T>());
    detail::scale(g, n, inv);
  }
};

struct ReduceScatterGrads {
  static constexpr std::string_view name = graph::collective::reduce_scatter_grads;
  static constexpr Lane lane = Lane::communication;
  static constexpr In<0> bucket0{};
  static constexpr In<1> bucket1{};
  static constexpr Out<0> shard0{};
  static constexpr Out<1> shard1{};
  static constexpr Dim<0> elements0{};
  static constexpr Dim<1> shard_elements0{};
  static constexpr Dim<2> elements1{};
  static constexpr Dim<3> shard_elements1{};

  template <class T>
  static void forward(const host::OpContext<T>& k) {
    reduce(k, k[bucket0], k[shard0], k[elements0], k[shard_elements0], k.first(shard0));
    reduce(k, k[bucket1], k[shard1], k[elements1], k[shard_elements1], k.first(shard1));
  }
  template <class T>
  static void backward(const host::OpContext<T>&) {}

 private:
  template <class T>
  static void reduce(const host::OpContext<T>& k, T* bucket, T* shard, std::int64_t n, std::int64_t s, bool first) {
    if (bucket == nullptr) return;
    const int r = k.comm->rank();
    detail::scale(bucket, n, T(1) / static_cast<T>(k.comm->size()));
    if (!first) {  // earlier micro-batches: this rank's running sum joins its own block
      T* own = bucket + r * s;
      const std::int64_t m = std::clamp<std::int64_t>(n - r * s, 0, s);
      for (std::int64_t i = 0; i < m; ++i) own[i] += shard[i];
    }
    k.comm->reduce_scatter_sum(bucket, shard, s, detail::dtype_of<T>());
  }
};

struct AllGatherParams {
  static constexpr std::string_view name = graph::collective::all_gather_params;
  static constexpr Lane lane = Lane::communication;
  static constexpr Out<0> values0{};  // parameter 0's values (or codes), gathered
  static constexpr Out<1> values1{};
  static constexpr Out<2> scales0{};  // a quantized parameter 0's scales, gathered
  static constexpr Weight<0> w0{};
  static constexpr Weight<1> w1{};
  static constexpr Dim<0> block0{};  // bytes of one rank's block of each output
  static constexpr Dim<1> block1{};
  static constexpr Dim<2> block_scales0{};

  template <class T>
  static void forward(const host::OpContext<T>& k) {
    const void* src0 = k.quantized(w0) ? static_cast<const void*>(k.quant(w0).codes) : k[w0];
    gather(k, k.template get<std::byte>(values0), src0, k[block0]);
    gather(k, k.template get<std::byte>(values1), k[w1], k[block1]);
    if (k.quantized(w0)) gather(k, k.template get<std::byte>(scales0), k.quant(w0).scales, k[block_scales0]);
  }
  template <class T>
  static void backward(const host::OpContext<T>&) {}

 private:
  template <class T>
  static void gather(const host::OpContext<T>& k, std::byte* out, const void* shard, std::int64_t block) {
    if (out == nullptr) return;
    std::memcpy(out + k.comm->rank() * block, shard, static_cast<std::size_t>(block));
    k.comm->all_gather(out, block);
  }
};

}  // namespace headroom::ops
