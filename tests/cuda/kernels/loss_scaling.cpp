// Dynamic loss scaling on cuda::Trainer (train/loss_scaling.hpp): the loss
// kernel's dlogits carry the scale read from the control block, the norm
// kernel divides it out, and the host adjusts it between steps.
//  - f32: a scaled step that does not overflow is the unscaled step, to the
//    bit (a power-of-two scale commutes with every rounding), eager and
//    replayed from a CUDA graph, and with OffloadOptimizer;
//  - the overflow construction of tests/runtime/host_loss_scaling.cpp: the
//    same scales, skips, losses and norms as host::Trainer, skipped steps
//    moving no weight and no state, through a captured CUDA graph;
//  - fp16: the scale keeps gradients that fp16 flushes to zero or to its
//    subnormals (the reason for scaling), measured against the f32 host
//    engine's gradients of the same step; and the CUDA engine's fp16 run
//    tracks the host engine's.
#include "../support/kernel_test.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>
#include <headroom/train/host/trainer.hpp>

namespace loss_scaling_test {

using namespace headroom;

constexpr models::LlamaConfig cfg{64, 64, 128, 2, 4, 2, 64, false};  // vocab, d, mlp, layers, heads, kv heads, positions
using Model = models::Llama<cfg>;

// n tokens and next-token targets of a learnable stream (the host test's fixture's rule)
struct Batch2 {
  std::vector<std::int32_t> tok, tgt;
  Batch2(std::size_t n, std::uint32_t seed) : tok(n), tgt(n) {
    std::vector<std::int32_t> s(n + 1);
    s[0] = static_cast<std::int32_t>(seed % 64);
    s[1] = static_cast<std::int32_t>((seed / 64) % 64);
    for (std::size_t i = 2; i <= n; ++i) s[i] = (s[i - 1] * 5 + 1 + (i % 7 == 0 ? s[i - 2] : 0)) % 64;
    for (std::size_t i = 0; i < n; ++i) tok[i] = s[i], tgt[i] = s[i + 1];
  }
};

LossScaling dynamic(double init, int interval, double growth = 2.0, double backoff = 0.5) {
  return {.mode = LossScaling::dynamic, .init_scale = init, .growth_factor = growth, .backoff_factor = backoff,
          .growth_interval = interval};
}

// Every weight (f32 master or stored) and optimizer state, as bytes.
template <class Tr>
std::vector<std::byte> device_state(const Tr& t) {
  std::vector<std::byte> out;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    const std::vector<float> w = t.download_weight(p);
    const auto* b = reinterpret_cast<const std::byte*>(w.data());
    out.insert(out.end(), b, b + w.size() * sizeof(float));
    const std::vector<std::byte> s = t.download_state(p);
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

template <class Tr>
void set_norm_weight(Tr& t, float value) {
  for (std::size_t k = 0; k < Tr::param_count; ++k)
    if (Tr::path_of(Tr::param(k)) == "norm.weight") {
      const std::vector<float> w(64, value);
      if constexpr (requires { t.upload_weight(Tr::param(k), w); }) t.upload_weight(Tr::param(k), w);
      else t.set_dense(Tr::param(k), w);
    }
}

// norm_rel: 0, or (OffloadOptimizer, where the unscaled run sums the norm's
// squares per parameter in double on the CPU and the scaled one on the
// device in f32) how far the norms may differ; everything else to the bit.
template <class R>
void scaled_equals_unscaled(TrainOptions o, double norm_rel = 0) {
  using Tr = cuda::Trainer<R>;
  TrainOptions plain = o, scaled = o;
  plain.loss_scaling.mode = LossScaling::off;
  scaled.loss_scaling = dynamic(1024.0, 2);
  Tr a(plain), b(scaled);
  REQUIRE(b.scales_loss());
  const float want_scale[] = {1024, 1024, 2048, 2048, 4096};
  for (int s = 0; s < 5; ++s) {
    INFO("step " << s + 1);
    const Batch2 d(static_cast<std::size_t>(Tr::tokens_per_step), 20 + s);
    const StepStats x = a.step(d.tok, d.tgt), y = b.step(d.tok, d.tgt);
    CHECK(y.loss_scale == want_scale[s]);
    CHECK_FALSE(y.skipped);
    CHECK(y.loss == x.loss);
    CHECK(std::fabs(y.grad_norm - x.grad_norm) <= norm_rel * x.grad_norm);
    CHECK(device_state(a) == device_state(b));
  }
  CHECK(b.loss_scale_state() == LossScaleState{.scale = 4096, .growth_tracker = 1, .skipped = 0});
}


TEST_CASE("cuda::Trainer loss scaling: a step that does not overflow is the unscaled step, to the bit", "[trainer][loss_scaling]") {
  SECTION("eager, clipped") {
    scaled_equals_unscaled<Train<Model, Batch<2>, Seq<16>, AdamW, OnCuda>>({.seed = 5, .lr = 1e-3, .clip_norm = 0.5});
  }
  SECTION("replayed from a CUDA graph, unclipped, Accumulate<2>") {
    scaled_equals_unscaled<Train<Model, Batch<2>, Seq<16>, AdamW, Accumulate<2>, OnCuda>>(
        {.seed = 6, .lr = 1e-3, .clip_norm = 0, .cuda_graph = true});
  }
  SECTION("OffloadOptimizer: the unscaled run updates in flight, the scaled one after the backward") {
    scaled_equals_unscaled<Train<Model, Batch<2>, Seq<16>, AdamW, OffloadOptimizer, OnCuda>>({.seed = 7, .lr = 1e-3, .clip_norm = 0}, 1e-6);
  }
}

TEST_CASE("cuda::Trainer loss scaling: a run forced to overflow skips and adjusts as host::Trainer, through a CUDA graph",
          "[trainer][loss_scaling]") {
  // tests/runtime/host_loss_scaling.cpp's construction: the final norm's weight at 100, scales 2^127 (an
  // element overflows) and 2^50 (the scaled norm stays below 2^64), backoff 2^-77, growth 2^77 every 2 steps
  TrainOptions o{.seed = 3, .lr = 1e-3, .clip_norm = 1.0};
  o.loss_scaling = dynamic(std::ldexp(1.0, 127), 2, std::ldexp(1.0, 77), std::ldexp(1.0, -77));
  host::Trainer<Train<Model, Batch<4>, Seq<32>, AdamW>> h(o);
  o.cuda_graph = true;
  cuda::Trainer<Train<Model, Batch<4>, Seq<32>, AdamW, OnCuda>> c(o);
  set_norm_weight(h, 100.0f);
  set_norm_weight(c, 100.0f);
  const float hi = std::ldexp(1.0f, 127), lo = std::ldexp(1.0f, 50);
  const float want_scale[] = {hi, lo, lo, hi, lo, lo, hi, lo};
  const bool want_skip[] = {true, false, false, true, false, false, true, false};
  for (int s = 0; s < 8; ++s) {
    INFO("step call " << s + 1);
    const Batch2 d(128, 40 + s);
    const std::vector<std::byte> before = device_state(c);
    const StepStats x = h.step(d.tok, d.tgt), y = c.step(d.tok, d.tgt);
    CHECK(x.loss_scale == want_scale[s]);
    CHECK(y.loss_scale == want_scale[s]);
    CHECK(x.skipped == want_skip[s]);
    CHECK(y.skipped == want_skip[s]);
    CHECK(y.step == x.step);
    CHECK(std::fabs(y.loss - x.loss) <= 1e-5 * std::fabs(x.loss));
    if (y.skipped) {
      CHECK(device_state(c) == before);
    } else {
      CHECK(std::fabs(y.grad_norm - x.grad_norm) <= 1e-4 * x.grad_norm);
    }
  }
  CHECK(c.graph_captured());
  CHECK(c.loss_scale_state() == h.loss_scale_state());
  CHECK(c.loss_scale_state() == LossScaleState{.scale = lo, .growth_tracker = 1, .skipped = 3});
}

TEST_CASE("cuda::Trainer fp16: the loss scale keeps the gradients fp16 would flush", "[trainer][loss_scaling]") {
  // 16 micro-batches of 4 x 32 tokens: each one's dlogits are softmax / 2048, ~8e-6 per class at the start,
  // inside fp16's subnormals (below 6.1e-5, spaced 6e-8), and so are many of the gradients they make. The
  // f32 host engine's gradients of the same first step are the reference (the gradient buffers hold the
  // step's sums after the update read them); the scaled run's hold S x g (S = 2^16, the default).
  using HostRun = Train<Model, Batch<4>, Seq<32>, Accumulate<16>, AdamW>;
  using Half = Train<Model, Batch<4>, Seq<32>, Accumulate<16>, AdamW, Precision<F16>, OnCuda>;
  TrainOptions o{.seed = 11, .lr = 1e-3};
  host::Trainer<HostRun> h(o);
  cuda::Trainer<Half> scaled(o);  // automatic: Precision<F16> scales
  o.loss_scaling.mode = LossScaling::off;
  cuda::Trainer<Half> plain(o);
  REQUIRE(scaled.scales_loss());
  REQUIRE_FALSE(plain.scales_loss());
  const Batch2 d(2048, 5);
  const StepStats hx = h.step(d.tok, d.tgt), sx = scaled.step(d.tok, d.tgt), px = plain.step(d.tok, d.tgt);
  CHECK(sx.loss_scale == 65536.0f);
  CHECK_FALSE(sx.skipped);
  CHECK(sx.loss == px.loss);  // the forward does not see the scale
  CHECK(std::fabs(sx.loss - hx.loss) <= 1e-3 * hx.loss);
  // Over the elements whose f32 gradient is below fp16's smallest normal (2^-14): how many fp16 flushed to
  // zero, and which run is nearer f32 on each. Unscaled, they and the dlogits behind them (~8e-6) are fp16
  // subnormals (spaced 2^-24 apart); scaled by 2^16 they are normal fp16 numbers (11 significant bits). Sums
  // over 16 micro-batches that cancel leave a few elements far off in either run, so the test counts.
  long small = 0, flushed_plain = 0, flushed_scaled = 0, closer = 0, farther = 0;
  for (std::size_t k = 0; k < cuda::Trainer<Half>::param_count; ++k) {
    const ParamSlot& p = cuda::Trainer<Half>::param(k);
    const float* ref = h.grad(host::Trainer<HostRun>::param(k));
    const std::vector<float> gs = scaled.download_grad(p), gp = plain.download_grad(p);
    for (std::size_t i = 0; i < gs.size(); ++i) {
      const double r = ref[i], s = gs[i] / 65536.0, q = gp[i];
      if (r == 0 || std::fabs(r) >= std::ldexp(1.0, -14)) continue;
      ++small;
      closer += std::fabs(s - r) < std::fabs(q - r);
      farther += std::fabs(s - r) > std::fabs(q - r);
      flushed_plain += q == 0;
      flushed_scaled += s == 0;
    }
  }
  INFO(small << " gradients below 2^-14; flushed to zero: unscaled " << flushed_plain << ", scaled " << flushed_scaled
             << "; the scaled run nearer f32 on " << closer << ", farther on " << farther);
  CHECK(small > 1000);
  CHECK(flushed_scaled <= flushed_plain);
  CHECK(closer > 4 * farther);  // measured: 3227 and 419 of 3667
}

TEST_CASE("cuda::Trainer fp16 tracks host::Trainer fp16, both scaling their loss", "[trainer][loss_scaling]") {
  // The two engines round in different places (the emulated cuBLASLt's f16 outputs against host::gemm's one
  // rounding of a float C; the attention kernels' tiles), so they agree to fp16's noise, not to the bit:
  // measured 3e-6 on the losses and 7e-5 on the norms over 6 AdamW steps; the bounds leave 30x and 14x.
  TrainOptions o{.seed = 4, .lr = 1e-3};
  host::Trainer<Train<Model, Batch<4>, Seq<32>, AdamW, Precision<F16>>> h(o);
  cuda::Trainer<Train<Model, Batch<4>, Seq<32>, AdamW, Precision<F16>, OnCuda>> c(o);
  for (int s = 0; s < 6; ++s) {
    const Batch2 d(128, 60 + s);
    const StepStats x = h.step(d.tok, d.tgt), y = c.step(d.tok, d.tgt);
    INFO("step " << s + 1 << ": host " << x.loss << " (norm " << x.grad_norm << "), cuda " << y.loss << " (norm " << y.grad_norm << ")");
    CHECK(x.loss_scale == 65536.0f);
    CHECK(y.loss_scale == 65536.0f);
    CHECK_FALSE(x.skipped);
    CHECK_FALSE(y.skipped);
    CHECK(std::fabs(x.loss - y.loss) <= 1e-4 * x.loss);
    CHECK(std::fabs(x.grad_norm - y.grad_norm) <= 1e-3 * x.grad_norm);
  }
}

}  // namespace loss_scaling_test
