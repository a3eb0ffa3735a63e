// cuda/kernels/attention.cuh against the host engine (host/attention.hpp, in
// double, on the same storage-rounded inputs): forward o and lse, backward dq,
// dk, dv, for float and bf16 storage, on four shapes:
//   GPT-2 style: q | k | v side by side in one fused row (the host trainer's
//     pointers into c_attn's output), no RoPE, gradients into a fused dqkv;
//   Llama style: GQA (4 query heads on 2 kv heads), RoPE, separate buffers;
//   head_dim 128 (the largest), 2 heads on 1 kv head, RoPE, separate buffers
//     whose rows carry 3 padding columns (strides wider than the heads, and
//     not a multiple of 4: the kernels' element-by-element load path).
//   head_dim 40, T=77: a head narrower than the products' 16-column blocks
//     (zero-padded to 48), and more query tiles than any kernel's tile.
// Sequence lengths are not multiples of any tile (37, 50, 20, 77), so every
// kernel sees partial query and key tiles. f16 runs on the Llama shape. The
// gradient buffers start filled with a sentinel: every element within the row
// widths must be overwritten, every padding column left alone.
// Sliding windows (Mistral; the host kernels are checked against a naive
// reference with the window in its mask, tests/runtime/host_attention.cpp):
// 1 and 5 (under every tile), 16 and 32 (the float and 16-bit kernels' key
// tiles), 64 (the 16-bit forward's query tile), 70 and 100 (no multiple of a
// tile), 18, 34 and 66 (2 past a multiple of 16: the last key of a tile is
// then reached by exactly the first row of a later tile, and by no row of the
// tile before it) and 150 (the whole sequence), on T=150, GQA 4 on 2, with
// and without RoPE; and a negative window refused.
#include "../support/kernel_test.hpp"

#include <headroom/cuda/kernels/attention.cuh>
#include <headroom/host/attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace {

using namespace headroom;
using cuda_test::Buffer;
using i64 = std::int64_t;

struct Case {
  i64 batch, seq, heads, kv_heads, head_dim;
  bool rope;
  bool fused;  // q | k | v in one row (needs no padding); else three buffers
  i64 pad;     // separate buffers: padding columns at the end of each row
  math::RopeScaling scaling{};  // Llama 3.1's RoPE scaling, when on()
  i64 window = 0;               // sliding window (0: none)
};

constexpr float sentinel = 3.0f;  // exact in bf16

// Error bounds of one comparison: |gpu - ref| <= atol * max|ref| + rtol |ref|.
struct Tolerance {
  double atol, rtol;
};

// f32 storage: the GPU computes in f32 (tile products, online softmax, RoPE
// angles reduced in double), the reference in double; f32 rounding over sums of
// a few hundred terms stays near 1e-6 of the largest value (seen: < 5e-7).
constexpr Tolerance f32_tol{1e-5, 1e-5};
// bf16 storage (f16 is 8x finer, same bounds): the outputs are rounded to
// bf16 (relative error <= 2^-9); inside, the rotated q and k, P and dS are
// rounded to bf16 before their tensor-core products, each term off by <= 2^-9
// relative. With errors of one sign at worst that is 2^-9 of the sum of
// |terms|, at most a few times the largest output where terms cancel.
// 2e-2 relative plus 1e-2 of the largest value bounds both (seen: under half
// of it); a wrong mask, scale, rotation or head mapping makes errors of order 1.
constexpr Tolerance tol_16bit{1e-2, 2e-2};
// lse is f32 whatever S is; with 16-bit storage the scores come from the
// rotated q and k rounded to S, which moves a score by up to 2^-8 of
// scale sum_i |q_i k_i| (~1e-2 here, ~5e-3 seen), and lse with it.
constexpr Tolerance lse_tol_16bit{2e-3, 2e-3};

template <class S>
constexpr Tolerance tolerance() {
  return std::is_same_v<S, float> ? f32_tol : tol_16bit;
}
// A sliding window of a few keys leaves lse near one score, whose rounding is
// as above while max|lse| lacks the log of a long row's key count (with a
// window of 1, ~1e-2 off where 2e-3 of max|lse| is 8e-3): twice the bounds.
constexpr Tolerance lse_tol_16bit_few_keys{4e-3, 4e-3};

template <class S>
Tolerance lse_tolerance(const Case& c) {
  if (std::is_same_v<S, float>) return f32_tol;
  return c.window > 0 && c.window < 8 ? lse_tol_16bit_few_keys : lse_tol_16bit;
}

// `floor`: errors are measured against max(max|ref|, floor), for a reference
// that is zero in exact arithmetic.
void expect_close(const char* what, const std::vector<float>& gpu, const std::vector<double>& ref, Tolerance tol,
                  double floor = 0) {
  double largest = floor;
  for (double x : ref) largest = std::max(largest, std::abs(x));
  const std::vector<float> ref_f(ref.begin(), ref.end());
  const double ratio = cuda_test::worst_ratio(gpu, ref_f, tol.atol * largest, tol.rtol);
  INFO(what << ": worst |gpu - host| / (atol max|host| + rtol |host|) = " << ratio
            << " (max|host| = " << largest << ")");
  CHECK(ratio <= 1.0);
}

// One of q, k, v (or dq, dk, dv) in the buffer that holds all three: element
// (n, c) at buffer[at + n * ld + c], c < width.
struct View {
  i64 at, ld, width;
};

// The elements of columns [col0, col0 + count) of a view, row by row.
template <class T>
std::vector<T> columns(const std::vector<T>& buffer, const View& x, i64 rows, i64 col0, i64 count) {
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(rows * count));
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = col0; c < col0 + count; ++c) out.push_back(buffer[static_cast<std::size_t>(x.at + r * x.ld + c)]);
  return out;
}

// q, k, v in one buffer: fused (q | k | v in each row, GPT-2's c_attn output)
// or one after the other, each with c.pad padding columns.
struct Layout {
  View q, k, v;
  i64 total;  // elements of the buffer
  explicit Layout(const Case& c) {
    const i64 n = c.batch * c.seq, q_cols = c.heads * c.head_dim, kv_cols = c.kv_heads * c.head_dim;
    if (c.fused) {
      const i64 ld = q_cols + 2 * kv_cols;
      q = {0, ld, q_cols}, k = {q_cols, ld, kv_cols}, v = {q_cols + kv_cols, ld, kv_cols};
      total = n * ld;
    } else {
      q = {0, q_cols + c.pad, q_cols};
      k = {n * q.ld, kv_cols + c.pad, kv_cols};
      v = {k.at + n * k.ld, kv_cols + c.pad, kv_cols};
      total = v.at + n * v.ld;
    }
  }
};

template <class S>
void check_attention(const Case& c) {
  const i64 n = c.batch * c.seq, q_cols = c.heads * c.head_dim;
  const Layout lay(c);
  const host::AttentionDims hdims{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.rope, 10000.0, c.scaling, c.window};
  const cuda::AttentionShape shape{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.rope, 10000.0f, c.scaling, c.window};
  const auto size = [](i64 elements) { return static_cast<std::size_t>(elements); };

  // Inputs rounded to S (padding columns too), of amplitude 2 so the softmax
  // is peaked and the running max moves between key tiles.
  const std::vector<float> qkv = cuda_test::rounded<S>(cuda_test::pattern(size(lay.total), 11, 2.0f));
  const std::vector<float> dout = cuda_test::rounded<S>(cuda_test::pattern(size(n * q_cols), 23));

  // Host forward in double.
  const std::vector<double> qkv_d(qkv.begin(), qkv.end());
  std::vector<double> o_ref(size(n * q_cols)), lse_ref(size(c.batch * c.heads * c.seq));
  std::vector<double> fwd_scratch(size(host::attention_forward_scratch(hdims, 1)));
  host::attention_forward(hdims, qkv_d.data() + lay.q.at, lay.q.ld, qkv_d.data() + lay.k.at, lay.k.ld,
                          qkv_d.data() + lay.v.at, lay.v.ld, o_ref.data(), lse_ref.data(), fwd_scratch.data(), 1);

  // GPU forward.
  Buffer<S> qkv_buf(cuda_test::to_storage<S>(qkv));
  Buffer<S> o_buf(size(n * q_cols));
  Buffer<float> lse_buf(lse_ref.size());
  const S* in = qkv_buf.get();
  cuda::attention_forward<S>(shape, in + lay.q.at, lay.q.ld, in + lay.k.at, lay.k.ld, in + lay.v.at, lay.v.ld,
                             o_buf.get(), lse_buf.get(), cudaStream_t{});
  const Tolerance tol = tolerance<S>();
  expect_close("o", cuda_test::to_floats(o_buf.download()), o_ref, tol);
  expect_close("lse", lse_buf.download(), lse_ref, lse_tolerance<S>(c));

  // Backward, host and GPU from the same o (the host's, rounded to S) and lse
  // (as f32), into gradient buffers laid out like the inputs, prefilled.
  const std::vector<float> o_in = cuda_test::rounded<S>(std::vector<float>(o_ref.begin(), o_ref.end()));
  const std::vector<float> lse_in(lse_ref.begin(), lse_ref.end());
  const std::vector<double> o_d(o_in.begin(), o_in.end()), lse_d(lse_in.begin(), lse_in.end());
  const std::vector<double> dout_d(dout.begin(), dout.end());
  std::vector<double> grad_ref(size(lay.total), sentinel);
  std::vector<double> bwd_scratch(size(host::attention_backward_scratch(hdims, 1)));
  host::attention_backward(hdims, qkv_d.data() + lay.q.at, lay.q.ld, qkv_d.data() + lay.k.at, lay.k.ld,
                           qkv_d.data() + lay.v.at, lay.v.ld, o_d.data(), lse_d.data(), dout_d.data(),
                           grad_ref.data() + lay.q.at, lay.q.ld, grad_ref.data() + lay.k.at, lay.k.ld,
                           grad_ref.data() + lay.v.at, lay.v.ld, bwd_scratch.data(), 1);

  Buffer<S> o_saved(cuda_test::to_storage<S>(o_in));
  Buffer<float> lse_saved(lse_in);
  Buffer<S> dout_buf(cuda_test::to_storage<S>(dout));
  Buffer<S> grad_buf(cuda_test::to_storage<S>(std::vector<float>(size(lay.total), sentinel)));
  Buffer<float> scratch(size(cuda::attention_backward_scratch_floats(shape)));
  S* g = grad_buf.get();
  cuda::attention_backward<S>(shape, in + lay.q.at, lay.q.ld, in + lay.k.at, lay.k.ld, in + lay.v.at, lay.v.ld,
                              o_saved.get(), lse_saved.get(), dout_buf.get(), g + lay.q.at, lay.q.ld, g + lay.k.at,
                              lay.k.ld, g + lay.v.at, lay.v.ld, scratch.get(), cudaStream_t{});
  const std::vector<float> grad = cuda_test::to_floats(grad_buf.download());
  // With a window of 1 every row's softmax has one key: P = 1 and dS = P (dP -
  // delta) = 0, so dq and dk are rounding residue, measured at the size of dv.
  double floor = 0;
  if (c.window == 1)
    for (double e : columns(grad_ref, lay.v, n, 0, lay.v.width)) floor = std::max(floor, std::abs(e));
  for (const auto& [what, x] : {std::pair{"dq", lay.q}, std::pair{"dk", lay.k}, std::pair{"dv", lay.v}}) {
    expect_close(what, columns(grad, x, n, 0, x.width), columns(grad_ref, x, n, 0, x.width), tol, floor);
    if (!c.fused) {  // the padding columns untouched
      const std::vector<float> padding = columns(grad, x, n, x.width, x.ld - x.width);
      CHECK(std::all_of(padding.begin(), padding.end(), [](float e) { return e == sentinel; }));
    }
  }
}

}  // namespace

TEST_CASE("attention, GPT-2 style: fused qkv rows, no RoPE, B=2 T=37 H=2 hd=32", "[attention]") {
  const Case c{2, 37, 2, 2, 32, false, true, 0};
  SECTION("float") { check_attention<float>(c); }
  SECTION("bf16") { check_attention<cuda::bf16>(c); }
}

TEST_CASE("attention, Llama style: GQA 4 on 2, RoPE, B=1 T=50 hd=64", "[attention]") {
  const Case c{1, 50, 4, 2, 64, true, false, 0};
  SECTION("float") { check_attention<float>(c); }
  SECTION("bf16") { check_attention<cuda::bf16>(c); }
  SECTION("f16") { check_attention<cuda::f16>(c); }
}

TEST_CASE("attention, Llama 3.1's RoPE scaling (factor 8, original context 64: every band at hd 64), T=50",
          "[attention]") {
  const Case c{1, 50, 4, 2, 64, true, false, 0, {8, 1, 4, 64}};
  SECTION("float") { check_attention<float>(c); }
  SECTION("bf16") { check_attention<cuda::bf16>(c); }
}

TEST_CASE("attention, head_dim 128: 2 heads on 1, RoPE, T=20, odd row strides", "[attention]") {
  const Case c{1, 20, 2, 1, 128, true, false, 3};
  SECTION("float") { check_attention<float>(c); }
  SECTION("bf16") { check_attention<cuda::bf16>(c); }
}

TEST_CASE("attention, head_dim 40 (padded to 48 in the tiles), RoPE, T=77: several tiles everywhere", "[attention]") {
  const Case c{1, 77, 2, 1, 40, true, false, 0};
  SECTION("float") { check_attention<float>(c); }
  SECTION("bf16") { check_attention<cuda::bf16>(c); }
}

TEST_CASE("attention, sliding window 1 .. 150: GQA 4 on 2, T=150, hd=32, with and without RoPE", "[attention]") {
  for (const i64 window : {1, 5, 16, 18, 32, 34, 64, 66, 70, 100, 150}) {
    for (const bool rope : {false, true}) {
      INFO("window " << window << (rope ? ", rope" : ""));
      const Case c{1, 150, 4, 2, 32, rope, false, 0, {}, window};
      check_attention<float>(c);
      check_attention<cuda::bf16>(c);
    }
  }
}

TEST_CASE("attention, sliding window 70 on a fused q|k|v, B=2 T=200", "[attention]") {
  const Case c{2, 200, 2, 2, 16, false, true, 0, {}, 70};
  SECTION("float") { check_attention<float>(c); }
  SECTION("bf16") { check_attention<cuda::bf16>(c); }
}

TEST_CASE("attention launchers reject head_dim that is not a multiple of 8 or above 128", "[attention]") {
  Buffer<float> x(64), lse(4), scratch(4);
  for (const i64 hd : {12, 136}) {
    const cuda::AttentionShape shape{1, 1, 1, 1, hd, false, 10000.0f};
    CHECK_THROWS_AS(cuda::attention_forward<float>(shape, x.get(), hd, x.get(), hd, x.get(), hd, x.get(), lse.get(),
                                                   cudaStream_t{}),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::attention_backward<float>(shape, x.get(), hd, x.get(), hd, x.get(), hd, x.get(), lse.get(),
                                                    x.get(), x.get(), hd, x.get(), hd, x.get(), hd, scratch.get(),
                                                    cudaStream_t{}),
                    std::invalid_argument);
  }
  const cuda::AttentionShape negative_window{1, 1, 1, 1, 8, false, 10000.0f, {}, -1};
  CHECK_THROWS_AS(cuda::attention_forward<float>(negative_window, x.get(), 8, x.get(), 8, x.get(), 8, x.get(), lse.get(),
                                                 cudaStream_t{}),
                  std::invalid_argument);
}
