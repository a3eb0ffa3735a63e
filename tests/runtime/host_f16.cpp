// Precision<F16> on the host engine: IEEE half weights, activations and
// gradients with f32 master weights, statistics and sums, and its loss
// scaled (train/loss_scaling.hpp: automatic for F16).
//
// - host::f16's conversions against the CPU's own (F16C's vcvtps2ph with
//   round-to-nearest-even, and vcvtph2ps): every one of the 65536 halves
//   widened, and 2^22 floats spread over every exponent narrowed, bit for bit.
// - The plan: 2 B per stored weight and gradient element, as bf16's.
// - An F16 run tracks the f32 run of the same model, seed and batches (fp16
//   keeps 11 significant bits: within 1 % per step over 20 steps) and
//   learns as much; the stored weights are the masters rounded to f16.
// - Why the loss is scaled: over 16 micro-batches of 128 tokens the
//   gradients below fp16's smallest normal (2^-14) of the unscaled run are
//   fp16 subnormals; scaled by 2^16 they are normal, and nearer the f32
//   run's on most elements.
#include <catch2/catch.hpp>

#include <cpuid.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
#include <immintrin.h>
#include <vector>

using namespace headroom;

namespace {

__attribute__((target("f16c"))) std::uint16_t cpu_narrow(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float cpu_widen(std::uint16_t h) { return _cvtsh_ss(h); }

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

bool cpu_has_f16c() {  // CPUID leaf 1, ECX bit 29
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
}

constexpr models::LlamaConfig cfg{64, 64, 128, 2, 4, 2, 64, false};
using Model = models::Llama<cfg>;

std::vector<std::int32_t> pattern(std::size_t n, int vocab, int shift) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((i * 7 + shift + i / 5) % vocab);
  return v;
}

}  // namespace

TEST_CASE("host::f16: the conversions are the CPU's, bit for bit", "[f16]") {
  REQUIRE(cpu_has_f16c());  // every x86-64 CPU since 2012; the reference of this test
  long widened_bad = 0, narrowed_bad = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float ours = static_cast<float>(host::f16{static_cast<std::uint16_t>(h)}), theirs = cpu_widen(static_cast<std::uint16_t>(h));
    widened_bad += std::isnan(theirs) ? !std::isnan(ours) : bits(ours) != bits(theirs);
  }
  // 2^22 floats: a stride through all 2^32 bit patterns (every exponent, both signs, NaNs and infinities),
  // plus every float near the edges that matter (ties at 65520, the subnormal boundary 2^-14, 2^-25)
  std::vector<float> xs;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 1021) xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  for (float edge : {65504.0f, 65520.0f, 65536.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25)})
    for (int d = -4096; d <= 4096; ++d) {
      xs.push_back(std::bit_cast<float>(bits(edge) + static_cast<std::uint32_t>(d)));
      xs.push_back(-xs.back());
    }
  for (float x : xs) {
    const std::uint16_t ours = host::to_f16(x).bits, theirs = cpu_narrow(x);
    // a NaN: both quiet NaNs of the same sign (the payload's top bits may differ)
    if (std::isnan(x)) narrowed_bad += (ours & 0xfe00u) != (theirs & 0xfe00u) || (ours & 0x7c00u) != 0x7c00u;
    else narrowed_bad += ours != theirs;
  }
  INFO(xs.size() << " floats narrowed");
  CHECK(widened_bad == 0);
  CHECK(narrowed_bad == 0);
}

TEST_CASE("Precision<F16> on the host: the plan, and a run that tracks f32 with its loss scaled", "[f16]") {
  using R16 = Train<Model, Batch<4>, Seq<32>, AdamW, Precision<F16>>;
  using R32 = Train<Model, Batch<4>, Seq<32>, AdamW>;
  using BF = Train<Model, Batch<4>, Seq<32>, AdamW, Precision<BF16>>;
  // the same bytes as bf16, role by role
  static_assert(plan<R16>().peak_bytes() == plan<BF>().peak_bytes());
  static_assert(plan<R16>().bytes(Role::weights) == plan<BF>().bytes(Role::weights));
  static_assert(plan<R16>().bytes(Role::grads) == plan<BF>().bytes(Role::grads));
  host::Trainer<R16> a({.lr = 1e-3, .warmup_steps = 2});
  host::Trainer<R32> b({.lr = 1e-3, .warmup_steps = 2});
  REQUIRE(a.scales_loss());
  REQUIRE_FALSE(b.scales_loss());
  double first = 0, last = 0, first32 = 0, last32 = 0;
  for (int s = 0; s < 20; ++s) {
    const auto tok = pattern(128, 64, s), tgt = pattern(128, 64, s + 1);
    const StepStats x = a.step(tok, tgt), y = b.step(tok, tgt);
    INFO("step " << s << " f16 loss " << x.loss << " f32 loss " << y.loss << "; norms " << x.grad_norm << " " << y.grad_norm);
    CHECK_FALSE(x.skipped);
    CHECK(x.loss_scale == 65536.0f);
    CHECK(std::abs(x.loss - y.loss) <= 0.01 * y.loss);
    if (s == 0) CHECK(std::abs(x.grad_norm - y.grad_norm) <= 0.01 * y.grad_norm);
    if (s == 0) first = x.loss, first32 = y.loss;
    last = x.loss;
    last32 = y.loss;
  }
  CHECK(first32 - last32 > 0.05);
  CHECK(first - last >= 0.9 * (first32 - last32));
  // the stored weights are the masters rounded to f16, to the bit
  for (std::size_t k = 0; k < host::Trainer<R16>::param_count; ++k) {
    const ParamSlot& p = host::Trainer<R16>::param(k);
    const float* m = a.master(p);
    REQUIRE(m != nullptr);
    long off = 0;
    for (std::int64_t i = 0; i < p.elements(); ++i) off += a.weight(p)[i] != host::to_f16(m[i]);
    INFO(host::Trainer<R16>::path_of(p));
    CHECK(off == 0);
  }
}

TEST_CASE("Precision<F16> on the host: the scale keeps the gradients fp16 would flush", "[f16][loss_scaling]") {
  // 16 micro-batches of 128 tokens: each one's dlogits are softmax / 2048, ~8e-6 per class at the start,
  // fp16 subnormals unscaled (below 2^-14, spaced 2^-24 apart)
  using R16 = Train<Model, Batch<4>, Seq<32>, Accumulate<16>, AdamW, Precision<F16>>;
  using R32 = Train<Model, Batch<4>, Seq<32>, Accumulate<16>, AdamW>;
  TrainOptions o{.seed = 11, .lr = 1e-3};
  host::Trainer<R32> h(o);
  host::Trainer<R16> scaled(o);
  o.loss_scaling.mode = LossScaling::off;
  host::Trainer<R16> plain(o);
  const auto tok = pattern(2048, 64, 3), tgt = pattern(2048, 64, 4);
  h.step(tok, tgt);
  const StepStats sx = scaled.step(tok, tgt), px = plain.step(tok, tgt);
  CHECK(sx.loss_scale == 65536.0f);
  CHECK(px.loss_scale == 1.0f);
  CHECK(sx.loss == px.loss);  // the forward does not see the scale
  // the gradient buffers keep the step's sums (S x g in the scaled run)
  long small = 0, flushed_plain = 0, flushed_scaled = 0, closer = 0, farther = 0;
  for (std::size_t k = 0; k < host::Trainer<R16>::param_count; ++k) {
    const ParamSlot& p = host::Trainer<R16>::param(k);
    const float* ref = h.grad(host::Trainer<R32>::param(k));
    for (std::int64_t i = 0; i < p.elements(); ++i) {
      const double r = ref[i], s = host::to_float(scaled.grad(p)[i]) / 65536.0, q = host::to_float(plain.grad(p)[i]);
      if (r == 0 || std::fabs(r) >= std::ldexp(1.0, -14)) continue;
      ++small;
      flushed_plain += q == 0;
      flushed_scaled += s == 0;
      closer += std::fabs(s - r) < std::fabs(q - r);
      farther += std::fabs(s - r) > std::fabs(q - r);
    }
  }
  INFO(small << " gradients below 2^-14; flushed to zero: unscaled " << flushed_plain << ", scaled " << flushed_scaled
             << "; the scaled run nearer f32 on " << closer << ", farther on " << farther);
  CHECK(small > 1000);
  CHECK(flushed_scaled <= flushed_plain);
  CHECK(closer > 4 * farther);  // measured: 7912 and 453 of 8386
}
