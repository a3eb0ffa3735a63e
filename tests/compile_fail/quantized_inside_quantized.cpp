// Two Applys quantize q_proj: NF4 first, then Int8 (with an adapter) around it.
// expect-gcc: Quantized<Q, L>: L is already quantized (NF4 inside Int8); a weight is stored in one format
// expect-clang: headroom::diag::values<&headroom::NormalFloat4<64, false>::name, &headroom::BlockInt<8, 64>::name>::hold<false>
// expect-clang: Quantized<Q, L>: L is already quantized ({} inside {}); a weight is stored in one format
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::Llama<models::tiny_llama, Apply<Quantized<NF4>, On<q_proj>>, Apply<Quantized<Int8, LoRA<8>>, On<q_proj>>>;
using R = Train<M, Batch<1>, Seq<16>>;
constexpr auto p = plan<R>();
