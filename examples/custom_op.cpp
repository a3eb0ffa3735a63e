// Trains a byte-level model whose MLP blocks use a new op, ReLU²
// (examples/relu_squared.hpp), on Jane Austen with the host engine, and
// checks the op first with the layer test harness.
//
//   custom_op [--corpus DIR] [--steps N] [--threads N]
//
// The corpus comes from scripts/fetch-corpus (data/corpus/austen.txt).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <headroom/io/dataset.hpp>
#include <headroom/io/tokenizer.hpp>
#include <headroom/testing/layer_test.hpp>
#include <headroom/train/host/trainer.hpp>

#include "relu_squared.hpp"

using namespace headroom;

constexpr std::int64_t B = 8, T = 128;
using Model = my::TinyLM<4, my::MlpBlock<128, 512>>;
using Run = Train<Model, Batch<B>, Seq<T>, AdamW, Workers<2>>;

int main(int argc, char** argv) {
  std::string corpus = "data/corpus";
  int steps = 200, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--corpus") corpus = v;
    else if (k == "--steps") steps = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else {
      std::fprintf(stderr, "usage: custom_op [--corpus DIR] [--steps N] [--threads N]\n");
      return 2;
    }
  }

  // the op and its block, gradient-checked in f64 inside a poisoned arena
  for (const auto& r : {testing::test_layer<my::ReluSquared<16>>(), testing::test_layer<my::MlpBlock<8, 16>>()}) {
    std::printf("layer test: %s\n", r.report.c_str());
    if (!r.passed) return 1;
  }

  static constexpr auto p = plan<Run>();
  std::printf("plan: %lld parameters, peak %.2f MiB\n", static_cast<long long>(p.parameters()), p.peak_bytes() / 1048576.0);
  try {
    const io::ByteTokenizer tk;
    io::TokenDataset ds = io::TokenDataset::from_text(corpus + "/austen.txt", tk, 0.02);
    host::Trainer<Run> t(TrainOptions{.threads = threads, .lr = 2e-3, .warmup_steps = 20, .total_steps = steps});
    std::vector<std::int32_t> tok(B * T), tgt(B * T);
    const auto start = std::chrono::steady_clock::now();
    double first = 0, last = 0;
    for (int s = 1; s <= steps; ++s) {
      ds.next_batch(tok.data(), tgt.data(), B, T);
      const StepStats st = t.step(tok, tgt);
      if (s == 1) first = st.loss;
      last = st.loss;
      if (s % 20 == 0 || s == steps) std::printf("step %4d  loss %.3f  grad norm %.3f\n", s, st.loss, st.grad_norm);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("loss %.3f -> %.3f (unigram baseline %.3f nats/byte) in %.1f s, %.0f tokens/s\n", first, last,
                ds.unigram_loss(), secs, steps * double(B * T) / secs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_op: %s (fetch the corpus with scripts/fetch-corpus)\n", e.what());
    return 1;
  }
}
