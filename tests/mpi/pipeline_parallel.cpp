// Pipeline parallelism (ctest mpi.pipeline_parallel.np2 / .np4):
// PipelineParallel<2> with 4 micro-batches per step under 1F1B trains like
// one process given the same micro-batches (losses within 1e-5 relative
// over 10 steps, each stage's weights equal to the same parameters of the
// one-process trainer to float rounding), exchanging exactly the
// activations and gradients of its micro-batches; it resumes
// bit-identically from its checkpoint; io::Consolidated gathers the stages:
// its save_pretrained file equals the one-process run's, and loading through
// it gives every stage its layers. On 4 ranks, PipelineParallel<2> x
// TensorParallel<2> does the same. With every block Offloaded, each stage
// keeps a host copy of a micro-batch's offloaded activations per
// micro-batch in flight, and trains like one process too.
//
// Every process runs its stage (host::with_pipeline_stage) and a
// one-process reference beside it.
#include <catch2/catch.hpp>

#include <headroom/headroom.hpp>
#include <headroom/host/mpi.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/io/consolidated.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/train/host/counting_communicator.hpp>
#include <headroom/train/host/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../runtime/support/fixtures.hpp"
#include "support/shared.hpp"

using namespace headroom;

namespace {
namespace fs = std::filesystem;
using headroom::test::ids;
using headroom::test::SharedDir;

constexpr std::int64_t batch = 2, seq = 12;
constexpr int micro = 4;
constexpr models::LlamaConfig llama_pp{48, 64, 128, 4, 4, 2, 64, false};  // 4 blocks: 2 per stage
using Llama = models::Llama<llama_pp>;
// every block Offloaded: its activations to host memory after its forward, back before its backward
using OffloadedLlama = models::Llama<llama_pp, Apply<Offloaded<>, EveryBlock>>;
template <class... More>
using Pipelined = Train<Llama, Batch<batch>, Seq<seq>, Accumulate<micro>, SGD<>, PipelineParallel<2>, More...>;
template <class M = Llama>
using OneProcess = Train<M, Batch<batch>, Seq<seq>, Accumulate<micro>, SGD<>>;
using PipelinedOffloaded = Train<OffloadedLlama, Batch<batch>, Seq<seq>, Accumulate<micro>, SGD<>, PipelineParallel<2>>;

host::TrainOptions options(std::uint64_t seed = 7) {
  return {.seed = seed, .lr = 5e-2, .warmup_steps = 2, .total_steps = 10, .clip_norm = 1.0};
}

struct Batch_ {
  std::vector<std::int32_t> tokens, targets;
};
Batch_ batch_of(int s) {
  const std::size_t n = static_cast<std::size_t>(micro * batch * seq);
  return {ids(n, static_cast<std::uint32_t>(100 * s), 48), ids(n, static_cast<std::uint32_t>(100 * s + 50), 48)};
}

// The largest difference between this stage's parameters (its tensor-parallel
// block of each) and the same ones of the one-process trainer, found by path.
template <class Stage, class One>
double weight_difference(const host::Trainer<Stage>& st, const One& one, int expected_params) {
  double worst = 0;
  int found = 0;
  for (std::size_t k = 0; k < host::Trainer<Stage>::param_count; ++k) {
    const ParamSlot& p = host::Trainer<Stage>::param(k);
    const ParamSlot* q = One::find(host::Trainer<Stage>::path_of(p));
    REQUIRE(q != nullptr);
    ++found;
    const float* w = st.weight(p);
    const float* v = one.weight(*q);
    for (std::int64_t i = 0; i < p.elements(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(w[i] - v[p.split.whole_index(p.rows, p.cols, st.tensor_rank(), i)])));
  }
  CHECK(found == expected_params);
  return worst;
}

// A stage's parameters, counted by hand: per block 2 norms and 7 projections;
// the first stage also the embedding, the last the final norm and the LM head.
constexpr int params_of_stage(int stage) { return 2 * 9 + (stage == 0 ? 1 : 2); }

// io::Consolidated over the stages (and tensor-parallel ranks): the file
// save_pretrained writes equals the one-process run's, and write_back gives
// a fresh trainer of each stage exactly its parameters.
template <class Tr, class One>
void exports_like_one_process(host::Communicator& c, const SharedDir& dir, const Tr& t, const One& one) {
  headroom::test::saves_like_one_process(c, dir, t, one);  // every process
  host::TrainOptions other = options(3);
  Tr fresh(other, *t.world());
  io::Consolidated<Tr> loading(fresh);
  io::load_pretrained(loading, dir.path / "parallel.safetensors");
  loading.write_back(fresh);
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    CHECK(std::memcmp(t.weight(p), fresh.weight(p), static_cast<std::size_t>(p.elements()) * 4) == 0);
  }
  c.barrier();
}

template <class Run>
void trains_like_one_process(host::Communicator& c) {
  SharedDir dir(c);
  host::with_pipeline_stage<Run>(c, [&]<class Stage>() {
    using Tr = host::Trainer<Stage>;
    host::CountingCommunicator counting(c);
    Tr t(options(), counting);
    host::Trainer<OneProcess<typename Run::model>> one(options());
    REQUIRE(Tr::stage() == c.rank() / Stage::config().tp);
    auto* pipe = dynamic_cast<host::CountingCommunicator*>(t.pipe_communicator());
    REQUIRE(pipe != nullptr);
    double worst = 0;
    for (int s = 1; s <= 10; ++s) {
      const Batch_ b = batch_of(s);
      pipe->reset();
      const StepStats a = t.step(b.tokens, b.targets);
      const StepStats o = one.step(b.tokens, b.targets);
      worst = std::max(worst, std::abs(a.loss - o.loss) / std::abs(o.loss));
      INFO("step " << s << ", stage " << Tr::stage());
      CHECK(a.grad_norm == Approx(o.grad_norm).epsilon(1e-5));
      // each micro-batch's (batch x seq x width) activation one way, its gradient the other: what the plan counts
      const std::int64_t per = batch * seq * 64 * 4 * micro;
      CHECK(pipe->sent() == per);
      CHECK(pipe->received() == per);
      CHECK(pipe->sent() == Tr::plan.communication.pipeline_sent);
      CHECK(pipe->received() == Tr::plan.communication.pipeline_received);
    }
    INFO("stage " << Tr::stage() << ", tensor rank " << t.tensor_rank());
    CHECK(worst < 1e-5);
    CHECK(weight_difference(t, one, params_of_stage(Tr::stage())) < 1e-6);
    exports_like_one_process(c, dir, t, one);
  });
}

void resumes_bit_identically(host::Communicator& c) {
  SharedDir dir(c);
  host::with_pipeline_stage<Pipelined<>>(c, [&]<class Stage>() {
    using Tr = host::Trainer<Stage>;
    auto step = [&](Tr& t) {
      const Batch_ b = batch_of(t.steps_done() + 1);
      return t.step(b.tokens, b.targets).loss;
    };
    Tr a(options(), c);
    for (int s = 0; s < 3; ++s) step(a);
    io::save_checkpoint(a, dir.path / "ckpt");
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) losses.push_back(step(a));
    Tr b(options(99), c);
    io::load_checkpoint(b, dir.path / "ckpt");
    for (int s = 0; s < 3; ++s) CHECK(step(b) == losses[static_cast<std::size_t>(s)]);
    for (std::size_t k = 0; k < Tr::param_count; ++k) {
      const ParamSlot& p = Tr::param(k);
      CHECK(std::memcmp(a.weight(p), b.weight(p), static_cast<std::size_t>(p.elements()) * 4) == 0);
      CHECK(std::memcmp(a.state(p), b.state(p), static_cast<std::size_t>(Tr::config.optim.state_bytes(p.elements()))) == 0);
    }
  });
  c.barrier();
}

// OffloadOptimizer on each stage: the same stages without it, bit for bit
// (each micro-batch's gradients go to the offload tier and their sums come
// back under 1F1B; the tied table aside, each stage's own norm and updates).
template <class... Also>
void offloaded_like_the_device(host::Communicator& c) {
  host::with_pipeline_stage<Pipelined<OffloadOptimizer, Also...>>(c, [&]<class Stage>() {
    using Off = host::Trainer<Stage>;
    using Dev = host::Trainer<pipeline_stage<Pipelined<>, Stage::config().stage>>;
    INFO("stage " << Off::stage());
    headroom::test::trains_like_the_device<Dev, Off>(c, options(), 1.0, [](auto& t, int s) {
      const Batch_ b = batch_of(s);
      return t.step(b.tokens, b.targets);
    });
  });
}

}  // namespace

// [np2] runs under mpirun -np 2, [np4] under -np 4 (tests/mpi/CMakeLists.txt).
TEST_CASE("pipeline parallel: 2 stages under 1F1B train like one process", "[mpi][pipeline_parallel][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  trains_like_one_process<Pipelined<>>(c);
}

TEST_CASE("pipeline parallel: Offloaded blocks keep a host copy per micro-batch in flight", "[mpi][pipeline_parallel][offload][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  // the first stage has 2 micro-batches in flight, the last 1: the offload
  // tier holds that many copies of a micro-batch's offloaded activations
  using First = host::Trainer<pipeline_stage<PipelinedOffloaded, 0>>;
  using Last = host::Trainer<pipeline_stage<PipelinedOffloaded, 1>>;
  constexpr std::int64_t host_bytes = plan<OneProcess<OffloadedLlama>>().bytes(Role::saved_activation, Tier::offload) / 2;
  static_assert(host_bytes > 0);
  CHECK(First::plan.bytes(Role::saved_activation, Tier::offload) == 2 * host_bytes);
  CHECK(Last::plan.bytes(Role::saved_activation, Tier::offload) == host_bytes);
  trains_like_one_process<PipelinedOffloaded>(c);
}

TEST_CASE("pipeline parallel: OffloadOptimizer (and OffloadParameters) on each stage train bit-identically to the device",
          "[mpi][pipeline_parallel][offload][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  offloaded_like_the_device<>(c);
  offloaded_like_the_device<OffloadParameters>(c);
}

TEST_CASE("pipeline parallel: a checkpoint of the stages resumes bit-identically", "[mpi][pipeline_parallel][checkpoint][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);
  resumes_bit_identically(c);
}

TEST_CASE("pipeline parallel: 2 stages x 2 tensor-parallel ranks train like one process", "[mpi][pipeline_parallel][np4]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 4);
  trains_like_one_process<Pipelined<TensorParallel<2>>>(c);
}
