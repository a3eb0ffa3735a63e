// cuda/kernels/loss.cuh: the LM head's row part, cross_entropy_rows (loss
// and in-place dlogits per row) and sum_rows (the deterministic loss sum),
// for float and bf16 logits, against the host engine's row function
// (host::vec::cross_entropy_row, what host::lm_head_loss runs per token) on
// the same S-rounded logits. Vocab 1000 (16-byte packs) and 1001 (scalar),
// dense and at the LM head's padded row stride (1024), whose padding columns
// hold a logit that would dominate the row if it were read and must be left as is.
// And the vocabulary-parallel pair (cross_entropy_rows_vocab_parallel): a
// rank's half of the columns, with the other half's row statistics, gives
// the whole row's loss and its dlogits.
#include "../support/kernel_test.hpp"

#include <headroom/cuda/kernels/loss.cuh>
#include <headroom/host/vector_math.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace headroom;
using cuda_test::Buffer;
using cuda_test::worst_ratio;
using i64 = std::int64_t;

TEMPLATE_TEST_CASE("cross_entropy_rows: row losses and dlogits", "[loss]", float, cuda::bf16) {
  using S = TestType;
  const i64 rows = 7;
  const float grad_scale = 1.0f / 7.0f;
  constexpr float pad = 1000.0f;
  for (const auto& [vocab, ld] : {std::pair<i64, i64>{1000, 1000}, {1001, 1001}, {1000, 1024}, {1001, 1024}})
    for (const bool gradient : {true, false}) {
      INFO("vocab = " << vocab << ", ld = " << ld << ", gradient = " << gradient);
      std::vector<float> z = cuda_test::pattern(rows * ld, 1, 8.0f);
      for (i64 r = 0; r < rows; ++r)
        for (i64 j = vocab; j < ld; ++j) z[r * ld + j] = pad;
      std::vector<std::int32_t> targets(rows);
      for (i64 r = 0; r < rows; ++r) targets[r] = static_cast<std::int32_t>(r == 0 ? 0 : r == 1 ? vocab - 1 : (r * 131) % vocab);
      Buffer<S> logits(cuda_test::to_storage<S>(z));
      Buffer<std::int32_t> tgt(targets);
      Buffer<float> row_loss(rows);
      cuda::cross_entropy_rows<S>(logits.get(), tgt.get(), row_loss.get(), grad_scale, nullptr, gradient, rows, vocab, ld, nullptr);

      std::vector<float> want = cuda_test::rounded<S>(z);  // the logits as stored
      std::vector<float> want_loss(rows);
      for (i64 r = 0; r < rows; ++r)
        want_loss[r] = host::vec::cross_entropy_row(want.data() + r * ld, vocab, targets[r], grad_scale, gradient);

      // Losses are f32 from the same stored logits on both sides: only the
      // order of the max / sum and expf against host::vec::exp (~1e-7
      // relative) differ; lse ~ 7..15 here: 1e-5 relative and absolute.
      CHECK(worst_ratio(row_loss.download(), want_loss, 1e-5, 1e-5) <= 1.0);
      const std::vector<float> got = cuda_test::to_floats(logits.download());
      if (gradient) {
        // dlogits ~ grad_scale softmax: float 1e-5 relative (the same
        // f32 formula), bf16 2^-7 relative (one rounding of the f32 value,
        // half an ulp = 2^-8), both plus 1e-9 absolute for the tiniest
        // probabilities (e^-16 / 1000 / 7 ~ 2e-11).
        const double rtol = std::is_same_v<S, float> ? 1e-5 : 1.0 / 128;
        CHECK(worst_ratio(got, want, 1e-9, rtol) <= 1.0);
      } else {
        CHECK(got == want);  // untouched
      }
    }
}

// Vocabulary-parallel: each of 2 ranks holds half the columns; rank r's
// launcher is run with the other rank's row statistics filled in by the
// gather (from the host, as the all-gather would bring them). Every row's
// loss is the whole vocabulary's, and r's dlogits are the whole row's
// dlogits at r's columns, against host::vec::cross_entropy_row on whole rows.
TEMPLATE_TEST_CASE("cross_entropy_rows_vocab_parallel: a rank's half of the vocabulary gives the whole row's loss and its dlogits",
                   "[loss]", float, cuda::bf16) {
  using S = TestType;
  const i64 chunk = 7;
  const float grad_scale = 1.0f / 7.0f;
  for (const auto& [vocab, rows] : {std::pair<i64, i64>{1000, 7}, {1002, 7}, {1000, 5}})  // halves of 500 (packs) and 501 (scalar)
    for (const int rank : {0, 1}) {
      INFO("vocab = " << vocab << ", rows = " << rows << ", rank = " << rank);
      const i64 half = vocab / 2, first = rank * half;
      const std::vector<float> whole = cuda_test::rounded<S>(cuda_test::pattern(rows * vocab, 4, 8.0f));
      std::vector<std::int32_t> targets(rows);
      for (i64 r = 0; r < rows; ++r) targets[r] = static_cast<std::int32_t>(r == 0 ? 0 : r == 1 ? vocab - 1 : (r * 131) % vocab);
      auto block = [&](int q) {  // rank q's columns of every row
        std::vector<float> b(rows * half);
        for (i64 r = 0; r < rows; ++r)
          std::copy(whole.begin() + r * vocab + q * half, whole.begin() + r * vocab + (q + 1) * half, b.begin() + r * half);
        return b;
      };
      Buffer<S> logits(cuda_test::to_storage<S>(block(rank)));
      Buffer<std::int32_t> tgt(targets);
      Buffer<float> row_loss(rows), stats(2 * chunk * 3);
      auto gather = [&](float* all) {
        REQUIRE(all == stats.get());
        std::vector<float> st = stats.download();
        const int other = 1 - rank;
        const std::vector<float> z = block(other);
        for (i64 r = 0; r < rows; ++r) {
          float* o = st.data() + (other * chunk + r) * 3;
          o[0] = host::vec::row_max(z.data() + r * half, half);
          o[1] = host::vec::sum_exp(z.data() + r * half, half, o[0]);
          const i64 t = targets[r] - other * half;
          o[2] = t >= 0 && t < half ? z[r * half + t] : 0.0f;
        }
        stats.upload(st);
      };
      cuda::cross_entropy_rows_vocab_parallel<S>(logits.get(), tgt.get(), row_loss.get(), grad_scale, nullptr, true, rows, half, half, first,
                                                 stats.get(), chunk, rank, 2, gather, nullptr);
      std::vector<float> want = whole, want_loss(rows);
      for (i64 r = 0; r < rows; ++r)
        want_loss[r] = host::vec::cross_entropy_row(want.data() + r * vocab, vocab, targets[r], grad_scale, true);
      CHECK(worst_ratio(row_loss.download(), want_loss, 1e-5, 1e-5) <= 1.0);
      std::vector<float> want_block(rows * half);
      for (i64 r = 0; r < rows; ++r)
        std::copy(want.begin() + r * vocab + first, want.begin() + r * vocab + first + half, want_block.begin() + r * half);
      const double rtol = std::is_same_v<S, float> ? 1e-5 : 1.0 / 128;
      CHECK(worst_ratio(cuda_test::to_floats(logits.download()), want_block, 1e-9, rtol) <= 1.0);
    }
}

TEST_CASE("sum_rows: the deterministic sum of the per-token losses", "[loss]") {
  for (const i64 n : {1, 37, 5000}) {
    INFO("n = " << n);
    std::vector<float> losses = cuda_test::pattern(n, 2, 3.0f);
    for (float& l : losses) l += 6.0f;  // losses in [3, 9)
    Buffer<float> x(losses), out(1), again(1);
    cuda::sum_rows(x.get(), n, out.get(), nullptr);
    cuda::sum_rows(x.get(), n, again.get(), nullptr);
    double want = 0.0;
    for (const float l : losses) want += l;
    // f32 sums of positive terms: each thread adds <= 5 values, then a
    // 1024-wide tree (10 levels): relative error below ~15 ulps, 1e-6.
    const float got = out.download()[0];
    CHECK(worst_ratio({got}, {static_cast<float>(want)}, 0.0, 1e-6) <= 1.0);
    const float second = again.download()[0];
    CHECK(std::memcmp(&got, &second, sizeof(float)) == 0);  // bit for bit the same
  }
}

TEST_CASE("cross_entropy_rows then sum_rows: the micro-batch's loss", "[loss]") {
  const i64 rows = 37, vocab = 1000;
  const std::vector<float> z = cuda_test::pattern(rows * vocab, 3, 4.0f);
  std::vector<std::int32_t> targets(rows);
  for (i64 r = 0; r < rows; ++r) targets[r] = static_cast<std::int32_t>((r * 37 + 11) % vocab);
  Buffer<float> logits(z), row_loss(rows), total(1);
  Buffer<std::int32_t> tgt(targets);
  cuda::cross_entropy_rows<float>(logits.get(), tgt.get(), row_loss.get(), 1.0f / rows, nullptr, true, rows, vocab, vocab, nullptr);
  cuda::sum_rows(row_loss.get(), rows, total.get(), nullptr);
  std::vector<float> host_z = z;
  double want = 0.0;  // host::lm_head_loss sums the row losses in double, in row order
  for (i64 r = 0; r < rows; ++r)
    want += host::vec::cross_entropy_row(host_z.data() + r * vocab, vocab, targets[r], 1.0f / rows, true);
  CHECK(worst_ratio(total.download(), {static_cast<float>(want)}, 0.0, 1e-5) <= 1.0);
}

}  // namespace
