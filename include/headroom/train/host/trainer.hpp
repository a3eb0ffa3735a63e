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
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../host/arena.hpp"
#include "../../host/gemm.hpp"
#include "../../host/kernels/optimizer.hpp"
#include "../../host/lane_worker.hpp"
#include "../../host/op_context.hpp"
#include "../../host/quant.hpp"
#include "../../ops/host_kernels.hpp"
#include "../../plan/plan.hpp"
#include "../../plan/schedule.hpp"
#include "../common.hpp"
#include "../driver.hpp"
#include "../gradient_check.hpp"
#include "../initial_values.hpp"
#include "../offload_update.hpp"
#include "../op_table.hpp"
#include "../with_pipeline_stage.hpp"

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
class Trainer : public trainers::Driver<Trainer<R>, R, Communicator> {
  using Base = trainers::Driver<Trainer<R>, R, Communicator>;
  friend Base;
  using Base::check_batch, Base::evaluating_, Base::groups_, Base::micro_, Base::micro_batch, Base::micro_batches,
      Base::micro_copy_, Base::opt_, Base::owned, Base::scaler_, Base::step_, Base::forward, Base::backward;

 public:
  static constexpr const char* engine_name = "host::Trainer";
  using Base::lr_at, Base::node_path, Base::path_of, Base::rank, Base::tensor_rank, Base::tokens_per_micro_batch,
      Base::tokens_per_step, Base::vocab_size;
  using T = typename detail::host_scalar<R::dtype>::type;  // storage: float, double or bf16
  using C = compute_t<T>;                                   // what the kernels compute in: float or double
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
    fill_tables();
    initialize(o.seed);
    if constexpr (config.offload_params)  // the parameters written to the file need not stay in RAM
      for (const ParamSlot& p : sched.params) {
        const std::int64_t n = p.elements();
        if (p.quant.kind == QuantKind::none) {
          const std::int64_t stored = config.sharded(3) ? p.shard : p.trainable && config.sharded(1) ? p.shard * config.dp : n;
          offload_.release(p.weight, stored * static_cast<std::int64_t>(sizeof(T)));
        } else {  // ZeRO 3: this rank's shards of the codes and of the scales
          auto stored = [](std::int64_t b) { return config.sharded(3) ? config.shard_bytes(b) : b; };
          offload_.release(p.weight, stored(p.quant.code_bytes(n)));
          offload_.release(p.scales, stored(p.quant.scale_bytes(n)));
        }
      }
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
  // (The process's ranks and groups, and shard_of(p): trainers::Driver. With
  // ZeRO<3>, weight(p) and quant(p) hold this rank's shard alone (dense:
  // `count` values; quantized: its byte shards of the codes and scales),
  // state(p) with ZeRO 1-3 the state of the `count` elements it updates.)
  // OffloadOptimizer: bytes copied between the tiers in the last step
  // (gradients to the offload tier, and with Accumulate<K> their sums back;
  // with OffloadParameters the parameters fetched to the device too).
  struct TierTraffic {
    std::int64_t to_offload = 0, to_device = 0;
  };
  TierTraffic tier_traffic() const { return traffic_; }
  // OffloadOptimizer: a parameter is updated in ranges of so many elements,
  // each read from the offload tier's file into the plan's staging buffer
  // (sched.update_staging) and written back: no page of the tier is mapped
  // into the process by a step.
  static constexpr std::int64_t update_chunk = RunConfig::update_chunk;  // a multiple of AdamW8bit's block
  // the elements of a range the staging buffer holds: update_chunk, or the
  // largest parameter's when none has so many
  static constexpr std::int64_t staged_range = [] {
    std::int64_t largest = 0;
    for (const ParamSlot& p : sched.params)
      if (p.trainable) largest = std::max(largest, config.sharded(1) ? p.shard : p.elements());
    return std::min(largest, update_chunk);
  }();
  static constexpr std::int64_t staging_slot = config.update_staging_slot_bytes(staged_range);
  static_assert(!config.offload_optimizer || sched.update_staging.bytes >= config.workers * staging_slot,
                "host::Trainer: the plan's update staging buffer holds one range per worker");
  // A step's timeline, for tools that draw it (bench/offload.cpp): when
  // given a buffer, each step records the compute thread's schedule steps
  // and the update thread's work into it, as spans of seconds since the
  // step began, until the buffer is full. The buffer is the caller's: a
  // traced step allocates nothing.
  struct Span {
    enum Kind : std::uint8_t { step, update_in_flight, update_after } kind = step;
    int index = -1;  // the schedule step, or the parameter (sched.params); update_after: -1, the whole update
    double begin = 0, end = 0;
  };
  void trace_into(std::span<Span> spans) { trace_ = spans; }
  std::size_t traced() const { return std::min(traced_.load(), trace_.size()); }
  int threads() const { return workers_; }
  const GemmPanels<C>& gemm_panels() const { return panels_; }

  // ---- parameters ----------------------------------------------------------------------------------------
  static constexpr std::size_t param_count = sched.params.size();
  // A dense parameter's values (row-major rows x cols), or null for a quantized one.
  // Where the parameters are stored: the offload tier with OffloadParameters
  // (each event that reads them reads its fetched device copy), else the device tier.
  static constexpr Tier params_tier = config.offload_params ? Tier::offload : Tier::device;
  const Arena& params_arena() const { return arena(params_tier); }
  T* weight(const ParamSlot& p) const {
    return p.quant.kind == QuantKind::none ? params_arena().template at<T>(p.weight) : nullptr;
  }
  // The gradient as the update reads it: with OffloadOptimizer its copy in
  // the offload tier (the device's lives only until that copy).
  T* grad(const ParamSlot& p) const {
    if (p.host_grad >= 0) return offload_.at<T>(p.host_grad);
    return p.grad >= 0 ? device_.at<T>(p.grad) : nullptr;
  }
  // Where the optimizer state and master weights live: the offload tier
  // with OffloadOptimizer, else the device tier.
  static constexpr Tier states_tier = config.offload_optimizer ? Tier::offload : Tier::device;
  const Arena& states_arena() const { return arena(states_tier); }
  std::byte* state(const ParamSlot& p) const { return p.state >= 0 ? states_arena().template at<std::byte>(p.state) : nullptr; }
  // A bf16 run's trainable parameter: its f32 master weights (what the
  // update reads and writes; weight() holds them rounded). Null otherwise.
  float* master(const ParamSlot& p) const { return p.master >= 0 ? states_arena().template at<float>(p.master) : nullptr; }
  // The model's shared code tables (NF4 values, the dynamic map), or null.
  float* quant_table() const { return sched.quant_table >= 0 ? device_.at<float>(sched.quant_table) : nullptr; }
  QuantView quant(const ParamSlot& p) const {
    return QuantView{p.quant, params_arena().template at<std::uint8_t>(p.weight), params_arena().template at<std::uint8_t>(p.scales),
                     sched.quant_table >= 0 ? device_.at<float>(sched.quant_table) : nullptr, p.rows, p.cols};
  }
  // Sets a dense parameter's values (rows x cols, as weight() lays them
  // out): stored in T (a bf16 run: rounded), and its f32 master weights
  // exactly where it has them. What loaders write a bf16 run through.
  void set_dense(const ParamSlot& p, std::span<const float> x) {
    if (p.quant.kind != QuantKind::none || static_cast<std::int64_t>(x.size()) != p.elements())
      throw std::invalid_argument("host::Trainer::set_dense: " + path_of(p) + " is quantized or holds " +
                                  std::to_string(p.elements()) + " values, not " + std::to_string(x.size()));
    T* w = weight(p);
    float* m = master(p);
    for (std::size_t i = 0; i < x.size(); ++i) {
      w[i] = narrow<T>(static_cast<C>(x[i]));
      if (m != nullptr) m[i] = x[i];
    }
  }
  // Quantizes dense values into a quantized parameter: x (rows, cols) f32.
  void set_quantized(const ParamSlot& p, std::span<const float> x) {
    quantize_matrix(quant(p), x.data(), workers_);
  }
  // Zeroes every optimizer state and restarts the step count (after loading weights).
  void reset_optimizer() {
    for (const ParamSlot& p : sched.params)
      if (p.state >= 0) {  // ZeRO 1-3: the state of this rank's shard
        const std::int64_t bytes = config.optim.state_bytes(config.sharded(1) ? p.shard : p.elements());
        std::memset(state(p), 0, static_cast<std::size_t>(bytes));
        if constexpr (config.offload_optimizer) offload_.release(p.state, bytes);  // the file keeps it, not RAM
      }
    step_ = 0;
  }

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
    if constexpr (config.offload_optimizer) inflight_.begin_step();
    updating_ = true;
    skipped_ = false;
    step_scale_ = scaler_.scale();
    traffic_ = TierTraffic{};
    traced_ = 0;
    step_began_ = std::chrono::steady_clock::now();
    struct Done {  // on every way out of the step
      Trainer& t;
      ~Done() {
        t.updating_ = false;
        t.step_scale_ = 1.0f;
        if (t.updater_) t.updater_->settle();  // no update thread runs past the step
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
    event_began_ = trace_.empty() ? 0 : since_step_began();
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

  // ---- the update ------------------------------------------------------------------------------------------
  // A gradient stops the step when its squares leave f32's range
  // (train/gradient_check.hpp); the CUDA engine computes the norm in f32 and
  // stops on the same condition.
  static constexpr double max_squares = trainers::GradientCheck::max_squares;

  // Returns the global gradient norm before clipping. The norm's pass is the
  // check: only when its sum is out of range are the gradients searched, and
  // the step stops before any parameter is updated.
  double update(int step_no) {
    sum_partial_gradients();
    double sq = 0, split_sq = 0;  // split_sq: of the tensor-parallel ranks' blocks (each holds its own)
    for (std::size_t k = 0; k < sched.params.size(); ++k) {
      const ParamSlot& p = sched.params[k];
      if (p.trainable && !(p.stage_shared && !config.first_stage()))  // a table both end stages hold: counted on the first
        (p.split.split() ? split_sq : sq) += squares_of(k);
    }
    if constexpr (config.tp > 1) groups_.tensor->all_reduce_sum(&split_sq, 1, DType::F64);
    sq += split_sq;
    if constexpr (config.sharded(1)) groups_.data->all_reduce_sum(&sq, 1, DType::F64);  // each rank summed its shards
    if constexpr (config.pp > 1) groups_.pipe->all_reduce_sum(&sq, 1, DType::F64);  // each stage its parameters
    // Loss scaling: a scaled gradient with a NaN or an infinity, or whose
    // squares sum beyond f32's range (the CUDA engine's f32 norm overflows
    // there too), skips the step. Below that bound the update's factor,
    // clip scale / loss scale = clip / scaled norm, stays a normal f32.
    const double inverse = 1.0 / step_scale_;  // exact for a power of two
    if (scaler_.enabled() && !(sq <= max_squares)) {
      skipped_ = true;
      return std::sqrt(sq) * inverse;
    }
    sq *= inverse * inverse;
    if (!(sq <= max_squares)) stop_before_update(step_no, sq);
    const double norm = std::sqrt(sq);
    C scale = C(1);
    if (opt_.clip_norm > 0 && norm > opt_.clip_norm) scale = static_cast<C>(opt_.clip_norm / (norm + 1e-6));
    scale *= static_cast<C>(inverse);  // the update's gradient factor: clip scale / loss scale
    if constexpr (config.offload_optimizer) {
      const double began = trace_.empty() ? 0 : since_step_began();
      update_offloaded_all(step_no, scale);
      record(Span::update_after, -1, began);
    } else {
      for (const ParamSlot& p : sched.params)
        if (p.trainable) update_param(p, step_no, scale);
    }
    // ZeRO 1 and 2: every rank updated its shard of each weight; gather the others'
    if constexpr (config.sharded(1) && !config.sharded(3))
      for (const ParamSlot& p : sched.params)
        if (p.trainable) {
          groups_.data->all_gather(weight_storage(p), p.shard * static_cast<std::int64_t>(sizeof(T)));
          // OffloadParameters: gathered through the mapping; the file keeps the values, not RAM
          if constexpr (config.offload_params) offload_.release(p.weight, p.shard * config.dp * static_cast<std::int64_t>(sizeof(T)));
        }
    return norm;
  }
  // A dense parameter's stored values, in the tier that stores them.
  T* weight_storage(const ParamSlot& p) const { return params_arena().template at<T>(p.weight); }

  // Gradients whose parts several processes hold, summed on each before
  // the norm: with a tied LM head over pipeline stages, the table's of the
  // first and the last stage (trainers::tied_stages); with tensor
  // parallelism, a LoRA matrix's partial sums (ParamSlot::tensor_partial).
  void sum_partial_gradients() {
    for (const ParamSlot& p : sched.params) {
      if (!p.trainable || !(p.stage_shared || p.tensor_partial)) continue;
      // OffloadOptimizer: the offload tier's copy (the whole one, or this rank's shard, as on the device)
      const auto [g, n] = config.offload_optimizer ? std::pair<T*, std::int64_t>{offload_.at<T>(p.host_grad), streamed_gradient(p).second}
                                                   : trainers::gradient_to_sum<T>(config, device_, p);
      if constexpr (tied_stages)
        if (p.stage_shared) groups_.shared->all_reduce_sum(g, n, dtype_of<T>);
      if constexpr (config.tp > 1)
        if (p.tensor_partial) groups_.tensor->all_reduce_sum(g, n, dtype_of<T>);
    }
  }

  // ZeRO 1-3: the elements of parameter p this rank updates and where they
  // start in its weight and gradient buffers (trainers::owned, as the CUDA engine's).
  using Owned = trainers::Owned;
  // The averaged gradient the update reads: from its first owned element.
  T* update_grad(const ParamSlot& p) const {
    if constexpr (config.offload_optimizer) return offload_.at<T>(p.host_grad) + owned(p).grad_at;
    return device_.at<T>(config.sharded(2) ? p.grad_shard : p.grad) + owned(p).grad_at;
  }

  // The failure path of update() (trainers::GradientCheck::stop_before_update).
  [[noreturn]] void stop_before_update(int step_no, double total) {
    const double scale = static_cast<double>(step_scale_) * step_scale_;
    checked_.stop_before_update(
        plan, sched, step_no, total,
        [&](int k) { return squared_norm(update_grad(sched.params[k]), owned(sched.params[k]).count) / scale; },
        [&](int k) { return bad_element(k); });
  }

  // UpdateInBackward: the updates of the parameters whose gradients `st`
  // completed, in update order. Each checks its own gradient first (its
  // squared norm's pass; StepStats::grad_norm sums them). From the first
  // gradient that fails, no update of this step runs; the later gradients
  // are still checked (on this failure path only), so the error names the
  // first in schedule order, as without UpdateInBackward.
  void update_in_backward(const Step& st, int step_no) {
    for (int u = st.update_begin; u < st.update_end; ++u) {
      const int k = sched.updates[u];
      const ParamSlot& p = sched.params[k];
      const double sq = squared_norm(device_.at<T>(p.grad), p.elements());
      checked_.complete(k, sq, [&] { update_param(p, step_no, C(1)); }, [&](int j) { return bad_element(j); });
    }
  }

  // ---- OffloadOptimizer (ZeRO-Offload) ----------------------------------------------------------------------
  // At the end of the step that completes a gradient (Step::update_begin ..
  // update_end) the compute thread writes it from its device buffer to the
  // offload tier's file (with Accumulate<K> the sum so far: Step::grad_load
  // brought it back before its first writer). In step()'s last micro-batch
  // it then hands the parameter to the update thread, which sums its
  // squares and, when gradients are not clipped, updates it at once from the
  // offload tier: the host's update of the later layers overlaps the
  // backward of the earlier ones. With clipping (or several processes) the
  // norm needs every gradient first, so the update runs after the backward,
  // on the step's threads. Either way the tier is read and written through
  // the file, a range of update_chunk elements at a time (public, above).
  struct UpdateTask {
    Trainer* trainer = nullptr;
    int param = -1;
    int step_no = 0;
  };
  static void run_update_task(const UpdateTask& u) { u.trainer->gradient_offloaded(u.param, u.step_no); }
  std::unique_ptr<LaneWorker<UpdateTask>> updater_ =
      config.offload_optimizer ? std::make_unique<LaneWorker<UpdateTask>>() : nullptr;
  trainers::UpdatesInFlight inflight_{param_count};  // the updates during the backward and their squares
  TierTraffic traffic_{};
  std::span<Span> trace_{};
  std::atomic<std::size_t> traced_{0};
  std::chrono::steady_clock::time_point step_began_{};
  double since_step_began() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - step_began_).count(); }
  void record(typename Span::Kind kind, int index, double begin) {
    if (trace_.empty()) return;
    const std::size_t at = traced_.fetch_add(1);
    if (at < trace_.size()) trace_[at] = Span{kind, index, begin, since_step_began()};
  }

  // Accumulate<K>: the device gradient a step writes first in the
  // micro-batch starts from the offload tier's sum (Step::grad_load).
  void load_gradients(const Step& st) {
    for (int q = 0; q < graph::max_weights; ++q) {
      if (!st.grad_load[q]) continue;
      const ParamSlot& p = sched.params[st.param[q]];
      const auto [device, n] = streamed_gradient(p);
      const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
      if (micro_ == 0) {
        std::memset(device, 0, bytes);
      } else {
        offload_.read(p.host_grad, device, static_cast<std::int64_t>(bytes));
        traffic_.to_device += static_cast<std::int64_t>(bytes);
      }
    }
  }
  // The device gradient that goes to the offload tier: the whole one, or
  // with ZeRO 2 and 3 this rank's shard (what the update reads); and its elements.
  std::pair<T*, std::int64_t> streamed_gradient(const ParamSlot& p) const {
    if (config.sharded(2)) return {device_.at<T>(p.grad_shard), p.shard};
    return {device_.at<T>(p.grad), p.elements()};
  }

  // After step st: the gradients it completed go to the offload tier (a
  // lane op that writes one has finished first).
  void offload_completed(const Step& st, int step_no) {
    if (st.update_end == st.update_begin) return;
    join_all();
    stream_gradients(st, step_no);
  }

  void stream_gradients(const Step& st, int step_no) {
    for (int u = st.update_begin; u < st.update_end; ++u) {
      const int k = sched.updates[u];
      const ParamSlot& p = sched.params[k];
      const auto [from, n] = streamed_gradient(p);
      offload_.write(p.host_grad, from, n * static_cast<std::int64_t>(sizeof(T)));  // the sum so far (Step::grad_load)
      traffic_.to_offload += n * static_cast<std::int64_t>(sizeof(T));
      if (updating_ && micro_ == config.accumulate - 1) updater_->submit(&run_update_task, UpdateTask{this, k, step_no});
    }
  }

  // On the update thread: parameter k's gradient is in the offload tier.
  void gradient_offloaded(int k, int step_no) {
    const double began = trace_.empty() ? 0 : since_step_began();
    struct Record {
      Trainer& t;
      int k;
      double began;
      ~Record() { t.record(Span::update_in_flight, k, began); }
    } rec{*this, k, began};
    const ParamSlot& p = sched.params[k];
    inflight_.offloaded(
        k, offloaded_squares(p), updates_in_flight(),
        [&] {
          for (std::int64_t from = 0; from < owned(p).count; from += staged_range) update_offloaded_range(p, from, 0, step_no, C(1));
        },
        [&](int j) { return bad_element(j); });
  }
  // squared_norm of p's offloaded gradient, read range by range into the
  // staging buffer (the same sum: the ranges are multiples of 8 elements).
  double offloaded_squares(const ParamSlot& p) const {
    const std::int64_t n = owned(p).count, e = sizeof(T);
    T* g = device_.template at<T>(sched.update_staging.offset);  // the first worker's slot
    double lane[8] = {};
    for (std::int64_t from = 0; from < n; from += staged_range) {
      const std::int64_t len = std::min(staged_range, n - from);
      offload_.read(p.host_grad + (owned(p).grad_at + from) * e, g, len * e);
      squared_norm_add(g, len, lane);
    }
    return squared_norm_total(lane);
  }

  // Whether each update runs as soon as its gradient is offloaded (train/offload_update.hpp).
  bool updates_in_flight() const { return trainers::UpdatesInFlight::possible(opt_, groups_.world == nullptr, scaler_.enabled()); }

  // After the micro-batches: the updates ran during the backward, or
  // update() runs them now (reading the offload tier's gradients, with the
  // squares the update thread summed where no other process adds to them).
  double offloaded_update(int step_no) {
    updater_->wait_all();
    if (!updates_in_flight()) return update(step_no);
    return inflight_.norm(plan, sched, step_no);
  }
  // Parameter k's gradient's squares, over the elements this process updates.
  double squares_of(std::size_t k) const {
    const ParamSlot& p = sched.params[k];
    if constexpr (config.offload_optimizer)
      if (!(p.stage_shared || p.tensor_partial)) return inflight_.squares[k];  // summed on the update thread
    return squared_norm(update_grad(p), owned(p).count);
  }

  // The update from the offload tier after the backward: every trainable
  // parameter's ranges (staged_range elements) dealt round-robin to a team
  // of the workers, each updating its ranges in its own slot of the staging
  // buffer (one fork for the whole update, not one per range: a range's
  // work is too short to share).
  void update_offloaded_all(int step_no, C grad_scale) {
    std::exception_ptr failed[config.workers] = {};
    team(workers_, [&](int w, int team_size) {
      try {
        std::int64_t i = 0;  // the range's index over all parameters
        for (const ParamSlot& p : sched.params) {
          if (!p.trainable) continue;
          for (std::int64_t from = 0; from < owned(p).count; from += staged_range, ++i)
            if (i % team_size == w) update_offloaded_range(p, from, w, step_no, grad_scale);
        }
      } catch (...) {
        failed[w] = std::current_exception();
      }
    });
    for (const std::exception_ptr& f : failed)
      if (f) std::rethrow_exception(f);
  }
  // Elements [from, from + staged_range) of what this process updates of p
  // (fewer at its end), updated from the offload tier in staging slot
  // `slot`: the range's gradient, optimizer state (and with
  // OffloadParameters values) read from the file into the slot, updated
  // there (the device's weights in place otherwise), and written back.
  void update_offloaded_range(const ParamSlot& p, std::int64_t from, int slot, int step_no, C grad_scale) {
    const std::int64_t len = std::min(staged_range, owned(p).count - from), e = sizeof(T);
    std::byte* stage = device_.template at<std::byte>(sched.update_staging.offset + slot * staging_slot);
    T* g = reinterpret_cast<T*>(stage);
    T* staged_w = g + staged_range;  // OffloadParameters: the range's values
    std::byte* state = stage + align_up((config.offload_params ? 2 : 1) * staged_range * e, 256);
    offload_.read(p.host_grad + (owned(p).grad_at + from) * e, g, len * e);
    T* w = weight_storage(p) + owned(p).weight_at + from;
    if constexpr (config.offload_params) {
      offload_.read(p.weight + (owned(p).weight_at + from) * e, staged_w, len * e);
      w = staged_w;
    }
    // the range's state: the file's pieces of it, one after another in the slot
    const auto pieces = state_pieces(p, from, len);
    std::int64_t at = 0;
    for (const auto& [offset, bytes] : pieces) {
      if (bytes > 0) offload_.read(p.state + offset, state + at, bytes);
      at += bytes;
    }
    apply_update(w, nullptr, g, state_at(p.state >= 0 ? state : nullptr, len, 0), len, step_no, grad_scale, 1);
    at = 0;
    for (const auto& [offset, bytes] : pieces) {
      if (bytes > 0) offload_.write(p.state + offset, state + at, bytes);
      at += bytes;
    }
    if constexpr (config.offload_params) offload_.write(p.weight + (owned(p).weight_at + from) * e, staged_w, len * e);
  }
  // Where the state of elements [from, from + len) of p lies in its state
  // buffer (the optimizer's sections, core/optim_state.hpp): (offset, bytes)
  // pieces, laid out one after another they are the state of a len-element
  // parameter. (As update_range lays it out: over the elements this process updates.)
  std::array<std::pair<std::int64_t, std::int64_t>, max_state_sections> state_pieces(const ParamSlot& p, std::int64_t from,
                                                                                     std::int64_t len) const {
    constexpr OptimDesc d = R::optimizer::desc;
    std::array<std::pair<std::int64_t, std::int64_t>, max_state_sections> pieces{};
    if (p.state < 0) return pieces;
    const std::int64_t count = owned(p).count;
    for (int k = 0; k < d.sections; ++k)
      pieces[static_cast<std::size_t>(k)] = {d.offset(k, count) + from / d.section[k].per * d.section[k].bytes, d.section[k].size(len)};
    return pieces;
  }

  // Parameter k's first NaN or infinite gradient element, as the update reads the gradient.
  trainers::BadElement bad_element(int k) const {
    const T* g = update_grad(sched.params[k]);
    const Owned own = owned(sched.params[k]);
    const std::int64_t at = first_non_finite(g, own.count);
    if (at < 0) return {};
    return {own.begin + at, static_cast<double>(widen(g[at]))};
  }

  void update_param(const ParamSlot& p, int step_no, C grad_scale) {
    const Owned own = owned(p);
    if (own.count == 0) return;  // a rank whose shard lies past the parameter's end
    update_range(p, 0, own.count, step_no, grad_scale, workers_);
  }

  // The update of elements [from, from + n) of what this rank updates of
  // parameter p, in place in the arenas (every element is updated on its
  // own, so a parameter may be updated range by range; a range starts on a
  // multiple of the optimizer's desc.align: AdamW8bit's 256-element blocks).
  void update_range(const ParamSlot& p, std::int64_t from, std::int64_t n, int step_no, C grad_scale, int workers) const {
    const Owned own = owned(p);
    float* m = master(p);
    apply_update(weight_storage(p) + own.weight_at + from, m != nullptr ? m + from : nullptr, update_grad(p) + from,
                 state_at(p.state >= 0 ? states_arena().template at<std::byte>(p.state) : nullptr, own.count, from), n, step_no,
                 grad_scale, workers);
  }
  // The state of elements [from, ...) of a count-element parameter whose
  // state buffer starts at `state` (null: it keeps none).
  static StateAt state_at(std::byte* state, std::int64_t count, std::int64_t from) {
    return StateAt{state, count, from, &R::optimizer::desc};
  }
  // master: the f32 master weights of these n elements (a bf16 run), else null
  void apply_update(T* w, float* master, const T* g, const StateAt& state, std::int64_t n, int step_no, C grad_scale,
                    int workers) const {
    using O = typename R::optimizer;
    const float* table = sched.optim_table >= 0 ? states_arena().template at<float>(sched.optim_table) : nullptr;
    optimizer_pass<O>(w, master, g, state, n, O::template step<C>(lr_at(step_no), step_no), grad_scale, table, workers);
  }

  // ---- set-up -----------------------------------------------------------------------------------------------
  void fill_tables() {
    if (sched.quant_table >= 0) {
      bool dq = false;
      for (const ParamSlot& p : sched.params) dq = dq || p.quant.double_quant;
      fill_quant_table(device_.at<float>(sched.quant_table), dq);
    }
    if constexpr (R::optimizer::desc.tables > 0) R::optimizer::fill_table(states_arena().template at<float>(sched.optim_table));
  }

  // The engines' shared initial values (trainers::InitialValues).
  void initialize(std::uint64_t seed) {
    for (std::size_t k = 0; k < sched.params.size(); ++k) {
      const ParamSlot& p = sched.params[k];
      // tensor parallelism: the values of this rank's block of the whole
      const auto value = trainers::initial_values(seed, plan, p, tensor_rank());
      // ZeRO 3: this rank keeps only its shard of every parameter
      const std::int64_t begin = config.sharded(3) ? rank() * p.shard : 0;
      const std::int64_t count = config.sharded(3) ? std::clamp<std::int64_t>(p.elements() - begin, 0, p.shard) : p.elements();
      // each value depends on its index alone: the workers take a share each
      if (p.quant.kind == QuantKind::none) {
        T* w = weight(p);
        float* m = master(p);  // a bf16 run's trainable parameter: the value in f32, stored rounded
        team(workers_, [&](int k, int n) {
          const Range r = share(count, n, k);
          for (std::int64_t i = r.begin; i < r.end; ++i) {
            const C v = static_cast<C>(value(begin + i));
            w[i] = narrow<T>(v);
            if (m != nullptr) m[i] = static_cast<float>(v);
          }
        });
      } else {
        std::vector<float> dense(static_cast<std::size_t>(p.elements()));
        team(workers_, [&](int k, int n) {
          const Range r = share(p.elements(), n, k);
          for (std::int64_t i = r.begin; i < r.end; ++i) dense[i] = static_cast<float>(value(i));
        });
        if constexpr (config.sharded(3)) set_quantized_shard(p, dense);
        else set_quantized(p, dense);
      }
    }
  }

  // ZeRO 3: quantizes the whole matrix and keeps this rank's shard of its
  // codes and of its scales (byte shards, RunConfig::shard_bytes).
  void set_quantized_shard(const ParamSlot& p, std::span<const float> x) {
    const std::int64_t n = p.elements();
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(p.quant.code_bytes(n))), scales(static_cast<std::size_t>(p.quant.scale_bytes(n)));
    quantize_matrix(QuantView{p.quant, codes.data(), scales.data(), sched.quant_table >= 0 ? device_.at<float>(sched.quant_table) : nullptr,
                              p.rows, p.cols},
                    x.data(), workers_);
    auto keep = [&](const std::vector<std::uint8_t>& all, std::int64_t at) {
      const auto [begin, count] = trainers::held_bytes(config, static_cast<std::int64_t>(all.size()), rank());
      if (count > 0) std::memcpy(params_arena().template at<std::uint8_t>(at), all.data() + begin, static_cast<std::size_t>(count));
    };
    keep(codes, p.weight);
    keep(scales, p.scales);
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
