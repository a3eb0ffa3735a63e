#pragma once
// cuda::Trainer's step control: what the host gives a step and reads back.
// The batch and the step's hyperparameters go through pinned staging (the
// plan's offload tier) into the batch buffers and the control block on the
// device (cuda::UpdateControl), from where a step, captured in a CUDA graph
// or not, reads them; the loss (the mean over the data-parallel ranks, the
// sum over pipeline stages), the norm and the skip flags come back the same
// way, with one wait at the end of the step. cuda::Trainer inherits it (a
// CRTP base: Engine is the trainer, whose arena and streams it uses).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../../cuda/kernels/loss.cuh"
#include "../../cuda/kernels/optimizer.cuh"
#include "../../cuda/runtime.cuh"
#include "../../math/llm_int8.hpp"
#include "../../plan/schedule.hpp"
#include "../common.hpp"

namespace headroom::cuda::detail {

template <class Engine>
class StepControl {
 protected:
  const Engine& self() const { return static_cast<const Engine&>(*this); }
  Engine& self() { return static_cast<Engine&>(*this); }

  // the staging, in pinned host memory of the plan's offload tier:
  //   [tokens i32 x accumulate N][targets i32 x accumulate N][UpdateControl in][UpdateControl out]
  std::int32_t* staged_tokens() const { return self().offload_.template at<std::int32_t>(Engine::sched.staging.offset); }
  std::int32_t* staged_targets() const { return staged_tokens() + self().tokens_per_step; }
  UpdateControl* staged_control_in() const {
    auto& t = self();
    return t.offload_.template at<UpdateControl>(Engine::sched.staging.offset + 2 * t.tokens_per_step * 4);
  }
  UpdateControl* staged_control_out() const {
    auto& t = self();
    const std::int64_t at = Engine::sched.staging.offset + 2 * t.tokens_per_step * 4 + CudaWorkspace::control_floats * 4;
    return t.offload_.template at<UpdateControl>(at);
  }
  UpdateControl* control() const { return reinterpret_cast<UpdateControl*>(self().reductions() + reduction_slots); }
  UpdateControl step_control_{};  // the step's hyperparameters (stage_batch)

  // The host's part of a step: the batch and the step's hyperparameters into
  // the pinned staging, from where the (possibly captured) step copies them.
  // `training`: step()'s (its loss is scaled; forward_backward's gradients are true ones).
  void stage_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int step_no, bool training = false) {
    auto& t = self();
    std::memcpy(staged_tokens(), tokens.data(), tokens.size_bytes());
    std::memcpy(staged_targets(), targets.data(), targets.size_bytes());
    UpdateControl c{};
    c.grad_scale = 1.0f;
    using O = typename Engine::run::optimizer;
    c.set_step_constants(O::template step<float>(t.lr_at(step_no), step_no));
    c.step = t.evaluating_ ? 0 : step_no;
    c.loss_scale = training ? t.scaler_.scale() : 1.0f;
    *staged_control_in() = c;
    step_control_ = c;
  }
  void upload_control() {
    auto& t = self();
    check(cudaMemcpyAsync(control(), staged_control_in(), sizeof(UpdateControl), cudaMemcpyHostToDevice, t.compute_), "upload control");
  }
  // Waits for the step and reads its results (loss, norm, skip).
  UpdateControl results() {
    auto& t = self();
    check(cudaMemcpyAsync(staged_control_out(), control(), sizeof(UpdateControl), cudaMemcpyDeviceToHost, t.compute_), "read results");
    t.wait(t.compute_, "the step");
    return *staged_control_out();
  }
  // LLM.int8: a projection refused the batch (more outlier columns than the
  // plan's bound; kernels/llm_int8.cuh): the error names its layer as
  // host::Trainer names it. The step updated nothing (skip).
  void check_outliers(const UpdateControl& r) const {
    if (r.outliers_found == 0) return;
    constexpr auto& sched = Engine::sched;
    if (r.outlier_step < 0 || r.outlier_step >= static_cast<int>(sched.steps.size()) || sched.steps[r.outlier_step].param[0] < 0)
      throw outlier_bound_exceeded("", r.outliers_found, -1, 0.0f);  // (a kernel run outside the schedule's events)
    const Step& st = sched.steps[static_cast<std::size_t>(r.outlier_step)];
    const QuantDesc& q = sched.params[static_cast<std::size_t>(st.param[0])].quant;
    throw outlier_bound_exceeded(trainers::node_path(Engine::plan, st.node, st.instance), r.outliers_found, q.max_outliers,
                                 q.outlier_threshold);
  }
  double evaluated_loss() {
    const UpdateControl r = results();
    check_outliers(r);
    return r.loss * Engine::config.accumulate;
  }
  // (A pipeline stage between the first and the last reads neither.)
  void load_batch(int k) {
    auto& t = self();
    const std::size_t bytes = static_cast<std::size_t>(t.tokens_per_micro_batch) * 4;
    if (Engine::sched.tokens.bound())
      check(cudaMemcpyAsync(t.template ptr<std::int32_t>(Engine::sched.tokens), staged_tokens() + k * t.tokens_per_micro_batch, bytes,
                            cudaMemcpyHostToDevice, t.compute_),
            "upload tokens");
    if (Engine::sched.targets.bound())
      check(cudaMemcpyAsync(t.template ptr<std::int32_t>(Engine::sched.targets), staged_targets() + k * t.tokens_per_micro_batch, bytes,
                            cudaMemcpyHostToDevice, t.compute_),
            "upload targets");
  }

  // Pipeline parallelism: the loss in the control block (the last stage's;
  // 0 on the others) summed over the stages, so that every stage has it and
  // a loss that is not finite stops the update on every stage.
  void loss_over_stages() {
    auto& t = self();
    t.groups_.pipe->all_reduce_sum(&control()->loss, 1, DType::F32, t.compute_);
    mean_loss(control(), 1.0f, t.compute_);
  }

  // Data parallelism: the loss in the control block becomes the mean over
  // the ranks (and a loss not finite on any rank stops the update on all).
  void mean_over_ranks() {
    auto& t = self();
    if (t.groups_.data == nullptr) return;
    t.on_communication_stream([&](cudaStream_t s) { t.groups_.data->all_reduce_sum(&control()->loss, 1, DType::F32, s); });
    mean_loss(control(), 1.0f / static_cast<float>(t.groups_.data->size()), t.compute_);
  }
};

}  // namespace headroom::cuda::detail
