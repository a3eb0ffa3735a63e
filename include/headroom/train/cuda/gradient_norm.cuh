#pragma once
// cuda::Trainer's gradients after the backward: the parameter lists the
// update and the norm read (ParamRef: what each rank updates of every
// trainable parameter), the sums of gradients several processes hold
// parts of, the global gradient norm and clip scale (on the device, over
// the data-parallel ranks, tensor-parallel group and pipeline stages), and
// the failure path that names a non-finite gradient after the step.
// cuda::Trainer inherits it (a CRTP base: Engine is the trainer, S its
// storage type).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../cuda/kernels/optimizer.cuh"
#include "../../cuda/runtime.cuh"
#include "../../plan/schedule.hpp"
#include "../common.hpp"
#include "../gradient_check.hpp"
#include "../ownership.hpp"

namespace headroom::cuda::detail {

template <class Engine, class S>
class GradientNorm {
 protected:
  const Engine& self() const { return static_cast<const Engine&>(*this); }
  Engine& self() { return static_cast<Engine&>(*this); }

  std::vector<ParamRef> trainable_;     // every trainable parameter, in schedule order
  // the gradient norm's: every trainable parameter but the last stage's copy
  // of a table the first stage holds too (counted there), all of them
  // (counted_) or with tensor parallelism split (each rank its block) or whole
  // OffloadOptimizer: with the offloaded gradients (from the first element the process updates)
  struct Counted {
    std::vector<ParamRef> on_device;
    std::vector<const S*> offloaded;
    void add(const ParamRef& r, const S* g) {
      on_device.push_back(r);
      offloaded.push_back(g);
    }
  };
  Counted counted_, counted_split_, counted_whole_;
  std::vector<ParamRef> in_backward_;   // UpdateInBackward: sched.updates order

  // What the update of p reads and writes: with ZeRO 1-3 the elements this
  // rank owns (trainers::owned), of the averaged gradient (ZeRO 2 and 3: its shard).
  ParamRef ref(const ParamSlot& p) const {
    auto& t = self();
    const trainers::Owned own = t.owned(p);
    // OffloadOptimizer: master and state are in the offload tier, updated on the CPU (no kernel reads them);
    // OffloadParameters: so are the weights
    return ParamRef{Engine::params_offloaded ? nullptr : t.device_.template at<S>(p.weight) + own.weight_at,
                    Engine::half && p.master >= 0 && !Engine::offloaded ? t.device_.template at<float>(p.master) : nullptr,
                    t.device_.template at<S>(Engine::config.sharded(2) ? p.grad_shard : p.grad) + own.grad_at,
                    p.state >= 0 && !Engine::offloaded ? t.device_.template at<std::byte>(p.state) : nullptr, own.count};
  }
  void collect_params() {
    auto& t = self();
    for (const ParamSlot& p : Engine::sched.params)
      if (p.trainable) {
        trainable_.push_back(ref(p));
        if (p.stage_shared && !Engine::config.first_stage()) continue;  // counted by the first stage
        const S* g = Engine::offloaded ? t.offloaded_gradient(p) : nullptr;
        counted_.add(ref(p), g);
        (p.split.split() ? counted_split_ : counted_whole_).add(ref(p), g);
      }
    if (Engine::config.update_in_backward)
      for (std::size_t i = 0; i < Engine::sched.params.size(); ++i) {
        const ParamSlot& p = Engine::sched.params[static_cast<std::size_t>(Engine::sched.updates[i])];
        in_backward_.push_back(p.trainable && p.grad >= 0 ? ref(p) : ParamRef{});
      }
  }

  // The global gradient norm and the clip scale into the control block
  // (squared_norm); with ZeRO 1-3 each rank sums the squares of the shards
  // it updates and the ranks add their sums (one f32 all-reduce, in the
  // last partial-sum slot) before the norm is taken. With OffloadOptimizer
  // the squares' partial sums come from the CPU (sum_of_squares), whose
  // gradients were summed before they left the device.
  void gradient_norm() {
    auto& t = self();
    if constexpr (!Engine::offloaded) sum_partial_gradients();
    const float clip = static_cast<float>(t.opt_.clip_norm);
    if constexpr (Engine::config.tp > 1) {
      // the whole parameters' squares into the last slot, the split ones' (summed over
      // the tensor-parallel group) into the one before; the data-parallel ranks add both (ZeRO 1-3)
      float* total = t.reductions() + (reduction_slots - 2);
      sum_of_squares(counted_whole_, total + 1);
      sum_of_squares(counted_split_, total);
      t.groups_.tensor->all_reduce_sum(total, 1, DType::F32, t.compute_);
      if constexpr (Engine::config.sharded(1))
        t.on_communication_stream([&](cudaStream_t s) { t.groups_.data->all_reduce_sum(total, 2, DType::F32, s); });
      if constexpr (Engine::config.pp > 1) t.groups_.pipe->all_reduce_sum(total, 2, DType::F32, t.compute_);  // each stage its parameters
      clip_scale(total, 2, t.control(), clip, t.compute_);
    } else if constexpr (!Engine::config.sharded(1) && Engine::config.pp == 1) {
      if constexpr (Engine::offloaded) {
        const int blocks = t.offloaded_partial_squares(counted_);
        clip_scale(t.reductions(), blocks, t.control(), clip, t.compute_);
      } else {
        squared_norm<S>(counted_.on_device, t.reductions(), t.control(), clip, t.compute_);
      }
    } else {
      float* total = t.reductions() + (reduction_slots - 1);
      sum_of_squares(counted_, total);
      if constexpr (Engine::config.sharded(1))
        t.on_communication_stream([&](cudaStream_t s) { t.groups_.data->all_reduce_sum(total, 1, DType::F32, s); });
      if constexpr (Engine::config.pp > 1) t.groups_.pipe->all_reduce_sum(total, 1, DType::F32, t.compute_);  // each stage its parameters
      clip_scale(total, 1, t.control(), clip, t.compute_);
    }
  }

  // Gradients whose parts several processes hold, summed on each before
  // the norm: with a tied LM head over pipeline stages, the table's of the
  // first and the last stage (trainers::tied_stages); with tensor
  // parallelism, a LoRA matrix's partial sums (ParamSlot::tensor_partial).
  void sum_partial_gradients() {
    auto& t = self();
    for (const ParamSlot& p : Engine::sched.params) {
      if (!p.trainable || !(p.stage_shared || p.tensor_partial)) continue;
      const auto [g, n] = trainers::held_gradient<S>(Engine::config, t.device_, p);
      if constexpr (Engine::tied_stages)
        if (p.stage_shared) t.groups_.shared->all_reduce_sum(g, n, Engine::config.dtype, t.compute_);
      if constexpr (Engine::config.tp > 1)
        if (p.tensor_partial) t.groups_.tensor->all_reduce_sum(g, n, Engine::config.dtype, t.compute_);
    }
  }

  // The sum of the squares of params' gradients into *out (the partials use
  // the reductions buffer's first slots; out may be one of them).
  void sum_of_squares(const Counted& params, float* out) {
    auto& t = self();
    std::int64_t elements = 0;
    for (const ParamRef& p : params.on_device) elements += p.n;
    if (elements == 0) check(cudaMemsetAsync(out, 0, sizeof(float), t.compute_), "zero a sum of squares");
    else if constexpr (Engine::offloaded) sum_rows(t.reductions(), t.offloaded_partial_squares(params), out, t.compute_);
    else sum_rows(t.reductions(), squared_norm_partials<S>(params.on_device, t.reductions(), t.compute_), out, t.compute_);
  }

  // ---- a non-finite gradient (the failure path: after the step, never in it) -------------------------------
  // Names the first parameter (schedule order) whose gradient holds a NaN or
  // an infinity and throws non_finite_gradient. With UpdateInBackward the
  // step's check_gradients left one flag per update position; otherwise
  // every gradient is still in the arena and is checked now. A global norm
  // that overflowed f32 with every element finite names the parameter whose
  // own norm overflows (or else is the largest).
  [[noreturn]] void throw_non_finite_gradient(int step_no, const UpdateControl& r) {
    auto& t = self();
    if constexpr (Engine::config.update_in_backward) {
      const int positions = static_cast<int>(Engine::sched.params.size());
      const std::vector<float> flags = t.template download<float>(t.reductions(), positions);
      int first = -1;
      for (int i = 0; i < positions; ++i)
        if (flags[static_cast<std::size_t>(i)] != 0.0f && (first < 0 || Engine::sched.updates[i] < first)) first = Engine::sched.updates[i];
      if (first < 0) throw std::logic_error("cuda::Trainer: an update was stopped but no gradient was flagged non-finite");
      throw non_finite_gradient(step_no, t.path_of(Engine::sched.params[static_cast<std::size_t>(first)]),
                                "it holds NaN or infinite values. With UpdateInBackward, the " + std::to_string(r.first_bad) +
                                    " parameters updated before the first non-finite gradient in this step's backward keep their "
                                    "(finite) update, no later update ran, and the step count stays " + std::to_string(step_no - 1));
    } else {
      const std::string norm = "the global gradient norm is " + std::to_string(r.norm);
      // per trainable parameter (trainable_ order = schedule order), flags in windows of the reductions buffer
      std::vector<int> order;  // trainable_[i] is sched.params[order[i]]
      for (std::size_t k = 0; k < Engine::sched.params.size(); ++k)
        if (Engine::sched.params[k].trainable) order.push_back(static_cast<int>(k));
      for (std::size_t w = 0; w < trainable_.size(); w += reduction_slots) {
        const std::size_t count = std::min<std::size_t>(reduction_slots, trainable_.size() - w);
        check(cudaMemsetAsync(t.reductions(), 0, count * sizeof(float), t.compute_), "clear gradient flags");
        check_gradients<S>(std::span<const ParamRef>(trainable_.data() + w, count), t.control(), t.reductions(), t.compute_);
        const std::vector<float> flags = t.template download<float>(t.reductions(), static_cast<std::int64_t>(count));
        for (std::size_t i = 0; i < count; ++i)
          if (flags[i] != 0.0f)
            throw non_finite_gradient(step_no, t.path_of(Engine::sched.params[static_cast<std::size_t>(order[w + i])]),
                                      "it holds NaN or infinite values (" + norm + "); " + trainers::nothing_updated(step_no));
      }
      // every element finite: the sum of squares overflowed f32
      int largest = -1;
      float largest_norm = -1.0f;
      for (std::size_t i = 0; i < trainable_.size(); ++i) {
        squared_norm<S>(std::span<const ParamRef>(&trainable_[i], 1), t.reductions(), t.control(), 0.0f, t.compute_);
        const float own = t.template download<UpdateControl>(t.control(), 1)[0].norm;
        const std::string path = t.path_of(Engine::sched.params[static_cast<std::size_t>(order[i])]);
        if (!(own - own == 0.0f))
          throw non_finite_gradient(step_no, path,
                                    "every gradient element is finite, but the sum of squares of this one overflows f32 (" +
                                        norm + "); " + trainers::nothing_updated(step_no));
        if (own > largest_norm) largest_norm = own, largest = static_cast<int>(i);
      }
      const ParamSlot& named = Engine::sched.params[static_cast<std::size_t>(order[static_cast<std::size_t>(largest)])];
      throw non_finite_gradient(step_no, t.path_of(named),
                                "every gradient element is finite, but the global gradient norm overflows f32 (" + norm +
                                    "); this parameter's gradient norm, " + std::to_string(largest_norm) +
                                    ", is the largest; " + trainers::nothing_updated(step_no));
    }
  }
};

}  // namespace headroom::cuda::detail
