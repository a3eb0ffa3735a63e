#pragma once
// Gradient checks on a host::Trainer: LoRA's B given values (B = 0 makes A's
// gradient zero), every trainable parameter's gradient as one vector, and
// central differences of a loss against the gradients the trainer holds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <headroom/plan/schedule.hpp>
#include <vector>

namespace headroom::test {

// Small deterministic values for every lora_B (f32 / f64 runs: written as is).
template <class Trainer>
void perturb_lora_b(Trainer& t) {
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    if (p.name != "lora_B") continue;
    auto* w = t.weight(p);
    for (std::int64_t i = 0; i < p.elements(); ++i) w[i] = 0.05 * std::sin(0.7 * static_cast<double>(i) + k);
  }
}

template <class Trainer>
std::vector<double> all_grads(Trainer& t) {
  std::vector<double> g;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    if (p.trainable) g.insert(g.end(), t.grad(p), t.grad(p) + p.elements());
  }
  return g;
}

// The gradients t holds now (of loss()) against central differences of
// loss() on `per_param` elements spread over every trainable parameter
// (a double run). loss() may overwrite the gradients: they are copied first.
// Returns the number of elements checked.
template <class Trainer, class Loss>
int central_differences(Trainer& t, int per_param, Loss&& loss) {
  struct Grad {
    const ParamSlot* p;
    std::vector<double> g;
  };
  std::vector<Grad> grads;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) {
    const ParamSlot& p = Trainer::param(k);
    if (p.trainable) grads.push_back({&p, std::vector<double>(t.grad(p), t.grad(p) + p.elements())});
  }
  const double eps = 1e-5;
  int checked = 0;
  for (const Grad& gr : grads) {
    const ParamSlot& p = *gr.p;
    double* w = t.weight(p);
    for (int s = 0; s < per_param; ++s) {
      const std::int64_t i = (p.elements() - 1) * s / (per_param > 1 ? per_param - 1 : 1);
      const double keep = w[i];
      w[i] = keep + eps;
      const double lp = loss();
      w[i] = keep - eps;
      const double lm = loss();
      w[i] = keep;
      const double fd = (lp - lm) / (2 * eps);
      INFO(Trainer::path_of(p) << "[" << i << "]: analytic " << gr.g[i] << ", finite difference " << fd);
      CHECK(std::abs(fd - gr.g[i]) <= 1e-7 + 1e-5 * std::max(std::abs(fd), std::abs(gr.g[i])));
      ++checked;
    }
  }
  return checked;
}

}  // namespace headroom::test
