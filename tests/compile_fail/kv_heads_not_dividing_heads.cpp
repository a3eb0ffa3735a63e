// A Llama config with 4 heads and 3 KV heads: GQA needs KV heads | heads.
// expect-gcc: Attention<D, Heads, KVHeads, ...>: KV heads (3) must divide the number of heads (4) (GQA)
// expect-clang: headroom::diag::values<3, 4>::hold<false>
// expect-clang: Attention<D, Heads, KVHeads, ...>: KV heads ({}) must divide the number of heads ({}) (GQA)
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr models::LlamaConfig bad{256, 256, 768, 2, 4, 3, 512, false};
using R = Train<models::Llama<bad>, Batch<1>, Seq<16>>;
constexpr auto p = plan<R>();
