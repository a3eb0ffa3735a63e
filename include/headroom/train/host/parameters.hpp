#pragma once
// host::detail::Parameters<Trainer, T>: where host::Trainer's parameters,
// gradients, optimizer state and master weights live in its arenas, how
// they are set (initial values at construction, loaders' dense and
// quantized values) and the optimizer's reset. A base of host::Trainer
// (train/host/trainer.hpp) that reaches the trainer's arenas and schedule
// through self() (CRTP; T is the trainer's storage type, which the trainer
// cannot give while it is incomplete).
//
// With ZeRO<3>, weight(p) and quant(p) hold this rank's shard alone (dense:
// `count` values; quantized: its byte shards of the codes and scales),
// state(p) with ZeRO 1-3 the state of the `count` elements it updates.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../host/arena.hpp"
#include "../../host/parallel.hpp"
#include "../../host/quant.hpp"
#include "../../host/storage.hpp"
#include "../../plan/schedule.hpp"
#include "../initial_values.hpp"
#include "../ownership.hpp"

namespace headroom::host::detail {

template <class Trainer, class T>
class Parameters {
  using C = compute_t<T>;

 public:
  // Where the parameters are stored: the offload tier with OffloadParameters
  // (each event that reads them reads its fetched device copy), else the device tier.
  static constexpr Tier params_tier = Trainer::config.offload_params ? Tier::offload : Tier::device;
  const Arena& params_arena() const { return self().arena(params_tier); }
  // A dense parameter's values (row-major rows x cols), or null for a quantized one.
  T* weight(const ParamSlot& p) const {
    return p.quant.kind == QuantKind::none ? params_arena().template at<T>(p.weight) : nullptr;
  }
  // The gradient as the update reads it: with OffloadOptimizer its copy in
  // the offload tier (the device's lives only until that copy).
  T* grad(const ParamSlot& p) const {
    if (p.host_grad >= 0) return self().offload_.template at<T>(p.host_grad);
    return p.grad >= 0 ? self().device_.template at<T>(p.grad) : nullptr;
  }
  // Where the optimizer state and master weights live: the offload tier
  // with OffloadOptimizer, else the device tier.
  static constexpr Tier states_tier = Trainer::config.offload_optimizer ? Tier::offload : Tier::device;
  const Arena& states_arena() const { return self().arena(states_tier); }
  std::byte* state(const ParamSlot& p) const { return p.state >= 0 ? states_arena().template at<std::byte>(p.state) : nullptr; }
  // A bf16 run's trainable parameter: its f32 master weights (what the
  // update reads and writes; weight() holds them rounded). Null otherwise.
  float* master(const ParamSlot& p) const { return p.master >= 0 ? states_arena().template at<float>(p.master) : nullptr; }
  // The model's shared code tables (NF4 values, the dynamic map), or null.
  float* quant_table() const {
    return Trainer::sched.quant_table >= 0 ? self().device_.template at<float>(Trainer::sched.quant_table) : nullptr;
  }
  QuantView quant(const ParamSlot& p) const {
    return QuantView{p.quant, params_arena().template at<std::uint8_t>(p.weight), params_arena().template at<std::uint8_t>(p.scales),
                     quant_table(), p.rows, p.cols};
  }
  // Sets a dense parameter's values (rows x cols, as weight() lays them
  // out): stored in T (a bf16 run: rounded), and its f32 master weights
  // exactly where it has them. What loaders write a bf16 run through.
  void set_dense(const ParamSlot& p, std::span<const float> x) {
    if (p.quant.kind != QuantKind::none || static_cast<std::int64_t>(x.size()) != p.elements())
      throw std::invalid_argument("host::Trainer::set_dense: " + Trainer::path_of(p) + " is quantized or holds " +
                                  std::to_string(p.elements()) + " values, not " + std::to_string(x.size()));
    T* w = weight(p);
    float* m = master(p);
    for (std::size_t i = 0; i < x.size(); ++i) {
      w[i] = narrow<T>(static_cast<C>(x[i]));
      if (m != nullptr) m[i] = x[i];
    }
  }
  // Quantizes dense values into a quantized parameter: x (rows, cols) f32.
  void set_quantized(const ParamSlot& p, std::span<const float> x) { quantize_matrix(quant(p), x.data(), self().workers_); }
  // Zeroes every optimizer state and restarts the step count (after loading weights).
  void reset_optimizer() {
    for (const ParamSlot& p : Trainer::sched.params)
      if (p.state >= 0) {  // ZeRO 1-3: the state of this rank's shard
        const std::int64_t bytes = Trainer::config.optim.state_bytes(Trainer::config.sharded(1) ? p.shard : p.elements());
        std::memset(state(p), 0, static_cast<std::size_t>(bytes));
        if constexpr (Trainer::config.offload_optimizer) self().offload_.release(p.state, bytes);  // the file keeps it, not RAM
      }
    self().step_ = 0;
  }

 protected:
  // A dense parameter's stored values, in the tier that stores them.
  T* weight_storage(const ParamSlot& p) const { return params_arena().template at<T>(p.weight); }

  // At construction, once the arenas are allocated: the shared tables, every
  // parameter's initial value, and with OffloadParameters the pages of the
  // values written to the file released (they need not stay in RAM).
  void set_up_parameters(std::uint64_t seed) {
    fill_tables();
    initialize(seed);
    if constexpr (Trainer::config.offload_params)
      for (const ParamSlot& p : Trainer::sched.params) {
        const std::int64_t n = p.elements();
        if (p.quant.kind == QuantKind::none) {
          constexpr RunConfig c = Trainer::config;
          const std::int64_t stored = c.sharded(3) ? p.shard : p.trainable && c.sharded(1) ? p.shard * c.dp : n;
          self().offload_.release(p.weight, stored * static_cast<std::int64_t>(sizeof(T)));
        } else {  // ZeRO 3: this rank's shards of the codes and of the scales
          auto stored = [](std::int64_t b) { return Trainer::config.sharded(3) ? Trainer::config.shard_bytes(b) : b; };
          self().offload_.release(p.weight, stored(p.quant.code_bytes(n)));
          self().offload_.release(p.scales, stored(p.quant.scale_bytes(n)));
        }
      }
  }

 private:
  Trainer& self() { return static_cast<Trainer&>(*this); }
  const Trainer& self() const { return static_cast<const Trainer&>(*this); }

  void fill_tables() {
    if (Trainer::sched.quant_table >= 0) {
      bool dq = false;
      for (const ParamSlot& p : Trainer::sched.params) dq = dq || p.quant.double_quant;
      fill_quant_table(quant_table(), dq);
    }
    using O = typename Trainer::run::optimizer;
    if constexpr (O::desc.tables > 0) O::fill_table(states_arena().template at<float>(Trainer::sched.optim_table));
  }

  // The engines' shared initial values (trainers::InitialValues).
  void initialize(std::uint64_t seed) {
    for (std::size_t k = 0; k < Trainer::sched.params.size(); ++k) {
      const ParamSlot& p = Trainer::sched.params[k];
      // tensor parallelism: the values of this rank's block of the whole
      const auto value = trainers::initial_values(seed, Trainer::plan, p, self().tensor_rank());
      // ZeRO 3: this rank keeps only its shard of every parameter
      const std::int64_t begin = Trainer::config.sharded(3) ? self().rank() * p.shard : 0;
      const std::int64_t count =
          Trainer::config.sharded(3) ? std::clamp<std::int64_t>(p.elements() - begin, 0, p.shard) : p.elements();
      // each value depends on its index alone: the workers take a share each
      if (p.quant.kind == QuantKind::none) {
        T* w = weight(p);
        float* m = master(p);  // a bf16 run's trainable parameter: the value in f32, stored rounded
        team(self().workers_, [&](int k, int n) {
          const Range r = share(count, n, k);
          for (std::int64_t i = r.begin; i < r.end; ++i) {
            const C v = static_cast<C>(value(begin + i));
            w[i] = narrow<T>(v);
            if (m != nullptr) m[i] = static_cast<float>(v);
          }
        });
      } else {
        std::vector<float> dense(static_cast<std::size_t>(p.elements()));
        team(self().workers_, [&](int k, int n) {
          const Range r = share(p.elements(), n, k);
          for (std::int64_t i = r.begin; i < r.end; ++i) dense[i] = static_cast<float>(value(i));
        });
        if constexpr (Trainer::config.sharded(3)) set_quantized_shard(p, dense);
        else set_quantized(p, dense);
      }
    }
  }

  // ZeRO 3: quantizes the whole matrix and keeps this rank's shard of its
  // codes and of its scales (byte shards, RunConfig::shard_bytes).
  void set_quantized_shard(const ParamSlot& p, std::span<const float> x) {
    const std::int64_t n = p.elements();
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(p.quant.code_bytes(n))), scales(static_cast<std::size_t>(p.quant.scale_bytes(n)));
    quantize_matrix(QuantView{p.quant, codes.data(), scales.data(), quant_table(), p.rows, p.cols}, x.data(), self().workers_);
    auto keep = [&](const std::vector<std::uint8_t>& all, std::int64_t at) {
      const auto [begin, count] = trainers::held_bytes(Trainer::config, static_cast<std::int64_t>(all.size()), self().rank());
      if (count > 0) std::memcpy(params_arena().template at<std::uint8_t>(at), all.data() + begin, static_cast<std::size_t>(count));
    };
    keep(codes, p.weight);
    keep(scales, p.scales);
  }
};

}  // namespace headroom::host::detail
