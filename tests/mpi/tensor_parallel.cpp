// Tensor parallelism (ctest mpi.tensor_parallel.np2 / .np4): TensorParallel<2>
// trains like one process on the same batch (losses within 1e-5 relative
// over 10 steps, every rank's block of every weight equal to the same
// elements of the one-process weights to float rounding), for Llama
// (separate q, k, v; GQA; SwiGLU; untied LM head) and GPT-2 (fused c_attn
// split head by head; biases, the row-parallel ones added once; learned
// positions; tied vocabulary-parallel embedding); a step exchanges exactly
// what the plan counts; on 4 ranks, DataParallel<2> x TensorParallel<2> with
// ZeRO 1 trains like one process on the global batch; both layouts resume
// bit-identically from their checkpoint and refuse another layout's; the
// consolidated export equals the one-process save_pretrained. LoRA beside
// every projection (Llama; GPT-2 with its fused c_attn and row-parallel
// biases) trains like one process too, on 2 ranks and with ZeRO 2 on 2 x 2,
// sums exactly the adapter gradients the plan counts, and exports the
// one-process PEFT adapter.
//
// The one-process reference runs on every rank beside its parallel trainer.
#include <catch2/catch.hpp>

#include <headroom/headroom.hpp>
#include <headroom/host/mpi.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/io/consolidated.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/io/peft.hpp>
#include <headroom/train/host/counting_communicator.hpp>
#include <headroom/train/host/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../runtime/support/fixtures.hpp"
#include "support/shared.hpp"

using namespace headroom;

namespace {
namespace fs = std::filesystem;
using headroom::test::file_difference;
using headroom::test::ids;
using headroom::test::SharedDir;

constexpr std::int64_t batch = 2, seq = 12;
constexpr models::LlamaConfig llama_tp{48, 64, 128, 2, 4, 2, 64, false};  // 4 heads, 2 KV heads, F 128
constexpr models::GPT2Config gpt2_tp{48, 64, 2, 4, 32};                     // 4 heads, F 256, tied wte
using Llama = models::Llama<llama_tp>;
// Qwen3's per-head q / k norms: each rank normalizes its heads with the whole
// gains and sums their partial gradients with the other's
constexpr models::LlamaConfig qwen3_tp{.vocab = 48, .dim = 64, .ffn = 128, .layers = 2, .heads = 4, .kv_heads = 2,
                                       .max_positions = 64, .arch = models::LlamaArch::qwen3, .head_dim = 24, .qk_norm = true};
using Qwen3 = models::Llama<qwen3_tp>;
using Gpt2 = models::GPT2<gpt2_tp>;
// LoRA beside every projection: column-parallel ones (A whole, B split) and
// row-parallel ones (A split, B whole; GPT-2's with their biases)
using LlamaLora = models::Llama<llama_tp, Apply<LoRA<4>, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;
using Gpt2Lora = models::GPT2<gpt2_tp, Apply<LoRA<4>, On<c_attn, attn_c_proj, c_fc, mlp_c_proj>>>;
// LoRA dropout (0.2): a row-parallel projection's rank holds columns of the
// adapter's input, and drops the elements the one-process run drops there
// (math::Dropout's col0 and width); column-parallel ranks share the whole mask
using LlamaLoraDrop =
    models::Llama<llama_tp, Apply<LoRA<4, Linear<>, Ratio<4>, Ratio<1, 5>>, On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>>>;
template <class M>
constexpr bool lora = std::is_same_v<M, LlamaLora> || std::is_same_v<M, Gpt2Lora> || std::is_same_v<M, LlamaLoraDrop>;

template <class M, class Opt = SGD<>, class... More>
using TensorParallelRun = Train<M, Batch<batch>, Seq<seq>, Opt, TensorParallel<2>, More...>;

// Parameters split over the ranks, counted by hand: Llama's q, k, v, o,
// gate, up and down per block, the embedding and the LM head; GPT-2's
// c_attn (weight and bias), attn.c_proj's weight, c_fc (weight and bias) and
// mlp.c_proj's weight per block, and wte (the LM head's too). With LoRA,
// one matrix of each adapter too (7 per Llama block, 4 per GPT-2 block).
template <class M>
constexpr int split_params = std::is_same_v<M, Llama> || std::is_same_v<M, Qwen3> ? 7 * 2 + 2
                             : std::is_same_v<M, LlamaLora> || std::is_same_v<M, LlamaLoraDrop> ? (7 + 7) * 2 + 2
                             : std::is_same_v<M, Gpt2>      ? 6 * 2 + 1
                                                            : (6 + 4) * 2 + 1;
// The LoRA matrices every rank holds whole, their gradients summed over the
// ranks once per step (f32): per Llama block A of q, k, v, gate, up (4 x 64
// each) and B of o, down (64 x 4 each); per GPT-2 block A of c_attn, c_fc
// (4 x 64) and B of attn.c_proj, mlp.c_proj (64 x 4).
// Qwen3's: per block the gains of q_norm and k_norm (24 each).
template <class M>
constexpr std::int64_t lora_summed_bytes = std::is_same_v<M, LlamaLora> ? 2 * 7 * 256 * 4
                                           : std::is_same_v<M, Gpt2Lora> ? 2 * 4 * 256 * 4
                                           : std::is_same_v<M, Qwen3>    ? 2 * 2 * 24 * 4
                                                                         : 0;
template <class M>
constexpr std::int64_t lora_summed_calls = std::is_same_v<M, LlamaLora> ? 2 * 7
                                           : std::is_same_v<M, Gpt2Lora> ? 2 * 4
                                           : std::is_same_v<M, Qwen3>    ? 2 * 2
                                                                         : 0;

host::TrainOptions options() { return {.seed = 7, .lr = 5e-2, .warmup_steps = 2, .total_steps = 10, .clip_norm = 1.0}; }

struct Batch_ {
  std::vector<std::int32_t> tokens, targets;
};
// Step s's batch of `sequences` sequences; `part` of `parts` equal parts of it.
Batch_ batch_of(int s, std::size_t sequences, int part = 0, int parts = 1) {
  const std::size_t n = sequences * seq, per = n / static_cast<std::size_t>(parts);
  const auto t = ids(n, static_cast<std::uint32_t>(100 * s), 48);
  const auto y = ids(n, static_cast<std::uint32_t>(100 * s + 50), 48);
  return {{t.begin() + part * per, t.begin() + (part + 1) * per}, {y.begin() + part * per, y.begin() + (part + 1) * per}};
}

// The largest difference between this rank's block (ZeRO 3 aside: whole
// blocks) of every parameter and the same elements of the one-process
// trainer's, found through the parameter's split.
template <class Tp, class One>
double weight_difference(const Tp& tp, const One& one, int split_expected) {
  double worst = 0;
  int split = 0;
  for (std::size_t k = 0; k < Tp::param_count; ++k) {
    const ParamSlot& p = Tp::param(k);
    const ParamSlot& q = One::param(k);
    REQUIRE(Tp::path_of(p) == One::path_of(q));
    REQUIRE(p.split.whole_rows(p.rows) == q.rows);
    REQUIRE(p.split.whole_cols(p.cols) == q.cols);
    split += p.split.split() && p.elements() < q.elements();
    const float* w = tp.weight(p);
    const float* v = one.weight(q);
    for (std::int64_t i = 0; i < p.elements(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(w[i] - v[p.split.whole_index(p.rows, p.cols, tp.tensor_rank(), i)])));
  }
  CHECK(split == split_expected);
  return worst;
}

// TensorParallel<2> against one process on the same batch, 10 steps.
template <class M>
void trains_like_one_process(host::Communicator& c) {
  using Tp = host::Trainer<TensorParallelRun<M>>;
  using One = host::Trainer<Train<M, Batch<batch>, Seq<seq>, SGD<>>>;
  Tp tp(options(), c);
  One one(options());
  REQUIRE(tp.tensor_rank() == c.rank());
  double worst = 0;
  for (int s = 1; s <= 10; ++s) {
    const Batch_ b = batch_of(s, batch);
    const StepStats a = tp.step(b.tokens, b.targets);
    const StepStats o = one.step(b.tokens, b.targets);
    worst = std::max(worst, std::abs(a.loss - o.loss) / std::abs(o.loss));
    CHECK(a.grad_norm == Approx(o.grad_norm).epsilon(1e-5));
  }
  INFO(M::kind << ", tensor-parallel rank " << tp.tensor_rank());
  CHECK(worst < 1e-5);
  CHECK(weight_difference(tp, one, split_params<M>) < 1e-6);
}

// What a step exchanges over the tensor-parallel group is what the plan says.
template <class M>
void exchanges_what_the_plan_says(host::Communicator& mpi) {
  using Tp = host::Trainer<TensorParallelRun<M>>;
  host::CountingCommunicator world(mpi);
  Tp tp(options(), world);
  auto* group = dynamic_cast<host::CountingCommunicator*>(tp.tensor_communicator());
  REQUIRE(group != nullptr);
  const Communication& planned = Tp::plan.communication;
  for (int s = 1; s <= 2; ++s) {
    group->reset();
    const Batch_ b = batch_of(s, batch);
    tp.step(b.tokens, b.targets);
    INFO(M::kind);
    CHECK(planned.tensor_grad_all_reduce == lora_summed_bytes<M>);
    CHECK(planned.tensor_grad_all_reduce_calls == lora_summed_calls<M>);
    CHECK(group->counted().all_reduce == planned.tensor_all_reduce + planned.tensor_grad_all_reduce);
    CHECK(group->counted().all_reduce_calls == planned.tensor_all_reduce_calls + planned.tensor_grad_all_reduce_calls);
    CHECK(group->counted().all_gather == planned.tensor_all_gather);
    CHECK(group->counted().all_gather_calls == planned.tensor_all_gather_calls);
    CHECK(group->counted().reduce_scatter == 0);
    CHECK(group->scalars() == 1);  // the squared norm of the split gradients
    CHECK(planned.tensor_payload() > 0);
    CHECK(planned.payload() == 0);  // nothing over data-parallel ranks
  }
}

// DataParallel<2> x TensorParallel<2>, ZeRO 1 (ZeRO 2 with LoRA: each
// rank's shard of an adapter's gradient summed over the tensor-parallel
// ranks): data-parallel rank d trains sequences [d B, (d + 1) B) of each
// global batch of 2 B.
template <class M, int Zero>
void data_and_tensor_parallel(host::Communicator& c) {
  using Both = host::Trainer<TensorParallelRun<M, SGD<>, DataParallel<2>, ZeRO<Zero>>>;
  using One = host::Trainer<Train<M, Batch<2 * batch>, Seq<seq>, SGD<>>>;
  Both both(options(), c);
  One one(options());
  REQUIRE(both.tensor_rank() == c.rank() % 2);
  REQUIRE(both.rank() == c.rank() / 2);
  double worst = 0;
  for (int s = 1; s <= 10; ++s) {
    const Batch_ mine = batch_of(s, 2 * batch, both.rank(), 2);
    const Batch_ all = batch_of(s, 2 * batch);
    const StepStats a = both.step(mine.tokens, mine.targets);
    const StepStats o = one.step(all.tokens, all.targets);
    worst = std::max(worst, std::abs(a.loss - o.loss) / std::abs(o.loss));
    INFO("step " << s);
    CHECK(a.grad_norm == Approx(o.grad_norm).epsilon(1e-5));
  }
  INFO("rank " << c.rank());
  CHECK(worst < 1e-5);
  CHECK(weight_difference(both, one, split_params<M>) < 1e-6);
}

// OffloadOptimizer on the tensor-parallel ranks (and data-parallel ones):
// the same layout without it, bit for bit; a LoRA matrix's partial
// gradients are summed over the group in the offload tier, before the norm.
template <class Run, class Offloaded>
void offloaded_like_the_device(host::Communicator& c, int data_ranks) {
  headroom::test::trains_like_the_device<host::Trainer<Run>, host::Trainer<Offloaded>>(c, options(), 1.0, [&](auto& t, int s) {
    const Batch_ mine = batch_of(s, static_cast<std::size_t>(data_ranks) * batch, t.rank(), data_ranks);
    return t.step(mine.tokens, mine.targets);
  });
}

// Saves after 3 steps, runs 3 more; a trainer with other initial weights
// loads the checkpoint and runs the same 3 steps to the same losses, with
// the same bytes in every weight and optimizer state.
template <class Parallel>
void resumes_bit_identically(host::Communicator& c, int data_ranks) {
  using Tp = host::Trainer<Parallel>;
  SharedDir dir(c);
  auto step = [&](Tp& t) {
    const Batch_ b = batch_of(t.steps_done() + 1, static_cast<std::size_t>(data_ranks) * batch, t.rank(), data_ranks);
    return t.step(b.tokens, b.targets).loss;
  };
  Tp a(options(), c);
  for (int s = 0; s < 3; ++s) step(a);
  io::save_checkpoint(a, dir.path / "ckpt", R"({"position": 3})");
  std::vector<double> losses;
  for (int s = 0; s < 3; ++s) losses.push_back(step(a));
  host::TrainOptions other = options();
  other.seed = 99;
  Tp b(other, c);
  CHECK(io::load_checkpoint(b, dir.path / "ckpt") == R"({"position": 3})");
  for (int s = 0; s < 3; ++s) CHECK(step(b) == losses[static_cast<std::size_t>(s)]);
  for (std::size_t k = 0; k < Tp::param_count; ++k) {
    const ParamSlot& p = Tp::param(k);
    const auto n = static_cast<std::size_t>(a.shard_of(p).count);
    CHECK(std::memcmp(a.weight(p), b.weight(p), static_cast<std::size_t>(p.elements()) * 4) == 0);
    if (p.state >= 0) CHECK(std::memcmp(a.state(p), b.state(p), static_cast<std::size_t>(Tp::config.optim.state_bytes(n))) == 0);
  }
  // a one-process trainer refuses it, naming both layouts
  if (c.rank() == 0) {
    host::Trainer<Train<Llama, Batch<batch>, Seq<seq>, SGD<>>> one(options());
    try {
      io::load_checkpoint(one, dir.path / "ckpt");
      FAIL("a tensor-parallel checkpoint loaded into a one-process trainer");
    } catch (const io::checkpoint_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("tensor-parallel ranks in the checkpoint, one process in this trainer"));
    }
  }
  c.barrier();
}

// io::Consolidated joins the ranks' blocks: its save_pretrained equals the
// one-process run's, and loading through it gives every rank its block.
template <class M>
void exports_like_one_process(host::Communicator& c) {
  using Tp = host::Trainer<TensorParallelRun<M>>;
  using One = host::Trainer<Train<M, Batch<batch>, Seq<seq>, SGD<>>>;
  SharedDir dir(c);
  Tp tp(options(), c);
  One one(options());
  for (int s = 1; s <= 3; ++s) {
    const Batch_ b = batch_of(s, batch);
    tp.step(b.tokens, b.targets);
    one.step(b.tokens, b.targets);
  }
  const io::Consolidated<Tp> full(tp);  // every rank
  if (c.rank() == 0) {
    io::save_pretrained(full, dir.path / "tp.safetensors");
    io::save_pretrained(one, dir.path / "one.safetensors");
    CHECK(file_difference(dir.path / "tp.safetensors", dir.path / "one.safetensors") < 1e-6);
    if constexpr (lora<M>) {  // the adapters' blocks joined: PEFT's file of the one process
      io::export_adapter(full, dir.path / "tp_adapter", "test/model");
      io::export_adapter(one, dir.path / "one_adapter", "test/model");
      CHECK(file_difference(dir.path / "tp_adapter" / "adapter_model.safetensors",
                            dir.path / "one_adapter" / "adapter_model.safetensors") < 1e-6);
    }
  }
  c.barrier();
  host::TrainOptions other = options();
  other.seed = 3;
  Tp fresh(other, c);
  io::Consolidated<Tp> loading(fresh);
  io::load_pretrained(loading, dir.path / "tp.safetensors");
  loading.write_back(fresh);
  for (std::size_t k = 0; k < Tp::param_count; ++k) {
    const ParamSlot& p = Tp::param(k);
    if (std::string_view(p.name).substr(0, 5) == "lora_") continue;  // adapters are not in a base checkpoint
    CHECK(std::memcmp(tp.weight(p), fresh.weight(p), static_cast<std::size_t>(p.elements()) * 4) == 0);
  }
  c.barrier();
}

}  // namespace

// [np2] runs under mpirun -np 2, [np4] under -np 4 (tests/mpi/CMakeLists.txt).
TEST_CASE("tensor parallel: TensorParallel<2> trains like one process", "[mpi][tensor_parallel][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  trains_like_one_process<Llama>(c);
  trains_like_one_process<Gpt2>(c);
  trains_like_one_process<Qwen3>(c);
  exchanges_what_the_plan_says<Qwen3>(c);
}

TEST_CASE("tensor parallel: LoRA beside the split projections trains like one process", "[mpi][tensor_parallel][lora][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  trains_like_one_process<LlamaLora>(c);
  trains_like_one_process<Gpt2Lora>(c);
  trains_like_one_process<LlamaLoraDrop>(c);
  exchanges_what_the_plan_says<LlamaLora>(c);
  exchanges_what_the_plan_says<Gpt2Lora>(c);
  exports_like_one_process<Gpt2Lora>(c);
}

TEST_CASE("tensor parallel: OffloadOptimizer trains bit-identically to the device", "[mpi][tensor_parallel][offload][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  offloaded_like_the_device<TensorParallelRun<LlamaLora, AdamW>, TensorParallelRun<LlamaLora, AdamW, OffloadOptimizer>>(c, 1);
  offloaded_like_the_device<TensorParallelRun<Gpt2, AdamW8bit>, TensorParallelRun<Gpt2, AdamW8bit, OffloadOptimizer, OffloadParameters>>(c, 1);
}

TEST_CASE("tensor parallel: a step exchanges exactly what the plan counts", "[mpi][tensor_parallel][communication][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  exchanges_what_the_plan_says<Llama>(c);
  exchanges_what_the_plan_says<Gpt2>(c);
}

TEST_CASE("tensor parallel: 2 data-parallel x 2 tensor-parallel ranks with OffloadOptimizer train bit-identically to the device",
          "[mpi][tensor_parallel][offload][np4]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 4);
  offloaded_like_the_device<TensorParallelRun<LlamaLora, AdamW, DataParallel<2>, ZeRO<2>>,
                            TensorParallelRun<LlamaLora, AdamW, DataParallel<2>, ZeRO<2>, OffloadOptimizer>>(c, 2);
}

TEST_CASE("tensor parallel: 2 data-parallel x 2 tensor-parallel ranks train like one process", "[mpi][tensor_parallel][np4]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 4);
  data_and_tensor_parallel<Llama, 1>(c);
}

TEST_CASE("tensor parallel: 2 data-parallel x 2 tensor-parallel ranks train LoRA like one process (ZeRO 2)", "[mpi][tensor_parallel][lora][np4]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 4);
  data_and_tensor_parallel<LlamaLora, 2>(c);
}

TEST_CASE("tensor parallel: a checkpoint resumes bit-identically and is refused by another layout", "[mpi][tensor_parallel][checkpoint][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  resumes_bit_identically<TensorParallelRun<Llama>>(c, 1);
}

TEST_CASE("tensor parallel: the consolidated export equals the one-process run's", "[mpi][tensor_parallel][export][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  exports_like_one_process<Llama>(c);
  exports_like_one_process<Gpt2>(c);
}

TEST_CASE("tensor parallel: 2 data-parallel x 2 tensor-parallel ranks resume bit-identically", "[mpi][tensor_parallel][checkpoint][np4]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 4);
  resumes_bit_identically<TensorParallelRun<Llama, SGD<>, DataParallel<2>, ZeRO<1>>>(c, 2);
}
