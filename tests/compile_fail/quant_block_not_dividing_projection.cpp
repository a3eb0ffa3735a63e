// NF4 on every Llama projection, where down_proj's rows (the MLP width, 96)
// are not a multiple of NF4's block of 64: the message names the projection.
// expect-gcc: Quantized<NF4> on down_proj: the quantization block size (64) must divide the row length (in_features) of down_proj (96)
// expect-clang: Quantized<{}> on {}: the quantization block size ({}) must divide the row length (in_features) of {} ({})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr models::LlamaConfig cfg{256, 64, 96, 2, 4, 2, 64, false};
using Model = models::Llama<cfg, Apply<Quantized<NF4>, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;
constexpr auto n = sizeof(Model::mlp);
