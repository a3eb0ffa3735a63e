#pragma once
// How a parameter's values start, as the layer that declares it says
// (graph::Builder::param(name, rows, cols, init)). Both engines draw them
// the same way (trainers::InitialValues), from the run's seed and the
// parameter's path, so a run starts from the same weights on either engine.
//
//   ParamInit{}                  by name: the GPT-2 / Llama defaults, N(0, 0.02),
//                                0 for `bias` and LoRA's `lora_B`, 1 for the
//                                gains of RMSNorm and LayerNorm, Kaiming-uniform
//                                U(-1/sqrt(in), 1/sqrt(in)) for LoRA's `lora_A`
//   ParamInit::constant(v)       every element v (a LayerScale's 0.1, a gain's 1)
//   ParamInit::normal(std)       N(0, std^2)
//   ParamInit::uniform(bound)    U(-bound, bound)
#include <cstdint>

namespace headroom {

struct ParamInit {
  enum class Kind : std::uint8_t { by_name, constant, normal, uniform };
  Kind kind = Kind::by_name;
  double value = 0;  // the constant; the standard deviation; the bound

  static constexpr ParamInit constant(double v) { return {Kind::constant, v}; }
  static constexpr ParamInit normal(double std) { return {Kind::normal, std}; }
  static constexpr ParamInit uniform(double bound) { return {Kind::uniform, bound}; }
  constexpr bool operator==(const ParamInit&) const = default;
};

}  // namespace headroom
