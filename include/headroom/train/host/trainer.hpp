#pragma once
// host::Trainer<Run>: trains Run on the CPU inside exactly the planned arena.
//
//   using Run = Train<models::Llama<models::tiny_llama>, Batch<8>, Seq<128>, Workers<2>>;
//   host::Trainer<Run> t({.lr = 1e-3, .warmup_steps = 20, .total_steps = 500});
//   StepStats s = t.step(tokens, targets);   // (Accumulate, Batch, Seq) int32 each
//
// At construction the trainer allocates one arena per tier of the plan's
// peak bytes (the offload tier as a file-backed mapping) and nothing else
// that a step touches. A step walks schedule<Run>() — the constexpr list of
// events with every tensor's offset — and runs one kernel per event:
// forward, the fused LM head + loss, backward (with recompute and tier copies
// where the plan put them) and the optimizer pass. No allocation happens
// inside a step (tests/runtime/host_memory.cpp counts them).
//
// The trainer is built of bases that reach it as their derived class
// (CRTP): trainers::Driver (the step's order of events, train/driver.hpp),
// detail::Parameters (where the parameters and the optimizer state live
// and how they are set: parameters.hpp), detail::Update (the optimizer
// step: update.hpp) and detail::OffloadOptimizer (ZeRO-Offload's way to
// the offload tier and back, its update thread: offload_optimizer.hpp).
//
// Run options the engine honours: Precision<F32>, Precision<BF16> or
// Precision<F16> (16-bit weights, activations and gradients, f32 master
// weights, statistics and sums: host/storage.hpp; one process, without
// offloading, for now; an F16 run scales its loss by default) or
// Precision<F64> (f64 for gradient checks), Batch, Seq, the optimizer, Accumulate<K> (step() takes K
// micro-batches), UpdateInBackward (each parameter is updated as soon as its
// gradient is complete; no global-norm clipping then), Workers<W> (up to W
// threads; the plan holds W private scratch tiles), LossChunk.
//
// A NaN or an infinity stops the step (docs/training.md, "What is guaranteed
// on a NaN"): a non-finite loss before the backward (non_finite_loss), a
// non-finite gradient, or one whose squares leave f32's range, before the
// update (non_finite_gradient; the global norm's pass is the check, so it
// costs nothing more). Either way the weights, the optimizer state and the
// step count stay as they were. With UpdateInBackward each parameter's
// update checks its own gradient first; from the first that fails no update
// runs, and the error comes when the backward has finished. With loss
// scaling (TrainOptions::loss_scaling) a non-finite scaled gradient skips
// the step instead (StepStats::skipped) and backs the scale off.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "../../host/arena.hpp"
#include "../../host/gemm.hpp"
#include "../../host/lane_worker.hpp"
#include "../../host/op_context.hpp"
#include "../../ops/host_kernels.hpp"
#include "../../plan/plan.hpp"
#include "../../plan/schedule.hpp"
#include "../common.hpp"
#include "../driver.hpp"
#include "../gradient_check.hpp"
#include "../op_table.hpp"
#include "../with_pipeline_stage.hpp"
#include "offload_optimizer.hpp"
#include "parameters.hpp"
#include "update.hpp"

namespace headroom::host {

using headroom::non_finite_gradient;
using headroom::non_finite_loss;
using headroom::StepStats;
using headroom::TrainOptions;

namespace detail {
template <DType D>
struct host_scalar {
  static_assert(D == DType::F32 || D == DType::F64 || D == DType::BF16 || D == DType::F16,
                "host::Trainer<Run>: the host engine runs Precision<F32>, <BF16>, <F16> or <F64>");
  using type = std::conditional_t<D == DType::F64, double,
                                  std::conditional_t<D == DType::BF16, bf16, std::conditional_t<D == DType::F16, f16, float>>>;
};
template <TrainingRun R>
using host_scalar_t = typename host_scalar<R::dtype>::type;

// Every op of the model runs on the host engine: it has host kernels, on
// the compute lane or the host-threads lane.
template <class T, class E>
constexpr bool check_kernel() {
  using O = typename E::op;
  HEADROOM_REQUIRE((ops::RunsOn<O, OpContext<T>>),
                   "host::Trainer: the op {} of layer {} has no kernel for the host engine (it needs static forward(const "
                   "host::OpContext<T>&) and backward(const host::OpContext<T>&), or loss(k, grads))",
                   &O::name, &E::layer::kind);
  return true;
}
template <class T, class... Es>
constexpr bool check_kernels(type_list<Es...>) {
  return (check_kernel<T, Es>() && ...);
}
// An op on the communication lane runs a collective through the ranks'
// communicator, which only a data-parallel run has.
template <class E, int Ranks>
constexpr bool check_lane() {
  using O = typename E::op;
  HEADROOM_REQUIRE(ops::lane_of<O>() != ops::Lane::communication || Ranks > 1,
                   "host::Trainer: the op {} of layer {} runs on the communication lane, which needs the ranks of a data-parallel "
                   "run (DataParallel<N> with N at least 2; this run has {})",
                   &O::name, &E::layer::kind, Ranks);
  return true;
}
template <int Ranks, class... Es>
constexpr bool check_lanes(type_list<Es...>) {
  return (check_lane<Es, Ranks>() && ...);
}
}  // namespace detail

template <TrainingRun R>
class Trainer : public trainers::Driver<Trainer<R>, R, Communicator>,
                public detail::OffloadOptimizer<Trainer<R>, detail::host_scalar_t<R>>,
                public detail::Parameters<Trainer<R>, detail::host_scalar_t<R>>,
                public detail::Update<Trainer<R>, detail::host_scalar_t<R>> {
  using Base = trainers::Driver<Trainer<R>, R, Communicator>;
  using Offload = detail::OffloadOptimizer<Trainer<R>, detail::host_scalar_t<R>>;
  using Params = detail::Parameters<Trainer<R>, detail::host_scalar_t<R>>;
  using Update = detail::Update<Trainer<R>, detail::host_scalar_t<R>>;
  friend Base;
  friend Offload;
  friend Params;
  friend Update;
  using Base::check_batch, Base::evaluating_, Base::groups_, Base::micro_, Base::micro_batch, Base::micro_batches,
      Base::micro_copy_, Base::opt_, Base::owned, Base::scaler_, Base::step_, Base::forward, Base::backward;
  using Offload::traffic_, Offload::start_step, Offload::settle_updates, Offload::trace_clock, Offload::record, Offload::load_gradients,
      Offload::offload_completed, Offload::offloaded_update;
  using Params::set_up_parameters;
  using Update::update, Update::update_in_backward;

 public:
  static constexpr const char* engine_name = "host::Trainer";
  using Base::lr_at, Base::node_path, Base::path_of, Base::rank, Base::tensor_rank, Base::tokens_per_micro_batch,
      Base::tokens_per_step, Base::vocab_size;
  using T = detail::host_scalar_t<R>;  // storage: float, double, bf16 or f16
  using C = compute_t<T>;              // what the kernels compute in: float or double
  using run = R;
  static constexpr auto plan = headroom::plan<R>();
  static constexpr auto sched = headroom::detail::schedule_of_plan<R>(plan);
  static constexpr RunConfig config = R::config();
  static_assert(config.engine == Engine::host,
                "host::Trainer<Run>: the run is planned for the CUDA engine (OnCuda), whose workspace and scratch the host kernels "
                "cannot use; drop OnCuda from Train<...> to train it on the host");
  static_assert(!half_storage<T> || (config.world() == 1 && !config.offload_optimizer && !config.offload_params),
                "host::Trainer: Precision<BF16> and <F16> on the host engine train one process without offloading; "
                "DataParallel, TensorParallel, PipelineParallel, OffloadOptimizer and OffloadParameters run Precision<F32> here");
  using Ops = trainers::OpTable<R, sched>;
  // A micro-batch runs schedule steps [1, micro_batch_end); the update follows.
  static constexpr int micro_batch_end = sched.update_step >= 0 ? sched.update_step : static_cast<int>(sched.steps.size());
  // every op of the plan is listed by a layer and has this engine's kernels
  static_assert(sizeof(Ops) > 0 && detail::check_kernels<T>(typename Ops::ops{}) &&
                detail::check_lanes<config.dp>(typename Ops::ops{}));
  // Data parallelism: the ranks of the run, and what they shard (ZeRO).
  static constexpr int ranks = config.dp;
  // Every process of the run: data-parallel groups of tensor-parallel ranks.
  static constexpr int world_size = config.world();

  // Options are always given: host::Trainer<R> t({}) for the defaults, or
  // t({.lr = 1e-3, ...}). (A default argument would make t({}) ambiguous with
  // the copy and move constructors.)
  explicit Trainer(TrainOptions o) : Trainer(o, nullptr) {
    static_assert(config.world() == 1,
                  "host::Trainer: a run with DataParallel<N> or TensorParallel<N> trains one rank of several; construct it with "
                  "the ranks' communicator: host::Trainer<Run> t(options, comm) (an MpiCommunicator of headroom/host/mpi.hpp "
                  "under mpirun)");
  }
  // One rank of a parallel run: `comm` joins every process of the run (it
  // must have exactly PipelineParallel<S> x DataParallel<N> x
  // TensorParallel<M> of them, every one built from this run type (a
  // pipeline stage: from a stage of it) and given the same seed: checked
  // here, on every rank). Process w is tensor-parallel rank w % M of
  // data-parallel rank (w / M) % N of stage w / (N M) (the tensor-parallel
  // ranks of a group are neighbours, as a launcher places them on one
  // node). Each data-parallel rank step()s its own micro-batches (its
  // tensor-parallel ranks and stages the same ones); gradients are averaged
  // over the data-parallel ranks.
  Trainer(TrainOptions o, Communicator& comm) : Trainer(o, &comm) {}

 private:
  Trainer(TrainOptions o, Communicator* comm)
      : Base(o, comm),
        device_(plan.peak_bytes(Tier::device)),
        offload_(plan.peak_bytes(Tier::offload), o.offload_dir.empty() ? default_offload_dir() : o.offload_dir) {
    workers_ = o.threads <= 0 ? config.workers : o.threads;
    if (workers_ > config.workers)
      throw std::invalid_argument("host::Trainer: " + std::to_string(workers_) + " threads asked, but the plan holds scratch for " +
                                  std::to_string(config.workers) + " workers (Workers<W> in the run type)");
    if ((config.tp > 1 || config.pp > 1) && o.overlap_communication)
      throw std::invalid_argument(
          "host::Trainer: overlap_communication runs data-parallel collectives on a second thread, while a tensor- or "
          "pipeline-parallel run exchanges activations on the compute thread; one process calls its communicators from one "
          "thread at a time, so set overlap_communication = false with TensorParallel or PipelineParallel");
    panels_ = GemmPanels<C>{sched.gemm_panels.bound() ? device_.at<C>(sched.gemm_panels.offset) : nullptr,
                            sched.gemm_panels.bytes / static_cast<std::int64_t>(sizeof(C)) / config.workers};
    set_up_parameters(o.seed);
  }

 public:

  // ---- event by event (for tools that check kernels: testing/layer_test.hpp) -----------------------------
  // Loads one micro-batch; then run_event(g) runs step g of the schedule
  // (g from 1 up to the update step, in order): a forward, recompute,
  // backward or tier copy, or the loss, whose mean it returns and stores.
  void load(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    check_batch(tokens, targets, tokens_per_micro_batch);
    if (config.accumulate > 1) zero_grads();
    load_batch(tokens, targets);
  }
  // (An op on the host-threads lane has finished when run_event returns.)
  double run_event(std::size_t g) {
    const Step& st = sched.steps.at(g);
    if (st.kind != EventKind::loss) {
      run_step(st);
      join_all();
      return 0;
    }
    const double loss = loss_step(st, true) / tokens_per_micro_batch;
    *ptr<C>(sched.loss) = static_cast<C>(loss);
    return loss;
  }

  // ---- the arena ---------------------------------------------------------------------------------------
  std::int64_t arena_bytes(Tier t = Tier::device) const { return t == Tier::device ? device_.bytes() : offload_.bytes(); }
  const Arena& arena(Tier t = Tier::device) const { return t == Tier::device ? device_ : offload_; }
  // (The process's ranks and groups, and shard_of(p): trainers::Driver.
  // OffloadOptimizer's tier_traffic(), update_chunk and trace_into():
  // train/host/offload_optimizer.hpp.)
  using typename Offload::Span;
  int threads() const { return workers_; }
  const GemmPanels<C>& gemm_panels() const { return panels_; }

  // ---- parameters ----------------------------------------------------------------------------------------
  // Where they live and how they are set: train/host/parameters.hpp.
  static constexpr std::size_t param_count = sched.params.size();

 private:
  float step_scale_ = 1.0f;  // the loss scale of the step in progress (1 outside step(): forward_backward's gradients are true)
  bool skipped_ = false;     // the step's scaled gradients overflowed: update() updated nothing
  static constexpr bool tied_stages = trainers::tied_stages<R>;
  bool updating_ = false;         // in step(): the last micro-batch's gradients go on to the update
  Arena device_, offload_;
  GemmPanels<C> panels_{};
  int workers_ = 1;
  // What the step's gradient check has found (UpdateInBackward and the
  // updates in flight of OffloadOptimizer fill it parameter by parameter).
  trainers::GradientCheck checked_{};

  // ---- the host-threads lane ----------------------------------------------------------------------------
  // Ops on ops::Lane::host_threads run on a LaneWorker thread beside the
  // steps after them; before step g the trainer waits for the latest lane
  // step that a step up to g conflicts with (the worker runs in order, so
  // that covers every earlier one), and for all of them at the end of a
  // micro-batch.
  // Steps grouped by a step each names (at(j): a step index, or -1 for
  // none), as lists per step h: [first[h], first[h + 1]) of `step`.
  struct StepLists {
    std::array<int, sched.steps.size() + 1> first{};
    std::array<int, sched.steps.size()> step{};
  };
  template <class At>
  static constexpr StepLists step_lists(At at) {
    StepLists l{};
    constexpr std::size_t n = sched.steps.size();
    for (std::size_t j = 0; j < n; ++j)
      if (at(j) >= 0 && at(j) < static_cast<int>(n)) ++l.first[static_cast<std::size_t>(at(j)) + 1];
    for (std::size_t h = 0; h < n; ++h) l.first[h + 1] += l.first[h];
    std::array<int, n + 1> fill = l.first;
    for (std::size_t j = 0; j < n; ++j)
      if (at(j) >= 0 && at(j) < static_cast<int>(n)) l.step[static_cast<std::size_t>(fill[static_cast<std::size_t>(at(j))]++)] = static_cast<int>(j);
    return l;
  }

  // Ops on the communication lane (the collectives of data parallelism) run
  // the same way on a second LaneWorker thread; MPI is called from one
  // thread at a time (the trainer joins that lane before calling it).
  static constexpr auto joins = trainers::join_steps<sched, micro_batch_end>();
  // per step h: the lane steps that must be complete before it, as a list
  // (CSR: [first[h], first[h + 1])). Each is waited for by its ticket: a lane
  // runs its tasks in the order they were submitted, which ZeRO 3's hoisted
  // gathers make differ from the steps' order.
  static constexpr auto join_lists = step_lists([](std::size_t j) { return joins[j]; });
  template <ops::Lane L>
  static constexpr bool has_lane = [] {
    for (std::size_t j = 0; j < joins.size(); ++j)
      if (joins[j] >= 0 && sched.steps[j].lane == L) return true;
    return false;
  }();
  using Lane = LaneWorker<OpContext<T>>;
  std::unique_ptr<Lane> lane_ = has_lane<ops::Lane::host_threads> ? std::make_unique<Lane>() : nullptr;
  std::unique_ptr<Lane> comm_lane_ =
      has_lane<ops::Lane::communication> && opt_.overlap_communication ? std::make_unique<Lane>() : nullptr;
  std::array<std::uint64_t, sched.steps.size()> tickets_{};
  void join_before(int g) {
    for (int k = join_lists.first[g]; k < join_lists.first[g + 1]; ++k) {
      const int j = join_lists.step[k];
      Lane* lane = (sched.steps[j].lane == ops::Lane::communication ? comm_lane_ : lane_).get();
      if (lane != nullptr) lane->wait(tickets_[j]);  // null: the collectives run in order
    }
  }
  void join_all() {
    if constexpr (has_lane<ops::Lane::host_threads>) lane_->wait_all();
    if constexpr (has_lane<ops::Lane::communication>)
      if (comm_lane_) comm_lane_->wait_all();
  }
  // ZeRO 3's prefetch: the gathers the schedule lets start before step h
  // (Step::issue_before), as a list per step (CSR: [first[h], first[h + 1])).
  static constexpr auto hoisted = step_lists([](std::size_t g) { return sched.steps[g].issue_before; });
  void issue_hoisted(int h) {
    for (int k = hoisted.first[h]; k < hoisted.first[h + 1]; ++k) {
      const Step& st = sched.steps[hoisted.step[k]];
      if (st.kind == EventKind::fetch) fetch(st, true);  // ZeRO 3's shards in the offload tier: before their gather
      else forward(st, true);
    }
  }
  // Data parallelism: the mean over the ranks of a value each rank computed
  // for its own micro-batch (the loss), on every rank. The communication
  // lane is idle first: MPI is called from one thread at a time.
  double mean_over_ranks(double x) {
    if (groups_.data == nullptr) return x;
    if constexpr (has_lane<ops::Lane::communication>)
      if (comm_lane_) comm_lane_->wait_all();
    groups_.data->all_reduce_sum(&x, 1, DType::F64);
    return x / groups_.data->size();
  }
  template <class O>
  static void lane_forward(const OpContext<T>& k) {
    O::forward(k);
  }
  template <class O>
  static void lane_backward(const OpContext<T>& k) {
    O::backward(k);
  }

  template <class U = T>
  U* ptr(const Slot& s) const {
    return s.bound() ? device_.at<U>(s.offset + micro_copy_ * s.stride) : nullptr;
  }

  void load_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    std::memcpy(ptr<std::int32_t>(sched.tokens), tokens.data(), tokens.size_bytes());
    std::memcpy(ptr<std::int32_t>(sched.targets), targets.data(), targets.size_bytes());
  }

  // ---- the step (trainers::Driver calls these) -------------------------------------------------------------
  // One step: the micro-batches, then the update; true when a scaled gradient overflowed (nothing was updated).
  bool train(StepStats& s, std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    const int step_no = step_ + 1;
    if (config.accumulate > 1 && !config.offload_optimizer) zero_grads();  // offloaded: Step::grad_load
    checked_ = trainers::GradientCheck{};
    updating_ = true;
    skipped_ = false;
    step_scale_ = scaler_.scale();
    start_step();
    struct Done {  // on every way out of the step
      Trainer& t;
      ~Done() {
        t.updating_ = false;
        t.step_scale_ = 1.0f;
        t.settle_updates();
      }
    } done{*this};
    tokens_ = tokens;
    targets_ = targets;
    step_loss_ = 0;
    micro_batches();
    if constexpr (config.pp > 1) {
      // the last stage's loss on every stage, then its mean over the data-parallel ranks; a
      // non-finite one stops the step on every stage after the backward, before any update
      if (!config.last_stage()) step_loss_ = 0;
      groups_.pipe->all_reduce_sum(&step_loss_, 1, DType::F64);
      step_loss_ = mean_over_ranks(step_loss_);
      if (!std::isfinite(step_loss_)) throw non_finite_loss(step_no, step_loss_);
    }
    s.loss = step_loss_;
    if constexpr (config.update_in_backward) {
      if (checked_.first >= 0) checked_.throw_skipped_updates(plan, sched, step_no, "UpdateInBackward");
      s.grad_norm = std::sqrt(checked_.squares);
    } else if constexpr (config.offload_optimizer) {
      s.grad_norm = offloaded_update(step_no);
    } else {
      s.grad_norm = update(step_no);
    }
    return skipped_;
  }
  // forward_backward(): one micro-batch, as the step's last (a data-parallel run averages the gradients).
  double gradients(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    if (config.accumulate > 1) zero_grads();
    tokens_ = tokens;
    targets_ = targets;
    micro_batch(0, config.accumulate - 1);
    return micro_loss_;
  }
  // evaluate(): the forward and the loss.
  double forward_only(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    load_batch(tokens, targets);
    if constexpr (config.pp > 1) {  // every stage its forward; the last stage's loss to all
      double loss = 0;
      for (int g = 1; g < sched.backward_step; ++g) {
        join_before(g);
        issue_hoisted(g);
        const Step& st = sched.steps[g];
        if (st.kind == EventKind::loss) loss = loss_step(st, false) / tokens_per_micro_batch;
        else run_step(st);
      }
      join_all();
      if constexpr (!config.last_stage()) groups_.pipe->finish_send(groups_.pipe->rank() + 1, ops::pipe_detail::activation_tag);
      groups_.pipe->all_reduce_sum(&loss, 1, DType::F64);
      return mean_over_ranks(loss);
    }
    for (int g = 1; g < sched.loss_step; ++g) {
      join_before(g);
      issue_hoisted(g);
      run_step(sched.steps[g]);
    }
    join_before(sched.loss_step);
    const double loss = mean_over_ranks(loss_step(sched.steps[sched.loss_step], false) / tokens_per_micro_batch);
    join_all();
    return loss;
  }

  std::span<const std::int32_t> tokens_, targets_;  // the step's (or forward_backward's) token ids and targets
  double step_loss_ = 0;   // the step's mean loss so far
  double micro_loss_ = 0;  // the last micro-batch's mean loss
  double event_began_ = 0;  // trace_into: when the event in progress began

  void begin_forward(int batch) {
    load_batch(tokens_.subspan(batch * tokens_per_micro_batch, tokens_per_micro_batch),
               targets_.subspan(batch * tokens_per_micro_batch, tokens_per_micro_batch));
  }
  void begin_backward() {}
  void before_event(int g) {
    join_before(g);
    issue_hoisted(g);
    if constexpr (config.offload_optimizer && config.accumulate > 1) load_gradients(sched.steps[g]);
    event_began_ = trace_clock();
  }
  // A pipeline stage's loss is summed over the stages after the step (train());
  // otherwise a micro-batch's loss, averaged over the ranks, must be finite.
  void event(int g) {
    const Step& st = sched.steps[g];
    if (st.kind != EventKind::loss) {
      run_step(st);
      return;
    }
    double loss = loss_step(st, true) / tokens_per_micro_batch;
    if constexpr (config.pp == 1) {
      loss = mean_over_ranks(loss);
      if (!std::isfinite(loss)) {
        join_all();
        throw non_finite_loss(step_ + 1, loss);
      }
    }
    *ptr<C>(sched.loss) = static_cast<C>(loss);
    micro_loss_ = loss;
    step_loss_ += loss / config.accumulate;
  }
  // The updates and copies the event made possible (the loss event
  // completes the gradient of an untied LM head).
  void after_event(int g) {
    const Step& st = sched.steps[g];
    if constexpr (config.update_in_backward) {
      if (st.update_end > st.update_begin) join_all();  // gradients a lane op writes are complete
      update_in_backward(st, step_ + 1);
    }
    if constexpr (config.offload_optimizer) offload_completed(st, step_ + 1);
    record(Span::step, g, event_began_);
  }
  void end_backward() { join_all(); }
  void end_pipeline() {}

  // Accumulate<K>: the gradients that live the whole step start at zero
  // (ZeRO 2 and 3: this rank's gradient shards; the buckets are written first by backward).
  void zero_grads() {
    for (const ParamSlot& p : sched.params) {
      if (p.grad_shard >= 0) std::memset(device_.at<std::byte>(p.grad_shard), 0, static_cast<std::size_t>(p.shard * sizeof(T)));
      else if (p.grad >= 0) std::memset(device_.at<std::byte>(p.grad), 0, static_cast<std::size_t>(p.elements() * sizeof(T)));
    }
  }

  // ---- one event ----------------------------------------------------------------------------------------
  void run_step(const Step& st) {
    switch (st.kind) {
      case EventKind::load_batch: break;
      case EventKind::forward:
      case EventKind::recompute: forward(st); break;
      case EventKind::loss: loss_step(st, true); break;
      case EventKind::backward: backward(st); break;
      case EventKind::offload:
        for (int c = st.copy_begin; c < st.copy_end; ++c) {
          const CopyStep& cp = sched.copies[c];
          const std::int64_t to = cp.to + cp.host_at(micro_copy_);
          offload_.write(to, device_.at<std::byte>(cp.from), cp.bytes);
        }
        break;
      case EventKind::prefetch:
        for (int c = st.copy_begin; c < st.copy_end; ++c) {
          const CopyStep& cp = sched.copies[c];
          offload_.read(cp.from + cp.host_at(micro_copy_), device_.at<std::byte>(cp.to), cp.bytes);
        }
        break;
      case EventKind::update: break;  // run by step() after the micro-batches
      case EventKind::collective: forward(st); break;
      case EventKind::fetch: fetch(st); break;
    }
  }
  // OffloadParameters: the next event's parameters (with ZeRO 3, this rank's
  // shards of them, for the gather), from the offload tier's file.
  // `hoisted` as for forward().
  void fetch(const Step& st, bool hoisted = false) {
    if (st.issue_before >= 0 && !hoisted) return;
    for (int c = st.copy_begin; c < st.copy_end; ++c) {
      const CopyStep& cp = sched.copies[c];
      offload_.read(cp.from, device_.at<std::byte>(cp.to), cp.bytes);
      traffic_.to_device += cp.bytes;
    }
  }

  T* param_grad(int k) const {
    return k >= 0 && sched.params[k].trainable && sched.params[k].grad >= 0 ? device_.at<T>(sched.params[k].grad) : nullptr;
  }

  // The kernels' view of a step: every operand resolved to its pointer.
  OpContext<T> context(const Step& st) const {
    OpContext<T> k{};
    trainers::bind_step(k, sched, st, device_.at<std::byte>(0), micro_copy_);
    k.n_workers = workers_;
    k.gemm_panels = panels_;
    k.comm = groups_.data;
    k.tensor_comm = groups_.tensor;
    k.pipe_comm = groups_.pipe;
    k.micro = micro_;
    k.seed = opt_.seed;
    k.step = evaluating_ ? 0 : step_ + 1;  // the step in progress
    k.loss_scale = step_scale_;
    k.data_rank = rank();
    k.tensor_rank = tensor_rank();
    k.tensor_ranks = config.tp;
    return k;
  }

  // An op on another lane than compute (Driver::forward, Driver::backward):
  // on the update thread (ops::Lane::host_threads), or on the communication
  // thread with overlap_communication (else here, in order: tickets_[g]
  // stays 0, which every wait has passed).
  template <class O>
  void on_lane(std::size_t g, const OpContext<T>& k, typename Base::Pass pass) {
    auto* run = pass == Base::Pass::forward ? &lane_forward<O> : &lane_backward<O>;
    if constexpr (ops::lane_of<O>() == ops::Lane::host_threads) tickets_[g] = lane_->submit(run, k);
    else if (this->opt_.overlap_communication) tickets_[g] = comm_lane_->submit(run, k);
    else run(k);
  }

  // The loss event (an op with a fused loss); returns the summed loss of the micro-batch.
  double loss_step(const Step& st, bool grads) {
    const std::size_t g = Base::index_of(st);
    const OpContext<T> k = context(st);
    double loss = 0;
    Ops::visit(g, [&]<class E>() {
      if constexpr (requires { E::op::loss(k, grads); }) loss = E::op::loss(k, grads);
      else Base::unsupported(st);
    });
    return loss;
  }
};

// Pipeline parallelism: calls f.template operator()<Stage>() with Stage =
// pipeline_stage<R, s> for this process's stage s (process w of the run is
// stage w / (DataParallel x TensorParallel)), so that one program trains
// every stage:
//
//   host::with_pipeline_stage<Run>(comm, [&]<class Stage>() {
//     host::Trainer<Stage> t(options, comm);
//     for (...) t.step(tokens, targets);  // every stage gets the step's micro-batches
//   });
//
// f is compiled for every stage.
template <TrainingRun R, class F>
void with_pipeline_stage(Communicator& world, F&& f) {
  constexpr RunConfig c = R::config();
  static_assert(c.pp > 1 && c.stage < 0, "host::with_pipeline_stage<Run>: Run must be a PipelineParallel<S> run type, its stage not chosen");
  if constexpr (c.pp > 1 && c.stage < 0) trainers::with_pipeline_stage<R>(world, std::forward<F>(f));
}

}  // namespace headroom::host
