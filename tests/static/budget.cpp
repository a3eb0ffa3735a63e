// Budget assertions, the way a user writes them: full fine-tuning of
// Llama-3-8B does not fit a 24 GiB card; QLoRA (NF4, LoRA r=16 on all seven
// projections, 8-bit AdamW, BF16, checkpointed blocks) does.
// (tests/compile_fail/budget_full_8b.cpp shows the failing assertion's message.)
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

constexpr int64_t llama3_8b_params = 8'030'261'248;  // meta-llama/Meta-Llama-3-8B, as published

// ---- full fine-tuning --------------------------------------------------------
using Full = Train<models::Llama<models::llama3_8b>, Batch<1>, Seq<2048>, Precision<BF16>, AdamW>;
constexpr auto full = plan<Full>();
static_assert(full.peak_bytes() > 24_GiB);
// By hand, per parameter: bf16 weight 2 B + f32 master 4 B + AdamW moments 8 B
// are alive the whole step, and at the update every bf16 grad (2 B) too:
// 16 B x 8,030,261,248 = 128,484,179,968 B (119.7 GiB) before any activation.
static_assert(full.lower_bound() >= 16 * llama3_8b_params);
static_assert(full.peak_bytes() >= full.lower_bound());
static_assert(full.peak_bytes() * 100 <= full.lower_bound() * 105);
static_assert(full.bytes(Role::weights) == 2 * llama3_8b_params);
static_assert(full.bytes(Role::master_weights) == 4 * llama3_8b_params);
static_assert(full.bytes(Role::grads) == 2 * llama3_8b_params);
static_assert(full.bytes(Role::optimizer_state) == 8 * llama3_8b_params);

// ---- QLoRA ---------------------------------------------------------------------
using QLoRA = Quantized<NF4, LoRA<16>>;
using Model = models::Llama<models::llama3_8b, Apply<QLoRA, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>,
                            Apply<Checkpointed<>, EveryBlock>>;
using Run = Train<Model, Batch<1>, Seq<2048>, Precision<BF16>, AdamW8bit>;
constexpr auto qlora = plan<Run>();
static_assert(qlora.peak_bytes() <= 24_GiB, "QLoRA of Llama-3-8B must fit a 24 GiB card");
static_assert(qlora.peak_bytes() >= qlora.lower_bound());
static_assert(qlora.peak_bytes() * 100 <= qlora.lower_bound() * 105);
static_assert(qlora.trainable_parameters() == 41'943'040);  // PEFT's figure for r=16 on all 7 projections
// By hand: 32 layers x 218,103,808 projection elements in NF4 (half a byte each,
// one f32 absmax per 64), embed_tokens and lm_head in bf16, 65 bf16 RMSNorm
// weights of 4096, the bf16 adapters; all of them multiples of 256 bytes.
constexpr int64_t proj = 32 * 218'103'808LL;
static_assert(qlora.bytes(Role::weights) == proj / 2 + 2 * (2 * 128256LL * 4096) + 65 * 4096 * 2 + 2 * 41'943'040LL);
static_assert(qlora.bytes(Role::quant_scales) == proj / 64 * 4 + 256);  // + the 16 NF4 code values (64 B -> 256)
static_assert(qlora.bytes(Role::master_weights) == 4 * 41'943'040LL);
static_assert(qlora.bytes(Role::grads) == 2 * 41'943'040LL);
// What must be resident at the update, a floor for the peak:
static_assert(qlora.lower_bound() >= proj / 2 + proj / 64 * 4 + 2 * (2 * 128256LL * 4096) + 8 * 41'943'040LL);

// The GEMM packing panels of one worker (GemmBlocking: kc 256, mc 192, nc
// 1024; every model dimension here is >= 1024), in f32 (the compute type of a
// bf16 run): (256 x 192 + 256 x 1024) x 4 B = 1,245,184 B, alive the whole step.
template <class P>
constexpr int64_t gemm_panels(const P& p) {
  for (const auto& b : p.buffers)
    if (b.name == "gemm panels") return b.size;
  return -1;
}
static_assert(gemm_panels(full) == (256 * 192 + 256 * 1024) * 4);
static_assert(gemm_panels(qlora) == (256 * 192 + 256 * 1024) * 4);

// The figures the docs quote (getting-started.md, memory-model.md, README):
// update them together if packing or a layer's declaration changes.
static_assert(full.peak_bytes() == 128'502'210'816);  // 119.68 GiB, 16.0022 B per parameter
static_assert(qlora.peak_bytes() == 7'307'291'136);   // 6.81 GiB

// One code-table buffer serves the model: with NF4 (16 code values, 64 B)
// and NF4DQ (the same 16 + the 256-entry dynamic map of its absmax codes,
// 1,088 B) in one model it is sized for NF4DQ, whichever comes first.
template <class P>
constexpr int64_t code_tables(const P& p) {
  for (const auto& b : p.buffers)
    if (b.name == "code tables") return b.size;
  return -1;
}
using Mixed = models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<8>>, On<q_proj, k_proj>>,
                            Apply<Quantized<NF4DQ, LoRA<8>>, On<v_proj, o_proj>>>;
static_assert(code_tables(plan<Train<Mixed, Batch<1>, Seq<16>, AdamW>>()) >= (16 + 256) * 4);
static_assert(code_tables(qlora) >= 16 * 4 && code_tables(qlora) < (16 + 256) * 4);  // NF4 alone

}  // namespace
