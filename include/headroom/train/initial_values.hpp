#pragma once
// The initial weights both engines' trainers start from (host::Trainer and
// cuda::Trainer hold the same values after construction): counter-based
// random numbers keyed by the seed and the parameter's path.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "../core/param_init.hpp"
#include "common.hpp"

namespace headroom::trainers {

// Counter-based random numbers: the value of element i of a parameter never
// depends on threads or order (splitmix64).
constexpr std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline double uniform01(std::uint64_t key, std::uint64_t i) {
  return (static_cast<double>(mix(key ^ mix(i)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
inline double normal(std::uint64_t key, std::uint64_t i) {
  const double u1 = uniform01(key, 2 * i), u2 = uniform01(key, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Initial values, keyed by the parameter's path (the same layer gets the
// same values whatever policies wrap it: LoRA with B = 0 reproduces its base
// bit for bit). As its layer declared them (ParamInit, core/param_init.hpp),
// or by its name, GPT-2 / Llama style: N(0, 0.02) matrices and embeddings,
// norms 1, biases 0; LoRA A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's
// Kaiming-uniform), B = 0.
class InitialValues {
 public:
  InitialValues(std::uint64_t seed, std::string_view path, std::string_view layer_kind, std::string_view name, std::int64_t cols,
                ParamInit init = {})
      : key_(mix(seed)), sqrt_cols_(std::sqrt(double(cols))) {
    if (init.kind != ParamInit::Kind::by_name) init_ = init;
    else if (name == "bias" || name == "lora_B") init_ = ParamInit::constant(0.0);
    else if (layer_kind == "RMSNorm" || layer_kind == "LayerNorm") init_ = ParamInit::constant(1.0);
    else if (name == "lora_A") lora_a_ = true;
    else init_ = ParamInit::normal(0.02);
    for (const char c : path) key_ = mix(key_ ^ static_cast<unsigned char>(c));
  }
  double operator()(std::int64_t i) const {
    const auto u = static_cast<std::uint64_t>(i);
    if (lora_a_) return (2.0 * uniform01(key_, u) - 1.0) / sqrt_cols_;  // divided by sqrt(in), as PEFT's bound is
    switch (init_.kind) {
      case ParamInit::Kind::constant: return init_.value;
      case ParamInit::Kind::uniform: return (2.0 * uniform01(key_, u) - 1.0) * init_.value;
      case ParamInit::Kind::normal: return init_.value * normal(key_, u);
      case ParamInit::Kind::by_name: break;  // resolved by the constructor
    }
    return 0.0;
  }

 private:
  std::uint64_t key_;
  ParamInit init_{};     // what the layer said, or what the name picks
  bool lora_a_ = false;  // LoRA's A by name: Kaiming-uniform over in features
  double sqrt_cols_;
};

// The initial values of parameter p as tensor-parallel rank `tensor_rank`
// holds it: element i of its block is element p.split.whole_index(i) of the
// whole parameter (all of it, in order, for a parameter that is not split).
// Both engines' trainers start from these.
template <class Plan, class Param>
auto initial_values(std::uint64_t seed, const Plan& plan, const Param& p, int tensor_rank) {
  return [whole = InitialValues(seed, path_of(plan, p), plan.nodes[p.node].kind, p.name, p.split.whole_cols(p.cols), p.init), &p,
          tensor_rank](std::int64_t i) { return whole(p.split.whole_index(p.rows, p.cols, tensor_rank, i)); };
}

}  // namespace headroom::trainers
