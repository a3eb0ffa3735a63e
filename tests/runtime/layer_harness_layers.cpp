// testing::test_layer over every built-in layer: f64 gradients of the input
// and of every parameter against central differences, and each step's
// writes and reads confined to the buffers the plan gave it (poisoned arena).
#include <catch2/catch.hpp>

#include "support/layer_check.hpp"

#include <algorithm>
#include <string>

#include <headroom/host/kernels/pointwise.hpp>
#include <headroom/host/op_context.hpp>

namespace {
using namespace headroom;

constexpr std::int64_t D = 8, F = 12;
using Q = Linear<16, 16>;
using KV = Linear<16, 8>;
using O = Linear<16, 16>;
}  // namespace

TEST_CASE("Linear, with and without bias", "[harness]") {
  check_layer<Linear<D, F>>();
  check_layer<Linear<D, F, true>>();
}

TEST_CASE("RMSNorm and LayerNorm", "[harness]") {
  check_layer<RMSNorm<D>>();
  check_layer<LayerNorm<D>>();
}

TEST_CASE("learned positions", "[harness]") { check_layer<LearnedPositions<8, D>>(); }

TEST_CASE("GELU MLP (the activation fused into the projection's epilogue)", "[harness]") {
  check_layer<MLP<D, F, Linear<D, F, true>, Linear<F, D, true>>>();
}

TEST_CASE("SwiGLU MLP", "[harness]") { check_layer<SwiGLU<D, F, Linear<D, F>, Linear<D, F>, Linear<F, D>>>(); }

TEST_CASE("attention: GQA with RoPE, and fused q|k|v", "[harness]") {
  check_layer<Attention<16, 4, 2, Positions::rope, Q, KV, KV, O>>();
  check_layer<FusedAttention<16, 4, Linear<16, 48, true>, Linear<16, 16, true>>>();
}

TEST_CASE("a residual block and a pre-norm transformer block", "[harness]") {
  check_layer<Residual<Sequential<RMSNorm<D>, Linear<D, D>>>>();
  using Block = PreNormBlock<LlamaBlockNames, RMSNorm<16>, Attention<16, 4, 2, Positions::rope, Q, KV, KV, O>, RMSNorm<16>,
                             SwiGLU<16, 24, Linear<16, 24>, Linear<16, 24>, Linear<24, 16>>>;
  check_layer<Block>();
  check_layer<Repeat<2, Block>>();
}

TEST_CASE("attention: per-head q / k norms with a head width apart from D / heads (Qwen3), a sliding window (Mistral)",
          "[harness]") {
  // 4 query heads of 6 (24 values, apart from D 16), 2 KV heads; RMSNorm over each head of q and k before RoPE
  using Normed = Attention<16, 4, 2, Positions::rope, Linear<16, 24>, Linear<16, 12>, Linear<16, 12>, Linear<24, 16>,
                           AttentionOptions{.head_dim = 6}, RMSNorm<6>>;
  check_layer<Normed>();
  // each of 8 positions sees itself and the 2 before it
  check_layer<Attention<16, 4, 2, Positions::rope, Q, KV, KV, O, AttentionOptions{.window = 3}>, Seq<8>>();
}

// The harness fails a layer whose gradient is wrong, and says so first.
namespace {
// y = 2x, with a backward that says dx = 3 dy: every element of the input
// gradient is off by half.
struct WrongGradientMath {
  template <class T>
  static T forward(T x) {
    return T(2) * x;
  }
  template <class T>
  static T backward(T, T dy) {
    return T(3) * dy;
  }
};
struct WrongGradientOp {
  static constexpr std::string_view name = "wrong_gradient";
  static constexpr ops::In<0> x{};
  static constexpr ops::Out<0> y{};
  static constexpr ops::Saved<0> x_saved{};
  static constexpr ops::Dim<0> features{};
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    host::map_forward<WrongGradientMath>(k[x], k[y], k.rows() * k[features], 1);
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* dx = k.grad(x))
      host::map_backward<WrongGradientMath>(k[x_saved], k.grad(y), dx, k.first(x), k.rows() * k[features], 1);
  }
};
template <std::int64_t Dim>
struct WrongGradient {
  static constexpr std::string_view kind = "WrongGradient";
  static constexpr std::int64_t in_features = Dim, out_features = Dim;
  using children = type_list<>;
  using ops = type_list<WrongGradientOp>;
  static constexpr Ref build(graph::Builder& b, Ref in) {
    graph::Op op = headroom::ops::make<WrongGradientOp>();
    op.input(WrongGradientOp::x, in);
    op.save(WrongGradientOp::x_saved, in);
    op.set(WrongGradientOp::features, Dim);
    const Ref out = b.activation("y", Dim);
    op.output(WrongGradientOp::y, out);
    b.emit(op);
    return out;
  }
};
}  // namespace

TEST_CASE("the harness fails a layer whose gradient is wrong, and its summary line names the first failure", "[harness]") {
  const testing::LayerTestResult r = testing::test_layer<WrongGradient<D>>();
  INFO(r.report);
  CHECK_FALSE(r.passed);
  // the summary is the last line: FAILED, then the first failing element (token 0, feature 0 of the input gradient)
  const std::string summary = r.report.substr(r.report.rfind('\n') + 1);
  CHECK(summary.rfind("FAILED: the layer's input gradient (token 0, feature 0): analytic ", 0) == 0);
  CHECK(summary.find("more failures") != std::string::npos);
  CHECK(summary.find("largest relative error") != std::string::npos);
  // every element of the input gradient failed: 2 x 4 tokens x D features, 20 of them listed above the summary
  CHECK(r.elements_checked > 0);
  CHECK(std::count(r.report.begin(), r.report.end(), '\n') == 20);
}

// A user's producer and the op it computes in its epilogue, named by type on
// both sides (ops/epilogue.hpp): the schedule fuses them, the producer's
// forward computes both, the fused op's own forward never runs, and the
// harness's gradients and poisoned arena hold.
namespace {
struct AddOneOp;
int add_one_forward_calls = 0, square_fused_calls = 0;

// y = x * x
struct SquareOp {
  static constexpr std::string_view name = "square";
  static constexpr ops::In<0> x{};
  static constexpr ops::Out<0> y{};
  static constexpr ops::Saved<0> x_saved{};
  static constexpr ops::Dim<0> features{};
  using epilogues = type_list<AddOneOp>;
  template <class T>
  static void forward(const host::OpContext<T>& k);
  template <class T>
  static void backward(const host::OpContext<T>& k) {  // dx = 2 x dy
    const std::int64_t n = k.rows() * k[features];
    if (T* dx = k.grad(x))
      for (std::int64_t i = 0; i < n; ++i) dx[i] = (k.first(x) ? T(0) : dx[i]) + T(2) * k[x_saved][i] * k.grad(y)[i];
  }
};
// z = y + 1
struct AddOneOp {
  static constexpr std::string_view name = "add_one";
  static constexpr ops::In<0> y{};
  static constexpr ops::Out<0> z{};
  static constexpr ops::Dim<0> features{};
  static constexpr ops::EpilogueOf<SquareOp> epilogue{y};
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    ++add_one_forward_calls;
    for (std::int64_t i = 0; i < k.rows() * k[features]; ++i) k[z][i] = k[y][i] + T(1);
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    const std::int64_t n = k.rows() * k[features];
    if (T* dy = k.grad(y))
      for (std::int64_t i = 0; i < n; ++i) dy[i] = (k.first(y) ? T(0) : dy[i]) + k.grad(z)[i];
  }
};
template <class T>
void SquareOp::forward(const host::OpContext<T>& k) {
  const std::int64_t n = k.rows() * k[features];
  for (std::int64_t i = 0; i < n; ++i) k[y][i] = k[x][i] * k[x][i];
  if (const auto* f = k.template fused<AddOneOp>()) {  // the epilogue: z = y + 1, the next op's output
    ++square_fused_calls;
    for (std::int64_t i = 0; i < n; ++i) (*f)[AddOneOp::z][i] = k[y][i] + T(1);
  }
}

template <std::int64_t Dim>
struct SquareAddOne {
  static constexpr std::string_view kind = "SquareAddOne";
  static constexpr std::int64_t in_features = Dim, out_features = Dim;
  using children = type_list<>;
  using ops = type_list<SquareOp, AddOneOp>;
  static constexpr Ref build(graph::Builder& b, Ref in) {
    graph::Op d = headroom::ops::make<SquareOp>();
    d.input(SquareOp::x, in);
    d.save(SquareOp::x_saved, in);
    d.set(SquareOp::features, Dim);
    const Ref y = b.activation("squared", Dim);
    d.output(SquareOp::y, y);
    b.emit(d);
    graph::Op a = headroom::ops::make<AddOneOp>();
    a.input(AddOneOp::y, y);
    a.set(AddOneOp::features, Dim);
    const Ref z = b.activation("plus_one", Dim);
    a.output(AddOneOp::z, z);
    b.emit(a);
    return z;
  }
};
}  // namespace

TEST_CASE("a user's op computed in its user-written producer's epilogue: fused, never run alone, gradients hold", "[harness]") {
  add_one_forward_calls = square_fused_calls = 0;
  check_layer<SquareAddOne<D>>();
  CHECK(square_fused_calls > 0);
  CHECK(add_one_forward_calls == 0);

  // the schedule pairs them: each forward step of the producer fuses the next
  using Run = Train<Sequential<Embedding<64, D>, SquareAddOne<D>, LMHeadLoss<64, D, false>>, Batch<1>, Seq<4>>;
  static constexpr auto sched = schedule<Run>();
  int producers = 0, fused = 0;
  for (const auto& st : sched.steps) {
    if (st.op == "square" && st.kind == EventKind::forward) ++producers;
    if (st.fuse_next) {
      CHECK(st.op == "square");
      ++fused;
    }
  }
  CHECK(producers == 1);
  CHECK(fused == 1);
}

TEST_CASE("the built-in fusions: GELU after a biased linear, SwiGLU after up_proj, in forward and recompute", "[harness]") {
  auto count_fused = [](const auto& sched, std::string_view producer, std::string_view op) {
    int n = 0;
    for (std::size_t g = 0; g + 1 < sched.steps.size(); ++g)
      if (sched.steps[g].fuse_next && sched.steps[g].op == producer && sched.steps[g + 1].op == op &&
          sched.steps[g + 1].fused_into_previous)
        ++n;
    return n;
  };
  // 2 GPT-2 blocks: one GELU after each c_fc (forward), and again in each block's recompute when checkpointed
  constexpr models::GPT2Config gpt2{.vocab = 64, .dim = 16, .layers = 2, .heads = 2, .max_positions = 16};
  static constexpr auto g = schedule<Train<models::GPT2<gpt2>, Batch<1>, Seq<4>>>();
  CHECK(count_fused(g, "linear", "gelu") == 2);
  CHECK(count_fused(g, "linear", "swiglu") == 0);
  static constexpr auto gc = schedule<Train<models::GPT2<gpt2, Apply<Checkpointed<>, EveryBlock>>, Batch<1>, Seq<4>>>();
  CHECK(count_fused(gc, "linear", "gelu") == 4);
  // 2 Llama blocks: SwiGLU after each up_proj
  constexpr models::LlamaConfig llama{.vocab = 64, .dim = 16, .ffn = 32, .layers = 2, .heads = 2, .kv_heads = 1, .max_positions = 16};
  static constexpr auto l = schedule<Train<models::Llama<llama>, Batch<1>, Seq<4>>>();
  CHECK(count_fused(l, "linear", "swiglu") == 2);
  CHECK(count_fused(l, "linear", "gelu") == 0);
}
