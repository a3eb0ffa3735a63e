#pragma once
// The Layer concept: what every layer, policy, block and model declares.
//
// A layer is a plain struct with static members only:
//
//   static constexpr std::string_view kind;        // "Linear", "MyBlock"
//   static constexpr std::int64_t in_features;     // features per token it reads (0: token ids)
//   static constexpr std::int64_t out_features;    // features per token it writes
//   using children = type_list<...>;               // the layers it is made of (may be empty)
//   using ops = type_list<...>;                    // optional: the op types it emits itself
//   static constexpr graph::Ref build(graph::Builder& b, graph::Ref x);
//
// `build` is the layer's whole memory contract, evaluated at compile time:
//   requires: x is a tensor [tokens, in_features] already produced;
//   ensures : every parameter is declared (b.param / b.matrix / b.adapter);
//             every op the forward runs is emitted (b.emit) in forward order,
//             naming its inputs, outputs, what its backward reads again
//             (saved), the gradients it writes, its scratch and its FLOPs;
//             the returned tensor is [tokens, out_features].
// The builder derives backward, recompute, offload and the update from this.
// A composite builds its children with b.child<Child>("name", x).
// The execution half is the ops': a layer lists the op types it emits itself
// in `using ops = type_list<...>` (optional; ops/op.hpp), and each op type
// carries its kernels for both engines, which run exactly the ops emitted.
#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "../core/diagnostic.hpp"
#include "../core/type_list.hpp"
#include "../graph/builder.hpp"

namespace headroom {

template <class L>
concept Layer = requires(graph::Builder& b, graph::Ref x) {
  { L::kind } -> std::convertible_to<std::string_view>;
  { L::in_features } -> std::convertible_to<std::int64_t>;
  { L::out_features } -> std::convertible_to<std::int64_t>;
  typename L::children;
  { L::build(b, x) } -> std::same_as<graph::Ref>;
};

using graph::Op;
using graph::Ref;

// A hole in a recipe: "the layer the model puts here" (Checkpointed<>).
struct Hole {
  static constexpr std::string_view kind = "Hole";
  static constexpr std::int64_t in_features = 0, out_features = 0;
  using children = type_list<>;
  static constexpr Ref build(graph::Builder&, Ref x) { return x; }
};

}  // namespace headroom
