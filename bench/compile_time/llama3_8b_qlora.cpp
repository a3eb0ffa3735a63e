// Compile-time benchmark input: the plan of Llama-3-8B QLoRA (NF4 base,
// LoRA r=16 on all projections, checkpointed blocks, AdamW8bit, BF16).
#include <headroom/headroom.hpp>
using namespace headroom;
using QLoRA = Quantized<NF4, LoRA<16>>;
using Model = models::Llama<models::llama3_8b, Apply<QLoRA, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>,
                            Apply<Checkpointed<>, EveryBlock>>;
using BenchRun = Train<Model, Batch<1>, Seq<2048>, AdamW8bit, Precision<BF16>>;
constexpr auto p = plan<BenchRun>();
static_assert(p.valid() && p.peak_bytes() <= 24_GiB);
int main() { return p.peak_bytes() > 0 ? 0 : 1; }
