// Pipeline parallelism with an LM head tied to the embedding table (GPT-2;
// ctest mpi.tied_pipeline.np2 / .np4): the first stage holds wte.weight for
// the embedding, the last stage a copy of it for the head; both start from
// the same values and add their gradients of it before the update, so over
// 10 steps the stages train like one process on the same micro-batches
// (losses within 1e-5 relative, grad norms alike, weights to float
// rounding), the two copies stay bit-identical, the sum exchanges exactly
// the bytes the plan counts (plan.communication.stage_all_reduce), and
// io::Consolidated exports one wte.weight: the one-process file. On 4
// processes: 4 stages (the first and last of them pair up apart from the
// middle ones) and 2 stages x 2 data-parallel ranks with ZeRO<2> (each
// rank's shard of the table's gradient summed over the stages). A
// Sequential stack of one's own with a tied head does the same on 2 stages.
#include <catch2/catch.hpp>

#include <headroom/headroom.hpp>
#include <headroom/host/mpi.hpp>
#include <headroom/io/consolidated.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/train/host/counting_communicator.hpp>
#include <headroom/train/host/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../runtime/support/fixtures.hpp"
#include "support/shared.hpp"

using namespace headroom;

namespace {
using headroom::test::ids;
using headroom::test::saves_like_one_process;
using headroom::test::SharedDir;

constexpr std::int64_t batch = 2, seq = 12, vocab = 48, dim = 64;
constexpr int micro = 4;
constexpr models::GPT2Config gpt2_pp{vocab, dim, 4, 4, 32};  // 4 blocks, tied wte
using Gpt2 = models::GPT2<gpt2_pp>;
// A stack of one's own (Sequential builds each stage's part of it): its
// table and head on every stage but the middle ones.
using Block = Sequential<LayerNorm<dim>, Linear<dim, dim>>;
using Stack = Sequential<Embedding<vocab, dim>, Repeat<4, Block>, LayerNorm<dim>, LMHeadLoss<vocab, dim, true>>;

template <int Stages, class M = Gpt2, class... More>
using Pipelined = Train<M, Batch<batch>, Seq<seq>, Accumulate<micro>, SGD<>, PipelineParallel<Stages>, More...>;
template <int Ranks, class M = Gpt2>
using OneProcess = Train<M, Batch<Ranks * batch>, Seq<seq>, Accumulate<micro>, SGD<>>;

// A stage's parameters, counted by hand: GPT-2's 12 per block (ln_1, c_attn,
// attn c_proj, ln_2, c_fc, mlp c_proj: a weight and a bias each), the first
// stage's wte and wpe, the last stage's wte copy and ln_f (weight, bias);
// the stack's 3 per block, its table on the first and last stages, its
// norm (2) on the last.
template <class M>
constexpr int params_of_stage(int stage, int stages) {
  const bool gpt2 = std::is_same_v<M, Gpt2>;
  const int blocks = 4 / stages, first = stage == 0, last = stage == stages - 1;
  return (gpt2 ? 12 : 3) * blocks + (first ? (gpt2 ? 2 : 1) : 0) + (last ? 3 : 0);
}

host::TrainOptions options(std::uint64_t seed = 7) {
  return {.seed = seed, .lr = 5e-2, .warmup_steps = 2, .total_steps = 10, .clip_norm = 1.0};
}

// Step s: every micro-batch of Ranks x batch sequences (the one process's),
// and data-parallel rank d's batch of each.
struct Batches {
  std::vector<std::int32_t> tokens, targets, mine_tokens, mine_targets;
};
Batches batches(int s, int ranks, int d) {
  Batches b;
  const std::size_t per = batch * seq, global = per * static_cast<std::size_t>(ranks);
  for (int k = 0; k < micro; ++k) {
    const auto t = ids(global, static_cast<std::uint32_t>(100 * s + k), vocab);
    const auto y = ids(global, static_cast<std::uint32_t>(100 * s + k + 50), vocab);
    b.tokens.insert(b.tokens.end(), t.begin(), t.end());
    b.targets.insert(b.targets.end(), y.begin(), y.end());
    b.mine_tokens.insert(b.mine_tokens.end(), t.begin() + d * per, t.begin() + (d + 1) * per);
    b.mine_targets.insert(b.mine_targets.end(), y.begin() + d * per, y.begin() + (d + 1) * per);
  }
  return b;
}

// The table's bytes per step, by hand: 48 x 64 f32 values, or with ZeRO 2
// one rank's shard of them, rounded up to 256 elements (1536 of 3072).
constexpr std::int64_t table_bytes(int ranks, int zero) {
  const std::int64_t n = vocab * dim;
  if (zero < 2) return n * 4;
  const std::int64_t shard = (n + ranks - 1) / ranks;
  return (shard + 255) / 256 * 256 * 4;
}

template <class Run, int Stages, int Ranks = 1, int Zero = 0, class M = Gpt2>
void trains_like_one_process(host::Communicator& c) {
  REQUIRE(c.size() == Stages * Ranks);
  SharedDir dir(c);
  host::with_pipeline_stage<Run>(c, [&]<class Stage>() {
    using Tr = host::Trainer<Stage>;
    using One = host::Trainer<OneProcess<Ranks, M>>;
    constexpr bool first = Tr::stage() == 0, last = Tr::stage() == Stages - 1;
    // the table: on the first and the last stage, shared between them; nowhere else
    const ParamSlot* table = Tr::find(std::is_same_v<M, Gpt2> ? "wte.weight" : "0.weight");
    CHECK(Tr::param_count == static_cast<std::size_t>(params_of_stage<M>(Tr::stage(), Stages)));
    REQUIRE((table != nullptr) == (first || last));
    if (table != nullptr) CHECK(table->stage_shared);
    CHECK(Tr::plan.communication.stage_all_reduce == (first || last ? table_bytes(Ranks, Zero) : 0));
    CHECK(Tr::plan.communication.stage_all_reduce_calls == (first || last ? 1 : 0));

    host::CountingCommunicator counting(c);
    Tr t(options(), counting);
    One one(options());
    auto* pipe = dynamic_cast<host::CountingCommunicator*>(t.pipe_communicator());
    REQUIRE(pipe != nullptr);
    const int d = t.rank();
    double worst = 0;
    for (int s = 1; s <= 10; ++s) {
      const Batches b = batches(s, Ranks, d);
      pipe->reset();
      const StepStats a = t.step(b.mine_tokens, b.mine_targets);
      const StepStats o = one.step(b.tokens, b.targets);
      worst = std::max(worst, std::abs(a.loss - o.loss) / std::abs(o.loss));
      INFO("step " << s << ", stage " << Tr::stage() << ", rank " << d);
      CHECK(a.grad_norm == Approx(o.grad_norm).epsilon(1e-5));
      // with 2 stages the pipe's communicator sums the table: exactly the plan's bytes, once
      if constexpr (Stages == 2) {
        CHECK(pipe->counted().all_reduce == Tr::plan.communication.stage_all_reduce);
        CHECK(pipe->counted().all_reduce_calls == 1);
      }
    }
    INFO("stage " << Tr::stage() << ", rank " << d);
    CHECK(worst < 1e-5);
    // every parameter of the stage against the one process's, found by path
    double diff = 0;
    for (std::size_t k = 0; k < Tr::param_count; ++k) {
      const ParamSlot& p = Tr::param(k);
      const ParamSlot* q = One::find(Tr::path_of(p));
      REQUIRE(q != nullptr);
      for (std::int64_t i = 0; i < p.elements(); ++i)
        diff = std::max(diff, static_cast<double>(std::abs(t.weight(p)[i] - one.weight(*q)[i])));
    }
    CHECK(diff < 1e-6);
    // the two copies of the table: bit for bit (the last stage sends its copy to the first)
    if constexpr (first || last) {
      std::vector<float> copy(static_cast<std::size_t>(table->elements()));
      host::Communicator& pc = *t.pipe_communicator();
      if constexpr (last) pc.send(t.weight(*table), table->elements() * 4, 0, 77);
      if constexpr (first) {
        pc.recv(copy.data(), table->elements() * 4, Stages - 1, 77);
        CHECK(std::memcmp(copy.data(), t.weight(*table), copy.size() * 4) == 0);
      }
    }
    // one wte.weight in the consolidated file, which is the one process's
    saves_like_one_process(c, dir, t, one);
  });
}

}  // namespace

// [np2] runs under mpirun -np 2, [np4] under -np 4 (tests/mpi/CMakeLists.txt).
TEST_CASE("tied LM head: 2 stages sum the table's gradient and train like one process", "[mpi][pipeline_parallel][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  trains_like_one_process<Pipelined<2>, 2>(c);
}

TEST_CASE("tied LM head: a Sequential stack of one's own on 2 stages", "[mpi][pipeline_parallel][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  trains_like_one_process<Pipelined<2, Stack>, 2, 1, 0, Stack>(c);
}

TEST_CASE("tied LM head: 4 stages, the first and the last pair up", "[mpi][pipeline_parallel][np4]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  trains_like_one_process<Pipelined<4>, 4>(c);
}

TEST_CASE("tied LM head: 2 stages x 2 data-parallel ranks with ZeRO 2 sum their shards", "[mpi][pipeline_parallel][np4]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  trains_like_one_process<Pipelined<2, Gpt2, DataParallel<2>, ZeRO<2>>, 2, 2, 2>(c);
}
