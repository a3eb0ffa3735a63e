// A Llama config whose head count (3) does not divide the width (256).
// expect-gcc: Llama: the number of heads (3) must divide the model width (256)
// expect-clang: headroom::diag::values<3, 256>::hold<false>
// expect-clang: Llama: the number of heads ({}) must divide the model width ({})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr models::LlamaConfig bad{256, 256, 768, 2, 3, 3, 512, false};
using R = Train<models::Llama<bad>, Batch<1>, Seq<16>>;
constexpr auto p = plan<R>();
