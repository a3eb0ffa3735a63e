// Built with nvcc against an installed headroom by the consumer_package test
// (when a CUDA compiler is found): the Llama-3-8B QLoRA plan evaluated under
// nvcc with nothing but what headroom::headroom carries (C++20, nvcc's and the
// host compiler's constant-evaluation limits).
#include <headroom/headroom.hpp>

#include <cstdio>

using namespace headroom;

using QLoRA = Quantized<NF4, LoRA<16>>;
using Model = models::Llama<models::llama3_8b,
                            Apply<QLoRA, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>,
                            Apply<Checkpointed<>, EveryBlock>>;
using QLoRARun = Train<Model, Batch<1>, Seq<2048>, Precision<BF16>, AdamW8bit, OnCuda>;

static constexpr auto p = plan<QLoRARun>();
static_assert(p.valid());
static_assert(p.peak_bytes() <= 24_GiB, "QLoRA 8B must fit a 24 GiB card");

int main() {
  std::printf("headroom consumer (CUDA): Llama-3-8B QLoRA plans %.2f GiB on the device\n",
              static_cast<double>(p.peak_bytes()) / static_cast<double>(1_GiB));
  return 0;
}
