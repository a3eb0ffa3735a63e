// cuda/kernels/optimizer.cuh: the multi-tensor optimizer pass (global
// gradient norm and clip scale, AdamW, AdamW8bit, SGD) over several
// parameters of odd lengths in one call (1000, 37, 300, 4500: partial and
// full 2048-element chunks, 16-byte packs and the scalar path), float
// storage (the weight is the f32 master) and bf16 storage with f32 master
// weights, against the host engine (host/kernels/optimizer.hpp, one worker)
// on the same S-rounded gradients, and a list longer than one launch.
#include "../support/kernel_test.hpp"

#include <headroom/cuda/kernels/optimizer.cuh>
#include <headroom/host/kernels/optimizer.hpp>
#include <headroom/math/dynamic_map.hpp>
#include <headroom/optim/adamw.hpp>
#include <headroom/optim/adamw8bit.hpp>
#include <headroom/optim/lion.hpp>
#include <headroom/optim/sgd.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace headroom;
using cuda_test::Buffer;
using cuda_test::worst_ratio;
using i64 = std::int64_t;

const std::vector<i64> lengths = {1000, 37, 300, 4500};

// One parameter on the device, and its host reference: p (the f32 master, or
// the float weight), g (the gradient as stored) and the state, updated by the
// host passes. State is kept in floats (AdamW8bit's codes are its bytes).
template <class S>
struct Param {
  static constexpr bool has_master = !std::is_same_v<S, float>;
  i64 n;
  std::vector<float> p, g, state;
  Buffer<S> weight, grad;
  Buffer<float> master, device_state;

  Param(i64 n_, std::uint32_t seed, std::vector<float> state0)
      : n(n_),
        p(cuda_test::rounded<S>(cuda_test::pattern(n_, seed))),
        g(cuda_test::rounded<S>(cuda_test::pattern(n_, seed + 1, 0.5f))),
        state(std::move(state0)),
        weight(cuda_test::to_storage<S>(p)),
        grad(cuda_test::to_storage<S>(g)),
        master(has_master ? p : std::vector<float>{}),
        device_state(state) {}

  cuda::ParamRef ref() const {
    return {weight.get(), has_master ? master.get() : nullptr, grad.get(),
            state.empty() ? nullptr : reinterpret_cast<std::byte*>(device_state.get()), n};
  }
  // the kernel's f32 master (or float weight), and its weight as f32
  std::vector<float> got_master() const { return has_master ? master.download() : cuda_test::to_floats(weight.download()); }
  std::vector<float> got_weight() const { return cuda_test::to_floats(weight.download()); }
};

// Parameters of the given lengths (a deque: Params do not move), parameter
// k with data from seeds seed + 2k, seed + 2k + 1 and state state_of(n, k).
template <class S, class StateOf>
std::deque<Param<S>> make_params(const std::vector<i64>& ns, std::uint32_t seed, StateOf state_of) {
  std::deque<Param<S>> params;
  for (std::size_t k = 0; k < ns.size(); ++k) params.emplace_back(ns[k], seed + 2 * k, state_of(ns[k], k));
  return params;
}
template <class S>
std::vector<cuda::ParamRef> refs(const std::deque<Param<S>>& params) {
  std::vector<cuda::ParamRef> r;
  for (const Param<S>& p : params) r.push_back(p.ref());
  return r;
}

// AdamW state [m x n][v x n] with moments from earlier steps.
std::vector<float> adamw_state(i64 n, std::uint32_t seed) {
  std::vector<float> s = cuda_test::pattern(2 * n, seed, 0.05f);
  for (i64 i = n; i < 2 * n; ++i) s[i] = s[i] * s[i];  // v >= 0
  return s;
}

// Master / weight comparison. The master follows the same f32 formula on
// both sides (only a compiler's FMA contraction, or a clip scale that differs
// in its last bits, moves it by an ulp or two: 2e-6 relative, 1e-7 absolute
// for weights ~0..1 moved by ~lr). The bf16 weight is the master rounded
// once: 2^-8 relative, checked at 2^-7.
template <class S>
void check_weights(const Param<S>& prm) {
  CHECK(worst_ratio(prm.got_master(), prm.p, 1e-7, 2e-6) <= 1.0);
  if constexpr (!std::is_same_v<S, float>) CHECK(worst_ratio(prm.got_weight(), prm.p, 1e-7, 1.0 / 128) <= 1.0);
}

// m, v: the same f32 formula (a clip scale that differs in its last bits, or
// a compiler contracting b1 m + (1 - b1) g into an FMA on one side only,
// moves them by an ulp of their terms): 1e-5 relative, and 2e-8 absolute for
// m, whose terms are ~0.05 (ulp 3.7e-9) but which can cancel to near zero.
template <class S>
void check_state(const Param<S>& prm) {
  CHECK(worst_ratio(prm.device_state.download(), prm.state, 2e-8, 1e-5) <= 1.0);
}

// The host Trainer::update rule: norm over all gradients in double, then the clip scale.
template <class S>
void host_norm(const std::deque<Param<S>>& params, double clip, double& norm, float& scale) {
  double sq = 0.0;
  for (const Param<S>& p : params) sq += host::squared_norm(p.g.data(), p.n);
  norm = std::sqrt(sq);
  scale = clip > 0 && norm > clip ? static_cast<float>(clip / (norm + 1e-6)) : 1.0f;
}

// A test's clip norm (a quarter of the gradients' norm; 0: no clipping) and
// the host's clip scale for it.
template <class S>
std::pair<double, float> clip_at_quarter(const std::deque<Param<S>>& params, bool clip) {
  double norm = 0;
  float scale = 1;
  host_norm(params, 0.0, norm, scale);
  const double clip_norm = clip ? norm / 4 : 0.0;
  host_norm(params, clip_norm, norm, scale);
  return {clip_norm, scale};
}

// The control block an update reads, with the step's AdamW hyperparameters.
cuda::UpdateControl control_for(const math::AdamWStep<float>& st) {
  cuda::UpdateControl c{};
  c.grad_scale = 1.0f;
  c.set_step_constants(st);
  return c;
}

// Optimizer O's host pass over p (its state in p.state), on one worker.
template <class O, class S>
void host_pass(Param<S>& p, const typename O::template Step<float>& st, float scale, const float* table = nullptr) {
  const StateAt state{reinterpret_cast<std::byte*>(p.state.data()), p.n, 0, &O::desc};
  host::optimizer_pass<O>(p.p.data(), nullptr, p.g.data(), state, p.n, st, scale, table, 1);
}

TEMPLATE_TEST_CASE("squared_norm: global norm and clip scale, deterministic", "[optimizer]", float, cuda::bf16) {
  using S = TestType;
  const std::deque<Param<S>> params = make_params<S>(lengths, 10, [](i64, std::size_t) { return std::vector<float>{}; });
  const std::vector<cuda::ParamRef> list = refs(params);
  double norm = 0;
  float unused = 0;
  host_norm(params, 0.0, norm, unused);
  for (const double clip : {0.0, norm * 2, norm / 3}) {  // off, inactive, active
    INFO("clip = " << clip << ", norm = " << norm);
    Buffer<float> partials(cuda::reduction_slots);
    Buffer<cuda::UpdateControl> out(1), again(1);
    cuda::squared_norm<S>(list, partials.get(), out.get(), static_cast<float>(clip), nullptr);
    cuda::squared_norm<S>(list, partials.get(), again.get(), static_cast<float>(clip), nullptr);
    double want_norm = 0;
    float want_scale = 0;
    host_norm(params, clip, want_norm, want_scale);
    const cuda::UpdateControl c = out.download()[0], c2 = again.download()[0];
    const std::vector<float> got = {c.norm, c.grad_scale};
    // f32 sums of ~5800 squares (per-thread, then trees) against the
    // host's double: relative error ~1e-6 of the sum; 1e-5 on the norm and scale.
    CHECK(worst_ratio({got[0]}, {static_cast<float>(want_norm)}, 0.0, 1e-5) <= 1.0);
    CHECK(worst_ratio({got[1]}, {want_scale}, 0.0, 1e-5) <= 1.0);
    if (clip == norm / 3) CHECK(got[1] < 0.5f);
    else CHECK(got[1] == 1.0f);
    CHECK(std::memcmp(&c.norm, &c2.norm, sizeof(float)) == 0);  // bit for bit
    CHECK(std::memcmp(&c.grad_scale, &c2.grad_scale, sizeof(float)) == 0);
  }
}

// squared_norm_on_host (OffloadOptimizer's norm, from the gradients' copies
// in host memory) adds in the kernels' order: two launches' lists, more
// chunks than partial sums (blocks loop over chunks), and a gradient that is
// not 16-byte aligned (element-wise loads). Bit for bit under the emulator;
// on a GPU the kernel's acc + x x is one FMA, so only close.
TEMPLATE_TEST_CASE("squared_norm_on_host: the kernels' sum of squares, in their order", "[optimizer]", float, cuda::bf16) {
  using S = TestType;
  std::vector<i64> ns;
  for (int k = 0; k < cuda::tensor_list_entries + 8; ++k) ns.push_back(k == 3 ? 1000 * cuda::optimizer_chunk + 77 : 1 + 37 * k);
  const std::deque<Param<S>> params = make_params<S>(ns, 40, [](i64, std::size_t) { return std::vector<float>{}; });
  std::vector<cuda::ParamRef> list = refs(params);
  std::vector<std::vector<S>> stored;
  std::vector<const S*> values;
  for (const Param<S>& p : params) stored.push_back(cuda_test::to_storage<S>(p.g));
  for (const std::vector<S>& v : stored) values.push_back(v.data());
  list[5].grad = static_cast<const S*>(list[5].grad) + 1;  // not 16-byte aligned
  list[5].n -= 1;
  values[5] += 1;
  Buffer<float> partials(cuda::reduction_slots);
  Buffer<cuda::UpdateControl> out(1);
  cuda::squared_norm<S>(list, partials.get(), out.get(), 0.0f, nullptr);
  const float device = out.download()[0].norm;
  const float in_order = std::sqrt(cuda::squared_norm_on_host<S>(list, values, [](int blocks, auto&& f) {
    for (int b = 0; b < blocks; ++b) f(b);
  }));
  const float reversed = std::sqrt(cuda::squared_norm_on_host<S>(list, values, [](int blocks, auto&& f) {
    for (int b = blocks - 1; b >= 0; --b) f(b);
  }));
  CHECK(std::memcmp(&in_order, &reversed, sizeof(float)) == 0);
  INFO("device " << device << ", host " << in_order);
#if defined(__CUDACC__)
  CHECK(worst_ratio({in_order}, {device}, 0.0, 1e-6) <= 1.0);
#else
  CHECK(std::memcmp(&in_order, &device, sizeof(float)) == 0);
#endif
}

TEMPLATE_TEST_CASE("adamw_update: several parameters, clip scale from squared_norm", "[optimizer]", float, cuda::bf16) {
  using S = TestType;
  for (const bool clip : {false, true}) {
    INFO("clip = " << clip);
    std::deque<Param<S>> params = make_params<S>(lengths, 20, [](i64 n, std::size_t k) { return adamw_state(n, 30 + k); });
    const std::vector<cuda::ParamRef> list = refs(params);
    const auto [clip_norm, scale] = clip_at_quarter(params, clip);

    Buffer<float> partials(cuda::reduction_slots);
    Buffer<cuda::UpdateControl> control(1);
    const math::AdamWHyper<float> hyper{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f};
    for (int step = 3; step <= 4; ++step) {  // two steps: the updated state feeds the second
      const math::AdamWStep<float> st = math::adamw_step(hyper, step);
      control.upload({control_for(st)});
      cuda::squared_norm<S>(list, partials.get(), control.get(), static_cast<float>(clip_norm), nullptr);
      AdamW::update<S>(list, control.get(), nullptr, clip, nullptr, 0);
      for (Param<S>& p : params) host_pass<AdamW>(p, st, scale);
    }
    for (const Param<S>& p : params) {
      INFO("n = " << p.n);
      check_weights(p);
      check_state(p);
    }
  }
}

TEMPLATE_TEST_CASE("adamw_update: a list longer than one launch, no clipping", "[optimizer]", float, cuda::bf16) {
  using S = TestType;
  std::vector<i64> ns;
  for (int k = 0; k < cuda::tensor_list_entries + 5; ++k) ns.push_back(1 + 3 * k);
  std::deque<Param<S>> params = make_params<S>(ns, 100, [](i64 n, std::size_t k) { return adamw_state(n, 300 + k); });
  const std::vector<cuda::ParamRef> list = refs(params);

  const math::AdamWStep<float> st = math::adamw_step(math::AdamWHyper<float>{}, 1);
  Buffer<float> partials(cuda::reduction_slots);
  Buffer<cuda::UpdateControl> control(std::vector<cuda::UpdateControl>{control_for(st)});
  cuda::squared_norm<S>(list, partials.get(), control.get(), 0.0f, nullptr);
  double norm = 0;
  float scale = 1;
  host_norm(params, 0.0, norm, scale);
  CHECK(worst_ratio({control.download()[0].norm}, {static_cast<float>(norm)}, 0.0, 1e-5) <= 1.0);

  AdamW::update<S>(list, control.get(), nullptr, false, nullptr, 0);
  for (Param<S>& p : params) {
    host_pass<AdamW>(p, st, 1.0f);
    INFO("n = " << p.n);
    check_weights(p);
    check_state(p);
  }
}

// AdamW8bit state [m absmax x blocks][v absmax x blocks][m codes x n][v codes x n]
// (in floats: the bytes rounded up), quantized from earlier moments.
std::vector<float> adamw8bit_state(i64 n, std::uint32_t seed, const float* maps) {
  const i64 blocks = ceil_div(n, math::adam8bit_block);
  std::vector<float> s((8 * blocks + 2 * n + 3) / 4, 0.0f);
  std::vector<float> m = cuda_test::pattern(n, seed, 0.05f), v = cuda_test::pattern(n, seed + 1, 0.05f);
  for (float& x : v) x = x * x;
  auto* codes = reinterpret_cast<std::uint8_t*>(s.data() + 2 * blocks);
  math::quantize_blockwise_dynamic(m.data(), n, math::adam8bit_block, maps, codes, s.data());
  math::quantize_blockwise_dynamic(v.data(), n, math::adam8bit_block, maps + 256, codes + n, s.data() + blocks);
  return s;
}

TEMPLATE_TEST_CASE("adamw8bit_update: codes and absmaxes as math::adamw8bit_update_block", "[optimizer]", float, cuda::bf16) {
  using S = TestType;
  std::vector<float> maps(512);
  math::make_dynamic_map(true, maps.data());
  math::make_dynamic_map(false, maps.data() + 256);
  Buffer<float> device_maps(maps);
  for (const bool clip : {false, true}) {
    INFO("clip = " << clip);
    std::deque<Param<S>> params =
        make_params<S>(lengths, 40, [&](i64 n, std::size_t k) { return adamw8bit_state(n, 50 + 2 * k, maps.data()); });
    const std::vector<cuda::ParamRef> list = refs(params);
    double norm = 0;
    float scale = 1;
    host_norm(params, 0.0, norm, scale);
    const double clip_norm = clip ? norm / 4 : 0.0;

    const math::AdamWHyper<float> hyper{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f};
    Buffer<float> partials(cuda::reduction_slots);
    Buffer<cuda::UpdateControl> control(std::vector<cuda::UpdateControl>{control_for(math::adamw_step(hyper, 5))});
    cuda::squared_norm<S>(list, partials.get(), control.get(), static_cast<float>(clip_norm), nullptr);
    // The host gets the device's scale, so both sides run on the same bits.
    cuda::UpdateControl c = control.download()[0];
    const float device_scale = clip ? c.grad_scale : 1.0f;
    for (int step = 5; step <= 6; ++step) {
      const math::AdamWStep<float> st = math::adamw_step(hyper, step);
      c.set_step_constants(st);
      control.upload({c});
      AdamW8bit::update<S>(list, control.get(), device_maps.get(), clip, nullptr, 0);
      for (Param<S>& p : params) host_pass<AdamW8bit>(p, st, device_scale, maps.data());
    }
    for (const Param<S>& p : params) {
      INFO("n = " << p.n);
      const std::vector<float> got = p.device_state.download();
      const i64 blocks = ceil_div(p.n, math::adam8bit_block);
      const auto* got_codes = reinterpret_cast<const std::uint8_t*>(got.data() + 2 * blocks);
      const auto* want_codes = reinterpret_cast<const std::uint8_t*>(p.state.data() + 2 * blocks);
#if defined(__CUDACC__)
      // nvcc contracts a * b + c into FMAs (the host compiler does not), so
      // a moment may move by an ulp and, at a rounding boundary, its code by
      // one: absmaxes 1e-6 relative, codes within 1. A code one off in the
      // first step changes that element's second update by at most a few lr
      // (|m| / sqrt(v) stays O(1)): weights within 4 lr.
      CHECK(worst_ratio(std::vector<float>(got.begin(), got.begin() + 2 * blocks),
                        std::vector<float>(p.state.begin(), p.state.begin() + 2 * blocks), 0.0, 1e-6) <= 1.0);
      int off = 0;
      for (i64 i = 0; i < 2 * p.n; ++i) off += std::abs(int(got_codes[i]) - int(want_codes[i])) > 1;
      CHECK(off == 0);
      CHECK(worst_ratio(p.got_master(), p.p, 4 * hyper.lr, 0.0) <= 1.0);
#else
      // the emulator compiles the kernel with the host's compiler: the same
      // f32 operations, so the same bits
      CHECK(std::memcmp(got.data(), p.state.data(), 2 * blocks * sizeof(float)) == 0);
      CHECK(std::memcmp(got_codes, want_codes, 2 * p.n) == 0);
      CHECK(p.got_master() == p.p);
      if constexpr (!std::is_same_v<S, float>) CHECK(p.got_weight() == cuda_test::rounded<S>(p.p));
#endif
    }
  }
}

TEMPLATE_TEST_CASE("sgd_update: with and without momentum", "[optimizer]", float, cuda::bf16) {
  using S = TestType;
  for (const float momentum : {0.9f, 0.0f}) {
    INFO("momentum = " << momentum);
    std::deque<Param<S>> params = make_params<S>(lengths, 60, [&](i64 n, std::size_t k) {
      return momentum != 0.0f ? cuda_test::pattern(n, 70 + k, 0.1f) : std::vector<float>{};
    });
    const std::vector<cuda::ParamRef> list = refs(params);
    const float lr = 0.05f, weight_decay = 0.01f;
    const math::SgdStep<float> st{lr, momentum, weight_decay};
    cuda::UpdateControl c{};
    c.grad_scale = 1.0f;
    c.set_step_constants(st);
    Buffer<cuda::UpdateControl> control(std::vector<cuda::UpdateControl>{c});
    // the types differ in their state only (a momentum buffer, or none); the step carries the momentum
    auto step = [&]<class O>() {
      O::template update<S>(list, control.get(), nullptr, false, nullptr, 0);
      for (Param<S>& p : params) host_pass<O>(p, st, 1.0f);
    };
    for (int k = 0; k < 2; ++k) {
      if (momentum != 0.0f) step.template operator()<SGD<Ratio<9, 10>, Ratio<1, 100>>>();
      else step.template operator()<SGD<Ratio<0>, Ratio<1, 100>>>();
    }
    for (const Param<S>& p : params) {
      INFO("n = " << p.n);
      check_weights(p);
      if (momentum != 0.0f) check_state(p);
    }
  }
}

// Lion, the optimizer written as one header (optim/lion.hpp): its kernel
// against its host pass, two steps, clipped and not, with weight decay.
TEMPLATE_TEST_CASE("Lion: the kernel as the host pass, clipped and not", "[optimizer]", float, cuda::bf16) {
  using S = TestType;
  using O = LionWith<Ratio<9, 10>, Ratio<99, 100>, Ratio<1, 10>>;
  for (const bool clip : {false, true}) {
    INFO("clip = " << clip);
    std::deque<Param<S>> params = make_params<S>(lengths, 110, [](i64 n, std::size_t k) { return cuda_test::pattern(n, 120 + k, 0.05f); });
    const std::vector<cuda::ParamRef> list = refs(params);
    const auto [clip_norm, scale] = clip_at_quarter(params, clip);
    Buffer<float> partials(cuda::reduction_slots);
    Buffer<cuda::UpdateControl> control(1);
    for (int step = 1; step <= 2; ++step) {
      const math::LionStep<float> st = O::step<float>(1e-3, step);
      cuda::UpdateControl c{};
      c.grad_scale = 1.0f;
      c.set_step_constants(st);
      control.upload({c});
      cuda::squared_norm<S>(list, partials.get(), control.get(), static_cast<float>(clip_norm), nullptr);
      O::update<S>(list, control.get(), nullptr, clip, nullptr, 0);
      for (Param<S>& p : params) host_pass<O>(p, st, scale);
    }
    for (const Param<S>& p : params) {
      INFO("n = " << p.n);
      check_weights(p);
      check_state(p);
    }
  }
}

}  // namespace

// A step whose loss is not finite updates nothing: finish_loss sets the skip
// flag, and every update kernel returns at once.
TEMPLATE_TEST_CASE("finish_loss: the step's loss, and a non-finite loss skips every update", "[optimizer]", float, cuda::bf16) {
  using S = TestType;
  std::vector<float> maps(512);
  math::make_dynamic_map(true, maps.data());
  math::make_dynamic_map(false, maps.data() + 256);
  cuda_test::Buffer<float> device_maps(maps);
  for (const float summed : {12.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    INFO("summed loss = " << summed);
    std::deque<Param<S>> params = make_params<S>(lengths, 80, [](i64 n, std::size_t k) { return adamw_state(n, 90 + k); });
    const std::vector<cuda::ParamRef> list = refs(params);
    cuda::UpdateControl c = control_for(math::adamw_step(math::AdamWHyper<float>{}, 1));
    cuda_test::Buffer<cuda::UpdateControl> control(std::vector<cuda::UpdateControl>{c});
    cuda_test::Buffer<float> loss(std::vector<float>{summed});
    cuda::finish_loss(loss.get(), 0.25f, control.get(), nullptr);
    cuda::finish_loss(loss.get(), 0.25f, control.get(), nullptr);  // a second micro-batch
    const cuda::UpdateControl got = control.download()[0];
    const bool finite = std::isfinite(summed);
    CHECK((got.skip != 0.0f) == !finite);
    if (finite) CHECK(got.loss == 6.0f);
    AdamW::update<S>(list, control.get(), nullptr, false, nullptr, 0);
    for (const Param<S>& p : params) {  // p.p: the initial weights (the host side did not step)
      if (finite) CHECK(p.got_master() != p.p);
      else CHECK(p.got_master() == p.p);
    }
  }
}
