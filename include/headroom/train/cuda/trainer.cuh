#pragma once
// cuda::Trainer<Run>: trains Run on an NVIDIA GPU inside exactly the planned arena.
//
//   using Run = Train<models::GPT2<models::gpt2_124m>, Batch<16>, Seq<1024>, Precision<BF16>, OnCuda>;
//   cuda::Trainer<Run> t({.lr = 6e-4, .warmup_steps = 100, .total_steps = 5000});
//   StepStats s = t.step(tokens, targets);   // (Accumulate, Batch, Seq) int32 each, on the host
//
// At construction the trainer makes one cudaMalloc of the plan's device
// bytes and one cudaHostAlloc (pinned) of its offload bytes, and nothing else
// that a step touches: the cuBLASLt workspace, every scratch buffer, the
// gradient-norm partials and the loss live in the arena at the plan's
// offsets. A step walks schedule<Run>() like host::Trainer does, one kernel
// (or cuBLASLt call) per step, on one compute stream; offload and prefetch
// copies run on a second stream, and the compute stream waits for a copy
// only at the first later step whose buffers overlap the copied bytes (a
// prefetch is placed one block ahead of its backward by the plan, so it
// overlaps that block's compute).
//
// The trainer is built of bases that reach it as their derived class
// (CRTP): trainers::Driver (the step's order of events, train/driver.hpp),
// detail::StepControl (the batch and hyperparameters in, the results out:
// step_control.cuh), detail::Parameters (values in and out, checkpoint
// images, initial values: parameters.cuh), detail::GradientNorm (the norm
// and its failure report: gradient_norm.cuh) and detail::OffloadOptimizer
// (ZeRO-Offload's copies and CPU update: offload_optimizer.cuh).
//
// Precision: Precision<BF16> / <F16> store weights, gradients and
// activations in 16 bits with f32 master weights (the plan's `master`
// buffers) and f32 accumulation in every GEMM and reduction; Precision<F32>
// is all f32 (for comparisons with the host engine). Precision<F16> scales
// its loss by default (TrainOptions::loss_scaling, train/loss_scaling.hpp):
// the loss kernel multiplies dlogits by UpdateControl::loss_scale, the norm
// kernel divides it out of the norm and the update's gradient factor, and a
// step whose scaled gradients overflow is skipped (StepStats::skipped)
// instead of stopped; the host adjusts the scale between steps, so a
// captured step replays with the current one.
//
// A step is enqueued without any host synchronization: the batch and the
// step's hyperparameters go through pinned staging (the plan's offload
// tier) and a control block on the device (cuda::UpdateControl), the loss is
// summed on the device, and a non-finite loss or gradient norm sets a flag
// that makes every update kernel return (with UpdateInBackward, each group
// of updates first checks its own gradients); the host waits once, at the
// end, to read the loss and the gradient norm, and throws non_finite_loss or
// non_finite_gradient with no non-finite value in the weights or optimizer
// state. An LLM.int8 projection (Quantized<LLMInt8<>, L>) whose batch has
// more outlier columns than the plan's bound stops the step the same way
// (kernels/llm_int8.cuh: the skip flag, the count and the projection's
// schedule step in the control block, and a NaN output, so the other
// processes of a parallel run see a non-finite loss and stop too); the host
// then throws outlier_bound_exceeded naming the layer, as host::Trainer
// does. Everything the host copies in (weights, code tables) is ordered on
// the compute stream. That makes the whole step capturable: with
// TrainOptions::cuda_graph the second step is captured into a CUDA graph and
// every later step is one cudaGraphLaunch (see docs/cuda.md for what it buys).
//
// Data parallelism (DataParallel<N>, ZeRO<S>): the trainer is one rank's,
// constructed with the ranks' cuda::Communicator (cuda/nccl.cuh: NCCL, one
// GPU per rank), which is checked as host::Trainer checks its own (the
// number of ranks, the schedule's hash and the seed agree on every rank).
// The collectives are the plan's ops, on the communication stream; the
// trainer adds the loss's mean over the ranks, the gradient norm's sum over
// the ranks' shards (ZeRO 1-3) and the all-gather of the updated weights
// (ZeRO 1 and 2), all enqueued on that stream too, so a step still waits
// for the host once, at its end: there the communicator's bounded wait
// (synchronize) replaces cudaStreamSynchronize, so a rank that died or hangs
// gives a communication_error instead of a hang.
//
// Tensor parallelism (TensorParallel<M>, also with DataParallel<N>): the
// communicator joins all N x M processes; process w is tensor-parallel rank
// w % M of data-parallel rank w / M, as with host::Trainer. The trainer
// splits it into its tensor-parallel group (the tp_input / tp_output sums
// and the LM head's row statistics, enqueued on the compute stream) and,
// with N > 1, its data-parallel group (the plan's collectives and the
// trainer's own, as above). A rank holds and initializes its block of every
// split parameter (trainers::initial_values); the gradient norm adds the
// split parameters' squares over the tensor-parallel group.
//
// Pipeline parallelism (PipelineParallel<S>, also with DataParallel<N> and
// TensorParallel<M>): a trainer is one stage's, cuda::Trainer<pipeline_stage<
// Run, s>> (cuda::with_pipeline_stage chooses this process's), constructed
// with the communicator of all S x N x M processes; process w is stage
// w / (N M), as with host::Trainer. It splits off its stages' group and runs
// the step's micro-batches under 1F1B (trainers::one_forward_one_backward),
// micro-batch m in copy m % in_flight of what a forward keeps for its
// backward (Slot::stride). pipe_recv / pipe_send are NCCL sends and receives
// on the compute stream, paired by cuda::PipeExchange so that 1F1B cannot
// deadlock (pipe_exchange.cuh); the loss (the last stage's) is summed over
// the stages and the squares of the gradients too, so every stage has the
// same loss, norm and skip flag.
//
// OffloadOptimizer (ZeRO-Offload) and OffloadParameters (ZeRO-Infinity):
// master weights, optimizer state and each gradient's copy (and with
// OffloadParameters every parameter's stored tensor) in the pinned offload
// tier, the update on the CPU, the copies on a copy stream: see
// train/cuda/offload_optimizer.cuh and docs/cuda.md.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../../cuda/blas.cuh"
#include "../../cuda/communicator.cuh"
#include "../../cuda/device.cuh"
#include "../../cuda/kernels/attention.cuh"
#include "../../cuda/kernels/loss.cuh"
#include "../../cuda/kernels/optimizer.cuh"
#include "../../cuda/kernels/pointwise.cuh"
#include "../../cuda/kernels/quant_linear.cuh"
#include "../../cuda/op_context.cuh"
#include "../../cuda/runtime.cuh"
#include "../../plan/plan.hpp"
#include "../../plan/schedule.hpp"
#include "../common.hpp"
#include "../driver.hpp"
#include "../op_table.hpp"
#include "../with_pipeline_stage.hpp"
#include "copy_waits.cuh"
#include "engine_requirements.cuh"
#include "gradient_norm.cuh"
#include "offload_optimizer.cuh"
#include "parameters.cuh"
#include "step_control.cuh"

namespace headroom::cuda {

template <TrainingRun R>
class Trainer : public trainers::Driver<Trainer<R>, R, Communicator>,
                detail::StepControl<Trainer<R>>,
                public detail::Parameters<Trainer<R>>,
                detail::OffloadOptimizer<Trainer<R>>,
                detail::GradientNorm<Trainer<R>, storage_t<R::config().dtype>> {
  static_assert(R::config().stage >= 0,
                "cuda::Trainer<Run>: a PipelineParallel<S> run trains stage by stage: cuda::Trainer<pipeline_stage<Run, s>> "
                "(cuda::with_pipeline_stage chooses this process's stage)");
  using Base = trainers::Driver<Trainer<R>, R, Communicator>;
  friend Base;
  using Offload = detail::OffloadOptimizer<Trainer<R>>;  // OffloadOptimizer's choreography (offload_optimizer.cuh)
  friend Offload;
  using Params = detail::Parameters<Trainer<R>>;  // values in and out, checkpoint images, initial values (parameters.cuh)
  friend Params;
  using Params::fill_tables, Params::initialize, Params::state_bytes;
  using Control = detail::StepControl<Trainer<R>>;  // the batch and hyperparameters in, the results out (step_control.cuh)
  friend Control;
  using Control::check_outliers, Control::control, Control::evaluated_loss, Control::load_batch, Control::loss_over_stages,
      Control::mean_over_ranks, Control::results, Control::stage_batch, Control::staged_control_in, Control::step_control_,
      Control::upload_control;
  using Norm = detail::GradientNorm<Trainer<R>, storage_t<R::config().dtype>>;  // parameter lists, norm, failure path (gradient_norm.cuh)
  friend Norm;
  using Norm::collect_params, Norm::counted_, Norm::gradient_norm, Norm::in_backward_, Norm::sum_partial_gradients,
      Norm::throw_non_finite_gradient, Norm::trainable_;
  using Offload::from_offload_tier, Offload::hands_over_now, Offload::load_gradients, Offload::offload_summed_gradients,
      Offload::offloaded_gradient, Offload::offloaded_partial_squares, Offload::offloaded_step, Offload::prepare_offload,
      Offload::settle_offload, Offload::stage_loss_flags, Offload::stream_gradients, Offload::zero_offloaded_states;
  using Base::check_batch, Base::evaluating_, Base::groups_, Base::micro_, Base::micro_batch, Base::micro_batches,
      Base::micro_copy_, Base::opt_, Base::owned, Base::scaler_, Base::step_, Base::forward, Base::backward;

 public:
  static constexpr const char* engine_name = "cuda::Trainer";
  using Base::lr_at, Base::path_of, Base::rank, Base::shard_of, Base::tensor_rank, Base::tokens_per_micro_batch,
      Base::tokens_per_step, Base::vocab_size;
  using run = R;
  static constexpr auto plan = headroom::plan<R>();
  static constexpr auto sched = headroom::detail::schedule_of_plan<R>(plan);
  static constexpr RunConfig config = R::config();
  static_assert(config.engine == Engine::cuda,
                "cuda::Trainer<Run>: the run is planned for the host engine; add OnCuda to Train<...> so the plan holds the "
                "cuBLASLt workspace and the CUDA kernels' scratch");
  static_assert(config.dtype == DType::F32 || config.dtype == DType::BF16 || config.dtype == DType::F16,
                "cuda::Trainer<Run>: the CUDA engine runs Precision<F32>, <BF16> or <F16>");
  // OffloadOptimizer (ZeRO-Offload): master weights, optimizer state and the
  // offloaded gradients in the pinned offload tier, the update on the CPU
  static constexpr bool offloaded = config.offload_optimizer;
  // OffloadParameters (ZeRO-Infinity): every parameter's stored tensor in the
  // pinned offload tier, copied to the plan's `fetched` device buffers by the
  // schedule's fetch steps (offload_optimizer.cuh)
  static constexpr bool params_offloaded = config.offload_params;
  static_assert(!params_offloaded || !config.sharded(1) || config.sharded(3),
                "cuda::Trainer<Run>: OffloadParameters with ZeRO<1> or ZeRO<2> runs on the host engine only (each rank's "
                "updated block of the stored weights would have to reach the others' pinned memory); on the CUDA engine use "
                "ZeRO<3>, where each rank stores, fetches and updates its own shards");
  using S = storage_t<config.dtype>;
  static constexpr bool half = is_half(config.dtype);
  static_assert(!config.update_in_backward || sched.params.size() <= static_cast<std::size_t>(reduction_slots),
                "cuda::Trainer: with UpdateInBackward a step keeps one finiteness flag per parameter in the reductions "
                "buffer (2,048 slots); this run has more parameters");
  using Ops = trainers::OpTable<R, sched>;
  // every op of the plan is listed by a layer and has this engine's kernels
  static_assert(sizeof(Ops) > 0 && detail::check_kernels<S>(typename Ops::ops{}));
  static_assert(detail::quant_blocks_fit(sched),
                "cuda::Trainer: a quantized projection's blocks must be multiples of 32 elements on the CUDA engine (its "
                "dequantizing GEMMs, kernels/quant_linear.cuh, read 32 codes of one block at a time); LLMInt8<>'s block is a "
                "whole row: in_features must be a multiple of 32");
  // A micro-batch runs schedule steps [1, micro_batch_end); the update follows.
  static constexpr int micro_batch_end = sched.update_step >= 0 ? sched.update_step : static_cast<int>(sched.steps.size());
  // per step of an op on the communication lane: the step before which the compute stream waits for it
  static constexpr auto lane_join = trainers::join_steps<sched, micro_batch_end>();

  // Pipeline parallelism: a stage's forward starts with pipe_recv (but the
  // first stage's), its backward with pipe_send's (but the last stage's),
  // so that a send waiting in cuda::PipeExchange goes with that receive
  // with no work between them; and the send and the receive paired with it
  // never share bytes (every copy of both).
  static_assert(config.pp == 1 || ((config.first_stage() || detail::opens_with(sched, 1, sched.backward_step, ops::PipelineRecv::name)) &&
                                   (config.last_stage() || detail::opens_with(sched, sched.backward_step, micro_batch_end, ops::PipelineSend::name))),
                "cuda::Trainer: a pipeline stage's forward must start with pipe_recv and its backward with pipe_send's backward");
  static_assert(config.pp == 1 || detail::pipe_pairs_apart(sched),
                "cuda::Trainer: a pipeline stage's send and the receive it goes with (cuda::PipeExchange) share bytes in the plan");

  // Options are always given: cuda::Trainer<R> t({}) for the defaults.
  explicit Trainer(TrainOptions o) : Trainer(o, nullptr) {
    static_assert(config.pp == 1,
                  "cuda::Trainer: a pipeline stage trains with the other stages; construct it with the communicator of every "
                  "process of the run: cuda::Trainer<Stage> t(options, comm) (inside cuda::with_pipeline_stage<Run>(comm, ...))");
    static_assert(config.world() == 1,
                  "cuda::Trainer: a run with DataParallel<N> or TensorParallel<N> trains one rank of several; construct it with "
                  "the ranks' communicator: cuda::Trainer<Run> t(options, comm) (a cuda::NcclCommunicator of "
                  "headroom/cuda/nccl.cuh, one GPU per rank)");
  }
  // One rank of a parallel run: `comm` joins every process (it must have
  // exactly PipelineParallel<S> x DataParallel<N> x TensorParallel<M> of
  // them, every one built from this run type (a pipeline stage: from a
  // stage of it) and given the same seed: checked here, on every rank).
  // Process w is tensor-parallel rank w % M of data-parallel rank
  // (w / M) % N of stage w / (N M). Each data-parallel rank step()s its own
  // micro-batches (its tensor-parallel ranks and stages the same ones);
  // gradients are averaged over the data-parallel ranks.
  Trainer(TrainOptions o, Communicator& comm) : Trainer(o, &comm) {}

 private:
  Trainer(TrainOptions o, Communicator* comm)
      : Base(o, comm),
        device_(plan.peak_bytes(Tier::device)),
        offload_(plan.peak_bytes(Tier::offload)),
        blas_(sched.gemm_panels.bound() ? device_.at<std::byte>(sched.gemm_panels.offset) : nullptr, sched.gemm_panels.bytes) {
    if (offloaded && o.cuda_graph)
      throw std::invalid_argument(
          "cuda::Trainer: with OffloadOptimizer the update runs on the CPU between the step's device work and the copies of "
          "the new weights back to the device, which a captured CUDA graph cannot replay; set cuda_graph = false");
    check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "cudaStreamCreate (compute)");
    check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate (copies)");
    check(cudaStreamCreateWithFlags(&communication_, cudaStreamNonBlocking), "cudaStreamCreate (communication)");
    check(cudaEventCreateWithFlags(&ready_for_copy_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&communicated_, cudaEventDisableTiming), "cudaEventCreate");
    copy_done_.resize(sched.steps.size());
    for (cudaEvent_t& e : copy_done_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    for (std::size_t g = 0; g < sched.steps.size(); ++g)
      if (sched.steps[g].issue_before >= 0) hoisted_[static_cast<std::size_t>(sched.steps[g].issue_before)].push_back(static_cast<int>(g));
    fetched_ahead_.assign(sched.steps.size(), 0);
    for (int g = 1; g < micro_batch_end; ++g) {
      const Step& st = sched.steps[static_cast<std::size_t>(g)];
      if (st.kind != EventKind::fetch) continue;
      if (st.issue_before >= 0) {  // hoisted by the schedule (above)
        fetched_ahead_[static_cast<std::size_t>(g)] = 1;
      } else if (const int h = fetch_issue_step(sched, g); h < g) {
        hoisted_[static_cast<std::size_t>(h)].push_back(g);
        fetched_ahead_[static_cast<std::size_t>(g)] = 1;
      }
    }
    if constexpr (config.pp > 1) pipe_ = PipeExchange(groups_.pipe);
    if constexpr (offloaded) prepare_offload();
    collect_params();
    fill_tables();
    initialize(o.seed);
    check(cudaDeviceSynchronize(), "initialisation");
  }

 public:
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer() {
    if (graph_exec_ != nullptr) cudaGraphExecDestroy(graph_exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    if (Communicator* c = waiter()) {
      try {  // bounded: a failed communicator (its work aborted) refuses at once
        c->synchronize(communication_, "the trainer's last collectives");
        c->synchronize(compute_, "the trainer's last step");
      } catch (const communication_error&) {
      }
    } else {
      cudaStreamSynchronize(compute_);
    }
    cudaStreamSynchronize(copy_);
    this->stop_offload();  // (the update thread is idle between steps)
    for (cudaEvent_t e : copy_done_) cudaEventDestroy(e);
    cudaEventDestroy(communicated_);
    cudaEventDestroy(ready_for_copy_);
    cudaStreamDestroy(communication_);
    cudaStreamDestroy(copy_);
    cudaStreamDestroy(compute_);
  }

  // ---- training (step, forward_backward, evaluate: trainers::Driver) -----------------------------------
  // Whether steps replay one captured CUDA graph (TrainOptions::cuda_graph; from the second step).
  bool graph_captured() const { return graph_exec_ != nullptr; }

  // ---- the arena ------------------------------------------------------------------------------------
  std::int64_t arena_bytes(Tier t = Tier::device) const { return t == Tier::device ? device_.bytes() : offload_.bytes(); }
  cudaStream_t stream() const { return compute_; }
  const Blas& blas() const { return blas_; }
  // (The process's ranks and groups, and shard_of(p): trainers::Driver.)

  // ---- parameters (download_*, upload_weight, checkpoint images, reset_optimizer: parameters.cuh) --------
  static constexpr std::size_t param_count = sched.params.size();

 private:
  static constexpr bool tied_stages = trainers::tied_stages<R>;
  mutable PipeExchange pipe_;     // pipeline parallelism: the sends and receives of pipe_recv / pipe_send
  DeviceArena device_;
  PinnedArena offload_;
  Blas blas_;
  cudaStream_t compute_{}, copy_{};
  cudaStream_t communication_{};  // ops on ops::Lane::communication
  cudaEvent_t ready_for_copy_{};
  cudaEvent_t communicated_{};          // the trainer's own collectives (loss, norm, weights) are done
  std::vector<std::vector<int>> hoisted_ = std::vector<std::vector<int>>(sched.steps.size());  // per step: gathers and fetches issued before it
  std::vector<char> fetched_ahead_;     // per step: a fetch issued before an earlier step (hoisted_)
  std::vector<cudaEvent_t> copy_done_;  // per copy step, and per step of an op on the communication lane: its work is done
  const CopyWaits waits_ = CopyWaits::plan(sched, lane_join, micro_batch_end, offloaded, sizeof(S));  // copy_waits.cuh
  cudaGraph_t graph_{};
  cudaGraphExec_t graph_exec_{};

  // What the host's waits go through: a communicator's bounded wait where there is one.
  Communicator* waiter() const { return groups_.data != nullptr ? groups_.data : groups_.tensor != nullptr ? groups_.tensor : groups_.pipe; }

  // A buffer of the step (copy micro_copy_ of one kept per micro-batch in flight).
  template <class U = S>
  U* ptr(const Slot& s) const {
    return s.bound() ? device_.at<U>(s.offset + micro_copy_ * s.stride) : nullptr;
  }
  float* reductions() const { return ptr<float>(sched.reductions); }

  // Host <-> device copies outside a step, on the compute stream and waited
  // for: ordered after the compute stream's work and before its next (a copy
  // on the legacy default stream is not ordered with a non-blocking stream),
  // and done with the pageable host buffer before returning.
  template <class U>
  void upload(U* dst, const U* src, std::size_t n, const char* what) const {
    check(cudaMemcpyAsync(dst, src, n * sizeof(U), cudaMemcpyHostToDevice, compute_), what);
    wait(compute_, what);
  }
  template <class U>
  std::vector<U> download(const U* src, std::int64_t n) const {
    std::vector<U> v(static_cast<std::size_t>(n));
    check(cudaMemcpyAsync(v.data(), src, v.size() * sizeof(U), cudaMemcpyDeviceToHost, compute_), "download");
    wait(compute_, "download");
    return v;
  }
  // The host waits for a stream: with a communicator, its bounded wait (a
  // rank that died or hangs is a communication_error, not a hang).
  void wait(cudaStream_t stream, const char* what) const {
    if (Communicator* c = waiter()) c->synchronize(stream, what);
    else check(cudaStreamSynchronize(stream), what);
  }
  // Everything a step does on the device, in stream order, with no host
  // synchronization: what a CUDA graph captures.
  void enqueue_step() {
    upload_control();
    if constexpr (config.update_in_backward)  // the step's finiteness flags, one per update position
      check(cudaMemsetAsync(reductions(), 0, sched.params.size() * sizeof(float), compute_), "clear gradient flags");
    if (config.accumulate > 1) zero_grads();  // OffloadOptimizer: most start from Step::grad_load
    micro_batches();
    if constexpr (config.pp > 1) loss_over_stages();
    mean_over_ranks();
    if constexpr (offloaded) {
      sum_partial_gradients();
      offload_summed_gradients();
    }
    if (!config.update_in_backward && !offloaded) {
      gradient_norm();
      apply_update(trainable_, opt_.clip_norm > 0 || scaler_.enabled());  // grad_scale: clip scale / loss scale
    }
    // ZeRO 1 and 2: every rank updated its shard of each weight; gather the others'
    // (OffloadOptimizer: once the CPU's update is back on the device, offloaded_step)
    if (!offloaded) gather_weights();
  }
  // ZeRO 1 and 2: each rank's shard of every trainable weight to every rank, on the communication stream.
  void gather_weights() {
    if constexpr (config.sharded(1) && !config.sharded(3))
      on_communication_stream([&](cudaStream_t s) {
        for (const ParamSlot& p : sched.params)
          if (p.trainable) {
            const std::int64_t block = p.shard * static_cast<std::int64_t>(sizeof(S));
            std::byte* whole = device_.at<std::byte>(p.weight);
            groups_.data->all_gather(whole + rank() * block, whole, block, s);
          }
      });
  }

  // Stream s's next work waits for the compute stream's work so far.
  void wait_for_compute(cudaStream_t s) {
    check(cudaEventRecord(ready_for_copy_, compute_), "cudaEventRecord");
    check(cudaStreamWaitEvent(s, ready_for_copy_, 0), "cudaStreamWaitEvent");
  }

  // The trainer's own collectives, on the communication stream (NCCL's
  // calls of one communicator stay in one stream's order): after the
  // compute stream's work so far, and joined back before its next.
  template <class Collectives>
  void on_communication_stream(Collectives collectives) {
    wait_for_compute(communication_);
    collectives(communication_);
    check(cudaEventRecord(communicated_, communication_), "cudaEventRecord");
    check(cudaStreamWaitEvent(compute_, communicated_, 0), "cudaStreamWaitEvent");
  }

  // Captures enqueue_step() into a graph on the compute stream (the copy
  // stream joins through its events).
  void capture_step() {
    check(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      enqueue_step();
    } catch (...) {
      cudaGraph_t broken{};
      cudaStreamEndCapture(compute_, &broken);
      if (broken != nullptr) cudaGraphDestroy(broken);
      throw;
    }
    check(cudaStreamEndCapture(compute_, &graph_), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&graph_exec_, graph_, 0), "cudaGraphInstantiate");
  }

  // ---- the step (trainers::Driver calls these) -------------------------------------------------------------
  // One step, enqueued whole (or replayed as a captured graph); the host waits
  // once, at the end, to read the loss and the gradient norm. True when a
  // scaled gradient overflowed (the update kernels skipped the step).
  bool train(StepStats& s, std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    const int step_no = step_ + 1;
    stage_batch(tokens, targets, step_no, true);
    if constexpr (offloaded) return offloaded_step(s, step_no);
    if (!opt_.cuda_graph || step_ == 0) {
      enqueue_step();  // the first step also describes every GEMM (Blas) before a capture
    } else {
      if (graph_exec_ == nullptr) capture_step();
      check(cudaGraphLaunch(graph_exec_, compute_), "cudaGraphLaunch");
    }
    const UpdateControl r = results();
    check_outliers(r);
    if (r.skip != 0.0f) throw non_finite_loss(step_no, r.loss);
    // loss scaling: a non-finite norm (clip_scale_kernel's first_bad = 0) means the update kernels skipped the step
    const bool overflow = r.first_bad != no_bad_gradient && scaler_.enabled();
    if (r.first_bad != no_bad_gradient && !overflow) throw_non_finite_gradient(step_no, r);
    s.loss = r.loss;
    s.grad_norm = config.update_in_backward ? 0.0 : r.norm;
    return overflow;
  }
  // forward_backward(): one micro-batch, as the step's last (a data-parallel
  // run averages the gradients); they stay in the arena (download_grad()).
  double gradients(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    stage_batch(tokens, targets, step_ + 1);
    upload_control();
    if (config.accumulate > 1) zero_grads();
    micro_batch(0, config.accumulate - 1);
    mean_over_ranks();
    if constexpr (offloaded) offload_summed_gradients();  // (not summed: as without OffloadOptimizer)
    const UpdateControl r = results();
    if constexpr (offloaded) settle_offload();  // the gradients are in the offload tier (download_grad)
    check_outliers(r);
    return r.loss * config.accumulate;
  }
  // evaluate(): the forward and the loss.
  double forward_only(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    stage_batch(tokens, targets, step_ + 1);
    upload_control();
    load_batch(0);
    if constexpr (config.pp > 1) {
      for (int g = 1; g < sched.backward_step; ++g) {
        wait_for_copies(g);
        issue_hoisted(g, sched.backward_step);
        const Step& st = sched.steps[g];
        if (st.kind == EventKind::loss) loss_step(st, false);
        else run_step(g);
      }
      pipe_.flush(compute_);
      for (int g = sched.backward_step; g <= micro_batch_end; ++g) wait_for_copies(g, sched.backward_step);
      loss_over_stages();
      mean_over_ranks();
      return evaluated_loss();
    } else {
      for (int g = 1; g < sched.loss_step; ++g) {
        wait_for_copies(g);
        issue_hoisted(g, sched.loss_step);
        run_step(g);
      }
      wait_for_copies(sched.loss_step);
      loss_step(sched.steps[sched.loss_step], false);
      // the forward's offload copies are joined before the next step reuses
      // their bytes; only those: the backward's copy events were not recorded
      // here (after a captured step they were last recorded inside the capture,
      // where they are graph nodes that cannot be waited for)
      for (int g = sched.loss_step + 1; g <= micro_batch_end; ++g) wait_for_copies(g, sched.loss_step);
      mean_over_ranks();
      return evaluated_loss();
    }
  }

  int batch_ = 0;  // the micro-batch of the step's tokens in progress (Accumulate<K>: gradients start from zero in 0)
  void begin_forward(int batch) {
    batch_ = batch;
    if constexpr (config.pp > 1 && config.first_stage()) pipe_.flush(compute_);  // a send waiting in pipe_ goes alone
    load_batch(batch);
  }
  void begin_backward() {
    batch_ = micro_;
    if constexpr (config.pp > 1 && config.last_stage()) pipe_.flush(compute_);
  }
  void before_event(int g) {
    wait_for_copies(g);
    issue_hoisted(g);
    if constexpr (offloaded && config.accumulate > 1) load_gradients(sched.steps[g], batch_);
  }
  // (The loss adds its share to the control block.)
  void event(int g) {
    const Step& st = sched.steps[g];
    if (st.kind != EventKind::loss) {
      run_step(g);
      return;
    }
    loss_step(st, true);
    if constexpr (offloaded)
      if (hands_over_now()) stage_loss_flags();
  }
  void after_event(int g) {
    const Step& st = sched.steps[g];
    if constexpr (offloaded) stream_gradients(g);  // a fused loss completes the LM head's
    if (config.update_in_backward && st.update_end > st.update_begin) {  // (the loss event completes an untied LM head's)
      // gradients an op on the communication lane writes are complete
      for (int j = 1; j <= g; ++j)
        if (lane_join[j] >= 0) check(cudaStreamWaitEvent(compute_, copy_done_[j], 0), "cudaStreamWaitEvent");
      // each parameter's update checks its own gradient: from the first
      // non-finite one on, no update of this step runs
      const std::span<const ParamRef> ready(in_backward_.data() + st.update_begin, st.update_end - st.update_begin);
      check_gradients<S>(ready, control(), reductions(), compute_, st.update_begin);
      apply_update(ready, false, st.update_begin);
    }
  }
  void end_backward() { wait_for_copies(micro_batch_end); }
  void end_pipeline() { pipe_.flush(compute_); }

  // ZeRO 3's prefetch: the gathers the schedule lets start before step h
  // (Step::issue_before); OffloadParameters: the fetches issued before step h
  // (copy_waits.cuh); those of steps before `end` (evaluate: the loss step).
  void issue_hoisted(int h, int end = micro_batch_end) {
    for (const int g : hoisted_[static_cast<std::size_t>(h)]) {
      if (g >= end) continue;
      if (sched.steps[static_cast<std::size_t>(g)].kind == EventKind::fetch) copy_step(g);
      else forward(sched.steps[static_cast<std::size_t>(g)], true);
    }
  }

  // Accumulate<K>: the gradients that live the whole step start at zero
  // (ZeRO 2 and 3: this rank's gradient shards; the buckets are written first
  // by backward). OffloadOptimizer: only those summed over processes before
  // they go to the offload tier (the others start from Step::grad_load).
  void zero_grads() {
    for (const ParamSlot& p : sched.params)
      if (offloaded && !graph::offloaded_after_sum(config, p)) continue;
      else if (p.grad_shard >= 0)
        check(cudaMemsetAsync(device_.at<std::byte>(p.grad_shard), 0, static_cast<std::size_t>(p.shard * sizeof(S)), compute_),
              "zero gradient shards");
      else if (p.grad >= 0)
        check(cudaMemsetAsync(device_.at<std::byte>(p.grad), 0, static_cast<std::size_t>(p.elements() * sizeof(S)), compute_),
              "zero gradients");
  }

  // ---- copies between tiers -----------------------------------------------------------------------------
  // The compute stream waits for the copy steps due before step g (those
  // before step `ran_before` only: the ones this pass recorded).
  void wait_for_copies(int g, int ran_before = std::numeric_limits<int>::max()) {
    for (const int c : waits_.before(g))
      if (c < ran_before) check(cudaStreamWaitEvent(compute_, copy_done_[c], 0), "cudaStreamWaitEvent");
  }
  void copy_step(int g) {
    const Step& st = sched.steps[g];
    wait_for_compute(copy_);
    for (int c = st.copy_begin; c < st.copy_end; ++c) {
      const CopyStep& cp = sched.copies[c];
      if (st.kind == EventKind::offload)
        check(cudaMemcpyAsync(offload_.at<std::byte>(cp.to + cp.host_at(micro_copy_)), device_.at<std::byte>(cp.from),
                              static_cast<std::size_t>(cp.bytes), cudaMemcpyDeviceToHost, copy_),
              "offload copy");
      else  // a prefetch, or a fetch of parameters (OffloadParameters: one copy of each, host_stride 0)
        check(cudaMemcpyAsync(device_.at<std::byte>(cp.to), offload_.at<std::byte>(cp.from + cp.host_at(micro_copy_)),
                              static_cast<std::size_t>(cp.bytes), cudaMemcpyHostToDevice, copy_),
              st.kind == EventKind::fetch ? "fetch copy" : "prefetch copy");
    }
    check(cudaEventRecord(copy_done_[g], copy_), "cudaEventRecord");
  }

  // ---- one event ----------------------------------------------------------------------------------------
  void run_step(int g) {
    const Step& st = sched.steps[g];
    switch (st.kind) {
      case EventKind::load_batch: break;
      case EventKind::forward:
      case EventKind::recompute: forward(st); break;
      case EventKind::loss: loss_step(st, true); break;
      case EventKind::backward: backward(st); break;
      case EventKind::offload:
      case EventKind::prefetch: copy_step(g); break;
      case EventKind::update: break;
      case EventKind::collective: forward(st); break;
      case EventKind::fetch:  // OffloadParameters: the next event's parameters (unless issued ahead: issue_hoisted)
        if (!fetched_ahead_[static_cast<std::size_t>(g)]) copy_step(g);
        break;
    }
  }

  // The kernels' view of a step: every operand resolved to its device pointer.
  OpContext<S> context(const Step& st) const {
    OpContext<S> k{};
    trainers::bind_step(k, sched, st, device_.at<std::byte>(0), micro_copy_);
    if constexpr (params_offloaded)  // a parameter is on the device only as fetched for this event (Step::weight)
      for (int w = 0; w < graph::max_weights; ++w) {
        if (!st.weight[w].bound()) k.weight_[w] = nullptr, k.quant_[w].codes = nullptr;
        if (!st.scales[w].bound()) k.quant_[w].scales = nullptr;
      }
    k.compute = compute_;
    k.cublas = const_cast<Blas*>(&blas_);
    k.control_block = control();
    k.loss_sum = ptr<float>(sched.loss);
    k.comm = groups_.data;
    k.tensor_comm = groups_.tensor;
    k.pipe = groups_.pipe != nullptr ? &pipe_ : nullptr;
    k.schedule_step = static_cast<int>(&st - sched.steps.data());
    k.micro = micro_;
    k.seed = opt_.seed;
    k.step = evaluating_ ? 0 : step_ + 1;  // (the kernels read the step from the control block)
    k.data_rank = rank();
    k.tensor_rank = tensor_rank();
    k.tensor_ranks = config.tp;
    return k;
  }

  // The loss event (an op with a fused loss): the summed loss goes to the
  // loss slot and the control block.
  void loss_step(const Step& st, bool grads) {
    const std::size_t g = Base::index_of(st);
    const OpContext<S> k = context(st);
    Ops::visit(g, [&]<class E>() {
      if constexpr (requires { E::op::loss(k, grads); }) E::op::loss(k, grads);
      else Base::unsupported(st);
    });
  }

  // An op on the communication lane (Driver::forward, Driver::backward; the
  // only other lane this engine runs, detail::check_kernel): on the
  // communication stream, after everything the compute stream has enqueued,
  // and recorded, so that the compute stream waits for it before the first
  // later step that needs its bytes (copy_waits.cuh).
  template <class O>
  void on_lane(std::size_t g, OpContext<S> k, typename Base::Pass pass) {
    static_assert(ops::lane_of<O>() == ops::Lane::communication);
    wait_for_compute(communication_);
    // ZeRO 3 with OffloadParameters: a gather reads the shards the fetch just before it copies (graph/sharding.hpp gather_params)
    if (params_offloaded && g > 0 && sched.steps[g - 1].kind == EventKind::fetch)
      check(cudaStreamWaitEvent(communication_, copy_done_[g - 1], 0), "cudaStreamWaitEvent");
    k.compute = communication_;
    if (pass == Base::Pass::forward) O::forward(k);
    else O::backward(k);
    check(cudaEventRecord(copy_done_[g], communication_), "cudaEventRecord");
  }

  // ---- the update -------------------------------------------------------------------------------------------
  // The optimizer over params, reading the step's hyperparameters, the clip
  // scale (when clip) and the skip flag from the control block.
  // params[i] has the update position first_position + i (UpdateControl::first_bad).
  void apply_update(std::span<const ParamRef> params, bool clip, int first_position = 0) {
    const float* table = sched.optim_table >= 0 ? device_.at<float>(sched.optim_table) : nullptr;
    R::optimizer::template update<S>(params, control(), table, clip, compute_, first_position);
  }

};

// Pipeline parallelism: calls f.template operator()<Stage>() with Stage =
// pipeline_stage<R, s> for this process's stage s (process w of the run is
// stage w / (DataParallel x TensorParallel)), so that one program trains
// every stage, as host::with_pipeline_stage does:
//
//   cuda::with_pipeline_stage<Run>(nccl, [&]<class Stage>() {
//     cuda::Trainer<Stage> t(options, nccl);
//     for (...) t.step(tokens, targets);  // every stage gets the step's micro-batches
//   });
//
// f is compiled for every stage.
template <TrainingRun R, class F>
void with_pipeline_stage(Communicator& world, F&& f) {
  constexpr RunConfig c = R::config();
  static_assert(c.pp > 1 && c.stage < 0, "cuda::with_pipeline_stage<Run>: Run must be a PipelineParallel<S> run type, its stage not chosen");
  if constexpr (c.pp > 1 && c.stage < 0) trainers::with_pipeline_stage<R>(world, std::forward<F>(f));
}

}  // namespace headroom::cuda
