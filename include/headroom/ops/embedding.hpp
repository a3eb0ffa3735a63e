#pragma once
// Token embedding (x[i] = E[token[i]]) and learned positions added in place
// (x[i] += P[position of i]: GPT-2's wpe).
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

struct Embedding {
  static constexpr std::string_view name = "embedding";
  static constexpr In<0> tokens{};           // (N) i32
  static constexpr Out<0> x{};               // (N, D)
  static constexpr Saved<0> tokens_saved{};  // when the table trains
  static constexpr Weight<0> table{};        // (vocab, D)
  static constexpr Dim<0> vocab{};
  static constexpr Dim<1> features{};
  static constexpr Dim<2> ranks{};  // tensor-parallel ranks: the table is this rank's block of vocab rows

  // The table is parameter `w` (vocab, D): with tensor parallelism, rank
  // r's rows [r vocab, (r + 1) vocab) of the whole.
  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref ids, int w, std::int64_t v, std::int64_t d) {
    const graph::Param pw = b.params[w];
    graph::Op op = make<Embedding>();
    op.use(table, w, pw.trainable ? pw.grad : graph::none);
    op.set(vocab, v);
    op.set(features, d);
    op.set(ranks, b.cfg.tp);
    if (b.vocab == 0) b.vocab = v * b.cfg.tp;  // the model's vocabulary, unless its LM head says
    op.input(tokens, ids, false);
    const graph::Ref out = b.activation("x", d);  // (N, D)
    op.output(x, out);
    if (pw.trainable) {
      op.save(tokens_saved, ids);
      op.flops_bwd = b.tokens_count() * d;  // scatter-add of dX rows
    }
    b.emit(op);
    return out;
  }

  template <class T>
  static void forward(const host::OpContext<T>& k) {
    host::embedding_forward(k.template get<std::int32_t>(tokens), k[table], k[x], k.rows(), k[features], k.workers(), first_row(k),
                            k[vocab]);
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* g = k.grad(table))
      host::embedding_backward(k.template get<std::int32_t>(tokens_saved), k.grad(x), g, k.first(table), k.rows(), k[vocab],
                               k[features], k.workers(), first_row(k));
  }
  template <class T>
  static std::int64_t first_row(const host::OpContext<T>& k) {
    return k[ranks] > 1 ? k.tensor_comm->rank() * k[vocab] : 0;
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    cuda::embedding_forward<S>(k.template get<std::int32_t>(tokens), k[table], k[x], k.rows(), k[features], first_row(k), k[vocab],
                               k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    if (S* g = k.grad(table))
      cuda::embedding_backward<S>(k.template get<std::int32_t>(tokens_saved), k.grad(x), g, k.first(table), k.rows(), k[vocab],
                                  k[features], first_row(k), k.stream());
  }
  template <class S>
  static std::int64_t first_row(const cuda::OpContext<S>& k) {
    return k[ranks] > 1 ? k.tensor_comm->rank() * k[vocab] : 0;
  }
#endif
};

struct Positions {
  static constexpr std::string_view name = "positions";
  static constexpr InOut x{};          // (N, D), updated in place
  static constexpr Weight<0> table{};  // (max positions, D)
  static constexpr Dim<0> max_positions{};
  static constexpr Dim<1> features{};

  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref h, int w, std::int64_t positions, std::int64_t d) {
    const graph::Param pw = b.params[w];
    graph::Op op = make<Positions>();
    op.use(table, w, pw.trainable ? pw.grad : graph::none);
    op.set(max_positions, positions);
    op.set(features, d);
    op.update(x, h);
    op.flops_fwd = b.tokens_count() * d;
    if (pw.trainable) op.flops_bwd = b.tokens_count() * d;
    b.emit(op);
    return h;
  }

  // Rows are (batch, seq) from position k.position() on (0 in training; the
  // token's position when decoding).
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    host::positions_forward(k[table] + k.position() * k[features], k[x], k.batch(), k.seq(), k[features], k.workers());
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* g = k.grad(table))
      host::positions_backward(k.grad(x), g, k.first(table), k.batch(), k.seq(), k[max_positions], k[features], k.workers());
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    cuda::positions_forward<S>(k[table] + k.position() * k[features], k[x], k.batch(), k.seq(), k[features], k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    if (S* g = k.grad(table))
      cuda::positions_backward<S>(k.grad(x), g, k.first(table), k.batch(), k.seq(), k[max_positions], k[features], k.stream());
  }
#endif
};

}  // namespace headroom::ops
