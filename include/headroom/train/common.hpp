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

#include "../ops/embedding.hpp"
#include "../ops/lm_head_loss.hpp"
#include "../layers/pipeline_stages.hpp"
#include "../plan/graph.hpp"
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

// The model's vocabulary: the LM head's rows, else the embedding's (a first
// pipeline stage); 0 without either (-1 for a pipeline stage between: it
// reads no token id).
template <class Schedule>
constexpr std::int64_t vocab_size(const Schedule& sched) {
  // with tensor parallelism, a step holds one rank's block of rows
  for (const auto& s : sched.steps)
    if (s.op == ops::LmHeadLoss::name)
      return s.dim[ops::LmHeadLoss::vocab.index] * std::max<std::int64_t>(1, s.dim[ops::LmHeadLoss::ranks.index]);
  for (const auto& s : sched.steps)
    if (s.op == ops::Embedding::name)
      return s.dim[ops::Embedding::vocab.index] * std::max<std::int64_t>(1, s.dim[ops::Embedding::ranks.index]);
  return sched.config.pp > 1 ? -1 : 0;
}

// Data parallelism (ZeRO 1-3): the elements of parameter p that rank `rank`
// updates (its shard, cut at the parameter's end: none past it) and where
// they start in its weight and gradient buffers (ZeRO 3 stores the weight's
// shard alone, ZeRO 2 and 3 the gradient's); without sharding, all of them.
struct Owned {
  std::int64_t begin = 0, count = 0, weight_at = 0, grad_at = 0;  // begin: the first element's index in the parameter
};
template <class Param>
constexpr Owned owned(const RunConfig& config, const Param& p, int rank) {
  if (!config.sharded(1)) return Owned{0, p.elements(), 0, 0};
  const std::int64_t begin = rank * p.shard;
  const std::int64_t count = std::clamp<std::int64_t>(p.elements() - begin, 0, p.shard);
  return Owned{begin, count, config.sharded(3) ? 0 : begin, config.sharded(2) ? 0 : begin};
}

// Counter-based random numbers: the value of element i of a parameter never
// depends on threads or order (splitmix64).
constexpr std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline double uniform01(std::uint64_t key, std::uint64_t i) {
  return (static_cast<double>(mix(key ^ mix(i)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
inline double normal(std::uint64_t key, std::uint64_t i) {
  const double u1 = uniform01(key, 2 * i), u2 = uniform01(key, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Initial values, keyed by the parameter's path (the same layer gets the
// same values whatever policies wrap it: LoRA with B = 0 reproduces its base
// bit for bit). As its layer declared them (ParamInit, core/param_init.hpp),
// or by its name, GPT-2 / Llama style: N(0, 0.02) matrices and embeddings,
// norms 1, biases 0; LoRA A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's
// Kaiming-uniform), B = 0.
class InitialValues {
 public:
  InitialValues(std::uint64_t seed, std::string_view path, std::string_view layer_kind, std::string_view name, std::int64_t cols,
                ParamInit init = {})
      : key_(mix(seed)), sqrt_cols_(std::sqrt(double(cols))) {
    if (init.kind != ParamInit::Kind::by_name) init_ = init;
    else if (name == "bias" || name == "lora_B") init_ = ParamInit::constant(0.0);
    else if (layer_kind == "RMSNorm" || layer_kind == "LayerNorm") init_ = ParamInit::constant(1.0);
    else if (name == "lora_A") lora_a_ = true;
    else init_ = ParamInit::normal(0.02);
    for (const char c : path) key_ = mix(key_ ^ static_cast<unsigned char>(c));
  }
  double operator()(std::int64_t i) const {
    const auto u = static_cast<std::uint64_t>(i);
    if (lora_a_) return (2.0 * uniform01(key_, u) - 1.0) / sqrt_cols_;  // divided by sqrt(in), as PEFT's bound is
    switch (init_.kind) {
      case ParamInit::Kind::constant: return init_.value;
      case ParamInit::Kind::uniform: return (2.0 * uniform01(key_, u) - 1.0) * init_.value;
      case ParamInit::Kind::normal: return init_.value * normal(key_, u);
      case ParamInit::Kind::by_name: break;  // resolved by the constructor
    }
    return 0.0;
  }

 private:
  std::uint64_t key_;
  ParamInit init_{};     // what the layer said, or what the name picks
  bool lora_a_ = false;  // LoRA's A by name: Kaiming-uniform over in features
  double sqrt_cols_;
};

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

// Pipeline parallelism with an LM head tied to the embedding table
// (layers/pipeline_stages.hpp): the first stage holds the table, the last a
// copy; before the update both add the other's gradient of it to their own
// (ParamSlot::stage_shared; the whole gradient, with ZeRO 2 and 3 this
// rank's shard of it), and the gradient norm counts it on the first stage
// alone. With more than 2 stages the pair of process w (data-parallel rank
// d, tensor-parallel rank t) is a group split from the world by this
// color; with 2 it is the stages' own communicator.
template <class R>
inline constexpr bool tied_stages = R::config().pp > 1 && pipeline_stages::tied_head<typename R::model>();
constexpr int tied_stages_color(const RunConfig& c, int w) {
  const int t = w % c.tp, d = (w / c.tp) % c.dp, stage = w / (c.tp * c.dp);
  return stage == 0 || stage == c.pp - 1 ? d * c.tp + t : c.dp * c.tp + w;  // the middle stages: each alone
}
// The elements of a gradient that several processes sum before the update
// (a table both end stages hold; a LoRA matrix every tensor-parallel rank
// holds whole, ParamSlot::tensor_partial), and where they start: the
// whole gradient, or with ZeRO 2 and 3 this rank's shard (the same
// elements on each of those processes).
template <class T, class Arena, class Param>
std::pair<T*, std::int64_t> gradient_to_sum(const RunConfig& c, const Arena& arena, const Param& p) {
  return c.sharded(2) ? std::pair<T*, std::int64_t>{arena.template at<T>(p.grad_shard), p.shard}
                      : std::pair<T*, std::int64_t>{arena.template at<T>(p.grad), p.elements()};
}

// ---- the gradient check's messages (both engines) -------------------------------------------------------
inline std::string short_number(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", x);
  return b;
}
// What is wrong with parameter p's gradient: its element `element`
// (row-major) is `value`, or (element < 0) the squares of its elements (own)
// or of the step's gradients sum to `value`, beyond f32's range.
template <class Param>
std::string describe_bad_gradient(const Param& p, std::int64_t element, double value, bool own, double max_squares) {
  if (element >= 0)
    return "its element [" + std::to_string(element / p.cols) + ", " + std::to_string(element % p.cols) + "] of (" +
           std::to_string(p.rows) + ", " + std::to_string(p.cols) + ") is " + short_number(value);
  return std::string(own ? "its elements are finite, but their squares sum to "
                         : "every element is finite, but the squares of the step's gradients (this one the largest) sum to ") +
         short_number(value) + ", beyond f32's range (" + short_number(max_squares) + ")";
}
// The rest of the message when parameters are updated as their gradients
// complete (`how`: "UpdateInBackward", "OffloadOptimizer without clipping")
// and one failed: `updated` ran before `first_failed` (in backward order),
// `skipped` did not.
inline std::string skipped_updates(std::string_view how, int updated, const std::string& first_failed, int skipped, int step_no) {
  return "; " + std::string(how) + ": the " + std::to_string(updated) +
         " parameters whose gradients were complete and checked before the first that failed in backward order (" + first_failed +
         ") keep their update, the other " + std::to_string(skipped) +
         " were not updated; no non-finite gradient reached a weight or an optimizer state, and the step count stays " +
         std::to_string(step_no - 1);
}

// The initial values of parameter p as tensor-parallel rank `tensor_rank`
// holds it: element i of its block is element p.split.whole_index(i) of the
// whole parameter (all of it, in order, for a parameter that is not split).
// Both engines' trainers start from these.
template <class Plan, class Param>
auto initial_values(std::uint64_t seed, const Plan& plan, const Param& p, int tensor_rank) {
  return [whole = InitialValues(seed, path_of(plan, p), plan.nodes[p.node].kind, p.name, p.split.whole_cols(p.cols), p.init), &p,
          tensor_rank](std::int64_t i) { return whole(p.split.whole_index(p.rows, p.cols, tensor_rank, i)); };
}

}  // namespace trainers
}  // namespace headroom
