// UpdateInBackward would update with a gradient not yet averaged over the ranks.
// expect-gcc: Train<Model, ...>: UpdateInBackward updates each parameter inside its backward, before its gradient is averaged over the 4 data-parallel ranks; drop one of them
// expect-clang: UpdateInBackward updates each parameter inside its backward, before its gradient is averaged over the
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, UpdateInBackward, DataParallel<4>>;
constexpr auto p = plan<R>();
