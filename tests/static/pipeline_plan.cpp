// One pipeline stage's plan (PipelineParallel<S>), pinned to figures
// derived by hand from the one-process plan of the same model.
//
// A stage holds L / S blocks (the first also the embedding, the last the
// final norm and the LM head), so its parameters are the model's split so.
// Under 1F1B (Narayanan et al. 2021) stage s has min(S - s, K) of the K
// micro-batches of a step in flight: what a micro-batch's forward keeps for
// its backward (the saved activations, and on the first stage the token
// ids) exists once per micro-batch in flight, so stage s keeps
// min(S - s, K) times one micro-batch's saved activations of its blocks.
// The first stage keeps the most (S copies of L / S blocks): about the
// whole model's activations for one micro-batch, as the paper notes. A
// tied LM head's table is held by the first and the last stage (GPT-2, at
// the end).
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

constexpr int64_t V = 512, h = 128, F = 256, L = 8, s = 64, b = 2;
constexpr models::LlamaConfig cfg{V, h, F, L, 4, 4, 128, false};
using M = models::Llama<cfg>;
template <int S, int K>
using Run = Train<M, Batch<b>, Seq<s>, Accumulate<K>, SGD<>, PipelineParallel<S>>;
using One = Train<M, Batch<b>, Seq<s>, SGD<>>;

// f32 parameters: per block 2 norms and 4 h^2 + 3 h F of projections; the
// embedding and the LM head V h each, the final norm h
constexpr int64_t block = 2 * h + 4 * h * h + 3 * h * F;
static_assert(plan<One>().bytes(Role::weights) == 4 * (L * block + 2 * V * h + h));
static_assert(plan<pipeline_stage<Run<4, 4>, 0>>().bytes(Role::weights) == 4 * (L / 4 * block + V * h));
static_assert(plan<pipeline_stage<Run<4, 4>, 1>>().bytes(Role::weights) == 4 * (L / 4 * block));
static_assert(plan<pipeline_stage<Run<4, 4>, 3>>().bytes(Role::weights) == 4 * (L / 4 * block + V * h + h));

// Saved activations of one Llama block for one micro-batch of N = b s
// tokens, in f32 elements per token (what its ops keep for backward): its
// input (the residual stream, read by the first RMSNorm) and 1 / rms, the
// normed input (read by q, k and v), q, k, v and the attention output (h
// each) and one log-sum-exp per head (4), the residual after attention and
// 1 / rms, the normed MLP input, gate and up outputs (F each) and down's
// input (F): 8 h + 3 F + 6. A stage before the last also keeps its output
// until the gradient comes back (N h); the last keeps the final norm's
// input and 1 / rms (N (h + 1)).
constexpr int64_t N = b * s;
constexpr int64_t per_block = N * (8 * h + 3 * F + 6);
static_assert(plan<One>().bytes(Role::saved_activation) == 4 * (L * per_block + N * (h + 1)));
// stage s keeps min(S - s, K) copies of its L / S blocks' (and its output's)
constexpr int64_t stage_copy = 4 * (L / 4 * per_block + N * h);
static_assert(plan<pipeline_stage<Run<4, 4>, 0>>().bytes(Role::saved_activation) == 4 * stage_copy);
static_assert(plan<pipeline_stage<Run<4, 4>, 1>>().bytes(Role::saved_activation) == 3 * stage_copy);
static_assert(plan<pipeline_stage<Run<4, 4>, 2>>().bytes(Role::saved_activation) == 2 * stage_copy);
static_assert(plan<pipeline_stage<Run<4, 4>, 3>>().bytes(Role::saved_activation) == 4 * (L / 4 * per_block + N * (h + 1)));
static_assert(plan<pipeline_stage<Run<4, 2>, 1>>().bytes(Role::saved_activation) == 2 * stage_copy);  // K = 2
static_assert(plan<pipeline_stage<Run<4, 1>, 1>>().bytes(Role::saved_activation) == 1 * stage_copy);  // K = 1

// No collective: stages exchange point to point, per micro-batch its input
// and output (N h elements each) and their gradients: a middle stage sends
// its output and its input's gradient, K times a step; the first stage only
// the output, the last only the input's gradient.
static_assert(plan<pipeline_stage<Run<4, 4>, 1>>().communication.payload() == 0);
static_assert(plan<pipeline_stage<Run<4, 4>, 1>>().communication.pipeline_sent == 4 * 2 * N * h * 4);
static_assert(plan<pipeline_stage<Run<4, 4>, 1>>().communication.pipeline_received == 4 * 2 * N * h * 4);
static_assert(plan<pipeline_stage<Run<4, 4>, 0>>().communication.pipeline_sent == 4 * N * h * 4);
static_assert(plan<pipeline_stage<Run<4, 4>, 3>>().communication.pipeline_sent == 4 * N * h * 4);
static_assert(plan<One>().communication.pipeline_sent == 0);

// plan<Run>() is the stage with the largest peak: the first here (S copies
// of its activations, and the embedding)
static_assert(plan<Run<4, 4>>().config.stage == 0);
static_assert(plan<Run<4, 4>>().peak_bytes() == plan<pipeline_stage<Run<4, 4>, 0>>().peak_bytes());
static_assert(plan<Run<4, 4>>().peak_bytes() > plan<pipeline_stage<Run<4, 4>, 3>>().peak_bytes());

// An LM head tied to the embedding table (GPT-2): the first stage holds wte
// for the embedding, the last a copy of it for the head (with its gradient
// and optimizer state, as any parameter), and before the update the two sum
// their gradients of it: V h f32 values each way, once per step; with
// ZeRO<2> over D data-parallel ranks, each rank's shard, ceil(V h / D)
// rounded up to 256 elements. GPT-2 f32 parameters per block: 2 LayerNorms
// (2 h each), c_attn (3 h^2 + 3 h), attn c_proj (h^2 + h), c_fc (4 h^2 +
// 4 h), mlp c_proj (4 h^2 + h): 12 h^2 + 13 h; wpe P h, ln_f 2 h.
constexpr int64_t P = 128;
constexpr models::GPT2Config gpt2_cfg{V, h, L, 4, P};
using G = models::GPT2<gpt2_cfg>;
template <int S, class... More>
using GRun = Train<G, Batch<b>, Seq<s>, Accumulate<4>, AdamW, PipelineParallel<S>, More...>;
constexpr int64_t gpt2_block = 12 * h * h + 13 * h;
static_assert(plan<Train<G, Batch<b>, Seq<s>, AdamW>>().bytes(Role::weights) == 4 * (L * gpt2_block + V * h + P * h + 2 * h));
static_assert(plan<pipeline_stage<GRun<2>, 0>>().bytes(Role::weights) == 4 * (L / 2 * gpt2_block + V * h + P * h));
static_assert(plan<pipeline_stage<GRun<2>, 1>>().bytes(Role::weights) == 4 * (L / 2 * gpt2_block + V * h + 2 * h));
static_assert(plan<pipeline_stage<GRun<4>, 1>>().bytes(Role::weights) == 4 * (L / 4 * gpt2_block));  // no copy between
// AdamW's two moments per value, of the copy too
static_assert(plan<pipeline_stage<GRun<2>, 1>>().bytes(Role::optimizer_state) == 2 * 4 * (L / 2 * gpt2_block + V * h + 2 * h));
static_assert(plan<pipeline_stage<GRun<2>, 0>>().communication.stage_all_reduce == V * h * 4);
static_assert(plan<pipeline_stage<GRun<2>, 1>>().communication.stage_all_reduce == V * h * 4);
static_assert(plan<pipeline_stage<GRun<2>, 1>>().communication.stage_all_reduce_calls == 1);
static_assert(plan<pipeline_stage<GRun<4>, 0>>().communication.stage_all_reduce == V * h * 4);
static_assert(plan<pipeline_stage<GRun<4>, 2>>().communication.stage_all_reduce == 0);
static_assert(plan<pipeline_stage<GRun<4>, 3>>().communication.stage_all_reduce == V * h * 4);
static_assert(plan<pipeline_stage<GRun<2, DataParallel<3>, ZeRO<2>>, 1>>().communication.stage_all_reduce ==
              (V * h / 3 + 255) / 256 * 256 * 4);  // 65,536 / 3 -> 21,846 -> 22,016 elements
static_assert(plan<Train<G, Batch<b>, Seq<s>, AdamW>>().communication.stage_all_reduce == 0);

}  // namespace
