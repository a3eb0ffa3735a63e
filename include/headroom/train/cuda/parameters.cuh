#pragma once
// cuda::Trainer's parameters seen from the host: their values and gradients
// read back as f32 (download_*), set from f32 (upload_weight: a quantized
// one quantized on the host first), the checkpoint image (every byte a
// checkpoint holds of the trainer, laid out as host::Trainer keeps it), the
// initial values both engines share and the model's tables. Each goes to
// the tier the plan keeps the tensor in: the device, or with
// OffloadOptimizer / OffloadParameters the pinned offload tier, written by
// the host once every copy and update is done. cuda::Trainer inherits it (a
// CRTP base: Engine is the trainer, whose arenas and copies it uses).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../cuda/device.cuh"
#include "../../cuda/runtime.cuh"
#include "../../host/quant.hpp"
#include "../../math/dynamic_map.hpp"
#include "../../plan/schedule.hpp"
#include "../initial_values.hpp"
#include "../ownership.hpp"

namespace headroom::cuda::detail {

template <class Engine>
class Parameters {
 public:
  // A dense parameter's values as f32 (the master copy of a 16-bit run):
  // all of them, or with ZeRO<3> this rank's shard (shard_of(p)).
  std::vector<float> download_weight(const ParamSlot& p) const {
    auto& t = self();
    if (p.quant.kind != QuantKind::none) throw std::invalid_argument("cuda::Trainer::download_weight: " + t.path_of(p) + " is quantized");
    const std::int64_t n = Engine::config.sharded(3) ? t.shard_of(p).count : p.elements();
    if constexpr (Engine::offloaded)  // the master copy, in the offload tier (where it holds what the weight holds)
      if (p.master >= 0 && Engine::config.sharded(1) == Engine::config.sharded(3)) return t.template from_offload_tier<float>(p.master, n);
    // the master copy, where it holds what the weight holds (ZeRO 1 and 2 keep a shard of it beside whole weights)
    if (Engine::half && p.master >= 0 && Engine::config.sharded(1) == Engine::config.sharded(3))
      return t.template download<float>(t.device_.template at<float>(p.master), n);
    return download_stored(p);
  }
  // A dense parameter's stored values as f32: what the kernels read (the
  // storage type; with OffloadParameters the offload tier's copy, which the
  // fetches bring to the device), all of them or with ZeRO<3> this rank's shard.
  std::vector<float> download_stored(const ParamSlot& p) const {
    auto& t = self();
    using S = typename Engine::S;
    if (p.quant.kind != QuantKind::none) throw std::invalid_argument("cuda::Trainer::download_stored: " + t.path_of(p) + " is quantized");
    const std::vector<S> s = read_stored<S>(p.weight, Engine::config.sharded(3) ? t.shard_of(p).count : p.elements());
    std::vector<float> v(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) v[i] = to_float(s[i]);
    return v;
  }
  // Any parameter's values as f32: a quantized one dequantized on the host
  // (what the kernels compute: code x absmax in f32).
  std::vector<float> download_dense(const ParamSlot& p) const {
    auto& t = self();
    if (p.quant.kind == QuantKind::none) return download_weight(p);
    if (Engine::config.sharded(3))
      throw std::invalid_argument("cuda::Trainer::download_dense: with ZeRO<3> this rank holds byte shards of " + t.path_of(p) +
                                  "'s codes and scales, not a matrix to dequantize");
    std::vector<std::uint8_t> codes = read_stored<std::uint8_t>(p.weight, p.quant.code_bytes(p.elements()));
    std::vector<std::uint8_t> scales = read_stored<std::uint8_t>(p.scales, p.quant.scale_bytes(p.elements()));
    const math::QuantView w = host_view(p, codes, scales);
    std::vector<float> v(static_cast<std::size_t>(p.elements()));
    host::dequantize_rows<float>(w, 0, p.rows, v.data());
    return v;
  }
  // A parameter's optimizer state as stored (layouts: cuda/kernels/optimizer.cuh), of
  // the elements this rank updates (shard_of(p)); empty without one.
  std::vector<std::byte> download_state(const ParamSlot& p) const {
    auto& t = self();
    if (p.state < 0) return {};
    if constexpr (Engine::offloaded) return t.template from_offload_tier<std::byte>(p.state, state_bytes(p));
    return t.template download<std::byte>(t.device_.template at<std::byte>(p.state), state_bytes(p));
  }
  // The gradient as the update reads it: whole, or with ZeRO<2> and <3> this rank's shard (averaged over the ranks).
  // With OffloadOptimizer its copy in the offload tier, as forward_backward() leaves it (a 16-bit run's step()
  // writes the new weights into those bytes once the parameter is updated).
  std::vector<float> download_grad(const ParamSlot& p) const {
    auto& t = self();
    using S = typename Engine::S;
    if (p.grad < 0) return {};
    if constexpr (Engine::offloaded) {
      const std::vector<S> g = t.template from_offload_tier<S>(p.host_grad, Engine::config.sharded(2) ? t.shard_of(p).count : p.elements());
      std::vector<float> v(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) v[i] = to_float(g[i]);
      return v;
    }
    if (Engine::config.sharded(2)) return download_as_float(t.device_.template at<S>(p.grad_shard), t.shard_of(p).count);
    return download_as_float(t.device_.template at<S>(p.grad), p.elements());
  }
  // Sets a dense parameter from f32 values (master and storage copies).
  void upload_weight(const ParamSlot& p, std::span<const float> x) {
    auto& t = self();
    using S = typename Engine::S;
    if (p.quant.kind != QuantKind::none) {
      upload_quantized(p, x);
      return;
    }
    if (static_cast<std::int64_t>(x.size()) != p.elements())
      throw std::invalid_argument("cuda::Trainer::upload_weight: " + t.path_of(p) + " has " + std::to_string(p.elements()) + " elements");
    // data parallelism: the master copy holds the elements this rank updates, a ZeRO 3 weight its shard
    const trainers::Owned own = t.owned(p);
    const std::span<const float> held = Engine::config.sharded(3) ? x.subspan(own.begin, own.count) : x;
    if constexpr (Engine::offloaded) {
      if (p.master >= 0) {  // in the offload tier (no copy of it reads or writes it between steps)
        t.settle_offload();
        std::memcpy(t.offload_.template at<float>(p.master), x.data() + own.begin, static_cast<std::size_t>(own.count) * sizeof(float));
      }
    } else if (Engine::half && p.master >= 0) {
      t.upload(t.device_.template at<float>(p.master), x.data() + own.begin, own.count, "upload master");
    }
    std::vector<S> stored(held.size());
    for (std::size_t i = 0; i < held.size(); ++i) stored[i] = from_float<S>(held[i]);
    write_stored(p.weight, stored.data(), stored.size(), "upload weight");
  }

  // ---- checkpoints (io/checkpoint.hpp) ---------------------------------------------------------------------
  // What a checkpoint holds of this trainer, copied to host memory: each
  // parameter's stored values (or quantized codes and scales), its f32
  // master copy where the plan keeps one, its optimizer state, and the
  // model's shared tables, laid out as host::Trainer keeps them, so either
  // engine's checkpoint loads into the other. Of this process: with ZeRO<3>
  // its shards, with ZeRO 1-3 the master weights and state of the elements
  // it updates (io/sharded_checkpoint.hpp).
  class CheckpointImage {
   public:
    const void* weight(const ParamSlot& p) const { return part(weight_, p); }
    const std::uint8_t* codes(const ParamSlot& p) const { return reinterpret_cast<const std::uint8_t*>(part(weight_, p)); }
    const std::uint8_t* scales(const ParamSlot& p) const { return reinterpret_cast<const std::uint8_t*>(part(scales_, p)); }
    const float* master(const ParamSlot& p) const { return reinterpret_cast<const float*>(part(master_, p)); }
    const std::byte* state(const ParamSlot& p) const { return part(state_, p); }
    const std::byte* quant_table() const { return quant_table_.data(); }
    const std::byte* optim_table() const { return optim_table_.data(); }

   private:
    friend class Parameters;
    static const std::byte* part(const std::vector<std::vector<std::byte>>& v, const ParamSlot& p) {
      return v[static_cast<std::size_t>(&p - Engine::sched.params.data())].data();
    }
    std::vector<std::vector<std::byte>> weight_, scales_, master_, state_;  // by parameter
    std::vector<std::byte> quant_table_, optim_table_;
  };
  CheckpointImage checkpoint_image() const {
    auto& t = self();
    using S = typename Engine::S;
    if constexpr (Engine::offloaded) t.settle_offload();
    CheckpointImage im;
    im.weight_.resize(Engine::param_count);
    im.scales_.resize(Engine::param_count);
    im.master_.resize(Engine::param_count);
    im.state_.resize(Engine::param_count);
    auto bytes = [](const auto& v) {
      const auto* b = reinterpret_cast<const std::byte*>(v.data());
      return std::vector<std::byte>(b, b + v.size() * sizeof(v[0]));
    };
    for (std::size_t k = 0; k < Engine::param_count; ++k) {
      const ParamSlot& p = Engine::sched.params[k];
      if (p.quant.kind == QuantKind::none) {
        im.weight_[k] = bytes(read_stored<S>(p.weight, Engine::config.sharded(3) ? t.owned(p).count : p.elements()));
      } else {
        im.weight_[k] = read_stored<std::byte>(p.weight, held_bytes(p.quant.code_bytes(p.elements())).count);
        im.scales_[k] = read_stored<std::byte>(p.scales, held_bytes(p.quant.scale_bytes(p.elements())).count);
      }
      if (p.master >= 0)  // of the elements this rank updates
        im.master_[k] = Engine::offloaded ? t.template from_offload_tier<std::byte>(p.master, 4 * t.owned(p).count)
                                  : t.template download<std::byte>(t.device_.template at<std::byte>(p.master), 4 * t.owned(p).count);
      im.state_[k] = download_state(p);
    }
    constexpr auto& sched = Engine::sched;
    if (sched.quant_table >= 0)
      im.quant_table_ = t.template download<std::byte>(t.device_.template at<std::byte>(sched.quant_table), sched.quant_table_bytes());
    if (sched.optim_table >= 0) {
      const std::int64_t bytes = Engine::config.optim.table_bytes();
      im.optim_table_ = Engine::offloaded ? t.template from_offload_tier<std::byte>(sched.optim_table, bytes)
                                          : t.template download<std::byte>(t.device_.template at<std::byte>(sched.optim_table), bytes);
    }
    return im;
  }
  // The bytes of a byte-stored tensor (quantized codes or scales) this rank holds.
  trainers::HeldBytes held_bytes(std::int64_t bytes) const { return trainers::held_bytes(Engine::config, bytes, self().rank()); }
  // Writes an image back (after io::load_checkpoint filled it).
  void restore_checkpoint_image(const CheckpointImage& im) {
    auto& t = self();
    if constexpr (Engine::offloaded) t.settle_offload();
    auto put = [&t](std::int64_t offset, const std::vector<std::byte>& v, bool in_offload_tier, const char* what) {
      if (in_offload_tier) std::memcpy(t.offload_.template at<std::byte>(offset), v.data(), v.size());
      else t.upload(t.device_.template at<std::byte>(offset), v.data(), v.size(), what);
    };
    for (std::size_t k = 0; k < Engine::param_count; ++k) {
      const ParamSlot& p = Engine::sched.params[k];
      write_stored(p.weight, im.weight_[k].data(), im.weight_[k].size(), "restore a checkpoint's weights");
      if (p.quant.kind != QuantKind::none) write_stored(p.scales, im.scales_[k].data(), im.scales_[k].size(), "restore scales");
      if (p.master >= 0) put(p.master, im.master_[k], Engine::offloaded, "restore master weights");
      if (p.state >= 0) put(p.state, im.state_[k], Engine::offloaded, "restore optimizer state");
    }
    if (Engine::sched.quant_table >= 0) put(Engine::sched.quant_table, im.quant_table_, false, "restore code tables");
    if (Engine::sched.optim_table >= 0)
      put(Engine::sched.optim_table, im.optim_table_, Engine::offloaded, "restore the optimizer's tables");
    t.wait(t.compute_, "restore a checkpoint");
  }
  // Zeroes every optimizer state and restarts the step count.
  void reset_optimizer() {
    auto& t = self();
    if constexpr (Engine::offloaded) {  // in the offload tier
      t.settle_offload();
      t.zero_offloaded_states();
    } else {
      for (const ParamSlot& p : Engine::sched.params)
        if (p.state >= 0)
          check(cudaMemsetAsync(t.device_.template at<std::byte>(p.state), 0, static_cast<std::size_t>(state_bytes(p)), t.compute_),
                "cudaMemsetAsync (optimizer state)");
      t.wait(t.compute_, "reset_optimizer");
    }
    t.step_ = 0;
  }

 protected:
  const Engine& self() const { return static_cast<const Engine&>(*this); }
  Engine& self() { return static_cast<Engine&>(*this); }

  std::array<float, 16 + 256> host_tables_{};  // NF4 codes + the dynamic map, for quantizing on the host

  // A parameter's stored tensor (values, codes or scales) at `offset` of
  // the tier the plan stores parameters in: the device, or with
  // OffloadParameters the pinned offload tier (read and written by the host
  // once every copy and update is done; the fetches copy it to the device).
  template <class U>
  std::vector<U> read_stored(std::int64_t offset, std::int64_t n) const {
    auto& t = self();
    if constexpr (Engine::params_offloaded) return t.template from_offload_tier<U>(offset, n);
    else return t.template download<U>(t.device_.template at<U>(offset), n);
  }
  template <class U>
  void write_stored(std::int64_t offset, const U* src, std::size_t n, const char* what) {
    auto& t = self();
    if constexpr (Engine::params_offloaded) {
      t.settle_offload();
      std::memcpy(t.offload_.template at<U>(offset), src, n * sizeof(U));
    } else {
      t.upload(t.device_.template at<U>(offset), src, n, what);
    }
  }
  std::int64_t state_bytes(const ParamSlot& p) const {
    return Engine::config.optim.state_bytes(Engine::config.sharded(1) ? p.shard : p.elements());
  }
  template <class S>
  std::vector<float> download_as_float(const S* src, std::int64_t n) const {
    const std::vector<S> s = self().template download<S>(src, n);
    std::vector<float> v(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) v[i] = to_float(s[i]);
    return v;
  }

  void fill_tables() {
    auto& t = self();
    host::fill_quant_table(host_tables_.data(), true);
    if (Engine::sched.quant_table >= 0) {
      bool dq = false;
      for (const ParamSlot& p : Engine::sched.params) dq = dq || p.quant.double_quant;
      t.upload(t.device_.template at<float>(Engine::sched.quant_table), host_tables_.data(), dq ? 16 + 256 : 16, "upload code tables");
    }
    // the optimizer's tables (AdamW8bit's dynamic maps)
    using O = typename Engine::run::optimizer;
    if constexpr (O::desc.tables > 0) {
      if (Engine::offloaded) {  // read by the CPU's update
        O::fill_table(t.offload_.template at<float>(Engine::sched.optim_table));
      } else {
        std::vector<float> table(static_cast<std::size_t>(O::desc.tables) / sizeof(float));
        O::fill_table(table.data());
        t.upload(t.device_.template at<float>(Engine::sched.optim_table), table.data(), table.size(), "upload the optimizer's tables");
      }
    }
  }

  // A quantized parameter in host buffers (codes and scales of its size), over the host copy of the code tables.
  math::QuantView host_view(const ParamSlot& p, std::vector<std::uint8_t>& codes, std::vector<std::uint8_t>& scales) const {
    return math::QuantView{p.quant, codes.data(), scales.data(), const_cast<float*>(host_tables_.data()), p.rows, p.cols};
  }

  // Quantizes on the host (host/quant.hpp) and uploads codes and scales.
  // (ZeRO 3: this rank's byte shards of both, RunConfig::shard_bytes, as host::Trainer keeps.)
  void upload_quantized(const ParamSlot& p, std::span<const float> x) {
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(p.quant.code_bytes(p.elements())));
    std::vector<std::uint8_t> scales(static_cast<std::size_t>(p.quant.scale_bytes(p.elements())));
    host::quantize_matrix(host_view(p, codes, scales), x.data());
    auto held = [&](const std::vector<std::uint8_t>& all) {
      const auto [begin, count] = held_bytes(static_cast<std::int64_t>(all.size()));
      return std::span<const std::uint8_t>(all).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(count));
    };
    const std::span<const std::uint8_t> c = held(codes), a = held(scales);
    write_stored(p.weight, c.data(), c.size(), "upload codes");
    write_stored(p.scales, a.data(), a.size(), "upload scales");
  }

  // The same initial values as host::Trainer (trainers::initial_values:
  // with tensor parallelism, this rank's block of each split parameter).
  void initialize(std::uint64_t seed) {
    auto& t = self();
    for (const ParamSlot& p : Engine::sched.params) {
      const auto value = trainers::initial_values(seed, Engine::plan, p, t.tensor_rank());
      std::vector<float> dense(static_cast<std::size_t>(p.elements()));
      for (std::int64_t i = 0; i < p.elements(); ++i) dense[static_cast<std::size_t>(i)] = static_cast<float>(value(i));
      upload_weight(p, dense);
    }
  }
};

}  // namespace headroom::cuda::detail
