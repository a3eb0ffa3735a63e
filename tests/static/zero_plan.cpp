// Model-state bytes per data-parallel rank, ZeRO stages 0-3, against the
// formulas of Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models", section 5): with mixed-precision
// Adam, Psi parameters and Nd ranks, a rank keeps
//   stage 0  (2 + 2 + K) Psi           K = 12: f32 master weights 4, two f32 moments 8
//   stage 1  2 Psi + 2 Psi + K Psi / Nd
//   stage 2  2 Psi + (2 + K) Psi / Nd
//   stage 3  (2 + 2 + K) Psi / Nd
// Psi is counted by hand from the architecture below; every parameter's
// element count is a multiple of 256 x Nd, so the shards need no padding and
// the formulas hold exactly. A second block pins the padding rule where they
// do not divide (Nd = 3).
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

// vocab 1024, width 1024, MLP 2048, 2 layers, 8 heads (8 KV heads), untied head
constexpr models::LlamaConfig cfg{1024, 1024, 2048, 2, 8, 8, 64, false};
constexpr int64_t embed = 1024 * 1024, attention = 4 * 1024 * 1024, mlp = 3 * 1024 * 2048, norm = 1024;
constexpr int64_t psi = embed + 2 * (attention + mlp + 2 * norm) + norm + embed;  // lm head: 1024 x 1024
static_assert(psi == 23'073'792);

template <int Stage, int Nd>
using Run = Train<models::Llama<cfg>, Batch<1>, Seq<64>, Precision<BF16>, AdamW, DataParallel<Nd>, ZeRO<Stage>>;

template <int Stage, int Nd>
constexpr int64_t model_states() {
  constexpr auto p = plan<Run<Stage, Nd>>();
  static_assert(p.valid());
  return p.bytes(Role::weights) + p.bytes(Role::grads) + p.bytes(Role::master_weights) + p.bytes(Role::optimizer_state);
}

constexpr int64_t K = 12;
static_assert(model_states<0, 4>() == (2 + 2 + K) * psi);
static_assert(model_states<1, 4>() == 2 * psi + 2 * psi + K * psi / 4);
static_assert(model_states<2, 4>() == 2 * psi + (2 + K) * psi / 4);
static_assert(model_states<3, 4>() == (2 + 2 + K) * psi / 4);
static_assert(model_states<3, 2>() == (2 + 2 + K) * psi / 2);

// Role by role at stage 3 on 4 ranks, and what the collectives add: every
// gradient in whole once (the buckets backward fills before their
// reduce-scatter), and the parameters gathered for each event that reads
// them (forward and backward: twice each; the LM head's fused loss reads its
// weight once).
constexpr auto z3 = plan<Run<3, 4>>();
static_assert(z3.bytes(Role::weights) == 2 * psi / 4);
static_assert(z3.bytes(Role::grads) == 2 * psi / 4);
static_assert(z3.bytes(Role::master_weights) == 4 * psi / 4);
static_assert(z3.bytes(Role::optimizer_state) == 8 * psi / 4);
static_assert(z3.bytes(Role::communication) == 2 * psi + 2 * (2 * (psi - embed)) + 2 * embed);

// Each stage needs less memory per rank than the one before, here.
static_assert(plan<Run<3, 4>>().peak_bytes() < plan<Run<2, 4>>().peak_bytes());
static_assert(plan<Run<2, 4>>().peak_bytes() < plan<Run<1, 4>>().peak_bytes());
static_assert(plan<Run<1, 4>>().peak_bytes() < plan<Run<0, 4>>().peak_bytes());

// Padding: on 3 ranks a parameter of E elements is cut into shards of
// ceil(E / 3) elements rounded up to 256 (whole blocks of AdamW8bit's
// quantization), the last rank's shard padded past E.
constexpr int64_t shard3(int64_t e) { return (e / 3 + (e % 3 != 0) + 255) / 256 * 256; }
static_assert(shard3(1024 * 1024) == 349'696 && shard3(1024 * 2048) == 699'136 && shard3(1024) == 512);
// 1024 x 1024: embedding, 4 x 2 attention projections, LM head; 1024 x 2048: 3 x 2 MLP projections; 5 norms
constexpr int64_t shards3 = 10 * shard3(1024 * 1024) + 6 * shard3(1024 * 2048) + 5 * shard3(1024);
static_assert(plan<Run<1, 3>>().bytes(Role::optimizer_state) == 8 * shards3);
static_assert(plan<Run<1, 3>>().bytes(Role::weights) == 2 * 3 * shards3);  // whole and padded, for the all-gather
static_assert(plan<Run<3, 3>>().bytes(Role::weights) == 2 * shards3);

}  // namespace
