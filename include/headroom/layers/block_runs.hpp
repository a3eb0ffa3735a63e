#pragma once
// BlockRuns<N, BlockAt>: a model's N blocks, block i of type BlockAt<i>.
//
// Where every block is one type (no block selector among the model's
// Applys) this is Repeat<N, Block> under the model's name for its blocks,
// exactly. Where a selector makes them differ (Apply<Checkpointed<>,
// Blocks<0, 2>>), each maximal run of consecutive blocks of one type is one
// Repeat, built once, and the runs share the name: run r's instance j is
// block start_r + j ("layers.5" whichever run holds it), so parameter paths,
// Hugging Face names and PEFT modules are those of the uniform model.
//
//   using blocks = BlockRuns<C.layers, block_at>;
//   using children = concat_t<type_list<Embedding<...>>, typename blocks::repeats, type_list<RMSNorm<D>, ...>>;
//   x = blocks::build(b, "layers", x);
#include <type_traits>

#include "layer.hpp"
#include "ops_of.hpp"
#include "repeat.hpp"

namespace headroom {

// Blocks [Start, Start + Count) of one type.
template <int Start, int Count, class Block>
struct BlockRun {
  static constexpr int start = Start, count = Count;
  using block = Block;
  using repeat = Repeat<Count, Block>;
};

namespace detail {
// The runs of blocks [Start, N): the current run began at Start, I is the
// next block to look at, Done the runs before it.
template <int N, template <int> class At, int Start, int I, class... Done>
struct block_runs {
  using type = typename std::conditional_t<
      (I == N), std::type_identity<type_list<Done..., BlockRun<Start, I - Start, At<Start>>>>,
      std::conditional_t<(I < N) && std::is_same_v<At<(I < N ? I : Start)>, At<Start>>,
                         block_runs<N, At, Start, (I < N ? I + 1 : N), Done...>,
                         block_runs<N, At, (I < N ? I : Start), (I < N ? I + 1 : N), Done..., BlockRun<Start, I - Start, At<Start>>>>>::type;
};

template <class Runs>
struct run_repeats;
template <class... Rs>
struct run_repeats<type_list<Rs...>> {
  using type = type_list<typename Rs::repeat...>;
};
}  // namespace detail

// One type_list of the lists' elements, in order.
template <class... Lists>
using concat_t = typename detail::concat<Lists...>::type;  // (layers/ops_of.hpp)

template <int N, template <int> class BlockAt, bool Uniform = false>
struct BlockRuns {
  // Uniform: the caller knows every block is BlockAt<0> (no selector): one run, no search
  using runs = std::conditional_t<Uniform, type_list<BlockRun<0, N, BlockAt<0>>>, typename detail::block_runs<N, BlockAt, 0, 1>::type>;
  using repeats = typename detail::run_repeats<runs>::type;  // the model's children for its blocks
  static constexpr int run_count = [] {
    int n = 0;
    [&]<class... Rs>(type_list<Rs...>) { n = sizeof...(Rs); }(runs{});
    return n;
  }();

  // Builds the blocks under nodes named `name`; returns the last block's output.
  static constexpr Ref build(graph::Builder& b, std::string_view name, Ref x) {
    if constexpr (run_count == 1) {
      return b.child<Repeat<N, BlockAt<0>>>(name, x);
    } else {
      return [&]<class... Rs>(type_list<Rs...>) {
        ((x = build_run<Rs>(b, name, x)), ...);
        return x;
      }(runs{});
    }
  }

 private:
  template <class R>
  static constexpr Ref build_run(graph::Builder& b, std::string_view name, Ref x) {
    const int node = b.open(name, R::repeat::kind);
    const Ref y = R::repeat::build(b, x);
    b.nodes[node].first_instance = R::start;  // its instances are blocks start, start + 1, ...
    b.close();
    return y;
  }
};

}  // namespace headroom
