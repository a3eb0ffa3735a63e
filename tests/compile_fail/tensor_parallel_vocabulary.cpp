// GPT-2's 50257-token vocabulary does not split over 2 ranks (padding it to 50304 does).
// expect-gcc: Train<Model, TensorParallel<2>>: each rank takes an equal share of the vocabulary of the embedding and LM head, but 50257 rows do not divide by 2; pad the vocabulary to a multiple of 2
// expect-clang: headroom::diag::values<2, 50257, 2, 2>::hold<false>
// expect-clang: each rank takes an equal share of the vocabulary of the embedding and LM head, but {} rows do not divide by {}
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::GPT2<models::gpt2_124m>, Batch<1>, Seq<64>, TensorParallel<2>>;
constexpr auto p = plan<R>();
