// Pipeline parallelism on the CUDA engine: cuda::Trainer of each stage of a
// PipelineParallel<2> Llama (4 blocks, 2 per stage; and 4 stages of one) with
// 4 micro-batches per step under 1F1B, alone, with TensorParallel<2>, with
// DataParallel<2> and ZeRO 1, 2 or 3, and with both (8 processes), and of a
// GPT-2 whose LM head is tied to the embedding table on 2 and 4 stages,
// against one process given the same micro-batches; each
// process is a rank (ranks.hpp) and NCCL's sends and receives are emulated
// under g++ with their blocking semantics (a send completes only once the
// peer posts the receive: nccl_emulator.hpp), which the last test shows
// deadlocks two unpaired sends as NCCL would.
#include "../support/kernel_test.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>

#include "compare.hpp"
#include "ranks.hpp"

namespace {

using namespace headroom;
using Llama = models::Llama<models::LlamaConfig{48, 64, 128, 4, 4, 2, 64, false}>;  // vocab, d, mlp, layers, heads, kv heads, positions
using cuda_test::compare_ranks;
using cuda_test::options;
using cuda_test::RankReport;
using cuda_test::run_ranks;
using cuda_test::use_device;
constexpr std::int64_t batch = 2, width = 64;
constexpr int micro = 4;
// each step's micro-batches: 4 of 2 sequences of 12 tokens of a vocabulary of 48; a data-parallel rank takes one row of each
constexpr cuda_test::Batches batches{.vocab = 48, .seq = 12, .rows = batch, .micro = micro};
constexpr std::int64_t seq = batches.seq;

template <class Model>
using OneProcess = cuda::Trainer<Train<Model, Batch<batch>, Seq<seq>, Accumulate<micro>, SGD<>, OnCuda>>;
template <class... More>
using Pipelined = Train<Llama, Batch<batch>, Seq<seq>, Accumulate<micro>, SGD<>, OnCuda, PipelineParallel<2>, More...>;
// a block per stage: the two stages between send to one neighbour and receive from the other
using Pipelined4 = Train<Llama, Batch<batch>, Seq<seq>, Accumulate<micro>, SGD<>, OnCuda, PipelineParallel<4>>;
// Batch is a data-parallel rank's: each takes one row of every micro-batch
template <int Zero, class... More>
using PipelinedData2 =
    Train<Llama, Batch<batch / 2>, Seq<seq>, Accumulate<micro>, SGD<>, OnCuda, PipelineParallel<2>, DataParallel<2>, ZeRO<Zero>, More...>;
// GPT-2's LM head is tied to the embedding table: the last stage holds a copy of the table, and the first
// and the last stage sum its gradient (with 2 stages over the stages' group, with 4 over a group of their own)
using Gpt2 = models::GPT2<models::GPT2Config{48, 64, 4, 4, 32}>;  // vocab, d, layers, heads, positions
template <int Stages>
using Gpt2Pipelined = Train<Gpt2, Batch<batch>, Seq<seq>, Accumulate<micro>, SGD<>, OnCuda, PipelineParallel<Stages>>;

template <class Model = Llama>
RankReport reference_run() {
  return cuda_test::reference_run<OneProcess<Model>>(batches);
}

// Every process trains its stage against one process given the same
// micro-batches (compare.hpp: losses, norms, the evaluation, every weight,
// each step's bytes sent and received as the plan says), and the plan's
// bytes are those counted by hand.
template <class Run>
void compare(const RankReport& one, bool graph = false) {
  constexpr RunConfig c = Run::config();
  const auto [sent, received] = cuda_test::planned_pipeline_bytes<Run>();
  // a stage sends each micro-batch's (rows, seq, width) f32 activation to the next, its gradient to the one
  // before, and receives the same: 4 x 2 x 12 x 64 x 4 B = 24,576 B per neighbour and step (12,288 B with 2
  // data-parallel ranks), once on the first and the last stage, twice on a stage between
  constexpr std::int64_t by_hand = micro * c.batch * seq * width * 4;
  for (int stage = 0; stage < c.pp; ++stage) {
    const std::int64_t neighbours = (stage > 0) + (stage < c.pp - 1);
    CHECK(sent[static_cast<std::size_t>(stage)] == neighbours * by_hand);
    CHECK(received[static_cast<std::size_t>(stage)] == neighbours * by_hand);
  }
  compare_ranks<Run>(one, cuda_test::parallel_run<OneProcess<typename Run::model>, Run>(batches, graph));
}

// ---- the order of the sends and receives, by enumeration ------------------------------------------------------
// A stage's transfers as cuda::PipeExchange issues them: a list of groups
// (one send_recv call each) of sends and receives; transfer i from a to b
// is the i-th send from a to b and the i-th receive at b from a.
struct Transfer {
  bool send;
  int peer, index;
};
using Program = std::vector<std::vector<Transfer>>;

// Records send_recv calls (the collectives are not called here).
class Recording final : public cuda::Communicator {
 public:
  Recording(int rank, int size) : rank_(rank), size_(size), sent_(static_cast<std::size_t>(size)), got_(static_cast<std::size_t>(size)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send_recv(const void*, std::int64_t, int to, void*, std::int64_t, int from, cudaStream_t) override {
    std::vector<Transfer> group;
    if (to >= 0) group.push_back({true, to, sent_[static_cast<std::size_t>(to)]++});
    if (from >= 0) group.push_back({false, from, got_[static_cast<std::size_t>(from)]++});
    program.push_back(group);
  }
  void all_reduce_sum(void*, std::int64_t, DType, cudaStream_t) override {}
  void reduce_scatter_sum(const void*, void*, std::int64_t, DType, cudaStream_t) override {}
  void all_gather(const void*, void*, std::int64_t, cudaStream_t) override {}
  std::unique_ptr<cuda::Communicator> split(int, int) override { return nullptr; }
  void synchronize(cudaStream_t, std::string_view) override {}
  Program program;

 protected:
  std::vector<std::uint64_t> gather_values(std::uint64_t value) override { return {value}; }

 private:
  int rank_, size_;
  std::vector<int> sent_, got_;
};

// Stage s of S under 1F1B with K micro-batches, its transfers through a
// PipeExchange as cuda::Trainer calls it (pipe_recv / pipe_send's forward
// and backward, the flushes where a micro-batch's work starts with no
// receive and at the end); paired = false: every send alone, at once.
Program transfers(int S, int s, int K, bool paired) {
  Recording comm(s, S);
  cuda::PipeExchange pipe(&comm);
  cudaStream_t stream{};
  std::int32_t buffer = 0;
  auto send = [&](int peer) {
    pipe.send(&buffer, 4, peer);
    if (!paired) pipe.flush(stream);
  };
  auto forward = [&](int) {
    if (s == 0) pipe.flush(stream);
    if (s > 0) pipe.receive(&buffer, 4, s - 1, stream);
    if (s < S - 1) send(s + 1);
  };
  auto backward = [&](int) {
    if (s == S - 1) pipe.flush(stream);
    if (s < S - 1) pipe.receive(&buffer, 4, s + 1, stream);
    if (s > 0) send(s - 1);
  };
  trainers::one_forward_one_backward(S, s, K, forward, backward);
  pipe.flush(stream);
  return comm.program;
}

// Whether every stage's program completes when a send completes only once
// its peer has posted the matching receive (and a receive once the send is
// posted), the transfers of one group progressing together: NCCL's semantic.
bool completes(const std::vector<Program>& stages) {
  const std::size_t S = stages.size();
  std::vector<std::size_t> at(S, 0);                 // the group each stage is in
  std::vector<std::vector<bool>> done(S);            // its transfers that have completed
  auto posted = [&](std::size_t q, const Transfer& t, std::size_t from) -> int {  // where stage q posts the match of t (from stage `from`), or -1
    if (at[q] >= stages[q].size()) return -1;
    const std::vector<Transfer>& g = stages[q][at[q]];
    for (std::size_t j = 0; j < g.size(); ++j)
      if (g[j].send != t.send && g[j].peer == static_cast<int>(from) && g[j].index == t.index && !done[q][j]) return static_cast<int>(j);
    return -1;
  };
  for (std::size_t s = 0; s < S; ++s) done[s].assign(stages[s].empty() ? 0 : stages[s][0].size(), false);
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t s = 0; s < S; ++s) {
      if (at[s] >= stages[s].size()) continue;
      const std::vector<Transfer>& g = stages[s][at[s]];
      for (std::size_t i = 0; i < g.size(); ++i) {
        const int j = done[s][i] ? -1 : posted(static_cast<std::size_t>(g[i].peer), g[i], s);
        if (j >= 0) done[s][i] = done[static_cast<std::size_t>(g[i].peer)][static_cast<std::size_t>(j)] = moved = true;
      }
    }
    for (std::size_t s = 0; s < S; ++s)
      if (at[s] < stages[s].size() && std::all_of(done[s].begin(), done[s].end(), [](bool b) { return b; })) {
        ++at[s];
        done[s].assign(at[s] < stages[s].size() ? stages[s][at[s]].size() : 0, false);
        moved = true;
      }
  }
  for (std::size_t s = 0; s < S; ++s)
    if (at[s] < stages[s].size()) return false;
  return true;
}

}  // namespace

TEST_CASE("cuda::PipeExchange: 1F1B's sends and receives complete under NCCL's blocking sends for 2-8 stages and 1-16 "
          "micro-batches, and unpaired they deadlock",
          "[pipeline_parallel]") {
  int deadlocked = 0;
  for (int S = 2; S <= 8; ++S)
    for (int K = 1; K <= 16; ++K) {
      std::vector<Program> paired, unpaired;
      for (int s = 0; s < S; ++s) {
        paired.push_back(transfers(S, s, K, true));
        unpaired.push_back(transfers(S, s, K, false));
      }
      INFO(S << " stages, " << K << " micro-batches");
      CHECK(completes(paired));
      deadlocked += !completes(unpaired);
      if (K >= 2) CHECK_FALSE(completes(unpaired));  // the last two stages send to each other at once
    }
  CHECK(deadlocked == 7 * 15);
}

TEST_CASE("cuda::Trainer pipeline-parallel: 2 and 4 stages under 1F1B train like one process", "[pipeline_parallel]") {
  const RankReport one = reference_run();
  SECTION("PipelineParallel<2>") { compare<Pipelined<>>(one); }
  SECTION("PipelineParallel<2>, CUDA graph") { compare<Pipelined<>>(one, true); }
  SECTION("PipelineParallel<4>") { compare<Pipelined4>(one); }
}

TEST_CASE("cuda::Trainer pipeline-parallel: 2 stages x 2 tensor-parallel ranks, and 2 stages x 2 data-parallel ranks",
          "[pipeline_parallel]") {
  const RankReport one = reference_run();
  SECTION("PipelineParallel<2> x TensorParallel<2>") { compare<Pipelined<TensorParallel<2>>>(one); }
  SECTION("PipelineParallel<2> x DataParallel<2>, ZeRO 1") { compare<PipelinedData2<1>>(one); }
}

TEST_CASE("cuda::Trainer pipeline-parallel: 2 stages x 2 data-parallel ranks with ZeRO 2 and 3", "[pipeline_parallel]") {
  const RankReport one = reference_run();
  SECTION("PipelineParallel<2> x DataParallel<2>, ZeRO 2") { compare<PipelinedData2<2>>(one); }
  SECTION("PipelineParallel<2> x DataParallel<2>, ZeRO 3") { compare<PipelinedData2<3>>(one); }
}

TEST_CASE("cuda::Trainer pipeline-parallel: 2 stages x 2 data-parallel x 2 tensor-parallel ranks on 8 processes",
          "[pipeline_parallel]") {
  if (!cuda_test::can_start(8)) return;
  compare<PipelinedData2<1, TensorParallel<2>>>(reference_run());
}

TEST_CASE("cuda::Trainer pipeline-parallel: GPT-2 with its LM head tied to the embedding table on 2 and 4 stages",
          "[pipeline_parallel]") {
  const RankReport one = reference_run<Gpt2>();
  SECTION("PipelineParallel<2>") { compare<Gpt2Pipelined<2>>(one); }
  SECTION("PipelineParallel<4>: the first and the last stage's group split from the world") { compare<Gpt2Pipelined<4>>(one); }
}

TEST_CASE("cuda::Trainer pipeline-parallel: a process given another stage's trainer is refused, naming its stage",
          "[pipeline_parallel]") {
  using Stage0 = cuda::Trainer<pipeline_stage<Pipelined<>, 0>>;
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  const std::vector<RankReport> r = run_ranks(
      2,
      [&](int w, RankReport&) {
        use_device(w);
        cuda::NcclCommunicator world(id, w, 2, std::chrono::seconds(5));
        Stage0 t(options(), world);  // stage 0 on both
      },
      std::chrono::seconds(60), 1);  // process 0 waits for the other in vain: stopped once process 1 has ended
  CHECK(std::string(r[1].error) ==
        "cuda::Trainer: rank 1 of 2 is pipeline stage 1 (process w is stage w / 1), but this trainer's run type is stage 0; "
        "choose the stage with cuda::with_pipeline_stage");
}

TEST_CASE("NcclCommunicator::send_recv: two ranks that send to each other complete in one group, and unpaired sends block",
          "[pipeline_parallel]") {
#if !defined(__CUDACC__)
  cuda_emulator::nccl_hang_after() = std::chrono::milliseconds(200);  // the emulated send gives up waiting at its call
#endif
  for (const bool paired : {true, false}) {
    INFO((paired ? "paired in one group" : "each send alone, then the receive"));
    const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
    const std::vector<RankReport> r = run_ranks(2, [&](int w, RankReport& out) {
      use_device(w);
      cuda::NcclCommunicator comm(id, w, 2, std::chrono::seconds(2));
      constexpr std::int64_t n = 40000;  // 160,000 B: three chunks of the emulator's channel
      cudaStream_t s{};
      cuda::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      float* x = nullptr;
      cuda::check(cudaMalloc(reinterpret_cast<void**>(&x), 2 * n * sizeof(float)), "cudaMalloc");
      std::vector<float> mine(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = static_cast<float>(1000 * w + i);
      cuda::check(cudaMemcpyAsync(x, mine.data(), n * sizeof(float), cudaMemcpyHostToDevice, s), "upload");
      const int peer = 1 - w;
      try {
        if (paired) {
          comm.send_recv(x, n * 4, peer, x + n, n * 4, peer, s);
        } else {
          comm.send_recv(x, n * 4, peer, nullptr, 0, -1, s);
          comm.send_recv(nullptr, 0, -1, x + n, n * 4, peer, s);
        }
        std::vector<float> got(static_cast<std::size_t>(n));
        cuda::check(cudaMemcpyAsync(got.data(), x + n, n * sizeof(float), cudaMemcpyDeviceToHost, s), "download");
        comm.synchronize(s, "the exchange");
        bool same = true;
        for (std::int64_t i = 0; i < n; ++i) same = same && got[static_cast<std::size_t>(i)] == static_cast<float>(1000 * peer + i);
        out.loss[0] = same;
      } catch (const cuda::communication_error& e) {
        std::snprintf(out.error, sizeof out.error, "%s", e.what());
      }
    });
    for (int w = 0; w < 2; ++w) {
      const std::string e = r[static_cast<std::size_t>(w)].error;
      INFO("rank " << w << ": " << e);
      if (paired) {
        CHECK(e.empty());
        CHECK(r[static_cast<std::size_t>(w)].loss[0] == 1.0);
      } else {
        CHECK(e.rfind("rank " + std::to_string(w) + " of 2: send of 160000 bytes to rank " + std::to_string(1 - w) +
                          " did not complete within 2 s",
                      0) == 0);
      }
    }
  }
#if !defined(__CUDACC__)
  cuda_emulator::nccl_hang_after() = std::chrono::seconds(30);
#endif
}
