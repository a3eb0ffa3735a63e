#pragma once
// io::Consolidated: the parameters of a ZeRO<3> or tensor-parallel trainer
// gathered whole, for the exporters and importers that read or write whole
// parameters (Hugging Face safetensors, PEFT adapters, merged checkpoints),
// as DeepSpeed's zero_to_fp32 consolidates a sharded checkpoint. ZeRO 3's
// shards are gathered over the data-parallel ranks, tensor parallelism's
// blocks (ParamSlot::split) over the tensor-parallel ones.
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
// parameters as their codes and scales). A trainer below ZeRO 3 without
// tensor parallelism holds whole parameters already: the exporters take it
// directly (one rank writes; every rank may load).
#include <array>
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
    c.tp = 1;
    return c;
  }();
  static constexpr std::size_t param_count = Trainer::param_count;
  // The trainer's parameters with their whole dims (tensor parallelism splits them).
  static constexpr std::array<ParamSlot, param_count> whole_params = [] {
    std::array<ParamSlot, param_count> a{};
    for (std::size_t k = 0; k < param_count; ++k) {
      a[k] = Trainer::param(k);
      a[k].rows = a[k].split.whole_rows(a[k].rows);
      a[k].cols = a[k].split.whole_cols(a[k].cols);
      a[k].split = TensorSplit{};
    }
    return a;
  }();
  static constexpr const ParamSlot& param(std::size_t i) { return whole_params[i]; }
  static std::string path_of(const ParamSlot& p) { return Trainer::path_of(p); }
  static std::string node_path(int node, int instance) { return Trainer::node_path(node, instance); }
  static constexpr std::int64_t vocab_size() { return Trainer::vocab_size(); }

  // Gathers every parameter from every rank's part (all ranks call it).
  explicit Consolidated(const Trainer& t) : table_(t.quant_table()) {
    static_assert(Trainer::config.pp == 1,
                  "io::Consolidated: a pipeline stage holds its own layers only; consolidating the stages is not done yet");
    static_assert(Trainer::config.sharded(3) || Trainer::config.tp > 1,
                  "io::Consolidated: this trainer holds whole parameters already (ZeRO below 3, no tensor parallelism); use it "
                  "directly");
    const auto& arena = t.arena(Tier::device);
    for (std::size_t k = 0; k < param_count; ++k) {
      const ParamSlot& p = Trainer::param(k);
      Whole w;
      if (p.quant.kind == QuantKind::none) {
        const std::int64_t bytes = p.elements() * static_cast<std::int64_t>(sizeof(T));  // this rank's block
        if constexpr (Trainer::config.sharded(3))
          w.values = gather(*t.communicator(), arena.template at<std::byte>(p.weight), p.shard * static_cast<std::int64_t>(sizeof(T)));
        else
          w.values.assign(arena.template at<std::byte>(p.weight), arena.template at<std::byte>(p.weight) + bytes);
        if (p.split.split()) w.values = join_blocks(t, p, w.values);
      } else {
        host::Communicator& c = *t.communicator();  // ZeRO 3 (tensor parallelism does not split quantized parameters)
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

  // Every rank keeps its part of each parameter, as loaded here.
  void write_back(Trainer& t) const {
    auto& arena = t.arena(Tier::device);
    const int r = t.rank();
    for (std::size_t k = 0; k < param_count; ++k) {
      const ParamSlot& p = Trainer::param(k);
      const Whole& w = whole_[k];
      if (p.quant.kind == QuantKind::none) {
        const std::int64_t bytes = p.elements() * static_cast<std::int64_t>(sizeof(T));
        const std::vector<std::byte> block = p.split.split() ? block_of(t, p, w.values) : w.values;
        if constexpr (Trainer::config.sharded(3))
          keep(block, p.shard * static_cast<std::int64_t>(sizeof(T)), bytes, r, arena.template at<std::byte>(p.weight));
        else
          std::memcpy(arena.template at<std::byte>(p.weight), block.data(), static_cast<std::size_t>(bytes));
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

  const Whole& at(const ParamSlot& p) const { return whole_.at(static_cast<std::size_t>(&p - &whole_params[0])); }

  // Tensor parallelism: every rank's block of p (this rank's given),
  // gathered and placed where it sits in the whole; and back.
  static std::vector<std::byte> join_blocks(const Trainer& t, const ParamSlot& p, const std::vector<std::byte>& mine) {
    host::Communicator& c = *t.tensor_communicator();
    const std::int64_t n = p.elements();
    const std::vector<std::byte> all = gather(c, mine.data(), n * static_cast<std::int64_t>(sizeof(T)));
    std::vector<std::byte> whole(all.size());
    const T* from = reinterpret_cast<const T*>(all.data());
    T* to = reinterpret_cast<T*>(whole.data());
    for (int q = 0; q < c.size(); ++q)
      for (std::int64_t i = 0; i < n; ++i) to[p.split.whole_index(p.rows, p.cols, q, i)] = from[q * n + i];
    return whole;
  }
  static std::vector<std::byte> block_of(const Trainer& t, const ParamSlot& p, const std::vector<std::byte>& whole) {
    const std::int64_t n = p.elements();
    std::vector<std::byte> block(static_cast<std::size_t>(n * static_cast<std::int64_t>(sizeof(T))));
    const T* from = reinterpret_cast<const T*>(whole.data());
    T* to = reinterpret_cast<T*>(block.data());
    for (std::int64_t i = 0; i < n; ++i) to[i] = from[p.split.whole_index(p.rows, p.cols, t.tensor_rank(), i)];
    return block;
  }

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
