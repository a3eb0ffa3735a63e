// LLM.int8 (LLMInt8<>: bitsandbytes' load_in_8bit) on the host engine: the
// forward against the algorithm computed here in double from its definition
// (outlier columns, row-wise input codes, int32 sums); the weight format; the
// plan's scratch and weight bytes by hand; a batch beyond the plan's bound of
// outlier columns refused with nothing moved; training with it, checkpointed
// blocks included; the layer harness's gradient check where every column is
// an outlier (the forward is then smooth in x).
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"
#include "support/layer_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
#include <random>
#include <vector>

using namespace headroom;

namespace {
using headroom::test::ids;

// y (n, out) in double from the definition (core/quant_format.hpp, math/llm_int8.hpp),
// reading only the stored codes and row absmaxes of W.
struct Int8Reference {
  std::vector<double> y;
  std::vector<int> outliers;
};
Int8Reference int8_reference(const std::vector<float>& x, std::int64_t n, std::int64_t in, const std::int8_t* codes,
                             const float* absmax, std::int64_t out, double threshold) {
  Int8Reference r;
  std::vector<bool> outlier(static_cast<std::size_t>(in), false);
  for (std::int64_t j = 0; j < in; ++j)
    for (std::int64_t i = 0; i < n && threshold > 0; ++i)
      if (std::fabs(x[i * in + j]) >= threshold) outlier[j] = true;
  for (std::int64_t j = 0; j < in; ++j)
    if (outlier[j]) r.outliers.push_back(static_cast<int>(j));
  r.y.assign(static_cast<std::size_t>(n * out), 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    float s = 0;
    for (std::int64_t j = 0; j < in; ++j)
      if (!outlier[j]) s = std::max(s, std::fabs(x[i * in + j]));
    std::vector<long> q(static_cast<std::size_t>(in), 0);
    for (std::int64_t j = 0; j < in; ++j)
      if (!outlier[j] && s > 0) q[j] = std::lrint(x[i * in + j] * (127.0f / s));  // round half to even (default mode)
    for (std::int64_t o = 0; o < out; ++o) {
      long acc = 0;
      double extra = 0;
      for (std::int64_t j = 0; j < in; ++j) {
        acc += q[j] * codes[o * in + j];
        if (outlier[j]) extra += static_cast<double>(x[i * in + j]) * codes[o * in + j] * absmax[o] / 127.0;
      }
      r.y[i * out + o] = static_cast<double>(acc) * s * absmax[o] / (127.0 * 127.0) + extra;
    }
  }
  return r;
}

// One LLM.int8 weight (out, in) quantized from Gaussian rows, each its own scale.
struct Int8Weight {
  QuantDesc q;
  std::vector<std::uint8_t> codes, scales;
  math::QuantView view;
  std::vector<float> dense;
  Int8Weight(QuantDesc desc, std::int64_t out, std::int64_t in, std::uint32_t seed) : q(desc.for_row_length(in)) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    dense.resize(static_cast<std::size_t>(out * in));
    for (std::int64_t o = 0; o < out; ++o) {
      const float scale = 0.02f + 0.01f * static_cast<float>(o % 7);
      for (std::int64_t j = 0; j < in; ++j) dense[o * in + j] = scale * nd(g);
    }
    codes.resize(static_cast<std::size_t>(q.code_bytes(out * in)));
    scales.resize(static_cast<std::size_t>(q.scale_bytes(out * in)));
    view = math::QuantView{q, codes.data(), scales.data(), nullptr, out, in};
    host::quantize_matrix(view, dense.data());
  }
};

constexpr models::LlamaConfig cfg{48, 64, 128, 2, 4, 2, 64, false};
using Projections = On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>;
template <class Q>
using LlamaQ = models::Llama<cfg, Apply<Quantized<Q, LoRA<4>>, Projections>>;
template <class Q>
using LlamaQCkpt = models::Llama<cfg, Apply<Quantized<Q, LoRA<4>>, Projections>, Apply<Checkpointed<>, EveryBlock>>;
template <class M, class... Opts>
using Run = Train<M, Batch<2>, Seq<12>, Workers<2>, Opts...>;

// The norms before the projections get gain 10 on features 3, 17 and 40:
// those input columns then hold values beyond 6 (outlier columns).
template <class Tr>
void raise_gains(Tr& t, float gain = 10.0f) {
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    const std::string path = Tr::path_of(p);
    if (path.find("layernorm") == std::string::npos) continue;
    std::vector<float> w(t.weight(p), t.weight(p) + p.elements());
    w[3] = w[17] = w[40] = gain;
    t.set_dense(p, w);
  }
}

// Every parameter's and optimizer state's bytes.
template <class Tr>
std::vector<std::uint8_t> snapshot(const Tr& t) {
  std::vector<std::uint8_t> s;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    const auto* w = reinterpret_cast<const std::uint8_t*>(p.quant.kind == QuantKind::none ? static_cast<const void*>(t.weight(p))
                                                                                          : t.quant(p).codes);
    const std::int64_t bytes = p.quant.kind == QuantKind::none ? p.elements() * 4 : p.quant.code_bytes(p.elements());
    s.insert(s.end(), w, w + bytes);
    if (p.state >= 0) {
      const auto* st = reinterpret_cast<const std::uint8_t*>(t.state(p));
      s.insert(s.end(), st, st + Tr::config.optim.state_bytes(p.elements()));
    }
  }
  return s;
}
}  // namespace

TEST_CASE("LLM.int8: the weight is int8 with one absmax per row", "[host][int8]") {
  const Int8Weight w(LLMInt8<>::desc, 12, 96, 3);
  CHECK(w.q.block == 96);
  CHECK(w.codes.size() == 12 * 96);
  CHECK(w.scales.size() == 12 * 4);
  const auto* codes = reinterpret_cast<const std::int8_t*>(w.codes.data());
  for (std::int64_t o = 0; o < 12; ++o) {
    float amax = 0;
    for (std::int64_t j = 0; j < 96; ++j) amax = std::max(amax, std::fabs(w.dense[o * 96 + j]));
    CHECK(w.view.absmax()[o] == amax);
    int largest = 0;
    for (std::int64_t j = 0; j < 96; ++j) {
      const double v = w.dense[o * 96 + j] * 127.0 / amax;
      CHECK(std::abs(codes[o * 96 + j] - v) <= 0.5 + 1e-5);
      largest = std::max(largest, std::abs(static_cast<int>(codes[o * 96 + j])));
    }
    CHECK(largest == 127);
  }
}

TEST_CASE("LLM.int8: the forward is the algorithm's, outlier columns in f32", "[host][int8]") {
  constexpr std::int64_t n = 37, in = 96, out = 40;
  const Int8Weight w(LLMInt8<>::desc, out, in, 5);
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n * in));
  for (float& v : x) v = std::clamp(nd(g), -4.0f, 4.0f);
  // planted outlier columns: 5 and 50 hold several large values, 95 one; 70
  // holds exactly the threshold (|x| >= 6 counts), 71 the float just below it
  for (std::int64_t i = 0; i < n; i += 3) x[i * in + 5] = 7.5f + static_cast<float>(i % 5);
  for (std::int64_t i = 1; i < n; i += 4) x[i * in + 50] = -9.25f;
  x[20 * in + 95] = 40.0f;
  x[7 * in + 70] = -6.0f;
  x[8 * in + 71] = std::nextafter(6.0f, 0.0f);
  // row 11: only outlier columns hold anything (its int8 part is all zero)
  for (std::int64_t j = 0; j < in; ++j)
    if (j != 5 && j != 50) x[11 * in + j] = 0.0f;
  x[11 * in + 5] = 8.0f;

  const auto run = [&](const math::QuantView& view, int workers) {
    const math::Int8Scratch at = math::int8_scratch(n, in, view.q.max_outliers);
    std::vector<std::byte> scratch(static_cast<std::size_t>(at.bytes));
    std::vector<float> y(static_cast<std::size_t>(n * out));
    const std::int64_t found = host::llm_int8_forward<float>(x.data(), view, y.data(), n, {}, scratch.data(), workers);
    std::vector<int> list(reinterpret_cast<const std::int32_t*>(scratch.data() + at.outliers),
                          reinterpret_cast<const std::int32_t*>(scratch.data() + at.outliers) + std::min<std::int64_t>(found, view.q.max_outliers));
    return std::tuple{found, list, y};
  };
  const auto* codes = reinterpret_cast<const std::int8_t*>(w.codes.data());
  for (const double threshold : {6.0, 0.0}) {
    math::QuantView view = w.view;
    view.q.outlier_threshold = static_cast<float>(threshold);
    const Int8Reference ref = int8_reference(x, n, in, codes, view.absmax(), out, threshold);
    for (const int workers : {1, 2}) {
      const auto [found, list, y] = run(view, workers);
      INFO("threshold " << threshold << ", " << workers << " workers");
      CHECK(found == static_cast<std::int64_t>(ref.outliers.size()));
      CHECK(list == ref.outliers);
      if (threshold > 0) CHECK(list == std::vector<int>{5, 50, 70, 95});
      double largest = 0, worst = 0;
      for (std::size_t i = 0; i < y.size(); ++i) {
        largest = std::max(largest, std::fabs(ref.y[i]));
        worst = std::max(worst, std::fabs(y[i] - ref.y[i]));
      }
      INFO("largest |y| " << largest << ", worst |y - reference| " << worst);
      CHECK(worst <= 2e-6 * largest);  // f32 rounding of the epilogue; the int8 sums are exact
    }
  }
  // the decomposition matters here: every column in int8 is another product
  math::QuantView none = w.view;
  none.q.outlier_threshold = 0.0f;
  const auto with = std::get<2>(run(w.view, 1)), without = std::get<2>(run(none, 1));
  double diff = 0;
  for (std::size_t i = 0; i < with.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(with[i] - without[i])));
  CHECK(diff > 1e-2);

  // beyond the bound: the count, and y untouched
  math::QuantView tight = w.view;
  tight.q.max_outliers = 3;
  const math::Int8Scratch at = math::int8_scratch(n, in, 3);
  std::vector<std::byte> scratch(static_cast<std::size_t>(at.bytes));
  std::vector<float> y(static_cast<std::size_t>(n * out), 123.0f);
  CHECK(host::llm_int8_forward<float>(x.data(), tight, y.data(), n, {}, scratch.data(), 2) == 4);
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 123.0f; }));
}

TEST_CASE("LLM.int8: the plan's weight bytes and forward scratch, by hand", "[host][int8][plan]") {
  // N = 24 tokens. Weights: out x in int8 codes + out f32 absmaxes. Forward
  // scratch: xq (N, in) int8, row scales (N) f32, column marks (in) int32,
  // outlier list (K = min(256, in)) int32, 16 bytes of count (each part
  // aligned to 16). Backward: a dequantized panel of 64 rows per worker (f32).
  using Tr = host::Trainer<Run<LlamaQ<LLMInt8<>>>>;
  constexpr std::int64_t N = 24, D = 64, F = 128, kv = 32;
  const auto scratch = [&](std::int64_t in) { return N * in + N * 4 + in * 4 + std::min<std::int64_t>(256, in) * 4 + 16; };
  int forwards = 0, backwards = 0;
  for (const Step& s : Tr::sched.steps) {
    if (s.op != ops::Linear::name || s.param[0] < 0 || Tr::sched.params[s.param[0]].quant.kind == QuantKind::none) continue;
    const std::int64_t in = s.dim[ops::Linear::in.index];
    INFO(Tr::node_path(s.node, s.instance) << " " << name_of(s.kind) << ", in " << in);
    if (s.kind == EventKind::forward) {
      CHECK(s.scratch.bytes == scratch(in));
      ++forwards;
    }
    if (s.kind == EventKind::backward) {
      CHECK(s.scratch.bytes == 2 * 64 * in * 4);
      ++backwards;
    }
  }
  CHECK(forwards == 14);
  CHECK(backwards == 14);
  CHECK(scratch(D) == 2160);
  CHECK(scratch(F) == 4208);
  // per block: q, o (D x D), k, v (kv x D), gate, up (F x D), down (D x F);
  // every buffer starts on a 256-byte boundary (k's and v's 128 bytes of absmaxes take 256)
  const auto aligned = [](std::int64_t b) { return (b + 255) / 256 * 256; };
  const std::int64_t absmax = 2 * (3 * aligned(D * 4) + 2 * aligned(kv * 4) + 2 * aligned(F * 4));
  CHECK(absmax == 4608);
  CHECK(Tr::plan.bytes(Role::quant_scales) == absmax);
  using Blockwise = host::Trainer<Run<LlamaQ<Int8>>>;  // Int8: one absmax per 64 elements
  const std::int64_t blockwise = 2 * (2 * aligned(D * D / 64 * 4) + 2 * aligned(kv * D / 64 * 4) + 3 * aligned(F * D / 64 * 4));
  CHECK(Blockwise::plan.bytes(Role::quant_scales) == blockwise);
  CHECK(Tr::plan.bytes(Role::weights) - Blockwise::plan.bytes(Role::weights) == 0);  // the same int8 codes
}

TEST_CASE("LLM.int8: a batch beyond the bound of outlier columns is refused, nothing moves", "[host][int8]") {
  using Tight = host::Trainer<Run<LlamaQ<LLMInt8<Ratio<6>, 2>>>>;
  const auto tok = ids(24, 1, 48), tgt = ids(24, 2, 48);
  Tight t({.seed = 3, .lr = 1e-2});
  t.step(tok, tgt);  // gains 1: no outlier column
  raise_gains(t);    // three outlier columns (3, 17, 40) into q, k, v of block 0
  const std::vector<std::uint8_t> before = snapshot(t);
  try {
    t.step(tok, tgt);
    FAIL("the step ran");
  } catch (const outlier_bound_exceeded& e) {
    INFO(e.what());
    CHECK(e.layer() == "layers.0.self_attn.q_proj");
    CHECK(e.found() == 3);
    CHECK(e.bound() == 2);
    CHECK(e.threshold() == 6.0f);
    CHECK(std::string(e.what()).find("3 outlier columns") != std::string::npos);
  }
  CHECK(t.steps_done() == 1);
  CHECK(snapshot(t) == before);
  // the trainer goes on: gains back to 1, the next step is that of a twin that never met the batch
  raise_gains(t, 1.0f);
  Tight twin({.seed = 3, .lr = 1e-2});
  twin.step(tok, tgt);
  const auto a = t.step(tok, tgt), b = twin.step(tok, tgt);
  CHECK(a.loss == b.loss);
  CHECK(snapshot(t) == snapshot(twin));
}

TEST_CASE("LLM.int8: training with outlier columns, checkpointed blocks recompute it to the bit", "[host][int8]") {
  using Tr = host::Trainer<Run<LlamaQ<LLMInt8<>>>>;
  using Ck = host::Trainer<Run<LlamaQCkpt<LLMInt8<>>>>;
  using NoSplit = host::Trainer<Run<LlamaQ<LLMInt8<Ratio<0>>>>>;  // every column in int8
  const auto tok = ids(24, 5, 48), tgt = ids(24, 6, 48);
  Tr t({.seed = 7, .lr = 1e-2});
  Ck c({.seed = 7, .lr = 1e-2});
  NoSplit plain({.seed = 7, .lr = 1e-2});
  raise_gains(t);
  raise_gains(c);
  raise_gains(plain);
  // the same stored weights (the same seed quantizes the same values)
  CHECK(snapshot(t) == snapshot(c));
  double first = 0, last = 0;
  for (int s = 0; s < 8; ++s) {
    const auto a = t.step(tok, tgt), b = c.step(tok, tgt), p = plain.step(tok, tgt);
    INFO("step " << s + 1);
    CHECK(a.loss == b.loss);
    CHECK(a.grad_norm == b.grad_norm);
    if (s == 0) CHECK(a.loss != p.loss);  // the decomposition changes the product
    if (s == 0) first = a.loss;
    last = a.loss;
  }
  CHECK(last < first);
  CHECK(snapshot(t) == snapshot(c));
  // evaluation runs the same forward
  CHECK(t.evaluate(tok, tgt) == c.evaluate(tok, tgt));
}

TEST_CASE("LLM.int8: gradient check where every column is an outlier", "[host][int8][harness]") {
  // threshold 2^-20: every input column is an outlier, so the forward is the
  // f32 product of the dequantized weight (smooth in x): the harness's
  // central differences check the input's and the adapter's gradients
  using Everything = LLMInt8<Ratio<1, 1048576>, 64>;
  check_layer<Quantized<Everything, Linear<64, 16>>>();
  check_layer<Quantized<Everything, LoRA<4, Linear<64, 16, true>>>>();
}

TEST_CASE("LLM.int8 in a bf16 run tracks the f32 run", "[host][int8][bf16]") {
  using F32 = host::Trainer<Run<LlamaQ<LLMInt8<>>>>;
  using B16 = host::Trainer<Run<LlamaQ<LLMInt8<>>, Precision<BF16>>>;
  const auto tok = ids(24, 8, 48), tgt = ids(24, 9, 48);
  F32 a({.seed = 2, .lr = 1e-2});
  B16 b({.seed = 2, .lr = 1e-2});
  raise_gains(a);
  raise_gains(b);
  for (int s = 0; s < 4; ++s) {
    const double la = a.step(tok, tgt).loss, lb = b.step(tok, tgt).loss;
    INFO("step " << s + 1 << ": f32 " << la << ", bf16 " << lb);
    CHECK(std::abs(la - lb) < 0.02 * la);
  }
}
