// LoRA adapters are not split over tensor-parallel ranks yet.
// expect-gcc: Train<Model, TensorParallel<2>>: LoRA adapters are not split over tensor-parallel ranks yet; train the adapters with DataParallel<N> alone
// expect-clang: LoRA adapters are not split over tensor-parallel ranks yet
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama, Apply<LoRA<8>, On<q_proj, v_proj>>>, Batch<1>, Seq<64>, TensorParallel<2>>;
constexpr auto p = plan<R>();
