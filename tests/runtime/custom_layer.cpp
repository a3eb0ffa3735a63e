// A layer written by a user: a plain struct that satisfies Layer, used inside
// Sequential and Repeat and wrapped in policies, plans like a library layer
// and shows up in the plan (nodes, parameters, buffers, events).
#include <catch2/catch.hpp>

#include <headroom/headroom.hpp>

#include <string_view>

namespace {

using namespace headroom;
using std::int64_t;

// y = x * scale + shift, per feature. Backward needs x again (dscale =
// sum over tokens of dy * x), dshift = sum of dy, dx = dy * scale.
template <int64_t D>
struct ScaleShift {
  static constexpr std::string_view kind = "ScaleShift";
  static constexpr int64_t in_features = D, out_features = D;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref x) {          // x: (N, D)
    const graph::Param scale = b.params[b.param("scale", D, 1)];  // scale: (D)
    const graph::Param shift = b.params[b.param("shift", D, 1)];  // shift: (D)
    Op op{};
    op.in[0] = x;
    op.in_grad[0] = true;
    op.n_in = 1;
    const Ref y = b.activation("y", D);  // y: (N, D)
    op.out[0] = y;
    op.n_out = 1;
    op.saved[op.n_saved++] = x;
    if (scale.trainable) op.grads[op.n_grads++] = scale.grad;
    if (shift.trainable) op.grads[op.n_grads++] = shift.grad;
    op.flops_fwd = 2 * b.tokens_count() * D;
    op.flops_bwd = 4 * b.tokens_count() * D;
    b.emit(op);
    return y;
  }
};
static_assert(Layer<ScaleShift<64>>);

constexpr int64_t V = 256, D = 64;
using Block = Sequential<ScaleShift<D>, Linear<D, D>>;

// The user's model: embedding, 3 custom blocks, LM head + loss. It states its
// context length, as the presets do (a model without max_seq is unchecked:
// see the bare Sequential below).
struct Net : Sequential<Embedding<V, D>, Repeat<3, Block>, LMHeadLoss<V, D, false>> {
  static constexpr int64_t max_seq = 512;
};
struct CkptNet : Sequential<Embedding<V, D>, Repeat<3, Checkpointed<Block>>, LMHeadLoss<V, D, false>> {
  static constexpr int64_t max_seq = 512;
};
static_assert(Layer<Net>);
using NetRun = Train<Net, Batch<2>, Seq<32>, AdamW>;  // N = 64 tokens
using CkptRun = Train<CkptNet, Batch<2>, Seq<32>, AdamW>;

int node_of_kind(const auto& p, std::string_view kind) {
  for (int n = 0; n < static_cast<int>(p.nodes.size()); ++n)
    if (p.nodes[n].kind == kind) return n;
  return -1;
}

}  // namespace

TEST_CASE("a custom layer inside Sequential and Repeat plans and appears in the plan", "[custom]") {
  static constexpr auto p = plan<NetRun>();
  REQUIRE(p.valid());
  CHECK(p.recheck());
  CHECK(p.peak_bytes() >= p.lower_bound());
  CHECK(p.peak_bytes() * 100 <= p.lower_bound() * 105);

  // parameters: embedding 256 x 64, 3 x (scale 64 + shift 64 + Linear 64 x 64), LM head 256 x 64
  CHECK(p.parameters() == V * D + 3 * (D + D + D * D) + V * D);
  CHECK(p.trainable_parameters() == p.parameters());
  int scale = -1, shift = -1;
  for (int i = 0; i < static_cast<int>(p.params.size()); ++i) {
    if (p.params[i].name == "scale") scale = i;
    if (p.params[i].name == "shift") shift = i;
  }
  REQUIRE(scale >= 0);
  REQUIRE(shift >= 0);
  CHECK(p.params[scale].rows == D);
  CHECK(p.params[scale].instances == 3);
  CHECK(p.params[shift].instances == 3);

  // the node: a ScaleShift, position 0 of the block, under the Repeat of 3
  const int ss = node_of_kind(p, "ScaleShift");
  REQUIRE(ss > 0);
  CHECK(p.params[scale].node == ss);
  CHECK(p.nodes[ss].index == 0);
  const int rep = p.nodes[ss].parent;
  CHECK(p.nodes[rep].kind == "Repeat");
  CHECK(p.nodes[rep].repeat == 3);
  CHECK(p.nodes[rep].index == 1);  // second layer of the outer Sequential

  // one forward and one backward event per instance
  int fwd = 0, bwd = 0;
  for (const auto& e : p.events) {
    if (e.node != ss) continue;
    fwd += e.kind == EventKind::forward;
    bwd += e.kind == EventKind::backward;
  }
  CHECK(fwd == 3);
  CHECK(bwd == 3);

  // its buffers: per instance 2 weights (64 f32 = 256 B each), 2 grads, 2
  // AdamW states (512 B each), its output y
  int64_t weights = 0, grads = 0, state = 0;
  for (const auto& b : p.buffers) {
    if (b.node != ss) continue;
    if (b.role == Role::weights) weights += b.size;
    if (b.role == Role::grads) grads += b.size;
    if (b.role == Role::optimizer_state) state += b.size;
  }
  CHECK(weights == 3 * 2 * 256);
  CHECK(grads == 3 * 2 * 256);
  CHECK(state == 3 * 2 * 512);

  // saved activations (N = 64, f32: 64 x 64 x 4 = 16,384 B each): every
  // ScaleShift saves its input (the embedding output, then each Linear's
  // output but the last), every Linear its input (the ScaleShift output); the
  // fused LM head + loss saves nothing
  CHECK(p.bytes(Role::saved_activation) == 3 * 16'384 + 3 * 16'384);
  // FLOPs: 3 x (2ND + 2ND^2) forward for the blocks, 2NDV for the LM head
  CHECK(p.flops_fwd == 3 * (2 * 64 * D + 2 * 64 * D * D) + 2 * 64 * D * V);
}

TEST_CASE("a custom block under Checkpointed recomputes the custom op", "[custom][checkpointed]") {
  static constexpr auto p = plan<CkptRun>();
  static constexpr auto plain = plan<NetRun>();
  REQUIRE(p.valid());
  const int ss = node_of_kind(p, "ScaleShift");
  REQUIRE(ss > 0);
  int recompute = 0;
  for (const auto& e : p.events) recompute += e.kind == EventKind::recompute && e.node == ss;
  CHECK(recompute == 3);
  // the recomputed ScaleShift output, one per instance, role recompute
  int64_t rec = 0;
  for (const auto& b : p.buffers)
    if (b.node == ss && b.role == Role::recompute) rec += b.size;
  CHECK(rec == 3 * 16'384);
  // saved: only the 3 block inputs; the recompute is the ScaleShift op alone
  // (the block's last op, the Linear, is not re-run: nothing reads its output
  // in backward)
  CHECK(p.bytes(Role::saved_activation) == 3 * 16'384);
  CHECK(p.flops_recompute == 3 * (2 * 64 * D));
  CHECK(p.flops_fwd == plain.flops_fwd);
}

// A model without max_seq (here a bare Sequential) is a valid Train model,
// with no context-length check.
TEST_CASE("a bare Sequential of custom layers is a Train model", "[custom]") {
  using Bare = Sequential<Embedding<V, D>, Repeat<3, Block>, LMHeadLoss<V, D, false>>;
  static constexpr auto p = plan<Train<Bare, Batch<2>, Seq<32>, AdamW>>();
  static constexpr auto q = plan<NetRun>();
  CHECK(p.valid());
  CHECK(p.parameters() == q.parameters());
  CHECK(p.peak_bytes() == q.peak_bytes());
}

namespace {
// Odd widths: nothing is a multiple of 256 bytes any more.
constexpr int64_t D5 = 125;
struct OddNet : Sequential<Embedding<V, D5>, Repeat<2, Sequential<ScaleShift<D5>, Linear<D5, D5>>>, LMHeadLoss<V, D5, false>> {
  static constexpr int64_t max_seq = 512;
};
}  // namespace

TEST_CASE("a custom layer with odd widths: per-buffer rounding and 8-bit AdamW blocks", "[custom][rounding]") {
  static constexpr auto p = plan<Train<OddNet, Batch<1>, Seq<25>, AdamW8bit>>();  // N = 25 tokens
  REQUIRE(p.valid());
  CHECK(p.recheck());
  CHECK(p.peak_bytes() * 100 <= p.lower_bound() * 105);
  // tensors: embedding and LM head 256 x 125 = 32,000; scale, shift 125; Linear 125 x 125 = 15,625
  CHECK(p.parameters() == 2 * 32'000 + 2 * (125 + 125 + 15'625));
  // f32 weights, each rounded up to 256: 128,000 (exact); 500 -> 512; 62,500 -> 62,720
  CHECK(p.bytes(Role::weights) == 2 * 128'000 + 2 * (512 + 512 + 62'720));
  CHECK(p.bytes(Role::grads) == 2 * 128'000 + 2 * (512 + 512 + 62'720));
  // AdamW8bit, per tensor 2 (n + ceil(n / 256) * 4), rounded up to 256:
  //   n = 32,000: 125 blocks -> 65,000 -> 65,024
  //   n =    125:   1 block  ->    258 ->    512
  //   n = 15,625:  62 blocks -> 31,746 -> 32,000
  // plus the two 256-entry f32 dynamic maps (signed for m, unsigned for v), once
  CHECK(p.bytes(Role::optimizer_state) == 2 * 65'024 + 2 * (512 + 512 + 32'000) + 2'048);
  // saved: per instance the ScaleShift input and the Linear input, (25, 125) f32
  // = 12,500 -> 12,544 B each
  CHECK(p.bytes(Role::saved_activation) == 2 * (12'544 + 12'544));
  // ids and targets 25 x 4 = 100 -> 256 B each, the loss 4 -> 256
  CHECK(p.bytes(Role::batch_io) == 3 * 256);
}
