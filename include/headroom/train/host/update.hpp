#pragma once
// host::detail::Update<Trainer, T>: host::Trainer's optimizer step. After the
// backward: the gradients several processes hold summed, the global norm
// (its pass is the check of every gradient), loss scaling's skip, clipping,
// each parameter's update and ZeRO 1-2's gathers; with UpdateInBackward each
// parameter's update as its gradient completes. A base of host::Trainer
// (train/host/trainer.hpp) that reaches the trainer's arenas, groups and
// step state through self() (CRTP; T is the trainer's storage type, which
// the trainer cannot give while it is incomplete).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "../../core/optim_state.hpp"
#include "../../host/kernels/optimizer.hpp"
#include "../../plan/schedule.hpp"
#include "../gradient_check.hpp"
#include "../ownership.hpp"

namespace headroom::host::detail {

template <class Trainer, class T>
class Update {
  using C = compute_t<T>;

 protected:
  // A gradient stops the step when its squares leave f32's range
  // (train/gradient_check.hpp); the CUDA engine computes the norm in f32 and
  // stops on the same condition.
  static constexpr double max_squares = trainers::GradientCheck::max_squares;

  // Returns the global gradient norm before clipping. The norm's pass is the
  // check: only when its sum is out of range are the gradients searched, and
  // the step stops before any parameter is updated.
  double update(int step_no) {
    constexpr RunConfig config = Trainer::config;
    Trainer& t = self();
    sum_partial_gradients();
    double sq = 0, split_sq = 0;  // split_sq: of the tensor-parallel ranks' blocks (each holds its own)
    for (std::size_t k = 0; k < Trainer::sched.params.size(); ++k) {
      const ParamSlot& p = Trainer::sched.params[k];
      if (p.trainable && !(p.stage_shared && !config.first_stage()))  // a table both end stages hold: counted on the first
        (p.split.split() ? split_sq : sq) += squares_of(k);
    }
    if constexpr (config.tp > 1) t.groups_.tensor->all_reduce_sum(&split_sq, 1, DType::F64);
    sq += split_sq;
    if constexpr (config.sharded(1)) t.groups_.data->all_reduce_sum(&sq, 1, DType::F64);  // each rank summed its shards
    if constexpr (config.pp > 1) t.groups_.pipe->all_reduce_sum(&sq, 1, DType::F64);  // each stage its parameters
    // Loss scaling: a scaled gradient with a NaN or an infinity, or whose
    // squares sum beyond f32's range (the CUDA engine's f32 norm overflows
    // there too), skips the step. Below that bound the update's factor,
    // clip scale / loss scale = clip / scaled norm, stays a normal f32.
    const double inverse = 1.0 / t.step_scale_;  // exact for a power of two
    if (t.scaler_.enabled() && !(sq <= max_squares)) {
      t.skipped_ = true;
      return std::sqrt(sq) * inverse;
    }
    sq *= inverse * inverse;
    if (!(sq <= max_squares)) stop_before_update(step_no, sq);
    const double norm = std::sqrt(sq);
    C scale = C(1);
    if (t.opt_.clip_norm > 0 && norm > t.opt_.clip_norm) scale = static_cast<C>(t.opt_.clip_norm / (norm + 1e-6));
    scale *= static_cast<C>(inverse);  // the update's gradient factor: clip scale / loss scale
    if constexpr (config.offload_optimizer) {
      t.update_offloaded_all(step_no, scale);
    } else {
      for (const ParamSlot& p : Trainer::sched.params)
        if (p.trainable) update_param(p, step_no, scale);
    }
    // ZeRO 1 and 2: every rank updated its shard of each weight; gather the others'
    if constexpr (config.sharded(1) && !config.sharded(3))
      for (const ParamSlot& p : Trainer::sched.params)
        if (p.trainable) {
          t.groups_.data->all_gather(t.weight_storage(p), p.shard * static_cast<std::int64_t>(sizeof(T)));
          // OffloadParameters: gathered through the mapping; the file keeps the values, not RAM
          if constexpr (config.offload_params) t.offload_.release(p.weight, p.shard * config.dp * static_cast<std::int64_t>(sizeof(T)));
        }
    return norm;
  }

  // UpdateInBackward: the updates of the parameters whose gradients `st`
  // completed, in update order. Each checks its own gradient first (its
  // squared norm's pass; StepStats::grad_norm sums them). From the first
  // gradient that fails, no update of this step runs; the later gradients
  // are still checked (on this failure path only), so the error names the
  // first in schedule order, as without UpdateInBackward.
  void update_in_backward(const Step& st, int step_no) {
    for (int u = st.update_begin; u < st.update_end; ++u) {
      const int k = Trainer::sched.updates[u];
      const ParamSlot& p = Trainer::sched.params[k];
      const double sq = squared_norm(self().device_.template at<T>(p.grad), p.elements());
      self().checked_.complete(k, sq, [&] { update_param(p, step_no, C(1)); }, [&](int j) { return bad_element(j); });
    }
  }

  // Parameter k's first NaN or infinite gradient element, as the update reads the gradient.
  trainers::BadElement bad_element(int k) const {
    const T* g = update_grad(Trainer::sched.params[k]);
    const Owned own = self().owned(Trainer::sched.params[k]);
    const std::int64_t at = first_non_finite(g, own.count);
    if (at < 0) return {};
    return {own.begin + at, static_cast<double>(widen(g[at]))};
  }

  // The state of elements [from, ...) of a count-element parameter whose
  // state buffer starts at `state` (null: it keeps none).
  static StateAt state_at(std::byte* state, std::int64_t count, std::int64_t from) {
    return StateAt{state, count, from, &Trainer::run::optimizer::desc};
  }
  // master: the f32 master weights of these n elements (a bf16 run), else null
  void apply_update(T* w, float* master, const T* g, const StateAt& state, std::int64_t n, int step_no, C grad_scale,
                    int workers) const {
    using O = typename Trainer::run::optimizer;
    const float* table =
        Trainer::sched.optim_table >= 0 ? self().states_arena().template at<float>(Trainer::sched.optim_table) : nullptr;
    optimizer_pass<O>(w, master, g, state, n, O::template step<C>(self().lr_at(step_no), step_no), grad_scale, table, workers);
  }

 private:
  Trainer& self() { return static_cast<Trainer&>(*this); }
  const Trainer& self() const { return static_cast<const Trainer&>(*this); }

  // Gradients whose parts several processes hold, summed on each before
  // the norm: with a tied LM head over pipeline stages, the table's of the
  // first and the last stage (trainers::tied_stages); with tensor
  // parallelism, a LoRA matrix's partial sums (ParamSlot::tensor_partial).
  void sum_partial_gradients() {
    constexpr RunConfig config = Trainer::config;
    Trainer& t = self();
    for (const ParamSlot& p : Trainer::sched.params) {
      if (!p.trainable || !(p.stage_shared || p.tensor_partial)) continue;
      // OffloadOptimizer: the offload tier's copy (the whole one, or this rank's shard, as on the device)
      const auto [g, n] = config.offload_optimizer
                              ? std::pair<T*, std::int64_t>{t.offload_.template at<T>(p.host_grad), trainers::held_gradient<T>(config, t.device_, p).second}
                              : trainers::held_gradient<T>(config, t.device_, p);
      if constexpr (Trainer::tied_stages)
        if (p.stage_shared) t.groups_.shared->all_reduce_sum(g, n, dtype_of<T>);
      if constexpr (config.tp > 1)
        if (p.tensor_partial) t.groups_.tensor->all_reduce_sum(g, n, dtype_of<T>);
    }
  }

  // Parameter k's gradient's squares, over the elements this process updates.
  double squares_of(std::size_t k) const {
    const ParamSlot& p = Trainer::sched.params[k];
    if constexpr (Trainer::config.offload_optimizer)
      if (!(p.stage_shared || p.tensor_partial)) return self().inflight_.squares[k];  // summed on the update thread
    return squared_norm(update_grad(p), self().owned(p).count);
  }

  // ZeRO 1-3: the elements of parameter p this rank updates and where they
  // start in its weight and gradient buffers (trainers::owned, as the CUDA engine's).
  using Owned = trainers::Owned;
  // The averaged gradient the update reads: from its first owned element.
  T* update_grad(const ParamSlot& p) const {
    if constexpr (Trainer::config.offload_optimizer) return self().offload_.template at<T>(p.host_grad) + self().owned(p).grad_at;
    return self().device_.template at<T>(Trainer::config.sharded(2) ? p.grad_shard : p.grad) + self().owned(p).grad_at;
  }

  // The failure path of update() (trainers::GradientCheck::stop_before_update).
  [[noreturn]] void stop_before_update(int step_no, double total) {
    const double scale = static_cast<double>(self().step_scale_) * self().step_scale_;
    trainers::GradientCheck::stop_before_update(
        Trainer::plan, Trainer::sched, step_no, total,
        [&](int k) { return squared_norm(update_grad(Trainer::sched.params[k]), self().owned(Trainer::sched.params[k]).count) / scale; },
        [&](int k) { return bad_element(k); });
  }

  void update_param(const ParamSlot& p, int step_no, C grad_scale) {
    const Owned own = self().owned(p);
    if (own.count == 0) return;  // a rank whose shard lies past the parameter's end
    update_range(p, 0, own.count, step_no, grad_scale, self().workers_);
  }

  // The update of elements [from, from + n) of what this rank updates of
  // parameter p, in place in the arenas (every element is updated on its
  // own, so a parameter may be updated range by range; a range starts on a
  // multiple of the optimizer's desc.align: AdamW8bit's 256-element blocks).
  void update_range(const ParamSlot& p, std::int64_t from, std::int64_t n, int step_no, C grad_scale, int workers) const {
    const Trainer& t = self();
    const Owned own = t.owned(p);
    float* m = t.master(p);
    apply_update(t.weight_storage(p) + own.weight_at + from, m != nullptr ? m + from : nullptr, update_grad(p) + from,
                 state_at(p.state >= 0 ? t.states_arena().template at<std::byte>(p.state) : nullptr, own.count, from), n, step_no,
                 grad_scale, workers);
  }
};

}  // namespace headroom::host::detail
