// trainers::InitialValues: the values a parameter starts from, as its layer
// declares them (ParamInit) or as its name picks them, against what each
// kind promises: exact constants, bounds, and sample moments over 20,000
// draws.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <headroom/headroom.hpp>
#include <headroom/train/initial_values.hpp>

using namespace headroom;
using trainers::InitialValues;

namespace {
struct Moments {
  double mean = 0, std = 0, min = 0, max = 0;
};
Moments moments(const InitialValues& v, std::int64_t n = 20000) {
  Moments m{0, 0, v(0), v(0)};
  double sum = 0, squares = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = v(i);
    sum += x;
    squares += x * x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean = sum / double(n);
  m.std = std::sqrt(squares / double(n) - m.mean * m.mean);
  return m;
}
}  // namespace

TEST_CASE("ParamInit: a constant, a uniform bound and a normal deviation, as the layer declared them", "[init]") {
  const InitialValues c(7, "blocks.0.scale.gamma", "LayerScale", "gamma", 64, ParamInit::constant(0.1));
  for (std::int64_t i = 0; i < 1000; ++i) REQUIRE(c(i) == 0.1);

  const Moments u = moments(InitialValues(7, "w", "Mine", "weight", 64, ParamInit::uniform(0.5)));
  CHECK(u.min >= -0.5);
  CHECK(u.max <= 0.5);
  CHECK(u.max > 0.49);
  CHECK(u.min < -0.49);
  CHECK(std::abs(u.mean) < 0.01);
  CHECK(u.std == Approx(0.5 / std::sqrt(3.0)).epsilon(0.02));  // U(-b, b): b / sqrt(3)

  const Moments g = moments(InitialValues(7, "w", "Mine", "weight", 64, ParamInit::normal(0.3)));
  CHECK(std::abs(g.mean) < 0.01);
  CHECK(g.std == Approx(0.3).epsilon(0.02));

  // a declared init wins over the name: a bias declared 1 starts at 1
  CHECK(InitialValues(7, "b", "Mine", "bias", 1, ParamInit::constant(1.0))(3) == 1.0);
}

TEST_CASE("ParamInit by name: biases and LoRA's B 0, norm gains 1, LoRA's A Kaiming-uniform, the rest N(0, 0.02)", "[init]") {
  for (const char* zero : {"bias", "lora_B"}) CHECK(moments(InitialValues(7, "p", "Linear", zero, 64)).max == 0.0);
  for (const char* norm : {"RMSNorm", "LayerNorm"}) {
    const Moments m = moments(InitialValues(7, "p", norm, "weight", 1));
    CHECK(m.min == 1.0);
    CHECK(m.max == 1.0);
  }
  const Moments a = moments(InitialValues(7, "p", "LoRA", "lora_A", 64));  // bound 1 / sqrt(64)
  CHECK(a.min >= -0.125);
  CHECK(a.max <= 0.125);
  CHECK(a.max > 0.12);
  const Moments w = moments(InitialValues(7, "p", "Linear", "weight", 64));
  CHECK(std::abs(w.mean) < 0.001);
  CHECK(w.std == Approx(0.02).epsilon(0.02));
}

TEST_CASE("initial values are a function of the seed and the parameter's path", "[init]") {
  const InitialValues a(7, "layers.0.q_proj.weight", "Linear", "weight", 64), b(7, "layers.0.q_proj.weight", "Linear", "weight", 64);
  const InitialValues other_path(7, "layers.1.q_proj.weight", "Linear", "weight", 64);
  const InitialValues other_seed(8, "layers.0.q_proj.weight", "Linear", "weight", 64);
  int same_as_other_path = 0, same_as_other_seed = 0;
  for (std::int64_t i = 0; i < 100; ++i) {
    REQUIRE(a(i) == b(i));
    same_as_other_path += a(i) == other_path(i);
    same_as_other_seed += a(i) == other_seed(i);
  }
  CHECK(same_as_other_path == 0);
  CHECK(same_as_other_seed == 0);
}
