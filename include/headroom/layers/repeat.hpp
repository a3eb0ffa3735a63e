#pragma once
// Repeat<N, Block>: N instances of one block, built once.
// Sequential<Ls...>: children in order, named by index.
//
// With PipelineParallel<S>, the model's outermost Repeat is what the stages
// divide: stage s builds instances [s N / S, (s + 1) N / S) (named by their
// place in the whole model), receiving its input from stage s - 1 and
// sending its output to stage s + 1 (ops/pipeline.hpp); the model builds
// the layers before the Repeat on the first stage and those after it on the
// last (graph::RunConfig::first_stage, last_stage; Sequential does this for
// its children).
#include "../ops/pipeline.hpp"
#include "layer.hpp"
#include "pipeline_stages.hpp"

namespace headroom {

template <class L>
struct is_offloaded : std::false_type {};
template <class L>
struct is_repeat : std::false_type {};

namespace detail {
template <class L>
struct contains_offloaded;
template <class List>
struct any_offloaded;
template <class... Ts>
struct any_offloaded<type_list<Ts...>> : std::bool_constant<(contains_offloaded<Ts>::value || ...)> {};
template <class L>
struct contains_offloaded : std::bool_constant<is_offloaded<L>::value || any_offloaded<typename L::children>::value> {};

template <class L>
struct contains_repeat;
template <class List>
struct any_repeat;
template <class... Ts>
struct any_repeat<type_list<Ts...>> : std::bool_constant<(contains_repeat<Ts>::value || ...)> {};
template <class L>
struct contains_repeat : std::bool_constant<is_repeat<L>::value || any_repeat<typename L::children>::value> {};

// Offloaded on the block itself (possibly under other policies) is fine; inside it is not.
template <class L>
constexpr bool offload_only_at_top() {
  if constexpr (is_offloaded<L>::value) {
    return !any_offloaded<typename L::children>::value || offload_only_at_top<typename L::inner>();
  } else if constexpr (requires { typename L::inner; }) {
    return offload_only_at_top<typename L::inner>();
  } else {
    return !any_offloaded<typename L::children>::value;
  }
}
}  // namespace detail

template <int N, class Block>
struct Repeat {
  HEADROOM_REQUIRE(N >= 1, "Repeat<N, Block>: N must be at least 1 (it is {})", N);
  HEADROOM_REQUIRE(Block::in_features == Block::out_features,
                   "Repeat<N, Block>: Block must map D features to D features (it maps {} to {})", Block::in_features,
                   Block::out_features);
  static_assert(!detail::any_repeat<type_list<Block>>::value, "Repeat<N, Block>: Block must not contain another Repeat; write Repeat<N * M, Block>");
  static_assert(detail::offload_only_at_top<Block>(),
                "Repeat<N, Block>: Offloaded<L> inside a repeated block must wrap the whole block (Apply<Offloaded<>, EveryBlock>)");
  static constexpr std::string_view kind = "Repeat";
  static constexpr std::int64_t in_features = Block::in_features, out_features = Block::out_features;
  static constexpr int count = N;
  using block = Block;
  using children = type_list<Block>;

  static constexpr Ref build(graph::Builder& b, Ref x) {
    const bool pipelined = b.cfg.pp > 1 && b.current_group() == graph::none;
    const int count = pipelined ? N / b.cfg.pp : N;
    if (pipelined && !b.cfg.first_stage()) x = headroom::ops::PipelineRecv::emit(b, in_features);  // (N, D) from the stage before
    const Ref p = b.begin_group(count, x);
    if (pipelined) b.nodes[b.groups[b.current_group()].node].first_instance = b.cfg.stage * count;
    const Ref y = b.end_group(Block::build(b, p));
    if (pipelined && !b.cfg.last_stage()) headroom::ops::PipelineSend::emit(b, y, out_features);  // to the next stage
    return y;
  }
};
template <int N, class Block>
struct is_repeat<Repeat<N, Block>> : std::true_type {};

namespace detail {
template <class... Ls>
constexpr std::int64_t type_list_front_in() {
  constexpr std::int64_t ins[] = {Ls::in_features...};
  return ins[0];
}
template <class... Ls>
constexpr std::int64_t type_list_back_out() {
  constexpr std::int64_t outs[] = {Ls::out_features...};
  return outs[sizeof...(Ls) - 1];
}
template <class... Ls>
constexpr std::int64_t type_list_in_at(int i) {
  constexpr std::int64_t ins[] = {Ls::in_features...};
  return i >= 0 && i < static_cast<int>(sizeof...(Ls)) ? ins[i] : 0;
}
template <class... Ls>
constexpr std::int64_t type_list_out_at(int i) {
  constexpr std::int64_t outs[] = {Ls::out_features...};
  return i >= 0 && i < static_cast<int>(sizeof...(Ls)) ? outs[i] : 0;
}
}  // namespace detail

// A name for a string template argument: Named<"up", Linear<D, F>>.
template <std::size_t N>
struct child_label {
  char s[N]{};
  constexpr child_label(const char (&a)[N]) {
    for (std::size_t i = 0; i < N; ++i) s[i] = a[i];
  }
  constexpr std::string_view view() const { return std::string_view(s, N - 1); }
};

// Named<"up", L>: L as a child of Sequential under the name "up", so that
// reports and parameter paths read `ffn.up.weight`, not `ffn.1.weight`. It
// is L in every other respect (kind, dims, children, ops, build).
template <child_label Name, class L>
struct Named : L {
  static constexpr std::string_view child_name = Name.view();
};

namespace detail {
template <class L>
constexpr std::string_view child_name() {
  if constexpr (requires { L::child_name; }) return L::child_name;
  else return {};
}
}  // namespace detail

template <class... Ls>
struct Sequential {
  static_assert(sizeof...(Ls) >= 1, "Sequential<Ls...>: needs at least one layer");
  static constexpr std::string_view kind = "Sequential";
  using children = type_list<Ls...>;
  static constexpr std::int64_t in_features = detail::type_list_front_in<Ls...>();
  static constexpr std::int64_t out_features = detail::type_list_back_out<Ls...>();
  // The first i whose out_features differ from the in_features of layer i + 1, or -1.
  static constexpr int first_break() {
    constexpr std::int64_t ins[] = {Ls::in_features...};
    constexpr std::int64_t outs[] = {Ls::out_features...};
    for (std::size_t i = 0; i + 1 < sizeof...(Ls); ++i)
      if (outs[i] != ins[i + 1]) return static_cast<int>(i);
    return -1;
  }
  static constexpr int break_at = first_break();
  HEADROOM_REQUIRE(break_at < 0,
                   "Sequential<Ls...>: the out_features of each layer must equal the in_features of the next (layer {} gives {}, "
                   "layer {} takes {})",
                   break_at, detail::type_list_out_at<Ls...>(break_at), break_at + 1,
                   detail::type_list_in_at<Ls...>(break_at + 1));

  // The child holding the model's Repeat (-1: none).
  static constexpr int repeat_at() {
    constexpr bool has[] = {detail::contains_repeat<Ls>::value...};
    for (std::size_t i = 0; i < sizeof...(Ls); ++i)
      if (has[i]) return static_cast<int>(i);
    return -1;
  }

  // With PipelineParallel<S>, a stage builds its part: the children before
  // the one holding the Repeat on the first stage, those after it on the
  // last, that one on every stage (it builds the stage's blocks); the last
  // stage declares the embedding table a tied LM head reads
  // (layers/pipeline_stages.hpp).
  static constexpr Ref build(graph::Builder& b, Ref x) {
    int i = 0;
    ((x = build_child<Ls>(b, x, i), ++i), ...);
    return x;
  }

 private:
  template <class L>
  static constexpr Ref build_child(graph::Builder& b, Ref x, int i) {
    const int at = repeat_at();
    if (b.cfg.pp > 1 && b.current_group() == graph::none && at >= 0) {
      if (i < at && !b.cfg.first_stage()) {
        if constexpr (requires(graph::Builder& bb) { L::declare(bb); })
          if (b.cfg.last_stage() && pipeline_stages::tied_head<Sequential>())
            detail::child_name<L>().empty() ? b.declare<L>("", i) : b.declare<L>(detail::child_name<L>());
        return x;
      }
      if (i > at && !b.cfg.last_stage()) return x;
    }
    return detail::child_name<L>().empty() ? b.child<L>("", x, i) : b.child<L>(detail::child_name<L>(), x);
  }
};

}  // namespace headroom
