#pragma once
// io::Consolidated: the parameters of a ZeRO<3>, tensor-parallel or
// pipeline-parallel trainer gathered whole, for the exporters and importers
// that read or write whole parameters (Hugging Face safetensors, PEFT
// adapters, merged checkpoints), as DeepSpeed's zero_to_fp32 consolidates a
// sharded checkpoint. ZeRO 3's shards are gathered over the data-parallel
// ranks, tensor parallelism's blocks (ParamSlot::split) over the
// tensor-parallel ones, and the pipeline stages' parameters over the stages:
// the view then names and orders them as the one-process run does
// (single_process<Run>), whose plan it carries.
//
//   io::Consolidated full(trainer);                       // every process: a collective
//   if (trainer.world_rank() == 0) {
//     io::save_pretrained(full, "out/model.safetensors");  // one process writes
//     io::export_adapter(full, "out/adapter", "meta-llama/Meta-Llama-3-8B");
//   }
//
//   io::Consolidated full(trainer);                       // loading: every process
//   io::load_pretrained(full, "base/model.safetensors");  // every process reads the file
//   full.write_back(trainer);                             // and keeps its part
//
// Every process holds the whole parameters while it exists (host memory
// outside the arena: the model's size in the run's dtype, quantized
// parameters as their codes and scales). A trainer below ZeRO 3 without
// tensor or pipeline parallelism holds whole parameters already: the
// exporters take it directly (one rank writes; every rank may load).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../host/communicator.hpp"
#include "../host/quant.hpp"
#include "../math/quant_view.hpp"
#include "../plan/schedule.hpp"
#include "../train/common.hpp"

namespace headroom::io {

namespace detail::consolidated {
// Where a consolidated view takes the model's names, order and op
// dimensions from: the trainer's own plan (ZeRO 3: its parameters are the
// whole model's, sharded), or the one-process run's, for a pipeline stage
// (some of the model's parameters) and with tensor parallelism (an op's
// dimensions are its rank's block: the exporters read the whole's, as a
// LoRA module's in and out).
template <class Trainer, bool Stage = (Trainer::config.pp > 1 || Trainer::config.tp > 1)>
struct Model {
  static constexpr const auto& plan = Trainer::plan;
  static constexpr const auto& sched = Trainer::sched;
};
template <class Trainer>
struct Model<Trainer, true> {
  using Whole = single_process<typename Trainer::run>;
  static constexpr auto plan = headroom::plan<Whole>();
  static constexpr auto sched = headroom::schedule<Whole>();
};
}  // namespace detail::consolidated

template <class Trainer>
class Consolidated {
  using Model = detail::consolidated::Model<Trainer>;
  static constexpr bool stages = Trainer::config.pp > 1;

 public:
  using T = typename Trainer::T;
  using run = typename Trainer::run;  // the model and its Seq (config.json is checked against them)
  // What the exporters read of a trainer type; the parameters are whole here.
  static constexpr const auto& plan = Model::plan;
  static constexpr const auto& sched = Model::sched;
  static constexpr RunConfig config = [] {
    RunConfig c = Trainer::config;
    c.zero = 0;
    c.dp = 1;
    c.tp = 1;
    c.pp = 1;
    c.stage = 0;
    return c;
  }();
  static constexpr std::size_t param_count = sched.params.size();
  // The model's parameters with their whole dims (tensor parallelism splits them).
  static constexpr std::array<ParamSlot, param_count> whole_params = [] {
    std::array<ParamSlot, param_count> a{};
    for (std::size_t k = 0; k < param_count; ++k) {
      a[k] = sched.params[k];
      a[k].rows = a[k].split.whole_rows(a[k].rows);
      a[k].cols = a[k].split.whole_cols(a[k].cols);
      a[k].split = TensorSplit{};
    }
    return a;
  }();
  static constexpr const ParamSlot& param(std::size_t i) { return whole_params[i]; }
  static std::string path_of(const ParamSlot& p) { return trainers::path_of(plan, p); }
  static std::string node_path(int node, int instance) { return trainers::node_path(plan, node, instance); }
  static constexpr std::int64_t vocab_size() { return trainers::vocab_size(sched); }

  // Gathers every parameter from every process's part (all of them call it).
  explicit Consolidated(const Trainer& t) {
    static_assert(Trainer::config.sharded(3) || Trainer::config.tp > 1 || stages,
                  "io::Consolidated: this trainer holds whole parameters already (ZeRO below 3, no tensor or pipeline "
                  "parallelism); use it directly");
    bool double_quant = false;  // the code tables, as the trainer fills them (a pipeline stage may have none)
    for (const ParamSlot& p : whole_params) double_quant = double_quant || p.quant.double_quant;
    host::fill_quant_table(table_.data(), double_quant);
    std::vector<Whole> mine;  // the trainer's parameters, whole
    mine.reserve(Trainer::param_count);
    const auto& arena = t.params_arena();
    for (std::size_t k = 0; k < Trainer::param_count; ++k) {
      const ParamSlot& p = Trainer::param(k);
      Whole w;
      if (p.quant.kind == QuantKind::none) {
        const std::int64_t bytes = p.elements() * static_cast<std::int64_t>(sizeof(T));  // this rank's block
        if constexpr (Trainer::config.sharded(3))
          w.values = gather(*t.communicator(), arena.template at<std::byte>(p.weight), p.shard * static_cast<std::int64_t>(sizeof(T)));
        else
          w.values.assign(arena.template at<std::byte>(p.weight), arena.template at<std::byte>(p.weight) + bytes);
        if (p.split.split()) w.values = join_blocks(t, p, w.values);
        w.values.resize(static_cast<std::size_t>(whole_elements(p) * static_cast<std::int64_t>(sizeof(T))));  // ZeRO's padding
      } else {
        if constexpr (Trainer::config.sharded(3)) {  // tensor parallelism does not split quantized parameters
          host::Communicator& c = *t.communicator();
          w.values = gather(c, arena.template at<std::byte>(p.weight), Trainer::config.shard_bytes(p.quant.code_bytes(p.elements())));
          w.scales = gather(c, arena.template at<std::byte>(p.scales), Trainer::config.shard_bytes(p.quant.scale_bytes(p.elements())));
        } else {
          const std::byte* codes = arena.template at<std::byte>(p.weight);
          const std::byte* scales = arena.template at<std::byte>(p.scales);
          w.values.assign(codes, codes + p.quant.code_bytes(p.elements()));
          w.scales.assign(scales, scales + p.quant.scale_bytes(p.elements()));
        }
      }
      mine.push_back(std::move(w));
    }
    if constexpr (stages) {
      whole_ = from_stages(t, mine);
    } else {
      whole_ = std::move(mine);
    }
  }

  // The whole parameter: dense values (row-major rows x cols), or null for a quantized one.
  T* weight(const ParamSlot& p) const {
    return p.quant.kind == QuantKind::none ? reinterpret_cast<T*>(const_cast<std::byte*>(at(p).values.data())) : nullptr;
  }
  math::QuantView quant(const ParamSlot& p) const {
    const Whole& w = at(p);
    return math::QuantView{p.quant, reinterpret_cast<std::uint8_t*>(const_cast<std::byte*>(w.values.data())),
                           reinterpret_cast<std::uint8_t*>(const_cast<std::byte*>(w.scales.data())), table_.data(), p.rows, p.cols};
  }
  // Quantizes dense values into a quantized parameter (load_pretrained).
  void set_quantized(const ParamSlot& p, std::span<const float> x) { host::quantize_matrix(quant(p), x.data()); }

  // Every process keeps its part of each parameter, as loaded here.
  void write_back(Trainer& t) const {
    auto& arena = t.params_arena();
    const int r = t.rank();
    const std::vector<std::size_t> index = whole_index(t);
    for (std::size_t k = 0; k < Trainer::param_count; ++k) {
      const ParamSlot& p = Trainer::param(k);
      const Whole& w = whole_[index[k]];
      if (p.quant.kind == QuantKind::none) {
        const std::int64_t bytes = p.elements() * static_cast<std::int64_t>(sizeof(T));
        const std::vector<std::byte> block = p.split.split() ? block_of(t, p, w.values) : w.values;
        if constexpr (Trainer::config.sharded(3))
          keep(block, p.shard * static_cast<std::int64_t>(sizeof(T)), bytes, r, arena.template at<std::byte>(p.weight));
        else
          std::memcpy(arena.template at<std::byte>(p.weight), block.data(), static_cast<std::size_t>(bytes));
      } else {
        const std::int64_t codes = p.quant.code_bytes(p.elements()), scales = p.quant.scale_bytes(p.elements());
        if constexpr (Trainer::config.sharded(3)) {
          keep(w.values, Trainer::config.shard_bytes(codes), codes, r, arena.template at<std::byte>(p.weight));
          keep(w.scales, Trainer::config.shard_bytes(scales), scales, r, arena.template at<std::byte>(p.scales));
        } else {
          std::memcpy(arena.template at<std::byte>(p.weight), w.values.data(), static_cast<std::size_t>(codes));
          std::memcpy(arena.template at<std::byte>(p.scales), w.scales.data(), static_cast<std::size_t>(scales));
        }
      }
    }
  }

 private:
  struct Whole {
    std::vector<std::byte> values, scales;  // dense: the values; quantized: the codes and the scales
  };
  std::vector<Whole> whole_;  // in the model's parameter order (param(k))
  mutable std::array<float, 16 + math::dynamic_map_size> table_{};  // NF4 code values, then the dynamic map

  const Whole& at(const ParamSlot& p) const { return whole_.at(static_cast<std::size_t>(&p - &whole_params[0])); }

  static std::int64_t whole_elements(const ParamSlot& p) { return p.split.whole_rows(p.rows) * p.split.whole_cols(p.cols); }

  // The model's index of each of the trainer's parameters (the same
  // order unless the trainer is a pipeline stage: then found by path).
  static std::vector<std::size_t> whole_index(const Trainer& t) {
    std::vector<std::size_t> index(Trainer::param_count);
    for (std::size_t k = 0; k < Trainer::param_count; ++k) {
      if constexpr (!stages) {
        index[k] = k;
      } else {
        const std::string path = Trainer::path_of(Trainer::param(k));
        const auto* p = trainers::find_param(plan, sched, path);
        if (p == nullptr)
          throw std::logic_error("io::Consolidated: stage " + std::to_string(t.stage()) + "'s parameter " + path +
                                 " is not a parameter of the one-process model");
        index[k] = static_cast<std::size_t>(p - &sched.params[0]);
      }
    }
    return index;
  }

  // Pipeline parallelism: every stage's whole parameters, exchanged over
  // the stages' communicator, placed in the model's order.
  static std::vector<Whole> from_stages(const Trainer& t, std::vector<Whole>& mine) {
    host::Communicator& c = *t.pipe_communicator();
    // this stage's parameters as one message: per parameter, its model index and byte counts, then the bytes
    const std::vector<std::size_t> index = whole_index(t);
    std::vector<std::byte> message;
    auto put = [&message](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      message.insert(message.end(), b, b + n);
    };
    for (std::size_t k = 0; k < mine.size(); ++k) {
      if (Trainer::param(k).stage_shared && !Trainer::config.first_stage()) continue;  // the first stage's copy of a tied table
      const std::int64_t head[3] = {static_cast<std::int64_t>(index[k]), static_cast<std::int64_t>(mine[k].values.size()),
                                    static_cast<std::int64_t>(mine[k].scales.size())};
      put(head, sizeof head);
      put(mine[k].values.data(), mine[k].values.size());
      put(mine[k].scales.data(), mine[k].scales.size());
      mine[k] = Whole{};
    }
    // every stage's message, padded to the longest
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(c.size()), 0);
    lengths[static_cast<std::size_t>(c.rank())] = static_cast<std::int64_t>(message.size());
    c.all_gather(lengths.data(), static_cast<std::int64_t>(sizeof(std::int64_t)));
    std::int64_t longest = 0;
    for (std::int64_t n : lengths) longest = std::max(longest, n);
    message.resize(static_cast<std::size_t>(longest));
    const std::vector<std::byte> all = gather(c, message.data(), longest);
    std::vector<Whole> whole(param_count);
    std::vector<int> found(param_count, 0);
    for (int s = 0; s < c.size(); ++s) {
      const std::byte* m = all.data() + longest * s;
      const std::byte* end = m + lengths[static_cast<std::size_t>(s)];
      while (m < end) {
        std::int64_t head[3];
        std::memcpy(head, m, sizeof head);
        m += sizeof head;
        Whole& w = whole.at(static_cast<std::size_t>(head[0]));
        w.values.assign(m, m + head[1]);
        m += head[1];
        w.scales.assign(m, m + head[2]);
        m += head[2];
        ++found[static_cast<std::size_t>(head[0])];
      }
    }
    for (std::size_t k = 0; k < param_count; ++k)
      if (found[k] != 1)
        throw std::logic_error("io::Consolidated: parameter " + path_of(param(k)) + " is held by " + std::to_string(found[k]) +
                               " pipeline stages, expected 1");
    return whole;
  }

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
