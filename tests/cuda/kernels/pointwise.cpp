// cuda/kernels/pointwise.cuh: embedding and positions (forward, backward),
// RMSNorm / LayerNorm (forward with statistics, backward with dw / db),
// GELU, SwiGLU, add, accumulate, column sums and casts, for float and bf16
// storage, against the host engine (host/kernels/pointwise.hpp, one worker)
// on the same S-rounded inputs. Sizes are odd (N = 37, D = 96 / 130, 1003
// elements), rows take the wide register layouts too (D = 600, 8200, 8201),
// and element-wise kernels run both on 16-byte aligned pointers (packs) and
// on pointers one element off (the scalar path).
#include "../support/kernel_test.hpp"

#include <headroom/cuda/kernels/pointwise.cuh>
#include <headroom/host/kernels/pointwise.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

using namespace headroom;
using cuda_test::Buffer;
using cuda_test::worst_ratio;
using i64 = std::int64_t;

// Tolerances, |kernel - host| <= atol + rtol |host|:
//   float: the same f32 formulas; only the summation order of row / column
//     reductions and libm's expf / tanhf against host::vec's (relative error
//     ~1e-7) differ, a few ulps: 1e-5 relative plus 1e-6 absolute (values
//     are O(1), so the absolute term covers results that cancel to ~0).
//   bf16: both sides read the same bf16 inputs and compute in f32; the kernel
//     rounds its output to bf16 once, half an ulp = 2^-8 relative at most,
//     so 2^-7 relative (2x margin) plus 1e-5 absolute for the f32 differences.
template <class S>
constexpr double rtol = std::is_same_v<S, float> ? 1e-5 : 1.0 / 128;
template <class S>
constexpr double atol = std::is_same_v<S, float> ? 1e-6 : 1e-5;
// Reductions over D or N <= 130 terms of O(1) (norm backward, column sums):
// f32 rounding differs by up to ~n ulps of the largest partial sum.
template <class S>
constexpr double reduction_atol = std::is_same_v<S, float> ? 2e-5 : 1e-4;

// Host values rounded to S (what both sides read) and their device copy.
template <class S>
struct Data {
  std::vector<float> host;
  Buffer<S> dev;
  explicit Data(const std::vector<float>& v, i64 pad = 0) : host(cuda_test::rounded<S>(v)), dev(padded(v, pad)) {}
  // device elements [pad, pad + n): one element off 16-byte alignment when pad = 1
  static std::vector<S> padded(const std::vector<float>& v, i64 pad) {
    std::vector<float> p(pad, 0.0f);
    p.insert(p.end(), v.begin(), v.end());
    return cuda_test::to_storage<S>(p);
  }
  std::vector<float> result(i64 pad = 0) const {
    const std::vector<float> all = cuda_test::to_floats(dev.download());
    return std::vector<float>(all.begin() + pad, all.end());
  }
  S* at(i64 pad = 0) const { return dev.get() + pad; }
};

template <class S>
void check_close(const std::vector<float>& got, const std::vector<float>& want, double a = atol<S>, double r = rtol<S>) {
  REQUIRE(got.size() == want.size());
  CHECK(worst_ratio(got, want, a, r) <= 1.0);
}

// Tokens in [0, vocab) with repeats: every 4th row is token 5, others spread.
std::vector<std::int32_t> token_ids(i64 n, i64 vocab) {
  std::vector<std::int32_t> t(n);
  for (i64 r = 0; r < n; ++r) t[r] = static_cast<std::int32_t>(r % 4 == 0 ? 5 : (r * 7 + 3) % vocab);
  return t;
}

TEMPLATE_TEST_CASE("embedding_forward copies the tokens' rows", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  const i64 n = 37, vocab = 50;
  // the whole table, and a vocabulary-parallel block of rows [20, 45) (zero rows for the other tokens)
  for (const auto& [first, rows] : {std::pair<i64, i64>{0, vocab}, std::pair<i64, i64>{20, 25}})
    for (const i64 d : {96, 130}) {
      INFO("d = " << d << ", rows [" << first << ", " << first + rows << ")");
      const std::vector<std::int32_t> tokens = token_ids(n, vocab);
      Buffer<std::int32_t> tok(tokens);
      Data<S> table(cuda_test::pattern(rows * d, 1)), out(std::vector<float>(n * d, 7.0f));
      cuda::embedding_forward<S>(tok.get(), table.at(), out.at(), n, d, first, rows, nullptr);
      std::vector<float> want(n * d);
      host::embedding_forward(tokens.data(), table.host.data(), want.data(), n, d, 1, first, rows);
      CHECK(out.result() == want);  // a copy: exact
    }
}

TEMPLATE_TEST_CASE("embedding_backward scatter-adds repeated tokens", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  const i64 n = 37, vocab = 50;
  for (const i64 d : {96, 130})
    for (const bool first : {true, false}) {
      INFO("d = " << d << ", first = " << first);
      const std::vector<std::int32_t> tokens = token_ids(n, vocab);
      Buffer<std::int32_t> tok(tokens);
      Data<S> dy(cuda_test::pattern(n * d, 2)), dtable(cuda_test::pattern(vocab * d, 3));
      std::vector<float> want = dtable.host;
      cuda::embedding_backward<S>(tok.get(), dy.at(), dtable.at(), first, n, vocab, d, 0, nullptr);
      host::embedding_backward(tokens.data(), dy.host.data(), want.data(), first, n, vocab, d, 1);
      const std::vector<float> got = dtable.result();
      if constexpr (std::is_same_v<S, float>) {
        check_close<S>(got, want);  // the atomics' order only
      } else {
        // bf16 atomics round every addition to bf16: each of the k additions
        // into an element errs by at most 2^-8 (half an ulp) of the partial
        // sum, itself at most the sum of the magnitudes added (and the
        // initial value): |err| <= k 2^-8 sum|terms|.
        std::vector<double> magnitude(vocab * d, 0.0);
        std::vector<int> adds(vocab * d, 0);
        if (!first)
          for (i64 i = 0; i < vocab * d; ++i) magnitude[i] = std::fabs(dtable.host[i]);
        for (i64 r = 0; r < n; ++r)
          for (i64 j = 0; j < d; ++j) {
            magnitude[tokens[r] * d + j] += std::fabs(dy.host[r * d + j]);
            ++adds[tokens[r] * d + j];
          }
        int outside = 0;
        for (i64 i = 0; i < vocab * d; ++i)
          if (std::fabs(double(got[i]) - want[i]) > 1e-6 + adds[i] * magnitude[i] / 256.0) ++outside;
        CHECK(outside == 0);
        // and the untouched rows are exactly zero / unchanged
        for (i64 v = 0; v < vocab; ++v)
          if (adds[v * d] == 0)
            for (i64 j = 0; j < d; ++j) REQUIRE(got[v * d + j] == want[v * d + j]);
      }
    }
}

TEST_CASE("embedding_backward of a vocabulary-parallel block: only its tokens' rows", "[pointwise]") {
  const i64 n = 37, vocab = 50, first_row = 20, rows = 25, d = 96;  // the block holds tokens [20, 45)
  const std::vector<std::int32_t> tokens = token_ids(n, vocab);
  Buffer<std::int32_t> tok(tokens);
  for (const bool first : {true, false}) {
    INFO("first = " << first);
    Data<float> dy(cuda_test::pattern(n * d, 2)), dtable(cuda_test::pattern(rows * d, 3));
    std::vector<float> want = dtable.host;
    cuda::embedding_backward<float>(tok.get(), dy.at(), dtable.at(), first, n, rows, d, first_row, nullptr);
    host::embedding_backward(tokens.data(), dy.host.data(), want.data(), first, n, rows, d, 1, first_row);
    check_close<float>(dtable.result(), want);
  }
}

TEMPLATE_TEST_CASE("positions_forward and positions_backward", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  const i64 batch = 3, seq = 13, positions = 16;
  for (const i64 d : {96, 130}) {
    INFO("d = " << d);
    Data<S> table(cuda_test::pattern(positions * d, 4)), x(cuda_test::pattern(batch * seq * d, 5));
    std::vector<float> want = x.host;
    cuda::positions_forward<S>(table.at(), x.at(), batch, seq, d, nullptr);
    host::positions_forward(table.host.data(), want.data(), batch, seq, d, 1);
    check_close<S>(x.result(), want);

    for (const bool first : {true, false}) {
      INFO("first = " << first);
      Data<S> dx(cuda_test::pattern(batch * seq * d, 6)), dtable(cuda_test::pattern(positions * d, 7));
      std::vector<float> dwant = dtable.host;
      cuda::positions_backward<S>(dx.at(), dtable.at(), first, batch, seq, positions, d, nullptr);
      host::positions_backward(dx.host.data(), dwant.data(), first, batch, seq, positions, d, 1);
      check_close<S>(dtable.result(), dwant);
    }
  }
}

// Row statistics are f32 on both sides: relative 1e-5 (mean also 1e-6
// absolute: it cancels to ~0.05 over [-1, 1) data).
void check_stats(const std::vector<float>& got, const std::vector<float>& want) { check_close<float>(got, want, 1e-6, 1e-5); }

TEMPLATE_TEST_CASE("norm_forward: RMSNorm and LayerNorm rows and statistics", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  struct Shape {
    i64 n, d;
  };
  // 96 / 600 / 8200: packs (8200 needs the 1024-thread block); 130 / 8201: scalar
  for (const Shape sh : {Shape{37, 96}, Shape{37, 130}, Shape{5, 600}, Shape{3, 8200}, Shape{2, 8201}})
    for (const bool layer : {false, true})
      for (const bool bias : {false, true}) {
        if (bias && !layer) continue;
        const i64 n = sh.n, d = sh.d;
        INFO("n = " << n << ", d = " << d << ", layer = " << layer << ", bias = " << bias);
        std::vector<float> xs = cuda_test::pattern(n * d, 8, 2.0f);
        for (i64 i = 0; i < n * d; ++i) xs[i] += 0.3f * static_cast<float>(i / d % 3);  // rows with a nonzero mean
        Data<S> x(xs), w(cuda_test::pattern(d, 9)), b(cuda_test::pattern(d, 10)), y(std::vector<float>(n * d, 0.0f));
        Buffer<float> mean(n), rstd(n);
        cuda::norm_forward<S>(layer, x.at(), w.at(), bias ? b.at() : nullptr, y.at(), layer ? mean.get() : nullptr, rstd.get(),
                              n, d, nullptr);
        std::vector<float> want(n * d), want_mean(n), want_rstd(n);
        host::norm_forward<float>(layer, x.host.data(), w.host.data(), bias ? b.host.data() : nullptr, want.data(),
                                  want_mean.data(), want_rstd.data(), n, d, 1);
        check_close<S>(y.result(), want, reduction_atol<S>);
        check_stats(rstd.download(), want_rstd);
        if (layer) check_stats(mean.download(), want_mean);
      }
}

TEMPLATE_TEST_CASE("norm_backward: dx per row, dw / db column sums, flags and null outputs", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  struct Shape {
    i64 n, d;
  };
  for (const Shape sh : {Shape{37, 96}, Shape{37, 130}, Shape{5, 600}, Shape{2, 8201}})
    for (const bool layer : {false, true})
      for (const bool first : {true, false})
        for (const int nulls : {0, 1, 2, 3}) {  // 1: no dx, 2: no dw, 3: no db
          const i64 n = sh.n, d = sh.d;
          if (d > 600 && (nulls != 0 || !first)) continue;  // the wide layouts once
          INFO("n = " << n << ", d = " << d << ", layer = " << layer << ", first = " << first << ", nulls = " << nulls);
          Data<S> x(cuda_test::pattern(n * d, 11, 2.0f)), w(cuda_test::pattern(d, 12)), dy(cuda_test::pattern(n * d, 13));
          std::vector<float> mean(n), rstd(n), h(n * d);
          host::norm_forward<float>(layer, x.host.data(), w.host.data(), nullptr, h.data(), mean.data(), rstd.data(), n, d, 1);
          Buffer<float> dmean(mean), drstd(rstd);
          Data<S> dx(cuda_test::pattern(n * d, 14)), dw(cuda_test::pattern(d, 15)), db(cuda_test::pattern(d, 16));
          std::vector<float> want_dx = dx.host, want_dw = dw.host, want_db = db.host;
          const bool has_dx = nulls != 1, has_dw = nulls != 2, has_db = layer && nulls != 3;
          // dw / db take the opposite flag of dx, so both flags meet each output
          cuda::norm_backward<S>(layer, x.at(), w.at(), layer ? dmean.get() : nullptr, drstd.get(), dy.at(),
                                 has_dx ? dx.at() : nullptr, first, has_dw ? dw.at() : nullptr, !first,
                                 has_db ? db.at() : nullptr, first, n, d, nullptr);
          host::norm_backward<float>(layer, x.host.data(), w.host.data(), layer ? mean.data() : nullptr, rstd.data(),
                                     dy.host.data(), has_dx ? want_dx.data() : nullptr, first,
                                     has_dw ? want_dw.data() : nullptr, !first, has_db ? want_db.data() : nullptr, first, n, d,
                                     1);
          // (null outputs: the buffers keep their inputs, as on the host)
          check_close<S>(dx.result(), want_dx, reduction_atol<S>);
          check_close<S>(dw.result(), want_dw, reduction_atol<S>);
          check_close<S>(db.result(), want_db, reduction_atol<S>);
        }
}

TEMPLATE_TEST_CASE("column_sums: the bias gradient", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  for (const i64 d : {96, 130})
    for (const bool first : {true, false}) {
      const i64 n = 37;
      INFO("d = " << d << ", first = " << first);
      Data<S> dy(cuda_test::pattern(n * d, 17)), db(cuda_test::pattern(d, 18));
      std::vector<float> want = db.host;
      cuda::column_sums<S>(dy.at(), db.at(), first, n, d, nullptr);
      host::column_sums(n, d, 1, want.data(), first, [&](i64 r, i64 j) { return dy.host[r * d + j]; });
      check_close<S>(db.result(), want, reduction_atol<S>);
    }
}

// Element-wise kernels, n = 1003 (not a multiple of a pack), on aligned
// pointers (packs + tail) and on pointers one element off (scalar path).
constexpr i64 count = 1003;

TEMPLATE_TEST_CASE("gelu forward and backward", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  for (const i64 pad : {0, 1})
    for (const bool first : {true, false}) {
      INFO("pad = " << pad << ", first = " << first);
      Data<S> x(cuda_test::pattern(count, 19, 4.0f), pad), y(std::vector<float>(count, 0.0f), pad);
      Data<S> dy(cuda_test::pattern(count, 20), pad), dx(cuda_test::pattern(count, 21), pad);
      cuda::gelu_forward<S>(x.at(pad), y.at(pad), count, nullptr);
      cuda::gelu_backward<S>(x.at(pad), dy.at(pad), dx.at(pad), first, count, nullptr);
      std::vector<float> want_y(count), want_dx = dx.host;
      host::gelu_forward(x.host.data(), want_y.data(), count, 1);
      host::gelu_backward(x.host.data(), dy.host.data(), want_dx.data(), first, count, 1);
      check_close<S>(y.result(pad), want_y);
      check_close<S>(dx.result(pad), want_dx);
    }
}

TEMPLATE_TEST_CASE("swiglu forward and backward, null gradients", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  for (const i64 pad : {0, 1})
    for (const bool first : {true, false})
      for (const int nulls : {0, 1, 2}) {  // 1: no dgate, 2: no dup
        INFO("pad = " << pad << ", first = " << first << ", nulls = " << nulls);
        Data<S> gate(cuda_test::pattern(count, 22, 4.0f), pad), up(cuda_test::pattern(count, 23, 2.0f), pad);
        Data<S> h(std::vector<float>(count, 0.0f), pad), dh(cuda_test::pattern(count, 24), pad);
        Data<S> dgate(cuda_test::pattern(count, 25), pad), dup(cuda_test::pattern(count, 26), pad);
        cuda::swiglu_forward<S>(gate.at(pad), up.at(pad), h.at(pad), count, nullptr);
        const bool has_dgate = nulls != 1, has_dup = nulls != 2;
        cuda::swiglu_backward<S>(gate.at(pad), up.at(pad), dh.at(pad), has_dgate ? dgate.at(pad) : nullptr, first,
                                 has_dup ? dup.at(pad) : nullptr, !first, count, nullptr);
        std::vector<float> want_h(count), want_dgate = dgate.host, want_dup = dup.host;
        host::swiglu_forward(gate.host.data(), up.host.data(), want_h.data(), count, 1);
        host::swiglu_backward(gate.host.data(), up.host.data(), dh.host.data(), has_dgate ? want_dgate.data() : nullptr, first,
                              has_dup ? want_dup.data() : nullptr, !first, count, 1);
        check_close<S>(h.result(pad), want_h);
        check_close<S>(dgate.result(pad), want_dgate);
        check_close<S>(dup.result(pad), want_dup);
      }
}

TEMPLATE_TEST_CASE("add_forward and accumulate", "[pointwise]", float, cuda::bf16) {
  using S = TestType;
  for (const i64 pad : {0, 1})
    for (const bool first : {true, false}) {
      INFO("pad = " << pad << ", first = " << first);
      Data<S> a(cuda_test::pattern(count, 27), pad), b(cuda_test::pattern(count, 28), pad);
      Data<S> y(std::vector<float>(count, 0.0f), pad);
      Data<S> dx(cuda_test::pattern(count, 29), pad);
      cuda::add_forward<S>(a.at(pad), b.at(pad), y.at(pad), count, nullptr);
      cuda::accumulate<S>(a.at(pad), dx.at(pad), first, count, nullptr);
      std::vector<float> want_y(count), want_dx = dx.host;
      host::add_forward(a.host.data(), b.host.data(), want_y.data(), count, 1);
      host::accumulate(a.host.data(), want_dx.data(), first, count, 1);
      check_close<S>(y.result(pad), want_y);
      check_close<S>(dx.result(pad), want_dx);
    }
}

TEST_CASE("cast between storage types rounds to nearest even", "[pointwise]") {
  for (const i64 pad : {0, 1}) {
    INFO("pad = " << pad);
    const std::vector<float> v = cuda_test::pattern(count, 30, 3.0f);
    Data<float> master(v, pad);
    Data<cuda::bf16> weights(std::vector<float>(count, 0.0f), pad);
    Data<float> back(std::vector<float>(count, 0.0f), pad), copy(std::vector<float>(count, 0.0f), pad);
    cuda::cast<float, cuda::bf16>(master.at(pad), weights.at(pad), count, nullptr);
    cuda::cast<cuda::bf16, float>(weights.at(pad), back.at(pad), count, nullptr);
    cuda::cast<float, float>(master.at(pad), copy.at(pad), count, nullptr);
    const std::vector<float> want = cuda_test::rounded<cuda::bf16>(v);  // from_float: the same rounding, bit for bit
    CHECK(weights.result(pad) == want);
    CHECK(back.result(pad) == want);
    CHECK(copy.result(pad) == v);
  }
}

}  // namespace
