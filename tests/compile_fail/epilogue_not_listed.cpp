// An op that asks to run in the epilogue of a producer that does not list
// it: the producer's kernels would not compute it, so fused into them its
// forward would never run. The run does not compile.
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>

using namespace headroom;

// y = x + 1, naming the linear right before it as its producer
struct AddOneOp {
  static constexpr std::string_view name = "add_one";
  static constexpr ops::In<0> x{};
  static constexpr ops::Out<0> y{};
  static constexpr ops::Dim<0> features{};
  static constexpr ops::EpilogueOf<ops::Linear> epilogue{x};
  template <class T>
  static void forward(const host::OpContext<T>&) {}
  template <class T>
  static void backward(const host::OpContext<T>&) {}
};

template <std::int64_t D>
struct AddOne {
  static constexpr std::string_view kind = "AddOne";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;
  using ops = type_list<AddOneOp>;

  static constexpr Ref build(graph::Builder& b, Ref in) {
    graph::Op op = headroom::ops::make<AddOneOp>();
    op.input(AddOneOp::x, in);
    op.set(AddOneOp::features, D);
    const Ref out = b.activation("y", D);
    op.output(AddOneOp::y, out);
    b.emit(op);
    return out;
  }
};

using Model = Sequential<Embedding<64, 16>, Linear<16, 16>, AddOne<16>, LMHeadLoss<64, 16, false>>;
using R = Train<Model, Batch<1>, Seq<8>>;
host::Trainer<R> t({});

// expect-gcc: Train<Model, ...>: op add_one names op linear as the producer that computes it in its epilogue (EpilogueOf), but that op does not list it
// expect-clang: names op {} as the producer that computes it in its epilogue (EpilogueOf), but that op does not list it
