#pragma once
// A test op that can sit on any lane: y = 2x (dx = 2 dy), with the thread and
// CUDA stream its last kernel ran on, so tests can see where an engine ran it.
#include <atomic>
#include <thread>

#include <headroom/headroom.hpp>
#include <headroom/host/kernels/pointwise.hpp>
#include <headroom/host/op_context.hpp>
#if HEADROOM_CUDA_KERNELS
#include <headroom/cuda/kernels/pointwise.cuh>
#include <headroom/cuda/op_context.cuh>
#endif

namespace test_lanes {
using namespace headroom;

struct TwiceMath {
  template <class T>
  HEADROOM_HOST_DEVICE static T forward(T x) {
    return T(2) * x;
  }
  template <class T>
  HEADROOM_HOST_DEVICE static T backward(T, T dy) {
    return T(2) * dy;
  }
};

struct Seen {
  static inline std::atomic<std::thread::id> thread{};
  static inline std::atomic<void*> stream{};
};

template <ops::Lane L>
struct TwiceOp {
  static constexpr std::string_view name = "twice";
  static constexpr ops::Lane lane = L;
  static constexpr ops::In<0> x{};
  static constexpr ops::Out<0> y{};
  static constexpr ops::Saved<0> x_saved{};
  static constexpr ops::Dim<0> features{};

  static constexpr Ref emit(graph::Builder& b, Ref in, std::int64_t f) {
    graph::Op op = ops::make<TwiceOp>();
    op.input(x, in);
    op.save(x_saved, in);
    op.set(features, f);
    const Ref out = b.activation("y", f);
    op.output(y, out);
    op.flops_fwd = b.tokens_count() * f;
    op.flops_bwd = b.tokens_count() * f;
    b.emit(op);
    return out;
  }
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    Seen::thread = std::this_thread::get_id();
    host::map_forward<TwiceMath>(k[x], k[y], k.rows() * k[features], 1);
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* dx = k.grad(x)) host::map_backward<TwiceMath>(k[x_saved], k.grad(y), dx, k.first(x), k.rows() * k[features], 1);
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    Seen::stream = static_cast<void*>(k.stream());
    cuda::map_forward<TwiceMath>(k[x], k[y], k.rows() * k[features], k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    if (S* dx = k.grad(x)) cuda::map_backward<TwiceMath>(k[x_saved], k.grad(y), dx, k.first(x), k.rows() * k[features], k.stream());
  }
#endif
};

template <std::int64_t D, ops::Lane L>
struct Twice {
  static constexpr std::string_view kind = "Twice";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;
  using ops = type_list<TwiceOp<L>>;
  static constexpr Ref build(graph::Builder& b, Ref x) { return TwiceOp<L>::emit(b, x, D); }
};

// embedding -> linear -> twice -> linear -> LM head
template <ops::Lane L>
using TwiceModel = Sequential<Embedding<64, 32>, Linear<32, 32>, Twice<32, L>, Linear<32, 32>, LMHeadLoss<64, 32, false>>;

}  // namespace test_lanes
