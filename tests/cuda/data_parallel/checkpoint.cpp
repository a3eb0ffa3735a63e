// Checkpoints of cuda::Trainer over several processes
// (io/sharded_checkpoint.hpp): every process of a run saves its part after 2
// steps and takes 2 more; fresh processes, each with a trainer started from
// other initial values, load the checkpoint and take the same 2 steps: the
// same losses and gradient norms, and the same bytes of everything each
// process's part of the checkpoint holds (weights or their shards, quantized
// byte shards, master weights, optimizer state, tables) after them. Under
// DataParallel<2> with ZeRO 0 (masters whole, written by rank 0), ZeRO 1
// (masters and state sharded), ZeRO 3 with QLoRA and AdamW8bit (byte shards
// of the codes), TensorParallel<2> and PipelineParallel<2>; and a checkpoint
// of another layout is refused on every process, naming it. The processes
// agree on the save through the communicator's host exchange
// (cuda::Communicator::all_gather_on_host). Each process is a fork (ranks.hpp).
#include "../support/kernel_test.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/train/cuda/trainer.cuh>

#include "ranks.hpp"

namespace {

using namespace headroom;
using cuda_test::RankReport;
using cuda_test::run_ranks;
using cuda_test::use_device;
namespace fs = std::filesystem;

constexpr models::LlamaConfig llama_ck{48, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions
using Model = models::Llama<llama_ck>;
using QLoRAModel = models::Llama<llama_ck, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj>>>;
constexpr std::int64_t batch = 2, seq = 12;

TrainOptions options(std::uint64_t seed) { return {.seed = seed, .lr = 5e-2, .warmup_steps = 2, .total_steps = 10, .clip_norm = 1.0}; }

// Data-parallel rank d's tokens or targets of step s.
std::vector<std::int32_t> ids(std::size_t n, int s, int d, bool targets) {
  std::vector<std::int32_t> t(n);
  std::uint32_t x = static_cast<std::uint32_t>(1000 * s + 10 * d + (targets ? 1 : 0)) * 2654435761u + 3u;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(llama_ck.vocab));
  }
  return t;
}

template <class Trainer>
StepStats step_of(Trainer& t, int s, int w) {
  const int d = (w / Trainer::config.tp) % Trainer::config.dp;  // the data-parallel rank: its batches
  const std::size_t n = static_cast<std::size_t>(Trainer::tokens_per_step);
  return t.step(ids(n, s, d, false), ids(n, s, d, true));
}

// Every byte this process's part of a checkpoint holds, in the files' order.
template <class Trainer>
std::vector<char> held(const Trainer& t) {
  namespace ck = io::detail::checkpoint;
  const auto image = ck::image_of(t);
  std::vector<char> out;
  for (const auto& views : {ck::rank_model_tensors(t, image), ck::rank_optimizer_tensors(t, image)})
    for (const io::TensorView& v : views) {
      std::int64_t n = size_of(v.dtype);
      for (const std::int64_t x : v.shape) n *= x;
      const auto* b = static_cast<const char*>(v.data);
      out.insert(out.end(), b, b + n);
    }
  return out;
}

// On every process of R (a pipeline: its stage's trainer, cuda::with_pipeline_stage).
template <class R, class F>
std::vector<RankReport> on_every_process(F f) {
  constexpr int N = R::config().world();
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  return run_ranks(N, [&](int w, RankReport& out) {
    use_device(w);
    cuda::NcclCommunicator comm(id, w, N, std::chrono::seconds(120));
    if constexpr (R::config().pp > 1)
      cuda::with_pipeline_stage<R>(comm, [&]<class Stage>() { f.template operator()<Stage>(comm, w, out); });
    else
      f.template operator()<R>(comm, w, out);
  });
}

void require_done(const std::vector<RankReport>& r, const char* what) {
  for (std::size_t q = 0; q < r.size(); ++q) {
    INFO(what << ", process " << q << ": " << r[q].error);
    REQUIRE(r[q].done);
  }
}

// R: 2 steps, save, 2 more; then fresh processes load and take the same 2.
// Returns the checkpoint's directory.
template <class R>
fs::path resumes_bit_for_bit(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("headroom_cuda_sharded_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path ck = dir / "checkpoint";
  fs::create_directories(dir);
  const auto a = on_every_process<R>([&]<class P>(cuda::Communicator& comm, int w, RankReport& out) {
    cuda::Trainer<P> t(options(7), comm);
    for (int s = 1; s <= 2; ++s) step_of(t, s, w);
    io::save_checkpoint(t, ck, R"({"position": 2})");
    for (int s = 3; s <= 4; ++s) {
      const StepStats st = step_of(t, s, w);
      out.loss[out.steps] = st.loss;
      out.norm[out.steps++] = st.grad_norm;
    }
    const std::vector<char> bytes = held(t);
    std::ofstream(dir / ("held." + std::to_string(w)), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  });
  require_done(a, "the run that saves");
  const auto b = on_every_process<R>([&]<class P>(cuda::Communicator& comm, int w, RankReport& out) {
    cuda::Trainer<P> t(options(12345), comm);  // other initial values: every one must come from the checkpoint
    if (io::load_checkpoint(t, ck) != R"({"position": 2})") throw std::runtime_error("the extra JSON differs");
    if (t.steps_done() != 2) throw std::runtime_error("resumed at step " + std::to_string(t.steps_done()));
    for (int s = 3; s <= 4; ++s) {
      const StepStats st = step_of(t, s, w);
      out.loss[out.steps] = st.loss;
      out.norm[out.steps++] = st.grad_norm;
    }
    std::ifstream in(dir / ("held." + std::to_string(w)), std::ios::binary);
    const std::vector<char> want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (held(t) != want) throw std::runtime_error("process " + std::to_string(w) + ": the held bytes after the steps differ");
  });
  require_done(b, "the run that loads");
  for (std::size_t q = 0; q < a.size(); ++q)
    for (int s = 0; s < 2; ++s) {
      INFO("process " << q << ", step " << s + 3);
      CHECK(b[q].loss[s] == a[q].loss[s]);
      CHECK(b[q].norm[s] == a[q].norm[s]);
    }
  return dir;
}

template <int Stage, class M = Model, class... Options>
using DataParallelRun = Train<M, Batch<batch>, Seq<seq>, Options..., OnCuda, DataParallel<2>, ZeRO<Stage>>;

}  // namespace

TEST_CASE("cuda::Trainer checkpoints, DataParallel<2>: ZeRO 0 and ZeRO 1 bf16 resume bit for bit, another layout is refused",
          "[data_parallel][checkpoint]") {
  using Zero0 = DataParallelRun<0, Model, Precision<BF16>>;
  using Zero1 = DataParallelRun<1, Model, Precision<BF16>>;
  fs::remove_all(resumes_bit_for_bit<Zero0>("zero0"));
  const fs::path dir = resumes_bit_for_bit<Zero1>("zero1");
  // the ZeRO 1 checkpoint into ZeRO 0 trainers: refused on every process, naming both layouts
  const auto r = on_every_process<Zero0>([&]<class P>(cuda::Communicator& comm, int, RankReport&) {
    cuda::Trainer<P> t(options(7), comm);
    io::load_checkpoint(t, dir / "checkpoint");
  });
  for (const RankReport& q : r) {
    INFO(q.error);
    CHECK(!q.done);
    CHECK(std::string(q.error).find("ZeRO 1 in the checkpoint") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("cuda::Trainer checkpoints, DataParallel<2> ZeRO 3: QLoRA bf16 with AdamW8bit resumes bit for bit",
          "[data_parallel][checkpoint]") {
  fs::remove_all(resumes_bit_for_bit<DataParallelRun<3, QLoRAModel, Precision<BF16>, AdamW8bit>>("zero3_qlora"));
}

TEST_CASE("cuda::Trainer checkpoints: TensorParallel<2> and PipelineParallel<2> resume bit for bit", "[tensor_parallel][pipeline_parallel][checkpoint]") {
  fs::remove_all(resumes_bit_for_bit<Train<Model, Batch<batch>, Seq<seq>, OnCuda, TensorParallel<2>>>("tp2"));
  fs::remove_all(resumes_bit_for_bit<Train<Model, Batch<batch>, Seq<seq>, Accumulate<2>, OnCuda, PipelineParallel<2>>>("pp2"));
}
