// What the policies and run options do to a step's timeline and memory:
//   Checkpointed  lowers the peak; recompute re-runs the blocks' forward
//   Offloaded     moves saved activations to the offload tier, lowers the
//                 device peak, and fetches a block's copy one block ahead
//   UpdateInBackward  frees grads inside backward: peak lower or equal
//   Accumulate<2> grads live the whole step
//   Repeat<N>     block parameters and activations scale with N
// Plans are computed at run time (detail::expand, the same constexpr code).
#include <catch2/catch.hpp>

#include <headroom/headroom.hpp>

#include <string_view>

namespace {

using namespace headroom;
using std::int64_t;

template <class R>
detail::Expanded expand_at_run_time() {
  static detail::Expanded (*volatile fn)() = &detail::expand<R, true>;
  return fn();
}

// the planner's own check; then the check run again over the final arrays
bool plan_valid(const detail::Expanded& x) { return x.valid && x.recheck(); }

int64_t peak(const detail::Expanded& x, Tier t = Tier::device) { return x.peak[static_cast<int>(t)]; }

int64_t role_bytes(const detail::Expanded& x, Role r, Tier t = Tier::device) {
  int64_t s = 0;
  for (const Buffer& b : x.buffers)
    if (b.role == r && b.tier == t) s += b.size;
  return s;
}
int64_t role_bytes_at(const detail::Expanded& x, Role r, int e) {
  int64_t s = 0;
  for (const Buffer& b : x.buffers)
    if (b.role == r && b.tier == Tier::device && b.alive_at(e)) s += b.size;
  return s;
}
int event_of_kind(const detail::Expanded& x, EventKind k) {
  for (int e = 0; e < static_cast<int>(x.events.size()); ++e)
    if (x.events[e].kind == k) return e;
  return -1;
}
int count_events(const detail::Expanded& x, EventKind k) {
  int n = 0;
  for (const EventInfo& e : x.events) n += e.kind == k;
  return n;
}
int node_named(const detail::Expanded& x, std::string_view name) {
  for (int n = 0; n < static_cast<int>(x.nodes.size()); ++n)
    if (x.nodes[n].name == name) return n;
  return -1;
}
bool below(const detail::Expanded& x, int node, int ancestor) {
  for (int n = node; n >= 0; n = x.nodes[n].parent)
    if (n == ancestor) return true;
  return false;
}

using All7 = On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>;
using QLoRA = Quantized<NF4, LoRA<16>>;

// tiny_llama at 2,048 tokens: activations (~134 MB saved) outweigh the
// parameters, grads and AdamW state (~52 MB)
template <class... Mods>
using TinyBig = Train<models::Llama<models::tiny_llama, Mods...>, Batch<8>, Seq<256>, AdamW>;

}  // namespace

TEST_CASE("Checkpointed blocks: lower peak, saved = block inputs, recompute = the blocks' forward", "[semantics][checkpointed]") {
  const auto plain = expand_at_run_time<TinyBig<>>();
  const auto ckpt = expand_at_run_time<TinyBig<Apply<Checkpointed<>, EveryBlock>>>();
  REQUIRE(plan_valid(plain));
  REQUIRE(plan_valid(ckpt));
  CHECK(peak(ckpt) < peak(plain));
  CHECK(ckpt.lower_bound[0] < plain.lower_bound[0]);

  // N = 2,048 tokens, f32: the 4 block inputs + the final norm's input and rstd
  const int64_t N = 8 * 256, xD = N * 256 * 4;
  CHECK(role_bytes(ckpt, Role::saved_activation) == 4 * xD + xD + N * 4);
  CHECK(role_bytes(plain, Role::recompute) == 0);
  CHECK(role_bytes(ckpt, Role::recompute) > 0);

  // Same forward and backward work; recompute re-runs the blocks' forward:
  // all of it, except the ops after the last tensor the block's backward
  // reads (down_proj's GEMM and the second residual add, whose outputs only
  // the next block reads). Per block (cost model of the layer headers):
  const int64_t D = 256, F = 768, KVhd = 128, B = 8, T = 256, H = 4, hd = 64;
  const int64_t block = 2 * (4 * N * D)                      // 2 RMSNorms
                        + 2 * (2 * N * D * D)                // q_proj, o_proj
                        + 2 * (2 * N * D * KVhd)             // k_proj, v_proj
                        + 2 * B * H * T * T * hd             // causal attention
                        + 3 * B * T * (H + 2) * hd           // RoPE on q and k
                        + 2 * (N * D)                        // residual adds
                        + 3 * (2 * N * D * F)                // gate, up, down
                        + 5 * N * F;                         // SiLU * up
  const int64_t tail = 2 * N * D * F + N * D;                // down_proj + residual_2
  CHECK(ckpt.flops_fwd == plain.flops_fwd);
  CHECK(ckpt.flops_bwd == plain.flops_bwd);
  CHECK(plain.flops_fwd == 4 * block + 4 * N * D + 2 * N * D * 256);  // + final norm + LM head
  CHECK(ckpt.flops_recompute == 4 * (block - tail));
  CHECK(ckpt.flops_recompute <= 4 * block);
  CHECK(plain.flops_recompute == 0);

  // every recompute event lies in backward and re-runs an op of a block
  const int loss = event_of_kind(ckpt, EventKind::loss);
  const int layers = node_named(ckpt, "layers");
  REQUIRE(layers > 0);
  CHECK(ckpt.nodes[layers].repeat == 4);
  int recomputes = 0;
  for (int e = 0; e < static_cast<int>(ckpt.events.size()); ++e) {
    if (ckpt.events[e].kind != EventKind::recompute) continue;
    ++recomputes;
    CHECK(e > loss);
    CHECK(below(ckpt, ckpt.events[e].node, layers));
  }
  CHECK(recomputes == 4 * 11);  // 13 ops per block, all but down_proj and residual_2
}

TEST_CASE("Checkpointed blocks lower the peak of Llama-3-8B QLoRA", "[semantics][checkpointed]") {
  using Plain = Train<models::Llama<models::llama3_8b, Apply<QLoRA, All7>>, Batch<1>, Seq<2048>, Precision<BF16>, AdamW8bit>;
  using Ckpt = Train<models::Llama<models::llama3_8b, Apply<QLoRA, All7>, Apply<Checkpointed<>, EveryBlock>>, Batch<1>,
                     Seq<2048>, Precision<BF16>, AdamW8bit>;
  const auto plain = expand_at_run_time<Plain>();
  const auto ckpt = expand_at_run_time<Ckpt>();
  CHECK(plan_valid(plain));
  CHECK(plan_valid(ckpt));
  CHECK(peak(ckpt) < peak(plain));
  CHECK(peak(ckpt) <= 24_GiB);
  // 32 block inputs + the final norm's input (2048 x 4096 bf16 = 16 MiB each) + its rstd
  CHECK(role_bytes(ckpt, Role::saved_activation) == 33 * 16_MiB + 2048 * 4);
  CHECK(ckpt.flops_recompute > 0);
  CHECK(ckpt.flops_recompute <= ckpt.flops_fwd);
}

namespace {
// with LoRA the grads are small, so the peak is where the saved activations
// are: at the start of backward, which offloading relieves
template <class... Mods>
using TinyLoRABig = Train<models::Llama<models::tiny_llama, Apply<LoRA<8>, On<q_proj, v_proj>>, Mods...>, Batch<8>,
                          Seq<256>, AdamW>;
}  // namespace

TEST_CASE("Offloaded blocks: bytes in the offload tier, lower device peak", "[semantics][offloaded]") {
  const int64_t N = 8 * 256, xD = N * 256 * 4;

  SECTION("Offloaded<Checkpointed<>>: the block inputs go to the offload tier") {
    const auto ckpt = expand_at_run_time<TinyLoRABig<Apply<Checkpointed<>, EveryBlock>>>();
    const auto off = expand_at_run_time<TinyLoRABig<Apply<Offloaded<Checkpointed<>>, EveryBlock>>>();
    REQUIRE(plan_valid(off));
    CHECK(peak(ckpt, Tier::offload) == 0);
    CHECK(peak(off, Tier::offload) == 4 * xD);
    CHECK(role_bytes(off, Role::saved_activation, Tier::offload) == 4 * xD);
    CHECK(peak(off) < peak(ckpt));
    CHECK(off.lower_bound[0] < ckpt.lower_bound[0]);
    CHECK(off.flops_recompute == ckpt.flops_recompute);
    CHECK(count_events(off, EventKind::offload) == 4);
    // one per block, plus the fetch of the last block before backward enters the blocks
    CHECK(count_events(off, EventKind::prefetch) == 4 + 1);
  }
  SECTION("Offloaded<Checkpointed<>> under full fine-tuning never raises the liveness bound") {
    // here the peak is at block 0's backward (all grads born by then), where
    // block 0's input must be on the device either way
    const auto ckpt = expand_at_run_time<TinyBig<Apply<Checkpointed<>, EveryBlock>>>();
    const auto off = expand_at_run_time<TinyBig<Apply<Offloaded<Checkpointed<>>, EveryBlock>>>();
    REQUIRE(plan_valid(off));
    CHECK(peak(off, Tier::offload) == 4 * xD);
    CHECK(off.lower_bound[0] <= ckpt.lower_bound[0]);
  }
  SECTION("Offloaded<>: every saved activation of a block goes to the offload tier") {
    const auto plain = expand_at_run_time<TinyBig<>>();
    const auto off = expand_at_run_time<TinyBig<Apply<Offloaded<>, EveryBlock>>>();
    REQUIRE(plan_valid(off));
    // one block's saved tensors at N = 2,048, f32 (see tests/static/tiny_llama_roles.cpp):
    // x, h1, q, o, x2, h2 (N, D); k, v (N, 128); g, u, s (N, F); rstd1, rstd2 (N); lse (B, H, T)
    const int64_t block = 6 * xD + 2 * (N * 128 * 4) + 3 * (N * 768 * 4) + 2 * (N * 4) + 8 * 4 * 256 * 4;
    CHECK(peak(off, Tier::offload) == 4 * block);
    CHECK(off.lower_bound[1] == 4 * block);
    CHECK(peak(off) < peak(plain));
    CHECK(off.flops_recompute == 0);
    const auto lora_plain = expand_at_run_time<TinyLoRABig<>>();
    const auto lora_off = expand_at_run_time<TinyLoRABig<Apply<Offloaded<>, EveryBlock>>>();
    CHECK(plan_valid(lora_off));
    CHECK(peak(lora_off) < peak(lora_plain));
  }
}

TEST_CASE("Offloaded blocks are fetched back one block ahead", "[semantics][offloaded]") {
  const auto x = expand_at_run_time<TinyBig<Apply<Offloaded<Checkpointed<>>, EveryBlock>>>();
  const int layers = node_named(x, "layers");
  const int loss = event_of_kind(x, EventKind::loss);
  REQUIRE(layers > 0);
  constexpr int L = 4;
  // first and last backward-side event (recompute or backward) of each block instance
  int start[L], end[L];
  for (int j = 0; j < L; ++j) start[j] = end[j] = -1;
  for (int e = 0; e < static_cast<int>(x.events.size()); ++e) {
    const EventInfo& ev = x.events[e];
    if ((ev.kind != EventKind::recompute && ev.kind != EventKind::backward) || !below(x, ev.node, layers)) continue;
    if (start[ev.instance] < 0) start[ev.instance] = e;
    end[ev.instance] = e;
  }
  for (int j = 0; j + 1 < L; ++j) CHECK(end[j + 1] < start[j]);  // backward runs the blocks in reverse
  int copies = 0;
  for (const Buffer& b : x.buffers) {
    if (b.tier == Tier::offload) {
      // host copy: made in forward, read back at a prefetch
      CHECK(x.events[b.first].kind == EventKind::offload);
      CHECK(b.first < loss);
      CHECK(x.events[b.last].kind == EventKind::prefetch);
      continue;
    }
    if (b.role != Role::saved_activation || x.events[b.first].kind != EventKind::prefetch) continue;
    ++copies;
    // block j's device copy is fetched before block j + 1's backward starts
    // (so the copy overlaps that block's compute), after block j + 2's ended
    const int j = b.instance;
    INFO("block " << j);
    CHECK(b.first > loss);
    CHECK(b.first < start[j]);
    if (j + 1 < L) CHECK(b.first < start[j + 1]);
    if (j + 2 < L) CHECK(b.first > end[j + 2]);
    CHECK(b.last <= end[j]);
  }
  CHECK(copies == L);
}

TEST_CASE("UpdateInBackward lowers or keeps the peak and frees grads in backward", "[semantics][update]") {
  SECTION("tiny_llama, full fine-tuning") {
    using Plain = Train<models::Llama<models::tiny_llama>, Batch<2>, Seq<64>, AdamW>;
    using Uib = Train<models::Llama<models::tiny_llama>, Batch<2>, Seq<64>, AdamW, UpdateInBackward>;
    const auto plain = expand_at_run_time<Plain>();
    const auto uib = expand_at_run_time<Uib>();
    REQUIRE(plan_valid(uib));
    CHECK(peak(uib) <= peak(plain));
    CHECK(uib.lower_bound[0] <= plain.lower_bound[0]);
    CHECK(role_bytes(uib, Role::grads) == role_bytes(plain, Role::grads));
    const int upd_plain = event_of_kind(plain, EventKind::update);
    const int upd_uib = event_of_kind(uib, EventKind::update);
    CHECK(role_bytes_at(plain, Role::grads, upd_plain) == 4 * 3'279'104);  // every grad waits for the update
    CHECK(role_bytes_at(uib, Role::grads, upd_uib) == 0);                  // none left
  }
  SECTION("Llama-3-8B QLoRA") {
    using Plain = Train<models::Llama<models::llama3_8b, Apply<QLoRA, All7>, Apply<Checkpointed<>, EveryBlock>>, Batch<1>,
                        Seq<2048>, Precision<BF16>, AdamW8bit>;
    using Uib = Train<models::Llama<models::llama3_8b, Apply<QLoRA, All7>, Apply<Checkpointed<>, EveryBlock>>, Batch<1>,
                      Seq<2048>, Precision<BF16>, AdamW8bit, UpdateInBackward>;
    const auto plain = expand_at_run_time<Plain>();
    const auto uib = expand_at_run_time<Uib>();
    CHECK(plan_valid(uib));
    CHECK(peak(uib) <= peak(plain));
  }
}

TEST_CASE("Accumulate<2>: grads live the whole step", "[semantics][accumulate]") {
  using One = Train<models::Llama<models::tiny_llama>, Batch<2>, Seq<64>, AdamW>;
  using Two = Train<models::Llama<models::tiny_llama>, Batch<2>, Seq<64>, AdamW, Accumulate<2>>;
  const auto one = expand_at_run_time<One>();
  const auto two = expand_at_run_time<Two>();
  REQUIRE(plan_valid(two));
  const int E = static_cast<int>(two.events.size());
  int grads = 0;
  for (const Buffer& b : two.buffers) {
    if (b.role != Role::grads) continue;
    ++grads;
    CHECK(b.first == 0);
    CHECK(b.last == E - 1);
  }
  CHECK(grads > 0);
  // at the first forward, all grads (4 B x 3,279,104) already hold the previous micro-batches' sum
  CHECK(role_bytes_at(two, Role::grads, 1) == 4 * 3'279'104);
  CHECK(role_bytes_at(one, Role::grads, 1) == 0);
  CHECK(peak(two) >= peak(one));
  CHECK(two.lower_bound[0] >= one.lower_bound[0]);
}

namespace {
// tiny_llama with 1, 2, 4 layers
template <int Layers>
constexpr models::LlamaConfig tiny_with = {256, 256, 768, Layers, 4, 2, 512, false};
template <int Layers>
using TinyN = Train<models::Llama<tiny_with<Layers>>, Batch<2>, Seq<64>, AdamW>;
}  // namespace

TEST_CASE("Repeat<N>: block parameters and activations scale with N", "[semantics][repeat]") {
  const auto one = expand_at_run_time<TinyN<1>>();
  const auto two = expand_at_run_time<TinyN<2>>();
  const auto four = expand_at_run_time<TinyN<4>>();
  // per block 786,944 parameters (q 65,536, k 32,768, v 32,768, o 65,536,
  // gate / up / down 196,608 each, two norms 256 each); outside: embed_tokens
  // 65,536, norm 256, lm_head 65,536
  const auto params = [](const detail::Expanded& x) {
    int64_t n = 0;
    for (const ParamInfo& p : x.params) n += p.rows * p.cols * p.instances;
    return n;
  };
  CHECK(params(one) == 131'328 + 1 * 786'944);
  CHECK(params(two) == 131'328 + 2 * 786'944);
  CHECK(params(four) == 131'328 + 4 * 786'944);
  // the block is described once: the same parameter list, a block parameter
  // having N instances (9 per block: 7 projections, 2 norms)
  REQUIRE(one.params.size() == four.params.size());
  REQUIRE(two.params.size() == four.params.size());
  int block_params = 0;
  for (std::size_t i = 0; i < four.params.size(); ++i) {
    CHECK(one.params[i].name == four.params[i].name);
    if (four.params[i].instances == 4) {
      ++block_params;
      CHECK(one.params[i].instances == 1);
      CHECK(two.params[i].instances == 2);
    } else {
      CHECK(four.params[i].instances == 1);
    }
  }
  CHECK(block_params == 9);
  const int counts[] = {1, 2, 4};
  int k = 0;
  for (const auto* x : {&one, &two, &four}) {
    const int layers = node_named(*x, "layers");
    REQUIRE(layers > 0);
    CHECK(x->nodes[layers].kind == "Repeat");
    CHECK(x->nodes[layers].repeat == counts[k++]);
    CHECK(plan_valid(*x));
  }
  // bytes that scale per block: weights, grads, state, saved activations
  for (Role r : {Role::weights, Role::grads, Role::optimizer_state, Role::saved_activation}) {
    INFO(name_of(r));
    CHECK(role_bytes(four, r) - role_bytes(two, r) == 2 * (role_bytes(two, r) - role_bytes(one, r)));
  }
  CHECK(role_bytes(two, Role::weights) - role_bytes(one, Role::weights) == 4 * 786'944);
  CHECK(role_bytes(two, Role::saved_activation) - role_bytes(one, Role::saved_activation) == 2'100'224);
  // events: load, 13 forward ops per block + embedding + final norm, loss,
  // as many backward, update
  CHECK(one.events.size() == 26 * 1 + 7);
  CHECK(two.events.size() == 26 * 2 + 7);
  CHECK(four.events.size() == 26 * 4 + 7);
}
