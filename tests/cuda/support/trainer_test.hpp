#pragma once
// What the emulated cuda::Trainer tests share.
#include <headroom/train/common.hpp>

namespace headroom::cuda_test {

// The options both engines train with where a cuda::Trainer run is compared
// with host::Trainer's: lr 3e-3, gradients clipped at norm 1, seed 99.
inline TrainOptions trainer_options() {
  TrainOptions o;
  o.lr = 3e-3;
  o.clip_norm = 1.0;
  o.seed = 99;
  return o;
}

}  // namespace headroom::cuda_test
