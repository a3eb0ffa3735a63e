#pragma once
// What the parallel tests of cuda::Trainer share: each step's global batch,
// a parallel layout trained on its processes (one rank each: ranks.hpp) and
// one process trained on the same batches, and the comparison of the two:
// losses, gradient norms and the evaluation within 1e-5 relative, every
// element of every weight some process holds within 1e-6 of the same
// element of the one-process weights (ParamSlot::split's whole_index; with
// ZeRO 3 a process's shard), and with pipeline stages each step's bytes
// sent and received point to point as the plan says (the emulator's count).
// Include it after ../support/kernel_test.hpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>

#include "ranks.hpp"

namespace headroom::cuda_test {

inline constexpr int train_steps = 4;  // the steps each run trains (RankReport keeps 2 values a step: max_steps)
static_assert(2 * train_steps <= RankReport::max_steps);

inline TrainOptions options(bool graph = false) {
  return {.seed = 11, .lr = 5e-2, .warmup_steps = 2, .total_steps = 10, .clip_norm = 1.0, .cuda_graph = graph};
}

// A step's global batch: `micro` micro-batches of `rows` sequences of `seq`
// token ids or targets (a linear congruential stream); a data-parallel rank
// takes its rows of every micro-batch.
struct Batches {
  std::int64_t vocab, seq, rows;
  int micro = 1;

  // Step s's (micro, rows, seq) token ids or targets.
  std::vector<std::int32_t> ids(int s, bool targets) const {
    std::vector<std::int32_t> v(static_cast<std::size_t>(micro * rows * seq));
    std::uint64_t x = 0x9e3779b9u * static_cast<std::uint64_t>(2 * s + (targets ? 1 : 0) + 1);
    for (auto& t : v) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(vocab));
    }
    return v;
  }
  // Data-parallel rank d of `data`: its rows / data rows of every micro-batch.
  std::vector<std::int32_t> share(const std::vector<std::int32_t>& all, int data, int d) const {
    if (data == 1) return all;
    const std::size_t row = static_cast<std::size_t>(seq), mine_rows = static_cast<std::size_t>(rows / data);
    std::vector<std::int32_t> mine;
    for (std::size_t m = 0; m < static_cast<std::size_t>(micro); ++m) {
      const auto from = all.begin() + static_cast<std::ptrdiff_t>((m * static_cast<std::size_t>(rows) + static_cast<std::size_t>(d) * mine_rows) * row);
      mine.insert(mine.end(), from, from + static_cast<std::ptrdiff_t>(mine_rows * row));
    }
    return mine;
  }
};

// Where a parameter of the one-process run starts among all its parameters' elements.
template <class Reference>
std::size_t reference_offset(const std::string& path) {
  std::size_t at = 0;
  for (std::size_t k = 0; k < Reference::param_count; ++k) {
    if (Reference::path_of(Reference::param(k)) == path) return at;
    at += static_cast<std::size_t>(Reference::param(k).elements());
  }
  throw std::logic_error("the one-process run has no parameter " + path);
}
template <class Reference>
constexpr std::size_t all_values() {
  std::size_t n = 0;
  for (std::size_t k = 0; k < Reference::param_count; ++k) n += static_cast<std::size_t>(Reference::param(k).elements());
  return n;
}

// Trains train_steps steps, then writes losses, norms, the evaluation (of
// the next step's first micro-batch), the bytes each step sent and received
// point to point (the emulator's count: loss[train_steps + s] and
// norm[train_steps + s]) and every weight it holds at the place of the same
// element of the one-process run's parameters (Reference's; NaN where it
// holds none). data, d: the data-parallel ranks and this one's.
template <class Reference, class Trainer>
void train(Trainer& t, const Batches& b, int data, int d, RankReport& out) {
  static_assert(all_values<Reference>() <= RankReport::max_values);
  for (int s = 1; s <= train_steps; ++s) {
#if !defined(__CUDACC__)
    cuda_emulator::p2p_bytes() = {};
#endif
    const StepStats st = t.step(b.share(b.ids(s, false), data, d), b.share(b.ids(s, true), data, d));
    out.loss[out.steps] = st.loss;
    out.norm[out.steps] = st.grad_norm;
#if !defined(__CUDACC__)
    out.loss[train_steps + out.steps] = static_cast<double>(cuda_emulator::p2p_bytes().sent);
    out.norm[train_steps + out.steps] = static_cast<double>(cuda_emulator::p2p_bytes().received);
#endif
    ++out.steps;
  }
  const std::vector<std::int32_t> tokens = b.share(b.ids(train_steps + 1, false), data, d),
                                   targets = b.share(b.ids(train_steps + 1, true), data, d);
  const std::size_t one = tokens.size() / static_cast<std::size_t>(b.micro);  // the first micro-batch
  out.evaluated = t.evaluate(std::span(tokens).first(one), std::span(targets).first(one));
  std::fill(out.value, out.value + RankReport::max_values, std::numeric_limits<float>::quiet_NaN());
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    const std::vector<float> w = t.download_weight(p);  // with ZeRO 3 its shard: elements [begin, begin + size) of the rank's block
    const std::int64_t begin = Trainer::config.sharded(3) ? t.shard_of(p).begin : 0;
    const std::size_t at = reference_offset<Reference>(Trainer::path_of(p));
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(w.size()); ++i)
      out.value[at + static_cast<std::size_t>(p.split.whole_index(p.rows, p.cols, t.tensor_rank(), begin + i))] =
          w[static_cast<std::size_t>(i)];
  }
  out.values = all_values<Reference>();
}

// One process (Reference: a cuda::Trainer of the one-process run) trained on the batches.
template <class Reference>
RankReport reference_run(const Batches& b) {
  return run_ranks(1, [&](int, RankReport& out) {
    use_device(0);
    Reference t(options());
    train<Reference>(t, b, 1, 0, out);
  })[0];
}

// Every process of Run trains its part (with pipeline stages, its stage:
// cuda::with_pipeline_stage); process w is stage w / (dp tp), data-parallel
// rank (w / tp) % dp and tensor-parallel rank w % tp. graph: steps from the
// second on replay a captured CUDA graph.
template <class Reference, class Run>
std::vector<RankReport> parallel_run(const Batches& b, bool graph = false) {
  constexpr RunConfig c = Run::config();
  const ncclUniqueId id = cuda::NcclCommunicator::unique_id();
  return run_ranks(c.world(), [&](int w, RankReport& out) {
    use_device(w);
    cuda::NcclCommunicator world(id, w, c.world(), std::chrono::seconds(60));
    auto trains = [&]<class Part>() {
      constexpr int pp = Run::config().pp, dp = Run::config().dp, tp = Run::config().tp;  // (not c: g++ 12 and nvcc fail on it here)
      cuda::Trainer<Part> t(options(graph), world);
      if ((pp > 1 && cuda::Trainer<Part>::stage() != w / (dp * tp)) || t.tensor_rank() != w % tp)
        throw std::logic_error("process " + std::to_string(w) + " is stage " + std::to_string(cuda::Trainer<Part>::stage()) +
                               ", tensor-parallel rank " + std::to_string(t.tensor_rank()));
      train<Reference>(t, b, dp, (w / tp) % dp, out);
      if (graph && !t.graph_captured()) throw std::logic_error("the steps were not captured into a CUDA graph");
    };
    if constexpr (Run::config().pp > 1)
      cuda::with_pipeline_stage<Run>(world, trains);
    else
      trains.template operator()<Run>();
  });
}

// What each stage of Run sends and receives point to point in a step, by the plan.
template <class Run>
std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> planned_pipeline_bytes() {
  return [&]<int... S>(std::integer_sequence<int, S...>) {
    return std::pair{std::vector<std::int64_t>{plan<pipeline_stage<Run, S>>().communication.pipeline_sent...},
                     std::vector<std::int64_t>{plan<pipeline_stage<Run, S>>().communication.pipeline_received...}};
  }(std::make_integer_sequence<int, Run::config().pp>{});
}

// The processes of Run (parallel_run) against one process: losses, norms
// and the evaluation within 1e-5 relative on every process; every element
// of every weight held by some process, each copy within 1e-6; with
// pipeline stages, each step's bytes sent and received as the plan says.
template <class Run>
void compare_ranks(const RankReport& one, const std::vector<RankReport>& ranks) {
  REQUIRE(one.error == std::string());
  REQUIRE(one.done);
  constexpr RunConfig c = Run::config();
  std::vector<std::int64_t> sent, received;
  if constexpr (c.pp > 1) std::tie(sent, received) = planned_pipeline_bytes<Run>();
  double worst = 0;
  std::size_t held = 0;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const int stage = static_cast<int>(r) / (c.dp * c.tp);
    INFO("process " << r << " (stage " << stage << "): " << ranks[r].error);
    REQUIRE(ranks[r].done);
    REQUIRE(ranks[r].values == one.values);
    for (int s = 0; s < one.steps; ++s) {
      INFO("step " << s + 1 << ": loss " << ranks[r].loss[s] << " against " << one.loss[s] << ", norm " << ranks[r].norm[s] << " against "
                   << one.norm[s]);
      CHECK(std::abs(ranks[r].loss[s] - one.loss[s]) <= 1e-5 * std::abs(one.loss[s]));
      CHECK(std::abs(ranks[r].norm[s] - one.norm[s]) <= 1e-5 * std::abs(one.norm[s]));
#if !defined(__CUDACC__)
      if constexpr (c.pp > 1) {
        CHECK(ranks[r].loss[train_steps + s] == static_cast<double>(sent[static_cast<std::size_t>(stage)]));
        CHECK(ranks[r].norm[train_steps + s] == static_cast<double>(received[static_cast<std::size_t>(stage)]));
      }
#endif
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

}  // namespace headroom::cuda_test
