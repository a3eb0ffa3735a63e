// Data parallelism on the CUDA engine: cuda::Trainer over NCCL
// (cuda::NcclCommunicator), every ZeRO stage on 2 ranks (and ZeRO 3 on 4)
// against one rank given the same global batch; the communicator's
// collectives on 3 ranks; and what a rank sees when another one hangs, dies
// or was started differently. Each rank is a process (ranks.hpp).
//
// Built twice, like tests/cuda/kernels: by g++ against the CPU emulator
// (ctest cuda_emulated.*: NCCL emulated, tests/cuda/emulator/nccl_emulator.hpp),
// and by nvcc with the real NCCL (ctest cuda.data_parallel: one GPU per
// rank, so it needs 4; skipped with fewer).
#include "../support/kernel_test.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>

#include "ranks.hpp"

namespace {

using namespace headroom;
using cuda_test::RankReport;
using cuda_test::run_ranks;
using cuda_test::use_device;

constexpr models::LlamaConfig llama_dp{48, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions
using Model = models::Llama<llama_dp>;
constexpr std::int64_t batch = 2, seq = 12;
constexpr int steps = 4;

// N ranks, each Batch<B> x Accumulate<K>, and one rank given all N x B
// sequences of each micro-batch: the same global batch (rank r's micro-batch
// is rows [r B, (r + 1) B) of each global one).
template <int N, int Stage, int K>
using DataParallelRun = Train<Model, Batch<batch>, Seq<seq>, Accumulate<K>, SGD<>, OnCuda, DataParallel<N>, ZeRO<Stage>>;
template <int N, int K>
using OneRankRun = Train<Model, Batch<N * batch>, Seq<seq>, Accumulate<K>, SGD<>, OnCuda>;

TrainOptions options(std::uint64_t seed = 7, bool graph = false) {
  return {.seed = seed, .lr = 5e-2, .warmup_steps = 2, .total_steps = 10, .clip_norm = 1.0, .cuda_graph = graph};
}

std::vector<std::int32_t> ids(std::size_t n, std::uint32_t seed) {
  std::vector<std::int32_t> t(n);
  std::uint32_t s = seed * 2654435761u + 11u;
  for (auto& x : t) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(llama_dp.vocab));
  }
  return t;
}
// Step s's tokens and targets: every micro-batch of `ranks` x B sequences
// (rank < 0), or rank r's part of each.
struct Batch_ {
  std::vector<std::int32_t> tokens, targets;
};
Batch_ batch_of(int s, int ranks, int rank, int micro) {
  Batch_ b;
  const std::size_t per = batch * seq, global = per * static_cast<std::size_t>(ranks);
  for (int k = 0; k < micro; ++k) {
    const auto t = ids(global, static_cast<std::uint32_t>(100 * s + k)), y = ids(global, static_cast<std::uint32_t>(100 * s + k + 50));
    const std::size_t from = rank < 0 ? 0 : per * static_cast<std::size_t>(rank), to = rank < 0 ? global : from + per;
    b.tokens.insert(b.tokens.end(), t.begin() + from, t.begin() + to);
    b.targets.insert(b.targets.end(), y.begin() + from, y.begin() + to);
  }
  return b;
}

// Trains `steps` steps (rank < 0: the one-rank run on the global batch) and
// reports losses, norms, the evaluation of the last batch's first
// micro-batch and the weights it holds, each at its place in all parameters.
template <class Trainer>
void train(Trainer& t, int ranks, int rank, RankReport& out) {
  constexpr int micro = Trainer::config.accumulate;
  for (int s = 1; s <= steps; ++s) {
    const Batch_ b = batch_of(s, ranks, rank, micro);
    const StepStats st = t.step(b.tokens, b.targets);
    out.loss[out.steps] = st.loss;
    out.norm[out.steps++] = st.grad_norm;
  }
  const Batch_ e = batch_of(steps + 1, ranks, rank, 1);
  out.evaluated = t.evaluate(e.tokens, e.targets);
  std::fill(out.value, out.value + RankReport::max_values, std::numeric_limits<float>::quiet_NaN());
  std::size_t at = 0;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    const std::vector<float> w = t.download_weight(p);
    const std::int64_t begin = Trainer::config.sharded(3) ? t.shard_of(p).begin : 0;
    if (at + static_cast<std::size_t>(p.elements()) > RankReport::max_values) throw std::length_error("the test model outgrew RankReport");
    std::copy(w.begin(), w.end(), out.value + at + begin);
    at += static_cast<std::size_t>(p.elements());
  }
  out.values = at;
}

// Every rank against the one-rank run: losses within 1e-5 relative, norms
// within 1e-5, the evaluation too, and every weight (each held by some rank)
// equal to float rounding.
void compare(const RankReport& one, const std::vector<RankReport>& ranks, const char* what) {
  INFO(what);
  REQUIRE(one.error == std::string());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    INFO("rank " << r << ": " << ranks[r].error);
    REQUIRE(ranks[r].done);
    REQUIRE(ranks[r].steps == one.steps);
    for (int s = 0; s < one.steps; ++s) {
      INFO("step " << s + 1 << ": loss " << ranks[r].loss[s] << " against " << one.loss[s] << ", norm " << ranks[r].norm[s]
                   << " against " << one.norm[s]);
      CHECK(std::abs(ranks[r].loss[s] - one.loss[s]) <= 1e-5 * std::abs(one.loss[s]));
      CHECK(std::abs(ranks[r].norm[s] - one.norm[s]) <= 1e-5 * std::abs(one.norm[s]));
    }
    CHECK(std::abs(ranks[r].evaluated - one.evaluated) <= 1e-5 * std::abs(one.evaluated));
  }
  double worst = 0;
  std::size_t held = 0;
  for (std::size_t i = 0; i < one.values; ++i) {
    bool someone = false;
    for (const RankReport& r : ranks) {
      if (std::isnan(r.value[i])) continue;
      someone = true;
      worst = std::max(worst, static_cast<double>(std::abs(r.value[i] - one.value[i])));
    }
    held += someone;
  }
  CHECK(held == one.values);  // every element of every parameter is on some rank
  CHECK(worst < 1e-6);
}

// Device memory of cudaMalloc (the emulated NCCL takes nothing else), filled and read on a stream.
template <class T>
struct Device {
  T* p = nullptr;
  std::size_t n;
  cudaStream_t s;
  Device(const std::vector<T>& v, cudaStream_t stream) : n(v.size()), s(stream) {
    cuda::check(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), "cudaMalloc");
    cuda::check(cudaMemcpyAsync(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice, s), "upload");
    cuda::check(cudaStreamSynchronize(s), "upload");
  }
  Device(const Device&) = delete;
  ~Device() { cudaFree(p); }
  std::vector<T> download(cuda::Communicator& comm) const {
    std::vector<T> v(n);
    cuda::check(cudaMemcpyAsync(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost, s), "download");
    comm.synchronize(s, "download");
    return v;
  }
};

template <int N, int K>
RankReport one_rank_run() {
  return run_ranks(1, [](int, RankReport& out) {
    use_device(0);
    cuda::Trainer<OneRankRun<N, K>> t(options());
    train(t, N, -1, out);
  })[0];
}

template <int N, int Stage, int K>
std::vector<RankReport> data_parallel_run(bool graph) {
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();  // rank 0's, inherited by every rank
  return run_ranks(N, [&](int rank, RankReport& out) {
    use_device(rank);
    cuda::NcclCommunicator comm(id, rank, N, std::chrono::seconds(60));
    cuda::Trainer<DataParallelRun<N, Stage, K>> t(options(7, graph), comm);
    train(t, N, rank, out);
  });
}

}  // namespace

TEST_CASE("NcclCommunicator: sums, scatters and gathers on 3 ranks, beyond one round of the emulator's segment", "[data_parallel]") {
  constexpr int n = 3;
  constexpr std::int64_t elements = 300000;  // 1.2 MB of f32 per rank
  // what each rank contributes (every rank can compute every rank's)
  auto summand = [](int q) { return cuda_test::pattern(elements, 10 + static_cast<std::uint32_t>(q)); };
  auto scattered = [](int q) { return cuda_test::pattern(elements * n, 20 + static_cast<std::uint32_t>(q)); };
  auto halves = [](int q) { return cuda_test::rounded<cuda::bf16>(cuda_test::pattern(64, 30 + static_cast<std::uint32_t>(q))); };
  auto shard = [](int q) { return cuda_test::pattern(elements, 40 + static_cast<std::uint32_t>(q)); };
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  const std::vector<RankReport> r = run_ranks(n, [&](int rank, RankReport& out) {
    use_device(rank);
    cuda::NcclCommunicator comm(id, rank, n);
    comm.agree(42, "a value");
    cudaStream_t s{};
    cuda::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    std::vector<float> g(elements * n, 0.0f);
    const std::vector<float> own = shard(rank);
    std::copy(own.begin(), own.end(), g.begin() + rank * elements);
    Device<float> sum(summand(rank), s), scatter(scattered(rank), s), mine(std::vector<float>(elements), s), gathered(g, s);
    Device<cuda::bf16> half(cuda_test::to_storage<cuda::bf16>(halves(rank)), s);
    comm.all_reduce_sum(sum.p, elements, DType::F32, s);
    comm.reduce_scatter_sum(scatter.p, mine.p, elements, DType::F32, s);
    comm.all_reduce_sum(half.p, 64, DType::BF16, s);
    comm.all_gather(gathered.p + rank * elements, gathered.p, elements * 4, s);  // in place
    comm.synchronize(s, "the collectives");
    // f32: the sums in rank order (the emulator's, exactly; a GPU's within rounding)
    std::vector<float> want_sum(elements, 0.0f), want_mine(elements, 0.0f), want_half(64, 0.0f);
    for (int q = 0; q < n; ++q) {
      const std::vector<float> a = summand(q), b = scattered(q), h = halves(q);
      for (std::int64_t i = 0; i < elements; ++i) {
        want_sum[static_cast<std::size_t>(i)] += a[static_cast<std::size_t>(i)];
        want_mine[static_cast<std::size_t>(i)] += b[static_cast<std::size_t>(rank * elements + i)];
      }
      for (std::size_t i = 0; i < 64; ++i) want_half[i] += h[i];
      const std::vector<float> theirs = shard(q), got = gathered.download(comm);
      out.norm[0] += !std::equal(theirs.begin(), theirs.end(), got.begin() + q * elements);  // blocks that differ
    }
    out.loss[0] = cuda_test::worst_ratio(sum.download(comm), want_sum, 1e-6, 1e-6);
    out.loss[1] = cuda_test::worst_ratio(mine.download(comm), want_mine, 1e-6, 1e-6);
    out.loss[2] = cuda_test::worst_ratio(cuda_test::to_floats(half.download(comm)), want_half, 1e-3, 1.0 / 128);  // bf16: 8 bits
    cudaStreamDestroy(s);
  });
  for (int q = 0; q < n; ++q) {
    const RankReport& rq = r[static_cast<std::size_t>(q)];
    INFO("rank " << q << ": " << rq.error);
    REQUIRE(rq.done);
    CHECK(rq.loss[0] <= 1);  // all_reduce_sum f32
    CHECK(rq.loss[1] <= 1);  // reduce_scatter_sum f32
    CHECK(rq.loss[2] <= 1);  // all_reduce_sum bf16
    CHECK(rq.norm[0] == 0);  // all_gather: every rank's block, bit for bit
  }
}

TEST_CASE("cuda::Trainer data-parallel: ZeRO 0-3 on 2 ranks train like one rank on the global batch", "[data_parallel]") {
  const RankReport one = one_rank_run<2, 2>();
  compare(one, data_parallel_run<2, 0, 2>(false), "ZeRO 0 on 2 ranks");
  compare(one, data_parallel_run<2, 1, 2>(true), "ZeRO 1 on 2 ranks, CUDA graph");
  compare(one, data_parallel_run<2, 2, 2>(false), "ZeRO 2 on 2 ranks");
  compare(one, data_parallel_run<2, 3, 2>(true), "ZeRO 3 on 2 ranks, CUDA graph");
}

TEST_CASE("cuda::Trainer data-parallel: ZeRO 3 on 4 ranks trains like one rank on the global batch", "[data_parallel]") {
  compare(one_rank_run<4, 1>(), data_parallel_run<4, 3, 1>(false), "ZeRO 3 on 4 ranks");
}

TEST_CASE("cuda::Trainer data-parallel: the ranks agree on their number, the run type and the seed", "[data_parallel]") {
  using Dp = cuda::Trainer<DataParallelRun<2, 1, 2>>;
  SECTION("a communicator of another size") {
    const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
    const RankReport r = run_ranks(1, [&](int, RankReport&) {
      use_device(0);
      cuda::NcclCommunicator comm(id, 0, 1);
      Dp t(options(), comm);
    })[0];
    CHECK(std::string(r.error) == "rank 0 of 1: the run type says 2 data-parallel ranks, but the communicator joins 1 rank");
  }
  SECTION("another seed on one rank") {
    const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
    const std::vector<RankReport> r = run_ranks(2, [&](int rank, RankReport&) {
      use_device(rank);
      cuda::NcclCommunicator comm(id, rank, 2);
      Dp t(options(rank == 0 ? 7 : 8), comm);
    });
    for (int q = 0; q < 2; ++q)
      CHECK(std::string(r[static_cast<std::size_t>(q)].error) ==
            "rank " + std::to_string(q) + " of 2: the ranks disagree on the seed: rank 0 has 7, rank 1 has 8 (were all ranks "
            "built from the same program and given the same options?)");
  }
}

TEST_CASE("cuda::Trainer data-parallel: a rank that stops answering is a communication_error on the other, within the timeout",
          "[data_parallel]") {
  using Dp = cuda::Trainer<DataParallelRun<2, 1, 2>>;
  for (const bool dies : {false, true}) {
    INFO((dies ? "rank 1 exits" : "rank 1 hangs") << " after its first step");
    // A rank that hangs: the emulated collective gives up waiting at its call after 200 ms, and the
    // communicator's 2 s timeout names it. A rank that exits: the emulator must see the process gone, however
    // long a loaded machine takes to end it, so its own give-up is off, and the timeout is 10 s.
#if !defined(__CUDACC__)
    cuda_emulator::nccl_hang_after() = dies ? std::chrono::milliseconds(30'000) : std::chrono::milliseconds(200);
#endif
    const auto timeout = dies ? std::chrono::seconds(10) : std::chrono::seconds(2);
    const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
    const std::vector<RankReport> r = run_ranks(
        2,
        [&](int rank, RankReport& out) {
          use_device(rank);
          cuda::NcclCommunicator comm(id, rank, 2, timeout);
          Dp t(options(), comm);
          const Batch_ b1 = batch_of(1, 2, rank, 2), b2 = batch_of(2, 2, rank, 2);
          t.step(b1.tokens, b1.targets);
          if (rank == 1) {
            if (dies) _exit(0);
            std::this_thread::sleep_for(std::chrono::seconds(30));  // killed by the test before
          }
          const auto start = std::chrono::steady_clock::now();
          try {
            t.step(b2.tokens, b2.targets);
          } catch (const cuda::communication_error& e) {
            out.evaluated = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            std::snprintf(out.error, sizeof out.error, "%s", e.what());
            try {  // the communicator refuses everything after its failure
              t.step(b2.tokens, b2.targets);
            } catch (const cuda::communication_error& again) {
              out.loss[0] = std::string(again.what()).find("refused: this communicator failed earlier") != std::string::npos;
            }
            return;
          }
          throw std::logic_error("the step completed without rank 1");
        },
        std::chrono::seconds(60), 0);  // rank 1 is stopped once rank 0 has ended
    const std::string e = r[0].error;
    INFO(e);
    CHECK(e.rfind("rank 0 of 2: ", 0) == 0);
    if (dies) {
      CHECK(e.find("failed: NCCL reports remote process exited or there was a network error") != std::string::npos);
      CHECK(e.find("rank 1 (process ") != std::string::npos);
      CHECK(r[0].evaluated < 10.0);
    } else {
      CHECK(e.find(" did not complete within 2 s; another rank has stopped or hangs") != std::string::npos);
      CHECK(r[0].evaluated >= 2.0);
      CHECK(r[0].evaluated < 10.0);
    }
    // the collective it was stuck in: the step's first all-reduce, or, when rank 1 left while step 1's
    // all-gather of the updated weights was still queued on its stream (a loaded machine), that one
    CHECK((e.find("all_reduce_sum of ") != std::string::npos || e.find("all_gather of ") != std::string::npos));
    CHECK(r[0].loss[0] == 1.0);
  }
#if !defined(__CUDACC__)
  cuda_emulator::nccl_hang_after() = std::chrono::seconds(30);
#endif
}
