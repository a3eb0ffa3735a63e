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

}  // namespace
