#pragma once
// trainers::Driver: a training step, written once for both engines.
//
// host::Trainer<R> and cuda::Trainer<R> derive from Driver<Engine, R, Comm>
// (Engine: the trainer itself; Comm: its communicator type). The driver
// holds what every trainer is and does the same way:
//   - the public API: step(), forward_backward(), evaluate(); the learning
//     rate, the step count, the loss scaler's state; parameters by index and
//     by dotted path; the process's ranks and groups (train/topology.hpp,
//     joined and checked at construction) and its shards (ownership.hpp);
//   - the step's order of events: the micro-batches of Accumulate<K>, a
//     pipeline stage's under 1F1B, and per micro-batch the schedule's
//     events in order, each between the engine's before and after hooks;
//   - the step's end: the loss scaler learns whether a scaled gradient
//     overflowed (nothing was updated then and the step count stays).
//
// An engine brings what is its own: memory tiers, how an event runs (a
// host kernel on the step's threads; a CUDA kernel enqueued on a stream)
// and how the update runs. It declares `friend Base;` and implements
//
//   bool train(StepStats& s, tokens, targets)   one step: the micro-batches
//                                               (micro_batches()) and the update;
//                                               fills s.loss and s.grad_norm;
//                                               true: a scaled gradient overflowed
//   double gradients(tokens, targets)           forward_backward's micro-batch
//   double forward_only(tokens, targets)        evaluate's forward and loss
//   void begin_forward(int batch)               micro-batch `batch`'s tokens in
//   void begin_backward()                       (1F1B) a micro-batch's backward follows
//   void before_event(int g), event(int g), after_event(int g)
//                                               schedule step g and what goes
//                                               around it (lane joins, copies,
//                                               the updates it makes possible)
//   void end_backward()                         a micro-batch's events are all issued
//   void end_pipeline()                         (1F1B) every micro-batch is
//
// and the constants engine_name ("host::Trainer"), plan, sched and
// micro_batch_end (a micro-batch runs schedule steps [1, micro_batch_end)).
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../math/llm_int8.hpp"
#include "../run.hpp"
#include "common.hpp"
#include "loss_scaling.hpp"
#include "ownership.hpp"
#include "topology.hpp"

namespace headroom::trainers {

template <class Engine, TrainingRun R, class Comm>
class Driver {
  static constexpr RunConfig config_ = R::config();

 public:
  static constexpr std::int64_t tokens_per_micro_batch = config_.batch * config_.seq;
  static constexpr std::int64_t tokens_per_step = tokens_per_micro_batch * config_.accumulate;

  // ---- training -------------------------------------------------------------------------------------
  // One optimizer step: `accumulate` micro-batches of (batch, seq) token ids
  // and next-token targets, then the update.
  StepStats step(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    check_batch(tokens, targets, tokens_per_step);
    const int step_no = step_ + 1;
    StepStats s;
    s.step = step_no;
    s.lr = lr_at(step_no);
    s.loss_scale = scaler_.scale();
    const bool overflow = engine().train(s, tokens, targets);
    scaler_.update(overflow);
    if (overflow) {  // nothing was updated: the step count stays
      s.step = step_;
      s.skipped = true;
      return s;
    }
    step_ = step_no;
    return s;
  }

  // Forward and backward of one micro-batch, without the update: the
  // gradients stay in the trainer (for gradient checks). Returns its loss.
  double forward_backward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    static_assert(!config_.update_in_backward, "forward_backward: a run with UpdateInBackward updates during backward");
    static_assert(config_.pp == 1, "forward_backward: a pipeline stage runs its micro-batches with the others; use step()");
    check_batch(tokens, targets, tokens_per_micro_batch);
    return engine().gradients(tokens, targets);
  }

  // Mean loss of one micro-batch; no gradient, no update, no dropout. (A
  // pipeline stage: every stage its forward, the last stage's loss to all.)
  double evaluate(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    check_batch(tokens, targets, tokens_per_micro_batch);
    evaluating_ = true;
    struct Done {
      bool& flag;
      ~Done() { flag = false; }
    } done{evaluating_};
    return engine().forward_only(tokens, targets);
  }

  double lr_at(int step) const { return trainers::lr_at(opt_, step); }
  const TrainOptions& options() const { return opt_; }
  int steps_done() const { return step_; }
  void set_steps_done(int s) { step_ = s; }
  // Loss scaling (train/loss_scaling.hpp): the scaler's state (what checkpoints keep).
  bool scales_loss() const { return scaler_.enabled(); }
  const LossScaleState& loss_scale_state() const { return scaler_.state(); }
  void set_loss_scale_state(const LossScaleState& s) { scaler_.set_state(s); }

  // ---- processes ------------------------------------------------------------------------------------
  // Data parallelism: this process's rank (0 without a communicator) and
  // its ranks' communicator (null without one).
  int rank() const { return groups_.data_rank(); }
  Comm* communicator() const { return groups_.data; }
  // Tensor parallelism: this process's rank in its tensor-parallel group
  // (0 without one) and that group's communicator (null without one).
  int tensor_rank() const { return groups_.tensor_rank(); }
  Comm* tensor_communicator() const { return groups_.tensor; }
  // Pipeline parallelism: this process's stage (0 without) and its stages' communicator (null without).
  static constexpr int stage() { return config_.stage; }
  Comm* pipe_communicator() const { return groups_.pipe; }
  // The communicator of every process of the run (null for one process), and this process's rank in it.
  Comm* world() const { return groups_.world; }
  int world_rank() const { return groups_.world_rank(); }
  // The elements of parameter p this rank holds of what its ZeRO stage
  // shards: [begin, begin + count) of the parameter's row-major elements
  // (all of them for what is not sharded). With ZeRO<3> the stored weight
  // is this shard alone; with ZeRO 1-3 the optimizer state is the state of
  // the elements it updates.
  struct Shard {
    std::int64_t begin = 0, count = 0;
  };
  Shard shard_of(const ParamSlot& p) const {
    const Owned own = trainers::owned(config_, p, rank());
    return Shard{own.begin, own.count};
  }

  // ---- parameters -----------------------------------------------------------------------------------
  // The model's vocabulary (the LM head's rows).
  static constexpr std::int64_t vocab_size() { return trainers::vocab_size(Engine::sched); }
  static constexpr const ParamSlot& param(std::size_t i) { return Engine::sched.params[i]; }
  // The parameter's dotted path in the model: "layers.3.self_attn.q_proj.lora_A".
  static std::string path_of(const ParamSlot& p) { return trainers::path_of(Engine::plan, p); }
  static std::string node_path(int node, int instance) { return trainers::node_path(Engine::plan, node, instance); }
  // The parameter at a dotted path ("layers.0.self_attn.q_proj.lora_B"), or null.
  static const ParamSlot* find(std::string_view path) { return trainers::find_param(Engine::plan, Engine::sched, path); }

 protected:
  // Checks the options every engine refuses alike, then joins the run's
  // processes (null: one process) and checks them against the run type.
  Driver(TrainOptions o, Comm* world) : opt_(o), scaler_(o.loss_scaling, config_.dtype) {
    if (config_.update_in_backward && o.clip_norm > 0)
      throw std::invalid_argument(std::string(Engine::engine_name) +
                                  ": UpdateInBackward updates each parameter as soon as its gradient is complete, so global-norm "
                                  "clipping (which needs every gradient first) is unavailable; set clip_norm = 0");
    if (config_.update_in_backward && scaler_.enabled()) throw std::invalid_argument(loss_scaling_in_backward(Engine::engine_name));
    groups_ = join_world<R>(Engine::engine_name, world, Engine::sched, o.seed);
  }

  static void check_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::int64_t n) {
    trainers::check_batch(Engine::engine_name, config_, vocab_size(), tokens, targets, n);
  }

  // The elements of parameter p this process updates (ownership.hpp).
  Owned owned(const ParamSlot& p) const { return trainers::owned(config_, p, rank()); }

  // ---- the step's order of events ---------------------------------------------------------------------
  // Every event of micro-batch `batch` up to the update, forward and
  // backward, which the kernels see as micro-batch `micro` (forward_backward
  // runs its one micro-batch as the step's last).
  void micro_batch(int batch, int micro) {
    micro_ = micro;
    micro_copy_ = 0;
    engine().begin_forward(batch);
    events(1, Engine::micro_batch_end);
    engine().end_backward();
  }

  // Every micro-batch of the step: in order; or a pipeline stage's under
  // 1F1B (Narayanan et al. 2021, one_forward_one_backward): as many
  // forwards as the stages after this one (at most K), then a forward and a
  // backward in turn, then the backwards left. Micro-batch m uses copy
  // m % in_flight of what its forward keeps for its backward (micro_copy_,
  // Slot::stride).
  void micro_batches() {
    if constexpr (config_.pp > 1) {
      constexpr int forward_end = Engine::sched.backward_step, copies = config_.in_flight();
      one_forward_one_backward(
          config_.pp, config_.stage, config_.accumulate,
          [&](int m) {
            micro_ = m;
            micro_copy_ = m % copies;
            engine().begin_forward(m);
            events(1, forward_end);
          },
          [&](int m) {
            micro_ = m;
            micro_copy_ = m % copies;
            engine().begin_backward();
            events(forward_end, Engine::micro_batch_end);
            engine().end_backward();
          });
      micro_copy_ = 0;
      engine().end_pipeline();
    } else {
      for (int k = 0; k < config_.accumulate; ++k) micro_batch(k, k);
    }
  }

  // Schedule steps [from, to) of the micro-batch in progress, in order.
  void events(int from, int to) {
    for (int g = from; g < to; ++g) {
      engine().before_event(g);
      engine().event(g);
      engine().after_event(g);
    }
  }

  // ---- one schedule step's op -----------------------------------------------------------------------
  // Forward and recompute: the step's op, and the next one with it when it
  // runs in this op's epilogue. `hoisted`: a gather issued ahead of its
  // place (the engine's issue_hoisted); at its place it is then skipped. An
  // op on the compute lane runs here; an op on another lane goes to the
  // engine's on_lane<O>(g, k, pass).
  void forward(const Step& st, bool hoisted = false) {
    if (st.fused_into_previous) return;  // computed by the op before it
    if (st.issue_before >= 0 && !hoisted) return;
    const std::size_t g = index_of(st);
    auto k = engine().context(st);
    decltype(k) next{};
    if (st.fuse_next) {
      next = engine().context(Engine::sched.steps[g + 1]);
      k.next_ = &next;
      k.next_op_ = Engine::sched.steps[g + 1].op;
    }
    try {
      Engine::Ops::visit(g, [&]<class E>() {
        using O = typename E::op;
        if constexpr (!requires { O::forward(k); }) {
          unsupported(st);
        } else if constexpr (ops::lane_of<O>() == ops::Lane::compute) {
          O::forward(k);
        } else {
          k.next_ = nullptr;
          engine().template on_lane<O>(g, k, Pass::forward);
        }
      });
    } catch (const outlier_bound_exceeded& e) {  // LLM.int8: the batch is refused, naming the layer
      throw e.in(node_path(st.node, st.instance));
    }
  }
  void backward(const Step& st) {
    const std::size_t g = index_of(st);
    const auto k = engine().context(st);
    Engine::Ops::visit(g, [&]<class E>() {
      using O = typename E::op;
      if constexpr (!requires { O::backward(k); }) unsupported(st);
      else if constexpr (ops::lane_of<O>() == ops::Lane::compute) O::backward(k);
      else engine().template on_lane<O>(g, k, Pass::backward);
    });
  }
  enum class Pass { forward, backward };
  static std::size_t index_of(const Step& st) { return static_cast<std::size_t>(&st - Engine::sched.steps.data()); }
  [[noreturn]] static void unsupported(const Step& st) {
    throw std::logic_error(std::string(Engine::engine_name) + ": op '" + std::string(st.op) + "' has no kernel on this engine for event '" +
                           std::string(name_of(st.kind)) + "' of node " + node_path(st.node, st.instance));
  }

  TrainOptions opt_;
  LossScaler scaler_;
  Topology<Comm> groups_;  // the run's processes as groups (empty for one process)
  int step_ = 0;           // optimizer steps done
  int micro_ = 0;          // the micro-batch running, 0 .. accumulate - 1
  int micro_copy_ = 0;     // pipeline parallelism: the copy of the per-micro-batch buffers in use (Slot::stride)
  bool evaluating_ = false;  // in evaluate(): the kernels drop nothing (their step is 0)

 private:
  Engine& engine() { return static_cast<Engine&>(*this); }
};

}  // namespace headroom::trainers
