// math/nf4.hpp, math/dynamic_map.hpp, math/blockwise_int.hpp: code values,
// nibble order, and quantize -> dequantize error within each format's bound.
#include <catch2/catch.hpp>

#include <headroom/math/blockwise_int.hpp>
#include <headroom/math/dynamic_map.hpp>
#include <headroom/math/nf4.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace headroom::math;

std::vector<float> randn(std::size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

float nf4_max_gap() {
  float g = 0.0f;
  for (int i = 0; i < 15; ++i) g = std::fmax(g, nf4_code(i + 1) - nf4_code(i));
  return g;
}

}  // namespace

TEST_CASE("math.nf4: the 16 bitsandbytes code values", "[math][nf4]") {
  REQUIRE(nf4_code(0) == -1.0f);
  REQUIRE(nf4_code(1) == -0.6961928009986877f);
  REQUIRE(nf4_code(6) == -0.09105003625154495f);
  REQUIRE(nf4_code(7) == 0.0f);
  REQUIRE(nf4_code(8) == 0.07958029955625534f);
  REQUIRE(nf4_code(14) == 0.7229568362236023f);
  REQUIRE(nf4_code(15) == 1.0f);
  for (int i = 0; i < 15; ++i) REQUIRE(nf4_code(i) < nf4_code(i + 1));
  for (int i = 0; i < 16; ++i) REQUIRE(nf4_quantize_value(nf4_code(i)) == i);
  REQUIRE(nf4_quantize_value(-2.0f) == 0);
  REQUIRE(nf4_quantize_value(2.0f) == 15);
  static_assert(nf4_quantize_value(0.0f) == 7);
}

// The code is the number of midpoints (0.5f * (code i + code i+1), in float
// as the kernels compute them) at or below v: the nearest code, the upper
// one at a midpoint. Checked against that count written plainly, and
// against the nearest code by distance wherever v is not within a few
// floats of a midpoint (where rounding the distances decides).
TEST_CASE("math.nf4: the nearest code, at every midpoint and its neighbours and over every 4096th float", "[math][nf4]") {
  auto midpoints_below = [](float v) {
    int n = 0;
    for (int i = 0; i < 15; ++i) n += v >= 0.5f * (nf4_code(i) + nf4_code(i + 1)) ? 1 : 0;
    return n;
  };
  auto nearest = [](float v) {
    int best = 0;
    for (int i = 1; i < 16; ++i)
      if (std::fabs(v - nf4_code(i)) <= std::fabs(v - nf4_code(best))) best = i;
    return best;
  };
  auto near_a_midpoint = [](float v) {
    for (int i = 0; i < 15; ++i)
      if (std::fabs(v - 0.5f * (nf4_code(i) + nf4_code(i + 1))) < 1e-6f) return true;
    return false;
  };
  for (int i = 0; i < 15; ++i) {
    const float mid = 0.5f * (nf4_code(i) + nf4_code(i + 1));
    for (const float v : {std::nextafter(mid, -2.0f), mid, std::nextafter(mid, 2.0f)}) {
      INFO("v " << v << " between codes " << i << " and " << i + 1);
      REQUIRE(nf4_quantize_value(v) == (v >= mid ? i + 1 : i));
    }
  }
  // every 4096th float bit pattern of either sign up to 2 (every exponent)
  std::int64_t checked = 0, by_distance = 0;
  for (std::uint32_t bits = 0; bits < 0x40000000u; bits += 4096)
    for (const std::uint32_t sign : {0u, 0x80000000u}) {
      float v;
      const std::uint32_t b = bits | sign;
      std::memcpy(&v, &b, 4);
      const int q = nf4_quantize_value(v);
      if (q != midpoints_below(v)) FAIL("v " << v << ": code " << q << ", midpoints at or below " << midpoints_below(v));
      if (!near_a_midpoint(v)) {
        if (q != nearest(v)) FAIL("v " << v << ": code " << q << ", nearest " << nearest(v));
        ++by_distance;
      }
      ++checked;
    }
  CHECK(checked == 2 * (0x40000000 / 4096));
  CHECK(by_distance > checked * 99 / 100);
  CHECK(nf4_quantize_value(std::nanf("")) == 0);
}

TEST_CASE("math.nf4: first element in the high nibble", "[math][nf4]") {
  float x[64] = {};
  x[0] = 1.0f;   // code 15
  x[1] = -1.0f;  // code 0
  x[2] = 0.0f;   // code 7
  x[3] = 0.5626170039176941f;  // code 13
  std::uint8_t packed[32];
  float absmax = 0.0f;
  quantize_block_nf4(x, 64, packed, &absmax);
  REQUIRE(absmax == 1.0f);
  REQUIRE(packed[0] == 0xF0);
  REQUIRE(packed[1] == 0x7D);
  REQUIRE(nf4_unpack(packed, 0) == 15);
  REQUIRE(nf4_unpack(packed, 1) == 0);
  REQUIRE(nf4_unpack(packed, 3) == 13);
}

TEST_CASE("math.nf4: round trip within the format bound", "[math][nf4]") {
  const std::int64_t n = 64 * 37 + 10;  // a short last block
  auto x = randn(n, 1);
  std::vector<std::uint8_t> packed((n + 1) / 2);
  std::vector<float> absmax((n + 63) / 64), y(n);
  quantize_block_nf4(x.data(), n, packed.data(), absmax.data());
  dequantize_nf4(packed.data(), absmax.data(), n, y.data());
  const float gap = nf4_max_gap();
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = absmax[i / 64];
    REQUIRE(std::fabs(x[i] - y[i]) <= a * gap / 2 * (1 + 1e-5f));
  }
  // each block's absmax element is reproduced exactly
  for (std::size_t b = 0; b < absmax.size(); ++b) {
    float amax = 0.0f;
    for (std::int64_t i = b * 64; i < std::min<std::int64_t>(n, (b + 1) * 64); ++i) amax = std::fmax(amax, std::fabs(x[i]));
    REQUIRE(absmax[b] == amax);
  }
}

TEST_CASE("math.dynamic_map: create_dynamic_map construction", "[math][dynamic]") {
  float s[256], u[256];
  make_dynamic_map(true, s);
  make_dynamic_map(false, u);
  for (int i = 0; i < 255; ++i) {
    REQUIRE(s[i] < s[i + 1]);
    REQUIRE(u[i] < u[i + 1]);
  }
  REQUIRE(s[255] == 1.0f);
  REQUIRE(u[255] == 1.0f);
  REQUIRE(u[0] == 0.0f);
  // signed: 127 negative values, 0, 127 positive values + 1.0; smallest magnitude 1e-6 * 0.55
  REQUIRE(s[127] == 0.0f);
  REQUIRE(s[0] == Approx(-0.9929688).epsilon(1e-6));  // -(1 - 0.9/128/2) at i = 6
  REQUIRE(s[128] == Approx(0.55e-6).epsilon(1e-6));
  REQUIRE(s[126] == -s[128]);
  REQUIRE(s[254] == -s[0]);
  REQUIRE(u[1] == Approx(0.325e-6).epsilon(1e-6));  // (0.1 + 0.55) / 2 * 1e-6
  for (int i = 0; i < 256; ++i) REQUIRE(dynamic_quantize_value(s[i], s) == i);
}

TEST_CASE("math.dynamic_map: block-wise round trip", "[math][dynamic]") {
  float map[256];
  make_dynamic_map(true, map);
  const std::int64_t n = 256 * 4 + 3;
  auto x = randn(n, 2);
  std::vector<std::uint8_t> q(n);
  std::vector<float> absmax((n + 255) / 256), y(n);
  quantize_blockwise_dynamic(x.data(), n, 256, map, q.data(), absmax.data());
  dequantize_blockwise_dynamic(q.data(), absmax.data(), n, 256, map, y.data());
  float max_gap = 0.0f;
  for (int i = 0; i < 255; ++i) max_gap = std::fmax(max_gap, map[i + 1] - map[i]);
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = absmax[i / 256];
    // nearest code: within half of the local gap (and the map's largest gap)
    REQUIRE(std::fabs(x[i] - y[i]) <= a * max_gap / 2 * (1 + 1e-5f));
    // and the code is the nearest one of the map
    const float v = a > 0.0f ? x[i] / a : 0.0f;
    for (int c = 0; c < 256; ++c) REQUIRE(std::fabs(v - map[q[i]]) <= std::fabs(v - map[c]) + 1e-7f);
  }
}

TEST_CASE("math.nf4: double quantization of the absmax", "[math][nf4]") {
  float map[256];
  make_dynamic_map(true, map);
  const std::int64_t n = 64 * 600;  // 600 blocks -> 3 second-level blocks
  auto x = randn(n, 3, 0.02f);
  std::vector<std::uint8_t> packed(n / 2), qa(600);
  std::vector<float> absmax(600), absmax2(3), y(n), deq_absmax(600);
  quantize_block_nf4(x.data(), n, packed.data(), absmax.data());
  float offset = 0.0f;
  double_quantize_absmax(absmax.data(), 600, map, qa.data(), absmax2.data(), &offset);
  double mean = 0.0;
  for (float a : absmax) mean += a;
  mean /= 600;
  REQUIRE(offset == Approx(mean).epsilon(1e-6));
  float max_gap = 0.0f;
  for (int i = 0; i < 255; ++i) max_gap = std::fmax(max_gap, map[i + 1] - map[i]);
  for (int i = 0; i < 600; ++i) {
    deq_absmax[i] = double_dequantize_absmax(qa.data(), absmax2.data(), offset, map, i);
    REQUIRE(std::fabs(deq_absmax[i] - absmax[i]) <= absmax2[i / 256] * max_gap / 2 * (1 + 1e-4f) + 1e-9f);
    REQUIRE(deq_absmax[i] == Approx(absmax[i]).epsilon(0.02));
  }
  dequantize_nf4(packed.data(), deq_absmax.data(), n, y.data());
  const float gap = nf4_max_gap();
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = absmax[i / 64], da = deq_absmax[i / 64];
    REQUIRE(std::fabs(x[i] - y[i]) <= a * gap / 2 + std::fabs(da - a) + 1e-7f);
  }
}

TEST_CASE("math.blockwise_int: Int8 and Int4 round trips", "[math][int]") {
  const std::int64_t n = 64 * 20 + 6;
  auto x = randn(n, 4);
  std::vector<float> absmax((n + 63) / 64), y(n);
  SECTION("Int8") {
    std::vector<std::int8_t> q(n);
    quantize_blockwise_int8(x.data(), n, 64, q.data(), absmax.data());
    dequantize_blockwise_int8(q.data(), absmax.data(), n, 64, y.data());
    for (std::int64_t i = 0; i < n; ++i) {
      REQUIRE(std::abs(q[i]) <= 127);
      REQUIRE(std::fabs(x[i] - y[i]) <= absmax[i / 64] / 127 / 2 * (1 + 1e-4f));
    }
  }
  SECTION("Int4") {
    std::vector<std::uint8_t> q((n + 1) / 2);
    quantize_blockwise_int4(x.data(), n, 64, q.data(), absmax.data());
    dequantize_blockwise_int4(q.data(), absmax.data(), n, 64, y.data());
    for (std::int64_t i = 0; i < n; ++i) {
      REQUIRE(std::abs(int4_unpack(q.data(), i)) <= 7);
      REQUIRE(std::fabs(x[i] - y[i]) <= absmax[i / 64] / 7 / 2 * (1 + 1e-4f));
    }
  }
  SECTION("Int4 nibble order and sign") {
    float b[64] = {};
    b[0] = -1.0f;  // -7 -> 0x9
    b[1] = 0.5f;   // round(3.5) = 4
    std::uint8_t q[32];
    float a = 0.0f;
    quantize_blockwise_int4(b, 64, 64, q, &a);
    REQUIRE(q[0] == 0x94);
    REQUIRE(int4_unpack(q, 0) == -7);
    REQUIRE(int4_unpack(q, 1) == 4);
  }
}
