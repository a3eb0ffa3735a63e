#pragma once
// cuda::Trainer's OffloadOptimizer (ZeRO-Offload) and OffloadParameters
// (ZeRO-Infinity). cuda::Trainer inherits it (a CRTP base: Engine is the
// trainer, whose arenas, streams and events it uses) and calls
// prepare_offload, load_gradients, stream_gradients,
// offload_summed_gradients and offloaded_step at their places in the step.
// The CPU's update is the host engine's optimizer pass
// (host/kernels/optimizer.hpp).
//
// OffloadOptimizer (ZeRO-Offload): the plan's offload tier (pinned) holds
// the f32 master weights, the optimizer state and each gradient's offloaded
// copy; the copy stream takes every gradient out after the step that
// completes it, the CPU updates (during the backward without clipping, on an
// update thread handed the parameters by cudaLaunchHostFunc; after it with
// clipping, with the norm summed in the kernels' order) and the new weights
// go back on the copy stream before the next step's forward. With
// DataParallel<N> (ZeRO 0-3) the gradients go out after the collective that
// averages them (ZeRO 2 and 3: this rank's shard), the updates run after the
// backward with the norm summed over the ranks, and each rank's new weights
// go back to its device (ZeRO 1 and 2: then the all-gather); with
// TensorParallel<M> and PipelineParallel<S> likewise, the gradients several
// processes sum staying on the device until summed there (docs/cuda.md).
//
// OffloadParameters (ZeRO-Infinity, with OffloadOptimizer): every
// parameter's stored tensor (values, NF4 / Int8 codes and scales) lives in
// the pinned offload tier; each fetch step of the schedule copies the next
// event's parameters into the plan's `fetched` device buffers on the copy
// stream (issued one op ahead where the plan has those buffers alive
// there), and the compute stream waits for the copy before that event. The
// CPU's update writes the new values (and the master) in the offload tier,
// where the next fetches read them: no weights go back to the device. With
// DataParallel<N> and ZeRO<3> a rank stores and fetches its shards, and the
// all-gather after each fetch reads them (ZeRO 1 and 2 are refused).
//
// In detail:
//
// The plan keeps in the offload tier (pinned host memory) an f32 master
// copy of every trainable parameter, its optimizer state (and AdamW8bit's
// dynamic maps) and its offloaded gradient (host_grad, in the storage
// type); the device keeps the weights and each gradient only from its
// first backward writer to the step that completes it. At the end of that
// step (Step::update_begin .. update_end) the copy stream, after an event
// of the compute stream, copies the gradient to host_grad; the compute
// stream waits for the copy only before the first later step that reuses
// its bytes (copy_waits.cuh). In step()'s last micro-batch a host function
// on the copy stream (cudaLaunchHostFunc: it calls no CUDA) then hands the
// parameters to the update thread (a host::LaneWorker):
//   - clip_norm = 0: the thread sums each gradient's squares (in double; the
//     step's norm adds them in schedule order) and, when they are finite and
//     within f32, updates the parameter at once on the CPU from master,
//     state and host_grad (math/optim.hpp's element math, as the update
//     kernels compute it), writing a 16-bit run's new weights into
//     host_grad's bytes (an f32 run's master is its weight), while the GPU
//     runs the backward of the earlier layers. From the first gradient that
//     fails (in backward order) no update runs, as with UpdateInBackward.
//   - clip_norm > 0: the norm needs every gradient, so nothing runs during
//     the backward; after it the CPU sums the squares in the device kernels'
//     order (squared_norm_on_host: the norm and clip scale of the run
//     without OffloadOptimizer, bit for bit on the emulator), stops before
//     any update when the norm is not finite, and updates every parameter
//     on update_threads_ threads.
// The new weights then go back to the device weights by copies on the copy
// stream, which the compute stream waits for before its next work (the
// next step's forward). With Accumulate<K> a micro-batch's gradients are
// copied out every micro-batch, and the first writer of each gradient in
// micro-batch k > 0 starts from the offload tier's sum (Step::grad_load);
// the updates follow the last micro-batch.
//
// Several processes (DataParallel<N> with ZeRO 0-3, TensorParallel<M>,
// PipelineParallel<S>). With data parallelism the step that completes a
// gradient is the collective that averages it (the all-reduce; with ZeRO
// 2 and 3 the reduce-scatter, and the offloaded gradient is this rank's
// shard, which with Accumulate<K> is loaded from the offload tier's sum
// before the reduce-scatter adds to it). No update runs during the
// backward: after it, norm_over_processes gives every process the norm
// and clip scale of the run without OffloadOptimizer, a norm that is not
// finite stops every process before any update, and each updates the
// elements it holds (trainers::owned: with ZeRO 1-3 its shard of master
// and state) on update_threads_ threads; weights_to_device copies them
// into its device weights, and with ZeRO 1 and 2 gather_weights brings the
// other ranks' blocks. A pipeline stage streams its gradients micro-batch
// by micro-batch under 1F1B as one process does over its micro-batches. A
// gradient several processes sum (graph::offloaded_after_sum: a LoRA
// matrix each tensor-parallel rank holds whole, a tied table on the first
// and last stage) stays on the device for the step and is summed there
// after the backward (sum_partial_gradients), then copied out
// (offload_summed_gradients).
//
// OffloadParameters: the parameters' stored tensors are in the offload
// tier too, and the device holds only the copies the schedule's fetch
// steps make for the event after them (Step::weight / scales, which
// bind_step resolves; context() leaves any other parameter pointer null).
// A fetch is issued on the copy stream after an event of the compute
// stream, so it overwrites its device buffers only once their previous
// readers are done; where the plan has the buffers alive from the compute
// event before the fetch (copy_waits.cuh) it is issued before that
// event and overlaps it. The compute stream waits for it before the event
// that reads it (copy_waits.cuh). The update (both paths above) writes
// the new values into the stored tensor in place of the gradient's bytes
// (an f32 run's too, beside its master), and weights_to_device copies
// nothing: the next step's fetches bring them. A parameter's last fetch
// in a step precedes the copy of its gradient on the copy stream, so the
// update thread never writes values a pending fetch still reads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../cuda/kernels/optimizer.cuh"
#include "../../cuda/runtime.cuh"
#include "../../host/kernels/optimizer.hpp"
#include "../../host/lane_worker.hpp"
#include "../../host/parallel.hpp"
#include "../../plan/schedule.hpp"
#include "../gradient_check.hpp"
#include "../offload_update.hpp"
#include "../ownership.hpp"

namespace headroom::cuda::detail {

// The host engine's type of the bits the device stores as S (host/storage.hpp):
// the CPU's update reads and writes the offload tier's values as it.
template <class S>
using host_storage_t = std::conditional_t<std::is_same_v<S, bf16>, host::bf16, std::conditional_t<std::is_same_v<S, f16>, host::f16, S>>;
static_assert(sizeof(host_storage_t<bf16>) == sizeof(bf16) && sizeof(host_storage_t<f16>) == sizeof(f16));

template <class Engine>
class OffloadOptimizer {
 protected:
  Engine& self() { return static_cast<Engine&>(*this); }
  const Engine& self() const { return static_cast<const Engine&>(*this); }

  struct OffloadTask {
    OffloadOptimizer* owner = nullptr;
    int step = -1;  // the schedule step whose gradients were copied
  };
  static constexpr std::int64_t update_range_elements = 65536;  // a multiple of AdamW8bit's 256-element blocks

  std::unique_ptr<host::LaneWorker<OffloadTask>> updater_;
  std::vector<OffloadTask> host_calls_;            // per schedule step: cudaLaunchHostFunc's user data
  trainers::UpdatesInFlight inflight_{0};          // clip_norm = 0: the updates during the backward
  std::vector<char> updated_;                      // per parameter: updated on the CPU this step (its weights go back)
  bool offload_updating_ = false;                  // in step(): the last micro-batch hands its gradients to the update thread
  int update_threads_ = 1;
  cudaEvent_t weights_back_{};

  ~OffloadOptimizer() {
    if (weights_back_ != nullptr) cudaEventDestroy(weights_back_);
  }

  void prepare_offload() {
    const auto& sched = Engine::sched;
    update_threads_ = self().opt_.threads > 0 ? self().opt_.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    updater_ = std::make_unique<host::LaneWorker<OffloadTask>>();
    host_calls_.assign(sched.steps.size(), OffloadTask{});
    for (std::size_t g = 0; g < sched.steps.size(); ++g) host_calls_[g] = OffloadTask{this, static_cast<int>(g)};
    inflight_ = trainers::UpdatesInFlight(sched.params.size());
    updated_.assign(sched.params.size(), 0);
    check(cudaEventCreateWithFlags(&weights_back_, cudaEventDisableTiming), "cudaEventCreate");
    zero_offloaded_states();
  }
  // The update thread stops (the trainer's destructor, before the arenas go).
  void stop_offload() { updater_.reset(); }
  // The optimizer states start at zero (pinned memory is not zeroed).
  void zero_offloaded_states() {
    for (const ParamSlot& p : Engine::sched.params)
      if (p.trainable && p.state >= 0)
        std::memset(self().offload_.template at<std::byte>(p.state), 0, static_cast<std::size_t>(self().state_bytes(p)));
  }
  // Outside a step: every copy to or from the offload tier is done and the update thread is idle.
  void settle_offload() const {
    self().wait(self().copy_, "the copies between the tiers");
    if (updater_) updater_->settle();
  }
  template <class U>
  std::vector<U> from_offload_tier(std::int64_t offset, std::int64_t n) const {
    settle_offload();
    const U* from = self().offload_.template at<U>(offset);
    return std::vector<U>(from, from + n);
  }

  // Accumulate<K>: before a step that writes a gradient first in its
  // micro-batch, the gradient starts at zero (micro-batch 0) or at the offload
  // tier's sum so far, on the compute stream (Step::grad_load). With ZeRO 2
  // and 3 that step is the reduce-scatter, and the gradient this rank's shard.
  void load_gradients(const Step& st, int micro) {
    Engine& t = self();
    for (int q = 0; q < graph::max_weights; ++q) {
      if (!st.grad_load[q]) continue;
      const ParamSlot& p = Engine::sched.params[static_cast<std::size_t>(st.param[q])];
      const auto [device, n] = trainers::held_gradient<typename Engine::S>(Engine::config, t.device_, p);
      const auto bytes = static_cast<std::size_t>(n) * sizeof(typename Engine::S);
      if (micro == 0)
        check(cudaMemsetAsync(device, 0, bytes, t.compute_), "zero a gradient");
      else
        check(cudaMemcpyAsync(device, t.offload_.template at<std::byte>(p.host_grad), bytes, cudaMemcpyHostToDevice, t.compute_),
              "load an offloaded gradient");
    }
  }
  // Whether each update runs on the update thread as soon as its gradient is
  // offloaded: without clipping, on one process. With several processes
  // the updates wait for the backward, so that they agree on the norm (the
  // sum of their gradients' squares) and on whether every gradient is
  // finite before any update.
  bool updates_in_flight() const {
    return trainers::UpdatesInFlight::possible(self().opt_, Engine::config.world() == 1, self().scaler_.enabled());
  }
  // Whether this micro-batch hands its gradients to the update thread as they reach the offload tier.
  bool hands_over_now() const { return offload_updating_ && self().micro_ == Engine::config.accumulate - 1 && updates_in_flight(); }

  // The loss flags of the step (UpdateControl::skip, set by a non-finite loss
  // of any micro-batch) for the update thread: after the last micro-batch's
  // loss, copied on the copy stream into the staging's control-in slot (read
  // by upload_control at the start of the step, free since), ahead of the
  // gradients; a step whose loss is not finite updates nothing.
  void stage_loss_flags() {
    Engine& t = self();
    t.wait_for_compute(t.copy_);
    check(cudaMemcpyAsync(t.staged_control_in(), t.control(), sizeof(UpdateControl), cudaMemcpyDeviceToHost, t.copy_),
          "copy the loss flags");
  }
  bool loss_not_finite() const { return self().staged_control_in()->skip != 0.0f; }

  // After step g: the gradients it completes to the offload tier, and in
  // step()'s last micro-batch to the update thread. With data parallelism
  // step g is the collective that averages them (on the communication
  // stream, whose work on step g the copies wait for; the compute stream
  // joins the copies where it would have joined the collective).
  void stream_gradients(int g) {
    Engine& t = self();
    const Step& st = Engine::sched.steps[static_cast<std::size_t>(g)];
    if (st.update_end == st.update_begin) return;
    if (Engine::lane_join[static_cast<std::size_t>(g)] >= 0) {
      check(cudaStreamWaitEvent(t.copy_, t.copy_done_[static_cast<std::size_t>(g)], 0), "cudaStreamWaitEvent");
    } else {
      t.wait_for_compute(t.copy_);
    }
    for (int u = st.update_begin; u < st.update_end; ++u)
      offload_gradient(Engine::sched.params[static_cast<std::size_t>(Engine::sched.updates[u])]);
    if (hands_over_now())
      check(cudaLaunchHostFunc(t.copy_, &gradients_offloaded, &host_calls_[static_cast<std::size_t>(g)]), "cudaLaunchHostFunc");
    check(cudaEventRecord(t.copy_done_[static_cast<std::size_t>(g)], t.copy_), "cudaEventRecord");
  }
  // On the copy stream, after the copies (no CUDA call here): the update thread takes over.
  static void CUDART_CB gradients_offloaded(void* task) {
    const OffloadTask& t = *static_cast<const OffloadTask*>(task);
    t.owner->updater_->submit(&run_offload_task, t);
  }
  static void run_offload_task(const OffloadTask& t) { t.owner->update_in_flight(t.step); }

  // On the update thread (clip_norm = 0): the parameters step g completed.
  void update_in_flight(int g) {
    const Step& st = Engine::sched.steps[static_cast<std::size_t>(g)];
    const bool stopped = loss_not_finite();
    for (int u = st.update_begin; u < st.update_end; ++u) {
      const int k = Engine::sched.updates[u];
      const ParamSlot& p = Engine::sched.params[static_cast<std::size_t>(k)];
      inflight_.offloaded(
          k, offloaded_squares(p), true,
          [&] {
            update_on_host(p, 1.0f, update_threads_);
            updated_[static_cast<std::size_t>(k)] = 1;
          },
          [&](int j) { return bad_element(j); }, stopped);
    }
  }

  // step(): the step enqueued, the loss read, and the update on the CPU
  // (in flight, or now with the norm of every gradient); the new weights
  // on their way back. True when a scaled gradient overflowed (skipped).
  bool offloaded_step(StepStats& s, int step_no) {
    Engine& t = self();
    const auto& sched = Engine::sched;
    inflight_.begin_step();
    std::fill(updated_.begin(), updated_.end(), char{0});
    offload_updating_ = true;
    struct Done {  // on every way out of the step: no host function or update runs past it
      bool& updating;
      cudaStream_t copies;
      host::LaneWorker<OffloadTask>& updater;
      ~Done() {
        updating = false;
        cudaStreamSynchronize(copies);
        updater.settle();
      }
    } done{offload_updating_, t.copy_, *updater_};
    t.enqueue_step();
    const UpdateControl r = t.results();
    t.wait(t.copy_, "the gradients' copies to the offload tier");
    updater_->wait_all();
    t.check_outliers(r);  // the update thread saw the skip flag too: nothing was updated
    if (r.skip != 0.0f) throw non_finite_loss(step_no, r.loss);  // the update thread saw the flag: nothing was updated
    s.loss = r.loss;
    if (Engine::config.world() > 1 || t.scaler_.enabled()) {
      // several processes (or a scaled loss): the norm over all of them on the device, then each one's
      // update of what it holds; an overflow of a scaled gradient skips the step
      const UpdateControl n = norm_over_processes();
      const bool finite = n.norm - n.norm == 0.0f;
      if (!finite && t.scaler_.enabled()) {
        s.grad_norm = n.norm;
        return true;
      }
      if (!finite) stop_before_update(step_no, n.norm);
      update_all(n.grad_scale);
      t.gather_weights();
      s.grad_norm = n.norm;
    } else if (t.opt_.clip_norm <= 0) {
      weights_to_device();  // (those updated before a gradient failed keep their update)
      s.grad_norm = inflight_.norm(Engine::plan, sched, step_no);
    } else {
      // the device's norm and clip scale (clip_scale_kernel), from the offloaded gradients
      const float total = squared_norm_on_host<typename Engine::S>(t.counted_.on_device, t.counted_.offloaded, [&](int blocks, auto&& f) {
        host::parallel_for(blocks, update_threads_, [&](std::int64_t b, int) { f(static_cast<int>(b)); });
      });
      const float norm = std::sqrt(total), clip = static_cast<float>(t.opt_.clip_norm);
      if (!(norm - norm == 0.0f)) stop_before_update(step_no, norm);
      update_all(norm > clip ? clip / (norm + 1e-6f) : 1.0f);
      s.grad_norm = norm;
    }
    return false;
  }
  // Every trainable parameter's update on the CPU (after the backward), then the new weights to the device.
  void update_all(float grad_scale) {
    for (std::size_t k = 0; k < Engine::sched.params.size(); ++k)
      if (Engine::sched.params[k].trainable) {
        update_on_host(Engine::sched.params[k], grad_scale, update_threads_);
        updated_[k] = 1;
      }
    weights_to_device();
  }

  // Several processes: the gradient norm and clip scale of the run without
  // OffloadOptimizer, bit for bit on the emulator. gradient_norm() runs as
  // it does without offload, but the CPU sums the squares of the offloaded
  // gradients (of the elements this process updates) into the norm kernel's
  // partial sums (offloaded_partial_squares); the device adds them and the
  // processes' sums (ZeRO 1-3: the data-parallel ranks' shards; tensor
  // parallelism: the split gradients' over the group; pipeline stages: each
  // stage's), and the host reads norm and clip scale back: the same on
  // every process.
  UpdateControl norm_over_processes() {
    self().gradient_norm();
    return self().results();
  }
  // The squares of params' offloaded gradients summed on the CPU in the norm
  // kernel's partial sums (squared_norm_partials_on_host), uploaded to the
  // reductions buffer's first slots; returns how many.
  template <class Counted>
  int offloaded_partial_squares(const Counted& params) {
    std::vector<float> partials;
    auto for_blocks = [&](int b, auto&& f) {
      host::parallel_for(b, update_threads_, [&](std::int64_t x, int) { f(static_cast<int>(x)); });
    };
    const int blocks = squared_norm_partials_on_host<typename Engine::S>(params.on_device, params.offloaded, partials, for_blocks);
    if (blocks > 0) self().upload(self().reductions(), partials.data(), partials.size(), "upload the squares' partial sums");
    return blocks;
  }

  // The gradients several processes sum before the update
  // (graph::offloaded_after_sum), from the device to the offload tier after
  // the backward, on the copy stream (which offloaded_step waits for).
  void offload_summed_gradients() {
    self().wait_for_compute(self().copy_);
    for (const ParamSlot& p : Engine::sched.params)
      if (p.trainable && graph::offloaded_after_sum(Engine::config, p)) offload_gradient(p);
  }
  // p's gradient (trainers::held_gradient) to its copy in the offload tier, on the copy stream.
  void offload_gradient(const ParamSlot& p) {
    Engine& t = self();
    const auto [from, n] = trainers::held_gradient<typename Engine::S>(Engine::config, t.device_, p);
    check(cudaMemcpyAsync(t.offload_.template at<std::byte>(p.host_grad), from, static_cast<std::size_t>(n) * sizeof(typename Engine::S),
                          cudaMemcpyDeviceToHost, t.copy_),
          "offload a gradient");
  }

  // The updated parameters' new weights to the device (16-bit: from
  // host_grad's bytes, f32: the master), on the copy stream; the compute
  // stream's next work waits for them. With ZeRO 1 and 2 a rank's shard goes
  // into its block of the whole weight (gather_weights then brings the
  // others'), with ZeRO 3 into its shard. With OffloadParameters there are no
  // device weights: the update wrote the stored values, and the next step's
  // fetches copy them.
  void weights_to_device() {
    using S = typename Engine::S;
    Engine& t = self();
    if constexpr (!Engine::params_offloaded) {
      for (std::size_t k = 0; k < Engine::sched.params.size(); ++k) {
        if (updated_[k] == 0) continue;
        const ParamSlot& p = Engine::sched.params[k];
        const trainers::Owned own = t.owned(p);
        if (own.count == 0) continue;
        const void* from = Engine::half ? static_cast<const void*>(t.offload_.template at<S>(p.host_grad) + own.grad_at)
                                        : static_cast<const void*>(t.offload_.template at<float>(p.master));
        check(cudaMemcpyAsync(t.device_.template at<S>(p.weight) + own.weight_at, from, static_cast<std::size_t>(own.count) * sizeof(S),
                              cudaMemcpyHostToDevice, t.copy_),
              "copy updated weights to the device");
      }
      check(cudaEventRecord(weights_back_, t.copy_), "cudaEventRecord");
      check(cudaStreamWaitEvent(t.compute_, weights_back_, 0), "cudaStreamWaitEvent");
    }
  }

  // p's update on the CPU, in ranges of update_range_elements on `threads` threads.
  void update_on_host(const ParamSlot& p, float grad_scale, int threads) {
    const std::int64_t n = self().owned(p).count, ranges = ceil_div(n, update_range_elements);
    host::parallel_for(ranges, std::min<std::int64_t>(threads, ranges) > 1 ? threads : 1, [&](std::int64_t r, int) {
      const std::int64_t from = r * update_range_elements;
      update_range(p, from, std::min(update_range_elements, n - from), grad_scale);
    });
  }

  // Elements [from, from + count) of p's update (of the elements this rank
  // updates: trainers::owned; the master and the state hold those only):
  // the host engine's optimizer pass (host/kernels/optimizer.hpp) over the
  // master weights, the state and the offloaded gradient. A 16-bit run's new
  // weights are written over the gradient's bytes (the pass reads each chunk
  // of it before it stores the chunk's weights), with OffloadParameters into
  // the parameter's stored values; an f32 run's master is its weight (with
  // OffloadParameters copied into the stored values).
  void update_range(const ParamSlot& p, std::int64_t from, std::int64_t count, float grad_scale) {
    using H = host_storage_t<typename Engine::S>;
    using O = typename Engine::run::optimizer;
    const Engine& t = self();
    const trainers::Owned own = t.owned(p);
    H* g = t.offload_.template at<H>(p.host_grad) + own.grad_at;
    float* master = t.offload_.template at<float>(p.master);
    H* stored = Engine::params_offloaded ? t.offload_.template at<H>(p.weight) + own.weight_at : g;
    const StateAt state{p.state >= 0 ? t.offload_.template at<std::byte>(p.state) : nullptr, own.count, from, &O::desc};
    const auto step = t.step_control_.template step_constants<typename O::template Step<float>>();
    const float* table = Engine::sched.optim_table >= 0 ? t.offload_.template at<float>(Engine::sched.optim_table) : nullptr;
    if constexpr (Engine::half) {
      host::optimizer_pass<O>(stored + from, master + from, g + from, state, count, step, grad_scale, table, 1);
    } else {
      host::optimizer_pass<O>(master + from, nullptr, g + from, state, count, step, grad_scale, table, 1);
      if constexpr (Engine::params_offloaded) std::memcpy(stored + from, master + from, static_cast<std::size_t>(count) * sizeof(float));
    }
  }

  // p's offloaded gradient from the first element this rank updates (as the device stores it, and as the CPU reads it).
  auto offloaded_gradient(const ParamSlot& p) const {
    return self().offload_.template at<typename Engine::S>(p.host_grad) + self().owned(p).grad_at;
  }
  auto host_gradient(const ParamSlot& p) const {
    return self().offload_.template at<host_storage_t<typename Engine::S>>(p.host_grad) + self().owned(p).grad_at;
  }
  // The squares of p's offloaded gradient (the elements this rank updates), in double (a fixed order).
  double offloaded_squares(const ParamSlot& p) const { return host::squared_norm(host_gradient(p), self().owned(p).count); }
  // Parameter k's first NaN or infinite offloaded gradient element (of those this process updates).
  trainers::BadElement bad_element(int k) const {
    const ParamSlot& p = Engine::sched.params[static_cast<std::size_t>(k)];
    const auto* g = host_gradient(p);
    const trainers::Owned own = self().owned(p);
    const std::int64_t at = host::first_non_finite(g, own.count);
    if (at < 0) return {};
    return {own.begin + at, static_cast<double>(host::widen(g[at]))};
  }
  // The norm is not finite (trainers::GradientCheck::stop_before_update); nothing was updated.
  [[noreturn]] void stop_before_update(int step_no, float norm) {
    const auto& sched = Engine::sched;
    trainers::GradientCheck::stop_before_update(
        Engine::plan, sched, step_no, static_cast<double>(norm) * norm,
        [&](int k) { return offloaded_squares(sched.params[static_cast<std::size_t>(k)]); }, [&](int k) { return bad_element(k); });
  }
};

}  // namespace headroom::cuda::detail
