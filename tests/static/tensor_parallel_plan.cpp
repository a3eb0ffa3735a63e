// One tensor-parallel rank's plan (TensorParallel<t>), pinned to figures
// derived by hand.
//
// Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation
// in Large Transformer Models", section 4.1) count, per GPT layer with
// 16-bit activations, s b h (34 + 5 a s / h) bytes, and under t-way tensor
// parallelism without sequence parallelism
//     s b h (10 + 24 / t + 5 a s / (h t)) bytes,
// where the 24 / t are the split tensors (Q and K 4, V 2, the output
// projection's input 2, GeLU's input 8 and output 8), the 10 the replicated
// ones (the two LayerNorm inputs 4, the QKV and first MLP inputs 2 each,
// two dropout masks 2) and 5 a s / (h t) the attention scores (softmax 2,
// its dropout mask 1 and output 2, per a s^2 b). In elements: replicated
// 4 h, split 12 h / t, scores 5 a s / 2 per token / t.
// This library stores f32 elements, has no dropout (the masks go), keeps
// each LayerNorm's mean and 1 / std (2 per token each), and, like
// FlashAttention, no a s^2 b scores: one log-sum-exp per head and token
// (a / t per token) instead. Per layer, in elements:
//     s b (4 h + 4 + (12 h + a) / t)
// plus, outside the layers, the final LayerNorm's input and statistics
// s b (h + 2) (the fused LM head loss keeps nothing for backward).
//
// Parameters: Megatron's split leaves the LayerNorms, the row-parallel
// projections' biases and the positions whole on every rank, and divides
// the rest by t. Communication: 2 all-reduces per layer in forward and 2 in
// backward (Shoeybi et al. 2019, figure 4), one more each for the
// vocabulary-parallel embedding (forward) and LM head input (backward), of
// s b h elements each; the LM head gathers 3 statistics per token and rank.
// LoRA adapters beside the split projections: at the end.
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

constexpr int64_t V = 1024, h = 256, L = 2, a = 8, P = 128, s = 64, b = 2;
constexpr models::GPT2Config gpt{V, h, L, a, P};
template <int T, class... More>
using Run = Train<models::GPT2<gpt>, Batch<b>, Seq<s>, SGD<>, TensorParallel<T>, More...>;

template <int T>
constexpr int64_t saved_activations = 4 * (L * s * b * (4 * h + 4 + (12 * h + a) / T) + s * b * (h + 2));
static_assert(plan<Run<1>>().bytes(Role::saved_activation) == saved_activations<1>);
static_assert(plan<Run<2>>().bytes(Role::saved_activation) == saved_activations<2>);
static_assert(plan<Run<4>>().bytes(Role::saved_activation) == saved_activations<4>);
static_assert(plan<Run<8>>().bytes(Role::saved_activation) == saved_activations<8>);

// f32 parameters per rank: split ones / t, the rest whole
template <int T>
constexpr int64_t weights =
    4 * ((V * h + L * (3 * h * h + 3 * h + h * h + 4 * h * h + 4 * h + 4 * h * h)) / T  // wte, c_attn, attn.c_proj, c_fc, mlp.c_proj
         + P * h + L * (2 * h + h + 2 * h + h) + 2 * h);  // wpe; ln_1, attn.c_proj.bias, ln_2, mlp.c_proj.bias; ln_f
static_assert(plan<Run<1>>().bytes(Role::weights) == weights<1>);
static_assert(plan<Run<2>>().bytes(Role::weights) == weights<2>);
static_assert(plan<Run<4>>().bytes(Role::weights) == weights<4>);
static_assert(plan<Run<4>>().bytes(Role::grads) == weights<4>);  // SGD: a gradient per weight
static_assert(plan<Run<4>>().bytes(Role::optimizer_state) == weights<4>);  // and one momentum

// per step, over the tensor-parallel group
template <int T>
constexpr Communication tp_exchange = plan<Run<T>>().communication;
static_assert(tp_exchange<4>.tensor_all_reduce_calls == 4 * L + 2);
static_assert(tp_exchange<4>.tensor_all_reduce == (4 * L + 2) * s * b * h * 4);
static_assert(tp_exchange<4>.tensor_all_gather_calls == 1);  // s b = 128 tokens: one chunk of 256
static_assert(tp_exchange<4>.tensor_all_gather == 4 * (s * b) * 3 * 4);
static_assert(tp_exchange<4>.payload() == 0);
static_assert(plan<Run<1>>().communication.tensor_payload() == 0);

// With DataParallel<2> and ZeRO<1> beside it, each tensor-parallel rank's
// optimizer state is sharded over its 2 data-parallel ranks.
static_assert(plan<Run<4, DataParallel<2>, ZeRO<1>>>().bytes(Role::optimizer_state) < weights<4>);
static_assert(plan<Run<4, DataParallel<2>, ZeRO<1>>>().bytes(Role::optimizer_state) >= weights<4> / 2);

// LoRA<r> beside every projection (policies/lora.hpp): beside a
// column-parallel one (c_attn, c_fc) A (r, in) is whole and B's rows split
// (out / t, r); beside a row-parallel one (attn.c_proj, mlp.c_proj) A's
// columns split (r, in / t) and B (out, r) whole. Per layer and rank:
// whole A of c_attn and c_fc, B of both c_proj (4 r h), split B of c_attn
// (3 h r / t) and c_fc (4 h r / t), A of attn.c_proj (r h / t) and
// mlp.c_proj (4 h r / t): r h (4 + 12 / t) trainable values, each with its
// gradient; the whole ones' gradients (partial sums on each rank) summed
// over the group once per step.
constexpr int64_t r = 8;
template <int T>
using LoraRun = Train<models::GPT2<gpt, Apply<LoRA<r>, On<c_attn, attn_c_proj, c_fc, mlp_c_proj>>>, Batch<b>, Seq<s>, SGD<>,
                      TensorParallel<T>>;
template <int T>
constexpr int64_t adapters = 4 * L * r * h * (4 + 12 / T);
static_assert(plan<LoraRun<1>>().bytes(Role::grads) == adapters<1>);
static_assert(plan<LoraRun<2>>().bytes(Role::grads) == adapters<2>);
static_assert(plan<LoraRun<4>>().bytes(Role::grads) == adapters<4>);
static_assert(plan<LoraRun<4>>().communication.tensor_grad_all_reduce == 4 * L * 4 * r * h);
static_assert(plan<LoraRun<4>>().communication.tensor_grad_all_reduce_calls == 4 * L);
static_assert(plan<LoraRun<1>>().communication.tensor_grad_all_reduce == 0);
// no collective of their own in forward and backward: the base's sums carry them
static_assert(plan<LoraRun<4>>().communication.tensor_all_reduce == tp_exchange<4>.tensor_all_reduce);

}  // namespace
