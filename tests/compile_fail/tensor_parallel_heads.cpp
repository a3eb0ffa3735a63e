// GPT-2 124M has 12 heads: 8 tensor-parallel ranks cannot share them equally.
// expect-gcc: Train<Model, TensorParallel<8>>: each rank takes an equal share of the heads of every attention layer, but 12 query heads and 12 KV heads do not both divide by 8
// expect-clang: headroom::diag::values<8, 12, 12, 8>::hold<false>
// expect-clang: each rank takes an equal share of the heads of every attention layer, but {} query heads and {} KV heads do not both divide by {}
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr models::GPT2Config padded{50304, 768, 12, 12, 1024};
using R = Train<models::GPT2<padded>, Batch<1>, Seq<64>, TensorParallel<8>>;
constexpr auto p = plan<R>();
