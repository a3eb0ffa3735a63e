// A user-written layer and layer stack, planned like any preset.
//
// `ScaleShift<D>` is a layer of our own (y = x * g + b, per feature): it
// satisfies the Layer concept by declaring its kind, dims, children and a
// constexpr `build` that declares its parameters and emits its one op. We
// stack it with library layers into our own block, repeat the block, put
// policies on it, and read the plan.
#include <cstdio>

#include <headroom/headroom.hpp>

using namespace headroom;

template <std::int64_t D>
struct ScaleShift {
  static constexpr std::string_view kind = "ScaleShift";
  static constexpr std::int64_t in_features = D, out_features = D;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    const graph::Param g = b.params[b.param("scale", D, 1)];  // g: (D)
    const graph::Param s = b.params[b.param("shift", D, 1)];  // b: (D)
    Op op{};
    op.in[0] = x;
    op.in_grad[0] = true;  // backward writes dX = dY * g
    op.n_in = 1;
    const Ref y = b.activation("y", D);  // y: (N, D)
    op.out[0] = y;
    op.n_out = 1;
    if (g.trainable) {
      op.saved[op.n_saved++] = x;  // dG = sum over tokens of dY * X
      op.grads[op.n_grads++] = g.grad;
    }
    if (s.trainable) op.grads[op.n_grads++] = s.grad;
    op.flops_fwd = 2 * b.tokens_count() * D;
    op.flops_bwd = 4 * b.tokens_count() * D;
    b.emit(op);
    return y;
  }
};
static_assert(Layer<ScaleShift<64>>);

// Our block: ScaleShift, then a residual two-layer MLP with a LoRA'd first projection.
constexpr std::int64_t D = 256, F = 1024;
using MyMlp = MLP<D, F, LoRA<8, Linear<D, F, true>>, Linear<F, D, true>>;
using MyBlock = Sequential<ScaleShift<D>, Residual<MyMlp>>;

// The whole model: embedding, 6 checkpointed blocks, a norm and a tied LM head.
using MyModel = Sequential<Embedding<512, D>, Repeat<6, Checkpointed<MyBlock>>, LayerNorm<D>, LMHeadLoss<512, D, true>>;
using MyRun = Train<MyModel, Batch<8>, Seq<256>, AdamW>;

constexpr auto plan_of_my_run = plan<MyRun>();
static_assert(plan_of_my_run.valid(), "no two live buffers overlap");
static_assert(plan_of_my_run.peak_bytes() <= 256_MiB, "my run fits in 256 MiB");

int main() {
  const auto& p = plan_of_my_run;
  std::printf("custom stack: %lld parameters (%lld trainable)\n", static_cast<long long>(p.parameters()),
              static_cast<long long>(p.trainable_parameters()));
  std::printf("peak %.2f MiB, liveness lower bound %.2f MiB, %zu events, %zu buffers\n", p.peak_bytes() / 1048576.0,
              p.lower_bound() / 1048576.0, p.event_count(), p.buffers.size());
  std::printf("%s", report(p).c_str());
  return 0;
}
