// OffloadOptimizer (ZeRO-Offload, Ren et al. 2021): where each model-state
// byte lives, derived by hand per tensor from the architectures below and
// the storage formats. With it
//   offload tier  optimizer state (AdamW 8 B / element, AdamW8bit
//                 2 (n + ceil(n / 256) 4) B / tensor + the 2 KiB dynamic maps,
//                 SGD with momentum 4 B), f32 master weights (4 B, when the
//                 run is 16-bit or planned OnCuda), and each gradient's copy
//                 (e B / element), whole step;
//   device tier   the weights (e B / element) and each gradient only from its
//                 first backward writer to the event that completes it.
// e is the run's element size. Every buffer is reserved at align_up(bytes, 256).
// OffloadParameters (with OffloadOptimizer) moves the weights too: each
// parameter's stored tensor (values, or quantized codes and their absmax
// scales) is in the offload tier for the whole step, and a fetch event before
// each forward, recompute and backward event of an op that reads parameters
// (a fused loss: its loss event only) copies them into device buffers
// "fetched", born at the compute event before when it is of the same group
// (a Repeat's block, or outside every block), else at the fetch, and dead
// after the event that reads them (sections 5 and 6).
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

constexpr int64_t a256(int64_t n) { return (n + 255) / 256 * 256; }

// A parameter tensor of n elements, held `count` times (instances of a Repeat included).
struct Tensor {
  int64_t n = 0;
  int count = 1;
};
// sum over the tensors of align_up(f(n), 256)
template <std::size_t K, class F>
constexpr int64_t reserved(const Tensor (&ts)[K], F f) {
  int64_t s = 0;
  for (const Tensor& t : ts) s += t.count * a256(f(t.n));
  return s;
}
constexpr int64_t elements(const auto& ts) {
  int64_t s = 0;
  for (const Tensor& t : ts) s += t.count * t.n;
  return s;
}
constexpr int64_t adamw8bit(int64_t n) { return 2 * (n + (n + 255) / 256 * 4); }

template <class P>
constexpr int event_of(const P& p, EventKind k) {
  for (int e = 0; e < static_cast<int>(p.event_count()); ++e)
    if (p.events[e].kind == k) return e;
  return -1;
}
// the most bytes of a role alive at one event of a tier
template <class P>
constexpr int64_t most_alive(const P& p, Role r, Tier t) {
  int64_t m = 0;
  for (int e = 0; e < static_cast<int>(p.event_count()); ++e) m = std::max(m, p.bytes_at(r, e, t));
  return m;
}
template <class P>
constexpr int count_events(const P& p, EventKind k) {
  int n = 0;
  for (int e = 0; e < static_cast<int>(p.event_count()); ++e) n += p.events[e].kind == k;
  return n;
}
// The first event of a kind at the first node named `name`.
template <class P>
constexpr int event_at(const P& p, EventKind k, std::string_view name) {
  for (int e = 0; e < static_cast<int>(p.event_count()); ++e)
    if (p.events[e].kind == k && p.events[e].node >= 0 && p.nodes[p.events[e].node].name == name) return e;
  return -1;
}
// Every device buffer of role weights is a fetched copy that lives inside
// the step (none at the load or the update), and each fetch is followed by
// the event of the same op instance that reads what it fetched.
template <class P>
constexpr bool device_weights_fetched(const P& p) {
  const int last = static_cast<int>(p.event_count()) - 1;
  for (const auto& b : p.buffers)
    if (b.role == Role::weights && b.tier == Tier::device && (b.name != "fetched" || b.first == 0 || b.last == last)) return false;
  for (int e = 0; e < last; ++e) {
    if (p.events[e].kind != EventKind::fetch) continue;
    const auto& x = p.events[e + 1];
    const bool reads = x.kind == EventKind::forward || x.kind == EventKind::loss || x.kind == EventKind::recompute ||
                       x.kind == EventKind::backward;
    if (!reads || x.node != p.events[e].node || x.instance != p.events[e].instance) return false;
  }
  return true;
}
// ZeRO 3 with OffloadParameters: every device buffer of role weights is a
// fetched shard, and each fetch is followed by the gather (a collective) of
// the same op instance, which reads it.
template <class P>
constexpr bool fetches_then_gathers(const P& p) {
  const int last = static_cast<int>(p.event_count()) - 1;
  for (const auto& b : p.buffers)
    if (b.role == Role::weights && b.tier == Tier::device && (b.name != "fetched" || b.first == 0 || b.last == last)) return false;
  int fetches = 0;
  for (int e = 0; e < last; ++e) {
    if (p.events[e].kind != EventKind::fetch) continue;
    const auto& x = p.events[e + 1];
    if (x.kind != EventKind::collective || x.node != p.events[e].node || x.instance != p.events[e].instance) return false;
    ++fetches;
  }
  return fetches > 0;
}
template <class P>
constexpr int64_t model_states(const P& p, Tier t) {
  return p.bytes(Role::weights, t) + p.bytes(Role::master_weights, t) + p.bytes(Role::grads, t) +
         p.bytes(Role::optimizer_state, t);
}

// ============================================================================
// 1. A small Llama whose widths need rounding: vocab 320, D 96, F 160,
//    2 layers, 4 heads of hd 24, 2 KV heads, untied LM head
// ============================================================================
constexpr models::LlamaConfig lc{320, 96, 160, 2, 4, 2, 64, false};
using L = models::Llama<lc>;
//   embed_tokens, lm_head (320 x 96); per layer 2 norms (96), q, o (96 x 96),
//   k, v (48 x 96), gate, up, down (96 x 160); the final norm
constexpr Tensor llama[] = {{30'720, 2}, {96, 2 * 2 + 1}, {9'216, 2 * 2}, {4'608, 2 * 2}, {15'360, 3 * 2}};
constexpr int64_t PL = elements(llama);
static_assert(PL == 209'376);

template <class... O>
using LRun = Train<L, Batch<1>, Seq<32>, Precision<BF16>, O...>;
constexpr auto l_dev = plan<LRun<AdamW>>();
constexpr auto l_off = plan<LRun<AdamW, OffloadOptimizer>>();
constexpr auto l_8bit = plan<LRun<AdamW8bit, OffloadOptimizer>>();
constexpr auto l_sgd = plan<LRun<SGD<>, OffloadOptimizer>>();
static_assert(l_dev.valid() && l_off.valid() && l_8bit.valid() && l_sgd.valid());

// bf16 weights: a norm's 192 B take 256
constexpr int64_t l_w2 = reserved(llama, [](int64_t n) { return 2 * n; });
constexpr int64_t l_w4 = reserved(llama, [](int64_t n) { return 4 * n; });
constexpr int64_t l_w8 = reserved(llama, [](int64_t n) { return 8 * n; });
static_assert(l_w2 == 2 * PL + 5 * 64 && l_w2 == 419'072);
static_assert(l_w4 == 4 * PL + 5 * 128 && l_w8 == 8 * PL);

// Without the option every model state is on the device.
static_assert(l_dev.bytes(Role::weights, Tier::device) == l_w2);
static_assert(l_dev.bytes(Role::grads, Tier::device) == l_w2);
static_assert(l_dev.bytes(Role::master_weights, Tier::device) == l_w4);
static_assert(l_dev.bytes(Role::optimizer_state, Tier::device) == l_w8);
static_assert(model_states(l_dev, Tier::offload) == 0 && l_dev.peak_bytes(Tier::offload) == 0);

// With it: weights and the gradients in flight on the device, the rest offloaded.
static_assert(l_off.bytes(Role::weights, Tier::device) == l_w2);
static_assert(l_off.bytes(Role::weights, Tier::offload) == 0);
static_assert(l_off.bytes(Role::grads, Tier::device) == l_w2);
static_assert(l_off.bytes(Role::master_weights, Tier::device) == 0);
static_assert(l_off.bytes(Role::optimizer_state, Tier::device) == 0);
static_assert(l_off.bytes(Role::grads, Tier::offload) == l_w2);
static_assert(l_off.bytes(Role::master_weights, Tier::offload) == l_w4);
static_assert(l_off.bytes(Role::optimizer_state, Tier::offload) == l_w8);
// the host engine needs nothing else in the offload tier, all of it alive at the update
static_assert(l_off.peak_bytes(Tier::offload) == l_w2 + l_w4 + l_w8);
static_assert(l_off.peak_bytes(Tier::offload) == 2'932'224);
// The device peak falls by at least the master weights and moments it no longer holds.
static_assert(l_dev.peak_bytes() - l_off.peak_bytes() >= l_w4 + l_w8);

// AdamW8bit, per tensor:
//   30,720: 120 blocks -> 62,400 -> 62,464      96: 1 block -> 200 -> 256
//    9,216:  36 blocks -> 18,720 -> 18,944   4,608: 18 blocks -> 9,360 -> 9,472
//   15,360:  60 blocks -> 31,200 -> 31,232
// plus the two 256-entry f32 dynamic maps, once (2,048 B), in the offload tier too.
static_assert(reserved(llama, adamw8bit) == 2 * 62'464 + 5 * 256 + 4 * 18'944 + 4 * 9'472 + 6 * 31'232);
static_assert(l_8bit.bytes(Role::optimizer_state, Tier::offload) == reserved(llama, adamw8bit) + 2'048);
static_assert(l_8bit.bytes(Role::optimizer_state, Tier::offload) == 429'312);
static_assert(l_8bit.bytes(Role::optimizer_state, Tier::device) == 0);
static_assert(l_8bit.bytes(Role::master_weights, Tier::offload) == l_w4);
static_assert(l_8bit.bytes(Role::grads, Tier::offload) == l_w2);
// SGD with momentum: one f32 buffer per parameter.
static_assert(l_sgd.bytes(Role::optimizer_state, Tier::offload) == l_w4);
static_assert(l_sgd.bytes(Role::optimizer_state, Tier::device) == 0);
static_assert(l_sgd.bytes(Role::master_weights, Tier::offload) == l_w4);

// Lifetimes. Each device gradient lives only in the event that completes it
// (every parameter here has one backward writer), so the device never holds
// more than one: the largest, embed_tokens' or lm_head's (61,440 B). At the
// loss event that is lm_head's (the fused LM head writes it there); at the
// update no gradient is left on the device, and the offload tier holds them all.
constexpr int l_loss = event_of(l_off, EventKind::loss);
constexpr int l_update = static_cast<int>(l_off.event_count()) - 1;
static_assert(l_loss == 1 + 1 + 2 * 13 + 1 && l_off.events[l_update].kind == EventKind::update);
static_assert(l_off.bytes_at(Role::grads, l_loss, Tier::device) == 2 * 30'720);
static_assert(l_off.bytes_at(Role::grads, l_loss, Tier::offload) == 2 * 30'720);
static_assert(most_alive(l_off, Role::grads, Tier::device) == 2 * 30'720);
static_assert(l_off.bytes_at(Role::grads, l_update, Tier::device) == 0);
static_assert(l_off.bytes_at(Role::grads, l_update, Tier::offload) == l_w2);
// Without the option every gradient is on the device at the update.
static_assert(l_dev.bytes_at(Role::grads, l_update, Tier::device) == l_w2);

// Accumulate<2>: the offloaded gradients hold the sum over the micro-batches,
// so they live the whole step; the device's still live one event each.
constexpr auto l_acc = plan<LRun<AdamW, OffloadOptimizer, Accumulate<2>>>();
static_assert(l_acc.valid());
static_assert(l_acc.bytes_at(Role::grads, 0, Tier::offload) == l_w2);
static_assert(most_alive(l_acc, Role::grads, Tier::device) == 2 * 30'720);
static_assert(l_acc.peak_bytes(Tier::offload) == l_off.peak_bytes(Tier::offload));

// ============================================================================
// 2. A small GPT-2: vocab 200, D 64, 2 layers, 4 heads, 64 positions; the LM
//    head tied to wte
// ============================================================================
constexpr models::GPT2Config gc{200, 64, 2, 4, 64};
using G = models::GPT2<gc>;
//   wte (200 x 64), wpe (64 x 64); per layer the 64-element vectors (ln_1 w, b,
//   attn.c_proj b, ln_2 w, b, mlp.c_proj b), c_attn (64 x 192) and its bias
//   (192), attn.c_proj (64 x 64), c_fc (64 x 256) and its bias (256),
//   mlp.c_proj (256 x 64); ln_f w, b
constexpr Tensor gpt2[] = {{12'800, 1}, {4'096, 1 + 2}, {64, 6 * 2 + 2}, {12'288, 2}, {192, 2}, {256, 2}, {16'384, 2 * 2}};
constexpr int64_t PG = elements(gpt2);
static_assert(PG == 116'992);

// f32 everywhere a multiple of 256 B. On the host engine an f32 run keeps no
// master copy; planned OnCuda with the option it does (4 B, offload tier):
// the host updates f32 weights of its own and copies them to the device.
template <class... O>
using GRun = Train<G, Batch<1>, Seq<32>, O...>;
constexpr auto g_host = plan<GRun<AdamW, OffloadOptimizer>>();
constexpr auto g_cuda = plan<GRun<AdamW, OnCuda, OffloadOptimizer>>();
constexpr auto g_cuda_dev = plan<GRun<AdamW, OnCuda>>();
static_assert(g_host.valid() && g_cuda.valid() && g_cuda_dev.valid());
static_assert(g_host.bytes(Role::weights, Tier::device) == 4 * PG);
static_assert(g_host.bytes(Role::grads, Tier::offload) == 4 * PG);
static_assert(g_host.bytes(Role::optimizer_state, Tier::offload) == 8 * PG);
static_assert(g_host.bytes(Role::master_weights) == 0);
static_assert(g_host.peak_bytes(Tier::offload) == 12 * PG);

static_assert(g_cuda.bytes(Role::weights, Tier::device) == 4 * PG);
static_assert(g_cuda.bytes(Role::master_weights, Tier::offload) == 4 * PG);
static_assert(g_cuda.bytes(Role::master_weights, Tier::device) == 0);
static_assert(g_cuda.bytes(Role::grads, Tier::offload) == 4 * PG);
static_assert(g_cuda.bytes(Role::optimizer_state, Tier::offload) == 8 * PG);
static_assert(g_cuda.bytes(Role::optimizer_state, Tier::device) == 0);
// + the CUDA engine's pinned staging: 32 tokens and 32 targets (4 B each)
// and 2 x 16 floats of step inputs and results, 384 -> 512 B
static_assert(g_cuda.peak_bytes(Tier::offload) == 16 * PG + 512);
static_assert(g_cuda_dev.bytes(Role::master_weights) == 0);  // f32, without the option: none
static_assert(g_cuda_dev.peak_bytes() - g_cuda.peak_bytes() >= 8 * PG);
// The tied table's gradient is written twice, at the loss event (the LM
// head) and at the embedding's backward, and lives on the device in between.
constexpr int g_loss = event_of(g_cuda, EventKind::loss);
static_assert(g_cuda.bytes_at(Role::grads, g_loss, Tier::device) == 4 * 12'800);
static_assert(g_cuda.bytes_at(Role::grads, g_loss, Tier::offload) == 0);

// bf16: the 64-element vectors take 256 B for their 128, c_attn's bias 512 for 384.
constexpr auto g_bf16 = plan<GRun<Precision<BF16>, AdamW, OffloadOptimizer>>();
static_assert(g_bf16.valid());
constexpr int64_t g_w2 = reserved(gpt2, [](int64_t n) { return 2 * n; });
static_assert(g_w2 == 2 * PG + 14 * 128 + 2 * 128);
static_assert(g_bf16.bytes(Role::weights, Tier::device) == g_w2);
static_assert(g_bf16.bytes(Role::grads, Tier::offload) == g_w2);
static_assert(g_bf16.bytes(Role::master_weights, Tier::offload) == 4 * PG);
static_assert(g_bf16.bytes(Role::optimizer_state, Tier::offload) == 8 * PG);
static_assert(model_states(g_bf16, Tier::device) == 2 * g_w2);  // weights, and the gradients in flight

// ============================================================================
// 3. Per parameter, bf16 planned OnCuda: tiny_llama (every tensor a multiple
//    of 128 elements: no rounding), AdamW
// ============================================================================
using Tiny = models::Llama<models::tiny_llama>;
constexpr int64_t PT = 3'279'104;  // derived in presets.cpp
constexpr auto t_dev = plan<Train<Tiny, Batch<1>, Seq<64>, Precision<BF16>, AdamW, OnCuda>>();
constexpr auto t_off = plan<Train<Tiny, Batch<1>, Seq<64>, Precision<BF16>, AdamW, OnCuda, OffloadOptimizer>>();
static_assert(t_dev.valid() && t_off.valid());
// device: 2 B of bf16 weights per parameter for the whole step (the
// gradients come and go); without the option 2 + 4 + 8
constexpr int64_t t_resident = t_off.bytes(Role::weights, Tier::device) + t_off.bytes(Role::master_weights, Tier::device) +
                               t_off.bytes(Role::optimizer_state, Tier::device);
static_assert(t_resident == 2 * PT);
static_assert(t_dev.bytes(Role::weights) + t_dev.bytes(Role::master_weights) + t_dev.bytes(Role::optimizer_state) == 14 * PT);
// offload: 4 (master) + 2 (gradient) + 8 (AdamW) = 14 B per parameter, and
// the staging of 64 tokens and targets: 64 x 4 x 2 + 128 = 640 -> 768 B
static_assert(model_states(t_off, Tier::offload) == 14 * PT);
static_assert(t_off.peak_bytes(Tier::offload) == 14 * PT + 768);
// the device peak falls by at least the 12 B per parameter of master weights and moments
static_assert(t_dev.peak_bytes() - t_off.peak_bytes() >= 12 * PT);

// ============================================================================
// 4. Llama-3-8B, bf16, AdamW, checkpointed blocks, b1 s2048, OnCuda: the
//    offload tier holds 14 B per parameter (+ 16,640 B of staging: 2,048
//    tokens and targets x 4 B + 128 B = 16,512 -> 16,640); the device the
//    2 B of weights and what is in flight, within 24 GiB
// ============================================================================
constexpr int64_t P8 = 8'030'261'248;  // meta-llama/Meta-Llama-3-8B, as published
using L8 = models::Llama<models::llama3_8b, Apply<Checkpointed<>, EveryBlock>>;
constexpr auto big = plan<Train<L8, Precision<BF16>, AdamW, Batch<1>, Seq<2048>, OnCuda, OffloadOptimizer>>();
static_assert(big.valid());
static_assert(big.bytes(Role::weights, Tier::device) == 2 * P8);
static_assert(big.bytes(Role::master_weights, Tier::device) == 0 && big.bytes(Role::optimizer_state, Tier::device) == 0);
static_assert(big.peak_bytes(Tier::offload) == 14 * P8 + 16'640);
static_assert(big.peak_bytes() <= 24_GiB);

// ============================================================================
// 5. OffloadParameters on the Llama of section 1 (bf16, AdamW)
// ============================================================================
constexpr auto l_par = plan<LRun<AdamW, OffloadOptimizer, OffloadParameters>>();
static_assert(l_par.valid());
// The offload tier holds every parameter's bf16 values, reserved per tensor
// as the device held them (l_w2), beside what OffloadOptimizer keeps there;
// all of it is alive at the update.
static_assert(l_par.bytes(Role::weights, Tier::offload) == l_w2);
static_assert(l_par.bytes(Role::grads, Tier::offload) == l_w2);
static_assert(l_par.bytes(Role::master_weights, Tier::offload) == l_w4);
static_assert(l_par.bytes(Role::optimizer_state, Tier::offload) == l_w8);
static_assert(l_par.peak_bytes(Tier::offload) == 2 * l_w2 + l_w4 + l_w8);
static_assert(l_par.peak_bytes(Tier::offload) == 3'351'296);
// The device holds no weights of its own, only fetched copies (and the gradients in flight).
static_assert(device_weights_fetched(l_par));
static_assert(l_par.bytes(Role::master_weights, Tier::device) == 0 && l_par.bytes(Role::optimizer_state, Tier::device) == 0);
static_assert(l_par.bytes(Role::grads, Tier::device) == l_w2);

// The ops that read parameters: embed_tokens, per block the 2 norms and the
// 7 projections, the final norm and the LM head. Forward fetches for all 21
// (the LM head's at its fused loss event), backward for the 20 others: 41.
// Without the option the step is load, 28 forward, loss, 28 backward, update.
static_assert(l_off.event_count() == 1 + 28 + 1 + 28 + 1);
static_assert(count_events(l_par, EventKind::fetch) == 21 + 20);
static_assert(l_par.event_count() == l_off.event_count() + 41);
static_assert(event_of(l_par, EventKind::loss) == l_loss + 21);
// Every parameter is copied once for its forward and once for its backward,
// but lm_head's once: the device's fetched bytes sum to 2 l_w2 - 61,440.
static_assert(l_par.bytes(Role::weights, Tier::device) == 2 * l_w2 - 2 * 30'720);

// At one event: the fetched copies of the op it runs, and of the op of the
// next compute event when that one is in the same group, born one event
// ahead. Events 0 load, 1-2 fetch and forward embed_tokens, 3-4
// layers.0.input_layernorm, 5-6 layers.0.self_attn.q_proj, ..., 9-10 v_proj.
constexpr int l_q = event_at(l_par, EventKind::forward, "q_proj");
constexpr int l_v = event_at(l_par, EventKind::forward, "v_proj");
static_assert(l_q == 6 && l_v == 10);
// q_proj's forward: its copy (96 x 96) and k_proj's (48 x 96), born here
static_assert(l_par.bytes_at(Role::weights, l_q, Tier::device) == 2 * 9'216 + 2 * 4'608);
// q_proj's fetch: its copy alone (born at input_layernorm's forward, which
// read its own copy for the last time)
static_assert(l_par.bytes_at(Role::weights, l_q - 1, Tier::device) == 2 * 9'216);
// v_proj's forward: its copy alone; the attention core after it reads none
static_assert(l_par.bytes_at(Role::weights, l_v, Tier::device) == 2 * 4'608);
// embed_tokens' forward: its copy alone; input_layernorm is in the block's
// group, so its copy is born at its own fetch
static_assert(l_par.bytes_at(Role::weights, 2, Tier::device) == 2 * 30'720);
// The most at once: the final norm's (192 -> 256 B) and lm_head's copies, at
// the norm's forward and at the loss event (lm_head's, and the norm's for its
// backward). gate + up and embed_tokens alone come to 61,440.
static_assert(most_alive(l_par, Role::weights, Tier::device) == 256 + 2 * 30'720);
static_assert(l_par.bytes_at(Role::weights, event_of(l_par, EventKind::loss), Tier::device) == 256 + 2 * 30'720);
// The other device buffers live as with OffloadOptimizer alone, where l_w2
// of weights were alive at every event; now at most 61,696 B are, and the
// host engine's update staging buffer holds a range of values too (16,384
// elements, the update range, at 2 B). The liveness bound falls by at least
// the difference, and the arena with it.
static_assert(l_off.lower_bound() - l_par.lower_bound() >= l_w2 - (256 + 2 * 30'720) - 16'384 * 2);
static_assert(l_par.peak_bytes() < l_off.peak_bytes());

// Checkpointed blocks: each block's recompute re-runs 11 of its 13 ops
// (not down_proj nor residual_2), 8 of which read parameters: 16 more
// fetches, and 2 x (2 norms + q, k, v, o + gate, up) more fetched bytes.
using LCk = models::Llama<lc, Apply<Checkpointed<>, EveryBlock>>;
constexpr auto l_ck = plan<Train<LCk, Batch<1>, Seq<32>, Precision<BF16>, AdamW, OffloadOptimizer, OffloadParameters>>();
static_assert(l_ck.valid() && device_weights_fetched(l_ck));
static_assert(count_events(l_ck, EventKind::recompute) == 2 * 11);
static_assert(count_events(l_ck, EventKind::fetch) == 41 + 2 * 8);
static_assert(l_ck.bytes(Role::weights, Tier::device) ==
              l_par.bytes(Role::weights, Tier::device) + 2 * (2 * 256 + 2 * (2 * 9'216 + 2 * 4'608) + 2 * 2 * 15'360));
static_assert(l_ck.bytes(Role::weights, Tier::offload) == l_w2);

// ============================================================================
// 6. OffloadParameters with QLoRA: a Llama of vocab 256, D 128, F 192, one
//    block, 2 heads of 64, 1 KV head; NF4 + LoRA r8 on the 7 projections,
//    AdamW8bit, bf16
// ============================================================================
constexpr models::LlamaConfig qc{256, 128, 192, 1, 2, 1, 64, false};
using Projections = On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>;
using Q = models::Llama<qc, Apply<Quantized<NF4, LoRA<8>>, Projections>>;
template <class... O>
using QRun = Train<Q, Batch<1>, Seq<32>, Precision<BF16>, AdamW8bit, OffloadOptimizer, O...>;
constexpr auto q_off = plan<QRun<>>();
constexpr auto q_par = plan<QRun<OffloadParameters>>();
static_assert(q_off.valid() && q_par.valid());
//   dense, bf16: embed_tokens and lm_head (256 x 128), 3 norms (128), and the
//   adapters A (8 x In), B (Out x 8): q, o 1,024 + 1,024; k, v 1,024 + 512;
//   gate, up 1,024 + 1,536; down 1,536 + 1,024 elements
//   NF4, 4 bits per element and a 4-byte absmax per 64: q, o (128 x 128),
//   k, v (64 x 128), gate, up, down (192 x 128 and 128 x 192)
constexpr Tensor q_dense[] = {{32'768, 2}, {128, 3}, {1'024, 9}, {512, 2}, {1'536, 3}};
constexpr Tensor q_nf4[] = {{16'384, 2}, {8'192, 2}, {24'576, 3}};
constexpr Tensor q_adapters[] = {{1'024, 9}, {512, 2}, {1'536, 3}};
constexpr int64_t q_w = reserved(q_dense, [](int64_t n) { return 2 * n; }) + reserved(q_nf4, [](int64_t n) { return n / 2; });
constexpr int64_t q_s = reserved(q_nf4, [](int64_t n) { return n / 64 * 4; });
static_assert(q_w == 131'072 + 768 + 29'696 + 61'440 && q_s == 7'680);
// Without the option: on the device (and the NF4 code table, 64 -> 256 B).
static_assert(q_off.bytes(Role::weights, Tier::device) == q_w && q_off.bytes(Role::quant_scales, Tier::device) == q_s + 256);
static_assert(q_off.bytes(Role::weights, Tier::offload) == 0 && q_off.bytes(Role::quant_scales, Tier::offload) == 0);
// With it: codes, scales and the dense tensors in the offload tier; the code
// table stays on the device, the only quant-scales buffer there.
static_assert(q_par.bytes(Role::weights, Tier::offload) == q_w);
static_assert(q_par.bytes(Role::quant_scales, Tier::offload) == q_s);
static_assert(q_par.bytes(Role::quant_scales, Tier::device) == 256);
static_assert(device_weights_fetched(q_par));
// The offload tier adds them to OffloadOptimizer's: the adapters' f32
// master weights, bf16 gradients and AdamW8bit state (+ the 2 KiB maps).
constexpr int64_t q_optimizer = reserved(q_adapters, [](int64_t n) { return 4 * n; }) +
                                reserved(q_adapters, [](int64_t n) { return 2 * n; }) + reserved(q_adapters, adamw8bit) + 2'048;
static_assert(q_off.peak_bytes(Tier::offload) == q_optimizer);
static_assert(q_par.peak_bytes(Tier::offload) == q_optimizer + q_w + q_s);
static_assert(q_par.peak_bytes(Tier::offload) == 355'072);
// Fetches: embed_tokens, 2 norms, 7 base projections, 7 adapters, the final
// norm and the LM head forward (19), the same less the LM head backward (18).
// Each copies values, or codes and scales (a fetched copy of scales has the
// role weights on the device): every stored byte twice, lm_head's once.
static_assert(count_events(q_par, EventKind::fetch) == 19 + 18);
static_assert(q_par.bytes(Role::weights, Tier::device) == 2 * (q_w + q_s) - 65'536);
// q_proj's base forward (event 6): its codes and scales, and its adapter's A
// and B, born there for the adapter op that follows.
constexpr int q_q = event_at(q_par, EventKind::forward, "q_proj");
static_assert(q_q == 6);
static_assert(q_par.bytes_at(Role::weights, q_q, Tier::device) == 8'192 + 1'024 + 2'048 + 2'048);
static_assert(most_alive(q_par, Role::weights, Tier::device) == 256 + 65'536);  // the final norm and lm_head
static_assert(q_off.lower_bound() - q_par.lower_bound() >= q_w + q_s - (256 + 65'536));
static_assert(q_par.peak_bytes() < q_off.peak_bytes());

// ============================================================================
// 7. ZeRO-Infinity: OffloadParameters with DataParallel<2> and ZeRO<3> on the
//    Llama of section 1 (bf16, AdamW)
// ============================================================================
// Each rank stores its shard of every parameter, ceil(n / 2) elements
// rounded up to 256: 15,360; 48 -> 256; 4,608; 2,304; 7,680.
constexpr Tensor l_shards[] = {{15'360, 2}, {256, 2 * 2 + 1}, {4'608, 2 * 2}, {2'304, 2 * 2}, {7'680, 3 * 2}};
constexpr int64_t z_w2 = reserved(l_shards, [](int64_t n) { return 2 * n; });
constexpr int64_t z_w4 = reserved(l_shards, [](int64_t n) { return 4 * n; });
constexpr int64_t z_w8 = reserved(l_shards, [](int64_t n) { return 8 * n; });
static_assert(z_w2 == 211'456);
template <class... O>
using ZRun = LRun<AdamW, DataParallel<2>, ZeRO<3>, OffloadOptimizer, O...>;
constexpr auto z_off = plan<ZRun<>>();
constexpr auto z_par = plan<ZRun<OffloadParameters>>();
static_assert(z_off.valid() && z_par.valid());
// Without OffloadParameters the shards are on the device; with it, in the
// offload tier beside the shards' gradients, master weights and state.
static_assert(z_off.bytes(Role::weights, Tier::device) == z_w2 && z_off.bytes(Role::weights, Tier::offload) == 0);
static_assert(z_par.bytes(Role::weights, Tier::offload) == z_w2);
static_assert(z_par.peak_bytes(Tier::offload) == 2 * z_w2 + z_w4 + z_w8);
static_assert(z_par.peak_bytes(Tier::offload) == 1'691'648);
// Before each gather (ZeRO 3 gathers for the same 41 events as section 5
// fetches) a fetch copies the rank's shards to the device, into buffers
// "fetched" that the gather reads: every shard twice, lm_head's once.
static_assert(count_events(z_par, EventKind::fetch) == 41);
static_assert(count_events(z_par, EventKind::collective) == count_events(z_off, EventKind::collective) &&
              count_events(z_par, EventKind::collective) > 41);
static_assert(fetches_then_gathers(z_par));
static_assert(z_par.bytes(Role::weights, Tier::device) == 2 * z_w2 - 30'720);
// The gathered parameters (role communication) are the same buffers with or without the option.
static_assert(z_par.bytes(Role::communication, Tier::device) == z_off.bytes(Role::communication, Tier::device));
static_assert(z_par.peak_bytes() < z_off.peak_bytes());

// ============================================================================
// 8. The host engine's update staging buffer (device tier, role scratch):
//    one range per worker of the largest trainable parameter's elements, at
//    most 16,384 (the update range); a slot holds the range's gradient
//    (e B / element; with OffloadParameters its values too) and then its
//    optimizer state, each reserved at align_up(bytes, 256)
// ============================================================================
template <class P>
constexpr int64_t staging_bytes(const P& p) {
  int64_t b = -1;
  for (const auto& x : p.buffers)
    if (x.name == "update staging") b = x.tier == Tier::device && x.role == Role::scratch ? x.bytes : -2;
  return b;
}
// Section 1's Llama: the largest parameter has 30,720 elements, so a range is 16,384.
static_assert(staging_bytes(plan<LRun<AdamW, OffloadOptimizer>>()) == 16'384 * 2 + 16'384 * 8);
static_assert(staging_bytes(plan<LRun<AdamW, OffloadOptimizer, Workers<2>>>()) == 2 * (16'384 * 2 + 16'384 * 8));
static_assert(staging_bytes(plan<LRun<AdamW, OffloadOptimizer, OffloadParameters, Workers<2>>>()) == 2 * (2 * 16'384 * 2 + 16'384 * 8));
// AdamW8bit: 2 (n + 64 blocks x 4) B of state
static_assert(staging_bytes(plan<LRun<AdamW8bit, OffloadOptimizer, Workers<2>>>()) == 2 * (16'384 * 2 + 2 * (16'384 + 64 * 4)));
// SGD with momentum: 4 B
static_assert(staging_bytes(plan<LRun<SGD<>, OffloadOptimizer, Workers<2>>>()) == 2 * (16'384 * 2 + 16'384 * 4));
// ZeRO 3 on 2 ranks (section 7): a rank updates its shard, at most 15,360 elements
static_assert(staging_bytes(plan<ZRun<Workers<2>>>()) == 2 * (15'360 * 2 + 15'360 * 8));
// Without OffloadOptimizer, or planned for the CUDA engine (whose update reads pinned memory): none
static_assert(staging_bytes(plan<LRun<AdamW, Workers<2>>>()) == -1);
static_assert(staging_bytes(plan<LRun<AdamW, OffloadOptimizer, OnCuda>>()) == -1);

// ============================================================================
// 9. Gradients several processes sum: section 1's Llama with LoRA<4> beside
//    q_proj and o_proj, TensorParallel<2>, AdamW, bf16. Per layer and rank
//    q's A (4 x 96) and o's B (96 x 4) are held whole, each rank with a
//    partial gradient that the group sums before the update; q's B (48 x 4)
//    and o's A (4 x 48) are split. Planned OnCuda, the summed ones stay on
//    the device the whole step (the collective that sums them reads device
//    memory) and go to the offload tier after it; the host engine sums the
//    offload tier's copies, so its device holds no gradient at the update.
// ============================================================================
using LLora = models::Llama<lc, Apply<LoRA<4>, On<q_proj, o_proj>>>;
template <class... O>
using TpRun = Train<LLora, Batch<1>, Seq<32>, Precision<BF16>, AdamW, OffloadOptimizer, TensorParallel<2>, O...>;
constexpr auto t_host = plan<TpRun<>>();
constexpr auto t_cuda = plan<TpRun<OnCuda>>();
constexpr auto t_cuda_acc = plan<TpRun<OnCuda, Accumulate<2>>>();
static_assert(t_host.valid() && t_cuda.valid() && t_cuda_acc.valid());
// whole: 384 elements, 768 B; split: 192 elements, 384 B -> 512; 2 of each per layer, 2 layers
constexpr int64_t t_whole = 2 * 2 * a256(384 * 2), t_split = 2 * 2 * a256(192 * 2);
static_assert(t_whole == 3'072 && t_split == 2'048);
constexpr int t_update = static_cast<int>(t_cuda.event_count()) - 1;
static_assert(t_cuda.events[t_update].kind == EventKind::update);
static_assert(t_cuda.bytes_at(Role::grads, t_update, Tier::device) == t_whole);
static_assert(t_host.bytes_at(Role::grads, static_cast<int>(t_host.event_count()) - 1, Tier::device) == 0);
// every offloaded gradient is in the offload tier at the update, on both engines
static_assert(t_cuda.bytes_at(Role::grads, t_update, Tier::offload) == t_whole + t_split);
static_assert(t_host.bytes(Role::grads, Tier::offload) == t_whole + t_split);
// the split ones live on the device one event each: at most one layer's pair
// (q's B and o's A complete at different events) beside the summed ones
static_assert(most_alive(t_cuda, Role::grads, Tier::device) == t_whole + a256(192 * 2));
// With Accumulate<2> the summed ones add up on the device over the micro-batches (whole step) as without offload
static_assert(t_cuda_acc.bytes_at(Role::grads, 0, Tier::device) == t_whole);
static_assert(t_cuda_acc.bytes_at(Role::grads, 0, Tier::offload) == t_whole + t_split);

}  // namespace
