#pragma once
// What every engine's trainer shares: options and per-step statistics, the
// learning-rate schedule, batch validation, parameter paths and the initial
// weights (host::Trainer and cuda::Trainer start from the same values).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../graph/graph.hpp"
#include "loss_scaling.hpp"

namespace headroom {

struct TrainOptions {
  std::uint64_t seed = 1234;     // weight initialisation and dropout masks (math/dropout.hpp)
  int threads = 0;               // host: 0 = the run's Workers<W>; at most W
  double lr = 3e-4;              // peak learning rate
  double min_lr_ratio = 0.1;     // cosine decays to lr * min_lr_ratio
  int warmup_steps = 0;          // linear warmup from lr / warmup_steps
  int total_steps = 0;           // cosine decay over this many steps; 0: constant after warmup
  double clip_norm = 1.0;        // global gradient-norm clipping; 0: off
  std::filesystem::path offload_dir{};  // host: folder of the offload tier's file; empty = the system's temp folder
  bool cuda_graph = false;       // cuda: capture the whole step in a CUDA graph (at the second step) and replay it
  // host, data parallelism: run the collectives on a communication thread,
  // beside the compute steps after them (overlap), instead of in order on the
  // trainer's thread. Overlap pays where a core is free for the thread that
  // drives MPI; where ranks x threads fill the cores, in order is faster.
  bool overlap_communication = false;
  // dynamic loss scaling (train/loss_scaling.hpp): on for Precision<F16> unless said otherwise
  LossScaling loss_scaling{};
};

struct StepStats {
  int step = 0;             // optimizer steps done, this one included
  double loss = 0;          // mean over the step's tokens
  double grad_norm = 0;     // global gradient norm, before clipping (cuda::Trainer: 0 with UpdateInBackward)
  double lr = 0;
  float loss_scale = 1;     // the scale the step's gradients were computed with (1: no loss scaling)
  bool skipped = false;     // loss scaling: a scaled gradient overflowed; nothing was updated, `step` did not advance
};

// A step met a NaN or infinite value and was stopped before its update
// (see non_finite_loss and non_finite_gradient for what each guarantees).
class non_finite_error : public std::runtime_error {
 public:
  non_finite_error(int step, const std::string& what) : std::runtime_error(what), step_(step) {}
  int step() const { return step_; }

 private:
  int step_;
};

// The loss came out NaN or infinite: nothing was updated.
class non_finite_loss : public non_finite_error {
 public:
  non_finite_loss(int step, double loss)
      : non_finite_error(step, "headroom: the loss at step " + std::to_string(step) + " is " + std::to_string(loss) +
                                   "; the step was stopped before any update (the weights are those of step " +
                                   std::to_string(step - 1) + ")") {}
};

// The loss was finite but a gradient was not (NaN or infinite, or its
// squares beyond f32's range, where AdamW's second moment would overflow):
// the step was stopped before its update. `parameter()` is the dotted path of
// the first parameter (in the schedule's parameter order) whose gradient
// holds such a value; `what()` names the element and says what was updated.
class non_finite_gradient : public non_finite_error {
 public:
  non_finite_gradient(int step, std::string parameter, const std::string& detail)
      : non_finite_error(step, "headroom: the gradient of " + parameter + " at step " + std::to_string(step) + ": " + detail),
        parameter_(std::move(parameter)) {}
  const std::string& parameter() const { return parameter_; }

 private:
  std::string parameter_;
};

namespace trainers {

// Linear warmup, then cosine decay to lr * min_lr_ratio over total_steps.
inline double lr_at(const TrainOptions& o, int step) {
  const double peak = o.lr;
  if (o.warmup_steps > 0 && step <= o.warmup_steps) return peak * step / o.warmup_steps;
  if (o.total_steps <= o.warmup_steps) return peak;
  const double progress =
      std::min(1.0, static_cast<double>(step - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps));
  const double floor = peak * o.min_lr_ratio;
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(3.141592653589793 * progress));
}

// Throws unless there are n token ids and n targets, all inside the vocabulary.
inline void check_batch(std::string_view engine, const RunConfig& config, std::int64_t vocab, std::span<const std::int32_t> tokens,
                        std::span<const std::int32_t> targets, std::int64_t n) {
  if (static_cast<std::int64_t>(tokens.size()) != n || static_cast<std::int64_t>(targets.size()) != n)
    throw std::invalid_argument(std::string(engine) + ": expected " + std::to_string(n) + " token ids and targets (batch " +
                                std::to_string(config.batch) + " x seq " + std::to_string(config.seq) +
                                (config.accumulate > 1 ? " x accumulate " + std::to_string(config.accumulate) : std::string()) +
                                "), got " + std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  for (std::size_t i = 0; i < tokens.size() && vocab >= 0; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab || targets[i] < 0 || targets[i] >= vocab)
      throw std::out_of_range(std::string(engine) + ": token id " +
                              std::to_string(tokens[i] < 0 || tokens[i] >= vocab ? tokens[i] : targets[i]) + " at position " +
                              std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
}

// The dotted path of a node instance in the model: "layers.3.self_attn.q_proj".
template <class Plan>
std::string node_path(const Plan& plan, int node, int instance) {
  std::vector<std::string> parts;  // leaf first
  for (int n = node; n > 0; n = plan.nodes[n].parent) {
    const auto& ni = plan.nodes[n];
    if (ni.is_repeat) parts.push_back(std::to_string(ni.first_instance + instance));
    parts.push_back(ni.name.empty() ? std::to_string(ni.index) : std::string(ni.name));
  }
  std::string s;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!s.empty()) s.push_back('.');
    s.append(*it);
  }
  return s;
}

// The dotted path of a parameter: "layers.3.self_attn.q_proj.lora_A".
template <class Plan, class Param>
std::string path_of(const Plan& plan, const Param& p) {
  return trainers::node_path(plan, p.node, p.instance) + "." + std::string(p.name);
}

// The parameter of a schedule at a dotted path, or null.
template <class Plan, class Schedule>
const auto* find_param(const Plan& plan, const Schedule& sched, std::string_view path) {
  for (const auto& p : sched.params)
    if (path_of(plan, p) == path) return &p;
  return static_cast<decltype(&sched.params[0])>(nullptr);
}

// The model's vocabulary, as its ops declared it (Schedule::vocab: the LM
// head's rows, else the embedding's, for a first pipeline stage); 0 without
// either (-1 for a pipeline stage between: it reads no token id).
template <class Schedule>
constexpr std::int64_t vocab_size(const Schedule& sched) {
  return sched.vocab > 0 ? sched.vocab : sched.config.pp > 1 ? -1 : 0;
}

// Pipeline parallelism's 1F1B order on stage `stage` of `stages`, for K
// micro-batches: as many forwards as there are stages after it (at most K),
// then a forward and a backward in turn, then the backwards left.
// forward(m) and backward(m) run micro-batch m's.
template <class Forward, class Backward>
void one_forward_one_backward(int stages, int stage, int micro_batches, Forward&& forward, Backward&& backward) {
  const int warmup = std::min(stages - 1 - stage, micro_batches);
  int forwards = 0, backwards = 0;
  while (forwards < warmup) forward(forwards++);
  while (forwards < micro_batches) {
    forward(forwards++);
    backward(backwards++);
  }
  while (backwards < micro_batches) backward(backwards++);
}

}  // namespace trainers
}  // namespace headroom
