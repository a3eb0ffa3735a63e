// ZeRO has stages 0 to 3.
// expect-gcc: ZeRO<S>: S is the stage, 0 (nothing sharded) to 3 (optimizer states, gradients and parameters sharded); it is 4
// expect-clang: S is the stage, 0 (nothing sharded) to 3
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, DataParallel<2>, ZeRO<4>>;
constexpr auto p = plan<R>();
