#pragma once
// io::Consolidated: a ZeRO<3> trainer's parameters gathered whole, for the
// exporters and importers that read or write whole parameters (Hugging Face
// safetensors, PEFT adapters, merged checkpoints), as DeepSpeed's
// zero_to_fp32 consolidates a sharded checkpoint.
//
//   io::Consolidated full(trainer);                       // every rank: a collective
//   if (trainer.rank() == 0) {
//     io::save_pretrained(full, "out/model.safetensors");  // one rank writes
//     io::export_adapter(full, "out/adapter", "meta-llama/Meta-Llama-3-8B");
//   }
//
//   io::Consolidated full(trainer);                       // loading: every rank
//   io::load_pretrained(full, "base/model.safetensors");  // every rank reads the file
//   full.write_back(trainer);                             // and keeps its shards
//
// Every rank holds the whole parameters while it exists (host memory
// outside the arena: the model's size in the run's dtype, quantized
// parameters as their codes and scales). A trainer below ZeRO 3 holds whole
// parameters already: the exporters take it directly (one rank writes; every
// rank may load).
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../host/communicator.hpp"
#include "../host/quant.hpp"
#include "../math/quant_view.hpp"
#include "../plan/schedule.hpp"

namespace headroom::io {

template <class Trainer>
class Consolidated {
 public:
  using T = typename Trainer::T;
  // What the exporters read of a trainer type; the parameters are whole here.
  static constexpr const auto& plan = Trainer::plan;
  static constexpr const auto& sched = Trainer::sched;
  static constexpr RunConfig config = [] {
    RunConfig c = Trainer::config;
    c.zero = 0;
    c.dp = 1;
    return c;
  }();
  static constexpr std::size_t param_count = Trainer::param_count;
  static constexpr const ParamSlot& param(std::size_t i) { return Trainer::param(i); }
  static std::string path_of(const ParamSlot& p) { return Trainer::path_of(p); }
  static std::string node_path(int node, int instance) { return Trainer::node_path(node, instance); }
  static constexpr std::int64_t vocab_size() { return Trainer::vocab_size(); }

  // Gathers every parameter from every rank's shard (all ranks call it).
  explicit Consolidated(const Trainer& t) : table_(t.quant_table()) {
    static_assert(Trainer::config.sharded(3), "io::Consolidated: this trainer holds whole parameters already (ZeRO below 3); use it directly");
    host::Communicator& c = *t.communicator();
    const auto& arena = t.arena(Tier::device);
    for (std::size_t k = 0; k < param_count; ++k) {
      const ParamSlot& p = param(k);
      Whole w;
      if (p.quant.kind == QuantKind::none) {
        w.values = gather(c, arena.template at<std::byte>(p.weight), p.shard * static_cast<std::int64_t>(sizeof(T)));
      } else {
        w.values = gather(c, arena.template at<std::byte>(p.weight), Trainer::config.shard_bytes(p.quant.code_bytes(p.elements())));
        w.scales = gather(c, arena.template at<std::byte>(p.scales), Trainer::config.shard_bytes(p.quant.scale_bytes(p.elements())));
      }
      whole_.push_back(std::move(w));
    }
  }

  // The whole parameter: dense values (row-major rows x cols), or null for a quantized one.
  T* weight(const ParamSlot& p) const {
    return p.quant.kind == QuantKind::none ? reinterpret_cast<T*>(const_cast<std::byte*>(at(p).values.data())) : nullptr;
  }
  math::QuantView quant(const ParamSlot& p) const {
    const Whole& w = at(p);
    return math::QuantView{p.quant, reinterpret_cast<std::uint8_t*>(const_cast<std::byte*>(w.values.data())),
                           reinterpret_cast<std::uint8_t*>(const_cast<std::byte*>(w.scales.data())), table_, p.rows, p.cols};
  }
  // Quantizes dense values into a quantized parameter (load_pretrained).
  void set_quantized(const ParamSlot& p, std::span<const float> x) { host::quantize_matrix(quant(p), x.data()); }

  // Every rank keeps its shard of each parameter, as loaded here.
  void write_back(Trainer& t) const {
    auto& arena = t.arena(Tier::device);
    const int r = t.rank();
    for (std::size_t k = 0; k < param_count; ++k) {
      const ParamSlot& p = param(k);
      const Whole& w = whole_[k];
      if (p.quant.kind == QuantKind::none) {
        keep(w.values, p.shard * static_cast<std::int64_t>(sizeof(T)), p.elements() * static_cast<std::int64_t>(sizeof(T)), r,
             arena.template at<std::byte>(p.weight));
      } else {
        keep(w.values, Trainer::config.shard_bytes(p.quant.code_bytes(p.elements())), p.quant.code_bytes(p.elements()), r,
             arena.template at<std::byte>(p.weight));
        keep(w.scales, Trainer::config.shard_bytes(p.quant.scale_bytes(p.elements())), p.quant.scale_bytes(p.elements()), r,
             arena.template at<std::byte>(p.scales));
      }
    }
  }

 private:
  struct Whole {
    std::vector<std::byte> values, scales;  // every rank's blocks, end to end (the last one padded)
  };
  std::vector<Whole> whole_;
  float* table_ = nullptr;

  const Whole& at(const ParamSlot& p) const { return whole_.at(static_cast<std::size_t>(&p - &Trainer::param(0))); }

  static std::vector<std::byte> gather(host::Communicator& c, const std::byte* shard, std::int64_t block) {
    std::vector<std::byte> all(static_cast<std::size_t>(block * c.size()));
    std::memcpy(all.data() + block * c.rank(), shard, static_cast<std::size_t>(block));
    c.all_gather(all.data(), block);
    return all;
  }
  static void keep(const std::vector<std::byte>& all, std::int64_t block, std::int64_t total, int r, std::byte* shard) {
    const std::int64_t begin = block * r;
    const std::int64_t count = total - begin < block ? (total - begin > 0 ? total - begin : 0) : block;
    if (count > 0) std::memcpy(shard, all.data() + begin, static_cast<std::size_t>(count));
  }
};

}  // namespace headroom::io
