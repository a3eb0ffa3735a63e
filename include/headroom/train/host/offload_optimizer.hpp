#pragma once
// host::detail::OffloadOptimizer<Trainer, T>: OffloadOptimizer (ZeRO-Offload)
// on the host engine, a base of host::Trainer (train/host/trainer.hpp). It
// owns the update thread, the updates in flight, the bytes copied between
// the tiers and a step's timeline, and reaches the trainer's arenas,
// schedule and update through self() (CRTP; T is the trainer's storage
// type, which the trainer cannot give while it is incomplete).
//
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
// the file, a range of update_chunk elements at a time.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <utility>

#include "../../core/optim_state.hpp"
#include "../../host/kernels/optimizer.hpp"
#include "../../host/lane_worker.hpp"
#include "../../host/parallel.hpp"
#include "../../plan/schedule.hpp"
#include "../offload_update.hpp"
#include "../ownership.hpp"

namespace headroom::host::detail {

template <class Trainer, class T>
class OffloadOptimizer {
  using C = compute_t<T>;

 public:
  // Bytes copied between the tiers in the last step (gradients to the
  // offload tier, and with Accumulate<K> their sums back; with
  // OffloadParameters the parameters fetched to the device too).
  struct TierTraffic {
    std::int64_t to_offload = 0, to_device = 0;
  };
  TierTraffic tier_traffic() const { return traffic_; }
  // A parameter is updated in ranges of so many elements, each read from
  // the offload tier's file into the plan's staging buffer
  // (sched.update_staging) and written back: no page of the tier is mapped
  // into the process by a step.
  static constexpr std::int64_t update_chunk = RunConfig::update_chunk;  // a multiple of AdamW8bit's block
  // the elements of a range the staging buffer holds, as the plan sized it
  // (graph::Graph::update_range): update_chunk, or the most this process
  // updates of one parameter when none has so many
  static constexpr std::int64_t staged_range = Trainer::sched.update_range;
  static constexpr std::int64_t staging_slot = Trainer::config.update_staging_slot_bytes(staged_range);
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

 protected:
  OffloadOptimizer() {
    static_assert(!Trainer::config.offload_optimizer || staged_range > 0,
                  "host::Trainer: the plan gives the offloaded update no range (Schedule::update_range is 0)");
    static_assert(!Trainer::config.offload_optimizer || Trainer::sched.update_staging.bytes >= Trainer::config.workers * staging_slot,
                  "host::Trainer: the plan's update staging buffer holds one range per worker");
  }

  // The start of a step: the squares of its updates, its traffic and its timeline from zero.
  void start_step() {
    if constexpr (Trainer::config.offload_optimizer) inflight_.begin_step();
    traffic_ = TierTraffic{};
    traced_ = 0;
    step_began_ = std::chrono::steady_clock::now();
  }
  // On every way out of a step: no update thread runs past it.
  void settle_updates() noexcept {
    if (updater_) updater_->settle();
  }

  trainers::UpdatesInFlight inflight_{Trainer::param_count};  // the updates during the backward and their squares
  TierTraffic traffic_{};

  // Seconds since the step began when a step is traced (0 otherwise: the clock is not read).
  double trace_clock() const { return trace_.empty() ? 0 : since_step_began(); }
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
      const ParamSlot& p = Trainer::sched.params[st.param[q]];
      const auto [device, n] = trainers::held_gradient<T>(Trainer::config, self().device_, p);
      const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
      if (self().micro_ == 0) {
        std::memset(device, 0, bytes);
      } else {
        self().offload_.read(p.host_grad, device, static_cast<std::int64_t>(bytes));
        traffic_.to_device += static_cast<std::int64_t>(bytes);
      }
    }
  }

  // After step st: the gradients it completed go to the offload tier (a
  // lane op that writes one has finished first).
  void offload_completed(const Step& st, int step_no) {
    if (st.update_end == st.update_begin) return;
    self().join_all();
    stream_gradients(st, step_no);
  }

  // After the micro-batches: the updates ran during the backward, or
  // update() runs them now (reading the offload tier's gradients, with the
  // squares the update thread summed where no other process adds to them).
  double offloaded_update(int step_no) {
    updater_->wait_all();
    if (!updates_in_flight()) return self().update(step_no);
    return inflight_.norm(Trainer::plan, Trainer::sched, step_no);
  }

  // The update from the offload tier after the backward: every trainable
  // parameter's ranges (staged_range elements) dealt round-robin to a team
  // of the workers, each updating its ranges in its own slot of the staging
  // buffer (one fork for the whole update, not one per range: a range's
  // work is too short to share).
  void update_offloaded_all(int step_no, C grad_scale) {
    const double began = trace_clock();
    std::exception_ptr failed[Trainer::config.workers] = {};
    team(self().workers_, [&](int w, int team_size) {
      try {
        std::int64_t i = 0;  // the range's index over all parameters
        for (const ParamSlot& p : Trainer::sched.params) {
          if (!p.trainable) continue;
          for (std::int64_t from = 0; from < self().owned(p).count; from += staged_range, ++i)
            if (i % team_size == w) update_offloaded_range(p, from, w, step_no, grad_scale);
        }
      } catch (...) {
        failed[w] = std::current_exception();
      }
    });
    for (const std::exception_ptr& f : failed)
      if (f) std::rethrow_exception(f);
    record(Span::update_after, -1, began);
  }

 private:
  Trainer& self() { return static_cast<Trainer&>(*this); }
  const Trainer& self() const { return static_cast<const Trainer&>(*this); }

  struct UpdateTask {
    OffloadOptimizer* offload = nullptr;
    int param = -1;
    int step_no = 0;
  };
  static void run_update_task(const UpdateTask& u) { u.offload->gradient_offloaded(u.param, u.step_no); }
  std::unique_ptr<LaneWorker<UpdateTask>> updater_ =
      Trainer::config.offload_optimizer ? std::make_unique<LaneWorker<UpdateTask>>() : nullptr;
  std::span<Span> trace_{};
  std::atomic<std::size_t> traced_{0};
  std::chrono::steady_clock::time_point step_began_{};
  double since_step_began() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - step_began_).count(); }

  void stream_gradients(const Step& st, int step_no) {
    for (int u = st.update_begin; u < st.update_end; ++u) {
      const int k = Trainer::sched.updates[u];
      const ParamSlot& p = Trainer::sched.params[k];
      const auto [from, n] = trainers::held_gradient<T>(Trainer::config, self().device_, p);  // what goes to the tier
      self().offload_.write(p.host_grad, from, n * static_cast<std::int64_t>(sizeof(T)));  // the sum so far (Step::grad_load)
      traffic_.to_offload += n * static_cast<std::int64_t>(sizeof(T));
      if (self().updating_ && self().micro_ == Trainer::config.accumulate - 1)
        updater_->submit(&run_update_task, UpdateTask{this, k, step_no});
    }
  }

  // On the update thread: parameter k's gradient is in the offload tier.
  void gradient_offloaded(int k, int step_no) {
    const double began = trace_clock();
    struct Record {
      OffloadOptimizer& o;
      int k;
      double began;
      ~Record() { o.record(Span::update_in_flight, k, began); }
    } rec{*this, k, began};
    const ParamSlot& p = Trainer::sched.params[k];
    inflight_.offloaded(
        k, offloaded_squares(p), updates_in_flight(),
        [&] {
          for (std::int64_t from = 0; from < self().owned(p).count; from += staged_range)
            update_offloaded_range(p, from, 0, step_no, C(1));
        },
        [&](int j) { return self().bad_element(j); });
  }
  // squared_norm of p's offloaded gradient, read range by range into the
  // staging buffer (the same sum: the ranges are multiples of 8 elements).
  double offloaded_squares(const ParamSlot& p) const {
    const std::int64_t n = self().owned(p).count, e = sizeof(T);
    T* g = self().device_.template at<T>(Trainer::sched.update_staging.offset);  // the first worker's slot
    double lane[8] = {};
    for (std::int64_t from = 0; from < n; from += staged_range) {
      const std::int64_t len = std::min(staged_range, n - from);
      self().offload_.read(p.host_grad + (self().owned(p).grad_at + from) * e, g, len * e);
      squared_norm_add(g, len, lane);
    }
    return squared_norm_total(lane);
  }

  // Whether each update runs as soon as its gradient is offloaded (train/offload_update.hpp).
  bool updates_in_flight() const {
    return trainers::UpdatesInFlight::possible(self().opt_, self().groups_.world == nullptr, self().scaler_.enabled());
  }

  // Elements [from, from + staged_range) of what this process updates of p
  // (fewer at its end), updated from the offload tier in staging slot
  // `slot`: the range's gradient, optimizer state (and with
  // OffloadParameters values) read from the file into the slot, updated
  // there (the device's weights in place otherwise), and written back.
  void update_offloaded_range(const ParamSlot& p, std::int64_t from, int slot, int step_no, C grad_scale) {
    Trainer& t = self();
    const trainers::Owned own = t.owned(p);
    const std::int64_t len = std::min(staged_range, own.count - from), e = sizeof(T);
    std::byte* stage = t.device_.template at<std::byte>(Trainer::sched.update_staging.offset + slot * staging_slot);
    T* g = reinterpret_cast<T*>(stage);
    T* staged_w = g + staged_range;  // OffloadParameters: the range's values
    std::byte* state = stage + align_up((Trainer::config.offload_params ? 2 : 1) * staged_range * e, 256);
    t.offload_.read(p.host_grad + (own.grad_at + from) * e, g, len * e);
    T* w = t.weight_storage(p) + own.weight_at + from;
    if constexpr (Trainer::config.offload_params) {
      t.offload_.read(p.weight + (own.weight_at + from) * e, staged_w, len * e);
      w = staged_w;
    }
    // the range's state: the file's pieces of it, one after another in the slot
    const auto pieces = state_pieces(p, from, len);
    std::int64_t at = 0;
    for (const auto& [offset, bytes] : pieces) {
      if (bytes > 0) t.offload_.read(p.state + offset, state + at, bytes);
      at += bytes;
    }
    t.apply_update(w, nullptr, g, Trainer::state_at(p.state >= 0 ? state : nullptr, len, 0), len, step_no, grad_scale, 1);
    at = 0;
    for (const auto& [offset, bytes] : pieces) {
      if (bytes > 0) t.offload_.write(p.state + offset, state + at, bytes);
      at += bytes;
    }
    if constexpr (Trainer::config.offload_params) t.offload_.write(p.weight + (own.weight_at + from) * e, staged_w, len * e);
  }
  // Where the state of elements [from, from + len) of p lies in its state
  // buffer (the optimizer's sections, core/optim_state.hpp): (offset, bytes)
  // pieces, laid out one after another they are the state of a len-element
  // parameter. (As update_range lays it out: over the elements this process updates.)
  std::array<std::pair<std::int64_t, std::int64_t>, max_state_sections> state_pieces(const ParamSlot& p, std::int64_t from,
                                                                                     std::int64_t len) const {
    constexpr OptimDesc d = Trainer::run::optimizer::desc;
    std::array<std::pair<std::int64_t, std::int64_t>, max_state_sections> pieces{};
    if (p.state < 0) return pieces;
    const std::int64_t count = self().owned(p).count;
    for (int k = 0; k < d.sections; ++k)
      pieces[static_cast<std::size_t>(k)] = {d.offset(k, count) + from / d.section[k].per * d.section[k].bytes, d.section[k].size(len)};
    return pieces;
  }
};

}  // namespace headroom::host::detail
