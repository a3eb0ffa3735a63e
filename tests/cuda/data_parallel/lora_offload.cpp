// LoRA under tensor parallelism and Offloaded blocks in pipeline stages on
// the CUDA engine, each against one process given the same batches
// (compare.hpp; each process a rank: ranks.hpp):
//  - cuda::Trainer of a TensorParallel<2> Llama and GPT-2 with LoRA beside
//    every projection: beside a column-parallel one (q, k, v, gate, up;
//    GPT-2's fused c_attn and c_fc) A whole and B's rows split, beside a
//    row-parallel one (o, down; attn.c_proj, mlp.c_proj, their biases added
//    once) A's columns split and B whole. The matrix every rank holds whole
//    gets a partial gradient on each, summed over the group before the
//    update (ParamSlot::tensor_partial), so each rank's copy stays the one
//    process's.
//  - cuda::Trainer of each stage of a PipelineParallel<2> Llama with every
//    block Offloaded, 4 micro-batches under 1F1B: an offload or prefetch copy
//    reaches the host copy of the micro-batch in flight (CopyStep::host_stride;
//    the first stage has 2 in flight), eager and replaying a CUDA graph.
#include "../support/kernel_test.hpp"

#include <cstdint>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>

#include "compare.hpp"
#include "ranks.hpp"

namespace {

using namespace headroom;
using cuda_test::Batches;
using cuda_test::compare_ranks;
using cuda_test::parallel_run;
using cuda_test::RankReport;
using cuda_test::reference_run;

// ---- LoRA beside every projection, TensorParallel<2> ----------------------------------------------------------
constexpr models::LlamaConfig llama_tp{48, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions
constexpr models::GPT2Config gpt2_tp{48, 64, 2, 4, 32};                     // vocab (split in 2), d, layers, heads, positions
using LlamaLora = models::Llama<llama_tp, Apply<LoRA<4>, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;
using Gpt2Lora = models::GPT2<gpt2_tp, Apply<LoRA<4>, On<c_attn, attn_c_proj, c_fc, mlp_c_proj>>>;
constexpr std::int64_t global_batch = 4;
constexpr Batches whole_batches{.vocab = 48, .seq = 12, .rows = global_batch};  // 4 sequences of 12 tokens a step

template <class Model>
using OneRank = cuda::Trainer<Train<Model, Batch<global_batch>, Seq<whole_batches.seq>, SGD<>, OnCuda>>;
template <class Model>
using Tensor2 = Train<Model, Batch<global_batch>, Seq<whole_batches.seq>, SGD<>, OnCuda, TensorParallel<2>>;

// The adapter matrices every rank holds whole, their gradients summed over
// the 2 ranks once a step (f32), counted by hand: per Llama block A of q, k,
// v, gate, up (4 x 64 each) and B of o, down (64 x 4 each); per GPT-2 block
// A of c_attn, c_fc and B of attn.c_proj, mlp.c_proj.
static_assert(plan<Tensor2<LlamaLora>>().communication.tensor_grad_all_reduce == 2 * 7 * 256 * 4);
static_assert(plan<Tensor2<Gpt2Lora>>().communication.tensor_grad_all_reduce == 2 * 4 * 256 * 4);

template <class Model>
void tensor_parallel_trains_like_one_rank(bool graph) {
  compare_ranks<Tensor2<Model>>(reference_run<OneRank<Model>>(whole_batches), parallel_run<OneRank<Model>, Tensor2<Model>>(whole_batches, graph));
}

// ---- every block Offloaded, PipelineParallel<2> -----------------------------------------------------------------
constexpr models::LlamaConfig llama_pp{48, 64, 128, 4, 4, 2, 64, false};  // 4 blocks: 2 per stage
using Llama = models::Llama<llama_pp>;
// every block's activations to host memory after its forward, back before its backward
using OffloadedLlama = models::Llama<llama_pp, Apply<Offloaded<>, EveryBlock>>;
constexpr std::int64_t batch = 2;
constexpr int micro = 4;
constexpr Batches micro_batches{.vocab = 48, .seq = 12, .rows = batch, .micro = micro};  // 4 micro-batches of 2 sequences a step

// the one process does not offload: offloading changes where the activations wait, not what is computed
using OneProcess = cuda::Trainer<Train<Llama, Batch<batch>, Seq<micro_batches.seq>, Accumulate<micro>, SGD<>, OnCuda>>;
template <class Model>
using Pipelined = Train<Model, Batch<batch>, Seq<micro_batches.seq>, Accumulate<micro>, SGD<>, OnCuda, PipelineParallel<2>>;

// The first stage has 2 micro-batches in flight under 1F1B, the last 1: the
// offload tier holds that many copies of a micro-batch's offloaded
// activations (the one process offloads each block's, half of them on each stage).
constexpr std::int64_t offloaded_bytes =
    plan<Train<OffloadedLlama, Batch<batch>, Seq<micro_batches.seq>, Accumulate<micro>, SGD<>, OnCuda>>().bytes(Role::saved_activation,
                                                                                                              Tier::offload) / 2;
static_assert(offloaded_bytes > 0);
static_assert(plan<pipeline_stage<Pipelined<OffloadedLlama>, 0>>().bytes(Role::saved_activation, Tier::offload) == 2 * offloaded_bytes);
static_assert(plan<pipeline_stage<Pipelined<OffloadedLlama>, 1>>().bytes(Role::saved_activation, Tier::offload) == offloaded_bytes);

}  // namespace

TEST_CASE("cuda::Trainer tensor-parallel: a TensorParallel<2> Llama with LoRA beside every projection trains like one rank",
          "[tensor_parallel][lora]") {
  SECTION("eager") { tensor_parallel_trains_like_one_rank<LlamaLora>(false); }
  SECTION("CUDA graph") { tensor_parallel_trains_like_one_rank<LlamaLora>(true); }
}

TEST_CASE("cuda::Trainer tensor-parallel: a TensorParallel<2> GPT-2 with LoRA beside c_attn, attn.c_proj, c_fc and "
          "mlp.c_proj (row-parallel biases) trains like one rank",
          "[tensor_parallel][lora]") {
  tensor_parallel_trains_like_one_rank<Gpt2Lora>(false);
}

TEST_CASE("cuda::Trainer pipeline-parallel: every block Offloaded on 2 stages trains like one process", "[pipeline_parallel][offload]") {
  const RankReport one = reference_run<OneProcess>(micro_batches);
  SECTION("eager") { compare_ranks<Pipelined<OffloadedLlama>>(one, parallel_run<OneProcess, Pipelined<OffloadedLlama>>(micro_batches)); }
  SECTION("CUDA graph") {
    compare_ranks<Pipelined<OffloadedLlama>>(one, parallel_run<OneProcess, Pipelined<OffloadedLlama>>(micro_batches, true));
  }
}
