// Planned = used, on every rank of a data-parallel run (ctest
// mpi.data_parallel_memory.np2 / .np4): the arena is the rank's plan, a step
// allocates nothing outside MPI's own calls, and the rank's peak resident
// memory stays within its plan plus a stated constant, for each ZeRO stage,
// with the collectives in order and on the communication thread (and for
// ZeRO 3 with the model states in the offload tier); on 2
// processes also for TensorParallel<2> and for each stage of
// PipelineParallel<2>.
//
// Allocations are counted by interposing malloc and friends, as
// tests/runtime/host_memory.cpp does, split by whether the allocating
// thread is inside a Communicator call (a decorator marks it): MPI's
// collectives allocate their own temporary buffers (a large all-reduce or
// reduce-scatter allocates a reduction buffer as large as its message, for
// the call), which the test measures and prints; everything else must
// allocate nothing. The constant, measured on this machine (2 cores,
// OpenMPI 4.1.4 over shared memory): MPI's temporary buffers and its
// shared-memory segments, code pages first touched by the step and the
// communication thread's stack; below 1 MiB over the plan here. The bound
// allows 32 MiB.
#include <catch2/catch.hpp>

#include <headroom/headroom.hpp>
#include <headroom/host/mpi.hpp>
#include <headroom/host/resident.hpp>
#include <headroom/train/host/trainer.hpp>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "../runtime/support/fixtures.hpp"
#include "../runtime/support/interposed_malloc.hpp"

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0}, mpi_allocations{0};
std::atomic<std::int64_t> mpi_bytes{0}, mpi_largest{0};
thread_local bool in_communicator = false;
void count(std::size_t bytes) {
  if (!counting.load(std::memory_order_relaxed)) return;
  if (!in_communicator) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  mpi_allocations.fetch_add(1, std::memory_order_relaxed);
  mpi_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  std::int64_t m = mpi_largest.load();
  while (static_cast<std::int64_t>(bytes) > m && !mpi_largest.compare_exchange_weak(m, static_cast<std::int64_t>(bytes))) {
  }
}
}  // namespace
void counted_allocation(std::size_t bytes) { count(bytes); }

using namespace headroom;

namespace {

// Marks the calling thread as inside a Communicator call while it runs.
class Marking final : public host::Communicator {
 public:
  explicit Marking(host::Communicator& inner) : inner_(inner) {}
  explicit Marking(std::unique_ptr<host::Communicator> group) : owned_(std::move(group)), inner_(*owned_) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce_sum(void* d, std::int64_t n, DType t) override { in([&] { inner_.all_reduce_sum(d, n, t); }); }
  void reduce_scatter_sum(const void* s, void* r, std::int64_t n, DType t) override {
    in([&] { inner_.reduce_scatter_sum(s, r, n, t); });
  }
  void all_gather(void* d, std::int64_t b) override { in([&] { inner_.all_gather(d, b); }); }
  void send(const void* d, std::int64_t b, int p, int t) override { in([&] { inner_.send(d, b, p, t); }); }
  void recv(void* d, std::int64_t b, int p, int t) override { in([&] { inner_.recv(d, b, p, t); }); }
  void begin_send(const void* d, std::int64_t b, int p, int t) override { in([&] { inner_.begin_send(d, b, p, t); }); }
  void finish_send(int p, int t) override { in([&] { inner_.finish_send(p, t); }); }
  void barrier() override { in([&] { inner_.barrier(); }); }
  std::unique_ptr<host::Communicator> split(int color, int key) override {
    return std::make_unique<Marking>(inner_.split(color, key));
  }

 private:
  std::unique_ptr<host::Communicator> owned_;
  host::Communicator& inner_;
  template <class F>
  static void in(F&& f) {
    in_communicator = true;
    f();
    in_communicator = false;
  }
};

constexpr models::LlamaConfig llama_mem{256, 128, 384, 2, 4, 2, 128, false};
template <int N, int Stage>
using Run = Train<models::Llama<llama_mem>, Batch<4>, Seq<64>, AdamW, Accumulate<2>, DataParallel<N>, ZeRO<Stage>>;

// Trainer Tr on this process (its layout named by `what`): the arena is its
// plan, 3 steps allocate nothing outside MPI, and the peak resident memory
// is the plan plus the constant.
template <class Tr>
void measured(host::Communicator& mpi, const std::string& what, bool overlap) {
  Marking c(mpi);
  const auto tok = headroom::test::ids(Tr::tokens_per_step, 11 + static_cast<std::uint32_t>(c.rank() / Tr::config.tp), 256);
  const auto tgt = headroom::test::ids(Tr::tokens_per_step, 12 + static_cast<std::uint32_t>(c.rank() / Tr::config.tp), 256);
  c.barrier();
  host::reset_peak_resident();
  const std::int64_t before = host::resident_bytes();
  long n = 0, m = 0;
  {
    Tr t({.lr = 1e-3, .overlap_communication = overlap}, c);
    CHECK(t.arena_bytes(Tier::device) == Tr::plan.peak_bytes(Tier::device));
    t.step(tok, tgt);  // warm-up: the OpenMP runtime and MPI's paths to each peer start here
    allocations = mpi_allocations = 0;
    mpi_bytes = mpi_largest = 0;
    counting = true;
    for (int s = 0; s < 3; ++s) t.step(tok, tgt);
    counting = false;
    n = allocations.load();
    m = mpi_allocations.load();
  }
  const std::int64_t peak = host::peak_resident_bytes();
  const std::int64_t planned = Tr::plan.peak_bytes();
  const std::int64_t overhead = peak - before - planned;
  INFO(what << ", rank " << c.rank() << (overlap ? ", overlapped" : ", in order") << ": VmRSS before " << before << " B, VmHWM "
            << peak << " B, plan " << planned << " B, overhead " << overhead << " B, " << n << " allocations in 3 steps outside MPI");
  CHECK(n == 0);
  CHECK(peak - before >= planned * 9 / 10);  // the arena is really used
  CHECK(overhead <= 32ll << 20);
  if (c.rank() == 0)
    std::printf("%s, %s: plan %lld B, VmHWM - VmRSS before - plan = %lld B; in 3 steps %ld allocations outside MPI, %ld inside "
                "its calls (%lld B, the largest %lld B)\n",
                what.c_str(), overlap ? "overlapped" : "in order", static_cast<long long>(planned), static_cast<long long>(overhead), n,
                m, static_cast<long long>(mpi_bytes.load()), static_cast<long long>(mpi_largest.load()));
  c.barrier();
}

template <int N, int Stage>
void planned_is_used(host::Communicator& c, bool overlap) {
  measured<host::Trainer<Run<N, Stage>>>(c, "ZeRO " + std::to_string(Stage) + ", " + std::to_string(N) + " ranks", overlap);
}

// Tensor parallelism (2 ranks), and pipeline parallelism (2 stages, 4
// micro-batches under 1F1B: the first stage keeps 2 copies of its activations).
using TensorRun = Train<models::Llama<llama_mem>, Batch<4>, Seq<64>, AdamW, Accumulate<2>, TensorParallel<2>>;
using PipelineRun = Train<models::Llama<llama_mem>, Batch<4>, Seq<64>, AdamW, Accumulate<4>, PipelineParallel<2>>;

// ZeRO-Infinity: ZeRO 3 with the shards, optimizer state and gradients in
// the offload tier's file (fetched and gathered for each event, updated
// there by the host).
template <int N>
using InfinityRun = Train<models::Llama<llama_mem>, Batch<4>, Seq<64>, AdamW, Accumulate<2>, DataParallel<N>, ZeRO<3>,
                          OffloadOptimizer, OffloadParameters>;

template <int N>
void every_stage(host::Communicator& c) {
  for (bool overlap : {false, true}) {
    planned_is_used<N, 0>(c, overlap);
    planned_is_used<N, 1>(c, overlap);
    planned_is_used<N, 2>(c, overlap);
    planned_is_used<N, 3>(c, overlap);
    measured<host::Trainer<InfinityRun<N>>>(c, "ZeRO 3 + OffloadOptimizer + OffloadParameters, " + std::to_string(N) + " ranks",
                                            overlap);
  }
}

}  // namespace

TEST_CASE("data parallel: every rank's arena is its plan, a step allocates nothing, peak RSS = plan + a constant",
          "[mpi][data_parallel][memory]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  if (c.size() == 2) every_stage<2>(c);
  else every_stage<4>(c);
}

TEST_CASE("tensor and pipeline parallel: every process's arena is its plan, a step allocates nothing, peak RSS = plan + a constant",
          "[mpi][tensor_parallel][pipeline_parallel][memory][np2]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  REQUIRE(c.size() == 2);  // both layouts are 2-process ones (on 4 ranks this file runs ~[np2])
  measured<host::Trainer<TensorRun>>(c, "TensorParallel<2>", false);
  host::with_pipeline_stage<PipelineRun>(c, [&]<class Stage>() {
    measured<host::Trainer<Stage>>(c, "PipelineParallel<2>, stage " + std::to_string(Stage::config().stage), false);
  });
}
