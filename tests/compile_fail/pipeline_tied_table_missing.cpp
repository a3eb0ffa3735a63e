// A model with its own build() whose LM head is tied to its embedding table,
// built without the table on the last pipeline stage: the head has nothing to read.
// expect-gcc: Train<Model, PipelineParallel<2>>: the LM head is tied to the embedding table, which stage 1 does not hold; a model with its own build() declares the table on the last stage
// expect-clang: the LM head is tied to the embedding table, which stage {} does not hold
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr std::int64_t V = 64, D = 16;
using Block = Sequential<LayerNorm<D>, Linear<D, D>>;
struct Net {
  static constexpr std::string_view kind = "Net";
  static constexpr std::int64_t in_features = 0, out_features = 0;
  using children = type_list<Embedding<V, D>, Repeat<2, Block>, LMHeadLoss<V, D, true>>;
  static constexpr Ref build(graph::Builder& b, Ref x) {
    if (b.cfg.first_stage()) x = b.child<Embedding<V, D>>("embed", x);
    x = b.child<Repeat<2, Block>>("blocks", x);
    if (b.cfg.last_stage()) x = b.child<LMHeadLoss<V, D, true>>("head", x);  // no b.declare<Embedding<V, D>>("embed") before it
    return x;
  }
};
using R = Train<Net, Batch<1>, Seq<8>, Accumulate<2>, PipelineParallel<2>>;
constexpr auto p = plan<pipeline_stage<R, 1>>();
