#pragma once
// Text generation with a planned KV cache.
//
//   host::Generator<Run, Context<512>, GenBatch<1>> g(trainer);   // shares the trainer's weights
//   g.reset(); g.feed(prompt); token = g.sample({.temperature = 0.8, .top_k = 40});
//
// An inference run is a training run's model decoding one token per sequence
// at a time. Its memory, computed at compile time (GenerationPlan):
//   kv cache    2 x layers x KV heads x head dim x context x batch x element bytes
//               (keys stored rotated, as RoPE leaves them)
//   activations every forward op's output for one token per sequence: the
//               training forward's tensors with N = batch instead of
//               batch x seq (each its own region: a decode step is small)
//   scratch     the largest op scratch of a decode step: a dequantized
//               weight panel, the attention row, and the (batch, vocab) logits
// plus the weights, which it reads from the trainer's arena. The generator
// allocates its arena once; decoding a token allocates nothing.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer.hpp"

namespace headroom {

template <std::int64_t C>
struct Context {
  static_assert(C >= 1, "Context<C>: C must be at least 1");
  static constexpr std::int64_t value = C;
};
template <std::int64_t B>
struct GenBatch {
  static_assert(B >= 1, "GenBatch<B>: B must be at least 1");
  static constexpr std::int64_t value = B;
};

// Where a decode step keeps each forward op's tensors, and what it costs.
template <std::size_t NS>
struct GenerationPlan {
  std::int64_t context = 0, batch = 1;
  std::int64_t kv_cache_bytes = 0, activation_bytes = 0, scratch_bytes = 0;
  std::int64_t weight_bytes = 0;  // read from the trainer's arena (weights + quant scales + tables)
  int attention_layers = 0;
  // per training step g (forward events only): the decode step's offsets of
  // its slots in the generation arena (-1: unbound)
  std::array<std::array<std::int64_t, 8>, NS> at{};  // in[0..2], out[0..2], inout, kv cache of this attention
  constexpr std::int64_t arena_bytes() const { return kv_cache_bytes + activation_bytes + scratch_bytes; }
  constexpr std::int64_t total_bytes() const { return arena_bytes() + weight_bytes; }
};

namespace detail {
inline constexpr std::int64_t gen_align = 64;
constexpr std::int64_t gen_round(std::int64_t b) { return (b + gen_align - 1) / gen_align * gen_align; }

// the steps a decode runs: the forward ops and the LM head
constexpr bool decodes(const Step& s) {
  return s.kind == EventKind::forward || (s.kind == EventKind::loss && s.op == ops::LmHeadLoss::name);
}

template <TrainingRun R, std::int64_t C, std::int64_t B, class Sched, class Plan>
constexpr auto generation_plan(const Sched& s, const Plan& training, std::int64_t elem) {
  GenerationPlan<std::tuple_size_v<decltype(s.steps)>> g{};
  g.context = C;
  g.batch = B;
  const std::int64_t n = R::config().batch * R::config().seq;
  // kv cache: per attention op, keys and values for every position
  std::int64_t kv = 0;
  for (std::size_t k = 0; k < s.steps.size(); ++k) {
    const Step& st = s.steps[k];
    for (auto& a : g.at[k]) a = -1;
    if (st.kind == EventKind::forward && st.op == ops::Attention::name) {
      g.at[k][7] = kv;
      kv += 2 * st.dim[1] * st.dim[2] * C * B * elem;
      ++g.attention_layers;
    }
  }
  g.kv_cache_bytes = kv;
  // activations: a region per output, found again by its training offset
  // (the latest producer of an offset is the one a later step reads)
  struct Live {
    std::int64_t train = -1, gen = -1;
  };
  cvec<Live> live;
  std::int64_t act = 0;
  auto lookup = [&](const Slot& sl) -> std::int64_t {
    if (!sl.bound()) return -1;
    for (std::size_t i = live.size(); i-- > 0;)
      if (live[i].train == sl.offset) return live[i].gen;
    return -2;  // produced outside the forward: tokens
  };
  for (std::size_t k = 0; k < s.steps.size(); ++k) {
    const Step& st = s.steps[k];
    if (!decodes(st)) continue;
    for (int q = 0; q < 3; ++q) g.at[k][q] = lookup(st.in[q]);
    g.at[k][6] = lookup(st.inout);
    for (int q = 0; q < 3; ++q) {
      if (!st.out[q].bound()) continue;
      const std::int64_t bytes = gen_round(st.out[q].bytes / n * B);
      g.at[k][3 + q] = kv + act;
      live.push_back(Live{st.out[q].offset, kv + act});
      act += bytes;
    }
  }
  g.activation_bytes = act;
  // scratch: logits, token ids, and the largest per-op need
  std::int64_t vocab = 0, need = 0;
  for (const Step& st : s.steps) {
    using A = ops::Attention;
    if (st.op == ops::LmHeadLoss::name) vocab = st.dim[ops::LmHeadLoss::vocab.index];
    if (st.kind != EventKind::forward) continue;
    if (st.op == ops::Linear::name && st.scratch.bound()) need = std::max(need, st.scratch.bytes / R::config().compute_bytes() * elem);
    if (st.op == A::name)  // the decode row, plus dense copies of a fused q|k|v
      need = std::max(need, A::decode_scratch(st.dim[A::heads.index], st.dim[A::kv_heads.index], st.dim[A::head_dim.index], C, B,
                                              R::config().workers) *
                                elem);
  }
  g.scratch_bytes = gen_round(B * vocab * elem) + gen_round(B * 4) + gen_round(need);
  g.weight_bytes = training.bytes(Role::weights, Tier::device) + training.bytes(Role::quant_scales, Tier::device);
  return g;
}
}  // namespace detail

namespace host {

struct SampleOptions {
  double temperature = 0.8;  // 0: greedy
  int top_k = 40;            // 0: the whole vocabulary
};

template <TrainingRun R, class Ctx = Context<R::seq>, class GB = GenBatch<1>>
class Generator {
 public:
  using Tr = Trainer<R>;
  using T = typename Tr::T;
  static constexpr std::int64_t context = Ctx::value, batch = GB::value;
  static constexpr GenerationPlan<Tr::sched.steps.size()> plan =
      headroom::detail::generation_plan<R, context, batch>(Tr::sched, Tr::plan, static_cast<std::int64_t>(sizeof(T)));
  static_assert(!(requires { R::model::max_seq; }) || context <= R::model::max_seq,
                "Generator<Run, Context<C>>: C exceeds the model's context length");
  static_assert(R::config().dtype != DType::BF16 && R::config().dtype != DType::F16,
                "Generator<Run>: decoding runs f32 (or f64) on the host; generate with the Precision<F32> run type, its "
                "weights loaded from the 16-bit run's save_pretrained");
  static_assert(R::config().pp == 1,
                "Generator<Run>: a pipelined run's trainer holds one stage's layers; generate with a one-process run type");
  static_assert(R::config().tp == 1,
                "Generator<Run>: a tensor-parallel run's trainer holds one rank's block of the split weights; generate with a "
                "one-process run type, its weights loaded from the whole model");
  static_assert(R::config().dp == 1,
                "Generator<Run>: a data-parallel run's trainer is one rank's (ZeRO 3: its shards of the weights); generate "
                "with a one-process run type, its weights loaded from the data-parallel run's save_pretrained (io::Consolidated)");

  explicit Generator(const Tr& trainer, std::uint64_t seed = 42)
      : tr_(trainer), arena_(plan.arena_bytes()), rng_(seed), order_(static_cast<std::size_t>(vocab())) {}

  static constexpr std::int64_t vocab() { return Tr::vocab_size(); }
  std::int64_t arena_bytes() const { return arena_.bytes(); }
  std::int64_t position() const { return pos_; }

  void reset() { pos_ = 0; }

  // Runs one token per sequence through the model at the current position,
  // appending to the KV cache; the logits of the next token are then ready.
  void feed_one(std::span<const std::int32_t> tokens) {
    if (static_cast<std::int64_t>(tokens.size()) != batch)
      throw std::invalid_argument("Generator: feed_one takes one token per sequence (" + std::to_string(batch) + ")");
    if (pos_ >= context)
      throw std::length_error("Generator: the sequence reached the planned context of " + std::to_string(context) +
                              " tokens (Context<C>)");
    for (std::int32_t t : tokens)
      if (t < 0 || t >= vocab()) throw std::out_of_range("Generator: token id " + std::to_string(t) + " is outside the vocabulary");
    std::copy(tokens.begin(), tokens.end(), token_buf());
    decode();
    ++pos_;
  }
  // Feeds a prompt (batch 1), token by token.
  void feed(std::span<const std::int32_t> prompt) {
    static_assert(batch == 1, "Generator::feed(prompt) is for GenBatch<1>; use feed_one");
    for (std::int32_t t : prompt) feed_one(std::span<const std::int32_t>(&t, 1));
  }
  // Samples the next token of sequence b from the logits (temperature, top-k).
  std::int32_t sample(SampleOptions o = {}, std::int64_t b = 0) {
    const T* z = logits() + b * vocab();
    const std::int64_t V = vocab();
    if (o.temperature <= 0) return static_cast<std::int32_t>(std::max_element(z, z + V) - z);
    for (std::int64_t i = 0; i < V; ++i) order_[i] = static_cast<std::int32_t>(i);
    const std::int64_t k = o.top_k > 0 && o.top_k < V ? o.top_k : V;
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), [&](std::int32_t a, std::int32_t c) { return z[a] > z[c]; });
    const double m = z[order_[0]];
    double sum = 0;
    for (std::int64_t i = 0; i < k; ++i) sum += std::exp((z[order_[i]] - m) / o.temperature);
    double u = uniform() * sum;
    for (std::int64_t i = 0; i < k; ++i) {
      u -= std::exp((z[order_[i]] - m) / o.temperature);
      if (u <= 0) return order_[i];
    }
    return order_[k - 1];
  }
  // Generates n tokens after a prompt (batch 1) into out.
  void generate(std::span<const std::int32_t> prompt, std::span<std::int32_t> out, SampleOptions o = {}) {
    reset();
    feed(prompt);
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i] = sample(o);
      if (i + 1 < out.size()) feed_one(std::span<const std::int32_t>(&out[i], 1));
    }
  }
  const T* logits() const { return arena_.at<T>(plan.kv_cache_bytes + plan.activation_bytes); }

 private:
  const Tr& tr_;
  Arena arena_;
  std::int64_t pos_ = 0;
  std::uint64_t rng_;
  std::vector<std::int32_t> order_;  // sampling's index buffer, sized once

  static constexpr std::int64_t logits_bytes = headroom::detail::gen_round(batch * vocab() * sizeof(T));
  std::int32_t* token_buf() const { return arena_.at<std::int32_t>(plan.kv_cache_bytes + plan.activation_bytes + logits_bytes); }
  T* scratch() const {
    return arena_.at<T>(plan.kv_cache_bytes + plan.activation_bytes + logits_bytes + headroom::detail::gen_round(batch * 4));
  }
  T* logits_mut() { return arena_.at<T>(plan.kv_cache_bytes + plan.activation_bytes); }
  double uniform() {
    rng_ = headroom::trainers::mix(rng_);
    return (static_cast<double>(rng_ >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  T* at(std::int64_t off) const { return off >= 0 ? arena_.at<T>(off) : nullptr; }
  const T* weight(int k) const { return k >= 0 ? tr_.weight(Tr::param(static_cast<std::size_t>(k))) : nullptr; }

  // A decode step's view of training step k: operands in the generation
  // arena, batch rows at the current position, the op's KV cache as its state.
  OpContext<T> context_of(const Step& st, const std::array<std::int64_t, 8>& a) const {
    OpContext<T> c{};
    c.event = EventKind::forward;
    for (int d = 0; d < graph::max_dims; ++d) c.dims[d] = st.dim[d];
    c.n_rows = batch;
    c.n_batch = batch;
    c.n_seq = 1;
    c.first_position = pos_;
    c.context_length = context;
    c.n_workers = tr_.threads();
    c.gemm_panels = tr_.gemm_panels();
    for (int q = 0; q < 3; ++q) c.in_[q] = a[q] == -2 ? static_cast<void*>(token_buf()) : static_cast<void*>(at(a[q]));
    for (int q = 0; q < 3; ++q) c.out_[q] = at(a[3 + q]);
    c.inout_ = at(a[6]);
    c.state_ = a[7] >= 0 ? static_cast<void*>(arena_.at<T>(a[7])) : nullptr;
    c.scratch_ = scratch();
    for (int w = 0; w < graph::max_weights; ++w) {
      if (st.param[w] < 0) continue;
      const ParamSlot& p = Tr::param(static_cast<std::size_t>(st.param[w]));
      c.quantized_[w] = p.quant.kind != QuantKind::none;
      if (c.quantized_[w]) c.quant_[w] = tr_.quant(p);
      else c.weight_[w] = const_cast<T*>(weight(st.param[w]));
    }
    return c;
  }

  // Every forward op on the decode rows (decode(), where an op has one),
  // then the LM head's logits.
  void decode() {
    for (std::size_t k = 0; k < Tr::sched.steps.size(); ++k) {
      const Step& st = Tr::sched.steps[k];
      if (!headroom::detail::decodes(st)) continue;
      OpContext<T> c = context_of(st, plan.at[k]);
      if (st.kind == EventKind::loss) {
        c.state_ = logits_mut();
        ops::LmHeadLoss::decode(c);
        continue;
      }
      Tr::Ops::visit(k, [&]<class E>() {
        using O = typename E::op;
        if constexpr (ops::Decodes<O, OpContext<T>>) O::decode(c);
        else if constexpr (requires { O::forward(c); }) O::forward(c);
        else throw std::logic_error("Generator: op '" + std::string(O::name) + "' has no forward kernel to decode with");
      });
    }
  }
};

}  // namespace host
}  // namespace headroom
