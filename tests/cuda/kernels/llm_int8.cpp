// LLM.int8 on the CUDA engine (cuda/kernels/llm_int8.cuh):
//   - the forward kernels against host::llm_int8_forward on the same inputs
//     and codes: the outlier list and count, the quantized rows and their
//     scales, and y bit for bit (f32 and bf16 storage, with and without bias,
//     threshold 6 with a few and with many planted outlier columns,
//     threshold 0; shapes not multiples of the 64 x 64 tiles, a row length
//     not a multiple of 4); a batch beyond the bound: the count, the list's
//     first entries, a NaN output and the control block's stop;
//   - cuda::Trainer against host::Trainer on a small Llama with
//     Quantized<LLMInt8<>, LoRA<4>> on q_proj, v_proj and down_proj
//     (checkpointed blocks: the forward runs again in the recompute), whose
//     embeddings of three tokens each hold one dominant feature, so that a
//     batch with them has exactly those input columns of the first block's
//     q_proj / v_proj beyond the threshold (|x| ~ 8 after RMSNorm);
//   - a batch beyond LLMInt8<Ratio<6>, 2>'s bound: step() throws
//     outlier_bound_exceeded as host::Trainer does (layer, found, bound),
//     updates nothing, and the next batch trains; eagerly and replayed from a
//     captured CUDA graph.
#include "../support/kernel_test.hpp"
#include "../support/trainer_test.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <headroom/cuda/kernels/llm_int8.cuh>
#include <headroom/headroom.hpp>
#include <headroom/host/kernels/linear.hpp>
#include <headroom/train/cuda/trainer.cuh>
#include <headroom/train/host/trainer.hpp>

namespace llm_int8_test {

using namespace headroom;
using cuda_test::Buffer;
using i64 = std::int64_t;

// ---- the forward kernels ----------------------------------------------------------------------------------------

struct Shape {
  i64 n, in, out;
};
// rows over one tile; a row length that is not a multiple of 4 (byte loads);
// one of 600 (the column list's runs hold 3 columns each)
constexpr Shape shapes[] = {{37, 192, 96}, {70, 128, 130}, {5, 70, 40}, {9, 600, 40}};

// Input columns scaled by 10 (|x| up to 10: each row beyond 6 with
// probability 0.4): a few, or every 4th (more than one 32-column chunk of the
// GEMM's epilogue), or five of them.
enum class Planted { few, many, five };
std::vector<i64> planted_columns(Planted p, i64 in) {
  std::vector<i64> c;
  if (p == Planted::many)
    for (i64 j = 1; j < in; j += 4) c.push_back(j);
  else if (p == Planted::five)
    c = {2, 11, 30, 31, 60};
  else
    c = {5, 17, 63};
  c.erase(std::remove_if(c.begin(), c.end(), [&](i64 j) { return j >= in; }), c.end());
  return c;
}

// A row-wise int8 weight quantized on the host (host::quantize_rows), and the same bytes on the device.
struct Int8Weight {
  std::vector<std::uint8_t> codes, scales;
  math::QuantView host;
  Buffer<std::uint8_t> device_codes, device_scales;
  math::QuantView device;
  Int8Weight(QuantDesc q, i64 out, i64 in, std::uint32_t seed)
      : codes(q.code_bytes(out * in)), scales(q.scale_bytes(out * in)), host{q, codes.data(), scales.data(), nullptr, out, in},
        device_codes(codes.size()), device_scales(scales.size()) {
    std::vector<float> w = cuda_test::pattern(out * in, seed);
    for (i64 o = 0; o < out; ++o)  // rows of different absmaxes
      for (i64 j = 0; j < in; ++j) w[o * in + j] *= 0.25f + 0.5f * static_cast<float>(o % 7);
    host::quantize_rows(host, 0, out, w.data(), nullptr);
    device_codes.upload(codes);
    device_scales.upload(scales);
    device = math::QuantView{q, device_codes.get(), device_scales.get(), nullptr, out, in};
  }
};

// The host engine's storage type for S.
template <class S>
using HostT = std::conditional_t<std::is_same_v<S, float>, float, host::bf16>;
template <class S>
std::vector<HostT<S>> host_values(const std::vector<float>& v) {
  std::vector<HostT<S>> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = host::narrow<HostT<S>>(v[i]);  // exact: v is rounded to S
  return h;
}
template <class S>
std::vector<float> host_floats(const std::vector<HostT<S>>& h) {
  std::vector<float> v(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) v[i] = host::widen(h[i]);
  return v;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What one forward left: y, the scratch's parts and the control block.
struct Result {
  std::vector<float> y, row_scale;
  std::vector<std::int8_t> xq;
  std::vector<std::int32_t> outliers;
  std::int32_t found = 0;
};
// found: the outlier columns found (< 0: read from the scratch's count[0])
Result read_scratch(const std::vector<std::uint8_t>& bytes, i64 n, i64 in, i64 bound, i64 found = -1) {
  const math::Int8Scratch at = math::int8_scratch(n, in, bound);
  Result r;
  if (found >= 0) r.found = static_cast<std::int32_t>(found);
  else std::memcpy(&r.found, bytes.data() + at.count, 4);
  const i64 listed = std::min<i64>(r.found, bound);
  r.outliers.resize(static_cast<std::size_t>(listed));
  std::memcpy(r.outliers.data(), bytes.data() + at.outliers, static_cast<std::size_t>(listed) * 4);
  if (r.found <= bound) {
    r.xq.resize(static_cast<std::size_t>(n * in));
    std::memcpy(r.xq.data(), bytes.data() + at.xq, r.xq.size());
    r.row_scale.resize(static_cast<std::size_t>(n));
    std::memcpy(r.row_scale.data(), bytes.data() + at.row_scale, r.row_scale.size() * 4);
  }
  return r;
}

// The CUDA forward of x (N, In), rounded to S, with its scratch garbage-filled first.
template <class S>
Result cuda_forward(const std::vector<float>& x, const Int8Weight& w, const std::vector<float>& bias, i64 n,
                    cuda::UpdateControl* control, int schedule_step) {
  const i64 in = w.device.cols, out = w.device.rows;
  const math::Int8Scratch at = math::int8_scratch(n, in, w.device.q.max_outliers);
  Buffer<S> dx(cuda_test::to_storage<S>(x));
  Buffer<S> dbias(bias.empty() ? std::vector<S>(1) : cuda_test::to_storage<S>(bias));
  Buffer<S> dy(cuda_test::to_storage<S>(cuda_test::pattern(n * out, 5, 100.0f)));  // overwritten
  std::vector<std::uint8_t> garbage(static_cast<std::size_t>(at.bytes));
  for (std::size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<std::uint8_t>(i * 37 + 11);
  Buffer<std::uint8_t> scratch(garbage);
  cuda::llm_int8_forward<S>(dx.get(), w.device, bias.empty() ? nullptr : dbias.get(), dy.get(), n,
                            reinterpret_cast<std::byte*>(scratch.get()), control, schedule_step, nullptr);
  Result r = read_scratch(scratch.download(), n, in, w.device.q.max_outliers);
  r.y = cuda_test::to_floats(dy.download());
  return r;
}

// host::llm_int8_forward on the same values (one worker).
template <class S>
Result host_forward(const std::vector<float>& x, const Int8Weight& w, const std::vector<float>& bias, i64 n) {
  const i64 in = w.host.cols, out = w.host.rows;
  const std::vector<HostT<S>> hx = host_values<S>(x), hbias = host_values<S>(bias);
  std::vector<HostT<S>> hy(static_cast<std::size_t>(n * out));
  std::vector<std::uint8_t> scratch(static_cast<std::size_t>(math::int8_scratch(n, in, w.host.q.max_outliers).bytes));
  host::Epilogue<HostT<S>> ep{};
  ep.bias = bias.empty() ? nullptr : hbias.data();
  const i64 found = host::llm_int8_forward(hx.data(), w.host, hy.data(), n, ep, reinterpret_cast<std::byte*>(scratch.data()), 1);
  Result r = read_scratch(scratch, n, in, w.host.q.max_outliers, found);  // (the host returns the count)
  r.y = host_floats<S>(hy);
  return r;
}

template <class S>
void check_forward(QuantDesc format, Planted planted) {
  for (const Shape& s : shapes)
    for (const bool with_bias : {false, true}) {
      const QuantDesc q = format.for_row_length(s.in);
      INFO("threshold " << q.outlier_threshold << " bound " << q.max_outliers << " n=" << s.n << " in=" << s.in
                        << " out=" << s.out << " bias=" << with_bias << " planted=" << static_cast<int>(planted));
      const Int8Weight w(q, s.out, s.in, 31);
      std::vector<float> x = cuda_test::pattern(s.n * s.in, 32);
      for (const i64 j : planted_columns(planted, s.in))
        for (i64 i = 0; i < s.n; ++i) x[i * s.in + j] *= 10.0f;
      x = cuda_test::rounded<S>(x);
      const std::vector<float> bias = with_bias ? cuda_test::rounded<S>(cuda_test::pattern(s.out, 33, 0.5f)) : std::vector<float>{};

      const Result want = host_forward<S>(x, w, bias, s.n);
      const Result got = cuda_forward<S>(x, w, bias, s.n, nullptr, -1);
      CHECK(got.found == want.found);
      CHECK(got.outliers == want.outliers);
      CHECK(got.xq == want.xq);
      CHECK(same_bits(got.row_scale, want.row_scale));
      CHECK(same_bits(got.y, want.y));
      if (q.decomposed()) CHECK(want.found >= static_cast<i64>(planted_columns(planted, s.in).size()));
      else CHECK(want.found == 0);
    }
}

TEMPLATE_TEST_CASE("cuda.llm_int8: the forward matches host::llm_int8_forward bit for bit (outlier list, codes, y)",
                   "[cuda][quant][llm_int8]", float, cuda::bf16) {
  using S = TestType;
  SECTION("threshold 6, a few outlier columns") { check_forward<S>(LLMInt8<>::desc, Planted::few); }
  SECTION("threshold 6, more outlier columns than one chunk of the epilogue") {
    check_forward<S>(LLMInt8<>::desc, Planted::many);
  }
  SECTION("threshold 0: every column in int8") { check_forward<S>(LLMInt8<Ratio<0>>::desc, Planted::few); }
}

TEMPLATE_TEST_CASE("cuda.llm_int8: a batch beyond the bound: the count, the list's first columns, NaN out, the step stopped",
                   "[cuda][quant][llm_int8]", float, cuda::bf16) {
  using S = TestType;
  const Shape s{37, 192, 96};
  const QuantDesc q = LLMInt8<Ratio<6>, 3>::desc.for_row_length(s.in);
  const Int8Weight w(q, s.out, s.in, 41);
  std::vector<float> x = cuda_test::pattern(s.n * s.in, 42);
  for (const i64 j : planted_columns(Planted::five, s.in))
    for (i64 i = 0; i < s.n; ++i) x[i * s.in + j] *= 10.0f;
  x = cuda_test::rounded<S>(x);

  const Result want = host_forward<S>(x, w, {}, s.n);
  REQUIRE(want.found == 5);
  Buffer<cuda::UpdateControl> control(std::vector<cuda::UpdateControl>{cuda::UpdateControl{}});
  const Result got = cuda_forward<S>(x, w, {}, s.n, control.get(), 7);
  CHECK(got.found == 5);
  CHECK(got.outliers == want.outliers);  // the first 3 of them
  CHECK(got.outliers == std::vector<std::int32_t>{2, 11, 30});
  CHECK(std::all_of(got.y.begin(), got.y.end(), [](float v) { return std::isnan(v); }));
  cuda::UpdateControl c = control.download()[0];
  CHECK(c.skip != 0.0f);
  CHECK(c.outliers_found == 5);
  CHECK(c.outlier_step == 7);

  // a second refused projection in the same step keeps the first one's record
  cuda_forward<S>(x, w, {}, s.n, control.get(), 9);
  c = control.download()[0];
  CHECK(c.outliers_found == 5);
  CHECK(c.outlier_step == 7);
  // a batch within the bound leaves the control block as it is
  Buffer<cuda::UpdateControl> fresh(std::vector<cuda::UpdateControl>{cuda::UpdateControl{}});
  std::vector<float> calm = cuda_test::rounded<S>(cuda_test::pattern(s.n * s.in, 43));
  const Result ok = cuda_forward<S>(calm, w, {}, s.n, fresh.get(), 7);
  CHECK(ok.found == 0);
  c = fresh.download()[0];
  CHECK(c.skip == 0.0f);
  CHECK(c.outliers_found == 0);
  CHECK(c.outlier_step == -1);
}

TEST_CASE("cuda.llm_int8: refuses what is not an LLM.int8 weight, and a missing scratch", "[cuda][quant][llm_int8]") {
  std::vector<std::uint8_t> codes(64 * 4), scales(64 * 4);
  std::vector<float> x(64), y(4);
  std::vector<std::byte> scratch(static_cast<std::size_t>(math::int8_scratch(1, 64, 64).bytes));
  const math::QuantView block_int8{Int8::desc, codes.data(), scales.data(), nullptr, 4, 64};
  CHECK_THROWS_AS(cuda::llm_int8_forward<float>(x.data(), block_int8, nullptr, y.data(), 1, scratch.data(), nullptr, -1, nullptr),
                  std::invalid_argument);
  const math::QuantView row_int8{LLMInt8<>::desc.for_row_length(64), codes.data(), scales.data(), nullptr, 4, 64};
  CHECK_THROWS_AS(cuda::llm_int8_forward<float>(x.data(), row_int8, nullptr, y.data(), 1, nullptr, nullptr, -1, nullptr),
                  std::invalid_argument);
}

// ---- training ---------------------------------------------------------------------------------------------------

constexpr models::LlamaConfig int8_llama{64, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions

// Tokens whose embeddings hold one dominant feature each (1 there, ~1e-3
// elsewhere): after RMSNorm (gain 1) that feature is ~8 = sqrt(64), beyond
// the threshold 6, and the others far below it; the other tokens'
// embeddings are random (|x| ~ 1 after the norm). (Beside the adapters
// everything is frozen, the embeddings too: the planted rows stay.)
constexpr std::int32_t planted_tokens[] = {5, 9, 13};
constexpr i64 planted_features[] = {3, 17, 40};

// Every dense parameter's values (cuda: download_weight; host: weight()), by path.
template <class Trainer>
std::vector<float> values(const Trainer& t, const ParamSlot& p) {
  if constexpr (requires { t.download_weight(p); }) return t.download_weight(p);
  else return std::vector<float>(t.weight(p), t.weight(p) + p.elements());
}

template <class Trainer>
void plant_features(Trainer& t) {
  const ParamSlot& e = *Trainer::find("embed_tokens.weight");
  std::vector<float> table = values(t, e);
  const std::vector<float> small = cuda_test::pattern(static_cast<std::size_t>(e.cols), 51, 1e-3f);
  for (int k = 0; k < 3; ++k) {
    float* row = table.data() + planted_tokens[k] * e.cols;
    std::copy(small.begin(), small.end(), row);
    row[planted_features[k]] = 1.0f;
  }
  if constexpr (requires { t.download_weight(e); }) t.upload_weight(e, table);
  else std::copy(table.begin(), table.end(), t.weight(e));
}

// A batch of the step `seed`: random tokens (none of the planted ones), then
// the first `planted` planted tokens at a few positions (the outlier columns
// of the first block's q_proj / v_proj input: planted_features[0 .. planted)).
struct TokenBatch {
  std::vector<std::int32_t> tokens, targets;
};
template <class Trainer>
TokenBatch batch(std::uint32_t seed, int planted) {
  const std::size_t n = static_cast<std::size_t>(Trainer::tokens_per_step);
  std::vector<std::int32_t> stream(n + 1);
  std::uint32_t s = seed * 2654435761u + 7u;
  for (auto& t : stream) {
    s = s * 1664525u + 1013904223u;
    t = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(int8_llama.vocab));
    if (std::find(std::begin(planted_tokens), std::end(planted_tokens), t) != std::end(planted_tokens)) t = 0;
  }
  for (int k = 0; k < planted; ++k) stream[static_cast<std::size_t>(3 + 7 * k)] = planted_tokens[k];
  return {std::vector<std::int32_t>(stream.begin(), stream.end() - 1), std::vector<std::int32_t>(stream.begin() + 1, stream.end())};
}

// Host against CUDA, f32: the LLM.int8 forward is the same operations on
// both engines (above), so the runs differ only by the summation orders of
// the other ops (norms, attention, the dense GEMMs): losses and norms by
// ~1e-7 relative, the adapters by up to ~4e-5 of their largest value (an
// input code that rounds the other way). The tolerances leave a margin
// over that and stay well below what the plain dequantized product
// (quant_linear_forward) gives in LLM.int8's place: losses 2e-5 .. 1e-4
// apart, norms 7e-4, adapters up to 3e-2.
constexpr double loss_rel = 1e-5, norm_rel = 1e-4, weight_rel = 3e-4;

// The CUDA trainer's dense parameters (adapters included) against the host's, by path.
template <class H, class C>
void check_weights_match(const host::Trainer<H>& h, const cuda::Trainer<C>& c, double rtol) {
  int adapters = 0;
  for (std::size_t k = 0; k < cuda::Trainer<C>::param_count; ++k) {
    const ParamSlot& p = cuda::Trainer<C>::param(k);
    if (p.quant.kind != QuantKind::none) continue;
    const std::string path = cuda::Trainer<C>::path_of(p);
    const ParamSlot* q = host::Trainer<H>::find(path);
    REQUIRE(q != nullptr);
    const std::vector<float> got = values(c, p), want = values(h, *q);
    float scale = 0;
    for (float v : want) scale = std::max(scale, std::fabs(v));
    INFO(path << ": largest |value| " << scale);
    CHECK(cuda_test::worst_ratio(got, want, rtol * scale, rtol) <= 1.0);
    if (path.find("lora") != std::string::npos) ++adapters;
  }
  CHECK(adapters == 2 * 3 * int8_llama.layers);  // A and B of q_proj, v_proj and down_proj in every block
}

// Checkpointed blocks: the recompute runs the LLM.int8 forward again, in its scratch.
TEST_CASE("cuda::Trainer f32 matches host::Trainer: LLM.int8 + LoRA with outlier columns (checkpointed blocks)",
          "[trainer][llm_int8]") {
  using M = models::Llama<int8_llama, Apply<Quantized<LLMInt8<>, LoRA<4>>, On<q_proj, v_proj, down_proj>>,
                          Apply<Checkpointed<>, EveryBlock>>;
  using H = Train<M, Batch<2>, Seq<16>>;
  using C = Train<M, Batch<2>, Seq<16>, OnCuda>;
  static_assert(plan<C>().flops_recompute > 0);
  host::Trainer<H> h(cuda_test::trainer_options());
  cuda::Trainer<C> c(cuda_test::trainer_options());
  plant_features(h);
  plant_features(c);
  const ParamSlot* q = cuda::Trainer<C>::find("layers.0.self_attn.q_proj.weight");
  REQUIRE(q != nullptr);
  CHECK(q->quant.decomposed());
  CHECK(q->quant.max_outliers == 64);  // min(256, in_features)
  for (int i = 0; i < 3; ++i) {
    const TokenBatch b = batch<cuda::Trainer<C>>(17u + static_cast<std::uint32_t>(i), 3);
    const StepStats a = h.step(b.tokens, b.targets);
    const StepStats g = c.step(b.tokens, b.targets);
    INFO("step " << i + 1 << ": host loss " << a.loss << " cuda " << g.loss << "; host norm " << a.grad_norm << " cuda "
                 << g.grad_norm);
    CHECK(std::fabs(a.loss - g.loss) <= loss_rel * std::fabs(a.loss));
    CHECK(std::fabs(a.grad_norm - g.grad_norm) <= norm_rel * std::fabs(a.grad_norm) + 1e-7);
  }
  check_weights_match(h, c, weight_rel);
}

// The dense parameters and optimizer states of a CUDA trainer.
template <class Trainer>
std::vector<std::vector<float>> dense_weights(const Trainer& t) {
  std::vector<std::vector<float>> w;
  for (std::size_t k = 0; k < Trainer::param_count; ++k)
    if (Trainer::param(k).quant.kind == QuantKind::none) w.push_back(t.download_weight(Trainer::param(k)));
  return w;
}
template <class Trainer>
std::vector<std::vector<std::byte>> states(const Trainer& t) {
  std::vector<std::vector<std::byte>> s;
  for (std::size_t k = 0; k < Trainer::param_count; ++k) s.push_back(t.download_state(Trainer::param(k)));
  return s;
}

// Steps of batches with 2 planted tokens (within LLMInt8<Ratio<6>, 2>'s
// bound), then one with 3, then 2 again: the third step is refused by both
// engines alike and the fourth trains like the host's.
TEST_CASE("cuda::Trainer: a batch beyond LLM.int8's outlier bound throws outlier_bound_exceeded and updates nothing",
          "[trainer][llm_int8]") {
  using M = models::Llama<int8_llama, Apply<Quantized<LLMInt8<Ratio<6>, 2>, LoRA<4>>, On<q_proj, v_proj, down_proj>>>;
  using H = Train<M, Batch<2>, Seq<16>>;
  using C = Train<M, Batch<2>, Seq<16>, OnCuda>;
  for (const bool graph : {false, true}) {
    INFO("cuda_graph = " << graph);
    TrainOptions o = cuda_test::trainer_options();
    o.cuda_graph = graph;
    host::Trainer<H> h(cuda_test::trainer_options());
    cuda::Trainer<C> c(o);
    plant_features(h);
    plant_features(c);
    const int planted[] = {2, 2, 3, 2};
    for (int i = 0; i < 4; ++i) {
      INFO("step " << i + 1 << " with " << planted[i] << " planted tokens");
      const TokenBatch b = batch<cuda::Trainer<C>>(31u + static_cast<std::uint32_t>(i), planted[i]);
      if (planted[i] <= 2) {
        const StepStats a = h.step(b.tokens, b.targets);
        const StepStats g = c.step(b.tokens, b.targets);
        CHECK(std::fabs(a.loss - g.loss) <= loss_rel * std::fabs(a.loss));
        CHECK(std::fabs(a.grad_norm - g.grad_norm) <= norm_rel * std::fabs(a.grad_norm) + 1e-7);
        CHECK(g.step == a.step);
        continue;
      }
      std::string host_layer;
      std::int64_t host_found = -1;
      try {
        h.step(b.tokens, b.targets);
      } catch (const outlier_bound_exceeded& e) {
        host_layer = e.layer();
        host_found = e.found();
      }
      REQUIRE(host_found == 3);
      const auto weights_before = dense_weights(c);
      const auto states_before = states(c);
      const int done = c.steps_done();
      bool thrown = false;
      try {
        c.step(b.tokens, b.targets);
      } catch (const outlier_bound_exceeded& e) {
        thrown = true;
        CHECK(e.layer() == host_layer);
        CHECK(e.layer() == "layers.0.self_attn.q_proj");
        CHECK(e.found() == 3);
        CHECK(e.bound() == 2);
        CHECK(e.threshold() == 6.0f);
        CHECK_THAT(e.what(), Catch::Contains("layers.0.self_attn.q_proj") && Catch::Contains("3 outlier columns"));
      }
      REQUIRE(thrown);
      CHECK(c.steps_done() == done);
      const auto weights_after = dense_weights(c);
      CHECK(weights_after.size() == weights_before.size());
      for (std::size_t k = 0; k < weights_before.size(); ++k) CHECK(same_bits(weights_after[k], weights_before[k]));
      CHECK(states(c) == states_before);
    }
    CHECK(c.graph_captured() == graph);
    check_weights_match(h, c, weight_rel);
    // evaluate() and forward_backward() refuse the batch too
    const TokenBatch bad = batch<cuda::Trainer<C>>(40u, 3);
    CHECK_THROWS_AS(c.evaluate(bad.tokens, bad.targets), outlier_bound_exceeded);
    CHECK_THROWS_AS(c.forward_backward(bad.tokens, bad.targets), outlier_bound_exceeded);
    const TokenBatch good = batch<cuda::Trainer<C>>(41u, 2);
    const double want = h.evaluate(good.tokens, good.targets);
    CHECK(std::fabs(c.evaluate(good.tokens, good.targets) - want) <= loss_rel * want);
  }
}

}  // namespace llm_int8_test
