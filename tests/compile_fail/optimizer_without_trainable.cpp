// A frozen model under an optimizer: nothing would ever change (the loss
// stays constant, the gradient norm 0).
// expect-gcc: Train<Model, ...>: the optimizer has nothing to train: the model has 0 trainable parameters of 3279104
// expect-clang: headroom::diag::values<0, 3279104>::hold<false>
// expect-clang: Train<Model, ...>: the optimizer has nothing to train: the model has {} trainable parameters of {}
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<Frozen<models::Llama<models::tiny_llama>>, Batch<1>, Seq<16>, AdamW>;
constexpr auto p = plan<R>();
