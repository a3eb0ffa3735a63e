// Data parallelism on 2 and 4 ranks (ctest mpi.data_parallel.np2 / .np4):
// every ZeRO stage trains like one process given the same global batch
// (losses within 1e-5 relative over 10 steps, final weights equal to float
// rounding), resumes bit-identically from its sharded checkpoint, refuses a
// checkpoint of another layout, and exports (consolidated, for ZeRO 3) the
// same Hugging Face file and PEFT adapter as the one-process run.
//
// The one-process reference runs on every rank beside its data-parallel
// trainer: Batch<N x B> sequences, where rank r's micro-batch is rows
// [r B, (r + 1) B) of each global one.
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
#include <string>
#include <vector>

#include "../runtime/support/fixtures.hpp"
#include "support/shared.hpp"

using namespace headroom;

namespace {
namespace fs = std::filesystem;
using headroom::test::file_difference;
using headroom::test::ids;
using headroom::test::SharedDir;

constexpr models::LlamaConfig llama_dp{48, 64, 128, 2, 4, 2, 64, false};
constexpr std::int64_t batch = 2, seq = 12;
using Model = models::Llama<llama_dp>;
// With LoRA on q_proj and v_proj: the adapter export.
using LoraModel = models::Llama<llama_dp, Apply<LoRA<4>, On<q_proj, v_proj>>>;
// QLoRA with checkpointed blocks: NF4 codes and scales gathered (and, offloaded, fetched) in forward and recompute.
using QLoraModel = models::Llama<llama_dp, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj>>, Apply<Checkpointed<>, EveryBlock>>;

// 2 ranks: one micro-batch per step; 4 ranks: two (gradients accumulate, the
// ZeRO 2 / 3 shards over micro-batches).
template <int N>
constexpr int micro_batches = N == 2 ? 1 : 2;
template <int N, int Stage, class M = Model, class Opt = SGD<>>
using DataParallelRun = Train<M, Batch<batch>, Seq<seq>, Accumulate<micro_batches<N>>, Opt, DataParallel<N>, ZeRO<Stage>>;
template <int N, class M = Model, class Opt = SGD<>>
using OneProcessRun = Train<M, Batch<N * batch>, Seq<seq>, Accumulate<micro_batches<N>>, Opt>;

host::TrainOptions options(std::uint64_t seed = 7) {
  return {.seed = seed, .lr = 5e-2, .warmup_steps = 2, .total_steps = 10, .clip_norm = 1.0};
}

// Step s's global batch: every micro-batch of N x B sequences; and rank r's part.
struct Batches {
  std::vector<std::int32_t> tokens, targets, mine_tokens, mine_targets;
};
Batches batches(int s, int n, int r, int micro, int vocab = 48) {
  Batches b;
  const std::size_t per = batch * seq, global = per * static_cast<std::size_t>(n);
  for (int k = 0; k < micro; ++k) {
    const auto t = ids(global, static_cast<std::uint32_t>(100 * s + k), vocab);
    const auto y = ids(global, static_cast<std::uint32_t>(100 * s + k + 50), vocab);
    b.tokens.insert(b.tokens.end(), t.begin(), t.end());
    b.targets.insert(b.targets.end(), y.begin(), y.end());
    b.mine_tokens.insert(b.mine_tokens.end(), t.begin() + r * per, t.begin() + (r + 1) * per);
    b.mine_targets.insert(b.mine_targets.end(), y.begin() + r * per, y.begin() + (r + 1) * per);
  }
  return b;
}

// The largest difference between this rank's part of every parameter and
// the same elements of the one-process trainer's.
template <class Dp, class One>
double weight_difference(const Dp& dp, const One& one) {
  double worst = 0;
  for (std::size_t k = 0; k < Dp::param_count; ++k) {
    const ParamSlot& p = Dp::param(k);
    const ParamSlot& q = One::param(k);
    REQUIRE(Dp::path_of(p) == One::path_of(q));
    const auto s = dp.shard_of(p);
    const std::int64_t begin = Dp::config.sharded(3) ? s.begin : 0, count = Dp::config.sharded(3) ? s.count : p.elements();
    const float* w = dp.weight(p);
    const float* v = one.weight(q);
    for (std::int64_t i = 0; i < count; ++i) worst = std::max(worst, static_cast<double>(std::abs(w[i] - v[begin + i])));
  }
  return worst;
}

template <int N, int Stage>
void trains_like_one_process(host::Communicator& c) {
  using Dp = host::Trainer<DataParallelRun<N, Stage>>;
  using One = host::Trainer<OneProcessRun<N>>;
  Dp dp(options(), c);
  One one(options());
  double worst = 0;
  for (int s = 1; s <= 10; ++s) {
    const Batches b = batches(s, N, c.rank(), micro_batches<N>);
    const StepStats a = dp.step(b.mine_tokens, b.mine_targets);
    const StepStats o = one.step(b.tokens, b.targets);
    worst = std::max(worst, std::abs(a.loss - o.loss) / std::abs(o.loss));
    CHECK(a.grad_norm == Approx(o.grad_norm).epsilon(1e-5));
  }
  INFO("ZeRO " << Stage << " on " << N << " ranks, rank " << c.rank());
  CHECK(worst < 1e-5);
  CHECK(weight_difference(dp, one) < 1e-6);
}

// What a step exchanges is what the plan says, collective by collective.
template <int N, int Stage>
void exchanges_what_the_plan_says(host::Communicator& mpi) {
  using Dp = host::Trainer<DataParallelRun<N, Stage>>;
  host::CountingCommunicator c(mpi);
  Dp dp(options(), c);
  for (int s = 1; s <= 2; ++s) {
    c.reset();
    const Batches b = batches(s, N, c.rank(), micro_batches<N>);
    dp.step(b.mine_tokens, b.mine_targets);
    const Communication& planned = Dp::plan.communication;
    const Communication& counted = c.counted();
    INFO("ZeRO " << Stage << " on " << N << " ranks");
    CHECK(counted.all_reduce == planned.all_reduce);
    CHECK(counted.reduce_scatter == planned.reduce_scatter);
    CHECK(counted.all_gather == planned.all_gather);
    CHECK(counted.all_reduce_calls == planned.all_reduce_calls);
    CHECK(counted.reduce_scatter_calls == planned.reduce_scatter_calls);
    CHECK(counted.all_gather_calls == planned.all_gather_calls);
    CHECK(planned.payload() > 0);
    // the loss of each micro-batch, and the squared norm of the sharded gradients
    CHECK(c.scalars() == micro_batches<N> + (Stage >= 1 ? 1 : 0));
  }
}

template <int N, int Stage>
void resumes_bit_identically(host::Communicator& c) {
  using Dp = host::Trainer<DataParallelRun<N, Stage, Model, AdamW8bit>>;
  SharedDir dir(c);
  const fs::path ckpt = dir.path / "ckpt";
  auto step = [&](Dp& t) {
    const Batches b = batches(t.steps_done() + 1, N, c.rank(), micro_batches<N>);
    return t.step(b.mine_tokens, b.mine_targets).loss;
  };
  Dp a(options(), c);
  for (int s = 0; s < 3; ++s) step(a);
  io::save_checkpoint(a, ckpt, R"({"position": 3})");
  std::vector<double> losses;
  for (int s = 0; s < 3; ++s) losses.push_back(step(a));

  Dp b(options(99), c);  // other initial weights: everything comes from the checkpoint
  CHECK(io::load_checkpoint(b, ckpt) == R"({"position": 3})");
  REQUIRE(b.steps_done() == 3);
  for (int s = 0; s < 3; ++s) CHECK(step(b) == losses[static_cast<std::size_t>(s)]);
  // every rank's part of the weights and optimizer state, byte for byte
  for (std::size_t k = 0; k < Dp::param_count; ++k) {
    const ParamSlot& p = Dp::param(k);
    const auto n = static_cast<std::size_t>(a.shard_of(p).count);
    CHECK(std::memcmp(a.weight(p), b.weight(p), (Dp::config.sharded(3) ? n : static_cast<std::size_t>(p.elements())) * 4) == 0);
    if (p.state >= 0) CHECK(std::memcmp(a.state(p), b.state(p), static_cast<std::size_t>(Dp::config.optim.state_bytes(n))) == 0);
  }
  c.barrier();
}

// OffloadOptimizer (and OffloadParameters) on the data-parallel ranks: the
// same ranks' run without it, bit for bit (each rank streams what it
// updates, its shard with ZeRO 2 and 3, and updates after the backward).
template <int N, int Stage, class Opt, class M = Model, class... Also>
void offloaded_trains_like_the_device(host::Communicator& c) {
  using Dp = host::Trainer<DataParallelRun<N, Stage, M, Opt>>;
  using Off = host::Trainer<Train<M, Batch<batch>, Seq<seq>, Accumulate<micro_batches<N>>, Opt, DataParallel<N>, ZeRO<Stage>,
                                  OffloadOptimizer, Also...>>;
  INFO("ZeRO " << Stage << " on " << N << " ranks, rank " << c.rank() << (sizeof...(Also) > 0 ? ", parameters offloaded" : ""));
  headroom::test::trains_like_the_device<Dp, Off>(c, options(), 0.5, [&](auto& t, int s) {
    const Batches b = batches(s, N, c.rank(), micro_batches<N>);
    return t.step(b.mine_tokens, b.mine_targets);
  });
}

}  // namespace

TEST_CASE("data parallel: OffloadOptimizer trains bit-identically to the same ranks on the device", "[mpi][data_parallel][offload]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  if (c.size() == 2) {
    offloaded_trains_like_the_device<2, 0, AdamW>(c);
    offloaded_trains_like_the_device<2, 2, AdamW8bit>(c);
    offloaded_trains_like_the_device<2, 3, SGD<>>(c);
    offloaded_trains_like_the_device<2, 1, AdamW, Model, OffloadParameters>(c);
    // ZeRO-Infinity: each rank's shards in the offload tier, fetched for each gather
    offloaded_trains_like_the_device<2, 3, AdamW, Model, OffloadParameters>(c);
    offloaded_trains_like_the_device<2, 3, AdamW8bit, QLoraModel, OffloadParameters>(c);
  } else {
    REQUIRE(c.size() == 4);  // two micro-batches a step: the shards' sums come back from the offload tier
    offloaded_trains_like_the_device<4, 2, AdamW>(c);
    offloaded_trains_like_the_device<4, 1, AdamW8bit>(c);
    offloaded_trains_like_the_device<4, 2, SGD<>, Model, OffloadParameters>(c);
    offloaded_trains_like_the_device<4, 3, AdamW, Model, OffloadParameters>(c);
  }
}

TEST_CASE("data parallel: every ZeRO stage trains like one process on the same global batch", "[mpi][data_parallel]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  if (c.size() == 2) {
    trains_like_one_process<2, 0>(c);
    trains_like_one_process<2, 1>(c);
    trains_like_one_process<2, 2>(c);
    trains_like_one_process<2, 3>(c);
  } else {
    REQUIRE(c.size() == 4);
    trains_like_one_process<4, 0>(c);
    trains_like_one_process<4, 1>(c);
    trains_like_one_process<4, 2>(c);
    trains_like_one_process<4, 3>(c);
  }
}

TEST_CASE("data parallel: a step exchanges exactly the bytes the plan counts", "[mpi][data_parallel][communication]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  if (c.size() == 2) {
    exchanges_what_the_plan_says<2, 0>(c);
    exchanges_what_the_plan_says<2, 1>(c);
    exchanges_what_the_plan_says<2, 2>(c);
    exchanges_what_the_plan_says<2, 3>(c);
  } else {
    exchanges_what_the_plan_says<4, 0>(c);
    exchanges_what_the_plan_says<4, 1>(c);
    exchanges_what_the_plan_says<4, 2>(c);
    exchanges_what_the_plan_says<4, 3>(c);
  }
}

TEST_CASE("data parallel: a sharded checkpoint resumes bit-identically", "[mpi][data_parallel][checkpoint]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  if (c.size() == 2) {
    resumes_bit_identically<2, 0>(c);
    resumes_bit_identically<2, 2>(c);
    resumes_bit_identically<2, 3>(c);
  } else {
    resumes_bit_identically<4, 1>(c);
    resumes_bit_identically<4, 3>(c);
  }
}

TEST_CASE("data parallel: a checkpoint of another layout is refused on every rank, nothing changed", "[mpi][data_parallel][checkpoint]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  if (c.size() != 2) return;  // the layouts below are 2-rank ones
  SharedDir dir(c);
  using Z1 = host::Trainer<DataParallelRun<2, 1>>;
  using Z3 = host::Trainer<DataParallelRun<2, 3>>;
  Z1 z1(options(), c);
  io::save_checkpoint(z1, dir.path / "z1");
  Z3 z3(options(5), c);
  const std::vector<float> before(z3.weight(Z3::param(0)), z3.weight(Z3::param(0)) + z3.shard_of(Z3::param(0)).count);
  try {
    io::load_checkpoint(z3, dir.path / "z1");
    FAIL("a ZeRO 1 checkpoint loaded into a ZeRO 3 trainer");
  } catch (const io::checkpoint_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("layout 2 data-parallel ranks with ZeRO 1 in the checkpoint, 2 data-parallel ranks "
                                         "with ZeRO 3 in this trainer"));
  }
  CHECK(std::equal(before.begin(), before.end(), z3.weight(Z3::param(0))));
  c.barrier();
}

TEST_CASE("data parallel: consolidated exports equal the one-process run's", "[mpi][data_parallel][export]") {
  host::MpiCommunicator c(std::chrono::seconds(60));
  if (c.size() != 2) return;
  SharedDir dir(c);
  using Dp = host::Trainer<DataParallelRun<2, 3, LoraModel>>;
  using One = host::Trainer<OneProcessRun<2, LoraModel>>;
  Dp dp(options(), c);
  One one(options());
  for (int s = 1; s <= 3; ++s) {
    const Batches b = batches(s, 2, c.rank(), micro_batches<2>);
    dp.step(b.mine_tokens, b.mine_targets);
    one.step(b.tokens, b.targets);
  }
  const io::Consolidated<Dp> full(dp);  // every rank
  if (c.rank() == 0) {
    io::save_pretrained(full, dir.path / "dp.safetensors");
    io::save_pretrained(one, dir.path / "one.safetensors");
    io::export_adapter(full, dir.path / "dp_adapter", "test/llama");
    io::export_adapter(one, dir.path / "one_adapter", "test/llama");
    CHECK(file_difference(dir.path / "dp.safetensors", dir.path / "one.safetensors") < 1e-6);
    CHECK(file_difference(dir.path / "dp_adapter" / "adapter_model.safetensors", dir.path / "one_adapter" / "adapter_model.safetensors") <
          1e-6);
  }
  // loading through the consolidated view: every rank keeps its shards
  Dp fresh(options(3), c);
  io::Consolidated<Dp> loading(fresh);
  io::load_pretrained(loading, dir.path / "dp.safetensors");
  loading.write_back(fresh);
  for (std::size_t k = 0; k < Dp::param_count; ++k) {
    const ParamSlot& p = Dp::param(k);
    if (std::string_view(p.name).substr(0, 5) == "lora_") continue;  // adapters are not in a base checkpoint
    const auto n = static_cast<std::size_t>(dp.shard_of(p).count);
    CHECK(std::memcmp(dp.weight(p), fresh.weight(p), n * 4) == 0);
  }
  c.barrier();
}

// Rank 1's files do not reach the file system rank 0 sees (the ranks were
// given one path on two file systems): rank 1 removes or shortens them, once
// written, through the save's test hook ("written": every rank, after its
// files are written, before rank 0 commits). The save fails on every rank
// with the file named, and the last good checkpoint stays.
TEST_CASE("data parallel: a save whose files rank 0 does not see fails on every rank, the last checkpoint kept",
          "[mpi][data_parallel][checkpoint]") {
  namespace ck = io::detail::checkpoint;
  host::MpiCommunicator c(std::chrono::seconds(60));
  if (c.size() != 2) return;
  using Dp = host::Trainer<DataParallelRun<2, 3, Model, AdamW>>;
  SharedDir dir(c);
  const fs::path ckpt = dir.path / "ckpt";
  Dp a(options(), c);
  auto step = [&](Dp& t) {
    const Batches b = batches(t.steps_done() + 1, 2, c.rank(), 1);
    t.step(b.mine_tokens, b.mine_targets);
  };
  step(a);
  io::save_checkpoint(a, ckpt);
  step(a);
  // rank 1's own file in the save's staging directory (a sibling of ckpt)
  auto rank1_file = [&](const std::string& name) {
    for (const auto& e : fs::directory_iterator(dir.path))
      if (e.path().filename().string().rfind("ckpt.headroom-saving", 0) == 0 && fs::exists(e.path() / name)) return e.path() / name;
    FAIL("rank 1 found no " << name << " in a staging directory");
    return fs::path();
  };
  for (const std::string name : {"model.rank-1.safetensors", "optimizer.rank-1.safetensors"}) {
    INFO(name);
    if (c.rank() == 1)
      ck::test_hook() = [&](std::string_view stage) {
        if (stage != "written") return;
        const fs::path mine = rank1_file(name);
        if (name[0] == 'm') fs::remove(mine);                           // not there at all
        else fs::resize_file(mine, fs::file_size(mine) - 8);             // not all of it
      };
    std::string message = "(saved)";
    try {
      io::save_checkpoint(a, ckpt);
    } catch (const io::checkpoint_error& e) {
      message = e.what();
    }
    ck::test_hook() = nullptr;
    CHECK_THAT(message, Catch::Contains(name) && Catch::Contains("rank 0") && Catch::Contains("not saved"));
    c.barrier();
    Dp b(options(99), c);
    io::load_checkpoint(b, ckpt);
    CHECK(b.steps_done() == 1);
    if (c.rank() == 0) {  // nothing left beside the checkpoint
      std::vector<std::string> names;
      for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename().string());
      CHECK(names == std::vector<std::string>{"ckpt"});
    }
    c.barrier();
  }
}
