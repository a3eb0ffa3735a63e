// A step whose loss is finite but whose gradient is not (NaN or infinite)
// stops before any update, as a non-finite loss does: every weight and every
// optimizer state bit-identical to before the step, the step count unchanged,
// and host::non_finite_gradient naming the step and the first parameter (in
// the schedule's parameter order) whose gradient is not finite. With
// UpdateInBackward: no non-finite value enters a weight or a state, and every
// update after the first non-finite gradient is skipped.
//
// Two constructions, both genuine (the gradients come out of the trainer's
// own backward; nothing writes into a gradient):
//  - an exploding learning rate. AdamW and AdamW8bit at lr 1e30 move every
//    weight by ~1e30 at step 1 (Adam's step is ~lr whatever the gradient's
//    size). At step 2 the residual stream's squares overflow f32, so each
//    RMSNorm's 1/rms is 0: every normalized activation, every logit is 0 and
//    the loss is exactly ln 64 (finite), while RMSNorm's backward multiplies
//    that 0 by dy x w x x ~ 1e30 x 1e30 = inf: NaN gradients. The reported
//    case (tiny_llama: loss ln 256 = 5.545 and a NaN norm at step 2) is this one.
//  - a diverged checkpoint. SGD at a huge rate diverges through a NaN loss
//    instead (its moves are proportional to the gradients: attention scores
//    overflow first), so its case loads the weights the first construction
//    reached into a trainer that took one ordinary step (its optimizer state
//    is real), as loading a checkpoint saved by a diverging run would. The
//    same weights give the same finite loss and the same NaN gradients.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/fixtures.hpp"

using namespace headroom;
using headroom::test::mismatch_at;

namespace {
constexpr models::LlamaConfig cfg{64, 64, 128, 2, 4, 2, 64, false};
using Model = models::Llama<cfg>;
template <class... Options>
using RunWith = Train<Model, Batch<4>, Seq<32>, Workers<2>, Options...>;

using headroom::test::Stream;

// Everything a step may change, as bytes: each parameter's weight and optimizer state.
struct Snapshot {
  std::vector<std::vector<std::byte>> weight, state;
  int steps = 0;
};

template <class Tr>
std::vector<std::byte> weight_bytes(const Tr& t, std::size_t k) {
  const ParamSlot& p = Tr::param(k);
  const auto* w = reinterpret_cast<const std::byte*>(t.weight(p));
  return std::vector<std::byte>(w, w + p.elements() * static_cast<std::int64_t>(sizeof(typename Tr::T)));
}
template <class Tr>
std::vector<std::byte> state_bytes(const Tr& t, std::size_t k) {
  const ParamSlot& p = Tr::param(k);
  if (t.state(p) == nullptr) return {};
  return std::vector<std::byte>(t.state(p), t.state(p) + Tr::config.optim.state_bytes(p.elements()));
}

template <class Tr>
Snapshot snapshot(const Tr& t) {
  Snapshot s;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    s.weight.push_back(weight_bytes(t, k));
    s.state.push_back(state_bytes(t, k));
  }
  s.steps = t.steps_done();
  return s;
}

template <class Tr>
bool unchanged(const Tr& t, const Snapshot& s, std::size_t k) {
  return weight_bytes(t, k) == s.weight[k] && state_bytes(t, k) == s.state[k];
}

// Every weight finite, and every f32 the optimizer keeps (AdamW's moments,
// SGD's momentum, AdamW8bit's block maxima; its codes are indices).
template <class Tr>
bool all_finite(const Tr& t, std::size_t k) {
  const ParamSlot& p = Tr::param(k);
  for (std::int64_t i = 0; i < p.elements(); ++i)
    if (!std::isfinite(t.weight(p)[i])) return false;
  if (t.state(p) == nullptr) return true;
  // the state's f32 sections (an f32 per element, or per block); codes are not floats
  const OptimDesc o = Tr::config.optim;
  for (int k = 0; k < o.sections; ++k) {
    if (o.section[k].bytes != 4) continue;
    for (std::int64_t i = 0; i < o.section[k].size(p.elements()) / 4; ++i) {
      float x;
      std::memcpy(&x, t.state(p) + o.offset(k, p.elements()) + 4 * i, 4);
      if (!std::isfinite(x)) return false;
    }
  }
  return true;
}

// The first parameter, in the schedule's order, whose gradient buffer holds
// a NaN or an infinity (read from the arena), or "" when none does.
template <class Tr>
std::string first_non_finite_gradient(const Tr& t) {
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    if (!p.trainable) continue;
    for (std::int64_t i = 0; i < p.elements(); ++i)
      if (!std::isfinite(t.grad(p)[i])) return Tr::path_of(p);
  }
  return "";
}

// Every micro-batch's loss on these weights (evaluate: forward only).
template <class Tr>
bool losses_finite(Tr& t, const Stream& d) {
  for (int k = 0; k < Tr::config.accumulate; ++k) {
    const auto n = static_cast<std::size_t>(Tr::tokens_per_micro_batch);
    const std::span<const std::int32_t> tok(d.tok), tgt(d.tgt);
    if (!std::isfinite(t.evaluate(tok.subspan(k * n, n), tgt.subspan(k * n, n)))) return false;
  }
  return true;
}

enum class Construction { exploding_lr, diverged_checkpoint };
const char* name_of(Construction c) { return c == Construction::exploding_lr ? "lr 1e30" : "a diverged checkpoint"; }

using Diverging = host::Trainer<RunWith<AdamW>>;
// The weights of Diverging after one step at lr 1e30 on Stream(128, 11).
const Diverging& diverged() {
  static const std::unique_ptr<Diverging> d = [] {
    auto t = std::make_unique<Diverging>(TrainOptions{.seed = 1, .lr = 1e30});
    const Stream first(128, 11);
    t->step(first.tok, first.tgt);
    return t;
  }();
  return *d;
}

// Writes the diverged weights into t, parameter by parameter (by path).
template <class Tr>
void load_diverged(Tr& t) {
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    const ParamSlot* from = Diverging::find(Tr::path_of(p));
    REQUIRE(from != nullptr);
    REQUIRE(from->elements() == p.elements());
    std::copy(diverged().weight(*from), diverged().weight(*from) + p.elements(), t.weight(p));
  }
}

// The construction's first step (lr 1e30, or lr 1e-2 and then the diverged
// weights); the next step has a finite loss and NaN gradients.
template <class Tr>
void prepare(Tr& t, Construction c, const Stream& first) {
  const auto s1 = t.step(first.tok, first.tgt);
  REQUIRE(std::isfinite(s1.loss));
  if (c == Construction::diverged_checkpoint) load_diverged(t);
}
double lr_of(Construction c) { return c == Construction::exploding_lr ? 1e30 : 1e-2; }

// Step 2 of the construction must throw non_finite_gradient and change nothing.
template <class Run>
void check_stopped(Construction c, double clip) {
  using Tr = host::Trainer<Run>;
  INFO(name_of(c) << ", clip_norm " << clip);
  const auto tokens = static_cast<std::size_t>(Tr::tokens_per_step);
  const Stream first(tokens, 11), second(tokens, 12);
  Tr t({.seed = 1, .lr = lr_of(c), .clip_norm = clip});
  prepare(t, c, first);
  const Snapshot before = snapshot(t);
  try {
    const auto s2 = t.step(second.tok, second.tgt);
    FAIL_CHECK("step 2 returned: loss " << s2.loss << ", grad_norm " << s2.grad_norm);
  } catch (const non_finite_gradient& e) {
    CHECK(e.step() == 2);
    CHECK_THAT(e.what(), Catch::Contains("step 2"));
    // the error names what the arena shows: the gradients stay in it
    const std::string expected = first_non_finite_gradient(t);
    CHECK(!expected.empty());
    CHECK(e.parameter() == expected);
    CHECK_THAT(e.what(), Catch::Contains(expected));
  }
  CHECK(t.steps_done() == before.steps);
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    INFO(Tr::path_of(Tr::param(k)));
    CHECK(mismatch_at(weight_bytes(t, k), before.weight[k]) == -1);  // -1: bit-identical, else the first byte that differs
    CHECK(mismatch_at(state_bytes(t, k), before.state[k]) == -1);
  }
  CHECK(losses_finite(t, second));  // the loss was finite: the gradient stopped the step
}
}  // namespace

TEST_CASE("an exploding learning rate: finite loss, NaN gradient, no update", "[host][trainer][errors][non_finite]") {
  const double clip = GENERATE(0.0, 1.0);
  SECTION("AdamW") { check_stopped<RunWith<AdamW>>(Construction::exploding_lr, clip); }
  SECTION("AdamW8bit") { check_stopped<RunWith<AdamW8bit>>(Construction::exploding_lr, clip); }
  SECTION("AdamW, Accumulate<2>") { check_stopped<RunWith<AdamW, Accumulate<2>>>(Construction::exploding_lr, clip); }
}

TEST_CASE("a diverged checkpoint: finite loss, NaN gradient, no update", "[host][trainer][errors][non_finite]") {
  const double clip = GENERATE(0.0, 1.0);
  SECTION("SGD") { check_stopped<RunWith<SGD<>>>(Construction::diverged_checkpoint, clip); }
  SECTION("AdamW") { check_stopped<RunWith<AdamW>>(Construction::diverged_checkpoint, clip); }
  SECTION("AdamW8bit") { check_stopped<RunWith<AdamW8bit>>(Construction::diverged_checkpoint, clip); }
  SECTION("SGD, Accumulate<2>") { check_stopped<RunWith<SGD<>, Accumulate<2>>>(Construction::diverged_checkpoint, clip); }
}

TEST_CASE("gradients whose squares leave f32's range stop the step as a NaN does", "[host][trainer][errors][non_finite]") {
  // The final norm's weight at 1e25 makes the logits ~1e24 apart: the loss
  // stays finite (large), every gradient element is finite, but the LM
  // head's and, through the norm's backward, the earlier ones reach ~1e24,
  // whose squares (1e48) AdamW's f32 second moment cannot hold. The CUDA
  // engine, whose norm is an f32, stops on the same condition.
  using Tr = host::Trainer<RunWith<AdamW>>;
  const Stream first(128, 11), second(128, 12);
  Tr t({.seed = 1, .lr = 1e-2, .clip_norm = 0});
  t.step(first.tok, first.tgt);
  const ParamSlot& norm = *Tr::find("norm.weight");
  std::fill(t.weight(norm), t.weight(norm) + norm.elements(), 1e25f);
  const Snapshot before = snapshot(t);
  try {
    const auto s2 = t.step(second.tok, second.tgt);
    FAIL_CHECK("step 2 returned: loss " << s2.loss << ", grad_norm " << s2.grad_norm);
  } catch (const non_finite_gradient& e) {
    CHECK(e.step() == 2);
    CHECK(first_non_finite_gradient(t).empty());  // every element finite
    // the first parameter in schedule order whose own squares exceed f32's largest value
    std::string expected;
    for (std::size_t k = 0; k < Tr::param_count && expected.empty(); ++k) {
      const ParamSlot& p = Tr::param(k);
      double sq = 0;
      for (std::int64_t i = 0; i < p.elements(); ++i) sq += double(t.grad(p)[i]) * double(t.grad(p)[i]);
      if (sq > std::numeric_limits<float>::max()) expected = Tr::path_of(p);
    }
    CHECK(!expected.empty());
    CHECK(e.parameter() == expected);
    CHECK_THAT(e.what(), Catch::Contains("beyond f32's range"));
  }
  CHECK(t.steps_done() == 1);
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    INFO(Tr::path_of(Tr::param(k)));
    CHECK(unchanged(t, before, k));
  }
  CHECK(std::isfinite(t.evaluate(second.tok, second.tgt)));
}

TEST_CASE("after a stopped step, training goes on from the same state", "[host][trainer][errors][non_finite]") {
  using Tr = host::Trainer<RunWith<SGD<>>>;
  const Stream first(128, 11), second(128, 12);
  Tr t({.seed = 1, .lr = 1e-2}), reference({.seed = 1, .lr = 1e-2});
  t.step(first.tok, first.tgt);
  reference.step(first.tok, first.tgt);
  load_diverged(t);
  CHECK_THROWS_AS(t.step(second.tok, second.tgt), non_finite_gradient);
  for (std::size_t k = 0; k < Tr::param_count; ++k) {  // reload the good weights: the optimizer state was never touched
    const ParamSlot& p = Tr::param(k);
    std::copy(reference.weight(p), reference.weight(p) + p.elements(), t.weight(p));
  }
  const auto s = t.step(second.tok, second.tgt);
  const auto r = reference.step(second.tok, second.tgt);
  CHECK(s.step == 2);
  CHECK(s.loss == r.loss);
  CHECK(s.grad_norm == r.grad_norm);
  const Snapshot expected = snapshot(reference);
  for (std::size_t k = 0; k < Tr::param_count; ++k) CHECK(unchanged(t, expected, k));
}

namespace {
// UpdateInBackward: the parameters in the order their updates run.
template <class Tr>
std::vector<int> update_order() {
  std::vector<int> order;
  for (const Step& st : Tr::sched.steps)
    for (int u = st.update_begin; u < st.update_end; ++u) order.push_back(Tr::sched.updates[u]);
  return order;
}

// InFlight: UpdateInBackward, or OffloadOptimizer (whose host thread
// updates each parameter as its gradient is offloaded, without clipping).
template <class Optim, class InFlight = UpdateInBackward>
void check_update_in_backward(Construction c) {
  using Tr = host::Trainer<RunWith<Optim, InFlight>>;
  using Plain = host::Trainer<RunWith<Optim>>;  // the same run, updated after backward
  INFO(name_of(c));
  // Step 2 repeats step 1's batch: without weight decay only the embedding
  // rows step 1 saw have grown to ~1e30 (an unseen token's row would keep
  // its size, and its activations overflow into a NaN loss instead).
  const Stream first(128, 11), second = first;
  const TrainOptions o{.seed = 1, .lr = lr_of(c), .clip_norm = 0};
  Tr t(o);
  prepare(t, c, first);
  const Snapshot before = snapshot(t);
  std::string parameter;
  try {
    const auto s2 = t.step(second.tok, second.tgt);
    FAIL_CHECK("step 2 returned: loss " << s2.loss << ", grad_norm " << s2.grad_norm);
  } catch (const non_finite_gradient& e) {
    CHECK(e.step() == 2);
    parameter = e.parameter();
  }
  CHECK(t.steps_done() == 1);
  // No NaN or infinity anywhere; the updates that ran form a prefix of the
  // update order (parameters whose gradients were complete and finite before
  // the first non-finite one), and everything after it is bit-identical.
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    INFO(Tr::path_of(Tr::param(k)));
    CHECK(all_finite(t, k));
  }
  const std::vector<int> order = update_order<Tr>();
  std::size_t ran = 0;
  while (ran < order.size() && !unchanged(t, before, static_cast<std::size_t>(order[ran]))) ++ran;
  INFO(ran << " of " << order.size() << " updates ran");
  CHECK(ran > 0);             // this construction's first gradients (the LM head's) are finite
  CHECK(ran < order.size());  // and some later one is not
  for (std::size_t u = ran; u < order.size(); ++u) {
    INFO(Tr::path_of(Tr::param(order[u])));
    CHECK(unchanged(t, before, static_cast<std::size_t>(order[u])));
  }
  // The same gradients updated after backward: the same first parameter.
  Plain plain(o);
  prepare(plain, c, first);
  try {
    plain.step(second.tok, second.tgt);
    FAIL_CHECK("step 2 of the same run without UpdateInBackward returned");
  } catch (const non_finite_gradient& e) {
    CHECK(parameter == e.parameter());
  }
}
}  // namespace

// At lr 1e30 AdamW's decoupled weight decay multiplies each weight by
// 1 - lr x 0.01 = -1e28: the updates that run before the first non-finite
// gradient (the LM head's, the final norm's) would overflow their weights by
// themselves, from finite gradients, which no gradient check can see (the
// next step's checks stop it). The exploding-rate runs here leave decay out.
using AdamWNoDecay = AdamWith<Ratio<9, 10>, Ratio<999, 1000>, Ratio<0>>;
using AdamW8bitNoDecay = Adam8bitWith<Ratio<9, 10>, Ratio<999, 1000>, Ratio<0>>;

TEST_CASE("UpdateInBackward: no non-finite gradient enters the weights, later updates are skipped",
          "[host][trainer][errors][non_finite]") {
  SECTION("AdamW without decay, lr 1e30") { check_update_in_backward<AdamWNoDecay>(Construction::exploding_lr); }
  SECTION("AdamW8bit without decay, lr 1e30") { check_update_in_backward<AdamW8bitNoDecay>(Construction::exploding_lr); }
  SECTION("AdamW, a diverged checkpoint") { check_update_in_backward<AdamW>(Construction::diverged_checkpoint); }
  SECTION("AdamW8bit, a diverged checkpoint") { check_update_in_backward<AdamW8bit>(Construction::diverged_checkpoint); }
  SECTION("SGD, a diverged checkpoint") { check_update_in_backward<SGD<>>(Construction::diverged_checkpoint); }
}

TEST_CASE("OffloadOptimizer without clipping: no non-finite gradient enters the weights, later updates are skipped",
          "[host][trainer][errors][non_finite][offload]") {
  SECTION("AdamW without decay, lr 1e30") { check_update_in_backward<AdamWNoDecay, OffloadOptimizer>(Construction::exploding_lr); }
  SECTION("AdamW, a diverged checkpoint") { check_update_in_backward<AdamW, OffloadOptimizer>(Construction::diverged_checkpoint); }
}

TEST_CASE("OffloadOptimizer with clipping: a NaN gradient stops the step before any update", "[host][trainer][errors][non_finite][offload]") {
  check_stopped<RunWith<AdamW, OffloadOptimizer>>(Construction::diverged_checkpoint, 1.0);
}

TEST_CASE("UpdateInBackward reports the gradient norm its updates used", "[host][trainer][non_finite]") {
  const Stream d(128, 5);
  host::Trainer<RunWith<AdamW, UpdateInBackward>> a({.seed = 2, .lr = 1e-3, .clip_norm = 0});
  host::Trainer<RunWith<AdamW>> b({.seed = 2, .lr = 1e-3, .clip_norm = 0});
  const auto sa = a.step(d.tok, d.tgt), sb = b.step(d.tok, d.tgt);
  CHECK(sa.loss == sb.loss);
  CHECK(sb.grad_norm > 0);
  CHECK(sa.grad_norm == Approx(sb.grad_norm).epsilon(1e-6));  // summed in another order
}

TEST_CASE("UpdateInBackward updates every parameter a separate pass does, the untied LM head too", "[host][trainer]") {
  // The LM head's gradient is complete after the loss event (the fused LM
  // head + cross-entropy), not after a backward event.
  using Sep = host::Trainer<RunWith<AdamW>>;
  using Fused = host::Trainer<RunWith<AdamW, UpdateInBackward>>;
  Sep a({.seed = 4, .lr = 1e-2, .clip_norm = 0});
  Fused b({.seed = 4, .lr = 1e-2, .clip_norm = 0});
  for (int s = 0; s < 2; ++s) {
    const Stream d(128, 40 + s);
    CHECK(a.step(d.tok, d.tgt).loss == b.step(d.tok, d.tgt).loss);
  }
  const Snapshot sa = snapshot(a);
  for (std::size_t k = 0; k < Fused::param_count; ++k) {
    INFO(Fused::path_of(Fused::param(k)));
    const std::size_t j = static_cast<std::size_t>(Sep::find(Fused::path_of(Fused::param(k))) - &Sep::param(0));
    CHECK(mismatch_at(weight_bytes(b, k), sa.weight[j]) == -1);
    CHECK(mismatch_at(state_bytes(b, k), sa.state[j]) == -1);
  }
}
