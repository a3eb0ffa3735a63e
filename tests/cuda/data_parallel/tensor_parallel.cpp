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

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>

#include "compare.hpp"
#include "ranks.hpp"

namespace {

using namespace headroom;
using Llama = models::Llama<models::LlamaConfig{48, 64, 128, 2, 4, 2, 64, false}>;  // vocab, d, mlp, layers, heads, kv heads, positions
using Gpt2 = models::GPT2<models::GPT2Config{48, 64, 2, 4, 32}>;                     // vocab, d, layers, heads, positions
// Qwen3's per-head q / k norms: each rank normalizes its heads with the whole
// gains and sums their partial gradients with the other's
using Qwen3 = models::Llama<models::LlamaConfig{.vocab = 48, .dim = 64, .ffn = 128, .layers = 2, .heads = 4, .kv_heads = 2,
                                                .max_positions = 64, .arch = models::LlamaArch::qwen3, .head_dim = 24,
                                                .qk_norm = true}>;
using cuda_test::compare_ranks;
using cuda_test::options;
using cuda_test::parallel_run;
using cuda_test::RankReport;
using cuda_test::run_ranks;
using cuda_test::use_device;
constexpr std::int64_t global_batch = 4;
// each step's global batch: 4 sequences of 12 tokens of a vocabulary of 48; a data-parallel rank takes its half of them
constexpr cuda_test::Batches batches{.vocab = 48, .seq = 12, .rows = global_batch};

template <class Model>
using OneRank = cuda::Trainer<Train<Model, Batch<global_batch>, Seq<batches.seq>, SGD<>, OnCuda>>;
template <class Model>
using Tensor2 = Train<Model, Batch<global_batch>, Seq<batches.seq>, SGD<>, OnCuda, TensorParallel<2>>;
using Data2Tensor2 = Train<Llama, Batch<global_batch / 2>, Seq<batches.seq>, SGD<>, OnCuda, DataParallel<2>, ZeRO<1>, TensorParallel<2>>;

// Run's ranks against one rank given the same global batch (compare.hpp); graph: the tensor-parallel sums captured with the kernels
template <class Model, class Run>
void compare(const RankReport& one, bool graph = false) {
  compare_ranks<Run>(one, parallel_run<OneRank<Model>, Run>(batches, graph));
}

}  // namespace

TEST_CASE("cuda::Trainer tensor-parallel: TensorParallel<2> and DataParallel<2> x TensorParallel<2> train like one rank",
          "[tensor_parallel]") {
  const RankReport one = cuda_test::reference_run<OneRank<Llama>>(batches);
  SECTION("TensorParallel<2>") { compare<Llama, Tensor2<Llama>>(one); }
  SECTION("DataParallel<2> x TensorParallel<2>, ZeRO 1, CUDA graph") { compare<Llama, Data2Tensor2>(one, true); }
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
  compare<Gpt2, Tensor2<Gpt2>>(cuda_test::reference_run<OneRank<Gpt2>>(batches));
}

TEST_CASE("cuda::Trainer tensor-parallel: a TensorParallel<2> Qwen3 (per-head q / k norms) trains like one rank", "[tensor_parallel]") {
  compare<Qwen3, Tensor2<Qwen3>>(cuda_test::reference_run<OneRank<Qwen3>>(batches));
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

TEST_CASE("NcclCommunicator::split: groups of the world, each with its own sums", "[tensor_parallel]") {
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  const std::vector<RankReport> r = run_ranks(4, [&](int w, RankReport& out) {
    use_device(w);
    cuda::NcclCommunicator world(id, w, 4);
    const std::unique_ptr<cuda::Communicator> pair = world.split(w / 2, -w);  // {0, 1} and {2, 3}, ranked in reverse
    group_sum(*pair, w, out, 0);
  });
  for (int w = 0; w < 4; ++w) {
    INFO("process " << w << ": " << r[static_cast<std::size_t>(w)].error);
    REQUIRE(r[static_cast<std::size_t>(w)].done);
    CHECK(r[static_cast<std::size_t>(w)].value[0] == (w < 2 ? 3.0f : 12.0f));
    CHECK(r[static_cast<std::size_t>(w)].value[1] == static_cast<float>(1 - w % 2));
    CHECK(r[static_cast<std::size_t>(w)].value[2] == 2.0f);
  }
}

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
