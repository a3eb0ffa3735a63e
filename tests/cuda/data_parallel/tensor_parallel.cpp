// Tensor parallelism on the CUDA engine: cuda::Trainer of a TensorParallel<2>
// Llama (GQA, SwiGLU, untied vocabulary-parallel embedding and LM head), of
// DataParallel<2> x TensorParallel<2> with ZeRO 1 on 4 ranks, and of a
// TensorParallel<2> GPT-2 (fused c_attn, biases, learned positions, tied
// vocabulary-parallel embedding), against one rank given the same global batch. Each rank is a process (ranks.hpp); the
// world's communicator is split into the tensor- and data-parallel groups
// (ncclCommSplit, emulated under g++; the last tests split 8 processes into
// every group of a pipelined run and more, split groups again, and check
// the emulator's limits and a rank that does not split).
#include "../support/kernel_test.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <headroom/cuda/trainer.cuh>
#include <headroom/headroom.hpp>

#include "ranks.hpp"

namespace {

using namespace headroom;
using Llama = models::Llama<models::LlamaConfig{48, 64, 128, 2, 4, 2, 64, false}>;  // vocab, d, mlp, layers, heads, kv heads, positions
using Gpt2 = models::GPT2<models::GPT2Config{48, 64, 2, 4, 32}>;                     // vocab, d, layers, heads, positions
using cuda_test::RankReport;
using cuda_test::run_ranks;
using cuda_test::use_device;
constexpr std::int64_t vocab = 48, seq = 12, global_batch = 4;
constexpr int steps = 4;

template <class Model>
using OneRank = cuda::Trainer<Train<Model, Batch<global_batch>, Seq<seq>, SGD<>, OnCuda>>;
template <class Model>
using Tensor2 = Train<Model, Batch<global_batch>, Seq<seq>, SGD<>, OnCuda, TensorParallel<2>>;
using Data2Tensor2 = Train<Llama, Batch<global_batch / 2>, Seq<seq>, SGD<>, OnCuda, DataParallel<2>, ZeRO<1>, TensorParallel<2>>;

TrainOptions options(bool graph = false) {
  return {.seed = 11, .lr = 5e-2, .warmup_steps = 2, .total_steps = 10, .clip_norm = 1.0, .cuda_graph = graph};
}

// Step s's global batch: global_batch sequences of token ids and targets (a linear congruential stream).
std::vector<std::int32_t> global_ids(int s, bool targets) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(global_batch * seq));
  std::uint64_t x = 0x9e3779b9u * static_cast<std::uint64_t>(2 * s + (targets ? 1 : 0) + 1);
  for (auto& t : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(vocab));
  }
  return v;
}
// Data-parallel rank d of `data` ranks: its share of the sequences.
std::vector<std::int32_t> share(const std::vector<std::int32_t>& all, int data, int d) {
  const std::size_t per = all.size() / static_cast<std::size_t>(data);
  return {all.begin() + static_cast<std::ptrdiff_t>(per * d), all.begin() + static_cast<std::ptrdiff_t>(per * (d + 1))};
}

// Where a parameter of the one-rank run starts among all its parameters' elements.
template <class Reference>
std::size_t reference_offset(const std::string& path) {
  std::size_t at = 0;
  for (std::size_t k = 0; k < Reference::param_count; ++k) {
    if (Reference::path_of(Reference::param(k)) == path) return at;
    at += static_cast<std::size_t>(Reference::param(k).elements());
  }
  throw std::logic_error("the one-rank run has no parameter " + path);
}

// Trains, then writes losses, norms, the evaluation and every weight it
// holds at the place of the same element of the one-rank run's parameters
// (ParamSlot::split.whole_index; NaN where it holds none).
template <class Reference, class Trainer>
void train(Trainer& t, int data, int d, RankReport& out) {
  for (int s = 1; s <= steps; ++s) {
    const StepStats st = t.step(share(global_ids(s, false), data, d), share(global_ids(s, true), data, d));
    out.loss[out.steps] = st.loss;
    out.norm[out.steps++] = st.grad_norm;
  }
  out.evaluated = t.evaluate(share(global_ids(steps + 1, false), data, d), share(global_ids(steps + 1, true), data, d));
  std::fill(out.value, out.value + RankReport::max_values, std::numeric_limits<float>::quiet_NaN());
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    const std::vector<float> w = t.download_weight(p);
    const std::size_t at = reference_offset<Reference>(Trainer::path_of(p));
    for (std::int64_t i = 0; i < p.elements(); ++i)
      out.value[at + static_cast<std::size_t>(p.split.whole_index(p.rows, p.cols, t.tensor_rank(), i))] = w[static_cast<std::size_t>(i)];
  }
  out.values = reference_offset<Reference>(Reference::path_of(Reference::param(Reference::param_count - 1))) +
               static_cast<std::size_t>(Reference::param(Reference::param_count - 1).elements());
}

template <class Model>
RankReport reference_run() {
  return run_ranks(1, [](int, RankReport& out) {
    use_device(0);
    OneRank<Model> t(options());
    train<OneRank<Model>>(t, 1, 0, out);
  })[0];
}

// graph: steps from the second on replay a captured CUDA graph (the tensor-parallel sums captured with the kernels)
template <class Model, class Run>
std::vector<RankReport> parallel_run(bool graph = false) {
  constexpr RunConfig c = Run::config();
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  return run_ranks(c.world(), [&](int w, RankReport& out) {
    use_device(w);
    cuda::NcclCommunicator world(id, w, c.world(), std::chrono::seconds(60));
    cuda::Trainer<Run> t(options(graph), world);
    if (t.tensor_rank() != w % c.tp) throw std::logic_error("process " + std::to_string(w) + " is tensor-parallel rank " + std::to_string(t.tensor_rank()));
    train<OneRank<Model>>(t, c.dp, w / c.tp, out);
    if (graph && !t.graph_captured()) throw std::logic_error("the steps were not captured into a CUDA graph");
  });
}

// Losses, norms and the evaluation within 1e-5 relative on every rank;
// every element of every weight held by some rank, each copy within 1e-6.
void compare(const RankReport& one, const std::vector<RankReport>& ranks) {
  REQUIRE(one.error == std::string());
  REQUIRE(one.done);
  double worst = 0;
  std::size_t held = 0;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    INFO("rank " << r << ": " << ranks[r].error);
    REQUIRE(ranks[r].done);
    REQUIRE(ranks[r].values == one.values);
    for (int s = 0; s < one.steps; ++s) {
      INFO("step " << s + 1 << ": loss " << ranks[r].loss[s] << " against " << one.loss[s] << ", norm " << ranks[r].norm[s] << " against "
                   << one.norm[s]);
      CHECK(std::abs(ranks[r].loss[s] - one.loss[s]) <= 1e-5 * std::abs(one.loss[s]));
      CHECK(std::abs(ranks[r].norm[s] - one.norm[s]) <= 1e-5 * std::abs(one.norm[s]));
    }
    CHECK(std::abs(ranks[r].evaluated - one.evaluated) <= 1e-5 * std::abs(one.evaluated));
  }
  for (std::size_t i = 0; i < one.values; ++i) {
    bool someone = false;
    for (const RankReport& r : ranks)
      if (!std::isnan(r.value[i])) {
        someone = true;
        worst = std::max(worst, static_cast<double>(std::abs(r.value[i] - one.value[i])));
      }
    held += someone;
  }
  CHECK(held == one.values);
  CHECK(worst < 1e-6);
}

}  // namespace

TEST_CASE("cuda::Trainer tensor-parallel: TensorParallel<2> and DataParallel<2> x TensorParallel<2> train like one rank",
          "[tensor_parallel]") {
  const RankReport one = reference_run<Llama>();
  SECTION("TensorParallel<2>") { compare(one, parallel_run<Llama, Tensor2<Llama>>()); }
  SECTION("DataParallel<2> x TensorParallel<2>, ZeRO 1, CUDA graph") { compare(one, parallel_run<Llama, Data2Tensor2>(true)); }
}

TEST_CASE("cuda::Trainer tensor-parallel: a communicator of another size is refused, naming the layout", "[tensor_parallel]") {
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  const RankReport r = run_ranks(1, [&](int, RankReport&) {
    use_device(0);
    cuda::NcclCommunicator world(id, 0, 1);
    cuda::Trainer<Tensor2<Llama>> t(options(), world);
  })[0];
  REQUIRE(r.threw);
  CHECK(std::string(r.error) == "rank 0 of 1: the run type says 2 ranks (1 data-parallel x 2 tensor-parallel), but the communicator joins 1 rank");
}

TEST_CASE("cuda::Trainer tensor-parallel: a TensorParallel<2> GPT-2 (biases, tied embedding) trains like one rank", "[tensor_parallel]") {
  compare(reference_run<Gpt2>(), parallel_run<Gpt2, Tensor2<Gpt2>>());
}

TEST_CASE("NcclCommunicator::split: groups of the world, each with its own sums", "[tensor_parallel]") {
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  const std::vector<RankReport> r = run_ranks(4, [&](int w, RankReport& out) {
    use_device(w);
    cuda::NcclCommunicator world(id, w, 4);
    const std::unique_ptr<cuda::Communicator> pair = world.split(w / 2, -w);  // {0, 1} and {2, 3}, ranked in reverse
    cudaStream_t s{};
    cuda::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    float* x = nullptr;
    cuda::check(cudaMalloc(reinterpret_cast<void**>(&x), sizeof(float)), "cudaMalloc");
    const float mine = static_cast<float>(1 << w);
    cuda::check(cudaMemcpyAsync(x, &mine, sizeof mine, cudaMemcpyHostToDevice, s), "upload");
    pair->all_reduce_sum(x, 1, DType::F32, s);
    float sum = 0;
    cuda::check(cudaMemcpyAsync(&sum, x, sizeof sum, cudaMemcpyDeviceToHost, s), "download");
    pair->synchronize(s, "the group's sum");
    out.loss[0] = sum;
    out.loss[1] = pair->rank();
    out.loss[2] = pair->size();
    cudaFree(x);
    cudaStreamDestroy(s);
  });
  for (int w = 0; w < 4; ++w) {
    INFO("process " << w << ": " << r[static_cast<std::size_t>(w)].error);
    REQUIRE(r[static_cast<std::size_t>(w)].done);
    CHECK(r[static_cast<std::size_t>(w)].loss[0] == (w < 2 ? 3.0 : 12.0));
    CHECK(r[static_cast<std::size_t>(w)].loss[1] == 1 - w % 2);
    CHECK(r[static_cast<std::size_t>(w)].loss[2] == 2);
  }
}

namespace {
// A group's sum of 2^w over its processes w, its rank and size into out.value[at, at + 3).
void group_sum(cuda::Communicator& group, int w, RankReport& out, int at) {
  cudaStream_t s{};
  cuda::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  float* x = nullptr;
  cuda::check(cudaMalloc(reinterpret_cast<void**>(&x), sizeof(float)), "cudaMalloc");
  const float mine = static_cast<float>(1 << w);
  cuda::check(cudaMemcpyAsync(x, &mine, sizeof mine, cudaMemcpyHostToDevice, s), "upload");
  group.all_reduce_sum(x, 1, DType::F32, s);
  float sum = 0;
  cuda::check(cudaMemcpyAsync(&sum, x, sizeof sum, cudaMemcpyDeviceToHost, s), "download");
  group.synchronize(s, "the group's sum");
  out.value[at] = sum;
  out.value[at + 1] = static_cast<float>(group.rank());
  out.value[at + 2] = static_cast<float>(group.size());
  cudaFree(x);
  cudaStreamDestroy(s);
}
}  // namespace

TEST_CASE("NcclCommunicator::split: 8 processes split into the groups of DataParallel<2> x TensorParallel<2> x "
          "PipelineParallel<2> and more, and a group split again",
          "[tensor_parallel]") {
  if (!cuda_test::can_start(8)) return;
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  // process w = (stage 2 + d) 2 + t; each split's groups, by a function of w, ranked by key
  struct Split {
    int (*color)(int), (*key)(int);
  };
  constexpr Split world_splits[] = {
      {[](int w) { return w / 2; }, [](int w) { return w % 2; }},            // tensor-parallel pairs
      {[](int w) { return (w / 4) * 2 + w % 2; }, [](int w) { return (w / 2) % 2; }},  // data-parallel pairs
      {[](int w) { return w % 4; }, [](int w) { return w / 4; }},            // a stage's peers, by stage
      {[](int w) { return w % 2; }, [](int w) { return -w; }},               // halves {0, 2, 4, 6}, {1, 3, 5, 7}, ranked in reverse
      {[](int w) { return w / 4; }, [](int w) { return w; }},                // the stages
  };
  const std::vector<RankReport> r = run_ranks(8, [&](int w, RankReport& out) {
    use_device(w);
    cuda::NcclCommunicator world(id, w, 8, std::chrono::seconds(20));
    std::vector<std::unique_ptr<cuda::Communicator>> groups;
    for (const Split& s : world_splits) groups.push_back(world.split(s.color(w), s.key(w)));
    // the stage's group split twice more: its tensor-parallel pairs, ranked in reverse, then its processes alone
    const std::unique_ptr<cuda::Communicator> pair = groups.back()->split(groups.back()->rank() / 2, -w);
    const std::unique_ptr<cuda::Communicator> alone = groups.back()->split(groups.back()->rank(), 0);
    for (std::size_t g = 0; g < groups.size(); ++g) group_sum(*groups[g], w, out, 3 * static_cast<int>(g));
    group_sum(*pair, w, out, 15);
    group_sum(*alone, w, out, 18);
    group_sum(world, w, out, 21);
  });
  for (int w = 0; w < 8; ++w) {
    const RankReport& rw = r[static_cast<std::size_t>(w)];
    INFO("process " << w << ": " << rw.error);
    REQUIRE(rw.done);
    auto expect = [&](int at, auto color, auto key, const char* what) {
      INFO(what);
      double sum = 0;
      int rank = 0, size = 0;
      for (int q = 0; q < 8; ++q)
        if (color(q) == color(w)) {
          sum += 1 << q;
          ++size;
          rank += key(q) < key(w) || (key(q) == key(w) && q < w);
        }
      CHECK(rw.value[at] == sum);
      CHECK(rw.value[at + 1] == rank);
      CHECK(rw.value[at + 2] == size);
    };
    for (int g = 0; g < 5; ++g) expect(3 * g, world_splits[g].color, world_splits[g].key, "a split of the world");
    expect(15, [](int q) { return q / 2; }, [](int q) { return -q; }, "a split of a split");
    expect(18, [](int q) { return q; }, [](int) { return 0; }, "a second split of a split");
    expect(21, [](int) { return 0; }, [](int q) { return q; }, "the world");
  }
}

#if !defined(__CUDACC__)
TEST_CASE("the emulated ncclCommSplit: 8 splits of a communicator, a chain of splits of splits, its refusals, and ranks "
          "that do not split",
          "[tensor_parallel]") {
  namespace emu = cuda_emulator::nccl_detail;
  SECTION("a communicator splits 8 times, a chain of splits takes every segment of the pool, then each is refused") {
    const RankReport r = run_ranks(1, [&](int, RankReport& out) {
      ncclUniqueId id{};
      ncclComm_t world{};
      if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&world, 1, id, 0) != ncclSuccess)
        throw std::runtime_error("a communicator of one rank did not join");
      ncclComm_t child{}, refused{};
      for (int s = 0; s < emu::max_splits; ++s) out.loss[0] += ncclCommSplit(world, 0, 0, &child, nullptr) == ncclSuccess;
      out.loss[1] = ncclCommSplit(world, 0, 0, &refused, nullptr);
      std::snprintf(out.error, sizeof out.error, "%s", ncclGetLastError(world));
      ncclComm_t at = child;  // the last of the 8: a chain of children from it, each splitting its parent
      int made = emu::max_splits;
      for (; made < emu::pool_segments - 1; ++made) {
        ncclComm_t next{};
        if (ncclCommSplit(at, 1, 0, &next, nullptr) != ncclSuccess) break;
        at = next;
      }
      out.loss[2] = made;
      out.loss[3] = ncclCommSplit(at, 1, 0, &refused, nullptr);
      // (the refusals' messages in the report's error text, which the test reads though the process did not fail)
      std::snprintf(out.error + 256, sizeof out.error - 256, "%s", ncclGetLastError(at));
    })[0];
    CHECK(r.loss[0] == emu::max_splits);
    CHECK(r.loss[1] == static_cast<double>(ncclInvalidUsage));
    CHECK(std::string(r.error) == "ncclCommSplit: the emulator splits a communicator at most 8 times");
    CHECK(r.loss[2] == emu::pool_segments - 1);
    CHECK(r.loss[3] == static_cast<double>(ncclInternalError));
    CHECK(std::string(r.error + 256) == "ncclCommSplit: the emulator's " + std::to_string(emu::pool_segments - 1) +
                                            " segments for the groups split from this id are all taken");
  }
  SECTION("ranks that do not split: the others' split fails, naming the first of them") {
    cuda_emulator::nccl_hang_after() = std::chrono::milliseconds(200);
    const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
    const std::vector<RankReport> r = run_ranks(4, [&](int w, RankReport&) {
      cuda::NcclCommunicator world(id, w, 4, std::chrono::seconds(5));
      const std::unique_ptr<cuda::Communicator> pair = world.split(w / 2, w);  // {0, 1}, {2, 3}
      if (w != 1) pair->split(0, 0);   // a split of a group: rank 1 does not come
      if (w >= 2) world.split(0, w);   // a split of the world: ranks 0 and 1 do not come
    });
    cuda_emulator::nccl_hang_after() = std::chrono::seconds(30);
    const std::string failed = "ncclCommSplit (color 0) failed: unhandled system error (run with NCCL_DEBUG=INFO for details) (ncclCommSplit: rank ";
    CHECK(std::string(r[0].error) == "rank 0 of 2: " + failed + "1 did not split (the emulator's wait ended))");
    CHECK(r[1].done);
    CHECK(std::string(r[2].error) == "rank 2 of 4: " + failed + "0 did not split (the emulator's wait ended))");
    CHECK(std::string(r[3].error) == "rank 3 of 4: " + failed + "0 did not split (the emulator's wait ended))");
  }
}
#endif
