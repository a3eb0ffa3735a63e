// A layer whose op has no kernel for the engine the run targets: the host
// trainer refuses it at compile time, naming the op, the layer and the engine.
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>

using namespace headroom;

// an op that plans but brings no host kernel (no forward / backward for host::OpContext)
struct ScaleOp {
  static constexpr std::string_view name = "scale";
  static constexpr ops::In<0> x{};
  static constexpr ops::Out<0> y{};
};

template <std::int64_t D>
struct Scale {
  static constexpr std::string_view kind = "Scale";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;
  using ops = type_list<ScaleOp>;
  static constexpr Ref build(graph::Builder& b, Ref in) {
    graph::Op op = headroom::ops::make<ScaleOp>();
    op.input(ScaleOp::x, in);
    const Ref out = b.activation("y", D);
    op.output(ScaleOp::y, out);
    b.emit(op);
    return out;
  }
};

using Model = Sequential<Embedding<64, 16>, Scale<16>, LMHeadLoss<64, 16, false>>;
using R = Train<Model, Batch<1>, Seq<8>>;
host::Trainer<R> t({});

// expect-gcc: host::Trainer: the op scale of layer Scale has no kernel for the host engine
// expect-clang: the op {} of layer {} has no kernel for the host engine
