#pragma once
// Dynamic loss scaling, as PyTorch's GradScaler does it (both engines).
//
// fp16 keeps 5 exponent bits: gradients below 2^-24 round to zero. A
// scaled run multiplies the loss's gradient by the scale S before the
// backward, so every gradient is S times larger where fp16 resolves it, and
// divides by S again before the norm, the clipping and the update (the
// engines fold 1 / S into the update's gradient factor: no extra pass). When
// a scaled gradient holds a NaN or an infinity, or the squares of the scaled
// gradients sum beyond f32's range, the step is skipped: the weights, the
// optimizer state and the step count stay as they were, the scale is
// multiplied by backoff_factor and the skip is counted. After
// growth_interval steps in a row without one, the scale is multiplied by
// growth_factor (unless that leaves f32's range).
//
//   host::Trainer<Run> t({.lr = 1e-4, .loss_scaling = {.mode = LossScaling::dynamic}});
//   StepStats s = t.step(tokens, targets);   // s.loss_scale: the scale the step used; s.skipped
//
// The default mode, automatic, scales Precision<F16> runs (as transformers'
// fp16=True does) and leaves the others unscaled. With S a power of two
// (the defaults keep it one) a step that does not overflow computes the
// same gradients, norm and update as an unscaled run, to the bit: scaling by
// a power of two commutes with every rounding short of overflow.
//
// The state (the scale, the steps since the last skip or growth, the skips)
// is the trainer's (loss_scale_state()), saved in checkpoints. What differs
// from GradScaler: a non-finite loss still stops the step with
// non_finite_loss (no scale repairs a forward that overflowed), and squares
// beyond f32 (a scaled norm above 2^64) count as an overflow: the norm is
// taken of the scaled gradients, in f32 on the CUDA engine, and the bound
// keeps the update's factor, clip scale / S, a normal f32 on both. In fp16
// an element overflows (above 65504) long before its square does, so the
// steps skipped are GradScaler's.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../core/dtype.hpp"

namespace headroom {

// TrainOptions::loss_scaling: GradScaler's parameters, with its defaults.
struct LossScaling {
  enum Mode : std::uint8_t {
    automatic,  // dynamic for Precision<F16>, off otherwise
    dynamic,    // scale, skip and adjust as below, whatever the precision
    off,        // S = 1, no skip: a non-finite gradient stops the step (non_finite_gradient)
  };
  Mode mode = automatic;
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
};

// What a checkpoint keeps of the scaler (GradScaler's state_dict, plus the
// skips it counted).
struct LossScaleState {
  float scale = 1.0f;              // the scale of the next step
  std::int32_t growth_tracker = 0; // steps in a row without a skip, since the last growth
  std::int64_t skipped = 0;        // steps skipped over the run
  bool operator==(const LossScaleState&) const = default;
};

// The scaler of one trainer: the scale of the next step, and its update once
// the step has shown whether its gradients were finite.
class LossScaler {
 public:
  LossScaler(const LossScaling& o, DType precision) : o_(o) {
    enabled_ = o.mode == LossScaling::dynamic || (o.mode == LossScaling::automatic && precision == DType::F16);
    if (!enabled_) return;
    const float init = static_cast<float>(o.init_scale);
    if (!(o.init_scale > 0) || !std::isfinite(init))
      throw std::invalid_argument("LossScaling: init_scale must be positive and within f32's range (it is " +
                                  std::to_string(o.init_scale) + ")");
    if (!(o.growth_factor > 1) || !std::isfinite(o.growth_factor))
      throw std::invalid_argument("LossScaling: growth_factor must be above 1 (it is " + std::to_string(o.growth_factor) + ")");
    if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
      throw std::invalid_argument("LossScaling: backoff_factor must be in (0, 1) (it is " + std::to_string(o.backoff_factor) + ")");
    if (o.growth_interval < 1)
      throw std::invalid_argument("LossScaling: growth_interval must be at least 1 step (it is " + std::to_string(o.growth_interval) +
                                  ")");
    state_.scale = init;
  }

  bool enabled() const { return enabled_; }
  // The scale of the next step (1 when off) and its inverse (exact for a power of two).
  float scale() const { return state_.scale; }
  float inverse() const { return 1.0f / state_.scale; }
  const LossScaleState& state() const { return state_; }

  // A checkpoint's state; refused where it could not have come from a scaler.
  void set_state(const LossScaleState& s) {
    if (!enabled_) throw std::invalid_argument("LossScaler::set_state: this run does not scale its loss");
    if (!(s.scale > 0.0f) || !std::isfinite(s.scale) || s.growth_tracker < 0 || s.skipped < 0)
      throw std::invalid_argument("LossScaler::set_state: scale " + std::to_string(s.scale) + ", growth_tracker " +
                                  std::to_string(s.growth_tracker) + ", skipped " + std::to_string(s.skipped) +
                                  " is not a scaler's state (the scale must be positive and finite, the counts not negative)");
    state_ = s;
  }

  // After a step: found_inf (a scaled gradient held a NaN or an infinity, so
  // the step was skipped) backs the scale off; growth_interval clean steps
  // in a row grow it. As GradScaler's _amp_update_scale_ kernel: the product
  // in double, stored in f32.
  void update(bool found_inf) {
    if (!enabled_) return;
    if (found_inf) {
      state_.scale = static_cast<float>(static_cast<double>(state_.scale) * o_.backoff_factor);
      state_.growth_tracker = 0;
      ++state_.skipped;
      return;
    }
    const std::int32_t successful = state_.growth_tracker + 1;
    if (successful == o_.growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(state_.scale) * o_.growth_factor);
      if (std::isfinite(grown)) state_.scale = grown;
      state_.growth_tracker = 0;
    } else {
      state_.growth_tracker = successful;
    }
  }

 private:
  LossScaling o_;
  bool enabled_ = false;
  LossScaleState state_{};
};

namespace trainers {
// Why a run with UpdateInBackward cannot scale its loss (both engines).
inline std::string loss_scaling_in_backward(const std::string& engine) {
  return engine + ": loss scaling skips a step whose scaled gradients overflow, which needs every gradient checked before "
                  "any update, but UpdateInBackward updates each parameter inside the backward; drop UpdateInBackward or set "
                  "loss_scaling.mode = LossScaling::off";
}
}  // namespace trainers

}  // namespace headroom
