#pragma once
// An op: one kind of computation a layer emits into the step graph, with
// the kernels that run it on each engine.
//
// An op type is a struct of static members. The plan needs its name and its
// operands; each engine needs its kernels, found through the type at compile
// time (no engine has a list of ops to edit):
//
//   struct Gelu {
//     static constexpr std::string_view name = "gelu";      // unique among the model's ops
//     static constexpr ops::Lane lane = ops::Lane::compute;  // optional (compute is the default)
//     static constexpr ops::In<0> x{};                       // operands, by name (graph/operands.hpp)
//     static constexpr ops::Out<0> y{};
//     static constexpr ops::Saved<0> x_saved{};
//     static constexpr ops::Dim<0> features{};
//
//     // the plan: emits the op into the graph (called by the layer's build)
//     static constexpr Ref emit(graph::Builder& b, Ref x, std::int64_t features);
//
//     // the host engine (host/op_context.hpp), for T = float and double
//     template <class T> static void forward(const host::OpContext<T>& k);
//     template <class T> static void backward(const host::OpContext<T>& k);
//
//     // the CUDA engine (cuda/op_context.cuh), for S = float, bf16, half;
//     // declared where the CUDA kernels are compiled (HEADROOM_CUDA_KERNELS)
//     template <class S> static void forward(const cuda::OpContext<S>& k);
//     template <class S> static void backward(const cuda::OpContext<S>& k);
//   };
//
// A layer lists the op types it emits itself (`using ops = type_list<Gelu>;`,
// beside `children`); ops_of<Model> (layers/ops_of.hpp) collects them over
// the model, and an engine checks at compile time that each has its kernels.
// An op whose forward also computes the loss and its input's gradient
// (fused_loss, like LMHeadLoss) has `loss(k, grads)` instead of forward and
// backward. An op whose forward cannot run on decode rows alone (attention
// reads every earlier position) has `decode(k)` for host::Generator.
// A producer whose kernels can compute other ops in their epilogue lists
// them (`using epilogues = type_list<Gelu, SwiGLU>;`) and each of those
// names it (`static constexpr EpilogueOf<Linear> epilogue{x};`): ops/epilogue.hpp.
#include <concepts>
#include <string_view>

#include "../core/config.hpp"
#include "../graph/builder.hpp"
#include "../graph/operands.hpp"
#include "epilogue.hpp"

// HEADROOM_CUDA_KERNELS (core/config.hpp): where the CUDA kernels of ops are compiled.

namespace headroom::ops {

template <class O>
concept OpType = requires {
  { O::name } -> std::convertible_to<std::string_view>;
};

template <class O>
constexpr Lane lane_of() {
  if constexpr (requires { O::lane; }) return O::lane;
  else return Lane::compute;
}

// A graph op of type O, to bind operands to and emit.
template <OpType O>
constexpr graph::Op make() {
  graph::Op op{};
  op.kind = O::name;
  op.lane = lane_of<O>();
  if constexpr (requires { typename O::epilogues; }) {
    static_assert(O::epilogues::size <= graph::max_epilogues, "ops::make: a producer lists at most graph::max_epilogues epilogues");
    epilogue_names(typename O::epilogues{}, op.epilogues);
  }
  if constexpr (requires { O::epilogue; }) op.epilogue_input = O::epilogue.input;
  return op;
}

// Whether O runs on an engine whose kernel context is Ctx.
template <class O, class Ctx>
concept RunsOn = requires(const Ctx& k) { O::forward(k); O::backward(k); } || requires(const Ctx& k, bool g) { O::loss(k, g); };

template <class O, class Ctx>
concept Decodes = requires(const Ctx& k) { O::decode(k); };

}  // namespace headroom::ops
